/*
 * The checkpoint manifest's reader (ckpt.h gives the format): JSON through jansson, then every
 * key's type and the layout's consistency, so that what passes here can be used for reading
 * shards without further checks (no offset read from the file can point outside a shard or a
 * parameter). Errors are sentences naming the file and the key. The writer is in ckpt.c.
 *
 * Not here: reading or checking the shard files themselves (ckpt_verify.c, ckpt.c).
 */
#include "ckpt.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The reader's state: the file's path for messages, the caller's error buffer. */
typedef struct reader {
    char path[4096];
    char *err;
    size_t cap;
} reader;

static int bad(reader *r, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(reader *r, int rc, const char *fmt, ...)
{
    if (r->err && r->cap) {
        int n = snprintf(r->err, r->cap, "%s: ", r->path);
        if (n >= 0 && (size_t)n < r->cap) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(r->err + n, r->cap - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return rc;
}

/* obj[key] as a non-negative integer that fits in *out; `what` names it for messages. */
static int get_size(reader *r, json_t *obj, const char *key, const char *what, size_t *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v)
        return bad(r, -EPROTO, "%s%s: missing", what, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return bad(r, -EPROTO, "%s%s: not a non-negative integer", what, key);
    *out = (size_t)json_integer_value(v);
    return 0;
}

static int get_int(reader *r, json_t *obj, const char *key, const char *what, int64_t *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v)
        return bad(r, -EPROTO, "%s%s: missing", what, key);
    if (!json_is_integer(v))
        return bad(r, -EPROTO, "%s%s: not an integer", what, key);
    *out = json_integer_value(v);
    return 0;
}

static int get_float(reader *r, json_t *obj, const char *key, float *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v)
        return bad(r, -EPROTO, "optimizer.%s: missing", key);
    if (!json_is_number(v))
        return bad(r, -EPROTO, "optimizer.%s: not a number", key);
    *out = (float)json_number_value(v);
    return 0;
}

static const char *get_string(reader *r, json_t *obj, const char *key, const char *what, int *rc)
{
    json_t *v = json_object_get(obj, key);
    if (!json_is_string(v)) {
        *rc = bad(r, -EPROTO, "%s%s: %s", what, key, v ? "not a string" : "missing");
        return NULL;
    }
    return json_string_value(v);
}

static json_t *get_array(reader *r, json_t *obj, const char *key, int *rc)
{
    json_t *v = json_object_get(obj, key);
    if (!json_is_array(v)) {
        *rc = bad(r, -EPROTO, "%s: %s", key, v ? "not an array" : "missing");
        return NULL;
    }
    return v;
}

void ddp__ckpt_manifest_options(const ddp__ckpt_manifest *mf, ddp_options *o)
{
    ddp_options_init(o);
    o->optimizer = mf->optimizer;
    o->momentum = mf->momentum;
    o->nesterov = mf->nesterov;
    o->weight_decay = mf->weight_decay;
    o->beta1 = mf->beta1;
    o->beta2 = mf->beta2;
    o->eps = mf->eps;
    o->clip_norm = mf->clip_norm;
}

static int read_optimizer(reader *r, json_t *root, ddp__ckpt_manifest *mf)
{
    json_t *o = json_object_get(root, "optimizer");
    if (!json_is_object(o))
        return bad(r, -EPROTO, "optimizer: %s", o ? "not an object" : "missing");
    int rc = 0;
    const char *kind = get_string(r, o, "kind", "optimizer.", &rc);
    if (!kind)
        return rc;
    int id = ddp_optimizer_from_name(kind);
    if (id < 0)
        return bad(r, -EPROTO, "optimizer.kind: '%s' is no optimizer of libddp", kind);
    mf->optimizer = (ddp_optimizer)id;
    json_t *nest = json_object_get(o, "nesterov");
    if (!json_is_boolean(nest))
        return bad(r, -EPROTO, "optimizer.nesterov: %s", nest ? "not a boolean" : "missing");
    mf->nesterov = json_is_true(nest);
    if ((rc = get_float(r, o, "momentum", &mf->momentum)) < 0 ||
        (rc = get_float(r, o, "weight_decay", &mf->weight_decay)) < 0 ||
        (rc = get_float(r, o, "beta1", &mf->beta1)) < 0 ||
        (rc = get_float(r, o, "beta2", &mf->beta2)) < 0 ||
        (rc = get_float(r, o, "eps", &mf->eps)) < 0 ||
        (rc = get_float(r, o, "clip_norm", &mf->clip_norm)) < 0)
        return rc;

    /* The state arrays are the optimizer's, in this order. */
    ddp_options opts;
    ddp__ckpt_manifest_options(mf, &opts);
    const ddp__optimizer_def *def = ddp__optimizer(mf->optimizer);
    const char *want[DDP__CKPT_MAX_STATE] = {"param"};
    int nwant = 1 + ddp__optimizer_nstate(def, &opts);
    for (int i = 1; i < nwant; i++)
        want[i] = def->state[i - 1];
    json_t *st = get_array(r, root, "state", &rc);
    if (!st)
        return rc;
    if ((int)json_array_size(st) != nwant)
        return bad(r, -EPROTO, "state: %zu arrays, the optimizer keeps %d", json_array_size(st),
                   nwant);
    for (int i = 0; i < nwant; i++) {
        json_t *s = json_array_get(st, (size_t)i);
        if (!json_is_string(s) || strcmp(json_string_value(s), want[i]) != 0)
            return bad(r, -EPROTO, "state[%d]: expected \"%s\"", i, want[i]);
        snprintf(mf->state[i], sizeof mf->state[i], "%s", want[i]);
    }
    mf->nstate = nwant;
    return 0;
}

static int read_units(reader *r, json_t *root, ddp__ckpt_manifest *mf)
{
    int rc = 0;
    json_t *u = get_array(r, root, "units", &rc);
    if (!u)
        return rc;
    size_t n = json_array_size(u);
    if (n == 0 || n > INT32_MAX)
        return bad(r, -EPROTO, "units: empty");
    if (!(mf->units = calloc(n, sizeof *mf->units)))
        return bad(r, -ENOMEM, "out of memory");
    mf->nunits = (int)n;
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_array_get(u, i);
        if (!json_is_string(s))
            return bad(r, -EPROTO, "units[%zu]: not a string", i);
        if (!(mf->units[i] = strdup(json_string_value(s))))
            return bad(r, -ENOMEM, "out of memory");
    }
    return 0;
}

