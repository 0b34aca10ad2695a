/*
 * libddp: data-parallel training steps (DDP and ZeRO stages 1, 2 and 3) for C trainers, on top
 * of libcollective. libddp(3) describes the stages, the layout, mixed precision, the device path
 * and checkpoints; this header gives each call's contract.
 *
 * The caller owns the model's compute (forward and backward) and says four things at the right
 * moments: "I am about to use unit u" (ddp_unit_gather), "I am done with unit u"
 * (ddp_unit_release), "the gradient of parameter p is final for this micro-step"
 * (ddp_grad_ready) and "step" (ddp_step). One training loop serves every stage:
 *
 *   ddp_options o;  ddp_options_init(&o);  o.zero_stage = 2;
 *   ddp_options_set_optimizer(&o, DDP_ADAMW);
 *   ddp_model *m;   ddp_model_create(comm, &o, &m);
 *   for each layer l:  u = ddp_unit_add(m, "fc1");
 *                      W = ddp_param_add(m, u, "weight", 2, (int64_t[]){out, in}, COLL_F32); ...
 *   ddp_model_commit(m, init_fn, arg);
 *   for each step:
 *     for k in 0..nmicro-1:
 *       ddp_micro_begin(m, k == nmicro - 1);         (sync on the last micro-step only)
 *       forward:  ddp_unit_gather(m, u); use ddp_param_data(m, p); ddp_unit_release(m, u);
 *       backward (units in reverse): ddp_unit_gather(m, u);
 *                 add the gradient of p into ddp_grad_buffer(m, p); ddp_grad_ready(m, p);
 *                 ddp_unit_release(m, u);
 *       ddp_micro_end(m);
 *     ddp_step(m, lr, &info);
 *   after training: ddp_model_get_params(m, 0, buf, ddp_model_params_bytes(m, 0), 0) (the whole
 *     model to rank 0, at any stage); ddp_model_free(m) at the end.
 *
 * Gradients: the step uses, for each parameter, the mean over ranks of each rank's sum over the
 * step's micro-steps of what backward added into ddp_grad_buffer() (PyTorch DDP's: averaged over
 * ranks, accumulated over micro-steps; scale the loss by 1 / micro-steps for a mean over them).
 *
 * Conventions: functions that can fail return an int, >= 0 on success and a negative errno value
 * or a libcollective code (COLL_EREMOTE, ...) on failure; ddp_strerror() names any of them and
 * ddp_last_error() gives the model's detailed account of its last failure. Out-parameters are
 * written only on success. The library never exits, aborts or prints: messages go to the log
 * hook. Calls marked "every rank" are collective: every rank calls them in the same order. A
 * model is not thread-safe. Buffers the model hands out are host memory when opts.device is -1
 * and device memory (ordered by opts.stream) when it is >= 0.
 *
 * The header compiles as C99 and C++.
 */
#ifndef DDP_H
#define DDP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coll.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Options                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/*
 * The optimizers: torch.optim.SGD's and torch.optim.AdamW's arithmetic, and Lion's (Chen et
 * al. 2023: the sign of an interpolation of the momentum and the gradient, decoupled weight
 * decay). Their names ("sgd", "adamw", "lion") are ddp_optimizer_name()'s.
 */
typedef enum ddp_optimizer { DDP_SGD = 0, DDP_ADAMW = 1, DDP_LION = 2 } ddp_optimizer;

/*
 * The parameters' precision for compute. Master parameters, gradients and optimizer state are
 * f32 at both; DDP_PREC_BF16 adds a bf16 compute copy of the parameters (see ddp_param_data()).
 */
typedef enum ddp_precision { DDP_PREC_F32 = 0, DDP_PREC_BF16 = 1 } ddp_precision;

/* Log hook: one line (no newline), borrowed for the call. Levels are COLL_LOG_* values. */
typedef void (*ddp_log_fn)(void *arg, int level, const char *msg);

/* What the trace hook reports, for overlap measurements (timestamps on the monotonic clock). */
typedef enum ddp_event {
    DDP_EV_BUCKET_LAUNCH = 0, /* a bucket's (or unit's) reduction was issued; index = bucket */
    DDP_EV_BUCKET_DONE,       /* its reduction completed; index = bucket */
    DDP_EV_BACKWARD_END,      /* ddp_micro_end() was called; index = micro-step */
    DDP_EV_GATHER_LAUNCH,     /* stage 3: a unit's allgather was issued; index = unit */
    DDP_EV_STEP_END,          /* ddp_step() finished; index = step */
} ddp_event;

