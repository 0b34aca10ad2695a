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
 *   <name>/state      "<epoch> <world> <base>": the rounds of epoch <epoch> are for <world>
 *                     callers each and are numbered from <base>. Written only with COMPARE_SET:
 *                     created by the barrier's first caller, moved to the next epoch when a
 *                     caller with another world size finds no round under way.
 *   <name>/count/<e>/<world>
 *                     the arrivals of epoch e, counted with ADD: arrival k (from 1) belongs to
 *                     round <base> + (k-1)/world, and the arrival that makes k a multiple of the
 *                     world completes that round. The low BARRIER_ARRIVAL_BITS bits hold k (an
 *                     epoch takes up to 2^40 arrivals), the bits above them the tag of the last
 *                     withdrawal (below); a negative value marks the epoch closed (below).
 *   <name>/done/<g>   set by the caller that completed round g; the others wait for it.
 * An arrival is one COMPARE_SET that reads the state (and creates it for the barrier's first
 * caller), one ADD and one WAIT; the completing caller sets its round's key instead of waiting
 * and deletes the key of the round before. Arrivals beyond a round's end are arrivals in the next
 * round, so callers that come once a round is full join the next one.
 *
 * The COMPARE_SET and the ADD go out together, the ADD to the count of a guessed epoch: the one
 * this client was in at its last call on the barrier, or epoch 0. The server runs them in order,
 * so if the state names the guessed epoch for the caller's world, the ADD came after it and
 * counted in it unless the epoch closed in between (then the ADD answers a negative count). If
 * the state names another epoch, the ADD counted for nothing: it went to an older epoch, closed
 * by then since only the newest is open, or to a key no epoch uses, the world being part of the
 * count's name; the caller then adds itself to the right count. Only epochs are guessed, so an
 * arrival needs two round trips, as a plain ADD and WAIT would.
 *
 * A caller whose wait times out withdraws its arrival: it moves the count one down with
 * COMPARE_SET, and only while the count is below the end of its round. Nothing else lowers a
 * count, so the end of a round is reached once and its completer is unique; if the count got
 * there first, the round completed with the caller in it, and the caller succeeds. The lowered
 * count carries a fresh random tag, so that of two callers making the same withdrawal at once,
 * each can tell whether the swap was its own (unless both drew the same tag, a chance of one in
 * 2^22).
 *
 * A caller with another world size than the epoch's reads the count (ADD 0): a count that is not
 * a multiple of the world is a round under way, and the caller fails with -EINVAL, never having
 * counted itself. Otherwise it closes the epoch, swapping the count for -(R + 1) * 2^20 (R: the
 * rounds the epoch completed), and then moves the state on to "<e+1> <its world> <base + R>".
 * An ADD that finds the count closed counts for nothing; its caller moves the state on the same
 * way, so a closer that dies between its two swaps does not stall the barrier, and R can be read
 * from a closed count as long as fewer than 2^20 such ADDs reach it. Each change of world size
 * leaves one closed count key behind, and a caller with another world size than the epoch's
 * leaves the count key of its guess, which no epoch uses.
 *
 * The completing caller deletes done/<g-1>. A caller of round g-1 still on its way to the WAIT
 * then (it would have to be overtaken by a whole round) waits until its timeout and succeeds on
 * finding the count past its round's end; a slow return, never a wrong one.
 */
#define BARRIER_STATE_BYTES 96
#define BARRIER_COUNT_BYTES 24
#define BARRIER_ARRIVAL_BITS 40
#define BARRIER_ARRIVALS(v) ((v) & ((INT64_C(1) << BARRIER_ARRIVAL_BITS) - 1))
#define BARRIER_TAGS (UINT64_C(1) << (62 - BARRIER_ARRIVAL_BITS)) /* values stay below 2^62 */
#define BARRIER_CLOSED_SHIFT 20

typedef struct barrier_epoch {
    int64_t epoch, world, base;
} barrier_epoch;

/* One call of rdzv_barrier(): its keys and the state as last read. */
typedef struct barrier_call {
    rdzv_client *c;
    const char *name;              /* borrowed from the caller */
    char *state;                   /* "<name>/state" */
    char *count;                   /* "<name>/count/<e>/<world>" of the epoch in `ep` */
    char cur[BARRIER_STATE_BYTES]; /* the state value as last read, NUL-terminated */
    size_t curlen;
    barrier_epoch ep; /* `cur`, parsed */
    int64_t deadline;
} barrier_call;

/* The count value of an epoch closed after completing `rounds` rounds. */
static int64_t closed_mark(int64_t rounds)
{
    return -(int64_t)(((uint64_t)rounds + 1) << BARRIER_CLOSED_SHIFT);
}

/* The rounds completed by an epoch whose count `v` (< 0) is closed: the inverse of closed_mark()
 * for up to 2^20 - 1 ADDs of one after the mark. */
