/*
 * Unit tests of libddp's layout arithmetic (worker/plan.c): buckets and units, padding and the
 * parts each rank owns, with no communicator.
 *
 * Fixed cases spell out the expected groups: bucket boundaries for given caps (the first bucket
 * smaller than the others), a parameter larger than its cap, every parameter in one bucket,
 * padding when a group is smaller than the world, divisible by it, or the world is 1; stage 3
 * units. Random layouts (up to 40 parameters, world 1 to 9, caps from one element up) are
 * checked against the invariants plan.c states and against a reference written from the rule
 * ("walk from the last parameter, close a bucket when the next one would pass the cap").
 * Bad arguments are rejected and a zeroed plan frees.
 */
#include <check.h>

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"

/* Group g of p is params [first, last], count elements, padded, and sits at offset. */
static void want_group(const ddp__plan *p, int g, int first, int last, size_t offset, size_t count,
                       size_t padded)
{
    ck_assert_int_lt(g, p->ngroups);
    const ddp__group *gr = &p->groups[g];
    ck_assert_msg(gr->first == first && gr->last == last,
                  "group %d holds [%d, %d], expected [%d, %d]", g, gr->first, gr->last, first,
                  last);
    ck_assert_msg(gr->offset == offset, "group %d at %zu, expected %zu", g, gr->offset, offset);
    ck_assert_msg(gr->count == count, "group %d count %zu, expected %zu", g, gr->count, count);
    ck_assert_msg(gr->padded == padded, "group %d padded %zu, expected %zu", g, gr->padded, padded);
    ck_assert_uint_eq(gr->shard * (size_t)p->world, gr->padded);
}

/* The invariants plan.c promises, whatever the input. */
static void check_invariants(const ddp__plan *p, const size_t *counts, int by_unit,
                             const int *units)
{
    size_t at = 0, shard_sum = 0, maxp = 0;
    bool *seen = calloc((size_t)p->nparams, sizeof *seen);
    ck_assert_ptr_nonnull(seen);
    /* In arena order, groups touch and their parameters are in registration order. */
    int expect_param = 0;
    for (int k = 0; k < p->ngroups; k++) {
        int g = by_unit ? k : p->ngroups - 1 - k;
        const ddp__group *gr = &p->groups[g];
        ck_assert_uint_eq(gr->offset, at);
        ck_assert_int_eq(gr->first, expect_param);
        size_t c = 0;
        for (int i = gr->first; i <= gr->last; i++) {
            ck_assert(!seen[i]);
            seen[i] = true;
            ck_assert_int_eq(p->param_group[i], g);
            ck_assert_uint_eq(p->param_offset[i], gr->offset + c);
            c += counts[i];
            if (by_unit)
                ck_assert_int_eq(units[i], g);
        }
        expect_param = gr->last + 1;
        ck_assert_uint_eq(gr->count, c);
        ck_assert(gr->padded >= gr->count && gr->padded - gr->count < (size_t)p->world);
        ck_assert_uint_eq(gr->padded % (size_t)p->world, 0);
        ck_assert_uint_eq(gr->shard, gr->padded / (size_t)p->world);
        /* The owned parts cover the group exactly, in rank order. */
        size_t end = gr->offset;
        for (int r = 0; r < p->world; r++) {
            ck_assert_uint_eq(ddp__owned_offset(p, g, r), end);
            end += gr->shard;
        }
        ck_assert_uint_eq(end, gr->offset + gr->padded);
        at += gr->padded;
        if (gr->padded > maxp)
            maxp = gr->padded;
    }
    ck_assert_int_eq(expect_param, p->nparams);
    ck_assert_uint_eq(p->total, at);
    ck_assert_uint_eq(p->max_padded, maxp);
    for (int g = 0; g < p->ngroups; g++) {
        ck_assert_uint_eq(p->groups[g].shard_offset, shard_sum);
        shard_sum += p->groups[g].shard;
    }
    ck_assert_uint_eq(p->shard_total, shard_sum);
    ck_assert_uint_eq(p->shard_total * (size_t)p->world, p->total);
    free(seen);
}

