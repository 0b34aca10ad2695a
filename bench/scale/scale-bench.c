/*
 * scale-bench: ddprun's control plane at N nodes on one machine. Measures, per node count, the
 * time to a complete rendezvous round, the time for every rank to pass the job's first store
 * barrier, the time from a node's death to the next round, and what the root store did for
 * each (connections, requests by operation, bytes in and out, CPU time); then fits how each
 * figure grows with N and projects it, on paper, to SB_PROJECT_NODES nodes.
 *
 * Modes (see README.md):
 *   lightweight     N agent threads running ddprun's node rendezvous and monitor code and
 *                   N x G rank threads, against a ddp-rendezvous root (light.c); no process per
 *                   node, so N reaches 1024 and more on a laptop
 *   ddprun static   N real ddprun processes on loopback, node 0's embedded store the root
 *   ddprun c10d     N real ddprun processes, --nnodes N:N --rdzv-backend c10d, a ddp-rendezvous
 *                   process the endpoint and root (real.c)
 *   torchrun        N torchrun (torch 2.x) agents, static rendezvous, node 0's TCPStore
 * The real modes run bench/launch's barrier_worker, one per node.
 *
 * What it deliberately does not do: run under `meson test` beyond its --quick smoke test,
 * assert figures, or measure anything but loopback. The harness shares the machine's cores
 * with the root: wall times include the emulation's own scheduling, which the root's CPU time
 * (charged by the kernel to its process alone) does not.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "scale-bench.h"

#ifndef SCALE_BENCH_DDPRUN
#define SCALE_BENCH_DDPRUN "launcher/ddprun"
#endif
#ifndef SCALE_BENCH_SERVER
#define SCALE_BENCH_SERVER "rendezvous/ddp-rendezvous"
#endif
#ifndef SCALE_BENCH_WORKER
#define SCALE_BENCH_WORKER "bench/barrier_worker"
#endif

#define PROG "scale-bench"

enum {
    OPT_QUICK,
    OPT_LIGHT,
    OPT_REAL,
    OPT_TORCHRUN,
    OPT_RANKS,
    OPT_PROXY,
    OPT_BARRIER,
    OPT_HB,
    OPT_LAST_CALL,
    OPT_STEADY,
    OPT_TIMEOUT,
    OPT_JSON,
    OPT_DDPRUN,
    OPT_SERVER,
    OPT_WORKER,
    OPT_PYTHON,
    OPT_VERBOSE,
    OPT_HELP
};

/* The option table (cli.h): the parser below and usage() both walk it. */
static const cli_option g_options[] = {
    {OPT_QUICK,
     {"--quick"},
     NULL,
     NULL,
     0,
     "smoke run (< 30 s): lightweight 8 and 32 nodes x 4 ranks, real ddprun 4 and 8 nodes, no "
     "torchrun"},
    {OPT_LIGHT,
     {"--light-nodes"},
     "LIST",
     "64,256,1024",
     0,
     "node counts of lightweight mode, or none"},
    {OPT_REAL,
     {"--real-nodes"},
     "LIST",
     "64,256",
     0,
     "node counts of the real ddprun modes (static and c10d), or none"},
    {OPT_TORCHRUN,
     {"--torchrun-nodes"},
     "LIST",
     "8,16,32",
     0,
     "node counts of torchrun, or none (each agent imports torch: 64 nodes take about 14 GiB "
     "of memory)"},
    {OPT_RANKS, {"--ranks"}, "G", "8", 0, "emulated ranks per node in lightweight mode"},
    {OPT_PROXY,
     {"--proxy"},
     "on|off",
     "off",
     0,
     "ranks reach the root through a store proxy per node (ddprun --store-proxy)"},
    {OPT_BARRIER,
     {"--barrier"},
     "add|rdzv",
     "add",
     0,
     "lightweight ranks' first barrier: ADD then WAIT, as torch's elastic barrier, or "
     "rdzv_barrier() as ddprun's workers (a COMPARE_SET, an ADD and a WAIT per rank)"},
    {OPT_HB,
     {"--heartbeat-timeout"},
     "SECONDS",
     "5",
     0,
     "agents' heartbeat_timeout: a silent node counts as dead after this"},
    {OPT_LAST_CALL,
     {"--last-call"},
     "SECONDS",
     "0.5",
     0,
     "last_call_timeout of the elastic round after a node's death"},
    {OPT_STEADY,
     {"--steady"},
     "SECONDS",
     "2",
     0,
     "window in which the root's steady cost (monitors only) is measured"},
    {OPT_TIMEOUT, {"--timeout"}, "SECONDS", "120", 0, "bound of every phase and real run"},
    {OPT_JSON, {"--json"}, "FILE", NULL, 0, "also write every point, phase and fit as JSON"},
    {OPT_DDPRUN, {"--ddprun"}, "PATH", NULL, 0, "ddprun (default: the build tree's)"},
    {OPT_SERVER, {"--server"}, "PATH", NULL, 0, "ddp-rendezvous (default: the build tree's)"},
    {OPT_WORKER,
     {"--worker"},
     "PATH",
     NULL,
     0,
     "bench/launch's barrier_worker (default: the build tree's)"},
    {OPT_PYTHON, {"--python"}, "PATH", "python3", 0, "interpreter with torch 2.x for torchrun"},
    {OPT_VERBOSE, {"-v", "--verbose"}, NULL, NULL, 0, "progress on stderr"},
    {OPT_HELP, {"-h", "--help"}, NULL, NULL, 0, "this text"},
};
#define NOPTIONS (sizeof(g_options) / sizeof(g_options[0]))

