/*
 * The cpu backend's algorithms, on the state cpu_boot.c built (cpu.h): collectives in shared
 * memory within a host and over the leaders' TCP ring across hosts, and send/recv.
 *
 * Steps. Collectives are cut into steps of at most one chunk per rank. Every local rank runs the
 * same sequence of steps (the sequence depends only on arguments every rank passes alike), and
 * announces its progress through its counter as step * 4 + phase:
 *   phase 1  my input for this step is in my slot (or in R)
 *   phase 2  my share of R is reduced
 *   phase 3  (leader) R is final after the exchange among hosts
 * Before writing its slot at step s, a rank waits until every local rank has reached step s - 1,
 * which means they have finished reading the set step s - 2 used.
 *
 * Algorithms. Reductions: every local rank copies its chunk into its slot, then reduces 1/L of
 * the chunk over all slots into R (a reduce-scatter in shared memory); with several hosts the
 * leader runs a ring allreduce of R with the other leaders; then everyone copies R out (an
 * allgather in shared memory). That is the "ring" row of the reductions' table; its "latency"
 * row takes messages up to small_bytes on a single host in one phase: every rank reduces all
 * slots itself. COLL_CPU_ALGO forces a row (cpu_boot.c reads it). Broadcast forwards R along the
 * leaders' ring; allgather runs a ring allgather of host blocks. Send/recv use the pair's channel
 * within a host and a direct TCP connection across hosts.
 *
 * Not here: the bootstrap, the segment's layout and teardown (cpu_boot.c), which ranks share a
 * host (layout.c), the request queue and the progress thread (backend_cpu.c), device buffers
 * (backend_cpu.c stages them), and the element kernels (reduce.c). No store I/O happens here.
 */
#include "cpu.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#define PHASES 4
#define STREAM_BYTES ((size_t)8 << 20) /* results this large bypass the cache (copy_out) */

/*
 * Copies a result to the caller's buffer. For large operations the destination will not be read
 * again soon, so on x86-64 it is written with non-temporal stores: that skips reading each
 * destination line into the cache first, a third of the memory traffic of a plain copy.
 */
static void copy_out(void *dst, const void *src, size_t n, bool stream)
{
#if defined(__x86_64__)
    if (stream && n >= 256) {
        unsigned char *d = dst;
        const unsigned char *s = src;
        size_t head = (16 - ((uintptr_t)d & 15)) & 15;
        memcpy(d, s, head);
        d += head;
        s += head;
        n -= head;
        for (; n >= 64; n -= 64, d += 64, s += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)s);
            __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
            __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
            _mm_stream_si128((__m128i *)d, a);
            _mm_stream_si128((__m128i *)(d + 16), b);
            _mm_stream_si128((__m128i *)(d + 32), c);
            _mm_stream_si128((__m128i *)(d + 48), e);
        }
        memcpy(d, s, n);
        _mm_sfence();
        return;
    }
#endif
    (void)stream;
    memcpy(dst, src, n);
}

/* ------------------------------------------------------------------------------------------ */
/* Synchronisation within the host                                                             */
/* ------------------------------------------------------------------------------------------ */

static void post(coll__cpu *c, uint64_t v)
{
    coll__shm_post(&c->shm, &coll__cpu_hdr(c)->arrive[c->local].v, v);
}

static int wait_all(coll__cpu *c, uint64_t v)
{
    return coll__shm_wait_all(&c->shm, v, c->deadline, &c->culprit);
}

static int wait_one(coll__cpu *c, int local, uint64_t v)
{
    return coll__shm_wait(&c->shm, &coll__cpu_hdr(c)->arrive[local].v, v, local, c->deadline,
                          &c->culprit);
}

/* Before writing the buffer set of step s: everyone has begun step s - 1. */
static int guard(coll__cpu *c, uint64_t s)
{
    return s == 0 ? 0 : wait_all(c, (s - 1) * PHASES + 1);
}

static unsigned char *slot(coll__cpu *c, uint64_t s, int local)
{
    return c->sets[s & 1] + (size_t)local * c->chunk;
}

