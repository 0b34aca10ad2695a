/*
 * coll-bench: libcollective's performance and correctness across the ranks of a job, in the
 * style of nccl-tests (algbw/busbw tables).
 *
 *     ddprun --nproc-per-node 4 coll-bench allreduce -b 8 -e 64M -f 2 -d f32 [--json FILE]
 *
 * Every rank joins the job with coll_comm_init_env(), store only: it reads the torchrun
 * environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID,
 * TORCHELASTIC_RESTART_COUNT) and connects to the launcher's store; without that environment it
 * runs alone, one rank on a store of its own. It then picks the device from LOCAL_RANK and
 * creates one communicator under the prefix "coll-bench/<run id>/<restart count>". For each size
 * from -b to -e it runs -w warm-up operations, a barrier, then times -n operations (by default
 * all issued with the i-form and then waited for, as nccl-tests enqueues them; -z 1 waits for
 * each), then (-c 1) runs one more operation on a known pattern and counts the elements that differ
 * from the expected result. Rank 0 prints one row per size: size in bytes, count in elements,
 * dtype, reduction, root, time per operation in microseconds, algbw = size / time and busbw = algbw
 * x nccl-tests' bus factor (allreduce 2(n-1)/n, allgather and reduce_scatter (n-1)/n, broadcast and
 * reduce 1), and the number of wrong elements over all ranks.
 *
 * Sizes, as in nccl-tests: for allgather and reduce_scatter the size is the whole gathered or
 * scattered buffer (count x n elements, count per rank), rounded down to a multiple of
 * n x the element size; for the others it is the buffer of every rank.
 *
 * The per-rank timings and wrong counts travel through the store, not through the
 * communicator under test, so a broken collective cannot misreport itself; the same store
 * carries each rank's pid, host and device for the header.
 *
 * What it deliberately does not do: time the check, time allocations or page faults (buffers
 * are allocated once at the largest size and written before the first operation), or run
 * under `meson test`. The check pattern is small integers (0..3, or 1..2 for prod) so that
 * sums and products are exact in every dtype for the rank counts one host has; AVG results are
 * compared with a tolerance of a few units in the last place instead.
 */
#include <assert.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "cli.h"
#include "coll.h"
#include "monoclock.h"
#include "rdzv.h"
#include "version.h"

#ifdef COLL_BENCH_CUDA
#include <cuda_runtime.h>
#endif

/* Exit status, as documented in --help and coll-bench(1). */
enum {
    EXIT_OK = 0,
    EXIT_WRONG = 1, /* some element differed from the expected result */
    EXIT_USAGE = 2, /* bad option or argument */
    EXIT_SETUP = 3, /* environment, store, communicator or memory */
    EXIT_COLL = 4,  /* a collective (or the store between sizes) failed */
};

/* ---------------------------------------------------------------------------------------- */
/* Options                                                                                  */
/* ---------------------------------------------------------------------------------------- */

enum coll_kind { K_ALLREDUCE, K_REDUCE_SCATTER, K_ALLGATHER, K_BROADCAST, K_REDUCE, K_COUNT };
static const char *const kind_names[K_COUNT] = {"allreduce", "reduce_scatter", "allgather",
                                                "broadcast", "reduce"};

typedef struct bench_args {
    enum coll_kind kind;
    size_t minbytes, maxbytes, stepbytes, iter_bytes;
    long factor;
    int iters, warmup;
    coll_dtype dtype;
    coll_op op;
    int root;
    int check;   /* 0 or 1 */
    int average; /* 0 rank 0, 1 mean, 2 min, 3 max of the ranks' mean times */
    int blocking;
    bool inplace;
    coll_backend backend;
    size_t chunk_bytes, small_bytes;
    int timeout_ms;
    const char *json;
} bench_args;

/* Long-only options. */
enum { OPT_JSON = 256, OPT_SMALL, OPT_ITER_BYTES, OPT_TIMEOUT, OPT_VERSION };

/* The one option table: getopt_long's tables and --help are both made from it (cli.h). */
static const cli_option opt_table[] = {
    {'b', {"-b", "--minbytes"}, "BYTES", "8", 0, "Smallest size, with K, M or G (powers of 1024)."},
    {'e', {"-e", "--maxbytes"}, "BYTES", "64M", 0, "Largest size."},
    {'f',
     {"-f", "--stepfactor"},
     "F",
     "2",
     0,
     "Multiply the size by F from one row to the next; 1 uses --stepbytes instead."},
    {'i',
     {"-i", "--stepbytes"},
     "BYTES",
     "1M",
     0,
     "Add BYTES from one row to the next when --stepfactor is 1."},
    {'n', {"-n", "--iters"}, "N", "100", 0, "Timed operations per size."},
    {OPT_ITER_BYTES,
     {"--iter-bytes"},
     "BYTES",
     "1G",
     0,
     "Where N operations of a size would move more than BYTES, run BYTES/size of them (at "
     "least 5); 0: always N."},
    {'w',
     {"-w", "--warmup-iters"},
     "N",
     "5",
     0,
     "Untimed operations per size before the timed ones."},
    {'d', {"-d", "--datatype"}, "TYPE", "f32", 0, "f32, f64, f16, bf16, i32, i64 or u8."},
    {'o', {"-o", "--op"}, "OP", "sum", 0, "Reduction: sum, avg, max, min or prod."},
    {'r', {"-r", "--root"}, "RANK", "0", 0, "Root of broadcast and reduce."},
    {'c',
     {"-c", "--check"},
     "0|1",
     "1",
     0,
     "Check the result of one extra operation per size and count the wrong elements."},
    {'a',
     {"-a", "--average"},
     "0|1|2|3",
     "1",
     0,
     "Time reported: rank 0's mean (0), the mean (1), the minimum (2) or the maximum (3) over "
     "ranks of each rank's mean."},
    {'z',
     {"-z", "--blocking"},
     "0|1",
     "0",
     0,
     "1: wait for each operation before issuing the next; 0: issue all N, then wait for them."},
    {'I',
     {"-I", "--inplace"},
     NULL,
     NULL,
     0,
     "Run in place (recvbuf == sendbuf, or the rank's block of it)."},
    {'B',
     {"-B", "--backend"},
     "NAME",
     "auto",
     0,
     "auto, cpu or nccl; nccl uses device LOCAL_RANK."},
    {'C',
     {"-C", "--chunk-bytes"},
     "BYTES",
     "0",
     0,
     "cpu backend: pipeline chunk per rank; 0: the library's default."},
    {OPT_SMALL,
     {"--small-bytes"},
     "BYTES",
     "0",
     0,
     "cpu backend: largest message for the latency-optimised algorithm; 0: the library's "
     "default."},
    {OPT_TIMEOUT,
     {"--timeout-ms"},
     "MS",
     "600000",
     0,
     "Bound on the communicator's set-up and on each operation; -1: none."},
    {OPT_JSON, {"--json"}, "FILE", NULL, 0, "Rank 0 also writes the rows to FILE as a JSON array."},
    {'h', {"-h", "--help"}, NULL, NULL, 0, "Show this help and exit."},
    {OPT_VERSION, {"--version"}, NULL, NULL, 0, "Show the version and exit."},
};
#define NOPTS (sizeof(opt_table) / sizeof(opt_table[0]))

