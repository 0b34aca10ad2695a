/*
 * ddprun: the torchrun-compatible launcher. One agent per node: it hosts the rendezvous store
 * (node 0, or the c10d endpoint's host) in-process on a thread of its own, runs the node-level
 * rendezvous through it, spawns the local workers with torchrun's environment, relays their
 * output line by line, and tears everything down when a worker fails anywhere in the job,
 * restarting the whole job while restarts remain.
 *
 * Event handling is libuv's: process exits, pipes, signals and timers on one loop, which never
 * blocks. The agent's own store calls (connecting, the rendezvous, clearing the workers' keys,
 * publishing a failure, the exit barrier) block, so they run as jobs on libuv's thread pool, one
 * at a time and in order (the agent's client is not thread-safe), and the loop goes on handling
 * signals meanwhile: a signal that arrives while the agent waits on the store (no worker
 * running) ends the node at once, abandoning the job, whose thread dies with the process. A
 * monitor thread blocks on the store too, waiting for a failure anywhere in the job or a node's
 * heartbeat to stop, and wakes the loop with uv_async_send().
 *
 * Each worker runs in its own session and process group, so signals reach its children too.
 * Workers are started through a small guard (this same binary, re-executed as "ddp-guard";
 * shim_main()) that stays as the worker's parent: a child subreaper that forwards ddprun's
 * signals and, once the worker has exited or ddprun has died (its parent-death signal), kills
 * every descendant left, double-forked and setsid()'d daemons included. Where ddprun may create
 * namespaces (CAP_SYS_ADMIN), the guards and workers of a node live in a PID namespace of their
 * own whose init ("ddp-init", init_main()) dies with ddprun, so that the kernel kills every
 * process in it however ddprun and the guards die, together included (job_ns_start()).
 * Elsewhere ddprun is a child subreaper as well, and kills whatever reaches it from a guard that
 * was itself killed; nothing cleans up when ddprun and a guard die at once.
 *
 * Worker output goes to the console through console.c's bounded, non-blocking queues: when a
 * console stops taking output, reading stops for the workers that write to it (back-pressure)
 * and nothing else waits.
 *
 * Not done here: option parsing (options.c), the node rendezvous protocols (noderdzv.c), the
 * console's descriptors and queues (console.c).
 */
#include "console.h"
#include "failure.h"
#include "jobtoken.h"
#include "noderdzv.h"
#include "options.h"
#include "rdzv.h"
#include "fmt.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <ftw.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
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
#include <linux/magic.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

/* ddprun's helper processes: this binary re-executed under these names (argv[0], and the name
 * ps and pgrep match, PR_SET_NAME), which do not contain "ddprun", so that `pkill ddprun` or
 * `pgrep -f ddprun` find the agent alone. */
#define GUARD_NAME "ddp-guard"
#define INIT_NAME "ddp-init"
#define PROG "ddprun"
#define HEARTBEAT_MS 250 /* the monitor's slice: it looks at failures, beats and joiners */
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

extern char **environ;

/*
 * The time of ddprun's own messages and of its failure summary: local wall-clock time to the
 * millisecond, "2026-11-24 21:03:04.123", the format of the summary's time column.
 */
static double wall_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void format_time(double t, char *buf, size_t n)
{
    time_t sec = (time_t)t;
    struct tm tm;
    localtime_r(&sec, &tm);
    size_t k = strftime(buf, n, "%Y-%m-%d %H:%M:%S", &tm);
    int ms = (int)((t - (double)sec) * 1000);
    snprintf(buf + k, n - k, ".%03d", ms < 0 ? 0 : ms > 999 ? 999 : ms);
}

/* ---------------------------------------------------------------------------------------- */
/* Worker guard                                                                             */
/* ---------------------------------------------------------------------------------------- */

/*
 * Marks every descriptor above standard error close-on-exec, so that what the user's shell passed
 * to ddprun (`ddprun ... 7>file`) never reaches a worker, as with torchrun; ddprun itself may
 * still use them. close_range(2) where the kernel has it (5.11), else one fcntl per entry of
 * /proc/self/fd. The agent calls it at startup; the exec shim again before the worker's exec,
 * for any descriptor a library opened without O_CLOEXEC since.
 */
static void cloexec_inherited_fds(void)
{
#if defined(SYS_close_range)
    if (syscall(SYS_close_range, 3u, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */) == 0)
        return;
#endif
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        if (*end || fd < 3 || fd == dirfd(d))
            continue;
        int fl = fcntl((int)fd, F_GETFD);
        if (fl >= 0)
            fcntl((int)fd, F_SETFD, fl | FD_CLOEXEC);
    }
    closedir(d);
}

/*
 * Reads process `pid`'s state letter ('R', 'S', 'T', ...) and parent from /proc/PID/stat.
 * Returns 0, or -1 when the process is gone or the file cannot be parsed.
 */
static int proc_stat(pid_t pid, char *state, long *ppid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    /* "pid (comm) state ppid ...": comm may hold anything, ')' included: parse after the last. */
    char *p = strrchr(buf, ')');
    return p && sscanf(p + 1, " %c %ld", state, ppid) == 2 ? 0 : -1;
}

/*
 * Lists the children of this process, over all its threads (an orphan may be reparented to any
 * thread of a subreaper), into *out (malloc'd; free it). Reads /proc/self/task/<tid>/children,
 * or, where the kernel lacks those files, scans /proc for processes whose parent we are.
 * Returns the count, or -1 when /proc cannot be read at all.
 */
static int list_children(pid_t **out)
{
    size_t n = 0, cap = 16;
    pid_t *v = malloc(cap * sizeof(*v));
    bool have_children_files = false;
    DIR *d = opendir("/proc/self/task");
    if (!v) {
        if (d)
            closedir(d);
        return -1;
    }
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char path[sizeof(e->d_name) + 32];
        snprintf(path, sizeof(path), "/proc/self/task/%s/children", e->d_name);
        FILE *f = fopen(path, "re");
        if (!f)
            continue;
        have_children_files = true;
        for (long pid; fscanf(f, "%ld", &pid) == 1;) {
            if (n == cap) {
                pid_t *w = realloc(v, (cap *= 2) * sizeof(*v));
                if (!w)
                    break;
                v = w;
            }
            v[n++] = (pid_t)pid;
        }
        fclose(f);
    }
    if (d)
        closedir(d);
    if (!have_children_files) {
        pid_t self = getpid();
        d = opendir("/proc");
        if (!d) {
            free(v);
            return -1;
        }
        for (struct dirent *e; (e = readdir(d));) {
            char state;
            long ppid;
            if (e->d_name[0] < '1' || e->d_name[0] > '9' ||
                proc_stat((pid_t)strtol(e->d_name, NULL, 10), &state, &ppid) != 0 || ppid != self)
                continue;
            if (n == cap) {
                pid_t *w = realloc(v, (cap *= 2) * sizeof(*v));
                if (!w)
                    break;
                v = w;
            }
            v[n++] = (pid_t)strtol(e->d_name, NULL, 10);
        }
        closedir(d);
    }
    *out = v;
    return (int)n;
}

/*
 * Kills and reaps every descendant of this process, which must be a child subreaper: SIGKILL to
 * every child, then wait for one to go; the children of a killed process are reparented to us
 * and killed in the next pass, so the whole tree goes, including what forks while it is being
 * killed. Stops when no child is left. `any_child` says how to reap: the guard, all of whose
 * children are fair game, waits for any (waitpid(-1)); ddprun waits for the listed pids only,
 * so as never to reap one of libuv's. Each reaped child's status goes to on_reaped, if set.
 */
static void kill_descendants(bool any_child, void (*on_reaped)(pid_t, int, void *), void *arg)
{
    for (;;) {
        pid_t *v = NULL;
        int n = list_children(&v);
        if (n < 0)
            return;
        for (int i = 0; i < n; i++)
            kill(v[i], SIGKILL);
        int st;
        pid_t r;
        if (any_child) {
            free(v);
            while ((r = waitpid(-1, &st, 0)) < 0 && errno == EINTR)
                ;
            if (r < 0)
                return; /* ECHILD: none left */
            if (on_reaped)
                on_reaped(r, st, arg);
            continue;
        }
        for (int i = 0; i < n; i++) {
            while ((r = waitpid(v[i], &st, 0)) < 0 && errno == EINTR)
                ;
            if (r > 0 && on_reaped)
                on_reaped(r, st, arg);
        }
        free(v);
        if (n == 0)
            return;
    }
}

/* The signal that asks a guard to kill its worker and everything below it at once: ddprun's
 * SIGKILL for a worker, and the guard's parent-death signal. A real-time signal, unused else. */
#define GUARD_KILL_SIG (SIGRTMIN + 2)

typedef struct guard_state {
    pid_t worker;
    int status;
    bool worker_done;
} guard_state;

static void guard_reaped(pid_t pid, int status, void *arg)
{
    guard_state *g = arg;
    if (pid == g->worker && !g->worker_done) {
        g->status = status;
        g->worker_done = true;
    }
}

