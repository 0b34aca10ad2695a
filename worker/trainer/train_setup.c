/*
 * train_setup.c: what ddp-train sets up before it trains. The data set with this rank's sampler
 * and the learning-rate schedule; and the model: the row of model.h that --model chose,
 * created on this rank's device, its units and parameters registered with libddp in the order
 * the model lists them, and the hooks through which its passes take libddp's tensors.
 *
 * Not here: the job (train_job.c) or a checkpoint to start from (train_ckpt.c).
 */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trainer.h"

/*
 * Appends "FLAG A or B" (either may be -1: missing), after "; " unless it is the first item, to
 * buf[0..cap) at *len; nothing when both are missing.
 */
static void hint_pair(char *buf, size_t cap, size_t *len, const char *flag, long a, long b)
{
    if ((a < 0 && b < 0) || *len >= cap)
        return;
    const char *sep = *len ? "; " : "";
    int k = a >= 0 && b >= 0
                ? snprintf(buf + *len, cap - *len, "%s%s%ld or %ld", sep, flag, a, b)
                : snprintf(buf + *len, cap - *len, "%s%s%ld", sep, flag, a >= 0 ? a : b);
    if (k > 0)
        *len += (size_t)k;
}

/* The divisors of p nearest to v, below and above it (v itself excluded); -1 where none. */
static void near_divisors(long p, long v, long *below, long *above)
{
    *below = *above = -1;
    for (long d = v - 1; d >= 1 && *below < 0; d--)
        if (p % d == 0)
            *below = d;
    for (long d = v + 1; d <= p && *above < 0; d++)
        if (p % d == 0)
            *above = d;
}

/*
 * The settings nearest to the given ones under which world size x v (v: the micro-steps, or
 * --micro-batch's rows) divides the global batch gb, for the error that refuses it: the nearest
 * global batches (from 1 to the data set's n rows); when the ranks divide gb, the nearest values
 * of `what` (the flag v came from); the nearest world sizes. Writes "--global-batch 252 or 258;
 * ..." into buf ("" when nothing works, which cannot happen: 1 rank with v 1 always does).
 */
static void batch_hint(char *buf, size_t cap, int gb, int world, const char *what, int v, int n)
{
    long per = (long)world * v, lo = gb / per * per, hi = lo + per, below, above;
    size_t len = 0;
    char flag[32];
    buf[0] = '\0';
    hint_pair(buf, cap, &len, "--global-batch ", lo >= 1 ? lo : -1, hi <= n ? hi : -1);
    if (gb % world == 0) {
        near_divisors(gb / world, v, &below, &above);
        snprintf(flag, sizeof flag, "%s ", what);
        hint_pair(buf, cap, &len, flag, below, above);
    }
    below = above = -1;
    for (long w = world - 1; w >= 1 && below < 0; w--)
        if (gb % (w * v) == 0)
            below = w;
    for (long w = world + 1; w * v <= gb && above < 0; w++)
        if (gb % (w * v) == 0)
            above = w;
    hint_pair(buf, cap, &len, "a world size of ", below, above);
}

/*
 * A text model's data (data.h, data_load_text()): --data's values, each split at its commas,
 * or the default corpus when none was given, cut into windows of the model's context length.
 * Returns 0 or EXIT_USAGE (printed).
 */
static int load_text(trainer *t)
{
    train_args *a = &t->a;
    const char *paths[TRAIN_MAX_DATA * 8];
    char *copies[TRAIN_MAX_DATA] = {0};
    int npaths = 0, rc = EXIT_USAGE;
    for (int i = 0; i < a->ndata; i++) {
        if (!(copies[i] = strdup(a->data_args[i]))) {
            train_err("rank %d: out of memory", t->rank);
            goto out;
        }
        for (char *p = copies[i], *end; p; p = end) {
            if ((end = strchr(p, ',')))
                *end++ = '\0';
            if (!*p) {
                train_err("--data '%s': an empty name in the list", a->data_args[i]);
                goto out;
            }
            if (npaths == (int)(sizeof paths / sizeof paths[0])) {
                train_err("--data: more than %d names (name a directory instead)", npaths);
                goto out;
            }
            paths[npaths++] = p;
        }
    }
    assert(a->model->seq_len); /* every text row says its context length (model.h) */
    int seq = a->model->seq_len(a->model_cfg);
    if (data_load_text(paths, npaths, seq, "train", &t->train) < 0 ||
        data_load_text(paths, npaths, seq, "test", &t->test) < 0) {
        train_err("rank %d: --data: %s", t->rank, data_last_error());
        goto out;
    }
    rc = 0;
out:
    for (int i = 0; i < a->ndata; i++)
        free(copies[i]);
    return rc;
}

