/*
 * The byte buffers of librendezvous (rdzv__buf, store.h): the connections' reply queues and
 * partly received requests. Small buffers come from malloc; large ones are mappings of their
 * own, and each thread keeps a few freed mappings for reuse (see below). Nothing here knows
 * about connections, caps or the store: the callers count what the buffers hold.
 */
#include "store.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/*
 * Buffers of RDZV__BUF_MAP_BYTES and more are pages of their own (mmap), grown with mremap and
 * given back with munmap: their capacity beyond what was written costs no memory, and freeing
 * them returns the memory at once. From the allocator, a reply buffer's doubling, and the
 * chunks it frees and keeps, would make the server's resident size 2 to 3 times what its buffer
 * caps count.
 *
 * Mapping and unmapping each large request and reply costs page faults (a round trip of 1 MiB
 * takes up to 9 times as long, 32 connections doing so 4 times), so each thread keeps freed
 * mappings, up to spare_limit bytes (rdzv__buf_spares_limit()), for the next large buffers:
 * that much may stay resident beyond what the caps count. Sent pages are not given back
 * early (madvise) for the same reason: a reused buffer would fault them in again.
 */
#define PAGE_ROUND(n) (((n) + 4095) & ~(size_t)4095)
#define SPARE_SLOTS 32

static _Thread_local struct spare {
    uint8_t *p; /* NULL: a free slot */
    size_t cap;
} spares[SPARE_SLOTS];
static _Thread_local size_t spare_bytes, spare_limit = 8 << 20;

/* Takes the smallest spare mapping of at least `cap` bytes (setting *got to its size), or
 * returns NULL. */
static uint8_t *spare_take(size_t cap, size_t *got)
{
    struct spare *best = NULL;
    for (int i = 0; i < SPARE_SLOTS; i++)
        if (spares[i].p && spares[i].cap >= cap && (!best || spares[i].cap < best->cap))
            best = &spares[i];
    if (!best)
        return NULL;
    uint8_t *p = best->p;
    *got = best->cap;
    spare_bytes -= best->cap;
    best->p = NULL;
    return p;
}

/* Keeps a freed mapping as a spare while there is room, else unmaps it. */
static void spare_give(uint8_t *p, size_t cap)
{
    if (spare_bytes <= spare_limit && cap <= spare_limit - spare_bytes)
        for (int i = 0; i < SPARE_SLOTS; i++)
            if (!spares[i].p) {
                spares[i] = (struct spare){p, cap};
                spare_bytes += cap;
                return;
            }
    munmap(p, cap);
}

void rdzv__buf_spares_limit(size_t nbytes)
{
    spare_limit = nbytes;
    if (spare_bytes > nbytes)
        rdzv__buf_spares_free();
}

void rdzv__buf_spares_free(void)
{
    for (int i = 0; i < SPARE_SLOTS; i++)
        if (spares[i].p) {
            munmap(spares[i].p, spares[i].cap);
            spares[i].p = NULL;
        }
    spare_bytes = 0;
}

/* Moves b to a capacity of at least `cap` bytes. Returns 0 or -ENOMEM (b unchanged). */
static int buf_resize(rdzv__buf *b, size_t cap)
{
    uint8_t *d;
    if (cap >= RDZV__BUF_MAP_BYTES) {
        cap = PAGE_ROUND(cap);
        if (cap > b->cap && (d = spare_take(cap, &cap))) {
            if (b->len)
                memcpy(d, b->data, b->len);
        } else {
            d = b->mapped ? mremap(b->data, b->cap, cap, MREMAP_MAYMOVE)
                          : mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                                 -1, 0);
            if (d == MAP_FAILED)
                return -ENOMEM;
            if (b->mapped) { /* moved or resized in place: nothing left to free */
                b->data = d;
                b->cap = cap;
                return 0;
            }
            if (b->len)
                memcpy(d, b->data, b->len);
        }
        if (b->mapped)
            spare_give(b->data, b->cap);
        else
            free(b->data);
        b->mapped = true;
    } else {
        if (b->mapped) /* shrinking below the mapped sizes: keep the pages */
            return 0;
        if (!(d = realloc(b->data, cap)))
            return -ENOMEM;
    }
    b->data = d;
    b->cap = cap;
    return 0;
}

int rdzv__buf_reserve(rdzv__buf *b, size_t extra)
{
    if (b->cap - b->len >= extra)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < extra) {
        if (cap > SIZE_MAX / 2)
            return -ENOMEM;
        cap *= 2;
    }
    return buf_resize(b, cap);
}

void rdzv__buf_fit(rdzv__buf *b)
{
    if (b->mapped && PAGE_ROUND(b->len) < b->cap && b->len >= RDZV__BUF_MAP_BYTES)
        buf_resize(b, b->len); /* a failure keeps the larger mapping: still correct */
}

int rdzv__buf_append(rdzv__buf *b, const void *p, size_t n)
{
    int rc = rdzv__buf_reserve(b, n);
    if (rc < 0)
        return rc;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

void rdzv__buf_free(rdzv__buf *b)
{
    if (b->mapped)
        spare_give(b->data, b->cap);
    else
        free(b->data);
    b->mapped = false;
    b->data = NULL;
    b->len = b->cap = 0;
}
