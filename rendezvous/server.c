/*
 * The libuv TCP server of librendezvous: accepts connections, feeds their bytes through the
 * incremental parser into the store, and sends the replies the store queued.
 *
 * Reading uses one 64 KiB buffer per server; a connection only holds bytes of its own while a
 * frame is incomplete, so idle connections cost no buffer. After each read callback every
 * connection that got output (the reader, and any whose WAIT it released) is flushed with
 * uv_try_write, and what the kernel did not take goes to uv_write. A peer that stops reading
 * its replies is itself no longer read once max_pending_output bytes are queued for it.
 *
 * Bad input closes that one connection with one log line. Nothing a client sends can block
 * another: the loop never waits on a single connection. Accept failures (EMFILE and the like)
 * are logged, at most once a second, and the server keeps serving; libuv sheds the pending
 * connection it cannot accept.
 *
 * Access control (a job's control plane, see rdzv-protocol(7) AUTHENTICATION) is decided in
 * two places: admit() on accept (the peer's address, and the owner of a peer socket on this
 * host) and gate() before each request (what an unauthenticated connection may do). The
 * handshake's logic and the rules themselves are auth.c's; this file only applies them.
 *
 * Threading: an embedded server runs on the caller's loop and is not thread-safe; like any libuv
 * program, its host should ignore SIGPIPE. A server started with rdzv_server_start() runs the
 * loop on its own thread, with SIGPIPE blocked there; its `lock` guards the server's state so
 * that rdzv_server_status() may be called from other threads.
 */
#include "auth.h"
#include "rdzv.h"
#include "store.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#define READ_BUF_BYTES (64 * 1024)

typedef struct client {
    uv_tcp_t tcp;
    struct rdzv_server *srv;
    rdzv__conn conn;
    rdzv__parser parser;
    rdzv__buf pend; /* bytes of an incomplete frame */
    struct client *prev, *next;
    bool reading, closing;
    bool probation;       /* from an address not (yet) of the job: may only authenticate */
    rdzv__auth_conn auth; /* the handshake's state; auth.state == RDZV_AUTH_DONE: authenticated */
    char peer[64];
    char addr[INET6_ADDRSTRLEN]; /* numeric peer address at accept, for opts.on_close */
    int port;                    /* peer port at accept; 0: unknown */
} client;

typedef struct write_req {
    uv_write_t req;
    client *c;
    uint8_t *data; /* owned */
} write_req;

struct rdzv_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    rdzv_server_options opts;
    char *host;
    rdzv__limits limits;
    rdzv__store store;
    int port;
    uint64_t start_ms;
    size_t nconns;
    uint64_t accepted, rejected, closed_bad_input;
    uint64_t gens[3]; /* connections by detected generation */
    uint64_t last_accept_log_ms;
    client *clients;

    /* access control (auth.h) */
    char *token;         /* owned; NULL: no authentication */
    rdzv__cidr *allow;   /* owned, opts.nallow of them */
    rdzv__addrset nodes; /* addresses that authenticated connections came from */
    uint32_t euid;       /* the server's owner, for the other-user rule */
    bool owner_warned;   /* logged once that a local peer's owner could not be found */
    uint64_t last_refusal_log_ms, refusals_unlogged;
    uint64_t authenticated, auth_failed, refused_address, refused_user, refused_private;
    int open_handles;
    bool closing;

    /* threaded mode */
    bool threaded;
    bool own_loop_made, lock_made; /* for server_free() of a half-built server */
    uv_loop_t own_loop;
    uv_thread_t thread;
    uv_async_t stop_async;
    uv_mutex_t lock;

    uint8_t rbuf[READ_BUF_BYTES];
};

/* Threaded servers guard their state so that rdzv_server_status() may run on other threads. */
static void lock(rdzv_server *srv)
{
    if (srv->threaded)
        uv_mutex_lock(&srv->lock);
}

static void unlock(rdzv_server *srv)
{
    if (srv->threaded)
        uv_mutex_unlock(&srv->lock);
}

