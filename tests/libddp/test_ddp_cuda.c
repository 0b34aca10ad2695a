/*
 * libddp's CUDA operations table (worker/libddp/ddp_cuda.cu, through ddp_ops.h) against the host table
 * (worker/libddp/ops_host.c over optim.c's kernels): the same inputs on both sides, every operation
 * of the step compared element by element. Exits 77 without a GPU (cudaGetDeviceCount() fails
 * or finds none). No fork: a CUDA context does not survive fork().
 *
 * Tolerances, and why:
 *  - the bf16 casts (with and without the pre-division of a bf16 reduction's copy), the f32
 *    widening (assign and add) and add: bit for bit. One IEEE operation per element on both
 *    sides (ddp_cuda.cu is built with -fmad=false and no fast math, so subnormals are kept)
 *    and the same rounding formula (bf16conv.h's bf16_from_f32). NaNs are compared as NaNs,
 *    not by pattern: the GPU's arithmetic returns its canonical NaN, the CPU's keeps the
 *    operand's sign and payload.
 *  - the sum of squares: bit for bit against the device's order of summation reproduced here
 *    (per block, then the blocks' partial sums; each square is exact in double), which also
 *    makes it the same on every run. Against the host's, which adds in another order
 *    (optim.c's 32 lanes): for n positive terms each order is within (n - 1) u of the exact
 *    sum (u = 2^-53), so the two within 2 (n - 1) u relative of each other.
 *  - the decision (finite flag, skip, clip, step count): exact, computed from the same sum (the
 *    host's sum is written into the device's before deciding, so that the comparison of the
 *    updates does not inherit the norm's rounding).
 *  - SGD (momentum, Nesterov, weight decay, first step, clipping) and the bf16 compute copy it
 *    refreshes: bit for bit, the same formulas operation by operation with explicit fmaf().
 *  - AdamW: the moments bit for bit (their coefficients need no pow()); the parameters within
 *    2 ulps per step taken, of the largest of the two values and 4 lr (an update's size: lr
 *    times |mhat| / sqrt(vhat), a few at most), because the device's double pow() (2 ulps,
 *    CUDA's math documentation) computes the bias corrections, which may then round to a float
 *    coefficient one ulp from the host's: that moves an update by about an ulp of itself, and
 *    the sum with the parameter by a rounding more (the update's scale, not the parameter's,
 *    where the two nearly cancel). The test also prints how many elements differed at all
 *    (expected: none, the float coefficients almost always round alike).
 */
#include <check.h>

#include <cuda_runtime_api.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp_ops.h"
#include "optim.h"
#include "optimizer.h"
#include "check_main.h"

/* An odd count that spans several blocks and leaves a partial one. */
enum { N = 100003 };

static const ddp__ops *dops;
static ddp__dev dev, host;
static char dev_err[256];
static cudaStream_t stream;

static void open_both(void)
{
    memset(&dev, 0, sizeof dev);
    memset(&host, 0, sizeof host);
    dev.device = 0;
    dev.stream = stream;
    dev.err = dev_err;
    dev.errlen = sizeof dev_err;
    host.device = -1;
    ck_assert_msg(dops->open(&dev) == 0, "open: %s", dev_err);
    ck_assert_int_eq(ddp__host_ops.open(&host), 0);
}

static void close_both(void)
{
    dops->close(&dev);
    ddp__host_ops.close(&host);
}

#define OK(call) ck_assert_msg((call) == 0, "%s: %s", #call, dev_err)

static void *dalloc(size_t nbytes)
{
    void *p = NULL;
    OK(dops->alloc(&dev, nbytes, &p));
    return p;
}

static void up(void *dst, const void *src, size_t nbytes)
{
    OK(dops->upload(&dev, dst, src, nbytes));
}

static void down(void *dst, const void *src, size_t nbytes)
{
    OK(dops->download(&dev, dst, src, nbytes));
}