typedef void (*ddp_trace_fn)(void *arg, ddp_event ev, int index, int64_t t_ns);

/* Settings. Fill with ddp_options_init(), then change what you need; extended only at the end. */
typedef struct ddp_options {
    int zero_stage;            /* 0 (DDP), 1, 2 or 3 (0) */
    size_t first_bucket_bytes; /* the first bucket (last layers' gradients) (1 MiB) */
    size_t bucket_bytes;       /* every other bucket (25 MiB) */
    int pool_slots;            /* stages 2-3: staging buffers for gradients, and stage 3:
                                  gathered units; at least 2, and no more are made than there
                                  are buckets or units (4) */

    ddp_optimizer optimizer; /* a ddp_optimizer (DDP_SGD); ddp_options_set_optimizer() also
                                sets its default hyper-parameters */
    float momentum;          /* SGD momentum (0) */
    bool nesterov;           /* SGD Nesterov momentum, needs momentum > 0 (false) */
    float weight_decay;      /* SGD: L2 added to the gradient; AdamW, Lion: decoupled (0) */
    float beta1, beta2, eps; /* AdamW (0.9, 0.999, 1e-8); Lion: beta1 weighs the update's
                                interpolation, beta2 the momentum's (0.9, 0.99 through
                                ddp_options_set_optimizer()), eps unused */
    float clip_norm;         /* clip the global gradient norm to this; <= 0: off (0) */

    int device; /* -1: host memory; >= 0: the CUDA device ordinal whose memory holds the arenas
                   (a CUDA build; libddp(3), THE DEVICE PATH); every call on the model
                   leaves it the calling thread's current device (-1) */

    ddp_log_fn log; /* optional; NULL: silent */
    void *log_arg;
    ddp_trace_fn trace; /* optional; NULL: none */
    void *trace_arg;

    void *stream;            /* device >= 0: the caller's compute stream (a cudaStream_t), on
                                which it runs forward and backward and on which the library
                                enqueues zeroing, casts and the optimizer; NULL: the legacy
                                default stream. Borrowed: it must outlive the model. Ignored on
                                the host (NULL) */
    ddp_precision precision; /* DDP_PREC_F32 or DDP_PREC_BF16: a bf16 compute copy of the
                                parameters, f32 master weights (DDP_PREC_F32) */
    coll_dtype reduce_dtype; /* COLL_F32, or COLL_BF16: each bucket's gradients are cast to bf16
                                pre-divided by the world size, summed in bf16 and cast back to
                                f32 (half the traffic, about 3 significant digits) (COLL_F32) */
} ddp_options;

/* Fills `opts` with the defaults given in brackets above. */
void ddp_options_init(ddp_options *opts);

/*
 * Sets opts->optimizer to `opt` and the hyper-parameters that optimizer reads (not
 * weight_decay, clip_norm) to its defaults, given in brackets above. Returns 0, or -EINVAL
 * (NULL, or `opt` is no ddp_optimizer: opts unchanged). Thread-safe.
 */
int ddp_options_set_optimizer(ddp_options *opts, ddp_optimizer opt);

/* The optimizer's name ("sgd", "adamw", "lion"), static; NULL for a value that is none. Every
 * optimizer is ddp_optimizer_name(i) for i = 0, 1, ... up to the first NULL. Thread-safe. */
const char *ddp_optimizer_name(ddp_optimizer opt);

/* The ddp_optimizer named `name` (borrowed), >= 0, or -EINVAL (NULL or no such name).
 * Thread-safe. */
int ddp_optimizer_from_name(const char *name);

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* A static description of any return code of this library (or of libcollective). */
const char *ddp_strerror(int err);

/*
 * Releases memory this library allocated for the caller (ddp_checkpoint_load()'s user_json).
 * NULL is a no-op. Thread-safe.
 */
void ddp_free(void *p);

typedef struct ddp_model ddp_model;

/*
 * The model's account of its last failure ("" if none), owned by the model, valid until its
 * next call. With m == NULL: the calling thread's last ddp_model_create() failure.
 */
const char *ddp_last_error(const ddp_model *m);

