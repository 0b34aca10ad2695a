/*
 * gpt_cuda: ddp-train's GPT on a CUDA device (gpt_cuda.h): cuBLAS for every matrix product,
 * written kernels for the rest, in the order of gpt.c's passes (read gpt.c beside this file:
 * every step below names the host call it stands for).
 *
 * nvcc compiles this file as C++ (templates over the type T of the products' inputs, float or
 * bf16; nothing of the C++ library, no exceptions) with -fmad=false, so that the kernels round
 * as gpt.c's C does (no fused multiply-adds); the functions have C linkage (gpt_cuda.h). It
 * never prints. Every CUDA and cuBLAS result is checked where it is returned and becomes
 * COLL_ECUDA (cuda_common.cuh); every launch is checked with cudaGetLastError() right after it;
 * no kernel is launched over zero elements (a pass with no rows runs the hooks only).
 *
 * Layout, as gpt.c's: row-major (B N, width) activations, weights (out, in) row-major. mm()
 * takes cblas_sgemm's row-major arguments and hands cuBLAS (column-major) the transposed
 * problem, so each product here reads as gpt.c's cblas_sgemm call it replaces. Attention's
 * per-head products are strided-batched over the B sequences, one call per head: head h of
 * sequence b is at qkv + b N 3C + h hs (rows 3C apart) and att + (b H + h) N N.
 *
 * Parallel shape of the kernels: element-wise kernels have one thread per element; the
 * LayerNorms, the softmaxes and the cross-entropy one thread per row; the sums over rows (bias
 * and LayerNorm parameter gradients, the embedding's backward) one thread per column adding
 * the rows in order; the rows' losses one thread, in order. So every sum is gpt.c's, in gpt.c's
 * order; none uses atomics, and two runs give the same bits. Correctness before speed: the row
 * kernels read their rows with one thread each, far from the GPU's bandwidth.
 *
 * tests/trainer/cuda_emu compiles this file for the host (DDP_CUDA_EMULATE, cuda_common.cuh)
 * and test_gpt_cuda.c runs it against gpt.c there, on machines without a GPU.
 *
 * Invariants:
 *  - Every buffer is a cudaMalloc of its own, made once by gpt_cuda_create() (layout()).
 *  - Buffers typed T (void * here): the LayerNorms' outputs, qkv, att (B, H, N, N; zero above the
 *    diagonal), atty, fcg, lnf, the gradient copies entering products (dlog, dxq, dh, dat, ds,
 *    dqkv). In bf16 they hold gpt.c's rounded values; in f32 they are f32 copies.
 *  - zq (BN, 4C) f32 holds a product's output until a kernel rounds it into a T buffer; sc (B, H,
 *    N, N) f32 the attention scores (forward) and their gradient (backward).
 *  - d1 (BN, C) f32 is the residual stream's gradient through backward; d2 (BN, C) f32 the
 *    gradient entering a LayerNorm's backward (or attention's output's before rounding).
 *  - dwte (V, C) f32 holds the tied wte's gradient from the logits until the embedding's backward.
 *  - The tokens of the latest forward are on the device at tok, (B, N + 1) bytes; the pinned
 *    buffer a forward fills is the one whose copy (two forwards before) has run (copied[]).
 *  - stats[0] accumulates over passes without `stats`; stats[1] is one pass's, read at once.
 */
#include "gpt_cuda.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"
#include "mlp_cuda.h"

/* ------------------------------------------------------------------------------------------ */
/* Kernels                                                                                     */
/* ------------------------------------------------------------------------------------------ */

#define LN_EPS 1e-5f
#define GELU_S 0.7978845608028654f /* sqrt(2 / pi) */

/* out (n) f32 = in (n) bf16. */
static __global__ void widen_kernel(float *out, const bf16 *in, size_t n)
{
    GRID_STRIDE(e, n)
    {
        out[e] = __bfloat162float(in[e]);
    }
}

/* out (n) = in (n) f32 rounded to T. */
template <typename T> static __global__ void narrow_kernel(T *out, const float *in, size_t n)
{
    GRID_STRIDE(e, n)
    {
        out[e] = narrow<T>(in[e]);
    }
}

/* y (R, out) = b (out) in every row: a linear layer's output before its product is added. */
static __global__ void bias_rows_kernel(float *y, const float *b, int R, int out)
{
    size_t n = (size_t)R * out;
    GRID_STRIDE(e, n)
    {
        y[e] = b[e % out];
    }
}

/* a (n) += b (n). */
static __global__ void add_kernel(float *a, const float *b, size_t n)
{
    GRID_STRIDE(e, n)
    {
        a[e] += b[e];
    }
}

/* x0 (B N, C) = wte[tok] + wpe[t]; tok (B, N + 1), each below V (checked on the host). */
static __global__ void embed_kernel(float *x0, const uint8_t *tok, const float *wte,
                                    const float *wpe, int B, int N, int C)
{
    size_t n = (size_t)B * N * C;
    GRID_STRIDE(e, n)
    {
        size_t r = e / C;
        int j = (int)(e % C), b = (int)(r / N), t = (int)(r % N);
        x0[e] = wte[(size_t)tok[(size_t)b * (N + 1) + t] * C + j] + wpe[(size_t)t * C + j];
    }
}

/* y (B N) = tok[b][t + 1]: the targets, contiguous for xent_rows_kernel. */
static __global__ void targets_kernel(uint8_t *y, const uint8_t *tok, int B, int N)
{
    size_t n = (size_t)B * N;
    GRID_STRIDE(r, n)
    {
        y[r] = tok[(r / N) * (N + 1) + r % N + 1];
    }
}

/* Softmax cross-entropy, one thread per row of logits (R, V): the row becomes probabilities
 * (mlp_xent_row(), gpt.c's arithmetic), its loss and whether its first maximum is the target go
 * to loss[r] and correct[r]. The targets are below V (checked on the host). */
