/*
 * Tests of the programs' safetensors reader and writer (worker/trainer/safetensors.c): a file written by
 * st_write() reads back equal, and malformed input of every kind the format can be wrong in
 * (header length, JSON, dtype, shape, offsets out of range, gaps, overlaps, trailing bytes,
 * metadata) is refused with a sentence naming the problem, never read out of bounds (the
 * sanitizer setup runs this too). Files from the Python package are checked by
 * tests/tools/ddp_ckpt_cli.sh.
 */
#include <check.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "safetensors.h"
#include "check_main.h"

/* A malloc'ed file image: the 8-byte length of `hdr`, hdr, then `ndata` bytes 0, 1, 2, .... */
static void *image(const char *hdr, uint64_t claimed_len, size_t ndata, size_t *len)
{
    size_t h = strlen(hdr);
    unsigned char *b = malloc(8 + h + ndata + 1);
    ck_assert_ptr_nonnull(b);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(claimed_len >> (8 * i));
    memcpy(b + 8, hdr, h);
    for (size_t i = 0; i < ndata; i++)
        b[8 + h + i] = (unsigned char)i;
    *len = 8 + h + ndata;
    return b;
}

/* Parses hdr + ndata bytes; returns st_parse()'s code (the file freed). */
static int parse(const char *hdr, size_t ndata)
{
    size_t len;
    void *b = image(hdr, strlen(hdr), ndata, &len);
    st_file f;
    int rc = st_parse(b, len, "x.safetensors", &f);
    if (rc == 0)
        st_file_free(&f);
    return rc;
}

/* Expects -EPROTO and an error sentence containing `words`. */
#define BAD(hdr, ndata, words)                                                                     \
    do {                                                                                           \
        ck_assert_int_eq(parse(hdr, ndata), -EPROTO);                                              \
        ck_assert_msg(strstr(st_last_error(), "x.safetensors") && strstr(st_last_error(), words),  \
                      "error '%s' lacks '%s'", st_last_error(), words);                            \
    } while (0)

START_TEST(test_round_trip)
{
    char path[] = "/tmp/test_safetensors_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    float w[6] = {1, 2, 3, 4, 5, 6}, b[2] = {-1, 0.5f};
    uint8_t u[3] = {7, 8, 9};
    st_tensor ts[] = {
        {"fc1.weight", "F32", 2, {2, 3}, w, sizeof w},
        {"fc1.bias", "F32", 1, {2}, b, sizeof b},
        {"label", "U8", 1, {3}, u, sizeof u},
    };
    const char *meta[] = {"format", "test", "step", "7", NULL};
    ck_assert_int_eq(st_write(path, ts, 3, meta), 0);
    st_file f;
    ck_assert_int_eq(st_read(path, &f), 0);
    unlink(path);
    ck_assert_int_eq(f.ntensors, 3);
    /* In the file's (data-offset) order, which is the order written. */
    for (int i = 0; i < 3; i++) {
        ck_assert_str_eq(f.tensors[i].name, ts[i].name);
        ck_assert_str_eq(f.tensors[i].dtype, ts[i].dtype);
        ck_assert_int_eq(f.tensors[i].ndim, ts[i].ndim);
        ck_assert_uint_eq(f.tensors[i].nbytes, ts[i].nbytes);
        ck_assert_mem_eq(f.tensors[i].data, ts[i].data, ts[i].nbytes);
    }
    ck_assert_int_eq(f.tensors[0].shape[1], 3);
    ck_assert_int_eq(f.nmeta, 2);
    ck_assert_str_eq(f.meta[0], "format");
    ck_assert_str_eq(f.meta[3], "7");
    st_file_free(&f);
    st_file_free(&f); /* zeroed: a no-op */

    /* The writer refuses a size that does not match the shape. */
    ts[1].nbytes = 4;
    ck_assert_int_eq(st_write(path, ts, 3, NULL), -EINVAL);
    ck_assert_ptr_nonnull(strstr(st_last_error(), "fc1.bias"));
    ck_assert_int_eq(access(path, F_OK), -1);
}
END_TEST

