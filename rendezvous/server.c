/*
 * The libuv TCP server of librendezvous: accepts connections, feeds their bytes through the
 * incremental parser into the store, and sends the replies the store queued.
 *
 * Reading uses one 64 KiB buffer per server; a connection only holds bytes of its own while a
 * frame is incomplete, so idle connections cost no buffer (a frame larger than the shared
 * buffer is read straight into the connection's own, see alloc_cb()). Replies are sent once
 * per turn of the loop: after all of the turn's read callbacks, a check handle (flusher_cb)
 * flushes every connection that got output (the readers, and any whose WAIT they released)
 * with uv_try_write, one write each however many of its requests the turn ran, and what the
 * kernel did not take goes to uv_write. A peer that stops reading its replies is itself no
 * longer read once max_pending_output bytes are queued for it; one whose own backlog held its
 * requests back is flushed at once, so that they run in the same turn.
 *
 * Every byte held for a client is counted (store.h): replies queued, the partial request kept
 * in `pend`, and through the store's memory cap its WAIT and watch records. Over a cap, bad
 * input, or past a timeout (the sweep timer), that one connection is closed with one log line.
 * Nothing a client sends can block another: the loop never waits on a single connection.
 *
 * Accepting is ours rather than uv_listen()'s: libuv sheds connections it cannot accept for
 * want of descriptors without telling anyone. The listening socket is watched with a uv_poll_t
 * and accept4() runs here. Over max_connections, or with no descriptor left (EMFILE/ENFILE:
 * the spare descriptor kept open for this is closed, the connection accepted and closed, the
 * spare reopened; with no spare, accepting pauses for 100 ms), the connection is refused:
 * counted in `rejected` and logged once per burst (the first refusal, then a count a second).
 *
 * Access control (a job's control plane, see rdzv-protocol(7) AUTHENTICATION) is decided in
 * two places: admit_peer() on accept (the peer's address, and the owner of a peer socket on this
 * host, which fails closed: see rdzv__local_owner()) and gate() before each request (what an
 * unauthenticated connection may do). The handshake's logic and the rules themselves are
 * auth.c's, the kernel queries peercred.c's; this file only applies them. Connections on
 * probation (strangers that may only authenticate) are kept in a FIFO, oldest first, and
 * counted per address: the sweep closes them after auth_timeout_s, and admit() closes the
 * oldest of them whenever max_probation or max_connections would be exceeded, so that the
 * job's own connections are refused only when no stranger holds a slot.
 *
 * Threading: an embedded server runs on the caller's loop and is not thread-safe; like any libuv
 * program, its host should ignore SIGPIPE. A server started with rdzv_server_start() runs the
 * loop on its own thread, with SIGPIPE blocked there; its `lock` guards the server's state so
 * that rdzv_server_status() may be called from other threads.
 */
#include "auth.h"
#include "listen.h"
#include "loophost.h"
#include "mux.h"
#include "rdzv.h"
#include "store.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#define READ_BUF_BYTES (64 * 1024)
/* An emptied output or partial-request buffer is kept for the connection's next use up to this
 * capacity, and freed beyond it: what idle connections keep is not counted by any cap. */
#define KEEP_BUF_BYTES 4096

#define SOURCE_BUCKETS 1024 /* of the hash table of probation connections by address */

/* The connections on probation from one address, for max_probation_per_address. */
typedef struct source {
    uint8_t key[17]; /* family, then the IPv4 (mapped addresses: unmapped) or IPv6 address */
    size_t n;
    struct source *next; /* in its bucket */
} source;

typedef struct client {
    uv_tcp_t tcp;
    struct rdzv_server *srv;
    rdzv__conn conn;
    rdzv__parser parser;
    rdzv__buf pend; /* bytes of an incomplete frame */
    queue node;     /* in srv->clients */
    bool reading, closing;
    bool probation;       /* from an address not (yet) of the job: may only authenticate */
    uint64_t accepted_ms; /* uv_now() at the accept: the probation deadline counts from it */
    queue prob_node;      /* on probation: in srv->probation, oldest first */
    source *src;                  /* on probation: its address's count */
    rdzv__auth_conn auth; /* the handshake's state; auth.state == RDZV_AUTH_DONE: authenticated */
    bool awaiting;             /* the last parse stopped inside a frame: waiting on the peer */
    uint64_t last_read_ms;     /* uv_now() of the last bytes received (or of the accept) */
    uint64_t partial_since_ms; /* while `awaiting`: since when; 0 otherwise */
    char peer[64];
    char addr[INET6_ADDRSTRLEN]; /* numeric peer address at accept: logs, opts.on_close */
    int port;                    /* peer port at accept; 0: unknown */
    rdzv__vtable vconns;         /* a store proxy's vconns (mux.h); none otherwise */
} client;

typedef struct write_req {
    uv_write_t req;
    client *c;
    rdzv__buf buf; /* owned: the connection's output buffer, handed over whole */
    size_t n;      /* its bytes, all still counted as held: buf.len */
    size_t off;    /* of them, taken by the kernel before the request (uv_try_write) */
} write_req;

struct rdzv_server {
    uv_loop_t *loop;
    uv_poll_t listener;
    int listen_fd; /* ours: closed once the listener handle is */
    int spare_fd;  /* kept open to be closed when descriptors run out; -1 if none */
    uv_timer_t sweep;        /* timeouts; runs only when one is set */
    uv_timer_t refuse_timer; /* rate-limits the log lines of refused connections */
    uv_timer_t resume_timer; /* resumes accepting after a pause for want of descriptors */
    uv_idle_t sweeper;       /* frees cleared names a slice per loop turn; runs while any */
    uv_check_t flusher;      /* sends the replies of a loop turn's reads at its end */
    bool refusing;           /* refuse_timer is running: a burst of refusals is under way */
    uint64_t refused_unlogged;
    char refuse_why[200]; /* the burst's last reason (copied: callers format it on the stack) */
    int refuse_level;
    size_t max_connections; /* in force: the option, or derived from RLIMIT_NOFILE */
    rdzv_server_options opts;
    char *host;
    rdzv__limits limits;
    rdzv__store store;
    int port;
    uint64_t start_ms;
    size_t nconns;
    uint64_t accepted, rejected, closed_bad_input;
    uint64_t gens[3]; /* connections by detected generation */
    size_t nvconns, nmux; /* virtual connections (mux.h), and the connections carrying them */
    queue clients;        /* client (node) */

    /* access control (auth.h) */
    char *token;         /* owned; NULL: no authentication */
    rdzv__cidr *allow;   /* owned, opts.nallow of them */
    rdzv__addrset nodes; /* addresses that authenticated connections came from */
    uint32_t euid;       /* the server's owner, for the other-user rule */
    rdzv__peercred cred; /* the kernel queries of the other-user rule, descriptors kept open */
    uint64_t authenticated, auth_failed, refused_address, refused_user, refused_private;
    uint64_t refused_owner;        /* from this host, owner unknown: refused (fail closed) */
    queue probation;               /* client (prob_node) on probation, oldest first */
    size_t nprobation, max_probation;
    source *sources[SOURCE_BUCKETS]; /* probation connections by address */
    uint64_t auth_timeouts;          /* probation connections closed for auth_timeout_s */
    uint64_t probation_shed; /* closed to keep max_probation(_per_address), max_connections */
    char last_auth_failed[64];    /* "ADDR:PORT" of the last peer that failed to authenticate */
    uint64_t last_auth_failed_ms; /* uv_hrtime() in ms when it did; 0: none yet */
    int open_handles;
    bool closing;

