/*
 * The optimizer kernels of libddp (SGD, AdamW, Lion) and their vector helpers (sum of squares,
 * scale, add, finiteness), plus the learning-rate schedule. No I/O, no allocation, no locks;
 * the only global state is the kernel set chosen at run time. optim.h states each contract;
 * this file is about how they are kept.
 *
 * Shape of the code. Each kernel exists three times: portable C (one element at a time, left to
 * the compiler), AVX2 + FMA (8 floats per iteration, then the portable element function for the
 * last 0-7 elements) and AVX-512F (16 floats per iteration, the last partial vector through
 * masked loads and stores). The vector versions are compiled for their instruction set with
 * target attributes, not with the build's -march, and one table of them is chosen at the
 * first call from __builtin_cpu_supports() (which also checks that the OS saves the wider
 * registers). On anything but x86-64 GCC/Clang, and with -DDDP_OPTIM_PORTABLE, only the
 * portable table exists. The work is memory-bound: one pass over each array, no blocking.
 *
 * Invariants:
 *  - Every kernel set computes every element with the same sequence of IEEE operations, each
 *    correctly rounded (add, mul, div, sqrt, and fma, which the portable code calls as fmaf()),
 *    so results are bit-identical across sets; the build compiles this file with
 *    -ffp-contract=off so that the compiler fuses nothing we did not fuse ourselves.
 *  - The per-call coefficients (sgd_coef, adamw_coef, lion_coef) are computed once, in scalar
 *    code shared by all sets, which is where they follow PyTorch's double-precision scalar
 * arithmetic.
 *  - The sum of squares is split by element index (lane i mod 32, not by address), so the
 *    vector widths and masked tails all reproduce the portable order exactly; squares of floats
 *    are exact in double, which makes fma and multiply-then-add agree there too.
 *  - Stores never go past element n - 1 (masked, or scalar, at the tail).
 */
#include "optim.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(DDP_OPTIM_PORTABLE)
#define HAVE_X86 1
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2,fma")))
#define AVX512 __attribute__((target("avx512f,avx2,fma")))
#else
#define HAVE_X86 0
#endif

#define INLINE static inline __attribute__((always_inline))

/* Lanes of the sum of squares: element i goes into lane i % SS_LANES. */
#define SS_LANES 32

/* ------------------------------------------------------------------------------------------ */
/* Coefficients, computed once per call                                                        */
/* ------------------------------------------------------------------------------------------ */

typedef struct sgd_coef {
    float neg_lr, momentum, weight_decay;
    bool use_wd, use_momentum, nesterov, first_step;
} sgd_coef;

typedef struct adamw_coef {
    float decay;     /* float(1 - lr * wd); applied only if use_wd */
    float lerp_w;    /* the lerp coefficient: w if |w| < 0.5, else w - 1 */
    float beta2, c2; /* beta2 and float(1 - beta2) */
    float bc2_sqrt, eps, neg_step;
    bool use_wd;
    bool lerp_from_end; /* |w| >= 0.5: m = fma(w - 1, g - m, g) */
} adamw_coef;

typedef struct lion_coef {
    float neg_lr;
    float decay;     /* float(1 - lr * wd); applied only if use_wd */
    float beta1, c1; /* beta1 and float(1 - beta1): the sign's interpolation */
    float beta2, c2; /* beta2 and float(1 - beta2): the momentum's update */
    bool use_wd;
} lion_coef;

/* ------------------------------------------------------------------------------------------ */
/* Element functions: the portable code, and the vector code's scalar tails                    */
/* ------------------------------------------------------------------------------------------ */

INLINE void sgd_elem(float *restrict param, const float *restrict grad, float *restrict buf,
                     size_t i, const sgd_coef *c)
{
    float g = grad[i];
    if (c->use_wd)
        g = fmaf(c->weight_decay, param[i], g);
    if (c->use_momentum) {
        float b = g;
        if (!c->first_step) {
            b = buf[i] * c->momentum;
            b = b + g;
        }
        buf[i] = b;
        g = c->nesterov ? fmaf(c->momentum, b, g) : b;
    }
    param[i] = fmaf(c->neg_lr, g, param[i]);
}

