/*
 * ddprun's internal declarations, shared by the files of the one program: the agent's state
 * (struct agent, its workers and their output streams, the store calls it queues), the constants
 * of its timing, and the functions one file calls in another. Nothing here is an API. The
 * program is ddprun.c (the agent's rounds, failures, signals, store calls, main), spawn.c (the
 * workers' environment, PID namespace and spawning, the log directory), relay.c (the output
 * relay), monitor.c (the monitor thread) and guard.c (the worker guard and the namespace's init:
 * the ddp-guard program, whose process-tree helpers ddprun shares).
 */
#ifndef DDPRUN_AGENT_H
#define DDPRUN_AGENT_H

#include "backend.h"
#include "console.h"
#include "failure.h"
#include "noderdzv.h"
#include "options.h"
#include "rdzv.h"
#include "walltime.h"

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#define PROG "ddprun"
#define HEARTBEAT_MS 250 /* the exit barrier's slice (the monitor's: ddprun_monitor_slice_ms()) */
#define MEMBERSHIP_CHANGE "nodes are waiting to join"
/* A console that took no output for STALL_MS (TICK_MS after a signal) is stalled: once a round's
 * workers are gone, ddprun stops waiting for it, the end of the round and the exit counting as
 * one wait (console_wait_begin()). At exit a failure report gets EXIT_WAIT_MS
 * to be sent. Each console queues CONSOLE_LIMIT bytes before the workers writing to it wait;
 * lines are assembled up to LINE_MAX_BYTES, longer ones go out in pieces; an unfinished line
 * goes out once it has waited PARTIAL_MS for its newline. */
#define TICK_MS 500
#define STALL_MS 2000
#define EXIT_WAIT_MS 1000
#define CONSOLE_LIMIT (1u << 20)
#define LINE_MAX_BYTES (1u << 20)
#define PARTIAL_MS 50

/*
 * A line assembler for one output stream of one worker (see relay.c). `col0` and `after_cr` are
 * where the stream's console output stands: at the start of a line (its prefix is due before
 * the next byte) and just after a carriage return.
 */
typedef struct stream {
    struct worker *w;
    uv_pipe_t pipe;
    uv_timer_t partial_timer; /* flushes a partial line that waited PARTIAL_MS */
    int which;                /* DDPRUN_STD_OUT or DDPRUN_STD_ERR */
    int file;                 /* log file fd, -1 if none */
    bool console;
    char *line; /* bytes not yet relayed: an unfinished line */
    size_t len, cap;
    bool open;
    int closing; /* handles (pipe, timer) whose close callback is still due */
    bool paused; /* reading stopped: its console is over its limit (back-pressure) */
    bool col0, after_cr;
    /* A pseudo-terminal (--tty; spawn.c's setup_stream()): `poll` watches its master side,
     * `master`, in place of `pipe` (relay.c's pty_readable()), and the worker holds `slave`
     * (ddprun's copy until the guard is started; else -1). On a
     * terminal console (relay.c) `cur` is the live line: the prefix (cur_pl bytes) and what
     * follows the line's last carriage return (cur_cr: one came, and the text after it is
     * still to come). For the log file, `fl` holds the clean text not yet written: whole lines
     * up to fl_start, then the final state of the unfinished line; fl_esc is where an escape
     * sequence being dropped stands. */
    bool pty;
    uv_poll_t poll;
    int master, slave;
    char *cur;
    size_t cur_len, cur_cap, cur_pl;
    bool cur_cr;
    char *fl;
    size_t fl_len, fl_cap, fl_start;
    bool fl_cr;
    int fl_esc;
} stream;

typedef struct worker {
    struct agent *a;
    int local_rank, rank;
    char prefix[256]; /* of its console lines (--log-line-prefix-template); "": none */
    stream out, err;
    pid_t pid;        /* the guard's: ddprun signals it */
    pid_t worker_pid; /* the program's, as the guard reported it (0: unknown) */
    int envfd;        /* memfd shared with the guard (environment in, worker pid out); -1 */
    bool running;
    bool exited_unstopped; /* had exited already when ddprun began stopping the workers */
    char error_file[PATH_MAX];
    uint64_t last_output_ms;   /* uv_now() at spawn or at its last output (--hung-timeout) */
    uint64_t stopped_since_ms; /* uv_now() when first seen stopped (state T), 0 if not */
    ddprun_tail err_tail;      /* the end of its standard error, for the failure summary */
} worker;

