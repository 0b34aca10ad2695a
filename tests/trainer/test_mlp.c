/*
 * Unit tests of ddp-train's MLP (worker/trainer/mlp.c): backward against finite differences, a forward
 * computed by hand, gradient accumulation, the hooks' order, the initialisation's bounds, and the
 * bf16 mode against f32.
 *
 * Finite differences, "double-checked float": the model under test runs in float on OpenBLAS.
 * The test carries its own scalar forward in double (no BLAS) over the same parameter values,
 * checks that it reproduces the float loss, and differentiates it by central differences with
 * h = 1e-6, for every parameter of the model. In double the difference quotient is accurate to
 * about h^2 |L'''| + eps_64 |L| / h, below 1e-9 of the largest gradient here, so what the
 * comparison measures is the float backward's own rounding: float's unit roundoff (6e-8)
 * times small factors from sums of up to 784 products, whose order depends on the BLAS kernel
 * the machine gets. The test asserts
 *     max |g_float - g_fd| <= 1e-6 * max |g_fd|
 * and prints the maximum error: observed 6e-8 and 5e-8 of the largest gradient (on AVX-512
 * OpenBLAS kernels), a margin of about 17 for other kernels' summation orders, while a wrong
 * term of the backward shows up at 1e-2 or more. ReLU is not differentiable at 0: the test
 * asserts that no hidden pre-activation lies within 1e-3 of 0 for its inputs, so that no +-h
 * step crosses a kink.
 */
#include <check.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "mlp.h"
#include "rng.h"
#include "check_main.h"

/* ------------------------------------------------------------------------------------------ */
/* A model's parameters in plain arrays, handed over by the hooks                             */
/* ------------------------------------------------------------------------------------------ */

typedef struct params {
    mlp_config cfg;
    int L;
    float *W[8], *b[8], *dW[8], *db[8];
    char order[64]; /* the hook calls, as "f0 F0 f1 F1 ... b1 B1 ..." (begin lower case) */
    size_t olen;
} params;

static void params_init(params *p, const mlp_config *c, uint64_t seed)
{
    memset(p, 0, sizeof *p);
    p->cfg = *c;
    p->L = mlp_num_linear(c);
    ck_assert_int_le(p->L, 8);
    for (int l = 0; l < p->L; l++) {
        int in = mlp_layer_in(c, l), out = mlp_layer_out(c, l);
        p->W[l] = calloc((size_t)out * in, sizeof(float));
        p->b[l] = calloc((size_t)out, sizeof(float));
        p->dW[l] = calloc((size_t)out * in, sizeof(float));
        p->db[l] = calloc((size_t)out, sizeof(float));
        ck_assert(p->W[l] && p->b[l] && p->dW[l] && p->db[l]);
        mlp_init_uniform(p->W[l], (size_t)out * in, in, seed, 2 * l);
        mlp_init_uniform(p->b[l], (size_t)out, in, seed, 2 * l + 1);
    }
}

static void params_free(params *p)
{
    for (int l = 0; l < p->L; l++) {
        free(p->W[l]);
        free(p->b[l]);
        free(p->dW[l]);
        free(p->db[l]);
    }
}

static void params_zero_grad(params *p)
{
    for (int l = 0; l < p->L; l++) {
        int in = mlp_layer_in(&p->cfg, l), out = mlp_layer_out(&p->cfg, l);
        memset(p->dW[l], 0, (size_t)out * in * sizeof(float));
        memset(p->db[l], 0, (size_t)out * sizeof(float));
    }
}

static void note(params *p, char c, int l)
{
    if (p->olen + 4 < sizeof p->order)
        p->olen += (size_t)snprintf(p->order + p->olen, sizeof p->order - p->olen, "%s%c%d",
                                    p->olen ? " " : "", c, l);
}

static int hook_begin(void *arg, int l, int backward, mlp_layer *io)
{
    params *p = arg;
    note(p, backward ? 'b' : 'f', l);
    io->W = p->W[l];
    io->b = p->b[l];
    io->dW = backward ? p->dW[l] : NULL;
    io->db = backward ? p->db[l] : NULL;
    return 0;
}

