/*
 * The arithmetic of one row of softmax cross-entropy, shared by the host models (mlp.c, gpt.c)
 * and the device's kernels (mlp_cuda.cu, gpt_cuda.cu, one thread per row), so that the host's unit
 * tests (tests/trainer/test_mlp.c) cover the code the GPU runs: the same operations in the same
 * order, in f32 but for the loss (f64). Only the exponential and logarithm differ, the host's libm
 * against CUDA's (a few ulp apart).
 *
 * Header-only: nvcc compiles it for the host and the device (__host__ __device__), a C
 * compiler as plain static inline C.
 */
#ifndef DDP_TRAIN_MLP_XENT_H
#define DDP_TRAIN_MLP_XENT_H

#include <math.h>

#ifdef __CUDACC__
#define MLP_XENT_FN static inline __host__ __device__
#else
#define MLP_XENT_FN static inline
#endif

/*
 * In place: the logits z (C) become the softmax probabilities. Returns -log p[label] and sets
 * *correct to 1 when the row's first maximal logit is `label` (0 <= label < C), else 0.
 * log-sum-exp is taken after subtracting the row's maximum, so no exp overflows, and
 * -log p[label] = log(sum of exp(z - max)) - (z[label] - max) is finite even when p[label]
 * underflows.
 */
MLP_XENT_FN double mlp_xent_row(float *z, int C, int label, int *correct)
{
    int arg = 0;
    for (int j = 1; j < C; j++)
        if (z[j] > z[arg])
            arg = j;
    float max = z[arg];
    float zy = z[label] - max; /* <= 0; kept before exp overwrites it */
    float sum = 0.0f;
    for (int j = 0; j < C; j++) {
        z[j] = expf(z[j] - max);
        sum += z[j];
    }
    for (int j = 0; j < C; j++)
        z[j] /= sum;
    *correct = arg == label;
    return (double)logf(sum) - (double)zy;
}

#endif /* DDP_TRAIN_MLP_XENT_H */