static void logf_(rdzv_server *srv, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void logf_(rdzv_server *srv, int level, const char *fmt, ...)
{
    if (!srv->opts.log)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    srv->opts.log(srv->opts.log_arg, level, line);
}

void rdzv_server_options_init(rdzv_server_options *o)
{
    memset(o, 0, sizeof(*o));
    o->host = "127.0.0.1";
    o->port = 0;
    o->listen_fd = -1;
    o->backlog = SOMAXCONN;
    o->keepalive_s = 60;
    o->max_key_bytes = 8 << 10;
    o->max_value_bytes = 8 << 20;
    o->max_keys_per_request = 128 << 10;
    o->max_request_bytes = 64 << 20;
    o->max_total_bytes = (size_t)1 << 30;
    o->max_connections = 65536;
    o->max_pending_output = 64 << 20;
}

/* ---------------------------------------------------------------------------------------- */
/* Connections                                                                              */
/* ---------------------------------------------------------------------------------------- */

static void handle_closed(uv_handle_t *h);

static void client_closed(uv_handle_t *h)
{
    client *c = h->data;
    rdzv_server *srv = c->srv;
    rdzv__buf_free(&c->pend);
    free(c);
    handle_closed((uv_handle_t *)&srv->listener);
}

/* Formats the peer's address into c->peer; only needed for log lines, so done only then. */
static const char *peer_name(client *c)
{
    struct sockaddr_storage ss = {0};
    int sl = sizeof(ss);
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;

    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET6) {
            uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof(ip));
            port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        } else {
            uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof(ip));
            port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        }
    }
    snprintf(c->peer, sizeof(c->peer), ss.ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d", ip, port);
    return c->peer;
}

/* Notes the peer's address and port for the on_close hook (the peer may be gone by then). */
static void remember_peer(client *c)
{
    struct sockaddr_storage ss = {0};
    int sl = sizeof(ss);
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &sl) != 0)
        return;
    if (ss.ss_family == AF_INET6) {
        uv_ip6_name((struct sockaddr_in6 *)&ss, c->addr, sizeof(c->addr));
        c->port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        if (strncmp(c->addr, "::ffff:", 7) == 0 && strchr(c->addr + 7, '.'))
            memmove(c->addr, c->addr + 7, strlen(c->addr + 7) + 1);
    } else if (ss.ss_family == AF_INET) {
        uv_ip4_name((struct sockaddr_in *)&ss, c->addr, sizeof(c->addr));
        c->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    }
}

/* Closes a client: its waits are dropped now, its memory once libuv lets go of the handle. */
static void client_close(client *c, const char *why)
{
    rdzv_server *srv = c->srv;
    if (c->closing)
        return;
    c->closing = true;
    if (why)
        logf_(srv, RDZV_LOG_WARN, "closing connection from %s: %s", peer_name(c), why);
    if (srv->opts.on_close && c->port > 0)
        srv->opts.on_close(srv->opts.on_close_arg, c->addr, c->port);
    rdzv__conn_release(&srv->store, &c->conn);
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->clients = c->next;
    if (c->next)
        c->next->prev = c->prev;
    srv->nconns--;
    uv_close((uv_handle_t *)&c->tcp, client_closed);
}

/* ---------------------------------------------------------------------------------------- */
/* Access control                                                                           */
/* ---------------------------------------------------------------------------------------- */

/*
 * Closes `c` for a security reason, counting it in *counter. The log line is written at most
 * once a second (with the number of refusals it stands for), so that a flood of refused
 * connections cannot flood the log.
 */
static void refuse(client *c, uint64_t *counter, const char *why)
{
    rdzv_server *srv = c->srv;
    uint64_t now = uv_now(srv->loop);
    (*counter)++;
    srv->refusals_unlogged++;
    if (srv->last_refusal_log_ms != 0 && now - srv->last_refusal_log_ms < 1000) {
        client_close(c, NULL);
        return;
    }
    char line[320];
    if (srv->refusals_unlogged > 1)
        snprintf(line, sizeof(line), "%s (and %" PRIu64 " more refusals in the last second)", why,
                 srv->refusals_unlogged - 1);
    else
        snprintf(line, sizeof(line), "%s", why);
    srv->last_refusal_log_ms = now ? now : 1;
    srv->refusals_unlogged = 0;
    client_close(c, line);
}

/*
 * Decides on accept what a new connection may do. A peer on this host (loopback, our own
 * address, or a socket the kernel finds here) owned by another user is refused unless
 * allow_other_users; root's connections are always let in (root can read the store's memory
 * anyway). With a token or an allow list, a peer that is not on this host, not in `allow` and
 * not at an address a connection authenticated from is put on probation (token: it may only
 * authenticate) or refused (no token). Returns false after closing the connection.
 */
