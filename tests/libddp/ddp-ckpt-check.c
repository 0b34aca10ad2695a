/*
 * ddp-ckpt-check: libddp's checkpoints and the full state with a real communicator, run under
 * ddprun (see tests/libddp/run_ckpt.sh and run_params.sh). One scenario per run, every file
 * under DIR:
 *
 *   resume DIR     every stage, every optimizer (SGD with momentum, AdamW, Lion): 2K steps in one
 * go against K steps, a save, a new model that loads it, K more steps: the two final checkpoints'
 *                  shard files (parameters and optimizer state) are identical byte for byte;
 *                  progress and the user state come back
 *   save DIR       every stage (AdamW, or the optimizer $CKPT_CHECK_OPTIMIZER names, as for
 *                  every scenario below): 3 steps, then DIR/wNsS (the checkpoint) and
 *                  DIR/wNsS.params (rank 0's dump of the full parameters)
 *   load DIR N...  every checkpoint DIR/wNsS of the worlds N listed into every stage T: the
 *                  parameters right after the load to DIR/wNsS-wMtT.params, then a save to
 *                  DIR/wNsS-wMtT (run_ckpt.sh compares the dumps and consolidates the optimizer
 *                  state of both checkpoints)
 *   async DIR      a save followed at once by a step (the writer thread copies the state while
 *                  the step runs) holds exactly the saved step's state: its shard files equal
 *                  those of a synchronous save of a twin model at that step, and a fresh model
 *                  that loads it has the parameters dumped at the save; a save returns before
 *                  its manifest exists, steps run while the writer writes, the step's poll
 *                  completes it; a second save completes in ddp_checkpoint_wait(); `keep`
 *                  removes the oldest
 *   fail DIR       a save whose write fails on the last rank (RLIMIT_FSIZE: EFBIG): save
 *                  returns 0, the failure comes on every rank alike, from ddp_checkpoint_wait()
 *                  (again at a second call) naming the step, the rank and the cause, the model
 *                  stays usable, the torn step directory is gone, the previous complete one
 *                  stays (keep 1) and loads; a failure noticed by a step's poll does not stop
 *                  the next save, which succeeds and then takes keep's place; a root that
 *                  cannot be made fails that save alike (ENOTDIR), nothing else
 *   bad DIR        a torn checkpoint (no manifest) and a malformed manifest skipped by
 *                  ddp_checkpoint_latest() with a log line naming each; a flipped byte
 *                  (-EBADMSG), a truncated shard (-EPROTO), a missing one (-ENOENT), another
 *                  model (-EINVAL naming the parameter), another optimizer, different
 *                  checkpoints on different ranks: the same code on every rank, each message
 *                  naming the file; then a good load still works; a load given the save's
 *                  flag (DDP_CKPT_SYNC) and a save given the load's (DDP_CKPT_PARAMS_ONLY)
 *                  are refused with -EINVAL
 *   params DIR     ddp_model_get_params() at every stage (and stage 2 at bf16), AdamW, after 3
 *                  steps: to every rank and to each root, with and without the optimizer state,
 *                  the same copy on every rank, equal to the units' parameters (at bf16: the
 *                  compute copy is it rounded) and, stages 1-3, to stage 0's; bad arguments on one
 *                  rank and ranks that disagree refused on every rank alike; then a step, a
 *                  save to DIR/NAME and rank 0's copy in DIR/NAME.state (run_params.sh exports
 *                  the checkpoint with ddp-ckpt and compares)
 *   grads DIR      the gradients' semantics of libddp(3), SEMANTICS, at every stage: averaged
 *                  over ranks, summed over micro-steps, a second ddp_grad_buffer() the same
 *                  buffer keeping the sum, a micro-step after a synchronising one refused, the
 *                  caller's own collectives between the model's calls (DIR unused)
 *
 * Prints "ddp-ckpt-check: rank R/W SCENARIO: PASS" or FAIL lines; exit status 0 when every check
 * passed, 1 when one failed, 2 on a setup error.
 */
#include "bf16conv.h"
#include "ddp.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static int rank, world, failures;
/* The optimizer of the scenarios but resume (which runs every one): $CKPT_CHECK_OPTIMIZER, or
 * AdamW. */
static ddp_optimizer reshard_opt = DDP_ADAMW;
static coll_comm *comm;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            printf("ddp-ckpt-check: rank %d/%d: FAIL %s:%d: ", rank, world, __FILE__, __LINE__);   \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

/* Layers of rows[l] x cols weights and rows[l] biases: sizes that pad unevenly. */
typedef struct shape {
    int nlayers;
    int64_t rows[4], cols;
} shape;

static const shape small = {4, {37, 19, 64, 5}, 7};

static int init_fn(void *arg, int param, const char *name, void *data, size_t count)
{
    (void)arg, (void)name;
    float *x = data;
    for (size_t i = 0; i < count; i++)
        x[i] = (float)((i * 2654435761u + (size_t)param * 97) % 2000) * 1e-3f - 1.0f;
    return 0;
}

/* The precision build() gives its models (the params scenario changes it). */
static ddp_precision build_precision = DDP_PREC_F32;
static ddp_model *build_with(const ddp_options *o, const shape *sh, int init);

static ddp_model *build(int stage, ddp_optimizer opt, const shape *sh, int init)
{
    ddp_options o;
    ddp_options_init(&o);
    o.zero_stage = stage;
    o.precision = build_precision;
    o.first_bucket_bytes = 256;
    o.bucket_bytes = 1024; /* several buckets at stages 0-2 */
    if (ddp_options_set_optimizer(&o, opt) < 0)
        return NULL;
    o.momentum = opt == DDP_SGD ? 0.9f : 0;
    o.weight_decay = 0.01f;
    return build_with(&o, sh, init);
}

/* A model of these options and shape, committed (initial values from init_fn, or zeros). */
static ddp_model *build_with(const ddp_options *o, const shape *sh, int init)
{
    ddp_model *m = NULL;
    if (ddp_model_create(comm, o, &m) < 0)
        return NULL;
    for (int l = 0; l < sh->nlayers; l++) {
        char name[16];
        snprintf(name, sizeof name, "fc%d", l);
        int u = ddp_unit_add(m, name);
        ddp_param_add(m, u, "weight", 2, (int64_t[]){sh->rows[l], sh->cols}, COLL_F32);
        ddp_param_add(m, u, "bias", 1, (int64_t[]){sh->rows[l]}, COLL_F32);
    }
    if (ddp_model_commit(m, init ? init_fn : NULL, NULL) < 0) {
        printf("ddp-ckpt-check: rank %d: commit: %s\n", rank, ddp_last_error(m));
        ddp_model_free(m);
        return NULL;
    }
    return m;
}

