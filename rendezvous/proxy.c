/*
 * The per-node store proxy (rdzv.h, rdzv_proxy_*): serves the workers of one node as if it were
 * the store, and carries their connections to the root over one multiplexed connection (mux.h).
 *
 * Each worker connection is parsed here (both generations, rdzv__parse()) and maps onto a
 * virtual connection (vconn) of its own at the root, opened by its first forwarded request and
 * closed with it; its requests go upstream whole and in arrival order, tagged with its
 * generation and whether it authenticated here, and the root's replies come back byte for byte.
 * So every request runs at the root as on a connection of its own (CANCEL_WAIT, the WAITs a
 * close releases, legacy watches, caps, the private keys), and nothing is translated. The proxy
 * itself answers only VALIDATE (nothing to answer) and the handshake (auth.h), with the job's
 * token, and applies the root's admission rules to its peers (rdzv__local_owner(), probation).
 *
 * Coalescing. A WAIT, or a GET, of a worker with nothing else outstanding joins an upstream
 * request of the same operation, keys and authentication class that is still unanswered, a GET
 * only while no request that could change a key (anything but the read-only operations of
 * read_only()) went upstream since it was sent; otherwise it is sent on a vconn of the proxy's
 * own for its group (a "group"), and others may join it. The answer goes to every member. A
 * member's CANCEL_WAIT or close detaches it alone; a WAIT group left empty is closed upstream.
 * Why this cannot be told apart from the direct path through the store: the mux connection is
 * FIFO both ways and the root frames replies in the order it makes them (store.c, vreply()), so
 * everything a worker observed through this proxy before joining was made at the root before
 * the answer it joins; and with nothing outstanding (tracked below) the answer cannot overtake
 * a reply the worker awaits on its own vconn. The one residual difference: a write made at the
 * root after the shared GET ran there and made known to the joiner through a side channel (not
 * the store) within one round trip is not seen by the joined GET.
 *
 * "Nothing outstanding" is known by following the replies on the worker's own vconn: each
 * forwarded request expects a reply of a known shape (none, fixed bytes, vectors), WAITs and
 * BARRIERs expect one byte at any time after the earlier replies, CANCEL_WAIT its one byte. A
 * worker whose stream cannot be followed (WATCH_KEY, LIST_KEYS, QUEUE_POP, a request pipelined
 * behind a pending WAIT) is not coalesced again: it keeps its exact one-for-one path.
 *
 * Failure: when the upstream connection is lost every worker connection is closed and the
 * proxy stops listening (workers see the store gone); on_lost tells the host.
 *
 * Threading: like rdzv_server: embedded on the caller's loop (not thread-safe), or on a thread
 * of its own whose `lock` guards the counters for rdzv_proxy_stats().
 */
#include "auth.h"
#include "client.h"
#include "listen.h"
#include "loophost.h"
#include "monoclock.h"
#include "mux.h"
#include "rdzv.h"
#include "store.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#define READ_BUF_BYTES (64 * 1024)
#define ID_BUCKETS 4096
#define GROUP_BUCKETS 1024
#define EXPECT_MAX 64 /* replies followed per worker; more outstanding: not followed */

/* What owns a vconn id here: a worker's own vconn or a group's. */
enum { EP_WORKER, EP_GROUP };
typedef struct endpoint {
    uint32_t id; /* 0: none */
    uint8_t kind;
    struct endpoint *next; /* in px->ids */
} endpoint;

/* The shape of an awaited reply on a worker's own vconn. */
enum { X_FIXED, X_VECS, X_CANCEL };
typedef struct expect {
    uint8_t kind;
    uint64_t count; /* X_FIXED: bytes; X_VECS: vectors */
} expect;

typedef struct group group;

typedef struct worker {
    uv_tcp_t tcp;
    struct rdzv_proxy *px;
    queue node; /* in px->workers */
    endpoint ep;
    rdzv__parser parser;
    rdzv__buf pend; /* an incomplete frame */
    rdzv__buf out;  /* replies not yet handed to the kernel */
    queue dirty_node;
    bool dirty, closing, probation;
    rdzv__auth_conn auth;
    /* following the own vconn's replies (file comment) */
    bool untracked;
    expect xq[EXPECT_MAX];
    size_t xhead, xn;
    uint64_t need;   /* bytes left of the head reply's current piece */
    uint8_t lenb[8]; /* a vector's length prefix, as it arrives */
    int lenpos;      /* of lenb; 8: reading the vector's bytes */
    size_t v_wait;   /* WAITs and BARRIERs pending on the own vconn */
    group *g;        /* the group this worker's coalesced request waits on */
    queue gnode;     /* in g->members */
    char peer[64];
} worker;

struct group {
    endpoint ep;
    enum rdzv_op op; /* WAIT or GET */
    uint8_t flags;   /* RDZV_MUX_AUTH */
    uint64_t hash, epoch;
    uint8_t *body; /* the request after its opcode: what identifies the group */
    size_t body_len;
    group *hnext; /* in px->groups while joinable */
    bool joinable;
    queue members;
    rdzv__buf reply; /* a GET's reply as it arrives */
    queue all_node;  /* in px->all_groups, until freed */
};

typedef struct out_req {
    uv_write_t req;
    uint8_t *data;
    struct rdzv_proxy *px; /* a write to the root: may resume reading the workers */
} out_req;

