/*
 * ddprun: the torchrun-compatible launcher. One agent per node: it hosts the rendezvous store
 * (node 0, or the c10d endpoint's host) in-process on a thread of its own, runs the node-level
 * rendezvous through it, spawns the local workers with torchrun's environment, relays their
 * output line by line, and tears everything down when a worker fails anywhere in the job,
 * restarting the whole job while restarts remain.
 *
 * Event handling is libuv's: process exits, pipes, signals and timers on one loop. Blocking
 * store calls (rendezvous, publishing a failure) happen on the loop thread, which is safe
 * because the store never runs on this loop; a monitor thread blocks on the store instead,
 * waiting for a failure anywhere in the job or a node's heartbeat to stop, and wakes the loop
 * with uv_async_send().
 *
 * Each worker runs in its own process group, so signals reach its children too. Workers are
 * started through a small exec shim (this same binary, re-executed) that sets a parent-death
 * signal before exec'ing the real program: a SIGKILLed ddprun leaves no worker behind.
 *
 * Not done here: option parsing (options.c), the node rendezvous protocols (noderdzv.c).
 */
#include "failure.h"
#include "noderdzv.h"
#include "options.h"
#include "rdzv.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netdb.h>
#include <sys/socket.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#define SHIM_FLAG "--ddprun-exec-shim"
#define PROG "ddprun"
#define HEARTBEAT_MS 250
#define DEAD_AFTER_S 1.0
#define MEMBERSHIP_CHANGE "nodes are waiting to join"

extern char **environ;

/* ---------------------------------------------------------------------------------------- */
/* Exec shim                                                                                */
/* ---------------------------------------------------------------------------------------- */

/*
 * argv: ddprun --ddprun-exec-shim PARENT_PID program args...
 * Runs in the freshly spawned worker (already its own session and process group): asks for
 * SIGKILL when the parent dies, then checks that the parent is still the one that spawned it
 * (closing the race where it died before prctl), then becomes the program.
 */
static int shim_main(int argc, char **argv)
{
    if (argc < 4)
        return 127;
    pid_t parent = (pid_t)strtol(argv[2], NULL, 10);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
        _exit(128 + SIGKILL);
    execvp(argv[3], argv + 3);
    fprintf(stderr, PROG ": cannot execute '%s': %s\n", argv[3], strerror(errno));
    return errno == ENOENT ? 127 : 126;
}

/* ---------------------------------------------------------------------------------------- */
/* Agent state                                                                              */
/* ---------------------------------------------------------------------------------------- */

/* A line assembler for one output stream of one worker. */
typedef struct stream {
    struct worker *w;
    uv_pipe_t pipe;
    int which; /* DDPRUN_STD_OUT or DDPRUN_STD_ERR */
    int file;  /* log file fd, -1 if none */
    bool console;
    char *line; /* bytes of an unfinished line */
    size_t len, cap;
    bool open;
} stream;

typedef struct worker {
    struct agent *a;
    int local_rank, rank;
    uv_process_t proc;
    stream out, err;
    pid_t pid;
    bool running;
    char error_file[PATH_MAX];
} worker;

typedef enum { ST_RUNNING, ST_STOPPING, ST_DONE } agent_state;

typedef struct agent {
    ddprun_config *cfg;
    uv_loop_t *loop;
    char hostname[256];
    char run_id[128];
    char prefix[DDPRUN_RDZV_MAX_PREFIX + 1]; /* this job's keys: DDPRUN_RDZV_ROOT "/<run_id>" */
    rdzv_server *store;                      /* hosted here (node 0 / c10d host), else NULL */
    char store_host[256];                    /* where agents and workers reach the store */
    int store_port;
    rdzv_client *client; /* the agent's own connection */
    ddprun_assignment asg;
    int restart_count;      /* TORCHELASTIC_RESTART_COUNT: failures restarted so far */
    int round;              /* rendezvous round: restarts and membership changes */
    bool membership_change; /* this round ends to admit nodes waiting to join */
    char tmpdir[PATH_MAX];  /* per-run directory of the workers' error files */

    worker *workers;
    int nworkers, nrunning;
    int nstreams;             /* worker output pipes still open */
    int nprocs;               /* worker process handles not closed yet */
    uv_timer_t restart_timer; /* starts the next round from a fresh loop iteration */
    bool round_done;          /* round_over() ran for this round */
    uv_timer_t drain_timer;   /* closes pipes that outlive every worker (setsid'd grandchildren) */
    agent_state state;
    bool stop_for_signal;
    int signal_seen; /* the terminating signal that stopped the job, if any */
    int sigint_count;
    uv_signal_t sigs[6];
    uv_timer_t kill_timer;
    uv_async_t remote; /* the monitor saw a failure elsewhere */

    ddprun_failure *failures; /* this round's, local or reported by another node */
    size_t nfailures;
    int exit_code;

    /* monitor thread */
    pthread_t monitor;
    bool monitor_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int monitor_round; /* round the monitor watches; -1: stop */
    char remote_failure[1024];
    int remote_round; /* the round remote_failure belongs to */
} agent;

static void die_oom(void)
{
    fputs(PROG ": out of memory\n", stderr);
    exit(1);
}

static void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n, sz);
    if (!p)
        die_oom();
    return p;
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof(line) - 2)
        n = (int)sizeof(line) - 2;
    line[n++] = '\n';
    fputs(PROG ": ", stderr);
    fwrite(line, 1, (size_t)n, stderr);
}

/* ---------------------------------------------------------------------------------------- */
/* Worker environment                                                                       */
/* ---------------------------------------------------------------------------------------- */

typedef struct envb {
    char **v;
    size_t n, cap;
} envb;