static unsigned char *result(coll__cpu *c, uint64_t s)
{
    return c->sets[s & 1] + (size_t)c->nlocal * c->chunk;
}

/* [lo, hi) of n elements: this local rank's share, cut at cache-line multiples. */
static void my_share(const coll__cpu *c, size_t n, size_t esz, size_t *lo, size_t *hi)
{
    size_t line = COLL__CPU_ALIGN / esz;
    size_t per = coll__round_up((n + (size_t)c->nlocal - 1) / (size_t)c->nlocal, line);
    *lo = per * (size_t)c->local;
    *hi = *lo + per;
    if (*lo > n)
        *lo = n;
    if (*hi > n)
        *hi = n;
}

/* Reduces elements [lo, hi) over every local slot of step s into dst. */
static void reduce_slots(coll__cpu *c, uint64_t s, void *dst, size_t lo, size_t hi, size_t esz,
                         coll_dtype dt, coll_op op)
{
    const void *srcs[COLL__MAX_LOCAL];
    for (int i = 0; i < c->nlocal; i++)
        srcs[i] = slot(c, s, i) + lo * esz;
    if (hi > lo)
        coll__reduce_n((unsigned char *)dst + lo * esz, srcs, c->nlocal, hi - lo, dt, op);
}

/*
 * A step of a reduction covers, per block (one for allreduce, `size` for reduce-scatter), the
 * n elements at `off`: slot element e is element (e / n) * count + off + e % n of the input.
 */
typedef struct piece {
    const unsigned char *in;
    size_t n, count, off, esz;
} piece;

static const unsigned char *input_at(const piece *p, size_t e)
{
    return p->in + ((e / p->n) * p->count + p->off + e % p->n) * p->esz;
}

/* End of the run starting at slot element e that is contiguous in the input too. */
static size_t run_end(const piece *p, size_t e, size_t hi)
{
    size_t end = (e / p->n + 1) * p->n;
    return end < hi ? end : hi;
}

/*
 * Copies into this rank's slot the shares the other local ranks reduce; its own share it
 * reduces straight from the input, which saves a copy of 1/L of the data.
 */
static void fill_slot(coll__cpu *c, uint64_t s, const piece *p, size_t total)
{
    unsigned char *mine = slot(c, s, c->local);
    size_t lo, hi;
    my_share(c, total, p->esz, &lo, &hi);
    for (size_t e = 0; e < total;) {
        if (e == lo && hi > lo) {
            e = hi;
            continue;
        }
        size_t end = run_end(p, e, e < lo && lo < total ? lo : total);
        memcpy(mine + e * p->esz, input_at(p, e), (end - e) * p->esz);
        e = end;
    }
}

/* Reduces this rank's share: its own input and the other ranks' slots, into R. */
static void reduce_share(coll__cpu *c, uint64_t s, const piece *p, size_t total, coll_dtype dt,
                         coll_op op)
{
    size_t lo, hi;
    my_share(c, total, p->esz, &lo, &hi);
    for (size_t e = lo; e < hi;) {
        size_t end = run_end(p, e, hi);
        const void *srcs[COLL__MAX_LOCAL];
        for (int i = 0; i < c->nlocal; i++)
            srcs[i] = i == c->local ? input_at(p, e) : slot(c, s, i) + e * p->esz;
        coll__reduce_n(result(c, s) + e * p->esz, srcs, c->nlocal, end - e, dt, op);
        e = end;
    }
    if (op == COLL_AVG && c->nhosts == 1 && hi > lo)
        coll__scale_avg(result(c, s) + lo * p->esz, hi - lo, dt, c->world);
}

/* ------------------------------------------------------------------------------------------ */
/* The leaders' ring                                                                           */
/* ------------------------------------------------------------------------------------------ */

static int ring_next(const coll__cpu *c)
{
    return c->layout.leaders[(c->host + 1) % c->nhosts];
}

static int ring_prev(const coll__cpu *c)
{
    return c->layout.leaders[(c->host + c->nhosts - 1) % c->nhosts];
}

