/*
 * train_options.c: ddp-train's command line. One option table (the trainer's) feeds both
 * getopt_long and --help (cli.h); the model that --model names adds its own options (model.h),
 * so --model is read ahead of the rest. parse_args() fills train_args with the values and
 * refuses the combinations that cannot work, naming the flags.
 *
 * Not here: what the values do (the train_*.c files), or a model's own options (its row).
 */
#include <assert.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer.h"
#include "version.h"

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
#define DEF_THREADS 1
#define DEF_TIMEOUT_MS 60000
#define DEF_KEEP 3
#define DEF_DEVICE "auto"
#define DEF_PRECISION "f32"
#define DEF_REDUCE_DTYPE "f32"
#define DEF_BACKEND "auto"
#define DEF_TEMPERATURE 0.8
#define DEF_MAX_NEW 200
#define STR_(x) #x
#define STR(x) STR_(x)

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
    OPT_DATA,
    OPT_THREADS,
    OPT_MAX_STEPS,
    OPT_LOG_EVERY,
    OPT_METRICS,
    OPT_TENSORBOARD,
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
    OPT_MODEL,
    OPT_GENERATE,
    OPT_TEMPERATURE,
    OPT_MAX_NEW,
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
    {OPT_MODEL,
     {"--model"},
     "NAME",
     NULL,
     0,
     "The model to train, a row of the table below (the first is the default); its own "
     "options follow it there."},
    {OPT_DATA,
     {"--data"},
     "PATH",
     DATA_DEFAULT_DIR,
     0,
     "Image models (mlp): the directory of the Fashion-MNIST IDX files, gzip-compressed "
     "(.gz) or not. Text models: text files or directories of them, the option repeated or "
     "the names separated by commas (default " DATA_TEXT_DEFAULT_DIR ", Debian's fortunes)."},
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
     "Append JSON Lines to FILE: a record per report and one per epoch with the test loss and "
     "accuracy, each with its time, elapsed time, attempt and world size. A restarted or resumed "
     "run adds to the file; a run from scratch empties it first."},
    {OPT_TENSORBOARD,
     {"--tensorboard"},
     "DIR",
     NULL,
     0,
     "Write TensorBoard scalars (loss, learning rate, gradient norm, samples/s, test loss and "
     "accuracy, memory) to a new event file in DIR (created if absent) for `tensorboard "
     "--logdir`."},
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
     "Where checkpoints go (DIR/step-N) and where --resume auto looks for them. The last step "
     "is always saved; SIGTERM stops every rank after the same step and saves it."},
    {OPT_CKPT_EVERY,
     {"--checkpoint-every"},
     "STEPS",
     "0",
     0,
     "Save a checkpoint every STEPS steps, written by a thread while training goes on; 0: "
     "the last step's only."},
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
     "CKPT|FILE",
     NULL,
     0,
     "Start from the parameters of checkpoint CKPT (e.g. made by ddp-ckpt import) or of a "
     "safetensors FILE (e.g. ddp-ckpt export's; its names, shapes and model metadata must be "
     "the run's) instead of drawing them; the optimizer starts afresh at step 0. A checkpoint "
     "found by --resume auto takes precedence."},
    {OPT_TIMEOUT,
     {"--timeout-ms"},
     "MS",
     STR(DEF_TIMEOUT_MS),
     0,
     "Bound on the communicator's set-up and on each collective: a peer that does not take "
     "part in time fails the run; -1: none."},
    {OPT_GENERATE,
     {"--generate"},
     "PROMPT",
     NULL,
     0,
     "Instead of training: print PROMPT and --max-new bytes that the model samples after it "
     "(text models: --model gpt), from the parameters of --init-from or --resume, with --seed "
     "seeding the draws."},
    {OPT_TEMPERATURE,
     {"--temperature"},
     "T",
     STR(DEF_TEMPERATURE),
     0,
     "--generate: divide the logits by T before sampling; 0 takes the likeliest byte."},
    {OPT_MAX_NEW, {"--max-new"}, "N", STR(DEF_MAX_NEW), 0, "--generate: bytes to sample."},
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
                      "Trains a model (--model) on Fashion-MNIST with libddp's "
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
    fprintf(f, "\nmodels (--model NAME) and their own options:\n");
    for (size_t i = 0; i < model_count(); i++) {
        const model_ops *mo = model_at(i);
        fprintf(f, "  %s%s\n", mo->name, i == 0 ? " (default)" : "");
        cli_print_wrapped(f, mo->summary, 8);
        const model_train_defaults *d = mo->train_defaults;
        if (d) { /* the fields it sets (0 keeps ddp-train's) */
            char text[160] = "Its own defaults:";
            size_t n = strlen(text);
            if (d->global_batch)
                n += (size_t)snprintf(text + n, sizeof text - n, " --global-batch %d",
                                      d->global_batch);
            if (d->epochs)
                n += (size_t)snprintf(text + n, sizeof text - n, " --epochs %d", d->epochs);
            if (d->lr)
                n += (size_t)snprintf(text + n, sizeof text - n, " --lr %g", d->lr);
            if (d->warmup)
                n += (size_t)snprintf(text + n, sizeof text - n, " --warmup %ld", d->warmup);
            snprintf(text + n, sizeof text - n, ".");
            cli_print_wrapped(f, text, 8);
        }
        cli_print_options(f, mo->options, mo->noptions, 0, CLI_HELP_WIDTH);
    }
    fprintf(f, "\nexit status: 0 trained; 1 the job failed (store, communicator, a peer, the "
               "library);\n2 bad usage, environment or data; 3 trained, but the last checkpoint "
               "save failed.\n");
}

