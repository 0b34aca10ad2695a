/*
 * The GPT of ddp-train (gpt.h): forward and backward as row-major OpenBLAS sgemm calls and
 * written kernels, in the llm.c manner. B sequences of N tokens (N = the pass's len <= T), BN
 * rows of C in the residual stream.
 *
 * What it does not do: hold parameters or gradients (the caller's, through gpt_hooks), choose
 * the BLAS thread count, or allocate outside gpt_create()/gpt_reserve().
 *
 * Invariants:
 *  - Layer l's activations are kept from forward to backward (with cfg.recompute, every layer's
 *    views are layer 0's: the block's backward computes them again from x[l]): its input x[l] (BN,
 * C), ln_1's output with its mean and 1/std per row, qkv (BN, 3C), the attention probabilities (B,
 * H, N, N; zero above the diagonal), the heads' output (BN, C), the residual after attention (BN,
 * C), ln_2's output, the MLP's hidden layer before and after GELU (BN, 4C). x[L] is the last
 * block's output, lnf ln_f's; logits (BN, V) become the probabilities and then, in backward, their
 * gradient, in place.
 *  - The gradient of the tied wte from the logits is kept in dwte (V, C) until the embedding's
 *    backward adds it with the lookup's into the caller's buffer.
 *  - Parameter gradients are accumulated (+=); nothing here zeroes the caller's buffers.
 *  - bf16 (gpt.h): the values listed there hold bf16 values once written; w holds the current
 *    unit's parameters widened.
 *  - The element-wise kernels with exponentials (GELU's tanh, attention's softmax) use
 *    exp_poly(), a polynomial the compiler vectorises (with -fno-trapping-math, which
 *    meson.build gives this library), not libm's scalar expf and tanhf (which took 40% of a
 *    pass); they exist as portable, AVX2 and AVX-512 sets giving the same bits (kernels()).
 */
#include "gpt.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "mlp_xent.h"
#include "rng.h"

#define LN_EPS 1e-5f

/* One block's activations, views into the arena. */
typedef struct gpt_layer {
    float *ln1, *ln1_mean, *ln1_rstd; /* (BN, C), (BN), (BN) */
    float *qkv;                       /* (BN, 3C) */
    float *att;                       /* (B, H, N, N) */
    float *atty;                      /* (BN, C) */
    float *xmid;                      /* (BN, C): x + attention */
    float *ln2, *ln2_mean, *ln2_rstd; /* (BN, C), (BN), (BN) */
    float *fch, *fcg;                 /* (BN, 4C): before and after GELU */
} gpt_layer;

typedef struct gpt_kernels gpt_kernels; /* below: the element-wise kernels */
static const gpt_kernels *kernels(void);

struct gpt {
    gpt_config cfg;
    int rows;         /* sequences the activations have room for */
    float *arena;     /* the activations */
    size_t arena_n;   /* floats in it */
    gpt_layer *layer; /* (L) */
    float **x;        /* x[0..L]: (BN, C) the residual stream entering block l; x[L] leaves */
    float *lnf, *lnf_mean, *lnf_rstd;
    float *logits;        /* (BN, V) */
    float *d1, *d2, *d3;  /* backward scratch: (BN, C) each */
    float *dqkv;          /* (BN, 3C) */
    float *dh;            /* (BN, 4C) */
    float *datt;          /* (N, N) one head's */
    float *dwte;          /* (V, C) the tied embedding's gradient from the logits */
    float *w;             /* bf16: one unit's parameters widened (the largest unit's size) */
    const gpt_kernels *k; /* the element-wise kernels for this CPU (kernels()) */
    /* the latest forward */
    int B, N, ld, targets; /* B -1: none */
    const uint8_t *tok;
};

/* ------------------------------------------------------------------------------------------ */
/* Shapes                                                                                      */
/* ------------------------------------------------------------------------------------------ */

int gpt_config_check(const gpt_config *c)
{
    if (!c || c->vocab < 2 || c->vocab > 256 || c->seq < 1 || c->width < 1 || c->layers < 1 ||
        c->heads < 1 || c->width % c->heads || (c->bf16 != 0 && c->bf16 != 1) ||
        (c->recompute != 0 && c->recompute != 1))
        return -EINVAL;
    return 0;
}

int gpt_num_units(const gpt_config *c)
{
    return c->layers + 2;
}

int gpt_unit(const gpt_config *c, int u, char name[32])
{
    if (u == 0) {
        snprintf(name, 32, "emb");
        return 2;
    }
    if (u == c->layers + 1) {
        snprintf(name, 32, "ln_f");
        return 2;
    }
    snprintf(name, 32, "h%d", u - 1);
    return GPT_BLOCK_PARAMS;
}

