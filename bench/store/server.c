/*
 * server.c: the servers under test as child processes: spawning one with stdin and stdout on
 * pipes and stderr in a log file, waiting for the port (and torch's version line) it prints,
 * draining its stdout, noticing that it died, and stopping it. A server's log is removed unless
 * something went wrong.
 *
 * Not here: the command lines (section.c's server_setup()) and any measurement.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store-bench.h"

/* ---------------------------------------------------------------------------------------- */
/* Server processes                                                                         */
/* ---------------------------------------------------------------------------------------- */

/* Copies a server's stdout into its log so a chatty server never blocks on a full pipe. */
static void *drain_main(void *arg)
{
    struct server *s = arg;
    char buf[4096];
    ssize_t n;

    while ((n = read(s->out_fd, buf, sizeof(buf))) != 0) {
        if (n < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (write(s->log_fd, buf, (size_t)n) < 0)
            break;
    }
    return NULL;
}

static unsigned g_spawned;
int g_server_cpu = -1; /* --pin: the CPU the servers run on */

/* Restricts the calling process to one CPU; a no-op for cpu < 0. */
void pin_to(int cpu)
{
    cpu_set_t set;
    if (cpu < 0)
        return;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof(set), &set);
}

/*
 * Starts s->argv with stdin and stdout on pipes and stderr in a log file under $TMPDIR. The
 * child dies with the bench (PR_SET_PDEATHSIG). Does not wait for it to listen.
 */
int server_spawn(struct server *s)
{
    int in[2] = {-1, -1}, out[2] = {-1, -1};
    const char *tmp = getenv("TMPDIR");
    int rc = 0;

    s->pid = -1;
    s->in_fd = s->out_fd = s->log_fd = -1;
    s->drain_started = false;
    s->port = 0;
    s->version[0] = s->exit_note[0] = '\0';
    snprintf(s->log_path, sizeof(s->log_path), "%s/store-bench.%d.%u.%s.log",
             tmp && *tmp ? tmp : "/tmp", (int)getpid(), ++g_spawned,
             s->kind == SRV_OURS ? "ours" : s->kind == SRV_PROXY ? "proxy" : "torch");
    s->log_fd = open(s->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (s->log_fd < 0)
        return fail(-errno, "%s: %s", s->log_path, strerror(errno));
    if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0) {
        rc = fail(-errno, "pipe: %s", strerror(errno));
        goto out;
    }
    s->pid = fork();
    if (s->pid < 0) {
        rc = fail(-errno, "fork: %s", strerror(errno));
        goto out;
    }
    if (s->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        pin_to(g_server_cpu);
        dup2(in[0], 0);
        dup2(out[1], 1);
        dup2(s->log_fd, 2);
        signal(SIGPIPE, SIG_DFL);
        execvp(s->argv[0], s->argv);
        dprintf(2, "store-bench: cannot execute %s: %s\n", s->argv[0], strerror(errno));
        _exit(127);
    }
    s->in_fd = in[1];
    s->out_fd = out[0];
    in[1] = out[0] = -1;
out:
    for (int i = 0; i < 2; i++) {
        if (in[i] >= 0)
            close(in[i]);
        if (out[i] >= 0)
            close(out[i]);
    }
    return rc;
}

/* The last few lines of a server's log, for an error message. */
void log_tail(const struct server *s, char *buf, size_t size)
{
    char data[4096];
    ssize_t n = 0;
    int fd = open(s->log_path, O_RDONLY | O_CLOEXEC);
    off_t end;

    buf[0] = '\0';
    if (fd < 0)
        return;
    end = lseek(fd, 0, SEEK_END);
    if (end > (off_t)sizeof(data) - 1)
        lseek(fd, end - (off_t)sizeof(data) + 1, SEEK_SET);
    else
        lseek(fd, 0, SEEK_SET);
    n = read(fd, data, sizeof(data) - 1);
    close(fd);
    if (n <= 0)
        return;
    data[n] = '\0';
    while (n > 0 && (data[n - 1] == '\n' || data[n - 1] == ' '))
        data[--n] = '\0';
    {
        /* Keep the last 6 lines. */
        char *p = data + n;
        int lines = 0;
        while (p > data && lines < 6)
            if (*--p == '\n')
                lines++;
        snprintf(buf, size, "%.*s", (int)size - 1, p == data ? p : p + 1);
    }
}

static void describe_status(int st, char *buf, size_t size)
{
    if (WIFEXITED(st))
        snprintf(buf, size, "exited with status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(buf, size, "killed by signal %d (%s)%s", WTERMSIG(st), strsignal(WTERMSIG(st)),
                 WCOREDUMP(st) ? ", core dumped" : "");
    else
        snprintf(buf, size, "status 0x%x", st);
}