struct rdzv_proxy {
    uv_loop_t *loop;
    rdzv_proxy_options opts;
    char *host, *up_host, *token;
    rdzv__limits limits;
    uv_tcp_t listener, up;
    int port;
    int open_handles;
    bool closing, lost, listening;
    bool paused; /* the workers are not read: the root's backlog is over max_pending_output */
    queue workers, dirty;
    queue all_groups; /* group (all_node): every group not freed, for proxy_free() */
    endpoint *ids[ID_BUCKETS];
    group *groups[GROUP_BUCKETS];
    uint32_t next_id;
    uint32_t *spare_ids; /* groups' vconns with nothing pending at the root, to reuse */
    size_t nspare, spare_cap;
    uint64_t epoch; /* requests that could change a key, sent so far */
    rdzv__wbuf up_out;
    /* the upstream reply stream: a frame header as it arrives, then its bytes */
    uint8_t hdr[8];
    int hpos;
    uint32_t cur_id, cur_left;
    rdzv__peercred cred;
    uint32_t euid;
    rdzv_proxy_counters st;
    rdzv__loophost lh; /* embedded or threaded */
    uint8_t rbuf[READ_BUF_BYTES];
};

#define lock(px) rdzv__loophost_lock(&(px)->lh)
#define unlock(px) rdzv__loophost_unlock(&(px)->lh)
#define logf_(px, level, ...) rdzv__logf((px)->opts.log, (px)->opts.log_arg, level, __VA_ARGS__)

void rdzv_proxy_options_init(rdzv_proxy_options *o)
{
    memset(o, 0, sizeof(*o));
    o->host = "127.0.0.1";
    o->connect_timeout_ms = 10000;
    o->max_request_bytes = (size_t)64 << 20;
    o->max_pending_output = (size_t)256 << 20;
}

/* ---------------------------------------------------------------------------------------- */
/* Vconn ids                                                                                */
/* ---------------------------------------------------------------------------------------- */

static endpoint *id_find(rdzv_proxy *px, uint32_t id)
{
    endpoint *e = px->ids[id % ID_BUCKETS];
    while (e && e->id != id)
        e = e->next;
    return e;
}

static void id_unlink(rdzv_proxy *px, endpoint *ep)
{
    if (ep->id == 0)
        return;
    endpoint **p = &px->ids[ep->id % ID_BUCKETS];
    while (*p != ep)
        p = &(*p)->next;
    *p = ep->next;
    ep->id = 0;
}

/* Gives `ep` a fresh id (never used on this connection: the root ignores a MUX_CLOSE of an id
 * it does not know, so a reused one could meet a late reply), or a spare group vconn's. */
static void id_assign(rdzv_proxy *px, endpoint *ep, bool spare_ok)
{
    uint32_t id;
    if (spare_ok && px->nspare > 0) {
        id = px->spare_ids[--px->nspare];
    } else {
        do
            id = px->next_id++;
        while (id == 0 || id_find(px, id));
    }
    ep->id = id;
    ep->next = px->ids[id % ID_BUCKETS];
    px->ids[id % ID_BUCKETS] = ep;
}

/* ---------------------------------------------------------------------------------------- */
/* Output                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static void worker_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);
static void worker_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);

/* Stops reading the workers while the root has a backlog of their requests, and reads them
 * again once it took half of it: a flood of requests waits in the workers' sockets, not here. */
static void pace_workers(rdzv_proxy *px)
{
    size_t queued = px->up.write_queue_size;
    bool pause = queued > px->opts.max_pending_output;
    bool resume = px->paused && queued <= px->opts.max_pending_output / 2;
    if ((!pause || px->paused) && !resume)
        return;
    px->paused = pause;
    queue *q;
    queue_foreach(q, &px->workers) {
        uv_stream_t *s = (uv_stream_t *)&queue_data(q, struct worker, node)->tcp;
        if (pause)
            uv_read_stop(s);
        else
            uv_read_start(s, worker_alloc, worker_read);
    }
}

static void out_done(uv_write_t *req, int status)
{
    (void)status; /* a failed write shows as a failed read or close on that stream */
    out_req *w = (out_req *)req;
    rdzv_proxy *px = w->px;
    free(w->data);
    free(w);
    if (px && !px->closing && !px->lost) {
        lock(px);
        pace_workers(px);
        unlock(px);
    }
}

/*
 * Sends buf[0..*len) on `s`: what the kernel takes now, the rest through a write request that
 * owns a copy. Returns 0 (the buffer is emptied) or a negative errno.
 */
static int send_out(uv_stream_t *s, uint8_t *buf, size_t *len, rdzv_proxy *px)
{
    size_t off = 0;
    if (*len == 0)
        return 0;
    if (s->write_queue_size == 0) {
        uv_buf_t b = uv_buf_init((char *)buf, (unsigned)*len);
        int n = uv_try_write(s, &b, 1);
        if (n > 0)
            off = (size_t)n;
        else if (n != UV_EAGAIN)
            return n;
    }
    if (off < *len) {
        out_req *w = malloc(sizeof(*w));
        uint8_t *copy = malloc(*len - off);
        if (!w || !copy) {
            free(w);
            free(copy);
            return -ENOMEM;
        }
        memcpy(copy, buf + off, *len - off);
        w->data = copy;
        w->px = px;
        uv_buf_t b = uv_buf_init((char *)copy, (unsigned)(*len - off));
        int rc = uv_write(&w->req, s, &b, 1, out_done);
        if (rc < 0) {
            free(copy);
            free(w);
            return rc;
        }
    }
    *len = 0;
    return 0;
}

static void upstream_lost(rdzv_proxy *px, const char *why);

/* Sends what the workers' requests queued for the root. */
static void flush_up(rdzv_proxy *px)
{
    if (px->lost || px->closing || px->up_out.len == 0)
        return;
    if (px->up_out.err) {
        upstream_lost(px, "out of memory");
        return;
    }
    px->st.bytes_up += px->up_out.len;
    int rc = send_out((uv_stream_t *)&px->up, px->up_out.data, &px->up_out.len, px);
    if (rc < 0)
        upstream_lost(px, uv_strerror(rc));
    else
        pace_workers(px);
}