static int xfer(coll__cpu *c, int to, const struct iovec *siov, int sn, int from,
                const struct iovec *riov, int rn)
{
    return coll__tcp_xfer(&c->tcp, to, siov, sn, from, riov, rn, c->deadline, &c->culprit);
}

/* Ring allreduce of n elements of buf among the host leaders (reduce-scatter, allgather). */
static int ring_allreduce(coll__cpu *c, unsigned char *buf, size_t n, size_t esz, coll_dtype dt,
                          coll_op op)
{
    int H = c->nhosts, h = c->host, rc;
    int next = ring_next(c), prev = ring_prev(c);
#define SEG_LO(k) ((size_t)(k)*n / (size_t)H)
#define SEG_HI(k) ((size_t)((k) + 1) * n / (size_t)H)
    for (int s = 0; s < H - 1; s++) {
        int ks = ((h - s) % H + H) % H, kr = ((h - s - 1) % H + H) % H;
        struct iovec so = {buf + SEG_LO(ks) * esz, (SEG_HI(ks) - SEG_LO(ks)) * esz};
        struct iovec ri = {c->tmp, (SEG_HI(kr) - SEG_LO(kr)) * esz};
        if ((rc = xfer(c, next, &so, 1, prev, &ri, 1)) < 0)
            return rc;
        const void *srcs[2] = {buf + SEG_LO(kr) * esz, c->tmp};
        coll__reduce_n(buf + SEG_LO(kr) * esz, srcs, 2, SEG_HI(kr) - SEG_LO(kr), dt, op);
    }
    for (int s = 0; s < H - 1; s++) {
        int ks = ((h + 1 - s) % H + H) % H, kr = ((h - s) % H + H) % H;
        struct iovec so = {buf + SEG_LO(ks) * esz, (SEG_HI(ks) - SEG_LO(ks)) * esz};
        struct iovec ri = {buf + SEG_LO(kr) * esz, (SEG_HI(kr) - SEG_LO(kr)) * esz};
        if ((rc = xfer(c, next, &so, 1, prev, &ri, 1)) < 0)
            return rc;
    }
#undef SEG_LO
#undef SEG_HI
    return 0;
}

/* iovecs of host k's ranks' blocks in R (allgather layout: block r at r * stride). */
static int host_blocks(coll__cpu *c, struct iovec *iov, int k, unsigned char *R, size_t stride,
                       size_t len)
{
    int n = 0;
    for (int i = c->layout.host_first[k]; i < c->layout.host_first[k + 1]; i++) {
        iov[n].iov_base = R + (size_t)c->layout.host_ranks[i] * stride;
        iov[n].iov_len = len;
        n++;
    }
    return n;
}

static int ring_allgather(coll__cpu *c, unsigned char *R, size_t stride, size_t len)
{
    int H = c->nhosts, h = c->host, rc;
    for (int s = 0; s < H - 1; s++) {
        int ks = ((h - s) % H + H) % H, kr = ((h - s - 1) % H + H) % H;
        /* Two different hosts never hold more than world ranks together: c->iov fits both. */
        int sn = host_blocks(c, c->iov, ks, R, stride, len);
        struct iovec *riov = c->iov + sn;
        int rn = host_blocks(c, riov, kr, R, stride, len);
        if ((rc = xfer(c, ring_next(c), c->iov, sn, ring_prev(c), riov, rn)) < 0)
            return rc;
    }
    return 0;
}

