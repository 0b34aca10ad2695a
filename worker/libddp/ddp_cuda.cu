/*
 * libddp's CUDA operations table (ddp_ops.h): device memory, and kernels on the caller's
 * compute stream for the gradients' zeroing, the bf16 casts, the gradient norm, the step's
 * decision and the fused updates of the optimizer table's rows (optimizer.h: SGD, AdamW, Lion).
 *
 * nvcc compiles this file as C++, but it is written as C plus kernels (no exceptions, no C++
 * library); the extern "C" linkage comes from ddp_ops.h. It never prints. CUDA results become
 * COLL_ECUDA here and nowhere else, with cudaGetErrorString in d->err.
 *
 * The step needs no host decision: norm_add accumulates the sum of squares into a double in
 * device memory (the scalars), which ddp.c allreduces on the communication stream; decide, one
 * thread, turns it into the norm, the finite flag, the clip factor, the step count and the
 * coefficients that depend on it (AdamW's bias corrections, in double from the float options,
 * as optim.c computes them); the update kernels read those and do nothing when the norm is not
 * finite.
 *
 * Invariants:
 *  - the element formulas are optim.h's, operation by operation: this file is compiled with
 *    -fmad=false so that nvcc fuses nothing, and the fused multiply-adds are explicit fmaf();
 *    division and sqrtf are IEEE (nvcc's default -prec-div and -prec-sqrt, no fast math). So
 *    the updates match optim.c's bit for bit given the same coefficients; AdamW's coefficients
 *    come from the device's pow(), which may differ from the host's in the last place;
 *  - the sum of squares is accumulated in double in an order fixed by n alone (per block, then
 *    the blocks' partial sums in one block: k_sum_squares, k_sum_partials), not by atomics:
 *    the same gradients give the same norm bit for bit on every run, every rank and every GPU
 *    (at stage 0 each rank decides the clip from its own sum, so an order that varied could
 *    clip the ranks' replicas apart). It matches the host's, whose order differs, to rounding;
 *  - every kernel is a grid-stride loop over n elements with n < 2^63, launched with at most
 *    MAX_BLOCKS blocks of THREADS threads, and writes no element at or past n; n == 0
 *    launches nothing;
 *  - the model's device is made current before every call (the training thread may have
 *    switched it);
 *  - nothing is enqueued on the legacy default stream (no cudaMemset or cudaMemcpy): every
 *    memset, copy and kernel goes on the compute stream, which the communication stream
 *    follows through events; a non-blocking stream would not be ordered after the legacy one.
 *    The exception is comm_copy, the small copies of ddp.c's asynchronous host exchanges,
 *    which go on the communication stream with the collective they feed or drain, between
 *    page-locked host memory and memory the compute stream does not use.
 */
#include "bf16conv.h"
#include "ddp_ops.h"
#include "optimizer.h"

#include <cuda_runtime_api.h>

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define THREADS DDP__CUDA_THREADS
#define MAX_BLOCKS DDP__CUDA_MAX_BLOCKS

/* The step's state, in device memory (followed by norm_add's partial sums, partials()). */
struct ddp__scalars {
    double ss;    /* the sum of squares of the gradients (allreduced by ddp.c) */
    double norm;  /* sqrt(ss) */
    int finite;   /* the norm is finite: the step is taken */
    int clipped;  /* the gradients are scaled by clip */
    float clip;   /* the clip factor (1: none) */
    int64_t steps; /* steps taken, skipped ones excluded */
    /* SGD */
    int first_step;
    /* AdamW: optim.c's adamw_coef but decay and neg_step, which need the step's lr, and the
     * first moment's bias correction they are made from */
    double bc1;
    float lerp_w, c2, bc2_sqrt;
    int lerp_from_end;
};

/* ------------------------------------------------------------------------------------------ */
/* Errors and helpers                                                                          */
/* ------------------------------------------------------------------------------------------ */

static int cuda_fail(ddp__dev *d, const char *what, cudaError_t e)
{
    if (d->err && d->errlen)
        snprintf(d->err, d->errlen, "%s: %s (%s)", what, cudaGetErrorString(e),
                 cudaGetErrorName(e));
    (void)cudaGetLastError();
    return COLL_ECUDA;
}