/* Reads the worker's environment, NUL-separated strings, from fd 3 (a memfd ddprun filled). */
static char **guard_read_env(int fd)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size <= 0)
        return NULL;
    size_t len = (size_t)st.st_size;
    char *buf = malloc(len + 1);
    size_t n = 0;
    if (!buf)
        return NULL;
    while (n < len) {
        ssize_t k = pread(fd, buf + n, len - n, (off_t)n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        n += (size_t)k;
    }
    buf[n] = '\0';
    size_t count = 0;
    for (size_t i = 0; i < n; i++)
        count += buf[i] == '\0';
    char **env = calloc(count + 2, sizeof(char *));
    if (!env) {
        free(buf);
        return NULL;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
        env[k++] = buf + i;
    env[k] = NULL;
    return env;
}

/*
 * Joins the job's mount namespace (fd 4, in a PID namespace of ddprun's: job_ns_start()), where
 * /proc shows the job's PID namespace and /dev/shm is the job's. setns() moves the working
 * directory to the namespace's root: it goes back to the same path (which the namespace, a copy
 * of ddprun's, has too). Returns 0, or -1 with errno set.
 */
static int guard_join_mounts(int fd)
{
    char *cwd = getcwd(NULL, 0);
    int rc = setns(fd, CLONE_NEWNS);
    if (rc == 0 && cwd && chdir(cwd) != 0)
        rc = -1;
    int e = errno;
    free(cwd);
    close(fd);
    errno = e;
    return rc;
}

/*
 * argv: ddp-guard PARENT_PID program args...; fd 3: a memfd holding the worker's environment
 * (NUL-separated), into which the worker writes its pid before it execs. In a PID namespace of
 * ddprun's, PARENT_PID is 0 and fd 4 is the job's mount namespace.
 *
 * ddprun starts each worker through this guard (already in a session and process group of its
 * own), which stays as the worker's parent instead of exec'ing: ddprun's environment stays the
 * one its workers' parent shows, while the worker gets its own. The guard
 *   - names itself GUARD_NAME, so that `pkill ddprun` spares it;
 *   - is a child subreaper, so whatever the worker double-forks or setsid()s ends up below it;
 *   - asks for GUARD_KILL_SIG when ddprun dies (and checks ddprun did not die before that: in a
 *     PID namespace, where ddprun is outside and getppid() is 0, the namespace's init checks);
 *   - joins the job's mount namespace, if given one (guard_join_mounts());
 *   - vfork()s the worker, which setsid()s (its own session and process group, as a worker
 *     always had), asks for SIGKILL when the guard dies, writes its pid as ddprun sees it (read
 *     through ddprun's /proc) into the memfd, and execs the program;
 *   - forwards every signal ddprun sends (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2,
 *     SIGCONT) to
 *     the worker's process group, and on GUARD_KILL_SIG SIGKILLs it;
 *   - once the worker has exited (or on GUARD_KILL_SIG), SIGKILLs every descendant left, as
 *     ddprun always did with the leftovers of a worker's process group, waits until none is
 *     left, and exits as the worker did: its exit code, or its signal, raised again.
 * Signals are handled synchronously (sigwaitinfo), so nothing runs in a handler.
 */
static int shim_main(int argc, char **argv)
{
    if (argc < 3)
        return 127;
    sigset_t set, old;
    sigemptyset(&set);
    static const int handled[] = {SIGCHLD, SIGINT,  SIGTERM, SIGHUP,
                                  SIGQUIT, SIGUSR1, SIGUSR2, SIGCONT};
    for (size_t i = 0; i < sizeof(handled) / sizeof(handled[0]); i++)
        sigaddset(&set, handled[i]);
    sigaddset(&set, GUARD_KILL_SIG);
    sigprocmask(SIG_BLOCK, &set, &old);
    prctl(PR_SET_NAME, GUARD_NAME);

    /* 0 in a PID namespace of ddprun's: ddprun is outside, where getppid() says 0 as well. */
    pid_t parent = (pid_t)strtol(argv[1], NULL, 10);
    bool in_ns = parent == 0;
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0 || prctl(PR_SET_PDEATHSIG, GUARD_KILL_SIG) != 0 ||
        getppid() != parent)
        _exit(128 + SIGKILL);
    /* ddprun's /proc, where the worker finds its pid as ddprun knows it. */
    int procfd = open("/proc", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (in_ns && guard_join_mounts(4) != 0) {
        char when[32];
        format_time(wall_now_s(), when, sizeof(when));
        fprintf(stderr, "[%s] " PROG ": cannot start '%s': joining the job's mounts: %s\n", when,
                argv[2], strerror(errno));
        return 127;
    }
    fcntl(3, F_SETFD, FD_CLOEXEC);
    char **env = guard_read_env(3);
    if (env)
        environ = env;
    cloexec_inherited_fds(); /* fd 3 included: the worker gets 0-2 only */

    /* vfork(): the guard resumes once the worker has exec'd (or failed to), so by then the worker
     * has its own process group for the guard's signals; and nothing is copied. The child only
     * makes system calls before exec. */
    volatile int exec_errno = 0; /* the child's, when exec fails (vfork(): shared memory) */
    pid_t guard = getpid();
    guard_state g = {.worker = vfork()};
    if (g.worker < 0) {
        char when[32];
        format_time(wall_now_s(), when, sizeof(when));
        fprintf(stderr, "[%s] " PROG ": cannot start '%s': %s\n", when, argv[2], strerror(errno));
        return 127;
    }
    if (g.worker == 0) {
        sigprocmask(SIG_SETMASK, &old, NULL);
        setsid();
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != guard)
            _exit(128 + SIGKILL);
        /* The worker's pid goes into the memfd before the program runs, so that ddprun names it
         * from the first line the program writes (the guard itself may not run again for a
         * while): as ddprun's /proc has it, which in a PID namespace getpid() does not say.
         * Only system calls: no stdio after vfork(). */
        char pid[16];
        ssize_t pl = procfd >= 0 ? readlinkat(procfd, "self", pid, sizeof(pid)) : -1;
        if (pl <= 0 || pl == (ssize_t)sizeof(pid)) {
            pl = 0;
            for (unsigned long v = (unsigned long)getpid(); v || pl == 0; v /= 10)
                pid[sizeof(pid) - ++pl] = (char)('0' + v % 10);
            memmove(pid, pid + sizeof(pid) - pl, (size_t)pl);
        }
        if (ftruncate(3, 0) != 0 || pwrite(3, pid, (size_t)pl, 0) != pl) {
            /* Nothing to do: ddprun then names the guard's pid instead of the worker's. */
        }
        execvp(argv[2], argv + 2);
        exec_errno = errno;
        _exit(errno == ENOENT ? 127 : 126);
    }
    if (exec_errno) {
        char when[32];
        format_time(wall_now_s(), when, sizeof(when));
        fprintf(stderr, "[%s] " PROG ": cannot execute '%s': %s\n", when, argv[2],
                strerror(exec_errno));
    }
    if (procfd >= 0)
        close(procfd);
    close(3);

    bool kill_all = false;
    while (!g.worker_done && !kill_all) {
        siginfo_t si;
        int sig = sigwaitinfo(&set, &si);
        if (sig == SIGCHLD) {
            int st;
            pid_t r;
            while ((r = waitpid(-1, &st, WNOHANG)) > 0)
                guard_reaped(r, st, &g);
        } else if (sig == GUARD_KILL_SIG) {
            kill_all = true;
        } else if (sig > 0) {
            kill(-g.worker, sig);
        }
    }
    /* A live worker's process group first (its members may have left it, but usually have
     * not), then every descendant: whatever lost its parent was reparented to us. Once the
     * worker is reaped its group's pid may be reused, and its members are our children anyway. */
    if (!g.worker_done)
        kill(-g.worker, SIGKILL);
    kill_descendants(true, guard_reaped, &g);
    if (WIFSIGNALED(g.status)) {
        int sig = WTERMSIG(g.status);
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core); /* the worker may have dumped one; we should not */
        signal(sig, SIG_DFL);
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, sig);
        sigprocmask(SIG_UNBLOCK, &one, NULL);
        raise(sig);
        _exit(128 + sig);
    }
    _exit(WIFEXITED(g.status) ? WEXITSTATUS(g.status) : 1);
}

/*
 * Mounts a tmpfs of the job's on /dev/shm, as large as the one it covers, when that is a tmpfs.
 * Returns 0 (done, or nothing to do), or an errno value.
 */
static int init_mount_shm(void)
{
    struct statfs sf;
    if (statfs("/dev/shm", &sf) != 0 || sf.f_type != TMPFS_MAGIC)
        return 0;
    char opts[64];
    snprintf(opts, sizeof(opts), "mode=1777,size=%llu",
             (unsigned long long)sf.f_blocks * (unsigned long long)sf.f_bsize);
    return mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, opts) == 0 ? 0 : errno;
}

/*
 * argv: ddp-init; fd 3: the read end of a pipe whose write end ddprun alone holds; fd 4: the
 * write end of a pipe on which the init reports its setup, an int: 0, or an errno value.
 *
 * The init (PID 1) of the PID namespace in which ddprun starts a node's guards and workers
 * (job_ns_start()). When the init of a PID namespace dies, whatever killed it, the kernel
 * SIGKILLs every process in the namespace, and no process can leave it; this init dies with
 * ddprun: its parent-death signal is SIGKILL, and it exits when the pipe on fd 3 reaches its end
 * (for a ddprun that died before the prctl). It
 *   - makes the job's mounts: a copy of ddprun's that receives later mounts and sends none,
 *     with /proc showing this PID namespace (so that the pid a worker's getpid() returns names
 *     its own /proc entry), and /dev/shm a tmpfs of the job's, as large as the host's (names
 *     built from pids, which every PID namespace reuses, then never meet another job's);
 *   - adopts what a guard that was itself killed left behind, and kills it: on SIGCHLD (the
 *     guard's worker died of its parent-death signal) and on SIGUSR1 (ddprun's round is over) it
 *     SIGKILLs all its children, which are all such orphans (the guards are ddprun's children);
 *   - reaps them, and takes no other signal: all stay blocked (a terminal's SIGINT does not
 *     reach it anyway: it has a session of its own).
 */
