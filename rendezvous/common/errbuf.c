/*
 * The last-error buffer's formatting (errbuf.h). No allocation, no I/O; a buffer is touched only
 * through the pointer its caller passes, so per-thread buffers need no lock.
 */
#include "errbuf.h"

#include <stdio.h>

int errbuf_vset(errbuf *eb, int code, const char *fmt, va_list ap)
{
    vsnprintf(eb->msg, sizeof eb->msg, fmt, ap);
    return code;
}

int errbuf_set(errbuf *eb, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    errbuf_vset(eb, code, fmt, ap);
    va_end(ap);
    return code;
}
