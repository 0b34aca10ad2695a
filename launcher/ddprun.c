/*
 * ddprun: the torchrun-compatible launcher. One agent per node: it hosts the rendezvous store
 * (node 0, or the c10d endpoint's host) in-process on a thread of its own, runs the node-level
 * rendezvous through its backend (backend.h), spawns the local workers with torchrun's
 * environment, relays their output line by line, and tears everything down when a worker fails
 * anywhere in the job, restarting the whole job while restarts remain.
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
 * Workers are started through a small guard (the ddp-guard program, guard_main.c, which links
 * only libc; shim_main()) that stays as the worker's parent: a child subreaper that forwards
 * ddprun's signals and, once the worker has exited or ddprun has died (its parent-death signal),
 * kills every descendant left, double-forked and setsid()'d daemons included. Where ddprun may
 * create namespaces (CAP_SYS_ADMIN), the guards and workers of a node live in a PID namespace of
 * their own whose init ("ddp-init", init_main()) dies with ddprun, so that the kernel kills every
 * process in it however ddprun and the guards die, together included (job_ns_start()).
 * Elsewhere ddprun is a child subreaper as well, and kills whatever reaches it from a guard that
 * was itself killed; nothing cleans up when ddprun and a guard die at once.
 *
 * Worker output goes to the console through console.c's bounded, non-blocking queues: when a
 * console stops taking output, reading stops for the workers that write to it (back-pressure)
 * and nothing else waits.
 *
 * This file is the agent's rounds, failures, stopping, signals, store calls and main(). Not done
 * here: option parsing (options.c); the rendezvous backends (backend.h: backend_static.c,
 * backend_c10d.c, over the node rendezvous protocols of noderdzv.c); the workers' environment,
 * PID namespace and spawning (spawn.c); the output relay (relay.c); the monitor thread
 * (monitor.c); the worker guard and the namespace's init (guard.c); the console's descriptors
 * and queues (console.c).
 */
#include "agent.h"
#include "fmt.h"
#include "guard.h"
#include "jobtoken.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <jansson.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void die_oom(void)
{
    fputs(PROG ": out of memory\n", stderr);
    exit(1);
}

void *xcalloc(size_t n, size_t sz)
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

void say(const char *fmt, ...)
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
/* Failures and the summary                                                                 */
/* ---------------------------------------------------------------------------------------- */

/* Reads the message a worker left in its TORCHELASTIC_ERROR_FILE (PyTorch's @record format).
 * Returns whether the file was there and JSON. */
static bool read_error_file(const char *path, char *msg, size_t n)
{
    msg[0] = '\0';
    json_error_t jerr;
    json_t *root = path[0] ? json_load_file(path, 0, &jerr) : NULL;
    if (!root)
        return false;
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
    return true;
}

static void add_failure(agent *a, const ddprun_failure *f)
{
    for (size_t i = 0; i < a->nfailures; i++)
        if (!strcmp(a->failures[i].node, f->node) && a->failures[i].rank == f->rank &&
            a->failures[i].pid == f->pid && a->failures[i].node_rank == f->node_rank)
            return;
    a->failures = realloc(a->failures, (a->nfailures + 1) * sizeof(*f));
    if (!a->failures)
        die_oom();
    a->failures[a->nfailures++] = *f;
}

void describe_exit(int code, char *buf, size_t n)
{
    ddprun_describe_exit(code, false, buf, n);
}

/*
 * The lines under a failure of its own in the summary: where to look. The error file and the
 * log files when there are any, else the last lines of the worker's standard error.
 */
static void print_details(const ddprun_failure *f)
{
    if (f->error_file[0])
        emit("%-8s error_file: %s", "", f->error_file);
    if (f->logs[0])
        emit("%-8s logs: %s", "", f->logs);
    if (!f->stderr_tail[0])
        return;
    int lines = 1;
    for (const char *p = f->stderr_tail; *p; p++)
        lines += *p == '\n';
    emit("%-8s stderr (last %d line%s):", "", lines, lines == 1 ? "" : "s");
    for (const char *p = f->stderr_tail; *p;) {
        int l = (int)strcspn(p, "\n");
        emit("%-8s | %.*s", "", l, p);
        p += l + (p[l] == '\n');
    }
}

