/*
 * The blocking client of librendezvous: one TCP connection to a store that speaks the modern
 * (PyTorch >= 2.2) generation of the c10d TCPStore wire protocol, for C programs such as the
 * launcher, workers and job schedulers.
 *
 * Each call encodes its whole request (with proto.h's encoder) into one growable buffer, kept
 * across calls, and hands it to the kernel with as few send() calls as the socket buffer allows,
 * then reads the reply through a small receive buffer so that a short reply costs one recv(). The
 * socket is non-blocking; every wait for the socket is a poll() against a deadline taken from the
 * monotonic clock, so no call blocks longer than the client's timeout (or wait()'s own).
 *
 * Invariant: the byte stream is either in step with the server (no reply outstanding, no
 * request half sent) or the client is marked broken, its socket closed, and every later call
 * answers -ENOTCONN. A wait that times out is the one failure that restores the invariant
 * instead of breaking it, by cancelling the wait on the server and reading the acknowledgement.
 *
 * With a token (rdzv_client_options.token) the connection opens with the mutual
 * challenge-response of auth.h instead of the PING: the client checks that the server knows the
 * token before it proves that it does, and an authentication failure is final (-EACCES), not
 * retried.
 *
 * This file holds the operations, the request encoding and the reading of replies; connecting,
 * the handshakes and the client's life cycle are connect.c's, the struct client.h's.
 *
 * Non-goals: no legacy (PyTorch 1.x) generation, no queue operations, no
 * reconnection after a failure, no thread safety (one client per thread). Nothing here prints,
 * exits or aborts; failures are negative errno values plus a sentence in the client's last error.
 */
#include "client.h"
#include "rdzv.h"
#include "auth.h"
#include "proto.h"
#include "monoclock.h"
#include "rdzv_internal.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------ */
/* Time and randomness                                                                         */
/* ------------------------------------------------------------------------------------------ */

uint64_t rdzv__rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Error bookkeeping                                                                           */
/* ------------------------------------------------------------------------------------------ */

/* Records a failure of the operation under way and returns `err`. */
static int fail(rdzv_client *c, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(rdzv_client *c, int err, const char *fmt, ...)
{
    char detail[DETAIL_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    snprintf(c->err, sizeof c->err, "%s: %s", c->what, detail);
    return err;
}

/*
 * Marks the client broken after a failure that left the stream out of step with the server,
 * closes the socket (which also ends anything the server still holds for this connection),
 * records the failure and returns `err`.
 */
static int fail_broken(rdzv_client *c, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail_broken(rdzv_client *c, int err, const char *fmt, ...)
{
    char detail[DETAIL_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    snprintf(c->err, sizeof c->err, "%s: %s (connection dropped)", c->what, detail);
    memcpy(c->broken_why, c->err, sizeof c->err);
    c->broken = true;
    if (c->fd >= 0) {
        close(c->fd);
        c->fd = -1;
    }
    c->rpos = c->rlen = 0;
    return err;
}

/* A phrase for an I/O error code, as it appears in error messages. */
static const char *io_reason(int err)
{
    switch (err) {
    case -ECONNRESET:
        return "the connection was closed or reset by the server";
    case -ETIMEDOUT:
        return "timed out";
    case -EPROTO:
        return "malformed reply";
    default:
        return rdzv_strerror(err);
    }
}

/* Appends `s` to `dst` (of `cap` bytes, NUL-terminated), quoting at most KEY_QUOTE_BYTES. */
static void append_quoted(char *dst, size_t cap, const char *pfx, size_t pfx_len, const char *s)
{
    size_t len = strlen(dst);
    size_t slen = strlen(s);
    size_t total = pfx_len + slen;
    if (len >= cap)
        return;
    int ipl = pfx_len > KEY_QUOTE_BYTES ? KEY_QUOTE_BYTES : (int)pfx_len;
    int isl = total > KEY_QUOTE_BYTES ? KEY_QUOTE_BYTES - ipl : (int)slen;
    snprintf(dst + len, cap - len, "'%.*s%.*s%s'", ipl, pfx ? pfx : "", isl, s,
             total > KEY_QUOTE_BYTES ? "..." : "");
}

/*
 * Starts a public operation: names it for error messages (`op`, and the first of `nkeys` keys
 * when there are any) and refuses with -ENOTCONN when the client is broken.
 */
static int op_begin(rdzv_client *c, const char *op, const char *const *keys, size_t nkeys)
{
    snprintf(c->what, sizeof c->what, "%s", op);
    if (nkeys > 0) {
        size_t len = strlen(c->what);
        snprintf(c->what + len, sizeof c->what - len, " ");
        append_quoted(c->what, sizeof c->what, c->prefix, c->prefix_len, keys[0]);
        if (nkeys > 1) {
            len = strlen(c->what);
            snprintf(c->what + len, sizeof c->what - len, " and %zu more key%s", nkeys - 1,
                     nkeys > 2 ? "s" : "");
        }
    }
    rdzv__wbuf_reset(&c->sbuf);
    if (c->broken) {
        snprintf(c->err, sizeof c->err, "%s: client unusable after an earlier failure: %.280s",
                 c->what, c->broken_why);
        return -ENOTCONN;
    }
    return 0;
}

/*
 * Answers a call with an invalid argument: -EINVAL, with a note in the client's last error when
 * there is a client to hold it. The connection is untouched.
 */
static int invalid(rdzv_client *c, const char *op)
{
    if (c)
        snprintf(c->err, sizeof c->err, "%s: invalid argument", op);
    return -EINVAL;
}

/* Releases a send buffer that one big request grew, so that it is not kept for the lifetime. */
static void op_end(rdzv_client *c)
{
    if (c->sbuf.cap > SBUF_KEEP_BYTES)
        rdzv__wbuf_free(&c->sbuf);
    rdzv__wbuf_reset(&c->sbuf);
}

/* ------------------------------------------------------------------------------------------ */
/* Request encoding                                                                            */
/* ------------------------------------------------------------------------------------------ */

/*
 * Checks the request just encoded into c->sbuf: 0, or the encoder's failure, recorded as the
 * call's (a request whose size would not fit in memory is an invalid argument).
 */
static int encoded(rdzv_client *c)
{
    switch (c->sbuf.err) {
    case 0:
        return 0;
    case -ENOMEM:
        return fail(c, -ENOMEM, "cannot allocate memory for the request");
    default:
        return fail(c, -EINVAL, "request too large");
    }
}

/* A key as the wire carries it: one string, the client's prefix followed by `key`. */
static void put_key(rdzv_client *c, const char *key)
{
    rdzv__put_key(&c->sbuf, c->prefix, c->prefix_len, key, strlen(key));
}

/* ------------------------------------------------------------------------------------------ */
/* Socket I/O                                                                                  */
/* ------------------------------------------------------------------------------------------ */

/*
 * Waits until `fd` is ready for `events` or `deadline` passes. Returns 0, -ETIMEDOUT, or a
 * negative errno from poll(). POLLERR and POLLHUP count as ready: the next send() or recv()
 * reports what happened.
 */
int rdzv__wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = events};
        int ms = mono_ms_left(deadline);
        int n = poll(&pfd, 1, ms);
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return -errno;
        if (n == 0 && deadline != NO_DEADLINE && mono_now_ns() >= deadline)
            return -ETIMEDOUT;
    }
}

int rdzv__send_all(rdzv_client *c, const uint8_t *p, size_t len, int64_t deadline, size_t *sent)
{
    size_t off = 0;
    int rc = 0;
    while (off < len) {
        ssize_t n = send(c->fd, p + off, len - off, MSG_NOSIGNAL);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            rc = rdzv__wait_fd(c->fd, POLLOUT, deadline);
            if (rc < 0)
                break;
            continue;
        }
        rc = (n < 0 && errno != EPIPE) ? -errno : -ECONNRESET;
        break;
    }
    if (sent)
        *sent = off;
    if (rc == 0)
        c->just_sent = true;
    return rc;
}

