/*
 * bfloat16 on the host (and, compiled by nvcc, on the device): the project's one conversion
 * between f32 and bf16, so that libcollective's reductions, libddp's optimizer and casts, and the
 * trainer's emulation of mixed precision round every value alike, bit for bit.
 *
 * A bf16 value is the upper half of an f32's bit pattern, held in a uint16_t. bf16_to_f32() is
 * exact. bf16_from_f32() rounds to nearest, ties to even (as CUDA's __float2bfloat16_rn()); a NaN
 * stays a NaN, made quiet with its sign kept; infinities stay infinite, and finite values above
 * bf16's largest round to infinity as IEEE rounding does. It is branch-free so that loops of it
 * vectorise. Vector versions (libcollective/reduce.c's AVX2 path) implement the same formula.
 *
 * Internal to the project: not installed. Header-only (static inline); compiles as C99, C++ and
 * CUDA (there the functions are __host__ __device__).
 */
#ifndef DDP_BF16CONV_H
#define DDP_BF16CONV_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define BF16_FN __host__ __device__ static inline
#elif defined(__GNUC__)
#define BF16_FN static inline __attribute__((always_inline)) /* inside vectorised loops */
#else
#define BF16_FN static inline
#endif

/* The bit pattern of an f32, and back. */
BF16_FN uint32_t bf16__f32_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

BF16_FN float bf16__f32_from_bits(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* The bf16 nearest to f (ties to even); NaNs quietened. */
BF16_FN uint16_t bf16_from_f32(float f)
{
    uint32_t u = bf16__f32_bits(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

/* The f32 whose value h is (exact). */
BF16_FN float bf16_to_f32(uint16_t h)
{
    return bf16__f32_from_bits((uint32_t)h << 16);
}

#endif /* DDP_BF16CONV_H */