static int hook_end(void *arg, int l, int backward)
{
    note(arg, backward ? 'B' : 'F', l);
    return 0;
}

static mlp_hooks hooks_of(params *p)
{
    return (mlp_hooks){.begin = hook_begin, .end = hook_end, .arg = p};
}

/* ------------------------------------------------------------------------------------------ */
/* The double-precision reference                                                             */
/* ------------------------------------------------------------------------------------------ */

/*
 * loss_scale * sum of cross-entropies of the model whose parameters are Wd, bd (double copies),
 * by scalar loops. *min_pre, when given, receives the smallest |pre-activation| of the hidden
 * layers (the distance to ReLU's kink).
 */
static double ref_loss(const mlp_config *c, double **Wd, double **bd, const float *x,
                       const uint8_t *y, int B, double loss_scale, double *min_pre)
{
    int L = mlp_num_linear(c);
    int width = c->hidden > c->in_dim ? c->hidden : c->in_dim;
    if (c->classes > width)
        width = c->classes;
    double *a = malloc(sizeof(double) * width), *z = malloc(sizeof(double) * width);
    double total = 0, mp = INFINITY;
    for (int i = 0; i < B; i++) {
        for (int k = 0; k < c->in_dim; k++)
            a[k] = x[(size_t)i * c->in_dim + k];
        for (int l = 0; l < L; l++) {
            int in = mlp_layer_in(c, l), out = mlp_layer_out(c, l);
            for (int o = 0; o < out; o++) {
                double s = bd[l][o];
                for (int k = 0; k < in; k++)
                    s += Wd[l][(size_t)o * in + k] * a[k];
                z[o] = s;
            }
            for (int o = 0; o < out; o++) {
                if (l < L - 1) {
                    mp = fmin(mp, fabs(z[o]));
                    a[o] = z[o] > 0 ? z[o] : 0;
                } else {
                    a[o] = z[o];
                }
            }
        }
        double max = a[0];
        for (int j = 1; j < c->classes; j++)
            max = fmax(max, a[j]);
        double sum = 0;
        for (int j = 0; j < c->classes; j++)
            sum += exp(a[j] - max);
        total += log(sum) - (a[y[i]] - max);
    }
    free(a);
    free(z);
    if (min_pre)
        *min_pre = mp;
    return loss_scale * total;
}

/*
 * Checks mlp_backward against central differences of ref_loss over every parameter, for config
 * c, B random inputs (seeded), loss_scale; returns the max abs error and the max |gradient|.
 */