/* The words of the keyword options, each at the index of the value it stands for. */
static const char *const schedule_words[] = {
    [DDP_SCHED_CONSTANT] = "constant", [DDP_SCHED_COSINE] = "cosine", NULL};
static const char *const device_words[] = {
    [DEV_AUTO] = "auto", [DEV_CPU] = "cpu", [DEV_CUDA] = "cuda", NULL};
static const char *const backend_words[] = {
    [COLL_BACKEND_AUTO] = "auto", [COLL_BACKEND_CPU] = "cpu", [COLL_BACKEND_NCCL] = "nccl", NULL};
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
    else if (a->model->data_kind == 0 && a->ndata > 1)
        bad = "--data: an image model reads one directory (several files are for text models)";
    else if (a->generate && !a->model->generate)
        bad = "--generate: this --model does not generate text (--model gpt does)";
    else if (a->generate && !a->init_from && !a->resume)
        bad = "--generate needs a trained model: --init-from CKPT|FILE or --resume";
    if (bad) {
        train_err("%s", bad);
        return EXIT_USAGE;
    }
    return 0;
}

/*
 * --model's value, read ahead of the other options because it decides which options there are:
 * the last "--model NAME" or "--model=NAME" before "--", or NULL.
 */
static const char *model_arg(int argc, char **argv)
{
    const char *name = NULL;
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc)
            name = argv[++i];
        else if (!strncmp(argv[i], "--model=", 8))
            name = argv[i] + 8;
    }
    return name;
}

/*
 * The model of --model (the first row without it) with its defaults, and the option table
 * getopt_long parses by: the trainer's, then that model's. Returns 0 or EXIT_USAGE (printed).
 */
static int choose_model(int argc, char **argv, train_args *a, cli_option *table, size_t *n)
{
    const char *name = model_arg(argc, argv);
    int word;
    if (cli_parse_choice("--model", name ? name : model_names()[0], "model", model_names(), &word) <
        0) {
        train_err("%s", cli_last_error());
        return EXIT_USAGE;
    }
    a->model = model_at((size_t)word);
    if (!(a->model_cfg = calloc(1, a->model->config_size))) {
        train_err("out of memory");
        return EXIT_USAGE;
    }
    a->model->config_init(a->model_cfg);
    const model_train_defaults *d = a->model->train_defaults;
    if (d) { /* before the command line, which overrides them */
        a->global_batch = d->global_batch ? d->global_batch : a->global_batch;
        a->epochs = d->epochs ? d->epochs : a->epochs;
        a->lr = d->lr ? d->lr : a->lr;
        a->warmup = d->warmup ? d->warmup : a->warmup;
    }
    assert(NOPTS + a->model->noptions <= CLI_GETOPT_MAX);
    memcpy(table, opt_table, sizeof opt_table);
    memcpy(table + NOPTS, a->model->options, sizeof *table * a->model->noptions);
    *n = NOPTS + a->model->noptions;
    return 0;
}