/*
 * ST_WAITING: no worker of this node exists and the agent waits on the store (connecting, a
 * rendezvous, the exit barrier) or for the next round to start. ST_RUNNING: workers run.
 * ST_STOPPING: they are being stopped. ST_DONE: the loop ends and ddprun exits.
 */
typedef enum { ST_WAITING, ST_RUNNING, ST_STOPPING, ST_DONE } agent_state;

struct agent;

/* A blocking store call run off the loop (see ddprun.c's file comment). */
typedef enum { JOB_CONNECT, JOB_RENDEZVOUS, JOB_PUBLISH, JOB_BARRIER } job_kind;

typedef struct store_job {
    uv_work_t req;
    struct agent *a;
    job_kind kind;
    struct store_job *next;
    int rc;
    int round;             /* RENDEZVOUS: the round to start from; then the round joined */
    ddprun_assignment asg; /* RENDEZVOUS: the result */
    char *json;            /* PUBLISH: the record (malloc); BARRIER: a failure (rdzv_free) */
    rdzv_server *srv;      /* RENDEZVOUS, a store moving with the rounds: the one served here */
    char store_host[256];  /* RENDEZVOUS, ditto: where the round's store is */
    int store_port;
    char err[1024]; /* what went wrong, for the loop thread to print */
    /* RENDEZVOUS with --store-proxy on (storeproxy.c): the round's proxy, started here, or the
     * agent's kept (keep_proxy); proxy_note: a line for the loop thread to print */
    rdzv_proxy *proxy;
    bool keep_proxy;
    char proxy_note[768];
} store_job;

/* The far end of a store connection that closed (the store's on_close hook). */
#define MAX_CLOSED 64
typedef struct closed_peer {
    char host[64];
    int port;
} closed_peer;

typedef struct agent {
    ddprun_config *cfg;
    uv_loop_t *loop;
    char hostname[256];
    char run_id[128];
    char prefix[DDPRUN_RDZV_MAX_PREFIX + 1]; /* this job's keys: DDPRUN_RDZV_ROOT "/<run_id>" */
    rdzv_server *store;     /* hosted here (node 0, the c10d host, the round's rank 0), else NULL;
                             * written on the loop under mu */
    char store_host[256];   /* where agents and workers reach the store */
    char connect_host[256]; /* where this agent reaches it */
    char bind_host[64];     /* the address the store hosted here binds */
    int store_port;
    char token[RDZV_TOKEN_MAX_BYTES + 1]; /* the job's secret (jobtoken.h); "": none */
    const ddprun_backend_ops *rdzv;       /* the rendezvous backend (--rdzv-backend) */
    ddprun_rdzv_conn *client;             /* the agent's own connection to it */
    ddprun_assignment asg;
    int restart_count;      /* TORCHELASTIC_RESTART_COUNT: failures restarted so far */
    int round;              /* rendezvous round: restarts and membership changes */
    bool membership_change; /* this round ends to admit nodes waiting to join */
    char logdir[PATH_MAX];  /* this run's directory of worker files (setup_log_dir()); "": none */
    bool keep_logs;         /* log files were asked for: logdir must exist, and is kept */
    char tmpbase[PATH_MAX]; /* a temporary directory to remove at exit; "": none */

    worker *workers;
    int nworkers, nrunning;
    int nstreams;             /* worker output pipes still open */
    uv_timer_t restart_timer; /* starts the next round from a fresh loop iteration */
    bool round_done;          /* round_over() ran for this round */
    uv_timer_t drain_timer;   /* closes pipes that outlive every worker and guard */
    int drain_ticks;          /* its ticks (TICK_MS) since the last worker exited */
    bool con_waiting;         /* the round's one wait for the consoles has begun */
    uint64_t con_written[3];  /* per console: bytes written when console_stalled() looked */
    uint64_t con_moved_ms[3]; /* uv_now() when they last grew, or when the wait began */
    ddprun_console *con[3];   /* [1] standard output, [2] standard error */
    stream *partial[3];       /* per console: the stream whose bytes there end mid-line */
    agent_state state;
    bool stop_for_signal;
    int signal_seen;     /* the terminating signal that stopped the job, if any */
    bool exit_wait_over; /* at exit: stop waiting for output and failure reports */
    int exit_ticks;      /* the exit timer's ticks (TICK_MS) */
    int sigint_count;
    uv_signal_t sigs[6];
    uv_timer_t kill_timer;
    uv_timer_t hung_timer;       /* --hung-timeout: looks at the workers now and then */
    uv_async_t remote;           /* the monitor saw a failure elsewhere */
    store_job *jobs, *jobs_tail; /* store calls waiting for their turn */
    store_job *job;              /* the one running on the thread pool, or NULL */

    ddprun_failure *failures; /* this round's, local or reported by another node */
    size_t nfailures;
    int exit_code;

    /* monitor thread */
    pthread_t monitor;
    bool monitor_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int monitor_round;              /* round the monitor watches; -1: stop */
    char remote_failure[32768];     /* a record's JSON, every field full and escaped, fits */
    int remote_round;               /* the round remote_failure belongs to */
    closed_peer closed[MAX_CLOSED]; /* store connections that closed (ring; under mu) */
    uint64_t nclosed, closed_seen;  /* ring positions: written, looked at by the monitor */

    /* The workers' PID namespace (job_ns_start()) */
    pid_t init_pid;      /* its init, while it runs; 0: none */
    int init_alive_fd;   /* the pipe's write end the init watches; -1 */
    int init_ready_fd;   /* the pipe the init says it is ready on, until read; -1 */
    int mntns_fd;        /* the init's mount namespace, for the guards to join; -1 */
    int own_pidns_fd;    /* ddprun's own PID namespace, to go back to; -1 */
    bool ns_unavailable; /* no PID namespace can be had: the guards contain the workers */

    bool rdzv_lost; /* the rendezvous is gone for good: the store died with the node serving it
                     * (store_gone_with_node()), or this node lost its place (heartbeat());
                     * no restart can follow. Under mu */

    /* --store-proxy on (storeproxy.c): the proxy this node's workers reach the store through,
     * on 127.0.0.1:proxy_port, for the store at proxy_up_host:proxy_up_port; NULL/0: none,
     * they reach the store itself. Changed on the loop thread between rounds. */
    rdzv_proxy *proxy;
    int proxy_port;
    char proxy_up_host[256];
    int proxy_up_port;

    /* Spawning the guards (spawn.c) */
    char guard[PATH_MAX]; /* the ddp-guard program's path; "": not looked up yet */
    uv_signal_t sigchld;  /* reaps the guards (on_sigchld()) */
    bool sigchld_started;

    /* The join watch (monitor.c): says who failed to authenticate while this node waits */
    pthread_t joinwatch;
    bool joinwatch_started;
    bool joining; /* a rendezvous runs; under mu */

    /* Worker terminals (relay.c): SIGWINCH resizes them */
    uv_signal_t sigwinch;
    bool sigwinch_started;
} agent;

