/*
 * cuda_emu (cuda_runtime.h): the CUDA runtime, cuBLAS and the device calls of mlp_cuda.h that
 * gpt_cuda.cu and tests/trainer/test_gpt_cuda.c use, on the host. Memory is the C heap (so
 * AddressSanitizer, when the test is built with it, sees every buffer's bounds); products are
 * the column-major definition, summed in f32 in order of k.
 */
#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "cuda_runtime.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "mlp_cuda.h"
}

static size_t allocated;

extern "C" size_t cuda_emu_allocated(void)
{
    return allocated;
}

extern "C" const char *cudaGetErrorString(cudaError_t e)
{
    return e == cudaSuccess                 ? "no error"
           : e == cudaErrorMemoryAllocation ? "out of memory"
                                            : "invalid argument";
}

extern "C" cudaError_t cudaGetLastError(void)
{
    return cudaSuccess;
}

/* Each allocation is preceded by its size, for the leak count. */
extern "C" cudaError_t cudaMalloc(void **p, size_t n)
{
    if (!p || n == 0)
        return cudaErrorInvalidValue;
    size_t *a = (size_t *)malloc(n + 16);
    if (!a)
        return cudaErrorMemoryAllocation;
    a[0] = n;
    memset(a + 2, 0xff, n); /* NaN in f32 and bf16: what nothing wrote shows when read */
    allocated += n;
    *p = a + 2;
    return cudaSuccess;
}

extern "C" cudaError_t cudaFree(void *p)
{
    if (p) {
        size_t *a = (size_t *)p - 2;
        allocated -= a[0];
        free(a);
    }
    return cudaSuccess;
}

extern "C" cudaError_t cudaMallocHost(void **p, size_t n)
{
    return cudaMalloc(p, n);
}

extern "C" cudaError_t cudaFreeHost(void *p)
{
    return cudaFree(p);
}

extern "C" cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k)
{
    (void)k;
    if (n && (!dst || !src))
        return cudaErrorInvalidValue;
    memmove(dst, src, n);
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k,
                                       cudaStream_t s)
{
    (void)s;
    return cudaMemcpy(dst, src, n, k);
}

extern "C" cudaError_t cudaMemset(void *p, int v, size_t n)
{
    if (n && !p)
        return cudaErrorInvalidValue;
    memset(p, v, n);
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s)
{
    (void)s;
    return cudaMemset(p, v, n);
}

extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    (void)s;
    return cudaSuccess;
}

static struct cuda_emu_event {
    int unused;
} the_event;

extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    (void)flags;
    *e = &the_event;
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    (void)e;
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    (void)e, (void)s;
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    (void)e;
    return cudaSuccess;
}

/* ------------------------------------------------------------------------------------------ */
/* cuBLAS                                                                                      */
/* ------------------------------------------------------------------------------------------ */

static struct cuda_emu_blas {
    int unused;
} the_blas;

extern "C" cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    *h = &the_blas;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    (void)h;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
    (void)h, (void)s;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" const char *cublasGetStatusString(cublasStatus_t s)
{
    return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_INVALID_VALUE";
}

/* Element (i, j) of column-major X (ld), f32 or bf16. */
static float elem(const void *X, cudaDataType_t t, int ld, int i, int j)
{
    size_t at = (size_t)j * ld + i;
    return t == CUDA_R_16BF ? __bfloat162float(((const __nv_bfloat16 *)X)[at])
                            : ((const float *)X)[at];
}

/* cuBLAS's argument checks (the leading dimensions cover the stored rows), then the product. */
static cublasStatus_t gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           float alpha, const void *A, cudaDataType_t at, int lda, const void *B,
                           cudaDataType_t bt, int ldb, float beta, float *C, cudaDataType_t ct,
                           int ldc, cublasComputeType_t comp)
{
    int arows = ta == CUBLAS_OP_N ? m : k, brows = tb == CUBLAS_OP_N ? k : n;
    if (m < 0 || n < 0 || k < 0 || lda < (arows > 1 ? arows : 1) || ldb < (brows > 1 ? brows : 1) ||
        ldc < (m > 1 ? m : 1) || at != bt || ct != CUDA_R_32F || comp != CUBLAS_COMPUTE_32F ||
        (at != CUDA_R_32F && at != CUDA_R_16BF)) {
        fprintf(stderr,
                "cuda_emu: cublasGemmEx: bad arguments m %d n %d k %d lda %d ldb %d "
                "ldc %d\n",
                m, n, k, lda, ldb, ldc);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float s = 0.0f;
            for (int p = 0; p < k; p++) {
                float a = ta == CUBLAS_OP_N ? elem(A, at, lda, i, p) : elem(A, at, lda, p, i);
                float b = tb == CUBLAS_OP_N ? elem(B, bt, ldb, p, j) : elem(B, bt, ldb, j, p);
                s += a * b;
            }
            float *c = C + (size_t)j * ldc + i;
            *c = beta == 0.0f ? alpha * s : alpha * s + beta * *c; /* beta 0: C is not read */
        }
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                       int m, int n, int k, const void *alpha, const void *A,
                                       cudaDataType_t at, int lda, const void *B, cudaDataType_t bt,
                                       int ldb, const void *beta, void *C, cudaDataType_t ct,
                                       int ldc, cublasComputeType_t comp, cublasGemmAlgo_t algo)
{
    (void)h, (void)algo;
    return gemm(ta, tb, m, n, k, *(const float *)alpha, A, at, lda, B, bt, ldb,
                *(const float *)beta, (float *)C, ct, ldc, comp);
}

extern "C" cublasStatus_t
cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const void *alpha, const void *A, cudaDataType_t at,
                           int lda, long long sa, const void *B, cudaDataType_t bt, int ldb,
                           long long sb, const void *beta, void *C, cudaDataType_t ct, int ldc,
                           long long sc, int batch, cublasComputeType_t comp, cublasGemmAlgo_t algo)
{
    (void)h, (void)algo;
    size_t es = at == CUDA_R_16BF ? 2 : 4;
    if (batch < 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    for (int i = 0; i < batch; i++) {
        cublasStatus_t s =
            gemm(ta, tb, m, n, k, *(const float *)alpha, (const char *)A + (size_t)(i * sa) * es,
                 at, lda, (const char *)B + (size_t)(i * sb) * es, bt, ldb, *(const float *)beta,
                 (float *)C + (size_t)(i * sc), ct, ldc, comp);
        if (s != CUBLAS_STATUS_SUCCESS)
            return s;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* mlp_cuda.h's device calls that gpt_cuda.cu and the test use                                 */
/* ------------------------------------------------------------------------------------------ */

static thread_local char last_err[512];

char *mlp_cuda__error_buffer(size_t *cap)
{
    *cap = sizeof last_err;
    return last_err;
}

extern "C" const char *mlp_cuda_last_error(void)
{
    return last_err;
}

extern "C" int mlp_cuda_built(void)
{
    return 1;
}

extern "C" int mlp_cuda_device_count(void)
{
    return 1;
}

extern "C" int mlp_cuda_open(int device, void **stream, char *name, size_t cap)
{
    if (device != 0 || !stream)
        return -EINVAL;
    *stream = NULL;
    if (name && cap)
        snprintf(name, cap, "cuda_emu (the host, no GPU)");
    return 0;
}

extern "C" void mlp_cuda_close(void *stream)
{
    (void)stream;
}

extern "C" int mlp_cuda_to_host(void *dst, const void *src, size_t nbytes, void *stream)
{
    (void)stream;
    memcpy(dst, src, nbytes);
    return 0;
}
