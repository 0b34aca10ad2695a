/*
 * ckpt-bench: libddp's checkpoint save and load, timed under ddprun (bench/ckpt/compare.sh runs
 * it next to dd and torch.save / torch.distributed.checkpoint; see README.md there).
 *
 * The model has ddp-train's shape (784 inputs, --layers hidden layers of --hidden, 10 outputs;
 * a weight and a bias per layer) with AdamW, so a checkpoint holds three arrays of the
 * parameters' size: what ddp-train saves. A training step is the real reductions and optimizer
 * after either a real forward and backward of a --batch micro-batch (sgemm through OpenBLAS,
 * ReLU between the layers, the output's own values as the loss gradient: a training loop's
 * compute, which an asynchronous save's copy overlaps) or, with --batch 0, constant gradients
 * (no compute: only the reductions lie between a save and the next step's optimizer, the least
 * the writer's copy of the state can hide behind).
 *
 * One run measures, on every rank together (times are rank 0's, after a barrier):
 *   sync    ddp_checkpoint_save(DDP_CKPT_SYNC): the best of --reps, and MB/s of the bytes of
 *           every shard file
 *   load    ddp_checkpoint_load() of that checkpoint (the page cache may hold it: compare.sh
 *           drops the caches first when it can)
 *   async   K steps with an asynchronous save issued before the first, against K steps
 *           without one (K chosen so that the save finishes in the window). Reported: what
 *           ddp_checkpoint_save() took (async_call_ms); how long the steps' optimizer waited for
 *           the writer's copy of the state (copy_wait_ms, as the library logs it; the most of
 *           any rank); the final ddp_checkpoint_wait() (async_wait_ms); blocked_ms, the sum of
 *           the three (what the calls themselves blocked); the first step's ddp_step() less a
 *           plain step's mean ddp_step() (first_step_extra_ms) and the other steps' mean excess
 *           (poll_ms: the poll's allreduce), both of which also hold the writer's share of the
 *           CPU where ranks and writers outnumber the cores; the loop's difference
 *           (loop_diff_ms, likewise); and stall_ms, the larger of loop_diff_ms and the calls'
 *           save + wait. Each of blocked_ms and stall_ms is also given as a share of the
 *           synchronous save (blocked_pct_of_sync, stall_pct_of_sync)
 * and prints one JSON line on rank 0 (jansson), which compare.sh collects.
 */
#include "cli.h"
#include "coll.h"
#include "ddp.h"
#include "monoclock.h"
#include "rdzv.h"

#include <assert.h>
#include <cblas.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { OPT_HIDDEN = 256, OPT_LAYERS, OPT_STAGE, OPT_DIR, OPT_REPS, OPT_BATCH };

static const cli_option opt_table[] = {
    {OPT_HIDDEN, {"--hidden"}, "H", "256", 0, "Width of each hidden layer."},
    {OPT_LAYERS, {"--layers"}, "N", "2", 0, "Number of hidden layers."},
    {OPT_STAGE, {"--zero"}, "S", "0", 0, "ZeRO stage of the saving model."},
    {OPT_DIR, {"--dir"}, "DIR", NULL, 0, "Checkpoint root (required); emptied by compare.sh."},
    {OPT_REPS, {"--reps"}, "N", "3", 0, "Synchronous saves and loads timed; the best is kept."},
    {OPT_BATCH, {"--batch"}, "B", "0", 0, "Micro-batch of each step's sgemm pass (0: none)."},
    {'h', {"-h", "--help"}, NULL, NULL, 0, "Show this help and exit."},
};
#define NOPTS (sizeof opt_table / sizeof opt_table[0])

static int rank;
static double waited_ms; /* the library's reports of waits for the writer's copy */

static void log_fn(void *arg, int level, const char *msg)
{
    (void)arg;
    const char *w = strstr(msg, ": waited ");
    if (level == COLL_LOG_INFO && w)
        waited_ms += strtod(w + strlen(": waited "), NULL);
    else if (level <= COLL_LOG_WARN)
        fprintf(stderr, "ckpt-bench: rank %d: %s\n", rank, msg);
}

