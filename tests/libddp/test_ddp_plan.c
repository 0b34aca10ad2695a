/*
 * Tests of libddp's layout arithmetic (worker/libddp/plan.c): buckets built from the last parameter
 * back under their caps, units, padding to a multiple of the world size, and shards that cover
 * every group exactly. Pure functions; no communicator.
 */
#include <check.h>

#include <errno.h>
#include <stdlib.h>

#include "plan.h"
#include "check_main.h"

/* Checks the invariants plan.h states, whatever the input. */
static void check_invariants(const ddp__plan *p, const size_t *counts)
{
    size_t at = 0, shards = 0;
    /* Arena order is registration order: walk groups by offset. */
    for (int k = 0; k < p->ngroups; k++) {
        const ddp__group *g = NULL;
        for (int j = 0; j < p->ngroups; j++)
            if (p->groups[j].offset == at)
                g = &p->groups[j];
        ck_assert_msg(g != NULL, "no group at arena offset %zu", at);
        size_t sum = 0;
        for (int i = g->first; i <= g->last; i++) {
            ck_assert_uint_eq(p->param_offset[i], g->offset + sum);
            ck_assert_int_eq(p->param_group[i], (int)(g - p->groups));
            sum += counts[i];
        }
        ck_assert_uint_eq(g->count, sum);
        ck_assert_uint_eq(g->padded % (size_t)p->world, 0);
        ck_assert_uint_ge(g->padded, g->count);
        ck_assert_uint_lt(g->padded - g->count, (size_t)p->world);
        ck_assert_uint_eq(g->shard * (size_t)p->world, g->padded);
        ck_assert_uint_le(g->padded, p->max_padded);
        at += g->padded;
    }
    ck_assert_uint_eq(at, p->total);
    for (int g = 0; g < p->ngroups; g++) {
        ck_assert_uint_eq(p->shard_offset[g], shards);
        shards += p->groups[g].shard;
    }
    ck_assert_uint_eq(shards, p->shard_total);
}

START_TEST(test_buckets_reverse_order_and_caps)
{
    /* 4-byte elements; caps of 40 bytes (first) and 100 bytes (10 and 25 elements). */
    size_t counts[] = {5, 5, 20, 3, 4, 6, 30, 2};
    ddp__plan p;
    ck_assert_int_eq(ddp__plan_build(counts, NULL, 8, 1, 0, 40, 100, 4, &p), 0);
    check_invariants(&p, counts);
    /* Bucket 0 starts at the last parameter: 2, then 30 would pass 10 elements. */
    ck_assert_int_eq(p.groups[0].first, 7);
    ck_assert_int_eq(p.groups[0].last, 7);
    /* 30 is larger than the 25-element cap: a bucket of its own. */
    ck_assert_int_eq(p.groups[1].first, 6);
    ck_assert_int_eq(p.groups[1].last, 6);
    /* 6 + 4 + 3 = 13, then 20 would pass 25. */
    ck_assert_int_eq(p.groups[2].first, 3);
    ck_assert_int_eq(p.groups[2].last, 5);
    /* 20 + 5 = 25 fits exactly; the last 5 starts bucket 4. */
    ck_assert_int_eq(p.groups[3].first, 1);
    ck_assert_int_eq(p.groups[3].last, 2);
    ck_assert_int_eq(p.groups[4].first, 0);
    ck_assert_int_eq(p.ngroups, 5);
    /* Bucket 0 sits at the end of the arena, the last bucket at its start. */
    ck_assert_uint_eq(p.groups[4].offset, 0);
    ck_assert_uint_eq(p.groups[0].offset + p.groups[0].padded, p.total);
    ck_assert_uint_eq(p.total, 75); /* world 1: no padding */
    ddp__plan_free(&p);
}
END_TEST

