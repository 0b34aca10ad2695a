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
 * Not here: the model's struct (model.h, shared with exchange.c and model_state.c); the small
 * exchanges of host values (exchange.c); the memory figures and the checkpoints' view of the
 * state (model_state.c); checkpoints themselves (ckpt.c: this file only waits, before the
 * optimizer, for an asynchronous save's writer to have copied the state, polls the save after
 * each step, and joins its writer at free); where memory lives and what the step runs on it
 * (ddp_ops.h: the host table ops_host.c, the CUDA table ddp_cuda.cu); the optimizers (the
 * table optimizer.c, the kernels optim.c). Nothing is printed: the log hook gets skipped steps,
 * the trace hook timestamps.
 */
#include "ddp.h"

#include "ddp_internal.h"

#include "ddp_ops.h"
#include "errbuf.h"
#include "monoclock.h"
#include "optim.h"
#include "optimizer.h"
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

#include "model.h"

static _Thread_local errbuf create_err; /* ddp_last_error(NULL) */

/* ------------------------------------------------------------------------------------------ */
/* Errors and small helpers                                                                    */
/* ------------------------------------------------------------------------------------------ */

const char *ddp_strerror(int err)
{
    return coll_strerror(err);
}

void ddp_free(void *p)
{
    free(p);
}

const char *ddp_last_error(const ddp_model *m)
{
    return m ? m->err : create_err.msg;
}

