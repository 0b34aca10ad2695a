/*
 * Unit tests of ddp-train's data pipeline (worker/trainer/data.c): the distributed sampler, IDX
 * parsing of small files written here, and the loader thread against the synchronous path.
 *
 * Sampler properties, for world sizes 1, 2, 3 and 4 and several accumulation counts: the
 * micro-batches of all ranks at a step are disjoint and together are exactly the step's global
 * batch (in rank-major, micro-step-minor order), which is the same whatever the world size;
 * an epoch's steps are disjoint and cover all but the n mod G dropped samples; an epoch's
 * permutation depends on (seed, epoch) alone. IDX files (plain and gzip): good ones load, and
 * a missing, truncated, too long, wrongly numbered or bad-magic file fails with a sentence that
 * names it.
 */
#include <check.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "data.h"
#include "check_main.h"

/* ------------------------------------------------------------------------------------------ */
/* Sampler                                                                                     */
/* ------------------------------------------------------------------------------------------ */

enum { N = 1000, G = 48 };

/* Every (world, grad_accum) below divides G = 48. */
static const int worlds[] = {1, 2, 4, 3};
static const int accums[] = {1, 2, 4};

/*
 * The concatenation of every rank's micro-batches of step `step` (rank-major, then k), for a
 * world of W and A micro-steps, into out (G).
 */
static void collect_step(int W, int A, int epoch, int step, int32_t *out)
{
    size_t pos = 0;
    for (int r = 0; r < W; r++) {
        data_sampler s;
        ck_assert_int_eq(data_sampler_init(&s, N, G, W, r, A, 99), 0);
        ck_assert_int_eq(s.micro, G / W / A);
        data_sampler_set_epoch(&s, epoch);
        for (int k = 0; k < A; k++) {
            memcpy(out + pos, data_sampler_micro(&s, step, k), sizeof(int32_t) * s.micro);
            pos += (size_t)s.micro;
        }
        data_sampler_free(&s);
    }
    ck_assert_uint_eq(pos, G);
}

START_TEST(sampler_global_batch_independent_of_world)
{
    data_sampler one;
    ck_assert_int_eq(data_sampler_init(&one, N, G, 1, 0, 1, 99), 0);
    for (int epoch = 0; epoch < 2; epoch++) {
        data_sampler_set_epoch(&one, epoch);
        for (int step = 0; step < data_sampler_steps(&one); step += 7) {
            const int32_t *ref = data_sampler_global(&one, step);
            for (size_t w = 0; w < sizeof worlds / sizeof *worlds; w++) {
                for (size_t a = 0; a < sizeof accums / sizeof *accums; a++) {
                    int32_t got[G];
                    collect_step(worlds[w], accums[a], epoch, step, got);
                    ck_assert_msg(memcmp(got, ref, sizeof got) == 0,
                                  "world %d x accum %d: step %d of epoch %d differs", worlds[w],
                                  accums[a], step, epoch);
                }
            }
        }
    }
    data_sampler_free(&one);
}
END_TEST

/* Over one epoch, all ranks' micro-batches are disjoint and cover every sample but the tail. */
START_TEST(sampler_disjoint_and_covering)
{
    for (size_t w = 0; w < sizeof worlds / sizeof *worlds; w++) {
        int W = worlds[w], A = 2;
        int seen[N] = {0};
        int steps = 0, total = 0;
        for (int r = 0; r < W; r++) {
            data_sampler s;
            ck_assert_int_eq(data_sampler_init(&s, N, G, W, r, A, 5), 0);
            data_sampler_set_epoch(&s, 3);
            steps = data_sampler_steps(&s);
            for (int st = 0; st < steps; st++) {
                for (int k = 0; k < A; k++) {
                    const int32_t *idx = data_sampler_micro(&s, st, k);
                    for (int i = 0; i < s.micro; i++) {
                        ck_assert_int_ge(idx[i], 0);
                        ck_assert_int_lt(idx[i], N);
                        ck_assert_msg(seen[idx[i]] == 0, "world %d: sample %d taken twice", W,
                                      idx[i]);
                        seen[idx[i]] = 1;
                        total++;
                    }
                }
            }
            /* The dropped samples are exactly the permutation's tail. */
            for (int i = steps * G; i < N; i++)
                ck_assert_int_eq(seen[s.perm[i]], 0);
            data_sampler_free(&s);
        }
        /* Drop-last: 1000 / 48 = 20 steps, 960 samples trained, 40 dropped. */
        ck_assert_int_eq(steps, N / G);
        ck_assert_int_eq(steps, 20);
        ck_assert_int_eq(total, steps * G);
        ck_assert_int_eq(total, 960);
    }
}
END_TEST

