/*
 * The model's struct, shared by the files of libddp's runtime that work on it (ddp.c: the
 * building and the step; exchange.c: the small exchanges of host values; model_state.c: the
 * memory figures and the state as checkpoints see it), and the helpers of ddp.c they call.
 * Internal (ddp__ prefix); the rest of libddp goes through ddp_internal.h, which keeps the
 * struct closed.
 */
#ifndef DDP_MODEL_H
#define DDP_MODEL_H

#include "ddp.h"
#include "ddp_internal.h"
#include "ddp_ops.h"
#include "optimizer.h"
#include "plan.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DDP_MAX_DIMS 8
#define NAME_BYTES 128

typedef struct param {
    char name[NAME_BYTES];
    int unit;
    int ndim;
    int64_t shape[DDP_MAX_DIMS];
    coll_dtype dtype;
    size_t count;
} param;

/* A buffer of the size of the largest group and what occupies it. */
typedef struct slot {
    float *buf;        /* f32 gradients; stage 3's units: the compute precision's values */
    uint16_t *bf;      /* gradient slots with reduce_dtype bf16: the bf16 copy reduced */
    int group;         /* -1: free */
    coll_request *req; /* reduce-scatter (gradients) or allgather (units) in flight */
    uint64_t seq;      /* issue order, to wait for the oldest first */
} slot;

enum state { BUILDING, READY, BROKEN };

struct ddp_model {
    coll_comm *comm;
    ddp_options o;
    int rank, world;
    enum state state;
    int broken_rc;

    param *params;
    int nparams, cap_params;
    char (*unit_names)[NAME_BYTES];
    int nunits, cap_units;

    ddp__plan plan;
    const ddp__ops *ops; /* host or CUDA, chosen at create (ddp_ops.h) */
    ddp__dev dev;
    bool bf16;        /* precision bf16: the compute copy below */
    bool rbf16;       /* reduce_dtype bf16 */
    uint16_t *cparam; /* bf16 compute copy of param (same layout), or NULL */
    uint16_t *rgrad;  /* stages 0-1, reduce_dtype bf16: the bf16 copy of grad reduced */
    float *hparam, *hopt[DDP__OPT_MAX_STATE]; /* device: host mirrors for checkpoints, made at
                                                 the first */
    coll_request **retire; /* device: requests the streams wait on, released later */
    int nretire, cap_retire;
    float *param;                      /* stages 0-2: arena; stage 3: owned parts (compact) */
    float *grad;                       /* stages 0-1: arena; stages 2-3: owned parts (compact) */
    const ddp__optimizer_def *opt_def; /* o.optimizer's row (optimizer.h) */
    int nopt;                          /* its state arrays with these options */
    float *opt[DDP__OPT_MAX_STATE];    /* the state arrays ([nopt]), named by opt_def->state */
    size_t opt_elems;                  /* elements of each optimizer state array */

    /* Per group: how many of its parameters are ready, its request and its staging slot. */
    int *ready;
    coll_request **req;
    int *grad_slot;
    char *marked;    /* per parameter: gradient marked ready in this micro-step */
    char *done_seen; /* per group: its reduction's completion was traced */
    int next_launch;

    slot *gslots, *uslots; /* gradient staging (stages 2-3); gathered units (stage 3) */
    int ngslots, nuslots;
    int *unit_slot; /* stage 3: the uslot holding unit u, or -1 */
    int last_gathered;
    int direction; /* +1 forward, -1 backward */
    uint64_t seq;

    bool in_micro, sync, synced;
    bool sync_asked; /* the caller's `sync` for the micro-step in progress */
    bool sync_ended; /* a micro-step begun with sync true ended since the last step */
    int64_t micro;
    int64_t steps;              /* optimizer steps taken (skipped ones excluded) */
    int64_t attempted;          /* ddp_step() calls, for the trace */
    struct ddp__ckpt_state *ck; /* checkpoints (ckpt.c): NULL until the first save */
    /* ddp__host_icoll()'s exchange: buffers reserved once, its request while in flight. */
    struct {
        unsigned char *buf;  /* the collective's buffer: model memory (device or host) */
        unsigned char *host; /* device: page-locked host memory; host: buf */
        size_t cap;
        coll_request *req;
        const char *what;
    } xch;
    char err[512];
};

/* ddp.c's helpers. ddp__usable(): 0 for a committed model that is not broken, else the code
 * (m's error says which). ddp__dev_check(): a device operation's rc: 0 passes through; a failure
 * breaks the model, as a failed collective does (ddp__coll_failed()), and is returned. */
int ddp__usable(ddp_model *m);
int ddp__dev_check(ddp_model *m, int rc, const char *what);

/* Every rank's `count` f32 at `part` (model memory) into full[world * count] (model memory),
 * rank after rank, waited for: on a device, the compute stream waits for the gather, so work
 * enqueued or a download made after this call sees it. Returns 0 or the failure (the model is
 * broken), described as `what`. Every rank. */
int ddp__allgather_f32(ddp_model *m, const float *part, float *full, size_t count,
                       const char *what);

/* exchange.c: frees ddp__host_icoll()'s buffers, with no exchange in flight. */
void ddp__xch_release(ddp_model *m);

#endif /* DDP_MODEL_H */
