/*
 * The store: a hash table of names, each holding any of a value, a queue, the WAITs that are
 * blocked on it and legacy watchers; and the execution of parsed requests against it with
 * PyTorch's TCPStore semantics (see rdzv-protocol(7)).
 *
 * Invariants:
 *  - an entry exists while it has a value, queued items, waiters or watchers, and is freed as
 *    soon as it has none of them (a stale one, see below, once settled);
 *  - each pending WAIT is one rdzv__wait holding one node per key that was missing; a node
 *    sits on its entry's waiter list until the key appears (the node "fires") or the sweep
 *    frees it; the WAIT is answered when its last node fires. A connection's WAITs, and its
 *    watches, hang from a peer record of its own; a closing connection or a CANCEL_WAIT only
 *    marks that record dead (O(1)), and the sweep frees what hangs from it;
 *  - a request does work in proportion to its own size (its room() sweeping included), a
 *    close or a clear O(1), a slice of the sweep its budget: nothing holds the loop for more
 *    than a few milliseconds, but LIST_KEYS (capped by max_list_keys) and a clear keeping part
 *    of a pool (one pass of comparisons over every name);
 *  - `bytes` counts every entry's key plus values and queued items; `memory` counts the same
 *    plus an estimate of what each allocation costs beyond its bytes (allocator chunk
 *    rounding, the entry struct and its share of the hash table, WAIT and watch records), and
 *    never exceeds max_total_bytes after a request that was accepted. Without that estimate
 *    3M empty keys would pass a 16 MiB cap while taking 450 MiB;
 *  - what belongs to a private key (rdzv__key_private(): its entry, value, queue and watches,
 *    and every WAIT naming one) is counted in `private_memory` instead, under its own cap
 *    max_private_bytes: no request on open keys can take the control plane's room;
 *  - `buffered` is the sum of out_held + in_held over all connections, and every connection
 *    holding any is on the `holders` list (see store.h for the caps on them);
 *  - names fall in three pools by their root (open, RDZV_PRIVATE_AGENT_ROOT,
 *    RDZV_PRIVATE_COLL_ROOT), each with its own generation and counts. A clear that takes or
 *    keeps whole pools (an empty prefix, or a root: ddprun's "/ddprun/") costs O(1): it starts
 *    a new generation in each pool it clears. A name of an older generation than its pool's is
 *    "stale": its value and queue count as gone (the key counts leave them out at once) and are
 *    dropped when the name is next found (settle()) or by the sweep (rdzv__store_sweep()), a
 *    bounded slice at a time. Until then they stay counted in `bytes` and `memory`, so that the
 *    caps go on bounding what the process holds; a request that needs their room sweeps first
 *    (room()). `nstale` counts the stale names; find() never returns one.
 *
 * No I/O here: replies are appended to the connections' output buffers (rdzv__buf, buf.c).
 */
#include "store.h"

#include "auth.h"
#include "mux.h"
#include "rdzv.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

typedef struct rdzv__wnode {
    rdzv__entry *e; /* NULL once fired */
    queue enode;    /* in e->waiters */
    rdzv__wait *w;
} rdzv__wnode;

struct rdzv__wait {
    rdzv__peer *peer;
    queue pnode;             /* in the peer's waits */
    int64_t threshold;       /* BARRIER: released once the key's counter reaches this; 0: a WAIT */
    bool priv;               /* charged to the private pool: it names a private key */
    size_t remaining;        /* nodes not fired yet */
    size_t n;
    size_t swept; /* dead: nodes[0..swept) the sweep has let go of */
    rdzv__wnode nodes[];
};

struct rdzv__watch {
    rdzv__peer *peer;
    rdzv__entry *e;
    queue enode;                /* in the entry's watchers */
    rdzv__watch *cnext;         /* in the peer's list */
};

/*
 * What a connection's WAITs (or, in a second one, its watches) name it by, so that a closing
 * connection, or a CANCEL_WAIT, lets go of all of them in O(1): the peer loses its connection
 * ("dies") and goes on the store's dead list, and the sweep frees its records a bounded slice
 * at a time (releasing a connection with 5M waiter nodes at once would hold the server 0.65 s).
 * Until then a dead WAIT is answered to nobody and takes no queue item, a dead watch is told
 * nothing, and both stay counted in memory.
 */
struct rdzv__peer {
    rdzv__conn *conn; /* NULL: dead */
    queue waits;      /* its rdzv__wait records */
    rdzv__watch *watches; /* its watches, through cnext */
    size_t count;         /* its waiter nodes not fired yet, or its watches */
    queue dead_node;      /* on the store's dead list */
};

typedef struct rdzv__qitem {
    struct rdzv__qitem *next;
    size_t n;
    uint8_t data[];
} rdzv__qitem;

struct rdzv__entry {
    rdzv__entry *hnext;
    uint64_t hash;
    uint8_t *val;
    size_t vlen;
    bool present;
    bool priv;    /* under a private root (rdzv__key_private()): charged to the private pool */
    uint8_t pool; /* RDZV__POOL_*, by the name's root */
    uint32_t gen; /* its pool's generation when last current; an older one: stale (it would
                     take 2^32 clears before the sweep reaches it to wrap) */
    queue waiters; /* rdzv__wnode, in arrival order */
    rdzv__qitem *qhead, *qtail;
    size_t qlen;
    queue watchers; /* rdzv__watch */
    size_t klen;
    uint8_t key[];
};

/* ---------------------------------------------------------------------------------------- */
/* Memory estimates                                                                         */
/* ---------------------------------------------------------------------------------------- */

/* What malloc(n) takes with glibc's allocator: n plus an 8-byte header, in 16-byte steps, at
 * least 32. An estimate for other allocators, close enough for a cap. */
static size_t chunk(size_t n)
{
    size_t c = (n + 8 + 15) & ~(size_t)15;
    return c < 32 ? 32 : c;
}

/* The root of each pool's names (store.h), and the pool of a name. */
static const char *const pool_roots[RDZV__POOLS] = {"", RDZV_PRIVATE_AGENT_ROOT,
                                                     RDZV_PRIVATE_COLL_ROOT};

static int pool_of(const uint8_t *key, size_t klen)
{
    for (int p = RDZV__POOLS - 1; p > RDZV__POOL_OPEN; p--) {
        size_t rl = strlen(pool_roots[p]);
        if (klen >= rl && memcmp(key, pool_roots[p], rl) == 0)
            return p;
    }
    return RDZV__POOL_OPEN;
}

/* An entry: its struct and key in one allocation, plus up to three hash-table slots (the table
 * doubles when it is full, and the old table lives on while names move to the new one). */
static size_t entry_cost(size_t klen)
{
    return chunk(sizeof(rdzv__entry) + klen) + 3 * sizeof(rdzv__entry *);
}

static size_t value_cost(size_t n)
{
    return chunk(n ? n : 1);
}

static size_t qitem_cost(size_t n)
{
    return chunk(sizeof(rdzv__qitem) + n);
}

static size_t wait_cost(size_t nodes)
{
    return chunk(sizeof(rdzv__wait) + nodes * sizeof(rdzv__wnode));
}

static size_t watch_cost(void)
{
    return chunk(sizeof(rdzv__watch));
}