static bool admit(rdzv_server *srv, client *c)
{
    struct sockaddr_storage peer, local;
    int pl = sizeof(peer), ll = sizeof(local);
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&peer, &pl) < 0 ||
        uv_tcp_getsockname(&c->tcp, (struct sockaddr *)&local, &ll) < 0) {
        client_close(c, "cannot read the connection's addresses");
        return false;
    }
    const struct sockaddr *pa = (const struct sockaddr *)&peer;
    bool restricted = srv->token || srv->opts.nallow > 0;
    bool loopback = rdzv__addr_loopback(pa);
    bool here = loopback || rdzv__addr_same(pa, (const struct sockaddr *)&local);
    uint32_t uid = 0;
    int rc = -ENOENT;
    if (!srv->opts.allow_other_users || (restricted && !here))
        rc = rdzv__peer_uid(pa, (const struct sockaddr *)&local, &uid);
    here = here || rc == 0;

    if (here && !srv->opts.allow_other_users) {
        if (rc == 0 && uid != srv->euid && uid != 0) {
            char why[160];
            snprintf(why, sizeof(why),
                     "refused: the connecting socket belongs to uid %u, the store to uid %u "
                     "(another user of this host)",
                     (unsigned)uid, (unsigned)srv->euid);
            refuse(c, &srv->refused_user, why);
            return false;
        }
        if (rc < 0 && !srv->owner_warned) {
            srv->owner_warned = true;
            logf_(srv, RDZV_LOG_WARN,
                  "cannot find the owner of a connection from %s (sock_diag: %s): connections "
                  "of other users of this host are not refused",
                  peer_name(c), rdzv_strerror(rc));
        }
    }
    if (!restricted || here || rdzv__addrset_has(&srv->nodes, pa))
        return true;
    for (size_t i = 0; i < srv->opts.nallow; i++)
        if (rdzv__cidr_match(&srv->allow[i], pa))
            return true;
    if (!srv->token) {
        refuse(c, &srv->refused_address, "refused: the address is not in the allowed networks");
        return false;
    }
    c->probation = true;
    return true;
}

/*
 * Checks a request of `c` before it runs: a connection on probation may only VALIDATE and
 * authenticate; on a store with a token, an unauthenticated one may not name a private key.
 * Returns false after closing the connection.
 */
static bool gate(rdzv_server *srv, client *c, const rdzv__request *req)
{
    if (c->probation && req->op != RDZV_OP_VALIDATE && req->op != RDZV_OP_AUTH_HELLO &&
        req->op != RDZV_OP_AUTH_PROOF) {
        char why[160];
        snprintf(why, sizeof(why),
                 "%s refused: the address is not one of the job's nodes and the connection "
                 "did not authenticate",
                 rdzv__op_name(req->op));
        refuse(c, &srv->refused_address, why);
        return false;
    }
    if (srv->token && c->auth.state != RDZV_AUTH_DONE && rdzv__request_private(req)) {
        char why[200], key[65] = "";
        /* The first key, made printable: it is the peer's text going into our log. */
        for (size_t i = 0; req->key && i < req->key_len && i < sizeof(key) - 1; i++)
            key[i] = req->key[i] >= ' ' && req->key[i] <= '~' ? (char)req->key[i] : '?';
        snprintf(why, sizeof(why),
                 "%s refused: '%s%s' is private to the job's authenticated "
                 "connections",
                 rdzv__op_name(req->op), key, req->key_len >= sizeof(key) ? "..." : "");
        refuse(c, &srv->refused_private, why);
        return false;
    }
    return true;
}

/*
 * Runs one step of the handshake (AUTH_HELLO or AUTH_PROOF) for `c`, queueing its reply.
 * Returns 0, or -1 after closing the connection (a wrong proof or a malformed step).
 */
static int auth_step(rdzv_server *srv, client *c, const rdzv__request *req)
{
    int rc;
    if (req->op == RDZV_OP_AUTH_HELLO) {
        uint8_t reply[RDZV_AUTH_HELLO_REPLY_BYTES];
        size_t n = 0;
        rc = rdzv__auth_server_hello(srv->token, &c->auth, req->key, req->key_len, reply, &n);
        if (rc == 0)
            return rdzv__reply_vec(&srv->store, &c->conn, reply, n) < 0 ? -1 : 0;
    } else {
        rc = rdzv__auth_server_proof(srv->token, &c->auth, req->key, req->key_len);
        if (rc == 0) {
            struct sockaddr_storage peer;
            int pl = sizeof(peer);
            srv->authenticated++;
            c->probation = false;
            if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&peer, &pl) == 0 &&
                !rdzv__addr_loopback((struct sockaddr *)&peer) &&
                rdzv__addrset_add(&srv->nodes, (struct sockaddr *)&peer) == 1)
                logf_(srv, RDZV_LOG_INFO, "%s authenticated: its address is now one of the job's",
                      peer_name(c));
            return rdzv__reply_vec(&srv->store, &c->conn, "", 1) < 0 ? -1 : 0;
        }
    }
    refuse(c, &srv->auth_failed,
           rc == -EACCES   ? "authentication failed: wrong proof (the peer does not know the "
                             "store's secret)"
           : rc == -EPROTO ? "authentication failed: handshake out of order or malformed"
                           : "authentication failed: cannot compute the proof");
    return -1;
}

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);
static void pump(client *c);

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    client *c = h->data;
    (void)suggested;
    *buf = uv_buf_init((char *)c->srv->rbuf, READ_BUF_BYTES);
}

