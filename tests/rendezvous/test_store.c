/*
 * Unit tests of the store's semantics, driven through the parser with fake connections:
 * every operation's reply bytes, waits across connections, cancellation, connection release,
 * queues, legacy watches, the size cap and byte accounting.
 */
#include "frames.h"
#include "store.h"
#include "check_main.h"

#include <check.h>
#include <errno.h>
#include <stdio.h>

static const rdzv__limits lim = {8192, 1 << 20, 1024, 4 << 20};

typedef struct fake {
    rdzv__conn conn;
    rdzv__parser p;
} fake;

static rdzv__store st;

static void setup(void)
{
    ck_assert_int_eq(rdzv__store_init(&st, 1 << 20), 0);
}

static void teardown(void)
{
    rdzv__store_destroy(&st);
}

/* Frees what clears and closed connections left, as the server's sweeper does. */
static void sweep_all(void)
{
    while (rdzv__store_sweep(&st, RDZV__SWEEP_SLICE))
        ;
    ck_assert_uint_eq(st.nstale, 0);
    ck_assert(queue_empty(&st.dead));
}

static void fake_init(fake *f, enum rdzv_gen gen)
{
    rdzv__conn_init(&f->conn);
    rdzv__parser_init(&f->p);
    f->p.gen = gen;
}

/* Parses and executes every frame in fr on f's connection; returns the last exec result. */
static int run(fake *f, frame *fr)
{
    size_t off = 0;
    int rc = 0;
    while (off < fr->len) {
        rdzv__request r;
        int n = rdzv__parse(&f->p, &lim, fr->data + off, fr->len - off, &r);
        ck_assert_int_gt(n, 0);
        rc = rdzv__store_exec(&st, &f->conn, &r);
        off += (size_t)n;
    }
    fr_reset(fr);
    while (rdzv__store_pop_dirty(&st))
        ;
    return rc;
}

/* Takes n bytes of f's output; checks they equal `want`. */
static void expect(fake *f, const void *want, size_t n)
{
    ck_assert_uint_ge(f->conn.out.len, n);
    ck_assert_mem_eq(f->conn.out.data, want, n);
    memmove(f->conn.out.data, f->conn.out.data + n, f->conn.out.len - n);
    f->conn.out.len -= n;
}
static void expect_u8(fake *f, uint8_t v)
{
    expect(f, &v, 1);
}
static void expect_i64(fake *f, int64_t v)
{
    expect(f, &v, 8);
}
static void expect_vec(fake *f, const char *s, size_t n)
{
    uint64_t len = n;
    expect(f, &len, 8);
    expect(f, s, n);
}
static void expect_str(fake *f, const char *s)
{
    expect_vec(f, s, strlen(s));
}
static void expect_empty(fake *f)
{
    ck_assert_uint_eq(f->conn.out.len, 0);
}

static void op_set(frame *fr, const char *k, const char *v)
{
    fr_u8(fr, RDZV_M_SET);
    fr_str(fr, k);
    fr_str(fr, v);
}
static void op_key(frame *fr, uint8_t code, const char *k)
{
    fr_u8(fr, code);
    fr_str(fr, k);
}
static void op_keys(frame *fr, uint8_t code, int n, const char **keys)
{
    fr_u8(fr, code);
    fr_u64(fr, (uint64_t)n);
    for (int i = 0; i < n; i++)
        fr_str(fr, keys[i]);
}
static void op_add(frame *fr, const char *k, int64_t d)
{
    fr_u8(fr, RDZV_M_ADD);
    fr_str(fr, k);
    fr_u64(fr, (uint64_t)d);
}
static void op_cas(frame *fr, const char *k, const char *e, const char *d)
{
    fr_u8(fr, RDZV_M_COMPARE_SET);
    fr_str(fr, k);
    fr_str(fr, e);
    fr_str(fr, d);
}

START_TEST(set_get_delete_numkeys)
{
    fake a;
    frame fr = {0};
    fake_init(&a, RDZV_GEN_MODERN);

    op_set(&fr, "k", "v1");
    ck_assert_int_eq(run(&a, &fr), 0);
    expect_empty(&a); /* SET has no reply */
    op_key(&fr, RDZV_M_GET, "k");
    run(&a, &fr);
    expect_str(&a, "v1");
    op_key(&fr, RDZV_M_GET, "missing");
    run(&a, &fr);
    expect_str(&a, ""); /* as PyTorch's server: an empty value */

    /* Binary value with NUL bytes. */
    fr_u8(&fr, RDZV_M_SET);
    fr_str(&fr, "bin");
    fr_bytes(&fr, "a\0b\0", 4);
    run(&a, &fr);
    op_key(&fr, RDZV_M_GET, "bin");
    run(&a, &fr);
    expect_vec(&a, "a\0b\0", 4);

    fr_u8(&fr, RDZV_M_GETNUMKEYS);
    run(&a, &fr);
    expect_i64(&a, 2);
    op_key(&fr, RDZV_M_DELETE_KEY, "k");
    op_key(&fr, RDZV_M_DELETE_KEY, "k");
    run(&a, &fr);
    expect_i64(&a, 1);
    expect_i64(&a, 0);
    fr_u8(&fr, RDZV_M_GETNUMKEYS);
    run(&a, &fr);
    expect_i64(&a, 1);
    ck_assert_uint_eq(st.ops[RDZV_OP_DELETE_KEY], 2);

    op_key(&fr, RDZV_M_DELETE_KEY, "bin");
    run(&a, &fr);
    expect_i64(&a, 1);
    ck_assert_uint_eq(st.bytes, 0);
    ck_assert_uint_eq(st.nentries, 0);
    rdzv__conn_release(&st, &a.conn);
    fr_free(&fr);
}
END_TEST

