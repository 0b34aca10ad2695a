/*
 * ddp-check: libddp's checks that need a real communicator, run under ddprun (see
 * tests/libddp/run_ddp.sh). One scenario per run:
 *
 *   misuse   options ddp_model_create() refuses (an unknown optimizer, Nesterov without
 *            momentum, a bad precision after an optimizer whose own check passes); a gradient
 *            marked twice, a parameter never marked, a step without a synced
 *            micro-step: each -EINVAL with a message naming the parameter, on every rank; then
 *            rank 1 alone leaves a gradient unmarked (stage 0) or marks one twice (stage 3):
 *            rank 1 fails naming the parameter, every other rank naming rank 1, well within
 *            the communicator's timeout (each case on a communicator of its own: misuse
 *            aborts it)
 *   layout   the last rank registers a different shape: ddp_model_commit() fails on every
 *            rank, naming that rank and the parameter
 *   nonfinite  rank 0's gradient holds a NaN at step 2 (stage 2): every rank reports the step
 *            skipped, warns through the log hook once and keeps its parameters; the next step
 *            trains again
 *   memory   ddp_memory_stats() for stages 0-3 against the ZeRO paper's formulas
 *   overlap  stage 0 with several buckets and a backward that computes for a while per layer:
 *            the trace shows the first bucket's reduction issued, and completed, before the
 *            backward ends
 *   equiv    a linear least-squares model of four units (sizes that pad unevenly), each rank
 *            the gradient of its slice of a global batch, in 1 or 4 micro-steps: stages 0-3,
 *            SGD (momentum, Nesterov, weight decay), AdamW and Lion, with clipping, against a
 *            serial double-precision reference over the whole batch that every rank computes;
 *            ddp_model_get_params() gives every rank the parameters the units give
 *   bf16     the same model at precision bf16 and/or reduce_dtype bf16, stages 0-3, every
 *            optimizer: after every step the compute copy is the masters rounded to nearest
 *            even (each rank's owned part; stages 1-2 also every rank's whole copy, against the
 *            gathered masters), the result is within a stated tolerance of the reference, and a
 *            checkpoint of a bf16 model loads into a fresh one with its compute copy refreshed
 *            (libddp's internals, ddp_internal.h, give the masters); ddp_model_get_params()
 *            gives the masters, which the compute copy rounds
 *   equiv-device  equiv and bf16 with the model on a GPU (opts.device = LOCAL_RANK modulo the
 *            devices visible, opts.stream a stream of the test's): the cpu backend on device
 *            buffers, so several ranks may share a GPU; the parameters are copied to the host
 *            on the compute stream to compute, and the gradients added through the host, each
 *            written back by a copy on the compute stream that ddp_grad_ready() does not wait
 *            for (held back a moment: a reduction not ordered after it reads a stale gradient)
 *   equiv-nccl    the same on an nccl communicator (one GPU per rank; world 1 on a single GPU),
 *            the test's own exchanges of host values on a cpu one
 *   gpu-count  prints how many CUDA devices are visible (0 in a build without CUDA) and exits
 *            0, without a rendezvous (tests/libddp/gpu_check.sh asks it first)
 *
 * Prints "ddp-check: rank R/W SCENARIO: PASS" or FAIL lines; exit status 0 when every check
 * passed, 1 when one failed, 2 on a setup error.
 */
#include "ddp.h"
#include "ddp_internal.h"
#include "monoclock.h"
#include "optim.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef DDP_CHECK_CUDA
#define DDP_CHECK_CUDA 0
#endif
#if DDP_CHECK_CUDA
#include <cuda_runtime_api.h>
#endif

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

/* A communicator of its own for a misuse case: misuse aborts the one it happens on. */
static coll_comm *fresh_comm(coll_comm *comm)
{
    coll_comm *c = NULL;
    int rc = coll_comm_split(comm, 0, rank, &c);
    CHECK(rc == 0, "coll_comm_split: %s", coll_last_error(NULL));
    return rc == 0 ? c : NULL;
}

/* Misuse on every rank alike: each rank's error names the parameter. */
static void misuse_all(coll_comm *comm)
{
    ddp_options o;
    ddp_options_init(&o);
    coll_comm *c = fresh_comm(comm);
    ddp_model *m = c ? build(c, &o, (int64_t[]){8, 4}, 2, 4, 1) : NULL;
    CHECK(m, "build");
    if (m) {
        /* A step too early issues nothing: an error, and the model goes on. */
        CHECK(ddp_step(m, 0.1f, NULL) == -EINVAL, "a step before any micro-step");
        CHECK(strstr(ddp_last_error(m), "no complete micro-step"), "message: %s",
              ddp_last_error(m));
        CHECK(ddp_micro_begin(m, 1) == 0, "micro_begin");
        CHECK(ddp_grad_ready(m, 3) == 0, "ready");
        CHECK(ddp_grad_ready(m, 3) == -EINVAL, "marked twice");
        CHECK(strstr(ddp_last_error(m), "'bias' (parameter 3) was marked twice"), "message: %s",
              ddp_last_error(m));
        /* Broken from then on, with the same account. */
        CHECK(ddp_micro_end(m) == -EINVAL, "micro_end after the misuse");
        CHECK(strstr(ddp_last_error(m), "marked twice") &&
                  strstr(ddp_last_error(m), "communicator is aborted"),
              "message: %s", ddp_last_error(m));
    }
    ddp_model_free(m);
    coll_comm_close(c);

    c = fresh_comm(comm);
    m = c ? build(c, &o, (int64_t[]){8, 4}, 2, 4, 1) : NULL;
    CHECK(m, "build");
    if (m) {
        CHECK(ddp_micro_begin(m, 1) == 0, "micro_begin");
        CHECK(ddp_grad_ready(m, 3) == 0 && ddp_grad_ready(m, 2) == 0 && ddp_grad_ready(m, 1) == 0,
              "ready");
        CHECK(ddp_micro_end(m) == -EINVAL, "parameter 0 never marked");
        CHECK(strstr(ddp_last_error(m), "'weight' (parameter 0) was not marked"), "message: %s",
              ddp_last_error(m));
    }
    ddp_model_free(m);
    coll_comm_close(c);
}

