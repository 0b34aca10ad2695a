/*
 * sgemm: this machine's single-thread OpenBLAS sgemm rate, the limit bench/train reads the
 * trainers' model FLOPs/s against.
 *
 * Two figures, in GFLOP/s (10^9 floating-point operations per second, 2 x M x N x K per GEMM):
 *
 *   square  C = A B with M = N = K = --square (2048): the library's peak on this core;
 *   model   the GEMMs of one training step of ddp-train's MLP (784-H-...-H-10, --hidden,
 *           --layers) on a micro-batch of B rows, with the calls and transposes worker/trainer/mlp.c
 *           makes: per layer the forward y = x W^T (B x out x in), the weight gradient
 *           dW += dy^T x (out x in x B) and, except for the first layer, dx = dy W
 *           (B x in x out); their flops summed over their times summed. One row per B in
 *           --batch (256,128,64: the micro-batch of 1, 2 and 4 ranks at global batch 256).
 *
 * Each figure is the best of --reps timed runs, each run repeating the work for at least
 * --ms milliseconds. Operands are allocated and filled before the clock starts. The bias and
 * ReLU work of the real step is not counted here or in the trainers' model FLOPs.
 *
 * Output: a table on stdout, or with --json one JSON object on stdout:
 *   {"threads":1,"core":"SkylakeX","square_n":2048,"square_gflops":...,"hidden":512,"layers":2,
 *    "flops_per_sample":...,"model":[{"batch":256,"gflops":...},...]}
 * flops_per_sample is the model GEMMs' flops per sample of a training step (forward and
 * backward), what compare.sh multiplies samples/s by.
 *
 * Not run by `meson test`. Exit status: 0, 1 out of memory, 2 bad usage.
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
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
               "  --square N     size of the square GEMM (2048)\n"
               "  --batch B,...  micro-batch sizes of the model rows (256,128,64)\n"
               "  --hidden H     hidden width, as ddp-train's --hidden (512)\n"
               "  --layers L     hidden layers, as ddp-train's --layers (2)\n"
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
    int square = 2048, hidden = 512, layers = 2, reps = 5, ms = 200, json = 0;
    int batches[MAX_BATCHES] = {256, 128, 64}, nb = 3;
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
            rc = cli_parse_int(a, v, 1, MAX_LAYERS - 1, &layers);
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
    double per_sample = 0;
    double model_gflops[MAX_BATCHES];
    for (int k = 0; k < nb; k++) {
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

    if (json) {
        printf("{\"threads\": 1, \"core\": \"%s\", \"square_n\": %d, \"square_gflops\": %.3f, \"hidden\": %d, "
               "\"layers\": %d, \"flops_per_sample\": %.0f, \"model\": [",
               mlp_blas_core(), square, sq_gflops, hidden, layers, per_sample);
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
            snprintf(name, sizeof name, "model step, micro-batch %d", batches[k]);
            printf("%-34s %8.2f\n", name, model_gflops[k]);
        }
        printf("\nmodel GEMM flops per sample (forward + backward): %.0f\n", per_sample);
    }
    return 0;
}