START_TEST(add_semantics)
{
    fake a;
    frame fr = {0};
    fake_init(&a, RDZV_GEN_MODERN);

    op_add(&fr, "c", 5);
    op_add(&fr, "c", -7);
    run(&a, &fr);
    expect_i64(&a, 5);
    expect_i64(&a, -2);
    op_key(&fr, RDZV_M_GET, "c");
    run(&a, &fr);
    expect_str(&a, "-2"); /* stored as ASCII decimal */

    /* Like std::stoll: leading blanks and a trailing non-digit tail are accepted. */
    op_set(&fr, "d", "  41xyz");
    op_add(&fr, "d", 1);
    run(&a, &fr);
    expect_i64(&a, 42);

    op_set(&fr, "bad", "abc");
    run(&a, &fr);
    op_add(&fr, "bad", 1);
    ck_assert_int_eq(run(&a, &fr), -EINVAL);

    op_set(&fr, "big", "99999999999999999999");
    run(&a, &fr);
    op_add(&fr, "big", 1);
    ck_assert_int_eq(run(&a, &fr), -EINVAL);
    rdzv__conn_release(&st, &a.conn);
    fr_free(&fr);
}
END_TEST

START_TEST(compare_set_semantics)
{
    fake a;
    frame fr = {0};
    fake_init(&a, RDZV_GEN_MODERN);

    op_cas(&fr, "k", "", "new");      /* missing, empty expected: created */
    op_cas(&fr, "k", "new", "newer"); /* match: replaced */
    op_cas(&fr, "k", "zzz", "nope");  /* mismatch: current value */
    op_cas(&fr, "m", "exp", "des");   /* missing, expected given: expected echoed */
    run(&a, &fr);
    expect_str(&a, "new");
    expect_str(&a, "newer");
    expect_str(&a, "newer");
    expect_str(&a, "exp");
    op_key(&fr, RDZV_M_GET, "m");
    run(&a, &fr);
    expect_str(&a, ""); /* still missing */
    rdzv__conn_release(&st, &a.conn);
    fr_free(&fr);
}
END_TEST

START_TEST(check_and_wait)
{
    fake a, b;
    frame fr = {0};
    const char *ab[] = {"x", "y"};
    fake_init(&a, RDZV_GEN_MODERN);
    fake_init(&b, RDZV_GEN_MODERN);

    op_keys(&fr, RDZV_M_CHECK, 2, ab);
    run(&a, &fr);
    expect_u8(&a, RDZV_CHECK_NOT_READY);

    op_keys(&fr, RDZV_M_WAIT, 2, ab);
    run(&a, &fr);
    expect_empty(&a);
    ck_assert_uint_eq(st.nwaiters, 2);

    op_set(&fr, "x", "1");
    run(&b, &fr);
    expect_empty(&a);    /* one of two keys */
    op_add(&fr, "y", 1); /* ADD also releases waiters */
    run(&b, &fr);
    expect_i64(&b, 1);
    expect_u8(&a, RDZV_WAIT_STOP_WAITING);
    ck_assert_uint_eq(st.nwaiters, 0);

    op_keys(&fr, RDZV_M_CHECK, 2, ab);
    op_keys(&fr, RDZV_M_WAIT, 2, ab); /* already there: answered at once */
    run(&a, &fr);
    expect_u8(&a, RDZV_CHECK_READY);
    expect_u8(&a, RDZV_WAIT_STOP_WAITING);

    /* The same key twice in one WAIT. */
    const char *zz[] = {"z", "z"};
    op_keys(&fr, RDZV_M_WAIT, 2, zz);
    run(&a, &fr);
    expect_empty(&a);
    op_set(&fr, "z", "");
    run(&b, &fr);
    expect_u8(&a, RDZV_WAIT_STOP_WAITING);
    expect_empty(&a);

    /* Two connections waiting on one key are both released. */
    const char *w[] = {"w"};
    op_keys(&fr, RDZV_M_WAIT, 1, w);
    run(&a, &fr);
    op_keys(&fr, RDZV_M_WAIT, 1, w);
    run(&b, &fr);
    fake c;
    fake_init(&c, RDZV_GEN_MODERN);
    op_set(&fr, "w", "");
    run(&c, &fr);
    expect_u8(&a, RDZV_WAIT_STOP_WAITING);
    expect_u8(&b, RDZV_WAIT_STOP_WAITING);
    rdzv__conn_release(&st, &a.conn);
    rdzv__conn_release(&st, &b.conn);
    rdzv__conn_release(&st, &c.conn);
    fr_free(&fr);
}
END_TEST

START_TEST(cancel_and_release)
{
    fake a, b;
    frame fr = {0};
    const char *k[] = {"p", "q", "r"};
    fake_init(&a, RDZV_GEN_MODERN);
    fake_init(&b, RDZV_GEN_MODERN);

    op_keys(&fr, RDZV_M_WAIT, 3, k);
    run(&a, &fr);
    fr_u8(&fr, RDZV_M_CANCEL_WAIT);
    run(&a, &fr);
    expect_u8(&a, RDZV_WAIT_CANCELED);
    ck_assert_uint_eq(st.nwaiters, 0);
    sweep_all();
    ck_assert_uint_eq(st.nentries, 0); /* entries kept only for waiters are gone */

    /* After a cancel, setting the keys sends nothing to a. */
    op_set(&fr, "p", "");
    op_set(&fr, "q", "");
    op_set(&fr, "r", "");
    run(&b, &fr);
    expect_empty(&a);

    /* A closing connection's waits vanish without touching other keys. */
    const char *m[] = {"m1", "m2"};
    op_keys(&fr, RDZV_M_WAIT, 2, m);
    run(&a, &fr);
    ck_assert_uint_eq(st.nwaiters, 2);
    rdzv__conn_release(&st, &a.conn);
    ck_assert_uint_eq(st.nwaiters, 0);
    op_set(&fr, "m1", "");
    op_set(&fr, "m2", "");
    run(&b, &fr); /* must not touch a's freed wait */
    rdzv__conn_release(&st, &b.conn);
    fr_free(&fr);
}
END_TEST