/* Deterministic values of mixed magnitudes and signs (a small LCG). */
static void fill(float *x, size_t n, uint32_t seed, float scale)
{
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        float u = (float)(s >> 8) / 16777216.0f - 0.5f; /* [-0.5, 0.5) */
        x[i] = scale * u * (float)(1 + (s & 7));
    }
}

/* Special values at the front: zeros, subnormals, bf16 ties, overflow, infinities, NaNs. */
static void specials(float *x)
{
    const uint32_t bits[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x3f808000u,
                             0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u,
                             0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x3effffffu};
    for (size_t i = 0; i < sizeof bits / sizeof bits[0]; i++)
        memcpy(&x[i], &bits[i], 4);
}

/* Whether an f32 (es 4) or bf16 (es 2) pattern is a NaN. */
static int is_nan(const void *x, size_t es)
{
    uint32_t u = 0;
    if (es == 2) {
        uint16_t h;
        memcpy(&h, x, 2);
        u = (uint32_t)h << 16;
    } else {
        memcpy(&u, x, 4);
    }
    return (u & 0x7fffffffu) > 0x7f800000u;
}

/* Elements whose bit patterns differ, any two NaNs counted equal: the GPU's arithmetic returns
 * its canonical NaN where the CPU's keeps the operand's sign and payload. */
static size_t bit_diffs(const void *a, const void *b, size_t n, size_t es)
{
    size_t d = 0;
    for (size_t i = 0; i < n; i++) {
        const char *x = (const char *)a + i * es, *y = (const char *)b + i * es;
        d += memcmp(x, y, es) != 0 && !(is_nan(x, es) && is_nan(y, es));
    }
    return d;
}

/* |a - b| in units of the last place of the largest of |a|, |b| and `floor` (a normal float);
 * infinite when either is not finite. */
static double ulps(float a, float b, float floor)
{
    if (!isfinite(a) || !isfinite(b))
        return INFINITY;
    float big = fmaxf(fmaxf(fabsf(a), fabsf(b)), floor);
    return fabs((double)a - (double)b) / ldexp(1.0, ilogbf(big) - 23);
}

START_TEST(casts_and_add)
{
    open_both();
    float *src = malloc(N * 4), *dst = malloc(N * 4), *got = malloc(N * 4);
    uint16_t *h16 = malloc(N * 2), *g16 = malloc(N * 2);
    fill(src, N, 1, 3.0f);
    specials(src);
    fill(dst, N, 2, 1.0f);
    float *d_src = dalloc(N * 4), *d_dst = dalloc(N * 4);
    uint16_t *d16 = dalloc(N * 2);
    up(d_src, src, N * 4);
    /* A plain cast, and the pre-divided copy of a bf16 reduction (world 3: 1/3 is inexact). */
    const float scales[] = {1.0f, 1.0f / 3.0f, 0.125f};
    for (int k = 0; k < 3; k++) {
        OK(dops->to_bf16(&dev, d16, d_src, N, scales[k]));
        down(g16, d16, N * 2);
        ddp__to_bf16(h16, src, N, scales[k]);
        ck_assert_msg(bit_diffs(g16, h16, N, 2) == 0, "to_bf16 scale %g: %zu elements differ",
                      scales[k], bit_diffs(g16, h16, N, 2));
    }
    /* Widen the last cast back, assigning and adding. */
    for (int add = 0; add < 2; add++) {
        up(d_dst, dst, N * 4);
        memcpy(got, dst, N * 4);
        OK(dops->from_bf16(&dev, d_dst, d16, N, add));
        ddp__from_bf16(got, h16, N, add);
        down(dst, d_dst, N * 4);
        ck_assert_msg(bit_diffs(dst, got, N, 4) == 0, "from_bf16 add %d: %zu elements differ",
                      add, bit_diffs(dst, got, N, 4));
    }
    fill(dst, N, 3, 2.0f);
    up(d_dst, dst, N * 4);
    OK(dops->add(&dev, d_dst, d_src, N));
    ddp__add(dst, src, N);
    down(got, d_dst, N * 4);
    ck_assert_msg(bit_diffs(got, dst, N, 4) == 0, "add: %zu elements differ",
                  bit_diffs(got, dst, N, 4));
    /* n == 0 launches nothing and succeeds. */
    OK(dops->to_bf16(&dev, d16, d_src, 0, 1.0f));
    OK(dops->add(&dev, d_dst, d_src, 0));
    OK(dops->sync(&dev));
    dops->release(&dev, d_src);
    dops->release(&dev, d_dst);
    dops->release(&dev, d16);
    free(src), free(dst), free(got), free(h16), free(g16);
    close_both();
}
END_TEST

