/*
 * Incremental parser and encoder for c10d TCPStore requests, both generations.
 *
 * Every request is an opcode followed by fields laid out according to a small per-operation
 * "layout" string. The parser validates a frame field by field and keeps its position in
 * rdzv__parser, so bytes that arrive one at a time are each looked at once: a frame split at
 * any byte costs the same as a whole one, and a 128 Ki-key WAIT that trickles in does not turn
 * quadratic. Limits are checked as soon as a length prefix is read, before its bytes arrive.
 *
 * The encoder is the parser's mirror, shared by the client, the tests and store-bench: fields
 * are appended to a caller-owned rdzv__wbuf, whose fast path is inline in proto.h.
 *
 * This file does no I/O. The parser allocates nothing (extracted fields point into the
 * caller's buffer); the encoder allocates only by growing the caller's buffer.
 */
#include "proto.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/*
 * Layouts: 'k' key string, 'v' value vector, 'f' a vector holding a whole request (MUX: bounded
 * by max_request_bytes, not max_value_bytes), 'q' int64, 'u' uint32, 'n' a uint64 count after
 * which the remaining fields repeat that many times. A layout with a count starts with it, so
 * that the repeated group is always the rest (rdzv__parse() relies on it).
 */
static const char *const layouts[RDZV_OP_COUNT] = {
    [RDZV_OP_VALIDATE] = "u",   [RDZV_OP_SET] = "kv",       [RDZV_OP_COMPARE_SET] = "kvv",
    [RDZV_OP_GET] = "k",        [RDZV_OP_ADD] = "kq",       [RDZV_OP_CHECK] = "nk",
    [RDZV_OP_WAIT] = "nk",      [RDZV_OP_GETNUMKEYS] = "",  [RDZV_OP_DELETE_KEY] = "k",
    [RDZV_OP_APPEND] = "kv",    [RDZV_OP_MULTI_GET] = "nk", [RDZV_OP_MULTI_SET] = "nkv",
    [RDZV_OP_CANCEL_WAIT] = "", [RDZV_OP_PING] = "u",       [RDZV_OP_QUEUE_PUSH] = "kv",
    [RDZV_OP_QUEUE_POP] = "k",  [RDZV_OP_QUEUE_LEN] = "k",  [RDZV_OP_LIST_KEYS] = "",
    [RDZV_OP_BARRIER] = "kq",   [RDZV_OP_WATCH_KEY] = "k",  [RDZV_OP_STATUS] = "",
    [RDZV_OP_AUTH_HELLO] = "v", [RDZV_OP_AUTH_PROOF] = "v", [RDZV_OP_MUX] = "uf",
    [RDZV_OP_MUX_CLOSE] = "u",
};

static const char *const op_names[RDZV_OP_COUNT] = {
    "validate",   "set",        "compare_set", "get",       "add",       "check",       "wait",
    "getnumkeys", "delete_key", "append",      "multi_get", "multi_set", "cancel_wait", "ping",
    "queue_push", "queue_pop",  "queue_len",   "list_keys", "barrier",   "watch_key",   "status",
    "auth_hello", "auth_proof", "mux",       "mux_close",
};

const char *rdzv__op_name(enum rdzv_op op)
{
    return (unsigned)op < RDZV_OP_COUNT ? op_names[op] : "unknown";
}

const char *rdzv__parse_strerror(int rc)
{
    switch (rc) {
#define RDZV_PARSE_ERROR_CASE(name, value, text)                                                   \
    case name:                                                                                     \
        return text;
        RDZV_PARSE_ERROR_MAP(RDZV_PARSE_ERROR_CASE)
#undef RDZV_PARSE_ERROR_CASE
    default:
        return "malformed request";
    }
}

/* The legacy generation's operations, indexed by opcode. */
static const int8_t legacy_ops[] = {
    RDZV_OP_SET,  RDZV_OP_COMPARE_SET, RDZV_OP_GET,       RDZV_OP_ADD,        RDZV_OP_CHECK,
    RDZV_OP_WAIT, RDZV_OP_GETNUMKEYS,  RDZV_OP_WATCH_KEY, RDZV_OP_DELETE_KEY,
};