START_TEST(test_padding)
{
    size_t counts[] = {3, 7, 1, 8};
    for (int world = 1; world <= 9; world++) {
        ddp__plan p;
        /* Caps of one element: every parameter alone. */
        ck_assert_int_eq(ddp__plan_build(counts, NULL, 4, world, 0, 4, 4, 4, &p), 0);
        check_invariants(&p, counts);
        ck_assert_int_eq(p.ngroups, 4);
        size_t total = 0;
        for (int i = 0; i < 4; i++)
            total += (counts[i] + (size_t)world - 1) / (size_t)world * (size_t)world;
        ck_assert_uint_eq(p.total, total);
        /* count < world: one element each, the rest padding. */
        if (world > 1) {
            const ddp__group *g = &p.groups[p.param_group[2]];
            ck_assert_uint_eq(g->padded, (size_t)world);
            ck_assert_uint_eq(g->shard, 1);
        }
        ddp__plan_free(&p);
    }
    /* Divisible counts get no padding. */
    size_t even[] = {8, 16};
    ddp__plan p;
    ck_assert_int_eq(ddp__plan_build(even, NULL, 2, 4, 0, 1 << 20, 1 << 20, 4, &p), 0);
    check_invariants(&p, even);
    ck_assert_int_eq(p.ngroups, 1);
    ck_assert_uint_eq(p.total, 24);
    ck_assert_uint_eq(p.groups[0].shard, 6);
    ddp__plan_free(&p);
}
END_TEST

START_TEST(test_units)
{
    size_t counts[] = {12, 3, 7, 7, 100, 1};
    int units[] = {0, 0, 1, 1, 2, 3};
    ddp__plan p;
    ck_assert_int_eq(ddp__plan_build(counts, units, 6, 3, 1, 4, 4, 4, &p), 0);
    check_invariants(&p, counts);
    ck_assert_int_eq(p.ngroups, 4);
    ck_assert_uint_eq(p.groups[0].count, 15);
    ck_assert_uint_eq(p.groups[1].offset, 15);
    ck_assert_uint_eq(p.groups[1].padded, 15); /* 14 -> 15 */
    ck_assert_uint_eq(p.groups[2].padded, 102);
    ck_assert_uint_eq(p.groups[3].padded, 3);
    ck_assert_uint_eq(p.max_padded, 102);
    ck_assert_uint_eq(p.shard_total, 5 + 5 + 34 + 1);
    ddp__plan_free(&p);

    int skip[] = {0, 0, 2, 2, 3, 3}; /* unit 1 has no parameter */
    ck_assert_int_eq(ddp__plan_build(counts, skip, 6, 3, 1, 4, 4, 4, &p), -EINVAL);
    int back[] = {0, 1, 0, 1, 2, 3}; /* unit 0 again after unit 1 */
    ck_assert_int_eq(ddp__plan_build(counts, back, 6, 3, 1, 4, 4, 4, &p), -EINVAL);
}
END_TEST

START_TEST(test_bad_arguments)
{
    size_t counts[] = {4, 0};
    ddp__plan p;
    ck_assert_int_eq(ddp__plan_build(counts, NULL, 2, 2, 0, 4, 4, 4, &p), -EINVAL);
    ck_assert_int_eq(ddp__plan_build(counts, NULL, 1, 0, 0, 4, 4, 4, &p), -EINVAL);
    ck_assert_int_eq(ddp__plan_build(counts, NULL, 0, 1, 0, 4, 4, 4, &p), -EINVAL);
    ck_assert_int_eq(ddp__plan_build(counts, NULL, 1, 1, 1, 4, 4, 4, &p), -EINVAL);
    ddp__plan z = {0};
    ddp__plan_free(&z);
    ddp__plan_free(NULL);
}
END_TEST

START_TEST(test_random_layouts)
{
    srand(7);
    for (int t = 0; t < 500; t++) {
        int n = 1 + rand() % 40, world = 1 + rand() % 8, by_unit = rand() % 2;
        size_t counts[40];
        int units[40], u = 0;
        for (int i = 0; i < n; i++) {
            counts[i] = 1 + (size_t)(rand() % 5000);
            if (i > 0 && rand() % 3 == 0)
                u++;
            units[i] = u;
        }
        ddp__plan p;
        ck_assert_int_eq(ddp__plan_build(counts, units, n, world, by_unit,
                                         (size_t)(1 + rand() % 20000), (size_t)(1 + rand() % 60000),
                                         4, &p),
                         0);
        check_invariants(&p, counts);
        if (by_unit)
            ck_assert_int_eq(p.ngroups, u + 1);
        ddp__plan_free(&p);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ddp_plan");
    check_tcase(s, "plan", 0, test_buckets_reverse_order_and_caps, test_padding, test_units,
                test_bad_arguments, test_random_layouts);
    return check_run(s);
}
