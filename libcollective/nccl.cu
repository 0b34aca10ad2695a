/*
 * The nccl backend: one NCCL communicator per coll_comm, bootstrapped through the store, and a
 * watchdog thread that turns NCCL's asynchronous errors into an abort and a recorded error.
 *
 * nvcc compiles this file as C++, but it is written as C: no exceptions, no classes, no C++
 * library; the extern "C" linkage of the coll__nccl_* functions comes from coll_internal.h.
 * It holds host code only (no kernels). It never prints; failures go to the caller's err buffer.
 *
 * The watchdog also bounds every operation on the device: each started operation's event is
 * listed with its deadline, and one still not done at its deadline aborts the communicator
 * (which ends NCCL's kernels) and fails as -ETIMEDOUT. NCCL reports no error when a peer on the
 * same host dies (its kernels spin on shared memory), so without this a host thread blocked in
 * cudaStreamSynchronize() behind such an operation would wait forever.
 *
 * The communicator is created non-blocking (config.blocking = 0), so every NCCL call may return
 * ncclInProgress, after which the communicator's state is polled with ncclCommGetAsyncError
 * until it leaves ncclInProgress, as NCCL's documentation prescribes; this is what lets init be
 * bounded by a deadline and lets an abort interrupt an enqueue. An enqueue is bounded by the
 * communicator's timeout (taken from init's deadline): one still in progress after it aborts the
 * communicator and fails with -ETIMEDOUT, since a communicator stuck there is unusable.
 *
 * Invariants: n->mu is held across every NCCL call that uses n->comm, and n->comm is set to NULL
 * (under n->mu) by whoever calls ncclCommAbort or ncclCommDestroy on it, so the handle is never
 * used after it is freed. NCCL and CUDA result codes are translated to COLL_ENCCL / COLL_ECUDA
 * here and nowhere else, with ncclGetErrorString / ncclGetLastError / cudaGetErrorString in the
 * detail. Events are created and destroyed with the communicator's device current on the calling
 * thread, so that no stray context is created on device 0.
 *
 * Needs NCCL 2.14 or later (ncclCommInitRankConfig with ncclConfig_t.blocking, ncclInProgress,
 * ncclCommFinalize); meson.build reads nccl.h's version and leaves this file out below that.
 *
 * Not done here: argument validation (comm.c validates at the public entry points), ordering of
 * operations (backend_nccl.c enqueues them one at a time, in issue order), user buffer registration, ncclCommSplit (splits
 * make fresh communicators through the store).
 */
#include "coll_internal.h"
#include "rdzv.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WATCHDOG_PERIOD_MS 100
#define DETAIL_LEN 512

typedef struct nccl_event nccl_event;

struct coll__nccl {
    ncclComm_t comm; /* NULL once aborted or destroyed; guarded by mu */
    int device;
    int rank, world;
    float *barrier_buf; /* one float of device memory, the payload of barriers */
    int64_t timeout_ns; /* the init's timeout, bounding enqueues and finalize; < 0: none */
    int abort_req;      /* set (atomically) by coll__nccl_abort before it takes mu */
    pthread_mutex_t mu; /* guards everything below and every NCCL call on comm */
    pthread_cond_t cv;  /* wakes the watchdog for stop or abort */
    bool sync_init;     /* mu and cv were initialised */
    bool stop;          /* destroy asks the watchdog to exit */
    bool aborted;       /* ncclCommAbort was called */
    bool watchdog_running;
    pthread_t watchdog;
    ncclResult_t error;  /* the asynchronous error the watchdog saw; ncclSuccess if none */
    bool timed_out;      /* the watchdog aborted because an operation passed its deadline */
    nccl_event *pending; /* started operations not yet seen done, for the watchdog */
    char detail[DETAIL_LEN];
};

/*
 * An operation's completion marker: the event, the device it belongs to, and (while listed in
 * n->pending, under n->mu) the deadline the watchdog holds it to.
 */
struct nccl_event {
    cudaEvent_t ev;
    int device;
    enum coll__kind kind;
    int64_t deadline_ns;
    coll__nccl *n;                  /* NULL once the communicator is destroyed */
    bool listed;                    /* in n->pending */
    struct nccl_event *prev, *next; /* n->pending */
};

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                      */
/* ------------------------------------------------------------------------------------------ */

