/*
 * real.c: real-process mode. N launcher processes on loopback, one per node, each with one
 * worker, bench/launch's barrier_worker (its ranks pass one rdzv_barrier() of the whole world
 * and record, on the wall clock, when they started, connected and passed):
 *
 *   ddprun static   ddprun --nnodes N --node-rank i --master-addr 127.0.0.1 --master-port P
 *                   --nproc-per-node 1 --no-python barrier_worker DIR; node 0's ddprun hosts
 *                   the store, the root
 *   ddprun c10d     ddprun --nnodes N:N --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:P
 *                   --rdzv-id ID ...; the endpoint is a ddp-rendezvous process (root.c), the
 *                   root, so no agent hosts it
 *   torchrun        python3 -m torch.distributed.run with the static arguments (torch 2.x;
 *                   barrier_worker speaks the 2.2+ store protocol, so torch 1.13's torchrun
 *                   cannot host its store)
 *
 * Measured from the first fork: the last worker's start, the last rank's pass of the barrier,
 * the last launcher's exit; and the root's peak of established connections (from
 * /proc/net/tcp, for every root), its requests and bytes (STATUS, where the root answers it:
 * not torch's) and its process's CPU time, which for a launcher hosting the store includes its
 * own agent (and, for torchrun, the interpreter's start and torch's import). Every node's
 * output goes to a log in the run's directory, kept when the run fails.
 *
 * Not here: a node's death (lightweight mode measures it; bench/rdzv does it with processes).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "monoclock.h"
#include "rdzv.h"
#include "scale-bench.h"

#define POLL_MS 20

/* Wall-clock nanoseconds, the clock of barrier_worker's stamps. */
static int64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* A free TCP port on 127.0.0.1 (asked of the kernel; free again when this returns). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -EADDRNOTAVAIL;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

/* Established TCP connections whose local port is `port` (the server's ends), IPv4 and 6. */
static int count_established(int port)
{
    static const char *const files[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    int n = 0;
    for (int f = 0; f < 2; f++) {
        FILE *fp = fopen(files[f], "re");
        if (!fp)
            continue;
        char line[512];
        unsigned lport, st;
        if (!fgets(line, sizeof line, fp)) { /* the header */
            fclose(fp);
            continue;
        }
        while (fgets(line, sizeof line, fp))
            if (sscanf(line, " %*d: %*[0-9A-Fa-f]:%x %*[0-9A-Fa-f]:%*x %x", &lport, &st) == 2 &&
                (int)lport == port && st == 1)
                n++;
        fclose(fp);
    }
    return n;
}

/* Whether `ddprun --help` lists --store-proxy. */
static bool has_store_proxy(const char *ddprun)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "'%s' --help 2>/dev/null | grep -q -- --store-proxy", ddprun);
    return system(cmd) == 0;
}

struct run {
    const struct sb_config *cfg;
    struct sb_point *p;
    char dir[4096];
    int n, port;
    pid_t *pids;
    int64_t *exit_ns; /* wall clock; 0 while running */
    int nrunning;
};

static pid_t spawn_node(struct run *r, int i, char *const argv[])
{
    char log[4200];
    snprintf(log, sizeof log, "%s/node%d.log", r->dir, i);
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int null = open("/dev/null", O_RDONLY);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        if (null >= 0)
            dup2(null, 0);
        execvp(argv[0], argv);
        dprintf(2, "scale-bench: cannot execute %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

/* Builds node i's command line into argv (strings in buf) for the run's mode. */
static void node_argv(struct run *r, int i, bool proxy_flag, char *argv[], char buf[][4200])
{
    const struct sb_config *cfg = r->cfg;
    int k = 0, b = 0;
#define ARG(...) (snprintf(buf[b], 4200, __VA_ARGS__), argv[k++] = buf[b++])
    if (r->p->mode == SB_TORCHRUN) {
        ARG("%s", cfg->python);
        ARG("-m");
        ARG("torch.distributed.run");
    } else {
        ARG("%s", cfg->ddprun);
    }
    if (r->p->mode == SB_DDPRUN_C10D) {
        ARG("--nnodes");
        ARG("%d:%d", r->n, r->n);
        ARG("--rdzv-backend");
        ARG("c10d");
        ARG("--rdzv-endpoint");
        ARG("127.0.0.1:%d", r->port);
        ARG("--rdzv-id");
        ARG("scale-bench-%d", (int)getpid());
    } else {
        ARG("--nnodes");
        ARG("%d", r->n);
        ARG("--node-rank");
        ARG("%d", i);
        ARG("--master-addr");
        ARG("127.0.0.1");
        ARG("--master-port");
        ARG("%d", r->port);
    }
    if (proxy_flag) {
        ARG("--store-proxy");
        ARG("%s", cfg->proxy ? "on" : "off");
    }
    ARG("--nproc-per-node");
    ARG("1");
    ARG("--no-python");
    ARG("%s", cfg->worker);
    ARG("%s", r->dir);
#undef ARG
    argv[k] = NULL;
}

/* Reaps exited nodes; returns how many are still running. */
static int reap(struct run *r)
{
    int st;
    for (int i = 0; i < r->n; i++)
        if (r->pids[i] > 0 && !r->exit_ns[i] && waitpid(r->pids[i], &st, WNOHANG) == r->pids[i]) {
            r->exit_ns[i] = wall_ns();
            r->nrunning--;
            if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && !r->p->err[0])
                snprintf(r->p->err, sizeof r->p->err, "node %d %s %d (log: %.300s/node%d.log)", i,
                         WIFEXITED(st) ? "exited with status" : "killed by signal",
                         WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), r->dir, i);
        }
    return r->nrunning;
}