/*
 * `steps` steps, numbered from t0; each rank's gradient is a function of the parameter, the
 * step's number and the rank, so two runs of the same configuration compute the same values.
 */
static int train_from(ddp_model *m, int t0, int steps, int64_t *stepno)
{
    int rc = 0;
    for (int t = 0; rc == 0 && t < steps; t++) {
        ddp_step_info info;
        rc = ddp_micro_begin(m, 1);
        for (int u = ddp_num_units(m) - 1; rc == 0 && u >= 0; u--) {
            rc = ddp_unit_gather(m, u);
            for (int p = 2 * u + 1; rc == 0 && p >= 2 * u; p--) {
                const float *x = ddp_param_data(m, p);
                float *g = ddp_grad_buffer(m, p);
                if (!x || !g) {
                    rc = -EINVAL;
                    break;
                }
                for (size_t i = 0; i < ddp_param_count(m, p); i++)
                    g[i] = sinf(0.7f * x[i] + 0.1f * (float)(t0 + t) + 0.3f * (float)rank +
                                1e-3f * (float)i);
                rc = ddp_grad_ready(m, p);
            }
            if (rc == 0)
                rc = ddp_unit_release(m, u);
        }
        if (rc == 0)
            rc = ddp_micro_end(m);
        if (rc == 0)
            rc = ddp_step(m, 0.01f, &info);
        if (rc == 0 && stepno)
            *stepno = info.step;
    }
    if (rc < 0)
        printf("ddp-ckpt-check: rank %d: training: %s\n", rank, ddp_last_error(m));
    return rc;
}

static int train(ddp_model *m, int steps, int64_t *stepno)
{
    return train_from(m, 0, steps, stepno);
}

/* Rank 0 writes every parameter, in order, to `path` (every rank gathers at stage 3). */
static int dump_params(ddp_model *m, const char *path)
{
    FILE *f = rank == 0 ? fopen(path, "wb") : NULL;
    int rc = rank == 0 && !f ? -errno : 0;
    for (int u = 0; u < ddp_num_units(m); u++) {
        int g = ddp_unit_gather(m, u);
        for (int p = 2 * u; g == 0 && p <= 2 * u + 1; p++) {
            const float *x = ddp_param_data(m, p);
            if (f &&
                (!x || fwrite(x, sizeof *x, ddp_param_count(m, p), f) != ddp_param_count(m, p)))
                rc = -EIO;
        }
        if (g == 0)
            g = ddp_unit_release(m, u);
        if (g < 0)
            rc = g;
    }
    if (f && fclose(f) != 0)
        rc = -EIO;
    CHECK(rc == 0, "dumping the parameters to %s: %s", path, ddp_strerror(rc));
    return rc;
}

