/*
 * Small helpers of libcollective with no state and no I/O: element sizes, the names of dtypes,
 * ops, backends and operation kinds and their parsers, and error strings. (The clock is
 * monoclock.h's, shared with librendezvous; per-rank store keys are rdzv_rank_keys().)
 *
 * Names are the lower-case spellings in the tables below; a parser accepts exactly what the
 * matching name function writes (no aliases, no case folding), so names round-trip. Every
 * function here is thread-safe and returns static strings.
 */
#include "coll_internal.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const size_t dtype_sizes[COLL_DTYPE_COUNT] = {
    [COLL_F32] = 4, [COLL_F64] = 8, [COLL_F16] = 2, [COLL_BF16] = 2,
    [COLL_I32] = 4, [COLL_I64] = 8, [COLL_U8] = 1,
};

static const char *const dtype_names[COLL_DTYPE_COUNT] = {
    [COLL_F32] = "f32", [COLL_F64] = "f64", [COLL_F16] = "f16", [COLL_BF16] = "bf16",
    [COLL_I32] = "i32", [COLL_I64] = "i64", [COLL_U8] = "u8",
};

static const char *const op_names[COLL_OP_COUNT] = {
    [COLL_SUM] = "sum", [COLL_AVG] = "avg",   [COLL_MAX] = "max",
    [COLL_MIN] = "min", [COLL_PROD] = "prod",
};

static const char *const backend_names[] = {
    [COLL_BACKEND_AUTO] = "auto",
    [COLL_BACKEND_CPU] = "cpu",
    [COLL_BACKEND_NCCL] = "nccl",
};

#define NBACKENDS (sizeof(backend_names) / sizeof(backend_names[0]))

size_t coll_dtype_size(coll_dtype dtype)
{
    /* Cast first: the enum may be unsigned, and callers may pass any int. */
    if ((int)dtype < 0 || (int)dtype >= COLL_DTYPE_COUNT)
        return 0;
    return dtype_sizes[dtype];
}

const char *coll_dtype_name(coll_dtype dtype)
{
    if ((int)dtype < 0 || (int)dtype >= COLL_DTYPE_COUNT)
        return "?";
    return dtype_names[dtype];
}

const char *coll_op_name(coll_op op)
{
    if ((int)op < 0 || (int)op >= COLL_OP_COUNT)
        return "?";
    return op_names[op];
}

const char *coll_backend_name(coll_backend backend)
{
    if ((int)backend < 0 || (int)backend >= (int)NBACKENDS)
        return "?";
    return backend_names[backend];
}

/* The index of name in names[0..n), or -EINVAL. */
static int lookup(const char *const *names, int n, const char *name)
{
    if (!name)
        return -EINVAL;
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], name) == 0)
            return i;
    return -EINVAL;
}

int coll_dtype_parse(const char *name, coll_dtype *out)
{
    int i = lookup(dtype_names, COLL_DTYPE_COUNT, name);
    if (i < 0 || !out)
        return -EINVAL;
    *out = (coll_dtype)i;
    return 0;
}

int coll_op_parse(const char *name, coll_op *out)
{
    int i = lookup(op_names, COLL_OP_COUNT, name);
    if (i < 0 || !out)
        return -EINVAL;
    *out = (coll_op)i;
    return 0;
}

int coll_backend_parse(const char *name, coll_backend *out)
{
    int i = lookup(backend_names, (int)NBACKENDS, name);
    if (i < 0 || !out)
        return -EINVAL;
    *out = (coll_backend)i;
    return 0;
}

const char *coll_strerror(int err)
{
    if (err >= 0)
        return "success";
    switch (err) {
#define COLL_ERROR_CASE(name, value, text)                                                         \
    case name:                                                                                     \
        return text;
        COLL_ERROR_MAP(COLL_ERROR_CASE)
#undef COLL_ERROR_CASE
    default:
        break;
    }
    if (err == INT_MIN)
        return "unknown error";
    /* strerrordesc_np returns a static string and is thread-safe, unlike strerror. */
    const char *s = strerrordesc_np(-err);
    return s ? s : "unknown error";
}

const char *coll__kind_name(enum coll__kind kind)
{
    switch (kind) {
    case COLL__ALLREDUCE:
        return "allreduce";
    case COLL__REDUCE:
        return "reduce";
    case COLL__BROADCAST:
        return "broadcast";
    case COLL__ALLGATHER:
        return "allgather";
    case COLL__REDUCE_SCATTER:
        return "reduce_scatter";
    case COLL__BARRIER:
        return "barrier";
    case COLL__SEND:
        return "send";
    case COLL__RECV:
        return "recv";
    }
    return "?";
}
