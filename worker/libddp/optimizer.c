/*
 * libddp's optimizers, one row each (optimizer.h): the name, the state arrays, the
 * hyper-parameters and their defaults, the check of the options, and the kernels on the host
 * (optim.c) and on a CUDA device (ddp_cuda.cu). The only place that names an optimizer; the
 * public ddp_optimizer_name(), ddp_optimizer_from_name() and ddp_options_set_optimizer() read
 * the table too. No state, no I/O.
 */
#include "optimizer.h"

#include "optim.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>

#ifndef DDP_HAVE_CUDA
#define DDP_HAVE_CUDA 0
#endif
#if DDP_HAVE_CUDA
#define DEVICE(fn) fn
#else
#define DEVICE(fn) NULL
#endif

#define HPARAM(field, dflt)                                                                        \
    {                                                                                              \
#field, offsetof(ddp_options, field), false, dflt                                          \
    }
#define HFLAG(field)                                                                               \
    {                                                                                              \
#field, offsetof(ddp_options, field), true, 0                                              \
    }

/* SGD: a momentum buffer when momentum != 0; weight decay added to the gradient. */
static int sgd_nstate(const ddp_options *o)
{
    return o->momentum != 0 ? 1 : 0;
}

static const char *sgd_check(const ddp_options *o)
{
    return o->nesterov && o->momentum <= 0 ? "Nesterov needs momentum > 0" : NULL;
}

static void sgd_host(const ddp_options *o, float lr, int64_t step, float *param, const float *grad,
                     float *const *state, size_t n)
{
    ddp__sgd_step(param, grad, state[0], n, lr, o->momentum, o->nesterov, o->weight_decay,
                  step == 1);
}

/* AdamW: two moments; weight decay decoupled. */
static void adamw_host(const ddp_options *o, float lr, int64_t step, float *param,
                       const float *grad, float *const *state, size_t n)
{
    ddp__adamw_step(param, grad, state[0], state[1], n, lr, o->beta1, o->beta2, o->eps,
                    o->weight_decay, step);
}

/* Lion: one momentum, a sign update; weight decay decoupled. */
static void lion_host(const ddp_options *o, float lr, int64_t step, float *param, const float *grad,
                      float *const *state, size_t n)
{
    (void)step;
    ddp__lion_step(param, grad, state[0], n, lr, o->beta1, o->beta2, o->weight_decay);
}

static const ddp__optimizer_def table[] = {
    {.id = DDP_SGD,
     .name = "sgd",
     .state = {"momentum_buffer"},
     .nstate = sgd_nstate,
     .hparams = {HPARAM(momentum, 0), HFLAG(nesterov)},
     .check = sgd_check,
     .host = sgd_host,
     .device = DEVICE(ddp__cuda_sgd_step)},
    {.id = DDP_ADAMW,
     .name = "adamw",
     .state = {"exp_avg", "exp_avg_sq"},
     .hparams = {HPARAM(beta1, 0.9f), HPARAM(beta2, 0.999f), HPARAM(eps, 1e-8f)},
     .host = adamw_host,
     .device = DEVICE(ddp__cuda_adamw_step)},
    {.id = DDP_LION,
     .name = "lion",
     .state = {"exp_avg"},
     .hparams = {HPARAM(beta1, 0.9f), HPARAM(beta2, 0.99f)},
     .host = lion_host,
     .device = DEVICE(ddp__cuda_lion_step)},
};

#define COUNT (sizeof table / sizeof table[0])

const ddp__optimizer_def *ddp__optimizer(ddp_optimizer opt)
{
    /* The rows are in enum order (checked by tests/test_ddp_optim.c through the names). */
    return (unsigned)opt < COUNT ? &table[opt] : NULL;
}

int ddp__optimizer_nstate(const ddp__optimizer_def *def, const ddp_options *o)
{
    if (def->nstate)
        return def->nstate(o);
    int n = 0;
    while (n < DDP__OPT_MAX_STATE && def->state[n])
        n++;
    return n;
}

const char *ddp_optimizer_name(ddp_optimizer opt)
{
    const ddp__optimizer_def *def = ddp__optimizer(opt);
    return def ? def->name : NULL;
}

int ddp_optimizer_from_name(const char *name)
{
    for (size_t i = 0; name && i < COUNT; i++)
        if (strcmp(table[i].name, name) == 0)
            return (int)table[i].id;
    return -EINVAL;
}

int ddp_options_set_optimizer(ddp_options *opts, ddp_optimizer opt)
{
    const ddp__optimizer_def *def = ddp__optimizer(opt);
    if (!opts || !def)
        return -EINVAL;
    opts->optimizer = opt;
    for (int k = 0; k < DDP__OPT_MAX_HPARAMS && def->hparams[k].name; k++) {
        const ddp__hparam *h = &def->hparams[k];
        if (h->is_bool)
            *(bool *)((char *)opts + h->offset) = false;
        else
            *(float *)((char *)opts + h->offset) = h->def;
    }
    return 0;
}
