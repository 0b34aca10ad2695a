/*
 * root.c: the root store under measurement, and the counters read from it. The root is
 * `ddp-rendezvous serve --bind 127.0.0.1 --port 0`, a child process of its own: the kernel
 * then charges its CPU time to it alone (clock_getcpuclockid()), apart from this program's
 * agent and rank threads, which share the machine's cores with it. Its counters come from the
 * store's STATUS request (rdzv_status()) on a connection of this program's; the STATUS
 * requests themselves are taken out of the figures.
 *
 * Not here: what the phases do (light.c, real.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "monoclock.h"
#include "proto.h"
#include "rdzv.h"
#include "scale-bench.h"

const char *const sb_mode_names[SB_NMODES] = {"lightweight", "ddprun static", "ddprun c10d",
                                              "torchrun 2.x static"};

long sb_raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return -1;
    /* Where this process may (CAP_SYS_RESOURCE), past the hard limit too. */
    if (rl.rlim_max < SB_NOFILE_WANT) {
        struct rlimit more = {SB_NOFILE_WANT, SB_NOFILE_WANT};
        if (setrlimit(RLIMIT_NOFILE, &more) == 0)
            rl = more;
    }
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    return (long)rl.rlim_cur;
}

/* Reads one line (the port) from fd within timeout_ms. */
static int read_port(int fd, int timeout_ms)
{
    char line[64];
    size_t len = 0;
    int64_t deadline = mono_deadline_ns(timeout_ms);
    while (len + 1 < sizeof line) {
        struct pollfd pfd = {fd, POLLIN, 0};
        int left = mono_ms_left(deadline);
        if (left == 0 || poll(&pfd, 1, left) == 0)
            return -ETIMEDOUT;
        ssize_t n = read(fd, line + len, 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -EPIPE;
        if (line[len] == '\n')
            break;
        len++;
    }
    line[len] = '\0';
    long port = strtol(line, NULL, 10);
    return port > 0 && port < 65536 ? (int)port : -EPROTO;
}

int sb_root_start(struct sb_root *r, const char *server, const char *tmpdir, char *err,
                  size_t errlen)
{
    int out[2];
    r->pid = -1;
    r->status = NULL;
    snprintf(r->log, sizeof r->log, "%s/root.%d.log", tmpdir, (int)getpid());
    int logfd = open(r->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (logfd < 0 || pipe2(out, O_CLOEXEC) < 0) {
        snprintf(err, errlen, "%s: %s", r->log, strerror(errno));
        if (logfd >= 0)
            close(logfd);
        return -EIO;
    }
    r->pid = fork();
    if (r->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(out[1], 1);
        dup2(logfd, 2);
        execl(server, server, "serve", "--bind", "127.0.0.1", "--port", "0", (char *)NULL);
        dprintf(2, "scale-bench: cannot execute %s: %s\n", server, strerror(errno));
        _exit(127);
    }
    close(out[1]);
    close(logfd);
    if (r->pid < 0) {
        close(out[0]);
        snprintf(err, errlen, "fork: %s", strerror(errno));
        return -EAGAIN;
    }
    r->port = read_port(out[0], 10000);
    close(out[0]); /* the server writes nothing else to stdout */
    if (r->port < 0) {
        snprintf(err, errlen, "%s did not print its port (see %s)", server, r->log);
        return -EPROTO;
    }
    rdzv_client_options co;
    rdzv_client_options_init(&co);
    co.connect_timeout_ms = 10000;
    co.timeout_ms = 60000;
    int rc = rdzv_client_connect("127.0.0.1", r->port, &co, &r->status);
    if (rc < 0) {
        snprintf(err, errlen, "connecting to the root store: %s", rdzv_client_last_error(NULL));
        return rc;
    }
    return 0;
}

void sb_root_stop(struct sb_root *r, bool keep_log)
{
    rdzv_client_close(r->status);
    r->status = NULL;
    if (r->pid > 0) {
        kill(r->pid, SIGTERM);
        int64_t deadline = mono_deadline_ns(5000);
        int st;
        while (waitpid(r->pid, &st, WNOHANG) == 0) {
            if (mono_ms_left(deadline) == 0) {
                kill(r->pid, SIGKILL);
                waitpid(r->pid, &st, 0);
                break;
            }
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL); /* a bounded poll for the child's exit */
        }
        r->pid = -1;
    }
    if (!keep_log)
        unlink(r->log);
}

static int64_t get_int(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
}

int sb_stats_parse(const char *text, struct sb_stats *s)
{
    json_error_t je;
    json_t *o = json_loads(text, 0, &je);
    if (!json_is_object(o)) {
        json_decref(o);
        return -EPROTO;
    }
    s->have_status = true;
    s->conns = get_int(o, "connections");
    s->accepted = get_int(json_object_get(o, "connections_total"), "accepted");
    json_t *ops = json_object_get(o, "ops");
    int64_t sum = 0;
    for (int i = 0; i < RDZV_OP_COUNT && i < SB_MAX_OPS; i++) {
        int64_t v = get_int(ops, rdzv__op_name((enum rdzv_op)i));
        s->ops[i] = v < 0 ? 0 : v;
        sum += s->ops[i];
    }
    /* "traffic" (requests, bytes in and out) where the server reports it. */
    json_t *t = json_object_get(o, "traffic");
    s->have_traffic = json_is_object(t);
    s->requests = s->have_traffic ? get_int(t, "requests") : sum;
    s->bytes_in = s->have_traffic ? get_int(t, "bytes_in") : -1;
    s->bytes_out = s->have_traffic ? get_int(t, "bytes_out") : -1;
    json_decref(o);
    return 0;
}

int sb_root_sample(struct sb_root *r, struct sb_stats *s)
{
    memset(s, 0, sizeof *s);
    s->cpu_ns = r->pid > 0 ? cpu_used_ns(r->pid) : -1;
    s->conns = s->accepted = s->requests = s->bytes_in = s->bytes_out = -1;
    if (!r->status)
        return -ENOTCONN;
    char *json = NULL;
    int rc = rdzv_status(r->status, &json);
    if (rc == 0) {
        rc = sb_stats_parse(json, s);
        if (s->conns > 0)
            s->conns--; /* this program's STATUS connection */
    }
    rdzv_free(json);
    return rc;
}

static int64_t sub(int64_t b, int64_t a)
{
    return a < 0 || b < 0 ? -1 : b - a;
}

void sb_stats_diff(const struct sb_stats *a, const struct sb_stats *b, struct sb_stats *d)
{
    memset(d, 0, sizeof *d);
    d->have_status = a->have_status && b->have_status;
    d->have_traffic = a->have_traffic && b->have_traffic;
    d->cpu_ns = sub(b->cpu_ns, a->cpu_ns);
    d->conns = b->conns;
    d->accepted = sub(b->accepted, a->accepted);
    for (int i = 0; i < SB_MAX_OPS; i++)
        d->ops[i] = b->ops[i] - a->ops[i];
    /* Less the STATUS requests that read the counters. */
    d->requests = sub(b->requests, a->requests);
    if (d->requests > 0)
        d->requests -= d->ops[RDZV_OP_STATUS];
    d->ops[RDZV_OP_STATUS] = 0;
    d->bytes_in = sub(b->bytes_in, a->bytes_in);
    d->bytes_out = sub(b->bytes_out, a->bytes_out);
    if (!d->have_status)
        d->conns = d->accepted = d->requests = -1;
    if (!d->have_traffic)
        d->bytes_in = d->bytes_out = -1;
}

void sb_metric(struct sb_point *p, const char *name, const char *unit, double v)
{
    if (p->nmetrics < SB_MAX_METRICS)
        p->m[p->nmetrics++] = (struct sb_metric){name, unit, v};
}

static double known(int64_t v, double scale)
{
    return v < 0 ? NAN : (double)v * scale;
}

void sb_phase_metrics(struct sb_point *p, const struct sb_phase *ph, const char *wall_name,
                      const char *const names[5])
{
    if (wall_name)
        sb_metric(p, wall_name, "s", ph->wall_s);
    sb_metric(p, names[0], "", known(ph->d.conns, 1));
    sb_metric(p, names[1], "", known(ph->d.requests, 1));
    sb_metric(p, names[2], "MB", known(ph->d.bytes_in, 1e-6));
    sb_metric(p, names[3], "MB", known(ph->d.bytes_out, 1e-6));
    sb_metric(p, names[4], "s", known(ph->d.cpu_ns, 1e-9));
}