static int64_t closed_rounds(int64_t v)
{
    uint64_t below = (uint64_t)0 - (uint64_t)v;
    return (int64_t)((below + (UINT64_C(1) << BARRIER_CLOSED_SHIFT) - 1) >> BARRIER_CLOSED_SHIFT) -
           1;
}

/* Parses a state value. Returns 0, or -1 if malformed. */
static int parse_epoch(const char *s, size_t n, barrier_epoch *ep)
{
    char buf[BARRIER_STATE_BYTES];
    if (n == 0 || n >= sizeof buf || memchr(s, 0, n))
        return -1;
    memcpy(buf, s, n);
    buf[n] = 0;
    int used = 0;
    if (sscanf(buf, "%" SCNd64 " %" SCNd64 " %" SCNd64 "%n", &ep->epoch, &ep->world, &ep->base,
               &used) != 3 ||
        (size_t)used != n)
        return -1;
    if (ep->epoch < 0 || ep->world < 1 || ep->world > INT_MAX || ep->base < 0)
        return -1;
    return 0;
}

/* A count above every value the barrier writes (the tags keep them below 2^62). */
static bool barrier_count_bad(int64_t v)
{
    return v >= (INT64_C(1) << 62);
}

/* Parses a count value (decimal, as ADD writes it). Returns 0, or -1 if malformed. */
static int parse_count(const char *s, size_t n, int64_t *v)
{
    char buf[BARRIER_COUNT_BYTES];
    if (n == 0 || n >= sizeof buf || memchr(s, 0, n))
        return -1;
    memcpy(buf, s, n);
    buf[n] = 0;
    char *end = NULL;
    errno = 0;
    long long x = strtoll(buf, &end, 10);
    if (errno != 0 || *end != 0 || barrier_count_bad(x))
        return -1;
    *v = x;
    return 0;
}

static int bad_key(rdzv_client *c, const char *key, const char *what, const void *val, size_t n)
{
    return fail(c, -EPROTO, "%s '%.64s' holds '%.*s', not a barrier %s; was it changed by hand?",
                what, key, n < 40 ? (int)n : 40, val ? (const char *)val : "", what);
}

/*
 * Takes the state value `v` (n bytes) as the barrier's state: parses it and names the epoch's
 * count key. Returns 0, -EPROTO if it is no state, or -ENOMEM.
 */
static int barrier_take(barrier_call *b, const void *v, size_t n)
{
    barrier_epoch ep;
    if (parse_epoch(v, n, &ep) < 0)
        return bad_key(b->c, b->state, "state", v, n);
    memcpy(b->cur, v, n);
    b->cur[n] = 0;
    b->curlen = n;
    if (!b->count || ep.epoch != b->ep.epoch || ep.world != b->ep.world) {
        free(b->count);
        b->count = key_printf("%s/count/%" PRId64 "/%" PRId64, b->name, ep.epoch, ep.world);
        if (!b->count)
            return fail(b->c, -ENOMEM, "out of memory");
    }
    b->ep = ep;
    return 0;
}

/*
 * Swaps the state from `b->cur` (or from missing, when b->curlen is 0) to `next` and takes the
 * state found: `next` if the swap was made, another caller's state if not. Returns 0 or a
 * negative errno.
 */
static int barrier_swap_state(barrier_call *b, const barrier_epoch *next)
{
    char want[BARRIER_STATE_BYTES];
    int n = snprintf(want, sizeof want, "%" PRId64 " %" PRId64 " %" PRId64, next->epoch,
                     next->world, next->base);
    assert(n > 0 && (size_t)n < sizeof want);
    void *got = NULL;
    size_t gotlen = 0;
    int rc = do_compare_set(b->c, b->state, b->cur, b->curlen, want, (size_t)n, &got, &gotlen,
                            b->deadline);
    if (rc == 0 && b->curlen > 0 && gotlen == b->curlen && memcmp(got, b->cur, gotlen) == 0) {
        /* PyTorch's answer when the key is missing and `expected` is not empty: start over. */
        b->curlen = 0;
        free(got);
        got = NULL;
        rc = do_compare_set(b->c, b->state, "", 0, want, (size_t)n, &got, &gotlen, b->deadline);
    }
    if (rc == 0)
        rc = barrier_take(b, got, gotlen);
    free(got);
    return rc;
}

/* Moves the state on from the epoch in `b->ep`, which completed `rounds` rounds, to an epoch for
 * `world` callers (unless another caller moved it first). Returns 0 or a negative errno. */
static int barrier_next_epoch(barrier_call *b, int64_t rounds, int world)
{
    barrier_epoch next = {b->ep.epoch + 1, world, b->ep.base + rounds};
    return barrier_swap_state(b, &next);
}