static void write_cb(uv_write_t *req, int status)
{
    write_req *w = (write_req *)req;
    client *c = w->c;
    rdzv_server *srv = c->srv;
    free(w->data);
    free(w);
    if (c->closing)
        return;
    lock(srv);
    if (status < 0) {
        client_close(c, uv_strerror(status));
    } else if (!c->reading && c->tcp.write_queue_size <= srv->opts.max_pending_output / 2) {
        /* Resume a peer we paused once its backlog has halved: first the requests it already
         * sent, then reading. */
        if (uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb) == 0)
            c->reading = true;
        pump(c);
    }
    unlock(srv);
}

/* Sends what the store queued for `c`. */
static void flush(client *c)
{
    rdzv__buf *out = &c->conn.out;
    size_t off = 0;

    if (c->closing)
        return;
    if (c->conn.error) {
        client_close(c, rdzv_strerror(c->conn.error));
        return;
    }
    if (out->len == 0)
        return;
    if (c->tcp.write_queue_size == 0) {
        uv_buf_t b = uv_buf_init((char *)out->data, (unsigned)out->len);
        int n = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
        if (n > 0)
            off = (size_t)n;
        else if (n != UV_EAGAIN) {
            client_close(c, uv_strerror(n));
            return;
        }
    }
    if (off == out->len) {
        out->len = 0;
        if (out->cap > 1 << 20) /* do not keep a large buffer around for small replies */
            rdzv__buf_free(out);
        return;
    }
    write_req *w = malloc(sizeof(*w));
    if (!w) {
        client_close(c, "out of memory");
        return;
    }
    w->c = c;
    if (off == 0) { /* hand the whole buffer to the write request */
        w->data = out->data;
        out->data = NULL;
        out->cap = 0;
    } else {
        w->data = malloc(out->len - off);
        if (!w->data) {
            free(w);
            client_close(c, "out of memory");
            return;
        }
        memcpy(w->data, out->data + off, out->len - off);
    }
    uv_buf_t b = uv_buf_init((char *)w->data, (unsigned)(out->len - off));
    out->len = 0;
    int rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, write_cb);
    if (rc < 0) {
        free(w->data);
        free(w);
        client_close(c, uv_strerror(rc));
        return;
    }
    if (c->reading && c->tcp.write_queue_size > c->srv->opts.max_pending_output) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = false;
    }
}

static void flush_dirty(rdzv_server *srv)
{
    rdzv__conn *conn;
    while ((conn = rdzv__store_pop_dirty(&srv->store)))
        flush((client *)((char *)conn - offsetof(client, conn)));
}

static int append_status(rdzv_server *srv, rdzv__conn *conn);

/* True when `c` has more reply bytes waiting than it may: run no more of its requests. */
static bool backlogged(const client *c)
{
    return c->conn.out.len + c->tcp.write_queue_size > c->srv->opts.max_pending_output;
}

/*
 * Runs the complete frames in buf[0..len), stopping early once the client is backlogged, and
 * returns the bytes consumed, or a negative value after closing the client for bad input.
 */
static ssize_t process(client *c, const uint8_t *buf, size_t len)
{
    rdzv_server *srv = c->srv;
    size_t off = 0;
    enum rdzv_gen before = c->parser.gen;

    while (off < len && !c->closing && !backlogged(c)) {
        rdzv__request req;
        int n = rdzv__parse(&c->parser, &srv->limits, buf + off, len - off, &req);
        if (before == RDZV_GEN_UNKNOWN && c->parser.gen != RDZV_GEN_UNKNOWN) {
            srv->gens[c->parser.gen]++;
            before = c->parser.gen;
        }
        if (n == 0)
            break;
        if (n < 0) {
            char why[128];
            snprintf(why, sizeof(why), "%s (opcode %u, %s protocol)", rdzv__parse_strerror(n),
                     buf[off], c->parser.gen == RDZV_GEN_MODERN ? "modern" : "legacy");
            srv->closed_bad_input++;
            client_close(c, why);
            return -1;
        }
        if (!gate(srv, c, &req))
            return -1;
        int rc = rdzv__store_exec(&srv->store, &c->conn, &req);
        if (rc == RDZV__EXEC_STATUS)
            rc = append_status(srv, &c->conn);
        if (rc == RDZV__EXEC_AUTH && auth_step(srv, c, &req) < 0)
            return -1;
        if (rc == RDZV__EXEC_AUTH)
            rc = 0;
        if (rc < 0) {
            char why[128];
            snprintf(why, sizeof(why), "%s request refused: %s", rdzv__op_name(req.op),
                     rc == -ENOSPC   ? "the store's size limit would be exceeded"
                     : rc == -EINVAL ? "ADD on a value that is not a decimal integer"
                                     : rdzv_strerror(rc));
            srv->closed_bad_input++;
            client_close(c, why);
            return -1;
        }
        off += (size_t)n;
    }
    return (ssize_t)off;
}

