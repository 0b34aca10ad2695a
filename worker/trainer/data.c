/*
 * ddp-train's data: IDX files through zlib, text files cut into byte windows, the distributed
 * sampler, and the loader thread.
 *
 * IDX reading trusts nothing in the file: the magic number, every size and the exact length of
 * the data are checked before anything is used, allocations are bounded by DATA_MAX_BYTES, and
 * every failure leaves a sentence that starts with the file's path. zlib's gzread reads gzip
 * files and, transparently, plain ones, so one path serves both.
 *
 * Text is read whole, file by file, each split at its fixed cut (data.h) into one growing
 * stream per split, bounded by DATA_MAX_BYTES; only then is it copied into windows, so a
 * failure leaves nothing behind. It is not decoded: bytes are the tokens.
 *
 * The sampler is pure arithmetic on a permutation (see data.h for the batch layout and the
 * drop-last rule); it neither reads files nor allocates after data_sampler_init().
 *
 * The loader is a single producer thread and a single consumer with two slots. Slot j holds
 * the batches i with i % 2 == j. Invariant, under the mutex: full[j] is set from the moment
 * the producer has finished gathering into slot j until the consumer hands that batch back
 * (by asking for the next one); the producer writes into a slot only while it is not full, and
 * the consumer reads a slot only while it is full, so neither touches the other's buffer and
 * the gathering itself runs without the lock. The thread never fails: everything it needs is
 * allocated by data_loader_create().
 */
#include "data.h"

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "errbuf.h"
#include "rng.h"

/* The largest IDX payload accepted: Fashion-MNIST's training images are 47 MB. */
#define DATA_MAX_BYTES (1u << 30)

/* The sampler's generator stream for epoch e: 2^32 + e, apart from mlp's per-parameter ones. */
#define EPOCH_STREAM(e) ((1ull << 32) + (uint64_t)(e))

static _Thread_local errbuf last_error;

const char *data_last_error(void)
{
    return last_error.msg;
}

#define fail(...) errbuf_set(&last_error, __VA_ARGS__)

/* ------------------------------------------------------------------------------------------ */
/* IDX files                                                                                   */
/* ------------------------------------------------------------------------------------------ */

/*
 * Reads up to n bytes. Returns the count read (short only at the end of the data), or -EPROTO
 * with the sentence set when zlib reports an error (a corrupt or truncated gzip stream: zlib
 * returns what it could decompress, then says Z_BUF_ERROR).
 */
static long read_upto(gzFile f, const char *path, uint8_t *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        size_t chunk = n - got > (1u << 24) ? (1u << 24) : n - got;
        int r = gzread(f, buf + got, (unsigned)chunk);
        if (r < 0)
            break;
        got += (size_t)r;
        if (r == 0 || (size_t)r < chunk)
            break;
    }
    int zerr;
    const char *msg = gzerror(f, &zerr);
    if (zerr == Z_BUF_ERROR)
        return fail(-EPROTO, "%s: truncated: the gzip stream ends early (%s)", path, msg);
    if (zerr != Z_OK)
        return fail(-EPROTO, "%s: cannot decompress: %s", path,
                    zerr == Z_ERRNO ? strerror(errno) : msg);
    return (long)got;
}

/* What a file that is not a regular one is, for the error sentence. */
static const char *file_kind(mode_t mode)
{
    return S_ISDIR(mode)    ? "directory"
           : S_ISFIFO(mode) ? "FIFO"
           : S_ISSOCK(mode) ? "socket"
           : S_ISCHR(mode)  ? "character device"
           : S_ISBLK(mode)  ? "block device"
                            : "special file";
}

/*
 * Opens `path` for reading if it is a regular file (a symbolic link to one is). Returns the
 * descriptor (the caller closes it), with the file's size in *size when size is not NULL; or
 * -errno from open/fstat, or -EINVAL for another kind of file ("PATH: not a regular file (a
 * FIFO)"), with the sentence set.
 */
