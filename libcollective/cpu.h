/*
 * The cpu backend's state, shared by its two halves: cpu_boot.c builds it (through the store)
 * and tears it down, cpu.c runs the algorithms on it. Nothing else includes this header; the
 * rest of the library sees coll__cpu as opaque (coll_internal.h). Not installed.
 *
 * Shared memory. The leader creates one segment per communicator: a header of per-rank progress
 * counters (coll__shm_hdr), a channel per ordered pair of local ranks for send/recv, and two
 * buffer sets (used by alternate steps, so that one step's writes never race the previous
 * step's reads). A set holds one chunk-sized slot per local rank and one chunk-sized result
 * area R. cpu_boot.c lays the segment out and points `channels` and `sets` into it.
 */
#ifndef COLL_CPU_H
#define COLL_CPU_H

#include "coll_internal.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define COLL__CPU_CHANNEL_BYTES (64 * 1024) /* ring buffer of a send/recv channel */
#define COLL__CPU_ALIGN 64                  /* chunks and shares are cut at cache lines */

typedef struct coll__channel {
    coll__counter sent;  /* bytes written by the sender, ever */
    coll__counter recvd; /* bytes consumed by the receiver, ever */
    unsigned char data[COLL__CPU_CHANNEL_BYTES];
} coll__channel;

/* What a rank published under "<prefix>/cpu/<rank>". */
typedef struct coll__rank_info {
    char host[160]; /* identity (cpu_boot.c's host_identity()) */
    char name[64];  /* hostname, for messages */
    char addr[64];  /* numeric address of its TCP listener */
    int port;
    int pid;
    char algo[16]; /* its COLL_CPU_ALGO choice, by name */
} coll__rank_info;

struct coll__cpu {
    int rank, world;
    int nhosts, host;       /* number of hosts, my host's index */
    int nlocal, local;      /* ranks on my host, my index among them */
    coll__rank_info *ranks; /* [world] */
    coll__layout layout;    /* who shares which host (layout.c) */
    size_t chunk, small;
    uint64_t step; /* steps run so far */
    coll__shm shm;
    coll__tcp tcp;
    coll__channel *channels; /* [nlocal * nlocal], [src * nlocal + dst] */
    unsigned char *sets[2];  /* each: nlocal slots of chunk bytes, then R */
    unsigned char *tmp;      /* chunk bytes, receive buffer of the ring */
    struct iovec *iov;       /* [world] scratch for host blocks */
    int64_t deadline;        /* of the operation running */
    int culprit;             /* rank named by the last failure, -1 none */
    int algo;                /* the reductions' row COLL_CPU_ALGO forces, or
                                COLL__CPU_ALGO_AUTO (cpu.c) */
};

static inline coll__shm_hdr *coll__cpu_hdr(coll__cpu *c)
{
    return (coll__shm_hdr *)c->shm.base;
}

static inline size_t coll__round_up(size_t n, size_t a)
{
    return (n + a - 1) / a * a;
}

#endif /* COLL_CPU_H */
