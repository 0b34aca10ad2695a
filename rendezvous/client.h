/*
 * The client's state and the socket primitives its two files share: client.c (the operations,
 * the request encoding and the reading of replies) and connect.c (connecting, the handshakes,
 * the client's life cycle). Internal to librendezvous; rdzv.h's rdzv_client is this struct,
 * opaque to everyone else. The stream invariant of client.c's file comment holds for both.
 */
#ifndef RDZV_CLIENT_H
#define RDZV_CLIENT_H

#include "proto.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Receive buffer size: larger replies are read straight into their destination. */
#define RBUF_BYTES 16384
/* A vector reply longer than this cannot be genuine and is treated as a protocol error. */
#define MAX_REPLY_BYTES ((uint64_t)1 << 40)
/* A send buffer that grew past this is released after the call instead of being kept. */
#define SBUF_KEEP_BYTES (1u << 20)
#define ERR_BYTES 512
#define WHAT_BYTES 160
/* Room for the detail after "<what>: ", so that messages fit ERR_BYTES untruncated. */
#define DETAIL_BYTES 300
/* Longest piece of a key quoted in an error message. */
#define KEY_QUOTE_BYTES 64

/* "No deadline": far enough in the future never to pass. */
#define NO_DEADLINE INT64_MAX /* what mono_deadline_ns() returns for no timeout */

typedef struct rdzv_client rdzv_client;

struct rdzv_client {
    int fd;      /* -1 once broken */
    bool broken; /* the stream is out of step with the server; see the file comment */
    int timeout_ms;
    char *prefix; /* owned, NULL when empty */
    size_t prefix_len;
    char *token; /* owned, NULL: the client does not authenticate */

    rdzv__wbuf sbuf; /* request under construction */

    size_t rpos, rlen; /* unread reply bytes are rbuf[rpos..rlen) */
    bool just_sent;    /* a request just left: its reply is not there yet, so poll first */
    uint64_t rng;      /* xorshift state for PING nonces */

    char what[WHAT_BYTES]; /* the operation under way, for error messages */
    char err[ERR_BYTES];   /* last failure, "" if none */
    char broken_why[ERR_BYTES];
    uint8_t rbuf[RBUF_BYTES];

    /* The barrier this client entered last: a hash of its name and the epoch it was in, the
     * guess of rdzv_barrier()'s first round trip (client.c, "The barrier"). */
    uint64_t barrier_hash;
    int64_t barrier_epoch;
};

/* The next number of the client's xorshift generator (PING nonces, backoff jitter, tags). */
uint64_t rdzv__rng_next(uint64_t *s);

/*
 * Waits until `fd` is ready for `events` or `deadline` (monotonic nanoseconds; NO_DEADLINE:
 * none) passes. Returns 0, -ETIMEDOUT, or a negative errno from poll().
 */
int rdzv__wait_fd(int fd, short events, int64_t deadline);

/*
 * Sends `len` bytes on the client's socket, waiting for room up to `deadline`. Returns 0,
 * -ETIMEDOUT, -ECONNRESET (the peer closed) or another negative errno; records and breaks
 * nothing. *sent (if not NULL) receives how many bytes left, also on failure.
 */
int rdzv__send_all(rdzv_client *c, const uint8_t *p, size_t len, int64_t deadline, size_t *sent);

/*
 * Reads exactly `n` reply bytes into `dst` (NULL: discard them). Returns 0, -ETIMEDOUT,
 * -ECONNRESET (the peer closed), or another negative errno; records and breaks nothing.
 */
int rdzv__recv_raw(rdzv_client *c, void *dst, size_t n, int64_t deadline);

#endif /* RDZV_CLIENT_H */