START_TEST(test_valid_edge_cases)
{
    /* No tensors, metadata only; a scalar; an empty tensor; header padded with spaces. */
    ck_assert_int_eq(parse("{\"__metadata__\":{\"a\":\"b\"}}", 0), 0);
    ck_assert_int_eq(parse("{}", 0), 0);
    ck_assert_int_eq(parse("{\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]}}   ", 8),
                     0);
    ck_assert_int_eq(parse("{\"e\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[0,0]},"
                           "\"x\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}",
                           4),
                     0);
    /* Out of key order in the header, in offset order in the result. */
    size_t len;
    void *b = image("{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]},"
                    "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
                    0, 3, &len);
    unsigned char *bb = b;
    size_t h = len - 8 - 3;
    for (int i = 0; i < 8; i++)
        bb[i] = (unsigned char)((uint64_t)h >> (8 * i));
    st_file f;
    ck_assert_int_eq(st_parse(b, len, "x.safetensors", &f), 0);
    ck_assert_str_eq(f.tensors[0].name, "a");
    ck_assert_str_eq(f.tensors[1].name, "b");
    ck_assert_uint_eq(((const uint8_t *)f.tensors[1].data)[0], 1);
    st_file_free(&f);
}
END_TEST

START_TEST(test_bad_header_length)
{
    size_t len;
    st_file f;
    /* Shorter than the length field. */
    void *b = malloc(5);
    ck_assert_int_eq(st_parse(b, 5, "x.safetensors", &f), -EPROTO);
    ck_assert_ptr_nonnull(strstr(st_last_error(), "too short"));
    /* A length beyond the file, and one beyond the format's limit; each of 2^64 - 1 too. */
    uint64_t lens[] = {1000, ST_MAX_HEADER_BYTES + 1, UINT64_MAX};
    for (int i = 0; i < 3; i++) {
        b = image("{}", lens[i], 0, &len);
        ck_assert_int_eq(st_parse(b, len, "x.safetensors", &f), -EPROTO);
        ck_assert_ptr_nonnull(strstr(st_last_error(), "header length"));
    }
    /* Zero, and a header that is not an object. */
    b = image("{}", 0, 0, &len);
    ck_assert_int_eq(st_parse(b, len, "x.safetensors", &f), -EPROTO);
    BAD("[1, 2]", 0, "start with '{'");
    BAD("{\"a\": ", 0, "not a JSON object");
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},"
        "\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}",
        0, "duplicate");
}
END_TEST

START_TEST(test_bad_tensors)
{
    BAD("{\"t\":3}", 0, "'t': not a JSON object");
    BAD("{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "'t': \"dtype\" missing");
    BAD("{\"t\":{\"dtype\":\"F31\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
        "unknown dtype 'F31'");
    BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "shape[0]");
    BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, "shape[0]");
    BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
        "dimensions");
    BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "two integers");
    BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[\"0\",4]}}", 4, "two integers");
    /* Offsets out of range: beyond the data, negative, reversed. */
    BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 3, "out of range");
    BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4, "out of range");
    BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "out of range");
    BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,9223372036854775807]}}", 4,
        "out of range");
    /* The span does not match the shape, including a shape whose size overflows. */
    BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[0,40]}}", 40,
        "hold 40 bytes, F32 (3, 4) needs 48");
    BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4,
        "needs more than");
    /* Tiling: a gap, an overlap, trailing bytes. */
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
        "\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]}}",
        3, "'b' begins at data byte 2, expected 1");
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
        "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}",
        3, "begins at data byte 1, expected 2");
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 2,
        "cover 1 bytes of data, the file holds 2");
    /* Metadata. */
    BAD("{\"__metadata__\":[1]}", 0, "\"__metadata__\" is not a JSON object");
    BAD("{\"__metadata__\":{\"a\":1}}", 0, "\"a\" is not a string");
}
END_TEST

START_TEST(test_read_errors)
{
    st_file f;
    ck_assert_int_eq(st_read("/nonexistent/x.safetensors", &f), -ENOENT);
    ck_assert_ptr_nonnull(strstr(st_last_error(), "/nonexistent/x.safetensors"));
    ck_assert_int_eq(st_read("/tmp", &f), -EINVAL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("safetensors");
    check_tcase(s, "safetensors", 0, test_round_trip, test_valid_edge_cases, test_bad_header_length,
                test_bad_tensors, test_read_errors);
    return check_run(s);
}