static void check_fd(const mlp_config *c, int B, float loss_scale, uint64_t seed, double *max_err,
                     double *max_grad)
{
    params p;
    params_init(&p, c, seed);
    int L = p.L;
    rng r;
    rng_init(&r, seed, 1000);
    float *x = malloc(sizeof(float) * (size_t)B * c->in_dim);
    uint8_t *y = malloc((size_t)B);
    for (int i = 0; i < B * c->in_dim; i++)
        x[i] = 2.0f * rng_float(&r) - 1.0f;
    for (int i = 0; i < B; i++)
        y[i] = (uint8_t)rng_below(&r, (uint32_t)c->classes);

    mlp *m;
    ck_assert_int_eq(mlp_create(c, B, &m), 0);
    mlp_hooks h = hooks_of(&p);
    mlp_stats st;
    ck_assert_int_eq(mlp_forward(m, &h, x, y, B, &st), 0);
    ck_assert_int_eq(mlp_backward(m, &h, loss_scale), 0);

    double *Wd[8], *bd[8];
    for (int l = 0; l < L; l++) {
        size_t nW = (size_t)mlp_layer_out(c, l) * mlp_layer_in(c, l), nb = mlp_layer_out(c, l);
        Wd[l] = malloc(sizeof(double) * nW);
        bd[l] = malloc(sizeof(double) * nb);
        for (size_t i = 0; i < nW; i++)
            Wd[l][i] = p.W[l][i];
        for (size_t i = 0; i < nb; i++)
            bd[l][i] = p.b[l][i];
    }

    /* The reference reproduces the float forward, and no input sits near a ReLU kink. */
    double min_pre;
    double ref = ref_loss(c, Wd, bd, x, y, B, loss_scale, &min_pre);
    double got = st.loss_sum * loss_scale;
    ck_assert_msg(fabs(ref - got) <= 1e-5 * fabs(ref), "float loss %.9g, double %.9g", got, ref);
    ck_assert_msg(min_pre > 1e-3, "a pre-activation lies %.3g from ReLU's kink", min_pre);

    const double h_step = 1e-6;
    double err = 0, gmax = 0;
    for (int l = 0; l < L; l++) {
        size_t nW = (size_t)mlp_layer_out(c, l) * mlp_layer_in(c, l), nb = mlp_layer_out(c, l);
        for (int which = 0; which < 2; which++) {
            double *v = which ? bd[l] : Wd[l];
            const float *g = which ? p.db[l] : p.dW[l];
            size_t n = which ? nb : nW;
            for (size_t i = 0; i < n; i++) {
                double keep = v[i];
                v[i] = keep + h_step;
                double lp = ref_loss(c, Wd, bd, x, y, B, loss_scale, NULL);
                v[i] = keep - h_step;
                double lm = ref_loss(c, Wd, bd, x, y, B, loss_scale, NULL);
                v[i] = keep;
                double fd = (lp - lm) / (2 * h_step);
                err = fmax(err, fabs(fd - g[i]));
                gmax = fmax(gmax, fabs(fd));
            }
        }
    }
    for (int l = 0; l < L; l++) {
        free(Wd[l]);
        free(bd[l]);
    }
    mlp_free(m);
    params_free(&p);
    free(x);
    free(y);
    *max_err = err;
    *max_grad = gmax;
}

/* ------------------------------------------------------------------------------------------ */
/* Tests                                                                                       */
/* ------------------------------------------------------------------------------------------ */

START_TEST(backward_finite_differences_small)
{
    /* A reduced input (mlp takes any in_dim), three hidden layers, loss_scale a global batch's. */
    mlp_config c = {.in_dim = 20, .hidden = 12, .layers = 3, .classes = 10};
    double err, gmax;
    check_fd(&c, 5, 1.0f / 256, 7, &err, &gmax);
    printf("finite differences 20-12-12-12-10, B=5: max |g - g_fd| = %.3g, max |g_fd| = %.3g, "
           "ratio %.3g\n",
           err, gmax, err / gmax);
    ck_assert_double_gt(gmax, 0);
    ck_assert_msg(err <= 1e-6 * gmax, "max error %.3g > 1e-6 * %.3g", err, gmax);
}
END_TEST

START_TEST(backward_finite_differences_784)
{
    /* ddp-train's input width: 784 -> 16 -> 16 -> 10, three inputs, every parameter. */
    mlp_config c = {.in_dim = 784, .hidden = 16, .layers = 2, .classes = 10};
    double err, gmax;
    check_fd(&c, 3, 1.0f / 3, 11, &err, &gmax);
    printf("finite differences 784-16-16-10, B=3: max |g - g_fd| = %.3g, max |g_fd| = %.3g, "
           "ratio %.3g\n",
           err, gmax, err / gmax);
    ck_assert_double_gt(gmax, 0);
    ck_assert_msg(err <= 1e-6 * gmax, "max error %.3g > 1e-6 * %.3g", err, gmax);
}
END_TEST

/*
 * 2 -> 2 -> 2 by hand. W0 = [[1, 0], [0, -1]], b0 = 0, W1 = I, b1 = [0, 0.5].
 *   x = ( 1,  2): z0 = ( 1, -2), relu ( 1, 0), logits (1, 0.5), argmax 0, label 0:
 *                 loss log(1 + e^-0.5) = 0.474077
 *   x = (-1, -1): z0 = (-1,  1), relu ( 0, 1), logits (0, 1.5), argmax 1, label 1:
 *                 loss log(1 + e^-1.5) = 0.201413
 *   x = ( 1,  2) again with label 1: loss log(1 + e^0.5) = 0.974077, wrong.
 */