static int same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    while (same) {
        int ca = getc(fa), cb = getc(fb);
        same = ca == cb;
        if (ca == EOF)
            break;
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return same;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* ------------------------------------------------------------------------------------------ */

static void scen_resume(const char *dir)
{
    const int K = 3;
    for (int stage = 0; stage < 4; stage++) {
        for (int k = 0; ddp_optimizer_name((ddp_optimizer)k); k++) {
            char a[512], b[512], c[512], sa[640], sc[640];
            ddp_optimizer id = (ddp_optimizer)k;
            const char *opt = ddp_optimizer_name(id);
            snprintf(a, sizeof a, "%s/s%d-%s-straight", dir, stage, opt);
            snprintf(b, sizeof b, "%s/s%d-%s-half", dir, stage, opt);
            snprintf(c, sizeof c, "%s/s%d-%s-resumed", dir, stage, opt);
            ddp_model *m = build(stage, id, &small, 1);
            CHECK(m && train(m, 2 * K, NULL) == 0, "stage %d %s: straight", stage, opt);
            int rc = m ? ddp_checkpoint_save(m, a, NULL, NULL, 0, DDP_CKPT_SYNC) : -1;
            CHECK(rc == 0, "save %s: %s", a, m ? ddp_last_error(m) : "");
            ddp_model_free(m);

            m = build(stage, id, &small, 1);
            CHECK(m && train(m, K, NULL) == 0, "stage %d %s: first half", stage, opt);
            ddp_checkpoint_progress pr = {1, 17, 42};
            rc = m ? ddp_checkpoint_save(m, b, &pr, "{\"lr\": 0.5, \"name\": \"x\"}", 0,
                                         DDP_CKPT_SYNC)
                   : -1;
            CHECK(rc == 0, "save %s: %s", b, m ? ddp_last_error(m) : "");
            ddp_model_free(m);

            m = build(stage, id, &small, 0); /* zeros: everything comes from the load */
            char path[600];
            CHECK(ddp_checkpoint_latest(b, path, sizeof path, NULL, NULL) == 1, "latest %s", b);
            ddp_checkpoint_progress got = {0};
            char *user = NULL;
            rc = m ? ddp_checkpoint_load(m, path, 0, &got, &user) : -1;
            CHECK(rc == 0, "load %s: %s", path, m ? ddp_last_error(m) : "");
            CHECK(got.epoch == 1 && got.position == 17 && got.seed == 42,
                  "progress %" PRId64 " %" PRId64 " %" PRIu64, got.epoch, got.position, got.seed);
            CHECK(user && strstr(user, "\"lr\"") && strstr(user, "\"x\""), "user state %s",
                  user ? user : "NULL");
            ddp_free(user);
            int64_t step = -1;
            CHECK(rc == 0 && train_from(m, K, K, &step) == 0 && step == 2 * K,
                  "stage %d %s: second half ends at step %" PRId64, stage, opt, step);
            rc = m ? ddp_checkpoint_save(m, c, NULL, NULL, 0, DDP_CKPT_SYNC) : -1;
            CHECK(rc == 0, "save %s: %s", c, m ? ddp_last_error(m) : "");
            ddp_model_free(m);

            snprintf(sa, sizeof sa, "%s/step-%012d/shard-%05d-of-%05d.bin", a, 2 * K, rank, world);
            snprintf(sc, sizeof sc, "%s/step-%012d/shard-%05d-of-%05d.bin", c, 2 * K, rank, world);
            int same = same_file(sa, sc);
            CHECK(same, "stage %d %s: %s and %s differ", stage, opt, sa, sc);
            if (rank == 0 && same)
                printf("ddp-ckpt-check: resume world %d stage %d %-5s: %d steps straight and "
                       "%d + load + %d: parameters and optimizer state identical\n",
                       world, stage, opt, 2 * K, K, K);
        }
    }
}

static void scen_save(const char *dir)
{
    for (int stage = 0; stage < 4; stage++) {
        char ck[512], dump[600];
        snprintf(ck, sizeof ck, "%s/w%ds%d", dir, world, stage);
        snprintf(dump, sizeof dump, "%s.params", ck);
        ddp_model *m = build(stage, reshard_opt, &small, 1);
        CHECK(m && train(m, 3, NULL) == 0, "stage %d: training", stage);
        int rc = m ? ddp_checkpoint_save(m, ck, NULL, NULL, 0, DDP_CKPT_SYNC) : -1;
        CHECK(rc == 0, "save %s: %s", ck, m ? ddp_last_error(m) : "");
        if (m)
            dump_params(m, dump);
        ddp_model_free(m);
    }
}

static void scen_load(const char *dir, int argc, char **argv)
{
    int loads = 0;
    for (int a = 0; a < argc; a++) {
        int n = atoi(argv[a]);
        for (int s = 0; s < 4; s++) {
            for (int t = 0; t < 4; t++) {
                char path[512], out[600], dump[700];
                snprintf(path, sizeof path, "%s/w%ds%d/step-%012d", dir, n, s, 3);
                snprintf(out, sizeof out, "%s/w%ds%d-w%dt%d", dir, n, s, world, t);
                snprintf(dump, sizeof dump, "%s.params", out);
                ddp_model *m = build(t, reshard_opt, &small, 0);
                int rc = m ? ddp_checkpoint_load(m, path, 0, NULL, NULL) : -1;
                CHECK(rc == 0, "load %s at stage %d: %s", path, t, m ? ddp_last_error(m) : "");
                if (rc == 0 && dump_params(m, dump) == 0) {
                    rc = ddp_checkpoint_save(m, out, NULL, NULL, 0, DDP_CKPT_SYNC);
                    CHECK(rc == 0, "save %s: %s", out, ddp_last_error(m));
                    loads += rc == 0;
                }
                ddp_model_free(m);
            }
        }
    }
    if (rank == 0)
        printf("ddp-ckpt-check: load world %d: %d checkpoints loaded and saved again\n", world,
               loads);
}

/* Collects the log hook's lines for ddp_checkpoint_latest(). */
static char logged[4096];
static void log_fn(void *arg, int level, const char *msg)
{
    (void)arg;
    size_t n = strlen(logged);
    snprintf(logged + n, sizeof logged - n, "%d %s\n", level, msg);
}

/*
 * The rest of a step whose micro-step (sync true) has begun: zero gradients (the buffers as
 * handed out), no compute, then the step. AdamW's weight decay and moment decay still change
 * every state array.
 */
static int finish_step(ddp_model *m)
{
    int rc = 0;
    for (int u = ddp_num_units(m) - 1; rc == 0 && u >= 0; u--) {
        rc = ddp_unit_gather(m, u);
        for (int p = 2 * u + 1; rc == 0 && p >= 2 * u; p--) {
            if (!ddp_grad_buffer(m, p))
                return -EINVAL;
            rc = ddp_grad_ready(m, p);
        }
        if (rc == 0)
            rc = ddp_unit_release(m, u);
    }
    if (rc == 0)
        rc = ddp_micro_end(m);
    return rc == 0 ? ddp_step(m, 0.1f, NULL) : rc;
}

/* A step whose optimizer comes as soon as possible (finish_step()). */
static int step_now(ddp_model *m)
{
    int rc = ddp_micro_begin(m, 1);
    return rc == 0 ? finish_step(m) : rc;
}

/*
 * The writer thread copies the state after the save returned: a step right away must not
 * change what the checkpoint holds. Twin models (the same training) at step 1: one saves
 * asynchronously into DIR/now and steps at once (its first save: a snapshot still to be paged
 * in, the slowest copy), the other saves synchronously into DIR/ref. The shard files must be
 * equal byte for byte, and a fresh model loading DIR/now must have the parameters dumped at
 * the save.
 */
static void async_then_step(const char *dir, const shape *sh)
{
    char now[512], ref[512], at_save[600], loaded[600], a[700], b[700];
    snprintf(now, sizeof now, "%s/now", dir);
    snprintf(ref, sizeof ref, "%s/ref", dir);
    snprintf(at_save, sizeof at_save, "%s/at-save.params", dir);
    snprintf(loaded, sizeof loaded, "%s/loaded.params", dir);
    ddp_model *m = build(2, reshard_opt, sh, 1), *twin = build(2, reshard_opt, sh, 1);
    ddp_model *fresh = build(2, reshard_opt, sh, 0);
    int rc = m && twin && fresh ? 0 : -1;
    CHECK(rc == 0, "build");
    if (rc == 0)
        rc = train(m, 1, NULL) || train(twin, 1, NULL) || dump_params(m, at_save) ? -1 : 0;
    CHECK(rc == 0 || !m || !twin || !fresh, "training the twins to step 1");
    if (rc == 0) {
        rc = ddp_checkpoint_save(m, now, NULL, NULL, 0, 0);
        CHECK(rc == 0, "save %s: %s", now, ddp_last_error(m));
    }
    if (rc == 0) {
        rc = step_now(m);
        CHECK(rc == 0, "the step right after the save: %s", ddp_last_error(m));
    }
    if (rc == 0) {
        rc = ddp_checkpoint_wait(m);
        CHECK(rc == 0, "wait: %s", ddp_last_error(m));
    }
    if (rc == 0) {
        rc = ddp_checkpoint_save(twin, ref, NULL, NULL, 0, DDP_CKPT_SYNC);
        CHECK(rc == 0, "save %s: %s", ref, ddp_last_error(twin));
    }
    if (rc == 0) {
        snprintf(a, sizeof a, "%s/step-%012d/shard-%05d-of-%05d.bin", now, 1, rank, world);
        snprintf(b, sizeof b, "%s/step-%012d/shard-%05d-of-%05d.bin", ref, 1, rank, world);
        CHECK(same_file(a, b), "%s differs from %s: the step after the save changed it", a, b);
        snprintf(a, sizeof a, "%s/step-%012d", now, 1);
        rc = ddp_checkpoint_load(fresh, a, 0, NULL, NULL);
        CHECK(rc == 0, "load %s: %s", a, ddp_last_error(fresh));
    }
    if (rc == 0 && dump_params(fresh, loaded) == 0 && rank == 0) {
        CHECK(same_file(at_save, loaded), "%s differs from %s", loaded, at_save);
        printf("ddp-ckpt-check: async: a save followed at once by a step holds the saved step's "
               "state (shard files equal to a synchronous save's, parameters loaded equal)\n");
    }
    ddp_model_free(m);
    ddp_model_free(twin);
    ddp_model_free(fresh);
}

static void scen_async(const char *dir)
{
    /* 4 x 1024 x 1024 weights, AdamW: 48 MiB of state, half per rank at world 2. */
    shape big = {4, {1024, 1024, 1024, 1024}, 1024};
    async_then_step(dir, &big);
    ddp_model *m = build(2, reshard_opt, &big, 1);
    CHECK(m != NULL, "build");
    if (!m)
        return;
    char man[600];
    int rc = train(m, 1, NULL);
    CHECK(rc == 0 && ddp_checkpoint_save(m, dir, NULL, NULL, 2, 0) == 0, "save: %s",
          ddp_last_error(m));
    snprintf(man, sizeof man, "%s/step-%012d/manifest.json", dir, 1);
    CHECK(!exists(man), "%s exists as the save returns", man);
    int steps = 0;
    while (rc == 0 && !exists(man) && steps < 2000) {
        rc = train(m, 1, NULL);
        steps++;
    }
    CHECK(rc == 0 && exists(man), "no manifest after %d steps", steps);
    if (rank == 0)
        printf("ddp-ckpt-check: async: the save returned, %d training steps ran until the "
               "step's poll completed it\n",
               steps);
    /* Two more saves with keep 2: the first one goes. */
    for (int k = 0; k < 2 && rc == 0; k++) {
        int64_t step = 0;
        rc = train(m, 1, &step);
        CHECK(rc == 0 && ddp_checkpoint_save(m, dir, NULL, NULL, 2, 0) == 0, "save: %s",
              ddp_last_error(m));
        snprintf(man, sizeof man, "%s/step-%012" PRId64 "/manifest.json", dir, step);
        CHECK(!exists(man), "%s exists as the save returns", man);
        rc = ddp_checkpoint_wait(m);
        CHECK(rc == 0 && exists(man), "wait: %d (%s); %s %s", rc, ddp_last_error(m), man,
              exists(man) ? "exists" : "missing");
    }
    snprintf(man, sizeof man, "%s/step-%012d", dir, 1);
    CHECK(!exists(man), "keep 2: %s is still there", man);
    ddp_model_free(m);
}

/* The last rank's file size limit: `nbytes`, or back to `old`. */
static void limit_files(const struct rlimit *old, rlim_t nbytes)
{
    if (rank != world - 1)
        return;
    struct rlimit r = *old;
    if (nbytes != RLIM_INFINITY)
        r.rlim_cur = nbytes;
    CHECK(setrlimit(RLIMIT_FSIZE, &r) == 0, "setrlimit: %s", strerror(errno));
}

/* ddp_checkpoint_wait() must return `want` on this rank, its message naming every piece. */
static void expect_wait(ddp_model *m, int want, const char *a, const char *b, const char *c)
{
    int rc = ddp_checkpoint_wait(m);
    const char *err = ddp_last_error(m);
    CHECK(rc == want && (!want || (strstr(err, a) && strstr(err, b) && strstr(err, c))),
          "wait: %d (%s), want %d naming \"%s\", \"%s\", \"%s\"", rc, rc ? err : "", want, a, b, c);
    CHECK(ddp_model_broken(m) == 0, "the model is broken after a failed save: %s", err);
}

static void scen_fail(const char *dir)
{
    char root[512], step[700], cause[64], other[640];
    snprintf(root, sizeof root, "%s/ck", dir);
    snprintf(cause, sizeof cause, "rank %d: writing ", world - 1);
    signal(SIGXFSZ, SIG_IGN); /* a write beyond the limit fails with EFBIG instead */
    struct rlimit old;
    getrlimit(RLIMIT_FSIZE, &old);
    ddp_model *m = build(1, reshard_opt, &small, 1);
    CHECK(m && train(m, 1, NULL) == 0, "training");
    if (!m)
        return;
    CHECK(ddp_checkpoint_save(m, root, NULL, NULL, 1, DDP_CKPT_SYNC) == 0, "save: %s",
          ddp_last_error(m));

    /* Step 2: the last rank's shard cannot be written. */
    CHECK(train(m, 1, NULL) == 0, "training");
    limit_files(&old, 100);
    int rc = ddp_checkpoint_save(m, root, NULL, NULL, 1, 0);
    CHECK(rc == 0, "a save that will fail returned %d: %s", rc, ddp_last_error(m));
    expect_wait(m, -EFBIG, "checkpoint of step 2 failed", cause, "File too large");
    expect_wait(m, -EFBIG, "checkpoint of step 2 failed", cause, "File too large");
    coll_barrier(comm); /* rank 0 removes the other ranks' shards and the directory */
    snprintf(step, sizeof step, "%s/step-%012d", root, 2);
    CHECK(!exists(step), "the torn %s is still there", step);
    snprintf(step, sizeof step, "%s/step-%012d/manifest.json", root, 1);
    CHECK(exists(step), "keep 1 removed the last complete checkpoint, %s", step);
    limit_files(&old, RLIM_INFINITY);

    /* Step 3: fails again, noticed by the steps' polls; step 5's save goes ahead and succeeds. */
    CHECK(train(m, 1, NULL) == 0, "training");
    limit_files(&old, 100);
    CHECK(ddp_checkpoint_save(m, root, NULL, NULL, 1, 0) == 0, "save: %s", ddp_last_error(m));
    CHECK(train(m, 2, NULL) == 0, "training after a failed save: %s", ddp_last_error(m));
    limit_files(&old, RLIM_INFINITY);
    rc = ddp_checkpoint_save(m, root, NULL, NULL, 1, 0);
    CHECK(rc == 0, "the save after a failed one returned %d: %s", rc, ddp_last_error(m));
    expect_wait(m, 0, "", "", "");
    coll_barrier(comm);
    snprintf(step, sizeof step, "%s/step-%012d/manifest.json", root, 5);
    CHECK(exists(step), "%s missing", step);
    snprintf(step, sizeof step, "%s/step-%012d", root, 1);
    CHECK(!exists(step), "keep 1: %s is still there", step);
    snprintf(step, sizeof step, "%s/step-%012d", root, 3);
    CHECK(!exists(step), "the torn %s is still there", step);
    snprintf(step, sizeof step, "%s/step-%012d", root, 5);
    rc = ddp_checkpoint_load(m, step, 0, NULL, NULL);
    CHECK(rc == 0, "load %s: %s", step, ddp_last_error(m));

    /* A root under a regular file: no directory can be made, the save fails alike. */
    snprintf(other, sizeof other, "%s/file", dir);
    FILE *f = rank == 0 ? fopen(other, "w") : NULL;
    if (f)
        fclose(f);
    coll_barrier(comm);
    snprintf(other, sizeof other, "%s/file/ck", dir);
    CHECK(ddp_checkpoint_save(m, other, NULL, NULL, 1, 0) == 0, "save: %s", ddp_last_error(m));
    expect_wait(m, -ENOTDIR, "checkpoint of step 5 failed", "creating", "Not a directory");
    if (rank == 0)
        printf("ddp-ckpt-check: fail: a failed write (rank %d) or directory fails the save on "
               "every rank, logged and kept; the model goes on; the next save succeeds\n",
               world - 1);
    ddp_model_free(m);
}

/* Every rank loads `path` into m: the code and a piece of the message must be as wanted. */
static void expect_load(ddp_model *m, const char *path, unsigned flags, int want, const char *in)
{
    int rc = ddp_checkpoint_load(m, path, flags, NULL, NULL);
    const char *err = ddp_last_error(m);
    CHECK(rc == want && strstr(err, in), "load %s: %d (%s), want %d (%s) naming \"%s\"", path, rc,
          err, want, ddp_strerror(want), in);
    int all = rc == want;
    coll_allreduce(comm, &all, &all, 1, COLL_I32, COLL_MIN);
    if (rank == 0)
        printf("ddp-ckpt-check: bad: %s on every rank alike: %s%s%s\n", ddp_strerror(want),
               all ? "yes" : "NO", want ? "; rank 0: " : "", want ? err : "");
}

static void scen_bad(const char *dir)
{
    char root[512], other[512], bad[4][512], path[700], file[800];
    snprintf(root, sizeof root, "%s/good", dir);
    snprintf(other, sizeof other, "%s/other", dir);
    ddp_model *m = build(1, reshard_opt, &small, 1);
    CHECK(m && train(m, 2, NULL) == 0, "training");
    if (!m)
        return;
    CHECK(ddp_checkpoint_save(m, root, NULL, NULL, 0, DDP_CKPT_SYNC) == 0, "save: %s",
          ddp_last_error(m));
    for (int k = 0; k < 4; k++) {
        snprintf(bad[k], sizeof bad[k], "%s/bad%d", dir, k);
        CHECK(ddp_checkpoint_save(m, bad[k], NULL, NULL, 0, DDP_CKPT_SYNC) == 0, "save: %s",
              ddp_last_error(m));
    }
    CHECK(train(m, 2, NULL) == 0, "training");
    CHECK(ddp_checkpoint_save(m, root, NULL, NULL, 0, DDP_CKPT_SYNC) == 0, "save: %s",
          ddp_last_error(m));
    CHECK(ddp_checkpoint_save(m, other, NULL, NULL, 0, DDP_CKPT_SYNC) == 0, "save: %s",
          ddp_last_error(m));
    CHECK(train(m, 2, NULL) == 0, "training");
    CHECK(ddp_checkpoint_save(m, root, NULL, NULL, 0, DDP_CKPT_SYNC) == 0, "save: %s",
          ddp_last_error(m));
    int last = world - 1;
    if (rank == 0) {
        /* Torn: step 6 loses its manifest (a crash before the rename); step 4 gets a broken one. */
        snprintf(file, sizeof file, "%s/step-%012d/manifest.json", root, 6);
        CHECK(unlink(file) == 0, "unlink %s", file);
        snprintf(file, sizeof file, "%s/step-%012d/manifest.json", root, 4);
        FILE *f = fopen(file, "w");
        CHECK(f && fputs("{\"format\": \"ddp-checkpoint\"", f) >= 0 && fclose(f) == 0, "%s", file);
        /* bad0: a flipped byte; bad1: 4 bytes short; bad2: a shard missing. */
        snprintf(file, sizeof file, "%s/step-%012d/shard-%05d-of-%05d.bin", bad[0], 2, last, world);
        f = fopen(file, "r+b");
        int c = f ? (fseek(f, 100, SEEK_SET), getc(f)) : EOF;
        CHECK(c != EOF && fseek(f, 100, SEEK_SET) == 0 && putc(c ^ 0x10, f) != EOF &&
                  fclose(f) == 0,
              "flipping a byte of %s", file);
        snprintf(file, sizeof file, "%s/step-%012d/shard-%05d-of-%05d.bin", bad[1], 2, last, world);
        struct stat st;
        CHECK(stat(file, &st) == 0 && truncate(file, st.st_size - 4) == 0, "truncating %s", file);
        snprintf(file, sizeof file, "%s/step-%012d/shard-%05d-of-%05d.bin", bad[2], 2, last, world);
        CHECK(unlink(file) == 0, "unlink %s", file);
    }
    CHECK(coll_barrier(comm) == 0, "barrier");

    logged[0] = 0;
    int rc = ddp_checkpoint_latest(root, path, sizeof path, log_fn, NULL);
    snprintf(file, sizeof file, "%s/step-%012d", root, 2);
    CHECK(rc == 1 && !strcmp(path, file), "latest: %d %s, want %s", rc, rc == 1 ? path : "", file);
    CHECK(strstr(logged, "step-000000000006 skipped: no manifest") &&
              strstr(logged, "step-000000000004 skipped") && strstr(logged, "manifest.json"),
          "the log: %s", logged);
    if (rank == 0)
        for (char *line = strtok(logged, "\n"); line; line = strtok(NULL, "\n"))
            printf("ddp-ckpt-check: bad: latest found %s; logged: %s\n", path, line);

    ddp_model *l = build(1, reshard_opt, &small, 0);
    CHECK(l != NULL, "build");
    if (l) {
        char shard[64];
        snprintf(shard, sizeof shard, "shard-%05d-of-%05d.bin", last, world);
        snprintf(path, sizeof path, "%s/step-%012d", bad[0], 2);
        expect_load(l, path, 0, -EBADMSG, shard);
        snprintf(path, sizeof path, "%s/step-%012d", bad[1], 2);
        expect_load(l, path, 0, -EPROTO, shard);
        snprintf(path, sizeof path, "%s/step-%012d", bad[2], 2);
        expect_load(l, path, 0, -ENOENT, shard);
        snprintf(path, sizeof path, "%s/step-%012d", root, 4);
        expect_load(l, path, 0, -EPROTO, "manifest.json");
        snprintf(path, sizeof path, "%s/step-%012d", root, 6);
        expect_load(l, path, 0, -ENOENT, "manifest.json");
        /* Different checkpoints on different ranks. */
        if (rank == 0)
            snprintf(path, sizeof path, "%s/step-%012d", root, 2);
        else
            snprintf(path, sizeof path, "%s/step-%012d", other, 4);
        expect_load(l, path, 0, world > 1 ? -EINVAL : 0, world > 1 ? "rank 0's of step 2" : "");
        snprintf(path, sizeof path, "%s/step-%012d", bad[3], 2);
        expect_load(l, path, 0, 0, "");
        int64_t step = 0;
        CHECK(train(l, 1, &step) == 0 && step == 3, "a step after the load: step %" PRId64, step);
    }
    ddp_model_free(l);

    /* Another model: unit 1 is 20 x 7. Another optimizer: SGD. */
    shape sh = small;
    sh.rows[1] = 20;
    l = build(1, reshard_opt, &sh, 0);
    snprintf(path, sizeof path, "%s/step-%012d", bad[3], 2);
    if (l)
        expect_load(l, path, 0, -EINVAL,
                    "parameter 'fc1.weight' is [19, 7], the model's is [20, 7]");
    ddp_model_free(l);
    l = build(3, DDP_SGD, &small, 0);
    if (l) {
        char what[64];
        snprintf(what, sizeof what, "the optimizer is %s", ddp_optimizer_name(reshard_opt));
        expect_load(l, path, 0, -EINVAL, what);
        /* The save's flag given to a load, and the load's to a save: refused, nothing done. */
        expect_load(l, path, DDP_CKPT_SYNC, -EINVAL, "flags 0x1");
        int rc = ddp_checkpoint_save(l, other, NULL, NULL, 0, DDP_CKPT_PARAMS_ONLY);
        CHECK(rc == -EINVAL && strstr(ddp_last_error(l), "flags 0x100"),
              "save with DDP_CKPT_PARAMS_ONLY: %d (%s), want -EINVAL", rc, ddp_last_error(l));
        expect_load(l, path, DDP_CKPT_PARAMS_ONLY, 0, "");
    }
    ddp_model_free(l);
    ddp_model_free(m);
}

/* ------------------------------------------------------------------------------------------ */
/* The full state (ddp_model_get_params()) and the gradients' semantics                         */
/* ------------------------------------------------------------------------------------------ */

/* Writes n bytes of buf to path; 0 or -errno. */
static int write_file(const char *path, const void *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    int rc = !f ? -errno : fwrite(buf, 1, n, f) == n ? 0 : -EIO;
    if (f && fclose(f) != 0 && rc == 0)
        rc = -EIO;
    return rc;
}

/* Reads path into a new buffer of *n bytes (free it), or NULL. */
static void *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    void *buf = NULL;
    long len = -1;
    if (f && fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)len + 1)) && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        buf = NULL;
    }
    if (f)
        fclose(f);
    *n = buf ? (size_t)len : 0;
    return buf;
}