/*
 * Rank 1 alone misuses, the others train: at stage 0 it leaves parameter 0 unmarked (alone in
 * the bucket reduced last, so that its peers wait in a reduction rank 1 never issues); at stage
 * 3 (`twice`) it marks parameter 3 twice in the middle of backward. Every rank fails: rank 1
 * with -EINVAL naming the parameter, the others with COLL_EREMOTE naming rank 1, in far less
 * than the communicator's timeout (30 s), without waiting for rank 1 to free anything or exit:
 * every rank frees its model and communicator only after the slowest rank's time has been
 * gathered on the first communicator, and rank 0 prints it.
 */
static void misuse_one(coll_comm *comm, int stage, int twice)
{
    ddp_options o;
    ddp_options_init(&o);
    o.zero_stage = stage;
    o.first_bucket_bytes = o.bucket_bytes = 64; /* a bucket or two per layer */
    coll_comm *c = fresh_comm(comm);
    ddp_model *m = c ? build(c, &o, (int64_t[]){8, 4, 4}, 3, 4, 1) : NULL;
    CHECK(m, "build");
    int misusing = rank == 1, rc = m ? 0 : -1;
    int64_t t0 = mono_now_ns();
    for (int step = 0; rc == 0 && step < 2; step++) {
        rc = ddp_micro_begin(m, 1);
        for (int u = ddp_num_units(m) - 1; rc == 0 && u >= 0; u--) {
            rc = ddp_unit_gather(m, u);
            for (int p = 2 * u + 1; rc == 0 && p >= 2 * u; p--) {
                if (misusing && !twice && p == 0)
                    continue;
                float *g = ddp_grad_buffer(m, p);
                for (size_t i = 0; g && i < ddp_param_count(m, p); i++)
                    g[i] = 0.5f;
                rc = ddp_grad_ready(m, p);
                if (rc == 0 && misusing && twice && p == 3)
                    rc = ddp_grad_ready(m, p);
            }
            if (rc == 0)
                rc = ddp_unit_release(m, u);
        }
        if (rc == 0)
            rc = ddp_micro_end(m);
        if (rc == 0)
            rc = ddp_step(m, 0.1f, NULL);
    }
    int64_t ms = (mono_now_ns() - t0) / 1000000;
    const char *err = m ? ddp_last_error(m) : "";
    const char *want = !misusing ? "(rank 1)"
                       : twice   ? "'bias' (parameter 3) was marked twice"
                                 : "'weight' (parameter 0) was not marked";
    CHECK(rc == (misusing ? -EINVAL : COLL_EREMOTE), "stage %d: returned %d (%s)", stage, rc,
          ddp_strerror(rc));
    CHECK(strstr(err, want), "stage %d: the message lacks \"%s\": %s", stage, want, err);
    CHECK(ms < 10000, "stage %d: failed after %lld ms, the timeout is 30000", stage, (long long)ms);
    int64_t slowest = ms;
    CHECK(coll_allreduce(comm, &ms, &slowest, 1, COLL_I64, COLL_MAX) == 0, "allreduce: %s",
          coll_last_error(comm));
    if (rank == 0)
        printf("ddp-check: misuse: rank 1 alone %s (stage %d): every rank failed within %lld ms; "
               "rank 0: %s\n",
               twice ? "marked a gradient twice" : "left a gradient unmarked", stage,
               (long long)slowest, err);
    ddp_model_free(m);
    coll_comm_close(c);
}

/* Options ddp_model_create() refuses, each with -EINVAL and its reason; the optimizer's own check
 * (its row's) does not stop the checks after it. */
static void bad_options(coll_comm *comm)
{
    struct {
        ddp_optimizer opt;
        bool nesterov;
        ddp_precision prec;
        const char *want; /* NULL: accepted */
    } cases[] = {
        {(ddp_optimizer)7, false, DDP_PREC_F32, "unknown optimizer"},
        {DDP_SGD, true, DDP_PREC_F32, "Nesterov needs momentum > 0"},
        {DDP_SGD, false, (ddp_precision)5, "precision must be"},
        {DDP_LION, false, (ddp_precision)5, "precision must be"},
        {DDP_LION, false, DDP_PREC_BF16, NULL},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        ddp_options o;
        ddp_options_init(&o);
        o.optimizer = cases[k].opt;
        o.nesterov = cases[k].nesterov;
        o.precision = cases[k].prec;
        ddp_model *m = NULL;
        int rc = ddp_model_create(comm, &o, &m);
        if (cases[k].want)
            CHECK(rc == -EINVAL && strstr(ddp_last_error(NULL), cases[k].want),
                  "options case %zu: %d (%s), want -EINVAL naming \"%s\"", k, rc,
                  ddp_last_error(NULL), cases[k].want);
        else
            CHECK(rc == 0, "options case %zu: %d (%s)", k, rc, ddp_last_error(NULL));
        ddp_model_free(m);
    }
}

