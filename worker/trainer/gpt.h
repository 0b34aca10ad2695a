/*
 * gpt: ddp-train's transformer, a GPT-2-style decoder over bytes, forward and backward on the
 * host with OpenBLAS (every matrix product is a cblas_sgemm) and written kernels for the
 * LayerNorms, the causal softmax of attention, GELU and the loss, in the manner of llm.c's
 * train_gpt2.c: one function per operation, shapes next to the code.
 *
 * The model: token embedding wte (V, C) and learned position embedding wpe (T, C) summed;
 * L pre-LayerNorm blocks x += attn(ln_1(x)); x += mlp(ln_2(x)), attention causal with H heads
 * of C / H and a fused qkv projection (3C, C), the MLP C -> 4C -> C with GELU's tanh
 * approximation (GPT-2's); a final LayerNorm ln_f; logits = ln_f(x) wte^T (the output
 * projection tied to the token embedding); softmax cross-entropy against the next byte. Linear
 * layers have torch.nn.Linear's layout (out, in) and a bias; LayerNorm's eps is 1e-5.
 *
 * Units (libddp's, through gpt_hooks), in registration order, with their parameters:
 *   0        "emb":  wte (V, C), wpe (T, C)
 *   1 .. L   "h<l>": ln_1.weight (C), ln_1.bias (C), attn.c_attn.weight (3C, C),
 *                    attn.c_attn.bias (3C), attn.c_proj.weight (C, C), attn.c_proj.bias (C),
 *                    ln_2.weight (C), ln_2.bias (C), mlp.c_fc.weight (4C, C), mlp.c_fc.bias (4C),
 *                    mlp.c_proj.weight (C, 4C), mlp.c_proj.bias (C)
 *   L + 1    "ln_f": weight (C), bias (C)
 * The tied wte is used twice per pass: forward begins and ends "emb" at the embedding and again
 * at the logits; backward takes it first for the logits (its parameters only, begin/end with
 * backward 0, the wte gradient kept in the model's scratch) and last for the embedding's
 * backward (backward 1: both gradients added, so the unit's gradients become final once, at
 * its last use). So a pass runs begin/end L + 3 times: forward 0, 1 .. L, L+1, 0; backward
 * 0 (parameters only), L+1, L .. 1, 0.
 *
 * Ownership as mlp.h: parameters and gradients belong to the caller and are added into (+=),
 * the model owns its activations (gpt_reserve()).
 *
 * Mixed precision (cfg.bf16 = 1), as the MLP's (mlp.h): the parameters come as bf16 and are
 * widened to f32; every activation or activation gradient that enters a matrix product is
 * rounded to bf16 (the LayerNorms' outputs, qkv, the attention probabilities and its output,
 * GELU's output; the gradients of the logits, of the residual stream where it enters a product,
 * of the attention scores, of qkv and of the MLP's hidden layer); products, the residual stream,
 * the LayerNorm, softmax, GELU arithmetic, the loss and the parameter gradients stay f32.
 *
 * Conventions: functions that can fail return 0 or a negative errno (-EINVAL, -ENOMEM) or the
 * hook's own negative code. A model is used by one thread at a time.
 */
#ifndef DDP_TRAIN_GPT_H
#define DDP_TRAIN_GPT_H

#include <stddef.h>
#include <stdint.h>

/* Parameters per block unit, and at most per unit. */
#define GPT_BLOCK_PARAMS 12

/*
 * Attention works on blocks of GPT_ATT_BLOCK query rows (and key columns): a query block's
 * scores and outputs need only the keys up to its last row, and a key block's gradients only
 * the queries from its first, so its products skip the blocks above the diagonal (at a context
 * of 128, 62.5% of the full T x T work is done). The entries skipped are zero after the
 * softmax, so every sum keeps its nonzero terms; OpenBLAS's kernels, which differ by shape,
 * may round a result a unit differently from the full product's.
 */
#define GPT_ATT_BLOCK 32

/*
 * LayerNorm's row sums (the mean, the variance, the backward's two) run in GPT_LN_LANES
 * partial sums, element j added to lane j mod GPT_LN_LANES in order of j, and the lanes by
 * halving at the end (lane k += lane k + 8, then lane k += lane k + 4, then (0 + 2) + (1 + 3)):
 * a vector register's worth of independent adds instead of one chain of C dependent ones.
 * gpt.c's kernel sets and gpt_cuda.cu's kernels sum so.
 */
#define GPT_LN_LANES 16

typedef struct gpt_config {
    int vocab;  /* V: 256 for bytes */
    int seq;    /* T: the context length, the rows of wpe; > 0 */
    int width;  /* C: a multiple of heads; > 0 */
    int layers; /* L: blocks; >= 1 */
    int heads;  /* H; >= 1 */
    int bf16;   /* 0: f32 throughout; 1: bf16 parameters and activations (see above) */
    /* 1: keep only each block's input from forward to backward and compute the block's
     * activations again right before its backward (the same bits): one block's activations in
     * memory instead of L, for a third more compute */
    int recompute;
} gpt_config;

