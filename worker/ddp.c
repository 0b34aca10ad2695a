/*
 * libddp's runtime: the model (parameters registered by the caller), its arenas, and the
 * training step for every ZeRO stage behind one set of calls (ddp.h describes the loop).
 *
 * Memory, with Ψ the arena's elements (padding included) and S = Ψ / world the owned part:
 *   stage 0: param[Ψ], grad[Ψ], optimizer state on Ψ;
 *   stage 1: param[Ψ], grad[Ψ], optimizer state on S (compact, plan.shard_offset);
 *   stage 2: param[Ψ], grad[S] (accumulated owned parts), a pool of staging slots;
 *   stage 3: param[S], grad[S], a pool of gathered units and a pool of staging slots.
 *
 * Invariants:
 *  - collectives are issued in the same order on every rank, because every decision that
 *    issues one depends only on the caller's calls (which every rank makes alike), never on
 *    when a request completes: buckets launch strictly in bucket order as they complete (units,
 *    at stage 3, in reverse unit order: the order backward completes them);
 *    a stage 3 prefetch happens when a gathered-unit slot is free, which only releases change;
 *  - a staging slot or a gathered unit is reused only after its request completed;
 *  - the padding at the end of each group stays zero in parameters, gradients and state;
 *  - after any failure of a collective the model is broken: every later call returns the
 *    same code, so no rank issues collectives its peers will never match;
 *  - misuse that would leave one rank's collectives out of step (a gradient not marked, or
 *    marked twice) breaks the model likewise and aborts the communicator, so that the peers
 *    fail at once naming this rank rather than at the timeout (misuse()).
 *
 * Not here: checkpoints live in ckpt.c (this file only waits, before the optimizer, for an
 * asynchronous save's writer to have copied the state, polls the save after each step, through
 * ddp_internal.h, and joins its writer at free); device (CUDA) memory has its own issue; the
 * ops are f32 on the host. Nothing is printed: the log hook gets skipped steps, the trace hook
 * timestamps.
 */
#include "ddp.h"

#include "ddp_internal.h"

#include "monoclock.h"
#include "optim.h"
#include "plan.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DDP_MAX_DIMS 8
#define NAME_BYTES 128

typedef struct param {
    char name[NAME_BYTES];
    int unit;
    int ndim;
    int64_t shape[DDP_MAX_DIMS];
    coll_dtype dtype;
    size_t count;
} param;

/* A buffer of the size of the largest group and what occupies it. */
typedef struct slot {
    float *buf;
    int group;         /* -1: free */
    coll_request *req; /* reduce-scatter (gradients) or allgather (units) in flight */
    uint64_t seq;      /* issue order, to wait for the oldest first */
} slot;

enum state { BUILDING, READY, BROKEN };

struct ddp_model {
    coll_comm *comm;
    ddp_options o;
    int rank, world;
    enum state state;
    int broken_rc;

    param *params;
    int nparams, cap_params;
    char (*unit_names)[NAME_BYTES];
    int nunits, cap_units;

    ddp__plan plan;
    float *param;     /* stages 0-2: arena; stage 3: owned parts (compact) */
    float *grad;      /* stages 0-1: arena; stages 2-3: owned parts (compact) */
    float *opt1;      /* momentum, or AdamW's m */
    float *opt2;      /* AdamW's v */
    size_t opt_elems; /* elements of each optimizer state array */

    /* Per group: how many of its parameters are ready, its request and its staging slot. */
    int *ready;
    coll_request **req;
    int *grad_slot;
    char *marked;    /* per parameter: gradient marked ready in this micro-step */
    char *done_seen; /* per group: its reduction's completion was traced */
    int next_launch;

    slot *gslots, *uslots; /* gradient staging (stages 2-3); gathered units (stage 3) */
    int ngslots, nuslots;
    int *unit_slot; /* stage 3: the uslot holding unit u, or -1 */
    int last_gathered;
    int direction; /* +1 forward, -1 backward */
    uint64_t seq;

    bool in_micro, sync, synced;
    int64_t micro;
    int64_t steps;              /* optimizer steps taken (skipped ones excluded) */
    int64_t attempted;          /* ddp_step() calls, for the trace */
    ddp_step_info last;         /* the last step's info (ddp_step_info_get()) */
    struct ddp__ckpt_state *ck; /* checkpoints (ckpt.c): NULL until the first save */
    char err[512];
};

static _Thread_local char create_err[256];

/* ------------------------------------------------------------------------------------------ */
/* Errors and small helpers                                                                    */
/* ------------------------------------------------------------------------------------------ */

const char *ddp_strerror(int err)
{
    return coll_strerror(err);
}

const char *ddp_last_error(const ddp_model *m)
{
    return m ? m->err : create_err;
}

static int fail(ddp_model *m, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(ddp_model *m, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->err, sizeof m->err, fmt, ap);
    va_end(ap);
    return rc;
}

/* The model is broken from now on: every call returns rc; m->err, already written, is logged. */
static int break_model(ddp_model *m, int rc)
{
    m->state = BROKEN;
    m->broken_rc = rc;
    if (m->o.log)
        m->o.log(m->o.log_arg, COLL_LOG_ERROR, m->err);
    return rc;
}

/* A collective failed: the model is broken from now on, and says who was to blame. */
static int coll_failed(ddp_model *m, int rc, const char *what)
{
    if (m->state != BROKEN) {
        int culprit = coll_comm_failed_rank(m->comm);
        char who[48] = "";
        if (culprit >= 0)
            snprintf(who, sizeof who, " (rank %d)", culprit);
        fail(m, rc, "%s failed%s: %s: %s", what, who, coll_strerror(rc), coll_last_error(m->comm));
        break_model(m, rc);
    }
    return m->broken_rc;
}

