/*
 * Request builders for the tests: thin wrappers over librendezvous's request encoder
 * (proto.h), which append wire-format fields to a growable buffer. Test code only; they abort
 * when the encoder fails (out of memory) because a test cannot go on without memory. Fields may
 * be appended in any order, so malformed frames are built as easily as valid ones.
 */
#ifndef TESTS_FRAMES_H
#define TESTS_FRAMES_H

#include "proto.h"

#include <stdlib.h>
#include <string.h>

/* A zeroed frame is empty; f.data[0..f.len) holds what was appended. */
typedef rdzv__wbuf frame;

static inline void fr_check(const frame *f)
{
    if (f->err)
        abort();
}
static inline void fr_raw(frame *f, const void *p, size_t n)
{
    rdzv__put_raw(f, p, n);
    fr_check(f);
}
static inline void fr_u8(frame *f, uint8_t v)
{
    rdzv__put_u8(f, v);
    fr_check(f);
}
static inline void fr_u32(frame *f, uint32_t v)
{
    rdzv__put_u32(f, v);
    fr_check(f);
}
static inline void fr_u64(frame *f, uint64_t v)
{
    rdzv__put_u64(f, v);
    fr_check(f);
}
static inline void fr_bytes(frame *f, const void *p, size_t n)
{
    rdzv__put_vec(f, p, n);
    fr_check(f);
}
static inline void fr_str(frame *f, const char *s)
{
    fr_bytes(f, s, strlen(s));
}
static inline void fr_reset(frame *f)
{
    rdzv__wbuf_reset(f);
}
static inline void fr_free(frame *f)
{
    rdzv__wbuf_free(f);
}

#endif
