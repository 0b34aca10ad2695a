/*
 * Element-wise reduction kernels: dst = srcs[0] op srcs[1] op ... op srcs[nsrc-1] for every
 * dtype and op, the division that finishes an AVG, and the f16/bf16 <-> f32 conversions (bf16's
 * scalar one is the project's, bf16conv.h; the vector one below implements it bit for bit). No
 * I/O, no allocation, no locks and no global state: the cpu backend runs them on its progress
 * thread over shared memory and receive buffers, and the unit tests call them alone. Threading
 * a single reduction and non-temporal stores are deliberately not done here; the caller splits
 * work across ranks.
 *
 * Shape of the code. The input is walked in blocks of BLOCK_BYTES of accumulator. Each block is
 * reduced into an accumulator on the stack (f32 for f16 and bf16, the element type otherwise)
 * in source order, then stored to dst once. The accumulator is what makes a dst that aliases
 * one of srcs harmless, and it lets every inner loop be declared restrict so that the compiler
 * vectorises it. Blocks have trip counts known at compile time (full blocks, then sub-blocks
 * for the rest), so their loops vectorise without a scalar epilogue even under GCC's -O2 "very
 * cheap" cost model; only the last few elements run scalar (-O3 was measured: no faster). On
 * x86-64 the same code is compiled a second time for AVX2 + FMA + F16C (x86-64-v3) and picked
 * at run time; there f16 and bf16 are widened, reduced and narrowed with intrinsics (F16C for
 * f16), fused so that each source is read once per block. Everywhere else, and when built with
 * -DCOLL_REDUCE_PORTABLE (the unit tests use this to reach the portable path on x86), the
 * portable code runs.
 *
 * Invariants:
 *  - The result does not depend on the path, the block size or the vector width: each element
 *    is reduced as ((s0 op s1) op s2) ..., f16 and bf16 in f32 and rounded to nearest even once
 *    when stored. The scalar conversions below are bit-exact with F16C, NaNs included.
 *  - Floating MAX and MIN propagate NaN (as torch.maximum does): if either operand is NaN the
 *    result is NaN. Otherwise they are (a > b ? a : b) and (a < b ? a : b), so between -0 and +0
 *    the later source wins.
 *  - Integer SUM and PROD wrap (computed in unsigned arithmetic); AVG reduces as SUM and
 *    coll__scale_avg() divides, truncating for integers.
 *  - nsrc == 1 copies bits unchanged (a signalling NaN stays signalling); otherwise NaNs that
 *    pass through f16/bf16 come out quiet.
 */
#include "coll_internal.h"
#include "bf16conv.h"

#include <assert.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) &&                            \
    !defined(COLL_REDUCE_PORTABLE)
#define HAVE_X86V3 1
#include <cpuid.h>
#include <immintrin.h>
#define X86V3 __attribute__((target("avx2,fma,f16c")))
#else
#define HAVE_X86V3 0
#endif

#define INLINE static inline __attribute__((always_inline))

/*
 * Accumulator bytes per block (it stays in L1). What is left after the full blocks goes in
 * sub-blocks, also of a constant size so that their loops vectorise too, then one last partial
 * block of fewer than SUBBLOCK_BYTES.
 */
#define BLOCK_BYTES 4096
#define SUBBLOCK_BYTES 256

/* ------------------------------------------------------------------------------------------ */
/* Conversions                                                                                 */
/* ------------------------------------------------------------------------------------------ */

INLINE float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

INLINE uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* As F16C's vcvtph2ps: exact; a NaN keeps sign and payload and comes out quiet. */
INLINE float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f)
        return f32_from_bits(sign | 0x7f800000u | (man ? 0x400000u | (man << 13) : 0));
    if (exp != 0)
        return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
    /* Zero or subnormal: man * 2^-24, exact in f32. */
    float v = (float)man * 0x1p-24f;
    return sign ? -v : v;
}

