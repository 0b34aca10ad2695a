/*
 * Unit tests of libddp's optimizer kernels (SGD, AdamW, Lion) and learning-rate schedule
 * (worker/libddp/optim.c).
 *
 * Every kernel is run with every instruction set this build and CPU support (portable, AVX2,
 * AVX-512) and checked two ways: against a scalar reference in double precision, within a
 * bound of a few float roundings of the magnitudes involved (the largest error seen, as a
 * fraction of its bound, is printed), and bit for bit against the portable set on the same
 * inputs, which optim.h promises. SGD, AdamW and Lion run several steps, each step's reference
 * starting from the kernel's own float state so that errors do not compound. Sizes cover 0,
 * 1, less than one vector, vector and lane-group boundaries and a large odd count; pointers are
 * offset from a 64-byte alignment by 0, 1 and 3 elements; every buffer is followed by guard
 * elements holding NaN, which must be neither written nor read (a NaN read would show in the
 * finiteness check and the sum of squares). The bit-exact match with PyTorch itself is checked
 * by optim_torch.py; this file checks the arithmetic and the memory discipline.
 *
 * This file is built twice: test_ddp_optim links the kernels as built and
 * test_ddp_optim_portable compiles optim.c with -DDDP_OPTIM_PORTABLE.
 */
#include <check.h>

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim.h"
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

/* Uniform in [-1, 1). */
static double rnd_unit(void)
{
    return (double)(rnd() >> 11) * 0x1p-52 - 1.0;
}

/* Signed values spread over magnitudes 2^-12 .. 2^4 around `scale`, some exactly zero. */
static float rnd_value(double scale)
{
    if (rnd() % 64 == 0)
        return 0.0f;
    return (float)(rnd_unit() * scale * exp2((double)(rnd() % 17) - 12.0));
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

/*
 * ck_assert_msg() for loops over a million elements: Check's assertions record every passing
 * one (in fork mode, a write to the parent), which would dominate the run time.
 */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            ck_abort_msg(__VA_ARGS__);                                                             \
    } while (0)

static const size_t sizes[] = {0, 1, 7, 8, 15, 16, 17, 31, 32, 33, 1000003};
#define NSIZES (sizeof sizes / sizeof sizes[0])
static const size_t offsets[] = {0, 1, 3};
#define NOFFSETS (sizeof offsets / sizeof offsets[0])

/* Guard elements after each buffer: a NaN whose bits say "guard". */
#define GUARD 20
#define GUARD_BITS 0x7fc0dead

/*
 * A float buffer of n elements starting `off` elements past a 64-byte boundary, followed by
 * GUARD guard elements. Freed with buf_free().
 */
static float *buf_new(size_t n, size_t off)
{
    size_t bytes = (off + n + GUARD) * sizeof(float);
    bytes = (bytes + 63) / 64 * 64;
    float *base = aligned_alloc(64, bytes);
    ck_assert_ptr_nonnull(base);
    float *p = base + off;
    for (size_t i = 0; i < GUARD; i++)
        p[n + i] = bits_f32(GUARD_BITS);
    return p;
}

static void buf_free(float *p, size_t off)
{
    if (p)
        free(p - off);
}

static void expect_guard(const float *p, size_t n, const char *what)
{
    for (size_t i = 0; i < GUARD; i++)
        CHECK(f32_bits(p[n + i]) == GUARD_BITS, "%s: guard element %zu after %zu written", what, i,
              n);
}

/* Bit for bit, for the comparison between instruction sets. */
static void expect_same(const float *got, const float *want, size_t n, const char *what, int isa)
{
    for (size_t i = 0; i < n; i++)
        CHECK(f32_bits(got[i]) == f32_bits(want[i]),
              "%s: %s differs from portable at %zu of %zu: %a vs %a", what,
              ddp__optim_isa_name(isa), i, n, (double)got[i], (double)want[i]);
}

/* Switches to `isa`, or returns false (the test then passes vacuously) if it cannot run here. */
static bool use_isa(int isa)
{
    if (!ddp__optim_isa_supported(isa)) {
        printf("%s: not supported by this build or CPU, skipped\n", ddp__optim_isa_name(isa));
        return false;
    }
    ck_assert_int_eq(ddp__optim_use_isa(isa), 0);
    ck_assert_int_eq(ddp__optim_isa(), isa);
    return true;
}

/*
 * The worst error seen, as a fraction of the allowed bound |got - want| <= K * FLT_EPSILON *
 * magnitude, where magnitude is the same expression over absolute values.
 */
static double worst;

static void expect_near(float got, double want, double magnitude, double k, const char *what,
                        size_t i, size_t n)
{
    double bound = k * FLT_EPSILON * magnitude;
    double err = fabs((double)got - want);
    CHECK(err <= bound, "%s: element %zu of %zu: got %.9g, want %.17g (error %.3g, bound %.3g)",
          what, i, n, (double)got, want, err, bound);
    if (bound > 0 && err / bound > worst)
        worst = err / bound;
}

/* ------------------------------------------------------------------------------------------ */
/* SGD                                                                                         */
/* ------------------------------------------------------------------------------------------ */

typedef struct sgd_case {
    const char *name;
    float lr, momentum, weight_decay;
    int nesterov, steps;
} sgd_case;