    /* threaded mode */
    rdzv__loophost lh;
    uv_async_t clear_async; /* rdzv_server_clear() from another thread starts the sweeper */

    /* traffic over the server's life (STATUS "traffic"; requests are the sum of store.ops) */
    uint64_t bytes_in;  /* read from clients */
    uint64_t bytes_out; /* replies the kernel took */

    uint8_t rbuf[READ_BUF_BYTES];
};

/* Threaded servers guard their state so that rdzv_server_status() may run on other threads. */
#define lock(srv) rdzv__loophost_lock(&(srv)->lh)
#define unlock(srv) rdzv__loophost_unlock(&(srv)->lh)
#define logf_(srv, level, ...) rdzv__logf((srv)->opts.log, (srv)->opts.log_arg, level, __VA_ARGS__)

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

/* "ADDR:PORT" ("[ADDR]:PORT" for IPv6) of the peer as it was at accept, for log lines. */
static const char *peer_name(client *c)
{
    snprintf(c->peer, sizeof(c->peer), strchr(c->addr, ':') ? "[%s]:%d" : "%s:%d", c->addr,
             c->port);
    return c->peer;
}

/*
 * Notes the peer's numeric address (an IPv4-mapped IPv6 address in its IPv4 form) and port, as
 * accept() gave them, for log lines and the on_close hook: once the peer has reset the
 * connection the socket can no longer tell them (getpeername() fails with ENOTCONN).
 */
static void remember_peer(client *c, const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET6) {
        uv_ip6_name((const struct sockaddr_in6 *)sa, c->addr, sizeof(c->addr));
        c->port = ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
        if (strncmp(c->addr, "::ffff:", 7) == 0 && strchr(c->addr + 7, '.'))
            memmove(c->addr, c->addr + 7, strlen(c->addr + 7) + 1);
    } else if (sa->sa_family == AF_INET) {
        uv_ip4_name((const struct sockaddr_in *)sa, c->addr, sizeof(c->addr));
        c->port = ntohs(((const struct sockaddr_in *)sa)->sin_port);
    } else {
        snprintf(c->addr, sizeof(c->addr), "?");
    }
}

/* The bucket of a key of srv->sources (FNV-1a). */
static size_t source_bucket(const uint8_t key[17])
{
    uint32_t h = 2166136261u;
    for (int i = 0; i < 17; i++)
        h = (h ^ key[i]) * 16777619u;
    return h % SOURCE_BUCKETS;
}

/* The key of `sa`'s address in srv->sources, and its bucket. */
static size_t source_key(const struct sockaddr *sa, uint8_t key[17])
{
    memset(key, 0, 17);
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
    if (sa->sa_family == AF_INET6 && !IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
        key[0] = 6;
        memcpy(key + 1, &s6->sin6_addr, 16);
    } else {
        key[0] = 4;
        memcpy(key + 1,
               sa->sa_family == AF_INET6
                   ? s6->sin6_addr.s6_addr + 12
                   : (const uint8_t *)&((const struct sockaddr_in *)sa)->sin_addr,
               4);
    }
    return source_bucket(key);
}

/*
 * Puts `c`, from `sa`, on probation: at the tail of the server's FIFO of probation connections,
 * counted for its address. Returns false, changing nothing, when its address already has
 * max_probation_per_address connections on probation (or out of memory).
 */
static bool probation_begin(client *c, const struct sockaddr *sa)
{
    rdzv_server *srv = c->srv;
    uint8_t key[17];
    size_t b = source_key(sa, key);
    source *s = srv->sources[b];
    while (s && memcmp(s->key, key, sizeof(key)) != 0)
        s = s->next;
    size_t cap = srv->opts.max_probation_per_address;
    if (s && cap > 0 && s->n >= cap)
        return false;
    if (!s) {
        if (!(s = calloc(1, sizeof(*s))))
            return false;
        memcpy(s->key, key, sizeof(key));
        s->next = srv->sources[b];
        srv->sources[b] = s;
    }
    s->n++;
    c->src = s;
    c->probation = true;
    queue_insert_tail(&srv->probation, &c->prob_node);
    srv->nprobation++;
    return true;
}

/* The connection on probation the longest, or NULL. */
static client *oldest_on_probation(rdzv_server *srv)
{
    return queue_empty(&srv->probation)
               ? NULL
               : queue_data(queue_head(&srv->probation), client, prob_node);
}

/* Takes `c` off probation (it authenticated, or it closes). */
static void probation_end(client *c)
{
    rdzv_server *srv = c->srv;
    if (!c->probation)
        return;
    c->probation = false;
    queue_remove(&c->prob_node);
    srv->nprobation--;
    if (--c->src->n == 0) {
        source **p = &srv->sources[source_bucket(c->src->key)];
        while (*p != c->src)
            p = &(*p)->next;
        *p = c->src->next;
        free(c->src);
    }
    c->src = NULL;
}

/* Frees what closed connections and clears left (rdzv__store_sweep()), a slice of 1 to 2 ms
 * per turn of the loop, until nothing is left. */
static void sweeper_cb(uv_idle_t *h)
{
    rdzv_server *srv = h->data;
    lock(srv);
    if (!rdzv__store_sweep(&srv->store, RDZV__SWEEP_SLICE))
        uv_idle_stop(h);
    unlock(srv);
}

/* Starts the sweeper if the store has something for it (on the loop thread, lock held). */
static void start_sweeper(rdzv_server *srv)
{
    if (!srv->closing && (srv->store.nstale > 0 || !queue_empty(&srv->store.dead)))
        uv_idle_start(&srv->sweeper, sweeper_cb);
}

static void mux_release(client *c);

/* Closes a client: its waits die now (the sweeper frees them), its memory is freed once libuv
 * lets go of the handle. */
static void client_close(client *c, const char *why)
{
    rdzv_server *srv = c->srv;
    if (c->closing)
        return;
    c->closing = true;
    probation_end(c);
    if (why)
        logf_(srv, RDZV_LOG_WARN, "closing connection from %s: %s", peer_name(c), why);
    if (srv->opts.on_close && c->port > 0)
        srv->opts.on_close(srv->opts.on_close_arg, c->addr, c->port);
    mux_release(c);
    rdzv__conn_release(&srv->store, &c->conn);
    start_sweeper(srv);
    queue_remove(&c->node);
    srv->nconns--;
    uv_close((uv_handle_t *)&c->tcp, client_closed);
}

/* ---------------------------------------------------------------------------------------- */
/* Access control                                                                           */
/* ---------------------------------------------------------------------------------------- */

#define REFUSE_LOG_MS 1000 /* at most one line a second about refused connections */

static void refuse_timer_cb(uv_timer_t *t)
{
    rdzv_server *srv = t->data;
    lock(srv);
    if (srv->refused_unlogged > 0) {
        logf_(srv, srv->refuse_level, "refused %llu more connections in the last second: %s",
              (unsigned long long)srv->refused_unlogged, srv->refuse_why);
        srv->refused_unlogged = 0;
        uv_timer_start(&srv->refuse_timer, refuse_timer_cb, REFUSE_LOG_MS, 0);
    } else {
        srv->refusing = false; /* the burst is over */
    }
    unlock(srv);
}

