/*
 * membw: this machine's memory bandwidth, the ceiling coll-bench's figures are read against.
 *
 *     membw [-s BYTES] [-t THREADS] [-r REPS] [--json FILE]
 *
 * Three kernels over arrays of -s bytes (256 MiB each by default, far beyond any cache):
 *
 *   copy   memcpy(c, a)             2 x BYTES moved (one read, one write)
 *   add    c[i] = a[i] + b[i], f32  3 x BYTES moved (two reads, one write): the access
 *                                   pattern of a two-rank reduction into a third buffer
 *   read   s += a[i], f32           1 x BYTES moved (reads only)
 *
 * each with one thread and with THREADS threads (default: the CPUs this process may run on),
 * every thread on its own contiguous slice. Rates count bytes the way STREAM does: what the
 * kernel reads and writes, not the extra read-for-ownership a normal store of a line not in
 * cache costs, so a write-heavy kernel can be limited below the bus's raw figure. Each row is
 * the best of -r repetitions (default 5); the arrays are written before the first one so that
 * no page fault is timed.
 *
 * What it deliberately does not do: pin threads, measure latency, or use non-temporal stores
 * (the collectives library does not use them either).
 *
 * Exit status: 0 done, 1 out of memory or a thread could not start, 2 bad usage.
 */
#include <assert.h>
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "monoclock.h"

#define MIB (1024.0 * 1024.0)

enum kernel { K_COPY, K_ADD, K_READ, K_COUNT };
static const char *const kernel_names[K_COUNT] = {"copy", "add", "read"};
static const int kernel_arrays[K_COUNT] = {2, 3, 1}; /* arrays of BYTES each touched per pass */

typedef struct shared {
    float *a, *b, *c;
    size_t n; /* elements per array */
    int nthreads;
    enum kernel k;
    pthread_barrier_t start, end;
    bool quit;
} shared;

typedef struct worker {
    shared *sh;
    int id;
    double sink; /* the read kernel's sum, so the compiler keeps the loop */
    pthread_t tid;
} worker;

static void slice(const shared *sh, int id, size_t *lo, size_t *hi)
{
    size_t per = sh->n / (size_t)sh->nthreads;
    *lo = per * (size_t)id;
    *hi = id == sh->nthreads - 1 ? sh->n : *lo + per;
}

static void run_kernel(worker *w)
{
    shared *sh = w->sh;
    size_t lo, hi;
    slice(sh, w->id, &lo, &hi);
    switch (sh->k) {
    case K_COPY:
        memcpy(sh->c + lo, sh->a + lo, (hi - lo) * sizeof(float));
        break;
    case K_ADD: {
        float *restrict c = sh->c;
        const float *restrict a = sh->a, *restrict b = sh->b;
        for (size_t i = lo; i < hi; i++)
            c[i] = a[i] + b[i];
        break;
    }
    case K_READ: {
        /* Eight partial sums so the loop is bound by memory, not by the add's latency. */
        float s[8] = {0};
        const float *a = sh->a;
        size_t i = lo;
        for (; i + 8 <= hi; i += 8)
            for (int j = 0; j < 8; j++)
                s[j] += a[i + j];
        for (; i < hi; i++)
            s[0] += a[i];
        double t = 0;
        for (int j = 0; j < 8; j++)
            t += s[j];
        w->sink += t;
        break;
    }
    default:
        break;
    }
}

/* Threads 1..n-1 loop here; thread 0 is the caller of measure(). */
static void *worker_main(void *arg)
{
    worker *w = arg;
    for (;;) {
        pthread_barrier_wait(&w->sh->start);
        if (w->sh->quit)
            return NULL;
        run_kernel(w);
        pthread_barrier_wait(&w->sh->end);
    }
}

/* One timed pass of kernel k on all of sh->nthreads threads; seconds from start to last end. */
static double pass(shared *sh, worker *w0, enum kernel k)
{
    sh->k = k;
    double t0 = mono_now_s();
    pthread_barrier_wait(&sh->start);
    run_kernel(w0);
    pthread_barrier_wait(&sh->end);
    return mono_now_s() - t0;
}

static int usable_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

enum { OPT_JSON = 256 };

/* The option table: getopt_long's tables and --help are both made from it (cli.h). */
static const cli_option opt_table[] = {
    {'s', {"-s", "--size"}, "BYTES", NULL, 0, "bytes per array, K/M/G suffixes (default 256M)"},
    {'t',
     {"-t", "--threads"},
     "N",
     NULL,
     0,
     "threads of the second set of rows (default: usable CPUs)"},
    {'r', {"-r", "--reps"}, "N", NULL, 0, "repetitions per row, the best is kept (default 5)"},
    {OPT_JSON, {"--json"}, "FILE", NULL, 0, "also write the rows as a JSON array"},
    {'h', {"-h", "--help"}, NULL, NULL, 0, "this help"},
};
#define NOPTS (sizeof(opt_table) / sizeof(opt_table[0]))

static void usage(FILE *f)
{
    fprintf(f, "usage: membw [-s BYTES] [-t THREADS] [-r REPS] [--json FILE]\n"
               "\n"
               "Memory bandwidth: copy (memcpy), add (c = a + b, f32) and read (sum, f32) over\n"
               "arrays of BYTES each, with 1 thread and with THREADS threads; best of REPS.\n"
               "\n");
    for (size_t i = 0; i < NOPTS; i++)
        cli_print_option(f, &opt_table[i], NULL, 23, CLI_HELP_WIDTH);
    fprintf(f, "\nExit status: 0 done, 1 out of memory or no threads, 2 bad usage.\n");
}

