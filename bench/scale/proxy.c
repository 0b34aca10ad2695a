/*
 * proxy.c: lightweight mode's per-node store proxies (--proxy on). Node i's G ranks connect to
 * proxy i instead of the root; every proxy holds its own connection to the root, as ddprun's
 * per-node proxy does. All proxies run on one libuv loop in a child process of their own, the
 * proxy host, forked before any agent or rank thread exists: its descriptors (one per rank
 * connection plus one upstream per node) then do not count against this program's, which holds
 * the ranks' ends (N x G = 8192 of each at 1024 nodes, more than one process may open here),
 * and the kernel charges the proxies' CPU time to it alone. It reports its ports at start and
 * its counters (rdzv_proxy_stats(), summed, with its CPU time) when asked over a pipe; the
 * pipe's closing stops it.
 *
 * The proxy API (rdzv_proxy_create() and friends in rdzv.h) comes with the store proxy of issue
 * 23; meson defines SCALE_BENCH_HAVE_PROXY when rdzv.h declares rdzv_proxy_create. Without it
 * this file only says so (-ENOTSUP), and --proxy on is refused before anything runs. This file
 * is the one place that names the proxy API.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>

#include "scale-bench.h"

#ifndef SCALE_BENCH_HAVE_PROXY

const bool sb_have_proxy = false;

int sb_proxies_start(int n, int root_port, int *ports, struct sb_proxies **out, char *err,
                     size_t errlen)
{
    (void)n, (void)root_port, (void)ports, (void)out;
    snprintf(err, errlen, "--proxy on: this build has no store proxy (rdzv_proxy_create)");
    return -ENOTSUP;
}

void sb_proxies_stop(struct sb_proxies *px)
{
    (void)px;
}

int sb_proxies_totals(struct sb_proxies *px, struct sb_proxy_totals *t)
{
    (void)px, (void)t;
    return -ENOTSUP;
}

#else /* SCALE_BENCH_HAVE_PROXY */

#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "monoclock.h"
#include "rdzv.h"

const bool sb_have_proxy = true;

struct sb_proxies {
    pid_t pid; /* the proxy host */
    int cmd;   /* to it: 't' asks for the totals; EOF stops it */
    int resp;  /* from it: the start report, then totals */
};

