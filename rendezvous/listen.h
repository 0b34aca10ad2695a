/*
 * The server's settings and listening socket (listen.c), shared with server.c. Internal to
 * librendezvous (rdzv__ names, not exported).
 */
#ifndef RDZV_LISTEN_H
#define RDZV_LISTEN_H

#include "rdzv.h"

#include <stddef.h>

/* Returns 0 when every field of `o` is in its range (rdzv.h), else -EINVAL (also for NULL). */
int rdzv__server_check_options(const rdzv_server_options *o);

/*
 * Makes the listening socket with plain socket calls (see listen.c): *fd is o->listen_fd
 * (adopted) or -1 (bind o->host:o->port); on return it holds the socket, which is the caller's
 * to close on any failure. Returns 0 and sets *port, or a negative errno.
 */
int rdzv__listen_socket(const rdzv_server_options *o, int *fd, int *port);

/*
 * max_connections for a server whose option is 0: what RLIMIT_NOFILE leaves once the
 * descriptors open now, 16 for the server and `reserve` for the host program are set aside;
 * at least 1.
 */
size_t rdzv__derive_max_connections(size_t reserve);

#endif /* RDZV_LISTEN_H */
