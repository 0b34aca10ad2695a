/*
 * Internals shared across libcollective's files (coll__ prefix). Not installed.
 *
 * Modules:
 *   coll.h        the public API (installed); libcollective.map exports exactly its functions
 *   comm.c        the public API's communicators, argument checks, requests, failure
 *                 accounting, split, and the backend table it dispatches through
 *   backend_cpu.c the cpu backend's row: request queue, progress thread, device-buffer staging
 *   backend_nccl.c the nccl backend's row: adapters over nccl.cu (built with NCCL)
 *   env.c         coll_comm_init_env(): joining the job from the torchrun environment
 *   util.c        names and parsers of dtypes, reductions and backends; coll_strerror()
 *   settle.c      failure settlement's decision: evidence in, culprit and code out (no I/O)
 *   cpu_boot.c    the cpu backend's bootstrap through the store: ranks, layout, segment, ring
 *   cpu.c         the cpu backend's algorithms on top of shm.c and tcp.c (a table of reductions)
 *   cpu.h         the cpu backend's state, shared by cpu_boot.c and cpu.c
 *   layout.c      the cpu backend's host layout from the ranks' host identities (no I/O)
 *   shm.c         per-host shared-memory segments and the waits on counters inside them
 *   tcp.c         rank-to-rank TCP connections and bounded, abortable duplex transfers
 *   reduce.c      element-wise reduction kernels (no I/O, unit-tested alone)
 *   nccl.cu       every NCCL call of the nccl backend (built with NCCL)
 *   cuda_stage.cu device-pointer detection and pinned staging for the cpu backend (CUDA builds)
 *   cuda_stub.c   what the build has (coll_have_cuda/nccl()); cuda_stage.cu's stand-ins
 *                 without CUDA
 *
 * The store keys these files use ("<prefix>/cpu/<rank>", "<prefix>/failed", ...) are listed,
 * with their writers and value formats, in one table: libcollective(3), STORE KEYS.
 */
#ifndef COLL_INTERNAL_H
#define COLL_INTERNAL_H

#include "coll.h"
#include "monoclock.h"

#ifndef __cplusplus
#include <stdatomic.h>
#endif
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#ifndef __cplusplus
#include <pthread.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The range of libcollective's project codes (COLL_ERROR_MAP in coll.h); tests/test_errors.c
 * checks that every code lies in it and that it does not overlap librendezvous's. */
#define COLL_ERROR_CODE_HIGH (-1000)
#define COLL_ERROR_CODE_LOW (-1099)

/*
 * Clocks: monoclock.h's mono_now_ns(), mono_deadline_ns() and mono_ms_left(), the project's
 * one monotonic clock; every deadline in this library is a mono_deadline_ns() value.
 */

/* ------------------------------------------------------------------------------------------ */
/* settle.c                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/* The grace a settling rank gives its peers to record a failure or publish their progress. */
#define COLL__BLAME_GRACE_MS 1000

/* How a failed operation learned of the failure; decides how the culprit is settled. */
typedef enum coll__evkind {
    COLL__EV_TIMEOUT, /* a wait ran out: blame whoever did not reach the operation */
    COLL__EV_DEAD,    /* a rank on this host exited (seen through its pidfd): direct */
    COLL__EV_CLOSED,  /* a socket closed: the peer died, or failed and recorded why */
    COLL__EV_ABORTED, /* a rank on this host marked the segment failed and recorded why */
} coll__evkind;

/* What a question to the store brought back. */
typedef enum coll__answer {
    COLL__UNASKED = 0, /* not asked (yet) */
    COLL__ABSENT,      /* asked: no such key (within the wait), or a malformed value */
    COLL__PRESENT,     /* asked: the value is in the evidence */
    COLL__UNREACHABLE, /* asked: the store did not answer */
} coll__answer;

/* The failure record "<rank> <code>" under "<prefix>/failed". */
typedef struct coll__failure {
    int rank;
    int code;
} coll__failure;