/* The device's sum of squares, read back from the scalars (d->ss is a device address). */
static double dev_ss(void)
{
    double ss = 0;
    down(&ss, dev.ss, sizeof ss);
    return ss;
}

/* block_sum() of ddp_cuda.cu: part[t] += part[t + w] for w = THREADS / 2, ..., 1. */
static double ref_block_sum(double *part)
{
    for (unsigned w = DDP__CUDA_THREADS / 2; w > 0; w /= 2)
        for (unsigned t = 0; t < w; t++)
            part[t] += part[t + w];
    return part[0];
}

/* ss plus norm_add()'s sum of squares of x[n], in the device's order (k_sum_squares, then
 * k_sum_partials). */
static double ref_device_ss(double ss, const float *x, size_t n)
{
    enum { T = DDP__CUDA_THREADS };
    size_t nb = (n + T - 1) / T;
    nb = nb < DDP__CUDA_MAX_BLOCKS ? nb : DDP__CUDA_MAX_BLOCKS;
    static double partial[DDP__CUDA_MAX_BLOCKS];
    double part[T];
    for (size_t b = 0; b < nb; b++) {
        for (size_t t = 0; t < T; t++) {
            double acc = 0;
            for (size_t i = b * T + t; i < n; i += nb * T)
                acc += (double)x[i] * (double)x[i];
            part[t] = acc;
        }
        partial[b] = ref_block_sum(part);
    }
    for (size_t t = 0; t < T; t++) {
        double acc = 0;
        for (size_t b = t; b < nb; b += T)
            acc += partial[b];
        part[t] = acc;
    }
    return ss + ref_block_sum(part);
}

START_TEST(sum_of_squares)
{
    open_both();
    /* Past DDP__CUDA_MAX_BLOCKS full blocks, so that the grid strides; N from the front. */
    const size_t big = 3 * (size_t)DDP__CUDA_THREADS * DDP__CUDA_MAX_BLOCKS + 17;
    float *g = malloc(big * 4);
    fill(g, big, 4, 0.01f);
    float *d = dalloc(big * 4);
    up(d, g, big * 4);
    /* Two ranges, as ddp.c adds one per owned group; begin resets what a previous step left.
     * The second round must give the same sum, bit for bit. */
    double first = 0;
    for (int round = 0; round < 2; round++) {
        OK(dops->norm_begin(&dev));
        OK(ddp__host_ops.norm_begin(&host));
        OK(dops->norm_add(&dev, d, 1000));
        OK(dops->norm_add(&dev, d + 1000, N - 1000));
        OK(dops->norm_add(&dev, d, 0));
        ddp__host_ops.norm_add(&host, g, 1000);
        ddp__host_ops.norm_add(&host, g + 1000, N - 1000);
        double a = dev_ss(), b = *host.ss;
        double want = ref_device_ss(ref_device_ss(0, g, 1000), g + 1000, N - 1000);
        ck_assert_msg(a == want, "sum of squares %.17g on the device, %.17g in its order here",
                      a, want);
        ck_assert_msg(round == 0 || a == first, "sum of squares %.17g, then %.17g", first, a);
        first = a;
        double bound = 2.0 * (N - 1) * ldexp(1.0, -53);
        ck_assert_msg(fabs(a - b) <= bound * b, "sum of squares %.17g on the device, %.17g on "
                      "the host: %.2e relative, bound %.2e", a, b, fabs(a - b) / b, bound);
        if (round == 1)
            printf("sum of squares of %d elements: device and host %.1e relative apart "
                   "(bound %.1e)\n", N, fabs(a - b) / b, bound);
    }
    /* The whole array: every block strides over it three times and more. */
    OK(dops->norm_begin(&dev));
    OK(dops->norm_add(&dev, d, big));
    double a = dev_ss(), want = ref_device_ss(0, g, big);
    ck_assert_msg(a == want, "sum of squares of %zu elements %.17g on the device, %.17g in its "
                  "order here", big, a, want);
    dops->release(&dev, d);
    free(g);
    close_both();
}
END_TEST

