/*
 * model_gpt.c: the "gpt" row of ddp-train's model table (model.h). A GPT-2-style decoder over
 * bytes (gpt.h) that learns the next byte of a text corpus (data_load_text()): the token and
 * position embeddings are libddp's unit "emb", each block a unit "h<l>" (so ZeRO-3 gathers and
 * releases one block at a time and backward overlaps the reduction of finished blocks), the
 * final LayerNorm the unit "ln_f". The output projection is the token embedding (tied): gpt.h
 * says how the pass takes "emb" twice so that its gradients are marked ready once.
 *
 * The row adapts the trainer's hooks to gpt's (the same shape), keeps its passes' loss, correct
 * and token sums until take(), and samples text from the model (gpt_model_generate(), for
 * --generate). On a GPU (gpt_cuda.h) the same passes run on the device: cuda_compute beside
 * host_compute, each pass's tokens copied from the loader's batch (or the test set) on the host.
 *
 * Options: --layers N, --width C, --heads H, --seq-len T, --recompute.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt.h"
#include "gpt_cuda.h"
#include "mlp_cuda.h"
#include "model.h"
#include "rng.h"

/* The defaults of its options (ddp-train(1), MODELS: 2 ranks on 2 cores, a falling loss in a
 * few minutes). */
#define DEF_LAYERS 4
#define DEF_WIDTH 128
#define DEF_HEADS 4
#define DEF_SEQ 128
#define STR_(x) #x
#define STR(x) STR_(x)

#define MAX_LAYERS 256
#define MAX_WIDTH 16384
#define MAX_SEQ 4096

/* Byte-level: every byte is a token. */
#define VOCAB 256

enum { OPT_LAYERS = MODEL_OPT_BASE, OPT_WIDTH, OPT_HEADS, OPT_SEQ, OPT_RECOMPUTE };

static const cli_option gpt_options_table[] = {
    {OPT_LAYERS, {"--layers"}, "N", STR(DEF_LAYERS), 0, "Number of transformer blocks."},
    {OPT_WIDTH,
     {"--width"},
     "C",
     STR(DEF_WIDTH),
     0,
     "Width of the residual stream (the embeddings); a multiple of --heads."},
    {OPT_HEADS, {"--heads"}, "H", STR(DEF_HEADS), 0, "Attention heads per block."},
    {OPT_SEQ,
     {"--seq-len"},
     "T",
     STR(DEF_SEQ),
     0,
     "Context length: each training sample is T bytes, the targets the same shifted by one."},
    {OPT_RECOMPUTE,
     {"--recompute"},
     NULL,
     NULL,
     0,
     "Keep one block's activations instead of every block's: each block's forward runs again "
     "right before its backward (the same results, a third more compute)."},
};

typedef struct gpt_options {
    int layers, width, heads, seq, recompute;
} gpt_options;

typedef struct gpt_model {
    gpt_config cfg;
    model_env env;
    gpt_hooks hooks;
    int nunits;
    model_unit *units; /* (nunits) */
    gpt *net;          /* host: the model */
    gpt_cuda *gnet;    /* device: the model */
    gpt_stats acc;     /* host: the passes' sums since the last take */
    float *z;          /* device: (vocab) the last position's logits, for --generate */
    char error[256];   /* create()'s failure */
} gpt_model;

static gpt_model *as_gpt(model *m)
{
    return (gpt_model *)m;
}

static const gpt_model *as_cgpt(const model *m)
{
    return (const gpt_model *)m;
}

static void config_init(void *cfg)
{
    *(gpt_options *)cfg =
        (gpt_options){.layers = DEF_LAYERS, .width = DEF_WIDTH, .heads = DEF_HEADS, .seq = DEF_SEQ};
}

static int config_parse(void *cfg, int id, const char *flag, const char *arg)
{
    gpt_options *o = cfg;
    switch (id) {
    case OPT_LAYERS:
        return cli_parse_int(flag, arg, 1, MAX_LAYERS, &o->layers);
    case OPT_WIDTH:
        return cli_parse_int(flag, arg, 1, MAX_WIDTH, &o->width);
    case OPT_HEADS:
        return cli_parse_int(flag, arg, 1, MAX_WIDTH, &o->heads);
    case OPT_RECOMPUTE:
        o->recompute = 1;
        return 0;
    default:
        return cli_parse_int(flag, arg, 1, MAX_SEQ, &o->seq);
    }
}

