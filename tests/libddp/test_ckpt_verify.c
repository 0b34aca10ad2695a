/*
 * Tests of ddp__ckpt_verify_shard() (worker/libddp/ckpt_verify.c) on shard files made here, described
 * by a manifest built by hand (the parser has its own tests): an intact file of several chunks
 * (the last one short), then a flipped byte in the middle chunk, a truncated file, a longer
 * file, a missing file, an empty shard, and a whole-file CRC that disagrees with intact chunks:
 * each gets its code and a sentence naming the file and, for a CRC mismatch, the byte range.
 */
#include <check.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "check_main.h"

#define CHUNK 1000
#define BYTES 2500 /* chunks [0, 1000), [1000, 2000), [2000, 2500) */

static char dir[64];
static unsigned char data[BYTES];
static uint32_t chunks[3];
static ddp__ckpt_manifest mf;
static ddp__ckpt_shard shard;
static char path[256];

static void write_file(const unsigned char *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(buf, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
}

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/test_ckpt_verify_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    for (size_t i = 0; i < BYTES; i++)
        data[i] = (unsigned char)(i * 7 + 3);
    for (int c = 0; c < 3; c++)
        chunks[c] = ddp__crc32c(0, data + c * CHUNK, c < 2 ? CHUNK : BYTES - 2 * CHUNK);
    shard = (ddp__ckpt_shard){.file = "shard-00000-of-00001.bin",
                              .bytes = BYTES,
                              .crc32c = ddp__crc32c(0, data, BYTES),
                              .chunks = chunks,
                              .nchunks = 3};
    mf = (ddp__ckpt_manifest){.dir = dir, .world = 1, .chunk_bytes = CHUNK, .shards = &shard};
    snprintf(path, sizeof path, "%s/%s", dir, shard.file);
    write_file(data, BYTES);
}

static void teardown(void)
{
    unlink(path);
    rmdir(dir);
}

/* Expects `code` and an error naming the file and containing `words`. */
static void expect(int code, const char *words)
{
    char err[512] = "";
    ck_assert_int_eq(ddp__ckpt_verify_shard(&mf, 0, err, sizeof err), code);
    ck_assert_msg(strstr(err, path) && strstr(err, words), "error '%s' lacks '%s'", err, words);
}

START_TEST(test_intact)
{
    char err[256] = "";
    ck_assert_int_eq(ddp__ckpt_verify_shard(&mf, 0, err, sizeof err), 0);
    ck_assert_int_eq(ddp__ckpt_verify_shard(&mf, 0, NULL, 0), 0);
    ck_assert_int_eq(ddp__ckpt_verify_shard(&mf, 1, err, sizeof err), -EINVAL);
    ck_assert_int_eq(ddp__ckpt_verify_shard(NULL, 0, err, sizeof err), -EINVAL);
}
END_TEST

START_TEST(test_flipped_byte)
{
    unsigned char bad[BYTES];
    memcpy(bad, data, BYTES);
    bad[1500] ^= 0x10;
    write_file(bad, BYTES);
    expect(-EBADMSG, "CRC32C mismatch in bytes [1000, 2000)");
    /* In the short last chunk. */
    memcpy(bad, data, BYTES);
    bad[BYTES - 1] ^= 1;
    write_file(bad, BYTES);
    expect(-EBADMSG, "[2000, 2500)");
}
END_TEST

START_TEST(test_wrong_size)
{
    write_file(data, BYTES - 1);
    expect(-EPROTO, "2499 bytes, the manifest says 2500 (truncated)");
    unsigned char more[BYTES + 1];
    memcpy(more, data, BYTES);
    more[BYTES] = 0;
    write_file(more, BYTES + 1);
    expect(-EPROTO, "too long");
}
END_TEST

START_TEST(test_missing)
{
    unlink(path);
    expect(-ENOENT, "missing");
}
END_TEST

START_TEST(test_whole_crc)
{
    shard.crc32c ^= 1;
    expect(-EBADMSG, "whole file");
}
END_TEST

START_TEST(test_empty)
{
    write_file(data, 0);
    shard.bytes = 0;
    shard.nchunks = 0;
    shard.crc32c = 0;
    char err[256] = "";
    ck_assert_int_eq(ddp__ckpt_verify_shard(&mf, 0, err, sizeof err), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ckpt_verify");
    TCase *tc = check_tcase(s, "verify", 0, test_intact, test_flipped_byte, test_wrong_size,
                            test_missing, test_whole_crc, test_empty);
    tcase_add_checked_fixture(tc, setup, teardown);
    return check_run(s);
}
