/*
 * Rank-to-rank TCP for the cpu backend: one listening socket per rank, one lazily made
 * connection per peer, and bounded, abortable duplex transfers over those connections.
 *
 * Connections: of a pair of ranks, the lower connects to the higher's listener, sends a 16-byte
 * hello {magic, communicator tag, its rank} and waits for the same structure back (the ack,
 * carrying the acceptor's rank). The higher accepts whatever arrives on its listener: a valid
 * hello from a lower rank it is not yet connected to is acked and kept in fds[], whether or not
 * it is the peer being waited for, so arrival order does not matter; anything else (a wrong
 * magic or tag, a rank out of range, a duplicate, a connection that closes or stalls) is closed
 * without stopping the others. A connector whose connection is refused or closed before the ack
 * retries with a short backoff until its deadline, so a listener that is not yet accepting, or
 * an acceptor that dropped a half-read hello when it returned, only costs time.
 *
 * Transfers: sockets are non-blocking after the handshake; coll__tcp_xfer() sends to one peer
 * while it receives from another (or the same) peer with sendmsg()/recvmsg() on local copies
 * of the iovec arrays, sending and receiving in one poll() loop, so two ranks that exchange
 * large buffers with each other never wait on each other's socket buffers. Every wait is a
 * poll() of at most 100 ms, after which the abort flag and the deadline are checked.
 *
 * Non-goals: no reconnection after a failure, no message framing (the callers agree on sizes),
 * no name resolution (numeric addresses only), no thread-safety except that
 * coll__tcp_shutdown() may be called from any thread while another is blocked in conn or xfer.
 * Nothing here prints, exits or aborts.
 */
#include "coll_internal.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define HELLO_MAGIC 0x636f6c6cu /* "coll" */
#define HELLO_BYTES 16
#define POLL_SLICE_MS 100
#define MAX_PENDING 32  /* accepted connections whose hello is still being read */
#define SCRATCH_IOV 128 /* iovec entries kept on the stack by xfer; more are allocated */

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static bool aborted(const coll__tcp *t)
{
    return t->abort && atomic_load(t->abort) != 0;
}

/* Milliseconds to wait in one poll(): at most POLL_SLICE_MS, at least 0, never past deadline. */
static int slice_ms(int64_t deadline_ns)
{
    int left = mono_ms_left(deadline_ns); /* -1: no deadline */
    return left < 0 || left > POLL_SLICE_MS ? POLL_SLICE_MS : left;
}

/* The hello and the ack: magic u32, tag u64, rank u32, little-endian, no padding. */
static void hello_encode(uint8_t *b, uint64_t tag, int rank)
{
    uint32_t magic = HELLO_MAGIC, r = (uint32_t)rank;
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(magic >> (8 * i));
    for (int i = 0; i < 8; i++)
        b[4 + i] = (uint8_t)(tag >> (8 * i));
    for (int i = 0; i < 4; i++)
        b[12 + i] = (uint8_t)(r >> (8 * i));
}

/* Returns the rank in a hello with the right magic and tag, or -1. */
static int hello_decode(const uint8_t *b, uint64_t tag)
{
    uint32_t magic = 0, r = 0;
    uint64_t got = 0;
    for (int i = 0; i < 4; i++)
        magic |= (uint32_t)b[i] << (8 * i);
    for (int i = 0; i < 8; i++)
        got |= (uint64_t)b[4 + i] << (8 * i);
    for (int i = 0; i < 4; i++)
        r |= (uint32_t)b[12 + i] << (8 * i);
    if (magic != HELLO_MAGIC || got != tag || r > INT_MAX)
        return -1;
    return (int)r;
}