/*
 * Sends the request in c->sbuf. A failure after part of the request left, or a dead connection,
 * breaks the client; a timeout before any byte left leaves it usable. Returns 0 or a negative
 * errno.
 */
static int send_request(rdzv_client *c, int64_t deadline)
{
    size_t off = 0;
    int rc = rdzv__send_all(c, c->sbuf.data, c->sbuf.len, deadline, &off);
    if (rc == 0)
        return 0;
    if (rc == -ETIMEDOUT && off == 0)
        return fail(c, rc, "sending the request timed out");
    return fail_broken(c, rc, "sending the request: %s", io_reason(rc));
}

/*
 * Reads exactly `n` reply bytes into `dst` (NULL: discard them). Returns 0, -ETIMEDOUT,
 * -ECONNRESET (the peer closed), or another negative errno. Records nothing and breaks nothing:
 * the caller decides, since only a wait may survive a timeout.
 */
int rdzv__recv_raw(rdzv_client *c, void *dst, size_t n, int64_t deadline)
{
    uint8_t *out = dst;
    while (n > 0) {
        if (c->rpos < c->rlen) {
            size_t take = c->rlen - c->rpos < n ? c->rlen - c->rpos : n;
            if (out) {
                memcpy(out, c->rbuf + c->rpos, take);
                out += take;
            }
            c->rpos += take;
            n -= take;
            continue;
        }
        /*
         * Right after a request the reply has almost never arrived yet, so poll() comes first
         * and saves a recv() that would only say EAGAIN.
         */
        if (c->just_sent) {
            c->just_sent = false;
            int rc = rdzv__wait_fd(c->fd, POLLIN, deadline);
            if (rc < 0)
                return rc;
        }
        /* Large remainders bypass the buffer; everything else reads as much as is there. */
        bool direct = out && n >= RBUF_BYTES;
        ssize_t r = direct ? recv(c->fd, out, n, 0) : recv(c->fd, c->rbuf, RBUF_BYTES, 0);
        if (r > 0) {
            if (direct) {
                out += r;
                n -= (size_t)r;
            } else {
                c->rpos = 0;
                c->rlen = (size_t)r;
            }
            continue;
        }
        if (r == 0)
            return -ECONNRESET;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = rdzv__wait_fd(c->fd, POLLIN, deadline);
            if (rc < 0)
                return rc;
            continue;
        }
        return errno == EPIPE ? -ECONNRESET : -errno;
    }
    return 0;
}

