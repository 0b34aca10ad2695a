/*
 * The store's logic, apart from any socket: keys and values, queues, wait lists and legacy
 * watches, and the replies each request produces. Internal to librendezvous; the server feeds
 * it parsed requests and sends what it appends to each connection's output buffer. The unit
 * tests and the fuzzer drive it directly with fake connections.
 */
#ifndef RDZV_STORE_H
#define RDZV_STORE_H

#include "proto.h"
#include "queue.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A growable byte buffer. From RDZV__BUF_MAP_BYTES of capacity on, its bytes are pages mapped
 * for it alone (`mapped`), so that what it holds in memory is what it holds in bytes: release
 * it with rdzv__buf_free() only, never free(data). */
typedef struct rdzv__buf {
    uint8_t *data;
    size_t len, cap;
    bool mapped;
} rdzv__buf;

#define RDZV__BUF_MAP_BYTES (256 << 10)

int rdzv__buf_reserve(rdzv__buf *b, size_t extra);
int rdzv__buf_append(rdzv__buf *b, const void *p, size_t n);
void rdzv__buf_free(rdzv__buf *b);

/* Freed mapped buffers are kept for reuse by the thread that freed them, up to `nbytes` per
 * thread (8 MiB unless set; a server sets it on its loop thread from max_buffered_bytes).
 * rdzv__buf_spares_free() unmaps them; a server calls it on its loop thread when it stops. */
void rdzv__buf_spares_limit(size_t nbytes);
void rdzv__buf_spares_free(void);

/* Gives back the capacity of a mapped buffer beyond its length (whole pages). Never fails. */
void rdzv__buf_fit(rdzv__buf *b);


typedef struct rdzv__entry rdzv__entry;
typedef struct rdzv__wait rdzv__wait;
typedef struct rdzv__watch rdzv__watch;
typedef struct rdzv__peer rdzv__peer;

/*
 * A client connection as the store sees it. The server embeds one per socket. Replies are
 * appended to `out`; a connection with new output is put on the store's dirty list, which
 * the server drains after each batch of requests.
 */
typedef struct rdzv__conn {
    rdzv__buf out;
    rdzv__peer *waits;   /* what this connection's pending WAITs name it by (NULL: none yet) */
    rdzv__peer *watches; /* the same for its legacy WATCH_KEY registrations */
    queue dirty_node;    /* on the store's dirty list while `dirty` */
    bool dirty;
    int error;       /* set when a reply could not be queued: close this connection */
    const char *why; /* with `error`: a static reason for the log line, or NULL */
    /* Bytes held on this connection's behalf and counted against the store's buffer caps:
     * replies queued and not yet reported sent (rdzv__conn_sent()), and the partly received
     * request the server keeps (rdzv__conn_hold_input()). */
    size_t out_held, in_held;
    queue held_node; /* on the store's holders list while `holding` */
    bool holding;
    /* A virtual connection of a multiplexed one (a store proxy's, see mux.h): its replies go
     * straight into `mux`'s output, framed with `vid` (mux.h), charged to `mux`; its own `out`
     * stays empty. NULL for a connection of its own. */
    struct rdzv__conn *mux;
    uint32_t vid;
} rdzv__conn;

/* The pools of names a clear takes or keeps whole: open names, and those under each private
 * root (RDZV_PRIVATE_AGENT_ROOT, RDZV_PRIVATE_COLL_ROOT). */
enum { RDZV__POOL_OPEN, RDZV__POOL_AGENT, RDZV__POOL_COLL, RDZV__POOLS };

typedef struct rdzv__store {
    rdzv__entry **buckets;
    size_t nbuckets; /* power of two */
    /* While the table grows: the previous one, whose buckets from rehash_pos on still hold
     * their names (see chain() in store.c); NULL otherwise. */
    rdzv__entry **old;
    size_t nold, rehash_pos;
    size_t nentries; /* hash entries (keys, queues, or names with waiters) */
    size_t nkeys;    /* keys holding a value */
    size_t bytes;    /* key + value bytes of stored keys, plus queued items */
    size_t memory;   /* what max_total_bytes caps: `bytes` plus the estimated memory of every
                        entry, value, queued item, WAIT and watch record beyond its bytes, for
                        the open key space */
    size_t nwaiters; /* keys awaited by pending WAITs, over all connections */
    size_t nwatches;
    size_t max_total_bytes;
    size_t max_conn_output; /* out_held one connection may reach (SIZE_MAX: no cap) */
    size_t max_buffered;    /* out_held + in_held of all connections together (SIZE_MAX) */
    size_t buffered;        /* out_held + in_held of all connections */
    queue holders;          /* rdzv__conn (held_node) holding any buffered bytes */
    uint64_t seed[2];       /* SipHash key, random per store */
    /* The private pool: `memory` of keys under the private roots (rdzv__key_private()) and of
     * the WAITs naming them, capped by max_private_bytes apart from the open keys, so that
     * filling the open key space leaves the job's control plane its room. */
    size_t private_memory;
    size_t max_private_bytes;
    size_t max_list_keys; /* LIST_KEYS over more keys is refused (SIZE_MAX: no cap) */
    /* Clearing (see rdzv__store_clear() and store.c): per pool of names, its generation and
     * counts of names, of those that are stale, of keys and of names holding a value or queued
     * items (these two leave stale names out); the stale names of all pools, left for the
     * sweep, which walks the chains from sweep_pos. */
    uint32_t gens[RDZV__POOLS];
    struct rdzv__pool {
        size_t entries, stale, keys, filled;
    } pools[RDZV__POOLS];
    size_t nstale, sweep_pos;
    bool sweep_found; /* this pass of the sweep met a stale name, or the table moved some */
    /* The WAITs and watches of closed connections and the WAITs a CANCEL_WAIT let go of, left
     * for the sweep (see rdzv__conn_release()); the name a request holds while it sweeps. */
    queue dead; /* rdzv__peer (dead_node) */
    rdzv__entry *pinned;
    uint64_t ops[RDZV_OP_COUNT];
    queue dirty; /* rdzv__conn (dirty_node) with output to send */
} rdzv__store;