/*
 * One step on both sides from the same sum of squares: the host's written into the device's,
 * decided on both, then each side's optimizer over the same owned range. Returns the device's
 * decision.
 */
static ddp_step_info decide_both(const ddp_options *o, double ss, int64_t *steps)
{
    OK(dops->norm_begin(&dev));
    up(dev.ss, &ss, sizeof ss);
    host.host_ss = ss;
    OK(dops->decide(&dev, o, steps));
    int64_t before = *steps;
    OK(ddp__host_ops.decide(&host, o, steps));
    ddp_step_info a, b;
    OK(dops->info(&dev, &a));
    OK(ddp__host_ops.info(&host, &b));
    ck_assert_msg(a.skipped == b.skipped && a.clipped == b.clipped && a.step == b.step,
                  "decision: device skipped %d clipped %d step %lld, host %d %d %lld", a.skipped,
                  a.clipped, (long long)a.step, b.skipped, b.clipped, (long long)b.step);
    ck_assert_msg(a.grad_norm == b.grad_norm || (isnan(a.grad_norm) && isnan(b.grad_norm)),
                  "norm %.17g on the device, %.17g on the host", a.grad_norm, b.grad_norm);
    ck_assert_int_eq(*steps, before + !b.skipped);
    return a;
}

/* The state of one optimizer on both sides. */
typedef struct state {
    float *p, *g, *m1, *m2, *gh;  /* host: param, grad, moments; gh: the grad the host scales */
    uint16_t *c;                  /* host compute copy */
    float *dp, *dg, *dm1, *dm2;   /* device */
    uint16_t *dc;
    float *rp, *rm1, *rm2;        /* read back */
    uint16_t *rc;
} state;

static void state_init(state *s, int moments, int compute)
{
    memset(s, 0, sizeof *s);
    s->p = malloc(N * 4), s->g = malloc(N * 4), s->gh = malloc(N * 4), s->rp = malloc(N * 4);
    fill(s->p, N, 5, 0.2f);
    s->dp = dalloc(N * 4), s->dg = dalloc(N * 4);
    up(s->dp, s->p, N * 4);
    if (moments >= 1)
        s->m1 = calloc(N, 4), s->dm1 = dalloc(N * 4), s->rm1 = malloc(N * 4);
    if (moments >= 2)
        s->m2 = calloc(N, 4), s->dm2 = dalloc(N * 4), s->rm2 = malloc(N * 4);
    if (compute)
        s->c = calloc(N, 2), s->dc = dalloc(N * 2), s->rc = malloc(N * 2);
}

static void state_free(state *s)
{
    free(s->p), free(s->g), free(s->gh), free(s->m1), free(s->m2), free(s->c);
    free(s->rp), free(s->rm1), free(s->rm2), free(s->rc);
    dops->release(&dev, s->dp), dops->release(&dev, s->dg), dops->release(&dev, s->dm1);
    dops->release(&dev, s->dm2), dops->release(&dev, s->dc);
}

/* A step's gradient on both sides; returns its sum of squares (the host's). */
static double new_grad(state *s, uint32_t seed)
{
    fill(s->g, N, seed, 0.05f);
    memcpy(s->gh, s->g, N * 4);
    up(s->dg, s->g, N * 4);
    return ddp__sum_squares(s->g, N);
}