static const char *const block_names[GPT_BLOCK_PARAMS] = {
    "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};

/* Block parameter p's (rows, cols) in units of C (cols 0: a vector). */
static const int block_shape[GPT_BLOCK_PARAMS][2] = {
    {1, 0}, {1, 0}, {3, 1}, {3, 0}, {1, 1}, {1, 0}, {1, 0}, {1, 0}, {4, 1}, {4, 0}, {1, 4}, {1, 0}};

int gpt_param(const gpt_config *c, int u, int p, char name[32], int64_t shape[2])
{
    int C = c->width;
    if (u == 0) {
        snprintf(name, 32, "%s", p == 0 ? "wte" : "wpe");
        shape[0] = p == 0 ? c->vocab : c->seq;
        shape[1] = C;
        return 2;
    }
    if (u == c->layers + 1) {
        snprintf(name, 32, "%s", p == 0 ? "weight" : "bias");
        shape[0] = C;
        return 1;
    }
    snprintf(name, 32, "%s", block_names[p]);
    shape[0] = (int64_t)block_shape[p][0] * C;
    shape[1] = (int64_t)block_shape[p][1] * C;
    return block_shape[p][1] ? 2 : 1;
}

size_t gpt_num_params(const gpt_config *c)
{
    size_t C = (size_t)c->width;
    return ((size_t)c->vocab + (size_t)c->seq) * C + (size_t)c->layers * (12 * C * C + 13 * C) +
           2 * C;
}

/* N(0, 1) by Box-Muller from two uniforms. */
static float normal(rng *r)
{
    float u1 = rng_float(r), u2 = rng_float(r);
    return sqrtf(-2.0f * logf(1.0f - u1)) * cosf(6.2831853071795864f * u2);
}

void gpt_init_param(const gpt_config *c, int u, int p, uint64_t seed, uint64_t stream, float *data,
                    size_t count)
{
    float std = 0.02f, fill = 0.0f;
    int random = 1;
    if (u == c->layers + 1) { /* ln_f */
        random = 0;
        fill = p == 0 ? 1.0f : 0.0f;
    } else if (u > 0) {
        const char *n = block_names[p];
        random = strstr(n, ".weight") && strncmp(n, "ln_", 3);
        fill = !strcmp(n, "ln_1.weight") || !strcmp(n, "ln_2.weight") ? 1.0f : 0.0f;
        if (p == 4 || p == 10) /* the residual projections, GPT-2's scaling */
            std = 0.02f / sqrtf(2.0f * (float)c->layers);
    }
    rng r;
    rng_init(&r, seed, stream);
    for (size_t i = 0; i < count; i++)
        data[i] = random ? std * normal(&r) : fill;
}

/* ------------------------------------------------------------------------------------------ */
/* Life                                                                                        */
/* ------------------------------------------------------------------------------------------ */

/* Assigns the views of an arena for `rows` sequences (arena NULL: only counts). Returns its
 * floats. */
static size_t layout(gpt *m, float *arena, int rows)
{
    const gpt_config *c = &m->cfg;
    size_t BN = (size_t)rows * c->seq, C = (size_t)c->width, T = (size_t)c->seq;
    size_t H = (size_t)c->heads, V = (size_t)c->vocab, off = 0;
#define TAKE(p, n)                                                                                 \
    do {                                                                                           \
        if (arena)                                                                                 \
            (p) = arena + off;                                                                     \
        off += (n);                                                                                \
    } while (0)
    for (int l = 0; l < c->layers; l++) {
        gpt_layer *y = &m->layer[l];
        if (c->recompute && l > 0) { /* one block's room, shared */
            *y = m->layer[0];
            continue;
        }
        TAKE(y->ln1, BN * C);
        TAKE(y->ln1_mean, BN);
        TAKE(y->ln1_rstd, BN);
        TAKE(y->qkv, BN * 3 * C);
        TAKE(y->att, (size_t)rows * H * T * T);
        TAKE(y->atty, BN * C);
        TAKE(y->xmid, BN * C);
        TAKE(y->ln2, BN * C);
        TAKE(y->ln2_mean, BN);
        TAKE(y->ln2_rstd, BN);
        TAKE(y->fch, BN * 4 * C);
        TAKE(y->fcg, BN * 4 * C);
    }
    for (int l = 0; l <= c->layers; l++)
        TAKE(m->x[l], BN * C);
    TAKE(m->lnf, BN * C);
    TAKE(m->lnf_mean, BN);
    TAKE(m->lnf_rstd, BN);
    TAKE(m->logits, BN * V);
    TAKE(m->d1, BN * C);
    TAKE(m->d2, BN * C);
    TAKE(m->d3, BN * C);
    TAKE(m->dqkv, BN * 3 * C);
    TAKE(m->dh, BN * 4 * C);
#undef TAKE
    return off;
}

int gpt_reserve(gpt *m, int rows)
{
    if (rows <= m->rows)
        return 0;
    size_t n = layout(m, NULL, rows);
    float *a = malloc(n * sizeof(float));
    if (!a)
        return -ENOMEM;
    free(m->arena);
    m->arena = a;
    m->arena_n = n;
    m->rows = rows;
    layout(m, a, rows);
    m->B = -1; /* the activations are gone */
    return 0;
}

size_t gpt_activation_bytes(const gpt *m)
{
    return m->arena_n * sizeof(float);
}

void gpt_free(gpt *m)
{
    if (!m)
        return;
    free(m->arena);
    free(m->layer);
    free(m->x);
    free(m->datt);
    free(m->dwte);
    free(m->w);
    free(m);
}

int gpt_create(const gpt_config *cfg, int max_batch, gpt **out)
{
    if (gpt_config_check(cfg) < 0 || max_batch < 0 || !out)
        return -EINVAL;
    gpt *m = calloc(1, sizeof *m);
    if (!m)
        return -ENOMEM;
    m->cfg = *cfg;
    m->B = -1;
    m->k = kernels();
    size_t C = (size_t)cfg->width, T = (size_t)cfg->seq;
    size_t unit_max = 12 * C * C + 13 * C, emb = ((size_t)cfg->vocab + T) * C;
    m->layer = calloc((size_t)cfg->layers, sizeof *m->layer);
    m->x = calloc((size_t)cfg->layers + 1, sizeof *m->x);
    m->datt = malloc(T * T * sizeof(float));
    m->dwte = malloc((size_t)cfg->vocab * C * sizeof(float));
    if (cfg->bf16)
        m->w = malloc((unit_max > emb ? unit_max : emb) * sizeof(float));
    if (!m->layer || !m->x || !m->datt || !m->dwte || (cfg->bf16 && !m->w) ||
        gpt_reserve(m, max_batch > 0 ? max_batch : 1) < 0) {
        gpt_free(m);
        return -ENOMEM;
    }
    *out = m;
    return 0;
}

const float *gpt_logits(const gpt *m)
{
    return m->logits;
}

/* ------------------------------------------------------------------------------------------ */
/* Kernels                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* In place: a = bf16(a) when the model is bf16. a (n). */
static void round_if(const gpt *m, float *a, size_t n)
{
    if (m->cfg.bf16)
        bf16_quantize_n(a, n);
}

/* src rounded to bf16 into dst (returned), or src itself in f32. (n) */
static const float *rounded(const gpt *m, float *dst, const float *src, size_t n)
{
    if (!m->cfg.bf16)
        return src;
    memcpy(dst, src, n * sizeof(float));
    bf16_quantize_n(dst, n);
    return dst;
}

/* y (R, out) = x (R, in) W^T + b, W (out, in), b (out); x's rows ldx apart. */
static void linear_forward(float *restrict y, const float *restrict x, const float *restrict W,
                           const float *restrict b, int R, int in, int out)
{
    for (int i = 0; i < R; i++)
        memcpy(y + (size_t)i * out, b, (size_t)out * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, out, in, 1.0f, x, in, W, in, 1.0f, y,
                out);
}

/* dW (out, in) += dy^T x; db (out) += the rows of dy summed; dx (R, in) = dy W (beta: 0 or 1,
 * to add). dy (R, out), x (R, in). */
static void linear_backward(float *restrict dx, float beta, float *restrict dW, float *restrict db,
                            const float *restrict dy, const float *restrict x,
                            const float *restrict W, int R, int in, int out)
{
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, R, 1.0f, dy, out, x, in, 1.0f, dW,
                in);
    for (int i = 0; db && i < R; i++) {
        const float *row = dy + (size_t)i * out;
        for (int j = 0; j < out; j++)
            db[j] += row[j];
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, in, out, 1.0f, dy, out, W, in, beta,
                dx, in);
}

