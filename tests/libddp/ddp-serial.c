/*
 * ddp-serial: libddp's end-to-end checker, one process per rank under ddprun.
 *
 * Each rank reads ddprun's (torchrun's) environment, joins the job's store, creates a
 * communicator per scenario under "ddp-serial/<run id>/<restart>/<scenario>" and trains a tiny
 * synthetic model with libddp through the one training loop of ddp.h, whatever the stage:
 *
 *   equiv     stages 0-3 x (SGD with momentum, Nesterov and weight decay; plain SGD; AdamW with
 *             decay and a warmup-cosine schedule; Lion likewise), with clipping: K steps reach the
 * parameters of a serial reference, and every step's gradient norm equals the serial norm accum 4
 * micro-steps of b samples reach what 1 micro-step of 4b does, at every stage nonfinite a NaN (then
 * an infinity) in one rank's gradient skips the step on every rank; training then goes on and still
 * matches the reference (which skips it too) misuse    a gradient marked twice, a parameter not
 * marked, a gradient asked for after it was marked, a step without a synchronising micro-step,
 * stage 3 release without gather: each a clear -EINVAL naming what; the model stays in step across
 * ranks layout    a rank registering a different shape, an extra parameter or another zero_stage:
 *             ddp_model_commit() fails on every rank, naming the rank (and the parameter)
 *   memory    ddp_memory_stats() against the ZeRO formulas for every stage and optimizer
 *   trace     with 5 buckets, a bucket's reduction is issued before backward ends, buckets go
 *             out in bucket order (stage 3: units in backward order) and stage 3 prefetches
 *   kill      --victim dies by SIGKILL in the middle of a step's backward at --stage; every
 *             survivor's libddp call returns COLL_EREMOTE or -ETIMEDOUT naming it within
 *             --timeout-ms (plus 5 s of slack)
 *   stall     likewise, but the victim sleeps past the timeout: -ETIMEDOUT naming it, after the
 *             timeout and not much later
 *
 * The model: four units (embed: weight [13, 7], bias [13]; mid: weight [257]; tiny: scale [1],
 * shift [2]; head: weight [5, 31], bias [5]); 524 elements. With 256-byte first buckets and
 * 512-byte others that is 5 buckets, one of them a parameter larger than its cap. Each sample s
 * pulls element e towards a target: loss_s = sum_e a_e (p_e - t_se)^2 / 2, so the gradient is
 * a_e (p_e - t_se), averaged over the step's global batch of G = 48 samples. Rank r's micro-step
 * k of step n takes samples n G + (k N + r) b ... + b - 1 (b = G / (N nmicro)) and scales its
 * gradient by 1 / nmicro, so the global batch, and the result, do not depend on the world size.
 *
 * The reference: every rank computes the whole training serially in double precision (the
 * full-batch mean gradient, PyTorch's clip_grad_norm_ coefficient, torch.optim.SGD and AdamW's
 * update rules, Lion's) and compares. Tolerance: |p - ref| <= 1e-5 max(1, |ref|) for the
 * parameters, 1e-5 relative for the norm. Why it holds: targets sit near +-2 and initial values
 * within 0.5, so no gradient element nears zero in K steps, AdamW's m / sqrt(v) is well conditioned
 * and Lion's interpolation keeps its sign far from rounding (a flipped sign would cost 2 lr); each
 * gradient element is a float sum of at most 48 O(1) terms (relative error below 48 * 2^-24 =
 * 3e-6, typically 10x less) and every step moves a parameter by lr times that, so K = 6 steps
 * accumulate at most a few 1e-6. The largest error seen is printed per scenario.
 *
 * Output: "ddp-serial: rank R/W SCENARIO: PASS ..." or "... FAIL ..." per rank and scenario, and
 * a "FAIL" line per failed check. A watchdog exits 3 when a rank makes no progress for
 * --watchdog-s seconds. Exit status: 0 pass, 1 a check failed, 2 bad usage or environment,
 * 3 watchdog.
 */
#include "cli.h"
#include "coll.h"
#include "ddp.h"
#include "monoclock.h"
#include "rdzv.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------ */
/* The synthetic model                                                                         */
/* ------------------------------------------------------------------------------------------ */

#define NUNITS 4
#define NPARAMS 7
#define GLOBAL_BATCH 48

typedef struct pdesc {
    int unit;
    const char *name;
    int ndim;
    int64_t shape[2];
} pdesc;

static const char *unit_names[NUNITS] = {"embed", "mid", "tiny", "head"};
static const pdesc model[NPARAMS] = {
    {0, "weight", 2, {13, 7}}, {0, "bias", 1, {13}}, {1, "weight", 1, {257}},
    {2, "scale", 1, {1}},      {2, "shift", 1, {2}}, {3, "weight", 2, {5, 31}},
    {3, "bias", 1, {5}},
};
static size_t pcount[NPARAMS], poff[NPARAMS], total_elems; /* offsets in the flat order */

static void model_init_tables(void)
{
    total_elems = 0;
    for (int i = 0; i < NPARAMS; i++) {
        pcount[i] = 1;
        for (int d = 0; d < model[i].ndim; d++)
            pcount[i] *= (size_t)model[i].shape[d];
        poff[i] = total_elems;
        total_elems += pcount[i];
    }
}

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* A uniform double in [0, 1) from (a, b, c). */
static double u01(uint64_t a, uint64_t b, uint64_t c)
{
    return (double)(mix64(mix64(mix64(a) ^ b) ^ c) >> 11) * 0x1p-53;
}

static double curvature(size_t e) /* a_e in [0.5, 1.5) */
{
    return 0.5 + u01(1, e, 0);
}

static double target(int64_t sample, size_t e) /* near +-2 */
{
    double c = u01(2, e, 0) < 0.5 ? -2.0 : 2.0;
    return c + (2 * u01(3, e, (uint64_t)sample) - 1) * 0.5;
}

static float initial(size_t e) /* within 0.5 of 0, exactly representable */
{
    return (float)(u01(4, e, 0) - 0.5);
}

static int init_fn(void *arg, int param, const char *name, void *data, size_t count)
{
    (void)arg;
    (void)name;
    float *p = data;
    for (size_t j = 0; j < count; j++)
        p[j] = initial(poff[param] + j);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Context, reporting, watchdog                                                                */
/* ------------------------------------------------------------------------------------------ */

typedef struct ctx {
    int rank, world;
    rdzv_client *store;
    char attempt[192], prefix[256];
    const char *scenario;
    int timeout_ms, victim, watchdog_s, stage;
    bool verbose;
    long checks, failures, reports;
    double max_err; /* the largest parameter error seen, over its tolerance bound */
    double max_norm_err;
    coll_comm *comm;
} ctx;

static pthread_mutex_t where_lock = PTHREAD_MUTEX_INITIALIZER;
static char where[256] = "start";
static _Atomic int64_t last_progress_ns;
static int g_rank = -1, g_watchdog_s = 120;

static void set_where(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&where_lock);
    vsnprintf(where, sizeof where, fmt, ap);
    pthread_mutex_unlock(&where_lock);
    va_end(ap);
    atomic_store(&last_progress_ns, mono_now_ns());
}