/*
 * The one rate limit of the log lines about refusals, those on accept (refusal()) and the
 * security ones (refuse()), so that a flood of refused connections cannot flood the log.
 * Returns true when the caller logs `why` now: the first refusal of a burst. Later ones, for as
 * long as the burst lasts (refusals less than REFUSE_LOG_MS apart), are counted (when `count`)
 * and summed up by refuse_timer_cb in one line a second, at `level`, naming the last reason.
 */
static bool refusal_log_now(rdzv_server *srv, int level, const char *why, bool count)
{
    snprintf(srv->refuse_why, sizeof(srv->refuse_why), "%s", why);
    srv->refuse_level = level;
    if (srv->refusing) {
        srv->refused_unlogged += count;
        return false;
    }
    srv->refusing = true;
    srv->refused_unlogged = 0;
    uv_timer_start(&srv->refuse_timer, refuse_timer_cb, REFUSE_LOG_MS, 0);
    return true;
}

/* Closes `c` for a security reason, counting it in *counter; logged as refusal_log_now() says. */
static void refuse(client *c, uint64_t *counter, const char *why)
{
    (*counter)++;
    client_close(c, refusal_log_now(c->srv, RDZV_LOG_WARN, why, true) ? why : NULL);
}

/*
 * Decides on accept what a new connection may do. A peer on this host (rdzv__local_owner())
 * owned by another user is refused unless allow_other_users, and so is one whose owner cannot be
 * established; root's connections are always let in (root can read the store's memory
 * anyway). With a token or an allow list, a peer that is not on this host, not in `allow` and
 * not at an address a connection authenticated from is put on probation (token: it may only
 * authenticate, within auth_timeout_s) or refused (no token). Returns false after closing the
 * connection.
 */
static bool admit_peer(rdzv_server *srv, client *c)
{
    struct sockaddr_storage peer, local;
    int pl = sizeof(peer), ll = sizeof(local);
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&peer, &pl) < 0 ||
        uv_tcp_getsockname(&c->tcp, (struct sockaddr *)&local, &ll) < 0) {
        client_close(c, "cannot read the connection's addresses");
        return false;
    }
    const struct sockaddr *pa = (const struct sockaddr *)&peer;
    const struct sockaddr *la = (const struct sockaddr *)&local;
    bool restricted = srv->token || srv->opts.nallow > 0;
    bool here = rdzv__addr_loopback(pa) || rdzv__addr_same(pa, la);
    uint32_t uid = 0;
    char why[200];

    if (!srv->opts.allow_other_users) {
        int rc = rdzv__local_owner(&srv->cred, pa, la, &uid);
        if (rc < 0) {
            snprintf(why, sizeof(why),
                     "refused: the connection comes from this host and its owner cannot be "
                     "established (%s), so it may be another user's",
                     rc == -ENOENT   ? "its socket is gone"
                     : rc == -ESTALE ? "its socket is in TIME_WAIT"
                                     : rdzv_strerror(rc));
            refuse(c, &srv->refused_owner, why);
            return false;
        }
        here = rc == 1;
        if (here && uid != srv->euid && uid != 0) {
            snprintf(why, sizeof(why),
                     "refused: the connecting socket belongs to uid %u, the store to uid %u "
                     "(another user of this host)",
                     (unsigned)uid, (unsigned)srv->euid);
            refuse(c, &srv->refused_user, why);
            return false;
        }
    } else if (restricted && !here) {
        here = rdzv__peer_uid(&srv->cred, pa, la, false, &uid) == 0;
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
    if (!probation_begin(c, pa)) {
        snprintf(why, sizeof(why),
                 "refused: %zu connections from this address are already waiting to "
                 "authenticate (max_probation_per_address)",
                 srv->opts.max_probation_per_address);
        refuse(c, &srv->probation_shed, why);
        return false;
    }
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
        char why[200];
        rdzv__private_refusal(req, why, sizeof(why));
        refuse(c, &srv->refused_private, why);
        return false;
    }
    return true;
}

/*
 * Closes `c`, which failed to authenticate (`why` starts "authentication failed"), counting it
 * and noting its address and the time for the status JSON (security.last_auth_failure), so that
 * the job's nodes can say which peer does not share their secret. The log line names the peer.
 */
static void refuse_auth(client *c, const char *why)
{
    rdzv_server *srv = c->srv;
    snprintf(srv->last_auth_failed, sizeof(srv->last_auth_failed), "%s", peer_name(c));
    srv->last_auth_failed_ms = uv_hrtime() / 1000000;
    refuse(c, &srv->auth_failed, why);
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
            probation_end(c);
            if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&peer, &pl) == 0 &&
                !rdzv__addr_loopback((struct sockaddr *)&peer) &&
                rdzv__addrset_add(&srv->nodes, (struct sockaddr *)&peer) == 1)
                logf_(srv, RDZV_LOG_INFO, "%s authenticated: its address is now one of the job's",
                      peer_name(c));
            return rdzv__reply_vec(&srv->store, &c->conn, "", 1) < 0 ? -1 : 0;
        }
    }
    refuse_auth(c, rc == -EACCES ? "authentication failed: wrong proof (the peer does not know the "
                                   "store's secret)"
                   : rc == -EPROTO ? "authentication failed: handshake out of order or malformed"
                                   : "authentication failed: cannot compute the proof");
    return -1;
}

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);
static void pump(client *c);

/*
 * Reads go to the server's shared buffer, except while a frame larger than it is coming in:
 * its bytes would be copied to c->pend anyway, so they are read there directly, as much per
 * read as pend's room (at least READ_BUF_BYTES) allows. read_cb() counts them against the caps
 * as keep() does; the room itself, like any buffer's spare capacity, is not counted.
 */
static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    client *c = h->data;
    rdzv__buf *p = &c->pend;
    (void)suggested;
    if (p->len >= READ_BUF_BYTES && rdzv__buf_reserve(p, READ_BUF_BYTES) == 0) {
        size_t room = p->cap - p->len;
        *buf = uv_buf_init((char *)p->data + p->len, room > UINT_MAX ? UINT_MAX : (unsigned)room);
        return;
    }
    *buf = uv_buf_init((char *)c->srv->rbuf, READ_BUF_BYTES);
}

static void write_cb(uv_write_t *req, int status)
{
    write_req *w = (write_req *)req;
    client *c = w->c;
    rdzv_server *srv = c->srv;
    size_t n = w->n, unsent = w->n - w->off;
    rdzv__buf_free(&w->buf);
    free(w);
    if (c->closing)
        return; /* its bytes were written off when it closed */
    lock(srv);
    rdzv__conn_sent(&srv->store, &c->conn, n);
    if (status >= 0)
        srv->bytes_out += unsent;
    if (status < 0) {
        client_close(c, uv_strerror(status));
    } else if (!c->reading && c->conn.out_held <= srv->opts.max_pending_output / 2) {
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
        client_close(c, c->conn.why ? c->conn.why : rdzv_strerror(c->conn.error));
        return;
    }
    if (out->len == 0)
        return;
    if (c->tcp.write_queue_size == 0) {
        uv_buf_t b = uv_buf_init((char *)out->data, (unsigned)out->len);
        int n = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
        if (n > 0) {
            off = (size_t)n;
            c->srv->bytes_out += off;
        } else if (n != UV_EAGAIN) {
            client_close(c, uv_strerror(n));
            return;
        }
    }
    if (off == out->len) {
        rdzv__conn_sent(&c->srv->store, &c->conn, off);
        out->len = 0;
        if (out->cap > KEEP_BUF_BYTES)
            rdzv__buf_free(out);
        return;
    }
    write_req *w = malloc(sizeof(*w));
    if (!w) {
        client_close(c, "out of memory");
        return;
    }
    /* The whole buffer goes to the write request and the unsent tail is written from where it
     * is: a copy of it would double what the connection holds while max_conn_output and
     * max_buffered_bytes count it once. A large buffer gives back its capacity beyond the
     * reply; what the kernel already took stays counted until the buffer is freed. */
    w->c = c;
    w->n = out->len;
    w->off = off;
    w->buf = *out;
    *out = (rdzv__buf){0};
    rdzv__buf_fit(&w->buf);
    uv_buf_t b = uv_buf_init((char *)w->buf.data + off, (unsigned)(w->n - off));
    int rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, write_cb);
    if (rc < 0) {
        rdzv__buf_free(&w->buf);
        free(w);
        client_close(c, uv_strerror(rc));
        return;
    }
    if (c->reading && c->conn.out_held > c->srv->opts.max_pending_output) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = false;
    }
}