static int gpt_seq_len(const void *cfg)
{
    return ((const gpt_options *)cfg)->seq;
}

static void gpt_model_free(model *m)
{
    gpt_model *w = as_gpt(m);
    if (!w)
        return;
    gpt_free(w->net);
    gpt_cuda_free(w->gnet);
    free(w->z);
    free(w->units);
    free(w);
}

static int gpt_model_create(const void *cfg, const model_env *env, model **out)
{
    const gpt_options *o = cfg;
    gpt_model *w = calloc(1, sizeof *w);
    *out = NULL;
    if (!w)
        return -ENOMEM;
    w->env = *env;
    w->cfg = (gpt_config){.vocab = VOCAB,
                          .seq = o->seq,
                          .width = o->width,
                          .layers = o->layers,
                          .heads = o->heads,
                          .bf16 = env->bf16,
                          .recompute = o->recompute};
    w->hooks =
        (gpt_hooks){.begin = env->access.begin, .end = env->access.end, .arg = env->access.arg};
    w->nunits = gpt_num_units(&w->cfg);
    if (!(w->units = calloc((size_t)w->nunits, sizeof *w->units))) {
        free(w);
        return -ENOMEM;
    }
    for (int u = 0; u < w->nunits; u++) {
        model_unit *unit = &w->units[u];
        unit->nparams = gpt_unit(&w->cfg, u, unit->name);
        for (int p = 0; p < unit->nparams; p++) {
            model_param *mp = &unit->params[p];
            mp->ndim = gpt_param(&w->cfg, u, p, mp->name, mp->shape);
        }
    }
    *out = (model *)w;
    if (o->width % o->heads) {
        snprintf(w->error, sizeof w->error,
                 "--width %d is not a multiple of --heads %d (each head is width / heads wide)",
                 o->width, o->heads);
        return -EINVAL;
    }
    if (env->device >= 0) {
        int rc = gpt_cuda_create(&w->cfg, env->max_batch, env->stream, &w->gnet);
        if (rc == 0 && !(w->z = malloc((size_t)w->cfg.vocab * sizeof *w->z)))
            rc = -ENOMEM;
        if (rc < 0)
            snprintf(w->error, sizeof w->error, "GPU %d: %s", env->device,
                     rc == -ENOMEM ? "out of memory" : mlp_cuda_last_error());
        return rc;
    }
    int rc = gpt_create(&w->cfg, env->max_batch, &w->net);
    if (rc < 0)
        snprintf(w->error, sizeof w->error, "out of memory for the model's activations");
    return rc;
}

static const char *gpt_model_last_error(const model *m)
{
    const gpt_model *w = as_cgpt(m);
    if (w->error[0])
        return w->error;
    return w->gnet ? mlp_cuda_last_error() : "the model refused its input";
}

static int gpt_model_units(const model *m, const model_unit **out)
{
    *out = as_cgpt(m)->units;
    return as_cgpt(m)->nunits;
}