/* The sum of LayerNorm's GPT_LN_LANES partial sums (gpt.h), pairwise. */
static inline __attribute__((always_inline)) float lanes_total(float *a)
{
    _Static_assert(GPT_LN_LANES == 16, "lanes_total() adds 16 lanes");
    for (int k = 0; k < 8; k++)
        a[k] += a[k + 8];
    for (int k = 0; k < 4; k++)
        a[k] += a[k + 4];
    return ((a[0] + a[2]) + (a[1] + a[3]));
}

/* out (R, C) = LayerNorm(x (R, C)) * w + b, with each row's mean and 1/std kept. */
static inline __attribute__((always_inline)) void
layernorm_forward_body(float *restrict out, float *restrict mean, float *restrict rstd,
                       const float *restrict x, const float *restrict w, const float *restrict b,
                       int R, int C)
{
    for (int i = 0; i < R; i++) {
        const float *xi = x + (size_t)i * C;
        float *oi = out + (size_t)i * C;
        float a[GPT_LN_LANES] = {0}, v[GPT_LN_LANES] = {0};
        int j = 0;
        for (; j + GPT_LN_LANES <= C; j += GPT_LN_LANES)
            for (int k = 0; k < GPT_LN_LANES; k++)
                a[k] += xi[j + k];
        for (int k = 0; j + k < C; k++)
            a[k] += xi[j + k];
        float mu = lanes_total(a) / (float)C;
        for (j = 0; j + GPT_LN_LANES <= C; j += GPT_LN_LANES)
            for (int k = 0; k < GPT_LN_LANES; k++) {
                float d = xi[j + k] - mu;
                v[k] += d * d;
            }
        for (int k = 0; j + k < C; k++) {
            float d = xi[j + k] - mu;
            v[k] += d * d;
        }
        float var = lanes_total(v) / (float)C;
        float s = 1.0f / sqrtf(var + LN_EPS);
        for (int j = 0; j < C; j++)
            oi[j] = (xi[j] - mu) * s * w[j] + b[j];
        mean[i] = mu;
        rstd[i] = s;
    }
}

