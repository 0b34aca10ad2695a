/*
 * libddp's optimizer kernels (internal, prefix ddp__): the SGD and AdamW updates of one
 * contiguous range of float32 elements, and the vector helpers the step needs around them.
 * This is the interface agreed with the optimizer work (branch wt-optim), which brings the
 * vectorised kernels and replaces this header; until it lands, optim_scalar.c implements it in
 * plain C so that libddp builds and its tests run. Arrays are host memory, n elements,
 * borrowed for the call; written arrays overlap no other argument.
 */
#ifndef DDP_OPTIM_H
#define DDP_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "ddp.h"

/*
 * One torch.optim.SGD step (dampening 0) on n elements: g = grad + weight_decay * param; with
 * momentum, buf = first_step ? g : momentum * buf + g and g = nesterov ? g + momentum * buf :
 * buf; param -= lr * g. momentum_buf is NULL iff momentum == 0. grad is read-only.
 */
void ddp__sgd_step(float *param, const float *grad, float *momentum_buf, size_t n, float lr,
                   float momentum, int nesterov, float weight_decay, int first_step);

/*
 * One torch.optim.AdamW step on n elements, `step` the 1-based number of this step:
 * param *= 1 - lr * weight_decay; m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
 * param -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps).
 */
void ddp__adamw_step(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, int64_t step);

/* The sum of x[i]^2, accumulated in double; not finite if an element is not. */
double ddp__sum_squares(const float *x, size_t n);

/* x[i] *= s. */
void ddp__scale(float *x, size_t n, float s);

/* dst[i] += src[i]. */
void ddp__add(float *dst, const float *src, size_t n);

/* 1 if every element is finite, else 0. */
int ddp__all_finite(const float *x, size_t n);

#endif /* DDP_OPTIM_H */