/* Reads a reply of `n` bytes; any failure breaks the client. */
static int recv_exact(rdzv_client *c, void *dst, size_t n, int64_t deadline)
{
    int rc = rdzv__recv_raw(c, dst, n, deadline);
    if (rc < 0)
        return fail_broken(c, rc, "reading the reply: %s", io_reason(rc));
    return 0;
}

static int recv_u8(rdzv_client *c, uint8_t *v, int64_t deadline)
{
    return recv_exact(c, v, 1, deadline);
}

static int recv_i64(rdzv_client *c, int64_t *v, int64_t deadline)
{
    uint8_t b[8];
    int rc = recv_exact(c, b, 8, deadline);
    if (rc == 0)
        memcpy(v, b, 8);
    return rc;
}

/*
 * Reads a vector reply into a new buffer with one extra NUL byte (NULL: read and discard it).
 * Returns 0 and sets *out and *len, or a negative errno (the client is then broken).
 */
static int recv_vec(rdzv_client *c, void **out, size_t *len, int64_t deadline)
{
    uint8_t b[8];
    uint64_t n;
    int rc = recv_exact(c, b, 8, deadline);
    if (rc < 0)
        return rc;
    memcpy(&n, b, 8);
    if (n > MAX_REPLY_BYTES || n > SIZE_MAX - 1)
        return fail_broken(c, -EPROTO, "reply announces a value of %" PRIu64 " bytes", n);
    if (!out)
        return recv_exact(c, NULL, (size_t)n, deadline);
    uint8_t *p = malloc((size_t)n + 1);
    if (!p)
        return fail_broken(c, -ENOMEM, "cannot allocate %" PRIu64 " bytes for the reply", n);
    rc = recv_exact(c, p, (size_t)n, deadline);
    if (rc < 0) {
        free(p);
        return rc;
    }
    p[n] = 0;
    *out = p;
    *len = (size_t)n;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Operations                                                                                  */
/* ------------------------------------------------------------------------------------------ */

/* The deadline of an ordinary call: the client's timeout from now. */
static int64_t call_deadline(const rdzv_client *c)
{
    return mono_deadline_ns(c->timeout_ms);
}

/* Validates a key array: non-NULL entries, and a non-NULL array when there are keys. */
static bool keys_ok(const char *const *keys, size_t nkeys)
{
    if (nkeys > 0 && !keys)
        return false;
    for (size_t i = 0; i < nkeys; i++)
        if (!keys[i])
            return false;
    return true;
}

/* Encodes an opcode followed by a count and `nkeys` keys (CHECK, WAIT, MULTI_GET). */
static int put_key_list(rdzv_client *c, uint8_t op, const char *const *keys, size_t nkeys)
{
    rdzv__put_u8(&c->sbuf, op);
    rdzv__put_u64(&c->sbuf, nkeys);
    for (size_t i = 0; i < nkeys; i++)
        put_key(c, keys[i]);
    return encoded(c);
}

/* Encodes an opcode followed by one key and one value (SET, APPEND). */
static int put_key_value(rdzv_client *c, uint8_t op, const char *key, const void *value,
                         size_t nbytes)
{
    rdzv__put_u8(&c->sbuf, op);
    put_key(c, key);
    rdzv__put_vec(&c->sbuf, value, nbytes);
    return encoded(c);
}

/* Encodes an opcode followed by one key (GET, DELETE_KEY). */
static int put_op_key(rdzv_client *c, uint8_t op, const char *key)
{
    rdzv__put_u8(&c->sbuf, op);
    put_key(c, key);
    return encoded(c);
}

/*
 * Waits on the server until all keys exist or `deadline` passes. On a timeout it sends
 * CANCEL_WAIT and reads until WAIT_CANCELED (a STOP_WAITING may come first, when the keys
 * appeared meanwhile), bounded by the client's timeout, so the stream stays in step; it then
 * returns -ETIMEDOUT with the client usable. `timeout_ms` is only for the message.
 */
static int do_wait(rdzv_client *c, const char *const *keys, size_t nkeys, int64_t deadline,
                   int timeout_ms)
{
    rdzv__wbuf_reset(&c->sbuf);
    int rc = put_key_list(c, RDZV_M_WAIT, keys, nkeys);
    if (rc < 0)
        return rc;
    rc = send_request(c, deadline);
    if (rc < 0)
        return rc;
    uint8_t r;
    rc = rdzv__recv_raw(c, &r, 1, deadline);
    if (rc == 0) {
        if (r != RDZV_WAIT_STOP_WAITING)
            return fail_broken(c, -EPROTO, "unexpected wait reply %u", r);
        return 0;
    }
    if (rc != -ETIMEDOUT)
        return fail_broken(c, rc, "reading the reply: %s", io_reason(rc));

    int64_t cancel_deadline = call_deadline(c);
    rdzv__wbuf_reset(&c->sbuf);
    rdzv__put_u8(&c->sbuf, RDZV_M_CANCEL_WAIT);
    rc = encoded(c);
    if (rc < 0)
        return fail_broken(c, rc, "cannot cancel the wait");
    rc = send_request(c, cancel_deadline);
    if (rc < 0)
        return c->broken ? rc : fail_broken(c, rc, "cancelling the wait: %s", io_reason(rc));
    rc = rdzv__recv_raw(c, &r, 1, cancel_deadline);
    if (rc == 0 && r == RDZV_WAIT_STOP_WAITING)
        rc = rdzv__recv_raw(c, &r, 1, cancel_deadline);
    if (rc < 0)
        return fail_broken(c, rc, "cancelling the wait: %s", io_reason(rc));
    if (r != RDZV_WAIT_CANCELED)
        return fail_broken(c, -EPROTO, "unexpected reply %u to the wait cancellation", r);
    if (nkeys == 1)
        return fail(c, -ETIMEDOUT, "the key did not appear within %d ms", timeout_ms);
    return fail(c, -ETIMEDOUT, "not all %zu keys appeared within %d ms", nkeys, timeout_ms);
}

/* SET without the public checks; used by rdzv_set() and the barrier. */
static int do_set(rdzv_client *c, const char *key, const void *value, size_t nbytes,
                  int64_t deadline)
{
    rdzv__wbuf_reset(&c->sbuf);
    int rc = put_key_value(c, RDZV_M_SET, key, value, nbytes);
    if (rc < 0)
        return rc;
    return send_request(c, deadline);
}

static int do_add(rdzv_client *c, const char *key, int64_t delta, int64_t *result, int64_t deadline)
{
    rdzv__wbuf_reset(&c->sbuf);
    rdzv__put_u8(&c->sbuf, RDZV_M_ADD);
    put_key(c, key);
    rdzv__put_i64(&c->sbuf, delta);
    int rc = encoded(c);
    if (rc < 0)
        return rc;
    rc = send_request(c, deadline);
    if (rc < 0)
        return rc;
    return recv_i64(c, result, deadline);
}

static int do_delete(rdzv_client *c, const char *key, int64_t deadline)
{
    rdzv__wbuf_reset(&c->sbuf);
    int rc = put_op_key(c, RDZV_M_DELETE_KEY, key);
    if (rc < 0)
        return rc;
    rc = send_request(c, deadline);
    if (rc < 0)
        return rc;
    int64_t n = 0;
    rc = recv_i64(c, &n, deadline);
    if (rc < 0)
        return rc;
    return n != 0;
}

int rdzv_set(rdzv_client *c, const char *key, const void *value, size_t nbytes)
{
    if (!c || !key || (!value && nbytes))
        return invalid(c, "set");
    int rc = op_begin(c, "set", &key, 1);
    if (rc == 0)
        rc = do_set(c, key, value, nbytes, call_deadline(c));
    op_end(c);
    return rc;
}

/*
 * GET waits for the key first, as PyTorch's client does. The common case, a key that already
 * exists, takes one round trip: CHECK and GET go out together and the GET answer is kept when
 * CHECK says READY. Otherwise the (empty) GET answer is dropped and the slow path runs: WAIT,
 * then GET. Both paths return a value only once the key existed.
 */
int rdzv_get(rdzv_client *c, const char *key, void **value, size_t *nbytes)
{
    if (!c || !key || !value || !nbytes)
        return invalid(c, "get");
    void *p = NULL;
    size_t n = 0;
    uint8_t ready = RDZV_CHECK_NOT_READY;
    int rc = op_begin(c, "get", &key, 1);
    if (rc < 0)
        goto out;
    int64_t deadline = call_deadline(c);

    rdzv__put_u8(&c->sbuf, RDZV_M_CHECK);
    rdzv__put_u64(&c->sbuf, 1);
    put_key(c, key);
    rdzv__put_u8(&c->sbuf, RDZV_M_GET);
    put_key(c, key);
    rc = encoded(c);
    if (rc == 0)
        rc = send_request(c, deadline);
    if (rc == 0)
        rc = recv_u8(c, &ready, deadline);
    if (rc == 0 && ready != RDZV_CHECK_READY && ready != RDZV_CHECK_NOT_READY)
        rc = fail_broken(c, -EPROTO, "unexpected check reply %u", ready);
    if (rc == 0)
        rc = recv_vec(c, ready == RDZV_CHECK_READY ? &p : NULL, &n, deadline);
    if (rc < 0 || ready == RDZV_CHECK_READY)
        goto out;

    /* Slow path: the key is missing, so wait for it on the server, then fetch it. */
    rc = do_wait(c, &key, 1, deadline, c->timeout_ms);
    if (rc < 0)
        goto out;
    rdzv__wbuf_reset(&c->sbuf);
    rc = put_op_key(c, RDZV_M_GET, key);
    if (rc == 0)
        rc = send_request(c, deadline);
    if (rc == 0)
        rc = recv_vec(c, &p, &n, deadline);
out:
    if (rc == 0) {
        *value = p;
        *nbytes = n;
    }
    op_end(c);
    return rc;
}

int rdzv_add(rdzv_client *c, const char *key, int64_t delta, int64_t *result)
{
    if (!c || !key || !result)
        return invalid(c, "add");
    int rc = op_begin(c, "add", &key, 1);
    if (rc == 0)
        rc = do_add(c, key, delta, result, call_deadline(c));
    op_end(c);
    return rc;
}

/* COMPARE_SET without the public checks; used by rdzv_compare_set() and the barrier. */
static int do_compare_set(rdzv_client *c, const char *key, const void *expected,
                          size_t expected_nbytes, const void *desired, size_t desired_nbytes,
                          void **value, size_t *nbytes, int64_t deadline)
{
    rdzv__wbuf_reset(&c->sbuf);
    rdzv__put_u8(&c->sbuf, RDZV_M_COMPARE_SET);
    put_key(c, key);
    rdzv__put_vec(&c->sbuf, expected, expected_nbytes);
    rdzv__put_vec(&c->sbuf, desired, desired_nbytes);
    int rc = encoded(c);
    if (rc == 0)
        rc = send_request(c, deadline);
    if (rc == 0)
        rc = recv_vec(c, value, nbytes, deadline);
    return rc;
}

int rdzv_compare_set(rdzv_client *c, const char *key, const void *expected, size_t expected_nbytes,
                     const void *desired, size_t desired_nbytes, void **value, size_t *nbytes)
{
    if (!c || !key || (!expected && expected_nbytes) || (!desired && desired_nbytes) || !value ||
        !nbytes)
        return invalid(c, "compare_set");
    int rc = op_begin(c, "compare_set", &key, 1);
    if (rc == 0)
        rc = do_compare_set(c, key, expected, expected_nbytes, desired, desired_nbytes, value,
                            nbytes, call_deadline(c));
    op_end(c);
    return rc;
}

int rdzv_check(rdzv_client *c, const char *const *keys, size_t nkeys)
{
    if (!c || !keys_ok(keys, nkeys))
        return invalid(c, "check");
    int rc = op_begin(c, "check", keys, nkeys);
    if (rc < 0 || nkeys == 0) {
        rc = rc < 0 ? rc : 1;
        goto out;
    }
    int64_t deadline = call_deadline(c);
    rc = put_key_list(c, RDZV_M_CHECK, keys, nkeys);
    if (rc == 0)
        rc = send_request(c, deadline);
    uint8_t r;
    if (rc == 0)
        rc = recv_u8(c, &r, deadline);
    if (rc < 0)
        goto out;
    if (r == RDZV_CHECK_READY)
        rc = 1;
    else if (r == RDZV_CHECK_NOT_READY)
        rc = 0;
    else
        rc = fail_broken(c, -EPROTO, "unexpected check reply %u", r);
out:
    op_end(c);
    return rc;
}

int rdzv_wait(rdzv_client *c, const char *const *keys, size_t nkeys, int timeout_ms)
{
    if (!c || !keys_ok(keys, nkeys))
        return invalid(c, "wait");
    int rc = op_begin(c, "wait", keys, nkeys);
    if (rc == 0 && nkeys > 0) {
        int ms = timeout_ms >= 0 ? timeout_ms : c->timeout_ms;
        rc = do_wait(c, keys, nkeys, mono_deadline_ns(ms), ms);
    }
    op_end(c);
    return rc;
}

int rdzv_delete(rdzv_client *c, const char *key)
{
    if (!c || !key)
        return invalid(c, "delete");
    int rc = op_begin(c, "delete", &key, 1);
    if (rc == 0)
        rc = do_delete(c, key, call_deadline(c));
    op_end(c);
    return rc;
}

int rdzv_num_keys(rdzv_client *c, int64_t *count)
{
    if (!c || !count)
        return invalid(c, "num_keys");
    int rc = op_begin(c, "num_keys", NULL, 0);
    if (rc < 0)
        goto out;
    int64_t deadline = call_deadline(c);
    rdzv__put_u8(&c->sbuf, RDZV_M_GETNUMKEYS);
    rc = encoded(c);
    if (rc == 0)
        rc = send_request(c, deadline);
    if (rc == 0)
        rc = recv_i64(c, count, deadline);
out:
    op_end(c);
    return rc;
}

/*
 * LIST_KEYS: the count, then each key as a vector. The keys under the client's prefix are kept,
 * the prefix cut off, and packed as rdzv_rank_keys() packs its keys: pointers (NULL-terminated)
 * then the strings, in one allocation. Keys holding a NUL byte cannot be returned as strings
 * and are skipped.
 */
int rdzv_list_keys(rdzv_client *c, char ***keys, size_t *nkeys)
{
    if (!c || !keys || !nkeys)
        return invalid(c, "list_keys");
    char **names = NULL; /* the kept keys, each malloc'd */
    size_t n = 0, chars = 0;
    int64_t count = 0;
    int rc = op_begin(c, "list_keys", NULL, 0);
    if (rc < 0)
        goto out;
    int64_t deadline = call_deadline(c);
    rdzv__put_u8(&c->sbuf, RDZV_M_LIST_KEYS);
    rc = encoded(c);
    if (rc == 0)
        rc = send_request(c, deadline);
    if (rc == 0)
        rc = recv_i64(c, &count, deadline);
    if (rc < 0)
        goto out;
    if (count < 0 || (uint64_t)count > MAX_REPLY_BYTES / 8) {
        rc = fail_broken(c, -EPROTO, "list_keys answered a count of %" PRId64, count);
        goto out;
    }
    for (int64_t i = 0; i < count; i++) {
        void *k;
        size_t len;
        if ((rc = recv_vec(c, &k, &len, deadline)) < 0)
            goto out;
        if (len < c->prefix_len || memchr(k, 0, len) ||
            (c->prefix_len && memcmp(k, c->prefix, c->prefix_len) != 0)) {
            free(k);
            continue;
        }
        memmove(k, (char *)k + c->prefix_len, len - c->prefix_len + 1);
        char **more = (n & (n - 1)) == 0 ? realloc(names, (n ? 2 * n : 1) * sizeof *names) : names;
        if (!more) {
            free(k);
            rc = fail_broken(c, -ENOMEM, "out of memory");
            goto out;
        }
        names = more;
        names[n++] = k;
        chars += len - c->prefix_len + 1;
    }
    char **packed = malloc((n + 1) * sizeof *packed + chars);
    if (!packed) {
        rc = fail(c, -ENOMEM, "out of memory");
        goto out;
    }
    char *text = (char *)(packed + n + 1);
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(names[i]) + 1;
        packed[i] = memcpy(text, names[i], len);
        text += len;
    }
    packed[n] = NULL;
    *keys = packed;
    *nkeys = n;
out:
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    op_end(c);
    return rc;
}

