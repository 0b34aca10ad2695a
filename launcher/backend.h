/*
 * Rendezvous backends of ddprun (--rdzv-backend): how the agents of a job find each other, agree
 * on node ranks, tell each other of a failure, watch each other's liveness and leave together,
 * and where the workers' store (the TCPStore behind MASTER_ADDR:MASTER_PORT) is served. The
 * agent (ddprun.c, monitor.c) calls only the operations below, through the row that
 * ddprun_backend_find() returns; it never asks which backend it runs.
 *
 * The rows:
 *   static  backend_static.c: node ranks given (--node-rank); node 0 serves the store
 *   c10d    backend_c10d.c:   elastic, node ranks in join order; the endpoint's host serves it
 *   etcd    backend_etcd.c:   elastic, in an etcd cluster; each round's rank 0 serves the store
 * static and c10d keep their control keys in the workers' store itself, through noderdzv.h, and
 * share the operations of backend_store.c (all but plan_store, join and num_waiting); etcd has
 * its own connection type and every operation.
 *
 * Adding a backend (etcd, say) is one new file, backend_<name>.c, defining a
 * `const ddprun_backend_ops ddprun_backend_<name>`, and one row in backend.c's table (with the
 * extern declaration beside it) and in launcher/meson.build's sources; its command-line settings
 * (the name accepted by --rdzv-backend and any --rdzv-conf keys) go in options.c. A backend whose
 * control plane is not the workers' store defines its own struct ddprun_rdzv_conn and every
 * operation; it still says in plan_store where the workers' store is, since the workers need one
 * whatever the backend.
 *
 * Conventions. `prefix` is the run's key prefix (ddprun_rdzv_run_prefix(); every control key of
 * the run lives under it), `round` the rendezvous round (0 first, +1 per restart or membership
 * change); both are borrowed. Operations return negative errno values on failure, as noderdzv.h
 * documents for the function each store-backed row maps to, and print nothing. A connection is
 * not thread-safe: the agent's store jobs and its monitor thread each open one. Internal to the
 * launcher.
 */
#ifndef DDPRUN_BACKEND_H
#define DDPRUN_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "noderdzv.h"
#include "options.h"
#include "rdzv.h"

/* One agent's connection to the job's rendezvous: defined by the backend (backend_store.c). */
typedef struct ddprun_rdzv_conn ddprun_rdzv_conn;

/* A watch over the other nodes' liveness in one round: defined by the backend. */
typedef struct ddprun_rdzv_watch ddprun_rdzv_watch;

/* Where the workers' store is, and whether this agent serves it (plan_store). */
typedef struct ddprun_store_plan {
    const char *host; /* where agents and workers reach it (borrowed from the config) */
    int port;         /* its port; 0: this agent serves it on a free port */
    bool serve;       /* this agent serves it in-process */
    bool must_serve;  /* failing to serve it is fatal; else this agent is a client of whoever
                       * serves it (another agent on this machine bound the port first) */
} ddprun_store_plan;

