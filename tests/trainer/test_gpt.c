/*
 * Unit tests of ddp-train's GPT (worker/trainer/gpt.c): backward against finite differences of
 * the forward for every parameter, causality, the hooks' order with the tied embedding's two
 * uses (its gradient final once), gradient accumulation, the bf16 mode against f32, the
 * initialisation's statistics and the sampler.
 *
 * Finite differences in float: the model runs in float on OpenBLAS, so the test takes central
 * differences of its own loss (summed in double) with a step h = 1e-2 on a small model (vocab
 * 16, context 5, width 8, 2 heads, 2 layers, 3 sequences) whose parameters are drawn with a
 * standard deviation of 0.3, so that gradients are of order 0.1 and every kernel's
 * contribution is visible. The quotient's error is h^2 |L'''| / 6 (~1e-5 here) plus float's
 * rounding of the loss, ~1e-7 x 40 / h; the test asserts
 *     max |g - g_fd| <= 2e-3 x max |g_fd|
 * over every parameter and prints the ratio (observed ~1e-4: a margin of 20), while a wrong
 * term of a backward kernel (a missing scale, a transposed product, a LayerNorm term dropped)
 * gives 5e-2 or more.
 */
#include <check.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "check_main.h"
#include "gpt.h"
#include "rng.h"

#define MAXU 8

/* A model's parameters (and their bf16 copies) in plain arrays, handed over by the hooks. */
typedef struct params {
    gpt_config cfg;
    int nu, np[MAXU];
    size_t count[MAXU][GPT_BLOCK_PARAMS];
    float *p[MAXU][GPT_BLOCK_PARAMS], *g[MAXU][GPT_BLOCK_PARAMS];
    uint16_t *p16[MAXU][GPT_BLOCK_PARAMS];
    char order[256];
    size_t olen;
} params;

static void params_init(params *ps, const gpt_config *c, uint64_t seed, float std)
{
    memset(ps, 0, sizeof *ps);
    ps->cfg = *c;
    ps->nu = gpt_num_units(c);
    ck_assert_int_le(ps->nu, MAXU);
    rng r;
    rng_init(&r, seed, 99);
    for (int u = 0; u < ps->nu; u++) {
        char name[32];
        ps->np[u] = gpt_unit(c, u, name);
        for (int k = 0; k < ps->np[u]; k++) {
            int64_t sh[2];
            int nd = gpt_param(c, u, k, name, sh);
            size_t n = (size_t)sh[0] * (nd == 2 ? (size_t)sh[1] : 1);
            ps->count[u][k] = n;
            ps->p[u][k] = malloc(n * sizeof(float));
            ps->g[u][k] = calloc(n, sizeof(float));
            ps->p16[u][k] = malloc(n * sizeof(uint16_t));
            ck_assert(ps->p[u][k] && ps->g[u][k] && ps->p16[u][k]);
            if (std == 0.0f) {
                gpt_init_param(c, u, k, seed, (uint64_t)(u * 16 + k), ps->p[u][k], n);
            } else {
                for (size_t i = 0; i < n; i++) /* uniform with the given std, around 1 for LN w */
                    ps->p[u][k][i] = (strstr(name, "ln") && strstr(name, "weight") ? 1.0f : 0.0f) +
                                     std * 1.7320508f * (2.0f * rng_float(&r) - 1.0f);
            }
        }
    }
}

static void params_free(params *ps)
{
    for (int u = 0; u < ps->nu; u++)
        for (int k = 0; k < ps->np[u]; k++) {
            free(ps->p[u][k]);
            free(ps->g[u][k]);
            free(ps->p16[u][k]);
        }
}

static int hook_begin(void *arg, int u, int backward, void **p, float **g)
{
    params *ps = arg;
    if (ps->olen + 5 < sizeof ps->order)
        ps->olen += (size_t)snprintf(ps->order + ps->olen, sizeof ps->order - ps->olen, "%s%c%d",
                                     ps->olen ? " " : "", backward ? 'b' : 'f', u);
    for (int k = 0; k < ps->np[u]; k++) {
        if (ps->cfg.bf16) {
            for (size_t i = 0; i < ps->count[u][k]; i++)
                ps->p16[u][k][i] = bf16_from_f32(ps->p[u][k][i]);
            p[k] = ps->p16[u][k];
        } else {
            p[k] = ps->p[u][k];
        }
        if (backward)
            g[k] = ps->g[u][k];
    }
    return 0;
}