int rdzv_append(rdzv_client *c, const char *key, const void *value, size_t nbytes)
{
    if (!c || !key || (!value && nbytes))
        return invalid(c, "append");
    int rc = op_begin(c, "append", &key, 1);
    if (rc == 0)
        rc = put_key_value(c, RDZV_M_APPEND, key, value, nbytes);
    if (rc == 0)
        rc = send_request(c, call_deadline(c));
    op_end(c);
    return rc;
}

int rdzv_multi_get(rdzv_client *c, const char *const *keys, size_t nkeys, void **values,
                   size_t *nbytes)
{
    if (!c || !keys_ok(keys, nkeys) || (nkeys && (!values || !nbytes)))
        return invalid(c, "multi_get");
    void **got = NULL;
    size_t *lens = NULL;
    size_t have = 0;
    int rc = op_begin(c, "multi_get", keys, nkeys);
    if (rc < 0 || nkeys == 0)
        goto out;
    int64_t deadline = call_deadline(c);
    if (nkeys > SIZE_MAX / sizeof *got) {
        rc = fail(c, -EINVAL, "too many keys");
        goto out;
    }
    /* Answers land in scratch arrays first, so the caller's are written only on success. */
    got = malloc(nkeys * sizeof *got);
    lens = malloc(nkeys * sizeof *lens);
    if (!got || !lens) {
        rc = fail(c, -ENOMEM, "cannot allocate the reply table");
        goto out;
    }
    rc = put_key_list(c, RDZV_M_MULTI_GET, keys, nkeys);
    if (rc == 0)
        rc = send_request(c, deadline);
    for (; rc == 0 && have < nkeys; have++) {
        rc = recv_vec(c, &got[have], &lens[have], deadline);
        if (rc < 0)
            break;
    }
    if (rc < 0)
        goto out;
    memcpy(values, got, nkeys * sizeof *got);
    memcpy(nbytes, lens, nkeys * sizeof *lens);
    have = 0;
out:
    for (size_t i = 0; i < have; i++)
        free(got[i]);
    free(got);
    free(lens);
    op_end(c);
    return rc;
}