/* Runs the frames held in c->pend; returns the bytes consumed (> 0: progress). */
static ssize_t consume_pending(client *c)
{
    ssize_t used = process(c, c->pend.data, c->pend.len);
    if (used > 0) {
        memmove(c->pend.data, c->pend.data + used, c->pend.len - (size_t)used);
        c->pend.len -= (size_t)used;
    }
    if (!c->closing && c->pend.len == 0 && c->pend.cap > READ_BUF_BYTES)
        rdzv__buf_free(&c->pend);
    return used;
}

/* Runs frames that back-pressure held back, for as long as their replies find room. */
static void pump(client *c)
{
    while (!c->closing && c->pend.len > 0 && !backlogged(c)) {
        if (consume_pending(c) <= 0)
            break;
        flush_dirty(c->srv);
    }
}

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    client *c = s->data;
    rdzv_server *srv = c->srv;

    if (nread == 0)
        return;
    lock(srv);
    if (nread < 0) {
        client_close(c, nread == UV_EOF ? NULL : uv_strerror((int)nread));
        unlock(srv);
        return;
    }

    const uint8_t *data = (const uint8_t *)buf->base;
    size_t len = (size_t)nread;
    if (c->pend.len == 0) {
        /* Fast path: parse straight from the shared buffer, keep only what is left over. */
        ssize_t used = process(c, data, len);
        if (used >= 0 && (size_t)used < len &&
            rdzv__buf_append(&c->pend, data + used, len - (size_t)used) < 0)
            client_close(c, "out of memory");
    } else if (rdzv__buf_append(&c->pend, data, len) < 0) {
        client_close(c, "out of memory");
    } else {
        consume_pending(c);
    }
    flush_dirty(srv);
    pump(c);
    unlock(srv);
}

static void accept_one(rdzv_server *srv, uv_stream_t *listener, int status);

static void on_connection(uv_stream_t *listener, int status)
{
    rdzv_server *srv = listener->data;
    lock(srv);
    accept_one(srv, listener, status);
    unlock(srv);
}

static void accept_one(rdzv_server *srv, uv_stream_t *listener, int status)
{
    if (status < 0) {
        /* EMFILE/ENFILE/ENOMEM: libuv already dropped the connection it could not accept. */
        uint64_t now = uv_now(srv->loop);
        srv->rejected++;
        if (now - srv->last_accept_log_ms >= 1000 || srv->last_accept_log_ms == 0) {
            srv->last_accept_log_ms = now;
            logf_(srv, RDZV_LOG_ERROR, "cannot accept a connection: %s", uv_strerror(status));
        }
        return;
    }
    client *c = calloc(1, sizeof(*c));
    if (!c) {
        srv->rejected++;
        return;
    }
    c->srv = srv;
    rdzv__conn_init(&c->conn);
    rdzv__parser_init(&c->parser);
    uv_tcp_init(srv->loop, &c->tcp);
    c->tcp.data = c;
    srv->open_handles++;
    /* Link first so that client_close() can unlink on every path below. */
    c->next = srv->clients;
    if (srv->clients)
        srv->clients->prev = c;
    srv->clients = c;
    srv->nconns++;

    int rc = uv_accept(listener, (uv_stream_t *)&c->tcp);
    if (rc < 0) {
        srv->rejected++;
        client_close(c, NULL);
        return;
    }
    if (srv->nconns > srv->opts.max_connections) {
        srv->rejected++;
        client_close(c, "connection limit reached");
        return;
    }
    if (!admit(srv, c))
        return;
    srv->accepted++;
    if (srv->opts.on_close)
        remember_peer(c);
    /* TCP_NODELAY and keepalive come from the listening socket: Linux copies them to every
     * accepted socket, which saves three system calls per connection. */
    if ((rc = uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb)) < 0) {
        client_close(c, uv_strerror(rc));
        return;
    }
    c->reading = true;
}

