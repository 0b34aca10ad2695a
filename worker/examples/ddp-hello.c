/*
 * ddp-hello: the smallest ddprun worker. It reads the environment ddprun (or torchrun) gives
 * it, connects to the job's store at MASTER_ADDR:MASTER_PORT, publishes its host, passes a
 * barrier with every other rank, and rank 0 reports who took part and how long the barrier
 * took. It stands in for a training program until ddp-train lands, and the launch benchmark
 * uses it to time "launch until every rank passed a store barrier".
 *
 * It joins through coll_comm_init_env() without a communicator (store_only): a missing or
 * malformed variable is reported with librendezvous' sentence, which names it.
 *
 * Its one option, --quiet, leaves out rank 0's report.
 *
 * Exit status: 0 success, 1 store error, 2 usage error (an unknown option or argument, or a bad
 * environment: named), 3 timed out. 1 and 2 as in every program of the project.
 */
#include "coll.h"
#include "monoclock.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int quiet = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quiet") != 0) {
            fprintf(stderr, "ddp-hello: unknown %s '%s' (it takes only --quiet)\n",
                    argv[i][0] == '-' ? "option" : "argument", argv[i]);
            return 2;
        }
        quiet = 1;
    }
    rdzv_client_options o;
    rdzv_client_options_init(&o);
    o.timeout_ms = 60000;
    coll_env_options eo;
    coll_env_options_init(&eo);
    eo.name = "ddp-hello"; /* keys under "ddp-hello/<run id>/<restart count>/", apart from a
                              failed attempt's */
    eo.store = &o;
    eo.store_only = true;
    coll_env job;
    int rc = coll_comm_init_env(&eo, &job);
    if (rc < 0) {
        fprintf(stderr, "ddp-hello: %s\n", coll_last_error(NULL));
        return rc == -EINVAL || rc == -ENOENT || rc == -ENOSPC ? 2 : rc == -ETIMEDOUT ? 3 : 1;
    }
    rdzv_client *c = job.store;
    int rank = job.env.rank, world = job.env.world_size;
    char host[256] = "?", key[sizeof job.prefix + 32];
    gethostname(host, sizeof(host) - 1);
    snprintf(key, sizeof(key), "%s/host/%d", job.prefix, rank);
    int64_t t0 = mono_now_ns();
    rc = rdzv_set(c, key, host, strlen(host));
    snprintf(key, sizeof(key), "%s/barrier", job.prefix);
    if (rc == 0)
        rc = rdzv_barrier(c, key, world, -1);
    int64_t t1 = mono_now_ns();
    if (rc == 0 && rank == 0 && !quiet) {
        printf("ddp-hello: %d ranks passed the barrier on %s:%d (%.2f ms at rank 0)\n", world,
               job.env.master_addr, job.env.master_port, (double)(t1 - t0) / 1e6);
    }
    if (rc < 0)
        fprintf(stderr, "ddp-hello: rank %d: %s (%s)\n", rank, rdzv_strerror(rc),
                rdzv_client_last_error(c));
    coll_env_free(&job);
    return rc == 0 ? 0 : rc == -ETIMEDOUT ? 3 : 1;
}