int rdzv_multi_set(rdzv_client *c, const char *const *keys, const void *const *values,
                   const size_t *nbytes, size_t nkeys)
{
    if (!c || !keys_ok(keys, nkeys) || (nkeys && (!values || !nbytes)))
        return invalid(c, "multi_set");
    for (size_t i = 0; i < nkeys; i++)
        if (!values[i] && nbytes[i])
            return invalid(c, "multi_set");
    int rc = op_begin(c, "multi_set", keys, nkeys);
    if (rc < 0 || nkeys == 0)
        goto out;
    rdzv__put_u8(&c->sbuf, RDZV_M_MULTI_SET);
    rdzv__put_u64(&c->sbuf, nkeys);
    for (size_t i = 0; i < nkeys; i++) {
        put_key(c, keys[i]);
        rdzv__put_vec(&c->sbuf, values[i], nbytes[i]);
    }
    rc = encoded(c);
    if (rc == 0)
        rc = send_request(c, call_deadline(c));
out:
    op_end(c);
    return rc;
}

int rdzv_ping(rdzv_client *c)
{
    if (!c)
        return invalid(c, "ping");
    int rc = op_begin(c, "ping", NULL, 0);
    if (rc < 0)
        goto out;
    int64_t deadline = call_deadline(c);
    uint32_t nonce = (uint32_t)rdzv__rng_next(&c->rng);
    rdzv__put_u8(&c->sbuf, RDZV_M_PING);
    rdzv__put_u32(&c->sbuf, nonce);
    rc = encoded(c);
    if (rc == 0)
        rc = send_request(c, deadline);
    uint8_t b[4];
    if (rc == 0)
        rc = recv_exact(c, b, 4, deadline);
    if (rc < 0)
        goto out;
    uint32_t echo;
    memcpy(&echo, b, 4);
    if (echo != nonce)
        rc = fail_broken(c, -EPROTO, "ping answered with the wrong nonce");
out:
    op_end(c);
    return rc;
}