static void worker_close(worker *w, const char *why);

static void to_worker(worker *w, const void *p, size_t n)
{
    if (w->closing)
        return;
    if (rdzv__buf_append(&w->out, p, n) < 0) {
        worker_close(w, "out of memory");
        return;
    }
    if (!w->dirty) {
        w->dirty = true;
        queue_insert_tail(&w->px->dirty, &w->dirty_node);
    }
}

/* Sends what was queued for the workers. */
static void flush_workers(rdzv_proxy *px)
{
    while (!queue_empty(&px->dirty)) {
        worker *w = queue_data(queue_head(&px->dirty), worker, dirty_node);
        queue_remove(&w->dirty_node);
        w->dirty = false;
        if (w->closing)
            continue;
        int rc = send_out((uv_stream_t *)&w->tcp, w->out.data, &w->out.len, NULL);
        if (rc < 0)
            worker_close(w, uv_strerror(rc));
        else if (w->tcp.write_queue_size > px->opts.max_pending_output)
            worker_close(w, "its unread replies exceed max_pending_output");
        else if (w->out.cap > 4096)
            rdzv__buf_free(&w->out);
    }
}

static void flush(rdzv_proxy *px)
{
    flush_up(px);
    flush_workers(px);
}

/* ---------------------------------------------------------------------------------------- */
/* Groups                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static uint64_t fnv(uint64_t h, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void group_unhash(rdzv_proxy *px, group *g)
{
    if (!g->joinable)
        return;
    group **p = &px->groups[g->hash % GROUP_BUCKETS];
    while (*p != g)
        p = &(*p)->hnext;
    *p = g->hnext;
    g->joinable = false;
}

/* Frees a group's memory (it is out of the hash, its id given back or closed). */
static void group_destroy(group *g)
{
    queue_remove(&g->all_node);
    rdzv__buf_free(&g->reply);
    free(g->body);
    free(g);
}

/* Frees a group; `idle`: its vconn has nothing pending at the root and may serve another. */
static void group_free(rdzv_proxy *px, group *g, bool idle)
{
    group_unhash(px, g);
    uint32_t id = g->ep.id;
    id_unlink(px, &g->ep);
    if (idle && id != 0) {
        if (px->nspare == px->spare_cap) {
            size_t cap = px->spare_cap ? px->spare_cap * 2 : 64;
            uint32_t *v = realloc(px->spare_ids, cap * sizeof(*v));
            if (v) {
                px->spare_ids = v;
                px->spare_cap = cap;
            }
        }
        if (px->nspare < px->spare_cap)
            px->spare_ids[px->nspare++] = id;
        else
            rdzv__mux_put_close(&px->up_out, id);
    } else if (id != 0) {
        rdzv__mux_put_close(&px->up_out, id);
    }
    group_destroy(g);
}

/* Takes `w` out of its group; a WAIT group left empty is given up upstream. */
static void group_leave(worker *w)
{
    group *g = w->g;
    if (!g)
        return;
    queue_remove(&w->gnode);
    w->g = NULL;
    if (queue_empty(&g->members) && g->op == RDZV_OP_WAIT)
        group_free(w->px, g, false);
}

/* Answers every member of `g` with reply[0..n) and frees it. */
static void group_answer(rdzv_proxy *px, group *g, const uint8_t *reply, size_t n)
{
    while (!queue_empty(&g->members)) {
        worker *w = queue_data(queue_head(&g->members), worker, gnode);
        queue_remove(&w->gnode);
        w->g = NULL;
        to_worker(w, reply, n);
    }
    group_free(px, g, true);
}

/* Bytes of the upstream reply for group `g`. */
static void group_bytes(rdzv_proxy *px, group *g, const uint8_t *p, size_t n)
{
    if (g->op == RDZV_OP_WAIT) {
        group_unhash(px, g); /* answered: nobody joins it any more */
        group_answer(px, g, p, 1);
        return;
    }
    group_unhash(px, g);
    if (rdzv__buf_append(&g->reply, p, n) < 0) {
        upstream_lost(px, "out of memory");
        return;
    }
    if (g->reply.len >= 8 && g->reply.len == 8 + rdzv__ld64(g->reply.data))
        group_answer(px, g, g->reply.data, g->reply.len);
}

/* The operations that change no key: a GET may join one sent before any number of these. */
static bool read_only(enum rdzv_op op)
{
    switch (op) {
    case RDZV_OP_VALIDATE:
    case RDZV_OP_GET:
    case RDZV_OP_CHECK:
    case RDZV_OP_WAIT:
    case RDZV_OP_GETNUMKEYS:
    case RDZV_OP_MULTI_GET:
    case RDZV_OP_CANCEL_WAIT:
    case RDZV_OP_PING:
    case RDZV_OP_QUEUE_LEN:
    case RDZV_OP_LIST_KEYS:
    case RDZV_OP_STATUS:
        return true;
    default:
        return false;
    }
}

/*
 * Coalesces the WAIT or GET frame[0..n) of `w` (idle: see the file comment): joins a group or
 * starts one. Returns 0, or -ENOMEM (the caller forwards it one for one).
 */