static void set_nodelay(int fd)
{
    int one = 1;
    /* Best effort: a failure costs latency, not correctness. */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Parses a numeric IPv4 or IPv6 host and port into *ss. Returns the length or -EINVAL. */
static int parse_addr(const char *host, int port, struct sockaddr_storage *ss)
{
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *in4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
    if (!host) {
        in4->sin_family = AF_INET;
        in4->sin_addr.s_addr = htonl(INADDR_ANY);
        in4->sin_port = htons((uint16_t)port);
        return (int)sizeof *in4;
    }
    if (inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
        in4->sin_family = AF_INET;
        in4->sin_port = htons((uint16_t)port);
        return (int)sizeof *in4;
    }
    if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)port);
        return (int)sizeof *in6;
    }
    return -EINVAL;
}

/*
 * Moves exactly HELLO_BYTES through fd (sending when `out`, receiving otherwise) before the
 * deadline, checking the abort flag between polls. Returns 0, -ETIMEDOUT, -ECANCELED,
 * COLL_EREMOTE (the peer closed or reset), or a negative errno.
 */
static int hello_io(const coll__tcp *t, int fd, uint8_t *buf, bool out, int64_t deadline_ns)
{
    size_t done = 0;
    while (done < HELLO_BYTES) {
        ssize_t n = out ? send(fd, buf + done, HELLO_BYTES - done, MSG_NOSIGNAL)
                        : recv(fd, buf + done, HELLO_BYTES - done, 0);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n == 0)
            return COLL_EREMOTE;
        if (errno == EINTR)
            continue;
        if (errno == ECONNRESET || errno == EPIPE)
            return COLL_EREMOTE;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return -errno;
        if (aborted(t))
            return -ECANCELED;
        if (mono_now_ns() >= deadline_ns)
            return -ETIMEDOUT;
        struct pollfd p = {.fd = fd, .events = out ? POLLOUT : POLLIN};
        if (poll(&p, 1, slice_ms(deadline_ns)) < 0 && errno != EINTR)
            return -errno;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Set-up and teardown                                                                         */
/* ------------------------------------------------------------------------------------------ */

int coll__tcp_init(coll__tcp *t, int rank, int world, uint64_t tag, const char *bind_host,
                   const _Atomic int *abort, int *port)
{
    if (!t || !port || world <= 0 || rank < 0 || rank >= world)
        return -EINVAL;
    memset(t, 0, sizeof *t);
    t->listen_fd = -1;
    t->rank = rank;
    t->world = world;
    t->tag = tag;
    t->abort = abort;

    struct sockaddr_storage ss;
    int len = parse_addr(bind_host, 0, &ss);
    if (len < 0)
        return len;

    int rc;
    t->fds = malloc(sizeof *t->fds * (size_t)world);
    t->addrs = calloc((size_t)world, sizeof *t->addrs);
    t->ports = calloc((size_t)world, sizeof *t->ports);
    if (!t->fds || !t->addrs || !t->ports) {
        rc = -ENOMEM;
        goto out;
    }
    for (int i = 0; i < world; i++)
        t->fds[i] = -1;

    t->listen_fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (t->listen_fd < 0) {
        rc = -errno;
        goto out;
    }
    int one = 1;
    (void)setsockopt(t->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(t->listen_fd, (struct sockaddr *)&ss, (socklen_t)len) < 0 ||
        listen(t->listen_fd, 128) < 0) {
        rc = -errno;
        goto out;
    }
    socklen_t sl = sizeof ss;
    if (getsockname(t->listen_fd, (struct sockaddr *)&ss, &sl) < 0) {
        rc = -errno;
        goto out;
    }
    *port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                          : ((struct sockaddr_in6 *)&ss)->sin6_port);
    return 0;
out:
    coll__tcp_close(t);
    return rc;
}

int coll__tcp_set_peer(coll__tcp *t, int peer, const char *host, int port)
{
    if (!t || !t->addrs || !host || peer < 0 || peer >= t->world || port <= 0 || port > 65535 ||
        strlen(host) >= sizeof t->addrs[0])
        return -EINVAL;
    struct sockaddr_storage ss;
    if (parse_addr(host, port, &ss) < 0)
        return -EINVAL;
    strcpy(t->addrs[peer], host);
    t->ports[peer] = port;
    return 0;
}