static double ms_since(int64_t t0)
{
    return (double)(mono_now_ns() - t0) / 1e6;
}

/* The compute of --batch B: layer l maps width[l] to width[l + 1] features. */
static struct {
    int B, L;
    int *width;   /* [L + 1] */
    float **act;  /* [L + 1]: (B, width[l]); act[0] the input */
    float *da[2]; /* (B, max width): the gradient flowing back, two in turn */
} net;

/* Uniform in [-sqrt(3 / fan-in), sqrt(3 / fan-in)): unit variance through each layer. */
static int fill(void *arg, int param, const char *name, void *data, size_t count)
{
    (void)arg, (void)name;
    float *x = data, a = sqrtf(3.0f / (float)net.width[param / 2]);
    for (size_t i = 0; i < count; i++)
        x[i] = ((float)((i * 2654435761u + (size_t)param) % 1000) * 2e-3f - 1.0f) * a;
    return 0;
}

static int net_init(int B, int L, int hidden)
{
    net.B = B, net.L = L;
    net.width = malloc((size_t)(L + 1) * sizeof *net.width);
    net.act = calloc((size_t)L + 1, sizeof *net.act);
    if (!net.width || !net.act)
        return -ENOMEM;
    for (int l = 0; l <= L; l++)
        net.width[l] = l == 0 ? 784 : l == L ? 10 : hidden;
    if (B == 0)
        return 0;
    size_t wmax = hidden > 784 ? (size_t)hidden : 784;
    for (int l = 0; l <= L; l++)
        if (!(net.act[l] = malloc((size_t)B * (size_t)net.width[l] * sizeof(float))))
            return -ENOMEM;
    for (int k = 0; k < 2; k++)
        if (!(net.da[k] = malloc((size_t)B * wmax * sizeof(float))))
            return -ENOMEM;
    for (size_t i = 0; i < (size_t)B * 784; i++)
        net.act[0][i] = (float)((i * 2654435761u) % 1000) * 2e-3f - 1.0f;
    return 0;
}

/* Forward of every layer: act[l + 1] = act[l] W^T + b, ReLU but after the last. */
static int forward(ddp_model *m)
{
    int B = net.B, rc = 0;
    for (int l = 0; l < net.L && rc == 0; l++) {
        int in = net.width[l], out = net.width[l + 1];
        if ((rc = ddp_unit_gather(m, l)) < 0)
            break;
        const float *W = ddp_param_data(m, 2 * l), *b = ddp_param_data(m, 2 * l + 1);
        float *y = net.act[l + 1]; /* (B, out) */
        if (!W || !b)
            return -EIO;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, out, in, 1.0f, net.act[l], in, W,
                    in, 0.0f, y, out);
        for (int i = 0; i < B; i++)
            for (int o = 0; o < out; o++) {
                float v = y[(size_t)i * out + o] + b[o];
                y[(size_t)i * out + o] = l < net.L - 1 && v < 0 ? 0 : v;
            }
        rc = ddp_unit_release(m, l);
    }
    return rc;
}

/* The gradients of parameter p (2l: weight, 2l + 1: bias) of layer l from dz (B, out). */
static int grad(ddp_model *m, int l, int p, const float *dz)
{
    int B = net.B, in = net.width[l], out = net.width[l + 1];
    float *g = ddp_grad_buffer(m, p);
    if (!g)
        return -EIO;
    if (!net.B) { /* the constant stand-in */
        size_t n = ddp_param_count(m, p);
        for (size_t i = 0; i < n; i += 64)
            g[i] = 1e-3f;
    } else if (p % 2) {
        for (int i = 0; i < B; i++)
            for (int o = 0; o < out; o++)
                g[o] += dz[(size_t)i * out + o];
    } else { /* (out, in) += dz^T act[l] */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, B, 1.0f, dz, out, net.act[l],
                    in, 1.0f, g, in);
    }
    return ddp_grad_ready(m, p);
}