/*
 * 0 while the model can be used, else the negative code that broke it (a failed collective or
 * device operation: every later call returns it). It tells a caller whose call failed whether
 * only that call failed (a checkpoint save, a bad argument) or the model is gone. NULL: -EINVAL.
 * Local (no communication).
 */
int ddp_model_broken(const ddp_model *m);

/* ------------------------------------------------------------------------------------------ */
/* Building a model                                                                            */
/* ------------------------------------------------------------------------------------------ */

/*
 * Creates an empty model on `comm` (borrowed: it must outlive the model; the model issues its
 * collectives on it, and aborts it on misuse: libddp(3), Misuse). The caller may issue its own
 * collectives on `comm` between any two calls on the model, from the model's thread, when every
 * rank issues them at the same point of its sequence of calls: they run after the model's
 * collectives in flight (libddp(3), SEMANTICS; a coll_comm_split() communicator does not wait
 * for those). A device model sets `comm`'s stream to its own (do not change it). `opts` is copied
 * (NULL: defaults). Returns 0 and sets *out, -EINVAL (bad option: also a host model, device
 * -1, on an nccl communicator, whose collectives need device memory), -ENOTSUP (opts->device >= 0
 * in a build without CUDA, or no GPU), COLL_ECUDA (the device cannot be used, or the
 * communication stream not made) or -ENOMEM. Every rank.
 */
int ddp_model_create(coll_comm *comm, const ddp_options *opts, ddp_model **out);

/* Frees the model and its memory. NULL is a no-op. Does not free the communicator; a device
 * model sets its stream back to NULL (the legacy default stream). */
void ddp_model_free(ddp_model *m);

/*
 * Starts a unit (a layer: what stage 3 gathers at once) named `name` (copied). Parameters added
 * next belong to it. Returns the unit's index (0, 1, ...) or -EINVAL (after commit, bad name).
 */
int ddp_unit_add(ddp_model *m, const char *name);

/*
 * Registers a parameter of unit `unit` (which must be the latest unit added): `name` (copied),
 * `ndim` dimensions of `shape` (copied; each > 0), `dtype` (COLL_F32, the one dtype the
 * optimizers handle). Parameters are laid out in registration order. Returns the parameter's
 * index (0, 1, ...), -EINVAL or -ENOTSUP (another dtype).
 */
int ddp_param_add(ddp_model *m, int unit, const char *name, int ndim, const int64_t *shape,
                  coll_dtype dtype);

/*
 * Fills parameter `param`'s `count` elements at `data` (host memory) with its initial values;
 * called on rank 0 only, once per parameter in registration order. Returns 0, or a negative
 * code that ddp_model_commit() returns.
 */
typedef int (*ddp_init_fn)(void *arg, int param, const char *name, void *data, size_t count);

/*
 * Ends registration. Every rank checks that all ranks registered the same layout (parameter
 * count, names, shapes, dtypes), builds the arenas and the buckets or shards, and receives rank
 * 0's initial values (from `init` called on rank 0; NULL: zeros). Returns 0; -EINVAL (no
 * parameters, or the layouts differ: on every rank ddp_last_error() names the first differing
 * rank and parameter); -ENOMEM; or a collective's failure (see ddp_step()). Every rank.
 */
int ddp_model_commit(ddp_model *m, ddp_init_fn init, void *arg);

/* ------------------------------------------------------------------------------------------ */
/* Views                                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* The number of parameters and of units registered; 0 for NULL. */
int ddp_num_params(const ddp_model *m);
int ddp_num_units(const ddp_model *m);
/* The parameter's element count, or 0 for a bad index. */
size_t ddp_param_count(const ddp_model *m, int param);
/*
 * The parameter's name, owned by the model: valid until ddp_model_free() or, before commit,
 * the next ddp_param_add(). NULL for a bad index.
 */
const char *ddp_param_name(const ddp_model *m, int param);

/*
 * The parameter's values for compute: f32 (`float *`) at DDP_PREC_F32, the bf16 compute copy
 * (`uint16_t *` holding bf16; `__nv_bfloat16` on the device) at DDP_PREC_BF16, device memory
 * when opts.device >= 0. Stages 0-2, valid from commit to free (updated by ddp_step());
 * stage 3, valid between ddp_unit_gather() and ddp_unit_release() of its unit. NULL for a bad
 * index or outside that window. The caller must not write into it.
 */
void *ddp_param_data(ddp_model *m, int param);

