/*
 * The project's sentences for sets of ranks and for endpoints (fmt.h). Pure: no I/O, no
 * allocation, no state.
 */
#include "fmt.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int fmt_rank_list(const bool *flags, int n, char *buf, size_t cap)
{
    if (!flags || n < 0 || !buf || cap == 0)
        return -EINVAL;
    size_t used = 0;
    int count = 0;
    buf[0] = '\0';
    for (int r = 0; r < n; r++) {
        if (!flags[r])
            continue;
        if (count++ < FMT_SHOW_RANKS && used < cap) {
            int w = snprintf(buf + used, cap - used, "%s%d", count > 1 ? ", " : "", r);
            used = w < 0 ? cap : used + (size_t)w;
        }
    }
    if (count > FMT_SHOW_RANKS && used < cap)
        snprintf(buf + used, cap - used, " and %d more", count - FMT_SHOW_RANKS);
    return count;
}

int fmt_missing_ranks(const bool *missing, int n, const char *noun, const char *what, char *buf,
                      size_t cap)
{
    if (!missing || n < 0 || !noun || !what || !buf || cap == 0)
        return -EINVAL;
    char list[FMT_SHOW_RANKS * 12 + 32];
    int count = fmt_rank_list(missing, n, list, sizeof list);
    if (count == 0)
        buf[0] = '\0';
    else
        snprintf(buf, cap, "%s%s %s %s (%d of %d present)", noun, count == 1 ? "" : "s", list, what,
                 n - count, n);
    return count;
}

void fmt_endpoint(char *dst, size_t cap, const char *host, int port)
{
    snprintf(dst, cap, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
}

int fmt_err(char *err, size_t cap, int rc, const char *fmt, ...)
{
    if (err && cap > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, cap, fmt, ap);
        va_end(ap);
    }
    return rc;
}
