/*
 * ddp-train: the reference trainer of libddp. A multi-layer perceptron (mlp.c) learns
 * Fashion-MNIST (data.c) with data-parallel steps, DDP or ZeRO-1/2/3, on the CPU backend:
 *
 *     ddprun --standalone --nproc-per-node 2 build/worker/ddp-train [--zero 2] [--epochs 10]
 *
 * One training loop serves every stage, as libddp is meant to be used (worker/libddp/ddp.h): the
 * model's layers are its units, each linear layer registers its weight (out, in) and bias (out);
 * mlp_forward() and mlp_backward() ask for a layer's parameters through hooks that gather it
 * (ZeRO-3), take its gradient buffers and mark them ready as soon as the layer's backward is
 * done, so that the reductions of late layers overlap the backward of early ones.
 *
 * Each rank reads the torchrun environment (coll_comm_init_env()); without one it runs alone on a
 * store of its own. Every rank loads the whole data set and trains on its part of each global
 * batch (data.h explains the split), so the result does not depend on the number of ranks.
 * Test accuracy is measured after each epoch over the 10,000 test images, each rank a shard,
 * the sums allreduced. Rank 0 alone prints and writes files.
 *
 * Checkpoints go through libddp (ddp_checkpoint_save(), asynchronous): the model's state and
 * the sampler's position, plus the trainer's own state (train_state.h: the step that drives the
 * schedule, and the settings a resume must share). --resume auto continues from the newest
 * complete one at whatever world size and stage the job now has; with --micro-batch the
 * global batch, and so the samples of every step, stay the same.
 *
 * On a GPU (--device cuda, mlp_cuda.h) the same loop runs with the compute on the device: one
 * table of operations (compute_ops) is chosen at set-up, the hooks hand libddp's device
 * pointers to the model, and the host waits for the device only when it reports.
 * --precision bf16 is mixed precision on either device (mlp.h, libddp's compute copy).
 *
 * Not here: any data set but IDX images with ten classes.
 *
 * Exit status: 0 trained; 1 bad usage, environment or data; 2 the job failed (store,
 * communicator, a peer, the library), with the culprit rank named when libddp knows it; 3
 * trained, but the last checkpoint save failed (a failed save does not stop training: libddp
 * logs it and the next one tries again). The first error line goes to TORCHELASTIC_ERROR_FILE
 * too, for the launcher's failure summary.
 */
#include <assert.h>
#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "cli.h"
#include "coll.h"
#include "data.h"
#include "ddp.h"
#include "mlp.h"
#include "mlp_cuda.h"
#include "monoclock.h"
#include "rdzv.h"
#include "safetensors.h"
#include "train_backend.h"
#include "train_state.h"
#include "version.h"

enum { EXIT_OK = 0, EXIT_USAGE = 1, EXIT_FAIL = 2, EXIT_CKPT = 3 };

/* The defaults, shared by the option table's help and parse_args(). */
#define DEF_ZERO 0
#define DEF_OPTIMIZER DDP_ADAMW
#define DEF_LR 1e-3
#define DEF_MOMENTUM 0.9
#define DEF_WEIGHT_DECAY 0
#define DEF_SCHEDULE "cosine"
#define DEF_WARMUP 100
#define DEF_EPOCHS 15
#define DEF_GLOBAL_BATCH 256
#define DEF_GRAD_ACCUM 1
#define DEF_CLIP 0
#define DEF_BUCKET_MB 25
#define DEF_SEED 1
#define DEF_HIDDEN 512
#define DEF_LAYERS 2
#define DEF_THREADS 1
#define DEF_TIMEOUT_MS 60000
#define DEF_KEEP 3
#define DEF_DEVICE "auto"
#define DEF_PRECISION "f32"
#define DEF_REDUCE_DTYPE "f32"
#define DEF_BACKEND "auto"
#define STR_(x) #x
#define STR(x) STR_(x)

/* --layers at most: hidden layers, so MAX_LAYERS + 1 linear layers. */
#define MAX_LAYERS 64

/* Rows per forward pass when evaluating; the activations are allocated for this many. */
#define EVAL_CHUNK 1000

/* --dump-batches keeps the batches in memory until the end: at most this much. */
#define DUMP_MAX_BYTES (1ull << 30)

/* --device */
typedef enum train_device { DEV_AUTO = 0, DEV_CPU, DEV_CUDA } train_device;

typedef struct train_args {
    int zero;
    train_device device;
    int bf16;                /* --precision bf16 */
    coll_dtype reduce_dtype; /* --reduce-dtype */
    coll_backend backend;    /* --backend: AUTO, CPU or NCCL */
    ddp_optimizer optimizer;
    double lr, momentum, weight_decay, clip, bucket_mb;
    ddp_schedule_kind schedule;
    long warmup, max_steps, log_every;
    int epochs, global_batch, grad_accum, hidden, layers, threads, timeout_ms;
    int micro_batch;    /* --micro-batch; 0: --grad-accum decides */
    int grad_accum_set; /* --grad-accum was given */
    uint64_t seed;
    const char *metrics, *data, *dump_init, *dump_batches, *dump_final;
    const char *ckpt_dir, *resume, *init_from;
    long ckpt_every;
    int keep;
} train_args;

/* Long-only options (ids from 256); -h is the one short spelling. */
enum {
    OPT_ZERO = 256,
    OPT_OPTIMIZER,
    OPT_LR,
    OPT_MOMENTUM,
    OPT_WEIGHT_DECAY,
    OPT_SCHEDULE,
    OPT_WARMUP,
    OPT_EPOCHS,
    OPT_GLOBAL_BATCH,
    OPT_GRAD_ACCUM,
    OPT_CLIP,
    OPT_BUCKET_MB,
    OPT_SEED,
    OPT_HIDDEN,
    OPT_LAYERS,
    OPT_DATA,
    OPT_THREADS,
    OPT_MAX_STEPS,
    OPT_LOG_EVERY,
    OPT_METRICS,
    OPT_DUMP_INIT,
    OPT_DUMP_BATCHES,
    OPT_DUMP_FINAL,
    OPT_MICRO_BATCH,
    OPT_CKPT_DIR,
    OPT_CKPT_EVERY,
    OPT_KEEP,
    OPT_RESUME,
    OPT_INIT_FROM,
    OPT_TIMEOUT,
    OPT_DEVICE,
    OPT_PRECISION,
    OPT_REDUCE_DTYPE,
    OPT_BACKEND,
    OPT_VERSION,
};

