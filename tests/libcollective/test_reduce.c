/*
 * Unit tests of libcollective's reduction kernels (reduce.c) and small helpers (util.c).
 *
 * Every dtype x op x nsrc 1..8 is checked bit-exactly against a scalar reference that reads
 * one element at a time: f16 and bf16 are widened with the conversions under test, reduced in
 * f32 in source order and rounded once, which is what the kernels promise. A NaN matches any
 * NaN. Sizes cover 0, 1, less than a vector, block boundaries and a large odd count; pointers
 * are sometimes offset from the allocation's alignment; dst aliases a source; bytes after dst
 * must stay untouched. The conversions themselves are checked against values computed here
 * from their definitions: every f16 value, every f16 and bf16 rounding midpoint with its
 * neighbours, subnormals, infinities, NaNs and the largest finite values.
 *
 * This file is built twice: test_reduce links the library as built (on x86-64 with AVX2/F16C,
 * the vector path) and test_reduce_portable compiles reduce.c with -DCOLL_REDUCE_PORTABLE.
 */
#include <check.h>

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_internal.h"
#include "bf16conv.h"
#include "check_main.h"

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static uint64_t rnd(void)
{
    /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1du;
}

/* Uniform in [-3, 3) with a full random mantissa. */
static double rnd_moderate(void)
{
    return (double)(rnd() >> 11) * 0x1p-53 * 6.0 - 3.0;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Half the elements are random bit patterns (NaN, inf, subnormal, huge), half moderate. */
static void fill(void *buf, size_t count, coll_dtype dt)
{
    for (size_t i = 0; i < count; i++) {
        uint64_t r = rnd();
        bool raw = r & 1;
        switch (dt) {
        case COLL_F32: {
            float v = raw ? bits_f32((uint32_t)(r >> 32)) : (float)rnd_moderate();
            ((float *)buf)[i] = v;
            break;
        }
        case COLL_F64: {
            double v;
            uint64_t b = rnd();
            if (raw)
                memcpy(&v, &b, sizeof v);
            else
                v = rnd_moderate();
            ((double *)buf)[i] = v;
            break;
        }
        case COLL_F16:
            ((uint16_t *)buf)[i] =
                raw ? (uint16_t)(r >> 48) : coll__f32_to_f16((float)rnd_moderate());
            break;
        case COLL_BF16:
            ((uint16_t *)buf)[i] =
                raw ? (uint16_t)(r >> 48) : bf16_from_f32((float)rnd_moderate());
            break;
        case COLL_I32:
            ((int32_t *)buf)[i] = (int32_t)(r >> 32);
            break;
        case COLL_I64:
            ((int64_t *)buf)[i] = (int64_t)rnd();
            break;
        case COLL_U8:
            ((uint8_t *)buf)[i] = (uint8_t)(r >> 56);
            break;
        default:
            ck_abort_msg("bad dtype");
        }
    }
}

static float ref_f32(float a, float b, coll_op op)
{
    switch (op) {
    case COLL_SUM:
    case COLL_AVG:
        return a + b;
    case COLL_PROD:
        return a * b;
    case COLL_MAX:
        if (isnan(a) || isnan(b))
            return isnan(a) ? a : b;
        return a > b ? a : b;
    case COLL_MIN:
        if (isnan(a) || isnan(b))
            return isnan(a) ? a : b;
        return a < b ? a : b;
    default:
        ck_abort_msg("bad op");
        return 0;
    }
}

static double ref_f64(double a, double b, coll_op op)
{
    switch (op) {
    case COLL_SUM:
    case COLL_AVG:
        return a + b;
    case COLL_PROD:
        return a * b;
    case COLL_MAX:
        if (isnan(a) || isnan(b))
            return isnan(a) ? a : b;
        return a > b ? a : b;
    case COLL_MIN:
        if (isnan(a) || isnan(b))
            return isnan(a) ? a : b;
        return a < b ? a : b;
    default:
        ck_abort_msg("bad op");
        return 0;
    }
}

/* Integers as int64_t; sums and products wrap to the type's width (done by the caller). */
static uint64_t ref_int(int64_t a, int64_t b, coll_op op)
{
    switch (op) {
    case COLL_SUM:
    case COLL_AVG:
        return (uint64_t)a + (uint64_t)b;
    case COLL_PROD:
        return (uint64_t)a * (uint64_t)b;
    case COLL_MAX:
        return (uint64_t)(a > b ? a : b);
    case COLL_MIN:
        return (uint64_t)(a < b ? a : b);
    default:
        ck_abort_msg("bad op");
        return 0;
    }
}

/* One element at a time, in source order. */
static void ref_reduce(void *dst, const void *const *srcs, int nsrc, size_t count, coll_dtype dt,
                       coll_op op)
{
    for (size_t i = 0; i < count; i++) {
        switch (dt) {
        case COLL_F32: {
            float acc = ((const float *)srcs[0])[i];
            for (int k = 1; k < nsrc; k++)
                acc = ref_f32(acc, ((const float *)srcs[k])[i], op);
            ((float *)dst)[i] = acc;
            break;
        }
        case COLL_F64: {
            double acc = ((const double *)srcs[0])[i];
            for (int k = 1; k < nsrc; k++)
                acc = ref_f64(acc, ((const double *)srcs[k])[i], op);
            ((double *)dst)[i] = acc;
            break;
        }
        case COLL_F16:
        case COLL_BF16: {
            float (*load)(uint16_t) = dt == COLL_F16 ? coll__f16_to_f32 : bf16_to_f32;
            uint16_t (*store)(float) = dt == COLL_F16 ? coll__f32_to_f16 : bf16_from_f32;
            float acc = load(((const uint16_t *)srcs[0])[i]);
            for (int k = 1; k < nsrc; k++)
                acc = ref_f32(acc, load(((const uint16_t *)srcs[k])[i]), op);
            /* One source is copied as is (a signalling NaN stays signalling). */
            ((uint16_t *)dst)[i] = nsrc == 1 ? ((const uint16_t *)srcs[0])[i] : store(acc);
            break;
        }
        case COLL_I32: {
            int32_t acc = ((const int32_t *)srcs[0])[i];
            for (int k = 1; k < nsrc; k++)
                acc = (int32_t)(uint32_t)ref_int(acc, ((const int32_t *)srcs[k])[i], op);
            ((int32_t *)dst)[i] = acc;
            break;
        }
        case COLL_I64: {
            int64_t acc = ((const int64_t *)srcs[0])[i];
            for (int k = 1; k < nsrc; k++)
                acc = (int64_t)ref_int(acc, ((const int64_t *)srcs[k])[i], op);
            ((int64_t *)dst)[i] = acc;
            break;
        }
        case COLL_U8: {
            uint8_t acc = ((const uint8_t *)srcs[0])[i];
            for (int k = 1; k < nsrc; k++)
                acc = (uint8_t)ref_int(acc, ((const uint8_t *)srcs[k])[i], op);
            ((uint8_t *)dst)[i] = acc;
            break;
        }
        default:
            ck_abort_msg("bad dtype");
        }
    }
}

static bool is_nan_elem(const void *p, coll_dtype dt)
{
    switch (dt) {
    case COLL_F32: {
        float f;
        memcpy(&f, p, sizeof f);
        return isnan(f);
    }
    case COLL_F64: {
        double d;
        memcpy(&d, p, sizeof d);
        return isnan(d);
    }
    case COLL_F16: {
        uint16_t h;
        memcpy(&h, p, sizeof h);
        return (h & 0x7fff) > 0x7c00;
    }
    case COLL_BF16: {
        uint16_t h;
        memcpy(&h, p, sizeof h);
        return (h & 0x7fff) > 0x7f80;
    }
    default:
        return false;
    }
}

/* Bit-exact, except that a NaN matches any NaN. */
static void expect_equal(const void *got, const void *want, size_t count, coll_dtype dt,
                         const char *what)
{
    size_t es = coll_dtype_size(dt);
    for (size_t i = 0; i < count; i++) {
        const char *g = (const char *)got + i * es, *w = (const char *)want + i * es;
        if (memcmp(g, w, es) == 0 || (is_nan_elem(g, dt) && is_nan_elem(w, dt)))
            continue;
        uint64_t gb = 0, wb = 0;
        memcpy(&gb, g, es);
        memcpy(&wb, w, es);
        ck_abort_msg("%s: %s element %zu of %zu: got 0x%llx, want 0x%llx", what,
                     coll_dtype_name(dt), i, count, (unsigned long long)gb, (unsigned long long)wb);
    }
}

#define MAXSRC 8
#define CANARY 64
#define POOL_COUNT 1000003

/*
 * Random contents for source k: POOL_COUNT elements of dtype dt, made once per dtype (each test
 * runs in a process of its own) and copied into every case's buffers.
 */
static const void *pool(int k, coll_dtype dt)
{
    static void *bufs[MAXSRC];
    static int made = -1;
    if (made != (int)dt) {
        for (int i = 0; i < MAXSRC; i++) {
            free(bufs[i]);
            bufs[i] = malloc(POOL_COUNT * coll_dtype_size(dt));
            ck_assert_ptr_nonnull(bufs[i]);
            fill(bufs[i], POOL_COUNT, dt);
        }
        made = (int)dt;
    }
    return bufs[k];
}

/*
 * Reduces nsrc random sources of count elements with the kernel and the reference and compares.
 * offset shifts every buffer by that many elements from malloc's alignment. alias_k >= 0 makes
 * dst the buffer of srcs[alias_k].
 */
static void check_case(coll_dtype dt, coll_op op, int nsrc, size_t count, size_t offset,
                       int alias_k)
{
    size_t es = coll_dtype_size(dt);
    size_t nbytes = (count + offset) * es + CANARY;
    char *bufs[MAXSRC];
    const void *srcs[MAXSRC];
    char *want = malloc(nbytes);
    char *dstbuf = malloc(nbytes);
    ck_assert_ptr_nonnull(want);
    ck_assert_ptr_nonnull(dstbuf);
    for (int k = 0; k < nsrc; k++) {
        bufs[k] = malloc(nbytes);
        ck_assert_ptr_nonnull(bufs[k]);
        ck_assert_uint_le(count, POOL_COUNT);
        memcpy(bufs[k] + offset * es, pool(k, dt), count * es);
        memset(bufs[k] + (count + offset) * es, 0xa5, CANARY);
        srcs[k] = bufs[k] + offset * es;
    }
    ref_reduce(want + offset * es, srcs, nsrc, count, dt, op);

    char *dst;
    if (alias_k >= 0) {
        dst = bufs[alias_k] + offset * es;
    } else {
        memset(dstbuf, 0x5a, nbytes);
        dst = dstbuf + offset * es;
    }
    coll__reduce_n(dst, srcs, nsrc, count, dt, op);

    char what[96];
    snprintf(what, sizeof what, "%s nsrc %d count %zu offset %zu alias %d", coll_op_name(op), nsrc,
             count, offset, alias_k);
    expect_equal(dst, want + offset * es, count, dt, what);
    for (int c = 0; c < CANARY; c++)
        ck_assert_msg((unsigned char)dst[count * es + c] == (alias_k >= 0 ? 0xa5 : 0x5a),
                      "%s: byte %d after dst written", what, c);
    for (int k = 0; k < nsrc; k++)
        free(bufs[k]);
    free(want);
    free(dstbuf);
}

/* ------------------------------------------------------------------------------------------ */
/* Conversions                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* The value of f16 bits h from the definition of binary16. */
static double f16_value(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v = exp == 0 ? ldexp(man, -24) : ldexp(1024 + man, exp - 25);
    return sign ? -v : v;
}

START_TEST(f16_to_f32_every_value)
{
    for (uint32_t h = 0; h <= 0xffff; h++) {
        float f = coll__f16_to_f32((uint16_t)h);
        uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
        if (exp == 0x1f && man) {
            /* NaN: sign and payload kept, quiet bit set. */
            uint32_t want = ((h & 0x8000u) << 16) | 0x7fc00000u | (man << 13);
            ck_assert_msg(f32_bits(f) == want, "f16 0x%04x -> 0x%08x", h, f32_bits(f));
        } else if (exp == 0x1f) {
            ck_assert(isinf(f) && (signbit(f) != 0) == ((h & 0x8000) != 0));
        } else {
            ck_assert_msg((double)f == f16_value((uint16_t)h), "f16 0x%04x", h);
            ck_assert((signbit(f) != 0) == ((h & 0x8000) != 0)); /* -0 too */
        }
    }
}
END_TEST

/*
 * For each pair of neighbouring f16 magnitudes (h, h + 1), including the largest finite and
 * infinity (65504, 65536 for rounding purposes): h's value converts to h, the midpoint to the
 * even one, and the f32 values just either side of the midpoint to the nearer one.
 */
START_TEST(f32_to_f16_every_midpoint)
{
    for (uint32_t s = 0; s <= 0x8000; s += 0x8000) {
        for (uint32_t h = 0; h < 0x7c00; h++) {
            float lo = (float)f16_value((uint16_t)h);
            float hi = h + 1 == 0x7c00 ? 65536.0f : (float)f16_value((uint16_t)(h + 1));
            float mid = (lo + hi) / 2; /* exact: 11 significant bits each */
            uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
            float sg = s ? -1.0f : 1.0f;
            ck_assert_uint_eq(coll__f32_to_f16(sg * lo), s | h);
            ck_assert_uint_eq(coll__f32_to_f16(sg * mid), s | even);
            ck_assert_uint_eq(coll__f32_to_f16(sg * nextafterf(mid, 0)), s | h);
            ck_assert_uint_eq(coll__f32_to_f16(sg * nextafterf(mid, INFINITY)), s | (h + 1));
        }
    }
}
END_TEST

START_TEST(f32_to_f16_edges)
{
    ck_assert_uint_eq(coll__f32_to_f16(0.0f), 0x0000);
    ck_assert_uint_eq(coll__f32_to_f16(-0.0f), 0x8000);
    ck_assert_uint_eq(coll__f32_to_f16(1.0f), 0x3c00);
    ck_assert_uint_eq(coll__f32_to_f16(65504.0f), 0x7bff); /* largest finite */
    ck_assert_uint_eq(coll__f32_to_f16(65519.99f), 0x7bff);
    ck_assert_uint_eq(coll__f32_to_f16(65520.0f), 0x7c00); /* tie to even: inf */
    ck_assert_uint_eq(coll__f32_to_f16(-65520.0f), 0xfc00);
    ck_assert_uint_eq(coll__f32_to_f16(1e30f), 0x7c00);
    ck_assert_uint_eq(coll__f32_to_f16(FLT_MAX), 0x7c00);
    ck_assert_uint_eq(coll__f32_to_f16(INFINITY), 0x7c00);
    ck_assert_uint_eq(coll__f32_to_f16(-INFINITY), 0xfc00);
    ck_assert_uint_eq(coll__f32_to_f16(0x1p-14f), 0x0400);            /* smallest normal */
    ck_assert_uint_eq(coll__f32_to_f16(0x1p-14f - 0x1p-25f), 0x0400); /* tie, up to even */
    ck_assert_uint_eq(coll__f32_to_f16(0x1p-24f), 0x0001);            /* smallest subnormal */
    ck_assert_uint_eq(coll__f32_to_f16(0x1p-25f), 0x0000);            /* tie to even: 0 */
    ck_assert_uint_eq(coll__f32_to_f16(nextafterf(0x1p-25f, 1)), 0x0001);
    ck_assert_uint_eq(coll__f32_to_f16(-0x1p-25f), 0x8000);
    ck_assert_uint_eq(coll__f32_to_f16(0x3p-25f), 0x0002);     /* 1.5 ulp: tie to 2 */
    ck_assert_uint_eq(coll__f32_to_f16(FLT_TRUE_MIN), 0x0000); /* f32 subnormal */
    ck_assert_uint_eq(coll__f32_to_f16(-FLT_TRUE_MIN), 0x8000);
    /* NaN: quiet, sign and the top payload bits kept. */
    ck_assert_uint_eq(coll__f32_to_f16(bits_f32(0x7fc00000u)), 0x7e00);
    ck_assert_uint_eq(coll__f32_to_f16(bits_f32(0xffc00000u)), 0xfe00);
    ck_assert_uint_eq(coll__f32_to_f16(bits_f32(0x7f800001u)), 0x7e00); /* signalling */
    ck_assert_uint_eq(coll__f32_to_f16(bits_f32(0x7fa02000u)), 0x7f01);
    /* Round trip of every non-NaN f16. */
    for (uint32_t h = 0; h <= 0xffff; h++)
        if ((h & 0x7fff) <= 0x7c00)
            ck_assert_uint_eq(coll__f32_to_f16(coll__f16_to_f32((uint16_t)h)), h);
}
END_TEST

START_TEST(bf16_conversions)
{
    for (uint32_t h = 0; h <= 0xffff; h++) {
        float f = bf16_to_f32((uint16_t)h);
        ck_assert_uint_eq(f32_bits(f), h << 16); /* NaNs too: a plain widening */
        if ((h & 0x7fff) > 0x7f80) {
            ck_assert_uint_eq(bf16_from_f32(f), h | 0x40); /* quietened */
            continue;
        }
        ck_assert_uint_eq(bf16_from_f32(f), h);
        if ((h & 0x7fff) == 0x7f80)
            continue;
        /* Midpoint to h + 1 in magnitude (infinity after the largest finite) and neighbours. */
        uint32_t mid = (h << 16) | 0x8000u;
        uint32_t even = (h & 1) ? h + 1 : h;
        ck_assert_uint_eq(bf16_from_f32(bits_f32(mid)), even);
        ck_assert_uint_eq(bf16_from_f32(bits_f32(mid - 1)), h);
        ck_assert_uint_eq(bf16_from_f32(bits_f32(mid + 1)), h + 1);
    }
    ck_assert_uint_eq(bf16_from_f32(FLT_MAX), 0x7f80);
    ck_assert_uint_eq(bf16_from_f32(-FLT_MAX), 0xff80);
    ck_assert_uint_eq(bf16_from_f32(bits_f32(0x7f7f7fffu)), 0x7f7f); /* largest finite */
    ck_assert_uint_eq(bf16_from_f32(bits_f32(0x00008000u)), 0x0000); /* subnormal tie */
    ck_assert_uint_eq(bf16_from_f32(bits_f32(0x00018000u)), 0x0002);
    ck_assert_uint_eq(bf16_from_f32(bits_f32(0x7f800001u)), 0x7fc0);
    ck_assert_uint_eq(bf16_from_f32(1.0f), 0x3f80);
}
END_TEST

#ifdef __FLT16_MAX__
/* Against the compiler's own _Float16 (libgcc's soft-float on x86 without AVX512-FP16). */
START_TEST(f16_against_compiler)
{
    for (int i = 0; i < 2000000; i++) {
        float f = bits_f32((uint32_t)rnd());
        if (i & 1)
            f = (float)ldexp(rnd_moderate(), (int)(rnd() % 50) - 30);
        if (isnan(f))
            continue;
        _Float16 h = (_Float16)f;
        uint16_t hb;
        memcpy(&hb, &h, sizeof hb);
        ck_assert_msg(coll__f32_to_f16(f) == hb, "f32 0x%08x: 0x%04x, compiler 0x%04x", f32_bits(f),
                      coll__f32_to_f16(f), hb);
    }
}
END_TEST
#endif

/* ------------------------------------------------------------------------------------------ */
/* Reductions                                                                                  */
/* ------------------------------------------------------------------------------------------ */

/* Every op and nsrc 1..8 over small sizes and ones that cross a block (4 KiB of accumulator). */
START_TEST(reduce_small)
{
    static const size_t sizes[] = {0, 1, 7, 8, 9, 31, 33, 1023, 1024, 1025, 4095, 4097, 10007};
    coll_dtype dt = (coll_dtype)_i;
    for (int op = 0; op < COLL_OP_COUNT; op++)
        for (int nsrc = 1; nsrc <= MAXSRC; nsrc++)
            for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
                check_case(dt, (coll_op)op, nsrc, sizes[s], (s + nsrc) % 3, -1);
}
END_TEST

START_TEST(reduce_large)
{
    coll_dtype dt = (coll_dtype)_i;
    for (int op = 0; op < COLL_OP_COUNT; op++)
        for (int nsrc = 1; nsrc <= MAXSRC; nsrc++)
            check_case(dt, (coll_op)op, nsrc, 1000003, (size_t)nsrc % 2, -1);
}
END_TEST

/* dst is srcs[0], srcs[nsrc - 1] or one in the middle. */
START_TEST(reduce_aliased)
{
    coll_dtype dt = (coll_dtype)_i;
    for (int op = 0; op < COLL_OP_COUNT; op++) {
        for (int nsrc = 1; nsrc <= MAXSRC; nsrc++) {
            int ks[3] = {0, nsrc - 1, nsrc / 2};
            for (int j = 0; j < 3; j++) {
                check_case(dt, (coll_op)op, nsrc, 7, 0, ks[j]);
                check_case(dt, (coll_op)op, nsrc, 4099, 1, ks[j]);
            }
        }
        check_case(dt, (coll_op)op, 4, 1000003, 0, 0);
        check_case(dt, (coll_op)op, 3, 1000003, 1, 2);
    }
}
END_TEST

/* The same source passed several times. */
START_TEST(reduce_repeated_source)
{
    float a[100], out[100];
    for (int i = 0; i < 100; i++)
        a[i] = (float)i - 50;
    const void *srcs[3] = {a, a, a};
    coll__reduce_n(out, srcs, 3, 100, COLL_F32, COLL_SUM);
    for (int i = 0; i < 100; i++)
        ck_assert(out[i] == 3 * a[i]);
    coll__reduce_n(a, srcs, 3, 100, COLL_F32, COLL_PROD);
    for (int i = 0; i < 100; i++)
        ck_assert(a[i] == ((float)i - 50) * ((float)i - 50) * ((float)i - 50));
}
END_TEST

/* Hand-picked values: wrapping, NaN propagation, f16 overflow to infinity, single rounding. */
START_TEST(reduce_semantics)
{
    int32_t ia[1] = {INT32_MAX}, ib[1] = {1}, io[1];
    const void *isrc[2] = {ia, ib};
    coll__reduce_n(io, isrc, 2, 1, COLL_I32, COLL_SUM);
    ck_assert_int_eq(io[0], INT32_MIN);

    uint8_t ua[1] = {200}, ub[1] = {100}, uo[1];
    const void *usrc[2] = {ua, ub};
    coll__reduce_n(uo, usrc, 2, 1, COLL_U8, COLL_SUM);
    ck_assert_uint_eq(uo[0], 44);
    coll__reduce_n(uo, usrc, 2, 1, COLL_U8, COLL_PROD);
    ck_assert_uint_eq(uo[0], (200 * 100) & 0xff);

    int64_t la[1] = {INT64_MIN}, lb[1] = {-1}, lo[1];
    const void *lsrc[2] = {la, lb};
    coll__reduce_n(lo, lsrc, 2, 1, COLL_I64, COLL_PROD);
    ck_assert(lo[0] == INT64_MIN);

    float fa[3] = {NAN, 1.0f, -0.0f}, fb[3] = {1.0f, NAN, 0.0f}, fo[3];
    const void *fsrc[2] = {fa, fb};
    coll__reduce_n(fo, fsrc, 2, 3, COLL_F32, COLL_MAX);
    ck_assert(isnan(fo[0]) && isnan(fo[1]));
    coll__reduce_n(fo, fsrc, 2, 3, COLL_F32, COLL_MIN);
    ck_assert(isnan(fo[0]) && isnan(fo[1]));

    /* 65504 + 16 in f16 is exactly the overflow tie: infinity. 2048 + 1 + 1: f32 keeps 2050,
     * whereas rounding after each step in f16 would give 2048. */
    uint16_t ha[2] = {coll__f32_to_f16(65504.0f), coll__f32_to_f16(2048.0f)};
    uint16_t hb[2] = {coll__f32_to_f16(16.0f), coll__f32_to_f16(1.0f)};
    uint16_t ho[2];
    const void *hsrc[3] = {ha, hb, hb};
    coll__reduce_n(ho, hsrc, 2, 1, COLL_F16, COLL_SUM);
    ck_assert_uint_eq(ho[0], 0x7c00);
    coll__reduce_n(ho, hsrc, 3, 2, COLL_F16, COLL_SUM);
    ck_assert(coll__f16_to_f32(ho[1]) == 2050.0f);

    uint16_t ba[1] = {bf16_from_f32(256.0f)}, bb[1] = {bf16_from_f32(1.0f)}, bo[1];
    const void *bsrc[3] = {ba, bb, bb};
    coll__reduce_n(bo, bsrc, 3, 1, COLL_BF16, COLL_SUM);
    ck_assert(bf16_to_f32(bo[0]) == 258.0f);
}
END_TEST

static void check_scale(coll_dtype dt, size_t count, int n)
{
    size_t es = coll_dtype_size(dt);
    char *buf = malloc(count * es + 1), *want = malloc(count * es + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_ptr_nonnull(want);
    fill(buf, count, dt);
    for (size_t i = 0; i < count; i++) {
        switch (dt) {
        case COLL_F32:
            ((float *)want)[i] = n <= 1 ? ((float *)buf)[i] : ((float *)buf)[i] / (float)n;
            break;
        case COLL_F64:
            ((double *)want)[i] = n <= 1 ? ((double *)buf)[i] : ((double *)buf)[i] / n;
            break;
        case COLL_F16: {
            uint16_t h = ((uint16_t *)buf)[i];
            ((uint16_t *)want)[i] = n <= 1 ? h : coll__f32_to_f16(coll__f16_to_f32(h) / (float)n);
            break;
        }
        case COLL_BF16: {
            uint16_t h = ((uint16_t *)buf)[i];
            ((uint16_t *)want)[i] = n <= 1 ? h : bf16_from_f32(bf16_to_f32(h) / (float)n);
            break;
        }
        case COLL_I32:
            ((int32_t *)want)[i] = ((int32_t *)buf)[i] / n;
            break;
        case COLL_I64:
            ((int64_t *)want)[i] = ((int64_t *)buf)[i] / n;
            break;
        case COLL_U8:
            ((uint8_t *)want)[i] = (uint8_t)(((uint8_t *)buf)[i] / n);
            break;
        default:
            ck_abort_msg("bad dtype");
        }
    }
    coll__scale_avg(buf, count, dt, n);
    char what[64];
    snprintf(what, sizeof what, "scale_avg count %zu n %d", count, n);
    expect_equal(buf, want, count, dt, what);
    free(buf);
    free(want);
}

START_TEST(scale_avg)
{
    static const size_t sizes[] = {0, 1, 7, 1025, 4097, 1000003};
    static const int ns[] = {1, 2, 3, 7, 8, 1000};
    coll_dtype dt = (coll_dtype)_i;
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++)
            check_scale(dt, sizes[s], ns[j]);
    /* Truncation toward zero for integers. */
    int32_t v[4] = {-7, 7, -1, 5};
    coll__scale_avg(v, 4, COLL_I32, 2);
    ck_assert(v[0] == -3 && v[1] == 3 && v[2] == 0 && v[3] == 2);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* util.c                                                                                      */
/* ------------------------------------------------------------------------------------------ */

START_TEST(names_and_parsers)
{
    static const size_t want_size[COLL_DTYPE_COUNT] = {4, 8, 2, 2, 4, 8, 1};
    for (int d = 0; d < COLL_DTYPE_COUNT; d++) {
        coll_dtype got;
        ck_assert_uint_eq(coll_dtype_size((coll_dtype)d), want_size[d]);
        ck_assert_int_eq(coll_dtype_parse(coll_dtype_name((coll_dtype)d), &got), 0);
        ck_assert_int_eq(got, d);
    }
    for (int o = 0; o < COLL_OP_COUNT; o++) {
        coll_op got;
        ck_assert_int_eq(coll_op_parse(coll_op_name((coll_op)o), &got), 0);
        ck_assert_int_eq(got, o);
    }
    for (int b = COLL_BACKEND_AUTO; b <= COLL_BACKEND_NCCL; b++) {
        coll_backend got;
        ck_assert_int_eq(coll_backend_parse(coll_backend_name((coll_backend)b), &got), 0);
        ck_assert_int_eq(got, b);
    }
    ck_assert_str_eq(coll_dtype_name(COLL_BF16), "bf16");
    ck_assert_str_eq(coll_op_name(COLL_PROD), "prod");
    ck_assert_str_eq(coll_backend_name(COLL_BACKEND_NCCL), "nccl");
    ck_assert_str_eq(coll_dtype_name(COLL_DTYPE_COUNT), "?");
    ck_assert_str_eq(coll_dtype_name((coll_dtype)-1), "?");
    ck_assert_str_eq(coll_op_name(COLL_OP_COUNT), "?");
    ck_assert_str_eq(coll_backend_name((coll_backend)3), "?");
    ck_assert_uint_eq(coll_dtype_size(COLL_DTYPE_COUNT), 0);
    ck_assert_uint_eq(coll_dtype_size((coll_dtype)-1), 0);

    coll_dtype d = COLL_F64;
    ck_assert_int_eq(coll_dtype_parse("float32", &d), -EINVAL);
    ck_assert_int_eq(coll_dtype_parse("F32", &d), -EINVAL);
    ck_assert_int_eq(coll_dtype_parse("", &d), -EINVAL);
    ck_assert_int_eq(coll_dtype_parse(NULL, &d), -EINVAL);
    ck_assert_int_eq(coll_dtype_parse("f32", NULL), -EINVAL);
    ck_assert_int_eq(d, COLL_F64); /* untouched on failure */
    coll_op o;
    ck_assert_int_eq(coll_op_parse("mean", &o), -EINVAL);
    coll_backend b;
    ck_assert_int_eq(coll_backend_parse("gloo", &b), -EINVAL);

    ck_assert_str_eq(coll__kind_name(COLL__ALLREDUCE), "allreduce");
    ck_assert_str_eq(coll__kind_name(COLL__REDUCE_SCATTER), "reduce_scatter");
    ck_assert_str_eq(coll__kind_name(COLL__RECV), "recv");
    ck_assert_str_eq(coll__kind_name((enum coll__kind)99), "?");
}
END_TEST

START_TEST(strerror_and_clock)
{
    ck_assert_str_eq(coll_strerror(0), "success");
    ck_assert_str_eq(coll_strerror(5), "success");
    ck_assert_str_eq(coll_strerror(COLL_ENCCL), "NCCL error");
    ck_assert_str_eq(coll_strerror(COLL_ECUDA), "CUDA error");
    ck_assert_str_eq(coll_strerror(COLL_EREMOTE), "a remote rank failed");
    ck_assert_str_eq(coll_strerror(-ETIMEDOUT), strerrordesc_np(ETIMEDOUT));
    ck_assert_str_eq(coll_strerror(-EINVAL), strerrordesc_np(EINVAL));
    ck_assert_ptr_nonnull(coll_strerror(-99999));
    ck_assert_ptr_nonnull(coll_strerror(INT_MIN));

    int64_t t0 = mono_now_ns();
    int64_t t1 = mono_now_ns();
    ck_assert(t0 > 0 && t1 >= t0);
    ck_assert(mono_deadline_ns(-1) == INT64_MAX);
    ck_assert(mono_deadline_ns(-5000) == INT64_MAX);
    int64_t d = mono_deadline_ns(1500);
    int64_t t2 = mono_now_ns();
    ck_assert(d >= t1 + 1500 * INT64_C(1000000) && d <= t2 + 1500 * INT64_C(1000000));
    ck_assert(mono_deadline_ns(0) >= t1);
    ck_assert(mono_deadline_ns(INT_MAX) > t1 + INT64_C(2000000000) * 1000000);

    /* Milliseconds left, rounded up; -1 for no deadline, 0 once passed. */
    ck_assert_int_eq(mono_ms_left(INT64_MAX), -1);
    ck_assert_int_eq(mono_ms_left(t0), 0);
    int left = mono_ms_left(mono_deadline_ns(1500));
    ck_assert(left > 1400 && left <= 1500);

    /* Absolute timespecs on the same clock, as condition variables on CLOCK_MONOTONIC take. */
    struct timespec ts = mono_timespec_at(INT64_C(12) * 1000000000 + 345);
    ck_assert(ts.tv_sec == 12 && ts.tv_nsec == 345);
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    ts = mono_timespec_at(mono_now_ns());
    ck_assert(ts.tv_sec > now.tv_sec || (ts.tv_sec == now.tv_sec && ts.tv_nsec >= now.tv_nsec));
    ck_assert(ts.tv_nsec >= 0 && ts.tv_nsec < 1000000000);
}
END_TEST

static Suite *reduce_suite(void)
{
    Suite *s = suite_create("reduce");

    TCase *tc = check_tcase(s, "conversions", 30, f16_to_f32_every_value, f32_to_f16_every_midpoint,
                            f32_to_f16_edges, bf16_conversions);
#ifdef __FLT16_MAX__
    tcase_add_test(tc, f16_against_compiler);
#endif

    tc = tcase_create("reduce");
    tcase_add_loop_test(tc, reduce_small, 0, COLL_DTYPE_COUNT);
    tcase_add_loop_test(tc, reduce_large, 0, COLL_DTYPE_COUNT);
    tcase_add_loop_test(tc, reduce_aliased, 0, COLL_DTYPE_COUNT);
    tcase_add_test(tc, reduce_repeated_source);
    tcase_add_test(tc, reduce_semantics);
    tcase_add_loop_test(tc, scale_avg, 0, COLL_DTYPE_COUNT);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);

    check_tcase(s, "util", 10, names_and_parsers, strerror_and_clock);
    return s;
}

int main(void)
{
    return check_run(reduce_suite());
}