/*
 * One step: with --batch, forward, then backward from the output's own values (the gradient
 * of half their squared sum, over B); without, constant gradients. Then the reductions and
 * AdamW. *step_ms (may be NULL) receives what ddp_step() itself took.
 */
static int step(ddp_model *m, double *step_ms)
{
    int B = net.B, rc = ddp_micro_begin(m, 1), cur = 0;
    if (rc == 0 && B)
        rc = forward(m);
    if (rc == 0 && B)
        for (size_t i = 0; i < (size_t)B * 10; i++)
            net.da[0][i] = net.act[net.L][i] / (float)B;
    for (int l = net.L - 1; l >= 0 && rc == 0; l--) {
        int in = net.width[l], out = net.width[l + 1];
        float *dz = net.da[cur]; /* (B, out) */
        if ((rc = ddp_unit_gather(m, l)) < 0)
            break;
        if (B && l < net.L - 1)
            for (size_t i = 0; i < (size_t)B * out; i++)
                dz[i] = net.act[l + 1][i] > 0 ? dz[i] : 0; /* ReLU */
        for (int p = 2 * l + 1; p >= 2 * l && rc == 0; p--)
            rc = grad(m, l, p, dz);
        if (rc == 0 && B && l > 0) { /* (B, in) = dz W */
            const float *W = ddp_param_data(m, 2 * l);
            if (!W)
                return -EIO;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, in, out, 1.0f, dz, out, W, in,
                        0.0f, net.da[1 - cur], in);
            cur = 1 - cur;
        }
        if (rc == 0)
            rc = ddp_unit_release(m, l);
    }
    if (rc == 0)
        rc = ddp_micro_end(m);
    int64_t t0 = mono_now_ns();
    if (rc == 0)
        rc = ddp_step(m, 1e-4f, NULL);
    if (step_ms)
        *step_ms = ms_since(t0);
    return rc;
}

/* k steps; ddp_step()'s times to step_ms[k] when not NULL. */
static int steps(ddp_model *m, int k, double *step_ms)
{
    int rc = 0;
    for (int i = 0; i < k && rc == 0; i++)
        rc = step(m, step_ms ? &step_ms[i] : NULL);
    return rc;
}

static double mean(const double *x, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += x[i];
    return n > 0 ? s / n : 0;
}

static int check(ddp_model *m, int rc, const char *what)
{
    if (rc < 0)
        fprintf(stderr, "ckpt-bench: rank %d: %s: %s: %s\n", rank, what, ddp_strerror(rc),
                ddp_last_error(m));
    return rc;
}

