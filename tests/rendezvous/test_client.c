/*
 * Tests of the blocking client (rendezvous/client.c, connect.c) against the real server, started
 * in-process on 127.0.0.1 port 0 for every case, and against tiny scripted fake servers for the
 * failures a real server does not produce on demand: a peer that closes or stalls mid-reply, a
 * malformed reply, a peer that is not a store, and the STOP_WAITING/WAIT_CANCELED race of a
 * cancelled wait.
 *
 * Every case runs in its own forked process (Check's fork mode) under a timeout. Multi-process
 * cases fork further children that report through their exit status. Nothing waits on a sleep
 * for synchronisation: where one side must be parked before the other acts, the test polls the
 * server's status for the waiter count.
 */
#include <check.h>
#include <jansson.h>

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "monoclock.h"
#include "proto.h"
#include "rdzv.h"

/* ------------------------------------------------------------------------------------------ */
/* Fixtures and helpers                                                                        */
/* ------------------------------------------------------------------------------------------ */

#include "server_proc.h"
#include "check_main.h"

/* A client of the fixture's server with the given prefix (NULL: none) and timeout. */
static rdzv_client *client_with(const char *prefix, int timeout_ms)
{
    rdzv_client_options o;
    rdzv_client_options_init(&o);
    o.prefix = prefix;
    o.timeout_ms = timeout_ms;
    o.connect_timeout_ms = 5000;
    rdzv_client *c = NULL;
    int rc = rdzv_client_connect("127.0.0.1", port, &o, &c);
    ck_assert_msg(rc == 0, "connect: %d %s", rc, rdzv_client_last_error(NULL));
    return c;
}

static rdzv_client *client(void)
{
    return client_with(NULL, 10000);
}

static void set_str(rdzv_client *c, const char *key, const char *value)
{
    int rc = rdzv_set(c, key, value, strlen(value));
    ck_assert_msg(rc == 0, "set %s: %d %s", key, rc, rdzv_client_last_error(c));
}

/* Gets `key` and checks that it holds exactly `expect`. */
static void expect_value(rdzv_client *c, const char *key, const char *expect)
{
    void *v = NULL;
    size_t n = 0;
    int rc = rdzv_get(c, key, &v, &n);
    ck_assert_msg(rc == 0, "get %s: %d %s", key, rc, rdzv_client_last_error(c));
    ck_assert_uint_eq(n, strlen(expect));
    ck_assert_mem_eq(v, expect, n);
    ck_assert_int_eq(((char *)v)[n], 0);
    rdzv_free(v);
}

/* A TCP socket bound to 127.0.0.1 on a free port, not listening: connections are refused. */
static int refusing_socket(int *port_out)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, len), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port_out = ntohs(a.sin_port);
    return fd;
}

/* ------------------------------------------------------------------------------------------ */
/* Fake servers                                                                                */
/* ------------------------------------------------------------------------------------------ */

/*
 * A one-connection server on a thread: it accepts one client and runs a script on the socket.
 * Scripts return 0 when the client behaved as expected; the test checks that after the join,
 * since assertions belong on the test's own thread.
 */
typedef int (*fake_script)(int fd);

struct fake {
    int lfd;
    int port;
    fake_script script;
    int result;
    pthread_t thread;
};

static void *fake_main(void *arg)
{
    struct fake *f = arg;
    int fd = accept(f->lfd, NULL, NULL);
    f->result = fd < 0 ? -1 : f->script(fd);
    if (fd >= 0)
        close(fd);
    return NULL;
}

static void fake_start(struct fake *f, fake_script script)
{
    f->lfd = refusing_socket(&f->port);
    ck_assert_int_eq(listen(f->lfd, 4), 0);
    f->script = script;
    f->result = -1;
    ck_assert_int_eq(pthread_create(&f->thread, NULL, fake_main, f), 0);
}

static int fake_join(struct fake *f)
{
    pthread_join(f->thread, NULL);
    close(f->lfd);
    return f->result;
}