static void optimize_both(state *s, const ddp_options *o, float lr)
{
    const ddp__optimizer_def *def = ddp__optimizer(o->optimizer);
    float *dstate[] = {s->dm1, s->dm2}, *hstate[] = {s->m1, s->m2};
    OK(dops->optimize(&dev, o, def, lr, s->dp, s->dg, dstate, s->dc, N));
    OK(ddp__host_ops.optimize(&host, o, def, lr, s->p, s->gh, hstate, s->c, N));
    down(s->rp, s->dp, N * 4);
    if (s->dm1)
        down(s->rm1, s->dm1, N * 4);
    if (s->dm2)
        down(s->rm2, s->dm2, N * 4);
    if (s->dc)
        down(s->rc, s->dc, N * 2);
}

static void sgd_case(float momentum, int nesterov, float wd, float clip, int compute)
{
    ddp_options o;
    ddp_options_init(&o);
    o.optimizer = DDP_SGD;
    o.momentum = momentum;
    o.nesterov = nesterov;
    o.weight_decay = wd;
    o.clip_norm = clip;
    open_both();
    state s;
    state_init(&s, momentum != 0.0f, compute);
    int64_t steps = 0;
    for (int t = 0; t < 4; t++) {
        double ss = new_grad(&s, 10 + (uint32_t)t);
        ddp_step_info in = decide_both(&o, ss, &steps);
        ck_assert_int_eq(in.clipped, clip > 0 && sqrt(ss) > clip);
        optimize_both(&s, &o, 0.05f);
        size_t dp = bit_diffs(s.rp, s.p, N, 4);
        size_t dm = s.m1 ? bit_diffs(s.rm1, s.m1, N, 4) : 0;
        size_t dc = s.c ? bit_diffs(s.rc, s.c, N, 2) : 0;
        ck_assert_msg(dp == 0 && dm == 0 && dc == 0,
                      "sgd momentum %g nesterov %d wd %g clip %g, step %d: %zu parameters, %zu "
                      "momentum elements, %zu compute elements differ",
                      momentum, nesterov, wd, clip, t + 1, dp, dm, dc);
    }
    state_free(&s);
    close_both();
}

START_TEST(sgd_plain)
{
    sgd_case(0.0f, 0, 0.0f, 0.0f, 0);
}
END_TEST

START_TEST(sgd_momentum_wd)
{
    sgd_case(0.9f, 0, 0.01f, 0.0f, 0);
}
END_TEST

START_TEST(sgd_nesterov_clip_bf16)
{
    /* The gradients' norm is about 20: a clip of 1 scales every step. */
    sgd_case(0.9f, 1, 0.01f, 1.0f, 1);
}
END_TEST

static void adamw_case(float wd, float clip, int compute, int64_t start)
{
    ddp_options o;
    ddp_options_init(&o);
    o.optimizer = DDP_ADAMW;
    o.weight_decay = wd;
    o.clip_norm = clip;
    o.beta1 = 0.9f;
    o.beta2 = 0.999f;
    o.eps = 1e-8f;
    open_both();
    state s;
    state_init(&s, 2, compute);
    int64_t steps = start;
    OK(dops->set_steps(&dev, start));
    OK(ddp__host_ops.set_steps(&host, start));
    const int K = 5;
    const float lr = 1e-3f;
    double worst = 0;
    size_t differ = 0;
    for (int t = 0; t < K; t++) {
        double ss = new_grad(&s, 20 + (uint32_t)t);
        decide_both(&o, ss, &steps);
        optimize_both(&s, &o, lr);
        size_t dm = bit_diffs(s.rm1, s.m1, N, 4) + bit_diffs(s.rm2, s.m2, N, 4);
        ck_assert_msg(dm == 0, "adamw step %lld: %zu moment elements differ", (long long)steps,
                      dm);
        double w = 0;
        for (size_t i = 0; i < N; i++)
            w = fmax(w, ulps(s.rp[i], s.p[i], 4 * lr));
        worst = fmax(worst, w);
        differ += bit_diffs(s.rp, s.p, N, 4);
        ck_assert_msg(w <= 2 * (t + 1), "adamw wd %g clip %g step %lld: parameters %.1f ulps "
                      "apart, bound %d", wd, clip, (long long)steps, w, 2 * (t + 1));
        /* The compute copy rounds the device's own masters. */
        size_t stale = 0;
        for (size_t i = 0; s.c && i < N; i++)
            stale += s.rc[i] != bf16_from_f32(s.rp[i]);
        ck_assert_msg(stale == 0, "adamw: %zu compute elements are not round(master)", stale);
    }
    ck_assert_int_eq(steps, start + K);
    printf("adamw wd %g clip %g from step %lld: %d steps, %zu parameter values not bitwise "
           "equal (worst %.1f ulps)\n", wd, clip, (long long)start, K, differ, worst);
    state_free(&s);
    close_both();
}

