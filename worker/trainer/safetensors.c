/*
 * The safetensors reader and writer (safetensors.h). The writer streams the header and the
 * tensors through stdio; the reader takes the whole file in memory and trusts nothing in it:
 * every length, offset and shape is checked against the file's size with overflow-safe
 * arithmetic before a tensor's data pointer is formed, so a malformed or hostile file gives an
 * error sentence, never a read out of bounds.
 *
 * Not here: memory-mapping (files are read whole), dtype conversion (callers check the dtype
 * they need) and big-endian hosts.
 */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "errbuf.h"

static _Thread_local errbuf last_error;

const char *st_last_error(void)
{
    return last_error.msg;
}

#define fail(...) errbuf_set(&last_error, __VA_ARGS__)

static const struct {
    const char *name;
    size_t size;
} dtypes[] = {
    {"F64", 8}, {"F32", 4}, {"F16", 2},  {"BF16", 2},    {"I64", 8},
    {"I32", 4}, {"I16", 2}, {"I8", 1},   {"U64", 8},     {"U32", 4},
    {"U16", 2}, {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
};

size_t st_dtype_size(const char *dtype)
{
    for (size_t i = 0; dtype && i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (!strcmp(dtype, dtypes[i].name))
            return dtypes[i].size;
    return 0;
}

/* The bytes a tensor of this dtype size and shape holds; 0 and *ok = 0 on overflow. */
static uint64_t shape_bytes(size_t esize, int ndim, const int64_t *shape, int *ok)
{
    uint64_t n = esize;
    *ok = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || (shape[d] > 0 && n > UINT64_MAX / (uint64_t)shape[d])) {
            *ok = 0;
            return 0;
        }
        n *= (uint64_t)shape[d];
    }
    return n;
}