static int gpt_model_init_param(const model *m, int unit, int param, int index, uint64_t seed,
                                float *data, size_t count)
{
    gpt_init_param(&as_cgpt(m)->cfg, unit, param, seed, (uint64_t)index, data, count);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* The host's compute                                                                          */
/* ------------------------------------------------------------------------------------------ */

static void stats_add(gpt_stats *acc, const gpt_stats *st)
{
    acc->loss_sum += st->loss_sum;
    acc->correct += st->correct;
    acc->tokens += st->tokens;
}

/* A forward over `count` windows at tok (count, T + 1), the stats added. */
static int forward(gpt_model *w, const uint8_t *tok, int count)
{
    gpt_stats st;
    int rc = gpt_reserve(w->net, count);
    if (rc < 0) {
        snprintf(w->error, sizeof w->error, "out of memory for %d sequences' activations", count);
        return rc;
    }
    w->error[0] = '\0';
    rc = gpt_forward(w->net, &w->hooks, tok, count, w->cfg.seq, w->cfg.seq + 1, 1, &st);
    if (rc == 0)
        stats_add(&w->acc, &st);
    return rc;
}

static int host_micro(model *m, const data_batch *b, float loss_scale)
{
    gpt_model *w = as_gpt(m);
    int rc = forward(w, b->tok, b->count);
    return rc < 0 ? rc : gpt_backward(w->net, &w->hooks, loss_scale);
}

static int host_eval(model *m, int start, int count)
{
    gpt_model *w = as_gpt(m);
    const data_set *ds = w->env.test;
    return forward(w, count ? ds->tok + (size_t)start * (ds->seq + 1) : NULL, count);
}

static int host_take(model *m, model_stats *out)
{
    gpt_model *w = as_gpt(m);
    *out = (model_stats){
        .loss_sum = w->acc.loss_sum, .correct = w->acc.correct, .tokens = w->acc.tokens};
    w->acc = (gpt_stats){0};
    return 0;
}

static const model_compute host_compute = {host_micro, host_eval, host_take};

/* The device's: the same passes, their tokens copied from the host during the call. */
static int cuda_micro(model *m, const data_batch *b, float loss_scale)
{
    gpt_model *w = as_gpt(m);
    int T = w->cfg.seq;
    int rc = gpt_cuda_forward(w->gnet, &w->hooks, b->tok, b->count, T, T + 1, 1, NULL);
    return rc < 0 ? rc : gpt_cuda_backward(w->gnet, &w->hooks, loss_scale);
}

static int cuda_eval(model *m, int start, int count)
{
    gpt_model *w = as_gpt(m);
    const data_set *ds = w->env.test;
    int T = w->cfg.seq;
    return gpt_cuda_forward(w->gnet, &w->hooks,
                            count ? ds->tok + (size_t)start * (ds->seq + 1) : NULL, count, T, T + 1,
                            1, NULL);
}

static int cuda_take(model *m, model_stats *out)
{
    gpt_stats st;
    int rc = gpt_cuda_stats_take(as_gpt(m)->gnet, &st);
    if (rc == 0)
        *out = (model_stats){.loss_sum = st.loss_sum, .correct = st.correct, .tokens = st.tokens};
    return rc;
}

static const model_compute cuda_compute = {cuda_micro, cuda_eval, cuda_take};

/* The logits (vocab) after the last of n bytes at text, from a forward over them (no targets)
 * on the host or the device; valid until the next pass. NULL on failure (*rc set). */
static const float *next_logits(gpt_model *w, const uint8_t *text, int n, int *rc)
{
    if (w->gnet) {
        *rc = gpt_cuda_forward(w->gnet, &w->hooks, text, 1, n, n, 0, NULL);
        if (*rc == 0)
            *rc = gpt_cuda_logits(w->gnet, n - 1, 1, w->z);
        return *rc < 0 ? NULL : w->z;
    }
    *rc = gpt_forward(w->net, &w->hooks, text, 1, n, n, 0, NULL);
    return *rc < 0 ? NULL : gpt_logits(w->net) + (size_t)(n - 1) * w->cfg.vocab;
}

/*
 * --generate: the prompt (at least one byte: "\n" when empty) and max_new bytes, each drawn
 * from the logits of the last position after a forward over the newest (at most T) bytes. The
 * draws come from rng.h's generator for (seed, 0), one uniform per byte, so a seed gives the
 * same text on every rank and run.
 */
static int gpt_model_generate(model *m, const char *prompt, int max_new, double temperature,
                              uint64_t seed, FILE *out)
{
    gpt_model *w = as_gpt(m);
    size_t plen = strlen(prompt), cap = (plen ? plen : 1) + (size_t)max_new;
    uint8_t *text = malloc(cap);
    if (!text) {
        snprintf(w->error, sizeof w->error, "out of memory for the text");
        return -ENOMEM;
    }
    memcpy(text, plen ? prompt : "\n", plen ? plen : 1);
    size_t len = plen ? plen : 1;
    if (out)
        fputs(prompt, out);
    rng r;
    rng_init(&r, seed, 0);
    int rc = w->net ? gpt_reserve(w->net, 1) : 0;
    w->error[0] = '\0';
    for (int i = 0; i < max_new && rc == 0; i++) {
        int n = len < (size_t)w->cfg.seq ? (int)len : w->cfg.seq;
        const float *z = next_logits(w, text + len - n, n, &rc);
        if (!z)
            break;
        text[len] = (uint8_t)gpt_sample(z, w->cfg.vocab, (float)temperature, rng_float(&r));
        if (out)
            fputc(text[len], out);
        len++;
    }
    if (out) {
        fputc('\n', out);
        fflush(out);
    }
    free(text);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* What the trainer reports and records                                                        */
/* ------------------------------------------------------------------------------------------ */

/* "GPT 4 layers, width 128, 4 heads, context 128, 188.3 MiB of activations": the model's own
 * memory for a micro-batch's forward and backward ("recomputed" with --recompute). */
static void gpt_model_describe(const model *m, char *buf, size_t cap)
{
    const gpt_model *w = as_cgpt(m);
    const gpt_config *c = &w->cfg;
    snprintf(buf, cap, "GPT %d layers, width %d, %d heads, context %d, %.1f MiB of activations%s",
             c->layers, c->width, c->heads, c->seq,
             (double)(w->gnet ? gpt_cuda_activation_bytes(w->gnet) : gpt_activation_bytes(w->net)) /
                 1048576.0,
             c->recompute ? " (recomputed)" : "");
}

/* The checkpoint's model fields: input width the context, --hidden the width, classes the
 * vocabulary, and the heads (which change no shape, so libddp's check cannot see them). */
static void gpt_model_state(const model *m, train_state *st)
{
    const gpt_config *c = &as_cgpt(m)->cfg;
    st->in_dim = c->seq;
    st->hidden = c->width;
    st->layers = c->layers;
    st->classes = c->vocab;
    st->heads = c->heads;
}

/* model gpt, layers, width, heads, seq_len, vocab, tied "emb.wte", activation gelu_tanh,
 * layer_norm_eps. */
static int gpt_model_meta(const model *m, char key[][32], char value[][MODEL_META_LEN])
{
    const gpt_config *c = &as_cgpt(m)->cfg;
    const struct {
        const char *k;
        int v;
    } ints[] = {{"layers", c->layers},
                {"width", c->width},
                {"heads", c->heads},
                {"seq_len", c->seq},
                {"vocab", c->vocab}};
    int n = 0;
    snprintf(key[n], 32, "model");
    snprintf(value[n++], MODEL_META_LEN, "gpt");
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        snprintf(key[n], 32, "%s", ints[i].k);
        snprintf(value[n++], MODEL_META_LEN, "%d", ints[i].v);
    }
    snprintf(key[n], 32, "activation");
    snprintf(value[n++], MODEL_META_LEN, "gelu_tanh");
    snprintf(key[n], 32, "tied");
    snprintf(value[n++], MODEL_META_LEN, "emb.wte");
    return n;
}

/* A default run of a few minutes on two cores (two epochs of the fortunes, 598 steps) that
 * ends with text of the corpus's shape: --global-batch 64 --epochs 2 --lr 3e-3 --warmup 60. */
static const model_train_defaults gpt_train_defaults = {
    .global_batch = 64, .epochs = 2, .lr = 3e-3, .warmup = 60};

const model_ops model_gpt = {
    .name = "gpt",
    .summary = "A GPT-2-style transformer over bytes: --layers pre-LayerNorm blocks of causal "
               "self-attention (--heads) and a GELU MLP of 4 x --width, learned positions over "
               "--seq-len bytes, the output tied to the token embedding; learns the next byte of "
               "--data's text (default: the fortunes files); on the host (OpenBLAS) or a GPU "
               "(cuBLAS).",
    .options = gpt_options_table,
    .noptions = sizeof gpt_options_table / sizeof gpt_options_table[0],
    .config_size = sizeof(gpt_options),
    .config_init = config_init,
    .config_parse = config_parse,
    .create = gpt_model_create,
    .free = gpt_model_free,
    .last_error = gpt_model_last_error,
    .units = gpt_model_units,
    .init_param = gpt_model_init_param,
    .host = &host_compute,
    .device = &cuda_compute,
    .describe = gpt_model_describe,
    .state = gpt_model_state,
    .meta = gpt_model_meta,
    .data_kind = 1,
    .seq_len = gpt_seq_len,
    .generate = gpt_model_generate,
    .train_defaults = &gpt_train_defaults,
};