/* Sets NAME=value in the array, replacing an inherited value. */
static void env_set(envb *e, const char *name, const char *value)
{
    size_t nl = strlen(name);
    char *kv = malloc(nl + strlen(value) + 2);
    if (!kv)
        die_oom();
    sprintf(kv, "%s=%s", name, value);
    for (size_t i = 0; i < e->n; i++) {
        if (strncmp(e->v[i], name, nl) == 0 && e->v[i][nl] == '=') {
            free(e->v[i]);
            e->v[i] = kv;
            return;
        }
    }
    if (e->n + 2 > e->cap) {
        e->cap = e->cap ? e->cap * 2 : 64;
        e->v = realloc(e->v, e->cap * sizeof(*e->v));
        if (!e->v)
            die_oom();
    }
    e->v[e->n++] = kv;
    e->v[e->n] = NULL;
}

static void env_seti(envb *e, const char *name, long long v)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "%lld", v);
    env_set(e, name, buf);
}

static void env_free(envb *e)
{
    for (size_t i = 0; i < e->n; i++)
        free(e->v[i]);
    free(e->v);
}

/* The environment torchrun gives a worker: the parent's, plus the rendezvous results. */
static envb worker_env(agent *a, worker *w)
{
    ddprun_config *cfg = a->cfg;
    envb e = {0};
    for (char **p = environ; *p; p++) {
        char *eq = strchr(*p, '=');
        if (!eq)
            continue;
        char name[256];
        size_t nl = (size_t)(eq - *p);
        if (nl >= sizeof(name))
            continue;
        memcpy(name, *p, nl);
        name[nl] = '\0';
        env_set(&e, name, eq + 1);
    }
    env_seti(&e, "LOCAL_RANK", w->local_rank);
    env_seti(&e, "RANK", w->rank);
    env_seti(&e, "GROUP_RANK", a->asg.node_rank);
    env_seti(&e, "ROLE_RANK", w->rank);
    env_set(&e, "ROLE_NAME", cfg->role);
    env_seti(&e, "LOCAL_WORLD_SIZE", cfg->nproc_per_node);
    env_seti(&e, "WORLD_SIZE", a->asg.world_size);
    env_seti(&e, "GROUP_WORLD_SIZE", a->asg.nnodes);
    env_seti(&e, "ROLE_WORLD_SIZE", a->asg.world_size);
    env_set(&e, "MASTER_ADDR", a->store_host);
    env_seti(&e, "MASTER_PORT", a->store_port);
    env_seti(&e, "TORCHELASTIC_RESTART_COUNT", a->restart_count);
    env_seti(&e, "TORCHELASTIC_MAX_RESTARTS", cfg->max_restarts);
    env_set(&e, "TORCHELASTIC_RUN_ID", a->run_id);
    env_set(&e, "TORCHELASTIC_USE_AGENT_STORE", "True");
    env_set(&e, "TORCHELASTIC_ERROR_FILE", w->error_file);
    const char *v = getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING");
    env_set(&e, "TORCH_NCCL_ASYNC_ERROR_HANDLING", v ? v : "1");
    v = getenv("NCCL_ASYNC_ERROR_HANDLING");
    env_set(&e, "NCCL_ASYNC_ERROR_HANDLING", v ? v : "1");
    env_set(&e, "TORCHELASTIC_SIGNALS_TO_HANDLE",
            cfg->signals_to_handle ? cfg->signals_to_handle : "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
    if (!getenv("OMP_NUM_THREADS") && cfg->nproc_per_node > 1)
        env_set(&e, "OMP_NUM_THREADS", "1");
    return e;
}

/* ---------------------------------------------------------------------------------------- */
/* Output relay                                                                             */
/* ---------------------------------------------------------------------------------------- */

/* Expands the prefix template (${rank}, ${local_rank}, ${role_name}) for one worker. */
static void line_prefix(const agent *a, const worker *w, char *out, size_t n)
{
    const char *t =
        a->cfg->log_line_prefix_template ? a->cfg->log_line_prefix_template : "[${rank}]:";
    size_t o = 0;
    while (*t && o + 1 < n) {
        char val[64];
        const char *sub = NULL;
        size_t skip = 0;
        if (!strncmp(t, "${rank}", 7)) {
            snprintf(val, sizeof(val), "%d", w->rank);
            sub = val, skip = 7;
        } else if (!strncmp(t, "${local_rank}", 13)) {
            snprintf(val, sizeof(val), "%d", w->local_rank);
            sub = val, skip = 13;
        } else if (!strncmp(t, "${role_name}", 12)) {
            sub = a->cfg->role, skip = 12;
        }
        if (sub) {
            o += (size_t)snprintf(out + o, n - o, "%s", sub);
            if (o >= n)
                o = n - 1;
            t += skip;
        } else {
            out[o++] = *t++;
        }
    }
    out[o] = '\0';
}

static void write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        p += k;
        n -= (size_t)k;
    }
}

/* Writes complete lines of `s` (and, at EOF, the rest) to the console with the prefix. */
static void relay_lines(stream *s, bool eof)
{
    agent *a = s->w->a;
    int fd = s->which == DDPRUN_STD_OUT ? STDOUT_FILENO : STDERR_FILENO;
    char prefix[256] = "";
    if (a->cfg->prefix_output)
        line_prefix(a, s->w, prefix, sizeof(prefix));
    size_t pl = strlen(prefix), start = 0;
    for (size_t i = 0; i < s->len; i++) {
        if (s->line[i] != '\n')
            continue;
        /* One write per line keeps lines of different workers from interleaving. */
        size_t ll = i + 1 - start;
        char stackbuf[4096];
        char *buf = pl + ll <= sizeof(stackbuf) ? stackbuf : malloc(pl + ll);
        if (buf) {
            memcpy(buf, prefix, pl);
            memcpy(buf + pl, s->line + start, ll);
            write_all(fd, buf, pl + ll);
            if (buf != stackbuf)
                free(buf);
        }
        start = i + 1;
    }
    if (eof && start < s->len) {
        write_all(fd, prefix, pl);
        write_all(fd, s->line + start, s->len - start);
        write_all(fd, "\n", 1);
        start = s->len;
    }
    memmove(s->line, s->line + start, s->len - start);
    s->len -= start;
}