#define TRY(d, what, call)                                                                         \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return cuda_fail((d), (what), e_);                                                     \
    } while (0)

/* Makes the model's device current on this thread when it is not already. */
static int use_device(ddp__dev *d)
{
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur == d->device)
        return 0;
    TRY(d, "cudaSetDevice", cudaSetDevice(d->device));
    return 0;
}

static cudaStream_t stream_of(const ddp__dev *d)
{
    return (cudaStream_t)d->stream;
}

static unsigned blocks_for(size_t n)
{
    size_t b = (n + THREADS - 1) / THREADS;
    return (unsigned)(b < MAX_BLOCKS ? b : MAX_BLOCKS);
}

/* A launch's own error (bad configuration); execution errors surface at the next sync. */
static int launched(ddp__dev *d, const char *what)
{
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? 0 : cuda_fail(d, what, e);
}

/* ------------------------------------------------------------------------------------------ */
/* Kernels                                                                                     */
/* ------------------------------------------------------------------------------------------ */

#define GRID_STRIDE(i, n)                                                                          \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                        \
         i += (size_t)gridDim.x * blockDim.x)

__global__ static void k_to_bf16(uint16_t *dst, const float *src, size_t n, float scale)
{
    GRID_STRIDE(i, n)
    dst[i] = bf16_from_f32(src[i] * scale);
}

__global__ static void k_from_bf16(float *dst, const uint16_t *src, size_t n, int add)
{
    GRID_STRIDE(i, n)
    dst[i] = add ? dst[i] + bf16_to_f32(src[i]) : bf16_to_f32(src[i]);
}

__global__ static void k_add(float *dst, const float *src, size_t n)
{
    GRID_STRIDE(i, n)
    dst[i] = dst[i] + src[i];
}

/* The sum of the block's THREADS values, in a fixed order (a tree in shared memory): thread t
 * adds t + THREADS / 2, then t + THREADS / 4, ... The result is thread 0's. */
