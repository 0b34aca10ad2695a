/*
 * sgemm: this machine's single-thread OpenBLAS sgemm rate, the limit bench/train reads the
 * trainers' model FLOPs/s against.
 *
 * Two figures, in GFLOP/s (10^9 floating-point operations per second, 2 x M x N x K per GEMM):
 *
 *   square  C = A B with M = N = K = --square (2048): the library's peak on this core;
 *   model   the GEMMs of one training step of ddp-train's MLP (784-H-...-H-10, --hidden,
 *           --layers) on a micro-batch of B rows, with the calls and transposes
 * worker/trainer/mlp.c makes: per layer the forward y = x W^T (B x out x in), the weight gradient
 *           dW += dy^T x (out x in x B) and, except for the first layer, dx = dy W
 *           (B x in x out); their flops summed over their times summed. One row per B in
 *           --batch (256,128,64: the micro-batch of 1, 2 and 4 ranks at global batch 256).
 *
 * With --model gpt the model rows are ddp-train --model gpt's instead (--layers blocks of --width
 * C with --heads H, context --seq-len T, vocabulary 256; --batch counts sequences, default 64,32:
 * the micro-batch of 1 and 2 ranks at global batch 64), the GEMMs of one step as
 * worker/trainer/gpt.c calls them on R = B T rows: per block the four linear layers' forward
 * x W^T, weight gradient dy^T x and input gradient dy W (qkv R x 3C x C, c_proj R x C x C, c_fc
 * R x 4C x C, mlp c_proj R x C x 4C), and per sequence and head attention's q k^T and a v
 * (T x T x C/H, T x C/H x T, in blocks) forward and four such products backward; the tied
 * logits R x 256 x C forward, and its weight and input gradients. The model's flops per token,
 * flops_per_token, are 6 (12 L C^2 + 256 C) + 12 L T C: the attention term counts the whole T x T
 * products, as nanoGPT's and PaLM's MFU do, though gpt.c computes only the blocks of GPT_ATT_BLOCK
 * rows on and below the diagonal (gpt.h); the model rows time those blocks and count their own
 * flops. The written kernels (LayerNorm, softmax, GELU, loss) are not counted.
 *
 * Each figure is the best of --reps timed runs, each run repeating the work for at least
 * --ms milliseconds. Operands are allocated and filled before the clock starts. The bias and
 * ReLU work of the real step is not counted here or in the trainers' model FLOPs.
 *
 * Output: a table on stdout, or with --json one JSON object on stdout:
 *   {"threads":1,"core":"SkylakeX","square_n":2048,"square_gflops":...,"hidden":512,"layers":2,
 *    "flops_per_sample":...,"model":[{"batch":256,"gflops":...},...]}
 * flops_per_sample is the model GEMMs' flops per sample of a training step (forward and
 * backward), what compare.sh multiplies samples/s by. --model gpt: {"threads":1,"core":...,
 * "square_n":...,"square_gflops":...,"model_name":"gpt","layers":4,"width":128,"heads":4,
 * "seq":128,"flops_per_token":...,"computed_flops_per_token":...,"model":[{"batch":64,
 * "gflops":...},...]} (gflops: the computed flops over their time), what gpt.sh
 * multiplies tokens/s by.
 *
 * Not run by `meson test`. Exit status: 0, 1 out of memory, 2 bad usage.
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "gpt.h"
#include "mlp.h"
#include "monoclock.h"

#define MAX_LAYERS 16
#define MAX_BATCHES 16
#define IN_DIM 784
#define CLASSES 10

static void usage(FILE *f)
{
    fprintf(f, "usage: sgemm [--square N] [--batch B,...] [--hidden H] [--layers L] [--reps N]\n"
               "             [--ms MS] [--json]\n"
               "       sgemm --model gpt [--layers L] [--width C] [--heads H] [--seq-len T]\n"
               "             [--batch B,...] [...]\n"
               "  --square N     size of the square GEMM (2048)\n"
               "  --batch B,...  micro-batch sizes of the model rows (256,128,64; gpt: sequences,\n"
               "                 64,32)\n"
               "  --hidden H     hidden width, as ddp-train's --hidden (512)\n"
               "  --layers L     hidden layers, as ddp-train's --layers (2; gpt: blocks, 4)\n"
               "  --model M      the model rows: mlp (the default) or gpt\n"
               "  --width C      gpt: width (128)\n"
               "  --heads H      gpt: attention heads (4)\n"
               "  --seq-len T    gpt: context length (128)\n"
               "  --reps N       timed runs per figure, best reported (5)\n"
               "  --ms MS        least duration of one run (200)\n"
               "  --json         one JSON object instead of the table\n");
}

static float *filled(size_t n)
{
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; p && i < n; i++)
        p[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    return p;
}

/* One layer's operands for a micro-batch of B: x (B, in), W (out, in), y and dy (B, out),
 * dW (out, in), dx (B, in). */
