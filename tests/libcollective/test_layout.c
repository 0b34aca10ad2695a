/*
 * Unit tests of the cpu backend's host layout (layout.c): from the host identities the ranks
 * published to hosts, leaders and local ranks, with no store and no processes.
 *
 * Fixed cases spell out the expected layout in full: one host; every rank alone; an uneven
 * 1+2+3 layout; interleaved ranks (hosts A B A C B A); hosts whose identities sort in another
 * order than their leaders; identities that share a prefix. Random layouts (up to 300 ranks,
 * 1 to 40 hosts, identities drawn in any order) are checked against a brute-force reference
 * written from the rules (the scan the cpu backend used before the layout was a function of its
 * own) and against the invariants stated in layout.c. Bad arguments and freeing are covered too.
 */
#include <check.h>

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_internal.h"
#include "check_main.h"

/* The expected layout, written out. */
typedef struct want {
    int nhosts;
    const int *host_of, *local_of, *leaders, *host_first, *host_ranks;
} want;

static void check_layout(const coll__layout *l, int world, const want *w)
{
    ck_assert_int_eq(l->world, world);
    ck_assert_int_eq(l->nhosts, w->nhosts);
    for (int r = 0; r < world; r++) {
        ck_assert_msg(l->host_of[r] == w->host_of[r], "rank %d: host %d, expected %d", r,
                      l->host_of[r], w->host_of[r]);
        ck_assert_msg(l->local_of[r] == w->local_of[r], "rank %d: local rank %d, expected %d", r,
                      l->local_of[r], w->local_of[r]);
        ck_assert_int_eq(l->host_ranks[r], w->host_ranks[r]);
    }
    for (int h = 0; h < w->nhosts; h++) {
        ck_assert_int_eq(l->leaders[h], w->leaders[h]);
        ck_assert_int_eq(l->host_first[h], w->host_first[h]);
    }
    ck_assert_int_eq(l->host_first[w->nhosts], world);
}

/* The invariants layout.c promises, whatever the input. */
static void check_invariants(const coll__layout *l, int world)
{
    bool *seen = calloc((size_t)world, sizeof *seen);
    ck_assert_ptr_nonnull(seen);
    ck_assert(l->nhosts >= 1 && l->nhosts <= world);
    ck_assert_int_eq(l->host_first[0], 0);
    ck_assert_int_eq(l->host_first[l->nhosts], world);
    for (int h = 0; h < l->nhosts; h++) {
        ck_assert(l->host_first[h] < l->host_first[h + 1]);
        ck_assert_int_eq(coll__layout_local_size(l, h), l->host_first[h + 1] - l->host_first[h]);
        ck_assert_int_eq(l->leaders[h], l->host_ranks[l->host_first[h]]);
        if (h > 0)
            ck_assert(l->leaders[h - 1] < l->leaders[h]);
        for (int i = l->host_first[h] + 1; i < l->host_first[h + 1]; i++)
            ck_assert(l->host_ranks[i - 1] < l->host_ranks[i]);
    }
    for (int i = 0; i < world; i++) {
        int r = l->host_ranks[i];
        ck_assert(r >= 0 && r < world && !seen[r]);
        seen[r] = true;
    }
    for (int r = 0; r < world; r++) {
        ck_assert(l->host_of[r] >= 0 && l->host_of[r] < l->nhosts);
        ck_assert_int_eq(l->host_ranks[l->host_first[l->host_of[r]] + l->local_of[r]], r);
        ck_assert_int_eq(l->local_of[l->leaders[l->host_of[r]]], 0);
    }
    free(seen);
}

#define INTS(...) ((const int[]){__VA_ARGS__})

START_TEST(single_host)
{
    const char *ids[] = {"boot-a/ns1", "boot-a/ns1", "boot-a/ns1", "boot-a/ns1"};
    coll__layout l;
    ck_assert_int_eq(coll__layout_build(&l, ids, 4), 0);
    want w = {1, INTS(0, 0, 0, 0), INTS(0, 1, 2, 3), INTS(0), INTS(0), INTS(0, 1, 2, 3)};
    check_layout(&l, 4, &w);
    check_invariants(&l, 4);
    ck_assert_int_eq(coll__layout_local_size(&l, 0), 4);
    coll__layout_free(&l);

    /* A job of one. */
    const char *one[] = {"x"};
    ck_assert_int_eq(coll__layout_build(&l, one, 1), 0);
    want w1 = {1, INTS(0), INTS(0), INTS(0), INTS(0), INTS(0)};
    check_layout(&l, 1, &w1);
    coll__layout_free(&l);
}
END_TEST

