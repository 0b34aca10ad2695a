/*
 * store-bench: measures ddp-rendezvous's store server against PyTorch's TCPStore servers, in one
 * run, over the c10d wire protocol spoken directly on sockets.
 *
 * Each protocol generation is compared like with like: ddp-rendezvous spoken to in the legacy
 * protocol against torch 1.13's server, and in the modern protocol (VALIDATE first) against
 * torch 2.x's libuv server. Every server runs as a child process: ours as `ddp-rendezvous serve
 * --bind 127.0.0.1 --port 0`, torch's through bench/store/torch_store_server.py. Measurements:
 * SET+GET round trips per second on 1 and 32 connections with 64 B and 1 MiB values (and the
 * mean time of one round trip on one connection), and the time for N connections to pass a
 * barrier (connect, ADD a counter, WAIT for a key that the last arrival SETs).
 *
 * What it deliberately does not do: use librendezvous's client or server code (it links only the
 * request encoder of proto.c, which the client and the tests share; every frame it builds also
 * goes to PyTorch's servers, so a fault in that encoder shows up as a failure against them),
 * measure anything but the loopback interface, or run under `meson test`.
 *
 * Client and server share the machine's cores (two on the development box): every rate
 * includes the client's own CPU time. To keep that share small and equal for every server, the
 * client is one thread driving non-blocking sockets through epoll (one blocking socket for the
 * single-connection case), all frames are built once and patched in place, and buffers are
 * allocated before the clock starts. (The only other threads copy the servers' stdout into
 * their logs and are idle while measuring.) Because the rates depend on how busy the cores
 * are, the server's own CPU time per round trip is reported too, and each round-trip row is
 * the best of several runs alternating between the two servers.
 *
 * Invariants: at most one request is outstanding per connection; every reply is checked (GET
 * returns the value just SET, identified by a sequence number in its first 8 bytes; ADD
 * results are unique and within 1..N; WAIT answers STOP_WAITING), so a misbehaving server shows
 * up as a failure with a description, never as a fast number.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli.h"
#include "store-bench.h"

#ifndef STORE_BENCH_SCRIPT
#define STORE_BENCH_SCRIPT "bench/store/torch_store_server.py"
#endif

/* ---------------------------------------------------------------------------------------- */
/* Options                                                                                  */
/* ---------------------------------------------------------------------------------------- */

enum {
    OPT_SERVER,
    OPT_QUICK,
    OPT_ONLY,
    OPT_ROWS,
    OPT_PROTOCOL,
    OPT_JSON,
    OPT_REPS,
    OPT_PY_LEGACY,
    OPT_PY_MODERN,
    OPT_SCRIPT,
    OPT_PIN,
    OPT_VERBOSE,
    OPT_HELP,
    OPT_PROXY_ROWS
};

/* The option table (cli.h): the parser below and usage() both walk it. */
static const cli_option g_options[] = {
    {OPT_SERVER,
     {"--server"},
     "PATH",
     NULL,
     0,
     "ddp-rendezvous binary (default: ../rendezvous/ddp-rendezvous next to this program)"},
    {OPT_QUICK,
     {"--quick"},
     NULL,
     NULL,
     0,
     "smoke run: short timings, barriers of 100 and 400 only (< 10 s)"},
    {OPT_ONLY,
     {"--only"},
     "WHICH",
     NULL,
     0,
     "run only ours, torch113 or torch2 (repeat to run several)"},
    {OPT_ROWS,
     {"--rows"},
     "LIST",
     NULL,
     0,
     "comma-separated rows to run: rate1, rate1-mib, rate32, rate32-mib, barrier (default all)"},
    {OPT_PROTOCOL,
     {"--protocol"},
     "GEN",
     NULL,
     0,
     "run only the legacy or the modern section (default both)"},
    {OPT_JSON, {"--json"}, "FILE", NULL, 0, "also write the results as JSON"},
    {OPT_REPS,
     {"--reps"},
     "N",
     NULL,
     0,
     "runs per round-trip row and server, best kept (default 3, --quick 1)"},
    {OPT_PY_LEGACY,
     {"--python-legacy"},
     "PATH",
     NULL,
     0,
     "interpreter with torch 1.x (default /usr/bin/python3)"},
    {OPT_PY_MODERN,
     {"--python-modern"},
     "PATH",
     NULL,
     0,
     "interpreter with torch >= 2.2 (default python3 from PATH)"},
    {OPT_SCRIPT,
     {"--script"},
     "PATH",
     NULL,
     0,
     "torch_store_server.py (default " STORE_BENCH_SCRIPT ")"},
    {OPT_PIN, {"--pin"}, NULL, NULL, 0, "run the client on CPU 0 and every server on CPU 1"},
    {OPT_VERBOSE, {"-v", "--verbose"}, NULL, NULL, 0, "progress and barrier phase times on stderr"},
    {OPT_HELP, {"-h", "--help"}, NULL, NULL, 0, "this text"},
    {OPT_PROXY_ROWS,
     {"--proxy-rows"},
     "on|off",
     NULL,
     0,
     "modern section, with rate32: also 32 conn through a ddp-rendezvous proxy (default on)"},
};
#define NOPTIONS (sizeof(g_options) / sizeof(g_options[0]))