static const sgd_case sgd_cases[] = {
    {"plain", 0.1f, 0.0f, 0.0f, 0, 2},    {"weight decay", 0.05f, 0.0f, 0.01f, 0, 2},
    {"momentum", 0.1f, 0.9f, 0.0f, 0, 4}, {"momentum + weight decay", 0.02f, 0.5f, 5e-4f, 0, 3},
    {"nesterov", 0.1f, 0.9f, 0.0f, 1, 4}, {"nesterov + weight decay", 0.03f, 0.99f, 0.1f, 1, 3},
};
#define NSGD (sizeof sgd_cases / sizeof sgd_cases[0])

static void sgd_run(int isa, const sgd_case *c, size_t n, size_t off)
{
    bool mom = c->momentum != 0.0f;
    float *p = buf_new(n, off), *g = buf_new(n, off), *b = mom ? buf_new(n, off) : NULL;
    float *p0 = buf_new(n, off), *b0 = mom ? buf_new(n, off) : NULL; /* portable's state */
    float *pin = malloc((n + 1) * sizeof *pin), *bin = malloc((n + 1) * sizeof *bin);
    ck_assert_ptr_nonnull(pin);
    ck_assert_ptr_nonnull(bin);
    for (size_t i = 0; i < n; i++)
        p[i] = p0[i] = rnd_value(1.0);

    for (int s = 0; s < c->steps; s++) {
        for (size_t i = 0; i < n; i++)
            g[i] = rnd_value(0.1);
        memcpy(pin, p, n * sizeof *p);
        if (mom)
            memcpy(bin, b, n * sizeof *b);
        ck_assert_int_eq(ddp__optim_use_isa(isa), 0);
        ddp__sgd_step(p, g, b, n, c->lr, c->momentum, c->nesterov, c->weight_decay, s == 0);

        for (size_t i = 0; i < n; i++) {
            double wd = c->weight_decay, m = c->momentum, lr = c->lr;
            double ge = g[i] + wd * pin[i], gmag = fabs(g[i]) + fabs(wd * pin[i]);
            if (mom) {
                double bv = s == 0 ? ge : m * bin[i] + ge;
                double bmag = s == 0 ? gmag : m * fabs(bin[i]) + gmag;
                expect_near(b[i], bv, bmag, 4, "sgd momentum buffer", i, n);
                ge = c->nesterov ? ge + m * bv : bv;
                gmag = c->nesterov ? gmag + m * bmag : bmag;
            }
            expect_near(p[i], pin[i] - lr * ge, fabs(pin[i]) + lr * gmag, 4, "sgd param", i, n);
        }

        ck_assert_int_eq(ddp__optim_use_isa(DDP__ISA_PORTABLE), 0);
        ddp__sgd_step(p0, g, b0, n, c->lr, c->momentum, c->nesterov, c->weight_decay, s == 0);
        expect_same(p, p0, n, "sgd param", isa);
        if (mom)
            expect_same(b, b0, n, "sgd momentum buffer", isa);
        expect_guard(p, n, "sgd param");
        expect_guard(g, n, "sgd grad");
        if (mom)
            expect_guard(b, n, "sgd momentum buffer");
    }
    buf_free(p, off);
    buf_free(g, off);
    buf_free(b, off);
    buf_free(p0, off);
    buf_free(b0, off);
    free(pin);
    free(bin);
}

START_TEST(sgd)
{
    int isa = _i;
    if (!use_isa(isa))
        return;
    worst = 0;
    for (size_t c = 0; c < NSGD; c++)
        for (size_t k = 0; k < NSIZES; k++)
            for (size_t o = 0; o < NOFFSETS; o++)
                sgd_run(isa, &sgd_cases[c], sizes[k], offsets[o]);
    printf("sgd [%s]: worst error %.3f of the bound (4 float epsilons of the magnitudes)\n",
           ddp__optim_isa_name(isa), worst);
}
END_TEST