START_TEST(buckets_for_caps)
{
    /* Counts in f32 elements; caps 16 bytes (4 elements) first, 40 bytes (10 elements) after. */
    size_t counts[] = {3, 2, 5, 4, 1, 3, 6};
    ddp__plan p;
    ck_assert_int_eq(ddp__plan_build(counts, NULL, 7, 1, 0, 16, 40, 4, &p), 0);
    /* From the end: 6 > 4 alone -> bucket 0 = [6]; then 3 + 1 + 4 = 8 (+ 5 = 13 > 10) ->
     * bucket 1 = [3, 5]; then 5 + 2 + 3 = 10 -> bucket 2 = [0, 2]. */
    ck_assert_int_eq(p.ngroups, 3);
    want_group(&p, 0, 6, 6, 18, 6, 6);
    want_group(&p, 1, 3, 5, 10, 8, 8);
    want_group(&p, 2, 0, 2, 0, 10, 10);
    ck_assert_uint_eq(p.total, 24);
    check_invariants(&p, counts, 0, NULL);
    ddp__plan_free(&p);

    /* A first cap of 10 takes 6 + 3 + 1 = 10; then 4 + 5 = 9 (+ 2 = 11 > 10); then 2 + 3. */
    ck_assert_int_eq(ddp__plan_build(counts, NULL, 7, 1, 0, 40, 40, 4, &p), 0);
    ck_assert_int_eq(p.ngroups, 3);
    want_group(&p, 0, 4, 6, 14, 10, 10);
    want_group(&p, 1, 2, 3, 5, 9, 9);
    want_group(&p, 2, 0, 1, 0, 5, 5);
    ddp__plan_free(&p);

    /* One cap large enough for everything: one bucket. */
    ck_assert_int_eq(ddp__plan_build(counts, NULL, 7, 1, 0, 1 << 20, 1 << 20, 4, &p), 0);
    ck_assert_int_eq(p.ngroups, 1);
    want_group(&p, 0, 0, 6, 0, 24, 24);
    ddp__plan_free(&p);

    /* A cap exactly met closes the bucket: caps of 12 elements on 6 + 6 | 6 + 6. */
    size_t even[] = {6, 6, 6, 6};
    ck_assert_int_eq(ddp__plan_build(even, NULL, 4, 1, 0, 48, 48, 4, &p), 0);
    ck_assert_int_eq(p.ngroups, 2);
    want_group(&p, 0, 2, 3, 12, 12, 12);
    want_group(&p, 1, 0, 1, 0, 12, 12);
    ddp__plan_free(&p);
}
END_TEST

START_TEST(parameter_larger_than_cap)
{
    size_t counts[] = {1, 100, 2, 50, 3};
    ddp__plan p;
    ck_assert_int_eq(ddp__plan_build(counts, NULL, 5, 2, 0, 40, 40, 4, &p), 0);
    /* Caps of 10 elements: [4] = 3; 50 alone; [2] = 2; 100 alone; [0] = 1. */
    ck_assert_int_eq(p.ngroups, 5);
    want_group(&p, 0, 4, 4, 154, 3, 4);
    want_group(&p, 1, 3, 3, 104, 50, 50);
    want_group(&p, 2, 2, 2, 102, 2, 2);
    want_group(&p, 3, 1, 1, 2, 100, 100);
    want_group(&p, 4, 0, 0, 0, 1, 2);
    check_invariants(&p, counts, 0, NULL);
    ddp__plan_free(&p);

    /* A cap below one element: every parameter alone. */
    ck_assert_int_eq(ddp__plan_build(counts, NULL, 5, 1, 0, 1, 1, 4, &p), 0);
    ck_assert_int_eq(p.ngroups, 5);
    check_invariants(&p, counts, 0, NULL);
    ddp__plan_free(&p);
}
END_TEST

