/*
 * model: ddp-train's models behind one table of operations. The trainer (ddp-train.c and the
 * train_*.c files) knows nothing of any model's layers; it knows a row of model_table[]
 * (model.c), chosen by --model NAME, and the instance the row creates. The row says which
 * options it takes, how many units and which parameter tensors it registers with libddp, how
 * each tensor starts, and computes forward and backward passes on the host and, when it has a
 * device path, on a GPU.
 *
 * Adding a model is one new file plus one table row:
 *
 *   1. worker/trainer/model_NAME.c defines `const model_ops model_NAME = {...}`: its options
 *      (a cli_option table with ids from MODEL_OPT_BASE, and config_init()/config_parse() that
 *      fill its own configuration struct), create() and free(), units() (libddp's units and
 *      parameters, in registration order), init_param(), a host model_compute and, optionally,
 *      a device one, and the few descriptive calls below. model_mlp.c is the example to copy.
 *   2. model.c: declare model_NAME and add &model_NAME to model_table[] (the row);
 *      worker/trainer/meson.build: add the file to ddp-train's sources (a device path's .cu
 *      file goes through nvcc as mlp_cuda.cu does).
 *
 * --help and --model's error list the new row and its options; man/ddp-train.1 documents them
 * (tests/test_help_man.sh checks that). Only the chosen row's options are parsed, so rows may
 * share option names: a transformer row would declare --layers, --heads and --seq-len in its
 * own table, beside the mlp row's --hidden and --layers, and ddp-train.c would not change.

 * What the trainer does with a model, in order: config_init(), config_parse() for each of the
 * row's options given on the command line, create() (after the job, the device and the data
 * set are known), units() and init_param() through libddp's registration and commit, then for
 * every micro-step compute->micro(), every report compute->take(), every evaluation
 * compute->eval() and take() over the test set's shard, and at the end free().
 *
 * Parameters and gradients belong to libddp, never to the model: a pass asks for a unit's
 * tensors through model_env.access.begin() right before the unit computes and hands them back
 * through access.end() right after (at ZeRO-3 begin gathers the unit; in backward, end marks
 * its gradients ready so that their reduction overlaps the backward of the units below). The
 * tensors are libddp's compute copies: f32, or bf16 bit patterns with --precision bf16 (the f32
 * master weights, the optimizer state and the gradients stay f32); device pointers when the
 * model computes on a GPU.
 *
 * Not here: the data. Every model trains on the trainer's data set (data.h) of the kind its row's
 * data_kind names (labelled images or byte windows of text): a micro-step gets the data_batch
 * the loader made (the sampled rows' indices, and their inputs and labels, or byte windows, on
 * the host), an evaluation a range of the test set's rows. A model that reads another kind of
 * data needs a data source beside data.c and a data_kind for it. Nor the device: the trainer
 * opens it (train_job.c, through the device calls at the top of mlp_cuda.h, which every model's
 * device path shares) and hands the model its ordinal and stream.
 *
 * Conventions: functions that can fail return 0 or a negative errno-style code; after a failure
 * of create() or of a pass outside a hook, last_error() says why. A model is used by one thread
 * at a time.
 */
#ifndef DDP_TRAIN_MODEL_H
#define DDP_TRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cli.h"
#include "data.h"
#include "train_state.h"

/* The first id of a model's own options (cli_option.id): the trainer's are below. */
#define MODEL_OPT_BASE 1024

/* Parameters per unit, at most. */
#define MODEL_MAX_UNIT_PARAMS 16

/* Key/value pairs a model adds to a parameter dump's or a checkpoint's metadata, at most, and
 * the bytes of a value with its terminating NUL (a key's are 32). */
#define MODEL_MAX_META 8
#define MODEL_META_LEN 512

typedef struct model model; /* a row's instance, its own struct */

/* One parameter tensor, registered with libddp as f32 (libddp derives the compute copy). */
typedef struct model_param {
    char name[32];    /* within its unit: "weight"; the tensor is "UNIT.NAME" in dumps */
    int ndim;         /* 1 .. 4 */
    int64_t shape[4]; /* row-major */
} model_param;

/* One libddp unit: what ZeRO-3 gathers at once, and the parameters in it. */
typedef struct model_unit {
    char name[32]; /* "fc1" */
    int nparams;   /* 1 .. MODEL_MAX_UNIT_PARAMS */
    model_param params[MODEL_MAX_UNIT_PARAMS];
} model_unit;

/*
 * The trainer's side of a pass. begin(arg, unit, backward, params, grads) fills
 * params[0..nparams) with the unit's parameters (compute copies, see above) and, in backward,
 * grads[0..nparams) with its f32 gradient buffers, which the pass adds into (+=; libddp zeroes
 * them when it hands them out); end(arg, unit, backward) says the pass is done with the unit
 * (backward: its gradients are final). A negative return from either ends the pass, which
 * returns it; end is not called for a unit whose begin failed. The pointers are valid from
 * begin to end. Every unit's begin and end run in every pass, even with no rows (ZeRO-3's
 * gathers are collective).
 */
typedef struct model_access {
    int (*begin)(void *arg, int unit, int backward, void **params, float **grads);
    int (*end)(void *arg, int unit, int backward);
    void *arg;
} model_access;

/* What create() gets: all borrowed for the model's life. */
typedef struct model_env {
    const data_set *train, *test; /* the trainer's data sets */
    int max_batch;                /* rows per pass, at most (text: the micro-batch's rows,
                                     which evaluation passes do not exceed either) */
    int bf16;                     /* --precision bf16: parameters come as bf16 */
    int device;                   /* -1: the host; else the CUDA device ordinal, current */
    void *stream;                 /* device: the compute stream (a cudaStream_t) */
    model_access access;
} model_env;

