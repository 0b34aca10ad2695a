/*
 * Tests of libddp's checkpoint arithmetic that needs no communicator: CRC32C (worker/libddp/crc32c.c:
 * the standard check value, the chosen implementation and the table against a bitwise
 * reference, a CRC extended piece by piece equal to the whole) and the load's range mapping
 * (ddp__ckpt_map_range in worker/libddp/ckpt.c: the runs of a saving layout that fill each rank's part
 * of a loading layout, for uneven paddings, world sizes 1-5 and bucket or unit layouts on both
 * sides, checked by simulating the shard files and the load).
 */
#include <check.h>

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "plan.h"
#include "check_main.h"

/* ------------------------------------------------------------------------------------------ */
/* CRC32C                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* Bit by bit, the definition: reflected 0x1EDC6F41, initial and final XOR. */
static uint32_t crc_ref(const unsigned char *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
}

static void check_crc(void)
{
    ck_assert_uint_eq(ddp__crc32c(0, "123456789", 9), 0xE3069283u);
    ck_assert_uint_eq(ddp__crc32c(0, "", 0), 0);
    unsigned char buf[4096 + 16];
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < sizeof buf; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        buf[i] = (unsigned char)x;
    }
    /* Every alignment and lengths around the 8-byte steps of the instruction path. */
    for (size_t at = 0; at < 16; at++)
        for (size_t n = 0; n < 80; n++)
            ck_assert_msg(ddp__crc32c(0, buf + at, n) == crc_ref(buf + at, n), "at %zu, %zu bytes",
                          at, n);
    uint32_t whole = ddp__crc32c(0, buf, 4096);
    ck_assert_uint_eq(whole, crc_ref(buf, 4096));
    /* Extended piece by piece: the CRC of the concatenation, for any split. */
    for (size_t cut = 0; cut <= 4096; cut += 37)
        ck_assert_uint_eq(ddp__crc32c(ddp__crc32c(0, buf, cut), buf + cut, 4096 - cut), whole);
    uint32_t c = 0;
    for (size_t at = 0; at < 4096; at += 100)
        c = ddp__crc32c(c, buf + at, 4096 - at < 100 ? 4096 - at : 100);
    ck_assert_uint_eq(c, whole);
}

/* As chosen at run time (SSE4.2 on x86-64 CPUs that have it). */
START_TEST(test_crc32c)
{
    unsetenv("DDP_CRC32C_TABLE");
    check_crc();
}
END_TEST