/* The element type of ddp_param_data(): COLL_F32 or COLL_BF16 (opts.precision); COLL_F32 for
 * NULL. */
coll_dtype ddp_param_dtype(const ddp_model *m);

/*
 * Where backward adds (+=) the parameter's f32 gradient for the current micro-step (`float *`,
 * whatever opts.precision; device memory when opts.device >= 0); add, never assign. Stages 0-1:
 * the parameter's view of the gradient arena, zeroed by each ddp_step(), where micro-steps
 * accumulate (it holds the step's earlier micro-steps' sum); stages 2-3: a slot of a bounded
 * staging pool, zeroed when the micro-step's first call for its bucket (or unit) takes it, valid
 * until ddp_grad_ready() of the last parameter of that bucket (or unit). A second call for the
 * same parameter in a micro-step returns the same buffer with what was added kept, at every
 * stage. Write a parameter's gradient before its ddp_grad_ready(), not after. NULL for a bad
 * index, outside a micro-step, or when no slot is free and waiting for one failed
 * (ddp_last_error() says why; ddp_micro_end() returns the failure).
 */
void *ddp_grad_buffer(ddp_model *m, int param);

/* ------------------------------------------------------------------------------------------ */
/* The step                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/*
 * Begins a micro-step. `sync` false accumulates gradients without communicating (PyTorch's
 * no_sync), stages 0-1 only (stages 2-3 reduce every micro-step whatever `sync` says); the last
 * micro-step before ddp_step() must have sync true, and only the last: a micro-step after one
 * with sync true is refused. Returns 0 or -EINVAL (misuse: the previous micro-step did not end,
 * or one with sync true ended since the last step; nothing issued, the model goes on). Every
 * rank.
 */
int ddp_micro_begin(ddp_model *m, bool sync);

/*
 * Stage 3: makes unit `unit`'s parameters available (allgathers them into a pool slot unless
 * already there) and prefetches the next unit in the direction of travel (forward: unit + 1;
 * backward: unit - 1). Other stages: returns 0 at once. Returns 0 or a collective's failure.
 * Every rank, same order.
 */
int ddp_unit_gather(ddp_model *m, int unit);

/* Stage 3: frees the unit's gathered copy. Other stages: no-op. Returns 0 or -EINVAL. */
int ddp_unit_release(ddp_model *m, int unit);

/*
 * Says that the gradient of `param` is final for this micro-step. When it completes a bucket
 * (or unit) whose reduction is due, the reduction is issued at once, in bucket order, so that
 * it overlaps the rest of backward. Returns 0; -EINVAL (no micro-step or a bad index; or marked
 * twice in one micro-step: the message names it, the model is broken and the communicator
 * aborted, so that the peers fail naming this rank); or a collective's failure. Every rank, same
 * order.
 */
int ddp_grad_ready(ddp_model *m, int param);

/*
 * Ends the micro-step's backward. Returns 0; -EINVAL (no micro-step began; or a parameter's
 * gradient was not marked ready: the message names the first, the model is broken and the
 * communicator aborted, so that on the other ranks the pending or next call fails with
 * COLL_EREMOTE naming this rank); or a collective's failure. Every rank.
 */
int ddp_micro_end(ddp_model *m);

/* What one step did. */
typedef struct ddp_step_info {
    double grad_norm; /* the global gradient norm before clipping (inf/nan if not finite) */
    bool skipped;     /* a gradient was not finite; no parameter changed, on every rank */
    bool clipped;     /* gradients were scaled down to opts.clip_norm */
    int64_t step;     /* steps taken so far, skipped ones excluded */
} ddp_step_info;

/*
 * Finishes the reductions, computes the global gradient norm (sum of squares over owned parts,
 * one allreduce), clips, skips the step on every rank alike if a gradient is not finite, runs
 * the optimizer on the owned parts with learning rate `lr`, allgathers the parameters (stages
 * 1-2) and zeroes the gradients. `info` may be NULL. Returns 0; -EINVAL (misuse: no micro-step
 * with sync true since the last step); or a collective's failure: -ETIMEDOUT (a peer did not take
 * part in time), COLL_EREMOTE (a peer died or aborted), -ECANCELED, with ddp_last_error() naming
 * the culprit rank; after a failure the model is unusable (free it); COLL_ECUDA (a CUDA call
 * failed; the model is broken likewise). Every rank.
 * Device models (opts.device >= 0): everything is enqueued on the streams and ddp_step()
 * returns without waiting for the device, unless `info` is not NULL: then it synchronises the
 * compute stream to fill *info (the norm, the skip and the step counter live on the device).
 * Host models fill *info at no extra cost. A skipped step is a COLL_LOG_WARN line through the
 * log hook: always on the host, on a device only when `info` is not NULL (the host knows).
 */
