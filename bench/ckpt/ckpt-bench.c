/*
 * ckpt-bench: libddp's checkpoint save and load, timed under ddprun (bench/ckpt/compare.sh runs
 * it next to dd and torch.save / torch.distributed.checkpoint; see README.md there).
 *
 * The model has ddp-train's shape (784 inputs, --layers hidden layers of --hidden, 10 outputs;
 * a weight and a bias per layer) with AdamW, so a checkpoint holds three arrays of the
 * parameters' size: what ddp-train saves. Training steps are stand-ins (constant gradients, the
 * real reductions and optimizer), enough to give the optimizer state values and to measure what
 * an asynchronous save costs the loop.
 *
 * One run measures, on every rank together (times are rank 0's, after a barrier):
 *   sync    ddp_checkpoint_save(DDP_CKPT_SYNC): the best of --reps, and MB/s of the bytes of
 *           every shard file
 *   load    ddp_checkpoint_load() of that checkpoint (the page cache may hold it: compare.sh
 *           drops the caches first when it can)
 *   async   K steps with an asynchronous save issued before the first, against K steps
 *           without one (K chosen so that the save finishes in the window): the stall is the
 *           difference plus what ddp_checkpoint_save() and the final ddp_checkpoint_wait()
 *           took, in ms and as a share of the synchronous save
 * and prints one JSON line on rank 0 (jansson), which compare.sh collects.
 */
#include "cli.h"
#include "coll.h"
#include "ddp.h"
#include "monoclock.h"
#include "rdzv.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { OPT_HIDDEN = 256, OPT_LAYERS, OPT_STAGE, OPT_DIR, OPT_REPS };

static const cli_option opt_table[] = {
    {OPT_HIDDEN, {"--hidden"}, "H", "256", 0, "Width of each hidden layer."},
    {OPT_LAYERS, {"--layers"}, "N", "2", 0, "Number of hidden layers."},
    {OPT_STAGE, {"--zero"}, "S", "0", 0, "ZeRO stage of the saving model."},
    {OPT_DIR, {"--dir"}, "DIR", NULL, 0, "Checkpoint root (required); emptied by compare.sh."},
    {OPT_REPS, {"--reps"}, "N", "3", 0, "Synchronous saves and loads timed; the best is kept."},
    {'h', {"-h", "--help"}, NULL, NULL, 0, "Show this help and exit."},
};
#define NOPTS (sizeof opt_table / sizeof opt_table[0])

static int rank;

static double ms_since(int64_t t0)
{
    return (double)(rdzv__now_ns() - t0) / 1e6;
}

static int fill(void *arg, int param, const char *name, void *data, size_t count)
{
    (void)arg, (void)name;
    float *x = data;
    for (size_t i = 0; i < count; i++)
        x[i] = (float)((i * 2654435761u + (size_t)param) % 1000) * 1e-5f;
    return 0;
}

/* One stand-in step: a constant gradient for every parameter, the reductions, AdamW. */
static int step(ddp_model *m, int L)
{
    int rc = ddp_micro_begin(m, 1);
    for (int l = L - 1; l >= 0 && rc == 0; l--) {
        if ((rc = ddp_unit_gather(m, l)) < 0)
            break;
        for (int p = 2 * l + 1; p >= 2 * l && rc == 0; p--) {
            float *g = ddp_grad_buffer(m, p);
            if (!g)
                return -EIO;
            size_t n = ddp_param_count(m, p);
            for (size_t i = 0; i < n; i += 64)
                g[i] = 1e-3f;
            rc = ddp_grad_ready(m, p);
        }
        if (rc == 0)
            rc = ddp_unit_release(m, l);
    }
    if (rc == 0)
        rc = ddp_micro_end(m);
    return rc == 0 ? ddp_step(m, 1e-4f, NULL) : rc;
}

