/*
 * libddp's checkpoints (ddp.h, "Checkpoints"; the format is ckpt.h's): the save with its writer
 * thread and the manifest writer, the poll that completes an asynchronous save, the search for
 * the newest complete checkpoint, and the load into any world size and stage.
 *
 * Not here: parsing the manifest (ckpt_manifest.c), checking a shard whole (ddp-ckpt verify),
 * the layout itself (plan.c) and the model's internals (ddp.c, reached through ddp_internal.h).
 *
 * Invariants:
 *  - a manifest exists only for shards that are complete and fsynced on every rank: rank 0
 *    removes an old manifest of the same step before any rank opens a shard (a collective
 *    separates the two), and writes the new one only after the ranks' writers have all
 *    reported success through a collective;
 *  - collectives are issued by the training thread only, at points every rank reaches alike
 *    (the save, ddp_step()'s poll, ddp_checkpoint_wait(), the load); every decision that
 *    issues one is taken from a collective's result, so the ranks stay in step however fast
 *    their writers are. ddp_step()'s poll reads the result of the exchange the previous poll
 *    issued (ddp__host_icoll()), so that the host need not wait for a device's queue; every
 *    rank reads it at the same step. The writer thread touches only the snapshot, its files
 *    and its own result fields, which the training thread reads after `finished` is set;
 *  - the writer thread, not the save, copies the owned state into the snapshot, first thing, so
 *    that the save returns at once; it only reads the model's memory. The state changes only in
 *    ddp_step()'s optimizer and in ddp_checkpoint_load() (forward and backward read the
 *    parameters, stages 1-2's allgather never writes a rank's own part): the optimizer waits
 *    for each group's copy before updating that group (ddp__ckpt_wait_group(); the thread
 *    copies in the optimizer's order), the load for the whole copy, so the snapshot is the
 *    state of the step the checkpoint names, bit for bit (a device model's writer reads the
 *    host copy the save downloaded, which only the load changes). ddp_model_free() joins the
 *    writer before freeing that memory;
 *  - a failed save never breaks the model nor stops the next one. Its outcome is agreed (a
 *    collective, after every rank's writer finished or every rank prepared), so every rank
 *    alike logs it (COLL_LOG_WARN, naming the save's step and the cause), removes what the
 *    save wrote (remove_torn(): never a directory holding a complete checkpoint of another
 *    save) and keeps it for ddp_checkpoint_wait() until the next save starts. `keep` runs only
 *    after a complete save and counts only complete checkpoints, so a failed save never costs
 *    the newest complete one. A failed collective breaks the model, as in ddp_step().
 */
#include "ckpt.h"
#include "ddp_internal.h"
#include "monoclock.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MSG_BYTES 504 /* a rank's message in the outcome records */

/* snprintf for messages, where a long path may cut the sentence short. */
static void say(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------------------------------ */
/* Loading's range arithmetic                                                                  */
/* ------------------------------------------------------------------------------------------ */

int ddp__ckpt_map_range(const ddp__ckpt_manifest *mf, const ddp__plan *plan, size_t begin,
                        size_t end, ddp__ckpt_run *runs, size_t cap, size_t *n)
{
    if (begin > end || end > plan->total || mf->nparams != plan->nparams)
        return -EINVAL;
    size_t k = 0;
    ddp__ckpt_run last = {0}; /* the run being built: runs[k - 1] once written */
    for (int p = 0; p < plan->nparams && begin < end; p++) {
        size_t off = plan->param_offset[p], cnt = mf->params[p].count;
        size_t a = begin > off ? begin : off, b = end < off + cnt ? end : off + cnt;
        if (a >= b)
            continue;
        const ddp__ckpt_group *g = &mf->groups[mf->params[p].group];
        size_t in = mf->params[p].offset + (a - off) - g->offset; /* within the saving group */
        while (a < b) {
            int q = (int)(in / g->shard);
            size_t i = in % g->shard, take = b - a < g->shard - i ? b - a : g->shard - i;
            ddp__ckpt_run r = {a - begin, q, g->shard_offset + i, take};
            if (k > 0 && last.shard == q && last.src + last.count == r.src &&
                last.dst + last.count == r.dst)
                last.count += take;
            else
                last = r, k++;
            if (k <= cap)
                runs[k - 1] = last;
            a += take;
            in += take;
        }
    }
    *n = k;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* State, helpers                                                                              */
/* ------------------------------------------------------------------------------------------ */

/* A save in flight: its writers write the shards (SHARDS), their CRCs go to rank 0 (CRCS),
 * rank 0's writer writes the manifest (MANIFEST). */
enum phase { IDLE, SHARDS, CRCS, MANIFEST };

#define COPIED_ALL INT_MAX /* ddp__ckpt_state.copied: no part of the model is read */

/* One piece of the snapshot: `count` elements from the model's memory to element `to`. */
struct copy {
    const float *from;
    size_t to, count;
};

struct ddp__ckpt_state {
    enum phase phase;
    bool exchanging; /* the phase's exchange is in flight: the next advance() reads it */
    int64_t step;
    int keep;
    char root[PATH_MAX], dir[PATH_MAX], file[PATH_MAX];
    json_t *manifest; /* rank 0: built at the save, completed with the shards' CRCs */
    float *snap;      /* the host snapshot, reused from save to save */
    size_t snap_elems;

    /* The writer thread (a shard, or rank 0's manifest) and its result, which the training
     * thread reads only once `finished` is set. */
    pthread_t thread;
    bool joinable;
    atomic_int finished;
    int rc;
    char msg[MSG_BYTES];
    char warn[MSG_BYTES]; /* keep's trouble: logged, not a failure */
    uint32_t crc;
    uint32_t *chunks;
    size_t nchunks;
    uint64_t bytes;

    /* The shard's writer copies the owned state first, group by group in the optimizer's order:
     * copies[ncopies] say what goes where (group g's arrays are copies[g * nstate ...]), and
     * `copied` (under `lock`, signalled on `cond`) counts the groups whose parts are no longer
     * read, COPIED_ALL when none is. The training thread waits for a group before it changes
     * it, so the optimizer follows the copy instead of waiting for all of it. */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int copied;
    const ddp_options *o; /* the model's: the log hook for a wait */
    struct copy *copies;
    size_t ncopies;
    int copy_nstate;

    int failed_rc; /* the last save's failure (0: none), returned by every wait until the next
                      save starts */
    char failed_msg[768];
};

static void state_names(const ddp__model_view *v, const char **names, int *n)
{
    *n = 0;
    names[(*n)++] = "param";
    for (int k = 0; k < v->nopt; k++)
        names[(*n)++] = ddp__optimizer(v->o->optimizer)->state[k];
}

/* The model's state array s: 0 the parameters, then the optimizer's. */
static float *state_array(const ddp__model_view *v, int s)
{
    return s == 0 ? v->param : v->opt[s - 1];
}

/*
 * Where group g's owned part (part `rank`) of state array s is in the model's memory: the arena
 * (parameters at stages 0-2, optimizer state at stage 0) or the compact owned array.
 */
static float *owned_part(const ddp__model_view *v, int s, int g)
{
    const ddp__group *gr = &v->plan->groups[g];
    bool arena = s == 0 ? v->stage < 3 : v->stage == 0;
    return state_array(v, s) +
           (arena ? gr->offset + (size_t)v->rank * gr->shard : v->plan->shard_offset[g]);
}

/*
 * The shard files and the manifest list the groups in arena order (groups contiguous from
 * element 0, as ckpt.h's reader checks), while the plan numbers buckets in the order backward
 * completes them (bucket 0 at the arena's end). pos[g]: group g's place in arena order; at[g]:
 * its part's first element in each state array of a shard file. Both [ngroups].
 */
static void file_layout(const ddp__plan *pl, int *pos, size_t *at)
{
    int k = 0;
    size_t sum = 0;
    for (int p = 0; p < pl->nparams; p++) {
        int g = pl->param_group[p];
        if (p > 0 && g == pl->param_group[p - 1])
            continue;
        pos[g] = k++;
        at[g] = sum;
        sum += pl->groups[g].shard;
    }
}

static void log_line(const ddp__model_view *v, int level, const char *msg)
{
    if (v->o->log)
        v->o->log(v->o->log_arg, level, msg);
}

static int write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = fsync(fd) < 0 ? -errno : 0;
    close(fd);
    return rc;
}

/* mkdir -p (ckpt.h). */
int ddp__make_dirs(const char *path)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return -ENAMETOOLONG;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(buf, 0777) < 0 && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    return mkdir(buf, 0777) < 0 && errno != EEXIST ? -errno : 0;
}

