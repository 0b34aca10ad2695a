/*
 * store-bench: measures ddp-rendezvous's store server against PyTorch's TCPStore servers, in one
 * run, over the c10d wire protocol spoken directly on sockets.
 *
 * Each protocol generation is compared like with like: ddp-rendezvous spoken to in the legacy
 * protocol against torch 1.13's server, and in the modern protocol (VALIDATE first) against
 * torch 2.x's libuv server. Every server runs as a child process: ours as `ddp-rendezvous serve
 * --bind 127.0.0.1 --port 0`, torch's through bench/store/torch_store_server.py. Measurements:
 * SET+GET round trips per second on 1 and 32 connections with 64 B and 1 MiB values (and the
 * mean time of one round trip on one connection), and the time for N connections to pass a
 * barrier (connect, ADD a counter, WAIT for a key that the last arrival SETs).
 *
 * What it deliberately does not do: use librendezvous's client or server code (it links only the
 * request encoder of proto.c, which the client and the tests share; every frame it builds also
 * goes to PyTorch's servers, so a fault in that encoder shows up as a failure against them),
 * measure anything but the loopback interface, or run under `meson test`.
 *
 * Client and server share the machine's cores (two on the development box): every rate
 * includes the client's own CPU time. To keep that share small and equal for every server, the
 * client is one thread driving non-blocking sockets through epoll (one blocking socket for the
 * single-connection case), all frames are built once and patched in place, and buffers are
 * allocated before the clock starts. (The only other threads copy the servers' stdout into
 * their logs and are idle while measuring.) Because the rates depend on how busy the cores
 * are, the server's own CPU time per round trip is reported too, and each round-trip row is
 * the best of several runs alternating between the two servers.
 *
 * Invariants: at most one request is outstanding per connection; every reply is checked (GET
 * returns the value just SET, identified by a sequence number in its first 8 bytes; ADD
 * results are unique and within 1..N; WAIT answers STOP_WAITING), so a misbehaving server shows
 * up as a failure with a description, never as a fast number.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "monoclock.h"
#include "proto.h"

#ifndef STORE_BENCH_SCRIPT
#define STORE_BENCH_SCRIPT "bench/store/torch_store_server.py"
#endif

#define MIB (1024 * 1024)
#define IO_TIMEOUT_MS 10000      /* a reply that takes longer than this is a hang */
#define BARRIER_TIMEOUT_MS 60000 /* torch 1.13 needs ~8 s for 10k connections */
#define START_TIMEOUT_MS 60000   /* importing torch takes seconds */
#define MAX_BARRIERS 3

/* ---------------------------------------------------------------------------------------- */
/* Small helpers                                                                            */
/* ---------------------------------------------------------------------------------------- */

static char g_err[512]; /* detail of the last failure, for the report */

/* Records a failure description and returns `rc` (a negative errno). */
__attribute__((format(printf, 2, 3))) static int fail(int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof(g_err), fmt, ap);
    va_end(ap);
    return rc;
}

/* The project's monotonic clock (monoclock.h), unsigned for this file's arithmetic. */
static uint64_t now_ns(void)
{
    return (uint64_t)mono_now_ns();
}

/* CPU time of another process (all its threads), in ns; -1 if it cannot be read. */
static int64_t proc_cpu_ns(pid_t pid)
{
    clockid_t clk;
    struct timespec ts;
    if (pid <= 0 || clock_getcpuclockid(pid, &clk) != 0 || clock_gettime(clk, &ts) != 0)
        return -1;
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* CPU time of the calling thread, in ns. */
static int64_t self_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "store-bench: out of memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

/* ---------------------------------------------------------------------------------------- */
/* Protocol generations                                                                     */
/* ---------------------------------------------------------------------------------------- */

struct gen {
    const char *name;   /* "legacy", "modern" */
    enum rdzv_gen wire; /* its opcode numbering, for rdzv__put_op() */
    bool validate;      /* opens with VALIDATE */
};

static const struct gen gen_legacy = {
    .name = "legacy",
    .wire = RDZV_GEN_LEGACY,
    .validate = false,
};
static const struct gen gen_modern = {
    .name = "modern",
    .wire = RDZV_GEN_MODERN,
    .validate = true,
};

/*
 * Frame builders: each appends one request to `w` with librendezvous's encoder (proto.h). The
 * caller checks the buffer once, with built(), after the frames it needs.
 */
static void frame_validate(rdzv__wbuf *w)
{
    rdzv__put_op(w, RDZV_GEN_MODERN, RDZV_OP_VALIDATE);
    rdzv__put_u32(w, RDZV_VALIDATE_MAGIC);
}

static void frame_ping(rdzv__wbuf *w, uint32_t nonce)
{
    rdzv__put_op(w, RDZV_GEN_MODERN, RDZV_OP_PING);
    rdzv__put_u32(w, nonce);
}

static void frame_set(rdzv__wbuf *w, const struct gen *g, const char *key, const void *val,
                      size_t vlen)
{
    rdzv__put_op(w, g->wire, RDZV_OP_SET);
    rdzv__put_vec(w, key, strlen(key));
    rdzv__put_vec(w, val, vlen);
}

static void frame_get(rdzv__wbuf *w, const struct gen *g, const char *key)
{
    rdzv__put_op(w, g->wire, RDZV_OP_GET);
    rdzv__put_vec(w, key, strlen(key));
}

static void frame_add(rdzv__wbuf *w, const struct gen *g, const char *key, int64_t delta)
{
    rdzv__put_op(w, g->wire, RDZV_OP_ADD);
    rdzv__put_vec(w, key, strlen(key));
    rdzv__put_i64(w, delta);
}

static void frame_wait1(rdzv__wbuf *w, const struct gen *g, const char *key)
{
    rdzv__put_op(w, g->wire, RDZV_OP_WAIT);
    rdzv__put_u64(w, 1);
    rdzv__put_vec(w, key, strlen(key));
}

/*
 * Exits, as xmalloc() does, if building frames into `w` failed: out of memory, or a fixed
 * buffer too small for its frames (a bug here). Frames are built before any clock starts.
 */
static void built(const rdzv__wbuf *w)
{
    if (w->err) {
        fprintf(stderr, "store-bench: cannot build a request: %s\n", strerror(-w->err));
        exit(2);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Blocking socket helpers (connection set-up and the single-connection case)               */
/* ---------------------------------------------------------------------------------------- */

static int send_all(int fd, const uint8_t *buf, size_t len)
{
    while (len) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return fail(-ETIMEDOUT, "send blocked for %d ms", IO_TIMEOUT_MS);
            return fail(-errno, "send: %s", strerror(errno));
        }
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

static int recv_all(int fd, uint8_t *buf, size_t len, const char *what)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = recv(fd, buf + got, len - got, MSG_WAITALL);
        if (n == 0)
            return fail(-EPROTO, "server closed the connection while %s (%zu of %zu bytes)", what,
                        got, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return fail(-ETIMEDOUT, "no reply within %d ms while %s (%zu of %zu bytes)",
                            IO_TIMEOUT_MS, what, got, len);
            return fail(-errno, "recv while %s: %s", what, strerror(errno));
        }
        got += (size_t)n;
    }
    return 0;
}

static void set_nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static struct sockaddr_in loopback(int port)
{
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return sa;
}

/*
 * Opens a blocking connection with I/O timeouts and, for the modern generation, performs the
 * client handshake a real torch client does (VALIDATE, then PING and its echo). Returns the fd
 * or a negative errno with g_err set.
 */
static int conn_open(int port, const struct gen *g)
{
    struct sockaddr_in sa = loopback(port);
    struct timeval tv = {IO_TIMEOUT_MS / 1000, 0};
    uint8_t hello[16], echo[4];
    rdzv__wbuf w = rdzv__wbuf_fixed(hello, sizeof(hello));
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int rc;

    if (fd < 0)
        return fail(-errno, "socket: %s", strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    set_nodelay(fd);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        rc = fail(-errno, "connect to 127.0.0.1:%d: %s", port, strerror(errno));
        goto out;
    }
    rc = fd;
    if (g->validate) {
        const uint32_t nonce = 0x15f5u;
        frame_validate(&w);
        frame_ping(&w, nonce);
        built(&w);
        rc = send_all(fd, w.data, w.len);
        if (rc == 0)
            rc = recv_all(fd, echo, 4, "waiting for the PING echo");
        if (rc == 0 && rdzv__ld32(echo) != nonce)
            rc = fail(-EPROTO, "PING echoed 0x%08x, sent 0x%08x", rdzv__ld32(echo), nonce);
        if (rc == 0)
            rc = fd;
    }
out:
    if (rc < 0)
        close(fd);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Round trips                                                                              */
/* ---------------------------------------------------------------------------------------- */

static unsigned g_round; /* makes key names unique per measurement */

/*
 * One connection's SET+GET request, built once: SET key = value, then GET key, sent in one
 * write (SET has no reply, so one request is outstanding). The value's first 8 bytes carry a
 * sequence number, patched per round trip, that the GET reply must echo.
 */
struct rt_req {
    uint8_t *buf;
    size_t len;
    size_t seq_off; /* offset of the value's sequence number in buf */
};

static void rt_req_build(struct rt_req *r, const struct gen *g, size_t vsize, unsigned conn)
{
    char key[96];
    uint8_t *val = xmalloc(vsize);
    rdzv__wbuf w = {0};

    snprintf(key, sizeof(key), "/bench/rt/%s/%u/%zu/%u", g->name, g_round, vsize, conn);
    for (size_t i = 0; i < vsize; i++)
        val[i] = (uint8_t)(i * 31u + conn);
    frame_set(&w, g, key, val, vsize);
    r->seq_off = w.len - vsize;
    frame_get(&w, g, key);
    built(&w);
    r->buf = w.data; /* ours now: freed with free() */
    r->len = w.len;
    free(val);
}

/* Checks a complete GET reply (8-byte length, value) against the request's value. */
static int rt_check(const struct rt_req *r, const uint8_t *reply, size_t vsize, unsigned conn)
{
    uint64_t len = rdzv__ld64(reply), want = rdzv__ld64(r->buf + r->seq_off);
    uint64_t got = rdzv__ld64(reply + 8);
    if (len != vsize)
        return fail(-EPROTO, "connection %u: GET returned %llu bytes, expected %zu", conn,
                    (unsigned long long)len, vsize);
    if (got != want)
        return fail(-EPROTO, "connection %u: GET returned sequence %llu, expected %llu", conn,
                    (unsigned long long)got, (unsigned long long)want);
    /* The tail is fixed per connection; compare its last bytes, cheap even for 1 MiB. */
    if (memcmp(reply + 8 + vsize - 8, r->buf + r->seq_off + vsize - 8, 8) != 0)
        return fail(-EPROTO, "connection %u: GET returned a value with the wrong tail", conn);
    return 0;
}

struct rt_timing {
    uint64_t warm_ns, run_ns;
};

/* One run's figures; CPU times are per round trip, -1 when the server's could not be read. */
struct rt_result {
    double rate;   /* round trips per second */
    double us;     /* mean wall time per round trip (meaningful for one connection) */
    double srv_us; /* server CPU time per round trip */
    double cli_us; /* client (this thread) CPU time per round trip */
};

/* Fills res from the counted window's totals. */
static void rt_result_set(struct rt_result *res, uint64_t count, uint64_t wall_ns, int64_t srv0,
                          int64_t srv1, int64_t cli0, int64_t cli1)
{
    res->rate = (double)count * 1e9 / (double)wall_ns;
    res->us = (double)wall_ns / 1e3 / (double)count;
    res->srv_us = srv0 < 0 || srv1 < 0 ? -1 : (double)(srv1 - srv0) / 1e3 / (double)count;
    res->cli_us = (double)(cli1 - cli0) / 1e3 / (double)count;
}

/*
 * SET+GET round trips on one blocking connection for warm_ns, then counted for run_ns. On
 * success fills *res; srv_pid is the server process, for its CPU time.
 */
static int rt_single(int port, pid_t srv_pid, const struct gen *g, size_t vsize,
                     const struct rt_timing *t, struct rt_result *res)
{
    struct rt_req r = {0};
    uint8_t *reply = xmalloc(8 + vsize);
    uint64_t seq = 0, count = 0, t0, start = 0, end;
    int64_t srv0 = -1, cli0 = 0;
    bool counting = false;
    int fd, rc;

    g_round++;
    rt_req_build(&r, g, vsize, 0);
    fd = conn_open(port, g);
    if (fd < 0) {
        rc = fd;
        goto out;
    }
    t0 = now_ns();
    for (;;) {
        seq++;
        memcpy(r.buf + r.seq_off, &seq, 8);
        rc = send_all(fd, r.buf, r.len);
        if (rc == 0)
            rc = recv_all(fd, reply, 8 + vsize, "waiting for the GET reply");
        if (rc == 0)
            rc = rt_check(&r, reply, vsize, 0);
        if (rc < 0)
            goto out;
        end = now_ns();
        if (counting) {
            count++;
            if (end - start >= t->run_ns)
                break;
        } else if (end - t0 >= t->warm_ns) {
            counting = true;
            srv0 = proc_cpu_ns(srv_pid);
            cli0 = self_cpu_ns();
            start = now_ns();
        }
    }
    rt_result_set(res, count, end - start, srv0, proc_cpu_ns(srv_pid), cli0, self_cpu_ns());
    rc = 0;
out:
    if (fd >= 0)
        close(fd);
    free(r.buf);
    free(reply);
    return rc;
}

struct rt_conn {
    int fd;
    bool sending; /* request partly written; else waiting for the reply or idle */
    bool want_out;
    bool idle;
    size_t wpos, rpos;
    struct rt_req req;
    uint8_t *reply;
};

/* Writes what is left of c's request; subscribes to EPOLLOUT while the socket is full. */
static int rt_conn_write(int ep, struct rt_conn *c, unsigned idx)
{
    while (c->wpos < c->req.len) {
        ssize_t n =
            send(c->fd, c->req.buf + c->wpos, c->req.len - c->wpos, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                return fail(-errno, "connection %u: send: %s", idx, strerror(errno));
            if (!c->want_out) {
                struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.u32 = idx};
                epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
                c->want_out = true;
            }
            return 0;
        }
        c->wpos += (size_t)n;
    }
    if (c->want_out) {
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = idx};
        epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
        c->want_out = false;
    }
    c->sending = false;
    c->rpos = 0;
    return 0;
}

