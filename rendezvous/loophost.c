/*
 * The life cycle shared by the store server and the store proxy (loophost.h): the choice of
 * loop, the thread that runs an own loop, the stop handle and the mutex; and the formatting of
 * log lines for their log hooks. It knows nothing of the handles its owner keeps on the loop:
 * the owner's stop hook closes those.
 */
#include "loophost.h"

#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>

int rdzv__loophost_init(rdzv__loophost *h, bool threaded, uv_loop_t *caller_loop, uv_loop_t **loop)
{
    int rc;
    h->threaded = threaded;
    if (!threaded) {
        *loop = caller_loop;
        return 0;
    }
    if ((rc = uv_mutex_init(&h->lock)) < 0)
        return rc;
    h->lock_made = true;
    if ((rc = uv_loop_init(&h->own_loop)) < 0)
        return rc;
    h->own_loop_made = true;
    *loop = &h->own_loop;
    return 0;
}

static void stop_cb(uv_async_t *a)
{
    rdzv__loophost *h = a->data;
    uv_close((uv_handle_t *)a, NULL);
    h->stop(h->arg);
}

static void thread_main(void *arg)
{
    rdzv__loophost *h = arg;
    /* A peer that vanishes while we write must give EPIPE, not kill the host process: block
     * SIGPIPE on this thread (a write's SIGPIPE is directed at the writing thread). */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    if (h->enter)
        h->enter(h->arg);
    uv_run(&h->own_loop, UV_RUN_DEFAULT);
    if (h->leave)
        h->leave(h->arg);
}

int rdzv__loophost_start(rdzv__loophost *h, rdzv__loophost_fn stop, rdzv__loophost_fn enter,
                         rdzv__loophost_fn leave, void *arg)
{
    int rc;
    h->stop = stop;
    h->enter = enter;
    h->leave = leave;
    h->arg = arg;
    uv_async_init(&h->own_loop, &h->stop_async, stop_cb);
    h->stop_async.data = h;
    if ((rc = uv_thread_create(&h->thread, thread_main, h)) < 0)
        uv_close((uv_handle_t *)&h->stop_async, NULL);
    return rc;
}

void rdzv__loophost_stop(rdzv__loophost *h)
{
    uv_async_send(&h->stop_async);
    uv_thread_join(&h->thread);
}

void rdzv__loophost_free(rdzv__loophost *h)
{
    if (h->own_loop_made)
        uv_loop_close(&h->own_loop);
    if (h->lock_made)
        uv_mutex_destroy(&h->lock);
}

void rdzv__logf(rdzv_log_fn log, void *log_arg, int level, const char *fmt, ...)
{
    if (!log)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    log(log_arg, level, line);
}
