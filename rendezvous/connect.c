/*
 * Connecting a client of librendezvous, and its life cycle: resolving the store's address,
 * connecting with exponential backoff and jitter until the deadline, the protocol's opening
 * (VALIDATE and an echoed PING, or with a token the mutual challenge-response of auth.h), and
 * duplicating, describing and closing a client. A failed connect leaves its account in a
 * per-thread buffer, since there is no client to hold it.
 *
 * The operations on a connected client are client.c's; both files share client.h.
 */
#include "client.h"
#include "rdzv.h"
#include "auth.h"
#include "proto.h"
#include "monoclock.h"
#include "errbuf.h"
#include "fmt.h"
#include "rdzv_internal.h"

#include <assert.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/*
 * Connection failures happen before there is a client to hold them, so rdzv_client_connect()
 * keeps its account per thread; rdzv_client_last_error(NULL) returns it.
 */
static _Thread_local errbuf connect_err;

static uint64_t rng_seed(const void *salt)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t s = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 40) ^
                 (uint64_t)(uintptr_t)salt ^ (uint64_t)mono_now_ns();
    return s ? s : 0x9E3779B97F4A7C15ULL;
}

void rdzv_client_options_init(rdzv_client_options *opts)
{
    if (!opts)
        return;
    memset(opts, 0, sizeof *opts);
    opts->connect_timeout_ms = 60000;
    opts->timeout_ms = 300000;
    opts->backoff_initial_ms = 10;
    opts->backoff_max_ms = 1000;
    opts->prefix = NULL;
    opts->refused_timeout_ms = -1;
    opts->handshake_timeout_ms = 5000;
}

/* Frees a copy of a token, wiping it first. */
static void free_token(char *token)
{
    if (token)
        explicit_bzero(token, strlen(token));
    free(token);
}

/* Connection errors worth another attempt: the server may not be up or reachable yet. */
static bool retryable(int err)
{
    switch (err) {
    case ECONNREFUSED:
    case ETIMEDOUT:
    case ENETUNREACH:
    case EHOSTUNREACH:
    case ENETDOWN:
    case EHOSTDOWN:
    case ECONNRESET:
    case ECONNABORTED:
    case EPIPE:
    case EAGAIN:
    case EADDRNOTAVAIL:
    case ENOBUFS:
    case EINTR:
        return true;
    default:
        return false;
    }
}

/*
 * Tries each address once, in getaddrinfo()'s order, giving each an equal share of the time left
 * before `deadline` (so one silent address cannot eat the whole budget). Returns a connected,
 * non-blocking socket, or a negative errno from the last address tried.
 */
static int connect_addrs(const struct addrinfo *list, int64_t deadline)
{
    int naddr = 0;
    for (const struct addrinfo *ai = list; ai; ai = ai->ai_next)
        naddr++;
    int err = -EHOSTUNREACH;
    for (const struct addrinfo *ai = list; ai; ai = ai->ai_next, naddr--) {
        int fd =
            socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            err = -errno;
            continue;
        }
        int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (rc < 0 && errno == EINPROGRESS) {
            int64_t share = deadline;
            if (deadline != NO_DEADLINE && naddr > 1)
                share = mono_now_ns() + (deadline - mono_now_ns()) / naddr;
            rc = rdzv__wait_fd(fd, POLLOUT, share);
            if (rc == 0) {
                int soerr = 0;
                socklen_t sl = sizeof soerr;
                if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
                    soerr = errno;
                rc = soerr ? -soerr : 0;
            }
        } else if (rc < 0) {
            rc = -errno;
        }
        if (rc == 0)
            return fd;
        close(fd);
        err = rc;
    }
    return err;
}

