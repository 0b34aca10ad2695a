/*
 * summary.h: the pure encoders behind libddp's TensorBoard writer (summary.c), for its unit test
 * (tests/libddp/test_summary.c). Internal: not installed.
 */
#ifndef DDP_SUMMARY_INTERNAL_H
#define DDP_SUMMARY_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* The events the writer makes. */
typedef enum ddp__summary_kind {
    DDP__EV_FILE_VERSION = 0, /* Event.file_version = text (a file's first event) */
    DDP__EV_SCALAR,           /* Event.summary = Summary{Value{tag = text, simple_value = value}} */
    DDP__EV_SESSION_START,    /* Event.session_log = SessionLog{status = START} */
} ddp__summary_kind;

typedef struct ddp__summary_ev {
    ddp__summary_kind kind;
    double wall_time; /* Unix seconds */
    int64_t step;     /* left out of the encoding when 0 (proto3's default) */
    const char *text; /* the file version or the tag (borrowed); unused for SESSION_START */
    float value;      /* SCALAR's */
} ddp__summary_ev;

/* TFRecord's CRC mask: rotate right by 15 bits and add 0xa282ead8. */
uint32_t ddp__summary_crc_mask(uint32_t crc);

/* Serialises *ev (a tensorflow.Event message) into buf[cap]. Returns the message's length, which
 * is more than cap (and buf's content unspecified) when it does not fit. */
size_t ddp__summary_event(uint8_t *buf, size_t cap, const ddp__summary_ev *ev);

/* Frames n bytes of data as one TFRecord in buf[cap]: u64 length (little-endian), masked CRC32C
 * of the length's 8 bytes, the data, masked CRC32C of the data. data may be buf + 12 (framing in
 * place). Returns the record's length (n + 16); when that is more than cap, buf is untouched. */
size_t ddp__summary_record(uint8_t *buf, size_t cap, const uint8_t *data, size_t n);

#endif /* DDP_SUMMARY_INTERNAL_H */