static __global__ void xent_rows_kernel(float *logits, const uint8_t *y, int R, int V, double *loss,
                                        int *correct)
{
    GRID_STRIDE(r, (size_t)R)
    {
        int ok;
        loss[r] = mlp_xent_row(logits + r * V, V, y[r], &ok);
        correct[r] = ok;
    }
}

/* *acc += the rows' losses and correct counts, added in the rows' order as gpt_forward() adds
 * them: one thread (launched over one element). */
static __global__ void xent_sum_kernel(dev_stats *acc, const double *loss, const int *correct,
                                       int R)
{
    GRID_STRIDE(e, (size_t)1)
    {
        double l = acc->loss;
        int c = acc->correct;
        for (int r = 0; r < R; r++) {
            l += loss[r];
            c += correct[r];
        }
        acc->loss = l;
        acc->correct = c;
    }
}

/* gpt.c's lanes_total(): the sum of GPT_LN_LANES partial sums (gpt.h). */
static __device__ float lanes_total(float *a)
{
    for (int k = 0; k < 8; k++)
        a[k] += a[k + 8];
    for (int k = 0; k < 4; k++)
        a[k] += a[k + 4];
    return ((a[0] + a[2]) + (a[1] + a[3]));
}

/* gpt.c's layernorm_forward(), one thread per row; out rounded to T. */
template <typename T>
static __global__ void layernorm_forward_kernel(T *out, float *mean, float *rstd, const float *x,
                                                const float *w, const float *b, int R, int C)
{
    GRID_STRIDE(i, (size_t)R)
    {
        const float *xi = x + i * C;
        T *oi = out + i * C;
        float a[GPT_LN_LANES] = {0}, v[GPT_LN_LANES] = {0};
        for (int j = 0; j < C; j++)
            a[j % GPT_LN_LANES] += xi[j];
        float mu = lanes_total(a) / (float)C;
        for (int j = 0; j < C; j++) {
            float d = xi[j] - mu;
            v[j % GPT_LN_LANES] += d * d;
        }
        float var = lanes_total(v) / (float)C;
        float s = 1.0f / sqrtf(var + LN_EPS);
        for (int j = 0; j < C; j++)
            oi[j] = narrow<T>((xi[j] - mu) * s * w[j] + b[j]);
        mean[i] = mu;
        rstd[i] = s;
    }
}

/* gpt.c's layernorm_backward(), the input's part: dx (R, C) += through the LayerNorm of dout. */
static __global__ void layernorm_backward_dx_kernel(float *dx, const float *dout, const float *x,
                                                    const float *w, const float *mean,
                                                    const float *rstd, int R, int C)
{
    GRID_STRIDE(i, (size_t)R)
    {
        const float *di = dout + i * C, *xi = x + i * C;
        float *dxi = dx + i * C;
        float mu = mean[i], s = rstd[i], am[GPT_LN_LANES] = {0}, ap[GPT_LN_LANES] = {0};
        for (int j = 0; j < C; j++) {
            float xhat = (xi[j] - mu) * s, dn = w[j] * di[j];
            am[j % GPT_LN_LANES] += dn;
            ap[j % GPT_LN_LANES] += dn * xhat;
        }
        float dmean = lanes_total(am) / (float)C, dproj = lanes_total(ap) / (float)C;
        for (int j = 0; j < C; j++) {
            float xhat = (xi[j] - mu) * s;
            dxi[j] += s * (w[j] * di[j] - dmean - xhat * dproj);
        }
    }
}

/* gpt.c's layernorm_backward(), the parameters' part: dw, db (C) += over the rows, in order, one
 * thread per column. */
static __global__ void layernorm_backward_dw_kernel(float *dw, float *db, const float *dout,
                                                    const float *x, const float *mean,
                                                    const float *rstd, int R, int C)
{
    GRID_STRIDE(j, (size_t)C)
    {
        float aw = dw[j], ab = db[j];
        for (int i = 0; i < R; i++) {
            float d = dout[(size_t)i * C + j];
            float xhat = (x[(size_t)i * C + j] - mean[i]) * rstd[i];
            ab += d;
            aw += xhat * d;
        }
        dw[j] = aw;
        db[j] = ab;
    }
}

/* db (out) += the rows of dy (R, out) summed in order, one thread per column. */
template <typename T>
static __global__ void bias_backward_kernel(float *db, const T *dy, int R, int out)
{
    GRID_STRIDE(j, (size_t)out)
    {
        float a = db[j];
        for (int i = 0; i < R; i++)
            a += widen(dy[(size_t)i * out + j]);
        db[j] = a;
    }
}

/* tanh(u) = 1 - 2 / (exp(2u) + 1), gpt.c's formula; exactly +-1 where exp overflows or
 * vanishes. */
__device__ __forceinline__ float gelu_tanh(float v)
{
    float u = GELU_S * (v + 0.044715f * v * v * v);
    return 1.0f - 2.0f / (expf(2.0f * u) + 1.0f);
}

/* out (n) = GELU(x) rounded to T. */
template <typename T> static __global__ void gelu_forward_kernel(T *out, const float *x, size_t n)
{
    GRID_STRIDE(e, n)
    {
        float v = x[e];
        out[e] = narrow<T>(0.5f * v * (1.0f + gelu_tanh(v)));
    }
}

/* out (n) = d * GELU'(x) rounded to T; d (n) f32. */
template <typename T>
static __global__ void gelu_backward_kernel(T *out, const float *d, const float *x, size_t n)
{
    GRID_STRIDE(e, n)
    {
        float v = x[e], t = gelu_tanh(v);
        float g = 0.5f * (1.0f + t) +
                  0.5f * v * (1.0f - t * t) * GELU_S * (1.0f + 3.0f * 0.044715f * v * v);
        out[e] = narrow<T>(d[e] * g);
    }
}

/*
 * The causal softmax of attention_forward(): row r of the (B H N) rows of sc (N each: the
 * scores, overwritten by their exponentials) gives att's row (rounded to T), over the keys up to
 * the row's position t = r mod N, zero after it.
 */