/* Values of coll__evidence.progress_of[] other than a rank's index k. */
#define COLL__PROGRESS_ABSENT (-1) /* the rank published nothing within the grace */
#define COLL__PROGRESS_UNREAD (-2) /* it published, but the value could not be read */

/*
 * Everything settlement decides on. The first group is known locally when settling starts; the
 * second is filled in by the caller, one answer per question coll__settle() asks.
 */
typedef struct coll__evidence {
    int rank, world;
    uint64_t k;          /* the failed operation's index among the collectives */
    bool collective;     /* false for send/recv: progress is neither published nor compared */
    int rc;              /* the code the operation failed with */
    bool aborted;        /* coll_comm_abort() was called on this communicator */
    coll__evkind kind;   /* meaningful when rc is -ETIMEDOUT or COLL_EREMOTE */
    int guess;           /* the rank the failed wait named, -1 none */
    int segment_culprit; /* the culprit the host's segment was marked with, -1 none */

    bool published;             /* COLL__SETTLE_PUBLISH was done */
    coll__answer record;        /* COLL__SETTLE_READ_RECORD: "<prefix>/failed" */
    coll__failure found;        /* ... its value when PRESENT */
    coll__answer progress;      /* COLL__SETTLE_READ_PROGRESS: PRESENT or UNREACHABLE */
    const int64_t *progress_of; /* ... [world] each rank's k or COLL__PROGRESS_*, when PRESENT */
    coll__answer written;       /* COLL__SETTLE_WRITE_RECORD: PRESENT or UNREACHABLE */
    coll__failure held;         /* ... what the store holds after it, when PRESENT */
} coll__evidence;

/* What coll__settle() asks for next, or DONE. */
typedef enum coll__settle_step {
    COLL__SETTLE_DONE,          /* out->culprit and out->code are the verdict */
    COLL__SETTLE_PUBLISH,       /* set "<prefix>/progress/<rank>" to k; then set published */
    COLL__SETTLE_READ_RECORD,   /* read "<prefix>/failed", waiting up to out->wait_ms for it */
    COLL__SETTLE_READ_PROGRESS, /* wait up to out->wait_ms for every rank's progress; read them */
    COLL__SETTLE_WRITE_RECORD,  /* record out->culprit / out->code, first writer wins; then
                                   read back what the store holds */
} coll__settle_step;

typedef struct coll__verdict {
    int culprit; /* DONE: the rank to blame, -1 unknown; WRITE_RECORD: the one to record */
    int code;    /* DONE: the code to return; WRITE_RECORD: the one to record */
    int wait_ms; /* READ_RECORD, READ_PROGRESS: how long to wait; 0 for a plain check */
} coll__verdict;

/*
 * The next step of settling ev (see settle.c for the rules). Pure: no I/O, reads only ev.
 * Returns DONE with the verdict in *out, or the question to answer in ev before calling again;
 * no question is asked twice.
 */
coll__settle_step coll__settle(const coll__evidence *ev, coll__verdict *out);
/* Static names, for logs and test messages. */
const char *coll__settle_step_name(coll__settle_step step);
const char *coll__evkind_name(coll__evkind kind);

/* ------------------------------------------------------------------------------------------ */
/* layout.c                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/*
 * Which ranks share a host, computed from their host identities (see layout.c for the rules).
 * Host h's ranks are host_ranks[host_first[h] .. host_first[h + 1]), ascending; its leader is
 * leaders[h], its lowest rank; hosts are ordered by leader.
 */
typedef struct coll__layout {
    int world;
    int nhosts;
    int *host_of;    /* [world] each rank's host index */
    int *local_of;   /* [world] each rank's index among its host's ranks (its local rank) */
    int *leaders;    /* [nhosts] each host's lowest rank (room for world) */
    int *host_first; /* [nhosts + 1] offsets into host_ranks (room for world + 1) */
    int *host_ranks; /* [world] ranks grouped by host */
} coll__layout;