static void stream_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    stream *s = h->data;
    (void)suggested;
    if (s->cap - s->len < 16384) {
        size_t cap = s->cap ? s->cap * 2 : 65536;
        char *p = realloc(s->line, cap);
        if (!p) {
            *buf = uv_buf_init(NULL, 0);
            return;
        }
        s->line = p;
        s->cap = cap;
    }
    *buf = uv_buf_init(s->line + s->len, (unsigned)(s->cap - s->len));
}

static void maybe_round_over(struct agent *a);

static void stream_closed(uv_handle_t *h)
{
    stream *s = h->data;
    free(s->line);
    s->line = NULL;
    s->len = s->cap = 0;
    s->w->a->nstreams--;
    maybe_round_over(s->w->a);
}

static void stream_close(stream *s)
{
    if (!s->open)
        return;
    if (s->console)
        relay_lines(s, true);
    s->len = 0;
    if (s->file >= 0)
        close(s->file);
    s->file = -1;
    s->open = false;
    uv_close((uv_handle_t *)&s->pipe, stream_closed);
}

static void stream_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    stream *s = st->data;
    (void)buf;
    if (nread > 0) {
        /* Bytes go to the log file as they arrive: no tail thread, no lag. */
        if (s->file >= 0)
            write_all(s->file, s->line + s->len, (size_t)nread);
        s->len += (size_t)nread;
        if (s->console)
            relay_lines(s, false);
        else
            s->len = 0;
        if (s->len == s->cap) { /* a line longer than the buffer: pass it on as it is */
            if (s->console)
                relay_lines(s, true);
            s->len = 0;
        }
        return;
    }
    if (nread < 0)
        stream_close(s);
}

/* ---------------------------------------------------------------------------------------- */
/* Failures and the summary                                                                 */
/* ---------------------------------------------------------------------------------------- */

/* Reads the message a worker left in its TORCHELASTIC_ERROR_FILE (PyTorch's @record format). */
static void read_error_file(const char *path, char *msg, size_t n)
{
    msg[0] = '\0';
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root)
        return;
    json_t *m = json_object_get(root, "message");
    const char *text = NULL;
    if (json_is_string(m))
        text = json_string_value(m);
    else if (json_is_object(m))
        text = json_string_value(json_object_get(m, "message"));
    if (text) {
        /* First line only: the summary is a table. */
        size_t l = strcspn(text, "\n");
        if (l >= n)
            l = n - 1;
        memcpy(msg, text, l);
        msg[l] = '\0';
    }
    json_decref(root);
}

static void add_failure(agent *a, const ddprun_failure *f)
{
    for (size_t i = 0; i < a->nfailures; i++)
        if (!strcmp(a->failures[i].node, f->node) && a->failures[i].rank == f->rank &&
            a->failures[i].pid == f->pid)
            return;
    a->failures = realloc(a->failures, (a->nfailures + 1) * sizeof(*f));
    if (!a->failures)
        die_oom();
    a->failures[a->nfailures++] = *f;
}

static int cmp_failure(const void *x, const void *y)
{
    const ddprun_failure *a = x, *b = y;
    return a->time < b->time ? -1 : a->time > b->time;
}

static void describe_exit(int code, char *buf, size_t n)
{
    if (code >= 0)
        snprintf(buf, n, "exit %d", code);
    else
        snprintf(buf, n, "signal %d (%s)", -code, sigabbrev_np(-code) ? sigabbrev_np(-code) : "?");
}

/* Prints the failure table, the root cause (earliest failure) first. */
static void print_summary(agent *a)
{
    if (a->nfailures == 0)
        return;
    qsort(a->failures, a->nfailures, sizeof(ddprun_failure), cmp_failure);
    fprintf(stderr, "%s\n", "============================================================");
    fprintf(stderr, PROG ": job failed (attempt %d of %d)\n", a->restart_count,
            a->cfg->max_restarts + 1);
    fprintf(stderr, "%-8s %-23s %-16s %5s %5s %-18s %8s  %s\n", "", "time", "node", "rank", "local",
            "exit", "pid", "message");
    for (size_t i = 0; i < a->nfailures; i++) {
        const ddprun_failure *f = &a->failures[i];
        char when[32], how[48];
        time_t t = (time_t)f->time;
        struct tm tm;
        localtime_r(&t, &tm);
        strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
        snprintf(when + strlen(when), sizeof(when) - strlen(when), ".%03d",
                 (int)((f->time - (double)t) * 1000));
        describe_exit(f->exit_code, how, sizeof(how));
        fprintf(stderr, "%-8s %-23s %-16s %5d %5d %-18s %8d  %s\n", i == 0 ? "root" : "", when,
                f->node, f->rank, f->local_rank, how, f->pid, f->message);
    }
    fprintf(stderr, "%s\n", "============================================================");
}

/* ---------------------------------------------------------------------------------------- */
/* Stopping                                                                                 */
/* ---------------------------------------------------------------------------------------- */

static void signal_workers(agent *a, int sig)
{
    for (int i = 0; i < a->nworkers; i++)
        if (a->workers[i].running)
            kill(-a->workers[i].pid, sig); /* the whole process group */
}

static void kill_timer_cb(uv_timer_t *t)
{
    agent *a = t->data;
    if (a->nrunning > 0) {
        say("workers still running %.0f s after SIGTERM: sending SIGKILL",
            a->cfg->shutdown_timeout_s);
        signal_workers(a, SIGKILL);
    }
}