static void usage(FILE *f)
{
    fprintf(f, "usage: store-bench [options]\n"
               "Compares ddp-rendezvous's store server with PyTorch's TCPStore servers.\n\n");
    for (size_t i = 0; i < NOPTIONS; i++)
        cli_print_option(f, &g_options[i], NULL, 25, 0);
    fprintf(f, "\nExit status: 0 all selected measurements ran, 1 a server failed or misbehaved,"
               " 2 bad usage.\n");
}

/* Parses --rows LIST into cfg->rows. Returns 0, or -EINVAL after saying which name is wrong. */
static int parse_rows(const char *list, struct config *cfg)
{
    static const char *const names[] = {"rate1", "rate1-mib", "rate32", "rate32-mib", "barrier"};
    const char *p = list;
    cfg->rows = 0;
    while (*p) {
        size_t n = strcspn(p, ",");
        unsigned k = 0;
        while (k < sizeof(names) / sizeof(names[0]) &&
               (strlen(names[k]) != n || strncmp(p, names[k], n) != 0))
            k++;
        if (k == sizeof(names) / sizeof(names[0])) {
            fprintf(stderr,
                    "store-bench: --rows: unknown row '%.*s' (rows: rate1, rate1-mib, rate32, "
                    "rate32-mib, barrier)\n",
                    (int)n, p);
            return -EINVAL;
        }
        cfg->rows |= 1u << k;
        p += n + (p[n] == ',');
    }
    if (!cfg->rows) {
        fprintf(stderr, "store-bench: --rows needs at least one row\n");
        return -EINVAL;
    }
    return 0;
}

/* The default ddp-rendezvous: the build tree's rendezvous/ next to bench/. */
static char *default_server(void)
{
    char exe[PATH_MAX], *slash, *path;
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return NULL;
    exe[n] = '\0';
    slash = strrchr(exe, '/');
    if (!slash)
        return NULL;
    *slash = '\0';
    size_t size = strlen(exe) + 64;
    path = xmalloc(size);
    snprintf(path, size, "%s/../rendezvous/ddp-rendezvous", exe);
    return path;
}

