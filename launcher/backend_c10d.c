/*
 * The c10d rendezvous backend (--rdzv-backend c10d): elastic, node ranks in join order
 * (ddprun_rdzv_dynamic()), the workers' store served at --rdzv-endpoint by the agent on that host
 * (or the one rdzv_conf's is_host names), and nodes arriving after a round closed counted so
 * that the members restart into the next round to admit them. Every other operation is the
 * store-backed one (backend_store.c).
 */
#include "backend.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <unistd.h>

/* True if `host` resolves to an address of this machine (one we can bind to). */
static bool is_local_address(const char *host)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res, *r;
    bool local = false;
    if (getaddrinfo(host, NULL, &hints, &res) != 0)
        return false;
    for (r = res; r && !local; r = r->ai_next) {
        int fd = socket(r->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        /* Port 0: only the address matters; binding fails with EADDRNOTAVAIL if not ours. */
        if (r->ai_family == AF_INET)
            ((struct sockaddr_in *)r->ai_addr)->sin_port = 0;
        else if (r->ai_family == AF_INET6)
            ((struct sockaddr_in6 *)r->ai_addr)->sin6_port = 0;
        local = bind(fd, r->ai_addr, r->ai_addrlen) == 0;
        close(fd);
    }
    freeaddrinfo(res);
    return local;
}

static void c10d_plan_store(const ddprun_config *cfg, ddprun_store_plan *plan)
{
    plan->host = cfg->rdzv_host;
    plan->port = cfg->rdzv_port;
    if (cfg->is_host_given)
        plan->serve = cfg->is_host;
    else
        plan->serve = is_local_address(plan->host); /* then try; if the port is taken, a client */
    plan->must_serve = cfg->is_host_given;
}

static int c10d_join(ddprun_rdzv_conn *c, const char *prefix, const ddprun_config *cfg,
                     const char *node_id, int *round, ddprun_assignment *out, char *err,
                     size_t errlen)
{
    int rc;
    /* A round that closed before we joined: wait for the next one, which the running nodes
     * start when they see us waiting. */
    while ((rc = ddprun_rdzv_dynamic(ddprun_store_client(c), prefix, *round, cfg->nnodes_min,
                                     cfg->nnodes_max, node_id, cfg->nproc_per_node,
                                     cfg->join_timeout_s, cfg->last_call_timeout_s, out, err,
                                     errlen)) == -EAGAIN)
        (*round)++;
    return rc;
}

static int c10d_num_waiting(ddprun_rdzv_conn *c, const char *prefix, int round, int64_t *count)
{
    return ddprun_rdzv_num_waiting(ddprun_store_client(c), prefix, round, count);
}

const ddprun_backend_ops ddprun_backend_c10d = {
    .name = "c10d",
    .plan_store = c10d_plan_store,
    .join = c10d_join,
    .num_waiting = c10d_num_waiting,
    .store_dies_with_node = true, /* the endpoint's host serves it */
    DDPRUN_STORE_BACKEND_OPS,
};