/* Lion on both sides: bit for bit (its coefficients need no pow()), compute copy included. */
static void lion_case(float wd, float clip, int compute)
{
    ddp_options o;
    ddp_options_init(&o);
    ck_assert_int_eq(ddp_options_set_optimizer(&o, DDP_LION), 0);
    o.weight_decay = wd;
    o.clip_norm = clip;
    open_both();
    state s;
    state_init(&s, 1, compute);
    int64_t steps = 0;
    for (int t = 0; t < 5; t++) {
        double ss = new_grad(&s, 30 + (uint32_t)t);
        decide_both(&o, ss, &steps);
        optimize_both(&s, &o, 1e-3f);
        size_t dp = bit_diffs(s.rp, s.p, N, 4), dm = bit_diffs(s.rm1, s.m1, N, 4);
        size_t dc = s.c ? bit_diffs(s.rc, s.c, N, 2) : 0;
        ck_assert_msg(dp == 0 && dm == 0 && dc == 0,
                      "lion wd %g clip %g, step %d: %zu parameters, %zu momentum elements, %zu "
                      "compute elements differ",
                      wd, clip, t + 1, dp, dm, dc);
    }
    state_free(&s);
    close_both();
}

START_TEST(lion_plain)
{
    lion_case(0.0f, 0.0f, 0);
}
END_TEST

START_TEST(lion_wd_clip_bf16)
{
    lion_case(0.1f, 1.0f, 1);
}
END_TEST

START_TEST(adamw_plain)
{
    adamw_case(0.0f, 0.0f, 0, 0);
}
END_TEST

START_TEST(adamw_wd_clip_bf16_resumed)
{
    /* set_steps: as after a checkpoint's load at step 1000 (bias corrections near 1 - b^1000). */
    adamw_case(0.01f, 1.0f, 1, 1000);
}
END_TEST

/* A non-finite norm: both skip, the count stays, and the device's update writes nothing. */
START_TEST(nonfinite_skips)
{
    ddp_options o;
    ddp_options_init(&o);
    o.optimizer = DDP_ADAMW;
    open_both();
    state s;
    state_init(&s, 2, 1);
    int64_t steps = 0;
    double ss = new_grad(&s, 30);
    decide_both(&o, ss, &steps);
    optimize_both(&s, &o, 1e-3f);
    const double bad[] = {INFINITY, NAN};
    for (int k = 0; k < 2; k++) {
        new_grad(&s, 31);
        ddp_step_info in = decide_both(&o, bad[k], &steps);
        ck_assert(in.skipped && in.step == 1 && !isfinite(in.grad_norm));
        float *p0 = malloc(N * 4), *m0 = malloc(N * 4);
        uint16_t *c0 = malloc(N * 2);
        memcpy(p0, s.rp, N * 4), memcpy(m0, s.rm1, N * 4), memcpy(c0, s.rc, N * 2);
        optimize_both(&s, &o, 1e-3f);
        ck_assert_msg(bit_diffs(p0, s.rp, N, 4) == 0 && bit_diffs(m0, s.rm1, N, 4) == 0 &&
                          bit_diffs(c0, s.rc, N, 2) == 0,
                      "a skipped step (sum %g) changed the device's state", bad[k]);
        free(p0), free(m0), free(c0);
    }
    /* The next finite step trains again, as step 2. */
    ss = new_grad(&s, 32);
    ddp_step_info in = decide_both(&o, ss, &steps);
    ck_assert(!in.skipped && in.step == 2);
    state_free(&s);
    close_both();
}
END_TEST