void coll__tcp_shutdown(coll__tcp *t)
{
    if (!t || !t->fds)
        return;
    for (int i = 0; i < t->world; i++) {
        int fd = t->fds[i];
        if (fd >= 0)
            (void)shutdown(fd, SHUT_RDWR);
    }
    /* Linux wakes a poll() on a listener that is shut down; the abort flag covers the rest. */
    if (t->listen_fd >= 0)
        (void)shutdown(t->listen_fd, SHUT_RDWR);
}

/*
 * A zeroed struct has listen_fd == 0, which is not ours: the listener is only touched when the
 * tables exist, and init allocates them before it opens the listener.
 */
void coll__tcp_close(coll__tcp *t)
{
    if (!t)
        return;
    if (t->fds) {
        for (int i = 0; i < t->world; i++)
            if (t->fds[i] >= 0)
                close(t->fds[i]);
        if (t->listen_fd >= 0)
            close(t->listen_fd);
    }
    free(t->fds);
    free(t->addrs);
    free(t->ports);
    memset(t, 0, sizeof *t);
    t->listen_fd = -1;
}

/* ------------------------------------------------------------------------------------------ */
/* Connecting                                                                                  */
/* ------------------------------------------------------------------------------------------ */

/*
 * One connection attempt to peer: a non-blocking connect, then the hello and the ack. Returns
 * the connected fd, -EAGAIN when the attempt failed in a way worth retrying (refused, closed or
 * reset before the ack), or -ETIMEDOUT, -ECANCELED, -EPROTO (something that is not this peer
 * answered), or another negative errno.
 */
static int connect_once(coll__tcp *t, int peer, int64_t deadline_ns)
{
    struct sockaddr_storage ss;
    int len = parse_addr(t->addrs[peer], t->ports[peer], &ss);
    if (len < 0)
        return -EINVAL;
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;

    int rc;
    if (connect(fd, (struct sockaddr *)&ss, (socklen_t)len) < 0) {
        if (errno != EINPROGRESS && errno != EINTR) {
            rc = -errno;
            goto fail;
        }
        for (;;) {
            if (aborted(t)) {
                rc = -ECANCELED;
                goto fail;
            }
            if (mono_now_ns() >= deadline_ns) {
                rc = -ETIMEDOUT;
                goto fail;
            }
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int n = poll(&p, 1, slice_ms(deadline_ns));
            if (n < 0 && errno != EINTR) {
                rc = -errno;
                goto fail;
            }
            if (n > 0)
                break;
        }
        int err = 0;
        socklen_t el = sizeof err;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0)
            err = errno;
        if (err) {
            rc = -err;
            goto fail;
        }
    }
    set_nodelay(fd);

    uint8_t buf[HELLO_BYTES];
    hello_encode(buf, t->tag, t->rank);
    rc = hello_io(t, fd, buf, true, deadline_ns);
    if (rc == 0)
        rc = hello_io(t, fd, buf, false, deadline_ns);
    if (rc < 0)
        goto fail;
    if (hello_decode(buf, t->tag) != peer) {
        rc = -EPROTO;
        goto fail;
    }
    return fd;
fail:
    close(fd);
    if (rc == -ECONNREFUSED || rc == -ECONNRESET || rc == COLL_EREMOTE)
        return -EAGAIN;
    return rc;
}

static int connect_peer(coll__tcp *t, int peer, int64_t deadline_ns)
{
    if (t->ports[peer] <= 0)
        return -EINVAL; /* coll__tcp_set_peer() was never called for it */
    int64_t backoff_ms = 1;
    for (;;) {
        int fd = connect_once(t, peer, deadline_ns);
        if (fd != -EAGAIN)
            return fd;
        /* Backoff before the next attempt, in slices so that an abort is seen in time. */
        int64_t until = mono_now_ns() + backoff_ms * 1000000;
        if (until > deadline_ns)
            until = deadline_ns;
        for (;;) {
            if (aborted(t))
                return -ECANCELED;
            if (mono_now_ns() >= deadline_ns)
                return -ETIMEDOUT;
            if (mono_now_ns() >= until)
                break;
            (void)poll(NULL, 0, slice_ms(until));
        }
        if (backoff_ms < 100)
            backoff_ms *= 2;
    }
}

