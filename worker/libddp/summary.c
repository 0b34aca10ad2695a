/*
 * summary.c: TensorBoard scalar event files (ddp.h, "TensorBoard summaries"), written without
 * TensorFlow or protobuf. A file is a sequence of TFRecords (little-endian u64 length, masked
 * CRC32C of those 8 bytes, the data, masked CRC32C of the data), each holding one serialised
 * tensorflow.Event message, encoded here by hand:
 *
 *   Event       { double wall_time = 1; int64 step = 2; string file_version = 3;
 *                 Summary summary = 5; SessionLog session_log = 7; }
 *   Summary     { repeated Value value = 1; }
 *   Value       { string tag = 1; float simple_value = 2; }
 *   SessionLog  { SessionStatus status = 1; }   (START = 1)
 *
 * Fields at their proto3 default (a zero step) are left out, as protobuf's own encoder does, so
 * the bytes are the ones TensorBoard's Python writer makes for the same event (tests/libddp/
 * test_summary.c holds such bytes).
 *
 * The encoders (ddp__summary_*) are pure and unit-tested; the writer appends each record with one
 * write(2), so a reader following the file never waits for a buffer to be flushed. Not here:
 * histograms, images, text, or reading event files.
 */
#include "summary.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h" /* ddp__crc32c(), ddp__make_dirs() */
#include "ddp.h"

/* ------------------------------------------------------------------------------------------ */
/* Encoding (pure)                                                                             */
/* ------------------------------------------------------------------------------------------ */

uint32_t ddp__summary_crc_mask(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/* A protobuf message being built in buf[cap]; len counts every byte asked for, so that a
 * buffer too small is detected once, at the end (len > cap). */
typedef struct pb {
    uint8_t *buf;
    size_t cap, len;
} pb;

static void put_byte(pb *b, uint8_t v)
{
    if (b->len < b->cap)
        b->buf[b->len] = v;
    b->len++;
}

static size_t varint_len(uint64_t v)
{
    size_t n = 1;
    for (; v >= 0x80; v >>= 7)
        n++;
    return n;
}

static void put_varint(pb *b, uint64_t v)
{
    for (; v >= 0x80; v >>= 7)
        put_byte(b, (uint8_t)(v | 0x80));
    put_byte(b, (uint8_t)v);
}

static void put_le(pb *b, uint64_t v, int nbytes)
{
    for (int i = 0; i < nbytes; i++)
        put_byte(b, (uint8_t)(v >> (8 * i)));
}

static void put_bytes(pb *b, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        put_byte(b, ((const uint8_t *)p)[i]);
}

/* Field keys: (field number << 3) | wire type (0 varint, 1 64-bit, 2 length-delimited, 5
 * 32-bit). */
enum {
    EV_WALL_TIME = 1 << 3 | 1,
    EV_STEP = 2 << 3 | 0,
    EV_FILE_VERSION = 3 << 3 | 2,
    EV_SUMMARY = 5 << 3 | 2,
    EV_SESSION_LOG = 7 << 3 | 2,
    SUMMARY_VALUE = 1 << 3 | 2,
    VALUE_TAG = 1 << 3 | 2,
    VALUE_SIMPLE = 2 << 3 | 5,
    SESSION_STATUS = 1 << 3 | 0,
};

/* The fields every event starts with. */
static void put_head(pb *b, double wall_time, int64_t step)
{
    uint64_t bits;
    memcpy(&bits, &wall_time, 8);
    put_byte(b, EV_WALL_TIME);
    put_le(b, bits, 8);
    if (step != 0) {
        put_byte(b, EV_STEP);
        put_varint(b, (uint64_t)step); /* int64: a negative step takes ten bytes */
    }
}

size_t ddp__summary_event(uint8_t *buf, size_t cap, const ddp__summary_ev *ev)
{
    pb b = {buf, cap, 0};
    put_head(&b, ev->wall_time, ev->step);
    switch (ev->kind) {
    case DDP__EV_FILE_VERSION: {
        size_t n = strlen(ev->text);
        put_byte(&b, EV_FILE_VERSION);
        put_varint(&b, n);
        put_bytes(&b, ev->text, n);
        break;
    }
    case DDP__EV_SCALAR: {
        size_t ntag = strlen(ev->text);
        /* Value: tag (key, length, bytes), simple_value (key, 4 bytes). */
        size_t value_len = 1 + varint_len(ntag) + ntag + 1 + 4;
        size_t summary_len = 1 + varint_len(value_len) + value_len;
        uint32_t bits;
        memcpy(&bits, &ev->value, 4);
        put_byte(&b, EV_SUMMARY);
        put_varint(&b, summary_len);
        put_byte(&b, SUMMARY_VALUE);
        put_varint(&b, value_len);
        put_byte(&b, VALUE_TAG);
        put_varint(&b, ntag);
        put_bytes(&b, ev->text, ntag);
        put_byte(&b, VALUE_SIMPLE);
        put_le(&b, bits, 4);
        break;
    }
    case DDP__EV_SESSION_START:
        put_byte(&b, EV_SESSION_LOG);
        put_varint(&b, 2);
        put_byte(&b, SESSION_STATUS);
        put_varint(&b, 1); /* SessionLog.START */
        break;
    }
    return b.len;
}

size_t ddp__summary_record(uint8_t *buf, size_t cap, const uint8_t *data, size_t n)
{
    size_t need = 8 + 4 + n + 4;
    if (need > cap)
        return need;
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)((uint64_t)n >> (8 * i));
    uint32_t crc_len = ddp__summary_crc_mask(ddp__crc32c(0, len, 8));
    uint32_t crc_data = ddp__summary_crc_mask(ddp__crc32c(0, data, n));
    memmove(buf + 12, data, n); /* data may already sit at buf + 12 */
    memcpy(buf, len, 8);
    for (int i = 0; i < 4; i++) {
        buf[8 + i] = (uint8_t)(crc_len >> (8 * i));
        buf[12 + n + i] = (uint8_t)(crc_data >> (8 * i));
    }
    return need;
}

