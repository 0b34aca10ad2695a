/*
 * Tests of libddp's TensorBoard writer (worker/libddp/summary.c). The encoders against the bytes
 * TensorBoard's own Python writer makes for the same events (tensorboard 2.21:
 * event_pb2.Event(...).SerializeToString() framed by summary.writer.record_writer.RecordWriter,
 * and its masked_crc32c()): a file-version event, a scalar, a session start, a negative step
 * and a tag long enough for two-byte lengths. Then the writer on a temporary directory: the
 * file's name, its records read back and checked (lengths, CRCs, the events in order), and the
 * refusals (bad arguments, a long tag, a directory that cannot be made).
 */
#include <check.h>

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "ckpt.h"
#include "ddp.h"
#include "summary.h"

/* Frames an event as the writer does; returns the record's length. */
static size_t framed(uint8_t *rec, size_t cap, const ddp__summary_ev *ev)
{
    size_t n = ddp__summary_event(rec + 12, cap - 16, ev);
    ck_assert_uint_le(n, cap - 16);
    return ddp__summary_record(rec, cap, rec + 12, n);
}

static void assert_bytes(const uint8_t *got, size_t ngot, const uint8_t *want, size_t nwant)
{
    ck_assert_uint_eq(ngot, nwant);
    for (size_t i = 0; i < nwant; i++)
        ck_assert_msg(got[i] == want[i], "byte %zu: 0x%02x, expected 0x%02x", i, got[i], want[i]);
}

START_TEST(test_crc_mask)
{
    ck_assert_uint_eq(ddp__summary_crc_mask(0), 0xa282ead8u);
    ck_assert_uint_eq(ddp__summary_crc_mask(ddp__crc32c(0, "123456789", 9)), 0xc78ab0e5u);
}
END_TEST

/* Events and their records as TensorBoard's writer frames them. */
static const uint8_t want_version[] = {0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xa3, 0x7f,
                                       0x4b, 0x22, 0x09, 0x00, 0x00, 0x20, 0x40, 0xfc, 0x54, 0xd9,
                                       0x41, 0x1a, 0x0d, 0x62, 0x72, 0x61, 0x69, 0x6e, 0x2e, 0x45,
                                       0x76, 0x65, 0x6e, 0x74, 0x3a, 0x32, 0x2b, 0x35, 0x31, 0x10};
static const uint8_t want_scalar[] = {
    0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x29, 0xed, 0xa9, 0x50, 0x09, 0x00, 0x00, 0x50,
    0x40, 0xfc, 0x54, 0xd9, 0x41, 0x10, 0x2a, 0x2a, 0x13, 0x0a, 0x11, 0x0a, 0x0a, 0x74, 0x72, 0x61,
    0x69, 0x6e, 0x2f, 0x6c, 0x6f, 0x73, 0x73, 0x15, 0x00, 0x00, 0x00, 0x3f, 0x86, 0x15, 0x16, 0x73};
static const uint8_t want_start[] = {
    0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x95, 0xfb, 0xfe, 0x18, 0x09, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x40, 0x10, 0xac, 0x02, 0x3a, 0x02, 0x08, 0x01, 0x12, 0x92, 0xda, 0x01};
static const struct {
    ddp__summary_ev ev;
    const uint8_t *want;
    size_t n;
} cases[] = {
    {{DDP__EV_FILE_VERSION, 1700000000.5, 0, "brain.Event:2", 0},
     want_version,
     sizeof want_version},
    {{DDP__EV_SCALAR, 1700000001.25, 42, "train/loss", 0.5f}, want_scalar, sizeof want_scalar},
    {{DDP__EV_SESSION_START, 2.0, 300, NULL, 0}, want_start, sizeof want_start},
};

/* Loop test over cases[]: the file version, a scalar at step 42, a session start at 300. */
START_TEST(test_event)
{
    uint8_t rec[256];
    size_t n = framed(rec, sizeof rec, &cases[_i].ev);
    assert_bytes(rec, n, cases[_i].want, cases[_i].n);
}
END_TEST

/* Step -1 (a ten-byte varint) and a 200-byte tag (two-byte lengths): protobuf's 234 bytes. */
START_TEST(test_negative_step_long_tag)
{
    char tag[201];
    memset(tag, 't', 200);
    tag[200] = 0;
    uint8_t msg[512];
    ddp__summary_ev ev = {DDP__EV_SCALAR, 3.0, -1, tag, -1.5f};
    size_t n = ddp__summary_event(msg, sizeof msg, &ev);
    ck_assert_uint_eq(n, 234);
    static const uint8_t head[] = {0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x08, 0x40,
                                   0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                   0xff, 0x01, 0x2a, 0xd3, 0x01, 0x0a, 0xd0, 0x01};
    static const uint8_t tail[] = {0x74, 0x74, 0x74, 0x15, 0x00, 0x00, 0xc0, 0xbf};
    assert_bytes(msg, sizeof head, head, sizeof head);
    assert_bytes(msg + n - sizeof tail, sizeof tail, tail, sizeof tail);
    /* Too small a buffer: the length needed, nothing written past cap. */
    uint8_t small[16] = {0};
    ck_assert_uint_eq(ddp__summary_event(small, 8, &ev), 234);
    for (size_t i = 8; i < sizeof small; i++)
        ck_assert_uint_eq(small[i], 0);
    ck_assert_uint_eq(ddp__summary_record(small, sizeof small, msg, n), n + 16);
}
END_TEST

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/test_summary_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* Reads the record at *off in buf[n], checking its framing; returns its data and length. */
static const uint8_t *next_record(const uint8_t *buf, size_t n, size_t *off, size_t *len)
{
    ck_assert_uint_le(*off + 12, n);
    uint64_t l = 0;
    for (int i = 0; i < 8; i++)
        l |= (uint64_t)buf[*off + i] << (8 * i);
    uint32_t crc_len = 0, crc_data = 0;
    for (int i = 0; i < 4; i++) {
        crc_len |= (uint32_t)buf[*off + 8 + i] << (8 * i);
        crc_data |= (uint32_t)buf[*off + 12 + l + i] << (8 * i);
    }
    ck_assert_uint_le(*off + 16 + l, n);
    ck_assert_uint_eq(crc_len, ddp__summary_crc_mask(ddp__crc32c(0, buf + *off, 8)));
    ck_assert_uint_eq(crc_data, ddp__summary_crc_mask(ddp__crc32c(0, buf + *off + 12, l)));
    const uint8_t *data = buf + *off + 12;
    *len = (size_t)l;
    *off += 16 + l;
    return data;
}