/* Reads or writes exactly n bytes; 0 or -errno (-EPIPE at EOF). */
static int xfer(int fd, void *buf, size_t n, bool out)
{
    char *p = buf;
    while (n > 0) {
        ssize_t k = out ? write(fd, p, n) : read(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return k < 0 ? -errno : -EPIPE;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* The proxy host: the child process that serves every node's proxy. */
struct host {
    uv_loop_t loop;
    uv_poll_t cmd;
    int resp;
    int n;
    rdzv_proxy **p;
};

static void host_cmd_cb(uv_poll_t *h, int status, int events)
{
    struct host *H = h->data;
    char c;
    (void)events;
    if (status == 0 && read(H->cmd.io_watcher.fd, &c, 1) == 1) {
        struct sb_proxy_totals t = {0};
        for (int i = 0; i < H->n; i++) {
            rdzv_proxy_counters k;
            if (rdzv_proxy_stats(H->p[i], &k) < 0)
                continue;
            t.worker_requests += (int64_t)k.worker_requests;
            t.upstream_requests += (int64_t)k.upstream_requests;
            t.coalesced += (int64_t)k.coalesced;
            t.bytes_up += (int64_t)k.bytes_up;
            t.bytes_down += (int64_t)k.bytes_down;
        }
        t.cpu_ns = cpu_used_ns(0);
        xfer(H->resp, &t, sizeof t, true);
        return;
    }
    /* EOF (or an error): close everything; the loop then ends. */
    for (int i = 0; i < H->n; i++)
        rdzv_proxy_close(H->p[i]);
    uv_close((uv_handle_t *)&H->cmd, NULL);
}

/* The child's life: n proxies, their ports (or an error) to `resp`, then serve. */
static void host_main(int n, int root_port, int cmd, int resp)
{
    struct host H = {.resp = resp, .n = 0};
    int rc = -ENOMEM;
    char msg[256] = "out of memory";
    H.p = calloc((size_t)n, sizeof *H.p);
    int *ports = calloc((size_t)n, sizeof *ports);
    if (H.p && ports && (rc = uv_loop_init(&H.loop)) < 0)
        snprintf(msg, sizeof msg, "uv_loop_init: %s", uv_strerror(rc));
    for (int i = 0; rc == 0 && i < n; i++) {
        rdzv_proxy_options o;
        rdzv_proxy_options_init(&o);
        o.host = "127.0.0.1";
        o.port = 0;
        o.upstream_host = "127.0.0.1";
        o.upstream_port = root_port;
        rc = rdzv_proxy_create(&H.loop, &o, &H.p[i]);
        if (rc == 0) {
            H.n = i + 1;
            ports[i] = rdzv_proxy_port(H.p[i]);
        } else {
            snprintf(msg, sizeof msg, "proxy %d: %s", i, rdzv_strerror(rc));
        }
    }
    if (rc == 0)
        rc = uv_poll_init(&H.loop, &H.cmd, cmd);
    xfer(resp, &rc, sizeof rc, true);
    if (rc < 0) {
        xfer(resp, msg, sizeof msg, true);
        _exit(1);
    }
    xfer(resp, ports, sizeof *ports * (size_t)n, true);
    H.cmd.data = &H;
    uv_poll_start(&H.cmd, UV_READABLE | UV_DISCONNECT, host_cmd_cb);
    uv_run(&H.loop, UV_RUN_DEFAULT);
    _exit(0);
}

int sb_proxies_start(int n, int root_port, int *ports, struct sb_proxies **out, char *err,
                     size_t errlen)
{
    int cmd[2], resp[2];
    struct sb_proxies *px = calloc(1, sizeof *px);
    if (!px || pipe2(cmd, O_CLOEXEC) < 0) {
        free(px);
        snprintf(err, errlen, "proxy host: %s", strerror(errno ? errno : ENOMEM));
        return -ENOMEM;
    }
    if (pipe2(resp, O_CLOEXEC) < 0) {
        close(cmd[0]);
        close(cmd[1]);
        free(px);
        snprintf(err, errlen, "proxy host: pipe: %s", strerror(errno));
        return -EMFILE;
    }
    px->pid = fork();
    if (px->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(cmd[1]);
        close(resp[0]);
        host_main(n, root_port, cmd[0], resp[1]);
    }
    close(cmd[0]);
    close(resp[1]);
    px->cmd = cmd[1];
    px->resp = resp[0];
    int status = 0;
    int rc = px->pid < 0 ? -errno : xfer(px->resp, &status, sizeof status, false);
    if (rc == 0) {
        rc = status;
        if (rc < 0) {
            char msg[256] = "";
            xfer(px->resp, msg, sizeof msg, false);
            snprintf(err, errlen, "%s", msg);
        } else {
            rc = xfer(px->resp, ports, sizeof *ports * (size_t)n, false);
        }
    }
    if (rc < 0) {
        if (!err[0])
            snprintf(err, errlen, "the proxy host did not start: %s", strerror(-rc));
        sb_proxies_stop(px);
        return rc;
    }
    *out = px;
    return 0;
}

int sb_proxies_totals(struct sb_proxies *px, struct sb_proxy_totals *t)
{
    if (!px)
        return -EINVAL;
    int rc = xfer(px->cmd, "t", 1, true);
    return rc < 0 ? rc : xfer(px->resp, t, sizeof *t, false);
}

void sb_proxies_stop(struct sb_proxies *px)
{
    if (!px)
        return;
    close(px->cmd);
    close(px->resp);
    if (px->pid > 0) {
        int64_t deadline = mono_deadline_ns(5000);
        while (waitpid(px->pid, NULL, WNOHANG) == 0) {
            if (mono_ms_left(deadline) == 0) {
                kill(px->pid, SIGKILL);
                waitpid(px->pid, NULL, 0);
                break;
            }
            mono_sleep_until(mono_now_ns() + 10000000); /* a bounded poll for its exit */
        }
    }
    free(px);
}

#endif /* SCALE_BENCH_HAVE_PROXY */
