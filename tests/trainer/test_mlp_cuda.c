/*
 * mlp_cuda (worker/trainer/mlp_cuda.h) against mlp (worker/trainer/mlp.h), the host reference: the same
 * parameters, the same batch gathered on the device (mlp_cuda_data) and on the host, then the
 * loss, correct count, probabilities and every parameter gradient compared; for f32 and for
 * bf16 (against mlp.c's emulation of the device's rounding). Exits 77 without a GPU.
 *
 * Tolerances. f32: both sides compute in f32 with f32 accumulation, differing only in the
 * order of the sums (cuBLAS's against OpenBLAS's kernels, 784-term dot products): relative
 * differences of order 1e-6, so the loss must agree within 1e-5 relative, the probabilities
 * within 1e-5 absolute and each gradient within 1e-4 of the largest. bf16: both round the
 * same values to bf16 at the same places, but a different summation order can put a value on
 * the other side of a bf16 rounding boundary (2^-8 relative), which then propagates: loss
 * within 1e-3 relative, probabilities within 1e-2, gradients within 2e-2 of the largest,
 * correct counts within 1 row.
 *
 * The shapes are odd on purpose (45 rows, 100 hidden units): leading dimensions that are no
 * multiple of 8 take cuBLAS's unaligned kernels, and a product with m, n or k swapped for
 * another cannot pass. Backward runs twice on both sides before the gradients are compared, so
 * that a product that overwrites its output (beta = 0) instead of adding to it fails.
 *
 * Also checked: the device accumulators (two passes without stats add up to twice the loss);
 * four batches enqueued back to back through the data set's two index slots, the host's index
 * array rewritten between them, add up to the host's losses; B = 0 runs the hooks only, a
 * forward refuses more rows than max_batch, and the data set refuses rows out of range.
 */
#include <check.h>

#include <cuda_runtime_api.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "data.h"
#include "mlp.h"
#include "mlp_cuda.h"
#include "rng.h"
#include "check_main.h"

enum { B = 45, MAX_L = 4, N = 200, DIM = 784 };

static void *stream;

/* The parameters on the host (f32 and bf16) and on the device, and the hooks of both. */
typedef struct model {
    mlp_config cfg;
    int L;
    float *W[MAX_L], *b[MAX_L], *dW[MAX_L], *db[MAX_L];   /* host */
    uint16_t *W16[MAX_L], *b16[MAX_L];                    /* host, bf16 */
    void *dWp[MAX_L], *dbp[MAX_L];                        /* device: W, b (f32 or bf16) */
    float *ddW[MAX_L], *ddb[MAX_L];                       /* device gradients */
    int begins, ends;
} model;

static size_t nW(const model *m, int l)
{
    return (size_t)mlp_layer_out(&m->cfg, l) * mlp_layer_in(&m->cfg, l);
}

static size_t nb(const model *m, int l)
{
    return (size_t)mlp_layer_out(&m->cfg, l);
}