/* The one option table: getopt_long's tables and --help are both made from it (cli.h). */
static const cli_option opt_table[] = {
    {OPT_ZERO,
     {"--zero"},
     "0|1|2|3",
     STR(DEF_ZERO),
     0,
     "ZeRO stage: 0 is DDP (everything replicated); 1 shards the optimizer state, 2 also the "
     "gradients, 3 also the parameters."},
    {OPT_DEVICE,
     {"--device"},
     "cpu|cuda|auto",
     DEF_DEVICE,
     0,
     "Where the model computes: cpu (OpenBLAS), or cuda (cuBLAS; one GPU per rank, GPU "
     "LOCAL_RANK modulo the GPUs there are); auto: cuda when ddp-train was built with CUDA and "
     "a GPU is there, else cpu."},
    {OPT_PRECISION,
     {"--precision"},
     "f32|bf16",
     DEF_PRECISION,
     0,
     "Compute precision. bf16: bf16 parameters and activations in the matrix products (f32 "
     "accumulation), f32 master weights, optimizer state and gradients (mixed precision)."},
    {OPT_REDUCE_DTYPE,
     {"--reduce-dtype"},
     "f32|bf16",
     DEF_REDUCE_DTYPE,
     0,
     "Type the gradients are reduced in; bf16 halves the traffic (pre-divided by the world "
     "size)."},
    {OPT_BACKEND,
     {"--backend"},
     "auto|cpu|nccl",
     DEF_BACKEND,
     0,
     "libcollective backend. auto takes nccl when every rank of the job computes on a GPU no "
     "other rank uses (the ranks compare their GPUs' UUIDs) and has NCCL, else cpu (device "
     "buffers staged through host memory: NCCL allows one rank per GPU); nccl where that does "
     "not hold is an error."},
    {OPT_OPTIMIZER, {"--optimizer"}, "NAME", NULL, 0, "The optimizer."}, /* usage() names them */
    {OPT_LR, {"--lr"}, "LR", STR(DEF_LR), 0, "Peak learning rate."},
    {OPT_MOMENTUM, {"--momentum"}, "M", STR(DEF_MOMENTUM), 0, "SGD momentum (0: none)."},
    {OPT_WEIGHT_DECAY,
     {"--weight-decay"},
     "WD",
     STR(DEF_WEIGHT_DECAY),
     0,
     "Weight decay: added to the gradient for SGD, decoupled for AdamW and Lion."},
    {OPT_SCHEDULE,
     {"--schedule"},
     "constant|cosine",
     DEF_SCHEDULE,
     0,
     "Learning-rate schedule after the warmup: constant, or cosine decay to 0 at the last "
     "step."},
    {OPT_WARMUP,
     {"--warmup"},
     "STEPS",
     STR(DEF_WARMUP),
     0,
     "Steps of linear warmup to the peak learning rate."},
    {OPT_EPOCHS, {"--epochs"}, "N", STR(DEF_EPOCHS), 0, "Passes over the training set."},
    {OPT_GLOBAL_BATCH,
     {"--global-batch"},
     "N",
     STR(DEF_GLOBAL_BATCH),
     0,
     "Samples per optimizer step over all ranks and micro-steps; a multiple of the world "
     "size times --grad-accum. The incomplete last batch of an epoch is dropped."},
    {OPT_GRAD_ACCUM,
     {"--grad-accum"},
     "N",
     STR(DEF_GRAD_ACCUM),
     0,
     "Micro-steps per optimizer step (gradient accumulation)."},
    {OPT_MICRO_BATCH,
     {"--micro-batch"},
     "N",
     NULL,
     0,
     "Rows per micro-step per rank instead of --grad-accum: the accumulation becomes "
     "global batch / (world size x N), so that a job restarted at another world size keeps its "
     "global batch."},
    {OPT_CLIP,
     {"--clip"},
     "NORM",
     STR(DEF_CLIP),
     0,
     "Clip the global gradient norm to NORM; 0: no clipping."},
    {OPT_BUCKET_MB,
     {"--bucket-mb"},
     "MB",
     STR(DEF_BUCKET_MB),
     0,
     "Gradient bucket size in MiB (the first bucket is at most 1 MiB)."},
    {OPT_SEED,
     {"--seed"},
     "N",
     STR(DEF_SEED),
     0,
     "Seed of the initial weights and of the data order."},
    {OPT_HIDDEN, {"--hidden"}, "H", STR(DEF_HIDDEN), 0, "Width of each hidden layer."},
    {OPT_LAYERS, {"--layers"}, "N", STR(DEF_LAYERS), 0, "Number of hidden layers."},
    {OPT_DATA,
     {"--data"},
     "DIR",
     DATA_DEFAULT_DIR,
     0,
     "Directory of the Fashion-MNIST IDX files, gzip-compressed (.gz) or not."},
    {OPT_THREADS, {"--threads"}, "N", STR(DEF_THREADS), 0, "OpenBLAS threads per rank."},
    {OPT_MAX_STEPS,
     {"--max-steps"},
     "N",
     "0",
     0,
     "Stop after N optimizer steps; 0: run every epoch."},
    {OPT_LOG_EVERY,
     {"--log-every"},
     "N",
     "0",
     0,
     "Report the loss every N steps (an allreduce of the loss each time); 0: ten times an "
     "epoch."},
    {OPT_METRICS,
     {"--metrics"},
     "FILE",
     NULL,
     0,
     "Write JSON Lines to FILE: a record per report and one per epoch with the test loss and "
     "accuracy."},
    {OPT_DUMP_INIT,
     {"--dump-init"},
     "FILE",
     NULL,
     0,
     "Write the initial parameters to FILE (safetensors): drawn from --seed, or loaded by "
     "--resume or --init-from."},
    {OPT_DUMP_FINAL,
     {"--dump-final"},
     "FILE",
     NULL,
     0,
     "Write the parameters after the last step to FILE (safetensors)."},
    {OPT_DUMP_BATCHES,
     {"--dump-batches"},
     "FILE",
     NULL,
     0,
     "Write every step's global batch (indices, labels, inputs) and learning rate to FILE "
     "(safetensors) at the end; for short runs (--max-steps)."},
    {OPT_CKPT_DIR,
     {"--checkpoint-dir"},
     "DIR",
     NULL,
     0,
     "Where checkpoints go (DIR/step-N) and where --resume auto looks for them."},
    {OPT_CKPT_EVERY,
     {"--checkpoint-every"},
     "STEPS",
     "0",
     0,
     "Save a checkpoint every STEPS steps, written by a thread while training goes on; 0: "
     "never."},
    {OPT_KEEP,
     {"--keep"},
     "N",
     STR(DEF_KEEP),
     0,
     "Keep the newest N complete checkpoints under --checkpoint-dir; 0: all."},
    {OPT_RESUME,
     {"--resume"},
     "auto|PATH",
     NULL,
     0,
     "Continue from a checkpoint: auto takes the newest complete one under --checkpoint-dir "
     "(none: start afresh), PATH that checkpoint directory. It may have been saved at any "
     "world size and ZeRO stage; the model and data settings must be the same."},
    {OPT_INIT_FROM,
     {"--init-from"},
     "CKPT",
     NULL,
     0,
     "Start from the parameters of checkpoint CKPT (e.g. made by ddp-ckpt import) instead of "
     "drawing them; the optimizer starts afresh at step 0. A checkpoint found by --resume auto "
     "takes precedence."},
    {OPT_TIMEOUT,
     {"--timeout-ms"},
     "MS",
     STR(DEF_TIMEOUT_MS),
     0,
     "Bound on the communicator's set-up and on each collective: a peer that does not take "
     "part in time fails the run; -1: none."},
    {'h', {"-h", "--help"}, NULL, NULL, 0, "Show this help and exit."},
    {OPT_VERSION, {"--version"}, NULL, NULL, 0, "Show the version and exit."},
};
#define NOPTS (sizeof(opt_table) / sizeof(opt_table[0]))

/* libddp's optimizers' names joined by `sep` into buf[cap] (truncated if need be). */
static const char *optimizer_names(char *buf, size_t cap, const char *sep)
{
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; ddp_optimizer_name((ddp_optimizer)i) && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", i ? sep : "",
                                ddp_optimizer_name((ddp_optimizer)i));
    return buf;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: ddp-train [OPTIONS]\n"
               "       ddprun --standalone --nproc-per-node N ddp-train [OPTIONS]\n\n");
    cli_print_wrapped(f,
                      "Trains a multi-layer perceptron on Fashion-MNIST with libddp's "
                      "data-parallel steps (DDP or ZeRO-1/2/3) on every rank of a ddprun or "
                      "torchrun job, and reports the test accuracy after each epoch. Without "
                      "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in the environment it "
                      "trains alone.",
                      0);
    fprintf(f, "\noptions:\n");
    /* --optimizer's values and default come from libddp's table of optimizers. */
    cli_option opts[NOPTS];
    char names[128];
    memcpy(opts, opt_table, sizeof opts);
    for (size_t i = 0; i < NOPTS; i++)
        if (opts[i].id == OPT_OPTIMIZER) {
            opts[i].metavar = optimizer_names(names, sizeof names, "|");
            opts[i].def = ddp_optimizer_name(DEF_OPTIMIZER);
        }
    cli_print_options(f, opts, NOPTS, 0, CLI_HELP_WIDTH);
    fprintf(f, "\nexit status: 0 trained; 1 bad usage, environment or data; 2 the job failed "
               "(store,\ncommunicator, a peer, the library); 3 trained, but the last checkpoint "
               "save failed.\n");
}

/* The first failure err() printed: the message of the error record main() leaves at exit. */
static char first_error[1024];