START_TEST(sampler_epoch_reseeding)
{
    data_sampler a, b;
    ck_assert_int_eq(data_sampler_init(&a, N, G, 2, 1, 1, 7), 0);
    ck_assert_int_eq(data_sampler_init(&b, N, G, 2, 1, 1, 7), 0);
    ck_assert_int_eq(a.epoch, -1);
    data_sampler_set_epoch(&a, 0);
    int32_t *e0 = malloc(sizeof(int32_t) * N);
    memcpy(e0, a.perm, sizeof(int32_t) * N);
    /* A permutation. */
    int seen[N] = {0};
    for (int i = 0; i < N; i++)
        seen[e0[i]]++;
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(seen[i], 1);
    /* Not the identity, and another epoch gives another order. */
    int fixed = 0;
    for (int i = 0; i < N; i++)
        fixed += e0[i] == i;
    ck_assert_int_lt(fixed, 10);
    data_sampler_set_epoch(&a, 1);
    ck_assert_int_eq(a.epoch, 1);
    ck_assert_int_ne(memcmp(e0, a.perm, sizeof(int32_t) * N), 0);
    /* Epoch 0 again, or on another sampler after other epochs: the same order. */
    data_sampler_set_epoch(&b, 5);
    data_sampler_set_epoch(&b, 0);
    ck_assert_int_eq(memcmp(e0, b.perm, sizeof(int32_t) * N), 0);
    data_sampler_set_epoch(&a, 0);
    ck_assert_int_eq(memcmp(e0, a.perm, sizeof(int32_t) * N), 0);
    /* Another seed: another order. */
    data_sampler c;
    ck_assert_int_eq(data_sampler_init(&c, N, G, 2, 1, 1, 8), 0);
    data_sampler_set_epoch(&c, 0);
    ck_assert_int_ne(memcmp(e0, c.perm, sizeof(int32_t) * N), 0);
    data_sampler_free(&a);
    data_sampler_free(&b);
    data_sampler_free(&c);
    data_sampler_free(NULL);
    free(e0);
}
END_TEST

START_TEST(sampler_bad_configurations)
{
    data_sampler s;
    ck_assert_int_eq(data_sampler_init(&s, N, 48, 5, 0, 1, 1), -EINVAL);
    ck_assert_ptr_nonnull(strstr(data_last_error(), "multiple of world size x --grad-accum"));
    ck_assert_int_eq(data_sampler_init(&s, N, 48, 4, 0, 8, 1), -EINVAL);
    ck_assert_int_eq(data_sampler_init(&s, N, 1001, 1, 0, 1, 1), -EINVAL);
    ck_assert_ptr_nonnull(strstr(data_last_error(), "global batch (1001)"));
    ck_assert_int_eq(data_sampler_init(&s, N, 48, 2, 2, 1, 1), -EINVAL);
    ck_assert_int_eq(data_sampler_init(&s, N, 48, 2, -1, 1, 1), -EINVAL);
    ck_assert_int_eq(data_sampler_init(&s, N, 48, 2, 0, 0, 1), -EINVAL);
    ck_assert_int_eq(data_sampler_init(&s, 0, 48, 1, 0, 1, 1), -EINVAL);
    /* G == n: one step per epoch, nothing dropped. */
    ck_assert_int_eq(data_sampler_init(&s, 48, 48, 3, 2, 2, 1), 0);
    ck_assert_int_eq(data_sampler_steps(&s), 1);
    data_sampler_free(&s);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* IDX files                                                                                   */
/* ------------------------------------------------------------------------------------------ */

static char tmpdir[64];

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_data.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void remove_tmpdir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    ck_assert_int_eq(system(cmd), 0);
}

/* Writes an IDX file: the 4 magic bytes, ndim sizes, then `len` payload bytes. */
static void write_idx(const char *path, int gz, const uint8_t magic[4], int ndim,
                      const uint32_t *dims, const uint8_t *payload, size_t len)
{
    uint8_t head[16];
    memcpy(head, magic, 4);
    for (int i = 0; i < ndim; i++) {
        head[4 + 4 * i] = (uint8_t)(dims[i] >> 24);
        head[5 + 4 * i] = (uint8_t)(dims[i] >> 16);
        head[6 + 4 * i] = (uint8_t)(dims[i] >> 8);
        head[7 + 4 * i] = (uint8_t)dims[i];
    }
    if (gz) {
        gzFile f = gzopen(path, "wb");
        ck_assert_ptr_nonnull(f);
        ck_assert_int_eq(gzwrite(f, head, 4 + 4 * (unsigned)ndim), 4 + 4 * ndim);
        if (len)
            ck_assert_int_eq(gzwrite(f, payload, (unsigned)len), (int)len);
        ck_assert_int_eq(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        ck_assert_ptr_nonnull(f);
        ck_assert_uint_eq(fwrite(head, 1, 4 + 4 * (size_t)ndim, f), 4 + 4 * (size_t)ndim);
        if (len)
            ck_assert_uint_eq(fwrite(payload, 1, len, f), len);
        ck_assert_int_eq(fclose(f), 0);
    }
}

static const uint8_t MAGIC_IMAGES[4] = {0, 0, 8, 3}, MAGIC_LABELS[4] = {0, 0, 8, 1};

/* A split of n 2x3 images with pixel (i, j) = 10 * i + j and label i % 10. */
static void write_split(const char *split, int n, int gz)
{
    char ip[256], lp[256];
    snprintf(ip, sizeof ip, "%s/%s-images-idx3-ubyte%s", tmpdir, split, gz ? ".gz" : "");
    snprintf(lp, sizeof lp, "%s/%s-labels-idx1-ubyte%s", tmpdir, split, gz ? ".gz" : "");
    uint8_t px[64 * 6], lb[64];
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < 6; j++)
            px[6 * i + j] = (uint8_t)(10 * i + j);
        lb[i] = (uint8_t)(i % 10);
    }
    write_idx(ip, gz, MAGIC_IMAGES, 3, (uint32_t[]){(uint32_t)n, 2, 3}, px, 6 * (size_t)n);
    write_idx(lp, gz, MAGIC_LABELS, 1, (uint32_t[]){(uint32_t)n}, lb, (size_t)n);
}

