/*
 * mlp_cuda: ddp-train's MLP on a CUDA device (mlp_cuda.h), cuBLAS for the products and a few
 * element-wise kernels, and the data set on the device with its index pipeline.
 *
 * nvcc compiles this file as C++ (templates over the compute type, nothing of the C++ library,
 * no exceptions); the functions have C linkage (mlp_cuda.h). It never prints. Every CUDA and
 * cuBLAS result is checked where it is returned and becomes COLL_ECUDA here, with the call and
 * CUDA's message in the thread's last error; a kernel launch is checked with
 * cudaGetLastError() right after it.
 *
 * Layout, as mlp.c's: row-major (B, features) activations, W (out, in) row-major. cuBLAS is
 * column-major, so a row-major (r, c) matrix is handed over as the column-major (c, r) matrix,
 * its transpose; each product below says which.
 *
 * Invariants:
 *  - act[l] (max_batch, out_l) of hidden layers holds the ReLU output in the compute type T
 *    (f32 or bf16); the last layer's output is `logits` (f32), overwritten by the softmax
 *    probabilities in a forward with labels.
 *  - grad[l] (max_batch, out_l), type T: dLoss/d(pre-activation of layer l), the right-hand
 *    input of the products of backward.
 *  - z (max_batch, max width) f32: a product's output before it is rounded to T (bf16 only; an
 *    f32 model writes the product into act[l] or grad[l] and finishes in place).
 *  - stats[0] accumulates over passes without `stats`; stats[1] is one pass's, read at once.
 *  - Every launch has at least one element (B > 0 is checked before enqueueing).
 */
#include "mlp_cuda.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "cuda_common.cuh"
extern "C" {
#include "data.h"
}

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                      */
/* ------------------------------------------------------------------------------------------ */

static thread_local char last_err[512];

extern "C" const char *mlp_cuda_last_error(void)
{
    return last_err;
}

char *mlp_cuda__error_buffer(size_t *cap)
{
    *cap = sizeof last_err;
    return last_err;
}

/* ------------------------------------------------------------------------------------------ */
/* Devices and streams                                                                         */
/* ------------------------------------------------------------------------------------------ */

extern "C" int mlp_cuda_built(void)
{
    return 1;
}

extern "C" int mlp_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" int mlp_cuda_open(int device, void **stream, char *name, size_t cap)
{
    if (device < 0 || !stream)
        return fail(-EINVAL, "device %d: bad argument", device);
    CK(cudaSetDevice(device));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, device));
    if (name && cap)
        snprintf(name, cap, "%s", prop.name);
    /* A GPU that nvcc built no kernels for (-Dgpu_arch, see libcollective/meson.build) would
       fail at the first launch with CUDA's terse "no kernel image"; say which GPU, up front. */
    cudaFuncAttributes fa;
    cudaError_t e = cudaFuncGetAttributes(&fa, fill_kernel<float>);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fail(-ENOTSUP, "%s (compute capability %d.%d): no kernels of ddp-train's build run "
                              "on it: %s",
                    prop.name, prop.major, prop.minor, cudaGetErrorString(e));
    }
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *stream = s;
    return 0;
}

extern "C" int mlp_cuda_device_uuid(int device, uint8_t uuid[16])
{
    if (device < 0 || !uuid)
        return fail(-EINVAL, "device %d: bad argument", device);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, device));
    static_assert(sizeof prop.uuid.bytes == 16, "a CUDA UUID is 16 bytes");
    memcpy(uuid, prop.uuid.bytes, 16);
    return 0;
}

extern "C" int mlp_cuda_memory_used(int device, size_t *used)
{
    if (device < 0 || !used)
        return fail(-EINVAL, "device %d: bad argument", device);
    size_t free_bytes, total;
    CK(cudaSetDevice(device));
    CK(cudaMemGetInfo(&free_bytes, &total));
    *used = total - free_bytes;
    return 0;
}

extern "C" void mlp_cuda_close(void *stream)
{
    if (!stream)
        return;
    (void)cudaStreamSynchronize((cudaStream_t)stream);
    (void)cudaStreamDestroy((cudaStream_t)stream);
    (void)cudaGetLastError();
}

