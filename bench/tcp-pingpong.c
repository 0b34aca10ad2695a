/*
 * tcp-pingpong: throughput and latency of libcollective's TCP layer (libcollective/tcp.c)
 * between two processes on this host, over loopback or a given local address.
 *
 * Two measurements, each between rank 0 and rank 1 forked from this program:
 *   exchange  both ranks send --bytes to each other at once (a two-rank ring step) with
 *             coll__tcp_xfer(); reported as bytes sent by one rank per second (GB/s = 1e9 B/s)
 *   latency   an 8-byte ping-pong (rank 0 sends, rank 1 echoes); reported as round-trip time
 *
 * --bufsize sets SO_SNDBUF/SO_RCVBUF on both ends after the connection is made (0: the
 * kernel's autotuning, which is what the library does), to see whether enlarging them helps.
 * Results are printed by rank 0. Not a test: nothing here is run by `meson test`.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "coll_internal.h"
#include "monoclock.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void die(const char *what, int rc)
{
    fprintf(stderr, "tcp-pingpong: %s: %d (%s)\n", what, rc,
            rc == COLL_EREMOTE ? "remote failed" : strerror(-rc));
    exit(1);
}

static void rank_main(coll__tcp *t, size_t nbytes, int reps, int iters, int bufsize)
{
    int peer = 1 - t->rank, culprit = -1, rc;
    rc = coll__tcp_conn(t, peer, mono_deadline_ns(10000));
    if (rc < 0)
        die("conn", rc);
    if (bufsize > 0) {
        setsockopt(rc, SOL_SOCKET, SO_SNDBUF, &bufsize, sizeof bufsize);
        setsockopt(rc, SOL_SOCKET, SO_RCVBUF, &bufsize, sizeof bufsize);
    }
    char *sbuf = malloc(nbytes), *rbuf = malloc(nbytes);
    if (!sbuf || !rbuf)
        die("malloc", -ENOMEM);
    memset(sbuf, t->rank + 1, nbytes);
    memset(rbuf, 0, nbytes);

    /* Exchange: one warm-up, then `reps` timed rounds. */
    double *sec = calloc((size_t)reps + (size_t)iters, sizeof *sec);
    struct iovec s = {sbuf, nbytes}, r = {rbuf, nbytes};
    for (int i = -1; i < reps; i++) {
        int64_t t0 = mono_now_ns();
        rc = coll__tcp_xfer(t, peer, &s, 1, peer, &r, 1, mono_deadline_ns(60000), &culprit);
        if (rc < 0)
            die("exchange", rc);
        if (i >= 0)
            sec[i] = (double)(mono_now_ns() - t0) * 1e-9;
    }
    if (t->rank == 0) {
        qsort(sec, (size_t)reps, sizeof *sec, cmp_double);
        printf("exchange %zu bytes each way: best %.2f GB/s, median %.2f GB/s per direction "
               "(%.1f ms median)\n",
               nbytes, (double)nbytes / sec[0] * 1e-9, (double)nbytes / sec[reps / 2] * 1e-9,
               sec[reps / 2] * 1e3);
    }

    /* Latency: 8-byte ping-pong. */
    uint64_t msg = 0;
    struct iovec m = {&msg, sizeof msg};
    for (int i = -100; i < iters; i++) {
        int64_t t0 = mono_now_ns();
        if (t->rank == 0) {
            rc = coll__tcp_xfer(t, peer, &m, 1, -1, NULL, 0, mono_deadline_ns(10000), &culprit);
            if (rc == 0)
                rc =
                    coll__tcp_xfer(t, -1, NULL, 0, peer, &m, 1, mono_deadline_ns(10000), &culprit);
        } else {
            rc = coll__tcp_xfer(t, -1, NULL, 0, peer, &m, 1, mono_deadline_ns(10000), &culprit);
            if (rc == 0)
                rc =
                    coll__tcp_xfer(t, peer, &m, 1, -1, NULL, 0, mono_deadline_ns(10000), &culprit);
        }
        if (rc < 0)
            die("ping-pong", rc);
        if (i >= 0)
            sec[i] = (double)(mono_now_ns() - t0) * 1e-9;
    }
    if (t->rank == 0) {
        qsort(sec, (size_t)iters, sizeof *sec, cmp_double);
        double sum = 0;
        for (int i = 0; i < iters; i++)
            sum += sec[i];
        printf("ping-pong 8 bytes: round trip median %.1f us, mean %.1f us, p99 %.1f us "
               "(%d round trips)\n",
               sec[iters / 2] * 1e6, sum / iters * 1e6, sec[iters * 99 / 100] * 1e6, iters);
    }
    free(sec);
    free(sbuf);
    free(rbuf);
}

int main(int argc, char **argv)
{
    size_t nbytes = 64u << 20;
    int reps = 10, iters = 10000, bufsize = 0;
    const char *host = "127.0.0.1";
    static const struct option opts[] = {{"bytes", required_argument, NULL, 'b'},
                                         {"reps", required_argument, NULL, 'r'},
                                         {"iters", required_argument, NULL, 'i'},
                                         {"bufsize", required_argument, NULL, 's'},
                                         {"host", required_argument, NULL, 'H'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    int c, bad = 0;
    while ((c = getopt_long(argc, argv, "b:r:i:s:H:h", opts, NULL)) != -1) {
        switch (c) {
        case 'b':
            bad = cli_parse_size("--bytes", optarg, 1, SIZE_MAX, &nbytes);
            break;
        case 'r':
            bad = cli_parse_int("--reps", optarg, 1, INT_MAX, &reps);
            break;
        case 'i':
            bad = cli_parse_int("--iters", optarg, 1, INT_MAX, &iters);
            break;
        case 's':
            bad = cli_parse_int("--bufsize", optarg, 0, INT_MAX, &bufsize);
            break;
        case 'H':
            host = optarg;
            break;
        default:
            printf("usage: tcp-pingpong [--bytes N] [--reps N] [--iters N] [--bufsize N] "
                   "[--host ADDR]\n");
            return c == 'h' ? 0 : 2;
        }
        if (cli_report(stderr, "tcp-pingpong", bad) < 0)
            return 2;
    }
    if (nbytes == 0 || reps < 1 || iters < 1) {
        fprintf(stderr, "tcp-pingpong: --bytes, --reps and --iters must be positive\n");
        return 2;
    }

    coll__tcp t[2];
    int ports[2], rc;
    for (int r = 0; r < 2; r++)
        if ((rc = coll__tcp_init(&t[r], r, 2, 42, host, NULL, &ports[r])) < 0)
            die("init", rc);
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        pids[r] = fork();
        if (pids[r] < 0)
            die("fork", -errno);
        if (pids[r] == 0) {
            coll__tcp_close(&t[1 - r]);
            for (int q = 0; q < 2; q++)
                coll__tcp_set_peer(&t[r], q, host, ports[q]);
            rank_main(&t[r], nbytes, reps, iters, bufsize);
            coll__tcp_close(&t[r]);
            fflush(stdout);
            _exit(0);
        }
    }
    coll__tcp_close(&t[0]);
    coll__tcp_close(&t[1]);
    int fail = 0;
    for (int r = 0; r < 2; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        fail |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    return fail;
}