/*
 * Builds *l from ids[world] (each rank's identity, NUL-terminated; borrowed; equal strings mean
 * one host). Returns 0, -EINVAL (l or ids NULL, a NULL identity, world < 1) or -ENOMEM; *l is
 * zeroed on failure. Release with coll__layout_free().
 */
int coll__layout_build(coll__layout *l, const char *const *ids, int world);
/* Frees the arrays and zeroes *l; accepts NULL and a zeroed or freed layout. */
void coll__layout_free(coll__layout *l);
/* The number of ranks on host `host` (its local world size). */
int coll__layout_local_size(const coll__layout *l, int host);

/* ------------------------------------------------------------------------------------------ */
/* reduce.c                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/*
 * dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[nsrc-1][i] for i < count, nsrc >= 1.
 * dst may be one of srcs (element-wise aliasing only). f16 and bf16 are accumulated in f32 and
 * rounded (to nearest even) once when stored. COLL_AVG reduces as COLL_SUM: the caller divides
 * with coll__scale_avg() once the reduction over all ranks is complete.
 */
void coll__reduce_n(void *dst, const void *const *srcs, int nsrc, size_t count, coll_dtype dtype,
                    coll_op op);
/* buf[i] /= n (truncating for integers). */
void coll__scale_avg(void *buf, size_t count, coll_dtype dtype, int n);
/* Conversions used by the kernels and by the tests' references (bf16's: bf16conv.h). */
float coll__f16_to_f32(uint16_t h);
uint16_t coll__f32_to_f16(float f);

/*
 * The shm.c and tcp.c sections use C11 _Atomic, which C++ lacks; nvcc compiles the .cu files as
 * C++ and they need neither, so C++ translation units do not see them.
 */
#ifndef __cplusplus

/* ------------------------------------------------------------------------------------------ */
/* shm.c                                                                                       */
/* ------------------------------------------------------------------------------------------ */

#define COLL__MAX_LOCAL 64 /* ranks per host */

/* One cache line per counter, so that ranks posting do not share lines. */
typedef struct coll__counter {
    _Atomic uint64_t v;
    char pad[56];
} coll__counter;

/*
 * The segment's first bytes. Created zeroed by the host leader. `wake` is the futex word every
 * post bumps; `nwaiters` counts sleepers so posts skip the syscall when nobody sleeps.
 */
typedef struct coll__shm_hdr {
    _Atomic uint32_t wake;
    _Atomic uint32_t nwaiters;
    _Atomic uint32_t abort;    /* nonzero once any local rank aborted or saw a failure */
    _Atomic int32_t culprit;   /* global rank that caused it, -1 unknown */
    _Atomic uint32_t attached; /* local ranks that mapped the segment */
    char pad[44];
    coll__counter arrive[COLL__MAX_LOCAL]; /* per local rank progress counter */
} coll__shm_hdr;

typedef struct coll__shm {
    char name[64]; /* "/coll.<uid>.<pid>.<hex>", as given to shm_open */
    void *base;    /* mapping, starts with coll__shm_hdr */
    size_t nbytes;
    int nlocal;
    int local_rank;
    int pids[COLL__MAX_LOCAL];   /* per local rank, for liveness */
    int pidfds[COLL__MAX_LOCAL]; /* pidfd_open() of each other local rank, or -1 */
    int granks[COLL__MAX_LOCAL]; /* global rank of each local rank, for culprits */
    int spin; /* polls before sleeping: > 0 with a pause; < 0, -spin polls after sched_yield()
                 (ranks outnumber CPUs); 0, none */
    const _Atomic int *local_abort; /* this process's abort flag for the communicator */
} coll__shm;