static int init_main(void)
{
    prctl(PR_SET_NAME, INIT_NAME);
    sigset_t all, want;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, NULL);
    sigemptyset(&want);
    sigaddset(&want, SIGCHLD);
    sigaddset(&want, SIGUSR1);
    int sfd = signalfd(-1, &want, SFD_CLOEXEC);
    int err = 0;
    if (getpid() != 1)
        err = EINVAL;
    else if (sfd < 0 || prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || unshare(CLONE_NEWNS) != 0 ||
             mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) != 0 ||
             mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0)
        err = errno;
    else
        err = init_mount_shm();
    if (write(4, &err, sizeof(err)) != (ssize_t)sizeof(err) || err != 0)
        _exit(1);
    close(4);
    if (chdir("/") != 0) {
        /* Only so as not to hold ddprun's working directory busy: nothing to do. */
    }
    struct pollfd p[2] = {{.fd = 3, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
    for (;;) {
        if (poll(p, 2, -1) < 0)
            continue; /* EINTR: nothing is handled, but a stop and continue may still cause it */
        if (p[0].revents)
            _exit(0);
        struct signalfd_siginfo si;
        if (p[1].revents && read(sfd, &si, sizeof(si)) > 0)
            kill_descendants(true, NULL, NULL);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Agent state                                                                              */
/* ---------------------------------------------------------------------------------------- */

/*
 * A line assembler for one output stream of one worker (see relay()). `col0` and `after_cr` are
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
} stream;

typedef struct worker {
    struct agent *a;
    int local_rank, rank;
    char prefix[256]; /* of its console lines (--log-line-prefix-template); "": none */
    uv_process_t proc;
    stream out, err;
    pid_t pid;        /* the guard's: ddprun signals it */
    pid_t worker_pid; /* the program's, as the guard reported it (0: unknown) */
    int envfd;        /* memfd shared with the guard (environment in, worker pid out); -1 */
    bool running;
    bool exited_unstopped; /* had exited already when ddprun began stopping the workers */
    char error_file[PATH_MAX];
    uint64_t last_output_ms;   /* uv_now() at spawn or at its last output (--hung-timeout) */
    uint64_t stopped_since_ms; /* uv_now() when first seen stopped (state T), 0 if not */
} worker;

/*
 * ST_WAITING: no worker of this node exists and the agent waits on the store (connecting, a
 * rendezvous, the exit barrier) or for the next round to start. ST_RUNNING: workers run.
 * ST_STOPPING: they are being stopped. ST_DONE: the loop ends and ddprun exits.
 */
typedef enum { ST_WAITING, ST_RUNNING, ST_STOPPING, ST_DONE } agent_state;

struct agent;

/* A blocking store call run off the loop (see the file comment). */
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
    char err[640];         /* what went wrong, for the loop thread to print */
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
    rdzv_server *store;                      /* hosted here (node 0 / c10d host), else NULL */
    char store_host[256];                    /* where agents and workers reach the store */
    char connect_host[256];                  /* where this agent reaches it */
    char bind_host[64];                      /* the address the store hosted here binds */
    int store_port;
    char token[RDZV_TOKEN_MAX_BYTES + 1]; /* the job's secret (jobtoken.h); "": none */
    rdzv_client *client;                  /* the agent's own connection */
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
    int nprocs;               /* worker process handles not closed yet */
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
    int monitor_round; /* round the monitor watches; -1: stop */
    char remote_failure[1024];
    int remote_round;               /* the round remote_failure belongs to */
    closed_peer closed[MAX_CLOSED]; /* store connections that closed (ring; under mu) */
    uint64_t nclosed, closed_seen;  /* ring positions: written, looked at by the monitor */

    /* The workers' PID namespace (job_ns_start()) */
    uv_process_t *init_proc; /* its init, while it runs (freed once closed); NULL: none */
    int init_alive_fd;       /* the pipe's write end the init watches; -1 */
    int mntns_fd;            /* the init's mount namespace, for the guards to join; -1 */
    int own_pidns_fd;        /* ddprun's own PID namespace, to go back to; -1 */
    bool ns_unavailable;     /* no PID namespace can be had: the guards contain the workers */
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

/*
 * The agent's own lines go to standard error through its console once it is open (never
 * blocking the loop; from other threads, such as the store's, by way of the loop), before that
 * through stdio.
 */
static ddprun_console *err_console;
static pthread_t loop_thread;

static void emit_line(const char *line, size_t n)
{
    if (!err_console)
        fwrite(line, 1, n, stderr);
    else if (pthread_equal(pthread_self(), loop_thread))
        ddprun_console_write(err_console, line, n);
    else
        ddprun_console_post(err_console, line, n);
}

/*
 * Formats one line (the newline is added) and emits it, with "[<time>] ddprun: " in front if
 * `tag` (format_time()).
 */
static void vemit(bool tag, const char *fmt, va_list ap)
{
    char line[2048], when[32] = "";
    if (tag)
        format_time(wall_now_s(), when, sizeof(when));
    size_t k = tag ? (size_t)snprintf(line, sizeof(line), "[%s] " PROG ": ", when) : 0;
    int n = vsnprintf(line + k, sizeof(line) - k - 1, fmt, ap);
    if (n < 0)
        return;
    k += (size_t)n;
    if (k > sizeof(line) - 2)
        k = sizeof(line) - 2;
    line[k++] = '\n';
    emit_line(line, k);
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vemit(true, fmt, ap);
    va_end(ap);
}

/* A line without the "ddprun: " tag (the summary table). */
static void emit(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void emit(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vemit(false, fmt, ap);
    va_end(ap);
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
    env_set(&e, "MASTER_ADDR", a->store_host);
    env_seti(&e, "MASTER_PORT", a->store_port);
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
/* Output relay                                                                             */
/* ---------------------------------------------------------------------------------------- */

/*
 * Expands the prefix template for one worker as torchrun's string.Template.safe_substitute() does:
 * ${name} and $name for role_name, rank and local_rank, and (ddprun's own) hostname; "$$" is
 * "$"; anything else stays as written.
 */
static void line_prefix(const agent *a, const worker *w, char *out, size_t n)
{
    const char *t =
        a->cfg->log_line_prefix_template ? a->cfg->log_line_prefix_template : "[${rank}]:";
    size_t o = 0;
    while (*t && o + 1 < n) {
        if (t[0] == '$' && t[1] == '$') {
            out[o++] = '$';
            t += 2;
            continue;
        }
        if (t[0] == '$') {
            bool braced = t[1] == '{';
            const char *name = t + 1 + braced;
            size_t len = 0;
            if (isalpha((unsigned char)name[0]) || name[0] == '_')
                while (isalnum((unsigned char)name[len]) || name[len] == '_')
                    len++;
            char val[64];
            const char *sub = NULL;
#define IS(key) (len == sizeof(key) - 1 && !strncmp(name, key, len))
            if (IS("rank"))
                snprintf(val, sizeof(val), "%d", w->rank), sub = val;
            else if (IS("local_rank"))
                snprintf(val, sizeof(val), "%d", w->local_rank), sub = val;
            else if (IS("role_name"))
                sub = a->cfg->role;
            else if (IS("hostname"))
                sub = a->hostname;
#undef IS
            if (sub && (!braced || name[len] == '}')) {
                o += (size_t)snprintf(out + o, n - o, "%s", sub);
                if (o >= n)
                    o = n - 1;
                t = name + len + braced;
                continue;
            }
        }
        out[o++] = *t++;
    }
    out[o] = '\0';
}

/* Writes all `n` bytes; returns 0, or -errno with *done set to the bytes written before. */
static int write_all(int fd, const char *p, size_t n, size_t *done)
{
    size_t k0 = n;
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            if (done)
                *done = k0 - n;
            return -errno;
        }
        p += k;
        n -= (size_t)k;
    }
    if (done)
        *done = k0;
    return 0;
}

/* Stops reading a worker's pipe while its console is over its limit: the worker waits. */
static void stream_pause(stream *s)
{
    if (s->open && !s->paused) {
        uv_read_stop((uv_stream_t *)&s->pipe);
        s->paused = true;
    }
}

static void stream_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void stream_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);

/* A console drained: the workers whose `which` stream waited for it may go on. */
static void resume_streams(agent *a, int which)
{
    for (int i = 0; i < a->nworkers; i++) {
        stream *s = which == DDPRUN_STD_OUT ? &a->workers[i].out : &a->workers[i].err;
        if (s->open && s->paused) {
            s->paused = false;
            uv_read_start((uv_stream_t *)&s->pipe, stream_alloc, stream_read);
        }
    }
}

static void stdout_drained(void *arg)
{
    resume_streams(arg, DDPRUN_STD_OUT);
}

static void stderr_drained(void *arg)
{
    resume_streams(arg, DDPRUN_STD_ERR);
}

/*
 * Queues the first `n` bytes held for stream `s` for its console, in one write so that they
 * never interleave with another worker's, and drops them from the stream's buffer. Every line
 * starts with the worker's prefix, and so does every stretch after a carriage return (a
 * progress bar's redraw: "\r[0]: 40%|####"), except a "\n" that ends "\r\n"; the prefix goes
 * out with the line's first byte, so a line flushed in parts (a partial line, then the rest)
 * carries it once. When the console's last bytes are another worker's unfinished line, a
 * newline ends that line first (with a prefix on; that worker's next bytes then start a line of
 * their own). Over the console's limit, reading this worker's pipe stops until it drains.
 */
static void relay(stream *s, size_t n)
{
    if (n == 0)
        return;
    agent *a = s->w->a;
    int c = s->which == DDPRUN_STD_OUT ? 1 : 2;
    const char *prefix = a->cfg->prefix_output ? s->w->prefix : "";
    size_t pl = strlen(prefix), starts = 1;
    for (size_t i = 0; i < n; i++)
        starts += s->line[i] == '\n' || s->line[i] == '\r';
    size_t total = 1 + n + starts * pl;
    char stackbuf[8192];
    char *buf = total <= sizeof(stackbuf) ? stackbuf : malloc(total);
    if (!buf)
        die_oom();
    size_t o = 0;
    stream *other = a->partial[c];
    if (pl && other && other != s) {
        buf[o++] = '\n';
        other->col0 = true;
        other->after_cr = false;
    }
    for (size_t i = 0; i < n; i++) {
        char ch = s->line[i];
        if (s->col0 && ch != '\r' && !(ch == '\n' && s->after_cr)) {
            memcpy(buf + o, prefix, pl);
            o += pl;
            s->col0 = false;
        }
        buf[o++] = ch;
        s->col0 = ch == '\n' || ch == '\r';
        s->after_cr = ch == '\r';
    }
    a->partial[c] = buf[o - 1] == '\n' ? NULL : s;
    if (ddprun_console_write(a->con[c], buf, o) == 1)
        stream_pause(s);
    if (buf != stackbuf)
        free(buf);
    memmove(s->line, s->line + n, s->len - n);
    s->len -= n;
}

/* A partial line waited PARTIAL_MS for its newline: out with it (a prompt, a progress bar). */
static void partial_timer_cb(uv_timer_t *t)
{
    stream *s = t->data;
    relay(s, s->len);
}

/*
 * Relays the complete lines held for `s`, and arms its timer for what is left: an unfinished
 * line goes out PARTIAL_MS after its first byte arrived unless its newline comes first.
 */
static void relay_lines(stream *s)
{
    size_t end = s->len;
    while (end > 0 && s->line[end - 1] != '\n')
        end--;
    relay(s, end);
    if (s->len == 0)
        uv_timer_stop(&s->partial_timer);
    else if (end > 0 || !uv_is_active((uv_handle_t *)&s->partial_timer))
        uv_timer_start(&s->partial_timer, partial_timer_cb, PARTIAL_MS, 0);
}

static void stream_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    stream *s = h->data;
    (void)suggested;
    if (s->cap - s->len < 16384 && s->cap < LINE_MAX_BYTES) {
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
    if (--s->closing > 0)
        return;
    free(s->line);
    s->line = NULL;
    s->len = s->cap = 0;
    s->w->a->nstreams--;
    maybe_round_over(s->w->a);
}

/* At the end of a stream: what is held goes out, and a line it left unfinished is ended. */
static void stream_close(stream *s)
{
    if (!s->open)
        return;
    if (s->console) {
        relay(s, s->len);
        agent *a = s->w->a;
        int c = s->which == DDPRUN_STD_OUT ? 1 : 2;
        if (a->partial[c] == s) {
            ddprun_console_write(a->con[c], "\n", 1);
            a->partial[c] = NULL;
        }
    }
    s->len = 0;
    if (s->file >= 0)
        close(s->file);
    s->file = -1;
    s->open = false;
    s->closing = 2;
    uv_close((uv_handle_t *)&s->partial_timer, stream_closed);
    uv_close((uv_handle_t *)&s->pipe, stream_closed);
}

/* The log file of `s` cannot be written: say so, and send the rest to the console instead. */
static void log_write_failed(stream *s, int err)
{
    worker *w = s->w;
    agent *a = w->a;
    say("rank %d: cannot write %s/attempt_%d/%d/%s: %s; the rest of its output goes to the "
        "console",
        w->rank, a->logdir, a->restart_count, w->local_rank,
        s->which == DDPRUN_STD_OUT ? "stdout.log" : "stderr.log", strerror(-err));
    close(s->file);
    s->file = -1;
    s->console = true;
}

static void stream_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    stream *s = st->data;
    (void)buf;
    if (nread > 0) {
        size_t n = (size_t)nread;
        s->w->last_output_ms = uv_now(s->w->a->loop);
        /* Bytes go to the log file as they arrive: no tail thread, no lag. */
        if (s->file >= 0) {
            size_t done;
            bool console = s->console;
            int rc = write_all(s->file, s->line + s->len, n, &done);
            if (rc < 0) {
                log_write_failed(s, rc);
                if (!console) { /* what the file did not take goes to the console */
                    memmove(s->line + s->len, s->line + s->len + done, n - done);
                    n -= done;
                }
            }
        }
        s->len += n;
        if (!s->console) {
            s->len = 0;
            return;
        }
        if (s->len == s->cap) /* a line longer than the buffer: pass it on as it is */
            relay(s, s->len);
        relay_lines(s);
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

static void describe_exit(int code, char *buf, size_t n)
{
    if (code >= 0)
        snprintf(buf, n, "exit %d", code);
    else
        snprintf(buf, n, "signal %d (%s)", -code, sigabbrev_np(-code) ? sigabbrev_np(-code) : "?");
}

/*
 * Prints the failure table under the line `title` (what happens next): every failure of the
 * round, local or reported by another node, the root cause (the earliest failure of its own)
 * first and marked "root", the failures that came with the teardown (teardown) last.
 */
static void print_summary(agent *a, const char *title)
{
    if (a->nfailures == 0) {
        say("%s", title);
        return;
    }
    qsort(a->failures, a->nfailures, sizeof(ddprun_failure), ddprun_failure_cmp);
    emit("%s", "============================================================");
    say("%s", title);
    emit("%-8s %-23s %-16s %5s %5s %-18s %8s  %s", "", "time", "node", "rank", "local", "exit",
         "pid", "message");
    bool teardown = false;
    for (size_t i = 0; i < a->nfailures; i++) {
        const ddprun_failure *f = &a->failures[i];
        char when[32], how[48];
        format_time(f->time, when, sizeof(when));
        describe_exit(f->exit_code, how, sizeof(how));
        teardown |= f->teardown;
        const char *mark = i == 0 ? "root" : f->teardown ? "teardown" : "";
        emit("%-8s %-23s %-16s %5d %5d %-18s %8d  %s", mark, when, f->node, f->rank, f->local_rank,
             how, f->pid, f->message);
    }
    if (teardown)
        emit("(teardown: ended after " PROG " had begun stopping the workers)");
    emit("%s", "============================================================");
}

/*
 * The node's job succeeded; after a restart, says so, since the summaries before it said that
 * the worker group had failed.
 */
static void job_succeeded(agent *a)
{
    if (a->restart_count > 0)
        say("job succeeded after %d restart%s", a->restart_count, a->restart_count == 1 ? "" : "s");
}

/* The summary of a job that failed for good (nothing when a signal stopped it and nothing
 * failed: the line saying so follows). */
static void print_final_summary(agent *a)
{
    if (a->nfailures == 0 && a->stop_for_signal)
        return;
    char title[128];
    if (a->stop_for_signal)
        snprintf(title, sizeof(title), "job failed; no restart after SIG%s",
                 sigabbrev_np(a->signal_seen));
    else if (a->cfg->max_restarts > 0)
        snprintf(title, sizeof(title), "job failed: no restart left (%d of %d used)",
                 a->restart_count, a->cfg->max_restarts);
    else
        snprintf(title, sizeof(title), "job failed");
    print_summary(a, title);
}

/* ---------------------------------------------------------------------------------------- */
/* Stopping                                                                                 */
/* ---------------------------------------------------------------------------------------- */

/* Signals every running worker through its guard, which forwards the signal to the worker's
 * process group; SIGKILL becomes the guard's request to kill the worker and all below it. */
static void signal_workers(agent *a, int sig)
{
    for (int i = 0; i < a->nworkers; i++)
        if (a->workers[i].running)
            kill(a->workers[i].pid, sig == SIGKILL ? GUARD_KILL_SIG : sig);
}

static pid_t worker_program_pid(worker *w);

/*
 * Lists the workers still running as "rank 1 (pid 4242), rank 2 (pid 4243)", for the lines that
 * say whom ddprun signals; returns how many. A worker whose guard has exited already (a zombie
 * that libuv reaps in a moment) is not running any more: it is left out, and marked as having
 * exited before ddprun stopped anyone when `mark` is set.
 */
static int running_list(agent *a, bool mark, char *buf, size_t n)
{
    int count = 0;
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < a->nworkers; i++) {
        worker *w = &a->workers[i];
        char st = 0;
        long ppid;
        if (!w->running)
            continue;
        if (proc_stat(w->pid, &st, &ppid) == 0 && st == 'Z') {
            w->exited_unstopped |= mark;
            continue;
        }
        if (++count <= 16 && o < n)
            o += (size_t)snprintf(buf + o, n - o, "%srank %d (pid %d)", count > 1 ? ", " : "",
                                  w->rank, (int)worker_program_pid(w));
    }
    if (count > 16 && o < n)
        snprintf(buf + o, n - o, " and %d more", count - 16);
    return count;
}

static void kill_timer_cb(uv_timer_t *t)
{
    agent *a = t->data;
    char list[1024];
    if (running_list(a, false, list, sizeof(list)) > 0)
        say("sending SIGKILL to %s: still running %g s after SIGTERM", list,
            a->cfg->shutdown_timeout_s);
    if (a->nrunning > 0)
        signal_workers(a, SIGKILL);
}

/*
 * Stops every local worker: SIGTERM to each process group, SIGKILL after the grace period; the
 * line saying so names the workers signalled.
 */
static void stop_workers(agent *a)
{
    if (a->state != ST_RUNNING)
        return;
    a->state = ST_STOPPING;
    char list[1024];
    if (running_list(a, true, list, sizeof(list)) > 0)
        say("sending SIGTERM to %s; SIGKILL to any still running in %g s", list,
            a->cfg->shutdown_timeout_s);
    signal_workers(a, SIGTERM);
    signal_workers(a, SIGCONT); /* a stopped worker could not act on it */
    if (a->nrunning > 0)
        uv_timer_start(&a->kill_timer, kill_timer_cb,
                       (uint64_t)(a->cfg->shutdown_timeout_s * 1000.0), 0);
}

/* ---------------------------------------------------------------------------------------- */
/* Spawning                                                                                 */
/* ---------------------------------------------------------------------------------------- */

static void on_worker_exit(uv_process_t *p, int64_t status, int term_signal);

/* This program's path, for re-executing it as a guard or an init. */
static void self_exe(char *self, size_t n)
{
    ssize_t sl = readlink("/proc/self/exe", self, n - 1);
    if (sl <= 0)
        snprintf(self, n, "%s", "/proc/self/exe");
    else
        self[sl] = '\0';
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
static int job_ns_start(agent *a)
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
    char self[PATH_MAX];
    self_exe(self, sizeof(self));
    char *args[] = {INIT_NAME, NULL};
    uv_stdio_container_t io[5] = {{.flags = UV_IGNORE},
                                  {.flags = UV_IGNORE},
                                  {.flags = UV_IGNORE},
                                  {.flags = UV_INHERIT_FD, .data.fd = alive[0]},
                                  {.flags = UV_INHERIT_FD, .data.fd = ready[1]}};
    uv_process_options_t o = {.file = self,
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

static int spawn_worker(agent *a, worker *w)
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

    char self[PATH_MAX];
    self_exe(self, sizeof(self));
    uv_process_options_t o = {0};
    o.file = self;
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
/* Hung workers (--hung-timeout)                                                            */
/* ---------------------------------------------------------------------------------------- */

/*
 * The pid of worker w's program, which its guard writes into the memfd they share once the
 * program has started: read once, then remembered. Returns it, or the guard's pid while unknown.
 */
static pid_t worker_program_pid(worker *w)
{
    if (!w->worker_pid && w->envfd >= 0) {
        char buf[16] = "";
        ssize_t k = pread(w->envfd, buf, sizeof(buf) - 1, 0);
        char *end = buf;
        long pid = k > 0 ? strtol(buf, &end, 10) : 0;
        /* Until the guard writes, the memfd holds the environment, never a bare number. */
        if (pid > 0 && pid <= INT_MAX && *end == '\0')
            w->worker_pid = (pid_t)pid;
    }
    return w->worker_pid ? w->worker_pid : w->pid;
}

static void publish_failure(agent *a, const ddprun_failure *f);

/*
 * --hung-timeout: a worker is hung once it has been stopped (state T: SIGSTOP, SIGTSTP, a
 * debugger) or silent for the timeout. Silence counts only for workers whose output the agent
 * relays (with --no-prefix and no log files it never sees any). When every running worker of
 * the node is hung, the node fails as if a worker had: a record without a rank, the other nodes
 * told, the workers stopped (with SIGCONT after SIGTERM), and a restart if one is left.
 */
static void hung_timer_cb(uv_timer_t *t)
{
    agent *a = t->data;
    if (a->state != ST_RUNNING || a->nrunning == 0)
        return;
    uint64_t now = uv_now(a->loop), limit = (uint64_t)(a->cfg->hung_timeout_s * 1000.0);
    char detail[256] = "";
    size_t o = 0;
    int listed = 0;
    bool all = true;
    for (int i = 0; i < a->nworkers; i++) {
        worker *w = &a->workers[i];
        if (!w->running)
            continue;
        char st = 0;
        long ppid;
        bool stopped =
            proc_stat(worker_program_pid(w), &st, &ppid) == 0 && (st == 'T' || st == 't');
        if (!stopped)
            w->stopped_since_ms = 0;
        else if (!w->stopped_since_ms)
            w->stopped_since_ms = now;
        bool observed = w->out.open || w->err.open;
        bool hung = (stopped && now - w->stopped_since_ms >= limit) ||
                    (observed && now - w->last_output_ms >= limit);
        if (!hung)
            all = false; /* go on updating the others' stopped_since_ms */
        else if (listed++ < 8 && o < sizeof(detail))
            o += (size_t)snprintf(detail + o, sizeof(detail) - o, "%slocal rank %d %s",
                                  listed > 1 ? ", " : "", w->local_rank,
                                  stopped ? "stopped" : "silent");
    }
    if (!all)
        return;
    char msg[512];
    snprintf(msg, sizeof(msg), "workers hung: no output or stopped for %g s (%s%s)",
             a->cfg->hung_timeout_s, detail, listed > 8 ? ", ..." : "");
    say("%s: stopping the workers", msg);
    ddprun_failure f;
    ddprun_failure_init(&f, a->hostname, -1, -1, 1, 0, msg);
    add_failure(a, &f);
    publish_failure(a, &f);
    stop_workers(a);
}

/* ---------------------------------------------------------------------------------------- */
/* Rounds                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static void start_round(agent *a);
static store_job *job_new(agent *a, job_kind kind);
static void job_queue(agent *a, store_job *j);

/* Tells the other nodes through the store (a job: the loop does not wait for the reply). */
static void publish_failure(agent *a, const ddprun_failure *f)
{
    char *js = ddprun_failure_to_json(f);
    if (!js)
        return;
    store_job *j = job_new(a, JOB_PUBLISH);
    j->round = a->round;
    j->json = js;
    job_queue(a, j);
}

static void restart_cb(uv_timer_t *t)
{
    agent *a = t->data;
    if (a->state == ST_WAITING)
        start_round(a);
}

/* Everything of this round has exited: restart, or finish. */
static void round_over(agent *a)
{
    uv_timer_stop(&a->kill_timer);
    uv_timer_stop(&a->hung_timer);
    if (a->membership_change && !a->stop_for_signal && a->nfailures == 0) {
        /* Nodes are waiting to join: every node re-rendezvous; no restart is used up. */
        a->membership_change = false;
        a->round++;
        a->state = ST_WAITING;
        uv_timer_start(&a->restart_timer, restart_cb, 0, 0);
        return;
    }
    a->membership_change = false;
    bool failed = a->nfailures > 0 || a->state == ST_STOPPING;
    if (!failed) {
        /* Success here: wait for the other nodes before leaving, since node 0's store serves
         * them (torchrun's exit barrier) -- unless one of them fails meanwhile. */
        if (a->asg.nnodes > 1) {
            a->state = ST_WAITING;
            store_job *j = job_new(a, JOB_BARRIER);
            j->round = a->round;
            j->asg = a->asg;
            job_queue(a, j);
            return;
        }
        a->exit_code = 0;
        a->state = ST_DONE;
        job_succeeded(a);
        return;
    }
    if (!a->stop_for_signal && a->restart_count < a->cfg->max_restarts) {
        char title[128];
        snprintf(title, sizeof(title), "worker group failed: restarting it (restart %d of %d)",
                 a->restart_count + 1, a->cfg->max_restarts);
        print_summary(a, title);
        a->restart_count++;
        a->round++;
        free(a->failures);
        a->failures = NULL;
        a->nfailures = 0;
        a->state = ST_WAITING;
        /* From a fresh loop iteration: we may be inside a close callback of this round. */
        uv_timer_start(&a->restart_timer, restart_cb, 0, 0);
        return;
    }
    a->state = ST_DONE;
    print_final_summary(a);
    if (a->stop_for_signal)
        a->exit_code = 128 + a->signal_seen;
    else if (a->nfailures) {
        /* The root cause decides the exit code: the worker's code, or 128 + its signal. */
        qsort(a->failures, a->nfailures, sizeof(ddprun_failure), ddprun_failure_cmp);
        a->exit_code = ddprun_failure_exit_status(&a->failures[0]);
    } else if (a->exit_code == 0) {
        a->exit_code = 1;
    }
}

/* How long a console may take no output before ddprun stops waiting for it: less once a
 * signal asked ddprun to stop. */
static int stall_ms(const agent *a)
{
    return a->stop_for_signal ? TICK_MS : STALL_MS;
}

/*
 * The wait for the consoles once a round's workers are gone is one wait, with one deadline: it
 * begins when the drain of the round's pipes does (or at exit, when there was none) and goes on
 * through the exit, so that a console that takes nothing is given up stall_ms() after it began,
 * not once per phase (which had made 2 s 4, and half a second one). Each console counts on its
 * own: ddprun's lines going to a file on standard error are no progress of a stalled standard
 * output.
 */
static void console_wait_begin(agent *a)
{
    if (a->con_waiting)
        return;
    a->con_waiting = true;
    for (int fd = 1; fd <= 2; fd++) {
        a->con_written[fd] = ddprun_console_written(a->con[fd]);
        a->con_moved_ms[fd] = uv_now(a->loop);
    }
}

/* True when console `fd` (1 or 2) has taken no output for stall_ms() since the wait began. */
static bool console_stalled(agent *a, int fd)
{
    uint64_t now = uv_now(a->loop), w = ddprun_console_written(a->con[fd]);
    if (w != a->con_written[fd]) {
        a->con_written[fd] = w;
        a->con_moved_ms[fd] = now;
    }
    return now - a->con_moved_ms[fd] >= (uint64_t)stall_ms(a);
}

static void drain_timer_cb(uv_timer_t *t)
{
    agent *a = t->data;
    a->drain_ticks++;
    bool stalled[2] = {console_stalled(a, 1), console_stalled(a, 2)};
    bool waiting = false;
    for (int i = 0; i < a->nworkers; i++) {
        stream *ss[2] = {&a->workers[i].out, &a->workers[i].err};
        for (int k = 0; k < 2; k++) {
            if (!ss[k]->open)
                continue;
            /* A pipe that waits for a console still taking output gets more time; one that
             * waits for a stalled console is given up; one a grandchild holds gets a second. */
            bool keep = ss[k]->paused ? !stalled[k] : a->drain_ticks * TICK_MS < 1000;
            if (keep) {
                waiting = true;
            } else {
                if (ss[k]->paused)
                    say("local rank %d: the rest of its %s is dropped: the console took no "
                        "output for %d ms",
                        a->workers[i].local_rank, k ? "standard error" : "standard output",
                        stall_ms(a));
                stream_close(ss[k]);
            }
        }
    }
    if (!waiting)
        uv_timer_stop(&a->drain_timer);
}

/*
 * A round is over once every worker has exited and its output has been relayed. The guards kill
 * every descendant of their workers before they exit; what a guard that was itself killed left
 * behind was reparented to ddprun (a subreaper), and goes now: with every guard reaped, each
 * child ddprun still has is such a stray. In a PID namespace the strays went to its init
 * instead, which ddprun asks to kill them (and which has killed them already when their worker
 * died: init_main()). Pipes that outlive even that (an end passed to a
 * process outside the tree) are closed after a second, and pipes whose reading waits for a
 * console that took nothing for stall_ms() (stalled) are too.
 */
static void maybe_round_over(agent *a)
{
    if (a->round_done || a->nrunning > 0 || a->nprocs > 0)
        return;
    if (a->init_proc)
        kill(a->init_proc->pid, SIGUSR1); /* the PID namespace's init adopted the strays */
    else
        kill_descendants(false, NULL, NULL);
    if (a->nstreams > 0) {
        if (!uv_is_active((uv_handle_t *)&a->drain_timer)) {
            console_wait_begin(a);
            a->drain_ticks = 0;
            uv_timer_start(&a->drain_timer, drain_timer_cb, TICK_MS, TICK_MS);
        }
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
    if (w->envfd >= 0) {
        worker_program_pid(w); /* the summary names the program's process */
        close(w->envfd);
        w->envfd = -1;
    }

    /*
     * A worker we did not stop that exits non-zero or by a signal fails the job. One that does
     * so while a failure is being torn down is listed too, as a teardown failure, unless it had
     * exited before the teardown began; the summary shows every worker that failed. (Workers
     * stopped for a signal to ddprun or to admit new nodes are not failures.)
     */
    bool own = a->state == ST_RUNNING || w->exited_unstopped;
    if ((status != 0 || term_signal != 0) &&
        (a->state == ST_RUNNING || (a->state == ST_STOPPING && a->nfailures > 0))) {
        char message[512], how[48];
        int code = term_signal ? -term_signal : (int)status;
        read_error_file(w->error_file, message, sizeof(message));
        ddprun_failure f;
        ddprun_failure_init(&f, a->hostname, w->rank, w->local_rank, code,
                            w->worker_pid ? w->worker_pid : w->pid, message);
        f.teardown = !own;
        add_failure(a, &f);
        if (a->state == ST_RUNNING) {
            describe_exit(code, how, sizeof(how));
            say("rank %d (local rank %d, pid %d) failed: %s", w->rank, w->local_rank, f.pid, how);
            publish_failure(a, &f);
            stop_workers(a);
        }
    }
    /* Leftovers of the worker (its process group, daemons it started) went with its guard. */
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
        if (f.rank >= 0)
            say("rank %d on %s failed: stopping the local workers", f.rank, f.node);
        else
            say("%s: stopping the local workers", f.message);
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

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/*
 * The store's on_close hook (the store's thread, when this agent hosts it): notes the closed
 * connection's far end for the monitor, which looks it up among the nodes' connection records.
 * A ring: if more connections close within one monitor slice than it holds, the oldest are
 * forgotten, and a node among them counts as dead only once its heartbeats time out.
 */
static void store_conn_closed(void *arg, const char *host, int port)
{
    agent *a = arg;
    pthread_mutex_lock(&a->mu);
    closed_peer *p = &a->closed[a->nclosed++ % MAX_CLOSED];
    snprintf(p->host, sizeof(p->host), "%s", host);
    p->port = port;
    pthread_mutex_unlock(&a->mu);
}

/* On the hosting agent: the node rank whose monitor connection closed since the last look, or
 * -1. A connection of this node, or one that is no node's monitor (a worker's), is no news. */
static int closed_node(agent *a, rdzv_client *c, int round, int nnodes, int me)
{
    closed_peer seen[MAX_CLOSED];
    pthread_mutex_lock(&a->mu);
    uint64_t n = a->nclosed - a->closed_seen;
    if (n > MAX_CLOSED)
        n = MAX_CLOSED;
    for (uint64_t i = 0; i < n; i++)
        seen[i] = a->closed[(a->nclosed - n + i) % MAX_CLOSED];
    a->closed_seen = a->nclosed;
    pthread_mutex_unlock(&a->mu);
    for (uint64_t i = 0; i < n; i++) {
        int r = ddprun_rdzv_conn_owner(c, a->prefix, round, nnodes, seen[i].host, seen[i].port);
        if (r >= 0 && r != me)
            return r;
    }
    return -1;
}

/*
 * A node found dead: unless the round already ended well (every node passed the exit barrier,
 * after which nodes leave), publish it as the round's failure so that every node stops at once
 * with the same root cause, and hand the record to the loop. Runs on the monitor's thread with
 * its own client, so a store that is slow to answer never blocks the loop.
 */
static void report_dead_node(agent *a, rdzv_client *c, int round, const char *why, char *report,
                             size_t n)
{
    if (ddprun_rdzv_exit_done(c, a->prefix, round) == 1)
        return;
    ddprun_failure f;
    ddprun_failure_init(&f, "?", -1, -1, 1, 0, why);
    char *js = ddprun_failure_to_json(&f);
    if (!js) {
        snprintf(report, n, "%s", why);
        return;
    }
    ddprun_rdzv_publish_failure(c, a->prefix, round, js);
    snprintf(report, n, "%s", js);
    free(js);
}

/*
 * Blocks on the store for the current round's failure key, beats, and watches the other nodes:
 * either wakes the loop. It uses a connection of its own (whose local end it publishes, so that
 * the store's host knows it when it closes), and waits in short slices so that it notices a new
 * round or the end of the job. A node is dead when its heartbeats stop for the liveness timeout
 * (ddprun_liveness()), or, seen by the store's host, at once when its monitor's connection
 * closes. The client's timeout outlasts the liveness timeout, so an outage the other nodes ride
 * out does not break this node's connection either.
 */
static void *monitor_main(void *arg)
{
    agent *a = arg;
    double beat_s, dead_s;
    ddprun_liveness(a->cfg, &beat_s, &dead_s);
    int slice_ms = beat_s * 1000 < HEARTBEAT_MS ? (int)(beat_s * 1000) : HEARTBEAT_MS;
    if (slice_ms < 10)
        slice_ms = 10;
    rdzv_client_options co;
    rdzv_client_options_init(&co);
    co.connect_timeout_ms = 10000;
    double timeout_s = dead_s + 2 < 5 ? 5 : dead_s + 2;
    co.timeout_ms = timeout_s < INT_MAX / 1000 ? (int)(timeout_s * 1000) : -1;
    co.token = a->token[0] ? a->token : NULL;
    rdzv_client *c = NULL;
    if (rdzv_client_connect(a->store_host, a->store_port, &co, &c) < 0)
        return NULL;
    ddprun_hb_state hb = {0};
    int hb_round = -1;
    bool dynamic = a->cfg->rdzv_backend == DDPRUN_BACKEND_C10D;
    bool reported = false;
    double last_beat = 0;
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
            if (ddprun_hb_init(&hb, a->prefix, round, nnodes, dead_s) < 0)
                break;
            hb_round = round;
            reported = false;
            ddprun_rdzv_publish_conn(c, a->prefix, round, me);
            last_beat = 0;
        }
        char report[1024] = "";
        char *json = NULL;
        int rc = ddprun_rdzv_wait_failure(c, a->prefix, round, slice_ms, &json);
        if (rc == 0) {
            snprintf(report, sizeof(report), "%s", json);
            rdzv_free(json);
        } else if (rc != -ETIMEDOUT) {
            char ep[300];
            fmt_endpoint(ep, sizeof(ep), a->store_host, a->store_port);
            snprintf(report, sizeof(report), "lost the rendezvous store at %s (%s)", ep,
                     rdzv_strerror(rc));
        } else {
            double now = mono_s();
            if (now - last_beat >= beat_s) {
                ddprun_heartbeat(c, a->prefix, round, me);
                last_beat = now;
            }
            int dead[16];
            int nd = ddprun_dead_nodes(c, &hb, dead, 16);
            int gone = a->store ? closed_node(a, c, round, nnodes, me) : -1;
            int64_t waiting = 0;
            char why[160];
            if (gone >= 0) {
                snprintf(why, sizeof(why),
                         "node %d closed its connection to the store (its ddprun exited or was "
                         "killed)",
                         gone);
                report_dead_node(a, c, round, why, report, sizeof(report));
            } else if (nd > 0) {
                snprintf(why, sizeof(why), "node %d stopped sending heartbeats (none for %g s)",
                         dead[0], dead_s);
                report_dead_node(a, c, round, why, report, sizeof(report));
            } else if (dynamic && ddprun_rdzv_num_waiting(c, a->prefix, round, &waiting) == 0 &&
                       waiting > 0) {
                snprintf(report, sizeof(report), "%s", MEMBERSHIP_CHANGE);
            }
        }
        if (report[0] && !reported) {
            reported = true;
            pthread_mutex_lock(&a->mu);
            snprintf(a->remote_failure, sizeof(a->remote_failure), "%s", report);
            a->remote_round = round;
            pthread_mutex_unlock(&a->mu);
            uv_async_send(&a->remote);
        }
        if (reported) {
            /* Reported (or the store is gone): nothing more to watch this round. */
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

/*
 * The node rendezvous of round j->round, then (rounds after the first) the clearing of the
 * workers' keys. Runs on the thread pool: reads only what the loop does not change while a job
 * runs (the configuration, the run prefix, the client) and leaves its results in `j`.
 */
static int rendezvous_job(agent *a, store_job *j)
{
    ddprun_config *cfg = a->cfg;
    char err[512] = "";
    int rc;
    if (cfg->nnodes_max == 1) {
        /* A single-node job: nobody else can join, so there is nothing to agree on. */
        j->asg = (ddprun_assignment){.round = j->round,
                                     .node_rank = 0,
                                     .nnodes = 1,
                                     .rank_offset = 0,
                                     .world_size = cfg->nproc_per_node};
        rc = 0;
    } else if (cfg->rdzv_backend == DDPRUN_BACKEND_STATIC) {
        rc =
            ddprun_rdzv_static(a->client, a->prefix, j->round, cfg->nnodes_max, cfg->node_rank,
                               cfg->nproc_per_node, cfg->join_timeout_s, &j->asg, err, sizeof(err));
    } else {
        char node_id[320];
        snprintf(node_id, sizeof(node_id), "%s:%d", a->hostname, (int)getpid());
        /* A round that closed before we joined: wait for the next one, which the running nodes
         * start when they see us waiting. */
        while ((rc = ddprun_rdzv_dynamic(a->client, a->prefix, j->round, cfg->nnodes_min,
                                         cfg->nnodes_max, node_id, cfg->nproc_per_node,
                                         cfg->join_timeout_s, cfg->last_call_timeout_s, &j->asg,
                                         err, sizeof(err))) == -EAGAIN)
            j->round++;
    }
    if (rc < 0) {
        snprintf(j->err, sizeof(j->err), "rendezvous failed: %s%s%s", rdzv_strerror(rc),
                 err[0] ? ": " : "", err);
        return rc;
    }
    /*
     * Between attempts the workers' keys go (ddprun_rdzv_clear_worker_keys()): the hosting agent
     * clears everything outside ddprun's own keys once every node has met for the new round,
     * and the other nodes wait for that before spawning.
     */
    if (j->round > 0) {
        rc = ddprun_rdzv_clear_worker_keys(a->store, a->client, a->prefix, j->round, j->asg.nnodes,
                                           cfg->join_timeout_s);
        if (rc < 0)
            snprintf(j->err, sizeof(j->err), "%s the store for round %d: %s",
                     a->store ? "clearing" : "waiting for the clearing of", j->round,
                     rdzv_strerror(rc));
    }
    return rc < 0 ? rc : 0;
}

/* Starts the rendezvous of round a->round; spawn_round() follows when it succeeds. */
static void start_round(agent *a)
{
    a->state = ST_WAITING;
    store_job *j = job_new(a, JOB_RENDEZVOUS);
    j->round = a->round;
    job_queue(a, j);
}

/* The rendezvous of this round succeeded: start the workers. */
static void spawn_round(agent *a)
{
    ddprun_config *cfg = a->cfg;
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
    a->con_waiting = false;
    a->state = ST_RUNNING;
    /* Where permitted, the workers go into a PID namespace; if not, the guards contain them. */
    if (!a->init_proc && !a->ns_unavailable && job_ns_start(a) < 0)
        a->ns_unavailable = true;
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
    if (cfg->hung_timeout_s > 0 && a->state == ST_RUNNING) {
        double tick_ms = cfg->hung_timeout_s * 250.0; /* a quarter of it, 50 ms to 1 s */
        uint64_t tick = tick_ms < 50 ? 50 : tick_ms > 1000 ? 1000 : (uint64_t)tick_ms;
        uv_timer_start(&a->hung_timer, hung_timer_cb, tick, tick);
    }
    maybe_round_over(a);
}

/* ---------------------------------------------------------------------------------------- */
/* Store calls off the loop                                                                 */
/* ---------------------------------------------------------------------------------------- */

static store_job *job_new(agent *a, job_kind kind)
{
    store_job *j = xcalloc(1, sizeof(*j));
    j->a = a;
    j->kind = kind;
    j->req.data = j;
    return j;
}

/* Runs on the thread pool. The agent's client is this job's alone until job_after(). */
static void job_work(uv_work_t *req)
{
    store_job *j = req->data;
    agent *a = j->a;
    switch (j->kind) {
    case JOB_CONNECT: {
        rdzv_client_options co;
        rdzv_client_options_init(&co);
        co.connect_timeout_ms = (int)(a->cfg->join_timeout_s * 1000);
        co.timeout_ms = (int)(a->cfg->timeout_s * 1000);
        co.token = a->token[0] ? a->token : NULL;
        j->rc = rdzv_client_connect(a->connect_host, a->store_port, &co, &a->client);
        if (j->rc < 0) {
            char ep[300];
            fmt_endpoint(ep, sizeof(ep), a->connect_host, a->store_port);
            snprintf(j->err, sizeof(j->err), "cannot reach the rendezvous store at %s: %s (%s)",
                     ep, rdzv_strerror(j->rc),
                     rdzv_client_last_error(NULL)); /* thread-local: read here */
        }
        break;
    }
    case JOB_RENDEZVOUS:
        j->rc = rendezvous_job(a, j);
        break;
    case JOB_PUBLISH:
        j->rc = ddprun_rdzv_publish_failure(a->client, a->prefix, j->round, j->json);
        if (j->rc < 0)
            snprintf(j->err, sizeof(j->err), "could not publish the failure through the store: %s",
                     rdzv_strerror(j->rc));
        break;
    case JOB_BARRIER:
        /* Torchrun's exit barrier, with an eye on the round's failure key: a failure published
         * by a node still running ends the wait. */
        j->rc = ddprun_rdzv_exit_barrier(a->client, a->prefix, j->round, j->asg.nnodes,
                                         a->cfg->close_timeout_s + 300.0, HEARTBEAT_MS, &j->json);
        if (j->rc < 0)
            snprintf(j->err, sizeof(j->err), "exit barrier: %s",
                     j->rc == -ETIMEDOUT ? "timed out" : rdzv_strerror(j->rc));
        break;
    }
}

static void job_next(agent *a);

/* Back on the loop: hands the job's outcome to the phase that waited for it. */
static void job_after(uv_work_t *req, int status)
{
    store_job *j = req->data;
    agent *a = j->a;
    (void)status; /* jobs are never cancelled */
    a->job = NULL;
    if (a->state != ST_DONE || j->kind == JOB_PUBLISH) {
        switch (j->kind) {
        case JOB_CONNECT:
            if (j->rc < 0) {
                say("%s", j->err);
                a->exit_code = 1;
                a->state = ST_DONE;
            } else {
                start_round(a);
            }
            break;
        case JOB_RENDEZVOUS:
            pthread_mutex_lock(&a->mu); /* the monitor reads the assignment */
            a->round = j->round;
            a->asg = j->asg;
            pthread_mutex_unlock(&a->mu);
            if (j->rc < 0) {
                say("%s", j->err);
                a->exit_code = 1;
                a->state = ST_DONE;
                if (a->nfailures)
                    print_final_summary(a);
            } else {
                spawn_round(a);
            }
            break;
        case JOB_PUBLISH:
            if (j->rc < 0)
                say("%s", j->err);
            break;
        case JOB_BARRIER:
            a->state = ST_DONE;
            a->exit_code = 0;
            if (j->rc == 1) {
                /* Our workers succeeded, but a node still running failed. */
                ddprun_failure f;
                if (ddprun_failure_from_json(j->json, &f) == 0)
                    add_failure(a, &f);
                print_final_summary(a);
                qsort(a->failures, a->nfailures, sizeof(ddprun_failure), ddprun_failure_cmp);
                a->exit_code = ddprun_failure_exit_status(a->nfailures ? &a->failures[0] : NULL);
            } else {
                if (j->rc < 0)
                    say("%s", j->err); /* the node's own success outlives the barrier */
                job_succeeded(a);
            }
            break;
        }
    }
    if (j->kind == JOB_PUBLISH)
        free(j->json);
    else
        rdzv_free(j->json);
    free(j);
    job_next(a);
}

/* Starts the next queued job unless one runs. Once the node is done, only publications run. */
static void job_next(agent *a)
{
    while (!a->job && a->jobs) {
        store_job *j = a->jobs;
        a->jobs = j->next;
        if (!a->jobs)
            a->jobs_tail = NULL;
        if (a->state == ST_DONE && j->kind != JOB_PUBLISH) {
            free(j);
            continue;
        }
        a->job = j;
        int rc = uv_queue_work(a->loop, &j->req, job_work, job_after);
        assert(rc == 0); /* fails only without a work callback */
        (void)rc;
    }
}

static void job_queue(agent *a, store_job *j)
{
    if (a->jobs_tail)
        a->jobs_tail->next = j;
    else
        a->jobs = j;
    a->jobs_tail = j;
    job_next(a);
}

/* True while a failure report is still on its way to the store. */
static bool publishing(const agent *a)
{
    if (a->job && a->job->kind == JOB_PUBLISH)
        return true;
    for (const store_job *j = a->jobs; j; j = j->next)
        if (j->kind == JOB_PUBLISH)
            return true;
    return false;
}

static const char *job_what(const store_job *j)
{
    switch (j ? j->kind : JOB_RENDEZVOUS) {
    case JOB_CONNECT:
        return "the rendezvous store";
    case JOB_BARRIER:
        return "the other nodes to finish";
    default:
        return "the rendezvous";
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Signals                                                                                  */
/* ---------------------------------------------------------------------------------------- */

/*
 * SIGINT, SIGTERM, SIGHUP and SIGQUIT end the node in every phase, with 128 + the signal. While
 * the agent waits on the store (no worker exists) it ends at once, abandoning the store call;
 * while workers run or are being stopped, they get the signal, and the node ends (without
 * restarting) once they are gone.
 */
static void on_signal(uv_signal_t *h, int sig)
{
    agent *a = h->data;
    if (a->state == ST_DONE) {
        /* Waiting at exit for a console or a failure report: give up (the status stands). */
        if (sig != SIGUSR1 && sig != SIGUSR2)
            a->exit_wait_over = true;
        return;
    }
    if (sig == SIGUSR1 || sig == SIGUSR2) {
        signal_workers(a, sig);
        return;
    }
    if (a->state == ST_WAITING) {
        say("received SIG%s while waiting for %s", sigabbrev_np(sig), job_what(a->job));
        a->stop_for_signal = true;
        a->signal_seen = sig;
        a->exit_code = 128 + sig;
        a->state = ST_DONE;
        return;
    }
    char list[1024];
    int nlisted = running_list(a, false, list, sizeof(list));
    if (sig == SIGINT && ++a->sigint_count >= 2) {
        if (nlisted > 0)
            say("second SIGINT: sending SIGKILL to %s", list);
        signal_workers(a, SIGKILL);
        return;
    }
    /* Forward to every worker's process group and stop the job without restarting. */
    if (nlisted > 0 && a->state == ST_RUNNING)
        say("received SIG%s: stopping the workers: sending SIG%s to %s; SIGKILL to any still "
            "running in %g s%s",
            sigabbrev_np(sig), sigabbrev_np(sig), list, a->cfg->shutdown_timeout_s,
            sig == SIGINT ? " (SIGINT again kills them)" : "");
    else
        say("received SIG%s: stopping the workers%s", sigabbrev_np(sig),
            sig == SIGINT ? " (SIGINT again kills them)" : "");
    signal_workers(a, sig);
    signal_workers(a, SIGCONT); /* a stopped worker could not act on it */
    if (!a->stop_for_signal) {
        /* Also while a failed round is torn down: no restart follows a signal. */
        a->stop_for_signal = true;
        a->signal_seen = sig;
    }
    if (a->state == ST_RUNNING) {
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

/* Gives up waiting at exit once every console with output left took nothing for stall_ms()
 * (counted from the start of the round's wait, console_wait_begin()), and on a failure report
 * after EXIT_WAIT_MS. */
static void exit_wait_check(agent *a)
{
    bool output_left = false, moving = false;
    for (int fd = 1; fd <= 2; fd++) {
        bool stalled = console_stalled(a, fd);
        if (ddprun_console_queued(a->con[fd]) > 0) {
            output_left = true;
            moving = moving || !stalled;
        }
    }
    if (output_left ? !moving : a->exit_ticks * TICK_MS >= EXIT_WAIT_MS)
        a->exit_wait_over = true;
}

static void exit_timer_cb(uv_timer_t *t)
{
    agent *a = t->data;
    a->exit_ticks++;
    exit_wait_check(a);
}

/*
 * When every address `host` resolves to is a loopback one (127.0.0.0/8, ::1), writes the one the
 * store should bind -- the first IPv4 address, else ::1 -- into buf and returns true: then only
 * this machine can reach the store, as the user asked by naming a loopback host ("localhost",
 * or a host name that /etc/hosts maps to 127.0.1.1). False when the name does not resolve or any
 * address is not loopback.
 */
static bool loopback_only(const char *host, char *buf, size_t n)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
    if (getaddrinfo(host, NULL, &hints, &res) != 0)
        return false;
    bool all = res != NULL, v4 = false;
    char first6[INET6_ADDRSTRLEN] = "";
    for (struct addrinfo *r = res; r && all; r = r->ai_next) {
        if (r->ai_family == AF_INET) {
            const struct in_addr *in = &((struct sockaddr_in *)r->ai_addr)->sin_addr;
            all = (ntohl(in->s_addr) >> 24) == 127;
            if (all && !v4) {
                v4 = true;
                inet_ntop(AF_INET, in, buf, (socklen_t)n);
            }
        } else if (r->ai_family == AF_INET6) {
            const struct in6_addr *in6 = &((struct sockaddr_in6 *)r->ai_addr)->sin6_addr;
            all = IN6_IS_ADDR_LOOPBACK(in6);
            if (all && !first6[0])
                inet_ntop(AF_INET6, in6, first6, sizeof(first6));
        } else {
            all = false;
        }
    }
    freeaddrinfo(res);
    if (all && !v4)
        snprintf(buf, n, "%s", first6);
    return all;
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

    /* The job's secret: given, or made up when only this agent's workers use the store. */
    ddprun_token_source source;
    bool loose = false;
    char err[512] = "";
    if (ddprun_job_token(cfg->token_file, hosting && cfg->nnodes_max == 1, a->token,
                         sizeof(a->token), &source, &loose, err, sizeof(err)) < 0) {
        say("%s", err);
        return -EINVAL;
    }
    if (loose)
        say("warning: %s is readable by other users: keep the job's secret mode 0600",
            ddprun_token_source_name(source));

    if (hosting) {
        rdzv_server_options o;
        rdzv_server_options_init(&o);
        o.token = a->token[0] ? a->token : NULL;
        o.allow = (const char *const *)cfg->allow;
        o.nallow = (size_t)cfg->nallow;
        /* Bind the wildcard of IPv6 and IPv4 (as PyTorch's store binds every interface; the
         * library falls back to IPv4's on a host without IPv6), except for a loopback endpoint. */
        if (cfg->standalone)
            snprintf(a->bind_host, sizeof(a->bind_host), "127.0.0.1");
        else if (!loopback_only(host, a->bind_host, sizeof(a->bind_host)))
            snprintf(a->bind_host, sizeof(a->bind_host), "::");
        o.host = a->bind_host;
        o.port = port;
        o.log = store_log;
        o.on_close = store_conn_closed; /* a node whose monitor connection closes is gone */
        o.on_close_arg = a;
        /* The connection cap comes from the descriptor limit, less what spawning and watching
         * the workers needs (two output pipes each, four descriptors while spawning, log and
         * error files, the exec shim's pipe), so that a connection flood cannot starve a
         * restart of descriptors. */
        o.max_connections = 0;
        o.fd_reserve = 64 + 8 * (size_t)cfg->nproc_per_node;
        int rc = rdzv_server_start(&o, &a->store);
        if (rc < 0 && (is_static || cfg->is_host_given)) {
            char ep[300];
            fmt_endpoint(ep, sizeof(ep), o.host, port);
            say("cannot serve the store on %s: %s", ep, rdzv_strerror(rc));
            return rc;
        }
        if (rc == 0)
            port = rdzv_server_port(a->store);
        else if (source == DDPRUN_TOKEN_GENERATED)
            a->token[0] = '\0'; /* someone else's store: our random token cannot be its */
    }
    if (!a->token[0] && !cfg->standalone)
        say("warning: the job has no secret (--token-file, DDPRUN_TOKEN_FILE or DDPRUN_TOKEN): "
            "anyone who can reach the store at %s:%d can read and forge the job's control "
            "keys; see SECURITY in ddprun(1)",
            host, port);
    snprintf(a->store_host, sizeof(a->store_host), "%s", cfg->standalone ? "127.0.0.1" : host);
    a->store_port = port;
    /* The connection itself is a job (JOB_CONNECT): reaching another node's store may take the
     * whole join timeout. */
    const char *own = !a->store                         ? host
                      : strcmp(a->bind_host, "::") ? a->bind_host /* a loopback address */
                                                        : "127.0.0.1";
    snprintf(a->connect_host, sizeof(a->connect_host), "%s", own);
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

/* Removes a temporary directory that held only error files. */
static void cleanup_tmpdir(const char *dir)
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
static int setup_log_dir(agent *a)
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

int main(int argc, char **argv)
{
    if (argc > 0 && !strcmp(argv[0], GUARD_NAME))
        return shim_main(argc, argv);
    if (argc > 0 && !strcmp(argv[0], INIT_NAME))
        return init_main();

    ddprun_config cfg;
    char err[1024] = "";
    int rc = ddprun_config_parse(argc, argv, &cfg, err, sizeof(err));
    if (rc == 1)
        return 0;
    if (rc < 0) {
        fprintf(stderr, "%s\n", err[0] ? err : PROG ": bad arguments");
        return 2;
    }
    for (const char *w = cfg.warnings, *nl; w && (nl = strchr(w, '\n')); w = nl + 1)
        say("%.*s", (int)(nl - w), w);
    signal(SIGPIPE, SIG_IGN);
    /* A log file past RLIMIT_FSIZE fails with EFBIG, which ddprun reports, instead of killing
     * it. (Workers start with default dispositions: libuv resets them in the child.) */
    signal(SIGXFSZ, SIG_IGN);
    /* What a worker's guard could not kill (the guard itself was killed) is reparented here. */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    cloexec_inherited_fds();

    agent a = {0};
    a.cfg = &cfg;
    a.init_alive_fd = a.mntns_fd = a.own_pidns_fd = -1;
    a.ns_unavailable = !cfg.pid_namespace;
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

    /* From here on the agent's output never blocks its loop (console.h). */
    loop_thread = pthread_self();
    for (int fd = 1; fd <= 2; fd++)
        if (ddprun_console_open(a.loop, fd, CONSOLE_LIMIT, &a.con[fd]) < 0)
            die_oom();
    ddprun_console_on_drain(a.con[1], stdout_drained, &a);
    ddprun_console_on_drain(a.con[2], stderr_drained, &a);
    fflush(stderr);
    err_console = a.con[2];
    uv_timer_init(a.loop, &a.kill_timer);
    a.kill_timer.data = &a;
    uv_timer_init(a.loop, &a.hung_timer);
    a.hung_timer.data = &a;
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

    if (setup_log_dir(&a) < 0 || setup_store(&a) < 0) {
        a.exit_code = 1;
        a.state = ST_DONE;
    } else {
        a.state = ST_WAITING;
        job_queue(&a, job_new(&a, JOB_CONNECT));
    }
    while (a.state != ST_DONE && uv_run(a.loop, UV_RUN_ONCE))
        ;
    if (a.stop_for_signal)
        say("stopped by SIG%s", sigabbrev_np(a.signal_seen));
    /* A failure report on its way to the store gets EXIT_WAIT_MS to arrive; queued output as long
     * as a console keeps taking some every stall_ms(). A rendezvous or barrier a signal
     * interrupted is abandoned (its thread ends with the process). */
    uv_update_time(a.loop);
    console_wait_begin(&a);
    exit_wait_check(&a);
    uv_timer_start(&a.kill_timer, exit_timer_cb, TICK_MS, TICK_MS);
    while (
        !a.exit_wait_over &&
        (publishing(&a) || ddprun_console_queued(a.con[1]) + ddprun_console_queued(a.con[2]) > 0) &&
        uv_run(a.loop, UV_RUN_ONCE))
        ;
    size_t left = ddprun_console_queued(a.con[1]) + ddprun_console_queued(a.con[2]);
    if (left > 0)
        say("%zu bytes of output dropped: the console took none for %d ms", left, stall_ms(&a));
    ddprun_console_close(a.con[1]);
    ddprun_console_close(a.con[2]);

    /* The monitor may sit in a store wait for up to HEARTBEAT_MS: tell it to stop but do not
     * wait for it; exit() ends it. Nothing it uses is freed before that. */
    if (a.monitor_started)
        monitor_set_round(&a, -1);
    cleanup_tmpdir(a.tmpbase);
    fflush(NULL);
    _exit(a.exit_code);
}