static void usage(FILE *f)
{
    fprintf(f, "usage: coll-bench COLLECTIVE [OPTIONS]\n"
               "       ddprun --nproc-per-node N coll-bench COLLECTIVE [OPTIONS]\n\n");
    cli_print_wrapped(f,
                      "Times one collective of libcollective over a range of sizes on every rank "
                      "of a ddprun or torchrun job, like nccl-tests: rank 0 prints size, count, "
                      "type, reduction, root, time (us), algbw and busbw (GB/s, 1e9 bytes) and "
                      "the number of wrong elements. Without RANK and WORLD_SIZE in the "
                      "environment it runs as a single rank.",
                      0);
    fprintf(f, "\ncollectives: allreduce, reduce_scatter, allgather, broadcast, reduce\n"
               "\noptions:\n");
    cli_print_options(f, opt_table, NOPTS, 0, CLI_HELP_WIDTH);
    fprintf(f, "\nexit status: 0 done and every checked element right; 1 wrong elements; 2 bad "
               "usage;\n3 environment, store, communicator or memory failure; 4 a collective "
               "failed.\n");
}

/* Prints "coll-bench: <message>" to stderr. */
#define err(...) cli_msg(stderr, "coll-bench", __VA_ARGS__)

/* "-b/--minbytes", the option's spellings, for messages. */
static const char *flag_name(int key, char *buf, size_t len)
{
    const cli_option *o = cli_by_id(opt_table, NOPTS, key);
    return o ? cli_label(o, buf, len) : "?";
}

/* allreduce, all_reduce, all-reduce, AllReduce all name the same collective. */
static int parse_kind(const char *s, enum coll_kind *out)
{
    char norm[32];
    size_t k = 0;
    for (const char *p = s; *p && k + 1 < sizeof(norm); p++)
        if (*p != '_' && *p != '-')
            norm[k++] = (char)(*p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p);
    norm[k] = '\0';
    for (int i = 0; i < K_COUNT; i++) {
        char want[32];
        size_t j = 0;
        for (const char *p = kind_names[i]; *p; p++)
            if (*p != '_')
                want[j++] = *p;
        want[j] = '\0';
        if (!strcmp(norm, want)) {
            *out = (enum coll_kind)i;
            return 0;
        }
    }
    return -1;
}