static int read_full(int fd, void *buf, size_t n)
{
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t r = recv(fd, p, n, 0);
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static int write_full(int fd, const void *buf, size_t n)
{
    return send(fd, buf, n, MSG_NOSIGNAL) == (ssize_t)n ? 0 : -1;
}

/* Reads until the client closes, so that the client sees no reset it did not cause. */
static void drain_until_eof(int fd)
{
    uint8_t b[256];
    while (recv(fd, b, sizeof b, 0) > 0)
        ;
}

/* Plays the server side of the opening: VALIDATE with the magic, then PING echoed back. */
static int fake_handshake(int fd)
{
    uint8_t b[10];
    if (read_full(fd, b, sizeof b) < 0)
        return -1;
    if (b[0] != RDZV_M_VALIDATE || rdzv__ld32(b + 1) != RDZV_VALIDATE_MAGIC || b[5] != RDZV_M_PING)
        return -2;
    return write_full(fd, b + 6, 4);
}

static rdzv_client *fake_client(const struct fake *f, int timeout_ms)
{
    rdzv_client_options o;
    rdzv_client_options_init(&o);
    o.timeout_ms = timeout_ms;
    o.connect_timeout_ms = 5000;
    rdzv_client *c = NULL;
    int rc = rdzv_client_connect("127.0.0.1", f->port, &o, &c);
    ck_assert_msg(rc == 0, "connect: %d %s", rc, rdzv_client_last_error(NULL));
    return c;
}

/* GETNUMKEYS, answered with 3 of the 8 reply bytes, then the connection closes. */
static int script_close_mid_reply(int fd)
{
    uint8_t op;
    if (fake_handshake(fd) < 0 || read_full(fd, &op, 1) < 0 || op != RDZV_M_GETNUMKEYS)
        return -1;
    return write_full(fd, "\x05\x00\x00", 3);
}

/* GETNUMKEYS, answered with 3 of the 8 reply bytes, then silence until the client leaves. */
static int script_stall_mid_reply(int fd)
{
    uint8_t op;
    if (fake_handshake(fd) < 0 || read_full(fd, &op, 1) < 0 || op != RDZV_M_GETNUMKEYS)
        return -1;
    if (write_full(fd, "\x05\x00\x00", 3) < 0)
        return -1;
    drain_until_eof(fd);
    return 0;
}

/* CHECK for one key, answered with a reply code that does not exist. */
static int script_bad_check_reply(int fd)
{
    uint8_t b[9];
    if (fake_handshake(fd) < 0 || read_full(fd, b, 9) < 0 || b[0] != RDZV_M_CHECK)
        return -1;
    uint64_t n = rdzv__ld64(b + 1), klen;
    for (uint64_t i = 0; i < n; i++) {
        char key[256];
        if (read_full(fd, &klen, 8) < 0 || klen > sizeof key || read_full(fd, key, klen) < 0)
            return -1;
    }
    if (write_full(fd, "\x07", 1) < 0)
        return -1;
    drain_until_eof(fd);
    return 0;
}

/* MULTI_GET, answered with a vector length no store could hold. */
static int script_absurd_length(int fd)
{
    uint8_t b[9];
    if (fake_handshake(fd) < 0 || read_full(fd, b, 9) < 0 || b[0] != RDZV_M_MULTI_GET)
        return -1;
    uint64_t huge = (uint64_t)1 << 62;
    if (write_full(fd, &huge, 8) < 0)
        return -1;
    drain_until_eof(fd);
    return 0;
}

/* Answers the handshake's PING with the wrong nonce. */
static int script_wrong_nonce(int fd)
{
    uint8_t b[10];
    if (read_full(fd, b, sizeof b) < 0)
        return -1;
    b[6] ^= 0xFF;
    if (write_full(fd, b + 6, 4) < 0)
        return -1;
    drain_until_eof(fd);
    return 0;
}

/* Accepts and never answers. */
static int script_silent(int fd)
{
    drain_until_eof(fd);
    return 0;
}

/* Reads one frame header of `op` with a key list and skips the keys. */
static int read_key_list(int fd, uint8_t op)
{
    uint8_t b[9];
    if (read_full(fd, b, 9) < 0 || b[0] != op)
        return -1;
    uint64_t n = rdzv__ld64(b + 1), klen;
    for (uint64_t i = 0; i < n; i++) {
        char key[256];
        if (read_full(fd, &klen, 8) < 0 || klen > sizeof key || read_full(fd, key, klen) < 0)
            return -1;
    }
    return 0;
}

/*
 * A WAIT that is never satisfied; on CANCEL_WAIT the store answers STOP_WAITING and then
 * WAIT_CANCELED, as it does when the keys appear just before the cancellation. A PING follows.
 */
static int script_cancel_race(int fd)
{
    uint8_t op;
    uint8_t ping[5];
    if (fake_handshake(fd) < 0 || read_key_list(fd, RDZV_M_WAIT) < 0)
        return -1;
    if (read_full(fd, &op, 1) < 0 || op != RDZV_M_CANCEL_WAIT)
        return -2;
    if (write_full(fd, "\x00\x01", 2) < 0)
        return -1;
    if (read_full(fd, ping, 5) < 0 || ping[0] != RDZV_M_PING || write_full(fd, ping + 1, 4) < 0)
        return -3;
    drain_until_eof(fd);
    return 0;
}

/* Reads exactly the `n` bytes at `want` from the client. */
static int expect_request(int fd, const char *want, size_t n)
{
    char got[256];
    if (n > sizeof got || read_full(fd, got, n) < 0)
        return -1;
    return memcmp(got, want, n) == 0 ? 0 : -1;
}

/* A literal request: the string's bytes without its terminating NUL. */
#define REQ(s) s, sizeof(s) - 1

/*
 * The exact bytes of a prefixed client's requests (see test_request_bytes), each answered as a
 * store would. Keys go out as one string: "p/" followed by the caller's key.
 */
static int script_request_bytes(int fd)
{
    if (fake_handshake(fd) < 0)
        return -1;
    /* SET "k" = "v" */
    if (expect_request(fd, REQ("\x01\x03\0\0\0\0\0\0\0p/k\x01\0\0\0\0\0\0\0v")) < 0)
        return -2;
    /* ADD "n" -2, answered 40 */
    if (expect_request(fd, REQ("\x04\x03\0\0\0\0\0\0\0p/n\xfe\xff\xff\xff\xff\xff\xff\xff")) < 0 ||
        write_full(fd, "\x28\0\0\0\0\0\0\0", 8) < 0)
        return -3;
    /* GET "k": CHECK of one key and GET in one write, answered READY and "v" */
    if (expect_request(fd, REQ("\x05\x01\0\0\0\0\0\0\0\x03\0\0\0\0\0\0\0p/k"
                               "\x03\x03\0\0\0\0\0\0\0p/k")) < 0 ||
        write_full(fd, "\0\x01\0\0\0\0\0\0\0v", 10) < 0)
        return -4;
    /* MULTI_SET "a" = "1", "b" = "" */
    if (expect_request(fd, REQ("\x0b\x02\0\0\0\0\0\0\0\x03\0\0\0\0\0\0\0p/a\x01\0\0\0\0\0\0\0"
                               "1\x03\0\0\0\0\0\0\0p/b\0\0\0\0\0\0\0\0")) < 0)
        return -5;
    /* COMPARE_SET "k" from "v" to "w", answered "w" */
    if (expect_request(fd, REQ("\x02\x03\0\0\0\0\0\0\0p/k\x01\0\0\0\0\0\0\0v"
                               "\x01\0\0\0\0\0\0\0w")) < 0 ||
        write_full(fd, "\x01\0\0\0\0\0\0\0w", 9) < 0)
        return -6;
    /* DELETE_KEY "k", answered 1; GETNUMKEYS, answered 3 */
    if (expect_request(fd, REQ("\x08\x03\0\0\0\0\0\0\0p/k")) < 0 ||
        write_full(fd, "\x01\0\0\0\0\0\0\0", 8) < 0)
        return -7;
    if (expect_request(fd, REQ("\x07")) < 0 || write_full(fd, "\x03\0\0\0\0\0\0\0", 8) < 0)
        return -8;
    drain_until_eof(fd);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Options and arguments                                                                       */
/* ------------------------------------------------------------------------------------------ */

START_TEST(test_options_defaults)
{
    rdzv_client_options o;
    memset(&o, 0x5A, sizeof o);
    rdzv_client_options_init(&o);
    ck_assert_int_eq(o.connect_timeout_ms, 60000);
    ck_assert_int_eq(o.timeout_ms, 300000);
    ck_assert_int_eq(o.backoff_initial_ms, 10);
    ck_assert_int_eq(o.backoff_max_ms, 1000);
    ck_assert_ptr_null(o.prefix);
    ck_assert_int_eq(o.refused_timeout_ms, -1);
    ck_assert_int_eq(o.handshake_timeout_ms, 5000);
}
END_TEST

START_TEST(test_invalid_arguments)
{
    rdzv_client *c = client();
    ck_assert_str_eq(rdzv_client_last_error(c), "");
    rdzv_client *none = NULL;
    void *v = (void *)0x1;
    size_t n = 7;
    int64_t i = 7;
    const char *keys[2] = {"a", NULL};
    const void *vals[2] = {"x", "y"};
    size_t lens[2] = {1, 1};
    char *js = (char *)0x1;

    ck_assert_int_eq(rdzv_client_connect(NULL, port, NULL, &none), -EINVAL);
    ck_assert_int_eq(rdzv_client_connect("127.0.0.1", 0, NULL, &none), -EINVAL);
    ck_assert_int_eq(rdzv_client_connect("127.0.0.1", 70000, NULL, &none), -EINVAL);
    ck_assert_int_eq(rdzv_client_connect("127.0.0.1", port, NULL, NULL), -EINVAL);
    ck_assert_str_ne(rdzv_client_last_error(NULL), "");
    ck_assert_ptr_null(none);

    ck_assert_int_eq(rdzv_set(NULL, "k", "v", 1), -EINVAL);
    ck_assert_int_eq(rdzv_set(c, NULL, "v", 1), -EINVAL);
    ck_assert_int_eq(rdzv_set(c, "k", NULL, 1), -EINVAL);
    ck_assert_int_eq(rdzv_get(NULL, "k", &v, &n), -EINVAL);
    ck_assert_int_eq(rdzv_get(c, NULL, &v, &n), -EINVAL);
    ck_assert_int_eq(rdzv_get(c, "k", NULL, &n), -EINVAL);
    ck_assert_int_eq(rdzv_get(c, "k", &v, NULL), -EINVAL);
    ck_assert_int_eq(rdzv_add(NULL, "k", 1, &i), -EINVAL);
    ck_assert_int_eq(rdzv_add(c, NULL, 1, &i), -EINVAL);
    ck_assert_int_eq(rdzv_add(c, "k", 1, NULL), -EINVAL);
    ck_assert_int_eq(rdzv_compare_set(NULL, "k", "", 0, "d", 1, &v, &n), -EINVAL);
    ck_assert_int_eq(rdzv_compare_set(c, NULL, "", 0, "d", 1, &v, &n), -EINVAL);
    ck_assert_int_eq(rdzv_compare_set(c, "k", NULL, 1, "d", 1, &v, &n), -EINVAL);
    ck_assert_int_eq(rdzv_compare_set(c, "k", "", 0, NULL, 1, &v, &n), -EINVAL);
    ck_assert_int_eq(rdzv_compare_set(c, "k", "", 0, "d", 1, NULL, &n), -EINVAL);
    ck_assert_int_eq(rdzv_check(NULL, keys, 1), -EINVAL);
    ck_assert_int_eq(rdzv_check(c, NULL, 1), -EINVAL);
    ck_assert_int_eq(rdzv_check(c, keys, 2), -EINVAL);
    ck_assert_int_eq(rdzv_wait(NULL, keys, 1, 10), -EINVAL);
    ck_assert_int_eq(rdzv_wait(c, keys, 2, 10), -EINVAL);
    ck_assert_int_eq(rdzv_delete(NULL, "k"), -EINVAL);
    ck_assert_int_eq(rdzv_delete(c, NULL), -EINVAL);
    ck_assert_int_eq(rdzv_num_keys(NULL, &i), -EINVAL);
    ck_assert_int_eq(rdzv_num_keys(c, NULL), -EINVAL);
    ck_assert_int_eq(rdzv_append(NULL, "k", "v", 1), -EINVAL);
    ck_assert_int_eq(rdzv_append(c, NULL, "v", 1), -EINVAL);
    ck_assert_int_eq(rdzv_multi_get(NULL, keys, 1, &v, &n), -EINVAL);
    ck_assert_int_eq(rdzv_multi_get(c, keys, 2, &v, &n), -EINVAL);
    ck_assert_int_eq(rdzv_multi_get(c, keys, 1, NULL, &n), -EINVAL);
    ck_assert_int_eq(rdzv_multi_set(NULL, keys, vals, lens, 1), -EINVAL);
    ck_assert_int_eq(rdzv_multi_set(c, keys, vals, lens, 2), -EINVAL);
    ck_assert_int_eq(rdzv_multi_set(c, keys, NULL, lens, 1), -EINVAL);
    ck_assert_int_eq(rdzv_ping(NULL), -EINVAL);
    ck_assert_int_eq(rdzv_status(NULL, &js), -EINVAL);
    ck_assert_int_eq(rdzv_status(c, NULL), -EINVAL);
    ck_assert_int_eq(rdzv_barrier(NULL, "b", 1, 10), -EINVAL);
    ck_assert_int_eq(rdzv_barrier(c, NULL, 1, 10), -EINVAL);
    ck_assert_int_eq(rdzv_barrier(c, "b", 0, 10), -EINVAL);
    ck_assert_int_eq(rdzv_barrier(c, "b", -3, 10), -EINVAL);

    /* Out-parameters are untouched by failures, and the client is still fine. */
    ck_assert_ptr_eq(v, (void *)0x1);
    ck_assert_uint_eq(n, 7);
    ck_assert_int_eq(i, 7);
    ck_assert_ptr_nonnull(strstr(rdzv_client_last_error(c), "barrier: invalid argument"));
    ck_assert_int_eq(rdzv_ping(c), 0);

    rdzv_client_close(NULL);
    rdzv_client_close(c);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Operations against the real server                                                          */
/* ------------------------------------------------------------------------------------------ */

START_TEST(test_set_get)
{
    rdzv_client *c = client();
    set_str(c, "k", "hello");
    expect_value(c, "k", "hello");
    set_str(c, "k", "again");
    expect_value(c, "k", "again");

    /* Binary values with NUL bytes, and the empty value. */
    const uint8_t bin[5] = {0, 1, 0, 255, 0};
    ck_assert_int_eq(rdzv_set(c, "bin", bin, sizeof bin), 0);
    void *v = NULL;
    size_t n = 0;
    ck_assert_int_eq(rdzv_get(c, "bin", &v, &n), 0);
    ck_assert_uint_eq(n, sizeof bin);
    ck_assert_mem_eq(v, bin, n);
    rdzv_free(v);
    ck_assert_int_eq(rdzv_set(c, "empty", NULL, 0), 0);
    expect_value(c, "empty", "");

    /* A value larger than every internal buffer. */
    size_t big = 4u << 20;
    uint8_t *src = malloc(big);
    ck_assert_ptr_nonnull(src);
    for (size_t j = 0; j < big; j++)
        src[j] = (uint8_t)(j * 131 + 7);
    ck_assert_int_eq(rdzv_set(c, "big", src, big), 0);
    ck_assert_int_eq(rdzv_get(c, "big", &v, &n), 0);
    ck_assert_uint_eq(n, big);
    ck_assert_int_eq(memcmp(v, src, big), 0);
    rdzv_free(v);
    free(src);

    /* A second client sees what the first stored. */
    rdzv_client *d = client();
    expect_value(d, "k", "again");
    rdzv_client_close(d);
    rdzv_client_close(c);
}
END_TEST

struct setter_arg {
    const char *key;
    const char *value;
    int rc;
};

/* Waits until the test's client is parked on the server, then sets the key it waits for. */
static void *setter_main(void *p)
{
    struct setter_arg *a = p;
    await_waiters(1);
    rdzv_client *c = NULL;
    a->rc = rdzv_client_connect("127.0.0.1", port, NULL, &c);
    if (a->rc == 0)
        a->rc = rdzv_set(c, a->key, a->value, strlen(a->value));
    rdzv_client_close(c);
    return NULL;
}

START_TEST(test_get_waits_for_key)
{
    rdzv_client *c = client();
    struct setter_arg a = {.key = "late", .value = "arrived", .rc = -1};
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, setter_main, &a), 0);
    expect_value(c, "late", "arrived");
    pthread_join(t, NULL);
    ck_assert_int_eq(a.rc, 0);
    rdzv_client_close(c);
}
END_TEST

START_TEST(test_get_timeout_keeps_client)
{
    rdzv_client *c = client_with(NULL, 200);
    void *v = (void *)0x1;
    size_t n = 9;
    double t0 = mono_now_s();
    ck_assert_int_eq(rdzv_get(c, "missing", &v, &n), -ETIMEDOUT);
    double dt = mono_now_s() - t0;
    ck_assert_msg(dt >= 0.19 && dt < 3.0, "get took %.3f s", dt);
    ck_assert_ptr_eq(v, (void *)0x1);
    ck_assert_uint_eq(n, 9);
    ck_assert_ptr_nonnull(strstr(rdzv_client_last_error(c), "missing"));

    /* The wait was cancelled on the server; the connection is in step and usable. */
    await_waiters(0);
    ck_assert_int_eq(rdzv_ping(c), 0);
    set_str(c, "missing", "now here");
    expect_value(c, "missing", "now here");
    rdzv_client_close(c);
}
END_TEST

START_TEST(test_wait)
{
    rdzv_client *c = client();
    const char *keys[3] = {"w1", "w2", "w3"};
    set_str(c, "w1", "1");
    set_str(c, "w2", "2");
    set_str(c, "w3", "3");
    ck_assert_int_eq(rdzv_wait(c, keys, 3, 1000), 0);
    ck_assert_int_eq(rdzv_wait(c, keys, 0, 1000), 0);

    /* One missing key: time out, then the client is still usable, repeatedly. */
    const char *more[2] = {"w1", "w4"};
    for (int round = 0; round < 3; round++) {
        double t0 = mono_now_s();
        ck_assert_int_eq(rdzv_wait(c, more, 2, 100), -ETIMEDOUT);
        ck_assert(mono_now_s() - t0 >= 0.09);
        ck_assert_int_eq(rdzv_ping(c), 0);
    }
    /* A negative timeout takes the client's. */
    rdzv_client *short_c = client_with(NULL, 100);
    ck_assert_int_eq(rdzv_wait(short_c, more, 2, -1), -ETIMEDOUT);
    ck_assert_int_eq(rdzv_ping(short_c), 0);
    rdzv_client_close(short_c);

    /* Released by another client. */
    struct setter_arg a = {.key = "w4", .value = "4", .rc = -1};
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, setter_main, &a), 0);
    ck_assert_int_eq(rdzv_wait(c, more, 2, 10000), 0);
    pthread_join(t, NULL);
    ck_assert_int_eq(a.rc, 0);
    ck_assert_int_eq(rdzv_check(c, more, 2), 1);
    rdzv_client_close(c);
}
END_TEST