/*
 * Misuse that leaves this rank's collectives out of step with its peers' (a gradient never
 * marked, whose bucket this rank then never reduces; one marked twice): the model breaks as
 * after a failed collective, with -EINVAL and the message, and the communicator is aborted, so
 * that peers waiting in a collective, or issuing their next one, fail at once with
 * COLL_EREMOTE naming this rank instead of waiting out the timeout. Detecting the misuse needs
 * no communication, so the calls that are used correctly pay nothing for it.
 */
static int misuse(ddp_model *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int misuse(ddp_model *m, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(m->err, sizeof m->err, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof m->err)
        snprintf(m->err + n, sizeof m->err - (size_t)n,
                 "; the communicator is aborted, so the other ranks fail naming rank %d", m->rank);
    (void)coll_comm_abort(m->comm);
    return break_model(m, -EINVAL);
}

static void trace(ddp_model *m, ddp_event ev, int index)
{
    if (m->o.trace)
        m->o.trace(m->o.trace_arg, ev, index, rdzv__now_ns());
}

/*
 * The group that backward completes k-th: buckets are numbered in that order already; units
 * (stage 3) are in forward order, so backward completes the last one first.
 */
static int launch_group(const ddp_model *m, int k)
{
    return m->o.zero_stage == 3 ? m->plan.ngroups - 1 - k : k;
}

/* Traces group g's reduction as done, once per micro-step. */
static void trace_done(ddp_model *m, int g)
{
    if (!m->done_seen[g]) {
        m->done_seen[g] = 1;
        trace(m, DDP_EV_BUCKET_DONE, g);
    }
}

/*
 * With a trace hook, notes the launched reductions that have completed by now (coll_test does
 * not release them), so that the trace shows when they finished, not when the step waited.
 */
static void poll_done(ddp_model *m)
{
    for (int k = 0; m->o.trace && k < m->next_launch; k++) {
        int g = launch_group(m, k);
        coll_request *r = m->o.zero_stage < 2    ? m->req[g]
                          : m->grad_slot[g] >= 0 ? m->gslots[m->grad_slot[g]].req
                                                 : NULL;
        bool done = false;
        if (r && !m->done_seen[g] && coll_test(r, &done) >= 0 && done)
            trace_done(m, g);
    }
}

/* The calls that run collectives refuse a broken or uncommitted model. */
static int usable(ddp_model *m)
{
    if (!m)
        return -EINVAL;
    if (m->state == BROKEN)
        return m->broken_rc;
    if (m->state != READY)
        return fail(m, -EINVAL, "the model is not committed (ddp_model_commit)");
    return 0;
}

static const ddp__group *group_of(const ddp_model *m, int p)
{
    return &m->plan.groups[m->plan.param_group[p]];
}

/* ------------------------------------------------------------------------------------------ */
/* Building                                                                                    */
/* ------------------------------------------------------------------------------------------ */

void ddp_options_init(ddp_options *o)
{
    memset(o, 0, sizeof *o);
    o->first_bucket_bytes = 1u << 20;
    o->bucket_bytes = 25u << 20;
    o->pool_slots = 4;
    o->optimizer = DDP_SGD;
    o->beta1 = 0.9f;
    o->beta2 = 0.999f;
    o->eps = 1e-8f;
    o->device = -1;
}

int ddp_model_create(coll_comm *comm, const ddp_options *opts, ddp_model **out)
{
    create_err[0] = 0;
    ddp_options o;
    if (opts)
        o = *opts;
    else
        ddp_options_init(&o);
    const char *bad = !comm || !out                          ? "NULL communicator or out"
                      : o.zero_stage < 0 || o.zero_stage > 3 ? "zero_stage must be 0..3"
                      : o.first_bucket_bytes == 0 || o.bucket_bytes == 0
                          ? "bucket sizes must be > 0"
                      : o.pool_slots < 2 ? "pool_slots must be >= 2"
                      : o.optimizer != DDP_SGD && o.optimizer != DDP_ADAMW ? "unknown optimizer"
                      : o.nesterov && o.momentum <= 0 ? "Nesterov needs momentum > 0"
                      : o.precision != DDP_PREC_F32 && o.precision != DDP_PREC_BF16
                          ? "precision must be DDP_PREC_F32 or DDP_PREC_BF16"
                      : o.reduce_dtype != COLL_F32 && o.reduce_dtype != COLL_BF16
                          ? "reduce_dtype must be COLL_F32 or COLL_BF16"
                          : NULL;
    if (bad) {
        snprintf(create_err, sizeof create_err, "ddp_model_create: %s", bad);
        return -EINVAL;
    }
    if (o.precision == DDP_PREC_BF16 || o.reduce_dtype == COLL_BF16) { /* the next commit */
        snprintf(create_err, sizeof create_err, "ddp_model_create: bf16 is not built yet");
        return -ENOTSUP;
    }
    if (o.device >= 0) {
        snprintf(create_err, sizeof create_err,
                 "ddp_model_create: device memory is not built yet (device %d)", o.device);
        return -ENOTSUP;
    }
    ddp_model *m = calloc(1, sizeof *m);
    if (!m)
        return -ENOMEM;
    m->comm = comm;
    m->o = o;
    m->rank = coll_comm_rank(comm);
    m->world = coll_comm_size(comm);
    m->last_gathered = -1;
    m->direction = 1;
    *out = m;
    return 0;
}

static void free_slots(slot *s, int n)
{
    for (int i = 0; s && i < n; i++) {
        if (s[i].req)
            (void)coll_wait(s[i].req);
        free(s[i].buf);
    }
    free(s);
}

void ddp_model_free(ddp_model *m)
{
    if (!m)
        return;
    ddp__ckpt_state_free(m->ck);
    /* Requests still in flight (after a failure, say) are waited for: each is released once. */
    for (int g = 0; m->req && g < m->plan.ngroups; g++)
        if (m->req[g])
            (void)coll_wait(m->req[g]);
    free_slots(m->gslots, m->ngslots);
    free_slots(m->uslots, m->nuslots);
    ddp__plan_free(&m->plan);
    free(m->params);
    free(m->unit_names);
    free(m->param);
    free(m->grad);
    free(m->opt1);
    free(m->opt2);
    free(m->ready);
    free(m->req);
    free(m->grad_slot);
    free(m->marked);
    free(m->done_seen);
    free(m->unit_slot);
    free(m);
}

static bool good_name(const char *name)
{
    return name && *name && strlen(name) < NAME_BYTES;
}

int ddp_unit_add(ddp_model *m, const char *name)
{
    if (!m || m->state != BUILDING || !good_name(name))
        return m ? fail(m, -EINVAL, "ddp_unit_add: bad name, or the model is committed") : -EINVAL;
    if (m->nunits == m->cap_units) {
        int cap = m->cap_units ? 2 * m->cap_units : 16;
        void *p = realloc(m->unit_names, (size_t)cap * sizeof *m->unit_names);
        if (!p)
            return -ENOMEM;
        m->unit_names = p;
        m->cap_units = cap;
    }
    snprintf(m->unit_names[m->nunits], NAME_BYTES, "%s", name);
    return m->nunits++;
}

int ddp_param_add(ddp_model *m, int unit, const char *name, int ndim, const int64_t *shape,
                  coll_dtype dtype)
{
    if (!m)
        return -EINVAL;
    if (m->state != BUILDING || unit != m->nunits - 1 || unit < 0 || !good_name(name) || ndim < 1 ||
        ndim > DDP_MAX_DIMS || !shape)
        return fail(m, -EINVAL,
                    "ddp_param_add(%s): bad argument (the unit must be the latest added, 1..%d "
                    "dimensions, the model not committed)",
                    name ? name : "NULL", DDP_MAX_DIMS);
    if (dtype != COLL_F32)
        return fail(m, -ENOTSUP, "ddp_param_add(%s): dtype %s: only f32 is implemented", name,
                    coll_dtype_name(dtype));
    size_t count = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] <= 0 || (uint64_t)shape[d] > (SIZE_MAX >> 4) / count)
            return fail(m, -EINVAL, "ddp_param_add(%s): dimension %d is %" PRId64, name, d,
                        shape[d]);
        count *= (size_t)shape[d];
    }
    if (m->nparams == m->cap_params) {
        int cap = m->cap_params ? 2 * m->cap_params : 32;
        void *p = realloc(m->params, (size_t)cap * sizeof *m->params);
        if (!p)
            return -ENOMEM;
        m->params = p;
        m->cap_params = cap;
    }
    param *p = &m->params[m->nparams];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->unit = unit;
    p->ndim = ndim;
    memcpy(p->shape, shape, (size_t)ndim * sizeof *shape);
    p->dtype = dtype;
    p->count = count;
    return m->nparams++;
}