__device__ static double block_sum(double v)
{
    __shared__ double part[THREADS];
    part[threadIdx.x] = v;
    __syncthreads();
    for (unsigned w = THREADS / 2; w > 0; w /= 2) {
        if (threadIdx.x < w)
            part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    return part[0];
}

/* Block b's sum of squares in double into partial[b]: thread t adds the squares of elements
 * b * THREADS + t, then a grid further, ..., then block_sum(). */
__global__ static void k_sum_squares(const float *x, size_t n, double *partial)
{
    double acc = 0;
    GRID_STRIDE(i, n)
    acc += (double)x[i] * (double)x[i];
    double sum = block_sum(acc);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = sum;
}

/* One block: *ss += the nblocks partial sums, thread t adding partials t, t + THREADS, ...,
 * then block_sum(). A fixed order, where atomicAdd's would vary from run to run. */
__global__ static void k_sum_partials(const double *partial, unsigned nblocks, double *ss)
{
    double acc = 0;
    for (unsigned b = threadIdx.x; b < nblocks; b += THREADS)
        acc += partial[b];
    double sum = block_sum(acc);
    if (threadIdx.x == 0)
        *ss += sum;
}

/* One thread: the decision and the coefficients (optim.c's, from the float options). */
__global__ static void k_decide(struct ddp__scalars *s, float clip_norm, float beta1, float beta2)
{
    double norm = sqrt(s->ss);
    s->norm = norm;
    s->finite = isfinite(norm) ? 1 : 0;
    s->clipped = 0;
    s->clip = 1.0f;
    if (!s->finite)
        return;
    if (clip_norm > 0 && norm > clip_norm) {
        s->clip = (float)(clip_norm / (norm + 1e-6));
        s->clipped = 1;
    }
    s->steps++;
    s->first_step = s->steps == 1;
    /* AdamW's; cheap enough to make for every optimizer, once a step. */
    double step = (double)s->steps;
    double w = 1.0 - (double)beta1;
    s->bc1 = 1.0 - pow((double)beta1, step);
    double bc2 = 1.0 - pow((double)beta2, step);
    s->c2 = (float)(1.0 - (double)beta2);
    s->bc2_sqrt = (float)pow(bc2, 0.5);
    float wf = (float)w;
    s->lerp_from_end = !(fabsf(wf) < 0.5f);
    s->lerp_w = s->lerp_from_end ? wf - 1.0f : wf;
}

__global__ static void k_sgd(const struct ddp__scalars *s, float *param, const float *grad,
                             float *buf, size_t n, float neg_lr, float momentum, int nesterov,
                             float weight_decay, uint16_t *compute)
{
    if (!s->finite)
        return;
    const float clip = s->clip;
    const int clipped = s->clipped, first = s->first_step;
    GRID_STRIDE(i, n)
    {
        float g = grad[i];
        if (clipped)
            g = g * clip;
        if (weight_decay != 0.0f)
            g = fmaf(weight_decay, param[i], g);
        if (momentum != 0.0f) {
            float b = g;
            if (!first) {
                b = buf[i] * momentum;
                b = b + g;
            }
            buf[i] = b;
            g = nesterov ? fmaf(momentum, b, g) : b;
        }
        float p = fmaf(neg_lr, g, param[i]);
        param[i] = p;
        if (compute)
            compute[i] = bf16_from_f32(p);
    }
}

__global__ static void k_adamw(const struct ddp__scalars *s, float *param, const float *grad,
                               float *m, float *v, size_t n, float lr, float beta2, float eps,
                               float weight_decay, uint16_t *compute)
{
    if (!s->finite)
        return;
    const float clip = s->clip;
    const int clipped = s->clipped;
    /* optim.c's decay and neg_step, which depend on lr (ddp_step()'s argument): each thread
     * computes them, in double from the floats, rounded once, as optim.c does (the pow() is
     * k_decide's, once per step rather than once per thread). */
    const double bc1 = s->bc1;
    const float decay = (float)(1.0 - (double)lr * (double)weight_decay);
    const float neg_step = (float)-((double)lr / bc1);
    const float lerp_w = s->lerp_w, c2 = s->c2, bc2_sqrt = s->bc2_sqrt;
    const int from_end = s->lerp_from_end, use_wd = weight_decay != 0.0f;
    GRID_STRIDE(i, n)
    {
        float g = grad[i];
        if (clipped)
            g = g * clip;
        float p = use_wd ? param[i] * decay : param[i];
        float mi = m[i];
        mi = fmaf(lerp_w, g - mi, from_end ? g : mi);
        float vi = v[i] * beta2;
        vi = fmaf(c2 * g, g, vi);
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p = p + (neg_step * mi) / denom;
        param[i] = p;
        if (compute)
            compute[i] = bf16_from_f32(p);
    }
}

/* optim.h's Lion element formula; the coefficients come from the launcher, as optim.c makes
 * them. */
__global__ static void k_lion(const struct ddp__scalars *s, float *param, const float *grad,
                              float *m, size_t n, float neg_lr, float decay, float beta1, float c1,
                              float beta2, float c2, int use_wd, uint16_t *compute)
{
    if (!s->finite)
        return;
    const float clip = s->clip;
    const int clipped = s->clipped;
    GRID_STRIDE(i, n)
    {
        float g = grad[i];
        if (clipped)
            g = g * clip;
        float p = use_wd ? param[i] * decay : param[i];
        float mi = m[i];
        float u = fmaf(c1, g, mi * beta1);
        float sg = u > 0.0f ? 1.0f : u < 0.0f ? -1.0f : 0.0f;
        p = fmaf(neg_lr, sg, p);
        m[i] = fmaf(c2, g, mi * beta2);
        param[i] = p;
        if (compute)
            compute[i] = bf16_from_f32(p);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* The optimizer table's device kernels (optimizer.h), launched by c_optimize                 */
/* ------------------------------------------------------------------------------------------ */

int ddp__cuda_sgd_step(ddp__dev *d, const ddp_options *o, float lr, float *param, const float *grad,
                       float *const *state, uint16_t *compute, size_t n)
{
    k_sgd<<<blocks_for(n), THREADS, 0, stream_of(d)>>>(
        d->scal, param, grad, state[0], n, -lr, o->momentum, o->nesterov, o->weight_decay, compute);
    return launched(d, "the SGD kernel");
}

int ddp__cuda_adamw_step(ddp__dev *d, const ddp_options *o, float lr, float *param,
                         const float *grad, float *const *state, uint16_t *compute, size_t n)
{
    k_adamw<<<blocks_for(n), THREADS, 0, stream_of(d)>>>(d->scal, param, grad, state[0], state[1],
                                                         n, lr, o->beta2, o->eps, o->weight_decay,
                                                         compute);
    return launched(d, "the AdamW kernel");
}

int ddp__cuda_lion_step(ddp__dev *d, const ddp_options *o, float lr, float *param,
                        const float *grad, float *const *state, uint16_t *compute, size_t n)
{
    /* optim.c's lion_coef: in double from the floats, rounded once. */
    float decay = (float)(1.0 - (double)lr * (double)o->weight_decay);
    float c1 = (float)(1.0 - (double)o->beta1), c2 = (float)(1.0 - (double)o->beta2);
    k_lion<<<blocks_for(n), THREADS, 0, stream_of(d)>>>(d->scal, param, grad, state[0], n, -lr,
                                                        decay, o->beta1, c1, o->beta2, c2,
                                                        o->weight_decay != 0.0f, compute);
    return launched(d, "the Lion kernel");
}

/* ------------------------------------------------------------------------------------------ */
/* The table                                                                                   */
/* ------------------------------------------------------------------------------------------ */

static void c_close(ddp__dev *d)
{
    if (use_device(d) < 0)
        return;
    if (d->comm_stream)
        (void)cudaStreamDestroy((cudaStream_t)d->comm_stream);
    if (d->event)
        (void)cudaEventDestroy((cudaEvent_t)d->event);
    if (d->comm_event)
        (void)cudaEventDestroy((cudaEvent_t)d->comm_event);
    if (d->scal)
        (void)cudaFree(d->scal);
    (void)cudaGetLastError();
    d->comm_stream = d->event = d->comm_event = NULL;
    d->scal = NULL;
    d->ss = NULL;
}

static int c_open(ddp__dev *d)
{
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        if (d->err && d->errlen)
            snprintf(d->err, d->errlen, "no usable CUDA device: %s",
                     e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        (void)cudaGetLastError();
        return -ENOTSUP;
    }
    if (d->device >= ndev) {
        if (d->err && d->errlen)
            snprintf(d->err, d->errlen, "CUDA device %d does not exist (%d devices)", d->device,
                     ndev);
        return -EINVAL;
    }
    TRY(d, "cudaSetDevice", cudaSetDevice(d->device));
    cudaStream_t cs;
    TRY(d, "cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    d->comm_stream = cs;
    cudaEvent_t ev;
    TRY(d, "cudaEventCreateWithFlags", cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    d->event = ev;
    TRY(d, "cudaEventCreateWithFlags", cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    d->comm_event = ev;
    void *p = NULL;
    TRY(d, "cudaMalloc (step scalars)",
        cudaMalloc(&p, sizeof(struct ddp__scalars) + MAX_BLOCKS * sizeof(double)));
    d->scal = (struct ddp__scalars *)p;
    /* On the compute stream, where every kernel that reads the scalars runs after it. */
    TRY(d, "cudaMemsetAsync (step scalars)",
        cudaMemsetAsync(p, 0, sizeof(struct ddp__scalars), stream_of(d)));
    d->ss = &d->scal->ss; /* a device address: ddp.c only hands it to collectives */
    return 0;
}

static int c_alloc(ddp__dev *d, size_t nbytes, void **out)
{
    *out = NULL;
    if (nbytes == 0)
        return 0;
    if (use_device(d) < 0)
        return COLL_ECUDA;
    void *p = NULL;
    TRY(d, "cudaMalloc", cudaMalloc(&p, nbytes));
    /* Zeroed on the compute stream and waited for: cudaMemset() would run on the legacy
     * default stream, unordered with the non-blocking communication stream (and a
     * non-blocking compute stream), so a collective or a copy into the new memory could
     * run before the zeros and be overwritten by them. */
    const char *what = "cudaMemsetAsync";
    cudaError_t e = cudaMemsetAsync(p, 0, nbytes, stream_of(d));
    if (e == cudaSuccess) {
        what = "cudaStreamSynchronize";
        e = cudaStreamSynchronize(stream_of(d));
    }
    if (e != cudaSuccess) {
        (void)cudaFree(p);
        return cuda_fail(d, what, e);
    }
    *out = p;
    return 0;
}

static void c_release(ddp__dev *d, void *p)
{
    if (!p || use_device(d) < 0)
        return;
    if (cudaFree(p) != cudaSuccess)
        (void)cudaGetLastError();
}

static int c_zero(ddp__dev *d, void *p, size_t nbytes)
{
    if (nbytes == 0)
        return 0;
    if (use_device(d) < 0)
        return COLL_ECUDA;
    TRY(d, "cudaMemsetAsync", cudaMemsetAsync(p, 0, nbytes, stream_of(d)));
    return 0;
}

/* A copy on the compute stream (after its work), waited for. */
static int c_copy(ddp__dev *d, void *dst, const void *src, size_t nbytes)
{
    if (nbytes == 0)
        return 0;
    if (use_device(d) < 0)
        return COLL_ECUDA;
    TRY(d, "cudaMemcpyAsync", cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream_of(d)));
    TRY(d, "cudaStreamSynchronize", cudaStreamSynchronize(stream_of(d)));
    return 0;
}

static int c_sync(ddp__dev *d)
{
    if (use_device(d) < 0)
        return COLL_ECUDA;
    TRY(d, "cudaStreamSynchronize", cudaStreamSynchronize(stream_of(d)));
    return 0;
}

static int c_to_bf16(ddp__dev *d, uint16_t *dst, const float *src, size_t n, float scale)
{
    if (n == 0)
        return 0;
    if (use_device(d) < 0)
        return COLL_ECUDA;
    k_to_bf16<<<blocks_for(n), THREADS, 0, stream_of(d)>>>(dst, src, n, scale);
    return launched(d, "the bf16 cast kernel");
}

static int c_from_bf16(ddp__dev *d, float *dst, const uint16_t *src, size_t n, int add)
{
    if (n == 0)
        return 0;
    if (use_device(d) < 0)
        return COLL_ECUDA;
    k_from_bf16<<<blocks_for(n), THREADS, 0, stream_of(d)>>>(dst, src, n, add);
    return launched(d, "the f32 cast kernel");
}

static int c_add(ddp__dev *d, float *dst, const float *src, size_t n)
{
    if (n == 0)
        return 0;
    if (use_device(d) < 0)
        return COLL_ECUDA;
    k_add<<<blocks_for(n), THREADS, 0, stream_of(d)>>>(dst, src, n);
    return launched(d, "the add kernel");
}

static int c_to_comm(ddp__dev *d)
{
    if (use_device(d) < 0)
        return COLL_ECUDA;
    TRY(d, "cudaEventRecord", cudaEventRecord((cudaEvent_t)d->event, stream_of(d)));
    TRY(d, "cudaStreamWaitEvent",
        cudaStreamWaitEvent((cudaStream_t)d->comm_stream, (cudaEvent_t)d->event, 0));
    return 0;
}

static int c_norm_begin(ddp__dev *d)
{
    if (use_device(d) < 0)
        return COLL_ECUDA;
    TRY(d, "cudaMemsetAsync", cudaMemsetAsync(&d->scal->ss, 0, sizeof(double), stream_of(d)));
    return 0;
}

/* The per-block partial sums of norm_add: MAX_BLOCKS doubles after the scalars, in the same
 * allocation. */
static_assert(sizeof(struct ddp__scalars) % sizeof(double) == 0, "partials() must be aligned");
static double *partials(const ddp__dev *d)
{
    return (double *)(d->scal + 1);
}

static int c_norm_add(ddp__dev *d, const float *grad, size_t n)
{
    if (n == 0)
        return 0;
    if (use_device(d) < 0)
        return COLL_ECUDA;
    unsigned b = blocks_for(n);
    k_sum_squares<<<b, THREADS, 0, stream_of(d)>>>(grad, n, partials(d));
    int rc = launched(d, "the sum-of-squares kernel");
    if (rc < 0)
        return rc;
    k_sum_partials<<<1, THREADS, 0, stream_of(d)>>>(partials(d), b, &d->scal->ss);
    return launched(d, "the sum-of-squares kernel");
}

static int c_decide(ddp__dev *d, const ddp_options *o, int64_t *steps)
{
    (void)steps; /* the count lives on the device */
    if (use_device(d) < 0)
        return COLL_ECUDA;
    k_decide<<<1, 1, 0, stream_of(d)>>>(d->scal, o->clip_norm, o->beta1, o->beta2);
    return launched(d, "the step's decision kernel");
}

static int c_optimize(ddp__dev *d, const ddp_options *o, const ddp__optimizer_def *def, float lr,
                      float *param, float *grad, float *const *state, uint16_t *compute, size_t n)
{
    if (n == 0)
        return 0;
    if (use_device(d) < 0)
        return COLL_ECUDA;
    return def->device(d, o, lr, param, grad, state, compute, n);
}

static int c_info(ddp__dev *d, ddp_step_info *out)
{
    struct ddp__scalars s;
    int rc = c_copy(d, &s, d->scal, sizeof s);
    if (rc < 0)
        return rc;
    out->grad_norm = s.norm;
    out->skipped = !s.finite;
    out->clipped = s.clipped;
    out->step = s.steps;
    return 0;
}

static int c_set_steps(ddp__dev *d, int64_t steps)
{
    return c_copy(d, &d->scal->steps, &steps, sizeof steps);
}

/* Page-locked, so that comm_copy's copies to and from it are asynchronous: a copy into
 * pageable memory returns only once it is done, after the stream's earlier work. */
static int c_host_alloc(ddp__dev *d, size_t nbytes, void **out)
{
    *out = NULL;
    if (nbytes == 0)
        return 0;
    if (use_device(d) < 0)
        return COLL_ECUDA;
    void *p = NULL;
    TRY(d, "cudaHostAlloc", cudaHostAlloc(&p, nbytes, cudaHostAllocDefault));
    memset(p, 0, nbytes);
    *out = p;
    return 0;
}

static void c_host_release(ddp__dev *d, void *p)
{
    if (!p || use_device(d) < 0)
        return;
    if (cudaFreeHost(p) != cudaSuccess)
        (void)cudaGetLastError();
}

static int c_comm_copy(ddp__dev *d, void *dst, const void *src, size_t nbytes)
{
    if (nbytes == 0)
        return 0;
    if (use_device(d) < 0)
        return COLL_ECUDA;
    TRY(d, "cudaMemcpyAsync (communication stream)",
        cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, (cudaStream_t)d->comm_stream));
    return 0;
}

static int c_comm_mark(ddp__dev *d)
{
    if (use_device(d) < 0)
        return COLL_ECUDA;
    TRY(d, "cudaEventRecord (communication stream)",
        cudaEventRecord((cudaEvent_t)d->comm_event, (cudaStream_t)d->comm_stream));
    return 0;
}

static int c_comm_wait(ddp__dev *d)
{
    if (use_device(d) < 0)
        return COLL_ECUDA;
    TRY(d, "cudaEventSynchronize", cudaEventSynchronize((cudaEvent_t)d->comm_event));
    return 0;
}

static const ddp__ops cuda_ops = {
    /* .is_device = */ 1,
    /* .open = */ c_open,
    /* .close = */ c_close,
    /* .alloc = */ c_alloc,
    /* .release = */ c_release,
    /* .zero = */ c_zero,
    /* .upload = */ c_copy,
    /* .download = */ c_copy,
    /* .sync = */ c_sync,
    /* .to_bf16 = */ c_to_bf16,
    /* .from_bf16 = */ c_from_bf16,
    /* .add = */ c_add,
    /* .to_comm = */ c_to_comm,
    /* .norm_begin = */ c_norm_begin,
    /* .norm_add = */ c_norm_add,
    /* .decide = */ c_decide,
    /* .optimize = */ c_optimize,
    /* .info = */ c_info,
    /* .set_steps = */ c_set_steps,
    /* .host_alloc = */ c_host_alloc,
    /* .host_release = */ c_host_release,
    /* .comm_copy = */ c_comm_copy,
    /* .comm_mark = */ c_comm_mark,
    /* .comm_wait = */ c_comm_wait,
};

const ddp__ops *ddp__cuda_ops(void)
{
    return &cuda_ops;
}
