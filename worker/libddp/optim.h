/*
 * libddp's optimizer kernels (internal): the SGD, AdamW and Lion updates of one contiguous range of
 * float32 elements (an owned shard, a bucket, a whole arena), and the small vector helpers the
 * step needs around them (sum of squares for the gradient norm, scaling for clipping and
 * averaging, accumulation, the finiteness check). The learning-rate schedule, ddp_schedule_lr(),
 * is public and declared in ddp.h; its exact formula is given at the end of this file.
 *
 * Conventions for every kernel below:
 *  - Arrays are float32, host memory, `n` elements (a count, not bytes). They are borrowed for
 *    the call; nothing is kept, allocated or freed. When n == 0 nothing is read or written and
 *    the pointers may be NULL. Any alignment is accepted (an element's natural 4 bytes).
 *  - Arrays written by a kernel must not overlap any other array of the same call, except where
 *    a function says otherwise. Reading and writing stop at element n - 1.
 *  - The kernels never fail (preconditions are assert()ed), never print and keep no state but
 *    the choice of instruction set, which is made once, at run time, from the CPU (AVX-512F,
 *    else AVX2 + FMA, else portable C). Every instruction set gives bit-identical results, so
 *    the choice never changes a training run. Thread-safe.
 *  - SGD and AdamW follow PyTorch's torch.optim.SGD and torch.optim.AdamW (single-tensor path,
 *    foreach and fused off) operation by operation, including where PyTorch's CPU kernels fuse a
 *    multiply and an add. On a CPU where PyTorch uses its AVX2 or AVX-512 kernels, SGD (the
 *    parameters and the momentum buffer) and AdamW's two moments match it bit for bit. AdamW's
 *    parameters may differ in the last place: our sqrt is IEEE's, correctly rounded, while
 *    PyTorch's CPU float sqrt (MKL's vector math in the PyPI builds) is 1 ulp off for about a
 *    fifth of its inputs, which moves the occasional update by an ulp. tests/libddp/optim_torch.py
 *    checks both. Hyperparameters arrive as float;
 *    the per-call coefficients are computed in double from those float values, as PyTorch
 *    computes them from Python floats, and rounded to float once. So to reproduce PyTorch
 *    exactly, give it the float32-representable values (0.9f is 0.89999997615814208984375).
 *
 * Building with -DDDP_OPTIM_PORTABLE leaves out the vector code (the portable test build).
 */
#ifndef DDP_OPTIM_H
#define DDP_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "bf16conv.h"
#include "ddp.h"

/*
 * One torch.optim.SGD step (dampening 0, maximize off) on n elements, per element i:
 *
 *   g = grad[i]                                      read-only: grad is never written
 *   if weight_decay != 0:  g = fma(weight_decay, param[i], g)
 *   if momentum != 0:
 *       buf = first_step ? g : momentum_buf[i] * momentum + g      (two roundings)
 *       momentum_buf[i] = buf
 *       g = nesterov ? fma(momentum, buf, g) : buf
 *   param[i] = fma(-lr, g, param[i])
 *
 * fma() is the fused multiply-add (one rounding), as in PyTorch's add(alpha=...). `param` (in
 * place) and `momentum_buf` (in place; read only when !first_step) are updated; momentum_buf
 * must be NULL iff momentum == 0 (and n may be anything then). `first_step` is nonzero on the
 * first step that uses this buffer (PyTorch's buffer is then created from g); `nesterov` needs
 * momentum != 0. lr is in parameter units per gradient unit; momentum and weight_decay are
 * plain factors. param, grad and momentum_buf must not overlap.
 */
void ddp__sgd_step(float *param, const float *grad, float *momentum_buf, size_t n, float lr,
                   float momentum, int nesterov, float weight_decay, int first_step);

/*
 * One torch.optim.AdamW step (amsgrad and maximize off) on n elements; `step` is the 1-based
 * number of this step (PyTorch's state["step"] after its increment). Once per call, in double
 * from the float arguments:
 *
 *   decay     = float(1 - lr * weight_decay)
 *   w         = float(1 - beta1)              the lerp weight of the first moment
 *   c2        = float(1 - beta2)
 *   bc2_sqrt  = float(pow(1 - beta2^step, 0.5))
 *   neg_step  = float(-(lr / (1 - beta1^step)))
 *
 * then per element i, in float:
 *
 *   p = weight_decay != 0 ? param[i] * decay : param[i]
 *   m[i] = lerp(m[i], grad[i], w)             PyTorch's lerp: |w| < 0.5 ? fma(w, g - m, m)
 *                                                                       : fma(w - 1, g - m, g)
 *   v[i] = fma(c2 * grad[i], grad[i], v[i] * beta2)
 *   param[i] = p + (neg_step * m[i]) / (sqrt(v[i]) / bc2_sqrt + eps)
 *
 * which is m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2, param -= lr mhat / (sqrt(vhat) +
 * eps) with the bias corrections folded the way PyTorch folds them. `param`, `m` and `v` (the
 * first and second moments, zero before step 1) are updated in place; grad is read-only. No two
 * of the four may overlap. Requires step >= 1.
 */
void ddp__adamw_step(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, int64_t step);