/*
 * Prints the failure table under the line `title` (what happens next): every failure of the
 * round, local or reported by another node, the root cause (the earliest failure of its own)
 * first and marked "root", the failures that came with the teardown (teardown) last. A worker's
 * row names its node by rank and host; a node's failure (no worker concerned: a node lost, hung
 * workers, the store gone) is one sentence naming the node. Under each failure of its own, where
 * to look (print_details()).
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
    emit("%-8s %-23s %4s %-16s %5s %5s %-18s %8s  %s", "", "time", "node", "host", "rank", "local",
         "exit", "pid", "message");
    bool teardown = false;
    for (size_t i = 0; i < a->nfailures; i++) {
        const ddprun_failure *f = &a->failures[i];
        char when[32], how[64], node[16] = "-", who[300];
        format_time(f->time, when, sizeof(when));
        teardown |= f->teardown;
        const char *mark = i == 0 ? "root" : f->teardown ? "teardown" : "";
        if (f->rank < 0) {
            ddprun_node_name(f->node_rank, f->node, who, sizeof(who));
            if (f->node_rank < 0 && !strcmp(who, "a node"))
                emit("%-8s %-23s %s", mark, when, f->message);
            else
                emit("%-8s %-23s %s: %s", mark, when, who, f->message);
        } else {
            ddprun_describe_exit(f->exit_code, f->core_dumped, how, sizeof(how));
            if (f->node_rank >= 0)
                snprintf(node, sizeof(node), "%d", f->node_rank);
            emit("%-8s %-23s %4s %-16s %5d %5d %-18s %8d  %s", mark, when, node, f->node, f->rank,
                 f->local_rank, how, f->pid, f->message);
        }
        if (!f->teardown)
            print_details(f);
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
    else if (rdzv_is_lost(a))
        snprintf(title, sizeof(title), "job failed: no restart without the rendezvous");
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
 * that spawn.c reaps in a moment) is not running any more: it is left out, and marked as having
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
    f.node_rank = a->asg.node_rank;
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
    if (!a->stop_for_signal && !rdzv_is_lost(a) && a->restart_count < a->cfg->max_restarts) {
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
void maybe_round_over(agent *a)
{
    if (a->round_done || a->nrunning > 0)
        return;
    if (a->init_pid)
        kill(a->init_pid, SIGUSR1); /* the PID namespace's init adopted the strays */
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

/* Whether worker w dumped a core: the wait status its guard left in the memfd they share. */
static bool worker_core_dumped(worker *w)
{
    char buf[16] = "";
    ssize_t k = pread(w->envfd, buf, sizeof(buf) - 1, GUARD_STATUS_OFFSET);
    char *end = buf;
    long st = k > 0 ? strtol(buf, &end, 10) : 0;
    return k > 0 && end != buf && WIFSIGNALED((int)st) && WCOREDUMP((int)st);
}

/* Writes where worker w's output went besides the console, "" if nowhere: its log files under
 * --redirects/--tee (spawn.c's setup_stream() names them). */
static void worker_logs(const agent *a, const worker *w, char *buf, size_t n)
{
    int lr = w->local_rank, which = a->cfg->redirects[lr] | a->cfg->tee[lr];
    buf[0] = '\0';
    if (!a->logdir[0] || !which)
        return;
    bool out = which & DDPRUN_STD_OUT, err = which & DDPRUN_STD_ERR;
    if (snprintf(buf, n, "%s/attempt_%d/%d/%s", a->logdir, a->restart_count, lr,
                 out && err ? "{stdout,stderr}.log"
                 : out      ? "stdout.log"
                            : "stderr.log") >= (int)n)
        buf[0] = '\0'; /* a cut path would mislead */
}