static int rt_conn_issue(int ep, struct rt_conn *c, unsigned idx, uint64_t seq)
{
    memcpy(c->req.buf + c->req.seq_off, &seq, 8);
    c->sending = true;
    c->idle = false;
    c->wpos = 0;
    return rt_conn_write(ep, c, idx);
}

/*
 * SET+GET round trips on nconn non-blocking connections driven by one epoll loop, one request
 * outstanding per connection. Warm-up, then completions are counted between two batch
 * boundaries at least run_ns apart; in-flight requests are drained before closing.
 */
static int rt_multi(int port, pid_t srv_pid, const struct gen *g, unsigned nconn, size_t vsize,
                    const struct rt_timing *t, struct rt_result *res)
{
    struct rt_conn *cs = calloc(nconn, sizeof(*cs));
    struct epoll_event evs[64];
    uint64_t seq = 0, done = 0, done0 = 0, t0, start = 0, end = 0;
    int64_t srv0 = -1, cli0 = 0;
    unsigned inflight = 0;
    int phase = 0; /* 0 warm-up, 1 counting, 2 draining */
    int ep = -1, rc = 0;

    if (!cs)
        return fail(-ENOMEM, "out of memory");
    g_round++;
    for (unsigned i = 0; i < nconn; i++)
        cs[i].fd = -1;
    ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) {
        rc = fail(-errno, "epoll_create1: %s", strerror(errno));
        goto out;
    }
    for (unsigned i = 0; i < nconn; i++) {
        struct rt_conn *c = &cs[i];
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = i};
        rt_req_build(&c->req, g, vsize, i);
        c->reply = xmalloc(8 + vsize);
        c->fd = conn_open(port, g);
        if (c->fd < 0) {
            rc = c->fd;
            goto out;
        }
        fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
        epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
    }
    t0 = now_ns();
    for (unsigned i = 0; i < nconn; i++) {
        rc = rt_conn_issue(ep, &cs[i], i, ++seq);
        if (rc < 0)
            goto out;
        inflight++;
    }
    while (inflight) {
        int n = epoll_wait(ep, evs, 64, IO_TIMEOUT_MS);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = fail(-errno, "epoll_wait: %s", strerror(errno));
            goto out;
        }
        if (n == 0) {
            unsigned s = 0;
            for (unsigned i = 0; i < nconn; i++)
                s += cs[i].sending;
            rc = fail(-ETIMEDOUT,
                      "no reply on any of %u connections for %d ms (%u still sending, "
                      "%llu round trips done)",
                      inflight, IO_TIMEOUT_MS, s, (unsigned long long)done);
            goto out;
        }
        for (int k = 0; k < n; k++) {
            unsigned idx = evs[k].data.u32;
            struct rt_conn *c = &cs[idx];
            size_t need = 8 + vsize;
            if (c->sending) {
                if (evs[k].events & (EPOLLOUT | EPOLLERR | EPOLLHUP))
                    rc = rt_conn_write(ep, c, idx);
                if (rc < 0)
                    goto out;
                continue;
            }
            while (!c->idle && c->rpos < need) {
                ssize_t r = recv(c->fd, c->reply + c->rpos, need - c->rpos, MSG_DONTWAIT);
                if (r == 0) {
                    rc = fail(-EPROTO,
                              "connection %u: server closed it while a GET reply was due "
                              "(%zu of %zu bytes)",
                              idx, c->rpos, need);
                    goto out;
                }
                if (r < 0) {
                    if (errno == EINTR)
                        continue;
                    if (errno == EAGAIN || errno == EWOULDBLOCK)
                        break;
                    rc = fail(-errno, "connection %u: recv: %s", idx, strerror(errno));
                    goto out;
                }
                c->rpos += (size_t)r;
                if (c->rpos >= 8 && rdzv__ld64(c->reply) != vsize) {
                    rc = fail(-EPROTO, "connection %u: GET returned %llu bytes, expected %zu", idx,
                              (unsigned long long)rdzv__ld64(c->reply), vsize);
                    goto out;
                }
            }
            if (c->idle || c->rpos < need)
                continue;
            rc = rt_check(&c->req, c->reply, vsize, idx);
            if (rc < 0)
                goto out;
            done++;
            if (phase == 2) {
                c->idle = true;
                inflight--;
                continue;
            }
            rc = rt_conn_issue(ep, c, idx, ++seq);
            if (rc < 0)
                goto out;
        }
        /* The clock is read once per batch; the batch is short next to run_ns. */
        if (phase < 2) {
            uint64_t now = now_ns();
            if (phase == 0 && now - t0 >= t->warm_ns) {
                phase = 1;
                srv0 = proc_cpu_ns(srv_pid);
                cli0 = self_cpu_ns();
                start = now_ns();
                done0 = done;
            } else if (phase == 1 && now - start >= t->run_ns) {
                phase = 2;
                end = now;
                rt_result_set(res, done - done0, end - start, srv0, proc_cpu_ns(srv_pid), cli0,
                              self_cpu_ns());
            }
        }
    }
    rc = 0;
