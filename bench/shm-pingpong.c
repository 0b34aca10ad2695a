/*
 * shm-pingpong: one-way post -> wake latency of libcollective's shared-memory counters
 * (libcollective/shm.c), between real processes on one host.
 *
 * N processes pass a token around a ring through their arrive counters: rank r waits for rank
 * r-1's counter to reach the round, then posts its own; rank 0 starts each round and ends it
 * when rank N-1's post comes back. With N = 2 that is a ping-pong. The one-way latency is the
 * time of a round divided by N. Each configuration (process count x spin setting) runs in a
 * fresh segment, `reps` times; the median and the best repetition are printed.
 *
 * "auto" uses the spin that coll__shm_watch() chose from the CPU count; a number overrides it
 * (> 0: polls with a pause; < 0: that many polls after a sched_yield(); 0: sleep at once).
 * Only the token holder runs at any time, so with more processes than CPUs the others either
 * spin on a CPU the next holder needs or sleep in the futex.
 *
 * Usage: shm-pingpong [-n 2,4] [-s auto,0,100,20000,-10] [-r rounds] [-k reps]
 */
#include "cli.h"
#include "coll_internal.h"
#include "monoclock.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

struct boot {
    coll__counter ready[COLL__MAX_LOCAL];
    _Atomic int pids[COLL__MAX_LOCAL];
};

#define NB (sizeof(coll__shm_hdr) + sizeof(struct boot))
#define SPIN_AUTO INT_MIN

static struct boot *boot_of(coll__shm *s)
{
    return (struct boot *)((char *)s->base + sizeof(coll__shm_hdr));
}

static int join(coll__shm *s, int n, int rank, int spin)
{
    static _Atomic int no_abort;
    s->nlocal = n;
    s->local_rank = rank;
    s->local_abort = &no_abort;
    for (int i = 0; i < n; i++)
        s->granks[i] = i;
    int64_t deadline = rdzv__deadline_ns(30000);
    int rc = coll__shm_attach_done(s, deadline);
    if (rc != 0)
        return rc;
    struct boot *b = boot_of(s);
    atomic_store(&b->pids[rank], (int)getpid());
    coll__shm_post(s, &b->ready[rank].v, 1);
    for (int i = 0; i < n; i++) {
        if ((rc = coll__shm_wait(s, &b->ready[i].v, 1, -1, deadline, NULL)) != 0)
            return rc;
        s->pids[i] = atomic_load(&b->pids[i]);
    }
    if ((rc = coll__shm_watch(s)) != 0)
        return rc;
    if (spin != SPIN_AUTO)
        s->spin = spin;
    return 0;
}