/*
 * Leader side: sweeps stale segments of this user whose creator is dead, creates a segment of
 * nbytes (zeroed, name chosen from `tag` and the pid), maps it. Others: coll__shm_open() the
 * name the leader published. Both fill s->name/base/nbytes; the caller fills the rest.
 * Returns 0 or a negative errno.
 */
int coll__shm_create(coll__shm *s, const char *tag, size_t nbytes);
int coll__shm_open(coll__shm *s, const char *name, size_t nbytes);
/*
 * Marks this rank attached; the leader then waits (until deadline) for all nlocal to attach
 * and unlinks the name, so that nothing is left behind if any rank later crashes.
 */
int coll__shm_attach_done(coll__shm *s, int64_t deadline_ns);
/* Unmaps, closes pidfds, unlinks if still linked. Accepts a zeroed or half-built s. */
void coll__shm_close(coll__shm *s);
/* Opens pidfds for the other local ranks from s->pids; sets s->spin from the CPU count. */
int coll__shm_watch(coll__shm *s);

/* Store value (release) and wake sleepers. */
void coll__shm_post(coll__shm *s, _Atomic uint64_t *ctr, uint64_t value);
/*
 * Waits until *ctr >= target. `watch` is the local rank whose progress it depends on (its
 * death or lateness is what an error names), or -1 for none. Returns 0, -ETIMEDOUT (deadline;
 * *culprit = global rank of watch), COLL_EREMOTE (watched rank died, or the segment's abort
 * flag is set; *culprit = that rank or the segment's culprit), -ECANCELED (local abort).
 */
int coll__shm_wait(coll__shm *s, _Atomic uint64_t *ctr, uint64_t target, int watch,
                   int64_t deadline_ns, int *culprit);
/* Waits until every local rank's arrive counter is >= target. Same returns. */
int coll__shm_wait_all(coll__shm *s, uint64_t target, int64_t deadline_ns, int *culprit);
/* Sets the segment's abort flag (first culprit wins) and wakes every sleeper. */
void coll__shm_abort(coll__shm *s, int culprit);

/* ------------------------------------------------------------------------------------------ */
/* tcp.c                                                                                       */
/* ------------------------------------------------------------------------------------------ */

/*
 * A rank's TCP endpoint: one listening socket, and a lazily made connection per peer. The
 * lower rank of a pair connects, the higher accepts (connections from other peers accepted
 * meanwhile are kept for later). A handshake carries a communicator tag and the rank, so
 * strays are refused.
 */
typedef struct coll__tcp {
    int rank, world;
    uint64_t tag; /* identifies the communicator */
    int listen_fd;
    int *fds;                 /* [world], -1 when not connected */
    char (*addrs)[64];        /* [world] numeric host of each peer */
    int *ports;               /* [world] */
    const _Atomic int *abort; /* checked at least every 100 ms while blocked */
} coll__tcp;

/*
 * Opens the listener on `bind_host` (numeric IPv4/IPv6, NULL for any IPv4) port 0 and fills
 * *port. Allocates the peer tables. Returns 0 or a negative errno.
 */
int coll__tcp_init(coll__tcp *t, int rank, int world, uint64_t tag, const char *bind_host,
                   const _Atomic int *abort, int *port);
/* Records where peer listens. Returns 0 or -EINVAL. */
int coll__tcp_set_peer(coll__tcp *t, int peer, const char *host, int port);
/* The connected socket to peer, connecting or accepting as needed; fd >= 0 or negative code. */
int coll__tcp_conn(coll__tcp *t, int peer, int64_t deadline_ns);
/*
 * Sends siov to send_peer while receiving riov from recv_peer, concurrently (either peer may
 * be -1 for none; both may be the same peer). Returns 0, -ETIMEDOUT, COLL_EREMOTE (a peer
 * closed or reset the connection), -ECANCELED (abort flag), or a negative errno; *culprit is
 * set to the peer at fault on failure.
 */