out:
    for (unsigned i = 0; i < nconn; i++) {
        if (cs[i].fd >= 0)
            close(cs[i].fd);
        free(cs[i].req.buf);
        free(cs[i].reply);
    }
    if (ep >= 0)
        close(ep);
    free(cs);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* N-connection barrier                                                                     */
/* ---------------------------------------------------------------------------------------- */

enum bstate {
    B_HELLO,    /* connecting; (VALIDATE +) ADD to be written */
    B_ADDING,   /* waiting for the 8-byte ADD reply */
    B_WAIT_OUT, /* WAIT (or SET + WAIT) to be written */
    B_WAITING,  /* waiting for STOP_WAITING */
    B_RELEASED,
};

static const char *bstate_name(enum bstate s)
{
    static const char *const names[] = {"connecting", "waiting for ADD's reply", "sending WAIT",
                                        "waiting for STOP_WAITING", "released"};
    return names[s];
}

struct bconn {
    int fd;
    uint8_t state;
    uint8_t rpos;
    uint16_t wpos, wlen;
    const uint8_t *wbuf;
    uint8_t reply[8];
};

struct barrier {
    const struct gen *g;
    unsigned n;
    int ep;
    struct bconn *cs;
    uint8_t *seen; /* ADD results 1..n seen */
    unsigned opened, connected, added, released;
    uint8_t hello[128], waitf[128], setwait[256];
    size_t hello_len, waitf_len, setwait_len;
    uint64_t t0, t_connected, t_added, t_released;
};

/* Writes what is left of c's pending frame; on completion advances its state. */
static int barrier_write(struct barrier *b, struct bconn *c, unsigned idx)
{
    while (c->wpos < c->wlen) {
        ssize_t n = send(c->fd, c->wbuf + c->wpos, c->wlen - c->wpos, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            /* EAGAIN: still connecting, or full; EPOLLOUT's edge brings us back. */
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOTCONN)
                return 0;
            return fail(-errno, "connection %u: send while %s: %s", idx, bstate_name(c->state),
                        strerror(errno));
        }
        c->wpos += (uint16_t)n;
    }
    if (c->state == B_HELLO) {
        c->state = B_ADDING;
        if (++b->connected == b->n)
            b->t_connected = now_ns();
    } else if (c->state == B_WAIT_OUT) {
        c->state = B_WAITING;
    }
    c->rpos = 0;
    return 0;
}

static int barrier_read(struct barrier *b, struct bconn *c, unsigned idx)
{
    size_t need = c->state == B_ADDING ? 8 : c->state == B_WAITING ? 1 : 0;
    uint8_t junk[64];

    if (!need) {
        /* Nothing is due in this state: data or EOF here is a protocol error. */
        ssize_t r = recv(c->fd, junk, sizeof(junk), MSG_DONTWAIT);
        if (r == 0)
            return fail(-EPROTO, "connection %u: server closed it while %s", idx,
                        bstate_name(c->state));
        if (r > 0)
            return fail(-EPROTO, "connection %u: %zd unexpected bytes while %s", idx, r,
                        bstate_name(c->state));
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ENOTCONN)
            return 0;
        return fail(-errno, "connection %u: recv while %s: %s", idx, bstate_name(c->state),
                    strerror(errno));
    }
    while (c->rpos < need) {
        ssize_t r = recv(c->fd, c->reply + c->rpos, need - c->rpos, MSG_DONTWAIT);
        if (r == 0)
            return fail(-EPROTO, "connection %u: server closed it while %s", idx,
                        bstate_name(c->state));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            return fail(-errno, "connection %u: recv while %s: %s", idx, bstate_name(c->state),
                        strerror(errno));
        }
        c->rpos += (uint8_t)r;
    }
    if (c->state == B_ADDING) {
        int64_t v = (int64_t)rdzv__ld64(c->reply);
        if (v < 1 || v > (int64_t)b->n || b->seen[v])
            return fail(-EPROTO, "connection %u: ADD returned %lld (%s; %u replies so far)", idx,
                        (long long)v, v < 1 || v > (int64_t)b->n ? "out of 1..N" : "a duplicate",
                        b->added);
        b->seen[v] = 1;
        if (++b->added == b->n)
            b->t_added = now_ns();
        /* The last arrival releases everyone: SET "done", then its own WAIT. */
        c->wbuf = v == (int64_t)b->n ? b->setwait : b->waitf;
        c->wlen = (uint16_t)(v == (int64_t)b->n ? b->setwait_len : b->waitf_len);
        c->wpos = 0;
        c->state = B_WAIT_OUT;
        return barrier_write(b, c, idx);
    }
    if (c->reply[0] != RDZV_WAIT_STOP_WAITING)
        return fail(-EPROTO, "connection %u: WAIT answered %u, expected STOP_WAITING (0)", idx,
                    c->reply[0]);
    c->state = B_RELEASED;
    if (++b->released == b->n)
        b->t_released = now_ns();
    return 0;
}

/* Handles the events that are ready, waiting at most timeout_ms for the first. */
static int barrier_pump(struct barrier *b, int timeout_ms)
{
    struct epoll_event evs[256];
    int n = epoll_wait(b->ep, evs, 256, timeout_ms);

    if (n < 0)
        return errno == EINTR ? 0 : fail(-errno, "epoll_wait: %s", strerror(errno));
    for (int k = 0; k < n; k++) {
        unsigned idx = evs[k].data.u32;
        struct bconn *c = &b->cs[idx];
        uint32_t e = evs[k].events;
        int rc = 0;

        if (c->state == B_RELEASED)
            continue;
        if (e & EPOLLERR) {
            int err = 0;
            socklen_t len = sizeof(err);
            getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
            if (err)
                return fail(-err, "connection %u: %s while %s", idx, strerror(err),
                            bstate_name(c->state));
        }
        if ((e & EPOLLOUT) && (c->state == B_HELLO || c->state == B_WAIT_OUT))
            rc = barrier_write(b, c, idx);
        if (rc == 0 && (e & (EPOLLIN | EPOLLHUP | EPOLLRDHUP)))
            rc = barrier_read(b, c, idx);
        if (rc < 0)
            return rc;
    }
    return n;
}

/* Reads TcpExt ListenOverflows + ListenDrops from /proc/net/netstat; -1 when unavailable. */
static long long listen_drops(void)
{
    char names[4096], vals[4096];
    long long total = -1;
    FILE *f = fopen("/proc/net/netstat", "r");

    if (!f)
        return -1;
    while (fgets(names, sizeof(names), f) && fgets(vals, sizeof(vals), f)) {
        char *sn, *sv, *tn, *tv;
        if (strncmp(names, "TcpExt:", 7) != 0)
            continue;
        tn = strtok_r(names, " \n", &sn);
        tv = strtok_r(vals, " \n", &sv);
        while ((tn = strtok_r(NULL, " \n", &sn)) && (tv = strtok_r(NULL, " \n", &sv))) {
            if (strcmp(tn, "ListenOverflows") == 0 || strcmp(tn, "ListenDrops") == 0)
                total = (total < 0 ? 0 : total) + atoll(tv);
        }
    }
    fclose(f);
    return total;
}

struct barrier_result {
    double total_s, connected_s, added_s;
    double srv_cpu_s, cli_cpu_s; /* CPU time from first socket() to last release; -1 unknown */
    long long listen_drops;      /* kernel's count during the run, -1 unknown */
};

/*
 * N connections pass a barrier; all in one thread on non-blocking sockets and one epoll set
 * (edge-triggered, so each socket is registered once). Each connection connects, (modern:
 * VALIDATE,) ADDs 1 to a counter and reads the result, then WAITs for "done"; the connection
 * whose ADD returned N first SETs "done". The clock runs from the first socket() until the
 * last STOP_WAITING. Connections are opened as fast as the loop can, with events handled
 * every 64 opens, as ranks starting at once would.
 */
static int barrier_run(int port, pid_t srv_pid, const struct gen *g, unsigned n,
                       struct barrier_result *res)
{
    struct barrier b = {.g = g, .n = n, .ep = -1};
    struct sockaddr_in sa = loopback(port);
    char ctr[96], doneky[96];
    long long drops0 = listen_drops();
    int64_t srv0, cli0;
    rdzv__wbuf w;
    int rc = 0;