/*
 * Every rank's outcome of a local part (rc, and msg when rc < 0): *outcome is 0 when every
 * rank succeeded, else the lowest failing rank's code on every rank, with the model's error its
 * message (prefixed "rank R: " on the others). Returns 0, or a collective's failure (the model
 * is broken; *outcome is not written).
 */
static int agree_outcome(ddp_model *m, const ddp__model_view *v, int rc, const char *msg,
                         int *outcome)
{
    typedef struct rec {
        int64_t rc;
        char msg[MSG_BYTES];
    } rec;
    rec mine = {.rc = rc};
    if (rc < 0)
        snprintf(mine.msg, sizeof mine.msg, "%s", msg);
    rec *all = calloc((size_t)v->world, sizeof *all);
    if (!all)
        return ddp__coll_failed(m, -ENOMEM, "checkpoint: agreeing on the outcome");
    int c = ddp__host_coll(m, DDP__HOST_ALLGATHER, &mine, all, sizeof mine, COLL_U8, COLL_SUM,
                           "checkpoint: agreeing on the outcome");
    if (c < 0) {
        free(all);
        return c;
    }
    int out = 0;
    for (int r = 0; r < v->world && out == 0; r++) {
        if (all[r].rc >= 0)
            continue;
        out = (int)all[r].rc;
        if (r == v->rank)
            ddp__fail(m, out, "%s", all[r].msg);
        else
            ddp__fail(m, out, "rank %d: %s", r, all[r].msg);
    }
    free(all);
    *outcome = out;
    return 0;
}

/* agree_outcome() as one code: 0, the agreed failure, or a collective's failure. */
static int agree(ddp_model *m, const ddp__model_view *v, int rc, const char *msg)
{
    int out = 0, c = agree_outcome(m, v, rc, msg, &out);
    return c < 0 ? c : out;
}

/* ------------------------------------------------------------------------------------------ */
/* The manifest                                                                                */
/* ------------------------------------------------------------------------------------------ */

/* Rank 0, at the save: every key of the manifest but "shards". NULL on out-of-memory. */
static json_t *build_manifest(ddp_model *m, const ddp__model_view *v, const char **names,
                              int nstate, const int *pos, const size_t *at,
                              const ddp_checkpoint_progress *pr, json_t *user)
{
    const ddp__plan *pl = v->plan;
    const ddp_options *o = v->o;
    json_t *j = json_object(), *st = json_array(), *units = json_array(), *params = json_array(),
           *groups = json_array();
    json_t *opt = json_pack("{s:s, s:f, s:b, s:f, s:f, s:f, s:f, s:f}", "kind",
                            ddp_optimizer_name(o->optimizer), "momentum", (double)o->momentum,
                            "nesterov", o->nesterov, "weight_decay", (double)o->weight_decay,
                            "beta1", (double)o->beta1, "beta2", (double)o->beta2, "eps",
                            (double)o->eps, "clip_norm", (double)o->clip_norm);
    json_t *prog = json_pack("{s:I, s:I, s:I}", "epoch", (json_int_t)pr->epoch, "position",
                             (json_int_t)pr->position, "seed", (json_int_t)pr->seed);
    bool ok = j && st && units && params && groups && opt && prog;
    for (int s = 0; ok && s < nstate; s++)
        ok = json_array_append_new(st, json_string(names[s])) == 0;
    for (int u = 0; ok && u < ddp_num_units(m); u++)
        ok = json_array_append_new(units, json_string(ddp__unit_name(m, u))) == 0;
    for (int p = 0; ok && p < ddp_num_params(m); p++) {
        int unit, ndim;
        int64_t shape[DDP__CKPT_MAX_DIMS];
        ddp__param_shape(m, p, &unit, &ndim, shape);
        char name[2 * 128 + 2];
        snprintf(name, sizeof name, "%s.%s", ddp__unit_name(m, unit), ddp_param_name(m, p));
        json_t *sh = json_array();
        for (int d = 0; sh && d < ndim; d++)
            json_array_append_new(sh, json_integer(shape[d]));
        ok = sh && json_array_append_new(params, json_pack("{s:s, s:i, s:o, s:s, s:I, s:I, s:i}",
                                                           "name", name, "unit", unit, "shape", sh,
                                                           "dtype", "float32", "offset",
                                                           (json_int_t)pl->param_offset[p], "count",
                                                           (json_int_t)ddp_param_count(m, p),
                                                           "group", pos[pl->param_group[p]])) == 0;
    }
    for (int k = 0; ok && k < pl->ngroups; k++) {
        int g = 0;
        while (pos[g] != k)
            g++;
        const ddp__group *gr = &pl->groups[g];
        ok = json_array_append_new(
                 groups,
                 json_pack("{s:I, s:I, s:I, s:I, s:I, s:i, s:i}", "offset", (json_int_t)gr->offset,
                           "count", (json_int_t)gr->count, "padded", (json_int_t)gr->padded,
                           "shard", (json_int_t)gr->shard, "shard_offset", (json_int_t)at[g],
                           "first", gr->first, "last", gr->last)) == 0;
    }
    if (ok)
        ok =
            json_object_set_new(j, "format", json_string(DDP__CKPT_FORMAT)) == 0 &&
            json_object_set_new(j, "version", json_integer(DDP__CKPT_VERSION)) == 0 &&
            json_object_set_new(j, "step", json_integer(*v->steps)) == 0 &&
            json_object_set_new(j, "attempted", json_integer(*v->attempted)) == 0 &&
            json_object_set_new(j, "world_size", json_integer(v->world)) == 0 &&
            json_object_set_new(j, "zero_stage", json_integer(v->stage)) == 0 &&
            json_object_set_new(j, "dtype", json_string("float32")) == 0 &&
            json_object_set(j, "optimizer", opt) == 0 && json_object_set(j, "state", st) == 0 &&
            json_object_set(j, "units", units) == 0 && json_object_set(j, "params", params) == 0 &&
            json_object_set(j, "groups", groups) == 0 &&
            json_object_set_new(j, "total", json_integer((json_int_t)pl->total)) == 0 &&
            json_object_set_new(j, "shard_total", json_integer((json_int_t)pl->shard_total)) == 0 &&
            json_object_set_new(j, "chunk_bytes", json_integer(DDP__CKPT_CHUNK_BYTES)) == 0 &&
            json_object_set(j, "progress", prog) == 0 &&
            (!user || json_object_set(j, "user", user) == 0);
    json_decref(st), json_decref(units), json_decref(params), json_decref(groups);
    json_decref(opt), json_decref(prog);
    if (!ok) {
        json_decref(j);
        return NULL;
    }
    return j;
}