static int coalesce(worker *w, const rdzv__request *req, const uint8_t *frame, size_t n,
                    uint8_t flags)
{
    rdzv_proxy *px = w->px;
    uint64_t h =
        fnv(fnv(14695981039346656037ull, &flags, 1), (const uint8_t *)&req->op, sizeof(req->op));
    h = fnv(h, frame + 1, n - 1);
    for (group *g = px->groups[h % GROUP_BUCKETS]; g; g = g->hnext)
        if (g->hash == h && g->op == req->op && g->flags == flags && g->body_len == n - 1 &&
            memcmp(g->body, frame + 1, n - 1) == 0 &&
            (req->op == RDZV_OP_WAIT || g->epoch == px->epoch)) {
            w->g = g;
            queue_insert_tail(&g->members, &w->gnode);
            px->st.coalesced++;
            return 0;
        }
    group *g = calloc(1, sizeof(*g));
    if (!g || !(g->body = malloc(n - 1))) {
        free(g);
        return -ENOMEM;
    }
    memcpy(g->body, frame + 1, n - 1);
    g->body_len = n - 1;
    g->op = req->op;
    g->flags = flags;
    g->hash = h;
    g->epoch = px->epoch;
    g->ep.kind = EP_GROUP;
    queue_init(&g->members);
    queue_insert_tail(&px->all_groups, &g->all_node);
    g->hnext = px->groups[h % GROUP_BUCKETS];
    px->groups[h % GROUP_BUCKETS] = g;
    g->joinable = true;
    id_assign(px, &g->ep, true);
    /* Groups speak the modern generation: a WAIT or GET differs between the two only in its
     * opcode, and their replies not at all. */
    uint8_t op = (uint8_t)rdzv__opcode(RDZV_GEN_MODERN, req->op);
    rdzv__put_u8(&px->up_out, RDZV_M_MUX);
    rdzv__put_u32(&px->up_out, g->ep.id);
    rdzv__put_u64(&px->up_out, (uint64_t)n + 1);
    rdzv__put_u8(&px->up_out, flags);
    rdzv__put_u8(&px->up_out, op);
    rdzv__put_raw(&px->up_out, frame + 1, n - 1);
    px->st.upstream_requests++;
    w->g = g;
    queue_insert_tail(&g->members, &w->gnode);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Following a worker's own vconn                                                           */
/* ---------------------------------------------------------------------------------------- */

static void expect_push(worker *w, uint8_t kind, uint64_t count)
{
    if (w->xn == EXPECT_MAX) {
        w->untracked = true;
        return;
    }
    if (w->xn == 0) {
        w->need = kind == X_FIXED ? count : 0;
        w->lenpos = 0;
    }
    w->xq[(w->xhead + w->xn++) % EXPECT_MAX] = (expect){kind, count};
}

static void expect_pop(worker *w)
{
    w->xhead = (w->xhead + 1) % EXPECT_MAX;
    if (--w->xn > 0) {
        expect *e = &w->xq[w->xhead];
        w->need = e->kind == X_FIXED ? e->count : 0;
        w->lenpos = 0;
    }
}

/* Notes what reply the request `op` (`count` keys) forwarded on the own vconn awaits. */
static void expect_request(worker *w, const rdzv__request *r)
{
    if (w->untracked)
        return;
    if (w->v_wait > 0 && r->op != RDZV_OP_CANCEL_WAIT) {
        w->untracked = true; /* its reply and the WAIT's byte could come either way round */
        return;
    }
    switch (r->op) {
    case RDZV_OP_VALIDATE:
    case RDZV_OP_SET:
    case RDZV_OP_APPEND:
    case RDZV_OP_MULTI_SET:
    case RDZV_OP_QUEUE_PUSH:
        return;
    case RDZV_OP_COMPARE_SET:
    case RDZV_OP_GET:
    case RDZV_OP_STATUS:
        expect_push(w, X_VECS, 1);
        return;
    case RDZV_OP_MULTI_GET:
        if (r->count > 0)
            expect_push(w, X_VECS, r->count);
        return;
    case RDZV_OP_ADD:
    case RDZV_OP_GETNUMKEYS:
    case RDZV_OP_DELETE_KEY:
    case RDZV_OP_QUEUE_LEN:
        expect_push(w, X_FIXED, 8);
        return;
    case RDZV_OP_CHECK:
        expect_push(w, X_FIXED, 1);
        return;
    case RDZV_OP_PING:
        expect_push(w, X_FIXED, 4);
        return;
    case RDZV_OP_WAIT:
    case RDZV_OP_BARRIER:
        w->v_wait++;
        return;
    case RDZV_OP_CANCEL_WAIT:
        expect_push(w, X_CANCEL, 1);
        return;
    default: /* WATCH_KEY, LIST_KEYS, QUEUE_POP: not followed */
        w->untracked = true;
        return;
    }
}

/* Follows reply bytes p[0..n) of the own vconn. */
static void expect_reply(worker *w, const uint8_t *p, size_t n)
{
    while (n > 0 && !w->untracked) {
        if (w->xn == 0) {
            if (w->v_wait > 0 && p[0] == RDZV_WAIT_STOP_WAITING) {
                w->v_wait--;
                p++;
                n--;
                continue;
            }
            w->untracked = true; /* bytes nobody asked for (a watch notification) */
            return;
        }
        expect *e = &w->xq[w->xhead];
        if (e->kind == X_CANCEL) {
            if (p[0] == RDZV_WAIT_CANCELED) {
                w->v_wait = 0;
                expect_pop(w);
            } else if (p[0] == RDZV_WAIT_STOP_WAITING && w->v_wait > 0) {
                w->v_wait--;
            } else {
                w->untracked = true;
            }
            p++;
            n--;
            continue;
        }
        if (e->kind == X_VECS && w->lenpos < 8) {
            w->lenb[w->lenpos++] = *p++;
            n--;
            if (w->lenpos == 8)
                w->need = rdzv__ld64(w->lenb);
        } else {
            size_t take = n < w->need ? n : (size_t)w->need;
            w->need -= take;
            p += take;
            n -= take;
        }
        if (w->need == 0 && (e->kind == X_FIXED || w->lenpos == 8)) {
            if (e->kind == X_VECS && --e->count > 0)
                w->lenpos = 0;
            else
                expect_pop(w);
        }
    }
}

/* True when `w` awaits nothing: a request of its may be coalesced. */
static bool idle(const worker *w)
{
    return !w->untracked && w->xn == 0 && w->v_wait == 0 && !w->g;
}

/* ---------------------------------------------------------------------------------------- */
/* Workers                                                                                  */
/* ---------------------------------------------------------------------------------------- */

static void handle_closed(uv_handle_t *h);

static void worker_closed(uv_handle_t *h)
{
    worker *w = h->data;
    rdzv_proxy *px = w->px;
    rdzv__buf_free(&w->pend);
    rdzv__buf_free(&w->out);
    free(w);
    handle_closed((uv_handle_t *)&px->listener);
}

static void worker_close(worker *w, const char *why)
{
    rdzv_proxy *px = w->px;
    if (w->closing)
        return;
    w->closing = true;
    if (why)
        logf_(px, RDZV_LOG_WARN, "closing worker connection from %s: %s", w->peer, why);
    group_leave(w);
    if (w->ep.id != 0 && !px->lost) {
        rdzv__mux_put_close(&px->up_out, w->ep.id);
    }
    id_unlink(px, &w->ep);
    if (w->dirty) {
        queue_remove(&w->dirty_node);
        w->dirty = false;
    }
    queue_remove(&w->node);
    px->st.connections--;
    uv_close((uv_handle_t *)&w->tcp, worker_closed);
}

/* Forwards frame[0..n) of `w` one for one on its own vconn. */
static void forward(worker *w, const rdzv__request *req, const uint8_t *frame, size_t n,
                    uint8_t flags)
{
    rdzv_proxy *px = w->px;
    if (w->ep.id == 0) {
        w->ep.kind = EP_WORKER;
        id_assign(px, &w->ep, false);
    }
    rdzv__mux_put(&px->up_out, w->ep.id, flags, frame, n);
    px->st.upstream_requests++;
    if (!read_only(req->op))
        px->epoch++;
    expect_request(w, req);
}

/* Runs the handshake's step `req` for `w` (auth.h), answering it here. Returns 0 or -1 after
 * closing `w`. */
static int auth_step(worker *w, const rdzv__request *req)
{
    rdzv_proxy *px = w->px;
    int rc;
    if (req->op == RDZV_OP_AUTH_HELLO) {
        uint8_t reply[RDZV_AUTH_HELLO_REPLY_BYTES];
        size_t n = 0;
        rc = rdzv__auth_server_hello(px->token, &w->auth, req->key, req->key_len, reply, &n);
        if (rc == 0) {
            uint64_t len = n;
            to_worker(w, &len, 8);
            to_worker(w, reply, n);
            return 0;
        }
    } else {
        rc = rdzv__auth_server_proof(px->token, &w->auth, req->key, req->key_len);
        if (rc == 0) {
            static const uint8_t ok[9] = {1, 0, 0, 0, 0, 0, 0, 0, 0};
            w->probation = false;
            to_worker(w, ok, sizeof(ok));
            return 0;
        }
    }
    worker_close(w, rc == -EACCES ? "authentication failed: wrong proof"
                                  : "authentication failed: handshake out of order or malformed");
    return -1;
}

/* Runs one request of `w`. Returns 0, or -1 after closing `w`. */
static int worker_request(worker *w, const rdzv__request *req, const uint8_t *frame, size_t n)
{
    rdzv_proxy *px = w->px;
    char why[200];
    px->st.worker_requests++;
    if (w->probation && req->op != RDZV_OP_VALIDATE && req->op != RDZV_OP_AUTH_HELLO &&
        req->op != RDZV_OP_AUTH_PROOF) {
        snprintf(why, sizeof(why),
                 "%s refused: the connection is not from this host and did not authenticate",
                 rdzv__op_name(req->op));
        worker_close(w, why);
        return -1;
    }
    switch (req->op) {
    case RDZV_OP_VALIDATE:
        return 0;
    case RDZV_OP_AUTH_HELLO:
    case RDZV_OP_AUTH_PROOF:
        return auth_step(w, req);
    case RDZV_OP_MUX:
    case RDZV_OP_MUX_CLOSE:
        worker_close(w, "MUX refused: a worker's connection does not multiplex");
        return -1;
    default:
        break;
    }
    bool authed = w->auth.state == RDZV_AUTH_DONE;
    if (px->token && !authed && rdzv__request_private(req)) {
        rdzv__private_refusal(req, why, sizeof(why));
        worker_close(w, why);
        return -1;
    }
    uint8_t flags =
        (authed ? RDZV_MUX_AUTH : 0) | (w->parser.gen == RDZV_GEN_LEGACY ? RDZV_MUX_LEGACY : 0);
    if (req->op == RDZV_OP_CANCEL_WAIT)
        group_leave(w);
    if ((req->op == RDZV_OP_WAIT || req->op == RDZV_OP_GET) && idle(w) &&
        coalesce(w, req, frame, n, flags & RDZV_MUX_AUTH) == 0)
        return 0;
    forward(w, req, frame, n, flags);
    return 0;
}

/* Runs the complete frames of buf[0..len); returns the bytes used, or -1 after closing `w`. */
static ssize_t worker_process(worker *w, const uint8_t *buf, size_t len)
{
    size_t off = 0;
    while (off < len && !w->closing) {
        rdzv__request req;
        int n = rdzv__parse(&w->parser, &w->px->limits, buf + off, len - off, &req);
        if (n == 0)
            break;
        if (n < 0) {
            char why[128];
            snprintf(why, sizeof(why), "%s (opcode %u)", rdzv__parse_strerror(n), buf[off]);
            worker_close(w, why);
            return -1;
        }
        if (worker_request(w, &req, buf + off, (size_t)n) < 0)
            return -1;
        off += (size_t)n;
    }
    return (ssize_t)off;
}

static void worker_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    worker *w = h->data;
    (void)suggested;
    *buf = uv_buf_init((char *)w->px->rbuf, READ_BUF_BYTES);
}

