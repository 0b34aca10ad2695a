/*
 * gpt_cuda: ddp-train's GPT (gpt.h) on a CUDA device.
 *
 * The same model, units, hooks and pass order as gpt.h, with device pointers: the hooks hand
 * over each unit's parameters (f32, or bf16 bit patterns with cfg.bf16) and gradient buffers
 * (f32, added into) in device memory, and a unit's work is enqueued on the model's stream
 * between its begin and end (pointers must stay valid until the stream has run it, as for
 * mlp_cuda.h). The tokens come from host memory: each forward copies the bytes of its rows to
 * the device through a pinned buffer on the stream, so the caller's array is free when the
 * call returns.
 *
 * Computation: every matrix product is a cublasGemmEx (attention's per-head products
 * cublasGemmStridedBatchedEx over the sequences) with CUBLAS_COMPUTE_32F (f32 accumulation, no
 * TF32), f32 or bf16 inputs and f32 outputs; written kernels compute the embedding lookup and
 * its backward, the LayerNorms, the causal softmax and its backward, GELU and its backward, the
 * biases, the residual adds and the softmax cross-entropy (mlp_xent.h's row, as the host's).
 * gpt.c's bf16 rounding points are the device's: the values gpt.h lists are stored in bf16,
 * products, the residual stream, LayerNorm, softmax and GELU arithmetic, the loss and the
 * parameter gradients are f32. The kernels sum in gpt.c's order (one thread per row or per
 * column where gpt.c loops over a row or adds rows up) and nvcc contracts nothing into fused
 * multiply-adds in this file, so they differ from the host only in the exponential (CUDA's
 * expf against gpt.c's polynomial, a few ulp) and the products in the order of cuBLAS's sums.
 * The loss and correct count accumulate on the device until gpt_cuda_stats_take().
 *
 * Built only with CUDA; in a build without it (gpt_cuda_stub.c) every call fails with
 * -ENOTSUP. Errors: 0 or a negative code: -EINVAL, -ENOMEM, -ENOTSUP, COLL_ECUDA (a CUDA or
 * cuBLAS failure: mlp_cuda_last_error() names the call and CUDA's message; the model is
 * unusable after it), or a hook's own code; mlp_cuda_last_error() says why for the model's own
 * failures. The calling thread's current device must be the one the model was created on
 * (mlp_cuda_open()). One thread at a time per model.
 */
#ifndef DDP_TRAIN_GPT_CUDA_H
#define DDP_TRAIN_GPT_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "gpt.h"

typedef struct gpt_cuda gpt_cuda;

/*
 * Creates a model for cfg (copied) with room for max_batch (>= 1) sequences of cfg.seq tokens on
 * the current device, its work enqueued on `stream` (borrowed, a cudaStream_t). Allocates the
 * activations once. Returns 0 and sets *out, -EINVAL, -ENOTSUP or COLL_ECUDA.
 */
int gpt_cuda_create(const gpt_config *cfg, int max_batch, void *stream, gpt_cuda **out);

/* Waits for the stream, frees the model. NULL is a no-op. */
void gpt_cuda_free(gpt_cuda *m);

/* Bytes of device memory the model holds for activations and scratch. */
size_t gpt_cuda_activation_bytes(const gpt_cuda *m);

/*
 * Enqueues a forward pass, as gpt_forward(): row b's tokens are tok[b * ld .. b * ld + len)
 * (host memory, copied during the call), with `targets` the next bytes the targets and the
 * loss measured (ld >= len + 1). B may be 0 (the hooks still run). The loss and correct count
 * are added to the model's accumulators on the device (stats NULL: no host wait), or, with
 * stats, returned for this pass alone after waiting for the stream. Returns 0, -EINVAL (B out of
 * [0, max_batch], len out of [1, seq], ld too small, a token not below vocab), COLL_ECUDA or a
 * hook's code.
 */
int gpt_cuda_forward(gpt_cuda *m, const gpt_hooks *h, const uint8_t *tok, int B, int len, int ld,
                     int targets, gpt_stats *stats);

/*
 * Enqueues the backward of the latest forward (with targets) for the loss loss_scale * (sum of
 * its tokens' cross-entropies), adding every parameter's gradient. Returns 0, -EINVAL (no
 * forward with targets before), COLL_ECUDA or a hook's code.
 */
int gpt_cuda_backward(gpt_cuda *m, const gpt_hooks *h, float loss_scale);

/*
 * Waits for the stream, writes the loss sum, correct count and tokens of the forward passes
 * with targets and without stats since the last take into *out and resets them. Returns 0 or
 * COLL_ECUDA.
 */
int gpt_cuda_stats_take(gpt_cuda *m, gpt_stats *out);

/*
 * Copies rows [row, row + count) of the latest forward's (B x len, vocab) logits (the
 * probabilities after a forward with targets) to host memory out (count x vocab floats), waiting
 * for the stream. Returns 0, -EINVAL (no forward, rows out of range) or COLL_ECUDA.
 */
int gpt_cuda_logits(gpt_cuda *m, int row, int count, float *out);

#ifdef __cplusplus
}
#endif

#endif /* DDP_TRAIN_GPT_CUDA_H */