/* ddprun.c */
void die_oom(void);
void *xcalloc(size_t n, size_t sz);
void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void describe_exit(int code, char *buf, size_t n);
void maybe_round_over(agent *a);
void on_worker_exit(worker *w, int64_t status, int term_signal);

/* storeproxy.c */
void store_proxy_job(agent *a, store_job *j);
void store_proxy_adopt(agent *a, store_job *j);

/* spawn.c */
int job_ns_start(agent *a);
int spawn_worker(agent *a, worker *w);
void cleanup_tmpdir(const char *dir);
int setup_log_dir(agent *a);

/* relay.c */
void line_prefix(const agent *a, const worker *w, char *out, size_t n);
int write_all(int fd, const char *p, size_t n, size_t *done);
void stdout_drained(void *arg);
void stderr_drained(void *arg);
void stream_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
void stream_close(stream *s);
void stream_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);
void stream_drain(stream *s); /* reads what the pipe holds now, as stream_read() would */
void stream_start(stream *s);
void relay_start(agent *a);
bool relay_renders(const agent *a, int which);
void stream_set_winsize(stream *s, int master);

/* monitor.c */
void store_conn_closed(void *arg, const char *host, int port);
void *monitor_main(void *arg);
void monitor_set_round(agent *a, int round);
void *joinwatch_main(void *arg);
void joinwatch_set(agent *a, bool joining); /* a rendezvous starts (true) or ended */

/*
 * After a store call of this agent failed with `rc`: true when that means the store is gone
 * with the node serving it -- the backend's store dies with its node (store_dies_with_node),
 * this agent does not serve it, `rc` is a lost or refused connection, and a new connection to
 * the store is refused at once. Then writes the sentence saying so (naming the endpoint) to
 * `msg` (`n` bytes) and sets a->rdzv_lost. Any thread; blocks for one connection attempt of
 * at most 2 s.
 */
bool store_gone_with_node(agent *a, int rc, char *msg, size_t n);
bool rdzv_is_lost(agent *a); /* a->rdzv_lost, read under the mutex */
void rdzv_set_lost(agent *a);

#endif /* DDPRUN_AGENT_H */