template <typename T>
static __global__ void softmax_forward_kernel(T *att, float *sc, size_t rows, int N)
{
    GRID_STRIDE(r, rows)
    {
        float *row = sc + r * N;
        T *a = att + r * N;
        int t = (int)(r % N);
        float max = row[0], sum = 0.0f;
        for (int j = 1; j <= t; j++)
            max = row[j] > max ? row[j] : max;
        for (int j = 0; j <= t; j++)
            row[j] = expf(row[j] - max);
        for (int j = 0; j <= t; j++)
            sum += row[j];
        for (int j = 0; j <= t; j++)
            a[j] = narrow<T>(row[j] / sum);
        for (int j = t + 1; j < N; j++)
            a[j] = narrow<T>(0.0f);
    }
}

/* attention_backward()'s step through the softmax: ds = scale a (da - sum_j a da) (rounded to
 * T), zero above the diagonal; a (T) and da (f32) as softmax_forward_kernel's rows. */
template <typename T>
static __global__ void softmax_backward_kernel(T *ds, const float *da, const T *att, size_t rows,
                                               int N, float scale)
{
    GRID_STRIDE(r, rows)
    {
        const T *ar = att + r * N;
        const float *dr = da + r * N;
        T *out = ds + r * N;
        int t = (int)(r % N);
        float dot = 0.0f;
        for (int j = 0; j <= t; j++)
            dot += widen(ar[j]) * dr[j];
        for (int j = 0; j <= t; j++)
            out[j] = narrow<T>(scale * widen(ar[j]) * (dr[j] - dot));
        for (int j = t + 1; j < N; j++)
            out[j] = narrow<T>(0.0f);
    }
}

/* The embedding's backward: gw (V, C) += d's rows at their tokens, in the rows' order, one
 * thread per column. */
static __global__ void embed_backward_wte_kernel(float *gw, const float *d, const uint8_t *tok,
                                                 int B, int N, int C)
{
    GRID_STRIDE(j, (size_t)C)
    {
        for (int b = 0; b < B; b++)
            for (int t = 0; t < N; t++)
                gw[(size_t)tok[(size_t)b * (N + 1) + t] * C + j] += d[((size_t)b * N + t) * C + j];
    }
}

/* gp (T, C) += d's rows at their positions (rows [0, N) only), the sequences in order, one
 * thread per (position, column). */
