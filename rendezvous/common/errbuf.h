/*
 * A module's last-error sentence, for modules whose failing functions have no object to keep one
 * in (a parser, a file reader, a constructor that failed): the module declares its own buffer,
 * per thread, and its failure paths fill it with errbuf_set(), which returns the code so that a
 * failure reads `return errbuf_set(&last_error, -EINVAL, "...", ...)`. Objects keep theirs in a
 * member (rdzv_client_last_error(), coll_last_error()), and may use the same type.
 *
 *     static _Thread_local errbuf last_error;
 *     const char *data_last_error(void) { return last_error.msg; }
 *
 * Messages longer than ERRBUF_BYTES - 1 bytes are cut. Internal to the project: not installed.
 */
#ifndef DDP_ERRBUF_H
#define DDP_ERRBUF_H

#include <stdarg.h>

#define ERRBUF_BYTES 512

typedef struct errbuf {
    char msg[ERRBUF_BYTES]; /* NUL-terminated; "" until the first errbuf_set() */
} errbuf;

/* Formats the sentence into eb (replacing what was there) and returns `code`. */
int errbuf_set(errbuf *eb, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The same with a va_list, for a module's own variadic wrapper. */
int errbuf_vset(errbuf *eb, int code, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* Forgets the last failure: eb's sentence becomes "". */
static inline void errbuf_clear(errbuf *eb)
{
    eb->msg[0] = '\0';
}

#endif /* DDP_ERRBUF_H */