START_TEST(append_multi_ping_list)
{
    fake a;
    frame fr = {0};
    fake_init(&a, RDZV_GEN_MODERN);

    fr_u8(&fr, RDZV_M_APPEND);
    fr_str(&fr, "ap");
    fr_str(&fr, "ab");
    fr_u8(&fr, RDZV_M_APPEND);
    fr_str(&fr, "ap");
    fr_str(&fr, "cd");
    op_key(&fr, RDZV_M_GET, "ap");
    run(&a, &fr);
    expect_str(&a, "abcd");

    fr_u8(&fr, RDZV_M_MULTI_SET);
    fr_u64(&fr, 2);
    fr_str(&fr, "m1");
    fr_str(&fr, "one");
    fr_str(&fr, "m2");
    fr_str(&fr, "two");
    const char *keys[] = {"m2", "nope", "m1"};
    op_keys(&fr, RDZV_M_MULTI_GET, 3, keys);
    run(&a, &fr);
    expect_str(&a, "two");
    expect_str(&a, "");
    expect_str(&a, "one");

    fr_u8(&fr, RDZV_M_PING);
    fr_u32(&fr, 0xabcdef01);
    run(&a, &fr);
    uint32_t nonce = 0xabcdef01;
    expect(&a, &nonce, 4);

    fr_u8(&fr, RDZV_M_LIST_KEYS);
    run(&a, &fr);
    expect_i64(&a, 3);
    /* Three length-prefixed keys in hash order: check the set. */
    int seen = 0;
    for (int i = 0; i < 3; i++) {
        uint64_t n;
        memcpy(&n, a.conn.out.data, 8);
        char k[8] = {0};
        memcpy(k, a.conn.out.data + 8, n);
        seen |= !strcmp(k, "ap") ? 1 : !strcmp(k, "m1") ? 2 : !strcmp(k, "m2") ? 4 : 0;
        expect(&a, a.conn.out.data, 8 + n);
    }
    ck_assert_int_eq(seen, 7);

    fr_u8(&fr, RDZV_M_STATUS);
    ck_assert_int_eq(run(&a, &fr), RDZV__EXEC_STATUS);
    rdzv__conn_release(&st, &a.conn);
    fr_free(&fr);
}
END_TEST

START_TEST(queues)
{
    fake a, b;
    frame fr = {0};
    fake_init(&a, RDZV_GEN_MODERN);
    fake_init(&b, RDZV_GEN_MODERN);

    op_key(&fr, RDZV_M_QUEUE_POP, "q");
    op_key(&fr, RDZV_M_QUEUE_LEN, "q");
    run(&a, &fr);
    expect_i64(&a, 0); /* empty: length only */
    expect_i64(&a, 0);

    /* A blocking pop: WAIT on the queue name, released by a push. */
    const char *q[] = {"q"};
    op_keys(&fr, RDZV_M_WAIT, 1, q);
    run(&a, &fr);
    expect_empty(&a);
    fr_u8(&fr, RDZV_M_QUEUE_PUSH);
    fr_str(&fr, "q");
    fr_str(&fr, "item1");
    fr_u8(&fr, RDZV_M_QUEUE_PUSH);
    fr_str(&fr, "q");
    fr_str(&fr, "item2");
    run(&b, &fr);
    expect_u8(&a, RDZV_WAIT_STOP_WAITING);
    op_keys(&fr, RDZV_M_CHECK, 1, q);
    op_key(&fr, RDZV_M_QUEUE_LEN, "q");
    op_key(&fr, RDZV_M_QUEUE_POP, "q");
    op_key(&fr, RDZV_M_QUEUE_POP, "q");
    op_key(&fr, RDZV_M_QUEUE_POP, "q");
    run(&a, &fr);
    expect_u8(&a, RDZV_CHECK_READY);
    expect_i64(&a, 2);
    expect_i64(&a, 2); /* length before the pop, then the item (FIFO) */
    expect_str(&a, "item1");
    expect_i64(&a, 1);
    expect_str(&a, "item2");
    expect_i64(&a, 0);
    expect_empty(&a);
    ck_assert_uint_eq(st.bytes, 0);
    ck_assert_uint_eq(st.nentries, 0);

    /* A push goes to a WAIT that needs only the queue before one that needs more keys. */
    fake c;
    fake_init(&c, RDZV_GEN_MODERN);
    const char *qx[] = {"q", "x"};
    op_keys(&fr, RDZV_M_WAIT, 2, qx);
    run(&a, &fr);
    op_keys(&fr, RDZV_M_WAIT, 1, q);
    run(&c, &fr);
    fr_u8(&fr, RDZV_M_QUEUE_PUSH);
    fr_str(&fr, "q");
    fr_str(&fr, "i");
    run(&b, &fr);
    expect_u8(&c, RDZV_WAIT_STOP_WAITING);
    expect_empty(&a);
    rdzv__conn_release(&st, &a.conn);
    rdzv__conn_release(&st, &b.conn);
    rdzv__conn_release(&st, &c.conn);
    fr_free(&fr);
}
END_TEST

static void op_barrier(frame *fr, const char *k, int64_t world)
{
    fr_u8(fr, RDZV_M_BARRIER);
    fr_str(fr, k);
    fr_u64(fr, (uint64_t)world);
}

