/*
 * cuda_common.cuh: what ddp-train's device code (mlp_cuda.cu, gpt_cuda.cu) shares, for nvcc
 * only: the translation of CUDA and cuBLAS failures into COLL_ECUDA with a sentence in the
 * thread's last error (one buffer for every file, mlp_cuda_last_error() reads it), the checks
 * after calls and launches, grid-stride launches, bf16 conversions, and the kernels both models
 * use (a fill, and the softmax cross-entropy of mlp_xent.h with its gradient).
 *
 * Every kernel here is static: each .cu file that includes this header has its own copy (no
 * relocatable device code is linked).
 *
 * With DDP_CUDA_EMULATE (tests/trainer/cuda_emu: a host C++ compiler, that folder's headers in
 * place of CUDA's) LAUNCH runs a kernel's threads on the host one after the other, and the
 * kernels whose threads communicate (softmax_xent_kernel's warp shuffles) are left out.
 */
#ifndef DDP_TRAIN_CUDA_COMMON_CUH
#define DDP_TRAIN_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "coll.h"
#include "mlp_xent.h"

typedef __nv_bfloat16 bf16;

/* The calling thread's last-error buffer (mlp_cuda.cu; mlp_cuda_last_error() reads it). */
char *mlp_cuda__error_buffer(size_t *cap);

/* rc, with the sentence in the thread's last error. */
__attribute__((format(printf, 2, 3))) static int fail(int rc, const char *fmt, ...)
{
    size_t cap;
    char *buf = mlp_cuda__error_buffer(&cap);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
    return rc;
}

/* A CUDA failure: COLL_ECUDA with the call and CUDA's message; the sticky error is cleared. */
static int cuda_fail(cudaError_t e, const char *what)
{
    (void)cudaGetLastError();
    return fail(COLL_ECUDA, "%s: %s", what, cudaGetErrorString(e));
}

static int blas_fail(cublasStatus_t s, const char *what)
{
    return fail(COLL_ECUDA, "%s: cuBLAS: %s", what, cublasGetStatusString(s));
}

/* A cuBLAS handle whose work goes on `stream`: 0 with *out set (cublasDestroy() releases it), or
 * COLL_ECUDA with nothing kept. */
static int blas_open(cudaStream_t stream, cublasHandle_t *out)
{
    cublasHandle_t h;
    cublasStatus_t s = cublasCreate(&h);
    if (s != CUBLAS_STATUS_SUCCESS)
        return blas_fail(s, "cublasCreate");
    if ((s = cublasSetStream(h, stream)) != CUBLAS_STATUS_SUCCESS) {
        (void)cublasDestroy(h);
        return blas_fail(s, "cublasSetStream");
    }
    *out = h;
    return 0;
}

/* Return COLL_ECUDA from the enclosing function (or jump to its `out`) on a CUDA failure. */
#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return cuda_fail(e_, #call);                                                           \
    } while (0)
#define CK_OUT(call)                                                                               \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            rc = cuda_fail(e_, #call);                                                             \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)
/* After a kernel launch: the launch's own error (bad configuration, no kernel image). */
#define CK_LAUNCH(name)                                                                            \
    do {                                                                                           \
        cudaError_t e_ = cudaGetLastError();                                                       \
        if (e_ != cudaSuccess)                                                                     \
            return cuda_fail(e_, "launching " name);                                               \
    } while (0)

constexpr int THREADS = 256;
constexpr size_t MAX_BLOCKS = 65535;

/* Blocks for a grid-stride loop over n >= 1 elements. */
static unsigned blocks_for(size_t n)
{
    size_t b = (n + THREADS - 1) / THREADS;
    return (unsigned)(b < MAX_BLOCKS ? b : MAX_BLOCKS);
}

__device__ __forceinline__ float widen(float v)
{
    return v;
}
__device__ __forceinline__ float widen(bf16 v)
{
    return __bfloat162float(v);
}
template <typename T> __device__ __forceinline__ T narrow(float v);
template <> __device__ __forceinline__ float narrow<float>(float v)
{
    return v;
}
/* Round to nearest even, as bf16conv.h's bf16_from_f32() on the host. */
template <> __device__ __forceinline__ bf16 narrow<bf16>(float v)
{
    return __float2bfloat16_rn(v);
}

#define GRID_STRIDE(i, n)                                                                          \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                        \
         i += (size_t)gridDim.x * blockDim.x)

