/*
 * libddp's layout arithmetic: buckets or units, padding and owned parts. Pure: no I/O, no
 * communication, no clock, no global state; it allocates the plan's arrays and nothing else,
 * so the unit tests (tests/test_ddp_plan.c) reach every edge without a communicator. It does
 * not decide when anything is reduced; ddp.c does.
 *
 * Invariants of a plan built here:
 *  - The arena holds the parameters in registration order. Each group is a contiguous range
 *    [offset, offset + padded): its parameters' `count` elements, then padded - count < world
 *    elements of padding, which the runtime keeps at zero in parameters, gradients and state.
 *  - padded is a multiple of world, so a group splits into world equal parts of shard = padded
 *    / world elements; rank r owns [offset + r * shard, offset + (r + 1) * shard). The parts of
 *    one group cover it exactly, without overlap; world == 1 means no padding at all.
 *  - Groups are numbered in the order backward completes them for buckets (bucket 0 holds the
 *    last parameters and sits at the end of the arena) and in the caller's order for units.
 *  - Consecutive groups in the arena touch: the sum of every padded is `total`.
 *  - shard_offset places each group's owned part in a compact array of shard_total elements,
 *    in group order: the layout of sharded gradients, parameters and optimizer state.
 *  - A bucket never passes its cap unless it holds a single parameter larger than the cap.
 */
#include "plan.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void ddp__plan_free(ddp__plan *p)
{
    if (!p)
        return;
    free(p->param_offset);
    free(p->param_group);
    free(p->groups);
    memset(p, 0, sizeof *p);
}

/*
 * Buckets from the last parameter back: each starts with the next parameter not yet taken and
 * grows towards parameter 0 while the sum stays within its cap. Returns the number of buckets.
 */
static int make_buckets(const size_t *counts, int nparams, size_t first_cap, size_t cap,
                        ddp__group *g)
{
    int nb = 0;
    for (int i = nparams - 1; i >= 0; nb++) {
        size_t limit = nb == 0 ? first_cap : cap, sum = counts[i];
        g[nb].last = i--;
        while (i >= 0 && sum + counts[i] <= limit) /* no overflow: both < SIZE_MAX / 2 */
            sum += counts[i--];
        g[nb].first = i + 1;
    }
    return nb;
}

/* One group per unit, in unit order. Returns the number of units or -EINVAL. */
static int make_units(const int *units, int nparams, ddp__group *g)
{
    int nu = 0;
    for (int i = 0; i < nparams; i++) {
        if (i == 0 || units[i] != units[i - 1]) {
            if (units[i] != nu)
                return -EINVAL; /* 0, 1, 2, ... each unit once, its parameters together */
            g[nu++].first = i;
        }
        g[nu - 1].last = i;
    }
    return nu;
}

int ddp__plan_build(const size_t *counts, const int *units, int nparams, int world, int by_unit,
                    size_t first_cap_bytes, size_t cap_bytes, size_t elem_bytes, ddp__plan *out)
{
    if (!counts || nparams < 1 || world < 1 || elem_bytes == 0 || !out || (by_unit && !units))
        return -EINVAL;
    /* Arena sizes in bytes must fit a size_t with room for the padding. */
    size_t limit = SIZE_MAX / elem_bytes / 2, sum = 0;
    for (int i = 0; i < nparams; i++) {
        if (counts[i] == 0 || counts[i] > limit - sum)
            return -EINVAL;
        sum += counts[i];
    }
    if ((size_t)nparams * (size_t)world > limit - sum)
        return -EINVAL;

    ddp__plan p = {.nparams = nparams, .world = world};
    int rc = -ENOMEM;
    p.param_offset = calloc((size_t)nparams, sizeof *p.param_offset);
    p.param_group = calloc((size_t)nparams, sizeof *p.param_group);
    p.groups = calloc((size_t)nparams, sizeof *p.groups);
    if (!p.param_offset || !p.param_group || !p.groups)
        goto out;
    size_t first_cap = first_cap_bytes / elem_bytes, cap = cap_bytes / elem_bytes;
    rc = by_unit ? make_units(units, nparams, p.groups)
                 : make_buckets(counts, nparams, first_cap, cap, p.groups);
    if (rc < 0)
        goto out;
    p.ngroups = rc;

    /* The arena in registration order: for buckets, the highest-numbered group comes first. */
    size_t at = 0;
    for (int k = 0; k < p.ngroups; k++) {
        int gi = by_unit ? k : p.ngroups - 1 - k;
        ddp__group *g = &p.groups[gi];
        g->offset = at;
        g->count = 0;
        for (int i = g->first; i <= g->last; i++) {
            p.param_offset[i] = at + g->count;
            p.param_group[i] = gi;
            g->count += counts[i];
        }
        g->padded = (g->count + (size_t)world - 1) / (size_t)world * (size_t)world;
        g->shard = g->padded / (size_t)world;
        at += g->padded;
        if (g->padded > p.max_padded)
            p.max_padded = g->padded;
    }
    p.total = at;
    for (int g = 0; g < p.ngroups; g++) {
        p.groups[g].shard_offset = p.shard_total;
        p.shard_total += p.groups[g].shard;
    }
    *out = p;
    return 0;
out:
    ddp__plan_free(&p);
    return rc;
}