/* ------------------------------------------------------------------------------------------ */
/* The writer                                                                                  */
/* ------------------------------------------------------------------------------------------ */

/* A tag's longest length, and so the largest record: the event around it takes < 64 bytes. */
#define TAG_MAX 1024
#define RECORD_MAX (TAG_MAX + 128)

struct ddp_summary {
    int fd;
    off_t size; /* bytes of whole records written: a failed write is cut back to it */
    char path[PATH_MAX];
};

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Appends one event as a record; on failure the file is cut back to its last whole record. */
static int write_event(ddp_summary *s, const ddp__summary_ev *ev)
{
    uint8_t rec[RECORD_MAX];
    size_t n = ddp__summary_event(rec + 12, sizeof rec - 16, ev);
    if (n > sizeof rec - 16)
        return -ENAMETOOLONG;
    n = ddp__summary_record(rec, sizeof rec, rec + 12, n);
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(s->fd, rec + done, n - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int rc = w < 0 ? -errno : -EIO;
            if (done > 0 && ftruncate(s->fd, s->size) < 0)
                rc = -EIO; /* a torn record stays: nothing more can be appended safely */
            return rc;
        }
        done += (size_t)w;
    }
    s->size += (off_t)n;
    return 0;
}

/*
 * The seconds to put in a new event file's name in `logdir`: `now`, or one more than the latest
 * file there when that is not earlier. TensorBoard reads a directory's files in name order, and
 * one that sorts before an earlier writer's (two attempts in the same second, told apart by pid)
 * would be read first and its later steps taken for orphans.
 */
static int64_t name_seconds(const char *logdir, int64_t now)
{
    static const char prefix[] = "events.out.tfevents.";
    DIR *d = opendir(logdir);
    int64_t t = now;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, sizeof prefix - 1) != 0)
            continue;
        long long seen = strtoll(e->d_name + sizeof prefix - 1, NULL, 10);
        if (seen >= t)
            t = (int64_t)seen + 1;
    }
    if (d)
        closedir(d);
    return t;
}

int ddp_summary_open(const char *logdir, int64_t start_step, ddp_summary **out)
{
    static atomic_int serial;
    if (!logdir || !*logdir || !out)
        return -EINVAL;
    int rc = ddp__make_dirs(logdir);
    if (rc < 0)
        return rc;
    ddp_summary *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->fd = -1;
    char host[256] = "localhost";
    if (gethostname(host, sizeof host) < 0 || !host[0])
        snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    for (char *p = host; *p; p++) /* a file name: no separators */
        if (*p == '/')
            *p = '_';
    double now = wall_now();
    int64_t secs = name_seconds(logdir, (int64_t)now);
    /* TensorFlow's name, with a serial number that makes it unique within the process. */
    for (int tries = 0; s->fd < 0; tries++) {
        int len =
            snprintf(s->path, sizeof s->path, "%s/events.out.tfevents.%010" PRId64 ".%s.%ld.%d",
                     logdir, secs, host, (long)getpid(), atomic_fetch_add(&serial, 1));
        if (len < 0 || (size_t)len >= sizeof s->path) {
            rc = -ENAMETOOLONG;
            goto out;
        }
        s->fd = open(s->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0666);
        if (s->fd < 0 && (errno != EEXIST || tries == 100)) {
            rc = -errno;
            goto out;
        }
    }
    ddp__summary_ev ev = {DDP__EV_FILE_VERSION, now, 0, "brain.Event:2", 0};
    if ((rc = write_event(s, &ev)) < 0)
        goto out;
    if (start_step >= 0) {
        ev = (ddp__summary_ev){DDP__EV_SESSION_START, now, start_step, NULL, 0};
        rc = write_event(s, &ev);
    }
out:
    if (rc < 0) {
        if (s->fd >= 0) {
            close(s->fd);
            unlink(s->path);
        }
        free(s);
        return rc;
    }
    *out = s;
    return 0;
}

int ddp_summary_scalar(ddp_summary *s, const char *tag, int64_t step, double value)
{
    if (!s || !tag || !*tag)
        return -EINVAL;
    if (strlen(tag) > TAG_MAX)
        return -ENAMETOOLONG;
    ddp__summary_ev ev = {DDP__EV_SCALAR, wall_now(), step, tag, (float)value};
    return write_event(s, &ev);
}

const char *ddp_summary_path(const ddp_summary *s)
{
    return s ? s->path : NULL;
}

int ddp_summary_close(ddp_summary *s)
{
    if (!s)
        return 0;
    int rc = close(s->fd) < 0 ? -errno : 0;
    free(s);
    return rc;
}
