/*
 * bf16: bfloat16 on the host, for ddp-train's emulation of the CUDA path's mixed precision.
 * A bf16 value is the upper half of an f32's bits, held in a uint16_t. Widening is exact;
 * narrowing rounds to nearest even and quietens NaNs, as CUDA's __float2bfloat16() and
 * libcollective's reduce.c do, so that host and device round every value alike.
 */
#ifndef DDP_TRAIN_BF16_H
#define DDP_TRAIN_BF16_H

#include <stddef.h>
#include <stdint.h>

#include "optim.h"

/* The conversions are libddp's (optim.h), so that the trainer and the library round alike. */
static inline float bf16_widen(uint16_t h)
{
    return ddp__bf16_to_f32(h);
}

static inline uint16_t bf16_round(float f)
{
    return ddp__bf16_from_f32(f);
}

/* f32 -> the nearest bf16 value, kept as an f32 (exactly representable in bf16). */
static inline float bf16_quantize(float f)
{
    return bf16_widen(bf16_round(f));
}

/* out[i] = bf16_widen(in[i]), i < n. */
static inline void bf16_widen_n(float *restrict out, const uint16_t *restrict in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = bf16_widen(in[i]);
}

/* a[i] = bf16_quantize(a[i]), i < n, in place. */
static inline void bf16_quantize_n(float *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        a[i] = bf16_quantize(a[i]);
}

#endif /* DDP_TRAIN_BF16_H */
