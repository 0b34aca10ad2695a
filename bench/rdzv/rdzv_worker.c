/*
 * The worker of bench/rdzv/rdzv_bench.sh: records when it started and exits, or stays up.
 *
 *     rdzv_worker DIR exit|sleep|watch
 *
 * It writes "DIR/<restart>.<rank>" (TORCHELASTIC_RESTART_COUNT, RANK; written to a temporary
 * name and renamed, so a reader sees the whole line or nothing) holding
 * "<CLOCK_REALTIME ns at start> <pid> <GROUP_RANK> <WORLD_SIZE>", then:
 *   exit   exits 0 at once (the round-time measurement);
 *   sleep  sleeps until a signal ends it (the node-death measurement: the agents alone must
 *          notice the lost node);
 *   watch  sleeps, but exits 1 within 20 ms once a worker of its own round (a file of the same
 *          restart count) is gone, as a collective does when a peer's connection drops. This is
 *          what makes a launcher that does not watch its peers (torchrun) restart at all. Each
 *          worker holds a lock on DIR/<restart>.<rank>.lock while it lives; see peer_gone().
 * The pid written is the worker's own view of it: under ddprun, a pid in the node's namespace.
 * Either sleeping mode gives up after 600 s. It does not talk to any store. Exit status 0, or 1
 * on bad usage, a failed write, or (watch) a lost peer.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/file.h>
#include <unistd.h>

static long env_long(const char *name, long dflt)
{
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : dflt;
}

/*
 * True when the worker recorded as DIR/<restart>.<rank> is gone: its start file exists but
 * nobody holds the lock on DIR/<restart>.<rank>.lock any more. A lock, not a pid, because
 * ddprun runs each node's workers in a pid namespace of their own; the kernel drops the lock
 * when the process dies, zombie or not.
 */
static int peer_gone(const char *dir, long restart, long rank)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%ld.%ld", dir, restart, rank);
    if (access(path, F_OK) != 0)
        return 0; /* not started yet */
    snprintf(path, sizeof path, "%s/%ld.%ld.lock", dir, restart, rank);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    int gone = flock(fd, LOCK_EX | LOCK_NB) == 0;
    close(fd); /* releases it */
    return gone;
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[2], "exit") && strcmp(argv[2], "sleep") &&
                      strcmp(argv[2], "watch"))) {
        fprintf(stderr, "usage: %s DIR exit|sleep|watch\n", argv[0]);
        return 1;
    }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    long rank = env_long("RANK", 0), restart = env_long("TORCHELASTIC_RESTART_COUNT", 0);
    long world = env_long("WORLD_SIZE", 1), group = env_long("GROUP_RANK", -1);
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/%ld.%ld.lock", argv[1], restart, rank);
    int lock = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600); /* held until exit */
    if (lock < 0 || flock(lock, LOCK_EX) != 0) {
        perror(path);
        return 1;
    }
    snprintf(path, sizeof path, "%s/%ld.%ld", argv[1], restart, rank);
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%lld %ld %ld %ld\n", (long long)now.tv_sec * 1000000000LL + now.tv_nsec,
                      (long)getpid(), group, world) < 0 ||
        fclose(f) != 0 || rename(tmp, path) != 0) {
        perror(path);
        return 1;
    }
    if (strcmp(argv[2], "exit") == 0)
        return 0;
    struct timespec tick = {0, 20 * 1000 * 1000};
    for (int i = 0; i < 600 * 50; i++) {
        nanosleep(&tick, NULL);
        if (strcmp(argv[2], "watch") == 0)
            for (long r = 0; r < world; r++)
                if (r != rank && peer_gone(argv[1], restart, r))
                    return 1;
    }
    return 0;
}
