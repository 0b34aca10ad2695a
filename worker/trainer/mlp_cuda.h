/*
 * mlp_cuda: ddp-train's MLP (mlp.h) on a CUDA device, and its data on the device.
 *
 * The same model, hooks and layout as mlp.h, with device pointers: the hooks hand over each
 * linear layer's parameters (io.W and io.b for an f32 model, io.W16 and io.b16 in bf16 for a
 * bf16 one) and gradient buffers (io.dW, io.db, always f32) in device memory, and the work of a
 * layer is enqueued on the model's stream between the layer's begin and end. Pointers a hook
 * hands over must stay valid until the stream has run that work (libddp orders its reuse of
 * its buffers after the work on the stream it is given; mark a gradient ready only after its
 * kernels are enqueued, which end() is).
 *
 * Computation: the matrix products are cublasGemmEx with CUBLAS_COMPUTE_32F (f32 accumulation,
 * no TF32), f32 or bf16 inputs and f32 outputs; kernels add the bias and apply ReLU (rounding
 * the activation to bf16 in a bf16 model), compute the softmax cross-entropy in f32 (loss sum in
 * f64 and correct count accumulated on the device, read back only by mlp_cuda_stats_take()),
 * its gradient (rounded to bf16 in a bf16 model), and ReLU's backward. The bias gradient is a
 * product with a vector of ones. mlp.c's bf16 mode rounds the same values at the same places.
 *
 * Data: mlp_cuda_data holds a data set's pixels (uint8) and labels on the device, uploaded
 * once; a batch is gathered and normalised on the device (as data.h normalises on the host)
 * from indices that go pageable -> pinned host memory -> device on a copy stream of its own,
 * an event ordering the gather on the compute stream after the copy.
 *
 * Built only with CUDA; in a build without it (mlp_cuda_stub.c) mlp_cuda_built() and
 * mlp_cuda_device_count() return 0 and everything else -ENOTSUP.
 *
 * Conventions: functions that can fail return 0 or a negative code: -EINVAL, -ENOMEM,
 * -ENOTSUP, COLL_ECUDA (a CUDA or cuBLAS failure: mlp_cuda_last_error() names the call and
 * CUDA's message; the model or data set is unusable after it), or a hook's own code. The
 * calling thread's current device must be the one the objects were created on
 * (mlp_cuda_open()). One thread at a time per object.
 */
#ifndef DDP_TRAIN_MLP_CUDA_H
#define DDP_TRAIN_MLP_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "mlp.h"

/* 1 when built with CUDA, else 0. */
int mlp_cuda_built(void);

/* CUDA devices this process can use; 0 without a driver, a device, or CUDA in the build. */
int mlp_cuda_device_count(void);

/* The calling thread's last failure sentence ("" if none). */
const char *mlp_cuda_last_error(void);

/*
 * Makes `device` the calling thread's current device, creates a non-blocking stream on it and
 * writes the device's name into name[cap] (may be NULL). Returns 0 and sets *stream (a
 * cudaStream_t), -EINVAL, -ENOTSUP (no CUDA in the build, or a GPU whose architecture the
 * build has no kernels for: the sentence names its compute capability) or COLL_ECUDA.
 */
int mlp_cuda_open(int device, void **stream, char *name, size_t cap);

/*
 * Writes the 16 bytes of `device`'s UUID (cudaDeviceProp.uuid: the bytes of nvidia-smi's
 * "GPU-..." name, unique across hosts) into uuid[16]. Returns 0, -EINVAL, -ENOTSUP (no CUDA in
 * the build) or COLL_ECUDA.
 */
int mlp_cuda_device_uuid(int device, uint8_t uuid[16]);

/*
 * Writes the bytes in use on `device` by every process (cudaMemGetInfo(): total minus free)
 * into *used. Returns 0, -EINVAL, -ENOTSUP (no CUDA in the build) or COLL_ECUDA.
 */
int mlp_cuda_memory_used(int device, size_t *used);

/* Waits for the stream and destroys it. NULL is a no-op. */
void mlp_cuda_close(void *stream);

/*
 * Copies nbytes of device memory at src to host memory at dst after the work enqueued on
 * `stream` so far, and waits for it. Returns 0, -ENOTSUP or COLL_ECUDA.
 */
int mlp_cuda_to_host(void *dst, const void *src, size_t nbytes, void *stream);

