/*
 * wire.c: store-bench's building blocks. The failure detail (g_err), clocks and CPU times,
 * allocation that exits on failure, the two protocol generations, the request frames built with
 * librendezvous's encoder (proto.h), and blocking sockets: sending, receiving with a timeout,
 * and opening a connection with the handshake a real torch client performs.
 *
 * Not here: anything timed (roundtrip.c, barrier.c); frames are built before a clock starts.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include "monoclock.h"
#include "store-bench.h"

/* ---------------------------------------------------------------------------------------- */
/* Small helpers                                                                            */
/* ---------------------------------------------------------------------------------------- */

char g_err[512]; /* detail of the last failure, for the report */

/* Records a failure description and returns `rc` (a negative errno). */
__attribute__((format(printf, 2, 3))) int fail(int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof(g_err), fmt, ap);
    va_end(ap);
    return rc;
}

/* The project's monotonic clock (monoclock.h), unsigned for store-bench's arithmetic. */
uint64_t now_ns(void)
{
    return (uint64_t)mono_now_ns();
}

void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

void *xmalloc(size_t n)
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

const struct gen gen_legacy = {
    .name = "legacy",
    .wire = RDZV_GEN_LEGACY,
    .validate = false,
};
const struct gen gen_modern = {
    .name = "modern",
    .wire = RDZV_GEN_MODERN,
    .validate = true,
};

/*
 * Frame builders: each appends one request to `w` with librendezvous's encoder (proto.h). The
 * caller checks the buffer once, with built(), after the frames it needs.
 */
void frame_validate(rdzv__wbuf *w)
{
    rdzv__put_op(w, RDZV_GEN_MODERN, RDZV_OP_VALIDATE);
    rdzv__put_u32(w, RDZV_VALIDATE_MAGIC);
}

static void frame_ping(rdzv__wbuf *w, uint32_t nonce)
{
    rdzv__put_op(w, RDZV_GEN_MODERN, RDZV_OP_PING);
    rdzv__put_u32(w, nonce);
}

void frame_set(rdzv__wbuf *w, const struct gen *g, const char *key, const void *val, size_t vlen)
{
    rdzv__put_op(w, g->wire, RDZV_OP_SET);
    rdzv__put_vec(w, key, strlen(key));
    rdzv__put_vec(w, val, vlen);
}

void frame_get(rdzv__wbuf *w, const struct gen *g, const char *key)
{
    rdzv__put_op(w, g->wire, RDZV_OP_GET);
    rdzv__put_vec(w, key, strlen(key));
}

void frame_add(rdzv__wbuf *w, const struct gen *g, const char *key, int64_t delta)
{
    rdzv__put_op(w, g->wire, RDZV_OP_ADD);
    rdzv__put_vec(w, key, strlen(key));
    rdzv__put_i64(w, delta);
}

void frame_wait1(rdzv__wbuf *w, const struct gen *g, const char *key)
{
    rdzv__put_op(w, g->wire, RDZV_OP_WAIT);
    rdzv__put_u64(w, 1);
    rdzv__put_vec(w, key, strlen(key));
}

/*
 * Exits, as xmalloc() does, if building frames into `w` failed: out of memory, or a fixed
 * buffer too small for its frames (a bug here). Frames are built before any clock starts.
 */
void built(const rdzv__wbuf *w)
{
    if (w->err) {
        fprintf(stderr, "store-bench: cannot build a request: %s\n", strerror(-w->err));
        exit(2);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Blocking socket helpers (connection set-up and the single-connection case)               */
/* ---------------------------------------------------------------------------------------- */

int send_all(int fd, const uint8_t *buf, size_t len)
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

int recv_all(int fd, uint8_t *buf, size_t len, const char *what)
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

void set_nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

struct sockaddr_in loopback(int port)
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
int conn_open(int port, const struct gen *g)
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
