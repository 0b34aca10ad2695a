/*
 * Request builders for the tests and the fuzzer: append wire-format fields to a growable
 * buffer. Test code only; aborts on out-of-memory because a test cannot go on without memory.
 */
#ifndef TESTS_FRAMES_H
#define TESTS_FRAMES_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct frame {
    uint8_t *p;
    size_t n, cap;
} frame;

static inline void fr_raw(frame *f, const void *p, size_t n)
{
    if (f->n + n > f->cap) {
        f->cap = (f->n + n) * 2 + 64;
        f->p = realloc(f->p, f->cap);
        if (!f->p)
            abort();
    }
    if (n)
        memcpy(f->p + f->n, p, n);
    f->n += n;
}
static inline void fr_u8(frame *f, uint8_t v)
{
    fr_raw(f, &v, 1);
}
static inline void fr_u32(frame *f, uint32_t v)
{
    fr_raw(f, &v, 4);
}
static inline void fr_u64(frame *f, uint64_t v)
{
    fr_raw(f, &v, 8);
}
static inline void fr_bytes(frame *f, const void *p, size_t n)
{
    fr_u64(f, n);
    fr_raw(f, p, n);
}
static inline void fr_str(frame *f, const char *s)
{
    fr_bytes(f, s, strlen(s));
}
static inline void fr_reset(frame *f)
{
    f->n = 0;
}
static inline void fr_free(frame *f)
{
    free(f->p);
    f->p = NULL;
    f->n = f->cap = 0;
}

#endif