    g_round++;
    snprintf(ctr, sizeof(ctr), "/bench/barrier/%s/%u/%u/ctr", g->name, g_round, n);
    snprintf(doneky, sizeof(doneky), "/bench/barrier/%s/%u/%u/done", g->name, g_round, n);
    w = rdzv__wbuf_fixed(b.hello, sizeof(b.hello));
    if (g->validate)
        frame_validate(&w);
    frame_add(&w, g, ctr, 1);
    built(&w);
    b.hello_len = w.len;
    w = rdzv__wbuf_fixed(b.waitf, sizeof(b.waitf));
    frame_wait1(&w, g, doneky);
    built(&w);
    b.waitf_len = w.len;
    w = rdzv__wbuf_fixed(b.setwait, sizeof(b.setwait));
    frame_set(&w, g, doneky, "1", 1);
    frame_wait1(&w, g, doneky);
    built(&w);
    b.setwait_len = w.len;

    b.cs = calloc(n, sizeof(*b.cs));
    b.seen = calloc((size_t)n + 1, 1);
    if (!b.cs || !b.seen) {
        rc = fail(-ENOMEM, "out of memory");
        goto out;
    }
    for (unsigned i = 0; i < n; i++)
        b.cs[i].fd = -1;
    b.ep = epoll_create1(EPOLL_CLOEXEC);
    if (b.ep < 0) {
        rc = fail(-errno, "epoll_create1: %s", strerror(errno));
        goto out;
    }

    srv0 = proc_cpu_ns(srv_pid);
    cli0 = self_cpu_ns();
    b.t0 = now_ns();
    for (unsigned i = 0; i < n; i++) {
        struct bconn *c = &b.cs[i];
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
                                 .data.u32 = i};
        c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (c->fd < 0) {
            rc = fail(-errno, "socket %u: %s", i, strerror(errno));
            goto out;
        }
        b.opened++;
        set_nodelay(c->fd);
        if (epoll_ctl(b.ep, EPOLL_CTL_ADD, c->fd, &ev) < 0) {
            rc = fail(-errno, "epoll_ctl: %s", strerror(errno));
            goto out;
        }
        if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno != EINPROGRESS) {
            rc = fail(-errno, "connection %u: connect: %s", i, strerror(errno));
            goto out;
        }
        c->state = B_HELLO;
        c->wbuf = b.hello;
        c->wlen = (uint16_t)b.hello_len;
        rc = barrier_write(&b, c, i);
        if (rc == 0 && i % 64 == 63)
            rc = barrier_pump(&b, 0);
        if (rc < 0)
            goto out;
    }
    while (b.released < n) {
        uint64_t el_ms = (now_ns() - b.t0) / 1000000u;
        if (el_ms >= BARRIER_TIMEOUT_MS) {
            rc = fail(-ETIMEDOUT,
                      "barrier of %u not done after %d ms: %u connected, %u ADD replies, "
                      "%u released",
                      n, BARRIER_TIMEOUT_MS, b.connected, b.added, b.released);
            goto out;
        }
        rc = barrier_pump(&b, (int)(BARRIER_TIMEOUT_MS - el_ms));
        if (rc < 0)
            goto out;
    }
    {
        int64_t srv1 = proc_cpu_ns(srv_pid);
        res->srv_cpu_s = srv0 < 0 || srv1 < 0 ? -1 : (double)(srv1 - srv0) / 1e9;
        res->cli_cpu_s = (double)(self_cpu_ns() - cli0) / 1e9;
    }
    res->total_s = (double)(b.t_released - b.t0) / 1e9;
    res->connected_s = (double)(b.t_connected - b.t0) / 1e9;
    res->added_s = (double)(b.t_added - b.t0) / 1e9;
    res->listen_drops = drops0 < 0 ? -1 : listen_drops() - drops0;
    rc = 0;
out:
    if (b.cs) {
        for (unsigned i = 0; i < n; i++)
            if (b.cs[i].fd >= 0)
                close(b.cs[i].fd);
    }
    if (b.ep >= 0)
        close(b.ep);
    free(b.cs);
    free(b.seen);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Server processes                                                                         */
/* ---------------------------------------------------------------------------------------- */

enum { SRV_OURS, SRV_TORCH };

struct server {
    int kind;
    const char *label; /* "ddp-rendezvous", "torch" */
    char *argv[12];
    pid_t pid;
    int in_fd, out_fd, log_fd;
    bool drain_started;
    pthread_t drain;
    char log_path[256];
    int port;
    char version[96]; /* torch's second stdout line */
    bool keep_log;    /* something went wrong: leave the log for the report */
    char exit_note[160];
};

/* Copies a server's stdout into its log so a chatty server never blocks on a full pipe. */
static void *drain_main(void *arg)
{
    struct server *s = arg;
    char buf[4096];
    ssize_t n;

    while ((n = read(s->out_fd, buf, sizeof(buf))) != 0) {
        if (n < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (write(s->log_fd, buf, (size_t)n) < 0)
            break;
    }
    return NULL;
}

static unsigned g_spawned;
static int g_server_cpu = -1; /* --pin: the CPU the servers run on */

/* Restricts the calling process to one CPU; a no-op for cpu < 0. */
static void pin_to(int cpu)
{
    cpu_set_t set;
    if (cpu < 0)
        return;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof(set), &set);
}

/*
 * Starts s->argv with stdin and stdout on pipes and stderr in a log file under $TMPDIR. The
 * child dies with the bench (PR_SET_PDEATHSIG). Does not wait for it to listen.
 */
static int server_spawn(struct server *s)
{
    int in[2] = {-1, -1}, out[2] = {-1, -1};
    const char *tmp = getenv("TMPDIR");
    int rc = 0;

    s->pid = -1;
    s->in_fd = s->out_fd = s->log_fd = -1;
    s->drain_started = false;
    s->port = 0;
    s->version[0] = s->exit_note[0] = '\0';
    snprintf(s->log_path, sizeof(s->log_path), "%s/store-bench.%d.%u.%s.log",
             tmp && *tmp ? tmp : "/tmp", (int)getpid(), ++g_spawned,
             s->kind == SRV_OURS ? "ours" : "torch");
    s->log_fd = open(s->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (s->log_fd < 0)
        return fail(-errno, "%s: %s", s->log_path, strerror(errno));
    if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0) {
        rc = fail(-errno, "pipe: %s", strerror(errno));
        goto out;
    }
    s->pid = fork();
    if (s->pid < 0) {
        rc = fail(-errno, "fork: %s", strerror(errno));
        goto out;
    }
    if (s->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        pin_to(g_server_cpu);
        dup2(in[0], 0);
        dup2(out[1], 1);
        dup2(s->log_fd, 2);
        signal(SIGPIPE, SIG_DFL);
        execvp(s->argv[0], s->argv);
        dprintf(2, "store-bench: cannot execute %s: %s\n", s->argv[0], strerror(errno));
        _exit(127);
    }
    s->in_fd = in[1];
    s->out_fd = out[0];
    in[1] = out[0] = -1;
out:
    for (int i = 0; i < 2; i++) {
        if (in[i] >= 0)
            close(in[i]);
        if (out[i] >= 0)
            close(out[i]);
    }
    return rc;
}

/* The last few lines of a server's log, for an error message. */
static void log_tail(const struct server *s, char *buf, size_t size)
{
    char data[4096];
    ssize_t n = 0;
    int fd = open(s->log_path, O_RDONLY | O_CLOEXEC);
    off_t end;

    buf[0] = '\0';
    if (fd < 0)
        return;
    end = lseek(fd, 0, SEEK_END);
    if (end > (off_t)sizeof(data) - 1)
        lseek(fd, end - (off_t)sizeof(data) + 1, SEEK_SET);
    else
        lseek(fd, 0, SEEK_SET);
    n = read(fd, data, sizeof(data) - 1);
    close(fd);
    if (n <= 0)
        return;
    data[n] = '\0';
    while (n > 0 && (data[n - 1] == '\n' || data[n - 1] == ' '))
        data[--n] = '\0';
    {
        /* Keep the last 6 lines. */
        char *p = data + n;
        int lines = 0;
        while (p > data && lines < 6)
            if (*--p == '\n')
                lines++;
        snprintf(buf, size, "%.*s", (int)size - 1, p == data ? p : p + 1);
    }
}

static void describe_status(int st, char *buf, size_t size)
{
    if (WIFEXITED(st))
        snprintf(buf, size, "exited with status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(buf, size, "killed by signal %d (%s)%s", WTERMSIG(st), strsignal(WTERMSIG(st)),
                 WCOREDUMP(st) ? ", core dumped" : "");
    else
        snprintf(buf, size, "status 0x%x", st);
}

/* Last integer in a line: "12345", "port 12345", "127.0.0.1:12345". */
static int parse_port(const char *line)
{
    const char *end = line + strlen(line), *p;
    long v;
    while (end > line && (end[-1] < '0' || end[-1] > '9'))
        end--;
    p = end;
    while (p > line && p[-1] >= '0' && p[-1] <= '9')
        p--;
    if (p == end || end - p > 5)
        return -1;
    v = strtol(p, NULL, 10);
    return v > 0 && v < 65536 ? (int)v : -1;
}

