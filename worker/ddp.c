/*
 * libddp's runtime: the model the caller registers, its arenas, and the training step of every
 * ZeRO stage behind one set of calls (ddp.h describes the loop, plan.c the layout).
 *
 * Memory, with Ψ the arena's elements (padding included) and S = Ψ / N the owned parts:
 *   stage 0: param[Ψ], grad[Ψ], optimizer state on Ψ;
 *   stage 1: param[Ψ], grad[Ψ], optimizer state on S (compact: group g at its shard_offset);
 *   stage 2: param[Ψ], grad[S] (the owned parts, accumulated), a pool of staging slots;
 *   stage 3: param[S], grad[S], a pool of staging slots and a pool of gathered units.
 * Slots hold the largest group (bucket or unit), padding included.
 *
 * Invariants:
 *  - Every rank issues the same collectives in the same order, because every decision that
 *    issues one depends on the sequence of the caller's calls alone (which every rank makes
 *    alike), never on when a request completes: a group's reduction is issued when it is
 *    complete and every group before it in launch order has been issued (launch order: bucket
 *    0, 1, ... for buckets; the last unit first for units, the order backward completes them);
 *    a stage 3 gather or prefetch depends on which slots the calls have pinned or released.
 *  - A staging slot or a gathered unit's slot is reused only after its request was waited for,
 *    and every request is waited for exactly once (by the step, by whatever needs its slot, or
 *    by drain() after a failure or at free).
 *  - The padding at the end of each group is zero in parameters, gradients and optimizer
 *    state: slots are zeroed over the group's padded range when handed out, the caller writes
 *    through views of the parameters only, and the optimizers keep zeros at zero.
 *  - After a collective fails the model is broken: every later call returns the same code and
 *    issues nothing, so no rank waits for collectives its peers will never issue.
 *
 * Not here: checkpoints and device (CUDA) memory, which have issues of their own; dtypes other
 * than f32; the optimizer kernels (optim.c); printing (the log hook gets skipped steps, the
 * trace hook timestamps).
 */
#include "ddp.h"

#include "monoclock.h"
#include "optim.h"
#include "plan.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ERR_BYTES 512
#define MAX_NDIM 8
#define ALIGN 64 /* arenas and slots start on a cache line */

typedef struct param {
    char *name; /* "<unit>.<name>" */
    int unit;
    int ndim;
    int64_t shape[MAX_NDIM];
    coll_dtype dtype;
    size_t count;
} param;

/* Stages 2-3: a staging buffer for one group's gradients in the current micro-step. */
typedef struct stage_slot {
    float *buf;        /* [max_padded] */
    int group;         /* the group it holds, or -1 when free */
    coll_request *req; /* its reduce-scatter, until retired */
    uint64_t seq;      /* when that was issued: the oldest is retired first */
} stage_slot;

/* Stage 3: a gathered unit. */
enum { G_EMPTY = 0, G_CACHED, G_PREFETCHED, G_PINNED };
typedef struct gather_slot {
    float *buf;        /* [max_padded] */
    int unit;          /* -1 when empty */
    int state;         /* G_*: CACHED = released but still valid; PINNED = gathered by the caller */
    coll_request *req; /* its allgather, until waited for */
    uint64_t used;     /* when it was last released or issued, for least-recently-used reuse */
} gather_slot;

struct ddp_model {
    coll_comm *comm;
    ddp_options o;
    int rank, world;
    bool committed;
    int broken; /* 0, or the code every later call returns */
    char err[ERR_BYTES];

    /* Registration. */
    param *params;
    int nparams, params_cap;
    char **units;
    int nunits, units_cap;

    /* Layout and memory. */
    ddp__plan plan;
    int *order;        /* [ngroups] order[k]: the k-th group to reduce in a micro-step */
    int *group_params; /* [ngroups] parameters per group */
    float *params_mem, *grads, *state1, *state2;
    size_t param_elems, grad_elems, state_elems;
    int nstate; /* arrays of optimizer state: 0, 1 (SGD momentum) or 2 (AdamW m, v) */

    /* The current step and micro-step. */
    bool in_micro, micro_sync, synced;
    int nmicro;    /* micro-steps since the last step */
    int micro_err; /* a failure of ddp_grad_buffer() that ddp_micro_end() returns */
    int next_launch;
    unsigned char *ready;     /* [nparams] marked in this micro-step */
    int *ready_count;         /* [ngroups] */
    coll_request **group_req; /* [ngroups] stages 0-1: the group's reduction */
    int *group_slot;          /* [ngroups] stages 2-3: its staging slot, or -1 */
    stage_slot *stage;        /* [pool_slots] stages 2-3 */
    uint64_t seq;
    gather_slot *gather;    /* [pool_slots] stage 3 */
    int *unit_slot;         /* [nunits] stage 3: the slot holding the unit, or -1 */
    int last_gathered, dir; /* stage 3: the direction of travel */
    uint64_t clock;
    coll_request **step_req; /* [ngroups] stages 1-2: the step's parameter allgathers */
    int64_t steps;
};

/* ------------------------------------------------------------------------------------------ */
/* Errors, logging and tracing                                                                 */
/* ------------------------------------------------------------------------------------------ */

static _Thread_local char create_err[ERR_BYTES];

const char *ddp_strerror(int err)
{
    return coll_strerror(err); /* libddp has no codes of its own: errno values and COLL_E* */
}

const char *ddp_last_error(const ddp_model *m)
{
    return m ? m->err : create_err;
}