/* The ranks' stamps: the latest start and pass, relative to t0 in seconds. */
static int read_ranks(struct run *r, int64_t t0, double *started, double *passed)
{
    int64_t max_start = 0, max_pass = 0;
    for (int i = 0; i < r->n; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/rank%d", r->dir, i);
        FILE *f = fopen(path, "re");
        int rank;
        int64_t s, c, ps;
        int ok = f && fscanf(f, "%d %" SCNd64 " %" SCNd64 " %" SCNd64, &rank, &s, &c, &ps) == 4;
        if (f)
            fclose(f);
        if (!ok) {
            snprintf(r->p->err, sizeof r->p->err, "rank %d left no record in %.300s", i, r->dir);
            return -ENOENT;
        }
        if (s > max_start)
            max_start = s;
        if (ps > max_pass)
            max_pass = ps;
    }
    *started = (double)(max_start - t0) / 1e9;
    *passed = (double)(max_pass - t0) / 1e9;
    return 0;
}

static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[4400];
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    if (d)
        closedir(d);
    rmdir(dir);
}

static double children_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

int sb_real_run(const struct sb_config *cfg, struct sb_point *p)
{
    struct run r = {.cfg = cfg, .p = p, .n = p->nodes};
    struct sb_root root = {.pid = -1};
    int rc = 0;
    const char *prog = p->mode == SB_TORCHRUN ? cfg->python : cfg->ddprun;
    bool proxy_flag = false;

    if (p->mode == SB_TORCHRUN) {
        char cmd[4200];
        snprintf(cmd, sizeof cmd,
                 "'%s' -c 'import torch, sys; sys.exit(int(torch.__version__[0]) < 2)'"
                 " >/dev/null 2>&1",
                 cfg->python);
        if (system(cmd) != 0) {
            p->skipped = true;
            snprintf(p->err, sizeof p->err, "%s has no torch 2.x", cfg->python);
            return -ENOENT;
        }
    } else {
        if (access(cfg->ddprun, X_OK) != 0) {
            p->skipped = true;
            snprintf(p->err, sizeof p->err, "%s: %s (give --ddprun)", cfg->ddprun, strerror(errno));
            return -ENOENT;
        }
        proxy_flag = has_store_proxy(cfg->ddprun);
        if (cfg->proxy && !proxy_flag) {
            p->skipped = true;
            snprintf(p->err, sizeof p->err, "--proxy on: %s has no --store-proxy", cfg->ddprun);
            return -ENOTSUP;
        }
    }
    if (access(cfg->worker, X_OK) != 0) {
        p->skipped = true;
        snprintf(p->err, sizeof p->err, "%s: %s (give --worker)", cfg->worker, strerror(errno));
        return -ENOENT;
    }
    snprintf(r.dir, sizeof r.dir, "%s/scale-bench.XXXXXX", cfg->tmpdir);
    r.pids = calloc((size_t)r.n, sizeof *r.pids);
    r.exit_ns = calloc((size_t)r.n, sizeof *r.exit_ns);
    if (!r.pids || !r.exit_ns || !mkdtemp(r.dir)) {
        snprintf(p->err, sizeof p->err, "cannot create %.300s: %s", r.dir, strerror(errno));
        rc = -EIO;
        goto out;
    }
    if (p->mode == SB_DDPRUN_C10D) {
        rc = sb_root_start(&root, cfg->server, r.dir, p->err, sizeof p->err);
        if (rc < 0)
            goto out;
        r.port = root.port;
    } else {
        r.port = free_port();
        if (r.port < 0) {
            rc = r.port;
            snprintf(p->err, sizeof p->err, "no free port: %s", strerror(-rc));
            goto out;
        }
    }

    struct sb_stats s0 = {0}, last = {0};
    if (root.pid > 0)
        sb_root_sample(&root, &s0);
    double cpu_children0 = children_cpu_s();
    int64_t t0 = wall_ns(), deadline = mono_deadline_ns((int)(cfg->timeout_s * 1000));
    for (int i = 0; i < r.n; i++) {
        char *argv[40], buf[40][4200];
        node_argv(&r, i, proxy_flag, argv, buf);
        r.pids[i] = spawn_node(&r, i, argv);
        if (r.pids[i] < 0) {
            snprintf(p->err, sizeof p->err, "fork: %s", strerror(errno));
            rc = -EAGAIN;
            goto kill;
        }
        r.nrunning++;
    }

    /* Poll: reap, and sample the root (its CPU, connections and, where it answers, STATUS). */
    int peak = 0;
    int64_t root_cpu = -1;
    bool status_dead = p->mode == SB_TORCHRUN;
    rdzv_client *sc = NULL;
    while (reap(&r) > 0) {
        if (mono_ms_left(deadline) == 0) {
            snprintf(p->err, sizeof p->err,
                     "%d of %d nodes still running after %g s (logs: %.300s)", r.nrunning, r.n,
                     cfg->timeout_s, r.dir);
            rc = -ETIMEDOUT;
            goto kill;
        }
        pid_t rp = root.pid > 0 ? root.pid : r.exit_ns[0] ? -1 : r.pids[0];
        if (rp > 0) {
            int64_t c = cpu_used_ns(rp);
            if (c >= 0)
                root_cpu = c;
        }
        int est = count_established(r.port);
        if (est > peak)
            peak = est;
        if (root.pid < 0 && !status_dead && !r.exit_ns[0]) {
            /* Node 0's embedded store: STATUS on a connection of ours while it serves. */
            if (!sc) {
                rdzv_client_options co;
                rdzv_client_options_init(&co);
                co.connect_timeout_ms = 200;
                co.refused_timeout_ms = 0;
                co.timeout_ms = 2000;
                rdzv_client_connect("127.0.0.1", r.port, &co, &sc);
            }
            char *json = NULL;
            if (sc && rdzv_status(sc, &json) == 0)
                sb_stats_parse(json, &last);
            else if (sc) {
                rdzv_client_close(sc);
                sc = NULL;
            }
            rdzv_free(json);
        }
        mono_sleep_until(mono_now_ns() + POLL_MS * 1000000LL);
    }
    rdzv_client_close(sc);
    if (p->err[0]) {
        rc = -EIO;
        goto out;
    }
    double started, passed;
    rc = read_ranks(&r, t0, &started, &passed);
    if (rc < 0)
        goto out;
    int64_t last_exit = 0;
    for (int i = 0; i < r.n; i++)
        if (r.exit_ns[i] > last_exit)
            last_exit = r.exit_ns[i];
    if (root.pid > 0) {
        sb_root_sample(&root, &last);
        root_cpu = last.cpu_ns;
    } else {
        /* Node 0's store started with this run: its counters count from zero. */
        s0 = (struct sb_stats){.have_status = last.have_status, .have_traffic = last.have_traffic};
        if (last.conns > 0)
            last.conns--; /* our STATUS connection */
    }
    struct sb_phase *ph = &p->ph[p->nphases++];
    ph->name = "run";
    ph->wall_s = (double)(last_exit - t0) / 1e9;
    sb_stats_diff(&s0, &last, &ph->d);
    ph->d.conns = peak;
    ph->d.cpu_ns = root_cpu;
    p->ok = true;
    sb_metric(p, "all workers started", "s", started);
    sb_metric(p, "first barrier, all ranks", "s", passed);
    sb_metric(p, "all launchers exited", "s", ph->wall_s);
    sb_metric(p, "root peak conns", "", peak);
    sb_metric(p, "root requests", "", ph->d.requests < 0 ? NAN : (double)ph->d.requests);
    sb_metric(p, "root MB in", "MB", ph->d.bytes_in < 0 ? NAN : ph->d.bytes_in / 1e6);
    sb_metric(p, "root MB out", "MB", ph->d.bytes_out < 0 ? NAN : ph->d.bytes_out / 1e6);
    sb_metric(p, "root process CPU", "s", root_cpu < 0 ? NAN : root_cpu / 1e9);
    sb_metric(p, "all processes CPU", "s", children_cpu_s() - cpu_children0);
    rc = 0;
    goto out;
kill:
    for (int i = 0; i < r.n; i++)
        if (r.pids[i] > 0 && !r.exit_ns[i])
            kill(-r.pids[i], SIGKILL);
    for (int i = 0; i < r.n; i++)
        if (r.pids[i] > 0 && !r.exit_ns[i])
            waitpid(r.pids[i], NULL, 0);
out:
    sb_root_stop(&root, rc < 0);
    if (rc == 0 && r.dir[0])
        remove_dir(r.dir);
    else if (!p->err[0])
        snprintf(p->err, sizeof p->err, "%.100s failed (%s; logs in %.300s)", prog, strerror(-rc),
                 r.dir);
    free(r.pids);
    free(r.exit_ns);
    return rc;
}
