/*
 * cuda_emu: the few calls of the CUDA runtime and cuBLAS that ddp-train's GPT on the device
 * (worker/trainer/gpt_cuda.cu) makes, emulated on the host, so that a machine without a GPU
 * runs that file's code (compiled by the C++ compiler with -DDDP_CUDA_EMULATE and this folder
 * first on the include path) against gpt.c: its indexing, the arguments it gives cuBLAS, its
 * buffers and the order of its hooks. Not a CUDA: memory is host memory (cudaMalloc fills it
 * with 0xff bytes, a NaN in f32 and bf16, so that reading what nothing wrote shows), streams and
 * events are no-ops, every call runs at once, and a kernel launch runs its threads one after the
 * other (cuda_common.cuh's LAUNCH under DDP_CUDA_EMULATE), which is right for kernels whose
 * threads do not communicate (gpt_cuda.cu's). cuBLAS's products are computed by the textbook
 * column-major definition (cuda_emu.cc), independent of gpt_cuda.cu's row-major mapping.
 *
 * C (for the tests, which call cudaMalloc and friends) and C++ (for gpt_cuda.cu).
 */
#ifndef DDP_CUDA_EMU_RUNTIME_H
#define DDP_CUDA_EMU_RUNTIME_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2
} cudaError_t;
typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost,
    cudaMemcpyHostToDevice,
    cudaMemcpyDeviceToHost,
    cudaMemcpyDeviceToDevice,
    cudaMemcpyDefault
} cudaMemcpyKind;
typedef struct cuda_emu_stream *cudaStream_t;
typedef struct cuda_emu_event *cudaEvent_t;
#define cudaEventDisableTiming 2u
#define cudaStreamNonBlocking 1u

const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t n);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t s);
cudaError_t cudaMemset(void *p, int v, size_t n);
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
/* Bytes cudaMalloc handed out and not freed, for the tests' leak check. */
size_t cuda_emu_allocated(void);

#ifdef __cplusplus
}

/* The kernels' view of their launch: set by cuda_emu_launch() for each thread in turn. */
struct cuda_emu_dim3 {
    unsigned x, y, z;
};
inline thread_local cuda_emu_dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline

/* Runs f() for every thread of `blocks` blocks of `threads`, one after the other. */
template <typename F> static void cuda_emu_launch(unsigned blocks, unsigned threads, F f)
{
    gridDim = {blocks, 1, 1};
    blockDim = {threads, 1, 1};
    for (unsigned b = 0; b < blocks; b++)
        for (unsigned t = 0; t < threads; t++) {
            blockIdx = {b, 0, 0};
            threadIdx = {t, 0, 0};
            f();
        }
}
#endif

#endif /* DDP_CUDA_EMU_RUNTIME_H */