static void worker_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    worker *w = s->data;
    rdzv_proxy *px = w->px;
    if (nread == 0)
        return;
    lock(px);
    if (nread < 0) {
        worker_close(w, nread == UV_EOF ? NULL : uv_strerror((int)nread));
    } else if (w->pend.len == 0) {
        ssize_t used = worker_process(w, (const uint8_t *)buf->base, (size_t)nread);
        if (used >= 0 && (size_t)used < (size_t)nread &&
            rdzv__buf_append(&w->pend, buf->base + used, (size_t)nread - (size_t)used) < 0)
            worker_close(w, "out of memory");
    } else if (rdzv__buf_append(&w->pend, buf->base, (size_t)nread) < 0) {
        worker_close(w, "out of memory");
    } else {
        ssize_t used = worker_process(w, w->pend.data, w->pend.len);
        if (used > 0) {
            memmove(w->pend.data, w->pend.data + used, w->pend.len - (size_t)used);
            w->pend.len -= (size_t)used;
        }
    }
    flush(px);
    unlock(px);
}

/* The other-user rule and probation, as the root applies them (server.c, admit_peer()).
 * Returns false after closing `w`. */
static bool admit_worker(rdzv_proxy *px, worker *w)
{
    struct sockaddr_storage peer, local;
    int pl = sizeof(peer), ll = sizeof(local);
    if (uv_tcp_getpeername(&w->tcp, (struct sockaddr *)&peer, &pl) < 0 ||
        uv_tcp_getsockname(&w->tcp, (struct sockaddr *)&local, &ll) < 0) {
        worker_close(w, "cannot read the connection's addresses");
        return false;
    }
    const struct sockaddr *pa = (const struct sockaddr *)&peer;
    const struct sockaddr *la = (const struct sockaddr *)&local;
    char addr[64] = "?";
    if (pa->sa_family == AF_INET6)
        uv_ip6_name((const struct sockaddr_in6 *)pa, addr, sizeof(addr));
    else
        uv_ip4_name((const struct sockaddr_in *)pa, addr, sizeof(addr));
    snprintf(w->peer, sizeof(w->peer), "%s", addr);
    bool here = rdzv__addr_loopback(pa) || rdzv__addr_same(pa, la);
    if (!px->opts.allow_other_users) {
        uint32_t uid = 0;
        int rc = rdzv__local_owner(&px->cred, pa, la, &uid);
        if (rc < 0) {
            worker_close(w, "refused: the connection comes from this host and its owner cannot "
                            "be established");
            return false;
        }
        here = rc == 1;
        if (here && uid != px->euid && uid != 0) {
            worker_close(w, "refused: the connecting socket belongs to another user of this host");
            return false;
        }
    }
    w->probation = px->token && !here;
    return true;
}

