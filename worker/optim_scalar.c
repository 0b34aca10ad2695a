/*
 * A plain-C stand-in for libddp's optimizer kernels (optim.h) and ddp_schedule_lr(), so that
 * libddp builds and its tests run before the vectorised kernels of branch wt-optim land; that
 * work replaces this file. One loop per kernel, in the operation order optim.h states, no
 * attempt at speed. Pure: no I/O, no allocation, no state.
 */
#include "optim.h"

#include <math.h>

void ddp__sgd_step(float *param, const float *grad, float *momentum_buf, size_t n, float lr,
                   float momentum, int nesterov, float weight_decay, int first_step)
{
    for (size_t i = 0; i < n; i++) {
        float g = grad[i];
        if (weight_decay != 0)
            g = fmaf(weight_decay, param[i], g);
        if (momentum != 0) {
            float buf = first_step ? g : momentum_buf[i] * momentum + g;
            momentum_buf[i] = buf;
            g = nesterov ? fmaf(momentum, buf, g) : buf;
        }
        param[i] = fmaf(-lr, g, param[i]);
    }
}

void ddp__adamw_step(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, int64_t step)
{
    float decay = (float)(1.0 - (double)lr * weight_decay);
    float w = (float)(1.0 - beta1), c2 = (float)(1.0 - beta2);
    float bc2_sqrt = (float)sqrt(1.0 - pow(beta2, (double)step));
    float neg_step = (float)(-((double)lr / (1.0 - pow(beta1, (double)step))));
    for (size_t i = 0; i < n; i++) {
        float g = grad[i], p = weight_decay != 0 ? param[i] * decay : param[i];
        m[i] = fmaf(w, g - m[i], m[i]);
        v[i] = fmaf(c2 * g, g, v[i] * beta2);
        param[i] = p + (neg_step * m[i]) / (sqrtf(v[i]) / bc2_sqrt + eps);
    }
}

double ddp__sum_squares(const float *x, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return s;
}

void ddp__scale(float *x, size_t n, float s)
{
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}

void ddp__add(float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
}

int ddp__all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

float ddp_schedule_lr(const ddp_schedule *s, int64_t step)
{
    if (!s || (s->kind != DDP_SCHED_CONSTANT && s->kind != DDP_SCHED_COSINE))
        return NAN;
    int64_t w = s->warmup_steps > 0 ? s->warmup_steps : 0, t = step > 0 ? step : 0;
    if (t < w)
        return (float)((double)s->lr * (double)(t + 1) / (double)w);
    if (s->kind == DDP_SCHED_CONSTANT)
        return s->lr;
    if (t >= s->total_steps)
        return s->min_lr;
    double frac = (double)(t - w) / (double)(s->total_steps - w);
    return (float)(s->min_lr + ((double)s->lr - s->min_lr) * (1 + cos(M_PI * frac)) / 2);
}