/* dx (R, C) += the gradient through LayerNorm of dout (R, C); dw, db (C) += theirs. */
static inline __attribute__((always_inline)) void
layernorm_backward_body(float *restrict dx, float *restrict dw, float *restrict db,
                        const float *restrict dout, const float *restrict x,
                        const float *restrict w, const float *restrict mean,
                        const float *restrict rstd, int R, int C)
{
    for (int i = 0; i < R; i++) {
        const float *di = dout + (size_t)i * C, *xi = x + (size_t)i * C;
        float *dxi = dx + (size_t)i * C;
        float mu = mean[i], s = rstd[i], am[GPT_LN_LANES] = {0}, ap[GPT_LN_LANES] = {0};
        int j = 0;
        for (; j + GPT_LN_LANES <= C; j += GPT_LN_LANES)
            for (int k = 0; k < GPT_LN_LANES; k++) {
                float xhat = (xi[j + k] - mu) * s, dn = w[j + k] * di[j + k];
                am[k] += dn;
                ap[k] += dn * xhat;
            }
        for (int k = 0; j + k < C; k++) {
            float xhat = (xi[j + k] - mu) * s, dn = w[j + k] * di[j + k];
            am[k] += dn;
            ap[k] += dn * xhat;
        }
        float dmean = lanes_total(am) / (float)C, dproj = lanes_total(ap) / (float)C;
        for (j = 0; j < C; j++) {
            float xhat = (xi[j] - mu) * s;
            db[j] += di[j];
            dw[j] += xhat * di[j];
            dxi[j] += s * (w[j] * di[j] - dmean - xhat * dproj);
        }
    }
}

#define GELU_S 0.7978845608028654f /* sqrt(2 / pi) */

/*
 * exp(x) for the element-wise kernels, in a form the compiler vectorises (no call, no branch):
 * Cephes' expf, x = n ln2 + r with |r| <= ln2 / 2 (n rounded by the 1.5 x 2^23 trick, ln2 in
 * two parts), a degree-6 polynomial for e^r, and 2^n put into the exponent bits. x is clamped
 * to [-87, 88], where 2^n stays a normal float: below, the result is ~1.6e-38 instead of
 * smaller (a softmax term or tanh's -1 that no float sum can tell from 0); above, ~1.7e38.
 * Within the range its error is at most 2 ulp of the true value (libm's expf: 1 ulp).
 */
static inline __attribute__((always_inline)) float exp_poly(float x)
{
    x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* tanh(u) = 1 - 2 / (exp(2u) + 1): exactly 1 and -1 where exp_poly() clamps. */
static inline __attribute__((always_inline)) float tanh_poly(float u)
{
    return 1.0f - 2.0f / (exp_poly(2.0f * u) + 1.0f);
}

/* out = GELU(x), the tanh approximation. (n) */
static inline __attribute__((always_inline)) void
gelu_forward_body(float *restrict out, const float *restrict x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        out[i] = 0.5f * v * (1.0f + tanh_poly(GELU_S * (v + 0.044715f * v * v * v)));
    }
}

/* d *= GELU'(x), in place. (n) */
static inline __attribute__((always_inline)) void
gelu_backward_body(float *restrict d, const float *restrict x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float v = x[i], t = tanh_poly(GELU_S * (v + 0.044715f * v * v * v));
        float g = 0.5f * (1.0f + t) +
                  0.5f * v * (1.0f - t * t) * GELU_S * (1.0f + 3.0f * 0.044715f * v * v);
        d[i] *= g;
    }
}

/* a = exp(a - max), in place. (n) */
static inline __attribute__((always_inline)) void exp_shift_body(float *a, int n, float max)
{
    for (int j = 0; j < n; j++)
        a[j] = exp_poly(a[j] - max);
}

/*
 * The element-wise kernels (and LayerNorm's, whose sums run in lanes), three times: as the build
 * compiles them (x86-64's SSE2: 4 floats at a time) and, on x86-64, for AVX2 (8 at a time) and
 * AVX-512F (16 at a time: GELU twice as fast as AVX2's), chosen once by
 * __builtin_cpu_supports(), never by -march. Nothing is contracted into FMA (-ffp-contract=off,
 * meson.build), so every set does the same IEEE operations on every element and gives the same
 * bits.
 */
struct gpt_kernels {
    void (*gelu_forward)(float *restrict out, const float *restrict x, size_t n);
    void (*gelu_backward)(float *restrict d, const float *restrict x, size_t n);
    void (*exp_shift)(float *a, int n, float max);
    void (*layernorm_forward)(float *restrict out, float *restrict mean, float *restrict rstd,
                              const float *restrict x, const float *restrict w,
                              const float *restrict b, int R, int C);
    void (*layernorm_backward)(float *restrict dx, float *restrict dw, float *restrict db,
                               const float *restrict dout, const float *restrict x,
                               const float *restrict w, const float *restrict mean,
                               const float *restrict rstd, int R, int C);
};