/*
 * Waits until the server printed its port (and, for torch, its version line), then starts the
 * stdout drain. Returns 0; -ENOENT when torch is missing or the program cannot run (g_err
 * says which; the caller reports "skipped"); another negative errno on failure.
 */
static int server_ready(struct server *s)
{
    char line[2][256];
    size_t len = 0;
    int want = s->kind == SRV_TORCH ? 2 : 1, got = 0;
    uint64_t t0 = now_ns();

    while (got < want) {
        struct pollfd pfd = {s->out_fd, POLLIN, 0};
        int left = START_TIMEOUT_MS - (int)((now_ns() - t0) / 1000000u);
        char ch;
        ssize_t n;

        if (left <= 0 || poll(&pfd, 1, left) == 0) {
            s->keep_log = true;
            return fail(-ETIMEDOUT, "%s did not print its port within %d ms (log: %s)", s->argv[0],
                        START_TIMEOUT_MS, s->log_path);
        }
        n = read(s->out_fd, &ch, 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            char tail[1024], how[128];
            int st = 0;
            waitpid(s->pid, &st, 0);
            s->pid = -1;
            log_tail(s, tail, sizeof(tail));
            describe_status(st, how, sizeof(how));
            if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
                return fail(-ENOENT, "%s", tail[0] ? tail : how);
            if (WIFEXITED(st) && WEXITSTATUS(st) == 77)
                return fail(-ENOENT, "%s: %s", s->argv[0], tail[0] ? tail : how);
            s->keep_log = true;
            return fail(-EPROTO, "%s %s before printing its port; log %s: %s", s->argv[0], how,
                        s->log_path, tail);
        }
        if (ch == '\n' || len == sizeof(line[0]) - 1) {
            line[got][len] = '\0';
            got++;
            len = 0;
        } else {
            line[got][len++] = ch;
        }
    }
    s->port = parse_port(line[0]);
    if (s->port < 0) {
        s->keep_log = true;
        return fail(-EPROTO, "%s printed \"%s\" as its first line, not a port", s->argv[0],
                    line[0]);
    }
    if (want == 2)
        snprintf(s->version, sizeof(s->version), "%.*s", (int)sizeof(s->version) - 1, line[1]);
    if (pthread_create(&s->drain, NULL, drain_main, s) == 0)
        s->drain_started = true;
    return 0;
}

/*
 * Is the server still running? If it has exited, records how in exit_note and keeps its log.
 */
static bool server_alive(struct server *s)
{
    int st;
    if (s->pid <= 0)
        return false;
    if (waitpid(s->pid, &st, WNOHANG) == 0)
        return true;
    describe_status(st, s->exit_note, sizeof(s->exit_note));
    s->pid = -1;
    s->keep_log = true;
    return false;
}

/*
 * Stops a server: closes its stdin (torch's helper exits), sends SIGTERM, and SIGKILL after
 * 5 s. An exit other than by SIGTERM or with status 0 is recorded in exit_note. The log is
 * removed unless something went wrong.
 */
