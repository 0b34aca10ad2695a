/*
 * CUDA support for the cpu backend: telling device pointers from host ones, pinned host memory,
 * and the copies that stage device buffers through it.
 *
 * nvcc compiles this file as C++, but it is written as C (no exceptions, no C++ library); the
 * extern "C" linkage comes from coll_internal.h. Host code only, no kernels. It never prints.
 *
 * Invariants: every function works, and answers "no CUDA", in a process without a GPU or driver:
 * the device count is probed once (cudaGetDeviceCount creates no context) and everything else
 * returns early when it found none, so host-only runs never pay for CUDA. A failed CUDA call's
 * error is cleared (cudaGetLastError) so that it does not surface in a later, unrelated call.
 * CUDA results become COLL_ECUDA here, with cudaGetErrorString in the detail.
 */
#include "coll_internal.h"

#include <cuda_runtime_api.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static bool cuda_usable;

static void probe(void)
{
    int ndev = 0;

    if (cudaGetDeviceCount(&ndev) != cudaSuccess) {
        (void)cudaGetLastError();
        ndev = 0;
    }
    cuda_usable = ndev > 0;
}

bool coll__cuda_available(void)
{
    pthread_once(&probe_once, probe);
    return cuda_usable;
}

bool coll__cuda_is_device(const void *p)
{
    cudaPointerAttributes attr;

    if (p == NULL || !coll__cuda_available())
        return false;
    memset(&attr, 0, sizeof attr);
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

void *coll__cuda_host_alloc(size_t nbytes)
{
    void *p = NULL;

    if (nbytes == 0 || !coll__cuda_available())
        return NULL;
    if (cudaMallocHost(&p, nbytes) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

void coll__cuda_host_free(void *p)
{
    if (p == NULL)
        return;
    if (cudaFreeHost(p) != cudaSuccess)
        (void)cudaGetLastError();
}

int coll__cuda_copy(void *dst, const void *src, size_t nbytes, void *stream, char *err,
                    size_t errlen)
{
    cudaStream_t s = (cudaStream_t)stream;
    const char *what = "cudaMemcpyAsync";
    cudaError_t e;

    if (nbytes == 0)
        return 0;
    e = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, s);
    if (e == cudaSuccess) {
        what = "cudaStreamSynchronize";
        e = cudaStreamSynchronize(s);
    }
    if (e == cudaSuccess)
        return 0;
    if (err != NULL && errlen > 0)
        snprintf(err, errlen, "%s of %zu bytes: %s (%s)", what, nbytes, cudaGetErrorString(e),
                 cudaGetErrorName(e));
    (void)cudaGetLastError();
    return COLL_ECUDA;
}
