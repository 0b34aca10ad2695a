/*
 * CUDA support for the cpu backend: telling device pointers from host ones, pinned host memory,
 * and the copies that stage device buffers through it.
 *
 * nvcc compiles this file as C++, but it is written as C (no exceptions, no C++ library); the
 * extern "C" linkage comes from coll_internal.h. Host code only, no kernels. It never prints.
 *
 * Invariants: every function works, and answers "no CUDA", in a process without a GPU or driver:
 * the device count is probed once (cudaGetDeviceCount creates no context) and everything else
 * returns early when it found none, so host-only runs never pay for CUDA. No function creates a
 * CUDA context: a device is made current only when it already has one (the driver's primary
 * context state, asked through entry points the runtime hands out, so that nothing links
 * libcuda), because the runtime creates the current device's context on first use, and a
 * progress thread (current device 0 by default) would otherwise give every rank of a host a
 * context on GPU 0, and stage on GPU 0's legacy stream rather than the buffer's device's. A
 * failed CUDA call's error is cleared (cudaGetLastError) so that it does not surface in a later,
 * unrelated call. CUDA results become COLL_ECUDA here, with cudaGetErrorString in the detail.
 */
#include "coll_internal.h"

#include <cuda.h> /* CUdevice, CUresult: the types of the two driver entry points below */
#include <cuda_runtime_api.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>

typedef CUresult (*device_get_fn)(CUdevice *dev, int ordinal);
typedef CUresult (*primary_state_fn)(CUdevice dev, unsigned int *flags, int *active);

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static bool cuda_usable;
static int ndevices;
static device_get_fn device_get;       /* cuDeviceGet, or NULL */
static primary_state_fn primary_state; /* cuDevicePrimaryCtxGetState, or NULL */

/* A driver function by name, without linking the driver library; NULL if unavailable. */
static void *driver_entry(const char *name)
{
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    void *fn = NULL;
    cudaError_t e;

#if CUDART_VERSION >= 12050
    e = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q);
#else
    e = cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &q);
#endif
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return fn;
}

static void probe(void)
{
    int ndev = 0;

    if (cudaGetDeviceCount(&ndev) != cudaSuccess) {
        (void)cudaGetLastError();
        ndev = 0;
    }
    cuda_usable = ndev > 0;
    ndevices = ndev;
    if (cuda_usable) {
        device_get = (device_get_fn)driver_entry("cuDeviceGet");
        primary_state = (primary_state_fn)driver_entry("cuDevicePrimaryCtxGetState");
    }
}

bool coll__cuda_available(void)
{
    pthread_once(&probe_once, probe);
    return cuda_usable;
}

/* Whether runtime device `device` has its (primary) context already; true when unknown. */
static bool has_context(int device)
{
    CUdevice dev = 0;
    unsigned int flags = 0;
    int active = 0;

    if (device_get == NULL || primary_state == NULL)
        return true;
    if (device_get(&dev, device) != CUDA_SUCCESS ||
        primary_state(dev, &flags, &active) != CUDA_SUCCESS)
        return true;
    return active != 0;
}

int coll__cuda_enter(int device, int *restore, char *err, size_t errlen)
{
    int cur = -1;
    cudaError_t e;

    *restore = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur == device)
        return 0;
    (void)cudaGetLastError();
    e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        if (err != NULL && errlen > 0)
            snprintf(err, errlen, "cudaSetDevice(%d): %s (%s)", device, cudaGetErrorString(e),
                     cudaGetErrorName(e));
        (void)cudaGetLastError();
        return COLL_ECUDA;
    }
    if (cur >= 0 && has_context(cur))
        *restore = cur;
    return 0;
}

void coll__cuda_leave(int restore)
{
    if (restore >= 0 && cudaSetDevice(restore) != cudaSuccess)
        (void)cudaGetLastError();
}

int coll__cuda_device_of(const void *p)
{
    cudaPointerAttributes attr;
    int cur = -1, ctx = -1, restore = -1;
    cudaError_t e;

    if (p == NULL || !coll__cuda_available())
        return -1;
    /*
     * cudaPointerGetAttributes creates the current device's context when it has none: ask with
     * a device that has one current. Device memory lives in a context, so with none there is
     * none to find.
     */
    if (cudaGetDevice(&cur) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    if (has_context(cur))
        ctx = cur;
    for (int d = 0; ctx < 0 && d < ndevices; d++)
        if (has_context(d))
            ctx = d;
    if (ctx < 0 || coll__cuda_enter(ctx, &restore, NULL, 0) < 0)
        return -1;
    memset(&attr, 0, sizeof attr);
    e = cudaPointerGetAttributes(&attr, p);
    coll__cuda_leave(restore);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged ? attr.device
                                                                                   : -1;
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
