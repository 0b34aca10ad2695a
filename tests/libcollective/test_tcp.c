/*
 * Tests of libcollective's TCP layer (libcollective/tcp.c): connections made in either arrival
 * order, handshakes that refuse strays, duplex transfers with split iovecs, and the failures a
 * transfer must report in bounded time (a silent peer, a dead peer, an abort, a shutdown).
 *
 * Every case runs in its own forked process (Check's fork mode) under a timeout. Multi-rank
 * cases open every rank's listener in the test process (so the ports are known), then fork one
 * process per rank, which keeps its own endpoint and closes the others; ranks report through
 * their exit status. Where one process must wait for another to reach a point, it reads a pipe;
 * sleeps only delay a stimulus (an abort), never order events.
 */
#include <check.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coll_internal.h"
#include "monoclock.h"
#include "check_main.h"

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                     */
/* ------------------------------------------------------------------------------------------ */

#define MAXW 8
#define TAG 0x1234abcd5678ef00ull
#define MIB (1024 * 1024)

/* In a rank process: report the failed condition and exit with status 1. */
#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
            _exit(1);                                                                              \
        }                                                                                          \
    } while (0)
#define CHECK_RC(rc, expect)                                                                       \
    do {                                                                                           \
        int got_ = (rc);                                                                           \
        if (got_ != (expect)) {                                                                    \
            fprintf(stderr, "%s:%d: %s = %d (%s), expected %d\n", __FILE__, __LINE__, #rc, got_,   \
                    coll_strerror_tmp(got_), (expect));                                            \
            _exit(1);                                                                              \
        }                                                                                          \
    } while (0)

static const char *coll_strerror_tmp(int rc)
{
    return rc == COLL_EREMOTE ? "remote" : rc < 0 ? strerror(-rc) : "ok";
}

static _Atomic int g_abort; /* each rank process has its own copy */

/* Deterministic bytes that depend on the position and on who sent them. */
static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void fill(uint8_t *buf, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = mix(seed * 0x100000001b3ull + i / 8);
        memcpy(buf + i, &v, n - i < 8 ? n - i : 8);
    }
}

static bool verify(const uint8_t *buf, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = mix(seed * 0x100000001b3ull + i / 8);
        if (memcmp(buf + i, &v, n - i < 8 ? n - i : 8) != 0) {
            fprintf(stderr, "mismatch at byte %zu of %zu\n", i, n);
            return false;
        }
    }
    return true;
}

/*
 * Splits buf (n bytes) into at most max entries of irregular sizes, every `zero_every`-th
 * entry empty (0: none). Returns the number of entries.
 */
static int split(void *buf, size_t n, struct iovec *iov, int max, uint64_t seed, int zero_every)
{
    int k = 0;
    size_t off = 0;
    size_t avg = n / (size_t)(max / 2 > 0 ? max / 2 : 1) + 1;
    while (off < n && k < max - 1) {
        size_t len = 0;
        if (!zero_every || k % zero_every != zero_every - 1) {
            len = mix(seed + (uint64_t)k) % (2 * avg) + 1;
            if (len > n - off)
                len = n - off;
        }
        iov[k++] = (struct iovec){(uint8_t *)buf + off, len};
        off += len;
    }
    iov[k++] = (struct iovec){(uint8_t *)buf + off, n - off};
    return k;
}

/* A job: every rank's endpoint opened here, then one process per rank. */
typedef struct job {
    int world;
    coll__tcp t[MAXW];
    int ports[MAXW];
    pid_t pids[MAXW];
    const char *host;
} job;

typedef void (*rank_fn)(coll__tcp *t, void *arg);

static void job_init(job *j, int world, const char *host)
{
    memset(j, 0, sizeof *j);
    j->world = world;
    j->host = host;
    for (int r = 0; r < world; r++) {
        int rc = coll__tcp_init(&j->t[r], r, world, TAG, host, &g_abort, &j->ports[r]);
        ck_assert_msg(rc == 0, "init rank %d: %d", r, rc);
        ck_assert_int_gt(j->ports[r], 0);
    }
}

/* Forks rank r running fn; the child exits 0 when fn returns. */
static void job_spawn(job *j, int r, rank_fn fn, void *arg)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        /* No rank outlives a case that failed or timed out. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        for (int q = 0; q < j->world; q++)
            if (q != r)
                coll__tcp_close(&j->t[q]);
        for (int q = 0; q < j->world; q++)
            CHECK_RC(coll__tcp_set_peer(&j->t[r], q, j->host ? j->host : "127.0.0.1", j->ports[q]),
                     0);
        fn(&j->t[r], arg);
        coll__tcp_close(&j->t[r]);
        _exit(0);
    }
    j->pids[r] = pid;
}

/* Closes the test process's copies of the endpoints (call once every rank is forked). */
static void job_detach(job *j)
{
    for (int r = 0; r < j->world; r++)
        coll__tcp_close(&j->t[r]);
}