int rdzv_status(rdzv_client *c, char **json)
{
    if (!c || !json)
        return invalid(c, "status");
    int rc = op_begin(c, "status", NULL, 0);
    if (rc < 0)
        goto out;
    int64_t deadline = call_deadline(c);
    rdzv__put_u8(&c->sbuf, RDZV_M_STATUS);
    rc = encoded(c);
    if (rc == 0)
        rc = send_request(c, deadline);
    void *p;
    size_t n;
    if (rc == 0)
        rc = recv_vec(c, &p, &n, deadline);
    if (rc == 0)
        *json = p;
out:
    op_end(c);
    return rc;
}

/* A key built like printf(), in a new buffer; NULL when out of memory. */
static char *key_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *key_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return NULL;
    char *s = malloc((size_t)n + 1);
    if (!s)
        return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

/*
 * The barrier. Its keys, all under the client's prefix:
 *   <name>/state     "<gen> <world> <count> <tag>": round <gen> is under way with <count> of
 *                    <world> callers in it (count 0, world 0: nobody is waiting, and the next
 *                    caller opens round <gen> with its own world size). Changed only by
 *                    COMPARE_SET; <tag> is fresh randomness of each writer, so that a writer
 *                    can tell its own successful swap from another's identical one.
 *   <name>/done/<g>  set by the caller that completed round g; the others wait for it.
 * A caller joins the current round with one successful COMPARE_SET. The caller completing a
 * round moves the state on to the next generation (count 0) in the same swap, so a stale
 * arrival can never count towards a later round. A caller whose wait times out withdraws its
 * arrival with another swap, unless the state has moved on meanwhile: then its round completed
 * with it, and it succeeds. Either way its arrival is settled before it returns.
 *
 * The completing caller deletes done/<g-1>. A caller of round g-1 still on its way to the WAIT
 * then (it would have to be overtaken by a whole round) waits until its timeout and succeeds on
 * finding the state moved on; a slow return, never a wrong one.
 */
