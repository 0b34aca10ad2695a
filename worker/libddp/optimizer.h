/*
 * libddp's optimizer table (internal): one row per ddp_optimizer, which everything that depends
 * on the optimizer reads (the options' check, the state arrays' allocation, the step's kernels,
 * the checkpoint's writer and reader, ddp-ckpt). Adding an optimizer is its value of
 * ddp_optimizer (ddp.h), a host kernel (optim.c), a CUDA kernel with its launcher (ddp_cuda.cu,
 * declared at the end of this file) and a row in optimizer.c; nothing else names one.
 */
#ifndef DDP_OPTIMIZER_H
#define DDP_OPTIMIZER_H

#include "ddp.h"
#include "ddp_ops.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The most state arrays an optimizer keeps (AdamW's two moments). */
#define DDP__OPT_MAX_STATE 2
/* The most hyper-parameters of its own a row lists. */
#define DDP__OPT_MAX_HPARAMS 4

/*
 * A hyper-parameter an optimizer reads from ddp_options: its field's name (also its key in a
 * manifest's "optimizer" object), where it is, and the default ddp_options_set_optimizer()
 * gives it. A float, or a bool when is_bool (the default is then false).
 */
typedef struct ddp__hparam {
    const char *name;
    size_t offset; /* offsetof(ddp_options, ...) */
    bool is_bool;
    float def;
} ddp__hparam;

/*
 * One step of the optimizer on n elements of one owned range: param and the state arrays
 * (state[0 .. nstate - 1], as the row's nstate() gives them for o; zero before the first step)
 * updated in place from grad (already clipped), with learning rate lr; `step` is the 1-based
 * count of steps taken, this one included. Host: optim.c's kernels, memory on the host. Device:
 * enqueues the CUDA kernel on d's compute stream, reading the step's scalars there (the step
 * count, the clip factor; a no-op when the step is skipped), refreshing `compute` (the bf16
 * copy, or NULL); returns 0 or COLL_ECUDA (ddp_cuda.cu).
 */
typedef void ddp__host_step_fn(const ddp_options *o, float lr, int64_t step, float *param,
                               const float *grad, float *const *state, size_t n);
typedef int ddp__device_step_fn(ddp__dev *d, const ddp_options *o, float lr, float *param,
                                const float *grad, float *const *state, uint16_t *compute,
                                size_t n);

typedef struct ddp__optimizer_def {
    ddp_optimizer id;
    const char *name; /* ddp_optimizer_name(): options, manifests, --optimizer */
    /* The state arrays' names, as PyTorch's state dict calls them (checkpoints, ddp-ckpt's
     * export), and how many of them o keeps (NULL: all of them). */
    const char *state[DDP__OPT_MAX_STATE];
    int (*nstate)(const ddp_options *o);
    /* Its own hyper-parameters (weight_decay and clip_norm are every optimizer's). */
    ddp__hparam hparams[DDP__OPT_MAX_HPARAMS];
    /* NULL, or why o's hyper-parameters are not valid for it (ddp_model_create()'s -EINVAL). */
    const char *(*check)(const ddp_options *o);
    ddp__host_step_fn *host;
    ddp__device_step_fn *device; /* NULL in a build without CUDA */
} ddp__optimizer_def;

/* The row of `opt`, or NULL for a value that is no ddp_optimizer. Static data; thread-safe. */
const ddp__optimizer_def *ddp__optimizer(ddp_optimizer opt);

/* How many state arrays `def` keeps with options o (0 to DDP__OPT_MAX_STATE). */
int ddp__optimizer_nstate(const ddp__optimizer_def *def, const ddp_options *o);

/* The CUDA kernels' launchers (ddp_cuda.cu), for the rows. */
ddp__device_step_fn ddp__cuda_sgd_step, ddp__cuda_adamw_step, ddp__cuda_lion_step;

#ifdef __cplusplus
}
#endif

#endif /* DDP_OPTIMIZER_H */
