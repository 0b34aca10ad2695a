/*
 * Node-level rendezvous for ddprun's agents: the protocols that agents on different machines run
 * through the store (librendezvous) to agree on node ranks, global rank offsets and the world
 * size, to notice nodes that stopped beating, to broadcast the first failure of a round, to
 * leave together (the exit barrier), and to clear the workers' keys between attempts.
 * The store-backed rendezvous backends (backend_store.c, backend_static.c, backend_c10d.c) are
 * built on these functions; the agent calls them only through backend.h's operations.
 *
 * Every key the agents write is here. All live under DDPRUN_RDZV_ROOT ("/ddprun"), in the run's
 * prefix "/ddprun/<run_id>" (ddprun_rdzv_run_prefix(); `prefix` below, without a trailing '/'),
 * and in a round ("<prefix>/round_<n>/..."), so a restarted job never sees an earlier round's
 * keys. The round is the rendezvous round: 0 first, +1 per restart or membership change. The
 * layout, per round:
 *
 *   static/nnodes        the node count the round was opened with (compare_set, first wins)
 *   static/claim/<rank>  ADD counter; a value above 1 means two nodes claimed one node rank
 *   static/nproc/<rank>  decimal nproc of that node rank
 *   static/arrived       ADD counter of the nodes that published nproc; the node whose ADD
 *                        returns the node count computes every node's layout
 *   static/layout/<rank> "<rank offset> <world size>" of that node rank, or "E<errno> <sentence>"
 *                        (the error every node reports), set by the node that computed the layout
 *   dyn/config           "<min>:<max>" the round was opened with (compare_set, first wins)
 *   dyn/count            ADD counter: a node's join slot is the value its ADD returned, minus 1
 *   dyn/node/<slot>      "<nproc> <node_id>" of the node holding that slot
 *   dyn/quorum           exists once min_nodes slots were taken (or the round was aborted)
 *   dyn/closed           "<n>" (closed with slots 0..n-1) or "aborted <n>"; set once (compare_set)
 *   dyn/waiting          ADD counter of nodes that arrived after the round closed
 *   dyn/layout/<slot>    as static/layout/<rank>, set by the node in slot 0 once it read the
 *                        members' records
 *   hb/<rank>            ADD counter, advanced by each heartbeat of that node rank
 *   conn/<rank>          "<host> <port>": the local end of that node's monitor connection to the
 *                        store (ddprun_rdzv_publish_conn()), so that the store's host can tell
 *                        whose connection closed
 *   host/<rank>          the host name of that node (ddprun_rdzv_publish_host()), so that every
 *                        node names a lost node by its host too
 *   failed               the first failure report of the round (compare_set): the JSON text of
 *                        a ddprun_failure (failure.h)
 *   exit/count           ADD counter of the nodes whose workers all succeeded (exit barrier)
 *   exit/done            "1", set by the node whose ADD brought exit/count to the node count
 *   cleared              "1", set by the store's host once it cleared the workers' keys for
 *                        this round (rounds after a restart, multi-node jobs only), or where no
 *                        agent hosts the store, by the node that cleared them
 *   clearing             ADD counter: where no agent hosts the store, the node whose ADD returned
 *                        1 clears the workers' keys of this round through its client
 *
 * and once per run, outside the rounds:
 *
 *   <prefix>/store_host  "1", set by an agent that serves the store in-process before its first
 *                        rendezvous (ddprun_rdzv_mark_host()); absent when no agent does (a c10d
 *                        endpoint served by ddp-rendezvous or PyTorch)
 *   <prefix>/auth_failed "<count> <ADDR:PORT>": the agent that serves the store in-process saw
 *                        `count` failed authentications, the last from that peer
 *                        (ddprun_rdzv_publish_auth_failure()), for the nodes waiting at the
 *                        rendezvous to say which address has another token
 *
 * Keys outside DDPRUN_RDZV_ROOT "/" are the workers' (torch's own, with no attempt prefix):
 * ddprun_rdzv_clear_worker_keys() deletes them between attempts and keeps everything here.
 *
 * These functions do no I/O but store calls, and print nothing: failures are negative errno
 * values plus a sentence in the caller's `err` buffer where one is taken. A client is not
 * thread-safe, so a monitor thread needs a client of its own. The header compiles as C99 and C++.
 */
#ifndef DDPRUN_NODERDZV_H
#define DDPRUN_NODERDZV_H

#include <stddef.h>
#include <stdint.h>