/* An accepted connection whose hello is being read. */
struct pending {
    int fd;
    size_t got;
    uint8_t buf[HELLO_BYTES];
};

/*
 * Called when p's hello is complete: keeps the connection in t->fds[] and acks it when it is
 * valid. Returns the rank it now serves, or -1 (then p->fd was closed).
 */
static int pending_finish(coll__tcp *t, struct pending *p)
{
    int q = hello_decode(p->buf, t->tag);
    /* Only lower ranks connect to us; a rank we are connected to already is a stray. */
    if (q < 0 || q >= t->rank || t->fds[q] >= 0)
        goto reject;
    uint8_t ack[HELLO_BYTES];
    hello_encode(ack, t->tag, t->rank);
    /* The socket is new and its send buffer empty: 16 bytes go out at once or not at all. */
    if (send(p->fd, ack, sizeof ack, MSG_NOSIGNAL) != (ssize_t)sizeof ack)
        goto reject;
    set_nodelay(p->fd);
    t->fds[q] = p->fd;
    p->fd = -1;
    return q;
reject:
    close(p->fd);
    p->fd = -1;
    return -1;
}

/*
 * Reads what has arrived of p's hello. Returns the rank of a connection now kept, -1 while the
 * hello is incomplete, -2 when the connection was closed (rejected, or closed by the other end).
 */
static int pending_read(coll__tcp *t, struct pending *p)
{
    for (;;) {
        ssize_t n = recv(p->fd, p->buf + p->got, HELLO_BYTES - p->got, 0);
        if (n > 0) {
            p->got += (size_t)n;
            if (p->got == HELLO_BYTES) {
                int q = pending_finish(t, p);
                return q >= 0 ? q : -2;
            }
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return -1;
        close(p->fd);
        p->fd = -1;
        return -2;
    }
}

/*
 * Accepts on the listener until peer's connection is kept, keeping the valid ones of other
 * lower ranks on the way. Hellos are read concurrently, so that a connection that never sends
 * one does not hold up the others. Connections with a hello still incomplete when peer arrives
 * are closed; their connectors retry.
 */
static int accept_peer(coll__tcp *t, int peer, int64_t deadline_ns)
{
    struct pending pend[MAX_PENDING];
    struct pollfd pfd[MAX_PENDING + 1];
    int npend = 0, rc;

    while (t->fds[peer] < 0) {
        if (aborted(t)) {
            rc = -ECANCELED;
            goto out;
        }
        if (mono_now_ns() >= deadline_ns) {
            rc = -ETIMEDOUT;
            goto out;
        }
        pfd[0] = (struct pollfd){.fd = t->listen_fd, .events = POLLIN};
        for (int i = 0; i < npend; i++)
            pfd[1 + i] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
        int n = poll(pfd, (nfds_t)(1 + npend), slice_ms(deadline_ns));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            rc = -errno;
            goto out;
        }
        if (n == 0)
            continue;

        /* Hellos first: they may free slots for the new connections. */
        for (int i = 0; i < npend; i++)
            if (pfd[1 + i].revents)
                (void)pending_read(t, &pend[i]);
        int kept = 0;
        for (int i = 0; i < npend; i++)
            if (pend[i].fd >= 0)
                pend[kept++] = pend[i];
        npend = kept;

        if (pfd[0].revents & (POLLERR | POLLHUP | POLLNVAL)) {
            /* The listener was shut down (coll__tcp_shutdown()). */
            rc = aborted(t) ? -ECANCELED : -ESHUTDOWN;
            goto out;
        }
        if (!(pfd[0].revents & POLLIN))
            continue;
        for (;;) {
            int fd = accept4(t->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0) {
                if (errno == EINTR || errno == ECONNABORTED)
                    continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK)
                    break;
                if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                    break; /* pending ones may still complete; retried on the next wake */
                rc = errno == EINVAL && aborted(t) ? -ECANCELED : -errno;
                goto out;
            }
            if (npend == MAX_PENDING) {
                /* Full of silent connections: the oldest makes room. */
                close(pend[0].fd);
                memmove(pend, pend + 1, sizeof pend[0] * (MAX_PENDING - 1));
                npend--;
            }
            pend[npend] = (struct pending){.fd = fd};
            /* The hello usually arrived with the connection. */
            if (pending_read(t, &pend[npend]) == -1)
                npend++;
        }
    }
    rc = t->fds[peer];