/* Stops every local worker: SIGTERM to each process group, SIGKILL after the grace period. */
static void stop_workers(agent *a)
{
    if (a->state != ST_RUNNING)
        return;
    a->state = ST_STOPPING;
    signal_workers(a, SIGTERM);
    if (a->nrunning > 0)
        uv_timer_start(&a->kill_timer, kill_timer_cb,
                       (uint64_t)(a->cfg->shutdown_timeout_s * 1000.0), 0);
}

/* ---------------------------------------------------------------------------------------- */
/* Spawning                                                                                 */
/* ---------------------------------------------------------------------------------------- */

static void on_worker_exit(uv_process_t *p, int64_t status, int term_signal);

/* Builds the command: python3 -u script, python3 -u -m module, or the program itself. */
static char **worker_argv(agent *a, int *argc_out)
{
    ddprun_config *cfg = a->cfg;
    const char *py = getenv("PYTHON_EXEC") ? getenv("PYTHON_EXEC") : "python3"; /* as torchrun */
    size_t n = (size_t)cfg->argc;
    char **v = xcalloc(n + 8, sizeof(char *));
    int k = 0;
    const char *script = cfg->argv[0];
    size_t sl = strlen(script);
    bool python = !cfg->no_python &&
                  (cfg->module || cfg->run_path || (sl > 3 && !strcmp(script + sl - 3, ".py")));
    if (python) {
        v[k++] = (char *)py;
        v[k++] = "-u";
        if (cfg->module)
            v[k++] = "-m";
    }
    for (int i = 0; i < cfg->argc; i++)
        v[k++] = cfg->argv[i];
    v[k] = NULL;
    *argc_out = k;
    return v;
}

static int mkdirs(const char *path)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof(tmp), "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return -errno;
    return 0;
}

static int open_log(agent *a, worker *w, const char *name)
{
    char dir[PATH_MAX], path[PATH_MAX];
    if (snprintf(dir, sizeof(dir), "%s/attempt_%d/rank_%d", a->cfg->log_dir, a->restart_count,
                 w->rank) >= (int)sizeof(dir) ||
        mkdirs(dir) < 0 || snprintf(path, sizeof(path), "%s/%s", dir, name) >= (int)sizeof(path))
        return -1;
    return open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
}

static void setup_stream(agent *a, worker *w, stream *s, int which, uv_stdio_container_t *io)
{
    ddprun_config *cfg = a->cfg;
    int lr = w->local_rank;
    bool redirect = (cfg->redirects[lr] & which) != 0, tee = (cfg->tee[lr] & which) != 0;
    s->w = w;
    s->which = which;
    s->file = -1;
    s->console = !redirect && (!cfg->local_ranks_filter_set || cfg->show_rank[lr]);
    if ((redirect || tee) && cfg->log_dir)
        s->file = open_log(a, w, which == DDPRUN_STD_OUT ? "stdout.log" : "stderr.log");
    bool need_pipe = s->file >= 0 || (s->console && (cfg->prefix_output)) || !s->console;
    if (!need_pipe) {
        /* Nothing to add: the worker writes straight to our terminal, with no relay at all. */
        io->flags = UV_INHERIT_FD;
        io->data.fd = which == DDPRUN_STD_OUT ? STDOUT_FILENO : STDERR_FILENO;
        return;
    }
    uv_pipe_init(a->loop, &s->pipe, 0);
    s->pipe.data = s;
    s->open = true;
    a->nstreams++;
    io->flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    io->data.stream = (uv_stream_t *)&s->pipe;
}