START_TEST(padding_edges)
{
    ddp__plan p;
    /* count < world: 3 elements over 8 ranks pad to 8, a part of 1 each (5 of them padding). */
    size_t small[] = {3};
    ck_assert_int_eq(ddp__plan_build(small, NULL, 1, 8, 0, 64, 64, 4, &p), 0);
    want_group(&p, 0, 0, 0, 0, 3, 8);
    ck_assert_uint_eq(p.groups[0].shard, 1);
    ck_assert_uint_eq(p.shard_total, 1);
    check_invariants(&p, small, 0, NULL);
    ddp__plan_free(&p);

    /* Divisible: no padding. */
    size_t div[] = {4, 8};
    ck_assert_int_eq(ddp__plan_build(div, NULL, 2, 4, 0, 1 << 10, 1 << 10, 4, &p), 0);
    want_group(&p, 0, 0, 1, 0, 12, 12);
    ck_assert_uint_eq(p.groups[0].shard, 3);
    ddp__plan_free(&p);

    /* World 1: no padding ever, the one rank owns everything. */
    size_t odd[] = {7, 5, 3};
    ck_assert_int_eq(ddp__plan_build(odd, NULL, 3, 1, 0, 20, 20, 4, &p), 0);
    for (int g = 0; g < p.ngroups; g++) {
        ck_assert_uint_eq(p.groups[g].padded, p.groups[g].count);
        ck_assert_uint_eq(p.groups[g].shard, p.groups[g].count);
    }
    ck_assert_uint_eq(p.total, 15);
    ck_assert_uint_eq(p.shard_total, 15);
    check_invariants(&p, odd, 0, NULL);
    ddp__plan_free(&p);

    /* World 3, groups of 7 (pads 2), 5 (pads 1) and 3 (none): padding follows each group. */
    ck_assert_int_eq(ddp__plan_build(odd, NULL, 3, 3, 0, 4, 4, 4, &p), 0);
    ck_assert_int_eq(p.ngroups, 3);
    want_group(&p, 2, 0, 0, 0, 7, 9);
    want_group(&p, 1, 1, 1, 9, 5, 6);
    want_group(&p, 0, 2, 2, 15, 3, 3);
    ck_assert_uint_eq(p.param_offset[1], 9);
    ck_assert_uint_eq(p.param_offset[2], 15);
    ck_assert_uint_eq(ddp__owned_offset(&p, 2, 2), 6);
    ck_assert_uint_eq(p.shard_total, 6);
    ck_assert_uint_eq(p.max_padded, 9);
    check_invariants(&p, odd, 0, NULL);
    ddp__plan_free(&p);
}
END_TEST

START_TEST(stage3_units)
{
    /* Three units: {10, 2}, {7}, {1, 1, 1}; world 4. Caps are ignored. */
    size_t counts[] = {10, 2, 7, 1, 1, 1};
    int units[] = {0, 0, 1, 2, 2, 2};
    ddp__plan p;
    ck_assert_int_eq(ddp__plan_build(counts, units, 6, 4, 1, 4, 4, 4, &p), 0);
    ck_assert_int_eq(p.ngroups, 3);
    want_group(&p, 0, 0, 1, 0, 12, 12);
    want_group(&p, 1, 2, 2, 12, 7, 8);
    want_group(&p, 2, 3, 5, 20, 3, 4);
    ck_assert_uint_eq(p.groups[1].shard, 2);
    ck_assert_uint_eq(p.groups[2].shard_offset, 5);
    ck_assert_uint_eq(p.shard_total, 6);
    check_invariants(&p, counts, 1, units);
    ddp__plan_free(&p);

    /* Malformed unit lists: a gap, a unit split in two, a start other than 0. */
    int gap[] = {0, 0, 2, 2, 2, 2}, split[] = {0, 1, 0, 1, 2, 2}, late[] = {1, 1, 1, 1, 1, 1};
    ck_assert_int_eq(ddp__plan_build(counts, gap, 6, 4, 1, 4, 4, 4, &p), -EINVAL);
    ck_assert_int_eq(ddp__plan_build(counts, split, 6, 4, 1, 4, 4, 4, &p), -EINVAL);
    ck_assert_int_eq(ddp__plan_build(counts, late, 6, 4, 1, 4, 4, 4, &p), -EINVAL);
}
END_TEST

