/*
 * coll-check: libcollective's end-to-end checker, one process per rank under ddprun.
 *
 * Each rank reads ddprun's (torchrun's) environment, joins the job's store at
 * MASTER_ADDR:MASTER_PORT, creates a communicator under the prefix
 * "coll-check/<run id>/<restart>/<scenario>" and runs the scenarios named on the command line:
 *
 *   ops       every operation x dtype x reduction, several counts and roots, in and out of place
 *   big       64 MiB allreduce (in and out of place), reduce_scatter, allgather and broadcast
 *   inflight  64 mixed operations issued before any wait, waited in a random order; coll_test
 *   split     even/odd, reversed-key, no-color, a row/column grid and a nested split
 *   p2p       ring passes, a token ring, pairwise and all-pairs exchanges, ordered messages
 *   barrier   a store counter shows that nobody leaves a barrier before everybody entered it
 *   abort     an abort from another thread ends a pending operation with -ECANCELED; peers
 *             waiting on the aborted rank get an error naming it
 *   timeout   one rank skips an allreduce, then a coll_comm_init; the others get -ETIMEDOUT
 *             naming it
 *   kill      --victim dies by SIGKILL inside a large allreduce; survivors get an error naming it
 *             within --timeout-ms
 *   args      invalid arguments give -EINVAL and queue nothing
 *   algos     the cpu backend's reduction algorithms (COLL_CPU_ALGO=latency, ring, auto) give
 *             bit-identical, correct results; an unknown or disagreeing choice fails init
 *
 * Inputs are deterministic: element j of rank r's buffer is derived from a hash of (seed, r, j),
 * so every rank computes the serial reference for all ranks by itself. Integers must match
 * exactly (sums and products wrap). Floats are reduced in long double; sums, averages and
 * products must lie within (world + 1) * eps * sum_r |x_r| + eps * |ref| of it (eps = 2^-24,
 * 2^-52, 2^-11 and 2^-8 for f32, f64, f16 and bf16; for averages the x_r are divided by the
 * world size first); max and min, and anything on one rank, must be exact. The largest error
 * seen, as a fraction of its bound, is printed per dtype. Copies (broadcast, allgather) must
 * be bit-exact; buffers carry guard bytes that must stay untouched, and inputs of out-of-place
 * calls must not change.
 *
 * It does not test the nccl backend's device buffers (it passes host memory) nor performance;
 * the timings it prints are for information.
 *
 * Output: one "coll-check: rank R/W SCENARIO: PASS ..." or "... FAIL ..." line per rank and
 * scenario, and a "FAIL rank R ..." line per failed check naming the operation, dtype, reduction,
 * count, root, first bad index, and the value got and expected. A watchdog names the step a
 * rank is stuck in and exits 3 when no step finished for --watchdog-s seconds.
 *
 * Exit status: 0 every check passed, 1 a check failed, 2 bad usage or environment, 3 watchdog.
 */
#include "cli.h"
#include "coll.h"
#include "monoclock.h"
#include "rdzv.h"

#include <assert.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define GUARD 64        /* bytes after every buffer that no operation may touch */
#define GUARD_BYTE 0x5a /* their content */
#define SENTINEL 0xa5   /* fill of output buffers before an operation */
#define MAX_REPORTS 20  /* detailed failure lines per rank */

typedef struct ctx {
    /* Environment. */
    int rank, world, local_rank, local_world;
    const char *attempt; /* "coll-check/<run id>/<restart count>" */
    rdzv_client *store;
    /* Options. */
    coll_backend backend;
    int timeout_ms; /* -1: the scenario's default */
    int victim, skipper;
    uint64_t seed;
    bool quick;
    size_t chunk_bytes, small_bytes;
    const char *bind_addr;
    int expect_hosts; /* -1: do not check */
    size_t big_mib;
    int watchdog_s;
    bool verbose;
    /* Current scenario. */
    const char *scenario;
    char prefix[256];
    long checks, failures, reports;
    double max_ratio[COLL_DTYPE_COUNT];
} ctx;

/* ------------------------------------------------------------------------------------------ */
/* Reporting and the watchdog                                                                  */
/* ------------------------------------------------------------------------------------------ */

static pthread_mutex_t where_lock = PTHREAD_MUTEX_INITIALIZER;
static char where[512] = "start";
static _Atomic int64_t last_progress_ns;
static int g_rank = -1;
static int g_watchdog_s = 300;

static double ms_since(int64_t t0)
{
    return (double)(mono_now_ns() - t0) / 1e6;
}

/* Names the step this rank is in, for the watchdog, and counts as progress. */
static void set_where(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&where_lock);
    vsnprintf(where, sizeof(where), fmt, ap);
    pthread_mutex_unlock(&where_lock);
    va_end(ap);
    atomic_store(&last_progress_ns, mono_now_ns());
}

static void *watchdog(void *arg)
{
    (void)arg;
    for (;;) {
        sleep(1); /* a poll interval, not synchronisation */
        int64_t idle = mono_now_ns() - atomic_load(&last_progress_ns);
        if (idle > (int64_t)g_watchdog_s * 1000000000) {
            pthread_mutex_lock(&where_lock);
            fprintf(stderr, "coll-check: rank %d: WATCHDOG: no progress for %d s, stuck in: %s\n",
                    g_rank, g_watchdog_s, where);
            pthread_mutex_unlock(&where_lock);
            fflush(NULL);
            _exit(3);
        }
    }
    return NULL;
}

/* Records a failed check; the first MAX_REPORTS are printed. */
static void fail(ctx *c, const char *fmt, ...)
{
    c->failures++;
    if (c->reports++ >= MAX_REPORTS)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    printf("coll-check: FAIL rank %d/%d [%s]: %s\n", c->rank, c->world, c->scenario, msg);
    fflush(stdout);
}

static void note(ctx *c, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    printf("coll-check: rank %d/%d [%s]: %s\n", c->rank, c->world, c->scenario, msg);
    fflush(stdout);
}

/* "rank 3" appears in s as a word (not "rank 31"). */
static bool names_rank(const char *s, int rank)
{
    char pat[32];
    int n = snprintf(pat, sizeof(pat), "rank %d", rank);
    for (const char *p = s; (p = strstr(p, pat)) != NULL; p++) {
        if (p[n] < '0' || p[n] > '9')
            return true;
    }
    return false;
}

/* ------------------------------------------------------------------------------------------ */
/* Deterministic inputs and element formats                                                    */
/* ------------------------------------------------------------------------------------------ */

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static uint64_t hash3(uint64_t seed, int r, size_t j)
{
    return mix64(mix64(seed ^ ((uint64_t)(r + 1) * 0xd6e8feb86659fd93ULL)) + j);
}

/* IEEE binary16 and bfloat16, written here rather than taken from the library under test. */
static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    float f;
    if (exp == 0) {
        f = ldexpf((float)mant, -24);
        return sign ? -f : f;
    }
    uint32_t bits;
    if (exp == 31)
        bits = sign | 0x7f800000 | (mant << 13);
    else
        bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffff;
    if (ax > 0x7f800000)
        return sign | 0x7e00;
    if (ax >= 0x477ff000) /* rounds to >= 65520: infinity */
        return sign | 0x7c00;
    if (ax < 0x38800000) { /* below 2^-14: subnormal, units of 2^-24, nearest even */
        float a = fabsf(f);
        return sign | (uint16_t)nearbyintf(a * 16777216.0f);
    }
    uint32_t e = (ax >> 23) - 127 + 15, mant = ax & 0x7fffff;
    uint32_t h = (e << 10) | (mant >> 13), rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
        h++;
    return sign | (uint16_t)h;
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000)
        return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

static bool is_float(coll_dtype dt)
{
    return dt == COLL_F32 || dt == COLL_F64 || dt == COLL_F16 || dt == COLL_BF16;
}

static size_t esize(coll_dtype dt)
{
    switch (dt) {
    case COLL_F64:
    case COLL_I64:
        return 8;
    case COLL_F32:
    case COLL_I32:
        return 4;
    case COLL_F16:
    case COLL_BF16:
        return 2;
    default:
        return 1;
    }
}

/* Unit roundoff used in the error bounds. */
static long double dtype_eps(coll_dtype dt)
{
    switch (dt) {
    case COLL_F32:
        return 0x1p-24L;
    case COLL_F64:
        return 0x1p-52L;
    case COLL_F16:
        return 0x1p-11L;
    default:
        return 0x1p-8L;
    }
}

