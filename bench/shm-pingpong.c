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
 * Usage: shm-pingpong [-n 2,4] [-s auto,0,100,20000,-10] [-r rounds] [-k reps] (see --help)
 */
#include "cli.h"
#include "coll_internal.h"
#include "monoclock.h"

#include <assert.h>
#include <errno.h>
#include <getopt.h>
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
#define SPIN_AUTO CLI_AUTO /* -s auto: the spin coll__shm_watch() chose */

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
    int64_t deadline = mono_deadline_ns(30000);
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
    int64_t deadline = mono_deadline_ns(120000);
    int64_t t0 = mono_now_ns();
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
    return mono_now_ns() - t0;
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

/* The option table: getopt_long's tables and --help are both made from it (cli.h). */
static const cli_option opt_table[] = {
    {'n', {"-n"}, "LIST", "2,4", 0, "process counts, comma-separated, each from 2 to 64"},
    {'s',
     {"-s"},
     "LIST",
     "auto",
     0,
     "spin settings, comma-separated: auto (what coll__shm_watch() picks), > 0 polls with a "
     "pause, < 0 that many polls after a sched_yield(), 0 sleep in the futex at once"},
    {'r', {"-r"}, "N", "20000", 0, "rounds per repetition"},
    {'k', {"-k"}, "N", "5", 0, "repetitions; the median and the best are printed"},
    {'h', {"-h", "--help"}, NULL, NULL, 0, "this help"},
};
#define NOPTS (sizeof(opt_table) / sizeof(opt_table[0]))

static void usage(FILE *f)
{
    fprintf(f, "usage: shm-pingpong [-n LIST] [-s LIST] [-r N] [-k N]\n\n");
    cli_print_wrapped(f,
                      "One-way post -> wake latency of libcollective's shared-memory counters "
                      "between processes on one host, for each process count and spin setting.",
                      0);
    fprintf(f, "\n");
    cli_print_options(f, opt_table, NOPTS, 14, CLI_HELP_WIDTH);
    fprintf(f, "\nExit status: 0 done, 1 a configuration failed, 2 bad usage.\n");
}

int main(int argc, char **argv)
{
    int ns[16] = {2, 4}, nn = 2, spins[16] = {SPIN_AUTO}, nspin = 1, rounds = 20000, reps = 5;
    cli_getopt_tables g; /* shorts starts with ':': a missing value returns ':' */
    int built = cli_getopt_build(&g, opt_table, NOPTS);
    assert(built == 0); /* the table above is well-formed */
    (void)built;
    opterr = 0;
    int opt;
    char flag[16] = "";
    while ((opt = getopt_long(argc, argv, g.shorts, g.longopts, NULL)) != -1) {
        const cli_option *o = cli_by_id(opt_table, NOPTS, opt == ':' ? optopt : opt);
        if (o)
            cli_label(o, flag, sizeof flag);
        int rc = 0;
        switch (opt) {
        case 'n':
            rc = cli_parse_int_list(flag, optarg, 2, COLL__MAX_LOCAL, 0, ns, 16);
            nn = rc > 0 ? rc : nn;
            break;
        case 's':
            rc = cli_parse_int_list(flag, optarg, -100000000, 100000000, CLI_ALLOW_AUTO, spins, 16);
            nspin = rc > 0 ? rc : nspin;
            break;
        case 'r':
            rc = cli_parse_int(flag, optarg, 1, INT_MAX, &rounds);
            break;
        case 'k':
            rc = cli_parse_int(flag, optarg, 1, INT_MAX, &reps);
            break;
        case 'h':
            usage(stdout);
            return 0;
        case ':':
            fprintf(stderr, "shm-pingpong: %s needs a value\n", flag);
            return 2;
        default:
            fprintf(stderr, "shm-pingpong: unknown option '%s'\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
        if (cli_report(stderr, "shm-pingpong", rc) < 0)
            return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "shm-pingpong: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    printf("# one-way post->wake latency, us (median and best of %d x %d rounds)\n", reps, rounds);
    printf("%5s  %8s  %10s  %10s\n", "procs", "spin", "median", "best");
    int failed = 0;
    for (int i = 0; i < nn; i++)
        for (int j = 0; j < nspin; j++)
            failed |= run(ns[i], spins[j], rounds, reps);
    return failed;
}
