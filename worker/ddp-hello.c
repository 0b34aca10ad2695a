/*
 * ddp-hello: the smallest ddprun worker. It reads the environment ddprun (or torchrun) gives
 * it, connects to the job's store at MASTER_ADDR:MASTER_PORT, publishes its host, passes a
 * barrier with every other rank, and rank 0 reports who took part and how long the barrier
 * took. It stands in for a training program until ddp-train lands, and the launch benchmark
 * uses it to time "launch until every rank passed a store barrier".
 *
 * The environment is read by rdzv_env_read(); a missing or malformed variable is reported with
 * librendezvous' sentence, which names it.
 *
 * Exit status: 0 success, 1 bad environment, 2 store error, 3 timed out.
 */
#include "monoclock.h"
#include "rdzv.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int quiet = argc > 1 && !strcmp(argv[1], "--quiet");
    rdzv_env env;
    if (rdzv_env_read(&env) < 0 || env.standalone) {
        /* librendezvous' sentence names the variable at fault, or says that none is set. */
        fprintf(stderr, "ddp-hello: %s\n", rdzv_client_last_error(NULL));
        return 1;
    }
    int rank = env.rank, world = env.world_size;
    /* Keys under "ddp-hello/<run id>/<restart count>/", apart from a failed attempt's. */
    char prefix[300];
    int rc = rdzv_env_prefix(&env, "ddp-hello", prefix, sizeof(prefix) - 1);
    if (rc < 0) {
        fprintf(stderr, "ddp-hello: rank %d: key prefix: %s\n", rank, rdzv_strerror(rc));
        return 1;
    }
    strcat(prefix, "/");

    rdzv_client_options o;
    rdzv_client_options_init(&o);
    o.prefix = prefix;
    o.timeout_ms = 60000;
    rdzv_client *c;
    rc = rdzv_env_connect(&env, &o, &c);
    if (rc < 0) {
        fprintf(stderr, "ddp-hello: rank %d: %s\n", rank, rdzv_client_last_error(NULL));
        return rc == -ETIMEDOUT ? 3 : 2;
    }
    char host[256] = "?", key[32];
    gethostname(host, sizeof(host) - 1);
    snprintf(key, sizeof(key), "host/%d", rank);
    int64_t t0 = rdzv__now_ns();
    rc = rdzv_set(c, key, host, strlen(host));
    if (rc == 0)
        rc = rdzv_barrier(c, "barrier", world, -1);
    int64_t t1 = rdzv__now_ns();
    if (rc == 0 && rank == 0 && !quiet) {
        printf("ddp-hello: %d ranks passed the barrier on %s:%d (%.2f ms at rank 0)\n", world,
               env.master_addr, env.master_port, (double)(t1 - t0) / 1e6);
    }
    if (rc < 0)
        fprintf(stderr, "ddp-hello: rank %d: %s (%s)\n", rank, rdzv_strerror(rc),
                rdzv_client_last_error(c));
    rdzv_client_close(c);
    return rc == 0 ? 0 : rc == -ETIMEDOUT ? 3 : 2;
}