static int spawn_worker(agent *a, worker *w)
{
    int argc;
    char **cmd = worker_argv(a, &argc);
    char parent[32];
    snprintf(parent, sizeof(parent), "%d", (int)getpid());
    char **args = xcalloc((size_t)argc + 4, sizeof(char *));
    args[0] = PROG;
    args[1] = SHIM_FLAG;
    args[2] = parent;
    for (int i = 0; i < argc; i++)
        args[3 + i] = cmd[i];

    /* torchrun's layout: <tmp>/<run id>/attempt_<k>/<local rank>/error.json. */
    char dir[PATH_MAX];
    if (snprintf(dir, sizeof(dir), "%s/%s/attempt_%d/%d", a->tmpdir, a->run_id, a->restart_count,
                 w->local_rank) >= (int)sizeof(dir) ||
        snprintf(w->error_file, sizeof(w->error_file), "%s/error.json", dir) >=
            (int)sizeof(w->error_file))
        w->error_file[0] = '\0'; /* path too long: no error file */
    else if (mkdirs(dir) == 0)
        unlink(w->error_file);

    envb env = worker_env(a, w);
    uv_stdio_container_t io[3];
    io[0].flags = UV_INHERIT_FD;
    io[0].data.fd = STDIN_FILENO;
    setup_stream(a, w, &w->out, DDPRUN_STD_OUT, &io[1]);
    setup_stream(a, w, &w->err, DDPRUN_STD_ERR, &io[2]);

    char self[PATH_MAX];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (sl <= 0)
        snprintf(self, sizeof(self), "%s", "/proc/self/exe");
    else
        self[sl] = '\0';
    uv_process_options_t o = {0};
    o.file = self;
    o.args = args;
    o.env = env.v;
    o.exit_cb = on_worker_exit;
    o.flags = UV_PROCESS_DETACHED; /* setsid(): its own session and process group */
    o.stdio_count = 3;
    o.stdio = io;
    w->proc.data = w;
    int rc = uv_spawn(a->loop, &w->proc, &o);
    env_free(&env);
    free(args);
    free(cmd);
    if (rc < 0) {
        say("cannot start local rank %d: %s", w->local_rank, uv_strerror(rc));
        stream_close(&w->out);
        stream_close(&w->err);
        return rc;
    }
    a->nprocs++;
    w->pid = w->proc.pid;
    w->running = true;
    a->nrunning++;
    if (w->out.open)
        uv_read_start((uv_stream_t *)&w->out.pipe, stream_alloc, stream_read);
    if (w->err.open)
        uv_read_start((uv_stream_t *)&w->err.pipe, stream_alloc, stream_read);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Rounds                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static int run_round(agent *a);

static void publish_failure(agent *a, const ddprun_failure *f)
{
    char *js = ddprun_failure_to_json(f);
    if (!js)
        return;
    int rc = ddprun_rdzv_publish_failure(a->client, a->prefix, a->round, js);
    if (rc < 0)
        say("could not publish the failure through the store: %s", rdzv_strerror(rc));
    free(js);
}

/*
 * Torchrun's exit barrier (ddprun_rdzv_exit_barrier()), with an eye on the round's failure key: a
 * failure published by a node still running ends the wait. Returns 0 when all nodes finished (or
 * the barrier itself failed, which the node's own success outlives), -1 when a failure came first
 * (recorded for the summary).
 */
static int exit_barrier(agent *a)
{
    char *json = NULL;
    int rc = ddprun_rdzv_exit_barrier(a->client, a->prefix, a->round, a->asg.nnodes,
                                      a->cfg->close_timeout_s + 300.0, HEARTBEAT_MS, &json);
    if (rc == 1) {
        ddprun_failure f;
        if (ddprun_failure_from_json(json, &f) == 0)
            add_failure(a, &f);
        rdzv_free(json);
        return -1;
    }
    if (rc < 0)
        say("exit barrier: %s", rc == -ETIMEDOUT ? "timed out" : rdzv_strerror(rc));
    return 0;
}

static void restart_cb(uv_timer_t *t)
{
    agent *a = t->data;
    if (run_round(a) < 0) {
        a->state = ST_DONE;
        print_summary(a);
    }
}

/* Everything of this round has exited: restart, or finish. */
static void round_over(agent *a)
{
    uv_timer_stop(&a->kill_timer);
    if (a->membership_change && !a->stop_for_signal && a->nfailures == 0) {
        /* Nodes are waiting to join: every node re-rendezvous; no restart is used up. */
        a->membership_change = false;
        a->round++;
        a->state = ST_RUNNING;
        uv_timer_start(&a->restart_timer, restart_cb, 0, 0);
        return;
    }
    a->membership_change = false;
    bool failed = a->nfailures > 0 || a->state == ST_STOPPING;
    if (!failed) {
        /* Success here: wait for the other nodes before leaving, since node 0's store serves
         * them (torchrun's exit barrier) -- unless one of them fails meanwhile. */
        if (a->asg.nnodes > 1 && exit_barrier(a) < 0) {
            a->state = ST_DONE;
            print_summary(a);
            qsort(a->failures, a->nfailures, sizeof(ddprun_failure), cmp_failure);
            a->exit_code = ddprun_failure_exit_status(a->nfailures ? &a->failures[0] : NULL);
            return;
        }
        a->exit_code = 0;
        a->state = ST_DONE;
        return;
    }
    if (!a->stop_for_signal && a->restart_count < a->cfg->max_restarts) {
        print_summary(a);
        say("restarting the job (%d of %d restarts left)",
            a->cfg->max_restarts - a->restart_count - 1, a->cfg->max_restarts);
        a->restart_count++;
        a->round++;
        free(a->failures);
        a->failures = NULL;
        a->nfailures = 0;
        a->state = ST_RUNNING;
        /* From a fresh loop iteration: we may be inside a close callback of this round. */
        uv_timer_start(&a->restart_timer, restart_cb, 0, 0);
        return;
    }
    a->state = ST_DONE;
    print_summary(a);
    if (a->stop_for_signal)
        a->exit_code = 128 + a->signal_seen;
    else if (a->nfailures) {
        /* The root cause decides the exit code: the worker's code, or 128 + its signal. */
        qsort(a->failures, a->nfailures, sizeof(ddprun_failure), cmp_failure);
        a->exit_code = ddprun_failure_exit_status(&a->failures[0]);
    } else if (a->exit_code == 0) {
        a->exit_code = 1;
    }
}

static void drain_timer_cb(uv_timer_t *t)
{
    agent *a = t->data;
    for (int i = 0; i < a->nworkers; i++) {
        stream_close(&a->workers[i].out);
        stream_close(&a->workers[i].err);
    }
}

/*
 * A round is over once every worker has exited and its output has been relayed. Pipes that
 * outlive the workers (held by a grandchild in another session) are closed after a second.
 */
static void maybe_round_over(agent *a)
{
    if (a->round_done || a->nrunning > 0 || a->nprocs > 0)
        return;
    if (a->nstreams > 0) {
        if (!uv_is_active((uv_handle_t *)&a->drain_timer))
            uv_timer_start(&a->drain_timer, drain_timer_cb, 1000, 0);
        return;
    }
    uv_timer_stop(&a->drain_timer);
    a->round_done = true;
    round_over(a);
}

static void proc_closed(uv_handle_t *h)
{
    worker *w = h->data;
    w->a->nprocs--;
    maybe_round_over(w->a);
}

static void on_worker_exit(uv_process_t *p, int64_t status, int term_signal)
{
    worker *w = p->data;
    agent *a = w->a;
    w->running = false;
    a->nrunning--;
    uv_close((uv_handle_t *)p, proc_closed);

    /* A worker we did not stop that exits non-zero or by a signal fails the job. */
    if ((status != 0 || term_signal != 0) && a->state == ST_RUNNING) {
        char message[512];
        read_error_file(w->error_file, message, sizeof(message));
        ddprun_failure f;
        ddprun_failure_init(&f, a->hostname, w->rank, w->local_rank,
                            term_signal ? -term_signal : (int)status, w->pid, message);
        add_failure(a, &f);
        publish_failure(a, &f);
        stop_workers(a);
    }
    /* Leftovers in its process group (a grandchild that stayed behind) go with it. */
    kill(-w->pid, SIGKILL);
    maybe_round_over(a);
}

/* The monitor saw a failure published by another node (or the store went away). */
static void remote_cb(uv_async_t *h)
{
    agent *a = h->data;
    char msg[1024];
    pthread_mutex_lock(&a->mu);
    snprintf(msg, sizeof(msg), "%s", a->remote_failure);
    int round = a->remote_round;
    a->remote_failure[0] = '\0';
    pthread_mutex_unlock(&a->mu);
    /* A report about a round we already left (the monitor runs behind the loop) is stale. */
    if (!msg[0] || a->state != ST_RUNNING || round != a->round)
        return;
    if (!strcmp(msg, MEMBERSHIP_CHANGE)) {
        say("%s: re-rendezvous to admit them", msg);
        a->membership_change = true;
        stop_workers(a);
        maybe_round_over(a);
        return;
    }
    ddprun_failure f;
    if (ddprun_failure_from_json(msg, &f) == 0) {
        add_failure(a, &f);
        say("rank %d on %s failed: stopping the local workers", f.rank, f.node);
    } else {
        say("%s: stopping the local workers", msg);
        /* Not a record (a node stopped beating, the store is gone): one without a worker. */
        ddprun_failure g;
        ddprun_failure_init(&g, "?", -1, -1, 1, 0, msg);
        add_failure(a, &g);
    }
    stop_workers(a);
    maybe_round_over(a);
}

/* ---------------------------------------------------------------------------------------- */
/* Monitor thread                                                                           */
/* ---------------------------------------------------------------------------------------- */

/*
 * Blocks on the store for the current round's failure key and watches the other nodes'
 * heartbeats; either wakes the loop. It uses a connection of its own, and waits in short
 * slices so that it notices a new round or the end of the job.
 */
static void *monitor_main(void *arg)
{
    agent *a = arg;
    rdzv_client_options co;
    rdzv_client_options_init(&co);
    co.connect_timeout_ms = 10000;
    co.timeout_ms = 5000;
    rdzv_client *c = NULL;
    if (rdzv_client_connect(a->store_host, a->store_port, &co, &c) < 0)
        return NULL;
    ddprun_hb_state hb = {0};
    int hb_round = -1;
    bool dynamic = a->cfg->rdzv_backend == DDPRUN_BACKEND_C10D;
    bool reported = false;
    for (;;) {
        pthread_mutex_lock(&a->mu);
        int round = a->monitor_round;
        int nnodes = a->asg.nnodes, me = a->asg.node_rank;
        pthread_mutex_unlock(&a->mu);
        if (round < 0)
            break;
        if (round != hb_round) {
            if (hb_round >= 0)
                ddprun_hb_free(&hb);
            if (ddprun_hb_init(&hb, a->prefix, round, nnodes, DEAD_AFTER_S) < 0)
                break;
            hb_round = round;
            reported = false;
        }
        char report[1024] = "";
        char *json = NULL;
        int rc = ddprun_rdzv_wait_failure(c, a->prefix, round, HEARTBEAT_MS, &json);
        if (rc == 0) {
            snprintf(report, sizeof(report), "%s", json);
            rdzv_free(json);
        } else if (rc != -ETIMEDOUT) {
            snprintf(report, sizeof(report), "lost the rendezvous store at %s:%d (%s)",
                     a->store_host, a->store_port, rdzv_strerror(rc));
        } else {
            ddprun_heartbeat(c, a->prefix, round, me);
            int dead[16];
            int nd = ddprun_dead_nodes(c, &hb, dead, 16);
            int64_t waiting = 0;
            if (nd > 0)
                snprintf(report, sizeof(report), "node %d stopped sending heartbeats", dead[0]);
            else if (dynamic && ddprun_rdzv_num_waiting(c, a->prefix, round, &waiting) == 0 &&
                     waiting > 0)
                snprintf(report, sizeof(report), "%s", MEMBERSHIP_CHANGE);
        }
        if (report[0] && !reported) {
            reported = true;
            pthread_mutex_lock(&a->mu);
            snprintf(a->remote_failure, sizeof(a->remote_failure), "%s", report);
            a->remote_round = round;
            pthread_mutex_unlock(&a->mu);
            uv_async_send(&a->remote);
        }
        if (report[0] && rc != 0 && rc != -ETIMEDOUT) {
            /* The store is gone: nothing more to watch this round. */
            pthread_mutex_lock(&a->mu);
            while (a->monitor_round == round)
                pthread_cond_wait(&a->cv, &a->mu);
            pthread_mutex_unlock(&a->mu);
        } else if (reported) {
            pthread_mutex_lock(&a->mu);
            while (a->monitor_round == round)
                pthread_cond_wait(&a->cv, &a->mu);
            pthread_mutex_unlock(&a->mu);
        }
    }
    if (hb_round >= 0)
        ddprun_hb_free(&hb);
    rdzv_client_close(c);
    return NULL;
}

static void monitor_set_round(agent *a, int round)
{
    pthread_mutex_lock(&a->mu);
    a->monitor_round = round;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

/* ---------------------------------------------------------------------------------------- */
/* Rendezvous and rounds                                                                    */
/* ---------------------------------------------------------------------------------------- */

static int rendezvous(agent *a)
{
    ddprun_config *cfg = a->cfg;
    char err[512] = "";
    int rc;
    if (cfg->nnodes_max == 1) {
        /* A single-node job: nobody else can join, so there is nothing to agree on. */
        a->asg = (ddprun_assignment){.round = a->round,
                                     .node_rank = 0,
                                     .nnodes = 1,
                                     .rank_offset = 0,
                                     .world_size = cfg->nproc_per_node};
        return 0;
    }
    if (cfg->rdzv_backend == DDPRUN_BACKEND_STATIC) {
        rc =
            ddprun_rdzv_static(a->client, a->prefix, a->round, cfg->nnodes_max, cfg->node_rank,
                               cfg->nproc_per_node, cfg->join_timeout_s, &a->asg, err, sizeof(err));
    } else {
        char node_id[320];
        snprintf(node_id, sizeof(node_id), "%s:%d", a->hostname, (int)getpid());
        /* A round that closed before we joined: wait for the next one, which the running nodes
         * start when they see us waiting. */
        while ((rc = ddprun_rdzv_dynamic(a->client, a->prefix, a->round, cfg->nnodes_min,
                                         cfg->nnodes_max, node_id, cfg->nproc_per_node,
                                         cfg->join_timeout_s, cfg->last_call_timeout_s, &a->asg,
                                         err, sizeof(err))) == -EAGAIN)
            a->round++;
    }
    if (rc < 0)
        say("rendezvous failed: %s%s%s", rdzv_strerror(rc), err[0] ? ": " : "", err);
    return rc;
}

/*
 * Between attempts the workers' keys go (ddprun_rdzv_clear_worker_keys()): the hosting agent
 * clears everything outside ddprun's own keys once every node has met for the new round, and the
 * other nodes wait for that before spawning.
 */
static int clear_worker_keys(agent *a)
{
    int rc = ddprun_rdzv_clear_worker_keys(a->store, a->client, a->prefix, a->round, a->asg.nnodes,
                                           a->cfg->join_timeout_s);
    if (rc < 0)
        say("%s the store for round %d: %s", a->store ? "clearing" : "waiting for the clearing of",
            a->round, rdzv_strerror(rc));
    return rc;
}

static int run_round(agent *a)
{
    ddprun_config *cfg = a->cfg;
    if (rendezvous(a) < 0 || (a->round > 0 && clear_worker_keys(a) < 0)) {
        a->exit_code = 1;
        return -1;
    }
    /* Watch the other nodes, and for an elastic job that could still grow, late joiners. */
    bool watch = a->asg.nnodes > 1 ||
                 (cfg->rdzv_backend == DDPRUN_BACKEND_C10D && a->asg.nnodes < cfg->nnodes_max);
    if (watch || a->monitor_started)
        monitor_set_round(a, a->round);
    if (watch && !a->monitor_started) {
        if (pthread_create(&a->monitor, NULL, monitor_main, a) == 0)
            a->monitor_started = true;
    }
    a->nworkers = cfg->nproc_per_node;
    free(a->workers);
    a->workers = xcalloc((size_t)a->nworkers, sizeof(worker));
    a->nrunning = 0;
    a->nstreams = 0;
    a->nprocs = 0;
    a->round_done = false;
    a->state = ST_RUNNING;
    for (int i = 0; i < a->nworkers; i++) {
        worker *w = &a->workers[i];
        w->a = a;
        w->local_rank = i;
        w->rank = a->asg.rank_offset + i;
        if (spawn_worker(a, w) < 0) {
            ddprun_failure f;
            ddprun_failure_init(&f, a->hostname, w->rank, i, 127, 0, "could not start the worker");
            add_failure(a, &f);
            publish_failure(a, &f);
            stop_workers(a);
            break;
        }
    }
    maybe_round_over(a);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Signals                                                                                  */
/* ---------------------------------------------------------------------------------------- */

static void on_signal(uv_signal_t *h, int sig)
{
    agent *a = h->data;
    if (sig == SIGUSR1 || sig == SIGUSR2) {
        signal_workers(a, sig);
        return;
    }
    if (sig == SIGINT && ++a->sigint_count >= 2) {
        say("second SIGINT: killing the workers");
        signal_workers(a, SIGKILL);
        return;
    }
    /* Forward to every worker's process group and stop the job without restarting. */
    say("received SIG%s: stopping the workers%s", sigabbrev_np(sig),
        sig == SIGINT ? " (SIGINT again kills them)" : "");
    signal_workers(a, sig);
    if (a->state == ST_RUNNING) {
        a->stop_for_signal = true;
        a->signal_seen = sig;
        a->state = ST_STOPPING;
        if (a->nrunning > 0)
            uv_timer_start(&a->kill_timer, kill_timer_cb,
                           (uint64_t)(a->cfg->shutdown_timeout_s * 1000.0), 0);
        maybe_round_over(a);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Store                                                                                    */
/* ---------------------------------------------------------------------------------------- */

static void store_log(void *arg, int level, const char *msg)
{
    (void)arg;
    if (level <= RDZV_LOG_WARN)
        say("store: %s", msg);
}

/* True if `host` resolves to an address of this machine (one we can bind to). */
static bool is_local_address(const char *host)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res, *r;
    bool local = false;
    if (getaddrinfo(host, NULL, &hints, &res) != 0)
        return false;
    for (r = res; r && !local; r = r->ai_next) {
        int fd = socket(r->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        /* Port 0: only the address matters; binding fails with EADDRNOTAVAIL if not ours. */
        if (r->ai_family == AF_INET)
            ((struct sockaddr_in *)r->ai_addr)->sin_port = 0;
        else if (r->ai_family == AF_INET6)
            ((struct sockaddr_in6 *)r->ai_addr)->sin6_port = 0;
        local = bind(fd, r->ai_addr, r->ai_addrlen) == 0;
        close(fd);
    }
    freeaddrinfo(res);
    return local;
}

/* Node 0 (static) or the rendezvous host (c10d, standalone) serves the store in-process. */
static int setup_store(agent *a)
{
    ddprun_config *cfg = a->cfg;
    bool is_static = cfg->rdzv_backend == DDPRUN_BACKEND_STATIC;
    const char *host = is_static ? cfg->master_addr : cfg->rdzv_host;
    int port = is_static ? cfg->master_port : cfg->rdzv_port;
    bool hosting;

    if (is_static)
        hosting = cfg->node_rank == 0;
    else if (cfg->is_host_given)
        hosting = cfg->is_host;
    else
        hosting = is_local_address(host); /* then try; if the port is taken, be a client */

    bool v6_loopback = !cfg->standalone && !strcmp(host, "::1");
    if (hosting) {
        rdzv_server_options o;
        rdzv_server_options_init(&o);
        /* Bind the wildcard of IPv6 and IPv4 (as PyTorch's store binds every interface; the
         * library falls back to IPv4's on a host without IPv6), except for a loopback
         * endpoint. */
        o.host = cfg->standalone || !strcmp(host, "127.0.0.1") || !strcmp(host, "localhost")
                     ? "127.0.0.1"
                 : v6_loopback ? "::1"
                               : "::";
        o.port = port;
        o.log = store_log;
        /* The connection cap comes from the descriptor limit, less what spawning and watching
         * the workers needs (two output pipes each, four descriptors while spawning, log and
         * error files, the exec shim's pipe), so that a connection flood cannot starve a
         * restart of descriptors. */
        o.max_connections = 0;
        o.fd_reserve = 64 + 8 * (size_t)cfg->nproc_per_node;
        int rc = rdzv_server_start(&o, &a->store);
        if (rc < 0 && (is_static || cfg->is_host_given)) {
            say(strchr(o.host, ':') ? "cannot serve the store on [%s]:%d: %s"
                                    : "cannot serve the store on %s:%d: %s",
                o.host, port, rdzv_strerror(rc));
            return rc;
        }
        if (rc == 0)
            port = rdzv_server_port(a->store);
    }
    snprintf(a->store_host, sizeof(a->store_host), "%s", cfg->standalone ? "127.0.0.1" : host);
    a->store_port = port;

    rdzv_client_options co;
    rdzv_client_options_init(&co);
    co.connect_timeout_ms = (int)(cfg->join_timeout_s * 1000);
    co.timeout_ms = (int)(cfg->timeout_s * 1000);
    const char *connect_host = a->store ? (v6_loopback ? "::1" : "127.0.0.1") : host;
    int rc = rdzv_client_connect(connect_host, port, &co, &a->client);
    if (rc < 0) {
        say(strchr(connect_host, ':') ? "cannot reach the rendezvous store at [%s]:%d: %s (%s)"
                                      : "cannot reach the rendezvous store at %s:%d: %s (%s)",
            connect_host, port, rdzv_strerror(rc), rdzv_client_last_error(NULL));
        return rc;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* main                                                                                     */
/* ---------------------------------------------------------------------------------------- */

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

/* Removes the per-run directory of error files (attempt_N/rank_M/error.json). */
static void cleanup_tmpdir(const char *dir)
{
    if (dir[0])
        nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], SHIM_FLAG))
        return shim_main(argc, argv);

    ddprun_config cfg;
    char err[1024] = "";
    int rc = ddprun_config_parse(argc, argv, &cfg, err, sizeof(err));
    if (rc == 1)
        return 0;
    if (rc < 0) {
        fprintf(stderr, "%s\n", err[0] ? err : PROG ": bad arguments");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);

    agent a = {0};
    a.cfg = &cfg;
    a.loop = uv_default_loop();
    a.monitor_round = -1;
    pthread_mutex_init(&a.mu, NULL);
    pthread_cond_init(&a.cv, NULL);
    gethostname(a.hostname, sizeof(a.hostname) - 1);
    snprintf(a.run_id, sizeof(a.run_id), "%s", cfg.rdzv_id);
    if (ddprun_rdzv_run_prefix(cfg.rdzv_id, a.prefix, sizeof(a.prefix)) < 0) {
        fprintf(stderr, PROG ": --rdzv-id: '%.64s...' is too long for the store's keys\n",
                cfg.rdzv_id);
        return 2;
    }
    snprintf(a.tmpdir, sizeof(a.tmpdir), "%s/ddprun-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(a.tmpdir))
        a.tmpdir[0] = '\0';

    uv_timer_init(a.loop, &a.kill_timer);
    a.kill_timer.data = &a;
    uv_timer_init(a.loop, &a.drain_timer);
    a.drain_timer.data = &a;
    uv_timer_init(a.loop, &a.restart_timer);
    a.restart_timer.data = &a;
    uv_async_init(a.loop, &a.remote, remote_cb);
    a.remote.data = &a;
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
    for (int i = 0; i < 6; i++) {
        uv_signal_init(a.loop, &a.sigs[i]);
        a.sigs[i].data = &a;
        uv_signal_start(&a.sigs[i], on_signal, sigs[i]);
    }

    if (setup_store(&a) < 0 || run_round(&a) < 0) {
        a.exit_code = a.exit_code ? a.exit_code : 1;
        a.state = ST_DONE;
    }
    while (a.state != ST_DONE && uv_run(a.loop, UV_RUN_ONCE))
        ;

    /* The monitor may sit in a store wait for up to HEARTBEAT_MS: tell it to stop but do not
     * wait for it; exit() ends it. Nothing it uses is freed before that. */
    if (a.monitor_started)
        monitor_set_round(&a, -1);
    cleanup_tmpdir(a.tmpdir);
    fflush(NULL);
    _exit(a.exit_code);
}