typedef struct ddprun_backend_ops {
    const char *name; /* the --rdzv-backend value */

    /* Fills *plan from the parsed configuration (may resolve host names; never fails). */
    void (*plan_store)(const ddprun_config *cfg, ddprun_store_plan *plan);

    /*
     * Opens a connection to the rendezvous. `host`:`port` is the workers' store as this agent
     * reaches it (where the store-backed rows connect); a backend with an endpoint of its own
     * finds it in `cfg`. `o` bounds connecting and every later call and carries the job's token.
     * `cfg` and `o` are borrowed. Returns 0 and sets *out, or a negative errno; then `err` (may
     * be NULL when errlen is 0) receives what the transport said, or "". close() releases a
     * connection; NULL is a no-op.
     */
    int (*connect)(const ddprun_config *cfg, const char *host, int port,
                   const rdzv_client_options *o, ddprun_rdzv_conn **out, char *err, size_t errlen);
    void (*close)(ddprun_rdzv_conn *c);

    /*
     * Joins round *round and fills *out (ddprun_assignment): node rank, node count, rank offset
     * and world size. An elastic backend may join a later round than asked (the asked one closed
     * before this node came): *round then says which. `node_id` (borrowed) names this agent
     * uniquely ("host:pid"). `err` receives a sentence on failure.
     */
    int (*join)(ddprun_rdzv_conn *c, const char *prefix, const ddprun_config *cfg,
                const char *node_id, int *round, ddprun_assignment *out, char *err, size_t errlen);

    /*
     * Deletes the workers' keys from the store between attempts (ddprun_rdzv_clear_worker_keys()):
     * `srv` is the store this agent serves, or NULL on the agents that only wait for the clearing.
     */
    int (*clear_worker_keys)(rdzv_server *srv, ddprun_rdzv_conn *c, const char *prefix, int round,
                             int nnodes, double timeout_s);

    /* The round's failure report: the first published is kept (ddprun_rdzv_publish_failure(),
     * ddprun_rdzv_wait_failure(); *json is released with rdzv_free()). */
    int (*publish_failure)(ddprun_rdzv_conn *c, const char *prefix, int round, const char *json);
    int (*wait_failure)(ddprun_rdzv_conn *c, const char *prefix, int round, int timeout_ms,
                        char **json);

    /* The exit barrier, and whether every node has passed it (ddprun_rdzv_exit_barrier(),
     * ddprun_rdzv_exit_done(); *failure is released with rdzv_free()). */
    int (*exit_barrier)(ddprun_rdzv_conn *c, const char *prefix, int round, int nnodes,
                        double timeout_s, int poll_ms, char **failure);
    int (*exit_done)(ddprun_rdzv_conn *c, const char *prefix, int round);

    /*
     * Connection records (ddprun_rdzv_publish_conn(), ddprun_rdzv_conn_owner()): this agent
     * publishes the local end of `c`, and the agent serving the store looks up whose connection
     * closed (its server's on_close hook gives host and port).
     */
    int (*publish_conn)(ddprun_rdzv_conn *c, const char *prefix, int round, int node_rank);
    int (*conn_owner)(ddprun_rdzv_conn *c, const char *prefix, int round, int nnodes,
                      const char *host, int port);

    /*
     * Liveness: heartbeat() once per beat interval (-ENOLINK: this node has lost its place in the
     * rendezvous for good, `err` says why, and no restart can bring it back); a watch of a round
     * of nnodes nodes (watch_open(), released by watch_close(), NULL a no-op) reports in dead[]
     * the watched nodes silent for more than dead_after_s (ddprun_heartbeat(), ddprun_hb_init(),
     * ddprun_dead_nodes()). `node_rank` is the watcher's: < 0 watches every node, as the agent
     * serving the store does, and a node rank watches that node's ring peers
     * (ddprun_hb_init_peers()), so that the store serves O(nnodes) keys per check in all.
     */
    int (*heartbeat)(ddprun_rdzv_conn *c, const char *prefix, int round, int node_rank, char *err,
                     size_t errlen);
    int (*watch_open)(const char *prefix, int round, int nnodes, int node_rank, double dead_after_s,
                      ddprun_rdzv_watch **out);
    int (*dead_nodes)(ddprun_rdzv_conn *c, ddprun_rdzv_watch *w, int *dead, int dead_cap);
    void (*watch_close)(ddprun_rdzv_watch *w);

    /*
     * Elastic backends only (NULL otherwise): the number of nodes waiting to join after round
     * `round` closed (ddprun_rdzv_num_waiting()). A job smaller than --nnodes' maximum is watched
     * for them, and restarts into the next round to admit them.
     */
    int (*num_waiting)(ddprun_rdzv_conn *c, const char *prefix, int round, int64_t *count);

    /*
     * True when the rendezvous lives only in the store that one agent serves (plan_store): it
     * dies with that agent's node, and no other agent can carry on or restart the job without
     * it. The agent then says so (store_gone_with_node()) instead of attempting a restart.
     */
    bool store_dies_with_node;

    /*
     * How the monitor says that a node is gone, after the node's name ("node 2 (node3): "), a
     * printf format taking the liveness timeout (double): "stopped sending heartbeats (none for
     * %g s)" and the like.
     */
    const char *gone_format;

    /*
     * Called once as ddprun exits, from the loop thread, while a store job may still run
     * (NULL: nothing to do): this node leaves the rendezvous at once, so that the other nodes
     * see it gone without waiting for the liveness timeout. A second at most per etcd member
     * tried.
     */
    void (*leave)(const ddprun_config *cfg);

    /*
     * Backends whose control plane is not the workers' store (NULL otherwise): the store moves
     * with the rounds. After each rendezvous the node of rank 0 serves a fresh store and
     * publishes where it is (publish_store(), `host` borrowed); the others wait up to timeout_s
     * for that (find_store(), into host[hostlen] and *port). local_address() writes the address
     * by which the rendezvous reaches this node (the one to publish when --local-addr is not
     * given) into buf[n]; -ENOENT when there is none.
     */
    int (*local_address)(ddprun_rdzv_conn *c, char *buf, size_t n);
    int (*publish_store)(ddprun_rdzv_conn *c, const char *prefix, int round, const char *host,
                         int port);
    int (*find_store)(ddprun_rdzv_conn *c, const char *prefix, int round, double timeout_s,
                      char *host, size_t hostlen, int *port);

    /*
     * Store-backed backends (NULL otherwise): called by an agent that serves the store
     * in-process before its first rendezvous, so that the other nodes leave the clearing of the
     * workers' keys between attempts to it; where no agent calls it (an external c10d endpoint)
     * a node of the round clears them through its client (ddprun_rdzv_mark_host(),
     * ddprun_rdzv_clear_worker_keys()).
     */
    int (*mark_host)(ddprun_rdzv_conn *c, const char *prefix);

    /*
     * Host names (ddprun_rdzv_publish_host(), ddprun_rdzv_node_host()), NULL where the backend
     * keeps none: each node publishes its own once its monitor starts on a round, and a node
     * reporting another as lost looks its name up (-ENOENT: none published).
     */
    int (*publish_host)(ddprun_rdzv_conn *c, const char *prefix, int round, int node_rank,
                        const char *hostname);
    int (*node_host)(ddprun_rdzv_conn *c, const char *prefix, int round, int node_rank, char *buf,
                     size_t n);
} ddprun_backend_ops;

