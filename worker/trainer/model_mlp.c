/*
 * model_mlp.c: the "mlp" row of ddp-train's model table (model.h), the default model. A
 * multi-layer perceptron in -> H -> ... -> H -> 10 (mlp.h) on the host, or on a GPU
 * (mlp_cuda.h), whose linear layers are libddp's units: layer l is unit "fc<l+1>" with a
 * weight (out, in) and a bias (out), initialised as torch.nn.Linear does.
 *
 * The row adapts the trainer's hooks to mlp's (one mlp_layer per unit, f32 or bf16 by
 * --precision) and keeps the loss and correct sums of its passes until take(). On a device it
 * uploads both data sets once (their bytes; the device normalises what it gathers), and each
 * micro-step sends only the batch's indices.
 *
 * Options: --hidden H (the width of every hidden layer), --layers N (hidden layers).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "mlp.h"
#include "mlp_cuda.h"
#include "model.h"

/* The defaults of its options. */
#define DEF_HIDDEN 512
#define DEF_LAYERS 2
#define STR_(x) #x
#define STR(x) STR_(x)

/* --layers at most: hidden layers, so MAX_LAYERS + 1 linear layers. */
#define MAX_LAYERS 64

/* Fashion-MNIST's classes. */
#define CLASSES 10

enum { OPT_HIDDEN = MODEL_OPT_BASE, OPT_LAYERS };

static const cli_option mlp_options_table[] = {
    {OPT_HIDDEN, {"--hidden"}, "H", STR(DEF_HIDDEN), 0, "Width of each hidden layer."},
    {OPT_LAYERS, {"--layers"}, "N", STR(DEF_LAYERS), 0, "Number of hidden layers."},
};

typedef struct mlp_options {
    int hidden, layers;
} mlp_options;

typedef struct mlp_model {
    mlp_config cfg;
    model_env env;
    mlp_hooks hooks;
    int L;                         /* linear layers: the units */
    model_unit *units;             /* (L) */
    mlp *net;                      /* host: the model */
    mlp_stats acc;                 /* host: the passes' sums since the last take */
    mlp_cuda *gnet;                /* device: the model */
    mlp_cuda_data *gtrain, *gtest; /* device: the data sets */
    char error[256];               /* create()'s failure */
} mlp_model;

static mlp_model *as_mlp(model *m)
{
    return (mlp_model *)m;
}

static const mlp_model *as_cmlp(const model *m)
{
    return (const mlp_model *)m;
}

static void config_init(void *cfg)
{
    *(mlp_options *)cfg = (mlp_options){.hidden = DEF_HIDDEN, .layers = DEF_LAYERS};
}

static int config_parse(void *cfg, int id, const char *flag, const char *arg)
{
    mlp_options *o = cfg;
    if (id == OPT_HIDDEN)
        return cli_parse_int(flag, arg, 1, 1 << 16, &o->hidden);
    return cli_parse_int(flag, arg, 1, MAX_LAYERS, &o->layers);
}

/* mlp's hooks on the trainer's: one linear layer is one unit, its parameters (W, b). */
static int hook_begin(void *arg, int l, int backward, mlp_layer *io)
{
    mlp_model *w = arg;
    void *p[2] = {0};
    float *g[2] = {0};
    int rc = w->env.access.begin(w->env.access.arg, l, backward, p, g);
    if (rc < 0)
        return rc;
    if (w->cfg.bf16) {
        io->W16 = p[0];
        io->b16 = p[1];
    } else {
        io->W = p[0];
        io->b = p[1];
    }
    if (backward) {
        io->dW = g[0];
        io->db = g[1];
    }
    return 0;
}

static int hook_end(void *arg, int l, int backward)
{
    mlp_model *w = arg;
    return w->env.access.end(w->env.access.arg, l, backward);
}

static void mlp_model_free(model *m)
{
    mlp_model *w = as_mlp(m);
    if (!w)
        return;
    mlp_free(w->net);
    mlp_cuda_free(w->gnet);
    mlp_cuda_data_free(w->gtrain);
    mlp_cuda_data_free(w->gtest);
    free(w->units);
    free(w);
}

