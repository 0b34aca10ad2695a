/*
 * The MLP of ddp-train: in -> H (ReLU) -> ... -> H (ReLU) -> classes, softmax cross-entropy,
 * forward and backward as row-major OpenBLAS sgemm calls in the llm.c manner: one function per
 * operation, shapes next to the code, B the batch rows of the current pass.
 *
 * What it does not do: hold parameters or gradients (the caller's, through mlp_hooks), choose
 * the BLAS thread count (the program's: openblas_set_num_threads), or allocate after
 * mlp_create(). Activations for max_batch rows are allocated once.
 *
 * Invariants:
 *  - act[l] (B, out_l) is layer l's output after its ReLU (hidden layers) or its logits (the
 *    last), overwritten in place by the softmax probabilities when the forward has labels.
 *    Backward reads ReLU's mask back from act[l] > 0, torch's convention (the derivative at 0
 *    is 0).
 *  - grad[l] (B, out_l) is dLoss/d(pre-activation of layer l), written by backward only.
 *  - Gradients of the parameters are accumulated with beta = 1 (+=); nothing here zeroes them.
 *  - bf16 (mlp.h): act[l] of hidden layers and grad[l] of every layer hold bf16 values (floats
 *    exactly representable in bf16) once written; xq holds the rounded input, wq and bq the
 *    current layer's parameters widened. The logits and probabilities stay f32.
 */
#include "mlp.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bf16.h"
#include "mlp_xent.h"
#include "rng.h"

struct mlp {
    mlp_config cfg;
    int nlin;         /* linear layers, cfg.layers + 1 */
    int max_batch;    /* rows the activations have room for */
    int B;            /* rows of the latest forward (-1: none yet) */
    const float *x;   /* (B, in_dim) the latest forward's input, borrowed */
    const uint8_t *y; /* (B) its labels, borrowed; NULL: no backward possible */
    float **act;      /* act[l]: (max_batch, out_l) */
    float **grad;     /* grad[l]: (max_batch, out_l) */
    float *xq;        /* bf16: (max_batch, in_dim) the input rounded */
    float *wq, *bq;   /* bf16: the current layer's W (out, in) and b (out) widened */
};

int mlp_num_linear(const mlp_config *c)
{
    return c->layers + 1;
}

int mlp_layer_in(const mlp_config *c, int l)
{
    return l == 0 ? c->in_dim : c->hidden;
}

int mlp_layer_out(const mlp_config *c, int l)
{
    return l == c->layers ? c->classes : c->hidden;
}

size_t mlp_num_params(const mlp_config *c)
{
    size_t n = 0;
    for (int l = 0; l < mlp_num_linear(c); l++)
        n += (size_t)mlp_layer_out(c, l) * ((size_t)mlp_layer_in(c, l) + 1);
    return n;
}

void mlp_init_uniform(float *data, size_t count, int fan_in, uint64_t seed, uint64_t stream)
{
    /* kaiming_uniform_(a = sqrt(5)): gain = sqrt(2 / (1 + a^2)) = sqrt(1/3), bound = gain *
       sqrt(3 / fan_in) = 1 / sqrt(fan_in); torch's bias rule gives the same bound. */
    float bound = 1.0f / sqrtf((float)fan_in);
    rng r;
    rng_init(&r, seed, stream);
    for (size_t i = 0; i < count; i++)
        data[i] = (2.0f * rng_float(&r) - 1.0f) * bound;
}

void mlp_free(mlp *m)
{
    if (!m)
        return;
    for (int l = 0; l < m->nlin; l++) {
        if (m->act)
            free(m->act[l]);
        if (m->grad)
            free(m->grad[l]);
    }
    free(m->act);
    free(m->grad);
    free(m->xq);
    free(m->wq);
    free(m->bq);
    free(m);
}