START_TEST(forward_by_hand)
{
    mlp_config c = {.in_dim = 2, .hidden = 2, .layers = 1, .classes = 2};
    params p;
    params_init(&p, &c, 1);
    memcpy(p.W[0], (float[]){1, 0, 0, -1}, 4 * sizeof(float));
    memcpy(p.b[0], (float[]){0, 0}, 2 * sizeof(float));
    memcpy(p.W[1], (float[]){1, 0, 0, 1}, 4 * sizeof(float));
    memcpy(p.b[1], (float[]){0, 0.5f}, 2 * sizeof(float));
    float x[] = {1, 2, -1, -1, 1, 2};
    uint8_t y[] = {0, 1, 1};
    mlp *m;
    ck_assert_int_eq(mlp_create(&c, 3, &m), 0);
    mlp_hooks h = hooks_of(&p);
    mlp_stats st;
    ck_assert_int_eq(mlp_forward(m, &h, x, y, 3, &st), 0);
    double expect = log1p(exp(-0.5)) + log1p(exp(-1.5)) + log1p(exp(0.5));
    ck_assert_double_eq_tol(st.loss_sum, expect, 1e-6);
    ck_assert_int_eq(st.correct, 2);
    const float *prob = mlp_output(m); /* (3, 2) */
    ck_assert_double_eq_tol(prob[0], 1 / (1 + exp(-0.5)), 1e-6);
    ck_assert_double_eq_tol(prob[3], 1 / (1 + exp(-1.5)), 1e-6);

    /* Without labels: logits, no loss, no backward. */
    ck_assert_int_eq(mlp_forward(m, &h, x, NULL, 3, &st), 0);
    ck_assert_double_eq(st.loss_sum, 0);
    ck_assert_double_eq_tol(mlp_output(m)[1], 0.5, 1e-7);
    ck_assert_int_eq(mlp_backward(m, &h, 1.0f), -EINVAL);

    /* Zero weights: every logit 0, loss log(C) per row, argmax the first class. */
    mlp_config c10 = {.in_dim = 4, .hidden = 3, .layers = 2, .classes = 10};
    params z;
    params_init(&z, &c10, 1);
    for (int l = 0; l < z.L; l++) {
        memset(z.W[l], 0, sizeof(float) * mlp_layer_in(&c10, l) * mlp_layer_out(&c10, l));
        memset(z.b[l], 0, sizeof(float) * mlp_layer_out(&c10, l));
    }
    mlp *m10;
    ck_assert_int_eq(mlp_create(&c10, 4, &m10), 0);
    float x10[16] = {0.5f, -1, 2, 3};
    uint8_t y10[] = {0, 3, 0, 9};
    mlp_hooks h10 = hooks_of(&z);
    ck_assert_int_eq(mlp_forward(m10, &h10, x10, y10, 4, &st), 0);
    ck_assert_double_eq_tol(st.loss_sum, 4 * log(10.0), 1e-5);
    ck_assert_int_eq(st.correct, 2);

    /* Bad arguments. */
    uint8_t bad[] = {0, 10, 0, 0};
    ck_assert_int_eq(mlp_forward(m10, &h10, x10, bad, 4, &st), -EINVAL);
    ck_assert_int_eq(mlp_forward(m10, &h10, x10, y10, 5, &st), -EINVAL);
    ck_assert_int_eq(mlp_backward(m10, &h10, 1.0f), -EINVAL); /* the failed forward */
    mlp *none;
    ck_assert_int_eq(
        mlp_create(&(mlp_config){.in_dim = 4, .hidden = 3, .layers = 0, .classes = 10}, 4, &none),
        -EINVAL);
    mlp_free(NULL);

    mlp_free(m10);
    params_free(&z);
    mlp_free(m);
    params_free(&p);
}
END_TEST