/* FNV-1a over the parameter's unit, name, shape and dtype: what every rank must agree on. */
static uint64_t param_hash(const param *p)
{
    uint64_t h = 1469598103934665603ull;
#define MIX(ptr, n)                                                                                \
    for (size_t i_ = 0; i_ < (n); i_++)                                                            \
        h = (h ^ ((const unsigned char *)(ptr))[i_]) * 1099511628211ull;
    MIX(&p->unit, sizeof p->unit);
    MIX(p->name, strlen(p->name));
    MIX(&p->ndim, sizeof p->ndim);
    MIX(p->shape, (size_t)p->ndim * sizeof *p->shape);
    MIX(&p->dtype, sizeof p->dtype);
#undef MIX
    return h;
}

static void describe_param(const param *p, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "'%s' [", p->name);
    for (int d = 0; d < p->ndim && n > 0 && (size_t)n < cap; d++)
        n += snprintf(buf + n, cap - (size_t)n, "%s%" PRId64, d ? ", " : "", p->shape[d]);
    if (n > 0 && (size_t)n < cap)
        snprintf(buf + n, cap - (size_t)n, "] %s", coll_dtype_name(p->dtype));
}

/* Every rank checks that every rank registered this layout; the message is the same on all. */
static int check_layout(ddp_model *m)
{
    /* What every rank must share besides the parameters: the stage and the bucket caps, which
     * decide the collectives; then the parameter count. */
    int64_t mine[4] = {m->o.zero_stage, (int64_t)m->o.first_bucket_bytes,
                       (int64_t)m->o.bucket_bytes, m->nparams};
    int64_t *counts = calloc((size_t)m->world * 4, sizeof *counts);
    uint64_t *hashes = NULL, *all = NULL;
    int rc = -ENOMEM;
    if (!counts)
        goto out;
    rc = coll_allgather(m->comm, mine, counts, 4, COLL_I64);
    if (rc < 0) {
        rc = coll_failed(m, rc, "ddp_model_commit: exchanging the layout");
        goto out;
    }
    for (int r = 1; r < m->world; r++) {
        const int64_t *o = counts + 4 * r;
        if (o[0] != counts[0] || o[1] != counts[1] || o[2] != counts[2]) {
            rc = fail(m, -EINVAL,
                      "ddp_model_commit: the options differ: rank %d has zero_stage %" PRId64
                      ", buckets %" PRId64 "/%" PRId64 " bytes; rank 0 %" PRId64 ", %" PRId64
                      "/%" PRId64,
                      r, o[0], o[1], o[2], counts[0], counts[1], counts[2]);
            goto out;
        }
        if (o[3] != counts[3]) {
            rc = fail(m, -EINVAL,
                      "ddp_model_commit: the layouts differ: rank %d registered %" PRId64
                      " parameters, rank 0 %" PRId64,
                      r, o[3], counts[3]);
            goto out;
        }
    }
    rc = -ENOMEM;
    hashes = calloc((size_t)m->nparams, sizeof *hashes);
    all = calloc((size_t)m->nparams * (size_t)m->world, sizeof *all);
    if (!hashes || !all)
        goto out;
    for (int i = 0; i < m->nparams; i++)
        hashes[i] = param_hash(&m->params[i]);
    rc = coll_allgather(m->comm, hashes, all, (size_t)m->nparams, COLL_I64);
    if (rc < 0) {
        rc = coll_failed(m, rc, "ddp_model_commit: exchanging the layout");
        goto out;
    }
    for (int r = 1; r < m->world; r++) {
        for (int i = 0; i < m->nparams; i++) {
            if (all[(size_t)r * (size_t)m->nparams + (size_t)i] == all[i])
                continue;
            char here[256];
            describe_param(&m->params[i], here, sizeof here);
            rc = fail(m, -EINVAL,
                      "ddp_model_commit: the layouts differ: rank %d's parameter %d is not rank "
                      "0's (this rank, %d, has %s in unit '%s')",
                      r, i, m->rank, here, m->unit_names[m->params[i].unit]);
            goto out;
        }
    }
    rc = 0;
out:
    free(counts);
    free(hashes);
    free(all);
    return rc;
}