/* The grad is read-only and, with momentum 0, the buffer may be NULL; n == 0 touches nothing. */
START_TEST(sgd_contract)
{
    float p[3] = {1.0f, -2.0f, 0.5f}, g[3] = {0.5f, 0.25f, -1.0f};
    const float g0[3] = {0.5f, 0.25f, -1.0f};
    ddp__sgd_step(p, g, NULL, 3, 0.5f, 0.0f, 0, 0.0f, 1);
    ck_assert_mem_eq(g, g0, sizeof g);
    ck_assert_float_eq(p[0], 0.75f);
    ck_assert_float_eq(p[1], -2.125f);
    ck_assert_float_eq(p[2], 1.0f);
    ddp__sgd_step(NULL, NULL, NULL, 0, 0.5f, 0.0f, 0, 0.0f, 1);
    float buf[1] = {0};
    ddp__sgd_step(NULL, NULL, buf, 0, 0.5f, 0.9f, 1, 0.1f, 0);

    /* First step with momentum: the buffer becomes the gradient, whatever it held. */
    float q[1] = {1.0f}, h[1] = {2.0f}, mb[1] = {1e30f};
    ddp__sgd_step(q, h, mb, 1, 0.25f, 0.5f, 0, 0.0f, 1);
    ck_assert_float_eq(mb[0], 2.0f);
    ck_assert_float_eq(q[0], 0.5f);
    /* Second: buf = 0.5 * 2 + 2 = 3; Nesterov g = 2 + 0.5 * 3 = 3.5; q = 0.5 - 0.25 * 3.5. */
    ddp__sgd_step(q, h, mb, 1, 0.25f, 0.5f, 1, 0.0f, 0);
    ck_assert_float_eq(mb[0], 3.0f);
    ck_assert_float_eq(q[0], -0.375f);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* AdamW                                                                                       */
/* ------------------------------------------------------------------------------------------ */

typedef struct adamw_case {
    const char *name;
    float lr, beta1, beta2, eps, weight_decay;
    int steps;
} adamw_case;

static const adamw_case adamw_cases[] = {
    {"defaults + weight decay", 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 6},
    {"no weight decay", 3e-4f, 0.95f, 0.99f, 1e-6f, 0.0f, 4},
    /* 1 - beta1 >= 0.5: PyTorch's lerp takes its other branch. */
    {"small beta1", 1e-2f, 0.3f, 0.5f, 1e-8f, 0.1f, 4},
};
#define NADAMW (sizeof adamw_cases / sizeof adamw_cases[0])

static void adamw_run(int isa, const adamw_case *c, size_t n, size_t off)
{
    float *p = buf_new(n, off), *g = buf_new(n, off), *m = buf_new(n, off), *v = buf_new(n, off);
    float *p0 = buf_new(n, off), *m0 = buf_new(n, off), *v0 = buf_new(n, off);
    float *in = malloc((3 * n + 1) * sizeof *in); /* p, m, v before the step */
    ck_assert_ptr_nonnull(in);
    for (size_t i = 0; i < n; i++) {
        p[i] = p0[i] = rnd_value(1.0);
        m[i] = m0[i] = 0.0f;
        v[i] = v0[i] = 0.0f;
    }

    for (int s = 1; s <= c->steps; s++) {
        for (size_t i = 0; i < n; i++)
            g[i] = rnd_value(0.1);
        memcpy(in, p, n * sizeof *p);
        memcpy(in + n, m, n * sizeof *m);
        memcpy(in + 2 * n, v, n * sizeof *v);
        ck_assert_int_eq(ddp__optim_use_isa(isa), 0);
        ddp__adamw_step(p, g, m, v, n, c->lr, c->beta1, c->beta2, c->eps, c->weight_decay, s);

        double lr = c->lr, b1 = c->beta1, b2 = c->beta2, eps = c->eps, wd = c->weight_decay;
        double bc1 = 1 - pow(b1, s), bc2 = 1 - pow(b2, s);
        for (size_t i = 0; i < n; i++) {
            double pi = in[i], mi = in[n + i], vi = in[2 * n + i], gi = g[i];
            double mw = b1 * mi + (1 - b1) * gi, mmag = fabs(mi) + fabs(gi);
            double vw = b2 * vi + (1 - b2) * gi * gi;
            expect_near(m[i], mw, mmag, 4, "adamw m", i, n);
            expect_near(v[i], vw, vw, 4, "adamw v", i, n);
            double p1 = pi * (1 - lr * wd);
            double denom = sqrt(vw / bc2) + eps;
            double pw = p1 - lr * (mw / bc1) / denom;
            expect_near(p[i], pw, fabs(p1) + lr * (mmag / bc1) / denom, 8, "adamw param", i, n);
        }

        ck_assert_int_eq(ddp__optim_use_isa(DDP__ISA_PORTABLE), 0);
        ddp__adamw_step(p0, g, m0, v0, n, c->lr, c->beta1, c->beta2, c->eps, c->weight_decay, s);
        expect_same(p, p0, n, "adamw param", isa);
        expect_same(m, m0, n, "adamw m", isa);
        expect_same(v, v0, n, "adamw v", isa);
        expect_guard(p, n, "adamw param");
        expect_guard(g, n, "adamw grad");
        expect_guard(m, n, "adamw m");
        expect_guard(v, n, "adamw v");
    }
    buf_free(p, off);
    buf_free(g, off);
    buf_free(m, off);
    buf_free(v, off);
    buf_free(p0, off);
    buf_free(m0, off);
    buf_free(v0, off);
    free(in);
}

START_TEST(adamw)
{
    int isa = _i;
    if (!use_isa(isa))
        return;
    worst = 0;
    for (size_t c = 0; c < NADAMW; c++)
        for (size_t k = 0; k < NSIZES; k++)
            for (size_t o = 0; o < NOFFSETS; o++)
                adamw_run(isa, &adamw_cases[c], sizes[k], offsets[o]);
    printf("adamw [%s]: worst error %.3f of the bound (4 float epsilons for m and v, 8 for the "
           "parameter)\n",
           ddp__optim_isa_name(isa), worst);
}
END_TEST

/* One step by hand: step 1 with zero moments moves every parameter by lr * sign(g) (up to eps). */
START_TEST(adamw_first_step)
{
    float p[5] = {1.0f, -1.0f, 0.0f, 2.0f, 3.0f}, g[5] = {0.5f, -2.0f, 1e-3f, 0.0f, -1e-5f};
    const float g0[5] = {0.5f, -2.0f, 1e-3f, 0.0f, -1e-5f};
    float m[5] = {0}, v[5] = {0};
    ddp__adamw_step(p, g, m, v, 5, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, 1);
    ck_assert_mem_eq(g, g0, sizeof g);
    ck_assert_float_eq_tol(p[0], 0.9f, 1e-6f);
    ck_assert_float_eq_tol(p[1], -0.9f, 1e-6f);
    ck_assert_float_eq_tol(p[2], -0.1f, 1e-5f);
    ck_assert_float_eq(p[3], 2.0f); /* g = 0: m = v = 0, the update is 0 / eps */
    ck_assert_float_eq_tol(p[4], 3.1f, 1e-3f);
    ddp__adamw_step(NULL, NULL, NULL, NULL, 0, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, 1);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Lion                                                                                        */
/* ------------------------------------------------------------------------------------------ */

typedef struct lion_case {
    const char *name;
    float lr, beta1, beta2, weight_decay;
    int steps;
} lion_case;

static const lion_case lion_cases[] = {
    {"defaults", 1e-4f, 0.9f, 0.99f, 0.0f, 5},
    {"weight decay", 3e-4f, 0.95f, 0.98f, 1.0f, 4},
    {"beta1 0", 1e-3f, 0.0f, 0.5f, 0.1f, 3}, /* the update is sign(g) */
};
#define NLION (sizeof lion_cases / sizeof lion_cases[0])

/*
 * The double reference decides the sign from the exact interpolation; the kernel from its
 * float one. They can disagree only where the interpolation is within a few roundings of 0,
 * which the reference detects (|u| below the bound) and then accepts either sign or 0.
 */
static void lion_run(int isa, const lion_case *c, size_t n, size_t off)
{
    float *p = buf_new(n, off), *g = buf_new(n, off), *m = buf_new(n, off);
    float *p0 = buf_new(n, off), *m0 = buf_new(n, off);
    float *in = malloc((2 * n + 1) * sizeof *in); /* p, m before the step */
    ck_assert_ptr_nonnull(in);
    for (size_t i = 0; i < n; i++) {
        p[i] = p0[i] = rnd_value(1.0);
        m[i] = m0[i] = 0.0f;
    }
    for (int s = 1; s <= c->steps; s++) {
        for (size_t i = 0; i < n; i++)
            g[i] = rnd_value(0.1);
        memcpy(in, p, n * sizeof *p);
        memcpy(in + n, m, n * sizeof *m);
        ck_assert_int_eq(ddp__optim_use_isa(isa), 0);
        ddp__lion_step(p, g, m, n, c->lr, c->beta1, c->beta2, c->weight_decay);

        double lr = c->lr, b1 = c->beta1, b2 = c->beta2, wd = c->weight_decay;
        for (size_t i = 0; i < n; i++) {
            double pi = in[i], mi = in[n + i], gi = g[i];
            double u = b1 * mi + (1 - b1) * gi, umag = fabs(b1 * mi) + fabs((1 - b1) * gi);
            double mw = b2 * mi + (1 - b2) * gi;
            expect_near(m[i], mw, fabs(mi) + fabs(gi), 4, "lion m", i, n);
            double p1 = pi * (1 - lr * wd);
            if (fabs(u) > 4 * FLT_EPSILON * umag) {
                double pw = p1 - lr * ((u > 0) - (u < 0));
                expect_near(p[i], pw, fabs(p1) + lr, 4, "lion param", i, n);
            } else {
                double d = fabs((double)p[i] - p1);
                CHECK(d <= lr + 4 * FLT_EPSILON * (fabs(p1) + lr),
                      "lion param: element %zu of %zu moved by %g, more than lr", i, n, d);
            }
        }

        ck_assert_int_eq(ddp__optim_use_isa(DDP__ISA_PORTABLE), 0);
        ddp__lion_step(p0, g, m0, n, c->lr, c->beta1, c->beta2, c->weight_decay);
        expect_same(p, p0, n, "lion param", isa);
        expect_same(m, m0, n, "lion m", isa);
        expect_guard(p, n, "lion param");
        expect_guard(g, n, "lion grad");
        expect_guard(m, n, "lion m");
    }
    buf_free(p, off);
    buf_free(g, off);
    buf_free(m, off);
    buf_free(p0, off);
    buf_free(m0, off);
    free(in);
}

START_TEST(lion)
{
    int isa = _i;
    if (!use_isa(isa))
        return;
    worst = 0;
    for (size_t c = 0; c < NLION; c++)
        for (size_t k = 0; k < NSIZES; k++)
            for (size_t o = 0; o < NOFFSETS; o++)
                lion_run(isa, &lion_cases[c], sizes[k], offsets[o]);
    printf("lion [%s]: worst error %.3f of the bound (4 float epsilons)\n",
           ddp__optim_isa_name(isa), worst);
}
END_TEST

/* One step by hand: m = 0, so the update is lr * sign(g) after the decay; g = 0 moves nothing. */
START_TEST(lion_first_step)
{
    float p[4] = {1.0f, -1.0f, 0.5f, 2.0f}, g[4] = {0.5f, -2.0f, 0.0f, -1e-30f};
    const float g0[4] = {0.5f, -2.0f, 0.0f, -1e-30f};
    float m[4] = {0};
    ddp__lion_step(p, g, m, 4, 0.25f, 0.9f, 0.99f, 0.0f);
    ck_assert_mem_eq(g, g0, sizeof g);
    ck_assert_float_eq(p[0], 0.75f);
    ck_assert_float_eq(p[1], -0.75f);
    ck_assert_float_eq(p[2], 0.5f);
    ck_assert_float_eq(p[3], 2.25f);
    ck_assert_float_eq_tol(m[0], 0.005f, 1e-7f);
    ck_assert_float_eq_tol(m[1], -0.02f, 1e-7f);
    /* Decoupled decay: p * (1 - lr * wd) = 1 * 0.5, then - lr. */
    float q = 1.0f, h = 1.0f, mq = 0.0f;
    ddp__lion_step(&q, &h, &mq, 1, 0.25f, 0.9f, 0.99f, 2.0f);
    ck_assert_float_eq(q, 0.25f);
    ddp__lion_step(NULL, NULL, NULL, 0, 0.25f, 0.9f, 0.99f, 0.0f);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Vector helpers                                                                              */
/* ------------------------------------------------------------------------------------------ */

/* Some special values among ordinary ones, for the exact kernels. */
static float rnd_special(void)
{
    static const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,
                                        0x7fc00000u, 0x00000001u, 0x807fffffu, 0x7f7fffffu};
    if (rnd() % 16 == 0)
        return bits_f32(specials[rnd() % (sizeof specials / sizeof specials[0])]);
    return rnd_value(4.0);
}

static bool same_or_both_nan(float a, float b)
{
    return f32_bits(a) == f32_bits(b) || (isnan(a) && isnan(b));
}

START_TEST(sum_squares)
{
    int isa = _i;
    if (!use_isa(isa))
        return;
    worst = 0;
    for (size_t k = 0; k < NSIZES; k++) {
        size_t n = sizes[k];
        float *x0 = buf_new(n, 0);
        long double ref = 0;
        for (size_t i = 0; i < n; i++) {
            x0[i] = rnd_value(1.0);
            ref += (long double)x0[i] * x0[i];
        }
        ck_assert_int_eq(ddp__optim_use_isa(DDP__ISA_PORTABLE), 0);
        double want = ddp__sum_squares(x0, n);
        ck_assert_int_eq(ddp__optim_use_isa(isa), 0);
        for (size_t o = 0; o < NOFFSETS; o++) {
            size_t off = offsets[o];
            float *x = buf_new(n, off);
            memcpy(x, x0, n * sizeof *x);
            double got = ddp__sum_squares(x, n);
            /* The same bits whatever the set and the alignment. */
            ck_assert_msg(got == want, "sum_squares: %s, n %zu, offset %zu: %a vs portable %a",
                          ddp__optim_isa_name(isa), n, off, got, want);
            /* Positive terms: each lane's sum of about n / 32 terms, then 5 pairwise adds. */
            double bound = ((double)n / 32 + 6) * DBL_EPSILON * (double)ref;
            double err = fabs(got - (double)ref);
            ck_assert_msg(err <= bound, "sum_squares: n %zu: %.17g vs %.17Lg", n, got, ref);
            if (bound > 0 && err / bound > worst)
                worst = err / bound;
            buf_free(x, off);
        }
        ck_assert(n > 0 || want == 0.0);
        buf_free(x0, 0);
    }
    ck_assert(ddp__sum_squares(NULL, 0) == 0.0);

    /* Not finite in, not finite out; 3^2 + 4^2 exactly. */
    float bad[17] = {3.0f, 4.0f};
    ck_assert(ddp__sum_squares(bad, 17) == 25.0);
    bad[16] = INFINITY;
    ck_assert(isinf(ddp__sum_squares(bad, 17)));
    bad[5] = NAN;
    ck_assert(isnan(ddp__sum_squares(bad, 17)));
    /* Each square is exact in double and so is this sum: no float overflow either. */
    float big[2] = {FLT_MAX, -FLT_MAX};
    ck_assert(ddp__sum_squares(big, 2) == 2.0 * (double)FLT_MAX * (double)FLT_MAX);
    printf("sum_squares [%s]: worst error %.3f of the bound ((n/32 + 6) double epsilons)\n",
           ddp__optim_isa_name(isa), worst);
}
END_TEST

START_TEST(scale_and_add)
{
    int isa = _i;
    if (!use_isa(isa))
        return;
    static const float factors[] = {0.37f, -3.0f, 0.0f, 1.0f};
    for (size_t k = 0; k < NSIZES; k++) {
        size_t n = sizes[k];
        for (size_t o = 0; o < NOFFSETS; o++) {
            size_t off = offsets[o];
            float *x = buf_new(n, off), *y = buf_new(n, off), *x0 = buf_new(n, off);
            for (size_t i = 0; i < n; i++) {
                x[i] = x0[i] = rnd_special();
                y[i] = rnd_special();
            }
            /* Products and sums of two floats are exact in double: one rounding to float. */
            float s = factors[(k + o) % 4];
            ddp__scale(x, n, s);
            for (size_t i = 0; i < n; i++)
                CHECK(same_or_both_nan(x[i], (float)((double)x0[i] * s)),
                      "scale: %s, %zu of %zu: %a * %a = %a", ddp__optim_isa_name(isa), i, n,
                      (double)x0[i], (double)s, (double)x[i]);
            expect_guard(x, n, "scale");

            memcpy(x0, x, n * sizeof *x);
            ddp__add(x, y, n);
            for (size_t i = 0; i < n; i++)
                CHECK(same_or_both_nan(x[i], (float)((double)x0[i] + (double)y[i])),
                      "add: %s, %zu of %zu", ddp__optim_isa_name(isa), i, n);
            expect_guard(x, n, "add");
            expect_guard(y, n, "add source");

            /* src == dst doubles. */
            memcpy(x0, y, n * sizeof *y);
            ddp__add(y, y, n);
            for (size_t i = 0; i < n; i++)
                CHECK(same_or_both_nan(y[i], x0[i] * 2.0f), "add in place: %zu of %zu", i, n);
            expect_guard(y, n, "add in place");
            buf_free(x, off);
            buf_free(y, off);
            buf_free(x0, off);
        }
    }
    ddp__scale(NULL, 0, 2.0f);
    ddp__add(NULL, NULL, 0);
}
END_TEST

START_TEST(all_finite)
{
    int isa = _i;
    if (!use_isa(isa))
        return;
    static const uint32_t bad[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u,
                                   0x7f800000u, 0xff800000u, 0x7fffffffu};
    static const uint32_t finite[] = {0x7f7fffffu, 0xff7fffffu, 0x00000001u,
                                      0x80000000u, 0x807fffffu, 0x3f800000u};
    ck_assert_int_eq(ddp__all_finite(NULL, 0), 1);
    for (size_t k = 0; k < NSIZES; k++) {
        size_t n = sizes[k];
        for (size_t o = 0; o < NOFFSETS; o++) {
            size_t off = offsets[o];
            float *x = buf_new(n, off); /* the NaN guards must not be read */
            for (size_t i = 0; i < n; i++)
                x[i] = bits_f32(finite[i % 6]);
            ck_assert_msg(ddp__all_finite(x, n) == 1, "all_finite: %s, n %zu, offset %zu",
                          ddp__optim_isa_name(isa), n, off);
            if (n == 0) {
                buf_free(x, off);
                continue;
            }
            /* Start, middle (in the vector body when there is one) and the very last element
             * (in the tail when there is one). */
            size_t where[] = {0, n / 2, n - 1};
            for (size_t w = 0; w < 3; w++) {
                for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
                    float keep = x[where[w]];
                    x[where[w]] = bits_f32(bad[b]);
                    ck_assert_msg(ddp__all_finite(x, n) == 0,
                                  "all_finite: %s, n %zu, offset %zu, 0x%08x at %zu missed",
                                  ddp__optim_isa_name(isa), n, off, bad[b], where[w]);
                    x[where[w]] = keep;
                }
            }
            ck_assert_int_eq(ddp__all_finite(x, n), 1);
            buf_free(x, off);
        }
    }
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Instruction sets                                                                            */
/* ------------------------------------------------------------------------------------------ */

START_TEST(isa_selection)
{
    int best = ddp__optim_isa();
    ck_assert(ddp__optim_isa_supported(best));
    ck_assert(ddp__optim_isa_supported(DDP__ISA_PORTABLE));
    for (int isa = best + 1; isa < DDP__ISA_COUNT; isa++)
        ck_assert_msg(!ddp__optim_isa_supported(isa), "%s supported but %s chosen",
                      ddp__optim_isa_name(isa), ddp__optim_isa_name(best));
    printf("kernel set chosen at run time: %s\n", ddp__optim_isa_name(best));
#ifdef DDP_OPTIM_PORTABLE
    ck_assert_int_eq(best, DDP__ISA_PORTABLE);
    ck_assert_int_eq(ddp__optim_use_isa(DDP__ISA_AVX2), -ENOTSUP);
#endif
    ck_assert_int_eq(ddp__optim_use_isa(DDP__ISA_PORTABLE), 0);
    ck_assert_int_eq(ddp__optim_isa(), DDP__ISA_PORTABLE);
    ck_assert_int_eq(ddp__optim_use_isa(-1), 0);
    ck_assert_int_eq(ddp__optim_isa(), best);
    ck_assert_int_eq(ddp__optim_use_isa(DDP__ISA_COUNT), -EINVAL);
    ck_assert_int_eq(ddp__optim_use_isa(-2), -EINVAL);
    ck_assert_str_eq(ddp__optim_isa_name(DDP__ISA_AVX512), "avx512");
    ck_assert_str_eq(ddp__optim_isa_name(7), "?");
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Learning-rate schedule                                                                      */
/* ------------------------------------------------------------------------------------------ */

static float lr_at(ddp_schedule_kind kind, float lr, int64_t warmup, int64_t total, float min,
                   int64_t step)
{
    ddp_schedule s = {kind, lr, warmup, total, min};
    return ddp_schedule_lr(&s, step);
}

START_TEST(schedule_constant)
{
    for (int64_t t = -3; t < 5; t++)
        ck_assert_float_eq(lr_at(DDP_SCHED_CONSTANT, 0.1f, 0, 0, 0, t), 0.1f);
    ck_assert_float_eq(lr_at(DDP_SCHED_CONSTANT, 0.1f, 0, 0, 0.5f, INT64_MAX), 0.1f);
    /* With warmup: 1/4, 2/4, 3/4, 4/4 of lr, then lr; a negative step is step 0. */
    ck_assert_float_eq(lr_at(DDP_SCHED_CONSTANT, 0.4f, 4, 0, 0, -1), 0.1f);
    ck_assert_float_eq(lr_at(DDP_SCHED_CONSTANT, 0.4f, 4, 0, 0, INT64_MIN), 0.1f);
    ck_assert_float_eq(lr_at(DDP_SCHED_CONSTANT, 0.4f, 4, 0, 0, 0), 0.1f);
    ck_assert_float_eq(lr_at(DDP_SCHED_CONSTANT, 0.4f, 4, 0, 0, 1), 0.2f);
    ck_assert_float_eq(lr_at(DDP_SCHED_CONSTANT, 0.4f, 4, 0, 0, 2), (float)(0.4 * 3 / 4));
    ck_assert_float_eq(lr_at(DDP_SCHED_CONSTANT, 0.4f, 4, 0, 0, 3), 0.4f);
    ck_assert_float_eq(lr_at(DDP_SCHED_CONSTANT, 0.4f, 4, 0, 0, 4), 0.4f);
    ck_assert_float_eq(lr_at(DDP_SCHED_CONSTANT, 0.4f, 4, 0, 0, 1000000), 0.4f);
    /* A negative warmup is none. */
    ck_assert_float_eq(lr_at(DDP_SCHED_CONSTANT, 0.4f, -4, 0, 0, 0), 0.4f);
}
END_TEST

START_TEST(schedule_cosine)
{
    const float lr = 1.0f, min = 0.1f;
    const int64_t W = 10, T = 110;
    /* Warmup: step 0 gets lr / W, step W - 1 gets lr. */
    ck_assert_float_eq(lr_at(DDP_SCHED_COSINE, lr, W, T, min, -7), 0.1f);
    ck_assert_float_eq(lr_at(DDP_SCHED_COSINE, lr, W, T, min, 0), 0.1f);
    ck_assert_float_eq(lr_at(DDP_SCHED_COSINE, lr, W, T, min, 4), 0.5f);
    ck_assert_float_eq(lr_at(DDP_SCHED_COSINE, lr, W, T, min, W - 1), lr);
    /* Decay: lr at W, the midpoint halfway, min at T and after. */
    ck_assert_float_eq(lr_at(DDP_SCHED_COSINE, lr, W, T, min, W), lr);
    const double dmin = min; /* 0.1f, not 0.1 */
    ck_assert_float_eq(lr_at(DDP_SCHED_COSINE, lr, W, T, min, (W + T) / 2),
                       (float)(dmin + (1 - dmin) / 2));
    float last = lr_at(DDP_SCHED_COSINE, lr, W, T, min, T - 1);
    ck_assert_float_eq(last, (float)(dmin + (1 - dmin) * 0.5 * (1 + cos(M_PI * 99.0 / 100.0))));
    ck_assert(last > min);
    ck_assert_float_eq(lr_at(DDP_SCHED_COSINE, lr, W, T, min, T), min);
    ck_assert_float_eq(lr_at(DDP_SCHED_COSINE, lr, W, T, min, T + 1), min);
    ck_assert_float_eq(lr_at(DDP_SCHED_COSINE, lr, W, T, min, INT64_MAX), min);
    /* Rising through warmup, falling after, never outside [min, lr]. */
    float prev = 0;
    for (int64_t t = 0; t <= T + 5; t++) {
        float x = lr_at(DDP_SCHED_COSINE, lr, W, T, min, t);
        if (t < W)
            ck_assert_float_gt(x, prev);
        else if (t > W)
            ck_assert_float_le(x, prev);
        if (t >= W)
            ck_assert(x >= min && x <= lr);
        prev = x;
    }
    /* Every step against the formula in optim.h, evaluated here in double. */
    for (int64_t t = W; t < T; t++) {
        double want = dmin + (1 - dmin) * 0.5 * (1 + cos(M_PI * (double)(t - W) / (double)(T - W)));
        ck_assert_float_eq(lr_at(DDP_SCHED_COSINE, lr, W, T, min, t), (float)want);
    }
    /* No warmup: lr at step 0; min_lr 0 by default. */
    ck_assert_float_eq(lr_at(DDP_SCHED_COSINE, 0.5f, 0, 100, 0, 0), 0.5f);
    ck_assert_float_eq(lr_at(DDP_SCHED_COSINE, 0.5f, 0, 100, 0, 50), 0.25f);
    ck_assert_float_eq(lr_at(DDP_SCHED_COSINE, 0.5f, 0, 100, 0, 100), 0.0f);
}
END_TEST

START_TEST(schedule_degenerate)
{
    /* Warmup as long as or longer than the whole: warm up, then min. */
    ck_assert_float_eq(lr_at(DDP_SCHED_COSINE, 1.0f, 10, 10, 0.25f, 9), 1.0f);
    ck_assert_float_eq(lr_at(DDP_SCHED_COSINE, 1.0f, 10, 10, 0.25f, 10), 0.25f);
    ck_assert_float_eq(lr_at(DDP_SCHED_COSINE, 1.0f, 10, 5, 0.25f, 7), 0.8f);
    ck_assert_float_eq(lr_at(DDP_SCHED_COSINE, 1.0f, 10, 5, 0.25f, 10), 0.25f);
    /* Total 0 (or negative): min from the first step after warmup. */
    ck_assert_float_eq(lr_at(DDP_SCHED_COSINE, 1.0f, 0, 0, 0.25f, 0), 0.25f);
    ck_assert_float_eq(lr_at(DDP_SCHED_COSINE, 1.0f, 0, -5, 0.25f, 3), 0.25f);
    ck_assert_float_eq(lr_at(DDP_SCHED_COSINE, 1.0f, 2, 0, 0.25f, 0), 0.5f);
    ck_assert_float_eq(lr_at(DDP_SCHED_COSINE, 1.0f, 2, 0, 0.25f, 2), 0.25f);
    /* One decay step: lr at W, min at W + 1 = T. */
    ck_assert_float_eq(lr_at(DDP_SCHED_COSINE, 1.0f, 3, 4, 0.0f, 3), 1.0f);
    ck_assert_float_eq(lr_at(DDP_SCHED_COSINE, 1.0f, 3, 4, 0.0f, 4), 0.0f);
    /* Misuse: NaN, which a step turns into a visible failure rather than a silent one. */
    ck_assert(isnan(ddp_schedule_lr(NULL, 0)));
    ddp_schedule bad = {(ddp_schedule_kind)7, 1.0f, 0, 10, 0.0f};
    ck_assert(isnan(ddp_schedule_lr(&bad, 0)));
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* bf16 conversions                                                                            */
/* ------------------------------------------------------------------------------------------ */

/*
 * The reference: the two bf16 values around x (its pattern truncated, and one unit above in
 * magnitude), the nearer in exact double arithmetic, a tie to the even one; NaN: quiet, sign
 * kept. Independent of the bit trick under test.
 */
static uint16_t bf16_ref(float x)
{
    uint32_t u = f32_bits(x);
    if (isnan(x))
        return (uint16_t)((u >> 16) | 0x40u);
    if (isinf(x))
        return (uint16_t)(u >> 16);
    uint16_t lo = (uint16_t)(u >> 16), sign = lo & 0x8000u;
    double a = fabs((double)x), lo_v = fabs((double)bits_f32((uint32_t)lo << 16));
    int e = lo_v == 0 ? -126 : ilogb(lo_v);
    if (e < -126)
        e = -126; /* subnormals share the smallest normal's unit */
    double ulp = ldexp(1.0, e - 7), d = a - lo_v;
    bool up = d > ulp / 2 || (d == ulp / 2 && (lo & 1u));
    return up ? (uint16_t)(((lo & 0x7fffu) + 1u) | sign) : lo;
}

START_TEST(bf16_conversion)
{
    /* Ties: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: even (down); 1 + 3 * 2^-8 up. */
    ck_assert_uint_eq(bf16_from_f32(1.0f + 0x1p-8f), 0x3f80u);
    ck_assert_uint_eq(bf16_from_f32(1.0f + 3 * 0x1p-8f), 0x3f82u);
    ck_assert_uint_eq(bf16_from_f32(-(1.0f + 3 * 0x1p-8f)), 0xbf82u);
    /* Infinities, zeros, overflow to infinity, the largest bf16 kept. */
    ck_assert_uint_eq(bf16_from_f32(INFINITY), 0x7f80u);
    ck_assert_uint_eq(bf16_from_f32(-INFINITY), 0xff80u);
    ck_assert_uint_eq(bf16_from_f32(-0.0f), 0x8000u);
    ck_assert_uint_eq(bf16_from_f32(FLT_MAX), 0x7f80u);
    ck_assert_uint_eq(bf16_from_f32(bits_f32(0x7f7f0000u)), 0x7f7fu);
    /* NaNs stay NaNs (quiet, sign kept), even a signalling one whose payload is in the low
     * half only (truncation alone would make it an infinity). */
    ck_assert(isnan(bf16_to_f32(bf16_from_f32(bits_f32(0x7f800001u)))));
    ck_assert_uint_eq(bf16_from_f32(bits_f32(0xff800001u)) & 0x8000u, 0x8000u);
    ck_assert(isnan(bf16_to_f32(bf16_from_f32(NAN))));
    /* Every bf16 widens exactly and narrows back to itself (NaNs to a quiet NaN). */
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float f = bf16_to_f32((uint16_t)h);
        ck_assert_uint_eq(f32_bits(f), h << 16);
        uint16_t back = bf16_from_f32(f);
        ck_assert_uint_eq(back, isnan(f) ? (uint16_t)(h | 0x40u) : (uint16_t)h);
    }
    /* Every rounding case against the reference: random patterns, and each bf16's halfway
     * points and their neighbours. */
    uint64_t st = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 1000000; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        float x = bits_f32((uint32_t)(st >> 32));
        ck_assert_msg(bf16_from_f32(x) == bf16_ref(x), "%a: %04x, want %04x", (double)x,
                      bf16_from_f32(x), bf16_ref(x));
    }
    for (uint32_t h = 0; h < 0x10000u; h++) {
        for (int k = -1; k <= 1; k++) {
            float x = bits_f32((h << 16) + 0x8000u + (uint32_t)k);
            ck_assert_msg(bf16_from_f32(x) == bf16_ref(x), "%a: %04x, want %04x",
                          (double)x, bf16_from_f32(x), bf16_ref(x));
        }
    }
}
END_TEST

START_TEST(bf16_arrays)
{
    float src[37], dst[37];
    uint16_t h[37];
    for (int i = 0; i < 37; i++)
        src[i] = (float)(i - 18) * 0.37f;
    ddp__to_bf16(h, src, 37, 0.25f);
    for (int i = 0; i < 37; i++)
        ck_assert_uint_eq(h[i], bf16_ref(src[i] * 0.25f));
    ddp__from_bf16(dst, h, 37, 0);
    for (int i = 0; i < 37; i++)
        ck_assert_uint_eq(f32_bits(dst[i]), (uint32_t)h[i] << 16);
    ddp__from_bf16(dst, h, 37, 1);
    for (int i = 0; i < 37; i++)
        ck_assert(dst[i] == 2 * bf16_to_f32(h[i]));
    ddp__to_bf16(NULL, NULL, 0, 1.0f); /* n == 0 touches nothing */
    ddp__from_bf16(NULL, NULL, 0, 1);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */

static Suite *optim_suite(void)
{
    Suite *s = suite_create("ddp_optim");

    TCase *tc = tcase_create("kernels");
    tcase_add_loop_test(tc, sgd, 0, DDP__ISA_COUNT);
    tcase_add_test(tc, sgd_contract);
    tcase_add_loop_test(tc, adamw, 0, DDP__ISA_COUNT);
    tcase_add_test(tc, adamw_first_step);
    tcase_add_loop_test(tc, lion, 0, DDP__ISA_COUNT);
    tcase_add_test(tc, lion_first_step);
    tcase_add_loop_test(tc, sum_squares, 0, DDP__ISA_COUNT);
    tcase_add_loop_test(tc, scale_and_add, 0, DDP__ISA_COUNT);
    tcase_add_loop_test(tc, all_finite, 0, DDP__ISA_COUNT);
    tcase_add_test(tc, isa_selection);
    tcase_add_test(tc, bf16_conversion);
    tcase_add_test(tc, bf16_arrays);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);

    check_tcase(s, "schedule", 10, schedule_constant, schedule_cosine, schedule_degenerate);
    return s;
}

int main(void)
{
    return check_run(optim_suite());
}
