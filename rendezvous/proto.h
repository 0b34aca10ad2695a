/*
 * The c10d TCPStore wire protocol: opcodes, reply codes, the incremental request parser and the
 * request encoder. Internal to librendezvous (and its tests, fuzzer and benchmark); no I/O
 * happens here.
 *
 * Framing (both generations): one uint8 opcode, then the request's fields. Strings (keys) and
 * byte vectors (values) are a uint64 length followed by that many bytes; counts are uint64,
 * ADD deltas int64, VALIDATE magic and PING nonce uint32. All integers are in the host's byte
 * order (little-endian everywhere PyTorch runs). See rdzv-protocol(7). The librendezvous
 * extensions (STATUS, the AUTH_HELLO/AUTH_PROOF handshake of auth.h and the MUX/MUX_CLOSE
 * frames of a store proxy's multiplexed connection, mux.h) use opcodes from 0xE0 on, far from
 * PyTorch's, in the modern generation only. A MUX frame carries a whole request of another
 * frame in its one vector, so that vector is bounded by max_request_bytes rather than
 * max_value_bytes, and the MUX frame by max_request_bytes + RDZV_MUX_OVERHEAD.
 */
#ifndef RDZV_PROTO_H
#define RDZV_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RDZV_VALIDATE_MAGIC 0x3C85F7CEu
/* Bytes a MUX frame adds to the request it carries: opcode, vconn id, vector length, flags. */
#define RDZV_MUX_OVERHEAD 14

/* Protocol generation of a connection. */
enum rdzv_gen {
    RDZV_GEN_UNKNOWN = 0, /* nothing decided yet (too few bytes seen) */
    RDZV_GEN_LEGACY = 1,  /* PyTorch < 2.2: no VALIDATE, WATCH_KEY, 9 opcodes */
    RDZV_GEN_MODERN = 2,  /* PyTorch >= 2.2: opens with VALIDATE + magic */
};

/* Wire opcodes of PyTorch >= 2.2, in its order. */
enum rdzv_modern_op {
    RDZV_M_VALIDATE = 0,
    RDZV_M_SET = 1,
    RDZV_M_COMPARE_SET = 2,
    RDZV_M_GET = 3,
    RDZV_M_ADD = 4,
    RDZV_M_CHECK = 5,
    RDZV_M_WAIT = 6,
    RDZV_M_GETNUMKEYS = 7,
    RDZV_M_DELETE_KEY = 8,
    RDZV_M_APPEND = 9,
    RDZV_M_MULTI_GET = 10,
    RDZV_M_MULTI_SET = 11,
    RDZV_M_CANCEL_WAIT = 12,
    RDZV_M_PING = 13,
    RDZV_M_QUEUE_PUSH = 14,
    RDZV_M_QUEUE_POP = 15,
    RDZV_M_QUEUE_LEN = 16,
    RDZV_M_LIST_KEYS = 17,
    RDZV_M_BARRIER = 18,
    /* librendezvous extensions, far from PyTorch's range */
    RDZV_M_STATUS = 0xE0,
    RDZV_M_AUTH_HELLO = 0xE1, /* authentication handshake (auth.h) */
    RDZV_M_AUTH_PROOF = 0xE2,
    RDZV_M_MUX = 0xE3,       /* one request of a virtual connection (a store proxy's, mux.h) */
    RDZV_M_MUX_CLOSE = 0xE4, /* closes a virtual connection */
};

/* Wire opcodes of PyTorch 1.x. */
enum rdzv_legacy_op {
    RDZV_L_SET = 0,
    RDZV_L_COMPARE_SET = 1,
    RDZV_L_GET = 2,
    RDZV_L_ADD = 3,
    RDZV_L_CHECK = 4,
    RDZV_L_WAIT = 5,
    RDZV_L_GETNUMKEYS = 6,
    RDZV_L_WATCH_KEY = 7,
    RDZV_L_DELETE_KEY = 8,
};

