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

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
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

/* Leaves the workers' PID namespace: guards start in ddprun's own again, until job_ns_start(). */
static void job_ns_end(agent *a)
{
    if (a->mntns_fd >= 0)
        close(a->mntns_fd);
    if (a->init_alive_fd >= 0)
        close(a->init_alive_fd);
    a->mntns_fd = a->init_alive_fd = -1;
    a->init_proc = NULL;
    if (setns(a->own_pidns_fd, CLONE_NEWPID) != 0)
        a->ns_unavailable = true; /* cannot happen: it was ours, and we may unshare */
}

static void init_closed(uv_handle_t *h)
{
    free(h);
}

/*
 * The init of the workers' PID namespace exited: if it was not ddprun's doing, every guard and
 * worker in the namespace has been killed with it. The next round starts a new namespace.
 */
static void init_exited(uv_process_t *p, int64_t status, int term_signal)
{
    agent *a = p->data;
    if (p == a->init_proc) {
        char how[48];
        describe_exit(term_signal ? -term_signal : (int)status, how, sizeof(how));
        say("the workers' PID namespace ended with its init (pid %d, " INIT_NAME "): %s; the next "
            "workers start in a new one",
            p->pid, how);
        job_ns_end(a);
    }
    uv_close((uv_handle_t *)p, init_closed);
}

/*
 * Starts the guards and workers ddprun spawns from now on in a new PID namespace, whose init
 * (init_main(), PID 1 there) dies with ddprun: then the kernel kills every process in it,
 * however ddprun and the guards died, together or one by one. The namespace has mounts of its
 * own, which the guards join (fd 4) before they start their workers: /proc and /dev/shm are the
 * job's. Needs CAP_SYS_ADMIN (unshare(CLONE_NEWPID), mounting /proc); on the agent's loop
 * thread, whose pid_ns_for_children it sets.
 *
 * Returns 0, with a->init_proc set, or a negative errno (-EPERM: not permitted, -EINVAL: no PID
 * namespaces in this kernel, or what the init's setup failed with, which it says), with the
 * guards left to start in ddprun's own namespace.
 */