/* Returns -1 to exit with EXIT_OK (help, version), 0 to run, or EXIT_USAGE. */
static int parse_args(int argc, char **argv, bench_args *a)
{
    *a = (bench_args){.minbytes = 8,
                      .maxbytes = 64u << 20,
                      .stepbytes = 1u << 20,
                      .iter_bytes = 1u << 30,
                      .factor = 2,
                      .iters = 100,
                      .warmup = 5,
                      .dtype = COLL_F32,
                      .op = COLL_SUM,
                      .check = 1,
                      .average = 1,
                      .backend = COLL_BACKEND_AUTO,
                      .timeout_ms = 600000};
    cli_getopt_tables g; /* shorts starts with ':': a missing value returns ':' */
    int built = cli_getopt_build(&g, opt_table, NOPTS);
    assert(built == 0); /* the table above is well-formed */
    (void)built;

    opterr = 0;
    int c;
    char fb[64];
    while ((c = getopt_long(argc, argv, g.shorts, g.longopts, NULL)) != -1) {
        const char *flag = flag_name(c, fb, sizeof(fb));
        int rc = 0;
        switch (c) {
        case 'b':
            rc = cli_parse_size(flag, optarg, 0, SIZE_MAX, &a->minbytes);
            break;
        case 'e':
            rc = cli_parse_size(flag, optarg, 0, SIZE_MAX, &a->maxbytes);
            break;
        case 'f':
            rc = cli_parse_long(flag, optarg, 1, 1 << 20, &a->factor);
            break;
        case 'i':
            rc = cli_parse_size(flag, optarg, 0, SIZE_MAX, &a->stepbytes);
            break;
        case 'n':
            rc = cli_parse_int(flag, optarg, 1, 1 << 24, &a->iters);
            break;
        case OPT_ITER_BYTES:
            rc = cli_parse_size(flag, optarg, 0, SIZE_MAX, &a->iter_bytes);
            break;
        case 'w':
            rc = cli_parse_int(flag, optarg, 0, 1 << 24, &a->warmup);
            break;
        case 'd':
            if (coll_dtype_parse(optarg, &a->dtype) < 0) {
                err("%s: unknown type '%s' (f32, f64, f16, bf16, i32, i64, u8)", flag, optarg);
                return EXIT_USAGE;
            }
            break;
        case 'o':
            if (coll_op_parse(optarg, &a->op) < 0) {
                err("%s: unknown reduction '%s' (sum, avg, max, min, prod)", flag, optarg);
                return EXIT_USAGE;
            }
            break;
        case 'r':
            rc = cli_parse_int(flag, optarg, 0, INT_MAX, &a->root);
            break;
        case 'c':
            rc = cli_parse_int(flag, optarg, 0, 1, &a->check);
            break;
        case 'a':
            rc = cli_parse_int(flag, optarg, 0, 3, &a->average);
            break;
        case 'z':
            rc = cli_parse_int(flag, optarg, 0, 1, &a->blocking);
            break;
        case 'I':
            a->inplace = true;
            break;
        case 'B':
            if (coll_backend_parse(optarg, &a->backend) < 0) {
                err("%s: unknown backend '%s' (auto, cpu, nccl)", flag, optarg);
                return EXIT_USAGE;
            }
            break;
        case 'C':
            rc = cli_parse_size(flag, optarg, 0, SIZE_MAX, &a->chunk_bytes);
            break;
        case OPT_SMALL:
            rc = cli_parse_size(flag, optarg, 0, SIZE_MAX, &a->small_bytes);
            break;
        case OPT_TIMEOUT:
            rc = cli_parse_int(flag, optarg, -1, INT_MAX, &a->timeout_ms);
            break;
        case OPT_JSON:
            a->json = optarg;
            break;
        case 'h':
            usage(stdout);
            return -1;
        case OPT_VERSION:
            printf("coll-bench %s\n", DDPRUN_VERSION);
            return -1;
        case ':':
            err("%s needs a value", flag_name(optopt, fb, sizeof(fb)));
            return EXIT_USAGE;
        default:
            if (optopt > 0 && optopt < 256)
                err("unknown option '-%c' (see --help)", optopt);
            else
                err("unknown option '%s' (see --help)", argv[optind - 1]);
            return EXIT_USAGE;
        }
        if (cli_report(stderr, "coll-bench", rc) < 0)
            return EXIT_USAGE;
    }
    if (optind >= argc) {
        err("no collective given (allreduce, reduce_scatter, allgather, broadcast, reduce)");
        usage(stderr);
        return EXIT_USAGE;
    }
    if (optind + 1 < argc) {
        err("one collective at a time; '%s' is extra", argv[optind + 1]);
        return EXIT_USAGE;
    }
    if (parse_kind(argv[optind], &a->kind) < 0) {
        err("unknown collective '%s' (allreduce, reduce_scatter, allgather, broadcast, "
            "reduce)",
            argv[optind]);
        return EXIT_USAGE;
    }
    if (a->maxbytes < a->minbytes) {
        err("-e/--maxbytes: %zu is below -b/--minbytes %zu", a->maxbytes, a->minbytes);
        return EXIT_USAGE;
    }
    if (a->factor == 1 && a->stepbytes == 0 && a->maxbytes > a->minbytes) {
        err("-i/--stepbytes: 0 with -f/--stepfactor 1 never reaches -e/--maxbytes");
        return EXIT_USAGE;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Sizes and figures                                                                        */
/* ---------------------------------------------------------------------------------------- */

static bool is_rooted(enum coll_kind k)
{
    return k == K_BROADCAST || k == K_REDUCE;
}

static bool has_op(enum coll_kind k)
{
    return k != K_BROADCAST && k != K_ALLGATHER;
}

static bool is_split(enum coll_kind k)
{
    return k == K_ALLGATHER || k == K_REDUCE_SCATTER;
}

static double bus_factor(enum coll_kind k, int n)
{
    switch (k) {
    case K_ALLREDUCE:
        return 2.0 * (n - 1) / n;
    case K_REDUCE_SCATTER:
    case K_ALLGATHER:
        return (double)(n - 1) / n;
    default:
        return 1.0;
    }
}

/* Elements per rank for a row of `size` bytes (see the sizes paragraph at the top). */
static size_t per_rank_count(const bench_args *a, size_t size, int n)
{
    size_t ts = coll_dtype_size(a->dtype);
    return is_split(a->kind) ? size / (ts * (size_t)n) : size / ts;
}

static int iters_for(const bench_args *a, size_t nbytes)
{
    if (a->iter_bytes > 0 && nbytes > 0 &&
        (double)a->iters * (double)nbytes > (double)a->iter_bytes) {
        size_t k = a->iter_bytes / nbytes;
        size_t lo = a->iters < 5 ? (size_t)a->iters : 5;
        return (int)(k < lo ? lo : k);
    }
    return a->iters;
}

/* ---------------------------------------------------------------------------------------- */
/* Elements: the check pattern and the conversions it needs                                 */
/* ---------------------------------------------------------------------------------------- */

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023;
    float f;
    if (exp == 0)
        f = ldexpf((float)man, -24); /* zero and subnormals */
    else if (exp == 31)
        f = man ? NAN : INFINITY;
    else
        f = ldexpf((float)(man | 1024), (int)exp - 25);
    return sign ? -f : f;
}

/* Round to nearest even; enough for the pattern's integers and their averages. */
static uint16_t float_to_half(float f)
{
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    f = fabsf(f);
    if (isnan(f))
        return sign | 0x7e00;
    if (f >= 65520.0f)
        return sign | 0x7c00;
    if (f < ldexpf(1.0f, -14)) { /* subnormal: units of 2^-24 */
        float q = nearbyintf(f * ldexpf(1.0f, 24));
        return sign | (uint16_t)q;
    }
    int e;
    float m = frexpf(f, &e);             /* f = m * 2^e, m in [0.5, 1) */
    float q = nearbyintf(ldexpf(m, 11)); /* 11 significant bits */
    if (q >= 2048.0f) {
        q /= 2;
        e++;
    }
    if (e + 14 >= 31)
        return sign | 0x7c00;
    return sign | (uint16_t)((uint32_t)(e + 14) << 10) | (uint16_t)((uint32_t)q - 1024);
}

static float bf16_to_float(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static uint16_t float_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if (isnan(f))
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* Stores x, converted to the element type (integers wrap), at element i of buf. */
static void put(void *buf, coll_dtype t, size_t i, double x)
{
    switch (t) {
    case COLL_F32:
        ((float *)buf)[i] = (float)x;
        break;
    case COLL_F64:
        ((double *)buf)[i] = x;
        break;
    case COLL_F16:
        ((uint16_t *)buf)[i] = float_to_half((float)x);
        break;
    case COLL_BF16:
        ((uint16_t *)buf)[i] = float_to_bf16((float)x);
        break;
    case COLL_I32:
        ((int32_t *)buf)[i] = (int32_t)(uint32_t)(uint64_t)(int64_t)x;
        break;
    case COLL_I64:
        ((int64_t *)buf)[i] = (int64_t)x;
        break;
    case COLL_U8:
        ((uint8_t *)buf)[i] = (uint8_t)(uint64_t)(int64_t)x;
        break;
    default:
        break;
    }
}

static double get(const void *buf, coll_dtype t, size_t i)
{
    switch (t) {
    case COLL_F32:
        return ((const float *)buf)[i];
    case COLL_F64:
        return ((const double *)buf)[i];
    case COLL_F16:
        return half_to_float(((const uint16_t *)buf)[i]);
    case COLL_BF16:
        return bf16_to_float(((const uint16_t *)buf)[i]);
    case COLL_I32:
        return ((const int32_t *)buf)[i];
    case COLL_I64:
        return (double)((const int64_t *)buf)[i];
    case COLL_U8:
        return ((const uint8_t *)buf)[i];
    default:
        return NAN;
    }
}

/* x as the element type would hold it (rounded, overflowed or wrapped). */
static double as_dtype(coll_dtype t, double x)
{
    unsigned char tmp[8];
    put(tmp, t, 0, x);
    return get(tmp, t, 0);
}

/*
 * The value rank r contributes at global element index i: 0..3, or for prod 1 (7 in 8) and 2.
 * gloo_bench.py computes the same.
 */
static int64_t pattern(size_t i, int r, coll_op op)
{
    uint32_t h = ((uint32_t)i * 2654435761u + (uint32_t)(r + 1) * 97u) >> 13;
    if (op == COLL_PROD)
        return 1 + ((h & 7) == 0);
    return h & 3;
}

/* The reduction over all n ranks of pattern(i, ., op), as the element type holds it. */
static double expected_reduce(size_t i, int n, coll_op op, coll_dtype t)
{
    int64_t acc = pattern(i, 0, op);
    for (int r = 1; r < n; r++) {
        int64_t v = pattern(i, r, op);
        switch (op) {
        case COLL_SUM:
        case COLL_AVG:
            acc += v;
            break;
        case COLL_PROD:
            acc = (int64_t)((uint64_t)acc * (uint64_t)v);
            break;
        case COLL_MAX:
            acc = v > acc ? v : acc;
            break;
        case COLL_MIN:
            acc = v < acc ? v : acc;
            break;
        default:
            break;
        }
    }
    if (op == COLL_AVG) {
        bool fp = t == COLL_F32 || t == COLL_F64 || t == COLL_F16 || t == COLL_BF16;
        double sum = as_dtype(t, (double)acc);
        return fp ? as_dtype(t, sum / n) : as_dtype(t, (double)((int64_t)sum / n));
    }
    return as_dtype(t, (double)acc);
}

/* Whether got is the expected element; AVG of floats may differ by rounding. */
static bool matches(double got, double want, coll_op op, coll_dtype t)
{
    if (got == want)
        return true;
    if (op != COLL_AVG || isnan(got))
        return false;
    double tol;
    switch (t) {
    case COLL_F32:
        tol = 4e-7;
        break;
    case COLL_F64:
        tol = 1e-15;
        break;
    case COLL_F16:
        tol = 2e-3;
        break;
    case COLL_BF16:
        tol = 1.6e-2;
        break;
    default:
        return false;
    }
    return fabs(got - want) <= tol * fabs(want) * 2;
}

/* ---------------------------------------------------------------------------------------- */
/* Buffers: host memory, or device memory with host mirrors for the nccl backend           */
/* ---------------------------------------------------------------------------------------- */

typedef struct buffers {
    void *send, *recv;   /* what the collectives get */
    void *hsend, *hrecv; /* host copies for filling and checking (== send, recv on the host) */
    size_t bytes;        /* of each */
    bool device;
} buffers;

static void buffers_free(buffers *b)
{
#ifdef COLL_BENCH_CUDA
    if (b->device) {
        cudaFree(b->send);
        cudaFree(b->recv);
        free(b->hsend);
        free(b->hrecv);
        return;
    }
#endif
    free(b->send);
    free(b->recv);
}

static int buffers_alloc(buffers *b, size_t bytes, bool device)
{
    size_t n = (bytes + 4095) & ~(size_t)4095;
    if (n == 0)
        n = 4096;
    *b = (buffers){.bytes = n, .device = device};
    b->hsend = aligned_alloc(4096, n);
    b->hrecv = aligned_alloc(4096, n);
    if (!b->hsend || !b->hrecv)
        goto fail;
    /* Touch every page now so that no page fault is ever timed. */
    memset(b->hsend, 0, n);
    memset(b->hrecv, 0, n);
    if (!device) {
        b->send = b->hsend;
        b->recv = b->hrecv;
        return 0;
    }
#ifdef COLL_BENCH_CUDA
    if (cudaMalloc(&b->send, n) != cudaSuccess || cudaMalloc(&b->recv, n) != cudaSuccess)
        goto fail;
    if (cudaMemset(b->send, 0, n) != cudaSuccess || cudaMemset(b->recv, 0, n) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess)
        goto fail;
    return 0;
#endif
fail:
    buffers_free(b);
    *b = (buffers){0};
    return -ENOMEM;
}

/*
 * Copies both buffers (`bytes` of each) between the host mirrors and the device: to the device
 * when `up`, back otherwise. A no-op for host buffers.
 */
static int transfer(buffers *b, size_t bytes, bool up)
{
#ifdef COLL_BENCH_CUDA
    if (b->device && bytes > 0) {
        enum cudaMemcpyKind kind = up ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
        if (cudaMemcpy(up ? b->send : b->hsend, up ? b->hsend : b->send, bytes, kind) !=
                cudaSuccess ||
            cudaMemcpy(up ? b->recv : b->hrecv, up ? b->hrecv : b->recv, bytes, kind) !=
                cudaSuccess)
            return COLL_ECUDA;
    }
#else
    (void)b;
    (void)bytes;
    (void)up;
#endif
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* One operation                                                                            */
/* ---------------------------------------------------------------------------------------- */

typedef struct bench {
    bench_args a;
    coll_comm *comm;
    rdzv_client *store;
    char key_prefix[512]; /* for the bench's own store keys */
    int rank, n;
    buffers buf;
} bench;

/* Where this rank's operation reads and writes, given -I, for `per` elements per rank. */
static void op_ptrs(const bench *b, size_t per, void **send, void **recv)
{
    size_t ts = coll_dtype_size(b->a.dtype);
    char *s = b->buf.send, *r = b->buf.recv;
    if (!b->a.inplace) {
        *send = s;
        *recv = r;
        return;
    }
    switch (b->a.kind) {
    case K_ALLGATHER: /* send == recv + rank * count */
        *recv = r;
        *send = r + (size_t)b->rank * per * ts;
        break;
    case K_REDUCE_SCATTER: /* recv == send + rank * count */
        *send = s;
        *recv = s + (size_t)b->rank * per * ts;
        break;
    default:
        *send = r;
        *recv = r;
        break;
    }
}

static int issue(bench *b, size_t per, coll_request **req)
{
    void *s, *r;
    op_ptrs(b, per, &s, &r);
    const bench_args *a = &b->a;
    switch (a->kind) {
    case K_ALLREDUCE:
        return coll_iallreduce(b->comm, s, r, per, a->dtype, a->op, req);
    case K_REDUCE_SCATTER:
        return coll_ireduce_scatter(b->comm, s, r, per, a->dtype, a->op, req);
    case K_ALLGATHER:
        return coll_iallgather(b->comm, s, r, per, a->dtype, req);
    case K_BROADCAST:
        return coll_ibroadcast(b->comm, s, r, per, a->dtype, a->root, req);
    case K_REDUCE:
        return coll_ireduce(b->comm, s, r, per, a->dtype, a->op, a->root, req);
    default:
        return -EINVAL;
    }
}

static int run_one(bench *b, size_t per)
{
    coll_request *req;
    int rc = issue(b, per, &req);
    return rc < 0 ? rc : coll_wait(req);
}

/* `iters` operations, blocking or all issued then waited for. reqs holds at least iters. */
static int run_iters(bench *b, size_t per, int iters, coll_request **reqs)
{
    int rc = 0;
    if (b->a.blocking) {
        for (int i = 0; i < iters && rc == 0; i++)
            rc = run_one(b, per);
        return rc;
    }
    int issued = 0;
    for (; issued < iters; issued++) {
        rc = issue(b, per, &reqs[issued]);
        if (rc < 0)
            break;
    }
    for (int i = 0; i < issued; i++) {
        int w = coll_wait(reqs[i]);
        if (rc == 0)
            rc = w;
    }
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* The check                                                                                */
/* ---------------------------------------------------------------------------------------- */

/*
 * Fills this rank's inputs with the pattern (and the outputs with 0xff bytes, NaN or -1, which
 * the pattern never produces in a float type), runs one operation and counts this rank's wrong
 * output elements. Returns the count, or a negative code if the operation failed.
 */
static int64_t check(bench *b, size_t per)
{
    const bench_args *a = &b->a;
    coll_dtype t = a->dtype;
    size_t ts = coll_dtype_size(t);
    int n = b->n, rank = b->rank;
    size_t total = is_split(a->kind) ? per * (size_t)n : per;
    size_t bytes = total * ts;
    memset(b->buf.hsend, 0xff, bytes);
    memset(b->buf.hrecv, 0xff, bytes);

    /* Host views of where the operation reads and writes. */
    char *hs = b->buf.hsend, *hr = b->buf.hrecv;
    char *in = hs, *out = hr;
    if (a->inplace) {
        if (a->kind == K_REDUCE_SCATTER) {
            in = hs;
            out = hs + (size_t)rank * per * ts;
        } else {
            in = hr;
            out = hr;
        }
    }
    switch (a->kind) {
    case K_ALLREDUCE:
    case K_REDUCE:
        for (size_t i = 0; i < per; i++)
            put(in, t, i, (double)pattern(i, rank, a->op));
        break;
    case K_BROADCAST:
        if (rank == a->root)
            for (size_t i = 0; i < per; i++)
                put(in, t, i, (double)pattern(i, a->root, a->op));
        break;
    case K_ALLGATHER: {
        char *mine = a->inplace ? hr + (size_t)rank * per * ts : hs;
        for (size_t i = 0; i < per; i++)
            put(mine, t, i, (double)pattern((size_t)rank * per + i, rank, a->op));
        break;
    }
    case K_REDUCE_SCATTER:
        for (size_t i = 0; i < total; i++)
            put(in, t, i, (double)pattern(i, rank, a->op));
        break;
    default:
        break;
    }
    int rc = transfer(&b->buf, bytes, true);
    if (rc == 0)
        rc = run_one(b, per);
    if (rc == 0)
        rc = transfer(&b->buf, bytes, false);
    if (rc < 0)
        return rc;

    int64_t wrong = 0;
    switch (a->kind) {
    case K_ALLREDUCE:
    case K_REDUCE:
        if (a->kind == K_REDUCE && rank != a->root)
            break;
        for (size_t i = 0; i < per; i++)
            wrong += !matches(get(out, t, i), expected_reduce(i, n, a->op, t), a->op, t);
        break;
    case K_BROADCAST:
        for (size_t i = 0; i < per; i++)
            wrong +=
                !matches(get(out, t, i), as_dtype(t, (double)pattern(i, a->root, a->op)), a->op, t);
        break;
    case K_ALLGATHER:
        for (size_t i = 0; i < total; i++)
            wrong += !matches(get(hr, t, i), as_dtype(t, (double)pattern(i, (int)(i / per), a->op)),
                              COLL_SUM, t);
        break;
    case K_REDUCE_SCATTER:
        for (size_t i = 0; i < per; i++)
            wrong += !matches(get(out, t, i), expected_reduce((size_t)rank * per + i, n, a->op, t),
                              a->op, t);
        break;
    default:
        break;
    }
    return wrong;
}

/* ---------------------------------------------------------------------------------------- */
/* Ranks' figures through the store                                                         */
/* ---------------------------------------------------------------------------------------- */

/*
 * Publishes this rank's mean time and wrong count for row `row`; on rank 0, reads every rank's
 * and combines them (-a for the time, the sum of wrong counts, -1 when not checked).
 */
static int exchange(bench *b, int row, double mean_us, int64_t wrong, double *time_us,
                    int64_t *wrong_all)
{
    char key[640], val[64];
    snprintf(key, sizeof(key), "%s/row/%d/%d", b->key_prefix, row, b->rank);
    int len = snprintf(val, sizeof(val), "%.17g %" PRId64, mean_us, wrong);
    int rc = rdzv_set(b->store, key, val, (size_t)len);
    if (rc < 0 || b->rank != 0)
        return rc;
    double sum = 0, lo = INFINITY, hi = 0, t0 = 0;
    int64_t wsum = 0;
    for (int r = 0; r < b->n; r++) {
        void *v;
        size_t nb;
        snprintf(key, sizeof(key), "%s/row/%d/%d", b->key_prefix, row, r);
        rc = rdzv_get(b->store, key, &v, &nb);
        if (rc < 0)
            return rc;
        double t;
        int64_t w;
        int ok = sscanf(v, "%lf %" SCNd64, &t, &w) == 2;
        rdzv_free(v);
        if (!ok)
            return -EPROTO;
        if (r == 0)
            t0 = t;
        sum += t;
        lo = t < lo ? t : lo;
        hi = t > hi ? t : hi;
        wsum = w < 0 || wsum < 0 ? -1 : wsum + w;
    }
    switch (b->a.average) {
    case 0:
        *time_us = t0;
        break;
    case 2:
        *time_us = lo;
        break;
    case 3:
        *time_us = hi;
        break;
    default:
        *time_us = sum / b->n;
        break;
    }
    *wrong_all = wsum;
    return 0;
}

/* Rank 0 prints each rank's pid, host, backend and device, as nccl-tests lists its devices. */
static int print_ranks(bench *b, int device)
{
    char key[640], val[512], host[256] = "?";
    gethostname(host, sizeof(host) - 1);
    snprintf(key, sizeof(key), "%s/rank/%d", b->key_prefix, b->rank);
    int len =
        snprintf(val, sizeof(val), "#  Rank %3d Pid %7d on %10s backend %4s device %2d", b->rank,
                 (int)getpid(), host, coll_backend_name(coll_comm_backend(b->comm)), device);
    int rc = rdzv_set(b->store, key, val, (size_t)len);
    if (rc < 0 || b->rank != 0)
        return rc;
    printf("#\n# Using devices\n");
    for (int r = 0; r < b->n; r++) {
        void *v;
        size_t nb;
        snprintf(key, sizeof(key), "%s/rank/%d", b->key_prefix, r);
        rc = rdzv_get(b->store, key, &v, &nb);
        if (rc < 0)
            return rc;
        printf("%.*s\n", (int)nb, (const char *)v);
        rdzv_free(v);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Main                                                                                     */
/* ---------------------------------------------------------------------------------------- */

static void log_hook(void *arg, int level, const char *msg)
{
    const int *rank = arg;
    if (level <= COLL_LOG_WARN)
        fprintf(stderr, "coll-bench: rank %d: libcollective: %s\n", *rank, msg);
}

static void print_header(const bench *b)
{
    const bench_args *a = &b->a;
    printf("# coll-bench %s: %s, %d ranks (%d hosts), backend %s\n", DDPRUN_VERSION,
           kind_names[a->kind], b->n, coll_comm_nhosts(b->comm),
           coll_backend_name(coll_comm_backend(b->comm)));
    printf("# minBytes %zu maxBytes %zu step: ", a->minbytes, a->maxbytes);
    if (a->factor > 1)
        printf("%ld(factor)", a->factor);
    else
        printf("%zu(bytes)", a->stepbytes);
    printf(" warmup iters: %d iters: %d (fewer above %zu bytes per size) validation: %d "
           "blocking: %d in-place: %d\n",
           a->warmup, a->iters, a->iter_bytes, a->check, a->blocking, a->inplace);
    static const char *const avg[] = {"rank 0's", "the average of the ranks'",
                                      "the minimum of the ranks'", "the maximum of the ranks'"};
    printf("# time: %s mean per operation; chunk_bytes %zu small_bytes %zu (0: library "
           "default)\n",
           avg[a->average], a->chunk_bytes, a->small_bytes);
}

static void print_columns(void)
{
    printf("#\n# %10s %12s %6s %6s %5s %10s %8s %8s %7s\n", "size", "count", "type", "redop",
           "root", "time", "algbw", "busbw", "#wrong");
    printf("# %10s %12s %6s %6s %5s %10s %8s %8s %7s\n", "(B)", "(elements)", "", "", "", "(us)",
           "(GB/s)", "(GB/s)", "");
}

int main(int argc, char **argv)
{
    bench b = {0};
    int status = parse_args(argc, argv, &b.a);
    if (status != 0)
        return status < 0 ? EXIT_OK : status;
    bench_args *a = &b.a;
    status = EXIT_SETUP;

    /*
     * Who we are: the torchrun environment, or (none of RANK, WORLD_SIZE, MASTER_ADDR and
     * MASTER_PORT set) a job of one on a store of our own. The store only: the device comes from
     * LOCAL_RANK before the communicator is made, and the bench keeps the store for its own keys.
     */
    coll_env job = {0};
    json_t *rows = NULL;
    coll_request **reqs = NULL;
    coll_env_options eo;
    coll_env_options_init(&eo);
    eo.name = "coll-bench";
    eo.store_only = true;
    eo.standalone = true;
    int rc = coll_comm_init_env(&eo, &job);
    if (rc < 0) {
        /* The sentence names the variable at fault, or the store's address. */
        err("%s", coll_last_error(NULL));
        return EXIT_SETUP;
    }
    b.rank = job.env.rank;
    b.n = job.env.world_size;
    b.store = job.store;
    if (is_rooted(a->kind) && a->root >= b.n) {
        if (b.rank == 0)
            err("-r/--root: %d is not a rank of %d", a->root, b.n);
        status = EXIT_USAGE;
        goto out;
    }

    /* The device: LOCAL_RANK when the nccl backend may be chosen and there is a GPU. */
    int local_rank = job.env.local_rank, device = -1;
#ifdef COLL_BENCH_CUDA
    if (a->backend != COLL_BACKEND_CPU && coll_have_nccl()) {
        int ndev = 0;
        if (cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0) {
            device = local_rank % ndev;
            cudaSetDevice(device);
        }
    }
#endif
    if (a->backend == COLL_BACKEND_NCCL && device < 0)
        device = local_rank; /* the library says why it cannot */

    coll_options opts;
    coll_options_init(&opts);
    opts.timeout_ms = a->timeout_ms;
    opts.chunk_bytes = a->chunk_bytes;
    opts.small_bytes = a->small_bytes;
    opts.log = log_hook;
    opts.log_arg = &b.rank;
    /* The communicator's keys live under the attempt's prefix, the bench's own beside them. */
    rc = rdzv_env_prefix(&job.env, "coll-bench-stats", b.key_prefix, sizeof(b.key_prefix));
    if (rc < 0) {
        err("rank %d: store key prefix: %s", b.rank, rdzv_strerror(rc));
        goto out;
    }
    rc = coll_comm_init(b.store, job.prefix, b.rank, b.n, a->backend, device, &opts, &b.comm);
    if (rc < 0) {
        err("rank %d: coll_comm_init (%s backend, device %d): %s: %s", b.rank,
            coll_backend_name(a->backend), device, coll_strerror(rc), coll_last_error(NULL));
        goto out;
    }
    bool on_device = coll_comm_backend(b.comm) == COLL_BACKEND_NCCL;
#ifndef COLL_BENCH_CUDA
    if (on_device) {
        err("rank %d: the nccl backend needs device buffers, and coll-bench was built "
            "without CUDA",
            b.rank);
        goto out;
    }
#endif
    if (b.rank == 0)
        print_header(&b);
    rc = print_ranks(&b, on_device ? device : -1);
    if (rc < 0) {
        err("rank %d: store: %s", b.rank, rdzv_strerror(rc));
        goto out;
    }

    /* Buffers for the largest row; a request slot per timed operation. */
    size_t ts = coll_dtype_size(a->dtype);
    size_t per_max = per_rank_count(a, a->maxbytes, b.n);
    size_t max_bytes = (is_split(a->kind) ? per_max * (size_t)b.n : per_max) * ts;
    if (buffers_alloc(&b.buf, max_bytes, on_device) < 0 ||
        !(reqs =
              calloc((size_t)(a->iters > a->warmup ? a->iters : a->warmup) + 1, sizeof(*reqs)))) {
        err("rank %d: cannot allocate 2 x %zu bytes%s", b.rank, max_bytes,
            on_device ? " on the device" : "");
        goto out;
    }
    if (b.rank == 0)
        print_columns();
    fflush(stdout);
    if (a->json && b.rank == 0 && !(rows = json_array()))
        goto out;

    status = EXIT_OK;
    double bw_sum = 0;
    int nrows = 0;
    int64_t wrong_total = 0;
    int64_t wrong_mine = 0;
    for (size_t size = a->minbytes;;) {
        size_t per = per_rank_count(a, size, b.n);
        size_t count = is_split(a->kind) ? per * (size_t)b.n : per;
        size_t nbytes = count * ts;
        int iters = iters_for(a, nbytes);

        /*
         * The timed operations run on the pattern too (not checked; any data would do, but
         * the check and in-place runs leave NaNs and large values behind).
         */
        for (size_t i = 0; i < count; i++) {
            put(b.buf.hsend, a->dtype, i, (double)pattern(i, b.rank, a->op));
            put(b.buf.hrecv, a->dtype, i, (double)pattern(i, b.rank, a->op));
        }
        rc = transfer(&b.buf, nbytes, true);
        if (rc == 0)
            rc = run_iters(&b, per, a->warmup, reqs);
        if (rc == 0)
            rc = coll_barrier(b.comm);
        int64_t t0 = mono_now_ns();
        if (rc == 0)
            rc = run_iters(&b, per, iters, reqs);
        double mean_us = (double)(mono_now_ns() - t0) / 1e3 / iters;
        if (rc < 0) {
            err("rank %d: %s of %zu bytes: %s: %s", b.rank, kind_names[a->kind], nbytes,
                coll_strerror(rc), coll_last_error(b.comm));
            status = EXIT_COLL;
            goto out;
        }
        int64_t wrong = -1;
        if (a->check) {
            wrong = check(&b, per);
            if (wrong < 0) {
                err("rank %d: checked %s of %zu bytes: %s: %s", b.rank, kind_names[a->kind], nbytes,
                    coll_strerror((int)wrong), coll_last_error(b.comm));
                status = EXIT_COLL;
                goto out;
            }
            wrong_mine += wrong;
        }
        double time_us = 0;
        int64_t wrong_all = 0;
        rc = exchange(&b, nrows, mean_us, wrong, &time_us, &wrong_all);
        if (rc < 0) {
            err("rank %d: store: %s", b.rank, rdzv_strerror(rc));
            status = EXIT_COLL;
            goto out;
        }
        if (b.rank == 0) {
            double algbw = time_us > 0 ? (double)nbytes / (time_us * 1e3) : 0; /* GB/s */
            double busbw = algbw * bus_factor(a->kind, b.n);
            char wbuf[24];
            if (wrong_all < 0)
                snprintf(wbuf, sizeof(wbuf), "N/A");
            else
                snprintf(wbuf, sizeof(wbuf), "%" PRId64, wrong_all);
            printf("  %10zu %12zu %6s %6s %5d %10.2f %8.3f %8.3f %7s\n", nbytes, count,
                   coll_dtype_name(a->dtype), has_op(a->kind) ? coll_op_name(a->op) : "none",
                   is_rooted(a->kind) ? a->root : -1, time_us, algbw, busbw, wbuf);
            fflush(stdout);
            bw_sum += busbw;
            if (wrong_all > 0)
                wrong_total += wrong_all;
            if (rows) {
                json_t *row = json_pack(
                    "{s:s, s:s, s:i, s:I, s:I, s:s, s:s, s:i, s:i, s:f, s:f, s:f, s:o}", "coll",
                    kind_names[a->kind], "backend", coll_backend_name(coll_comm_backend(b.comm)),
                    "nranks", b.n, "bytes", (json_int_t)nbytes, "count", (json_int_t)count, "dtype",
                    coll_dtype_name(a->dtype), "redop",
                    has_op(a->kind) ? coll_op_name(a->op) : "none", "root",
                    is_rooted(a->kind) ? a->root : -1, "iters", iters, "time_us", time_us,
                    "algbw_gbs", algbw, "busbw_gbs", busbw, "wrong",
                    wrong_all < 0 ? json_null() : json_integer(wrong_all));
                if (!row || json_array_append_new(rows, row) < 0) {
                    err("out of memory");
                    status = EXIT_SETUP;
                    goto out;
                }
            }
        }
        nrows++;

        /* The next size; stop when it passes -e or would wrap. */
        size_t next;
        if (a->factor > 1 && size > SIZE_MAX / (size_t)a->factor)
            break;
        if (a->factor > 1)
            next = size == 0 ? 1 : size * (size_t)a->factor;
        else
            next = size + a->stepbytes;
        if (next <= size || next > a->maxbytes)
            break;
        size = next;
    }
    if (b.rank == 0) {
        printf("# Out of bounds values : %" PRId64 " %s\n", wrong_total,
               wrong_total ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %.4g\n#\n", nrows ? bw_sum / nrows : 0.0);
        fflush(stdout);
        if (rows && json_dump_file(rows, a->json, JSON_INDENT(1)) != 0) {
            err("--json: cannot write %s", a->json);
            status = EXIT_SETUP;
        }
    }
    if (status == EXIT_OK && (wrong_total > 0 || wrong_mine > 0))
        status = EXIT_WRONG;
    /* Nobody leaves while a peer may still be reading from it. */
    rc = coll_barrier(b.comm);
    if (rc < 0 && status == EXIT_OK) {
        err("rank %d: final barrier: %s: %s", b.rank, coll_strerror(rc), coll_last_error(b.comm));
        status = EXIT_COLL;
    }

out:
    if (status == EXIT_COLL && b.comm)
        coll_comm_abort(b.comm);
    coll_comm_close(b.comm);
    if (b.buf.hsend)
        buffers_free(&b.buf);
    free(reqs);
    json_decref(rows);
    coll_env_free(&job); /* the store (b.store), then the private one */
    return status;
}