/* Maps a getaddrinfo() failure to a negative errno; *retry tells whether it may pass. */
static int gai_errno(int gai, bool *retry)
{
    *retry = false;
    switch (gai) {
    case EAI_AGAIN:
        *retry = true;
        return -EAGAIN;
    case EAI_MEMORY:
        return -ENOMEM;
    case EAI_SYSTEM:
        return errno ? -errno : -EIO;
    case EAI_FAMILY:
    case EAI_SERVICE:
    case EAI_SOCKTYPE:
    case EAI_BADFLAGS:
        return -EINVAL;
    default: /* EAI_NONAME, EAI_FAIL, EAI_NODATA, ... */
        return -EHOSTUNREACH;
    }
}

/*
 * Opens the modern protocol on a fresh connection: VALIDATE with the magic, then a PING whose
 * nonce must come back, both in one segment. Returns 0, -EPROTO (the peer answered something
 * else), -ETIMEDOUT, or an I/O error such as -ECONNRESET. Leaves the client unbroken either
 * way; the caller closes the socket on failure.
 */
static int handshake(rdzv_client *c, int64_t deadline)
{
    uint32_t nonce = (uint32_t)rdzv__rng_next(&c->rng);
    uint8_t req[10];
    rdzv__wbuf w = rdzv__wbuf_fixed(req, sizeof req);
    rdzv__put_u8(&w, RDZV_M_VALIDATE);
    rdzv__put_u32(&w, RDZV_VALIDATE_MAGIC);
    rdzv__put_u8(&w, RDZV_M_PING);
    rdzv__put_u32(&w, nonce);
    assert(w.err == 0 && w.len == sizeof req);
    int rc = rdzv__send_all(c, req, sizeof req, deadline, NULL);
    if (rc < 0)
        return rc;
    uint8_t b[4];
    rc = rdzv__recv_raw(c, b, 4, deadline);
    if (rc < 0)
        return rc;
    uint32_t echo;
    memcpy(&echo, b, 4);
    if (echo != nonce)
        return -EPROTO;
    return 0;
}

/* Reads a vector reply of at most `cap` bytes of a handshake into buf; -EPROTO if longer. */
static int recv_small_vec(rdzv_client *c, uint8_t *buf, size_t cap, size_t *len, int64_t deadline)
{
    uint8_t b[8];
    uint64_t n;
    int rc = rdzv__recv_raw(c, b, 8, deadline);
    if (rc < 0)
        return rc;
    memcpy(&n, b, 8);
    if (n > cap)
        return -EPROTO;
    if ((rc = rdzv__recv_raw(c, buf, (size_t)n, deadline)) < 0)
        return rc;
    *len = (size_t)n;
    return 0;
}

/*
 * Opens the modern protocol with authentication (auth.h): VALIDATE and AUTH_HELLO with a fresh
 * nonce in one segment, then the server's proof is checked and ours sent, and the server's
 * acceptance read. Returns 0; -EACCES with the reason in `why` when either side fails to prove
 * that it knows the token (not worth retrying); -EPROTO (the peer answered something else); or
 * an I/O error. The caller closes the socket on failure.
 */
