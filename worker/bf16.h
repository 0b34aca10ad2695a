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
#include <string.h>

static inline float bf16_widen(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Branch-free so that loops of it vectorise. */
static inline uint16_t bf16_round(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
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