int ddp_step(ddp_model *m, float lr, ddp_step_info *info);

/*
 * The last ddp_step()'s info (all zeros before the first step). Device models synchronise the
 * compute stream to read it. Returns 0, -EINVAL (NULL, not committed) or COLL_ECUDA. Local (no
 * collective).
 */
int ddp_step_info_get(ddp_model *m, ddp_step_info *out);

/* ------------------------------------------------------------------------------------------ */
/* Learning-rate schedules                                                                     */
/* ------------------------------------------------------------------------------------------ */

typedef enum ddp_schedule_kind { DDP_SCHED_CONSTANT = 0, DDP_SCHED_COSINE = 1 } ddp_schedule_kind;

/* A learning-rate schedule, read by ddp_schedule_lr() only (the model never sees it). */
typedef struct ddp_schedule {
    ddp_schedule_kind kind; /* DDP_SCHED_CONSTANT or DDP_SCHED_COSINE */
    float lr;               /* the peak learning rate, reached at step warmup_steps */
    int64_t warmup_steps;   /* steps t < warmup_steps get lr * (t + 1) / warmup_steps (<= 0:
                               none) */
    int64_t total_steps;    /* cosine: from lr at step warmup_steps down half a cosine to min_lr
                               at this step, and min_lr after it; constant: unused */
    float min_lr;           /* cosine: the floor; constant: unused */
} ddp_schedule;

/* The learning rate at step `step` (0-based; a negative step counts as 0), NaN for a NULL
 * schedule or an unknown kind. Pure; thread-safe. */
float ddp_schedule_lr(const ddp_schedule *s, int64_t step);

/* ------------------------------------------------------------------------------------------ */
/* Memory                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* Bytes held by this rank, by kind. */
typedef struct ddp_memory {
    size_t param_bytes;       /* persistent parameters (stage 3: the owned part), f32 masters
                                 and, at bf16, the compute copy */
    size_t grad_bytes;        /* persistent gradients (stages 2-3: the owned part) */
    size_t optimizer_bytes;   /* optimizer state (stages 1-3: the owned part) */
    size_t pool_bytes;        /* transient pools: staging and gathered units (and the bf16
                                 copies reduce_dtype bf16 reduces) */
    size_t model_state_bytes; /* param + grad + optimizer, the ZeRO paper's model states */
} ddp_memory;

/* Fills *out. Returns 0 or -EINVAL (NULL argument, or not committed). */
int ddp_memory_stats(const ddp_model *m, ddp_memory *out);

/* ------------------------------------------------------------------------------------------ */
/* The full state (FSDP's get_model_state_dict, full and unsharded)                            */
/* ------------------------------------------------------------------------------------------ */

/* ddp_model_get_params() flags: also the optimizer's state arrays, after the parameters. */
#define DDP_GET_OPTIMIZER (1u << 0)
/* ddp_model_get_params()'s root: every rank receives the copy. */
#define DDP_ALL_RANKS (-1)

/*
 * The name of array k of what ddp_model_get_params() writes: "param" (k 0, the parameters),
 * then the optimizer's state arrays, as checkpoints and `ddp-ckpt export --optimizer` name them
 * (PyTorch's state dict names): SGD with momentum "momentum_buffer" (none without); AdamW
 * "exp_avg", "exp_avg_sq"; Lion "exp_avg". Static; NULL past the last, for NULL or before
 * commit. Local.
 */
const char *ddp_model_state_name(const ddp_model *m, int k);

/*
 * The bytes ddp_model_get_params() writes with `flags`: (1 + the optimizer's arrays with
 * DDP_GET_OPTIMIZER) x the parameters' elements x 4. 0 for NULL, before commit, or unknown
 * flags. Local.
 */
size_t ddp_model_params_bytes(const ddp_model *m, unsigned flags);