/* One-byte replies. */
enum { RDZV_CHECK_READY = 0, RDZV_CHECK_NOT_READY = 1 };
enum { RDZV_WAIT_STOP_WAITING = 0, RDZV_WAIT_CANCELED = 1 };
/* Legacy WATCH_KEY notifications. */
enum {
    RDZV_WATCH_KEY_UPDATED = 0,
    RDZV_WATCH_KEY_CREATED = 1,
    RDZV_WATCH_KEY_DELETED = 2,
    RDZV_WATCH_CALLBACK_REGISTERED = 3,
};

/*
 * Operations, independent of generation: the parser maps each generation's opcode onto one
 * of these. The order is also the order of the per-operation counters in the status JSON.
 */
enum rdzv_op {
    RDZV_OP_VALIDATE,
    RDZV_OP_SET,
    RDZV_OP_COMPARE_SET,
    RDZV_OP_GET,
    RDZV_OP_ADD,
    RDZV_OP_CHECK,
    RDZV_OP_WAIT,
    RDZV_OP_GETNUMKEYS,
    RDZV_OP_DELETE_KEY,
    RDZV_OP_APPEND,
    RDZV_OP_MULTI_GET,
    RDZV_OP_MULTI_SET,
    RDZV_OP_CANCEL_WAIT,
    RDZV_OP_PING,
    RDZV_OP_QUEUE_PUSH,
    RDZV_OP_QUEUE_POP,
    RDZV_OP_QUEUE_LEN,
    RDZV_OP_LIST_KEYS,
    RDZV_OP_BARRIER,
    RDZV_OP_WATCH_KEY,
    RDZV_OP_STATUS,
    RDZV_OP_AUTH_HELLO,
    RDZV_OP_AUTH_PROOF,
    RDZV_OP_MUX,
    RDZV_OP_MUX_CLOSE,
    RDZV_OP_COUNT
};

/* Lower-case name of an operation ("set", "compare_set", ...). */
const char *rdzv__op_name(enum rdzv_op op);

/* Limits the parser enforces. */
typedef struct rdzv__limits {
    size_t max_key_bytes;
    size_t max_value_bytes;
    size_t max_keys_per_request;
    size_t max_request_bytes;
} rdzv__limits;

/*
 * Resumable parser state for one connection. The parser validates a frame field by field and
 * remembers how far it got, so a frame that arrives one byte at a time costs linear work.
 */
typedef struct rdzv__parser {
    enum rdzv_gen gen;
    enum rdzv_op op; /* of the frame under way */
    size_t pos;      /* bytes of that frame validated so far (0: at its opcode) */
    int field;       /* index of the next field in the op's layout */
    uint64_t count;  /* item count of the frame's repeated group */
    uint64_t item;   /* items validated */
} rdzv__parser;

/* A complete, validated request. Pointers point into the caller's buffer. */
typedef struct rdzv__request {
    enum rdzv_op op;
    const uint8_t *key; /* first string field, if any */
    size_t key_len;
    const uint8_t *val; /* second field: value, or expected value for COMPARE_SET */
    size_t val_len;
    const uint8_t *val2; /* COMPARE_SET desired value */
    size_t val2_len;
    int64_t i64;          /* ADD delta, BARRIER world size */
    uint32_t u32;         /* VALIDATE magic, PING nonce */
    uint64_t count;       /* CHECK/WAIT/MULTI_GET key count, MULTI_SET pair count */
    const uint8_t *items; /* first byte of the repeated group; walk with rdzv__next_str() */
    size_t frame_len;
} rdzv__request;