/* Initialises an empty store, with no cap on buffered bytes or LIST_KEYS and a private pool as
 * large as the open one (set max_conn_output, max_buffered, max_private_bytes and max_list_keys
 * afterwards). Returns 0 or -ENOMEM. */
int rdzv__store_init(rdzv__store *s, size_t max_total_bytes);

/* Frees every key, queue and wait. Connections must have been released first. */
void rdzv__store_destroy(rdzv__store *s);

void rdzv__conn_init(rdzv__conn *c);

/* Lets go of a closing connection's WAITs and watches in O(1): from now on they answer and
 * tell nobody, a queue push passes them by, and rdzv__store_sweep() frees them (waiters and
 * watchers leave the counts at once; their memory stays counted until freed). Takes `c` off
 * the dirty list and frees its output buffer. */
void rdzv__conn_release(rdzv__store *s, rdzv__conn *c);

/* True if `c` has pending WAITs or legacy watches. */
bool rdzv__conn_waiting(const rdzv__conn *c);

/*
 * Buffer accounting. Every reply byte the store queues for a connection is charged to it
 * (out_held) and to the store (buffered); the server reports bytes the kernel took with
 * rdzv__conn_sent() and the size of the partial request it keeps with rdzv__conn_hold_input().
 * A connection that would go over max_conn_output gets error -ENOBUFS. When `buffered` would
 * go over max_buffered, the connection holding the most (the one asking included) is failed
 * with -ENOBUFS and its bytes written off, until the new bytes fit: a failed connection is put
 * on the dirty list so that the server closes it. Its `why` says which cap it hit.
 */
void rdzv__conn_sent(rdzv__store *s, rdzv__conn *c, size_t n);

/* Sets the partial-request bytes the server holds for `c` to n. Returns 0, or -ENOBUFS when
 * `c` itself must be closed (other connections may have been failed to make room). */
int rdzv__conn_hold_input(rdzv__store *s, rdzv__conn *c, size_t n);

/* Returned by rdzv__store_exec for a STATUS request: the server builds and appends the reply. */
#define RDZV__EXEC_STATUS 1
/* Returned for AUTH_HELLO and AUTH_PROOF: the server runs the handshake (auth.h). */
#define RDZV__EXEC_AUTH 2

/*
 * Executes one request from connection `c`. Replies (to `c`, and STOP_WAITING or watch
 * notifications to other connections) are appended to output buffers. Returns 0, or
 * RDZV__EXEC_STATUS, RDZV__EXEC_AUTH, or a negative errno meaning that `c` must be closed:
 * -ENOSPC (the total size cap would be exceeded), -ENOBUFS (its replies would exceed a buffer
 * cap), -E2BIG (LIST_KEYS over more than max_list_keys keys), -EINVAL (ADD on a value that is
 * not a decimal integer), -ENOMEM.
 */
int rdzv__store_exec(rdzv__store *s, rdzv__conn *c, const rdzv__request *req);

/* Appends `n` raw bytes to a connection's output and marks it dirty; a failure is recorded on
 * the connection (it will be closed) and returned. */
int rdzv__reply_raw(rdzv__store *s, rdzv__conn *c, const void *p, size_t n);

/* Appends a length-prefixed byte vector to a connection's output and marks it dirty. */
int rdzv__reply_vec(rdzv__store *s, rdzv__conn *c, const void *p, size_t n);

/*
 * Deletes every value and queue whose key does not start with keep[0..keep_len), all of them
 * when keep_len is 0 (names that connections wait on or watch stay, without a value; neither
 * is told). From the call on every request sees them gone; their memory is freed later, by
 * rdzv__store_sweep() or when a request finds the name, and stays counted in `bytes` and
 * `memory` until then. Costs O(1) for keep_len 0, a private root ("/ddprun/", "/ddprun-coll/")
 * or a prefix of one; O(names) for any other prefix (one pass of comparisons, no freeing).
 * Returns the number of names cleared (those that held a value or queued items).
 */
size_t rdzv__store_clear(rdzv__store *s, const uint8_t *keep, size_t keep_len);

/* Work units of a sweep: one per chain walked, RDZV__SWEEP_NAME per name, waiter node or watch
 * freed. A slice of
 * RDZV__SWEEP_SLICE frees up to 4096 names or walks 128 Ki empty chains: 1 to 2 ms (3M
 * empty keys take 1.8 s in 765 slices on a loaded machine). */
#define RDZV__SWEEP_NAME 32
#define RDZV__SWEEP_SLICE (4096 * RDZV__SWEEP_NAME)

/* Frees, `budget` work units' worth, the WAITs and watches of closed connections, then the
 * memory of cleared names. Returns true while any is left. */
bool rdzv__store_sweep(rdzv__store *s, size_t budget);

/* Takes the first connection off the dirty list; NULL when it is empty. */
rdzv__conn *rdzv__store_pop_dirty(rdzv__store *s);

#endif /* RDZV_STORE_H */