/* Maps a wire opcode of generation `gen` onto an operation; -1 if unknown. */
static int map_opcode(enum rdzv_gen gen, uint8_t code)
{
    if (gen == RDZV_GEN_LEGACY)
        return code < sizeof(legacy_ops) ? legacy_ops[code] : -1;
    /* The modern numbering is the rdzv_op order up to BARRIER. */
    if (code <= RDZV_M_BARRIER)
        return code;
    if (code == RDZV_M_STATUS)
        return RDZV_OP_STATUS;
    if (code == RDZV_M_AUTH_HELLO)
        return RDZV_OP_AUTH_HELLO;
    if (code == RDZV_M_AUTH_PROOF)
        return RDZV_OP_AUTH_PROOF;
    if (code == RDZV_M_MUX)
        return RDZV_OP_MUX;
    if (code == RDZV_M_MUX_CLOSE)
        return RDZV_OP_MUX_CLOSE;
    return -1;
}

void rdzv__parser_init(rdzv__parser *p)
{
    memset(p, 0, sizeof(*p));
    p->gen = RDZV_GEN_UNKNOWN;
}

static void parser_next_frame(rdzv__parser *p)
{
    p->pos = 0;
    p->field = 0;
    p->count = 0;
    p->item = 0;
}

/* Fills *req from a frame that has been validated in full. */
static void extract(enum rdzv_op op, const uint8_t *buf, size_t frame_len, rdzv__request *req)
{
    const uint8_t *cur = buf + 1;
    int nstr = 0;

    memset(req, 0, sizeof(*req));
    req->op = op;
    req->frame_len = frame_len;
    for (const char *f = layouts[op]; *f; f++) {
        const uint8_t *s;
        size_t n;
        switch (*f) {
        case 'u':
            req->u32 = rdzv__ld32(cur);
            cur += 4;
            break;
        case 'q':
            req->i64 = (int64_t)rdzv__ld64(cur);
            cur += 8;
            break;
        case 'n':
            req->count = rdzv__ld64(cur);
            req->items = cur + 8;
            return; /* the repeated group is walked by the caller */
        default:    /* 'k' or 'v' */
            rdzv__next_str(&cur, &s, &n);
            if (nstr == 0) {
                req->key = s;
                req->key_len = n;
            } else if (nstr == 1) {
                req->val = s;
                req->val_len = n;
            } else {
                req->val2 = s;
                req->val2_len = n;
            }
            nstr++;
            break;
        }
    }
}

int rdzv__parse(rdzv__parser *p, const rdzv__limits *lim, const uint8_t *buf, size_t len,
                rdzv__request *req)
{
    if (p->pos == 0) {
        if (len < 1)
            return 0;
        if (p->gen == RDZV_GEN_UNKNOWN) {
            /* A modern client's first frame is VALIDATE: opcode 0 and the magic. A legacy
             * client's opcode 0 is SET, whose key length would have to be about 968 MiB to
             * look like the magic, far beyond the highest key limit (RDZV_KEY_BYTES_MAX, rdzv.h). */
            if (buf[0] == 0) {
                if (len < 5)
                    return 0;
                p->gen =
                    rdzv__ld32(buf + 1) == RDZV_VALIDATE_MAGIC ? RDZV_GEN_MODERN : RDZV_GEN_LEGACY;
            } else {
                p->gen = RDZV_GEN_LEGACY;
            }
        }
        int op = map_opcode(p->gen, buf[0]);
        if (op < 0)
            return RDZV_PARSE_BAD_OP;
        p->op = (enum rdzv_op)op;
        p->pos = 1;
        p->field = 0;
        p->count = 0;
        p->item = 0;
    }

    if (len < p->pos)
        return 0; /* the caller must pass the same frame, grown; never less */
    const char *layout = layouts[p->op];
    int group_start = layout[0] == 'n' ? 1 : -1;

    for (;;) {
        char f = layout[p->field];
        size_t need;

        if (f == '\0') {
            if (group_start >= 0 && p->count > 0 && ++p->item < p->count) {
                p->field = group_start;
                continue;
            }
            break;
        }
        switch (f) {
        case 'u':
            need = 4;
            break;
        case 'q':
        case 'n':
            need = 8;
            break;
        default: { /* 'k', 'v' or 'f': length prefix, then the bytes */
            if (len - p->pos < 8)
                return 0;
            uint64_t n = rdzv__ld64(buf + p->pos);
            if (f == 'k' && n > lim->max_key_bytes)
                return RDZV_PARSE_KEY_LIMIT;
            if (f == 'v' && n > lim->max_value_bytes)
                return RDZV_PARSE_VALUE_LIMIT;
            if (n > lim->max_request_bytes + RDZV_MUX_OVERHEAD)
                return RDZV_PARSE_FRAME_LIMIT;
            need = 8 + (size_t)n;
            break;
        }
        }
        size_t cap = lim->max_request_bytes + (p->op == RDZV_OP_MUX ? RDZV_MUX_OVERHEAD : 0);
        if (need > cap || p->pos + need > cap)
            return RDZV_PARSE_FRAME_LIMIT;
        if (len - p->pos < need)
            return 0;
        if (f == 'n') {
            uint64_t n = rdzv__ld64(buf + p->pos);
            if (n > lim->max_keys_per_request)
                return RDZV_PARSE_COUNT_LIMIT;
            p->count = n;
            p->item = 0;
            if (n == 0) {
                p->pos += need;
                p->field = (int)strlen(layout);
                continue;
            }
        } else if (f == 'u' && p->op == RDZV_OP_VALIDATE &&
                   rdzv__ld32(buf + p->pos) != RDZV_VALIDATE_MAGIC) {
            return RDZV_PARSE_BAD_MAGIC;
        }
        p->pos += need;
        p->field++;
    }

    size_t frame_len = p->pos;
    extract(p->op, buf, frame_len, req);
    parser_next_frame(p);
    return (int)frame_len;
}