static void on_connection(uv_stream_t *server, int status)
{
    rdzv_proxy *px = server->data;
    if (status < 0)
        return;
    lock(px);
    worker *w = calloc(1, sizeof(*w));
    if (!w || uv_tcp_init(px->loop, &w->tcp) < 0) {
        free(w);
        unlock(px);
        return;
    }
    w->px = px;
    w->tcp.data = w;
    rdzv__parser_init(&w->parser);
    queue_init(&w->gnode);
    px->open_handles++;
    queue_insert_tail(&px->workers, &w->node);
    px->st.connections++;
    if (uv_accept(server, (uv_stream_t *)&w->tcp) < 0) {
        worker_close(w, NULL);
    } else if (admit_worker(px, w)) {
        px->st.accepted++;
        if (!px->paused && uv_read_start((uv_stream_t *)&w->tcp, worker_alloc, worker_read) < 0)
            worker_close(w, "cannot read");
    }
    flush(px);
    unlock(px);
}

/* ---------------------------------------------------------------------------------------- */
/* Upstream                                                                                 */
/* ---------------------------------------------------------------------------------------- */

static void begin_close(rdzv_proxy *px);

static void close_workers(rdzv_proxy *px)
{
    while (!queue_empty(&px->workers))
        worker_close(queue_data(queue_head(&px->workers), worker, node), NULL);
}

/* The root is gone: its workers see the store gone too. */
static void upstream_lost(rdzv_proxy *px, const char *why)
{
    if (px->lost)
        return;
    px->lost = true;
    px->st.upstream_lost = true;
    logf_(px, RDZV_LOG_WARN,
          "lost the connection to the store at %s:%d (%s); "
          "closing its %llu worker connections",
          px->up_host, px->opts.upstream_port, why, (unsigned long long)px->st.connections);
    close_workers(px);
    if (px->listening) {
        uv_close((uv_handle_t *)&px->listener, handle_closed);
        px->listening = false;
    }
    uv_read_stop((uv_stream_t *)&px->up);
    if (px->opts.on_lost)
        px->opts.on_lost(px->opts.on_lost_arg);
}