#include "rdzv.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DDPRUN_RDZV_MAX_NODES 65536 /* most nodes in one rendezvous */
#define DDPRUN_RDZV_ROOT "/ddprun"  /* every key of ddprun's agents starts with this and '/' */
#define DDPRUN_RDZV_MAX_PREFIX 4096 /* longest run prefix the functions below accept */

/*
 * Writes the run's key prefix "<DDPRUN_RDZV_ROOT>/<run_id>" (the `prefix` every function below
 * takes) into buf. `run_id` (--rdzv-id) is borrowed. Returns the prefix's length, -EINVAL (NULL
 * argument or empty run_id) or -ENAMETOOLONG (buflen too small; buf then holds "").
 */
int ddprun_rdzv_run_prefix(const char *run_id, char *buf, size_t buflen);

/* What a node learns from a rendezvous. */
typedef struct ddprun_assignment {
    int round;       /* rendezvous round (0 first, +1 per job restart) */
    int node_rank;   /* this node's GROUP_RANK */
    int nnodes;      /* GROUP_WORLD_SIZE */
    int rank_offset; /* first global RANK on this node: sum of nproc of lower node ranks */
    int world_size;  /* sum of every node's nproc */
} ddprun_assignment;

/*
 * Static rendezvous: the node count and this node's rank are known in advance (torchrun's
 * --node-rank). The node checks that the round was opened with the same `nnodes` and that no
 * other node claimed `node_rank`, publishes its `nproc`, waits until all `nnodes` nodes have
 * published, and learns its rank offset and the world size as prefix sums of every node's
 * nproc (nodes may differ). Call on every node with the same prefix, round and nnodes.
 * The last node to publish reads every node's nproc once and publishes each node's result under
 * static/layout; every other node waits for its own key, so the store answers O(nnodes) requests
 * and bytes per round in all. When that key does not appear in time, the node looks at every
 * node's nproc once: it computes its result itself if all are there (the computing node stopped
 * before publishing), and otherwise reports the missing node ranks.
 *
 * `prefix` is borrowed. `timeout_s` bounds the wait for the other nodes (< 0: the client's
 * timeout); single store calls are bounded by the client's timeout. `err` (may be NULL when
 * errlen is 0) receives a sentence on failure and "" on success.
 *
 * Returns 0 and fills *out; -EINVAL (bad argument, or nnodes differing from the round's);
 * -EEXIST (another node claimed this node rank in this round); -ETIMEDOUT (not every node
 * published in time: err names the missing node ranks); -EPROTO (a malformed value in the store,
 * or a world size past INT_MAX); or another negative errno from the store.
 */
int ddprun_rdzv_static(rdzv_client *c, const char *prefix, int round, int nnodes, int node_rank,
                       int nproc, double timeout_s, ddprun_assignment *out, char *err,
                       size_t errlen);

/*
 * Dynamic (elastic, c10d-style) rendezvous. Nodes join round `round` of run `prefix`, and node
 * ranks are given in join order (the store's ADD decides it). The round closes, exactly once
 * (compare_set on dyn/closed), when either
 *   - max_nodes nodes have joined (the node that joined last closes it at once), or
 *   - at least min_nodes have joined and last_call_timeout_s has passed since this node saw the
 *     quorum (every member keeps that timer; the first to fire closes the round with the nodes
 *     joined by then).
 * The participants are the first n join slots, n being the count stored when the round closed,
 * so every member derives the same list. The member in slot 0 waits for the members' records,
 * reads them once and publishes every member's rank offset and the world size (prefix sums in
 * join order) under dyn/layout; every other member waits for its own key only, and, should it
 * not appear within the join timeout, looks at the records itself once as the static round does.
 *
 * A node arriving after the round closed (or beyond max_nodes) gets -EAGAIN: it counts itself in
 * dyn/waiting (see ddprun_rdzv_num_waiting()), so that the members can restart the job into round
 * + 1, and should then retry with round + 1, where it waits for the members to come back.
 *
 * If fewer than min_nodes join within join_timeout_s, the first node to notice aborts the round
 * (compare_set "aborted"): every member then gets -ETIMEDOUT and nodes arriving later -EAGAIN,
 * so a node that gave up is never counted as a participant.
 *
 * `prefix` and `node_id` (a unique, non-empty string such as "host:pid", recorded with the node)
 * are borrowed. join_timeout_s bounds the wait for min_nodes and, separately, for the members'
 * records after the close (< 0: the client's timeout); last_call_timeout_s >= 0. Call on every
 * node with the same prefix, round, min_nodes and max_nodes. `err` as for ddprun_rdzv_static().
 *
 * Returns 0 and fills *out; -EINVAL (bad argument, or min/max differing from the round's);
 * -EAGAIN (the round closed before this node joined); -ETIMEDOUT (the quorum was not reached in
 * time, or a member's record did not appear); -EPROTO (a malformed value in the store, or a world
 * size past INT_MAX); or another negative errno from the store.
 */