static int steps(ddp_model *m, int L, int k)
{
    int rc = 0;
    for (int i = 0; i < k && rc == 0; i++)
        rc = step(m, L);
    return rc;
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
    int hidden = 256, layers = 2, stage = 0, reps = 3;
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

    rdzv_env env;
    rdzv_client *store = NULL;
    coll_comm *comm = NULL;
    char prefix[256];
    if (rdzv_env_read(&env) < 0 || env.standalone) {
        fprintf(stderr, "ckpt-bench: run it under ddprun: %s\n", rdzv_client_last_error(NULL));
        return 2;
    }
    rank = env.rank;
    rdzv_env_prefix(&env, "ckpt-bench", prefix, sizeof prefix);
    coll_options co;
    coll_options_init(&co);
    co.timeout_ms = 600000;
    if (rdzv_env_connect(&env, NULL, &store) < 0 ||
        coll_comm_init(store, prefix, rank, env.world_size, COLL_BACKEND_CPU, -1, &co, &comm) < 0) {
        fprintf(stderr, "ckpt-bench: rank %d: setup: %s %s\n", rank, rdzv_client_last_error(NULL),
                coll_last_error(NULL));
        return 2;
    }
    rdzv_client_close(store);

    ddp_options o;
    ddp_options_init(&o);
    o.zero_stage = stage;
    o.optimizer = DDP_ADAMW;
    ddp_model *m = NULL;
    int L = layers + 1;
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
    if (check(m, ddp_model_commit(m, fill, NULL), "commit") < 0 || check(m, steps(m, L, 2), "warm-up") < 0)
        return 1;
    double mb = 3.0 * (double)params * sizeof(float) / 1e6; /* every shard file, all ranks */

    /* Synchronous saves, then loads of the last one. */
    double sync_ms = 1e300, load_ms = 1e300;
    char path[4096];
    for (int r = 0; r < reps; r++) {
        coll_barrier(comm);
        int64_t t0 = rdzv__now_ns();
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
        int64_t t0 = rdzv__now_ns();
        if (check(m, ddp_checkpoint_load(m, path, 0, NULL, NULL), "load") < 0)
            return 1;
        coll_barrier(comm);
        double t = ms_since(t0);
        load_ms = t < load_ms ? t : load_ms;
    }

    /* The loop's cost of an asynchronous save: K steps with one against K steps without. */
    coll_barrier(comm);
    int64_t t0 = rdzv__now_ns();
    if (check(m, steps(m, L, 3), "steps") < 0)
        return 1;
    double step_ms = ms_since(t0) / 3;
    double kd = 2 * sync_ms / step_ms + 3;
    coll_allreduce(comm, &kd, &kd, 1, COLL_F64, COLL_MAX);
    int k = kd > 10000 ? 10000 : (int)kd;
    coll_barrier(comm);
    t0 = rdzv__now_ns();
    if (check(m, steps(m, L, k), "steps") < 0)
        return 1;
    coll_barrier(comm);
    double plain_ms = ms_since(t0);
    t0 = rdzv__now_ns();
    if (check(m, ddp_checkpoint_save(m, dir, NULL, NULL, 1, 0), "async save") < 0)
        return 1;
    double call_ms = ms_since(t0);
    if (check(m, steps(m, L, k), "steps") < 0)
        return 1;
    int64_t tw = rdzv__now_ns();
    if (check(m, ddp_checkpoint_wait(m), "wait") < 0)
        return 1;
    double wait_ms = ms_since(tw);
    coll_barrier(comm);
    double async_ms = ms_since(t0);
    double stall_ms = async_ms - plain_ms;
    if (stall_ms < call_ms + wait_ms)
        stall_ms = call_ms + wait_ms; /* never report less than the calls themselves took */

    if (rank == 0) {
        json_t *j = json_pack("{s:i, s:i, s:i, s:i, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:i, "
                              "s:f, s:f, s:f}",
                              "world", env.world_size, "stage", stage, "hidden", hidden,
                              "layers", layers, "params", (json_int_t)params, "mb", mb,
                              "sync_ms", sync_ms, "sync_mbps", mb / (sync_ms / 1e3),
                              "load_ms", load_ms, "load_mbps", mb / (load_ms / 1e3),
                              "step_ms", step_ms, "plain_ms", plain_ms, "steps", k,
                              "async_call_ms", call_ms, "async_wait_ms", wait_ms,
                              "stall_ms", stall_ms);
        json_object_set_new(j, "stall_pct_of_sync", json_real(100 * stall_ms / sync_ms));
        char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
        if (s)
            printf("%s\n", s);
        free(s);
        json_decref(j);
    }
    ddp_model_free(m);
    coll_comm_destroy(comm);
    return 0;
}