static void scen_misuse(coll_comm *comm)
{
    bad_options(comm);
    misuse_all(comm);
    if (world > 1) {
        misuse_one(comm, 0, 0);
        misuse_one(comm, 3, 1);
    }
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

/* The log hook's warnings that a step was skipped. */
static int nf_warned;

static void nf_log(void *arg, int level, const char *msg)
{
    (void)arg;
    nf_warned += level == COLL_LOG_WARN && strstr(msg, "skipped") != NULL;
}

static void scen_nonfinite(coll_comm *comm)
{
    ddp_options o;
    ddp_options_init(&o);
    o.zero_stage = 2;
    o.momentum = 0.9f;
    o.log = nf_log;
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
    CHECK(nf_warned == 1, "the log hook got %d warnings of a skipped step, want 1", nf_warned);
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
    int64_t until = mono_now_ns() + (int64_t)ms * 1000000;
    while (mono_now_ns() < until)
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

/*
 * The equivalence model: parameters theta (P elements, registration order, padding excluded),
 * sample i with features a_i[j] = sin(0.7 i + 1.3 j) and target y_i = cos(0.3 i), loss
 * 0.5 (a_i . theta - y_i)^2 averaged over the global batch of step t, samples t*B .. t*B + B-1.
 * Rank r takes the r-th of `world` equal slices of the batch and adds (W / B) (a_i . theta -
 * y_i) a_i per sample, so libddp's average over ranks is the global mean, whatever the split
 * into micro-steps.
 */
#define EQ_B 48 /* global batch: divisible by 1, 2, 3, 4 ranks and then by 4 micro-steps */
#define EQ_K 6  /* steps */
#define EQ_MAXP 128
#define EQ_MAXN 32 /* the most elements of one parameter */
static const struct {
    int unit;
    const char *name;
    int ndim;
    int64_t shape[2];
} eq_params[] = {
    {0, "weight", 2, {6, 5}}, {1, "weight", 2, {4, 7}}, {1, "bias", 1, {4}},
    {2, "weight", 1, {13}},   {3, "weight", 2, {3, 3}}, {3, "bias", 1, {2}},
};
#define EQ_NP ((int)(sizeof eq_params / sizeof eq_params[0]))
static const char *eq_units[] = {"embed", "fc1", "fc2", "head"};
static size_t eq_base[EQ_NP + 1]; /* first element of each parameter in theta; [EQ_NP] = P */

/*
 * Where eq_train() puts the model: -1 the host; else the CUDA device, with eq_stream as the
 * compute stream. eq_mcomm: the model's communicator when it is not the one the scenario was
 * given (equiv-nccl: the nccl one; the test's exchanges of host values stay on the cpu one).
 */
static int eq_device = -1;
static void *eq_stream;
static coll_comm *eq_mcomm;
static char eq_where[64]; /* "" on the host, else " on GPU n (backend)", for the summaries */

/* Copies between the host and the model's memory, on the compute stream, waited for. */
static int eq_copy(void *dst, const void *src, size_t nbytes)
{
#if DDP_CHECK_CUDA
    if (eq_device >= 0)
        return cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, (cudaStream_t)eq_stream) ==
                           cudaSuccess &&
                       cudaStreamSynchronize((cudaStream_t)eq_stream) == cudaSuccess
                   ? 0
                   : -1;
#endif
    memcpy(dst, src, nbytes);
    return 0;
}

#if DDP_CHECK_CUDA
/* Device runs: each parameter's new gradient in pinned memory, copied from asynchronously. */
static float *eq_pinned[EQ_NP];

/* Holds the compute stream a moment (a host function run in its order). */
static void CUDART_CB eq_hold(void *arg)
{
    (void)arg;
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
}
#endif

/*
 * Writes parameter p's gradient h[n] into the model's buffer g. For a device model the copy is
 * enqueued on the compute stream behind eq_hold() and not waited for, so that ddp_grad_ready()
 * follows at once, as it follows a backward kernel: a reduction that did not wait for the
 * compute stream's event would read the buffer before the copy lands, and the run would miss
 * the reference. (The hold only widens that window; no result depends on how long it lasts.)
 * eq_pinned[p] is free again by the next call for p, whose eq_copy() of g synchronises.
 */
static int eq_put_grad(int p, float *g, const float *h, size_t n)
{
#if DDP_CHECK_CUDA
    if (eq_device >= 0) {
        cudaStream_t s = (cudaStream_t)eq_stream;
        memcpy(eq_pinned[p], h, n * sizeof *h);
        return cudaLaunchHostFunc(s, eq_hold, NULL) == cudaSuccess &&
                       cudaMemcpyAsync(g, eq_pinned[p], n * sizeof *h, cudaMemcpyHostToDevice,
                                       s) == cudaSuccess
                   ? 0
                   : -1;
    }
#endif
    (void)p;
    return eq_copy(g, h, n * sizeof *h);
}

static double eq_a(int64_t i, size_t j)
{
    return sin(0.7 * (double)i + 1.3 * (double)j);
}

static double eq_y(int64_t i)
{
    return cos(0.3 * (double)i);
}

static double eq_theta0(size_t j)
{
    return 0.1 * sin((double)j + 0.5);
}

static int eq_init(void *arg, int param, const char *name, void *data, size_t count)
{
    (void)arg, (void)name;
    for (size_t k = 0; k < count; k++)
        ((float *)data)[k] = (float)eq_theta0(eq_base[param] + k);
    return 0;
}

typedef struct eq_cfg {
    int stage;
    ddp_optimizer opt;
    int nmicro, pool;
    float lr, clip;
    ddp_precision prec;
    coll_dtype reduce;
} eq_cfg;

/* Called after each step of eq_train() (NULL: none), and on the trained model before it is
 * freed (NULL: none). */
static void (*eq_after_step)(ddp_model *m);
static void (*eq_after_train)(ddp_model *m, const eq_cfg *c);

/* Parameter p's data (ddp_param_data()) in host memory: the model's own, or a copy of it in
 * `scratch` (EQ_MAXP floats) for a device model; NULL on failure. */
static const void *eq_data(ddp_model *m, int p, float *scratch)
{
    const void *w = ddp_param_data(m, p);
    if (!w || eq_device < 0)
        return w;
    size_t es = ddp_param_dtype(m) == COLL_BF16 ? 2 : 4;
    return eq_copy(scratch, w, ddp_param_count(m, p) * es) == 0 ? scratch : NULL;
}

/* Element e of parameter p's data as eq_data() gives it, f32 or bf16. */
static float eq_w(ddp_model *m, const void *w, size_t e)
{
    return ddp_param_dtype(m) == COLL_BF16 ? bf16_to_f32(((const uint16_t *)w)[e])
                                           : ((const float *)w)[e];
}

/* The learning rate of the runs of `opt`: Lion's update has no scale of its own (every element
 * moves by lr), so it gets a smaller one. */
static float eq_lr(ddp_optimizer opt)
{
    return opt == DDP_ADAMW ? 0.01f : opt == DDP_LION ? 0.003f : 0.05f;
}

/* The serial reference: theta after EQ_K steps, and each step's gradient norm. */
static void eq_reference(const eq_cfg *c, double *theta, double *norms)
{
    size_t P = eq_base[EQ_NP];
    double m1[EQ_MAXP] = {0}, m2[EQ_MAXP] = {0}, g[EQ_MAXP];
    const double wd = 0.01, mom = 0.9, b1 = 0.9, b2 = 0.999, eps = 1e-8;
    const double lion_b1 = 0.9, lion_b2 = 0.99;
    for (size_t j = 0; j < P; j++)
        theta[j] = (float)eq_theta0(j);
    for (int t = 0; t < EQ_K; t++) {
        memset(g, 0, sizeof g);
        for (int64_t i = (int64_t)t * EQ_B; i < (int64_t)(t + 1) * EQ_B; i++) {
            double f = -eq_y(i);
            for (size_t j = 0; j < P; j++)
                f += eq_a(i, j) * theta[j];
            for (size_t j = 0; j < P; j++)
                g[j] += f * eq_a(i, j) / EQ_B;
        }
        double ss = 0;
        for (size_t j = 0; j < P; j++)
            ss += g[j] * g[j];
        norms[t] = sqrt(ss);
        if (c->clip > 0 && norms[t] > c->clip)
            for (size_t j = 0; j < P; j++)
                g[j] *= c->clip / (norms[t] + 1e-6);
        for (size_t j = 0; j < P; j++) {
            if (c->opt == DDP_ADAMW) {
                theta[j] *= 1 - c->lr * wd;
                m1[j] = b1 * m1[j] + (1 - b1) * g[j];
                m2[j] = b2 * m2[j] + (1 - b2) * g[j] * g[j];
                double mh = m1[j] / (1 - pow(b1, t + 1)), vh = m2[j] / (1 - pow(b2, t + 1));
                theta[j] -= c->lr * mh / (sqrt(vh) + eps);
            } else if (c->opt == DDP_LION) { /* the sign of an interpolation, decoupled decay */
                theta[j] *= 1 - c->lr * wd;
                double u = lion_b1 * m1[j] + (1 - lion_b1) * g[j];
                theta[j] -= c->lr * ((u > 0) - (u < 0));
                m1[j] = lion_b2 * m1[j] + (1 - lion_b2) * g[j];
            } else { /* Nesterov momentum with L2 weight decay, torch's order */
                double gj = g[j] + wd * theta[j];
                m1[j] = t == 0 ? gj : mom * m1[j] + gj;
                theta[j] -= c->lr * (gj + mom * m1[j]);
            }
        }
    }
}

/*
 * Reductions issued in the current micro-step, and the most of them issued before the backward
 * of the first unit (the last one backward reaches) began, in the latest run.
 */
static int eq_launched, eq_overlap;

/*
 * Stage 3's prefetch: whether each unit's allgather has been issued since its release, and how
 * many gathers of the training loop had to issue their own (the unit was not prefetched).
 */
static char eq_issued[4];
static int eq_misses;

static void eq_gather(ddp_model *m, int u, int *rc)
{
    eq_misses += !eq_issued[u];
    *rc = ddp_unit_gather(m, u);
}

static void eq_release(ddp_model *m, int u, int *rc)
{
    eq_issued[u] = 0;
    *rc = ddp_unit_release(m, u);
}

static void eq_trace(void *arg, ddp_event ev, int index, int64_t t)
{
    (void)arg, (void)index, (void)t;
    if (ev == DDP_EV_BUCKET_LAUNCH)
        eq_launched++;
    if (ev == DDP_EV_GATHER_LAUNCH)
        eq_issued[index] = 1;
    if (ev == DDP_EV_BACKWARD_END)
        eq_launched = 0;
}

/* The options of the runs of configuration c, on the host or on eq_device. */
static void eq_options(const eq_cfg *c, ddp_options *out)
{
    ddp_options o;
    ddp_options_init(&o);
    o.zero_stage = c->stage;
    ddp_options_set_optimizer(&o, c->opt); /* and its defaults: Lion's betas 0.9, 0.99 */
    o.momentum = c->opt == DDP_SGD ? 0.9f : 0.0f;
    o.nesterov = c->opt == DDP_SGD;
    o.weight_decay = 0.01f;
    o.clip_norm = c->clip;
    o.first_bucket_bytes = 64; /* 16 floats, then 24: several buckets, some one parameter */
    o.bucket_bytes = 96;
    o.pool_slots = c->pool; /* 2: slots are waited for and reused; 8: some stay in flight
                               from one micro-step into the next */
    o.trace = eq_trace;
    o.precision = c->prec;
    o.reduce_dtype = c->reduce;
    o.device = eq_device;
    o.stream = eq_stream;
    *out = o;
}

/*
 * ddp_model_get_params() (into host memory, whatever the model's device) gives every rank the
 * parameters the units gave, `theta`, in registration order: the same values at f32, the
 * masters that the compute copy rounds at bf16. Returns 0 or -1.
 */
static int eq_check_full(ddp_model *m, const double *theta)
{
    size_t nbytes = ddp_model_params_bytes(m, DDP_GET_OPTIMIZER), bad = 0;
    float *full = malloc(nbytes);
    int rc = full ? ddp_model_get_params(m, DDP_ALL_RANKS, full, nbytes, DDP_GET_OPTIMIZER) : -1;
    CHECK(rc == 0, "ddp_model_get_params: %d: %s", rc, ddp_last_error(m));
    for (size_t j = 0; rc == 0 && j < eq_base[EQ_NP]; j++) {
        float want =
            ddp_param_dtype(m) == COLL_BF16 ? bf16_to_f32(bf16_from_f32(full[j])) : full[j];
        bad += want != (float)theta[j];
    }
    CHECK(bad == 0, "ddp_model_get_params: %zu of %zu values are not the units'", bad,
          eq_base[EQ_NP]);
    free(full);
    return rc == 0 && bad == 0 ? 0 : -1;
}

/* One training run through libddp's loop; theta and the norms come back on every rank. */
static int eq_train(coll_comm *comm, const eq_cfg *c, double *theta, double *norms, int *nclip)
{
    ddp_options o;
    eq_options(c, &o);
    eq_launched = eq_overlap = eq_misses = 0;
    memset(eq_issued, 0, sizeof eq_issued);
    ddp_model *m = NULL;
    int rc = ddp_model_create(eq_mcomm ? eq_mcomm : comm, &o, &m);
    for (int p = 0; rc >= 0 && p < EQ_NP; p++) {
        if (p == 0 || eq_params[p].unit != eq_params[p - 1].unit)
            rc = ddp_unit_add(m, eq_units[eq_params[p].unit]);
        if (rc >= 0)
            rc = ddp_param_add(m, eq_params[p].unit, eq_params[p].name, eq_params[p].ndim,
                               eq_params[p].shape, COLL_F32);
    }
    if (rc >= 0)
        rc = ddp_model_commit(m, eq_init, NULL);
    int local = EQ_B / world, per_micro = local / c->nmicro;
    *nclip = 0;
    for (int t = 0; rc >= 0 && t < EQ_K; t++) {
        for (int k = 0; rc >= 0 && k < c->nmicro; k++) {
            int64_t first = (int64_t)t * EQ_B + (int64_t)rank * local + (int64_t)k * per_micro;
            double f[EQ_B] = {0}; /* (per_micro,) residuals */
            rc = ddp_micro_begin(m, k == c->nmicro - 1);
            /* Forward: the residuals, unit by unit. */
            for (int u = 0; rc >= 0 && u < 4; u++) {
                eq_gather(m, u, &rc);
                for (int p = 0; rc >= 0 && p < EQ_NP; p++) {
                    if (eq_params[p].unit != u)
                        continue;
                    float scratch[EQ_MAXN];
                    const void *w = eq_data(m, p, scratch);
                    if (!w) {
                        rc = -1;
                        break;
                    }
                    for (int s = 0; s < per_micro; s++)
                        for (size_t e = 0; e < ddp_param_count(m, p); e++)
                            f[s] += eq_a(first + s, eq_base[p] + e) * eq_w(m, w, e);
                }
                if (rc >= 0)
                    eq_release(m, u, &rc);
            }
            for (int s = 0; s < per_micro; s++)
                f[s] -= eq_y(first + s);
            /* Backward: units and parameters in reverse. */
            for (int u = 3; rc >= 0 && u >= 0; u--) {
                if (u == 0 && eq_launched > eq_overlap)
                    eq_overlap = eq_launched;
                eq_gather(m, u, &rc);
                for (int p = EQ_NP - 1; rc >= 0 && p >= 0; p--) {
                    if (eq_params[p].unit != u)
                        continue;
                    /* The gradient is added (+=) to what the buffer holds, through the host
                     * for a device model. */
                    float *g = ddp_grad_buffer(m, p), h[EQ_MAXN];
                    size_t n = ddp_param_count(m, p);
                    if (!g || eq_copy(h, g, n * sizeof *h) < 0) {
                        rc = -1;
                        break;
                    }
                    for (size_t e = 0; e < n; e++) {
                        double acc = 0;
                        for (int s = 0; s < per_micro; s++)
                            acc += f[s] * eq_a(first + s, eq_base[p] + e);
                        h[e] += (float)(acc * world / EQ_B);
                    }
                    rc = eq_put_grad(p, g, h, n) < 0 ? -1 : ddp_grad_ready(m, p);
                }
                if (rc >= 0)
                    eq_release(m, u, &rc);
            }
            if (rc >= 0)
                rc = ddp_micro_end(m);
        }
        ddp_step_info info;
        if (rc >= 0 && (rc = ddp_step(m, c->lr, &info)) >= 0) {
            norms[t] = info.grad_norm;
            *nclip += info.clipped;
            rc = info.skipped ? -1 : 0;
            if (rc == 0 && eq_after_step)
                eq_after_step(m);
        }
    }
    for (int u = 0; rc >= 0 && u < 4; u++) {
        rc = ddp_unit_gather(m, u);
        for (int p = 0; rc >= 0 && p < EQ_NP; p++) {
            float scratch[EQ_MAXN];
            const void *w = eq_params[p].unit == u ? eq_data(m, p, scratch) : NULL;
            if (eq_params[p].unit == u && !w)
                rc = -1;
            for (size_t e = 0; w && e < ddp_param_count(m, p); e++)
                theta[eq_base[p] + e] = eq_w(m, w, e);
        }
        if (rc >= 0)
            rc = ddp_unit_release(m, u);
    }
    if (rc >= 0)
        rc = eq_check_full(m, theta);
    if (rc >= 0 && eq_after_train)
        eq_after_train(m, c);
    if (rc < 0)
        printf("ddp-check: rank %d: equiv: %s\n", rank, m ? ddp_last_error(m) : "create");
    ddp_model_free(m);
    return rc;
}

/*
 * Tolerance: 1e-5 relative (normwise: the largest difference over the largest reference value,
 * and each gradient norm against the reference's). libddp computes in float and sums the
 * ranks' contributions in another order than the double reference; each parameter then
 * differs by a few float roundings (~1e-7 relative) per step, and six steps of a
 * well-conditioned problem do not grow that past ~1e-6.
 */
static void eq_sizes(void)
{
    for (int p = 0; p < EQ_NP; p++) {
        size_t n = 1;
        for (int d = 0; d < eq_params[p].ndim; d++)
            n *= (size_t)eq_params[p].shape[d];
        eq_base[p + 1] = eq_base[p] + n;
    }
}

static void scen_equiv(coll_comm *comm)
{
    eq_sizes();
    size_t P = eq_base[EQ_NP];
    double worst = 0;
    for (int k = 0; ddp_optimizer_name((ddp_optimizer)k); k++) {
        ddp_optimizer opt = (ddp_optimizer)k;
        const char *name = ddp_optimizer_name(opt);
        for (int nmicro = 1; nmicro <= 4; nmicro += 3) {
            for (int sp = 0; sp < 6; sp++) {
                int stage = sp < 4 ? sp : sp - 2, pool = sp < 4 ? 2 : 8; /* 2-3 twice */
                eq_cfg c = {stage, opt, nmicro, pool, eq_lr(opt), 0.3f, DDP_PREC_F32, COLL_F32};
                double ref[EQ_MAXP], got[EQ_MAXP], rn[EQ_K], gn[EQ_K];
                int nclip = 0;
                eq_reference(&c, ref, rn);
                if (eq_train(comm, &c, got, gn, &nclip) < 0) {
                    CHECK(0, "stage %d %s micro %d: training failed", stage, name, nmicro);
                    return;
                }
                double dmax = 0, rmax = 0, nrel = 0;
                for (size_t j = 0; j < P; j++) {
                    dmax = fmax(dmax, fabs(got[j] - ref[j]));
                    rmax = fmax(rmax, fabs(ref[j]));
                }
                int rclip = 0;
                for (int t = 0; t < EQ_K; t++) {
                    nrel = fmax(nrel, fabs(gn[t] - rn[t]) / rn[t]);
                    rclip += rn[t] > c.clip;
                }
                double rel = dmax / rmax;
                worst = fmax(worst, fmax(rel, nrel));
                /* Every stage issues reductions while backward goes on (stage 3: units in
                 * reverse order), before it reaches the first unit. */
                CHECK(eq_overlap >= 2, "stage %d: %d reductions issued before unit 0's backward",
                      stage, eq_overlap);
                /* Stage 3 prefetches the next unit in the direction of travel and turns at
                 * the ends: only each pass's first unit (forward's 0, backward's 3) is
                 * gathered on demand, twice per micro-step. */
                CHECK(stage < 3 || eq_misses == 2 * EQ_K * nmicro,
                      "stage 3: %d gathers were not prefetched, want %d", eq_misses,
                      2 * EQ_K * nmicro);
                CHECK(rel <= 1e-5 && nrel <= 1e-5 && nclip == rclip,
                      "stage %d %s micro %d slots %d: parameters %.2e, norms %.2e relative; "
                      "clipped %d steps, the reference %d",
                      stage, name, nmicro, pool, rel, nrel, nclip, rclip);
                if (rank == 0)
                    printf("ddp-check: equiv world %d stage %d %-5s %d micro %d slots: parameters "
                           "%.1e, "
                           "norms %.1e relative; %d of %d steps clipped (norms %.3f to %.3f); %d "
                           "reductions before unit 0's backward\n",
                           world, stage, name, nmicro, pool, rel, nrel, nclip, EQ_K, rn[0],
                           rn[EQ_K - 1], eq_overlap);
            }
        }
    }
    if (rank == 0)
        printf("ddp-check: equiv world %d%s: worst relative difference %.1e (tolerance 1e-5)\n",
               world, eq_where, worst);
}

/* ------------------------------------------------------------------------------------------ */
/* bf16                                                                                        */
/* ------------------------------------------------------------------------------------------ */

static coll_comm *bf_comm;
static int bf_steps_checked, bf_mismatch;
static char bf_dir[256]; /* the checkpoint root, the same on every rank */

/* Whether element i of the arena (stages 0-2) or of the compact owned part (3) is owned. */
static int bf_owned(const ddp__model_view *v, size_t i)
{
    if (v->stage == 0 || v->stage == 3)
        return 1;
    for (int g = 0; g < v->plan->ngroups; g++) {
        const ddp__group *gr = &v->plan->groups[g];
        size_t own = gr->offset + (size_t)v->rank * gr->shard;
        if (i >= own && i < own + gr->shard)
            return 1;
    }
    return 0;
}

/*
 * The model's view with the masters and the compute copy in host memory: the model's own for a
 * host model; for a device model the masters downloaded (ddp__model_view_host()) and the
 * compute copy copied into memory that bf_view_done() frees. Returns 0, or -1 without a
 * compute copy or on failure.
 */
static int bf_view(ddp_model *m, ddp__model_view *v)
{
    if (eq_device < 0)
        return ddp__model_view_get(m, v) < 0 || !v->compute ? -1 : 0;
    if (ddp__model_view_host(m, v, true) < 0 || !v->compute)
        return -1;
    size_t n = v->stage == 3 ? v->plan->shard_total : v->plan->total;
    uint16_t *c = malloc(n * sizeof *c);
    if (!c || eq_copy(c, v->compute, n * sizeof *c) < 0) {
        free(c);
        return -1;
    }
    v->compute = c;
    return 0;
}

static void bf_view_done(ddp__model_view *v)
{
    if (eq_device >= 0)
        free((void *)v->compute);
}

/*
 * After a step: the owned compute copy is round(master), element for element; at stages 1-2
 * every element of the whole copy is round(the owner's master), the masters gathered here.
 */
static void bf_check_copy(ddp_model *m)
{
    ddp__model_view v;
    if (bf_view(m, &v) < 0) {
        CHECK(0, "bf16: no view or no compute copy: %s", ddp_last_error(m));
        return;
    }
    size_t n = v.stage == 3 ? v.plan->shard_total : v.plan->total;
    float *full = NULL;
    if (v.stage == 1 || v.stage == 2) {
        full = calloc(n, sizeof *full);
        memcpy(full, v.param, n * sizeof *full);
        for (int g = 0; g < v.plan->ngroups; g++) {
            const ddp__group *gr = &v.plan->groups[g];
            float *b = full + gr->offset;
            if (coll_allgather(bf_comm, b + (size_t)rank * gr->shard, b, gr->shard, COLL_F32) < 0)
                CHECK(0, "bf16: gathering the masters");
        }
    }
    for (size_t i = 0; i < n; i++) {
        float master = full ? full[i] : v.param[i];
        if ((full || bf_owned(&v, i)) && v.compute[i] != bf16_from_f32(master))
            bf_mismatch++;
    }
    free(full);
    bf_view_done(&v);
    bf_steps_checked++;
}

/*
 * After training: a checkpoint of the model loads into a fresh model of the same stage, whose
 * masters then equal the trained ones and whose compute copy is round(master) again.
 */
static void bf_check_ckpt(ddp_model *m, const eq_cfg *c)
{
    int rc = ddp_checkpoint_save(m, bf_dir, NULL, NULL, 0, DDP_CKPT_SYNC);
    CHECK(rc == 0, "bf16 stage %d: save: %s", c->stage, ddp_last_error(m));
    char path[512];
    CHECK(ddp_checkpoint_latest(bf_dir, path, sizeof path, NULL, NULL) == 1, "latest");
    ddp_options o;
    eq_options(c, &o);
    o.trace = NULL;
    ddp_model *fresh = NULL;
    rc = ddp_model_create(eq_mcomm ? eq_mcomm : bf_comm, &o, &fresh);
    for (int p = 0; rc >= 0 && p < EQ_NP; p++) {
        if (p == 0 || eq_params[p].unit != eq_params[p - 1].unit)
            rc = ddp_unit_add(fresh, eq_units[eq_params[p].unit]);
        if (rc >= 0)
            rc = ddp_param_add(fresh, eq_params[p].unit, eq_params[p].name, eq_params[p].ndim,
                               eq_params[p].shape, COLL_F32);
    }
    if (rc >= 0)
        rc = ddp_model_commit(fresh, NULL, NULL); /* zeros: the load must replace them */
    if (rc >= 0)
        rc = ddp_checkpoint_load(fresh, path, 0, NULL, NULL);
    CHECK(rc >= 0, "bf16 stage %d: load: %s", c->stage, fresh ? ddp_last_error(fresh) : "create");
    ddp__model_view a, b;
    int va = rc >= 0 ? bf_view(m, &a) : -1, vb = rc >= 0 ? bf_view(fresh, &b) : -1;
    CHECK(rc < 0 || (va == 0 && vb == 0), "bf16 stage %d: no view of the models", c->stage);
    if (va == 0 && vb == 0) {
        size_t n = a.stage == 3 ? a.plan->shard_total : a.plan->total;
        int differ = 0, stale = 0;
        for (size_t i = 0; i < n; i++) {
            if (!bf_owned(&a, i))
                continue;
            differ += memcmp(&a.param[i], &b.param[i], sizeof(float)) != 0;
            stale += b.compute[i] != bf16_from_f32(b.param[i]);
        }
        CHECK(!differ && !stale, "bf16 stage %d: after the load %d masters differ, %d compute "
              "elements are not round(master)", c->stage, differ, stale);
        bf_check_copy(fresh);
    }
    if (va == 0)
        bf_view_done(&a);
    if (vb == 0)
        bf_view_done(&b);
    ddp_model_free(fresh);
}

/*
 * Tolerance against the double reference (normwise relative, as in equiv): 2e-2. bf16 compute
 * rounds every weight the forward reads to 8 significant bits (2^-9 relative) and the
 * parameters read back are bf16 too: SGD lands within 3e-3. AdamW divides each update by the
 * root of its second moment, so a small gradient component that the rounded weights perturb
 * moves its parameter by nearly a full lr anyway: 9e-3 measured (worlds 1 and 3). A bf16
 * reduction alone rounds each pre-divided gradient and partial sum: within 2e-3.
 */
static void scen_bf16(coll_comm *comm)
{
    eq_sizes();
    bf_comm = comm;
    size_t P = eq_base[EQ_NP];
    if (rank == 0) {
        const char *tmp = getenv("TMPDIR");
        snprintf(bf_dir, sizeof bf_dir, "%s/ddp-check-bf16.XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(bf_dir))
            bf_dir[0] = 0;
    }
    if (coll_broadcast(comm, bf_dir, bf_dir, sizeof bf_dir, COLL_U8, 0) < 0 || !bf_dir[0]) {
        CHECK(0, "bf16: no checkpoint directory");
        return;
    }
    static const struct {
        ddp_precision prec;
        coll_dtype reduce;
        const char *name;
    } modes[] = {{DDP_PREC_BF16, COLL_F32, "bf16 compute"},
                 {DDP_PREC_F32, COLL_BF16, "bf16 reduce"},
                 {DDP_PREC_BF16, COLL_BF16, "bf16 both"}};
    double worst = 0;
    for (int mode = 0; mode < 3; mode++) {
        for (int k = 0; ddp_optimizer_name((ddp_optimizer)k); k++) {
            ddp_optimizer opt = (ddp_optimizer)k;
            const char *name = ddp_optimizer_name(opt);
            for (int stage = 0; stage < 4; stage++) {
                eq_cfg c = {
                    stage, opt, 1, 2, eq_lr(opt), 0.3f, modes[mode].prec, modes[mode].reduce};
                double ref[EQ_MAXP], got[EQ_MAXP], rn[EQ_K], gn[EQ_K];
                int nclip = 0;
                eq_reference(&c, ref, rn);
                bf_steps_checked = bf_mismatch = 0;
                int compute = c.prec == DDP_PREC_BF16;
                eq_after_step = compute ? bf_check_copy : NULL;
                eq_after_train = compute ? bf_check_ckpt : NULL;
                int rc = eq_train(comm, &c, got, gn, &nclip);
                eq_after_step = NULL;
                eq_after_train = NULL;
                if (rc < 0) {
                    CHECK(0, "%s stage %d: training failed", modes[mode].name, stage);
                    continue;
                }
                double dmax = 0, rmax = 0;
                for (size_t j = 0; j < P; j++) {
                    dmax = fmax(dmax, fabs(got[j] - ref[j]));
                    rmax = fmax(rmax, fabs(ref[j]));
                }
                double rel = dmax / rmax;
                worst = fmax(worst, rel);
                CHECK(rel <= 2e-2, "%s stage %d %s: parameters %.2e relative to the reference",
                      modes[mode].name, stage, name, rel);
                CHECK(!compute || (bf_steps_checked == EQ_K + 1 && bf_mismatch == 0),
                      "%s stage %d: %d compute elements are not round(master) over %d checks",
                      modes[mode].name, stage, bf_mismatch, bf_steps_checked);
                if (rank == 0)
                    printf("ddp-check: bf16 world %d %-12s stage %d %-5s: parameters %.1e "
                           "relative to the f32/double reference\n",
                           world, modes[mode].name, stage, name, rel);
            }
        }
    }
    coll_barrier(comm);
    if (rank == 0) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", bf_dir);
        if (system(cmd) != 0)
            printf("ddp-check: could not remove %s\n", bf_dir);
        printf("ddp-check: bf16 world %d%s: worst relative difference %.1e (tolerance 2e-2)\n",
               world, eq_where, worst);
    }
}

/* CUDA devices visible: 0 without any, or in a build without CUDA. */
static int gpu_count(void)
{
    int n = 0;
#if DDP_CHECK_CUDA
    if (cudaGetDeviceCount(&n) != cudaSuccess)
        n = 0;
#endif
    return n;
}

/* equiv-device and equiv-nccl: the device, and a compute stream on it. Returns 0 or -1. */
static int device_open(int local_rank, int nccl)
{
#if DDP_CHECK_CUDA
    cudaStream_t s;
    eq_device = local_rank % gpu_count();
    int ok = cudaSetDevice(eq_device) == cudaSuccess &&
             cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess;
    for (int p = 0; ok && p < EQ_NP; p++)
        ok = cudaMallocHost((void **)&eq_pinned[p], EQ_MAXN * sizeof(float)) == cudaSuccess;
    if (!ok) {
        fprintf(stderr, "ddp-check: rank %d: GPU %d: %s\n", rank, eq_device,
                cudaGetErrorString(cudaGetLastError()));
        return -1;
    }
    eq_stream = s;
    snprintf(eq_where, sizeof eq_where, " on GPU %d (%s backend)", eq_device,
             nccl ? "nccl" : "cpu");
    return 0;
#else
    (void)local_rank, (void)nccl;
    return -1;
#endif
}

static void device_close(void)
{
#if DDP_CHECK_CUDA
    if (eq_stream)
        cudaStreamDestroy((cudaStream_t)eq_stream);
    for (int p = 0; p < EQ_NP; p++)
        cudaFreeHost(eq_pinned[p]);
#endif
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: ddp-check misuse|layout|nonfinite|memory|overlap|equiv|bf16|"
                        "equiv-device|equiv-nccl   (under ddprun)\n"
                        "       ddp-check gpu-count\n");
        return 2;
    }
    if (!strcmp(argv[1], "gpu-count")) {
        printf("%d\n", gpu_count());
        return 0;
    }
    int on_device = !strcmp(argv[1], "equiv-device"), nccl = !strcmp(argv[1], "equiv-nccl");
    on_device |= nccl;
    if (on_device && (gpu_count() == 0 || (nccl && !coll_have_nccl()))) {
        printf("ddp-check: SKIP: %s: %s\n", argv[1],
               gpu_count() == 0 ? "no CUDA device" : "libcollective was built without NCCL");
        return 77;
    }
    coll_options co;
    coll_options_init(&co);
    co.timeout_ms = 30000;
    coll_env_options eo;
    coll_env_options_init(&eo);
    eo.name = "ddp-check";
    eo.suffix = argv[1];
    eo.comm = &co;
    eo.keep_store = nccl; /* for the nccl communicator below */
    coll_env job;
    if (coll_comm_init_env(&eo, &job) < 0) {
        /* The sentence names the variable at fault, or the store, or the missing ranks. */
        fprintf(stderr, "ddp-check: setup: %s\n", coll_last_error(NULL));
        return 2;
    }
    rank = job.env.rank;
    world = job.env.world_size;
    coll_comm *comm = job.comm;
    if (on_device && device_open(job.env.local_rank, nccl) < 0)
        return 2;
    /* equiv-nccl: the model's communicator (the test's exchanges of host values stay on the
     * cpu one). */
    char prefix[sizeof job.prefix + 8];
    snprintf(prefix, sizeof prefix, "%s/nccl", job.prefix);
    if (nccl && coll_comm_init(job.store, prefix, rank, world, COLL_BACKEND_NCCL, eq_device, &co,
                               &eq_mcomm) < 0) {
        fprintf(stderr, "ddp-check: rank %d: the nccl communicator: %s\n", rank,
                coll_last_error(NULL));
        return 2;
    }
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
    else if (!strcmp(argv[1], "equiv"))
        scen_equiv(comm);
    else if (!strcmp(argv[1], "bf16"))
        scen_bf16(comm);
    else if (on_device) {
        scen_equiv(comm);
        scen_bf16(comm);
    } else {
        fprintf(stderr, "ddp-check: unknown scenario %s\n", argv[1]);
        return 2;
    }
    coll_comm_close(eq_mcomm);
    coll_env_free(&job);
    device_close();
    printf("ddp-check: rank %d/%d %s: %s\n", rank, world, argv[1], failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}
