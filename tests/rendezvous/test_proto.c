/*
 * Unit tests of the request parser: every opcode of both generations, generation detection,
 * frames split at every byte boundary, pipelined frames, limits and malformed input. And of the
 * request encoder: its bytes against hand-written frames, its opcode map, encode-then-parse
 * round trips for every operation of both generations, and its buffer's growth and failures.
 */
#include "frames.h"
#include "proto.h"
#include "check_main.h"

#include <check.h>
#include <errno.h>

static const rdzv__limits lim = {.max_key_bytes = 64,
                                 .max_value_bytes = 1024,
                                 .max_keys_per_request = 16,
                                 .max_request_bytes = 4096};

/* Parses one complete frame from a fresh (or given) parser; returns the parse result. */
static int parse_all(rdzv__parser *p, const frame *f, rdzv__request *req)
{
    return rdzv__parse(p, &lim, f->data, f->len, req);
}

static void validate_frame(frame *f)
{
    fr_u8(f, RDZV_M_VALIDATE);
    fr_u32(f, RDZV_VALIDATE_MAGIC);
}

/* A modern parser that has seen VALIDATE. */
static rdzv__parser modern_parser(void)
{
    rdzv__parser p;
    rdzv__request r;
    frame f = {0};
    rdzv__parser_init(&p);
    validate_frame(&f);
    ck_assert_int_eq(parse_all(&p, &f, &r), 5);
    ck_assert_int_eq(r.op, RDZV_OP_VALIDATE);
    ck_assert_int_eq(p.gen, RDZV_GEN_MODERN);
    fr_free(&f);
    return p;
}

START_TEST(detect_generation)
{
    rdzv__parser p;
    rdzv__request r;
    frame f = {0};

    p = modern_parser();
    ck_assert_int_eq(p.gen, RDZV_GEN_MODERN);

    /* Legacy SET "/a" = "1": opcode 0 without the magic. */
    rdzv__parser_init(&p);
    fr_u8(&f, RDZV_L_SET);
    fr_str(&f, "/a");
    fr_str(&f, "1");
    ck_assert_int_eq(parse_all(&p, &f, &r), (int)f.len);
    ck_assert_int_eq(p.gen, RDZV_GEN_LEGACY);
    ck_assert_int_eq(r.op, RDZV_OP_SET);
    ck_assert_int_eq(r.key_len, 2);
    ck_assert_mem_eq(r.key, "/a", 2);
    ck_assert_int_eq(r.val_len, 1);

    /* Opcode 0 with fewer than five bytes cannot be decided yet. */
    rdzv__parser_init(&p);
    ck_assert_int_eq(rdzv__parse(&p, &lim, f.data, 4, &r), 0);
    ck_assert_int_eq(p.gen, RDZV_GEN_UNKNOWN);

    /* A first opcode other than 0 is legacy: 3 is ADD there (GET in the modern numbering). */
    fr_reset(&f);
    fr_u8(&f, RDZV_L_ADD);
    fr_str(&f, "c");
    fr_u64(&f, (uint64_t)-5);
    rdzv__parser_init(&p);
    ck_assert_int_eq(parse_all(&p, &f, &r), (int)f.len);
    ck_assert_int_eq(r.op, RDZV_OP_ADD);
    ck_assert_int_eq(r.i64, -5);
    fr_free(&f);
}
END_TEST