START_TEST(barrier_op)
{
    fake a, b, c;
    frame fr = {0};
    fake_init(&a, RDZV_GEN_MODERN);
    fake_init(&b, RDZV_GEN_MODERN);
    fake_init(&c, RDZV_GEN_MODERN);

    /* World of 3: the first two park, the third releases everyone. */
    op_barrier(&fr, "bar", 3);
    run(&a, &fr);
    op_barrier(&fr, "bar", 3);
    run(&b, &fr);
    expect_empty(&a);
    expect_empty(&b);
    ck_assert_uint_eq(st.nwaiters, 2);
    op_barrier(&fr, "bar", 3);
    run(&c, &fr);
    expect_u8(&a, RDZV_WAIT_STOP_WAITING);
    expect_u8(&b, RDZV_WAIT_STOP_WAITING);
    expect_u8(&c, RDZV_WAIT_STOP_WAITING);
    ck_assert_uint_eq(st.nwaiters, 0);
    /* The counter is a plain ASCII key; a later caller passes at once. */
    op_key(&fr, RDZV_M_GET, "bar");
    op_barrier(&fr, "bar", 3);
    run(&a, &fr);
    expect_str(&a, "3");
    expect_u8(&a, RDZV_WAIT_STOP_WAITING);

    /* A parked barrier is released by an ADD that reaches the count, not by a smaller one. */
    op_barrier(&fr, "b2", 5);
    run(&a, &fr);
    op_add(&fr, "b2", 2);
    run(&b, &fr);
    expect_i64(&b, 3);
    expect_empty(&a);
    op_add(&fr, "b2", 2);
    run(&b, &fr);
    expect_i64(&b, 5);
    expect_u8(&a, RDZV_WAIT_STOP_WAITING);

    /* CANCEL_WAIT cancels a parked barrier; the count it added stays. */
    op_barrier(&fr, "b3", 2);
    fr_u8(&fr, RDZV_M_CANCEL_WAIT);
    run(&a, &fr);
    expect_u8(&a, RDZV_WAIT_CANCELED);
    expect_empty(&a);
    op_key(&fr, RDZV_M_GET, "b3");
    run(&a, &fr);
    expect_str(&a, "1");

    /* A counter that is not a number is refused, as for ADD. */
    op_set(&fr, "b4", "x");
    run(&a, &fr);
    op_barrier(&fr, "b4", 2);
    ck_assert_int_eq(run(&a, &fr), -EINVAL);

    /* A parked barrier does not take a queue item's wake-up from a popper. */
    const char *q[] = {"bq"};
    op_barrier(&fr, "bq", 2);
    run(&a, &fr); /* sets "bq" to 1 as a value, so a WAIT on it is satisfied at once */
    op_keys(&fr, RDZV_M_WAIT, 1, q);
    run(&b, &fr);
    expect_u8(&b, RDZV_WAIT_STOP_WAITING);
    rdzv__conn_release(&st, &a.conn);
    rdzv__conn_release(&st, &b.conn);
    rdzv__conn_release(&st, &c.conn);
    ck_assert_uint_eq(st.nwaiters, 0);
    fr_free(&fr);
}
END_TEST

START_TEST(clear_keeps_prefix_and_waiters)
{
    fake a, b;
    frame fr = {0};
    fake_init(&a, RDZV_GEN_MODERN);
    fake_init(&b, RDZV_GEN_MODERN);
    op_set(&fr, "/ddprun/x", "keep");
    op_set(&fr, "/worker/y", "drop");
    op_set(&fr, "rank_0", "drop");
    fr_u8(&fr, RDZV_M_QUEUE_PUSH);
    fr_str(&fr, "q");
    fr_str(&fr, "item");
    run(&a, &fr);
    const char *w[] = {"late"};
    op_keys(&fr, RDZV_M_WAIT, 1, w);
    run(&b, &fr);
    ck_assert_uint_eq(rdzv__store_clear(&st, (const uint8_t *)"/ddprun/", 8), 3);
    fr_u8(&fr, RDZV_M_GETNUMKEYS);
    op_key(&fr, RDZV_M_QUEUE_LEN, "q");
    run(&a, &fr);
    expect_i64(&a, 1);
    expect_i64(&a, 0);
    sweep_all();
    ck_assert_uint_eq(st.bytes, strlen("/ddprun/x") + 4 + strlen("late"));
    /* The pending WAIT survives and is released by a later SET. */
    op_set(&fr, "late", "");
    run(&a, &fr);
    expect_u8(&b, RDZV_WAIT_STOP_WAITING);
    rdzv__conn_release(&st, &a.conn);
    rdzv__conn_release(&st, &b.conn);
    fr_free(&fr);
}
END_TEST

/*
 * A clear only marks what it deletes; the names are freed later, a slice at a time. From the
 * clear on, every request sees the cleared keys as deleted ones, before and while they are
 * freed: GET, CHECK, GETNUMKEYS, LIST_KEYS, DELETE, ADD, COMPARE_SET, queues, and the legacy
 * watch (no notification at the clear, KEY_CREATED on the next SET). Pending WAITs and
 * BARRIERs stay pending and are released by later writes, as with the clear in one pass.
 */