const char *st_shape_str(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t k = (size_t)snprintf(buf, cap, "(");
    for (int d = 0; d < ndim && k < cap; d++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (k < cap)
        snprintf(buf + k, cap - k, ")");
    return buf;
}

/* ------------------------------------------------------------------------------------------ */
/* Writing                                                                                     */
/* ------------------------------------------------------------------------------------------ */

int st_write(const char *path, const st_tensor *ts, int n, const char *const *meta)
{
    json_t *root = json_object(), *md = NULL;
    char *hdr = NULL;
    FILE *f = NULL;
    int rc = -ENOMEM;
    uint64_t off = 0;
    if (!root)
        goto out;
    for (int i = 0; i < n; i++) {
        size_t esize = st_dtype_size(ts[i].dtype);
        int ok = 0;
        uint64_t need = esize ? shape_bytes(esize, ts[i].ndim, ts[i].shape, &ok) : 0;
        if (!esize || !ok || need != ts[i].nbytes || ts[i].ndim < 0 || ts[i].ndim > ST_MAX_DIMS) {
            rc = fail(-EINVAL, "%s: tensor '%s': bad dtype '%s', shape or size (%zu bytes)", path,
                      ts[i].name, ts[i].dtype ? ts[i].dtype : "NULL", ts[i].nbytes);
            goto out;
        }
        json_t *shape = json_array();
        for (int d = 0; shape && d < ts[i].ndim; d++)
            json_array_append_new(shape, json_integer(ts[i].shape[d]));
        if (!shape || json_object_set_new(root, ts[i].name,
                                          json_pack("{s:s, s:o, s:[I, I]}", "dtype", ts[i].dtype,
                                                    "shape", shape, "data_offsets", (json_int_t)off,
                                                    (json_int_t)(off + ts[i].nbytes))) < 0) {
            rc = fail(-ENOMEM, "%s: cannot build the header", path);
            goto out;
        }
        off += ts[i].nbytes;
    }
    if (meta && meta[0]) {
        if (!(md = json_object()))
            goto out;
        for (int i = 0; meta[i]; i += 2)
            json_object_set_new(md, meta[i], json_string(meta[i + 1]));
        json_object_set_new(root, "__metadata__", md);
    }
    if (!(hdr = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS))) {
        rc = fail(-ENOMEM, "%s: cannot build the header", path);
        goto out;
    }
    size_t hlen = strlen(hdr), padded = (hlen + 7) / 8 * 8;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    if (!(f = fopen(path, "wb"))) {
        rc = fail(-errno, "%s: cannot create: %s", path, strerror(errno));
        goto out;
    }
    int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(hdr, 1, hlen, f) == hlen;
    for (size_t i = hlen; ok && i < padded; i++)
        ok = fputc(' ', f) != EOF;
    for (int i = 0; ok && i < n; i++)
        ok = fwrite(ts[i].data, 1, ts[i].nbytes, f) == ts[i].nbytes;
    int werr = ok ? 0 : errno;
    if (fclose(f) != 0 && ok) {
        ok = 0;
        werr = errno;
    }
    f = NULL;
    if (!ok) {
        rc = fail(werr ? -werr : -EIO, "%s: cannot write: %s", path, strerror(werr ? werr : EIO));
        goto out;
    }
    rc = 0;
out:
    if (f)
        fclose(f);
    free(hdr);
    json_decref(root);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Reading                                                                                     */
/* ------------------------------------------------------------------------------------------ */

void st_file_free(st_file *f)
{
    if (!f)
        return;
    for (int i = 0; f->tensors && i < f->ntensors; i++) {
        free((char *)f->tensors[i].name);
        free((char *)f->tensors[i].dtype);
    }
    free(f->tensors);
    for (int i = 0; f->meta && i < 2 * f->nmeta; i++)
        free(f->meta[i]);
    free(f->meta);
    free(f->buf);
    memset(f, 0, sizeof *f);
}

/* A tensor's [begin, end) before sorting. */
typedef struct span {
    uint64_t begin, end;
    int index;
} span;

static int by_begin(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : x->index - y->index;
}

/* Reads header entry `name` (a tensor) into *t (name and dtype strdup'ed) and *sp. */
static int parse_tensor(const char *what, const char *name, json_t *v, uint64_t data_len,
                        st_tensor *t, span *sp)
{
    char sbuf[160];
    if (!json_is_object(v))
        return fail(-EPROTO, "%s: tensor '%s': not a JSON object", what, name);
    json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
           *offs = json_object_get(v, "data_offsets");
    if (!json_is_string(dt))
        return fail(-EPROTO, "%s: tensor '%s': \"dtype\" missing or not a string", what, name);
    size_t esize = st_dtype_size(json_string_value(dt));
    if (!esize)
        return fail(-EPROTO, "%s: tensor '%s': unknown dtype '%s'", what, name,
                    json_string_value(dt));
    if (!json_is_array(shape) || json_array_size(shape) > ST_MAX_DIMS)
        return fail(-EPROTO,
                    "%s: tensor '%s': \"shape\" missing, not an array or of more than %d "
                    "dimensions",
                    what, name, ST_MAX_DIMS);
    t->ndim = (int)json_array_size(shape);
    for (int d = 0; d < t->ndim; d++) {
        json_t *e = json_array_get(shape, (size_t)d);
        if (!json_is_integer(e) || json_integer_value(e) < 0)
            return fail(-EPROTO, "%s: tensor '%s': shape[%d] is not a non-negative integer", what,
                        name, d);
        t->shape[d] = json_integer_value(e);
    }
    if (!json_is_array(offs) || json_array_size(offs) != 2 ||
        !json_is_integer(json_array_get(offs, 0)) || !json_is_integer(json_array_get(offs, 1)))
        return fail(-EPROTO, "%s: tensor '%s': \"data_offsets\" is not two integers", what, name);
    json_int_t b = json_integer_value(json_array_get(offs, 0)),
               e = json_integer_value(json_array_get(offs, 1));
    if (b < 0 || e < b || (uint64_t)e > data_len)
        return fail(-EPROTO,
                    "%s: tensor '%s': data_offsets [%" JSON_INTEGER_FORMAT ", %" JSON_INTEGER_FORMAT
                    ") out of range (the data are %" PRIu64 " bytes)",
                    what, name, b, e, data_len);
    int ok;
    uint64_t need = shape_bytes(esize, t->ndim, t->shape, &ok);
    if (!ok || need != (uint64_t)(e - b))
        return fail(-EPROTO,
                    "%s: tensor '%s': data_offsets [%" JSON_INTEGER_FORMAT ", %" JSON_INTEGER_FORMAT
                    ") hold %" PRIu64 " bytes, %s %s needs %s%" PRIu64,
                    what, name, b, e, (uint64_t)(e - b), json_string_value(dt),
                    st_shape_str(sbuf, sizeof sbuf, t->ndim, t->shape), ok ? "" : "more than ",
                    ok ? need : UINT64_MAX);
    if (!(t->name = strdup(name)) || !(t->dtype = strdup(json_string_value(dt))))
        return fail(-ENOMEM, "%s: out of memory", what);
    t->nbytes = (size_t)(e - b);
    sp->begin = (uint64_t)b;
    sp->end = (uint64_t)e;
    return 0;
}

static int parse_meta(const char *what, json_t *v, st_file *f)
{
    if (!json_is_object(v))
        return fail(-EPROTO, "%s: \"__metadata__\" is not a JSON object", what);
    f->meta = calloc(2 * json_object_size(v) + 1, sizeof(char *));
    if (!f->meta)
        return fail(-ENOMEM, "%s: out of memory", what);
    for (void *it = json_object_iter(v); it; it = json_object_iter_next(v, it)) {
        const char *k = json_object_iter_key(it);
        json_t *s = json_object_iter_value(it);
        if (!json_is_string(s))
            return fail(-EPROTO, "%s: __metadata__ \"%s\" is not a string", what, k);
        f->meta[2 * f->nmeta] = strdup(k);
        f->meta[2 * f->nmeta + 1] = strdup(json_string_value(s));
        f->nmeta++;
        if (!f->meta[2 * f->nmeta - 2] || !f->meta[2 * f->nmeta - 1])
            return fail(-ENOMEM, "%s: out of memory", what);
    }
    return 0;
}

int st_parse(void *buf, size_t len, const char *what, st_file *out)
{
    st_file f = {0};
    json_t *root = NULL;
    span *spans = NULL;
    st_tensor *sorted = NULL;
    int rc;
    f.buf = buf;
    if (len < 8) {
        rc = fail(-EPROTO, "%s: %zu bytes: too short for the 8-byte header length", what, len);
        goto out;
    }
    const unsigned char *p = buf;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | p[i];
    if (hlen > len - 8 || hlen > ST_MAX_HEADER_BYTES) {
        rc = fail(-EPROTO, "%s: header length %" PRIu64 " is beyond %s (%zu bytes)", what, hlen,
                  hlen > ST_MAX_HEADER_BYTES ? "the format's limit of 100 MiB" : "the file", len);
        goto out;
    }
    if (hlen == 0 || p[8] != '{') {
        rc = fail(-EPROTO, "%s: the header does not start with '{'", what);
        goto out;
    }
    json_error_t je;
    root = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root || !json_is_object(root)) {
        rc = fail(-EPROTO, "%s: the header is not a JSON object: %s (at byte %d of the header)",
                  what, root ? "another JSON value" : je.text, root ? 0 : je.position);
        goto out;
    }
    uint64_t data_len = len - 8 - hlen;
    size_t nkeys = json_object_size(root);
    f.tensors = calloc(nkeys + 1, sizeof *f.tensors);
    spans = calloc(nkeys + 1, sizeof *spans);
    if (!f.tensors || !spans) {
        rc = fail(-ENOMEM, "%s: out of memory", what);
        goto out;
    }
    for (void *it = json_object_iter(root); it; it = json_object_iter_next(root, it)) {
        const char *key = json_object_iter_key(it);
        json_t *v = json_object_iter_value(it);
        if (!strcmp(key, "__metadata__")) {
            if ((rc = parse_meta(what, v, &f)) < 0)
                goto out;
            continue;
        }
        spans[f.ntensors].index = f.ntensors;
        rc = parse_tensor(what, key, v, data_len, &f.tensors[f.ntensors], &spans[f.ntensors]);
        f.ntensors++; /* counted even on failure, so that st_file_free() frees its strings */
        if (rc < 0)
            goto out;
    }
    /* The tensors tile the data exactly: sorted by offset, each begins where the last ended. */
    qsort(spans, (size_t)f.ntensors, sizeof *spans, by_begin);
    uint64_t at = 0;
    for (int i = 0; i < f.ntensors; i++) {
        const st_tensor *t = &f.tensors[spans[i].index];
        if (spans[i].begin != at) {
            rc = fail(-EPROTO,
                      "%s: tensor '%s' begins at data byte %" PRIu64 ", expected %" PRIu64
                      " (tensors must tile the data without gaps or overlaps)",
                      what, t->name, spans[i].begin, at);
            goto out;
        }
        at = spans[i].end;
    }
    if (at != data_len) {
        rc = fail(-EPROTO,
                  "%s: the tensors cover %" PRIu64 " bytes of data, the file holds %" PRIu64, what,
                  at, data_len);
        goto out;
    }
    if (!(sorted = calloc((size_t)f.ntensors + 1, sizeof *sorted))) {
        rc = fail(-ENOMEM, "%s: out of memory", what);
        goto out;
    }
    const unsigned char *data = p + 8 + hlen;
    for (int i = 0; i < f.ntensors; i++) {
        sorted[i] = f.tensors[spans[i].index];
        sorted[i].data = data + spans[i].begin;
    }
    free(f.tensors);
    f.tensors = sorted;
    *out = f;
    rc = 0;
out:
    free(spans);
    json_decref(root);
    if (rc < 0)
        st_file_free(&f);
    return rc;
}

int st_read(const char *path, st_file *out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fail(-errno, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    char *buf = NULL;
    int rc;
    if (fstat(fd, &st) < 0) {
        rc = fail(-errno, "%s: cannot stat: %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = fail(-EINVAL, "%s: not a regular file", path);
        goto out;
    }
    size_t len = (size_t)st.st_size;
    if (!(buf = malloc(len + 1))) {
        rc = fail(-ENOMEM, "%s: out of memory for %zu bytes", path, len);
        goto out;
    }
    for (size_t got = 0; got < len;) {
        ssize_t k = read(fd, buf + got, len - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            rc = fail(k < 0 ? -errno : -EIO, "%s: cannot read: %s", path,
                      k < 0 ? strerror(errno) : "the file shrank while read");
            goto out;
        }
        got += (size_t)k;
    }
    rc = st_parse(buf, len, path, out);
    buf = NULL; /* st_parse() owns it now */
out:
    free(buf);
    close(fd);
    return rc;
}
