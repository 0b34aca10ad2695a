/*
 * ddp-hello: the smallest ddprun worker. It reads the environment ddprun (or torchrun) gives
 * it, connects to the job's store at MASTER_ADDR:MASTER_PORT, publishes its host, passes a
 * barrier with every other rank, and rank 0 reports who took part and how long the barrier
 * took. It stands in for a training program until ddp-train lands, and the launch benchmark
 * uses it to time "launch until every rank passed a store barrier".
 *
 * Exit status: 0 success, 1 bad environment, 2 store error, 3 timed out.
 */
#include "monoclock.h"
#include "rdzv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int env_int(const char *name, int *out)
{
    const char *v = getenv(name);
    char *end;
    if (!v || !*v)
        return -1;
    long x = strtol(v, &end, 10);
    if (*end || x < 0 || x > 1 << 30)
        return -1;
    *out = (int)x;
    return 0;
}

int main(int argc, char **argv)
{
    int rank, world, port, quiet = argc > 1 && !strcmp(argv[1], "--quiet");
    const char *addr = getenv("MASTER_ADDR");
    if (env_int("RANK", &rank) || env_int("WORLD_SIZE", &world) || env_int("MASTER_PORT", &port) ||
        !addr) {
        fprintf(stderr, "ddp-hello: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT must be set "
                        "(run me under ddprun)\n");
        return 1;
    }
    const char *attempt = getenv("TORCHELASTIC_RESTART_COUNT");
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "/ddp-hello/attempt_%s/", attempt ? attempt : "0");

    rdzv_client_options o;
    rdzv_client_options_init(&o);
    o.prefix = prefix;
    o.timeout_ms = 60000;
    rdzv_client *c;
    int rc = rdzv_client_connect(addr, port, &o, &c);
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
        printf("ddp-hello: %d ranks passed the barrier on %s:%d (%.2f ms at rank 0)\n", world, addr,
               port, (double)(t1 - t0) / 1e6);
    }
    if (rc < 0)
        fprintf(stderr, "ddp-hello: rank %d: %s (%s)\n", rank, rdzv_strerror(rc),
                rdzv_client_last_error(c));
    rdzv_client_close(c);
    return rc == 0 ? 0 : rc == -ETIMEDOUT ? 3 : 2;
}
