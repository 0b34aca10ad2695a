/*
 * barrier.c: the time for N connections to pass a barrier (barrier_run()): each connects,
 * (modern: VALIDATE,) ADDs 1 to a counter, and WAITs for a key that the last arrival SETs, all in
 * one thread on non-blocking sockets and one epoll set. Every ADD result must be unique and
 * within 1..N, every WAIT must end with STOP_WAITING.
 *
 * Not here: the server and the choice of N (section.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "store-bench.h"
#include "monoclock.h"

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

/*
 * N connections pass a barrier; all in one thread on non-blocking sockets and one epoll set
 * (edge-triggered, so each socket is registered once). Each connection connects, (modern:
 * VALIDATE,) ADDs 1 to a counter and reads the result, then WAITs for "done"; the connection
 * whose ADD returned N first SETs "done". The clock runs from the first socket() until the
 * last STOP_WAITING. Connections are opened as fast as the loop can, with events handled
 * every 64 opens, as ranks starting at once would.
 */
int barrier_run(int port, pid_t srv_pid, const struct gen *g, unsigned n,
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

    srv0 = cpu_used_ns(srv_pid);
    cli0 = thread_cpu_used_ns();
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
        int64_t srv1 = cpu_used_ns(srv_pid);
        res->srv_cpu_s = srv0 < 0 || srv1 < 0 ? -1 : (double)(srv1 - srv0) / 1e9;
        res->cli_cpu_s = (double)(thread_cpu_used_ns() - cli0) / 1e9;
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
