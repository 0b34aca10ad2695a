/*
 * light.c: lightweight mode. N emulated nodes without a process each: every node is one agent
 * thread running ddprun's own node rendezvous and monitor code (launcher/noderdzv.c) on two
 * blocking clients, as a ddprun agent holds them (one for the rendezvous, one for its monitor),
 * and G rank threads that connect to the store and pass the job's first barrier the way a
 * ddprun worker does (rdzv_barrier(), or with --barrier add the ADD + WAIT of torch's elastic
 * barrier). The root store is a ddp-rendezvous process (root.c).
 *
 * Phases, each timed and with the root's counters read before and after:
 *   connect  every agent opens its two connections
 *   round    the elastic round 0 (ddprun_rdzv_dynamic(), --nnodes MIN:N): from the start
 *            signal until every agent has its assignment (the round closes when the N-th joins)
 *   barrier  the N x G ranks connect and pass the first barrier; the agents' monitors run
 *   steady   a window in which only the monitors run (heartbeats, dead-node checks, the wait
 *            for a failure report, the look for waiting nodes), for the root's cost per second
 *   death    one agent stops: it closes its connections and its ranks' and beats no more. The
 *            others notice its silence (ddprun_dead_nodes()), the first publishes the failure,
 *            every survivor sees it, closes its ranks' connections and joins round 1, which
 *            closes last_call_timeout after its quorum (MIN nodes) since N - 1 < MAX.
 *
 * What the agents' threads do between the calls is the monitor loop of launcher/monitor.c,
 * slice by slice; the liveness timing comes from ddprun_liveness() on a configuration parsed by
 * ddprun's own parser. Not emulated: the workers' processes, and the clearing of the workers'
 * keys before round 1 (the root here is a store of its own, with no hosting agent to clear it;
 * on ddprun's embedded store a node's death is also seen at once through the store's on_close
 * hook rather than after the heartbeat timeout).
 *
 * Threads: N agents and N x G ranks, on small stacks; a rank thread ends once it passed the
 * barrier, leaving its connection open (a worker keeps its store connection for the job).
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "failure.h"
#include "monoclock.h"
#include "noderdzv.h"
#include "options.h"
#include "rdzv.h"
#include "scale-bench.h"

#define THREAD_STACK (256 * 1024)

enum stage { ST_CONNECT, ST_STATIC, ST_ROUND, ST_BARRIER, ST_STOP };

struct light;

struct agent {
    struct light *L;
    int id;
    pthread_t tid;
    bool started;
    rdzv_client *c, *mon;
    rdzv_client **ranks; /* (G) the node's rank connections, after the barrier */
    ddprun_assignment asg;
    atomic_bool kill;
    char report[300]; /* the failure report this agent's monitor saw */
};

struct rank {
    struct light *L;
    int node, local;
    pthread_t tid;
    bool started;
};

struct light {
    const struct sb_config *cfg;
    int n, g, min_nodes, world;
    int port;
    int *proxy_ports; /* (n) or NULL: ranks connect to the root */
    char prefix[128], static_prefix[160];
    double beat_s, dead_s, join_s, last_call_s;
    int slice_ms, timeout_ms;

    pthread_mutex_t mu;
    pthread_cond_t cv; /* on CLOCK_MONOTONIC */
    enum stage stage;
    int nconnected, nstatic, nassigned, npassed, nseen, nassigned1, nfailed;
    int64_t t_kill, t_detect, t_last_seen; /* ns; 0: not yet */
    char first_err[400];
    struct agent *agents;
};

