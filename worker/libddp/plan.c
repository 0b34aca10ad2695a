/*
 * libddp's layout arithmetic: buckets or units, padding and shards (plan.h states the
 * invariants). Pure and allocation-only, so unit tests reach every edge
 * (tests/libddp/test_ddp_plan.c) without a communicator.
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
    free(p->shard_offset);
    memset(p, 0, sizeof *p);
}

/* Buckets, from the last parameter back: bucket b covers [first, last]. Returns the count. */
static int make_buckets(const size_t *counts, int nparams, size_t first_cap, size_t cap,
                        ddp__group *g)
{
    int nb = 0;
    for (int i = nparams - 1; i >= 0; nb++) {
        size_t limit = nb == 0 ? first_cap : cap, sum = counts[i];
        g[nb].last = i--;
        while (i >= 0 && counts[i] <= limit && sum + counts[i] <= limit)
            sum += counts[i--];
        g[nb].first = i + 1;
    }
    return nb;
}

/* One group per unit, in unit order. Returns the count, or -EINVAL for a malformed list. */
static int make_units(const int *units, int nparams, ddp__group *g)
{
    int nu = 0;
    for (int i = 0; i < nparams; i++) {
        if (i == 0 || units[i] != units[i - 1]) {
            if (units[i] != nu)
                return -EINVAL; /* units must be 0, 1, 2, ... each once, in order */
            g[nu].first = i;
            nu++;
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
    for (int i = 0; i < nparams; i++)
        if (counts[i] == 0 || counts[i] > SIZE_MAX / 4 / elem_bytes)
            return -EINVAL;

    ddp__plan p = {.nparams = nparams, .world = world};
    int rc = -ENOMEM;
    p.param_offset = calloc((size_t)nparams, sizeof *p.param_offset);
    p.param_group = calloc((size_t)nparams, sizeof *p.param_group);
    p.groups = calloc((size_t)nparams, sizeof *p.groups);
    if (!p.param_offset || !p.param_group || !p.groups)
        goto out;
    rc = by_unit ? make_units(units, nparams, p.groups)
                 : make_buckets(counts, nparams, first_cap_bytes / elem_bytes,
                                cap_bytes / elem_bytes, p.groups);
    if (rc < 0)
        goto out;
    p.ngroups = rc;
    rc = -ENOMEM;
    p.shard_offset = calloc((size_t)p.ngroups, sizeof *p.shard_offset);
    if (!p.shard_offset)
        goto out;

    /* Arena order is registration order: the group holding parameter 0 first. */
    size_t at = 0;
    for (int k = 0; k < p.ngroups; k++) {
        ddp__group *g = &p.groups[by_unit ? k : p.ngroups - 1 - k];
        g->offset = at;
        g->count = 0;
        for (int i = g->first; i <= g->last; i++) {
            p.param_offset[i] = at + g->count;
            p.param_group[i] = (int)(g - p.groups);
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
        p.shard_offset[g] = p.shard_total;
        p.shard_total += p.groups[g].shard;
    }
    *out = p;
    return 0;
out:
    ddp__plan_free(&p);
    return rc;
}
