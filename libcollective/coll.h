/*
 * libcollective: allreduce, reduce, broadcast, allgather, reduce-scatter, barrier and
 * send/recv for data-parallel training, bootstrapped through a librendezvous store.
 *
 * Two backends sit behind one API:
 *
 *  - cpu: any host. Ranks on one host (decided from the identities they publish in the store)
 *    share a memory segment; host leaders talk over TCP. Buffers are host memory, or device
 *    memory when the library is built with CUDA (staged through pinned host memory).
 *  - nccl: GPUs, when the library is built with NCCL. Buffers are device memory and operations
 *    are enqueued on the communicator's CUDA stream (coll_comm_set_stream()).
 *
 * Conventions (the NCCL ones): collective calls take (sendbuf, recvbuf, count, dtype, op, ...);
 * count is in elements; an operation is in place when sendbuf == recvbuf. Every collective must
 * be called by every rank of the communicator, in the same order, with the same count, dtype,
 * op and root. Functions that can fail return an int, >= 0 on success and a negative errno value
 * or a COLL_E* code on failure; coll_strerror() names any of them and coll_last_error() gives
 * the communicator's detailed account of its last failure. Out-parameters are written only on
 * success. Buffers are borrowed until the operation completes (its request is done, or for
 * nccl, until the stream has run it).
 *
 * Asynchrony: every operation has an i-form (coll_iallreduce(), ...) that returns a request at
 * once and a blocking form. The operations of one communicator run one at a time in the order
 * they were issued, on a progress thread, so that they overlap the caller's compute. Each
 * request is released by exactly one coll_wait().
 *
 * Release, by the project's rule (objects that hold connections are released with their
 * _close(), what a library hands out with its _free()): a communicator by coll_comm_close(), a
 * request by coll_wait(), what coll_comm_init_env() made by coll_env_free(). The library hands
 * out no other memory: the strings it returns are its own (static, or the communicator's).
 *
 * Thread-safety: a communicator may be used from several threads; operations are ordered by
 * the time their call took the communicator's lock. Every rank must issue the same sequence.
 *
 * The header compiles as C99 and C++.
 */
#ifndef COLL_H
#define COLL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rdzv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Errors and logging                                                                          */
/* ------------------------------------------------------------------------------------------ */

/*
 * Project error codes, for failures errno cannot name. Every other failure is a negative errno
 * value: -ETIMEDOUT (a peer did not take part in time; the detail names it), -ECANCELED (the
 * communicator was aborted), -EINVAL, -ENOMEM, -ENOTSUP (not built with that backend), ...
 *
 * Each library of the project has a range of its own, so that a number means one failure
 * wherever it ends up: libcollective's codes lie in [-1099, -1000], librendezvous's internal
 * protocol-parser results in [-1199, -1100] (rendezvous/proto.h), and errno values are all
 * above -1000.
 */
#define COLL_ERROR_MAP(X)                                                                        \
    X(COLL_ENCCL, -1001, "NCCL error")                                                           \
    X(COLL_ECUDA, -1002, "CUDA error")                                                           \
    X(COLL_EREMOTE, -1003, "a remote rank failed")

enum coll_error {
#define COLL_ERROR_ENUM(name, value, text) name = value,
    COLL_ERROR_MAP(COLL_ERROR_ENUM)
#undef COLL_ERROR_ENUM
};

/* A static description of any return code of this library. Never NULL. Thread-safe. */
const char *coll_strerror(int err);

enum coll_log_level { COLL_LOG_ERROR = 0, COLL_LOG_WARN = 1, COLL_LOG_INFO = 2, COLL_LOG_DEBUG = 3 };

/* A log hook: called from any of the library's threads with a NUL-terminated line (no '\n'). */
typedef void (*coll_log_fn)(void *arg, int level, const char *msg);

/* ------------------------------------------------------------------------------------------ */
/* Types                                                                                       */
/* ------------------------------------------------------------------------------------------ */

typedef enum coll_dtype {
    COLL_F32 = 0,
    COLL_F64,
    COLL_F16,  /* IEEE binary16 */
    COLL_BF16, /* bfloat16 */
    COLL_I32,
    COLL_I64,
    COLL_U8,
    COLL_DTYPE_COUNT
} coll_dtype;

/*
 * Reductions. Integer sums and products wrap; AVG is the sum divided by the number of ranks
 * (truncated for integers). f16 and bf16 are accumulated in f32 within a host and rounded to
 * nearest even when stored.
 */
typedef enum coll_op { COLL_SUM = 0, COLL_AVG, COLL_MAX, COLL_MIN, COLL_PROD, COLL_OP_COUNT } coll_op;