static int open_regular(const char *path, off_t *size)
{
    /* Non-blocking, so that opening a FIFO does not wait for a writer; a regular file, the
     * only kind accepted, ignores the flag. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return fail(-errno, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        return fail(-e, "%s: cannot open: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return fail(-EINVAL, "%s: not a regular file (a %s)", path, file_kind(st.st_mode));
    }
    if (size)
        *size = st.st_size;
    return fd;
}

int data_idx_read(const char *path, int ndim, int *dims, uint8_t **data)
{
    if (!path || ndim < 1 || ndim > 3 || !dims || !data)
        return fail(-EINVAL, "data_idx_read: bad arguments");
    uint8_t *buf = NULL;
    int rc = 0, fd = open_regular(path, NULL);
    if (fd < 0)
        return fd;
    errno = 0;
    gzFile f = gzdopen(fd, "rb");
    if (!f) {
        int e = errno ? errno : ENOMEM;
        close(fd);
        return fail(-e, "%s: cannot open: %s", path, strerror(e));
    }

    /* Magic: 0x00 0x00, type 0x08 (unsigned byte), the number of dimensions. */
    uint8_t head[4 + 4 * 3];
    size_t hlen = 4 + 4 * (size_t)ndim;
    long got = read_upto(f, path, head, hlen);
    if (got < 0) {
        rc = (int)got;
        goto out;
    }
    if (got >= 4 && (head[0] || head[1] || head[2] != 0x08 || head[3] != ndim)) {
        rc = fail(-EPROTO,
                  "%s: not an IDX file of bytes with %d dimension%s: magic number "
                  "0x%02x%02x%02x%02x, expected 0x000008%02x",
                  path, ndim, ndim == 1 ? "" : "s", head[0], head[1], head[2], head[3], ndim);
        goto out;
    }
    if ((size_t)got < hlen) {
        rc = fail(-EPROTO, "%s: truncated: %ld bytes, shorter than an IDX header (%zu)", path, got,
                  hlen);
        goto out;
    }
    size_t total = 1;
    int d[3];
    for (int i = 0; i < ndim; i++) {
        const uint8_t *p = head + 4 + 4 * i;
        uint32_t v = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
        if (v == 0 || v > DATA_MAX_BYTES || total * v > DATA_MAX_BYTES) {
            rc = fail(-EPROTO, "%s: implausible size %u in dimension %d of the header", path, v, i);
            goto out;
        }
        d[i] = (int)v;
        total *= v;
    }

    buf = malloc(total);
    if (!buf) {
        rc = fail(-ENOMEM, "%s: out of memory for %zu bytes", path, total);
        goto out;
    }
    got = read_upto(f, path, buf, total);
    if (got < 0) {
        rc = (int)got;
        goto out;
    }
    if ((size_t)got < total) {
        rc =
            fail(-EPROTO, "%s: truncated: the header announces %zu bytes of data, the file has %ld",
                 path, total, got);
        goto out;
    }
    uint8_t extra;
    got = read_upto(f, path, &extra, 1);
    if (got < 0) {
        rc = (int)got;
        goto out;
    }
    if (got > 0) {
        rc = fail(-EPROTO, "%s: longer than its header says (more than %zu bytes of data)", path,
                  total);
        goto out;
    }
    for (int i = 0; i < ndim; i++)
        dims[i] = d[i];
    *data = buf;
    buf = NULL;
out:
    free(buf);
    gzclose(f);
    return rc;
}

/* dir/name.gz if that file exists, else dir/name. */
static int data_path(char *out, size_t cap, const char *dir, const char *split, const char *what)
{
    int n = snprintf(out, cap, "%s/%s-%s.gz", dir, split, what);
    if (n < 0 || (size_t)n >= cap)
        return fail(-ENAMETOOLONG, "%s: the data directory's name is too long", dir);
    if (access(out, F_OK) != 0)
        out[n - 3] = '\0';
    return 0;
}