static int read_params(reader *r, json_t *root, ddp__ckpt_manifest *mf)
{
    int rc = 0;
    json_t *a = get_array(r, root, "params", &rc);
    if (!a)
        return rc;
    size_t n = json_array_size(a);
    if (n == 0 || n > INT32_MAX)
        return bad(r, -EPROTO, "params: empty");
    if (!(mf->params = calloc(n, sizeof *mf->params)))
        return bad(r, -ENOMEM, "out of memory");
    mf->nparams = (int)n;
    for (size_t i = 0; i < n; i++) {
        ddp__ckpt_param *p = &mf->params[i];
        json_t *o = json_array_get(a, i);
        char what[48];
        snprintf(what, sizeof what, "params[%zu].", i);
        if (!json_is_object(o))
            return bad(r, -EPROTO, "params[%zu]: not an object", i);
        const char *name = get_string(r, o, "name", what, &rc);
        if (!name)
            return rc;
        if (!(p->name = strdup(name)))
            return bad(r, -ENOMEM, "out of memory");
        const char *dtype = get_string(r, o, "dtype", what, &rc);
        if (!dtype)
            return rc;
        if (strcmp(dtype, "float32") != 0)
            return bad(r, -EPROTO, "%sdtype: '%s' (only float32 is written)", what, dtype);
        int64_t unit, group;
        if ((rc = get_int(r, o, "unit", what, &unit)) < 0 ||
            (rc = get_int(r, o, "group", what, &group)) < 0 ||
            (rc = get_size(r, o, "offset", what, &p->offset)) < 0 ||
            (rc = get_size(r, o, "count", what, &p->count)) < 0)
            return rc;
        if (unit < 0 || unit >= mf->nunits)
            return bad(r, -EPROTO, "%sunit: %lld is not one of the %d units", what,
                       (long long)unit, mf->nunits);
        if (i > 0 && unit < mf->params[i - 1].unit)
            return bad(r, -EPROTO, "%sunit: units must not decrease", what);
        p->unit = (int)unit;
        p->group = group < 0 || group > INT32_MAX ? -1 : (int)group; /* checked with groups */
        json_t *shape = json_object_get(o, "shape");
        if (!json_is_array(shape) || json_array_size(shape) == 0 ||
            json_array_size(shape) > DDP__CKPT_MAX_DIMS)
            return bad(r, -EPROTO, "%sshape: not an array of 1 to %d sizes", what,
                       DDP__CKPT_MAX_DIMS);
        p->ndim = (int)json_array_size(shape);
        size_t prod = 1;
        for (int d = 0; d < p->ndim; d++) {
            json_t *v = json_array_get(shape, (size_t)d);
            if (!json_is_integer(v) || json_integer_value(v) <= 0 ||
                json_integer_value(v) > ((int64_t)1 << 40))
                return bad(r, -EPROTO, "%sshape[%d]: not a positive size", what, d);
            p->shape[d] = json_integer_value(v);
            if (prod > ((size_t)1 << 40) / (size_t)p->shape[d])
                return bad(r, -EPROTO, "%sshape: too many elements", what);
            prod *= (size_t)p->shape[d];
        }
        if (prod != p->count)
            return bad(r, -EPROTO, "%sshape: the product is %zu, count says %zu", what, prod,
                       p->count);
        if (i > 0) {
            const ddp__ckpt_param *q = &mf->params[i - 1];
            if (p->offset < q->offset + q->count)
                return bad(r, -EPROTO, "%soffset: %zu overlaps %s (ends at %zu)", what,
                           p->offset, q->name, q->offset + q->count);
        }
    }
    return 0;
}

