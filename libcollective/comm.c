/*
 * The public API: communicators, argument checks, requests and the progress thread, failure
 * accounting, split, abort; and staging of device buffers for the cpu backend.
 *
 * The backend is a table of operations (backend_ops) chosen once, in coll_comm_init(); the API
 * calls through it and never asks which backend it has.
 * cpu: requests queue up per communicator and one progress thread runs them in issue order. A
 * blocking call that finds the queue empty and nothing running runs its operation on the
 * calling thread instead (same order, no thread hand-offs on the latency path).
 * nccl: operations are enqueued on the stream at issue; a request is a CUDA event.
 *
 * Failures. A failed operation leaves the communicator failed: later operations return the same
 * code at once (like NCCL, the communicator must be destroyed and made again). Before it returns,
 * the rank that saw the failure settles which rank to blame and tells its peers:
 *  - direct evidence (a rank on this host died or did not arrive in time) is written to the
 *    store under "<prefix>/failed" (first writer wins), then the shared-memory segment is marked
 *    aborted and the sockets are shut down, so that every peer stops waiting;
 *  - indirect evidence (a socket to another host's leader closed or timed out: that leader may
 *    itself be waiting for the rank at fault) first waits up to a second for "<prefix>/failed".
 * The decision itself is settle.c's (coll__settle(): evidence in, culprit and code out); this
 * file gathers the evidence, asks the store what coll__settle() asks for, and words the message.
 *
 * Not here: the algorithms (cpu.c), NCCL calls (nccl.cu) and the settling rules (settle.c).
 */
#include "coll_internal.h"
#include "rdzv.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ERR_BYTES 512

struct coll_request {
    coll_comm *comm;
    coll__op op;
    uint64_t seq;
    uint64_t k; /* nccl: index among the collectives */
    int result;
    bool done;
    void *event;      /* nccl */
    int64_t issued;   /* nccl: when it was enqueued, for messages */
    int64_t deadline; /* nccl */
    coll_request *next;
};

/*
 * A backend as the API drives it, chosen once in coll_comm_init(): nothing outside the two
 * tables below asks which backend a communicator has. The cpu backend runs operations on the
 * calling thread or its progress thread; the nccl backend enqueues them on the CUDA stream at
 * issue and polls their events.
 */
typedef struct backend_ops {
    /* Bootstraps through the store (bounded by deadline); err gets the detail. */
    int (*init)(coll_comm *c, rdzv_client *store, int64_t deadline, char *err, size_t errlen);
    /* Takes a checked request (seq not yet given) and queues or starts it; never fails. */
    void (*submit)(coll_comm *c, coll_request *req);
    /* The blocking form of a checked operation: its result. */
    int (*run)(coll_comm *c, const coll__op *op);
    /* Advances a request without blocking (coll_test); a no-op once it is done. */
    void (*poll)(coll_request *req);
    /* Blocks until the request is done and releases what the backend holds for it. */
    void (*wait)(coll_request *req);
    /* Makes a CUDA stream wait for the request without releasing it: 0 or a failure. */
    int (*stream_wait)(coll_request *req, void *stream);
    /* Before teardown: lets pending operations finish, for at most the timeout. */
    void (*drain)(coll_comm *c);
    /* Makes this rank's failure seen: local waits end, peers see it naming culprit. */
    void (*abort)(coll_comm *c, int culprit);
    /* Frees the backend's state; accepts a half-built communicator. */
    void (*destroy)(coll_comm *c);
    /* Layout: number of hosts, this rank's index on its host (*nlocal: the host's ranks). */
    int (*nhosts)(const coll_comm *c);
    int (*local)(const coll_comm *c, int *nlocal);
    /* The host of rank, for messages ("" unknown). */
    const char *(*hostname)(const coll_comm *c, int rank);
} backend_ops;

struct coll_comm {
    int rank, world, device;
    coll_backend backend;
    const backend_ops *ops;
    coll_options opts;
    char *prefix, *bind_addr;
    rdzv_client *store; /* our own connection; store_lock serialises it */
    pthread_mutex_t store_lock;
    void *stream;

    coll__cpu *cpu; /* cpu backend */
    bool cuda;      /* device buffers possible (CUDA build with a device) */
    void *stage;    /* pinned staging buffer for device buffers */
    size_t stage_bytes;