/*
 * The asynchronous exchange's operations (ddp.c's ddp__host_icoll() without the collective):
 * page-locked memory up to the device and back on the communication stream, behind the compute
 * stream's work (to_comm), finished by comm_mark and comm_wait. The cast on the compute stream
 * writes what goes down, so a copy not ordered after it, or a wait that does not wait for the
 * copy, reads stale bytes (the host's pattern is set first and differs from the cast). The host
 * table's trivial versions do the same.
 */
static void exchange_on(const ddp__ops *ops, ddp__dev *d, float *src, uint16_t *want)
{
    float *buf = NULL, *pin = NULL;
    uint16_t *out16 = NULL, *pin16 = NULL;
    OK(ops->alloc(d, N * 4, (void **)&buf));
    OK(ops->alloc(d, N * 2, (void **)&out16));
    OK(ops->host_alloc(d, N * 4, (void **)&pin));
    OK(ops->host_alloc(d, N * 2, (void **)&pin16));
    memcpy(pin, src, N * 4);
    memset(pin16, 0xab, N * 2);
    OK(ops->comm_copy(d, buf, pin, N * 4)); /* up, on the communication stream */
    OK(ops->comm_mark(d));
    OK(ops->comm_wait(d));
    OK(ops->to_bf16(d, out16, buf, N, 0.5f)); /* on the compute stream */
    OK(ops->to_comm(d));
    OK(ops->comm_copy(d, pin16, out16, N * 2)); /* down, behind the cast */
    OK(ops->comm_mark(d));
    OK(ops->comm_wait(d));
    ck_assert_msg(bit_diffs(pin16, want, N, 2) == 0, "%s: %zu elements differ",
                  ops->is_device ? "device" : "host", bit_diffs(pin16, want, N, 2));
    OK(ops->comm_copy(d, buf, pin, 0)); /* nothing to copy */
    ops->host_release(d, pin);
    ops->host_release(d, pin16);
    ops->host_release(d, NULL);
    ops->release(d, buf);
    ops->release(d, out16);
}

START_TEST(comm_exchange)
{
    open_both();
    float *src = malloc(N * 4);
    uint16_t *want = malloc(N * 2);
    fill(src, N, 7, 5.0f);
    specials(src);
    ddp__to_bf16(want, src, N, 0.5f);
    exchange_on(dops, &dev, src, want);
    exchange_on(&ddp__host_ops, &host, src, want);
    free(src), free(want);
    close_both();
}
END_TEST

int main(void)
{
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    dops = ddp__cuda_ops();
    if (e != cudaSuccess || ndev == 0 || !dops) {
        printf("SKIP: no CUDA device (%s)\n",
               !dops ? "libddp built without CUDA"
               : e != cudaSuccess ? cudaGetErrorString(e)
                                  : "none visible");
        return 77;
    }
    struct cudaDeviceProp prop;
    if (cudaSetDevice(0) != cudaSuccess || cudaGetDeviceProperties(&prop, 0) != cudaSuccess ||
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
        printf("cannot use GPU 0: %s\n", cudaGetErrorString(cudaGetLastError()));
        return EXIT_FAILURE;
    }
    printf("GPU 0: %s\n", prop.name);
    Suite *s = suite_create("ddp_cuda");
    check_tcase(s, "against the host", 60, casts_and_add, sum_of_squares, sgd_plain,
                sgd_momentum_wd, sgd_nesterov_clip_bf16, adamw_plain, adamw_wd_clip_bf16_resumed,
                lion_plain, lion_wd_clip_bf16, nonfinite_skips, comm_exchange);
    /* No fork: a CUDA context does not survive fork(). */
    int rc = check_run_fork(s, CK_NOFORK);
    cudaStreamDestroy(stream);
    return rc;
}