int ddp_model_broken(const ddp_model *m)
{
    return !m ? -EINVAL : m->state == BROKEN ? m->broken_rc : 0;
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
 * A device operation failed (COLL_ECUDA; its message is in m->dev.err, which is m->err): the
 * model is broken from now on, as after a failed collective. rc 0 passes through.
 */
static int dev_check(ddp_model *m, int rc, const char *what)
{
    if (rc >= 0 || m->state == BROKEN)
        return rc < 0 ? m->broken_rc : rc;
    char detail[sizeof m->err];
    snprintf(detail, sizeof detail, "%s", m->err);
    fail(m, rc, "%s: %s: %s", what, ddp_strerror(rc), detail);
    return break_model(m, rc);
}

/*
 * Releases the requests that the streams already wait on (device models): those done, or all
 * of them (a host wait) when `all`. A failure found here is the collective's, as at a wait.
 */
static int retire(ddp_model *m, bool all)
{
    int kept = 0, rc = 0;
    for (int i = 0; i < m->nretire; i++) {
        coll_request *r = m->retire[i];
        bool done = all;
        if (!all && coll_test(r, &done) < 0)
            done = true;
        if (!done) {
            m->retire[kept++] = r;
            continue;
        }
        int w = coll_wait(r);
        if (w < 0 && rc == 0)
            rc = w;
    }
    m->nretire = kept;
    return rc < 0 ? coll_failed(m, rc, "a collective") : 0;
}

/*
 * Waits for *req and clears it: on the host, coll_wait(); on the device, the compute stream
 * waits for it (coll_request_stream_wait(): no host wait with nccl) and the request joins the
 * retire list, released once done. The list is bounded: when it is full, its oldest half is
 * waited for on the host (the host is then steps ahead of the device).
 */
static int await_req(ddp_model *m, coll_request **req, const char *what)
{
    coll_request *r = *req;
    *req = NULL;
    if (!m->ops->is_device) {
        int rc = coll_wait(r);
        return rc < 0 ? coll_failed(m, rc, what) : 0;
    }
    int rc = coll_request_stream_wait(r, m->dev.stream);
    if (rc < 0) {
        (void)coll_wait(r);
        return coll_failed(m, rc, what);
    }
    if (m->nretire == m->cap_retire) {
        int half = m->cap_retire / 2, w = 0;
        for (int i = 0; i < half; i++) {
            int x = coll_wait(m->retire[i]);
            w = w < 0 ? w : x;
        }
        memmove(m->retire, m->retire + half, (size_t)(m->nretire - half) * sizeof *m->retire);
        m->nretire -= half;
        if (w < 0) {
            (void)coll_wait(r);
            return coll_failed(m, w, what);
        }
    }
    m->retire[m->nretire++] = r;
    return 0;
}

/* Device models: the communication stream waits for the compute stream's work so far. */
static int to_comm(ddp_model *m)
{
    return dev_check(m, m->ops->to_comm(&m->dev), "ordering the streams");
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
        m->o.trace(m->o.trace_arg, ev, index, mono_now_ns());
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
    /* beta1, beta2 and eps are AdamW's defaults whatever the optimizer (ddp.h). */
    (void)ddp_options_set_optimizer(o, DDP_ADAMW);
    o->optimizer = DDP_SGD;
    o->device = -1;
}

/* NULL, or why o's hyper-parameters do not suit its optimizer (its row's check). */
static const char *optimizer_check(const ddp_options *o)
{
    const ddp__optimizer_def *def = ddp__optimizer(o->optimizer);
    return def && def->check ? def->check(o) : NULL;
}

int ddp_model_create(coll_comm *comm, const ddp_options *opts, ddp_model **out)
{
    errbuf_clear(&create_err);
    ddp_options o;
    if (opts)
        o = *opts;
    else
        ddp_options_init(&o);
    const char *bad = !comm || !out                          ? "NULL communicator or out"
                      : o.zero_stage < 0 || o.zero_stage > 3 ? "zero_stage must be 0..3"
                      : o.first_bucket_bytes == 0 || o.bucket_bytes == 0
                          ? "bucket sizes must be > 0"
                      : o.pool_slots < 2             ? "pool_slots must be >= 2"
                      : !ddp__optimizer(o.optimizer) ? "unknown optimizer"
                      : optimizer_check(&o)          ? optimizer_check(&o)
                      : o.precision != DDP_PREC_F32 && o.precision != DDP_PREC_BF16
                          ? "precision must be DDP_PREC_F32 or DDP_PREC_BF16"
                      : o.reduce_dtype != COLL_F32 && o.reduce_dtype != COLL_BF16
                          ? "reduce_dtype must be COLL_F32 or COLL_BF16"
                          : NULL;
    if (bad) {
        (void)errbuf_set(&create_err, 0, "ddp_model_create: %s", bad);
        return -EINVAL;
    }
    const ddp__ops *ops = o.device >= 0 ? ddp__cuda_ops() : &ddp__host_ops;
    if (!ops) {
        (void)errbuf_set(&create_err, 0,
                         "ddp_model_create: device %d: libddp was built without CUDA", o.device);
        return -ENOTSUP;
    }
    if (o.device < 0 && coll_comm_backend(comm) == COLL_BACKEND_NCCL) {
        (void)errbuf_set(
            &create_err, 0,
            "ddp_model_create: a host model (device -1) cannot use an nccl communicator");
        return -EINVAL;
    }
    ddp_model *m = calloc(1, sizeof *m);
    if (!m)
        return -ENOMEM;
    m->comm = comm;
    m->o = o;
    m->ops = ops;
    m->bf16 = o.precision == DDP_PREC_BF16;
    m->rbf16 = o.reduce_dtype == COLL_BF16;
    m->dev.device = o.device;
    m->dev.stream = o.stream;
    m->dev.err = m->err;
    m->dev.errlen = sizeof m->err;
    int rc = ops->open(&m->dev);
    if (rc == 0 && ops->is_device && coll_comm_set_stream(comm, m->dev.comm_stream) < 0)
        rc = -EINVAL;
    if (rc < 0) {
        (void)errbuf_set(&create_err, 0, "ddp_model_create: device %d: %.200s", o.device,
                         m->err[0] ? m->err : ddp_strerror(rc));
        if (ops->is_device)
            (void)coll_comm_set_stream(m->comm, NULL); /* the stream is closed below */
        ops->close(&m->dev);
        free(m);
        return rc;
    }
    m->rank = coll_comm_rank(comm);
    m->world = coll_comm_size(comm);
    m->last_gathered = -1;
    m->direction = 1;
    *out = m;
    return 0;
}

static void free_slots(ddp_model *m, slot *s, int n)
{
    for (int i = 0; s && i < n; i++) {
        if (s[i].req)
            (void)coll_wait(s[i].req);
        m->ops->release(&m->dev, s[i].buf);
        m->ops->release(&m->dev, s[i].bf);
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
    for (int i = 0; i < m->nretire; i++)
        (void)coll_wait(m->retire[i]);
    if (m->xch.req)
        (void)coll_wait(m->xch.req);
    free(m->retire);
    /* The device's queued work may still use the memory: let it finish first. */
    (void)m->ops->sync(&m->dev);
    free_slots(m, m->gslots, m->ngslots);
    free_slots(m, m->uslots, m->nuslots);
    ddp__plan_free(&m->plan);
    free(m->params);
    free(m->unit_names);
    const ddp__ops *ops = m->ops;
    ops->release(&m->dev, m->param);
    ops->release(&m->dev, m->grad);
    for (int k = 0; k < DDP__OPT_MAX_STATE; k++) {
        ops->release(&m->dev, m->opt[k]);
        free(m->hopt[k]);
    }
    ops->release(&m->dev, m->cparam);
    ops->release(&m->dev, m->rgrad);
    ddp__xch_release(m);
    free(m->hparam);
    /* close destroys the communication stream: the communicator, which outlives the model,
     * must not keep it (a later collective would be enqueued on a destroyed stream). */
    if (ops->is_device)
        (void)coll_comm_set_stream(m->comm, NULL);
    ops->close(&m->dev);
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
    enum { NX = 6 };
    int64_t mine[NX] = {m->o.zero_stage,
                        (int64_t)m->o.first_bucket_bytes,
                        (int64_t)m->o.bucket_bytes,
                        m->nparams,
                        m->o.precision,
                        m->o.reduce_dtype};
    int64_t *counts = calloc((size_t)m->world * NX, sizeof *counts);
    uint64_t *hashes = NULL, *all = NULL;
    int rc = -ENOMEM;
    if (!counts)
        goto out;
    rc = ddp__host_coll(m, DDP__HOST_ALLGATHER, mine, counts, NX, COLL_I64, COLL_SUM,
                        "ddp_model_commit: exchanging the layout");
    if (rc < 0)
        goto out;
    for (int r = 1; r < m->world; r++) {
        const int64_t *o = counts + NX * r;
        if (o[0] != counts[0] || o[1] != counts[1] || o[2] != counts[2] || o[4] != counts[4] ||
            o[5] != counts[5]) {
            rc = fail(m, -EINVAL,
                      "ddp_model_commit: the options differ: rank %d has zero_stage %" PRId64
                      ", buckets %" PRId64 "/%" PRId64 " bytes, precision %" PRId64
                      ", reduce_dtype %" PRId64 "; rank 0 %" PRId64 ", %" PRId64 "/%" PRId64
                      ", %" PRId64 ", %" PRId64,
                      r, o[0], o[1], o[2], o[4], o[5], counts[0], counts[1], counts[2], counts[4],
                      counts[5]);
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
    rc = ddp__host_coll(m, DDP__HOST_ALLGATHER, hashes, all, (size_t)m->nparams, COLL_I64, COLL_SUM,
                        "ddp_model_commit: exchanging the layout");
    if (rc < 0)
        goto out;
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

/* n slots of `elems` elements of esize bytes, plus a bf16 copy each when `bf`. */
static int alloc_slots(ddp_model *m, slot **s, int n, size_t elems, size_t esize, bool bf)
{
    *s = calloc((size_t)n, sizeof **s);
    if (!*s)
        return -ENOMEM;
    for (int i = 0; i < n; i++) {
        (*s)[i].group = -1;
        int rc = m->ops->alloc(&m->dev, elems * esize, (void **)&(*s)[i].buf);
        if (rc == 0 && bf)
            rc = m->ops->alloc(&m->dev, elems * sizeof(uint16_t), (void **)&(*s)[i].bf);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Allocates nelems of esize bytes of the model's memory (zeroed) into *p. */
static int alloc_model(ddp_model *m, void *p, size_t nelems, size_t esize)
{
    return m->ops->alloc(&m->dev, nelems * esize, (void **)p);
}

/* Whether commit's `host` buffer was malloc'ed (device models) rather than the model's own. */
static bool dev_host_buffer(const ddp_model *m, const float *host)
{
    return m->ops->is_device && host;
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
    float *host = NULL, *tmp = NULL; /* initial values: host memory, and stage 3's model buffer */
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
    size_t full = p->total, owned = p->shard_total, f = sizeof(float), h = sizeof(uint16_t);
    size_t nparam = stage == 3 ? owned : full;
    m->opt_elems = stage == 0 ? full : owned;
    rc = -ENOMEM;
    m->ready = calloc((size_t)G, sizeof *m->ready);
    m->req = calloc((size_t)G, sizeof *m->req);
    m->grad_slot = calloc((size_t)G, sizeof *m->grad_slot);
    m->marked = calloc((size_t)m->nparams, 1);
    m->done_seen = calloc((size_t)G, 1);
    m->cap_retire = 4 * G + 16;
    m->retire = calloc((size_t)m->cap_retire, sizeof *m->retire);
    if (!m->ready || !m->req || !m->grad_slot || !m->marked || !m->done_seen || !m->retire)
        goto out;
    if ((rc = alloc_model(m, &m->param, nparam, f)) < 0 ||
        (rc = alloc_model(m, &m->grad, stage >= 2 ? owned : full, f)) < 0 ||
        (m->bf16 && (rc = alloc_model(m, &m->cparam, nparam, h)) < 0) ||
        (m->rbf16 && stage < 2 && (rc = alloc_model(m, &m->rgrad, full, h)) < 0))
        goto alloc_failed;
    m->opt_def = ddp__optimizer(m->o.optimizer);
    m->nopt = ddp__optimizer_nstate(m->opt_def, &m->o);
    for (int k = 0; k < m->nopt; k++)
        if ((rc = alloc_model(m, &m->opt[k], m->opt_elems, f)) < 0)
            goto alloc_failed;
    for (int g = 0; g < G; g++)
        m->grad_slot[g] = -1;
    if (stage >= 2) {
        /* A group needs at most one slot at a time, so slots beyond the group count would only
         * hold memory. */
        m->ngslots = m->o.pool_slots < G ? m->o.pool_slots : G;
        if ((rc = alloc_slots(m, &m->gslots, m->ngslots, p->max_padded, f, m->rbf16)) < 0)
            goto alloc_failed;
    }
    if (stage == 3) {
        m->nuslots = m->ngslots;
        m->unit_slot = malloc((size_t)G * sizeof *m->unit_slot);
        rc = -ENOMEM;
        if (!m->unit_slot)
            goto out;
        /* Units are gathered in the compute precision. */
        if ((rc = alloc_slots(m, &m->uslots, m->nuslots, p->max_padded, m->bf16 ? h : f, false)) <
            0)
            goto alloc_failed;
        for (int g = 0; g < G; g++)
            m->unit_slot[g] = -1;
    }

    /*
     * Rank 0's initial values reach every rank (stage 3: each keeps its part of each unit). The
     * init function fills host memory: the parameter arena itself on the host; on the device, a
     * host buffer uploaded before the broadcast.
     */
    bool dev = m->ops->is_device;
    if (stage < 3) {
        if (dev && m->rank == 0 && !(host = malloc(full * f))) {
            rc = -ENOMEM;
            goto out;
        }
        if (!dev)
            host = m->param;
        for (int g = 0; g < G && m->rank == 0; g++)
            if ((rc = init_group(m, &p->groups[g], host + p->groups[g].offset, init, arg)) < 0)
                goto out; /* the other ranks fail in the broadcast, naming rank 0 */
        if (m->rank == 0 && (rc = dev_check(m, m->ops->upload(&m->dev, m->param, host, full * f),
                                            "ddp_model_commit: uploading the initial values")) < 0)
            goto out;
        rc = coll_broadcast(m->comm, m->param, m->param, full, COLL_F32, 0);
        if (rc < 0) {
            rc = coll_failed(m, rc, "ddp_model_commit: broadcasting rank 0's initial values");
            goto out;
        }
    } else {
        if ((rc = alloc_model(m, &tmp, p->max_padded, f)) < 0)
            goto alloc_failed;
        if (dev && !(host = malloc(p->max_padded * f))) {
            rc = -ENOMEM;
            goto out;
        }
        if (!dev)
            host = tmp;
        for (int g = 0; g < G; g++) {
            const ddp__group *gr = &p->groups[g];
            if (m->rank == 0 &&
                ((rc = init_group(m, gr, host, init, arg)) < 0 ||
                 (rc = dev_check(m, m->ops->upload(&m->dev, tmp, host, gr->padded * f),
                                 "ddp_model_commit: uploading")) < 0))
                goto out;
            rc = coll_broadcast(m->comm, tmp, tmp, gr->padded, COLL_F32, 0);
            if (rc < 0) {
                rc = coll_failed(m, rc, "ddp_model_commit: broadcasting rank 0's initial values");
                goto out;
            }
            if ((rc = m->ops->download(&m->dev, host, tmp, gr->padded * f)) < 0 ||
                (rc = m->ops->upload(&m->dev, m->param + p->shard_offset[g],
                                     host + (size_t)m->rank * gr->shard, gr->shard * f)) < 0) {
                rc = dev_check(m, rc, "ddp_model_commit: copying the owned part");
                goto out;
            }
        }
    }
    if (m->bf16 && (rc = dev_check(m, m->ops->to_bf16(&m->dev, m->cparam, m->param, nparam, 1.0f),
                                   "ddp_model_commit: the bf16 compute copy")) < 0)
        goto out;
    m->state = READY;
    rc = 0;
    goto out;
alloc_failed:
    if (rc != -ENOMEM)
        rc = dev_check(m, rc, "ddp_model_commit: allocating the model's memory");
out:
    if (rc == -ENOMEM && !m->err[0])
        fail(m, rc, "ddp_model_commit: out of memory");
    if (dev_host_buffer(m, host))
        free(host);
    m->ops->release(&m->dev, tmp);
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
        return m->bf16 ? (void *)(m->cparam + m->plan.param_offset[p])
                       : (void *)(m->param + m->plan.param_offset[p]);
    int g = m->plan.param_group[p], s = m->unit_slot[g];
    if (s < 0 || m->uslots[s].req) /* not gathered, or gathered but not waited for */
        return NULL;
    size_t at = m->plan.param_offset[p] - m->plan.groups[g].offset;
    return m->bf16 ? (void *)((uint16_t *)m->uslots[s].buf + at) : (void *)(m->uslots[s].buf + at);
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
    int g = sl->group, rc = await_req(m, &sl->req, "reducing gradients");
    if (rc < 0)
        return rc;
    trace_done(m, g);
    const ddp__group *gr = &m->plan.groups[g];
    size_t own = (size_t)m->rank * gr->shard;
    float *acc = m->grad + m->plan.shard_offset[g];
    rc = m->rbf16 ? m->ops->from_bf16(&m->dev, acc, sl->bf + own, gr->shard, 1)
                  : m->ops->add(&m->dev, acc, sl->buf + own, gr->shard);
    if ((rc = dev_check(m, rc, "accumulating reduced gradients")) < 0)
        return rc;
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
    int rc = dev_check(
        m, m->ops->zero(&m->dev, m->gslots[s].buf, m->plan.groups[g].padded * sizeof(float)),
        "zeroing a staging slot");
    if (rc < 0)
        return rc;
    m->gslots[s].group = g;
    m->grad_slot[g] = s;
    return s;
}

/* Issues group g's reduction: allreduce (stage 0) or reduce-scatter (stages 1-3). */
static int launch(ddp_model *m, int g)
{
    const ddp__group *gr = &m->plan.groups[g];
    int stage = m->o.zero_stage;
    slot *sl = stage >= 2 ? &m->gslots[m->grad_slot[g]] : NULL;
    float *b = sl ? sl->buf : m->grad + gr->offset;
    coll_request **req = sl ? &sl->req : &m->req[g];
    size_t own = (size_t)m->rank * gr->shard;
    trace(m, DDP_EV_BUCKET_LAUNCH, g);
    /* reduce_dtype bf16: the bucket cast to bf16, pre-divided by the world size, then summed. */
    void *buf = b;
    coll_dtype dt = COLL_F32;
    coll_op op = COLL_AVG;
    if (m->rbf16) {
        uint16_t *hb = sl ? sl->bf : m->rgrad + gr->offset;
        int rc = m->ops->to_bf16(&m->dev, hb, b, gr->padded, 1.0f / (float)m->world);
        if ((rc = dev_check(m, rc, "casting gradients to bf16")) < 0)
            return rc;
        buf = hb;
        dt = COLL_BF16;
        op = COLL_SUM;
    }
    int rc = to_comm(m); /* the reduction reads what backward (and the cast) wrote */
    if (rc < 0)
        return rc;
    size_t esz = coll_dtype_size(dt);
    if (stage == 0)
        rc = coll_iallreduce(m->comm, buf, buf, gr->padded, dt, op, req);
    else
        rc = coll_ireduce_scatter(m->comm, buf, (char *)buf + own * esz, gr->shard, dt, op, req);
    if (sl)
        sl->seq = ++m->seq;
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
        int rc = await_req(m, &m->req[g], "reducing gradients");
        if (rc < 0)
            return rc;
        trace_done(m, g);
        if (m->rbf16) { /* back to f32: the whole bucket (stage 0) or the owned part (1) */
            const ddp__group *gr = &m->plan.groups[g];
            size_t at = gr->offset + (m->o.zero_stage ? (size_t)m->rank * gr->shard : 0);
            size_t n = m->o.zero_stage ? gr->shard : gr->padded;
            rc = m->ops->from_bf16(&m->dev, m->grad + at, m->rgrad + at, n, 0);
            if ((rc = dev_check(m, rc, "casting reduced gradients to f32")) < 0)
                return rc;
        }
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

int ddp_micro_begin(ddp_model *m, bool sync)
{
    int rc = usable(m);
    if (rc < 0)
        return rc;
    if (m->in_micro)
        return fail(m, -EINVAL, "ddp_micro_begin: the previous micro-step did not end");
    /* A synchronising micro-step is the step's last: at stages 0-1 another would add into
     * gradients whose reduction may still be in flight, and reduce them a second time. */
    if (m->sync_ended)
        return fail(m, -EINVAL,
                    "ddp_micro_begin: a micro-step with sync true ended, and must be the last "
                    "before ddp_step() (earlier micro-steps take sync false)");
    m->in_micro = true;
    m->sync_asked = sync;
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
    m->sync_ended = m->sync_asked;
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
    /* The gather reads the owned part the optimizer wrote and overwrites what the slot's last
     * unit was read for: on the device, both are behind the compute stream. */
    if ((*rc = to_comm(m)) < 0)
        return -1;
    const void *src = m->bf16 ? (const void *)(m->cparam + m->plan.shard_offset[u])
                              : (const void *)(m->param + m->plan.shard_offset[u]);
    *rc =
        coll_iallgather(m->comm, src, sl->buf, g->shard, m->bf16 ? COLL_BF16 : COLL_F32, &sl->req);
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
    if (m->uslots[s].req)
        return await_req(m, &m->uslots[s].req, "gathering a unit's parameters");
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
            int rc = await_req(m, &sl->req, "gathering a unit's parameters");
            if (rc < 0)
                return rc;
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

/* An owned range: the parameters, their gradients, their compute copy, the state's offset. */
typedef struct owned {
    float *param, *grad;
    uint16_t *compute; /* NULL at f32 */
    size_t state_at, n;
} owned;

/* The i-th owned range (i from 0); false past the last. */
static bool owned_range(const ddp_model *m, int i, owned *r)
{
    const ddp__plan *p = &m->plan;
    int stage = m->o.zero_stage;
    if (stage == 0 || stage == 3) {
        if (i > 0)
            return false;
        size_t n = stage == 0 ? p->total : p->shard_total;
        *r = (owned){m->param, m->grad, m->cparam, 0, n};
        return true;
    }
    if (i >= p->ngroups)
        return false;
    const ddp__group *gr = &p->groups[i];
    size_t own = gr->offset + (size_t)m->rank * gr->shard;
    float *grad = stage == 1 ? m->grad + own : m->grad + p->shard_offset[i];
    *r = (owned){m->param + own, grad, m->cparam ? m->cparam + own : NULL, p->shard_offset[i],
                 gr->shard};
    return true;
}

/*
 * What the optimizer updates, group by group (g from 0; false past the last): owned_range()'s
 * ranges, with stage 0's arena and stage 3's owned parts cut at the groups. The cut changes no
 * value (the optimizer is element-wise); it lets each group be updated as soon as an
 * asynchronous save's writer has copied it (ddp__ckpt_wait_group()).
 */
static bool optimizer_range(const ddp_model *m, int g, owned *r)
{
    const ddp__plan *p = &m->plan;
    int stage = m->o.zero_stage;
    if (stage == 1 || stage == 2)
        return owned_range(m, g, r);
    if (g >= p->ngroups)
        return false;
    owned w;
    owned_range(m, 0, &w);
    const ddp__group *gr = &p->groups[g];
    size_t a = stage == 0 ? gr->offset : p->shard_offset[g];
    *r = (owned){w.param + a, w.grad + a, w.compute ? w.compute + a : NULL, w.state_at + a,
                 stage == 0 ? gr->padded : gr->shard};
    return true;
}

/*
 * Stages 1-2: every rank's updated parts back into every rank's full parameters: the compute
 * copy at bf16 (the f32 masters outside the owned part are then not kept: nothing reads them),
 * else the f32 parameters. On the device the gather waits for the optimizer (an event on the
 * compute stream) and the compute stream for the gather.
 */
static int gather_params(ddp_model *m)
{
    const ddp__plan *p = &m->plan;
    int rc = to_comm(m);
    for (int g = 0; rc == 0 && g < p->ngroups; g++) {
        const ddp__group *gr = &p->groups[g];
        size_t own = (size_t)m->rank * gr->shard;
        if (m->bf16) {
            uint16_t *b = m->cparam + gr->offset;
            rc = coll_iallgather(m->comm, b + own, b, gr->shard, COLL_BF16, &m->req[g]);
        } else {
            float *b = m->param + gr->offset;
            rc = coll_iallgather(m->comm, b + own, b, gr->shard, COLL_F32, &m->req[g]);
        }
        if (rc < 0)
            return coll_failed(m, rc, "gathering the updated parameters");
    }
    for (int g = 0; rc == 0 && g < p->ngroups; g++)
        rc = await_req(m, &m->req[g], "gathering the updated parameters");
    return rc;
}

/*
 * The step: the norm over the owned ranges (allreduced when sharded), the decision (ops), the
 * optimizer over the owned ranges, the gather (stages 1-2), the gradients zeroed. On the host
 * the decision is known here, and a skipped step changes nothing; on the device the kernels
 * read it, so the gather runs either way (it then gathers unchanged values).
 */
int ddp_step(ddp_model *m, float lr, ddp_step_info *info)
{
    int rc = usable(m);
    if (rc < 0)
        return rc;
    if (m->in_micro || !m->synced)
        return fail(m, -EINVAL,
                    "ddp_step: no complete micro-step with sync = 1 since the last "
                    "step");
    bool dev = m->ops->is_device;
    if ((rc = retire(m, false)) < 0 || (rc = finish_reductions(m)) < 0 ||
        (rc = ddp__drop_units(m)) < 0)
        return rc;
    int stage = m->o.zero_stage;
    const ddp__ops *ops = m->ops;
    owned r;

    rc = ops->norm_begin(&m->dev);
    for (int i = 0; rc == 0 && owned_range(m, i, &r); i++)
        rc = ops->norm_add(&m->dev, r.grad, r.n);
    if ((rc = dev_check(m, rc, "ddp_step: the gradient norm")) < 0)
        return rc;
    if (stage > 0) {
        coll_request *req = NULL;
        if ((rc = to_comm(m)) < 0)
            return rc;
        rc = coll_iallreduce(m->comm, m->dev.ss, m->dev.ss, 1, COLL_F64, COLL_SUM, &req);
        if (rc < 0)
            return coll_failed(m, rc, "summing the gradient norm");
        if ((rc = await_req(m, &req, "summing the gradient norm")) < 0)
            return rc;
    }
    if ((rc = dev_check(m, ops->decide(&m->dev, &m->o, &m->steps), "ddp_step: deciding")) < 0)
        return rc;
    ddp_step_info in = m->dev.info; /* the host's decision; the device's is read on demand */
    if (dev || !in.skipped) {
        /* An asynchronous save's writer may still be copying: each group waits for its own
         * parts only. A device model's writer copies the host copy the save downloaded, which
         * the optimizer does not change: nothing to wait for. */
        int64_t waited = 0;
        for (int g = 0; rc == 0 && optimizer_range(m, g, &r); g++) {
            waited += dev ? 0 : ddp__ckpt_wait_group(m->ck, g);
            float *state[DDP__OPT_MAX_STATE] = {NULL};
            for (int k = 0; k < m->nopt; k++)
                state[k] = m->opt[k] + r.state_at;
            rc = ops->optimize(&m->dev, &m->o, m->opt_def, lr, r.param, r.grad, state, r.compute,
                               r.n);
        }
        ddp__ckpt_waited(m->ck, waited);
        if ((rc = dev_check(m, rc, "ddp_step: the optimizer")) < 0)
            return rc;
        if ((stage == 1 || stage == 2) && (rc = gather_params(m)) < 0)
            return rc;
    }
    rc = ops->zero(&m->dev, m->grad,
                   (stage >= 2 ? m->plan.shard_total : m->plan.total) * sizeof(float));
    if ((rc = dev_check(m, rc, "ddp_step: zeroing the gradients")) < 0)
        return rc;
    m->synced = m->sync_ended = false;
    int64_t attempt = m->attempted;
    trace(m, DDP_EV_STEP_END, (int)m->attempted++);
    if (m->ck && (rc = ddp__ckpt_poll(m)) < 0)
        return rc;
    /* A device's decision is known here only when info is wanted (a synchronisation). */
    if (info && dev && (rc = ddp_step_info_get(m, &in)) < 0)
        return rc;
    if ((!dev || info) && in.skipped && m->o.log) {
        char msg[128];
        snprintf(msg, sizeof msg, "step %" PRId64 " skipped: the gradient norm is %g", attempt,
                 in.grad_norm);
        m->o.log(m->o.log_arg, COLL_LOG_WARN, msg);
    }
    if (info)
        *info = in;
    return 0;
}

int ddp_step_info_get(ddp_model *m, ddp_step_info *out)
{
    if (!m || !out || m->state == BUILDING)
        return m ? fail(m, -EINVAL, "ddp_step_info_get: NULL out, or not committed") : -EINVAL;
    if (m->state == BROKEN)
        return m->broken_rc;
    ddp_step_info in;
    int rc = dev_check(m, m->ops->info(&m->dev, &in), "ddp_step_info_get");
    if (rc < 0)
        return rc;
    if (m->attempted == 0)
        in = (ddp_step_info){0};
    m->steps = in.step;
    *out = in;
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

int ddp__usable(ddp_model *m)
{
    return usable(m);
}

int ddp__dev_check(ddp_model *m, int rc, const char *what)
{
    return dev_check(m, rc, what);
}

int ddp__coll_failed(ddp_model *m, int rc, const char *what)
{
    return coll_failed(m, rc, what);
}

int ddp__allgather_f32(ddp_model *m, const float *part, float *full, size_t count, const char *what)
{
    coll_request *req = NULL;
    int rc = to_comm(m);
    if (rc < 0)
        return rc;
    if ((rc = coll_iallgather(m->comm, part, full, count, COLL_F32, &req)) < 0)
        return coll_failed(m, rc, what);
    return await_req(m, &req, what);
}
