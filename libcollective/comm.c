/*
 * The public API: communicators, argument checks, requests, failure accounting, split, abort;
 * and the generic dispatch to the backend.
 *
 * The backend is a row of the table below (coll__backend_ops, coll_internal.h), chosen once, in
 * coll_comm_init(); the API calls through it and never asks which backend it has. Each row's
 * file says how it runs operations: backend_cpu.c (a queue and a progress thread, inline runs of
 * blocking calls), backend_nccl.c (enqueued on the CUDA stream at issue, a request is an event).
 *
 * Failures. A failed operation leaves the communicator failed: later operations return the same
 * code at once (like NCCL, the communicator must be closed and made again). Before it returns,
 * the rank that saw the failure settles which rank to blame and tells its peers:
 *  - direct evidence (a rank on this host died or did not arrive in time) is written to the
 *    store under "<prefix>/failed" (first writer wins), then the shared-memory segment is marked
 *    aborted and the sockets are shut down, so that every peer stops waiting;
 *  - indirect evidence (a socket to another host's leader closed or timed out: that leader may
 *    itself be waiting for the rank at fault) first waits up to a second for "<prefix>/failed".
 * The decision itself is settle.c's (coll__settle(): evidence in, culprit and code out); this
 * file gathers the evidence, asks the store what coll__settle() asks for, and words the message.
 *
 * Not here: the backends (backend_*.c), the algorithms (cpu.c), NCCL calls (nccl.cu) and the
 * settling rules (settle.c).
 */
#include "coll_internal.h"
#include "errbuf.h"
#include "rdzv.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/*
 * The backends, by coll_backend value: one row per backend_<name>.c. A NULL row is a backend
 * this build does not have (nccl without NCCL); coll_comm_init() refuses it with -ENOTSUP.
 */
static const coll__backend_ops *const backends[] = {
    [COLL_BACKEND_CPU] = &coll__cpu_backend,
#if COLL_HAVE_NCCL
    [COLL_BACKEND_NCCL] = &coll__nccl_backend,
#endif
};
#define NBACKENDS (sizeof backends / sizeof backends[0])

static _Thread_local errbuf init_err; /* coll_last_error(NULL) */

void coll__set_init_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    (void)errbuf_vset(&init_err, 0, fmt, ap);
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
    char line[COLL__ERR_BYTES + 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    c->opts.log(c->opts.log_arg, level, line);
}