/* ------------------------------------------------------------------------------------------ */
/* The model                                                                                   */
/* ------------------------------------------------------------------------------------------ */

typedef struct mlp_cuda mlp_cuda;

/*
 * Creates a model for batches of up to max_batch rows on the current device, its work
 * enqueued on `stream` (borrowed, a cudaStream_t; NULL: the legacy default stream). Validates
 * `cfg` (copied; cfg->bf16 picks the precision) and allocates the activations, gradients and
 * accumulators in device memory once. Returns 0 and sets *out, -EINVAL, -ENOTSUP or COLL_ECUDA.
 */
int mlp_cuda_create(const mlp_config *cfg, int max_batch, void *stream, mlp_cuda **out);

/* Waits for the stream, frees the model. NULL is a no-op. */
void mlp_cuda_free(mlp_cuda *m);

/*
 * Enqueues a forward pass over x (device, (B, in_dim), f32 or bf16 as the model) with labels y
 * (device, (B), each below cfg.classes; NULL: logits only, no loss, no backward), both
 * borrowed until mlp_cuda_backward() returns and the stream has run it. B may be 0 (the hooks
 * still run). The loss and correct count are added to the model's accumulators on the
 * device (stats NULL, no host wait), or, with stats, returned for this pass alone after
 * waiting for the stream. Returns 0, -EINVAL (B out of [0, max_batch]; with stats, a label out
 * of range), COLL_ECUDA or a hook's code.
 */
int mlp_cuda_forward(mlp_cuda *m, const mlp_hooks *h, const void *x, const uint8_t *y, int B,
                     mlp_stats *stats);

/*
 * Enqueues the backward of the latest forward (which had labels) for the loss loss_scale *
 * sum of cross-entropies, adding each layer's gradients into its io.dW and io.db. Returns 0,
 * -EINVAL (no forward with labels before), COLL_ECUDA or a hook's code.
 */
int mlp_cuda_backward(mlp_cuda *m, const mlp_hooks *h, float loss_scale);

/*
 * Waits for the stream, writes the accumulated loss sum and correct count of the forward
 * passes since the last take into *out and resets them. Returns 0, -EINVAL (a pass met a label
 * out of range; the accumulators are reset) or COLL_ECUDA.
 */
int mlp_cuda_stats_take(mlp_cuda *m, mlp_stats *out);

/*
 * Copies the latest forward's output, (B, classes) f32 logits or (after a forward with labels)
 * probabilities, to host memory `out`, waiting for the stream. Returns 0, -EINVAL (no forward)
 * or COLL_ECUDA.
 */
int mlp_cuda_output(mlp_cuda *m, float *out);

/* ------------------------------------------------------------------------------------------ */
/* Data on the device                                                                          */
/* ------------------------------------------------------------------------------------------ */

typedef struct mlp_cuda_data mlp_cuda_data;

/*
 * Uploads n samples, pixels (n, dim) and labels (n) (host memory, borrowed for the call), to
 * the current device, with batch buffers for up to max_batch rows in f32 or (bf16 = 1) bf16.
 * Batches are gathered on `stream` (borrowed; the model's). Returns 0 and sets *out, -EINVAL,
 * -ENOTSUP or COLL_ECUDA.
 */
int mlp_cuda_data_create(const uint8_t *pixels, const uint8_t *labels, int n, int dim,
                         int max_batch, int bf16, void *stream, mlp_cuda_data **out);

/* Waits for both streams, frees the data set. NULL is a no-op. */
void mlp_cuda_data_free(mlp_cuda_data *d);

/*
 * Enqueues the gathering of `count` rows, normalised by data.h's data_normalize() (rounded to
 * bf16 after it in a bf16 data set), into the batch buffers: rows idx[0..count) (host memory, copied during the call;
 * each in [0, n)), or with idx NULL rows [start, start + count). Sets *x ((count, dim), f32 or
 * bf16) and *y ((count)) to the device buffers, valid until the next call (the stream orders
 * that call's gather after the work enqueued in between). The host waits only for the index
 * copy of two calls before. Returns 0, -EINVAL (count out of [0, max_batch], a row out of
 * range) or COLL_ECUDA.
 */
int mlp_cuda_data_batch(mlp_cuda_data *d, const int32_t *idx, int start, int count,
                        const void **x, const uint8_t **y);

#ifdef __cplusplus
}
#endif

#endif /* DDP_TRAIN_MLP_CUDA_H */