/* ddp_model_get_params() refusing, with `want` in the message, on every rank alike. */
static void expect_get(ddp_model *m, int root, void *dst, size_t nbytes, unsigned flags,
                       const char *what, const char *want)
{
    int rc = ddp_model_get_params(m, root, dst, nbytes, flags);
    CHECK(rc == -EINVAL && strstr(ddp_last_error(m), want) && ddp_model_broken(m) == 0,
          "%s: %d (%s), want -EINVAL naming \"%s\", the model usable", what, rc, ddp_last_error(m),
          want);
}

/* The largest |a - b| over n floats. */
static double max_diff(const float *a, const float *b, size_t n)
{
    double d = 0;
    for (size_t i = 0; i < n; i++)
        d = fmax(d, fabs((double)a[i] - (double)b[i]));
    return d;
}

/*
 * Every stage (and stage 2 at bf16, whose masters are current only in the owned parts), AdamW,
 * 3 steps from the same initial values: ddp_model_get_params() to every rank and to each root,
 * with and without the optimizer state. Every copy is the same; the parameters are those the
 * units give (dump_params()); stages 1-3 equal stage 0 within 1e-6 (the reductions add in other
 * orders); rank 0's copy goes to DIR/NAME.state beside the checkpoint DIR/NAME, which
 * run_params.sh exports with ddp-ckpt and compares. Bad arguments on one rank, and ranks that
 * disagree, fail on every rank alike, and the model goes on.
 */