int main(int argc, char **argv)
{
    int hidden = 256, layers = 2, stage = 0, reps = 3, batch = 0;
    const char *dir = NULL;
    cli_getopt_tables g;
    int built = cli_getopt_build(&g, opt_table, NOPTS);
    assert(built == 0);
    (void)built;
    opterr = 0;
    int c, rc = 0;
    char flag[32];
    while ((c = getopt_long(argc, argv, g.shorts, g.longopts, NULL)) != -1) {
        const cli_option *o = cli_by_id(opt_table, NOPTS, c);
        if (o)
            cli_label(o, flag, sizeof flag);
        switch (c) {
        case 'h':
            printf("usage: ddprun --nproc-per-node N ckpt-bench --dir DIR [OPTIONS]\n\n");
            cli_print_options(stdout, opt_table, NOPTS, 20, CLI_HELP_WIDTH);
            return 0;
        case OPT_HIDDEN:
            rc = cli_parse_int(flag, optarg, 1, 1 << 20, &hidden);
            break;
        case OPT_LAYERS:
            rc = cli_parse_int(flag, optarg, 1, 64, &layers);
            break;
        case OPT_STAGE:
            rc = cli_parse_int(flag, optarg, 0, 3, &stage);
            break;
        case OPT_REPS:
            rc = cli_parse_int(flag, optarg, 1, 100, &reps);
            break;
        case OPT_BATCH:
            rc = cli_parse_int(flag, optarg, 0, 1 << 16, &batch);
            break;
        case OPT_DIR:
            dir = optarg;
            break;
        default:
            fprintf(stderr, "ckpt-bench: bad option '%s' (see --help)\n", argv[optind - 1]);
            return 2;
        }
        if (cli_report(stderr, "ckpt-bench", rc) < 0)
            return 2;
    }
    if (!dir) {
        fprintf(stderr, "ckpt-bench: --dir is required\n");
        return 2;
    }

    coll_options co;
    coll_options_init(&co);
    co.timeout_ms = 600000;
    coll_env_options eo;
    coll_env_options_init(&eo);
    eo.name = "ckpt-bench";
    eo.comm = &co;
    coll_env job;
    if (coll_comm_init_env(&eo, &job) < 0) {
        /* The sentence says to run under ddprun, or names the variable, store or ranks. */
        fprintf(stderr, "ckpt-bench: setup: %s\n", coll_last_error(NULL));
        return 2;
    }
    rank = job.env.rank;
    coll_comm *comm = job.comm;

    ddp_options o;
    ddp_options_init(&o);
    o.zero_stage = stage;
    o.optimizer = DDP_ADAMW;
    o.log = log_fn;
    ddp_model *m = NULL;
    int L = layers + 1;
    if (net_init(batch, L, hidden) < 0) {
        fprintf(stderr, "ckpt-bench: out of memory\n");
        return 1;
    }
    if (check(NULL, ddp_model_create(comm, &o, &m), "create") < 0)
        return 1;
    size_t params = 0;
    for (int l = 0; l < L; l++) {
        int64_t in = l == 0 ? 784 : hidden, out = l == L - 1 ? 10 : hidden;
        char name[32];
        snprintf(name, sizeof name, "fc%d", l + 1);
        int u = ddp_unit_add(m, name);
        ddp_param_add(m, u, "weight", 2, (int64_t[]){out, in}, COLL_F32);
        ddp_param_add(m, u, "bias", 1, (int64_t[]){out}, COLL_F32);
        params += (size_t)(out * in + out);
    }
    if (check(m, ddp_model_commit(m, fill, NULL), "commit") < 0 ||
        check(m, steps(m, 2, NULL), "warm-up") < 0)
        return 1;
    double mb = 3.0 * (double)params * sizeof(float) / 1e6; /* every shard file, all ranks */

    /* Synchronous saves, then loads of the last one. */
    double sync_ms = 1e300, load_ms = 1e300;
    char path[4096];
    for (int r = 0; r < reps; r++) {
        coll_barrier(comm);
        int64_t t0 = mono_now_ns();
        if (check(m, ddp_checkpoint_save(m, dir, NULL, NULL, 1, DDP_CKPT_SYNC), "sync save") < 0)
            return 1;
        coll_barrier(comm);
        double t = ms_since(t0);
        sync_ms = t < sync_ms ? t : sync_ms;
    }
    if (ddp_checkpoint_latest(dir, path, sizeof path, NULL, NULL) != 1) {
        fprintf(stderr, "ckpt-bench: no complete checkpoint under %s\n", dir);
        return 1;
    }
    for (int r = 0; r < reps; r++) {
        coll_barrier(comm);
        int64_t t0 = mono_now_ns();
        if (check(m, ddp_checkpoint_load(m, path, 0, NULL, NULL), "load") < 0)
            return 1;
        coll_barrier(comm);
        double t = ms_since(t0);
        load_ms = t < load_ms ? t : load_ms;
    }

    /* The loop's cost of an asynchronous save: K steps with one against K steps without. K
     * covers four synchronous saves' time, so that the writer normally finishes inside the
     * window even when it shares the CPU with the ranks. */
    coll_barrier(comm);
    int64_t t0 = mono_now_ns();
    if (check(m, steps(m, 3, NULL), "steps") < 0)
        return 1;
    double step_ms = ms_since(t0) / 3;
    double kd = 4 * sync_ms / step_ms + 3;
    coll_allreduce(comm, &kd, &kd, 1, COLL_F64, COLL_MAX);
    int k = kd > 10000 ? 10000 : (int)kd;
    double *plain_step = malloc((size_t)k * sizeof(double));
    double *async_step = malloc((size_t)k * sizeof(double));
    if (!plain_step || !async_step) {
        fprintf(stderr, "ckpt-bench: out of memory\n");
        return 1;
    }
    coll_barrier(comm);
    t0 = mono_now_ns();
    if (check(m, steps(m, k, plain_step), "steps") < 0)
        return 1;
    coll_barrier(comm);
    double plain_ms = ms_since(t0);
    waited_ms = 0;
    t0 = mono_now_ns();
    if (check(m, ddp_checkpoint_save(m, dir, NULL, NULL, 1, 0), "async save") < 0)
        return 1;
    double call_ms = ms_since(t0);
    if (check(m, steps(m, k, async_step), "steps") < 0)
        return 1;
    int64_t tw = mono_now_ns();
    if (check(m, ddp_checkpoint_wait(m), "wait") < 0)
        return 1;
    double wait_ms = ms_since(tw);
    coll_barrier(comm);
    double async_ms = ms_since(t0);
    double loop_diff_ms = async_ms - plain_ms;
    double stall_ms = loop_diff_ms;
    if (stall_ms < call_ms + wait_ms)
        stall_ms = call_ms + wait_ms; /* never report less than the calls themselves took */
    double plain_step_ms = mean(plain_step, k);
    double first_extra_ms = async_step[0] - plain_step_ms;
    double poll_ms = k > 1 ? mean(async_step + 1, k - 1) - plain_step_ms : 0;
    double copy_wait_ms = waited_ms;
    coll_allreduce(comm, &copy_wait_ms, &copy_wait_ms, 1, COLL_F64, COLL_MAX);
    double blocked_ms = call_ms + copy_wait_ms + wait_ms;
    free(plain_step);
    free(async_step);

    if (rank == 0) {
        json_t *j =
            json_pack("{s:i, s:i, s:i, s:i, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:i, "
                      "s:f, s:f, s:f}",
                      "world", job.env.world_size, "stage", stage, "hidden", hidden, "layers",
                      layers, "params", (json_int_t)params, "mb", mb, "sync_ms", sync_ms,
                      "sync_mbps", mb / (sync_ms / 1e3), "load_ms", load_ms, "load_mbps",
                      mb / (load_ms / 1e3), "step_ms", step_ms, "plain_ms", plain_ms, "steps", k,
                      "async_call_ms", call_ms, "async_wait_ms", wait_ms, "stall_ms", stall_ms);
        json_object_set_new(j, "stall_pct_of_sync", json_real(100 * stall_ms / sync_ms));
        json_object_set_new(j, "batch", json_integer(batch));
        json_object_set_new(j, "plain_step_call_ms", json_real(plain_step_ms));
        json_object_set_new(j, "copy_wait_ms", json_real(copy_wait_ms));
        json_object_set_new(j, "first_step_extra_ms", json_real(first_extra_ms));
        json_object_set_new(j, "poll_ms", json_real(poll_ms));
        json_object_set_new(j, "loop_diff_ms", json_real(loop_diff_ms));
        json_object_set_new(j, "blocked_ms", json_real(blocked_ms));
        json_object_set_new(j, "blocked_pct_of_sync", json_real(100 * blocked_ms / sync_ms));
        char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
        if (s)
            printf("%s\n", s);
        free(s);
        json_decref(j);
    }
    ddp_model_free(m);
    coll_env_free(&job);
    return 0;
}