/*
 * Parser results besides "complete" (> 0, the frame length) and "need more" (0). They never
 * leave librendezvous: the server turns them into the reason it logs for closing the connection
 * (rdzv__parse_strerror()), and no public call returns one.
 *
 * Project error codes get one range per library, so that a number means one failure wherever it
 * ends up: libcollective's public COLL_E* codes lie in [-1099, -1000] (coll.h), these parser
 * results in [RDZV_PARSE_CODE_LOW, RDZV_PARSE_CODE_HIGH] = [-1199, -1100], and errno values are
 * all above -1000. tests/test_errors.c checks that the ranges hold and do not overlap.
 */
#define RDZV_PARSE_CODE_HIGH (-1100)
#define RDZV_PARSE_CODE_LOW (-1199)

#define RDZV_PARSE_ERROR_MAP(X)                                                                    \
    X(RDZV_PARSE_BAD_OP, -1100, "unknown opcode")                                                  \
    X(RDZV_PARSE_BAD_MAGIC, -1101, "VALIDATE with a wrong magic number")                           \
    X(RDZV_PARSE_KEY_LIMIT, -1102, "key longer than the limit")                                    \
    X(RDZV_PARSE_VALUE_LIMIT, -1103, "value longer than the limit")                                \
    X(RDZV_PARSE_COUNT_LIMIT, -1104, "more keys in one request than the limit")                    \
    X(RDZV_PARSE_FRAME_LIMIT, -1105, "request larger than the limit")

enum rdzv_parse_error {
#define RDZV_PARSE_ERROR_ENUM(name, value, text) name = value,
    RDZV_PARSE_ERROR_MAP(RDZV_PARSE_ERROR_ENUM)
#undef RDZV_PARSE_ERROR_ENUM
};

/* A static description of a parser result code, for log lines; "malformed request" for any
 * other negative code. */
const char *rdzv__parse_strerror(int rc);

/* Resets `p` to the start of a connection (generation unknown). */
void rdzv__parser_init(rdzv__parser *p);

/*
 * Parses the frame at the start of buf[0..len). Returns the frame length (> 0) and fills *req
 * when a whole frame is there; 0 when more bytes are needed (state is kept in *p, so call again
 * with the same buffer grown); a negative RDZV_PARSE_* code when the input is invalid (the
 * connection must be closed). On the first frame of a connection the generation is decided: a
 * first byte 0 followed by the VALIDATE magic marks a modern client, anything else a legacy one.
 * After a complete frame the state is ready for the next frame, which starts at buf + result.
 */
int rdzv__parse(rdzv__parser *p, const rdzv__limits *lim, const uint8_t *buf, size_t len,
                rdzv__request *req);

/*
 * Reads one length-prefixed string from a validated frame at *cursor, sets *s and *n and advances
 * *cursor. Only for frames rdzv__parse() accepted.
 */
void rdzv__next_str(const uint8_t **cursor, const uint8_t **s, size_t *n);

/* Host-order integer access without alignment assumptions. */
static inline uint64_t rdzv__ld64(const uint8_t *p)
{
    uint64_t v;
    __builtin_memcpy(&v, p, 8);
    return v;
}
static inline uint32_t rdzv__ld32(const uint8_t *p)
{
    uint32_t v;
    __builtin_memcpy(&v, p, 4);
    return v;
}

/* ------------------------------------------------------------------------------------------ */
/* Request encoding                                                                            */
/* ------------------------------------------------------------------------------------------ */

/*
 * The wire opcode of operation `op` in generation `gen` (the inverse of the parser's mapping),
 * or -EINVAL when that generation has no such operation or `gen` is RDZV_GEN_UNKNOWN.
 */
int rdzv__opcode(enum rdzv_gen gen, enum rdzv_op op);

