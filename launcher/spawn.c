/*
 * Starting a node's workers: the environment torchrun gives each (worker_env()), the PID
 * namespace their guards and they live in where ddprun may create one (job_ns_start()), their
 * output pipes and log files, the guard each is spawned through (spawn_worker()), and this run's
 * directory of worker files (setup_log_dir()).
 *
 * Not done here: the guard and the init themselves (guard.c), relaying the output (relay.c),
 * what happens when a worker exits (ddprun.c's on_worker_exit()).
 */
#include "agent.h"
#include "guard.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

extern char **environ;

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
    env_seti(&e, "LOCAL_RANK", cfg->virtual_local_rank ? 0 : w->local_rank);
    if (cfg->virtual_local_rank) {
        /* torchrun's: the worker sees only its own device, as device 0 (checked by options.c). */
        const char *hip = getenv("HIP_VISIBLE_DEVICES");
        char dev[64];
        if (ddprun_virtual_device(hip && *hip ? hip : getenv("CUDA_VISIBLE_DEVICES"), w->local_rank,
                                  dev, sizeof(dev)) == 0) {
            env_set(&e, "CUDA_VISIBLE_DEVICES", dev);
            if (hip && *hip)
                env_set(&e, "HIP_VISIBLE_DEVICES", dev);
        }
    }
    env_seti(&e, "RANK", w->rank);
    env_seti(&e, "GROUP_RANK", a->asg.node_rank);
    env_seti(&e, "ROLE_RANK", w->rank);
    env_set(&e, "ROLE_NAME", cfg->role);
    env_seti(&e, "LOCAL_WORLD_SIZE", cfg->nproc_per_node);
    env_seti(&e, "WORLD_SIZE", a->asg.world_size);
    env_seti(&e, "GROUP_WORLD_SIZE", a->asg.nnodes);
    env_seti(&e, "ROLE_WORLD_SIZE", a->asg.world_size);
    env_set(&e, "MASTER_ADDR", a->proxy ? "127.0.0.1" : a->store_host);
    env_seti(&e, "MASTER_PORT", a->proxy ? a->proxy_port : a->store_port);
    env_seti(&e, "TORCHELASTIC_RESTART_COUNT", a->restart_count);
    env_seti(&e, "TORCHELASTIC_MAX_RESTARTS", cfg->max_restarts);
    env_set(&e, "TORCHELASTIC_RUN_ID", a->run_id);
    env_set(&e, "TORCHELASTIC_USE_AGENT_STORE", "True");
    if (a->token[0]) /* librendezvous clients (rdzv_env_connect) authenticate with it */
        env_set(&e, RDZV_TOKEN_ENV, a->token);
    env_set(&e, "TORCHELASTIC_ERROR_FILE", w->error_file);
    /* Current torchrun's (torch 2.2 and later). The older name, NCCL_ASYNC_ERROR_HANDLING, is
     * not set: torch 2.2 and later warn that it is deprecated. A caller's own value of either
     * reaches the worker as the rest of the environment does. */
    const char *v = getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING");
    env_set(&e, "TORCH_NCCL_ASYNC_ERROR_HANDLING", v ? v : "1");
    env_set(&e, "TORCHELASTIC_SIGNALS_TO_HANDLE",
            cfg->signals_to_handle ? cfg->signals_to_handle : "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
    if (!getenv("OMP_NUM_THREADS") && cfg->nproc_per_node > 1)
        env_set(&e, "OMP_NUM_THREADS", "1");
    return e;
}

/* ---------------------------------------------------------------------------------------- */
/* Spawning                                                                                 */
/* ---------------------------------------------------------------------------------------- */

/*
 * The path of the ddp-guard program (the guards and the namespace's init): the one beside this
 * executable (the build tree), else the installed one (DDPRUN_GUARD_PATH, in libexecdir).
 */
static void guard_path(char *buf, size_t n)
{
    char self[PATH_MAX];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (sl > 0) {
        self[sl] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) {
            snprintf(buf, n, "%.*s/" GUARD_NAME, (int)(slash - self), self);
            if (access(buf, X_OK) == 0)
                return;
        }
    }
    snprintf(buf, n, "%s", DDPRUN_GUARD_PATH);
}