out:
    for (int i = 0; i < npend; i++)
        close(pend[i].fd);
    return rc;
}

int coll__tcp_conn(coll__tcp *t, int peer, int64_t deadline_ns)
{
    if (!t || !t->fds || peer < 0 || peer >= t->world || peer == t->rank)
        return -EINVAL;
    if (t->fds[peer] >= 0)
        return t->fds[peer];
    if (t->rank < peer) {
        int fd = connect_peer(t, peer, deadline_ns);
        if (fd >= 0)
            t->fds[peer] = fd;
        return fd;
    }
    return accept_peer(t, peer, deadline_ns);
}

/* ------------------------------------------------------------------------------------------ */
/* Transfers                                                                                   */
/* ------------------------------------------------------------------------------------------ */

/* One direction of a transfer: the iovecs still to move, advanced in place. */
struct side {
    int peer, fd;
    struct iovec *iov;
    int n;
    bool want; /* the last attempt hit EAGAIN: wait for readiness */
};

/* Drops the leading zero-length entries; true once nothing is left. */
static bool side_done(struct side *s)
{
    while (s->n > 0 && s->iov->iov_len == 0) {
        s->iov++;
        s->n--;
    }
    return s->n == 0;
}

static void side_advance(struct side *s, size_t nbytes)
{
    while (nbytes > 0) {
        size_t step = nbytes < s->iov->iov_len ? nbytes : s->iov->iov_len;
        s->iov->iov_base = (char *)s->iov->iov_base + step;
        s->iov->iov_len -= step;
        nbytes -= step;
        if (s->iov->iov_len == 0) {
            s->iov++;
            s->n--;
        }
    }
}

/*
 * One sendmsg() or recvmsg() on s. Returns 1 on progress, 0 when the socket would block, or a
 * failure: COLL_EREMOTE for an orderly close or a reset, else a negative errno.
 */
static int side_step(struct side *s, bool out)
{
    struct msghdr m = {.msg_iov = s->iov, .msg_iovlen = (size_t)(s->n < IOV_MAX ? s->n : IOV_MAX)};
    for (;;) {
        ssize_t n = out ? sendmsg(s->fd, &m, MSG_NOSIGNAL) : recvmsg(s->fd, &m, 0);
        if (n > 0) {
            side_advance(s, (size_t)n);
            s->want = false;
            return 1;
        }
        if (n == 0)
            return COLL_EREMOTE; /* recv: the peer closed (sendmsg of > 0 bytes never gives 0) */
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            s->want = true;
            return 0;
        }
        if (errno == ECONNRESET || errno == EPIPE || errno == ENOTCONN)
            return COLL_EREMOTE;
        return -errno;
    }
}

static bool has_bytes(const struct iovec *iov, int n)
{
    for (int i = 0; i < n; i++)
        if (iov[i].iov_len)
            return true;
    return false;
}

