/*
 * proxy.c: lightweight mode's per-node store proxies (--proxy on). Node i's G ranks connect to
 * proxy i instead of the root; every proxy holds its own connection to the root, as ddprun's
 * per-node proxy does. All proxies run on one libuv loop, on one thread of this program.
 *
 * The proxy API (rdzv_proxy_create() and friends in rdzv.h) comes with the store proxy of issue
 * 23; meson defines SCALE_BENCH_HAVE_PROXY when rdzv.h declares rdzv_proxy_create. Without it
 * this file only says so (-ENOTSUP), and --proxy on is refused before anything runs. This file
 * is the one place that names the proxy API: the option fields below (rdzv_proxy_options'
 * host, port, upstream_host, upstream_port) are those the API was announced with; check them
 * against rdzv.h when enabling it. The proxies' counters (rdzv_proxy_stats()) are read on their
 * loop thread, through an async handle.
 */
#include <errno.h>
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

#include <pthread.h>
#include <uv.h>

#include "rdzv.h"

const bool sb_have_proxy = true;

struct sb_proxies {
    uv_loop_t loop;
    uv_async_t stop, sum;
    pthread_t tid;
    bool running;
    int n;
    rdzv_proxy **p;
    pthread_mutex_t mu; /* guards totals and summed */
    pthread_cond_t cv;
    struct sb_proxy_totals totals;
    bool summed;
};

/* On the loop thread: the counters of every proxy, added up for sb_proxies_totals(). */
static void sum_cb(uv_async_t *h)
{
    struct sb_proxies *px = h->data;
    struct sb_proxy_totals t = {0};
    for (int i = 0; i < px->n; i++) {
        rdzv_proxy_counters c;
        if (rdzv_proxy_stats(px->p[i], &c) < 0)
            continue;
        t.worker_requests += (int64_t)c.worker_requests;
        t.upstream_requests += (int64_t)c.upstream_requests;
        t.coalesced += (int64_t)c.coalesced;
        t.bytes_up += (int64_t)c.bytes_up;
        t.bytes_down += (int64_t)c.bytes_down;
    }
    pthread_mutex_lock(&px->mu);
    px->totals = t;
    px->summed = true;
    pthread_cond_broadcast(&px->cv);
    pthread_mutex_unlock(&px->mu);
}

int sb_proxies_totals(struct sb_proxies *px, struct sb_proxy_totals *t)
{
    if (!px || !px->running)
        return -EINVAL;
    pthread_mutex_lock(&px->mu);
    px->summed = false;
    uv_async_send(&px->sum);
    while (!px->summed)
        pthread_cond_wait(&px->cv, &px->mu);
    *t = px->totals;
    pthread_mutex_unlock(&px->mu);
    return 0;
}

static void stop_cb(uv_async_t *h)
{
    struct sb_proxies *px = h->data;
    for (int i = 0; i < px->n; i++)
        rdzv_proxy_close(px->p[i]);
    uv_close((uv_handle_t *)&px->stop, NULL);
    uv_close((uv_handle_t *)&px->sum, NULL);
}

static void *loop_main(void *arg)
{
    struct sb_proxies *px = arg;
    uv_run(&px->loop, UV_RUN_DEFAULT);
    return NULL;
}

int sb_proxies_start(int n, int root_port, int *ports, struct sb_proxies **out, char *err,
                     size_t errlen)
{
    struct sb_proxies *px = calloc(1, sizeof *px);
    if (!px || !(px->p = calloc((size_t)n, sizeof *px->p))) {
        free(px);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    pthread_mutex_init(&px->mu, NULL);
    pthread_cond_init(&px->cv, NULL);
    int rc = uv_loop_init(&px->loop);
    if (rc < 0) {
        snprintf(err, errlen, "uv_loop_init: %s", uv_strerror(rc));
        free(px->p);
        free(px);
        return rc;
    }
    /* Neither can fail on a fresh loop on Linux (the loop's eventfd exists already). */
    uv_async_init(&px->loop, &px->stop, stop_cb);
    uv_async_init(&px->loop, &px->sum, sum_cb);
    px->stop.data = px->sum.data = px;
    /* Created before the loop runs: this thread is its only user until then. */
    for (int i = 0; rc == 0 && i < n; i++) {
        rdzv_proxy_options o;
        rdzv_proxy_options_init(&o);
        o.host = "127.0.0.1";
        o.port = 0;
        o.upstream_host = "127.0.0.1";
        o.upstream_port = root_port;
        rc = rdzv_proxy_create(&px->loop, &o, &px->p[i]);
        if (rc == 0) {
            px->n = i + 1;
            ports[i] = rdzv_proxy_port(px->p[i]);
        } else {
            snprintf(err, errlen, "proxy %d: %s", i, rdzv_strerror(rc));
        }
    }
    if (rc == 0) {
        rc = -pthread_create(&px->tid, NULL, loop_main, px);
        px->running = rc == 0;
    }
    if (rc < 0) {
        sb_proxies_stop(px);
        return rc;
    }
    *out = px;
    return 0;
}

void sb_proxies_stop(struct sb_proxies *px)
{
    if (!px)
        return;
    uv_async_send(&px->stop);
    if (px->running)
        pthread_join(px->tid, NULL);
    else
        uv_run(&px->loop, UV_RUN_DEFAULT);
    uv_loop_close(&px->loop);
    pthread_cond_destroy(&px->cv);
    pthread_mutex_destroy(&px->mu);
    free(px->p);
    free(px);
}

#endif /* SCALE_BENCH_HAVE_PROXY */