/* Builds a valid request for operation `op` in generation `gen` into f. */
static void build(frame *f, enum rdzv_gen gen, enum rdzv_op op)
{
    static const int legacy_code[RDZV_OP_COUNT] = {[RDZV_OP_SET] = RDZV_L_SET + 1,
                                                   [RDZV_OP_COMPARE_SET] = RDZV_L_COMPARE_SET + 1,
                                                   [RDZV_OP_GET] = RDZV_L_GET + 1,
                                                   [RDZV_OP_ADD] = RDZV_L_ADD + 1,
                                                   [RDZV_OP_CHECK] = RDZV_L_CHECK + 1,
                                                   [RDZV_OP_WAIT] = RDZV_L_WAIT + 1,
                                                   [RDZV_OP_GETNUMKEYS] = RDZV_L_GETNUMKEYS + 1,
                                                   [RDZV_OP_WATCH_KEY] = RDZV_L_WATCH_KEY + 1,
                                                   [RDZV_OP_DELETE_KEY] = RDZV_L_DELETE_KEY + 1};
    int code = gen == RDZV_GEN_LEGACY ? legacy_code[op] - 1
               : op == RDZV_OP_STATUS     ? RDZV_M_STATUS
               : op == RDZV_OP_AUTH_HELLO ? RDZV_M_AUTH_HELLO
               : op == RDZV_OP_AUTH_PROOF ? RDZV_M_AUTH_PROOF
               : op == RDZV_OP_MUX        ? RDZV_M_MUX
               : op == RDZV_OP_MUX_CLOSE  ? RDZV_M_MUX_CLOSE
                                          : (int)op;
    fr_u8(f, (uint8_t)code);
    switch (op) {
    case RDZV_OP_VALIDATE:
        fr_u32(f, RDZV_VALIDATE_MAGIC);
        break;
    case RDZV_OP_PING:
    case RDZV_OP_MUX_CLOSE:
        fr_u32(f, 0x1234);
        break;
    case RDZV_OP_MUX: /* vconn 7: flags, then a GET of "k" */
        fr_u32(f, 7);
        fr_u64(f, 1 + 1 + 8 + 1);
        fr_raw(f, "\x01\x03\x01\0\0\0\0\0\0\0k", 11);
        break;
    case RDZV_OP_SET:
    case RDZV_OP_APPEND:
    case RDZV_OP_QUEUE_PUSH:
        fr_str(f, "key");
        fr_str(f, "value");
        break;
    case RDZV_OP_COMPARE_SET:
        fr_str(f, "key");
        fr_str(f, "old");
        fr_str(f, "new");
        break;
    case RDZV_OP_GET:
    case RDZV_OP_DELETE_KEY:
    case RDZV_OP_QUEUE_POP:
    case RDZV_OP_QUEUE_LEN:
    case RDZV_OP_WATCH_KEY:
    case RDZV_OP_AUTH_HELLO:
    case RDZV_OP_AUTH_PROOF:
        fr_str(f, "key");
        break;
    case RDZV_OP_ADD:
    case RDZV_OP_BARRIER:
        fr_str(f, "key");
        fr_u64(f, 7);
        break;
    case RDZV_OP_CHECK:
    case RDZV_OP_WAIT:
    case RDZV_OP_MULTI_GET:
        fr_u64(f, 3);
        fr_str(f, "a");
        fr_str(f, "bb");
        fr_str(f, "");
        break;
    case RDZV_OP_MULTI_SET:
        fr_u64(f, 2);
        fr_str(f, "a");
        fr_str(f, "1");
        fr_str(f, "bb");
        fr_str(f, "22");
        break;
    default:
        break; /* no fields */
    }
}

static bool legacy_has(enum rdzv_op op)
{
    return op == RDZV_OP_SET || op == RDZV_OP_COMPARE_SET || op == RDZV_OP_GET ||
           op == RDZV_OP_ADD || op == RDZV_OP_CHECK || op == RDZV_OP_WAIT ||
           op == RDZV_OP_GETNUMKEYS || op == RDZV_OP_WATCH_KEY || op == RDZV_OP_DELETE_KEY;
}