static void *watchdog(void *arg)
{
    (void)arg;
    for (;;) {
        sleep(1); /* a poll interval, not synchronisation */
        if (mono_now_ns() - atomic_load(&last_progress_ns) > (int64_t)g_watchdog_s * 1000000000) {
            pthread_mutex_lock(&where_lock);
            fprintf(stderr, "ddp-serial: rank %d: WATCHDOG: no progress for %d s, stuck in: %s\n",
                    g_rank, g_watchdog_s, where);
            fflush(NULL);
            _exit(3);
        }
    }
    return NULL;
}

static void fail(ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(ctx *c, const char *fmt, ...)
{
    c->failures++;
    if (c->reports++ >= 30)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    printf("ddp-serial: FAIL rank %d/%d [%s]: %s\n", c->rank, c->world, c->scenario, msg);
    fflush(stdout);
}

static void note(ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(ctx *c, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    printf("ddp-serial: rank %d/%d [%s]: %s\n", c->rank, c->world, c->scenario, msg);
    fflush(stdout);
}

#define CHECK(c, cond, ...)                                                                        \
    do {                                                                                           \
        (c)->checks++;                                                                             \
        if (!(cond))                                                                               \
            fail((c), __VA_ARGS__);                                                                \
    } while (0)

static bool names_rank(const char *s, int rank)
{
    char pat[32];
    int n = snprintf(pat, sizeof pat, "rank %d", rank);
    for (const char *p = s; (p = strstr(p, pat)) != NULL; p++)
        if (p[n] < '0' || p[n] > '9')
            return true;
    return false;
}

/* ------------------------------------------------------------------------------------------ */
/* A training run                                                                              */
/* ------------------------------------------------------------------------------------------ */

#define MAX_STEPS 8
#define MAX_EVENTS 4096

typedef struct run_cfg {
    int stage;
    ddp_optimizer opt;
    float momentum, weight_decay, clip;
    int nesterov;
    ddp_schedule sched;
    int steps, nmicro, pool_slots;
    /* Faults: a non-finite value written by rank bad_rank at step bad_step (micro 0). */
    int bad_step, bad_rank;
    float bad_value;
    /* kill, stall: the victim dies (or sleeps past the timeout) at step fault_step, in its last
     * micro-step's backward, after marking its first gradient. */
    int fault_step, stall;
} run_cfg;

typedef struct event {
    ddp_event ev;
    int index;
    int64_t t;
} event;

typedef struct run_out {
    float params[1024]; /* final parameters, in the flat order */
    double norm[MAX_STEPS];
    int skipped[MAX_STEPS], clipped[MAX_STEPS];
    int64_t step_count;
    event events[MAX_EVENTS];
    int nevents;
    ddp_memory mem;
    int rc; /* the first failure's code (kill) */
    char err[512];
    double fail_ms; /* how long the failing call took */
} run_out;

static void trace_hook(void *arg, ddp_event ev, int index, int64_t t_ns)
{
    run_out *o = arg;
    if (o->nevents < MAX_EVENTS)
        o->events[o->nevents++] = (event){ev, index, t_ns};
}

static void cfg_defaults(run_cfg *r)
{
    memset(r, 0, sizeof *r);
    r->opt = DDP_SGD;
    r->sched = (ddp_schedule){.kind = DDP_SCHED_CONSTANT, .lr = 0.1f};
    r->steps = 6;
    r->nmicro = 2;
    r->pool_slots = 2;
    r->bad_step = -1;
    r->fault_step = -1;
}

static int build_model(ddp_model *m, const int64_t *shape_override, int extra_param)
{
    for (int u = 0, i = 0; u < NUNITS; u++) {
        int uu = ddp_unit_add(m, unit_names[u]);
        if (uu != u)
            return uu < 0 ? uu : -EPROTO;
        for (; i < NPARAMS && model[i].unit == u; i++) {
            const int64_t *shape = model[i].shape;
            if (shape_override && i == 5)
                shape = shape_override;
            int p = ddp_param_add(m, u, model[i].name, model[i].ndim, shape, COLL_F32);
            if (p != i)
                return p < 0 ? p : -EPROTO;
        }
        if (extra_param && u == NUNITS - 1) {
            int p = ddp_param_add(m, u, "extra", 1, (int64_t[]){3}, COLL_F32);
            if (p < 0)
                return p;
        }
    }
    return 0;
}

/* Copies the model's parameters out (stage 3: gathering each unit). Returns 0 or a code. */
static int read_params(ddp_model *m, int stage, float *out)
{
    for (int u = 0; u < NUNITS; u++) {
        int rc = ddp_unit_gather(m, u);
        if (rc != 0)
            return rc;
        for (int i = 0; i < NPARAMS; i++) {
            if (model[i].unit != u)
                continue;
            const float *p = ddp_param_data(m, i);
            if (!p)
                return -EFAULT;
            memcpy(out + poff[i], p, pcount[i] * sizeof(float));
        }
        if ((rc = ddp_unit_release(m, u)) != 0)
            return rc;
        if (stage == 3 && ddp_param_data(m, 0 /* embed.weight */) && u == 0)
            return -EFAULT; /* released: must be out of the window */
    }
    return 0;
}

/* The gradient of element e for the samples of rank r's micro-step k of step n. */
static float micro_grad(const run_cfg *r, int world, int rank, int n, int k, float p, size_t e)
{
    int b = GLOBAL_BATCH / (world * r->nmicro);
    int64_t s0 = (int64_t)n * GLOBAL_BATCH + ((int64_t)k * world + rank) * b;
    float a = (float)curvature(e), g = 0;
    for (int s = 0; s < b; s++)
        g += a * (p - (float)target(s0 + s, e));
    return g / (float)(b * r->nmicro);
}

/*
 * Trains K steps through the loop of ddp.h. Returns 0, or the first libddp failure's code
 * (kept in out->rc with ddp_last_error() in out->err).
 */
static int train(ctx *c, const run_cfg *r, run_out *out)
{
    memset(out, 0, sizeof *out);
    ddp_options o;
    ddp_options_init(&o);
    o.zero_stage = r->stage;
    o.first_bucket_bytes = 256;
    o.bucket_bytes = 512;
    o.pool_slots = r->pool_slots;
    ddp_options_set_optimizer(&o, r->opt); /* and its default betas */
    o.momentum = r->momentum;
    o.nesterov = r->nesterov;
    o.weight_decay = r->weight_decay;
    o.clip_norm = r->clip;
    o.trace = trace_hook;
    o.trace_arg = out;
    ddp_model *m = NULL;
    int rc = ddp_model_create(c->comm, &o, &m);
    if (rc != 0) {
        fail(c, "ddp_model_create: %s: %s", ddp_strerror(rc), ddp_last_error(NULL));
        return rc;
    }
    if ((rc = build_model(m, NULL, 0)) != 0) {
        fail(c, "registering the model: %s: %s", ddp_strerror(rc), ddp_last_error(m));
        goto out;
    }
    set_where("stage %d: commit", r->stage);
    if ((rc = ddp_model_commit(m, init_fn, NULL)) != 0)
        goto failed;
    for (int n = 0; n < r->steps; n++) {
        float lr = ddp_schedule_lr(&r->sched, n);
        for (int k = 0; k < r->nmicro; k++) {
            set_where("stage %d: step %d micro %d", r->stage, n, k);
            if ((rc = ddp_micro_begin(m, k == r->nmicro - 1)) != 0)
                goto failed;
            /* Forward: every unit in order (the model needs no activations here). */
            for (int u = 0; u < NUNITS; u++) {
                if ((rc = ddp_unit_gather(m, u)) != 0)
                    goto failed;
                for (int i = 0; i < NPARAMS; i++)
                    if (model[i].unit == u && !ddp_param_data(m, i)) {
                        fail(c, "stage %d: ddp_param_data(%d) is NULL after gathering", r->stage,
                             i);
                        rc = -EFAULT;
                        goto out;
                    }
                if ((rc = ddp_unit_release(m, u)) != 0)
                    goto failed;
            }
            /* Backward: units in reverse, parameters in reverse. */
            for (int u = NUNITS - 1; u >= 0; u--) {
                if ((rc = ddp_unit_gather(m, u)) != 0)
                    goto failed;
                for (int i = NPARAMS - 1; i >= 0; i--) {
                    if (model[i].unit != u)
                        continue;
                    const float *p = ddp_param_data(m, i);
                    float *g = ddp_grad_buffer(m, i);
                    if (!p || !g) {
                        /* ddp_micro_end() returns why a buffer could not be had. */
                        rc = g ? -EFAULT : ddp_micro_end(m);
                        if (rc == 0) {
                            fail(c, "ddp_grad_buffer(%d) gave NULL, ddp_micro_end() 0", i);
                            rc = -EFAULT;
                        }
                        goto failed;
                    }
                    for (size_t j = 0; j < pcount[i]; j++)
                        g[j] += micro_grad(r, c->world, c->rank, n, k, p[j], poff[i] + j);
                    if (n == r->bad_step && k == 0 && c->rank == r->bad_rank && i == 2)
                        g[pcount[i] / 2] = r->bad_value;
                    if ((rc = ddp_grad_ready(m, i)) != 0)
                        goto failed;
                    if (n == r->fault_step && c->rank == c->victim && k == r->nmicro - 1) {
                        if (r->stall) {
                            /* Late, not dead: the survivors' timeout must end their wait. */
                            note(c, "stalling for %d ms in step %d's backward",
                                 c->timeout_ms + 3000, n);
                            struct timespec ts = {(c->timeout_ms + 3000) / 1000,
                                                  (c->timeout_ms + 3000) % 1000 * 1000000L};
                            nanosleep(&ts, NULL);
                            fflush(NULL);
                            _exit(0);
                        }
                        note(c, "dying by SIGKILL in step %d's backward", n);
                        raise(SIGKILL);
                    }
                }
                if ((rc = ddp_unit_release(m, u)) != 0)
                    goto failed;
            }
            if ((rc = ddp_micro_end(m)) != 0)
                goto failed;
        }
        ddp_step_info info;
        set_where("stage %d: ddp_step %d", r->stage, n);
        int64_t t0 = mono_now_ns();
        if ((rc = ddp_step(m, lr, &info)) != 0) {
            out->fail_ms = (double)(mono_now_ns() - t0) / 1e6;
            goto failed;
        }
        out->norm[n] = info.grad_norm;
        out->skipped[n] = info.skipped;
        out->clipped[n] = info.clipped;
        out->step_count = info.step;
    }
    if ((rc = read_params(m, r->stage, out->params)) != 0) {
        fail(c, "stage %d: reading the parameters: %d (%s): %s", r->stage, rc, ddp_strerror(rc),
             ddp_last_error(m));
        goto out;
    }
    ddp_memory_stats(m, &out->mem);
    goto out;
failed:
    out->rc = rc;
    snprintf(out->err, sizeof out->err, "%s", ddp_last_error(m));
out:
    set_where("stage %d: ddp_model_free", r->stage);
    ddp_model_free(m);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* The serial reference                                                                        */
/* ------------------------------------------------------------------------------------------ */

typedef struct ref_out {
    double params[1024];
    double norm[MAX_STEPS];
    int skipped[MAX_STEPS], clipped[MAX_STEPS];
} ref_out;

static void reference(const run_cfg *r, ref_out *ref)
{
    size_t n = total_elems;
    double p[1024], g[1024], m1[1024] = {0}, m2[1024] = {0};
    for (size_t e = 0; e < n; e++)
        p[e] = initial(e);
    int64_t t = 0;
    for (int s = 0; s < r->steps; s++) {
        double sq = 0;
        for (size_t e = 0; e < n; e++) {
            double sum = 0;
            for (int j = 0; j < GLOBAL_BATCH; j++)
                sum += p[e] - target((int64_t)s * GLOBAL_BATCH + j, e);
            g[e] = curvature(e) * sum / GLOBAL_BATCH;
            sq += g[e] * g[e];
        }
        double norm = sqrt(sq);
        ref->skipped[s] = s == r->bad_step;
        ref->norm[s] = ref->skipped[s] ? NAN : norm;
        ref->clipped[s] = 0;
        if (ref->skipped[s])
            continue;
        if (r->clip > 0 && r->clip / (norm + 1e-6) < 1) {
            ref->clipped[s] = 1;
            for (size_t e = 0; e < n; e++)
                g[e] *= r->clip / (norm + 1e-6);
        }
        t++;
        double lr = ddp_schedule_lr(&r->sched, s), wd = r->weight_decay;
        for (size_t e = 0; e < n; e++) {
            if (r->opt == DDP_SGD) {
                double d = g[e] + wd * p[e];
                if (r->momentum != 0) {
                    m1[e] = t == 1 ? d : r->momentum * m1[e] + d;
                    d = r->nesterov ? d + r->momentum * m1[e] : m1[e];
                }
                p[e] -= lr * d;
            } else if (r->opt == DDP_LION) {
                double b1 = 0.9f, b2 = 0.99f;
                double u = b1 * m1[e] + (1 - b1) * g[e];
                p[e] *= 1 - lr * wd;
                p[e] -= lr * ((u > 0) - (u < 0));
                m1[e] = b2 * m1[e] + (1 - b2) * g[e];
            } else {
                double b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
                p[e] *= 1 - lr * wd;
                m1[e] = b1 * m1[e] + (1 - b1) * g[e];
                m2[e] = b2 * m2[e] + (1 - b2) * g[e] * g[e];
                double mh = m1[e] / (1 - pow(b1, (double)t)), vh = m2[e] / (1 - pow(b2, (double)t));
                p[e] -= lr * mh / (sqrt(vh) + eps);
            }
        }
    }
    for (size_t e = 0; e < n; e++)
        ref->params[e] = p[e];
}

#define TOL 1e-5

/* Compares a run with the reference; returns the largest error over its bound. */
static double compare(ctx *c, const char *what, const run_cfg *r, const run_out *o,
                      const ref_out *ref)
{
    double worst = 0;
    size_t at = 0;
    for (size_t e = 0; e < total_elems; e++) {
        double bound = TOL * fmax(1.0, fabs(ref->params[e]));
        double ratio = fabs((double)o->params[e] - ref->params[e]) / bound;
        if (!(ratio <= worst)) {
            worst = ratio;
            at = e;
        }
    }
    CHECK(c, worst <= 1,
          "%s: parameter element %zu is %.9g, the reference %.9g (error %.3g x the bound)", what,
          at, (double)o->params[at], ref->params[at], worst);
    for (int s = 0; s < r->steps; s++) {
        CHECK(c, o->skipped[s] == ref->skipped[s], "%s: step %d skipped %d, the reference %d", what,
              s, o->skipped[s], ref->skipped[s]);
        if (ref->skipped[s]) {
            CHECK(c, !isfinite(o->norm[s]), "%s: step %d's norm %g should not be finite", what, s,
                  o->norm[s]);
            continue;
        }
        double ne = fabs(o->norm[s] - ref->norm[s]) / ref->norm[s];
        if (ne > c->max_norm_err)
            c->max_norm_err = ne;
        CHECK(c, ne <= TOL, "%s: step %d's gradient norm %.9g, the serial norm %.9g", what, s,
              o->norm[s], ref->norm[s]);
        CHECK(c, o->clipped[s] == ref->clipped[s], "%s: step %d clipped %d, the reference %d", what,
              s, o->clipped[s], ref->clipped[s]);
    }
    if (worst * TOL > c->max_err)
        c->max_err = worst * TOL;
    return worst;
}

static const char *opt_name(const run_cfg *r)
{
    if (r->opt != DDP_SGD)
        return ddp_optimizer_name(r->opt);
    return r->momentum == 0 ? "sgd" : r->nesterov ? "sgd-nesterov" : "sgd-momentum";
}

/* ------------------------------------------------------------------------------------------ */
/* Scenarios                                                                                   */
/* ------------------------------------------------------------------------------------------ */

static int scen_equiv(ctx *c)
{
    static run_out o;
    static ref_out ref;
    for (int stage = 0; stage <= 3; stage++) {
        for (int v = 0; v < 4; v++) {
            run_cfg r;
            cfg_defaults(&r);
            r.stage = stage;
            if (v == 0) { /* SGD, momentum, Nesterov, decay; clipped on most steps */
                r.momentum = 0.9f;
                r.nesterov = 1;
                r.weight_decay = 0.01f;
                r.clip = 25.0f;
            } else if (v == 1) { /* plain SGD, a clip that never bites */
                r.clip = 1000.0f;
                r.sched.lr = 0.2f;
            } else if (v == 2) { /* AdamW with decay, warmup then cosine, clipped */
                r.opt = DDP_ADAMW;
                r.weight_decay = 0.05f;
                r.clip = 25.0f;
                r.sched = (ddp_schedule){DDP_SCHED_COSINE, 0.05f, 2, 6, 0.005f};
            } else { /* Lion likewise, at a tenth of the learning rate */
                r.opt = DDP_LION;
                r.weight_decay = 0.05f;
                r.clip = 25.0f;
                r.sched = (ddp_schedule){DDP_SCHED_COSINE, 0.005f, 2, 6, 0.0005f};
            }
            char what[64];
            snprintf(what, sizeof what, "stage %d %s", stage, opt_name(&r));
            int rc = train(c, &r, &o);
            if (rc != 0) {
                fail(c, "%s: %s: %s", what, ddp_strerror(rc), o.err);
                return rc;
            }
            reference(&r, &ref);
            double w = compare(c, what, &r, &o, &ref);
            int nclip = 0;
            for (int s = 0; s < r.steps; s++)
                nclip += o.clipped[s];
            if (c->verbose || c->rank == 0)
                note(c, "%s: max error %.2e of the bound (%.1e), %d of %d steps clipped", what, w,
                     TOL, nclip, r.steps);
        }
    }
    return 0;
}

static int scen_accum(ctx *c)
{
    static run_out a, b;
    static ref_out ref;
    for (int stage = 0; stage <= 3; stage++) {
        run_cfg r;
        cfg_defaults(&r);
        r.stage = stage;
        r.momentum = 0.5f;
        r.nmicro = 4;
        int rc = train(c, &r, &a);
        if (rc == 0) {
            r.nmicro = 1;
            rc = train(c, &r, &b);
        }
        if (rc != 0) {
            fail(c, "stage %d: %s: %s", stage, ddp_strerror(rc), a.rc ? a.err : b.err);
            return rc;
        }
        reference(&r, &ref);
        char what[64];
        snprintf(what, sizeof what, "stage %d, 4 micro-steps", stage);
        compare(c, what, &r, &a, &ref);
        snprintf(what, sizeof what, "stage %d, 1 micro-step", stage);
        compare(c, what, &r, &b, &ref);
        double d = 0;
        for (size_t e = 0; e < total_elems; e++)
            d = fmax(d, fabs((double)a.params[e] - b.params[e]));
        CHECK(c, d <= TOL, "stage %d: 4 x b and 1 x 4b differ by %g", stage, d);
        if (c->rank == 0)
            note(c, "stage %d: 4 micro-steps x %d vs 1 x %d samples per rank: max difference %.2e",
                 stage, GLOBAL_BATCH / (4 * c->world), GLOBAL_BATCH / c->world, d);
    }
    return 0;
}

static int scen_nonfinite(ctx *c)
{
    static run_out o;
    static ref_out ref;
    for (int stage = 0; stage <= 3; stage++) {
        for (int v = 0; v < 2; v++) {
            run_cfg r;
            cfg_defaults(&r);
            r.stage = stage;
            r.opt = v ? DDP_ADAMW : DDP_SGD;
            r.momentum = 0.9f;
            r.sched.lr = v ? 0.01f : 0.1f;
            r.bad_step = 2;
            r.bad_rank = c->world - 1;
            r.bad_value = v ? INFINITY : NAN;
            int rc = train(c, &r, &o);
            if (rc != 0) {
                fail(c, "stage %d: %s: %s", stage, ddp_strerror(rc), o.err);
                return rc;
            }
            reference(&r, &ref);
            char what[64];
            snprintf(what, sizeof what, "stage %d %s, %s at step 2", stage, opt_name(&r),
                     v ? "inf" : "nan");
            compare(c, what, &r, &o, &ref);
            CHECK(c, o.step_count == r.steps - 1, "%s: %" PRId64 " steps counted, expected %d",
                  what, o.step_count, r.steps - 1);
        }
    }
    if (c->rank == 0)
        note(c, "a non-finite gradient on rank %d skipped the step on every rank, every stage",
             c->world - 1);
    return 0;
}

/* Expects rc == want and ddp_last_error(m) to contain every one of the strings. */
static void expect_err(ctx *c, ddp_model *m, int rc, int want, const char *what, ...)
{
    const char *le = ddp_last_error(m);
    bool ok = rc == want;
    va_list ap;
    va_start(ap, what);
    for (const char *s; (s = va_arg(ap, const char *)) != NULL;)
        ok = ok && strstr(le, s) != NULL;
    va_end(ap);
    CHECK(c, ok, "%s: got %d (%s), \"%s\"; expected %d (%s)", what, rc, ddp_strerror(rc), le, want,
          ddp_strerror(want));
    if (ok && c->verbose)
        note(c, "%s: \"%s\"", what, le);
}

/* One clean micro-step of backward for every parameter except `skip` (-1: none). */
static int backward(ddp_model *m, int skip, int twice)
{
    int rc = 0;
    for (int u = NUNITS - 1; u >= 0 && rc == 0; u--) {
        if ((rc = ddp_unit_gather(m, u)) != 0)
            return rc;
        for (int i = NPARAMS - 1; i >= 0; i--) {
            if (model[i].unit != u || i == skip)
                continue;
            float *g = ddp_grad_buffer(m, i);
            if (!g)
                return -EFAULT;
            g[0] += 1.0f;
            if ((rc = ddp_grad_ready(m, i)) != 0)
                return rc;
            if (i == twice)
                return ddp_grad_ready(m, i); /* the caller finishes the micro-step */
        }
        rc = ddp_unit_release(m, u);
    }
    return rc;
}

static int finish_backward(ddp_model *m, int from)
{
    /* After backward() returned at parameter `from` (marked twice): the rest of the model. */
    int u0 = model[from].unit, rc;
    for (int i = from - 1; i >= 0 && model[i].unit == u0; i--) {
        if (!ddp_grad_buffer(m, i))
            return -EFAULT;
        if ((rc = ddp_grad_ready(m, i)) != 0)
            return rc;
    }
    if ((rc = ddp_unit_release(m, u0)) != 0)
        return rc;
    for (int u = u0 - 1; u >= 0; u--) {
        if ((rc = ddp_unit_gather(m, u)) != 0)
            return rc;
        for (int i = NPARAMS - 1; i >= 0; i--)
            if (model[i].unit == u) {
                if (!ddp_grad_buffer(m, i))
                    return -EFAULT;
                if ((rc = ddp_grad_ready(m, i)) != 0)
                    return rc;
            }
        if ((rc = ddp_unit_release(m, u)) != 0)
            return rc;
    }
    return 0;
}

/* The parameters agree on every rank (a max and a min allreduce of them). */
static void expect_replicated(ctx *c, ddp_model *m, int stage, const char *what)
{
    static float p[1024], hi[1024], lo[1024];
    int rc = read_params(m, stage, p);
    CHECK(c, rc == 0, "%s: reading the parameters: %d", what, rc);
    if (rc != 0)
        return;
    coll_allreduce(c->comm, p, hi, total_elems, COLL_F32, COLL_MAX);
    coll_allreduce(c->comm, p, lo, total_elems, COLL_F32, COLL_MIN);
    CHECK(c, memcmp(hi, lo, total_elems * sizeof(float)) == 0,
          "%s: the parameters differ across ranks", what);
}

static int scen_misuse(ctx *c)
{
    for (int stage = 0; stage <= 3; stage++) {
        ddp_options o;
        ddp_options_init(&o);
        o.zero_stage = stage;
        o.first_bucket_bytes = 256;
        o.bucket_bytes = 512;
        o.pool_slots = 3;
        o.momentum = 0.9f;
        ddp_model *m;
        int rc = ddp_model_create(c->comm, &o, &m);
        if (rc == 0)
            rc = build_model(m, NULL, 0);
        /* Before commit: no data, no micro-step. */
        if (rc == 0) {
            CHECK(c, ddp_param_data(m, 0) == NULL, "stage %d: data before commit", stage);
            expect_err(c, m, ddp_micro_begin(m, 1), -EINVAL, "micro-step before commit",
                       "not committed", NULL);
            rc = ddp_model_commit(m, init_fn, NULL);
        }
        if (rc != 0) {
            fail(c, "stage %d: setting up: %s: %s", stage, ddp_strerror(rc), ddp_last_error(m));
            ddp_model_free(m);
            return rc;
        }
        char what[96];
        set_where("misuse stage %d", stage);
        expect_err(c, m, ddp_unit_add(m, "late"), -EINVAL, "ddp_unit_add after commit", "committed",
                   NULL);
        expect_err(c, m, ddp_model_commit(m, NULL, NULL), -EINVAL, "commit twice", "already", NULL);
        CHECK(c, ddp_grad_buffer(m, 0) == NULL, "stage %d: a gradient buffer outside a micro-step",
              stage);
        expect_err(c, m, ddp_micro_end(m), -EINVAL, "micro_end without begin", "no micro-step",
                   NULL);

        /* 1. Marked twice (mid.weight): -EINVAL naming it, then the micro-step goes on. */
        snprintf(what, sizeof what, "stage %d: marked twice", stage);
        rc = ddp_micro_begin(m, 1);
        CHECK(c, rc == 0, "%s: micro_begin %d", what, rc);
        expect_err(c, m, ddp_micro_begin(m, 1), -EINVAL, "micro_begin twice", "not ended", NULL);
        rc = backward(m, -1, 2);
        expect_err(c, m, rc, -EINVAL, what, "mid.weight", "twice", NULL);
        /* 2. A gradient asked for after it was marked: NULL, and micro_end says why. */
        CHECK(c, ddp_grad_buffer(m, 2) == NULL, "%s: a buffer after the mark", what);
        expect_err(c, m, -EINVAL, -EINVAL, "buffer after mark", "mid.weight", "already marked",
                   NULL);
        if ((rc = finish_backward(m, 2)) != 0) {
            fail(c, "%s: finishing backward: %s: %s", what, ddp_strerror(rc), ddp_last_error(m));
            ddp_model_free(m);
            return rc;
        }
        expect_err(c, m, ddp_micro_end(m), -EINVAL, "micro_end after a buffer after its mark",
                   "mid.weight", NULL);
        rc = ddp_step(m, 0.1f, NULL);
        CHECK(c, rc == 0, "%s: the step after: %d (%s): %s", what, rc, ddp_strerror(rc),
              ddp_last_error(m));

        /* 3. A parameter not marked (embed.weight, in the group reduced last): micro_end
         * names it on every rank. */
        snprintf(what, sizeof what, "stage %d: not marked", stage);
        ddp_micro_begin(m, 1);
        rc = backward(m, 0, -1);
        CHECK(c, rc == 0, "%s: backward %d: %s", what, rc, ddp_last_error(m));
        expect_err(c, m, ddp_micro_end(m), -EINVAL, what, "embed.weight", "not marked", NULL);
        rc = ddp_step(m, 0.1f, NULL);
        CHECK(c, rc == 0, "%s: the step after: %d (%s): %s", what, rc, ddp_strerror(rc),
              ddp_last_error(m));

        /* 4. A step without a synchronising micro-step, then a micro-step after a sync one. */
        snprintf(what, sizeof what, "stage %d: step without sync", stage);
        expect_err(c, m, ddp_step(m, 0.1f, NULL), -EINVAL, what, "sync", NULL);
        ddp_micro_begin(m, 0);
        rc = backward(m, -1, -1);
        CHECK(c, rc == 0 && ddp_micro_end(m) == 0, "%s: a no-sync micro-step: %s", what,
              ddp_last_error(m));
        expect_err(c, m, ddp_step(m, 0.1f, NULL), -EINVAL, what, "sync", NULL);
        ddp_micro_begin(m, 1);
        rc = backward(m, -1, -1);
        CHECK(c, rc == 0 && ddp_micro_end(m) == 0, "%s: a sync micro-step: %s", what,
              ddp_last_error(m));
        expect_err(c, m, ddp_micro_begin(m, 1), -EINVAL, "micro_begin after a sync micro-step",
                   "ddp_step", NULL);
        rc = ddp_step(m, 0.1f, NULL);
        CHECK(c, rc == 0, "%s: the step after: %d (%s)", what, rc, ddp_last_error(m));

        /* 5. Bad indices; stage 3: releasing a unit not gathered. */
        expect_err(c, m, ddp_grad_ready(m, NPARAMS), -EINVAL, "bad index", "no parameter", NULL);
        expect_err(c, m, ddp_unit_gather(m, NUNITS), -EINVAL, "bad unit", "no unit", NULL);
        if (stage == 3) {
            expect_err(c, m, ddp_unit_release(m, 1), -EINVAL, "release without gather", "mid",
                       "not gathered", NULL);
            CHECK(c, ddp_param_data(m, 2) == NULL, "stage 3: data outside the window");
        }
        CHECK(c, ddp_step(m, NAN, NULL) == -EINVAL, "stage %d: a NaN learning rate", stage);
        expect_replicated(c, m, stage, what);
        ddp_model_free(m);
    }
    /* Bad options. */
    ddp_options o;
    ddp_options_init(&o);
    o.zero_stage = 4;
    ddp_model *m = NULL;
    CHECK(c,
          ddp_model_create(c->comm, &o, &m) == -EINVAL && m == NULL &&
              strstr(ddp_last_error(NULL), "zero_stage"),
          "zero_stage 4: \"%s\"", ddp_last_error(NULL));
    ddp_options_init(&o);
    o.nesterov = 1;
    CHECK(c,
          ddp_model_create(c->comm, &o, &m) == -EINVAL && strstr(ddp_last_error(NULL), "Nesterov"),
          "Nesterov without momentum: \"%s\"", ddp_last_error(NULL));
    if (c->rank == 0)
        note(c, "every misuse answered -EINVAL naming what, at every stage; ranks stayed in step");
    return 0;
}

static int scen_layout(ctx *c)
{
    if (c->world < 2) {
        note(c, "layout needs 2 ranks or more: skipped");
        return 0;
    }
    int odd = c->world - 1;
    for (int v = 0; v < 3; v++) {
        ddp_options o;
        ddp_options_init(&o);
        if (v == 2 && c->rank == odd)
            o.zero_stage = 2;
        ddp_model *m;
        int rc = ddp_model_create(c->comm, &o, &m);
        if (rc == 0)
            rc = build_model(m, v == 0 && c->rank == odd ? (int64_t[]){5, 30} : NULL,
                             v == 1 && c->rank == odd);
        if (rc != 0) {
            fail(c, "registering: %s", ddp_last_error(m));
            ddp_model_free(m);
            return rc;
        }
        set_where("layout %d", v);
        rc = ddp_model_commit(m, init_fn, NULL);
        const char *le = ddp_last_error(m);
        const char *what = v == 0   ? "a different shape"
                           : v == 1 ? "an extra parameter"
                                    : "another zero_stage";
        bool ok = rc == -EINVAL && names_rank(le, odd);
        if (v == 0)
            ok = ok && strstr(le, "parameter 5") != NULL;
        if (v == 1)
            ok = ok && strstr(le, "8 parameters") != NULL;
        if (v == 2)
            ok = ok && strstr(le, "options differ") != NULL;
        CHECK(c, ok, "%s on rank %d: commit returned %d, \"%s\"", what, odd, rc, le);
        if (ok && c->rank == 0)
            note(c, "%s on rank %d: \"%s\"", what, odd, le);
        CHECK(c, ddp_micro_begin(m, 1) != 0, "a model whose commit failed is usable");
        ddp_model_free(m);
    }
    return 0;
}

static int scen_memory(ctx *c)
{
    static run_out o;
    size_t psi = total_elems, n = (size_t)c->world, slack = NPARAMS * (n - 1);
    for (int v = 0; v < 4; v++) {
        /* bytes of optimizer state per element: SGD 0, with momentum 4, AdamW 8, Lion 4 */
        size_t k = v == 0 ? 0 : v == 2 ? 8 : 4;
        size_t base[3] = {0};                   /* stage 0's param, grad, optimizer bytes */
        for (int stage = 0; stage <= 3; stage++) {
            run_cfg r;
            cfg_defaults(&r);
            r.stage = stage;
            r.steps = 1;
            r.opt = v == 2 ? DDP_ADAMW : v == 3 ? DDP_LION : DDP_SGD;
            r.momentum = v == 1 ? 0.9f : 0;
            r.pool_slots = 3;
            int rc = train(c, &r, &o);
            if (rc != 0) {
                fail(c, "stage %d: %s: %s", stage, ddp_strerror(rc), o.err);
                return rc;
            }
            const ddp_memory *mm = &o.mem;
            if (stage == 0) {
                base[0] = mm->param_bytes;
                base[1] = mm->grad_bytes;
                base[2] = mm->optimizer_bytes;
                /* 4Ψ, 4Ψ and KΨ, Ψ padded up to a multiple of N per bucket. */
                CHECK(c, base[0] >= 4 * psi && base[0] <= 4 * (psi + slack),
                      "stage 0 params %zu bytes for %zu elements", base[0], psi);
                CHECK(c, base[1] == base[0] && base[2] == k * base[0] / 4 && mm->pool_bytes == 0,
                      "stage 0: grads %zu, optimizer %zu, pool %zu for params %zu", base[1],
                      base[2], mm->pool_bytes, base[0]);
            }
            /* The ZeRO paper's model states: stage 1 shards K, 2 also the grads, 3 everything.
             * The buckets of stages 0-2 and the units of stage 3 pad differently: bounds. */
            size_t P = mm->param_bytes, G = mm->grad_bytes, O = mm->optimizer_bytes;
            bool ok = true;
            switch (stage) {
            case 1:
                ok = P == base[0] && G == base[1] && O * n == base[2] && mm->pool_bytes == 0;
                break;
            case 2:
                ok = P == base[0] && G * n == base[1] && O * n == base[2] && mm->pool_bytes > 0;
                break;
            case 3:
                ok = P * n >= 4 * psi && P * n <= 4 * (psi + slack) && G == P && O == k * P / 4 &&
                     mm->pool_bytes > 0;
                break;
            }
            CHECK(c, ok && mm->model_state_bytes == P + G + O,
                  "stage %d: params %zu, grads %zu, optimizer %zu, pool %zu, model state %zu "
                  "bytes (stage 0: %zu, %zu, %zu)",
                  stage, P, G, O, mm->pool_bytes, mm->model_state_bytes, base[0], base[1], base[2]);
            if (c->rank == 0)
                note(c,
                     "%-12s stage %d: params %6zu  grads %6zu  optimizer %6zu  model states %6zu "
                     " pools %6zu bytes (Ψ = %zu, N = %d)",
                     opt_name(&r), stage, P, G, O, mm->model_state_bytes, mm->pool_bytes, psi,
                     c->world);
        }
    }
    return 0;
}

static int scen_trace(ctx *c)
{
    static run_out o;
    for (int stage = 0; stage <= 3; stage++) {
        run_cfg r;
        cfg_defaults(&r);
        r.stage = stage;
        r.steps = 2;
        int rc = train(c, &r, &o);
        if (rc != 0) {
            fail(c, "stage %d: %s: %s", stage, ddp_strerror(rc), o.err);
            return rc;
        }
        /* Per sync micro-step: launches before its BACKWARD_END, in launch order. */
        int ngroups = stage == 3 ? NUNITS : 5, launches = 0, early = 0, order_ok = 1, gathers = 0,
            sync_micro = 0, micro = 0;
        int64_t t_first_launch = -1, t_end = -1;
        int expect = 0;
        for (int i = 0; i < o.nevents; i++) {
            const event *e = &o.events[i];
            switch (e->ev) {
            case DDP_EV_BUCKET_LAUNCH: {
                int want = stage == 3 ? ngroups - 1 - expect : expect;
                order_ok &= e->index == want;
                expect = (expect + 1) % ngroups;
                launches++;
                early++;
                if (t_first_launch < 0)
                    t_first_launch = e->t;
                break;
            }
            case DDP_EV_BACKWARD_END:
                micro++;
                /* stages 0-1 launch on the last micro-step only; 2-3 on every one. */
                if (stage >= 2 || micro % r.nmicro == 0) {
                    sync_micro++;
                    CHECK(c, early >= 1, "stage %d: no bucket launched before backward end %d",
                          stage, micro);
                    if (t_end < 0)
                        t_end = e->t;
                }
                early = 0;
                break;
            case DDP_EV_GATHER_LAUNCH:
                gathers++;
                break;
            default:
                break;
            }
        }
        CHECK(c, order_ok, "stage %d: buckets launched out of order", stage);
        CHECK(c, launches == ngroups * sync_micro, "stage %d: %d launches for %d micro-steps",
              stage, launches, sync_micro);
        CHECK(c, (stage == 3) == (gathers > 0), "stage %d: %d gathers", stage, gathers);
        if (c->rank == 0)
            note(c,
                 "stage %d: %d %s, first launch %.3f ms before the end of backward; %d launches, "
                 "%d gathers",
                 stage, ngroups, stage == 3 ? "units" : "buckets",
                 (double)(t_end - t_first_launch) / 1e6, launches, gathers);
    }
    return 0;
}

/*
 * The victim dies (kill) or stalls past the timeout (stall) in step 2 of a run at --stage; every
 * survivor's libddp call must fail naming it: COLL_EREMOTE or -ETIMEDOUT after a death, found
 * within the timeout (a death on this host is seen at once); -ETIMEDOUT after a stall, no sooner
 * than 0.9 of the timeout and within it plus 5 s. One stage per run: the communicator fails.
 */
static int fault(ctx *c, bool stall)
{
    if (c->world < 2 || c->victim >= c->world) {
        note(c, "%s needs 2 ranks or more and a victim among them: skipped", c->scenario);
        return 0;
    }
    static run_out o;
    if (c->rank != c->victim)
        signal(SIGTERM, SIG_IGN); /* ddprun's teardown must not stop us before we report */
    run_cfg r;
    cfg_defaults(&r);
    r.stage = c->stage;
    r.fault_step = 2;
    r.stall = stall;
    int64_t t0 = mono_now_ns();
    int rc = train(c, &r, &o);
    double ms = (double)(mono_now_ns() - t0) / 1e6, limit = c->timeout_ms + 5000;
    /* The victim never gets here. */
    bool ok = (rc == -ETIMEDOUT || (!stall && rc == COLL_EREMOTE)) &&
              names_rank(o.err, c->victim) && ms <= limit && (!stall || ms >= 0.9 * c->timeout_ms);
    CHECK(c, ok,
          "stage %d: expected %s naming rank %d within %.0f ms; got %d (%s) after %.0f ms: "
          "\"%s\"",
          r.stage, stall ? "-ETIMEDOUT" : "COLL_EREMOTE or -ETIMEDOUT", c->victim, limit, rc,
          ddp_strerror(rc), ms, o.err);
    if (ok)
        note(c, "stage %d: %s after %.0f ms (timeout %d ms): \"%s\"", r.stage, ddp_strerror(rc), ms,
             c->timeout_ms, o.err);
    return 0;
}

static int scen_kill(ctx *c)
{
    return fault(c, false);
}

static int scen_stall(ctx *c)
{
    return fault(c, true);
}

/* ------------------------------------------------------------------------------------------ */
/* Main                                                                                        */
/* ------------------------------------------------------------------------------------------ */

typedef struct scenario {
    const char *name;
    int (*fn)(ctx *);
} scenario;

static const scenario scenarios[] = {
    {"equiv", scen_equiv},   {"accum", scen_accum},   {"nonfinite", scen_nonfinite},
    {"misuse", scen_misuse}, {"layout", scen_layout}, {"memory", scen_memory},
    {"trace", scen_trace},   {"kill", scen_kill},     {"stall", scen_stall},
};
#define NSCEN (sizeof scenarios / sizeof scenarios[0])

static void usage(FILE *f)
{
    fprintf(f, "usage: ddp-serial [--timeout-ms N] [--victim R] [--stage S] [--watchdog-s N] "
               "[--verbose] "
               "SCENARIO...\nscenarios:");
    for (size_t i = 0; i < NSCEN; i++)
        fprintf(f, " %s", scenarios[i].name);
    fprintf(f, "\n");
}

int main(int argc, char **argv)
{
    ctx c = {.timeout_ms = 60000, .victim = -1, .watchdog_s = 120};
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        int rc = 0;
        if (strcmp(a, "--verbose") == 0) {
            c.verbose = true;
        } else if (i + 1 < argc && strcmp(a, "--timeout-ms") == 0) {
            rc = cli_parse_int(a, argv[++i], 1, 3600000, &c.timeout_ms);
        } else if (i + 1 < argc && strcmp(a, "--victim") == 0) {
            rc = cli_parse_int(a, argv[++i], 0, 1 << 20, &c.victim);
        } else if (i + 1 < argc && strcmp(a, "--stage") == 0) {
            rc = cli_parse_int(a, argv[++i], 0, 3, &c.stage);
        } else if (i + 1 < argc && strcmp(a, "--watchdog-s") == 0) {
            rc = cli_parse_int(a, argv[++i], 1, 3600, &c.watchdog_s);
        } else if (strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
        if (cli_report(stderr, "ddp-serial", rc) < 0)
            return 2;
    }
    if (i >= argc) {
        usage(stderr);
        return 2;
    }
    for (int k = i; k < argc; k++) {
        bool known = false;
        for (size_t s = 0; s < NSCEN; s++)
            known |= strcmp(argv[k], scenarios[s].name) == 0;
        if (!known) {
            fprintf(stderr, "ddp-serial: unknown scenario %s\n", argv[k]);
            return 2;
        }
    }
    model_init_tables();
    rdzv_env env;
    if (rdzv_env_read(&env) < 0 || env.standalone) {
        /* librendezvous' sentence names the variable at fault, or says that none is set. */
        fprintf(stderr, "ddp-serial: %s\n", rdzv_client_last_error(NULL));
        return 2;
    }
    c.rank = env.rank;
    c.world = env.world_size;
    if (c.victim < 0)
        c.victim = c.world - 1;
    if (rdzv_env_prefix(&env, "ddp-serial", c.attempt, sizeof c.attempt) < 0) {
        fprintf(stderr, "ddp-serial: the run id makes too long a key prefix\n");
        return 2;
    }
    g_rank = c.rank;
    g_watchdog_s = c.watchdog_s;
    set_where("connecting to the store");
    pthread_t wd;
    pthread_create(&wd, NULL, watchdog, NULL);
    pthread_detach(wd);
    rdzv_client_options so;
    rdzv_client_options_init(&so);
    so.timeout_ms = 120000;
    int rc = rdzv_env_connect(&env, &so, &c.store);
    if (rc < 0) {
        fprintf(stderr, "ddp-serial: rank %d: store: %s\n", c.rank, rdzv_client_last_error(NULL));
        return 2;
    }
    int status = 0;
    for (int k = i; k < argc; k++) {
        c.scenario = argv[k];
        snprintf(c.prefix, sizeof c.prefix, "%s/%s", c.attempt, c.scenario);
        c.checks = c.failures = c.reports = 0;
        c.max_err = c.max_norm_err = 0;
        coll_options co;
        coll_options_init(&co);
        co.timeout_ms = c.timeout_ms;
        set_where("coll_comm_init %s", c.prefix);
        int64_t t0 = mono_now_ns();
        rc = coll_comm_init(c.store, c.prefix, c.rank, c.world, COLL_BACKEND_CPU, -1, &co, &c.comm);
        if (rc < 0) {
            fail(&c, "coll_comm_init: %s: %s", coll_strerror(rc), coll_last_error(NULL));
        } else {
            for (size_t s = 0; s < NSCEN; s++)
                if (strcmp(c.scenario, scenarios[s].name) == 0)
                    rc = scenarios[s].fn(&c);
            set_where("coll_comm_close %s", c.prefix);
            coll_comm_close(c.comm);
        }
        bool ok = rc == 0 && c.failures == 0;
        char extra[128] = "";
        if (c.max_err > 0)
            snprintf(extra, sizeof extra, "; max parameter error %.2e, norm %.2e", c.max_err,
                     c.max_norm_err);
        printf("ddp-serial: rank %d/%d %s: %s (%ld checks, %ld failed, %.2f s%s)\n", c.rank,
               c.world, c.scenario, ok ? "PASS" : "FAIL", c.checks, c.failures,
               (double)(mono_now_ns() - t0) / 1e9, extra);
        fflush(stdout);
        if (!ok) {
            status = 1;
            break;
        }
    }
    rdzv_client_close(c.store);
    return status;
}
