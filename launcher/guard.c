/*
 * The worker guard and the init of the workers' PID namespace: the two helper programs of
 * ddprun, one small executable of their own (ddp-guard, guard_main.c) started as "ddp-guard"
 * (shim_main()) or "ddp-init" (init_main()). It links nothing but libc, so that starting a
 * worker does not load what ddprun links (libuv, jansson, Nettle, libcurl). The guard stays as its
 * worker's parent, forwards ddprun's signals to the worker's process group, and kills every
 * descendant left once the worker has exited or ddprun has died; the init dies with ddprun, so
 * that the kernel kills every process of the namespace. Also the process-tree helpers the agent
 * shares with them (cloexec_inherited_fds(), proc_stat(), kill_descendants()).
 *
 * Not done here: spawning the guards and starting the init (spawn.c). Neither program touches
 * the agent's state: they run after an exec, with what their argv, fds and memfd carry.
 */
#include "guard.h"
#include "walltime.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

#define PROG "ddprun" /* the name the guard's few messages go out under */

/*
 * Marks every descriptor above standard error close-on-exec, so that what the user's shell passed
 * to ddprun (`ddprun ... 7>file`) never reaches a worker, as with torchrun; ddprun itself may
 * still use them. close_range(2) where the kernel has it (5.11), else one fcntl per entry of
 * /proc/self/fd. The agent calls it at startup; the exec shim again before the worker's exec,
 * for any descriptor a library opened without O_CLOEXEC since.
 */
void cloexec_inherited_fds(void)
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
int proc_stat(pid_t pid, char *state, long *ppid)
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
void kill_descendants(bool any_child, void (*on_reaped)(pid_t, int, void *), void *arg)
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
 * Sets the signals below SIGRTMIN that glibc keeps for itself (32 and 33 on Linux) to their
 * default action. ddprun starts the guard with posix_spawn(), whose child glibc leaves with
 * these ignored (its sigaction() refuses to touch them, so only the system call can), and an
 * ignored signal stays ignored across exec: the worker would start with them ignored, unlike
 * every other signal (POSIX_SPAWN_SETSIGDEF). The kernel's struct sigaction, without a handler
 * to return to, is all zeros but the handler on every architecture.
 */
static void default_reserved_signals(void)
{
    struct {
        void (*handler)(int);
        unsigned long flags;
        void (*restorer)(void);
        uint64_t mask;
    } dfl = {SIG_DFL, 0, NULL, 0};
    for (int sig = 32; sig < SIGRTMIN; sig++)
        syscall(SYS_rt_sigaction, sig, &dfl, NULL, sizeof(dfl.mask));
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
 *     SIGCONT, and SIGWINCH when the worker's pseudo-terminal changed size) to
 *     the worker's process group, and on GUARD_KILL_SIG SIGKILLs it;
 *   - once the worker has exited (or on GUARD_KILL_SIG), SIGKILLs every descendant left, as
 *     ddprun always did with the leftovers of a worker's process group, waits until none is
 *     left, writes the worker's wait status into the memfd (GUARD_STATUS_OFFSET: the core
 *     dump flag), and exits as the worker did: its exit code, or its signal, raised again.
 * Signals are handled synchronously (sigwaitinfo), so nothing runs in a handler.
 */
int shim_main(int argc, char **argv)
{
    if (argc < 3)
        return 127;
    sigset_t set, old;
    sigemptyset(&set);
    static const int handled[] = {SIGCHLD, SIGINT,  SIGTERM, SIGHUP,  SIGQUIT,
                                  SIGUSR1, SIGUSR2, SIGCONT, SIGWINCH};
    for (size_t i = 0; i < sizeof(handled) / sizeof(handled[0]); i++)
        sigaddset(&set, handled[i]);
    sigaddset(&set, GUARD_KILL_SIG);
    sigprocmask(SIG_BLOCK, &set, &old);
    prctl(PR_SET_NAME, GUARD_NAME);
    default_reserved_signals();

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
    /* The worker's wait status for ddprun (GUARD_STATUS_OFFSET): whether it dumped a core. */
    char status[16];
    int sl = snprintf(status, sizeof status, "%d", g.status);
    if (pwrite(3, status, (size_t)sl, GUARD_STATUS_OFFSET) != sl) {
        /* Nothing to do: ddprun then reports no core. */
    }
    close(3);
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
int init_main(void)
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