/* Last integer in a line: "12345", "port 12345", "127.0.0.1:12345". */
static int parse_port(const char *line)
{
    const char *end = line + strlen(line), *p;
    long v;
    while (end > line && (end[-1] < '0' || end[-1] > '9'))
        end--;
    p = end;
    while (p > line && p[-1] >= '0' && p[-1] <= '9')
        p--;
    if (p == end || end - p > 5)
        return -1;
    v = strtol(p, NULL, 10);
    return v > 0 && v < 65536 ? (int)v : -1;
}

/*
 * Waits until the server printed its port (and, for torch, its version line), then starts the
 * stdout drain. Returns 0; -ENOENT when torch is missing or the program cannot run (g_err
 * says which; the caller reports "skipped"); another negative errno on failure.
 */
int server_ready(struct server *s)
{
    char line[2][256];
    size_t len = 0;
    int want = s->kind == SRV_TORCH ? 2 : 1, got = 0;
    uint64_t t0 = now_ns();

    while (got < want) {
        struct pollfd pfd = {s->out_fd, POLLIN, 0};
        int left = START_TIMEOUT_MS - (int)((now_ns() - t0) / 1000000u);
        char ch;
        ssize_t n;

        if (left <= 0 || poll(&pfd, 1, left) == 0) {
            s->keep_log = true;
            return fail(-ETIMEDOUT, "%s did not print its port within %d ms (log: %s)", s->argv[0],
                        START_TIMEOUT_MS, s->log_path);
        }
        n = read(s->out_fd, &ch, 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            char tail[1024], how[128];
            int st = 0;
            waitpid(s->pid, &st, 0);
            s->pid = -1;
            log_tail(s, tail, sizeof(tail));
            describe_status(st, how, sizeof(how));
            if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
                return fail(-ENOENT, "%s", tail[0] ? tail : how);
            if (WIFEXITED(st) && WEXITSTATUS(st) == 77)
                return fail(-ENOENT, "%s: %s", s->argv[0], tail[0] ? tail : how);
            s->keep_log = true;
            return fail(-EPROTO, "%s %s before printing its port; log %s: %s", s->argv[0], how,
                        s->log_path, tail);
        }
        if (ch == '\n' || len == sizeof(line[0]) - 1) {
            line[got][len] = '\0';
            got++;
            len = 0;
        } else {
            line[got][len++] = ch;
        }
    }
    s->port = parse_port(line[0]);
    if (s->port < 0) {
        s->keep_log = true;
        return fail(-EPROTO, "%s printed \"%s\" as its first line, not a port", s->argv[0],
                    line[0]);
    }
    if (want == 2)
        snprintf(s->version, sizeof(s->version), "%.*s", (int)sizeof(s->version) - 1, line[1]);
    if (pthread_create(&s->drain, NULL, drain_main, s) == 0)
        s->drain_started = true;
    return 0;
}

/*
 * Is the server still running? If it has exited, records how in exit_note and keeps its log.
 */
bool server_alive(struct server *s)
{
    int st;
    if (s->pid <= 0)
        return false;
    if (waitpid(s->pid, &st, WNOHANG) == 0)
        return true;
    describe_status(st, s->exit_note, sizeof(s->exit_note));
    s->pid = -1;
    s->keep_log = true;
    return false;
}

/*
 * Stops a server: closes its stdin (torch's helper exits), sends SIGTERM, and SIGKILL after
 * 5 s. An exit other than by SIGTERM or with status 0 is recorded in exit_note. The log is
 * removed unless something went wrong.
 */
void server_stop(struct server *s)
{
    if (s->in_fd >= 0)
        close(s->in_fd);
    s->in_fd = -1;
    if (s->pid > 0) {
        int st = 0;
        pid_t r = 0;
        kill(s->pid, SIGTERM);
        for (int i = 0; i < 500 && (r = waitpid(s->pid, &st, WNOHANG)) == 0; i++)
            sleep_ms(10);
        if (r == 0) {
            kill(s->pid, SIGKILL);
            waitpid(s->pid, &st, 0);
            snprintf(s->exit_note, sizeof(s->exit_note), "ignored SIGTERM for 5 s");
            s->keep_log = true;
        } else if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) &&
                   !(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM)) {
            describe_status(st, s->exit_note, sizeof(s->exit_note));
            s->keep_log = true;
        }
        s->pid = -1;
    }
    if (s->drain_started)
        pthread_join(s->drain, NULL);
    s->drain_started = false;
    if (s->out_fd >= 0)
        close(s->out_fd);
    s->out_fd = -1;
    if (s->log_fd >= 0) {
        close(s->log_fd);
        s->log_fd = -1;
        if (!s->keep_log)
            unlink(s->log_path);
    }
}
