/*
 * The operations that the store-backed rendezvous backends (static, c10d) share: their control
 * keys live in the workers' store itself, so a connection is a librendezvous client and every
 * operation is the noderdzv.h function of the same name. What differs between those backends,
 * where the store is served and how a node joins a round, is in backend_static.c and
 * backend_c10d.c. No I/O but store calls; nothing printed.
 */
#include "backend.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

struct ddprun_rdzv_conn {
    rdzv_client *client;
};

struct ddprun_rdzv_watch {
    ddprun_hb_state hb;
};

rdzv_client *ddprun_store_client(ddprun_rdzv_conn *c)
{
    return c->client;
}

int ddprun_store_connect(const ddprun_config *cfg, const char *host, int port,
                         const rdzv_client_options *o, ddprun_rdzv_conn **out, char *err,
                         size_t errlen)
{
    (void)cfg;
    if (errlen)
        err[0] = '\0';
    ddprun_rdzv_conn *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    int rc = rdzv_client_connect(host, port, o, &c->client);
    if (rc < 0) {
        if (errlen)
            snprintf(err, errlen, "%s", rdzv_client_last_error(NULL)); /* thread-local */
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void ddprun_store_close(ddprun_rdzv_conn *c)
{
    if (!c)
        return;
    rdzv_client_close(c->client);
    free(c);
}

int ddprun_store_clear_worker_keys(rdzv_server *srv, ddprun_rdzv_conn *c, const char *prefix,
                                   int round, int nnodes, double timeout_s)
{
    return ddprun_rdzv_clear_worker_keys(srv, c->client, prefix, round, nnodes, timeout_s);
}

int ddprun_store_publish_failure(ddprun_rdzv_conn *c, const char *prefix, int round,
                                 const char *json)
{
    return ddprun_rdzv_publish_failure(c->client, prefix, round, json);
}

int ddprun_store_wait_failure(ddprun_rdzv_conn *c, const char *prefix, int round, int timeout_ms,
                              char **json)
{
    return ddprun_rdzv_wait_failure(c->client, prefix, round, timeout_ms, json);
}

int ddprun_store_exit_barrier(ddprun_rdzv_conn *c, const char *prefix, int round, int nnodes,
                              double timeout_s, int poll_ms, char **failure)
{
    return ddprun_rdzv_exit_barrier(c->client, prefix, round, nnodes, timeout_s, poll_ms, failure);
}

int ddprun_store_exit_done(ddprun_rdzv_conn *c, const char *prefix, int round)
{
    return ddprun_rdzv_exit_done(c->client, prefix, round);
}

int ddprun_store_publish_conn(ddprun_rdzv_conn *c, const char *prefix, int round, int node_rank)
{
    return ddprun_rdzv_publish_conn(c->client, prefix, round, node_rank);
}

int ddprun_store_conn_owner(ddprun_rdzv_conn *c, const char *prefix, int round, int nnodes,
                            const char *host, int port)
{
    return ddprun_rdzv_conn_owner(c->client, prefix, round, nnodes, host, port);
}

int ddprun_store_heartbeat(ddprun_rdzv_conn *c, const char *prefix, int round, int node_rank,
                           char *err, size_t errlen)
{
    (void)err, (void)errlen; /* a failed beat is no verdict: the other nodes' watches decide */
    return ddprun_heartbeat(c->client, prefix, round, node_rank);
}

int ddprun_store_watch_open(const char *prefix, int round, int nnodes, int node_rank,
                            double dead_after_s, ddprun_rdzv_watch **out)
{
    ddprun_rdzv_watch *w = calloc(1, sizeof(*w));
    if (!w)
        return -ENOMEM;
    int rc = node_rank < 0 ? ddprun_hb_init(&w->hb, prefix, round, nnodes, dead_after_s)
                           : ddprun_hb_init_peers(&w->hb, prefix, round, nnodes, node_rank,
                                                  DDPRUN_HB_PEERS, dead_after_s);
    if (rc < 0) {
        free(w);
        return rc;
    }
    *out = w;
    return 0;
}

int ddprun_store_dead_nodes(ddprun_rdzv_conn *c, ddprun_rdzv_watch *w, int *dead, int dead_cap)
{
    return ddprun_dead_nodes(c->client, &w->hb, dead, dead_cap);
}

void ddprun_store_watch_close(ddprun_rdzv_watch *w)
{
    if (!w)
        return;
    ddprun_hb_free(&w->hb);
    free(w);
}

int ddprun_store_mark_host(ddprun_rdzv_conn *c, const char *prefix)
{
    return ddprun_rdzv_mark_host(c->client, prefix);
}

int ddprun_store_publish_host(ddprun_rdzv_conn *c, const char *prefix, int round, int node_rank,
                              const char *hostname)
{
    return ddprun_rdzv_publish_host(c->client, prefix, round, node_rank, hostname);
}

int ddprun_store_node_host(ddprun_rdzv_conn *c, const char *prefix, int round, int node_rank,
                           char *buf, size_t n)
{
    return ddprun_rdzv_node_host(c->client, prefix, round, node_rank, buf, n);
}
