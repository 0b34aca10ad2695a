/*
 * Multiplexed connections: how a store proxy (proxy.c) carries the connections of many workers
 * over one connection to the root store, and what the root keeps for each of them. Internal to
 * librendezvous; see rdzv-protocol(7), "MULTIPLEXED CONNECTIONS".
 *
 * Wire format, on a modern connection (after VALIDATE and, on a store with a secret, the
 * handshake of auth.h, which the multiplexed connection itself must have completed):
 *
 *     MUX        0xE3  u32 vconn id, then one vector: u8 flags, then one whole request frame
 *     MUX_CLOSE  0xE4  u32 vconn id
 *
 * The first MUX frame naming an id opens that virtual connection (vconn); the request frame is
 * in the generation flags bit RDZV_MUX_LEGACY says, fixed by that first frame, and runs at the
 * root exactly as on a connection of its own: its replies, pending WAITs, CANCEL_WAIT, legacy
 * watches, caps and the private-key rule (a private key only when RDZV_MUX_AUTH is set and the
 * multiplexed connection authenticated). MUX_CLOSE ends it as a closed connection ends; an id
 * the root does not know is ignored, so ids are never reused by a proxy. Every reply byte of a
 * vconn comes back as
 *
 *     u32 vconn id, u32 length (at most RDZV_MUX_REPLY_MAX), that many reply bytes
 *
 * in the order the store made the replies (a reply may be split over frames, and a frame may
 * hold part of one: the bytes of one vconn, concatenated, are what its own connection would
 * have received). A length of RDZV_MUX_CLOSED, with no bytes, says the root closed the vconn
 * (bad input, a refused private key, a cap): the proxy closes its worker. The multiplexed
 * connection counts as one connection at the root; losing it closes all its vconns.
 *
 * No I/O here: the table of a connection's vconns and the decoding of a MUX frame.
 */
#ifndef RDZV_MUX_H
#define RDZV_MUX_H

#include "proto.h"
#include "store.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RDZV_MUX_AUTH 0x01   /* the worker behind this vconn authenticated at the proxy */
#define RDZV_MUX_LEGACY 0x02 /* the vconn speaks the legacy generation (PyTorch 1.x) */
#define RDZV_MUX_REPLY_MAX 0xFFFFFFFEu
#define RDZV_MUX_CLOSED 0xFFFFFFFFu

/* A virtual connection at the root: a store connection of its own (conn.mux, conn.vid). */
typedef struct rdzv__vconn {
    rdzv__conn conn;
    rdzv__parser parser;      /* of its request frames, generation fixed */
    struct rdzv__vconn *next; /* in its bucket */
} rdzv__vconn;

/* A multiplexed connection's vconns by id. Zero-initialised: empty. */
typedef struct rdzv__vtable {
    rdzv__vconn **buckets;
    size_t nbuckets; /* power of two, or 0 */
    size_t n;
} rdzv__vtable;

/* The vconn `id` of `t`, or NULL. */
rdzv__vconn *rdzv__vtable_find(const rdzv__vtable *t, uint32_t id);

/* Opens vconn `id` of the multiplexed connection `mux` in `t` (absent), in the legacy or modern
 * generation. Returns 0 and sets *out, or -ENOMEM. */
int rdzv__vtable_add(rdzv__vtable *t, rdzv__conn *mux, uint32_t id, bool legacy, rdzv__vconn **out);

/* Takes `v` out of `t` and frees it; its connection must have been released
 * (rdzv__conn_release()) first. */
void rdzv__vtable_remove(rdzv__vtable *t, rdzv__vconn *v);

/* Frees the table itself (empty it first). */
void rdzv__vtable_free(rdzv__vtable *t);

/*
 * Decodes the vector of a parsed MUX request `mux` for vconn `v`: its flags into *flags and its
 * request frame into *inner (pointing into the caller's buffer). Returns 0, or a negative
 * RDZV_PARSE_* code, or -EPROTO when the vector is not exactly one whole frame (the multiplexed
 * connection is then out of step: close it).
 */
int rdzv__mux_parse(rdzv__vconn *v, const rdzv__limits *lim, const rdzv__request *mux,
                    uint8_t *flags, rdzv__request *inner);

/* Appends a MUX frame carrying `frame` (`n` bytes, one whole request) for vconn `id`. */
void rdzv__mux_put(rdzv__wbuf *b, uint32_t id, uint8_t flags, const void *frame, size_t n);

/* Appends a MUX_CLOSE frame for vconn `id`. */
void rdzv__mux_put_close(rdzv__wbuf *b, uint32_t id);

#endif /* RDZV_MUX_H */