static void scen_params(const char *dir)
{
    static const struct {
        int stage;
        ddp_precision prec;
        const char *name;
    } cfg[] = {{0, DDP_PREC_F32, "s0"},
               {1, DDP_PREC_F32, "s1"},
               {2, DDP_PREC_F32, "s2"},
               {3, DDP_PREC_F32, "s3"},
               {2, DDP_PREC_BF16, "s2-bf16"}};
    float *ref = NULL; /* stage 0's copy with the optimizer state */
    size_t ref_bytes = 0;
    for (size_t c = 0; c < sizeof cfg / sizeof *cfg; c++) {
        char ck[512], dump[600], state[600];
        snprintf(ck, sizeof ck, "%s/%s", dir, cfg[c].name);
        snprintf(dump, sizeof dump, "%s.params", ck);
        snprintf(state, sizeof state, "%s.state", ck);
        build_precision = cfg[c].prec;
        ddp_model *m = build(cfg[c].stage, DDP_ADAMW, &small, 1);
        build_precision = DDP_PREC_F32;
        CHECK(m && train(m, 3, NULL) == 0, "%s: training", cfg[c].name);
        if (!m)
            continue;
        size_t pb = ddp_model_params_bytes(m, 0), sb = ddp_model_params_bytes(m, DDP_GET_OPTIMIZER);
        CHECK(sb == 3 * pb && pb > 0 && ddp_model_params_bytes(m, 0x80) == 0,
              "%s: bytes %zu and %zu", cfg[c].name, pb, sb);
        const char *names = "param exp_avg exp_avg_sq";
        char got[64] = "";
        for (int k = 0; ddp_model_state_name(m, k); k++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", k ? " " : "",
                     ddp_model_state_name(m, k));
        CHECK(!strcmp(got, names), "%s: state names \"%s\", want \"%s\"", cfg[c].name, got, names);
        float *all = malloc(sb), *rooted = malloc(sb), *params = malloc(pb), *mine = malloc(sb);
        float *every = malloc(sb * (size_t)world);
        if (!all || !rooted || !params || !mine || !every) {
            CHECK(0, "out of memory");
            goto next;
        }
        int rc = ddp_model_get_params(m, DDP_ALL_RANKS, all, sb, DDP_GET_OPTIMIZER);
        CHECK(rc == 0, "%s: get_params: %d: %s", cfg[c].name, rc, ddp_last_error(m));
        /* Every rank's copy equals rank 0's: compared through an allgather of the copies. */
        memcpy(mine, all, sb);
        rc = coll_allgather(comm, mine, every, sb / sizeof(float), COLL_F32);
        for (int r = 0; rc == 0 && r < world; r++)
            CHECK(!memcmp(every + (size_t)r * (sb / sizeof(float)), all, sb),
                  "%s: rank %d's copy differs from this rank's", cfg[c].name, r);
        /* To one root at a time (the others pass no buffer), and without the optimizer. */
        for (int root = 0; root < world; root++) {
            memset(rooted, 0, sb);
            rc = ddp_model_get_params(m, root, rank == root ? rooted : NULL, rank == root ? sb : 0,
                                      DDP_GET_OPTIMIZER);
            CHECK(rc == 0 && (rank != root || !memcmp(rooted, all, sb)),
                  "%s: get_params to root %d: %d: %s", cfg[c].name, root, rc, ddp_last_error(m));
        }
        rc = ddp_model_get_params(m, 0, rank == 0 ? params : NULL, rank == 0 ? pb : 0, 0);
        CHECK(rc == 0 && (rank != 0 || !memcmp(params, all, pb)), "%s: parameters alone: %d: %s",
              cfg[c].name, rc, ddp_last_error(m));
        /* The parameters are what the units give, bit for bit; at bf16 (stage 2: a whole
         * compute copy on every rank), the compute copy is they rounded to nearest even. */
        if (cfg[c].prec == DDP_PREC_BF16) {
            size_t at = 0, bad = 0;
            for (int p = 0; p < ddp_num_params(m); at += ddp_param_count(m, p++)) {
                const uint16_t *x = ddp_param_data(m, p);
                for (size_t i = 0; i < ddp_param_count(m, p); i++)
                    bad += !x || x[i] != bf16_from_f32(all[at + i]);
            }
            CHECK(bad == 0, "%s: %zu compute values are not the copy's, rounded", cfg[c].name, bad);
        } else if (dump_params(m, dump) == 0 && rank == 0) {
            size_t n = 0;
            void *d = read_file(dump, &n);
            CHECK(d && n == pb && !memcmp(d, all, pb), "%s: the copy is not %s (%zu bytes)",
                  cfg[c].name, dump, n);
            free(d);
        }
        if (cfg[c].prec == DDP_PREC_F32 && cfg[c].stage == 0) {
            ref = malloc(sb);
            if (ref)
                memcpy(ref, all, sb);
            ref_bytes = sb;
        } else if (cfg[c].prec == DDP_PREC_F32 && ref && ref_bytes == sb) {
            double dp = max_diff(all, ref, pb / sizeof(float));
            double ds = max_diff(all + pb / sizeof(float), ref + pb / sizeof(float),
                                 (sb - pb) / sizeof(float));
            CHECK(dp <= 1e-6 && ds <= 1e-6,
                  "%s: parameters %.3g, optimizer state %.3g from "
                  "stage 0's",
                  cfg[c].name, dp, ds);
            if (rank == 0)
                printf("ddp-ckpt-check: params world %d %s: max difference from stage 0: "
                       "parameters %.3g, optimizer state %.3g\n",
                       world, cfg[c].name, dp, ds);
        }

        /* Refused on every rank alike; nothing issued that the others do not match. */
        int last = world - 1;
        char culprit[64];
        snprintf(culprit, sizeof culprit, "rank %d passed a bad argument", last);
        expect_get(m, DDP_ALL_RANKS, all, rank == last ? pb : sb, DDP_GET_OPTIMIZER,
                   "a buffer too small on the last rank", rank == last ? "bytes" : culprit);
        expect_get(m, world, all, sb, 0, "root out of range", "not a rank");
        expect_get(m, DDP_ALL_RANKS, all, sb, 0x80, "an unknown flag", "flags");
        if (world > 1)
            expect_get(m, rank == 0 ? 0 : DDP_ALL_RANKS, all, sb, 0, "roots that differ", "differ");
        expect_get(m, DDP_ALL_RANKS, NULL, sb, 0, "no buffer", "bytes");
        CHECK(ddp_model_get_params(NULL, 0, all, sb, 0) == -EINVAL, "a NULL model");
        rc = ddp_micro_begin(m, 1);
        expect_get(m, DDP_ALL_RANKS, all, sb, 0, "inside a micro-step", "micro-step");
        if (rc == 0)
            rc = finish_step(m);
        CHECK(rc == 0, "%s: a step after the refusals: %s", cfg[c].name, ddp_last_error(m));
        /* The checkpoint of this state, and rank 0's copy of it, for ddp-ckpt export. */
        rc = ddp_model_get_params(m, 0, rank == 0 ? all : NULL, rank == 0 ? sb : 0,
                                  DDP_GET_OPTIMIZER);
        CHECK(rc == 0, "%s: get_params: %s", cfg[c].name, ddp_last_error(m));
        rc = rc ? rc : ddp_checkpoint_save(m, ck, NULL, NULL, 0, DDP_CKPT_SYNC);
        CHECK(rc == 0, "save %s: %s", ck, ddp_last_error(m));
        if (rc == 0 && rank == 0)
            CHECK(write_file(state, all, sb) == 0, "writing %s", state);
    next:
        free(all);
        free(rooted);
        free(params);
        free(mine);
        free(every);
        ddp_model_free(m);
    }
    free(ref);
}