static void usage(FILE *f)
{
    fprintf(f, "usage: " PROG " [options]\n"
               "Measures ddprun's control plane (rendezvous, first barrier, a node's death) at N "
               "nodes.\n\n");
    cli_print_options(f, g_options, NOPTIONS, 27, CLI_HELP_WIDTH);
    fprintf(f, "\nExit status: 0 every point ran (or was skipped), 1 a point failed, 2 bad "
               "usage.\n");
}

static int parse_nodes(const char *flag, const char *v, struct sb_config *cfg, enum sb_mode m,
                       enum sb_mode m2)
{
    int n = 0;
    if (strcmp(v, "none") != 0) {
        n = cli_parse_int_list(flag, v, 1, 65536, 0, cfg->nodes[m], SB_MAX_POINTS);
        if (cli_report(stderr, PROG, n) < 0)
            return -EINVAL;
    }
    cfg->npoints[m] = n;
    if (m2 != m) {
        memcpy(cfg->nodes[m2], cfg->nodes[m], sizeof cfg->nodes[m]);
        cfg->npoints[m2] = n;
    }
    return 0;
}

static int parse_args(int argc, char **argv, struct sb_config *cfg)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *eq = strchr(a, '=');
        size_t len = eq && a[0] == '-' && a[1] == '-' ? (size_t)(eq - a) : strlen(a);
        int k = cli_find(g_options, NOPTIONS, a, len, 0);
        if (cli_report(stderr, PROG, k) < 0)
            return -EINVAL;
        const cli_option *o = &g_options[k];
        const char *v = NULL;
        if (o->metavar) {
            v = len < strlen(a) ? a + len + 1 : i + 1 < argc ? argv[++i] : NULL;
            if (!v) {
                fprintf(stderr, PROG ": %s needs a value (%s)\n", a, o->metavar);
                return -EINVAL;
            }
        }
        int rc = 0, idx;
        switch (o->id) {
        case OPT_HELP:
            usage(stdout);
            exit(0);
        case OPT_QUICK:
            break; /* applied before the others by main() */
        case OPT_VERBOSE:
            cfg->verbose = true;
            break;
        case OPT_LIGHT:
            rc = parse_nodes(a, v, cfg, SB_LIGHT, SB_LIGHT);
            break;
        case OPT_REAL:
            rc = parse_nodes(a, v, cfg, SB_DDPRUN_STATIC, SB_DDPRUN_C10D);
            break;
        case OPT_TORCHRUN:
            rc = parse_nodes(a, v, cfg, SB_TORCHRUN, SB_TORCHRUN);
            break;
        case OPT_RANKS:
            rc = cli_report(stderr, PROG, cli_parse_int(a, v, 1, 1024, &cfg->ranks));
            break;
        case OPT_PROXY: {
            static const char *const onoff[] = {"off", "on", NULL};
            rc = cli_report(stderr, PROG, cli_parse_choice(a, v, "value", onoff, &idx));
            cfg->proxy = idx == 1;
            break;
        }
        case OPT_BARRIER: {
            static const char *const kinds[] = {"add", "rdzv", NULL};
            rc = cli_report(stderr, PROG, cli_parse_choice(a, v, "barrier", kinds, &idx));
            cfg->barrier_add = idx == 0;
            break;
        }
        case OPT_HB:
            rc = cli_report(stderr, PROG, cli_parse_seconds(a, v, 1, 3600, 0, &cfg->dead_after_s));
            break;
        case OPT_LAST_CALL:
            rc = cli_report(stderr, PROG,
                            cli_parse_seconds(a, v, 0, 3600, CLI_OPEN_MIN, &cfg->last_call_s));
            break;
        case OPT_STEADY:
            rc = cli_report(stderr, PROG,
                            cli_parse_seconds(a, v, 0, 3600, CLI_OPEN_MIN, &cfg->steady_s));
            break;
        case OPT_TIMEOUT:
            rc = cli_report(stderr, PROG, cli_parse_seconds(a, v, 1, 86400, 0, &cfg->timeout_s));
            break;
        case OPT_JSON:
            cfg->json = v;
            break;
        case OPT_DDPRUN:
            cfg->ddprun = v;
            break;
        case OPT_SERVER:
            cfg->server = v;
            break;
        case OPT_WORKER:
            cfg->worker = v;
            break;
        case OPT_PYTHON:
            cfg->python = v;
            break;
        }
        if (rc < 0)
            return -EINVAL;
    }
    return 0;
}