/*
 * As F16C's vcvtps2ph with round-to-nearest-even: values from 65520 up (half-way past the
 * largest finite, 65504, whose mantissa is odd) become infinity; below 2^-14 the result is
 * subnormal, rounded once; a NaN keeps its sign and top payload bits and comes out quiet.
 */
INLINE uint16_t f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return sign | 0x7e00u | ((a >> 13) & 0x3ffu);
    if (a >= 0x477ff000u)
        return sign | 0x7c00u;
    if (a >= 0x38800000u) {
        /* Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to even; a
         * carry out of the mantissa correctly bumps the exponent. */
        uint32_t r = a - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);
        return sign | (uint16_t)(r >> 13);
    }
    uint32_t e = a >> 23;
    if (e < 102) /* below 2^-25, half the smallest subnormal (or exactly it: ties to 0) */
        return sign;
    /* value * 2^24 = m * 2^(e - 126); shift is 14..24. The result may round up to 0x400, the
     * smallest normal, which is its correct encoding. */
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    q += rem > half || (rem == half && (q & 1u));
    return sign | (uint16_t)q;
}

float coll__f16_to_f32(uint16_t h)
{
    return f16_to_f32(h);
}

uint16_t coll__f32_to_f16(float f)
{
    return f32_to_f16(f);
}

/* ------------------------------------------------------------------------------------------ */
/* Block conversions: f16/bf16 <-> the f32 accumulator                                         */
/* ------------------------------------------------------------------------------------------ */

#if HAVE_X86V3
X86V3 static void f16_load_f16c(float *restrict out, const uint16_t *restrict in, size_t n)
{
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(out + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(in + j))));
    for (; j < n; j++)
        out[j] = f16_to_f32(in[j]);
}

X86V3 static void f16_store_f16c(uint16_t *out, const float *restrict in, size_t n)
{
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm_storeu_si128((__m128i *)(out + j),
                         _mm256_cvtps_ph(_mm256_loadu_ps(in + j), _MM_FROUND_TO_NEAREST_INT));
    for (; j < n; j++)
        out[j] = f32_to_f16(in[j]);
}

/* bf16_from_f32() on 16 lanes: round to nearest even in integers, quieten NaNs, pack. */
X86V3 INLINE __m256i bf16x8_bits(__m256 f)
{
    __m256i u = _mm256_castps_si256(f);
    __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i rounded = _mm256_add_epi32(u, _mm256_set1_epi32(0x7fff));
    rounded = _mm256_add_epi32(rounded, _mm256_and_si256(hi, _mm256_set1_epi32(1)));
    rounded = _mm256_srli_epi32(rounded, 16);
    __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(rounded, quiet, nan);
}

X86V3 static void bf16_store_avx2(uint16_t *out, const float *restrict in, size_t n)
{
    size_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m256i lo = bf16x8_bits(_mm256_loadu_ps(in + j));
        __m256i hi = bf16x8_bits(_mm256_loadu_ps(in + j + 8));
        /* packus works per 128-bit lane; put the quadwords back in order. */
        __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
        _mm256_storeu_si256((__m256i *)(out + j), packed);
    }
    for (; j < n; j++)
        out[j] = bf16_from_f32(in[j]);
}
#endif

INLINE void half_load(float *restrict out, const uint16_t *restrict in, size_t n, bool bf16,
                      bool x86)
{
    if (bf16) {
        for (size_t j = 0; j < n; j++)
            out[j] = bf16_to_f32(in[j]);
        return;
    }
#if HAVE_X86V3
    if (x86) {
        f16_load_f16c(out, in, n);
        return;
    }
#endif
    (void)x86;
    for (size_t j = 0; j < n; j++)
        out[j] = f16_to_f32(in[j]);
}