/* Every opcode of both generations, each delivered whole and split at every byte. */
START_TEST(every_opcode_every_split)
{
    for (int g = RDZV_GEN_LEGACY; g <= RDZV_GEN_MODERN; g++) {
        for (int op = 0; op < RDZV_OP_COUNT; op++) {
            bool exists = g == RDZV_GEN_LEGACY ? legacy_has(op) : op != RDZV_OP_WATCH_KEY;
            if (!exists)
                continue;
            frame f = {0};
            build(&f, g, op);
            for (size_t split = 1; split <= f.len; split++) {
                rdzv__parser p = g == RDZV_GEN_MODERN ? modern_parser() : (rdzv__parser){0};
                if (g == RDZV_GEN_LEGACY) {
                    rdzv__parser_init(&p);
                    p.gen = RDZV_GEN_LEGACY;
                }
                rdzv__request r;
                int rc = 0;
                /* Deliver byte by byte up to the split, then the rest at once. */
                for (size_t n = 1; n < split; n++) {
                    rc = rdzv__parse(&p, &lim, f.data, n, &r);
                    ck_assert_msg(rc == 0, "gen %d op %s: early result %d at %zu", g,
                                  rdzv__op_name(op), rc, n);
                }
                rc = rdzv__parse(&p, &lim, f.data, f.len, &r);
                ck_assert_msg(rc == (int)f.len, "gen %d op %s split %zu: %d", g, rdzv__op_name(op),
                              split, rc);
                ck_assert_int_eq(r.op, op);
                if (op == RDZV_OP_MULTI_SET) {
                    ck_assert_int_eq(r.count, 2);
                    const uint8_t *cur = r.items, *s;
                    size_t n;
                    rdzv__next_str(&cur, &s, &n);
                    ck_assert_int_eq(n, 1);
                    rdzv__next_str(&cur, &s, &n);
                    rdzv__next_str(&cur, &s, &n);
                    ck_assert_mem_eq(s, "bb", 2);
                    rdzv__next_str(&cur, &s, &n);
                    ck_assert_mem_eq(s, "22", 2);
                    ck_assert_ptr_eq(cur, f.data + f.len);
                }
                if (op == RDZV_OP_COMPARE_SET) {
                    ck_assert_mem_eq(r.val, "old", 3);
                    ck_assert_mem_eq(r.val2, "new", 3);
                }
                if (op == RDZV_OP_ADD || op == RDZV_OP_BARRIER)
                    ck_assert_int_eq(r.i64, 7);
                if (op == RDZV_OP_PING)
                    ck_assert_uint_eq(r.u32, 0x1234);
            }
            fr_free(&f);
        }
    }
}
END_TEST

START_TEST(pipelined)
{
    rdzv__parser p = modern_parser();
    frame f = {0};
    for (int op = RDZV_OP_SET; op <= RDZV_OP_BARRIER; op++)
        build(&f, RDZV_GEN_MODERN, op);
    size_t off = 0;
    int op = RDZV_OP_SET;
    while (off < f.len) {
        rdzv__request r;
        int rc = rdzv__parse(&p, &lim, f.data + off, f.len - off, &r);
        ck_assert_int_gt(rc, 0);
        ck_assert_int_eq(r.op, op++);
        off += (size_t)rc;
    }
    ck_assert_int_eq(op, RDZV_OP_BARRIER + 1);
    fr_free(&f);
}
END_TEST

/* Limits are enforced from the length prefix, before the bytes arrive. */
START_TEST(limits)
{
    rdzv__parser p;
    rdzv__request r;
    frame f = {0};

    p = modern_parser();
    fr_u8(&f, RDZV_M_GET);
    fr_u64(&f, lim.max_key_bytes + 1);
    ck_assert_int_eq(parse_all(&p, &f, &r), RDZV_PARSE_KEY_LIMIT);

    p = modern_parser();
    fr_reset(&f);
    fr_u8(&f, RDZV_M_SET);
    fr_str(&f, "k");
    fr_u64(&f, lim.max_value_bytes + 1);
    ck_assert_int_eq(parse_all(&p, &f, &r), RDZV_PARSE_VALUE_LIMIT);

    p = modern_parser();
    fr_reset(&f);
    fr_u8(&f, RDZV_M_WAIT);
    fr_u64(&f, lim.max_keys_per_request + 1);
    ck_assert_int_eq(parse_all(&p, &f, &r), RDZV_PARSE_COUNT_LIMIT);

    /* Each value within its limit, the frame over the request limit. */
    p = modern_parser();
    fr_reset(&f);
    fr_u8(&f, RDZV_M_MULTI_SET);
    fr_u64(&f, 8);
    char big[1000];
    memset(big, 'x', sizeof(big));
    for (int i = 0; i < 8; i++) {
        fr_str(&f, "k");
        fr_bytes(&f, big, sizeof(big));
    }
    ck_assert_int_eq(parse_all(&p, &f, &r), RDZV_PARSE_FRAME_LIMIT);

    /* Exactly at the limits is fine. */
    p = modern_parser();
    fr_reset(&f);
    fr_u8(&f, RDZV_M_SET);
    char key[64];
    memset(key, 'k', sizeof(key));
    fr_bytes(&f, key, sizeof(key));
    fr_bytes(&f, big, 1000);
    ck_assert_int_eq(parse_all(&p, &f, &r), (int)f.len);
    fr_free(&f);
}
END_TEST