void data_set_free(data_set *ds)
{
    if (!ds)
        return;
    free(ds->x);
    free(ds->y);
    free(ds->tok);
    memset(ds, 0, sizeof *ds);
}

int data_load(const char *dir, const char *split, data_set *out)
{
    if (!split || !out)
        return fail(-EINVAL, "data_load: bad arguments");
    if (!dir)
        dir = DATA_DEFAULT_DIR;
    char ipath[4096], lpath[4096];
    int rc;
    if ((rc = data_path(ipath, sizeof ipath, dir, split, "images-idx3-ubyte")) < 0 ||
        (rc = data_path(lpath, sizeof lpath, dir, split, "labels-idx1-ubyte")) < 0)
        return rc;

    uint8_t *pixels = NULL, *labels = NULL;
    float *x = NULL;
    int idims[3], ldims[1];
    if ((rc = data_idx_read(ipath, 3, idims, &pixels)) < 0 ||
        (rc = data_idx_read(lpath, 1, ldims, &labels)) < 0)
        goto out;
    if (idims[0] != ldims[0]) {
        rc = fail(-EPROTO, "%s holds %d images but %s holds %d labels", ipath, idims[0], lpath,
                  ldims[0]);
        goto out;
    }
    int n = idims[0], dim = idims[1] * idims[2];
    for (int i = 0; i < n; i++) {
        if (labels[i] >= 10) {
            rc = fail(-EPROTO, "%s: label %d of sample %d is not in 0..9", lpath, labels[i], i);
            goto out;
        }
    }
    x = malloc(sizeof(float) * (size_t)n * dim);
    if (!x) {
        rc = fail(-ENOMEM, "%s: out of memory for %d images", ipath, n);
        goto out;
    }
    for (size_t i = 0; i < (size_t)n * dim; i++)
        x[i] = data_normalize(pixels[i]);
    *out = (data_set){.n = n, .rows = idims[1], .cols = idims[2], .dim = dim, .x = x, .y = labels};
    x = NULL;
    labels = NULL;
out:
    free(pixels);
    free(labels);
    free(x);
    return rc;
}

void data_pixels(const data_set *ds, uint8_t *out)
{
    for (size_t i = 0; i < (size_t)ds->n * ds->dim; i++) {
        /* The normalisation's rounding (a few ulp of x) is far below the 1/255 step. */
        float p = (ds->x[i] * DATA_STD + DATA_MEAN) * 255.0f;
        out[i] = (uint8_t)(p <= 0 ? 0 : p >= 255 ? 255 : lrintf(p));
    }
}

