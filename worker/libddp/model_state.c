/*
 * The committed model's state seen from outside the step: the memory it holds
 * (ddp_memory_stats()) and, for checkpoints (ckpt.c, through ddp_internal.h), a view of its
 * memory and layout, host copies of a device model's state, and what a load must redo
 * (upload, allgather, refresh the compute copy and the step count); and the full, unsharded
 * state copied out to the caller (ddp_model_get_params()). Nothing here runs inside a
 * micro-step.
 */
#include "model.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ddp_memory_stats(const ddp_model *m, ddp_memory *out)
{
    if (!m || !out || m->state == BUILDING)
        return -EINVAL;
    int stage = m->o.zero_stage;
    size_t f = sizeof(float), full = m->plan.total * f, owned = m->plan.shard_total * f;
    ddp_memory s = {0};
    size_t h = sizeof(uint16_t), np = stage == 3 ? m->plan.shard_total : m->plan.total;
    s.param_bytes = (stage == 3 ? owned : full) + (m->cparam ? np * h : 0); /* + compute copy */
    s.grad_bytes = stage >= 2 ? owned : full;
    s.optimizer_bytes = (size_t)m->nopt * m->opt_elems * f;
    /* Gradient slots (and their bf16 copies), gathered units (in the compute precision), and
     * stages 0-1's bf16 reduction copy of the arena. */
    s.pool_bytes = (size_t)m->ngslots * m->plan.max_padded * (f + (m->rbf16 ? h : 0)) +
                   (size_t)m->nuslots * m->plan.max_padded * (m->bf16 ? h : f) +
                   (m->rgrad ? m->plan.total * h : 0);
    s.model_state_bytes = s.param_bytes + s.grad_bytes + s.optimizer_bytes;
    *out = s;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* For ckpt.c (ddp_internal.h)                                                                 */
/* ------------------------------------------------------------------------------------------ */

int ddp__model_view_get(ddp_model *m, ddp__model_view *v)
{
    int rc = ddp__usable(m);
    if (rc < 0)
        return rc;
    if (m->in_micro)
        return ddp__fail(m, -EINVAL,
                         "a checkpoint is taken between steps, not inside a micro-step");
    *v = (ddp__model_view){
        .comm = m->comm,
        .rank = m->rank,
        .world = m->world,
        .stage = m->o.zero_stage,
        .o = &m->o,
        .plan = &m->plan,
        .param = m->param,
        .nopt = m->nopt,
        .compute = m->cparam,
        .opt_elems = m->opt_elems,
        .steps = &m->steps,
        .attempted = &m->attempted,
        .ck = &m->ck,
    };
    for (int k = 0; k < m->nopt; k++)
        v->opt[k] = m->opt[k];
    return 0;
}
/* A device model's parameters and optimizer state: to the device from the host copy (up), or
 * from the device into it. */
static int copy_state(ddp_model *m, bool up)
{
    const ddp__ops *o = m->ops;
    size_t np = m->o.zero_stage == 3 ? m->plan.shard_total : m->plan.total;
    int rc = 0;
    for (int i = 0; i <= m->nopt && rc == 0; i++) { /* the parameters, then the state arrays */
        float *dev = i ? m->opt[i - 1] : m->param, *host = i ? m->hopt[i - 1] : m->hparam;
        size_t bytes = (i ? m->opt_elems : np) * sizeof(float);
        rc = up ? o->upload(&m->dev, dev, host, bytes) : o->download(&m->dev, host, dev, bytes);
    }
    return ddp__dev_check(m, rc,
                          up ? "checkpoint: copying the state to the device"
                             : "checkpoint: copying the state from the device");
}

int ddp__model_view_host(ddp_model *m, ddp__model_view *v, bool download)
{
    int rc = ddp__model_view_get(m, v);
    if (rc < 0 || !m->ops->is_device)
        return rc;
    size_t np = m->o.zero_stage == 3 ? m->plan.shard_total : m->plan.total, f = sizeof(float);
    bool ok = m->hparam || (m->hparam = malloc(np * f));
    for (int k = 0; ok && k < m->nopt; k++)
        ok = m->hopt[k] || (m->hopt[k] = malloc(m->opt_elems * f));
    if (!ok)
        return ddp__fail(m, -ENOMEM, "checkpoint: out of memory for the host copy of the state");
    if (download) {
        ddp_step_info in;
        if ((rc = ddp_step_info_get(m, &in)) < 0) /* synchronises; the device's step count */
            return rc;
        if ((rc = copy_state(m, false)) < 0)
            return rc;
    }
    v->param = m->hparam;
    for (int k = 0; k < m->nopt; k++)
        v->opt[k] = m->hopt[k];
    return 0;
}

int ddp__state_loaded(ddp_model *m)
{
    const ddp__plan *pl = &m->plan;
    const ddp__ops *o = m->ops;
    int stage = m->o.zero_stage, rc = 0;
    size_t np = stage == 3 ? pl->shard_total : pl->total;
    if (o->is_device) {
        if ((rc = copy_state(m, true)) < 0)
            return rc;
    }
    /* Stages 0-2: every rank's parts of the parameters (stage 0: also the optimizer's arrays). */
    for (int s = 0; stage < 3 && s <= (stage == 0 ? m->nopt : 0); s++) {
        float *array = s ? m->opt[s - 1] : m->param;
        for (int g = 0; g < pl->ngroups; g++) {
            const ddp__group *gr = &pl->groups[g];
            float *b = array + gr->offset;
            rc = coll_allgather(m->comm, b + (size_t)m->rank * gr->shard, b, gr->shard, COLL_F32);
            if (rc < 0)
                return ddp__coll_failed(m, rc, "checkpoint: gathering the loaded state");
        }
    }
    if (m->bf16 && (rc = ddp__dev_check(m, o->to_bf16(&m->dev, m->cparam, m->param, np, 1.0f),
                                        "checkpoint: refreshing the bf16 compute copy")) < 0)
        return rc;
    return ddp__dev_check(m, o->set_steps(&m->dev, m->steps), "checkpoint: the step count");
}

/* ------------------------------------------------------------------------------------------ */
/* The full state, for the caller (ddp_model_get_params())                                     */
/* ------------------------------------------------------------------------------------------ */

const char *ddp_model_state_name(const ddp_model *m, int k)
{
    if (!m || m->state == BUILDING || k < 0 || k > m->nopt)
        return NULL;
    return k == 0 ? "param" : m->opt_def->state[k - 1];
}

/* The elements of every parameter, padding excluded. */
static size_t param_elems(const ddp_model *m)
{
    size_t n = 0;
    for (int p = 0; p < m->nparams; p++)
        n += m->params[p].count;
    return n;
}

size_t ddp_model_params_bytes(const ddp_model *m, unsigned flags)
{
    if (!m || m->state == BUILDING || (flags & ~DDP_GET_OPTIMIZER))
        return 0;
    int narrays = 1 + (flags & DDP_GET_OPTIMIZER ? m->nopt : 0);
    return (size_t)narrays * param_elems(m) * sizeof(float);
}

/*
 * State array s (0: the parameters, then the optimizer's) of group g: this rank's owned part
 * (`shard` elements) and, at stage 0, where the whole group is (every rank holds it: NULL at
 * stages 1-3). The f32 masters are read at every precision: at bf16, stages 1-2 keep only the
 * owned part of them current (the gather refreshes the compute copy).
 */
static const float *owned_part(const ddp_model *m, int s, int g, const float **whole)
{
    const ddp__group *gr = &m->plan.groups[g];
    int stage = m->o.zero_stage;
    const float *array = s == 0 ? m->param : m->opt[s - 1];
    /* Compact owned parts: stage 3's parameters, stages 1-3's optimizer state. */
    bool compact = s == 0 ? stage == 3 : stage > 0;
    *whole = stage == 0 ? array + gr->offset : NULL;
    return compact ? array + m->plan.shard_offset[g]
                   : array + gr->offset + (size_t)m->rank * gr->shard;
}

/*
 * The arguments every rank must agree on (root, flags), and whether this rank can take part
 * (its arguments good, its buffers allocated): one small allreduce, so that every rank returns
 * the same code rather than some waiting in a gather that the others never issue. `bad`: why
 * this rank cannot (NULL: it can). Returns 0, or -EINVAL (m's error says what is wrong with
 * this rank's, or names the first rank at fault, or says that the ranks differ), or the
 * exchange's failure.
 */
static int agree(ddp_model *m, int root, unsigned flags, const char *bad)
{
    /* Maxima: root and -root (equal on every rank exactly when max(-root) == -max(root)),
     * likewise flags, and world - rank for a rank that cannot take part (the first such rank). */
    int64_t x[5] = {root, -(int64_t)root, flags, -(int64_t)flags, bad ? m->world - m->rank : 0};
    int rc = ddp__host_coll(m, DDP__HOST_ALLREDUCE, x, x, 5, COLL_I64, COLL_MAX,
                            "ddp_model_get_params: exchanging the arguments");
    if (rc < 0)
        return rc;
    if (bad)
        return ddp__fail(m, -EINVAL, "ddp_model_get_params: %s", bad);
    if (x[4])
        return ddp__fail(m, -EINVAL,
                         "ddp_model_get_params: rank %" PRId64
                         " passed a bad argument or could not allocate",
                         m->world - x[4]);
    if (x[0] != -x[1] || x[2] != -x[3])
        return ddp__fail(m, -EINVAL,
                         "ddp_model_get_params: the ranks passed different roots "
                         "or flags (every rank passes the same)");
    return 0;
}

int ddp_model_get_params(ddp_model *m, int root, void *dst, size_t nbytes, unsigned flags)
{
    int rc = ddp__usable(m);
    if (rc < 0)
        return rc;
    if (m->in_micro)
        return ddp__fail(m, -EINVAL, "ddp_model_get_params: inside a micro-step");
    const ddp__plan *pl = &m->plan;
    const ddp__ops *ops = m->ops;
    bool receive = root == DDP_ALL_RANKS || root == m->rank;
    size_t need = ddp_model_params_bytes(m, flags), f = sizeof(float);
    int stage = m->o.zero_stage, narrays = 1 + (flags & DDP_GET_OPTIMIZER ? m->nopt : 0);
    char why[160];
    const char *bad = NULL;
    if (root < DDP_ALL_RANKS || root >= m->world) {
        snprintf(why, sizeof why, "root %d: not a rank (0..%d) nor DDP_ALL_RANKS", root,
                 m->world - 1);
        bad = why;
    } else if (flags & ~DDP_GET_OPTIMIZER) {
        snprintf(why, sizeof why, "unknown flags %#x", flags & ~DDP_GET_OPTIMIZER);
        bad = why;
    } else if (receive && (!dst || nbytes < need)) {
        snprintf(why, sizeof why, "the buffer holds %zu bytes, %zu needed", dst ? nbytes : 0, need);
        bad = why;
    }
    /* What the copy needs, allocated before the exchange, so that a rank without it says so
     * there: each parameter's place in dst; a group gathered (model memory) and its host copy
     * (device models). */
    size_t *packed = malloc((size_t)m->nparams * sizeof *packed), total = 0;
    float *gathered = NULL, *host = NULL;
    int arc = 0;
    if (stage > 0)
        arc = ops->alloc(&m->dev, pl->max_padded * f, (void **)&gathered);
    if (!packed || arc == -ENOMEM || (ops->is_device && !(host = malloc(pl->max_padded * f))))
        arc = -ENOMEM;
    if (arc < 0 && !bad)
        bad = arc == -ENOMEM ? "out of memory" : "allocating device memory failed";
    rc = agree(m, root, flags, bad);
    if (arc < 0) /* this rank's own failure rather than -EINVAL */
        rc = arc == -ENOMEM ? ddp__fail(m, arc, "ddp_model_get_params: out of memory")
                            : ddp__dev_check(m, arc, "ddp_model_get_params: allocating");
    if (rc < 0)
        goto out;
    for (int p = 0; p < m->nparams; total += m->params[p++].count)
        packed[p] = total;
    for (int s = 0; s < narrays; s++) {
        float *out = receive ? (float *)dst + (size_t)s * total : NULL;
        for (int g = 0; g < pl->ngroups; g++) {
            const ddp__group *gr = &pl->groups[g];
            const float *whole, *part = owned_part(m, s, g, &whole);
            if (!whole) {
                if ((rc = ddp__allgather_f32(m, part, gathered, gr->shard,
                                             "ddp_model_get_params: gathering the state")) < 0)
                    goto out;
                whole = gathered;
            }
            if (!out)
                continue;
            if (host) {
                rc = ops->download(&m->dev, host, whole, gr->padded * f);
                if ((rc = ddp__dev_check(m, rc, "ddp_model_get_params: copying to the host")) < 0)
                    goto out;
                whole = host;
            }
            /* The group's parameters, padding dropped, at their places in registration order. */
            for (int p = gr->first; p <= gr->last; p++)
                memcpy(out + packed[p], whole + (pl->param_offset[p] - gr->offset),
                       m->params[p].count * f);
        }
    }
out:
    free(packed);
    free(host);
    ops->release(&m->dev, gathered);
    return rc;
}