START_TEST(idx_good_files)
{
    make_tmpdir();
    for (int gz = 0; gz < 2; gz++) {
        write_split(gz ? "train" : "t10k", 12, gz);
        data_set ds;
        ck_assert_msg(data_load(tmpdir, gz ? "train" : "t10k", &ds) == 0, "%s", data_last_error());
        ck_assert_int_eq(ds.n, 12);
        ck_assert_int_eq(ds.rows, 2);
        ck_assert_int_eq(ds.cols, 3);
        ck_assert_int_eq(ds.dim, 6);
        for (int i = 0; i < 12; i++) {
            ck_assert_int_eq(ds.y[i], i % 10);
            for (int j = 0; j < 6; j++) {
                float want = ((float)(10 * i + j) / 255.0f - DATA_MEAN) / DATA_STD;
                ck_assert_float_eq(ds.x[6 * i + j], want);
            }
        }
        /* data_gather copies rows. */
        float x[2 * 6];
        uint8_t y[2];
        data_gather(&ds, (int32_t[]){11, 3}, 2, x, y);
        ck_assert_int_eq(y[0], 1);
        ck_assert_int_eq(y[1], 3);
        ck_assert_int_eq(memcmp(x, ds.x + 66, 6 * sizeof(float)), 0);
        ck_assert_int_eq(memcmp(x + 6, ds.x + 18, 6 * sizeof(float)), 0);
        data_set_free(&ds);
        ck_assert_ptr_null(ds.x);
    }
    /* With both present, the .gz file is read. */
    write_split("train", 5, 0);
    data_set ds;
    ck_assert_int_eq(data_load(tmpdir, "train", &ds), 0);
    ck_assert_int_eq(ds.n, 12);
    data_set_free(&ds);
    data_set_free(NULL);
    remove_tmpdir();
}
END_TEST

/* data_idx_read(path) fails with `code` and a sentence that starts with path and has `what`. */
static void expect_fail(const char *path, int ndim, int code, const char *what)
{
    int dims[3] = {-1, -1, -1};
    uint8_t *data = (uint8_t *)"untouched";
    int rc = data_idx_read(path, ndim, dims, &data);
    ck_assert_msg(rc == code, "%s: got %d, want %d (%s)", path, rc, code, data_last_error());
    ck_assert_msg(strncmp(data_last_error(), path, strlen(path)) == 0,
                  "the sentence does not name the file: %s", data_last_error());
    ck_assert_msg(strstr(data_last_error(), what), "'%s' lacks '%s'", data_last_error(), what);
    ck_assert_str_eq((char *)data, "untouched");
    ck_assert_int_eq(dims[0], -1);
}