#define GPT_KERNELS(suffix, attr)                                                                  \
    attr static void gelu_forward_##suffix(float *restrict out, const float *restrict x, size_t n) \
    {                                                                                              \
        gelu_forward_body(out, x, n);                                                              \
    }                                                                                              \
    attr static void gelu_backward_##suffix(float *restrict d, const float *restrict x, size_t n)  \
    {                                                                                              \
        gelu_backward_body(d, x, n);                                                               \
    }                                                                                              \
    attr static void exp_shift_##suffix(float *a, int n, float max)                                \
    {                                                                                              \
        exp_shift_body(a, n, max);                                                                 \
    }                                                                                              \
    attr static void layernorm_forward_##suffix(                                                   \
        float *restrict out, float *restrict mean, float *restrict rstd, const float *restrict x,  \
        const float *restrict w, const float *restrict b, int R, int C)                            \
    {                                                                                              \
        layernorm_forward_body(out, mean, rstd, x, w, b, R, C);                                    \
    }                                                                                              \
    attr static void layernorm_backward_##suffix(                                                  \
        float *restrict dx, float *restrict dw, float *restrict db, const float *restrict dout,    \
        const float *restrict x, const float *restrict w, const float *restrict mean,              \
        const float *restrict rstd, int R, int C)                                                  \
    {                                                                                              \
        layernorm_backward_body(dx, dw, db, dout, x, w, mean, rstd, R, C);                         \
    }                                                                                              \
    static const gpt_kernels kernels_##suffix = {gelu_forward_##suffix, gelu_backward_##suffix,    \
                                                 exp_shift_##suffix, layernorm_forward_##suffix,   \
                                                 layernorm_backward_##suffix};

GPT_KERNELS(portable, )
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
GPT_KERNELS(avx2, __attribute__((target("avx2"))))
GPT_KERNELS(avx512, __attribute__((target("avx512f,prefer-vector-width=512"))))
#endif

/* The sets, best first: each with its name and whether this CPU runs it. */
static const struct {
    const char *name;
    const gpt_kernels *k;
} kernel_sets[] = {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    {"avx512", &kernels_avx512},
    {"avx2", &kernels_avx2},
#endif
    {"portable", &kernels_portable},
};

static int kernel_set_runs(int i)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (kernel_sets[i].k == &kernels_avx512)
        return __builtin_cpu_supports("avx512f");
    if (kernel_sets[i].k == &kernels_avx2)
        return __builtin_cpu_supports("avx2");
#endif
    (void)i;
    return 1;
}

const char *gpt_kernel_set(const gpt *m)
{
    for (size_t i = 0; i < sizeof kernel_sets / sizeof kernel_sets[0]; i++)
        if (kernel_sets[i].k == m->k)
            return kernel_sets[i].name;
    return "?";
}

int gpt_use_kernel_set(gpt *m, const char *name)
{
    for (size_t i = 0; i < sizeof kernel_sets / sizeof kernel_sets[0]; i++)
        if (!strcmp(name, kernel_sets[i].name) && kernel_set_runs((int)i)) {
            m->k = kernel_sets[i].k;
            return 0;
        }
    return -ENOTSUP;
}

/* The set for this CPU: the first it runs. */
static const gpt_kernels *kernels(void)
{
    size_t i = 0;
    while (!kernel_set_runs((int)i))
        i++;
    return kernel_sets[i].k;
}

/*
 * Causal self-attention of B sequences of N rows: qkv (BN, 3C) holds each row's q, k, v; head
 * h's are columns [h hs, (h+1) hs) of each. att (B, H, N, N) gets softmax(q k^T / sqrt(hs))
 * over the keys up to the query's position (zero after it), y (BN, C) the heads' att v side
 * by side.
 */
static void attention_forward(const gpt *m, float *restrict y, float *restrict att,
                              const float *restrict qkv, int B, int N)
{
    int C = m->cfg.width, H = m->cfg.heads, hs = C / H, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const float *q = qkv + (size_t)b * N * C3 + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
            float *a = att + ((size_t)b * H + h) * N * N; /* (N, N) */
            float *yh = y + (size_t)b * N * C + (size_t)h * hs;
            /* rows [r0, r1) against keys [0, r1) (gpt.h, GPT_ATT_BLOCK) */
            for (int r0 = 0; r0 < N; r0 += GPT_ATT_BLOCK) {
                int r1 = r0 + GPT_ATT_BLOCK < N ? r0 + GPT_ATT_BLOCK : N;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1, hs, scale,
                            q + (size_t)r0 * C3, C3, k, C3, 0.0f, a + (size_t)r0 * N, N);
            }
            for (int t = 0; t < N; t++) {
                float *row = a + (size_t)t * N, max = row[0], sum = 0.0f;
                for (int j = 1; j <= t; j++)
                    max = row[j] > max ? row[j] : max;
                m->k->exp_shift(row, t + 1, max);
                for (int j = 0; j <= t; j++)
                    sum += row[j];
                for (int j = 0; j <= t; j++)
                    row[j] /= sum;
                for (int j = t + 1; j < N; j++)
                    row[j] = 0.0f;
            }
            round_if(m, a, (size_t)N * N);
            for (int r0 = 0; r0 < N; r0 += GPT_ATT_BLOCK) {
                int r1 = r0 + GPT_ATT_BLOCK < N ? r0 + GPT_ATT_BLOCK : N;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, hs, r1, 1.0f,
                            a + (size_t)r0 * N, N, v, C3, 0.0f, yh + (size_t)r0 * C, C);
            }
        }
}