INLINE void adamw_elem(float *restrict param, const float *restrict grad, float *restrict m,
                       float *restrict v, size_t i, const adamw_coef *c)
{
    float g = grad[i];
    float p = c->use_wd ? param[i] * c->decay : param[i];
    float mi = m[i];
    mi = fmaf(c->lerp_w, g - mi, c->lerp_from_end ? g : mi);
    float vi = v[i] * c->beta2;
    vi = fmaf(c->c2 * g, g, vi);
    m[i] = mi;
    v[i] = vi;
    float denom = sqrtf(vi) / c->bc2_sqrt + c->eps;
    param[i] = p + (c->neg_step * mi) / denom;
}

INLINE void lion_elem(float *restrict param, const float *restrict grad, float *restrict m,
                      size_t i, const lion_coef *c)
{
    float g = grad[i];
    float p = c->use_wd ? param[i] * c->decay : param[i];
    float mi = m[i];
    float u = fmaf(c->c1, g, mi * c->beta1);
    float s = u > 0.0f ? 1.0f : u < 0.0f ? -1.0f : 0.0f;
    param[i] = fmaf(c->neg_lr, s, p);
    m[i] = fmaf(c->c2, g, mi * c->beta2);
}

INLINE uint32_t abs_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u & 0x7fffffffu;
}

/* Lanes summed pairwise in a fixed order, shared by every set. */
INLINE double ss_combine(double *acc)
{
    for (int w = SS_LANES / 2; w >= 1; w /= 2)
        for (int j = 0; j < w; j++)
            acc[j] += acc[j + w];
    return acc[0];
}

/* The elements from i on (fewer than SS_LANES) into lanes 0, 1, ... */
INLINE void ss_tail(double *acc, const float *x, size_t i, size_t n)
{
    for (size_t j = 0; i + j < n; j++)
        acc[j] += (double)x[i + j] * (double)x[i + j];
}

/* ------------------------------------------------------------------------------------------ */
/* Portable kernels                                                                            */
/* ------------------------------------------------------------------------------------------ */

static void sgd_portable(float *restrict param, const float *restrict grad, float *restrict buf,
                         size_t n, const sgd_coef *c)
{
    for (size_t i = 0; i < n; i++)
        sgd_elem(param, grad, buf, i, c);
}

static void adamw_portable(float *restrict param, const float *restrict grad, float *restrict m,
                           float *restrict v, size_t n, const adamw_coef *c)
{
    for (size_t i = 0; i < n; i++)
        adamw_elem(param, grad, m, v, i, c);
}

static void lion_portable(float *restrict param, const float *restrict grad, float *restrict m,
                          size_t n, const lion_coef *c)
{
    for (size_t i = 0; i < n; i++)
        lion_elem(param, grad, m, i, c);
}

static double sum_squares_portable(const float *x, size_t n)
{
    double acc[SS_LANES] = {0};
    size_t i = 0;
    for (; n - i >= SS_LANES; i += SS_LANES)
        for (int j = 0; j < SS_LANES; j++)
            acc[j] += (double)x[i + j] * (double)x[i + j];
    ss_tail(acc, x, i, n);
    return ss_combine(acc);
}

static void scale_portable(float *x, size_t n, float s)
{
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}

static void add_portable(float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
}

static int all_finite_portable(const float *x, size_t n)
{
    uint32_t max = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t a = abs_bits(x[i]);
        max = a > max ? a : max;
    }
    return max < 0x7f800000u;
}

#if HAVE_X86
/* ------------------------------------------------------------------------------------------ */
/* AVX2 + FMA: 8 floats a vector, the tail element by element                                  */
/* ------------------------------------------------------------------------------------------ */

AVX2 static void sgd_avx2(float *restrict param, const float *restrict grad, float *restrict buf,
                          size_t n, const sgd_coef *c)
{
    const __m256 neg_lr = _mm256_set1_ps(c->neg_lr), mom = _mm256_set1_ps(c->momentum);
    const __m256 wd = _mm256_set1_ps(c->weight_decay);
    size_t i = 0;
    for (; n - i >= 8; i += 8) {
        __m256 p = _mm256_loadu_ps(param + i);
        __m256 g = _mm256_loadu_ps(grad + i);
        if (c->use_wd)
            g = _mm256_fmadd_ps(wd, p, g);
        if (c->use_momentum) {
            __m256 b = g;
            if (!c->first_step)
                b = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(buf + i), mom), g);
            _mm256_storeu_ps(buf + i, b);
            g = c->nesterov ? _mm256_fmadd_ps(mom, b, g) : b;
        }
        _mm256_storeu_ps(param + i, _mm256_fmadd_ps(neg_lr, g, p));
    }
    for (; i < n; i++)
        sgd_elem(param, grad, buf, i, c);
}