START_TEST(every_rank_alone)
{
    /* Identities in reverse sort order: hosts still follow their leaders' ranks. */
    const char *ids[] = {"e", "d", "c", "b", "a"};
    coll__layout l;
    ck_assert_int_eq(coll__layout_build(&l, ids, 5), 0);
    want w = {5,
              INTS(0, 1, 2, 3, 4),
              INTS(0, 0, 0, 0, 0),
              INTS(0, 1, 2, 3, 4),
              INTS(0, 1, 2, 3, 4),
              INTS(0, 1, 2, 3, 4)};
    check_layout(&l, 5, &w);
    check_invariants(&l, 5);
    for (int h = 0; h < 5; h++)
        ck_assert_int_eq(coll__layout_local_size(&l, h), 1);
    coll__layout_free(&l);
}
END_TEST

/* The 1+2+3 layout coll-check runs across three namespaces. */
START_TEST(uneven_1_2_3)
{
    const char *ids[] = {"h1", "h2", "h2", "h3", "h3", "h3"};
    coll__layout l;
    ck_assert_int_eq(coll__layout_build(&l, ids, 6), 0);
    want w = {3,
              INTS(0, 1, 1, 2, 2, 2),
              INTS(0, 0, 1, 0, 1, 2),
              INTS(0, 1, 3),
              INTS(0, 1, 3),
              INTS(0, 1, 2, 3, 4, 5)};
    check_layout(&l, 6, &w);
    check_invariants(&l, 6);
    ck_assert_int_eq(coll__layout_local_size(&l, 0), 1);
    ck_assert_int_eq(coll__layout_local_size(&l, 1), 2);
    ck_assert_int_eq(coll__layout_local_size(&l, 2), 3);
    coll__layout_free(&l);

    /* 3+2+1: the big host first. */
    const char *rev[] = {"h3", "h3", "h3", "h2", "h2", "h1"};
    ck_assert_int_eq(coll__layout_build(&l, rev, 6), 0);
    want w2 = {3,
               INTS(0, 0, 0, 1, 1, 2),
               INTS(0, 1, 2, 0, 1, 0),
               INTS(0, 3, 5),
               INTS(0, 3, 5),
               INTS(0, 1, 2, 3, 4, 5)};
    check_layout(&l, 6, &w2);
    coll__layout_free(&l);
}
END_TEST

/* Hosts A B A C B A: ranks of a host are not contiguous. */
START_TEST(interleaved)
{
    const char *ids[] = {"zz/A", "aa/B", "zz/A", "mm/C", "aa/B", "zz/A"};
    coll__layout l;
    ck_assert_int_eq(coll__layout_build(&l, ids, 6), 0);
    /* Host 0 = A {0, 2, 5}, host 1 = B {1, 4}, host 2 = C {3}. */
    want w = {3,
              INTS(0, 1, 0, 2, 1, 0),
              INTS(0, 0, 1, 0, 1, 2),
              INTS(0, 1, 3),
              INTS(0, 3, 5),
              INTS(0, 2, 5, 1, 4, 3)};
    check_layout(&l, 6, &w);
    check_invariants(&l, 6);
    coll__layout_free(&l);

    /* Round-robin placement over two hosts, as a scheduler might give it. */
    const char *rr[] = {"b", "a", "b", "a", "b", "a", "b", "a"};
    ck_assert_int_eq(coll__layout_build(&l, rr, 8), 0);
    want w2 = {2,          INTS(0, 1, 0, 1, 0, 1, 0, 1), INTS(0, 0, 1, 1, 2, 2, 3, 3), INTS(0, 1),
               INTS(0, 4), INTS(0, 2, 4, 6, 1, 3, 5, 7)};
    check_layout(&l, 8, &w2);
    coll__layout_free(&l);
}
END_TEST

/* Identities are compared whole: a shared prefix or an empty identity is just another host. */
START_TEST(identities_compared_whole)
{
    const char *ids[] = {"boot/mnt:1", "boot/mnt:10", "", "boot/mnt:1", "", "boot/mnt:1 "};
    coll__layout l;
    ck_assert_int_eq(coll__layout_build(&l, ids, 6), 0);
    want w = {4,
              INTS(0, 1, 2, 0, 2, 3),
              INTS(0, 0, 0, 1, 1, 0),
              INTS(0, 1, 2, 5),
              INTS(0, 2, 3, 5),
              INTS(0, 3, 1, 2, 4, 5)};
    check_layout(&l, 6, &w);
    check_invariants(&l, 6);
    coll__layout_free(&l);
}
END_TEST