/* Loads both splits; the sampler, the schedule, --dump-batches' room. Returns 0 or EXIT_USAGE. */
int setup_data(trainer *t)
{
    train_args *a = &t->a;
    const int text = a->model->data_kind == 1;
    if (text) {
        if (load_text(t) != 0)
            return EXIT_USAGE;
    } else if (data_load(a->data, "train", &t->train) < 0 ||
               data_load(a->data, "t10k", &t->test) < 0) {
        train_err("rank %d: %s", t->rank, data_last_error());
        return EXIT_USAGE;
    }
    t->preds_per_row = text ? t->train.seq : 1;
    t->test_loss = NAN; /* until an evaluation */
    if (!text && t->test.dim != t->train.dim) {
        train_err("%s: the test images are %dx%d, the training images %dx%d", a->data, t->test.rows,
                  t->test.cols, t->train.rows, t->train.cols);
        return EXIT_USAGE;
    }
    char hint[256];
    if (a->micro_batch) {
        /* The accumulation follows the world size, so that the global batch does not. */
        long per_step = (long)t->world * a->micro_batch;
        if (a->global_batch % per_step) {
            batch_hint(hint, sizeof hint, a->global_batch, t->world, "--micro-batch",
                       a->micro_batch, t->train.n);
            train_err("--micro-batch %d: the global batch (%d) is not a multiple of world size x "
                      "micro-batch (%d x %d = %ld); nearest that work: %s",
                      a->micro_batch, a->global_batch, t->world, a->micro_batch, per_step, hint);
            return EXIT_USAGE;
        }
        a->grad_accum = (int)(a->global_batch / per_step);
    } else if (a->global_batch <= t->train.n &&
               a->global_batch % ((long)t->world * a->grad_accum) != 0) {
        batch_hint(hint, sizeof hint, a->global_batch, t->world, "--grad-accum", a->grad_accum,
                   t->train.n);
        train_err("the global batch (%d) must be a multiple of world size x --grad-accum "
                  "(%d x %d = %ld); nearest that work: %s",
                  a->global_batch, t->world, a->grad_accum, (long)t->world * a->grad_accum, hint);
        return EXIT_USAGE;
    }
    if (data_sampler_init(&t->sampler, t->train.n, a->global_batch, t->world, t->rank,
                          a->grad_accum, a->seed) < 0) {
        train_err("%s", data_last_error() + strlen("sampler: "));
        return EXIT_USAGE;
    }
    /* A text model's passes hold activations for every token of a row: evaluation runs in
     * micro-batches, the rows the model is created for. */
    t->eval_chunk = text ? t->sampler.micro : EVAL_CHUNK;
    t->steps_per_epoch = data_sampler_steps(&t->sampler);
    t->total_steps = (int64_t)a->epochs * t->steps_per_epoch;
    if (a->max_steps > 0 && a->max_steps < t->total_steps)
        t->total_steps = a->max_steps;
    t->epochs = (int)((t->total_steps + t->steps_per_epoch - 1) / t->steps_per_epoch);
    if (a->log_every == 0)
        a->log_every = t->steps_per_epoch >= 10 ? t->steps_per_epoch / 10 : 1;
    t->sched = (ddp_schedule){.kind = a->schedule,
                              .lr = (float)a->lr,
                              .warmup_steps = a->warmup,
                              .total_steps = t->total_steps,
                              .min_lr = 0};

    if (a->dump_batches && t->rank == 0) {
        size_t rows = (size_t)t->total_steps * (size_t)a->global_batch;
        size_t bytes = rows * (text ? (size_t)t->train.seq + 1 + sizeof(int32_t)
                                    : sizeof(float) * t->train.dim + sizeof(int32_t) + 1);
        if (bytes > DUMP_MAX_BYTES) {
            train_err("--dump-batches would hold %zu MiB in memory (more than %llu); limit the run "
                      "with --max-steps",
                      bytes >> 20, DUMP_MAX_BYTES >> 20);
            return EXIT_USAGE;
        }
        if (data_sampler_init(&t->dump.global, t->train.n, a->global_batch, 1, 0, 1, a->seed) < 0 ||
            !(t->dump.index = malloc(sizeof(int32_t) * rows + 1)) ||
            (text ? !(t->dump.tok = malloc(rows * ((size_t)t->train.seq + 1) + 1))
                  : !(t->dump.y = malloc(rows + 1)) ||
                        !(t->dump.x = malloc(sizeof(float) * rows * t->train.dim + 1))) ||
            !(t->dump.lr = malloc(sizeof(float) * (size_t)t->total_steps + 1))) {
            train_err("--dump-batches: out of memory");
            return EXIT_USAGE;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* The hooks: libddp's four calls at the right moments of the model's passes                   */
/* ------------------------------------------------------------------------------------------ */

/*
 * Before unit u's forward or backward: gather the unit (ZeRO-3; a no-op at other stages) and
 * take its parameters (the compute copy: f32, or bf16 with --precision bf16, libddp keeping the
 * f32 master) and, in backward, its gradient buffers. A NULL from libddp ends the pass with
 * -EIO; ddp_micro_end() then returns the library's own code and ddp_last_error() says why.
 */
static int hook_begin(void *arg, int u, int backward, void **params, float **grads)
{
    trainer *t = arg;
    int rc = ddp_unit_gather(t->m, u);
    if (rc < 0) {
        t->hook_failed = 1;
        return rc;
    }
    int p0 = t->first_param[u], n = t->units[u].nparams, missing = 0;
    for (int i = 0; i < n; i++)
        missing |= !(params[i] = ddp_param_data(t->m, p0 + i));
    for (int i = 0; backward && i < n; i++)
        missing |= !(grads[i] = ddp_grad_buffer(t->m, p0 + i));
    if (missing) {
        t->hook_failed = 1;
        return -EIO;
    }
    return 0;
}

/*
 * After unit u: in backward its gradients are final, so mark them ready (in reverse
 * registration order, the order buckets fill) and let a complete bucket's reduction start now,
 * while the units below still compute; then release the unit.
 */
static int hook_end(void *arg, int u, int backward)
{
    trainer *t = arg;
    int rc = 0;
    for (int i = t->units[u].nparams - 1; backward && i >= 0 && rc >= 0; i--)
        rc = ddp_grad_ready(t->m, t->first_param[u] + i);
    if (rc >= 0)
        rc = ddp_unit_release(t->m, u);
    if (rc < 0)
        t->hook_failed = 1;
    return rc;
}

/* The initial values: --init-from's file's, or the model's own, from --seed and the parameter's
 * index. */
static int init_param(void *arg, int param, const char *name, void *data, size_t count)
{
    trainer *t = arg;
    (void)name;
    if (t->init_file)
        return init_file_param(t, param, data, count);
    int u = t->nunits - 1;
    while (t->first_param[u] > param)
        u--;
    return t->a.model->init_param(t->model, u, param - t->first_param[u], param, t->a.seed, data,
                                  count);
}

/* The model of --model on this rank's device. Returns 0 or EXIT_FAIL (printed). */
static int create_model(trainer *t)
{
    const model_ops *mo = t->a.model;
    model_env env = {.train = &t->train,
                     .test = &t->test,
                     /* --generate runs one sequence */
                     .max_batch = t->a.generate                      ? 1
                                  : t->sampler.micro > t->eval_chunk ? t->sampler.micro
                                                                     : t->eval_chunk,
                     .bf16 = t->a.bf16,
                     .device = t->device,
                     .stream = t->stream,
                     .access = {.begin = hook_begin, .end = hook_end, .arg = t}};
    int rc = mo->create(t->a.model_cfg, &env, &t->model);
    if (rc < 0) {
        train_err("rank %d: %s", t->rank, t->model ? mo->last_error(t->model) : "out of memory");
        return EXIT_FAIL;
    }
    t->compute = t->device < 0 ? mo->host : mo->device;
    t->nunits = mo->units(t->model, &t->units);
    t->first_param = calloc((size_t)t->nunits, sizeof(int));
    if (!t->first_param) {
        train_err("rank %d: out of memory", t->rank);
        return EXIT_FAIL;
    }
    for (int u = 0; u < t->nunits; u++) {
        t->first_param[u] = t->nparams;
        t->nparams += t->units[u].nparams;
    }
    if (!(t->names = calloc((size_t)t->nparams, sizeof(char *)))) {
        train_err("rank %d: out of memory", t->rank);
        return EXIT_FAIL;
    }
    return 0;
}

/* Registers unit u's parameters (at first_param[u] onwards). Returns 0 or EXIT_FAIL. */
static int register_unit(trainer *t, int u)
{
    const model_unit *unit = &t->units[u];
    int rc = ddp_unit_add(t->m, unit->name);
    assert(rc < 0 || rc == u); /* the hooks hand the model's unit index to libddp */
    for (int i = 0; i < unit->nparams && rc >= 0; i++) {
        const model_param *p = &unit->params[i];
        rc = ddp_param_add(t->m, u, p->name, p->ndim, p->shape, COLL_F32);
        /* The hooks find unit u's parameters at first_param[u] onwards. */
        assert(rc < 0 || rc == t->first_param[u] + i);
        if (rc >= 0) {
            size_t count = 1;
            for (int d = 0; d < p->ndim; d++)
                count *= (size_t)p->shape[d];
            t->nelems += count;
            char name[sizeof unit->name + sizeof p->name + 1];
            snprintf(name, sizeof name, "%s.%s", unit->name, p->name);
            t->names[t->first_param[u] + i] = strdup(name);
        }
    }
    if (rc < 0) {
        train_err("rank %d: registering %s: %s: %s", t->rank, unit->name, ddp_strerror(rc),
                  ddp_last_error(t->m));
        return EXIT_FAIL;
    }
    return 0;
}

/* The model: created, its units and parameters registered, committed (rank 0 draws, the others
 * receive). */
int setup_model(trainer *t)
{
    train_args *a = &t->a;
    int rc = create_model(t);
    if (rc != 0)
        return rc;

    ddp_options o;
    ddp_options_init(&o);
    o.zero_stage = a->zero;
    (void)ddp_options_set_optimizer(&o, a->optimizer); /* and its default hyper-parameters */
    o.momentum = (float)a->momentum;
    o.weight_decay = (float)a->weight_decay;
    o.clip_norm = (float)a->clip;
    o.bucket_bytes = (size_t)(a->bucket_mb * 1048576.0);
    if (o.first_bucket_bytes > o.bucket_bytes)
        o.first_bucket_bytes = o.bucket_bytes;
    o.log = train_log;
    o.log_arg = &t->rank;
    o.device = t->device;
    o.stream = t->stream;
    o.precision = a->bf16 ? DDP_PREC_BF16 : DDP_PREC_F32;
    o.reduce_dtype = a->reduce_dtype;
    rc = ddp_model_create(t->comm, &o, &t->m);
    if (rc < 0) {
        train_err("rank %d: ddp_model_create: %s: %s", t->rank, ddp_strerror(rc),
                  ddp_last_error(NULL));
        return EXIT_FAIL;
    }
    for (int u = 0; u < t->nunits; u++)
        if ((rc = register_unit(t, u)) != 0)
            return rc;
    if ((rc = init_file_open(t)) != 0)
        return rc;
    rc = ddp_model_commit(t->m, init_param, t);
    init_file_close(t);
    if (rc < 0) {
        train_err("rank %d: ddp_model_commit: %s: %s", t->rank, ddp_strerror(rc),
                  ddp_last_error(t->m));
        return EXIT_FAIL;
    }
    return 0;
}