/*
 * What libddp(3), SEMANTICS, says of gradients, checked at every stage with plain SGD (lr 1, no
 * momentum: the parameters, from zero, move by minus the gradient the step used) and values
 * whose sums are exact in f32: each rank r adds (r + 1)(k + 1)c_i in micro-step k (c_i = 1 +
 * i mod 3), in two halves through two ddp_grad_buffer() calls, which must return the same
 * pointer, the first half kept (the step's result says so). Two micro-steps, the first with
 * sync false, then a step move every element by -3c_i(W + 1)/2: averaged over ranks, summed
 * over micro-steps. Stages 0-1 hand out the accumulating arena (micro-step 1 finds micro-step
 * 0's gradient there), stages 2-3 a zeroed slot. Then a micro-step with sync true is the last:
 * another is refused (-EINVAL naming ddp_step(), the model usable), and the step uses the one
 * that ended (-c_i(W + 1)/2 more). Plain SGD has no state: DDP_GET_OPTIMIZER adds nothing.
 * After each unit of backward, with reductions in flight, the test runs an allreduce of its
 * own on the model's communicator, which must neither fail nor disturb the model's.
 */
static float c_of(size_t i)
{
    return (float)(1 + i % 3);
}

/* Micro-step k: rank r adds (r + 1)(k + 1)c_i in two halves. *arena: each buffer held `held`
 * times (r + 1)c_i when handed out; *same: the second ddp_grad_buffer() gave the same buffer. */
