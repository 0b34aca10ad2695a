/*
 * reduce-bench: throughput of libcollective's reduction kernel, coll__reduce_n(), on one core,
 * next to memcpy() of the same size for reference.
 *
 * For each dtype (f32, bf16, f16 by default) and nsrc (2 and 4), it reduces nsrc sources of
 * --mib MiB each (64 by default; --kib for sizes that stay in cache) with SUM, out of place (into a
 * separate dst) and in place (dst == srcs[0], as the cpu backend does), and reports the best of
 * --reps runs as
 *
 *   GB/s   bytes the kernel touches, (nsrc reads + 1 write) x size, per second (10^9 B/s)
 *   Gel/s  output elements per second
 *
 * memcpy's GB/s counts its read and its write, so the columns compare like with like: a kernel
 * as fast as memcpy moves its bytes at memcpy's rate. Buffers are allocated and written before
 * the clock starts, so page faults are not timed. One thread only: the cpu backend splits a
 * reduction across ranks, not across threads.
 *
 * Not run by `meson test`; a benchmark, not a check (tests/libcollective/test_reduce.c checks
 * the results).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "coll_internal.h"
#include "bf16conv.h"
#include "monoclock.h"

#define MAXSRC 4

static void usage(FILE *f)
{
    fprintf(f, "usage: reduce-bench [--mib N | --kib N] [--reps N] [--dtype NAME]... [--op NAME]\n"
               "  --mib N       MiB per source (64)\n"
               "  --kib N       KiB per source instead (small sizes measure in-cache speed)\n"
               "  --reps N      runs per row, best reported (10)\n"
               "  --dtype NAME  f32, f64, f16, bf16, i32, i64 or u8; repeatable (f32 bf16 f16)\n"
               "  --op NAME     sum, avg, max, min or prod (sum)\n");
}

/* Fills with values that stay finite under any op: in [0.5, 2) for floats. */
static void fill(void *buf, size_t count, coll_dtype dt, unsigned seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < count; i++) {
        x = x * 1664525u + 1013904223u;
        float v = 0.5f + (float)(x >> 8) * 0x1p-24f * 1.5f;
        switch (dt) {
        case COLL_F32:
            ((float *)buf)[i] = v;
            break;
        case COLL_F64:
            ((double *)buf)[i] = v;
            break;
        case COLL_F16:
            ((uint16_t *)buf)[i] = coll__f32_to_f16(v);
            break;
        case COLL_BF16:
            ((uint16_t *)buf)[i] = bf16_from_f32(v);
            break;
        case COLL_I32:
            ((int32_t *)buf)[i] = (int32_t)x;
            break;
        case COLL_I64:
            ((int64_t *)buf)[i] = (int64_t)x;
            break;
        case COLL_U8:
            ((uint8_t *)buf)[i] = (uint8_t)x;
            break;
        default:
            break;
        }
    }
}

int main(int argc, char **argv)
{
    size_t mib = 64, kib = 0;
    int reps = 10;
    coll_dtype dtypes[16];
    int ndtypes = 0;
    coll_op op = COLL_SUM;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--mib") == 0 && v) {
            long n;
            rc = cli_parse_long(a, v, 1, 1 << 20, &n);
            mib = rc == 0 ? (size_t)n : mib;
            i++;
        } else if (strcmp(a, "--kib") == 0 && v) {
            long n;
            rc = cli_parse_long(a, v, 0, 1 << 30, &n);
            kib = rc == 0 ? (size_t)n : kib;
            i++;
        } else if (strcmp(a, "--reps") == 0 && v) {
            rc = cli_parse_int(a, v, 1, 1 << 20, &reps);
            i++;
        } else if (strcmp(a, "--dtype") == 0 && v && ndtypes < 16) {
            if (coll_dtype_parse(v, &dtypes[ndtypes++]) < 0) {
                fprintf(stderr, "reduce-bench: unknown dtype '%s'\n", v);
                return 2;
            }
            i++;
        } else if (strcmp(a, "--op") == 0 && v) {
            if (coll_op_parse(v, &op) < 0) {
                fprintf(stderr, "reduce-bench: unknown op '%s'\n", v);
                return 2;
            }
            i++;
        } else {
            cli_msg(stderr, "reduce-bench", "'%s': unknown option, or its value is missing", a);
            usage(stderr);
            return 2;
        }
        if (cli_report(stderr, "reduce-bench", rc) < 0)
            return 2;
    }
    size_t nbytes = kib ? kib << 10 : mib << 20;
    if (nbytes == 0 || reps < 1) {
        usage(stderr);
        return 2;
    }
    if (ndtypes == 0) {
        dtypes[ndtypes++] = COLL_F32;
        dtypes[ndtypes++] = COLL_BF16;
        dtypes[ndtypes++] = COLL_F16;
    }

    char *bufs[MAXSRC + 1];
    for (int k = 0; k <= MAXSRC; k++) {
        bufs[k] = aligned_alloc(64, nbytes);
        if (!bufs[k]) {
            fprintf(stderr, "reduce-bench: out of memory for %zu-byte buffers\n", nbytes);
            return 1;
        }
        memset(bufs[k], 0, nbytes);
    }
    char *dst = bufs[MAXSRC];

    printf("%zu KiB per source, best of %d, op %s, one thread\n\n", nbytes >> 10, reps,
           coll_op_name(op));
    printf("%-8s %5s %-12s %8s %8s %9s\n", "dtype", "nsrc", "dst", "GB/s", "Gel/s", "ms");

    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = mono_now_s();
        memcpy(dst, bufs[0], nbytes);
        double t = mono_now_s() - t0;
        best = t < best ? t : best;
    }
    printf("%-8s %5s %-12s %8.2f %8s %9.2f\n", "memcpy", "-", "-", 2.0 * nbytes / best / 1e9, "-",
           best * 1e3);

    for (int d = 0; d < ndtypes; d++) {
        coll_dtype dt = dtypes[d];
        size_t count = nbytes / coll_dtype_size(dt);
        for (int k = 0; k < MAXSRC; k++)
            fill(bufs[k], count, dt, (unsigned)k);
        static const int nsrcs[] = {2, 4};
        for (size_t s = 0; s < sizeof nsrcs / sizeof nsrcs[0]; s++) {
            int nsrc = nsrcs[s];
            const void *srcs[MAXSRC];
            for (int k = 0; k < nsrc; k++)
                srcs[k] = bufs[k];
            for (int inplace = 0; inplace <= 1; inplace++) {
                void *out = inplace ? bufs[0] : dst;
                best = 1e30;
                for (int r = 0; r < reps; r++) {
                    double t0 = mono_now_s();
                    coll__reduce_n(out, srcs, nsrc, count, dt, op);
                    double t = mono_now_s() - t0;
                    best = t < best ? t : best;
                }
                /* In place keeps reducing into srcs[0]; refresh it so later rows see sane data. */
                if (inplace)
                    fill(bufs[0], count, dt, 0);
                printf("%-8s %5d %-12s %8.2f %8.2f %9.2f\n", coll_dtype_name(dt), nsrc,
                       inplace ? "== srcs[0]" : "separate",
                       (double)(nsrc + 1) * nbytes / best / 1e9, (double)count / best / 1e9,
                       best * 1e3);
            }
        }
    }
    for (int k = 0; k <= MAXSRC; k++)
        free(bufs[k]);
    return 0;
}