static void vconn_failed(rdzv__conn *conn);

static void flush_dirty(rdzv_server *srv)
{
    rdzv__conn *conn;
    while ((conn = rdzv__store_pop_dirty(&srv->store)))
        if (conn->mux)
            vconn_failed(conn);
        else
            flush((client *)((char *)conn - offsetof(client, conn)));
}

/* The end of a loop turn (its reads done): sends every reply they queued. */
static void flusher_cb(uv_check_t *h)
{
    rdzv_server *srv = h->data;
    lock(srv);
    flush_dirty(srv);
    uv_check_stop(h);
    unlock(srv);
}

static int append_status(rdzv_server *srv, rdzv__conn *conn);

/* True when `c` has more reply bytes waiting than it may: run no more of its requests. */
static bool backlogged(const client *c)
{
    return c->conn.out_held > c->srv->opts.max_pending_output;
}

static int mux_request(client *c, const rdzv__request *req);

/*
 * Runs the complete frames in buf[0..len), stopping early once the client is backlogged, and
 * returns the bytes consumed, or a negative value after closing the client for bad input.
 */
static ssize_t process(client *c, const uint8_t *buf, size_t len)
{
    rdzv_server *srv = c->srv;
    size_t off = 0;
    enum rdzv_gen before = c->parser.gen;

    c->awaiting = false;
    while (off < len && !c->closing && !backlogged(c)) {
        rdzv__request req;
        int n = rdzv__parse(&c->parser, &srv->limits, buf + off, len - off, &req);
        if (before == RDZV_GEN_UNKNOWN && c->parser.gen != RDZV_GEN_UNKNOWN) {
            srv->gens[c->parser.gen]++;
            before = c->parser.gen;
        }
        if (n == 0) {
            c->awaiting = true;
            break;
        }
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
        if (req.op == RDZV_OP_MUX || req.op == RDZV_OP_MUX_CLOSE) {
            if (mux_request(c, &req) < 0)
                return -1;
            off += (size_t)n;
            continue;
        }
        int rc = rdzv__store_exec(&srv->store, &c->conn, &req);
        if (rc == RDZV__EXEC_STATUS)
            rc = append_status(srv, &c->conn);
        if (rc == RDZV__EXEC_AUTH && auth_step(srv, c, &req) < 0)
            return -1;
        if (rc == RDZV__EXEC_AUTH)
            rc = 0;
        if (rc < 0) {
            char why[192];
            snprintf(why, sizeof(why), "%s request refused: %s", rdzv__op_name(req.op),
                     rc == -ENOSPC   ? "the store's size limit would be exceeded"
                     : rc == -EINVAL ? "ADD on a value that is not a decimal integer"
                     : c->conn.why   ? c->conn.why
                                     : rdzv_strerror(rc));
            srv->closed_bad_input++;
            client_close(c, why);
            return -1;
        }
        c->partial_since_ms = 0; /* a whole request came: the peer is making progress */
        off += (size_t)n;
    }
    return (ssize_t)off;
}

/*
 * Keeps buf[0..n) in c->pend after what it holds, counting it against the buffer caps first.
 * Returns 0, or -1 after closing `c`.
 */
static int keep(client *c, const uint8_t *buf, size_t n)
{
    if (c->closing)
        return -1;
    if (rdzv__conn_hold_input(&c->srv->store, &c->conn, c->pend.len + n) < 0) {
        client_close(c, c->conn.why ? c->conn.why : "out of buffer space");
        return -1;
    }
    if (rdzv__buf_append(&c->pend, buf, n) < 0) {
        client_close(c, "out of memory");
        return -1;
    }
    return 0;
}

/* Starts or stops the clock of request_timeout_s after a parse. */
static void note_progress(client *c)
{
    if (c->closing)
        return;
    if (c->awaiting && c->pend.len > 0) {
        if (c->partial_since_ms == 0)
            c->partial_since_ms = uv_now(c->srv->loop) | 1; /* never 0 */
    } else {
        c->partial_since_ms = 0;
    }
}

/* Runs the frames held in c->pend; returns the bytes consumed (> 0: progress). */
static ssize_t consume_pending(client *c)
{
    ssize_t used = process(c, c->pend.data, c->pend.len);
    if (used > 0) {
        memmove(c->pend.data, c->pend.data + used, c->pend.len - (size_t)used);
        c->pend.len -= (size_t)used;
        rdzv__conn_hold_input(&c->srv->store, &c->conn, c->pend.len); /* shrinking: no fail */
    }
    if (!c->closing && c->pend.len == 0 && c->pend.cap > KEEP_BUF_BYTES)
        rdzv__buf_free(&c->pend);
    note_progress(c);
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
    if (nread < 0 && srv->token && c->auth.state == RDZV_AUTH_CHALLENGED) {
        /* It had the store's proof and left without proving anything: its client found the
         * proof wrong (rdzv-protocol(7), AUTHENTICATION), that is, it has another secret. */
        refuse_auth(c, "authentication failed: the peer closed the connection on the store's "
                       "proof (it does not know the store's secret: another token?)");
        unlock(srv);
        return;
    }
    if (nread < 0) {
        client_close(c, nread == UV_EOF ? NULL : uv_strerror((int)nread));
        unlock(srv);
        return;
    }

    const uint8_t *data = (const uint8_t *)buf->base;
    size_t len = (size_t)nread;
    srv->bytes_in += len;
    c->last_read_ms = uv_now(srv->loop);
    if (buf->base != (char *)srv->rbuf) {
        /* Read into c->pend (alloc_cb()): count the bytes as keep() would, then run them. */
        if (rdzv__conn_hold_input(&srv->store, &c->conn, c->pend.len + len) < 0) {
            client_close(c, c->conn.why ? c->conn.why : "out of buffer space");
        } else {
            c->pend.len += len;
            consume_pending(c);
        }
    } else if (c->pend.len == 0) {
        /* Fast path: parse straight from the shared buffer, keep only what is left over. */
        ssize_t used = process(c, data, len);
        if (used >= 0 && (size_t)used < len)
            keep(c, data + used, len - (size_t)used);
        note_progress(c);
    } else if (keep(c, data, len) == 0) {
        consume_pending(c);
    }
    if (c->pend.len > 0 && backlogged(c)) {
        /* Held back by its own replies: send them now and run what they held back. */
        flush_dirty(srv);
        pump(c);
    } else if (!queue_empty(&srv->store.dirty) && !srv->closing) {
        /* Replies go out once per loop turn, after all of its reads (flusher_cb). */
        uv_check_start(&srv->flusher, flusher_cb);
    }
    start_sweeper(srv); /* a CANCEL_WAIT leaves dead WAITs */
    unlock(srv);
}

