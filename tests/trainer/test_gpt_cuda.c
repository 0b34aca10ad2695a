/*
 * gpt_cuda (worker/trainer/gpt_cuda.h) against gpt (worker/trainer/gpt.h), the host reference:
 * the same parameters and tokens, then the loss, correct count, probabilities and every
 * parameter gradient compared tensor by tensor, for f32 and for bf16 (against gpt.c's rounding
 * at the same places), and with --recompute. Exits 77 without a GPU.
 *
 * Each tensor's gradient isolates a chain of kernels: ln_f's the final LayerNorm's backward
 * (weight: its x-hat, bias: the column sums); a block's mlp.c_proj the GELU forward and the
 * bias sums, mlp.c_fc GELU's backward, ln_2 the LayerNorm backward through the MLP,
 * attn.c_proj the attention forward (softmax, per-head products), attn.c_attn the softmax's
 * backward and the per-head products of backward, ln_1 the LayerNorm backward through
 * attention; emb.wpe the lookup's backward by position, emb.wte the tied projection's gradient
 * (dwte) plus the lookup's scatter by token. A failure names the tensor.
 *
 * Tolerances. f32: the kernels sum in gpt.c's order without fused multiply-adds, so they differ
 * from the host only in the exponential (CUDA's expf against gpt.c's polynomial, a few ulp)
 * and the products in the order of their sums: relative differences of order 1e-6, so the loss
 * agrees within 1e-5 relative, the probabilities within 1e-5 absolute, each tensor's gradient
 * within 1e-4 of its largest element. bf16: a different summation order can put a value on the
 * other side of a bf16 rounding boundary (2^-8 relative), which then propagates: loss within
 * 2e-3 relative, probabilities within 1e-2, each gradient within 3e-2 of its largest element.
 *
 * The shapes are odd on purpose: 5 sequences of 13 tokens (len < T = 16, so the pass's N is not
 * the model's context), width 36 in 3 heads of 12, vocabulary 97 (a token beyond it is
 * refused): leading dimensions that are no multiple of 8, and a product with m, n or k swapped
 * for another cannot pass. Forward and backward run twice on both sides before the gradients are
 * compared, so that a product or kernel that overwrites its output instead of adding to it fails.
 *
 * Built twice: against CUDA (test gpt-cuda, on a GPU; 77 without one), and with
 * DDP_CUDA_EMULATE against tests/trainer/cuda_emu (test gpt-cuda-emu, on any machine: the same
 * device code run on the host, under AddressSanitizer, every buffer freed at the end).
 *
 * Also checked: correct counts with each row's last target at the host's argmax; two passes
 * without stats accumulate on the device to twice the loss; the logits
 * of a forward without targets (generation's) against the host's; B = 0 runs every hook; a
 * forward refuses more rows than the room, a token beyond the vocabulary, and a backward
 * without a forward with targets.
 */
#include <check.h>

#include <cuda_runtime_api.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "gpt.h"
#include "gpt_cuda.h"
#include "mlp_cuda.h"
#include "check_main.h"

enum { B = 5, LEN = 13, T = 16, W = 36, H = 3, L = 2, V = 97, LD = T + 1 };
enum { MAX_UNITS = L + 2 };

static void *stream;

/* The parameters on the host (f32 and bf16) and on the device, and their gradients. */
typedef struct params {
    gpt_config cfg;
    int nunits, np[MAX_UNITS];
    size_t count[MAX_UNITS][GPT_BLOCK_PARAMS];
    char name[MAX_UNITS][GPT_BLOCK_PARAMS][64];
    float *p[MAX_UNITS][GPT_BLOCK_PARAMS], *g[MAX_UNITS][GPT_BLOCK_PARAMS];
    uint16_t *p16[MAX_UNITS][GPT_BLOCK_PARAMS];
    void *dp[MAX_UNITS][GPT_BLOCK_PARAMS]; /* device: f32 or bf16 */
    float *dg[MAX_UNITS][GPT_BLOCK_PARAMS];
    int begins, ends, bad_order;
    int last_unit; /* order check: the hooks' begin/end pairs nest nothing */
} params;