/*
 * Backward adds: two backward passes leave twice the gradient; halving loss_scale halves it;
 * the gradient of B rows in one pass equals the sum of per-row passes (micro-batches), which
 * is what gradient accumulation relies on. The hooks run in layer order forward and in reverse
 * order backward, each begin followed by its end; B = 0 still runs them.
 */
START_TEST(accumulation_and_hooks)
{
    mlp_config c = {.in_dim = 6, .hidden = 5, .layers = 2, .classes = 3};
    params p;
    params_init(&p, &c, 3);
    float x[4 * 6];
    uint8_t y[4] = {0, 1, 2, 1};
    rng r;
    rng_init(&r, 5, 0);
    for (int i = 0; i < 24; i++)
        x[i] = rng_float(&r) - 0.5f;
    mlp *m;
    ck_assert_int_eq(mlp_create(&c, 4, &m), 0);
    mlp_hooks h = hooks_of(&p);

    ck_assert_int_eq(mlp_forward(m, &h, x, y, 4, NULL), 0);
    ck_assert_str_eq(p.order, "f0 F0 f1 F1 f2 F2");
    p.olen = 0;
    p.order[0] = 0;
    ck_assert_int_eq(mlp_backward(m, &h, 0.25f), 0);
    ck_assert_str_eq(p.order, "b2 B2 b1 B1 b0 B0");

    /* Reference: the full batch once, scale 1/4. */
    size_t n0 = 5 * 6;
    float *ref = malloc(sizeof(float) * n0);
    memcpy(ref, p.dW[0], sizeof(float) * n0);
    float refb = p.db[2][1];

    /* Twice: doubled. */
    ck_assert_int_eq(mlp_backward(m, &h, 0.25f), 0);
    for (size_t i = 0; i < n0; i++)
        ck_assert_float_eq_tol(p.dW[0][i], 2 * ref[i], 1e-6f + 1e-5f * fabsf(ref[i]));

    /* Row by row, each with scale 1/4, accumulated: the same as the batch. */
    params_zero_grad(&p);
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(mlp_forward(m, &h, x + 6 * i, y + i, 1, NULL), 0);
        ck_assert_int_eq(mlp_backward(m, &h, 0.25f), 0);
    }
    for (size_t i = 0; i < n0; i++)
        ck_assert_float_eq_tol(p.dW[0][i], ref[i], 1e-6f + 1e-5f * fabsf(ref[i]));
    ck_assert_float_eq_tol(p.db[2][1], refb, 1e-6f + 1e-5f * fabsf(refb));

    /* B = 0: the hooks run (ZeRO-3 gathers are collective), nothing changes. */
    memcpy(ref, p.dW[0], sizeof(float) * n0);
    p.olen = 0;
    p.order[0] = 0;
    mlp_stats st;
    ck_assert_int_eq(mlp_forward(m, &h, NULL, y, 0, &st), 0);
    ck_assert_int_eq(mlp_backward(m, &h, 0.25f), 0);
    ck_assert_str_eq(p.order, "f0 F0 f1 F1 f2 F2 b2 B2 b1 B1 b0 B0");
    ck_assert_double_eq(st.loss_sum, 0);
    ck_assert_int_eq(memcmp(ref, p.dW[0], sizeof(float) * n0), 0);

    free(ref);
    mlp_free(m);
    params_free(&p);
}
END_TEST

/* bf16 hooks: the same parameters rounded to bf16, in W16/b16 (W and b NULL). */
typedef struct params16 {
    params *p;
    uint16_t *W[8], *b[8];
} params16;

static int hook_begin16(void *arg, int l, int backward, mlp_layer *io)
{
    params16 *q = arg;
    io->W16 = q->W[l];
    io->b16 = q->b[l];
    io->dW = backward ? q->p->dW[l] : NULL;
    io->db = backward ? q->p->db[l] : NULL;
    return 0;
}

/*
 * Mixed precision on the host (mlp.h): a bf16 model reads W16/b16 only and, against an f32
 * model on the same (rounded) parameters and inputs, differs only by the rounding of its
 * activations and activation gradients to bf16 (relative 2^-9 each): the loss within 1e-2
 * relative, every gradient within 3e-2 of the largest. Its probabilities sum to 1 in f32. A
 * missing W16 fails the pass with -EINVAL.
 */