/* "ddp-train: <message>" on stderr, for a failure (kept in first_error if it is the first). */
static void err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void err(const char *fmt, ...)
{
    char line[sizeof first_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    cli_msg(stderr, "ddp-train", "%s", line);
    if (!first_error[0])
        memcpy(first_error, line, sizeof line);
}

/* "ddp-train: <message>" on stderr, for what does not stop the run. */
#define warn(...) cli_msg(stderr, "ddp-train", __VA_ARGS__)

/* main()'s exit: after a failure, under a launcher, the first error also goes to its summary. */
static int leave(int status)
{
    if (status != EXIT_OK && first_error[0])
        (void)rdzv_env_record_error(first_error);
    return status;
}

/* The words of the keyword options, each at the index of the value it stands for. */
static const char *const schedule_words[] = {[DDP_SCHED_CONSTANT] = "constant",
                                             [DDP_SCHED_COSINE] = "cosine", NULL};
static const char *const device_words[] = {[DEV_AUTO] = "auto", [DEV_CPU] = "cpu",
                                           [DEV_CUDA] = "cuda", NULL};
static const char *const backend_words[] = {[COLL_BACKEND_AUTO] = "auto",
                                            [COLL_BACKEND_CPU] = "cpu",
                                            [COLL_BACKEND_NCCL] = "nccl", NULL};
static const char *const f32_bf16_words[] = {"f32", "bf16", NULL}; /* --precision, --reduce-dtype */

/* The combinations parse_args() refuses. Returns 0 or EXIT_USAGE (printed). */
static int check_args(const train_args *a)
{
    const char *bad = NULL;
    if (a->micro_batch && a->grad_accum_set)
        bad = "--micro-batch and --grad-accum exclude each other: --micro-batch sets the "
              "accumulation from the world size";
    else if (a->ckpt_every && !a->ckpt_dir)
        bad = "--checkpoint-every needs --checkpoint-dir";
    else if (a->resume && !strcmp(a->resume, "auto") && !a->ckpt_dir)
        bad = "--resume auto needs --checkpoint-dir (where to look)";
    else if (a->resume && strcmp(a->resume, "auto") && a->init_from)
        bad = "--resume PATH and --init-from exclude each other";
    else if (a->resume && a->dump_batches)
        bad = "--dump-batches records a whole run from its first step: not with --resume";
    else if (a->device == DEV_CPU && a->backend == COLL_BACKEND_NCCL)
        bad = "--backend nccl needs --device cuda";
    if (bad) {
        err("%s", bad);
        return EXIT_USAGE;
    }
    return 0;
}

/* Returns -1 to exit with EXIT_OK (--help, --version), 0 to train, or EXIT_USAGE. */
static int parse_args(int argc, char **argv, train_args *a)
{
    *a = (train_args){.zero = DEF_ZERO,
                      .device = DEV_AUTO,
                      .reduce_dtype = COLL_F32,
                      .backend = COLL_BACKEND_AUTO,
                      .lr = DEF_LR,
                      .momentum = DEF_MOMENTUM,
                      .weight_decay = DEF_WEIGHT_DECAY,
                      .clip = DEF_CLIP,
                      .bucket_mb = DEF_BUCKET_MB,
                      .warmup = DEF_WARMUP,
                      .epochs = DEF_EPOCHS,
                      .global_batch = DEF_GLOBAL_BATCH,
                      .grad_accum = DEF_GRAD_ACCUM,
                      .hidden = DEF_HIDDEN,
                      .layers = DEF_LAYERS,
                      .threads = DEF_THREADS,
                      .timeout_ms = DEF_TIMEOUT_MS,
                      .keep = DEF_KEEP,
                      .seed = DEF_SEED,
                      .data = DATA_DEFAULT_DIR};
    int sched_word;
    int ok =
        cli_parse_choice("--schedule", DEF_SCHEDULE, "schedule", schedule_words, &sched_word) == 0;
    assert(ok); /* the default above is a valid name */
    (void)ok;
    a->optimizer = DEF_OPTIMIZER;
    a->schedule = (ddp_schedule_kind)sched_word;

    cli_getopt_tables g;
    int built = cli_getopt_build(&g, opt_table, NOPTS);
    assert(built == 0); /* the table above is well-formed */
    (void)built;

    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, g.shorts, g.longopts, NULL)) != -1) {
        const cli_option *o = cli_by_id(opt_table, NOPTS, c);
        const char *flag = o ? cli_long_name(o) : "?";
        long v = 0;
        int rc = 0, word;
        switch (c) {
        case OPT_ZERO:
            rc = cli_parse_int(flag, optarg, 0, 3, &a->zero);
            break;
        case OPT_DEVICE:
            if ((rc = cli_parse_choice(flag, optarg, "device", device_words, &word)) == 0)
                a->device = (train_device)word;
            break;
        case OPT_PRECISION:
            if ((rc = cli_parse_choice(flag, optarg, "precision", f32_bf16_words, &word)) == 0)
                a->bf16 = word == 1;
            break;
        case OPT_REDUCE_DTYPE:
            if ((rc = cli_parse_choice(flag, optarg, "dtype", f32_bf16_words, &word)) == 0)
                a->reduce_dtype = word == 1 ? COLL_BF16 : COLL_F32;
            break;
        case OPT_BACKEND:
            if ((rc = cli_parse_choice(flag, optarg, "backend", backend_words, &word)) == 0)
                a->backend = (coll_backend)word;
            break;
        case OPT_OPTIMIZER:
            if ((word = ddp_optimizer_from_name(optarg)) >= 0) {
                a->optimizer = (ddp_optimizer)word;
            } else {
                char names[128];
                err("%s: unknown optimizer '%s' (%s)", flag, optarg,
                    optimizer_names(names, sizeof names, ", "));
                return EXIT_USAGE;
            }
            break;
        case OPT_LR:
            rc = cli_parse_double(flag, optarg, 0, HUGE_VAL, CLI_OPEN_MIN, &a->lr);
            break;
        case OPT_MOMENTUM:
            rc = cli_parse_double(flag, optarg, 0, HUGE_VAL, 0, &a->momentum);
            if (rc == 0 && a->momentum >= 1) {
                err("%s: expected a number from 0 to below 1, got '%s'", flag, optarg);
                return EXIT_USAGE;
            }
            break;
        case OPT_WEIGHT_DECAY:
            rc = cli_parse_double(flag, optarg, 0, HUGE_VAL, 0, &a->weight_decay);
            break;
        case OPT_SCHEDULE:
            if ((rc = cli_parse_choice(flag, optarg, "schedule", schedule_words, &word)) == 0)
                a->schedule = (ddp_schedule_kind)word;
            break;
        case OPT_WARMUP:
            rc = cli_parse_long(flag, optarg, 0, INT_MAX, &a->warmup);
            break;
        case OPT_EPOCHS:
            rc = cli_parse_int(flag, optarg, 1, 100000, &a->epochs);
            break;
        case OPT_GLOBAL_BATCH:
            rc = cli_parse_int(flag, optarg, 1, 1 << 24, &a->global_batch);
            break;
        case OPT_GRAD_ACCUM:
            rc = cli_parse_int(flag, optarg, 1, 1 << 20, &a->grad_accum);
            a->grad_accum_set = 1;
            break;
        case OPT_MICRO_BATCH:
            rc = cli_parse_int(flag, optarg, 1, 1 << 24, &a->micro_batch);
            break;
        case OPT_CLIP:
            rc = cli_parse_double(flag, optarg, 0, HUGE_VAL, 0, &a->clip);
            break;
        case OPT_BUCKET_MB:
            rc = cli_parse_double(flag, optarg, 0, HUGE_VAL, CLI_OPEN_MIN, &a->bucket_mb);
            if (rc == 0 && a->bucket_mb > 4096) {
                err("%s: expected a number of MiB up to 4096, got '%s'", flag, optarg);
                return EXIT_USAGE;
            }
            break;
        case OPT_SEED:
            rc = cli_parse_long(flag, optarg, 0, LONG_MAX, &v);
            a->seed = (uint64_t)v;
            break;
        case OPT_HIDDEN:
            rc = cli_parse_int(flag, optarg, 1, 1 << 16, &a->hidden);
            break;
        case OPT_LAYERS:
            rc = cli_parse_int(flag, optarg, 1, MAX_LAYERS, &a->layers);
            break;
        case OPT_DATA:
            a->data = optarg;
            break;
        case OPT_THREADS:
            rc = cli_parse_int(flag, optarg, 1, 1024, &a->threads);
            break;
        case OPT_MAX_STEPS:
            rc = cli_parse_long(flag, optarg, 0, LONG_MAX, &a->max_steps);
            break;
        case OPT_LOG_EVERY:
            rc = cli_parse_long(flag, optarg, 0, INT_MAX, &a->log_every);
            break;
        case OPT_METRICS:
            a->metrics = optarg;
            break;
        case OPT_DUMP_INIT:
            a->dump_init = optarg;
            break;
        case OPT_DUMP_BATCHES:
            a->dump_batches = optarg;
            break;
        case OPT_DUMP_FINAL:
            a->dump_final = optarg;
            break;
        case OPT_CKPT_DIR:
            a->ckpt_dir = optarg;
            break;
        case OPT_CKPT_EVERY:
            rc = cli_parse_long(flag, optarg, 0, LONG_MAX, &a->ckpt_every);
            break;
        case OPT_KEEP:
            rc = cli_parse_int(flag, optarg, 0, INT_MAX, &a->keep);
            break;
        case OPT_RESUME:
            a->resume = optarg;
            break;
        case OPT_INIT_FROM:
            a->init_from = optarg;
            break;
        case OPT_TIMEOUT:
            rc = cli_parse_int(flag, optarg, -1, INT_MAX, &a->timeout_ms);
            break;
        case 'h':
            usage(stdout);
            return -1;
        case OPT_VERSION:
            printf("ddp-train %s\n", DDPRUN_VERSION);
            return -1;
        case ':':
            err("%s needs a value", argv[optind - 1]);
            return EXIT_USAGE;
        default:
            err("unknown option '%s' (see --help)", argv[optind - 1]);
            return EXIT_USAGE;
        }
        if (rc < 0) {
            err("%s", cli_last_error());
            return EXIT_USAGE;
        }
    }
    if (optind < argc) {
        err("unexpected argument '%s' (see --help)", argv[optind]);
        return EXIT_USAGE;
    }
    return check_args(a);
}

/* ------------------------------------------------------------------------------------------ */
/* The trainer's state                                                                         */
/* ------------------------------------------------------------------------------------------ */

typedef struct trainer trainer;

/*
 * The model's compute, chosen once at set-up: on the host (OpenBLAS, mlp.h) or on a GPU (mlp_cuda.h).
 * Both accumulate the loss sum and correct count of their forward passes until take() reads
 * and resets them (on the GPU, on the device: take() waits for the stream).
 */
typedef struct compute_ops {
    /* One micro-step's forward and backward over batch b, through the trainer's hooks. */
    int (*micro)(trainer *t, const data_batch *b, float loss_scale);
    /* A forward over test rows [start, start + count) (count may be 0: the hooks still run). */
    int (*eval)(trainer *t, int start, int count);
    int (*take)(trainer *t, mlp_stats *out);
    /* Copies nbytes of the library's memory (ddp_param_data()) to host memory. */
    int (*to_host)(trainer *t, void *dst, const void *src, size_t nbytes);
    /* The sentence of the compute's own last failure (not a hook's). */
    const char *(*last_error)(void);
    int async; /* 1: ddp_step() is not asked for its info (that would wait for the device) */
} compute_ops;

struct trainer {
    train_args a;
    int rank, world;
    rdzv_server *own_store; /* standalone: the store this process runs */
    rdzv_client *store;
    coll_comm *comm;  /* libddp's */
    coll_comm *hcomm; /* the trainer's own collectives on host buffers (loss, evaluation,
                         restore): comm itself, or a cpu communicator beside an nccl one */
    ddp_model *m;

    /* The device: -1 (the host) or a CUDA device ordinal, with its compute stream. */
    int device;
    coll_backend backend;
    char backend_why[160]; /* why auto took the cpu backend (train_backend.h), or "" */
    void *stream;
    char gpu_name[256];
    const compute_ops *ops;
    mlp_hooks hooks;
    mlp_cuda *gnet;                /* device: the model */
    mlp_cuda_data *gtrain, *gtest; /* device: the data sets */
    mlp_stats acc;                 /* host: the passes' sums since the last take */
    double carry_loss; /* training loss taken before an evaluation, for the next report */
    int hook_failed;   /* a hook failed in the latest pass (libddp's account says why) */

    mlp_config cfg;
    mlp *net;
    int L;        /* linear layers: the model's units */
    int *pW;      /* (L) the parameter index of each layer's weight */
    int *pb;      /* (L) ... and bias */
    char **names; /* (2L) "fc1.weight", "fc1.bias", ... */

    data_set train, test;
    data_sampler sampler; /* this rank's view; the loader copies it */
    data_loader *loader;
    int steps_per_epoch;
    int64_t total_steps;
    int epochs; /* the epochs the run reaches: --epochs, fewer with --max-steps */
    ddp_schedule sched;
    int64_t start_step; /* the first step to train: 0, or where a resumed checkpoint stopped */

    /* DDP_TRAIN_TEST_KILL (tests only, see test_kill_read()): at step kill_step, after its
     * checkpoint save if any, rank kill_rank (-1: none, -2: any) raises kill_sig. */
    int kill_rank, kill_sig;
    int64_t kill_step;

    FILE *metrics;
    int tty; /* rank 0's stderr is a terminal: a progress bar */

    struct { /* --dump-batches: every step's global batch, rank 0 */
        data_sampler global;
        int32_t *index; /* (steps, G) */
        uint8_t *y;     /* (steps, G) */
        float *x;       /* (steps, G, dim) */
        float *lr;      /* (steps) */
        int64_t steps;
    } dump;
    int last_save_failed; /* the run's last checkpoint failed: EXIT_CKPT once it is done */
};

/*
 * libddp's and libcollective's log hook: warnings only. Their errors come back as return codes
 * with ddp_last_error()'s account, which the program prints once, naming the call and step.
 */
