/* cuda_emu (cuda_runtime.h): the cuBLAS calls gpt_cuda.cu makes, on the host (cuda_emu.cc). */
#ifndef DDP_CUDA_EMU_CUBLAS_H
#define DDP_CUDA_EMU_CUBLAS_H

#include "cuda_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_INVALID_VALUE = 7 } cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16BF = 14 } cudaDataType_t;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
typedef struct cuda_emu_blas *cublasHandle_t;

cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
const char *cublasGetStatusString(cublasStatus_t s);
/* C = alpha op(A) op(B) + beta C, column-major; A and B f32 or bf16 alike, C f32. */
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType_t at,
                            int lda, const void *B, cudaDataType_t bt, int ldb, const void *beta,
                            void *C, cudaDataType_t ct, int ldc, cublasComputeType_t comp,
                            cublasGemmAlgo_t algo);
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta,
                                          cublasOperation_t tb, int m, int n, int k,
                                          const void *alpha, const void *A, cudaDataType_t at,
                                          int lda, long long sa, const void *B, cudaDataType_t bt,
                                          int ldb, long long sb, const void *beta, void *C,
                                          cudaDataType_t ct, int ldc, long long sc, int batch,
                                          cublasComputeType_t comp, cublasGemmAlgo_t algo);

#ifdef __cplusplus
}
#endif

#endif /* DDP_CUDA_EMU_CUBLAS_H */