static uint64_t load_bits(coll_dtype dt, const void *buf, size_t i)
{
    const unsigned char *p = (const unsigned char *)buf + i * esize(dt);
    switch (esize(dt)) {
    case 8: {
        uint64_t v;
        memcpy(&v, p, 8);
        return v;
    }
    case 4: {
        uint32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    case 2: {
        uint16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    default:
        return *p;
    }
}

static void store_bits(coll_dtype dt, void *buf, size_t i, uint64_t bits)
{
    unsigned char *p = (unsigned char *)buf + i * esize(dt);
    switch (esize(dt)) {
    case 8:
        memcpy(p, &bits, 8);
        break;
    case 4: {
        uint32_t v = (uint32_t)bits;
        memcpy(p, &v, 4);
        break;
    }
    case 2: {
        uint16_t v = (uint16_t)bits;
        memcpy(p, &v, 2);
        break;
    }
    default:
        *p = (unsigned char)bits;
    }
}

static long double decode_float(coll_dtype dt, uint64_t bits)
{
    switch (dt) {
    case COLL_F32: {
        uint32_t b = (uint32_t)bits;
        float f;
        memcpy(&f, &b, 4);
        return f;
    }
    case COLL_F64: {
        double d;
        memcpy(&d, &bits, 8);
        return d;
    }
    case COLL_F16:
        return f16_to_f32((uint16_t)bits);
    default:
        return bf16_to_f32((uint16_t)bits);
    }
}

static uint64_t encode_float(coll_dtype dt, double d)
{
    switch (dt) {
    case COLL_F32: {
        float f = (float)d;
        uint32_t b;
        memcpy(&b, &f, 4);
        return b;
    }
    case COLL_F64: {
        uint64_t b;
        memcpy(&b, &d, 8);
        return b;
    }
    case COLL_F16:
        return f32_to_f16((float)d);
    default:
        return f32_to_bf16((float)d);
    }
}

/* Signed value of integer bits (u8 is unsigned). */
static int64_t int_value(coll_dtype dt, uint64_t bits)
{
    switch (dt) {
    case COLL_I32:
        return (int32_t)(uint32_t)bits;
    case COLL_I64:
        return (int64_t)bits;
    default:
        return (uint8_t)bits;
    }
}

static uint64_t int_mask(coll_dtype dt)
{
    return esize(dt) == 8 ? ~0ULL : (1ULL << (8 * esize(dt))) - 1;
}

/*
 * Value classes: GEN (ints over their whole range, floats in [-1, 1)), SMALL (integers whose
 * sum over the ranks cannot wrap, for averages), PROD (floats in [0.875, 1.125], so that
 * products stay near 1), EXACT (integers in [-8, 8] in any dtype: float sums are exact).
 */
enum { CLS_GEN, CLS_SMALL, CLS_PROD, CLS_EXACT };

static uint64_t gen_bits(coll_dtype dt, int cls, uint64_t seed, int world, int r, size_t j)
{
    uint64_t h = hash3(seed, r, j);
    double u = (double)(h >> 11) * 0x1p-53; /* [0, 1) */
    if (!is_float(dt)) {
        int64_t v;
        if (cls == CLS_EXACT)
            v = (int64_t)(h % 17) - 8;
        else if (cls == CLS_SMALL)
            v = dt == COLL_U8 ? (int64_t)(h % (uint64_t)(255 / world + 1))
                              : (int64_t)(h % 2001) - 1000;
        else
            return (h >> 7) & int_mask(dt);
        if (dt == COLL_U8 && v < 0)
            v = -v;
        return (uint64_t)v & int_mask(dt);
    }
    double d;
    if (cls == CLS_PROD)
        d = 0.875 + 0.25 * u;
    else if (cls == CLS_EXACT)
        d = (double)((int)(h % 17) - 8);
    else
        d = 2.0 * u - 1.0;
    return encode_float(dt, d);
}

/* ------------------------------------------------------------------------------------------ */
/* Test cases: buffers, issue, verification                                                    */
/* ------------------------------------------------------------------------------------------ */

enum kind { K_ALLREDUCE, K_REDUCE, K_BROADCAST, K_ALLGATHER, K_REDUCE_SCATTER, K_BARRIER };
static const char *const kind_names[] = {"allreduce", "reduce",         "broadcast",
                                         "allgather", "reduce_scatter", "barrier"};

typedef struct tcase {
    enum kind kind;
    coll_dtype dt;
    coll_op op; /* for reductions */
    size_t count;
    int root; /* reduce, broadcast */
    bool inplace;
    bool nullbuf; /* out of place: pass NULL for the unused buffer of non-roots */
    int cls;
    uint64_t seed;
} tcase;

typedef struct tbuf {
    tcase t;
    int world, rank;
    unsigned char *a;      /* send buffer, or the only buffer in place */
    unsigned char *b;      /* receive buffer out of place */
    unsigned char *a_copy; /* a's content before the call */
    size_t na, nb;         /* elements in a and b */
    const void *sendp;
    void *recvp;
    coll_request *req;
    int rc;
} tbuf;

static void describe(const tcase *t, char *out, size_t len)
{
    char root[24] = "";
    if (t->kind == K_REDUCE || t->kind == K_BROADCAST)
        snprintf(root, sizeof(root), " root %d", t->root);
    bool red = t->kind == K_ALLREDUCE || t->kind == K_REDUCE || t->kind == K_REDUCE_SCATTER;
    snprintf(out, len, "%s dtype %s%s%s count %zu %s%s%s", kind_names[t->kind],
             coll_dtype_name(t->dt), red ? " op " : "", red ? coll_op_name(t->op) : "", t->count,
             t->inplace ? "in-place" : "out-of-place", root,
             t->nullbuf && !t->inplace ? " (NULL unused buffer)" : "");
}

static unsigned char *alloc_buf(size_t nbytes, int fill)
{
    unsigned char *p = malloc(nbytes + GUARD);
    if (!p) {
        fprintf(stderr, "coll-check: out of memory (%zu bytes)\n", nbytes);
        exit(2);
    }
    memset(p, fill, nbytes);
    memset(p + nbytes, GUARD_BYTE, GUARD);
    return p;
}

static void fill_input(const tbuf *b, unsigned char *dst, size_t first, size_t n)
{
    const tcase *t = &b->t;
    for (size_t i = 0; i < n; i++)
        store_bits(t->dt, dst, i, gen_bits(t->dt, t->cls, t->seed, b->world, b->rank, first + i));
}

/* Allocates and fills the buffers of t on this rank; see coll.h for the shapes. */
static void tb_prepare(tbuf *b, const tcase *t, int rank, int world)
{
    memset(b, 0, sizeof(*b));
    b->t = *t;
    b->rank = rank;
    b->world = world;
    size_t n = t->count, e = esize(t->dt), w = (size_t)world, r = (size_t)rank;
    bool root = rank == t->root;
    if (t->kind == K_BARRIER)
        return;
    switch (t->kind) {
    case K_ALLREDUCE:
    case K_REDUCE:
        b->na = n;
        b->nb = t->inplace || (t->kind == K_REDUCE && !root && t->nullbuf) ? 0 : n;
        break;
    case K_BROADCAST:
        b->na = t->inplace || root || !t->nullbuf ? n : 0;
        b->nb = t->inplace ? 0 : n;
        break;
    case K_ALLGATHER:
        b->na = t->inplace ? n * w : n;
        b->nb = t->inplace ? 0 : n * w;
        break;
    default: /* reduce_scatter */
        b->na = n * w;
        b->nb = t->inplace ? 0 : n;
        break;
    }
    if (n == 0) { /* count 0: every buffer may be NULL */
        b->na = b->nb = 0;
        return;
    }
    if (b->na) {
        b->a = alloc_buf(b->na * e, SENTINEL);
        if (t->kind == K_BROADCAST) {
            if (root)
                fill_input(b, b->a, 0, n);
        } else if (t->kind == K_ALLGATHER && t->inplace) {
            fill_input(b, b->a + r * n * e, 0, n);
        } else {
            fill_input(b, b->a, 0, b->na);
        }
        b->a_copy = malloc(b->na * e);
        if (!b->a_copy) {
            fprintf(stderr, "coll-check: out of memory\n");
            exit(2);
        }
        memcpy(b->a_copy, b->a, b->na * e);
    }
    if (b->nb)
        b->b = alloc_buf(b->nb * e, SENTINEL);
    if (t->inplace) {
        b->sendp = b->a;
        b->recvp = b->a;
        if (t->kind == K_ALLGATHER)
            b->sendp = b->a + r * n * e;
        if (t->kind == K_REDUCE_SCATTER)
            b->recvp = b->a + r * n * e;
    } else {
        b->sendp = b->a;
        b->recvp = b->b;
    }
}

static void tb_free(tbuf *b)
{
    free(b->a);
    free(b->b);
    free(b->a_copy);
    b->a = b->b = b->a_copy = NULL;
}

/* Issues t: the i-form (sets b->req) when async, else the blocking form (sets b->rc). */
static int tb_issue(coll_comm *comm, tbuf *b, bool async)
{
    const tcase *t = &b->t;
    coll_request **rq = async ? &b->req : NULL;
    int rc;
    switch (t->kind) {
    case K_ALLREDUCE:
        rc = rq ? coll_iallreduce(comm, b->sendp, b->recvp, t->count, t->dt, t->op, rq)
                : coll_allreduce(comm, b->sendp, b->recvp, t->count, t->dt, t->op);
        break;
    case K_REDUCE:
        rc = rq ? coll_ireduce(comm, b->sendp, b->recvp, t->count, t->dt, t->op, t->root, rq)
                : coll_reduce(comm, b->sendp, b->recvp, t->count, t->dt, t->op, t->root);
        break;
    case K_BROADCAST:
        rc = rq ? coll_ibroadcast(comm, b->sendp, b->recvp, t->count, t->dt, t->root, rq)
                : coll_broadcast(comm, b->sendp, b->recvp, t->count, t->dt, t->root);
        break;
    case K_ALLGATHER:
        rc = rq ? coll_iallgather(comm, b->sendp, b->recvp, t->count, t->dt, rq)
                : coll_allgather(comm, b->sendp, b->recvp, t->count, t->dt);
        break;
    case K_REDUCE_SCATTER:
        rc = rq ? coll_ireduce_scatter(comm, b->sendp, b->recvp, t->count, t->dt, t->op, rq)
                : coll_reduce_scatter(comm, b->sendp, b->recvp, t->count, t->dt, t->op);
        break;
    default:
        rc = rq ? coll_ibarrier(comm, rq) : coll_barrier(comm);
        break;
    }
    b->rc = rc;
    return rc;
}

static bool guard_ok(const unsigned char *p, size_t nbytes)
{
    for (size_t i = 0; i < GUARD; i++)
        if (p[nbytes + i] != GUARD_BYTE)
            return false;
    return true;
}

static void fmt_value(coll_dtype dt, uint64_t bits, char *out, size_t len)
{
    if (is_float(dt))
        snprintf(out, len, "%.10Lg (0x%" PRIx64 ")", decode_float(dt, bits), bits);
    else
        snprintf(out, len, "%" PRId64 " (0x%" PRIx64 ")", int_value(dt, bits), bits);
}

/* The serial reference of a reduction at input index j: exact bits for integers and for
 * max/min, a long double value and its error bound for float sums, averages and products. */
typedef struct refv {
    uint64_t bits;
    long double v, bound;
} refv;

static void ref_reduce(const tbuf *b, size_t j, refv *out)
{
    const tcase *t = &b->t;
    int w = b->world;
    if (!is_float(t->dt)) {
        uint64_t acc = 0;
        int64_t sacc = 0;
        for (int q = 0; q < w; q++) {
            uint64_t x = gen_bits(t->dt, t->cls, t->seed, w, q, j);
            int64_t v = int_value(t->dt, x);
            if (q == 0) {
                acc = (uint64_t)v;
                sacc = v;
                continue;
            }
            switch (t->op) {
            case COLL_SUM:
                acc += (uint64_t)v;
                break;
            case COLL_AVG:
                sacc += v;
                break;
            case COLL_PROD:
                acc *= (uint64_t)v;
                break;
            case COLL_MAX:
                if (v > (int64_t)acc)
                    acc = (uint64_t)v;
                break;
            default:
                if (v < (int64_t)acc)
                    acc = (uint64_t)v;
                break;
            }
        }
        if (t->op == COLL_AVG)
            acc = (uint64_t)(sacc / w);
        out->bits = acc & int_mask(t->dt);
        return;
    }
    long double acc = 0, sumabs = 0;
    for (int q = 0; q < w; q++) {
        long double v = decode_float(t->dt, gen_bits(t->dt, t->cls, t->seed, w, q, j));
        sumabs += fabsl(v);
        if (q == 0) {
            acc = v;
            continue;
        }
        switch (t->op) {
        case COLL_SUM:
        case COLL_AVG:
            acc += v;
            break;
        case COLL_PROD:
            acc *= v;
            break;
        case COLL_MAX:
            if (v > acc)
                acc = v;
            break;
        default:
            if (v < acc)
                acc = v;
            break;
        }
    }
    if (t->op == COLL_AVG) {
        acc /= w;
        sumabs /= w;
    }
    long double eps = dtype_eps(t->dt);
    out->v = acc;
    /* One rank: every reduction is the input itself, exactly. */
    out->bound = (t->op == COLL_MAX || t->op == COLL_MIN || w == 1)
                     ? 0
                     : (long double)(w + 1) * eps * sumabs + eps * fabsl(acc);
}

/* Checks `n` reduced elements at res against the reference at input indices first.. */
static void check_reduced(ctx *c, const tbuf *b, const unsigned char *res, size_t n, size_t first,
                          const char *desc)
{
    const tcase *t = &b->t;
    size_t bad = 0, first_bad = 0;
    uint64_t got_bad = 0;
    refv ref_bad = {0};
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        refv ref = {0};
        ref_reduce(b, first + i, &ref);
        uint64_t got = load_bits(t->dt, res, i);
        bool ok;
        if (!is_float(t->dt)) {
            ok = (got & int_mask(t->dt)) == ref.bits;
        } else {
            long double g = decode_float(t->dt, got);
            long double err = fabsl(g - ref.v);
            ok = isfinite(g) && err <= ref.bound;
            if (ok && ref.bound > 0 && (double)(err / ref.bound) > worst)
                worst = (double)(err / ref.bound);
        }
        if (!ok && bad++ == 0) {
            first_bad = i;
            got_bad = got;
            ref_bad = ref;
        }
    }
    c->checks++;
    if (worst > c->max_ratio[t->dt])
        c->max_ratio[t->dt] = worst;
    if (bad) {
        char g[64], e[80];
        fmt_value(t->dt, got_bad, g, sizeof(g));
        if (is_float(t->dt))
            snprintf(e, sizeof(e), "%.10Lg (bound %.3Lg)", ref_bad.v, ref_bad.bound);
        else
            fmt_value(t->dt, ref_bad.bits, e, sizeof(e));
        fail(c, "%s: %zu of %zu elements wrong, first at index %zu: got %s expected %s", desc, bad,
             n, first_bad, g, e);
    }
}

/* Checks n elements at res against rank q's input at indices first.. (bit-exact). */
static void check_copy(ctx *c, const tbuf *b, const unsigned char *res, size_t n, int q,
                       size_t first, const char *desc)
{
    const tcase *t = &b->t;
    size_t bad = 0, first_bad = 0;
    uint64_t got_bad = 0, exp_bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t want = gen_bits(t->dt, t->cls, t->seed, b->world, q, first + i);
        uint64_t got = load_bits(t->dt, res, i);
        if (got != want && bad++ == 0) {
            first_bad = i;
            got_bad = got;
            exp_bad = want;
        }
    }
    c->checks++;
    if (bad) {
        char g[64], e[64];
        fmt_value(t->dt, got_bad, g, sizeof(g));
        fmt_value(t->dt, exp_bad, e, sizeof(e));
        fail(c,
             "%s: block of rank %d: %zu of %zu elements wrong, first at index %zu: got %s "
             "expected %s",
             desc, q, bad, n, first_bad, g, e);
    }
}