static __global__ void embed_backward_wpe_kernel(float *gp, const float *d, int B, int N, int C)
{
    size_t n = (size_t)N * C;
    GRID_STRIDE(e, n)
    {
        float a = gp[e];
        for (int b = 0; b < B; b++)
            a += d[(size_t)b * N * C + e];
        gp[e] = a;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* The model                                                                                   */
/* ------------------------------------------------------------------------------------------ */

/* One block's activations (gpt.c's gpt_layer); T-typed ones as void *. */
struct cu_layer {
    void *ln1;
    float *ln1_mean, *ln1_rstd;
    void *qkv, *att, *atty;
    float *xmid;
    void *ln2;
    float *ln2_mean, *ln2_rstd;
    float *fch;
    void *fcg;
};

struct gpt_cuda {
    gpt_config cfg;
    int rows;             /* sequences the buffers have room for */
    size_t tsize;         /* bytes of a T element: 4 or 2 */
    cudaDataType_t ctype; /* CUDA_R_32F or CUDA_R_16BF: the products' inputs */
    cudaStream_t stream;  /* borrowed */
    cublasHandle_t blas;
    void **bufs; /* (nbufs) every buffer below but the pinned ones, each its own allocation */
    int nbufs;
    size_t bytes;    /* theirs */
    cu_layer *layer; /* (L) */
    float **x;       /* x[0..L] (BN, C) */
    void *lnf;
    float *lnf_mean, *lnf_rstd;
    float *logits; /* (BN, V) */
    void *dlog;    /* (BN, V) T */
    uint8_t *y;    /* (BN) the targets */
    double *rloss; /* (BN) each prediction's loss */
    int *rcorrect; /* (BN) 1 where it is right */
    float *zq;     /* (BN, 4C) */
    float *sc;     /* (B, H, N, N) */
    void *ds;      /* (B, H, N, N) T */
    float *d1, *d2;
    void *dxq, *dh, *dat, *dqkv; /* (BN, C), (BN, 4C), (BN, C), (BN, 3C) T */
    float *dwte;                 /* (V, C) */
    float *wv;                   /* bf16: a unit's parameters that kernels read, widened */
    uint8_t *tok;                /* (rows, T + 1) */
    uint8_t *tok_host[2];        /* pinned (rows, T + 1) */
    cudaEvent_t copied[2];
    int slot;
    dev_stats *stats; /* [2] */
    double tokens;    /* predictions accumulated in stats[0] */
    /* the latest forward */
    int B, N, targets; /* B -1: none */
};

/*
 * One buffer of `bytes` at *p: counted (m->bufs NULL), or allocated and recorded in m->bufs.
 * Each buffer is an allocation of its own, so that tests/trainer/cuda_emu's run under
 * AddressSanitizer sees every buffer's bounds. Returns 0 or COLL_ECUDA.
 */
static int buffer(gpt_cuda *m, void **p, size_t bytes)
{
    if (!m->bufs) {
        m->nbufs++;
        m->bytes += bytes;
        return 0;
    }
    CK(cudaMalloc(p, bytes ? bytes : 1));
    m->bufs[m->nbufs++] = *p;
    return 0;
}

/* Counts the buffers (m->bufs NULL) or allocates them. Returns 0 or COLL_ECUDA. */
static int layout(gpt_cuda *m)
{
    const gpt_config *c = &m->cfg;
    size_t BN = (size_t)m->rows * c->seq, C = (size_t)c->width, T = (size_t)c->seq;
    size_t H = (size_t)c->heads, V = (size_t)c->vocab, ts = m->tsize, f = sizeof(float);
    size_t att = (size_t)m->rows * H * T * T;
    int rc;
#define TAKE(p, bytes)                                                                             \
    do {                                                                                           \
        if ((rc = buffer(m, (void **)&(p), (bytes))) < 0)                                          \
            return rc;                                                                             \
    } while (0)
    for (int l = 0; l < c->layers; l++) {
        cu_layer *y = &m->layer[l];
        if (c->recompute && l > 0) {
            *y = m->layer[0];
            continue;
        }
        TAKE(y->ln1, BN * C * ts);
        TAKE(y->ln1_mean, BN * f);
        TAKE(y->ln1_rstd, BN * f);
        TAKE(y->qkv, BN * 3 * C * ts);
        TAKE(y->att, att * ts);
        TAKE(y->atty, BN * C * ts);
        TAKE(y->xmid, BN * C * f);
        TAKE(y->ln2, BN * C * ts);
        TAKE(y->ln2_mean, BN * f);
        TAKE(y->ln2_rstd, BN * f);
        TAKE(y->fch, BN * 4 * C * f);
        TAKE(y->fcg, BN * 4 * C * ts);
    }
    for (int l = 0; l <= c->layers; l++)
        TAKE(m->x[l], BN * C * f);
    TAKE(m->lnf, BN * C * ts);
    TAKE(m->lnf_mean, BN * f);
    TAKE(m->lnf_rstd, BN * f);
    TAKE(m->logits, BN * V * f);
    TAKE(m->dlog, BN * V * ts);
    TAKE(m->y, BN);
    TAKE(m->rloss, BN * sizeof(double));
    TAKE(m->rcorrect, BN * sizeof(int));
    TAKE(m->zq, BN * 4 * C * f);
    TAKE(m->sc, att * f);
    TAKE(m->ds, att * ts);
    TAKE(m->d1, BN * C * f);
    TAKE(m->d2, BN * C * f);
    TAKE(m->dxq, BN * C * ts);
    TAKE(m->dh, BN * 4 * C * ts);
    TAKE(m->dat, BN * C * ts);
    TAKE(m->dqkv, BN * 3 * C * ts);
    TAKE(m->dwte, V * C * f);
    if (c->bf16) /* the largest unit's widened parameters: emb's (V + T, C) or a block's 13 C */
        TAKE(m->wv, ((V + T) * C > 13 * C ? (V + T) * C : 13 * C) * f);
    TAKE(m->tok, (size_t)m->rows * (T + 1));
#undef TAKE
    return 0;
}

extern "C" void gpt_cuda_free(gpt_cuda *m)
{
    if (!m)
        return;
    (void)cudaStreamSynchronize(m->stream);
    if (m->blas)
        (void)cublasDestroy(m->blas);
    for (int s = 0; s < 2; s++) {
        (void)cudaFreeHost(m->tok_host[s]);
        if (m->copied[s])
            (void)cudaEventDestroy(m->copied[s]);
    }
    for (int i = 0; m->bufs && i < m->nbufs; i++)
        (void)cudaFree(m->bufs[i]);
    free(m->bufs);
    (void)cudaFree(m->stats);
    (void)cudaGetLastError();
    free(m->layer);
    free(m->x);
    free(m);
}

extern "C" int gpt_cuda_create(const gpt_config *cfg, int max_batch, void *stream, gpt_cuda **out)
{
    if (gpt_config_check(cfg) < 0 || max_batch < 1 || !out)
        return fail(-EINVAL, "gpt_cuda_create: bad configuration");
    int rc = 0;
    size_t tokb = (size_t)max_batch * ((size_t)cfg->seq + 1);
    gpt_cuda *m = (gpt_cuda *)calloc(1, sizeof *m);
    if (!m)
        return fail(-ENOMEM, "gpt_cuda_create: out of memory");
    m->cfg = *cfg;
    m->rows = max_batch;
    m->B = -1;
    m->tsize = cfg->bf16 ? sizeof(bf16) : sizeof(float);
    m->ctype = cfg->bf16 ? CUDA_R_16BF : CUDA_R_32F;
    m->stream = (cudaStream_t)stream;
    m->layer = (cu_layer *)calloc((size_t)cfg->layers, sizeof *m->layer);
    m->x = (float **)calloc((size_t)cfg->layers + 1, sizeof *m->x);
    if (!m->layer || !m->x) {
        rc = fail(-ENOMEM, "gpt_cuda_create: out of memory");
        goto out;
    }
    if ((rc = blas_open(m->stream, &m->blas)) < 0)
        goto out;
    if ((rc = layout(m)) < 0) /* counts */
        goto out;
    if (!(m->bufs = (void **)calloc((size_t)m->nbufs, sizeof *m->bufs))) {
        rc = fail(-ENOMEM, "gpt_cuda_create: out of memory");
        goto out;
    }
    m->nbufs = 0;
    if ((rc = layout(m)) < 0)
        goto out;
    for (int s = 0; s < 2; s++) {
        CK_OUT(cudaMallocHost((void **)&m->tok_host[s], tokb));
        CK_OUT(cudaEventCreateWithFlags(&m->copied[s], cudaEventDisableTiming));
    }
    CK_OUT(cudaMalloc((void **)&m->stats, 2 * sizeof(dev_stats)));
    CK_OUT(cudaMemsetAsync(m->stats, 0, 2 * sizeof(dev_stats), m->stream));
    *out = m;
    return 0;
out:
    gpt_cuda_free(m);
    return rc;
}

extern "C" size_t gpt_cuda_activation_bytes(const gpt_cuda *m)
{
    return m->bytes;
}

/* Launches a kernel over n >= 1 elements (or rows, or columns) on the model's stream. */
#define LAUNCH_N(kernel, n, ...) LAUNCH(kernel, (size_t)(n), __VA_ARGS__)

/* A T buffer's element i. */
static void *at(const gpt_cuda *m, const void *base, size_t i)
{
    return (char *)base + i * m->tsize;
}

/*
 * C (M, N) = alpha op(A) op(B) + beta C, row-major, as cblas_sgemm(CblasRowMajor, ...): A and B
 * of type T, C f32. cuBLAS gets C^T = op(B)^T op(A)^T, column-major: B's storage seen
 * column-major is B^T, so the transposes carry over and the operands swap.
 */
static int mm(gpt_cuda *m, int ta, int tb, int M, int N, int K, float alpha, const void *A, int lda,
              const void *B, int ldb, float beta, float *C, int ldc)
{
    cublasStatus_t s =
        cublasGemmEx(m->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M,
                     K, &alpha, B, m->ctype, ldb, A, m->ctype, lda, &beta, C, CUDA_R_32F, ldc,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return s == CUBLAS_STATUS_SUCCESS ? 0 : blas_fail(s, "cublasGemmEx");
}

/* mm() over `batch` problems, the i-th's A, B and C sa, sb, sc elements after the first's. */
static int mm_batched(gpt_cuda *m, int ta, int tb, int M, int N, int K, float alpha, const void *A,
                      int lda, long long sa, const void *B, int ldb, long long sb, float beta,
                      float *C, int ldc, long long sc, int batch)
{
    cublasStatus_t s = cublasGemmStridedBatchedEx(
        m->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B,
        m->ctype, ldb, sb, A, m->ctype, lda, sa, &beta, C, CUDA_R_32F, ldc, sc, batch,
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return s == CUBLAS_STATUS_SUCCESS ? 0 : blas_fail(s, "cublasGemmStridedBatchedEx");
}

/* f32 src (n) into the T buffer dst. */
static int to_t(gpt_cuda *m, void *dst, const float *src, size_t n)
{
    if (m->cfg.bf16)
        LAUNCH_N(narrow_kernel<bf16>, n, (bf16 *)dst, src, n);
    else
        LAUNCH_N(narrow_kernel<float>, n, (float *)dst, src, n);
    return 0;
}

/* gpt.c's linear_forward(): y (R, out) = x (R, in) W^T + b, x and W of type T, b f32. */
static int linear_forward(gpt_cuda *m, float *y, const void *x, const void *W, const float *b,
                          int R, int in, int out)
{
    LAUNCH_N(bias_rows_kernel, (size_t)R * out, y, b, R, out);
    return mm(m, 0, 1, R, out, in, 1.0f, x, in, W, in, 1.0f, y, out);
}

/* gpt.c's linear_backward(): dW (out, in) += dy^T x; db (out) += dy's rows; dx (R, in) = dy W
 * (f32). dy, x, W of type T. */
static int linear_backward(gpt_cuda *m, float *dx, float *dW, float *db, const void *dy,
                           const void *x, const void *W, int R, int in, int out)
{
    int rc = mm(m, 1, 0, out, in, R, 1.0f, dy, out, x, in, 1.0f, dW, in);
    if (rc < 0)
        return rc;
    if (m->cfg.bf16)
        LAUNCH_N(bias_backward_kernel<bf16>, out, db, (const bf16 *)dy, R, out);
    else
        LAUNCH_N(bias_backward_kernel<float>, out, db, (const float *)dy, R, out);
    return mm(m, 0, 0, R, in, out, 1.0f, dy, out, W, in, 0.0f, dx, in);
}

static int layernorm_forward(gpt_cuda *m, void *out, float *mean, float *rstd, const float *x,
                             const float *w, const float *b, int R, int C)
{
    if (m->cfg.bf16)
        LAUNCH_N(layernorm_forward_kernel<bf16>, R, (bf16 *)out, mean, rstd, x, w, b, R, C);
    else
        LAUNCH_N(layernorm_forward_kernel<float>, R, (float *)out, mean, rstd, x, w, b, R, C);
    return 0;
}

static int layernorm_backward(gpt_cuda *m, float *dx, float *dw, float *db, const float *dout,
                              const float *x, const float *w, const float *mean, const float *rstd,
                              int R, int C)
{
    LAUNCH_N(layernorm_backward_dx_kernel, R, dx, dout, x, w, mean, rstd, R, C);
    LAUNCH_N(layernorm_backward_dw_kernel, C, dw, db, dout, x, mean, rstd, R, C);
    return 0;
}

/* gpt.c's attention_forward(): att (B, H, N, N) and y (BN, C) (T) from qkv (BN, 3C) (T). */
static int attention_forward(gpt_cuda *m, void *y, void *att, const void *qkv, int B, int N)
{
    int C = m->cfg.width, H = m->cfg.heads, hs = C / H, C3 = 3 * C, rc;
    long long NN = (long long)N * N, sq = (long long)N * C3;
    float scale = 1.0f / sqrtf((float)hs);
    for (int h = 0; h < H; h++) {
        const void *q = at(m, qkv, (size_t)h * hs);
        if ((rc = mm_batched(m, 0, 1, N, N, hs, scale, q, C3, sq, at(m, q, (size_t)C), C3, sq, 0.0f,
                             m->sc + (size_t)h * NN, N, H * NN, B)) < 0)
            return rc;
    }
    size_t rows = (size_t)B * H * N;
    if (m->cfg.bf16)
        LAUNCH_N(softmax_forward_kernel<bf16>, rows, (bf16 *)att, m->sc, rows, N);
    else
        LAUNCH_N(softmax_forward_kernel<float>, rows, (float *)att, m->sc, rows, N);
    for (int h = 0; h < H; h++) {
        const void *v = at(m, qkv, 2 * (size_t)C + (size_t)h * hs);
        if ((rc = mm_batched(m, 0, 0, N, hs, N, 1.0f, at(m, att, (size_t)h * NN), N, H * NN, v, C3,
                             sq, 0.0f, m->zq + (size_t)h * hs, C, (long long)N * C, B)) < 0)
            return rc;
    }
    return to_t(m, y, m->zq, (size_t)B * N * C);
}

/* gpt.c's attention_backward(): dqkv (BN, 3C) (T) given dy (BN, C) (T). */
static int attention_backward(gpt_cuda *m, void *dqkv, const void *dy, const void *att,
                              const void *qkv, int B, int N)
{
    int C = m->cfg.width, H = m->cfg.heads, hs = C / H, C3 = 3 * C, rc;
    long long NN = (long long)N * N, sq = (long long)N * C3, sy = (long long)N * C;
    float scale = 1.0f / sqrtf((float)hs);
    float *dq = m->zq; /* (BN, 3C) f32 */
    for (int h = 0; h < H; h++) {
        const void *dyh = at(m, dy, (size_t)h * hs), *a = at(m, att, (size_t)h * NN);
        const void *v = at(m, qkv, 2 * (size_t)C + (size_t)h * hs);
        /* da = dy v^T; dv = a^T dy */
        if ((rc = mm_batched(m, 0, 1, N, N, hs, 1.0f, dyh, C, sy, v, C3, sq, 0.0f,
                             m->sc + (size_t)h * NN, N, H * NN, B)) < 0 ||
            (rc = mm_batched(m, 1, 0, N, hs, N, 1.0f, a, N, H * NN, dyh, C, sy, 0.0f,
                             dq + 2 * (size_t)C + (size_t)h * hs, C3, sq, B)) < 0)
            return rc;
    }
    size_t rows = (size_t)B * H * N;
    if (m->cfg.bf16)
        LAUNCH_N(softmax_backward_kernel<bf16>, rows, (bf16 *)m->ds, m->sc, (const bf16 *)att, rows,
                 N, scale);
    else
        LAUNCH_N(softmax_backward_kernel<float>, rows, (float *)m->ds, m->sc, (const float *)att,
                 rows, N, scale);
    for (int h = 0; h < H; h++) {
        const void *ds = at(m, m->ds, (size_t)h * NN), *q = at(m, qkv, (size_t)h * hs);
        /* dq = ds k; dk = ds^T q */
        if ((rc = mm_batched(m, 0, 0, N, hs, N, 1.0f, ds, N, H * NN, at(m, q, (size_t)C), C3, sq,
                             0.0f, dq + (size_t)h * hs, C3, sq, B)) < 0 ||
            (rc = mm_batched(m, 1, 0, N, hs, N, 1.0f, ds, N, H * NN, q, C3, sq, 0.0f,
                             dq + (size_t)C + (size_t)h * hs, C3, sq, B)) < 0)
            return rc;
    }
    return to_t(m, dqkv, dq, (size_t)B * N * C3);
}

/* Parameter p of unit u: its elements, and whether the kernels read it (as f32): the
 * embeddings, LayerNorms and biases; the products read the weight matrices in T. */
static size_t param_count(const gpt_cuda *m, int u, int p, int *vec)
{
    char name[32];
    int64_t sh[2];
    int nd = gpt_param(&m->cfg, u, p, name, sh);
    *vec = u == 0 || nd == 1;
    return (size_t)sh[0] * (nd == 2 ? (size_t)sh[1] : 1);
}

/*
 * begin(u) through the hooks: ps the unit's parameters (T), fs the f32 view of those the kernels
 * read (widened into wv in bf16, when `widen` is set; else NULL), gs the gradients (backward).
 */
static int take(gpt_cuda *m, const gpt_hooks *h, int u, int backward, int widen, const void **ps,
                const float **fs, float **gs)
{
    void *p[GPT_BLOCK_PARAMS] = {0};
    float *g[GPT_BLOCK_PARAMS] = {0};
    int rc = h->begin(h->arg, u, backward, p, g);
    if (rc < 0)
        return rc;
    char name[32];
    int n = gpt_unit(&m->cfg, u, name);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (!p[i] || (backward && !g[i]))
            return fail(-EINVAL, "unit %s: the hook handed over no parameters", name);
        int vec;
        size_t count = param_count(m, u, i, &vec);
        ps[i] = p[i];
        fs[i] = NULL;
        if (gs)
            gs[i] = g[i];
        if (!vec || !widen)
            continue;
        if (!m->cfg.bf16) {
            fs[i] = (const float *)p[i];
            continue;
        }
        LAUNCH_N(widen_kernel, count, m->wv + off, (const bf16 *)p[i], count);
        fs[i] = m->wv + off;
        off += count;
    }
    return 0;
}

/* gpt.c's block_forward(): block l over BN = B N rows from xin to xout (BN, C). */
static int block_forward(gpt_cuda *m, cu_layer *y, const void *const *p, const float *const *f,
                         const float *xin, float *xout, int B, int N)
{
    int C = m->cfg.width, BN = B * N, rc;
    size_t n = (size_t)BN * C;
    if ((rc = layernorm_forward(m, y->ln1, y->ln1_mean, y->ln1_rstd, xin, f[0], f[1], BN, C)) < 0 ||
        (rc = linear_forward(m, m->zq, y->ln1, p[2], f[3], BN, C, 3 * C)) < 0 ||
        (rc = to_t(m, y->qkv, m->zq, 3 * n)) < 0 ||
        (rc = attention_forward(m, y->atty, y->att, y->qkv, B, N)) < 0 ||
        (rc = linear_forward(m, y->xmid, y->atty, p[4], f[5], BN, C, C)) < 0)
        return rc;
    LAUNCH_N(add_kernel, n, y->xmid, xin, n);
    if ((rc = layernorm_forward(m, y->ln2, y->ln2_mean, y->ln2_rstd, y->xmid, f[6], f[7], BN, C)) <
            0 ||
        (rc = linear_forward(m, y->fch, y->ln2, p[8], f[9], BN, C, 4 * C)) < 0)
        return rc;
    if (m->cfg.bf16)
        LAUNCH_N(gelu_forward_kernel<bf16>, 4 * n, (bf16 *)y->fcg, y->fch, 4 * n);
    else
        LAUNCH_N(gelu_forward_kernel<float>, 4 * n, (float *)y->fcg, y->fch, 4 * n);
    if ((rc = linear_forward(m, xout, y->fcg, p[10], f[11], BN, 4 * C, C)) < 0)
        return rc;
    LAUNCH_N(add_kernel, n, xout, y->xmid, n);
    return 0;
}

/* gpt.c's block backward (inside gpt_backward()): d1 from x[l+1]'s gradient to x[l]'s. */
static int block_backward(gpt_cuda *m, cu_layer *y, const void *const *p, const float *const *f,
                          float *const *g, const float *xin, int B, int N)
{
    int C = m->cfg.width, BN = B * N, rc;
    size_t n = (size_t)BN * C;
    /* the MLP: d1 is the gradient of x[l+1] = xmid + fc_proj(gelu(fc(ln_2(xmid)))) */
    if ((rc = to_t(m, m->dxq, m->d1, n)) < 0 ||
        (rc = linear_backward(m, m->zq, g[10], g[11], m->dxq, y->fcg, p[10], BN, 4 * C, C)) < 0)
        return rc;
    if (m->cfg.bf16)
        LAUNCH_N(gelu_backward_kernel<bf16>, 4 * n, (bf16 *)m->dh, m->zq, y->fch, 4 * n);
    else
        LAUNCH_N(gelu_backward_kernel<float>, 4 * n, (float *)m->dh, m->zq, y->fch, 4 * n);
    if ((rc = linear_backward(m, m->d2, g[8], g[9], m->dh, y->ln2, p[8], BN, C, 4 * C)) < 0 ||
        (rc = layernorm_backward(m, m->d1, g[6], g[7], m->d2, y->xmid, f[6], y->ln2_mean,
                                 y->ln2_rstd, BN, C)) < 0)
        return rc; /* d1: now xmid's gradient */
    /* attention: xmid = x[l] + c_proj(attn(c_attn(ln_1(x[l])))) */
    if ((rc = to_t(m, m->dxq, m->d1, n)) < 0 ||
        (rc = linear_backward(m, m->d2, g[4], g[5], m->dxq, y->atty, p[4], BN, C, C)) < 0 ||
        (rc = to_t(m, m->dat, m->d2, n)) < 0 ||
        (rc = attention_backward(m, m->dqkv, m->dat, y->att, y->qkv, B, N)) < 0 ||
        (rc = linear_backward(m, m->d2, g[2], g[3], m->dqkv, y->ln1, p[2], BN, C, 3 * C)) < 0)
        return rc;
    return layernorm_backward(m, m->d1, g[0], g[1], m->d2, xin, f[0], y->ln1_mean, y->ln1_rstd, BN,
                              C); /* d1: now x[l]'s gradient */
}

/* The tokens of B rows (tok[b * ld], len + extra bytes each) to the device, (B, len + 1). */
static int upload_tokens(gpt_cuda *m, const uint8_t *tok, int B, int len, int ld, int extra)
{
    int s = m->slot;
    m->slot ^= 1;
    CK(cudaEventSynchronize(m->copied[s])); /* its copy, two forwards before, has run */
    uint8_t *host = m->tok_host[s];
    for (int b = 0; b < B; b++)
        memcpy(host + (size_t)b * (len + 1), tok + (size_t)b * ld, (size_t)(len + extra));
    CK(cudaMemcpyAsync(m->tok, host, (size_t)B * (len + 1), cudaMemcpyHostToDevice, m->stream));
    CK(cudaEventRecord(m->copied[s], m->stream));
    return 0;
}

extern "C" int gpt_cuda_forward(gpt_cuda *m, const gpt_hooks *h, const uint8_t *tok, int B, int len,
                                int ld, int targets, gpt_stats *stats)
{
    const gpt_config *c = &m->cfg;
    int C = c->width, L = c->layers, V = c->vocab, N = len, rc;
    m->B = -1; /* no backward of a failed forward */
    if (B < 0 || B > m->rows || len < 1 || len > c->seq || (targets && ld < len + 1) ||
        (!targets && ld < len) || (B > 0 && !tok))
        return fail(-EINVAL, "gpt_cuda_forward: %d rows of %d tokens %d apart (at most %d of %d)",
                    B, len, ld, m->rows, c->seq);
    for (int b = 0; V < 256 && b < B; b++) /* a byte beyond a small vocabulary */
        for (int t = 0; t < N + (targets ? 1 : 0); t++)
            if (tok[(size_t)b * ld + t] >= V)
                return fail(-EINVAL, "gpt_cuda_forward: token %d is not below %d",
                            tok[(size_t)b * ld + t], V);
    int BN = B * N;
    const void *p[GPT_BLOCK_PARAMS];
    const float *f[GPT_BLOCK_PARAMS];
    dev_stats *acc = &m->stats[stats ? 1 : 0];
    if (stats)
        CK(cudaMemsetAsync(acc, 0, sizeof *acc, m->stream));
    if (BN > 0 && (rc = upload_tokens(m, tok, B, len, ld, targets ? 1 : 0)) < 0)
        return rc;

    /* the embeddings: x0 = wte[tok] + wpe[pos] */
    if ((rc = take(m, h, 0, 0, 1, p, f, NULL)) < 0)
        return rc;
    if (BN > 0)
        LAUNCH_N(embed_kernel, (size_t)BN * C, m->x[0], m->tok, f[0], f[1], B, N, C);
    if ((rc = h->end(h->arg, 0, 0)) < 0)
        return rc;

    for (int l = 0; l < L; l++) {
        if ((rc = take(m, h, 1 + l, 0, 1, p, f, NULL)) < 0)
            return rc;
        if (BN > 0 && (rc = block_forward(m, &m->layer[l], p, f, m->x[l], m->x[l + 1], B, N)) < 0)
            return rc;
        if ((rc = h->end(h->arg, 1 + l, 0)) < 0)
            return rc;
    }

    if ((rc = take(m, h, L + 1, 0, 1, p, f, NULL)) < 0)
        return rc;
    if (BN > 0 && (rc = layernorm_forward(m, m->lnf, m->lnf_mean, m->lnf_rstd, m->x[L], f[0], f[1],
                                          BN, C)) < 0)
        return rc;
    if ((rc = h->end(h->arg, L + 1, 0)) < 0)
        return rc;

    /* the logits (BN, V) = lnf wte^T: unit 0 taken for its wte alone */
    if ((rc = take(m, h, 0, 0, 0, p, f, NULL)) < 0)
        return rc;
    if (BN > 0 && (rc = mm(m, 0, 1, BN, V, C, 1.0f, m->lnf, C, p[0], C, 0.0f, m->logits, V)) < 0)
        return rc;
    if ((rc = h->end(h->arg, 0, 0)) < 0)
        return rc;

    if (targets && BN > 0) {
        LAUNCH_N(targets_kernel, BN, m->y, m->tok, B, N);
        LAUNCH_N(xent_rows_kernel, BN, m->logits, m->y, BN, V, m->rloss, m->rcorrect);
        LAUNCH_N(xent_sum_kernel, 1, acc, m->rloss, m->rcorrect, BN);
    }
    if (stats) {
        dev_stats got;
        CK(cudaMemcpyAsync(&got, acc, sizeof got, cudaMemcpyDeviceToHost, m->stream));
        CK(cudaStreamSynchronize(m->stream));
        stats->loss_sum = got.loss;
        stats->correct = got.correct;
        stats->tokens = targets ? (double)BN : 0;
    } else if (targets) {
        m->tokens += BN;
    }
    m->B = B;
    m->N = N;
    m->targets = targets;
    return 0;
}

extern "C" int gpt_cuda_backward(gpt_cuda *m, const gpt_hooks *h, float loss_scale)
{
    const gpt_config *c = &m->cfg;
    if (m->B < 0 || !m->targets)
        return fail(-EINVAL, "gpt_cuda_backward: no forward with targets before");
    int B = m->B, N = m->N, C = c->width, L = c->layers, V = c->vocab, BN = B * N, rc;
    size_t n = (size_t)BN * C;
    const void *p[GPT_BLOCK_PARAMS];
    const float *f[GPT_BLOCK_PARAMS];
    float *g[GPT_BLOCK_PARAMS];

    /* dlogits = loss_scale (p - onehot) (T); the logits' products with wte's parameters alone
       (wte's gradient waits in dwte for the embedding's backward) */
    if (BN > 0) {
        size_t nv = (size_t)BN * V;
        if (c->bf16)
            LAUNCH_N(xent_backward_kernel<bf16>, nv, (bf16 *)m->dlog, m->logits, m->y, BN, V,
                     loss_scale);
        else
            LAUNCH_N(xent_backward_kernel<float>, nv, (float *)m->dlog, m->logits, m->y, BN, V,
                     loss_scale);
    }
    if ((rc = take(m, h, 0, 0, 0, p, f, NULL)) < 0)
        return rc;
    if (BN > 0 &&
        ((rc = mm(m, 1, 0, V, C, BN, 1.0f, m->dlog, V, m->lnf, C, 0.0f, m->dwte, C)) < 0 ||
         (rc = mm(m, 0, 0, BN, C, V, 1.0f, m->dlog, V, p[0], C, 0.0f, m->d2, C)) < 0))
        return rc;
    if ((rc = h->end(h->arg, 0, 0)) < 0)
        return rc;

    if ((rc = take(m, h, L + 1, 1, 1, p, f, g)) < 0)
        return rc;
    if (BN > 0) {
        CK(cudaMemsetAsync(m->d1, 0, n * sizeof(float), m->stream));
        if ((rc = layernorm_backward(m, m->d1, g[0], g[1], m->d2, m->x[L], f[0], m->lnf_mean,
                                     m->lnf_rstd, BN, C)) < 0)
            return rc;
    }
    if ((rc = h->end(h->arg, L + 1, 1)) < 0)
        return rc;

    for (int l = L - 1; l >= 0; l--) {
        cu_layer *y = &m->layer[l];
        if ((rc = take(m, h, 1 + l, 1, 1, p, f, g)) < 0)
            return rc;
        if (BN > 0 && c->recompute && /* the block's activations again, the same bits */
            (rc = block_forward(m, y, p, f, m->x[l], m->x[l + 1], B, N)) < 0)
            return rc;
        if (BN > 0 && (rc = block_backward(m, y, p, f, g, m->x[l], B, N)) < 0)
            return rc;
        if ((rc = h->end(h->arg, 1 + l, 1)) < 0)
            return rc;
    }

    /* the embeddings, wte's last use: its gradient from the logits and from the lookup */
    if ((rc = take(m, h, 0, 1, 0, p, f, g)) < 0)
        return rc;
    if (BN > 0) {
        size_t nw = (size_t)V * C;
        LAUNCH_N(add_kernel, nw, g[0], m->dwte, nw);
        LAUNCH_N(embed_backward_wte_kernel, C, g[0], m->d1, m->tok, B, N, C);
        LAUNCH_N(embed_backward_wpe_kernel, (size_t)N * C, g[1], m->d1, B, N, C);
    }
    return h->end(h->arg, 0, 1);
}

extern "C" int gpt_cuda_stats_take(gpt_cuda *m, gpt_stats *out)
{
    dev_stats got;
    CK(cudaMemcpyAsync(&got, &m->stats[0], sizeof got, cudaMemcpyDeviceToHost, m->stream));
    CK(cudaMemsetAsync(&m->stats[0], 0, sizeof got, m->stream));
    CK(cudaStreamSynchronize(m->stream));
    out->loss_sum = got.loss;
    out->correct = got.correct;
    out->tokens = m->tokens;
    m->tokens = 0;
    return 0;
}

extern "C" int gpt_cuda_logits(gpt_cuda *m, int row, int count, float *out)
{
    if (m->B < 0 || row < 0 || count < 0 || row > m->B * m->N - count)
        return fail(-EINVAL, "gpt_cuda_logits: rows [%d, %d) out of the latest forward's", row,
                    row + count);
    size_t V = (size_t)m->cfg.vocab;
    return mlp_cuda_to_host(out, m->logits + (size_t)row * V, (size_t)count * V * sizeof(float),
                            m->stream);
}