extern "C" int mlp_cuda_to_host(void *dst, const void *src, size_t nbytes, void *stream)
{
    if (nbytes == 0)
        return 0;
    cudaStream_t s = (cudaStream_t)stream;
    CK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Kernels                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/*
 * x (count, dim) = normalised pixels of rows idx[i] (or start + i), y (count) their labels.
 * The rows were checked on the host; the normalisation is data.c's (data_normalize()).
 */
template <typename T>
__global__ void gather_kernel(T *x, uint8_t *y, const uint8_t *pix, const uint8_t *lab,
                              const int32_t *idx, int start, int count, int dim)
{
    size_t n = (size_t)count * dim;
    GRID_STRIDE(e, n)
    {
        int i = (int)(e / dim), k = (int)(e % dim);
        size_t row = (size_t)(idx ? idx[i] : start + i);
        x[e] = narrow<T>(data_normalize(pix[row * dim + k]));
        if (k == 0)
            y[i] = lab[row];
    }
}

/* a (B, out) = act(z + b): ReLU when relu, else identity; z (B, out) f32, b (out). a may be z. */
template <typename TB, typename TO>
__global__ void bias_act_kernel(TO *a, const float *z, const TB *b, int B, int out, int relu)
{
    size_t n = (size_t)B * out;
    GRID_STRIDE(e, n)
    {
        float v = z[e] + widen(b[e % out]);
        if (relu)
            v = v > 0.0f ? v : 0.0f;
        a[e] = narrow<TO>(v);
    }
}

/* dx (n) = da * (a > 0) rounded to T; da f32 (may alias dx when T is float), a the ReLU output. */
template <typename T> __global__ void relu_backward_kernel(T *dx, const float *da, const T *a, size_t n)
{
    GRID_STRIDE(e, n)
    {
        dx[e] = narrow<T>(widen(a[e]) > 0.0f ? da[e] : 0.0f);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* The model                                                                                   */
/* ------------------------------------------------------------------------------------------ */

struct mlp_cuda {
    mlp_config cfg;
    int nlin, max_batch;
    size_t tsize;         /* bytes per activation element: 4 (f32) or 2 (bf16) */
    cudaDataType_t ctype; /* CUDA_R_32F or CUDA_R_16BF, the products' inputs */
    cudaStream_t stream;  /* borrowed */
    cublasHandle_t blas;
    void **act;         /* act[l]: (max_batch, out_l) hidden layers, type T; NULL for the last */
    void **grad;        /* grad[l]: (max_batch, out_l), type T */
    float *logits;      /* (max_batch, classes) */
    float *z;           /* bf16: (max_batch, max width) */
    void *ones;         /* (max_batch) ones, type T: the bias gradient's product */
    dev_stats *stats;   /* [2], see the invariants */
    int B;              /* rows of the latest forward; -1: none */
    const void *x;      /* its input, borrowed */
    const uint8_t *y;   /* its labels, borrowed; NULL: no backward */
};

extern "C" void mlp_cuda_free(mlp_cuda *m)
{
    if (!m)
        return;
    (void)cudaStreamSynchronize(m->stream);
    if (m->blas)
        (void)cublasDestroy(m->blas);
    for (int l = 0; l < m->nlin; l++) {
        if (m->act)
            (void)cudaFree(m->act[l]);
        if (m->grad)
            (void)cudaFree(m->grad[l]);
    }
    (void)cudaFree(m->logits);
    (void)cudaFree(m->z);
    (void)cudaFree(m->ones);
    (void)cudaFree(m->stats);
    (void)cudaGetLastError();
    free(m->act);
    free(m->grad);
    free(m);
}

extern "C" int mlp_cuda_create(const mlp_config *cfg, int max_batch, void *stream, mlp_cuda **out)
{
    if (!cfg || !out || cfg->in_dim <= 0 || cfg->hidden <= 0 || cfg->layers < 1 ||
        cfg->classes < 2 || max_batch <= 0 || (cfg->bf16 != 0 && cfg->bf16 != 1))
        return fail(-EINVAL, "mlp_cuda_create: bad configuration");
    int rc = 0;
    size_t mb = (size_t)max_batch, width;
    mlp_cuda *m = (mlp_cuda *)calloc(1, sizeof *m);
    if (!m)
        return fail(-ENOMEM, "mlp_cuda_create: out of memory");
    m->cfg = *cfg;
    m->nlin = mlp_num_linear(cfg);
    m->max_batch = max_batch;
    m->B = -1;
    m->tsize = cfg->bf16 ? sizeof(bf16) : sizeof(float);
    m->ctype = cfg->bf16 ? CUDA_R_16BF : CUDA_R_32F;
    m->stream = (cudaStream_t)stream;
    m->act = (void **)calloc((size_t)m->nlin, sizeof *m->act);
    m->grad = (void **)calloc((size_t)m->nlin, sizeof *m->grad);
    if (!m->act || !m->grad) {
        rc = fail(-ENOMEM, "mlp_cuda_create: out of memory");
        goto out;
    }
    if ((rc = blas_open(m->stream, &m->blas)) < 0)
        goto out;
    width = (size_t)(cfg->hidden > cfg->classes ? cfg->hidden : cfg->classes);
    for (int l = 0; l < m->nlin; l++) {
        size_t n = mb * (size_t)mlp_layer_out(cfg, l);
        if (l < m->nlin - 1)
            CK_OUT(cudaMalloc(&m->act[l], n * m->tsize));
        CK_OUT(cudaMalloc(&m->grad[l], n * m->tsize));
    }
    CK_OUT(cudaMalloc((void **)&m->logits, mb * (size_t)cfg->classes * sizeof(float)));
    if (cfg->bf16)
        CK_OUT(cudaMalloc((void **)&m->z, mb * width * sizeof(float)));
    CK_OUT(cudaMalloc(&m->ones, mb * m->tsize));
    CK_OUT(cudaMalloc((void **)&m->stats, 2 * sizeof(dev_stats)));
    CK_OUT(cudaMemsetAsync(m->stats, 0, 2 * sizeof(dev_stats), m->stream));
    if (cfg->bf16) {
        fill_kernel<bf16><<<blocks_for(mb), THREADS, 0, m->stream>>>((bf16 *)m->ones, 1.0f, mb);
    } else {
        fill_kernel<float><<<blocks_for(mb), THREADS, 0, m->stream>>>((float *)m->ones, 1.0f, mb);
    }
    CK_OUT(cudaGetLastError());
    *out = m;
    return 0;
out:
    mlp_cuda_free(m);
    return rc;
}

/*
 * C (ldc) = A op B + beta C with f32 accumulation, column-major as cuBLAS sees it: op(A) (M, K),
 * op(B) (K, N) of the compute type, C (M, N) f32.
 */
static int gemm(mlp_cuda *m, cublasOperation_t ta, cublasOperation_t tb, int M, int N, int K,
                const void *A, int lda, const void *B, int ldb, float beta, float *C, int ldc)
{
    const float alpha = 1.0f;
    cublasStatus_t s = cublasGemmEx(m->blas, ta, tb, M, N, K, &alpha, A, m->ctype, lda, B,
                                    m->ctype, ldb, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT);
    return s == CUBLAS_STATUS_SUCCESS ? 0 : blas_fail(s, "cublasGemmEx");
}

/* The layer's parameters in the compute type; NULL if the hook did not hand them over. */
static const void *param_W(const mlp_cuda *m, const mlp_layer *io)
{
    return m->cfg.bf16 ? (const void *)io->W16 : (const void *)io->W;
}
static const void *param_b(const mlp_cuda *m, const mlp_layer *io)
{
    return m->cfg.bf16 ? (const void *)io->b16 : (const void *)io->b;
}

/* Layer l's forward over B >= 1 rows of `in` (B, in_l), type T: act[l] or logits. */
static int layer_forward(mlp_cuda *m, int l, const void *in, const void *W, const void *b, int B)
{
    int nin = mlp_layer_in(&m->cfg, l), nout = mlp_layer_out(&m->cfg, l);
    int last = l == m->nlin - 1;
    size_t n = (size_t)B * nout;
    /* y (B, out) row-major = y^T (out, B) column-major = W x^T: W row-major (out, in) is
       column-major (in, out), transposed; x row-major (B, in) is column-major (in, B). */
    float *y = last ? m->logits : m->cfg.bf16 ? m->z : (float *)m->act[l];
    int rc = gemm(m, CUBLAS_OP_T, CUBLAS_OP_N, nout, B, nin, W, nin, in, nin, 0.0f, y, nout);
    if (rc < 0)
        return rc;
    if (m->cfg.bf16 && last)
        LAUNCH(bias_act_kernel<bf16 COMMA float>, n, y, y, (const bf16 *)b, B, nout, 0);
    else if (m->cfg.bf16)
        LAUNCH(bias_act_kernel<bf16 COMMA bf16>, n, (bf16 *)m->act[l], y, (const bf16 *)b, B,
               nout, 1);
    else
        LAUNCH(bias_act_kernel<float COMMA float>, n, y, y, (const float *)b, B, nout, !last);
    return 0;
}

extern "C" int mlp_cuda_forward(mlp_cuda *m, const mlp_hooks *h, const void *x, const uint8_t *y,
                                int B, mlp_stats *stats)
{
    const mlp_config *c = &m->cfg;
    m->B = -1; /* no backward of a failed forward */
    if (B < 0 || B > m->max_batch || (B > 0 && !x))
        return fail(-EINVAL, "mlp_cuda_forward: %d rows (at most %d)", B, m->max_batch);
    dev_stats *acc = &m->stats[stats ? 1 : 0];
    if (stats)
        CK(cudaMemsetAsync(acc, 0, sizeof *acc, m->stream));
    const void *in = x; /* (B, in_l), type T */
    for (int l = 0; l < m->nlin; l++) {
        mlp_layer io;
        memset(&io, 0, sizeof io);
        int rc = h->begin(h->arg, l, 0, &io);
        if (rc < 0)
            return rc;
        if (B > 0) {
            const void *W = param_W(m, &io), *b = param_b(m, &io);
            if (!W || !b)
                return fail(-EINVAL, "layer %d: the hook handed over no parameters", l);
            if ((rc = layer_forward(m, l, in, W, b, B)) < 0)
                return rc;
        }
        if (h->end && (rc = h->end(h->arg, l, 0)) < 0)
            return rc;
        in = m->act[l];
    }
    if (y && B > 0) {
        softmax_xent_kernel<<<(unsigned)((B + THREADS - 1) / THREADS), THREADS, 0, m->stream>>>(
            m->logits, y, B, c->classes, acc);
        CK_LAUNCH("softmax_xent_kernel");
    }
    if (stats) {
        dev_stats got;
        CK(cudaMemcpyAsync(&got, acc, sizeof got, cudaMemcpyDeviceToHost, m->stream));
        CK(cudaStreamSynchronize(m->stream));
        if (got.bad)
            return fail(-EINVAL, "mlp_cuda_forward: %d labels out of range", got.bad);
        stats->loss_sum = got.loss;
        stats->correct = got.correct;
    }
    m->B = B;
    m->x = x;
    m->y = y;
    return 0;
}

extern "C" int mlp_cuda_backward(mlp_cuda *m, const mlp_hooks *h, float loss_scale)
{
    const mlp_config *c = &m->cfg;
    int B = m->B, L = m->nlin, bf = c->bf16;
    if (B < 0 || !m->y)
        return fail(-EINVAL, "mlp_cuda_backward: no forward with labels before");
    if (B > 0) {
        size_t n = (size_t)B * c->classes;
        if (bf)
            LAUNCH(xent_backward_kernel<bf16>, n, (bf16 *)m->grad[L - 1], m->logits, m->y, B,
                   c->classes, loss_scale);
        else
            LAUNCH(xent_backward_kernel<float>, n, (float *)m->grad[L - 1], m->logits, m->y, B,
                   c->classes, loss_scale);
    }
    for (int l = L - 1; l >= 0; l--) {
        int nin = mlp_layer_in(c, l), nout = mlp_layer_out(c, l);
        mlp_layer io;
        memset(&io, 0, sizeof io);
        int rc = h->begin(h->arg, l, 1, &io);
        if (rc < 0)
            return rc;
        if (B > 0) {
            const void *W = param_W(m, &io);
            const void *xin = l == 0 ? m->x : m->act[l - 1]; /* (B, in), type T */
            const void *dy = m->grad[l];                     /* (B, out), type T */
            if ((l > 0 && !W) || !io.dW || !io.db)
                return fail(-EINVAL, "layer %d: the hook handed over no parameters", l);
            /* dW (out, in) row-major = dW^T (in, out) column-major += x^T dy: x row-major
               (B, in) is column-major (in, B); dy row-major (B, out) is column-major (out, B),
               transposed. */
            if ((rc = gemm(m, CUBLAS_OP_N, CUBLAS_OP_T, nin, nout, B, xin, nin, dy, nout, 1.0f,
                           io.dW, nin)) < 0)
                return rc;
            /* db (out) += dy^T 1: dy column-major (out, B) times ones (B, 1). */
            if ((rc = gemm(m, CUBLAS_OP_N, CUBLAS_OP_N, nout, 1, B, dy, nout, m->ones, B, 1.0f,
                           io.db, nout)) < 0)
                return rc;
            if (l > 0) {
                /* dx (B, in) row-major = dx^T (in, B) column-major = W^T dy^T: W row-major
                   (out, in) is column-major (in, out); dy^T is column-major (out, B). */
                float *dx = bf ? m->z : (float *)m->grad[l - 1];
                if ((rc = gemm(m, CUBLAS_OP_N, CUBLAS_OP_N, nin, B, nout, W, nin, dy, nout, 0.0f,
                               dx, nin)) < 0)
                    return rc;
                size_t n = (size_t)B * nin;
                if (bf)
                    LAUNCH(relu_backward_kernel<bf16>, n, (bf16 *)m->grad[l - 1], dx,
                           (const bf16 *)m->act[l - 1], n);
                else
                    LAUNCH(relu_backward_kernel<float>, n, (float *)m->grad[l - 1], dx,
                           (const float *)m->act[l - 1], n);
            }
        }
        if (h->end && (rc = h->end(h->arg, l, 1)) < 0)
            return rc;
    }
    return 0;
}

extern "C" int mlp_cuda_stats_take(mlp_cuda *m, mlp_stats *out)
{
    dev_stats got;
    CK(cudaMemcpyAsync(&got, &m->stats[0], sizeof got, cudaMemcpyDeviceToHost, m->stream));
    CK(cudaMemsetAsync(&m->stats[0], 0, sizeof got, m->stream));
    CK(cudaStreamSynchronize(m->stream));
    if (got.bad)
        return fail(-EINVAL, "%d labels out of range since the last take", got.bad);
    out->loss_sum = got.loss;
    out->correct = got.correct;
    return 0;
}

extern "C" int mlp_cuda_output(mlp_cuda *m, float *out)
{
    if (m->B < 0)
        return fail(-EINVAL, "mlp_cuda_output: no forward");
    return mlp_cuda_to_host(out, m->logits, (size_t)m->B * m->cfg.classes * sizeof(float),
                            m->stream);
}

/* ------------------------------------------------------------------------------------------ */
/* Data on the device                                                                          */
/* ------------------------------------------------------------------------------------------ */

/*
 * Two index slots, used in turn. Slot s's pinned buffer is rewritten only after its previous
 * copy has run (copied[s], a host wait that the copy of two batches before long passed), and
 * its device buffer only after the gather that read it (gathered[s], waited for on the copy
 * stream). The gather waits for copied[s] on the compute stream.
 */
struct mlp_cuda_data {
    int n, dim, max_batch, bf16;
    cudaStream_t stream; /* borrowed: the compute stream */
    cudaStream_t copy;   /* owned: the index copies */
    uint8_t *pix, *lab;  /* (n, dim), (n) */
    void *x;             /* (max_batch, dim), f32 or bf16 */
    uint8_t *y;          /* (max_batch) */
    int32_t *host_idx[2], *dev_idx[2];
    cudaEvent_t copied[2], gathered[2];
    int slot;
};

extern "C" void mlp_cuda_data_free(mlp_cuda_data *d)
{
    if (!d)
        return;
    if (d->copy) {
        (void)cudaStreamSynchronize(d->copy);
        (void)cudaStreamDestroy(d->copy);
    }
    (void)cudaStreamSynchronize(d->stream);
    for (int s = 0; s < 2; s++) {
        (void)cudaFreeHost(d->host_idx[s]);
        (void)cudaFree(d->dev_idx[s]);
        if (d->copied[s])
            (void)cudaEventDestroy(d->copied[s]);
        if (d->gathered[s])
            (void)cudaEventDestroy(d->gathered[s]);
    }
    (void)cudaFree(d->pix);
    (void)cudaFree(d->lab);
    (void)cudaFree(d->x);
    (void)cudaFree(d->y);
    (void)cudaGetLastError();
    free(d);
}

extern "C" int mlp_cuda_data_create(const uint8_t *pixels, const uint8_t *labels, int n, int dim,
                                    int max_batch, int use_bf16, void *stream,
                                    mlp_cuda_data **out)
{
    if (!pixels || !labels || n <= 0 || dim <= 0 || max_batch <= 0 ||
        (use_bf16 != 0 && use_bf16 != 1) || !out)
        return fail(-EINVAL, "mlp_cuda_data_create: bad argument");
    int rc = 0;
    size_t npix = (size_t)n * dim, tsize = use_bf16 ? sizeof(bf16) : sizeof(float);
    mlp_cuda_data *d = (mlp_cuda_data *)calloc(1, sizeof *d);
    if (!d)
        return fail(-ENOMEM, "mlp_cuda_data_create: out of memory");
    d->n = n;
    d->dim = dim;
    d->max_batch = max_batch;
    d->bf16 = use_bf16;
    d->stream = (cudaStream_t)stream;
    CK_OUT(cudaStreamCreateWithFlags(&d->copy, cudaStreamNonBlocking));
    CK_OUT(cudaMalloc((void **)&d->pix, npix));
    CK_OUT(cudaMalloc((void **)&d->lab, (size_t)n));
    CK_OUT(cudaMalloc(&d->x, (size_t)max_batch * dim * tsize));
    CK_OUT(cudaMalloc((void **)&d->y, (size_t)max_batch));
    for (int s = 0; s < 2; s++) {
        CK_OUT(cudaMallocHost((void **)&d->host_idx[s], (size_t)max_batch * sizeof(int32_t)));
        CK_OUT(cudaMalloc((void **)&d->dev_idx[s], (size_t)max_batch * sizeof(int32_t)));
        CK_OUT(cudaEventCreateWithFlags(&d->copied[s], cudaEventDisableTiming));
        CK_OUT(cudaEventCreateWithFlags(&d->gathered[s], cudaEventDisableTiming));
    }
    /* Once, at set-up: synchronous copies from pageable memory are fine here. */
    CK_OUT(cudaMemcpy(d->pix, pixels, npix, cudaMemcpyHostToDevice));
    CK_OUT(cudaMemcpy(d->lab, labels, (size_t)n, cudaMemcpyHostToDevice));
    *out = d;
    return 0;
out:
    mlp_cuda_data_free(d);
    return rc;
}

extern "C" int mlp_cuda_data_batch(mlp_cuda_data *d, const int32_t *idx, int start, int count,
                                   const void **x, const uint8_t **y)
{
    if (count < 0 || count > d->max_batch)
        return fail(-EINVAL, "mlp_cuda_data_batch: %d rows (at most %d)", count, d->max_batch);
    if (idx) {
        for (int i = 0; i < count; i++)
            if (idx[i] < 0 || idx[i] >= d->n)
                return fail(-EINVAL, "mlp_cuda_data_batch: row %d out of [0, %d)", idx[i], d->n);
    } else if (start < 0 || start > d->n - count) {
        return fail(-EINVAL, "mlp_cuda_data_batch: rows [%d, %d) out of [0, %d)", start,
                    start + count, d->n);
    }
    *x = d->x;
    *y = d->y;
    if (count == 0)
        return 0;
    const int32_t *didx = NULL;
    int s = d->slot;
    if (idx) {
        d->slot ^= 1;
        CK(cudaEventSynchronize(d->copied[s]));
        memcpy(d->host_idx[s], idx, (size_t)count * sizeof(int32_t));
        CK(cudaStreamWaitEvent(d->copy, d->gathered[s], 0));
        CK(cudaMemcpyAsync(d->dev_idx[s], d->host_idx[s], (size_t)count * sizeof(int32_t),
                           cudaMemcpyHostToDevice, d->copy));
        CK(cudaEventRecord(d->copied[s], d->copy));
        CK(cudaStreamWaitEvent(d->stream, d->copied[s], 0));
        didx = d->dev_idx[s];
    }
    size_t n = (size_t)count * d->dim;
    if (d->bf16)
        gather_kernel<bf16><<<blocks_for(n), THREADS, 0, d->stream>>>(
            (bf16 *)d->x, d->y, d->pix, d->lab, didx, start, count, d->dim);
    else
        gather_kernel<float><<<blocks_for(n), THREADS, 0, d->stream>>>(
            (float *)d->x, d->y, d->pix, d->lab, didx, start, count, d->dim);
    CK_LAUNCH("gather_kernel");
    if (idx)
        CK(cudaEventRecord(d->gathered[s], d->stream));
    return 0;
}