/* ------------------------------------------------------------------------------------------ */
/* Failure accounting                                                                          */
/* ------------------------------------------------------------------------------------------ */

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
coll__evidence coll__comm_evidence(const coll_comm *c, const coll__op *op, uint64_t k, int rc,
                                   coll__evkind kind, int guess)
{
    return (coll__evidence){
        .rank = c->rank,
        .world = c->world,
        .k = k,
        .collective = coll__is_collective(op->kind),
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
int coll__comm_fail(coll_comm *c, const coll__op *op, uint64_t seq, coll__evidence ev,
                    const char *detail, int64_t started)
{
    char what[128];
    describe(op, seq, what, sizeof what);
    coll__verdict v = settle(c, &ev);
    int rc = v.code, culprit = v.culprit;
    c->ops->abort(c, culprit);
    logf_(c, COLL_LOG_DEBUG, "%s: failure settled as %s naming rank %d (evidence: %s)", what,
          coll_strerror(rc), culprit, coll__evkind_name(ev.kind));

    char err[COLL__ERR_BYTES];
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
void coll__op_bytes(const coll_comm *c, const coll__op *op, size_t *in, size_t *out)
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
    coll__op_bytes(c, op, &in, &out);
    if ((in && !op->sendbuf) || (out && !op->recvbuf))
        return -EINVAL;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Issuing                                                                                     */
/* ------------------------------------------------------------------------------------------ */

int coll__comm_issue(coll_comm *c, const coll__op *op, coll_request **out)
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
    return coll__comm_issue(c, &OP(COLL__ALLREDUCE, s, r, n, dt, op, 0), req);
}

int coll_ireduce(coll_comm *c, const void *s, void *r, size_t n, coll_dtype dt, coll_op op,
                 int root, coll_request **req)
{
    return coll__comm_issue(c, &OP(COLL__REDUCE, s, r, n, dt, op, root), req);
}

int coll_ibroadcast(coll_comm *c, const void *s, void *r, size_t n, coll_dtype dt, int root,
                    coll_request **req)
{
    return coll__comm_issue(c, &OP(COLL__BROADCAST, s, r, n, dt, COLL_SUM, root), req);
}

int coll_iallgather(coll_comm *c, const void *s, void *r, size_t n, coll_dtype dt,
                    coll_request **req)
{
    return coll__comm_issue(c, &OP(COLL__ALLGATHER, s, r, n, dt, COLL_SUM, 0), req);
}

int coll_ireduce_scatter(coll_comm *c, const void *s, void *r, size_t n, coll_dtype dt, coll_op op,
                         coll_request **req)
{
    return coll__comm_issue(c, &OP(COLL__REDUCE_SCATTER, s, r, n, dt, op, 0), req);
}

int coll_ibarrier(coll_comm *c, coll_request **req)
{
    return coll__comm_issue(c, &OP(COLL__BARRIER, NULL, NULL, 0, COLL_U8, COLL_MAX, 0), req);
}

int coll_isend(coll_comm *c, const void *buf, size_t n, coll_dtype dt, int peer, coll_request **req)
{
    return coll__comm_issue(c, &OP(COLL__SEND, buf, NULL, n, dt, COLL_SUM, peer), req);
}

int coll_irecv(coll_comm *c, void *buf, size_t n, coll_dtype dt, int peer, coll_request **req)
{
    return coll__comm_issue(c, &OP(COLL__RECV, NULL, buf, n, dt, COLL_SUM, peer), req);
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
    char err[COLL__ERR_BYTES] = "";

    errbuf_clear(&init_err);
    if (!opts) {
        coll_options_init(&defaults);
        opts = &defaults;
    }
    if (!store || !prefix || !out || world_size < 1 || rank < 0 || rank >= world_size ||
        (unsigned)backend > COLL_BACKEND_NCCL) {
        coll__set_init_error(
            "coll_comm_init: invalid argument (rank %d, world size %d, backend %d)", rank,
            world_size, (int)backend);
        return -EINVAL;
    }
    if (backend == COLL_BACKEND_AUTO)
        backend = coll_have_nccl() && device >= 0 && coll__cuda_available() ? COLL_BACKEND_NCCL
                                                                            : COLL_BACKEND_CPU;
    const coll__backend_ops *ops = (size_t)backend < NBACKENDS ? backends[backend] : NULL;
    if (!ops) {
        coll__set_init_error("coll_comm_init: this build has no %s backend",
                             coll_backend_name(backend));
        return -ENOTSUP;
    }
    if (ops->needs_device && device < 0) {
        coll__set_init_error("coll_comm_init: the %s backend needs a device (device >= 0)",
                             coll_backend_name(backend));
        return -ENOTSUP;
    }
    c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->ops = ops;
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
    coll__set_init_error("coll_comm_init (%s, rank %d of %d, prefix %s): %s",
                         coll_backend_name(backend), rank, world_size, prefix,
                         err[0] ? err : coll_strerror(rc));
    free_comm(c);
    return rc;
}

void coll_comm_close(coll_comm *c)
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
    errbuf_clear(&init_err);
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
        coll__set_init_error("coll_comm_split: exchanging colors: %s",
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
            coll__set_init_error("coll_comm_split: rank %d's color is malformed", r);
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
    return c ? c->err : init_err.msg;
}

int coll_comm_set_stream(coll_comm *c, void *stream)
{
    if (!c)
        return -EINVAL;
    c->stream = stream;
    return 0;
}
