/*
 * What the library was built with, and stand-ins for the GPU modules it was built without.
 *
 * Always compiled, by the C compiler, with COLL_HAVE_CUDA and COLL_HAVE_NCCL set to 0 or 1 by
 * the build. coll_have_cuda() and coll_have_nccl() report them. Without CUDA, the staging
 * functions of cuda_stage.cu answer "no device" (false, -1, NULL, -ENOTSUP); they never touch a
 * GPU. Without NCCL nothing stands in for nccl.cu: its only caller, backend_nccl.c, is left out
 * of the build too, and comm.c's backend table has no nccl row.
 */
#include "coll_internal.h"

#include <errno.h>
#include <stdio.h>

#ifndef COLL_HAVE_CUDA
#define COLL_HAVE_CUDA 0
#endif
#ifndef COLL_HAVE_NCCL
#define COLL_HAVE_NCCL 0
#endif

#if COLL_HAVE_NCCL && !COLL_HAVE_CUDA
#error "COLL_HAVE_NCCL needs COLL_HAVE_CUDA"
#endif

bool coll_have_cuda(void)
{
    return COLL_HAVE_CUDA != 0;
}

bool coll_have_nccl(void)
{
    return COLL_HAVE_NCCL != 0;
}

#if !COLL_HAVE_CUDA

bool coll__cuda_available(void)
{
    return false;
}

int coll__cuda_device_of(const void *p)
{
    (void)p;
    return -1;
}

int coll__cuda_enter(int device, int *restore, char *err, size_t errlen)
{
    (void)device;
    *restore = -1;
    if (err != NULL && errlen > 0)
        snprintf(err, errlen, "built without CUDA");
    return -ENOTSUP;
}

void coll__cuda_leave(int restore)
{
    (void)restore;
}

void *coll__cuda_host_alloc(size_t nbytes)
{
    (void)nbytes;
    return NULL;
}

void coll__cuda_host_free(void *p)
{
    (void)p;
}

int coll__cuda_copy(void *dst, const void *src, size_t nbytes, void *stream, char *err,
                    size_t errlen)
{
    (void)dst;
    (void)src;
    (void)nbytes;
    (void)stream;
    if (err != NULL && errlen > 0)
        snprintf(err, errlen, "built without CUDA");
    return -ENOTSUP;
}

#endif /* !COLL_HAVE_CUDA */