typedef enum coll_backend {
    COLL_BACKEND_AUTO = 0, /* nccl when built with it, device >= 0 and a GPU is there; else cpu */
    COLL_BACKEND_CPU,
    COLL_BACKEND_NCCL,
} coll_backend;

/* Size of one element in bytes; 0 for an invalid dtype. */
size_t coll_dtype_size(coll_dtype dtype);
/* Names ("f32", "bf16", "sum", "cpu", ...); "?" for invalid values. Static strings. */
const char *coll_dtype_name(coll_dtype dtype);
const char *coll_op_name(coll_op op);
const char *coll_backend_name(coll_backend backend);
/* Parse a name written by the functions above. Returns 0, or -EINVAL for an unknown name. */
int coll_dtype_parse(const char *name, coll_dtype *out);
int coll_op_parse(const char *name, coll_op *out);
int coll_backend_parse(const char *name, coll_backend *out);

/* True when the library was built with NCCL (the nccl backend can be asked for). */
bool coll_have_nccl(void);
/* True when the library was built with CUDA (cpu backend accepts device buffers). */
bool coll_have_cuda(void);

/* ------------------------------------------------------------------------------------------ */
/* Communicators                                                                               */
/* ------------------------------------------------------------------------------------------ */

typedef struct coll_comm coll_comm;
typedef struct coll_request coll_request;

/* Communicator settings. Fill with coll_options_init(), then change what you need. */
typedef struct coll_options {
    int timeout_ms;        /* bound on init and on each operation, from its start (600000);
                              < 0: none */
    coll_log_fn log;       /* log hook (NULL: silent) */
    void *log_arg;         /* passed to log */
    size_t chunk_bytes;    /* cpu: pipeline chunk per rank (0: 1 MiB) */
    size_t small_bytes;    /* cpu: messages up to this use the latency-optimised algorithm
                              unless COLL_CPU_ALGO says otherwise (0: 16 KiB) */
    const char *bind_addr; /* cpu: address peers on other hosts reach this rank at; copied.
                              NULL: the local address of the connection to the store */
} coll_options;

/* Fills `opts` with the defaults given in brackets above. */
void coll_options_init(coll_options *opts);

/*
 * Creates a communicator of `world_size` ranks; call on every rank. Ranks meet in the store
 * through `store` (borrowed for this call; the communicator opens a connection of its own to
 * the same store for later use) under the key prefix `prefix` (copied), which must be unique
 * to this communicator within the store; its keys are "/ddprun-coll/<prefix>/..."
 * (RDZV_PRIVATE_COLL_ROOT), which a store with a token keeps private to the job's authenticated
 * connections (a client connected with the job's token, as rdzv_env_connect() does under
 * ddprun). `device` is a CUDA device ordinal for the nccl backend
 * and -1 for none. `opts` may be NULL for the defaults. The cpu backend reads the environment
 * variable COLL_CPU_ALGO (auto, latency or ring: its reduction algorithm; libcollective(3)).
 *
 * Returns 0 and sets *out, or -EINVAL (bad argument; a COLL_CPU_ALGO that names no algorithm,
 * or ranks that chose different ones), -ENOTSUP (backend nccl in a build
 * without it, or no GPU), -ETIMEDOUT (not every rank arrived within the timeout; the message in
 * coll_last_error(NULL) names the missing ranks), -ENOMEM, COLL_ENCCL, COLL_ECUDA, or a store
 * or socket error. On failure coll_last_error(NULL) describes it.
 */
int coll_comm_init(struct rdzv_client *store, const char *prefix, int rank, int world_size,
                   coll_backend backend, int device, const coll_options *opts, coll_comm **out);

/* Settings of coll_comm_init_env(). Fill with coll_env_options_init(), then set name. */
typedef struct coll_env_options {
    const char *name;                 /* the program's part of the key prefix; required */
    const char *suffix;               /* NULL, or a last part of the key prefix (a scenario) */
    coll_backend backend;             /* the communicator's backend (COLL_BACKEND_CPU) */
    int device;                       /* its device, for the nccl backend (-1) */
    const coll_options *comm;         /* its options (NULL: the defaults); its log hook also
                                         gets the join's own line */
    const rdzv_client_options *store; /* the store connection's (NULL: the defaults) */
    bool store_only;                  /* make no communicator: only read the environment and
                                         connect to the store, which is then kept (false) */
    bool keep_store;                  /* keep the store connection in coll_env.store (false:
                                         closed once the communicator, which has a connection
                                         of its own, is up) */
    bool standalone;                  /* with none of RANK, WORLD_SIZE, MASTER_ADDR and
                                         MASTER_PORT set, run a job of one on a private store
                                         at 127.0.0.1 (false: fail with -ENOENT) */
} coll_env_options;