static void ddp_log(void *arg, int level, const char *msg)
{
    if (level == COLL_LOG_WARN)
        warn("rank %d: %s", *(const int *)arg, msg);
}

/* The initial values: torch.nn.Linear's bounds, parameter p's own stream of --seed. */
static int init_param(void *arg, int param, const char *name, void *data, size_t count)
{
    trainer *t = arg;
    (void)name;
    int l = param / 2;
    mlp_init_uniform(data, count, mlp_layer_in(&t->cfg, l), t->a.seed, (uint64_t)param);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* The hooks: libddp's four calls at the right moments of mlp's passes                         */
/* ------------------------------------------------------------------------------------------ */

/*
 * Before layer l's forward or backward: gather the unit (ZeRO-3; a no-op at other stages) and
 * take its parameters and, in backward, its gradient buffers. A NULL from libddp ends the pass
 * with -EIO; ddp_micro_end() then returns the library's own code and ddp_last_error() says why.
 */
static int hook_begin(void *arg, int l, int backward, mlp_layer *io)
{
    trainer *t = arg;
    int rc = ddp_unit_gather(t->m, l);
    if (rc < 0) {
        t->hook_failed = 1;
        return rc;
    }
    /* The compute copy: f32, or bf16 with --precision bf16 (libddp keeps the f32 master). */
    void *W = ddp_param_data(t->m, t->pW[l]), *b = ddp_param_data(t->m, t->pb[l]);
    if (ddp_param_dtype(t->m) == COLL_BF16) {
        io->W16 = W;
        io->b16 = b;
    } else {
        io->W = W;
        io->b = b;
    }
    if (backward) {
        io->dW = ddp_grad_buffer(t->m, t->pW[l]);
        io->db = ddp_grad_buffer(t->m, t->pb[l]);
    }
    if (!W || !b || (backward && (!io->dW || !io->db))) {
        t->hook_failed = 1;
        return -EIO;
    }
    return 0;
}

/*
 * After layer l: in backward its gradients are final, so mark them ready (in reverse
 * registration order, the order buckets fill) and let a complete bucket's reduction start now,
 * while the layers below still compute; then release the unit.
 */
static int hook_end(void *arg, int l, int backward)
{
    trainer *t = arg;
    int rc = 0;
    if ((backward && ((rc = ddp_grad_ready(t->m, t->pb[l])) < 0 ||
                      (rc = ddp_grad_ready(t->m, t->pW[l])) < 0)) ||
        (rc = ddp_unit_release(t->m, l)) < 0)
        t->hook_failed = 1;
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* The compute: the host's and the device's                                                    */
/* ------------------------------------------------------------------------------------------ */

static void stats_add(mlp_stats *acc, const mlp_stats *st)
{
    acc->loss_sum += st->loss_sum;
    acc->correct += st->correct;
}

static int host_micro(trainer *t, const data_batch *b, float loss_scale)
{
    mlp_stats st;
    int rc = mlp_forward(t->net, &t->hooks, b->x, b->y, b->count, &st);
    if (rc < 0)
        return rc;
    stats_add(&t->acc, &st);
    return mlp_backward(t->net, &t->hooks, loss_scale);
}

static int host_eval(trainer *t, int start, int count)
{
    const data_set *ds = &t->test;
    mlp_stats st;
    int rc = mlp_forward(t->net, &t->hooks, count ? ds->x + (size_t)start * ds->dim : NULL,
                         count ? ds->y + start : NULL, count, &st);
    if (rc == 0)
        stats_add(&t->acc, &st);
    return rc;
}

static int host_take(trainer *t, mlp_stats *out)
{
    *out = t->acc;
    t->acc = (mlp_stats){0};
    return 0;
}

static int host_to_host(trainer *t, void *dst, const void *src, size_t nbytes)
{
    (void)t;
    memcpy(dst, src, nbytes);
    return 0;
}

static const char *host_last_error(void)
{
    return "the model refused its input";
}

static const compute_ops host_ops = {host_micro,   host_eval,       host_take,
                                     host_to_host, host_last_error, 0};

/* The batch's indices go to the device, which gathers the rows from its copy of the set. */
static int cuda_micro(trainer *t, const data_batch *b, float loss_scale)
{
    const void *x;
    const uint8_t *y;
    int rc = mlp_cuda_data_batch(t->gtrain, b->index, 0, b->count, &x, &y);
    if (rc == 0)
        rc = mlp_cuda_forward(t->gnet, &t->hooks, x, y, b->count, NULL);
    if (rc == 0)
        rc = mlp_cuda_backward(t->gnet, &t->hooks, loss_scale);
    return rc;
}

static int cuda_eval(trainer *t, int start, int count)
{
    const void *x;
    const uint8_t *y;
    int rc = mlp_cuda_data_batch(t->gtest, NULL, start, count, &x, &y);
    return rc < 0 ? rc : mlp_cuda_forward(t->gnet, &t->hooks, x, y, count, NULL);
}

static int cuda_take(trainer *t, mlp_stats *out)
{
    return mlp_cuda_stats_take(t->gnet, out);
}

static int cuda_to_host(trainer *t, void *dst, const void *src, size_t nbytes)
{
    return mlp_cuda_to_host(dst, src, nbytes, t->stream);
}

static const compute_ops cuda_ops = {cuda_micro,   cuda_eval,           cuda_take,
                                     cuda_to_host, mlp_cuda_last_error, 1};

/* ------------------------------------------------------------------------------------------ */
/* Files: safetensors dumps and JSON Lines metrics                                             */
/* ------------------------------------------------------------------------------------------ */

typedef st_tensor tensor;

/* Writes a safetensors file (safetensors.h); `meta`: string pairs, NULL-ended. Returns 0 or -1
   with the error printed. */
static int write_safetensors(const char *path, const tensor *ts, int n, const char **meta)
{
    if (st_write(path, ts, n, meta) < 0) {
        err("%s", st_last_error());
        return -1;
    }
    return 0;
}

/*
 * Writes the model's current parameters to `path` (rank 0) as safetensors, `what` going into
 * the metadata's "format": the compute copy, F32 or (--precision bf16) BF16. Each unit is
 * gathered (ZeRO-3; other stages hold every parameter) and rank 0 copies it (from the device
 * with --device cuda), so every rank calls this. Returns 0 or EXIT_FAIL (printed: a
 * collective's failure, or on rank 0 a file error).
 */
static int dump_params(trainer *t, const char *path, const char *what)
{
    tensor ts[2 * (MAX_LAYERS + 1)];
    void *copy[2 * (MAX_LAYERS + 1)] = {0};
    int rc = 0;
    for (int l = 0; l < t->L; l++) { /* every unit on every rank, even after a local error */
        int in = mlp_layer_in(&t->cfg, l), out = mlp_layer_out(&t->cfg, l);
        if ((rc = ddp_unit_gather(t->m, l)) < 0) {
            err("rank %d: %s: gathering fc%d: %s: %s", t->rank, path, l + 1, ddp_strerror(rc),
                ddp_last_error(t->m));
            return EXIT_FAIL;
        }
        for (int j = 0; j < 2 && t->rank == 0 && rc == 0; j++) {
            int p = j ? t->pb[l] : t->pW[l];
            size_t nbytes = (t->a.bf16 ? 2 : 4) * ddp_param_count(t->m, p);
            if (!(copy[2 * l + j] = malloc(nbytes))) {
                err("%s: out of memory", path);
                rc = -1;
                break;
            }
            if ((rc = t->ops->to_host(t, copy[2 * l + j], ddp_param_data(t->m, p), nbytes)) < 0) {
                err("%s: copying %s: %s", path, t->names[p], t->ops->last_error());
                break;
            }
            /* (out, in) for the weight, (out) for the bias */
            ts[2 * l + j] = (tensor){t->names[p], t->a.bf16 ? "BF16" : "F32", 2 - j, {out, in},
                                     copy[2 * l + j], nbytes};
        }
        ddp_unit_release(t->m, l);
    }
    if (rc == 0 && t->rank == 0) {
        char seed[32], hidden[16], layers[16];
        snprintf(seed, sizeof seed, "%" PRIu64, t->a.seed);
        snprintf(hidden, sizeof hidden, "%d", t->a.hidden);
        snprintf(layers, sizeof layers, "%d", t->a.layers);
        const char *meta[] = {"format", what,     "seed", seed, "hidden",
                              hidden,   "layers", layers, NULL};
        rc = write_safetensors(path, ts, 2 * t->L, meta);
    }
    for (int i = 0; i < 2 * t->L; i++)
        free(copy[i]);
    return rc == 0 ? 0 : EXIT_FAIL;
}

static int dump_batches(trainer *t)
{
    int64_t S = t->dump.steps, G = t->a.global_batch, D = t->train.dim;
    tensor ts[] = {
        {"index", "I32", 2, {S, G}, t->dump.index, sizeof(int32_t) * (size_t)(S * G)},
        {"label", "U8", 2, {S, G}, t->dump.y, (size_t)(S * G)},
        {"x", "F32", 3, {S, G, D}, t->dump.x, sizeof(float) * (size_t)(S * G * D)},
        {"lr", "F32", 1, {S}, t->dump.lr, sizeof(float) * (size_t)S},
    };
    char mean[32], std[32], gb[32];
    snprintf(mean, sizeof mean, "%.9g", (double)DATA_MEAN);
    snprintf(std, sizeof std, "%.9g", (double)DATA_STD);
    snprintf(gb, sizeof gb, "%d", t->a.global_batch);
    const char *meta[] = {"format",
                          "ddp-train batches",
                          "global_batch",
                          gb,
                          "mean",
                          mean,
                          "std",
                          std,
                          "loss",
                          "mean over the global batch",
                          NULL};
    return write_safetensors(t->a.dump_batches, ts, 4, meta);
}

/* One JSON Lines record (jansson), flushed so that a reader can follow the run. */
static void metrics_write(trainer *t, json_t *rec)
{
    if (t->metrics && rec) {
        char *s = json_dumps(rec, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
        if (s) {
            fprintf(t->metrics, "%s\n", s);
            fflush(t->metrics);
            free(s);
        }
    }
    json_decref(rec);
}

/* ------------------------------------------------------------------------------------------ */
/* Set-up                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/*
 * This rank's device (ddp-train(1), GPUS): --device cpu, or auto without a GPU, is the host;
 * otherwise GPU LOCAL_RANK modulo the GPUs this process sees, made current with a compute
 * stream of its own. Writes this rank's report for the backend decision into *me. Returns 0 or
 * EXIT_USAGE/EXIT_FAIL (printed).
 */
static int setup_device(trainer *t, const rdzv_env *env, train_gpu_ident *me)
{
    const train_args *a = &t->a;
    memset(me, 0, sizeof *me);
    me->has_nccl = coll_have_nccl();
    t->device = -1;
    int ndev = a->device == DEV_CPU ? 0 : mlp_cuda_device_count();
    if (a->device == DEV_CUDA && ndev == 0) {
        err("--device cuda: %s", mlp_cuda_built() ? "no CUDA device is visible to this process"
                                                  : "ddp-train was built without CUDA");
        return EXIT_USAGE;
    }
    if (ndev == 0)
        return 0;
    t->device = env->local_rank % ndev;
    if (mlp_cuda_open(t->device, &t->stream, t->gpu_name, sizeof t->gpu_name) < 0 ||
        mlp_cuda_device_uuid(t->device, me->uuid) < 0) {
        err("rank %d: GPU %d: %s", t->rank, t->device, mlp_cuda_last_error());
        return EXIT_FAIL;
    }
    me->has_gpu = 1;
    return 0;
}

/*
 * The backend of libddp's communicator, decided alike on every rank: the ranks allgather their
 * reports over the cpu communicator and each applies train_backend_decide() to all of them.
 * Returns 0 or EXIT_USAGE/EXIT_FAIL (printed; --backend nccl where it cannot run fails on every
 * rank, rank 0 saying why).
 */
static int agree_backend(trainer *t, const train_gpu_ident *me)
{
    train_gpu_ident *all = calloc((size_t)t->world, sizeof *all);
    if (!all) {
        err("rank %d: out of memory", t->rank);
        return EXIT_FAIL;
    }
    int status = 0;
    int rc = coll_allgather(t->hcomm, me, all, sizeof *me, COLL_U8);
    if (rc < 0) {
        err("rank %d: exchanging the GPUs' identities: %s: %s", t->rank, coll_strerror(rc),
            coll_last_error(t->hcomm));
        status = EXIT_FAIL;
    } else if (train_backend_decide(t->a.backend, all, t->world, &t->backend, t->backend_why,
                                    sizeof t->backend_why) < 0) {
        if (t->rank == 0)
            err("--backend nccl: %s; use --backend auto or cpu", t->backend_why);
        status = EXIT_USAGE;
    }
    free(all);
    return status;
}

/*
 * The store, the device and the communicators: the cpu one first (hcomm), through which the
 * ranks agree on the backend, then libddp's (comm): the same one, or an nccl one beside it.
 * Returns 0, EXIT_USAGE or EXIT_FAIL (printed).
 */
static int connect_job(trainer *t)
{
    coll_env_options eo;
    coll_env_options_init(&eo);
    eo.name = "ddp-train";
    eo.store_only = true;
    eo.standalone = true;
    coll_env job;
    int rc = coll_comm_init_env(&eo, &job);
    if (rc < 0) {
        err("%s", coll_last_error(NULL));
        return rc == -EINVAL || rc == -ENOSPC ? EXIT_USAGE : EXIT_FAIL;
    }
    t->rank = job.env.rank;
    t->world = job.env.world_size;
    t->store = job.store; /* trainer_free() releases both */
    t->own_store = job.server;
    char prefix[sizeof job.prefix + 8];
    snprintf(prefix, sizeof prefix, "%s", job.prefix);
    coll_options opts;
    coll_options_init(&opts);
    opts.timeout_ms = t->a.timeout_ms;
    opts.log = ddp_log;
    opts.log_arg = &t->rank;
    const char *which = "cpu";
    rc =
        coll_comm_init(t->store, prefix, t->rank, t->world, COLL_BACKEND_CPU, -1, &opts, &t->hcomm);
    if (rc == 0) {
        t->comm = t->hcomm;
        train_gpu_ident me;
        int status = setup_device(t, &job.env, &me);
        if (status == 0)
            status = agree_backend(t, &me);
        if (status != 0 || t->backend != COLL_BACKEND_NCCL)
            return status;
        /* NCCL reduces device buffers only: the trainer's own sums stay on the cpu one. */
        which = "nccl";
        size_t len = strlen(prefix);
        snprintf(prefix + len, sizeof prefix - len, "/nccl");
        rc = coll_comm_init(t->store, prefix, t->rank, t->world, COLL_BACKEND_NCCL, t->device,
                            &opts, &t->comm);
    }
    if (rc < 0) {
        err("rank %d: cannot create the %s communicator: %s: %s", t->rank, which,
            coll_strerror(rc), coll_last_error(NULL));
        return EXIT_FAIL;
    }
    return 0;
}

/* Loads both splits; the sampler, the loader, the schedule. Returns 0 or EXIT_USAGE. */
static int setup_data(trainer *t)
{
    train_args *a = &t->a;
    if (data_load(a->data, "train", &t->train) < 0 || data_load(a->data, "t10k", &t->test) < 0) {
        err("rank %d: %s", t->rank, data_last_error());
        return EXIT_USAGE;
    }
    if (t->test.dim != t->train.dim) {
        err("%s: the test images are %dx%d, the training images %dx%d", a->data, t->test.rows,
            t->test.cols, t->train.rows, t->train.cols);
        return EXIT_USAGE;
    }
    if (a->micro_batch) {
        /* The accumulation follows the world size, so that the global batch does not. */
        long per_step = (long)t->world * a->micro_batch;
        if (a->global_batch % per_step) {
            err("--micro-batch %d: the global batch (%d) is not a multiple of world size x "
                "micro-batch (%d x %d = %ld)",
                a->micro_batch, a->global_batch, t->world, a->micro_batch, per_step);
            return EXIT_USAGE;
        }
        a->grad_accum = (int)(a->global_batch / per_step);
    }
    if (data_sampler_init(&t->sampler, t->train.n, a->global_batch, t->world, t->rank,
                          a->grad_accum, a->seed) < 0) {
        err("%s", data_last_error() + strlen("sampler: "));
        return EXIT_USAGE;
    }
    t->steps_per_epoch = data_sampler_steps(&t->sampler);
    t->total_steps = (int64_t)a->epochs * t->steps_per_epoch;
    if (a->max_steps > 0 && a->max_steps < t->total_steps)
        t->total_steps = a->max_steps;
    t->epochs = (int)((t->total_steps + t->steps_per_epoch - 1) / t->steps_per_epoch);
    if (a->log_every == 0)
        a->log_every = t->steps_per_epoch >= 10 ? t->steps_per_epoch / 10 : 1;
    t->sched = (ddp_schedule){.kind = a->schedule,
                              .lr = (float)a->lr,
                              .warmup_steps = a->warmup,
                              .total_steps = t->total_steps,
                              .min_lr = 0};

    if (a->dump_batches && t->rank == 0) {
        size_t rows = (size_t)t->total_steps * (size_t)a->global_batch;
        size_t bytes = rows * (sizeof(float) * t->train.dim + sizeof(int32_t) + 1);
        if (bytes > DUMP_MAX_BYTES) {
            err("--dump-batches would hold %zu MiB in memory (more than %llu); limit the run "
                "with --max-steps",
                bytes >> 20, DUMP_MAX_BYTES >> 20);
            return EXIT_USAGE;
        }
        if (data_sampler_init(&t->dump.global, t->train.n, a->global_batch, 1, 0, 1, a->seed) < 0 ||
            !(t->dump.index = malloc(sizeof(int32_t) * rows + 1)) ||
            !(t->dump.y = malloc(rows + 1)) ||
            !(t->dump.x = malloc(sizeof(float) * rows * t->train.dim + 1)) ||
            !(t->dump.lr = malloc(sizeof(float) * (size_t)t->total_steps + 1))) {
            err("--dump-batches: out of memory");
            return EXIT_USAGE;
        }
    }
    return 0;
}

/*
 * --device cuda: the model on the GPU, and both data sets uploaded once (their bytes; the
 * device normalises what it gathers). Returns 0 or EXIT_FAIL (printed).
 */
static int setup_cuda(trainer *t, int max_batch)
{
    t->ops = &cuda_ops;
    int rc = mlp_cuda_create(&t->cfg, max_batch, t->stream, &t->gnet);
    for (int i = 0; i < 2 && rc == 0; i++) {
        const data_set *ds = i ? &t->test : &t->train;
        uint8_t *pix = malloc((size_t)ds->n * ds->dim);
        if (!pix) {
            err("rank %d: out of memory", t->rank);
            return EXIT_FAIL;
        }
        data_pixels(ds, pix);
        rc = mlp_cuda_data_create(pix, ds->y, ds->n, ds->dim, max_batch, t->a.bf16, t->stream,
                                  i ? &t->gtest : &t->gtrain);
        free(pix);
    }
    if (rc < 0) {
        err("rank %d: GPU %d: %s", t->rank, t->device, mlp_cuda_last_error());
        return EXIT_FAIL;
    }
    return 0;
}

/* The model: units, parameters, commit (rank 0 draws, the others receive). */
static int setup_model(trainer *t)
{
    train_args *a = &t->a;
    t->cfg = (mlp_config){.in_dim = t->train.dim,
                          .hidden = a->hidden,
                          .layers = a->layers,
                          .classes = 10,
                          .bf16 = a->bf16};
    t->L = mlp_num_linear(&t->cfg);
    t->hooks = (mlp_hooks){.begin = hook_begin, .end = hook_end, .arg = t};
    int max_batch = t->sampler.micro > EVAL_CHUNK ? t->sampler.micro : EVAL_CHUNK;
    t->pW = calloc((size_t)t->L, sizeof(int));
    t->pb = calloc((size_t)t->L, sizeof(int));
    t->names = calloc(2 * (size_t)t->L, sizeof(char *));
    if (!t->pW || !t->pb || !t->names) {
        err("rank %d: out of memory", t->rank);
        return EXIT_FAIL;
    }
    int rc;
    if (t->device < 0) {
        t->ops = &host_ops;
        if (mlp_create(&t->cfg, max_batch, &t->net) < 0) {
            err("rank %d: out of memory for the model's activations", t->rank);
            return EXIT_FAIL;
        }
    } else if ((rc = setup_cuda(t, max_batch)) != 0) {
        return rc;
    }

    ddp_options o;
    ddp_options_init(&o);
    o.zero_stage = a->zero;
    (void)ddp_options_set_optimizer(&o, a->optimizer); /* and its default hyper-parameters */
    o.momentum = (float)a->momentum;
    o.weight_decay = (float)a->weight_decay;
    o.clip_norm = (float)a->clip;
    o.bucket_bytes = (size_t)(a->bucket_mb * 1048576.0);
    if (o.first_bucket_bytes > o.bucket_bytes)
        o.first_bucket_bytes = o.bucket_bytes;
    o.log = ddp_log;
    o.log_arg = &t->rank;
    o.device = t->device;
    o.stream = t->stream;
    o.precision = a->bf16 ? DDP_PREC_BF16 : DDP_PREC_F32;
    o.reduce_dtype = a->reduce_dtype;
    rc = ddp_model_create(t->comm, &o, &t->m);
    if (rc < 0) {
        err("rank %d: ddp_model_create: %s: %s", t->rank, ddp_strerror(rc), ddp_last_error(NULL));
        return EXIT_FAIL;
    }
    for (int l = 0; l < t->L; l++) {
        char unit[16];
        snprintf(unit, sizeof unit, "fc%d", l + 1);
        int in = mlp_layer_in(&t->cfg, l), out = mlp_layer_out(&t->cfg, l);
        int u = ddp_unit_add(t->m, unit);
        t->pW[l] = u < 0 ? u : ddp_param_add(t->m, u, "weight", 2, (int64_t[]){out, in}, COLL_F32);
        t->pb[l] = u < 0 ? u : ddp_param_add(t->m, u, "bias", 1, (int64_t[]){out}, COLL_F32);
        if (u < 0 || t->pW[l] < 0 || t->pb[l] < 0) {
            rc = u < 0 ? u : t->pW[l] < 0 ? t->pW[l] : t->pb[l];
            err("rank %d: registering %s: %s: %s", t->rank, unit, ddp_strerror(rc),
                ddp_last_error(t->m));
            return EXIT_FAIL;
        }
        /* init_param() finds the layer of parameter p at p / 2. */
        assert(t->pW[l] == 2 * l && t->pb[l] == 2 * l + 1);
        char name[32];
        snprintf(name, sizeof name, "%s.weight", unit);
        t->names[2 * l] = strdup(name);
        snprintf(name, sizeof name, "%s.bias", unit);
        t->names[2 * l + 1] = strdup(name);
    }
    if ((rc = ddp_model_commit(t->m, init_param, t)) < 0) {
        err("rank %d: ddp_model_commit: %s: %s", t->rank, ddp_strerror(rc), ddp_last_error(t->m));
        return EXIT_FAIL;
    }
    return 0;
}

/* Where the account of a failure is. */
enum { BY_LIBDDP, BY_COMM, BY_COMPUTE };

/*
 * Reports a failed call at `step` with its account: libddp's, the communicator's when the call
 * was the trainer's own collective (the loss and evaluation sums), or the compute's own (a
 * CUDA failure, say) when it failed outside a hook; and the rank libcollective blames, if a
 * peer failed. Returns EXIT_FAIL.
 */
static int failed_by(trainer *t, const char *what, int64_t step, int rc, int by)
{
    int culprit = coll_comm_failed_rank(t->comm);
    if (culprit < 0)
        culprit = coll_comm_failed_rank(t->hcomm);
    char who[48] = "";
    if (culprit >= 0 && culprit != t->rank)
        snprintf(who, sizeof who, " (rank %d failed)", culprit);
    err("rank %d: %s at step %" PRId64 " failed%s: %s: %s", t->rank, what, step + 1, who,
        ddp_strerror(rc),
        by == BY_COMM      ? coll_last_error(t->hcomm)
        : by == BY_COMPUTE ? t->ops->last_error()
                           : ddp_last_error(t->m));
    return EXIT_FAIL;
}

static int failed(trainer *t, const char *what, int64_t step, int rc)
{
    return failed_by(t, what, step, rc, BY_LIBDDP);
}

/* A failed pass or take: the hook's account (libddp's), else the compute's own. */
static int failed_compute(trainer *t, const char *what, int64_t step, int rc)
{
    return failed_by(t, what, step, rc, t->hook_failed ? BY_LIBDDP : BY_COMPUTE);
}

/* ------------------------------------------------------------------------------------------ */
/* Evaluation                                                                                  */
/* ------------------------------------------------------------------------------------------ */

/*
 * Test loss and accuracy over the whole test set: rank r takes the contiguous shard
 * [r * ceil(n / W), ...), in chunks of EVAL_CHUNK rows, and the sums are allreduced. Every rank
 * runs the same number of forward passes (a short shard ends with empty ones) because each
 * pass gathers the units at ZeRO-3, which is collective. Every rank. Returns 0 or EXIT_FAIL
 * (printed, naming `step`).
 */
static int evaluate(trainer *t, int64_t step, double *loss, double *accuracy)
{
    const data_set *ds = &t->test;
    int per = (ds->n + t->world - 1) / t->world;
    int lo = t->rank * per < ds->n ? t->rank * per : ds->n;
    int hi = lo + per < ds->n ? lo + per : ds->n;
    int chunks = (per + EVAL_CHUNK - 1) / EVAL_CHUNK;
    /* The training passes' loss not reported yet waits for the next report. */
    mlp_stats st;
    t->hook_failed = 0;
    int rc = t->ops->take(t, &st);
    if (rc < 0)
        return failed_compute(t, "evaluation", step, rc);
    t->carry_loss += st.loss_sum;
    double sums[2] = {0, 0}; /* loss, correct */
    for (int c = 0; c < chunks; c++) {
        int start = lo + c * EVAL_CHUNK;
        int count = hi - start < EVAL_CHUNK ? hi - start : EVAL_CHUNK;
        if (count <= 0) { /* an empty pass: its gathers only */
            count = 0;
            start = lo;
        }
        if ((rc = t->ops->eval(t, start, count)) < 0 || (rc = t->ops->take(t, &st)) < 0)
            return failed_compute(t, "evaluation", step, rc);
        sums[0] += st.loss_sum;
        sums[1] += st.correct;
    }
    if ((rc = coll_allreduce(t->hcomm, sums, sums, 2, COLL_F64, COLL_SUM)) < 0)
        return failed_by(t, "evaluation", step, rc, BY_COMM);
    *loss = sums[0] / ds->n;
    *accuracy = sums[1] / ds->n;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Output                                                                                      */
/* ------------------------------------------------------------------------------------------ */

static void format_duration(char *buf, size_t cap, double s)
{
    if (!(s >= 0) || s > 1e7)
        snprintf(buf, cap, "?");
    else if (s >= 3600)
        snprintf(buf, cap, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
    else
        snprintf(buf, cap, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
}

/* Rank 0's report of a training interval: a progress bar on a terminal, else a line. */
static void report_step(trainer *t, int64_t step, int epoch, double loss, float lr,
                        double grad_norm, double samples_per_s, double eta_s)
{
    char eta[32];
    format_duration(eta, sizeof eta, eta_s);
    if (t->tty) {
        enum { WIDTH = 24 };
        int fill = (int)(WIDTH * step / t->total_steps);
        char bar[WIDTH + 1];
        for (int i = 0; i < WIDTH; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[WIDTH] = '\0';
        fprintf(stderr,
                "\r[%s] step %" PRId64 "/%" PRId64 " epoch %d/%d loss %.4f %.0f samples/s "
                "ETA %s\033[K",
                bar, step, t->total_steps, epoch + 1, t->epochs, loss, samples_per_s, eta);
    } else {
        fprintf(stderr,
                "step %" PRId64 "/%" PRId64 " | epoch %d | loss %.4f | lr %.3g | norm %.3f "
                "| %.0f samples/s | ETA %s\n",
                step, t->total_steps, epoch + 1, loss, (double)lr, grad_norm, samples_per_s, eta);
    }
    metrics_write(t, json_pack("{s:I, s:i, s:f, s:f, s:f, s:f}", "step", (json_int_t)step, "epoch",
                               epoch + 1, "loss", loss, "lr", (double)lr, "grad_norm", grad_norm,
                               "samples_per_s", samples_per_s));
}

static void report_epoch(trainer *t, int64_t step, int epoch, double test_loss, double acc)
{
    fprintf(stderr, "%sepoch %d/%d (step %" PRId64 "): test loss %.4f, test accuracy %.2f%%\n",
            t->tty ? "\r\033[K" : "", epoch + 1, t->epochs, step, test_loss, 100 * acc);
    metrics_write(t, json_pack("{s:I, s:i, s:f, s:f}", "step", (json_int_t)step, "epoch", epoch + 1,
                               "test_loss", test_loss, "test_accuracy", acc));
}

/* ------------------------------------------------------------------------------------------ */
/* Checkpoints                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* This run's settings as a checkpoint records them, `step` being the next step to train. */
static train_state run_state(const trainer *t, int64_t step)
{
    const train_args *a = &t->a;
    return (train_state){.step = step,
                         .world = t->world,
                         .zero = a->zero,
                         .grad_accum = a->grad_accum,
                         .in_dim = t->cfg.in_dim,
                         .hidden = a->hidden,
                         .layers = a->layers,
                         .classes = t->cfg.classes,
                         .global_batch = a->global_batch,
                         .train_samples = t->train.n,
                         .seed = a->seed,
                         .optimizer = a->optimizer,
                         .schedule = a->schedule,
                         .lr = a->lr,
                         .warmup = a->warmup,
                         .total_steps = t->total_steps};
}

/*
 * Saves the checkpoint of the steps taken so far (`step`), asynchronously: libddp copies the
 * owned state and a thread writes it while training goes on. The progress is the next step's
 * place in the data order, (epoch, step within it), which does not depend on the world size.
 * Every rank. Returns 0 or EXIT_FAIL (printed).
 */
static int save_checkpoint(trainer *t, int64_t step)
{
    train_state st = run_state(t, step);
    char *user = NULL;
    int rc = train_state_json(&st, &user);
    ddp_checkpoint_progress pr = {.epoch = step / t->steps_per_epoch,
                                  .position = step % t->steps_per_epoch,
                                  .seed = t->a.seed};
    if (rc == 0)
        rc = ddp_checkpoint_save(t->m, t->a.ckpt_dir, &pr, user, t->a.keep, 0);
    free(user);
    if (rc < 0) {
        err("rank %d: checkpoint of step %" PRId64 " under %s failed: %s: %s", t->rank, step,
            t->a.ckpt_dir, ddp_strerror(rc), ddp_last_error(t->m));
        return EXIT_FAIL;
    }
    return 0;
}

/* What restore() does, decided by rank 0 and broadcast with the path. */
enum { RESTORE_NONE = 0, RESTORE_RESUME, RESTORE_INIT, RESTORE_ERROR };

/*
 * Rank 0's choice: --resume PATH; --resume auto, the newest complete checkpoint under
 * --checkpoint-dir (libddp skips torn or malformed ones with a warning line each), or nothing;
 * then --init-from when nothing is resumed. Writes the path into path[cap].
 */
static int restore_choice(trainer *t, char *path, size_t cap)
{
    const train_args *a = &t->a;
    if (a->resume && strcmp(a->resume, "auto")) {
        snprintf(path, cap, "%s", a->resume);
        return RESTORE_RESUME;
    }
    if (a->resume) {
        int rc = ddp_checkpoint_latest(a->ckpt_dir, path, cap, ddp_log, &t->rank);
        if (rc < 0) {
            err("--resume auto: cannot search %s: %s", a->ckpt_dir, strerror(-rc));
            return RESTORE_ERROR;
        }
        if (rc == 1)
            return RESTORE_RESUME;
        fprintf(stderr, "ddp-train: no complete checkpoint under %s: starting from scratch\n",
                a->ckpt_dir);
    }
    if (a->init_from) {
        snprintf(path, cap, "%s", a->init_from);
        return RESTORE_INIT;
    }
    return RESTORE_NONE;
}

/*
 * After commit: loads what --resume or --init-from names, on every rank (rank 0 chooses and
 * broadcasts the path, so every rank loads the same checkpoint). A resumed run checks that the
 * checkpoint's user state fits this run (train_state_compare()) and starts at its step.
 * Returns 0, EXIT_USAGE (no such checkpoint, or another model or data order) or EXIT_FAIL.
 */
static int restore(trainer *t)
{
    const train_args *a = &t->a;
    if (!a->resume && !a->init_from)
        return 0;
    char buf[PATH_MAX + 1] = {0}; /* buf[0]: the choice; then the path */
    if (t->rank == 0)
        buf[0] = (char)restore_choice(t, buf + 1, sizeof buf - 1);
    int rc = coll_broadcast(t->hcomm, buf, buf, sizeof buf, COLL_U8, 0);
    if (rc < 0) {
        err("rank %d: broadcasting the checkpoint to load: %s: %s", t->rank, coll_strerror(rc),
            coll_last_error(t->hcomm));
        return EXIT_FAIL;
    }
    int choice = buf[0];
    const char *path = buf + 1;
    if (choice == RESTORE_NONE || choice == RESTORE_ERROR)
        return choice == RESTORE_NONE ? 0 : EXIT_USAGE;

    ddp_checkpoint_progress pr;
    char *user = NULL;
    rc = ddp_checkpoint_load(t->m, path, choice == RESTORE_INIT ? DDP_CKPT_PARAMS_ONLY : 0, &pr,
                             choice == RESTORE_INIT ? NULL : &user);
    if (rc < 0) {
        /* The same code on every rank; rank 0 says it once. */
        if (t->rank == 0)
            err("%s %s: %s: %s", choice == RESTORE_INIT ? "--init-from" : "--resume", path,
                ddp_strerror(rc), ddp_last_error(t->m));
        return rc == -EINVAL || rc == -ENOENT || rc == -EPROTO || rc == -EBADMSG ? EXIT_USAGE
                                                                                 : EXIT_FAIL;
    }
    if (choice == RESTORE_INIT) {
        if (t->rank == 0)
            fprintf(stderr, "ddp-train: parameters from %s; optimizer state from scratch\n", path);
        return 0;
    }

    /* Every rank decides alike: same checkpoint, same arguments. */
    train_state saved, now = run_state(t, 0);
    char why[512];
    int status = EXIT_USAGE;
    if (!user)
        snprintf(why, sizeof why, "it has no ddp-train state (saved by another program?)");
    else if (train_state_parse(user, &saved, why, sizeof why) < 0)
        ;
    else if ((rc = train_state_compare(&saved, &now, why, sizeof why)) < 0)
        ;
    else if (saved.step != pr.epoch * t->steps_per_epoch + pr.position)
        snprintf(why, sizeof why,
                 "its step %" PRId64 " is not its sampler position (epoch %" PRId64
                 ", step %" PRId64 " of %d)",
                 saved.step, pr.epoch, pr.position, t->steps_per_epoch);
    else
        status = 0;
    ddp_free(user);
    if (status != 0) {
        if (t->rank == 0)
            err("--resume %s: cannot resume from it: %s", path, why);
        return status;
    }
    if (rc == 1 && t->rank == 0)
        warn("--resume %s: %s", path, why); /* the schedule changed */
    t->start_step = saved.step;
    if (t->rank == 0)
        fprintf(stderr,
                "ddp-train: resuming from %s at step %" PRId64 " (epoch %" PRId64 ", step %" PRId64
                " of it), saved by %d rank%s at ZeRO-%d\n",
                path, saved.step, pr.epoch + 1, pr.position, saved.world,
                saved.world == 1 ? "" : "s", saved.zero);
    return 0;
}

/*
 * DDP_TRAIN_TEST_KILL=RANK:STEP[:STOP], for tests that need a rank to die at a known point
 * rather than at a time: on the job's first attempt (TORCHELASTIC_RESTART_COUNT unset or 0),
 * rank RANK (* : any rank that reads it) raises SIGKILL, or SIGSTOP with :STOP, right after
 * step STEP and its checkpoint save. A save is complete only once every rank's writer is
 * known to be done, which takes a collective after the save returns, so a rank killed right
 * after a save leaves that checkpoint torn (no manifest), and the one before it complete (a
 * save first waits for the previous one to complete). Not in --help: not for users.
 */
static void test_kill_read(trainer *t)
{
    const char *spec = getenv("DDP_TRAIN_TEST_KILL");
    const char *attempt = getenv("TORCHELASTIC_RESTART_COUNT");
    char rank[16] = "", sig[8] = "KILL";
    t->kill_rank = -1;
    if (!spec || (attempt && strcmp(attempt, "0")) ||
        sscanf(spec, "%15[^:]:%" SCNd64 ":%7s", rank, &t->kill_step, sig) < 2)
        return;
    t->kill_rank = !strcmp(rank, "*") ? -2 : atoi(rank);
    t->kill_sig = !strcmp(sig, "STOP") ? SIGSTOP : SIGKILL;
}

/* ------------------------------------------------------------------------------------------ */
/* Training                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/* Rank 0, --dump-batches: keeps step `step`'s global batch and learning rate. */
static void dump_record(trainer *t, const data_batch *b, int64_t step, float lr)
{
    data_sampler *g = &t->dump.global;
    if (g->epoch != b->epoch)
        data_sampler_set_epoch(g, b->epoch);
    size_t G = (size_t)t->a.global_batch, D = (size_t)t->train.dim;
    const int32_t *idx = data_sampler_global(g, b->step);
    memcpy(t->dump.index + (size_t)step * G, idx, sizeof(int32_t) * G);
    data_gather(&t->train, idx, (int)G, t->dump.x + (size_t)step * G * D,
                t->dump.y + (size_t)step * G);
    t->dump.lr[step] = lr;
    t->dump.steps = step + 1;
}

static int train(trainer *t, double *final_acc, double *train_s)
{
    train_args *a = &t->a;
    /* libddp averages gradients over the ranks, so each rank scales by its own share of the
     * global batch: the result is the gradient of the mean loss over the global batch. */
    const float loss_scale = (float)t->world / (float)a->global_batch;
    int64_t step = t->start_step; /* steps taken, by this run and the one it resumes */
    int rc = step < t->total_steps
                 ? data_loader_create(&t->train, &t->sampler, (int)(step / t->steps_per_epoch),
                                      (int)(step % t->steps_per_epoch), a->epochs,
                                      (int64_t)t->total_steps, &t->loader)
                 : 0;
    if (rc < 0) {
        err("rank %d: %s", t->rank, data_last_error());
        return EXIT_FAIL;
    }

    int64_t interval_steps = 0;
    double t_train = 0;            /* seconds in training steps, evaluation excluded */
    double t_mark = mono_now_s(); /* start of the current stretch of training */
    double t_report = t_train;
    double acc = NAN;
    const data_batch *b;
    while (t->loader && data_loader_next(t->loader, &b) == 0) {
        int last = b->micro == a->grad_accum - 1;
        if ((rc = ddp_micro_begin(t->m, last)) < 0)
            return failed(t, "ddp_micro_begin", step, rc);
        t->hook_failed = 0;
        rc = t->ops->micro(t, b, loss_scale);
        int end = ddp_micro_end(t->m); /* surfaces the library's account of a hook's failure */
        if (rc < 0)
            return failed_compute(t, "the forward or backward pass", step, end < 0 ? end : rc);
        if (end < 0)
            return failed(t, "ddp_micro_end", step, end);
        if (!last)
            continue;

        /* On the device the step stays asynchronous: its info is read when reported. */
        float lr = ddp_schedule_lr(&t->sched, step);
        ddp_step_info info = {0};
        if ((rc = ddp_step(t->m, lr, t->ops->async ? NULL : &info)) < 0)
            return failed(t, "ddp_step", step, rc);
        if (t->dump.x)
            dump_record(t, b, step, lr);
        step++;
        interval_steps++;
        int epoch_end = b->step == t->steps_per_epoch - 1;
        int report = step % a->log_every == 0 || epoch_end || step == t->total_steps;
        if (report && t->ops->async && (rc = ddp_step_info_get(t->m, &info)) < 0)
            return failed(t, "ddp_step", step - 1, rc);
        if (info.skipped && t->rank == 0)
            warn("%sstep %" PRId64 " skipped: the gradient norm is %g", t->tty ? "\r\033[K" : "",
                 step, info.grad_norm);

        if (report) {
            mlp_stats st;
            if ((rc = t->ops->take(t, &st)) < 0)
                return failed_compute(t, "the loss", step, rc);
            double now = mono_now_s(); /* after take(), which waits for the device */
            t_train += now - t_mark;
            double sum = st.loss_sum + t->carry_loss;
            t->carry_loss = 0;
            if ((rc = coll_allreduce(t->hcomm, &sum, &sum, 1, COLL_F64, COLL_SUM)) < 0)
                return failed_by(t, "the loss allreduce", step, rc, BY_COMM);
            double loss = sum / ((double)interval_steps * a->global_batch);
            double rate = (double)interval_steps * a->global_batch / (t_train - t_report);
            double eta = (t->total_steps - step) * (t_train / (double)(step - t->start_step));
            if (t->rank == 0)
                report_step(t, step, b->epoch, loss, lr, info.grad_norm, rate, eta);
            interval_steps = 0;
            t_report = t_train;
            t_mark = mono_now_s();
        }
        if (epoch_end || step == t->total_steps) {
            t_train += mono_now_s() - t_mark;
            double test_loss;
            if ((rc = evaluate(t, step, &test_loss, &acc)) != 0)
                return rc;
            if (t->rank == 0)
                report_epoch(t, step, b->epoch, test_loss, acc);
            t_mark = mono_now_s();
        }
        if (a->ckpt_every && step % a->ckpt_every == 0 && (rc = save_checkpoint(t, step)) != 0)
            return rc;
        if (step == t->kill_step && (t->rank == t->kill_rank || t->kill_rank == -2))
            raise(t->kill_sig);
    }
    if (isnan(acc)) { /* resumed at or past the last step: nothing trained, still report */
        double test_loss;
        if ((rc = evaluate(t, step, &test_loss, &acc)) != 0)
            return rc;
        if (t->rank == 0)
            report_epoch(t, step, (int)((step - 1) / t->steps_per_epoch), test_loss, acc);
    }
    /* The last save completes (its manifest is written) before the run ends. A failed save
     * does not stop training (libddp logged it, on every rank, and the next one tries again);
     * the last one's failure is the run's, once it has done the rest. */
    if (a->ckpt_dir && (rc = ddp_checkpoint_wait(t->m)) < 0) {
        if (ddp_model_broken(t->m))
            return failed(t, "the last checkpoint", step, rc);
        char newest[PATH_MAX];
        int found = ddp_checkpoint_latest(a->ckpt_dir, newest, sizeof newest, NULL, NULL);
        err("rank %d: trained, but the last save failed: %s; %s%s", t->rank, ddp_last_error(t->m),
            found == 1 ? "the newest complete checkpoint is " : "no complete checkpoint remains",
            found == 1 ? newest : "");
        t->last_save_failed = 1;
    }
    *final_acc = acc;
    *train_s = t_train;
    return EXIT_OK;
}

/* Rank 0's last line: accuracy, throughput, and this rank's model-state memory. */
static void summary(trainer *t, double acc, double train_s)
{
    ddp_memory mem = {0};
    ddp_memory_stats(t->m, &mem);
    double mib = 1.0 / 1048576;
    int64_t samples = (t->total_steps - t->start_step) * t->a.global_batch; /* this run's */
    fprintf(stderr,
            "ddp-train: %d rank%s, ZeRO-%d, %s: test accuracy %.2f%% after %" PRId64
            " steps in %.1f s (%.0f samples/s); model state %.2f MiB on rank 0 (parameters "
            "%.2f, gradients %.2f, optimizer %.2f; pools %.2f more)\n",
            t->world, t->world == 1 ? "" : "s", t->a.zero, ddp_optimizer_name(t->a.optimizer),
            100 * acc, t->total_steps, train_s, samples / train_s, mem.model_state_bytes * mib,
            mem.param_bytes * mib, mem.grad_bytes * mib, mem.optimizer_bytes * mib,
            mem.pool_bytes * mib);
    metrics_write(
        t, json_pack("{s:s, s:i, s:i, s:f, s:I, s:f, s:f, s:{s:I, s:I, s:I, s:I, s:I}}", "summary",
                     "done", "world", t->world, "zero", t->a.zero, "test_accuracy", acc, "steps",
                     (json_int_t)t->total_steps, "train_seconds", train_s, "samples_per_s",
                     samples / train_s, "memory", "param_bytes", (json_int_t)mem.param_bytes,
                     "grad_bytes", (json_int_t)mem.grad_bytes, "optimizer_bytes",
                     (json_int_t)mem.optimizer_bytes, "pool_bytes", (json_int_t)mem.pool_bytes,
                     "model_state_bytes", (json_int_t)mem.model_state_bytes));
}

static void trainer_free(trainer *t)
{
    data_loader_free(t->loader);
    ddp_model_free(t->m);
    if (t->hcomm != t->comm)
        coll_comm_destroy(t->hcomm);
    coll_comm_destroy(t->comm);
    rdzv_client_close(t->store);
    rdzv_server_stop(t->own_store);
    mlp_free(t->net);
    mlp_cuda_free(t->gnet);
    mlp_cuda_data_free(t->gtrain);
    mlp_cuda_data_free(t->gtest);
    data_sampler_free(&t->sampler);
    data_sampler_free(&t->dump.global);
    data_set_free(&t->train);
    data_set_free(&t->test);
    for (int i = 0; t->names && i < 2 * t->L; i++)
        free(t->names[i]);
    free(t->names);
    free(t->pW);
    free(t->pb);
    free(t->dump.index);
    free(t->dump.y);
    free(t->dump.x);
    free(t->dump.lr);
    if (t->metrics)
        fclose(t->metrics);
    mlp_cuda_close(t->stream);
}

int main(int argc, char **argv)
{
    (void)mlp_blas_select(argv); /* OpenBLAS's fast kernels where it does not know the CPU */
    trainer t = {0};
    int status = parse_args(argc, argv, &t.a);
    if (status != 0)
        return status < 0 ? EXIT_OK : leave(status);
    openblas_set_num_threads(t.a.threads);

    test_kill_read(&t);
    if ((status = connect_job(&t)) != 0)
        goto out;
    if (t.rank == 0 && t.a.metrics && !(t.metrics = fopen(t.a.metrics, "w"))) {
        err("%s: cannot create: %s", t.a.metrics, strerror(errno));
        status = EXIT_USAGE;
        goto out;
    }
    t.tty = t.rank == 0 && isatty(STDERR_FILENO);
    if ((status = setup_data(&t)) != 0 || (status = setup_model(&t)) != 0)
        goto out;
    if (t.rank == 0) {
        char shape[256];
        int len = snprintf(shape, sizeof shape, "%d", t.train.dim);
        for (int l = 0; l < t.a.layers && len < (int)sizeof shape - 16; l++)
            len += snprintf(shape + len, sizeof shape - len, "-%d", t.a.hidden);
        snprintf(shape + len, sizeof shape - len, "-10");
        char where[512];
        if (t.device >= 0)
            snprintf(where, sizeof where, "GPU %d %s, %s backend%s%s%s", t.device, t.gpu_name,
                     coll_backend_name(t.backend), t.backend_why[0] ? " (" : "", t.backend_why,
                     t.backend_why[0] ? ")" : "");
        else
            snprintf(where, sizeof where, "OpenBLAS %s kernels", mlp_blas_core());
        fprintf(stderr,
                "ddp-train: %d rank%s, ZeRO-%d, MLP %s (%zu parameters), %s lr %g (%s, "
                "warmup %ld), global batch %d (%d x %d micro-steps per rank), %d epoch%s of %d "
                "steps, %s (reduced in %s); %s\n",
                t.world, t.world == 1 ? "" : "s", t.a.zero, shape, mlp_num_params(&t.cfg),
                ddp_optimizer_name(t.a.optimizer), t.a.lr,
                t.a.schedule == DDP_SCHED_COSINE ? "cosine" : "constant", t.a.warmup,
                t.a.global_batch, t.sampler.micro, t.a.grad_accum, t.epochs,
                t.epochs == 1 ? "" : "s", t.steps_per_epoch, t.a.bf16 ? "bf16" : "f32",
                coll_dtype_name(t.a.reduce_dtype), where);
    }
    if ((status = restore(&t)) != 0)
        goto out;
    if (t.a.dump_init &&
        (status = dump_params(&t, t.a.dump_init,
                              t.start_step || t.a.init_from ? "ddp-train loaded parameters"
                                                            : "ddp-train initial parameters")) != 0)
        goto out;

    double acc = NAN, train_s = 0;
    if ((status = train(&t, &acc, &train_s)) != 0)
        goto out;
    if (t.a.dump_final && (status = dump_params(&t, t.a.dump_final, "ddp-train final parameters")))
        goto out;
    if (t.rank == 0) {
        summary(&t, acc, train_s);
        if (t.a.dump_batches && dump_batches(&t) < 0)
            status = EXIT_FAIL;
    }
    if (status == EXIT_OK && t.last_save_failed)
        status = EXIT_CKPT;
out:
    leave(status); /* first: the teardown of a failed job may not wait for the rest */
    /* After a failure, do not wait for peers that may be gone: abort what is pending. */
    if (status == EXIT_FAIL && t.comm)
        coll_comm_abort(t.comm);
    if (status == EXIT_FAIL && t.hcomm && t.hcomm != t.comm)
        coll_comm_abort(t.hcomm);
    trainer_free(&t);
    return status;
}