static void fail_locked(struct light *L, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void fail_locked(struct light *L, const char *fmt, ...)
{
    L->nfailed++;
    if (!L->first_err[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(L->first_err, sizeof L->first_err, fmt, ap);
        va_end(ap);
    }
    pthread_cond_broadcast(&L->cv);
}

/* Waits until *count reaches target, a thread failed, or the deadline passed. */
static int wait_count(struct light *L, const int *count, int target, int64_t deadline)
{
    int rc = 0;
    pthread_mutex_lock(&L->mu);
    while (*count < target && L->nfailed == 0) {
        struct timespec ts = mono_timespec_at(deadline);
        if (pthread_cond_timedwait(&L->cv, &L->mu, &ts) == ETIMEDOUT) {
            rc = -ETIMEDOUT;
            break;
        }
    }
    if (rc == 0 && *count < target)
        rc = -ECANCELED;
    pthread_mutex_unlock(&L->mu);
    return rc;
}

/* Waits for stage s or a later one; returns false when that is ST_STOP (the run ended early). */
static bool wait_stage(struct light *L, enum stage s)
{
    pthread_mutex_lock(&L->mu);
    while (L->stage < s)
        pthread_cond_wait(&L->cv, &L->mu);
    bool go = L->stage != ST_STOP;
    pthread_mutex_unlock(&L->mu);
    return go;
}

static void set_stage(struct light *L, enum stage s)
{
    pthread_mutex_lock(&L->mu);
    L->stage = s;
    pthread_cond_broadcast(&L->cv);
    pthread_mutex_unlock(&L->mu);
}

static void client_options(const struct light *L, rdzv_client_options *co)
{
    rdzv_client_options_init(co);
    co->connect_timeout_ms = L->timeout_ms;
    co->timeout_ms = L->timeout_ms;
}

static void close_ranks(struct light *L, struct agent *a)
{
    pthread_mutex_lock(&L->mu);
    for (int i = 0; i < L->g; i++) {
        rdzv_client_close(a->ranks[i]);
        a->ranks[i] = NULL;
    }
    pthread_mutex_unlock(&L->mu);
}

/*
 * One round of launcher/monitor.c's loop for this agent: wait a slice for the round's failure
 * report; otherwise beat when due, look for dead nodes (and report the first), and look for
 * waiting nodes. Returns 1 when the round's failure report appeared, 0 at ST_STOP, -ECANCELED
 * when this agent was killed, or a negative errno from the store.
 */
static int monitor(struct light *L, struct agent *a, int round)
{
    ddprun_hb_state hb;
    /* Node rank 0 stands for the agent serving the store, which watches every node; the
     * others watch their ring peers, as launcher/monitor.c. */
    int me = a->asg.node_rank, nn = a->asg.nnodes;
    int rc = me == 0
                 ? ddprun_hb_init(&hb, L->prefix, round, nn, L->dead_s)
                 : ddprun_hb_init_peers(&hb, L->prefix, round, nn, me, DDPRUN_HB_PEERS, L->dead_s);
    if (rc < 0)
        return rc;
    ddprun_rdzv_publish_conn(a->mon, L->prefix, round, me);
    double last_beat = 0;
    bool reported = false;
    for (;;) {
        if (atomic_load(&a->kill)) {
            rc = -ECANCELED;
            break;
        }
        pthread_mutex_lock(&L->mu);
        bool stop = L->stage == ST_STOP;
        pthread_mutex_unlock(&L->mu);
        if (stop) {
            rc = 0;
            break;
        }
        char *json = NULL;
        rc = ddprun_rdzv_wait_failure(a->mon, L->prefix, round, L->slice_ms, &json);
        if (rc == 0) {
            snprintf(a->report, sizeof a->report, "%s", json);
            rdzv_free(json);
            rc = 1;
            break;
        }
        if (rc != -ETIMEDOUT)
            break;
        double now = mono_now_s();
        if (now - last_beat >= L->beat_s) {
            ddprun_heartbeat(a->mon, L->prefix, round, me);
            last_beat = now;
        }
        if (reported)
            continue;
        int dead[16];
        int nd = ddprun_dead_nodes(a->mon, &hb, dead, 16);
        if (nd > 0) {
            if (ddprun_rdzv_exit_done(a->mon, L->prefix, round) == 1)
                continue;
            char why[160];
            snprintf(why, sizeof why, "node %d stopped sending heartbeats (none for %g s)", dead[0],
                     L->dead_s);
            ddprun_failure f;
            ddprun_failure_init(&f, "?", -1, -1, 1, 0, why);
            char *js = ddprun_failure_to_json(&f);
            if (js && ddprun_rdzv_publish_failure(a->mon, L->prefix, round, js) == 1) {
                pthread_mutex_lock(&L->mu);
                if (!L->t_detect)
                    L->t_detect = mono_now_ns();
                pthread_mutex_unlock(&L->mu);
            }
            free(js);
            reported = true;
        } else {
            int64_t waiting = 0;
            ddprun_rdzv_num_waiting(a->mon, L->prefix, round, &waiting);
        }
    }
    ddprun_hb_free(&hb);
    return rc;
}

/* c10d_join() of launcher/backend_c10d.c: a round that closed before this node joined sends it
 * to the next one. */
static int join(struct light *L, struct agent *a, int round, char *err, size_t errlen)
{
    char node_id[32];
    snprintf(node_id, sizeof node_id, "node%d", a->id);
    int rc;
    while ((rc = ddprun_rdzv_dynamic(a->c, L->prefix, round, L->min_nodes, L->n, node_id, L->g,
                                     L->join_s, L->last_call_s, &a->asg, err, errlen)) == -EAGAIN)
        round++;
    return rc;
}

static void *agent_main(void *arg)
{
    struct agent *a = arg;
    struct light *L = a->L;
    rdzv_client_options co;
    client_options(L, &co);
    char err[512] = "";
    int rc = rdzv_client_connect("127.0.0.1", L->port, &co, &a->c);
    if (rc == 0)
        rc = rdzv_client_connect("127.0.0.1", L->port, &co, &a->mon);
    pthread_mutex_lock(&L->mu);
    if (rc < 0)
        fail_locked(L, "agent %d: connect: %s", a->id, rdzv_client_last_error(NULL));
    L->nconnected++;
    pthread_cond_broadcast(&L->cv);
    pthread_mutex_unlock(&L->mu);
    if (rc < 0)
        return NULL;

    /* A static round (torchrun's --node-rank) under a prefix of its own, then the elastic one
     * whose assignment the job keeps. */
    if (!wait_stage(L, ST_STATIC))
        return NULL;
    ddprun_assignment st;
    rc = ddprun_rdzv_static(a->c, L->static_prefix, 0, L->n, a->id, L->g, L->join_s, &st, err,
                            sizeof err);
    pthread_mutex_lock(&L->mu);
    if (rc < 0)
        fail_locked(L, "agent %d: static round: %s: %s", a->id, rdzv_strerror(rc), err);
    else
        L->nstatic++;
    pthread_cond_broadcast(&L->cv);
    pthread_mutex_unlock(&L->mu);
    if (rc < 0 || !wait_stage(L, ST_ROUND))
        return NULL;
    rc = join(L, a, 0, err, sizeof err);
    pthread_mutex_lock(&L->mu);
    if (rc < 0)
        fail_locked(L, "agent %d: round 0: %s: %s", a->id, rdzv_strerror(rc), err);
    else
        L->nassigned++;
    pthread_cond_broadcast(&L->cv);
    pthread_mutex_unlock(&L->mu);
    if (rc < 0)
        return NULL;

    rc = monitor(L, a, 0);
    if (rc == -ECANCELED) {
        /* Killed: the node's connections close (its workers' with it), and it beats no more. */
        close_ranks(L, a);
        rdzv_client_close(a->mon);
        rdzv_client_close(a->c);
        a->mon = a->c = NULL;
        pthread_mutex_lock(&L->mu);
        L->t_kill = mono_now_ns();
        pthread_cond_broadcast(&L->cv);
        pthread_mutex_unlock(&L->mu);
        return NULL;
    }
    if (rc < 0) {
        pthread_mutex_lock(&L->mu);
        fail_locked(L, "agent %d: monitor: %s", a->id, rdzv_strerror(rc));
        pthread_mutex_unlock(&L->mu);
        return NULL;
    }
    if (rc == 0)
        return NULL;
    /* The failure report of round 0: stop the workers and rejoin. One that came before any
     * node was stopped (heartbeats starved on a loaded machine) voids the point. */
    pthread_mutex_lock(&L->mu);
    if (!L->t_kill) {
        fail_locked(L,
                    "a node was reported dead before any was stopped (%s): the agents' "
                    "heartbeats were starved; give a longer --heartbeat-timeout",
                    a->report);
        pthread_mutex_unlock(&L->mu);
        return NULL;
    }
    L->nseen++;
    L->t_last_seen = mono_now_ns();
    pthread_mutex_unlock(&L->mu);
    close_ranks(L, a);
    rc = join(L, a, 1, err, sizeof err);
    pthread_mutex_lock(&L->mu);
    if (rc < 0)
        fail_locked(L, "agent %d: round 1: %s: %s", a->id, rdzv_strerror(rc), err);
    else
        L->nassigned1++;
    pthread_cond_broadcast(&L->cv);
    pthread_mutex_unlock(&L->mu);
    return NULL;
}

/* The first barrier of a worker: rdzv_barrier(), or torch elastic's ADD then WAIT. */
static int first_barrier(struct light *L, rdzv_client *c)
{
    if (!L->cfg->barrier_add)
        return rdzv_barrier(c, "scale_bench/barrier", L->world, L->timeout_ms);
    int64_t v = 0;
    int rc = rdzv_add(c, "scale_bench/arrived", 1, &v);
    if (rc == 0 && v == L->world)
        rc = rdzv_set(c, "scale_bench/done", "1", 1);
    const char *key = "scale_bench/done";
    return rc < 0 ? rc : rdzv_wait(c, &key, 1, L->timeout_ms);
}

static void *rank_main(void *arg)
{
    struct rank *r = arg;
    struct light *L = r->L;
    if (!wait_stage(L, ST_BARRIER))
        return NULL;
    rdzv_client_options co;
    client_options(L, &co);
    rdzv_client *c = NULL;
    int port = L->proxy_ports ? L->proxy_ports[r->node] : L->port;
    int rc = rdzv_client_connect("127.0.0.1", port, &co, &c);
    const char *what = "connect";
    if (rc == 0) {
        what = "barrier";
        rc = first_barrier(L, c);
    }
    pthread_mutex_lock(&L->mu);
    if (rc < 0) {
        fail_locked(L, "rank %d of node %d: %s: %s (%s)", r->local, r->node, what,
                    rdzv_strerror(rc),
                    c ? rdzv_client_last_error(c) : rdzv_client_last_error(NULL));
        rdzv_client_close(c);
    } else {
        L->agents[r->node].ranks[r->local] = c;
        L->npassed++;
    }
    pthread_cond_broadcast(&L->cv);
    pthread_mutex_unlock(&L->mu);
    return NULL;
}

/* Starts a thread on a small stack. */
static int spawn(pthread_t *t, void *(*fn)(void *), void *arg)
{
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, THREAD_STACK);
    int rc = pthread_create(t, &at, fn, arg);
    pthread_attr_destroy(&at);
    return -rc;
}

/* The agents' settings from ddprun's own parser and liveness rule. */
static int agent_settings(struct light *L, char *err, size_t errlen)
{
    char nnodes[32], conf[160], g[16];
    snprintf(nnodes, sizeof nnodes, "%d:%d", L->min_nodes, L->n);
    snprintf(g, sizeof g, "%d", L->g);
    snprintf(conf, sizeof conf, "heartbeat_timeout=%g,last_call_timeout=%g,join_timeout=%g",
             L->cfg->dead_after_s, L->cfg->last_call_s, L->cfg->timeout_s);
    char *argv[] = {"ddprun",
                    "--nnodes",
                    nnodes,
                    "--nproc-per-node",
                    g,
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    "127.0.0.1:1",
                    "--rdzv-conf",
                    conf,
                    "--no-python",
                    "true",
                    NULL};
    ddprun_config dc;
    int rc = ddprun_config_parse(13, argv, &dc, err, errlen);
    if (rc != 0)
        return rc < 0 ? rc : -EINVAL;
    ddprun_liveness(&dc, &L->beat_s, &L->dead_s);
    L->join_s = dc.join_timeout_s;
    L->last_call_s = dc.last_call_timeout_s;
    L->min_nodes = dc.nnodes_min;
    ddprun_config_free(&dc);
    L->slice_ms = ddprun_monitor_slice_ms(L->beat_s, L->dead_s, L->n);
    return 0;
}

/* The phases, in the order they run (p->ph[]). */
enum { PH_CONNECT, PH_STATIC, PH_ROUND, PH_BARRIER, PH_STEADY, PH_DEATH };

static double per_s(int64_t v, double scale, double s)
{
    return v < 0 ? NAN : (double)v * scale / s;
}

/* The point's rows, from its phases (and, with --proxy on, the proxies' counters a and b
 * around the barrier). */
static void light_metrics(const struct light *L, struct sb_point *p,
                          const struct sb_proxy_totals *a, const struct sb_proxy_totals *b)
{
    static const char *const rn[5] = {"round: root conns", "round: root requests",
                                      "round: root MB in", "round: root MB out",
                                      "round: root CPU s"};
    static const char *const bn[5] = {"barrier: root conns", "barrier: root requests",
                                      "barrier: root MB in", "barrier: root MB out",
                                      "barrier: root CPU s"};
    static const char *const dn[5] = {"death: root conns", "death: root requests",
                                      "death: root MB in", "death: root MB out",
                                      "death: root CPU s"};
    const struct sb_phase *ph = p->ph;
    sb_metric(p, "agents connected", "s", ph[PH_CONNECT].wall_s);
    sb_metric(p, "static round complete", "s", ph[PH_STATIC].wall_s);
    sb_metric(p, "static: root requests", "", per_s(ph[PH_STATIC].d.requests, 1, 1));
    sb_metric(p, "static: root CPU s", "s", per_s(ph[PH_STATIC].d.cpu_ns, 1e-9, 1));
    sb_phase_metrics(p, &ph[PH_ROUND], "elastic round complete", rn);
    sb_phase_metrics(p, &ph[PH_BARRIER], "first barrier, all ranks", bn);
    if (L->cfg->proxy) {
        sb_metric(p, "barrier: proxies' rank requests", "",
                  (double)(b->worker_requests - a->worker_requests));
        sb_metric(p, "barrier: proxies' upstream reqs", "",
                  (double)(b->upstream_requests - a->upstream_requests));
        sb_metric(p, "barrier: proxies coalesced", "", (double)(b->coalesced - a->coalesced));
        sb_metric(p, "barrier: proxies' CPU s", "s", (double)(b->cpu_ns - a->cpu_ns) / 1e9);
    }
    const struct sb_phase *st = &ph[PH_STEADY];
    sb_metric(p, "steady: root CPU", "%", per_s(st->d.cpu_ns, 1e-7, st->wall_s));
    sb_metric(p, "steady: root requests/s", "", per_s(st->d.requests, 1, st->wall_s));
    sb_metric(p, "steady: root MB/s in", "MB", per_s(st->d.bytes_in, 1e-6, st->wall_s));
    sb_metric(p, "steady: root MB/s out", "MB", per_s(st->d.bytes_out, 1e-6, st->wall_s));
    if (p->nphases > PH_DEATH) {
        sb_metric(p, "death -> round 1 complete", "s", ph[PH_DEATH].wall_s);
        sb_metric(p, "  death -> reported", "s",
                  L->t_detect ? (double)(L->t_detect - L->t_kill) / 1e9 : NAN);
        sb_metric(p, "  death -> all notified", "s",
                  L->t_last_seen ? (double)(L->t_last_seen - L->t_kill) / 1e9 : NAN);
        sb_phase_metrics(p, &ph[PH_DEATH], NULL, dn);
    }
    sb_metric(p, "harness CPU (all phases)", "s", p->harness_cpu_s);
}

/* Reads the root's counters into *s; a failure is recorded in the point. */
static void sample(struct sb_root *root, struct sb_stats *s, struct sb_point *p)
{
    if (sb_root_sample(root, s) < 0 && !p->err[0])
        snprintf(p->err, sizeof p->err, "STATUS: %s", rdzv_client_last_error(root->status));
}

static void phase_end(struct sb_point *p, const char *name, int64_t t0, const struct sb_stats *a,
                      const struct sb_stats *b)
{
    if (p->nphases >= SB_MAX_PHASES)
        return;
    struct sb_phase *ph = &p->ph[p->nphases++];
    ph->name = name;
    ph->wall_s = (double)(mono_now_ns() - t0) / 1e9;
    sb_stats_diff(a, b, &ph->d);
}

int sb_light_run(const struct sb_config *cfg, struct sb_point *p)
{
    struct light L = {.cfg = cfg, .n = p->nodes, .g = cfg->ranks};
    struct sb_root root = {.pid = -1};
    struct sb_proxies *px = NULL;
    struct sb_proxy_totals px0 = {0}, px1 = {0};
    struct rank *ranks = NULL;
    int rc, nagents = 0, nranks = 0;
    int64_t cpu0 = cpu_used_ns(0);

    L.world = L.n * L.g;
    L.min_nodes = L.n > 1 ? L.n / 2 : 1;
    L.timeout_ms = (int)(cfg->timeout_s * 1000);
    snprintf(L.prefix, sizeof L.prefix, "%s/scale-bench-%d", DDPRUN_RDZV_ROOT, L.n);
    snprintf(L.static_prefix, sizeof L.static_prefix, "%s-static", L.prefix);
    pthread_mutex_init(&L.mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&L.cv, &ca);
    pthread_condattr_destroy(&ca);
    L.agents = calloc((size_t)L.n, sizeof *L.agents);
    ranks = calloc((size_t)L.world, sizeof *ranks);
    if (!L.agents || !ranks) {
        snprintf(p->err, sizeof p->err, "out of memory");
        rc = -ENOMEM;
        goto out;
    }
    /* This process holds every agent's two connections and every rank's, and so does the root
     * without proxies: past the descriptor limit the run could only fail midway. */
    struct rlimit rl;
    long need = (long)L.n * (L.g + 2) + 64;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && (rlim_t)need > rl.rlim_cur) {
        p->skipped = true;
        snprintf(p->err, sizeof p->err,
                 "%d nodes x (%d ranks + 2 agent connections) need about %ld descriptors, more "
                 "than RLIMIT_NOFILE's %ld here",
                 L.n, L.g, need, (long)rl.rlim_cur);
        rc = -EMFILE;
        goto out;
    }
    rc = agent_settings(&L, p->err, sizeof p->err);
    if (rc < 0)
        goto out;
    rc = sb_root_start(&root, cfg->server, cfg->tmpdir, p->err, sizeof p->err);
    if (rc < 0)
        goto out;
    L.port = root.port;
    /* The proxies' host is forked now, while this is the only thread. */
    if (cfg->proxy) {
        L.proxy_ports = calloc((size_t)L.n, sizeof *L.proxy_ports);
        rc = L.proxy_ports
                 ? sb_proxies_start(L.n, L.port, L.proxy_ports, &px, p->err, sizeof p->err)
                 : -ENOMEM;
        if (rc < 0)
            goto out;
    }

    struct sb_stats s0, s1;
    int64_t deadline, t0;

    /* connect */
    sample(&root, &s0, p);
    t0 = mono_now_ns();
    for (int i = 0; i < L.n; i++) {
        struct agent *a = &L.agents[i];
        a->L = &L;
        a->id = i;
        a->ranks = calloc((size_t)L.g, sizeof *a->ranks);
        if (!a->ranks || spawn(&a->tid, agent_main, a) < 0) {
            snprintf(p->err, sizeof p->err, "cannot start agent thread %d", i);
            rc = -EAGAIN;
            goto out;
        }
        a->started = true;
        nagents++;
    }
    deadline = mono_deadline_ns(L.timeout_ms);
    rc = wait_count(&L, &L.nconnected, L.n, deadline);
    if (rc < 0 || L.nfailed)
        goto fail;
    sample(&root, &s1, p);
    phase_end(p, "connect", t0, &s0, &s1);

    /* static round */
    s0 = s1;
    t0 = mono_now_ns();
    set_stage(&L, ST_STATIC);
    rc = wait_count(&L, &L.nstatic, L.n, mono_deadline_ns(L.timeout_ms));
    if (rc < 0)
        goto fail;
    sample(&root, &s1, p);
    phase_end(p, "static", t0, &s0, &s1);

    /* elastic round */
    s0 = s1;
    t0 = mono_now_ns();
    set_stage(&L, ST_ROUND);
    rc = wait_count(&L, &L.nassigned, L.n, mono_deadline_ns(L.timeout_ms));
    if (rc < 0)
        goto fail;
    sample(&root, &s1, p);
    phase_end(p, "round", t0, &s0, &s1);

    /* barrier: the rank threads start gated, then pass it together */
    for (int i = 0; i < L.world; i++) {
        struct rank *r = &ranks[i];
        *r = (struct rank){.L = &L, .node = i / L.g, .local = i % L.g};
        if (spawn(&r->tid, rank_main, r) < 0) {
            snprintf(p->err, sizeof p->err, "cannot start rank thread %d (of %d)", i, L.world);
            rc = -EAGAIN;
            set_stage(&L, ST_STOP);
            goto out;
        }
        r->started = true;
        nranks++;
    }
    sample(&root, &s0, p);
    if (px)
        sb_proxies_totals(px, &px0);
    t0 = mono_now_ns();
    set_stage(&L, ST_BARRIER);
    rc = wait_count(&L, &L.npassed, L.world, mono_deadline_ns(L.timeout_ms));
    if (rc < 0)
        goto fail;
    sample(&root, &s1, p);
    phase_end(p, "barrier", t0, &s0, &s1);
    if (px)
        sb_proxies_totals(px, &px1);
    for (int i = 0; i < nranks; i++)
        pthread_join(ranks[i].tid, NULL);
    nranks = 0;

    /* steady: the monitors alone, for a fixed window */
    s0 = s1;
    t0 = mono_now_ns();
    mono_sleep_until(t0 + (int64_t)(cfg->steady_s * 1e9));
    sample(&root, &s1, p);
    phase_end(p, "steady", t0, &s0, &s1);

    /* death: one node stops; the others report it and meet in round 1 */
    if (L.n >= 2) {
        s0 = s1;
        struct agent *victim = &L.agents[L.n / 2];
        atomic_store(&victim->kill, true);
        rc = wait_count(&L, &L.nassigned1, L.n - 1, mono_deadline_ns(L.timeout_ms));
        if (rc < 0)
            goto fail;
        sample(&root, &s1, p);
        phase_end(p, "death", L.t_kill, &s0, &s1);
    }
    rc = 0;
    goto out;
fail:
    if (!p->err[0])
        snprintf(p->err, sizeof p->err, "%s",
                 L.first_err[0] ? L.first_err : "a phase did not complete within --timeout");
    rc = rc < 0 ? rc : -EIO;
out:
    set_stage(&L, ST_STOP);
    for (int i = 0; i < nranks; i++)
        if (ranks[i].started)
            pthread_join(ranks[i].tid, NULL);
    for (int i = 0; i < nagents; i++)
        if (L.agents[i].started)
            pthread_join(L.agents[i].tid, NULL);
    for (int i = 0; L.agents && i < L.n; i++) {
        struct agent *a = &L.agents[i];
        for (int k = 0; a->ranks && k < L.g; k++)
            rdzv_client_close(a->ranks[k]);
        rdzv_client_close(a->c);
        rdzv_client_close(a->mon);
        free(a->ranks);
    }
    sb_proxies_stop(px);
    sb_root_stop(&root, rc < 0);
    p->harness_cpu_s = (double)(cpu_used_ns(0) - cpu0) / 1e9;
    if (rc == 0) {
        p->ok = true;
        light_metrics(&L, p, &px0, &px1);
    }
    free(L.proxy_ports);
    free(ranks);
    free(L.agents);
    pthread_cond_destroy(&L.cv);
    pthread_mutex_destroy(&L.mu);
    return rc;
}
