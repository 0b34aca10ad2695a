/*
 * Temporary definitions of coll__now_ns() and coll__deadline() for the tcp branch, so that
 * tcp.c and its tests link before util.c (which owns them) is merged. Dropped at the merge.
 */
#include "coll_internal.h"

#include <time.h>

int64_t coll__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t coll__deadline(int timeout_ms)
{
    if (timeout_ms < 0)
        return INT64_MAX;
    return coll__now_ns() + (int64_t)timeout_ms * 1000000;
}