/* The saving plan: contiguous groups, padded to the world, owned parts laid end to end. */
static int read_groups(reader *r, json_t *root, ddp__ckpt_manifest *mf)
{
    int rc = 0;
    json_t *a = get_array(r, root, "groups", &rc);
    if (!a)
        return rc;
    size_t n = json_array_size(a);
    if (n == 0 || n > INT32_MAX)
        return bad(r, -EPROTO, "groups: empty");
    if (!(mf->groups = calloc(n, sizeof *mf->groups)))
        return bad(r, -ENOMEM, "out of memory");
    mf->ngroups = (int)n;
    size_t at = 0, shard_at = 0;
    for (size_t g = 0; g < n; g++) {
        ddp__ckpt_group *gr = &mf->groups[g];
        json_t *o = json_array_get(a, g);
        char what[48];
        snprintf(what, sizeof what, "groups[%zu].", g);
        if (!json_is_object(o))
            return bad(r, -EPROTO, "groups[%zu]: not an object", g);
        int64_t first, last;
        if ((rc = get_size(r, o, "offset", what, &gr->offset)) < 0 ||
            (rc = get_size(r, o, "count", what, &gr->count)) < 0 ||
            (rc = get_size(r, o, "padded", what, &gr->padded)) < 0 ||
            (rc = get_size(r, o, "shard", what, &gr->shard)) < 0 ||
            (rc = get_size(r, o, "shard_offset", what, &gr->shard_offset)) < 0 ||
            (rc = get_int(r, o, "first", what, &first)) < 0 ||
            (rc = get_int(r, o, "last", what, &last)) < 0)
            return rc;
        if (first < 0 || last < first || last >= mf->nparams)
            return bad(r, -EPROTO, "%sfirst, last: [%lld, %lld] is not a range of the %d "
                       "parameters", what, (long long)first, (long long)last, mf->nparams);
        gr->first = (int)first;
        gr->last = (int)last;
        if (gr->count == 0 || gr->count > gr->padded || gr->padded % (size_t)mf->world != 0 ||
            gr->padded - gr->count >= (size_t)mf->world ||
            gr->shard != gr->padded / (size_t)mf->world)
            return bad(r, -EPROTO, "%scount %zu, padded %zu, shard %zu do not split over %d ranks",
                       what, gr->count, gr->padded, gr->shard, mf->world);
        if (gr->offset != at || gr->shard_offset != shard_at)
            return bad(r, -EPROTO, "%soffset %zu, shard_offset %zu: expected %zu and %zu", what,
                       gr->offset, gr->shard_offset, at, shard_at);
        at += gr->padded;
        shard_at += gr->shard;
    }
    if ((rc = get_size(r, root, "total", "", &mf->total)) < 0 ||
        (rc = get_size(r, root, "shard_total", "", &mf->shard_total)) < 0)
        return rc;
    if (mf->total != at || mf->shard_total != shard_at)
        return bad(r, -EPROTO, "total %zu, shard_total %zu: the groups add up to %zu and %zu",
                   mf->total, mf->shard_total, at, shard_at);

    /* Each parameter inside the group that names it, and the groups' parameters consecutive. */
    for (int i = 0; i < mf->nparams; i++) {
        const ddp__ckpt_param *p = &mf->params[i];
        if (p->group < 0 || p->group >= mf->ngroups)
            return bad(r, -EPROTO, "params[%d].group: not one of the %d groups", i, mf->ngroups);
        const ddp__ckpt_group *gr = &mf->groups[p->group];
        if (i < gr->first || i > gr->last || p->offset < gr->offset ||
            p->offset + p->count > gr->offset + gr->count)
            return bad(r, -EPROTO, "params[%d] (%s): not inside groups[%d]", i, p->name,
                       p->group);
    }
    return 0;
}