AVX2 static void adamw_avx2(float *restrict param, const float *restrict grad, float *restrict m,
                            float *restrict v, size_t n, const adamw_coef *c)
{
    const __m256 decay = _mm256_set1_ps(c->decay), lw = _mm256_set1_ps(c->lerp_w);
    const __m256 b2 = _mm256_set1_ps(c->beta2), c2 = _mm256_set1_ps(c->c2);
    const __m256 bc2 = _mm256_set1_ps(c->bc2_sqrt), eps = _mm256_set1_ps(c->eps);
    const __m256 neg_step = _mm256_set1_ps(c->neg_step);
    size_t i = 0;
    for (; n - i >= 8; i += 8) {
        __m256 g = _mm256_loadu_ps(grad + i);
        __m256 p = _mm256_loadu_ps(param + i);
        if (c->use_wd)
            p = _mm256_mul_ps(p, decay);
        __m256 mi = _mm256_loadu_ps(m + i);
        mi = _mm256_fmadd_ps(lw, _mm256_sub_ps(g, mi), c->lerp_from_end ? g : mi);
        __m256 vi = _mm256_mul_ps(_mm256_loadu_ps(v + i), b2);
        vi = _mm256_fmadd_ps(_mm256_mul_ps(c2, g), g, vi);
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2), eps);
        p = _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(neg_step, mi), denom));
        _mm256_storeu_ps(param + i, p);
    }
    for (; i < n; i++)
        adamw_elem(param, grad, m, v, i, c);
}

/* The sign as +1, -1 or 0: (u > 0) - (u < 0), each comparison false for NaN. */
AVX2 static inline __m256 sign_avx2(__m256 u)
{
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    __m256 pos = _mm256_and_ps(_mm256_cmp_ps(u, zero, _CMP_GT_OQ), one);
    __m256 neg = _mm256_and_ps(_mm256_cmp_ps(u, zero, _CMP_LT_OQ), one);
    return _mm256_sub_ps(pos, neg);
}

AVX2 static void lion_avx2(float *restrict param, const float *restrict grad, float *restrict m,
                           size_t n, const lion_coef *c)
{
    const __m256 decay = _mm256_set1_ps(c->decay), neg_lr = _mm256_set1_ps(c->neg_lr);
    const __m256 b1 = _mm256_set1_ps(c->beta1), c1 = _mm256_set1_ps(c->c1);
    const __m256 b2 = _mm256_set1_ps(c->beta2), c2 = _mm256_set1_ps(c->c2);
    size_t i = 0;
    for (; n - i >= 8; i += 8) {
        __m256 g = _mm256_loadu_ps(grad + i);
        __m256 p = _mm256_loadu_ps(param + i);
        if (c->use_wd)
            p = _mm256_mul_ps(p, decay);
        __m256 mi = _mm256_loadu_ps(m + i);
        __m256 u = _mm256_fmadd_ps(c1, g, _mm256_mul_ps(mi, b1));
        _mm256_storeu_ps(param + i, _mm256_fmadd_ps(neg_lr, sign_avx2(u), p));
        _mm256_storeu_ps(m + i, _mm256_fmadd_ps(c2, g, _mm256_mul_ps(mi, b2)));
    }
    for (; i < n; i++)
        lion_elem(param, grad, m, i, c);
}

/* Four floats widened to four doubles, squared and added into one lane group. */
AVX2 static inline __m256d ss4_avx2(__m256d acc, const float *x)
{
    __m256d d = _mm256_cvtps_pd(_mm_loadu_ps(x));
    return _mm256_fmadd_pd(d, d, acc);
}

