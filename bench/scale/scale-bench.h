/*
 * scale-bench.h: what scale-bench's files share: the configuration, the root store's counters,
 * one measured point (a mode at one node count) and each file's entry points. Internal to the
 * program; nothing here is a library's API.
 *
 *   scale-bench.c   main(): the options and --help, the sweep, the exit status
 *   root.c          the root store as a child process (ddp-rendezvous serve), its counters
 *                   (STATUS over the wire, CPU time from the kernel), other processes' CPU
 *   light.c         lightweight mode: N agent threads running ddprun's node rendezvous and
 *                   monitor, N x G rank threads passing the first barrier, a node's death
 *   proxy.c         lightweight mode's per-node store proxies (built only with the proxy API)
 *   real.c          real-process mode: N ddprun (or torchrun) processes on loopback
 *   report.c        the tables, the growth fits and the projection, the JSON file
 *
 * Functions that fail return a negative errno and leave a sentence in the point's err field;
 * the allocating helpers exit(2) instead.
 */
#ifndef SCALE_BENCH_H
#define SCALE_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define SB_MAX_POINTS 8   /* node counts per mode */
#define SB_MAX_METRICS 64 /* figures of one point */
#define SB_MAX_OPS 32     /* operations the store counts (RDZV_OP_COUNT fits) */
#define SB_MAX_PHASES 8
#define SB_PROJECT_NODES 10000 /* the projection's node count (x cfg->ranks) */

/* The modes, in the order they run and are reported. */
enum sb_mode { SB_LIGHT, SB_DDPRUN_STATIC, SB_DDPRUN_C10D, SB_TORCHRUN, SB_NMODES };

struct sb_config {
    int nodes[SB_NMODES][SB_MAX_POINTS]; /* node counts per mode */
    int npoints[SB_NMODES];              /* 0: mode not run */
    int ranks;                           /* G: emulated ranks per node, lightweight mode */
    bool proxy;                          /* --proxy on */
    bool barrier_add;                    /* --barrier add: ADD + WAIT instead of rdzv_barrier */
    double dead_after_s;                 /* heartbeat_timeout of the agents */
    double last_call_s;                  /* last_call_timeout of the elastic rounds */
    double steady_s;                     /* length of the steady-state window */
    double timeout_s;                    /* bound of every phase */
    bool quick, verbose;
    const char *json;                              /* --json FILE or NULL */
    const char *ddprun, *server, *worker, *python; /* programs */
    const char *tmpdir;
};

/* The root store's counters at one moment, or the difference between two moments. */
struct sb_stats {
    bool have_status;            /* STATUS answered (the counters below but cpu_ns are valid) */
    bool have_traffic;           /* STATUS had "traffic": requests and bytes are the server's */
    int64_t cpu_ns;              /* user + system time of the store's process; -1 unknown */
    int64_t conns;               /* open client connections (this program's STATUS one excluded) */
    int64_t accepted;            /* connections accepted since start */
    int64_t requests;            /* traffic.requests, or the sum of ops */
    int64_t bytes_in, bytes_out; /* -1 without "traffic" */
    int64_t ops[SB_MAX_OPS];     /* per operation, in rdzv__op_name() order */
};

/* One measured phase: its wall time and what the root did meanwhile. */
struct sb_phase {
    const char *name;
    double wall_s;
    struct sb_stats d; /* differences, except conns: open at the phase's end */
};

struct sb_metric {
    const char *name; /* static text */
    const char *unit; /* "s", "", "MB", "%" */
    double v;         /* NAN: unknown */
};

struct sb_point {
    enum sb_mode mode;
    int nodes, ranks;
    bool ok, skipped;
    char err[512];
    int nmetrics;
    struct sb_metric m[SB_MAX_METRICS];
    int nphases;
    struct sb_phase ph[SB_MAX_PHASES];
    double harness_cpu_s; /* this program's CPU time during the point */
};

extern const char *const sb_mode_names[SB_NMODES];

/* ---- root.c ---------------------------------------------------------------------------- */

/* The root store process. */
struct sb_root {
    pid_t pid;
    int port;
    char log[4096];
    struct rdzv_client *status; /* the connection STATUS is asked on */
};

/* Starts `server serve --bind 127.0.0.1 --port 0` and connects for STATUS. 0 or -errno. */
int sb_root_start(struct sb_root *r, const char *server, const char *tmpdir, char *err,
                  size_t errlen);