/* The rules, written as the plain scan the cpu backend used to run. */
static void reference(const char *const *ids, int world, int *nhosts, int *host_of, int *local_of,
                      int *leaders)
{
    *nhosts = 0;
    for (int r = 0; r < world; r++) {
        int h;
        for (h = 0; h < *nhosts; h++)
            if (strcmp(ids[leaders[h]], ids[r]) == 0)
                break;
        if (h == *nhosts)
            leaders[(*nhosts)++] = r;
        host_of[r] = h;
    }
    for (int h = 0; h < *nhosts; h++) {
        int n = 0;
        for (int r = 0; r < world; r++)
            if (host_of[r] == h)
                local_of[r] = n++;
    }
}

static uint64_t rng = 0x2545f4914f6cdd1du;
static uint32_t rnd(uint32_t n)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (uint32_t)((rng * 0x2545f4914f6cdd1du) >> 33) % n;
}

START_TEST(random_against_reference)
{
    enum { MAXW = 300 };
    static char names[40][32];
    const char *ids[MAXW];
    int host_of[MAXW], local_of[MAXW], leaders[MAXW], nhosts;
    for (int iter = 0; iter < 400; iter++) {
        int world = 1 + (int)rnd(MAXW);
        int hosts = 1 + (int)rnd(40);
        for (int h = 0; h < hosts; h++)
            snprintf(names[h], sizeof names[h], "boot-%08x/ns", (unsigned)rnd(1u << 31));
        bool blocks = rnd(2); /* contiguous blocks of ranks, or scattered */
        for (int r = 0; r < world; r++)
            ids[r] = names[blocks ? r * hosts / world : (int)rnd((uint32_t)hosts)];
        coll__layout l;
        ck_assert_int_eq(coll__layout_build(&l, ids, world), 0);
        check_invariants(&l, world);
        reference(ids, world, &nhosts, host_of, local_of, leaders);
        ck_assert_int_eq(l.nhosts, nhosts);
        for (int r = 0; r < world; r++) {
            ck_assert_int_eq(l.host_of[r], host_of[r]);
            ck_assert_int_eq(l.local_of[r], local_of[r]);
        }
        for (int h = 0; h < nhosts; h++)
            ck_assert_int_eq(l.leaders[h], leaders[h]);
        coll__layout_free(&l);
    }
}
END_TEST

/* Ten thousand ranks, each alone: a sort, not a scan per host. */
START_TEST(large_world_each_alone)
{
    enum { W = 10000 };
    static char buf[W][24];
    static const char *ids[W];
    for (int r = 0; r < W; r++) {
        snprintf(buf[r], sizeof buf[r], "host-%05d", (r * 7919) % W);
        ids[r] = buf[r];
    }
    coll__layout l;
    ck_assert_int_eq(coll__layout_build(&l, ids, W), 0);
    ck_assert_int_eq(l.nhosts, W);
    for (int r = 0; r < W; r++) {
        ck_assert_int_eq(l.host_of[r], r);
        ck_assert_int_eq(l.local_of[r], 0);
    }
    check_invariants(&l, W);
    coll__layout_free(&l);
}
END_TEST

START_TEST(bad_arguments_and_free)
{
    const char *ids[] = {"a", NULL, "a"};
    coll__layout l;
    memset(&l, 0x5a, sizeof l);
    ck_assert_int_eq(coll__layout_build(&l, ids, 3), -EINVAL);
    ck_assert_ptr_null(l.host_of); /* zeroed on failure */
    ck_assert_int_eq(l.nhosts, 0);
    ck_assert_int_eq(coll__layout_build(&l, ids, 0), -EINVAL);
    ck_assert_int_eq(coll__layout_build(&l, ids, -1), -EINVAL);
    ck_assert_int_eq(coll__layout_build(&l, NULL, 2), -EINVAL);
    ck_assert_int_eq(coll__layout_build(NULL, ids, 1), -EINVAL);

    ck_assert_int_eq(coll__layout_build(&l, ids, 1), 0);
    coll__layout_free(&l);
    ck_assert_ptr_null(l.host_of);
    ck_assert_int_eq(l.nhosts, 0);
    coll__layout_free(&l); /* a freed layout, again */
    coll__layout_free(NULL);
    coll__layout z = {0};
    coll__layout_free(&z);
}
END_TEST

static Suite *layout_suite(void)
{
    Suite *s = suite_create("layout");
    check_tcase(s, "fixed", 10, single_host, every_rank_alone, uneven_1_2_3, interleaved,
                identities_compared_whole, bad_arguments_and_free);

    check_tcase(s, "random", 60, random_against_reference, large_world_each_alone);
    return s;
}

int main(void)
{
    return check_run(layout_suite());
}