static int alloc_slots(slot **s, int n, size_t elems)
{
    *s = calloc((size_t)n, sizeof **s);
    if (!*s)
        return -ENOMEM;
    for (int i = 0; i < n; i++) {
        (*s)[i].group = -1;
        if (!((*s)[i].buf = calloc(elems, sizeof(float))))
            return -ENOMEM;
    }
    return 0;
}

/* Rank 0's initial values into buf (the group's padded range), zeros where init is NULL. */
static int init_group(ddp_model *m, const ddp__group *g, float *buf, ddp_init_fn init, void *arg)
{
    memset(buf, 0, g->padded * sizeof *buf);
    for (int i = g->first; init && i <= g->last; i++) {
        int rc = init(arg, i, m->params[i].name, buf + (m->plan.param_offset[i] - g->offset),
                      m->params[i].count);
        if (rc < 0)
            return fail(m, rc, "ddp_model_commit: the init function failed for '%s' (%s)",
                        m->params[i].name, ddp_strerror(rc));
    }
    return 0;
}

int ddp_model_commit(ddp_model *m, ddp_init_fn init, void *arg)
{
    if (!m || m->state != BUILDING)
        return m ? fail(m, -EINVAL, "ddp_model_commit: already committed") : -EINVAL;
    if (m->nparams == 0)
        return fail(m, -EINVAL, "ddp_model_commit: no parameters registered");
    int rc = check_layout(m);
    if (rc < 0)
        return rc;

    int stage = m->o.zero_stage, G;
    size_t *counts = calloc((size_t)m->nparams, sizeof *counts);
    int *units = calloc((size_t)m->nparams, sizeof *units);
    rc = -ENOMEM;
    if (!counts || !units)
        goto out;
    for (int i = 0; i < m->nparams; i++) {
        counts[i] = m->params[i].count;
        units[i] = m->params[i].unit;
    }
    rc = ddp__plan_build(counts, units, m->nparams, m->world, stage == 3, m->o.first_bucket_bytes,
                         m->o.bucket_bytes, sizeof(float), &m->plan);
    if (rc < 0) {
        fail(m, rc, "ddp_model_commit: planning the layout: %s (every unit needs a parameter)",
             ddp_strerror(rc));
        goto out;
    }
    G = m->plan.ngroups;
    const ddp__plan *p = &m->plan;
    size_t full = p->total, owned = p->shard_total;
    m->opt_elems = stage == 0 ? full : owned;
    rc = -ENOMEM;
    m->param = calloc(stage == 3 ? owned : full, sizeof(float));
    m->grad = calloc(stage >= 2 ? owned : full, sizeof(float));
    m->ready = calloc((size_t)G, sizeof *m->ready);
    m->req = calloc((size_t)G, sizeof *m->req);
    m->grad_slot = calloc((size_t)G, sizeof *m->grad_slot);
    m->marked = calloc((size_t)m->nparams, 1);
    m->done_seen = calloc((size_t)G, 1);
    if (!m->param || !m->grad || !m->ready || !m->req || !m->grad_slot || !m->marked ||
        !m->done_seen)
        goto out;
    if (m->o.optimizer == DDP_ADAMW || m->o.momentum != 0) {
        if (!(m->opt1 = calloc(m->opt_elems, sizeof(float))))
            goto out;
    }
    if (m->o.optimizer == DDP_ADAMW && !(m->opt2 = calloc(m->opt_elems, sizeof(float))))
        goto out;
    for (int g = 0; g < G; g++)
        m->grad_slot[g] = -1;
    if (stage >= 2) {
        /* A group needs at most one slot at a time, so slots beyond the group count would only
         * hold memory. */
        m->ngslots = m->o.pool_slots < G ? m->o.pool_slots : G;
        if (alloc_slots(&m->gslots, m->ngslots, p->max_padded) < 0)
            goto out;
    }
    if (stage == 3) {
        m->nuslots = m->ngslots;
        m->unit_slot = malloc((size_t)G * sizeof *m->unit_slot);
        if (!m->unit_slot || alloc_slots(&m->uslots, m->nuslots, p->max_padded) < 0)
            goto out;
        for (int g = 0; g < G; g++)
            m->unit_slot[g] = -1;
    }

    /* Rank 0's initial values reach every rank (stage 3: each keeps its part of each unit). */
    if (stage < 3) {
        for (int g = 0; g < G && m->rank == 0; g++)
            if ((rc = init_group(m, &p->groups[g], m->param + p->groups[g].offset, init, arg)) < 0)
                goto out; /* the other ranks fail in the broadcast, naming rank 0 */
        rc = coll_broadcast(m->comm, m->param, m->param, full, COLL_F32, 0);
        if (rc < 0) {
            rc = coll_failed(m, rc, "ddp_model_commit: broadcasting rank 0's initial values");
            goto out;
        }
    } else {
        float *buf = m->uslots[0].buf;
        for (int g = 0; g < G; g++) {
            const ddp__group *gr = &p->groups[g];
            if (m->rank == 0 && (rc = init_group(m, gr, buf, init, arg)) < 0)
                goto out;
            rc = coll_broadcast(m->comm, buf, buf, gr->padded, COLL_F32, 0);
            if (rc < 0) {
                rc = coll_failed(m, rc, "ddp_model_commit: broadcasting rank 0's initial values");
                goto out;
            }
            memcpy(m->param + p->shard_offset[g], buf + (size_t)m->rank * gr->shard,
                   gr->shard * sizeof(float));
        }
    }
    m->state = READY;
    rc = 0;
out:
    if (rc == -ENOMEM && !m->err[0])
        fail(m, rc, "ddp_model_commit: out of memory");
    free(counts);
    free(units);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Views                                                                                       */
/* ------------------------------------------------------------------------------------------ */

int ddp_num_params(const ddp_model *m)
{
    return m ? m->nparams : 0;
}

int ddp_num_units(const ddp_model *m)
{
    return m ? m->nunits : 0;
}

size_t ddp_param_count(const ddp_model *m, int p)
{
    return m && p >= 0 && p < m->nparams ? m->params[p].count : 0;
}

const char *ddp_param_name(const ddp_model *m, int p)
{
    return m && p >= 0 && p < m->nparams ? m->params[p].name : NULL;
}

void *ddp_param_data(ddp_model *m, int p)
{
    if (!m || m->state != READY || p < 0 || p >= m->nparams)
        return NULL;
    if (m->o.zero_stage < 3)
        return m->param + m->plan.param_offset[p];
    int g = m->plan.param_group[p], s = m->unit_slot[g];
    if (s < 0 || m->uslots[s].req) /* not gathered, or gathered but not waited for */
        return NULL;
    return m->uslots[s].buf + (m->plan.param_offset[p] - m->plan.groups[g].offset);
}

coll_dtype ddp_param_dtype(const ddp_model *m)
{
    return m && m->o.precision == DDP_PREC_BF16 ? COLL_BF16 : COLL_F32;
}

/* ------------------------------------------------------------------------------------------ */
/* Reductions                                                                                  */
/* ------------------------------------------------------------------------------------------ */

/* Waits for a staging slot's reduce-scatter and adds its owned part into the accumulator. */
static int finish_gslot(ddp_model *m, int s)
{
    slot *sl = &m->gslots[s];
    int g = sl->group, rc = coll_wait(sl->req);
    sl->req = NULL;
    if (rc < 0)
        return coll_failed(m, rc, "reducing gradients");
    trace_done(m, g);
    const ddp__group *gr = &m->plan.groups[g];
    ddp__add(m->grad + m->plan.shard_offset[g], sl->buf + (size_t)m->rank * gr->shard, gr->shard);
    sl->group = -1;
    if (m->grad_slot[g] == s) /* else a later micro-step's slot serves g now */
        m->grad_slot[g] = -1;
    return 0;
}

/* A staging slot for group g (stages 2-3): a free one, or the oldest in flight once done. */
static int acquire_gslot(ddp_model *m, int g)
{
    int s = -1;
    for (int i = 0; i < m->ngslots && s < 0; i++)
        if (m->gslots[i].group < 0)
            s = i;
    if (s < 0) {
        for (int i = 0; i < m->ngslots; i++)
            if (m->gslots[i].req && (s < 0 || m->gslots[i].seq < m->gslots[s].seq))
                s = i;
        if (s < 0)
            return fail(m, -ENOBUFS,
                        "all %d staging slots hold buckets whose reduction cannot start yet (mark "
                        "gradients ready in backward order, or raise pool_slots)",
                        m->ngslots);
        int rc = finish_gslot(m, s);
        if (rc < 0)
            return rc;
    }
    memset(m->gslots[s].buf, 0, m->plan.groups[g].padded * sizeof(float));
    m->gslots[s].group = g;
    m->grad_slot[g] = s;
    return s;
}

/* Issues group g's reduction: allreduce (stage 0) or reduce-scatter (stages 1-3). */
static int launch(ddp_model *m, int g)
{
    const ddp__group *gr = &m->plan.groups[g];
    int rc;
    trace(m, DDP_EV_BUCKET_LAUNCH, g);
    if (m->o.zero_stage == 0) {
        float *b = m->grad + gr->offset;
        rc = coll_iallreduce(m->comm, b, b, gr->padded, COLL_F32, COLL_AVG, &m->req[g]);
    } else if (m->o.zero_stage == 1) {
        float *b = m->grad + gr->offset;
        rc = coll_ireduce_scatter(m->comm, b, b + (size_t)m->rank * gr->shard, gr->shard, COLL_F32,
                                  COLL_AVG, &m->req[g]);
    } else {
        slot *sl = &m->gslots[m->grad_slot[g]];
        rc = coll_ireduce_scatter(m->comm, sl->buf, sl->buf + (size_t)m->rank * gr->shard,
                                  gr->shard, COLL_F32, COLL_AVG, &sl->req);
        sl->seq = ++m->seq;
    }
    return rc < 0 ? coll_failed(m, rc, "launching a gradient reduction") : 0;
}

/* Launches, strictly in backward order, every complete group from next_launch on. */
static int launch_ready(ddp_model *m)
{
    const ddp__plan *p = &m->plan;
    while (m->next_launch < p->ngroups) {
        int g = launch_group(m, m->next_launch);
        if (m->ready[g] != p->groups[g].last - p->groups[g].first + 1)
            break;
        m->next_launch++;
        int rc = launch(m, g);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Waits for every gradient reduction in flight. */
static int finish_reductions(ddp_model *m)
{
    for (int g = 0; g < m->plan.ngroups; g++) {
        if (!m->req[g])
            continue;
        int rc = coll_wait(m->req[g]);
        m->req[g] = NULL;
        if (rc < 0)
            return coll_failed(m, rc, "reducing gradients");
        trace_done(m, g);
    }
    for (int s = 0; s < m->ngslots; s++) {
        if (m->gslots[s].req) {
            int rc = finish_gslot(m, s);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Micro-steps                                                                                 */
/* ------------------------------------------------------------------------------------------ */

int ddp_micro_begin(ddp_model *m, int sync)
{
    int rc = usable(m);
    if (rc < 0)
        return rc;
    if (m->in_micro)
        return fail(m, -EINVAL, "ddp_micro_begin: the previous micro-step did not end");
    m->in_micro = true;
    m->sync = sync || m->o.zero_stage >= 2;
    /* Stages 2-3: slots whose reduce-scatter from the previous micro-step is still in flight
     * stay busy until it completes; this micro-step's gradients go into fresh slots. */
    for (int g = 0; m->gslots && g < m->plan.ngroups; g++)
        m->grad_slot[g] = -1;
    for (int i = 0; i < m->ngslots; i++) /* held but never launched: a misused micro-step */
        if (!m->gslots[i].req)
            m->gslots[i].group = -1;
    memset(m->ready, 0, (size_t)m->plan.ngroups * sizeof *m->ready);
    memset(m->marked, 0, (size_t)m->nparams);
    memset(m->done_seen, 0, (size_t)m->plan.ngroups);
    m->next_launch = 0;
    return 0;
}

void *ddp_grad_buffer(ddp_model *m, int p)
{
    if (!m || m->state != READY || !m->in_micro || p < 0 || p >= m->nparams)
        return NULL;
    const ddp__group *g = group_of(m, p);
    if (m->o.zero_stage < 2)
        return m->grad + m->plan.param_offset[p];
    int gi = m->plan.param_group[p], s = m->grad_slot[gi];
    if (s < 0 && (s = acquire_gslot(m, gi)) < 0)
        return NULL;
    return m->gslots[s].buf + (m->plan.param_offset[p] - g->offset);
}

int ddp_grad_ready(ddp_model *m, int p)
{
    int rc = usable(m);
    if (rc < 0)
        return rc;
    if (!m->in_micro || p < 0 || p >= m->nparams)
        return fail(m, -EINVAL, "ddp_grad_ready(%d): no micro-step, or no such parameter", p);
    if (m->marked[p])
        return misuse(m,
                      "ddp_grad_ready: the gradient of '%s' (parameter %d) was marked twice in "
                      "one micro-step",
                      m->params[p].name, p);
    int g = m->plan.param_group[p];
    if (m->o.zero_stage >= 2 && m->grad_slot[g] < 0 && !ddp_grad_buffer(m, p))
        return m->state == BROKEN ? m->broken_rc : -ENOBUFS; /* a zero gradient, never written */
    m->marked[p] = 1;
    m->ready[g]++;
    poll_done(m);
    return m->sync ? launch_ready(m) : 0;
}

int ddp_micro_end(ddp_model *m)
{
    int rc = usable(m);
    if (rc < 0)
        return rc;
    if (!m->in_micro)
        return fail(m, -EINVAL, "ddp_micro_end: no micro-step began");
    poll_done(m);
    trace(m, DDP_EV_BACKWARD_END, (int)m->micro);
    m->in_micro = false;
    m->micro++;
    for (int p = 0; p < m->nparams; p++)
        if (!m->marked[p])
            return misuse(m,
                          "ddp_micro_end: the gradient of '%s' (parameter %d) was not marked "
                          "ready",
                          m->params[p].name, p);
    if (m->sync)
        m->synced = true;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Stage 3: gathering units                                                                    */
/* ------------------------------------------------------------------------------------------ */

/* Issues unit u's allgather into a free slot; returns the slot, or -1 when none is free. */
static int issue_gather(ddp_model *m, int u, int *rc)
{
    int s = -1;
    for (int i = 0; i < m->nuslots && s < 0; i++)
        if (m->uslots[i].group < 0)
            s = i;
    *rc = 0;
    if (s < 0)
        return -1;
    const ddp__group *g = &m->plan.groups[u];
    slot *sl = &m->uslots[s];
    trace(m, DDP_EV_GATHER_LAUNCH, u);
    *rc = coll_iallgather(m->comm, m->param + m->plan.shard_offset[u], sl->buf, g->shard, COLL_F32,
                          &sl->req);
    if (*rc < 0)
        return *rc = coll_failed(m, *rc, "gathering a unit's parameters"), -1;
    sl->group = u;
    m->unit_slot[u] = s;
    return s;
}

int ddp_unit_gather(ddp_model *m, int u)
{
    int rc = usable(m);
    if (rc < 0)
        return rc;
    if (u < 0 || u >= m->nunits)
        return fail(m, -EINVAL, "ddp_unit_gather(%d): no such unit", u);
    if (m->o.zero_stage < 3)
        return 0;
    /* The direction of travel: that of the last two gathers; the same unit twice in a row is
     * a turn (forward's last unit is backward's first, backward's last the next forward's
     * first), so the prefetch already goes the new way. */
    if (m->last_gathered >= 0)
        m->direction = u == m->last_gathered ? -m->direction : u > m->last_gathered ? 1 : -1;
    m->last_gathered = u;
    int s = m->unit_slot[u];
    if (s < 0 && (s = issue_gather(m, u, &rc)) < 0)
        return rc < 0 ? rc
                      : fail(m, -ENOBUFS,
                             "ddp_unit_gather(%d): all %d slots hold gathered units "
                             "(release units after use, or raise pool_slots)",
                             u, m->nuslots);
    int next = u + m->direction;
    if (next >= 0 && next < m->nunits && m->unit_slot[next] < 0) {
        (void)issue_gather(m, next, &rc); /* a prefetch: none when no slot is free */
        if (rc < 0)
            return rc;
    }
    if (m->uslots[s].req) {
        rc = coll_wait(m->uslots[s].req);
        m->uslots[s].req = NULL;
        if (rc < 0)
            return coll_failed(m, rc, "gathering a unit's parameters");
    }
    return 0;
}

int ddp_unit_release(ddp_model *m, int u)
{
    if (!m || m->state == BUILDING || u < 0 || u >= m->nunits)
        return m ? fail(m, -EINVAL, "ddp_unit_release(%d): no such unit", u) : -EINVAL;
    if (m->o.zero_stage < 3 || m->unit_slot[u] < 0)
        return 0;
    slot *sl = &m->uslots[m->unit_slot[u]];
    if (sl->req) /* released before use: its allgather must still complete */
        return fail(m, -EINVAL, "ddp_unit_release(%d): the unit was never gathered", u);
    sl->group = -1;
    m->unit_slot[u] = -1;
    return 0;
}

/* Releases every gathered unit, waiting for prefetches still in flight (at the step). */
int ddp__drop_units(ddp_model *m)
{
    for (int s = 0; s < m->nuslots; s++) {
        slot *sl = &m->uslots[s];
        if (sl->req) {
            int rc = coll_wait(sl->req);
            sl->req = NULL;
            if (rc < 0)
                return coll_failed(m, rc, "gathering a unit's parameters");
        }
        if (sl->group >= 0)
            m->unit_slot[sl->group] = -1;
        sl->group = -1;
    }
    m->last_gathered = -1;
    m->direction = 1;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* The step                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/* Calls fn on every owned range: (param, grad, state offset, count). */
typedef void (*range_fn)(ddp_model *m, float *param, float *grad, size_t state_at, size_t n,
                         void *arg);

static void for_owned(ddp_model *m, range_fn fn, void *arg)
{
    const ddp__plan *p = &m->plan;
    int stage = m->o.zero_stage;
    if (stage == 0) {
        fn(m, m->param, m->grad, 0, p->total, arg);
        return;
    }
    if (stage == 3) {
        fn(m, m->param, m->grad, 0, p->shard_total, arg);
        return;
    }
    for (int g = 0; g < p->ngroups; g++) {
        const ddp__group *gr = &p->groups[g];
        size_t own = gr->offset + (size_t)m->rank * gr->shard;
        float *grad = stage == 1 ? m->grad + own : m->grad + p->shard_offset[g];
        fn(m, m->param + own, grad, p->shard_offset[g], gr->shard, arg);
    }
}

static void sum_squares(ddp_model *m, float *param, float *grad, size_t at, size_t n, void *arg)
{
    (void)m, (void)param, (void)at;
    *(double *)arg += ddp__sum_squares(grad, n);
}

static void scale(ddp_model *m, float *param, float *grad, size_t at, size_t n, void *arg)
{
    (void)m, (void)param, (void)at;
    ddp__scale(grad, n, *(float *)arg);
}

static void optimize(ddp_model *m, float *param, float *grad, size_t at, size_t n, void *arg)
{
    const ddp_options *o = &m->o;
    float lr = *(float *)arg;
    if (o->optimizer == DDP_ADAMW)
        ddp__adamw_step(param, grad, m->opt1 + at, m->opt2 + at, n, lr, o->beta1, o->beta2, o->eps,
                        o->weight_decay, m->steps + 1);
    else
        ddp__sgd_step(param, grad, m->opt1 ? m->opt1 + at : NULL, n, lr, o->momentum, o->nesterov,
                      o->weight_decay, m->steps == 0);
}

/* Stages 1-2: every rank's updated parts back into every rank's full parameters. */
static int gather_params(ddp_model *m)
{
    const ddp__plan *p = &m->plan;
    int rc = 0;
    for (int g = 0; g < p->ngroups; g++) {
        const ddp__group *gr = &p->groups[g];
        float *b = m->param + gr->offset;
        rc = coll_iallgather(m->comm, b + (size_t)m->rank * gr->shard, b, gr->shard, COLL_F32,
                             &m->req[g]);
        if (rc < 0)
            return coll_failed(m, rc, "gathering the updated parameters");
    }
    for (int g = 0; g < p->ngroups; g++) {
        rc = coll_wait(m->req[g]);
        m->req[g] = NULL;
        if (rc < 0)
            return coll_failed(m, rc, "gathering the updated parameters");
    }
    return 0;
}

int ddp_step(ddp_model *m, float lr, ddp_step_info *info)
{
    int rc = usable(m);
    if (rc < 0)
        return rc;
    if (m->in_micro || !m->synced)
        return fail(m, -EINVAL,
                    "ddp_step: no complete micro-step with sync = 1 since the last "
                    "step");
    if ((rc = finish_reductions(m)) < 0 || (rc = ddp__drop_units(m)) < 0)
        return rc;
    int stage = m->o.zero_stage;

    double ss = 0;
    for_owned(m, sum_squares, &ss);
    if (stage > 0) {
        rc = coll_allreduce(m->comm, &ss, &ss, 1, COLL_F64, COLL_SUM);
        if (rc < 0)
            return coll_failed(m, rc, "summing the gradient norm");
    }
    ddp_step_info in = {.grad_norm = sqrt(ss)};
    if (!isfinite(in.grad_norm)) {
        in.skipped = 1; /* the norm is the same on every rank, so every rank skips */
        if (m->o.log) {
            char msg[128];
            snprintf(msg, sizeof msg, "step %" PRId64 " skipped: the gradient norm is %g",
                     m->attempted, in.grad_norm);
            m->o.log(m->o.log_arg, COLL_LOG_WARN, msg);
        }
    } else {
        if (m->o.clip_norm > 0 && in.grad_norm > m->o.clip_norm) {
            float s = (float)(m->o.clip_norm / (in.grad_norm + 1e-6));
            for_owned(m, scale, &s);
            in.clipped = 1;
        }
        ddp__ckpt_wait_copied(m->ck); /* an asynchronous save's writer may still read it */
        for_owned(m, optimize, &lr);
        m->steps++;
        if ((stage == 1 || stage == 2) && (rc = gather_params(m)) < 0)
            return rc;
    }
    memset(m->grad, 0, (stage >= 2 ? m->plan.shard_total : m->plan.total) * sizeof(float));
    m->synced = false;
    in.step = m->steps;
    trace(m, DDP_EV_STEP_END, (int)m->attempted++);
    if (m->ck && (rc = ddp__ckpt_poll(m)) < 0)
        return rc;
    m->last = in;
    if (info)
        *info = in;
    return 0;
}

int ddp_step_info_get(ddp_model *m, ddp_step_info *out)
{
    if (!m || !out || m->state == BUILDING)
        return m ? fail(m, -EINVAL, "ddp_step_info_get: NULL out, or not committed") : -EINVAL;
    *out = m->last;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Memory                                                                                      */
/* ------------------------------------------------------------------------------------------ */

int ddp_memory_stats(const ddp_model *m, ddp_memory *out)
{
    if (!m || !out || m->state == BUILDING)
        return -EINVAL;
    int stage = m->o.zero_stage;
    size_t f = sizeof(float), full = m->plan.total * f, owned = m->plan.shard_total * f;
    ddp_memory s = {0};
    s.param_bytes = stage == 3 ? owned : full;
    s.grad_bytes = stage >= 2 ? owned : full;
    s.optimizer_bytes = ((m->opt1 ? 1u : 0u) + (m->opt2 ? 1u : 0u)) * m->opt_elems * f;
    s.pool_bytes = (size_t)(m->ngslots + m->nuslots) * m->plan.max_padded * f;
    s.model_state_bytes = s.param_bytes + s.grad_bytes + s.optimizer_bytes;
    *out = s;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* For ckpt.c (ddp_internal.h)                                                                 */
/* ------------------------------------------------------------------------------------------ */

int ddp__model_view_get(ddp_model *m, ddp__model_view *v)
{
    int rc = usable(m);
    if (rc < 0)
        return rc;
    if (m->in_micro)
        return fail(m, -EINVAL, "a checkpoint is taken between steps, not inside a micro-step");
    *v = (ddp__model_view){
        .comm = m->comm,
        .rank = m->rank,
        .world = m->world,
        .stage = m->o.zero_stage,
        .o = &m->o,
        .plan = &m->plan,
        .param = m->param,
        .opt = {m->opt1, m->opt2},
        .opt_elems = m->opt_elems,
        .steps = &m->steps,
        .attempted = &m->attempted,
        .ck = &m->ck,
    };
    return 0;
}

void ddp__param_shape(const ddp_model *m, int p, int *unit, int *ndim, int64_t *shape)
{
    const param *pa = &m->params[p];
    *unit = pa->unit;
    *ndim = pa->ndim;
    memcpy(shape, pa->shape, (size_t)pa->ndim * sizeof *shape);
}

const char *ddp__unit_name(const ddp_model *m, int u)
{
    return m->unit_names[u];
}

int ddp__fail(ddp_model *m, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->err, sizeof m->err, fmt, ap);
    va_end(ap);
    return rc;
}

int ddp__coll_failed(ddp_model *m, int rc, const char *what)
{
    return coll_failed(m, rc, what);
}
