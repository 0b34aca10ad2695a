/*
 * mlp_cuda without CUDA: the build without nvcc links this instead of mlp_cuda.cu, so that
 * ddp-train links either way. No device is ever found; every other call fails with -ENOTSUP
 * and says so in mlp_cuda_last_error().
 */
#include "mlp_cuda.h"

#include <errno.h>

static const char not_built[] = "ddp-train was built without CUDA";

int mlp_cuda_built(void)
{
    return 0;
}

int mlp_cuda_device_count(void)
{
    return 0;
}

const char *mlp_cuda_last_error(void)
{
    return not_built;
}

int mlp_cuda_open(int device, void **stream, char *name, size_t cap)
{
    (void)device, (void)stream, (void)name, (void)cap;
    return -ENOTSUP;
}

int mlp_cuda_device_uuid(int device, uint8_t uuid[16])
{
    (void)device, (void)uuid;
    return -ENOTSUP;
}

int mlp_cuda_memory_used(int device, size_t *used)
{
    (void)device, (void)used;
    return -ENOTSUP;
}

void mlp_cuda_close(void *stream)
{
    (void)stream;
}

int mlp_cuda_to_host(void *dst, const void *src, size_t nbytes, void *stream)
{
    (void)dst, (void)src, (void)nbytes, (void)stream;
    return -ENOTSUP;
}

int mlp_cuda_create(const mlp_config *cfg, int max_batch, void *stream, mlp_cuda **out)
{
    (void)cfg, (void)max_batch, (void)stream, (void)out;
    return -ENOTSUP;
}

void mlp_cuda_free(mlp_cuda *m)
{
    (void)m;
}

int mlp_cuda_forward(mlp_cuda *m, const mlp_hooks *h, const void *x, const uint8_t *y, int B,
                     mlp_stats *stats)
{
    (void)m, (void)h, (void)x, (void)y, (void)B, (void)stats;
    return -ENOTSUP;
}

int mlp_cuda_backward(mlp_cuda *m, const mlp_hooks *h, float loss_scale)
{
    (void)m, (void)h, (void)loss_scale;
    return -ENOTSUP;
}

int mlp_cuda_stats_take(mlp_cuda *m, mlp_stats *out)
{
    (void)m, (void)out;
    return -ENOTSUP;
}

int mlp_cuda_output(mlp_cuda *m, float *out)
{
    (void)m, (void)out;
    return -ENOTSUP;
}

int mlp_cuda_data_create(const uint8_t *pixels, const uint8_t *labels, int n, int dim,
                         int max_batch, int bf16, void *stream, mlp_cuda_data **out)
{
    (void)pixels, (void)labels, (void)n, (void)dim, (void)max_batch, (void)bf16, (void)stream;
    (void)out;
    return -ENOTSUP;
}

void mlp_cuda_data_free(mlp_cuda_data *d)
{
    (void)d;
}

int mlp_cuda_data_batch(mlp_cuda_data *d, const int32_t *idx, int start, int count,
                        const void **x, const uint8_t **y)
{
    (void)d, (void)idx, (void)start, (void)count, (void)x, (void)y;
    return -ENOTSUP;
}