    coll__nccl *nccl; /* nccl backend */

    pthread_mutex_t lock;
    pthread_cond_t work;       /* the progress thread waits here */
    pthread_cond_t done;       /* waiters for requests (CLOCK_MONOTONIC) */
    coll_request *head, *tail; /* cpu: queued, not yet running */
    bool busy, stopping, thread_started;
    pthread_t thread;
    uint64_t issued;
    uint64_t ncoll; /* collectives started: the index progress is measured in */
    int nsplit;

    _Atomic int aborted;
    _Atomic int failed_rank;
    int sticky; /* first failure, 0 for none */
    char err[ERR_BYTES];
};

static _Thread_local char init_err[ERR_BYTES];

void coll__set_init_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(init_err, sizeof init_err, fmt, ap);
    va_end(ap);
}

void coll_options_init(coll_options *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->timeout_ms = 600000;
}

static void logf_(const coll_comm *c, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void logf_(const coll_comm *c, int level, const char *fmt, ...)
{
    if (!c->opts.log)
        return;
    char line[ERR_BYTES + 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    c->opts.log(c->opts.log_arg, level, line);
}

/* ------------------------------------------------------------------------------------------ */
/* Failure accounting                                                                          */
/* ------------------------------------------------------------------------------------------ */

static bool is_collective(enum coll__kind kind)
{
    return kind != COLL__SEND && kind != COLL__RECV;
}

/*
 * The store I/O of settling, one function per question coll__settle() asks (settle.c decides,
 * these only ask). Each returns the answer's kind and logs a store it cannot reach.
 */

/* Parses "<rank> <code>"; false for anything else. */
static bool parse_failure(const void *val, size_t len, coll__failure *out)
{
    char buf[48];
    int r, k;
    snprintf(buf, sizeof buf, "%.*s", (int)(len < 47 ? len : 47), (const char *)val);
    if (sscanf(buf, "%d %d", &r, &k) != 2)
        return false;
    out->rank = r;
    out->code = k;
    return true;
}

/*
 * Records `mine` under "<prefix>/failed" unless a record is there (the first writer wins) and
 * sets *held to what the store holds afterwards: PRESENT, or UNREACHABLE (*held untouched).
 */
static coll__answer write_record(coll_comm *c, coll__failure mine, coll__failure *held)
{
    char key[512], text[48];
    void *val = NULL;
    size_t len = 0;
    snprintf(key, sizeof key, "%s/failed", c->prefix);
    snprintf(text, sizeof text, "%d %d", mine.rank, mine.code);
    pthread_mutex_lock(&c->store_lock);
    int rc = rdzv_set_once(c->store, key, text, strlen(text), &val, &len);
    if (rc < 0)
        logf_(c, COLL_LOG_WARN, "recording the failure in the store: %s",
              rdzv_client_last_error(c->store));
    pthread_mutex_unlock(&c->store_lock);
    coll__answer a = rc < 0 ? COLL__UNREACHABLE : COLL__PRESENT;
    if (rc >= 0 && !parse_failure(val, len, held))
        *held = mine; /* not a record: ours stands */
    rdzv_free(val);
    return a;
}

/* Waits up to wait_ms (0: a plain check) for the failure record and reads it into *out. */
static coll__answer read_record(coll_comm *c, int wait_ms, coll__failure *out)
{
    char key[512];
    void *val = NULL;
    size_t len = 0;
    snprintf(key, sizeof key, "%s/failed", c->prefix);
    pthread_mutex_lock(&c->store_lock);
    int rc = rdzv_wait_get(c->store, key, wait_ms, &val, &len);
    if (rc < 0 && rc != -ETIMEDOUT)
        logf_(c, COLL_LOG_WARN, "reading the failure record: %s", rdzv_client_last_error(c->store));
    pthread_mutex_unlock(&c->store_lock);
    coll__answer a = rc == -ETIMEDOUT               ? COLL__ABSENT
                     : rc < 0                       ? COLL__UNREACHABLE
                     : parse_failure(val, len, out) ? COLL__PRESENT
                                                    : COLL__ABSENT;
    rdzv_free(val);
    return a;
}

/* Tells the others this rank reached collective number k and failed in it. */
static void publish_progress(coll_comm *c, uint64_t k)
{
    char key[512], val[32];
    snprintf(key, sizeof key, "%s/progress/%d", c->prefix, c->rank);
    snprintf(val, sizeof val, "%" PRIu64, k);
    pthread_mutex_lock(&c->store_lock);
    rdzv_set(c->store, key, val, strlen(val));
    pthread_mutex_unlock(&c->store_lock);
}

/* "<k>" as published by publish_progress(), clamped to int64_t. */
static int64_t parse_progress(const void *val, size_t len)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%.*s", (int)(len < 31 ? len : 31), (const char *)val);
    unsigned long long v = strtoull(buf, NULL, 10);
    return v > INT64_MAX ? INT64_MAX : (int64_t)v;
}

/*
 * Waits up to wait_ms for every rank's "<prefix>/progress/<r>" and reads them into
 * progress[world] (rdzv_gather(), which after a timeout still returns what was published): the
 * published index, or COLL__PROGRESS_ABSENT (still missing). PRESENT, or UNREACHABLE (the store
 * did not answer, or out of memory).
 */
static coll__answer read_progress(coll_comm *c, int wait_ms, int64_t *progress)
{
    char where[512];
    snprintf(where, sizeof where, "%s/progress", c->prefix);
    void **vals = calloc((size_t)c->world, sizeof *vals);
    size_t *lens = calloc((size_t)c->world, sizeof *lens);
    coll__answer a = COLL__UNREACHABLE;
    if (!vals || !lens)
        goto out;
    pthread_mutex_lock(&c->store_lock);
    int rc = rdzv_gather(c->store, where, c->world, wait_ms, vals, lens, NULL);
    pthread_mutex_unlock(&c->store_lock);
    if (rc < 0 && rc != -ETIMEDOUT)
        goto out;
    a = COLL__PRESENT;
    for (int r = 0; r < c->world; r++)
        progress[r] = lens[r] == 0 ? COLL__PROGRESS_ABSENT : parse_progress(vals[r], lens[r]);
out:
    for (int r = 0; vals && r < c->world; r++)
        rdzv_free(vals[r]);
    free(vals);
    free(lens);
    return a;
}

/*
 * Settles ev with the other ranks: answers coll__settle()'s questions through the store until
 * it gives its verdict.
 */
static coll__verdict settle(coll_comm *c, coll__evidence *ev)
{
    int64_t *progress = NULL;
    coll__verdict v;
    coll__settle_step step;
    while ((step = coll__settle(ev, &v)) != COLL__SETTLE_DONE) {
        switch (step) {
        case COLL__SETTLE_PUBLISH:
            publish_progress(c, ev->k);
            ev->published = true;
            break;
        case COLL__SETTLE_READ_RECORD:
            ev->record = read_record(c, v.wait_ms, &ev->found);
            break;
        case COLL__SETTLE_READ_PROGRESS:
            progress = malloc((size_t)c->world * sizeof *progress);
            ev->progress = progress ? read_progress(c, v.wait_ms, progress) : COLL__UNREACHABLE;
            ev->progress_of = progress;
            break;
        case COLL__SETTLE_WRITE_RECORD:
            ev->written = write_record(c, (coll__failure){v.culprit, v.code}, &ev->held);
            break;
        case COLL__SETTLE_DONE:
            break;
        }
    }
    free(progress);
    return v;
}

static void describe(const coll__op *op, uint64_t seq, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s #%" PRIu64 " (%zu x %s)", coll__kind_name(op->kind), seq, op->count,
             coll_dtype_name(op->dtype));
}

