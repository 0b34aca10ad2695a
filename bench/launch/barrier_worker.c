/*
 * barrier_worker: a launcher benchmark's worker. Connects to the launcher's store at
 * MASTER_ADDR:MASTER_PORT with librendezvous' client, enters one barrier with all WORLD_SIZE
 * ranks, and records when it started, when it was connected and when it left the barrier.
 *
 *     barrier_worker OUTDIR [BARRIER_NAME]
 *
 * Writes OUTDIR/rank<RANK>: "<rank> <start_ns> <connected_ns> <passed_ns>\n", CLOCK_REALTIME
 * nanoseconds (comparable with `date +%s%N` in the script that started the launcher). Exits 0,
 * or 1 with a message on stderr. The barrier name defaults to "launch_bench"; its keys live
 * under that name in the store (the launcher's own keys are elsewhere). Every launch starts a
 * store of its own, so the keys need no per-attempt prefix. The environment is read with
 * rdzv_env_read(), whose message names a missing or malformed variable.
 *
 * C rather than Python so that the measurement is the launcher's and the store's, not the
 * time to import torch. The client speaks PyTorch's modern (2.2+) store protocol: it works
 * with ddprun's store and with torch 2.x torchrun's agent store, not with torch 1.13's.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rdzv.h"

/*
 * CLOCK_REALTIME on purpose, not the project's monotonic clock (monoclock.h): these stamps are
 * compared across processes and with `date +%s%N` in launch_bench.sh, which needs the wall clock.
 */
static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
    int64_t t_start = now_ns();
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s OUTDIR [BARRIER_NAME]\n", argv[0]);
        return 2;
    }
    const char *outdir = argv[1];
    const char *name = argc == 3 ? argv[2] : "launch_bench";
    rdzv_env env;
    if (rdzv_env_read(&env) < 0 || env.standalone) {
        /* librendezvous' sentence names the variable at fault, or says that none is set. */
        fprintf(stderr, "barrier_worker: %s\n", rdzv_client_last_error(NULL));
        return 1;
    }
    const char *host = env.master_addr;
    int port = env.master_port, rank = env.rank, world = env.world_size;

    rdzv_client_options opts;
    rdzv_client_options_init(&opts);
    opts.connect_timeout_ms = 60000;
    opts.timeout_ms = 120000;
    /* A store slow to answer 64 new connections at once is measured, not taken for a stranger
     * (torch 2.x's agent store leaves some unanswered past the default 5 s on 2 busy cores). */
    opts.handshake_timeout_ms = -1;
    rdzv_client *c = NULL;
    int rc = rdzv_env_connect(&env, &opts, &c);
    if (rc < 0) {
        fprintf(stderr, "barrier_worker rank %d: connect %s:%d: %s (%s)\n", rank, host, port,
                rdzv_strerror(rc), rdzv_client_last_error(NULL));
        return 1;
    }
    int64_t t_connected = now_ns();
    rc = rdzv_barrier(c, name, world, -1);
    int64_t t_passed = now_ns();
    if (rc < 0) {
        fprintf(stderr, "barrier_worker rank %d: barrier '%s' of %d: %s (%s)\n", rank, name,
                world, rdzv_strerror(rc), rdzv_client_last_error(c));
        rdzv_client_close(c);
        return 1;
    }
    rdzv_client_close(c);

    char path[4096];
    snprintf(path, sizeof(path), "%s/rank%d", outdir, rank);
    FILE *f = fopen(path, "w");
    if (!f || fprintf(f, "%d %" PRId64 " %" PRId64 " %" PRId64 "\n", rank, t_start, t_connected,
                      t_passed) < 0 || fclose(f) != 0) {
        fprintf(stderr, "barrier_worker rank %d: cannot write %s: %s\n", rank, path,
                strerror(errno));
        return 1;
    }
    return 0;
}
