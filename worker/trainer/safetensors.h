/*
 * safetensors: the programs' reader and writer of Hugging Face's safetensors files (ddp-train's
 * --dump-init and --dump-batches, ddp-ckpt's export and import). A file is an 8-byte
 * little-endian header length N, N bytes of JSON header, then the tensors' bytes:
 *
 *   {"fc1.weight": {"dtype": "F32", "shape": [256, 784], "data_offsets": [0, 802816]}, ...,
 *    "__metadata__": {"key": "value", ...}}                      (metadata optional, strings)
 *
 * data_offsets are [begin, end) in the bytes after the header. As the safetensors package
 * requires, the tensors tile those bytes exactly: in offset order, each begins where the
 * previous ended, the first at 0, the last at the end of the file. Data are little-endian, as
 * on every host this builds for.
 *
 * Conventions: functions return 0 or a negative errno (-ENOENT, -EIO, -EPROTO for a malformed
 * file, -ENOMEM, -EINVAL) and leave one sentence for st_last_error() naming the file and what
 * is wrong ("x.safetensors: tensor 'w': data_offsets [0, 40) hold 40 bytes, F32 (3, 4) needs
 * 48"). Out-parameters are written only on success. Thread-safe (the sentence is per thread).
 *
 * Internal to the project's programs (a static library), not part of libddp.
 */
#ifndef DDP_SAFETENSORS_H
#define DDP_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8
/* The header may be at most this long (the safetensors package's own limit). */
#define ST_MAX_HEADER_BYTES ((uint64_t)100 << 20)

typedef struct st_tensor {
    const char *name;
    const char *dtype; /* "F32", "I32", "U8", ...: st_dtype_size() knows them */
    int ndim;          /* 0 (a scalar) to ST_MAX_DIMS */
    int64_t shape[ST_MAX_DIMS];
    const void *data; /* nbytes of it */
    size_t nbytes;
} st_tensor;

/* The calling thread's last failure sentence ("" if none). */
const char *st_last_error(void);

/* The bytes of one element of `dtype` ("F32": 4, "BF16": 2, "BOOL": 1, ...), or 0 if unknown. */
size_t st_dtype_size(const char *dtype);

/* Writes a shape as "(3, 4)" ("()" for a scalar) into buf[cap] and returns buf. */
const char *st_shape_str(char *buf, size_t cap, int ndim, const int64_t *shape);

/*
 * Writes ts[0..n) (borrowed) to `path` (created or truncated): the header built with jansson,
 * keys sorted, padded with spaces to a multiple of 8 bytes, then each tensor's bytes in the
 * order given. `meta` (string pairs, NULL-ended; NULL: none) becomes "__metadata__". Returns 0,
 * -EINVAL (an unknown dtype, or nbytes that do not match the shape), -ENOMEM, or the errno of
 * creating or writing the file.
 */
int st_write(const char *path, const st_tensor *ts, int n, const char *const *meta);

/* A file read by st_read() or st_parse(): everything is owned by it. */
typedef struct st_file {
    int ntensors;
    st_tensor *tensors; /* in data-offset order (the file's order); names and data owned */
    int nmeta;
    char **meta; /* 2 * nmeta strings: key, value, ... (in the header's order) */
    void *buf;   /* the owned bytes the tensors' data point into */
} st_file;

/*
 * Parses a whole safetensors file held in buf[0..len) and takes ownership of buf (a malloc'ed
 * block; freed by st_file_free(), or at once on failure). Checks everything the format says:
 * the header length within the file and ST_MAX_HEADER_BYTES, the header a JSON object without
 * duplicate keys, each tensor's dtype known, shape non-negative integers (at most ST_MAX_DIMS),
 * data_offsets two integers whose span is the shape's bytes, the tensors tiling the data
 * exactly; metadata an object of strings. `what` names the file in error sentences. Returns 0
 * and fills *out, -EPROTO (malformed) or -ENOMEM. Pure: no I/O.
 */
int st_parse(void *buf, size_t len, const char *what, st_file *out);

/* Reads `path` whole and st_parse()s it. Returns 0, st_parse()'s codes, or -errno of reading. */
int st_read(const char *path, st_file *out);

/* Frees what the file owns and zeroes it. NULL or a zeroed file is a no-op. */
void st_file_free(st_file *f);

#endif /* DDP_SAFETENSORS_H */