AVX2 static double sum_squares_avx2(const float *x, size_t n)
{
    __m256d a[SS_LANES / 4];
    for (int k = 0; k < SS_LANES / 4; k++)
        a[k] = _mm256_setzero_pd();
    size_t i = 0;
    for (; n - i >= SS_LANES; i += SS_LANES)
        for (int k = 0; k < SS_LANES / 4; k++)
            a[k] = ss4_avx2(a[k], x + i + 4 * k);
    double acc[SS_LANES];
    for (int k = 0; k < SS_LANES / 4; k++)
        _mm256_storeu_pd(acc + 4 * k, a[k]);
    ss_tail(acc, x, i, n);
    return ss_combine(acc);
}

AVX2 static void scale_avx2(float *x, size_t n, float s)
{
    const __m256 sv = _mm256_set1_ps(s);
    size_t i = 0;
    for (; n - i >= 8; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), sv));
    for (; i < n; i++)
        x[i] *= s;
}

AVX2 static void add_avx2(float *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; n - i >= 8; i += 8)
        _mm256_storeu_ps(dst + i,
                         _mm256_add_ps(_mm256_loadu_ps(dst + i), _mm256_loadu_ps(src + i)));
    for (; i < n; i++)
        dst[i] += src[i];
}

AVX2 static int all_finite_avx2(const float *x, size_t n)
{
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    __m256i vmax = _mm256_setzero_si256();
    size_t i = 0;
    for (; n - i >= 8; i += 8) {
        __m256i u = _mm256_loadu_si256((const __m256i *)(const void *)(x + i));
        vmax = _mm256_max_epu32(vmax, _mm256_and_si256(u, abs_mask));
    }
    uint32_t lanes[8];
    _mm256_storeu_si256((__m256i *)(void *)lanes, vmax);
    uint32_t max = 0;
    for (int k = 0; k < 8; k++)
        max = lanes[k] > max ? lanes[k] : max;
    for (; i < n; i++) {
        uint32_t a = abs_bits(x[i]);
        max = a > max ? a : max;
    }
    return max < 0x7f800000u;
}

/* ------------------------------------------------------------------------------------------ */
/* AVX-512F: 16 floats a vector, the tail through masks                                        */
/* ------------------------------------------------------------------------------------------ */

/* The mask of the vector starting at element i: all 16 lanes, or the n - i that remain. */
AVX512 static inline __mmask16 mask16(size_t i, size_t n)
{
    return n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
}

AVX512 static void sgd_avx512(float *restrict param, const float *restrict grad,
                              float *restrict buf, size_t n, const sgd_coef *c)
{
    const __m512 neg_lr = _mm512_set1_ps(c->neg_lr), mom = _mm512_set1_ps(c->momentum);
    const __m512 wd = _mm512_set1_ps(c->weight_decay);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 k = mask16(i, n);
        __m512 p = _mm512_maskz_loadu_ps(k, param + i);
        __m512 g = _mm512_maskz_loadu_ps(k, grad + i);
        if (c->use_wd)
            g = _mm512_fmadd_ps(wd, p, g);
        if (c->use_momentum) {
            __m512 b = g;
            if (!c->first_step)
                b = _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, buf + i), mom), g);
            _mm512_mask_storeu_ps(buf + i, k, b);
            g = c->nesterov ? _mm512_fmadd_ps(mom, b, g) : b;
        }
        _mm512_mask_storeu_ps(param + i, k, _mm512_fmadd_ps(neg_lr, g, p));
    }
}

AVX512 static void adamw_avx512(float *restrict param, const float *restrict grad,
                                float *restrict m, float *restrict v, size_t n, const adamw_coef *c)
{
    const __m512 decay = _mm512_set1_ps(c->decay), lw = _mm512_set1_ps(c->lerp_w);
    const __m512 b2 = _mm512_set1_ps(c->beta2), c2 = _mm512_set1_ps(c->c2);
    const __m512 bc2 = _mm512_set1_ps(c->bc2_sqrt), eps = _mm512_set1_ps(c->eps);
    const __m512 neg_step = _mm512_set1_ps(c->neg_step);
    for (size_t i = 0; i < n; i += 16) {
        /* Masked-off lanes compute on zeros (0 / eps, harmless) and are never stored. */
        __mmask16 k = mask16(i, n);
        __m512 g = _mm512_maskz_loadu_ps(k, grad + i);
        __m512 p = _mm512_maskz_loadu_ps(k, param + i);
        if (c->use_wd)
            p = _mm512_mul_ps(p, decay);
        __m512 mi = _mm512_maskz_loadu_ps(k, m + i);
        mi = _mm512_fmadd_ps(lw, _mm512_sub_ps(g, mi), c->lerp_from_end ? g : mi);
        __m512 vi = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, v + i), b2);
        vi = _mm512_fmadd_ps(_mm512_mul_ps(c2, g), g, vi);
        _mm512_mask_storeu_ps(m + i, k, mi);
        _mm512_mask_storeu_ps(v + i, k, vi);
        __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc2), eps);
        p = _mm512_add_ps(p, _mm512_div_ps(_mm512_mul_ps(neg_step, mi), denom));
        _mm512_mask_storeu_ps(param + i, k, p);
    }
}