/* dy (B, C) = scale * (p - onehot(y)) rounded to T; p (B, C) the probabilities. */
template <typename T>
static __global__ void xent_backward_kernel(T *dy, const float *p, const uint8_t *y, int B, int C,
                                            float scale)
{
    size_t n = (size_t)B * C;
    GRID_STRIDE(e, n)
    {
        int i = (int)(e / C), j = (int)(e % C);
        dy[e] = narrow<T>(scale * (p[e] - (j == y[i] ? 1.0f : 0.0f)));
    }
}

template <typename T> static __global__ void fill_kernel(T *a, float v, size_t n)
{
    GRID_STRIDE(e, n)
    {
        a[e] = narrow<T>(v);
    }
}

struct dev_stats {
    double loss; /* sum of -log p[label] */
    int correct; /* rows whose first maximal logit is the label */
    int bad;     /* rows whose label is out of range */
};

#ifndef DDP_CUDA_EMULATE /* warp shuffles: no host emulation */
/*
 * Softmax cross-entropy, in place: logits (B, C) become probabilities, one thread per row
 * running mlp_xent_row(), mlp.c's arithmetic (the row's maximum subtracted, f32). Each block
 * sums its rows' losses (f64) and correct counts with warp shuffles and adds them to *acc
 * once. A row whose label is not below C counts in acc->bad and is left alone. Every thread
 * of the block reaches the shuffles and the barrier (no early return); blockDim.x is THREADS.
 */
static __global__ void softmax_xent_kernel(float *logits, const uint8_t *y, int B, int C,
                                           dev_stats *acc)
{
    __shared__ double s_loss[THREADS / 32];
    __shared__ int s_correct[THREADS / 32], s_bad[THREADS / 32];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    double loss = 0;
    int correct = 0, bad = 0;
    if (i < B) {
        int label = y[i];
        if (label >= C)
            bad = 1;
        else
            loss = mlp_xent_row(logits + (size_t)i * C, C, label, &correct);
    }
    for (int off = 16; off > 0; off >>= 1) {
        loss += __shfl_down_sync(0xffffffffu, loss, off);
        correct += __shfl_down_sync(0xffffffffu, correct, off);
        bad += __shfl_down_sync(0xffffffffu, bad, off);
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        s_loss[warp] = loss;
        s_correct[warp] = correct;
        s_bad[warp] = bad;
    }
    __syncthreads();
    if (warp == 0) {
        int nwarps = blockDim.x / 32;
        loss = lane < nwarps ? s_loss[lane] : 0;
        correct = lane < nwarps ? s_correct[lane] : 0;
        bad = lane < nwarps ? s_bad[lane] : 0;
        for (int off = 16; off > 0; off >>= 1) {
            loss += __shfl_down_sync(0xffffffffu, loss, off);
            correct += __shfl_down_sync(0xffffffffu, correct, off);
            bad += __shfl_down_sync(0xffffffffu, bad, off);
        }
        if (lane == 0) {
            atomicAdd(&acc->loss, loss);
            atomicAdd(&acc->correct, correct);
            if (bad)
                atomicAdd(&acc->bad, bad);
        }
    }
}
#endif

/* Launches a kernel over n >= 1 elements on the model's stream and checks the launch. COMMA
   separates a template's arguments inside the macro's first argument; KERNEL_NAME spells the
   kernel with the comma (expanded before it is made a string). */
#define COMMA ,
#define KERNEL_NAME_(...) #__VA_ARGS__
#define KERNEL_NAME(...) KERNEL_NAME_(__VA_ARGS__)
#ifdef DDP_CUDA_EMULATE /* tests/trainer/cuda_emu: the threads run on the host, one by one */
#define LAUNCH(kernel, n, ...)                                                                     \
    do {                                                                                           \
        (void)m->stream;                                                                           \
        cuda_emu_launch(blocks_for(n), THREADS, [&] { kernel(__VA_ARGS__); });                     \
        CK_LAUNCH(KERNEL_NAME(kernel));                                                            \
    } while (0)
#else
#define LAUNCH(kernel, n, ...)                                                                     \
    do {                                                                                           \
        kernel<<<blocks_for(n), THREADS, 0, m->stream>>>(__VA_ARGS__);                             \
        CK_LAUNCH(KERNEL_NAME(kernel));                                                            \
    } while (0)
#endif

#endif /* DDP_TRAIN_CUDA_COMMON_CUH */