int ddprun_rdzv_dynamic(rdzv_client *c, const char *prefix, int round, int min_nodes, int max_nodes,
                        const char *node_id, int nproc, double join_timeout_s,
                        double last_call_timeout_s, ddprun_assignment *out, char *err,
                        size_t errlen);

/*
 * Sets *count to the number of nodes that arrived too late for round `round` of a dynamic
 * rendezvous (torchrun's num_nodes_waiting). Members poll this at their monitor interval and
 * restart into round + 1 when it is positive. Returns 0 or a negative errno from the store.
 */
int ddprun_rdzv_num_waiting(rdzv_client *c, const char *prefix, int round, int64_t *count);

/*
 * Heartbeats. Each node calls ddprun_heartbeat() every interval; it advances the counter
 * <prefix>/round_<n>/hb/<node_rank> in the store (an ADD, so it needs no local state and a
 * reply confirms it). A watcher keeps a ddprun_hb_state and calls ddprun_dead_nodes() now and
 * then: one MULTI_GET reads the watched nodes' counters, and a node whose counter has not changed
 * for more than dead_after_s (on the watcher's monotonic clock) is reported dead. A node that
 * never beat counts from the init call. A watched node is thus reported between dead_after_s and
 * dead_after_s + beat interval + check interval after its last beat; choose dead_after_s as a
 * few beat intervals. No clocks are compared across machines.
 *
 * A watcher watches either every node (ddprun_hb_init(): N keys per check, what the agent that
 * serves the store does) or its ring peers (ddprun_hb_init_peers(): the next `npeers` node ranks
 * after its own, modulo the node count, what every other node does), so that the store answers
 * O(N) keys per check interval in all rather than N per node. Under the ring watch a run of
 * consecutive dead ranks is always watched by the live rank just before it, so some death is
 * reported as long as one node lives; a particular node's death is missed only if its `npeers`
 * predecessors all die before its silence reaches dead_after_s, and then the nearest live
 * predecessor reports one of them instead.
 */
#define DDPRUN_HB_PEERS 2 /* ring successors each node watches (ddprun_hb_init_peers()) */

typedef struct ddprun_hb_state {
    int round;           /* the round watched */
    int nnodes;          /* the round's node count */
    double dead_after_s; /* silence after which a node counts as dead */
    char **keys;         /* (nwatched) heartbeat keys: one allocation, owned */
    int64_t *value;      /* (nwatched) last counter seen; -1 before any (missing key) */
    double *changed_s;   /* (nwatched) monotonic time the counter last changed, or init time */
    int nwatched;        /* node ranks watched: every node, or the ring peers (may be 0) */
    int *ranks;          /* (nwatched) the node rank behind each key, owned */
} ddprun_hb_state;

/*
 * Prepares `st` (the caller's storage) to watch every node rank 0..nnodes-1 of round `round`
 * under `prefix` (borrowed; the keys are copied). Returns 0, -EINVAL (nnodes out of 1 ..
 * DDPRUN_RDZV_MAX_NODES, dead_after_s <= 0, NULL argument) or -ENOMEM; on failure `st` holds
 * nothing to free, though ddprun_hb_free() on it is harmless.
 */
int ddprun_hb_init(ddprun_hb_state *st, const char *prefix, int round, int nnodes,
                   double dead_after_s);

/*
 * As ddprun_hb_init(), but watches only node_rank's ring peers: node ranks node_rank + 1 ..
 * node_rank + npeers modulo nnodes, at most nnodes - 1 of them (never node_rank itself; none for
 * a single node, when ddprun_dead_nodes() asks the store nothing). -EINVAL also for node_rank out
 * of 0 .. nnodes-1 or npeers < 1.
 */
int ddprun_hb_init_peers(ddprun_hb_state *st, const char *prefix, int round, int nnodes,
                         int node_rank, int npeers, double dead_after_s);

/* Releases what ddprun_hb_init() allocated in `st` and zeroes it. NULL is a no-op. */
void ddprun_hb_free(ddprun_hb_state *st);