static int hook_end(void *arg, int u, int backward)
{
    params *ps = arg;
    if (ps->olen + 5 < sizeof ps->order)
        ps->olen += (size_t)snprintf(ps->order + ps->olen, sizeof ps->order - ps->olen, " %c%d",
                                     backward ? 'B' : 'F', u);
    return 0;
}

static gpt_hooks hooks_of(params *ps)
{
    return (gpt_hooks){.begin = hook_begin, .end = hook_end, .arg = ps};
}

/* B random windows of seq + 1 tokens below vocab. */
static uint8_t *tokens(const gpt_config *c, int B, uint64_t seed)
{
    uint8_t *t = malloc((size_t)B * (c->seq + 1));
    rng r;
    rng_init(&r, seed, 7);
    for (int i = 0; i < B * (c->seq + 1); i++)
        t[i] = (uint8_t)rng_below(&r, (uint32_t)c->vocab);
    return t;
}

static const gpt_config small = {.vocab = 16, .seq = 5, .width = 8, .layers = 2, .heads = 2};

static double loss_of(gpt *m, params *ps, const uint8_t *tok, int B)
{
    gpt_hooks h = hooks_of(ps);
    gpt_stats st;
    ck_assert_int_eq(gpt_forward(m, &h, tok, B, ps->cfg.seq, ps->cfg.seq + 1, 1, &st), 0);
    return st.loss_sum;
}

START_TEST(backward_finite_differences)
{
    const int B = 3;
    params ps;
    params_init(&ps, &small, 3, 0.3f);
    uint8_t *tok = tokens(&small, B, 5);
    gpt *m;
    ck_assert_int_eq(gpt_create(&small, B, &m), 0);
    gpt_hooks h = hooks_of(&ps);
    gpt_stats st;
    ck_assert_int_eq(gpt_forward(m, &h, tok, B, small.seq, small.seq + 1, 1, &st), 0);
    ck_assert(st.tokens == B * small.seq);
    ck_assert_int_eq(gpt_backward(m, &h, 1.0f), 0);
    double maxg = 0, maxerr = 0;
    const float step = 1e-2f;
    for (int u = 0; u < ps.nu; u++)
        for (int k = 0; k < ps.np[u]; k++)
            for (size_t i = 0; i < ps.count[u][k]; i++) {
                float *w = &ps.p[u][k][i], keep = *w;
                *w = keep + step;
                double lp = loss_of(m, &ps, tok, B);
                *w = keep - step;
                double lm = loss_of(m, &ps, tok, B);
                *w = keep;
                double fd = (lp - lm) / (2.0 * step), g = ps.g[u][k][i];
                maxg = fmax(maxg, fabs(fd));
                maxerr = fmax(maxerr, fabs(g - fd));
            }
    printf("finite differences: max |g - fd| = %.3g, max |fd| = %.3g, ratio %.3g\n", maxerr, maxg,
           maxerr / maxg);
    ck_assert(maxg > 1e-2);
    ck_assert_msg(maxerr <= 2e-3 * maxg, "max |g - fd| %g of max |fd| %g", maxerr, maxg);
    gpt_free(m);
    free(tok);
    params_free(&ps);
}
END_TEST

/* The logits at position t depend on tokens 0..t only. */
START_TEST(causal)
{
    params ps;
    params_init(&ps, &small, 4, 0.3f);
    uint8_t *tok = tokens(&small, 1, 8);
    gpt *m;
    ck_assert_int_eq(gpt_create(&small, 1, &m), 0);
    gpt_hooks h = hooks_of(&ps);
    int N = small.seq, V = small.vocab;
    float *before = malloc(sizeof(float) * N * V);
    ck_assert_int_eq(gpt_forward(m, &h, tok, 1, N, N, 0, NULL), 0);
    memcpy(before, gpt_logits(m), sizeof(float) * N * V);
    tok[N - 1] = (uint8_t)((tok[N - 1] + 1) % V);
    ck_assert_int_eq(gpt_forward(m, &h, tok, 1, N, N, 0, NULL), 0);
    const float *after = gpt_logits(m);
    for (int i = 0; i < (N - 1) * V; i++)
        ck_assert_float_eq(before[i], after[i]);
    int changed = 0;
    for (int i = (N - 1) * V; i < N * V; i++)
        changed |= before[i] != after[i];
    ck_assert(changed);
    /* a shorter context gives the same first rows */
    ck_assert_int_eq(gpt_forward(m, &h, tok, 1, N - 2, N, 0, NULL), 0);
    for (int i = 0; i < (N - 2) * V; i++)
        ck_assert_float_eq_tol(before[i], gpt_logits(m)[i], 1e-5);
    tok[1] = (uint8_t)V; /* beyond the vocabulary */
    ck_assert_int_eq(gpt_forward(m, &h, tok, 1, N, N, 0, NULL), -EINVAL);
    free(before);
    gpt_free(m);
    free(tok);
    params_free(&ps);
}
END_TEST