int job_ns_start(agent *a)
{
    int alive[2] = {-1, -1}, ready[2] = {-1, -1}, err = EPIPE;
    uv_process_t *p = NULL;
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
        goto out;
    }
    char guard[PATH_MAX];
    guard_path(guard, sizeof(guard));
    char *args[] = {INIT_NAME, NULL};
    uv_stdio_container_t io[5] = {{.flags = UV_IGNORE},
                                  {.flags = UV_IGNORE},
                                  {.flags = UV_IGNORE},
                                  {.flags = UV_INHERIT_FD, .data.fd = alive[0]},
                                  {.flags = UV_INHERIT_FD, .data.fd = ready[1]}};
    uv_process_options_t o = {.file = guard,
                              .args = args,
                              .exit_cb = init_exited,
                              .flags = UV_PROCESS_DETACHED,
                              .stdio_count = 5,
                              .stdio = io};
    p = xcalloc(1, sizeof(*p));
    p->data = a;
    int rc = uv_spawn(a->loop, p, &o);
    if (rc < 0) {
        uv_close((uv_handle_t *)p, init_closed); /* uv_spawn() initialised it all the same */
        p = NULL;
        err = -rc;
        goto out;
    }
    uv_unref((uv_handle_t *)p); /* it lasts as long as ddprun: no reason to run the loop */
    close(ready[1]);
    ready[1] = -1;
    ssize_t k;
    while ((k = read(ready[0], &err, sizeof(err))) < 0 && errno == EINTR)
        ;
    if (k != (ssize_t)sizeof(err))
        err = EPIPE; /* the init died before it could say */
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/ns/mnt", p->pid);
    if (err == 0 && (a->mntns_fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        err = errno;
out:
    /* The init has its own copies; ddprun keeps alive[1] for as long as the init shall live. */
    if (alive[0] >= 0)
        close(alive[0]);
    if (ready[0] >= 0)
        close(ready[0]);
    if (ready[1] >= 0)
        close(ready[1]);
    if (err == 0) {
        a->init_alive_fd = alive[1];
        a->init_proc = p;
        return 0;
    }
    if (alive[1] >= 0)
        close(alive[1]); /* the init, if any, exits; init_exited() closes its handle */
    if (p)
        kill(p->pid, SIGKILL);
    if (a->mntns_fd >= 0)
        close(a->mntns_fd);
    a->mntns_fd = -1;
    setns(a->own_pidns_fd, CLONE_NEWPID);
    /* Unlike a refused unshare() (an unprivileged user, as documented), this is unexpected. */
    say("cannot set up the workers' PID namespace: %s; they start in ddprun's own (see PROCESS "
        "CONTAINMENT in ddprun(1))",
        strerror(err));
    return -err;
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
        if (cfg->module)
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
 * Sets up stream `which` of worker w: a pipe to the agent when there is anything to do with its
 * bytes (a prefix, a log file, a console to keep from the worker), else the console itself.
 * `dir` is the worker's directory for log files. Returns 0, or -errno after saying why when the
 * log file cannot be opened.
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
    if (!need_pipe) {
        /* Nothing to add: the worker writes straight to our terminal, with no relay at all. */
        io->flags = UV_INHERIT_FD;
        io->data.fd = which == DDPRUN_STD_OUT ? STDOUT_FILENO : STDERR_FILENO;
        return 0;
    }
    uv_pipe_init(a->loop, &s->pipe, 0);
    s->pipe.data = s;
    uv_timer_init(a->loop, &s->partial_timer);
    s->partial_timer.data = s;
    s->open = true;
    a->nstreams++;
    io->flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    io->data.stream = (uv_stream_t *)&s->pipe;
    return 0;
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

    int argc;
    char **cmd = worker_argv(a, &argc);
    char parent[32];
    snprintf(parent, sizeof(parent), "%d", a->init_proc ? 0 : (int)getpid());
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
    io[4].flags = UV_INHERIT_FD;
    io[4].data.fd = a->mntns_fd;
    if (rc == 0)
        rc = setup_stream(a, w, &w->out, DDPRUN_STD_OUT, dir, &io[1]);
    if (rc == 0)
        rc = setup_stream(a, w, &w->err, DDPRUN_STD_ERR, dir, &io[2]);
    if (rc < 0) {
        close(w->envfd);
        w->envfd = -1;
        stream_close(&w->out);
        stream_close(&w->err);
        env_free(&env);
        free(args);
        free(cmd);
        return rc;
    }

    char guard[PATH_MAX];
    guard_path(guard, sizeof(guard));
    uv_process_options_t o = {0};
    o.file = guard;
    o.args = args;
    o.env = NULL; /* ddprun's own */
    o.exit_cb = on_worker_exit;
    o.flags = UV_PROCESS_DETACHED; /* setsid(): its own session and process group */
    o.stdio_count = a->init_proc ? 5 : 4;
    o.stdio = io;
    w->proc.data = w;
    rc = uv_spawn(a->loop, &w->proc, &o);
    env_free(&env);
    free(args);
    free(cmd);
    if (rc < 0) {
        say("cannot start local rank %d: %s", w->local_rank, uv_strerror(rc));
        close(w->envfd);
        w->envfd = -1;
        stream_close(&w->out);
        stream_close(&w->err);
        return rc;
    }
    a->nprocs++;
    w->pid = w->proc.pid;
    w->last_output_ms = uv_now(a->loop);
    w->stopped_since_ms = 0;
    w->running = true;
    a->nrunning++;
    if (w->out.open)
        uv_read_start((uv_stream_t *)&w->out.pipe, stream_alloc, stream_read);
    if (w->err.open)
        uv_read_start((uv_stream_t *)&w->err.pipe, stream_alloc, stream_read);
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
 * --log-dir, created if missing; without it, a new temporary directory $TMPDIR/ddprun_XXXXXX,
 * kept when --redirects or --tee asked for log files (torchrun keeps its torchelastic_XXXXXX
 * too), and removed at exit when it held only the error files. Says where the logs go.
 * Returns 0, or -1 after saying why (naming the flag) when the log files asked for cannot have
 * a directory; a missing directory for error files alone is only a warning.
 */
int setup_log_dir(agent *a)
{
    const ddprun_config *cfg = a->cfg;
    const char *flag = cfg->log_dir ? "--log-dir" : "--redirects/--tee without --log-dir";
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
    } else {
        const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        int e = 0;
        if (snprintf(base, sizeof(base), "%s/ddprun_XXXXXX", tmp) >= (int)sizeof(base))
            e = ENAMETOOLONG;
        else if (!mkdtemp(base))
            e = errno;
        if (e && a->keep_logs) {
            say("%s: cannot create a temporary directory in '%s': %s", flag, tmp, strerror(e));
            return -1;
        }
        if (e) {
            say("warning: cannot create a temporary directory in '%s' (%s): the workers get no "
                "TORCHELASTIC_ERROR_FILE",
                tmp, strerror(e));
            return 0;
        }
        if (!a->keep_logs)
            snprintf(a->tmpbase, sizeof(a->tmpbase), "%s", base);
    }
    /* The run id names the directory; a '/' in it would name another one. */
    char id[sizeof(a->run_id)];
    snprintf(id, sizeof(id), "%s", a->run_id);
    for (char *p = id; *p; p++)
        if (*p == '/')
            *p = '_';
    int e = 0;
    if (snprintf(a->logdir, sizeof(a->logdir), "%s/%s_XXXXXX", base, id) >= (int)sizeof(a->logdir))
        e = ENAMETOOLONG;
    else if (!mkdtemp(a->logdir))
        e = errno;
    if (e) {
        a->logdir[0] = '\0';
        if (a->keep_logs) {
            say("%s: cannot create a directory in '%s': %s", flag, base, strerror(e));
            return -1;
        }
        return 0;
    }
    if (a->keep_logs)
        say("worker logs and error files: %s", a->logdir);
    return 0;
}
