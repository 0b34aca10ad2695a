/*
 * train_report.c: what ddp-train tells. Rank 0's lines on stderr (the run's first line, a
 * progress bar on a terminal or a line per report, the evaluations, the summary), its JSON
 * Lines metrics (--metrics) and TensorBoard scalars (--tensorboard, through libddp's
 * ddp_summary writer), and the safetensors dumps of the parameters (--dump-init, --dump-final,
 * every rank taking part) and of the batches (--dump-batches).
 *
 * Every record goes through record(): the JSON record gets the fields every record has (time,
 * elapsed, attempt, world) and its numbers named in tb_tags[] become TensorBoard scalars at
 * the record's step, so the two always carry the same values. Records last across restarts:
 * the metrics file is appended to, and each attempt writes an event file of its own.
 *
 * Not here: what is measured (train_loop.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "mlp.h"
#include "mlp_cuda.h"
#include "monoclock.h"
#include "safetensors.h"
#include "trainer.h"

/* ------------------------------------------------------------------------------------------ */
/* Files: safetensors dumps and JSON Lines metrics                                             */
/* ------------------------------------------------------------------------------------------ */

typedef st_tensor tensor;

/* Writes a safetensors file (safetensors.h); `meta`: string pairs, NULL-ended. Returns 0 or -1
   with the error printed. */
static int write_safetensors(const char *path, const tensor *ts, int n, const char **meta)
{
    if (st_write(path, ts, n, meta) < 0) {
        train_err("%s", st_last_error());
        return -1;
    }
    return 0;
}

/*
 * Writes the model's current parameters to `path` (rank 0) as safetensors, `what` going into
 * the metadata's "format": the compute copy, F32 or (--precision bf16) BF16. Each unit is
 * gathered (ZeRO-3; other stages hold every parameter) and rank 0 copies it (from the device
 * with --device cuda), so every rank calls this. Returns 0 or EXIT_FAIL (printed: a
 * collective's failure, or on rank 0 a file error).
 */
int dump_params(trainer *t, const char *path, const char *what)
{
    tensor *ts = calloc((size_t)t->nparams, sizeof *ts);
    void **copy = calloc((size_t)t->nparams, sizeof *copy);
    int rc = ts && copy ? 0 : -1;
    if (rc < 0)
        train_err("%s: out of memory", path);
    for (int u = 0; u < t->nunits; u++) { /* every unit on every rank, even after a local error */
        const model_unit *unit = &t->units[u];
        int gathered = ddp_unit_gather(t->m, u);
        if (gathered < 0) {
            train_err("rank %d: %s: gathering %s: %s: %s", t->rank, path, unit->name,
                      ddp_strerror(gathered), ddp_last_error(t->m));
            rc = -1;
            break;
        }
        for (int j = 0; j < unit->nparams && t->rank == 0 && rc == 0; j++) {
            int p = t->first_param[u] + j;
            const model_param *mp = &unit->params[j];
            size_t nbytes = (t->a.bf16 ? 2 : 4) * ddp_param_count(t->m, p);
            if (!(copy[p] = malloc(nbytes))) {
                train_err("%s: out of memory", path);
                rc = -1;
                break;
            }
            if ((rc = train_to_host(t, copy[p], ddp_param_data(t->m, p), nbytes)) < 0) {
                train_err("%s: copying %s: %s", path, t->names[p], train_device_error());
                break;
            }
            ts[p] =
                (tensor){t->names[p], t->a.bf16 ? "BF16" : "F32", mp->ndim, {0}, copy[p], nbytes};
            memcpy(ts[p].shape, mp->shape, sizeof(int64_t) * (size_t)mp->ndim);
        }
        ddp_unit_release(t->m, u);
    }
    if (rc == 0 && t->rank == 0) {
        char seed[32], key[MODEL_MAX_META][32], value[MODEL_MAX_META][MODEL_META_LEN];
        snprintf(seed, sizeof seed, "%" PRIu64, t->a.seed);
        const char *meta[2 * (2 + MODEL_MAX_META) + 1] = {"format", what, "seed", seed};
        int n = t->a.model->meta(t->model, key, value);
        for (int i = 0; i < n; i++) {
            meta[4 + 2 * i] = key[i];
            meta[5 + 2 * i] = value[i];
        }
        rc = write_safetensors(path, ts, t->nparams, meta);
    }
    for (int i = 0; copy && i < t->nparams; i++)
        free(copy[i]);
    free(copy);
    free(ts);
    return rc == 0 ? 0 : EXIT_FAIL;
}