AVX512 static void lion_avx512(float *restrict param, const float *restrict grad, float *restrict m,
                               size_t n, const lion_coef *c)
{
    const __m512 decay = _mm512_set1_ps(c->decay), neg_lr = _mm512_set1_ps(c->neg_lr);
    const __m512 b1 = _mm512_set1_ps(c->beta1), c1 = _mm512_set1_ps(c->c1);
    const __m512 b2 = _mm512_set1_ps(c->beta2), c2 = _mm512_set1_ps(c->c2);
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 k = mask16(i, n);
        __m512 g = _mm512_maskz_loadu_ps(k, grad + i);
        __m512 p = _mm512_maskz_loadu_ps(k, param + i);
        if (c->use_wd)
            p = _mm512_mul_ps(p, decay);
        __m512 mi = _mm512_maskz_loadu_ps(k, m + i);
        __m512 u = _mm512_fmadd_ps(c1, g, _mm512_mul_ps(mi, b1));
        /* (u > 0) - (u < 0), each comparison false for NaN */
        __m512 s = _mm512_sub_ps(_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(u, zero, _CMP_GT_OQ), one),
                                 _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(u, zero, _CMP_LT_OQ), one));
        _mm512_mask_storeu_ps(param + i, k, _mm512_fmadd_ps(neg_lr, s, p));
        _mm512_mask_storeu_ps(m + i, k, _mm512_fmadd_ps(c2, g, _mm512_mul_ps(mi, b2)));
    }
}

/*
 * Sixteen floats (masked-off ones read as +0, which adds nothing: lanes are never -0) widened
 * into two groups of eight doubles, lanes j..j+7 and j+8..j+15.
 */
AVX512 static inline void ss16_avx512(__m512d *lo, __m512d *hi, const float *x, __mmask16 k)
{
    __m512 f = _mm512_maskz_loadu_ps(k, x);
    __m512d d0 = _mm512_cvtps_pd(_mm512_castps512_ps256(f));
    __m512d d1 = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)));
    *lo = _mm512_fmadd_pd(d0, d0, *lo);
    *hi = _mm512_fmadd_pd(d1, d1, *hi);
}

AVX512 static double sum_squares_avx512(const float *x, size_t n)
{
    __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0; /* lanes 0-7, ..., 24-31 */
    size_t i = 0;
    for (; n - i >= SS_LANES; i += SS_LANES) {
        ss16_avx512(&a0, &a1, x + i, 0xffff);
        ss16_avx512(&a2, &a3, x + i + 16, 0xffff);
    }
    if (i < n)
        ss16_avx512(&a0, &a1, x + i, mask16(i, n));
    if (i + 16 < n)
        ss16_avx512(&a2, &a3, x + i + 16, mask16(i + 16, n));
    double acc[SS_LANES];
    _mm512_storeu_pd(acc, a0);
    _mm512_storeu_pd(acc + 8, a1);
    _mm512_storeu_pd(acc + 16, a2);
    _mm512_storeu_pd(acc + 24, a3);
    return ss_combine(acc);
}

AVX512 static void scale_avx512(float *x, size_t n, float s)
{
    const __m512 sv = _mm512_set1_ps(s);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 k = mask16(i, n);
        _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), sv));
    }
}

AVX512 static void add_avx512(float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 k = mask16(i, n);
        __m512 s =
            _mm512_add_ps(_mm512_maskz_loadu_ps(k, dst + i), _mm512_maskz_loadu_ps(k, src + i));
        _mm512_mask_storeu_ps(dst + i, k, s);
    }
}

