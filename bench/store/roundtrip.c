/*
 * roundtrip.c: SET+GET round trips per second, on one blocking connection (rt_single()) or on
 * many non-blocking ones driven by one epoll loop (rt_multi()), each reply checked against the
 * value just SET. One request is outstanding per connection; the requests are built once and
 * only their sequence numbers are patched while the clock runs.
 *
 * Not here: which rows run, how often, and against which server (section.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "store-bench.h"
#include "monoclock.h"

/* ---------------------------------------------------------------------------------------- */
/* Round trips                                                                              */
/* ---------------------------------------------------------------------------------------- */

unsigned g_round; /* makes key names unique per measurement */

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

/* Fills res from the counted window's totals. */
static void rt_result_set(struct rt_result *res, uint64_t count, uint64_t wall_ns, int64_t srv0,
                          int64_t srv1, int64_t cli0, int64_t cli1)
{
    res->rate = (double)count * 1e9 / (double)wall_ns;
    res->us = (double)wall_ns / 1e3 / (double)count;
    res->srv_us = srv0 < 0 || srv1 < 0 ? -1 : (double)(srv1 - srv0) / 1e3 / (double)count;
    res->cli_us = (double)(cli1 - cli0) / 1e3 / (double)count;
    res->px_us = -1;
}

/*
 * SET+GET round trips on one blocking connection for warm_ns, then counted for run_ns. On
 * success fills *res; srv_pid is the server process, for its CPU time.
 */
int rt_single(int port, pid_t srv_pid, const struct gen *g, size_t vsize, const struct rt_timing *t,
              struct rt_result *res)
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
            srv0 = cpu_used_ns(srv_pid);
            cli0 = thread_cpu_used_ns();
            start = now_ns();
        }
    }
    rt_result_set(res, count, end - start, srv0, cpu_used_ns(srv_pid), cli0, thread_cpu_used_ns());
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
int rt_multi(int port, pid_t srv_pid, pid_t px_pid, const struct gen *g, unsigned nconn,
             size_t vsize, const struct rt_timing *t, struct rt_result *res)
{
    struct rt_conn *cs = calloc(nconn, sizeof(*cs));
    struct epoll_event evs[64];
    uint64_t seq = 0, done = 0, done0 = 0, t0, start = 0, end = 0;
    int64_t srv0 = -1, cli0 = 0, px0 = -1;
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
                srv0 = cpu_used_ns(srv_pid);
                px0 = px_pid > 0 ? cpu_used_ns(px_pid) : -1;
                cli0 = thread_cpu_used_ns();
                start = now_ns();
                done0 = done;
            } else if (phase == 1 && now - start >= t->run_ns) {
                int64_t px1 = px_pid > 0 ? cpu_used_ns(px_pid) : -1;
                phase = 2;
                end = now;
                rt_result_set(res, done - done0, end - start, srv0, cpu_used_ns(srv_pid), cli0,
                              thread_cpu_used_ns());
                if (px0 >= 0 && px1 >= 0)
                    res->px_us = (double)(px1 - px0) / 1e3 / (double)(done - done0);
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