/* Bytes of the vconn `id`'s replies. */
static void deliver(rdzv_proxy *px, uint32_t id, const uint8_t *p, size_t n)
{
    endpoint *ep = id_find(px, id);
    if (!ep)
        return; /* closed here already */
    if (ep->kind == EP_GROUP) {
        group_bytes(px, (group *)((char *)ep - offsetof(group, ep)), p, n);
        return;
    }
    worker *w = (worker *)((char *)ep - offsetof(worker, ep));
    to_worker(w, p, n);
    expect_reply(w, p, n);
}

/* The root closed vconn `id` (mux.h): its worker, or a group's members, are closed. */
static void vconn_closed(rdzv_proxy *px, uint32_t id)
{
    endpoint *ep = id_find(px, id);
    if (!ep)
        return;
    id_unlink(px, ep);
    if (ep->kind == EP_WORKER) {
        worker_close((worker *)((char *)ep - offsetof(worker, ep)), "the store closed it");
        return;
    }
    group *g = (group *)((char *)ep - offsetof(group, ep));
    group_unhash(px, g);
    while (!queue_empty(&g->members)) {
        worker *w = queue_data(queue_head(&g->members), worker, gnode);
        queue_remove(&w->gnode);
        w->g = NULL;
        worker_close(w, "the store closed it");
    }
    group_destroy(g);
}

static void up_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    rdzv_proxy *px = h->data;
    (void)suggested;
    *buf = uv_buf_init((char *)px->rbuf, READ_BUF_BYTES);
}

static void up_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    rdzv_proxy *px = s->data;
    if (nread == 0)
        return;
    lock(px);
    if (nread < 0) {
        upstream_lost(px, nread == UV_EOF ? "the store closed it" : uv_strerror((int)nread));
        unlock(px);
        return;
    }
    px->st.bytes_down += (uint64_t)nread;
    const uint8_t *p = (const uint8_t *)buf->base;
    size_t n = (size_t)nread;
    while (n > 0 && !px->lost) {
        if (px->hpos < 8) {
            size_t take = 8 - (size_t)px->hpos < n ? 8 - (size_t)px->hpos : n;
            memcpy(px->hdr + px->hpos, p, take);
            px->hpos += (int)take;
            p += take;
            n -= take;
            if (px->hpos < 8)
                break;
            px->cur_id = rdzv__ld32(px->hdr);
            px->cur_left = rdzv__ld32(px->hdr + 4);
            if (px->cur_left == RDZV_MUX_CLOSED) {
                vconn_closed(px, px->cur_id);
                px->cur_left = 0;
            }
            if (px->cur_left == 0)
                px->hpos = 0;
            continue;
        }
        size_t take = n < px->cur_left ? n : px->cur_left;
        deliver(px, px->cur_id, p, take);
        p += take;
        n -= take;
        px->cur_left -= (uint32_t)take;
        if (px->cur_left == 0)
            px->hpos = 0;
    }
    flush(px);
    unlock(px);
}

/*
 * Connects to the root with the blocking client (its retries, VALIDATE and the handshake),
 * checks with a PING carried in a MUX frame that it multiplexes, and hands the socket over to
 * the loop. Returns 0 or a negative errno.
 */
static int connect_upstream(rdzv_proxy *px)
{
    rdzv_client_options co;
    rdzv_client_options_init(&co);
    co.connect_timeout_ms = px->opts.connect_timeout_ms;
    co.token = px->token;
    rdzv_client *c = NULL;
    int rc = rdzv_client_connect(px->up_host, px->opts.upstream_port, &co, &c);
    if (rc < 0) {
        logf_(px, RDZV_LOG_ERROR, "%s", rdzv_client_last_error(NULL));
        return rc;
    }
    int64_t deadline = mono_deadline_ns(px->opts.connect_timeout_ms);
    uint8_t frame[5] = {RDZV_M_PING, 0x5A, 0x17, 0xC3, 0x9E};
    uint8_t probe[64];
    rdzv__wbuf b = rdzv__wbuf_fixed(probe, sizeof(probe));
    rdzv__mux_put(&b, 0, 0, frame, sizeof(frame));
    rdzv__mux_put_close(&b, 0);
    uint8_t reply[12];
    rc = rdzv__send_all(c, b.data, b.len, deadline, NULL);
    if (rc == 0)
        rc = rdzv__recv_raw(c, reply, sizeof(reply), deadline);
    if (rc == 0 && (rdzv__ld32(reply) != 0 || rdzv__ld32(reply + 4) != 4 ||
                    memcmp(reply + 8, frame + 1, 4) != 0))
        rc = -EPROTO;
    if (rc < 0) {
        logf_(px, RDZV_LOG_INFO, /* the caller decides what it means: -EPROTONOSUPPORT */
              "the store at %s:%d does not multiplex connections (%s): a PyTorch "
              "store, an older librendezvous, or one that needs the job's secret",
              px->up_host, px->opts.upstream_port, rdzv_strerror(rc));
        rdzv_client_close(c);
        return -EPROTONOSUPPORT;
    }
    int fd = c->fd;
    c->fd = -1;
    rdzv_client_close(c);
    if ((rc = uv_tcp_init(px->loop, &px->up)) < 0) {
        close(fd);
        return rc;
    }
    px->up.data = px;
    px->open_handles++;
    if ((rc = uv_tcp_open(&px->up, fd)) < 0) {
        close(fd);
        return rc;
    }
    px->next_id = 1;
    return uv_read_start((uv_stream_t *)&px->up, up_alloc, up_read);
}

/* ---------------------------------------------------------------------------------------- */
/* Life cycle                                                                               */
/* ---------------------------------------------------------------------------------------- */

