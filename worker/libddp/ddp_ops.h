/*
 * Where libddp's memory lives and what runs on it: a table of operations chosen once, when the
 * model is created (host: optim.c's kernels and libc, ops_host.c; CUDA: kernels on the compute
 * stream, ddp_cuda.cu). ddp.c calls through the table and never asks which one it has, except
 * to decide whether a request is waited for on the host or by a stream, and whether an
 * exchange of host values needs page-locked host memory besides the model's.
 *
 * Conventions: the pointers given to an operation are the model's memory as the table
 * allocated it (host or device). Every operation that returns an int returns 0 or a negative
 * code: the host table never fails but for -ENOMEM in alloc; the CUDA table returns COLL_ECUDA
 * with CUDA's message in d->err. Device operations are enqueued on the compute stream
 * (d->stream) and return without waiting, except alloc, upload, download and info, which
 * complete before they return (upload and download after the compute stream's earlier work),
 * and the comm_ operations, which work on the communication stream (see below).
 *
 * The step, in the order ddp.c calls it: norm_begin (zero the sum of squares), norm_add per
 * owned range, (the sum allreduced by ddp.c when the model is sharded), decide (the norm, the
 * skip, the clip factor and the step count: on the host into d->info, on the device into
 * device memory that the kernels read, so no host decision is needed), optimize per owned range
 * (a no-op when the step is skipped; refreshes the bf16 compute copy of the range when given
 * one). Internal (ddp__ prefix); not installed.
 */
#ifndef DDP_OPS_H
#define DDP_OPS_H

#include "ddp.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ddp__scalars; /* the CUDA table's device-side step state (ddp_cuda.cu) */
struct ddp__optimizer_def; /* a row of the optimizer table (optimizer.h) */

/* One model's place to run: the device, its streams, the step's state. */
typedef struct ddp__dev {
    int device;        /* -1: host */
    void *stream;      /* the caller's compute stream (opts.stream) */
    void *comm_stream; /* the communication stream (device; made by open) */
    void *event;       /* an event reused to order the two streams (device) */
    void *comm_event;  /* comm_mark's event on the communication stream (device) */
    struct ddp__scalars *scal; /* device: the step's scalars */
    double *ss;        /* where the sum of squares is: d->host_ss or device memory */
    double host_ss;
    ddp_step_info info; /* host: the last decision */
    float clip_scale;   /* host: the clip factor of the last decision (1: none) */
    char *err;          /* the model's error buffer, for failures */
    size_t errlen;
} ddp__dev;

typedef struct ddp__ops {
    int is_device;
    /* Makes the device current, creates the communication stream, the events and the scalars.
     * close accepts a half-opened d. */
    int (*open)(ddp__dev *d);
    void (*close)(ddp__dev *d);
    /* nbytes of zeroed memory (nbytes may be 0: *out is then NULL); release accepts NULL. */
    int (*alloc)(ddp__dev *d, size_t nbytes, void **out);
    void (*release)(ddp__dev *d, void *p);
    int (*zero)(ddp__dev *d, void *p, size_t nbytes);
    /* Host memory src into the model's dst, and back; complete on return. */
    int (*upload)(ddp__dev *d, void *dst, const void *src, size_t nbytes);
    int (*download)(ddp__dev *d, void *dst, const void *src, size_t nbytes);
    /* Waits for everything enqueued on the compute stream (device); host: nothing. */
    int (*sync)(ddp__dev *d);
    /* dst[i] = bf16(src[i] * scale); dst[i] (+)= f32(src[i]); dst[i] += src[i]. */
    int (*to_bf16)(ddp__dev *d, uint16_t *dst, const float *src, size_t n, float scale);
    int (*from_bf16)(ddp__dev *d, float *dst, const uint16_t *src, size_t n, int add);
    int (*add)(ddp__dev *d, float *dst, const float *src, size_t n);
    /* The communication stream waits for the compute stream's work enqueued so far. */
    int (*to_comm)(ddp__dev *d);
    /* The step (see above). `steps` is the host's count of steps taken: decide increments it
     * on the host; on the device the count lives in the scalars (set_steps sets it, info reads
     * it). */
    int (*norm_begin)(ddp__dev *d);
    int (*norm_add)(ddp__dev *d, const float *grad, size_t n);
    int (*decide)(ddp__dev *d, const ddp_options *o, int64_t *steps);
    /* The optimizer `def` (o->optimizer's row) on one owned range: the row's host or device
     * kernel, given the range's part of each state array (state[0 .. nstate - 1]). */
    int (*optimize)(ddp__dev *d, const ddp_options *o, const struct ddp__optimizer_def *def,
                    float lr, float *param, float *grad, float *const *state, uint16_t *compute,
                    size_t n);
    int (*info)(ddp__dev *d, ddp_step_info *out);
    int (*set_steps)(ddp__dev *d, int64_t steps);
    /* Asynchronous exchanges of host values (ddp.c's ddp__host_icoll()). host_alloc: nbytes of
     * zeroed page-locked host memory (host: calloc), which comm_copy needs on its host side to
     * return at once; host_release accepts NULL. comm_copy: a copy between the model's memory
     * and such memory, enqueued on the communication stream after its earlier work; returns
     * at once (host: done). Neither side may be reused before a comm_wait for a later
     * comm_mark. comm_mark: marks the communication stream's work so far (an event);
     * comm_wait: waits on the host until the stream has run up to the last mark. Host: both
     * return at once. */
    int (*host_alloc)(ddp__dev *d, size_t nbytes, void **out);
    void (*host_release)(ddp__dev *d, void *p);
    int (*comm_copy)(ddp__dev *d, void *dst, const void *src, size_t nbytes);
    int (*comm_mark)(ddp__dev *d);
    int (*comm_wait)(ddp__dev *d);
} ddp__ops;

extern const ddp__ops ddp__host_ops;

/* The CUDA table's launch shape: blocks of DDP__CUDA_THREADS threads, min(ceil(n / threads),
 * DDP__CUDA_MAX_BLOCKS) of them, which also fixes norm_add's order of summation (ddp_cuda.cu;
 * tests/libddp/test_ddp_cuda.c reproduces it). */
#define DDP__CUDA_THREADS 256
#define DDP__CUDA_MAX_BLOCKS 4096

/* The CUDA table, or NULL in a build without CUDA. */
const ddp__ops *ddp__cuda_ops(void);

#ifdef __cplusplus
}
#endif

#endif /* DDP_OPS_H */