static void server_stop(struct server *s)
{
    if (s->in_fd >= 0)
        close(s->in_fd);
    s->in_fd = -1;
    if (s->pid > 0) {
        int st = 0;
        pid_t r = 0;
        kill(s->pid, SIGTERM);
        for (int i = 0; i < 500 && (r = waitpid(s->pid, &st, WNOHANG)) == 0; i++)
            sleep_ms(10);
        if (r == 0) {
            kill(s->pid, SIGKILL);
            waitpid(s->pid, &st, 0);
            snprintf(s->exit_note, sizeof(s->exit_note), "ignored SIGTERM for 5 s");
            s->keep_log = true;
        } else if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) &&
                   !(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM)) {
            describe_status(st, s->exit_note, sizeof(s->exit_note));
            s->keep_log = true;
        }
        s->pid = -1;
    }
    if (s->drain_started)
        pthread_join(s->drain, NULL);
    s->drain_started = false;
    if (s->out_fd >= 0)
        close(s->out_fd);
    s->out_fd = -1;
    if (s->log_fd >= 0) {
        close(s->log_fd);
        s->log_fd = -1;
        if (!s->keep_log)
            unlink(s->log_path);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Results                                                                                  */
/* ---------------------------------------------------------------------------------------- */

enum { CELL_NONE, CELL_OK, CELL_FAIL, CELL_SKIP };
enum unit { U_RATE, U_US, U_CPU_US, U_SEC };

struct cell {
    int state;
    double v;
    struct barrier_result br; /* barrier rows only */
    char *err;
};

struct row {
    char name[48];
    enum unit unit;
    int target;       /* 0 none, 1 ratio >= 3, 2 ours <= 25 us, 3 ours <= 0.5 s */
    struct cell c[2]; /* [SRV_OURS], [SRV_TORCH] */
};

enum {
    /* round trips per second: 1 or 32 connections, 64 B (S) or 1 MiB (L) values */
    R_RATE1_S,
    R_RATE1_L,
    R_RATE32_S,
    R_RATE32_L,
    /* wall microseconds per round trip on one connection */
    R_US1_S,
    R_US1_L,
    /* server CPU microseconds per round trip */
    R_CPU1_S,
    R_CPU1_L,
    R_CPU32_S,
    R_CPU32_L,
    R_BARRIER0,
    R_COUNT = R_BARRIER0 + MAX_BARRIERS
};

struct section {
    const struct gen *g;
    bool run[2];         /* which sides are selected */
    const char *skip[2]; /* why a side was skipped, or NULL */
    char torch_version[96];
    struct server srv[2]; /* [SRV_OURS], [SRV_TORCH] */
    struct row rows[R_COUNT];
    unsigned nrows;
};

struct config {
    const char *ours;
    const char *script;
    const char *py_legacy, *py_modern;
    bool quick, verbose, pin;
    bool only_ours, only_t113, only_t2;
    const char *json;
    unsigned barrier_n[MAX_BARRIERS];
    unsigned nbarriers;
    unsigned reps; /* runs per round-trip row and server; the best is kept */
    struct rt_timing t;
};

static int g_failures;
static char *g_notes[32]; /* failures that belong to no table cell */
static int g_nnotes;

__attribute__((format(printf, 1, 2))) static void add_note(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    g_failures++;
    if (g_nnotes < (int)(sizeof(g_notes) / sizeof(g_notes[0])))
        g_notes[g_nnotes++] = strdup(buf);
}

static void cell_fail(struct cell *c, const char *who, const struct section *sec, const char *row)
{
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s (%s) %s: %s", who, sec->g->name, row, g_err);
    c->state = CELL_FAIL;
    c->err = strdup(buf);
    g_failures++;
}

static void section_init(struct section *sec, const struct gen *g, const struct config *cfg)
{
    static const char *const rt_names[] = {
        "set+get/s, 1 conn, 64 B",      "set+get/s, 1 conn, 1 MiB",
        "set+get/s, 32 conn, 64 B",     "set+get/s, 32 conn, 1 MiB",
        "us/set+get, 1 conn, 64 B",     "us/set+get, 1 conn, 1 MiB",
        "srv CPU us/op, 1 conn, 64 B",  "srv CPU us/op, 1 conn, 1 MiB",
        "srv CPU us/op, 32 conn, 64 B", "srv CPU us/op, 32 conn, 1 MiB"};
    memset(sec, 0, sizeof(*sec));
    sec->g = g;
    for (int k = 0; k < 2; k++) {
        sec->srv[k].pid = -1;
        sec->srv[k].in_fd = sec->srv[k].out_fd = sec->srv[k].log_fd = -1;
    }
    for (unsigned i = 0; i < R_BARRIER0; i++) {
        snprintf(sec->rows[i].name, sizeof(sec->rows[i].name), "%s", rt_names[i]);
        sec->rows[i].unit = i < R_US1_S ? U_RATE : i < R_CPU1_S ? U_US : U_CPU_US;
    }
    sec->rows[R_RATE32_S].target = 1;
    sec->rows[R_US1_S].target = 2;
    for (unsigned i = 0; i < cfg->nbarriers; i++) {
        struct row *r = &sec->rows[R_BARRIER0 + i];
        snprintf(r->name, sizeof(r->name), "barrier s, %u conn", cfg->barrier_n[i]);
        r->unit = U_SEC;
        r->target = cfg->barrier_n[i] == 10000 ? 3 : 0;
    }
    sec->nrows = R_BARRIER0 + cfg->nbarriers;
}

/* Fills argv for one side of a section. */
static void server_setup(struct server *s, int kind, const struct section *sec,
                         const struct config *cfg)
{
    memset(s, 0, sizeof(*s));
    s->kind = kind;
    s->pid = -1;
    s->in_fd = s->out_fd = s->log_fd = -1;
    if (kind == SRV_OURS) {
        s->label = "ddp-rendezvous";
        s->argv[0] = (char *)cfg->ours;
        s->argv[1] = "serve";
        s->argv[2] = "--bind";
        s->argv[3] = "127.0.0.1";
        s->argv[4] = "--port";
        s->argv[5] = "0";
    } else {
        s->label = "torch";
        s->argv[0] = (char *)(sec->g == &gen_legacy ? cfg->py_legacy : cfg->py_modern);
        s->argv[1] = (char *)cfg->script;
        s->argv[2] = "--host";
        s->argv[3] = "127.0.0.1";
    }
}

/* "torch 2.15.0+cu132 libuv=1" -> major*100 + minor, or -1. */
static int torch_version_code(const char *line)
{
    int maj, min;
    if (sscanf(line, "torch %d.%d", &maj, &min) != 2)
        return -1;
    return maj * 100 + min;
}

/* Spawns the selected sides' servers without waiting for them (importing torch takes seconds). */
static void spawn_pair(struct section *sec, const struct config *cfg)
{
    for (int k = 0; k < 2; k++) {
        if (!sec->run[k] || sec->skip[k])
            continue;
        server_setup(&sec->srv[k], k, sec, cfg);
        if (server_spawn(&sec->srv[k]) < 0) {
            sec->skip[k] = strdup(g_err);
            add_note("%s (%s): cannot start: %s", sec->srv[k].label, sec->g->name, g_err);
        }
    }
}

/*
 * Waits for the spawned servers to print their ports. A side that cannot start is marked
 * skipped (torch missing, or of the wrong generation) or failed. Returns the number of sides
 * running.
 */
static int ready_pair(struct section *sec)
{
    struct server *srv = sec->srv;
    int running = 0;
    for (int k = 0; k < 2; k++) {
        int rc;
        if (!sec->run[k] || sec->skip[k])
            continue;
        rc = server_ready(&srv[k]);
        if (rc == -ENOENT) {
            sec->skip[k] = strdup(g_err);
            server_stop(&srv[k]);
            continue;
        }
        if (rc < 0) {
            char buf[700];
            snprintf(buf, sizeof(buf), "FAILED to start: %s", g_err);
            sec->skip[k] = strdup(buf);
            add_note("%s (%s): %s", srv[k].label, sec->g->name, buf);
            server_stop(&srv[k]);
            continue;
        }
        if (k == SRV_TORCH) {
            /* "torch 2.15.0 libuv=1": the version, then whether the libuv server runs. */
            char *lv = strstr(srv[k].version, " libuv=");
            bool uv = lv && lv[7] == '1';
            int code = torch_version_code(srv[k].version);
            bool legacy = code >= 0 && code < 202;
            if (lv)
                *lv = '\0';
            if (code < 0 || legacy != (sec->g == &gen_legacy)) {
                char buf[300];
                snprintf(buf, sizeof(buf), "%s has %s, which speaks the %s protocol",
                         srv[k].argv[0], srv[k].version, legacy ? "legacy" : "modern");
                sec->skip[k] = strdup(buf);
                server_stop(&srv[k]);
                continue;
            }
            snprintf(sec->torch_version, sizeof(sec->torch_version), "%.60s%s", srv[k].version,
                     uv ? " (libuv server)" : "");
        }
        running++;
    }
    return running;
}

static void stop_pair(struct section *sec)
{
    struct server *srv = sec->srv;
    for (int k = 0; k < 2; k++) {
        if (!sec->run[k] || sec->skip[k] || srv[k].pid < 0)
            continue;
        server_stop(&srv[k]);
        if (srv[k].exit_note[0])
            add_note("%s (%s): on shutdown the server %s; log kept: %s", srv[k].label, sec->g->name,
                     srv[k].exit_note, srv[k].log_path);
    }
}

/* True when side k of the section takes part in the measurement about to run. */
static bool side_on(const struct section *sec, int k)
{
    return sec->run[k] && !sec->skip[k];
}

/*
 * After a measurement: if the server died, record it in the cell (overriding a success) and
 * restart it so the remaining rows still run.
 */
static void check_alive(struct section *sec, struct server *s, struct cell *c, const char *row,
                        const struct config *cfg)
{
    char buf[2048], tail[600];
    /* After a failed run, give a crashing server a moment to be reaped, so the crash is blamed
     * on the row that caused it. */
    for (int i = 0; c->state == CELL_FAIL && i < 50 && server_alive(s); i++)
        sleep_ms(10);
    if (server_alive(s))
        return;
    log_tail(s, tail, sizeof(tail));
    if (c->state == CELL_FAIL && c->err)
        snprintf(buf, sizeof(buf), "%s; then the server %s; log %s%s%s", c->err, s->exit_note,
                 s->log_path, tail[0] ? ": " : "", tail);
    else
        snprintf(buf, sizeof(buf), "%s (%s) %s: the server %s; log %s%s%s", s->label, sec->g->name,
                 row, s->exit_note, s->log_path, tail[0] ? ": " : "", tail);
    if (c->state != CELL_FAIL)
        g_failures++;
    free(c->err);
    c->err = strdup(buf);
    c->state = CELL_FAIL;
    server_stop(s);
    server_setup(s, s->kind, sec, cfg);
    if (server_spawn(s) < 0 || server_ready(s) < 0) {
        snprintf(buf, sizeof(buf), "could not restart after a crash: %s", g_err);
        sec->skip[s->kind] = strdup(buf);
    }
}

/*
 * Runs one section's rows on its servers, which main() has started (ready_pair()). Stops them
 * at the end.
 */
static void run_section(struct section *sec, const struct config *cfg)
{
    struct server *srv = sec->srv;
    static const size_t sizes[2] = {64, MIB};

    if (!side_on(sec, 0) && !side_on(sec, 1))
        return;

    /*
     * Round trips: each row runs `reps` times, alternating the servers, and keeps each server's
     * best run, so a burst of unrelated load on the shared cores hits both alike and is
     * filtered out. A failed run ends that server's row.
     */
    for (int i = 0; i < 4; i++) {
        unsigned nconn = i < 2 ? 1 : 32;
        size_t vsize = sizes[i % 2];
        struct row *r = &sec->rows[i];
        struct row *u = nconn == 1 ? &sec->rows[R_US1_S + i] : NULL;
        struct row *cpu = &sec->rows[R_CPU1_S + i];
        for (unsigned rep = 0; rep < cfg->reps; rep++) {
            for (int k = 0; k < 2; k++) {
                struct rt_result res = {0};
                int rc;
                if (!side_on(sec, k) || r->c[k].state == CELL_FAIL)
                    continue;
                if (nconn == 1)
                    rc = rt_single(srv[k].port, srv[k].pid, sec->g, vsize, &cfg->t, &res);
                else
                    rc = rt_multi(srv[k].port, srv[k].pid, sec->g, nconn, vsize, &cfg->t, &res);
                if (rc < 0) {
                    cell_fail(&r->c[k], srv[k].label, sec, r->name);
                    if (u)
                        u->c[k].state = CELL_FAIL;
                    cpu->c[k].state = CELL_FAIL;
                } else {
                    if (r->c[k].state != CELL_OK || res.rate > r->c[k].v) {
                        r->c[k].state = CELL_OK;
                        r->c[k].v = res.rate;
                        if (u) {
                            u->c[k].state = CELL_OK;
                            u->c[k].v = res.us;
                        }
                    }
                    /* CPU per round trip: least of the runs, independently of the rate. */
                    if (res.srv_us >= 0 &&
                        (cpu->c[k].state != CELL_OK || res.srv_us < cpu->c[k].v)) {
                        cpu->c[k].state = CELL_OK;
                        cpu->c[k].v = res.srv_us;
                    }
                }
                check_alive(sec, &srv[k], &r->c[k], r->name, cfg);
                if (cfg->verbose && rc == 0)
                    fprintf(stderr,
                            "  %s %-14s %-26s run %u: %.0f/s, server CPU %.1f us, "
                            "client CPU %.1f us per round trip\n",
                            sec->g->name, srv[k].label, r->name, rep + 1, res.rate, res.srv_us,
                            res.cli_us);
                else if (cfg->verbose)
                    fprintf(stderr, "  %s %-14s %-26s run %u: FAILED\n", sec->g->name, srv[k].label,
                            r->name, rep + 1);
            }
        }
    }

    /* Barriers: a fresh pair of servers per N, except in --quick (distinct keys suffice). */
    for (unsigned b = 0; b < cfg->nbarriers; b++) {
        struct row *r = &sec->rows[R_BARRIER0 + b];
        unsigned n = cfg->barrier_n[b];
        struct rlimit rl;
        if (!cfg->quick) {
            stop_pair(sec);
            spawn_pair(sec, cfg);
            if (ready_pair(sec) == 0)
                return;
        }
        getrlimit(RLIMIT_NOFILE, &rl);
        for (int k = 0; k < 2; k++) {
            int rc;
            if (!side_on(sec, k))
                continue;
            if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < (rlim_t)n + 64) {
                r->c[k].state = CELL_SKIP;
                continue;
            }
            rc = barrier_run(srv[k].port, srv[k].pid, sec->g, n, &r->c[k].br);
            if (rc == 0) {
                r->c[k].state = CELL_OK;
                r->c[k].v = r->c[k].br.total_s;
            } else {
                cell_fail(&r->c[k], srv[k].label, sec, r->name);
            }
            check_alive(sec, &srv[k], &r->c[k], r->name, cfg);
            if (cfg->verbose && rc == 0)
                fprintf(stderr,
                        "  %s %-14s barrier %5u: all connected %.3f s, all ADDs %.3f s, "
                        "released %.3f s, listen queue drops %lld; CPU: server %.3f s, "
                        "client %.3f s\n",
                        sec->g->name, srv[k].label, n, r->c[k].br.connected_s, r->c[k].br.added_s,
                        r->c[k].br.total_s, r->c[k].br.listen_drops, r->c[k].br.srv_cpu_s,
                        r->c[k].br.cli_cpu_s);
        }
    }
    stop_pair(sec);
}