#define BARRIER_STATE_BYTES 96

typedef struct barrier_round {
    int64_t gen, world, count;
} barrier_round;

/* Parses a state value ("" for a missing key: round 0, empty). Returns 0 or -1 if malformed. */
static int parse_round(const char *s, size_t n, barrier_round *r)
{
    *r = (barrier_round){0, 0, 0};
    if (n == 0)
        return 0;
    char buf[BARRIER_STATE_BYTES];
    if (n >= sizeof buf || memchr(s, 0, n))
        return -1;
    memcpy(buf, s, n);
    buf[n] = 0;
    int used = 0;
    if (sscanf(buf, "%" SCNd64 " %" SCNd64 " %" SCNd64 " %*16[0-9a-f]%n", &r->gen, &r->world,
               &r->count, &used) != 3 ||
        (size_t)used != n)
        return -1;
    if (r->gen < 0 || r->count < 0 || r->world < 0 || r->world > INT_MAX ||
        (r->count == 0) != (r->world == 0) || (r->count > 0 && r->count >= r->world))
        return -1;
    return 0;
}

/*
 * Swaps the state from `cur` (curlen bytes, "" for missing) to `next`. Returns 1 if this call
 * made the swap, 0 if not (then `cur` holds the state found, NUL-terminated, up to
 * BARRIER_STATE_BYTES - 1 bytes, and *curlen its length), or a negative errno. A state longer
 * than the buffer is reported as a malformed one of BARRIER_STATE_BYTES bytes.
 */
