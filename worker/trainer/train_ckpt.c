/*
 * train_ckpt.c: ddp-train's checkpoints. Saving goes through libddp (ddp_checkpoint_save(),
 * asynchronous): the model's state and the sampler's position, plus the trainer's own state
 * (train_state.h: the step that drives the schedule, and the settings a resume must share).
 * Restoring is --resume (auto: the newest complete checkpoint under --checkpoint-dir, at
 * whatever world size and stage the job now has) or --init-from (the parameters only: of a
 * checkpoint, or of a safetensors file such as ddp-ckpt export writes, read before commit).
 * The user state also carries the metadata that ddp-ckpt export writes into its file: the
 * model's shape (model.h's meta()) and how inputs are normalised (data.h), so that another
 * program can rebuild the model and feed it.
 *
 * Not here: when a checkpoint is saved (train_loop.c) or what the model is (model.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "safetensors.h"
#include "trainer.h"

/* This run's settings as a checkpoint records them, `step` being the next step to train; the
 * model fills its own. */
static train_state run_state(const trainer *t, int64_t step)
{
    const train_args *a = &t->a;
    train_state st = {.step = step,
                      .world = t->world,
                      .zero = a->zero,
                      .grad_accum = a->grad_accum,
                      .global_batch = a->global_batch,
                      .train_samples = t->train.n,
                      .seed = a->seed,
                      .optimizer = a->optimizer,
                      .schedule = a->schedule,
                      .lr = a->lr,
                      .warmup = a->warmup,
                      .total_steps = t->total_steps};
    a->model->state(t->model, &st);
    return st;
}

/* `v` with the fewest digits that read back as the same float ("0.286", not "0.286000013"). */
static void float_str(char *buf, size_t cap, float v)
{
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(buf, cap, "%.*g", digits, (double)v);
        if (strtof(buf, NULL) == v)
            return;
    }
}

/* The metadata's text, for train_state_json(): the model's pairs, then the inputs'. */
typedef struct run_meta {
    char key[MODEL_MAX_META][32], value[MODEL_MAX_META][MODEL_META_LEN];
    char shape[32], mean[32], std[32];
    const char *pairs[2 * (MODEL_MAX_META + 5) + 1]; /* NULL-ended */
} run_meta;

static void run_meta_fill(const trainer *t, run_meta *rm)
{
    int n = t->a.model->meta(t->model, rm->key, rm->value), k = 0;
    for (int i = 0; i < n; i++) {
        rm->pairs[k++] = rm->key[i];
        rm->pairs[k++] = rm->value[i];
    }
    if (t->train.seq > 0) { /* text: bytes are the tokens */
        static const char bytes[] = "text as bytes: a window's bytes are its tokens (vocabulary "
                                    "256), the model's input its first seq_len, the targets the "
                                    "byte after each";
        rm->pairs[k++] = "input";
        rm->pairs[k++] = bytes;
        rm->pairs[k] = NULL;
        return;
    }
    snprintf(rm->shape, sizeof rm->shape, "%d,%d", t->train.rows, t->train.cols);
    float_str(rm->mean, sizeof rm->mean, DATA_MEAN);
    float_str(rm->std, sizeof rm->std, DATA_STD);
    static const char rule[] = "an image's pixels row-major, each (pixel / input_divisor - "
                               "input_mean) / input_std in float32: torchvision's ToTensor() "
                               "then Normalize(input_mean, input_std), flattened";
    const char *in[] = {"input_shape", rm->shape,   "input_divisor", "255",   "input_mean",
                        rm->mean,      "input_std", rm->std,         "input", rule};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
        rm->pairs[k++] = in[i];
    rm->pairs[k] = NULL;
}

/*
 * Saves the checkpoint of the steps taken so far (`step`), asynchronously: libddp copies the
 * owned state and a thread writes it while training goes on. The progress is the next step's
 * place in the data order, (epoch, step within it), which does not depend on the world size.
 * Every rank. Returns 0 or EXIT_FAIL (printed).
 */
int save_checkpoint(trainer *t, int64_t step)
{
    train_state st = run_state(t, step);
    run_meta rm;
    run_meta_fill(t, &rm);
    char *user = NULL;
    int rc = train_state_json(&st, rm.pairs, &user);
    ddp_checkpoint_progress pr = {.epoch = step / t->steps_per_epoch,
                                  .position = step % t->steps_per_epoch,
                                  .seed = t->a.seed};
    if (rc == 0)
        rc = ddp_checkpoint_save(t->m, t->a.ckpt_dir, &pr, user, t->a.keep, 0);
    free(user);
    if (rc < 0) {
        train_err("rank %d: checkpoint of step %" PRId64 " under %s failed: %s: %s", t->rank, step,
                  t->a.ckpt_dir, ddp_strerror(rc), ddp_last_error(t->m));
        return EXIT_FAIL;
    }
    return 0;
}