static int grads_micro(ddp_model *m, int k, bool sync, float held, int *arena, int *same)
{
    int rc = ddp_micro_begin(m, sync);
    for (int u = ddp_num_units(m) - 1; rc == 0 && u >= 0; u--) {
        rc = ddp_unit_gather(m, u);
        for (int p = 2 * u + 1; rc == 0 && p >= 2 * u; p--) {
            size_t n = ddp_param_count(m, p);
            float *g = ddp_grad_buffer(m, p), half = 0.5f * (float)((rank + 1) * (k + 1));
            if (!g)
                return -EINVAL;
            for (size_t i = 0; i < n; i++) {
                *arena &= g[i] == held * (float)(rank + 1) * c_of(i);
                g[i] += half * c_of(i);
            }
            float *again = ddp_grad_buffer(m, p);
            *same &= again == g;
            for (size_t i = 0; again && i < n; i++)
                again[i] += half * c_of(i);
            rc = ddp_grad_ready(m, p);
        }
        if (rc == 0)
            rc = ddp_unit_release(m, u);
        /* The caller's own collective on the model's communicator, between its calls (with
         * buckets in flight): every rank at the same point. */
        int64_t x = rank + 1;
        if (rc == 0 && (rc = coll_allreduce(comm, &x, &x, 1, COLL_I64, COLL_SUM)) == 0 &&
            x != (int64_t)world * (world + 1) / 2)
            rc = -EPROTO;
    }
    return rc == 0 ? ddp_micro_end(m) : rc;
}