START_TEST(test_writer)
{
    char logdir[128];
    snprintf(logdir, sizeof logdir, "%s/runs/a", dir); /* parents made too */
    ddp_summary *s = NULL;
    ck_assert_int_eq(ddp_summary_open(logdir, 5, &s), 0);
    const char *path = ddp_summary_path(s);
    ck_assert_ptr_nonnull(path);
    ck_assert_msg(strncmp(path, logdir, strlen(logdir)) == 0 &&
                      strncmp(path + strlen(logdir), "/events.out.tfevents.", 21) == 0,
                  "%s", path);
    char host[256] = "";
    gethostname(host, sizeof host);
    ck_assert_ptr_nonnull(strstr(path, host));
    ck_assert_int_eq(ddp_summary_scalar(s, "train/loss", 5, 2.25), 0);
    ck_assert_int_eq(ddp_summary_scalar(s, "train/lr", 6, 1e-3), 0);
    char long_tag[1100];
    memset(long_tag, 'x', sizeof long_tag - 1);
    long_tag[sizeof long_tag - 1] = 0;
    ck_assert_int_eq(ddp_summary_scalar(s, long_tag, 7, 1), -ENAMETOOLONG);
    ck_assert_int_eq(ddp_summary_scalar(s, "", 7, 1), -EINVAL);
    ck_assert_int_eq(ddp_summary_scalar(NULL, "a", 7, 1), -EINVAL);

    /* A second writer in the same directory gets a file of its own. */
    ddp_summary *s2 = NULL;
    ck_assert_int_eq(ddp_summary_open(logdir, -1, &s2), 0);
    ck_assert_str_ne(ddp_summary_path(s2), path);

    uint8_t buf[4096];
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    size_t off = 0, len;
    /* file_version, session start at 5, two scalars, and nothing else. */
    const uint8_t *d = next_record(buf, n, &off, &len);
    ck_assert_uint_eq(d[9], 0x1a); /* after wall_time: file_version, step 0 left out */
    ck_assert(len == 24 && memcmp(d + 11, "brain.Event:2", 13) == 0);
    d = next_record(buf, n, &off, &len);
    ck_assert(len == 15 && d[9] == 0x10 && d[10] == 5 && d[11] == 0x3a);
    d = next_record(buf, n, &off, &len);
    ck_assert(d[9] == 0x10 && d[10] == 5 && memmem(d, len, "train/loss", 10));
    float v;
    memcpy(&v, d + len - 4, 4);
    ck_assert(v == 2.25f);
    d = next_record(buf, n, &off, &len);
    ck_assert(d[10] == 6 && memmem(d, len, "train/lr", 8));
    memcpy(&v, d + len - 4, 4);
    ck_assert(v == 1e-3f);
    ck_assert_uint_eq(off, n);

    ck_assert_int_eq(ddp_summary_close(s), 0);
    ck_assert_int_eq(ddp_summary_close(s2), 0);
    ck_assert_int_eq(ddp_summary_close(NULL), 0);
    ck_assert_ptr_null(ddp_summary_path(NULL));
}
END_TEST

START_TEST(test_open_refusals)
{
    ddp_summary *s = (ddp_summary *)&s;
    ck_assert_int_eq(ddp_summary_open(NULL, 0, &s), -EINVAL);
    ck_assert_int_eq(ddp_summary_open("", 0, &s), -EINVAL);
    ck_assert_int_eq(ddp_summary_open(dir, 0, NULL), -EINVAL);
    char file[128];
    snprintf(file, sizeof file, "%s/plain", dir);
    FILE *f = fopen(file, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    char under[160];
    snprintf(under, sizeof under, "%s/sub", file);
    ck_assert_int_eq(ddp_summary_open(under, 0, &s), -ENOTDIR);
    ck_assert_ptr_eq(s, (ddp_summary *)&s); /* untouched on failure */
}
END_TEST

int main(void)
{
    Suite *s = suite_create("summary");
    TCase *enc = check_tcase(s, "encoding", 0, test_crc_mask, test_negative_step_long_tag);
    tcase_add_loop_test(enc, test_event, 0, sizeof cases / sizeof cases[0]);
    TCase *tc = check_tcase(s, "writer", 0, test_writer, test_open_refusals);
    tcase_add_checked_fixture(tc, setup, teardown);
    return check_run(s);
}