static void init_exited(agent *a, int st);

/*
 * SIGCHLD: reaps the namespace's init and the guards that exited, each guard reported to
 * on_worker_exit(). ddprun's other children, strays, are maybe_round_over()'s.
 */
static void on_sigchld(uv_signal_t *h, int signum)
{
    (void)signum;
    agent *a = h->data;
    int st;
    if (a->init_pid > 0 && waitpid(a->init_pid, &st, WNOHANG) == a->init_pid)
        init_exited(a, st);
    for (int i = 0; i < a->nworkers; i++) {
        worker *w = &a->workers[i];
        pid_t r;
        if (!w->running)
            continue;
        while ((r = waitpid(w->pid, &st, WNOHANG)) < 0 && errno == EINTR)
            ;
        if (r == w->pid)
            on_worker_exit(w, WIFEXITED(st) ? WEXITSTATUS(st) : 0,
                           WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    }
}

/*
 * Starts ddp-guard (as a guard or as the init, by args[0]) with `args` and ddprun's environment
 * in a session of its own (setsid()), with default signal dispositions and no signal blocked,
 * and descriptors 0 to nio - 1 as `io` says: UV_IGNORE, /dev/null; UV_INHERIT_FD, that
 * descriptor; UV_CREATE_PIPE, one end of a new socket pair whose other end io[k].data.stream (an
 * initialised uv_pipe_t) opens. This is uv_spawn() with posix_spawn() instead of fork(): glibc's
 * clone(CLONE_VM | CLONE_VFORK) copies no page tables, and ddprun resumes as soon as the child
 * has exec'd, where uv_spawn() waited until its forked copy of ddprun had been scheduled, run
 * and exec'd (most of a spawn's time on a busy machine: 0.9 ms a worker with 64 of them). Exits
 * come to on_sigchld(). Returns 0 with *pid set, or a negative errno.
 */
static int spawn_child(agent *a, char **args, uv_stdio_container_t *io, int nio, pid_t *pid)
{
    int rc = 0, tmp[5] = {-1, -1, -1, -1, -1}, pair[5][2];
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    sigset_t all, none;
    assert(nio <= 5);
    if (!a->guard[0])
        guard_path(a->guard, sizeof(a->guard));
    if (!a->sigchld_started) {
        uv_signal_init(a->loop, &a->sigchld);
        a->sigchld.data = a;
        uv_signal_start(&a->sigchld, on_sigchld, SIGCHLD);
        uv_unref((uv_handle_t *)&a->sigchld); /* children keep no loop running */
        a->sigchld_started = true;
    }
    for (int k = 0; k < nio; k++)
        pair[k][0] = pair[k][1] = -1;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&attr);
    sigfillset(&all);
    sigemptyset(&none);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setflags(&attr,
                             POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
    for (int k = 0; k < nio && rc == 0; k++) {
        int fd;
        if (io[k].flags == UV_IGNORE) {
            rc = -posix_spawn_file_actions_addopen(&fa, k, "/dev/null", O_RDWR, 0);
            continue;
        }
        if (io[k].flags & UV_CREATE_PIPE) {
            if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair[k]) != 0) {
                rc = -errno;
                break;
            }
            /* ddprun's end belongs to the stream from here on, which the caller closes. */
            if ((rc = uv_pipe_open((uv_pipe_t *)io[k].data.stream, pair[k][0])) < 0)
                close(pair[k][0]);
            pair[k][0] = -1;
            if (rc < 0)
                break;
            fd = pair[k][1];
        } else {
            fd = io[k].data.fd;
        }
        /* dup2() in the child, in order: a source that is a lower slot's target would be gone
         * by then, and one already in its slot must lose close-on-exec; a copy above the
         * slots serves both. */
        if (fd == k && !(fcntl(fd, F_GETFD) & FD_CLOEXEC))
            continue;
        if (fd < nio && (tmp[k] = fd = fcntl(fd, F_DUPFD_CLOEXEC, nio)) < 0)
            rc = -errno;
        else
            rc = -posix_spawn_file_actions_adddup2(&fa, fd, k);
    }
    if (rc == 0)
        rc = -posix_spawn(pid, a->guard, &fa, &attr, args, environ);
    for (int k = 0; k < nio; k++) {
        if (tmp[k] >= 0)
            close(tmp[k]);
        if (pair[k][1] >= 0)
            close(pair[k][1]); /* the guard's end */
    }
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&fa);
    return rc;
}