static void tb_verify(ctx *c, const tbuf *b)
{
    const tcase *t = &b->t;
    char desc[160];
    describe(t, desc, sizeof(desc));
    if (t->kind == K_BARRIER || t->count == 0)
        return;
    size_t n = t->count, e = esize(t->dt), r = (size_t)b->rank;
    bool root = b->rank == t->root;
    if (b->a && !guard_ok(b->a, b->na * e))
        fail(c, "%s: wrote past the end of the %s buffer (%zu elements)", desc,
             t->inplace ? "in-place" : "send", b->na);
    if (b->b && !guard_ok(b->b, b->nb * e))
        fail(c, "%s: wrote past the end of the receive buffer (%zu elements)", desc, b->nb);
    /* Inputs of out-of-place calls, and the in-place buffer of a non-root's reduce, must not
     * change. */
    bool a_is_input = !t->inplace || (t->kind == K_REDUCE && !root);
    if (b->a && a_is_input && memcmp(b->a, b->a_copy, b->na * e) != 0) {
        size_t i = 0;
        while (i < b->na && load_bits(t->dt, b->a, i) == load_bits(t->dt, b->a_copy, i))
            i++;
        fail(c, "%s: the %s buffer changed (first at index %zu)", desc,
             t->inplace ? "in-place (non-root)" : "send", i);
    }
    const unsigned char *res = t->inplace ? b->a : b->b;
    switch (t->kind) {
    case K_ALLREDUCE:
        check_reduced(c, b, res, n, 0, desc);
        break;
    case K_REDUCE:
        if (root) {
            check_reduced(c, b, res, n, 0, desc);
        } else if (b->b) {
            for (size_t i = 0; i < n * e; i++) {
                if (b->b[i] != SENTINEL) {
                    fail(c, "%s: non-root receive buffer written (byte %zu)", desc, i);
                    break;
                }
            }
        }
        break;
    case K_BROADCAST:
        check_copy(c, b, res, n, t->root, 0, desc);
        break;
    case K_ALLGATHER:
        for (int q = 0; q < b->world; q++)
            check_copy(c, b, res + (size_t)q * n * e, n, q, 0, desc);
        break;
    case K_REDUCE_SCATTER:
        check_reduced(c, b, t->inplace ? b->a + r * n * e : b->b, n, r * n, desc);
        break;
    default:
        break;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Communicators                                                                               */
/* ------------------------------------------------------------------------------------------ */

static int effective_timeout(const ctx *c, int dflt)
{
    return c->timeout_ms >= 0 ? c->timeout_ms : dflt;
}

/* Creates a communicator over every rank under "<prefix><suffix>". */
/* COLL_CHECK_LOG=1: the library's log lines on stderr, for debugging a failure. */
static void log_hook(void *arg, int level, const char *msg)
{
    (void)arg;
    fprintf(stderr, "libcollective[%d]: %s\n", level, msg);
}

static int comm_create(ctx *c, const char *suffix, int timeout_ms, coll_comm **out)
{
    coll_options o;
    coll_options_init(&o);
    if (getenv("COLL_CHECK_LOG"))
        o.log = log_hook;
    o.timeout_ms = timeout_ms;
    o.chunk_bytes = c->chunk_bytes;
    o.small_bytes = c->small_bytes;
    o.bind_addr = c->bind_addr;
    char prefix[320];
    snprintf(prefix, sizeof(prefix), "%s%s", c->prefix, suffix);
    set_where("coll_comm_init %s", prefix);
    int64_t t0 = mono_now_ns();
    int rc = coll_comm_init(c->store, prefix, c->rank, c->world, c->backend, -1, &o, out);
    if (rc < 0) {
        fail(c, "coll_comm_init(%s): %s: %s", prefix, coll_strerror(rc), coll_last_error(NULL));
        return rc;
    }
    coll_comm *m = *out;
    if (c->verbose)
        note(c, "communicator %s up in %.1f ms: %d hosts, local rank %d of %d", prefix,
             ms_since(t0), coll_comm_nhosts(m), coll_comm_local_rank(m), coll_comm_local_size(m));
    if (coll_comm_rank(m) != c->rank || coll_comm_size(m) != c->world)
        fail(c, "communicator says rank %d of %d", coll_comm_rank(m), coll_comm_size(m));
    if (coll_comm_backend(m) == COLL_BACKEND_AUTO)
        fail(c, "coll_comm_backend() is auto, not the backend chosen");
    if (c->local_world > 0 &&
        (coll_comm_local_size(m) != c->local_world || coll_comm_local_rank(m) != c->local_rank))
        fail(c, "communicator says local rank %d of %d; ddprun says %d of %d",
             coll_comm_local_rank(m), coll_comm_local_size(m), c->local_rank, c->local_world);
    if (c->expect_hosts > 0 && coll_comm_nhosts(m) != c->expect_hosts)
        fail(c, "communicator sees %d hosts, expected %d", coll_comm_nhosts(m), c->expect_hosts);
    return 0;
}

/* A store barrier of every rank (test-level phases, not under test). */
static int store_barrier(ctx *c, const char *name, int timeout_ms)
{
    char key[384];
    snprintf(key, sizeof(key), "%s/test/%s", c->prefix, name);
    set_where("store barrier %s", key);
    int rc = rdzv_barrier(c->store, key, c->world, timeout_ms);
    if (rc < 0)
        fail(c, "store barrier %s: %s", name, rdzv_strerror(rc));
    return rc;
}

/* Runs one case with the blocking form or the i-form, and verifies it. Returns the call's rc. */
static int run_case(ctx *c, coll_comm *comm, const tcase *t, bool async)
{
    char desc[160];
    describe(t, desc, sizeof(desc));
    set_where("%s %s", desc, async ? "(i-form)" : "(blocking)");
    tbuf b;
    tb_prepare(&b, t, c->rank, c->world);
    int rc = tb_issue(comm, &b, async);
    if (rc == 0 && async)
        rc = coll_wait(b.req);
    if (rc != 0)
        fail(c, "%s: returned %d (%s): %s", desc, rc, coll_strerror(rc), coll_last_error(comm));
    else
        tb_verify(c, &b);
    tb_free(&b);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Scenarios                                                                                   */
/* ------------------------------------------------------------------------------------------ */

static int value_class(coll_dtype dt, coll_op op)
{
    if (op == COLL_PROD)
        return is_float(dt) ? CLS_PROD : CLS_GEN;
    if (op == COLL_AVG && !is_float(dt))
        return CLS_SMALL;
    return CLS_GEN;
}

static int scen_ops(ctx *c)
{
    int w = c->world;
    coll_comm *comm;
    if (comm_create(c, "", effective_timeout(c, 120000), &comm) < 0)
        return -1;
    size_t counts[] = {0, 1, 1009, (size_t)w * 37 + 3, 100003};
    size_t ncounts = c->quick ? 4 : 5;
    int roots[3] = {0, w - 1, w / 2}, nroots = c->quick ? 2 : 3;
    if (w == 1)
        nroots = 1;
    else if (w == 2)
        nroots = 2;
    uint64_t id = 0;
    int rc = 0;
    for (size_t ci = 0; ci < ncounts && rc == 0; ci++) {
        for (int dt = 0; dt < COLL_DTYPE_COUNT && rc == 0; dt++) {
            for (int op = 0; op < COLL_OP_COUNT && rc == 0; op++) {
                tcase t = {.dt = (coll_dtype)dt,
                           .op = (coll_op)op,
                           .count = counts[ci],
                           .cls = value_class((coll_dtype)dt, (coll_op)op)};
                for (int ip = 0; ip < 2 && rc == 0; ip++) {
                    t.inplace = ip;
                    t.kind = K_ALLREDUCE;
                    t.seed = mix64(c->seed + ++id);
                    rc = run_case(c, comm, &t, id & 1);
                    for (int ri = 0; ri < nroots && rc == 0; ri++) {
                        t.kind = K_REDUCE;
                        t.root = roots[ri];
                        t.nullbuf = ri == 0;
                        t.seed = mix64(c->seed + ++id);
                        rc = run_case(c, comm, &t, id & 1);
                    }
                    t.nullbuf = false;
                    t.kind = K_REDUCE_SCATTER;
                    t.seed = mix64(c->seed + ++id);
                    if (rc == 0)
                        rc = run_case(c, comm, &t, id & 1);
                }
            }
            tcase t = {.dt = (coll_dtype)dt, .count = counts[ci], .cls = CLS_GEN};
            for (int ip = 0; ip < 2 && rc == 0; ip++) {
                t.inplace = ip;
                for (int ri = 0; ri < nroots && rc == 0; ri++) {
                    t.kind = K_BROADCAST;
                    t.root = roots[ri];
                    t.nullbuf = ri == 0;
                    t.seed = mix64(c->seed + ++id);
                    rc = run_case(c, comm, &t, id & 1);
                }
                t.nullbuf = false;
                t.kind = K_ALLGATHER;
                t.seed = mix64(c->seed + ++id);
                if (rc == 0)
                    rc = run_case(c, comm, &t, id & 1);
            }
        }
        if (rc == 0) {
            set_where("barrier after count %zu", counts[ci]);
            rc = coll_barrier(comm);
            if (rc != 0)
                fail(c, "barrier: %s: %s", coll_strerror(rc), coll_last_error(comm));
        }
    }
    if (rc != 0)
        coll_comm_abort(comm);
    set_where("coll_comm_close");
    coll_comm_close(comm);
    return rc;
}

/*
 * The result bytes of a reduction case on this rank (NULL where it has none: a reduce's
 * non-root), copied; the case is verified against the reference first.
 */
static unsigned char *run_kept(ctx *c, coll_comm *comm, const tcase *t, const char *algo, int *rc)
{
    char desc[160];
    describe(t, desc, sizeof(desc));
    set_where("COLL_CPU_ALGO=%s: %s", algo, desc);
    tbuf b;
    tb_prepare(&b, t, c->rank, c->world);
    *rc = tb_issue(comm, &b, false);
    unsigned char *kept = NULL;
    size_t nbytes = t->count * esize(t->dt);
    if (*rc != 0) {
        fail(c, "COLL_CPU_ALGO=%s: %s: returned %d (%s): %s", algo, desc, *rc, coll_strerror(*rc),
             coll_last_error(comm));
    } else {
        tb_verify(c, &b);
        if (b.recvp && (t->kind != K_REDUCE || c->rank == t->root)) {
            kept = malloc(nbytes ? nbytes : 1);
            if (!kept) {
                fprintf(stderr, "coll-check: out of memory\n");
                exit(2);
            }
            memcpy(kept, b.recvp, nbytes);
        }
    }
    tb_free(&b);
    return kept;
}

/*
 * coll_comm_init with COLL_CPU_ALGO=value on this rank: expects -EINVAL at once and
 * coll_last_error(NULL) naming the variable.
 */
static void expect_algo_refused(ctx *c, const char *value, const char *why)
{
    char prefix[320];
    coll_comm *m = NULL;
    snprintf(prefix, sizeof(prefix), "%s/%s", c->prefix, why);
    setenv("COLL_CPU_ALGO", value, 1);
    set_where("coll_comm_init with COLL_CPU_ALGO=%s (%s)", value, why);
    int rc = coll_comm_init(c->store, prefix, c->rank, c->world, COLL_BACKEND_CPU, -1, NULL, &m);
    c->checks++;
    if (rc != -EINVAL || !strstr(coll_last_error(NULL), "COLL_CPU_ALGO")) {
        fail(c,
             "coll_comm_init with COLL_CPU_ALGO=%s (%s): %d (%s), \"%s\"; expected -EINVAL "
             "naming COLL_CPU_ALGO",
             value, why, rc, coll_strerror(rc), coll_last_error(NULL));
        coll_comm_close(m);
    } else if (c->verbose) {
        note(c, "COLL_CPU_ALGO=%s (%s): \"%s\"", value, why, coll_last_error(NULL));
    }
}

/*
 * algos: the cpu backend's reduction algorithms agree bit for bit. One communicator per value
 * of COLL_CPU_ALGO (set in this process before each is made, alike on every rank); every
 * reduction case runs on each, is verified against the reference, and its result must equal
 * the first communicator's byte for byte. Counts cover both paths: within small_bytes, between
 * it and chunk_bytes (where only a forced latency runs the latency path), and beyond a chunk.
 * Then a value no algorithm has, and ranks that disagree, are refused at init.
 */
static int scen_algos(ctx *c)
{
    static const char *const algos[] = {"latency", "ring", "auto"};
    enum { NALGOS = sizeof(algos) / sizeof(algos[0]) };
    const char *saved = getenv("COLL_CPU_ALGO");
    char *restore = saved ? strdup(saved) : NULL;
    coll_comm *comms[NALGOS] = {NULL};
    int rc = 0, w = c->world;
    if (c->backend != COLL_BACKEND_CPU) {
        note(c, "only the cpu backend has algorithms to choose: nothing to check");
        free(restore);
        return 0;
    }
    for (int a = 0; a < NALGOS && rc == 0; a++) {
        char suffix[32];
        snprintf(suffix, sizeof(suffix), "/%s", algos[a]);
        setenv("COLL_CPU_ALGO", algos[a], 1);
        rc = comm_create(c, suffix, effective_timeout(c, 120000), &comms[a]);
    }
    size_t counts[] = {1, 1009, (size_t)w * 37 + 3, 100003, 300007};
    size_t ncounts = c->quick ? 3 : 5;
    uint64_t id = 0;
    for (size_t ci = 0; ci < ncounts && rc == 0; ci++) {
        for (int dt = 0; dt < COLL_DTYPE_COUNT && rc == 0; dt++) {
            for (int op = 0; op < COLL_OP_COUNT && rc == 0; op++) {
                for (int k = 0; k < 3 && rc == 0; k++) {
                    tcase t = {.kind = k == 0   ? K_ALLREDUCE
                                       : k == 1 ? K_REDUCE
                                                : K_REDUCE_SCATTER,
                               .dt = (coll_dtype)dt,
                               .op = (coll_op)op,
                               .count = counts[ci],
                               .root = w - 1,
                               .inplace = (id & 1) != 0,
                               .cls = value_class((coll_dtype)dt, (coll_op)op),
                               .seed = mix64(c->seed + ++id)};
                    unsigned char *first = NULL;
                    for (int a = 0; a < NALGOS && rc == 0; a++) {
                        unsigned char *got = run_kept(c, comms[a], &t, algos[a], &rc);
                        if (a == 0) {
                            first = got;
                            continue;
                        }
                        c->checks++;
                        if (rc == 0 && (!got != !first ||
                                        (got && memcmp(got, first, t.count * esize(t.dt)) != 0))) {
                            char desc[160];
                            describe(&t, desc, sizeof(desc));
                            fail(c, "%s: COLL_CPU_ALGO=%s differs from %s", desc, algos[a],
                                 algos[0]);
                        }
                        free(got);
                    }
                    free(first);
                }
            }
        }
        for (int a = 0; a < NALGOS && rc == 0; a++) {
            set_where("COLL_CPU_ALGO=%s: barrier after count %zu", algos[a], counts[ci]);
            if ((rc = coll_barrier(comms[a])) != 0)
                fail(c, "COLL_CPU_ALGO=%s: barrier: %s: %s", algos[a], coll_strerror(rc),
                     coll_last_error(comms[a]));
        }
    }
    for (int a = 0; a < NALGOS; a++) {
        if (rc != 0 && comms[a])
            coll_comm_abort(comms[a]);
        coll_comm_close(comms[a]);
    }
    if (rc == 0) {
        expect_algo_refused(c, "bogus", "unknown");
        if (w > 1)
            expect_algo_refused(c, c->rank == 0 ? "ring" : "latency", "disagreeing");
    }
    if (restore)
        setenv("COLL_CPU_ALGO", restore, 1);
    else
        unsetenv("COLL_CPU_ALGO");
    free(restore);
    return rc;
}

static void print_rate(ctx *c, const char *what, size_t nbytes, double ms)
{
    note(c, "%s: %.1f MiB in %.1f ms (%.2f GB/s algorithm bandwidth)", what,
         (double)nbytes / (1 << 20), ms, ms > 0 ? (double)nbytes / ms / 1e6 : 0.0);
}

static int scen_big(ctx *c)
{
    int w = c->world;
    coll_comm *comm;
    if (comm_create(c, "", effective_timeout(c, 300000), &comm) < 0)
        return -1;
    size_t total = c->big_mib << 20, n = total / 4; /* f32 elements */
    tcase cases[] = {
        {.kind = K_ALLREDUCE, .dt = COLL_F32, .op = COLL_SUM, .count = n},
        {.kind = K_ALLREDUCE, .dt = COLL_F32, .op = COLL_SUM, .count = n, .inplace = true},
        {.kind = K_REDUCE_SCATTER, .dt = COLL_F32, .op = COLL_SUM, .count = n / (size_t)w},
        {.kind = K_ALLGATHER, .dt = COLL_F32, .count = n / (size_t)w},
        {.kind = K_BROADCAST, .dt = COLL_F32, .count = n, .root = w - 1},
        {.kind = K_ALLREDUCE, .dt = COLL_BF16, .op = COLL_SUM, .count = total / 2},
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]) && rc == 0; i++) {
        tcase *t = &cases[i];
        t->cls = CLS_EXACT;
        t->seed = mix64(c->seed + 1000 + i);
        char desc[160];
        describe(t, desc, sizeof(desc));
        set_where("%s", desc);
        tbuf b;
        tb_prepare(&b, t, c->rank, w);
        rc = coll_barrier(comm); /* so the timing covers the operation alone */
        int64_t t0 = mono_now_ns();
        if (rc == 0)
            rc = tb_issue(comm, &b, false);
        double ms = ms_since(t0);
        if (rc != 0) {
            fail(c, "%s: returned %d (%s): %s", desc, rc, coll_strerror(rc), coll_last_error(comm));
        } else {
            print_rate(c, desc,
                       t->count * esize(t->dt) *
                           (t->kind == K_ALLGATHER || t->kind == K_REDUCE_SCATTER ? (size_t)w : 1),
                       ms);
            set_where("verifying %s", desc);
            tb_verify(c, &b);
        }
        tb_free(&b);
    }
    if (rc != 0)
        coll_comm_abort(comm);
    set_where("coll_comm_close");
    coll_comm_close(comm);
    return rc;
}

/* A random case for the in-flight scenario: the same on every rank for the same index. */
static void random_case(ctx *c, uint64_t salt, int i, tcase *t)
{
    static const size_t counts[] = {0, 1, 7, 1009, 4099, 30011};
    uint64_t h = hash3(c->seed ^ salt, 0, (size_t)i);
    memset(t, 0, sizeof(*t));
    t->kind = (enum kind)(h % 6);
    t->dt = (coll_dtype)((h >> 8) % COLL_DTYPE_COUNT);
    t->op = (coll_op)((h >> 16) % COLL_OP_COUNT);
    t->count = counts[(h >> 24) % 6];
    t->root = (int)((h >> 32) % (uint64_t)c->world);
    t->inplace = (h >> 40) & 1;
    t->nullbuf = (h >> 41) & 1;
    t->cls = value_class(t->dt, t->op);
    t->seed = mix64(h);
}

typedef struct thr_arg {
    ctx c; /* a copy with counters of its own */
    coll_comm *comm;
    int id, rc;
} thr_arg;

/* 24 operations of every kind on the thread's own communicator, i-forms and blocking. */
static void *thr_main(void *p)
{
    thr_arg *a = p;
    for (int k = 0; k < 24 && a->rc == 0; k++) {
        tcase t;
        random_case(&a->c, 0x3f + (uint64_t)a->id * 1000, k, &t);
        a->rc = run_case(&a->c, a->comm, &t, k % 2);
    }
    return NULL;
}

static int scen_inflight(ctx *c)
{
    enum { N = 64, NPOLL = 8 };
    coll_comm *comm;
    if (comm_create(c, "", effective_timeout(c, 120000), &comm) < 0)
        return -1;
    tbuf *bufs = calloc(N, sizeof(tbuf));
    int rc = 0, issued = 0;
    for (int i = 0; i < N; i++) {
        tcase t;
        random_case(c, 0x1f, i, &t);
        tb_prepare(&bufs[i], &t, c->rank, c->world);
    }
    set_where("issuing %d operations", N);
    for (int i = 0; i < N && rc == 0; i++) {
        rc = tb_issue(comm, &bufs[i], true);
        if (rc != 0) {
            char desc[160];
            describe(&bufs[i].t, desc, sizeof(desc));
            fail(c, "issuing operation %d (%s): %s: %s", i, desc, coll_strerror(rc),
                 coll_last_error(comm));
        } else {
            issued++;
        }
    }
    /* Wait in an order of this rank's own. */
    int order[N];
    for (int i = 0; i < N; i++)
        order[i] = i;
    for (int i = N - 1; i > 0; i--) {
        int j = (int)(hash3(c->seed, c->rank, (size_t)i + 77) % (uint64_t)(i + 1));
        int tmp = order[i];
        order[i] = order[j];
        order[j] = tmp;
    }
    for (int k = 0; k < N; k++) {
        tbuf *b = &bufs[order[k]];
        if (order[k] >= issued)
            continue;
        char desc[160];
        describe(&b->t, desc, sizeof(desc));
        set_where("waiting for in-flight operation %d (%s), %d-th wait", order[k], desc, k);
        int wr = coll_wait(b->req);
        if (wr != 0) {
            fail(c, "in-flight operation %d (%s): %s: %s", order[k], desc, coll_strerror(wr),
                 coll_last_error(comm));
            rc = rc ? rc : wr;
        }
        b->rc = wr;
    }
    for (int i = 0; i < issued; i++) {
        set_where("verifying in-flight operation %d", i);
        if (bufs[i].rc == 0)
            tb_verify(c, &bufs[i]);
    }
    for (int i = 0; i < N; i++)
        tb_free(&bufs[i]);

    /* coll_test polling: a few operations, polled until each is done, then released. */
    if (rc == 0) {
        tbuf pb[NPOLL];
        bool done[NPOLL] = {false};
        int trc[NPOLL];
        for (int i = 0; i < NPOLL; i++) {
            tcase t;
            random_case(c, 0x2f, i, &t);
            tb_prepare(&pb[i], &t, c->rank, c->world);
            if (rc == 0 && (rc = tb_issue(comm, &pb[i], true)) != 0)
                fail(c, "issuing polled operation %d: %s", i, coll_strerror(rc));
        }
        int left = rc == 0 ? NPOLL : 0;
        int64_t deadline = mono_now_ns() + (int64_t)effective_timeout(c, 120000) * 1000000;
        long polls = 0;
        set_where("polling %d operations with coll_test", NPOLL);
        while (left > 0 && mono_now_ns() < deadline) {
            for (int i = 0; i < NPOLL; i++) {
                if (done[i])
                    continue;
                bool d = false;
                int r = coll_test(pb[i].req, &d);
                polls++;
                if (!d && r != 0)
                    fail(c, "coll_test on pending operation %d returned %d", i, r);
                if (d) {
                    done[i] = true;
                    trc[i] = r;
                    left--;
                }
            }
            sched_yield();
        }
        if (left > 0)
            fail(c, "%d polled operations not done after the timeout", left);
        for (int i = 0; i < NPOLL && rc == 0; i++) {
            bool d = false;
            int again = coll_test(pb[i].req, &d);
            if (done[i] && (!d || again != trc[i]))
                fail(c, "coll_test after completion of %d: done %d rc %d (first %d)", i, d, again,
                     trc[i]);
            int wr = coll_wait(pb[i].req);
            if (done[i] && wr != trc[i])
                fail(c, "polled operation %d: coll_test said %d, coll_wait %d", i, trc[i], wr);
            pb[i].rc = wr;
            if (wr == 0)
                tb_verify(c, &pb[i]);
            else
                fail(c, "polled operation %d: %s: %s", i, coll_strerror(wr), coll_last_error(comm));
        }
        for (int i = 0; i < NPOLL; i++)
            tb_free(&pb[i]);
        if (c->verbose)
            note(c, "%ld coll_test calls", polls);
    }
    free(bufs);

    /* Threads: communicators split off this one, each driven by a thread of its own, all at
     * the same time. */
    enum { NTHR = 4 };
    thr_arg ta[NTHR];
    pthread_t th[NTHR];
    int nthr = 0;
    for (int i = 0; i < NTHR && rc == 0; i++) {
        ta[i] = (thr_arg){.c = *c, .id = i};
        ta[i].c.checks = ta[i].c.failures = ta[i].c.reports = 0;
        set_where("splitting communicator %d for the threads", i);
        rc = coll_comm_split(comm, 0, c->rank, &ta[i].comm);
        if (rc != 0)
            fail(c, "coll_comm_split for thread %d: %s: %s", i, coll_strerror(rc),
                 coll_last_error(NULL));
        else
            nthr++;
    }
    set_where("%d threads with a communicator each", nthr);
    for (int i = 0; i < nthr && rc == 0; i++)
        pthread_create(&th[i], NULL, thr_main, &ta[i]);
    for (int i = 0; i < nthr; i++) {
        if (rc == 0)
            pthread_join(th[i], NULL);
        c->checks += ta[i].c.checks;
        c->failures += ta[i].c.failures;
        for (int d = 0; d < COLL_DTYPE_COUNT; d++)
            if (ta[i].c.max_ratio[d] > c->max_ratio[d])
                c->max_ratio[d] = ta[i].c.max_ratio[d];
        if (ta[i].rc != 0 && rc == 0)
            rc = ta[i].rc;
        coll_comm_close(ta[i].comm);
    }

    if (rc != 0)
        coll_comm_abort(comm);
    set_where("coll_comm_close");
    coll_comm_close(comm);
    return rc;
}

/*
 * Allreduce of i64 (global rank + 1) * 1000003 + i over the members of `sub`, whose global
 * ranks are members[0..n) in sub-rank order; checks sub's rank and size first.
 */
static int check_sub(ctx *c, coll_comm *sub, const int *members, int n, const char *name)
{
    int want_rank = -1;
    for (int k = 0; k < n; k++)
        if (members[k] == c->rank)
            want_rank = k;
    if (coll_comm_size(sub) != n || coll_comm_rank(sub) != want_rank) {
        fail(c, "split %s: rank %d of %d, expected %d of %d", name, coll_comm_rank(sub),
             coll_comm_size(sub), want_rank, n);
        return -1;
    }
    if (coll_comm_local_rank(sub) < 0 || coll_comm_local_rank(sub) >= coll_comm_local_size(sub) ||
        coll_comm_nhosts(sub) < 1 || coll_comm_local_size(sub) > n)
        fail(c, "split %s: local rank %d of %d, %d hosts", name, coll_comm_local_rank(sub),
             coll_comm_local_size(sub), coll_comm_nhosts(sub));
    enum { CNT = 1009 };
    int64_t *buf = malloc(CNT * sizeof(int64_t));
    for (int i = 0; i < CNT; i++)
        buf[i] = (int64_t)(c->rank + 1) * 1000003 + i;
    set_where("allreduce on split %s", name);
    int rc = coll_allreduce(sub, buf, buf, CNT, COLL_I64, COLL_SUM);
    if (rc != 0) {
        fail(c, "split %s: allreduce: %s: %s", name, coll_strerror(rc), coll_last_error(sub));
    } else {
        for (int i = 0; i < CNT; i++) {
            int64_t want = 0;
            for (int k = 0; k < n; k++)
                want += (int64_t)(members[k] + 1) * 1000003 + i;
            if (buf[i] != want) {
                fail(c, "split %s: allreduce index %d: got %" PRId64 " expected %" PRId64, name, i,
                     buf[i], want);
                break;
            }
        }
        c->checks++;
    }
    /* Broadcast from the sub-communicator's last rank. */
    int64_t v = c->rank;
    if (rc == 0 && (rc = coll_broadcast(sub, &v, &v, 1, COLL_I64, n - 1)) != 0)
        fail(c, "split %s: broadcast: %s: %s", name, coll_strerror(rc), coll_last_error(sub));
    else if (rc == 0 && v != members[n - 1])
        fail(c, "split %s: broadcast from sub-rank %d gave %" PRId64 ", expected %d", name, n - 1,
             v, members[n - 1]);
    free(buf);
    return rc;
}

static int do_split(ctx *c, coll_comm *comm, int color, int key, coll_comm **out, const char *name)
{
    set_where("coll_comm_split %s", name);
    int rc = coll_comm_split(comm, color, key, out);
    if (rc != 0)
        fail(c, "coll_comm_split %s (color %d key %d): %s: %s", name, color, key, coll_strerror(rc),
             coll_last_error(NULL));
    return rc;
}

static int scen_split(ctx *c)
{
    int w = c->world, r = c->rank, rc;
    coll_comm *comm;
    if (comm_create(c, "", effective_timeout(c, 120000), &comm) < 0)
        return -1;
    int *members = malloc((size_t)w * sizeof(int));
    int n;

    /* Even and odd ranks, split while an allreduce on the parent is pending (the split waits
     * for it). */
    coll_comm *par = NULL;
    tcase pt = {.kind = K_ALLREDUCE,
                .dt = COLL_F32,
                .op = COLL_SUM,
                .count = 100003,
                .cls = CLS_GEN,
                .seed = mix64(c->seed + 0x5b)};
    tbuf pb;
    tb_prepare(&pb, &pt, r, w);
    set_where("allreduce pending across a split");
    if ((rc = tb_issue(comm, &pb, true)) != 0) {
        fail(c, "iallreduce before the split: %s", coll_strerror(rc));
        tb_free(&pb);
        goto out;
    }
    rc = do_split(c, comm, r % 2, r, &par, "even/odd");
    int wr = coll_wait(pb.req);
    if (wr != 0)
        fail(c, "allreduce pending across a split: %s: %s", coll_strerror(wr),
             coll_last_error(comm));
    else
        tb_verify(c, &pb);
    tb_free(&pb);
    if (rc != 0 || wr != 0) {
        rc = rc ? rc : wr;
        goto out;
    }
    n = 0;
    for (int q = r % 2; q < w; q += 2)
        members[n++] = q;
    if ((rc = check_sub(c, par, members, n, "even/odd")) != 0)
        goto out;

    /* Nested: halves of the even/odd communicator by sub-rank parity. */
    coll_comm *nest = NULL;
    int pr = coll_comm_rank(par);
    if ((rc = do_split(c, par, pr % 2, 0, &nest, "nested")) != 0)
        goto out;
    int m = 0;
    for (int k = pr % 2; k < n; k += 2)
        members[m++] = (r % 2) + 2 * k;
    rc = check_sub(c, nest, members, m, "nested");
    coll_comm_close(nest);
    coll_comm_close(par);
    if (rc != 0)
        goto out;

    /* One color, keys reversing the order. */
    coll_comm *rev = NULL;
    if ((rc = do_split(c, comm, 7, w - r, &rev, "reversed keys")) != 0)
        goto out;
    for (int k = 0; k < w; k++)
        members[k] = w - 1 - k;
    rc = check_sub(c, rev, members, w, "reversed keys");
    coll_comm_close(rev);
    if (rc != 0)
        goto out;

    /* Rank 0 opts out; equal keys order by parent rank. */
    if (w >= 2) {
        coll_comm *rest = (coll_comm *)&rc; /* must become NULL on rank 0 */
        if ((rc = do_split(c, comm, r == 0 ? COLL_SPLIT_NOCOLOR : 3, 0, &rest, "no-color")) != 0)
            goto out;
        if (r == 0) {
            if (rest != NULL) {
                fail(c, "split with COLL_SPLIT_NOCOLOR returned a communicator");
                rest = NULL;
            }
        } else {
            for (int k = 1; k < w; k++)
                members[k - 1] = k;
            rc = check_sub(c, rest, members, w - 1, "no-color");
        }
        coll_comm_close(rest);
        if (rc != 0)
            goto out;
    }

    /* A grid of rows of 2 (an even world of 4 or more): row and column communicators, with
     * an allreduce in flight on each at the same time. */
    if (w >= 4 && w % 2 == 0) {
        int cols = 2, rows = w / 2, row = r / cols, col = r % cols;
        coll_comm *rowc = NULL, *colc = NULL;
        if ((rc = do_split(c, comm, row, col, &rowc, "grid rows")) != 0)
            goto out;
        if ((rc = do_split(c, comm, col, row, &colc, "grid columns")) != 0) {
            coll_comm_close(rowc);
            goto out;
        }
        if (coll_comm_size(rowc) != cols || coll_comm_rank(rowc) != col ||
            coll_comm_size(colc) != rows || coll_comm_rank(colc) != row) {
            fail(c,
                 "grid: row comm %d of %d (want %d of %d), column comm %d of %d (want %d of "
                 "%d)",
                 coll_comm_rank(rowc), coll_comm_size(rowc), col, cols, coll_comm_rank(colc),
                 coll_comm_size(colc), row, rows);
            rc = -1;
        }
        enum { GN = 4099 };
        float *rb = malloc(GN * sizeof(float)), *cb = malloc(GN * sizeof(float));
        for (int i = 0; i < GN; i++) {
            rb[i] = (float)(r + i % 5);
            cb[i] = (float)(r * 2 + i % 3);
        }
        coll_request *rq = NULL, *cq = NULL;
        set_where("grid allreduces");
        if (rc == 0 && (rc = coll_iallreduce(rowc, rb, rb, GN, COLL_F32, COLL_SUM, &rq)) != 0)
            fail(c, "grid row iallreduce: %s", coll_strerror(rc));
        if (rc == 0 && (rc = coll_iallreduce(colc, cb, cb, GN, COLL_F32, COLL_MAX, &cq)) != 0) {
            fail(c, "grid column iallreduce: %s", coll_strerror(rc));
            coll_wait(rq);
        }
        if (rc == 0) {
            int r1 = coll_wait(cq), r2 = coll_wait(rq);
            if (r1 != 0 || r2 != 0) {
                fail(c, "grid allreduces: column %s (%s), row %s (%s)", coll_strerror(r1),
                     coll_last_error(colc), coll_strerror(r2), coll_last_error(rowc));
                rc = -1;
            }
        }
        for (int i = 0; rc == 0 && i < GN; i++) {
            float wr = 0, wc = 0;
            for (int k = 0; k < cols; k++)
                wr += (float)(row * cols + k + i % 5);
            wc = (float)((rows - 1) * cols + col) * 2 + (float)(i % 3);
            if (rb[i] != wr || cb[i] != wc) {
                fail(c, "grid index %d: row sum %g (want %g), column max %g (want %g)", i, rb[i],
                     wr, cb[i], wc);
                break;
            }
        }
        c->checks++;
        free(rb);
        free(cb);
        coll_comm_close(colc);
        coll_comm_close(rowc);
        if (rc != 0)
            goto out;
    }

    /* The parent still works. */
    for (int k = 0; k < w; k++)
        members[k] = k;
    rc = check_sub(c, comm, members, w, "parent after splits");
out:
    free(members);
    if (rc != 0)
        coll_comm_abort(comm);
    set_where("coll_comm_close");
    coll_comm_close(comm);
    return rc;
}

/* p2p helpers: a buffer of rank q's message `tag` with n elements of dt. */
static unsigned char *p2p_msg(ctx *c, coll_dtype dt, int q, int tag, size_t n)
{
    unsigned char *p = alloc_buf(n * esize(dt), 0);
    for (size_t i = 0; i < n; i++)
        store_bits(dt, p, i, gen_bits(dt, CLS_GEN, c->seed + (uint64_t)tag, c->world, q, i));
    return p;
}

static void p2p_check(ctx *c, const unsigned char *got, coll_dtype dt, int q, int tag, size_t n,
                      const char *what)
{
    c->checks++;
    if (!guard_ok(got, n * esize(dt))) {
        fail(c, "%s: wrote past the end of the receive buffer", what);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t want = gen_bits(dt, CLS_GEN, c->seed + (uint64_t)tag, c->world, q, i);
        uint64_t g = load_bits(dt, got, i);
        if (g != want) {
            char gs[64], ws[64];
            fmt_value(dt, g, gs, sizeof(gs));
            fmt_value(dt, want, ws, sizeof(ws));
            fail(c, "%s: %s count %zu from rank %d: index %zu: got %s expected %s", what,
                 coll_dtype_name(dt), n, q, i, gs, ws);
            return;
        }
    }
}

/*
 * Send to `to` and receive from `from` (either -1), sender first or receiver first. The send
 * goes on comm, the receive on rcomm (NULL: comm too).
 */
static int p2p_pair(ctx *c, coll_comm *comm, coll_comm *rcomm, int to, int from, coll_dtype dt,
                    size_t n, int tag, bool recv_first, const char *what)
{
    unsigned char *out = to >= 0 ? p2p_msg(c, dt, c->rank, tag, n) : NULL;
    unsigned char *in = from >= 0 ? alloc_buf(n * esize(dt), SENTINEL) : NULL;
    coll_request *sq = NULL, *rq = NULL;
    int rc = 0;
    set_where("%s: %s count %zu to %d from %d (%s first)", what, coll_dtype_name(dt), n, to, from,
              recv_first ? "receive" : "send");
    rcomm = rcomm ? rcomm : comm;
    if (recv_first && from >= 0)
        rc = coll_irecv(rcomm, in, n, dt, from, &rq);
    if (rc == 0 && to >= 0)
        rc = coll_isend(comm, out, n, dt, to, &sq);
    if (rc == 0 && !recv_first && from >= 0)
        rc = coll_irecv(rcomm, in, n, dt, from, &rq);
    if (rc != 0)
        fail(c, "%s: issuing: %s", what, coll_strerror(rc));
    int r1 = sq ? coll_wait(sq) : 0, r2 = rq ? coll_wait(rq) : 0;
    if (r1 != 0 || r2 != 0) {
        fail(c, "%s: %s count %zu: send to %d: %s, receive from %d: %s: %s", what,
             coll_dtype_name(dt), n, to, coll_strerror(r1), from, coll_strerror(r2),
             coll_last_error(r1 ? comm : rcomm));
        rc = r1 ? r1 : r2;
    }
    if (rc == 0 && in)
        p2p_check(c, in, dt, from, tag, n, what);
    free(out);
    free(in);
    return rc;
}

static int scen_p2p(ctx *c)
{
    int w = c->world, r = c->rank, rc = 0;
    if (w < 2) {
        note(c, "p2p needs 2 ranks or more: skipped");
        return 0;
    }
    coll_comm *comm, *comm2 = NULL;
    if (comm_create(c, "", effective_timeout(c, 120000), &comm) < 0)
        return -1;
    int next = (r + 1) % w, prev = (r + w - 1) % w;
    static const struct {
        coll_dtype dt;
        size_t n;
    } sizes[] = {
        {COLL_U8, 1}, {COLL_F16, 1009}, {COLL_I32, 0}, {COLL_F64, 100003}, {COLL_F32, 1 << 22}};
    int tag = 100;

    /* Ring pass, deadlock-free in any engine: even ranks send first, odd ranks receive first. */
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]) && rc == 0; k++)
        rc = p2p_pair(c, comm, NULL, next, prev, sizes[k].dt, sizes[k].n, tag++, r % 2 == 1,
                      "ring pass");

    /* Token ring with the blocking forms: each rank adds its rank and passes on. */
    if (rc == 0) {
        int64_t tok = r == 0 ? 1000 : 0;
        set_where("token ring");
        if (r == 0) {
            rc = coll_send(comm, &tok, 1, COLL_I64, next);
            if (rc == 0)
                rc = coll_recv(comm, &tok, 1, COLL_I64, prev);
            if (rc == 0 && tok != 1000 + (int64_t)w * (w - 1) / 2)
                fail(c, "token ring: got %" PRId64 " back, expected %" PRId64, tok,
                     1000 + (int64_t)w * (w - 1) / 2);
        } else {
            rc = coll_recv(comm, &tok, 1, COLL_I64, prev);
            tok += r;
            if (rc == 0)
                rc = coll_send(comm, &tok, 1, COLL_I64, next);
        }
        if (rc != 0)
            fail(c, "token ring: %s: %s", coll_strerror(rc), coll_last_error(comm));
        c->checks++;
    }

    /* Pairs (r, r ^ 1): a large exchange, the lower rank sending first; then four messages of
     * different sizes, all issued before any wait, that must match in order. */
    int partner = r ^ 1;
    if (rc == 0 && partner < w) {
        rc = p2p_pair(c, comm, NULL, partner, partner, COLL_BF16, 1 << 21, tag, r > partner,
                      "pairwise exchange");
        static const size_t ord[] = {1, 1009, 0, 5};
        unsigned char *msg[4];
        coll_request *q[4] = {NULL};
        set_where("ordered messages with %d", partner);
        for (int k = 0; k < 4; k++) {
            msg[k] = r < partner ? p2p_msg(c, COLL_I64, r, tag + 1 + k, ord[k])
                                 : alloc_buf(ord[k] * 8, SENTINEL);
            int ir = 0;
            if (rc == 0 && r < partner)
                ir = coll_isend(comm, msg[k], ord[k], COLL_I64, partner, &q[k]);
            else if (rc == 0)
                ir = coll_irecv(comm, msg[k], ord[k], COLL_I64, partner, &q[k]);
            if (ir != 0) {
                fail(c, "ordered messages: issuing %d: %s", k, coll_strerror(ir));
                rc = ir;
            }
        }
        for (int k = 0; k < 4; k++) {
            int wr = q[k] ? coll_wait(q[k]) : 0;
            if (wr != 0) {
                fail(c, "ordered messages: message %d (%zu x i64): %s: %s", k, ord[k],
                     coll_strerror(wr), coll_last_error(comm));
                rc = rc ? rc : wr;
            } else if (q[k] && r > partner) {
                p2p_check(c, msg[k], COLL_I64, partner, tag + 1 + k, ord[k], "ordered messages");
            }
            free(msg[k]);
        }
    }
    tag += 5;
    /* Ranks without a partner (odd world) wait at the barrier below. */

    /* All pairs in one global order: a sends to b, then b to a. */
    for (int a = 0; a < w && rc == 0; a++) {
        for (int b = a + 1; b < w && rc == 0; b++) {
            int t = tag + a * w + b;
            if (r == a) {
                rc = p2p_pair(c, comm, NULL, b, -1, COLL_F32, 4099, t, false, "all pairs");
                if (rc == 0)
                    rc = p2p_pair(c, comm, NULL, -1, b, COLL_F32, 4099, t + w * w, false,
                                  "all pairs");
            } else if (r == b) {
                rc = p2p_pair(c, comm, NULL, -1, a, COLL_F32, 4099, t, false, "all pairs");
                if (rc == 0)
                    rc = p2p_pair(c, comm, NULL, a, -1, COLL_F32, 4099, t + w * w, false,
                                  "all pairs");
            }
        }
    }
    tag += 2 * w * w + 1;
    if (rc == 0) {
        set_where("barrier after p2p");
        if ((rc = coll_barrier(comm)) != 0)
            fail(c, "barrier: %s: %s", coll_strerror(rc), coll_last_error(comm));
    }

    /* Exchange through two communicators, as coll.h suggests: the lower rank sends on the first
     * and receives on the second, the higher one the other way round; both receive first. */
    if (rc == 0 && partner < w) {
        if (comm_create(c, "/second", effective_timeout(c, 120000), &comm2) < 0)
            rc = -1;
        else
            rc = p2p_pair(c, r < partner ? comm : comm2, r < partner ? comm2 : comm, partner,
                          partner, COLL_F32, 1 << 22, tag, true,
                          "exchange, receive on a second communicator");
        tag++;
    } else if (rc == 0 && comm_create(c, "/second", effective_timeout(c, 120000), &comm2) < 0) {
        rc = -1;
    }
    coll_comm_close(comm2);

    if (rc != 0)
        coll_comm_abort(comm);
    set_where("coll_comm_close");
    coll_comm_close(comm);
    return rc;
}