/*
 * The sentence coll_last_error() gives for operation `what` that failed with `rc` blaming
 * `culprit` (on `host`, "" unknown) after `ms`; `detail` is the failed call's own account.
 */
static void failure_message(const coll_comm *c, char *err, size_t cap, const char *what, int rc,
                            int culprit, const char *host, long ms, const char *detail)
{
    char who[160] = "";
    if (culprit >= 0)
        snprintf(who, sizeof who, "rank %d%s%.64s", culprit, host[0] ? " on host " : "", host);
    if (rc == -ECANCELED && culprit == c->rank)
        snprintf(err, cap, "%s: communicator aborted", what);
    else if (rc == -ETIMEDOUT)
        snprintf(err, cap,
                 "%s timed out after %ld ms: %s did not take part within the %d ms"
                 " timeout",
                 what, ms, culprit >= 0 ? who : "a peer", c->opts.timeout_ms);
    else if (rc == COLL_EREMOTE)
        snprintf(err, cap, "%s failed after %ld ms: %s died or aborted", what, ms,
                 culprit >= 0 ? who : "a peer");
    else
        snprintf(err, cap, "%s failed: %s%s%.200s%s%s", what, coll_strerror(rc),
                 detail && detail[0] ? ": " : "", detail ? detail : "", who[0] ? "; peer " : "",
                 who);
}