START_TEST(bad_arguments_and_free)
{
    size_t counts[] = {1, 2}, zero[] = {1, 0}, huge[] = {SIZE_MAX / 4, SIZE_MAX / 4};
    ddp__plan p;
    memset(&p, 0x5a, sizeof p);
    ddp__plan before = p;
    ck_assert_int_eq(ddp__plan_build(NULL, NULL, 2, 1, 0, 4, 4, 4, &p), -EINVAL);
    ck_assert_int_eq(ddp__plan_build(counts, NULL, 0, 1, 0, 4, 4, 4, &p), -EINVAL);
    ck_assert_int_eq(ddp__plan_build(counts, NULL, 2, 0, 0, 4, 4, 4, &p), -EINVAL);
    ck_assert_int_eq(ddp__plan_build(counts, NULL, 2, 1, 0, 4, 4, 0, &p), -EINVAL);
    ck_assert_int_eq(ddp__plan_build(counts, NULL, 2, 1, 1, 4, 4, 4, &p), -EINVAL);
    ck_assert_int_eq(ddp__plan_build(zero, NULL, 2, 1, 0, 4, 4, 4, &p), -EINVAL);
    ck_assert_int_eq(ddp__plan_build(huge, NULL, 2, 1, 0, 4, 4, 4, &p), -EINVAL);
    ck_assert_int_eq(ddp__plan_build(counts, NULL, 2, 1, 0, 4, 4, 4, NULL), -EINVAL);
    ck_assert_mem_eq(&p, &before, sizeof p); /* written only on success */
    ddp__plan z;
    memset(&z, 0, sizeof z);
    ddp__plan_free(&z);
    ddp__plan_free(NULL);
}
END_TEST

/* xorshift64*: reproducible random layouts. */
static uint64_t rnd(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ULL;
}

START_TEST(random_against_reference)
{
    uint64_t s = 0x9e3779b97f4a7c15ULL;
    for (int iter = 0; iter < 3000; iter++) {
        int n = 1 + (int)(rnd(&s) % 40), world = 1 + (int)(rnd(&s) % 9);
        size_t counts[40];
        int units[40];
        for (int i = 0, u = 0; i < n; i++) {
            counts[i] = 1 + rnd(&s) % (rnd(&s) % 4 == 0 ? 500 : 20);
            if (i > 0 && rnd(&s) % 3 == 0)
                u++;
            units[i] = u;
        }
        size_t first = 4 * (1 + rnd(&s) % 60), cap = 4 * (1 + rnd(&s) % 200);
        int by_unit = (int)(rnd(&s) % 2);
        ddp__plan p;
        ck_assert_int_eq(ddp__plan_build(counts, units, n, world, by_unit, first, cap, 4, &p), 0);
        check_invariants(&p, counts, by_unit, units);
        if (!by_unit) {
            /* The rule, written again: bucket b's last parameter follows bucket b + 1's. */
            int i = n - 1;
            for (int b = 0; b < p.ngroups; b++) {
                size_t limit = (b == 0 ? first : cap) / 4, sum = 0;
                ck_assert_int_eq(p.groups[b].last, i);
                do
                    sum += counts[i--];
                while (i >= 0 && sum + counts[i] <= limit);
                ck_assert_int_eq(p.groups[b].first, i + 1);
                ck_assert(sum <= limit || p.groups[b].first == p.groups[b].last);
            }
            ck_assert_int_eq(i, -1);
        } else {
            ck_assert_int_eq(p.ngroups, units[n - 1] + 1);
        }
        ddp__plan_free(&p);
    }
}
END_TEST

static Suite *plan_suite(void)
{
    Suite *s = suite_create("ddp_plan");
    TCase *tc = tcase_create("fixed");
    tcase_add_test(tc, buckets_for_caps);
    tcase_add_test(tc, parameter_larger_than_cap);
    tcase_add_test(tc, padding_edges);
    tcase_add_test(tc, stage3_units);
    tcase_add_test(tc, bad_arguments_and_free);
    tcase_set_timeout(tc, 10);
    suite_add_tcase(s, tc);
    tc = tcase_create("random");
    tcase_add_test(tc, random_against_reference);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(plan_suite());
    srunner_set_fork_status(sr, CK_FORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