/*
 * Removes checkpoint directory `dir` (complete or not): its manifest first, so that it is never
 * a complete checkpoint with shards missing, then every other file, then the directory.
 */
static int remove_checkpoint(const char *dir)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/" DDP__CKPT_MANIFEST, dir);
    if (unlink(path) < 0 && errno != ENOENT)
        return -errno;
    (void)fsync_dir(dir);
    DIR *d = opendir(dir);
    if (!d)
        return -errno;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            (void)unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
    return rmdir(dir) < 0 ? -errno : 0;
}

/* "step-NNNNNNNNNNNN" (any number of digits): its step, else -1. */
static int64_t dir_step(const char *name)
{
    if (strncmp(name, "step-", 5) || !name[5])
        return -1;
    int64_t s = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9' || s > (INT64_MAX - 9) / 10)
            return -1;
        s = s * 10 + (*p - '0');
    }
    return s;
}

static int cmp_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The steps of root's step-* directories, newest first; *n of them (malloc'ed, or NULL). */
static int list_steps(const char *root, int64_t **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    DIR *d = opendir(root);
    if (!d)
        return -errno;
    size_t cap = 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t s = dir_step(e->d_name);
        if (s < 0)
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *p = realloc(*out, cap * sizeof *p);
            if (!p) {
                rc = -ENOMEM;
                break;
            }
            *out = p;
        }
        (*out)[(*n)++] = s;
    }
    closedir(d);
    if (rc < 0) {
        free(*out);
        *out = NULL;
        *n = 0;
        return rc;
    }
    if (*n)
        qsort(*out, *n, sizeof **out, cmp_desc);
    return 0;
}

/* Rank 0's writer, after the renamed manifest: the complete checkpoints beyond `keep` go. */
static void apply_keep(struct ddp__ckpt_state *ck)
{
    int64_t *steps;
    size_t n;
    if (ck->keep <= 0 || list_steps(ck->root, &steps, &n) < 0)
        return;
    int kept = 0;
    for (size_t i = 0; i < n; i++) {
        char dir[PATH_MAX + 32], man[PATH_MAX + 64];
        snprintf(dir, sizeof dir, "%s/" DDP__CKPT_DIR_FMT, ck->root, steps[i]);
        snprintf(man, sizeof man, "%s/" DDP__CKPT_MANIFEST, dir);
        if (access(man, F_OK) < 0)
            continue; /* incomplete: not counted, and left alone (a save may be writing it) */
        if (kept++ < ck->keep || steps[i] == ck->step)
            continue;
        int rc = remove_checkpoint(dir);
        if (rc < 0 && !ck->warn[0])
            say(ck->warn, sizeof ck->warn, "checkpoint: removing %s (keep %d): %s", dir, ck->keep,
                strerror(-rc));
    }
    free(steps);
}

/* ------------------------------------------------------------------------------------------ */
/* The writer thread                                                                           */
/* ------------------------------------------------------------------------------------------ */

static int finish_job(struct ddp__ckpt_state *ck, int rc)
{
    ck->rc = rc;
    atomic_store(&ck->finished, 1);
    return rc;
}

static void set_copied(struct ddp__ckpt_state *ck, int groups)
{
    pthread_mutex_lock(&ck->lock);
    ck->copied = groups;
    pthread_cond_broadcast(&ck->cond);
    pthread_mutex_unlock(&ck->lock);
}

/* Returns the ns waited until the writer has copied groups [0, g]. */
static int64_t wait_copied(struct ddp__ckpt_state *ck, int g)
{
    pthread_mutex_lock(&ck->lock);
    int64_t t0 = ck->copied > g ? 0 : mono_now_ns();
    while (ck->copied <= g)
        pthread_cond_wait(&ck->cond, &ck->lock);
    pthread_mutex_unlock(&ck->lock);
    return t0 ? mono_now_ns() - t0 : 0;
}

int64_t ddp__ckpt_wait_group(struct ddp__ckpt_state *ck, int g)
{
    return ck ? wait_copied(ck, g) : 0;
}

void ddp__ckpt_waited(struct ddp__ckpt_state *ck, int64_t ns)
{
    if (ck && ns > 0 && ck->o->log) {
        char line[PATH_MAX + 128];
        say(line, sizeof line, "checkpoint %s: waited %.3f ms for the writer's copy of the state",
            ck->dir, (double)ns / 1e6);
        ck->o->log(ck->o->log_arg, COLL_LOG_INFO, line);
    }
}

void ddp__ckpt_wait_copied(struct ddp__ckpt_state *ck)
{
    if (ck)
        ddp__ckpt_waited(ck, wait_copied(ck, COPIED_ALL - 1));
}

/*
 * Copies this rank's parts of every state array into the snapshot, in the shard's layout (the
 * model's memory is read here and nowhere else in the thread), then writes the snapshot as this
 * rank's shard, CRC32C per chunk and whole, fsynced.
 */