/*
 * One heartbeat of `node_rank` for round `round`: advances its counter. Returns 0, -EINVAL or a
 * negative errno from the store.
 */
int ddprun_heartbeat(rdzv_client *c, const char *prefix, int round, int node_rank);

/*
 * Reads every watched node's counter in one MULTI_GET (none when nothing is watched), updates
 * `st`, and writes the ranks of dead nodes to dead[0 .. min(n, dead_cap)-1] in the order watched
 * (ascending for ddprun_hb_init(), ring order for the peers) (`dead` may be NULL when dead_cap is
 * 0). Returns n, the number of dead nodes (which may exceed dead_cap), -EINVAL, -EPROTO (a
 * counter that is not a decimal integer) or a negative errno from the store (then `st` is
 * unchanged).
 */
int ddprun_dead_nodes(rdzv_client *c, ddprun_hb_state *st, int *dead, int dead_cap);

/*
 * Connection records. A node publishes the local end of its monitor's connection (`c` itself,
 * rdzv_client_local_endpoint()) as conn/<node_rank> of round `round`; the agent hosting the store
 * hears of every connection that closes (the server's on_close hook) and looks the closed end up
 * with ddprun_rdzv_conn_owner(), which reads every node's record in one MULTI_GET. A node whose
 * connection closed is gone at once (its ddprun exited or was killed), with no heartbeat timeout
 * to wait for. Behind a NAT the ends differ and nothing matches: heartbeats still apply.
 *
 * publish_conn returns 0, -EINVAL or a negative errno from the client or the store. conn_owner
 * returns the node rank (0 .. nnodes-1) whose record is host:port (`host` borrowed), -ENOENT if
 * none is, -EINVAL, -ENOMEM or a negative errno from the store.
 */
int ddprun_rdzv_publish_conn(rdzv_client *c, const char *prefix, int round, int node_rank);
int ddprun_rdzv_conn_owner(rdzv_client *c, const char *prefix, int round, int nnodes,
                           const char *host, int port);

/*
 * Host names. A node publishes its host name (`hostname`, borrowed, not empty) as host/<node_rank>
 * of round `round`; any node looks one up, without waiting, to name a node in its reports
 * ("node 2 (node3)"). publish_host returns 0, -EINVAL or a negative errno from the store.
 * node_host writes the name (cut to fit) into buf[n] and returns 0; -ENOENT when that node
 * published none; -EINVAL; or a negative errno from the store.
 */
int ddprun_rdzv_publish_host(rdzv_client *c, const char *prefix, int round, int node_rank,
                             const char *hostname);
int ddprun_rdzv_node_host(rdzv_client *c, const char *prefix, int round, int node_rank, char *buf,
                          size_t n);

/*
 * Authentication failures. The agent serving the store publishes how many connections failed
 * to authenticate to it and the address of the last (`peer`, "ADDR:PORT", borrowed, no space),
 * so that nodes waiting for the others can say which address does not share the job's token.
 * publish returns 0, -EINVAL (count < 1, a bad peer) or a negative errno from the store.
 * ddprun_rdzv_auth_failure() waits up to timeout_ms (0: one look; < 0: the client's timeout)
 * for the record, and writes its count to *count and its peer (cut to fit) to peer[n]; returns
 * 0, -ETIMEDOUT (none yet; the client stays usable), -EPROTO (a malformed record), -EINVAL, or
 * another negative errno.
 */
int ddprun_rdzv_publish_auth_failure(rdzv_client *c, const char *prefix, int64_t count,
                                     const char *peer);
int ddprun_rdzv_auth_failure(rdzv_client *c, const char *prefix, int timeout_ms, int64_t *count,
                             char *peer, size_t n);

/*
 * Whether every node has passed the exit barrier of round `round` (exit/done is set): after that
 * a node that goes silent or closes its connection has simply finished. Returns 1, 0, -EINVAL or
 * a negative errno from the store.
 */
int ddprun_rdzv_exit_done(rdzv_client *c, const char *prefix, int round);

/*
 * Publishes a failure report of round `round`: sets <prefix>/round_<n>/failed to `json` (any
 * non-empty text; borrowed) unless a report is already there, so the earliest failure is kept.
 * Returns 1 if this report was stored (or an identical one was already there), 0 if an earlier,
 * different one is kept, -EINVAL (NULL or empty json) or a negative errno from the store.
 */
int ddprun_rdzv_publish_failure(rdzv_client *c, const char *prefix, int round, const char *json);

