/*
 * ddp-check: libddp's checks that need a real communicator, run under ddprun (see
 * tests/ddp/run_ddp_check.sh). One scenario per run:
 *
 *   misuse   a gradient marked twice, a parameter never marked, a step without a synced
 *            micro-step: each -EINVAL with a message naming the parameter, on every rank
 *   layout   the last rank registers a different shape: ddp_model_commit() fails on every
 *            rank, naming that rank and the parameter
 *   nonfinite  rank 0's gradient holds a NaN at step 2 (stage 2): every rank reports the step
 *            skipped and keeps its parameters; the next step trains again
 *   memory   ddp_memory_stats() for stages 0-3 against the ZeRO paper's formulas
 *   overlap  stage 0 with several buckets and a backward that computes for a while per layer:
 *            the trace shows the first bucket's reduction issued, and completed, before the
 *            backward ends
 *
 * Prints "ddp-check: rank R/W SCENARIO: PASS" or FAIL lines; exit status 0 when every check
 * passed, 1 when one failed, 2 on a setup error.
 */
#include "ddp.h"
#include "monoclock.h"
#include "rdzv.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, world, failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            printf("ddp-check: rank %d/%d: FAIL %s:%d: ", rank, world, __FILE__, __LINE__);        \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

/* Three layers: fc0 (n0 x 4) and so on, weight and bias each. */
static ddp_model *build(coll_comm *comm, const ddp_options *o, const int64_t *rows, int nlayers,
                        int64_t cols, int commit)
{
    ddp_model *m = NULL;
    if (ddp_model_create(comm, o, &m) < 0)
        return NULL;
    for (int l = 0; l < nlayers; l++) {
        char name[16];
        snprintf(name, sizeof name, "fc%d", l);
        int u = ddp_unit_add(m, name);
        ddp_param_add(m, u, "weight", 2, (int64_t[]){rows[l], cols}, COLL_F32);
        ddp_param_add(m, u, "bias", 1, (int64_t[]){rows[l]}, COLL_F32);
    }
    if (commit && ddp_model_commit(m, NULL, NULL) < 0) {
        printf("ddp-check: rank %d: commit: %s\n", rank, ddp_last_error(m));
        ddp_model_free(m);
        return NULL;
    }
    return m;
}

static void scen_misuse(coll_comm *comm)
{
    ddp_options o;
    ddp_options_init(&o);
    ddp_model *m = build(comm, &o, (int64_t[]){8, 4}, 2, 4, 1);
    CHECK(m, "build");
    if (!m)
        return;
    CHECK(ddp_step(m, 0.1f, NULL) == -EINVAL, "a step before any micro-step");
    CHECK(strstr(ddp_last_error(m), "no complete micro-step"), "message: %s", ddp_last_error(m));
    CHECK(ddp_micro_begin(m, 1) == 0, "micro_begin");
    CHECK(ddp_grad_ready(m, 3) == 0, "ready");
    CHECK(ddp_grad_ready(m, 3) == -EINVAL, "marked twice");
    CHECK(strstr(ddp_last_error(m), "'bias' was marked twice"), "message: %s", ddp_last_error(m));
    CHECK(ddp_grad_ready(m, 2) == 0 && ddp_grad_ready(m, 1) == 0, "ready");
    CHECK(ddp_micro_end(m) == -EINVAL, "parameter 0 never marked");
    CHECK(strstr(ddp_last_error(m), "'weight' (parameter 0) was not marked"), "message: %s",
          ddp_last_error(m));
    ddp_model_free(m);
}

static void scen_layout(coll_comm *comm)
{
    ddp_options o;
    ddp_options_init(&o);
    int64_t rows[2] = {8, rank == world - 1 ? 9 : 8};
    ddp_model *m = build(comm, &o, rows, 2, 4, 0);
    CHECK(m, "build");
    if (!m)
        return;
    int rc = ddp_model_commit(m, NULL, NULL);
    char want[96];
    snprintf(want, sizeof want, "rank %d's parameter 2 is not rank 0's", world - 1);
    CHECK(rc == -EINVAL, "commit returned %d", rc);
    CHECK(strstr(ddp_last_error(m), want), "message: %s", ddp_last_error(m));
    if (rank == 0)
        printf("ddp-check: rank 0 layout message: %s\n", ddp_last_error(m));
    ddp_model_free(m);
}