START_TEST(clear_is_lazy)
{
    fake a, b, c, w;
    frame fr = {0};
    char k[32];
    fake_init(&a, RDZV_GEN_MODERN);
    fake_init(&b, RDZV_GEN_MODERN);
    fake_init(&c, RDZV_GEN_MODERN);
    fake_init(&w, RDZV_GEN_LEGACY);
    st.max_total_bytes = 64 << 20;
    for (int i = 0; i < 20000; i++) {
        snprintf(k, sizeof(k), "fill/%d", i);
        op_set(&fr, k, "");
    }
    op_set(&fr, "a", "old");
    op_set(&fr, "/ddprun/job/k", "kept");
    op_add(&fr, "/ddprun-coll/job/n", 5);
    fr_u8(&fr, RDZV_M_QUEUE_PUSH);
    fr_str(&fr, "q");
    fr_str(&fr, "item");
    run(&a, &fr);
    expect_i64(&a, 5);
    op_key(&fr, RDZV_L_WATCH_KEY, "a");
    run(&w, &fr);
    expect_u8(&w, RDZV_WATCH_CALLBACK_REGISTERED);
    const char *late[] = {"late"};
    op_keys(&fr, RDZV_M_WAIT, 1, late);
    run(&b, &fr);
    op_barrier(&fr, "bar", 2); /* parks with the counter at 1 */
    run(&c, &fr);
    expect_empty(&c);
    size_t memory = st.memory, private_memory = st.private_memory;

    /* 20000 fill keys, a, /ddprun-coll/job/n, q and bar; /ddprun/job/k is kept. */
    ck_assert_uint_eq(rdzv__store_clear(&st, (const uint8_t *)"/ddprun/", 8), 20004);
    ck_assert_uint_gt(st.nstale, 20000);
    ck_assert_uint_eq(st.memory, memory); /* counted until freed */
    ck_assert_uint_eq(st.private_memory, private_memory);
    expect_empty(&w);
    fr_u8(&fr, RDZV_M_GETNUMKEYS);
    op_key(&fr, RDZV_M_GET, "a");
    op_key(&fr, RDZV_M_GET, "/ddprun/job/k");
    op_key(&fr, RDZV_M_QUEUE_LEN, "q");
    op_key(&fr, RDZV_M_DELETE_KEY, "fill/7");
    const char *chk[] = {"fill/8"};
    op_keys(&fr, RDZV_M_CHECK, 1, chk);
    op_add(&fr, "/ddprun-coll/job/n", 1);
    op_cas(&fr, "fill/9", "", "new");
    fr_u8(&fr, RDZV_M_LIST_KEYS);
    run(&a, &fr);
    expect_i64(&a, 1);
    expect_str(&a, "");
    expect_str(&a, "kept");
    expect_i64(&a, 0);
    expect_i64(&a, 0);
    expect_u8(&a, RDZV_CHECK_NOT_READY);
    expect_i64(&a, 1); /* the counter starts again */
    expect_str(&a, "new");
    expect_i64(&a, 3); /* /ddprun/job/k, /ddprun-coll/job/n, fill/9: not the 20000 cleared */
    a.conn.out.len = 0;

    /* Freed in slices: a small budget leaves names for later. */
    ck_assert(rdzv__store_sweep(&st, 100));
    ck_assert_uint_gt(st.nstale, 0);
    sweep_all();
    ck_assert_uint_lt(st.memory, memory / 10);
    ck_assert_uint_eq(st.nkeys, 3);

    /* The watch and the waits were kept and told nothing; later writes reach them. */
    expect_empty(&w);
    op_set(&fr, "a", "v");
    op_set(&fr, "late", "");
    run(&a, &fr);
    expect_u8(&w, RDZV_WATCH_KEY_CREATED);
    expect_str(&w, "a");
    expect_str(&w, "");
    expect_str(&w, "v");
    expect_u8(&b, RDZV_WAIT_STOP_WAITING);
    expect_empty(&c);
    op_barrier(&fr, "bar", 2); /* the counter was cleared: 1, still short of 2 */
    run(&a, &fr);
    expect_empty(&a);
    expect_empty(&c);
    op_set(&fr, "bar", "2");
    run(&a, &fr);
    expect_u8(&c, RDZV_WAIT_STOP_WAITING);
    expect_u8(&a, RDZV_WAIT_STOP_WAITING);
    rdzv__conn_release(&st, &a.conn);
    rdzv__conn_release(&st, &b.conn);
    rdzv__conn_release(&st, &c.conn);
    rdzv__conn_release(&st, &w.conn);
    ck_assert_uint_eq(rdzv__store_clear(&st, NULL, 0), 6);
    ck_assert_uint_eq(st.nkeys, 0);
    sweep_all();
    ck_assert_uint_eq(st.nentries + st.bytes + st.memory + st.private_memory, 0);
    fr_free(&fr);
}
END_TEST

/* A request that needs the room of cleared names not yet freed frees them first: a full store,
 * cleared, takes a large value at once. Two clears in a row, and names waited on across them,
 * come out right. */
START_TEST(clear_makes_room)
{
    fake a, b;
    frame fr = {0};
    char k[32];
    fake_init(&a, RDZV_GEN_MODERN);
    fake_init(&b, RDZV_GEN_MODERN);
    const char *wk[] = {"w"};
    op_keys(&fr, RDZV_M_WAIT, 1, wk);
    run(&b, &fr);
    int rc = 0, n = 0;
    for (; rc == 0; n++) {
        snprintf(k, sizeof(k), "fill/%d", n);
        op_set(&fr, k, "0123456789");
        rc = run(&a, &fr);
    }
    ck_assert_int_eq(rc, -ENOSPC);
    ck_assert_uint_eq(rdzv__store_clear(&st, NULL, 0), (size_t)n - 1);
    op_set(&fr, "x", "y");
    ck_assert_uint_eq(rdzv__store_clear(&st, (const uint8_t *)"x", 1), 0); /* x is new: kept */
    static char big[600 << 10];
    fr_u8(&fr, RDZV_M_SET);
    fr_str(&fr, "big");
    fr_bytes(&fr, big, sizeof(big));
    ck_assert_int_eq(run(&a, &fr), 0);
    ck_assert_uint_le(st.memory, st.max_total_bytes);
    fr_u8(&fr, RDZV_M_GETNUMKEYS);
    op_key(&fr, RDZV_M_GET, "x");
    run(&a, &fr);
    expect_i64(&a, 2);
    expect_str(&a, "y");
    expect_empty(&b);
    op_set(&fr, "w", "");
    run(&a, &fr);
    expect_u8(&b, RDZV_WAIT_STOP_WAITING);
    sweep_all();
    rdzv__conn_release(&st, &a.conn);
    rdzv__conn_release(&st, &b.conn);
    ck_assert_uint_eq(st.nentries, 3);
    fr_free(&fr);
}
END_TEST