/* True if `more` bytes more of memory fit under the cap of the private pool (`priv`) or the
 * open one. */
static bool fits(const rdzv__store *s, bool priv, size_t more)
{
    size_t used = priv ? s->private_memory : s->memory;
    size_t cap = priv ? s->max_private_bytes : s->max_total_bytes;
    return more <= cap && used <= cap - more;
}

/* Charges n bytes of memory to a pool; mem_credit() gives them back. */
/* Like fits(), after sweeping (the records of closed connections, cleared names) for as long
 * as that is what keeps `more` out: the work is in proportion to the room asked for, plus one
 * walk of empty buckets at most. `pin`, a name the caller holds, is not freed meanwhile. */
static bool room(rdzv__store *s, bool priv, size_t more, rdzv__entry *pin)
{
    s->pinned = pin;
    while (!fits(s, priv, more) && rdzv__store_sweep(s, RDZV__SWEEP_SLICE))
        ;
    s->pinned = NULL;
    return fits(s, priv, more);
}

static void mem_charge(rdzv__store *s, bool priv, size_t n)
{
    *(priv ? &s->private_memory : &s->memory) += n;
}

static void mem_credit(rdzv__store *s, bool priv, size_t n)
{
    *(priv ? &s->private_memory : &s->memory) -= n;
}

/* ---------------------------------------------------------------------------------------- */
/* Replies                                                                                  */
/* ---------------------------------------------------------------------------------------- */

static void mark_dirty(rdzv__store *s, rdzv__conn *c)
{
    if (c->dirty)
        return;
    c->dirty = true;
    queue_insert_head(&s->dirty, &c->dirty_node);
}

rdzv__conn *rdzv__store_pop_dirty(rdzv__store *s)
{
    if (queue_empty(&s->dirty))
        return NULL;
    rdzv__conn *c = queue_data(queue_head(&s->dirty), rdzv__conn, dirty_node);
    queue_remove(&c->dirty_node);
    c->dirty = false;
    return c;
}

/* Records that `c` must be closed (the first reason wins) and puts it on the dirty list. */
static int fail_conn(rdzv__store *s, rdzv__conn *c, int err, const char *why)
{
    if (!c->error) {
        c->error = err;
        c->why = why;
    }
    mark_dirty(s, c);
    return c->error;
}

static void held_link(rdzv__store *s, rdzv__conn *c)
{
    if (c->holding)
        return;
    c->holding = true;
    queue_insert_head(&s->holders, &c->held_node);
}

static void held_unlink(rdzv__conn *c)
{
    if (!c->holding)
        return;
    queue_remove(&c->held_node);
    c->holding = false;
}

/* Writes off everything `c` holds (it is failing or closing) and frees its unsent replies. */
static void drop_held(rdzv__store *s, rdzv__conn *c)
{
    s->buffered -= c->out_held + c->in_held;
    c->out_held = c->in_held = 0;
    held_unlink(c);
    rdzv__buf_free(&c->out);
}

static const char why_conn_output[] = "its unsent replies would exceed max_conn_output";
static const char why_buffered[] =
    "the server's buffers for all clients are full (max_buffered_bytes) and this connection "
    "holds the most";

/*
 * Makes room for `n` more bytes held for `c` (`in` says whether they are input or output):
 * returns 0, or fails `c` and returns -ENOBUFS. Over max_buffered, the connection holding the
 * most goes first, which is `c` when it would hold the most itself; so a client that floods
 * the server loses its own connections before a well-behaved one loses anything.
 */
static int make_room(rdzv__store *s, rdzv__conn *c, size_t n, bool in)
{
    if (c->error)
        return c->error;
    if (!in && (n > s->max_conn_output || c->out_held > s->max_conn_output - n))
        return fail_conn(s, c, -ENOBUFS, why_conn_output);
    while (n > s->max_buffered || s->buffered > s->max_buffered - n) {
        size_t mine = c->out_held + c->in_held + n;
        rdzv__conn *worst = NULL;
        queue *q;
        queue_foreach(q, &s->holders) {
            rdzv__conn *h = queue_data(q, rdzv__conn, held_node);
            if (h != c && (!worst || h->out_held + h->in_held > worst->out_held + worst->in_held))
                worst = h;
        }
        if (!worst || worst->out_held + worst->in_held <= mine) {
            fail_conn(s, c, -ENOBUFS, why_buffered);
            drop_held(s, c);
            return -ENOBUFS;
        }
        fail_conn(s, worst, -ENOBUFS, why_buffered);
        drop_held(s, worst);
    }
    return 0;
}

/* Charges n reply bytes to `c`; on failure `c` is failed (it will be closed). */
static int charge(rdzv__store *s, rdzv__conn *c, size_t n)
{
    int rc = make_room(s, c, n, false);
    if (rc < 0)
        return rc;
    c->out_held += n;
    s->buffered += n;
    if (n)
        held_link(s, c);
    return 0;
}

void rdzv__conn_sent(rdzv__store *s, rdzv__conn *c, size_t n)
{
    if (n > c->out_held) /* written off already: the connection is failing */
        n = c->out_held;
    c->out_held -= n;
    s->buffered -= n;
    if (c->out_held == 0 && c->in_held == 0)
        held_unlink(c);
}

int rdzv__conn_hold_input(rdzv__store *s, rdzv__conn *c, size_t n)
{
    if (n > c->in_held) {
        int rc = make_room(s, c, n - c->in_held, true);
        if (rc < 0)
            return rc;
        s->buffered += n - c->in_held;
        held_link(s, c);
    } else {
        s->buffered -= c->in_held - n;
    }
    c->in_held = n;
    if (c->out_held == 0 && c->in_held == 0)
        held_unlink(c);
    return 0;
}

/*
 * A reply of the virtual connection `v` (store.h): `hn` bytes at `h` then `n` at `p`, framed
 * for its multiplexed connection as RDZV_MUX_REPLY frames (mux.h) and appended to that one's
 * output at once, so that the replies of all its virtual connections leave in the order the
 * store made them. Over max_conn_output it is `v` that fails (as a connection of its own
 * would), not the multiplexed connection; over max_buffered the rule of make_room() holds.
 */
static int vreply(rdzv__store *s, rdzv__conn *v, const void *h, size_t hn, const void *p, size_t n)
{
    rdzv__conn *m = v->mux;
    size_t total = hn + n, frames = total / RDZV_MUX_REPLY_MAX + 1;
    mark_dirty(s, m);
    if (v->error)
        return v->error;
    if (total + 8 * frames > s->max_conn_output)
        return fail_conn(s, v, -ENOBUFS, why_conn_output);
    int rc = charge(s, m, total + 8 * frames);
    if (rc < 0)
        return rc;
    if ((rc = rdzv__buf_reserve(&m->out, total + 8 * frames)) < 0)
        return fail_conn(s, m, rc, NULL);
    const uint8_t *src[2] = {h, p};
    size_t left[2] = {hn, n};
    for (size_t f = 0; f < frames; f++) {
        uint32_t len = (uint32_t)(total < RDZV_MUX_REPLY_MAX ? total : RDZV_MUX_REPLY_MAX);
        uint32_t hdr[2] = {v->vid, len};
        memcpy(m->out.data + m->out.len, hdr, 8);
        m->out.len += 8;
        total -= len;
        for (int i = 0; i < 2 && len > 0; i++) {
            size_t take = left[i] < len ? left[i] : len;
            if (take)
                memcpy(m->out.data + m->out.len, src[i], take);
            m->out.len += take;
            src[i] += take;
            left[i] -= take;
            len -= (uint32_t)take;
        }
    }
    return 0;
}