/* The row named `name` (borrowed), or NULL if there is none. */
const ddprun_backend_ops *ddprun_backend_find(const char *name);

/*
 * The operations shared by the backends whose control plane is the workers' store
 * (backend_store.c): every row of ddprun_backend_ops but name, plan_store, join and num_waiting,
 * as functions of these names, and the store client behind a connection (borrowed).
 */
rdzv_client *ddprun_store_client(ddprun_rdzv_conn *c);
int ddprun_store_connect(const ddprun_config *cfg, const char *host, int port,
                         const rdzv_client_options *o, ddprun_rdzv_conn **out, char *err,
                         size_t errlen);
void ddprun_store_close(ddprun_rdzv_conn *c);
int ddprun_store_clear_worker_keys(rdzv_server *srv, ddprun_rdzv_conn *c, const char *prefix,
                                   int round, int nnodes, double timeout_s);
int ddprun_store_publish_failure(ddprun_rdzv_conn *c, const char *prefix, int round,
                                 const char *json);
int ddprun_store_wait_failure(ddprun_rdzv_conn *c, const char *prefix, int round, int timeout_ms,
                              char **json);
int ddprun_store_exit_barrier(ddprun_rdzv_conn *c, const char *prefix, int round, int nnodes,
                              double timeout_s, int poll_ms, char **failure);
int ddprun_store_exit_done(ddprun_rdzv_conn *c, const char *prefix, int round);
int ddprun_store_publish_conn(ddprun_rdzv_conn *c, const char *prefix, int round, int node_rank);
int ddprun_store_conn_owner(ddprun_rdzv_conn *c, const char *prefix, int round, int nnodes,
                            const char *host, int port);
int ddprun_store_heartbeat(ddprun_rdzv_conn *c, const char *prefix, int round, int node_rank,
                           char *err, size_t errlen);
int ddprun_store_watch_open(const char *prefix, int round, int nnodes, int node_rank,
                            double dead_after_s, ddprun_rdzv_watch **out);
int ddprun_store_dead_nodes(ddprun_rdzv_conn *c, ddprun_rdzv_watch *w, int *dead, int dead_cap);
void ddprun_store_watch_close(ddprun_rdzv_watch *w);
int ddprun_store_mark_host(ddprun_rdzv_conn *c, const char *prefix);
int ddprun_store_publish_host(ddprun_rdzv_conn *c, const char *prefix, int round, int node_rank,
                              const char *hostname);
int ddprun_store_node_host(ddprun_rdzv_conn *c, const char *prefix, int round, int node_rank,
                           char *buf, size_t n);

/* The store-backed rows' shared operations, for their table initialisers. */
#define DDPRUN_STORE_BACKEND_OPS                                                                   \
    .connect = ddprun_store_connect, .close = ddprun_store_close,                                  \
    .clear_worker_keys = ddprun_store_clear_worker_keys,                                           \
    .publish_failure = ddprun_store_publish_failure, .wait_failure = ddprun_store_wait_failure,    \
    .exit_barrier = ddprun_store_exit_barrier, .exit_done = ddprun_store_exit_done,                \
    .publish_conn = ddprun_store_publish_conn, .conn_owner = ddprun_store_conn_owner,              \
    .heartbeat = ddprun_store_heartbeat, .watch_open = ddprun_store_watch_open,                    \
    .dead_nodes = ddprun_store_dead_nodes, .watch_close = ddprun_store_watch_close,                \
    .gone_format = "stopped sending heartbeats (none for %g s)",                                   \
    .mark_host = ddprun_store_mark_host, .publish_host = ddprun_store_publish_host,                \
    .node_host = ddprun_store_node_host

#endif /* DDPRUN_BACKEND_H */