START_TEST(test_add)
{
    rdzv_client *c = client();
    int64_t r = 0;
    ck_assert_int_eq(rdzv_add(c, "n", 5, &r), 0);
    ck_assert_int_eq(r, 5);
    ck_assert_int_eq(rdzv_add(c, "n", -12, &r), 0);
    ck_assert_int_eq(r, -7);
    ck_assert_int_eq(rdzv_add(c, "n", 0, &r), 0);
    ck_assert_int_eq(r, -7);
    expect_value(c, "n", "-7");
    ck_assert_int_eq(rdzv_add(c, "big", INT64_MAX - 1, &r), 0);
    ck_assert_int_eq(rdzv_add(c, "big", 1, &r), 0);
    ck_assert(r == INT64_MAX);

    /* ADD on a value that is not a number: the server drops the connection. */
    set_str(c, "word", "abc");
    r = 42;
    ck_assert_int_eq(rdzv_add(c, "word", 1, &r), -ECONNRESET);
    ck_assert_int_eq(r, 42);
    ck_assert_int_eq(rdzv_ping(c), -ENOTCONN);
    ck_assert_ptr_nonnull(strstr(rdzv_client_last_error(c), "unusable"));
    rdzv_client_close(c);
}
END_TEST

/* Compare-and-set with a string expected and desired value; checks the answer. */
static void cas(rdzv_client *c, const char *key, const char *expected, const char *desired,
                const char *answer)
{
    void *v = NULL;
    size_t n = 0;
    int rc = rdzv_compare_set(c, key, expected, strlen(expected), desired, strlen(desired), &v, &n);
    ck_assert_msg(rc == 0, "compare_set: %d %s", rc, rdzv_client_last_error(c));
    ck_assert_uint_eq(n, strlen(answer));
    ck_assert_mem_eq(v, answer, n);
    ck_assert_int_eq(((char *)v)[n], 0);
    rdzv_free(v);
}

START_TEST(test_dup_and_local_addr)
{
    rdzv_client *a = client_with("job/", 2000);
    rdzv_client *b = NULL;
    char host[64];

    /* The copy is a second connection with the same prefix. */
    ck_assert_int_eq(rdzv_client_dup(a, &b), 0);
    set_str(a, "k", "v");
    expect_value(b, "k", "v");
    rdzv_client_close(a);
    expect_value(b, "k", "v");

    ck_assert_int_eq(rdzv_client_local_addr(b, host, sizeof host), 0);
    ck_assert_str_eq(host, "127.0.0.1");
    ck_assert_int_eq(rdzv_client_local_addr(b, host, 4), -ENOSPC);
    ck_assert_int_eq(rdzv_client_local_addr(NULL, host, sizeof host), -EINVAL);
    ck_assert_int_eq(rdzv_client_dup(b, NULL), -EINVAL);
    rdzv_client_close(b);
}
END_TEST

START_TEST(test_compare_set)
{
    rdzv_client *c = client();
    const char *key[1] = {"cas"};

    /* Missing key, non-empty expected: answers `expected`, stores nothing. */
    cas(c, "cas", "old", "new", "old");
    ck_assert_int_eq(rdzv_check(c, key, 1), 0);
    /* Missing key, empty expected: stores `desired`. */
    cas(c, "cas", "", "first", "first");
    expect_value(c, "cas", "first");
    /* Match: stores and answers the new value. */
    cas(c, "cas", "first", "second", "second");
    expect_value(c, "cas", "second");
    /* Mismatch: answers the current value, stores nothing. */
    cas(c, "cas", "first", "third", "second");
    expect_value(c, "cas", "second");
    /* Present key, empty expected: a mismatch like any other. */
    cas(c, "cas", "", "fourth", "second");
    rdzv_client_close(c);
}
END_TEST