START_TEST(idx_bad_files)
{
    make_tmpdir();
    char p[256];
    uint8_t payload[24] = {0};
    for (int gz = 0; gz < 2; gz++) {
        const char *sfx = gz ? ".gz" : "";

        snprintf(p, sizeof p, "%s/missing%s", tmpdir, sfx);
        expect_fail(p, 3, -ENOENT, "cannot open");

        snprintf(p, sizeof p, "%s/magic%s", tmpdir, sfx);
        write_idx(p, gz, (uint8_t[]){0, 0, 9, 3}, 3, (uint32_t[]){1, 2, 3}, payload, 6);
        expect_fail(p, 3, -EPROTO, "magic number 0x00000903, expected 0x00000803");

        snprintf(p, sizeof p, "%s/ndim%s", tmpdir, sfx);
        write_idx(p, gz, MAGIC_LABELS, 1, (uint32_t[]){6}, payload, 6);
        expect_fail(p, 3, -EPROTO, "magic number");

        snprintf(p, sizeof p, "%s/short%s", tmpdir, sfx);
        write_idx(p, gz, MAGIC_IMAGES, 3, (uint32_t[]){4, 2, 3}, payload, 23);
        expect_fail(p, 3, -EPROTO,
                    "truncated: the header announces 24 bytes of data, the file "
                    "has 23");

        snprintf(p, sizeof p, "%s/header%s", tmpdir, sfx);
        write_idx(p, gz, MAGIC_IMAGES, 1, (uint32_t[]){4}, payload, 0);
        expect_fail(p, 3, -EPROTO, "shorter than an IDX header");

        snprintf(p, sizeof p, "%s/long%s", tmpdir, sfx);
        write_idx(p, gz, MAGIC_IMAGES, 3, (uint32_t[]){3, 2, 3}, payload, 19);
        expect_fail(p, 3, -EPROTO, "longer than its header says");

        snprintf(p, sizeof p, "%s/zero%s", tmpdir, sfx);
        write_idx(p, gz, MAGIC_IMAGES, 3, (uint32_t[]){0, 2, 3}, payload, 0);
        expect_fail(p, 3, -EPROTO, "implausible size 0");

        snprintf(p, sizeof p, "%s/huge%s", tmpdir, sfx);
        write_idx(p, gz, MAGIC_IMAGES, 3, (uint32_t[]){60000, 65536, 65536}, payload, 0);
        expect_fail(p, 3, -EPROTO, "implausible size");

        snprintf(p, sizeof p, "%s/empty%s", tmpdir, sfx);
        write_idx(p, 0, MAGIC_IMAGES, 0, NULL, payload, 0);
        ck_assert_int_eq(truncate(p, 0), 0);
        expect_fail(p, 3, -EPROTO, "0 bytes, shorter than an IDX header");
    }

    /* A gzip stream cut short: zlib notices the missing end. */
    static uint8_t big[6000];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (uint8_t)(i * 7919 >> 3);
    snprintf(p, sizeof p, "%s/cut.gz", tmpdir);
    write_idx(p, 1, MAGIC_IMAGES, 3, (uint32_t[]){1000, 2, 3}, big, sizeof big);
    struct stat st;
    ck_assert_int_eq(stat(p, &st), 0);
    ck_assert_int_eq(truncate(p, st.st_size / 2), 0);
    expect_fail(p, 3, -EPROTO, "truncated");

    /* A directory where a file should be. */
    snprintf(p, sizeof p, "%s/dir", tmpdir);
    ck_assert_int_eq(mkdir(p, 0700), 0);
    int dims[3];
    uint8_t *data;
    ck_assert_int_lt(data_idx_read(p, 3, dims, &data), 0);
    ck_assert_int_eq(strncmp(data_last_error(), p, strlen(p)), 0);
    remove_tmpdir();
}
END_TEST

/*
 * A data file that is not a regular file is refused at once with a sentence that says so: a FIFO
 * (which used to hang ddp-train in open() until a writer came), a directory, a device. The
 * alarm bounds the test if the open blocks.
 */
START_TEST(idx_not_regular)
{
    alarm(5);
    make_tmpdir();
    char p[256], want[300];
    snprintf(p, sizeof p, "%s/train-images-idx3-ubyte", tmpdir);
    ck_assert_int_eq(mkfifo(p, 0600), 0);
    snprintf(want, sizeof want, "%s: not a regular file (a FIFO)", p);
    expect_fail(p, 3, -EINVAL, want);
    data_set ds;
    ck_assert_int_eq(data_load(tmpdir, "train", &ds), -EINVAL);
    ck_assert_str_eq(data_last_error(), want);

    snprintf(p, sizeof p, "%s/dir", tmpdir);
    ck_assert_int_eq(mkdir(p, 0700), 0);
    expect_fail(p, 3, -EINVAL, "not a regular file (a directory)");
    expect_fail("/dev/null", 1, -EINVAL, "/dev/null: not a regular file (a character device)");
    remove_tmpdir();
    alarm(0);
}
END_TEST

START_TEST(load_bad_splits)
{
    make_tmpdir();
    data_set ds;
    char want[256];

    /* Missing files: the error names the plain path (no .gz there either). */
    ck_assert_int_eq(data_load(tmpdir, "train", &ds), -ENOENT);
    snprintf(want, sizeof want, "%s/train-images-idx3-ubyte: cannot open", tmpdir);
    ck_assert_str_eq(strstr(data_last_error(), tmpdir), data_last_error());
    ck_assert_ptr_nonnull(strstr(data_last_error(), want));

    /* Images present, labels missing. */
    write_split("train", 12, 1);
    snprintf(want, sizeof want, "%s/train-labels-idx1-ubyte.gz", tmpdir);
    unlink(want);
    ck_assert_int_eq(data_load(tmpdir, "train", &ds), -ENOENT);
    ck_assert_ptr_nonnull(strstr(data_last_error(), "train-labels-idx1-ubyte: cannot open"));

    /* Counts that disagree. */
    uint8_t lb[10] = {0};
    write_idx(want, 1, MAGIC_LABELS, 1, (uint32_t[]){10}, lb, 10);
    ck_assert_int_eq(data_load(tmpdir, "train", &ds), -EPROTO);
    ck_assert_ptr_nonnull(strstr(data_last_error(), "holds 12 images but"));
    ck_assert_ptr_nonnull(strstr(data_last_error(), "holds 10 labels"));

    /* A label out of range. */
    uint8_t bad[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0};
    write_idx(want, 1, MAGIC_LABELS, 1, (uint32_t[]){12}, bad, 12);
    ck_assert_int_eq(data_load(tmpdir, "train", &ds), -EPROTO);
    ck_assert_ptr_nonnull(strstr(data_last_error(), "label 10 of sample 10 is not in 0..9"));
    ck_assert_int_eq(strncmp(data_last_error(), want, strlen(want)), 0);
    remove_tmpdir();
}
END_TEST