/* Leaves the workers' PID namespace: guards start in ddprun's own again, until job_ns_start(). */
static void job_ns_end(agent *a)
{
    if (a->mntns_fd >= 0)
        close(a->mntns_fd);
    if (a->init_alive_fd >= 0)
        close(a->init_alive_fd);
    if (a->init_ready_fd >= 0)
        close(a->init_ready_fd);
    a->mntns_fd = a->init_alive_fd = a->init_ready_fd = -1;
    a->init_pid = 0;
    if (setns(a->own_pidns_fd, CLONE_NEWPID) != 0)
        a->ns_unavailable = true; /* cannot happen: it was ours, and we may unshare */
}

/*
 * The init of the workers' PID namespace exited with wait status `st`: if it was not ddprun's
 * doing, every guard and worker in the namespace has been killed with it. The next round starts
 * a new namespace.
 */
static void init_exited(agent *a, int st)
{
    char how[48];
    describe_exit(WIFSIGNALED(st) ? -WTERMSIG(st) : WEXITSTATUS(st), how, sizeof(how));
    say("the workers' PID namespace ended with its init (pid %d, " INIT_NAME "): %s; the next "
        "workers start in a new one",
        (int)a->init_pid, how);
    job_ns_end(a);
}

/*
 * The namespace's set-up failed with errno value `err`: its init, if any, is killed and reaped,
 * ddprun goes back to its own namespace, and the guards contain the workers from now on.
 * Returns -err.
 */