/* 1234567.8 -> "1,234,568" */
static void fmt_thousands(char *buf, size_t size, double v)
{
    char digits[32];
    size_t n, j = 0;
    snprintf(digits, sizeof(digits), "%.0f", v);
    n = strlen(digits);
    for (size_t i = 0; i < n && j + 2 < size; i++) {
        buf[j++] = digits[i];
        if (n - i - 1 > 0 && (n - i - 1) % 3 == 0)
            buf[j++] = ',';
    }
    buf[j] = '\0';
}

static void fmt_cell(char *buf, size_t size, const struct cell *c, enum unit u)
{
    switch (c->state) {
    case CELL_NONE:
        snprintf(buf, size, "-");
        return;
    case CELL_FAIL:
        snprintf(buf, size, "FAILED");
        return;
    case CELL_SKIP:
        snprintf(buf, size, "skipped");
        return;
    }
    if (u == U_RATE)
        fmt_thousands(buf, size, c->v);
    else if (u == U_US || u == U_CPU_US)
        snprintf(buf, size, "%.1f", c->v);
    else
        snprintf(buf, size, "%.3f", c->v);
}

/* ours/torch for rates, torch/ours for times; 0 when either is missing. */
static double row_ratio(const struct row *r)
{
    const struct cell *o = &r->c[SRV_OURS], *t = &r->c[SRV_TORCH];
    if (o->state != CELL_OK || t->state != CELL_OK || o->v <= 0 || t->v <= 0)
        return 0;
    return r->unit == U_RATE ? o->v / t->v : t->v / o->v;
}

static void fmt_target(char *buf, size_t size, const struct row *r)
{
    const struct cell *o = &r->c[SRV_OURS];
    double ratio = row_ratio(r);
    buf[0] = '\0';
    switch (r->target) {
    case 1:
        if (ratio > 0)
            snprintf(buf, size, ">= 3x: %s", ratio >= 3 ? "met" : "MISSED");
        else
            snprintf(buf, size, ">= 3x");
        break;
    case 2:
        if (o->state == CELL_OK)
            snprintf(buf, size, "<= 25 us: %s", o->v <= 25 ? "met" : "MISSED");
        else
            snprintf(buf, size, "<= 25 us");
        break;
    case 3:
        if (o->state == CELL_OK)
            snprintf(buf, size, "<= 0.5 s: %s", o->v <= 0.5 ? "met" : "MISSED");
        else
            snprintf(buf, size, "<= 0.5 s");
        break;
    }
}

static void print_section(const struct section *sec, const struct config *cfg)
{
    const char *torch_name = sec->g == &gen_legacy ? "torch 1.13" : "torch 2.x";
    printf("\n%s protocol: ddp-rendezvous vs %s\n", sec->g->name,
           sec->torch_version[0] ? sec->torch_version : torch_name);
    for (int k = 0; k < 2; k++) {
        if (sec->run[k] && sec->skip[k])
            printf("  %s skipped: %s\n", k == SRV_OURS ? "ddp-rendezvous" : torch_name,
                   sec->skip[k]);
    }
    printf("  %-30s %15s %15s %13s  %s\n", "measurement", "ddp-rendezvous", "torch", "ratio",
           "target");
    for (unsigned i = 0; i < sec->nrows; i++) {
        const struct row *r = &sec->rows[i];
        char a[32], b[32], ratio[32] = "-", tgt[48];
        double x = row_ratio(r);
        fmt_cell(a, sizeof(a), &r->c[SRV_OURS], r->unit);
        fmt_cell(b, sizeof(b), &r->c[SRV_TORCH], r->unit);
        if (x > 0)
            snprintf(ratio, sizeof(ratio),
                     r->unit == U_RATE     ? "%.2fx"
                     : r->unit == U_CPU_US ? "%.2fx less"
                                           : "%.2fx faster",
                     x);
        fmt_target(tgt, sizeof(tgt), r);
        printf("  %-30s %15s %15s %13s  %s\n", r->name, a, b, ratio, tgt);
    }
    (void)cfg;
}

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static int write_json(const char *path, const struct section *secs, int nsec,
                      const struct config *cfg)
{
    static const char *const units[] = {"round_trips_per_s", "us", "server_cpu_us_per_round_trip",
                                        "s"};
    FILE *f = fopen(path, "w");
    bool first = true;
    if (!f)
        return -errno;
    fprintf(f, "{\"quick\": %s, \"cpus\": %ld, \"results\": [\n", cfg->quick ? "true" : "false",
            sysconf(_SC_NPROCESSORS_ONLN));
    for (int s = 0; s < nsec; s++) {
        for (unsigned i = 0; i < secs[s].nrows; i++) {
            const struct row *r = &secs[s].rows[i];
            bool barrier = r->unit == U_SEC;
            double x = row_ratio(r);
            fprintf(f, "%s  {\"generation\": \"%s\", \"measurement\": ", first ? "" : ",\n",
                    secs[s].g->name);
            json_str(f, r->name);
            fprintf(f, ", \"unit\": \"%s\", \"torch_version\": ", units[r->unit]);
            json_str(f, secs[s].torch_version);
            fprintf(f, ", \"ddp_rendezvous\": ");
            if (r->c[SRV_OURS].state == CELL_OK)
                fprintf(f, "%.6g", r->c[SRV_OURS].v);
            else
                fprintf(f, "null");
            fprintf(f, ", \"torch\": ");
            if (r->c[SRV_TORCH].state == CELL_OK)
                fprintf(f, "%.6g", r->c[SRV_TORCH].v);
            else
                fprintf(f, "null");
            if (x > 0)
                fprintf(f, ", \"ratio\": %.4g", x);
            else
                fprintf(f, ", \"ratio\": null");
            if (barrier) {
                for (int k = 0; k < 2; k++) {
                    const struct cell *c = &r->c[k];
                    if (c->state != CELL_OK)
                        continue;
                    fprintf(f,
                            ", \"%s_phases\": {\"all_connected_s\": %.6g, \"all_added_s\": "
                            "%.6g, \"listen_drops\": %lld, \"server_cpu_s\": %.6g, "
                            "\"client_cpu_s\": %.6g}",
                            k == SRV_OURS ? "ddp_rendezvous" : "torch", c->br.connected_s,
                            c->br.added_s, c->br.listen_drops, c->br.srv_cpu_s, c->br.cli_cpu_s);
                }
            }
            for (int k = 0; k < 2; k++) {
                if (r->c[k].err) {
                    fprintf(f, ", \"%s_error\": ", k == SRV_OURS ? "ddp_rendezvous" : "torch");
                    json_str(f, r->c[k].err);
                }
            }
            fprintf(f, "}");
            first = false;
        }
    }
    fprintf(f, "\n], \"notes\": [");
    for (int i = 0; i < g_nnotes; i++) {
        fprintf(f, "%s", i ? ", " : "");
        json_str(f, g_notes[i]);
    }
    fprintf(f, "]}\n");
    return fclose(f) == 0 ? 0 : -errno;
}

/*
 * CPU time spent by the whole machine (all CPUs, busy states only) and by this process and its
 * reaped children, in seconds. Their difference over a run is what unrelated processes took
 * from the shared cores (approximately: softirq work done for our sockets lands there too).
 */
static double machine_busy_s(void)
{
    unsigned long long v[8] = {0};
    FILE *f = fopen("/proc/stat", "r");
    int n;
    if (!f)
        return -1;
    n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4],
               &v[5], &v[6], &v[7]);
    fclose(f);
    if (n < 7)
        return -1;
    /* user, nice, system, irq, softirq; not idle, iowait or steal */
    return (double)(v[0] + v[1] + v[2] + v[5] + v[6]) / (double)sysconf(_SC_CLK_TCK);
}

static double own_cpu_s(void)
{
    struct rusage self, kids;
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_CHILDREN, &kids);
    return (double)(self.ru_utime.tv_sec + self.ru_stime.tv_sec + kids.ru_utime.tv_sec +
                    kids.ru_stime.tv_sec) +
           (double)(self.ru_utime.tv_usec + self.ru_stime.tv_usec + kids.ru_utime.tv_usec +
                    kids.ru_stime.tv_usec) /
               1e6;
}

/* ---------------------------------------------------------------------------------------- */
/* Options                                                                                  */
/* ---------------------------------------------------------------------------------------- */

enum {
    OPT_SERVER,
    OPT_QUICK,
    OPT_ONLY,
    OPT_JSON,
    OPT_REPS,
    OPT_PY_LEGACY,
    OPT_PY_MODERN,
    OPT_SCRIPT,
    OPT_PIN,
    OPT_VERBOSE,
    OPT_HELP
};