/* ---------------------------------------------------------------------------------------- */
/* Accepting and refusing                                                                   */
/* ---------------------------------------------------------------------------------------- */

#define ACCEPT_PAUSE_MS 100
#define ACCEPT_BATCH 64 /* connections accepted per readiness callback, for fairness */

/*
 * Counts one refused connection (when `count`) and logs it, rate-limited (refusal_log_now()).
 * Without `count` it only logs (accepting paused: nothing was refused yet).
 */
static void refusal(rdzv_server *srv, int level, const char *why, bool count)
{
    srv->rejected += count;
    if (refusal_log_now(srv, level, why, count))
        logf_(srv, level,
              "refusing connections: %s (refusals are counted in the status's \"rejected\" and "
              "logged at most once a second)",
              why);
}

static void on_listen_ready(uv_poll_t *h, int status, int events);

static void resume_cb(uv_timer_t *t)
{
    rdzv_server *srv = t->data;
    lock(srv);
    if (!srv->closing)
        uv_poll_start(&srv->listener, UV_READABLE, on_listen_ready);
    unlock(srv);
}

/* Stops accepting for ACCEPT_PAUSE_MS (rather than spin on a socket that stays readable). */
static void pause_accepting(rdzv_server *srv)
{
    uv_poll_stop(&srv->listener);
    uv_timer_start(&srv->resume_timer, resume_cb, ACCEPT_PAUSE_MS, 0);
}

/*
 * Out of descriptors with connections waiting: frees the spare descriptor to accept one of them
 * and close it at once, so that it is refused rather than left hanging, then takes the spare
 * back. Returns true if a connection was refused so (the caller goes on accepting); false if
 * none was waiting, or if there was no spare (accepting is then paused).
 */
static bool shed_one(rdzv_server *srv, int err)
{
    const char *why = err == EMFILE ? "too many open files (EMFILE)"
                                    : "too many open files in the system (ENFILE)";
    if (srv->spare_fd >= 0) {
        close(srv->spare_fd);
        int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        int aerr = errno;
        if (fd >= 0) {
            refusal(srv, RDZV_LOG_ERROR, why, true); /* logged before the client sees it */
            close(fd);
        }
        srv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd >= 0)
            return true;
        if (aerr == EAGAIN || aerr == EWOULDBLOCK)
            return false;
        /* Still out (another thread took the descriptor): pause below. */
    }
    refusal(srv, RDZV_LOG_ERROR, why, false);
    pause_accepting(srv);
    return false;
}

/*
 * Closes the oldest connection on probation to make room for `what` ("a connection of the job
 * (max_connections)"), counted in security.probation_shed and logged (rate-limited). Returns false
 * when no connection is on probation.
 */
static bool evict_stranger(rdzv_server *srv, const char *what)
{
    client *oldest = oldest_on_probation(srv);
    if (!oldest)
        return false;
    char why[200];
    snprintf(why, sizeof(why), "not authenticated, closed to make room for %s", what);
    refuse(oldest, &srv->probation_shed, why);
    return true;
}

/*
 * Takes an accepted socket into service, or refuses it. Connections on probation are capped
 * at max_probation, and the job's own may always take a stranger's slot: past either limit the
 * oldest connection on probation is closed (evict_stranger()), so strangers never hold more
 * than max_probation slots nor keep the job's connections out of the rest.
 */
static void admit(rdzv_server *srv, int fd, const struct sockaddr *peer)
{
    /* A refusal is logged before the socket is closed, so that whoever sees the close (a test,
     * an operator) finds the line already there. */
    if (srv->nconns >= srv->max_connections && srv->nprobation == 0) {
        refusal(srv, RDZV_LOG_WARN, "connection limit reached (max_connections)", true);
        close(fd);
        return;
    }
    client *c = calloc(1, sizeof(*c));
    if (!c) {
        refusal(srv, RDZV_LOG_ERROR, "out of memory", true);
        close(fd);
        return;
    }
    c->srv = srv;
    remember_peer(c, peer);
    rdzv__conn_init(&c->conn);
    rdzv__parser_init(&c->parser);
    c->last_read_ms = c->accepted_ms = uv_now(srv->loop);
    uv_tcp_init(srv->loop, &c->tcp);
    c->tcp.data = c;
    srv->open_handles++;
    /* Link first so that client_close() can unlink on every path below. */
    queue_insert_head(&srv->clients, &c->node);
    srv->nconns++;

    int rc = uv_tcp_open(&c->tcp, fd);
    if (rc < 0) {
        close(fd);
        srv->rejected++;
        client_close(c, NULL);
        return;
    }
    if (!admit_peer(srv, c))
        return;
    srv->accepted++;
    while (!c->closing &&
           (srv->nconns > srv->max_connections || srv->nprobation > srv->max_probation)) {
        const char *what = srv->nprobation > srv->max_probation
                               ? "a newer unauthenticated connection (max_probation)"
                           : c->probation ? "a newer unauthenticated connection (max_connections)"
                                          : "a connection of the job (max_connections)";
        if (!evict_stranger(srv, what)) {
            refusal(srv, RDZV_LOG_WARN, "connection limit reached (max_connections)", true);
            client_close(c, NULL);
        }
    }
    if (c->closing)
        return;
    /* TCP_NODELAY and keepalive come from the listening socket: Linux copies them to every
     * accepted socket, which saves three system calls per connection. */
    if ((rc = uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb)) < 0) {
        client_close(c, uv_strerror(rc));
        return;
    }
    c->reading = true;
}

static void on_listen_ready(uv_poll_t *h, int status, int events)
{
    rdzv_server *srv = h->data;
    (void)events;
    lock(srv);
    if (status < 0) {
        logf_(srv, RDZV_LOG_ERROR, "cannot watch the listening socket: %s", uv_strerror(status));
        unlock(srv);
        return;
    }
    for (int i = 0; i < ACCEPT_BATCH && !srv->closing; i++) {
        struct sockaddr_storage peer = {0};
        socklen_t pl = sizeof(peer);
        int fd =
            accept4(srv->listen_fd, (struct sockaddr *)&peer, &pl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            admit(srv, fd, (struct sockaddr *)&peer);
            continue;
        }
        int err = errno;
        if (err == EINTR || err == ECONNABORTED)
            continue;
        if (err == EAGAIN || err == EWOULDBLOCK)
            break;
        /* Out of descriptors: a stranger's descriptor is the first to go (uv_close() closes it
         * at once), then the spare's, to refuse the connection. */
        if ((err == EMFILE || err == ENFILE) &&
            (evict_stranger(srv, "a descriptor (out of descriptors)") || shed_one(srv, err)))
            continue;
        if (err != EMFILE && err != ENFILE) {
            /* ENOBUFS, ENOMEM and the like: say so (once per burst) and look again later. */
            refusal(srv, RDZV_LOG_ERROR, "accept failed (out of memory or buffers)", false);
            pause_accepting(srv);
        }
        break;
    }
    unlock(srv);
}