/* Prefixes that keep part of a pool (names looked at one by one) and clears in a row: a name
 * cleared once stays cleared when a later clear keeps its whole pool. */
START_TEST(clear_prefixes)
{
    fake a;
    frame fr = {0};
    fake_init(&a, RDZV_GEN_MODERN);
    op_set(&fr, "/ddprun/a/1", "a");
    op_set(&fr, "/ddprun/b/1", "b");
    op_set(&fr, "/ddprun-coll/c", "c");
    op_set(&fr, "/ddprunX", "x");
    op_set(&fr, "open", "o");
    run(&a, &fr);
    ck_assert_uint_eq(rdzv__store_clear(&st, (const uint8_t *)"/ddprun/a/", 10), 4);
    ck_assert_uint_eq(st.nkeys, 1);
    op_set(&fr, "/ddprun/b/2", "b2");
    op_set(&fr, "/ddprunY", "y");
    run(&a, &fr);
    /* Keeps both private pools whole and the open names starting with "/ddprun". */
    ck_assert_uint_eq(rdzv__store_clear(&st, (const uint8_t *)"/ddprun", 7), 0);
    op_key(&fr, RDZV_M_GET, "/ddprun/a/1");
    op_key(&fr, RDZV_M_GET, "/ddprun/b/1");
    op_key(&fr, RDZV_M_GET, "/ddprun/b/2");
    op_key(&fr, RDZV_M_GET, "/ddprunX");
    op_key(&fr, RDZV_M_GET, "/ddprunY");
    fr_u8(&fr, RDZV_M_GETNUMKEYS);
    run(&a, &fr);
    expect_str(&a, "a");
    expect_str(&a, "");
    expect_str(&a, "b2");
    expect_str(&a, "");
    expect_str(&a, "y");
    expect_i64(&a, 3);
    ck_assert_uint_eq(rdzv__store_clear(&st, (const uint8_t *)"/ddprun-coll/", 13), 3);
    sweep_all();
    ck_assert_uint_eq(st.nentries + st.nkeys + st.bytes + st.memory + st.private_memory, 0);
    rdzv__conn_release(&st, &a.conn);
    fr_free(&fr);
}
END_TEST

/*
 * A closing connection (or a CANCEL_WAIT) lets go of its WAITs and watches at once, and the
 * sweep frees them later, a slice at a time: meanwhile they answer nobody, a queue push passes
 * them by, the counts leave them out, and their memory stays counted until freed.
 */
START_TEST(release_is_lazy)
{
    fake a, b, w;
    frame fr = {0};
    char k[32];
    fake_init(&a, RDZV_GEN_MODERN);
    fake_init(&b, RDZV_GEN_MODERN);
    fake_init(&w, RDZV_GEN_LEGACY);
    st.max_total_bytes = 64 << 20;
    enum { NK = 10 * 1024 }; /* ten WAITs of 1024 keys */
    frame many = {0};
    for (int i = 0; i < NK; i++) {
        if (i % 1024 == 0) {
            fr_u8(&many, RDZV_M_WAIT);
            fr_u64(&many, 1024);
        }
        snprintf(k, sizeof(k), "many/%d", i);
        fr_str(&many, k);
    }
    run(&a, &many);
    const char *q[] = {"q"};
    op_keys(&fr, RDZV_M_WAIT, 1, q);
    run(&a, &fr);
    const char *z[] = {"z"};
    op_keys(&fr, RDZV_M_WAIT, 1, z);
    run(&a, &fr);
    op_keys(&fr, RDZV_M_WAIT, 1, q);
    run(&b, &fr);
    op_key(&fr, RDZV_L_WATCH_KEY, "k");
    run(&w, &fr);
    expect_u8(&w, RDZV_WATCH_CALLBACK_REGISTERED);
    ck_assert_uint_eq(st.nwaiters, NK + 3);
    size_t memory = st.memory;

    rdzv__conn_release(&st, &a.conn);
    rdzv__conn_release(&st, &w.conn);
    ck_assert_uint_eq(st.nwaiters, 1); /* b's */
    ck_assert_uint_eq(st.nwatches, 0);
    ck_assert_uint_eq(st.memory, memory);
    ck_assert(!queue_empty(&st.dead));
    /* A push to q wakes b, not a's dead WAIT, which came first; a dead WAIT whose key appears
     * is freed then and there. */
    fr_u8(&fr, RDZV_M_QUEUE_PUSH);
    fr_str(&fr, "q");
    fr_str(&fr, "item");
    op_set(&fr, "z", "");
    op_set(&fr, "k", "v");
    run(&b, &fr);
    expect_u8(&b, RDZV_WAIT_STOP_WAITING);
    expect_empty(&b);
    ck_assert_uint_eq(st.nwaiters, 0);
    /* The WAITs are freed over many slices. */
    int slices = 0;
    while (rdzv__store_sweep(&st, 64 * RDZV__SWEEP_NAME))
        slices++;
    ck_assert_int_gt(slices, 100);
    ck_assert(queue_empty(&st.dead));
    ck_assert_uint_eq(st.nentries, 3); /* q, z and k */
    ck_assert_uint_lt(st.memory, memory / 10);
    rdzv__conn_release(&st, &b.conn);
    fr_free(&many);
    fr_free(&fr);
}
END_TEST