typedef struct layer {
    int in, out;
    float *x, *W, *y, *dy, *dW, *dx;
} layer;

/* The GEMMs of one training step, as worker/trainer/mlp.c calls them. Returns the flops. */
static double model_step(layer *ls, int L, int B)
{
    double flops = 0;
    for (int l = 0; l < L; l++) { /* forward */
        layer *c = &ls[l];
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, c->out, c->in, 1.0f, c->x, c->in,
                    c->W, c->in, 1.0f, c->y, c->out);
        flops += 2.0 * B * c->out * c->in;
    }
    for (int l = L - 1; l >= 0; l--) { /* backward */
        layer *c = &ls[l];
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c->out, c->in, B, 1.0f, c->dy, c->out,
                    c->x, c->in, 1.0f, c->dW, c->in);
        flops += 2.0 * B * c->out * c->in;
        if (l > 0) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, c->in, c->out, 1.0f, c->dy,
                        c->out, c->W, c->in, 0.0f, c->dx, c->in);
            flops += 2.0 * B * c->out * c->in;
        }
    }
    return flops;
}

/* The GEMMs of one step of ddp-train's GPT on B sequences, as worker/trainer/gpt.c calls them:
 * one set of operands serves every block (the same shapes; each is far beyond the caches). */
#define GPT_VOCAB 256
typedef struct gpt_step {
    int L, C, H, T, B;
    float *x, *y, *dy, *dx;  /* (R, 4C) each: the widest layer's input or output */
    float *W, *dW;           /* (4C, C): every linear layer's weight fits */
    float *qkv, *att, *atty; /* (R, 3C), (T, T), (R, C) */
    float *wte, *logits;     /* (V, C), (R, V) */
} gpt_step;

static double gpt_linear(gpt_step *g, int in, int out) /* forward, dW, dx of one layer */
{
    int R = g->B * g->T;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, out, in, 1.0f, g->x, in, g->W, in,
                1.0f, g->y, out);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, R, 1.0f, g->dy, out, g->x, in,
                1.0f, g->dW, in);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, in, out, 1.0f, g->dy, out, g->W, in,
                0.0f, g->dx, in);
    return 3 * 2.0 * R * in * out;
}

/* forward and backward, every sequence and head, in gpt.c's blocks of GPT_ATT_BLOCK rows */
static double gpt_attention(gpt_step *g)
{
    int C = g->C, N = g->T, hs = C / g->H, C3 = 3 * C;
    double flops = 0;
    for (int b = 0; b < g->B; b++)
        for (int h = 0; h < g->H; h++) {
            const float *q = g->qkv + (size_t)b * N * C3 + (size_t)h * hs;
            float *y = g->atty + (size_t)b * N * C + (size_t)h * hs;
            float *dq = g->dx + (size_t)b * N * C3 + (size_t)h * hs;
            for (int r0 = 0; r0 < N; r0 += GPT_ATT_BLOCK) {
                int r1 = r0 + GPT_ATT_BLOCK < N ? r0 + GPT_ATT_BLOCK : N, M = r1 - r0;
                float *a = g->att + (size_t)r0 * N;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, r1, hs, 1.0f,
                            q + (size_t)r0 * C3, C3, q + C, C3, 0.0f, a, N); /* q k^T */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, hs, r1, 1.0f, a, N,
                            q + 2 * C, C3, 0.0f, y + (size_t)r0 * C, C); /* a v */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, r1, hs, 1.0f,
                            y + (size_t)r0 * C, C, q + 2 * C, C3, 0.0f, a, N); /* dy v^T */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, M, hs, N - r0, 1.0f, a + r0, N,
                            y + (size_t)r0 * C, C, 0.0f, dq + (size_t)r0 * C3 + 2 * C,
                            C3); /* dv = a^T dy */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, hs, r1, 1.0f, a, N, q + C,
                            C3, 0.0f, dq + (size_t)r0 * C3, C3); /* dq = ds k */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, M, hs, N - r0, 1.0f, a + r0, N,
                            q + (size_t)r0 * C3, C3, 0.0f, dq + (size_t)r0 * C3 + C,
                            C3); /* dk = ds^T q */
                flops += 2.0 * M * hs * (4.0 * r1 + 2.0 * (N - r0));
            }
        }
    return flops;
}

static double gpt_model_step(gpt_step *g)
{
    int C = g->C, R = g->B * g->T, V = GPT_VOCAB;
    double flops = 0;
    for (int l = 0; l < g->L; l++) /* forward and backward of each block's products */
        flops += gpt_linear(g, C, 3 * C) + gpt_attention(g) + gpt_linear(g, C, C) +
                 gpt_linear(g, C, 4 * C) + gpt_linear(g, 4 * C, C);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, V, C, 1.0f, g->x, C, g->wte, C, 0.0f,
                g->logits, V);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, R, 1.0f, g->logits, V, g->x, C,
                0.0f, g->wte, C);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, C, V, 1.0f, g->logits, V, g->wte, C,
                0.0f, g->dx, C);
    return flops + 3 * 2.0 * R * V * C;
}