static void params_init(params *m, const gpt_config *c)
{
    memset(m, 0, sizeof *m);
    m->cfg = *c;
    m->nunits = gpt_num_units(c);
    m->last_unit = -1;
    ck_assert_int_le(m->nunits, MAX_UNITS);
    size_t es = c->bf16 ? 2 : 4;
    int index = 0;
    for (int u = 0; u < m->nunits; u++) {
        char un[32];
        m->np[u] = gpt_unit(c, u, un);
        for (int i = 0; i < m->np[u]; i++, index++) {
            char pn[32];
            int64_t sh[2];
            int nd = gpt_param(c, u, i, pn, sh);
            size_t n = (size_t)sh[0] * (nd == 2 ? (size_t)sh[1] : 1);
            snprintf(m->name[u][i], sizeof m->name[u][i], "%s.%s", un, pn);
            m->count[u][i] = n;
            m->p[u][i] = malloc(n * 4);
            m->g[u][i] = calloc(n, 4);
            m->p16[u][i] = malloc(n * 2);
            gpt_init_param(c, u, i, 11, (uint64_t)index, m->p[u][i], n);
            /* LayerNorm weights and biases away from 1 and 0, so that a swapped weight and bias,
               or a missing bias, shows */
            if (nd == 1)
                for (size_t k = 0; k < n; k++)
                    m->p[u][i][k] += 0.1f * sinf((float)(k + 7 * index));
            for (size_t k = 0; k < n; k++) {
                m->p16[u][i][k] = bf16_from_f32(m->p[u][i][k]);
                if (c->bf16) /* the host widens what the hook hands over: the same values */
                    m->p[u][i][k] = bf16_to_f32(m->p16[u][i][k]);
            }
            ck_assert_int_eq(cudaMalloc(&m->dp[u][i], n * es), cudaSuccess);
            ck_assert_int_eq(cudaMalloc((void **)&m->dg[u][i], n * 4), cudaSuccess);
            ck_assert_int_eq(cudaMemcpy(m->dp[u][i],
                                        c->bf16 ? (void *)m->p16[u][i] : (void *)m->p[u][i], n * es,
                                        cudaMemcpyHostToDevice),
                             cudaSuccess);
            ck_assert_int_eq(cudaMemset(m->dg[u][i], 0, n * 4), cudaSuccess);
        }
    }
}

static void params_free(params *m)
{
    for (int u = 0; u < m->nunits; u++)
        for (int i = 0; i < m->np[u]; i++) {
            free(m->p[u][i]);
            free(m->g[u][i]);
            free(m->p16[u][i]);
            cudaFree(m->dp[u][i]);
            cudaFree(m->dg[u][i]);
        }
}

static int host_begin(void *arg, int u, int backward, void **p, float **g)
{
    params *m = arg;
    for (int i = 0; i < m->np[u]; i++) {
        p[i] = m->cfg.bf16 ? (void *)m->p16[u][i] : (void *)m->p[u][i];
        if (backward)
            g[i] = m->g[u][i];
    }
    return 0;
}

static int host_end(void *arg, int u, int backward)
{
    (void)arg, (void)u, (void)backward;
    return 0;
}

static int dev_begin(void *arg, int u, int backward, void **p, float **g)
{
    params *m = arg;
    m->begins++;
    if (m->last_unit != -1)
        m->bad_order++;
    m->last_unit = u;
    for (int i = 0; i < m->np[u]; i++) {
        p[i] = m->dp[u][i];
        if (backward)
            g[i] = m->dg[u][i];
    }
    return 0;
}

static int dev_end(void *arg, int u, int backward)
{
    params *m = arg;
    (void)backward;
    m->ends++;
    if (m->last_unit != u)
        m->bad_order++;
    m->last_unit = -1;
    return 0;
}

/* B sequences of LD bytes below V. */
static void make_tokens(uint8_t *tok, int k)
{
    for (int i = 0; i < B * LD; i++)
        tok[i] = (uint8_t)((i * 31 + 7 * k + (i * i) % 13) % V);
}