/* --dump-batches of a text model: the windows, (steps, G, seq + 1) bytes, instead of x and y. */
static int dump_text_batches(trainer *t)
{
    int64_t S = t->dump.steps, G = t->a.global_batch, R = t->train.seq + 1;
    tensor ts[] = {
        {"index", "I32", 2, {S, G}, t->dump.index, sizeof(int32_t) * (size_t)(S * G)},
        {"tok", "U8", 3, {S, G, R}, t->dump.tok, (size_t)(S * G * R)},
        {"lr", "F32", 1, {S}, t->dump.lr, sizeof(float) * (size_t)S},
    };
    char gb[32], seq[32];
    snprintf(gb, sizeof gb, "%d", t->a.global_batch);
    snprintf(seq, sizeof seq, "%d", t->train.seq);
    const char *meta[] = {"format",
                          "ddp-train batches",
                          "global_batch",
                          gb,
                          "seq",
                          seq,
                          "loss",
                          "mean over the global batch's tokens (tok[..., 1:] predicted from "
                          "tok[..., :-1])",
                          NULL};
    return write_safetensors(t->a.dump_batches, ts, 3, meta);
}

int dump_batches(trainer *t)
{
    if (t->dump.tok)
        return dump_text_batches(t);
    int64_t S = t->dump.steps, G = t->a.global_batch, D = t->train.dim;
    tensor ts[] = {
        {"index", "I32", 2, {S, G}, t->dump.index, sizeof(int32_t) * (size_t)(S * G)},
        {"label", "U8", 2, {S, G}, t->dump.y, (size_t)(S * G)},
        {"x", "F32", 3, {S, G, D}, t->dump.x, sizeof(float) * (size_t)(S * G * D)},
        {"lr", "F32", 1, {S}, t->dump.lr, sizeof(float) * (size_t)S},
    };
    char mean[32], std[32], gb[32];
    snprintf(mean, sizeof mean, "%.9g", (double)DATA_MEAN);
    snprintf(std, sizeof std, "%.9g", (double)DATA_STD);
    snprintf(gb, sizeof gb, "%d", t->a.global_batch);
    const char *meta[] = {"format",
                          "ddp-train batches",
                          "global_batch",
                          gb,
                          "mean",
                          mean,
                          "std",
                          std,
                          "loss",
                          "mean over the global batch",
                          NULL};
    return write_safetensors(t->a.dump_batches, ts, 4, meta);
}

/*
 * The TensorBoard scalars: a record's number under `key` goes to tag `tag`, times `scale`.
 * ddp-train(1), TENSORBOARD, lists them; tests/trainer/tensorboard.sh reads them back.
 */
static const struct {
    const char *key, *tag;
    double scale;
} tb_tags[] = {
    {"loss", "train/loss", 1},
    {"lr", "train/lr", 1},
    {"grad_norm", "train/grad_norm", 1},
    {"samples_per_s", "train/samples_per_s", 1},
    {"test_loss", "test/loss", 1},
    {"test_accuracy", "test/accuracy", 1},
    {"test_bpb", "test/bpb", 1},
    {"tokens_per_s", "train/tokens_per_s", 1},
    {"rss_bytes", "memory/host_rss_mib", 1.0 / 1048576},
    {"gpu_used_bytes", "memory/gpu_used_mib", 1.0 / 1048576},
};

/*
 * Rank 0's record `rec` (owned: released here) of step `step` (< 0: a record TensorBoard does
 * not get, such as the start and the summary): one JSON Lines record, flushed so that a reader
 * can follow the run, led by the fields every record has; and its numbers as TensorBoard
 * scalars. A failed TensorBoard write is said once and does not stop training.
 */