/* A request that needs the room of a closed connection's WAITs frees them first, and the name
 * it writes survives although only those WAITs named it. */
START_TEST(release_makes_room)
{
    fake a, b;
    frame fr = {0};
    char k[32];
    fake_init(&a, RDZV_GEN_MODERN);
    fake_init(&b, RDZV_GEN_MODERN);
    int rc = 0, w = 0;
    for (; rc == 0; w++) {
        fr_u8(&fr, RDZV_M_WAIT);
        fr_u64(&fr, 1024);
        for (int i = 0; i < 1024; i++) {
            snprintf(k, sizeof(k), "w/%d/%d", w, i);
            fr_str(&fr, k);
        }
        rc = run(&a, &fr);
    }
    ck_assert_int_eq(rc, -ENOSPC);
    rdzv__conn_release(&st, &a.conn);
    ck_assert(!queue_empty(&st.dead));
    static char big[600 << 10];
    memset(big, 'b', sizeof(big));
    snprintf(k, sizeof(k), "w/%d/5", w - 2); /* in the last WAIT parked: swept first */
    fr_u8(&fr, RDZV_M_SET);
    fr_str(&fr, k);
    fr_bytes(&fr, big, sizeof(big));
    ck_assert_int_eq(run(&b, &fr), 0);
    ck_assert_uint_le(st.memory, st.max_total_bytes);
    op_key(&fr, RDZV_M_GET, k);
    run(&b, &fr);
    expect_vec(&b, big, sizeof(big));
    sweep_all();
    ck_assert_uint_eq(st.nentries, 1);
    rdzv__conn_release(&st, &b.conn);
    fr_free(&fr);
}
END_TEST

START_TEST(legacy_watch)
{
    fake w, a;
    frame fr = {0};
    fake_init(&w, RDZV_GEN_LEGACY);
    fake_init(&a, RDZV_GEN_LEGACY);

    op_key(&fr, RDZV_L_WATCH_KEY, "k");
    run(&w, &fr);
    expect_u8(&w, RDZV_WATCH_CALLBACK_REGISTERED);

    fr_u8(&fr, RDZV_L_SET);
    fr_str(&fr, "k");
    fr_str(&fr, "v1");
    fr_u8(&fr, RDZV_L_SET);
    fr_str(&fr, "k");
    fr_str(&fr, "v2");
    op_key(&fr, RDZV_L_DELETE_KEY, "k");
    run(&a, &fr);
    expect_i64(&a, 1);
    expect_u8(&w, RDZV_WATCH_KEY_CREATED);
    expect_str(&w, "k");
    expect_str(&w, "");
    expect_str(&w, "v1");
    expect_u8(&w, RDZV_WATCH_KEY_UPDATED);
    expect_str(&w, "k");
    expect_str(&w, "v1");
    expect_str(&w, "v2");
    expect_u8(&w, RDZV_WATCH_KEY_DELETED);
    expect_str(&w, "k");
    expect_str(&w, "v2");
    expect_str(&w, "");
    expect_empty(&w);
    rdzv__conn_release(&st, &w.conn);
    ck_assert_uint_eq(st.nwatches, 0);
    sweep_all();
    ck_assert_uint_eq(st.nentries, 0);
    rdzv__conn_release(&st, &a.conn);
    fr_free(&fr);
}
END_TEST

START_TEST(size_cap)
{
    fake a;
    frame fr = {0};
    fake_init(&a, RDZV_GEN_MODERN);
    static char big[600 << 10];
    memset(big, 'x', sizeof(big));

    fr_u8(&fr, RDZV_M_SET);
    fr_str(&fr, "a");
    fr_bytes(&fr, big, sizeof(big));
    ck_assert_int_eq(run(&a, &fr), 0);
    fr_u8(&fr, RDZV_M_SET);
    fr_str(&fr, "b");
    fr_bytes(&fr, big, sizeof(big)); /* 1.2 MiB > 1 MiB cap */
    ck_assert_int_eq(run(&a, &fr), -ENOSPC);
    fr_u8(&fr, RDZV_M_GETNUMKEYS);
    run(&a, &fr);
    expect_i64(&a, 1); /* nothing half-stored */
    ck_assert_uint_eq(st.bytes, 1 + sizeof(big));
    fr_u8(&fr, RDZV_M_APPEND);
    fr_str(&fr, "a");
    fr_bytes(&fr, big, sizeof(big));
    ck_assert_int_eq(run(&a, &fr), -ENOSPC);
    /* Replacing the value with a small one frees room. */
    op_set(&fr, "a", "small");
    op_set(&fr, "b", "small");
    ck_assert_int_eq(run(&a, &fr), 0);
    ck_assert_uint_eq(st.bytes, 2 + 10);
    rdzv__conn_release(&st, &a.conn);
    fr_free(&fr);
}
END_TEST

/* Many keys: the table grows and every key stays reachable. */
START_TEST(many_keys)
{
    fake a;
    frame fr = {0};
    char k[32];
    fake_init(&a, RDZV_GEN_MODERN);
    st.max_total_bytes = 64 << 20; /* 20000 keys take ~4 MiB with their overhead counted */
    for (int i = 0; i < 20000; i++) {
        snprintf(k, sizeof(k), "key/%d", i);
        op_set(&fr, k, k);
        run(&a, &fr);
    }
    ck_assert_uint_ge(st.nbuckets, 16384);
    for (int i = 0; i < 20000; i += 997) {
        snprintf(k, sizeof(k), "key/%d", i);
        op_key(&fr, RDZV_M_GET, k);
        run(&a, &fr);
        expect_str(&a, k);
    }
    rdzv__conn_release(&st, &a.conn);
    fr_free(&fr);
}
END_TEST