/* dqkv (BN, 3C) = the gradient of attention_forward()'s qkv given dy (BN, C). */
static void attention_backward(gpt *m, float *restrict dqkv, const float *restrict dy,
                               const float *restrict att, const float *restrict qkv, int B, int N)
{
    int C = m->cfg.width, H = m->cfg.heads, hs = C / H, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    float *da = m->datt; /* (N, N) */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            size_t o3 = (size_t)b * N * C3 + (size_t)h * hs;
            const float *q = qkv + o3, *k = q + C, *v = q + 2 * C;
            const float *a = att + ((size_t)b * H + h) * N * N;
            const float *dyh = dy + (size_t)b * N * C + (size_t)h * hs;
            float *dq = dqkv + o3, *dk = dq + C, *dv = dq + 2 * C;
            /* da = dy v^T (query rows [r0, r1), keys [0, r1)); dv = a^T dy (key rows [r0, r1),
               queries [r0, N)) */
            for (int r0 = 0; r0 < N; r0 += GPT_ATT_BLOCK) {
                int r1 = r0 + GPT_ATT_BLOCK < N ? r0 + GPT_ATT_BLOCK : N;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1, hs, 1.0f,
                            dyh + (size_t)r0 * C, C, v, C3, 0.0f, da + (size_t)r0 * N, N);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1 - r0, hs, N - r0, 1.0f,
                            a + (size_t)r0 * N + r0, N, dyh + (size_t)r0 * C, C, 0.0f,
                            dv + (size_t)r0 * C3, C3);
            }
            /* through the softmax: ds = a * (da - sum_j a da), scaled; zero above the diagonal */
            for (int t = 0; t < N; t++) {
                const float *ar = a + (size_t)t * N;
                float *dr = da + (size_t)t * N, dot = 0.0f;
                for (int j = 0; j <= t; j++)
                    dot += ar[j] * dr[j];
                for (int j = 0; j <= t; j++)
                    dr[j] = scale * ar[j] * (dr[j] - dot);
                for (int j = t + 1; j < N; j++)
                    dr[j] = 0.0f;
            }
            round_if(m, da, (size_t)N * N);
            /* dq = ds k (query rows [r0, r1), keys [0, r1)); dk = ds^T q (key rows [r0, r1),
               queries [r0, N)) */
            for (int r0 = 0; r0 < N; r0 += GPT_ATT_BLOCK) {
                int r1 = r0 + GPT_ATT_BLOCK < N ? r0 + GPT_ATT_BLOCK : N;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, hs, r1, 1.0f,
                            da + (size_t)r0 * N, N, k, C3, 0.0f, dq + (size_t)r0 * C3, C3);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1 - r0, hs, N - r0, 1.0f,
                            da + (size_t)r0 * N + r0, N, q + (size_t)r0 * C3, C3, 0.0f,
                            dk + (size_t)r0 * C3, C3);
            }
        }
}

int gpt_sample(const float *z, int V, float temperature, float u)
{
    int arg = 0;
    for (int j = 1; j < V; j++)
        if (z[j] > z[arg])
            arg = j;
    if (temperature <= 0.0f)
        return arg;
    double sum = 0.0;
    for (int j = 0; j < V; j++)
        sum += exp((double)(z[j] - z[arg]) / temperature);
    double target = (double)u * sum, acc = 0.0;
    for (int j = 0; j < V; j++) {
        acc += exp((double)(z[j] - z[arg]) / temperature);
        if (acc > target)
            return j;
    }
    return arg; /* rounding at the top end */
}

/* ------------------------------------------------------------------------------------------ */
/* Passes                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/*
 * Unit u's parameters as f32: the hook's, or in bf16 widened into m->w (consecutively). ps
 * (n) in, fs (n) out; NULL in gives NULL out (the pass then fails).
 */
static void unit_params(gpt *m, int u, void **ps, const float **fs)
{
    char name[32];
    int n = gpt_unit(&m->cfg, u, name);
    size_t off = 0;
    for (int p = 0; p < n; p++) {
        int64_t sh[2];
        int nd = gpt_param(&m->cfg, u, p, name, sh);
        size_t count = (size_t)sh[0] * (nd == 2 ? (size_t)sh[1] : 1);
        if (!m->cfg.bf16 || !ps[p]) {
            fs[p] = ps[p];
            continue;
        }
        bf16_widen_n(m->w + off, ps[p], count);
        fs[p] = m->w + off;
        off += count;
    }
}