int mlp_create(const mlp_config *cfg, int max_batch, mlp **out)
{
    if (!cfg || !out || cfg->in_dim <= 0 || cfg->hidden <= 0 || cfg->layers < 1 ||
        cfg->classes < 2 || max_batch <= 0 || (cfg->bf16 != 0 && cfg->bf16 != 1))
        return -EINVAL;
    mlp *m = calloc(1, sizeof *m);
    if (!m)
        return -ENOMEM;
    m->cfg = *cfg;
    m->nlin = mlp_num_linear(cfg);
    m->max_batch = max_batch;
    m->B = -1;
    m->act = calloc((size_t)m->nlin, sizeof *m->act);
    m->grad = calloc((size_t)m->nlin, sizeof *m->grad);
    if (!m->act || !m->grad)
        goto fail;
    for (int l = 0; l < m->nlin; l++) {
        size_t n = (size_t)max_batch * (size_t)mlp_layer_out(cfg, l);
        m->act[l] = malloc(n * sizeof(float));
        m->grad[l] = malloc(n * sizeof(float));
        if (!m->act[l] || !m->grad[l])
            goto fail;
    }
    if (cfg->bf16) {
        size_t wmax = 0, bmax = 0;
        for (int l = 0; l < m->nlin; l++) {
            size_t out = (size_t)mlp_layer_out(cfg, l), in = (size_t)mlp_layer_in(cfg, l);
            wmax = out * in > wmax ? out * in : wmax;
            bmax = out > bmax ? out : bmax;
        }
        m->xq = malloc((size_t)max_batch * (size_t)cfg->in_dim * sizeof(float));
        m->wq = malloc(wmax * sizeof(float));
        m->bq = malloc(bmax * sizeof(float));
        if (!m->xq || !m->wq || !m->bq)
            goto fail;
    }
    *out = m;
    return 0;
fail:
    mlp_free(m);
    return -ENOMEM;
}

const float *mlp_output(const mlp *m)
{
    return m->act[m->nlin - 1];
}

/* ------------------------------------------------------------------------------------------ */
/* Operations                                                                                  */
/* ------------------------------------------------------------------------------------------ */

/* y = x W^T + b.  x (B, in), W (out, in), b (out) -> y (B, out). */
static void linear_forward(float *restrict y, const float *restrict x, const float *restrict W,
                           const float *restrict b, int B, int in, int out)
{
    for (int i = 0; i < B; i++)
        memcpy(y + (size_t)i * out, b, (size_t)out * sizeof(float));
    /* (B, in) x (in, out), added onto the broadcast bias */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, out, in, 1.0f, x, in, W, in, 1.0f, y,
                out);
}

/*
 * Gradients of y = x W^T + b given dy (B, out):
 *   dW (out, in) += dy^T x,   db (out) += sum over rows of dy,   dx (B, in) = dy W (if dx).
 */
static void linear_backward(float *restrict dx, float *restrict dW, float *restrict db,
                            const float *restrict dy, const float *restrict x,
                            const float *restrict W, int B, int in, int out)
{
    /* (out, B) x (B, in) */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, B, 1.0f, dy, out, x, in, 1.0f, dW,
                in);
    for (int i = 0; i < B; i++) {
        const float *row = dy + (size_t)i * out; /* (out) */
        for (int j = 0; j < out; j++)
            db[j] += row[j];
    }
    if (dx) /* (B, out) x (out, in) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, in, out, 1.0f, dy, out, W, in,
                    0.0f, dx, in);
}

/* In place: a = max(a, 0).  a (n). */
static void relu_forward(float *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        a[i] = a[i] > 0.0f ? a[i] : 0.0f;
}

/* In place: d *= (a > 0), a being the ReLU's output.  d, a (n). */
static void relu_backward(float *restrict d, const float *restrict a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = a[i] > 0.0f ? d[i] : 0.0f;
}

/*
 * Softmax cross-entropy, in place: logits (B, C) become probabilities. Adds each row's
 * -log p[label] to *loss_sum and counts the rows whose first maximal logit is the label
 * (mlp_xent.h, the device's arithmetic too).
 */
static void softmax_xent_forward(float *logits, const uint8_t *y, int B, int C, double *loss_sum,
                                 int *correct)
{
    for (int i = 0; i < B; i++) {
        int ok;
        *loss_sum += mlp_xent_row(logits + (size_t)i * C, C, y[i], &ok); /* (C) */
        *correct += ok;
    }
}