/* The table grows by moving a few buckets per insertion: every name stays reachable while the
 * old table is being emptied, deletions and a clear find their names in either table, and the
 * old table is gone once the move is over. */
START_TEST(growth_in_steps)
{
    fake a;
    frame fr = {0};
    char k[32];
    fake_init(&a, RDZV_GEN_MODERN);
    st.max_total_bytes = 64 << 20;
    int moving = 0;
    for (int i = 0; i < 10000; i++) {
        snprintf(k, sizeof(k), "key/%d", i);
        op_set(&fr, k, k);
        run(&a, &fr);
        if (st.old && st.rehash_pos > 0 && moving++ % 50 == 0)
            for (int j = 0; j <= i; j += 7) { /* mid-move: old and new names alike */
                snprintf(k, sizeof(k), "key/%d", j);
                op_key(&fr, RDZV_M_GET, k);
                run(&a, &fr);
                expect_str(&a, k);
            }
    }
    ck_assert_int_gt(moving, 0);
    ck_assert_ptr_null(st.old); /* the last move (8192 buckets) ended after 1024 insertions */
    for (int i = 0; i < 10000; i += 3) {
        snprintf(k, sizeof(k), "key/%d", i);
        op_key(&fr, RDZV_M_DELETE_KEY, k);
        run(&a, &fr);
        expect_i64(&a, 1);
    }
    ck_assert_uint_eq(st.nkeys, 10000 - 3334);
    fr_u8(&fr, RDZV_M_LIST_KEYS);
    run(&a, &fr);
    expect_i64(&a, 10000 - 3334);
    a.conn.out.len = 0;
    ck_assert_uint_eq(rdzv__store_clear(&st, NULL, 0), 10000 - 3334);
    sweep_all();
    ck_assert_uint_eq(st.nentries, 0);
    ck_assert_uint_eq(st.memory, 0);
    rdzv__conn_release(&st, &a.conn);
    fr_free(&fr);
}
END_TEST

/* Names under the private roots, and WAITs naming one, are counted in their own pool: a store
 * whose open keys are full still takes private ones, up to max_private_bytes. */
START_TEST(private_pool)
{
    fake a;
    frame fr = {0};
    char k[32];
    fake_init(&a, RDZV_GEN_MODERN);
    st.max_total_bytes = 64 << 10;
    st.max_private_bytes = 32 << 10;
    int rc = 0, open_keys = 0;
    for (; rc == 0; open_keys++) {
        snprintf(k, sizeof(k), "open/%d", open_keys);
        op_set(&fr, k, "v");
        rc = run(&a, &fr);
    }
    ck_assert_int_eq(rc, -ENOSPC);
    ck_assert_uint_eq(st.private_memory, 0);
    size_t open_memory = st.memory;
    op_set(&fr, "/ddprun/job/round", "1");
    ck_assert_int_eq(run(&a, &fr), 0);
    op_add(&fr, "/ddprun-coll/job/n", 1);
    ck_assert_int_eq(run(&a, &fr), 0);
    expect_i64(&a, 1);
    const char *wk[] = {"/ddprun/job/later", "open/0"};
    op_keys(&fr, RDZV_M_WAIT, 2, wk);
    ck_assert_int_eq(run(&a, &fr), 0);
    ck_assert_uint_eq(st.memory, open_memory); /* the WAIT and its new name: private */
    ck_assert_uint_gt(st.private_memory, 0);
    int private_keys = 0;
    for (rc = 0; rc == 0; private_keys++) {
        snprintf(k, sizeof(k), "/ddprun/k/%d", private_keys);
        op_set(&fr, k, "v");
        rc = run(&a, &fr);
    }
    ck_assert_int_eq(rc, -ENOSPC);
    ck_assert_uint_le(st.private_memory, 32 << 10);
    ck_assert_uint_eq(st.memory, open_memory);
    rdzv__conn_release(&st, &a.conn);
    ck_assert_uint_eq(rdzv__store_clear(&st, NULL, 0), (size_t)open_keys - 1 + private_keys + 1);
    sweep_all();
    ck_assert_uint_eq(st.memory + st.private_memory, 0);
    fr_free(&fr);
}
END_TEST

/* LIST_KEYS over more than max_list_keys keys is refused, naming the cap. */
START_TEST(list_keys_cap)
{
    fake a;
    frame fr = {0};
    fake_init(&a, RDZV_GEN_MODERN);
    st.max_list_keys = 2;
    op_set(&fr, "a", "1");
    op_set(&fr, "b", "2");
    fr_u8(&fr, RDZV_M_LIST_KEYS);
    ck_assert_int_eq(run(&a, &fr), 0);
    expect_i64(&a, 2);
    a.conn.out.len = 0;
    op_set(&fr, "c", "3");
    fr_u8(&fr, RDZV_M_LIST_KEYS);
    ck_assert_int_eq(run(&a, &fr), -E2BIG);
    ck_assert_int_eq(a.conn.error, -E2BIG);
    ck_assert_ptr_nonnull(strstr(a.conn.why, "max_list_keys"));
    rdzv__conn_release(&st, &a.conn);
    fr_free(&fr);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("store");
    TCase *tc =
        check_tcase(s, "ops", 0, set_get_delete_numkeys, add_semantics, compare_set_semantics,
                    check_and_wait, cancel_and_release, append_multi_ping_list, queues, barrier_op,
                    clear_keeps_prefix_and_waiters, clear_is_lazy, clear_makes_room, clear_prefixes,
                    release_is_lazy, release_makes_room, legacy_watch, size_cap, many_keys,
                    growth_in_steps, private_pool, list_keys_cap);
    tcase_add_checked_fixture(tc, setup, teardown);
    return check_run(s);
}