START_TEST(test_check_delete_num_keys)
{
    rdzv_client *c = client();
    const char *keys[2] = {"c1", "c2"};
    int64_t count = -1;
    ck_assert_int_eq(rdzv_num_keys(c, &count), 0);
    ck_assert_int_eq(count, 0);
    ck_assert_int_eq(rdzv_check(c, keys, 2), 0);
    ck_assert_int_eq(rdzv_check(c, keys, 0), 1);
    set_str(c, "c1", "x");
    ck_assert_int_eq(rdzv_check(c, keys, 1), 1);
    ck_assert_int_eq(rdzv_check(c, keys, 2), 0);
    set_str(c, "c2", "y");
    ck_assert_int_eq(rdzv_check(c, keys, 2), 1);
    ck_assert_int_eq(rdzv_num_keys(c, &count), 0);
    ck_assert_int_eq(count, 2);

    ck_assert_int_eq(rdzv_delete(c, "c1"), 1);
    ck_assert_int_eq(rdzv_delete(c, "c1"), 0);
    ck_assert_int_eq(rdzv_check(c, keys, 2), 0);
    ck_assert_int_eq(rdzv_num_keys(c, &count), 0);
    ck_assert_int_eq(count, 1);
    rdzv_client_close(c);
}
END_TEST

START_TEST(test_append)
{
    rdzv_client *c = client();
    ck_assert_int_eq(rdzv_append(c, "log", "ab", 2), 0);
    ck_assert_int_eq(rdzv_append(c, "log", "", 0), 0);
    ck_assert_int_eq(rdzv_append(c, "log", "cd", 2), 0);
    expect_value(c, "log", "abcd");
    rdzv_client_close(c);
}
END_TEST

START_TEST(test_multi)
{
    rdzv_client *c = client();
    const char *keys[3] = {"m1", "m2", "m3"};
    const void *vals[3] = {"one", "", "three"};
    size_t lens[3] = {3, 0, 5};
    ck_assert_int_eq(rdzv_multi_set(c, keys, vals, lens, 3), 0);
    ck_assert_int_eq(rdzv_multi_set(c, keys, vals, lens, 0), 0);
    expect_value(c, "m3", "three");

    const char *get[4] = {"m3", "absent", "m1", "m2"};
    void *out[4] = {0};
    size_t n[4] = {0};
    ck_assert_int_eq(rdzv_multi_get(c, get, 4, out, n), 0);
    ck_assert_uint_eq(n[0], 5);
    ck_assert_str_eq(out[0], "three");
    ck_assert_uint_eq(n[1], 0);
    ck_assert_str_eq(out[1], "");
    ck_assert_uint_eq(n[2], 3);
    ck_assert_str_eq(out[2], "one");
    ck_assert_uint_eq(n[3], 0);
    for (int i = 0; i < 4; i++)
        rdzv_free(out[i]);
    ck_assert_int_eq(rdzv_multi_get(c, get, 0, NULL, NULL), 0);
    rdzv_client_close(c);
}
END_TEST

START_TEST(test_ping_status)
{
    rdzv_client *c = client();
    ck_assert_int_eq(rdzv_ping(c), 0);
    set_str(c, "s1", "v");
    set_str(c, "s2", "v");
    char *js = NULL;
    ck_assert_int_eq(rdzv_status(c, &js), 0);
    ck_assert_ptr_nonnull(js);
    json_error_t e;
    json_t *o = json_loads(js, 0, &e);
    ck_assert_msg(o != NULL, "status is not JSON (%s): %s", e.text, js);
    ck_assert(json_is_object(o));
    ck_assert_int_eq(json_integer_value(json_object_get(o, "keys")), 2);
    ck_assert_int_ge(json_integer_value(json_object_get(o, "connections")), 1);
    ck_assert(json_is_object(json_object_get(o, "ops")));
    ck_assert_int_ge(json_integer_value(json_object_get(json_object_get(o, "ops"), "set")), 2);
    json_decref(o);
    rdzv_free(js);
    ck_assert_int_eq(rdzv_ping(c), 0);
    rdzv_client_close(c);
}
END_TEST

START_TEST(test_prefix_isolation)
{
    rdzv_client *a = client_with("jobA/", 2000);
    rdzv_client *b = client_with("jobB/", 2000);
    rdzv_client *plain = client_with("", 2000);
    int64_t r;

    /*
     * SET, APPEND and MULTI_SET have no reply, so another connection sees them only once the
     * writer has made a round trip; the reads through `a` and `b` here are that round trip.
     */
    set_str(a, "k", "from a");
    set_str(b, "k", "from b");
    expect_value(a, "k", "from a");
    expect_value(b, "k", "from b");
    expect_value(plain, "jobA/k", "from a");
    expect_value(plain, "jobB/k", "from b");
    const char *bare[1] = {"k"};
    ck_assert_int_eq(rdzv_check(plain, bare, 1), 0);

    /* Every keyed operation goes through the prefix. */
    ck_assert_int_eq(rdzv_add(a, "n", 3, &r), 0);
    expect_value(plain, "jobA/n", "3");
    ck_assert_int_eq(rdzv_append(a, "k", "!", 1), 0);
    ck_assert_int_eq(rdzv_ping(a), 0); /* SET-like requests have no reply: make sure it landed */
    expect_value(plain, "jobA/k", "from a!");
    void *v;
    size_t n;
    ck_assert_int_eq(rdzv_compare_set(a, "cas", "", 0, "c", 1, &v, &n), 0);
    rdzv_free(v);
    expect_value(plain, "jobA/cas", "c");
    const char *mk[2] = {"m1", "m2"};
    const void *mv[2] = {"1", "2"};
    size_t ml[2] = {1, 1};
    ck_assert_int_eq(rdzv_multi_set(b, mk, mv, ml, 2), 0);
    ck_assert_int_eq(rdzv_ping(b), 0);
    expect_value(plain, "jobB/m2", "2");
    const char *full[2] = {"jobB/m1", "jobB/m2"};
    ck_assert_int_eq(rdzv_check(plain, full, 2), 1);
    ck_assert_int_eq(rdzv_check(b, mk, 2), 1);
    ck_assert_int_eq(rdzv_check(a, mk, 2), 0);
    ck_assert_int_eq(rdzv_wait(b, mk, 2, 1000), 0);
    ck_assert_int_eq(rdzv_wait(a, mk, 2, 50), -ETIMEDOUT);
    void *out[2];
    size_t len[2];
    ck_assert_int_eq(rdzv_multi_get(b, mk, 2, out, len), 0);
    ck_assert_str_eq(out[0], "1");
    ck_assert_str_eq(out[1], "2");
    rdzv_free(out[0]);
    rdzv_free(out[1]);
    ck_assert_int_eq(rdzv_multi_get(a, mk, 2, out, len), 0);
    ck_assert_uint_eq(len[0] + len[1], 0);
    rdzv_free(out[0]);
    rdzv_free(out[1]);
    ck_assert_int_eq(rdzv_delete(a, "m1"), 0);
    ck_assert_int_eq(rdzv_delete(b, "m1"), 1);

    /* Barrier keys live under the prefix too. */
    ck_assert_int_eq(rdzv_barrier(a, "bar", 1, 1000), 0);
    const char *bk[2] = {"jobA/bar/state", "jobA/bar/done/0"};
    ck_assert_int_eq(rdzv_check(plain, bk, 2), 1);

    rdzv_client_close(a);
    rdzv_client_close(b);
    rdzv_client_close(plain);
}
END_TEST

/*
 * Checks that barrier `name` is between rounds, `gen` of them completed: its state "<epoch>
 * <world> <base>" and the epoch's count of arrivals (the low 40 bits of count/<epoch>/<world>)
 * say that base + count / world rounds completed and nobody waits (count a multiple of world).
 */
static void expect_round(rdzv_client *c, const char *name, int64_t gen)
{
    char key[64];
    snprintf(key, sizeof key, "%s/state", name);
    const char *k = key;
    if (gen == 0 && rdzv_check(c, &k, 1) == 0)
        return;
    void *v = NULL;
    size_t n = 0;
    ck_assert_int_eq(rdzv_get(c, key, &v, &n), 0);
    int64_t e = -1, w = -1, base = -1, cnt = -1;
    ck_assert_msg(sscanf(v, "%" SCNd64 " %" SCNd64 " %" SCNd64, &e, &w, &base) == 3 && w > 0,
                  "state '%s'", (char *)v);
    snprintf(key, sizeof key, "%s/count/%" PRId64 "/%" PRId64, name, e, w);
    ck_assert_int_eq(rdzv_add(c, key, 0, &cnt), 0);
    cnt &= (INT64_C(1) << 40) - 1;
    ck_assert_msg(base + cnt / w == gen && cnt % w == 0,
                  "barrier %s: state '%s', %" PRId64 " arrivals: expected round %" PRId64
                  " and nobody waiting",
                  name, (char *)v, cnt, gen);
    rdzv_free(v);
}