/* The evidence of a failure of op (index k among the collectives) with code rc, naming guess. */
static coll__evidence evidence(const coll_comm *c, const coll__op *op, uint64_t k, int rc,
                               coll__evkind kind, int guess)
{
    return (coll__evidence){
        .rank = c->rank,
        .world = c->world,
        .k = k,
        .collective = is_collective(op->kind),
        .rc = rc,
        .aborted = atomic_load(&c->aborted) != 0,
        .kind = kind,
        .guess = guess,
        .segment_culprit = -1,
    };
}

/*
 * A failed operation: settles its culprit and code (from the local evidence the caller
 * gathered, and through the store), tells the peers, and makes the failure sticky. Runs on the
 * thread that ran the operation.
 */
static int fail(coll_comm *c, const coll__op *op, uint64_t seq, coll__evidence ev,
                const char *detail, int64_t started)
{
    char what[128];
    describe(op, seq, what, sizeof what);
    coll__verdict v = settle(c, &ev);
    int rc = v.code, culprit = v.culprit;
    c->ops->abort(c, culprit);
    logf_(c, COLL_LOG_DEBUG, "%s: failure settled as %s naming rank %d (evidence: %s)", what,
          coll_strerror(rc), culprit, coll__evkind_name(ev.kind));

    char err[ERR_BYTES];
    failure_message(c, err, sizeof err, what, rc, culprit,
                    culprit >= 0 ? c->ops->hostname(c, culprit) : "",
                    (long)((mono_now_ns() - started) / 1000000), detail);
    pthread_mutex_lock(&c->lock);
    if (!c->sticky) {
        c->sticky = rc;
        atomic_store(&c->failed_rank, culprit);
        memcpy(c->err, err, sizeof err);
    }
    pthread_mutex_unlock(&c->lock);
    logf_(c, COLL_LOG_ERROR, "%s", err);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Arguments                                                                                   */
/* ------------------------------------------------------------------------------------------ */

/* Bytes the operation reads from sendbuf and writes to recvbuf on this rank. */
static void op_bytes(const coll_comm *c, const coll__op *op, size_t *in, size_t *out)
{
    size_t n = op->count * coll_dtype_size(op->dtype), w = (size_t)c->world;
    *in = *out = 0;
    switch (op->kind) {
    case COLL__ALLREDUCE:
        *in = *out = n;
        break;
    case COLL__REDUCE:
        *in = n;
        *out = op->peer == c->rank ? n : 0;
        break;
    case COLL__BROADCAST:
        *in = op->peer == c->rank ? n : 0;
        *out = n;
        break;
    case COLL__ALLGATHER:
        *in = n;
        *out = n * w;
        break;
    case COLL__REDUCE_SCATTER:
        *in = n * w;
        *out = n;
        break;
    case COLL__SEND:
        *in = n;
        break;
    case COLL__RECV:
        *out = n;
        break;
    case COLL__BARRIER:
        break;
    }
}

static int check_op(const coll_comm *c, const coll__op *op)
{
    size_t esz = coll_dtype_size(op->dtype);
    if (!c || (unsigned)op->dtype >= COLL_DTYPE_COUNT || (unsigned)op->op >= COLL_OP_COUNT)
        return -EINVAL;
    if (op->count > SIZE_MAX / esz / (size_t)c->world)
        return -EINVAL;
    bool rooted = op->kind == COLL__REDUCE || op->kind == COLL__BROADCAST ||
                  op->kind == COLL__SEND || op->kind == COLL__RECV;
    if (rooted && (op->peer < 0 || op->peer >= c->world))
        return -EINVAL;
    if ((op->kind == COLL__SEND || op->kind == COLL__RECV) && op->peer == c->rank)
        return -EINVAL;
    if (op->count == 0 || op->kind == COLL__BARRIER)
        return 0;
    size_t in, out;
    op_bytes(c, op, &in, &out);
    if ((in && !op->sendbuf) || (out && !op->recvbuf))
        return -EINVAL;
    return 0;
}

static int issue(coll_comm *c, const coll__op *op, coll_request **out);

/* ------------------------------------------------------------------------------------------ */
/* The cpu backend: a queue, a progress thread, and inline runs of blocking calls               */
/* ------------------------------------------------------------------------------------------ */

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
    op_bytes(c, op, &nin, &nout);
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
    if (is_collective(op->kind))
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
        coll__evidence ev = evidence(c, op, k, rc, kind, culprit);
        ev.segment_culprit = coll__cpu_segment_culprit(c->cpu);
        rc = fail(c, op, seq, ev, detail, started);
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
    int rc = issue(c, op, &req);
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

static const backend_ops cpu_ops = {
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
};

/* ------------------------------------------------------------------------------------------ */
/* The nccl backend: operations enqueued on the stream at issue, requests are events            */
/* ------------------------------------------------------------------------------------------ */

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
    return evidence(c, &req->op, req->k, rc,
                    rc == COLL_EREMOTE ? COLL__EV_CLOSED : COLL__EV_TIMEOUT, -1);
}

