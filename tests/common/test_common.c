/*
 * Tests of the ground floor's shared pieces (rendezvous/common/): the bf16 conversion (bf16conv.h:
 * exact widening, ties to even, NaNs quietened, overflow to infinity), the intrusive queue
 * (queue.h), the last-error buffer (errbuf.h: per-thread, cut to size, returns the code) and the
 * sentences for rank sets and endpoints (fmt.h). The option tables and parsers have their own
 * test (test_cli_helpers.c). Pure functions: no server, no files.
 */
#include <check.h>

#include <errno.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "bf16conv.h"
#include "errbuf.h"
#include "fmt.h"
#include "queue.h"
#include "check_main.h"

/* ------------------------------------------------------------------------------------------ */
/* bf16                                                                                        */
/* ------------------------------------------------------------------------------------------ */

static float f32_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/*
 * The reference rounding, written the long way: the two bf16 neighbours of x, the nearer one,
 * the even one on a tie. For finite x only.
 */
static uint16_t bf16_ref(float x)
{
    uint32_t u = bits_of(x);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    uint32_t rest = u & 0xffffu;
    if (rest < 0x8000u)
        return lo;
    if (rest > 0x8000u)
        return hi;
    return (lo & 1u) ? hi : lo;
}

START_TEST(bf16_round_trip)
{
    /* Every bf16 value widens exactly and narrows back to itself; NaNs come back quiet. */
    for (uint32_t h = 0; h <= 0xffffu; h++) {
        float f = bf16_to_f32((uint16_t)h);
        ck_assert_uint_eq(bits_of(f), h << 16);
        if ((h & 0x7fffu) > 0x7f80u) {
            ck_assert(isnan(f));
            ck_assert_uint_eq(bf16_from_f32(f), h | 0x40u);
        } else {
            ck_assert_uint_eq(bf16_from_f32(f), h);
        }
    }
}
END_TEST