START_TEST(bf16_against_f32)
{
    mlp_config c = {.in_dim = 784, .hidden = 64, .layers = 2, .classes = 10};
    mlp_config c16 = c;
    c16.bf16 = 1;
    enum { B = 32 };
    params p, p16;
    params_init(&p, &c, 11);
    params_init(&p16, &c, 11);
    params16 q = {.p = &p16};
    for (int l = 0; l < p.L; l++) {
        size_t nW = (size_t)mlp_layer_out(&c, l) * mlp_layer_in(&c, l), nb = mlp_layer_out(&c, l);
        q.W[l] = malloc(nW * sizeof(uint16_t));
        q.b[l] = malloc(nb * sizeof(uint16_t));
        for (size_t i = 0; i < nW; i++) {
            q.W[l][i] = bf16_from_f32(p.W[l][i]);
            p.W[l][i] = bf16_to_f32(q.W[l][i]);
        }
        for (size_t i = 0; i < nb; i++) {
            q.b[l][i] = bf16_from_f32(p.b[l][i]);
            p.b[l][i] = bf16_to_f32(q.b[l][i]);
        }
    }
    rng r;
    rng_init(&r, 12, 0);
    float *x = malloc(sizeof(float) * B * 784), *xq = malloc(sizeof(float) * B * 784);
    uint8_t y[B];
    for (int i = 0; i < B * 784; i++) {
        x[i] = 4.0f * rng_float(&r) - 1.0f;
        xq[i] = bf16_quantize(x[i]);
    }
    for (int i = 0; i < B; i++)
        y[i] = (uint8_t)rng_below(&r, 10);

    mlp *m, *m16;
    ck_assert_int_eq(mlp_create(&c, B, &m), 0);
    ck_assert_int_eq(mlp_create(&c16, B, &m16), 0);
    mlp_hooks h = hooks_of(&p), h16 = {.begin = hook_begin16, .arg = &q};
    mlp_stats st, st16;
    ck_assert_int_eq(mlp_forward(m, &h, xq, y, B, &st), 0);
    ck_assert_int_eq(mlp_forward(m16, &h16, x, y, B, &st16), 0);
    printf("bf16 against f32: loss %.6f against %.6f\n", st16.loss_sum, st.loss_sum);
    ck_assert_double_le(fabs(st16.loss_sum - st.loss_sum), 1e-2 * st.loss_sum);
    for (int i = 0; i < B; i++) {
        double sum = 0;
        for (int j = 0; j < 10; j++)
            sum += mlp_output(m16)[i * 10 + j];
        ck_assert_double_eq_tol(sum, 1, 1e-5);
    }
    ck_assert_int_eq(mlp_backward(m, &h, 1.0f / B), 0);
    ck_assert_int_eq(mlp_backward(m16, &h16, 1.0f / B), 0);
    double err = 0, gmax = 0;
    for (int l = 0; l < p.L; l++) {
        size_t nW = (size_t)mlp_layer_out(&c, l) * mlp_layer_in(&c, l), nb = mlp_layer_out(&c, l);
        for (size_t i = 0; i < nW; i++) {
            err = fmax(err, fabs(p16.dW[l][i] - p.dW[l][i]));
            gmax = fmax(gmax, fabs(p.dW[l][i]));
        }
        for (size_t i = 0; i < nb; i++)
            err = fmax(err, fabs(p16.db[l][i] - p.db[l][i]));
    }
    printf("bf16 against f32: gradients differ by %.3g of the largest\n", err / gmax);
    ck_assert_double_gt(gmax, 0);
    ck_assert_double_le(err, 3e-2 * gmax);

    uint16_t *keep = q.W[1];
    q.W[1] = NULL;
    ck_assert_int_eq(mlp_forward(m16, &h16, x, y, B, NULL), -EINVAL);
    q.W[1] = keep;

    for (int l = 0; l < p.L; l++) {
        free(q.W[l]);
        free(q.b[l]);
    }
    free(x);
    free(xq);
    mlp_free(m);
    mlp_free(m16);
    params_free(&p);
    params_free(&p16);
}
END_TEST