static void model_init(model *m, const mlp_config *c)
{
    memset(m, 0, sizeof *m);
    m->cfg = *c;
    m->L = mlp_num_linear(c);
    ck_assert_int_le(m->L, MAX_L);
    size_t es = c->bf16 ? 2 : 4;
    for (int l = 0; l < m->L; l++) {
        size_t w = nW(m, l), o = nb(m, l);
        m->W[l] = malloc(w * 4);
        m->b[l] = malloc(o * 4);
        m->dW[l] = calloc(w, 4);
        m->db[l] = calloc(o, 4);
        m->W16[l] = malloc(w * 2);
        m->b16[l] = malloc(o * 2);
        mlp_init_uniform(m->W[l], w, mlp_layer_in(c, l), 7, 2 * l);
        mlp_init_uniform(m->b[l], o, mlp_layer_in(c, l), 7, 2 * l + 1);
        for (size_t i = 0; i < w; i++)
            m->W16[l][i] = bf16_from_f32(m->W[l][i]);
        for (size_t i = 0; i < o; i++)
            m->b16[l][i] = bf16_from_f32(m->b[l][i]);
        ck_assert_int_eq(cudaMalloc(&m->dWp[l], w * es), cudaSuccess);
        ck_assert_int_eq(cudaMalloc(&m->dbp[l], o * es), cudaSuccess);
        ck_assert_int_eq(cudaMalloc((void **)&m->ddW[l], w * 4), cudaSuccess);
        ck_assert_int_eq(cudaMalloc((void **)&m->ddb[l], o * 4), cudaSuccess);
        ck_assert_int_eq(cudaMemcpy(m->dWp[l], c->bf16 ? (void *)m->W16[l] : (void *)m->W[l],
                                    w * es, cudaMemcpyHostToDevice),
                         cudaSuccess);
        ck_assert_int_eq(cudaMemcpy(m->dbp[l], c->bf16 ? (void *)m->b16[l] : (void *)m->b[l],
                                    o * es, cudaMemcpyHostToDevice),
                         cudaSuccess);
        ck_assert_int_eq(cudaMemset(m->ddW[l], 0, w * 4), cudaSuccess);
        ck_assert_int_eq(cudaMemset(m->ddb[l], 0, o * 4), cudaSuccess);
    }
}

static void model_free(model *m)
{
    for (int l = 0; l < m->L; l++) {
        free(m->W[l]);
        free(m->b[l]);
        free(m->dW[l]);
        free(m->db[l]);
        free(m->W16[l]);
        free(m->b16[l]);
        cudaFree(m->dWp[l]);
        cudaFree(m->dbp[l]);
        cudaFree(m->ddW[l]);
        cudaFree(m->ddb[l]);
    }
}

static int host_begin(void *arg, int l, int backward, mlp_layer *io)
{
    model *m = arg;
    if (m->cfg.bf16) {
        io->W16 = m->W16[l];
        io->b16 = m->b16[l];
    } else {
        io->W = m->W[l];
        io->b = m->b[l];
    }
    io->dW = backward ? m->dW[l] : NULL;
    io->db = backward ? m->db[l] : NULL;
    return 0;
}

static int dev_begin(void *arg, int l, int backward, mlp_layer *io)
{
    model *m = arg;
    m->begins++;
    if (m->cfg.bf16) {
        io->W16 = m->dWp[l];
        io->b16 = m->dbp[l];
    } else {
        io->W = m->dWp[l];
        io->b = m->dbp[l];
    }
    io->dW = backward ? m->ddW[l] : NULL;
    io->db = backward ? m->ddb[l] : NULL;
    return 0;
}

static int dev_end(void *arg, int l, int backward)
{
    (void)l, (void)backward;
    ((model *)arg)->ends++;
    return 0;
}

/* max |a - b| over n device floats `dev` against host `host`; *amax gets max |host|. */
static double max_diff(const float *dev, const float *host, size_t n, double *amax)
{
    float *got = malloc(n * 4);
    ck_assert_int_eq(mlp_cuda_to_host(got, dev, n * 4, stream), 0);
    double d = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)got[i] - host[i]));
        if (amax)
            *amax = fmax(*amax, fabs(host[i]));
    }
    free(got);
    return d;
}

/*
 * Batch k of the synthetic data set (pix (N, DIM), lab (N)): B rows in a scattered order,
 * their indices into idx and, as the host's loader gathers them, their inputs into x (B, DIM)
 * and labels into y (B).
 */
static void make_batch(int k, const uint8_t *pix, const uint8_t *lab, int32_t *idx, float *x,
                       uint8_t *y)
{
    for (int i = 0; i < B; i++) {
        idx[i] = (int32_t)((i * 37 + 11 + 53 * k) % N);
        for (int j = 0; j < DIM; j++)
            x[i * DIM + j] = data_normalize(pix[(size_t)idx[i] * DIM + j]);
        y[i] = lab[idx[i]];
    }
}