/* ---------------------------------------------------------------------------------------- */
/* Status                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static char *status_json(rdzv_server *srv)
{
    rdzv__store *st = &srv->store;
    json_t *ops = json_object();
    for (int i = 0; i < RDZV_OP_COUNT; i++)
        json_object_set_new(ops, rdzv__op_name((enum rdzv_op)i),
                            json_integer((json_int_t)st->ops[i]));
    json_t *limits = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "max_key_bytes",
                               (json_int_t)srv->opts.max_key_bytes, "max_value_bytes",
                               (json_int_t)srv->opts.max_value_bytes, "max_keys_per_request",
                               (json_int_t)srv->opts.max_keys_per_request, "max_request_bytes",
                               (json_int_t)srv->opts.max_request_bytes, "max_total_bytes",
                               (json_int_t)srv->opts.max_total_bytes, "max_connections",
                               (json_int_t)srv->opts.max_connections, "max_pending_output",
                               (json_int_t)srv->opts.max_pending_output);
    json_t *o =
        json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:f, s:I, s:{s:I, s:I, s:I}, s:o}", "keys",
                  (json_int_t)st->nkeys, "bytes", (json_int_t)st->bytes, "connections",
                  (json_int_t)srv->nconns, "waiters", (json_int_t)st->nwaiters, "watchers",
                  (json_int_t)st->nwatches, "entries", (json_int_t)st->nentries, "ops", ops,
                  "uptime_s", (double)(uv_hrtime() / 1000000 - srv->start_ms) / 1000.0, "port",
                  (json_int_t)srv->port, "connections_total", "accepted", (json_int_t)srv->accepted,
                  "rejected", (json_int_t)srv->rejected, "closed_bad_input",
                  (json_int_t)srv->closed_bad_input, "limits", limits);
    if (!o)
        return NULL;
    size_t queued = 0; /* reply bytes not yet taken by the kernel, over all connections */
    for (client *c = srv->clients; c; c = c->next)
        queued += c->conn.out.len + c->tcp.write_queue_size;
    json_object_set_new(o, "output_queued_bytes", json_integer((json_int_t)queued));
    json_object_set_new(
        o, "security",
        json_pack("{s:b, s:I, s:I, s:I, s:I, s:I, s:I}", "token", srv->token != NULL,
                  "authenticated", (json_int_t)srv->authenticated, "auth_failed",
                  (json_int_t)srv->auth_failed, "refused_address", (json_int_t)srv->refused_address,
                  "refused_user", (json_int_t)srv->refused_user, "refused_private",
                  (json_int_t)srv->refused_private, "nodes", (json_int_t)srv->nodes.n));
    json_object_set_new(o, "protocol",
                        json_pack("{s:I, s:I}", "legacy", (json_int_t)srv->gens[RDZV_GEN_LEGACY],
                                  "modern", (json_int_t)srv->gens[RDZV_GEN_MODERN]));
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

static int append_status(rdzv_server *srv, rdzv__conn *conn)
{
    char *s = status_json(srv);
    if (!s)
        return -ENOMEM;
    int rc = rdzv__reply_vec(&srv->store, conn, s, strlen(s));
    free(s);
    return rc;
}

int rdzv_server_status(rdzv_server *srv, char **json)
{
    if (!srv || !json)
        return -EINVAL;
    lock(srv);
    char *s = status_json(srv);
    unlock(srv);
    if (!s)
        return -ENOMEM;
    /* jansson allocated with malloc (its default allocator), so rdzv_free() releases it. */
    *json = s;
    return 0;
}

int rdzv_server_clear(rdzv_server *srv, const char *keep_prefix)
{
    if (!srv)
        return -EINVAL;
    const char *keep = keep_prefix ? keep_prefix : "";
    lock(srv);
    size_t n = rdzv__store_clear(&srv->store, (const uint8_t *)keep, strlen(keep));
    unlock(srv);
    logf_(srv, RDZV_LOG_INFO, "cleared %zu keys outside '%s'", n, keep);
    return n > INT_MAX ? INT_MAX : (int)n;
}

int rdzv_server_port(const rdzv_server *srv)
{
    return srv ? srv->port : -EINVAL;
}

/* ---------------------------------------------------------------------------------------- */
/* Life cycle                                                                               */
/* ---------------------------------------------------------------------------------------- */

/*
 * Frees a server none of whose handles is open any more; accepts one that server_init() left
 * half-built. Closes the server's own loop (threaded mode), whose handles must all be closed.
 */
static void server_free(rdzv_server *srv)
{
    if (!srv)
        return;
    if (srv->own_loop_made)
        uv_loop_close(&srv->own_loop);
    if (srv->lock_made)
        uv_mutex_destroy(&srv->lock);
    rdzv__store_destroy(&srv->store);
    if (srv->token)
        explicit_bzero(srv->token, strlen(srv->token));
    free(srv->token);
    free(srv->allow);
    rdzv__addrset_free(&srv->nodes);
    free(srv->host);
    free(srv);
}

/* Every handle of the server ends here; the last one frees an embedded server. */
static void handle_closed(uv_handle_t *h)
{
    rdzv_server *srv = h->data;
    if (--srv->open_handles == 0 && srv->closing && !srv->threaded)
        server_free(srv);
}

static void listener_closed(uv_handle_t *h)
{
    handle_closed(h);
}

static int check_options(const rdzv_server_options *o)
{
    if (!o || (!o->host && o->listen_fd < 0) || o->port < 0 || o->port > 65535 || o->backlog < 1 ||
        o->keepalive_s < 0 || o->max_key_bytes < 1 || o->max_key_bytes > RDZV_MAX_KEY_LIMIT ||
        o->max_value_bytes < 1 || o->max_keys_per_request < 1 || o->max_connections < 1 ||
        o->max_pending_output < 1 || o->max_request_bytes < 16 ||
        o->max_request_bytes > ((size_t)1 << 30) || (o->token && rdzv_token_check(o->token) < 0) ||
        (o->nallow > 0 && !o->allow) || o->nallow > 4096)
        return -EINVAL;
    return 0;
}