/* Broadcast of len bytes of R from the root's host along the ring. */
static int ring_broadcast(coll__cpu *c, unsigned char *R, size_t len, int root_host)
{
    int H = c->nhosts;
    struct iovec io = {R, len};
    int rc;
    if (c->host != root_host && (rc = xfer(c, -1, NULL, 0, ring_prev(c), &io, 1)) < 0)
        return rc;
    if ((c->host + 1) % H != root_host && (rc = xfer(c, ring_next(c), &io, 1, -1, NULL, 0)) < 0)
        return rc;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Collectives                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/*
 * Reductions: allreduce, reduce (only root copies out), reduce-scatter, and the barrier (a
 * one-byte allreduce). Each algorithm below is a row of `reductions`.
 */

/* Latency: one phase on a single host, every rank reduces every slot itself. */
static bool latency_fits(const coll__cpu *c, const coll__op *op)
{
    return op->kind != COLL__REDUCE_SCATTER && c->nhosts == 1 &&
           op->count * coll_dtype_size(op->dtype) <= c->chunk;
}

static bool latency_picks(const coll__cpu *c, const coll__op *op)
{
    return op->count * coll_dtype_size(op->dtype) <= c->small;
}

static int run_latency(coll__cpu *c, const coll__op *op)
{
    size_t esz = coll_dtype_size(op->dtype);
    bool copy_result = op->kind != COLL__REDUCE || op->peer == c->rank;
    uint64_t s = c->step++;
    int rc;
    if ((rc = guard(c, s)) < 0)
        return rc;
    memcpy(slot(c, s, c->local), op->sendbuf, op->count * esz);
    post(c, s * PHASES + 1);
    if ((rc = wait_all(c, s * PHASES + 1)) < 0)
        return rc;
    if (copy_result) {
        reduce_slots(c, s, op->recvbuf, 0, op->count, esz, op->dtype, op->op);
        if (op->op == COLL_AVG)
            coll__scale_avg(op->recvbuf, op->count, op->dtype, c->world);
    }
    return 0;
}

/*
 * Ring: chunk by chunk, a reduce-scatter in shared memory, the leaders' ring allreduce across
 * hosts, an allgather in shared memory. Runs every reduction.
 */
static bool ring_fits(const coll__cpu *c, const coll__op *op)
{
    (void)c;
    (void)op;
    return true;
}

static int run_ring(coll__cpu *c, const coll__op *op)
{
    size_t esz = coll_dtype_size(op->dtype);
    bool rs = op->kind == COLL__REDUCE_SCATTER;
    size_t blocks = rs ? (size_t)c->world : 1;
    size_t cmax = c->chunk / (esz * blocks);
    bool copy_result = op->kind != COLL__REDUCE || op->peer == c->rank;
    bool stream = op->count * esz / blocks >= STREAM_BYTES;
    const unsigned char *in = op->sendbuf;
    unsigned char *out = op->recvbuf;
    int rc;

    for (size_t off = 0; off < op->count; off += cmax) {
        size_t n = op->count - off < cmax ? op->count - off : cmax;
        size_t total = n * blocks; /* elements in the slot */
        piece p = {in, n, op->count, off, esz};
        uint64_t s = c->step++;
        unsigned char *R = result(c, s);
        if ((rc = guard(c, s)) < 0)
            return rc;
        fill_slot(c, s, &p, total);
        post(c, s * PHASES + 1);
        if ((rc = wait_all(c, s * PHASES + 1)) < 0)
            return rc;
        reduce_share(c, s, &p, total, op->dtype, op->op);
        if (c->nhosts == 1) {
            post(c, s * PHASES + 2);
            if ((rc = wait_all(c, s * PHASES + 2)) < 0)
                return rc;
        } else if (c->local == 0) {
            post(c, s * PHASES + 2);
            if ((rc = wait_all(c, s * PHASES + 2)) < 0 ||
                (rc = ring_allreduce(c, R, total, esz, op->dtype, op->op)) < 0)
                return rc;
            if (op->op == COLL_AVG)
                coll__scale_avg(R, total, op->dtype, c->world);
            post(c, s * PHASES + 3);
        } else {
            post(c, s * PHASES + 2);
            if ((rc = wait_one(c, 0, s * PHASES + 3)) < 0)
                return rc;
        }
        if (rs)
            copy_out(out + off * esz, R + (size_t)c->rank * n * esz, n * esz, stream);
        else if (copy_result)
            copy_out(out + off * esz, R, n * esz, stream);
    }
    return 0;
}

/*
 * The reduction algorithms. With COLL_CPU_ALGO=auto (coll__cpu.algo < 0) an operation runs with
 * the first row whose `fits` and `picks` both hold; with a row forced, that row wherever it
 * fits and the last row elsewhere, which fits every reduction. The rules read only the
 * arguments every rank passes alike and the layout, and cpu_boot.c checks that every rank
 * chose the same row, so that all ranks run the same steps. A new algorithm is one function
 * and one row here.
 */
typedef struct reduction {
    const char *name;                                      /* its COLL_CPU_ALGO value */
    bool (*fits)(const coll__cpu *c, const coll__op *op);  /* can run op at all */
    bool (*picks)(const coll__cpu *c, const coll__op *op); /* auto's cost rule; NULL: always */
    int (*run)(coll__cpu *c, const coll__op *op);
} reduction;

static const reduction reductions[] = {
    {"latency", latency_fits, latency_picks, run_latency},
    {"ring", ring_fits, NULL, run_ring},
};
#define NREDUCTIONS ((int)(sizeof reductions / sizeof reductions[0]))

static const reduction *pick_reduction(const coll__cpu *c, const coll__op *op)
{
    if (c->algo >= 0)
        return reductions[c->algo].fits(c, op) ? &reductions[c->algo]
                                               : &reductions[NREDUCTIONS - 1];
    for (int i = 0; i < NREDUCTIONS - 1; i++)
        if (reductions[i].fits(c, op) && (!reductions[i].picks || reductions[i].picks(c, op)))
            return &reductions[i];
    return &reductions[NREDUCTIONS - 1];
}

static int run_reduction(coll__cpu *c, const coll__op *op)
{
    return pick_reduction(c, op)->run(c, op);
}

int coll__cpu_algo_parse(const char *name, int *algo)
{
    if (!name || !name[0] || strcmp(name, "auto") == 0) {
        *algo = COLL__CPU_ALGO_AUTO;
        return 0;
    }
    for (int i = 0; i < NREDUCTIONS; i++) {
        if (strcmp(name, reductions[i].name) == 0) {
            *algo = i;
            return 0;
        }
    }
    return -EINVAL;
}

const char *coll__cpu_algo_name(int algo)
{
    return algo >= 0 && algo < NREDUCTIONS ? reductions[algo].name : "auto";
}

void coll__cpu_algo_list(char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "auto");
    for (int i = 0; i < NREDUCTIONS && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, ", %s", reductions[i].name);
}