/* The hooks' order, the tied embedding's gradient marked final once, and accumulation. */
START_TEST(hooks_and_accumulation)
{
    const int B = 2;
    params ps;
    params_init(&ps, &small, 5, 0.3f);
    uint8_t *tok = tokens(&small, B, 9);
    gpt *m;
    ck_assert_int_eq(gpt_create(&small, 1, &m), 0);
    gpt_hooks h = hooks_of(&ps);
    ck_assert_int_eq(gpt_forward(m, &h, tok, B, small.seq, small.seq + 1, 1, NULL), -EINVAL);
    ck_assert_int_eq(gpt_reserve(m, B), 0);
    ps.olen = 0;
    ck_assert_int_eq(gpt_forward(m, &h, tok, B, small.seq, small.seq + 1, 1, NULL), 0);
    ck_assert_int_eq(gpt_backward(m, &h, 0.5f), 0);
    ck_assert_str_eq(ps.order, "f0 F0 f1 F1 f2 F2 f3 F3 f0 F0 f0 F0 b3 B3 b2 B2 b1 B1 b0 B0");
    size_t n0 = ps.count[0][0];
    float *once = malloc(sizeof(float) * n0);
    memcpy(once, ps.g[0][0], sizeof(float) * n0);
    ck_assert_int_eq(gpt_forward(m, &h, tok, B, small.seq, small.seq + 1, 1, NULL), 0);
    ck_assert_int_eq(gpt_backward(m, &h, 0.5f), 0);
    for (size_t i = 0; i < n0; i++)
        ck_assert_float_eq_tol(ps.g[0][0][i], 2.0f * once[i], 1e-6f * (1.0f + fabsf(once[i])));
    /* an empty pass still runs every hook */
    ps.olen = 0;
    ck_assert_int_eq(gpt_forward(m, &h, NULL, 0, small.seq, small.seq + 1, 1, NULL), 0);
    ck_assert_int_eq(gpt_backward(m, &h, 0.5f), 0);
    ck_assert_str_eq(ps.order, "f0 F0 f1 F1 f2 F2 f3 F3 f0 F0 f0 F0 b3 B3 b2 B2 b1 B1 b0 B0");
    for (size_t i = 0; i < n0; i++)
        ck_assert_float_eq_tol(ps.g[0][0][i], 2.0f * once[i], 1e-6f * (1.0f + fabsf(once[i])));
    free(once);
    gpt_free(m);
    free(tok);
    params_free(&ps);
}
END_TEST

