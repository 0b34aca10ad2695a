/*
 * Internals shared across librendezvous's files (rdzv__ prefix), not exported from the shared
 * library: what the store helpers and the environment reader (helpers.c, env.c) need of the
 * client (client.c, connect.c), whose struct stays private to those two files (client.h).
 */
#ifndef RDZV_INTERNAL_H
#define RDZV_INTERNAL_H

#include "rdzv.h"

/*
 * Replaces the account rdzv_client_last_error() gives: the client's own (c != NULL) or the
 * calling thread's (c == NULL, as after a failed connect). Returns `err`, so a caller can write
 * `return rdzv__client_error(c, -EINVAL, "...")`.
 */
int rdzv__client_error(rdzv_client *c, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The client's call timeout in milliseconds (< 0: none). */
int rdzv__client_timeout_ms(const rdzv_client *c);

/*
 * The client's last call as its error messages name it ("check 'job/key'"): the operation and
 * its first key, with the client's prefix. Owned by the client, valid until its next call.
 */
const char *rdzv__client_what(const rdzv_client *c);

#endif /* RDZV_INTERNAL_H */