static int auth_handshake(rdzv_client *c, int64_t deadline, char *why, size_t whylen)
{
    uint8_t cn[RDZV_AUTH_NONCE_BYTES], proof[RDZV_AUTH_MAC_BYTES];
    uint8_t reply[RDZV_AUTH_HELLO_REPLY_BYTES];
    uint8_t req[1 + 4 + 1 + 8 + RDZV_AUTH_NONCE_BYTES];
    size_t n = 0;
    int rc = rdzv__auth_nonce(cn);
    if (rc < 0)
        return rc;
    rdzv__wbuf w = rdzv__wbuf_fixed(req, sizeof req);
    rdzv__put_u8(&w, RDZV_M_VALIDATE);
    rdzv__put_u32(&w, RDZV_VALIDATE_MAGIC);
    rdzv__put_u8(&w, RDZV_M_AUTH_HELLO);
    rdzv__put_vec(&w, cn, sizeof cn);
    assert(w.err == 0 && w.len == sizeof req);
    if ((rc = rdzv__send_all(c, req, sizeof req, deadline, NULL)) < 0 ||
        (rc = recv_small_vec(c, reply, sizeof reply, &n, deadline)) < 0)
        return rc;
    rc = rdzv__auth_client_check(c->token, cn, reply, n, proof);
    if (rc == -ENOKEY || rc == -EKEYREJECTED) {
        snprintf(why, whylen, "%s",
                 rc == -ENOKEY ? "the store has no secret, so it cannot be this job's (started "
                                 "without a token?)"
                               : "the store could not prove that it knows the job's secret "
                                 "(another job's store, or an impostor)");
        return -EACCES;
    }
    if (rc < 0)
        return rc;
    uint8_t msg[1 + 8 + RDZV_AUTH_MAC_BYTES];
    w = rdzv__wbuf_fixed(msg, sizeof msg);
    rdzv__put_u8(&w, RDZV_M_AUTH_PROOF);
    rdzv__put_vec(&w, proof, sizeof proof);
    assert(w.err == 0 && w.len == sizeof msg);
    if ((rc = rdzv__send_all(c, msg, sizeof msg, deadline, NULL)) < 0)
        return rc;
    rc = recv_small_vec(c, reply, sizeof reply, &n, deadline);
    if (rc == -ECONNRESET) {
        /* The store proved itself, then closed on our proof: it holds another secret. */
        snprintf(why, whylen, "the store refused this client's proof of the job's secret");
        return -EACCES;
    }
    if (rc < 0)
        return rc;
    return n == 1 && reply[0] == RDZV_AUTH_STATUS_OK ? 0 : -EPROTO;
}