/* The model and both data sets on the device. Returns 0 or a negative code (w->error). */
static int create_cuda(mlp_model *w)
{
    const model_env *env = &w->env;
    int rc = mlp_cuda_create(&w->cfg, env->max_batch, env->stream, &w->gnet);
    for (int i = 0; i < 2 && rc == 0; i++) {
        const data_set *ds = i ? env->test : env->train;
        uint8_t *pix = malloc((size_t)ds->n * ds->dim);
        if (!pix) {
            snprintf(w->error, sizeof w->error, "out of memory");
            return -ENOMEM;
        }
        data_pixels(ds, pix);
        rc = mlp_cuda_data_create(pix, ds->y, ds->n, ds->dim, env->max_batch, env->bf16,
                                  env->stream, i ? &w->gtest : &w->gtrain);
        free(pix);
    }
    if (rc < 0)
        snprintf(w->error, sizeof w->error, "GPU %d: %s", env->device, mlp_cuda_last_error());
    return rc;
}

static int mlp_model_create(const void *cfg, const model_env *env, model **out)
{
    const mlp_options *o = cfg;
    mlp_model *w = calloc(1, sizeof *w);
    *out = NULL;
    if (!w)
        return -ENOMEM;
    w->env = *env;
    w->cfg = (mlp_config){.in_dim = env->train->dim,
                          .hidden = o->hidden,
                          .layers = o->layers,
                          .classes = CLASSES,
                          .bf16 = env->bf16};
    w->hooks = (mlp_hooks){.begin = hook_begin, .end = hook_end, .arg = w};
    w->L = mlp_num_linear(&w->cfg);
    if (!(w->units = calloc((size_t)w->L, sizeof *w->units))) {
        free(w);
        return -ENOMEM;
    }
    for (int l = 0; l < w->L; l++) {
        model_unit *u = &w->units[l];
        int in = mlp_layer_in(&w->cfg, l), outw = mlp_layer_out(&w->cfg, l);
        snprintf(u->name, sizeof u->name, "fc%d", l + 1);
        u->nparams = 2;
        u->params[0] = (model_param){"weight", 2, {outw, in}};
        u->params[1] = (model_param){"bias", 1, {outw}};
    }
    *out = (model *)w;
    if (env->device >= 0)
        return create_cuda(w);
    int rc = mlp_create(&w->cfg, env->max_batch, &w->net);
    if (rc < 0)
        snprintf(w->error, sizeof w->error, "out of memory for the model's activations");
    return rc;
}

static const char *mlp_model_last_error(const model *m)
{
    const mlp_model *w = as_cmlp(m);
    if (w->error[0])
        return w->error;
    return w->env.device >= 0 ? mlp_cuda_last_error() : "the model refused its input";
}

static int mlp_model_units(const model *m, const model_unit **out)
{
    *out = as_cmlp(m)->units;
    return as_cmlp(m)->L;
}