/* The real data set, when Debian's package is installed: sizes as published. */
/* data_pixels() undoes the normalisation exactly, for every byte value. */
START_TEST(pixels_round_trip)
{
    uint8_t p[256], back[256];
    float x[256];
    for (int i = 0; i < 256; i++) {
        p[i] = (uint8_t)i;
        x[i] = ((float)p[i] / 255.0f - DATA_MEAN) / DATA_STD; /* data_load()'s */
    }
    data_set ds = {.n = 16, .rows = 4, .cols = 4, .dim = 16, .x = x};
    data_pixels(&ds, back);
    ck_assert_int_eq(memcmp(p, back, sizeof p), 0);
}
END_TEST

START_TEST(fashion_mnist_installed)
{
    if (access(DATA_DEFAULT_DIR "/train-images-idx3-ubyte.gz", R_OK) != 0) {
        printf("fashion_mnist_installed: %s absent, not checked\n", DATA_DEFAULT_DIR);
        return;
    }
    data_set tr, te;
    ck_assert_msg(data_load(NULL, "train", &tr) == 0, "%s", data_last_error());
    ck_assert_msg(data_load(NULL, "t10k", &te) == 0, "%s", data_last_error());
    ck_assert_int_eq(tr.n, 60000);
    ck_assert_int_eq(te.n, 10000);
    ck_assert_int_eq(tr.dim, 784);
    ck_assert_int_eq(te.rows, 28);
    /* The normalisation's constants are the training set's: mean ~0, std ~1 after it. */
    double s = 0, s2 = 0;
    size_t n = (size_t)tr.n * tr.dim;
    for (size_t i = 0; i < n; i++) {
        s += tr.x[i];
        s2 += (double)tr.x[i] * tr.x[i];
    }
    double mean = s / n, sd = sqrt(s2 / n - mean * mean);
    printf("fashion-mnist train after normalisation: mean %.4f, std %.4f\n", mean, sd);
    ck_assert_double_lt(fabs(mean), 0.001);
    ck_assert_double_lt(fabs(sd - 1), 0.001);
    int count[10] = {0};
    for (int i = 0; i < te.n; i++)
        count[te.y[i]]++;
    for (int c = 0; c < 10; c++)
        ck_assert_int_eq(count[c], 1000);
    data_set_free(&tr);
    data_set_free(&te);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Loader thread                                                                               */
/* ------------------------------------------------------------------------------------------ */

/* A synthetic set whose row i is (i, i + 0.5, ...) and label i % 10. */
static void synthetic_set(data_set *ds, int n, int dim)
{
    memset(ds, 0, sizeof *ds);
    ds->n = n;
    ds->rows = 1;
    ds->cols = ds->dim = dim;
    ds->x = malloc(sizeof(float) * (size_t)n * dim);
    ds->y = malloc((size_t)n);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < dim; j++)
            ds->x[(size_t)i * dim + j] = (float)i + 0.5f * j;
        ds->y[i] = (uint8_t)(i % 10);
    }
}

START_TEST(loader_matches_synchronous)
{
    data_set ds;
    synthetic_set(&ds, N, 5);
    data_sampler s, ref;
    int W = 3, rank = 1, A = 2, epochs = 3;
    ck_assert_int_eq(data_sampler_init(&s, N, G, W, rank, A, 1234), 0);
    ck_assert_int_eq(data_sampler_init(&ref, N, G, W, rank, A, 1234), 0);
    data_loader *ld;
    ck_assert_int_eq(data_loader_create(&ds, &s, 0, 0, epochs, 0, &ld), 0);
    float *x = malloc(sizeof(float) * (size_t)s.micro * ds.dim);
    uint8_t *y = malloc((size_t)s.micro);
    int64_t n = 0;
    for (int e = 0; e < epochs; e++) {
        data_sampler_set_epoch(&ref, e);
        for (int st = 0; st < data_sampler_steps(&ref); st++) {
            for (int k = 0; k < A; k++, n++) {
                const data_batch *b;
                ck_assert_int_eq(data_loader_next(ld, &b), 0);
                ck_assert_int_eq(b->epoch, e);
                ck_assert_int_eq(b->step, st);
                ck_assert_int_eq(b->global_step, (int64_t)e * data_sampler_steps(&ref) + st);
                ck_assert_int_eq(b->micro, k);
                ck_assert_int_eq(b->count, s.micro);
                const int32_t *idx = data_sampler_micro(&ref, st, k);
                data_gather(&ds, idx, s.micro, x, y);
                ck_assert_int_eq(memcmp(b->index, idx, sizeof(int32_t) * s.micro), 0);
                ck_assert_int_eq(memcmp(b->x, x, sizeof(float) * s.micro * ds.dim), 0);
                ck_assert_int_eq(memcmp(b->y, y, (size_t)s.micro), 0);
            }
        }
    }
    const data_batch *b;
    ck_assert_int_eq(data_loader_next(ld, &b), 1);
    ck_assert_int_eq(data_loader_next(ld, &b), 1);
    ck_assert_int_eq(n, (int64_t)epochs * (N / G) * A);
    data_loader_free(ld);

    /* max_steps: 25 steps cross into the second epoch, then stop. */
    ck_assert_int_eq(data_loader_create(&ds, &s, 0, 0, epochs, 25, &ld), 0);
    n = 0;
    int last_epoch = -1;
    while (data_loader_next(ld, &b) == 0) {
        n++;
        last_epoch = b->epoch;
    }
    ck_assert_int_eq(n, 25 * A);
    ck_assert_int_eq(last_epoch, 1);
    data_loader_free(ld);

    /* Freed before the end, with the thread waiting on a full slot: no hang. */
    ck_assert_int_eq(data_loader_create(&ds, &s, 0, 0, epochs, 0, &ld), 0);
    ck_assert_int_eq(data_loader_next(ld, &b), 0);
    data_loader_free(ld);
    ck_assert_int_eq(data_loader_create(&ds, &s, 0, 0, epochs, 0, &ld), 0);
    data_loader_free(ld);
    data_loader_free(NULL);

    free(x);
    free(y);
    data_sampler_free(&s);
    data_sampler_free(&ref);
    data_set_free(&ds);
}
END_TEST