START_TEST(malformed)
{
    rdzv__parser p;
    rdzv__request r;
    frame f = {0};

    /* Opcodes beyond each generation's range. */
    p = modern_parser();
    fr_u8(&f, RDZV_M_BARRIER + 1);
    ck_assert_int_eq(parse_all(&p, &f, &r), RDZV_PARSE_BAD_OP);
    p = modern_parser();
    fr_reset(&f);
    fr_u8(&f, 0xff);
    ck_assert_int_eq(parse_all(&p, &f, &r), RDZV_PARSE_BAD_OP);
    rdzv__parser_init(&p);
    fr_reset(&f);
    fr_u8(&f, RDZV_L_DELETE_KEY + 1);
    ck_assert_int_eq(parse_all(&p, &f, &r), RDZV_PARSE_BAD_OP);

    /* A later VALIDATE with the wrong magic. */
    p = modern_parser();
    fr_reset(&f);
    fr_u8(&f, RDZV_M_VALIDATE);
    fr_u32(&f, 0xdeadbeef);
    ck_assert_int_eq(parse_all(&p, &f, &r), RDZV_PARSE_BAD_MAGIC);

    /* A huge length must not overflow arithmetic into "complete". */
    p = modern_parser();
    fr_reset(&f);
    fr_u8(&f, RDZV_M_SET);
    fr_u64(&f, UINT64_MAX);
    ck_assert_int_lt(parse_all(&p, &f, &r), 0);
    fr_free(&f);
    for (int rc = RDZV_PARSE_FRAME_LIMIT; rc <= RDZV_PARSE_BAD_OP; rc++)
        ck_assert_ptr_nonnull(rdzv__parse_strerror(rc));
}
END_TEST

/* A 16-key WAIT delivered one byte at a time touches each byte a bounded number of times:
 * the resumable state means "pos" only moves forward. */
