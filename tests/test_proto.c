/*
 * Unit tests of the request parser: every opcode of both generations, generation detection,
 * frames split at every byte boundary, pipelined frames, limits and malformed input.
 */
#include "frames.h"
#include "proto.h"

#include <check.h>

static const rdzv__limits lim = {.max_key_bytes = 64,
                                 .max_value_bytes = 1024,
                                 .max_keys_per_request = 16,
                                 .max_request_bytes = 4096};

/* Parses one complete frame from a fresh (or given) parser; returns the parse result. */
static int parse_all(rdzv__parser *p, const frame *f, rdzv__request *req)
{
    return rdzv__parse(p, &lim, f->p, f->n, req);
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
    ck_assert_int_eq(parse_all(&p, &f, &r), (int)f.n);
    ck_assert_int_eq(p.gen, RDZV_GEN_LEGACY);
    ck_assert_int_eq(r.op, RDZV_OP_SET);
    ck_assert_int_eq(r.key_len, 2);
    ck_assert_mem_eq(r.key, "/a", 2);
    ck_assert_int_eq(r.val_len, 1);

    /* Opcode 0 with fewer than five bytes cannot be decided yet. */
    rdzv__parser_init(&p);
    ck_assert_int_eq(rdzv__parse(&p, &lim, f.p, 4, &r), 0);
    ck_assert_int_eq(p.gen, RDZV_GEN_UNKNOWN);

    /* A first opcode other than 0 is legacy: 3 is ADD there (GET in the modern numbering). */
    fr_reset(&f);
    fr_u8(&f, RDZV_L_ADD);
    fr_str(&f, "c");
    fr_u64(&f, (uint64_t)-5);
    rdzv__parser_init(&p);
    ck_assert_int_eq(parse_all(&p, &f, &r), (int)f.n);
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
               : op == RDZV_OP_STATUS ? RDZV_M_STATUS
                                      : (int)op;
    fr_u8(f, (uint8_t)code);
    switch (op) {
    case RDZV_OP_VALIDATE:
        fr_u32(f, RDZV_VALIDATE_MAGIC);
        break;
    case RDZV_OP_PING:
        fr_u32(f, 0x1234);
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
            for (size_t split = 1; split <= f.n; split++) {
                rdzv__parser p = g == RDZV_GEN_MODERN ? modern_parser() : (rdzv__parser){0};
                if (g == RDZV_GEN_LEGACY) {
                    rdzv__parser_init(&p);
                    p.gen = RDZV_GEN_LEGACY;
                }
                rdzv__request r;
                int rc = 0;
                /* Deliver byte by byte up to the split, then the rest at once. */
                for (size_t n = 1; n < split; n++) {
                    rc = rdzv__parse(&p, &lim, f.p, n, &r);
                    ck_assert_msg(rc == 0, "gen %d op %s: early result %d at %zu", g,
                                  rdzv__op_name(op), rc, n);
                }
                rc = rdzv__parse(&p, &lim, f.p, f.n, &r);
                ck_assert_msg(rc == (int)f.n, "gen %d op %s split %zu: %d", g, rdzv__op_name(op),
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
                    ck_assert_ptr_eq(cur, f.p + f.n);
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
    while (off < f.n) {
        rdzv__request r;
        int rc = rdzv__parse(&p, &lim, f.p + off, f.n - off, &r);
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
    ck_assert_int_eq(parse_all(&p, &f, &r), (int)f.n);
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
    for (size_t n = 1; n < f.n; n++) {
        ck_assert_int_eq(rdzv__parse(&p, &lim, f.p, n, &r), 0);
        ck_assert_uint_ge(p.pos, last);
        last = p.pos;
    }
    ck_assert_int_eq(rdzv__parse(&p, &lim, f.p, f.n, &r), (int)f.n);
    ck_assert_int_eq(r.count, 16);
    fr_free(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("proto");
    TCase *tc = tcase_create("parser");
    tcase_add_test(tc, detect_generation);
    tcase_add_test(tc, every_opcode_every_split);
    tcase_add_test(tc, pipelined);
    tcase_add_test(tc, limits);
    tcase_add_test(tc, malformed);
    tcase_add_test(tc, resumable_progress);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