/*
 * One Lion step (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", with
 * decoupled weight decay as PyTorch implementations apply it) on n elements. Once per call, in
 * double from the float arguments:
 *
 *   decay = float(1 - lr * weight_decay)
 *   c1    = float(1 - beta1)
 *   c2    = float(1 - beta2)
 *
 * then per element i, in float:
 *
 *   p = weight_decay != 0 ? param[i] * decay : param[i]
 *   c = fma(c1, grad[i], m[i] * beta1)          the interpolation whose sign is the update
 *   param[i] = fma(-lr, sign(c), p)             sign: +1, -1, or 0 for 0 (and for NaN)
 *   m[i] = fma(c2, grad[i], m[i] * beta2)       the momentum, with its own rate
 *
 * which is torch's p.mul_(1 - lr * wd); p.add_((m * b1 + (1 - b1) g).sign(), alpha=-lr);
 * m.mul_(b2).add_(g, alpha=1 - b2), operation by operation (tests/optim_torch.py runs those
 * lines). `param` and `m` (zero before the first step) are updated in place; grad is
 * read-only. No two of the three may overlap. Every element moves by exactly lr (or 0) after
 * the decay: the update has no scale of its own, so Lion wants a smaller lr than AdamW.
 */
void ddp__lion_step(float *param, const float *grad, float *m, size_t n, float lr, float beta1,
                    float beta2, float weight_decay);

/*
 * The sum of x[i]^2 over n elements, accumulated in double (each square is exact in double).
 * The order of summation is fixed: element i goes into lane i mod 32, lanes are summed in
 * index order, and the 32 lanes are added pairwise (lane j += lane j + 16, then + 8, + 4, + 2,
 * + 1). So the result depends only on the values and n: not on x's alignment, not on the
 * instruction set, and not on the run. Not finite if an element is not. Returns 0 for n == 0.
 */
double ddp__sum_squares(const float *x, size_t n);

/* x[i] *= s for n elements, in place (one rounding each). */
void ddp__scale(float *x, size_t n, float s);

/* dst[i] += src[i] for n elements. src may equal dst (doubling it); no other overlap. */
void ddp__add(float *dst, const float *src, size_t n);

/* 1 if none of the n elements is an infinity or a NaN (n == 0 included), else 0. */
int ddp__all_finite(const float *x, size_t n);

/*
 * bf16, emulated on the host, rounds with the project's one conversion (bf16conv.h:
 * bf16_from_f32(), bf16_to_f32()), as the CUDA kernels (ddp_cuda.cu) do, bit for bit.
 */
/* dst[i] = bf16(src[i] * scale) for n elements (scale 1: a plain cast; the product is rounded
 * to f32 first, then to bf16). */
void ddp__to_bf16(uint16_t *dst, const float *src, size_t n, float scale);

/* dst[i] = f32(src[i]) (add == 0) or dst[i] += f32(src[i]) (add != 0) for n elements. */
void ddp__from_bf16(float *dst, const uint16_t *src, size_t n, int add);

/*
 * ddp_schedule_lr(s, step), declared in ddp.h, computes in double and rounds once to float.
 * With W = max(s->warmup_steps, 0), T = s->total_steps, t = max(step, 0) (a negative step is
 * step 0), lr = s->lr, min = s->min_lr:
 *
 *   t < W                           lr * (t + 1) / W        (linear warmup: step 0 gets lr / W,
 *                                                            step W - 1 gets lr)
 *   DDP_SCHED_CONSTANT, t >= W      lr
 *   DDP_SCHED_COSINE,   t >= T      min                     (reached at T, then kept)
 *   DDP_SCHED_COSINE,   W <= t < T  min + (lr - min) * (1 + cos(pi * (t - W) / (T - W))) / 2
 *
 * This is llm.c's schedule and PyTorch's CosineAnnealingLR (eta_min = min, T_max = T - W)
 * after a linear warmup. Warmup takes precedence, so when W >= T (T == 0 included) a cosine
 * schedule warms up and then stays at min. NULL or an unknown kind gives NaN. Pure; thread-safe.
 */

/* ------------------------------------------------------------------------------------------ */
/* Instruction sets (tests and benchmarks)                                                     */
/* ------------------------------------------------------------------------------------------ */

/* The kernel sets. Which ones a binary has depends on the build; which run, on the CPU. */
enum { DDP__ISA_PORTABLE = 0, DDP__ISA_AVX2 = 1, DDP__ISA_AVX512 = 2, DDP__ISA_COUNT = 3 };

/* The kernel set in use: the best one this build and CPU support, unless forced below. */
int ddp__optim_isa(void);

/* 1 if `isa` is built in and this CPU (and its OS) can run it, else 0. */
int ddp__optim_isa_supported(int isa);

/* "portable", "avx2", "avx512", or "?" for anything else. Static. */
const char *ddp__optim_isa_name(int isa);

/*
 * Makes every kernel above use `isa` from now on (-1: the best supported one again). For tests
 * that compare the sets; the process-wide choice is atomic, but a kernel already running
 * finishes with the set it started with. Returns 0, -EINVAL (no such set) or -ENOTSUP (not
 * built in, or not supported by this CPU).
 */
int ddp__optim_use_isa(int isa);

#endif /* DDP_OPTIM_H */
