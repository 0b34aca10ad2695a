/*
 * What ddp.c shares with the rest of libddp (ckpt.c) without opening its struct: a view of
 * the committed model's memory and layout, its error helpers, and the hooks checkpoints need
 * in the step's life cycle. Internal (ddp__ prefix); nothing here is exported.
 *
 * The view's pointers are the model's own memory, valid until ddp_model_free(); it is taken
 * afresh by each caller, never kept across calls.
 */
#ifndef DDP_INTERNAL_H
#define DDP_INTERNAL_H

#include "ddp.h"
#include "optimizer.h"
#include "plan.h"

#include <stdbool.h>
#include <stdint.h>

struct ddp__ckpt_state;

typedef struct ddp__model_view {
    coll_comm *comm;
    int rank, world, stage;
    const ddp_options *o;
    const ddp__plan *plan;
    float *param;  /* stages 0-2: the arena (plan.total); stage 3: the owned parts (compact) */
    float *opt[DDP__OPT_MAX_STATE]; /* the optimizer's state arrays ([nopt]; NULL beyond) */
    int nopt;                       /* ddp__optimizer_nstate() of o */
    const uint16_t *compute;    /* the bf16 compute copy (param's layout), or NULL at f32; model
                                   memory (device memory for a device model) */
    size_t opt_elems;           /* elements of each: plan.total at stage 0, else plan.shard_total */
    int64_t *steps, *attempted; /* the step counters (ddp_step_info.step, ddp_step() calls) */
    struct ddp__ckpt_state **ck; /* the checkpoint state the model owns (ckpt.c), or NULL */
} ddp__model_view;

/*
 * Fills *v for a committed model between steps. Returns 0; -EINVAL (NULL, not committed, or
 * inside a micro-step: m's error says which), or the code of a broken model.
 */
int ddp__model_view_get(ddp_model *m, ddp__model_view *v);

/*
 * As ddp__model_view_get(), but the state arrays (param, opt) are in host memory: for a device
 * model, host copies the model keeps, into which the state is downloaded (after the compute
 * stream's work, the step count read from the device) when `download`. A host model's own
 * arrays otherwise. Returns as ddp__model_view_get(), or -ENOMEM, or COLL_ECUDA (broken).
 */
int ddp__model_view_host(ddp_model *m, ddp__model_view *v, bool download);

/*
 * After a load wrote the owned parts of the view's host arrays and *steps: uploads them (device
 * models), allgathers the parameters at stages 0-2 (stage 0: also the optimizer's arrays),
 * refreshes the bf16 compute copy and the device's step count. Returns 0 or a failure (the
 * model is broken). Every rank.
 */
int ddp__state_loaded(ddp_model *m);

/* Small exchanges of host values, which go through device memory for device models (the nccl
 * backend takes nothing else). Return 0 or the failure, the model broken, described as `what`.
 * Every rank. */
enum ddp__host_kind { DDP__HOST_ALLGATHER, DDP__HOST_BROADCAST, DDP__HOST_ALLREDUCE };
int ddp__host_coll(ddp_model *m, enum ddp__host_kind kind, const void *in, void *out, size_t count,
                   coll_dtype dt, coll_op op, const char *what);

/*
 * The same exchanges, asynchronous, for those inside ddp_step() (ckpt.c's poll): the result of
 * one issued at a step is read at the next, when it has long arrived, so the host does not
 * wait for the device's queue. One at a time, through buffers the model keeps:
 *
 * ddp__host_icoll_reserve() makes them hold an exchange of up to nbytes of result (count
 * elements, times the world for an allgather); buffers already that large are kept. Call with
 * no exchange in flight, on a blocking path (device: allocates, and frees smaller buffers).
 * Returns 0, -ENOMEM or COLL_ECUDA (m's error has CUDA's message; the model is not broken).
 * Local.
 *
 * ddp__host_icoll() issues one: `in` is copied (borrowed for the call). Device models enqueue
 * it on the communication stream, behind the step's reductions and gathers, without waiting
 * (the cpu backend on device buffers completes it on the host); host models queue it on
 * libcollective's progress thread. ddp__host_icoll_wait() waits for it (device: an event
 * recorded after its result reached page-locked host memory) and sets *out to the result,
 * valid until the next exchange. Return 0 or the failure, the model broken, described as
 * `what`. Every rank, at the same points.
 */
int ddp__host_icoll_reserve(ddp_model *m, size_t nbytes);
int ddp__host_icoll(ddp_model *m, enum ddp__host_kind kind, const void *in, size_t count,
                    coll_dtype dt, coll_op op, const char *what);
int ddp__host_icoll_wait(ddp_model *m, const void **out);

/* Parameter p's unit, dimensions and shape (shape[DDP__CKPT_MAX_DIMS]); p must be valid. */
void ddp__param_shape(const ddp_model *m, int p, int *unit, int *ndim, int64_t *shape);

/* Unit u's name, owned by the model; u must be valid. */
const char *ddp__unit_name(const ddp_model *m, int u);

/* Sets the model's last error (as every public call does on failure) and returns rc. */
int ddp__fail(ddp_model *m, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* A collective failed: breaks the model (every later call returns the code) and returns it. */
int ddp__coll_failed(ddp_model *m, int rc, const char *what);

/* Stage 3: releases every gathered unit (their copies would be stale after a load). */
int ddp__drop_units(ddp_model *m);

/* ckpt.c's side of the hooks: */

/*
 * Called by ddp_step() after each step while a save is in flight: reads the result of the
 * exchange the previous call issued (whether every rank's writer had finished; the shards'
 * CRCs), moves the save on from it, and issues the next exchange (ddp__host_icoll()) unless
 * the save is complete (ckpt.c). Returns 0, or a collective's failure (the model is then
 * broken). Every rank.
 */
int ddp__ckpt_poll(ddp_model *m);

/*
 * Called before the owned state changes (the load; ddp_model_free()): blocks until an
 * asynchronous save's writer thread has copied all of it into its snapshot. Returns at once
 * when no save is in flight or the copy is done; a wait that blocked is reported to the log
 * hook (COLL_LOG_INFO, "checkpoint DIR: waited T ms for the writer's copy of the state"). NULL
 * is a no-op. Local, no collective.
 */
void ddp__ckpt_wait_copied(struct ddp__ckpt_state *ck);

/*
 * ddp_step()'s finer wait (host models; a device model's writer copies a host copy of the
 * state): blocks until the writer has copied the owned parts of groups [0, g]
 * (it copies them in plan order, the optimizer's order), so that the optimizer updates group g
 * as soon as its parts are in the snapshot rather than after the whole copy. Returns the
 * nanoseconds it blocked (0 at once when no save is in flight); ddp__ckpt_waited() reports a
 * step's total to the log hook as ddp__ckpt_wait_copied() does (nothing for 0). NULL: 0, no-op.
 */
int64_t ddp__ckpt_wait_group(struct ddp__ckpt_state *ck, int g);
void ddp__ckpt_waited(struct ddp__ckpt_state *ck, int64_t ns);

/* Joins a writer still running and frees the checkpoint state; NULL is a no-op. */
void ddp__ckpt_state_free(struct ddp__ckpt_state *ck);

#endif /* DDP_INTERNAL_H */