/* The table, forced (each test runs in a process of its own: the choice is made once). */
START_TEST(test_crc32c_table)
{
    setenv("DDP_CRC32C_TABLE", "1", 1);
    check_crc();
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Range mapping                                                                               */
/* ------------------------------------------------------------------------------------------ */

/* Four units of two parameters each, sizes chosen to pad unevenly at every world size. */
static const size_t counts[] = {37, 5, 64, 7, 3, 1, 29, 11};
static const int units[] = {0, 0, 1, 1, 2, 2, 3, 3};
#define NP 8

static void make_plan(int world, int by_unit, ddp__plan *p)
{
    /* Caps of 48 and 96 bytes: several buckets, a parameter larger than its cap alone. */
    ck_assert_int_eq(ddp__plan_build(counts, units, NP, world, by_unit, 48, 96, 4, p), 0);
}

/* The manifest's layout fields, as the saver writes them from its plan. */
static void make_manifest(const ddp__plan *p, ddp__ckpt_manifest *mf)
{
    memset(mf, 0, sizeof *mf);
    mf->world = p->world;
    mf->nparams = NP;
    mf->params = calloc(NP, sizeof *mf->params);
    mf->ngroups = p->ngroups;
    mf->groups = calloc((size_t)p->ngroups, sizeof *mf->groups);
    ck_assert(mf->params && mf->groups);
    for (int i = 0; i < NP; i++) {
        mf->params[i].offset = p->param_offset[i];
        mf->params[i].count = counts[i];
        mf->params[i].group = p->param_group[i];
    }
    for (int g = 0; g < p->ngroups; g++) {
        const ddp__group *s = &p->groups[g];
        mf->groups[g] = (ddp__ckpt_group){s->offset,          s->count, s->padded, s->shard,
                                          p->shard_offset[g], s->first, s->last};
    }
    mf->total = p->total;
    mf->shard_total = p->shard_total;
}

/*
 * The value of arena element e of plan p: 1 + the element's index among the parameters
 * (padding excluded), or 0 for padding.
 */
static float value_at(const ddp__plan *p, size_t e)
{
    size_t before = 0;
    for (int i = 0; i < NP; i++) {
        if (e >= p->param_offset[i] && e < p->param_offset[i] + counts[i])
            return (float)(before + (e - p->param_offset[i]) + 1);
        before += counts[i];
    }
    return 0;
}

/* Saves at (world n, buckets or units), loads at (world m, likewise): every rank's part. */
static void check_reshard(int n, int n_units, int m, int m_units)
{
    ddp__plan old, new;
    make_plan(n, n_units, &old);
    make_plan(m, m_units, &new);
    ddp__ckpt_manifest mf;
    make_manifest(&old, &mf);
    /* The saver's shard files: rank q's part of each group at shard_offset[g]. */
    float *files = calloc((size_t)n * old.shard_total, sizeof *files);
    ck_assert(files);
    for (int q = 0; q < n; q++)
        for (int g = 0; g < old.ngroups; g++)
            for (size_t i = 0; i < old.groups[g].shard; i++)
                files[(size_t)q * old.shard_total + old.shard_offset[g] + i] =
                    value_at(&old, old.groups[g].offset + (size_t)q * old.groups[g].shard + i);
    float *arena = malloc(new.total * sizeof *arena);
    ck_assert(arena);
    for (size_t e = 0; e < new.total; e++)
        arena[e] = -1; /* untouched: only padding may stay so */
    for (int r = 0; r < m; r++) {
        for (int g = 0; g < new.ngroups; g++) {
            size_t begin = new.groups[g].offset + (size_t)r *new.groups[g].shard;
            size_t end = begin + new.groups[g].shard, k;
            ck_assert_int_eq(ddp__ckpt_map_range(&mf, &new, begin, end, NULL, 0, &k), 0);
            ddp__ckpt_run *runs = calloc(k + 1, sizeof *runs);
            size_t k2;
            ck_assert_int_eq(ddp__ckpt_map_range(&mf, &new, begin, end, runs, k, &k2), 0);
            ck_assert_uint_eq(k, k2);
            size_t prev = 0;
            for (size_t i = 0; i < k; i++) {
                const ddp__ckpt_run *u = &runs[i];
                ck_assert_uint_ge(u->dst, prev); /* increasing, disjoint */
                ck_assert_uint_gt(u->count, 0);
                ck_assert_uint_le(u->dst + u->count, end - begin);
                ck_assert(u->shard >= 0 && u->shard < n);
                ck_assert_uint_le(u->src + u->count, old.shard_total);
                memcpy(arena + begin + u->dst, files + (size_t)u->shard * old.shard_total + u->src,
                       u->count * sizeof(float));
                prev = u->dst + u->count;
            }
            /* Same layout: one run per part, read straight from the rank's own file. */
            if (n == m && n_units == m_units) {
                size_t want = new.groups[g].count > (size_t)r *new.groups[g].shard;
                ck_assert_uint_eq(k, want);
                for (size_t i = 0; i < k; i++)
                    ck_assert_int_eq(runs[i].shard, r);
            }
            free(runs);
        }
    }
    for (size_t e = 0; e < new.total; e++) {
        float want = value_at(&new, e);
        ck_assert_msg(
            arena[e] == (want == 0 ? -1 : want), "world %d %s -> %d %s: element %zu is %g, want %g",
            n, n_units ? "units" : "buckets", m, m_units ? "units" : "buckets", e, arena[e], want);
    }
    free(arena);
    free(files);
    free(mf.params);
    free(mf.groups);
    ddp__plan_free(&old);
    ddp__plan_free(&new);
}

/* Worlds 1-5 on both sides; stages 0-2 lay out buckets, stage 3 units. */
START_TEST(test_map_reshard)
{
    for (int n = 1; n <= 5; n++)
        for (int m = 1; m <= 5; m++)
            for (int su = 0; su < 2; su++)
                for (int lu = 0; lu < 2; lu++)
                    check_reshard(n, su, m, lu);
}
END_TEST

/* Any sub-range, not only a rank's part; a count with cap 0; ranges outside the arena. */
START_TEST(test_map_edges)
{
    ddp__plan old, new;
    make_plan(3, 0, &old);
    make_plan(2, 1, &new);
    ddp__ckpt_manifest mf;
    make_manifest(&old, &mf);
    size_t k;
    ck_assert_int_eq(ddp__ckpt_map_range(&mf, &new, 0, new.total + 1, NULL, 0, &k), -EINVAL);
    ck_assert_int_eq(ddp__ckpt_map_range(&mf, &new, 5, 4, NULL, 0, &k), -EINVAL);
    ck_assert_int_eq(ddp__ckpt_map_range(&mf, &new, 4, 4, NULL, 0, &k), 0);
    ck_assert_uint_eq(k, 0);
    /* Whole arena, every element once, cut short by cap without writing past it. */
    ck_assert_int_eq(ddp__ckpt_map_range(&mf, &new, 0, new.total, NULL, 0, &k), 0);
    ck_assert_uint_gt(k, 2);
    ddp__ckpt_run runs[3] = {{0}}, guard = {99, 99, 99, 99};
    ddp__ckpt_run two[3];
    size_t k2;
    ck_assert_int_eq(ddp__ckpt_map_range(&mf, &new, 0, new.total, two, 2, &k2), 0);
    ck_assert_uint_eq(k2, k);
    runs[2] = guard;
    ck_assert_int_eq(ddp__ckpt_map_range(&mf, &new, 0, new.total, runs, 2, &k2), 0);
    ck_assert_uint_eq(runs[2].dst, 99);
    ck_assert_uint_eq(runs[0].dst, 0);
    mf.nparams = NP - 1;
    ck_assert_int_eq(ddp__ckpt_map_range(&mf, &new, 0, 1, NULL, 0, &k), -EINVAL);
    free(mf.params);
    free(mf.groups);
    ddp__plan_free(&old);
    ddp__plan_free(&new);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ckpt");
    check_tcase(s, "ckpt", 0, test_crc32c, test_crc32c_table, test_map_reshard, test_map_edges);
    return check_run_fork(s, CK_FORK);
}