static void compare(int bf16)
{
    mlp_config c = {.in_dim = DIM, .hidden = 100, .layers = 2, .classes = 10, .bf16 = bf16};
    model m;
    model_init(&m, &c);

    /* A synthetic data set of N images. */
    rng r;
    rng_init(&r, 3, 0);
    uint8_t *pix = malloc((size_t)N * DIM), lab[N];
    for (size_t i = 0; i < (size_t)N * DIM; i++)
        pix[i] = (uint8_t)rng_below(&r, 256);
    for (int i = 0; i < N; i++)
        lab[i] = (uint8_t)rng_below(&r, 10);
    int32_t idx[B];
    float *x = malloc(sizeof(float) * B * DIM);
    uint8_t y[B];
    make_batch(0, pix, lab, idx, x, y);

    mlp *host;
    mlp_cuda *dev;
    mlp_cuda_data *data;
    ck_assert_int_eq(mlp_create(&c, B, &host), 0);
    ck_assert_msg(mlp_cuda_create(&c, B, stream, &dev) == 0, "%s", mlp_cuda_last_error());
    ck_assert_msg(mlp_cuda_data_create(pix, lab, N, DIM, B, bf16, stream, &data) == 0, "%s",
                  mlp_cuda_last_error());
    const void *dx;
    const uint8_t *dy;
    ck_assert_int_eq(mlp_cuda_data_batch(data, idx, 0, B, &dx, &dy), 0);

    mlp_hooks hh = {.begin = host_begin, .arg = &m};
    mlp_hooks dh = {.begin = dev_begin, .end = dev_end, .arg = &m};
    mlp_stats hs, ds;
    ck_assert_int_eq(mlp_forward(host, &hh, x, y, B, &hs), 0);
    ck_assert_msg(mlp_cuda_forward(dev, &dh, dx, dy, B, &ds) == 0, "%s", mlp_cuda_last_error());
    float probs[B * 10];
    ck_assert_int_eq(mlp_cuda_output(dev, probs), 0);
    double pd = 0;
    for (int i = 0; i < B * 10; i++)
        pd = fmax(pd, fabs((double)probs[i] - mlp_output(host)[i]));
    double rel = fabs(ds.loss_sum - hs.loss_sum) / hs.loss_sum;
    printf("%s: loss %.7f (device) %.7f (host), relative %.2e; correct %d, %d; probabilities "
           "differ by %.2e\n",
           bf16 ? "bf16" : "f32", ds.loss_sum, hs.loss_sum, rel, ds.correct, hs.correct, pd);
    ck_assert_double_le(rel, bf16 ? 1e-3 : 1e-5);
    ck_assert_double_le(pd, bf16 ? 1e-2 : 1e-5);
    ck_assert_int_le(abs(ds.correct - hs.correct), bf16 ? 1 : 0);

    for (int pass = 0; pass < 2; pass++) { /* the second adds onto the first */
        ck_assert_int_eq(mlp_backward(host, &hh, 1.0f / B), 0);
        ck_assert_msg(mlp_cuda_backward(dev, &dh, 1.0f / B) == 0, "%s", mlp_cuda_last_error());
    }
    double gd = 0, gmax = 0;
    for (int l = 0; l < m.L; l++) {
        gd = fmax(gd, max_diff(m.ddW[l], m.dW[l], nW(&m, l), &gmax));
        gd = fmax(gd, max_diff(m.ddb[l], m.db[l], nb(&m, l), &gmax));
    }
    printf("%s: gradients differ by %.2e of the largest (%.3g)\n", bf16 ? "bf16" : "f32",
           gd / gmax, gmax);
    ck_assert_double_gt(gmax, 0);
    ck_assert_double_le(gd, (bf16 ? 2e-2 : 1e-4) * gmax);

    /* Accumulated on the device: two passes, then one take. */
    mlp_stats acc;
    ck_assert_int_eq(mlp_cuda_forward(dev, &dh, dx, dy, B, NULL), 0);
    ck_assert_int_eq(mlp_cuda_forward(dev, &dh, dx, dy, B, NULL), 0);
    ck_assert_int_eq(mlp_cuda_stats_take(dev, &acc), 0);
    ck_assert_double_eq_tol(acc.loss_sum, 2 * ds.loss_sum, 1e-9 * ds.loss_sum);
    ck_assert_int_eq(acc.correct, 2 * ds.correct);
    ck_assert_int_eq(mlp_cuda_stats_take(dev, &acc), 0);
    ck_assert_double_eq(acc.loss_sum, 0);

    /* Four batches back to back, the host not waiting for the device between them. */
    double hsum = 0;
    int hcorrect = 0;
    for (int k = 1; k <= 4; k++) {
        make_batch(k, pix, lab, idx, x, y);
        ck_assert_int_eq(mlp_forward(host, &hh, x, y, B, &hs), 0);
        hsum += hs.loss_sum;
        hcorrect += hs.correct;
        ck_assert_int_eq(mlp_cuda_data_batch(data, idx, 0, B, &dx, &dy), 0);
        ck_assert_int_eq(mlp_cuda_forward(dev, &dh, dx, dy, B, NULL), 0);
    }
    ck_assert_int_eq(mlp_cuda_stats_take(dev, &acc), 0);
    rel = fabs(acc.loss_sum - hsum) / hsum;
    printf("%s: 4 batches: loss %.7f (device) %.7f (host), relative %.2e; correct %d, %d\n",
           bf16 ? "bf16" : "f32", acc.loss_sum, hsum, rel, acc.correct, hcorrect);
    ck_assert_double_le(rel, bf16 ? 1e-3 : 1e-5);
    ck_assert_int_le(abs(acc.correct - hcorrect), bf16 ? 4 : 0);

    /* B = 0: hooks only. Too many rows, rows out of range: refused. */
    m.begins = m.ends = 0;
    ck_assert_int_eq(mlp_cuda_forward(dev, &dh, NULL, NULL, 0, NULL), 0);
    ck_assert_int_eq(m.begins, m.L);
    ck_assert_int_eq(m.ends, m.L);
    ck_assert_int_eq(mlp_cuda_forward(dev, &dh, dx, dy, B + 1, NULL), -EINVAL);
    int32_t bad[2] = {0, N};
    ck_assert_int_eq(mlp_cuda_data_batch(data, bad, 0, 2, &dx, &dy), -EINVAL);
    ck_assert_int_eq(mlp_cuda_data_batch(data, NULL, N - 1, 2, &dx, &dy), -EINVAL);

    mlp_cuda_data_free(data);
    mlp_cuda_free(dev);
    mlp_free(host);
    model_free(&m);
    free(x);
    free(pix);
}

START_TEST(f32_against_host)
{
    compare(0);
}
END_TEST

START_TEST(bf16_against_host)
{
    compare(1);
}
END_TEST

int main(void)
{
    if (mlp_cuda_device_count() == 0) {
        printf("SKIP: no CUDA device (%s)\n",
               mlp_cuda_built() ? "none visible" : "built without CUDA");
        return 77;
    }
    char name[256];
    if (mlp_cuda_open(0, &stream, name, sizeof name) < 0) {
        printf("mlp_cuda_open: %s\n", mlp_cuda_last_error());
        return EXIT_FAILURE;
    }
    printf("GPU 0: %s\n", name);
    Suite *s = suite_create("mlp_cuda");
    check_tcase(s, "against the host", 60, f32_against_host, bf16_against_host);
    /* No fork: a CUDA context does not survive fork(). */
    int rc = check_run_fork(s, CK_NOFORK);
    mlp_cuda_close(stream);
    return rc;
}
