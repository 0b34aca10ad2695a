/*
 * train_backend: which libcollective backend ddp-train's job takes, decided alike on every rank
 * from what every rank reports about its GPU.
 *
 * NCCL allows one rank per GPU, and every rank of a communicator must take the same backend.
 * Counting GPUs and ranks on one host decides neither: hosts may see different numbers of GPUs,
 * and a launcher that hands each rank one GPU through CUDA_VISIBLE_DEVICES shows each rank a
 * single GPU among many ranks. So each rank reports the identity of the GPU it uses (its UUID,
 * unique across hosts) and whether its libcollective has NCCL; the ranks exchange the reports
 * (ddp-train allgathers them as bytes over its cpu communicator) and each decides from all of
 * them with train_backend_decide(), so that all decide the same.
 *
 * Pure logic: no devices, no communication. Thread-safe.
 */
#ifndef DDP_TRAIN_BACKEND_H
#define DDP_TRAIN_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "coll.h"

/* One rank's report, exchanged as sizeof bytes (bytes only: no padding, no byte order). */
typedef struct train_gpu_ident {
    uint8_t uuid[16]; /* the GPU's UUID (cudaDeviceProp.uuid); unused without a GPU */
    uint8_t has_gpu;  /* 1: the rank computes on a GPU, 0: on the host */
    uint8_t has_nccl; /* 1: the rank's libcollective was built with NCCL */
} train_gpu_ident;

/*
 * The backend of a job of `world` ranks (world >= 1) whose reports are ranks[0..world), rank r's
 * at r, for the requested `want` (COLL_BACKEND_AUTO, _CPU or _NCCL):
 *   nccl when want is auto or nccl, every rank has a GPU, no two ranks have the same GPU and
 *   every rank has NCCL; else cpu.
 * Returns 0 and sets *out. When auto gives cpu, why[cap] (may be NULL) says why, as a phrase
 * naming the first rank concerned, in this order: "rank 3 has no GPU", "rank 1's libcollective
 * was built without NCCL", "ranks 0 and 2 use the same GPU, GPU-5b1c0d2e-..., and NCCL allows one
 * rank per GPU"; else it is "".
 * Returns -ENOTSUP, *out untouched, when want is nccl and one of those holds (why says which),
 * and -EINVAL for bad arguments.
 */
int train_backend_decide(coll_backend want, const train_gpu_ident *ranks, int world,
                         coll_backend *out, char *why, size_t cap);

#endif /* DDP_TRAIN_BACKEND_H */