/* The option table (cli.h): the parser below and usage() both walk it. */
static const cli_option g_options[] = {
    {OPT_SERVER,
     {"--server"},
     "PATH",
     NULL,
     0,
     "ddp-rendezvous binary (default: ../rendezvous/ddp-rendezvous next to this program)"},
    {OPT_QUICK,
     {"--quick"},
     NULL,
     NULL,
     0,
     "smoke run: short timings, barriers of 100 and 400 only (< 10 s)"},
    {OPT_ONLY, {"--only"}, "WHICH", NULL, 0, "run only ours, torch113 or torch2"},
    {OPT_JSON, {"--json"}, "FILE", NULL, 0, "also write the results as JSON"},
    {OPT_REPS,
     {"--reps"},
     "N",
     NULL,
     0,
     "runs per round-trip row and server, best kept (default 3, --quick 1)"},
    {OPT_PY_LEGACY,
     {"--python-legacy"},
     "PATH",
     NULL,
     0,
     "interpreter with torch 1.x (default /usr/bin/python3)"},
    {OPT_PY_MODERN,
     {"--python-modern"},
     "PATH",
     NULL,
     0,
     "interpreter with torch >= 2.2 (default python3 from PATH)"},
    {OPT_SCRIPT,
     {"--script"},
     "PATH",
     NULL,
     0,
     "torch_store_server.py (default " STORE_BENCH_SCRIPT ")"},
    {OPT_PIN, {"--pin"}, NULL, NULL, 0, "run the client on CPU 0 and every server on CPU 1"},
    {OPT_VERBOSE, {"-v", "--verbose"}, NULL, NULL, 0, "progress and barrier phase times on stderr"},
    {OPT_HELP, {"-h", "--help"}, NULL, NULL, 0, "this text"},
};
#define NOPTIONS (sizeof(g_options) / sizeof(g_options[0]))

static void usage(FILE *f)
{
    fprintf(f, "usage: store-bench [options]\n"
               "Compares ddp-rendezvous's store server with PyTorch's TCPStore servers.\n\n");
    for (size_t i = 0; i < NOPTIONS; i++)
        cli_print_option(f, &g_options[i], NULL, 25, 0);
    fprintf(f, "\nExit status: 0 all selected measurements ran, 1 a server failed or misbehaved,"
               " 2 bad usage.\n");
}

/* The default ddp-rendezvous: the build tree's rendezvous/ next to bench/. */
static char *default_server(void)
{
    char exe[PATH_MAX], *slash, *path;
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return NULL;
    exe[n] = '\0';
    slash = strrchr(exe, '/');
    if (!slash)
        return NULL;
    *slash = '\0';
    path = xmalloc(strlen(exe) + 64);
    sprintf(path, "%s/../rendezvous/ddp-rendezvous", exe);
    return path;
}

static int parse_args(int argc, char **argv, struct config *cfg)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int k = cli_find(g_options, NOPTIONS, a, strlen(a), 0);
        if (k < 0) {
            fprintf(stderr, "store-bench: unknown option %s (see --help)\n", a);
            return -EINVAL;
        }
        const cli_option *o = &g_options[k];
        if (o->metavar && !v) {
            fprintf(stderr, "store-bench: %s needs an argument\n", a);
            return -EINVAL;
        }
        switch (o->id) {
        case OPT_HELP:
            usage(stdout);
            exit(0);
        case OPT_QUICK:
            cfg->quick = true;
            break;
        case OPT_PIN:
            cfg->pin = true;
            break;
        case OPT_VERBOSE:
            cfg->verbose = true;
            break;
        case OPT_SERVER:
            cfg->ours = v;
            break;
        case OPT_JSON:
            cfg->json = v;
            break;
        case OPT_PY_LEGACY:
            cfg->py_legacy = v;
            break;
        case OPT_PY_MODERN:
            cfg->py_modern = v;
            break;
        case OPT_SCRIPT:
            cfg->script = v;
            break;
        case OPT_REPS: {
            int n;
            if (cli_report(stderr, "store-bench", cli_parse_int(a, v, 1, 100, &n)) < 0)
                return -EINVAL;
            cfg->reps = (unsigned)n;
            break;
        }
        case OPT_ONLY:
            if (strcmp(v, "ours") == 0)
                cfg->only_ours = true;
            else if (strcmp(v, "torch113") == 0)
                cfg->only_t113 = true;
            else if (strcmp(v, "torch2") == 0)
                cfg->only_t2 = true;
            else {
                fprintf(stderr, "store-bench: --only takes ours, torch113 or torch2\n");
                return -EINVAL;
            }
            break;
        }
        if (o->metavar)
            i++;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct config cfg = {
        .script = STORE_BENCH_SCRIPT,
        .py_legacy = "/usr/bin/python3",
        .py_modern = "python3",
    };
    struct section secs[2];
    struct rlimit rl;
    bool any_only;
    char *def = NULL;
    const char *ours_skip = NULL;
    double busy0, own0;
    uint64_t wall0;

    if (parse_args(argc, argv, &cfg) < 0)
        return 2;
    any_only = cfg.only_ours || cfg.only_t113 || cfg.only_t2;
    if (cfg.quick) {
        cfg.reps = cfg.reps ? cfg.reps : 1;
        cfg.t = (struct rt_timing){30 * 1000000ull, 100 * 1000000ull};
        cfg.barrier_n[0] = 100;
        cfg.barrier_n[1] = 400;
        cfg.nbarriers = 2;
    } else {
        cfg.reps = cfg.reps ? cfg.reps : 3;
        cfg.t = (struct rt_timing){200 * 1000000ull, 500 * 1000000ull};
        cfg.barrier_n[0] = 1000;
        cfg.barrier_n[1] = 4000;
        cfg.barrier_n[2] = 10000;
        cfg.nbarriers = 3;
    }
    if (!cfg.ours)
        cfg.ours = def = default_server();
    if (!cfg.ours || access(cfg.ours, X_OK) != 0)
        ours_skip = "ddp-rendezvous not found or not executable (give --server PATH)";
    if (access(cfg.script, R_OK) != 0) {
        fprintf(stderr, "store-bench: %s: %s (give --script PATH)\n", cfg.script, strerror(errno));
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    if (cfg.pin) {
        if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
            fprintf(stderr, "store-bench: --pin needs two CPUs\n");
            return 2;
        }
        g_server_cpu = 1;
        pin_to(0);
    }
    /* The barrier holds N sockets at once. */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }

    if (cfg.pin)
        printf("store-bench%s: loopback, client pinned to CPU 0, servers to CPU 1\n",
               cfg.quick ? " --quick" : "");
    else
        printf("store-bench%s: loopback, %ld CPUs shared by the client and the server under "
               "test\n",
               cfg.quick ? " --quick" : "", sysconf(_SC_NPROCESSORS_ONLN));
    printf("ours: %s serve\n", cfg.ours ? cfg.ours : "(none)");
    printf("round trips: best of %u x (%.2f s warm-up + %.2f s counted) per row and server; "
           "barriers: %s\n",
           cfg.reps, (double)cfg.t.warm_ns / 1e9, (double)cfg.t.run_ns / 1e9,
           cfg.quick ? "one server for all N, distinct keys" : "fresh servers per N");
    fflush(stdout);
    busy0 = machine_busy_s();
    own0 = own_cpu_s();
    wall0 = now_ns();

    section_init(&secs[0], &gen_legacy, &cfg);
    section_init(&secs[1], &gen_modern, &cfg);
    for (int s = 0; s < 2; s++) {
        secs[s].run[SRV_OURS] = !any_only || cfg.only_ours;
        secs[s].skip[SRV_OURS] = ours_skip;
    }
    secs[0].run[SRV_TORCH] = !any_only || cfg.only_t113;
    secs[1].run[SRV_TORCH] = !any_only || cfg.only_t2;

    /* Start every server at once: importing torch takes seconds and idle servers cost nothing. */
    for (int s = 0; s < 2; s++)
        spawn_pair(&secs[s], &cfg);
    for (int s = 0; s < 2; s++)
        ready_pair(&secs[s]);
    for (int s = 0; s < 2; s++) {
        if (!secs[s].run[0] && !secs[s].run[1])
            continue;
        run_section(&secs[s], &cfg);
        print_section(&secs[s], &cfg);
        fflush(stdout);
    }

    if (busy0 >= 0) {
        double wall = (double)(now_ns() - wall0) / 1e9;
        double other = machine_busy_s() - busy0 - (own_cpu_s() - own0);
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        if (other < 0)
            other = 0;
        printf("\nother processes used %.1f of %.1f core-seconds during the run (%.0f%%)%s\n",
               other, wall * (double)cpus, 100.0 * other / (wall * (double)cpus),
               other > 0.1 * wall * (double)cpus ? ": the cores were shared, expect noise" : "");
    }
    if (g_failures) {
        printf("\nfailures:\n");
        for (int s = 0; s < 2; s++)
            for (unsigned i = 0; i < secs[s].nrows; i++)
                for (int k = 0; k < 2; k++)
                    if (secs[s].rows[i].c[k].err)
                        printf("  %s\n", secs[s].rows[i].c[k].err);
        for (int i = 0; i < g_nnotes; i++)
            printf("  %s\n", g_notes[i]);
    }
    if (cfg.json) {
        int rc = write_json(cfg.json, secs, 2, &cfg);
        if (rc < 0)
            fprintf(stderr, "store-bench: %s: %s\n", cfg.json, strerror(-rc));
    }
    free(def);
    return g_failures ? 1 : 0;
}