static int failing_begin(void *arg, int l, int backward, mlp_layer *io)
{
    (void)backward;
    if (l == *(int *)arg)
        return -ECANCELED;
    static float zero[64];
    static float grad[64];
    io->W = io->b = zero;
    io->dW = io->db = grad;
    return 0;
}

START_TEST(hook_failure_stops_the_pass)
{
    mlp_config c = {.in_dim = 2, .hidden = 2, .layers = 2, .classes = 2};
    int fail_at = 1;
    mlp_hooks h = {.begin = failing_begin, .arg = &fail_at};
    mlp *m;
    ck_assert_int_eq(mlp_create(&c, 2, &m), 0);
    float x[4] = {0};
    uint8_t y[2] = {0, 1};
    ck_assert_int_eq(mlp_forward(m, &h, x, y, 2, NULL), -ECANCELED);
    ck_assert_int_eq(mlp_backward(m, &h, 1.0f), -EINVAL);
    fail_at = -1;
    ck_assert_int_eq(mlp_forward(m, &h, x, y, 2, NULL), 0);
    fail_at = 0;
    ck_assert_int_eq(mlp_backward(m, &h, 1.0f), -ECANCELED);
    mlp_free(m);
}
END_TEST

/*
 * torch.nn.Linear's bounds: every value within +-1/sqrt(fan_in), the extremes close to them,
 * mean near 0 and variance near bound^2 / 3; the same (seed, stream) gives the same values,
 * another stream or seed others.
 */
START_TEST(init_uniform)
{
    enum { N = 100000 };
    float *a = malloc(sizeof(float) * N), *b = malloc(sizeof(float) * N);
    int fan_in = 784;
    double bound = 1 / sqrt(784.0);
    mlp_init_uniform(a, N, fan_in, 42, 3);
    double lo = INFINITY, hi = -INFINITY, s = 0, s2 = 0;
    for (int i = 0; i < N; i++) {
        ck_assert(fabs(a[i]) <= bound);
        lo = fmin(lo, a[i]);
        hi = fmax(hi, a[i]);
        s += a[i];
        s2 += (double)a[i] * a[i];
    }
    ck_assert_double_lt(hi, bound);
    ck_assert_double_gt(hi, 0.999 * bound);
    ck_assert_double_lt(lo, -0.999 * bound);
    ck_assert_double_lt(fabs(s / N), 0.01 * bound);
    ck_assert_double_eq_tol(s2 / N, bound * bound / 3, 0.02 * bound * bound / 3);

    mlp_init_uniform(b, N, fan_in, 42, 3);
    ck_assert_int_eq(memcmp(a, b, sizeof(float) * N), 0);
    mlp_init_uniform(b, N, fan_in, 42, 4);
    ck_assert_int_ne(memcmp(a, b, sizeof(float) * N), 0);
    mlp_init_uniform(b, N, fan_in, 43, 3);
    ck_assert_int_ne(memcmp(a, b, sizeof(float) * N), 0);
    free(a);
    free(b);

    mlp_config c = {.in_dim = 784, .hidden = 256, .layers = 2, .classes = 10};
    ck_assert_uint_eq(mlp_num_params(&c), 784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10);
    ck_assert_int_eq(mlp_num_linear(&c), 3);
    ck_assert_int_eq(mlp_layer_in(&c, 2), 256);
    ck_assert_int_eq(mlp_layer_out(&c, 2), 10);
}
END_TEST

static Suite *mlp_suite(void)
{
    Suite *s = suite_create("mlp");
    check_tcase(s, "backward", 60, backward_finite_differences_small,
                backward_finite_differences_784, accumulation_and_hooks,
                hook_failure_stops_the_pass, bf16_against_f32);
    check_tcase(s, "forward", 10, forward_by_hand, init_uniform);
    return s;
}

int main(void)
{
    return check_run(mlp_suite());
}