/* dlogits (B, C) = loss_scale * (p - onehot(y)), p the probabilities (B, C). */
static void softmax_xent_backward(float *restrict dlogits, const float *restrict p,
                                  const uint8_t *restrict y, int B, int C, float loss_scale)
{
    for (int i = 0; i < B; i++) {
        const float *pi = p + (size_t)i * C;
        float *di = dlogits + (size_t)i * C;
        for (int j = 0; j < C; j++)
            di[j] = loss_scale * (pi[j] - (j == y[i] ? 1.0f : 0.0f));
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Passes                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/*
 * Layer l's parameters as f32: the hook's W and b, or in bf16 its W16 and b16 widened into the
 * scratch (b only when `bias`). NULL pointers from the hook stay NULL (the pass then fails).
 */
static void layer_params(mlp *m, const mlp_layer *io, int l, int bias, const float **W,
                         const float **b)
{
    if (!m->cfg.bf16) {
        *W = io->W;
        *b = io->b;
        return;
    }
    size_t out = (size_t)mlp_layer_out(&m->cfg, l), in = (size_t)mlp_layer_in(&m->cfg, l);
    *W = io->W16 ? (bf16_widen_n(m->wq, io->W16, out * in), m->wq) : NULL;
    *b = bias && io->b16 ? (bf16_widen_n(m->bq, io->b16, out), m->bq) : NULL;
}

int mlp_forward(mlp *m, const mlp_hooks *h, const float *x, const uint8_t *y, int B,
                mlp_stats *stats)
{
    const mlp_config *c = &m->cfg;
    m->B = -1; /* no backward of a failed forward */
    if (B < 0 || B > m->max_batch || (B > 0 && !x))
        return -EINVAL;
    for (int i = 0; y && i < B; i++)
        if (y[i] >= c->classes)
            return -EINVAL;
    if (c->bf16 && B > 0) { /* the device gathers its input as bf16 */
        memcpy(m->xq, x, (size_t)B * (size_t)c->in_dim * sizeof(float));
        bf16_quantize_n(m->xq, (size_t)B * (size_t)c->in_dim);
        x = m->xq;
    }
    const float *in = x; /* (B, in_l) */
    for (int l = 0; l < m->nlin; l++) {
        int nin = mlp_layer_in(c, l), nout = mlp_layer_out(c, l);
        mlp_layer io = {0};
        int rc = h->begin(h->arg, l, 0, &io);
        if (rc < 0)
            return rc;
        if (B > 0) {
            const float *W, *b;
            layer_params(m, &io, l, 1, &W, &b);
            if (!W || !b)
                return -EINVAL;
            linear_forward(m->act[l], in, W, b, B, nin, nout); /* (B, out_l) */
            if (l < m->nlin - 1) {
                relu_forward(m->act[l], (size_t)B * nout);
                if (c->bf16)
                    bf16_quantize_n(m->act[l], (size_t)B * nout);
            }
        }
        if (h->end && (rc = h->end(h->arg, l, 0)) < 0)
            return rc;
        in = m->act[l];
    }
    mlp_stats st = {0};
    if (y)
        softmax_xent_forward(m->act[m->nlin - 1], y, B, c->classes, &st.loss_sum, &st.correct);
    if (stats)
        *stats = st;
    m->B = B;
    m->x = x;
    m->y = y;
    return 0;
}

int mlp_backward(mlp *m, const mlp_hooks *h, float loss_scale)
{
    const mlp_config *c = &m->cfg;
    int B = m->B;
    if (B < 0 || !m->y)
        return -EINVAL;
    int L = m->nlin;
    if (B > 0) {
        softmax_xent_backward(m->grad[L - 1], m->act[L - 1], m->y, B, c->classes, loss_scale);
        if (c->bf16)
            bf16_quantize_n(m->grad[L - 1], (size_t)B * c->classes);
    }
    for (int l = L - 1; l >= 0; l--) {
        int nin = mlp_layer_in(c, l), nout = mlp_layer_out(c, l);
        mlp_layer io = {0};
        int rc = h->begin(h->arg, l, 1, &io);
        if (rc < 0)
            return rc;
        if (B > 0) {
            const float *x = l == 0 ? m->x : m->act[l - 1]; /* (B, in_l) */
            float *dx = l == 0 ? NULL : m->grad[l - 1];     /* (B, in_l) */
            const float *W = NULL, *b; /* W: only for dx */
            if (dx)
                layer_params(m, &io, l, 0, &W, &b);
            if ((dx && !W) || !io.dW || !io.db)
                return -EINVAL;
            linear_backward(dx, io.dW, io.db, m->grad[l], x, W, B, nin, nout);
            if (dx) {
                relu_backward(dx, m->act[l - 1], (size_t)B * nin);
                if (c->bf16)
                    bf16_quantize_n(dx, (size_t)B * nin);
            }
        }
        if (h->end && (rc = h->end(h->arg, l, 1)) < 0)
            return rc;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* OpenBLAS's kernels                                                                          */
/* ------------------------------------------------------------------------------------------ */

const char *mlp_blas_core(void)
{
    return openblas_get_corename();
}

const char *mlp_blas_core_hint(void)
{
    if (strcmp(openblas_get_corename(), "Prescott") != 0)
        return NULL;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return "Haswell";
    if (__builtin_cpu_supports("avx"))
        return "Sandybridge";
#endif
    return NULL;
}

int mlp_blas_select(char **argv)
{
    const char *core = getenv("OPENBLAS_CORETYPE") ? NULL : mlp_blas_core_hint();
    if (!core)
        return 0;
    if (setenv("OPENBLAS_CORETYPE", core, 1) < 0)
        return -errno;
    execv("/proc/self/exe", argv);
    int rc = -errno;
    unsetenv("OPENBLAS_CORETYPE");
    return rc;
}