/*
 * Closes connections past their timeouts: on probation for auth_timeout_s (oldest first, from
 * the FIFO, so the cost is the number closed), a request incomplete for request_timeout_s, or
 * nothing received for idle_timeout_s by a connection that waits for nothing.
 */
/* Milliseconds from `since` to `now`, 0 when `since` is later: note_progress() stores
 * uv_now() | 1 (0 means "no partial request"), a millisecond ahead of an even uv_now(), and a
 * sweep in that same millisecond must see an age of 0, not a wrapped-around one. */
static uint64_t elapsed_ms(uint64_t now, uint64_t since)
{
    return now > since ? now - since : 0;
}

static void sweep_cb(uv_timer_t *t)
{
    rdzv_server *srv = t->data;
    char why[96];
    lock(srv);
    uint64_t now = uv_now(srv->loop);
    uint64_t auth_ms = (uint64_t)srv->opts.auth_timeout_s * 1000;
    for (client *c; auth_ms && (c = oldest_on_probation(srv)) && now - c->accepted_ms >= auth_ms;) {
        snprintf(why, sizeof(why), "did not authenticate within %d s (auth_timeout_s)",
                 srv->opts.auth_timeout_s);
        refuse(c, &srv->auth_timeouts, why);
    }
    uint64_t req_ms = (uint64_t)srv->opts.request_timeout_s * 1000;
    uint64_t idle_ms = (uint64_t)srv->opts.idle_timeout_s * 1000;
    queue *q, *next;
    queue_foreach_safe(q, next, &srv->clients) {
        client *c = queue_data(q, client, node);
        if (req_ms && c->partial_since_ms && elapsed_ms(now, c->partial_since_ms) >= req_ms) {
            snprintf(why, sizeof(why), "request incomplete for %d s (request_timeout_s)",
                     srv->opts.request_timeout_s);
            client_close(c, why);
        } else if (idle_ms && !rdzv__conn_waiting(&c->conn) && c->vconns.n == 0 &&
                   now - c->last_read_ms >= idle_ms) {
            snprintf(why, sizeof(why), "idle for %d s (idle_timeout_s)", srv->opts.idle_timeout_s);
            client_close(c, why);
        }
    }
    unlock(srv);
}

/* ---------------------------------------------------------------------------------------- */
/* Multiplexed connections (mux.h)                                                           */
/* ---------------------------------------------------------------------------------------- */

/* The client carrying the virtual connection `conn`. */
static client *mux_client(const rdzv__conn *conn)
{
    return (client *)((char *)conn->mux - offsetof(client, conn));
}

/*
 * Closes vconn `v` of `c` as a connection of its own closes (its WAITs and watches die, its
 * bytes are written off), with a log line when `why`, and tells the proxy (RDZV_MUX_CLOSED)
 * when `tell`.
 */
static void vconn_close(client *c, rdzv__vconn *v, const char *why, bool tell)
{
    rdzv_server *srv = c->srv;
    uint32_t id = v->conn.vid;
    if (why)
        logf_(srv, RDZV_LOG_WARN, "closing virtual connection %u of %s: %s", (unsigned)id,
              peer_name(c), why);
    rdzv__conn_release(&srv->store, &v->conn);
    rdzv__vtable_remove(&c->vconns, v);
    srv->nvconns--;
    start_sweeper(srv);
    if (tell) {
        uint32_t closed[2] = {id, RDZV_MUX_CLOSED};
        rdzv__reply_raw(&srv->store, &c->conn, closed, sizeof(closed));
    }
}

/* A vconn the store failed (a cap: store.h) came off the dirty list: close it. */
static void vconn_failed(rdzv__conn *conn)
{
    client *c = mux_client(conn);
    if (conn->error && !c->closing)
        vconn_close(c, (rdzv__vconn *)((char *)conn - offsetof(rdzv__vconn, conn)),
                    conn->why ? conn->why : rdzv_strerror(conn->error), true);
}

/* Closes every vconn of a closing client. */
static void mux_release(client *c)
{
    rdzv__vtable *t = &c->vconns;
    for (size_t i = 0; i < t->nbuckets; i++)
        while (t->buckets[i])
            vconn_close(c, t->buckets[i], NULL, false);
    if (t->nbuckets)
        c->srv->nmux--;
    rdzv__vtable_free(t);
}

/*
 * Runs a MUX or MUX_CLOSE request of `c` (mux.h). The request a MUX frame carries goes through
 * the rules a connection of its own would meet (gate(): the private keys) and the store; what
 * would close that connection closes the vconn alone. Returns 0, or -1 after closing `c` (a
 * store with a secret and `c` unauthenticated, a malformed frame, out of memory).
 */
