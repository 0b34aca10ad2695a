/*
 * The root's side of multiplexed connections (mux.h): a hash table of a connection's virtual
 * connections by id, and the decoding and encoding of MUX frames. server.c runs their requests;
 * store.c frames their replies (vreply()). No I/O here.
 */
#include "mux.h"

#include <errno.h>
#include <stdlib.h>

static size_t bucket(const rdzv__vtable *t, uint32_t id)
{
    return (id * 2654435761u) & (t->nbuckets - 1);
}

rdzv__vconn *rdzv__vtable_find(const rdzv__vtable *t, uint32_t id)
{
    if (t->nbuckets == 0)
        return NULL;
    rdzv__vconn *v = t->buckets[bucket(t, id)];
    while (v && v->conn.vid != id)
        v = v->next;
    return v;
}

/* Doubles the table (from 16 buckets); returns 0 or -ENOMEM, keeping the old one. */
static int grow(rdzv__vtable *t)
{
    size_t n = t->nbuckets ? t->nbuckets * 2 : 16;
    rdzv__vconn **b = calloc(n, sizeof(*b));
    if (!b)
        return -ENOMEM;
    rdzv__vtable old = *t;
    t->buckets = b;
    t->nbuckets = n;
    for (size_t i = 0; i < old.nbuckets; i++)
        for (rdzv__vconn *v = old.buckets[i], *next; v; v = next) {
            next = v->next;
            size_t k = bucket(t, v->conn.vid);
            v->next = b[k];
            b[k] = v;
        }
    free(old.buckets);
    return 0;
}

int rdzv__vtable_add(rdzv__vtable *t, rdzv__conn *mux, uint32_t id, bool legacy, rdzv__vconn **out)
{
    if (t->n >= t->nbuckets && grow(t) < 0)
        return -ENOMEM;
    rdzv__vconn *v = calloc(1, sizeof(*v));
    if (!v)
        return -ENOMEM;
    rdzv__conn_init(&v->conn);
    v->conn.mux = mux;
    v->conn.vid = id;
    rdzv__parser_init(&v->parser);
    v->parser.gen = legacy ? RDZV_GEN_LEGACY : RDZV_GEN_MODERN;
    size_t k = bucket(t, id);
    v->next = t->buckets[k];
    t->buckets[k] = v;
    t->n++;
    *out = v;
    return 0;
}

void rdzv__vtable_remove(rdzv__vtable *t, rdzv__vconn *v)
{
    rdzv__vconn **p = &t->buckets[bucket(t, v->conn.vid)];
    while (*p != v)
        p = &(*p)->next;
    *p = v->next;
    t->n--;
    free(v);
}

void rdzv__vtable_free(rdzv__vtable *t)
{
    free(t->buckets);
    *t = (rdzv__vtable){0};
}

int rdzv__mux_parse(rdzv__vconn *v, const rdzv__limits *lim, const rdzv__request *mux,
                    uint8_t *flags, rdzv__request *inner)
{
    if (mux->key_len < 2) /* the vector is the frame's first string field */
        return -EPROTO;
    *flags = mux->key[0];
    size_t n = mux->key_len - 1;
    int rc = rdzv__parse(&v->parser, lim, mux->key + 1, n, inner);
    if (rc < 0)
        return rc;
    if ((size_t)rc != n) {
        rdzv__parser_init(&v->parser); /* the connection closes; leave no frame under way */
        return -EPROTO;
    }
    return 0;
}

void rdzv__mux_put(rdzv__wbuf *b, uint32_t id, uint8_t flags, const void *frame, size_t n)
{
    rdzv__put_u8(b, RDZV_M_MUX);
    rdzv__put_u32(b, id);
    rdzv__put_u64(b, (uint64_t)n + 1);
    rdzv__put_u8(b, flags);
    rdzv__put_raw(b, frame, n);
}

void rdzv__mux_put_close(rdzv__wbuf *b, uint32_t id)
{
    rdzv__put_u8(b, RDZV_M_MUX_CLOSE);
    rdzv__put_u32(b, id);
}