/* The tensor named `name` in f, or NULL. */
static const st_tensor *file_tensor(const st_file *f, const char *name)
{
    for (int i = 0; i < f->ntensors; i++)
        if (!strcmp(f->tensors[i].name, name))
            return &f->tensors[i];
    return NULL;
}

/*
 * Rank 0: reads --init-from's file and checks it against the model (see init_file_open()).
 * Prints what does not fit. Returns 0 (t->init_file set) or a negative errno.
 */
static int init_file_check(trainer *t, const char *path)
{
    st_file *f = calloc(1, sizeof *f);
    if (!f) {
        train_err("--init-from %s: out of memory", path);
        return -ENOMEM;
    }
    int rc = st_read(path, f);
    if (rc < 0) {
        train_err("--init-from %s", st_last_error());
        free(f);
        return rc;
    }
    char key[MODEL_MAX_META][32], value[MODEL_MAX_META][MODEL_META_LEN];
    int n = t->a.model->meta(t->model, key, value);
    for (int i = 0; i < n && rc == 0; i++)
        for (int k = 0; k < f->nmeta && rc == 0; k++)
            if (!strcmp(f->meta[2 * k], key[i]) && strcmp(f->meta[2 * k + 1], value[i])) {
                train_err("--init-from %s: its %s is %s, this run's %s", path, key[i],
                          f->meta[2 * k + 1], value[i]);
                rc = -EINVAL;
            }
    for (int u = 0; u < t->nunits && rc == 0; u++)
        for (int i = 0; i < t->units[u].nparams && rc == 0; i++) {
            const model_param *p = &t->units[u].params[i];
            const char *name = t->names[t->first_param[u] + i];
            const st_tensor *x = file_tensor(f, name);
            char have[96], want[96];
            rc = -EINVAL;
            if (!x)
                train_err("--init-from %s: no tensor '%s' (a parameter of --model %s)", path, name,
                          t->a.model->name);
            else if (strcmp(x->dtype, "F32"))
                train_err("--init-from %s: tensor '%s' is %s, not F32", path, name, x->dtype);
            else if (x->ndim != p->ndim || memcmp(x->shape, p->shape, sizeof(int64_t) * p->ndim))
                train_err("--init-from %s: tensor '%s' is %s, this run's %s", path, name,
                          st_shape_str(have, sizeof have, x->ndim, x->shape),
                          st_shape_str(want, sizeof want, p->ndim, p->shape));
            else
                rc = 0;
        }
    for (int k = 0; k < f->ntensors && rc == 0; k++) {
        int found = 0;
        for (int p = 0; p < t->nparams && !found; p++)
            found = !strcmp(t->names[p], f->tensors[k].name);
        if (!found) {
            train_err("--init-from %s: tensor '%s' is not a parameter of --model %s", path,
                      f->tensors[k].name, t->a.model->name);
            rc = -EINVAL;
        }
    }
    if (rc < 0) {
        st_file_free(f);
        free(f);
        return rc;
    }
    t->init_file = f;
    return 0;
}

int init_file_open(trainer *t)
{
    const char *path = t->a.init_from;
    if (!path)
        return 0;
    /* 0: not a file (a checkpoint for restore(), which reports a missing one), 1: the file fits,
       2: it does not (rank 0 said why) */
    uint8_t verdict = 0;
    struct stat st;
    if (t->rank == 0 && stat(path, &st) == 0 && S_ISREG(st.st_mode))
        verdict = init_file_check(t, path) == 0 ? 1 : 2;
    int rc = coll_broadcast(t->hcomm, &verdict, &verdict, 1, COLL_U8, 0);
    if (rc < 0) {
        train_err("rank %d: broadcasting --init-from's verdict: %s: %s", t->rank, coll_strerror(rc),
                  coll_last_error(t->hcomm));
        return EXIT_FAIL;
    }
    t->init_is_file = verdict == 1;
    return verdict == 2 ? EXIT_USAGE : 0;
}

int init_file_param(const trainer *t, int param, void *data, size_t count)
{
    const st_tensor *x = file_tensor(t->init_file, t->names[param]);
    if (!x || x->nbytes != count * sizeof(float)) /* init_file_check() saw to both */
        return -EINVAL;
    memcpy(data, x->data, x->nbytes);
    return 0;
}

void init_file_close(trainer *t)
{
    if (!t->init_file)
        return;
    st_file_free(t->init_file);
    free(t->init_file);
    t->init_file = NULL;
}

/* What restore() does, decided by rank 0 and broadcast with the path. */
enum { RESTORE_NONE = 0, RESTORE_RESUME, RESTORE_INIT, RESTORE_ERROR };

/*
 * Rank 0's choice: --resume PATH; --resume auto, the newest complete checkpoint under
 * --checkpoint-dir (libddp skips torn or malformed ones with a warning line each), or nothing;
 * then --init-from when nothing is resumed. Writes the path into path[cap].
 */
