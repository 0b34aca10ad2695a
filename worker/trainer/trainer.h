/*
 * trainer.h: what ddp-train's own files share: its arguments, its state (struct trainer), its
 * exit statuses and messages, and each file's entry points. Internal to the program; nothing
 * here is a library's API.
 *
 *   ddp-train.c     main(): the steps in order, the exit status
 *   train_options.c the options and --help
 *   train_job.c     joining the job: store, device, backend agreement, communicators; failure
 *                   reports; teardown
 *   train_setup.c   the data set, sampler and schedule; the model (model.h) registered with
 *                   libddp and the hooks its passes call
 *   train_loop.c    the training loop and the evaluation
 *   train_ckpt.c    checkpoints: saving, and resuming from or initialising with one
 *   train_report.c  what rank 0 writes: progress, metrics (JSON Lines), safetensors dumps
 *
 * The model itself is a row of model.h's table: nothing in these files knows its layers.
 */
#ifndef DDP_TRAIN_TRAINER_H
#define DDP_TRAIN_TRAINER_H

#include <stdint.h>
#include <stdio.h>

#include "cli.h"
#include "coll.h"
#include "data.h"
#include "ddp.h"
#include "model.h"
#include "rdzv.h"
#include "train_backend.h"
#include "train_state.h"

/* ddp-train's exit statuses (ddp-train(1), EXIT STATUS): 1 for a failure and 2 for a usage error,
 * as every program of the project. */
enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2, EXIT_CKPT = 3 };

/* Rows per forward pass when evaluating; a model is created for at least this many. */
#define EVAL_CHUNK 1000

/* --dump-batches keeps the batches in memory until the end: at most this much. */
#define DUMP_MAX_BYTES (1ull << 30)

/* --data options a run takes, at most. */
#define TRAIN_MAX_DATA 64

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
    int epochs, global_batch, grad_accum, threads, timeout_ms;
    int micro_batch;    /* --micro-batch; 0: --grad-accum decides */
    int grad_accum_set; /* --grad-accum was given */
    uint64_t seed;
    const char *metrics, *data, *dump_init, *dump_batches, *dump_final;
    const char *ckpt_dir, *resume, *init_from;
    long ckpt_every;
    int keep;
    const model_ops *model; /* --model */
    void *model_cfg;        /* its options (model->config_size bytes, owned) */
    /* --tensorboard DIR */
    const char *tensorboard;
    /* --data's values in order, each a path or a comma-separated list of them (text models
     * read them all; an image model reads the last one, `data`) */
    const char *data_args[TRAIN_MAX_DATA];
    int ndata;
    /* --generate PROMPT (NULL: train), --temperature, --max-new */
    const char *generate;
    double temperature;
    int max_new;
} train_args;

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

    /* The model (model.h), its compute on this rank's device (chosen once at set-up) and its
     * units as registered with libddp: unit u's parameters are first_param[u] onwards. */
    model *model;
    const model_compute *compute;
    const model_unit *units;
    int nunits;
    int *first_param;  /* (nunits) */
    int nparams;       /* parameter tensors */
    size_t nelems;     /* parameters (numbers) */
    char **names;      /* (nparams) "fc1.weight", ...: "UNIT.PARAM" */
    double carry_loss; /* training loss taken before an evaluation, for the next report */
    int hook_failed;   /* a hook failed in the latest pass (libddp's account says why) */

    /* --init-from a safetensors file (init_file_open()): rank 0 holds it until commit; every
     * rank knows that it was one (restore() then has nothing to load for --init-from). */
    struct st_file *init_file;
    int init_is_file;

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
        uint8_t *tok;   /* text: (steps, G, seq + 1); x and y are NULL */
        int64_t steps;
    } dump;
    int last_save_failed;   /* the run's last checkpoint failed: EXIT_CKPT once it is done */
    int stopped;            /* a stop signal (SIGTERM) ended training early, all ranks agreed */
    coll_request *stop_req; /* the stop agreement in flight (train_loop.c stop_agree()) */
    int32_t stop_flags;     /* its buffer: the max over the ranks of "has a stop signal" */

    /* Rank 0's records (train_report.c): --tensorboard's writer, the attempt
     * (TORCHELASTIC_RESTART_COUNT) and this process's start on the monotonic clock. */
    ddp_summary *tb;
    int attempt;
    double t_start;

    /* Predictions per row: 1 for images, the context length for text (a model's loss and
     * accuracy are per prediction, model.h); rows per evaluation pass; the latest evaluation's
     * loss per prediction, for the summary. */
    int preds_per_row;
    int eval_chunk;
    double test_loss;
};
typedef struct trainer trainer;

/* "ddp-train: <message>" on stderr, for a failure; the first one is also the error record
 * main() leaves at exit (ddp-train.c). */
void train_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* "ddp-train: <message>" on stderr, for what does not stop the run. */
#define warn(...) cli_msg(stderr, "ddp-train", __VA_ARGS__)

/* train_options.c: fills *a from the command line (--model's options into a->model_cfg,
 * which the caller frees). Returns -1 to exit with EXIT_OK (--help, --version: printed), 0 to
 * train, or EXIT_USAGE (printed). */
int parse_args(int argc, char **argv, train_args *a);

/* train_job.c */