/* Enqueues the operation on the stream; a failure to enqueue completes the request failed. */
static void nccl_submit(coll_comm *c, coll_request *req)
{
    char detail[256] = "";
    pthread_mutex_lock(&c->lock);
    req->seq = c->issued++;
    req->k = c->ncoll;
    if (is_collective(req->op.kind))
        c->ncoll++;
    req->issued = mono_now_ns();
    req->deadline = mono_deadline_ns(c->opts.timeout_ms);
    int sticky = c->sticky;
    int rc = sticky ? sticky
                    : coll__nccl_start(c->nccl, &req->op, c->stream, req->deadline, &req->event,
                                       detail, sizeof detail);
    pthread_mutex_unlock(&c->lock);
    if (rc < 0 && !sticky)
        rc = fail(c, &req->op, req->seq, nccl_evidence(c, req, rc), detail, req->issued);
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
        req->result = fail(c, &req->op, req->seq, nccl_evidence(c, req, rc), detail, req->issued);
        return 1;
    }
    if (rc == 0 && mono_now_ns() >= req->deadline) {
        req->result =
            fail(c, &req->op, req->seq,
                 evidence(c, &req->op, req->k, -ETIMEDOUT, COLL__EV_TIMEOUT, -1), "", req->issued);
        return 1;
    }
    if (rc == 1)
        req->result = 0;
    return rc;
}

