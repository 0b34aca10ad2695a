/*
 * The static rendezvous backend (--rdzv-backend static, torchrun's default): the node count and
 * each node's rank are given (--nnodes, --node-rank), node 0 serves the workers' store at
 * --master-addr:--master-port, and a round is joined with ddprun_rdzv_static(). Every other
 * operation is the store-backed one (backend_store.c).
 */
#include "backend.h"

static void static_plan_store(const ddprun_config *cfg, ddprun_store_plan *plan)
{
    plan->host = cfg->master_addr;
    plan->port = cfg->master_port;
    plan->serve = cfg->node_rank == 0;
    plan->must_serve = true;
}

static int static_join(ddprun_rdzv_conn *c, const char *prefix, const ddprun_config *cfg,
                       const char *node_id, int *round, ddprun_assignment *out, char *err,
                       size_t errlen)
{
    (void)node_id;
    return ddprun_rdzv_static(ddprun_store_client(c), prefix, *round, cfg->nnodes_max,
                              cfg->node_rank, cfg->nproc_per_node, cfg->join_timeout_s, out, err,
                              errlen);
}

const ddprun_backend_ops ddprun_backend_static = {
    .name = "static",
    .plan_store = static_plan_store,
    .join = static_join,
    .store_dies_with_node = true, /* node 0 serves it */
    DDPRUN_STORE_BACKEND_OPS,
};