/*
 * Copies the model's full parameters, unsharded, to `dst`: every parameter's elements as
 * registered (f32, row-major), in registration order, packed (no padding: parameter p starts
 * at the sum of the earlier ones' counts). These are the f32 master values at either precision,
 * the values a checkpoint saves and `ddp-ckpt export` writes, bit for bit. With
 * DDP_GET_OPTIMIZER, each optimizer state array follows in the same layout, in
 * ddp_model_state_name() order (an optimizer without state adds nothing).
 * `root` >= 0: only that rank receives, and the others' dst and nbytes are ignored (NULL, 0);
 * DDP_ALL_RANKS: every rank receives. `dst` is host memory, whatever opts.device, borrowed for
 * the call, at least ddp_model_params_bytes(m, flags) long (`nbytes`); the caller owns it.
 * Stage 0 copies its replica without communicating; stages 1-3 allgather each bucket or unit's
 * owned parts in turn, through a buffer of the largest one (model memory, allocated and freed
 * by the call), whatever `root` says. A device model's copy waits for the compute stream's
 * work (the last step's optimizer).
 * Returns 0; -EINVAL on every rank alike when any rank passed a bad argument (root neither a
 * rank nor DDP_ALL_RANKS; an unknown flag; a receiving rank's dst NULL or nbytes too small) or
 * the ranks passed different roots or flags (one small allreduce checks it first;
 * ddp_last_error() says what is wrong on this rank, or names the first rank at fault), nothing
 * copied, the model usable; -EINVAL also for a model not committed or inside a micro-step (no
 * exchange); -ENOMEM on a rank that cannot allocate what the copy needs (the others: -EINVAL
 * naming it); or a collective's or the device's failure (the model is broken, as after
 * ddp_step()). Every rank, with the same root and flags, outside micro-steps.
 */
int ddp_model_get_params(ddp_model *m, int root, void *dst, size_t nbytes, unsigned flags);

/* ------------------------------------------------------------------------------------------ */
/* Checkpoints                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/*
 * A checkpoint is a directory ROOT/step-NNNNNNNNNNNN (the optimizer step, 12 digits) holding one
 * shard file per rank of the saving job, shard-RRRRR-of-WWWWW.bin, and manifest.json, which
 * rank 0 writes last: the checkpoint is complete exactly when its manifest exists (written to a
 * temporary name, fsynced, renamed, the directory fsynced). Each rank writes only what it owns:
 * for every group (bucket or unit) of the saving layout, part `rank` of the fp32 parameters and
 * of each optimizer state array, at every stage (stage 0 and the replicated parameters of
 * stages 1-2 are written once, split as stage 1 splits them). The manifest (JSON) describes the
 * layout, the optimizer, the progress and a CRC32C per shard file and per chunk of it; libddp(3),
 * CHECKPOINTS, gives its format. A checkpoint loads at any world size and any stage.
 */

/*
 * Where training stands, saved with the model and given back by ddp_checkpoint_load(). The
 * library stores the three numbers in the manifest ("progress") and gives them back unchanged; it
 * reads none of them (the step count is the model's own, ddp_step_info.step). ddp-train's use:
 */
typedef struct ddp_checkpoint_progress {
    int64_t epoch;    /* the epoch to resume in (0-based) */
    int64_t position; /* where in that epoch to resume, in the caller's unit (ddp-train: the
                         next step of the epoch, so epoch * steps_per_epoch + position is the
                         step count) */
    uint64_t seed;    /* the run's seed (data order, initial values), kept as its 64 bits */
} ddp_checkpoint_progress;

/* ddp_checkpoint_save() flags (bits 0-7), and ddp_checkpoint_load() flags (bits 8-15): the two
 * sets are disjoint, and each call refuses the other's flags, and unknown bits, with -EINVAL. */
/* Save: return only when the checkpoint is complete (ddp_checkpoint_wait()). */
#define DDP_CKPT_SYNC (1u << 0)
/* Load: the parameters only (optimizer state zero, step 0). */
#define DDP_CKPT_PARAMS_ONLY (1u << 8)