static void logf_(ddp_model *m, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void logf_(ddp_model *m, int level, const char *fmt, ...)
{
    if (!m->o.log)
        return;
    char msg[ERR_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    m->o.log(m->o.log_arg, level, msg);
}

/* Records the model's last error, hands it to the log hook and returns rc. */
static int fail(ddp_model *m, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(ddp_model *m, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->err, sizeof m->err, fmt, ap);
    va_end(ap);
    if (m->o.log)
        m->o.log(m->o.log_arg, COLL_LOG_ERROR, m->err);
    return rc;
}

static void drain(ddp_model *m);

/*
 * A collective failed with rc: records "<what>: <code>: <libcollective's account> (culprit:
 * rank R)", breaks the model, waits out (releases) every other request, and returns rc. After
 * a failure the communicator fails every later operation at once, so the waits are short.
 */
static int coll_fail(ddp_model *m, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int coll_fail(ddp_model *m, int rc, const char *fmt, ...)
{
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    int culprit = coll_comm_failed_rank(m->comm);
    char who[48] = "";
    if (culprit >= 0)
        snprintf(who, sizeof who, " (culprit: rank %d)", culprit);
    fail(m, rc, "%s: %s: %s%s", what, coll_strerror(rc), coll_last_error(m->comm), who);
    m->broken = rc;
    drain(m);
    return rc;
}

static void trace(ddp_model *m, ddp_event ev, int index)
{
    if (m->o.trace)
        m->o.trace(m->o.trace_arg, ev, index, rdzv__now_ns());
}

/* The checks of every call that needs a committed, unbroken model. */
static int usable(ddp_model *m, const char *fn)
{
    if (m->broken)
        return m->broken;
    if (!m->committed)
        return fail(m, -EINVAL, "%s: the model is not committed (ddp_model_commit())", fn);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Options and building                                                                        */
/* ------------------------------------------------------------------------------------------ */

void ddp_options_init(ddp_options *opts)
{
    if (!opts)
        return;
    memset(opts, 0, sizeof *opts);
    opts->zero_stage = 0;
    opts->first_bucket_bytes = (size_t)1 << 20;
    opts->bucket_bytes = (size_t)25 << 20;
    opts->pool_slots = 4;
    opts->optimizer = DDP_SGD;
    opts->beta1 = 0.9f;
    opts->beta2 = 0.999f;
    opts->eps = 1e-8f;
    opts->device = -1;
}

/* Why `o` is not usable, or NULL. */
static const char *bad_option(const ddp_options *o)
{
    if (o->zero_stage < 0 || o->zero_stage > 3)
        return "zero_stage must be 0, 1, 2 or 3";
    if (o->first_bucket_bytes == 0 || o->bucket_bytes == 0)
        return "bucket sizes must be positive";
    if (o->pool_slots < 2)
        return "pool_slots must be at least 2";
    if (o->optimizer != DDP_SGD && o->optimizer != DDP_ADAMW)
        return "unknown optimizer";
    if (!(o->weight_decay >= 0) || !isfinite(o->weight_decay))
        return "weight_decay must be finite and >= 0";
    if (!(o->clip_norm <= 0 || isfinite(o->clip_norm)))
        return "clip_norm must be finite";
    if (o->optimizer == DDP_SGD) {
        if (!(o->momentum >= 0) || !isfinite(o->momentum))
            return "momentum must be finite and >= 0";
        if (o->nesterov && o->momentum == 0)
            return "Nesterov momentum needs momentum > 0";
    } else {
        if (!(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1))
            return "beta1 and beta2 must lie in [0, 1)";
        if (!(o->eps > 0) || !isfinite(o->eps))
            return "eps must be finite and > 0";
    }
    return NULL;
}

int ddp_model_create(coll_comm *comm, const ddp_options *opts, ddp_model **out)
{
    create_err[0] = '\0';
    if (!comm || !out) {
        snprintf(create_err, sizeof create_err, "ddp_model_create: comm and out are required");
        return -EINVAL;
    }
    ddp_options o;
    if (opts)
        o = *opts;
    else
        ddp_options_init(&o);
    const char *why = bad_option(&o);
    if (why) {
        snprintf(create_err, sizeof create_err, "ddp_model_create: %s", why);
        return -EINVAL;
    }
    if (o.device != -1) {
        snprintf(create_err, sizeof create_err,
                 "ddp_model_create: device %d: this build keeps the model in host memory only "
                 "(device -1)",
                 o.device);
        return -ENOTSUP;
    }
    ddp_model *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(create_err, sizeof create_err, "ddp_model_create: out of memory");
        return -ENOMEM;
    }
    m->comm = comm;
    m->o = o;
    m->rank = coll_comm_rank(comm);
    m->world = coll_comm_size(comm);
    m->last_gathered = -1;
    m->dir = 1;
    *out = m;
    return 0;
}

/* Waits for (and so releases) every request the model holds, ignoring their results. */
static void drain(ddp_model *m)
{
    for (int g = 0; m->group_req && g < m->plan.ngroups; g++)
        if (m->group_req[g]) {
            coll_wait(m->group_req[g]);
            m->group_req[g] = NULL;
        }
    for (int g = 0; m->step_req && g < m->plan.ngroups; g++)
        if (m->step_req[g]) {
            coll_wait(m->step_req[g]);
            m->step_req[g] = NULL;
        }
    for (int s = 0; m->stage && s < m->o.pool_slots; s++)
        if (m->stage[s].req) {
            coll_wait(m->stage[s].req);
            m->stage[s].req = NULL;
            m->stage[s].group = -1;
        }
    for (int s = 0; m->gather && s < m->o.pool_slots; s++)
        if (m->gather[s].req) {
            coll_wait(m->gather[s].req);
            m->gather[s].req = NULL;
        }
}

void ddp_model_free(ddp_model *m)
{
    if (!m)
        return;
    drain(m);
    for (int i = 0; i < m->nparams; i++)
        free(m->params[i].name);
    free(m->params);
    for (int u = 0; u < m->nunits; u++)
        free(m->units[u]);
    free(m->units);
    for (int s = 0; m->stage && s < m->o.pool_slots; s++)
        free(m->stage[s].buf);
    for (int s = 0; m->gather && s < m->o.pool_slots; s++)
        free(m->gather[s].buf);
    free(m->stage);
    free(m->gather);
    free(m->params_mem);
    free(m->grads);
    free(m->state1);
    free(m->state2);
    free(m->order);
    free(m->group_params);
    free(m->ready);
    free(m->ready_count);
    free(m->group_req);
    free(m->group_slot);
    free(m->unit_slot);
    free(m->step_req);
    ddp__plan_free(&m->plan);
    free(m);
}

int ddp_unit_add(ddp_model *m, const char *name)
{
    if (!m)
        return -EINVAL;
    if (m->committed || m->broken)
        return fail(m, -EINVAL, "ddp_unit_add: the model is already committed");
    if (!name || !*name)
        return fail(m, -EINVAL, "ddp_unit_add: a unit needs a name");
    if (m->nunits == m->units_cap) {
        int cap = m->units_cap ? 2 * m->units_cap : 16;
        char **u = realloc(m->units, (size_t)cap * sizeof *u);
        if (!u)
            return fail(m, -ENOMEM, "ddp_unit_add: out of memory");
        m->units = u;
        m->units_cap = cap;
    }
    if (!(m->units[m->nunits] = strdup(name)))
        return fail(m, -ENOMEM, "ddp_unit_add: out of memory");
    return m->nunits++;
}

int ddp_param_add(ddp_model *m, int unit, const char *name, int ndim, const int64_t *shape,
                  coll_dtype dtype)
{
    if (!m)
        return -EINVAL;
    if (m->committed || m->broken)
        return fail(m, -EINVAL, "ddp_param_add: the model is already committed");
    if (m->nunits == 0 || unit != m->nunits - 1)
        return fail(m, -EINVAL, "ddp_param_add: unit %d is not the latest unit added (%d)", unit,
                    m->nunits - 1);
    if (!name || !*name)
        return fail(m, -EINVAL, "ddp_param_add: a parameter of unit %s needs a name",
                    m->units[unit]);
    if (ndim < 0 || ndim > MAX_NDIM || (ndim > 0 && !shape))
        return fail(m, -EINVAL, "ddp_param_add: %s.%s: ndim must lie in [0, %d]", m->units[unit],
                    name, MAX_NDIM);
    size_t count = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] <= 0 || (uint64_t)shape[d] > SIZE_MAX / 16 / count)
            return fail(m, -EINVAL, "ddp_param_add: %s.%s: dimension %d is %" PRId64,
                        m->units[unit], name, d, shape[d]);
        count *= (size_t)shape[d];
    }
    if (coll_dtype_size(dtype) == 0)
        return fail(m, -EINVAL, "ddp_param_add: %s.%s: invalid dtype", m->units[unit], name);
    if (dtype != COLL_F32)
        return fail(m, -ENOTSUP, "ddp_param_add: %s.%s: dtype %s: the optimizers handle f32 only",
                    m->units[unit], name, coll_dtype_name(dtype));
    if (m->nparams == m->params_cap) {
        int cap = m->params_cap ? 2 * m->params_cap : 16;
        param *p = realloc(m->params, (size_t)cap * sizeof *p);
        if (!p)
            return fail(m, -ENOMEM, "ddp_param_add: out of memory");
        m->params = p;
        m->params_cap = cap;
    }
    param *p = &m->params[m->nparams];
    memset(p, 0, sizeof *p);
    size_t len = strlen(m->units[unit]) + 1 + strlen(name) + 1;
    if (!(p->name = malloc(len)))
        return fail(m, -ENOMEM, "ddp_param_add: out of memory");
    snprintf(p->name, len, "%s.%s", m->units[unit], name);
    p->unit = unit;
    p->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        p->shape[d] = shape[d];
    p->dtype = dtype;
    p->count = count;
    return m->nparams++;
}

