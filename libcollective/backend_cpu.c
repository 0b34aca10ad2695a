/*
 * The cpu backend as the API drives it (coll__cpu_backend, a row of comm.c's backend table):
 * a request queue per communicator, one progress thread that runs the queue in issue order, and
 * inline runs of blocking calls. A blocking call that finds the queue empty and nothing running
 * runs its operation on the calling thread instead (same order, no thread hand-offs on the
 * latency path). Device buffers (CUDA builds) are staged through pinned host memory.
 *
 * Not here: the algorithms (cpu.c) and the bootstrap (cpu_boot.c) this drives, argument checks,
 * failure settlement and the public calls (comm.c).
 */
#include "coll_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

/*
 * cpu backend with device buffers: copies them through one pinned host buffer that keeps the
 * send and receive buffers' relative position (so in-place stays in place). The buffers'
 * device is current on this thread meanwhile (a progress thread's is device 0 until then), so
 * that the copies and a NULL stream are that device's and no context is made on another.
 */
static int run_staged(coll_comm *c, const coll__op *op, int64_t deadline, int *culprit,
                      char *detail, size_t dlen)
{
    size_t nin, nout;
    coll__op_bytes(c, op, &nin, &nout);
    const unsigned char *s = op->sendbuf;
    unsigned char *r = op->recvbuf;
    int sdev = nin ? coll__cuda_device_of(s) : -1, rdev = nout ? coll__cuda_device_of(r) : -1;
    bool ds = sdev >= 0, dr = rdev >= 0;
    if (!ds && !dr)
        return coll__cpu_run(c->cpu, op, deadline, culprit, detail, dlen);
    int restore;
    int rc = coll__cuda_enter(ds ? sdev : rdev, &restore, detail, dlen);
    if (rc < 0)
        return rc;

    /* One span covering both device buffers when they overlap, else two regions. */
    bool overlap = ds && dr && !(s + nin <= r || r + nout <= s);
    const unsigned char *lo = overlap ? (s < r ? s : r) : NULL;
    size_t span = overlap ? (size_t)((s + nin > r + nout ? s + nin : r + nout) - lo) : 0;
    size_t need = overlap ? span : (ds ? nin : 0) + (dr ? nout : 0);
    if (need > c->stage_bytes) {
        coll__cuda_host_free(c->stage);
        c->stage = coll__cuda_host_alloc(need);
        c->stage_bytes = c->stage ? need : 0;
        if (!c->stage) {
            rc = -ENOMEM;
            goto out;
        }
    }
    unsigned char *h = c->stage;
    coll__op staged = *op;
    if (overlap) {
        staged.sendbuf = h + (s - lo);
        staged.recvbuf = h + (r - lo);
        rc = coll__cuda_copy(h, lo, span, c->stream, detail, dlen);
    } else {
        if (ds) {
            staged.sendbuf = h;
            rc = coll__cuda_copy(h, s, nin, c->stream, detail, dlen);
        }
        if (dr)
            staged.recvbuf = h + (ds ? nin : 0);
    }
    if (rc == 0)
        rc = coll__cpu_run(c->cpu, &staged, deadline, culprit, detail, dlen);
    if (rc == 0 && dr)
        rc = coll__cuda_copy(r, staged.recvbuf, nout, c->stream, detail, dlen);
out:
    coll__cuda_leave(restore);
    return rc;
}

/* Runs one cpu operation to completion; on the progress thread or inline. */
static int execute(coll_comm *c, const coll__op *op, uint64_t seq)
{
    if (atomic_load(&c->aborted))
        return -ECANCELED;
    pthread_mutex_lock(&c->lock);
    int sticky = c->sticky;
    pthread_mutex_unlock(&c->lock);
    if (sticky)
        return sticky;
    uint64_t k = c->ncoll;
    if (coll__is_collective(op->kind))
        c->ncoll++;
    int64_t started = mono_now_ns();
    int64_t deadline = mono_deadline_ns(c->opts.timeout_ms);
    int culprit = -1;
    char detail[256] = "";
    int rc = c->cuda ? run_staged(c, op, deadline, &culprit, detail, sizeof detail)
                     : coll__cpu_run(c->cpu, op, deadline, &culprit, detail, sizeof detail);
    if (rc < 0) {
        coll__evkind kind = COLL__EV_TIMEOUT;
        if (rc == COLL_EREMOTE)
            kind = coll__cpu_segment_aborted(c->cpu)      ? COLL__EV_ABORTED
                   : coll__cpu_same_host(c->cpu, culprit) ? COLL__EV_DEAD
                                                          : COLL__EV_CLOSED;
        coll__evidence ev = coll__comm_evidence(c, op, k, rc, kind, culprit);
        ev.segment_culprit = coll__cpu_segment_culprit(c->cpu);
        rc = coll__comm_fail(c, op, seq, ev, detail, started);
    }
    return rc;
}