static void compare(int bf16, int recompute)
{
    const char *what = bf16        ? (recompute ? "bf16 recompute" : "bf16")
                       : recompute ? "f32 recompute"
                                   : "f32";
    gpt_config c = {.vocab = V,
                    .seq = T,
                    .width = W,
                    .layers = L,
                    .heads = H,
                    .bf16 = bf16,
                    .recompute = recompute};
    params m;
    params_init(&m, &c);
    uint8_t tok[B * LD];
    make_tokens(tok, 0);
    gpt *host;
    gpt_cuda *dev;
    ck_assert_int_eq(gpt_create(&c, B, &host), 0);
    ck_assert_msg(gpt_cuda_create(&c, B, stream, &dev) == 0, "%s", mlp_cuda_last_error());
    gpt_hooks hh = {.begin = host_begin, .end = host_end, .arg = &m};
    gpt_hooks dh = {.begin = dev_begin, .end = dev_end, .arg = &m};
    gpt_stats hs, ds;
    ck_assert_int_eq(gpt_forward(host, &hh, tok, B, LEN, LD, 1, &hs), 0);
    ck_assert_msg(gpt_cuda_forward(dev, &dh, tok, B, LEN, LD, 1, &ds) == 0, "%s",
                  mlp_cuda_last_error());
    float *probs = malloc(sizeof(float) * B * LEN * V);
    ck_assert_int_eq(gpt_cuda_logits(dev, 0, B * LEN, probs), 0);
    double pd = 0;
    for (int i = 0; i < B * LEN * V; i++)
        pd = fmax(pd, fabs((double)probs[i] - gpt_logits(host)[i]));
    double rel = fabs(ds.loss_sum - hs.loss_sum) / hs.loss_sum;
    printf("%s: loss %.7f (device) %.7f (host), relative %.2e; correct %.0f, %.0f; tokens %.0f; "
           "probabilities differ by %.2e\n",
           what, ds.loss_sum, hs.loss_sum, rel, ds.correct, hs.correct, ds.tokens, pd);
    ck_assert_double_eq(ds.tokens, B * LEN);
    ck_assert_double_le(rel, bf16 ? 2e-3 : 1e-5);
    ck_assert_double_le(pd, bf16 ? 1e-2 : 1e-5);
    ck_assert_double_le(fabs(ds.correct - hs.correct), bf16 ? 2 : 0);
    for (int pass = 0; pass < 2; pass++) { /* the second adds onto the first */
        if (pass) { /* gpt.c's backward turns its probabilities into their gradient */
            ck_assert_int_eq(gpt_forward(host, &hh, tok, B, LEN, LD, 1, NULL), 0);
            ck_assert_int_eq(gpt_cuda_forward(dev, &dh, tok, B, LEN, LD, 1, &ds), 0);
        }
        ck_assert_int_eq(gpt_backward(host, &hh, 1.0f / (B * LEN)), 0);
        ck_assert_msg(gpt_cuda_backward(dev, &dh, 1.0f / (B * LEN)) == 0, "%s",
                      mlp_cuda_last_error());
    }
    ck_assert_int_eq(m.bad_order, 0);
    double worst = 0;
    for (int u = 0; u < m.nunits; u++)
        for (int i = 0; i < m.np[u]; i++) {
            size_t n = m.count[u][i];
            float *got = malloc(n * 4);
            ck_assert_int_eq(mlp_cuda_to_host(got, m.dg[u][i], n * 4, stream), 0);
            double d = 0, amax = 0;
            for (size_t k = 0; k < n; k++) {
                d = fmax(d, fabs((double)got[k] - m.g[u][i][k]));
                amax = fmax(amax, fabs(m.g[u][i][k]));
            }
            free(got);
            double r = amax > 0 ? d / amax : d;
            worst = fmax(worst, r);
            ck_assert_msg(amax > 0, "%s: %s's gradient is zero on the host", what, m.name[u][i]);
            ck_assert_msg(r <= (bf16 ? 3e-2 : 1e-4),
                          "%s: %s's gradient differs by %.2e of its largest (%.3g)", what,
                          m.name[u][i], r, amax);
        }
    printf("%s: every gradient within %.2e of its largest element\n", what, worst);

    /* Targets the model predicts, so that the correct counts are not all zero: each row's last
       target (which no position reads as input) set to the host's argmax there. */
    uint8_t tok2[B * LD];
    memcpy(tok2, tok, sizeof tok2);
    ck_assert_int_eq(gpt_forward(host, &hh, tok2, B, LEN, LD, 1, NULL), 0);
    for (int b = 0; b < B; b++) {
        const float *row = gpt_logits(host) + ((size_t)b * LEN + LEN - 1) * V;
        int arg = 0;
        for (int j = 1; j < V; j++)
            arg = row[j] > row[arg] ? j : arg;
        tok2[b * LD + LEN] = (uint8_t)arg;
    }
    gpt_stats hs2, ds2;
    ck_assert_int_eq(gpt_forward(host, &hh, tok2, B, LEN, LD, 1, &hs2), 0);
    ck_assert_int_eq(gpt_cuda_forward(dev, &dh, tok2, B, LEN, LD, 1, &ds2), 0);
    printf("%s: targets at the argmax: correct %.0f (device) %.0f (host)\n", what, ds2.correct,
           hs2.correct);
    ck_assert_double_ge(hs2.correct, B);
    ck_assert_double_le(fabs(ds2.correct - hs2.correct), bf16 ? 2 : 0);

    /* Accumulated on the device: two passes, then one take. */
    gpt_stats acc;
    ck_assert_int_eq(gpt_cuda_forward(dev, &dh, tok, B, LEN, LD, 1, NULL), 0);
    ck_assert_int_eq(gpt_cuda_forward(dev, &dh, tok, B, LEN, LD, 1, NULL), 0);
    ck_assert_int_eq(gpt_cuda_stats_take(dev, &acc), 0);
    ck_assert_double_eq_tol(acc.loss_sum, 2 * ds.loss_sum, 1e-9 * ds.loss_sum);
    ck_assert_double_eq(acc.correct, 2 * ds.correct);
    ck_assert_double_eq(acc.tokens, 2 * B * LEN);
    ck_assert_int_eq(gpt_cuda_stats_take(dev, &acc), 0);
    ck_assert_double_eq(acc.loss_sum, 0);
    ck_assert_double_eq(acc.tokens, 0);

    /* A forward without targets (generation's): one sequence of 9 tokens, rows 9 apart. */
    uint8_t one[9];
    memcpy(one, tok + LD, sizeof one);
    ck_assert_int_eq(gpt_forward(host, &hh, one, 1, 9, 9, 0, NULL), 0);
    ck_assert_int_eq(gpt_cuda_forward(dev, &dh, one, 1, 9, 9, 0, NULL), 0);
    float z[V];
    ck_assert_int_eq(gpt_cuda_logits(dev, 8, 1, z), 0);
    double zd = 0;
    for (int j = 0; j < V; j++)
        zd = fmax(zd, fabs((double)z[j] - gpt_logits(host)[8 * V + j]));
    printf("%s: the last position's logits without targets differ by %.2e\n", what, zd);
    ck_assert_double_le(zd, bf16 ? 5e-2 : 1e-4);
    ck_assert_int_eq(gpt_cuda_backward(dev, &dh, 1.0f), -EINVAL); /* no targets */
    ck_assert_int_eq(gpt_cuda_logits(dev, 9, 1, z), -EINVAL);

    /* B = 0: every hook, forward (L + 3) and backward (L + 3). Refusals. */
    m.begins = m.ends = 0;
    ck_assert_int_eq(gpt_cuda_forward(dev, &dh, NULL, 0, LEN, LD, 1, NULL), 0);
    ck_assert_int_eq(gpt_cuda_backward(dev, &dh, 1.0f), 0);
    ck_assert_int_eq(m.begins, 2 * (L + 3));
    ck_assert_int_eq(m.ends, 2 * (L + 3));
    ck_assert_int_eq(gpt_cuda_forward(dev, &dh, tok, B + 1, LEN, LD, 1, NULL), -EINVAL);
    ck_assert_int_eq(gpt_cuda_forward(dev, &dh, tok, B, T + 1, T + 2, 1, NULL), -EINVAL);
    ck_assert_int_eq(gpt_cuda_forward(dev, &dh, tok, B, LEN, LEN, 1, NULL), -EINVAL);
    tok[3] = V;
    ck_assert_int_eq(gpt_cuda_forward(dev, &dh, tok, B, LEN, LD, 1, NULL), -EINVAL);
    ck_assert_int_eq(gpt_cuda_backward(dev, &dh, 1.0f), -EINVAL);
    ck_assert_int_eq(m.bad_order, 0);

    free(probs);
    gpt_cuda_free(dev);
    gpt_free(host);
    params_free(&m);
#ifdef DDP_CUDA_EMULATE
    ck_assert_uint_eq(cuda_emu_allocated(), 0); /* every device and pinned buffer freed */
#endif
}

START_TEST(f32_against_host)
{
    compare(0, 0);
}
END_TEST

START_TEST(bf16_against_host)
{
    compare(1, 0);
}
END_TEST

START_TEST(recompute_against_host)
{
    compare(0, 1);
    compare(1, 1);
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
    Suite *s = suite_create("gpt_cuda");
    check_tcase(s, "against the host", 120, f32_against_host, bf16_against_host,
                recompute_against_host);
    /* No fork: a CUDA context does not survive fork(). */
    int rc = check_run_fork(s, CK_NOFORK);
    mlp_cuda_close(stream);
    return rc;
}