static int scen_barrier(ctx *c)
{
    coll_comm *comm;
    if (comm_create(c, "", effective_timeout(c, 120000), &comm) < 0)
        return -1;
    int rc = 0;
    for (int round = 0; round < 5 && rc == 0; round++) {
        char key[384];
        snprintf(key, sizeof(key), "%s/test/arrived/%d", c->prefix, round);
        int64_t v;
        set_where("barrier round %d: store add", round);
        if ((rc = rdzv_add(c->store, key, 1, &v)) != 0) {
            fail(c, "store add: %s", rdzv_strerror(rc));
            break;
        }
        set_where("barrier round %d", round);
        if ((rc = (round % 2 ? coll_barrier(comm) : 0)) == 0 && round % 2 == 0) {
            coll_request *q;
            rc = coll_ibarrier(comm, &q);
            if (rc == 0)
                rc = coll_wait(q);
        }
        if (rc != 0) {
            fail(c, "barrier round %d: %s: %s", round, coll_strerror(rc), coll_last_error(comm));
            break;
        }
        if ((rc = rdzv_add(c->store, key, 0, &v)) != 0) {
            fail(c, "store add: %s", rdzv_strerror(rc));
            break;
        }
        c->checks++;
        if (v < c->world)
            fail(c, "barrier round %d: left it when only %" PRId64 " of %d ranks had arrived",
                 round, v, c->world);
    }
    if (rc != 0)
        coll_comm_abort(comm);
    coll_comm_close(comm);
    return rc;
}

