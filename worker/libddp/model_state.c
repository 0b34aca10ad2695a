/*
 * The committed model's state seen from outside the step: the memory it holds
 * (ddp_memory_stats()) and, for checkpoints (ckpt.c, through ddp_internal.h), a view of its
 * memory and layout, host copies of a device model's state, and what a load must redo
 * (upload, allgather, refresh the compute copy and the step count). Nothing here runs between
 * ddp_micro_begin() and ddp_step().
 */
#include "model.h"

#include <errno.h>
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