/* ------------------------------------------------------------------------------------------ */
/* Commit: the layout check, the arenas, the initial values                                     */
/* ------------------------------------------------------------------------------------------ */

static uint64_t fnv(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ULL;
    return h;
}

#define FNV_BASIS 0xcbf29ce484222325ULL

/* What identifies parameter i across ranks: its unit's index, its full name, shape and dtype. */
static int64_t param_hash(const ddp_model *m, int i)
{
    const param *p = &m->params[i];
    uint64_t h = fnv(FNV_BASIS, &p->unit, sizeof p->unit);
    h = fnv(h, p->name, strlen(p->name) + 1);
    h = fnv(h, &p->ndim, sizeof p->ndim);
    h = fnv(h, p->shape, (size_t)p->ndim * sizeof p->shape[0]);
    int dt = (int)p->dtype;
    return (int64_t)fnv(h, &dt, sizeof dt);
}

/* The options that decide which collectives are issued: they must agree on every rank. */
static int64_t config_hash(const ddp_model *m)
{
    uint64_t v[5] = {(uint64_t)m->o.zero_stage, m->o.first_bucket_bytes, m->o.bucket_bytes,
                     (uint64_t)m->o.pool_slots, (uint64_t)m->nunits};
    return (int64_t)fnv(FNV_BASIS, v, sizeof v);
}