/*
 * Saves the model's state as checkpoint ROOT/step-<steps taken> (ROOT is created if absent).
 * First waits for the previous save of this model to complete (as ddp_checkpoint_wait()
 * does). Then starts a writer thread and returns: the thread copies the owned state into a
 * host snapshot, then writes that, so training goes on during both. The checkpoint holds the
 * state as it is at this call, bit for bit: the thread copies group by group in the order the
 * optimizer updates them, and the next ddp_step()'s optimizer waits for each group's copy
 * before changing it (normally there is nothing to wait for: a memcpy takes less than the
 * forward and backward in between, and the optimizer moves more bytes per element than the
 * copy; a step that did wait says so through the log hook, COLL_LOG_INFO, with the time; a
 * device model's thread copies the host copy this call downloads, and no step waits);
 * ddp_checkpoint_load() waits for the whole copy. Until then the
 * caller must not write into the parameters (ddp_param_data()) itself. The checkpoint
 * becomes complete (rank 0 writes its manifest) once every rank's writer has finished, which
 * ddp_step() notices at no cost (one small exchange per step while a save is in flight, issued
 * by one step and read by the next, so that the host does not wait for it: libddp(3),
 * CHECKPOINTS) or ddp_checkpoint_wait() waits for.
 * `progress` (NULL: zeros) and `user_json` (a JSON object as text, copied; NULL: none: the
 * caller's own state, given back by ddp_checkpoint_load()) go into the manifest. `keep` > 0
 * removes the oldest complete checkpoints under ROOT beyond the newest `keep`, once this one is
 * complete (0: keep all; only complete checkpoints count, so a failed save never costs the
 * newest complete one). A save of a step that already has a checkpoint replaces it (its
 * manifest is removed first, so that no manifest ever describes shards being rewritten).
 * A failed save does not stop training, nor the next save: a write failure on any rank, or a
 * rank that cannot prepare (create the directory, allocate the snapshot), fails that save on
 * every rank alike, once known (the step's poll, the next save or ddp_checkpoint_wait()). Every
 * rank then logs it through the log hook (COLL_LOG_WARN: "checkpoint of step N failed: rank R:
 * writing FILE: No space left on device; DIR removed"), removes the torn step directory (each
 * rank its own shard, rank 0 the rest; a directory holding another save's complete checkpoint is
 * never touched) and keeps the failure for ddp_checkpoint_wait() until the next save starts.
 * Returns 0 (the save started, or failed in its preparation as just said); -EINVAL (bad
 * argument, user_json not a JSON object, model not committed or inside a micro-step); -ENOMEM
 * (no memory for the save's bookkeeping, before anything started); with
 * DDP_CKPT_SYNC, this save's failure as ddp_checkpoint_wait() returns it; or a collective's
 * failure (the model is broken, as after ddp_step(): ddp_model_broken()).
 * Every rank, between steps (not between ddp_micro_begin() and ddp_step()).
 */
int ddp_checkpoint_save(ddp_model *m, const char *root, const ddp_checkpoint_progress *progress,
                        const char *user_json, int keep, unsigned flags);

/*
 * Waits until the last save is complete: every rank's shard written and fsynced, and rank 0's
 * manifest renamed into place. Returns 0 (also when no save was made); the last save's failure,
 * at every call until the next save (-ENOSPC, -EIO, ... on every rank alike; ddp_last_error()
 * names the step, the rank and the file, e.g. "checkpoint of step 60 failed: rank 0: writing
 * ckpt/step-000000000060/shard-00000-of-00002.bin: No space left on device;
 * ckpt/step-000000000060 removed"; the model stays usable); or a collective's failure (the
 * model is broken: ddp_model_broken() tells the two apart). Every rank. ddp_model_free() joins
 * a writer still running but writes no manifest: call this first so that the last save
 * completes.
 */
int ddp_checkpoint_wait(ddp_model *m);

/*
 * Finds the newest complete checkpoint under `root`: the step-* directory with the highest
 * step whose manifest.json exists and parses. Directories without a manifest (a save that
 * crashed or is in flight) or with a malformed one are skipped, each with a COLL_LOG_WARN line
 * through `log` (may be NULL) naming it. Writes its path into path[cap]. Returns 1 (found), 0
 * (none, or `root` does not exist), -ENAMETOOLONG, or another negative errno (root unreadable).
 * Local (no communication); thread-safe.
 */
int ddp_checkpoint_latest(const char *root, char *path, size_t cap, ddp_log_fn log,
                          void *log_arg);