int coll__tcp_xfer(coll__tcp *t, int send_peer, const struct iovec *siov, int sn, int recv_peer,
                   const struct iovec *riov, int rn, int64_t deadline_ns, int *culprit);
/* shutdown() every connection, so peers see the failure and local blocked calls return. */
void coll__tcp_shutdown(coll__tcp *t);
/* Closes everything and frees the tables. Accepts a zeroed or half-built t. */
void coll__tcp_close(coll__tcp *t);

#endif /* !__cplusplus */

/* ------------------------------------------------------------------------------------------ */
/* comm.c, for env.c                                                                           */
/* ------------------------------------------------------------------------------------------ */

/* Sets this thread's coll_last_error(NULL), the account of a failure that has no communicator. */
void coll__set_init_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ------------------------------------------------------------------------------------------ */
/* CUDA staging (cuda_stage.cu; stubs returning false / -ENOTSUP without CUDA)                 */
/* ------------------------------------------------------------------------------------------ */

/* True when a CUDA device is usable in this process (cached after the first call). */
bool coll__cuda_available(void);
/*
 * The device ordinal p's device (or managed) memory lives on; -1 for host memory (pinned,
 * registered or plain) and unknown pointers. Creates no CUDA context.
 */
int coll__cuda_device_of(const void *p);
/*
 * Makes `device` (which must have its context: a device memory lives on) current on the
 * calling thread; *restore gets the device coll__cuda_leave() makes current again: the one
 * that was, when it had a context (-1: none, so that none is created). Returns 0 or
 * COLL_ECUDA (detail in err).
 */
int coll__cuda_enter(int device, int *restore, char *err, size_t errlen);
void coll__cuda_leave(int restore);
/* Pinned host memory (cudaMallocHost) on the current device's context, or NULL. */
void *coll__cuda_host_alloc(size_t nbytes);
void coll__cuda_host_free(void *p);
/* Copies on `stream` and waits for it. Returns 0 or COLL_ECUDA (detail in err). */
int coll__cuda_copy(void *dst, const void *src, size_t nbytes, void *stream, char *err,
                    size_t errlen);

/* ------------------------------------------------------------------------------------------ */
/* nccl.cu                                                                                     */
/* ------------------------------------------------------------------------------------------ */

typedef struct coll__nccl coll__nccl;

enum coll__kind {
    COLL__ALLREDUCE,
    COLL__REDUCE,
    COLL__BROADCAST,
    COLL__ALLGATHER,
    COLL__REDUCE_SCATTER,
    COLL__BARRIER,
    COLL__SEND,
    COLL__RECV,
};
const char *coll__kind_name(enum coll__kind kind);

/* One queued operation, as the public call described it. */
typedef struct coll__op {
    enum coll__kind kind;
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    coll_dtype dtype;
    coll_op op;
    int peer; /* root for reduce/broadcast, peer for send/recv */
} coll__op;

/*
 * Rank 0 creates the unique id and sets it under "<prefix>/nccl/id"; the others wait for it.
 * The communicator is created non-blocking and polled until deadline (then aborted).
 * Returns 0, -ETIMEDOUT, -ENOTSUP (no NCCL/GPU), COLL_ENCCL, COLL_ECUDA; err gets the detail.
 */
int coll__nccl_init(struct rdzv_client *store, const char *prefix, int rank, int world, int device,
                    int64_t deadline_ns, coll__nccl **out, char *err, size_t errlen);
/*
 * Enqueues op on stream and records an event after it; *event is released by
 * coll__nccl_event_free() (before coll__nccl_destroy(), or after it). The watchdog aborts the
 * communicator if the event has not fired by deadline_ns (INT64_MAX: never). Returns 0,
 * -ETIMEDOUT (the enqueue itself did not finish in time), COLL_ENCCL, COLL_ECUDA.
 */
int coll__nccl_start(coll__nccl *n, const coll__op *op, void *stream, int64_t deadline_ns,
                     void **event, char *err, size_t errlen);