/* Checks cfg's ranges: 0 or -EINVAL. */
int gpt_config_check(const gpt_config *c);

/* Units: layers + 2. */
int gpt_num_units(const gpt_config *c);
/* Unit u's name into name[32] and its number of parameters. */
int gpt_unit(const gpt_config *c, int u, char name[32]);
/* Parameter p of unit u: its name into name[32], its shape into shape[2]; returns ndim. */
int gpt_param(const gpt_config *c, int u, int p, char name[32], int64_t shape[2]);
/* The number of parameters (numbers) of the whole model. */
size_t gpt_num_params(const gpt_config *c);

/*
 * GPT-2's initialisation of parameter p of unit u (count floats): weights and embeddings
 * N(0, 0.02), the two residual projections (attn.c_proj.weight, mlp.c_proj.weight)
 * N(0, 0.02 / sqrt(2L)), biases 0, LayerNorm weights 1. The draws come from rng.h's generator
 * for (seed, stream); ddp-train uses the parameter's index over the model as the stream.
 */
void gpt_init_param(const gpt_config *c, int u, int p, uint64_t seed, uint64_t stream, float *data,
                    size_t count);

typedef struct gpt gpt;

/*
 * Creates a model for cfg (copied) with room for max_batch sequences of cfg.seq tokens.
 * Returns 0 and sets *out, -EINVAL or -ENOMEM.
 */
int gpt_create(const gpt_config *cfg, int max_batch, gpt **out);
/* Frees the model. NULL is a no-op. */
void gpt_free(gpt *m);

/* Makes room for batches of `rows` sequences (more memory only: never shrinks). Returns 0 or
 * -ENOMEM (the model keeps its room). */
int gpt_reserve(gpt *m, int rows);

/* Bytes of activations the model holds (for its room now). */
size_t gpt_activation_bytes(const gpt *m);

/*
 * The caller's view of the parameters, unit by unit: begin(arg, unit, backward, params, grads)
 * fills params[0..nparams) (f32, or bf16 bit patterns with cfg.bf16) and, when backward is 1,
 * grads[0..nparams) (f32, added into); end(arg, unit, backward) says the model is done with it
 * (backward 1: its gradients are final). model.h's model_access has this shape. A negative
 * return stops the pass, which returns it (end is not called after a failed begin).
 */
typedef struct gpt_hooks {
    int (*begin)(void *arg, int unit, int backward, void **params, float **grads);
    int (*end)(void *arg, int unit, int backward);
    void *arg;
} gpt_hooks;

/* What a forward pass measured. */
typedef struct gpt_stats {
    double loss_sum; /* sum over the predicted tokens of the cross-entropy (natural log) */
    double correct;  /* predicted tokens whose argmax (first maximum) is the target */
    double tokens;   /* predicted tokens */
} gpt_stats;

/*
 * Forward over B sequences: row b's tokens are tok[b * ld .. b * ld + len) (borrowed until
 * gpt_backward() returns); with `targets` its targets are the next bytes, tok[b * ld + 1 ..
 * b * ld + len], and the loss is measured (ld >= len + 1), else only the logits are made. B may
 * be 0 (the hooks still run). Returns 0, -EINVAL (B beyond the room, len out of [1, seq], a token
 * not below vocab) or a hook's code; fills *stats when given.
 */
int gpt_forward(gpt *m, const gpt_hooks *h, const uint8_t *tok, int B, int len, int ld, int targets,
                gpt_stats *stats);

/*
 * Backward of the latest forward (with targets), for the loss loss_scale * (sum over its
 * tokens of the cross-entropy), adding every parameter's gradient. Returns 0, -EINVAL (no
 * forward with targets before) or a hook's code.
 */
int gpt_backward(gpt *m, const gpt_hooks *h, float loss_scale);

/* The latest forward's logits, (B, len, V) (probabilities after a forward with targets). */
const float *gpt_logits(const gpt *m);

/*
 * The element-wise kernels (GELU, attention's exponentials, LayerNorm) exist as a portable set
 * and, on x86-64, AVX2 and AVX-512F ones, of which gpt_create() picks the widest the CPU runs
 * (never by -march); all give the same bits. gpt_kernel_set() names the model's ("portable",
 * "avx2" or "avx512"); gpt_use_kernel_set() makes it use the named one, for tests: 0, or
 * -ENOTSUP (unknown here, or the CPU lacks it).
 */
const char *gpt_kernel_set(const gpt *m);
int gpt_use_kernel_set(gpt *m, const char *name);

/*
 * A byte drawn from logits z (V): argmax (the first) when temperature is 0, else from
 * softmax(z / temperature) with u uniform on [0, 1).
 */
int gpt_sample(const float *z, int V, float temperature, float u);

#endif /* DDP_TRAIN_GPT_H */