/* Fills `opts` with the defaults given in brackets above, name and suffix NULL. */
void coll_env_options_init(coll_env_options *opts);

/* What coll_comm_init_env() read and made. Release with coll_env_free(). */
typedef struct coll_env {
    rdzv_env env;        /* the torchrun environment: rank, world_size, local_rank,
                            local_world_size, master_addr, master_port, run_id, ... */
    char prefix[512];    /* the key prefix: "<name>/<run_id>/<restart_count>[/<suffix>]" */
    coll_comm *comm;     /* the communicator; NULL with store_only */
    rdzv_client *store;  /* the store connection, with keep_store or store_only; else NULL */
    rdzv_server *server; /* standalone: the private store this process serves; else NULL */
} coll_env;

/*
 * Joins the job this process was started in, the way every worker of the project does: reads
 * the torchrun environment (rdzv_env_read()), makes the per-attempt key prefix
 * "<name>/<run_id>/<restart_count>[/<suffix>]" (rdzv_env_prefix()), connects to the job's store
 * (rdzv_env_connect(), with the job's token) and creates a communicator of every rank of the job
 * under that prefix (coll_comm_init() with opts->backend, opts->device and opts->comm). Call on
 * every rank. `opts` is borrowed for the call.
 *
 * Returns 0 and fills *out, whose members the caller owns (coll_env_free() releases them all;
 * a caller that keeps one sets it to NULL first). On failure nothing is left allocated, *out is
 * not written, and coll_last_error(NULL) says what went wrong. Codes: -EINVAL (opts, out or
 * opts->name NULL; or a malformed or incomplete environment: the message is rdzv_env_read()'s,
 * naming the variable and its value), -ENOENT (none of RANK, WORLD_SIZE, MASTER_ADDR and
 * MASTER_PORT is set and opts->standalone is false: the message says to run under ddprun or
 * torchrun), -ENOSPC (the key prefix does not fit coll_env.prefix), an error of
 * rdzv_env_connect() (the message names the store's address), of rdzv_server_start()
 * (standalone), or of coll_comm_init(). Thread-safe as far as the calls it makes are.
 */
int coll_comm_init_env(const coll_env_options *opts, coll_env *out);

/*
 * Releases what *env holds, in order: closes the communicator, closes the store connection,
 * stops the private store; sets each to NULL. NULL members, or env NULL, are skipped.
 */
void coll_env_free(coll_env *env);

#define COLL_SPLIT_NOCOLOR (-1)

/*
 * Splits `comm` like MPI_Comm_split: ranks passing the same `color` form a new communicator,
 * ordered by `key` then by their rank in `comm`. Call on every rank of `comm` (after its pending
 * operations, which it waits for). A rank passing COLL_SPLIT_NOCOLOR takes part but gets
 * *out = NULL. The new communicator has `comm`'s backend, device and options. Returns 0, or an
 * error of coll_comm_init().
 */
int coll_comm_split(coll_comm *comm, int color, int key, coll_comm **out);

/*
 * Aborts `comm`: every pending and running operation completes with -ECANCELED (peers that
 * were waiting on this rank get COLL_EREMOTE naming it), and so does every later one. Safe
 * to call from any thread, including a signal-free watchdog thread, at any time. Returns 0, or
 * -EINVAL (comm NULL).
 */
int coll_comm_abort(coll_comm *comm);

/*
 * Waits for pending operations (bounded by the timeout), then frees the communicator and its
 * resources (shared memory, sockets, NCCL communicator). NULL is a no-op. Not collective, but
 * peers still using the communicator will see this rank as failed.
 */
void coll_comm_close(coll_comm *comm);

/* This rank, the number of ranks, and the backend chosen (never AUTO); -1 and AUTO for NULL. */
int coll_comm_rank(const coll_comm *comm);
int coll_comm_size(const coll_comm *comm);
coll_backend coll_comm_backend(const coll_comm *comm);
/* Number of distinct hosts and this rank's host-local index and host-local size; -1 for NULL. */
int coll_comm_nhosts(const coll_comm *comm);
int coll_comm_local_rank(const coll_comm *comm);
int coll_comm_local_size(const coll_comm *comm);

/*
 * The rank that caused the communicator's last failure (did not arrive in time, died, or
 * aborted), or -1 if none is known.
 */
int coll_comm_failed_rank(const coll_comm *comm);

/*
 * A human-readable account of the last failure on `comm` (for example "allreduce #12 timed out
 * after 5000 ms: rank 3 (host b) did not take part"), or "" if none. Owned by the communicator;
 * valid until its next failure. With comm == NULL: the calling thread's last coll_comm_init()
 * or coll_comm_split() failure.
 */