static int run_broadcast(coll__cpu *c, const coll__op *op)
{
    size_t esz = coll_dtype_size(op->dtype);
    int root_host = c->layout.host_of[op->peer], root_local = c->layout.local_of[op->peer];
    bool is_root = op->peer == c->rank;
    int rc;
    for (size_t off = 0; off < op->count; off += c->chunk / esz) {
        size_t len = (op->count - off < c->chunk / esz ? op->count - off : c->chunk / esz) * esz;
        uint64_t s = c->step++;
        unsigned char *R = result(c, s);
        if ((rc = guard(c, s)) < 0)
            return rc;
        if (is_root)
            memcpy(R, (const unsigned char *)op->sendbuf + off * esz, len);
        post(c, s * PHASES + 1);
        if (c->host == root_host) {
            if (!is_root && (rc = wait_one(c, root_local, s * PHASES + 1)) < 0)
                return rc;
            if (c->local == 0 && c->nhosts > 1 && (rc = ring_broadcast(c, R, len, root_host)) < 0)
                return rc;
        } else if (c->local == 0) {
            if ((rc = ring_broadcast(c, R, len, root_host)) < 0)
                return rc;
            post(c, s * PHASES + 3);
        } else if ((rc = wait_one(c, 0, s * PHASES + 3)) < 0) {
            return rc;
        }
        unsigned char *dst = (unsigned char *)op->recvbuf + off * esz;
        if (is_root) {
            if (op->recvbuf != op->sendbuf)
                memcpy(dst, (const unsigned char *)op->sendbuf + off * esz, len);
        } else {
            copy_out(dst, R, len, op->count * esz >= STREAM_BYTES);
        }
    }
    return 0;
}

