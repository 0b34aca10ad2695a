/*
 * bf16: bfloat16 on the host, for ddp-train's emulation of the CUDA path's mixed precision:
 * quantizing f32 values to the nearest bf16 in place, and widening arrays. The conversion itself
 * is the project's one (bf16conv.h: bf16_from_f32() rounds to nearest even and quietens NaNs,
 * bf16_to_f32() is exact), which libddp and libcollective use too, so that host and device round
 * every value alike.
 */
#ifndef DDP_TRAIN_BF16_H
#define DDP_TRAIN_BF16_H

#include <stddef.h>
#include <stdint.h>

#include "bf16conv.h"

/* f32 -> the nearest bf16 value, kept as an f32 (exactly representable in bf16). */
static inline float bf16_quantize(float f)
{
    return bf16_to_f32(bf16_from_f32(f));
}

/* out[i] = bf16_to_f32(in[i]), i < n. */
static inline void bf16_widen_n(float *restrict out, const uint16_t *restrict in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = bf16_to_f32(in[i]);
}

/* a[i] = bf16_quantize(a[i]), i < n, in place. */
static inline void bf16_quantize_n(float *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        a[i] = bf16_quantize(a[i]);
}

#endif /* DDP_TRAIN_BF16_H */