void rdzv__next_str(const uint8_t **cursor, const uint8_t **s, size_t *n)
{
    *n = (size_t)rdzv__ld64(*cursor);
    *s = *cursor + 8;
    *cursor += 8 + *n;
}

/* ------------------------------------------------------------------------------------------ */
/* Encoding                                                                                    */
/* ------------------------------------------------------------------------------------------ */

int rdzv__opcode(enum rdzv_gen gen, enum rdzv_op op)
{
    if (gen == RDZV_GEN_LEGACY) {
        for (size_t code = 0; code < sizeof(legacy_ops); code++)
            if (legacy_ops[code] == (int)op)
                return (int)code;
        return -EINVAL;
    }
    if (gen != RDZV_GEN_MODERN)
        return -EINVAL;
    /* The modern numbering is the rdzv_op order up to BARRIER; WATCH_KEY is legacy only. */
    if ((unsigned)op <= RDZV_OP_BARRIER)
        return (int)op;
    if (op == RDZV_OP_STATUS)
        return RDZV_M_STATUS;
    if (op == RDZV_OP_AUTH_HELLO)
        return RDZV_M_AUTH_HELLO;
    if (op == RDZV_OP_AUTH_PROOF)
        return RDZV_M_AUTH_PROOF;
    if (op == RDZV_OP_MUX)
        return RDZV_M_MUX;
    if (op == RDZV_OP_MUX_CLOSE)
        return RDZV_M_MUX_CLOSE;
    return -EINVAL;
}

void rdzv__put_op(rdzv__wbuf *b, enum rdzv_gen gen, enum rdzv_op op)
{
    int code = rdzv__opcode(gen, op);
    if (code < 0) {
        if (!b->err)
            b->err = code;
        return;
    }
    rdzv__put_u8(b, (uint8_t)code);
}

int rdzv__wbuf_grow(rdzv__wbuf *b, size_t n)
{
    if (b->err)
        return b->err;
    if (n <= b->cap - b->len)
        return 0;
    if (b->fixed)
        return b->err = -ENOBUFS;
    /* Doubling must stay representable, so a request is capped at half the address space. */
    if (n > SIZE_MAX / 2 - b->len)
        return b->err = -EOVERFLOW;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n)
        cap *= 2;
    uint8_t *p = realloc(b->data, cap);
    if (!p)
        return b->err = -ENOMEM;
    b->data = p;
    b->cap = cap;
    return 0;
}

void rdzv__wbuf_free(rdzv__wbuf *b)
{
    if (b->fixed) {
        rdzv__wbuf_reset(b);
        return;
    }
    free(b->data);
    *b = (rdzv__wbuf){0};
}
