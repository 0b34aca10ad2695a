/*
 * libddp's layout arithmetic (plan.c): where each parameter lives in the flat arenas, how they
 * group into buckets (stages 0-2) or units (stage 3), and which part of each group a rank owns.
 * Pure: no I/O, no communication, no clock. Internal to libddp (ddp__ prefix).
 *
 * Invariants of a plan built by ddp__plan_build():
 *  - the arena holds the parameters in registration order, each group a contiguous range
 *    [offset, offset + padded) whose first `count` elements are its parameters and whose tail
 *    (padded - count < world elements) is padding, kept at zero;
 *  - padded is a multiple of world, so a group splits into world equal parts of
 *    shard = padded / world elements; rank r owns [offset + r * shard, offset + (r + 1) * shard);
 *  - buckets are numbered in the order backward completes them: bucket 0 holds the last
 *    registered parameters and sits at the end of the arena; units keep the caller's order;
 *  - shard_offset[g] places group g's owned part in a compact array of shard_total elements
 *    (the owned parts of every group, in group order), the layout of sharded state.
 */
#ifndef DDP_PLAN_H
#define DDP_PLAN_H

#include <stddef.h>

typedef struct ddp__group {
    size_t offset; /* first element in the arena */
    size_t count;  /* elements of its parameters */
    size_t padded; /* count rounded up to a multiple of world */
    size_t shard;  /* padded / world: the part each rank owns */
    int first;     /* its parameters are [first, last] in registration order */
    int last;
} ddp__group;

typedef struct ddp__plan {
    int nparams;
    int ngroups;
    int world;
    size_t total;         /* arena elements, padding included */
    size_t max_padded;    /* the largest group, padding included */
    size_t shard_total;   /* sum of every group's shard */
    size_t *param_offset; /* [nparams] first element of each parameter in the arena */
    int *param_group;     /* [nparams] the group of each parameter */
    ddp__group *groups;   /* [ngroups] */
    size_t *shard_offset; /* [ngroups] the group's owned part in the compact shard array */
} ddp__plan;

/*
 * Builds the plan for `nparams` parameters of counts[i] elements (> 0) each, in registration
 * order, for `world` ranks. by_unit = 0: buckets, made by walking the parameters from the last to
 * the first and closing a bucket when the next parameter would take it past its cap
 * (first_cap_bytes for bucket 0, cap_bytes for the others; a parameter larger than the cap gets
 * a bucket of its own). by_unit = 1: one group per unit, units[i] being parameter i's unit
 * (non-decreasing from 0, each unit's parameters consecutive and every unit non-empty).
 * elem_bytes converts the caps to elements. Returns 0 and fills *out (free with
 * ddp__plan_free()), -EINVAL or -ENOMEM.
 */
int ddp__plan_build(const size_t *counts, const int *units, int nparams, int world, int by_unit,
                    size_t first_cap_bytes, size_t cap_bytes, size_t elem_bytes, ddp__plan *out);

/* Frees what ddp__plan_build() allocated; a zeroed plan is a no-op. */
void ddp__plan_free(ddp__plan *p);

#endif /* DDP_PLAN_H */