/* "fc1.weight [64, 784] f32" into buf. */
static const char *describe(const ddp_model *m, int i, char *buf, size_t cap)
{
    const param *p = &m->params[i];
    size_t at = (size_t)snprintf(buf, cap, "%s [", p->name);
    for (int d = 0; d < p->ndim && at < cap; d++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%" PRId64, d ? ", " : "", p->shape[d]);
    if (at < cap)
        snprintf(buf + at, cap - at, "] %s", coll_dtype_name(p->dtype));
    return buf;
}

/*
 * Every rank compares the layouts: first (count, options) of every rank, then, when the counts
 * agree, a hash per parameter. Every rank sees the same gathered values and so reaches the same
 * verdict, naming the first rank that differs from rank 0 and the first parameter where it
 * does. Returns 0, -EINVAL (they differ), -ENOMEM or a collective's failure.
 */
static int check_layout(ddp_model *m)
{
    int w = m->world, rc = 0;
    size_t n = (size_t)m->nparams;
    int64_t *all = malloc((size_t)w * 3 * sizeof *all);
    int64_t *hashes = malloc((n ? n : 1) * sizeof *hashes);
    int64_t *all_hashes = malloc((n ? n : 1) * (size_t)w * sizeof *all_hashes);
    /* Out of memory is a third value, so that the ranks give up together. */
    int64_t mine[3] = {m->nparams, config_hash(m), !hashes || !all_hashes};
    if (!all) {
        rc = fail(m, -ENOMEM, "ddp_model_commit: out of memory");
        goto out; /* the others time out in the allgather: it needs 3 * world integers */
    }
    if ((rc = coll_allgather(m->comm, mine, all, 3, COLL_I64)) != 0) {
        rc = coll_fail(m, rc, "ddp_model_commit: the layout check's allgather");
        goto out;
    }
    for (int r = 0; r < w; r++)
        if (all[3 * r + 2]) {
            rc = fail(m, -ENOMEM, "ddp_model_commit: rank %d ran out of memory", r);
            goto out;
        }
    for (int r = 1; r < w; r++) {
        if (all[3 * r] != all[0]) {
            rc = fail(m, -EINVAL,
                      "ddp_model_commit: the layouts differ: rank %d registered %" PRId64
                      " parameters, rank 0 %" PRId64 " (this is rank %d)",
                      r, all[3 * r], all[0], m->rank);
            goto out;
        }
        if (all[3 * r + 1] != all[1]) {
            rc = fail(m, -EINVAL,
                      "ddp_model_commit: the options differ: rank %d's zero_stage, bucket sizes, "
                      "pool_slots or number of units differ from rank 0's (this is rank %d: "
                      "stage %d, buckets of %zu and %zu bytes, %d slots, %d units)",
                      r, m->rank, m->o.zero_stage, m->o.first_bucket_bytes, m->o.bucket_bytes,
                      m->o.pool_slots, m->nunits);
            goto out;
        }
    }
    if (n == 0) {
        rc = fail(m, -EINVAL, "ddp_model_commit: no parameters registered");
        goto out;
    }
    for (int i = 0; i < m->nparams; i++)
        hashes[i] = param_hash(m, i);
    if ((rc = coll_allgather(m->comm, hashes, all_hashes, n, COLL_I64)) != 0) {
        rc = coll_fail(m, rc, "ddp_model_commit: the layout check's allgather");
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        for (int r = 1; r < w; r++)
            if (all_hashes[(size_t)r * n + i] != all_hashes[i]) {
                char d[200];
                rc = fail(m, -EINVAL,
                          "ddp_model_commit: the layouts differ: rank %d's parameter %zu differs "
                          "from rank 0's in name, shape or dtype (this is rank %d, where it is %s)",
                          r, i, m->rank, describe(m, (int)i, d, sizeof d));
                goto out;
            }
out:
    free(all);
    free(hashes);
    free(all_hashes);
    return rc;
}

static float *alloc_floats(size_t n)
{
    size_t bytes = (n * sizeof(float) + ALIGN - 1) / ALIGN * ALIGN;
    float *p = aligned_alloc(ALIGN, bytes ? bytes : ALIGN);
    if (p)
        memset(p, 0, bytes ? bytes : ALIGN);
    return p;
}

/* The arenas, slots and bookkeeping of a built plan. Returns 0 or -ENOMEM. */
static int alloc_model(ddp_model *m)
{
    const ddp__plan *pl = &m->plan;
    int st = m->o.zero_stage, ng = pl->ngroups, slots = m->o.pool_slots;
    m->param_elems = st == 3 ? pl->shard_total : pl->total;
    m->grad_elems = st <= 1 ? pl->total : pl->shard_total;
    m->state_elems = st == 0 ? pl->total : pl->shard_total;
    m->nstate = m->o.optimizer == DDP_ADAMW ? 2 : m->o.momentum != 0 ? 1 : 0;
    if (!(m->params_mem = alloc_floats(m->param_elems)) ||
        !(m->grads = alloc_floats(m->grad_elems)))
        return -ENOMEM;
    if (m->nstate >= 1 && !(m->state1 = alloc_floats(m->state_elems)))
        return -ENOMEM;
    if (m->nstate >= 2 && !(m->state2 = alloc_floats(m->state_elems)))
        return -ENOMEM;
    m->order = calloc((size_t)ng, sizeof *m->order);
    m->group_params = calloc((size_t)ng, sizeof *m->group_params);
    m->ready = calloc((size_t)m->nparams, 1);
    m->ready_count = calloc((size_t)ng, sizeof *m->ready_count);
    m->group_req = calloc((size_t)ng, sizeof *m->group_req);
    m->group_slot = calloc((size_t)ng, sizeof *m->group_slot);
    m->step_req = calloc((size_t)ng, sizeof *m->step_req);
    if (!m->order || !m->group_params || !m->ready || !m->ready_count || !m->group_req ||
        !m->group_slot || !m->step_req)
        return -ENOMEM;
    for (int k = 0; k < ng; k++) {
        m->order[k] = st == 3 ? ng - 1 - k : k; /* the order backward completes groups */
        m->group_params[k] = pl->groups[k].last - pl->groups[k].first + 1;
        m->group_slot[k] = -1;
    }
    if (st >= 2) {
        if (!(m->stage = calloc((size_t)slots, sizeof *m->stage)))
            return -ENOMEM;
        for (int s = 0; s < slots; s++) {
            m->stage[s].group = -1;
            if (!(m->stage[s].buf = alloc_floats(pl->max_padded)))
                return -ENOMEM;
        }
    }
    if (st == 3) {
        m->gather = calloc((size_t)slots, sizeof *m->gather);
        m->unit_slot = malloc((size_t)m->nunits * sizeof *m->unit_slot);
        if (!m->gather || !m->unit_slot)
            return -ENOMEM;
        for (int u = 0; u < m->nunits; u++)
            m->unit_slot[u] = -1;
        for (int s = 0; s < slots; s++) {
            m->gather[s].unit = -1;
            if (!(m->gather[s].buf = alloc_floats(pl->max_padded)))
                return -ENOMEM;
        }
    }
    return 0;
}

/*
 * Rank 0 calls init for parameters [first, last] into `base` (the arena, or a slot holding
 * group g at its offset); every rank then learns the outcome by a broadcast, so that a failing
 * init ends the commit on every rank alike. Returns 0, init's code, or a collective's failure.
 */
static int init_params(ddp_model *m, ddp_init_fn init, void *arg, int first, int last, float *base,
                       size_t base_offset)
{
    int64_t status = 0;
    int bad = -1;
    for (int i = first; m->rank == 0 && init && i <= last && status == 0; i++) {
        int rc = init(arg, i, m->params[i].name, base + (m->plan.param_offset[i] - base_offset),
                      m->params[i].count);
        if (rc < 0) {
            status = rc;
            bad = i;
        }
    }
    int64_t who = bad;
    int64_t msg[2] = {status, who};
    int rc = coll_broadcast(m->comm, msg, msg, 2, COLL_I64, 0);
    if (rc != 0)
        return coll_fail(m, rc, "ddp_model_commit: broadcast of the initial values");
    if (msg[0] < 0) {
        int code = msg[0] < INT32_MIN ? -EIO : (int)msg[0];
        m->broken = code;
        return fail(m, code,
                    "ddp_model_commit: rank 0's init failed for %s (parameter %" PRId64 "): %s",
                    m->params[msg[1]].name, msg[1], ddp_strerror(code));
    }
    return 0;
}

int ddp_model_commit(ddp_model *m, ddp_init_fn init, void *arg)
{
    if (!m)
        return -EINVAL;
    if (m->broken)
        return m->broken;
    if (m->committed)
        return fail(m, -EINVAL, "ddp_model_commit: the model is already committed");
    int rc = check_layout(m);
    if (rc != 0) {
        m->broken = rc; /* a model whose layout check failed cannot be committed again */
        return rc;
    }
    /* The layouts agree, so every rank takes the same branch from here on. */
    size_t *counts = malloc((size_t)m->nparams * sizeof *counts);
    int *units = malloc((size_t)m->nparams * sizeof *units);
    if (!counts || !units) {
        rc = -ENOMEM;
    } else {
        for (int i = 0; i < m->nparams; i++) {
            counts[i] = m->params[i].count;
            units[i] = m->params[i].unit;
        }
        for (int u = 0, i = 0; u < m->nunits; u++) {
            if (i >= m->nparams || units[i] != u) {
                free(counts);
                free(units);
                m->broken = -EINVAL;
                return fail(m, -EINVAL, "ddp_model_commit: unit %s (%d) has no parameters",
                            m->units[u], u);
            }
            while (i < m->nparams && units[i] == u)
                i++;
        }
        rc = ddp__plan_build(counts, units, m->nparams, m->world, m->o.zero_stage == 3,
                             m->o.first_bucket_bytes, m->o.bucket_bytes, sizeof(float), &m->plan);
        if (rc == 0)
            rc = alloc_model(m);
    }
    free(counts);
    free(units);
    /* Every rank learns whether one could not build its arenas (the highest such rank). */
    int64_t bad = rc != 0 ? m->rank + 1 : 0;
    int crc = coll_allreduce(m->comm, &bad, &bad, 1, COLL_I64, COLL_MAX);
    if (crc != 0)
        return coll_fail(m, crc, "ddp_model_commit: the allocation check's allreduce");
    if (bad) {
        m->broken = rc ? rc : -ENOMEM;
        return fail(m, m->broken, "ddp_model_commit: rank %d could not build its arenas (%s)",
                    (int)bad - 1, rc ? ddp_strerror(rc) : "out of memory");
    }

    const ddp__plan *pl = &m->plan;
    if (m->o.zero_stage < 3) {
        if ((rc = init_params(m, init, arg, 0, m->nparams - 1, m->params_mem, 0)) != 0)
            return rc;
        if ((rc = coll_broadcast(m->comm, m->params_mem, m->params_mem, pl->total, COLL_F32, 0)))
            return coll_fail(m, rc, "ddp_model_commit: broadcast of the initial values");
    } else {
        /* A unit at a time through a gather slot; each rank keeps its part. */
        float *tmp = m->gather[0].buf;
        for (int g = 0; g < pl->ngroups; g++) {
            const ddp__group *gr = &pl->groups[g];
            memset(tmp, 0, gr->padded * sizeof *tmp);
            if ((rc = init_params(m, init, arg, gr->first, gr->last, tmp, gr->offset)) != 0)
                return rc;
            if ((rc = coll_broadcast(m->comm, tmp, tmp, gr->padded, COLL_F32, 0)))
                return coll_fail(m, rc, "ddp_model_commit: broadcast of unit %s's initial values",
                                 m->units[g]);
            memcpy(m->params_mem + gr->shard_offset, tmp + (size_t)m->rank * gr->shard,
                   gr->shard * sizeof *tmp);
        }
        memset(tmp, 0, pl->max_padded * sizeof *tmp);
    }
    m->committed = true;
    m->err[0] = '\0';
    return 0;
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

size_t ddp_param_count(const ddp_model *m, int param)
{
    return m && param >= 0 && param < m->nparams ? m->params[param].count : 0;
}

const char *ddp_param_name(const ddp_model *m, int param)
{
    return m && param >= 0 && param < m->nparams ? m->params[param].name : NULL;
}

void *ddp_param_data(ddp_model *m, int param)
{
    if (!m || param < 0 || param >= m->nparams || !m->committed || m->broken)
        return NULL;
    const ddp__plan *pl = &m->plan;
    if (m->o.zero_stage < 3)
        return m->params_mem + pl->param_offset[param];
    int u = m->params[param].unit, s = m->unit_slot[u];
    if (s < 0 || m->gather[s].state != G_PINNED)
        return NULL;
    return m->gather[s].buf + (pl->param_offset[param] - pl->groups[u].offset);
}

/* ------------------------------------------------------------------------------------------ */
/* Gradients: staging slots and launches                                                       */
/* ------------------------------------------------------------------------------------------ */

/*
 * Stages 2-3: waits for the reduce-scatter in staging slot s and adds this rank's part of the
 * result into the owned gradients, then frees the slot. Returns 0 or a collective's failure.
 */
static int retire(ddp_model *m, int s, const char *fn)
{
    stage_slot *sl = &m->stage[s];
    int g = sl->group;
    const ddp__group *gr = &m->plan.groups[g];
    int rc = coll_wait(sl->req);
    sl->req = NULL;
    if (rc != 0) {
        sl->group = -1;
        return coll_fail(m, rc, "%s: waiting for the reduce-scatter of %s %d", fn,
                         m->o.zero_stage == 3 ? "unit" : "bucket", g);
    }
    trace(m, DDP_EV_BUCKET_DONE, g);
    ddp__add(m->grads + gr->shard_offset, sl->buf + (size_t)m->rank * gr->shard, gr->shard);
    sl->group = -1;
    return 0;
}

/* The staging slot whose reduce-scatter was issued first, or -1 if none is in flight. */
static int oldest_in_flight(const ddp_model *m)
{
    int best = -1;
    for (int s = 0; s < m->o.pool_slots; s++)
        if (m->stage[s].req && (best < 0 || m->stage[s].seq < m->stage[best].seq))
            best = s;
    return best;
}

/*
 * Every staging slot holds a group that waits for the next group in launch order, which is not
 * complete: names that group and its first parameter not marked ready. Returns -ENOBUFS.
 */
static int no_slot(ddp_model *m, const char *fn)
{
    const char *kind = m->o.zero_stage == 3 ? "unit" : "bucket";
    int g = m->order[m->next_launch], first = -1;
    for (int i = m->plan.groups[g].first; i <= m->plan.groups[g].last && first < 0; i++)
        if (!m->ready[i])
            first = i;
    return fail(m, -ENOBUFS,
                "%s: all %d staging slots hold %ss waiting for %s %d, which goes first and whose "
                "%s (parameter %d) is not marked ready; mark gradients ready in backward order, or "
                "raise pool_slots",
                fn, m->o.pool_slots, kind, kind, g, first >= 0 ? m->params[first].name : "?",
                first);
}

/*
 * Stages 2-3: a zeroed staging slot for group g, retiring the oldest reduce-scatter when none
 * is free. Returns 0, -ENOBUFS (every slot holds a group still being filled) or a collective's
 * failure.
 */
static int acquire_slot(ddp_model *m, int g, const char *fn)
{
    int s = -1;
    for (int k = 0; k < m->o.pool_slots && s < 0; k++)
        if (m->stage[k].group < 0)
            s = k;
    if (s < 0) {
        s = oldest_in_flight(m);
        if (s < 0)
            return no_slot(m, fn);
        int rc = retire(m, s, fn);
        if (rc != 0)
            return rc;
    }
    memset(m->stage[s].buf, 0, m->plan.groups[g].padded * sizeof(float));
    m->stage[s].group = g;
    m->group_slot[g] = s;
    return 0;
}

/* Issues group g's reduction. Returns 0 or a collective's failure. */
static int launch(ddp_model *m, int g)
{
    const ddp__group *gr = &m->plan.groups[g];
    size_t own = (size_t)m->rank * gr->shard;
    int rc;
    trace(m, DDP_EV_BUCKET_LAUNCH, g);
    switch (m->o.zero_stage) {
    case 0:
        rc = coll_iallreduce(m->comm, m->grads + gr->offset, m->grads + gr->offset, gr->padded,
                             COLL_F32, COLL_AVG, &m->group_req[g]);
        break;
    case 1:
        rc = coll_ireduce_scatter(m->comm, m->grads + gr->offset, m->grads + gr->offset + own,
                                  gr->shard, COLL_F32, COLL_AVG, &m->group_req[g]);
        break;
    default: {
        stage_slot *sl = &m->stage[m->group_slot[g]];
        rc = coll_ireduce_scatter(m->comm, sl->buf, sl->buf + own, gr->shard, COLL_F32, COLL_AVG,
                                  &sl->req);
        sl->seq = ++m->seq;
        break;
    }
    }
    if (rc != 0)
        return coll_fail(m, rc, "issuing the %s of %s %d",
                         m->o.zero_stage == 0 ? "allreduce" : "reduce-scatter",
                         m->o.zero_stage == 3 ? "unit" : "bucket", g);
    return 0;
}

/* Issues, in launch order, every complete group whose predecessors have all been issued. */
static int launch_due(ddp_model *m)
{
    if (m->o.zero_stage <= 1 && !m->micro_sync)
        return 0;
    while (m->next_launch < m->plan.ngroups) {
        int g = m->order[m->next_launch];
        if (m->ready_count[g] < m->group_params[g])
            return 0;
        int rc = launch(m, g);
        if (rc != 0)
            return rc;
        m->next_launch++;
    }
    return 0;
}

int ddp_micro_begin(ddp_model *m, int sync)
{
    if (!m)
        return -EINVAL;
    int rc = usable(m, "ddp_micro_begin");
    if (rc != 0)
        return rc;
    if (m->in_micro)
        return fail(m, -EINVAL, "ddp_micro_begin: the micro-step before has not ended");
    if (m->synced)
        return fail(m, -EINVAL,
                    "ddp_micro_begin: a micro-step with sync = 1 must be followed by "
                    "ddp_step()");
    m->in_micro = true;
    m->micro_sync = sync != 0;
    m->micro_err = 0;
    m->next_launch = 0;
    memset(m->ready, 0, (size_t)m->nparams);
    memset(m->ready_count, 0, (size_t)m->plan.ngroups * sizeof *m->ready_count);
    for (int g = 0; g < m->plan.ngroups; g++)
        m->group_slot[g] = -1;
    return 0;
}

void *ddp_grad_buffer(ddp_model *m, int param)
{
    if (!m)
        return NULL;
    if (param < 0 || param >= m->nparams) {
        fail(m, -EINVAL, "ddp_grad_buffer: no parameter %d", param);
        return NULL;
    }
    if (usable(m, "ddp_grad_buffer") != 0)
        return NULL;
    if (!m->in_micro) {
        fail(m, -EINVAL, "ddp_grad_buffer: %s: outside a micro-step", m->params[param].name);
        return NULL;
    }
    if (m->ready[param]) {
        m->micro_err = m->micro_err ? m->micro_err : -EINVAL;
        fail(m, -EINVAL,
             "ddp_grad_buffer: %s (parameter %d): its gradient was already marked "
             "ready in this micro-step",
             m->params[param].name, param);
        return NULL;
    }
    const ddp__plan *pl = &m->plan;
    if (m->o.zero_stage <= 1)
        return m->grads + pl->param_offset[param];
    int g = pl->param_group[param];
    if (m->group_slot[g] < 0) {
        int rc = acquire_slot(m, g, "ddp_grad_buffer");
        if (rc != 0) {
            m->micro_err = m->micro_err ? m->micro_err : rc;
            return NULL;
        }
    }
    return m->stage[m->group_slot[g]].buf + (pl->param_offset[param] - pl->groups[g].offset);
}

/* Marks param ready (its gradient zero if never handed out) and counts it in its group. */
static int mark_ready(ddp_model *m, int param, const char *fn)
{
    int g = m->plan.param_group[param];
    if (m->o.zero_stage >= 2 && m->group_slot[g] < 0) {
        int rc = acquire_slot(m, g, fn);
        if (rc != 0)
            return rc;
    }
    m->ready[param] = 1;
    m->ready_count[g]++;
    return 0;
}

int ddp_grad_ready(ddp_model *m, int param)
{
    if (!m)
        return -EINVAL;
    if (param < 0 || param >= m->nparams)
        return fail(m, -EINVAL, "ddp_grad_ready: no parameter %d", param);
    int rc = usable(m, "ddp_grad_ready");
    if (rc != 0)
        return rc;
    if (!m->in_micro)
        return fail(m, -EINVAL, "ddp_grad_ready: %s: outside a micro-step", m->params[param].name);
    if (m->ready[param])
        return fail(m, -EINVAL,
                    "ddp_grad_ready: the gradient of %s (parameter %d) was marked "
                    "ready twice in one micro-step",
                    m->params[param].name, param);
    if ((rc = mark_ready(m, param, "ddp_grad_ready")) != 0)
        return rc;
    return launch_due(m);
}

int ddp_micro_end(ddp_model *m)
{
    if (!m)
        return -EINVAL;
    int rc = usable(m, "ddp_micro_end");
    if (rc != 0)
        return rc;
    if (!m->in_micro)
        return fail(m, -EINVAL, "ddp_micro_end: no micro-step has begun");
    trace(m, DDP_EV_BACKWARD_END, m->nmicro);
    /*
     * Parameters not marked count as zero gradients, and every group is issued, in launch
     * order, so that the collectives stay in step with the other ranks whatever this one did.
     */
    int missing = 0, first = -1;
    for (int k = 0; k < m->plan.ngroups; k++) {
        const ddp__group *gr = &m->plan.groups[m->order[k]];
        for (int i = gr->first; i <= gr->last; i++) {
            if (m->ready[i])
                continue;
            if (missing++ == 0 || i < first)
                first = i;
            if ((rc = mark_ready(m, i, "ddp_micro_end")) != 0) {
                if (!m->broken) /* no slot: the collectives can no longer be kept in step */
                    m->broken = rc;
                return rc;
            }
        }
        if ((rc = launch_due(m)) != 0)
            return rc;
    }
    m->in_micro = false;
    m->nmicro++;
    if (m->micro_sync)
        m->synced = true;
    if (missing)
        return fail(m, -EINVAL,
                    "ddp_micro_end: %d parameter%s not marked ready in this micro-step, the "
                    "first %s (parameter %d); counted as zero",
                    missing, missing == 1 ? " was" : "s were", m->params[first].name, first);
    if (m->micro_err)
        return m->micro_err; /* ddp_grad_buffer()'s failure; ddp_last_error() has kept it */
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Stage 3: gathered units                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* Issues the allgather of unit u into gather slot s. Returns 0 or a collective's failure. */
static int issue_gather(ddp_model *m, int s, int u, int state)
{
    const ddp__group *gr = &m->plan.groups[u];
    gather_slot *sl = &m->gather[s];
    if (sl->unit >= 0)
        m->unit_slot[sl->unit] = -1;
    sl->unit = -1;
    sl->state = G_EMPTY;
    trace(m, DDP_EV_GATHER_LAUNCH, u);
    int rc = coll_iallgather(m->comm, m->params_mem + gr->shard_offset, sl->buf, gr->shard,
                             COLL_F32, &sl->req);
    if (rc != 0)
        return coll_fail(m, rc, "issuing the allgather of unit %s", m->units[u]);
    sl->unit = u;
    sl->state = state;
    sl->used = ++m->clock;
    m->unit_slot[u] = s;
    return 0;
}

/* A slot to reuse: an empty one, else the least recently used of `state`; -1 if none. */
static int find_slot(const ddp_model *m, int state)
{
    int best = -1;
    for (int s = 0; s < m->o.pool_slots; s++) {
        const gather_slot *sl = &m->gather[s];
        if (sl->state == G_EMPTY)
            return s;
        if (sl->state == state && (best < 0 || sl->used < m->gather[best].used))
            best = s;
    }
    return best;
}

/* Waits for slot s's allgather, if pending. Returns 0 or a collective's failure. */
static int settle_gather(ddp_model *m, int s, const char *fn)
{
    gather_slot *sl = &m->gather[s];
    if (!sl->req)
        return 0;
    int rc = coll_wait(sl->req);
    sl->req = NULL;
    if (rc != 0)
        return coll_fail(m, rc, "%s: waiting for the allgather of unit %s", fn, m->units[sl->unit]);
    return 0;
}

int ddp_unit_gather(ddp_model *m, int unit)
{
    if (!m)
        return -EINVAL;
    int rc = usable(m, "ddp_unit_gather");
    if (rc != 0)
        return rc;
    if (unit < 0 || unit >= m->nunits)
        return fail(m, -EINVAL, "ddp_unit_gather: no unit %d", unit);
    if (m->o.zero_stage != 3)
        return 0;
    int s = m->unit_slot[unit];
    if (s < 0) {
        /* Reuse an empty slot, else a released unit, else an unused prefetch. */
        s = find_slot(m, G_CACHED);
        if (s < 0 && (s = find_slot(m, G_PREFETCHED)) >= 0 &&
            (rc = settle_gather(m, s, "ddp_unit_gather")) != 0)
            return rc;
        if (s < 0)
            return fail(m, -ENOBUFS,
                        "ddp_unit_gather: unit %s: all %d gather slots hold units in use; "
                        "release units or raise pool_slots",
                        m->units[unit], m->o.pool_slots);
        if ((rc = issue_gather(m, s, unit, G_PINNED)) != 0)
            return rc;
    }
    m->gather[s].state = G_PINNED;

    /* The direction of travel: forward while units rise, backward while they fall. */
    if (m->last_gathered >= 0 && unit != m->last_gathered)
        m->dir = unit > m->last_gathered ? 1 : -1;
    m->last_gathered = unit;
    int next = unit + m->dir;
    if (next < 0 || next >= m->nunits)
        next = unit - m->dir; /* the turn at either end: what the other pass needs first */
    if (next >= 0 && next < m->nunits && m->unit_slot[next] < 0) {
        int p = find_slot(m, G_CACHED);
        if (p >= 0 && (rc = issue_gather(m, p, next, G_PREFETCHED)) != 0)
            return rc;
    }
    return settle_gather(m, s, "ddp_unit_gather");
}

int ddp_unit_release(ddp_model *m, int unit)
{
    if (!m)
        return -EINVAL;
    if (m->broken)
        return m->broken;
    if (unit < 0 || unit >= m->nunits)
        return fail(m, -EINVAL, "ddp_unit_release: no unit %d", unit);
    if (m->o.zero_stage != 3 || !m->committed)
        return 0;
    int s = m->unit_slot[unit];
    if (s < 0 || m->gather[s].state != G_PINNED)
        return fail(m, -EINVAL, "ddp_unit_release: unit %s is not gathered", m->units[unit]);
    m->gather[s].state = G_CACHED;
    m->gather[s].used = ++m->clock;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* The step                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/* Waits for every reduction of the micro-steps. Returns 0 or a collective's failure. */
static int finish_reductions(ddp_model *m)
{
    if (m->o.zero_stage <= 1) {
        for (int k = 0; k < m->plan.ngroups; k++) {
            int g = m->order[k];
            if (!m->group_req[g])
                continue;
            int rc = coll_wait(m->group_req[g]);
            m->group_req[g] = NULL;
            if (rc != 0)
                return coll_fail(m, rc, "ddp_step: waiting for the %s of bucket %d",
                                 m->o.zero_stage == 0 ? "allreduce" : "reduce-scatter", g);
            trace(m, DDP_EV_BUCKET_DONE, g);
        }
        return 0;
    }
    for (int s; (s = oldest_in_flight(m)) >= 0;) {
        int rc = retire(m, s, "ddp_step");
        if (rc != 0)
            return rc;
    }
    if (m->o.zero_stage == 3) {
        /* The parameters are about to change: every gathered copy goes stale. */
        for (int s = 0; s < m->o.pool_slots; s++) {
            int rc = settle_gather(m, s, "ddp_step");
            if (rc != 0)
                return rc;
            if (m->gather[s].unit >= 0)
                m->unit_slot[m->gather[s].unit] = -1;
            m->gather[s].unit = -1;
            m->gather[s].state = G_EMPTY;
        }
        m->last_gathered = -1;
        m->dir = 1;
    }
    return 0;
}

/* This rank's parameters, gradients and optimizer state of group g's owned part. */
static void owned(ddp_model *m, int g, float **p, float **gr, size_t *state_off)
{
    const ddp__group *grp = &m->plan.groups[g];
    size_t own = ddp__owned_offset(&m->plan, g, m->rank);
    int st = m->o.zero_stage;
    *p = m->params_mem + (st == 3 ? grp->shard_offset : own);
    *gr = m->grads + (st >= 2 ? grp->shard_offset : own);
    *state_off = grp->shard_offset;
}

static void update(ddp_model *m, float *p, const float *g, size_t state_off, size_t n, float lr)
{
    if (m->o.optimizer == DDP_ADAMW)
        ddp__adamw_step(p, g, m->state1 + state_off, m->state2 + state_off, n, lr, m->o.beta1,
                        m->o.beta2, m->o.eps, m->o.weight_decay, m->steps);
    else
        ddp__sgd_step(p, g, m->nstate ? m->state1 + state_off : NULL, n, lr, m->o.momentum,
                      m->o.nesterov, m->o.weight_decay, m->steps == 1);
}

int ddp_step(ddp_model *m, float lr, ddp_step_info *info)
{
    if (!m)
        return -EINVAL;
    int rc = usable(m, "ddp_step");
    if (rc != 0)
        return rc;
    if (m->in_micro)
        return fail(m, -EINVAL, "ddp_step: inside a micro-step (ddp_micro_end() first)");
    if (!m->synced)
        return fail(m, -EINVAL, "ddp_step: no micro-step with sync = 1 since the last step");
    if (!isfinite(lr) || lr < 0)
        return fail(m, -EINVAL, "ddp_step: the learning rate %g is not finite and >= 0", lr);
    if ((rc = finish_reductions(m)) != 0)
        return rc;

    const ddp__plan *pl = &m->plan;
    int st = m->o.zero_stage, ng = pl->ngroups;
    /* The global norm: stage 0's gradients are whole on every rank; else sum the owned parts. */
    double sq = 0;
    if (st == 0) {
        sq = ddp__sum_squares(m->grads, pl->total);
    } else if (st == 1) {
        for (int g = 0; g < ng; g++)
            sq +=
                ddp__sum_squares(m->grads + ddp__owned_offset(pl, g, m->rank), pl->groups[g].shard);
    } else {
        sq = ddp__sum_squares(m->grads, pl->shard_total);
    }
    if (st > 0 && (rc = coll_allreduce(m->comm, &sq, &sq, 1, COLL_F64, COLL_SUM)) != 0)
        return coll_fail(m, rc, "ddp_step: allreduce of the gradient norm");
    ddp_step_info out = {.grad_norm = sqrt(sq)};

    if (!isfinite(out.grad_norm)) {
        out.skipped = 1;
        logf_(m, COLL_LOG_WARN, "ddp_step: step %" PRId64 " skipped: the gradient norm is %g",
              m->steps + 1, out.grad_norm);
    } else {
        float scale = 1;
        if (m->o.clip_norm > 0) {
            double coef = (double)m->o.clip_norm / (out.grad_norm + 1e-6);
            if (coef < 1) {
                scale = (float)coef;
                out.clipped = 1;
            }
        }
        m->steps++;
        if (st == 0) {
            if (out.clipped)
                ddp__scale(m->grads, pl->total, scale);
            update(m, m->params_mem, m->grads, 0, pl->total, lr);
        } else {
            /* A group's allgather runs while the next group is updated. */
            for (int g = 0; g < ng; g++) {
                float *p, *gr;
                size_t so, n = pl->groups[g].shard;
                owned(m, g, &p, &gr, &so);
                if (out.clipped)
                    ddp__scale(gr, n, scale);
                update(m, p, gr, so, n, lr);
                if (st <= 2 &&
                    (rc = coll_iallgather(m->comm, p, m->params_mem + pl->groups[g].offset, n,
                                          COLL_F32, &m->step_req[g])) != 0)
                    return coll_fail(m, rc, "ddp_step: issuing the allgather of bucket %d", g);
            }
            for (int g = 0; st <= 2 && g < ng; g++) {
                rc = coll_wait(m->step_req[g]);
                m->step_req[g] = NULL;
                if (rc != 0)
                    return coll_fail(m, rc, "ddp_step: waiting for the allgather of bucket %d", g);
            }
        }
    }
    memset(m->grads, 0, m->grad_elems * sizeof *m->grads);
    m->synced = false;
    m->nmicro = 0;
    out.step = m->steps;
    trace(m, DDP_EV_STEP_END, (int)m->steps);
    if (info)
        *info = out;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Memory                                                                                      */
/* ------------------------------------------------------------------------------------------ */

int ddp_memory_stats(const ddp_model *m, ddp_memory *out)
{
    if (!m || !out || !m->committed)
        return -EINVAL;
    size_t f = sizeof(float), slot = m->plan.max_padded * f;
    ddp_memory r = {
        .param_bytes = m->param_elems * f,
        .grad_bytes = m->grad_elems * f,
        .optimizer_bytes = (size_t)m->nstate * m->state_elems * f,
        .pool_bytes = (size_t)m->o.pool_slots * slot * (m->stage != NULL) +
                      (size_t)m->o.pool_slots * slot * (m->gather != NULL),
    };
    r.model_state_bytes = r.param_bytes + r.grad_bytes + r.optimizer_bytes;
    *out = r;
    return 0;
}