int rdzv_client_connect(const char *host, int port, const rdzv_client_options *opts,
                        rdzv_client **out)
{
    rdzv_client_options defaults;
    rdzv_client *c = NULL;
    struct addrinfo *list = NULL;
    char endpoint[300];
    char why[300] = "";
    const char *stage = "connect to";
    int rc = 0;
    int attempts = 0;

    errbuf_clear(&connect_err);
    if (!opts) {
        rdzv_client_options_init(&defaults);
        opts = &defaults;
    }
    if (!host || !out || port <= 0 || port > 65535 || opts->backoff_initial_ms < 0 ||
        opts->backoff_max_ms < opts->backoff_initial_ms) {
        snprintf(connect_err.msg, sizeof connect_err.msg,
                 "rdzv_client_connect: invalid argument (host %s, port %d, backoff %d..%d ms)",
                 host ? host : "NULL", port, opts->backoff_initial_ms, opts->backoff_max_ms);
        return -EINVAL;
    }
    fmt_endpoint(endpoint, sizeof endpoint, host, port);
    int64_t deadline = mono_deadline_ns(opts->connect_timeout_ms);

    c = calloc(1, sizeof *c);
    if (!c) {
        rc = -ENOMEM;
        snprintf(why, sizeof why, "out of memory");
        goto out;
    }
    c->fd = -1;
    c->timeout_ms = opts->timeout_ms;
    c->rng = rng_seed(c);
    if (opts->prefix && opts->prefix[0]) {
        c->prefix = strdup(opts->prefix);
        if (!c->prefix) {
            rc = -ENOMEM;
            snprintf(why, sizeof why, "out of memory");
            goto out;
        }
        c->prefix_len = strlen(c->prefix);
    }
    if (opts->token) {
        if (rdzv_token_check(opts->token) < 0) {
            rc = -EINVAL;
            snprintf(why, sizeof why, "the token is not %d to %d printable characters",
                     RDZV_TOKEN_MIN_BYTES, RDZV_TOKEN_MAX_BYTES);
            goto out;
        }
        if (!(c->token = strdup(opts->token))) {
            rc = -ENOMEM;
            snprintf(why, sizeof why, "out of memory");
            goto out;
        }
    }

    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_protocol = IPPROTO_TCP,
                             .ai_flags = AI_NUMERICSERV};
    int64_t backoff_ms = opts->backoff_initial_ms;
    int64_t start = mono_now_ns();
    /* The handshake window opens at the first accepted connection (and again after a refusal:
     * whatever held the port went away). 0: not open. */
    int64_t hs_end = 0;
    int hs_closed = 0; /* handshakes the peer closed within the window */
    for (;;) {
        /* One attempt: resolve (names may appear late), connect, then the handshake. */
        attempts++;
        bool retry;
        errno = 0;
        int gai = getaddrinfo(host, portstr, &hints, &list);
        if (gai != 0) {
            list = NULL;
            stage = "resolve";
            rc = gai_errno(gai, &retry);
            snprintf(why, sizeof why, "%s",
                     gai == EAI_SYSTEM ? rdzv_strerror(rc) : gai_strerror(gai));
        } else {
            stage = "connect to";
            rc = connect_addrs(list, deadline);
            freeaddrinfo(list);
            list = NULL;
            int64_t hs_deadline = deadline;
            if (rc >= 0) {
                c->fd = rc;
                c->rpos = c->rlen = 0;
                int one = 1;
                setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                stage = "handshake with";
                why[0] = 0;
                if (opts->handshake_timeout_ms >= 0) {
                    if (hs_end == 0)
                        hs_end = mono_now_ns() + (int64_t)opts->handshake_timeout_ms * 1000000;
                    if (hs_end < hs_deadline)
                        hs_deadline = hs_end;
                }
                rc = c->token ? auth_handshake(c, hs_deadline, why, sizeof why)
                              : handshake(c, hs_deadline);
                if (rc == 0)
                    break;
                close(c->fd);
                c->fd = -1;
            } else if (rc == -ECONNREFUSED) {
                hs_end = 0;
                hs_closed = 0;
            }
            retry = retryable(-rc);
            bool in_handshake = strcmp(stage, "handshake with") == 0;
            bool closed = rc == -ECONNRESET || rc == -EPIPE || rc == -ECONNABORTED;
            if (in_handshake && closed)
                hs_closed++;
            if (rc == -EACCES && why[0]) {
                ; /* auth_handshake() said why */
            } else if (rc == -EPROTO) {
                snprintf(why, sizeof why,
                         "the peer answered the handshake with something else: not a ddprun or "
                         "PyTorch store (another service on this port?)");
            } else if (in_handshake && hs_end != 0 &&
                       ((rc == -ETIMEDOUT && hs_deadline < deadline) ||
                        (closed && mono_now_ns() >= hs_end))) {
                if (hs_closed > 0)
                    snprintf(why, sizeof why,
                             "the peer accepted and closed %d connection%s without answering the "
                             "handshake within %d ms: not a ddprun or PyTorch store (another "
                             "service on this port?), or a store refusing connections (at its "
                             "connection limit?)",
                             hs_closed, hs_closed == 1 ? "" : "s", opts->handshake_timeout_ms);
                else
                    snprintf(why, sizeof why,
                             "the peer accepted the connection but did not answer the handshake "
                             "within %d ms: not a ddprun or PyTorch store (another service on "
                             "this port?), or a store that has stopped serving",
                             opts->handshake_timeout_ms);
                rc = -EPROTO;
                retry = false;
            } else if (rc == -ETIMEDOUT && in_handshake) {
                snprintf(why, sizeof why, "no answer to the handshake");
            } else if (rc == -ECONNREFUSED && opts->refused_timeout_ms >= 0 &&
                       mono_now_ns() - start >= (int64_t)opts->refused_timeout_ms * 1000000) {
                snprintf(why, sizeof why, "%s: nothing listens there%s", rdzv_strerror(rc),
                         opts->refused_timeout_ms > 0 ? " (still, after waiting for it)" : "");
                retry = false;
            } else {
                snprintf(why, sizeof why, "%s", rdzv_strerror(rc));
            }
        }
        if (!retry)
            goto out;
        if (deadline != NO_DEADLINE && mono_now_ns() >= deadline) {
            rc = -ETIMEDOUT;
            goto out;
        }
        /*
         * Back off by a uniform draw from [backoff/2, backoff], never past the deadline (one
         * last attempt happens there), then double the backoff up to its ceiling.
         */
        int64_t half = backoff_ms / 2;
        int64_t delay_ms =
            backoff_ms - (half > 0 ? (int64_t)(rdzv__rng_next(&c->rng) % (half + 1)) : 0);
        int64_t wake = mono_now_ns() + delay_ms * 1000000;
        mono_sleep_until(wake < deadline ? wake : deadline);
        backoff_ms *= 2;
        if (backoff_ms < 1)
            backoff_ms = 1;
        if (backoff_ms > opts->backoff_max_ms)
            backoff_ms = opts->backoff_max_ms;
    }
    *out = c;
    return 0;