/* bf16 against f32: the loss within 1%, the gradients within 5% of the largest. */
START_TEST(bf16_against_f32)
{
    const int B = 3;
    gpt_config c = {.vocab = 64, .seq = 16, .width = 32, .layers = 2, .heads = 4};
    params a, b;
    params_init(&a, &c, 6, 0.0f);
    c.bf16 = 1;
    params_init(&b, &c, 6, 0.0f);
    uint8_t *tok = tokens(&c, B, 10);
    gpt *ma, *mb;
    c.bf16 = 0;
    ck_assert_int_eq(gpt_create(&c, B, &ma), 0);
    c.bf16 = 1;
    ck_assert_int_eq(gpt_create(&c, B, &mb), 0);
    gpt_hooks ha = hooks_of(&a), hb = hooks_of(&b);
    gpt_stats sa, sb;
    ck_assert_int_eq(gpt_forward(ma, &ha, tok, B, c.seq, c.seq + 1, 1, &sa), 0);
    ck_assert_int_eq(gpt_forward(mb, &hb, tok, B, c.seq, c.seq + 1, 1, &sb), 0);
    ck_assert_int_eq(gpt_backward(ma, &ha, 1.0f), 0);
    ck_assert_int_eq(gpt_backward(mb, &hb, 1.0f), 0);
    printf("bf16: loss %.6f against f32 %.6f\n", sb.loss_sum, sa.loss_sum);
    ck_assert(fabs(sb.loss_sum - sa.loss_sum) <= 1e-2 * sa.loss_sum);
    for (int u = 0; u < a.nu; u++)
        for (int k = 0; k < a.np[u]; k++) {
            double gmax = 0, err = 0;
            for (size_t i = 0; i < a.count[u][k]; i++) {
                gmax = fmax(gmax, fabs(a.g[u][k][i]));
                err = fmax(err, fabs(a.g[u][k][i] - b.g[u][k][i]));
            }
            ck_assert_msg(err <= 5e-2 * gmax + 1e-7, "unit %d param %d: %g of %g", u, k, err, gmax);
        }
    gpt_free(ma);
    gpt_free(mb);
    free(tok);
    params_free(&a);
    params_free(&b);
}
END_TEST

/* The portable, AVX2 and AVX-512 kernels give the same bits, forward and backward. */
START_TEST(kernel_sets_agree)
{
    const int B = 2;
    gpt_config c = {.vocab = 64, .seq = 19, .width = 24, .layers = 1, .heads = 3};
    params a, b;
    params_init(&a, &c, 8, 1.0f); /* wide values: GELU's and exp's whole range */
    uint8_t *tok = tokens(&c, B, 12);
    gpt *ma, *mb;
    ck_assert_int_eq(gpt_create(&c, B, &ma), 0);
    ck_assert_int_eq(gpt_create(&c, B, &mb), 0);
    ck_assert_int_eq(gpt_use_kernel_set(ma, "portable"), 0);
    ck_assert_int_eq(gpt_use_kernel_set(mb, "nonesuch"), -ENOTSUP);
    gpt_hooks ha = hooks_of(&a);
    ck_assert_int_eq(gpt_forward(ma, &ha, tok, B, c.seq, c.seq + 1, 1, NULL), 0);
    size_t nz = sizeof(float) * B * c.seq * c.vocab; /* backward overwrites the logits */
    float *z = malloc(nz);
    memcpy(z, gpt_logits(ma), nz);
    ck_assert_int_eq(gpt_backward(ma, &ha, 1.0f), 0);
    const char *sets[] = {"avx2", "avx512"};
    for (int s = 0; s < 2; s++) {
        if (gpt_use_kernel_set(mb, sets[s]) < 0) {
            printf("kernel sets: no %s here\n", sets[s]);
            continue;
        }
        ck_assert_str_eq(gpt_kernel_set(mb), sets[s]);
        params_init(&b, &c, 8, 1.0f);
        gpt_hooks hb = hooks_of(&b);
        ck_assert_int_eq(gpt_forward(mb, &hb, tok, B, c.seq, c.seq + 1, 1, NULL), 0);
        ck_assert_mem_eq(z, gpt_logits(mb), nz);
        ck_assert_int_eq(gpt_backward(mb, &hb, 1.0f), 0);
        for (int u = 0; u < a.nu; u++)
            for (int k = 0; k < a.np[u]; k++)
                ck_assert_mem_eq(a.g[u][k], b.g[u][k], a.count[u][k] * sizeof(float));
        params_free(&b);
        printf("kernel sets: portable and %s agree bit for bit\n", sets[s]);
    }
    gpt_free(ma);
    gpt_free(mb);
    free(z);
    free(tok);
    params_free(&a);
}
END_TEST