static int read_shards(reader *r, json_t *root, ddp__ckpt_manifest *mf)
{
    int rc = 0;
    if ((rc = get_size(r, root, "chunk_bytes", "", &mf->chunk_bytes)) < 0)
        return rc;
    if (mf->chunk_bytes == 0 || mf->chunk_bytes % 4 != 0)
        return bad(r, -EPROTO, "chunk_bytes: %zu is not a positive multiple of 4",
                   mf->chunk_bytes);
    json_t *a = get_array(r, root, "shards", &rc);
    if (!a)
        return rc;
    if (json_array_size(a) != (size_t)mf->world)
        return bad(r, -EPROTO, "shards: %zu entries for a world of %d", json_array_size(a),
                   mf->world);
    if (!(mf->shards = calloc((size_t)mf->world, sizeof *mf->shards)))
        return bad(r, -ENOMEM, "out of memory");
    uint64_t bytes = (uint64_t)mf->nstate * mf->shard_total * sizeof(float);
    for (int i = 0; i < mf->world; i++) {
        ddp__ckpt_shard *s = &mf->shards[i];
        json_t *o = json_array_get(a, (size_t)i);
        char what[48], want[64];
        snprintf(what, sizeof what, "shards[%d].", i);
        if (!json_is_object(o))
            return bad(r, -EPROTO, "shards[%d]: not an object", i);
        const char *file = get_string(r, o, "file", what, &rc);
        if (!file)
            return rc;
        snprintf(want, sizeof want, DDP__CKPT_SHARD_FMT, i, mf->world);
        if (strcmp(file, want) != 0)
            return bad(r, -EPROTO, "%sfile: '%s', expected '%s'", what, file, want);
        if (!(s->file = strdup(file)))
            return bad(r, -ENOMEM, "out of memory");
        size_t b;
        int64_t crc;
        if ((rc = get_size(r, o, "bytes", what, &b)) < 0 ||
            (rc = get_int(r, o, "crc32c", what, &crc)) < 0)
            return rc;
        if (b != bytes)
            return bad(r, -EPROTO, "%sbytes: %zu, the layout needs %llu", what, b,
                       (unsigned long long)bytes);
        if (crc < 0 || crc > UINT32_MAX)
            return bad(r, -EPROTO, "%scrc32c: not a 32-bit value", what);
        s->bytes = b;
        s->crc32c = (uint32_t)crc;
        json_t *ch = json_object_get(o, "chunks");
        s->nchunks = (b + mf->chunk_bytes - 1) / mf->chunk_bytes;
        if (!json_is_array(ch) || json_array_size(ch) != s->nchunks)
            return bad(r, -EPROTO, "%schunks: expected an array of %zu CRCs", what, s->nchunks);
        if (s->nchunks && !(s->chunks = calloc(s->nchunks, sizeof *s->chunks)))
            return bad(r, -ENOMEM, "out of memory");
        for (size_t c = 0; c < s->nchunks; c++) {
            json_t *v = json_array_get(ch, c);
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) > UINT32_MAX)
                return bad(r, -EPROTO, "%schunks[%zu]: not a 32-bit value", what, c);
            s->chunks[c] = (uint32_t)json_integer_value(v);
        }
    }
    return 0;
}

static int read_progress(reader *r, json_t *root, ddp__ckpt_manifest *mf)
{
    json_t *o = json_object_get(root, "progress");
    if (!json_is_object(o))
        return bad(r, -EPROTO, "progress: %s", o ? "not an object" : "missing");
    int64_t seed;
    int rc;
    if ((rc = get_int(r, o, "epoch", "progress.", &mf->progress.epoch)) < 0 ||
        (rc = get_int(r, o, "position", "progress.", &mf->progress.position)) < 0 ||
        (rc = get_int(r, o, "seed", "progress.", &seed)) < 0)
        return rc;
    mf->progress.seed = (uint64_t)seed; /* written as the signed 64-bit pattern */
    json_t *u = json_object_get(root, "user");
    if (u) {
        if (!json_is_object(u))
            return bad(r, -EPROTO, "user: not an object");
        if (!(mf->user_json = json_dumps(u, JSON_COMPACT)))
            return bad(r, -ENOMEM, "out of memory");
    }
    return 0;
}