/*
 * A request under construction. Requests are encoded by appending their fields in the order of
 * the operation's layout (see rdzv-protocol(7)): rdzv__put_op() or rdzv__put_u8() for the
 * opcode, rdzv__put_vec() or rdzv__put_key() for strings and byte vectors, rdzv__put_u64() for
 * counts, rdzv__put_i64() for ADD deltas and world sizes, rdzv__put_u32() for the VALIDATE magic
 * and PING nonces.
 *
 * Appending cannot fail visibly: the first failure is kept in `err` and later appends do
 * nothing, so a caller encodes a whole request (or several) and checks `err` once. A buffer
 * that starts zeroed grows on demand and belongs to the caller (rdzv__wbuf_free()); one made
 * by rdzv__wbuf_fixed() writes into caller memory and never grows. A buffer reused with
 * rdzv__wbuf_reset() allocates only for a request larger than any before it.
 */
typedef struct rdzv__wbuf {
    uint8_t *data; /* the encoded bytes */
    size_t len;    /* bytes appended */
    size_t cap;    /* bytes available at data */
    int err;       /* 0; -ENOMEM (growing failed), -EOVERFLOW (the request would exceed half
                      of SIZE_MAX), -ENOBUFS (a fixed buffer is full) or -EINVAL (an operation
                      the generation lacks, from rdzv__put_op()) */
    bool fixed;    /* data is caller memory: never grown, never freed */
} rdzv__wbuf;

/* A buffer over `cap` bytes of caller memory at `mem` that never grows. */
static inline rdzv__wbuf rdzv__wbuf_fixed(void *mem, size_t cap)
{
    rdzv__wbuf b = {(uint8_t *)mem, 0, cap, 0, true};
    return b;
}

/* Empties `b` for the next request and clears its error; keeps its memory. */
static inline void rdzv__wbuf_reset(rdzv__wbuf *b)
{
    b->len = 0;
    b->err = 0;
}

/* Frees a growing buffer's memory and zeroes it (a fixed one is only emptied). */
void rdzv__wbuf_free(rdzv__wbuf *b);

/*
 * The appenders' slow path: makes room for `n` more bytes. Returns 0, or the buffer's error
 * (an earlier one, or the one this call records).
 */
int rdzv__wbuf_grow(rdzv__wbuf *b, size_t n);

/* Appends `n` raw bytes from `p` (NULL when `n` is 0), which must not point into `b` itself. */
static inline void rdzv__put_raw(rdzv__wbuf *b, const void *p, size_t n)
{
    if ((b->err || n > b->cap - b->len) && rdzv__wbuf_grow(b, n) < 0)
        return;
    if (n)
        __builtin_memcpy(b->data + b->len, p, n);
    b->len += n;
}

static inline void rdzv__put_u8(rdzv__wbuf *b, uint8_t v)
{
    rdzv__put_raw(b, &v, 1);
}

static inline void rdzv__put_u32(rdzv__wbuf *b, uint32_t v)
{
    rdzv__put_raw(b, &v, 4);
}

static inline void rdzv__put_u64(rdzv__wbuf *b, uint64_t v)
{
    rdzv__put_raw(b, &v, 8);
}

static inline void rdzv__put_i64(rdzv__wbuf *b, int64_t v)
{
    rdzv__put_raw(b, &v, 8);
}

/* A string or byte vector: its uint64 length, then its `n` bytes. */
static inline void rdzv__put_vec(rdzv__wbuf *b, const void *p, size_t n)
{
    rdzv__put_u64(b, n);
    rdzv__put_raw(b, p, n);
}

/*
 * One string made of two pieces under one length: `prefix` then `key`, as a client with a key
 * prefix sends its keys. `prefix` may be NULL when `prefix_len` is 0.
 */
static inline void rdzv__put_key(rdzv__wbuf *b, const char *prefix, size_t prefix_len,
                                 const char *key, size_t key_len)
{
    rdzv__put_u64(b, (uint64_t)prefix_len + key_len);
    rdzv__put_raw(b, prefix, prefix_len);
    rdzv__put_raw(b, key, key_len);
}

/* Appends the opcode of `op` in generation `gen`; records -EINVAL when it has none. */
void rdzv__put_op(rdzv__wbuf *b, enum rdzv_gen gen, enum rdzv_op op);

#endif /* RDZV_PROTO_H */
