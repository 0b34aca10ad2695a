/*
 * gpt_cuda without CUDA: the build without nvcc links this instead of gpt_cuda.cu, so that
 * ddp-train links either way. Every call fails with -ENOTSUP (mlp_cuda_last_error() says that
 * CUDA is not in the build); no model is ever created.
 */
#include "gpt_cuda.h"

#include <errno.h>

int gpt_cuda_create(const gpt_config *cfg, int max_batch, void *stream, gpt_cuda **out)
{
    (void)cfg, (void)max_batch, (void)stream, (void)out;
    return -ENOTSUP;
}

void gpt_cuda_free(gpt_cuda *m)
{
    (void)m;
}

size_t gpt_cuda_activation_bytes(const gpt_cuda *m)
{
    (void)m;
    return 0;
}

int gpt_cuda_forward(gpt_cuda *m, const gpt_hooks *h, const uint8_t *tok, int B, int len, int ld,
                     int targets, gpt_stats *stats)
{
    (void)m, (void)h, (void)tok, (void)B, (void)len, (void)ld, (void)targets, (void)stats;
    return -ENOTSUP;
}

int gpt_cuda_backward(gpt_cuda *m, const gpt_hooks *h, float loss_scale)
{
    (void)m, (void)h, (void)loss_scale;
    return -ENOTSUP;
}

int gpt_cuda_stats_take(gpt_cuda *m, gpt_stats *out)
{
    (void)m, (void)out;
    return -ENOTSUP;
}

int gpt_cuda_logits(gpt_cuda *m, int row, int count, float *out)
{
    (void)m, (void)row, (void)count, (void)out;
    return -ENOTSUP;
}