static int nccl_run(coll_comm *c, const coll__op *op)
{
    coll_request *req;
    int rc = issue(c, op, &req);
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

static const backend_ops nccl_ops = {
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
};

/* ------------------------------------------------------------------------------------------ */
/* Issuing                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static int issue(coll_comm *c, const coll__op *op, coll_request **out)
{
    int rc = check_op(c, op);
    if (rc < 0 || !out)
        return rc < 0 ? rc : -EINVAL;
    if (atomic_load(&c->aborted))
        return -ECANCELED;
    coll_request *req = calloc(1, sizeof *req);
    if (!req)
        return -ENOMEM;
    req->comm = c;
    req->op = *op;
    c->ops->submit(c, req);
    *out = req;
    return 0;
}

static int run_blocking(coll_comm *c, const coll__op *op)
{
    int rc = check_op(c, op);
    return rc < 0 ? rc : c->ops->run(c, op);
}

int coll_test(coll_request *req, bool *done)
{
    if (!req || !done)
        return -EINVAL;
    coll_comm *c = req->comm;
    c->ops->poll(req);
    pthread_mutex_lock(&c->lock);
    *done = req->done;
    int rc = req->done ? req->result : 0;
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int coll_wait(coll_request *req)
{
    if (!req)
        return -EINVAL;
    req->comm->ops->wait(req);
    int rc = req->result;
    free(req);
    return rc;
}

int coll_request_stream_wait(coll_request *req, void *stream)
{
    if (!req)
        return -EINVAL;
    return req->comm->ops->stream_wait(req, stream);
}

#define OP(...) ((coll__op){__VA_ARGS__})

int coll_iallreduce(coll_comm *c, const void *s, void *r, size_t n, coll_dtype dt, coll_op op,
                    coll_request **req)
{
    return issue(c, &OP(COLL__ALLREDUCE, s, r, n, dt, op, 0), req);
}

int coll_ireduce(coll_comm *c, const void *s, void *r, size_t n, coll_dtype dt, coll_op op,
                 int root, coll_request **req)
{
    return issue(c, &OP(COLL__REDUCE, s, r, n, dt, op, root), req);
}

int coll_ibroadcast(coll_comm *c, const void *s, void *r, size_t n, coll_dtype dt, int root,
                    coll_request **req)
{
    return issue(c, &OP(COLL__BROADCAST, s, r, n, dt, COLL_SUM, root), req);
}

int coll_iallgather(coll_comm *c, const void *s, void *r, size_t n, coll_dtype dt,
                    coll_request **req)
{
    return issue(c, &OP(COLL__ALLGATHER, s, r, n, dt, COLL_SUM, 0), req);
}

int coll_ireduce_scatter(coll_comm *c, const void *s, void *r, size_t n, coll_dtype dt, coll_op op,
                         coll_request **req)
{
    return issue(c, &OP(COLL__REDUCE_SCATTER, s, r, n, dt, op, 0), req);
}

int coll_ibarrier(coll_comm *c, coll_request **req)
{
    return issue(c, &OP(COLL__BARRIER, NULL, NULL, 0, COLL_U8, COLL_MAX, 0), req);
}

int coll_isend(coll_comm *c, const void *buf, size_t n, coll_dtype dt, int peer, coll_request **req)
{
    return issue(c, &OP(COLL__SEND, buf, NULL, n, dt, COLL_SUM, peer), req);
}

int coll_irecv(coll_comm *c, void *buf, size_t n, coll_dtype dt, int peer, coll_request **req)
{
    return issue(c, &OP(COLL__RECV, NULL, buf, n, dt, COLL_SUM, peer), req);
}

int coll_allreduce(coll_comm *c, const void *s, void *r, size_t n, coll_dtype dt, coll_op op)
{
    return run_blocking(c, &OP(COLL__ALLREDUCE, s, r, n, dt, op, 0));
}

int coll_reduce(coll_comm *c, const void *s, void *r, size_t n, coll_dtype dt, coll_op op, int root)
{
    return run_blocking(c, &OP(COLL__REDUCE, s, r, n, dt, op, root));
}

int coll_broadcast(coll_comm *c, const void *s, void *r, size_t n, coll_dtype dt, int root)
{
    return run_blocking(c, &OP(COLL__BROADCAST, s, r, n, dt, COLL_SUM, root));
}

int coll_allgather(coll_comm *c, const void *s, void *r, size_t n, coll_dtype dt)
{
    return run_blocking(c, &OP(COLL__ALLGATHER, s, r, n, dt, COLL_SUM, 0));
}

int coll_reduce_scatter(coll_comm *c, const void *s, void *r, size_t n, coll_dtype dt, coll_op op)
{
    return run_blocking(c, &OP(COLL__REDUCE_SCATTER, s, r, n, dt, op, 0));
}

int coll_barrier(coll_comm *c)
{
    return run_blocking(c, &OP(COLL__BARRIER, NULL, NULL, 0, COLL_U8, COLL_MAX, 0));
}

int coll_send(coll_comm *c, const void *buf, size_t n, coll_dtype dt, int peer)
{
    return run_blocking(c, &OP(COLL__SEND, buf, NULL, n, dt, COLL_SUM, peer));
}

int coll_recv(coll_comm *c, void *buf, size_t n, coll_dtype dt, int peer)
{
    return run_blocking(c, &OP(COLL__RECV, NULL, buf, n, dt, COLL_SUM, peer));
}

/* ------------------------------------------------------------------------------------------ */
/* Communicators                                                                               */
/* ------------------------------------------------------------------------------------------ */

static void free_comm(coll_comm *c)
{
    if (!c)
        return;
    c->ops->destroy(c);
    rdzv_client_close(c->store);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->store_lock);
    pthread_cond_destroy(&c->work);
    pthread_cond_destroy(&c->done);
    free(c->prefix);
    free(c->bind_addr);
    free(c);
}