static int gpt_step_alloc(gpt_step *g)
{
    size_t R = (size_t)g->B * g->T, C = (size_t)g->C, T = (size_t)g->T;
    g->x = filled(R * 4 * C);
    g->y = filled(R * 4 * C);
    g->dy = filled(R * 4 * C);
    g->dx = filled(R * 4 * C);
    g->W = filled(4 * C * C);
    g->dW = filled(4 * C * C);
    g->qkv = filled(R * 3 * C);
    g->att = filled(T * T);
    g->atty = filled(R * C);
    g->wte = filled(GPT_VOCAB * C);
    g->logits = filled(R * GPT_VOCAB);
    return g->x && g->y && g->dy && g->dx && g->W && g->dW && g->qkv && g->att && g->atty &&
           g->wte && g->logits;
}

static void gpt_step_free(gpt_step *g)
{
    float *all[] = {g->x, g->y, g->dy, g->dx, g->W, g->dW, g->qkv, g->att, g->atty, g->wte,
                    g->logits};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

typedef struct sq {
    int n;
    float *a, *b, *c;
} sq;

static double square_step(sq *s)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s->n, s->n, s->n, 1.0f, s->a, s->n, s->b,
                s->n, 0.0f, s->c, s->n);
    return 2.0 * s->n * s->n * s->n;
}

/* Best GFLOP/s over `reps` runs of at least `ms` each; one untimed call warms up first. */
#define MEASURE(result, call)                                                                      \
    do {                                                                                           \
        (void)(call);                                                                              \
        double best_ = 0;                                                                          \
        for (int r_ = 0; r_ < reps; r_++) {                                                        \
            double fl_ = 0, t0_ = mono_now_s(), t_;                                               \
            do                                                                                     \
                fl_ += (call);                                                                     \
            while ((t_ = mono_now_s() - t0_) < ms * 1e-3);                                        \
            if (fl_ / t_ > best_)                                                                  \
                best_ = fl_ / t_;                                                                  \
        }                                                                                          \
        (result) = best_ / 1e9;                                                                    \
    } while (0)