START_TEST(bf16_rounding)
{
    /* Ties go to the even neighbour, either side of a tie to the nearer. */
    for (uint32_t h = 0; h < 0x7f7fu; h += 97) {
        uint32_t mid = (h << 16) | 0x8000u;
        uint16_t even = (uint16_t)((h & 1u) ? h + 1 : h);
        ck_assert_uint_eq(bf16_from_f32(f32_of(mid)), even);
        ck_assert_uint_eq(bf16_from_f32(f32_of(mid - 1)), h);
        ck_assert_uint_eq(bf16_from_f32(f32_of(mid + 1)), h + 1);
        ck_assert_uint_eq(bf16_from_f32(f32_of(mid | 0x80000000u)), even | 0x8000u);
    }
    ck_assert_uint_eq(bf16_from_f32(1.0f + 0x1p-8f), 0x3f80u);     /* tie, down to even */
    ck_assert_uint_eq(bf16_from_f32(1.0f + 3 * 0x1p-8f), 0x3f82u); /* tie, up to even */
    ck_assert_uint_eq(bf16_from_f32(-0.0f), 0x8000u);
    ck_assert_uint_eq(bf16_from_f32(f32_of(0x00008000u)), 0x0000u); /* subnormal tie */
    ck_assert_uint_eq(bf16_from_f32(f32_of(0x00018000u)), 0x0002u);
    /* Overflow rounds to infinity; infinities stay; the largest finite bf16 stays. */
    ck_assert_uint_eq(bf16_from_f32(FLT_MAX), 0x7f80u);
    ck_assert_uint_eq(bf16_from_f32(-FLT_MAX), 0xff80u);
    ck_assert_uint_eq(bf16_from_f32(INFINITY), 0x7f80u);
    ck_assert_uint_eq(bf16_from_f32(-INFINITY), 0xff80u);
    ck_assert_uint_eq(bf16_from_f32(f32_of(0x7f7f7fffu)), 0x7f7fu);
    /* NaNs: quiet, sign kept, even those whose payload lies only in the low half. */
    ck_assert_uint_eq(bf16_from_f32(f32_of(0x7f800001u)), 0x7fc0u);
    ck_assert_uint_eq(bf16_from_f32(f32_of(0xff800001u)), 0xffc0u);
    ck_assert_uint_eq(bf16_from_f32(f32_of(0x7fc00000u)), 0x7fc0u);
    ck_assert(isnan(bf16_to_f32(bf16_from_f32(NAN))));
    /* A pseudo-random sweep of finite values against the long-hand reference. */
    uint32_t x = 12345u;
    for (int i = 0; i < 1 << 20; i++) {
        x = x * 1664525u + 1013904223u;
        if ((x & 0x7f800000u) == 0x7f800000u)
            continue;
        float f = f32_of(x);
        if (fabsf(f) > f32_of(0x7f7f7fffu))
            continue;
        ck_assert_msg(bf16_from_f32(f) == bf16_ref(f), "%a: %04x, want %04x", (double)f,
                      bf16_from_f32(f), bf16_ref(f));
    }
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* queue                                                                                       */
/* ------------------------------------------------------------------------------------------ */

struct item {
    int value;
    queue node;
};

/* The values of the queue headed by h, in order, written to out; returns their count. */
static int values_of(queue *h, int *out)
{
    int n = 0;
    queue *q;
    queue_foreach(q, h) {
        out[n++] = queue_data(q, struct item, node)->value;
    }
    return n;
}

START_TEST(queue_order)
{
    queue h;
    queue_init(&h);
    ck_assert(queue_empty(&h));
    struct item it[5];
    for (int i = 0; i < 5; i++) {
        it[i].value = i;
        queue_init(&it[i].node);
    }
    queue_insert_tail(&h, &it[1].node);
    queue_insert_tail(&h, &it[2].node);
    queue_insert_head(&h, &it[0].node);
    queue_insert_tail(&h, &it[3].node);
    ck_assert(!queue_empty(&h));
    ck_assert_ptr_eq(queue_data(queue_head(&h), struct item, node), &it[0]);
    int v[8];
    ck_assert_int_eq(values_of(&h, v), 4);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(v[i], i);

    /* Removing from the middle, twice (the second is harmless), and an unlinked node. */
    queue_remove(&it[2].node);
    queue_remove(&it[2].node);
    queue_remove(&it[4].node);
    ck_assert_int_eq(values_of(&h, v), 3);
    ck_assert_int_eq(v[0], 0);
    ck_assert_int_eq(v[1], 1);
    ck_assert_int_eq(v[2], 3);

    /* Removing every node while visiting: the safe loop. */
    queue *q, *n;
    int seen = 0;
    queue_foreach_safe(q, n, &h) {
        queue_remove(q);
        seen++;
    }
    ck_assert_int_eq(seen, 3);
    ck_assert(queue_empty(&h));
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* errbuf                                                                                      */
/* ------------------------------------------------------------------------------------------ */

static _Thread_local errbuf last_error;

static void *other_thread(void *arg)
{
    (void)arg;
    /* A fresh thread's buffer is empty whatever another thread wrote into its own. */
    int empty = last_error.msg[0] == '\0';
    errbuf_set(&last_error, -EIO, "thread %d", 2);
    return empty ? (void *)1 : NULL;
}

START_TEST(errbuf_per_thread)
{
    ck_assert_str_eq(last_error.msg, "");
    ck_assert_int_eq(errbuf_set(&last_error, -EINVAL, "--%s: %d is out of range", "port", 70000),
                     -EINVAL);
    ck_assert_str_eq(last_error.msg, "--port: 70000 is out of range");
    pthread_t t;
    void *ok = NULL;
    ck_assert_int_eq(pthread_create(&t, NULL, other_thread, NULL), 0);
    ck_assert_int_eq(pthread_join(t, &ok), 0);
    ck_assert_ptr_nonnull(ok);
    ck_assert_str_eq(last_error.msg, "--port: 70000 is out of range");
    /* Long sentences are cut, terminated. */
    char big[2 * ERRBUF_BYTES];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    ck_assert_int_eq(errbuf_set(&last_error, 0, "%s", big), 0);
    ck_assert_uint_eq(strlen(last_error.msg), ERRBUF_BYTES - 1);
    errbuf_clear(&last_error);
    ck_assert_str_eq(last_error.msg, "");
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* fmt                                                                                         */
/* ------------------------------------------------------------------------------------------ */

START_TEST(rank_list)
{
    bool f[40] = {false};
    char buf[256];
    ck_assert_int_eq(fmt_rank_list(f, 40, buf, sizeof buf), 0);
    ck_assert_str_eq(buf, "");
    f[3] = true;
    ck_assert_int_eq(fmt_rank_list(f, 40, buf, sizeof buf), 1);
    ck_assert_str_eq(buf, "3");
    f[0] = f[39] = true;
    ck_assert_int_eq(fmt_rank_list(f, 40, buf, sizeof buf), 3);
    ck_assert_str_eq(buf, "0, 3, 39");
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        f[i] = true;
    ck_assert_int_eq(fmt_rank_list(f, 40, buf, sizeof buf), 40);
    ck_assert_str_eq(buf, "0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15 and 24 more");
    /* Cut to the buffer, always terminated. */
    ck_assert_int_eq(fmt_rank_list(f, 40, buf, 8), 40);
    ck_assert_str_eq(buf, "0, 1, 2");
    ck_assert_int_eq(fmt_rank_list(NULL, 1, buf, sizeof buf), -EINVAL);
    ck_assert_int_eq(fmt_rank_list(f, 1, buf, 0), -EINVAL);
}
END_TEST

START_TEST(missing_ranks)
{
    bool f[20] = {false};
    char buf[256];
    const char *what = "did not publish /job/x within 300 ms";
    ck_assert_int_eq(fmt_missing_ranks(f, 5, "rank", what, buf, sizeof buf), 0);
    ck_assert_str_eq(buf, "");
    f[1] = f[3] = true;
    ck_assert_int_eq(fmt_missing_ranks(f, 5, "rank", what, buf, sizeof buf), 2);
    ck_assert_str_eq(buf, "ranks 1, 3 did not publish /job/x within 300 ms (3 of 5 present)");
    f[1] = false;
    ck_assert_int_eq(
        fmt_missing_ranks(f, 4, "node rank", "did not show up within 0.5 s", buf, sizeof buf), 1);
    ck_assert_str_eq(buf, "node rank 3 did not show up within 0.5 s (3 of 4 present)");
    /* Many ranks: the first are named, the rest counted; cut to the buffer, always terminated. */
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        f[i] = true;
    f[0] = false;
    ck_assert_int_eq(fmt_missing_ranks(f, 20, "rank", "did not come", buf, sizeof buf), 19);
    ck_assert_str_eq(buf, "ranks 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16 and 3 more "
                          "did not come (1 of 20 present)");
    ck_assert_int_eq(fmt_missing_ranks(f, 20, "rank", "did not come", buf, 10), 19);
    ck_assert_str_eq(buf, "ranks 1, ");
    ck_assert_int_eq(fmt_missing_ranks(NULL, 1, "rank", what, buf, sizeof buf), -EINVAL);
    ck_assert_int_eq(fmt_missing_ranks(f, -1, "rank", what, buf, sizeof buf), -EINVAL);
    ck_assert_int_eq(fmt_missing_ranks(f, 1, NULL, what, buf, sizeof buf), -EINVAL);
    ck_assert_int_eq(fmt_missing_ranks(f, 1, "rank", NULL, buf, sizeof buf), -EINVAL);
    ck_assert_int_eq(fmt_missing_ranks(f, 1, "rank", what, buf, 0), -EINVAL);
}
END_TEST
START_TEST(endpoint)
{
    char buf[64];
    fmt_endpoint(buf, sizeof buf, "127.0.0.1", 29500);
    ck_assert_str_eq(buf, "127.0.0.1:29500");
    fmt_endpoint(buf, sizeof buf, "::1", 29500);
    ck_assert_str_eq(buf, "[::1]:29500");
    fmt_endpoint(buf, sizeof buf, "node-3.example", 1);
    ck_assert_str_eq(buf, "node-3.example:1");
    fmt_endpoint(buf, 6, "::1", 29500);
    ck_assert_str_eq(buf, "[::1]");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("common");
    check_tcase(s, "bf16", 60, bf16_round_trip, bf16_rounding);
    check_tcase(s, "queue", 10, queue_order);
    check_tcase(s, "errbuf", 10, errbuf_per_thread);
    check_tcase(s, "fmt", 10, rank_list, missing_ranks, endpoint);
    return check_run(s);
}