static void *write_shard(void *arg)
{
    struct ddp__ckpt_state *ck = arg;
    for (size_t i = 0; i < ck->ncopies; i++) {
        memcpy(ck->snap + ck->copies[i].to, ck->copies[i].from,
               ck->copies[i].count * sizeof(float));
        if ((i + 1) % (size_t)ck->copy_nstate == 0) /* a group's arrays are all copied */
            set_copied(ck, (int)((i + 1) / (size_t)ck->copy_nstate));
    }
    set_copied(ck, COPIED_ALL);
    const unsigned char *p = (const unsigned char *)ck->snap;
    uint64_t bytes = ck->bytes;
    int fd = open(ck->file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    int rc = fd < 0 ? -errno : 0;
    uint32_t whole = 0;
    for (size_t c = 0; rc == 0 && c < ck->nchunks; c++) {
        size_t at = c * DDP__CKPT_CHUNK_BYTES;
        size_t len = bytes - at < DDP__CKPT_CHUNK_BYTES ? bytes - at : DDP__CKPT_CHUNK_BYTES;
        ck->chunks[c] = ddp__crc32c(0, p + at, len);
        whole = ddp__crc32c(whole, p + at, len);
        rc = write_all(fd, p + at, len);
    }
    if (rc == 0 && fsync(fd) < 0)
        rc = -errno;
    if (fd >= 0 && close(fd) < 0 && rc == 0)
        rc = -errno;
    /* The file's name is made durable by rank 0's fsync of this directory after it renames
     * the manifest into place (a directory's fsync covers every entry made before it). */
    if (rc < 0)
        say(ck->msg, sizeof ck->msg, "writing %s: %s", ck->file, strerror(-rc));
    ck->crc = whole;
    finish_job(ck, rc);
    return NULL;
}

/* Rank 0: manifest.json.tmp, fsync, rename, fsync of the directory and of the root; then `keep`. */
static void *write_manifest(void *arg)
{
    struct ddp__ckpt_state *ck = arg;
    char tmp[PATH_MAX + 32], fin[PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s/" DDP__CKPT_MANIFEST_TMP, ck->dir);
    snprintf(fin, sizeof fin, "%s/" DDP__CKPT_MANIFEST, ck->dir);
    char *text = json_dumps(ck->manifest, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    int rc = text ? 0 : -ENOMEM, fd = -1;
    if (rc == 0 && (fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666)) < 0)
        rc = -errno;
    if (rc == 0)
        rc = write_all(fd, text, strlen(text));
    if (rc == 0)
        rc = write_all(fd, "\n", 1);
    if (rc == 0 && fsync(fd) < 0)
        rc = -errno;
    if (fd >= 0 && close(fd) < 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, fin) < 0)
        rc = -errno;
    if (rc == 0)
        rc = fsync_dir(ck->dir); /* the manifest's name and the shards' names */
    if (rc == 0)
        rc = fsync_dir(ck->root); /* the step directory's name */
    free(text);
    if (rc < 0) {
        say(ck->msg, sizeof ck->msg, "writing %s: %s", fin, strerror(-rc));
        (void)unlink(tmp);
    } else {
        apply_keep(ck);
    }
    finish_job(ck, rc);
    return NULL;
}

static void start_job(struct ddp__ckpt_state *ck, void *(*fn)(void *))
{
    ck->rc = 0;
    ck->msg[0] = ck->warn[0] = 0;
    atomic_store(&ck->finished, 0);
    int rc = pthread_create(&ck->thread, NULL, fn, ck);
    if (rc != 0) {
        snprintf(ck->msg, sizeof ck->msg, "starting the checkpoint writer: %s", strerror(rc));
        set_copied(ck, COPIED_ALL); /* nothing reads the model: the save fails */
        finish_job(ck, -rc);
        return;
    }
    ck->joinable = true;
}

static void join_job(struct ddp__ckpt_state *ck)
{
    if (ck->joinable) {
        pthread_join(ck->thread, NULL);
        ck->joinable = false;
    }
}

void ddp__ckpt_state_free(struct ddp__ckpt_state *ck)
{
    if (!ck)
        return;
    join_job(ck);
    pthread_cond_destroy(&ck->cond);
    pthread_mutex_destroy(&ck->lock);
    json_decref(ck->manifest);
    free(ck->snap);
    free(ck->chunks);
    free(ck->copies);
    free(ck);
}

/* ------------------------------------------------------------------------------------------ */
/* Completing a save                                                                           */
/* ------------------------------------------------------------------------------------------ */

/*
 * What a failed save leaves goes, on every rank alike once the failure is agreed (no writer
 * runs on any rank then). `written`: the save got as far as its writers, which opened every
 * rank's shard with O_TRUNC after rank 0 had removed any manifest of that step, so the whole
 * directory is this save's and torn: each rank unlinks its own shard (the directory may be on
 * a disk of the rank's own), rank 0 removes the rest (other ranks' shards on a shared disk, a
 * manifest or its temporary file) and the directory, the others try rmdir for a disk of their
 * own. Otherwise the save failed while preparing, perhaps before rank 0 removed the manifest of
 * a complete checkpoint of the same step, so only an empty directory (one the save made) goes.
 * No other step's directory is touched. Returns 0 or the failure that left something behind.
 */
static int remove_torn(const ddp__model_view *v, const struct ddp__ckpt_state *ck, bool written)
{
    int rc = 0;
    if (!ck->dir[0])
        return 0;
    if (written && unlink(ck->file) < 0 && errno != ENOENT)
        rc = -errno;
    if (written && v->rank == 0 && rc == 0) {
        if ((rc = remove_checkpoint(ck->dir)) == -ENOENT)
            rc = 0; /* another rank's rmdir came first */
    } else if (rmdir(ck->dir) < 0 && errno != ENOENT && errno != ENOTEMPTY && errno != EEXIST &&
               rc == 0) {
        rc = -errno;
    }
    return rc;
}

/*
 * The save failed (rc, the cause as fmt): every rank, at the same point. Its directory goes
 * (remove_torn()), the failure is logged and kept for ddp_checkpoint_wait() until the next save.
 */
static void save_failed(const ddp__model_view *v, struct ddp__ckpt_state *ck, int rc, bool written,
                        const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void save_failed(const ddp__model_view *v, struct ddp__ckpt_state *ck, int rc, bool written,
                        const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t cap = sizeof ck->failed_msg;
    int n = snprintf(ck->failed_msg, cap, "checkpoint of step %" PRId64 " failed: ", ck->step);
    if (n > 0 && (size_t)n < cap)
        n += vsnprintf(ck->failed_msg + n, cap - (size_t)n, fmt, ap);
    va_end(ap);
    int gone = remove_torn(v, ck, written);
    if (n > 0 && (size_t)n < cap && gone < 0)
        say(ck->failed_msg + n, cap - (size_t)n, "; removing %s: %s", ck->dir, strerror(-gone));
    else if (n > 0 && (size_t)n < cap && written)
        say(ck->failed_msg + n, cap - (size_t)n, "; %s removed", ck->dir);
    ck->failed_rc = rc;
    ck->phase = IDLE;
    json_decref(ck->manifest);
    ck->manifest = NULL;
    log_line(v, COLL_LOG_WARN, ck->failed_msg);
}

/* A rank's record in the gather of the shards' CRCs: rc and CRC, message, chunks' CRCs. */
static size_t crc_record_bytes(const struct ddp__ckpt_state *ck)
{
    return 16 + MSG_BYTES + ck->nchunks * 4;
}

/*
 * The exchange that moves the save on from its phase: SHARDS and MANIFEST, the allreduce (MIN)
 * of every rank's (finished, rc); CRCS, the allgather of this rank's CRC record.
 */
static int exchange(ddp_model *m, struct ddp__ckpt_state *ck)
{
    if (ck->phase != CRCS) {
        int fin = atomic_load(&ck->finished);
        int64_t mine[2] = {fin, fin ? ck->rc : 0};
        return ddp__host_icoll(m, DDP__HOST_ALLREDUCE, mine, 2, COLL_I64, COLL_MIN,
                               "checkpoint: polling the writers");
    }
    size_t rec = crc_record_bytes(ck);
    unsigned char *mine = calloc(1, rec);
    if (!mine)
        return ddp__coll_failed(m, -ENOMEM, "checkpoint: gathering the shards' CRCs");
    int64_t head[2] = {ck->rc, ck->crc};
    memcpy(mine, head, 16);
    memcpy(mine + 16, ck->msg, MSG_BYTES);
    memcpy(mine + 16 + MSG_BYTES, ck->chunks, ck->nchunks * 4);
    int rc = ddp__host_icoll(m, DDP__HOST_ALLGATHER, mine, rec, COLL_U8, COLL_SUM,
                             "checkpoint: gathering the shards' CRCs");
    free(mine);
    return rc;
}

/* Every rank's shard is written and its CRCs are in `all`: rank 0 starts the manifest. */
static void shards_written(const ddp__model_view *v, struct ddp__ckpt_state *ck,
                           const unsigned char *all)
{
    size_t rec = crc_record_bytes(ck);
    int64_t head[2];
    for (int r = 0; r < v->world; r++) {
        memcpy(head, all + (size_t)r * rec, 16);
        if (head[0] < 0) {
            save_failed(v, ck, (int)head[0], true, "rank %d: %.*s", r, MSG_BYTES,
                        (const char *)all + (size_t)r * rec + 16);
            return;
        }
    }
    if (v->rank == 0) {
        json_t *shards = json_array();
        bool ok = shards != NULL;
        for (int r = 0; ok && r < v->world; r++) {
            const unsigned char *p = all + (size_t)r * rec;
            memcpy(head, p, 16);
            json_t *chunks = json_array();
            for (size_t c = 0; chunks && c < ck->nchunks; c++) {
                uint32_t crc;
                memcpy(&crc, p + 16 + MSG_BYTES + 4 * c, 4);
                if (json_array_append_new(chunks, json_integer(crc)) < 0)
                    json_decref(chunks), chunks = NULL;
            }
            char file[64];
            snprintf(file, sizeof file, DDP__CKPT_SHARD_FMT, r, v->world);
            ok = chunks &&
                 json_array_append_new(shards, json_pack("{s:s, s:I, s:I, s:o}", "file", file,
                                                         "bytes", (json_int_t)ck->bytes, "crc32c",
                                                         (json_int_t)(uint32_t)head[1], "chunks",
                                                         chunks)) == 0;
        }
        if (!ok || json_object_set_new(ck->manifest, "shards", shards) < 0) {
            json_decref(shards); /* json_object_set_new dropped it on failure */
            finish_job(ck, -ENOMEM);
            snprintf(ck->msg, sizeof ck->msg, "building the manifest: out of memory");
        } else {
            start_job(ck, write_manifest);
        }
    } else {
        finish_job(ck, 0); /* only rank 0 writes the manifest */
    }
    ck->phase = MANIFEST;
}

/* Waits for the exchange in flight and moves the save on from its result. */
static int exchanged(ddp_model *m, const ddp__model_view *v, struct ddp__ckpt_state *ck)
{
    const void *res;
    int rc = ddp__host_icoll_wait(m, &res);
    if (rc < 0)
        return rc;
    if (ck->phase == CRCS) {
        shards_written(v, ck, res);
        return 0;
    }
    int64_t all[2];
    memcpy(all, res, sizeof all);
    if (all[0] == 0)
        return 0; /* some rank's writer was still at work */
    join_job(ck);
    if (ck->phase == SHARDS) {
        ck->phase = CRCS;
        return 0;
    }
    if (ck->warn[0])
        log_line(v, COLL_LOG_WARN, ck->warn);
    if (all[1] < 0) {
        save_failed(v, ck, (int)all[1], true, "rank 0: %s",
                    v->rank == 0 ? ck->msg : strerror((int)-all[1]));
    } else {
        ck->phase = IDLE;
        json_decref(ck->manifest);
        ck->manifest = NULL;
    }
    return 0;
}

/*
 * Moves an in-flight save on through its exchanges: the polls of the writers (SHARDS), the
 * gather of the shards' CRCs, after which rank 0 starts the manifest (CRCS), the polls of rank
 * 0's manifest writer (MANIFEST). Each exchange is issued by one call and its result read by
 * the next, first thing (ddp_step()'s poll: the host finds it arrived, and every rank acts on
 * the same result at the same step), which then issues the next unless the save is complete.
 * `block`: exchanges follow one another, this rank joining its own job before each poll, until
 * the save is complete or failed. Returns 0 or a collective's failure.
 */
static int advance(ddp_model *m, const ddp__model_view *v, struct ddp__ckpt_state *ck, bool block)
{
    for (;;) {
        int rc;
        if (ck->exchanging) {
            ck->exchanging = false;
            if ((rc = exchanged(m, v, ck)) < 0)
                return rc;
        }
        if (ck->phase == IDLE)
            return 0;
        if (block && ck->phase != CRCS)
            join_job(ck);
        if ((rc = exchange(m, ck)) < 0)
            return rc;
        ck->exchanging = true;
        if (!block)
            return 0;
    }
}

int ddp__ckpt_poll(ddp_model *m)
{
    ddp__model_view v;
    int rc = ddp__model_view_get(m, &v);
    if (rc < 0)
        return rc;
    struct ddp__ckpt_state *ck = *v.ck;
    return ck && ck->phase != IDLE ? advance(m, &v, ck, false) : 0;
}

int ddp_checkpoint_wait(ddp_model *m)
{
    ddp__model_view v;
    int rc = ddp__model_view_get(m, &v);
    if (rc < 0)
        return rc;
    struct ddp__ckpt_state *ck = *v.ck;
    if (!ck)
        return 0;
    if ((rc = advance(m, &v, ck, true)) < 0)
        return rc;
    return ck->failed_rc < 0 ? ddp__fail(m, ck->failed_rc, "%s", ck->failed_msg) : 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Saving                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/*
 * What the writer copies: this rank's part of every group of every state array, in the shard's
 * layout (ck->copies[nstate * ngroups], allocated by the caller), group by group in plan order:
 * the order in which ddp_step()'s optimizer updates them.
 */
static void plan_copies(const ddp__model_view *v, struct ddp__ckpt_state *ck, int nstate,
                        const size_t *at)
{
    const ddp__plan *pl = v->plan;
    ck->ncopies = 0;
    ck->copy_nstate = nstate;
    for (int g = 0; g < pl->ngroups; g++)
        for (int s = 0; s < nstate; s++)
            ck->copies[ck->ncopies++] = (struct copy){
                owned_part(v, s, g), (size_t)s * pl->shard_total + at[g], pl->groups[g].shard};
}

/* Every rank: mkdir -p ROOT/step-N; rank 0 removes a manifest of the same step. */
static int prepare_dir(const ddp__model_view *v, struct ddp__ckpt_state *ck, char *msg, size_t cap)
{
    int rc = ddp__make_dirs(ck->dir);
    if (rc < 0) {
        say(msg, cap, "creating %s: %s", ck->dir, strerror(-rc));
        return rc;
    }
    if (v->rank != 0)
        return 0;
    char man[PATH_MAX + 32];
    snprintf(man, sizeof man, "%s/" DDP__CKPT_MANIFEST, ck->dir);
    if (unlink(man) == 0)
        rc = fsync_dir(ck->dir); /* gone for good before any shard is rewritten */
    else if (errno != ENOENT)
        rc = -errno;
    if (rc < 0)
        say(msg, cap, "preparing %s: %s", ck->dir, strerror(-rc));
    return rc;
}

int ddp_checkpoint_save(ddp_model *m, const char *root, const ddp_checkpoint_progress *progress,
                        const char *user_json, int keep, unsigned flags)
{
    ddp__model_view v;
    int rc = ddp__model_view_get(m, &v), *pos = NULL;
    size_t *at = NULL;
    if (rc < 0)
        return rc;
    if (!root || !*root || keep < 0 || (flags & ~DDP_CKPT_SYNC))
        return ddp__fail(m, -EINVAL,
                         "ddp_checkpoint_save: bad argument (root %s, keep %d, flags %#x: a "
                         "save takes DDP_CKPT_SYNC)",
                         root ? root : "NULL", keep, flags);
    json_t *user = NULL;
    if (user_json) {
        json_error_t je;
        user = json_loads(user_json, 0, &je);
        if (!json_is_object(user)) {
            json_decref(user);
            return ddp__fail(m, -EINVAL, "ddp_checkpoint_save: user_json is not a JSON object%s%s",
                             user ? "" : ": ", user ? "" : je.text);
        }
    }
    /* The previous save completes first; its failure, logged when it was agreed, does not stop
     * this one. */
    struct ddp__ckpt_state *ck = *v.ck;
    if ((ck && (rc = advance(m, &v, ck, true)) < 0) || (rc = ddp__model_view_host(m, &v, true)) < 0)
        goto out;
    if (!ck) {
        if (!(ck = calloc(1, sizeof *ck))) {
            rc = ddp__fail(m, -ENOMEM, "ddp_checkpoint_save: out of memory");
            goto out;
        }
        pthread_mutex_init(&ck->lock, NULL);
        pthread_cond_init(&ck->cond, NULL);
        ck->copied = COPIED_ALL;
        ck->o = v.o;
        *v.ck = ck;
    }
    const char *names[DDP__CKPT_MAX_STATE];
    int nstate;
    state_names(&v, names, &nstate);
    size_t elems = (size_t)nstate * v.plan->shard_total;
    ck->failed_rc = 0; /* the previous save's outcome gives way to this one's */
    ck->step = *v.steps;
    ck->keep = keep;
    ck->bytes = (uint64_t)elems * sizeof(float);
    ck->nchunks = (ck->bytes + DDP__CKPT_CHUNK_BYTES - 1) / DDP__CKPT_CHUNK_BYTES;
    char msg[MSG_BYTES] = "";
    int local = 0;
    if ((size_t)snprintf(ck->root, sizeof ck->root, "%s", root) >= sizeof ck->root ||
        (size_t)snprintf(ck->dir, sizeof ck->dir, "%s/" DDP__CKPT_DIR_FMT, root, ck->step) >=
            sizeof ck->dir ||
        (size_t)snprintf(ck->file, sizeof ck->file, "%s/" DDP__CKPT_SHARD_FMT, ck->dir, v.rank,
                         v.world) >= sizeof ck->file) {
        local = -ENAMETOOLONG;
        snprintf(msg, sizeof msg, "ddp_checkpoint_save: %s: the path is too long", root);
        ck->dir[0] = ck->file[0] = 0; /* nothing to remove (remove_torn()) */
    }
    /* Memory first, so that a rank short of it fails before any file is touched. */
    if (local == 0 && ck->snap_elems < elems) {
        free(ck->snap);
        ck->snap_elems = 0;
        ck->snap = malloc(elems * sizeof(float));
        if (ck->snap)
            ck->snap_elems = elems;
    }
    if (local == 0) {
        free(ck->chunks);
        free(ck->copies);
        ck->chunks = calloc(ck->nchunks ? ck->nchunks : 1, sizeof *ck->chunks);
        ck->copies = malloc((size_t)nstate * (size_t)v.plan->ngroups * sizeof *ck->copies);
        pos = malloc((size_t)v.plan->ngroups * sizeof *pos);
        at = malloc((size_t)v.plan->ngroups * sizeof *at);
        if (!ck->snap || !ck->chunks || !ck->copies || !pos || !at) {
            local = -ENOMEM;
            snprintf(msg, sizeof msg, "ddp_checkpoint_save: out of memory for the snapshot");
        }
    }
    /* The exchanges' buffers (the CRCs' gather is the largest), kept from save to save. */
    if (local == 0 &&
        (local = ddp__host_icoll_reserve(m, (size_t)v.world * crc_record_bytes(ck))) < 0)
        snprintf(msg, sizeof msg, "ddp_checkpoint_save: the buffers of the save's exchanges: %s",
                 local == COLL_ECUDA ? ddp_last_error(m) : ddp_strerror(local));
    if (local == 0)
        file_layout(v.plan, pos, at);
    if (local == 0 && v.rank == 0) {
        ddp_checkpoint_progress zero = {0};
        if (!(ck->manifest = build_manifest(m, &v, names, nstate, pos, at,
                                            progress ? progress : &zero, user))) {
            local = -ENOMEM;
            snprintf(msg, sizeof msg, "ddp_checkpoint_save: out of memory for the manifest");
        }
    }
    if (local == 0)
        local = prepare_dir(&v, ck, msg, sizeof msg);
    /* The barrier: no rank opens its shard before rank 0 removed an old manifest. */
    int outcome = 0;
    if ((rc = agree_outcome(m, &v, local, msg, &outcome)) < 0) {
        json_decref(ck->manifest);
        ck->manifest = NULL;
        goto out;
    }
    if (outcome < 0) { /* a rank could not prepare: the save fails as if a writer had */
        save_failed(&v, ck, outcome, false, "%s", ddp_last_error(m));
    } else {
        plan_copies(&v, ck, nstate, at);
        ck->copied = 0; /* no writer runs (the wait above joined it) */
        ck->phase = SHARDS;
        start_job(ck, write_shard);
    }
    if (flags & DDP_CKPT_SYNC)
        rc = ddp_checkpoint_wait(m);
out:
    json_decref(user);
    free(pos);
    free(at);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Finding the newest                                                                          */
/* ------------------------------------------------------------------------------------------ */

int ddp_checkpoint_latest(const char *root, char *path, size_t cap, ddp_log_fn log, void *log_arg)
{
    if (!root || !path)
        return -EINVAL;
    int64_t *steps;
    size_t n;
    int rc = list_steps(root, &steps, &n);
    if (rc == -ENOENT)
        return 0;
    if (rc < 0)
        return rc;
    int found = 0;
    for (size_t i = 0; i < n && !found; i++) {
        char dir[PATH_MAX], err[512];
        if ((size_t)snprintf(dir, sizeof dir, "%s/" DDP__CKPT_DIR_FMT, root, steps[i]) >=
            sizeof dir) {
            rc = -ENAMETOOLONG;
            break;
        }
        ddp__ckpt_manifest mf;
        int r = ddp__ckpt_manifest_read(dir, &mf, err, sizeof err);
        if (r == 0) {
            ddp__ckpt_manifest_free(&mf);
            if ((size_t)snprintf(path, cap, "%s", dir) >= cap) {
                rc = -ENAMETOOLONG;
                break;
            }
            found = 1;
        } else if (log) {
            char line[768];
            say(line, sizeof line, "checkpoint %s skipped: %s", dir,
                r == -ENOENT ? "no manifest (incomplete: a save crashed or is in flight)" : err);
            log(log_arg, COLL_LOG_WARN, line);
        }
    }
    free(steps);
    return rc < 0 ? rc : found;
}

/* ------------------------------------------------------------------------------------------ */
/* Loading                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* Reads byte ranges of shard files, whole CRC chunks at a time, each checked. */
typedef struct reader {
    const ddp__ckpt_manifest *mf;
    int *fds; /* [world of the save], -1: not open yet */
    unsigned char *buf;
    int shard; /* the chunk in buf: shard file and index (-1: none) */
    size_t chunk;
    char *msg;
    size_t cap;
} reader;

static int open_shard(reader *rd, int q)
{
    if (rd->fds[q] >= 0)
        return 0;
    const ddp__ckpt_shard *sh = &rd->mf->shards[q];
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", rd->mf->dir, sh->file);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        say(rd->msg, rd->cap, "%s: %s", path,
            e == ENOENT ? "missing (the manifest lists it)" : strerror(e));
        return -e;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        say(rd->msg, rd->cap, "%s: %s", path, strerror(e));
        close(fd);
        return -e;
    }
    if ((uint64_t)st.st_size != sh->bytes) {
        say(rd->msg, rd->cap,
            "%s: %lld bytes, the manifest says %" PRIu64 " (truncated or "
            "overwritten)",
            path, (long long)st.st_size, sh->bytes);
        close(fd);
        return -EPROTO;
    }
    rd->fds[q] = fd;
    return 0;
}

/* Copies bytes [off, off + len) of shard file q to dst through checked chunks. */
static int read_range(reader *rd, int q, uint64_t off, size_t len, void *dst)
{
    const ddp__ckpt_manifest *mf = rd->mf;
    const ddp__ckpt_shard *sh = &mf->shards[q];
    size_t cb = mf->chunk_bytes;
    int rc = open_shard(rd, q);
    if (rc < 0)
        return rc;
    unsigned char *out = dst;
    while (len > 0) {
        size_t c = (size_t)(off / cb), at = c * cb;
        size_t clen = sh->bytes - at < cb ? (size_t)(sh->bytes - at) : cb;
        if (rd->shard != q || rd->chunk != c) {
            rd->shard = -1;
            size_t got = 0;
            while (got < clen) {
                ssize_t r = pread(rd->fds[q], rd->buf + got, clen - got, (off_t)(at + got));
                if (r < 0 && errno == EINTR)
                    continue;
                if (r <= 0) {
                    rc = r < 0 ? -errno : -EPROTO;
                    snprintf(rd->msg, rd->cap, "%s/%s: reading bytes [%zu, %zu): %s", mf->dir,
                             sh->file, at, at + clen, r < 0 ? strerror(errno) : "end of file");
                    return rc;
                }
                got += (size_t)r;
            }
            uint32_t crc = ddp__crc32c(0, rd->buf, clen);
            if (crc != sh->chunks[c]) {
                snprintf(rd->msg, rd->cap,
                         "%s/%s: bytes [%zu, %zu) fail their CRC32C (0x%08x, the manifest says "
                         "0x%08x): the file is damaged",
                         mf->dir, sh->file, at, at + clen, crc, sh->chunks[c]);
                return -EBADMSG;
            }
            rd->shard = q;
            rd->chunk = c;
        }
        size_t from = (size_t)(off - at), take = clen - from < len ? clen - from : len;
        memcpy(out, rd->buf + from, take);
        out += take;
        off += take;
        len -= take;
    }
    return 0;
}

/* "[a, b, c]" of a shape, for messages. */
static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    buf[0] = '\0';
    for (int d = 0, n = 0; d < ndim && n >= 0 && (size_t)n < cap; d++)
        n += snprintf(buf + n, cap - (size_t)n, "%s%" PRId64, d ? ", " : "", shape[d]);
}

/*
 * The model's parameters against the manifest's, matched by name ("unit.param"), and the
 * optimizer; -EINVAL names what differs. Names, not positions, because the saving side's order
 * need not be the model's (a file imported by ddp-ckpt keeps its own order; the layout is
 * remapped anyway). On success mf->params is put in the model's order, which is what the
 * range arithmetic (ddp__ckpt_map_range) expects: params[p] is the model's parameter p.
 */
static int check_model(ddp_model *m, const ddp__model_view *v, ddp__ckpt_manifest *mf,
                       unsigned flags, char *msg, size_t cap)
{
    int np = ddp_num_params(m);
    if (mf->nparams != np)
        return snprintf(msg, cap, "%s/" DDP__CKPT_MANIFEST ": %d parameters, the model has %d",
                        mf->dir, mf->nparams, np),
               -EINVAL;
    ddp__ckpt_param *order = malloc((size_t)np * sizeof *order);
    bool *taken = calloc((size_t)np, sizeof *taken);
    int rc = 0;
    if (!order || !taken) {
        snprintf(msg, cap, "ddp_checkpoint_load: out of memory");
        rc = -ENOMEM;
        goto out;
    }
    for (int p = 0; p < np && rc == 0; p++) {
        int unit, ndim;
        int64_t shape[DDP__CKPT_MAX_DIMS];
        ddp__param_shape(m, p, &unit, &ndim, shape);
        char name[2 * 128 + 2];
        snprintf(name, sizeof name, "%s.%s", ddp__unit_name(m, unit), ddp_param_name(m, p));
        int k = !taken[p] && !strcmp(mf->params[p].name, name) ? p : -1; /* the usual case */
        for (int j = 0; j < np && k < 0; j++)
            if (!taken[j] && !strcmp(mf->params[j].name, name))
                k = j;
        char a[160], b[160];
        shape_str(b, sizeof b, ndim, shape);
        if (k < 0) {
            say(msg, cap,
                "%s/" DDP__CKPT_MANIFEST ": the model's parameter '%s' [%s] is not in it: "
                "a checkpoint of another model",
                mf->dir, name, b);
            rc = -EINVAL;
            break;
        }
        const ddp__ckpt_param *c = &mf->params[k];
        if (c->ndim != ndim || memcmp(c->shape, shape, (size_t)ndim * sizeof *shape) != 0) {
            shape_str(a, sizeof a, c->ndim, c->shape);
            say(msg, cap,
                "%s/" DDP__CKPT_MANIFEST ": parameter '%s' is [%s], the model's is [%s] "
                "float32: a checkpoint of another model",
                mf->dir, name, a, b);
            rc = -EINVAL;
            break;
        }
        taken[k] = true;
        order[p] = *c;
    }
    if (rc == 0) {
        free(mf->params); /* the names move to `order` */
        mf->params = order;
        order = NULL;
    }
out:
    free(order);
    free(taken);
    if (rc < 0)
        return rc;
    const ddp_options *o = v->o;
    if (!(flags & DDP_CKPT_PARAMS_ONLY) && mf->optimizer != o->optimizer) {
        snprintf(msg, cap,
                 "%s/" DDP__CKPT_MANIFEST ": the optimizer is %s, the model's %s (load with "
                 "DDP_CKPT_PARAMS_ONLY to take the parameters alone)",
                 mf->dir, ddp_optimizer_name(mf->optimizer), ddp_optimizer_name(o->optimizer));
        return -EINVAL;
    }
    if (!(flags & DDP_CKPT_PARAMS_ONLY) && v->rank == 0 &&
        (mf->momentum != o->momentum || mf->nesterov != o->nesterov ||
         mf->weight_decay != o->weight_decay || mf->beta1 != o->beta1 || mf->beta2 != o->beta2 ||
         mf->eps != o->eps || mf->clip_norm != o->clip_norm)) {
        char line[PATH_MAX + 256];
        snprintf(line, sizeof line,
                 "%s/" DDP__CKPT_MANIFEST ": the optimizer's hyper-parameters differ from the "
                 "model's (momentum %g, nesterov %d, weight_decay %g, betas %g/%g, eps %g, "
                 "clip_norm %g were saved); the model's apply from now on",
                 mf->dir, mf->momentum, mf->nesterov, mf->weight_decay, mf->beta1, mf->beta2,
                 mf->eps, mf->clip_norm);
        log_line(v, COLL_LOG_WARN, line);
    }
    return 0;
}

/* Reads this rank's parts, in its own layout, of every state array the checkpoint has. */
static int read_owned(const ddp__model_view *v, const ddp__ckpt_manifest *mf, unsigned flags,
                      char *msg, size_t cap)
{
    const char *names[DDP__CKPT_MAX_STATE];
    int nstate, src[DDP__CKPT_MAX_STATE];
    state_names(v, names, &nstate);
    if (flags & DDP_CKPT_PARAMS_ONLY)
        nstate = 1;
    for (int s = 0; s < nstate; s++) {
        src[s] = -1;
        for (int k = 0; k < mf->nstate; k++)
            if (!strcmp(mf->state[k], names[s]))
                src[s] = k;
        if (src[s] < 0 && v->rank == 0) {
            char line[PATH_MAX + 128];
            snprintf(line, sizeof line, "%s: holds no %s: it starts from zero", mf->dir, names[s]);
            log_line(v, COLL_LOG_WARN, line);
        }
    }
    reader rd = {.mf = mf, .shard = -1, .msg = msg, .cap = cap};
    ddp__ckpt_run *runs = NULL;
    size_t cap_runs = 0;
    int rc = -ENOMEM;
    rd.fds = malloc((size_t)mf->world * sizeof *rd.fds);
    rd.buf = malloc(mf->chunk_bytes ? mf->chunk_bytes : 1);
    if (!rd.fds || !rd.buf)
        goto out;
    for (int q = 0; q < mf->world; q++)
        rd.fds[q] = -1;
    rc = 0;
    const ddp__plan *pl = v->plan;
    for (int g = 0; g < pl->ngroups && rc == 0; g++) {
        size_t begin = pl->groups[g].offset + (size_t)v->rank * pl->groups[g].shard, n;
        size_t end = begin + pl->groups[g].shard;
        if ((rc = ddp__ckpt_map_range(mf, pl, begin, end, NULL, 0, &n)) < 0)
            break;
        if (n > cap_runs) {
            free(runs);
            cap_runs = 0;
            if (!(runs = malloc(n * sizeof *runs))) {
                rc = -ENOMEM;
                break;
            }
            cap_runs = n;
        }
        (void)ddp__ckpt_map_range(mf, pl, begin, end, runs, cap_runs, &n);
        for (int s = 0; s < nstate && rc == 0; s++) {
            if (src[s] < 0)
                continue;
            float *dst = owned_part(v, s, g);
            uint64_t base = (uint64_t)src[s] * mf->shard_total;
            for (size_t i = 0; i < n && rc == 0; i++)
                rc = read_range(&rd, runs[i].shard, 4 * (base + runs[i].src), 4 * runs[i].count,
                                dst + runs[i].dst);
        }
    }
out:
    if (rc == -ENOMEM && !msg[0])
        snprintf(msg, cap, "%s: out of memory", mf->dir);
    for (int q = 0; rd.fds && q < mf->world; q++)
        if (rd.fds[q] >= 0)
            close(rd.fds[q]);
    free(rd.fds);
    free(rd.buf);
    free(runs);
    return rc;
}

int ddp_checkpoint_load(ddp_model *m, const char *path, unsigned flags,
                        ddp_checkpoint_progress *progress, char **user_json)
{
    ddp__model_view v;
    int rc = ddp__model_view_host(m, &v, false);
    if (rc < 0)
        return rc;
    if (!path || (flags & ~DDP_CKPT_PARAMS_ONLY))
        return ddp__fail(m, -EINVAL,
                         "ddp_checkpoint_load: bad argument (path %s, flags %#x: a load takes "
                         "DDP_CKPT_PARAMS_ONLY)",
                         path ? path : "NULL", flags);
    ddp__ckpt_manifest mf = {0};
    char msg[MSG_BYTES] = "";
    char *user = NULL;
    int local = ddp__ckpt_manifest_read(path, &mf, msg, sizeof msg);
    if (local == 0)
        local = check_model(m, &v, &mf, flags, msg, sizeof msg);
    if ((rc = agree(m, &v, local, msg)) < 0)
        goto out;
    /* Every rank must load the same checkpoint: rank 0's step is the reference. */
    int64_t step0 = mf.step;
    if ((rc = ddp__host_coll(m, DDP__HOST_BROADCAST, &step0, &step0, 1, COLL_I64, COLL_SUM,
                             "checkpoint: comparing the steps")) < 0)
        goto out;
    local = 0;
    if (step0 != mf.step) {
        snprintf(msg, sizeof msg,
                 "%s is the checkpoint of step %" PRId64 ", rank 0's of step %" PRId64
                 ": every rank must load the same one",
                 path, mf.step, step0);
        local = -EINVAL;
    }
    if (local == 0 && mf.user_json && user_json && !(user = strdup(mf.user_json))) {
        snprintf(msg, sizeof msg, "ddp_checkpoint_load: out of memory");
        local = -ENOMEM;
    }
    if ((rc = agree(m, &v, local, msg)) < 0)
        goto out;

    /* From here on the model's state changes: a save's writer must have copied it. */
    ddp__ckpt_wait_copied(*v.ck);
    if ((rc = ddp__drop_units(m)) < 0)
        goto out;
    memset(v.param, 0, (v.stage == 3 ? v.plan->shard_total : v.plan->total) * sizeof(float));
    for (int k = 0; k < v.nopt; k++)
        memset(v.opt[k], 0, v.opt_elems * sizeof(float));
    local = read_owned(&v, &mf, flags, msg, sizeof msg);
    if ((rc = agree(m, &v, local, msg)) < 0)
        goto out;
    bool params_only = flags & DDP_CKPT_PARAMS_ONLY;
    *v.steps = params_only ? 0 : mf.step;
    *v.attempted = params_only ? 0 : mf.attempted;
    if ((rc = ddp__state_loaded(m)) < 0)
        goto out;
    if (progress)
        *progress = mf.progress;
    if (user_json) {
        *user_json = user;
        user = NULL;
    }
out:
    free(user);
    ddp__ckpt_manifest_free(&mf);
    return rc;
}