AVX512 static int all_finite_avx512(const float *x, size_t n)
{
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
    __m512i vmax = _mm512_setzero_si512();
    for (size_t i = 0; i < n; i += 16) {
        __m512i u = _mm512_maskz_loadu_epi32(mask16(i, n), x + i);
        vmax = _mm512_max_epu32(vmax, _mm512_and_si512(u, abs_mask));
    }
    return _mm512_reduce_max_epu32(vmax) < 0x7f800000u;
}
#endif /* HAVE_X86 */

/* ------------------------------------------------------------------------------------------ */
/* Dispatch                                                                                    */
/* ------------------------------------------------------------------------------------------ */

typedef struct kernels {
    void (*sgd)(float *restrict, const float *restrict, float *restrict, size_t, const sgd_coef *);
    void (*adamw)(float *restrict, const float *restrict, float *restrict, float *restrict, size_t,
                  const adamw_coef *);
    void (*lion)(float *restrict, const float *restrict, float *restrict, size_t,
                 const lion_coef *);
    double (*sum_squares)(const float *, size_t);
    void (*scale)(float *, size_t, float);
    void (*add)(float *, const float *, size_t);
    int (*all_finite)(const float *, size_t);
} kernels;

static const kernels kernel_sets[DDP__ISA_COUNT] = {
    [DDP__ISA_PORTABLE] = {sgd_portable, adamw_portable, lion_portable, sum_squares_portable,
                           scale_portable, add_portable, all_finite_portable},
#if HAVE_X86
    [DDP__ISA_AVX2] = {sgd_avx2, adamw_avx2, lion_avx2, sum_squares_avx2, scale_avx2, add_avx2,
                       all_finite_avx2},
    [DDP__ISA_AVX512] = {sgd_avx512, adamw_avx512, lion_avx512, sum_squares_avx512, scale_avx512,
                         add_avx512, all_finite_avx512},
#endif
};

int ddp__optim_isa_supported(int isa)
{
    if (isa < 0 || isa >= DDP__ISA_COUNT || !kernel_sets[isa].sgd)
        return 0;
#if HAVE_X86
    /* libgcc (or compiler-rt) fills the CPU model from a constructor; calling this again makes
     * the answer right even from another constructor. It also checks XCR0: the OS must save
     * the ymm (and for AVX-512, zmm and mask) registers. */
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (isa == DDP__ISA_AVX2)
        return avx2;
    if (isa == DDP__ISA_AVX512)
        return avx2 && __builtin_cpu_supports("avx512f");
#endif
    return 1;
}

const char *ddp__optim_isa_name(int isa)
{
    switch (isa) {
    case DDP__ISA_PORTABLE:
        return "portable";
    case DDP__ISA_AVX2:
        return "avx2";
    case DDP__ISA_AVX512:
        return "avx512";
    default:
        return "?";
    }
}

/* The set in use, plus one; 0 until the first call chooses. Racing first calls agree. */
static _Atomic int chosen;

static int best_isa(void)
{
    for (int isa = DDP__ISA_COUNT - 1; isa > DDP__ISA_PORTABLE; isa--)
        if (ddp__optim_isa_supported(isa))
            return isa;
    return DDP__ISA_PORTABLE;
}

int ddp__optim_isa(void)
{
    int c = atomic_load_explicit(&chosen, memory_order_relaxed);
    if (c == 0) {
        c = best_isa() + 1;
        atomic_store_explicit(&chosen, c, memory_order_relaxed);
    }
    return c - 1;
}

int ddp__optim_use_isa(int isa)
{
    if (isa == -1)
        isa = best_isa();
    if (isa < 0 || isa >= DDP__ISA_COUNT)
        return -EINVAL;
    if (!ddp__optim_isa_supported(isa))
        return -ENOTSUP;
    atomic_store_explicit(&chosen, isa + 1, memory_order_relaxed);
    return 0;
}

static const kernels *ks(void)
{
    return &kernel_sets[ddp__optim_isa()];
}

/* ------------------------------------------------------------------------------------------ */
/* The entry points                                                                            */
/* ------------------------------------------------------------------------------------------ */

