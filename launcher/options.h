/*
 * ddprun's configuration: what the command line, PET_* environment defaults and Slurm variables
 * resolve to. Filled by ddprun_config_parse() (options.c, whose header this is); read by the
 * agent. Written by hand, not generated. Internal to the launcher.
 */
#ifndef DDPRUN_OPTIONS_H
#define DDPRUN_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>

#define DDPRUN_MAX_LOCAL 1024 /* most workers per node */

/* The rendezvous backend, --rdzv-backend: parsed once by options.c, whose rules for the other
 * options differ per backend; the agent runs the row of backend.h's table of that name
 * (ddprun_backend_name()). */
typedef enum ddprun_backend {
    DDPRUN_BACKEND_STATIC, /* "static": node ranks given (--node-rank); node 0 hosts the store */
    DDPRUN_BACKEND_C10D,   /* "c10d": elastic, node ranks in join order; store at the endpoint */
    DDPRUN_BACKEND_ETCD,   /* "etcd" (or "etcd-v2"): elastic, in an etcd cluster; each round's
                            * rank 0 serves the store */
} ddprun_backend;

/* --tty: when workers get pseudo-terminals (auto: for ddprun's streams that are terminals). */
typedef enum ddprun_tty { DDPRUN_TTY_AUTO, DDPRUN_TTY_ON, DDPRUN_TTY_OFF } ddprun_tty;

/* What -r/--redirects and -t/--tee select, as torchrun's Std: bit 1 stdout, bit 2 stderr. */
enum { DDPRUN_STD_NONE = 0, DDPRUN_STD_OUT = 1, DDPRUN_STD_ERR = 2, DDPRUN_STD_ALL = 3 };

typedef struct ddprun_config {
    /* Nodes and workers. */
    int nnodes_min, nnodes_max; /* --nnodes N (N:N) or MIN:MAX; default 1:1 */
    int nproc_per_node;         /* resolved count (auto/cpu/gpu resolved at parse time) */
    int node_rank;              /* --node-rank, default 0 (static rendezvous) */
    char *master_addr;          /* --master-addr, default "127.0.0.1" */
    int master_port;            /* --master-port, default 29500 */
    char *local_addr;           /* --local-addr, NULL: this host's name */

    /* Rendezvous: --rdzv-backend, static (default) or c10d, then its settings. */
    ddprun_backend rdzv_backend;
    char *rdzv_endpoint;        /* --rdzv-endpoint host[:port], "" if unset; for etcd, the
                                 * members: host[:port][,host[:port]...] */
    char *rdzv_host;            /* host part of the endpoint (or master_addr) */
    int rdzv_port;              /* port of the endpoint (default 29400 for c10d, as torchrun);
                                 * 0: this agent hosts the store on a free port and publishes it
                                 * (--standalone, or one node without --master-port or endpoint) */
    char *rdzv_id;              /* --rdzv-id, default "none" */
    double join_timeout_s;      /* --rdzv-conf join_timeout, default 600 */
    double last_call_timeout_s; /* last_call_timeout, default 30 */
    double close_timeout_s;     /* close_timeout, default 30 */
    double read_timeout_s;      /* read_timeout, default 60 */
    double timeout_s;           /* timeout (store operations), default 900 */
    bool is_host;               /* rdzv_conf is_host, if given; true for a local store (port 0) */
    int is_host_given;          /* 0: derive from the endpoint's host, as torchrun */
    bool standalone;            /* --standalone: 1 node, 127.0.0.1 port 0 */

    /* Restarts and monitoring. */
    int max_restarts;          /* --max-restarts, default 0 */
    double monitor_interval_s; /* --monitor-interval, accepted (ddprun reacts to events) */
    double shutdown_timeout_s; /* --shutdown-timeout: SIGTERM to SIGKILL grace, default 30 */
    char *role;                /* --role, default "default" */
    char *start_method;        /* --start-method, accepted: spawn, fork, forkserver */

    /* What to run. */
    bool module;    /* -m/--module */
    bool no_python; /* --no-python */
    bool run_path;  /* --run-path */
    char **argv;    /* training script and its arguments (borrowed from main's argv) */
    int argc;

    /* Output. */
    char *log_dir;                    /* --log-dir, NULL: none */
    int redirects[DDPRUN_MAX_LOCAL];  /* per local rank, DDPRUN_STD_* */
    int tee[DDPRUN_MAX_LOCAL];        /* per local rank, DDPRUN_STD_* */
    bool local_ranks_filter_set;      /* --local-ranks-filter given */
    bool show_rank[DDPRUN_MAX_LOCAL]; /* which local ranks reach the console */
    bool prefix_output;               /* prefix lines with [rank]: (default on) */
    char *log_line_prefix_template;   /* --log-line-prefix-template, NULL: "[${rank}]:" */

    /* Slurm: set when the values above came from SLURM_* variables. */
    bool from_slurm;

    /* Added by options.c (extensions at the end, per house rules). */
    double keep_alive_interval_s;   /* rdzv_conf keep_alive_interval, default 5 */
    int keep_alive_max_attempt;     /* rdzv_conf keep_alive_max_attempt, default 3 */
    bool virtual_local_rank;        /* --virtual-local-rank: LOCAL_RANK 0, one GPU per worker */
    char *logs_specs;               /* --logs-specs: accepted, warned of; NULL if unset */
    char *numa_binding;             /* --numa-binding: checked, warned of; NULL if unset */
    char *signals_to_handle;        /* --signals-to-handle: checked; default torchrun's list */
    char *event_log_handler;        /* --event-log-handler: accepted; default "null" */
    char *duplicate_stdout_filters; /* --duplicate-stdout-filters: accepted, warned of */
    char *duplicate_stderr_filters; /* --duplicate-stderr-filters: accepted, warned of */
    double heartbeat_timeout_s;     /* rdzv_conf heartbeat_timeout; 0: unset (see below) */
    double hung_timeout_s;          /* --hung-timeout: all workers stopped or silent this long
                                     * fail the node; 0 (default): never */

    /* The job's control plane (ddprun(1), SECURITY). */
    char *token_file; /* --token-file, NULL if not given (DDPRUN_TOKEN_FILE, DDPRUN_TOKEN are
                         read by jobtoken.c) */
    char **allow;     /* --allow networks ("10.0.0.0/8", an address), nallow of them, checked */
    int nallow;

    /* The etcd backend's connection (--rdzv-conf protocol, cacert, cert, key; ddprun(1)). */
    bool etcd_https;   /* protocol=https */
    char *etcd_cacert; /* CA of the members' certificates; NULL: the system's */
    char *etcd_cert;   /* client certificate and its key; NULL: none */
    char *etcd_key;
    bool timeout_given; /* --rdzv-conf timeout was given (the etcd backend's join timeout) */

    /* What runs, resolved from the training script (ddprun(1), DESCRIPTION). */
    bool python;    /* run "$PYTHON_EXEC -u [-m] argv..." */
    char *program;  /* else exec this with argv[1...]: argv[0], or "./" argv[0] for a program
                     * in the working directory named without a slash */
    char *warnings; /* lines "warning: ...\n" that ddprun prints as its own messages before
                     * it starts (options that change nothing, Slurm settings it did not
                     * use); NULL if none */

    /* Containment (ddprun(1), PROCESS CONTAINMENT). */
    bool pid_namespace; /* workers in a PID namespace where permitted; off: --no-pid-namespace */

    /* Store proxy (ddprun(1), STORE PROXY). */
    bool store_proxy; /* --store-proxy on: this node's workers reach the store through one */

    /* Worker terminals (ddprun(1), OUTPUT). */
    ddprun_tty tty; /* --tty */
} ddprun_config;