static int run_allgather(coll__cpu *c, const coll__op *op)
{
    size_t esz = coll_dtype_size(op->dtype);
    size_t cmax = c->chunk / (esz * (size_t)c->world);
    size_t stride = cmax * esz;
    bool stream = op->count * esz * (size_t)c->world >= STREAM_BYTES;
    const unsigned char *in = op->sendbuf;
    unsigned char *out = op->recvbuf;
    int rc;
    for (size_t off = 0; off < op->count; off += cmax) {
        size_t n = op->count - off < cmax ? op->count - off : cmax;
        uint64_t s = c->step++;
        unsigned char *R = result(c, s);
        if ((rc = guard(c, s)) < 0)
            return rc;
        memcpy(R + (size_t)c->rank * stride, in + off * esz, n * esz);
        post(c, s * PHASES + 1);
        if (c->nhosts == 1 || c->local == 0) {
            if ((rc = wait_all(c, s * PHASES + 1)) < 0)
                return rc;
        }
        if (c->nhosts > 1) {
            if (c->local == 0) {
                if ((rc = ring_allgather(c, R, stride, n * esz)) < 0)
                    return rc;
                post(c, s * PHASES + 3);
            } else if ((rc = wait_one(c, 0, s * PHASES + 3)) < 0) {
                return rc;
            }
        }
        for (int r = 0; r < c->world; r++) {
            unsigned char *dst = out + ((size_t)r * op->count + off) * esz;
            if (dst != in + off * esz)
                copy_out(dst, R + (size_t)r * stride, n * esz, stream);
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Send and receive                                                                            */
/* ------------------------------------------------------------------------------------------ */

static int shm_send(coll__cpu *c, int peer_local, const unsigned char *buf, size_t len)
{
    coll__channel *ch = &c->channels[c->local * c->nlocal + peer_local];
    uint64_t sent = atomic_load_explicit(&ch->sent.v, memory_order_relaxed);
    int rc;
    while (len > 0) {
        uint64_t recvd = atomic_load_explicit(&ch->recvd.v, memory_order_acquire);
        if (sent - recvd == COLL__CPU_CHANNEL_BYTES) {
            rc = coll__shm_wait(&c->shm, &ch->recvd.v, sent - COLL__CPU_CHANNEL_BYTES + 1,
                                peer_local, c->deadline, &c->culprit);
            if (rc < 0)
                return rc;
            continue;
        }
        size_t pos = sent % COLL__CPU_CHANNEL_BYTES;
        size_t n = COLL__CPU_CHANNEL_BYTES - (size_t)(sent - recvd);
        if (n > COLL__CPU_CHANNEL_BYTES - pos)
            n = COLL__CPU_CHANNEL_BYTES - pos;
        if (n > len)
            n = len;
        memcpy(ch->data + pos, buf, n);
        buf += n;
        len -= n;
        sent += n;
        coll__shm_post(&c->shm, &ch->sent.v, sent);
    }
    return 0;
}

static int shm_recv(coll__cpu *c, int peer_local, unsigned char *buf, size_t len)
{
    coll__channel *ch = &c->channels[peer_local * c->nlocal + c->local];
    uint64_t recvd = atomic_load_explicit(&ch->recvd.v, memory_order_relaxed);
    int rc;
    while (len > 0) {
        uint64_t sent = atomic_load_explicit(&ch->sent.v, memory_order_acquire);
        if (sent == recvd) {
            rc = coll__shm_wait(&c->shm, &ch->sent.v, recvd + 1, peer_local, c->deadline,
                                &c->culprit);
            if (rc < 0)
                return rc;
            continue;
        }
        size_t pos = recvd % COLL__CPU_CHANNEL_BYTES;
        size_t n = (size_t)(sent - recvd);
        if (n > COLL__CPU_CHANNEL_BYTES - pos)
            n = COLL__CPU_CHANNEL_BYTES - pos;
        if (n > len)
            n = len;
        memcpy(buf, ch->data + pos, n);
        buf += n;
        len -= n;
        recvd += n;
        coll__shm_post(&c->shm, &ch->recvd.v, recvd);
    }
    return 0;
}

/* Messages carry their length first, so that mismatched counts fail instead of desynchronising. */
static int run_p2p(coll__cpu *c, const coll__op *op, char *err, size_t errlen)
{
    uint64_t len = op->count * coll_dtype_size(op->dtype), got = 0;
    int peer_local = c->layout.local_of[op->peer];
    bool same_host = c->layout.host_of[op->peer] == c->host;
    int rc;
    if (op->kind == COLL__SEND) {
        if (same_host) {
            if ((rc = shm_send(c, peer_local, (const unsigned char *)&len, sizeof len)) < 0)
                return rc;
            return shm_send(c, peer_local, op->sendbuf, len);
        }
        if ((rc = coll__tcp_conn(&c->tcp, op->peer, c->deadline)) < 0) {
            c->culprit = op->peer;
            return rc;
        }
        struct iovec iov[2] = {{&len, sizeof len}, {(void *)op->sendbuf, len}};
        return xfer(c, op->peer, iov, 2, -1, NULL, 0);
    }
    if (same_host) {
        if ((rc = shm_recv(c, peer_local, (unsigned char *)&got, sizeof got)) < 0)
            return rc;
    } else {
        if ((rc = coll__tcp_conn(&c->tcp, op->peer, c->deadline)) < 0) {
            c->culprit = op->peer;
            return rc;
        }
        struct iovec io = {&got, sizeof got};
        if ((rc = xfer(c, -1, NULL, 0, op->peer, &io, 1)) < 0)
            return rc;
    }
    if (got != len) {
        snprintf(err, errlen, "rank %d sent %" PRIu64 " bytes, the receive expects %" PRIu64,
                 op->peer, got, len);
        c->culprit = op->peer;
        return -EMSGSIZE;
    }
    if (same_host)
        return shm_recv(c, peer_local, op->recvbuf, len);
    struct iovec io = {op->recvbuf, len};
    return xfer(c, -1, NULL, 0, op->peer, &io, 1);
}

/*
 * A communicator of one: every collective's result is its input (a sum, average, minimum,
 * maximum or product of one value is that value, bit for bit), so it is a copy at most and
 * never touches the segment.
 */
static int run_alone(const coll__op *op)
{
    size_t bytes = op->count * coll_dtype_size(op->dtype);
    if (op->kind == COLL__BARRIER || !op->sendbuf || !op->recvbuf || op->sendbuf == op->recvbuf ||
        bytes == 0)
        return 0;
    memmove(op->recvbuf, op->sendbuf, bytes);
    return 0;
}

int coll__cpu_run(coll__cpu *c, const coll__op *op, int64_t deadline, int *culprit, char *err,
                  size_t errlen)
{
    int rc;
    c->deadline = deadline;
    c->culprit = -1;
    if (c->world == 1 && op->kind != COLL__SEND && op->kind != COLL__RECV) {
        *culprit = -1;
        return run_alone(op);
    }
    switch (op->kind) {
    case COLL__ALLREDUCE:
    case COLL__REDUCE:
    case COLL__REDUCE_SCATTER:
        rc = op->count ? run_reduction(c, op) : 0;
        break;
    case COLL__BARRIER: {
        unsigned char one = 1, res;
        coll__op b = {COLL__ALLREDUCE, &one, &res, 1, COLL_U8, COLL_MAX, 0};
        rc = run_reduction(c, &b);
        break;
    }
    case COLL__BROADCAST:
        rc = run_broadcast(c, op);
        break;
    case COLL__ALLGATHER:
        rc = run_allgather(c, op);
        break;
    case COLL__SEND:
    case COLL__RECV:
        rc = run_p2p(c, op, err, errlen);
        break;
    default:
        rc = -EINVAL;
    }
    *culprit = c->culprit;
    return rc;
}