static int parse(reader *r, json_t *root, ddp__ckpt_manifest *mf)
{
    int rc = 0;
    if (!json_is_object(root))
        return bad(r, -EPROTO, "not a JSON object");
    const char *fmt = get_string(r, root, "format", "", &rc);
    if (!fmt)
        return rc;
    if (strcmp(fmt, DDP__CKPT_FORMAT) != 0)
        return bad(r, -EPROTO, "format: '%s', not '%s'", fmt, DDP__CKPT_FORMAT);
    int64_t version, world, stage;
    if ((rc = get_int(r, root, "version", "", &version)) < 0)
        return rc;
    if (version != DDP__CKPT_VERSION)
        return bad(r, -EPROTO, "version %lld: this build reads version %d", (long long)version,
                   DDP__CKPT_VERSION);
    mf->version = (int)version;
    if ((rc = get_int(r, root, "step", "", &mf->step)) < 0 ||
        (rc = get_int(r, root, "attempted", "", &mf->attempted)) < 0 ||
        (rc = get_int(r, root, "world_size", "", &world)) < 0 ||
        (rc = get_int(r, root, "zero_stage", "", &stage)) < 0)
        return rc;
    if (mf->step < 0 || mf->attempted < mf->step)
        return bad(r, -EPROTO, "step %lld, attempted %lld: not 0 <= step <= attempted",
                   (long long)mf->step, (long long)mf->attempted);
    if (world < 1 || world > 1 << 20)
        return bad(r, -EPROTO, "world_size: %lld", (long long)world);
    if (stage < 0 || stage > 3)
        return bad(r, -EPROTO, "zero_stage: %lld is not 0 to 3", (long long)stage);
    mf->world = (int)world;
    mf->stage = (int)stage;
    const char *dtype = get_string(r, root, "dtype", "", &rc);
    if (!dtype)
        return rc;
    if (strcmp(dtype, "float32") != 0)
        return bad(r, -EPROTO, "dtype: '%s' (only float32 is written)", dtype);
    if ((rc = read_optimizer(r, root, mf)) < 0 || (rc = read_units(r, root, mf)) < 0 ||
        (rc = read_params(r, root, mf)) < 0 || (rc = read_groups(r, root, mf)) < 0 ||
        (rc = read_shards(r, root, mf)) < 0 || (rc = read_progress(r, root, mf)) < 0)
        return rc;
    return 0;
}

int ddp__ckpt_manifest_read(const char *dir, ddp__ckpt_manifest *out, char *err, size_t cap)
{
    reader r = {.err = err, .cap = cap};
    if (err && cap)
        err[0] = '\0';
    if (!dir || !out)
        return -EINVAL;
    if ((size_t)snprintf(r.path, sizeof r.path, "%s/%s", dir, DDP__CKPT_MANIFEST) >=
        sizeof r.path)
        return bad(&r, -ENAMETOOLONG, "path too long");

    FILE *f = fopen(r.path, "rb");
    if (!f) {
        int e = errno;
        return bad(&r, -e, "%s", e == ENOENT ? "no manifest (the checkpoint is incomplete)"
                                             : strerror(e));
    }
    json_error_t je;
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &je);
    int rerr = ferror(f);
    fclose(f);
    if (rerr) {
        json_decref(root);
        return bad(&r, -EIO, "read error");
    }
    if (!root)
        return bad(&r, -EPROTO, "not valid JSON: line %d column %d: %s", je.line, je.column,
                   je.text);

    ddp__ckpt_manifest mf = {0};
    int rc = -ENOMEM;
    if (!(mf.dir = strdup(dir)))
        bad(&r, rc, "out of memory");
    else
        rc = parse(&r, root, &mf);
    json_decref(root);
    if (rc < 0) {
        ddp__ckpt_manifest_free(&mf);
        return rc;
    }
    *out = mf;
    return 0;
}

void ddp__ckpt_manifest_free(ddp__ckpt_manifest *mf)
{
    if (!mf)
        return;
    free(mf->dir);
    for (int i = 0; mf->units && i < mf->nunits; i++)
        free(mf->units[i]);
    free(mf->units);
    for (int i = 0; mf->params && i < mf->nparams; i++)
        free(mf->params[i].name);
    free(mf->params);
    free(mf->groups);
    for (int i = 0; mf->shards && i < mf->world; i++) {
        free(mf->shards[i].file);
        free(mf->shards[i].chunks);
    }
    free(mf->shards);
    free(mf->user_json);
    memset(mf, 0, sizeof *mf);
}