/* One micro-step of a constant gradient (NaN on rank 0 when poison), then a step. */
static int one_step(ddp_model *m, int poison, ddp_step_info *info)
{
    int rc = ddp_micro_begin(m, 1);
    for (int p = ddp_num_params(m) - 1; rc == 0 && p >= 0; p--) {
        float *g = ddp_grad_buffer(m, p);
        for (size_t i = 0; g && i < ddp_param_count(m, p); i++)
            g[i] = 0.5f;
        if (g && poison && rank == 0)
            g[ddp_param_count(m, p) / 2] = NAN;
        rc = ddp_grad_ready(m, p);
    }
    if (rc == 0)
        rc = ddp_micro_end(m);
    return rc ? rc : ddp_step(m, 0.1f, info);
}

static void scen_nonfinite(coll_comm *comm)
{
    ddp_options o;
    ddp_options_init(&o);
    o.zero_stage = 2;
    o.momentum = 0.9f;
    ddp_model *m = build(comm, &o, (int64_t[]){30, 7}, 2, 5, 1);
    CHECK(m, "build");
    if (!m)
        return;
    ddp_step_info a, b, c;
    float before, after;
    CHECK(one_step(m, 0, &a) == 0 && !a.skipped && a.step == 1, "step 1");
    before = *(float *)ddp_param_data(m, 0);
    CHECK(one_step(m, 1, &b) == 0, "step 2: %s", ddp_last_error(m));
    after = *(float *)ddp_param_data(m, 0);
    CHECK(b.skipped && b.step == 1 && !isfinite(b.grad_norm), "step 2 skipped %d step %lld",
          b.skipped, (long long)b.step);
    CHECK(before == after, "parameters moved on a skipped step: %g -> %g", before, after);
    CHECK(one_step(m, 0, &c) == 0 && !c.skipped && c.step == 2, "step 3 trains again");
    CHECK(*(float *)ddp_param_data(m, 0) != after, "step 3 moved nothing");
    ddp_model_free(m);
}

static void scen_memory(coll_comm *comm)
{
    /* Ψ elements per rank in the formulas: the padded arena. */
    const int64_t rows[3] = {1000, 301, 77};
    for (int opt = 0; opt < 2; opt++) {
        for (int stage = 0; stage <= 3; stage++) {
            ddp_options o;
            ddp_options_init(&o);
            o.zero_stage = stage;
            o.optimizer = opt ? DDP_ADAMW : DDP_SGD;
            o.momentum = opt ? 0.0f : 0.9f;
            o.first_bucket_bytes = 4096;
            o.bucket_bytes = 8192;
            ddp_model *m = build(comm, &o, rows, 3, 5, 1);
            CHECK(m, "build");
            if (!m)
                return;
            size_t n = 0;
            for (int p = 0; p < ddp_num_params(m); p++)
                n += ddp_param_count(m, p);
            ddp_memory s;
            CHECK(ddp_memory_stats(m, &s) == 0, "stats");
            /* K: optimizer state per element, in floats (SGD momentum 1, AdamW 2). */
            double psi = 4.0 * (double)n, k = opt ? 2 : 1, N = world;
            double want = stage == 0   ? (2 + k) * psi
                          : stage == 1 ? 2 * psi + k * psi / N
                          : stage == 2 ? psi + (1 + k) * psi / N
                                       : (2 + k) * psi / N;
            /* Padding adds fewer than `world` elements per group, in each of 2 + k arrays. */
            double slack = (2 + k) * 4.0 * (double)world * 16;
            CHECK((double)s.model_state_bytes >= want - 1 &&
                      (double)s.model_state_bytes <= want + slack,
                  "stage %d %s: %zu bytes, formula %.0f", stage, opt ? "adamw" : "sgd",
                  s.model_state_bytes, want);
            if (rank == 0)
                printf("ddp-check: memory %s stage %d world %d: params %zu grads %zu optimizer "
                       "%zu pools %zu = %zu (formula %.0f)\n",
                       opt ? "adamw" : "sgd", stage, world, s.param_bytes, s.grad_bytes,
                       s.optimizer_bytes, s.pool_bytes, s.model_state_bytes, want);
            ddp_model_free(m);
        }
    }
}

/* The overlap trace: timestamps of the first bucket's launch and completion, backward's end. */
static int64_t t_launch0 = -1, t_done0 = -1, t_bwd_end = -1;
static int nlaunch;

static void on_trace(void *arg, ddp_event ev, int index, int64_t t)
{
    (void)arg;
    if (ev == DDP_EV_BUCKET_LAUNCH && index == 0 && t_launch0 < 0)
        t_launch0 = t;
    if (ev == DDP_EV_BUCKET_LAUNCH)
        nlaunch++;
    if (ev == DDP_EV_BUCKET_DONE && index == 0 && t_done0 < 0)
        t_done0 = t;
    if (ev == DDP_EV_BACKWARD_END && t_bwd_end < 0)
        t_bwd_end = t;
}