/* out may be a source's memory: it is only written, after every read of the block. */
INLINE void half_store(uint16_t *out, const float *restrict in, size_t n, bool bf16, bool x86)
{
#if HAVE_X86V3
    if (bf16 && x86) {
        bf16_store_avx2(out, in, n);
        return;
    }
#endif
    if (bf16) {
        for (size_t j = 0; j < n; j++)
            out[j] = bf16_from_f32(in[j]);
        return;
    }
#if HAVE_X86V3
    if (x86) {
        f16_store_f16c(out, in, n);
        return;
    }
#endif
    (void)x86;
    for (size_t j = 0; j < n; j++)
        out[j] = f32_to_f16(in[j]);
}

/* ------------------------------------------------------------------------------------------ */
/* Element loops                                                                               */
/* ------------------------------------------------------------------------------------------ */

/* NaN-propagating max/min for floating types; plain ones for integers. */
#define FMAX(a, b) (((a) > (b) || (a) != (a)) ? (a) : (b))
#define FMIN(a, b) (((a) < (b) || (a) != (a)) ? (a) : (b))
#define IMAX(a, b) ((a) > (b) ? (a) : (b))
#define IMIN(a, b) ((a) < (b) ? (a) : (b))

/*
 * For accumulator type T whose SUM and PROD are computed in type U (unsigned for integers, so
 * that they wrap), over sources of type S widened to T by LOAD, defines
 *   NAME_2(out, a, b, n, op):   out[j] = LOAD(a[j]) op LOAD(b[j])
 *   NAME_acc(acc, b, n, op):    acc[j] = acc[j] op LOAD(b[j])
 * out and acc are private accumulators, never a source, hence restrict.
 */