START_TEST(resumable_progress)
{
    rdzv__parser p = modern_parser();
    rdzv__request r;
    frame f = {0};
    fr_u8(&f, RDZV_M_WAIT);
    fr_u64(&f, 16);
    for (int i = 0; i < 16; i++)
        fr_str(&f, "key-of-some-length");
    size_t last = 0;
    for (size_t n = 1; n < f.len; n++) {
        ck_assert_int_eq(rdzv__parse(&p, &lim, f.data, n, &r), 0);
        ck_assert_uint_ge(p.pos, last);
        last = p.pos;
    }
    ck_assert_int_eq(rdzv__parse(&p, &lim, f.data, f.len, &r), (int)f.len);
    ck_assert_int_eq(r.count, 16);
    fr_free(&f);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Encoder                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* Checks that b holds exactly the `n` bytes at `want`. */
static void expect_bytes(const rdzv__wbuf *b, const char *want, size_t n)
{
    ck_assert_int_eq(b->err, 0);
    ck_assert_uint_eq(b->len, n);
    ck_assert_mem_eq(b->data, want, n);
}

/* The encoder's output, byte for byte, against frames written out by hand (little-endian). */
START_TEST(encode_literal_bytes)
{
    rdzv__wbuf b = {0};

    /* The client's opening: VALIDATE with the magic, then PING with a nonce. */
    rdzv__put_op(&b, RDZV_GEN_MODERN, RDZV_OP_VALIDATE);
    rdzv__put_u32(&b, RDZV_VALIDATE_MAGIC);
    rdzv__put_op(&b, RDZV_GEN_MODERN, RDZV_OP_PING);
    rdzv__put_u32(&b, 0x12345678);
    expect_bytes(&b, "\x00\xce\xf7\x85\x3c\x0d\x78\x56\x34\x12", 10);

    /* SET with a key in two pieces (a client's prefix) and a value with a NUL. */
    rdzv__wbuf_reset(&b);
    rdzv__put_op(&b, RDZV_GEN_MODERN, RDZV_OP_SET);
    rdzv__put_key(&b, "pfx/", 4, "k", 1);
    rdzv__put_vec(&b, "v\0w", 3);
    expect_bytes(&b, "\x01\x05\0\0\0\0\0\0\0pfx/k\x03\0\0\0\0\0\0\0v\0w", 1 + 8 + 5 + 8 + 3);

    /* Legacy ADD of -5 to "c"; then an empty key with no prefix, and an empty value. */
    rdzv__wbuf_reset(&b);
    rdzv__put_op(&b, RDZV_GEN_LEGACY, RDZV_OP_ADD);
    rdzv__put_vec(&b, "c", 1);
    rdzv__put_i64(&b, -5);
    rdzv__put_key(&b, NULL, 0, "", 0);
    rdzv__put_vec(&b, NULL, 0);
    expect_bytes(&b,
                 "\x03\x01\0\0\0\0\0\0\0c\xfb\xff\xff\xff\xff\xff\xff\xff"
                 "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0",
                 1 + 8 + 1 + 8 + 8 + 8);

    /* Legacy WAIT and WATCH_KEY, modern WAIT, STATUS and CANCEL_WAIT opcodes, and a count. */
    rdzv__wbuf_reset(&b);
    rdzv__put_op(&b, RDZV_GEN_LEGACY, RDZV_OP_WAIT);
    rdzv__put_op(&b, RDZV_GEN_LEGACY, RDZV_OP_WATCH_KEY);
    rdzv__put_op(&b, RDZV_GEN_MODERN, RDZV_OP_WAIT);
    rdzv__put_op(&b, RDZV_GEN_MODERN, RDZV_OP_STATUS);
    rdzv__put_op(&b, RDZV_GEN_MODERN, RDZV_OP_CANCEL_WAIT);
    rdzv__put_u64(&b, 0x0102030405060708ull);
    expect_bytes(&b, "\x05\x07\x06\xe0\x0c\x08\x07\x06\x05\x04\x03\x02\x01", 13);
    rdzv__wbuf_free(&b);
    ck_assert_ptr_null(b.data);
}
END_TEST

/* rdzv__opcode() against the opcode enums, and what it refuses. */
START_TEST(opcode_map)
{
    static const int legacy[RDZV_OP_COUNT] = {
        [RDZV_OP_SET] = RDZV_L_SET + 1,
        [RDZV_OP_COMPARE_SET] = RDZV_L_COMPARE_SET + 1,
        [RDZV_OP_GET] = RDZV_L_GET + 1,
        [RDZV_OP_ADD] = RDZV_L_ADD + 1,
        [RDZV_OP_CHECK] = RDZV_L_CHECK + 1,
        [RDZV_OP_WAIT] = RDZV_L_WAIT + 1,
        [RDZV_OP_GETNUMKEYS] = RDZV_L_GETNUMKEYS + 1,
        [RDZV_OP_WATCH_KEY] = RDZV_L_WATCH_KEY + 1,
        [RDZV_OP_DELETE_KEY] = RDZV_L_DELETE_KEY + 1,
    };
    static const int modern[RDZV_OP_COUNT] = {
        [RDZV_OP_VALIDATE] = RDZV_M_VALIDATE + 1,
        [RDZV_OP_SET] = RDZV_M_SET + 1,
        [RDZV_OP_COMPARE_SET] = RDZV_M_COMPARE_SET + 1,
        [RDZV_OP_GET] = RDZV_M_GET + 1,
        [RDZV_OP_ADD] = RDZV_M_ADD + 1,
        [RDZV_OP_CHECK] = RDZV_M_CHECK + 1,
        [RDZV_OP_WAIT] = RDZV_M_WAIT + 1,
        [RDZV_OP_GETNUMKEYS] = RDZV_M_GETNUMKEYS + 1,
        [RDZV_OP_DELETE_KEY] = RDZV_M_DELETE_KEY + 1,
        [RDZV_OP_APPEND] = RDZV_M_APPEND + 1,
        [RDZV_OP_MULTI_GET] = RDZV_M_MULTI_GET + 1,
        [RDZV_OP_MULTI_SET] = RDZV_M_MULTI_SET + 1,
        [RDZV_OP_CANCEL_WAIT] = RDZV_M_CANCEL_WAIT + 1,
        [RDZV_OP_PING] = RDZV_M_PING + 1,
        [RDZV_OP_QUEUE_PUSH] = RDZV_M_QUEUE_PUSH + 1,
        [RDZV_OP_QUEUE_POP] = RDZV_M_QUEUE_POP + 1,
        [RDZV_OP_QUEUE_LEN] = RDZV_M_QUEUE_LEN + 1,
        [RDZV_OP_LIST_KEYS] = RDZV_M_LIST_KEYS + 1,
        [RDZV_OP_BARRIER] = RDZV_M_BARRIER + 1,
        [RDZV_OP_STATUS] = RDZV_M_STATUS + 1,
        [RDZV_OP_AUTH_HELLO] = RDZV_M_AUTH_HELLO + 1,
        [RDZV_OP_AUTH_PROOF] = RDZV_M_AUTH_PROOF + 1,
        [RDZV_OP_MUX] = RDZV_M_MUX + 1,
        [RDZV_OP_MUX_CLOSE] = RDZV_M_MUX_CLOSE + 1,
    };
    for (int op = 0; op < RDZV_OP_COUNT; op++) {
        ck_assert_int_eq(rdzv__opcode(RDZV_GEN_LEGACY, op), legacy[op] ? legacy[op] - 1 : -EINVAL);
        ck_assert_int_eq(rdzv__opcode(RDZV_GEN_MODERN, op), modern[op] ? modern[op] - 1 : -EINVAL);
        ck_assert_int_eq(rdzv__opcode(RDZV_GEN_UNKNOWN, op), -EINVAL);
    }
    ck_assert_int_eq(rdzv__opcode(RDZV_GEN_MODERN, RDZV_OP_COUNT), -EINVAL);

    /* An operation the generation lacks fails the buffer, and nothing more is appended. */
    rdzv__wbuf b = {0};
    rdzv__put_u8(&b, 0x42);
    rdzv__put_op(&b, RDZV_GEN_LEGACY, RDZV_OP_PING);
    ck_assert_int_eq(b.err, -EINVAL);
    rdzv__put_op(&b, RDZV_GEN_MODERN, RDZV_OP_PING);
    rdzv__put_vec(&b, "abc", 3);
    ck_assert_int_eq(b.err, -EINVAL);
    ck_assert_uint_eq(b.len, 1);
    rdzv__wbuf_free(&b);
}
END_TEST

/* A sample request of `op` in `gen`, encoded field by field in the op's layout. */
static void encode_sample(rdzv__wbuf *b, enum rdzv_gen gen, enum rdzv_op op)
{
    rdzv__put_op(b, gen, op);
    switch (op) {
    case RDZV_OP_VALIDATE:
        rdzv__put_u32(b, RDZV_VALIDATE_MAGIC);
        break;
    case RDZV_OP_PING:
    case RDZV_OP_MUX_CLOSE:
        rdzv__put_u32(b, 0xA5A5F00Du);
        break;
    case RDZV_OP_MUX:
        rdzv__put_u32(b, 0xA5A5F00Du); /* the opcode is there: the rest of rdzv__mux_put()'s */
        rdzv__put_vec(b, "\x01\x03\x01\0\0\0\0\0\0\0k", 11);
        break;
    case RDZV_OP_SET:
    case RDZV_OP_APPEND:
    case RDZV_OP_QUEUE_PUSH:
        rdzv__put_key(b, "job/", 4, "key", 3);
        rdzv__put_vec(b, "v\0al", 4);
        break;
    case RDZV_OP_COMPARE_SET:
        rdzv__put_key(b, "job/", 4, "key", 3);
        rdzv__put_vec(b, NULL, 0);
        rdzv__put_vec(b, "new", 3);
        break;
    case RDZV_OP_GET:
    case RDZV_OP_DELETE_KEY:
    case RDZV_OP_QUEUE_POP:
    case RDZV_OP_QUEUE_LEN:
    case RDZV_OP_WATCH_KEY:
    case RDZV_OP_AUTH_HELLO:
    case RDZV_OP_AUTH_PROOF:
        rdzv__put_key(b, "job/", 4, "key", 3);
        break;
    case RDZV_OP_ADD:
    case RDZV_OP_BARRIER:
        rdzv__put_key(b, "job/", 4, "key", 3);
        rdzv__put_i64(b, INT64_MIN + 1);
        break;
    case RDZV_OP_CHECK:
    case RDZV_OP_WAIT:
    case RDZV_OP_MULTI_GET:
        rdzv__put_u64(b, 3);
        rdzv__put_key(b, "job/", 4, "a", 1);
        rdzv__put_key(b, NULL, 0, "bb", 2);
        rdzv__put_vec(b, "", 0);
        break;
    case RDZV_OP_MULTI_SET:
        rdzv__put_u64(b, 2);
        rdzv__put_key(b, "job/", 4, "a", 1);
        rdzv__put_vec(b, "1", 1);
        rdzv__put_key(b, "job/", 4, "bb", 2);
        rdzv__put_vec(b, NULL, 0);
        break;
    default:
        break; /* no fields */
    }
}

/* Walks one string of a repeated group and checks it. */
static void expect_item(const uint8_t **cur, const char *want, size_t n)
{
    const uint8_t *s;
    size_t len;
    rdzv__next_str(cur, &s, &len);
    ck_assert_uint_eq(len, n);
    if (n)
        ck_assert_mem_eq(s, want, n);
}

/* Checks a parsed sample (see encode_sample()). */
static void expect_sample(const rdzv__request *r, enum rdzv_op op)
{
    const uint8_t *cur = r->items;
    ck_assert_int_eq(r->op, op);
    switch (op) {
    case RDZV_OP_VALIDATE:
        ck_assert_uint_eq(r->u32, RDZV_VALIDATE_MAGIC);
        return;
    case RDZV_OP_PING:
    case RDZV_OP_MUX_CLOSE:
        ck_assert_uint_eq(r->u32, 0xA5A5F00Du);
        return;
    case RDZV_OP_MUX:
        ck_assert_uint_eq(r->u32, 0xA5A5F00Du);
        ck_assert_uint_eq(r->key_len, 11);
        ck_assert_mem_eq(r->key, "\x01\x03\x01\0\0\0\0\0\0\0k", 11);
        return;
    case RDZV_OP_CHECK:
    case RDZV_OP_WAIT:
    case RDZV_OP_MULTI_GET:
        ck_assert_uint_eq(r->count, 3);
        expect_item(&cur, "job/a", 5);
        expect_item(&cur, "bb", 2);
        expect_item(&cur, "", 0);
        ck_assert_ptr_eq(cur, r->items - 9 + r->frame_len);
        return;
    case RDZV_OP_MULTI_SET:
        ck_assert_uint_eq(r->count, 2);
        expect_item(&cur, "job/a", 5);
        expect_item(&cur, "1", 1);
        expect_item(&cur, "job/bb", 6);
        expect_item(&cur, "", 0);
        ck_assert_ptr_eq(cur, r->items - 9 + r->frame_len);
        return;
    case RDZV_OP_GETNUMKEYS:
    case RDZV_OP_CANCEL_WAIT:
    case RDZV_OP_LIST_KEYS:
    case RDZV_OP_STATUS:
        ck_assert_uint_eq(r->frame_len, 1);
        return;
    default:
        break;
    }
    ck_assert_uint_eq(r->key_len, 7);
    ck_assert_mem_eq(r->key, "job/key", 7);
    if (op == RDZV_OP_SET || op == RDZV_OP_APPEND || op == RDZV_OP_QUEUE_PUSH) {
        ck_assert_uint_eq(r->val_len, 4);
        ck_assert_mem_eq(r->val, "v\0al", 4);
    } else if (op == RDZV_OP_COMPARE_SET) {
        ck_assert_uint_eq(r->val_len, 0);
        ck_assert_uint_eq(r->val2_len, 3);
        ck_assert_mem_eq(r->val2, "new", 3);
    } else if (op == RDZV_OP_ADD || op == RDZV_OP_BARRIER) {
        ck_assert(r->i64 == INT64_MIN + 1);
    }
}

/*
 * Encode, then parse: every operation of both generations, all in one buffer per generation,
 * comes back from the parser with every field intact and the frames' lengths adding up.
 */
START_TEST(encode_parse_roundtrip)
{
    for (int g = RDZV_GEN_LEGACY; g <= RDZV_GEN_MODERN; g++) {
        rdzv__wbuf b = {0};
        int nops = 0;
        for (int op = 0; op < RDZV_OP_COUNT; op++) {
            if (rdzv__opcode(g, op) < 0)
                continue;
            encode_sample(&b, g, op);
            nops++;
        }
        ck_assert_int_eq(b.err, 0);
        ck_assert_int_eq(nops, g == RDZV_GEN_LEGACY ? 9 : RDZV_OP_COUNT - 1);

        rdzv__parser p;
        rdzv__parser_init(&p);
        p.gen = g;
        size_t off = 0;
        for (int op = 0; op < RDZV_OP_COUNT; op++) {
            if (rdzv__opcode(g, op) < 0)
                continue;
            rdzv__request r;
            int rc = rdzv__parse(&p, &lim, b.data + off, b.len - off, &r);
            ck_assert_msg(rc > 0, "gen %d op %s: %d", g, rdzv__op_name(op), rc);
            ck_assert_uint_eq(r.frame_len, (size_t)rc);
            expect_sample(&r, op);
            off += (size_t)rc;
        }
        ck_assert_uint_eq(off, b.len);
        rdzv__wbuf_free(&b);
    }
}
END_TEST

/* Growth keeps earlier bytes; reuse does not reallocate; failures stick until a reset. */
START_TEST(wbuf_growth_and_failures)
{
    rdzv__wbuf b = {0};
    uint8_t big[1000];
    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (uint8_t)i;

    rdzv__put_u8(&b, 7);
    ck_assert_ptr_nonnull(b.data);
    ck_assert_uint_eq(b.cap, 256);
    uint8_t *first = b.data;
    rdzv__wbuf_reset(&b);
    rdzv__put_raw(&b, big, 200);
    ck_assert_ptr_eq(b.data, first); /* fits: no allocation */
    rdzv__put_raw(&b, big, sizeof(big));
    ck_assert_uint_eq(b.len, 1200);
    ck_assert_uint_eq(b.cap, 2048);
    ck_assert_mem_eq(b.data, big, 200);
    ck_assert_mem_eq(b.data + 200, big, sizeof(big));

    /* A request larger than half the address space is refused before allocating. */
    ck_assert_int_eq(rdzv__wbuf_grow(&b, SIZE_MAX - 8), -EOVERFLOW);
    ck_assert_int_eq(b.err, -EOVERFLOW);
    rdzv__put_u8(&b, 1);
    ck_assert_uint_eq(b.len, 1200);
    ck_assert_int_eq(rdzv__wbuf_grow(&b, 1), -EOVERFLOW);
    rdzv__wbuf_reset(&b);
    rdzv__put_u8(&b, 9);
    ck_assert_int_eq(b.err, 0);
    ck_assert_uint_eq(b.len, 1);
    rdzv__wbuf_free(&b);
    ck_assert_ptr_null(b.data);
    ck_assert_uint_eq(b.cap, 0);
    rdzv__wbuf_free(&b); /* twice, and on a zeroed buffer: harmless */

    /* A fixed buffer fills exactly, then refuses without writing past its end. */
    uint8_t mem[10];
    memset(mem, 0xEE, sizeof(mem));
    b = rdzv__wbuf_fixed(mem, 9);
    rdzv__put_u8(&b, 1);
    rdzv__put_u64(&b, 2);
    ck_assert_int_eq(b.err, 0);
    ck_assert_uint_eq(b.len, 9);
    rdzv__put_u8(&b, 3);
    ck_assert_int_eq(b.err, -ENOBUFS);
    ck_assert_uint_eq(b.len, 9);
    ck_assert_uint_eq(mem[9], 0xEE);
    ck_assert_ptr_eq(b.data, mem);
    rdzv__wbuf_free(&b); /* empties it; the memory is the caller's */
    ck_assert_ptr_eq(b.data, mem);
    ck_assert_uint_eq(b.len, 0);
    ck_assert_int_eq(b.err, 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("proto");
    check_tcase(s, "parser", 0, detect_generation, every_opcode_every_split, pipelined, limits,
                malformed, resumable_progress);
    check_tcase(s, "encoder", 0, encode_literal_bytes, opcode_map, encode_parse_roundtrip,
                wbuf_growth_and_failures);
    return check_run(s);
}