/*
 * The sums of a model's forward passes since the last take(), over its predictions: one per row
 * for an image model, seq per row (the next byte after each position) for a text model.
 */
typedef struct model_stats {
    double loss_sum; /* sum over the predictions of each one's loss (cross-entropy, nats) */
    double correct;  /* predictions right (argmax = target) */
    double tokens;   /* text: the predictions summed (rows x seq); 0: one per row (images) */
} model_stats;

/* A row's own defaults for ddp-train's training options; 0 keeps ddp-train's default. */
typedef struct model_train_defaults {
    int global_batch; /* --global-batch */
    int epochs;       /* --epochs */
    double lr;        /* --lr */
    long warmup;      /* --warmup */
} model_train_defaults;

/*
 * The compute of one place (host or device). Every pass runs through model_env.access. Passes
 * accumulate their loss and correct count until take() reads and resets them; on a device
 * take() waits for the stream, and nothing else needs to.
 */
typedef struct model_compute {
    /* One micro-step's forward and backward over b, for the loss loss_scale * (sum of the
     * predictions' losses: the rows', or for text the rows x seq tokens'), adding the
     * gradients. The trainer passes world / (global batch x predictions per row), so the
     * gradient is that of the mean loss per prediction over the global batch (for text,
     * torch's cross_entropy(reduction="mean") over all the batch's tokens). */
    int (*micro)(model *m, const data_batch *b, float loss_scale);
    /* A forward over the test set's rows [start, start + count); count may be 0. */
    int (*eval)(model *m, int start, int count);
    int (*take)(model *m, model_stats *out);
} model_compute;

typedef struct model_ops {
    const char *name;    /* --model NAME */
    const char *summary; /* a sentence for --help */

    /* Its own options, with ids from MODEL_OPT_BASE (may be none). */
    const cli_option *options;
    size_t noptions;
    size_t config_size;             /* of its configuration struct */
    void (*config_init)(void *cfg); /* the defaults */
    /* Stores option `id`'s value `arg` (flag: its long name). Returns 0 or -EINVAL with the
     * sentence in cli_last_error(). */
    int (*config_parse)(void *cfg, int id, const char *flag, const char *arg);

    /*
     * An instance for `cfg` (copied) in `env`. Returns 0 and sets *out; or a negative code:
     * with *out set to the half-built instance when last_error() can say why (the caller
     * frees it), else NULL (-ENOMEM).
     */
    int (*create)(const void *cfg, const model_env *env, model **out);
    void (*free)(model *m); /* NULL is a no-op */
    /* The sentence of create()'s or a pass's own failure (not a hook's). */
    const char *(*last_error)(const model *m);

    /* The units in registration order; *out is the model's, valid until free(). */
    int (*units)(const model *m, const model_unit **out);
    /* The initial values of the unit's parameter `param` (count floats), drawn from `seed`
     * and the parameter's index over the whole model, `index`. Returns 0. */
    int (*init_param)(const model *m, int unit, int param, int index, uint64_t seed, float *data,
                      size_t count);

    const model_compute *host;   /* never NULL */
    const model_compute *device; /* NULL: no device path (--device cuda is refused) */

    /* Its shape for the run's first line ("MLP 784-512-512-10") into buf[cap]. */
    void (*describe)(const model *m, char *buf, size_t cap);
    /* Its settings that a checkpoint must match, into train_state's model fields (in_dim,
     * hidden, layers, classes: the MLP's shape; a model of another shape adds its own fields
     * to train_state.h and compares them there). */
    void (*state)(const model *m, train_state *st);
    /*
     * Up to MODEL_MAX_META (key, value) pairs for a dump's and a checkpoint's metadata (which
     * ddp-ckpt export copies into its file): enough for another program to rebuild the model,
     * "model" (the row's name) first, then its shape ("layer_sizes", "activation" for the
     * MLP; ddp-ckpt(1) lists the keys). Returns how many.
     */
    int (*meta)(const model *m, char key[][32], char value[][MODEL_META_LEN]);

    /* The data it trains on: 0 labelled images (Fashion-MNIST, data_load(): env's sets have
     * x and y), 1 byte-level text (data_load_text(): env's sets have seq and tok, and the
     * batches tok; --data names text files). */
    int data_kind;
    /* Text rows (data_kind 1): the context length T of configuration `cfg` (its --seq-len
     * or default), with which the trainer cuts the text into windows before create(). NULL
     * for image rows. */
    int (*seq_len)(const void *cfg);
    /*
     * Text rows, optional (NULL: --generate is refused): writes `prompt` and max_new bytes
     * sampled after it, one at a time from the model's next-byte distribution at `temperature`
     * (0: the likeliest) with draws from `seed`, to `out` (NULL: nothing written; the passes
     * still run, as every rank must at ZeRO-3). The passes run through model_env.access outside
     * any micro-step. Returns 0 or a negative code (last_error(), or a hook's).
     */
    int (*generate)(model *m, const char *prompt, int max_new, double temperature, uint64_t seed,
                    FILE *out);
    /* The training settings the row's default run uses where the command line gives none
     * (NULL: ddp-train's own defaults, sized for the MLP); --help's and the man page's model
     * section lists them. */
    const model_train_defaults *train_defaults;
} model_ops;

/* The row named `name`, or NULL. */
const model_ops *model_find(const char *name);

/* The rows' names, NULL-terminated, in table order (the first is the default). */
const char *const *model_names(void);

/* The rows, model_count() of them, for --help. */
const model_ops *model_at(size_t i);
size_t model_count(void);

#endif /* DDP_TRAIN_MODEL_H */
