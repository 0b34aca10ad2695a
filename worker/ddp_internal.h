/*
 * What ddp.c shares with the rest of libddp (today ckpt.c) without opening its struct: a view of
 * the committed model's memory and layout, its error helpers, and the hooks checkpoints need
 * in the step's life cycle. Internal (ddp__ prefix); nothing here is exported.
 *
 * The view's pointers are the model's own memory, valid until ddp_model_free(); it is taken
 * afresh by each caller, never kept across calls.
 */
#ifndef DDP_INTERNAL_H
#define DDP_INTERNAL_H

#include "ddp.h"
#include "plan.h"

#include <stdint.h>

struct ddp__ckpt_state;

typedef struct ddp__model_view {
    coll_comm *comm;
    int rank, world, stage;
    const ddp_options *o;
    const ddp__plan *plan;
    float *param;     /* stages 0-2: the arena (plan.total); stage 3: the owned parts (compact) */
    float *opt[2];    /* momentum or AdamW's m, AdamW's v; NULL where the optimizer has none */
    size_t opt_elems; /* elements of each: plan.total at stage 0, else plan.shard_total */
    int64_t *steps, *attempted;  /* the step counters (ddp_step_info.step, ddp_step() calls) */
    struct ddp__ckpt_state **ck; /* the checkpoint state the model owns (ckpt.c), or NULL */
} ddp__model_view;

/*
 * Fills *v for a committed model between steps. Returns 0; -EINVAL (NULL, not committed, or
 * inside a micro-step: m's error says which), or the code of a broken model.
 */
int ddp__model_view_get(ddp_model *m, ddp__model_view *v);

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
 * Called by ddp_step() after each step while a save is in flight: one small allreduce tells
 * whether every rank's writer has finished, and completes the save when it has (ckpt.c).
 * Returns 0, or a collective's failure (the model is then broken). Every rank.
 */
int ddp__ckpt_poll(ddp_model *m);

/*
 * Called by ddp_step() just before its optimizer changes the owned state (and by the load):
 * blocks until an asynchronous save's writer thread has copied that state into its snapshot.
 * Returns at once when no save is in flight or the copy is done (normally: the forward and
 * backward after a save take longer than the copy); a wait that blocked is reported to the log
 * hook (COLL_LOG_INFO, "checkpoint DIR: waited T ms for the writer's copy of the state"). NULL
 * is a no-op. Local, no collective.
 */
void ddp__ckpt_wait_copied(struct ddp__ckpt_state *ck);

/* Joins a writer still running and frees the checkpoint state; NULL is a no-op. */
void ddp__ckpt_state_free(struct ddp__ckpt_state *ck);

#endif /* DDP_INTERNAL_H */