/* rdzv_list_keys(): every key without a prefix; with one, the keys under it, prefix cut off. */
START_TEST(test_list_keys)
{
    rdzv_client *plain = client();
    rdzv_client *a = client_with("jobA/", 5000);
    set_str(plain, "top", "1");
    set_str(a, "x", "2");
    set_str(a, "y/z", "3");
    char **keys = NULL;
    size_t n = 0;
    ck_assert_int_eq(rdzv_list_keys(a, &keys, &n), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_ptr_null(keys[2]);
    bool x = strcmp(keys[0], "x") == 0 || strcmp(keys[1], "x") == 0;
    bool yz = strcmp(keys[0], "y/z") == 0 || strcmp(keys[1], "y/z") == 0;
    ck_assert(x && yz);
    rdzv_free(keys);
    ck_assert_int_eq(rdzv_list_keys(plain, &keys, &n), 0);
    ck_assert_uint_eq(n, 3);
    rdzv_free(keys);
    ck_assert_int_eq(rdzv_list_keys(plain, NULL, &n), -EINVAL);
    rdzv_client_close(a);
    rdzv_client_close(plain);
}
END_TEST

/* One rank of the multi-process barrier test; returns its exit status. */
static int barrier_rank(int rounds, int world)
{
    rdzv_client_options o;
    rdzv_client_options_init(&o);
    o.prefix = "job/";
    o.timeout_ms = 20000;
    rdzv_client *c = NULL;
    if (rdzv_client_connect("127.0.0.1", port, &o, &c) != 0)
        return 10;
    for (int r = 0; r < rounds; r++) {
        char key[32];
        int64_t v;
        snprintf(key, sizeof key, "round/%d", r);
        if (rdzv_add(c, key, 1, &v) != 0)
            return 11;
        if (rdzv_barrier(c, "bar", world, 20000) != 0)
            return 12;
        /* Nobody leaves a round before everyone has entered it. */
        if (rdzv_add(c, key, 0, &v) != 0)
            return 13;
        if (v != world)
            return 14;
    }
    rdzv_client_close(c);
    return 0;
}

START_TEST(test_barrier_reuse_multiprocess)
{
    enum { WORLD = 4, ROUNDS = 3 };
    pid_t pids[WORLD];
    for (int i = 0; i < WORLD; i++) {
        pids[i] = fork();
        ck_assert_int_ge(pids[i], 0);
        if (pids[i] == 0)
            _exit(barrier_rank(ROUNDS, WORLD));
    }
    for (int i = 0; i < WORLD; i++) {
        int st = 0;
        ck_assert_int_eq(waitpid(pids[i], &st, 0), pids[i]);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d: status %d", i, st);
    }

    /* Finished generations were cleaned up; the last one remains for late readers. */
    rdzv_client *c = client_with("job/", 2000);
    expect_round(c, "bar", ROUNDS);
    const char *g0[1] = {"bar/done/0"}, *g1[1] = {"bar/done/1"}, *g2[1] = {"bar/done/2"};
    ck_assert_int_eq(rdzv_check(c, g0, 1), 0);
    ck_assert_int_eq(rdzv_check(c, g1, 1), 0);
    ck_assert_int_eq(rdzv_check(c, g2, 1), 1);
    rdzv_client_close(c);
}
END_TEST

START_TEST(test_barrier_single_and_timeout)
{
    rdzv_client *c = client_with(NULL, 5000);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(rdzv_barrier(c, "solo", 1, 1000), 0);
    const char *g[2] = {"solo/done/1", "solo/done/2"};
    ck_assert_int_eq(rdzv_check(c, g, 1), 0);
    ck_assert_int_eq(rdzv_check(c, g + 1, 1), 1);

    /* Alone in a barrier for two: times out and stays usable. */
    double t0 = mono_now_s();
    ck_assert_int_eq(rdzv_barrier(c, "pair", 2, 150), -ETIMEDOUT);
    ck_assert(mono_now_s() - t0 >= 0.14);
    ck_assert_ptr_nonnull(strstr(rdzv_client_last_error(c), "pair"));
    ck_assert_int_eq(rdzv_ping(c), 0);
    rdzv_client_close(c);
}
END_TEST

/*
 * Issue 11, item 1: a caller that retries a barrier after timing out, alone, never gets
 * through, however often it retries (before, its second try completed a round of two).
 */
START_TEST(test_barrier_retry_alone)
{
    rdzv_client *c = client_with(NULL, 5000);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(rdzv_barrier(c, "retry", 2, 100), -ETIMEDOUT);
    ck_assert_ptr_nonnull(strstr(rdzv_client_last_error(c), "withdrawn"));
    expect_round(c, "retry", 0);
    rdzv_client_close(c);
}
END_TEST

/* The retrier of test_barrier_retry_then_partner: tries until it passes, counting timeouts. */
static int retrier(void)
{
    rdzv_client *c = NULL;
    rdzv_client_options o;
    rdzv_client_options_init(&o);
    o.timeout_ms = 5000;
    if (rdzv_client_connect("127.0.0.1", port, &o, &c) != 0)
        return 10;
    int timeouts = 0, rc;
    while ((rc = rdzv_barrier(c, "r", 2, 50)) == -ETIMEDOUT)
        if (++timeouts == 3 && rdzv_set(c, "tried3", "1", 1) != 0)
            return 11;
    rdzv_client_close(c);
    return rc == 0 && timeouts >= 3 ? 0 : 12;
}

/*
 * A retry loop and a partner that arrives after three of its timeouts: they pass together, in
 * the barrier's first round; the timed-out tries completed nothing.
 */
START_TEST(test_barrier_retry_then_partner)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        _exit(retrier());
    rdzv_client *c = client_with(NULL, 10000);
    void *v;
    size_t n;
    ck_assert_int_eq(rdzv_get(c, "tried3", &v, &n), 0);
    rdzv_free(v);
    ck_assert_int_eq(rdzv_barrier(c, "r", 2, 10000), 0);
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "retrier: status %d", st);
    expect_round(c, "r", 1);
    rdzv_client_close(c);
}
END_TEST

/* A child that enters barrier `name` of `world` once and exits with 0 on success. */
static pid_t barrier_child(const char *name, int world, int timeout_ms)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        rdzv_client *c = NULL;
        rdzv_client_options o;
        rdzv_client_options_init(&o);
        o.timeout_ms = 10000;
        if (rdzv_client_connect("127.0.0.1", port, &o, &c) != 0)
            _exit(10);
        int rc = rdzv_barrier(c, name, world, timeout_ms);
        rdzv_client_close(c);
        _exit(rc == 0 ? 0 : rc == -ETIMEDOUT ? 3 : 4);
    }
    return pid;
}

static int child_status(pid_t pid)
{
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st), "child %d: status %d", (int)pid, st);
    return WEXITSTATUS(st);
}

/*
 * A name reused with another world size: after a barrier of three, a lone caller of a round of
 * two, and then one of a round of three, each time out (before, both passed at once); a caller
 * with another size than the round in progress fails with -EINVAL at once.
 */
START_TEST(test_barrier_world_size_change)
{
    pid_t p[3];
    for (int i = 0; i < 3; i++)
        p[i] = barrier_child("stage", 3, 10000);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(child_status(p[i]), 0);

    rdzv_client *c = client_with(NULL, 5000);
    ck_assert_int_eq(rdzv_barrier(c, "stage", 2, 100), -ETIMEDOUT);
    ck_assert_int_eq(rdzv_barrier(c, "stage", 3, 100), -ETIMEDOUT);
    expect_round(c, "stage", 1);

    /* A round of two in progress refuses a caller that asks for three, and leaves it usable. */
    pid_t waiting = barrier_child("stage", 2, 10000);
    await_waiters(1);
    ck_assert_int_eq(rdzv_barrier(c, "stage", 3, 1000), -EINVAL);
    ck_assert_ptr_nonnull(strstr(rdzv_client_last_error(c), "not 3"));
    ck_assert_int_eq(rdzv_barrier(c, "stage", 2, 1000), 0);
    ck_assert_int_eq(child_status(waiting), 0);
    expect_round(c, "stage", 2);
    rdzv_client_close(c);
}
END_TEST

/*
 * Late joiners: three callers of a barrier for two arrive together; two complete round 0 and
 * the third opens round 1, which a fourth, arriving once round 0 is done, completes.
 */
START_TEST(test_barrier_late_joiners)
{
    pid_t p[4];
    for (int i = 0; i < 3; i++)
        p[i] = barrier_child("late", 2, 10000);
    rdzv_client *c = client_with(NULL, 10000);
    void *v;
    size_t n;
    ck_assert_int_eq(rdzv_get(c, "late/done/0", &v, &n), 0);
    rdzv_free(v);
    p[3] = barrier_child("late", 2, 10000);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(child_status(p[i]), 0);
    expect_round(c, "late", 2);

    /* Eight callers of a barrier for four, all at once: two rounds, nobody left waiting. */
    pid_t q[8];
    for (int i = 0; i < 8; i++)
        q[i] = barrier_child("crowd", 4, 10000);
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(child_status(q[i]), 0);
    expect_round(c, "crowd", 2);
    rdzv_client_close(c);
}
END_TEST

/*
 * The epoch an arrival guesses in its first round trip (the client's last, or 0): a guess of an
 * epoch closed since, or of a count key no epoch uses (the world size differs), counts for
 * nothing, and the caller counts itself in the epoch under way.
 */