/* A program of the build tree, next to this one's directory (bench/): ../REL. */
static const char *beside(const char *rel)
{
    static char paths[4][PATH_MAX + 8];
    static int next;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return rel;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash)
        return rel;
    *slash = '\0';
    char *out = paths[next++ % 4];
    snprintf(out, PATH_MAX + 8, "%.*s/../%s", PATH_MAX - 64, exe, rel);
    return out;
}

static void set_defaults(struct sb_config *cfg, bool quick)
{
    static const int light[] = {64, 256, 1024}, real[] = {64, 256}, tr[] = {8, 16, 32};
    static const int qlight[] = {8, 32}, qreal[] = {4, 8};
    memset(cfg, 0, sizeof *cfg);
    const int *l = quick ? qlight : light, *r = quick ? qreal : real;
    cfg->npoints[SB_LIGHT] = quick ? 2 : 3;
    memcpy(cfg->nodes[SB_LIGHT], l, sizeof(int) * (size_t)cfg->npoints[SB_LIGHT]);
    cfg->npoints[SB_DDPRUN_STATIC] = cfg->npoints[SB_DDPRUN_C10D] = 2;
    memcpy(cfg->nodes[SB_DDPRUN_STATIC], r, sizeof(int) * 2);
    memcpy(cfg->nodes[SB_DDPRUN_C10D], r, sizeof(int) * 2);
    cfg->npoints[SB_TORCHRUN] = quick ? 0 : 3;
    memcpy(cfg->nodes[SB_TORCHRUN], tr, sizeof tr);
    cfg->ranks = quick ? 4 : 8;
    cfg->dead_after_s = quick ? 2 : 5;
    cfg->last_call_s = quick ? 0.2 : 0.5;
    cfg->steady_s = quick ? 0.5 : 2;
    cfg->timeout_s = quick ? 20 : 120;
    cfg->quick = quick;
    cfg->python = "python3";
    cfg->barrier_add = true;
}

int main(int argc, char **argv)
{
    struct sb_config cfg;
    bool quick = false;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--quick") == 0)
            quick = true;
    set_defaults(&cfg, quick);
    if (parse_args(argc, argv, &cfg) < 0)
        return 2;
    if (!cfg.ddprun)
        cfg.ddprun = beside(SCALE_BENCH_DDPRUN);
    if (!cfg.server)
        cfg.server = beside(SCALE_BENCH_SERVER);
    if (!cfg.worker)
        cfg.worker = beside(SCALE_BENCH_WORKER);
    const char *tmp = getenv("TMPDIR");
    cfg.tmpdir = tmp && *tmp ? tmp : "/tmp";
    if (access(cfg.server, X_OK) != 0) {
        fprintf(stderr, PROG ": %s: %s (give --server PATH)\n", cfg.server, strerror(errno));
        return 2;
    }
    if (cfg.proxy && !sb_have_proxy && cfg.npoints[SB_LIGHT]) {
        fprintf(stderr, PROG ": --proxy on: this build has no store proxy (rdzv_proxy_create); "
                             "give --light-nodes none to run the real modes alone\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    long nofile = sb_raise_nofile();
    if (cfg.verbose)
        fprintf(stderr, PROG ": descriptor limit %ld\n", nofile);

    static struct sb_point pts[SB_NMODES][SB_MAX_POINTS];
    int failed = 0;
    for (int md = 0; md < SB_NMODES; md++) {
        for (int i = 0; i < cfg.npoints[md]; i++) {
            struct sb_point *p = &pts[md][i];
            p->mode = (enum sb_mode)md;
            p->nodes = cfg.nodes[md][i];
            p->ranks = md == SB_LIGHT ? cfg.ranks : 1;
            if (cfg.verbose)
                fprintf(stderr, PROG ": %s, %d nodes x %d ranks ...\n", sb_mode_names[md], p->nodes,
                        p->ranks);
            int rc = md == SB_LIGHT ? sb_light_run(&cfg, p) : sb_real_run(&cfg, p);
            if (rc < 0 && !p->skipped)
                failed++;
            if (cfg.verbose)
                fprintf(stderr, PROG ":   %s%s\n",
                        p->ok        ? "done"
                        : p->skipped ? "skipped: "
                                     : "FAILED: ",
                        p->ok ? "" : p->err);
        }
        if (cfg.npoints[md]) {
            sb_report_mode(&cfg, pts[md], cfg.npoints[md]);
            fflush(stdout);
        }
    }
    if (cfg.json && sb_report_json(&cfg, pts, cfg.json) < 0) {
        fprintf(stderr, PROG ": cannot write %s\n", cfg.json);
        failed++;
    }
    return failed ? 1 : 0;
}