/*
 * A loader started mid-run, as a resumed ddp-train starts it: from step 5 of epoch 1 on, at
 * another world size and accumulation count than the run that saved the position (W = 3,
 * A = 2 there), every rank's micro-batches are slices of the same global batches as a world-1
 * sampler's, and max_steps still counts from epoch 0's step 0.
 */
START_TEST(loader_starts_mid_run)
{
    data_set ds;
    synthetic_set(&ds, N, 5);
    data_sampler ref;
    ck_assert_int_eq(data_sampler_init(&ref, N, G, 1, 0, 1, 1234), 0);
    int spe = data_sampler_steps(&ref), epochs = 3, E0 = 1, S0 = 5;
    int64_t max_steps = (int64_t)2 * spe + 7; /* ends at step 7 of epoch 2 */
    int W = 2, A = 4;
    for (int rank = 0; rank < W; rank++) {
        data_sampler s;
        ck_assert_int_eq(data_sampler_init(&s, N, G, W, rank, A, 1234), 0);
        data_loader *ld;
        ck_assert_int_eq(data_loader_create(&ds, &s, E0, S0, epochs, max_steps, &ld), 0);
        int64_t g = (int64_t)E0 * spe + S0, n = 0;
        const data_batch *b;
        while (data_loader_next(ld, &b) == 0) {
            int k = (int)(n % A);
            ck_assert_int_eq(b->global_step, g);
            ck_assert_int_eq(b->epoch, (int)(g / spe));
            ck_assert_int_eq(b->step, (int)(g % spe));
            ck_assert_int_eq(b->micro, k);
            if (ref.epoch != b->epoch)
                data_sampler_set_epoch(&ref, b->epoch);
            const int32_t *glob = data_sampler_global(&ref, b->step);
            ck_assert_int_eq(memcmp(b->index, glob + (size_t)rank * (G / W) + (size_t)k * s.micro,
                                    sizeof(int32_t) * (size_t)s.micro),
                             0);
            if (++n % A == 0)
                g++;
        }
        ck_assert_int_eq(g, max_steps);
        ck_assert_int_eq(n, (max_steps - (int64_t)E0 * spe - S0) * A);
        data_loader_free(ld);

        /* A position past the epoch's steps, or before epoch 0, is refused. */
        ck_assert_int_eq(data_loader_create(&ds, &s, 0, spe, epochs, 0, &ld), -EINVAL);
        ck_assert_ptr_nonnull(strstr(data_last_error(), "no step"));
        ck_assert_int_eq(data_loader_create(&ds, &s, -1, 0, epochs, 0, &ld), -EINVAL);
        data_sampler_free(&s);
    }
    data_sampler_free(&ref);
    data_set_free(&ds);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Text                                                                                        */
/* ------------------------------------------------------------------------------------------ */

static void write_file(const char *name, const char *text, size_t len)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(text, 1, len, f), len);
    ck_assert_int_eq(fclose(f), 0);
}

/*
 * The corpus of the text tests, in tmpdir: "A", 21 fortune records of 10 bytes ("A07-xyz\n%\n"),
 * whose 95% point (byte 199) lies inside the last record but one, so the cut is at the last
 * record's start, 200; "B", 100 bytes in lines of 10 without a "%" line, cut at byte 95; and
 * what a directory listing skips: an index "A.dat", a link "B.u8", a hidden file and a
 * subdirectory. The training stream is A[0, 200) B[0, 95) (295 bytes), the validation stream
 * A[200, 210) B[95, 100) (15 bytes). Writes both streams to train[295] and test[15].
 */
