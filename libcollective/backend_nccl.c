/*
 * The nccl backend as the API drives it (coll__nccl_backend, a row of comm.c's backend table,
 * built with NCCL only): operations are enqueued on the communicator's CUDA stream at issue and
 * a request is the event recorded after its operation, polled with a growing pause. These are
 * adapters over nccl.cu's coll__nccl_* calls, which hold every NCCL and CUDA call.
 *
 * Not here: NCCL itself (nccl.cu), argument checks, failure settlement and the public calls
 * (comm.c).
 */
#include "coll_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>

static int nccl_init(coll_comm *c, rdzv_client *store, int64_t deadline, char *err, size_t errlen)
{
    return coll__nccl_init(store, c->prefix, c->rank, c->world, c->device, deadline, &c->nccl, err,
                           errlen);
}

/*
 * The evidence of an nccl failure: an asynchronous error from a peer counts as a broken
 * connection to an unknown peer (a record its author left is adopted, else the rank that did
 * not reach the operation is blamed); anything else as the failed call's own account.
 */
static coll__evidence nccl_evidence(const coll_comm *c, const coll_request *req, int rc)
{
    return coll__comm_evidence(c, &req->op, req->k, rc,
                               rc == COLL_EREMOTE ? COLL__EV_CLOSED : COLL__EV_TIMEOUT, -1);
}

/* Enqueues the operation on the stream; a failure to enqueue completes the request failed. */
static void nccl_submit(coll_comm *c, coll_request *req)
{
    char detail[256] = "";
    pthread_mutex_lock(&c->lock);
    req->seq = c->issued++;
    req->k = c->ncoll;
    if (coll__is_collective(req->op.kind))
        c->ncoll++;
    req->issued = mono_now_ns();
    req->deadline = mono_deadline_ns(c->opts.timeout_ms);
    int sticky = c->sticky;
    int rc = sticky ? sticky
                    : coll__nccl_start(c->nccl, &req->op, c->stream, req->deadline, &req->event,
                                       detail, sizeof detail);
    pthread_mutex_unlock(&c->lock);
    if (rc < 0 && !sticky)
        rc = coll__comm_fail(c, &req->op, req->seq, nccl_evidence(c, req, rc), detail, req->issued);
    if (rc < 0) {
        req->result = rc;
        req->done = true;
    }
}

/*
 * Polls the request's event: 1 done (req->result set), 0 pending. Once the communicator has
 * failed, every pending request completes with that first failure, as cpu's queued ones do
 * (NCCL's aborted kernels end early and their events fire: not a result).
 */
static int nccl_check(coll_request *req)
{
    coll_comm *c = req->comm;
    char detail[256] = "";
    if (atomic_load(&c->aborted)) {
        req->result = -ECANCELED;
        return 1;
    }
    pthread_mutex_lock(&c->lock);
    int sticky = c->sticky;
    pthread_mutex_unlock(&c->lock);
    if (sticky) {
        req->result = sticky;
        return 1;
    }
    int rc = coll__nccl_query(c->nccl, req->event, detail, sizeof detail);
    if (rc < 0) {
        req->result =
            coll__comm_fail(c, &req->op, req->seq, nccl_evidence(c, req, rc), detail, req->issued);
        return 1;
    }
    if (rc == 0 && mono_now_ns() >= req->deadline) {
        req->result = coll__comm_fail(
            c, &req->op, req->seq,
            coll__comm_evidence(c, &req->op, req->k, -ETIMEDOUT, COLL__EV_TIMEOUT, -1), "",
            req->issued);
        return 1;
    }
    if (rc == 1)
        req->result = 0;
    return rc;
}

static int nccl_run(coll_comm *c, const coll__op *op)
{
    coll_request *req;
    int rc = coll__comm_issue(c, op, &req);
    return rc < 0 ? rc : coll_wait(req);
}

static void nccl_poll(coll_request *req)
{
    if (!req->done && req->event)
        req->done = nccl_check(req) != 0;
}

static void nccl_wait(coll_request *req)
{
    long pause_ns = 1000;
    while (!req->done && req->event && !nccl_check(req)) {
        struct timespec ts = {0, pause_ns};
        nanosleep(&ts, NULL); /* polling a GPU event: back off up to 1 ms */
        if (pause_ns < 1000000)
            pause_ns *= 2;
    }
    req->done = true;
    if (req->event)
        coll__nccl_event_free(req->event);
    req->event = NULL;
}

/* A stream wait on the operation's event; a request that failed to enqueue has its result. */
static int nccl_stream_wait(coll_request *req, void *stream)
{
    coll_comm *c = req->comm;
    if (req->done || !req->event)
        return req->result;
    char detail[256] = "";
    int rc = coll__nccl_stream_wait(req->event, stream, detail, sizeof detail);
    if (rc < 0) {
        pthread_mutex_lock(&c->lock);
        if (!c->sticky)
            snprintf(c->err, sizeof c->err, "%s", detail);
        pthread_mutex_unlock(&c->lock);
    }
    return rc;
}

/* Nothing is queued on the host side: the stream holds the pending operations. */
static void nccl_drain(coll_comm *c)
{
    (void)c;
}

static void nccl_abort(coll_comm *c, int culprit)
{
    (void)culprit;
    coll__nccl_abort(c->nccl);
}

static void nccl_destroy(coll_comm *c)
{
    coll__nccl_destroy(c->nccl);
}

static int nccl_nhosts(const coll_comm *c)
{
    (void)c;
    return 1;
}

static int nccl_local(const coll_comm *c, int *nlocal)
{
    (void)c;
    *nlocal = 1;
    return 0;
}

static const char *nccl_hostname(const coll_comm *c, int rank)
{
    (void)c;
    (void)rank;
    return "";
}

const coll__backend_ops coll__nccl_backend = {
    .init = nccl_init,
    .submit = nccl_submit,
    .run = nccl_run,
    .poll = nccl_poll,
    .wait = nccl_wait,
    .stream_wait = nccl_stream_wait,
    .drain = nccl_drain,
    .abort = nccl_abort,
    .destroy = nccl_destroy,
    .nhosts = nccl_nhosts,
    .local = nccl_local,
    .hostname = nccl_hostname,
    .needs_device = true,
};