/* begin(u), its parameters as f32 into fs; grads into gs when backward. */
static int take(gpt *m, const gpt_hooks *h, int u, int backward, const float **fs, float **gs)
{
    void *ps[GPT_BLOCK_PARAMS] = {0};
    float *g[GPT_BLOCK_PARAMS] = {0};
    int rc = h->begin(h->arg, u, backward, ps, g);
    if (rc < 0)
        return rc;
    unit_params(m, u, ps, fs);
    char name[32];
    int n = gpt_unit(&m->cfg, u, name);
    for (int p = 0; p < n; p++) {
        if (!fs[p] || (backward && !g[p]))
            return -EINVAL;
        if (gs)
            gs[p] = g[p];
    }
    return 0;
}

/*
 * Block l's forward over BN = B N rows from xin (BN, C) to xout (BN, C), its parameters f
 * (f32), keeping its activations in y.
 */
static void block_forward(gpt *m, gpt_layer *y, const float *const *f, const float *xin,
                          float *xout, int B, int N)
{
    int C = m->cfg.width, BN = B * N;
    size_t n = (size_t)BN * C;
    m->k->layernorm_forward(y->ln1, y->ln1_mean, y->ln1_rstd, xin, f[0], f[1], BN, C);
    round_if(m, y->ln1, n);
    linear_forward(y->qkv, y->ln1, f[2], f[3], BN, C, 3 * C);
    round_if(m, y->qkv, 3 * n);
    attention_forward(m, y->atty, y->att, y->qkv, B, N);
    round_if(m, y->atty, n);
    linear_forward(y->xmid, y->atty, f[4], f[5], BN, C, C);
    for (size_t i = 0; i < n; i++)
        y->xmid[i] += xin[i];
    m->k->layernorm_forward(y->ln2, y->ln2_mean, y->ln2_rstd, y->xmid, f[6], f[7], BN, C);
    round_if(m, y->ln2, n);
    linear_forward(y->fch, y->ln2, f[8], f[9], BN, C, 4 * C);
    m->k->gelu_forward(y->fcg, y->fch, 4 * n);
    round_if(m, y->fcg, 4 * n);
    linear_forward(xout, y->fcg, f[10], f[11], BN, 4 * C, C);
    for (size_t i = 0; i < n; i++)
        xout[i] += y->xmid[i];
}

/* The logits (BN, V) = lnf wte^T: unit 0 taken for its wte alone. */
static int logits_forward(gpt *m, const gpt_hooks *h, int BN)
{
    const float *f[2];
    int rc = take(m, h, 0, 0, f, NULL);
    if (rc < 0)
        return rc;
    if (BN > 0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BN, m->cfg.vocab, m->cfg.width, 1.0f,
                    m->lnf, m->cfg.width, f[0], m->cfg.width, 0.0f, m->logits, m->cfg.vocab);
    return h->end(h->arg, 0, 0);
}

int gpt_forward(gpt *m, const gpt_hooks *h, const uint8_t *tok, int B, int len, int ld, int targets,
                gpt_stats *stats)
{
    const gpt_config *c = &m->cfg;
    int C = c->width, L = c->layers, V = c->vocab, N = len;
    m->B = -1;
    if (B < 0 || B > m->rows || len < 1 || len > c->seq || (targets && ld < len + 1) ||
        (!targets && ld < len) || (B > 0 && !tok))
        return -EINVAL;
    for (int b = 0; V < 256 && b < B; b++) /* a byte beyond a small vocabulary */
        for (int t = 0; t < N + (targets ? 1 : 0); t++)
            if (tok[(size_t)b * ld + t] >= V)
                return -EINVAL;
    int BN = B * N, rc;
    const float *f[GPT_BLOCK_PARAMS];

    /* the embeddings: x0 = wte[tok] + wpe[pos] */
    if ((rc = take(m, h, 0, 0, f, NULL)) < 0)
        return rc;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < N; t++) {
            float *xo = m->x[0] + ((size_t)b * N + t) * C;
            const float *e = f[0] + (size_t)tok[(size_t)b * ld + t] * C, *p = f[1] + (size_t)t * C;
            for (int j = 0; j < C; j++)
                xo[j] = e[j] + p[j];
        }
    if ((rc = h->end(h->arg, 0, 0)) < 0)
        return rc;

    for (int l = 0; l < L; l++) {
        gpt_layer *y = &m->layer[l];
        if ((rc = take(m, h, 1 + l, 0, f, NULL)) < 0)
            return rc;
        if (BN > 0)
            block_forward(m, y, f, m->x[l], m->x[l + 1], B, N);
        if ((rc = h->end(h->arg, 1 + l, 0)) < 0)
            return rc;
    }

    if ((rc = take(m, h, L + 1, 0, f, NULL)) < 0)
        return rc;
    if (BN > 0) {
        m->k->layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, m->x[L], f[0], f[1], BN, C);
        round_if(m, m->lnf, (size_t)BN * C);
    }
    if ((rc = h->end(h->arg, L + 1, 0)) < 0)
        return rc;
    if ((rc = logits_forward(m, h, BN)) < 0)
        return rc;

    gpt_stats st = {0};
    for (int b = 0; targets && b < B; b++)
        for (int t = 0; t < N; t++) {
            int ok;
            st.loss_sum += mlp_xent_row(m->logits + ((size_t)b * N + t) * V, V,
                                        tok[(size_t)b * ld + t + 1], &ok);
            st.correct += ok;
        }
    st.tokens = targets ? (double)BN : 0;
    if (stats)
        *stats = st;
    m->B = B;
    m->N = N;
    m->ld = ld;
    m->targets = targets;
    m->tok = tok;
    return 0;
}