int coll__tcp_xfer(coll__tcp *t, int send_peer, const struct iovec *siov, int sn, int recv_peer,
                   const struct iovec *riov, int rn, int64_t deadline_ns, int *culprit)
{
    if (!t || !t->fds || !culprit || sn < 0 || rn < 0 || (sn && !siov) || (rn && !riov) ||
        send_peer < -1 || send_peer >= t->world || send_peer == t->rank || recv_peer < -1 ||
        recv_peer >= t->world || recv_peer == t->rank)
        return -EINVAL;
    bool sending = send_peer >= 0 && has_bytes(siov, sn);
    bool receiving = recv_peer >= 0 && has_bytes(riov, rn);
    if (!sending && !receiving)
        return 0;

    /*
     * Connect before accepting: a rank blocked connecting waits only for a higher rank to
     * accept, so the highest rank of any waiting chain is always accepting.
     */
    int order[2] = {sending ? send_peer : -1, receiving ? recv_peer : -1};
    if (order[0] >= 0 && order[1] > order[0]) {
        order[0] = order[1];
        order[1] = sending ? send_peer : -1;
    }
    for (int i = 0; i < 2; i++) {
        if (order[i] < 0)
            continue;
        int fd = coll__tcp_conn(t, order[i], deadline_ns);
        if (fd < 0) {
            bool cancel = fd == -ECANCELED || aborted(t);
            *culprit = cancel ? -1 : order[i];
            return cancel ? -ECANCELED : fd;
        }
    }

    struct iovec sbuf[SCRATCH_IOV], rbuf[SCRATCH_IOV];
    struct iovec *sv = sbuf, *rv = rbuf, *heap = NULL;
    int snn = sending ? sn : 0, rnn = receiving ? rn : 0;
    if (snn > SCRATCH_IOV || rnn > SCRATCH_IOV) {
        heap = malloc(sizeof *heap * ((size_t)snn + (size_t)rnn));
        if (!heap) {
            *culprit = -1;
            return -ENOMEM;
        }
        sv = heap;
        rv = heap + snn;
    }
    if (snn)
        memcpy(sv, siov, sizeof *sv * (size_t)snn);
    if (rnn)
        memcpy(rv, riov, sizeof *rv * (size_t)rnn);
    struct side s = {
        .peer = send_peer, .fd = sending ? t->fds[send_peer] : -1, .iov = sv, .n = snn};
    struct side r = {
        .peer = recv_peer, .fd = receiving ? t->fds[recv_peer] : -1, .iov = rv, .n = rnn};

    int rc = 0, bad = -1;
    for (;;) {
        bool sdone = side_done(&s), rdone = side_done(&r);
        if (sdone && rdone)
            break;
        if (aborted(t)) {
            rc = -ECANCELED;
            break;
        }
        if (mono_now_ns() >= deadline_ns) {
            rc = -ETIMEDOUT;
            bad = rdone ? s.peer : r.peer;
            break;
        }
        /* Try both directions before sleeping; poll only for those that would block. */
        int progress = 0;
        if (!rdone) {
            int k = side_step(&r, false);
            if (k < 0) {
                rc = k;
                bad = r.peer;
                break;
            }
            progress |= k;
        }
        if (!side_done(&s)) {
            int k = side_step(&s, true);
            if (k < 0) {
                rc = k;
                bad = s.peer;
                break;
            }
            progress |= k;
        }
        if (progress)
            continue;

        struct pollfd p[2];
        nfds_t np = 0;
        if (!side_done(&r))
            p[np++] = (struct pollfd){.fd = r.fd, .events = POLLIN};
        if (!side_done(&s)) {
            if (np && p[0].fd == s.fd)
                p[0].events |= POLLOUT;
            else
                p[np++] = (struct pollfd){.fd = s.fd, .events = POLLOUT};
        }
        int n = poll(p, np, slice_ms(deadline_ns));
        if (n < 0 && errno != EINTR) {
            rc = -errno;
            break;
        }
        /*
         * POLLERR/POLLHUP need no handling here: the next recvmsg()/sendmsg() reports the
         * failure, after reading whatever arrived before it.
         */
    }
    free(heap);
    if (rc == 0)
        return 0;
    /* A local shutdown looks like the peer closing; the abort flag tells them apart. */
    if (aborted(t)) {
        *culprit = -1;
        return -ECANCELED;
    }
    *culprit = bad;
    return rc;
}