int main(int argc, char **argv)
{
    size_t bytes = 256u << 20;
    int nthreads = usable_cpus(), reps = 5;
    const char *json = NULL;
    cli_getopt_tables g; /* shorts starts with ':': a missing value returns ':' */
    int built = cli_getopt_build(&g, opt_table, NOPTS);
    assert(built == 0); /* the table above is well-formed */
    (void)built;
    opterr = 0;
    int c, rc = 0;
    char flag[32];
    while ((c = getopt_long(argc, argv, g.shorts, g.longopts, NULL)) != -1) {
        const cli_option *o = cli_by_id(opt_table, NOPTS, c);
        if (o)
            cli_label(o, flag, sizeof(flag));
        switch (c) {
        case 'h':
            usage(stdout);
            return 0;
        case 's':
            rc = cli_parse_size(flag, optarg, 0, SIZE_MAX, &bytes);
            break;
        case 't':
            rc = cli_parse_int(flag, optarg, 1, 1 << 20, &nthreads);
            break;
        case 'r':
            rc = cli_parse_int(flag, optarg, 1, 1 << 20, &reps);
            break;
        case OPT_JSON:
            json = optarg;
            break;
        case ':':
            o = cli_by_id(opt_table, NOPTS, optopt);
            fprintf(stderr, "membw: %s needs a value\n",
                    o ? cli_label(o, flag, sizeof(flag)) : "option");
            return 2;
        default:
            fprintf(stderr, "membw: unknown option '%s'\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
        if (cli_report(stderr, "membw", rc) < 0)
            return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "membw: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    size_t n = bytes / sizeof(float);
    if (n < (size_t)nthreads * 1024) {
        fprintf(stderr, "membw: -s: %zu bytes is too small for %d threads\n", bytes, nthreads);
        return 2;
    }
    bytes = n * sizeof(float);

    shared sh = {.n = n};
    sh.a = aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
    sh.b = aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
    sh.c = aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
    if (!sh.a || !sh.b || !sh.c) {
        fprintf(stderr, "membw: cannot allocate 3 x %zu bytes\n", bytes);
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        sh.a[i] = (float)(i & 1023);
        sh.b[i] = 1.0f;
        sh.c[i] = 0.0f;
    }

    int counts[2] = {1, nthreads};
    int nsets = nthreads > 1 ? 2 : 1;
    double best[2][K_COUNT];
    double sink = 0;
    for (int s = 0; s < nsets; s++) {
        int nt = counts[s];
        worker *w = calloc((size_t)nt, sizeof(*w));
        if (!w) {
            fprintf(stderr, "membw: out of memory\n");
            return 1;
        }
        sh.nthreads = nt;
        sh.quit = false;
        pthread_barrier_init(&sh.start, NULL, (unsigned)nt);
        pthread_barrier_init(&sh.end, NULL, (unsigned)nt);
        for (int t = 0; t < nt; t++) {
            w[t].sh = &sh;
            w[t].id = t;
            if (t > 0 && pthread_create(&w[t].tid, NULL, worker_main, &w[t]) != 0) {
                fprintf(stderr, "membw: cannot start thread %d\n", t);
                return 1;
            }
        }
        for (int k = 0; k < K_COUNT; k++) {
            pass(&sh, &w[0], (enum kernel)k); /* warm-up: caches, TLB, frequency */
            double b = 1e30;
            for (int r = 0; r < reps; r++) {
                double t = pass(&sh, &w[0], (enum kernel)k);
                if (t < b)
                    b = t;
            }
            best[s][k] = (double)bytes * kernel_arrays[k] / b / 1e9;
        }
        sh.quit = true;
        pthread_barrier_wait(&sh.start);
        for (int t = 0; t < nt; t++) {
            if (t > 0)
                pthread_join(w[t].tid, NULL);
            sink += w[t].sink;
        }
        pthread_barrier_destroy(&sh.start);
        pthread_barrier_destroy(&sh.end);
        free(w);
    }

    printf("# membw: arrays of %.0f MiB, best of %d; GB/s = 1e9 bytes/s, bytes as STREAM counts "
           "them\n",
           (double)bytes / MIB, reps);
    printf("# %8s %8s %10s\n", "kernel", "threads", "GB/s");
    for (int s = 0; s < nsets; s++)
        for (int k = 0; k < K_COUNT; k++)
            printf("  %8s %8d %10.2f\n", kernel_names[k], counts[s], best[s][k]);
    if (sink == 42.4242)
        printf("#\n"); /* keeps the read kernel's result alive */

    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            fprintf(stderr, "membw: --json: cannot open %s: %s\n", json, strerror(errno));
            return 1;
        }
        fprintf(f, "[");
        for (int s = 0; s < nsets; s++)
            for (int k = 0; k < K_COUNT; k++)
                fprintf(f,
                        "%s\n {\"kernel\": \"%s\", \"threads\": %d, \"bytes\": %zu, "
                        "\"gbs\": %.3f}",
                        s + k ? "," : "", kernel_names[k], counts[s], bytes, best[s][k]);
        fprintf(f, "\n]\n");
        if (fclose(f) != 0) {
            fprintf(stderr, "membw: --json: cannot write %s: %s\n", json, strerror(errno));
            return 1;
        }
    }
    free(sh.a);
    free(sh.b);
    free(sh.c);
    return 0;
}