static void *progress_main(void *arg)
{
    coll_comm *c = arg;
    pthread_mutex_lock(&c->lock);
    for (;;) {
        while ((!c->head || c->busy) && !c->stopping)
            pthread_cond_wait(&c->work, &c->lock);
        if (!c->head)
            break;
        coll_request *req = c->head;
        c->head = req->next;
        if (!c->head)
            c->tail = NULL;
        c->busy = true;
        pthread_mutex_unlock(&c->lock);
        int rc = execute(c, &req->op, req->seq);
        pthread_mutex_lock(&c->lock);
        c->busy = false;
        req->result = rc;
        req->done = true;
        pthread_cond_broadcast(&c->done);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

static int cpu_init(coll_comm *c, rdzv_client *store, int64_t deadline, char *err, size_t errlen)
{
    c->cuda = coll__cuda_available();
    int rc = coll__cpu_init(store, c->prefix, c->rank, c->world, &c->opts, &c->aborted, deadline,
                            &c->cpu, NULL, err, errlen);
    if (rc < 0)
        return rc;
    rc = pthread_create(&c->thread, NULL, progress_main, c);
    c->thread_started = rc == 0;
    return -rc;
}

static void cpu_submit(coll_comm *c, coll_request *req)
{
    pthread_mutex_lock(&c->lock);
    req->seq = c->issued++;
    if (c->tail)
        c->tail->next = req;
    else
        c->head = req;
    c->tail = req;
    pthread_cond_signal(&c->work);
    pthread_mutex_unlock(&c->lock);
}

/* Runs inline when nothing is queued or running, else queues and waits. */
static int cpu_run(coll_comm *c, const coll__op *op)
{
    pthread_mutex_lock(&c->lock);
    if (!c->head && !c->busy) {
        c->busy = true;
        uint64_t seq = c->issued++;
        pthread_mutex_unlock(&c->lock);
        int rc = execute(c, op, seq);
        pthread_mutex_lock(&c->lock);
        c->busy = false;
        pthread_cond_signal(&c->work);
        pthread_cond_broadcast(&c->done);
        pthread_mutex_unlock(&c->lock);
        return rc;
    }
    pthread_mutex_unlock(&c->lock);
    coll_request *req;
    int rc = coll__comm_issue(c, op, &req);
    return rc < 0 ? rc : coll_wait(req);
}

/* The progress thread completes requests; there is nothing to advance from outside. */
static void cpu_poll(coll_request *req)
{
    (void)req;
}

static void cpu_wait(coll_request *req)
{
    coll_comm *c = req->comm;
    pthread_mutex_lock(&c->lock);
    while (!req->done)
        pthread_cond_wait(&c->done, &c->lock);
    pthread_mutex_unlock(&c->lock);
}

/* The host runs the operation, so a stream can only be made to wait by waiting here. */
static int cpu_stream_wait(coll_request *req, void *stream)
{
    (void)stream;
    cpu_wait(req);
    return req->result;
}

/* Waits for the queue to empty, for at most the timeout; aborts what is still stuck then. */
static void cpu_drain(coll_comm *c)
{
    int64_t deadline = mono_deadline_ns(c->opts.timeout_ms);
    pthread_mutex_lock(&c->lock);
    while ((c->head || c->busy) && mono_now_ns() < deadline) {
        /* c->done runs on CLOCK_MONOTONIC. */
        struct timespec ts = mono_timespec_at(mono_deadline_ns(1000));
        pthread_cond_timedwait(&c->done, &c->lock, &ts);
    }
    bool stuck = c->head || c->busy;
    pthread_mutex_unlock(&c->lock);
    if (stuck)
        coll_comm_abort(c);
}

static void cpu_abort(coll_comm *c, int culprit)
{
    coll__cpu_abort(c->cpu, culprit);
}

static void cpu_destroy(coll_comm *c)
{
    if (c->thread_started) {
        pthread_mutex_lock(&c->lock);
        c->stopping = true;
        pthread_cond_signal(&c->work);
        pthread_mutex_unlock(&c->lock);
        pthread_join(c->thread, NULL);
    }
    coll__cpu_destroy(c->cpu);
    coll__cuda_host_free(c->stage);
}

static int cpu_nhosts(const coll_comm *c)
{
    return coll__cpu_nhosts(c->cpu);
}

static int cpu_local(const coll_comm *c, int *nlocal)
{
    return coll__cpu_local(c->cpu, nlocal);
}

static const char *cpu_hostname(const coll_comm *c, int rank)
{
    return coll__cpu_hostname(c->cpu, rank);
}

const coll__backend_ops coll__cpu_backend = {
    .init = cpu_init,
    .submit = cpu_submit,
    .run = cpu_run,
    .poll = cpu_poll,
    .wait = cpu_wait,
    .stream_wait = cpu_stream_wait,
    .drain = cpu_drain,
    .abort = cpu_abort,
    .destroy = cpu_destroy,
    .nhosts = cpu_nhosts,
    .local = cpu_local,
    .hostname = cpu_hostname,
    .needs_device = false,
};