/* Appends raw bytes for `c`. A failure is recorded on `c` (it will be closed) and returned. */
static int reply(rdzv__store *s, rdzv__conn *c, const void *p, size_t n)
{
    if (c->mux)
        return vreply(s, c, NULL, 0, p, n);
    mark_dirty(s, c);
    if (c->error)
        return c->error;
    int rc = charge(s, c, n);
    if (rc < 0)
        return rc;
    rc = rdzv__buf_append(&c->out, p, n);
    if (rc < 0)
        return fail_conn(s, c, rc, NULL);
    return 0;
}

static int reply_u8(rdzv__store *s, rdzv__conn *c, uint8_t v)
{
    return reply(s, c, &v, 1);
}

static int reply_i64(rdzv__store *s, rdzv__conn *c, int64_t v)
{
    return reply(s, c, &v, 8);
}

int rdzv__reply_raw(rdzv__store *s, rdzv__conn *c, const void *p, size_t n)
{
    return reply(s, c, p, n);
}

int rdzv__reply_vec(rdzv__store *s, rdzv__conn *c, const void *p, size_t n)
{
    uint64_t len = n;
    if (c->mux)
        return vreply(s, c, &len, 8, p, n);
    mark_dirty(s, c);
    if (c->error)
        return c->error;
    /* Charge and reserve the whole vector first, so that a refusal queues none of it. */
    int rc = charge(s, c, 8 + n);
    if (rc < 0)
        return rc;
    if ((rc = rdzv__buf_reserve(&c->out, 8 + n)) < 0)
        return fail_conn(s, c, rc, NULL);
    memcpy(c->out.data + c->out.len, &len, 8);
    if (n)
        memcpy(c->out.data + c->out.len + 8, p, n);
    c->out.len += 8 + n;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Hash table                                                                               */
/* ---------------------------------------------------------------------------------------- */

/* SipHash-1-3 with a per-store random key, so that clients cannot aim keys at one bucket. */
#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                                   \
    do {                                                                                           \
        v0 += v1;                                                                                  \
        v1 = ROTL(v1, 13);                                                                         \
        v1 ^= v0;                                                                                  \
        v0 = ROTL(v0, 32);                                                                         \
        v2 += v3;                                                                                  \
        v3 = ROTL(v3, 16);                                                                         \
        v3 ^= v2;                                                                                  \
        v0 += v3;                                                                                  \
        v3 = ROTL(v3, 21);                                                                         \
        v3 ^= v0;                                                                                  \
        v2 += v1;                                                                                  \
        v1 = ROTL(v1, 17);                                                                         \
        v1 ^= v2;                                                                                  \
        v2 = ROTL(v2, 32);                                                                         \
    } while (0)

static uint64_t siphash13(const uint64_t k[2], const uint8_t *in, size_t len)
{
    uint64_t v0 = 0x736f6d6570736575ULL ^ k[0], v1 = 0x646f72616e646f6dULL ^ k[1];
    uint64_t v2 = 0x6c7967656e657261ULL ^ k[0], v3 = 0x7465646279746573ULL ^ k[1];
    uint64_t b = (uint64_t)len << 56, m;
    const uint8_t *end = in + (len & ~(size_t)7);

    for (; in != end; in += 8) {
        memcpy(&m, in, 8);
        v3 ^= m;
        SIPROUND;
        v0 ^= m;
    }
    for (size_t i = 0; i < (len & 7); i++)
        b |= (uint64_t)in[i] << (8 * i);
    v3 ^= b;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

/*
 * The chain that holds the names of hash h. While the table grows, names move from the old
 * table to the new one a few buckets per insertion (a whole rehash of millions of names would
 * stall the server for a second): a name whose old bucket has not moved yet is still there,
 * and a new name joins it there, to move with it.
 */
static rdzv__entry **chain(rdzv__store *s, uint64_t h)
{
    if (s->old && (h & (s->nold - 1)) >= s->rehash_pos)
        return &s->old[h & (s->nold - 1)];
    return &s->buckets[h & (s->nbuckets - 1)];
}

/* The i-th chain of both tables, i < nchains(s), for walking every name. */
static size_t nchains(const rdzv__store *s)
{
    return s->nbuckets + (s->old ? s->nold : 0);
}

static rdzv__entry *chain_at(const rdzv__store *s, size_t i)
{
    return i < s->nbuckets ? s->buckets[i] : s->old[i - s->nbuckets];
}

static rdzv__entry *settle(rdzv__store *s, rdzv__entry *e);

static bool current(const rdzv__store *s, const rdzv__entry *e)
{
    return e->gen == s->gens[e->pool];
}

/* The name `key`, current: a stale one is settled first (and is gone if nothing needs it). */
static rdzv__entry *find(rdzv__store *s, const uint8_t *key, size_t klen, uint64_t h)
{
    for (rdzv__entry *e = *chain(s, h); e; e = e->hnext)
        if (e->hash == h && e->klen == klen && memcmp(e->key, key, klen) == 0)
            return current(s, e) ? e : settle(s, e);
    return NULL;
}

static rdzv__entry *lookup(rdzv__store *s, const uint8_t *key, size_t klen)
{
    return find(s, key, klen, siphash13(s->seed, key, klen));
}

#define REHASH_STEP 8 /* old buckets moved per insertion: done long before the next growth */

/* Moves up to `n` buckets of the old table into the new one; frees it once it is empty. */
static void rehash_step(rdzv__store *s, size_t n)
{
    for (; s->old && n > 0; n--) {
        rdzv__entry *e = s->old[s->rehash_pos], *next;
        s->old[s->rehash_pos] = NULL;
        for (; e; e = next) {
            next = e->hnext;
            e->hnext = s->buckets[e->hash & (s->nbuckets - 1)];
            s->buckets[e->hash & (s->nbuckets - 1)] = e;
        }
        s->sweep_found = true; /* names moved: a sweep's pass may have missed some */
        if (++s->rehash_pos == s->nold) {
            free(s->old);
            s->old = NULL;
            s->nold = s->rehash_pos = 0;
        }
    }
}

/* Starts moving to a table twice as large, unless a move is still under way. */
static void grow(rdzv__store *s)
{
    if (s->old)
        return;
    size_t n = s->nbuckets * 2;
    rdzv__entry **b = calloc(n, sizeof(*b));
    if (!b)
        return; /* longer chains, still correct */
    s->old = s->buckets;
    s->nold = s->nbuckets;
    s->rehash_pos = 0;
    s->buckets = b;
    s->nbuckets = n;
}

/* Finds or creates the entry for a key. Returns NULL with *err set (-ENOSPC, -ENOMEM). */
static rdzv__entry *get_or_create(rdzv__store *s, const uint8_t *key, size_t klen, int *err)
{
    uint64_t h = siphash13(s->seed, key, klen);
    rdzv__entry *e = find(s, key, klen, h);
    if (e)
        return e;
    bool priv = rdzv__key_private(key, klen);
    if (!room(s, priv, entry_cost(klen), NULL)) {
        *err = -ENOSPC;
        return NULL;
    }
    e = calloc(1, sizeof(*e) + klen);
    if (!e) {
        *err = -ENOMEM;
        return NULL;
    }
    e->hash = h;
    e->priv = priv;
    queue_init(&e->waiters);
    queue_init(&e->watchers);
    e->pool = pool_of(key, klen);
    e->gen = s->gens[e->pool];
    e->klen = klen;
    memcpy(e->key, key, klen);
    s->pools[e->pool].entries++;
    rdzv__entry **head = chain(s, h);
    e->hnext = *head;
    *head = e;
    s->nentries++;
    s->bytes += klen;
    mem_charge(s, priv, entry_cost(klen));
    rehash_step(s, REHASH_STEP);
    if (s->nentries > s->nbuckets)
        grow(s);
    return e;
}

/* Frees `e` if nothing refers to it any more; returns true if it did. */
static bool maybe_free(rdzv__store *s, rdzv__entry *e)
{
    if (e->present || e->qlen || !queue_empty(&e->waiters) || !queue_empty(&e->watchers) ||
        e == s->pinned)
        return false;
    rdzv__entry **pp = chain(s, e->hash);
    while (*pp != e)
        pp = &(*pp)->hnext;
    *pp = e->hnext;
    if (!current(s, e)) { /* a stale name with waiters only, whose last waiter left */
        s->pools[e->pool].stale--;
        s->nstale--;
    }
    s->pools[e->pool].entries--;
    s->nentries--;
    s->bytes -= e->klen;
    mem_credit(s, e->priv, entry_cost(e->klen));
    free(e);
    return true;
}

/* Frees e's queued items, keeping the accounting right (not `filled`: the caller's part). */
static void free_queue(rdzv__store *s, rdzv__entry *e)
{
    for (rdzv__qitem *q = e->qhead, *qn; q; q = qn) {
        qn = q->next;
        s->bytes -= q->n;
        mem_credit(s, e->priv, qitem_cost(q->n));
        free(q);
    }
    e->qhead = e->qtail = NULL;
    e->qlen = 0;
}

/*
 * Makes a stale name current: drops the value and queue a clear took from it (the key counts
 * left them out already), and frees it unless a WAIT or a watch still names it.
 * Waiters and watchers are kept and told nothing, as the clear itself did. Returns e, or NULL
 * once freed.
 */
static rdzv__entry *settle(rdzv__store *s, rdzv__entry *e)
{
    if (e->present) {
        s->bytes -= e->vlen;
        mem_credit(s, e->priv, value_cost(e->vlen));
        free(e->val);
        e->val = NULL;
        e->vlen = 0;
        e->present = false;
    }
    free_queue(s, e);
    e->gen = s->gens[e->pool];
    s->pools[e->pool].stale--;
    s->nstale--;
    return maybe_free(s, e) ? NULL : e;
}

static bool satisfied(const rdzv__entry *e)
{
    return e && (e->present || e->qlen > 0);
}

/* ---------------------------------------------------------------------------------------- */
/* Waits and watches                                                                        */
/* ---------------------------------------------------------------------------------------- */

static void unlink_node(rdzv__wnode *n)
{
    queue_remove(&n->enode);
    n->e = NULL;
}

/* The peer in *slot, made for `c` if there is none yet; NULL for want of memory. */
static rdzv__peer *peer_of(rdzv__peer **slot, rdzv__conn *c)
{
    if (!*slot && (*slot = calloc(1, sizeof(**slot)))) {
        (*slot)->conn = c;
        queue_init(&(*slot)->waits);
    }
    return *slot;
}

/* Frees a dead peer once it holds nothing. */
static void peer_done(rdzv__peer *p)
{
    if (p->conn || !queue_empty(&p->waits) || p->watches)
        return;
    queue_remove(&p->dead_node);
    free(p);
}

/* Lets go of the peer in *slot: its `count` leaves *live (nwaiters or nwatches) at once, and it
 * is freed now if it holds nothing, else put on the dead list for the sweep. */
static void peer_kill(rdzv__store *s, rdzv__peer **slot, size_t *live)
{
    rdzv__peer *p = *slot;
    *slot = NULL;
    if (!p)
        return;
    p->conn = NULL;
    *live -= p->count;
    if (queue_empty(&p->waits) && !p->watches) {
        free(p);
        return;
    }
    queue_insert_head(&s->dead, &p->dead_node);
}

/* One of w's nodes left its entry. */
static void node_gone(rdzv__store *s, rdzv__wait *w)
{
    w->peer->count--;
    if (w->peer->conn)
        s->nwaiters--;
}

/* Takes w off its peer's list, credits and frees it (and its peer if dead and now empty). */
static void free_wait(rdzv__store *s, rdzv__wait *w)
{
    rdzv__peer *p = w->peer;
    queue_remove(&w->pnode);
    mem_credit(s, w->priv, wait_cost(w->n));
    free(w);
    peer_done(p);
}

/* Fires one waiter node whose key has appeared; answers its WAIT when it was the last. */
static void fire(rdzv__store *s, rdzv__wnode *n)
{
    rdzv__wait *w = n->w;
    unlink_node(n);
    node_gone(s, w);
    if (--w->remaining == 0) {
        if (w->peer->conn)
            reply_u8(s, w->peer->conn, RDZV_WAIT_STOP_WAITING);
        free_wait(s, w);
    }
}

static int parse_i64(const uint8_t *p, size_t n, int64_t *out);

/* True if a parked BARRIER on `e` may go: the key's counter has reached its threshold. */
static bool barrier_reached(const rdzv__entry *e, const rdzv__wait *w)
{
    int64_t cur;
    return e->present && parse_i64(e->val, e->vlen, &cur) == 0 && cur >= w->threshold;
}

/* Called whenever e's value changes: fires its WAITs, and the BARRIERs whose count is met. */
static void wake_all(rdzv__store *s, rdzv__entry *e)
{
    queue *q, *next; /* a fired node's WAIT may be freed, but never `next`'s */
    queue_foreach_safe(q, next, &e->waiters) {
        rdzv__wnode *n = queue_data(q, rdzv__wnode, enode);
        if (n->w->threshold == 0 || barrier_reached(e, n->w))
            fire(s, n);
    }
}

/*
 * A queue push releases one WAIT on that name: the longest-waiting one that needs nothing else,
 * or else the longest-waiting one (which then waits for its other keys). Dead WAITs take none.
 */
static void wake_one(rdzv__store *s, rdzv__entry *e)
{
    rdzv__wnode *first = NULL;
    queue *q;
    queue_foreach(q, &e->waiters) {
        rdzv__wnode *n = queue_data(q, rdzv__wnode, enode);
        if (n->w->threshold || !n->w->peer->conn)
            continue; /* a BARRIER counts, it does not consume queue items */
        if (n->w->remaining == 1) {
            fire(s, n);
            return;
        }
        if (!first)
            first = n;
    }
    if (first)
        fire(s, first);
}

/* CANCEL_WAIT, and a closing connection: its WAITs die (peer_kill()). */
static void cancel_waits(rdzv__store *s, rdzv__conn *c)
{
    peer_kill(s, &c->waits, &s->nwaiters);
}

/* Takes a watch off its entry and its peer's list head (it must be the head), frees it. */
static void drop_watch(rdzv__store *s, rdzv__watch *w)
{
    rdzv__entry *e = w->e;
    rdzv__peer *p = w->peer;
    queue_remove(&w->enode);
    p->watches = w->cnext;
    p->count--;
    if (p->conn)
        s->nwatches--;
    mem_credit(s, e->priv, watch_cost());
    free(w);
    maybe_free(s, e);
    peer_done(p);
}

/*
 * Frees dead peers' records (waiter nodes one at a time, so that a WAIT on 128K keys is freed
 * over several slices) with up to `budget` units; returns what is left of it.
 */
static size_t sweep_dead(rdzv__store *s, size_t budget)
{
    while (!queue_empty(&s->dead) && budget > 0) {
        rdzv__peer *p = queue_data(queue_head(&s->dead), rdzv__peer, dead_node);
        if (queue_empty(&p->waits)) {
            drop_watch(s, p->watches);
            budget = budget > RDZV__SWEEP_NAME ? budget - RDZV__SWEEP_NAME : 0;
            continue;
        }
        rdzv__wait *w = queue_data(queue_head(&p->waits), rdzv__wait, pnode);
        for (; w->swept < w->n && budget > 0; w->swept++) {
            rdzv__wnode *n = &w->nodes[w->swept];
            rdzv__entry *e = n->e;
            budget--;
            if (!e)
                continue; /* fired */
            unlink_node(n);
            node_gone(s, w);
            maybe_free(s, e);
            budget = budget > RDZV__SWEEP_NAME ? budget - RDZV__SWEEP_NAME : 0;
        }
        if (w->swept == w->n)
            free_wait(s, w);
    }
    return budget;
}

/* Sends a legacy watch notification about `e` to every connection watching it. */
static void notify(rdzv__store *s, rdzv__entry *e, uint8_t type, const uint8_t *old, size_t oldlen,
                   const uint8_t *new, size_t newlen)
{
    queue *q;
    queue_foreach(q, &e->watchers) {
        rdzv__conn *c = queue_data(q, rdzv__watch, enode)->peer->conn;
        if (!c)
            continue; /* dead */
        reply_u8(s, c, type);
        rdzv__reply_vec(s, c, e->key, e->klen);
        rdzv__reply_vec(s, c, old, oldlen);
        rdzv__reply_vec(s, c, new, newlen);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Values                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/*
 * Makes `buf` (malloc'd, n bytes; ownership passes to the store, also on failure) e's value,
 * accounting for the size cap, notifying legacy watchers, and waking every WAIT on the key.
 * Returns 0, -ENOSPC or -ENOMEM.
 */
static int store_owned(rdzv__store *s, rdzv__entry *e, uint8_t *buf, size_t n)
{
    size_t old = e->present ? e->vlen : 0;
    size_t old_cost = e->present ? value_cost(old) : 0;
    if (value_cost(n) > old_cost && !room(s, e->priv, value_cost(n) - old_cost, e)) {
        free(buf);
        return -ENOSPC;
    }
    if (!queue_empty(&e->watchers))
        notify(s, e, e->present ? RDZV_WATCH_KEY_UPDATED : RDZV_WATCH_KEY_CREATED,
               e->present ? e->val : NULL, old, buf, n);
    free(e->val);
    if (!e->present) {
        s->nkeys++;
        s->pools[e->pool].keys++;
        s->pools[e->pool].filled += e->qlen == 0;
    }
    s->bytes = s->bytes - old + n;
    mem_credit(s, e->priv, old_cost);
    mem_charge(s, e->priv, value_cost(n));
    e->val = buf;
    e->vlen = n;
    e->present = true;
    wake_all(s, e);
    return 0;
}

/* Like store_owned() with a copy of val[0..n). */
static int store_value(rdzv__store *s, rdzv__entry *e, const uint8_t *val, size_t n)
{
    uint8_t *copy = malloc(n ? n : 1);
    if (!copy)
        return -ENOMEM;
    if (n)
        memcpy(copy, val, n);
    return store_owned(s, e, copy, n);
}

static int set_key(rdzv__store *s, const uint8_t *key, size_t klen, const uint8_t *val, size_t n)
{
    int err = 0;
    rdzv__entry *e = get_or_create(s, key, klen, &err);
    if (!e)
        return err;
    err = store_value(s, e, val, n);
    maybe_free(s, e);
    return err;
}

/*
 * Parses a stored value as PyTorch's server does (std::stoll): optional leading white space,
 * an optional sign, then at least one digit; parsing stops at the first non-digit. Returns 0
 * or -EINVAL (no digits, or out of range).
 */
static int parse_i64(const uint8_t *p, size_t n, int64_t *out)
{
    size_t i = 0;
    bool neg = false;
    uint64_t v = 0, limit;

    while (i < n && (p[i] == ' ' || (p[i] >= '\t' && p[i] <= '\r')))
        i++;
    if (i < n && (p[i] == '+' || p[i] == '-'))
        neg = p[i++] == '-';
    limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    size_t start = i;
    for (; i < n && p[i] >= '0' && p[i] <= '9'; i++) {
        unsigned d = p[i] - '0';
        if (v > (limit - d) / 10)
            return -EINVAL;
        v = v * 10 + d;
    }
    if (i == start)
        return -EINVAL;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 0;
}

/*
 * Adds `delta` to the decimal counter stored under a key (a missing key counts as 0), stores the
 * result as ASCII decimal (waking waiters) and returns it in *result and the entry in *ep.
 * Returns 0, -EINVAL (the value is not a decimal integer), -ENOSPC or -ENOMEM.
 */
static int bump_counter(rdzv__store *s, const uint8_t *key, size_t klen, int64_t delta,
                        int64_t *result, rdzv__entry **ep)
{
    int err = 0;
    int64_t cur = 0;
    rdzv__entry *e = get_or_create(s, key, klen, &err);
    if (!e)
        return err;
    if (!e->present || (err = parse_i64(e->val, e->vlen, &cur)) == 0) {
        /* Two's-complement wrap-around instead of undefined overflow. */
        int64_t v = (int64_t)((uint64_t)cur + (uint64_t)delta);
        char text[24];
        int n = snprintf(text, sizeof(text), "%" PRId64, v);
        if ((err = store_value(s, e, (const uint8_t *)text, (size_t)n)) == 0) {
            *result = v;
            *ep = e;
            return 0;
        }
    }
    maybe_free(s, e);
    return err;
}

static int do_add(rdzv__store *s, rdzv__conn *c, const rdzv__request *r)
{
    int64_t v;
    rdzv__entry *e;
    int err = bump_counter(s, r->key, r->key_len, r->i64, &v, &e);
    return err < 0 ? err : reply_i64(s, c, v);
}

static int do_compare_set(rdzv__store *s, rdzv__conn *c, const rdzv__request *r)
{
    int err = 0;
    rdzv__entry *e = lookup(s, r->key, r->key_len);

    if (!e || !e->present) {
        if (r->val_len == 0) {
            err = set_key(s, r->key, r->key_len, r->val2, r->val2_len);
            if (err < 0)
                return err;
            return rdzv__reply_vec(s, c, r->val2, r->val2_len);
        }
        /* PyTorch answers with the expected value when the key is missing. (Its server also
         * wakes the key's waiters here although the key is still missing; we do not.) */
        return rdzv__reply_vec(s, c, r->val, r->val_len);
    }
    if (e->vlen == r->val_len && memcmp(e->val, r->val, r->val_len) == 0) {
        if ((err = store_value(s, e, r->val2, r->val2_len)) < 0)
            return err;
    }
    return rdzv__reply_vec(s, c, e->val, e->vlen);
}

static int do_append(rdzv__store *s, const rdzv__request *r)
{
    int err = 0;
    rdzv__entry *e = get_or_create(s, r->key, r->key_len, &err);
    if (!e)
        return err;
    size_t old = e->present ? e->vlen : 0;
    uint8_t *v = malloc(old + r->val_len + 1);
    if (!v) {
        err = -ENOMEM;
    } else {
        if (old)
            memcpy(v, e->val, old);
        if (r->val_len)
            memcpy(v + old, r->val, r->val_len);
        err = store_owned(s, e, v, old + r->val_len);
    }
    maybe_free(s, e);
    return err;
}

/* Removes a current e's value (not its queue, waiters or watchers), keeping the accounting
 * right. */
static void drop_value(rdzv__store *s, rdzv__entry *e)
{
    s->bytes -= e->vlen;
    mem_credit(s, e->priv, value_cost(e->vlen));
    s->nkeys--;
    s->pools[e->pool].keys--;
    s->pools[e->pool].filled -= e->qlen == 0;
    free(e->val);
    e->val = NULL;
    e->vlen = 0;
    e->present = false;
}

static int do_delete(rdzv__store *s, rdzv__conn *c, const rdzv__request *r)
{
    rdzv__entry *e = lookup(s, r->key, r->key_len);
    if (!e || !e->present)
        return reply_i64(s, c, 0);
    if (!queue_empty(&e->watchers))
        notify(s, e, RDZV_WATCH_KEY_DELETED, e->val, e->vlen, NULL, 0);
    drop_value(s, e);
    maybe_free(s, e);
    return reply_i64(s, c, 1);
}

/* CHECK: every key has a value or queued items. */
static bool check_all(rdzv__store *s, const rdzv__request *r)
{
    const uint8_t *cur = r->items;
    for (uint64_t i = 0; i < r->count; i++) {
        const uint8_t *k;
        size_t kl;
        rdzv__next_str(&cur, &k, &kl);
        if (!satisfied(lookup(s, k, kl)))
            return false;
    }
    return true;
}

/* Links a new node for `w` at the tail of e's waiter list. */
static void add_node(rdzv__store *s, rdzv__wait *w, rdzv__entry *e)
{
    rdzv__wnode *n = &w->nodes[w->n++];
    n->e = e;
    n->w = w;
    queue_insert_tail(&e->waiters, &n->enode);
    w->peer->count++;
    s->nwaiters++;
}

static void add_wait(rdzv__wait *w)
{
    queue_insert_head(&w->peer->waits, &w->pnode);
}

/*
 * BARRIER (PyTorch >= 2.15): adds one to the decimal counter under the key, like ADD; answers
 * STOP_WAITING at once if the counter has reached the world size, and otherwise parks the
 * request like a WAIT until a change to the key (another BARRIER, an ADD, a SET) brings the
 * counter there. CANCEL_WAIT cancels a parked BARRIER as it does a WAIT.
 */
static int do_barrier(rdzv__store *s, rdzv__conn *c, const rdzv__request *r)
{
    int64_t count;
    rdzv__entry *e;
    int err = bump_counter(s, r->key, r->key_len, 1, &count, &e);
    if (err < 0)
        return err;
    if (count >= r->i64)
        return reply_u8(s, c, RDZV_WAIT_STOP_WAITING);
    if (!room(s, e->priv, wait_cost(1), e))
        return -ENOSPC;
    rdzv__peer *p = peer_of(&c->waits, c);
    rdzv__wait *w = p ? calloc(1, sizeof(*w) + sizeof(rdzv__wnode)) : NULL;
    if (!w)
        return -ENOMEM;
    mem_charge(s, e->priv, wait_cost(1));
    w->priv = e->priv;
    w->peer = p;
    w->threshold = r->i64;
    w->remaining = 1;
    add_node(s, w, e);
    add_wait(w);
    return 0;
}

static int do_wait(rdzv__store *s, rdzv__conn *c, const rdzv__request *r)
{
    const uint8_t *cur = r->items, *k;
    size_t kl, missing = 0;
    bool priv = false; /* a WAIT naming a private key is the control plane's */

    for (uint64_t i = 0; i < r->count; i++) {
        rdzv__next_str(&cur, &k, &kl);
        if (!satisfied(lookup(s, k, kl)))
            missing++;
        priv = priv || rdzv__key_private(k, kl);
    }
    if (missing == 0)
        return reply_u8(s, c, RDZV_WAIT_STOP_WAITING);

    /* The record is charged before the names it creates, so that both fit under the cap. */
    if (!room(s, priv, wait_cost(missing), NULL))
        return -ENOSPC;
    rdzv__peer *p = peer_of(&c->waits, c);
    rdzv__wait *w = p ? calloc(1, sizeof(*w) + missing * sizeof(rdzv__wnode)) : NULL;
    if (!w)
        return -ENOMEM;
    mem_charge(s, priv, wait_cost(missing));
    w->priv = priv;
    w->peer = p;
    w->remaining = missing;
    w->n = 0;
    cur = r->items;
    for (uint64_t i = 0; i < r->count; i++) {
        int err = 0;
        rdzv__next_str(&cur, &k, &kl);
        rdzv__entry *e = get_or_create(s, k, kl, &err);
        if (!e) {
            /* Undo the nodes linked so far. */
            for (size_t j = 0; j < w->n; j++) {
                rdzv__entry *ej = w->nodes[j].e;
                unlink_node(&w->nodes[j]);
                node_gone(s, w);
                maybe_free(s, ej);
            }
            mem_credit(s, priv, wait_cost(missing));
            free(w);
            return err;
        }
        if (!satisfied(e))
            add_node(s, w, e);
    }
    add_wait(w);
    return 0;
}

static int do_watch(rdzv__store *s, rdzv__conn *c, const rdzv__request *r)
{
    int err = 0;
    rdzv__entry *e = get_or_create(s, r->key, r->key_len, &err);
    if (!e)
        return err;
    rdzv__peer *p = peer_of(&c->watches, c);
    rdzv__watch *w = p && room(s, e->priv, watch_cost(), e) ? calloc(1, sizeof(*w)) : NULL;
    if (!w) {
        maybe_free(s, e);
        return !p || fits(s, e->priv, watch_cost()) ? -ENOMEM : -ENOSPC;
    }
    mem_charge(s, e->priv, watch_cost());
    w->peer = p;
    w->e = e;
    queue_insert_head(&e->watchers, &w->enode);
    w->cnext = p->watches;
    p->watches = w;
    p->count++;
    s->nwatches++;
    return reply_u8(s, c, RDZV_WATCH_CALLBACK_REGISTERED);
}

static int do_queue_push(rdzv__store *s, const rdzv__request *r)
{
    int err = 0;
    rdzv__entry *e = get_or_create(s, r->key, r->key_len, &err);
    if (!e)
        return err;
    rdzv__qitem *q = NULL;
    if (!room(s, e->priv, qitem_cost(r->val_len), e))
        err = -ENOSPC;
    else if (!(q = malloc(sizeof(*q) + r->val_len)))
        err = -ENOMEM;
    if (err < 0) {
        maybe_free(s, e);
        return err;
    }
    q->next = NULL;
    q->n = r->val_len;
    if (r->val_len)
        memcpy(q->data, r->val, r->val_len);
    if (e->qtail)
        e->qtail->next = q;
    else
        e->qhead = q;
    e->qtail = q;
    s->pools[e->pool].filled += e->qlen++ == 0 && !e->present;
    s->bytes += q->n;
    mem_charge(s, e->priv, qitem_cost(q->n));
    wake_one(s, e);
    return 0;
}

static int do_queue_pop(rdzv__store *s, rdzv__conn *c, const rdzv__request *r)
{
    rdzv__entry *e = lookup(s, r->key, r->key_len);
    size_t len = e ? e->qlen : 0;
    int rc = reply_i64(s, c, (int64_t)len);
    if (rc < 0 || len == 0)
        return rc;
    rdzv__qitem *q = e->qhead;
    e->qhead = q->next;
    if (!e->qhead)
        e->qtail = NULL;
    s->pools[e->pool].filled -= --e->qlen == 0 && !e->present;
    s->bytes -= q->n;
    mem_credit(s, e->priv, qitem_cost(q->n));
    rc = rdzv__reply_vec(s, c, q->data, q->n);
    free(q);
    maybe_free(s, e);
    return rc;
}

static const char why_list_keys[] =
    "the store holds more keys than max_list_keys (the reply is built at once and would "
    "block the server; GETNUMKEYS still counts them)";
static const char why_list_stale[] =
    "the store is still freeing more than max_list_keys cleared keys (the reply is built "
    "walking them; try again shortly)";

/*
 * LIST_KEYS names every key in one reply that starts with their count, so it is built at once,
 * walking the whole table: over max_list_keys keys that would stall every other client for
 * longer than ~50 ms, and it is refused (the protocol has no error reply: the connection is
 * closed, with a log line).
 */
static int do_list_keys(rdzv__store *s, rdzv__conn *c)
{
    if (s->nkeys > s->max_list_keys)
        return fail_conn(s, c, -E2BIG, why_list_keys);
    if (s->nstale > s->max_list_keys)
        return fail_conn(s, c, -E2BIG, why_list_stale);
    int rc = reply_i64(s, c, (int64_t)s->nkeys);
    for (size_t i = 0; i < nchains(s) && rc == 0; i++)
        for (rdzv__entry *e = chain_at(s, i); e && rc == 0; e = e->hnext)
            if (e->present && current(s, e))
                rc = rdzv__reply_vec(s, c, e->key, e->klen);
    return rc;
}

/*
 * MULTI_GET may name one large value many times: 1000 names of a 1 MiB value make a 1 GiB
 * reply from 12 KB of request. Its reply size is summed before any of it is built, and a reply
 * that could not be queued is refused whole.
 */
static int multi_get_room(rdzv__store *s, rdzv__conn *c, const rdzv__request *r)
{
    const uint8_t *cur = r->items, *k;
    size_t kl, total = 0;
    for (uint64_t i = 0; i < r->count; i++) {
        rdzv__next_str(&cur, &k, &kl);
        rdzv__entry *e = lookup(s, k, kl);
        size_t n = 8 + (e && e->present ? e->vlen : 0);
        total = n > SIZE_MAX - total ? SIZE_MAX : total + n;
    }
    if (c->error)
        return c->error;
    if (total > s->max_conn_output || c->out_held > s->max_conn_output - total)
        return fail_conn(s, c, -ENOBUFS, why_conn_output);
    return 0;
}

int rdzv__store_exec(rdzv__store *s, rdzv__conn *c, const rdzv__request *r)
{
    const uint8_t *cur, *k, *v;
    size_t kl, vl;
    int rc = 0;

    s->ops[r->op]++;
    switch (r->op) {
    case RDZV_OP_VALIDATE:
        return 0;
    case RDZV_OP_SET:
        return set_key(s, r->key, r->key_len, r->val, r->val_len);
    case RDZV_OP_COMPARE_SET:
        return do_compare_set(s, c, r);
    case RDZV_OP_GET: {
        rdzv__entry *e = lookup(s, r->key, r->key_len);
        bool have = e && e->present;
        return rdzv__reply_vec(s, c, have ? e->val : NULL, have ? e->vlen : 0);
    }
    case RDZV_OP_ADD:
        return do_add(s, c, r);
    case RDZV_OP_CHECK:
        return reply_u8(s, c, check_all(s, r) ? RDZV_CHECK_READY : RDZV_CHECK_NOT_READY);
    case RDZV_OP_WAIT:
        return do_wait(s, c, r);
    case RDZV_OP_GETNUMKEYS:
        return reply_i64(s, c, (int64_t)s->nkeys);
    case RDZV_OP_DELETE_KEY:
        return do_delete(s, c, r);
    case RDZV_OP_APPEND:
        return do_append(s, r);
    case RDZV_OP_MULTI_GET:
        if ((rc = multi_get_room(s, c, r)) < 0)
            return rc;
        cur = r->items;
        for (uint64_t i = 0; i < r->count && rc == 0; i++) {
            rdzv__next_str(&cur, &k, &kl);
            rdzv__entry *e = lookup(s, k, kl);
            bool have = e && e->present;
            rc = rdzv__reply_vec(s, c, have ? e->val : NULL, have ? e->vlen : 0);
        }
        return rc;
    case RDZV_OP_MULTI_SET:
        cur = r->items;
        for (uint64_t i = 0; i < r->count && rc == 0; i++) {
            rdzv__next_str(&cur, &k, &kl);
            rdzv__next_str(&cur, &v, &vl);
            rc = set_key(s, k, kl, v, vl);
        }
        return rc;
    case RDZV_OP_CANCEL_WAIT:
        cancel_waits(s, c);
        return reply_u8(s, c, RDZV_WAIT_CANCELED);
    case RDZV_OP_PING:
        return reply(s, c, &r->u32, 4);
    case RDZV_OP_QUEUE_PUSH:
        return do_queue_push(s, r);
    case RDZV_OP_QUEUE_POP:
        return do_queue_pop(s, c, r);
    case RDZV_OP_QUEUE_LEN: {
        rdzv__entry *e = lookup(s, r->key, r->key_len);
        return reply_i64(s, c, e ? (int64_t)e->qlen : 0);
    }
    case RDZV_OP_LIST_KEYS:
        return do_list_keys(s, c);
    case RDZV_OP_BARRIER:
        return do_barrier(s, c, r);
    case RDZV_OP_WATCH_KEY:
        return do_watch(s, c, r);
    case RDZV_OP_STATUS:
        return RDZV__EXEC_STATUS;
    case RDZV_OP_AUTH_HELLO:
    case RDZV_OP_AUTH_PROOF:
        return RDZV__EXEC_AUTH;
    case RDZV_OP_MUX: /* the server runs these (mux.h); the store never sees them */
    case RDZV_OP_MUX_CLOSE:
    case RDZV_OP_COUNT:
        break;
    }
    return -EINVAL;
}

/* Whether a clear keeping the names that start with `keep` keeps all of a pool's names, none
 * of them, or some (then they are looked at one by one). */
enum { KEEP_NONE, KEEP_SOME, KEEP_ALL };

static int pool_kept(int pool, const uint8_t *keep, size_t keep_len)
{
    if (keep_len == 0) /* the empty prefix clears every name */
        return KEEP_NONE;
    if (pool == RDZV__POOL_OPEN) /* no open name starts with a private root */
        return pool_of(keep, keep_len) != RDZV__POOL_OPEN ? KEEP_NONE : KEEP_SOME;
    size_t rl = strlen(pool_roots[pool]);
    if (keep_len <= rl)
        return memcmp(keep, pool_roots[pool], keep_len) == 0 ? KEEP_ALL : KEEP_NONE;
    return memcmp(keep, pool_roots[pool], rl) == 0 ? KEEP_SOME : KEEP_NONE;
}

/*
 * A new generation in each pool not kept whole; the names of a pool kept in part that start
 * with `keep` are moved into it one by one, walking every name (O(names): prefixes other than
 * the empty one, a private root, or a prefix of one).
 */
size_t rdzv__store_clear(rdzv__store *s, const uint8_t *keep, size_t keep_len)
{
    size_t cleared = 0;
    int how[RDZV__POOLS];
    uint32_t was[RDZV__POOLS];
    bool walk = false;
    for (int p = 0; p < RDZV__POOLS; p++) {
        struct rdzv__pool *pl = &s->pools[p];
        how[p] = pool_kept(p, keep, keep_len);
        if (how[p] == KEEP_ALL)
            continue;
        walk = walk || how[p] == KEEP_SOME;
        cleared += pl->filled;
        s->nkeys -= pl->keys;
        pl->keys = pl->filled = 0;
        was[p] = s->gens[p]++;
        s->nstale += pl->entries - pl->stale;
        pl->stale = pl->entries;
    }
    for (size_t i = 0; walk && i < nchains(s); i++)
        for (rdzv__entry *e = chain_at(s, i); e; e = e->hnext) {
            struct rdzv__pool *pl = &s->pools[e->pool];
            if (how[e->pool] != KEEP_SOME || e->gen != was[e->pool] || e->klen < keep_len ||
                memcmp(e->key, keep, keep_len) != 0)
                continue;
            e->gen = s->gens[e->pool];
            pl->stale--;
            s->nstale--;
            pl->keys += e->present;
            s->nkeys += e->present;
            pl->filled += e->present || e->qlen;
            cleared -= e->present || e->qlen;
        }
    s->sweep_pos = 0;
    s->sweep_found = false;
    return cleared;
}

/*
 * Walks the chains from sweep_pos, settling the stale names it meets. A name the table's growth
 * moved from a chain not yet swept into one already swept is met on the next pass.
 */
bool rdzv__store_sweep(rdzv__store *s, size_t budget)
{
    budget = sweep_dead(s, budget);
    while (s->nstale > 0 && budget > 0) {
        if (s->sweep_pos >= nchains(s)) {
            /* A whole pass that met no stale name while nstale says some are left would spin
             * forever: the count is wrong, and is mended rather than trusted. */
            assert(s->sweep_found);
            if (!s->sweep_found)
                s->nstale = 0;
            s->sweep_pos = 0;
            s->sweep_found = false;
            continue;
        }
        rdzv__entry *e = chain_at(s, s->sweep_pos++), *next;
        budget--;
        for (; e; e = next) {
            next = e->hnext; /* settle() may free e */
            if (current(s, e))
                continue;
            settle(s, e);
            s->sweep_found = true;
            budget = budget > RDZV__SWEEP_NAME ? budget - RDZV__SWEEP_NAME : 0;
        }
    }
    return s->nstale > 0 || !queue_empty(&s->dead);
}

/* ---------------------------------------------------------------------------------------- */
/* Life cycle                                                                               */
/* ---------------------------------------------------------------------------------------- */

int rdzv__store_init(rdzv__store *s, size_t max_total_bytes)
{
    memset(s, 0, sizeof(*s));
    s->nbuckets = 1024;
    s->buckets = calloc(s->nbuckets, sizeof(*s->buckets));
    if (!s->buckets)
        return -ENOMEM;
    s->max_total_bytes = max_total_bytes;
    s->max_private_bytes = max_total_bytes;
    s->max_list_keys = SIZE_MAX;
    s->max_conn_output = SIZE_MAX;
    s->max_buffered = SIZE_MAX;
    queue_init(&s->holders);
    queue_init(&s->dead);
    queue_init(&s->dirty);
    if (getrandom(s->seed, sizeof(s->seed), GRND_NONBLOCK) != (ssize_t)sizeof(s->seed)) {
        /* No entropy yet (early boot): fall back to something that still differs per run. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s->seed[0] = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ULL ^ (uintptr_t)s;
        s->seed[1] = (uint64_t)ts.tv_sec * 0xC2B2AE3D27D4EB4FULL;
    }
    return 0;
}

void rdzv__store_destroy(rdzv__store *s)
{
    for (size_t i = 0; s->buckets && i < nchains(s); i++) {
        rdzv__entry *e = chain_at(s, i), *next;
        for (; e; e = next) {
            next = e->hnext;
            for (rdzv__qitem *q = e->qhead, *qn; q; q = qn) {
                qn = q->next;
                free(q);
            }
            free(e->val);
            free(e);
        }
    }
    queue *q, *qn;
    queue_foreach_safe(q, qn, &s->dead) { /* their names are freed above */
        rdzv__peer *p = queue_data(q, rdzv__peer, dead_node);
        queue *wq, *wn;
        queue_foreach_safe(wq, wn, &p->waits) {
            free(queue_data(wq, rdzv__wait, pnode));
        }
        for (rdzv__watch *w = p->watches, *wn; w; w = wn) {
            wn = w->cnext;
            free(w);
        }
        free(p);
    }
    queue_init(&s->dead);
    free(s->buckets);
    free(s->old);
    s->buckets = s->old = NULL;
}

bool rdzv__conn_waiting(const rdzv__conn *c)
{
    return (c->waits && !queue_empty(&c->waits->waits)) || (c->watches && c->watches->watches);
}

void rdzv__conn_init(rdzv__conn *c)
{
    memset(c, 0, sizeof(*c));
}

void rdzv__conn_release(rdzv__store *s, rdzv__conn *c)
{
    cancel_waits(s, c);
    peer_kill(s, &c->watches, &s->nwatches);
    if (c->dirty) {
        queue_remove(&c->dirty_node);
        c->dirty = false;
    }
    drop_held(s, c);
}