static void record(trainer *t, int64_t step, json_t *rec)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    json_t *full =
        json_pack("{s:f, s:f, s:i, s:i}", "time", (double)now.tv_sec + (double)now.tv_nsec / 1e9,
                  "elapsed", mono_now_s() - t->t_start, "attempt", t->attempt, "world", t->world);
    if (t->metrics && full && rec && json_object_update(full, rec) == 0) {
        /* 15 digits: the time to 10 microseconds */
        char *s = json_dumps(full, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
        if (s) {
            fprintf(t->metrics, "%s\n", s);
            fflush(t->metrics);
            free(s);
        }
    }
    static int tb_failed;
    for (size_t i = 0; t->tb && rec && step >= 0 && i < sizeof tb_tags / sizeof tb_tags[0]; i++) {
        json_t *v = json_object_get(rec, tb_tags[i].key);
        if (!json_is_number(v))
            continue;
        int rc = ddp_summary_scalar(t->tb, tb_tags[i].tag, step,
                                    json_number_value(v) * tb_tags[i].scale);
        if (rc < 0 && !tb_failed++)
            warn("--tensorboard: writing %s: %s (later scalars may be missing)",
                 ddp_summary_path(t->tb), strerror(-rc));
    }
    json_decref(full);
    json_decref(rec);
}

/* A record's number: null when it is not finite (a diverged loss, a skipped step's norm), which
 * JSON cannot write; TensorBoard gets no scalar for it. */
static json_t *number(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

/* Rank 0's resident set (/proc/self/statm), or -1 where it cannot be read. */
static int64_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = -1;
    if (f) {
        if (fscanf(f, "%*s %ld", &pages) != 1)
            pages = -1;
        fclose(f);
    }
    return pages < 0 ? -1 : (int64_t)pages * sysconf(_SC_PAGESIZE);
}