__attribute__((format(printf, 3, 4))) static void put_err(char *err, size_t errlen, const char *fmt,
                                                          ...)
{
    va_list ap;

    if (err == NULL || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* The one place NCCL results become COLL_ENCCL. comm may be NULL (ncclGetLastError ignores it). */
static int nccl_fail(char *err, size_t errlen, const char *what, ncclResult_t r, ncclComm_t comm)
{
    const char *last = ncclGetLastError(comm);

    put_err(err, errlen, "%s: %s%s%s", what, ncclGetErrorString(r),
            last != NULL && last[0] != '\0' ? ": " : "", last != NULL ? last : "");
    return COLL_ENCCL;
}

/* The one place CUDA results become COLL_ECUDA; clears a non-sticky error for later calls. */
static int cuda_fail(char *err, size_t errlen, const char *what, cudaError_t e)
{
    put_err(err, errlen, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    (void)cudaGetLastError();
    return COLL_ECUDA;
}

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static int load_flag(const int *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

/* Backs off between polls of a communicator's state: yields first, then naps 100 us. */
static void poll_pause(unsigned i)
{
    struct timespec ts = {0, 100 * 1000};

    if (i < 64)
        sched_yield();
    else
        nanosleep(&ts, NULL);
}

/*
 * Polls comm until its state leaves ncclInProgress. Returns that state (ncclSuccess or the
 * error), or ncclInProgress when the deadline passed or *abort_req was set first. Callers that
 * share the communicator hold its mutex.
 */
static ncclResult_t wait_ready(ncclComm_t comm, int64_t deadline_ns, const int *abort_req)
{
    for (unsigned i = 0;; i++) {
        ncclResult_t state = ncclInProgress;
        ncclResult_t r = ncclCommGetAsyncError(comm, &state);

        if (r != ncclSuccess)
            return r;
        if (state != ncclInProgress)
            return state;
        if ((abort_req != NULL && load_flag(abort_req)) || mono_now_ns() >= deadline_ns)
            return ncclInProgress;
        poll_pause(i);
    }
}

/* Makes the communicator's device current on this thread when it is not already. */
static cudaError_t use_device(int device)
{
    int cur = -1;

    if (cudaGetDevice(&cur) == cudaSuccess && cur == device)
        return cudaSuccess;
    return cudaSetDevice(device);
}

static int dtype_map(coll_dtype dtype, ncclDataType_t *out)
{
    switch (dtype) {
    case COLL_F32:
        *out = ncclFloat32;
        return 0;
    case COLL_F64:
        *out = ncclFloat64;
        return 0;
    case COLL_F16:
        *out = ncclFloat16;
        return 0;
    case COLL_BF16:
        *out = ncclBfloat16;
        return 0;
    case COLL_I32:
        *out = ncclInt32;
        return 0;
    case COLL_I64:
        *out = ncclInt64;
        return 0;
    case COLL_U8:
        *out = ncclUint8;
        return 0;
    default:
        return -EINVAL;
    }
}

static int op_map(coll_op op, ncclRedOp_t *out)
{
    switch (op) {
    case COLL_SUM:
        *out = ncclSum;
        return 0;
    case COLL_AVG:
        *out = ncclAvg;
        return 0;
    case COLL_MAX:
        *out = ncclMax;
        return 0;
    case COLL_MIN:
        *out = ncclMin;
        return 0;
    case COLL_PROD:
        *out = ncclProd;
        return 0;
    default:
        return -EINVAL;
    }
}

static const char *kind_label(enum coll__kind kind)
{
    switch (kind) {
    case COLL__ALLREDUCE:
        return "ncclAllReduce";
    case COLL__REDUCE:
        return "ncclReduce";
    case COLL__BROADCAST:
        return "ncclBroadcast";
    case COLL__ALLGATHER:
        return "ncclAllGather";
    case COLL__REDUCE_SCATTER:
        return "ncclReduceScatter";
    case COLL__BARRIER:
        return "ncclAllReduce (barrier)";
    case COLL__SEND:
        return "ncclSend";
    case COLL__RECV:
        return "ncclRecv";
    }
    return "?";
}

/* Aborts the communicator once; caller holds n->mu. */
static void abort_locked(coll__nccl *n)
{
    if (n->comm != NULL) {
        (void)ncclCommAbort(n->comm);
        n->comm = NULL;
        n->aborted = true;
    }
    pthread_cond_broadcast(&n->cv);
}

/*
 * NCCL's results for a failure outside this process: a peer's connection broke or it reported
 * an error (ncclRemoteError), or a socket or system call failed talking to it (ncclSystemError).
 */
static bool remote_error(ncclResult_t r)
{
    return r == ncclRemoteError || r == ncclSystemError;
}

/*
 * What an operation of an aborted communicator fails with (by the watchdog on an NCCL error or
 * a deadline, by coll__nccl_abort() or by a timed-out enqueue), or 0 while it is not aborted;
 * caller holds n->mu. Past a deadline it is -ETIMEDOUT and after an asynchronous error from a
 * peer COLL_EREMOTE, so that the caller settles which rank to blame; otherwise COLL_ENCCL.
 */
static int failed_locked(const coll__nccl *n, char *err, size_t errlen)
{
    if (n->timed_out) {
        put_err(err, errlen, "%s", n->detail);
        return -ETIMEDOUT;
    }
    if (n->error != ncclSuccess) {
        put_err(err, errlen, "%s", n->detail);
        return remote_error(n->error) ? COLL_EREMOTE : COLL_ENCCL;
    }
    if (n->aborted || n->comm == NULL) {
        put_err(err, errlen, "the NCCL communicator was aborted");
        return COLL_ENCCL;
    }
    return 0;
}

/* Takes ev off n->pending; caller holds n->mu. */
static void unlist_locked(coll__nccl *n, nccl_event *ev)
{
    if (!ev->listed)
        return;
    if (ev->prev != NULL)
        ev->prev->next = ev->next;
    else
        n->pending = ev->next;
    if (ev->next != NULL)
        ev->next->prev = ev->prev;
    ev->prev = ev->next = NULL;
    ev->listed = false;
}

/*
 * The watchdog's look at the pending operations; caller holds n->mu. Drops those done; aborts
 * the communicator when one is still running at its deadline.
 */
static void check_deadlines_locked(coll__nccl *n)
{
    int64_t now = mono_now_ns();
    nccl_event *ev = n->pending;

    while (ev != NULL && n->comm != NULL) {
        nccl_event *next = ev->next;
        cudaError_t e = cudaEventQuery(ev->ev);

        if (e == cudaSuccess) {
            unlist_locked(n, ev);
        } else if (e != cudaErrorNotReady) {
            (void)cudaGetLastError(); /* coll__nccl_query() reports it to the waiter */
        } else if (now >= ev->deadline_ns) {
            n->timed_out = true;
            put_err(n->detail, sizeof n->detail,
                    "%s did not complete on the device by its deadline; the NCCL communicator "
                    "was aborted",
                    kind_label(ev->kind));
            abort_locked(n);
        }
        ev = next;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Watchdog                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/*
 * Every WATCHDOG_PERIOD_MS while the communicator lives: ask NCCL for an asynchronous error
 * (a peer's socket closed, a remote rank failed, ...), and look for an operation past its
 * deadline. On either, record it and abort, which also makes NCCL's kernels stop, so the stream
 * does not hang on a dead peer. Exits after an abort or when destroy sets stop.
 */
static void *watchdog_main(void *arg)
{
    coll__nccl *n = (coll__nccl *)arg;

    /* ncclCommAbort may touch the device; never let it default to device 0. */
    (void)cudaSetDevice(n->device);
    (void)cudaGetLastError();

    pthread_mutex_lock(&n->mu);
    while (!n->stop && n->comm != NULL) {
        struct timespec ts = mono_timespec_at(mono_deadline_ns(WATCHDOG_PERIOD_MS));
        ncclResult_t state = ncclSuccess;
        ncclResult_t r;

        pthread_cond_timedwait(&n->cv, &n->mu, &ts); /* n->cv runs on CLOCK_MONOTONIC */
        if (n->stop || n->comm == NULL)
            break;

        r = ncclCommGetAsyncError(n->comm, &state);
        if (r != ncclSuccess)
            state = r;
        if (state == ncclSuccess || state == ncclInProgress) {
            check_deadlines_locked(n);
            continue;
        }
        if (n->error == ncclSuccess) {
            n->error = state;
            nccl_fail(n->detail, sizeof n->detail, "NCCL asynchronous error (communicator aborted)",
                      state, n->comm);
        }
        abort_locked(n);
    }
    pthread_mutex_unlock(&n->mu);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Init and teardown                                                                           */
/* ------------------------------------------------------------------------------------------ */

/* Frees what init built; the communicator itself is already aborted or never made. */
static void free_nccl(coll__nccl *n)
{
    if (n->barrier_buf != NULL) {
        (void)cudaFree(n->barrier_buf);
        (void)cudaGetLastError();
    }
    if (n->sync_init) {
        pthread_cond_destroy(&n->cv);
        pthread_mutex_destroy(&n->mu);
    }
    free(n);
}

/*
 * Rank 0 makes the unique id and sets it under "<prefix>/nccl/id"; the others wait for the key
 * (until the deadline) and read it. Store errors pass through as their negative errno.
 */
static int exchange_id(struct rdzv_client *store, const char *prefix, int rank, int64_t deadline_ns,
                       ncclUniqueId *id, char *err, size_t errlen)
{
    size_t keylen = strlen(prefix) + sizeof "/nccl/id";
    char *key = (char *)malloc(keylen);
    void *value = NULL;
    size_t nbytes = 0;
    int ret = 0;

    if (key == NULL) {
        put_err(err, errlen, "out of memory");
        return -ENOMEM;
    }
    snprintf(key, keylen, "%s/nccl/id", prefix);

    if (rank == 0) {
        ncclResult_t r = ncclGetUniqueId(id);

        if (r != ncclSuccess) {
            ret = nccl_fail(err, errlen, "ncclGetUniqueId", r, NULL);
            goto out;
        }
        ret = rdzv_set(store, key, id, sizeof *id);
        if (ret < 0)
            put_err(err, errlen, "store: setting %s failed (%d): %s", key, ret,
                    rdzv_client_last_error(store));
        goto out;
    }

    {
        int timeout_ms = mono_ms_left(deadline_ns); /* 0: passed (one look); -1: no deadline */

        ret = rdzv_wait_get(store, key, timeout_ms < 0 ? INT_MAX : timeout_ms, &value, &nbytes);
    }
    if (ret == -ETIMEDOUT) {
        put_err(err, errlen, "rank 0 did not publish the NCCL unique id (%s) in time", key);
        goto out;
    }
    if (ret < 0) {
        put_err(err, errlen, "store: reading %s failed (%d): %s", key, ret,
                rdzv_client_last_error(store));
        goto out;
    }
    if (nbytes != sizeof *id) {
        put_err(err, errlen, "store: %s holds %zu bytes, not an NCCL unique id (%zu)", key, nbytes,
                sizeof *id);
        ret = -EPROTO;
        goto out;
    }
    memcpy(id, value, sizeof *id);
    ret = 0;
out:
    rdzv_free(value);
    free(key);
    return ret;
}

int coll__nccl_init(struct rdzv_client *store, const char *prefix, int rank, int world, int device,
                    int64_t deadline_ns, coll__nccl **out, char *err, size_t errlen)
{
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    pthread_condattr_t cattr;
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    coll__nccl *n = NULL;
    ncclResult_t r;
    cudaError_t e;
    int ndev = 0;
    int ret;

    if (store == NULL || prefix == NULL || out == NULL || world < 1 || rank < 0 || rank >= world ||
        device < 0) {
        put_err(err, errlen, "invalid argument");
        return -EINVAL;
    }

    e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        put_err(err, errlen, "no usable CUDA device: %s",
                e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        (void)cudaGetLastError();
        return -ENOTSUP;
    }
    if (device >= ndev) {
        put_err(err, errlen, "CUDA device %d does not exist (%d devices)", device, ndev);
        return -EINVAL;
    }
    /* Left current on the calling thread, as NCCL's own init expects. */
    e = cudaSetDevice(device);
    if (e != cudaSuccess)
        return cuda_fail(err, errlen, "cudaSetDevice", e);

    n = (coll__nccl *)calloc(1, sizeof *n);
    if (n == NULL) {
        put_err(err, errlen, "out of memory");
        return -ENOMEM;
    }
    n->device = device;
    n->rank = rank;
    n->world = world;
    n->error = ncclSuccess;
    n->timeout_ns = deadline_ns == INT64_MAX ? -1 : deadline_ns - mono_now_ns();
    if (deadline_ns != INT64_MAX && n->timeout_ns < 1)
        n->timeout_ns = 1;

    pthread_condattr_init(&cattr);
    pthread_condattr_setclock(&cattr, CLOCK_MONOTONIC);
    ret = pthread_cond_init(&n->cv, &cattr);
    pthread_condattr_destroy(&cattr);
    if (ret != 0) {
        free(n);
        put_err(err, errlen, "pthread_cond_init failed");
        return -ret;
    }
    ret = pthread_mutex_init(&n->mu, NULL);
    if (ret != 0) {
        pthread_cond_destroy(&n->cv);
        free(n);
        put_err(err, errlen, "pthread_mutex_init failed");
        return -ret;
    }
    n->sync_init = true;

    e = cudaMalloc((void **)&n->barrier_buf, sizeof(float));
    if (e != cudaSuccess) {
        n->barrier_buf = NULL;
        ret = cuda_fail(err, errlen, "cudaMalloc (barrier buffer)", e);
        goto fail;
    }
    e = cudaMemset(n->barrier_buf, 0, sizeof(float));
    if (e != cudaSuccess) {
        ret = cuda_fail(err, errlen, "cudaMemset (barrier buffer)", e);
        goto fail;
    }

    ret = exchange_id(store, prefix, rank, deadline_ns, &id, err, errlen);
    if (ret < 0)
        goto fail;

    config.blocking = 0;
    r = ncclCommInitRankConfig(&comm, world, id, rank, &config);
    if (r == ncclSuccess || r == ncclInProgress)
        r = wait_ready(comm, deadline_ns, NULL);
    if (r == ncclInProgress) {
        put_err(err, errlen, "NCCL communicator init (rank %d of %d) did not complete in time",
                rank, world);
        ret = -ETIMEDOUT;
        goto fail;
    }
    if (r != ncclSuccess) {
        ret = nccl_fail(err, errlen, "ncclCommInitRankConfig", r, comm);
        goto fail;
    }
    n->comm = comm;
    comm = NULL;

    ret = pthread_create(&n->watchdog, NULL, watchdog_main, n);
    if (ret != 0) {
        put_err(err, errlen, "cannot start the NCCL watchdog thread");
        comm = n->comm;
        n->comm = NULL;
        ret = -ret;
        goto fail;
    }
    n->watchdog_running = true;
    *out = n;
    return 0;

fail:
    if (comm != NULL)
        (void)ncclCommAbort(comm);
    free_nccl(n);
    return ret;
}

void coll__nccl_abort(coll__nccl *n)
{
    if (n == NULL)
        return;
    /* Tells a start() polling an enqueue under mu to let go of it. */
    __atomic_store_n(&n->abort_req, 1, __ATOMIC_RELEASE);
    pthread_mutex_lock(&n->mu);
    abort_locked(n);
    pthread_mutex_unlock(&n->mu);
}

/*
 * Stops the watchdog, then finalizes and destroys the communicator: finalize is polled for at
 * most the init's timeout (or until coll__nccl_abort() from another thread), and anything short
 * of a clean finalize and destroy ends in an abort.
 */
void coll__nccl_destroy(coll__nccl *n)
{
    ncclComm_t comm;

    if (n == NULL)
        return;

    pthread_mutex_lock(&n->mu);
    n->stop = true;
    pthread_cond_broadcast(&n->cv);
    pthread_mutex_unlock(&n->mu);
    if (n->watchdog_running)
        pthread_join(n->watchdog, NULL);

    (void)use_device(n->device);
    (void)cudaGetLastError();

    pthread_mutex_lock(&n->mu);
    comm = n->comm;
    n->comm = NULL;
    /* Requests still holding events (not waited for) must not reach n once it is freed. */
    while (n->pending != NULL) {
        nccl_event *ev = n->pending;

        unlist_locked(n, ev);
        ev->n = NULL;
    }
    pthread_mutex_unlock(&n->mu);

    if (comm != NULL) {
        int64_t deadline = n->timeout_ns < 0 ? INT64_MAX : mono_now_ns() + n->timeout_ns;
        ncclResult_t r = ncclCommFinalize(comm);

        if (r == ncclSuccess || r == ncclInProgress)
            r = wait_ready(comm, deadline, &n->abort_req);
        if (r == ncclSuccess)
            r = ncclCommDestroy(comm);
        if (r != ncclSuccess)
            (void)ncclCommAbort(comm);
    }
    free_nccl(n);
}

/* ------------------------------------------------------------------------------------------ */
/* Operations                                                                                  */
/* ------------------------------------------------------------------------------------------ */

/* Issues op on comm; caller holds n->mu. */
static ncclResult_t issue(coll__nccl *n, const coll__op *op, ncclDataType_t dt, ncclRedOp_t ro,
                          cudaStream_t s)
{
    switch (op->kind) {
    case COLL__ALLREDUCE:
        return ncclAllReduce(op->sendbuf, op->recvbuf, op->count, dt, ro, n->comm, s);
    case COLL__REDUCE:
        return ncclReduce(op->sendbuf, op->recvbuf, op->count, dt, ro, op->peer, n->comm, s);
    case COLL__BROADCAST:
        return ncclBroadcast(op->sendbuf, op->recvbuf, op->count, dt, op->peer, n->comm, s);
    case COLL__ALLGATHER:
        return ncclAllGather(op->sendbuf, op->recvbuf, op->count, dt, n->comm, s);
    case COLL__REDUCE_SCATTER:
        return ncclReduceScatter(op->sendbuf, op->recvbuf, op->count, dt, ro, n->comm, s);
    case COLL__BARRIER:
        return ncclAllReduce(n->barrier_buf, n->barrier_buf, 1, ncclFloat32, ncclSum, n->comm, s);
    case COLL__SEND:
        return ncclSend(op->sendbuf, op->count, dt, op->peer, n->comm, s);
    case COLL__RECV:
        return ncclRecv(op->recvbuf, op->count, dt, op->peer, n->comm, s);
    }
    return ncclInvalidArgument;
}

int coll__nccl_start(coll__nccl *n, const coll__op *op, void *stream, int64_t deadline_ns,
                     void **event, char *err, size_t errlen)
{
    cudaStream_t s = (cudaStream_t)stream;
    ncclDataType_t dt = ncclFloat32;
    ncclRedOp_t ro = ncclSum;
    nccl_event *ev;
    ncclResult_t r;
    cudaError_t e;
    int ret;

    if (n == NULL || op == NULL || event == NULL) {
        put_err(err, errlen, "invalid argument");
        return -EINVAL;
    }
    if (op->kind != COLL__BARRIER && op->kind != COLL__BROADCAST && op->kind != COLL__ALLGATHER &&
        op->kind != COLL__SEND && op->kind != COLL__RECV && op_map(op->op, &ro) < 0) {
        put_err(err, errlen, "invalid reduction %d", (int)op->op);
        return -EINVAL;
    }
    if (op->kind != COLL__BARRIER && dtype_map(op->dtype, &dt) < 0) {
        put_err(err, errlen, "invalid dtype %d", (int)op->dtype);
        return -EINVAL;
    }

    e = use_device(n->device);
    if (e != cudaSuccess)
        return cuda_fail(err, errlen, "cudaSetDevice", e);

    pthread_mutex_lock(&n->mu);
    if (n->comm == NULL) {
        ret = failed_locked(n, err, errlen);
        pthread_mutex_unlock(&n->mu);
        return ret;
    }
    r = issue(n, op, dt, ro, s);
    if (r == ncclInProgress) {
        int64_t deadline = n->timeout_ns < 0 ? INT64_MAX : mono_now_ns() + n->timeout_ns;

        r = wait_ready(n->comm, deadline, &n->abort_req);
    }
    if (r == ncclInProgress && load_flag(&n->abort_req)) {
        put_err(err, errlen, "%s: the NCCL communicator was aborted while enqueueing",
                kind_label(op->kind));
        ret = COLL_ENCCL;
    } else if (r == ncclInProgress) {
        /* A communicator stuck in ncclInProgress is unusable: abort it. */
        put_err(err, errlen, "%s: NCCL did not finish enqueueing within the timeout (%lld ms)",
                kind_label(op->kind), (long long)(n->timeout_ns / 1000000));
        abort_locked(n);
        ret = -ETIMEDOUT;
    } else if (r != ncclSuccess) {
        ret = nccl_fail(err, errlen, kind_label(op->kind), r, n->comm);
    } else {
        ret = 0;
    }
    pthread_mutex_unlock(&n->mu);
    if (ret < 0)
        return ret;

    /* The operation is on the stream now; mark its end. */
    ev = (nccl_event *)malloc(sizeof *ev);
    if (ev == NULL) {
        put_err(err, errlen, "out of memory");
        return -ENOMEM;
    }
    memset(ev, 0, sizeof *ev);
    ev->device = n->device;
    ev->kind = op->kind;
    ev->deadline_ns = deadline_ns;
    ev->n = n;
    e = cudaEventCreateWithFlags(&ev->ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        free(ev);
        return cuda_fail(err, errlen, "cudaEventCreateWithFlags", e);
    }
    e = cudaEventRecord(ev->ev, s);
    if (e != cudaSuccess) {
        (void)cudaEventDestroy(ev->ev);
        free(ev);
        return cuda_fail(err, errlen, "cudaEventRecord", e);
    }
    /* From now on the watchdog holds the operation to its deadline. */
    pthread_mutex_lock(&n->mu);
    ev->next = n->pending;
    if (n->pending != NULL)
        n->pending->prev = ev;
    n->pending = ev;
    ev->listed = true;
    pthread_mutex_unlock(&n->mu);
    *event = ev;
    return 0;
}

/*
 * Once the communicator is aborted, every operation still queried fails, even one whose event
 * fired: NCCL's kernels end early when aborted, so a fired event then proves nothing.
 */
int coll__nccl_query(coll__nccl *n, void *event, char *err, size_t errlen)
{
    nccl_event *ev = (nccl_event *)event;
    cudaError_t e;
    int ret;

    if (n == NULL || ev == NULL) {
        put_err(err, errlen, "invalid argument");
        return -EINVAL;
    }
    pthread_mutex_lock(&n->mu);
    ret = failed_locked(n, err, errlen);
    pthread_mutex_unlock(&n->mu);
    if (ret < 0)
        return ret;

    e = use_device(ev->device);
    if (e != cudaSuccess)
        return cuda_fail(err, errlen, "cudaSetDevice", e);
    e = cudaEventQuery(ev->ev);
    if (e == cudaSuccess)
        return 1;
    if (e == cudaErrorNotReady)
        return 0;
    return cuda_fail(err, errlen, "cudaEventQuery", e);
}

void coll__nccl_event_free(void *event)
{
    nccl_event *ev = (nccl_event *)event;

    if (ev == NULL)
        return;
    if (ev->n != NULL) {
        pthread_mutex_lock(&ev->n->mu);
        unlist_locked(ev->n, ev);
        pthread_mutex_unlock(&ev->n->mu);
    }
    if (use_device(ev->device) == cudaSuccess)
        (void)cudaEventDestroy(ev->ev);
    (void)cudaGetLastError();
    free(ev);
}

int coll__nccl_stream_wait(void *event, void *stream, char *err, size_t errlen)
{
    nccl_event *ev = (nccl_event *)event;
    cudaError_t e;

    if (ev == NULL) {
        put_err(err, errlen, "invalid argument");
        return -EINVAL;
    }
    e = use_device(ev->device);
    if (e != cudaSuccess)
        return cuda_fail(err, errlen, "cudaSetDevice", e);
    e = cudaStreamWaitEvent((cudaStream_t)stream, ev->ev, 0);
    if (e != cudaSuccess)
        return cuda_fail(err, errlen, "cudaStreamWaitEvent", e);
    return 0;
}