void ddp__sgd_step(float *param, const float *grad, float *momentum_buf, size_t n, float lr,
                   float momentum, int nesterov, float weight_decay, int first_step)
{
    assert((momentum_buf == NULL) == (momentum == 0.0f));
    assert(!nesterov || momentum != 0.0f);
    if (n == 0)
        return;
    sgd_coef c = {
        .neg_lr = -lr,
        .momentum = momentum,
        .weight_decay = weight_decay,
        .use_wd = weight_decay != 0.0f,
        .use_momentum = momentum != 0.0f,
        .nesterov = nesterov != 0,
        .first_step = first_step != 0,
    };
    ks()->sgd(param, grad, momentum_buf, n, &c);
}

void ddp__adamw_step(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, int64_t step)
{
    assert(step >= 1);
    if (n == 0)
        return;
    /* As torch/optim/adam.py computes them from Python floats (doubles). */
    double w = 1.0 - (double)beta1;
    double bc1 = 1.0 - pow((double)beta1, (double)step);
    double bc2 = 1.0 - pow((double)beta2, (double)step);
    adamw_coef c = {
        .decay = (float)(1.0 - (double)lr * (double)weight_decay),
        .beta2 = beta2,
        .c2 = (float)(1.0 - (double)beta2),
        .bc2_sqrt = (float)pow(bc2, 0.5),
        .eps = eps,
        .neg_step = (float)-((double)lr / bc1),
        .use_wd = weight_decay != 0.0f,
    };
    /* PyTorch's lerp, with its weight rounded to float first. */
    float wf = (float)w;
    c.lerp_from_end = !(fabsf(wf) < 0.5f);
    c.lerp_w = c.lerp_from_end ? wf - 1.0f : wf;
    ks()->adamw(param, grad, m, v, n, &c);
}

void ddp__lion_step(float *param, const float *grad, float *m, size_t n, float lr, float beta1,
                    float beta2, float weight_decay)
{
    if (n == 0)
        return;
    /* As a PyTorch implementation's Python floats give them to the tensor operations. */
    lion_coef c = {
        .neg_lr = -lr,
        .decay = (float)(1.0 - (double)lr * (double)weight_decay),
        .beta1 = beta1,
        .c1 = (float)(1.0 - (double)beta1),
        .beta2 = beta2,
        .c2 = (float)(1.0 - (double)beta2),
        .use_wd = weight_decay != 0.0f,
    };
    ks()->lion(param, grad, m, n, &c);
}

void ddp__to_bf16(uint16_t *dst, const float *src, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = bf16_from_f32(src[i] * scale);
}

void ddp__from_bf16(float *dst, const uint16_t *src, size_t n, int add)
{
    if (add)
        for (size_t i = 0; i < n; i++)
            dst[i] += bf16_to_f32(src[i]);
    else
        for (size_t i = 0; i < n; i++)
            dst[i] = bf16_to_f32(src[i]);
}

double ddp__sum_squares(const float *x, size_t n)
{
    if (n == 0)
        return 0.0;
    return ks()->sum_squares(x, n);
}

void ddp__scale(float *x, size_t n, float s)
{
    if (n != 0)
        ks()->scale(x, n, s);
}

void ddp__add(float *dst, const float *src, size_t n)
{
    if (n != 0)
        ks()->add(dst, src, n);
}

int ddp__all_finite(const float *x, size_t n)
{
    return n == 0 ? 1 : ks()->all_finite(x, n);
}

/* ------------------------------------------------------------------------------------------ */
/* Learning-rate schedule (ddp.h; the formula is in optim.h)                                   */
/* ------------------------------------------------------------------------------------------ */

float ddp_schedule_lr(const ddp_schedule *s, int64_t step)
{
    if (!s || (s->kind != DDP_SCHED_CONSTANT && s->kind != DDP_SCHED_COSINE))
        return NAN;
    int64_t warmup = s->warmup_steps > 0 ? s->warmup_steps : 0;
    int64_t t = step > 0 ? step : 0;
    double lr = s->lr;
    if (t < warmup)
        return (float)(lr * (double)(t + 1) / (double)warmup);
    if (s->kind == DDP_SCHED_CONSTANT)
        return s->lr;
    if (t >= s->total_steps)
        return s->min_lr;
    /* Here warmup <= t < total, so the span is positive. */
    double ratio = (double)(t - warmup) / (double)(s->total_steps - warmup);
    double min = s->min_lr;
    return (float)(min + (lr - min) * 0.5 * (1.0 + cos(M_PI * ratio)));
}