#define DEFINE_LOOPS(NAME, T, S, U, MAX, MIN, LOAD)                                                \
    INLINE void NAME##_2(T *restrict out, const S *restrict a, const S *restrict b, size_t n,      \
                         coll_op op)                                                               \
    {                                                                                              \
        switch (op) {                                                                              \
        case COLL_SUM:                                                                             \
        case COLL_AVG:                                                                             \
            for (size_t j = 0; j < n; j++)                                                         \
                out[j] = (T)((U)LOAD(a[j]) + (U)LOAD(b[j]));                                       \
            break;                                                                                 \
        case COLL_PROD:                                                                            \
            for (size_t j = 0; j < n; j++)                                                         \
                out[j] = (T)((U)LOAD(a[j]) * (U)LOAD(b[j]));                                       \
            break;                                                                                 \
        case COLL_MAX:                                                                             \
            for (size_t j = 0; j < n; j++) {                                                       \
                T x = LOAD(a[j]), y = LOAD(b[j]);                                                  \
                out[j] = MAX(x, y);                                                                \
            }                                                                                      \
            break;                                                                                 \
        case COLL_MIN:                                                                             \
            for (size_t j = 0; j < n; j++) {                                                       \
                T x = LOAD(a[j]), y = LOAD(b[j]);                                                  \
                out[j] = MIN(x, y);                                                                \
            }                                                                                      \
            break;                                                                                 \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    }                                                                                              \
    INLINE void NAME##_acc(T *restrict acc, const S *restrict b, size_t n, coll_op op)             \
    {                                                                                              \
        switch (op) {                                                                              \
        case COLL_SUM:                                                                             \
        case COLL_AVG:                                                                             \
            for (size_t j = 0; j < n; j++)                                                         \
                acc[j] = (T)((U)acc[j] + (U)LOAD(b[j]));                                           \
            break;                                                                                 \
        case COLL_PROD:                                                                            \
            for (size_t j = 0; j < n; j++)                                                         \
                acc[j] = (T)((U)acc[j] * (U)LOAD(b[j]));                                           \
            break;                                                                                 \
        case COLL_MAX:                                                                             \
            for (size_t j = 0; j < n; j++) {                                                       \
                T y = LOAD(b[j]);                                                                  \
                acc[j] = MAX(acc[j], y);                                                           \
            }                                                                                      \
            break;                                                                                 \
        case COLL_MIN:                                                                             \
            for (size_t j = 0; j < n; j++) {                                                       \
                T y = LOAD(b[j]);                                                                  \
                acc[j] = MIN(acc[j], y);                                                           \
            }                                                                                      \
            break;                                                                                 \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    }

#define SAME(x) (x)

DEFINE_LOOPS(f32, float, float, float, FMAX, FMIN, SAME)
DEFINE_LOOPS(f64, double, double, double, FMAX, FMIN, SAME)
DEFINE_LOOPS(i32, int32_t, int32_t, uint32_t, IMAX, IMIN, SAME)
DEFINE_LOOPS(i64, int64_t, int64_t, uint64_t, IMAX, IMIN, SAME)
DEFINE_LOOPS(u8, uint8_t, uint8_t, uint32_t, IMAX, IMIN, SAME)
/* bf16 sources into an f32 accumulator: the widening is a shift, so these vectorise too. */
DEFINE_LOOPS(bf16, float, uint16_t, float, FMAX, FMIN, bf16_to_f32)
/* f16 sources, portable: scalar conversions. */
DEFINE_LOOPS(f16, float, uint16_t, float, FMAX, FMIN, f16_to_f32)

#if HAVE_X86V3
/*
 * The f16 loops again with F16C, eight elements at a time; the scalar tail gives the same bits.
 * Vector MAX/MIN match FMAX/FMIN: vmaxps(a, b) is (a > b ? a : b), then a NaN a wins.
 */
X86V3 INLINE __m256 f16x8(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

X86V3 INLINE __m256 vmax_nan(__m256 a, __m256 b)
{
    return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
}

X86V3 INLINE __m256 vmin_nan(__m256 a, __m256 b)
{
    return _mm256_blendv_ps(_mm256_min_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
}

X86V3 INLINE __m256 bf16x8(const uint16_t *p)
{
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* NAME_2 and NAME_acc of DEFINE_LOOPS, eight lanes at a time with loader LD, then TAIL_. */
#define DEFINE_X86_LOOPS(NAME, LD, TAIL)                                                           \
    X86V3 static void NAME##_2(float *restrict out, const uint16_t *restrict a,                    \
                               const uint16_t *restrict b, size_t n, coll_op op)                   \
    {                                                                                              \
        size_t j = 0;                                                                              \
        switch (op) {                                                                              \
        case COLL_SUM:                                                                             \
        case COLL_AVG:                                                                             \
            X86_2_LOOP(LD, _mm256_add_ps)                                                          \
            break;                                                                                 \
        case COLL_PROD:                                                                            \
            X86_2_LOOP(LD, _mm256_mul_ps)                                                          \
            break;                                                                                 \
        case COLL_MAX:                                                                             \
            X86_2_LOOP(LD, vmax_nan)                                                               \
            break;                                                                                 \
        case COLL_MIN:                                                                             \
            X86_2_LOOP(LD, vmin_nan)                                                               \
            break;                                                                                 \
        default:                                                                                   \
            return;                                                                                \
        }                                                                                          \
        TAIL##_2(out + j, a + j, b + j, n - j, op);                                                \
    }                                                                                              \
    X86V3 static void NAME##_acc(float *restrict acc, const uint16_t *restrict b, size_t n,        \
                                 coll_op op)                                                       \
    {                                                                                              \
        size_t j = 0;                                                                              \
        switch (op) {                                                                              \
        case COLL_SUM:                                                                             \
        case COLL_AVG:                                                                             \
            X86_ACC_LOOP(LD, _mm256_add_ps)                                                        \
            break;                                                                                 \
        case COLL_PROD:                                                                            \
            X86_ACC_LOOP(LD, _mm256_mul_ps)                                                        \
            break;                                                                                 \
        case COLL_MAX:                                                                             \
            X86_ACC_LOOP(LD, vmax_nan)                                                             \
            break;                                                                                 \
        case COLL_MIN:                                                                             \
            X86_ACC_LOOP(LD, vmin_nan)                                                             \
            break;                                                                                 \
        default:                                                                                   \
            return;                                                                                \
        }                                                                                          \
        TAIL##_acc(acc + j, b + j, n - j, op);                                                     \
    }

#define X86_2_LOOP(LD, VOP)                                                                        \
    for (; j + 8 <= n; j += 8)                                                                     \
        _mm256_storeu_ps(out + j, VOP(LD(a + j), LD(b + j)));
#define X86_ACC_LOOP(LD, VOP)                                                                      \
    for (; j + 8 <= n; j += 8)                                                                     \
        _mm256_storeu_ps(acc + j, VOP(_mm256_loadu_ps(acc + j), LD(b + j)));

DEFINE_X86_LOOPS(f16c, f16x8, f16)
DEFINE_X86_LOOPS(bf16x, bf16x8, bf16)
#endif

/* ------------------------------------------------------------------------------------------ */
/* Blocks                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/*
 * Reduces elements [off, off + n) of nsrc >= 2 sources of a native type into dst. Called with a
 * constant n for full blocks (so the loops are fully vectorised) and a variable one for the
 * tail.
 */
#define DEFINE_BLOCK(NAME, T)                                                                      \
    INLINE void NAME##_block(T *dst, const void *const *srcs, int nsrc, size_t off, size_t n,      \
                             coll_op op, T *restrict acc)                                          \
    {                                                                                              \
        NAME##_2(acc, (const T *)srcs[0] + off, (const T *)srcs[1] + off, n, op);                  \
        for (int k = 2; k < nsrc; k++)                                                             \
            NAME##_acc(acc, (const T *)srcs[k] + off, n, op);                                      \
        memcpy(dst + off, acc, n * sizeof(T));                                                     \
    }                                                                                              \
    INLINE void NAME##_reduce(void *dst, const void *const *srcs, int nsrc, size_t count,          \
                              coll_op op)                                                          \
    {                                                                                              \
        enum { B = BLOCK_BYTES / sizeof(T), S = SUBBLOCK_BYTES / sizeof(T) };                      \
        T acc[B];                                                                                  \
        size_t off = 0;                                                                            \
        for (; count - off >= B; off += B)                                                         \
            NAME##_block((T *)dst, srcs, nsrc, off, B, op, acc);                                   \
        for (; count - off >= S; off += S)                                                         \
            NAME##_block((T *)dst, srcs, nsrc, off, S, op, acc);                                   \
        if (off < count)                                                                           \
            NAME##_block((T *)dst, srcs, nsrc, off, count - off, op, acc);                         \
    }

DEFINE_BLOCK(f32, float)
DEFINE_BLOCK(f64, double)
DEFINE_BLOCK(i32, int32_t)
DEFINE_BLOCK(i64, int64_t)
DEFINE_BLOCK(u8, uint8_t)

/* The same for f16 (bf16 false) and bf16, reduced in an f32 accumulator. */
INLINE void half_block(uint16_t *dst, const void *const *srcs, int nsrc, size_t off, size_t n,
                       coll_op op, bool bf16, bool x86, float *restrict acc)
{
    const uint16_t *const *s = (const uint16_t *const *)srcs;
    if (bf16) {
#if HAVE_X86V3
        if (x86) {
            bf16x_2(acc, s[0] + off, s[1] + off, n, op);
            for (int k = 2; k < nsrc; k++)
                bf16x_acc(acc, s[k] + off, n, op);
            half_store(dst + off, acc, n, bf16, x86);
            return;
        }
#endif
        bf16_2(acc, s[0] + off, s[1] + off, n, op);
        for (int k = 2; k < nsrc; k++)
            bf16_acc(acc, s[k] + off, n, op);
    } else {
#if HAVE_X86V3
        if (x86) {
            f16c_2(acc, s[0] + off, s[1] + off, n, op);
            for (int k = 2; k < nsrc; k++)
                f16c_acc(acc, s[k] + off, n, op);
            half_store(dst + off, acc, n, bf16, x86);
            return;
        }
#endif
        f16_2(acc, s[0] + off, s[1] + off, n, op);
        for (int k = 2; k < nsrc; k++)
            f16_acc(acc, s[k] + off, n, op);
    }
    half_store(dst + off, acc, n, bf16, x86);
}

INLINE void half_reduce(void *dst, const void *const *srcs, int nsrc, size_t count, coll_op op,
                        bool bf16, bool x86)
{
    enum { B = BLOCK_BYTES / sizeof(float), S = SUBBLOCK_BYTES / sizeof(float) };
    float acc[B];
    size_t off = 0;
    for (; count - off >= B; off += B)
        half_block(dst, srcs, nsrc, off, B, op, bf16, x86, acc);
    for (; count - off >= S; off += S)
        half_block(dst, srcs, nsrc, off, S, op, bf16, x86, acc);
    if (off < count)
        half_block(dst, srcs, nsrc, off, count - off, op, bf16, x86, acc);
}

/* buf[j] /= n for the element types divided in place; blocks again for constant trip counts. */
#define DEFINE_SCALE(NAME, T, D)                                                                   \
    INLINE void NAME##_scale_block(T *restrict buf, size_t n, D d)                                 \
    {                                                                                              \
        for (size_t j = 0; j < n; j++)                                                             \
            buf[j] = (T)(buf[j] / d);                                                              \
    }                                                                                              \
    INLINE void NAME##_scale(T *restrict buf, size_t count, int n)                                 \
    {                                                                                              \
        enum { B = BLOCK_BYTES / sizeof(T), S = SUBBLOCK_BYTES / sizeof(T) };                      \
        D d = (D)n;                                                                                \
        size_t off = 0;                                                                            \
        for (; count - off >= B; off += B)                                                         \
            NAME##_scale_block(buf + off, B, d);                                                   \
        for (; count - off >= S; off += S)                                                         \
            NAME##_scale_block(buf + off, S, d);                                                   \
        NAME##_scale_block(buf + off, count - off, d);                                             \
    }

DEFINE_SCALE(f32, float, float)
DEFINE_SCALE(f64, double, double)
DEFINE_SCALE(i32, int32_t, int32_t)
DEFINE_SCALE(i64, int64_t, int64_t)
DEFINE_SCALE(u8, uint8_t, unsigned)

INLINE void half_scale_block(uint16_t *buf, size_t n, float d, bool bf16, bool x86,
                             float *restrict acc)
{
    half_load(acc, buf, n, bf16, x86);
    for (size_t j = 0; j < n; j++)
        acc[j] /= d;
    half_store(buf, acc, n, bf16, x86);
}

INLINE void half_scale(uint16_t *buf, size_t count, int n, bool bf16, bool x86)
{
    enum { B = BLOCK_BYTES / sizeof(float), S = SUBBLOCK_BYTES / sizeof(float) };
    float acc[B];
    float d = (float)n;
    size_t off = 0;
    for (; count - off >= B; off += B)
        half_scale_block(buf + off, B, d, bf16, x86, acc);
    for (; count - off >= S; off += S)
        half_scale_block(buf + off, S, d, bf16, x86, acc);
    if (off < count)
        half_scale_block(buf + off, count - off, d, bf16, x86, acc);
}

/* ------------------------------------------------------------------------------------------ */
/* Dispatch                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/* The whole reduction for one instruction set; x86 is a constant in each instantiation. */
INLINE void reduce_any(void *dst, const void *const *srcs, int nsrc, size_t count, coll_dtype dtype,
                       coll_op op, bool x86)
{
    switch (dtype) {
    case COLL_F32:
        f32_reduce(dst, srcs, nsrc, count, op);
        break;
    case COLL_F64:
        f64_reduce(dst, srcs, nsrc, count, op);
        break;
    case COLL_F16:
        half_reduce(dst, srcs, nsrc, count, op, false, x86);
        break;
    case COLL_BF16:
        half_reduce(dst, srcs, nsrc, count, op, true, x86);
        break;
    case COLL_I32:
        i32_reduce(dst, srcs, nsrc, count, op);
        break;
    case COLL_I64:
        i64_reduce(dst, srcs, nsrc, count, op);
        break;
    case COLL_U8:
        u8_reduce(dst, srcs, nsrc, count, op);
        break;
    default:
        break;
    }
}

INLINE void scale_any(void *buf, size_t count, coll_dtype dtype, int n, bool x86)
{
    switch (dtype) {
    case COLL_F32:
        f32_scale(buf, count, n);
        break;
    case COLL_F64:
        f64_scale(buf, count, n);
        break;
    case COLL_F16:
        half_scale(buf, count, n, false, x86);
        break;
    case COLL_BF16:
        half_scale(buf, count, n, true, x86);
        break;
    case COLL_I32:
        i32_scale(buf, count, n);
        break;
    case COLL_I64:
        i64_scale(buf, count, n);
        break;
    case COLL_U8:
        u8_scale(buf, count, n);
        break;
    default:
        break;
    }
}

static void reduce_portable(void *dst, const void *const *srcs, int nsrc, size_t count,
                            coll_dtype dtype, coll_op op)
{
    reduce_any(dst, srcs, nsrc, count, dtype, op, false);
}

static void scale_portable(void *buf, size_t count, coll_dtype dtype, int n)
{
    scale_any(buf, count, dtype, n, false);
}

#if HAVE_X86V3
X86V3 static void reduce_x86v3(void *dst, const void *const *srcs, int nsrc, size_t count,
                               coll_dtype dtype, coll_op op)
{
    reduce_any(dst, srcs, nsrc, count, dtype, op, true);
}

X86V3 static void scale_x86v3(void *buf, size_t count, coll_dtype dtype, int n)
{
    scale_any(buf, count, dtype, n, true);
}

/*
 * AVX2 and FMA through __builtin_cpu_supports(), which also checks that the OS saves the ymm
 * registers (libgcc or compiler-rt fills its table from a constructor, before main); F16C
 * through CPUID, as clang 14 does not know that name. CPUID traps in virtual machines, so the
 * answer is cached; racing first calls compute the same value.
 */
static bool have_x86v3(void)
{
    static _Atomic int cached; /* 0 unknown, 1 no, 2 yes */
    int c = atomic_load_explicit(&cached, memory_order_relaxed);
    if (c == 0) {
        unsigned eax, ebx, ecx = 0, edx;
        bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
        bool yes = f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        c = yes ? 2 : 1;
        atomic_store_explicit(&cached, c, memory_order_relaxed);
    }
    return c == 2;
}
#endif

void coll__reduce_n(void *dst, const void *const *srcs, int nsrc, size_t count, coll_dtype dtype,
                    coll_op op)
{
    assert(nsrc >= 1);
    assert((int)dtype >= 0 && dtype < COLL_DTYPE_COUNT);
    assert((int)op >= 0 && op < COLL_OP_COUNT);
    if (count == 0 || nsrc < 1)
        return;
    if (nsrc == 1) {
        if (dst != srcs[0])
            memmove(dst, srcs[0], count * coll_dtype_size(dtype));
        return;
    }
#if HAVE_X86V3
    if (have_x86v3()) {
        reduce_x86v3(dst, srcs, nsrc, count, dtype, op);
        return;
    }
#endif
    reduce_portable(dst, srcs, nsrc, count, dtype, op);
}

void coll__scale_avg(void *buf, size_t count, coll_dtype dtype, int n)
{
    assert(n >= 1);
    if (count == 0 || n <= 1)
        return;
#if HAVE_X86V3
    if (have_x86v3()) {
        scale_x86v3(buf, count, dtype, n);
        return;
    }
#endif
    scale_portable(buf, count, dtype, n);
}