typedef struct aborter {
    coll_comm *comm;
    int delay_ms;
} aborter;

static void *abort_thread(void *arg)
{
    aborter *a = arg;
    /* The delay only makes it likely that the main thread is inside coll_wait(); the test is
     * correct either way. */
    struct timespec ts = {a->delay_ms / 1000, (long)(a->delay_ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
    coll_comm_abort(a->comm);
    return NULL;
}

/* Expects rc to be an error naming `who` (COLL_EREMOTE or -ETIMEDOUT), within limit_ms. */
static void expect_named(ctx *c, coll_comm *comm, int rc, int who, double ms, double limit_ms,
                         const char *what, bool timeout_only)
{
    const char *le = coll_last_error(comm);
    int fr = coll_comm_failed_rank(comm);
    c->checks++;
    bool code_ok = timeout_only ? rc == -ETIMEDOUT : (rc == COLL_EREMOTE || rc == -ETIMEDOUT);
    if (!code_ok || fr != who || !names_rank(le, who) || ms > limit_ms)
        fail(c,
             "%s: expected %s naming rank %d within %.0f ms; got %d (%s) after %.0f ms, "
             "failed rank %d, last error \"%s\"",
             what, timeout_only ? "-ETIMEDOUT" : "COLL_EREMOTE or -ETIMEDOUT", who, limit_ms, rc,
             coll_strerror(rc), ms, fr, le);
    else
        note(c, "%s: %s after %.0f ms naming rank %d: \"%s\"", what, coll_strerror(rc), ms, fr, le);
}

static int scen_abort(ctx *c)
{
    int w = c->world, r = c->rank;
    if (w < 2) {
        note(c, "abort needs 2 ranks or more: skipped");
        return 0;
    }
    int tmo = effective_timeout(c, 20000);
    int64_t slack = 5000;
    enum { CNT = 1 << 20 };
    float *buf = calloc(CNT, sizeof(float));
    char key[384];

    /* Part 1: rank 0's pending allreduce (the others have not issued it) is ended by an abort
     * from another thread with -ECANCELED; later calls fail at once with -ECANCELED; the
     * others, issuing the allreduce afterwards, get an error naming rank 0. */
    coll_comm *comm;
    if (comm_create(c, "/1", tmo, &comm) < 0)
        return -1;
    int rc = 0;
    set_where("abort part 1: warm-up allreduce");
    if ((rc = coll_allreduce(comm, buf, buf, CNT, COLL_F32, COLL_SUM)) != 0)
        fail(c, "warm-up allreduce: %s: %s", coll_strerror(rc), coll_last_error(comm));
    snprintf(key, sizeof(key), "%s/test/aborted", c->prefix);
    if (rc == 0 && r == 0) {
        coll_request *q;
        rc = coll_iallreduce(comm, buf, buf, CNT, COLL_F32, COLL_SUM, &q);
        bool done = true;
        if (rc == 0 && coll_test(q, &done) == 0 && done)
            fail(c, "allreduce done before the other ranks issued it");
        aborter a = {comm, 300};
        pthread_t th;
        pthread_create(&th, NULL, abort_thread, &a);
        int64_t t0 = mono_now_ns();
        set_where("abort part 1: waiting for the allreduce the other thread aborts");
        int wr = rc == 0 ? coll_wait(q) : rc;
        double ms = ms_since(t0);
        pthread_join(th, NULL);
        c->checks++;
        if (wr != -ECANCELED)
            fail(c, "aborted allreduce returned %d (%s) after %.0f ms, expected -ECANCELED: %s", wr,
                 coll_strerror(wr), ms, coll_last_error(comm));
        else
            note(c, "pending allreduce aborted from another thread: -ECANCELED after %.0f ms", ms);
        coll_request *q2 = (coll_request *)&a;
        int ir = coll_iallreduce(comm, buf, buf, 4, COLL_F32, COLL_SUM, &q2);
        c->checks++;
        if (ir != -ECANCELED || q2 != (coll_request *)&a)
            fail(c, "iallreduce after abort returned %d (%s), expected -ECANCELED and no request",
                 ir, coll_strerror(ir));
        rc = rdzv_set(c->store, key, "1", 1);
    } else if (rc == 0) {
        void *v;
        size_t nb;
        set_where("abort part 1: waiting for rank 0 to abort");
        if ((rc = rdzv_get(c->store, key, &v, &nb)) != 0)
            fail(c, "store get %s: %s", key, rdzv_strerror(rc));
        rdzv_free(v);
        set_where("abort part 1: allreduce with an aborted rank 0");
        int64_t t0 = mono_now_ns();
        int ar = rc == 0 ? coll_allreduce(comm, buf, buf, CNT, COLL_F32, COLL_SUM) : 0;
        if (rc == 0)
            expect_named(c, comm, ar, 0, ms_since(t0), tmo + slack,
                         "allreduce after rank 0 aborted", false);
    }
    set_where("abort part 1: destroy");
    coll_comm_close(comm);
    if (store_barrier(c, "abort1", tmo + 30000) != 0 || rc != 0) {
        free(buf);
        return -1;
    }

    /* Part 2: the others are inside an allreduce rank w-1 never issues; rank w-1 aborts once
     * they all said they issued it, and they get an error naming it. */
    int ab = w - 1;
    if (comm_create(c, "/2", tmo, &comm) < 0) {
        free(buf);
        return -1;
    }
    set_where("abort part 2: warm-up allreduce");
    if ((rc = coll_allreduce(comm, buf, buf, CNT, COLL_F32, COLL_SUM)) != 0)
        fail(c, "warm-up allreduce: %s: %s", coll_strerror(rc), coll_last_error(comm));
    if (rc == 0 && r == ab) {
        const char **keys = calloc((size_t)w, sizeof(char *));
        for (int q = 0; q < w - 1; q++) {
            keys[q] = malloc(400);
            snprintf((char *)keys[q], 400, "%s/test/issued/%d", c->prefix, q);
        }
        set_where("abort part 2: waiting for the others to issue");
        if ((rc = rdzv_wait(c->store, keys, (size_t)w - 1, tmo)) != 0)
            fail(c, "store wait: %s", rdzv_strerror(rc));
        for (int q = 0; q < w - 1; q++)
            free((void *)keys[q]);
        free(keys);
        coll_comm_abort(comm);
    } else if (rc == 0) {
        coll_request *q;
        set_where("abort part 2: allreduce rank %d aborts", ab);
        int64_t t0 = mono_now_ns();
        rc = coll_iallreduce(comm, buf, buf, CNT, COLL_F32, COLL_SUM, &q);
        if (rc == 0) {
            snprintf(key, sizeof(key), "%s/test/issued/%d", c->prefix, r);
            rdzv_set(c->store, key, "1", 1);
            rdzv_ping(c->store);
            int ar = coll_wait(q);
            expect_named(c, comm, ar, ab, ms_since(t0), tmo + slack,
                         "allreduce while its peer aborted", false);
        } else {
            fail(c, "iallreduce: %s", coll_strerror(rc));
        }
    }
    set_where("abort part 2: destroy");
    coll_comm_close(comm);
    store_barrier(c, "abort2", tmo + 30000);
    free(buf);
    return rc;
}

static int scen_timeout(ctx *c)
{
    int w = c->world, r = c->rank, sk = c->skipper >= 0 ? c->skipper : w - 1;
    if (w < 2) {
        note(c, "timeout needs 2 ranks or more: skipped");
        return 0;
    }
    int tmo = effective_timeout(c, 3000);
    coll_comm *comm;
    if (comm_create(c, "", tmo, &comm) < 0)
        return -1;
    enum { CNT = 1009 };
    float buf[CNT] = {0};
    set_where("timeout: warm-up allreduce");
    int rc = coll_allreduce(comm, buf, buf, CNT, COLL_F32, COLL_SUM);
    if (rc != 0)
        fail(c, "warm-up allreduce: %s: %s", coll_strerror(rc), coll_last_error(comm));
    if (rc == 0 && r != sk) {
        set_where("timeout: allreduce rank %d skips", sk);
        int64_t t0 = mono_now_ns();
        int ar = coll_allreduce(comm, buf, buf, CNT, COLL_F32, COLL_SUM);
        double ms = ms_since(t0);
        expect_named(c, comm, ar, sk, ms, tmo * 1.5 + 2000, "allreduce rank skipped", true);
        if (ms < tmo * 0.9)
            fail(c, "timed out after %.0f ms, before the %d ms timeout", ms, tmo);
    } else if (rc == 0) {
        note(c, "skipping the allreduce");
    }
    /* The skipper stays until the others have their answer. */
    store_barrier(c, "timeout", tmo * 3 + 30000);
    set_where("timeout: destroy");
    coll_comm_close(comm);

    /* coll_comm_init without the skipper: -ETIMEDOUT, and coll_last_error(NULL) names it. */
    if (r != sk) {
        coll_options o;
        coll_options_init(&o);
        o.timeout_ms = tmo;
        o.bind_addr = c->bind_addr;
        char prefix[320];
        snprintf(prefix, sizeof(prefix), "%s/init", c->prefix);
        set_where("timeout: coll_comm_init without rank %d", sk);
        coll_comm *m = (coll_comm *)&o;
        int64_t t0 = mono_now_ns();
        int ir = coll_comm_init(c->store, prefix, r, w, c->backend, -1, &o, &m);
        double ms = ms_since(t0);
        const char *le = coll_last_error(NULL);
        c->checks++;
        if (ir != -ETIMEDOUT || m != (coll_comm *)&o || !names_rank(le, sk) ||
            ms > tmo * 1.5 + 2000)
            fail(c,
                 "coll_comm_init without rank %d: expected -ETIMEDOUT naming it within %.0f "
                 "ms; got %d (%s) after %.0f ms, last error \"%s\"",
                 sk, tmo * 1.5 + 2000, ir, coll_strerror(ir), ms, le);
        else
            note(c, "coll_comm_init without rank %d: %s after %.0f ms: \"%s\"", sk,
                 coll_strerror(ir), ms, le);
        if (ir == 0)
            coll_comm_close(m);
    }
    store_barrier(c, "timeout-init", tmo * 3 + 30000);
    return rc;
}

static int scen_kill(ctx *c)
{
    int w = c->world, r = c->rank, victim = c->victim >= 0 ? c->victim : w - 1;
    if (w < 2 || victim >= w) {
        note(c, "kill needs 2 ranks or more and a victim among them: skipped");
        return 0;
    }
    int tmo = effective_timeout(c, 20000);
    if (r != victim)
        signal(SIGTERM, SIG_IGN); /* ddprun's teardown must not stop us before we report */
    coll_comm *comm;
    if (comm_create(c, "", tmo, &comm) < 0)
        return -1;
    size_t n = (c->big_mib << 20) / 4;
    float *buf = calloc(n, sizeof(float));
    set_where("kill: warm-up allreduce");
    int rc = coll_allreduce(comm, buf, buf, 4099, COLL_F32, COLL_SUM);
    if (rc != 0) {
        fail(c, "warm-up allreduce: %s: %s", coll_strerror(rc), coll_last_error(comm));
        free(buf);
        return rc;
    }
    /*
     * A stream of large allreduces: the victim queues them all, lets them run for 30 ms and
     * dies, in the middle of one of them whatever the speed of the machine; the survivors run
     * them one by one until one fails.
     */
    enum { NOPS = 64 };
    if (r == victim) {
        coll_request *q[NOPS];
        int issued = 0;
        for (; issued < NOPS; issued++)
            if (coll_iallreduce(comm, buf, buf, n, COLL_F32, COLL_SUM, &q[issued]) != 0)
                break;
        struct timespec ts = {0, 30 * 1000000};
        nanosleep(&ts, NULL);
        int done = 0;
        for (int i = 0; i < issued; i++) {
            bool d = false;
            coll_test(q[i], &d);
            done += d;
        }
        note(c, "issued the allreduce (%d of %d queued, %d done after 30 ms), now SIGKILL", issued,
             NOPS, done);
        raise(SIGKILL);
    }
    int ar = 0, i = 0;
    double ms = 0;
    for (; i < NOPS && ar == 0; i++) {
        set_where("kill: allreduce %d while rank %d dies", i, victim);
        int64_t t0 = mono_now_ns();
        ar = coll_allreduce(comm, buf, buf, n, COLL_F32, COLL_SUM);
        ms = ms_since(t0);
    }
    if (ar != 0)
        note(c, "allreduce %d of the stream failed", i - 1);
    expect_named(c, comm, ar, victim, ms, tmo, "allreduce while a rank is killed", false);
    fflush(stdout);
    free(buf);
    set_where("kill: destroy");
    coll_comm_close(comm);
    return 0;
}

/* -EINVAL for bad arguments, with nothing queued (a valid allreduce afterwards still works). */
static int scen_args(ctx *c)
{
    int w = c->world;
    coll_comm *comm;
    if (comm_create(c, "", effective_timeout(c, 60000), &comm) < 0)
        return -1;
    float buf[64] = {0}, out[64 * 8];
    coll_request *const SENT = (coll_request *)(uintptr_t)0x1234;
    coll_request *q;
#define EXPECT_EINVAL(call, what)                                                                  \
    do {                                                                                           \
        q = SENT;                                                                                  \
        int rc_ = (call);                                                                          \
        c->checks++;                                                                               \
        if (rc_ != -EINVAL || q != SENT)                                                           \
            fail(c, "%s: returned %d (%s)%s, expected -EINVAL", what, rc_, coll_strerror(rc_),     \
                 q != SENT ? " and wrote the request" : "");                                       \
    } while (0)
    coll_dtype bad_dt[] = {COLL_DTYPE_COUNT, (coll_dtype)-1, (coll_dtype)100};
    coll_op bad_op[] = {COLL_OP_COUNT, (coll_op)-1};
    int bad_peer[] = {-1, w, w + 5};
    set_where("args: bad dtypes");
    for (size_t i = 0; i < 3; i++) {
        coll_dtype d = bad_dt[i];
        EXPECT_EINVAL(coll_iallreduce(comm, buf, buf, 4, d, COLL_SUM, &q), "iallreduce bad dtype");
        EXPECT_EINVAL(coll_ireduce(comm, buf, buf, 4, d, COLL_SUM, 0, &q), "ireduce bad dtype");
        EXPECT_EINVAL(coll_ibroadcast(comm, buf, buf, 4, d, 0, &q), "ibroadcast bad dtype");
        EXPECT_EINVAL(coll_iallgather(comm, buf, out, 4, d, &q), "iallgather bad dtype");
        EXPECT_EINVAL(coll_ireduce_scatter(comm, out, buf, 4, d, COLL_SUM, &q),
                      "ireduce_scatter bad dtype");
        EXPECT_EINVAL(coll_isend(comm, buf, 4, d, 0, &q), "isend bad dtype");
        EXPECT_EINVAL(coll_irecv(comm, buf, 4, d, 0, &q), "irecv bad dtype");
        EXPECT_EINVAL(coll_allreduce(comm, buf, buf, 4, d, COLL_SUM), "allreduce bad dtype");
        c->checks++;
        if (coll_dtype_size(d) != 0 || strcmp(coll_dtype_name(d), "?") != 0)
            fail(c, "coll_dtype_size/name of invalid dtype %d: %zu \"%s\"", (int)d,
                 coll_dtype_size(d), coll_dtype_name(d));
    }
    set_where("args: bad ops");
    for (size_t i = 0; i < 2; i++) {
        coll_op o = bad_op[i];
        EXPECT_EINVAL(coll_iallreduce(comm, buf, buf, 4, COLL_F32, o, &q), "iallreduce bad op");
        EXPECT_EINVAL(coll_ireduce(comm, buf, buf, 4, COLL_F32, o, 0, &q), "ireduce bad op");
        EXPECT_EINVAL(coll_ireduce_scatter(comm, out, buf, 4, COLL_F32, o, &q),
                      "ireduce_scatter bad op");
        EXPECT_EINVAL(coll_reduce(comm, buf, buf, 4, COLL_F32, o, 0), "reduce bad op");
        c->checks++;
        if (strcmp(coll_op_name(o), "?") != 0)
            fail(c, "coll_op_name of invalid op: \"%s\"", coll_op_name(o));
    }
    set_where("args: bad roots and peers");
    for (size_t i = 0; i < 3; i++) {
        int p = bad_peer[i];
        EXPECT_EINVAL(coll_ireduce(comm, buf, buf, 4, COLL_F32, COLL_SUM, p, &q),
                      "ireduce bad root");
        EXPECT_EINVAL(coll_ibroadcast(comm, buf, buf, 4, COLL_F32, p, &q), "ibroadcast bad root");
        EXPECT_EINVAL(coll_broadcast(comm, buf, buf, 4, COLL_F32, p), "broadcast bad root");
        EXPECT_EINVAL(coll_isend(comm, buf, 4, COLL_F32, p, &q), "isend bad peer");
        EXPECT_EINVAL(coll_irecv(comm, buf, 4, COLL_F32, p, &q), "irecv bad peer");
        EXPECT_EINVAL(coll_send(comm, buf, 4, COLL_F32, p), "send bad peer");
    }
    set_where("args: NULL arguments");
    EXPECT_EINVAL(coll_iallreduce(NULL, buf, buf, 4, COLL_F32, COLL_SUM, &q), "NULL comm");
    EXPECT_EINVAL(coll_ibarrier(NULL, &q), "ibarrier NULL comm");
    q = SENT;
    int nr = coll_iallreduce(comm, buf, buf, 4, COLL_F32, COLL_SUM, NULL);
    c->checks++;
    if (nr != -EINVAL)
        fail(c, "iallreduce with NULL request: %d (%s), expected -EINVAL", nr, coll_strerror(nr));
    EXPECT_EINVAL(coll_iallreduce(comm, NULL, buf, 4, COLL_F32, COLL_SUM, &q),
                  "iallreduce NULL sendbuf, count 4");
    EXPECT_EINVAL(coll_iallreduce(comm, buf, NULL, 4, COLL_F32, COLL_SUM, &q),
                  "iallreduce NULL recvbuf, count 4");
    EXPECT_EINVAL(coll_iallgather(comm, buf, NULL, 4, COLL_F32, &q),
                  "iallgather NULL recvbuf, count 4");
    c->checks++;
    bool d;
    if (coll_test(NULL, &d) != -EINVAL)
        fail(c, "coll_test(NULL) is not -EINVAL");
    c->checks++;
    if (coll_wait(NULL) != -EINVAL)
        fail(c, "coll_wait(NULL) is not -EINVAL");

    /* coll_comm_init's own checks (no store traffic expected). */
    set_where("args: coll_comm_init");
    coll_comm *bad = (coll_comm *)SENT;
    struct {
        rdzv_client *s;
        const char *p;
        int rank, world;
        coll_backend b;
        coll_comm **out;
        const char *what;
    } inits[] = {
        {NULL, "x", 0, 1, COLL_BACKEND_CPU, &bad, "NULL store"},
        {c->store, NULL, 0, 1, COLL_BACKEND_CPU, &bad, "NULL prefix"},
        {c->store, "x", -1, 1, COLL_BACKEND_CPU, &bad, "rank -1"},
        {c->store, "x", 1, 1, COLL_BACKEND_CPU, &bad, "rank == world"},
        {c->store, "x", 0, 0, COLL_BACKEND_CPU, &bad, "world 0"},
        {c->store, "x", 0, 1, (coll_backend)42, &bad, "backend 42"},
        {c->store, "x", 0, 1, COLL_BACKEND_CPU, NULL, "NULL out"},
    };
    for (size_t i = 0; i < sizeof(inits) / sizeof(inits[0]); i++) {
        int ir = coll_comm_init(inits[i].s, inits[i].p, inits[i].rank, inits[i].world, inits[i].b,
                                -1, NULL, inits[i].out);
        c->checks++;
        if (ir != -EINVAL || bad != (coll_comm *)SENT || !*coll_last_error(NULL))
            fail(c, "coll_comm_init with %s: %d (%s), last error \"%s\"%s", inits[i].what, ir,
                 coll_strerror(ir), coll_last_error(NULL),
                 bad != (coll_comm *)SENT ? ", and *out written" : "");
    }
    if (!coll_have_nccl()) {
        int ir = coll_comm_init(c->store, "x/nccl", 0, 1, COLL_BACKEND_NCCL, 0, NULL, &bad);
        c->checks++;
        if (ir != -ENOTSUP || bad != (coll_comm *)SENT)
            fail(c, "coll_comm_init(nccl) without NCCL: %d (%s), expected -ENOTSUP", ir,
                 coll_strerror(ir));
    }

    /* Names, sizes, parsing. */
    static const size_t sizes[COLL_DTYPE_COUNT] = {4, 8, 2, 2, 4, 8, 1};
    for (int i = 0; i < COLL_DTYPE_COUNT; i++) {
        coll_dtype back = COLL_DTYPE_COUNT;
        c->checks++;
        if (coll_dtype_size((coll_dtype)i) != sizes[i] ||
            coll_dtype_parse(coll_dtype_name((coll_dtype)i), &back) != 0 || (int)back != i)
            fail(c, "dtype %d: size %zu, name \"%s\" parses back to %d", i,
                 coll_dtype_size((coll_dtype)i), coll_dtype_name((coll_dtype)i), (int)back);
    }
    for (int i = 0; i < COLL_OP_COUNT; i++) {
        coll_op back = COLL_OP_COUNT;
        c->checks++;
        if (coll_op_parse(coll_op_name((coll_op)i), &back) != 0 || (int)back != i)
            fail(c, "op %d: name \"%s\" parses back to %d", i, coll_op_name((coll_op)i), (int)back);
    }
    coll_dtype dd;
    coll_op oo;
    coll_backend bb;
    c->checks++;
    if (coll_dtype_parse("f17", &dd) != -EINVAL || coll_op_parse("mean", &oo) != -EINVAL ||
        coll_backend_parse("gloo", &bb) != -EINVAL ||
        coll_backend_parse(coll_backend_name(COLL_BACKEND_CPU), &bb) != 0 || bb != COLL_BACKEND_CPU)
        fail(c, "parsing unknown names, or the cpu backend's name");
    int codes[] = {COLL_ENCCL, COLL_ECUDA, COLL_EREMOTE, -ETIMEDOUT, -ECANCELED, 0, -99999, 5};
    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
        c->checks++;
        if (!coll_strerror(codes[i]) || !*coll_strerror(codes[i]))
            fail(c, "coll_strerror(%d) is empty", codes[i]);
    }

    /* Nothing was queued: every rank still issues the same sequence. */
    set_where("args: allreduce after the bad calls");
    int32_t v[7];
    for (int i = 0; i < 7; i++)
        v[i] = c->rank + i;
    int rc = coll_allreduce(comm, v, v, 7, COLL_I32, COLL_SUM);
    c->checks++;
    if (rc != 0) {
        fail(c, "allreduce after the invalid calls: %s: %s", coll_strerror(rc),
             coll_last_error(comm));
    } else {
        for (int i = 0; i < 7; i++)
            if (v[i] != w * (w - 1) / 2 + w * i) {
                fail(c, "allreduce after the invalid calls: index %d: got %d expected %d", i, v[i],
                     w * (w - 1) / 2 + w * i);
                break;
            }
    }
    /* coll_test with a NULL done flag on a real request. */
    if (rc == 0) {
        rc = coll_ibarrier(comm, &q);
        if (rc == 0) {
            int tr = coll_test(q, NULL);
            c->checks++;
            if (tr != -EINVAL)
                fail(c, "coll_test(req, NULL): %d (%s), expected -EINVAL", tr, coll_strerror(tr));
            rc = coll_wait(q);
        }
        if (rc != 0)
            fail(c, "barrier: %s", coll_strerror(rc));
    }
#undef EXPECT_EINVAL
    coll_comm_close(comm);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Main                                                                                        */
/* ------------------------------------------------------------------------------------------ */

static const struct {
    const char *name;
    int (*fn)(ctx *);
} scenarios[] = {
    {"ops", scen_ops},     {"big", scen_big},         {"inflight", scen_inflight},
    {"split", scen_split}, {"p2p", scen_p2p},         {"barrier", scen_barrier},
    {"abort", scen_abort}, {"timeout", scen_timeout}, {"kill", scen_kill},
    {"args", scen_args},   {"algos", scen_algos},
};

enum {
    O_BACKEND = 256,
    O_TIMEOUT,
    O_VICTIM,
    O_SKIPPER,
    O_SEED,
    O_QUICK,
    O_CHUNK,
    O_SMALL,
    O_BIND,
    O_HOSTS,
    O_BIG,
    O_WATCHDOG,
    O_VERBOSE,
    O_HELP
};

/* The options (cli.h): getopt_long's tables and the usage text are both made from it. */
static const cli_option options[] = {
    {O_BACKEND, {"--backend"}, "NAME", NULL, 0, "cpu (default), nccl or auto"},
    {O_TIMEOUT, {"--timeout-ms"}, "N", NULL, 0, "communicator timeout (default per scenario)"},
    {O_VICTIM, {"--victim"}, "R", NULL, 0, "kill: the rank that dies (default: the last)"},
    {O_SKIPPER, {"--skipper"}, "R", NULL, 0, "timeout: the rank that skips (default: the last)"},
    {O_SEED, {"--seed"}, "N", NULL, 0, "input seed (default 1)"},
    {O_QUICK, {"--quick"}, NULL, NULL, 0, "ops: fewer counts and roots"},
    {O_CHUNK, {"--chunk-bytes"}, "N", NULL, 0, "coll_options.chunk_bytes"},
    {O_SMALL, {"--small-bytes"}, "N", NULL, 0, "coll_options.small_bytes"},
    {O_BIND, {"--bind-addr"}, "ADDR", NULL, 0, "coll_options.bind_addr"},
    {O_HOSTS, {"--expect-hosts"}, "N", NULL, 0, "fail unless the communicator sees N hosts"},
    {O_BIG, {"--big-mib"}, "N", NULL, 0, "size of the big and kill buffers (default 64)"},
    {O_WATCHDOG, {"--watchdog-s"}, "N", NULL, 0, "exit 3 after N s without progress (default 300)"},
    {O_VERBOSE, {"--verbose"}, NULL, NULL, 0, ""},
    {O_HELP, {"--help"}, NULL, NULL, 0, "this help"},
};
#define NOPTIONS (sizeof(options) / sizeof(options[0]))

static void usage(FILE *f)
{
    fprintf(f, "usage: coll-check [options] SCENARIO...   (run under ddprun)\n"
               "scenarios: ops big inflight split p2p barrier abort timeout kill args\n");
    for (size_t i = 0; i < NOPTIONS; i++)
        cli_print_option(f, &options[i], NULL, 22, CLI_HELP_WIDTH);
}

/* Reads the value of option `opt` into c; 0, or -1 with the message printed. */
static int set_option(ctx *c, int opt, const char *val)
{
    const char *flag = cli_long_name(cli_by_id(options, NOPTIONS, opt));
    long v;
    int rc = 0;
    switch (opt) {
    case O_BACKEND:
        if (coll_backend_parse(val, &c->backend) != 0) {
            fprintf(stderr, "coll-check: unknown backend %s\n", val);
            return -1;
        }
        break;
    case O_TIMEOUT:
        rc = cli_parse_int(flag, val, -1, INT_MAX, &c->timeout_ms);
        break;
    case O_VICTIM:
        rc = cli_parse_int(flag, val, -1, INT_MAX, &c->victim);
        break;
    case O_SKIPPER:
        rc = cli_parse_int(flag, val, -1, INT_MAX, &c->skipper);
        break;
    case O_SEED:
        rc = cli_parse_long(flag, val, 0, LONG_MAX, &v);
        if (rc == 0)
            c->seed = (uint64_t)v;
        break;
    case O_QUICK:
        c->quick = true;
        break;
    case O_CHUNK:
        rc = cli_parse_size(flag, val, 0, SIZE_MAX, &c->chunk_bytes);
        break;
    case O_SMALL:
        rc = cli_parse_size(flag, val, 0, SIZE_MAX, &c->small_bytes);
        break;
    case O_BIND:
        c->bind_addr = val;
        break;
    case O_HOSTS:
        rc = cli_parse_int(flag, val, -1, INT_MAX, &c->expect_hosts);
        break;
    case O_BIG:
        rc = cli_parse_long(flag, val, 1, 1 << 20, &v);
        if (rc == 0)
            c->big_mib = (size_t)v;
        break;
    case O_WATCHDOG:
        rc = cli_parse_int(flag, val, 1, INT_MAX, &c->watchdog_s);
        break;
    case O_VERBOSE:
        c->verbose = true;
        break;
    }
    return cli_report(stderr, "coll-check", rc) < 0 ? -1 : 0;
}

int main(int argc, char **argv)
{
    ctx c = {.backend = COLL_BACKEND_CPU,
             .timeout_ms = -1,
             .victim = -1,
             .skipper = -1,
             .seed = 1,
             .expect_hosts = -1,
             .big_mib = 64,
             .watchdog_s = 300};
    cli_getopt_tables g;
    int built = cli_getopt_build(&g, options, NOPTIONS);
    assert(built == 0); /* the table above is well-formed */
    (void)built;
    int opt;
    /* No short options; getopt_long reports unknown options and missing values itself. */
    while ((opt = getopt_long(argc, argv, "", g.longopts, NULL)) != -1) {
        if (opt == O_HELP) {
            usage(stdout);
            return 0;
        }
        if (opt < 256) { /* '?': getopt_long named the unknown option or missing value */
            usage(stderr);
            return 2;
        }
        if (set_option(&c, opt, optarg) < 0)
            return 2;
    }
    if (optind >= argc) {
        usage(stderr);
        return 2;
    }
    for (int i = optind; i < argc; i++) {
        bool known = false;
        for (size_t k = 0; k < sizeof(scenarios) / sizeof(scenarios[0]); k++)
            known |= strcmp(argv[i], scenarios[k].name) == 0;
        if (!known) {
            fprintf(stderr, "coll-check: unknown scenario %s\n", argv[i]);
            return 2;
        }
    }
    g_watchdog_s = c.watchdog_s;
    set_where("joining the job");
    pthread_t wd;
    pthread_create(&wd, NULL, watchdog, NULL);
    pthread_detach(wd);

    /* The store only: each scenario makes its communicators under the attempt's key prefix,
     * "coll-check/<run id>/<restart count>", then "/<scenario>". */
    rdzv_client_options so;
    rdzv_client_options_init(&so);
    so.timeout_ms = 600000;
    coll_env_options eo;
    coll_env_options_init(&eo);
    eo.name = "coll-check";
    eo.store = &so;
    eo.store_only = true;
    coll_env job;
    int rc = coll_comm_init_env(&eo, &job);
    if (rc < 0) {
        /* The sentence names the variable at fault (or says none is set), or the store. */
        fprintf(stderr, "coll-check: %s\n", coll_last_error(NULL));
        return 2;
    }
    c.rank = g_rank = job.env.rank;
    c.world = job.env.world_size;
    c.local_rank = job.env.local_rank;
    c.local_world = job.env.local_world_size;
    c.attempt = job.prefix;
    c.store = job.store;
    int status = 0;
    for (int i = optind; i < argc; i++) {
        c.scenario = argv[i];
        snprintf(c.prefix, sizeof(c.prefix), "%s/%s", c.attempt, c.scenario);
        c.checks = c.failures = c.reports = 0;
        memset(c.max_ratio, 0, sizeof(c.max_ratio));
        int64_t t0 = mono_now_ns();
        for (size_t k = 0; k < sizeof(scenarios) / sizeof(scenarios[0]); k++)
            if (strcmp(c.scenario, scenarios[k].name) == 0)
                rc = scenarios[k].fn(&c);
        double s = ms_since(t0) / 1000;
        char ratios[256] = "";
        size_t off = 0;
        for (int d = 0; d < COLL_DTYPE_COUNT; d++)
            if (is_float((coll_dtype)d) && c.max_ratio[d] > 0)
                off += (size_t)snprintf(ratios + off, sizeof(ratios) - off, " %s %.3f",
                                        coll_dtype_name((coll_dtype)d), c.max_ratio[d]);
        bool ok = rc == 0 && c.failures == 0;
        printf("coll-check: rank %d/%d %s: %s (%ld checks, %ld failed, %.2f s%s%s)\n", c.rank,
               c.world, c.scenario, ok ? "PASS" : "FAIL", c.checks, c.failures, s,
               *ratios ? "; max error/bound:" : "", ratios);
        fflush(stdout);
        if (!ok) {
            status = 1;
            break; /* the other ranks' sequence no longer matches ours */
        }
    }
    coll_env_free(&job);
    return status;
}
