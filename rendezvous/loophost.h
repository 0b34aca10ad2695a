/*
 * What the store server (server.c) and the store proxy (proxy.c) share about where they run:
 * embedded on a caller's libuv loop, or threaded on a loop of their own with a thread running
 * it, a mutex that guards their state against calls from other threads, and an async handle
 * that stops them from any thread. Internal to librendezvous (rdzv__ names, not exported).
 */
#ifndef RDZV_LOOPHOST_H
#define RDZV_LOOPHOST_H

#include "rdzv.h"

#include <stdbool.h>
#include <uv.h>

/* A hook of the owner, called with the `arg` given to rdzv__loophost_start(). */
typedef void (*rdzv__loophost_fn)(void *arg);

/*
 * Embedded in its owner, zeroed with it. Fields other than `threaded` are the helper's own.
 */
typedef struct rdzv__loophost {
    bool threaded;                 /* on its own loop and thread */
    bool own_loop_made, lock_made; /* for rdzv__loophost_free() of a half-built owner */
    uv_loop_t own_loop;
    uv_thread_t thread;
    uv_async_t stop_async;
    uv_mutex_t lock;
    rdzv__loophost_fn stop, enter, leave;
    void *arg;
} rdzv__loophost;

/*
 * Embedded (`threaded` false): sets *loop to `caller_loop`. Threaded: makes the mutex and the
 * own loop and sets *loop to the own loop. Returns 0, or a negative errno with *loop untouched;
 * what was made before a failure is released by rdzv__loophost_free().
 */
int rdzv__loophost_init(rdzv__loophost *h, bool threaded, uv_loop_t *caller_loop, uv_loop_t **loop);

/* Locks the mutex of a threaded owner; no-op when embedded. */
static inline void rdzv__loophost_lock(rdzv__loophost *h)
{
    if (h->threaded)
        uv_mutex_lock(&h->lock);
}

static inline void rdzv__loophost_unlock(rdzv__loophost *h)
{
    if (h->threaded)
        uv_mutex_unlock(&h->lock);
}

/*
 * Threaded only, after rdzv__loophost_init(): makes the stop handle on the own loop and starts
 * the thread, which blocks SIGPIPE, calls enter(arg) (optional), runs the loop until its last
 * handle closes, then calls leave(arg) (optional). rdzv__loophost_stop() makes the loop thread
 * close the stop handle and call stop(arg), which must start closing every other handle.
 * Returns 0, or a negative errno from uv_thread_create() with the stop handle closing; the
 * caller then closes its handles, runs the loop to the end and frees.
 */
int rdzv__loophost_start(rdzv__loophost *h, rdzv__loophost_fn stop, rdzv__loophost_fn enter,
                         rdzv__loophost_fn leave, void *arg);

/* Threaded only, from any thread but the loop's: stops the loop (see above) and joins it. */
void rdzv__loophost_stop(rdzv__loophost *h);

/* Closes the own loop (all its handles closed) and the mutex, where they were made. */
void rdzv__loophost_free(rdzv__loophost *h);

/*
 * Formats one line (at most 511 bytes) and passes it to `log`; does nothing when `log` is NULL.
 */
void rdzv__logf(rdzv_log_fn log, void *log_arg, int level, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif /* RDZV_LOOPHOST_H */
