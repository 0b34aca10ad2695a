/*
 * barrier_worker: a launcher benchmark's worker. Joins the job with coll_comm_init_env(), store
 * only (it reads the torchrun environment and connects to the launcher's store at
 * MASTER_ADDR:MASTER_PORT), enters one librendezvous barrier with all WORLD_SIZE ranks, and
 * records when it started, when it was connected and when it left the barrier.
 *
 *     barrier_worker OUTDIR [BARRIER_NAME]
 *
 * Writes OUTDIR/rank<RANK>: "<rank> <start_ns> <connected_ns> <passed_ns>\n", CLOCK_REALTIME
 * nanoseconds (comparable with `date +%s%N` in the script that started the launcher). Exits 0,
 * or 1 with a message on stderr. The barrier name defaults to "launch_bench"; its keys live
 * under that name in the store (the launcher's own keys are elsewhere). Every launch starts a
 * store of its own, so the keys need no per-attempt prefix. A missing or malformed variable,
 * or a store out of reach, is named in coll_last_error()'s message.
 *
 * C rather than Python so that the measurement is the launcher's and the store's, not the
 * time to import torch (in a CUDA build, loading libcollective's libnccl and libcudart adds
 * about 1.4 ms of CPU per start, the same under every launcher). The client speaks PyTorch's modern
 * (2.2+) store protocol: it works with ddprun's store and with torch 2.x torchrun's agent store,
 * not with torch 1.13's.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll.h"

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
    rdzv_client_options so;
    rdzv_client_options_init(&so);
    so.connect_timeout_ms = 60000;
    so.timeout_ms = 120000;
    coll_env_options eo;
    coll_env_options_init(&eo);
    eo.name = "barrier_worker"; /* the key prefix is unused: the barrier's keys are under name */
    eo.store = &so;
    eo.store_only = true;
    coll_env job;
    int rc = coll_comm_init_env(&eo, &job);
    if (rc < 0) {
        /* The sentence names the variable at fault, says that none is set, or names the store. */
        fprintf(stderr, "barrier_worker: %s\n", coll_last_error(NULL));
        return 1;
    }
    rdzv_client *c = job.store;
    int rank = job.env.rank, world = job.env.world_size;
    int64_t t_connected = now_ns();
    rc = rdzv_barrier(c, name, world, -1);
    int64_t t_passed = now_ns();
    if (rc < 0) {
        fprintf(stderr, "barrier_worker rank %d: barrier '%s' of %d: %s (%s)\n", rank, name,
                world, rdzv_strerror(rc), rdzv_client_last_error(c));
        coll_env_free(&job);
        return 1;
    }
    coll_env_free(&job);

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
