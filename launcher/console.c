/*
 * ddprun's console (console.h): standard output and standard error as non-blocking libuv streams
 * with a bounded queue, so that a console nobody reads (Ctrl-S, `| less`, a stalled pipe) slows
 * only the workers that write to it, and never the agent: its loop still reaps workers, handles
 * signals and tears the job down.
 *
 * Invariants: `queued` is the sum of the sizes of the write requests libuv holds for the stream;
 * `over` is set when a write leaves more than `limit` queued and cleared (with the drain
 * callback) once the queue is back to limit / 2. Everything but ddprun_console_post() runs on
 * the loop thread. Not done here: line assembly and prefixes (the agent's), flushing at exit
 * (the agent runs its loop for that, with a bound of its own).
 */
#include "console.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define POST_MAX (64 * 1024) /* bytes other threads may have waiting for the loop */

struct ddprun_console {
    uv_loop_t *loop;
    int fd;          /* the descriptor as the caller knows it (1 or 2) */
    bool stream;     /* written through `pipe`; else synchronously to fd */
    bool shared;     /* `pipe` writes to fd's own file description, whose flags we changed */
    int saved_flags; /* fd's status flags before that, restored at close */
    bool failed;     /* a write failed: drop from now on */
    bool closed;
    uv_pipe_t pipe;
    size_t limit, queued;
    bool over;
    uint64_t written;
    ddprun_console_drain_fn drain;
    void *drain_arg;

    pthread_mutex_t mu; /* guards posted, nposted */
    char *posted;
    size_t nposted;
    uv_async_t async;
};

typedef struct wreq {
    uv_write_t req;
    ddprun_console *c;
    size_t n;
    char data[];
} wreq;

static void write_sync(int fd, const char *p, size_t n)
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

static void written_cb(uv_write_t *req, int status)
{
    wreq *r = req->data;
    ddprun_console *c = r->c;
    c->queued -= r->n;
    if (status == 0)
        c->written += r->n;
    else if (status != UV_ECANCELED)
        c->failed = true;
    free(r);
    if (c->over && c->queued <= c->limit / 2) {
        c->over = false;
        if (c->drain)
            c->drain(c->drain_arg);
    }
}

int ddprun_console_write(ddprun_console *c, const void *p, size_t n)
{
    if (!c || n == 0 || c->failed || c->closed)
        return c && c->over ? 1 : 0;
    if (!c->stream) {
        write_sync(c->fd, p, n);
        c->written += n;
        return 0;
    }
    const char *b = p;
    if (c->queued == 0) {
        /* Nothing queued: what the console takes now needs no copy. */
        uv_buf_t buf = uv_buf_init((char *)b, (unsigned)(n > 1u << 30 ? 1u << 30 : n));
        int k = uv_try_write((uv_stream_t *)&c->pipe, &buf, 1);
        if (k > 0) {
            b += k;
            n -= (size_t)k;
            c->written += (uint64_t)k;
        } else if (k < 0 && k != UV_EAGAIN) {
            c->failed = true;
            return 0;
        }
        if (n == 0)
            return 0;
    }
    wreq *r = malloc(sizeof(*r) + n);
    if (!r)
        return -ENOMEM;
    r->c = c;
    r->n = n;
    r->req.data = r;
    memcpy(r->data, b, n);
    uv_buf_t buf = uv_buf_init(r->data, (unsigned)n);
    if (uv_write(&r->req, (uv_stream_t *)&c->pipe, &buf, 1, written_cb) < 0) {
        free(r);
        c->failed = true;
        return 0;
    }
    c->queued += n;
    if (c->queued > c->limit)
        c->over = true;
    return c->over ? 1 : 0;
}

static void posted_cb(uv_async_t *h)
{
    ddprun_console *c = h->data;
    pthread_mutex_lock(&c->mu);
    char *p = c->posted;
    size_t n = c->nposted;
    c->posted = NULL;
    c->nposted = 0;
    pthread_mutex_unlock(&c->mu);
    if (p)
        ddprun_console_write(c, p, n);
    free(p);
}

void ddprun_console_post(ddprun_console *c, const void *p, size_t n)
{
    if (!c || n == 0)
        return;
    pthread_mutex_lock(&c->mu);
    if (c->nposted + n <= POST_MAX) {
        char *q = realloc(c->posted, c->nposted + n);
        if (q) {
            memcpy(q + c->nposted, p, n);
            c->posted = q;
            c->nposted += n;
        }
    }
    pthread_mutex_unlock(&c->mu);
    uv_async_send(&c->async);
}

/*
 * A file description of our own for `fd`, where the kernel gives one: reopening
 * /proc/self/fd/N works for terminals, pipes and FIFOs (not for sockets).
 */
static int reopen_private(int fd)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    return open(path, O_WRONLY | O_CLOEXEC | O_NOCTTY);
}

int ddprun_console_open(uv_loop_t *loop, int fd, size_t limit, ddprun_console **out)
{
    if (!loop || fd < 0 || limit == 0 || !out)
        return -EINVAL;
    ddprun_console *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->loop = loop;
    c->fd = fd;
    c->limit = limit;
    pthread_mutex_init(&c->mu, NULL);
    uv_async_init(loop, &c->async, posted_cb);
    c->async.data = c;
    uv_unref((uv_handle_t *)&c->async); /* posts never keep the loop alive on their own */

    uv_handle_type type = uv_guess_handle(fd);
    if (type == UV_TTY || type == UV_NAMED_PIPE || type == UV_TCP || type == UV_UDP) {
        int wfd = reopen_private(fd);
        if (wfd < 0) {
            /* A socket: share its file description, and restore its flags at close. */
            c->saved_flags = fcntl(fd, F_GETFL);
            wfd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
            c->shared = wfd >= 0 && c->saved_flags >= 0;
            if (!c->shared && wfd >= 0) {
                close(wfd);
                wfd = -1;
            }
        }
        if (wfd >= 0) {
            uv_pipe_init(loop, &c->pipe, 0);
            if (uv_pipe_open(&c->pipe, wfd) == 0) {
                c->stream = true;
            } else {
                /* libuv refused it: back to synchronous writes on fd, as it was. */
                uv_close((uv_handle_t *)&c->pipe, NULL);
                close(wfd);
                if (c->shared)
                    fcntl(fd, F_SETFL, c->saved_flags);
                c->shared = false;
            }
        }
    }
    *out = c;
    return 0;
}

void ddprun_console_on_drain(ddprun_console *c, ddprun_console_drain_fn fn, void *arg)
{
    c->drain = fn;
    c->drain_arg = arg;
}

size_t ddprun_console_queued(const ddprun_console *c)
{
    return c ? c->queued : 0;
}

uint64_t ddprun_console_written(const ddprun_console *c)
{
    return c ? c->written : 0;
}

bool ddprun_console_over(const ddprun_console *c)
{
    return c && c->over;
}

bool ddprun_console_shared(const ddprun_console *c)
{
    return c && c->shared;
}

void ddprun_console_close(ddprun_console *c)
{
    if (!c || c->closed)
        return;
    c->closed = true;
    if (c->shared)
        fcntl(c->fd, F_SETFL, c->saved_flags);
}