static void text_corpus(char *train, char *test)
{
    char a[211], b[101];
    for (int i = 0; i < 21; i++)
        snprintf(a + 10 * i, 11, "A%02d-xyz\n%%\n", i);
    for (int i = 0; i < 100; i++)
        b[i] = i % 10 == 9 ? '\n' : (char)('a' + i % 26);
    write_file("A", a, 210);
    write_file("B", b, 100);
    write_file("A.dat", "index", 5);
    write_file(".hidden", "hidden", 6);
    char path[256], sub[256];
    snprintf(path, sizeof path, "%s/B.u8", tmpdir);
    ck_assert_int_eq(symlink("B", path), 0);
    snprintf(sub, sizeof sub, "%s/sub", tmpdir);
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    write_file("sub/C", "not read", 8);
    memcpy(train, a, 200);
    memcpy(train + 200, b, 95);
    memcpy(test, a + 200, 10);
    memcpy(test + 10, b + 95, 5);
}

/* Window i of a text set is bytes [i * T, i * T + T + 1) of its stream: inputs, then targets
 * shifted by one. */
static void check_windows(const data_set *ds, const char *stream, size_t len, int T)
{
    ck_assert_int_eq(ds->n, (int)((len - 1) / T));
    ck_assert_int_eq(ds->seq, T);
    ck_assert_int_eq(ds->dim, T);
    ck_assert_ptr_null(ds->x);
    ck_assert_ptr_null(ds->y);
    for (int i = 0; i < ds->n; i++)
        ck_assert_int_eq(memcmp(ds->tok + (size_t)i * (T + 1), stream + (size_t)i * T, T + 1), 0);
}

START_TEST(text_split_and_windows)
{
    make_tmpdir();
    char train[295], test[15];
    text_corpus(train, test);
    enum { T = 7 };
    data_set tr, te;
    const char *dir[] = {tmpdir};
    ck_assert_msg(data_load_text(dir, 1, T, "train", &tr) == 0, "%s", data_last_error());
    ck_assert_msg(data_load_text(dir, 1, T, "test", &te) == 0, "%s", data_last_error());
    check_windows(&tr, train, sizeof train, T); /* 42 windows */
    check_windows(&te, test, sizeof test, T);   /* 2 windows */
    ck_assert_int_eq(tr.n, 42);
    ck_assert_int_eq(te.n, 2);
    /* Consecutive windows share one byte: window 1's first is window 0's last target. */
    ck_assert_int_eq(tr.tok[T], tr.tok[T + 1]);
    data_set_free(&tr);
    data_set_free(&te);

    /* The files named one by one, as the directory lists them: the same streams. */
    char pa[256], pb[256];
    snprintf(pa, sizeof pa, "%s/A", tmpdir);
    snprintf(pb, sizeof pb, "%s/B", tmpdir);
    const char *files[] = {pa, pb};
    ck_assert_int_eq(data_load_text(files, 2, T, "train", &tr), 0);
    check_windows(&tr, train, sizeof train, T);
    data_set_free(&tr);
    /* One window needs T + 1 bytes: the 15 validation bytes hold one of 14, none of 15. */
    ck_assert_int_eq(data_load_text(dir, 1, 14, "test", &te), 0);
    ck_assert_int_eq(te.n, 1);
    data_set_free(&te);
    ck_assert_int_eq(data_load_text(dir, 1, 15, "test", &te), -EINVAL);
    ck_assert_ptr_nonnull(strstr(data_last_error(), "validation text is 15 bytes"));
    remove_tmpdir();
}
END_TEST

