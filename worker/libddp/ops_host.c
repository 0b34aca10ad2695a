/*
 * libddp's host operations table (ddp_ops.h): calloc'ed memory and optim.c's kernels. Nothing
 * here waits or fails but an allocation. The step's decision is made here, on the host, from
 * the sum of squares that ddp.c has reduced: skip when the norm is not finite (the norm is the
 * same on every rank, so every rank skips), else clip when it exceeds opts.clip_norm.
 *
 * Also the stand-in for the CUDA table in a build without CUDA (ddp__cuda_ops() is NULL).
 */
#include "ddp_ops.h"

#include "optim.h"
#include "optimizer.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int h_open(ddp__dev *d)
{
    d->ss = &d->host_ss;
    return 0;
}

static void h_close(ddp__dev *d)
{
    (void)d;
}

static int h_alloc(ddp__dev *d, size_t nbytes, void **out)
{
    (void)d;
    *out = NULL;
    if (nbytes == 0)
        return 0;
    return (*out = calloc(1, nbytes)) ? 0 : -ENOMEM;
}

static void h_release(ddp__dev *d, void *p)
{
    (void)d;
    free(p);
}

static int h_zero(ddp__dev *d, void *p, size_t nbytes)
{
    (void)d;
    if (nbytes)
        memset(p, 0, nbytes);
    return 0;
}

static int h_copy(ddp__dev *d, void *dst, const void *src, size_t nbytes)
{
    (void)d;
    if (nbytes && dst != src)
        memcpy(dst, src, nbytes);
    return 0;
}

/* sync, comm_mark, comm_wait: the host's work is done when its call returns. */
static int h_done(ddp__dev *d)
{
    (void)d;
    return 0;
}

static int h_to_bf16(ddp__dev *d, uint16_t *dst, const float *src, size_t n, float scale)
{
    (void)d;
    ddp__to_bf16(dst, src, n, scale);
    return 0;
}

static int h_from_bf16(ddp__dev *d, float *dst, const uint16_t *src, size_t n, int add)
{
    (void)d;
    ddp__from_bf16(dst, src, n, add);
    return 0;
}

static int h_add(ddp__dev *d, float *dst, const float *src, size_t n)
{
    (void)d;
    ddp__add(dst, src, n);
    return 0;
}

static int h_norm_begin(ddp__dev *d)
{
    d->host_ss = 0;
    return 0;
}

static int h_norm_add(ddp__dev *d, const float *grad, size_t n)
{
    d->host_ss += ddp__sum_squares(grad, n);
    return 0;
}

static int h_decide(ddp__dev *d, const ddp_options *o, int64_t *steps)
{
    ddp_step_info in = {.grad_norm = sqrt(d->host_ss)};
    d->clip_scale = 1;
    if (!isfinite(in.grad_norm)) {
        in.skipped = true;
    } else {
        if (o->clip_norm > 0 && in.grad_norm > o->clip_norm) {
            d->clip_scale = (float)(o->clip_norm / (in.grad_norm + 1e-6));
            in.clipped = true;
        }
        ++*steps;
    }
    in.step = *steps;
    d->info = in;
    return 0;
}

/* The update of one owned range; d->info.step is the count including this step. */
static int h_optimize(ddp__dev *d, const ddp_options *o, const ddp__optimizer_def *def, float lr,
                      float *param, float *grad, float *const *state, uint16_t *compute, size_t n)
{
    if (d->info.skipped)
        return 0;
    if (d->info.clipped)
        ddp__scale(grad, n, d->clip_scale);
    def->host(o, lr, d->info.step, param, grad, state, n);
    if (compute)
        ddp__to_bf16(compute, param, n, 1.0f);
    return 0;
}

static int h_info(ddp__dev *d, ddp_step_info *out)
{
    *out = d->info;
    return 0;
}

static int h_set_steps(ddp__dev *d, int64_t steps)
{
    d->info.step = steps;
    return 0;
}

const ddp__ops ddp__host_ops = {
    .is_device = 0,
    .open = h_open,
    .close = h_close,
    .alloc = h_alloc,
    .release = h_release,
    .zero = h_zero,
    .upload = h_copy,
    .download = h_copy,
    .sync = h_done,
    .to_bf16 = h_to_bf16,
    .from_bf16 = h_from_bf16,
    .add = h_add,
    .to_comm = h_done,
    .norm_begin = h_norm_begin,
    .norm_add = h_norm_add,
    .decide = h_decide,
    .optimize = h_optimize,
    .info = h_info,
    .set_steps = h_set_steps,
    .host_alloc = h_alloc,
    .host_release = h_release,
    .comm_copy = h_copy,
    .comm_mark = h_done,
    .comm_wait = h_done,
};

#ifndef DDP_HAVE_CUDA
#define DDP_HAVE_CUDA 0
#endif
#if !DDP_HAVE_CUDA
const ddp__ops *ddp__cuda_ops(void)
{
    return NULL;
}
#endif