/*
 * Polls: 1 done, 0 pending, or -ETIMEDOUT (the watchdog found an operation past its deadline),
 * COLL_EREMOTE (an asynchronous NCCL error from a peer), COLL_ENCCL (any other NCCL error or
 * an abort), COLL_ECUDA.
 */
int coll__nccl_query(coll__nccl *n, void *event, char *err, size_t errlen);
void coll__nccl_event_free(void *event);
/* Makes `stream` wait for the event (cudaStreamWaitEvent). Returns 0 or COLL_ECUDA. */
int coll__nccl_stream_wait(void *event, void *stream, char *err, size_t errlen);
/* ncclCommAbort; safe from any thread. */
void coll__nccl_abort(coll__nccl *n);
/* ncclCommDestroy (or abort if it failed) and free. NULL is a no-op. */
void coll__nccl_destroy(coll__nccl *n);

#ifndef __cplusplus /* cpu_boot.c, cpu.c: C only, like shm.c and tcp.c */
/* ------------------------------------------------------------------------------------------ */
/* cpu_boot.c (bootstrap, teardown, queries) and cpu.c (coll__cpu_run, the algorithms)        */
/* ------------------------------------------------------------------------------------------ */

typedef struct coll__cpu coll__cpu;

/*
 * Bootstraps the cpu backend through the store (see cpu_boot.c). `abort` is the communicator's
 * flag. Reads COLL_CPU_ALGO. Returns 0 and sets *out, or a negative code with err filled and
 * *culprit set to a rank that did not arrive (-1 if none is known; culprit may be NULL):
 * -EINVAL for a COLL_CPU_ALGO no row names, or ranks that chose different rows.
 */
int coll__cpu_init(struct rdzv_client *store, const char *prefix, int rank, int world,
                   const coll_options *opts, const _Atomic int *abort, int64_t deadline,
                   coll__cpu **out, int *culprit, char *err, size_t errlen);
/*
 * Runs op to completion on host buffers. Returns 0 or a negative code; *culprit is the rank
 * at fault (-1 if unknown) and err may get a detail.
 */
int coll__cpu_run(coll__cpu *c, const coll__op *op, int64_t deadline, int *culprit, char *err,
                  size_t errlen);
/* Makes local peers (shared memory) and remote ones (sockets shut down) see this rank fail. */
void coll__cpu_abort(coll__cpu *c, int culprit);
void coll__cpu_destroy(coll__cpu *c);
int coll__cpu_nhosts(const coll__cpu *c);
/* This rank's index on its host; *nlocal gets the host's rank count. */
int coll__cpu_local(const coll__cpu *c, int *nlocal);
/* Whether a rank of this host marked the shared segment failed. */
bool coll__cpu_segment_aborted(const coll__cpu *c);
/* The culprit the segment was marked failed with, -1 if none. */
int coll__cpu_segment_culprit(const coll__cpu *c);
/*
 * The reduction algorithm COLL_CPU_ALGO names (see cpu.c's table of reductions): *algo gets its
 * row, or COLL__CPU_ALGO_AUTO for "auto", "" and NULL. Returns 0, or -EINVAL for another name.
 */
#define COLL__CPU_ALGO_AUTO (-1)
int coll__cpu_algo_parse(const char *name, int *algo);
/* The name of a row or of COLL__CPU_ALGO_AUTO ("auto"). Static. */
const char *coll__cpu_algo_name(int algo);
/* The accepted names, comma-separated ("auto, latency, ring"), for messages. */
void coll__cpu_algo_list(char *buf, size_t cap);
/* Whether rank shares this rank's host. */
bool coll__cpu_same_host(const coll__cpu *c, int rank);
/* The hostname rank published, for messages. */
const char *coll__cpu_hostname(const coll__cpu *c, int rank);
#endif