/* Rounds [first, last] of the ring; rank 0 returns the elapsed ns, others 0; < 0 on error. */
static int64_t ring(coll__shm *s, uint64_t first, uint64_t last)
{
    coll__shm_hdr *h = s->base;
    int n = s->nlocal, r = s->local_rank, prev = (r + n - 1) % n;
    int64_t deadline = rdzv__deadline_ns(120000);
    int64_t t0 = rdzv__now_ns();
    for (uint64_t i = first; i <= last; i++) {
        int rc;
        if (r == 0) {
            coll__shm_post(s, &h->arrive[0].v, i);
            rc = coll__shm_wait(s, &h->arrive[prev].v, i, prev, deadline, NULL);
        } else {
            rc = coll__shm_wait(s, &h->arrive[prev].v, i, prev, deadline, NULL);
            coll__shm_post(s, &h->arrive[r].v, i);
        }
        if (rc != 0)
            return rc;
    }
    return rdzv__now_ns() - t0;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* One configuration: fork the ring, warm up, time `reps` batches of `rounds`. */
static int run(int n, int spin, int rounds, int reps)
{
    coll__shm s = {0};
    int rc = coll__shm_create(&s, "shm-pingpong", NB);
    if (rc != 0) {
        fprintf(stderr, "shm-pingpong: create: %s\n", strerror(-rc));
        return 1;
    }
    char name[64];
    strcpy(name, s.name);
    int warm = rounds / 10 + 1;
    uint64_t total = (uint64_t)warm + (uint64_t)rounds * (uint64_t)reps;
    pid_t kids[COLL__MAX_LOCAL];
    for (int r = 1; r < n; r++) {
        kids[r] = fork();
        if (kids[r] < 0) {
            perror("fork");
            return 1;
        }
        if (kids[r] == 0) {
            coll__shm c = {0};
            if (coll__shm_open(&c, name, NB) != 0 || join(&c, n, r, spin) != 0)
                _exit(2);
            _exit(ring(&c, 1, total) < 0 ? 3 : 0);
        }
    }
    int64_t *ns = calloc((size_t)reps, sizeof *ns);
    rc = join(&s, n, 0, spin);
    if (rc == 0 && ns && ring(&s, 1, (uint64_t)warm) >= 0) {
        for (int k = 0; k < reps && rc == 0; k++) {
            uint64_t first = (uint64_t)warm + (uint64_t)k * (uint64_t)rounds + 1;
            ns[k] = ring(&s, first, first + (uint64_t)rounds - 1);
            if (ns[k] < 0)
                rc = (int)ns[k];
        }
    } else if (rc == 0) {
        rc = -EIO;
    }
    int failed = rc != 0;
    for (int r = 1; r < n; r++) {
        int st;
        if (rc != 0)
            kill(kids[r], SIGKILL);
        waitpid(kids[r], &st, 0);
        failed |= !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    if (failed) {
        fprintf(stderr, "shm-pingpong: n=%d spin=%d failed (%d)\n", n, spin, rc);
    } else {
        qsort(ns, (size_t)reps, sizeof *ns, cmp_i64);
        double hops = (double)rounds * n;
        printf("%5d  %8d  %10.2f  %10.2f\n", n, s.spin, ns[reps / 2] / hops / 1e3,
               ns[0] / hops / 1e3);
    }
    free(ns);
    coll__shm_close(&s);
    return failed;
}

static int parse_list(char *arg, int *out, int max, int allow_auto)
{
    int k = 0;
    for (char *tok = strtok(arg, ","); tok && k < max; tok = strtok(NULL, ",")) {
        if (allow_auto && strcmp(tok, "auto") == 0) {
            out[k++] = SPIN_AUTO;
            continue;
        }
        char *end;
        long v = strtol(tok, &end, 10);
        if (*end || v < -100000000 || v > 100000000)
            return -1;
        out[k++] = (int)v;
    }
    return k;
}

int main(int argc, char **argv)
{
    int ns[16] = {2, 4}, nn = 2, spins[16] = {SPIN_AUTO}, nspin = 1, rounds = 20000, reps = 5;
    int opt, rc = 0;
    while ((opt = getopt(argc, argv, "n:s:r:k:h")) != -1) {
        switch (opt) {
        case 'n':
            nn = parse_list(optarg, ns, 16, 0);
            break;
        case 's':
            nspin = parse_list(optarg, spins, 16, 1);
            break;
        case 'r':
            rc = cli_parse_int("-r", optarg, 1, INT_MAX, &rounds);
            break;
        case 'k':
            rc = cli_parse_int("-k", optarg, 1, INT_MAX, &reps);
            break;
        default:
            fprintf(stderr, "usage: %s [-n 2,4] [-s auto,0,100,-10,...] [-r rounds] [-k reps]\n",
                    argv[0]);
            return opt == 'h' ? 0 : 2;
        }
        if (rc < 0) {
            fprintf(stderr, "shm-pingpong: %s\n", cli_last_error());
            return 2;
        }
    }
    if (nn < 1 || nspin < 1 || rounds < 1 || reps < 1) {
        fprintf(stderr, "shm-pingpong: bad arguments\n");
        return 2;
    }
    for (int i = 0; i < nn; i++) {
        if (ns[i] < 2 || ns[i] > COLL__MAX_LOCAL) {
            fprintf(stderr, "shm-pingpong: process count must be 2..%d\n", COLL__MAX_LOCAL);
            return 2;
        }
    }
    printf("# one-way post->wake latency, us (median and best of %d x %d rounds)\n", reps, rounds);
    printf("%5s  %8s  %10s  %10s\n", "procs", "spin", "median", "best");
    int failed = 0;
    for (int i = 0; i < nn; i++)
        for (int j = 0; j < nspin; j++)
            failed |= run(ns[i], spins[j], rounds, reps);
    return failed;
}