START_TEST(test_barrier_guess)
{
    rdzv_client *c = client_with(NULL, 5000);
    ck_assert_int_eq(rdzv_barrier(c, "g", 1, 1000), 0);
    /* The child closes epoch 0 (for one) and waits in epoch 1 (for two); c, guessing epoch 0,
     * adds to g/count/0/2 as the child did first, and completes the round with it. */
    pid_t p = barrier_child("g", 2, 10000);
    await_waiters(1);
    ck_assert_int_eq(rdzv_barrier(c, "g", 2, 1000), 0);
    ck_assert_int_eq(child_status(p), 0);
    expect_round(c, "g", 2);
    int64_t v = 0;
    ck_assert_int_eq(rdzv_add(c, "g/count/0/2", 0, &v), 0);
    ck_assert_int_eq(v, 2);

    /* A new client guesses epoch 0 for one, closed by now, and passes alone in epoch 2; c,
     * guessing epoch 1 with a world of one, passes alone after it. */
    rdzv_client *d = client_with(NULL, 5000);
    ck_assert_int_eq(rdzv_barrier(d, "g", 1, 1000), 0);
    expect_round(c, "g", 3);
    ck_assert_int_eq(rdzv_barrier(c, "g", 1, 1000), 0);
    expect_round(c, "g", 4);
    ck_assert_int_eq(rdzv_add(c, "g/count/0/1", 0, &v), 0);
    ck_assert_int_lt(v, 0);
    rdzv_client_close(d);
    rdzv_client_close(c);
}
END_TEST

enum { CHURN = 8, CHURN_ROUNDS = 6, CHURN_LATE_MS = 150, CHURN_MS = 40 };

/*
 * One caller of test_barrier_churn (`arg`: its number); returns 0 or the step that failed as
 * its thread's result. In round r, caller r % CHURN arrives late (after a WAIT for a key nobody
 * sets times out); the others time out and retry meanwhile.
 */
static void *churn_main(void *arg)
{
    unsigned me = (unsigned)(uintptr_t)arg, seed = me + 1;
    rdzv_client_options o;
    rdzv_client_options_init(&o);
    o.timeout_ms = 20000;
    rdzv_client *c = NULL;
    if (rdzv_client_connect("127.0.0.1", port, &o, &c) != 0)
        return (void *)10;
    intptr_t bad = 0;
    for (int r = 0; r < CHURN_ROUNDS && !bad; r++) {
        char key[32];
        int64_t v;
        const char *never = "churn_never";
        snprintf(key, sizeof key, "entered/%d", r);
        if ((unsigned)r % CHURN == me && rdzv_wait(c, &never, 1, CHURN_LATE_MS) != -ETIMEDOUT)
            bad = 11;
        if (!bad && rdzv_add(c, key, 1, &v) != 0)
            bad = 12;
        int rc = 0, ms;
        do
            ms = CHURN_MS + (int)(rand_r(&seed) % CHURN_MS);
        while (!bad && (rc = rdzv_barrier(c, "churn", CHURN, ms)) == -ETIMEDOUT);
        if (!bad && rc != 0)
            bad = 13;
        /* Nobody leaves a round before everyone has entered it, timeouts or not. */
        if (!bad && (rdzv_add(c, key, 0, &v) != 0 || v != CHURN))
            bad = 14;
    }
    rdzv_client_close(c);
    return (void *)bad;
}

/*
 * Callers whose waits time out after 40 to 80 ms and who retry at once, while one of them is
 * late: their withdrawals and new arrivals cross each other and the round's completion, and
 * still no round completes without all of its callers, nor leaves anyone behind.
 */
START_TEST(test_barrier_churn)
{
    pthread_t t[CHURN];
    for (int i = 0; i < CHURN; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, churn_main, (void *)(uintptr_t)i), 0);
    for (int i = 0; i < CHURN; i++) {
        void *bad = NULL;
        ck_assert_int_eq(pthread_join(t[i], &bad), 0);
        ck_assert_msg(bad == NULL, "caller %d failed at step %d", i, (int)(intptr_t)bad);
    }
    rdzv_client *c = client_with(NULL, 5000);
    expect_round(c, "churn", CHURN_ROUNDS);
    rdzv_client_close(c);
}
END_TEST

/* A caller killed while it waits stays counted: its round completes with one more caller. */
START_TEST(test_barrier_killed_caller)
{
    pid_t p = barrier_child("killed", 2, 10000);
    await_waiters(1);
    ck_assert_int_eq(kill(p, SIGKILL), 0);
    int st = 0;
    ck_assert_int_eq(waitpid(p, &st, 0), p);
    ck_assert(WIFSIGNALED(st));
    rdzv_client *c = client_with(NULL, 5000);
    ck_assert_int_eq(rdzv_barrier(c, "killed", 2, 1000), 0);
    expect_round(c, "killed", 1);
    rdzv_client_close(c);
}
END_TEST

/* A state key that holds no barrier state answers -EPROTO and leaves the client usable. */
START_TEST(test_barrier_state_by_hand)
{
    rdzv_client *c = client_with(NULL, 5000);
    set_str(c, "hand/state", "round two");
    ck_assert_int_eq(rdzv_barrier(c, "hand", 2, 100), -EPROTO);
    ck_assert_ptr_nonnull(strstr(rdzv_client_last_error(c), "changed by hand"));
    ck_assert_int_eq(rdzv_ping(c), 0);

    /* A count no barrier writes (2^62 and above): refused before any wait. */
    set_str(c, "hand/state", "0 2 0");
    set_str(c, "hand/count/0/2", "4611686018427387904");
    ck_assert_int_eq(rdzv_barrier(c, "hand", 2, 100), -EPROTO);
    ck_assert_ptr_nonnull(strstr(rdzv_client_last_error(c), "changed by hand"));
    ck_assert_int_eq(rdzv_ping(c), 0);
    rdzv_client_close(c);
}
END_TEST

/* The requests the server has served, by its status, leaving out STATUS itself. */
static int64_t requests_served(rdzv_client *c)
{
    char *js = NULL;
    ck_assert_int_eq(rdzv_status(c, &js), 0);
    json_t *o = json_loads(js, 0, NULL);
    ck_assert_ptr_nonnull(o);
    json_t *ops = json_object_get(o, "ops");
    int64_t sum = 0;
    for (void *it = json_object_iter(ops); it; it = json_object_iter_next(ops, it))
        if (strcmp(json_object_iter_key(it), "status") != 0)
            sum += json_integer_value(json_object_iter_value(it));
    json_decref(o);
    rdzv_free(js);
    return sum;
}

enum { CROWD = 64, CROWD_ROUNDS = 2 };

/* What the callers of test_barrier_requests share. */
typedef struct crowd {
    pthread_barrier_t connected, go;
    int rc[CROWD];
} crowd;

typedef struct crowd_caller {
    crowd *cr;
    int rank;
} crowd_caller;

/* One caller of test_barrier_requests: connects, waits for the go, passes the rounds. */
static void *crowd_main(void *arg)
{
    crowd_caller *me = arg;
    rdzv_client_options o;
    rdzv_client_options_init(&o);
    o.timeout_ms = 20000;
    rdzv_client *c = NULL;
    int rc = rdzv_client_connect("127.0.0.1", port, &o, &c);
    pthread_barrier_wait(&me->cr->connected);
    pthread_barrier_wait(&me->cr->go);
    for (int r = 0; r < CROWD_ROUNDS && rc == 0; r++)
        rc = rdzv_barrier(c, "crowd64", CROWD, 20000);
    me->cr->rc[me->rank] = rc;
    rdzv_client_close(c);
    return NULL;
}

/*
 * Issue 23: an arrival costs a constant number of requests, however many callers arrive at
 * once: 64 concurrent callers pass two rounds with at most three requests each per round
 * (read the state, ADD, WAIT; the completer's SET and DELETE instead of its WAIT, and the
 * creation of the state, are the few above), counted by the server.
 */
START_TEST(test_barrier_requests)
{
    crowd cr;
    crowd_caller who[CROWD];
    pthread_t t[CROWD];
    ck_assert_int_eq(pthread_barrier_init(&cr.connected, NULL, CROWD + 1), 0);
    ck_assert_int_eq(pthread_barrier_init(&cr.go, NULL, CROWD + 1), 0);
    for (int i = 0; i < CROWD; i++) {
        who[i] = (crowd_caller){&cr, i};
        cr.rc[i] = -1;
        ck_assert_int_eq(pthread_create(&t[i], NULL, crowd_main, &who[i]), 0);
    }
    pthread_barrier_wait(&cr.connected);
    rdzv_client *c = client_with(NULL, 10000);
    int64_t before = requests_served(c);
    pthread_barrier_wait(&cr.go);
    for (int i = 0; i < CROWD; i++)
        ck_assert_int_eq(pthread_join(t[i], NULL), 0);
    for (int i = 0; i < CROWD; i++)
        ck_assert_msg(cr.rc[i] == 0, "caller %d: %d", i, cr.rc[i]);
    int64_t used = requests_served(c) - before;
    fprintf(stderr, "barrier of %d callers: %" PRId64 " requests in %d rounds\n", CROWD, used,
            CROWD_ROUNDS);
    ck_assert_msg(used <= CROWD_ROUNDS * (3 * CROWD + 2), "%" PRId64 " requests", used);
    expect_round(c, "crowd64", CROWD_ROUNDS);
    rdzv_client_close(c);
    pthread_barrier_destroy(&cr.connected);
    pthread_barrier_destroy(&cr.go);
}
END_TEST