/* Reads the counters of the store at r (its CPU when r->pid > 0). 0 or -errno. */
int sb_root_sample(struct sb_root *r, struct sb_stats *s);
/* Stops the root (SIGTERM, then SIGKILL after 5 s) and removes its log unless keep_log. */
void sb_root_stop(struct sb_root *r, bool keep_log);
/* b - a into *d; conns taken from b. */
void sb_stats_diff(const struct sb_stats *a, const struct sb_stats *b, struct sb_stats *d);
/* Fills s from a STATUS JSON text. 0 or -EPROTO. */
int sb_stats_parse(const char *json, struct sb_stats *s);
/*
 * Raises RLIMIT_NOFILE's soft limit to the hard one, and both to SB_NOFILE_WANT where the
 * process may (root); returns the soft limit now in force. The root store inherits it.
 */
#define SB_NOFILE_WANT 65536
long sb_raise_nofile(void);

/* Appends a metric to p (name and unit are static text). */
void sb_metric(struct sb_point *p, const char *name, const char *unit, double v);
/* Appends a phase's metrics (wall time, root connections, requests, bytes, CPU) to p. */
void sb_phase_metrics(struct sb_point *p, const struct sb_phase *ph, const char *wall_name,
                      const char *const names[5]);

/* ---- light.c, real.c ------------------------------------------------------------------- */

/* One lightweight point at p->nodes x cfg->ranks. Fills p; returns 0 or -errno (p->err). */
int sb_light_run(const struct sb_config *cfg, struct sb_point *p);
/* One real-process point of mode p->mode at p->nodes. */
int sb_real_run(const struct sb_config *cfg, struct sb_point *p);

/* ---- proxy.c --------------------------------------------------------------------------- */

/*
 * Per-node store proxies for lightweight mode, on one libuv loop in a child process.
 * sb_proxies_start() opens n proxies to the root at 127.0.0.1:root_port and writes the port
 * of proxy i to ports[i]; sb_proxies_stop() closes them (NULL: no-op). Without the proxy API
 * (SCALE_BENCH_HAVE_PROXY undefined) start returns -ENOTSUP with a sentence in err.
 */
struct sb_proxies;
/* The proxies' counters, summed (rdzv_proxy_stats()). */
struct sb_proxy_totals {
    int64_t worker_requests;   /* requests the ranks sent to their proxies */
    int64_t upstream_requests; /* requests the proxies sent to the root */
    int64_t coalesced;         /* rank requests that joined one already sent upstream */
    int64_t bytes_up, bytes_down;
    int64_t cpu_ns; /* CPU time of the proxies' process */
};
int sb_proxies_start(int n, int root_port, int *ports, struct sb_proxies **out, char *err,
                     size_t errlen);
void sb_proxies_stop(struct sb_proxies *px);
/* Sums every proxy's counters into *t. 0, -ENOTSUP or -errno (the proxies' host is gone). */
int sb_proxies_totals(struct sb_proxies *px, struct sb_proxy_totals *t);
extern const bool sb_have_proxy;

/* ---- report.c -------------------------------------------------------------------------- */

/*
 * Prints one mode's table: a row per metric, a column per node count, then the exponent of a
 * power-law fit, the best of the linear, n log n and quadratic models, and the projection to
 * SB_PROJECT_NODES nodes.
 */
void sb_report_mode(const struct sb_config *cfg, const struct sb_point *pts, int n);
/* Writes every point, phase and fit to path. 0 or -errno. */
int sb_report_json(const struct sb_config *cfg, struct sb_point pts[SB_NMODES][SB_MAX_POINTS],
                   const char *path);

/*
 * Least squares of y on x for the model y = c * f(x), f one of x, x log x, x^2, and of
 * log y = a + b log x (the power law). Pure arithmetic. Returns 0, or -EINVAL with fewer than
 * two positive points.
 */
struct sb_fit {
    double exponent; /* b of the power law */
    double coef;     /* exp(a) */
    int model;       /* 0 linear, 1 n log n, 2 quadratic: the best by relative residual */
    double model_c;  /* c of that model */
};
int sb_fit(const double *x, const double *y, int n, struct sb_fit *f);
extern const char *const sb_model_names[3];

#endif /* SCALE_BENCH_H */