/*
 * The communicator's keys live under RDZV_PRIVATE_COLL_ROOT "<prefix>": on a store with a token
 * only the job's authenticated connections may read or replace them (NCCL unique ids, CPU
 * addresses, failure records). A prefix already there (coll_comm_split()'s) is kept as it is.
 * Returns a malloc'd string, or NULL.
 */
static char *store_prefix(const char *prefix)
{
    const char *root = RDZV_PRIVATE_COLL_ROOT;
    if (strncmp(prefix, root, strlen(root)) == 0)
        return strdup(prefix);
    size_t n = strlen(root) + strlen(prefix) + 1;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s%s", root, prefix);
    return p;
}

int coll_comm_init(struct rdzv_client *store, const char *prefix, int rank, int world_size,
                   coll_backend backend, int device, const coll_options *opts, coll_comm **out)
{
    coll_options defaults;
    coll_comm *c = NULL;
    int rc;
    char err[ERR_BYTES] = "";

    init_err[0] = 0;
    if (!opts) {
        coll_options_init(&defaults);
        opts = &defaults;
    }
    if (!store || !prefix || !out || world_size < 1 || rank < 0 || rank >= world_size ||
        (unsigned)backend > COLL_BACKEND_NCCL) {
        snprintf(init_err, sizeof init_err,
                 "coll_comm_init: invalid argument (rank %d, world size %d, backend %d)", rank,
                 world_size, (int)backend);
        return -EINVAL;
    }
    if (backend == COLL_BACKEND_AUTO)
        backend = coll_have_nccl() && device >= 0 && coll__cuda_available() ? COLL_BACKEND_NCCL
                                                                            : COLL_BACKEND_CPU;
    if (backend == COLL_BACKEND_NCCL && (!coll_have_nccl() || device < 0)) {
        snprintf(init_err, sizeof init_err, "coll_comm_init: the nccl backend needs %s",
                 coll_have_nccl() ? "a device (device >= 0)" : "a build with NCCL");
        return -ENOTSUP;
    }
    c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->ops = backend == COLL_BACKEND_NCCL ? &nccl_ops : &cpu_ops;
    pthread_condattr_t monotonic;
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->store_lock, NULL);
    pthread_cond_init(&c->work, NULL);
    pthread_cond_init(&c->done, &monotonic);
    pthread_condattr_destroy(&monotonic);
    atomic_init(&c->aborted, 0);
    atomic_init(&c->failed_rank, -1);
    c->rank = rank;
    c->world = world_size;
    c->device = device;
    c->backend = backend;
    c->opts = *opts;
    c->prefix = store_prefix(prefix);
    c->bind_addr = opts->bind_addr ? strdup(opts->bind_addr) : NULL;
    c->opts.bind_addr = c->bind_addr;
    if (!c->prefix || (opts->bind_addr && !c->bind_addr)) {
        rc = -ENOMEM;
        goto out;
    }
    int64_t deadline = mono_deadline_ns(opts->timeout_ms);
    if ((rc = rdzv_client_dup(store, &c->store)) < 0) {
        snprintf(err, sizeof err, "opening a store connection: %s", rdzv_client_last_error(NULL));
        goto out;
    }
    if ((rc = c->ops->init(c, store, deadline, err, sizeof err)) < 0)
        goto out;
    *out = c;
    return 0;
out:
    snprintf(init_err, sizeof init_err, "coll_comm_init (%s, rank %d of %d, prefix %s): %s",
             coll_backend_name(backend), rank, world_size, prefix,
             err[0] ? err : coll_strerror(rc));
    free_comm(c);
    return rc;
}

void coll_comm_destroy(coll_comm *c)
{
    if (!c)
        return;
    c->ops->drain(c);
    free_comm(c);
}