/* Recomputation gives the same bits with one block's activations. */
START_TEST(recompute_same_bits)
{
    const int B = 2;
    gpt_config c = {.vocab = 64, .seq = 12, .width = 16, .layers = 3, .heads = 2};
    params a, b;
    params_init(&a, &c, 9, 0.3f);
    params_init(&b, &c, 9, 0.3f);
    uint8_t *tok = tokens(&c, B, 13);
    gpt *ma, *mb;
    ck_assert_int_eq(gpt_create(&c, B, &ma), 0);
    c.recompute = 1;
    ck_assert_int_eq(gpt_create(&c, B, &mb), 0);
    printf("recompute: activations %zu bytes against %zu\n", gpt_activation_bytes(mb),
           gpt_activation_bytes(ma));
    ck_assert_uint_lt(gpt_activation_bytes(mb), gpt_activation_bytes(ma));
    gpt_hooks ha = hooks_of(&a), hb = hooks_of(&b);
    gpt_stats sa, sb;
    ck_assert_int_eq(gpt_forward(ma, &ha, tok, B, c.seq, c.seq + 1, 1, &sa), 0);
    ck_assert_int_eq(gpt_forward(mb, &hb, tok, B, c.seq, c.seq + 1, 1, &sb), 0);
    ck_assert(sa.loss_sum == sb.loss_sum);
    ck_assert_int_eq(gpt_backward(ma, &ha, 1.0f), 0);
    ck_assert_int_eq(gpt_backward(mb, &hb, 1.0f), 0);
    for (int u = 0; u < a.nu; u++)
        for (int k = 0; k < a.np[u]; k++)
            ck_assert_mem_eq(a.g[u][k], b.g[u][k], a.count[u][k] * sizeof(float));
    gpt_free(ma);
    gpt_free(mb);
    free(tok);
    params_free(&a);
    params_free(&b);
}
END_TEST

START_TEST(init_statistics)
{
    gpt_config c = {.vocab = 256, .seq = 64, .width = 64, .layers = 4, .heads = 4};
    ck_assert_int_eq(gpt_config_check(&c), 0);
    ck_assert_uint_eq(gpt_num_params(&c), (256 + 64) * 64 + 4 * (12 * 64 * 64 + 13 * 64) + 128);
    params ps;
    params_init(&ps, &c, 1, 0.0f);
    double s = 0, ss = 0;
    size_t n = ps.count[0][0];
    for (size_t i = 0; i < n; i++) {
        s += ps.p[0][0][i];
        ss += (double)ps.p[0][0][i] * ps.p[0][0][i];
    }
    ck_assert(fabs(s / n) < 1e-3 && fabs(sqrt(ss / n) - 0.02) < 1e-3);
    ss = 0;
    n = ps.count[1][10]; /* mlp.c_proj.weight: 0.02 / sqrt(2 L) */
    for (size_t i = 0; i < n; i++)
        ss += (double)ps.p[1][10][i] * ps.p[1][10][i];
    ck_assert(fabs(sqrt(ss / n) - 0.02 / sqrt(8.0)) < 3e-4);
    ck_assert(ps.p[1][0][0] == 1.0f && ps.p[1][1][0] == 0.0f && ps.p[1][3][0] == 0.0f);
    ck_assert(ps.p[5][0][3] == 1.0f && ps.p[5][1][3] == 0.0f);
    c.width = 30; /* not a multiple of the heads */
    ck_assert_int_eq(gpt_config_check(&c), -EINVAL);
    params_free(&ps);
}
END_TEST

START_TEST(sample)
{
    float z[4] = {0.0f, 2.0f, 1.0f, 2.0f};
    ck_assert_int_eq(gpt_sample(z, 4, 0.0f, 0.5f), 1); /* argmax, the first */
    ck_assert_int_eq(gpt_sample(z, 4, 1.0f, 0.0f), 0);
    ck_assert_int_eq(gpt_sample(z, 4, 1.0f, 0.9999f), 3);
    /* p = softmax(z): 0.0557, 0.4115, 0.1514, 0.4115 */
    ck_assert_int_eq(gpt_sample(z, 4, 1.0f, 0.30f), 1);
    ck_assert_int_eq(gpt_sample(z, 4, 1.0f, 0.50f), 2);
    ck_assert_int_eq(gpt_sample(z, 4, 1.0f, 0.70f), 3);
}
END_TEST

static Suite *gpt_suite(void)
{
    Suite *s = suite_create("gpt");
    check_tcase(s, "backward", 120, backward_finite_differences, hooks_and_accumulation,
                bf16_against_f32, recompute_same_bits);
    check_tcase(s, "forward", 20, causal, kernel_sets_agree, init_statistics, sample);
    return s;
}

int main(void)
{
    return check_run(gpt_suite());
}