static void proxy_free(rdzv_proxy *px)
{
    if (!px)
        return;
    rdzv__loophost_free(&px->lh);
    rdzv__peercred_close(&px->cred);
    while (!queue_empty(&px->all_groups))
        group_destroy(queue_data(queue_head(&px->all_groups), group, all_node));
    rdzv__wbuf_free(&px->up_out);
    free(px->spare_ids);
    if (px->token)
        explicit_bzero(px->token, strlen(px->token));
    free(px->token);
    free(px->host);
    free(px->up_host);
    free(px);
}

static void handle_closed(uv_handle_t *h)
{
    rdzv_proxy *px = h->data;
    if (--px->open_handles == 0 && px->closing && !px->lh.threaded)
        proxy_free(px);
}

/* Closes every handle; the loop ends once they are closed. */
static void begin_close(rdzv_proxy *px)
{
    px->closing = true;
    close_workers(px);
    if (px->listening) {
        uv_close((uv_handle_t *)&px->listener, handle_closed);
        px->listening = false;
    }
    if (px->up.data == px && !uv_is_closing((uv_handle_t *)&px->up))
        uv_close((uv_handle_t *)&px->up, handle_closed);
}

static int proxy_init(uv_loop_t *loop, const rdzv_proxy_options *o, bool threaded, rdzv_proxy **out)
{
    rdzv_proxy *px = NULL;
    int fd = -1, rc = 0;
    if ((!threaded && !loop) || !out || !o || !o->upstream_host || o->upstream_port <= 0 ||
        o->upstream_port > 65535 || o->port < 0 || o->port > 65535 ||
        o->max_request_bytes < RDZV_REQUEST_BYTES_MIN ||
        o->max_request_bytes > RDZV_REQUEST_BYTES_MAX || (o->token && rdzv_token_check(o->token)))
        return -EINVAL;
    if (!(px = calloc(1, sizeof(*px))))
        return -ENOMEM;
    queue_init(&px->workers);
    queue_init(&px->dirty);
    queue_init(&px->all_groups);
    rdzv__peercred_init(&px->cred);
    px->opts = *o;
    if (!(px->host = strdup(o->host ? o->host : "127.0.0.1")) ||
        !(px->up_host = strdup(o->upstream_host)) ||
        (o->token && !(px->token = strdup(o->token)))) {
        rc = -ENOMEM;
        goto out;
    }
    px->opts.host = px->host;
    px->opts.upstream_host = px->up_host;
    px->opts.token = NULL;
    px->euid = (uint32_t)geteuid();
    px->limits = (rdzv__limits){RDZV_KEY_BYTES_MAX, o->max_request_bytes, (size_t)1 << 30,
                                o->max_request_bytes};
    if ((rc = rdzv__loophost_init(&px->lh, threaded, loop, &px->loop)) < 0)
        goto out;
    loop = px->loop;
    if (!o->allow_other_users && rdzv__peercred_open(&px->cred) < 0)
        logf_(px, RDZV_LOG_WARN,
              "cannot open the kernel sockets that find a local "
              "peer's owner: local connections are refused until they open");
    rdzv_server_options so;
    rdzv_server_options_init(&so);
    so.host = px->host;
    so.port = o->port;
    if ((rc = rdzv__listen_socket(&so, &fd, &px->port)) < 0)
        goto out;
    if ((rc = connect_upstream(px)) < 0)
        goto out;
    if ((rc = uv_tcp_init(loop, &px->listener)) < 0)
        goto out;
    px->listener.data = px;
    px->open_handles++;
    px->listening = true;
    if ((rc = uv_tcp_open(&px->listener, fd)) < 0)
        goto out;
    fd = -1;
    rc = uv_listen((uv_stream_t *)&px->listener, so.backlog, on_connection);
out:
    if (rc < 0) {
        if (fd >= 0)
            close(fd);
        if (px->open_handles > 0) {
            begin_close(px);
            if (!threaded)
                return rc; /* handle_closed() frees it when the caller runs the loop */
            uv_run(px->loop, UV_RUN_DEFAULT);
        }
        proxy_free(px);
        return rc;
    }
    logf_(px, RDZV_LOG_INFO, "listening on %s:%d for the store at %s:%d", px->host, px->port,
          px->up_host, o->upstream_port);
    *out = px;
    return 0;
}

int rdzv_proxy_create(void *loop, const rdzv_proxy_options *opts, rdzv_proxy **out)
{
    return proxy_init(loop, opts, false, out);
}

/* The loop thread's stop hook (loophost.h). */
static void thread_stop(void *arg)
{
    rdzv_proxy *px = arg;
    lock(px);
    flush(px);
    begin_close(px);
    unlock(px);
}

int rdzv_proxy_start(const rdzv_proxy_options *opts, rdzv_proxy **out)
{
    rdzv_proxy *px;
    int rc = proxy_init(NULL, opts, true, out ? &px : NULL);
    if (rc < 0)
        return rc;
    if ((rc = rdzv__loophost_start(&px->lh, thread_stop, NULL, NULL, px)) < 0) {
        begin_close(px);
        uv_run(px->loop, UV_RUN_DEFAULT);
        proxy_free(px);
        return rc;
    }
    *out = px;
    return 0;
}

int rdzv_proxy_port(const rdzv_proxy *px)
{
    return px ? px->port : -EINVAL;
}

int rdzv_proxy_stats(rdzv_proxy *px, rdzv_proxy_counters *st)
{
    if (!px || !st)
        return -EINVAL;
    lock(px);
    *st = px->st;
    unlock(px);
    return 0;
}

void rdzv_proxy_close(rdzv_proxy *px)
{
    if (!px)
        return;
    if (px->lh.threaded) {
        rdzv__loophost_stop(&px->lh);
        proxy_free(px);
    } else if (!px->closing) {
        flush(px);
        begin_close(px);
    }
}