void data_gather(const data_set *ds, const int32_t *idx, int count, float *x, uint8_t *y)
{
    size_t row = sizeof(float) * (size_t)ds->dim;
    for (int i = 0; i < count; i++) {
        memcpy(x + (size_t)i * ds->dim, ds->x + (size_t)idx[i] * ds->dim, row); /* (dim) */
        y[i] = ds->y[idx[i]];
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Text                                                                                        */
/* ------------------------------------------------------------------------------------------ */

/* A growing byte stream: one split's text, all files in order. */
typedef struct text_buf {
    uint8_t *p;
    size_t len, cap;
    int files; /* files that contributed (for the error sentence) */
} text_buf;

/*
 * Where a file of len bytes is cut into training text [0, cut) and validation text [cut, len):
 * the start of the first record (a line after a line holding only "%", fortune's separator)
 * at or after 95% of the bytes, else 95% (data.h).
 */
static size_t text_cut(const uint8_t *p, size_t len)
{
    size_t at = len / 20 * 19 + len % 20 * 19 / 20; /* floor(len * 19 / 20) without overflow */
    for (size_t q = at > 2 ? at : 2; q < len; q++)
        if (p[q - 1] == '\n' && p[q - 2] == '%' && (q == 2 || p[q - 3] == '\n'))
            return q;
    return at;
}

/* Reads the regular file `path` and appends its part of split `test` (0: training text, 1:
 * validation text) to *tb. Returns 0 or a negative code (sentence set). */
static int text_append(const char *path, int test, text_buf *tb)
{
    off_t size;
    int fd = open_regular(path, &size), rc = 0;
    if (fd < 0)
        return fd;
    size_t len = 0, cap = (size_t)size + 1; /* one more: a file that grew is read to its end */
    uint8_t *buf = (uint64_t)size < DATA_MAX_BYTES - tb->len ? malloc(cap) : NULL;
    if (!buf) {
        rc = (uint64_t)size < DATA_MAX_BYTES - tb->len
                 ? fail(-ENOMEM, "%s: out of memory", path)
                 : fail(-EPROTO, "%s: the text is more than %u bytes in all", path, DATA_MAX_BYTES);
        goto out;
    }
    for (;;) {
        if (len == cap) { /* the file grew while it was read */
            uint8_t *b = cap < DATA_MAX_BYTES ? realloc(buf, cap *= 2) : NULL;
            if (!b) {
                rc = fail(-ENOMEM, "%s: out of memory", path);
                goto out;
            }
            buf = b;
        }
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = fail(-EIO, "%s: cannot read: %s", path, strerror(errno));
            goto out;
        }
        if (r == 0)
            break;
        len += (size_t)r;
    }
    size_t cut = text_cut(buf, len), lo = test ? cut : 0, hi = test ? len : cut;
    if (tb->len + (hi - lo) > DATA_MAX_BYTES) {
        rc = fail(-EPROTO, "%s: the text is more than %u bytes in all", path, DATA_MAX_BYTES);
        goto out;
    }
    if (tb->len + (hi - lo) > tb->cap) {
        size_t ncap = tb->cap ? tb->cap : 1 << 16;
        while (ncap < tb->len + (hi - lo))
            ncap *= 2;
        uint8_t *p = realloc(tb->p, ncap);
        if (!p) {
            rc = fail(-ENOMEM, "%s: out of memory", path);
            goto out;
        }
        tb->p = p;
        tb->cap = ncap;
    }
    if (hi > lo)
        memcpy(tb->p + tb->len, buf + lo, hi - lo);
    tb->len += hi - lo;
    tb->files++;
out:
    free(buf);
    close(fd);
    return rc;
}

/* A directory's files: not hidden, not fortune's index (.dat) or UTF-8 link (.u8) files. */
static int text_dir_filter(const struct dirent *d)
{
    size_t n = strlen(d->d_name);
    return d->d_name[0] != '.' && !(n >= 4 && !strcmp(d->d_name + n - 4, ".dat")) &&
           !(n >= 3 && !strcmp(d->d_name + n - 3, ".u8"));
}

/* Byte order, the same in every locale (alphasort follows LC_COLLATE). */
static int text_dir_order(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

/* Appends split `test`'s part of every regular file of directory `dir` (data.h), in name
 * order; other entries (subdirectories) are skipped. Returns 0 or a negative code. */
static int text_dir(const char *dir, int test, text_buf *tb)
{
    struct dirent **names;
    int n = scandir(dir, &names, text_dir_filter, text_dir_order), rc = 0;
    if (n < 0)
        return fail(-errno, "%s: cannot list the directory: %s", dir, strerror(errno));
    for (int i = 0; i < n; i++) {
        char path[4096];
        struct stat st;
        int k = snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
        if (rc == 0 && (k < 0 || (size_t)k >= sizeof path))
            rc = fail(-ENAMETOOLONG, "%s/%s: the name is too long", dir, names[i]->d_name);
        else if (rc == 0 && stat(path, &st) == 0 && S_ISREG(st.st_mode))
            rc = text_append(path, test, tb);
        free(names[i]);
    }
    free(names);
    return rc;
}

int data_load_text(const char *const *paths, int npaths, int seq, const char *split, data_set *out)
{
    if (!out || npaths < 0 || (npaths > 0 && !paths) || !split)
        return fail(-EINVAL, "data_load_text: bad arguments");
    if (seq < 1 || seq > 65536)
        return fail(-EINVAL, "the context length %d is not in 1..65536", seq);
    int test = !strcmp(split, "test");
    if (!test && strcmp(split, "train"))
        return fail(-EINVAL, "data_load_text: no split \"%s\" (train or test)", split);
    const char *fallback = DATA_TEXT_DEFAULT_DIR;
    if (npaths == 0) {
        paths = &fallback;
        npaths = 1;
    }
    text_buf tb = {0};
    uint8_t *tok = NULL;
    int rc = 0;
    for (int i = 0; i < npaths && rc == 0; i++) {
        struct stat st;
        if (stat(paths[i], &st) < 0)
            rc = fail(-errno, "%s: cannot open: %s", paths[i], strerror(errno));
        else if (S_ISDIR(st.st_mode))
            rc = text_dir(paths[i], test, &tb);
        else
            rc = text_append(paths[i], test, &tb); /* refuses what is not a regular file */
    }
    if (rc < 0)
        goto out;
    /* Windows of seq + 1 bytes with stride seq: n = (len - 1) / seq of them. */
    size_t n = tb.len > 1 ? (tb.len - 1) / (size_t)seq : 0, row = (size_t)seq + 1;
    if (n < 1) {
        rc = fail(-EINVAL,
                  "%s%s: the %s text is %zu bytes (from %d file%s), fewer than one window of "
                  "%d bytes (the context length + 1)",
                  paths[0], npaths > 1 ? " ..." : "", test ? "validation" : "training", tb.len,
                  tb.files, tb.files == 1 ? "" : "s", seq + 1);
        goto out;
    }
    if (!(tok = malloc(n * row))) {
        rc = fail(-ENOMEM, "%s: out of memory for %zu windows of %zu bytes", paths[0], n, row);
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        memcpy(tok + i * row, tb.p + i * (size_t)seq, row); /* (seq + 1) */
    *out = (data_set){.n = (int)n, .dim = seq, .seq = seq, .tok = tok};
    tok = NULL;
out:
    free(tok);
    free(tb.p);
    return rc;
}

void data_gather_text(const data_set *ds, const int32_t *idx, int count, uint8_t *tok)
{
    size_t row = (size_t)ds->seq + 1;
    for (int i = 0; i < count; i++)
        memcpy(tok + (size_t)i * row, ds->tok + (size_t)idx[i] * row, row); /* (seq + 1) */
}

/* ------------------------------------------------------------------------------------------ */
/* Sampler                                                                                     */
/* ------------------------------------------------------------------------------------------ */

int data_sampler_init(data_sampler *s, int n, int global_batch, int world, int rank, int grad_accum,
                      uint64_t seed)
{
    if (!s || n < 1)
        return fail(-EINVAL, "sampler: empty data set");
    if (world < 1 || rank < 0 || rank >= world)
        return fail(-EINVAL, "sampler: rank %d is not in a world of %d", rank, world);
    if (grad_accum < 1)
        return fail(-EINVAL, "sampler: --grad-accum must be at least 1");
    if (global_batch < 1 || global_batch > n)
        return fail(-EINVAL, "sampler: the global batch (%d) must be from 1 to the data set's %d",
                    global_batch, n);
    if (global_batch % (world * grad_accum) != 0)
        return fail(-EINVAL,
                    "sampler: the global batch (%d) must be a multiple of world size x "
                    "--grad-accum (%d x %d = %d)",
                    global_batch, world, grad_accum, world * grad_accum);
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)n);
    if (!perm)
        return fail(-ENOMEM, "sampler: out of memory");
    *s = (data_sampler){.n = n,
                        .global_batch = global_batch,
                        .world = world,
                        .rank = rank,
                        .grad_accum = grad_accum,
                        .micro = global_batch / world / grad_accum,
                        .seed = seed,
                        .epoch = -1,
                        .perm = perm};
    return 0;
}

void data_sampler_free(data_sampler *s)
{
    if (!s)
        return;
    free(s->perm);
    s->perm = NULL;
}

int data_sampler_steps(const data_sampler *s)
{
    return s->n / s->global_batch;
}

void data_sampler_set_epoch(data_sampler *s, int epoch)
{
    /* From the identity every epoch, so that epoch e's order depends on (seed, e) only. */
    rng r;
    rng_init(&r, s->seed, EPOCH_STREAM(epoch));
    for (int i = 0; i < s->n; i++)
        s->perm[i] = i;
    for (int i = s->n - 1; i > 0; i--) {
        int j = (int)rng_below(&r, (uint32_t)i + 1);
        int32_t t = s->perm[i];
        s->perm[i] = s->perm[j];
        s->perm[j] = t;
    }
    s->epoch = epoch;
}

const int32_t *data_sampler_global(const data_sampler *s, int step)
{
    return s->perm + (size_t)step * s->global_batch;
}

const int32_t *data_sampler_micro(const data_sampler *s, int step, int k)
{
    size_t per_rank = (size_t)s->global_batch / s->world;
    return data_sampler_global(s, step) + (size_t)s->rank * per_rank + (size_t)k * s->micro;
}

/* ------------------------------------------------------------------------------------------ */
/* Loader thread                                                                               */
/* ------------------------------------------------------------------------------------------ */

typedef struct slot {
    data_batch b;
    int32_t *index; /* (micro) */
    float *x;       /* (micro, dim) */
    uint8_t *y;     /* (micro) */
    uint8_t *tok;   /* text: (micro, seq + 1); x and y are NULL */
    int full;
} slot;

struct data_loader {
    const data_set *ds;
    data_sampler s; /* the thread's own copy: its own permutation */
    int start_epoch, start_step;
    int epochs;
    int64_t max_steps;

    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    slot slots[2];
    int stop;         /* data_loader_free() asks the thread to end */
    int finished;     /* the thread has produced its last batch */
    int64_t produced; /* batches made ready */
    int64_t consumed; /* batches handed to the consumer */
    int held;         /* the slot the consumer holds, or -1 */
};

/* Waits until slot j may be written; returns 0, or 1 when asked to stop. */
static int wait_slot_free(data_loader *ld, int j)
{
    pthread_mutex_lock(&ld->mu);
    while (ld->slots[j].full && !ld->stop)
        pthread_cond_wait(&ld->cv, &ld->mu);
    int stop = ld->stop;
    pthread_mutex_unlock(&ld->mu);
    return stop;
}

static void *loader_main(void *arg)
{
    data_loader *ld = arg;
    data_sampler *s = &ld->s;
    int spe = data_sampler_steps(s);
    int64_t i = 0, step_count = (int64_t)ld->start_epoch * spe + ld->start_step;
    for (int e = ld->start_epoch; e < ld->epochs; e++) {
        data_sampler_set_epoch(s, e);
        for (int st = e == ld->start_epoch ? ld->start_step : 0; st < spe; st++, step_count++) {
            if (ld->max_steps > 0 && step_count >= ld->max_steps)
                goto done;
            for (int k = 0; k < s->grad_accum; k++, i++) {
                slot *sl = &ld->slots[i % 2];
                if (wait_slot_free(ld, (int)(i % 2)))
                    goto done;
                const int32_t *idx = data_sampler_micro(s, st, k);
                memcpy(sl->index, idx, sizeof(int32_t) * (size_t)s->micro);
                if (ld->ds->tok)
                    data_gather_text(ld->ds, idx, s->micro, sl->tok);
                else
                    data_gather(ld->ds, idx, s->micro, sl->x, sl->y);
                sl->b = (data_batch){.epoch = e,
                                     .step = st,
                                     .global_step = step_count,
                                     .micro = k,
                                     .count = s->micro,
                                     .index = sl->index,
                                     .x = sl->x,
                                     .y = sl->y,
                                     .tok = sl->tok};
                pthread_mutex_lock(&ld->mu);
                sl->full = 1;
                ld->produced++;
                pthread_cond_broadcast(&ld->cv);
                pthread_mutex_unlock(&ld->mu);
            }
        }
    }
done:
    pthread_mutex_lock(&ld->mu);
    ld->finished = 1;
    pthread_cond_broadcast(&ld->cv);
    pthread_mutex_unlock(&ld->mu);
    return NULL;
}

void data_loader_free(data_loader *ld)
{
    if (!ld)
        return;
    if (ld->started) {
        pthread_mutex_lock(&ld->mu);
        ld->stop = 1;
        pthread_cond_broadcast(&ld->cv);
        pthread_mutex_unlock(&ld->mu);
        pthread_join(ld->thread, NULL);
    }
    pthread_mutex_destroy(&ld->mu);
    pthread_cond_destroy(&ld->cv);
    for (int j = 0; j < 2; j++) {
        free(ld->slots[j].index);
        free(ld->slots[j].x);
        free(ld->slots[j].y);
        free(ld->slots[j].tok);
    }
    data_sampler_free(&ld->s);
    free(ld);
}

int data_loader_create(const data_set *ds, const data_sampler *s, int start_epoch, int start_step,
                       int epochs, int64_t max_steps, data_loader **out)
{
    if (!ds || !s || !out || epochs < 0 || s->n != ds->n)
        return fail(-EINVAL, "loader: bad arguments");
    if (start_epoch < 0 || start_step < 0 || start_step >= data_sampler_steps(s))
        return fail(-EINVAL, "loader: no step %d in epoch %d (an epoch has %d steps)", start_step,
                    start_epoch, data_sampler_steps(s));
    data_loader *ld = calloc(1, sizeof *ld);
    if (!ld)
        return fail(-ENOMEM, "loader: out of memory");
    pthread_mutex_init(&ld->mu, NULL);
    pthread_cond_init(&ld->cv, NULL);
    ld->ds = ds;
    ld->start_epoch = start_epoch;
    ld->start_step = start_step;
    ld->epochs = epochs;
    ld->max_steps = max_steps;
    ld->held = -1;
    int rc =
        data_sampler_init(&ld->s, s->n, s->global_batch, s->world, s->rank, s->grad_accum, s->seed);
    if (rc < 0) {
        data_loader_free(ld);
        return rc;
    }
    for (int j = 0; j < 2; j++) {
        slot *sl = &ld->slots[j];
        sl->index = malloc(sizeof(int32_t) * (size_t)s->micro);
        if (ds->tok) {
            sl->tok = malloc((size_t)s->micro * ((size_t)ds->seq + 1));
        } else {
            sl->x = malloc(sizeof(float) * (size_t)s->micro * ds->dim);
            sl->y = malloc((size_t)s->micro);
        }
        if (!sl->index || (ds->tok ? !sl->tok : !sl->x || !sl->y)) {
            data_loader_free(ld);
            return fail(-ENOMEM, "loader: out of memory");
        }
    }
    if ((rc = pthread_create(&ld->thread, NULL, loader_main, ld)) != 0) {
        data_loader_free(ld);
        return fail(-rc, "loader: cannot start its thread: %s", strerror(rc));
    }
    ld->started = 1;
    *out = ld;
    return 0;
}

int data_loader_next(data_loader *ld, const data_batch **out)
{
    pthread_mutex_lock(&ld->mu);
    if (ld->held >= 0) { /* hand the previous batch's buffer back */
        ld->slots[ld->held].full = 0;
        ld->held = -1;
        pthread_cond_broadcast(&ld->cv);
    }
    int j = (int)(ld->consumed % 2);
    while (!(ld->slots[j].full) && !(ld->finished && ld->produced == ld->consumed))
        pthread_cond_wait(&ld->cv, &ld->mu);
    int rc = 1;
    if (ld->slots[j].full) {
        ld->held = j;
        ld->consumed++;
        *out = &ld->slots[j].b;
        rc = 0;
    }
    pthread_mutex_unlock(&ld->mu);
    return rc;
}