/* The largest distance of the parameters from want * c_i (every rank gets them). */
static double grads_off(ddp_model *m, double want)
{
    size_t pb = ddp_model_params_bytes(m, 0);
    float *x = malloc(pb);
    int rc = x ? ddp_model_get_params(m, DDP_ALL_RANKS, x, pb, DDP_GET_OPTIMIZER) : -ENOMEM;
    CHECK(rc == 0, "get_params: %s", ddp_last_error(m));
    double worst = rc == 0 ? 0 : INFINITY;
    size_t at = 0;
    for (int p = 0; rc == 0 && p < ddp_num_params(m); at += ddp_param_count(m, p++))
        for (size_t i = 0; i < ddp_param_count(m, p); i++)
            worst = fmax(worst, fabs(x[at + i] - want * c_of(i)));
    free(x);
    return worst;
}

static void scen_grads(void)
{
    double half_w = (world + 1) / 2.0; /* the ranks' mean of r + 1 */
    for (int stage = 0; stage < 4; stage++) {
        ddp_options o;
        ddp_options_init(&o); /* plain SGD */
        o.zero_stage = stage;
        o.first_bucket_bytes = 256;
        o.bucket_bytes = 1024;
        ddp_model *m = build_with(&o, &small, 0);
        CHECK(m, "stage %d: build", stage);
        if (!m)
            continue;
        int same = 1, arena = 1;
        int rc = grads_micro(m, 0, false, 0, &arena, &same);
        if (rc == 0)
            rc = grads_micro(m, 1, true, stage < 2 ? 1 : 0, &arena, &same);
        if (rc == 0)
            rc = ddp_step(m, 1.0f, NULL);
        CHECK(rc == 0, "stage %d: training: %s", stage, ddp_last_error(m));
        CHECK(same, "stage %d: a second ddp_grad_buffer() returned another buffer", stage);
        CHECK(arena, "stage %d: a buffer as handed out is not %s", stage,
              stage < 2 ? "the earlier micro-steps' sum" : "zero");
        CHECK(ddp_model_params_bytes(m, DDP_GET_OPTIMIZER) == ddp_model_params_bytes(m, 0) &&
                  !ddp_model_state_name(m, 1),
              "stage %d: plain SGD has state", stage);
        double off = grads_off(m, -3 * half_w);
        CHECK(off == 0, "stage %d: the step moved the parameters %g off -3c(W + 1)/2", stage, off);

        /* A synchronising micro-step, then another: refused; the step uses the first. */
        rc = grads_micro(m, 0, true, 0, &arena, &same);
        int again = rc == 0 ? ddp_micro_begin(m, false) : rc;
        CHECK(again == -EINVAL && strstr(ddp_last_error(m), "ddp_step()") &&
                  ddp_model_broken(m) == 0,
              "stage %d: a micro-step after a synchronising one: %d (%s), want -EINVAL", stage,
              again, ddp_last_error(m));
        rc = rc == 0 ? ddp_step(m, 1.0f, NULL) : rc;
        double off2 = grads_off(m, -4 * half_w);
        CHECK(rc == 0 && off2 == 0, "stage %d: the step after the refusal: %d (%s), %g off", stage,
              rc, ddp_last_error(m), off2);
        if (rank == 0 && off == 0 && off2 == 0 && same && arena)
            printf("ddp-ckpt-check: grads world %d stage %d: averaged over ranks, summed over "
                   "micro-steps, a second ddp_grad_buffer() keeps the sum, a micro-step after "
                   "a synchronising one refused\n",
                   world, stage);
        ddp_model_free(m);
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: ddp-ckpt-check resume|save|load|async|bad|fail|params|grads DIR "
                        "[N...]   (under "
                        "ddprun)\n");
        return 2;
    }
    coll_options co;
    coll_options_init(&co);
    co.timeout_ms = 60000;
    coll_env_options eo;
    coll_env_options_init(&eo);
    eo.name = "ddp-ckpt-check";
    eo.suffix = argv[1];
    eo.comm = &co;
    coll_env job;
    if (coll_comm_init_env(&eo, &job) < 0) {
        /* The sentence names the variable at fault, or the store, or the missing ranks. */
        fprintf(stderr, "ddp-ckpt-check: setup: %s\n", coll_last_error(NULL));
        return 2;
    }
    rank = job.env.rank;
    world = job.env.world_size;
    comm = job.comm;
    const char *dir = argv[2];
    const char *opt = getenv("CKPT_CHECK_OPTIMIZER");
    if (opt && ddp_optimizer_from_name(opt) < 0) {
        fprintf(stderr, "ddp-ckpt-check: CKPT_CHECK_OPTIMIZER: no optimizer '%s'\n", opt);
        return 2;
    }
    if (opt)
        reshard_opt = (ddp_optimizer)ddp_optimizer_from_name(opt);
    if (!strcmp(argv[1], "resume"))
        scen_resume(dir);
    else if (!strcmp(argv[1], "save"))
        scen_save(dir);
    else if (!strcmp(argv[1], "load"))
        scen_load(dir, argc - 3, argv + 3);
    else if (!strcmp(argv[1], "async"))
        scen_async(dir);
    else if (!strcmp(argv[1], "bad"))
        scen_bad(dir);
    else if (!strcmp(argv[1], "fail"))
        scen_fail(dir);
    else if (!strcmp(argv[1], "params"))
        scen_params(dir);
    else if (!strcmp(argv[1], "grads"))
        scen_grads();
    else {
        fprintf(stderr, "ddp-ckpt-check: unknown scenario %s\n", argv[1]);
        return 2;
    }
    coll_env_free(&job);
    printf("ddp-ckpt-check: rank %d/%d %s: %s\n", rank, world, argv[1], failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}