static int job_ns_fail(agent *a, int err)
{
    pid_t init = a->init_pid;
    a->init_pid = 0; /* not init_exited()'s to report */
    if (init > 0) {
        kill(init, SIGKILL);
        while (waitpid(init, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    job_ns_end(a);
    a->ns_unavailable = true;
    /* Unlike a refused unshare() (an unprivileged user, as documented), this is unexpected. */
    say("cannot set up the workers' PID namespace: %s; they start in ddprun's own (see PROCESS "
        "CONTAINMENT in ddprun(1))",
        strerror(err));
    return -err;
}

/*
 * Starts the guards and workers ddprun spawns from now on in a new PID namespace, whose init
 * (init_main(), PID 1 there) dies with ddprun: then the kernel kills every process in it,
 * however ddprun and the guards died, together or one by one. The namespace has mounts of its
 * own, which the guards join (fd 4) before they start their workers: /proc and /dev/shm are the
 * job's. Needs CAP_SYS_ADMIN (unshare(CLONE_NEWPID), mounting /proc); on the agent's loop
 * thread, whose pid_ns_for_children it sets.
 *
 * The init makes the mounts while ddprun prepares the first worker: job_ns_ready() waits for
 * them, before the first guard starts.
 *
 * Returns 0, with a->init_pid set, or a negative errno (-EPERM: not permitted, -EINVAL: no PID
 * namespaces in this kernel, or why the init could not start, which it says), with the guards
 * left to start in ddprun's own namespace.
 */
int job_ns_start(agent *a)
{
    int alive[2] = {-1, -1}, ready[2] = {-1, -1}, err = 0;
    if (a->own_pidns_fd < 0 &&
        (a->own_pidns_fd = open("/proc/self/ns/pid", O_RDONLY | O_CLOEXEC)) < 0)
        return -errno;
    /* Only where ddprun can come back to its own namespace, should the new one fail or end
     * (setns() needs CAP_SYS_ADMIN in the user namespace owning ddprun's: not so for root in a
     * user namespace of its own, where unshare() still works): else forks fail from then on. */
    if (setns(a->own_pidns_fd, CLONE_NEWPID) != 0 || unshare(CLONE_NEWPID) != 0)
        return -errno;
    if (pipe2(alive, O_CLOEXEC) != 0 || pipe2(ready, O_CLOEXEC) != 0) {
        err = errno;
    } else {
        char *args[] = {INIT_NAME, NULL};
        uv_stdio_container_t io[5] = {{.flags = UV_IGNORE},
                                      {.flags = UV_IGNORE},
                                      {.flags = UV_IGNORE},
                                      {.flags = UV_INHERIT_FD, .data.fd = alive[0]},
                                      {.flags = UV_INHERIT_FD, .data.fd = ready[1]}};
        err = -spawn_child(a, args, io, 5, &a->init_pid);
    }
    /* The init has its own copies; ddprun keeps alive[1] for as long as the init shall live. */
    if (alive[0] >= 0)
        close(alive[0]);
    if (ready[1] >= 0)
        close(ready[1]);
    a->init_alive_fd = alive[1];
    a->init_ready_fd = ready[0];
    return err ? job_ns_fail(a, err) : 0;
}

/*
 * Waits until the init of job_ns_start() has made the namespace's mounts, and opens them for the
 * guards (a->mntns_fd). Returns 0, or a negative errno after job_ns_fail().
 */
static int job_ns_ready(agent *a)
{
    int err = EPIPE;
    ssize_t k;
    while ((k = read(a->init_ready_fd, &err, sizeof(err))) < 0 && errno == EINTR)
        ;
    if (k != (ssize_t)sizeof(err))
        err = EPIPE; /* the init died before it could say */
    close(a->init_ready_fd);
    a->init_ready_fd = -1;
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/ns/mnt", (int)a->init_pid);
    if (err == 0 && (a->mntns_fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        err = errno;
    return err ? job_ns_fail(a, err) : 0;
}

/* Builds the command: python3 -u script, python3 -u -m module, or the program itself (options.c
 * chose which). */
static char **worker_argv(agent *a, int *argc_out)
{
    ddprun_config *cfg = a->cfg;
    const char *py = getenv("PYTHON_EXEC") ? getenv("PYTHON_EXEC") : "python3"; /* as torchrun */
    size_t n = (size_t)cfg->argc;
    char **v = xcalloc(n + 8, sizeof(char *));
    int k = 0;
    if (cfg->python) {
        v[k++] = (char *)py;
        v[k++] = "-u";
        if (cfg->module && !cfg->run_path) /* --run-path takes precedence, as in torchrun */
            v[k++] = "-m";
        v[k++] = cfg->argv[0];
    } else {
        v[k++] = cfg->program;
    }
    for (int i = 1; i < cfg->argc; i++)
        v[k++] = cfg->argv[i];
    v[k] = NULL;
    *argc_out = k;
    return v;
}

static int mkdirs(const char *path)
{
    /* Usually only the last component is missing (a worker's directory in the attempt's). */
    if (mkdir(path, 0755) == 0 || errno == EEXIST)
        return 0;
    if (errno != ENOENT)
        return -errno;
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

/*
 * Opens a pseudo-terminal for stream `s`: returns its master, and sets s->slave (both
 * close-on-exec, neither anyone's controlling terminal: O_NOCTTY), with output processing off
 * (a worker's "\n" stays "\n") and the size of ddprun's terminal; or returns -errno.
 */
static int open_pty(stream *s)
{
    int m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC), sl = -1;
    if (m < 0)
        return -errno;
#ifdef TIOCGPTPEER
    if (unlockpt(m) == 0) /* the slave without a path to look up (Linux 4.13) */
        sl = ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
#endif
    if (sl < 0) {
        char name[64];
        if (unlockpt(m) != 0 || ptsname_r(m, name, sizeof(name)) != 0 ||
            (sl = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC)) < 0) {
            int rc = -errno;
            close(m);
            return rc;
        }
    }
    struct termios t;
    if (tcgetattr(sl, &t) == 0) {
        t.c_oflag &= ~(tcflag_t)OPOST;
        tcsetattr(sl, TCSANOW, &t);
    }
    stream_set_winsize(s, m);
    s->slave = sl;
    return m;
}

/*
 * Sets up stream `which` of worker w: a pipe to the agent when there is anything to do with its
 * bytes (a prefix, a log file, a console to keep from the worker), else the console itself. A
 * pseudo-terminal instead of the pipe with --tty on, and with --tty auto when the stream reaches
 * ddprun's own and that is a terminal (the worker's then is one too, as under torchrun; a stream
 * that goes to its log file alone is a file's pipe, as it is under torchrun).
 * `dir` is the worker's directory for log files. Returns 0, or -errno after saying why when the
 * log file or the pseudo-terminal cannot be opened.
 */
static int setup_stream(agent *a, worker *w, stream *s, int which, const char *dir,
                        uv_stdio_container_t *io)
{
    ddprun_config *cfg = a->cfg;
    int lr = w->local_rank;
    bool redirect = (cfg->redirects[lr] & which) != 0, tee = (cfg->tee[lr] & which) != 0;
    s->w = w;
    s->which = which;
    s->file = -1;
    s->console = !redirect && (!cfg->local_ranks_filter_set || cfg->show_rank[lr]);
    s->col0 = true;
    s->after_cr = false;
    s->pty = false;
    s->master = s->slave = -1;
    s->cur_cr = s->fl_cr = false;
    s->fl_esc = 0;
    if (redirect || tee) {
        /* setup_log_dir() made a directory for them, or ddprun did not start. */
        char path[PATH_MAX];
        snprintf(path, sizeof(path), "%s/%s", dir,
                 which == DDPRUN_STD_OUT ? "stdout.log" : "stderr.log");
        s->file = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (s->file < 0) {
            int rc = -errno;
            say("cannot open %s: %s", path, strerror(-rc));
            return rc;
        }
    }
    /* A console whose file description we made non-blocking is never handed to a worker. */
    bool need_pipe = s->file >= 0 || (s->console && (cfg->prefix_output)) || !s->console ||
                     ddprun_console_shared(a->con[which == DDPRUN_STD_OUT ? 1 : 2]);
    int fd = which == DDPRUN_STD_OUT ? STDOUT_FILENO : STDERR_FILENO;
    bool pty =
        cfg->tty == DDPRUN_TTY_ON || (cfg->tty == DDPRUN_TTY_AUTO && s->console && isatty(fd));
    if (!need_pipe && (!pty || isatty(fd))) {
        /* Nothing to add: the worker writes straight to our terminal, with no relay at all. */
        io->flags = UV_INHERIT_FD;
        io->data.fd = fd;
        return 0;
    }
    int master = pty ? open_pty(s) : -1;
    if (master < 0 && pty) {
        say("cannot open a pseudo-terminal for local rank %d's %s (--tty): %s", lr,
            which == DDPRUN_STD_OUT ? "stdout" : "stderr", strerror(-master));
        if (s->file >= 0)
            close(s->file);
        s->file = -1;
        return master;
    }
    if (pty) {
        /* uv_poll_init() takes any descriptor epoll watches (a terminal); it fails only for a
         * bad one. relay.c reads it (pty_readable()). */
        int rc = uv_poll_init(a->loop, &s->poll, master);
        assert(rc == 0);
        (void)rc;
        s->poll.data = s;
        s->master = master;
        s->pty = true;
        io->flags = UV_INHERIT_FD;
        io->data.fd = s->slave;
    } else {
        uv_pipe_init(a->loop, &s->pipe, 0);
        s->pipe.data = s;
    }
    uv_timer_init(a->loop, &s->partial_timer);
    s->partial_timer.data = s;
    s->open = true;
    a->nstreams++;
    if (!pty) {
        io->flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
        io->data.stream = (uv_stream_t *)&s->pipe;
    }
    return 0;
}

/* The guard has the slaves of the worker's pseudo-terminals now (or will never have them). */
static void close_slaves(worker *w)
{
    stream *ss[2] = {&w->out, &w->err};
    for (int k = 0; k < 2; k++) {
        if (ss[k]->slave >= 0)
            close(ss[k]->slave);
        ss[k]->slave = -1;
    }
}

int spawn_worker(agent *a, worker *w)
{
    /* torchrun's layout (setup_log_dir()): <run dir>/attempt_<k>/<local rank>/error.json, next
     * to the log files. */
    char dir[PATH_MAX];
    w->error_file[0] = '\0';
    if (a->logdir[0]) {
        int rc = snprintf(dir, sizeof(dir), "%s/attempt_%d/%d", a->logdir, a->restart_count,
                          w->local_rank) >= (int)sizeof(dir)
                     ? -ENAMETOOLONG
                     : mkdirs(dir);
        if (rc < 0 && a->keep_logs) {
            say("cannot create %s/attempt_%d/%d: %s", a->logdir, a->restart_count, w->local_rank,
                strerror(-rc));
            return rc;
        }
        if (rc == 0 && snprintf(w->error_file, sizeof(w->error_file), "%s/error.json", dir) <
                           (int)sizeof(w->error_file))
            unlink(w->error_file);
        else
            w->error_file[0] = '\0'; /* no error file: the summary goes without its message */
    }
    line_prefix(a, w, w->prefix, sizeof(w->prefix));
    w->out.slave = w->err.slave = -1;

    int argc;
    char **cmd = worker_argv(a, &argc);
    char parent[32]; /* written once the namespace is known (job_ns_ready()) */
    char **args = xcalloc((size_t)argc + 3, sizeof(char *));
    args[0] = GUARD_NAME;
    args[1] = parent;
    for (int i = 0; i < argc; i++)
        args[2 + i] = cmd[i];

    /* The worker's environment goes to the guard through a memfd (its fd 3): the guard itself
     * runs with ddprun's, which is what the worker finds as its parent's. */
    envb env = worker_env(a, w);
    w->worker_pid = 0;
    w->envfd = memfd_create("ddprun-worker-env", MFD_CLOEXEC);
    if (w->envfd < 0) {
        int rc = -errno;
        say("cannot start local rank %d: %s", w->local_rank, strerror(-rc));
        env_free(&env);
        free(args);
        free(cmd);
        return rc;
    }
    size_t envlen = 0;
    for (size_t i = 0; i < env.n; i++)
        envlen += strlen(env.v[i]) + 1;
    char *block = malloc(envlen ? envlen : 1), *end = block;
    if (!block)
        die_oom();
    for (size_t i = 0; i < env.n; i++)
        end = stpcpy(end, env.v[i]) + 1;
    /* A memfd takes it whole, up to RLIMIT_FSIZE: a cut environment must not go unnoticed. */
    int rc = write_all(w->envfd, block, envlen, NULL);
    free(block);
    if (rc < 0)
        say("cannot start local rank %d: writing its environment: %s", w->local_rank,
            strerror(-rc));
    uv_stdio_container_t io[5];
    io[0].flags = UV_INHERIT_FD;
    io[0].data.fd = STDIN_FILENO;
    io[3].flags = UV_INHERIT_FD;
    io[3].data.fd = w->envfd;
    if (rc == 0)
        rc = setup_stream(a, w, &w->out, DDPRUN_STD_OUT, dir, &io[1]);
    if (rc == 0)
        rc = setup_stream(a, w, &w->err, DDPRUN_STD_ERR, dir, &io[2]);
    if (rc < 0) {
        close(w->envfd);
        w->envfd = -1;
        close_slaves(w);
        stream_close(&w->out);
        stream_close(&w->err);
        env_free(&env);
        free(args);
        free(cmd);
        return rc;
    }

    /* The init has had the time this took to make the namespace's mounts. */
    if (a->init_ready_fd >= 0)
        job_ns_ready(a);
    snprintf(parent, sizeof(parent), "%d", a->init_pid ? 0 : (int)getpid());
    io[4].flags = UV_INHERIT_FD;
    io[4].data.fd = a->mntns_fd;
    pid_t pid = 0;
    rc = spawn_child(a, args, io, a->init_pid ? 5 : 4, &pid);
    close_slaves(w);
    env_free(&env);
    free(args);
    free(cmd);
    if (rc < 0) {
        say("cannot start local rank %d: %s", w->local_rank, strerror(-rc));
        close(w->envfd);
        w->envfd = -1;
        stream_close(&w->out);
        stream_close(&w->err);
        return rc;
    }
    w->pid = pid;
    w->last_output_ms = uv_now(a->loop);
    w->stopped_since_ms = 0;
    w->running = true;
    a->nrunning++;
    if (w->out.open)
        stream_start(&w->out);
    if (w->err.open)
        stream_start(&w->err);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Log directory                                                                            */
/* ---------------------------------------------------------------------------------------- */

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

/* Removes a temporary directory that held only error files. */
void cleanup_tmpdir(const char *dir)
{
    if (dir[0])
        nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

/*
 * Makes this run's directory for the workers' files, as torchrun lays them out:
 * <base>/<run id>_XXXXXX/attempt_<restart count>/<local rank>/{stdout.log,stderr.log,error.json}.
 * The run directory is new (mkdtemp), so a run never writes into an earlier run's. The base is
 * --log-dir, created if missing; without it, when --redirects or --tee asked for log files, a
 * new temporary directory $TMPDIR/ddprun_XXXXXX, which is kept (torchrun keeps its
 * torchelastic_XXXXXX too). With neither, the run directory $TMPDIR/ddprun_<run id>_XXXXXX holds
 * only the error files, and is removed at exit. Says where the logs go.
 * Returns 0, or -1 after saying why (naming the flag) when the log files asked for cannot have
 * a directory; a missing directory for error files alone is only a warning.
 */
int setup_log_dir(agent *a)
{
    const ddprun_config *cfg = a->cfg;
    const char *flag = cfg->log_dir ? "--log-dir" : "--redirects/--tee without --log-dir";
    const char *prefix = ""; /* of the run directory's name, before the run id */
    char base[PATH_MAX];
    for (int i = 0; i < cfg->nproc_per_node && i < DDPRUN_MAX_LOCAL; i++)
        a->keep_logs |= (cfg->redirects[i] | cfg->tee[i]) != 0;
    a->keep_logs |= cfg->log_dir != NULL;
    if (cfg->log_dir) {
        int rc = snprintf(base, sizeof(base), "%s", cfg->log_dir) >= (int)sizeof(base)
                     ? -ENAMETOOLONG
                     : mkdirs(base);
        if (rc < 0) {
            say("%s: cannot create '%s': %s", flag, cfg->log_dir, strerror(-rc));
            return -1;
        }
    } else if (!a->keep_logs) {
        /* Error files alone: the run's directory is the temporary one, one level fewer to make
         * and remove (on a busy ext4, each costs a fraction of a millisecond). */
        const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(base, sizeof(base), "%s", tmp);
        prefix = "ddprun_";
    } else {
        const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        int e = 0;
        if (snprintf(base, sizeof(base), "%s/ddprun_XXXXXX", tmp) >= (int)sizeof(base))
            e = ENAMETOOLONG;
        else if (!mkdtemp(base))
            e = errno;
        if (e) {
            say("%s: cannot create a temporary directory in '%s': %s", flag, tmp, strerror(e));
            return -1;
        }
    }
    /* The run id names the directory; a '/' in it would name another one. */
    char id[sizeof(a->run_id)];
    snprintf(id, sizeof(id), "%s", a->run_id);
    for (char *p = id; *p; p++)
        if (*p == '/')
            *p = '_';
    int e = 0;
    if (snprintf(a->logdir, sizeof(a->logdir), "%s/%s%s_XXXXXX", base, prefix, id) >=
        (int)sizeof(a->logdir))
        e = ENAMETOOLONG;
    else if (!mkdtemp(a->logdir))
        e = errno;
    if (e) {
        a->logdir[0] = '\0';
        if (a->keep_logs) {
            say("%s: cannot create a directory in '%s': %s", flag, base, strerror(e));
            return -1;
        }
        say("warning: cannot create a temporary directory in '%s' (%s): the workers get no "
            "TORCHELASTIC_ERROR_FILE",
            base, strerror(e));
        return 0;
    }
    if (a->keep_logs)
        say("worker logs and error files: %s", a->logdir);
    else
        snprintf(a->tmpbase, sizeof(a->tmpbase), "%s", a->logdir);
    return 0;
}