START_TEST(test_server_gone)
{
    rdzv_client *c = client();
    ck_assert_int_eq(rdzv_ping(c), 0);
    server_kill();
    ck_assert_int_eq(rdzv_ping(c), -ECONNRESET);
    ck_assert_int_eq(rdzv_ping(c), -ENOTCONN);
    ck_assert_int_eq(rdzv_set(c, "k", "v", 1), -ENOTCONN);
    rdzv_client_close(c);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Connecting                                                                                  */
/* ------------------------------------------------------------------------------------------ */

START_TEST(test_connect_refused_deadline)
{
    int p;
    int fd = refusing_socket(&p);
    rdzv_client_options o;
    rdzv_client_options_init(&o);
    o.connect_timeout_ms = 300;
    o.backoff_initial_ms = 5;
    o.backoff_max_ms = 40;
    rdzv_client *c = NULL;
    double t0 = mono_now_s();
    ck_assert_int_eq(rdzv_client_connect("127.0.0.1", p, &o, &c), -ETIMEDOUT);
    double dt = mono_now_s() - t0;
    ck_assert_msg(dt >= 0.29 && dt < 3.0, "connect gave up after %.3f s", dt);
    ck_assert_ptr_null(c);
    const char *e = rdzv_client_last_error(NULL);
    ck_assert_msg(strstr(e, "refused") && strstr(e, "attempts"), "last error: %s", e);
    close(fd);
}
END_TEST

struct connector_arg {
    int port;
    int rc;
};

static void *connector_main(void *p)
{
    struct connector_arg *a = p;
    rdzv_client_options o;
    rdzv_client_options_init(&o);
    o.connect_timeout_ms = 20000;
    rdzv_client *c = NULL;
    a->rc = rdzv_client_connect("127.0.0.1", a->port, &o, &c);
    if (a->rc == 0)
        a->rc = rdzv_ping(c);
    rdzv_client_close(c);
    return NULL;
}

START_TEST(test_connect_retries_until_server_listens)
{
    struct connector_arg a = {.rc = 1};
    int fd = refusing_socket(&a.port);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, connector_main, &a), 0);
    /* Let the connector meet a few refusals before the server appears (not synchronisation). */
    struct timespec delay = {.tv_nsec = 150 * 1000000};
    nanosleep(&delay, NULL);
    rdzv_server_options so;
    rdzv_server_options_init(&so);
    so.listen_fd = fd;
    rdzv_server *s = NULL;
    ck_assert_int_eq(rdzv_server_start(&so, &s), 0);
    pthread_join(t, NULL);
    ck_assert_int_eq(a.rc, 0);
    rdzv_server_close(s);
}
END_TEST

/* What the on_close hook saw: the (host, port) pairs of closed connections. */
struct closed_log {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char host[8][64];
    int port[8];
    int n;
};

static void record_close(void *arg, const char *host, int port)
{
    struct closed_log *l = arg;
    pthread_mutex_lock(&l->mu);
    if (l->n < 8) {
        snprintf(l->host[l->n], sizeof(l->host[0]), "%s", host);
        l->port[l->n++] = port;
    }
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

/* The server's on_close hook names the connection a client reports with
 * rdzv_client_local_endpoint(), as soon as that client goes; on IPv4 and, where there is one,
 * on the IPv6 loopback. */
static void check_on_close(const char *bind_host, const char *want_host)
{
    struct closed_log l = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    rdzv_server_options so;
    rdzv_server_options_init(&so);
    so.host = bind_host;
    so.on_close = record_close;
    so.on_close_arg = &l;
    rdzv_server *s = NULL;
    if (rdzv_server_start(&so, &s) != 0) {
        ck_assert_str_eq(bind_host, "::1"); /* no IPv6 loopback here */
        return;
    }
    rdzv_client *c = NULL;
    ck_assert_int_eq(rdzv_client_connect(bind_host, rdzv_server_port(s), NULL, &c), 0);
    ck_assert_int_eq(rdzv_ping(c), 0);
    char host[64];
    int lport = 0;
    ck_assert_int_eq(rdzv_client_local_endpoint(c, host, sizeof host, &lport), 0);
    ck_assert_str_eq(host, want_host);
    ck_assert_int_gt(lport, 0);
    ck_assert_int_eq(rdzv_client_local_endpoint(c, host, sizeof host, NULL), -EINVAL);
    ck_assert_int_eq(rdzv_client_local_endpoint(c, host, 2, &lport), -ENOSPC);
    rdzv_client_close(c);

    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until); /* pthread_cond_timedwait's clock */
    until.tv_sec += 10;
    pthread_mutex_lock(&l.mu);
    while (l.n == 0 && pthread_cond_timedwait(&l.cv, &l.mu, &until) == 0)
        ;
    ck_assert_int_eq(l.n, 1);
    ck_assert_str_eq(l.host[0], want_host);
    ck_assert_int_eq(l.port[0], lport);
    pthread_mutex_unlock(&l.mu);
    rdzv_server_close(s);
}

START_TEST(test_on_close_hook)
{
    check_on_close("127.0.0.1", "127.0.0.1");
    check_on_close("::1", "::1");
}
END_TEST

START_TEST(test_connect_names_and_ipv6)
{
    /* "localhost" may list ::1 first, where nothing listens: the next address must be tried. */
    rdzv_client *c = NULL;
    ck_assert_int_eq(rdzv_client_connect("localhost", port, NULL, &c), 0);
    ck_assert_int_eq(rdzv_ping(c), 0);
    rdzv_client_close(c);

    rdzv_server_options so;
    rdzv_server_options_init(&so);
    so.host = "::1";
    rdzv_server *s6 = NULL;
    if (rdzv_server_start(&so, &s6) != 0)
        return; /* no IPv6 loopback here */
    ck_assert_int_eq(rdzv_client_connect("::1", rdzv_server_port(s6), NULL, &c), 0);
    set_str(c, "v6", "yes");
    expect_value(c, "v6", "yes");
    rdzv_client_close(c);
    rdzv_server_close(s6);
}
END_TEST

START_TEST(test_connect_unknown_host)
{
    rdzv_client_options o;
    rdzv_client_options_init(&o);
    o.connect_timeout_ms = 500;
    rdzv_client *c = NULL;
    /* Unresolvable, or a resolver that cannot be reached (then retried until the deadline). */
    int rc = rdzv_client_connect("no-such-host.invalid", 1234, &o, &c);
    ck_assert_msg(rc == -EHOSTUNREACH || rc == -ETIMEDOUT, "rc %d", rc);
    ck_assert_ptr_null(c);
    ck_assert_ptr_nonnull(strstr(rdzv_client_last_error(NULL), "no-such-host.invalid"));
}
END_TEST

START_TEST(test_connect_not_a_store)
{
    rdzv_client_options o;
    rdzv_client_options_init(&o);
    o.connect_timeout_ms = 300;
    rdzv_client *c = NULL;

    struct fake f;
    fake_start(&f, script_wrong_nonce);
    ck_assert_int_eq(rdzv_client_connect("127.0.0.1", f.port, &o, &c), -EPROTO);
    ck_assert_int_eq(fake_join(&f), 0);
    ck_assert_ptr_null(c);

    fake_start(&f, script_silent);
    double t0 = mono_now_s();
    ck_assert_int_eq(rdzv_client_connect("127.0.0.1", f.port, &o, &c), -ETIMEDOUT);
    ck_assert(mono_now_s() - t0 >= 0.29);
    ck_assert_int_eq(fake_join(&f), 0);
    ck_assert_ptr_null(c);
    ck_assert_ptr_nonnull(strstr(rdzv_client_last_error(NULL), "handshake"));
}
END_TEST

/* A peer that accepts every connection and closes it at once, until `stop` is set. */
struct closer {
    int lfd, port;
    volatile int stop;
    int accepted;
    pthread_t thread;
};

static void *closer_main(void *arg)
{
    struct closer *k = arg;
    while (!k->stop) {
        int fd = accept(k->lfd, NULL, NULL);
        if (fd < 0)
            break;
        k->accepted++;
        close(fd);
    }
    return NULL;
}

/*
 * Issue 11, item 8: a port held by something that is not a store fails the connect within the
 * handshake bound, not the (long) connect timeout, with a sentence saying so: a listener that
 * never answers (nobody accepts: the kernel completes the connection), and one that closes
 * every connection at once.
 */
