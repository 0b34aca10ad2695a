/*
 * ddp-train's part of a checkpoint: the user-state JSON and the resume decision (train_state.h).
 * No I/O. Optimizers are written by libddp's names (ddp_optimizer_name()); schedules by index
 * into the table below, whose order is that of ddp.h's ddp_schedule_kind.
 */
#include "train_state.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "ddp.h"

#define STATE_VERSION 1

static const char *const schedules[] = {"constant", "cosine"}; /* DDP_SCHED_* */
#define SCHED_COSINE 1 /* its length shapes every learning rate */
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const char *name_of(const char *const *names, int n, int i)
{
    return i >= 0 && i < n ? names[i] : "?";
}

static const char *optimizer_name(int opt)
{
    const char *name = ddp_optimizer_name((ddp_optimizer)opt);
    return name ? name : "?";
}

int train_state_json(const train_state *st, const char *const *meta, char **out)
{
    json_t *o = json_pack(
        "{s:s, s:i, s:I, s:i, s:i, s:i, s:{s:i, s:i, s:i, s:i}, s:{s:i, s:i, s:I}, s:s, "
        "s:{s:s, s:f, s:I, s:I}}",
        "trainer", "ddp-train", "version", STATE_VERSION, "step", (json_int_t)st->step, "world",
        st->world, "zero", st->zero, "grad_accum", st->grad_accum, "model", "in_dim", st->in_dim,
        "hidden", st->hidden, "layers", st->layers, "classes", st->classes, "data", "global_batch",
        st->global_batch, "train_samples", st->train_samples, "seed", (json_int_t)st->seed,
        "optimizer", optimizer_name(st->optimizer), "schedule", "kind",
        name_of(schedules, COUNT(schedules), st->schedule), "lr", st->lr, "warmup",
        (json_int_t)st->warmup, "total_steps", (json_int_t)st->total_steps);
    if (o && st->heads &&
        json_object_set_new(json_object_get(o, "model"), "heads", json_integer(st->heads)) < 0) {
        json_decref(o);
        o = NULL;
    }
    json_t *m = o && meta && meta[0] ? json_object() : NULL;
    for (int i = 0; m && meta[i] && meta[i + 1]; i += 2)
        json_object_set_new(m, meta[i], json_string(meta[i + 1]));
    if (m && json_object_set_new(o, "metadata", m) < 0) {
        json_decref(o);
        o = NULL;
    }
    char *text = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    if (!text)
        return -ENOMEM;
    *out = text;
    return 0;
}

static int index_of(const char *const *names, int n, const char *s)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], s))
            return i;
    return -1;
}

int train_state_parse(const char *json, train_state *out, char *err, size_t cap)
{
    char scratch[1];
    if (!err) {
        err = scratch;
        cap = sizeof scratch;
    }
    json_error_t je;
    json_t *o = json_loads(json ? json : "", 0, &je);
    if (!o) {
        snprintf(err, cap, "the user state is not JSON: %s", je.text);
        return -EPROTO;
    }
    train_state st = {0};
    const char *trainer = NULL, *opt = NULL, *sched = NULL;
    json_t *meta = NULL; /* for ddp-ckpt export, not for a resume */
    int version = 0;
    json_int_t step = 0, seed = 0, warmup = 0, total = 0;
    int rc = -EPROTO;
    if (json_unpack_ex(o, &je, JSON_STRICT,
                       "{s:s, s:i, s:I, s:i, s:i, s:i, s:{s:i, s:i, s:i, s:i, s?i}, "
                       "s:{s:i, s:i, s:I}, s:s, s:{s:s, s:F, s:I, s:I}, s?o}",
                       "trainer", &trainer, "version", &version, "step", &step, "world", &st.world,
                       "zero", &st.zero, "grad_accum", &st.grad_accum, "model", "in_dim",
                       &st.in_dim, "hidden", &st.hidden, "layers", &st.layers, "classes",
                       &st.classes, "heads", &st.heads, "data", "global_batch", &st.global_batch,
                       "train_samples", &st.train_samples, "seed", &seed, "optimizer", &opt,
                       "schedule", "kind", &sched, "lr", &st.lr, "warmup", &warmup, "total_steps",
                       &total, "metadata", &meta) < 0) {
        snprintf(err, cap, "the user state is not ddp-train's: %s", je.text);
        goto out;
    }
    if (strcmp(trainer, "ddp-train") || version != STATE_VERSION) {
        snprintf(err, cap, "the user state is %s's version %d, not ddp-train's version %d", trainer,
                 version, STATE_VERSION);
        goto out;
    }
    st.optimizer = ddp_optimizer_from_name(opt);
    st.schedule = index_of(schedules, COUNT(schedules), sched);
    if (st.optimizer < 0 || st.schedule < 0 || step < 0 || seed < 0) {
        snprintf(err, cap,
                 "the user state has an unknown optimizer '%s' or schedule '%s', or a "
                 "negative step or seed",
                 opt, sched);
        goto out;
    }
    st.step = step;
    st.seed = (uint64_t)seed;
    st.warmup = warmup;
    st.total_steps = total;
    *out = st;
    rc = 0;
out:
    json_decref(o);
    return rc;
}

int train_state_compare(const train_state *saved, const train_state *now, char *err, size_t cap)
{
    char scratch[1];
    if (!err) {
        err = scratch;
        cap = sizeof scratch;
    }
    /* What must match: a different value would load another model's state or walk another
     * data order. The library checks the parameters' shapes too, but it cannot know the seed
     * or the global batch. */
    const struct {
        const char *what;
        int64_t was, is;
    } must[] = {
        {"--hidden", saved->hidden, now->hidden},
        {"--layers", saved->layers, now->layers},
        {"input width", saved->in_dim, now->in_dim},
        {"classes", saved->classes, now->classes},
        {"--heads", saved->heads, now->heads},
        {"--global-batch", saved->global_batch, now->global_batch},
        {"training samples", saved->train_samples, now->train_samples},
        {"--seed", (int64_t)saved->seed, (int64_t)now->seed},
    };
    for (int i = 0; i < COUNT(must); i++)
        if (must[i].was != must[i].is) {
            snprintf(err, cap, "it was saved with %s %" PRId64 ", this run has %" PRId64,
                     must[i].what, must[i].was, must[i].is);
            return -EINVAL;
        }
    if (saved->optimizer != now->optimizer) {
        snprintf(err, cap, "it was saved with --optimizer %s, this run has %s",
                 optimizer_name(saved->optimizer), optimizer_name(now->optimizer));
        return -EINVAL;
    }
    /* The schedule may change on purpose (a longer run: --max-steps); say so, then go on. */
    if (saved->schedule != now->schedule || saved->lr != now->lr || saved->warmup != now->warmup ||
        (now->schedule == SCHED_COSINE && saved->total_steps != now->total_steps)) {
        snprintf(err, cap,
                 "the learning-rate schedule differs from the interrupted run's (%s, lr %g, "
                 "warmup %" PRId64 ", %" PRId64 " steps; now %s, lr %g, warmup %" PRId64
                 ", %" PRId64 " steps): from here on training differs from it",
                 name_of(schedules, COUNT(schedules), saved->schedule), saved->lr, saved->warmup,
                 saved->total_steps, name_of(schedules, COUNT(schedules), now->schedule), now->lr,
                 now->warmup, now->total_steps);
        return 1;
    }
    return 0;
}
