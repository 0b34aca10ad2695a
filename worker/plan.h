/*
 * libddp's layout arithmetic (internal, prefix ddp__): where each parameter lives in the flat
 * arenas, how parameters group into buckets (stages 0-2) or units (stage 3), and which part of
 * each group a rank owns. plan.c has the invariants; tests/test_ddp_plan.c checks them.
 */
#ifndef DDP_PLAN_H
#define DDP_PLAN_H

#include <stddef.h>

/* A group: a bucket (stages 0-2) or a unit (stage 3). Counts are in elements. */
typedef struct ddp__group {
    size_t offset; /* its first element in the arena */
    size_t count;  /* elements of its parameters */
    size_t padded; /* count rounded up to a multiple of the world size; the tail is padding */
    size_t shard;  /* padded / world: rank r owns [offset + r * shard, offset + (r + 1) * shard) */
    size_t shard_offset; /* where its owned part sits in the compact array of owned parts */
    int first, last;     /* its parameters, [first, last] in registration order */
} ddp__group;

typedef struct ddp__plan {
    int nparams, ngroups, world;
    size_t total;         /* arena elements, padding included (sum of every group's padded) */
    size_t shard_total;   /* sum of every group's shard: the owned parts of one rank */
    size_t max_padded;    /* the largest group's padded count (a pool slot's size) */
    size_t *param_offset; /* [nparams] each parameter's first element in the arena */
    int *param_group;     /* [nparams] the group holding each parameter */
    ddp__group *groups;   /* [ngroups] */
} ddp__plan;

/*
 * Builds the plan of `nparams` parameters of counts[i] elements each (> 0), in registration
 * order, for `world` ranks (> 0).
 *
 * by_unit == 0: buckets. Walking the parameters from the last to the first, a bucket is closed
 * when adding the next parameter would take it past its cap: `first_cap_bytes` for bucket 0,
 * `cap_bytes` for the others (a parameter larger than the cap gets a bucket of its own). Bucket
 * 0 therefore holds the last parameters and sits at the end of the arena.
 * by_unit == 1: one group per unit; units[i] (borrowed) is parameter i's unit, and must run
 * 0, 1, 2, ... without gaps, each unit's parameters consecutive.
 *
 * `elem_bytes` (> 0) converts the caps to elements. Returns 0 and fills *out (release it with
 * ddp__plan_free()), -EINVAL (a bad argument) or -ENOMEM. *out is written only on success.
 */
int ddp__plan_build(const size_t *counts, const int *units, int nparams, int world, int by_unit,
                    size_t first_cap_bytes, size_t cap_bytes, size_t elem_bytes, ddp__plan *out);

/* Frees what ddp__plan_build() allocated and zeroes *p. NULL or a zeroed plan: a no-op. */
void ddp__plan_free(ddp__plan *p);

/* The first element of rank `rank`'s part of group `g` in the arena. */
static inline size_t ddp__owned_offset(const ddp__plan *p, int g, int rank)
{
    return p->groups[g].offset + (size_t)rank * p->groups[g].shard;
}

#endif /* DDP_PLAN_H */