START_TEST(test_connect_handshake_bound)
{
    rdzv_client_options o;
    rdzv_client_options_init(&o);
    o.connect_timeout_ms = 60000;
    o.handshake_timeout_ms = 300;
    rdzv_client *c = NULL;

    int lport;
    int lfd = refusing_socket(&lport);
    ck_assert_int_eq(listen(lfd, 4), 0);
    double t0 = mono_now_s();
    ck_assert_int_eq(rdzv_client_connect("127.0.0.1", lport, &o, &c), -EPROTO);
    double t = mono_now_s() - t0;
    ck_assert_msg(t >= 0.29 && t < 5, "silent listener: failed after %.2f s", t);
    ck_assert_ptr_null(c);
    ck_assert_ptr_nonnull(strstr(rdzv_client_last_error(NULL), "did not answer the handshake"));
    ck_assert_ptr_nonnull(strstr(rdzv_client_last_error(NULL), "not a ddprun or PyTorch store"));
    close(lfd);

    struct closer k = {0};
    k.lfd = refusing_socket(&k.port);
    ck_assert_int_eq(listen(k.lfd, 16), 0);
    ck_assert_int_eq(pthread_create(&k.thread, NULL, closer_main, &k), 0);
    t0 = mono_now_s();
    ck_assert_int_eq(rdzv_client_connect("127.0.0.1", k.port, &o, &c), -EPROTO);
    t = mono_now_s() - t0;
    ck_assert_msg(t >= 0.29 && t < 5, "closing peer: failed after %.2f s", t);
    ck_assert_ptr_nonnull(strstr(rdzv_client_last_error(NULL), "closed"));
    ck_assert_ptr_nonnull(strstr(rdzv_client_last_error(NULL), "not a ddprun or PyTorch store"));
    k.stop = 1;
    shutdown(k.lfd, SHUT_RDWR); /* wakes the accept() */
    pthread_join(k.thread, NULL);
    close(k.lfd);
}
END_TEST

/* refused_timeout_ms = 0: a refused connection fails at once, not at the connect timeout. */
START_TEST(test_connect_refused_at_once)
{
    rdzv_client_options o;
    rdzv_client_options_init(&o);
    o.connect_timeout_ms = 60000;
    o.refused_timeout_ms = 0;
    int rport;
    int fd = refusing_socket(&rport);
    rdzv_client *c = NULL;
    double t0 = mono_now_s();
    ck_assert_int_eq(rdzv_client_connect("127.0.0.1", rport, &o, &c), -ECONNREFUSED);
    ck_assert(mono_now_s() - t0 < 2);
    ck_assert_ptr_nonnull(strstr(rdzv_client_last_error(NULL), "nothing listens there"));
    ck_assert_ptr_nonnull(strstr(rdzv_client_last_error(NULL), "1 attempt"));

    /* With 200 ms, refusals are retried that long, then fail the same way. */
    o.refused_timeout_ms = 200;
    t0 = mono_now_s();
    ck_assert_int_eq(rdzv_client_connect("127.0.0.1", rport, &o, &c), -ECONNREFUSED);
    double t = mono_now_s() - t0;
    ck_assert_msg(t >= 0.19 && t < 3, "refused for 200 ms: failed after %.2f s", t);
    close(fd);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Broken peers                                                                                */
/* ------------------------------------------------------------------------------------------ */

START_TEST(test_peer_closes_mid_reply)
{
    struct fake f;
    fake_start(&f, script_close_mid_reply);
    rdzv_client *c = fake_client(&f, 5000);
    int64_t n = 99;
    ck_assert_int_eq(rdzv_num_keys(c, &n), -ECONNRESET);
    ck_assert_int_eq(n, 99);
    ck_assert_int_eq(fake_join(&f), 0);
    ck_assert_int_eq(rdzv_num_keys(c, &n), -ENOTCONN);
    ck_assert_int_eq(rdzv_ping(c), -ENOTCONN);
    ck_assert_ptr_nonnull(strstr(rdzv_client_last_error(c), "closed"));
    rdzv_client_close(c);
}
END_TEST

START_TEST(test_timeout_mid_reply)
{
    struct fake f;
    fake_start(&f, script_stall_mid_reply);
    rdzv_client *c = fake_client(&f, 150);
    int64_t n = 99;
    double t0 = mono_now_s();
    ck_assert_int_eq(rdzv_num_keys(c, &n), -ETIMEDOUT);
    ck_assert(mono_now_s() - t0 >= 0.14);
    ck_assert_int_eq(rdzv_ping(c), -ENOTCONN);
    rdzv_client_close(c); /* ends the fake's drain */
    ck_assert_int_eq(fake_join(&f), 0);
}
END_TEST

START_TEST(test_malformed_replies)
{
    struct fake f;
    const char *keys[1] = {"k"};
    fake_start(&f, script_bad_check_reply);
    rdzv_client *c = fake_client(&f, 5000);
    ck_assert_int_eq(rdzv_check(c, keys, 1), -EPROTO);
    ck_assert_int_eq(rdzv_check(c, keys, 1), -ENOTCONN);
    rdzv_client_close(c);
    ck_assert_int_eq(fake_join(&f), 0);

    fake_start(&f, script_absurd_length);
    c = fake_client(&f, 5000);
    void *v[1] = {(void *)0x1};
    size_t n[1] = {5};
    ck_assert_int_eq(rdzv_multi_get(c, keys, 1, v, n), -EPROTO);
    ck_assert_ptr_eq(v[0], (void *)0x1);
    ck_assert_int_eq(rdzv_ping(c), -ENOTCONN);
    rdzv_client_close(c);
    ck_assert_int_eq(fake_join(&f), 0);
}
END_TEST

/* The client's requests, byte for byte as PyTorch's client frames them, key prefix included. */
START_TEST(test_request_bytes)
{
    struct fake f;
    fake_start(&f, script_request_bytes);
    rdzv_client_options o;
    rdzv_client_options_init(&o);
    o.prefix = "p/";
    o.timeout_ms = 5000;
    o.connect_timeout_ms = 5000;
    rdzv_client *c = NULL;
    ck_assert_int_eq(rdzv_client_connect("127.0.0.1", f.port, &o, &c), 0);
    int64_t n = 0;
    void *v = NULL;
    size_t len = 0;
    const char *keys[2] = {"a", "b"};
    const void *vals[2] = {"1", ""};
    const size_t lens[2] = {1, 0};
    ck_assert_int_eq(rdzv_set(c, "k", "v", 1), 0);
    ck_assert_int_eq(rdzv_add(c, "n", -2, &n), 0);
    ck_assert_int_eq(n, 40);
    ck_assert_int_eq(rdzv_get(c, "k", &v, &len), 0);
    ck_assert_uint_eq(len, 1);
    rdzv_free(v);
    ck_assert_int_eq(rdzv_multi_set(c, keys, vals, lens, 2), 0);
    ck_assert_int_eq(rdzv_compare_set(c, "k", "v", 1, "w", 1, &v, &len), 0);
    ck_assert_mem_eq(v, "w", 1);
    rdzv_free(v);
    ck_assert_int_eq(rdzv_delete(c, "k"), 1);
    ck_assert_int_eq(rdzv_num_keys(c, &n), 0);
    ck_assert_int_eq(n, 3);
    rdzv_client_close(c);
    ck_assert_int_eq(fake_join(&f), 0);
}
END_TEST

START_TEST(test_wait_cancel_race)
{
    struct fake f;
    const char *keys[1] = {"never"};
    fake_start(&f, script_cancel_race);
    rdzv_client *c = fake_client(&f, 5000);
    ck_assert_int_eq(rdzv_wait(c, keys, 1, 100), -ETIMEDOUT);
    ck_assert_int_eq(rdzv_ping(c), 0);
    rdzv_client_close(c);
    ck_assert_int_eq(fake_join(&f), 0);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */

static Suite *client_suite(void)
{
    Suite *s = suite_create("client");

    TCase *tc = check_tcase(
        s, "store", 30, test_invalid_arguments, test_set_get, test_get_waits_for_key,
        test_get_timeout_keeps_client, test_wait, test_add, test_compare_set,
        test_dup_and_local_addr, test_on_close_hook, test_check_delete_num_keys, test_append,
        test_multi, test_ping_status, test_prefix_isolation, test_list_keys,
        test_barrier_reuse_multiprocess, test_barrier_single_and_timeout, test_barrier_retry_alone,
        test_barrier_retry_then_partner, test_barrier_world_size_change, test_barrier_late_joiners,
        test_server_gone, test_connect_names_and_ipv6);
    tcase_add_checked_fixture(tc, server_setup, server_teardown);

    tc = check_tcase(s, "barrier", 60, test_barrier_guess, test_barrier_churn,
                     test_barrier_killed_caller, test_barrier_state_by_hand, test_barrier_requests);
    tcase_add_checked_fixture(tc, server_setup, server_teardown);

    check_tcase(s, "connect", 30, test_options_defaults, test_connect_refused_deadline,
                test_connect_retries_until_server_listens, test_connect_unknown_host,
                test_connect_not_a_store, test_connect_handshake_bound,
                test_connect_refused_at_once);

    check_tcase(s, "broken_peers", 30, test_peer_closes_mid_reply, test_timeout_mid_reply,
                test_malformed_replies, test_wait_cancel_race, test_request_bytes);
    return s;
}

int main(void)
{
    return check_run(client_suite());
}