static int restore_choice(trainer *t, char *path, size_t cap)
{
    const train_args *a = &t->a;
    if (a->resume && strcmp(a->resume, "auto")) {
        snprintf(path, cap, "%s", a->resume);
        return RESTORE_RESUME;
    }
    if (a->resume) {
        int rc = ddp_checkpoint_latest(a->ckpt_dir, path, cap, train_log, &t->rank);
        if (rc < 0) {
            train_err("--resume auto: cannot search %s: %s", a->ckpt_dir, strerror(-rc));
            return RESTORE_ERROR;
        }
        if (rc == 1)
            return RESTORE_RESUME;
        fprintf(stderr, "ddp-train: no complete checkpoint under %s: starting from scratch\n",
                a->ckpt_dir);
    }
    if (a->init_from && !t->init_is_file) {
        snprintf(path, cap, "%s", a->init_from);
        return RESTORE_INIT;
    }
    return RESTORE_NONE;
}

/*
 * After commit: loads what --resume or --init-from names, on every rank (rank 0 chooses and
 * broadcasts the path, so every rank loads the same checkpoint). A resumed run checks that the
 * checkpoint's user state fits this run (train_state_compare()) and starts at its step.
 * Returns 0, EXIT_USAGE (no such checkpoint, or another model or data order) or EXIT_FAIL.
 */
int restore(trainer *t)
{
    const train_args *a = &t->a;
    if (!a->resume && !a->init_from)
        return 0;
    char buf[PATH_MAX + 1] = {0}; /* buf[0]: the choice; then the path */
    if (t->rank == 0)
        buf[0] = (char)restore_choice(t, buf + 1, sizeof buf - 1);
    int rc = coll_broadcast(t->hcomm, buf, buf, sizeof buf, COLL_U8, 0);
    if (rc < 0) {
        train_err("rank %d: broadcasting the checkpoint to load: %s: %s", t->rank,
                  coll_strerror(rc), coll_last_error(t->hcomm));
        return EXIT_FAIL;
    }
    int choice = buf[0];
    const char *path = buf + 1;
    if (choice == RESTORE_NONE && t->init_is_file && t->rank == 0)
        fprintf(stderr, "ddp-train: parameters from %s; optimizer state from scratch\n",
                a->init_from);
    if (choice == RESTORE_NONE || choice == RESTORE_ERROR)
        return choice == RESTORE_NONE ? 0 : EXIT_USAGE;

    ddp_checkpoint_progress pr;
    char *user = NULL;
    rc = ddp_checkpoint_load(t->m, path, choice == RESTORE_INIT ? DDP_CKPT_PARAMS_ONLY : 0, &pr,
                             choice == RESTORE_INIT ? NULL : &user);
    if (rc < 0) {
        /* The same code on every rank; rank 0 says it once. */
        if (t->rank == 0)
            train_err("%s %s: %s: %s", choice == RESTORE_INIT ? "--init-from" : "--resume", path,
                      ddp_strerror(rc), ddp_last_error(t->m));
        return rc == -EINVAL || rc == -ENOENT || rc == -EPROTO || rc == -EBADMSG ? EXIT_USAGE
                                                                                 : EXIT_FAIL;
    }
    if (choice == RESTORE_INIT) {
        if (t->rank == 0)
            fprintf(stderr, "ddp-train: parameters from %s; optimizer state from scratch\n", path);
        return 0;
    }

    /* Every rank decides alike: same checkpoint, same arguments. */
    train_state saved, now = run_state(t, 0);
    char why[512];
    int status = EXIT_USAGE;
    if (!user)
        snprintf(why, sizeof why, "it has no ddp-train state (saved by another program?)");
    else if (train_state_parse(user, &saved, why, sizeof why) < 0)
        ;
    else if ((rc = train_state_compare(&saved, &now, why, sizeof why)) < 0)
        ;
    else if (saved.step != pr.epoch * t->steps_per_epoch + pr.position)
        snprintf(why, sizeof why,
                 "its step %" PRId64 " is not its sampler position (epoch %" PRId64
                 ", step %" PRId64 " of %d)",
                 saved.step, pr.epoch, pr.position, t->steps_per_epoch);
    else
        status = 0;
    ddp_free(user);
    if (status != 0) {
        if (t->rank == 0)
            train_err("--resume %s: cannot resume from it: %s", path, why);
        return status;
    }
    if (rc == 1 && t->rank == 0)
        warn("--resume %s: %s", path, why); /* the schedule changed */
    t->start_step = saved.step;
    if (t->rank == 0)
        fprintf(stderr,
                "ddp-train: resuming from %s at step %" PRId64 " (epoch %" PRId64 ", step %" PRId64
                " of it), saved by %d rank%s at ZeRO-%d\n",
                path, saved.step, pr.epoch + 1, pr.position, saved.world,
                saved.world == 1 ? "" : "s", saved.zero);
    return 0;
}