const char *coll_last_error(const coll_comm *comm);

/*
 * nccl: the CUDA stream (a cudaStream_t) later operations are enqueued on; NULL is the legacy
 * default stream. cpu: the stream device buffers are staged on. Returns 0, or -EINVAL.
 */
int coll_comm_set_stream(coll_comm *comm, void *cuda_stream);

/* ------------------------------------------------------------------------------------------ */
/* Operations                                                                                  */
/* ------------------------------------------------------------------------------------------ */

/*
 * Each i-form validates its arguments, queues the operation and returns 0 with *req set, or a
 * negative code (-EINVAL for bad arguments, -ECANCELED after an abort) and queues nothing.
 * Buffer shapes (count in elements):
 *
 *   allreduce       send[count] -> recv[count] on every rank
 *   reduce          send[count] -> recv[count] on root (recv unused elsewhere; may be NULL)
 *   broadcast       send[count] on root -> recv[count] on every rank (send unused elsewhere)
 *   allgather       send[count] -> recv[count * size], rank r's block at r * count;
 *                   in place when send == recv + rank * count
 *   reduce_scatter  send[count * size] -> recv[count], rank r gets block r;
 *                   in place when recv == send + rank * count
 *   send/recv       buf[count] to/from one peer; matched in order per (sender, receiver) pair.
 *                   Like NCCL, a send may wait until the matching receive runs: when two
 *                   ranks exchange large buffers, let one send first while the other receives
 *                   first, or use a second communicator.
 *
 * count 0 is valid and still synchronises nothing; buffers may then be NULL.
 */
int coll_iallreduce(coll_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                    coll_dtype dtype, coll_op op, coll_request **req);
int coll_ireduce(coll_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                 coll_dtype dtype, coll_op op, int root, coll_request **req);
int coll_ibroadcast(coll_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                    coll_dtype dtype, int root, coll_request **req);
int coll_iallgather(coll_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                    coll_dtype dtype, coll_request **req);
int coll_ireduce_scatter(coll_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                         coll_dtype dtype, coll_op op, coll_request **req);
int coll_ibarrier(coll_comm *comm, coll_request **req);
int coll_isend(coll_comm *comm, const void *buf, size_t count, coll_dtype dtype, int peer,
               coll_request **req);
int coll_irecv(coll_comm *comm, void *buf, size_t count, coll_dtype dtype, int peer,
               coll_request **req);

/*
 * Sets *done to whether the request has completed. Returns the operation's result once done
 * (0 or a negative code), 0 while it is pending, or -EINVAL. Does not release the request.
 */
int coll_test(coll_request *req, bool *done);

/*
 * Waits for the request to complete, releases it and returns the operation's result: 0, or
 * -ETIMEDOUT (a peer did not take part within the timeout), COLL_EREMOTE (a peer died or
 * aborted), -ECANCELED (this communicator was aborted), COLL_ENCCL, COLL_ECUDA, or a socket
 * error. coll_last_error() has the detail. For nccl, completion means the stream has run it.
 */
int coll_wait(coll_request *req);

/*
 * Makes the CUDA stream `stream` (a cudaStream_t; NULL: the legacy default stream) wait for the
 * request's operation, so that work enqueued on it later sees the result, without releasing the
 * request (coll_wait() still must, once). nccl: enqueues a wait on the operation's completion
 * event (cudaStreamWaitEvent) and returns at once; a failure that happens after (a peer dies,
 * the timeout passes) is seen by coll_test() or coll_wait() on the request, which the caller
 * must still call. cpu: the host runs the operation (device buffers are staged and copied back
 * synchronously), so this waits for it on the host like coll_wait() and returns its result.
 * Returns 0; the operation's failure (cpu; nccl when its enqueue had failed); -EINVAL (NULL);
 * COLL_ECUDA (the stream wait could not be enqueued; coll_last_error() has CUDA's message).
 */
int coll_request_stream_wait(coll_request *req, void *stream);

/* Blocking forms: issue and wait. Return what coll_wait() would. */
int coll_allreduce(coll_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                   coll_dtype dtype, coll_op op);
int coll_reduce(coll_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                coll_dtype dtype, coll_op op, int root);
int coll_broadcast(coll_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                   coll_dtype dtype, int root);
int coll_allgather(coll_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                   coll_dtype dtype);
int coll_reduce_scatter(coll_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                        coll_dtype dtype, coll_op op);
int coll_barrier(coll_comm *comm);
int coll_send(coll_comm *comm, const void *buf, size_t count, coll_dtype dtype, int peer);
int coll_recv(coll_comm *comm, void *buf, size_t count, coll_dtype dtype, int peer);

#ifdef __cplusplus
}
#endif

#endif /* COLL_H */
