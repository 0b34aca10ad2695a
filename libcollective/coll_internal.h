/*
 * Internals shared across libcollective's files (coll__ prefix). Not installed.
 *
 * Modules:
 *   reduce.c      element-wise reduction kernels (no I/O, unit-tested alone)
 *   shm.c         per-host shared-memory segments and the waits on counters inside them
 *   tcp.c         rank-to-rank TCP connections and bounded, abortable duplex transfers
 *   cpu.c         the cpu backend's algorithms on top of shm.c and tcp.c
 *   comm.c        the public API: bootstrap through the store, requests, progress thread
 *   nccl.cu       the nccl backend (built with NCCL)
 *   cuda_stage.cu device-pointer detection and pinned staging for the cpu backend (CUDA builds)
 */
#ifndef COLL_INTERNAL_H
#define COLL_INTERNAL_H

#include "coll.h"

#ifndef __cplusplus
#include <stdatomic.h>
#endif
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The range of libcollective's project codes (COLL_ERROR_MAP in coll.h); tests/test_errors.c
 * checks that every code lies in it and that it does not overlap librendezvous's. */
#define COLL_ERROR_CODE_HIGH (-1000)
#define COLL_ERROR_CODE_LOW (-1099)

/* Monotonic clock in nanoseconds. */
int64_t coll__now_ns(void);
/* now + timeout_ms in ns; INT64_MAX for timeout_ms < 0. */
int64_t coll__deadline(int timeout_ms);
/*
 * The store keys "<prefix>/<what>/<rank>" for every rank, NULL-terminated; NULL when out of
 * memory. Released by coll__keys_free() (NULL is a no-op).
 */
char **coll__rank_keys(const char *prefix, const char *what, int world);
void coll__keys_free(char **keys);

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
/* Conversions used by the kernels and by the tests' references. */
float coll__f16_to_f32(uint16_t h);
uint16_t coll__f32_to_f16(float f);
float coll__bf16_to_f32(uint16_t h);
uint16_t coll__f32_to_bf16(float f);

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
    _Atomic uint32_t abort;   /* nonzero once any local rank aborted or saw a failure */
    _Atomic int32_t culprit;  /* global rank that caused it, -1 unknown */
    _Atomic uint32_t attached; /* local ranks that mapped the segment */
    char pad[44];
    coll__counter arrive[COLL__MAX_LOCAL]; /* per local rank progress counter */
} coll__shm_hdr;

typedef struct coll__shm {
    char name[64];       /* "/coll.<uid>.<pid>.<hex>", as given to shm_open */
    void *base;          /* mapping, starts with coll__shm_hdr */
    size_t nbytes;
    int nlocal;
    int local_rank;
    int pids[COLL__MAX_LOCAL];     /* per local rank, for liveness */
    int pidfds[COLL__MAX_LOCAL];   /* pidfd_open() of each other local rank, or -1 */
    int granks[COLL__MAX_LOCAL];   /* global rank of each local rank, for culprits */
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
    uint64_t tag;             /* identifies the communicator */
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
/* CUDA staging (cuda_stage.cu; stubs returning false / -ENOTSUP without CUDA)                 */
/* ------------------------------------------------------------------------------------------ */

/* True when a CUDA device is usable in this process (cached after the first call). */
bool coll__cuda_available(void);
/* True when p is device (or managed) memory. Host memory and unknown pointers: false. */
bool coll__cuda_is_device(const void *p);
/* Pinned host memory (cudaMallocHost), or NULL. */
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
int coll__nccl_init(struct rdzv_client *store, const char *prefix, int rank, int world,
                    int device, int64_t deadline_ns, coll__nccl **out, char *err, size_t errlen);
/*
 * Enqueues op on stream and records an event after it; *event is released by
 * coll__nccl_event_free(). Returns 0, COLL_ENCCL, COLL_ECUDA.
 */
int coll__nccl_start(coll__nccl *n, const coll__op *op, void *stream, void **event, char *err,
                     size_t errlen);
/* Polls: 1 done, 0 pending, or COLL_ENCCL (async NCCL error) / COLL_ECUDA. */
int coll__nccl_query(coll__nccl *n, void *event, char *err, size_t errlen);
void coll__nccl_event_free(void *event);
/* ncclCommAbort; safe from any thread. */
void coll__nccl_abort(coll__nccl *n);
/* ncclCommDestroy (or abort if it failed) and free. NULL is a no-op. */
void coll__nccl_destroy(coll__nccl *n);

#ifndef __cplusplus /* cpu.c: C only, like shm.c and tcp.c */
/* ------------------------------------------------------------------------------------------ */
/* cpu.c                                                                                       */
/* ------------------------------------------------------------------------------------------ */

typedef struct coll__cpu coll__cpu;

/*
 * Bootstraps the cpu backend through the store (see cpu.c). `abort` is the communicator's flag.
 * Returns 0 and sets *out, or a negative code with err filled and *culprit set to a rank that
 * did not arrive (-1 if none is known; culprit may be NULL).
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
/* Whether rank shares this rank's host. */
bool coll__cpu_same_host(const coll__cpu *c, int rank);
/* The hostname rank published, for messages. */
const char *coll__cpu_hostname(const coll__cpu *c, int rank);
#endif

#ifdef __cplusplus
}
#endif

#endif /* COLL_INTERNAL_H */