/* Stands in for a layer's backward: about `ms` of arithmetic into the gradient. */
static void compute(float *g, size_t n, int ms)
{
    int64_t until = rdzv__now_ns() + (int64_t)ms * 1000000;
    while (rdzv__now_ns() < until)
        for (size_t i = 0; i < n; i++)
            g[i] += 1e-3f * (float)(i % 7);
}

static void scen_overlap(coll_comm *comm)
{
    ddp_options o;
    ddp_options_init(&o);
    o.trace = on_trace;
    /* 4 layers of 256 x 1024 floats (1 MiB each): the first bucket holds the last layer. */
    const int64_t rows[4] = {256, 256, 256, 256};
    ddp_model *m = build(comm, &o, rows, 4, 1024, 1);
    CHECK(m, "build");
    if (!m)
        return;
    CHECK(ddp_micro_begin(m, 1) == 0, "micro_begin");
    for (int l = 3; l >= 0; l--) {
        for (int k = 1; k >= 0; k--) {
            int p = 2 * l + k;
            compute(ddp_grad_buffer(m, p), ddp_param_count(m, p), k ? 1 : 40);
            CHECK(ddp_grad_ready(m, p) == 0, "ready %d", p);
        }
    }
    CHECK(ddp_micro_end(m) == 0, "micro_end: %s", ddp_last_error(m));
    CHECK(ddp_step(m, 0.01f, NULL) == 0, "step: %s", ddp_last_error(m));
    CHECK(nlaunch >= 2, "%d buckets launched", nlaunch);
    CHECK(t_launch0 > 0 && t_launch0 < t_bwd_end, "bucket 0 launched at %lld, backward ended %lld",
          (long long)t_launch0, (long long)t_bwd_end);
    /* Three layers of about 40 ms of backward remain after bucket 0 launches; its 1 MiB
     * allreduce takes about a millisecond here, so it completes while they compute. */
    CHECK(t_done0 > 0 && t_done0 < t_bwd_end, "bucket 0 completed at %lld, backward ended %lld",
          (long long)t_done0, (long long)t_bwd_end);
    if (rank == 0)
        printf("ddp-check: overlap: %d buckets; bucket 0 launched %.1f ms before the backward "
               "ended, its reduction done %.1f ms %s it\n",
               nlaunch, (double)(t_bwd_end - t_launch0) / 1e6,
               (double)llabs(t_bwd_end - t_done0) / 1e6,
               t_done0 >= 0 && t_done0 < t_bwd_end ? "before" : "after");
    ddp_model_free(m);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr,
                "usage: ddp-check misuse|layout|nonfinite|memory|overlap   (under ddprun)\n");
        return 2;
    }
    rdzv_env env;
    rdzv_client *store = NULL;
    coll_comm *comm = NULL;
    char prefix[256];
    if (rdzv_env_read(&env) < 0 || env.standalone) {
        fprintf(stderr, "ddp-check: %s\n",
                env.standalone ? "run me under ddprun" : rdzv_client_last_error(NULL));
        return 2;
    }
    rank = env.rank;
    world = env.world_size;
    rdzv_env_prefix(&env, "ddp-check", prefix, sizeof prefix);
    strncat(prefix, "/", sizeof prefix - strlen(prefix) - 1);
    strncat(prefix, argv[1], sizeof prefix - strlen(prefix) - 1);
    coll_options co;
    coll_options_init(&co);
    co.timeout_ms = 30000;
    if (rdzv_env_connect(&env, NULL, &store) < 0 ||
        coll_comm_init(store, prefix, rank, world, COLL_BACKEND_CPU, -1, &co, &comm) < 0) {
        fprintf(stderr, "ddp-check: rank %d: setup: %s %s\n", rank, rdzv_client_last_error(NULL),
                coll_last_error(NULL));
        return 2;
    }
    rdzv_client_close(store);
    if (!strcmp(argv[1], "misuse"))
        scen_misuse(comm);
    else if (!strcmp(argv[1], "layout"))
        scen_layout(comm);
    else if (!strcmp(argv[1], "nonfinite"))
        scen_nonfinite(comm);
    else if (!strcmp(argv[1], "memory"))
        scen_memory(comm);
    else if (!strcmp(argv[1], "overlap"))
        scen_overlap(comm);
    else {
        fprintf(stderr, "ddp-check: unknown scenario %s\n", argv[1]);
        return 2;
    }
    coll_comm_destroy(comm);
    printf("ddp-check: rank %d/%d %s: %s\n", rank, world, argv[1], failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}