static int mux_request(client *c, const rdzv__request *req)
{
    rdzv_server *srv = c->srv;
    char why[200];
    srv->store.ops[req->op]++;
    if (srv->token && c->auth.state != RDZV_AUTH_DONE) {
        snprintf(why, sizeof(why),
                 "%s refused: a store with a secret multiplexes only "
                 "authenticated connections",
                 rdzv__op_name(req->op));
        refuse(c, &srv->refused_private, why);
        return -1;
    }
    rdzv__vconn *v = rdzv__vtable_find(&c->vconns, req->u32);
    if (req->op == RDZV_OP_MUX_CLOSE) {
        if (v)
            vconn_close(c, v, NULL, false);
        return 0;
    }
    if (!v) {
        if (req->key_len < 1) {
            srv->closed_bad_input++;
            client_close(c, "malformed MUX frame (no flags)");
            return -1;
        }
        if (c->vconns.nbuckets == 0)
            srv->nmux++;
        if (rdzv__vtable_add(&c->vconns, &c->conn, req->u32, req->key[0] & RDZV_MUX_LEGACY, &v) <
            0) {
            client_close(c, "out of memory");
            return -1;
        }
        srv->nvconns++;
    }
    uint8_t flags;
    rdzv__request in;
    int rc = rdzv__mux_parse(v, &srv->limits, req, &flags, &in);
    if (rc == -EPROTO) {
        srv->closed_bad_input++;
        client_close(c, "malformed MUX frame (not one whole request)");
        return -1;
    }
    if (rc < 0 || in.op >= RDZV_OP_AUTH_HELLO) {
        snprintf(why, sizeof(why), "%s",
                 rc < 0 ? rdzv__parse_strerror(rc)
                        : "the handshake and MUX are not for a "
                          "virtual connection");
        srv->closed_bad_input++;
        vconn_close(c, v, why, true);
        return 0;
    }
    if (srv->token && !(flags & RDZV_MUX_AUTH) && rdzv__request_private(&in)) {
        rdzv__private_refusal(&in, why, sizeof(why));
        srv->refused_private++;
        vconn_close(c, v, refusal_log_now(srv, RDZV_LOG_WARN, why, false) ? why : NULL, true);
        return 0;
    }
    rc = rdzv__store_exec(&srv->store, &v->conn, &in);
    if (rc == RDZV__EXEC_STATUS)
        rc = append_status(srv, &v->conn);
    if (c->conn.error)
        return 0; /* flush_dirty() closes `c` */
    if (rc < 0 || v->conn.error) {
        snprintf(why, sizeof(why), "%s request refused: %s", rdzv__op_name(in.op),
                 rc == -ENOSPC   ? "the store's size limit would be exceeded"
                 : rc == -EINVAL ? "ADD on a value that is not a decimal integer"
                 : v->conn.why   ? v->conn.why
                                 : rdzv_strerror(rc < 0 ? rc : v->conn.error));
        srv->closed_bad_input++;
        vconn_close(c, v, why, true);
    }
    return 0;
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
    json_t *limits = json_pack(
        "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:i, s:i}", "max_key_bytes",
        (json_int_t)srv->opts.max_key_bytes, "max_value_bytes",
        (json_int_t)srv->opts.max_value_bytes, "max_keys_per_request",
        (json_int_t)srv->opts.max_keys_per_request, "max_request_bytes",
        (json_int_t)srv->opts.max_request_bytes, "max_total_bytes",
        (json_int_t)srv->opts.max_total_bytes, "max_connections",
        (json_int_t)srv->max_connections, "max_pending_output",
        (json_int_t)srv->opts.max_pending_output, "max_conn_output",
        (json_int_t)srv->opts.max_conn_output, "max_buffered_bytes",
        (json_int_t)srv->opts.max_buffered_bytes, "idle_timeout_s", srv->opts.idle_timeout_s,
        "request_timeout_s", srv->opts.request_timeout_s);
    json_object_set_new(limits, "auth_timeout_s", json_integer(srv->opts.auth_timeout_s));
    json_object_set_new(limits, "max_probation", json_integer((json_int_t)srv->max_probation));
    json_object_set_new(limits, "max_probation_per_address",
                        json_integer((json_int_t)srv->opts.max_probation_per_address));
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
    size_t queued = 0; /* reply bytes not yet sent, over all connections */
    queue *q;
    queue_foreach(q, &srv->clients) {
        queued += queue_data(q, client, node)->conn.out_held;
    }
    json_object_set_new(o, "output_queued_bytes", json_integer((json_int_t)queued));
    json_object_set_new(
        o, "security",
        json_pack("{s:b, s:I, s:I, s:I, s:I, s:I, s:I}", "token", srv->token != NULL,
                  "authenticated", (json_int_t)srv->authenticated, "auth_failed",
                  (json_int_t)srv->auth_failed, "refused_address", (json_int_t)srv->refused_address,
                  "refused_user", (json_int_t)srv->refused_user, "refused_private",
                  (json_int_t)srv->refused_private, "nodes", (json_int_t)srv->nodes.n));
    json_t *sec = json_object_get(o, "security");
    json_object_set_new(sec, "refused_owner_unknown", json_integer((json_int_t)srv->refused_owner));
    json_object_set_new(sec, "probation", json_integer((json_int_t)srv->nprobation));
    json_object_set_new(sec, "auth_timeouts", json_integer((json_int_t)srv->auth_timeouts));
    json_object_set_new(sec, "probation_shed", json_integer((json_int_t)srv->probation_shed));
    if (srv->last_auth_failed_ms)
        json_object_set_new(
            sec, "last_auth_failure",
            json_pack("{s:s, s:f}", "peer", srv->last_auth_failed, "age_s",
                      (double)(uv_hrtime() / 1000000 - srv->last_auth_failed_ms) / 1000.0));
    json_object_set_new(o, "buffered_bytes", json_integer((json_int_t)st->buffered));
    json_object_set_new(o, "multiplexed_connections", json_integer((json_int_t)srv->nmux));
    json_object_set_new(o, "virtual_connections", json_integer((json_int_t)srv->nvconns));
    json_object_set_new(o, "memory", json_integer((json_int_t)st->memory));
    json_object_set_new(o, "private_memory", json_integer((json_int_t)st->private_memory));
    json_object_set_new(o, "clear_pending", json_integer((json_int_t)st->nstale));
    json_object_set_new(limits, "max_private_bytes",
                        json_integer((json_int_t)srv->opts.max_private_bytes));
    json_object_set_new(limits, "max_list_keys", json_integer((json_int_t)srv->opts.max_list_keys));
    uint64_t requests = 0;
    for (int i = 0; i < RDZV_OP_COUNT; i++)
        requests += st->ops[i];
    json_object_set_new(o, "traffic",
                        json_pack("{s:I, s:I, s:I}", "requests", (json_int_t)requests, "bytes_in",
                                  (json_int_t)srv->bytes_in, "bytes_out",
                                  (json_int_t)srv->bytes_out));
    json_object_set_new(o, "protocol",
                        json_pack("{s:I, s:I}", "legacy", (json_int_t)srv->gens[RDZV_GEN_LEGACY],
                                  "modern", (json_int_t)srv->gens[RDZV_GEN_MODERN]));
    /* 15 digits: uptime_s, whole milliseconds, prints as 0.831, not 0.83099999999999996. */
    char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(15));
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

static void sweeper_async_cb(uv_async_t *a)
{
    rdzv_server *srv = a->data;
    lock(srv);
    start_sweeper(srv);
    unlock(srv);
}

/*
 * The clear itself only marks what it deletes (rdzv__store_clear()); the sweeper frees it on
 * the loop thread, which a threaded server's caller wakes.
 */
int rdzv_server_clear(rdzv_server *srv, const char *keep_prefix)
{
    if (!srv)
        return -EINVAL;
    const char *keep = keep_prefix ? keep_prefix : "";
    lock(srv);
    size_t n = rdzv__store_clear(&srv->store, (const uint8_t *)keep, strlen(keep));
    size_t stale = srv->store.nstale;
    if (!srv->lh.threaded)
        start_sweeper(srv);
    unlock(srv);
    if (srv->lh.threaded && stale > 0)
        uv_async_send(&srv->clear_async);
    logf_(srv, RDZV_LOG_INFO, "cleared %zu keys outside '%s' (%zu names left to free)", n, keep,
          stale);
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
    rdzv__loophost_free(&srv->lh);
    if (srv->spare_fd >= 0)
        close(srv->spare_fd);
    rdzv__peercred_close(&srv->cred);
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
    if (--srv->open_handles == 0 && srv->closing && !srv->lh.threaded) {
        server_free(srv);
        rdzv__buf_spares_free();
    }
}

