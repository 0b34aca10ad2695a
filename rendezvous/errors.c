/*
 * Error strings and memory release for librendezvous. Return codes are negative errno
 * values; libuv's codes are the same numbers on Unix, and getaddrinfo failures are translated
 * to errno values where they happen, so one table (the C library's) names them all.
 */
#include "rdzv.h"

#include <stdlib.h>
#include <string.h>

const char *rdzv_strerror(int err)
{
    if (err >= 0)
        return "success";
    /* strerrordesc_np returns a static string and is thread-safe, unlike strerror. */
    const char *s = strerrordesc_np(-err);
    return s ? s : "unknown error";
}

void rdzv_free(void *p)
{
    free(p);
}