/* Worker w's guard exited (spawn.c reaped it) with `status`, or killed by `term_signal`. */
void on_worker_exit(worker *w, int64_t status, int term_signal)
{
    agent *a = w->a;
    w->running = false;
    a->nrunning--;
    bool core = false;
    if (w->envfd >= 0) {
        worker_program_pid(w); /* the summary names the program's process */
        core = worker_core_dumped(w);
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
        char message[512], how[64];
        int code = term_signal ? -term_signal : (int)status;
        stream_drain(&w->err); /* its last lines may not have been read yet */
        bool has_error_file = read_error_file(w->error_file, message, sizeof(message));
        ddprun_failure f;
        ddprun_failure_init(&f, a->hostname, w->rank, w->local_rank, code,
                            w->worker_pid ? w->worker_pid : w->pid, message);
        f.teardown = !own;
        f.node_rank = a->asg.node_rank;
        f.core_dumped = core && code < 0;
        if (has_error_file) {
            if (a->keep_logs) /* else the file goes at exit: not worth naming */
                snprintf(f.error_file, sizeof(f.error_file), "%s", w->error_file);
        } else if (ddprun_tail_text(&w->err_tail, DDPRUN_TAIL_LINES, f.stderr_tail,
                                    sizeof(f.stderr_tail)) > 0) {
            /* No error file: the last line of stderr says most. */
            const char *last = strrchr(f.stderr_tail, '\n');
            snprintf(f.message, sizeof(f.message), "%.*s", (int)sizeof(f.message) - 1,
                     last ? last + 1 : f.stderr_tail);
        }
        worker_logs(a, w, f.logs, sizeof(f.logs));
        add_failure(a, &f);
        if (a->state == ST_RUNNING) {
            ddprun_describe_exit(code, f.core_dumped, how, sizeof(how));
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
    char msg[sizeof(a->remote_failure)];
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
        char who[300], how[64];
        add_failure(a, &f);
        ddprun_node_name(f.node_rank, f.node, who, sizeof(who));
        ddprun_describe_exit(f.exit_code, f.core_dumped, how, sizeof(how));
        if (f.rank >= 0)
            say("rank %d on %s failed (%s): stopping the local workers", f.rank, who, how);
        else if (strcmp(who, "a node"))
            say("%s: %s: stopping the local workers", who, f.message);
        else
            say("%s: stopping the local workers", f.message);
    } else {
        if (rdzv_is_lost(a)) { /* a sentence of its own, ending in a parenthesis */
            say("%s", msg);
            say("stopping the local workers");
        } else {
            say("%s: stopping the local workers", msg);
        }
        /* Not a record (the store is gone): a failure of no one node, without a worker. */
        ddprun_failure g;
        ddprun_failure_init(&g, NULL, -1, -1, 1, 0, msg);
        add_failure(a, &g);
    }
    stop_workers(a);
    maybe_round_over(a);
}

/* ---------------------------------------------------------------------------------------- */
/* Rendezvous and rounds                                                                    */
/* ---------------------------------------------------------------------------------------- */

static int serve_store(agent *a, const char *bind_host, int port, rdzv_server **out);
static bool loopback_only(const char *host, char *buf, size_t n);

/*
 * A backend whose store moves with the rounds (publish_store): the round's rank 0 serves a fresh
 * store and publishes where (--local-addr, else the address the rendezvous reaches it at, else
 * the host name); the others wait for that. Leaves the store in j->srv (rank 0) and its endpoint
 * in j->store_host and j->store_port, for job_after() to take over.
 */
static int round_store_job(agent *a, store_job *j)
{
    ddprun_config *cfg = a->cfg;
    int rc;
    if (j->asg.node_rank == 0) {
        char host[256] = "", bind[64];
        if (cfg->local_addr)
            snprintf(host, sizeof(host), "%s", cfg->local_addr);
        else if (!a->rdzv->local_address || a->rdzv->local_address(a->client, host, sizeof(host)))
            snprintf(host, sizeof(host), "%s", a->hostname);
        if (!loopback_only(host, bind, sizeof(bind)))
            snprintf(bind, sizeof(bind), "::");
        rc = serve_store(a, bind, 0, &j->srv);
        if (rc < 0) {
            snprintf(j->err, sizeof(j->err), "cannot serve the workers' store for round %d: %s",
                     j->round, rdzv_strerror(rc));
            return rc;
        }
        snprintf(j->store_host, sizeof(j->store_host), "%s", host);
        j->store_port = rdzv_server_port(j->srv);
        rc = cfg->nnodes_max == 1
                 ? 0
                 : a->rdzv->publish_store(a->client, a->prefix, j->round, host, j->store_port);
        if (rc < 0)
            snprintf(j->err, sizeof(j->err), "publishing the workers' store of round %d: %s",
                     j->round, rdzv_strerror(rc));
    } else {
        rc = a->rdzv->find_store(a->client, a->prefix, j->round, cfg->join_timeout_s, j->store_host,
                                 sizeof(j->store_host), &j->store_port);
        if (rc < 0)
            snprintf(j->err, sizeof(j->err),
                     "waiting for node 0 to publish the workers' store of round %d: %s", j->round,
                     rdzv_strerror(rc));
    }
    return rc;
}

/*
 * The node rendezvous of round j->round, then (rounds after the first) the clearing of the
 * workers' keys, or where the store moves with the rounds, the round's store. Runs on the thread
 * pool: reads only what the loop does not change while a job runs (the configuration, the run
 * prefix, the client) and leaves its results in `j`.
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
    } else {
        char node_id[320];
        snprintf(node_id, sizeof(node_id), "%s:%d", a->hostname, (int)getpid());
        /* Serving the store: say so before joining, so that the clearing is left to us. */
        rc = a->store && a->rdzv->mark_host ? a->rdzv->mark_host(a->client, a->prefix) : 0;
        if (rc == 0)
            rc = a->rdzv->join(a->client, a->prefix, cfg, node_id, &j->round, &j->asg, err,
                               sizeof(err));
    }
    if (rc < 0) {
        if (!store_gone_with_node(a, rc, j->err, sizeof(j->err)))
            snprintf(j->err, sizeof(j->err), "rendezvous failed: %s%s%s", rdzv_strerror(rc),
                     err[0] ? ": " : "", err);
        return rc;
    }
    if (a->rdzv->publish_store)
        return round_store_job(a, j);
    /*
     * Between attempts the workers' keys go (ddprun_rdzv_clear_worker_keys()): the hosting agent
     * clears everything outside ddprun's own keys once every node has met for the new round,
     * and the other nodes wait for that before spawning.
     */
    if (j->round > 0) {
        rc = a->rdzv->clear_worker_keys(a->store, a->client, a->prefix, j->round, j->asg.nnodes,
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
    /* A store-backed rendezvous of several nodes with a token: say who fails to authenticate. */
    if (a->token[0] && !a->rdzv->publish_store && a->cfg->nnodes_max > 1 && !a->joinwatch_started)
        a->joinwatch_started = pthread_create(&a->joinwatch, NULL, joinwatch_main, a) == 0;
    if (a->joinwatch_started)
        joinwatch_set(a, true);
}

/* The rendezvous of this round succeeded: start the workers. */
static void spawn_round(agent *a)
{
    ddprun_config *cfg = a->cfg;
    /* Watch the other nodes, and for an elastic job that could still grow, late joiners. */
    bool watch = a->asg.nnodes > 1 || (a->rdzv->num_waiting && a->asg.nnodes < cfg->nnodes_max);
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
    a->round_done = false;
    a->con_waiting = false;
    a->state = ST_RUNNING;
    /* Where permitted, the workers go into a PID namespace; if not, the guards contain them. */
    if (!a->init_pid && !a->ns_unavailable && job_ns_start(a) < 0)
        a->ns_unavailable = true;
    for (int i = 0; i < a->nworkers; i++) {
        worker *w = &a->workers[i];
        w->a = a;
        w->local_rank = i;
        w->rank = a->asg.rank_offset + i;
        if (spawn_worker(a, w) < 0) {
            ddprun_failure f;
            ddprun_failure_init(&f, a->hostname, w->rank, i, 127, 0, "could not start the worker");
            f.node_rank = a->asg.node_rank;
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
        char why[256] = "";
        j->rc = a->rdzv->connect(a->cfg, a->connect_host, a->store_port, &co, &a->client, why,
                                 sizeof(why));
        if (j->rc < 0 && a->rdzv->publish_store) {
            snprintf(j->err, sizeof(j->err), "cannot reach the %s rendezvous at %s: %s",
                     a->rdzv->name, a->cfg->rdzv_endpoint, why);
        } else if (j->rc == -EACCES && a->token[0]) {
            char ep[300];
            fmt_endpoint(ep, sizeof(ep), a->connect_host, a->store_port);
            snprintf(j->err, sizeof(j->err),
                     "authentication with the rendezvous store at %s failed: its token is not "
                     "this node's; every node of a job needs the same token (--token-file, "
                     "DDPRUN_TOKEN_FILE or DDPRUN_TOKEN), unless that is another job's store "
                     "(%s)",
                     ep, why);
        } else if (j->rc < 0) {
            char ep[300];
            fmt_endpoint(ep, sizeof(ep), a->connect_host, a->store_port);
            snprintf(j->err, sizeof(j->err), "cannot reach the rendezvous store at %s: %s (%s)", ep,
                     rdzv_strerror(j->rc), why);
        }
        break;
    }
    case JOB_RENDEZVOUS:
        j->rc = rendezvous_job(a, j);
        if (j->rc == 0 && a->cfg->store_proxy)
            store_proxy_job(a, j);
        break;
    case JOB_PUBLISH:
        j->rc = a->rdzv->publish_failure(a->client, a->prefix, j->round, j->json);
        if (j->rc < 0)
            snprintf(j->err, sizeof(j->err),
                     "could not publish the failure through the rendezvous: %s",
                     rdzv_strerror(j->rc));
        break;
    case JOB_BARRIER:
        /* Torchrun's exit barrier, with an eye on the round's failure key: a failure published
         * by a node still running ends the wait. */
        j->rc = a->rdzv->exit_barrier(a->client, a->prefix, j->round, j->asg.nnodes,
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
        case JOB_RENDEZVOUS: {
            if (a->joinwatch_started)
                joinwatch_set(a, false);
            /* A store that moves with the rounds: the round's replaces the last one (whose
             * workers are all gone). */
            bool moved = j->rc == 0 && a->rdzv->publish_store;
            rdzv_server *old = NULL;
            pthread_mutex_lock(&a->mu); /* the monitor reads the assignment and a->store */
            a->round = j->round;
            a->asg = j->asg;
            if (moved) {
                old = a->store;
                a->store = j->srv;
                j->srv = NULL;
                snprintf(a->store_host, sizeof(a->store_host), "%s", j->store_host);
                a->store_port = j->store_port;
            }
            pthread_mutex_unlock(&a->mu);
            rdzv_server_close(old);
            if (moved && a->store && a->cfg->nnodes_max > 1) {
                char ep[300];
                fmt_endpoint(ep, sizeof(ep), a->store_host, a->store_port);
                say("round %d: node rank 0 of %d: serving the workers' store at %s", a->round,
                    a->asg.nnodes, ep);
            }
            if (j->rc < 0) {
                say("%s", j->err);
                a->exit_code = 1;
                a->state = ST_DONE;
                if (a->nfailures)
                    print_final_summary(a);
            } else {
                store_proxy_adopt(a, j);
                spawn_round(a);
            }
            break;
        }
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
    rdzv_server_close(j->srv); /* a round's store nobody took over */
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

/*
 * Starts the workers' store in-process on bind_host:port (0: a free port) with the job's token,
 * allow list, descriptor reserve and hooks. Returns 0 and sets *out, or a negative errno.
 */
static int serve_store(agent *a, const char *bind_host, int port, rdzv_server **out)
{
    ddprun_config *cfg = a->cfg;
    rdzv_server_options o;
    rdzv_server_options_init(&o);
    o.token = a->token[0] ? a->token : NULL;
    o.allow = (const char *const *)cfg->allow;
    o.nallow = (size_t)cfg->nallow;
    o.host = bind_host;
    o.port = port;
    o.log = store_log;
    o.on_close = store_conn_closed; /* a node whose monitor connection closes is gone */
    o.on_close_arg = a;
    /* The connection cap comes from the descriptor limit, less what spawning and watching the
     * workers needs (two output pipes each, four descriptors while spawning, log and error
     * files, the exec shim's pipe), so that a connection flood cannot starve a restart of
     * descriptors. */
    o.max_connections = 0;
    o.fd_reserve = 64 + 8 * (size_t)cfg->nproc_per_node;
    return rdzv_server_start(&o, out);
}

/* The backend's plan_store() says where the workers' store is and whether this agent serves it
 * in-process (static: node 0; c10d: the endpoint's host, or a --standalone agent; etcd: nobody
 * before the first round, round_store_job() then). */
static int setup_store(agent *a)
{
    ddprun_config *cfg = a->cfg;
    ddprun_store_plan plan;
    a->rdzv->plan_store(cfg, &plan);
    const char *host = plan.host;
    int port = plan.port;
    bool hosting = plan.serve;

    /* The job's secret: given, or made up when only this agent's workers use the store. */
    ddprun_token_source source;
    bool loose = false;
    char err[512] = "";
    bool alone = (hosting || a->rdzv->publish_store) && cfg->nnodes_max == 1;
    if (ddprun_job_token(cfg->token_file, alone, a->token, sizeof(a->token), &source, &loose, err,
                         sizeof(err)) < 0) {
        say("%s", err);
        return -EINVAL;
    }
    if (loose)
        say("warning: %s is readable by other users: keep the job's secret mode 0600",
            ddprun_token_source_name(source));

    if (hosting) {
        /* Bind the wildcard of IPv6 and IPv4 (as PyTorch's store binds every interface; the
         * library falls back to IPv4's on a host without IPv6), except for a loopback endpoint. */
        if (cfg->standalone)
            snprintf(a->bind_host, sizeof(a->bind_host), "127.0.0.1");
        else if (!loopback_only(host, a->bind_host, sizeof(a->bind_host)))
            snprintf(a->bind_host, sizeof(a->bind_host), "::");
        int rc = serve_store(a, a->bind_host, port, &a->store);
        if (rc < 0 && plan.must_serve) {
            char ep[300];
            fmt_endpoint(ep, sizeof(ep), a->bind_host, port);
            say("cannot serve the store on %s: %s", ep, rdzv_strerror(rc));
            return rc;
        }
        if (rc == 0)
            port = rdzv_server_port(a->store);
        else if (source == DDPRUN_TOKEN_GENERATED)
            a->token[0] = '\0'; /* someone else's store: our random token cannot be its */
    }
    /* A store that moves with the rounds (round_store_job()) has no address yet. */
    bool moving = a->rdzv->publish_store != NULL;
    if (!a->token[0] && !cfg->standalone && !(moving && cfg->nnodes_max == 1)) {
        char where[300] = "the workers' store";
        if (!moving)
            snprintf(where, sizeof(where), "the store at %.256s:%d", host, port);
        say("warning: the job has no secret (--token-file, DDPRUN_TOKEN_FILE or DDPRUN_TOKEN): "
            "anyone who can reach %s can read and forge the job's control keys; see SECURITY "
            "in ddprun(1)",
            where);
    }
    if (moving)
        return 0;
    snprintf(a->store_host, sizeof(a->store_host), "%s", cfg->standalone ? "127.0.0.1" : host);
    a->store_port = port;
    /* The connection itself is a job (JOB_CONNECT): reaching another node's store may take the
     * whole join timeout. */
    const char *own = !a->store                    ? host
                      : strcmp(a->bind_host, "::") ? a->bind_host /* a loopback address */
                                                   : "127.0.0.1";
    snprintf(a->connect_host, sizeof(a->connect_host), "%s", own);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* main                                                                                     */
/* ---------------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
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
     * it. (Workers start with default dispositions: spawn.c resets them in the guard.) */
    signal(SIGXFSZ, SIG_IGN);
    /* What a worker's guard could not kill (the guard itself was killed) is reparented here. */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    cloexec_inherited_fds();

    agent a = {0};
    a.cfg = &cfg;
    a.init_alive_fd = a.init_ready_fd = a.mntns_fd = a.own_pidns_fd = -1;
    a.ns_unavailable = !cfg.pid_namespace;
    a.loop = uv_default_loop();
    a.monitor_round = -1;
    pthread_mutex_init(&a.mu, NULL);
    pthread_cond_init(&a.cv, NULL);
    gethostname(a.hostname, sizeof(a.hostname) - 1);
    snprintf(a.run_id, sizeof(a.run_id), "%s", cfg.rdzv_id);
    a.rdzv = ddprun_backend_find(ddprun_backend_name(cfg.rdzv_backend));
    if (!a.rdzv) { /* a row this build left out (etcd without libcurl) */
        fprintf(stderr,
                PROG ": --rdzv-backend %s: this build has no %s backend (it needs libcurl)\n",
                ddprun_backend_name(cfg.rdzv_backend), ddprun_backend_name(cfg.rdzv_backend));
        return 2;
    }
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
    relay_start(&a);
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
    if (a.rdzv->leave)
        a.rdzv->leave(&cfg); /* the other nodes see this one gone at once */
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

    /* The monitor may sit in a store wait for up to its slice: tell it to stop but do not
     * wait for it; exit() ends it. Nothing it uses is freed before that. */
    if (a.monitor_started)
        monitor_set_round(&a, -1);
    cleanup_tmpdir(a.tmpbase);
    fflush(NULL);
    _exit(a.exit_code);
}