int main(int argc, char **argv)
{
    (void)mlp_blas_select(argv); /* the kernels ddp-train runs with (worker/trainer/mlp.h) */
    int square = 2048, hidden = 512, layers = 0, reps = 5, ms = 200, json = 0;
    int batches[MAX_BATCHES] = {256, 128, 64}, nb = 0;
    int gpt = 0, width = 128, heads = 4, seq = 128; /* --model gpt's */
    static const char *const models[] = {"mlp", "gpt", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        } else if (!v) {
            cli_msg(stderr, "sgemm", "'%s': unknown option, or its value is missing", a);
            usage(stderr);
            return 2;
        } else if (!strcmp(a, "--square")) {
            rc = cli_parse_int(a, v, 1, 16384, &square);
        } else if (!strcmp(a, "--hidden")) {
            rc = cli_parse_int(a, v, 1, 1 << 16, &hidden);
        } else if (!strcmp(a, "--layers")) {
            rc = cli_parse_int(a, v, 1, 256, &layers);
        } else if (!strcmp(a, "--model")) {
            rc = cli_parse_choice(a, v, "model", models, &gpt);
        } else if (!strcmp(a, "--width")) {
            rc = cli_parse_int(a, v, 1, 16384, &width);
        } else if (!strcmp(a, "--heads")) {
            rc = cli_parse_int(a, v, 1, 16384, &heads);
        } else if (!strcmp(a, "--seq-len")) {
            rc = cli_parse_int(a, v, 1, 4096, &seq);
        } else if (!strcmp(a, "--reps")) {
            rc = cli_parse_int(a, v, 1, 1000, &reps);
        } else if (!strcmp(a, "--ms")) {
            rc = cli_parse_int(a, v, 1, 60000, &ms);
        } else if (!strcmp(a, "--batch")) {
            rc = cli_parse_int_list(a, v, 1, 1 << 16, 0, batches, MAX_BATCHES);
            nb = rc > 0 ? rc : nb;
        } else {
            cli_msg(stderr, "sgemm", "unknown option '%s'", a);
            usage(stderr);
            return 2;
        }
        if (cli_report(stderr, "sgemm", rc) < 0)
            return 2;
        i++;
    }
    if (!gpt && layers > MAX_LAYERS - 1) {
        cli_msg(stderr, "sgemm", "--layers %d: the MLP has at most %d", layers, MAX_LAYERS - 1);
        return 2;
    }
    if (gpt && width % heads) {
        cli_msg(stderr, "sgemm", "--width %d is not a multiple of --heads %d", width, heads);
        return 2;
    }
    if (!layers)
        layers = gpt ? 4 : 2;
    if (!nb && gpt) {
        batches[0] = 64;
        batches[1] = 32;
    }
    nb = nb ? nb : gpt ? 2 : 3;
    openblas_set_num_threads(1);

    sq s = {square, filled((size_t)square * square), filled((size_t)square * square),
            filled((size_t)square * square)};
    if (!s.a || !s.b || !s.c) {
        fprintf(stderr, "sgemm: out of memory for %d x %d matrices\n", square, square);
        return 1;
    }
    double sq_gflops;
    MEASURE(sq_gflops, square_step(&s));
    free(s.a);
    free(s.b);
    free(s.c);

    int L = layers + 1;
    double per_sample = 0, computed = 0;
    double model_gflops[MAX_BATCHES];
    for (int k = 0; gpt && k < nb; k++) {
        gpt_step g = {.L = layers, .C = width, .H = heads, .T = seq, .B = batches[k]};
        if (!gpt_step_alloc(&g)) {
            fprintf(stderr, "sgemm: out of memory for batch %d\n", g.B);
            return 1;
        }
        computed = gpt_model_step(&g) / ((double)g.B * g.T); /* per token */
        per_sample = 6.0 * (12.0 * layers * width * width + GPT_VOCAB * width) +
                     12.0 * layers * seq * width;
        MEASURE(model_gflops[k], gpt_model_step(&g));
        gpt_step_free(&g);
    }
    for (int k = 0; !gpt && k < nb; k++) {
        int B = batches[k];
        layer ls[MAX_LAYERS];
        int ok = 1;
        for (int l = 0; l < L; l++) {
            int in = l == 0 ? IN_DIM : hidden, out = l == L - 1 ? CLASSES : hidden;
            ls[l] = (layer){in,
                            out,
                            filled((size_t)B * in),
                            filled((size_t)out * in),
                            filled((size_t)B * out),
                            filled((size_t)B * out),
                            filled((size_t)out * in),
                            filled((size_t)B * in)};
            ok = ok && ls[l].x && ls[l].W && ls[l].y && ls[l].dy && ls[l].dW && ls[l].dx;
        }
        if (!ok) {
            fprintf(stderr, "sgemm: out of memory for batch %d\n", B);
            return 1;
        }
        per_sample = model_step(ls, L, B) / B;
        MEASURE(model_gflops[k], model_step(ls, L, B));
        for (int l = 0; l < L; l++) {
            free(ls[l].x);
            free(ls[l].W);
            free(ls[l].y);
            free(ls[l].dy);
            free(ls[l].dW);
            free(ls[l].dx);
        }
    }

    if (json && gpt) {
        printf("{\"threads\": 1, \"core\": \"%s\", \"square_n\": %d, \"square_gflops\": %.3f, "
               "\"model_name\": \"gpt\", \"layers\": %d, \"width\": %d, \"heads\": %d, "
               "\"seq\": %d, \"flops_per_token\": %.0f, \"computed_flops_per_token\": %.0f, "
               "\"model\": [",
               mlp_blas_core(), square, sq_gflops, layers, width, heads, seq, per_sample, computed);
    } else if (json) {
        printf("{\"threads\": 1, \"core\": \"%s\", \"square_n\": %d, \"square_gflops\": %.3f, \"hidden\": %d, "
               "\"layers\": %d, \"flops_per_sample\": %.0f, \"model\": [",
               mlp_blas_core(), square, sq_gflops, hidden, layers, per_sample);
    }
    if (json) {
        for (int k = 0; k < nb; k++)
            printf("%s{\"batch\": %d, \"gflops\": %.3f}", k ? ", " : "", batches[k],
                   model_gflops[k]);
        printf("]}\n");
    } else {
        printf("sgemm, one OpenBLAS thread (%s kernels), best of %d runs of >= %d ms\n\n",
               mlp_blas_core(), reps, ms);
        printf("%-34s %8s\n", "shape", "GFLOP/s");
        printf("square %-27d %8.2f\n", square, sq_gflops);
        for (int k = 0; k < nb; k++) {
            char name[64];
            snprintf(name, sizeof name, "%s step, micro-batch %d", gpt ? "gpt" : "model",
                     batches[k]);
            printf("%-34s %8.2f\n", name, model_gflops[k]);
        }
        printf("\nmodel GEMM flops per %s (forward + backward): %.0f\n",
               gpt ? "token" : "sample", per_sample);
        if (gpt)
            printf("computed (attention's blocks on and below the diagonal): %.0f\n", computed);
    }
    return 0;
}