/* Waits for rank r; returns its wait status. */
static int job_wait(job *j, int r)
{
    int st = 0;
    ck_assert_int_eq(waitpid(j->pids[r], &st, 0), j->pids[r]);
    return st;
}

static void job_expect_ok(job *j)
{
    for (int r = 0; r < j->world; r++) {
        if (!j->pids[r])
            continue;
        int st = job_wait(j, r);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d: status 0x%x", r, st);
    }
}

/* Runs fn on every rank of a fresh job and checks that all succeed. */
static void run_all(int world, const char *host, rank_fn fn, void *arg)
{
    job j;
    job_init(&j, world, host);
    for (int r = 0; r < world; r++)
        job_spawn(&j, r, fn, arg);
    job_detach(&j);
    job_expect_ok(&j);
}

/* One-iovec transfer, checked for success. */
static void xfer1(coll__tcp *t, int sp, void *sbuf, size_t sn, int rp, void *rbuf, size_t rn,
                  int timeout_ms)
{
    struct iovec s = {sbuf, sn}, r = {rbuf, rn};
    int culprit = -7;
    CHECK_RC(coll__tcp_xfer(t, sp, &s, sp >= 0, rp, &r, rp >= 0, mono_deadline_ns(timeout_ms),
                            &culprit),
             0);
}

/* Blocks until the other end of the pipe is closed by every writer. */
static void wait_eof(int fd)
{
    char c;
    while (read(fd, &c, 1) > 0)
        ;
}

/* ------------------------------------------------------------------------------------------ */
/* Set-up and arguments                                                                        */
/* ------------------------------------------------------------------------------------------ */