/*
 * Loads the checkpoint at `path` (a step-* directory) into the committed model: parameters,
 * optimizer state and the step count, whatever world size and stage saved it. Each rank reads
 * only the byte ranges it owns in its own layout (each chunk read is checked against the
 * manifest's CRC32C), then stages 0-2 allgather the parameters (stage 0 also the optimizer
 * state). Same world size and stage as the save: training continues bit for bit. Checks that
 * the manifest describes this model (every parameter, matched by its name "unit.param", with
 * its shape and dtype; the order may differ) and optimizer (kind; differing hyper-parameters
 * are logged as warnings). `progress` (may be NULL) receives the
 * saved progress; `user_json` (may be NULL) receives the saved user state as a JSON text (free
 * it with ddp_free()) or NULL if none. Every rank must pass the same checkpoint (checked:
 * rank 0's step is compared). Returns 0, and on failure the same code on every rank, with
 * ddp_last_error() naming the file and what is wrong: -ENOENT (no manifest, a missing shard),
 * -EPROTO (malformed manifest, a shard of the wrong size), -EBADMSG (a CRC32C mismatch),
 * -EINVAL (another model or optimizer, different checkpoints on different ranks, not
 * committed, inside a micro-step), -EIO, -ENOMEM, or a collective's failure (the model is
 * broken). On failure the model's state is unspecified unless the code is -EINVAL from the
 * checks made before reading; load again or free it. Every rank, between steps.
 */
int ddp_checkpoint_load(ddp_model *m, const char *path, unsigned flags,
                        ddp_checkpoint_progress *progress, char **user_json);

/* ------------------------------------------------------------------------------------------ */
/* TensorBoard summaries                                                                       */
/* ------------------------------------------------------------------------------------------ */

/*
 * A writer of TensorBoard scalar event files, for a trainer's own numbers (the loss, the
 * learning rate, ddp_step_info's gradient norm, ddp_memory_stats()'s bytes): `tensorboard
 * --logdir` reads them as it reads PyTorch's SummaryWriter's. It needs no ddp_model and makes
 * no collective: call it on one rank (rank 0, say). libddp(3), TENSORBOARD, shows a loop.
 * One thread at a time per writer; distinct writers are independent.
 */
typedef struct ddp_summary ddp_summary;

/*
 * Creates `logdir` (with its parents) if absent and a new event file in it,
 * events.out.tfevents.<Unix seconds>.<host>.<pid>.<serial> (the seconds raised past the latest
 * event file's in `logdir`, so that names sort in the order of writing, which is the order
 * TensorBoard reads them; created exclusively: a writer never
 * appends to another's file; TensorBoard merges the files of a directory into one run), and
 * writes its first event (the file version). `start_step` >= 0 also writes a session start at
 * that step: TensorBoard then drops what files written earlier into the same directory hold at
 * step `start_step` and later, so a restarted job that resumes from a checkpoint of step S
 * passes S + 1 (the first step it records, when steps are counted from 1) and its curves
 * continue without the dead attempt's tail; a fresh run passes 0 or 1 and replaces an earlier
 * run in that directory in TensorBoard's view (the files stay); -1 writes none, for several
 * writers sharing a directory. `logdir` is borrowed. Returns 0 with *out the writer (close it
 * with ddp_summary_close()), -EINVAL (NULL or empty logdir, NULL out), -ENOMEM, -ENAMETOOLONG,
 * or the negative errno of creating the directory or the file (-EACCES, -ENOTDIR, ...).
 */
int ddp_summary_open(const char *logdir, int64_t start_step, ddp_summary **out);

/*
 * Appends the scalar `value` (stored as a float, as TensorBoard's simple_value is) under `tag`
 * (e.g. "train/loss": the part before the first '/' is the dashboard's group) at `step` (the
 * plot's x axis), with the current wall-clock time. Each event reaches the file with one
 * write(2), so a live `tensorboard --logdir` sees it at once. Returns 0, -EINVAL (NULL writer,
 * NULL or empty tag), -ENAMETOOLONG (a tag over 1024 bytes), or the negative errno of the
 * write (-ENOSPC, -EIO, ...): the file is then cut back to its last whole event, and later calls
 * may succeed.
 */
int ddp_summary_scalar(ddp_summary *s, const char *tag, int64_t step, double value);

/* The event file's path (the writer's; valid until ddp_summary_close()), or NULL for NULL. */
const char *ddp_summary_path(const ddp_summary *s);

/*
 * Closes the file and frees the writer; NULL is a no-op. Every event is already in the file.
 * Returns 0 or the negative errno of close(2).
 */
int ddp_summary_close(ddp_summary *s);

#ifdef __cplusplus
}
#endif

#endif /* DDP_H */