/* Resolves host:port into *ss: numeric IPv4/IPv6 literals directly, names by getaddrinfo. */
static int resolve(const char *host, int port, struct sockaddr_storage *ss)
{
    memset(ss, 0, sizeof(*ss));
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)ss) == 0)
        return 0;
    if (uv_ip6_addr(host, port, (struct sockaddr_in6 *)ss) == 0)
        return 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE},
                    *res;
    if (getaddrinfo(host, NULL, &hints, &res) != 0)
        return -EADDRNOTAVAIL;
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    if (ss->ss_family == AF_INET6)
        ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
    freeaddrinfo(res);
    return 0;
}

static int set_int_opt(int fd, int level, int name, int value)
{
    return setsockopt(fd, level, name, &value, sizeof(value)) < 0 ? -errno : 0;
}

/*
 * Makes the listening socket with plain socket calls, before any libuv handle exists, so that
 * every way setting up the socket can fail (address in use, not local, not permitted, not a
 * socket) leaves the caller's loop untouched. *fd is opts->listen_fd (adopted) or -1 (bind
 * host:port); on return it holds the socket, which is the caller's to close on any failure.
 * The system calls are those uv_tcp_bind(), uv_tcp_nodelay(), uv_tcp_keepalive() (with its
 * probe interval of 1 s and count of 10) and uv_listen() make, in their order. TCP_NODELAY and
 * keepalive are set on the listener because Linux copies them to each accepted socket (see
 * accept_one()). Returns 0 and sets *port, or a negative errno.
 */
static int listen_socket(const rdzv_server_options *o, int *fd, int *port)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    int rc = 0;

    if (*fd < 0) {
        rc = resolve(o->host, o->port, &ss);
        if (rc < 0)
            return rc;
        *fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (*fd < 0)
            return -errno;
        rc = set_int_opt(*fd, SOL_SOCKET, SO_REUSEADDR, 1);
        if (rc == 0 && ss.ss_family == AF_INET6)
            rc = set_int_opt(*fd, IPPROTO_IPV6, IPV6_V6ONLY, 0);
        sl = ss.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
        if (rc == 0 && bind(*fd, (const struct sockaddr *)&ss, sl) < 0)
            rc = -errno;
    }
    if (rc == 0)
        rc = set_int_opt(*fd, IPPROTO_TCP, TCP_NODELAY, 1);
    if (rc == 0)
        rc = set_int_opt(*fd, SOL_SOCKET, SO_KEEPALIVE, o->keepalive_s > 0);
    if (rc == 0 && o->keepalive_s > 0) {
        rc = set_int_opt(*fd, IPPROTO_TCP, TCP_KEEPIDLE, o->keepalive_s);
        if (rc == 0)
            rc = set_int_opt(*fd, IPPROTO_TCP, TCP_KEEPINTVL, 1);
        if (rc == 0)
            rc = set_int_opt(*fd, IPPROTO_TCP, TCP_KEEPCNT, 10);
    }
    if (rc == 0 && listen(*fd, o->backlog) < 0)
        rc = -errno;
    sl = sizeof(ss);
    if (rc == 0 && getsockname(*fd, (struct sockaddr *)&ss, &sl) < 0)
        rc = -errno;
    if (rc == 0)
        *port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    return rc;
}

/*
 * Releases what server_init() built before it failed, without running the caller's loop.
 * Before the listener handle exists this is plain freeing. Once it exists (only libuv's own
 * refusal of a listening socket gets that far, see rdzv_server_create()) it is closed: the
 * server's own loop is run to finish that, while on the caller's loop the close callback frees
 * the server the next time the caller runs it.
 */
static void server_discard(rdzv_server *srv)
{
    if (!srv)
        return;
    if (srv->open_handles > 0) {
        srv->closing = true;
        uv_close((uv_handle_t *)&srv->listener, listener_closed);
        if (!srv->threaded)
            return; /* handle_closed() frees it */
        uv_run(srv->loop, UV_RUN_DEFAULT);
    }
    server_free(srv);
}

/*
 * Builds a server: on `loop` (embedded), or on a loop of its own (threaded). The socket is set
 * up in full before the listener handle is made, so that nearly every failure leaves nothing on
 * any loop. opts->listen_fd is ours from the start: closed on every failure.
 */