/* "unknown option 'ARG' (see --help)", or which model's option it is. */
static void unknown_option(const train_args *a, const char *arg)
{
    size_t len = strcspn(arg, "=");
    for (size_t i = 0; i < model_count(); i++) {
        const model_ops *mo = model_at(i);
        if (mo != a->model && cli_find(mo->options, mo->noptions, arg, len, 0) >= 0) {
            train_err("%.*s is an option of --model %s, not of --model %s", (int)len, arg, mo->name,
                      a->model->name);
            return;
        }
    }
    train_err("unknown option '%s' (see --help)", arg);
}

/* Returns -1 to exit with EXIT_OK (--help, --version), 0 to train, or EXIT_USAGE. */
int parse_args(int argc, char **argv, train_args *a)
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
                      .threads = DEF_THREADS,
                      .timeout_ms = DEF_TIMEOUT_MS,
                      .keep = DEF_KEEP,
                      .seed = DEF_SEED,
                      .data = DATA_DEFAULT_DIR,
                      .temperature = DEF_TEMPERATURE,
                      .max_new = DEF_MAX_NEW};
    int sched_word;
    int ok =
        cli_parse_choice("--schedule", DEF_SCHEDULE, "schedule", schedule_words, &sched_word) == 0;
    assert(ok); /* the default above is a valid name */
    (void)ok;
    a->optimizer = DEF_OPTIMIZER;
    a->schedule = (ddp_schedule_kind)sched_word;

    cli_option table[CLI_GETOPT_MAX];
    size_t ntable;
    const char *model_given = NULL;
    if (choose_model(argc, argv, a, table, &ntable) != 0)
        return EXIT_USAGE;
    cli_getopt_tables g;
    int built = cli_getopt_build(&g, table, ntable);
    assert(built == 0); /* the table above is well-formed */
    (void)built;

    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, g.shorts, g.longopts, NULL)) != -1) {
        const cli_option *o = cli_by_id(table, ntable, c);
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
                train_err("%s: unknown optimizer '%s' (%s)", flag, optarg,
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
                train_err("%s: expected a number from 0 to below 1, got '%s'", flag, optarg);
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
                train_err("%s: expected a number of MiB up to 4096, got '%s'", flag, optarg);
                return EXIT_USAGE;
            }
            break;
        case OPT_SEED:
            rc = cli_parse_long(flag, optarg, 0, LONG_MAX, &v);
            a->seed = (uint64_t)v;
            break;
        case OPT_DATA:
            a->data = optarg;
            if (a->ndata == TRAIN_MAX_DATA) {
                train_err("--data: at most %d of them (name more files per option, separated by "
                          "commas, or a directory)",
                          TRAIN_MAX_DATA);
                return EXIT_USAGE;
            }
            a->data_args[a->ndata++] = optarg;
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
        case OPT_TENSORBOARD:
            a->tensorboard = optarg;
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
            train_err("%s needs a value", argv[optind - 1]);
            return EXIT_USAGE;
        case OPT_MODEL:
            model_given = optarg;
            break;
        case OPT_GENERATE:
            a->generate = optarg;
            break;
        case OPT_TEMPERATURE:
            rc = cli_parse_double(flag, optarg, 0, 100, 0, &a->temperature);
            break;
        case OPT_MAX_NEW:
            rc = cli_parse_int(flag, optarg, 0, 1 << 20, &a->max_new);
            break;
        default:
            if (c >= MODEL_OPT_BASE) {
                rc = a->model->config_parse(a->model_cfg, c, flag, optarg);
                break;
            }
            unknown_option(a, argv[optind - 1]);
            return EXIT_USAGE;
        }
        if (rc < 0) {
            train_err("%s", cli_last_error());
            return EXIT_USAGE;
        }
    }
    if (optind < argc) {
        train_err("unexpected argument '%s' (see --help)", argv[optind]);
        return EXIT_USAGE;
    }
    if (model_given && strcmp(model_given, a->model->name)) { /* --model abbreviated */
        int word;
        if (cli_parse_choice("--model", model_given, "model", model_names(), &word) < 0)
            train_err("%s", cli_last_error());
        else
            train_err("--model: write it out in full, so that its options are known");
        return EXIT_USAGE;
    }
    return check_args(a);
}