/*
 * Swaps the count of the epoch from `from` to `to`. Returns 1 if this call made the swap, 0 if
 * not (then *now holds the count found), or a negative errno: -EPROTO when the count is missing
 * or holds something else than a count.
 */
static int barrier_swap_count(barrier_call *b, int64_t from, int64_t to, int64_t deadline,
                              int64_t *now)
{
    char exp[BARRIER_COUNT_BYTES], want[BARRIER_COUNT_BYTES];
    int en = snprintf(exp, sizeof exp, "%" PRId64, from);
    int wn = snprintf(want, sizeof want, "%" PRId64, to);
    void *got = NULL;
    size_t gotlen = 0;
    int rc =
        do_compare_set(b->c, b->count, exp, (size_t)en, want, (size_t)wn, &got, &gotlen, deadline);
    if (rc < 0)
        return rc;
    if (gotlen == (size_t)wn && memcmp(got, want, gotlen) == 0)
        rc = 1;
    else if (parse_count(got, gotlen, now) < 0 || *now == from)
        rc = bad_key(b->c, b->count, "count", got, gotlen);
    free(got);
    return rc;
}

static int bad_count(barrier_call *b, int64_t v)
{
    char text[BARRIER_COUNT_BYTES];
    int n = snprintf(text, sizeof text, "%" PRId64, v);
    return bad_key(b->c, b->count, "count", text, (size_t)n);
}

/* Adds `delta` to the epoch's count. Returns 0 (*v: the count after it), -EPROTO for a count
 * the barrier does not write, or another negative errno. */
static int barrier_add(barrier_call *b, int64_t delta, int64_t deadline, int64_t *v)
{
    int rc = do_add(b->c, b->count, delta, v, deadline);
    if (rc == 0 && barrier_count_bad(*v))
        rc = bad_count(b, *v);
    return rc;
}

/* True once `deadline` has passed: ends a loop of requests that each succeed. */
static bool barrier_late(barrier_call *b, int64_t deadline, int *rc)
{
    if (mono_now_ns() < deadline)
        return false;
    *rc = fail(b->c, -ETIMEDOUT, "the barrier's state kept changing until the deadline");
    return true;
}

/*
 * Handles a caller for `world` that finds the epoch for another world size: -EINVAL if a round
 * is under way, else closes the epoch and moves the state on. Returns 0 (the state moved on: try
 * again) or a negative errno.
 */
static int barrier_switch(barrier_call *b, int world)
{
    int64_t v;
    int rc = barrier_add(b, 0, b->deadline, &v);
    while (rc == 0) {
        if (v < 0)
            return barrier_next_epoch(b, closed_rounds(v), world);
        int64_t k = BARRIER_ARRIVALS(v), w = b->ep.world;
        if (k % w != 0)
            return fail(b->c, -EINVAL,
                        "round %" PRId64 " of this barrier is for %" PRId64 " callers (%" PRId64
                        " waiting), not %d: every caller of a round must pass the same world size",
                        b->ep.base + k / w, w, k % w, world);
        rc = barrier_swap_count(b, v, closed_mark(k / w), b->deadline, &v);
        if (rc == 1)
            return barrier_next_epoch(b, k / w, world);
        if (rc == 0 && barrier_late(b, b->deadline, &rc))
            break;
    }
    return rc;
}

/* A hash of a barrier's name (FNV-1a), for the client's guess of its epoch. */
static uint64_t barrier_hash(const char *name)
{
    uint64_t h = UINT64_C(14695981039346656037);
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * UINT64_C(1099511628211);
    return h;
}

/*
 * Reads the state (creating it for the barrier's first caller) and, in the same round trip,
 * counts this arrival in epoch `guess` for `world` callers (see above). Returns 1 if it counted
 * (*t: the count after it), 0 if it counted for nothing, or a negative errno.
 */
static int barrier_arrive_guessed(barrier_call *b, int64_t guess, int world, int64_t *t)
{
    rdzv_client *c = b->c;
    char want[BARRIER_STATE_BYTES];
    int n = snprintf(want, sizeof want, "0 %d 0", world);
    char *count = key_printf("%s/count/%" PRId64 "/%d", b->name, guess, world);
    if (!count)
        return fail(c, -ENOMEM, "out of memory");
    rdzv__wbuf_reset(&c->sbuf);
    rdzv__put_u8(&c->sbuf, RDZV_M_COMPARE_SET);
    put_key(c, b->state);
    rdzv__put_vec(&c->sbuf, "", 0);
    rdzv__put_vec(&c->sbuf, want, (size_t)n);
    rdzv__put_u8(&c->sbuf, RDZV_M_ADD);
    put_key(c, count);
    rdzv__put_i64(&c->sbuf, 1);
    free(count);
    void *got = NULL;
    size_t gotlen = 0;
    int rc = encoded(c);
    if (rc == 0)
        rc = send_request(c, b->deadline);
    if (rc == 0)
        rc = recv_vec(c, &got, &gotlen, b->deadline);
    if (rc == 0)
        rc = recv_i64(c, t, b->deadline);
    if (rc == 0)
        rc = barrier_take(b, got, gotlen);
    free(got);
    if (rc < 0)
        return rc;
    if (b->ep.epoch != guess || b->ep.world != world || *t < 0)
        return 0;
    return barrier_count_bad(*t) ? bad_count(b, *t) : 1;
}