START_TEST(text_bad_input)
{
    make_tmpdir();
    char train[295], test[15];
    text_corpus(train, test);
    data_set ds = {0};
    const char *dir[] = {tmpdir};
    ck_assert_int_eq(data_load_text(dir, 1, 0, "train", &ds), -EINVAL);
    ck_assert_ptr_nonnull(strstr(data_last_error(), "context length 0"));
    ck_assert_int_eq(data_load_text(dir, 1, 65537, "train", &ds), -EINVAL);
    ck_assert_int_eq(data_load_text(dir, 1, 8, "t10k", &ds), -EINVAL);
    ck_assert_ptr_nonnull(strstr(data_last_error(), "t10k"));
    char path[256];
    snprintf(path, sizeof path, "%s/missing", tmpdir);
    const char *one[] = {path};
    ck_assert_int_eq(data_load_text(one, 1, 8, "train", &ds), -ENOENT);
    ck_assert_ptr_nonnull(strstr(data_last_error(), path));
    snprintf(path, sizeof path, "%s/fifo", tmpdir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    ck_assert_int_eq(data_load_text(one, 1, 8, "train", &ds), -EINVAL);
    ck_assert_ptr_nonnull(strstr(data_last_error(), "not a regular file (a FIFO)"));
    ck_assert_int_eq(ds.n, 0); /* untouched on failure */
    remove_tmpdir();
}
END_TEST

/*
 * Text through the sampler and the loader thread: a batch's tok rows are the sampled windows;
 * every epoch draws another order of the same windows; a loader started mid-epoch (as a resumed
 * run starts it, here at another world size) hands out the windows the whole run would have.
 */
START_TEST(text_loader_shuffles_and_resumes)
{
    make_tmpdir();
    char stream[295], test[15];
    text_corpus(stream, test);
    enum { T = 3, GB = 8 };
    data_set ds; /* 93 windows of 4 bytes: 11 steps of 8 per epoch */
    write_file("t", stream, sizeof stream);
    char path[256];
    snprintf(path, sizeof path, "%s/t", tmpdir);
    const char *paths[] = {path};
    /* The cut of a file without "%" lines is at 95%: its first 280 bytes train. */
    ck_assert_int_eq(data_load_text(paths, 1, T, "train", &ds), 0);
    ck_assert_int_eq(ds.n, (280 - 1) / T);
    int epochs = 2;

    /* The whole run at world 1, every batch's windows kept, as a resumed run must see them. */
    data_sampler s1;
    ck_assert_int_eq(data_sampler_init(&s1, ds.n, GB, 1, 0, 1, 7), 0);
    int spe = data_sampler_steps(&s1);
    ck_assert_int_eq(spe, ds.n / GB);
    size_t row = T + 1, per_step = GB * row;
    uint8_t *all = malloc((size_t)epochs * spe * per_step);
    int32_t *order = malloc(sizeof(int32_t) * (size_t)epochs * spe * GB);
    data_loader *ld;
    ck_assert_int_eq(data_loader_create(&ds, &s1, 0, 0, epochs, 0, &ld), 0);
    const data_batch *b;
    int64_t g = 0;
    while (data_loader_next(ld, &b) == 0) {
        ck_assert_ptr_null(b->x);
        ck_assert_ptr_null(b->y);
        for (int i = 0; i < b->count; i++)
            ck_assert_int_eq(memcmp(b->tok + i * row, stream + (size_t)b->index[i] * T, row), 0);
        memcpy(all + g * per_step, b->tok, per_step);
        memcpy(order + g * GB, b->index, sizeof(int32_t) * GB);
        g++;
    }
    ck_assert_int_eq(g, (int64_t)epochs * spe);
    data_loader_free(ld);
    /* Each epoch takes distinct windows, and the two epochs' orders differ. */
    int seen[2][93] = {{0}};
    for (int e = 0; e < epochs; e++)
        for (int i = 0; i < spe * GB; i++)
            ck_assert_int_eq(seen[e][order[e * spe * GB + i]]++, 0);
    ck_assert_int_ne(memcmp(order, order + spe * GB, sizeof(int32_t) * spe * GB), 0);

    /* Resumed at step 5 of epoch 0 with 2 ranks and 2 micro-steps: rank r's micro-batch k of
     * a step is rows [r * 4 + k * 2, + 2) of the whole run's step. */
    for (int rank = 0; rank < 2; rank++) {
        data_sampler s2;
        ck_assert_int_eq(data_sampler_init(&s2, ds.n, GB, 2, rank, 2, 7), 0);
        ck_assert_int_eq(data_loader_create(&ds, &s2, 0, 5, epochs, 0, &ld), 0);
        int64_t n = 0;
        while (data_loader_next(ld, &b) == 0) {
            int64_t step = 5 + n / 2;
            int k = (int)(n % 2);
            ck_assert_int_eq(b->global_step, step);
            ck_assert_int_eq(
                memcmp(b->tok, all + step * per_step + (rank * 4 + k * 2) * row, 2 * row), 0);
            n++;
        }
        ck_assert_int_eq(n, ((int64_t)epochs * spe - 5) * 2);
        data_loader_free(ld);
        data_sampler_free(&s2);
    }
    free(all);
    free(order);
    data_sampler_free(&s1);
    data_set_free(&ds);
    remove_tmpdir();
}
END_TEST

/* Debian's fortunes package, when installed: both splits load, the validation text is about
 * 5% of the whole. */
START_TEST(fortunes_installed)
{
    if (access(DATA_TEXT_DEFAULT_DIR "/fortunes", R_OK) != 0) {
        printf("fortunes_installed: %s absent, not checked\n", DATA_TEXT_DEFAULT_DIR);
        return;
    }
    data_set tr, te;
    ck_assert_msg(data_load_text(NULL, 0, 128, "train", &tr) == 0, "%s", data_last_error());
    ck_assert_msg(data_load_text(NULL, 0, 128, "test", &te) == 0, "%s", data_last_error());
    double share = (double)te.n / (tr.n + te.n);
    printf("fortunes at context 128: %d training windows, %d validation windows (%.2f%%)\n", tr.n,
           te.n, 100 * share);
    ck_assert_double_gt(share, 0.04);
    ck_assert_double_lt(share, 0.06);
    data_set_free(&tr);
    data_set_free(&te);
}
END_TEST

static Suite *data_suite(void)
{
    Suite *s = suite_create("data");
    check_tcase(s, "sampler", 30, sampler_global_batch_independent_of_world,
                sampler_disjoint_and_covering, sampler_epoch_reseeding, sampler_bad_configurations);
    check_tcase(s, "idx", 30, idx_good_files, idx_bad_files, idx_not_regular, load_bad_splits,
                fashion_mnist_installed, pixels_round_trip);
    check_tcase(s, "loader", 30, loader_matches_synchronous, loader_starts_mid_run);
    check_tcase(s, "text", 30, text_split_and_windows, text_bad_input,
                text_loader_shuffles_and_resumes, fortunes_installed);
    return s;
}

int main(void)
{
    return check_run(data_suite());
}
