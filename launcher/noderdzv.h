/*
 * Node-level rendezvous for ddprun's agents: the protocols that agents on different machines run
 * through the store (librendezvous) to agree on node ranks, global rank offsets and the world
 * size, to notice nodes that stopped beating, and to broadcast the first failure of a round.
 *
 * Every key lives under `prefix` (the run, such as "/ddprun/<run_id>", without a trailing '/')
 * and a round ("<prefix>/round_<n>/..."), so a restarted job never sees an earlier round's keys.
 * The layout, per round:
 *
 *   static/nnodes        the node count the round was opened with (compare_set, first wins)
 *   static/claim/<rank>  ADD counter; a value above 1 means two nodes claimed one node rank
 *   static/nproc/<rank>  decimal nproc of that node rank
 *   dyn/config           "<min>:<max>" the round was opened with (compare_set, first wins)
 *   dyn/count            ADD counter: a node's join slot is the value its ADD returned, minus 1
 *   dyn/node/<slot>      "<nproc> <node_id>" of the node holding that slot
 *   dyn/quorum           exists once min_nodes slots were taken (or the round was aborted)
 *   dyn/closed           "<n>" (closed with slots 0..n-1) or "aborted <n>"; set once (compare_set)
 *   dyn/waiting          ADD counter of nodes that arrived after the round closed
 *   hb/<rank>            ADD counter, advanced by each heartbeat of that node rank
 *   failed               the first failure report (JSON text) of the round (compare_set)
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
 * published, and computes its rank offset and the world size as prefix sums of every node's
 * nproc (nodes may differ). Call on every node with the same prefix, round and nnodes.
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
 * so every member derives the same list; each waits for the members' records and computes its
 * rank offset and the world size as prefix sums in join order.
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
 * then: one MULTI_GET reads every node's counter, and a node whose counter has not changed for
 * more than dead_after_s (on the watcher's monotonic clock) is reported dead. A node that never
 * beat counts from ddprun_hb_init(). A node is thus reported between dead_after_s and
 * dead_after_s + beat interval + check interval after its last beat; choose dead_after_s as a
 * few beat intervals. No clocks are compared across machines.
 */
typedef struct ddprun_hb_state {
    int round;           /* the round watched */
    int nnodes;          /* node ranks watched: 0 .. nnodes-1 */
    double dead_after_s; /* silence after which a node counts as dead */
    char **keys;         /* (nnodes) heartbeat keys, owned */
    int64_t *value;      /* (nnodes) last counter seen; -1 before any (missing key) */
    double *changed_s;   /* (nnodes) monotonic time the counter last changed, or init time */
} ddprun_hb_state;

/*
 * Prepares `st` (the caller's storage) to watch node ranks 0..nnodes-1 of round `round` under
 * `prefix` (borrowed; the keys are copied). Returns 0, -EINVAL (nnodes out of 1 ..
 * DDPRUN_RDZV_MAX_NODES, dead_after_s <= 0, NULL argument) or -ENOMEM; on failure `st` holds
 * nothing to free, though ddprun_hb_free() on it is harmless.
 */
int ddprun_hb_init(ddprun_hb_state *st, const char *prefix, int round, int nnodes,
                   double dead_after_s);

/* Releases what ddprun_hb_init() allocated in `st` and zeroes it. NULL is a no-op. */
void ddprun_hb_free(ddprun_hb_state *st);

/*
 * One heartbeat of `node_rank` for round `round`: advances its counter. Returns 0, -EINVAL or a
 * negative errno from the store.
 */
int ddprun_heartbeat(rdzv_client *c, const char *prefix, int round, int node_rank);

/*
 * Reads every watched node's counter in one MULTI_GET, updates `st`, and writes the ranks of
 * dead nodes (ascending) to dead[0 .. min(n, dead_cap)-1] (`dead` may be NULL when dead_cap is
 * 0). Returns n, the number of dead nodes (which may exceed dead_cap), -EINVAL, -EPROTO (a
 * counter that is not a decimal integer) or a negative errno from the store (then `st` is
 * unchanged).
 */
int ddprun_dead_nodes(rdzv_client *c, ddprun_hb_state *st, int *dead, int dead_cap);

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
 * Waits up to timeout_ms (< 0: the client's timeout) for the failure report of round `round` and
 * returns it in *json (NUL-terminated, free with rdzv_free()). Meant for a monitor thread with
 * a client of its own. Returns 0, -ETIMEDOUT (no failure yet; the client stays usable) or another
 * negative errno.
 */
int ddprun_rdzv_wait_failure(rdzv_client *c, const char *prefix, int round, int timeout_ms,
                             char **json);

#ifdef __cplusplus
}
#endif

#endif /* DDPRUN_NODERDZV_H */