/* Withdraws arrival k (of round g) after its wait timed out (see above). */
static int barrier_withdraw(barrier_call *b, int64_t k, int64_t g, int world, int ms)
{
    int64_t deadline = call_deadline(b->c);
    int64_t round = (k - 1) / world, start = round * world, end = start + world, v;
    int rc = barrier_add(b, 0, deadline, &v);
    while (rc == 0) {
        if (v < 0 && closed_rounds(v) > round)
            return 0; /* the round completed with this caller in it, then the epoch closed */
        int64_t n = v < 0 ? 0 : BARRIER_ARRIVALS(v);
        if (n >= end)
            return 0; /* the round completed with this caller in it */
        if (n <= start)
            break; /* reset by hand: nothing of ours to withdraw */
        uint64_t tag = ((uint64_t)v >> BARRIER_ARRIVAL_BITS) + 1 +
                       rdzv__rng_next(&b->c->rng) % (BARRIER_TAGS - 1);
        int64_t next = (int64_t)((tag % BARRIER_TAGS) << BARRIER_ARRIVAL_BITS) | (n - 1);
        rc = barrier_swap_count(b, v, next, deadline, &v);
        if (rc == 1)
            return fail(b->c, -ETIMEDOUT,
                        "round %" PRId64 " not complete within %d ms: %" PRId64 " of %d arrived "
                        "besides this caller, which has withdrawn",
                        g, ms, n - 1 - start, world);
        if (rc == 0 && barrier_late(b, deadline, &rc))
            break;
    }
    if (rc < 0)
        return rc;
    return fail(b->c, -ETIMEDOUT, "round %" PRId64 " not complete within %d ms", g, ms);
}

int rdzv_barrier(rdzv_client *c, const char *name, int world_size, int timeout_ms)
{
    if (!c || !name || world_size < 1)
        return invalid(c, "barrier");
    barrier_call b = {.c = c, .name = name};
    char *done = NULL, *old = NULL;
    int rc = op_begin(c, "barrier", &name, 1);
    if (rc < 0)
        goto out;
    int ms = timeout_ms >= 0 ? timeout_ms : c->timeout_ms;
    b.deadline = mono_deadline_ns(ms);
    b.state = key_printf("%s/state", name);
    if (!b.state) {
        rc = fail(c, -ENOMEM, "out of memory");
        goto out;
    }

    /* Read the state (the first caller creates it) and count this arrival in the guessed epoch;
     * if the guess was wrong, count it in the state's epoch. */
    uint64_t hash = barrier_hash(name);
    int64_t t = 0;
    rc = barrier_arrive_guessed(&b, c->barrier_hash == hash ? c->barrier_epoch : 0, world_size, &t);
    while (rc == 0) {
        if (b.ep.world != world_size) {
            rc = barrier_switch(&b, world_size);
        } else {
            rc = barrier_add(&b, 1, b.deadline, &t);
            if (rc == 0 && t >= 0)
                break;
            if (rc == 0)
                rc = barrier_next_epoch(&b, closed_rounds(t), world_size);
        }
        if (rc == 0 && barrier_late(&b, b.deadline, &rc))
            break;
    }
    if (rc < 0)
        goto out;
    c->barrier_hash = hash;
    c->barrier_epoch = b.ep.epoch;
    int64_t k = BARRIER_ARRIVALS(t);
    if (k == 0) {
        rc = bad_count(&b, t);
        goto out;
    }
    int64_t g = b.ep.base + (k - 1) / world_size;
    done = key_printf("%s/done/%" PRId64, name, g);
    old = g > 0 ? key_printf("%s/done/%" PRId64, name, g - 1) : NULL;
    if (!done || (g > 0 && !old)) {
        rc = fail(c, -ENOMEM, "out of memory");
        goto out;
    }
    if (k % world_size == 0) {
        rc = do_set(c, done, "1", 1, b.deadline);
        if (rc == 0 && old)
            rc = do_delete(c, old, b.deadline);
        if (rc > 0)
            rc = 0;
        goto out;
    }
    const char *keys[1] = {done};
    rc = do_wait(c, keys, 1, b.deadline, ms);
    if (rc == -ETIMEDOUT && !c->broken)
        rc = barrier_withdraw(&b, k, g, world_size, ms);
out:
    free(b.state);
    free(b.count);
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