/* libddp's and libcollective's log hook (arg: the int rank): warnings only. */
void train_log(void *arg, int level, const char *msg);

/* The store, the device and the communicators. Returns 0, EXIT_USAGE or EXIT_FAIL (printed). */
int connect_job(trainer *t);

/* Where the account of a failure is. */
enum { BY_LIBDDP, BY_COMM, BY_COMPUTE };

/*
 * Reports a failed call at `step` with its account: libddp's, the communicator's when the call
 * was the trainer's own collective (the loss and evaluation sums), or the model's own (a CUDA
 * failure, say) when it failed outside a hook; and the rank libcollective blames, if a peer
 * failed. Returns EXIT_FAIL.
 */
int failed_by(trainer *t, const char *what, int64_t step, int rc, int by);
int failed(trainer *t, const char *what, int64_t step, int rc);
/* A failed pass or take: the hook's account (libddp's), else the model's own. */
int failed_compute(trainer *t, const char *what, int64_t step, int rc);

/* Copies nbytes of libddp's memory (ddp_param_data(): the device's with a GPU) to dst.
 * Returns 0 or a negative code (the device's account in train_device_error()). */
int train_to_host(trainer *t, void *dst, const void *src, size_t nbytes);
const char *train_device_error(void);

/* Releases everything t holds; a half-built trainer too. */
void trainer_free(trainer *t);

/* train_setup.c: each returns 0 or EXIT_USAGE/EXIT_FAIL (printed). */

/* Loads both splits; the sampler, the schedule, --dump-batches' room. */
int setup_data(trainer *t);
/* The model: created on this rank's device, its units registered, libddp's model committed
 * (rank 0 draws the initial values, the others receive them). */
int setup_model(trainer *t);

/* train_loop.c */

/* Reads DDP_TRAIN_TEST_KILL (tests only). */
void test_kill_read(trainer *t);
/* Trains from t->start_step to the last step, evaluating after each epoch; with
 * --checkpoint-dir saves the last step, and on SIGTERM stops every rank after the same step,
 * saves it and sets t->stopped. Returns 0 with the final test accuracy (NaN when stopped before
 * an evaluation) and the seconds spent training, or EXIT_FAIL (printed). */
int train(trainer *t, double *final_acc, double *train_s);
/* After a stop (t->stopped) and the teardown: ends the process by that signal, its default
 * action, so that a launcher sees a worker that its SIGTERM ended (a shell: 128 + sig). */
int stop_exit(int sig);

/* train_ckpt.c */

/* Saves the checkpoint of the steps taken so far, asynchronously. Every rank. Returns 0 or
 * EXIT_FAIL (printed). */
int save_checkpoint(trainer *t, int64_t step);
/*
 * --init-from FILE, before commit. A regular file is a safetensors file of parameters (ddp-ckpt
 * export's, or any whose tensors carry the run's "UNIT.PARAM" names): rank 0 reads it and checks
 * it against the model (every parameter there by name, F32, of its shape; no other tensor; each
 * metadata key the model writes (model.h meta(): "model", "heads", ...) that the file has too,
 * equal) and broadcasts the verdict; commit's init then copies from it
 * (init_file_param(), rank 0) and init_file_close() frees it. Anything else is a checkpoint,
 * which restore() loads after commit. Returns 0, EXIT_USAGE (rank 0 printed why) or EXIT_FAIL.
 * Every rank.
 */
int init_file_open(trainer *t);
/* Commit's init of parameter `param` (count floats) from the file: 0 or -EINVAL. Rank 0. */
int init_file_param(const trainer *t, int param, void *data, size_t count);
/* Frees the file after commit. */
void init_file_close(trainer *t);
/* After commit: loads what --resume or --init-from (a checkpoint) names, on every rank; a
 * checkpoint --resume auto finds replaces --init-from's file's parameters, and otherwise rank 0
 * says that they came from the file. Returns 0, EXIT_USAGE or EXIT_FAIL (printed). */
int restore(trainer *t);

/* train_report.c */

/* Rank 0's first line: the job, the model, the optimizer, the batch and the device. */
void report_start(trainer *t);
/* Rank 0, after restore(): starts this attempt's records. --metrics' file (opened for appending)
 * is emptied when the run starts afresh (first attempt, nothing resumed) and kept otherwise;
 * --tensorboard's event file is created; a start record is written. Returns 0 or EXIT_USAGE
 * (printed). */
int report_open(trainer *t);
/* Rank 0's report of a training interval, and of an evaluation. */
void report_step(trainer *t, int64_t step, int epoch, double loss, float lr, double grad_norm,
                 double samples_per_s, double eta_s);
void report_epoch(trainer *t, int64_t step, int epoch, double test_loss, double acc);
/* Rank 0's last line: accuracy, throughput, and this rank's model-state memory. */
void summary(trainer *t, double acc, double train_s);
/* Rank 0, --dump-batches: keeps step `step`'s global batch and learning rate. */
void dump_record(trainer *t, const data_batch *b, int64_t step, float lr);
/* Writes the parameters to `path` (safetensors). Every rank. Returns 0 or EXIT_FAIL. */
int dump_params(trainer *t, const char *path, const char *what);
/* Rank 0: writes --dump-batches' file. Returns 0 or -1 (printed). */
int dump_batches(trainer *t);

#endif /* DDP_TRAIN_TRAINER_H */