static int swap_round(rdzv_client *c, const char *key, char *cur, size_t *curlen,
                      const barrier_round *next, int64_t deadline)
{
    char want[BARRIER_STATE_BYTES];
    int n = snprintf(want, sizeof want, "%" PRId64 " %" PRId64 " %" PRId64 " %016" PRIx64,
                     next->gen, next->world, next->count, rdzv__rng_next(&c->rng));
    assert(n > 0 && (size_t)n < sizeof want);
    void *got = NULL;
    size_t gotlen = 0;
    int rc = do_compare_set(c, key, cur, *curlen, want, (size_t)n, &got, &gotlen, deadline);
    if (rc < 0)
        return rc;
    if (gotlen == (size_t)n && memcmp(got, want, gotlen) == 0) {
        memcpy(cur, want, (size_t)n + 1);
        *curlen = (size_t)n;
        rc = 1;
    } else if (*curlen > 0 && gotlen == *curlen && memcmp(got, cur, gotlen) == 0) {
        /* PyTorch's answer when the key is missing and `expected` is not empty. */
        cur[0] = 0;
        *curlen = 0;
    } else {
        *curlen = gotlen < BARRIER_STATE_BYTES ? gotlen : BARRIER_STATE_BYTES;
        memcpy(cur, got, *curlen < BARRIER_STATE_BYTES ? *curlen : BARRIER_STATE_BYTES - 1);
        cur[*curlen < BARRIER_STATE_BYTES ? *curlen : BARRIER_STATE_BYTES - 1] = 0;
    }
    free(got);
    return rc;
}

static int bad_state(rdzv_client *c, const char *key, const char *cur)
{
    return fail(c, -EPROTO,
                "barrier state '%.64s' holds '%.40s', not a barrier round; was it "
                "changed by hand?",
                key, cur);
}

/* Withdraws this caller's arrival in round `gen` after its wait timed out (see above). */
static int barrier_withdraw(rdzv_client *c, const char *key, char *cur, size_t curlen, int64_t gen,
                            int world_size, int ms)
{
    int64_t deadline = call_deadline(c);
    for (;;) {
        barrier_round r;
        if (parse_round(cur, curlen, &r) < 0)
            return bad_state(c, key, cur);
        if (r.gen > gen)
            return 0; /* the round completed with this caller in it */
        if (r.gen < gen || r.count == 0)
            break; /* reset by hand: nothing of ours to withdraw */
        barrier_round next = {r.gen, r.count > 1 ? r.world : 0, r.count - 1};
        int rc = swap_round(c, key, cur, &curlen, &next, deadline);
        if (rc < 0)
            return rc;
        if (rc == 1) {
            r = next;
            return fail(c, -ETIMEDOUT,
                        "round %" PRId64 " not complete within %d ms: %" PRId64 " of %d arrived "
                        "besides this caller, which has withdrawn",
                        gen, ms, r.count, world_size);
        }
    }
    return fail(c, -ETIMEDOUT, "round %" PRId64 " not complete within %d ms", gen, ms);
}

int rdzv_barrier(rdzv_client *c, const char *name, int world_size, int timeout_ms)
{
    if (!c || !name || world_size < 1)
        return invalid(c, "barrier");
    char *state = NULL, *done = NULL, *old = NULL;
    char cur[BARRIER_STATE_BYTES] = "";
    size_t curlen = 0;
    int rc = op_begin(c, "barrier", &name, 1);
    if (rc < 0)
        goto out;
    int ms = timeout_ms >= 0 ? timeout_ms : c->timeout_ms;
    int64_t deadline = mono_deadline_ns(ms);
    state = key_printf("%s/state", name);
    if (!state) {
        rc = fail(c, -ENOMEM, "out of memory");
        goto out;
    }

    /* Join the round under way, or open one; the last caller of a round completes it. */
    barrier_round r, next;
    do {
        if (parse_round(cur, curlen, &r) < 0) {
            rc = bad_state(c, state, cur);
            goto out;
        }
        if (r.count > 0 && r.world != world_size) {
            rc = fail(c, -EINVAL,
                      "round %" PRId64 " of this barrier is for %" PRId64 " callers (%" PRId64
                      " waiting), not %d: every caller of a round must pass the same world size",
                      r.gen, r.world, r.count, world_size);
            goto out;
        }
        if (r.count + 1 == world_size)
            next = (barrier_round){r.gen + 1, 0, 0};
        else
            next = (barrier_round){r.gen, world_size, r.count + 1};
        rc = swap_round(c, state, cur, &curlen, &next, deadline);
    } while (rc == 0);
    if (rc < 0)
        goto out;

    done = key_printf("%s/done/%" PRId64, name, r.gen);
    old = r.gen > 0 ? key_printf("%s/done/%" PRId64, name, r.gen - 1) : NULL;
    if (!done || (r.gen > 0 && !old)) {
        rc = fail(c, -ENOMEM, "out of memory");
        goto out;
    }
    if (next.gen > r.gen) {
        rc = do_set(c, done, "1", 1, deadline);
        if (rc == 0 && old)
            rc = do_delete(c, old, deadline);
        if (rc > 0)
            rc = 0;
        goto out;
    }
    const char *keys[1] = {done};
    rc = do_wait(c, keys, 1, deadline, ms);
    if (rc == -ETIMEDOUT && !c->broken)
        rc = barrier_withdraw(c, state, cur, curlen, r.gen, world_size, ms);
out:
    free(state);
    free(done);
    free(old);
    op_end(c);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* For the other files of the library (rdzv_internal.h)                                        */
/* ------------------------------------------------------------------------------------------ */

int rdzv__client_timeout_ms(const rdzv_client *c)
{
    return c->timeout_ms;
}

const char *rdzv__client_what(const rdzv_client *c)
{
    return c->what;
}