/* torch.nn.Linear's bounds, the parameter's own stream of the seed. */
static int mlp_model_init_param(const model *m, int unit, int param, int index, uint64_t seed,
                                float *data, size_t count)
{
    (void)param;
    mlp_init_uniform(data, count, mlp_layer_in(&as_cmlp(m)->cfg, unit), seed, (uint64_t)index);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* The compute: the host's and the device's                                                    */
/* ------------------------------------------------------------------------------------------ */

static void stats_add(mlp_stats *acc, const mlp_stats *st)
{
    acc->loss_sum += st->loss_sum;
    acc->correct += st->correct;
}

static int host_micro(model *m, const data_batch *b, float loss_scale)
{
    mlp_model *w = as_mlp(m);
    mlp_stats st;
    int rc = mlp_forward(w->net, &w->hooks, b->x, b->y, b->count, &st);
    if (rc < 0)
        return rc;
    stats_add(&w->acc, &st);
    return mlp_backward(w->net, &w->hooks, loss_scale);
}

static int host_eval(model *m, int start, int count)
{
    mlp_model *w = as_mlp(m);
    const data_set *ds = w->env.test;
    mlp_stats st;
    int rc = mlp_forward(w->net, &w->hooks, count ? ds->x + (size_t)start * ds->dim : NULL,
                         count ? ds->y + start : NULL, count, &st);
    if (rc == 0)
        stats_add(&w->acc, &st);
    return rc;
}

static int host_take(model *m, model_stats *out)
{
    mlp_model *w = as_mlp(m);
    *out = (model_stats){.loss_sum = w->acc.loss_sum, .correct = w->acc.correct};
    w->acc = (mlp_stats){0};
    return 0;
}

static const model_compute host_compute = {host_micro, host_eval, host_take};

/* The batch's indices go to the device, which gathers the rows from its copy of the set. */
static int cuda_micro(model *m, const data_batch *b, float loss_scale)
{
    mlp_model *w = as_mlp(m);
    const void *x;
    const uint8_t *y;
    int rc = mlp_cuda_data_batch(w->gtrain, b->index, 0, b->count, &x, &y);
    if (rc == 0)
        rc = mlp_cuda_forward(w->gnet, &w->hooks, x, y, b->count, NULL);
    if (rc == 0)
        rc = mlp_cuda_backward(w->gnet, &w->hooks, loss_scale);
    return rc;
}

static int cuda_eval(model *m, int start, int count)
{
    mlp_model *w = as_mlp(m);
    const void *x;
    const uint8_t *y;
    int rc = mlp_cuda_data_batch(w->gtest, NULL, start, count, &x, &y);
    return rc < 0 ? rc : mlp_cuda_forward(w->gnet, &w->hooks, x, y, count, NULL);
}

static int cuda_take(model *m, model_stats *out)
{
    mlp_stats st;
    int rc = mlp_cuda_stats_take(as_mlp(m)->gnet, &st);
    if (rc == 0)
        *out = (model_stats){.loss_sum = st.loss_sum, .correct = st.correct};
    return rc;
}

static const model_compute cuda_compute = {cuda_micro, cuda_eval, cuda_take};

/* ------------------------------------------------------------------------------------------ */
/* What the trainer reports and records                                                        */
/* ------------------------------------------------------------------------------------------ */

/* "MLP 784-512-512-10" */
static void mlp_model_describe(const model *m, char *buf, size_t cap)
{
    const mlp_config *c = &as_cmlp(m)->cfg;
    char shape[256];
    int len = snprintf(shape, sizeof shape, "%d", c->in_dim);
    for (int l = 0; l < c->layers && len < (int)sizeof shape - 16; l++)
        len += snprintf(shape + len, sizeof shape - len, "-%d", c->hidden);
    snprintf(shape + len, sizeof shape - len, "-%d", c->classes);
    snprintf(buf, cap, "MLP %s", shape);
}

static void mlp_model_state(const model *m, train_state *st)
{
    const mlp_config *c = &as_cmlp(m)->cfg;
    st->in_dim = c->in_dim;
    st->hidden = c->hidden;
    st->layers = c->layers;
    st->classes = c->classes;
}

/* model mlp, layer_sizes "784,512,512,10" (in, each hidden layer, out: the nn.Linear sizes),
 * activation relu (between the linear layers, none after the last), hidden, layers. */
static int mlp_model_meta(const model *m, char key[][32], char value[][MODEL_META_LEN])
{
    const mlp_config *c = &as_cmlp(m)->cfg;
    snprintf(key[0], 32, "model");
    snprintf(value[0], MODEL_META_LEN, "mlp");
    snprintf(key[1], 32, "layer_sizes");
    int len = snprintf(value[1], MODEL_META_LEN, "%d", c->in_dim);
    for (int l = 0; l < c->layers; l++) /* 65 numbers of at most 6 bytes: it fits */
        len += snprintf(value[1] + len, MODEL_META_LEN - (size_t)len, ",%d", c->hidden);
    snprintf(value[1] + len, MODEL_META_LEN - (size_t)len, ",%d", c->classes);
    snprintf(key[2], 32, "activation");
    snprintf(value[2], MODEL_META_LEN, "relu");
    snprintf(key[3], 32, "hidden");
    snprintf(value[3], MODEL_META_LEN, "%d", c->hidden);
    snprintf(key[4], 32, "layers");
    snprintf(value[4], MODEL_META_LEN, "%d", c->layers);
    return 5;
}

const model_ops model_mlp = {
    .name = "mlp",
    .summary = "A multi-layer perceptron: --layers hidden layers of --hidden units with ReLU, "
               "softmax cross-entropy over the 10 classes; on the host (OpenBLAS) or a GPU "
               "(cuBLAS).",
    .options = mlp_options_table,
    .noptions = sizeof mlp_options_table / sizeof mlp_options_table[0],
    .config_size = sizeof(mlp_options),
    .config_init = config_init,
    .config_parse = config_parse,
    .create = mlp_model_create,
    .free = mlp_model_free,
    .last_error = mlp_model_last_error,
    .units = mlp_model_units,
    .init_param = mlp_model_init_param,
    .host = &host_compute,
    .device = &cuda_compute,
    .describe = mlp_model_describe,
    .state = mlp_model_state,
    .meta = mlp_model_meta,
};
