/*
 * CRC32C (Castagnoli) for the checkpoint files (ckpt.h): SSE4.2's crc32 instruction when the CPU
 * has it, chosen once at run time (never from the build machine's flags), else a byte table.
 * Both give the same value; tests/libddp/test_ckpt.c checks them against each other and against the
 * standard check value. Debian packages no CRC32C library for C, so this is the one place that
 * computes it.
 */
#include "ckpt.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_SSE42_PATH 1
#include <nmmintrin.h>
#endif

/* The reflected polynomial 0x1EDC6F41. */
#define POLY 0x82F63B78u

static uint32_t table[256];

static void make_table(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        table[i] = c;
    }
}

static uint32_t crc_table(uint32_t c, const unsigned char *p, size_t n)
{
    while (n--)
        c = table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c;
}

#ifdef HAVE_SSE42_PATH
__attribute__((target("sse4.2"))) static uint32_t crc_sse42(uint32_t c, const unsigned char *p,
                                                              size_t n)
{
    uint64_t c64 = c;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c64 = _mm_crc32_u64(c64, v);
    }
    c = (uint32_t)c64;
    while (n--)
        c = _mm_crc32_u8(c, *p++);
    return c;
}
#endif

typedef uint32_t (*crc_fn)(uint32_t, const unsigned char *, size_t);

static crc_fn choose(void)
{
#ifdef HAVE_SSE42_PATH
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2"))
        return crc_sse42;
#endif
    return crc_table;
}

static crc_fn impl;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* DDP_CRC32C_TABLE=1 in the environment forces the table, for the tests that compare both. */
static void init(void)
{
    make_table();
    const char *e = getenv("DDP_CRC32C_TABLE");
    impl = e && *e == '1' ? crc_table : choose();
}

uint32_t ddp__crc32c(uint32_t crc, const void *buf, size_t n)
{
    pthread_once(&once, init);
    return ~impl(~crc, buf, n);
}