int report_open(trainer *t)
{
    const char *how = t->start_step ? "resumed" : t->attempt ? "restarted" : "fresh";
    /* A run from scratch replaces the file's records; a later attempt, or a resumed run, adds. */
    if (t->metrics && !t->start_step && !t->attempt && ftruncate(fileno(t->metrics), 0) < 0) {
        train_err("--metrics %s: cannot empty it: %s", t->a.metrics, strerror(errno));
        return EXIT_USAGE;
    }
    if (t->a.tensorboard) {
        /* Its first record is of step start_step + 1: TensorBoard drops what earlier files in
         * DIR hold from there on (a dead attempt's steps past the checkpoint, or a whole
         * earlier run). */
        int rc = ddp_summary_open(t->a.tensorboard, t->start_step + 1, &t->tb);
        if (rc < 0) {
            train_err("--tensorboard %s: cannot write an event file there: %s", t->a.tensorboard,
                      strerror(-rc));
            return EXIT_USAGE;
        }
    }
    record(t, -1, json_pack("{s:s, s:I}", "start", how, "step", (json_int_t)t->start_step));
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Output                                                                                      */
/* ------------------------------------------------------------------------------------------ */

static void format_duration(char *buf, size_t cap, double s)
{
    if (!(s >= 0) || s > 1e7)
        snprintf(buf, cap, "?");
    else if (s >= 3600)
        snprintf(buf, cap, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
    else
        snprintf(buf, cap, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
}

/* Rank 0's report of a training interval: a progress bar on a terminal, else a line. */
void report_step(trainer *t, int64_t step, int epoch, double loss, float lr, double grad_norm,
                 double samples_per_s, double eta_s)
{
    char eta[32];
    format_duration(eta, sizeof eta, eta_s);
    /* A text model's rate is in tokens (the predictions of its rows). */
    const char *unit = t->train.tok ? "tok" : "samples";
    double rate = samples_per_s * t->preds_per_row;
    if (t->tty) {
        enum { WIDTH = 24 };
        int fill = (int)(WIDTH * step / t->total_steps);
        char bar[WIDTH + 1];
        for (int i = 0; i < WIDTH; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[WIDTH] = '\0';
        fprintf(stderr,
                "\r[%s] step %" PRId64 "/%" PRId64 " epoch %d/%d loss %.4f %.0f %s/s "
                "ETA %s\033[K",
                bar, step, t->total_steps, epoch + 1, t->epochs, loss, rate, unit, eta);
    } else {
        fprintf(stderr,
                "step %" PRId64 "/%" PRId64 " | epoch %d | loss %.4f | lr %.3g | norm %.3f "
                "| %.0f %s/s | ETA %s\n",
                step, t->total_steps, epoch + 1, loss, (double)lr, grad_norm, rate, unit, eta);
    }
    json_t *rec = json_pack("{s:I, s:i, s:o, s:f, s:o, s:o}", "step", (json_int_t)step, "epoch",
                            epoch + 1, "loss", number(loss), "lr", (double)lr, "grad_norm",
                            number(grad_norm), "samples_per_s", number(samples_per_s));
    if (rec && t->train.tok)
        json_object_set_new(rec, "tokens_per_s", number(samples_per_s * t->preds_per_row));
    int64_t rss = rss_bytes();
    size_t gpu;
    if (rec && rss >= 0)
        json_object_set_new(rec, "rss_bytes", json_integer(rss));
    if (rec && t->device >= 0 && mlp_cuda_memory_used(t->device, &gpu) == 0)
        json_object_set_new(rec, "gpu_used_bytes", json_integer((json_int_t)gpu));
    record(t, step, rec);
}

void report_epoch(trainer *t, int64_t step, int epoch, double test_loss, double acc)
{
    t->test_loss = test_loss;
    if (!t->train.tok) {
        fprintf(stderr, "%sepoch %d/%d (step %" PRId64 "): test loss %.4f, test accuracy %.2f%%\n",
                t->tty ? "\r\033[K" : "", epoch + 1, t->epochs, step, test_loss, 100 * acc);
        record(t, step,
               json_pack("{s:I, s:i, s:o, s:f}", "step", (json_int_t)step, "epoch", epoch + 1,
                         "test_loss", number(test_loss), "test_accuracy", acc));
        return;
    }
    /* Text: the loss per byte in nats and in bits, and the next-byte accuracy. */
    double bpb = test_loss / M_LN2;
    fprintf(stderr,
            "%sepoch %d/%d (step %" PRId64 "): validation loss %.4f (%.4f bits per byte), "
            "next-byte accuracy %.2f%%\n",
            t->tty ? "\r\033[K" : "", epoch + 1, t->epochs, step, test_loss, bpb, 100 * acc);
    record(t, step,
           json_pack("{s:I, s:i, s:o, s:f, s:o}", "step", (json_int_t)step, "epoch", epoch + 1,
                     "test_loss", number(test_loss), "test_accuracy", acc, "test_bpb",
                     number(bpb)));
}

/* Rank 0, --dump-batches: keeps step `step`'s global batch and learning rate. */
void dump_record(trainer *t, const data_batch *b, int64_t step, float lr)
{
    data_sampler *g = &t->dump.global;
    if (g->epoch != b->epoch)
        data_sampler_set_epoch(g, b->epoch);
    size_t G = (size_t)t->a.global_batch, D = (size_t)t->train.dim;
    const int32_t *idx = data_sampler_global(g, b->step);
    memcpy(t->dump.index + (size_t)step * G, idx, sizeof(int32_t) * G);
    if (t->dump.tok)
        data_gather_text(&t->train, idx, (int)G, t->dump.tok + (size_t)step * G * (D + 1));
    else
        data_gather(&t->train, idx, (int)G, t->dump.x + (size_t)step * G * D,
                    t->dump.y + (size_t)step * G);
    t->dump.lr[step] = lr;
    t->dump.steps = step + 1;
}

/* Rank 0's last line: accuracy, throughput, and this rank's model-state memory. */
void summary(trainer *t, double acc, double train_s)
{
    ddp_memory mem = {0};
    ddp_memory_stats(t->m, &mem);
    double mib = 1.0 / 1048576;
    int64_t samples = (t->total_steps - t->start_step) * t->a.global_batch; /* this run's */
    /* What was learned: test accuracy; for text the validation loss, in bits per byte too,
     * and the next-byte accuracy; and the rate, in tokens for text. */
    /* A run resumed at its last step takes none: no rate (0 in the record, not NaN) */
    double per_s = samples > 0 && train_s > 0 ? samples / train_s : 0;
    char result[256], rate[64];
    if (samples > 0)
        snprintf(rate, sizeof rate, "in %.1f s (%.0f %s/s)", train_s,
                 per_s * (t->train.tok ? (double)t->preds_per_row : 1.0),
                 t->train.tok ? "tokens" : "samples");
    else
        snprintf(rate, sizeof rate, "(none of them in this run)");
    if (t->train.tok)
        snprintf(result, sizeof result,
                 "validation loss %.4f (%.4f bits per byte), next-byte accuracy %.2f%% after "
                 "%" PRId64 " steps %s",
                 t->test_loss, t->test_loss / M_LN2, 100 * acc, t->total_steps, rate);
    else
        snprintf(result, sizeof result, "test accuracy %.2f%% after %" PRId64 " steps %s",
                 100 * acc, t->total_steps, rate);
    fprintf(stderr,
            "ddp-train: %d rank%s, ZeRO-%d, %s: %s; model state %.2f MiB on rank 0 (parameters "
            "%.2f, gradients %.2f, optimizer %.2f; pools %.2f more)\n",
            t->world, t->world == 1 ? "" : "s", t->a.zero, ddp_optimizer_name(t->a.optimizer),
            result, mem.model_state_bytes * mib, mem.param_bytes * mib, mem.grad_bytes * mib,
            mem.optimizer_bytes * mib, mem.pool_bytes * mib);
    json_t *rec = json_pack(
        "{s:s, s:i, s:i, s:f, s:I, s:f, s:f, s:{s:I, s:I, s:I, s:I, s:I}}", "summary", "done",
        "world", t->world, "zero", t->a.zero, "test_accuracy", acc, "steps",
        (json_int_t)t->total_steps, "train_seconds", train_s, "samples_per_s", per_s, "memory",
        "param_bytes", (json_int_t)mem.param_bytes, "grad_bytes", (json_int_t)mem.grad_bytes,
        "optimizer_bytes", (json_int_t)mem.optimizer_bytes, "pool_bytes",
        (json_int_t)mem.pool_bytes, "model_state_bytes", (json_int_t)mem.model_state_bytes);
    if (rec && t->train.tok) {
        json_object_set_new(rec, "test_loss", number(t->test_loss));
        json_object_set_new(rec, "test_bpb", number(t->test_loss / M_LN2));
        json_object_set_new(rec, "tokens_per_s", number(per_s * (double)t->preds_per_row));
    }
    record(t, -1, rec);
}

void report_start(trainer *t)
{
    char model[256];
    t->a.model->describe(t->model, model, sizeof model);
    char where[512];
    if (t->device >= 0)
        snprintf(where, sizeof where, "GPU %d %s, %s backend%s%s%s", t->device, t->gpu_name,
                 coll_backend_name(t->backend), t->backend_why[0] ? " (" : "", t->backend_why,
                 t->backend_why[0] ? ")" : "");
    else
        snprintf(where, sizeof where, "OpenBLAS %s kernels", mlp_blas_core());
    fprintf(stderr,
            "ddp-train: %d rank%s, ZeRO-%d, %s (%zu parameters), %s lr %g (%s, "
            "warmup %ld), global batch %d (%d x %d micro-steps per rank), %d epoch%s of %d "
            "steps, %s (reduced in %s); %s\n",
            t->world, t->world == 1 ? "" : "s", t->a.zero, model, t->nelems,
            ddp_optimizer_name(t->a.optimizer), t->a.lr,
            t->a.schedule == DDP_SCHED_COSINE ? "cosine" : "constant", t->a.warmup,
            t->a.global_batch, t->sampler.micro, t->a.grad_accum, t->epochs,
            t->epochs == 1 ? "" : "s", t->steps_per_epoch, t->a.bf16 ? "bf16" : "f32",
            coll_dtype_name(t->a.reduce_dtype), where);
}