/*
 * Node liveness from the rendezvous settings: a node beats every *beat_s and is dead after
 * *dead_after_s without a beat. dead_after_s is heartbeat_timeout when given, else
 * keep_alive_interval * keep_alive_max_attempt (torchrun's expiry: 15 s by default); beat_s is
 * keep_alive_interval, shortened where needed so that keep_alive_max_attempt beats fit in
 * dead_after_s. Pure arithmetic on a parsed config.
 */
void ddprun_liveness(const ddprun_config *cfg, double *beat_s, double *dead_after_s);

/*
 * The monitor's slice in milliseconds for a round of `nnodes` nodes: how long each of its store
 * waits lasts, and so how often it looks at its peers' heartbeats and at joining nodes (a few
 * requests per node and slice at the store). 250 ms up to 1,000 nodes, then nnodes / 4 ms, so
 * that the store's steady load stops growing with the job (2.5 s at 10,000 nodes); never more
 * than a quarter of dead_after_s nor than beat_s, never less than 10 ms. Pure arithmetic.
 */
int ddprun_monitor_slice_ms(double beat_s, double dead_after_s, int nnodes);

/*
 * Parses argv (argv[0] is the program name) with PET_<NAME> environment defaults and, in a Slurm
 * step (SLURM_JOB_ID and SLURM_STEP_ID set) where the user did not pass them, the step's
 * SLURM_STEP_NUM_NODES/SLURM_NODEID/SLURM_STEP_NODELIST (SLURM_STEP_NUM_TASKS/SLURM_PROCID when
 * the step runs more tasks than nodes). Decides whether the training script runs under Python,
 * which reads the script's first bytes.
 * Returns 0 and fills *cfg; 1 when --help, --version or --print-completion printed its text
 * (exit 0); -EINVAL with a message naming the offending flag in err (exit 2, as argparse); or
 * -ENOMEM. *cfg is written only when 0 is returned. Strings in *cfg are owned by it: free with
 * ddprun_config_free(); cfg->argv points into argv. Reads the environment; not thread-safe
 * against setenv().
 */
int ddprun_config_parse(int argc, char **argv, ddprun_config *cfg, char *err, size_t errlen);

void ddprun_config_free(ddprun_config *cfg);

/* The name of rendezvous backend `backend` (--rdzv-backend's value, and the name of its row in
 * backend.h's table), or NULL for a value out of range. */
const char *ddprun_backend_name(ddprun_backend backend);

/*
 * The device a worker of local rank local_rank sees as its only one under --virtual-local-rank,
 * as torchrun picks it: entry local_rank of visible (CUDA_VISIBLE_DEVICES or
 * HIP_VISIBLE_DEVICES, comma-separated), or local_rank itself when visible is NULL. Writes it to
 * buf. Returns 0, or -ERANGE when visible has no such entry or buf is too small. Pure.
 */
int ddprun_virtual_device(const char *visible, int local_rank, char *buf, size_t len);

/* Writes --help to stdout, from the same option table the parser uses. */
void ddprun_print_help(void);

#endif /* DDPRUN_OPTIONS_H */