/*
 * Writes the failure key of round `round` (what ddprun_rdzv_publish_failure() sets) into buf, so
 * that a monitor thread can rdzv_wait() on it with its own client. Returns the key's length, or
 * -EINVAL (NULL argument, negative round) or -ENAMETOOLONG (buflen too small; buf then holds "").
 */
int ddprun_rdzv_failure_key(const char *prefix, int round, char *buf, size_t buflen);

/*
 * Waits up to timeout_ms (< 0: the client's timeout; 0: one look, as for rdzv_wait_get()) for the
 * failure report of round `round` and returns it in *json (NUL-terminated, free with
 * rdzv_free()). Meant for a monitor thread with a client of its own. Returns 0, -ETIMEDOUT (no failure yet; the client stays usable) or another
 * negative errno.
 */
int ddprun_rdzv_wait_failure(rdzv_client *c, const char *prefix, int round, int timeout_ms,
                             char **json);

/*
 * Torchrun's exit barrier for round `round`: a node whose workers all succeeded adds itself to
 * exit/count, the node that brings the count to `nnodes` sets exit/done, and every node waits
 * for exit/done, so that the store's host stays up until every node has finished with it. A
 * failure report published for the round meanwhile (a node whose workers are still running
 * failed) ends the wait: a WAIT returns only once all its keys exist, so the wait for exit/done
 * runs in slices of poll_ms, with a look at the failure key between them. Call on every node
 * whose workers succeeded, with the same prefix, round and nnodes.
 *
 * `prefix` is borrowed. timeout_s bounds the whole barrier (< 0: no bound); poll_ms >= 1.
 * Returns 0 once all nnodes nodes arrived; 1 when the round's failure report came first: *failure
 * receives its text (NUL-terminated, free with rdzv_free()); -ETIMEDOUT; -EINVAL (bad argument);
 * -ENOMEM; or another negative errno from the store. *failure is written only when 1 is returned.
 */
int ddprun_rdzv_exit_barrier(rdzv_client *c, const char *prefix, int round, int nnodes,
                             double timeout_s, int poll_ms, char **failure);

/*
 * Between attempts the workers' keys go: torch 2.x workers use the agent's store without an
 * attempt prefix (torchrun gives each attempt a fresh store), so a restarted worker could
 * otherwise read a peer's key from the failed attempt. Call on every node after the rendezvous of
 * round `round` (a round after a restart), before spawning: once every node has met for the new
 * round, every old worker is gone.
 *
 * On the node that hosts the store (`srv` not NULL, the agent's own in-process server), deletes
 * every key outside DDPRUN_RDZV_ROOT "/" (every run's rendezvous keys stay) and then, when nnodes
 * > 1, sets the round's `cleared` key. On the other nodes (`srv` NULL), waits up to timeout_s
 * (< 0: the client's timeout) for that key, so that none spawns before the store is clear.
 * Where no agent hosts the store (the run's store_host key is absent: ddprun_rdzv_mark_host()),
 * the first node to count itself in the round's `clearing` key does the host's part through a
 * second connection of its client: it lists the keys (LIST_KEYS) and deletes those outside
 * DDPRUN_RDZV_ROOT "/", then sets `cleared`; the others wait for that. A store that cannot list
 * its keys (PyTorch's before LIST_KEYS, which closes the connection) keeps them: `cleared` is
 * set all the same, so that the restart goes on as with torchrun's own store.
 *
 * `prefix` (borrowed) must start with DDPRUN_RDZV_ROOT "/". Returns the number of keys deleted
 * (the node that cleared) or 0 (others); -EINVAL (bad argument); -ETIMEDOUT; -ENOMEM; or another
 * negative errno.
 */
int ddprun_rdzv_clear_worker_keys(rdzv_server *srv, rdzv_client *c, const char *prefix, int round,
                                  int nnodes, double timeout_s);

/*
 * Says that an agent serves the run's store in-process (sets <prefix>/store_host), so that the
 * other nodes leave the clearing between attempts to it (ddprun_rdzv_clear_worker_keys()). Call
 * on the hosting agent before its first rendezvous. `prefix` (borrowed) must start with
 * DDPRUN_RDZV_ROOT "/". Returns 0, -EINVAL, -ENOMEM or a negative errno from the store.
 */
int ddprun_rdzv_mark_host(rdzv_client *c, const char *prefix);

#ifdef __cplusplus
}
#endif

#endif /* DDPRUN_NODERDZV_H */