int gpt_backward(gpt *m, const gpt_hooks *h, float loss_scale)
{
    const gpt_config *c = &m->cfg;
    if (m->B < 0 || !m->targets)
        return -EINVAL;
    int B = m->B, N = m->N, C = c->width, L = c->layers, V = c->vocab, BN = B * N, rc;
    size_t n = (size_t)BN * C;
    const float *f[GPT_BLOCK_PARAMS];
    float *g[GPT_BLOCK_PARAMS];
    float *dx = m->d1; /* the residual stream's gradient */

    /* dlogits = loss_scale (p - onehot), in place; the logits' products with wte's parameters
       alone (wte's gradient waits in dwte for the embedding's backward) */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < N; t++) {
            float *row = m->logits + ((size_t)b * N + t) * V;
            row[m->tok[(size_t)b * m->ld + t + 1]] -= 1.0f;
            for (int j = 0; j < V; j++)
                row[j] *= loss_scale;
        }
    round_if(m, m->logits, (size_t)BN * V);
    if ((rc = take(m, h, 0, 0, f, NULL)) < 0)
        return rc;
    float *dlnf = m->d2;
    if (BN > 0) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, BN, 1.0f, m->logits, V, m->lnf,
                    C, 0.0f, m->dwte, C);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BN, C, V, 1.0f, m->logits, V, f[0],
                    C, 0.0f, dlnf, C);
    } else {
        memset(m->dwte, 0, (size_t)V * C * sizeof(float));
    }
    if ((rc = h->end(h->arg, 0, 0)) < 0)
        return rc;

    if ((rc = take(m, h, L + 1, 1, f, g)) < 0)
        return rc;
    if (BN > 0) {
        memset(dx, 0, n * sizeof(float));
        m->k->layernorm_backward(dx, g[0], g[1], dlnf, m->x[L], f[0], m->lnf_mean, m->lnf_rstd, BN,
                                 C);
    }
    if ((rc = h->end(h->arg, L + 1, 1)) < 0)
        return rc;

    for (int l = L - 1; l >= 0; l--) {
        gpt_layer *y = &m->layer[l];
        if ((rc = take(m, h, 1 + l, 1, f, g)) < 0)
            return rc;
        if (BN > 0 && c->recompute) /* the block's activations again, the same bits */
            block_forward(m, y, f, m->x[l], m->x[l + 1], B, N);
        if (BN > 0) {
            /* the MLP: dx is the gradient of x[l+1] = xmid + fc_proj(gelu(fc(ln_2(xmid)))) */
            const float *dxq = rounded(m, m->d3, dx, n);
            linear_backward(m->dh, 0.0f, g[10], g[11], dxq, y->fcg, f[10], BN, 4 * C, C);
            m->k->gelu_backward(m->dh, y->fch, 4 * n);
            round_if(m, m->dh, 4 * n);
            float *dln = m->d2; /* (BN, C) */
            linear_backward(dln, 0.0f, g[8], g[9], m->dh, y->ln2, f[8], BN, C, 4 * C);
            m->k->layernorm_backward(dx, g[6], g[7], dln, y->xmid, f[6], y->ln2_mean, y->ln2_rstd,
                                     BN, C); /* dx: now xmid's gradient */
            /* attention: xmid = x[l] + c_proj(attn(c_attn(ln_1(x[l])))) */
            dxq = rounded(m, m->d3, dx, n);
            float *datty = m->d2;
            linear_backward(datty, 0.0f, g[4], g[5], dxq, y->atty, f[4], BN, C, C);
            round_if(m, datty, n);
            attention_backward(m, m->dqkv, datty, y->att, y->qkv, B, N);
            round_if(m, m->dqkv, 3 * n);
            linear_backward(dln, 0.0f, g[2], g[3], m->dqkv, y->ln1, f[2], BN, C, 3 * C);
            m->k->layernorm_backward(dx, g[0], g[1], dln, m->x[l], f[0], y->ln1_mean, y->ln1_rstd,
                                     BN, C); /* dx: now x[l]'s gradient */
        }
        if ((rc = h->end(h->arg, 1 + l, 1)) < 0)
            return rc;
    }

    /* the embeddings, wte's last use: its gradient from the logits and from the lookup */
    if ((rc = take(m, h, 0, 1, f, g)) < 0)
        return rc;
    size_t nw = (size_t)V * C;
    for (size_t i = 0; BN > 0 && i < nw; i++)
        g[0][i] += m->dwte[i];
    for (int b = 0; b < B; b++)
        for (int t = 0; t < N; t++) {
            const float *d = dx + ((size_t)b * N + t) * C;
            float *dw = g[0] + (size_t)m->tok[(size_t)b * m->ld + t] * C;
            float *dp = g[1] + (size_t)t * C;
            for (int j = 0; j < C; j++) {
                dw[j] += d[j];
                dp[j] += d[j];
            }
        }
    return h->end(h->arg, 0, 1);
}