static int parse_args(int argc, char **argv, struct config *cfg)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int k = cli_find(g_options, NOPTIONS, a, strlen(a), 0);
        if (k < 0) {
            fprintf(stderr, "store-bench: unknown option %s (see --help)\n", a);
            return -EINVAL;
        }
        const cli_option *o = &g_options[k];
        if (o->metavar && !v) {
            fprintf(stderr, "store-bench: %s needs an argument\n", a);
            return -EINVAL;
        }
        switch (o->id) {
        case OPT_HELP:
            usage(stdout);
            exit(0);
        case OPT_QUICK:
            cfg->quick = true;
            break;
        case OPT_PIN:
            cfg->pin = true;
            break;
        case OPT_VERBOSE:
            cfg->verbose = true;
            break;
        case OPT_SERVER:
            cfg->ours = v;
            break;
        case OPT_JSON:
            cfg->json = v;
            break;
        case OPT_PY_LEGACY:
            cfg->py_legacy = v;
            break;
        case OPT_PY_MODERN:
            cfg->py_modern = v;
            break;
        case OPT_SCRIPT:
            cfg->script = v;
            break;
        case OPT_REPS: {
            int n;
            if (cli_report(stderr, "store-bench", cli_parse_int(a, v, 1, 100, &n)) < 0)
                return -EINVAL;
            cfg->reps = (unsigned)n;
            break;
        }
        case OPT_ROWS:
            if (parse_rows(v, cfg) < 0)
                return -EINVAL;
            break;
        case OPT_PROXY_ROWS: {
            static const char *const onoff[] = {"off", "on", NULL};
            int on;
            if (cli_report(stderr, "store-bench", cli_parse_choice(a, v, "value", onoff, &on)) < 0)
                return -EINVAL;
            cfg->proxy_rows = on == 1;
            break;
        }
        case OPT_PROTOCOL:
            if (strcmp(v, "legacy") == 0 || strcmp(v, "modern") == 0) {
                cfg->gens[0] = strcmp(v, "legacy") == 0;
                cfg->gens[1] = !cfg->gens[0];
            } else {
                fprintf(stderr, "store-bench: --protocol takes legacy or modern\n");
                return -EINVAL;
            }
            break;
        case OPT_ONLY:
            if (strcmp(v, "ours") == 0)
                cfg->only_ours = true;
            else if (strcmp(v, "torch113") == 0)
                cfg->only_t113 = true;
            else if (strcmp(v, "torch2") == 0)
                cfg->only_t2 = true;
            else {
                fprintf(stderr, "store-bench: --only takes ours, torch113 or torch2\n");
                return -EINVAL;
            }
            break;
        }
        if (o->metavar)
            i++;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct config cfg = {
        .script = STORE_BENCH_SCRIPT,
        .py_legacy = "/usr/bin/python3",
        .py_modern = "python3",
        .rows = ROW_ALL,
        .gens = {true, true},
        .proxy_rows = true,
    };
    struct section secs[2];
    struct rlimit rl;
    bool any_only;
    char *def = NULL;
    const char *ours_skip = NULL;
    double busy0, own0;
    uint64_t wall0;

    if (parse_args(argc, argv, &cfg) < 0)
        return 2;
    any_only = cfg.only_ours || cfg.only_t113 || cfg.only_t2;
    if (cfg.quick) {
        cfg.reps = cfg.reps ? cfg.reps : 1;
        cfg.t = (struct rt_timing){30 * 1000000ull, 100 * 1000000ull};
        cfg.barrier_n[0] = 100;
        cfg.barrier_n[1] = 400;
        cfg.nbarriers = 2;
    } else {
        cfg.reps = cfg.reps ? cfg.reps : 3;
        cfg.t = (struct rt_timing){200 * 1000000ull, 500 * 1000000ull};
        cfg.barrier_n[0] = 1000;
        cfg.barrier_n[1] = 4000;
        cfg.barrier_n[2] = 10000;
        cfg.nbarriers = 3;
    }
    if (!cfg.ours)
        cfg.ours = def = default_server();
    if (!cfg.ours || access(cfg.ours, X_OK) != 0)
        ours_skip = "ddp-rendezvous not found or not executable (give --server PATH)";
    if (access(cfg.script, R_OK) != 0) {
        fprintf(stderr, "store-bench: %s: %s (give --script PATH)\n", cfg.script, strerror(errno));
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    if (cfg.pin) {
        if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
            fprintf(stderr, "store-bench: --pin needs two CPUs\n");
            return 2;
        }
        g_server_cpu = 1;
        pin_to(0);
    }
    /* The barrier holds N sockets at once. */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }

    if (cfg.pin)
        printf("store-bench%s: loopback, client pinned to CPU 0, servers to CPU 1\n",
               cfg.quick ? " --quick" : "");
    else
        printf("store-bench%s: loopback, %ld CPUs shared by the client and the server under "
               "test\n",
               cfg.quick ? " --quick" : "", sysconf(_SC_NPROCESSORS_ONLN));
    printf("ours: %s serve\n", cfg.ours ? cfg.ours : "(none)");
    printf("round trips: best of %u x (%.2f s warm-up + %.2f s counted) per row and server; "
           "barriers: %s\n",
           cfg.reps, (double)cfg.t.warm_ns / 1e9, (double)cfg.t.run_ns / 1e9,
           cfg.quick ? "one server for all N, distinct keys" : "fresh servers per N");
    fflush(stdout);
    busy0 = machine_busy_s();
    own0 = own_cpu_s();
    wall0 = now_ns();

    section_init(&secs[0], &gen_legacy, &cfg);
    section_init(&secs[1], &gen_modern, &cfg);
    for (int s = 0; s < 2; s++) {
        secs[s].run[SRV_OURS] = cfg.gens[s] && (!any_only || cfg.only_ours);
        secs[s].skip[SRV_OURS] = ours_skip;
    }
    secs[0].run[SRV_TORCH] = cfg.gens[0] && (!any_only || cfg.only_t113);
    secs[1].run[SRV_TORCH] = cfg.gens[1] && (!any_only || cfg.only_t2);

    /* Start every server at once: importing torch takes seconds and idle servers cost nothing. */
    for (int s = 0; s < 2; s++)
        spawn_pair(&secs[s], &cfg);
    for (int s = 0; s < 2; s++)
        ready_pair(&secs[s]);
    for (int s = 0; s < 2; s++) {
        if (!secs[s].run[0] && !secs[s].run[1])
            continue;
        run_section(&secs[s], &cfg);
        print_section(&secs[s], &cfg);
        fflush(stdout);
    }

    if (busy0 >= 0) {
        double wall = (double)(now_ns() - wall0) / 1e9;
        double other = machine_busy_s() - busy0 - (own_cpu_s() - own0);
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        if (other < 0)
            other = 0;
        printf("\nother processes used %.1f of %.1f core-seconds during the run (%.0f%%)%s\n",
               other, wall * (double)cpus, 100.0 * other / (wall * (double)cpus),
               other > 0.1 * wall * (double)cpus ? ": the cores were shared, expect noise" : "");
    }
    if (g_failures) {
        printf("\nfailures:\n");
        for (int s = 0; s < 2; s++)
            for (unsigned i = 0; i < secs[s].nrows; i++)
                for (int k = 0; k < 2; k++)
                    if (secs[s].rows[i].c[k].err)
                        printf("  %s\n", secs[s].rows[i].c[k].err);
        for (int i = 0; i < g_nnotes; i++)
            printf("  %s\n", g_notes[i]);
    }
    if (cfg.json) {
        int rc = write_json(cfg.json, secs, 2, &cfg);
        if (rc < 0)
            fprintf(stderr, "store-bench: %s: %s\n", cfg.json, strerror(-rc));
    }
    free(def);
    return g_failures ? 1 : 0;
}