out:
    snprintf(connect_err.msg, sizeof connect_err.msg, "%s %.250s: %s (after %d attempt%s)%s", stage,
             strcmp(stage, "resolve") == 0 ? host : endpoint, why, attempts,
             attempts == 1 ? "" : "s",
             rc == -ETIMEDOUT && deadline != NO_DEADLINE ? "; connect timeout passed" : "");
    if (c) {
        free(c->prefix);
        free_token(c->token);
        free(c);
    }
    return rc;
}

/* Numeric host and port of one end of the client's socket (peer or local). */
static int socket_endpoint(const rdzv_client *c, bool peer, char *host, size_t hostlen, int *port)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    char serv[16];
    if (!c || !host || hostlen == 0)
        return -EINVAL;
    if (c->fd < 0)
        return -ENOTCONN;
    if ((peer ? getpeername(c->fd, (struct sockaddr *)&ss, &len)
              : getsockname(c->fd, (struct sockaddr *)&ss, &len)) != 0)
        return -errno;
    int gai = getnameinfo((struct sockaddr *)&ss, len, host, hostlen, serv, sizeof serv,
                          NI_NUMERICHOST | NI_NUMERICSERV);
    if (gai != 0)
        return gai == EAI_OVERFLOW ? -ENOSPC : -EINVAL;
    if (port)
        *port = atoi(serv);
    return 0;
}

int rdzv_client_local_addr(const rdzv_client *c, char *host, size_t hostlen)
{
    return socket_endpoint(c, false, host, hostlen, NULL);
}

int rdzv_client_local_endpoint(const rdzv_client *c, char *host, size_t hostlen, int *port)
{
    if (!port)
        return -EINVAL;
    int p = 0;
    int rc = socket_endpoint(c, false, host, hostlen, &p);
    if (rc < 0)
        return rc;
    if (strncmp(host, "::ffff:", 7) == 0 && strchr(host + 7, '.'))
        memmove(host, host + 7, strlen(host + 7) + 1);
    *port = p;
    return 0;
}

int rdzv_client_dup(const rdzv_client *c, rdzv_client **out)
{
    char host[NI_MAXHOST];
    int port = 0;
    if (!out)
        return -EINVAL;
    int rc = socket_endpoint(c, true, host, sizeof host, &port);
    if (rc < 0)
        return rc;
    rdzv_client_options opts;
    rdzv_client_options_init(&opts);
    opts.timeout_ms = c->timeout_ms;
    opts.prefix = c->prefix;
    opts.token = c->token;
    if (c->timeout_ms >= 0 && c->timeout_ms < opts.connect_timeout_ms)
        opts.connect_timeout_ms = c->timeout_ms;
    return rdzv_client_connect(host, port, &opts, out);
}

void rdzv_client_close(rdzv_client *c)
{
    if (!c)
        return;
    if (c->fd >= 0)
        close(c->fd);
    free(c->prefix);
    free_token(c->token);
    rdzv__wbuf_free(&c->sbuf);
    free(c);
}

const char *rdzv_client_last_error(const rdzv_client *c)
{
    return c ? c->err : connect_err.msg;
}

int rdzv__client_error(rdzv_client *c, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (c)
        vsnprintf(c->err, sizeof c->err, fmt, ap);
    else
        errbuf_vset(&connect_err, err, fmt, ap);
    va_end(ap);
    return err;
}