static int server_init(uv_loop_t *loop, const rdzv_server_options *opts, bool threaded,
                       rdzv_server **out)
{
    rdzv_server *srv = NULL;
    int fd = opts ? opts->listen_fd : -1;
    int rc = 0;

    if ((!threaded && !loop) || !out || check_options(opts) < 0) {
        rc = -EINVAL;
        goto out;
    }
    srv = calloc(1, sizeof(*srv));
    if (!srv || (opts->host && !(srv->host = strdup(opts->host)))) {
        rc = -ENOMEM;
        goto out;
    }
    srv->opts = *opts;
    srv->opts.host = srv->host;
    srv->opts.token = NULL; /* the copy in srv->token is the one used */
    srv->opts.allow = NULL; /* parsed into srv->allow */
    srv->euid = (uint32_t)geteuid();
    if (opts->token && !(srv->token = strdup(opts->token))) {
        rc = -ENOMEM;
        goto out;
    }
    if (opts->nallow > 0 && !(srv->allow = calloc(opts->nallow, sizeof(*srv->allow)))) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < opts->nallow; i++)
        if ((rc = rdzv__cidr_parse(opts->allow[i], &srv->allow[i])) < 0)
            goto out;
    srv->threaded = threaded;
    srv->limits = (rdzv__limits){opts->max_key_bytes, opts->max_value_bytes,
                                 opts->max_keys_per_request, opts->max_request_bytes};
    if ((rc = rdzv__store_init(&srv->store, opts->max_total_bytes)) < 0)
        goto out;
    if ((rc = listen_socket(opts, &fd, &srv->port)) < 0)
        goto out;
    if (threaded) {
        if ((rc = uv_mutex_init(&srv->lock)) < 0)
            goto out;
        srv->lock_made = true;
        if ((rc = uv_loop_init(&srv->own_loop)) < 0)
            goto out;
        srv->own_loop_made = true;
        loop = &srv->own_loop;
    }
    srv->loop = loop;
    srv->start_ms = uv_hrtime() / 1000000;

    /* The handle adopts the ready socket; uv_listen() only starts watching it. */
    if ((rc = uv_tcp_init(loop, &srv->listener)) < 0)
        goto out;
    srv->listener.data = srv;
    srv->open_handles = 1;
    if ((rc = uv_tcp_open(&srv->listener, fd)) < 0)
        goto out;
    fd = -1; /* the handle's now: uv_close() closes it */
    rc = uv_listen((uv_stream_t *)&srv->listener, opts->backlog, on_connection);
out:
    if (rc < 0) {
        if (fd >= 0)
            close(fd);
        server_discard(srv);
        return rc;
    }
    if (opts->listen_fd >= 0)
        logf_(srv, RDZV_LOG_INFO, "listening on fd %d, port %d", opts->listen_fd, srv->port);
    else
        logf_(srv, RDZV_LOG_INFO,
              strchr(opts->host, ':') ? "listening on [%s]:%d" : "listening on %s:%d", opts->host,
              srv->port);
    *out = srv;
    return 0;
}

int rdzv_server_create(void *loop, const rdzv_server_options *opts, rdzv_server **out)
{
    return server_init(loop, opts, false, out);
}

/* Starts closing every handle; the loop ends once they are all closed. */
static void begin_close(rdzv_server *srv)
{
    srv->closing = true;
    while (srv->clients)
        client_close(srv->clients, NULL);
    uv_close((uv_handle_t *)&srv->listener, listener_closed);
}

void rdzv_server_close(rdzv_server *srv)
{
    if (!srv || srv->closing)
        return;
    begin_close(srv);
}

static void stop_cb(uv_async_t *a)
{
    rdzv_server *srv = a->data;
    uv_close((uv_handle_t *)a, NULL);
    begin_close(srv);
}

static void thread_main(void *arg)
{
    rdzv_server *srv = arg;
    /* A peer that vanishes while we write must give EPIPE, not kill the host process: block
     * SIGPIPE on this thread (a write's SIGPIPE is directed at the writing thread). */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    uv_run(srv->loop, UV_RUN_DEFAULT);
}

int rdzv_server_start(const rdzv_server_options *opts, rdzv_server **out)
{
    rdzv_server *srv;
    int rc = server_init(NULL, opts, true, out ? &srv : NULL);
    if (rc < 0)
        return rc;
    uv_async_init(srv->loop, &srv->stop_async, stop_cb);
    srv->stop_async.data = srv;
    if ((rc = uv_thread_create(&srv->thread, thread_main, srv)) < 0) {
        uv_close((uv_handle_t *)&srv->stop_async, NULL);
        begin_close(srv);
        uv_run(srv->loop, UV_RUN_DEFAULT);
        server_free(srv);
        return rc;
    }
    *out = srv;
    return 0;
}

void rdzv_server_stop(rdzv_server *srv)
{
    if (!srv)
        return;
    uv_async_send(&srv->stop_async);
    uv_thread_join(&srv->thread);
    server_free(srv);
}