static void listener_closed(uv_handle_t *h)
{
    rdzv_server *srv = h->data;
    close(srv->listen_fd); /* a uv_poll_t does not close its descriptor */
    srv->listen_fd = -1;
    handle_closed(h);
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
        uv_close((uv_handle_t *)&srv->sweep, handle_closed);
        uv_close((uv_handle_t *)&srv->refuse_timer, handle_closed);
        uv_close((uv_handle_t *)&srv->resume_timer, handle_closed);
        uv_close((uv_handle_t *)&srv->sweeper, handle_closed);
        uv_close((uv_handle_t *)&srv->flusher, handle_closed);
        if (!srv->lh.threaded)
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

    if ((!threaded && !loop) || !out || rdzv__server_check_options(opts) < 0) {
        rc = -EINVAL;
        goto out;
    }
    srv = calloc(1, sizeof(*srv));
    if (srv) {
        srv->listen_fd = srv->spare_fd = -1;
        queue_init(&srv->clients);
        queue_init(&srv->probation);
    }
    if (!srv || (opts->host && !(srv->host = strdup(opts->host)))) {
        rc = -ENOMEM;
        goto out;
    }
    srv->opts = *opts;
    srv->opts.host = srv->host;
    srv->opts.token = NULL; /* the copy in srv->token is the one used */
    srv->opts.allow = NULL; /* parsed into srv->allow */
    srv->euid = (uint32_t)geteuid();
    rdzv__peercred_init(&srv->cred);
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
    srv->limits = (rdzv__limits){opts->max_key_bytes, opts->max_value_bytes,
                                 opts->max_keys_per_request, opts->max_request_bytes};
    if ((rc = rdzv__store_init(&srv->store, opts->max_total_bytes)) < 0)
        goto out;
    if ((rc = rdzv__listen_socket(opts, &fd, &srv->port)) < 0)
        goto out;
    if ((rc = rdzv__loophost_init(&srv->lh, threaded, loop, &srv->loop)) < 0)
        goto out;
    loop = srv->loop;
    srv->start_ms = uv_hrtime() / 1000000;

    srv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC); /* -1: pause instead */
    /* The owner lookups' descriptors, kept for the server's life (see peercred.c); where they
     * cannot be opened now, each lookup tries again, and local peers are refused meanwhile. */
    if (!opts->allow_other_users || srv->token || opts->nallow > 0) {
        int prc = rdzv__peercred_open(&srv->cred);
        if (prc < 0)
            logf_(srv, RDZV_LOG_WARN,
                  "cannot open the kernel sockets that find a local peer's owner (%s): "
                  "connections from this host are refused until they open",
                  rdzv_strerror(prc));
    }
    srv->max_connections = opts->max_connections ? opts->max_connections
                                                 : rdzv__derive_max_connections(opts->fd_reserve);
    srv->max_probation = opts->max_probation ? opts->max_probation : srv->max_connections / 2;
    if (srv->max_probation > srv->max_connections)
        srv->max_probation = srv->max_connections;
    if (srv->max_probation == 0)
        srv->max_probation = 1;
    srv->store.max_conn_output = opts->max_conn_output;
    srv->store.max_buffered = opts->max_buffered_bytes;
    srv->store.max_private_bytes = opts->max_private_bytes;
    srv->store.max_list_keys = opts->max_list_keys;

    /* A poll handle watches the ready socket (see the top of the file for why not
     * uv_listen()). Its failure (-EEXIST: a descriptor the loop already watches) leaves no
     * handle behind; after it nothing fails. */
    if ((rc = uv_poll_init_socket(loop, &srv->listener, fd)) < 0)
        goto out;
    srv->listen_fd = fd;
    fd = -1; /* closed in listener_closed() */
    srv->listener.data = srv;
    uv_timer_t *timers[] = {&srv->sweep, &srv->refuse_timer, &srv->resume_timer};
    for (size_t i = 0; i < sizeof(timers) / sizeof(timers[0]); i++) {
        uv_timer_init(loop, timers[i]);
        timers[i]->data = srv;
        uv_unref((uv_handle_t *)timers[i]); /* they never keep a loop alive on their own */
    }
    uv_idle_init(loop, &srv->sweeper);
    srv->sweeper.data = srv;
    uv_unref((uv_handle_t *)&srv->sweeper);
    uv_check_init(loop, &srv->flusher);
    srv->flusher.data = srv;
    uv_unref((uv_handle_t *)&srv->flusher);
    srv->open_handles = 6;
    rc = uv_poll_start(&srv->listener, UV_READABLE, on_listen_ready);
    int shortest = 0; /* seconds: the shortest timeout in force */
    if (opts->request_timeout_s > 0)
        shortest = opts->request_timeout_s;
    if (opts->idle_timeout_s > 0 && (shortest == 0 || opts->idle_timeout_s < shortest))
        shortest = opts->idle_timeout_s;
    if (srv->token && opts->auth_timeout_s > 0 &&
        (shortest == 0 || opts->auth_timeout_s < shortest))
        shortest = opts->auth_timeout_s;
    if (rc == 0 && shortest > 0) {
        uint64_t every = (uint64_t)shortest * 250; /* a quarter of it, 100 ms to 1 s */
        every = every < 100 ? 100 : every > 1000 ? 1000 : every;
        uv_timer_start(&srv->sweep, sweep_cb, every, every);
    }
out:
    if (rc < 0) {
        if (fd >= 0)
            close(fd);
        server_discard(srv);
        return rc;
    }
    if (opts->listen_fd >= 0)
        logf_(srv, RDZV_LOG_INFO, "listening on fd %d, port %d (at most %zu connections)",
              opts->listen_fd, srv->port, srv->max_connections);
    else
        logf_(srv, RDZV_LOG_INFO,
              strchr(opts->host, ':') ? "listening on [%s]:%d (at most %zu connections)"
                                      : "listening on %s:%d (at most %zu connections)",
              opts->host, srv->port, srv->max_connections);
    *out = srv;
    return 0;
}

/* The freed large buffers a server's loop thread keeps for reuse (store.h): an eighth of
 * max_buffered_bytes, at most 64 MiB, so that they stay within the caps' margin. */
static size_t spare_limit(const rdzv_server_options *o)
{
    size_t n = o->max_buffered_bytes / 8;
    return n < ((size_t)64 << 20) ? n : (size_t)64 << 20;
}

int rdzv_server_create(void *loop, const rdzv_server_options *opts, rdzv_server **out)
{
    int rc = server_init(loop, opts, false, out);
    if (rc == 0)
        rdzv__buf_spares_limit(spare_limit(opts));
    return rc;
}

/* Starts closing every handle; the loop ends once they are all closed. */
static void begin_close(rdzv_server *srv)
{
    srv->closing = true;
    while (!queue_empty(&srv->clients))
        client_close(queue_data(queue_head(&srv->clients), client, node), NULL);
    uv_close((uv_handle_t *)&srv->listener, listener_closed);
    uv_close((uv_handle_t *)&srv->sweep, handle_closed);
    uv_close((uv_handle_t *)&srv->refuse_timer, handle_closed);
    uv_close((uv_handle_t *)&srv->resume_timer, handle_closed);
    uv_close((uv_handle_t *)&srv->sweeper, handle_closed);
    uv_close((uv_handle_t *)&srv->flusher, handle_closed);
}


/* The loop thread's hooks (loophost.h). */
static void thread_stop(void *arg)
{
    rdzv_server *srv = arg;
    uv_close((uv_handle_t *)&srv->clear_async, NULL);
    begin_close(srv);
}

static void thread_enter(void *arg)
{
    rdzv_server *srv = arg;
    rdzv__buf_spares_limit(spare_limit(&srv->opts));
}

static void thread_leave(void *arg)
{
    (void)arg;
    rdzv__buf_spares_free();
}

int rdzv_server_start(const rdzv_server_options *opts, rdzv_server **out)
{
    rdzv_server *srv;
    int rc = server_init(NULL, opts, true, out ? &srv : NULL);
    if (rc < 0)
        return rc;
    uv_async_init(srv->loop, &srv->clear_async, sweeper_async_cb);
    srv->clear_async.data = srv;
    if ((rc = rdzv__loophost_start(&srv->lh, thread_stop, thread_enter, thread_leave, srv)) < 0) {
        uv_close((uv_handle_t *)&srv->clear_async, NULL);
        begin_close(srv);
        uv_run(srv->loop, UV_RUN_DEFAULT);
        server_free(srv);
        return rc;
    }
    *out = srv;
    return 0;
}

void rdzv_server_close(rdzv_server *srv)
{
    if (!srv)
        return;
    if (srv->lh.threaded) {
        rdzv__loophost_stop(&srv->lh);
        server_free(srv);
    } else if (!srv->closing) {
        begin_close(srv);
    }
}