#ifndef __cplusplus /* comm.c and the backends: C only, like shm.c and tcp.c */
/* ------------------------------------------------------------------------------------------ */
/* comm.c: the communicator, for the backends (backend_cpu.c, backend_nccl.c)                  */
/* ------------------------------------------------------------------------------------------ */

#define COLL__ERR_BYTES 512

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
 * A backend as the API drives it: one row of comm.c's backends[], chosen once in
 * coll_comm_init(); nothing outside the backend's own file asks which backend a communicator
 * has. A new backend is one file, backend_<name>.c (listed in meson.build), defining its
 * coll__backend_ops (declared below), plus one row in backends[] (and its value in coll.h's
 * coll_backend). The rows: backend_cpu.c (operations run on the calling thread or the progress
 * thread) and backend_nccl.c (enqueued on the CUDA stream at issue, events polled; NCCL builds
 * only).
 */
typedef struct coll__backend_ops {
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
    /* coll_comm_init() refuses device < 0 with -ENOTSUP. */
    bool needs_device;
} coll__backend_ops;

extern const coll__backend_ops coll__cpu_backend;  /* backend_cpu.c */
extern const coll__backend_ops coll__nccl_backend; /* backend_nccl.c, NCCL builds only */

struct coll_comm {
    int rank, world, device;
    coll_backend backend;
    const coll__backend_ops *ops;
    coll_options opts;
    char *prefix, *bind_addr;
    rdzv_client *store; /* our own connection; store_lock serialises it */
    pthread_mutex_t store_lock;
    void *stream;

    /* backend_cpu.c's: the cpu backend, and staging of device buffers through pinned memory */
    coll__cpu *cpu;
    bool cuda;   /* device buffers possible (CUDA build with a device) */
    void *stage; /* pinned staging buffer for device buffers */
    size_t stage_bytes;

    coll__nccl *nccl; /* backend_nccl.c's */

    pthread_mutex_t lock;
    pthread_cond_t work;                 /* cpu: the progress thread waits here */
    pthread_cond_t done;                 /* waiters for requests (CLOCK_MONOTONIC) */
    coll_request *head, *tail;           /* cpu: queued, not yet running */
    bool busy, stopping, thread_started; /* cpu: one running; its progress thread's state */
    pthread_t thread;
    uint64_t issued;
    uint64_t ncoll; /* collectives started: the index progress is measured in */
    int nsplit;

    _Atomic int aborted;
    _Atomic int failed_rank;
    int sticky; /* first failure, 0 for none */
    char err[COLL__ERR_BYTES];
};

static inline bool coll__is_collective(enum coll__kind kind)
{
    return kind != COLL__SEND && kind != COLL__RECV;
}

/* Bytes op reads from sendbuf (*in) and writes to recvbuf (*out) on this rank. */
void coll__op_bytes(const coll_comm *c, const coll__op *op, size_t *in, size_t *out);
/*
 * Checks op, queues it through the backend's submit and sets *out: 0, or -EINVAL (bad
 * arguments, out NULL), -ECANCELED (aborted), -ENOMEM. The request is released by coll_wait().
 */
int coll__comm_issue(coll_comm *c, const coll__op *op, coll_request **out);
/* The evidence of a failure of op (index k among the collectives) with code rc, naming guess. */
coll__evidence coll__comm_evidence(const coll_comm *c, const coll__op *op, uint64_t k, int rc,
                                   coll__evkind kind, int guess);
/*
 * A failed operation (number seq, started at `started`): settles its culprit and code with the
 * peers through the store (settle.c decides), makes the backend abort, and makes the failure
 * sticky with its message; detail is the failed call's own account. Returns the settled code.
 * Runs on the thread that ran the operation.
 */
int coll__comm_fail(coll_comm *c, const coll__op *op, uint64_t seq, coll__evidence ev,
                    const char *detail, int64_t started);
#endif

#ifdef __cplusplus
}
#endif

#endif /* COLL_INTERNAL_H */