int coll_comm_abort(coll_comm *c)
{
    if (!c)
        return -EINVAL;
    if (atomic_exchange(&c->aborted, 1))
        return 0;
    /* Peers that see the segment or the sockets fail read who did it here. */
    coll__failure held;
    (void)write_record(c, (coll__failure){c->rank, COLL_EREMOTE}, &held);
    c->ops->abort(c, c->rank);
    return 0;
}

int coll_comm_split(coll_comm *c, int color, int key, coll_comm **out)
{
    init_err[0] = 0;
    if (!c || !out || (color < 0 && color != COLL_SPLIT_NOCOLOR))
        return -EINVAL;
    /* Pending operations first: the split must not overtake them. */
    pthread_mutex_lock(&c->lock);
    while (c->head || c->busy)
        pthread_cond_wait(&c->done, &c->lock);
    int n = c->nsplit++;
    pthread_mutex_unlock(&c->lock);

    char k[512], v[64], where[512];
    int rc = -ENOMEM, newrank = 0, newworld = 0;
    bool gathered = false;
    void **vals = calloc((size_t)c->world, sizeof *vals);
    size_t *lens = calloc((size_t)c->world, sizeof *lens);
    if (!vals || !lens)
        goto out;
    snprintf(where, sizeof where, "%s/split/%d", c->prefix, n);
    snprintf(v, sizeof v, "%d %d", color, key);
    pthread_mutex_lock(&c->store_lock);
    rc = rdzv_allgather(c->store, where, c->rank, c->world, v, strlen(v), c->opts.timeout_ms, vals,
                        lens, NULL);
    /* On a timeout the helper's account names the missing ranks, as everywhere in the project. */
    if (rc < 0)
        snprintf(init_err, sizeof init_err, "coll_comm_split: exchanging colors: %s",
                 rdzv_client_last_error(c->store));
    pthread_mutex_unlock(&c->store_lock);
    gathered = rc == 0;
    if (rc < 0)
        goto out;
    for (int r = 0; r < c->world; r++) {
        int rc_color, rkey;
        char buf[64];
        snprintf(buf, sizeof buf, "%.*s", (int)(lens[r] < 63 ? lens[r] : 63), (char *)vals[r]);
        if (sscanf(buf, "%d %d", &rc_color, &rkey) != 2) {
            rc = -EPROTO;
            snprintf(init_err, sizeof init_err, "coll_comm_split: rank %d's color is malformed", r);
            goto out;
        }
        if (rc_color != color || color == COLL_SPLIT_NOCOLOR)
            continue;
        newworld++;
        if (rkey < key || (rkey == key && r < c->rank))
            newrank++;
    }
    if (color == COLL_SPLIT_NOCOLOR) {
        *out = NULL;
        goto out;
    }
    snprintf(k, sizeof k, "%s/split/%d/c%d", c->prefix, n, color);
    pthread_mutex_lock(&c->store_lock);
    rc = coll_comm_init(c->store, k, newrank, newworld, c->backend, c->device, &c->opts, out);
    pthread_mutex_unlock(&c->store_lock);
out:
    for (int r = 0; gathered && r < c->world; r++)
        rdzv_free(vals[r]);
    free(vals);
    free(lens);
    return rc;
}

int coll_comm_rank(const coll_comm *c)
{
    return c ? c->rank : -1;
}

int coll_comm_size(const coll_comm *c)
{
    return c ? c->world : -1;
}

coll_backend coll_comm_backend(const coll_comm *c)
{
    return c ? c->backend : COLL_BACKEND_AUTO;
}

int coll_comm_nhosts(const coll_comm *c)
{
    return c ? c->ops->nhosts(c) : -1;
}

int coll_comm_local_rank(const coll_comm *c)
{
    int n;
    return c ? c->ops->local(c, &n) : -1;
}

int coll_comm_local_size(const coll_comm *c)
{
    int n = 1;
    if (!c)
        return -1;
    (void)c->ops->local(c, &n);
    return n;
}

int coll_comm_failed_rank(const coll_comm *c)
{
    return c ? atomic_load(&c->failed_rank) : -1;
}

const char *coll_last_error(const coll_comm *c)
{
    return c ? c->err : init_err;
}

int coll_comm_set_stream(coll_comm *c, void *stream)
{
    if (!c)
        return -EINVAL;
    c->stream = stream;
    return 0;
}