START_TEST(test_init_and_arguments)
{
    coll__tcp t, z;
    int port = 0;
    memset(&z, 0, sizeof z);
    coll__tcp_close(&z); /* a zeroed struct: must not close fd 0 */
    ck_assert_int_ne(fcntl(0, F_GETFD), -1);
    coll__tcp_shutdown(&z);

    ck_assert_int_eq(coll__tcp_init(&t, 0, 0, TAG, NULL, NULL, &port), -EINVAL);
    ck_assert_int_eq(coll__tcp_init(&t, 2, 2, TAG, NULL, NULL, &port), -EINVAL);
    ck_assert_int_eq(coll__tcp_init(&t, -1, 2, TAG, NULL, NULL, &port), -EINVAL);
    ck_assert_int_eq(coll__tcp_init(&t, 0, 2, TAG, "localhost", NULL, &port), -EINVAL);
    ck_assert_int_eq(port, 0);
    coll__tcp_close(&t); /* after a failed init */

    ck_assert_int_eq(coll__tcp_init(&t, 1, 3, TAG, NULL, NULL, &port), 0);
    ck_assert_int_gt(port, 0);
    ck_assert_int_ge(t.listen_fd, 0);
    ck_assert(fcntl(t.listen_fd, F_GETFD) & FD_CLOEXEC);
    ck_assert(fcntl(t.listen_fd, F_GETFL) & O_NONBLOCK);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(t.fds[i], -1);

    ck_assert_int_eq(coll__tcp_set_peer(&t, 3, "127.0.0.1", 1), -EINVAL);
    ck_assert_int_eq(coll__tcp_set_peer(&t, -1, "127.0.0.1", 1), -EINVAL);
    ck_assert_int_eq(coll__tcp_set_peer(&t, 0, "127.0.0.1", 0), -EINVAL);
    ck_assert_int_eq(coll__tcp_set_peer(&t, 0, "127.0.0.1", 65536), -EINVAL);
    ck_assert_int_eq(coll__tcp_set_peer(&t, 0, "host.example", 80), -EINVAL);
    ck_assert_int_eq(coll__tcp_set_peer(&t, 0, NULL, 80), -EINVAL);
    ck_assert_int_eq(coll__tcp_set_peer(&t, 0, "::1", 80), 0);
    ck_assert_int_eq(coll__tcp_set_peer(&t, 2, "127.0.0.1", 80), 0);
    ck_assert_str_eq(t.addrs[2], "127.0.0.1");
    ck_assert_int_eq(t.ports[2], 80);

    ck_assert_int_eq(coll__tcp_conn(&t, 1, mono_deadline_ns(100)), -EINVAL);
    ck_assert_int_eq(coll__tcp_conn(&t, 3, mono_deadline_ns(100)), -EINVAL);
    ck_assert_int_eq(coll__tcp_conn(&t, -1, mono_deadline_ns(100)), -EINVAL);

    char b[4];
    struct iovec v = {b, sizeof b};
    int culprit = -7;
    ck_assert_int_eq(coll__tcp_xfer(&t, 1, &v, 1, -1, NULL, 0, 0, &culprit), -EINVAL);
    ck_assert_int_eq(coll__tcp_xfer(&t, -1, NULL, 0, 3, &v, 1, 0, &culprit), -EINVAL);
    ck_assert_int_eq(coll__tcp_xfer(&t, 0, &v, -1, -1, NULL, 0, 0, &culprit), -EINVAL);
    /* Nothing to move: done at once, whatever the deadline, without connecting. */
    ck_assert_int_eq(coll__tcp_xfer(&t, -1, NULL, 0, -1, NULL, 0, 0, &culprit), 0);
    ck_assert_int_eq(culprit, -7);

    coll__tcp_close(&t);
    ck_assert_int_eq(t.listen_fd, -1);
    coll__tcp_close(&t); /* twice */
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Transfers                                                                                   */
/* ------------------------------------------------------------------------------------------ */

/*
 * Ring: each rank sends `nbytes` to the next and receives as many from the previous, with the
 * send side split into 200 iovecs and the receive side into 1500 (past IOV_MAX), some empty.
 */
static size_t ring_bytes;

static void ring_rank(coll__tcp *t, void *arg)
{
    (void)arg;
    int w = t->world, next = (t->rank + 1) % w, prev = (t->rank + w - 1) % w;
    size_t n = ring_bytes;
    uint8_t *sbuf = malloc(n), *rbuf = malloc(n);
    static struct iovec siov[200], riov[1500];
    CHECK(sbuf && rbuf);
    fill(sbuf, n, (uint64_t)t->rank);
    memset(rbuf, 0, n);
    int sn = split(sbuf, n, siov, 200, 11 + (uint64_t)t->rank, 17);
    int rn = split(rbuf, n, riov, 1500, 99 + (uint64_t)t->rank, 5);
    int culprit = -7;
    CHECK_RC(coll__tcp_xfer(t, next, siov, sn, prev, riov, rn, mono_deadline_ns(60000), &culprit),
             0);
    CHECK(culprit == -7);
    CHECK(verify(rbuf, n, (uint64_t)prev));
    CHECK(t->fds[next] >= 0 && t->fds[prev] >= 0);
    /* A second round on the same connections, the other way around. */
    fill(sbuf, n, 1000 + (uint64_t)t->rank);
    CHECK_RC(coll__tcp_xfer(t, prev, siov, sn, next, riov, rn, mono_deadline_ns(60000), &culprit),
             0);
    CHECK(verify(rbuf, n, 1000 + (uint64_t)next));
    free(sbuf);
    free(rbuf);
}

START_TEST(test_ring3)
{
    ring_bytes = 64 * MIB;
    run_all(3, NULL, ring_rank, NULL);
}
END_TEST

START_TEST(test_ring5)
{
    ring_bytes = 64 * MIB + 3; /* not a multiple of anything */
    run_all(5, NULL, ring_rank, NULL);
}
END_TEST

/* Both ranks send 16 MiB to each other at once on their one connection. */
static void pair_rank(coll__tcp *t, void *arg)
{
    (void)arg;
    int peer = 1 - t->rank;
    size_t n = 16 * MIB;
    uint8_t *sbuf = malloc(n), *rbuf = malloc(n);
    CHECK(sbuf && rbuf);
    for (int round = 0; round < 3; round++) {
        fill(sbuf, n, (uint64_t)(t->rank * 10 + round));
        xfer1(t, peer, sbuf, n, peer, rbuf, n, 30000);
        CHECK(verify(rbuf, n, (uint64_t)(peer * 10 + round)));
    }
    free(sbuf);
    free(rbuf);
}

START_TEST(test_pair_duplex)
{
    run_all(2, NULL, pair_rank, NULL);
}
END_TEST

START_TEST(test_pair_duplex_ipv6)
{
    coll__tcp t;
    int port;
    int rc = coll__tcp_init(&t, 0, 2, TAG, "::1", NULL, &port);
    if (rc != 0) {
        fprintf(stderr, "no IPv6 loopback here (%d): case skipped\n", rc);
        return;
    }
    coll__tcp_close(&t);
    run_all(2, "::1", pair_rank, NULL);
}
END_TEST

/* Empty transfers of every shape, then a tiny message through iovecs that are mostly empty. */
static void zero_rank(coll__tcp *t, void *arg)
{
    (void)arg;
    int peer = 1 - t->rank, culprit = -7;
    int64_t dl = mono_deadline_ns(10000);
    struct iovec empty[3] = {{NULL, 0}, {NULL, 0}, {NULL, 0}};
    CHECK_RC(coll__tcp_xfer(t, -1, NULL, 0, -1, NULL, 0, dl, &culprit), 0);
    CHECK_RC(coll__tcp_xfer(t, peer, NULL, 0, peer, NULL, 0, dl, &culprit), 0);
    CHECK_RC(coll__tcp_xfer(t, peer, empty, 3, peer, empty, 3, dl, &culprit), 0);
    CHECK(t->fds[peer] == -1); /* nothing moved, so nothing was connected */

    char msg[6] = "hello", got[6] = {0};
    struct iovec s[4] = {{NULL, 0}, {msg, 2}, {NULL, 0}, {msg + 2, 4}};
    struct iovec r[6] = {{NULL, 0}, {got, 1}, {NULL, 0}, {got + 1, 4}, {got + 5, 1}, {NULL, 0}};
    if (t->rank == 0) /* one direction only: rank 0 sends, rank 1 receives */
        CHECK_RC(coll__tcp_xfer(t, peer, s, 4, -1, NULL, 0, dl, &culprit), 0);
    else
        CHECK_RC(coll__tcp_xfer(t, -1, NULL, 0, peer, r, 6, dl, &culprit), 0);
    if (t->rank == 1)
        CHECK(memcmp(got, "hello", 6) == 0);
    CHECK(t->fds[peer] >= 0);
    /* Sending nothing while receiving something, on one connection. */
    memset(got, 0, sizeof got);
    if (t->rank == 1)
        CHECK_RC(coll__tcp_xfer(t, peer, s, 4, peer, empty, 3, dl, &culprit), 0);
    else
        CHECK_RC(coll__tcp_xfer(t, peer, empty, 1, peer, r, 6, dl, &culprit), 0);
    if (t->rank == 0)
        CHECK(memcmp(got, "hello", 6) == 0);
}

START_TEST(test_zero_length)
{
    run_all(2, NULL, zero_rank, NULL);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Connections                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/*
 * Rank 2 asks for rank 1 first, but rank 0 arrives first: rank 1 only connects once rank 0's
 * connection to rank 2 is complete (which needs rank 2 to have accepted and kept it while it
 * was waiting for rank 1). Each pair then exchanges the ranks, to check the fds are right.
 */
static int stash_pipe[2];

static void say_rank(coll__tcp *t, int peer)
{
    int mine = t->rank, theirs = -1;
    xfer1(t, peer, &mine, sizeof mine, peer, &theirs, sizeof theirs, 10000);
    CHECK(theirs == peer);
}

static void stash_rank(coll__tcp *t, void *arg)
{
    (void)arg;
    int64_t dl = mono_deadline_ns(10000);
    char c = 'x';
    if (t->rank == 0) {
        close(stash_pipe[0]);
        CHECK(coll__tcp_conn(t, 2, dl) >= 0);
        CHECK(write(stash_pipe[1], &c, 1) == 1);
        close(stash_pipe[1]);
        CHECK(coll__tcp_conn(t, 1, dl) >= 0);
        say_rank(t, 2);
        say_rank(t, 1);
    } else if (t->rank == 1) {
        close(stash_pipe[1]);
        CHECK(read(stash_pipe[0], &c, 1) == 1);
        close(stash_pipe[0]);
        CHECK(coll__tcp_conn(t, 2, dl) >= 0);
        CHECK(coll__tcp_conn(t, 0, dl) >= 0);
        say_rank(t, 2);
        say_rank(t, 0);
    } else {
        close(stash_pipe[0]);
        close(stash_pipe[1]);
        int fd1 = coll__tcp_conn(t, 1, dl);
        CHECK(fd1 >= 0);
        CHECK(t->fds[0] >= 0); /* kept on the way */
        CHECK(coll__tcp_conn(t, 0, dl) == t->fds[0]);
        CHECK(coll__tcp_conn(t, 1, dl) == fd1);
        say_rank(t, 0);
        say_rank(t, 1);
    }
}

START_TEST(test_accept_out_of_order)
{
    ck_assert_int_eq(pipe(stash_pipe), 0);
    job j;
    job_init(&j, 3, NULL);
    for (int r = 0; r < 3; r++)
        job_spawn(&j, r, stash_rank, NULL);
    close(stash_pipe[0]);
    close(stash_pipe[1]);
    job_detach(&j);
    job_expect_ok(&j);
}
END_TEST

/* A raw connection to port that sends n bytes of buf (may be 0). */
static int raw_connect(int port, const void *buf, size_t n)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    if (n)
        ck_assert_int_eq(send(fd, buf, n, MSG_NOSIGNAL), (ssize_t)n);
    return fd;
}

static void raw_hello(uint8_t *b, uint32_t magic, uint64_t tag, uint32_t rank)
{
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(magic >> (8 * i));
    for (int i = 0; i < 8; i++)
        b[4 + i] = (uint8_t)(tag >> (8 * i));
    for (int i = 0; i < 4; i++)
        b[12 + i] = (uint8_t)(rank >> (8 * i));
}

/* The other end closes fd (EOF or reset) within 10 s without having sent anything. */
static void expect_closed(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    ck_assert_int_eq(poll(&p, 1, 10000), 1);
    char b[16];
    ssize_t n = recv(fd, b, sizeof b, 0);
    ck_assert_msg(n == 0 || (n < 0 && errno == ECONNRESET), "recv: %zd", n);
    close(fd);
}

static void bad_hello_rank(coll__tcp *t, void *arg)
{
    (void)arg;
    CHECK(coll__tcp_conn(t, 1 - t->rank, mono_deadline_ns(10000)) >= 0);
    say_rank(t, 1 - t->rank);
}

/*
 * Strays queued on rank 1's listener before rank 0 connects: garbage, a wrong tag, ranks out
 * of range or not lower, a connection that never speaks and one that stops mid-hello. Rank 0
 * still gets through, and every stray is closed without an ack.
 */
START_TEST(test_bad_hellos)
{
    job j;
    job_init(&j, 2, NULL);
    uint8_t b[6][16];
    memset(b[0], 0xab, 16);
    raw_hello(b[1], 0x636f6c6cu, TAG ^ 1, 0);
    raw_hello(b[2], 0x636f6c6cu, TAG, 7);
    raw_hello(b[3], 0x636f6c6cu, TAG, 1);
    raw_hello(b[4], 0x636f6c6cu, TAG, 0xffffffffu);
    raw_hello(b[5], 0x636f6c6cu, TAG, 0);
    int fds[7];
    for (int i = 0; i < 5; i++)
        fds[i] = raw_connect(j.ports[1], b[i], 16);
    fds[5] = raw_connect(j.ports[1], NULL, 0);
    fds[6] = raw_connect(j.ports[1], b[5], 8);

    double t0 = mono_now_s();
    job_spawn(&j, 1, bad_hello_rank, NULL);
    job_spawn(&j, 0, bad_hello_rank, NULL);
    job_detach(&j);
    job_expect_ok(&j);
    ck_assert_double_lt(mono_now_s() - t0, 5.0);
    for (int i = 0; i < 7; i++)
        expect_closed(fds[i]);
}
END_TEST

/*
 * A second connection claiming to be rank 0, after the real one was kept, is refused while
 * rank 2 waits for rank 1.
 */
static int dup_pipe[2], dup_go[2];

static void dup_rank(coll__tcp *t, void *arg)
{
    (void)arg;
    int64_t dl = mono_deadline_ns(10000);
    char c = 'x';
    close(dup_pipe[0]);
    close(dup_go[1]);
    if (t->rank == 0) {
        close(dup_go[0]);
        CHECK(coll__tcp_conn(t, 2, dl) >= 0);
        CHECK(write(dup_pipe[1], &c, 1) == 1);
        close(dup_pipe[1]);
        say_rank(t, 2);
    } else if (t->rank == 1) {
        close(dup_pipe[1]);
        CHECK(read(dup_go[0], &c, 1) == 1);
        close(dup_go[0]);
        CHECK(coll__tcp_conn(t, 2, dl) >= 0);
        say_rank(t, 2);
    } else {
        close(dup_pipe[1]);
        close(dup_go[0]);
        CHECK(coll__tcp_conn(t, 0, dl) >= 0);
        CHECK(coll__tcp_conn(t, 1, dl) >= 0);
        say_rank(t, 0);
        say_rank(t, 1);
    }
}

START_TEST(test_duplicate_hello)
{
    ck_assert_int_eq(pipe(dup_pipe), 0);
    ck_assert_int_eq(pipe(dup_go), 0);
    job j;
    job_init(&j, 3, NULL);
    int port2 = j.ports[2];
    for (int r = 0; r < 3; r++)
        job_spawn(&j, r, dup_rank, NULL);
    job_detach(&j);
    close(dup_pipe[1]);
    close(dup_go[0]);
    char c;
    ck_assert_int_eq(read(dup_pipe[0], &c, 1), 1); /* rank 0 is connected to rank 2 */
    uint8_t b[16];
    raw_hello(b, 0x636f6c6cu, TAG, 0);
    int fd = raw_connect(port2, b, 16);
    ck_assert_int_eq(write(dup_go[1], &c, 1), 1); /* now rank 1 */
    close(dup_go[1]);
    close(dup_pipe[0]);
    expect_closed(fd);
    job_expect_ok(&j);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Failures                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/*
 * Silent ranks connect when told (or not at all) and then wait for the end of the case (EOF on
 * silent_pipe, whose write end the active rank holds).
 */
static int silent_pipe[2];

typedef struct silent_arg {
    int active; /* the rank that runs `fn` */
    rank_fn fn;
    bool connect; /* silent ranks connect to the active rank first */
} silent_arg;

static void silent_rank(coll__tcp *t, void *arg)
{
    silent_arg *a = arg;
    close(silent_pipe[t->rank == a->active ? 0 : 1]);
    if (t->rank == a->active) {
        a->fn(t, NULL);
        close(silent_pipe[1]);
        return;
    }
    if (a->connect)
        CHECK(coll__tcp_conn(t, a->active, mono_deadline_ns(10000)) >= 0);
    wait_eof(silent_pipe[0]);
}

static void run_silent(int world, int active, rank_fn fn, bool connect)
{
    silent_arg a = {active, fn, connect};
    ck_assert_int_eq(pipe(silent_pipe), 0);
    job j;
    job_init(&j, world, NULL);
    for (int r = 0; r < world; r++)
        job_spawn(&j, r, silent_rank, &a);
    close(silent_pipe[0]);
    close(silent_pipe[1]);
    job_detach(&j);
    job_expect_ok(&j);
}

/* Expects rc and culprit from a transfer, within [lo, hi] seconds of `start`. */
#define CHECK_FAIL(call, start, lo, hi, expect, who)                                               \
    do {                                                                                           \
        int culprit_ = -7;                                                                         \
        int rc_ = (call);                                                                          \
        double dt_ = mono_now_s() - (start);                                                      \
        fprintf(stderr, "%s: %d after %.3f s, culprit %d\n", #call, rc_, dt_, culprit_);           \
        CHECK_RC(rc_, expect);                                                                     \
        CHECK(culprit_ == (who));                                                                  \
        CHECK(dt_ >= (lo) && dt_ <= (hi));                                                         \
    } while (0)

static void timeout_active(coll__tcp *t, void *arg)
{
    (void)arg;
    CHECK(coll__tcp_conn(t, 1, mono_deadline_ns(10000)) >= 0);
    CHECK(coll__tcp_conn(t, 2, mono_deadline_ns(10000)) >= 0);
    size_t n = 64 * MIB;
    uint8_t *buf = calloc(1, n);
    CHECK(buf);
    /* Receiving from a peer that sends nothing. */
    struct iovec v = {buf, 4096};
    double t0 = mono_now_s();
    CHECK_FAIL(coll__tcp_xfer(t, -1, NULL, 0, 2, &v, 1, mono_deadline_ns(500), &culprit_), t0, 0.5,
               0.8, -ETIMEDOUT, 2);
    /* Sending more than the socket buffers hold to a peer that reads nothing. */
    v.iov_len = n;
    t0 = mono_now_s();
    CHECK_FAIL(coll__tcp_xfer(t, 1, &v, 1, -1, NULL, 0, mono_deadline_ns(500), &culprit_), t0, 0.5,
               0.8, -ETIMEDOUT, 1);
    /* Both at once: the one still receiving is named. */
    struct iovec r = {buf, 16};
    t0 = mono_now_s();
    CHECK_FAIL(coll__tcp_xfer(t, 1, &v, 1, 2, &r, 1, mono_deadline_ns(300), &culprit_), t0, 0.3,
               0.6, -ETIMEDOUT, 2);
    free(buf);
}

START_TEST(test_timeout_names_silent_peer)
{
    run_silent(3, 0, timeout_active, true);
}
END_TEST

/* Connecting to a listener nobody accepts on, and accepting when nobody connects. */
static void conn_timeout_active(coll__tcp *t, void *arg)
{
    (void)arg;
    double t0 = mono_now_s();
    int rc = coll__tcp_conn(t, 2, mono_deadline_ns(400));
    CHECK_RC(rc, -ETIMEDOUT);
    CHECK(mono_now_s() - t0 >= 0.4 && mono_now_s() - t0 < 0.7);
    t0 = mono_now_s();
    rc = coll__tcp_conn(t, 0, mono_deadline_ns(400));
    CHECK_RC(rc, -ETIMEDOUT);
    CHECK(mono_now_s() - t0 >= 0.4 && mono_now_s() - t0 < 0.7);
    CHECK(t->fds[0] == -1 && t->fds[2] == -1);
}

START_TEST(test_conn_timeout)
{
    run_silent(3, 1, conn_timeout_active, false);
}
END_TEST

/* Rank 1 takes 1 MiB each way, then dies; rank 0 was moving 64 MiB each way. */
static void killed_rank(coll__tcp *t, void *arg)
{
    (void)arg;
    int peer = 1 - t->rank;
    size_t n = 64 * MIB;
    uint8_t *sbuf = calloc(1, n), *rbuf = malloc(n);
    CHECK(sbuf && rbuf);
    if (t->rank == 1) {
        xfer1(t, peer, sbuf, MIB, peer, rbuf, MIB, 10000);
        raise(SIGKILL);
    }
    double t0 = mono_now_s();
    struct iovec s = {sbuf, n}, r = {rbuf, n};
    CHECK_FAIL(coll__tcp_xfer(t, peer, &s, 1, peer, &r, 1, mono_deadline_ns(20000), &culprit_), t0,
               0.0, 2.0, COLL_EREMOTE, 1);
    free(sbuf);
    free(rbuf);
}

/* Rank 1 sends 1 MiB of the 64 rank 0 waits for, then dies (an orderly close: EOF). */
static void killed_sender_rank(coll__tcp *t, void *arg)
{
    (void)arg;
    int peer = 1 - t->rank;
    size_t n = 64 * MIB;
    uint8_t *buf = calloc(1, n);
    CHECK(buf);
    if (t->rank == 1) {
        xfer1(t, peer, buf, MIB, -1, NULL, 0, 10000);
        raise(SIGKILL);
    }
    double t0 = mono_now_s();
    struct iovec r = {buf, n};
    CHECK_FAIL(coll__tcp_xfer(t, -1, NULL, 0, peer, &r, 1, mono_deadline_ns(20000), &culprit_), t0,
               0.0, 2.0, COLL_EREMOTE, 1);
    free(buf);
}

static void expect_killed(rank_fn fn)
{
    job j;
    job_init(&j, 2, NULL);
    job_spawn(&j, 0, fn, NULL);
    job_spawn(&j, 1, fn, NULL);
    job_detach(&j);
    int st = job_wait(&j, 1);
    ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "rank 1: status 0x%x", st);
    st = job_wait(&j, 0);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank 0: status 0x%x", st);
}

START_TEST(test_peer_killed_mid_transfer)
{
    expect_killed(killed_rank);
}
END_TEST

START_TEST(test_sender_killed_mid_transfer)
{
    expect_killed(killed_sender_rank);
}
END_TEST

/* Sets the abort flag 250 ms after it starts (between two 100 ms polls), and records when. */
static double abort_at;

static void *aborter(void *arg)
{
    (void)arg;
    struct timespec d = {0, 250 * 1000 * 1000};
    nanosleep(&d, NULL); /* the stimulus's timing, not synchronisation */
    abort_at = mono_now_s();
    atomic_store(&g_abort, 1);
    return NULL;
}

static void abort_active(coll__tcp *t, void *arg)
{
    (void)arg;
    pthread_t th;
    uint8_t buf[64];
    struct iovec v = {buf, sizeof buf};

    /* In a transfer from a connected peer that sends nothing. */
    CHECK(coll__tcp_conn(t, 0, mono_deadline_ns(10000)) >= 0);
    CHECK(pthread_create(&th, NULL, aborter, NULL) == 0);
    int culprit = -7;
    int rc = coll__tcp_xfer(t, -1, NULL, 0, 0, &v, 1, mono_deadline_ns(30000), &culprit);
    double dt = mono_now_s() - abort_at;
    pthread_join(th, NULL);
    fprintf(stderr, "xfer: %d, %.3f s after the abort\n", rc, dt);
    CHECK_RC(rc, -ECANCELED);
    CHECK(culprit == -1);
    CHECK(dt < 0.2);

    /* Accepting (rank 1 never connects)... */
    atomic_store(&g_abort, 0);
    CHECK(pthread_create(&th, NULL, aborter, NULL) == 0);
    rc = coll__tcp_conn(t, 1, mono_deadline_ns(30000));
    dt = mono_now_s() - abort_at;
    pthread_join(th, NULL);
    fprintf(stderr, "accept: %d, %.3f s after the abort\n", rc, dt);
    CHECK_RC(rc, -ECANCELED);
    CHECK(dt < 0.2);

    /* ... and connecting to a listener that never accepts. */
    atomic_store(&g_abort, 0);
    CHECK(pthread_create(&th, NULL, aborter, NULL) == 0);
    rc = coll__tcp_conn(t, 3, mono_deadline_ns(30000));
    dt = mono_now_s() - abort_at;
    pthread_join(th, NULL);
    fprintf(stderr, "connect: %d, %.3f s after the abort\n", rc, dt);
    CHECK_RC(rc, -ECANCELED);
    CHECK(dt < 0.2);

    /* Set before the call: nothing blocks. */
    rc = coll__tcp_xfer(t, -1, NULL, 0, 0, &v, 1, mono_deadline_ns(30000), &culprit);
    CHECK_RC(rc, -ECANCELED);
}

START_TEST(test_abort_from_thread)
{
    /*
     * Rank 2 is active; rank 0 connects to it, rank 1 never connects, rank 3 listens but never
     * accepts.
     */
    silent_arg a = {2, abort_active, false};
    ck_assert_int_eq(pipe(silent_pipe), 0);
    job j;
    job_init(&j, 4, NULL);
    job_spawn(&j, 1, silent_rank, &a);
    job_spawn(&j, 2, silent_rank, &a);
    job_spawn(&j, 3, silent_rank, &a);
    a.connect = true;
    job_spawn(&j, 0, silent_rank, &a);
    close(silent_pipe[0]);
    close(silent_pipe[1]);
    job_detach(&j);
    job_expect_ok(&j);
}
END_TEST

/*
 * coll__tcp_shutdown() from another thread while both ranks wait on each other: the local call
 * returns at once, and the peer sees its connection fail.
 */
static coll__tcp *shut_t;

static void *shutter(void *arg)
{
    (void)arg;
    struct timespec d = {0, 250 * 1000 * 1000};
    nanosleep(&d, NULL);
    abort_at = mono_now_s();
    coll__tcp_shutdown(shut_t);
    return NULL;
}

static void shutdown_rank(coll__tcp *t, void *arg)
{
    (void)arg;
    int peer = 1 - t->rank;
    uint8_t buf[64];
    struct iovec v = {buf, sizeof buf};
    int culprit = -7;
    CHECK(coll__tcp_conn(t, peer, mono_deadline_ns(10000)) >= 0);
    if (t->rank == 0) {
        pthread_t th;
        shut_t = t;
        CHECK(pthread_create(&th, NULL, shutter, NULL) == 0);
        int rc = coll__tcp_xfer(t, -1, NULL, 0, peer, &v, 1, mono_deadline_ns(30000), &culprit);
        double dt = mono_now_s() - abort_at;
        pthread_join(th, NULL);
        fprintf(stderr, "local: %d culprit %d, %.3f s after the shutdown\n", rc, culprit, dt);
        CHECK(rc == COLL_EREMOTE || rc == -ECANCELED);
        CHECK(dt < 0.2);
    } else {
        double t0 = mono_now_s();
        CHECK_FAIL(coll__tcp_xfer(t, -1, NULL, 0, peer, &v, 1, mono_deadline_ns(30000), &culprit_),
                   t0, 0.0, 5.0, COLL_EREMOTE, 0);
    }
}

START_TEST(test_shutdown_wakes_both)
{
    run_all(2, NULL, shutdown_rank, NULL);
}
END_TEST

/* coll__tcp_shutdown() also wakes a rank waiting on its listener for a peer to connect. */
START_TEST(test_shutdown_wakes_accept)
{
    coll__tcp t;
    int port;
    ck_assert_int_eq(coll__tcp_init(&t, 1, 2, TAG, "127.0.0.1", &g_abort, &port), 0);
    pthread_t th;
    shut_t = &t;
    ck_assert_int_eq(pthread_create(&th, NULL, shutter, NULL), 0);
    int rc = coll__tcp_conn(&t, 0, mono_deadline_ns(30000));
    double dt = mono_now_s() - abort_at;
    pthread_join(th, NULL);
    ck_assert_msg(rc == -ESHUTDOWN, "conn: %d", rc);
    ck_assert_double_lt(dt, 0.2);
    coll__tcp_close(&t);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */

static Suite *tcp_suite(void)
{
    Suite *s = suite_create("tcp");

    check_tcase(s, "setup", 10, test_init_and_arguments);

    check_tcase(s, "xfer", 60, test_ring3, test_ring5, test_pair_duplex, test_pair_duplex_ipv6,
                test_zero_length);

    check_tcase(s, "conn", 20, test_accept_out_of_order, test_bad_hellos, test_duplicate_hello,
                test_conn_timeout);

    check_tcase(s, "failures", 20, test_timeout_names_silent_peer, test_peer_killed_mid_transfer,
                test_sender_killed_mid_transfer, test_abort_from_thread, test_shutdown_wakes_both,
                test_shutdown_wakes_accept);
    return s;
}

int main(void)
{
    return check_run(tcp_suite());
}
