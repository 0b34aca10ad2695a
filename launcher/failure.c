/*
 * Failure records (failure.h): building one, and its JSON encoding through jansson. The agent
 * (ddprun.c) makes every record with ddprun_failure_init(), sends it with ddprun_failure_to_json()
 * and reads other nodes' with ddprun_failure_from_json(), so a record means the same on every
 * node.
 *
 * The stderr tail and the words for an exit and a node live here too, pure, so that the summary's
 * text is tested without processes.
 *
 * Deliberately not here: the store (noderdzv.c publishes and waits for the text), printing the
 * summary, reading a worker's error file (ddprun.c). Out-parameters are written only on success.
 */
#include "failure.h"

#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

void ddprun_failure_init(ddprun_failure *f, const char *node, int rank, int local_rank,
                         int exit_code, int pid, const char *message)
{
    struct timespec ts;
    /* The wall clock on purpose: see ddprun_failure.time. */
    clock_gettime(CLOCK_REALTIME, &ts);
    memset(f, 0, sizeof *f);
    f->time = (double)ts.tv_sec + ts.tv_nsec / 1e9;
    snprintf(f->node, sizeof f->node, "%s", node ? node : "?");
    f->rank = rank;
    f->local_rank = local_rank;
    f->exit_code = exit_code;
    f->pid = pid;
    snprintf(f->message, sizeof f->message, "%s", message ? message : "");
    f->node_rank = -1;
}

/* Sets member `key` of `o` to the string `v` when v is not empty. */
static void set_text(json_t *o, const char *key, const char *v)
{
    if (o && v[0])
        json_object_set_new(o, key, json_string(v));
}

/* Copies the string member `key` of `o`, when there is one, into buf[n]; else "". Returns -1
 * for a member of another type. */
static int get_text(json_t *o, const char *key, char *buf, size_t n)
{
    json_t *v = json_object_get(o, key);
    buf[0] = '\0';
    if (!v)
        return 0;
    if (!json_is_string(v))
        return -1;
    snprintf(buf, n, "%s", json_string_value(v));
    return 0;
}

/* Length of the valid UTF-8 sequence at p (n bytes left), or 0 when the bytes there are not
 * one (a stray continuation byte, an overlong form, a surrogate, a sequence cut short). */
static size_t utf8_len(const unsigned char *p, size_t n)
{
    unsigned char c = p[0];
    size_t len = c < 0x80                 ? 1
                 : c >= 0xc2 && c <= 0xdf ? 2
                 : c >= 0xe0 && c <= 0xef ? 3
                 : c >= 0xf0 && c <= 0xf4 ? 4
                                          : 0;
    if (len == 0 || len > n)
        return 0;
    unsigned char lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80;
    unsigned char hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
    for (size_t i = 1; i < len; i++)
        if (p[i] < (i == 1 ? lo : 0x80) || p[i] > (i == 1 ? hi : 0xbf))
            return 0;
    return len;
}

/* Makes `s` valid UTF-8 in place, each byte that is not part of a valid sequence becoming '?':
 * a worker's stderr, or a line cut to fit, must not keep its record out of JSON. */
static void utf8_clean(char *s)
{
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        size_t l = utf8_len((const unsigned char *)s + i, n - i);
        if (l == 0) {
            s[i++] = '?';
            continue;
        }
        i += l;
    }
}

char *ddprun_failure_to_json(const ddprun_failure *in)
{
    if (!in)
        return NULL;
    ddprun_failure copy = *in, *f = &copy;
    utf8_clean(f->node);
    utf8_clean(f->message);
    utf8_clean(f->error_file);
    utf8_clean(f->logs);
    utf8_clean(f->stderr_tail);
    json_t *o =
        json_pack("{s:f, s:s, s:i, s:i, s:i, s:i, s:s, s:b}", "time", f->time, "node", f->node,
                  "rank", f->rank, "local_rank", f->local_rank, "exit_code", f->exit_code, "pid",
                  f->pid, "message", f->message, "teardown", f->teardown);
    if (o && f->node_rank >= 0)
        json_object_set_new(o, "node_rank", json_integer(f->node_rank));
    if (o && f->core_dumped)
        json_object_set_new(o, "core_dumped", json_true());
    set_text(o, "error_file", f->error_file);
    set_text(o, "logs", f->logs);
    set_text(o, "stderr_tail", f->stderr_tail);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

int ddprun_failure_from_json(const char *json, ddprun_failure *f)
{
    if (!json || !f)
        return -EINVAL;
    json_t *o = json_loads(json, 0, NULL);
    if (!o)
        return -EPROTO;
    ddprun_failure r;
    memset(&r, 0, sizeof r);
    const char *node = NULL, *msg = NULL;
    int teardown = 0, core = 0;
    r.node_rank = -1;
    int rc = json_unpack(o, "{s:F, s:s, s:i, s:i, s:i, s:i, s?s, s?b, s?i, s?b}", "time", &r.time,
                         "node", &node, "rank", &r.rank, "local_rank", &r.local_rank, "exit_code",
                         &r.exit_code, "pid", &r.pid, "message", &msg, "teardown", &teardown,
                         "node_rank", &r.node_rank, "core_dumped", &core) == 0 &&
                     get_text(o, "error_file", r.error_file, sizeof r.error_file) == 0 &&
                     get_text(o, "logs", r.logs, sizeof r.logs) == 0 &&
                     get_text(o, "stderr_tail", r.stderr_tail, sizeof r.stderr_tail) == 0
                 ? 0
                 : -EPROTO;
    if (rc == 0) {
        r.teardown = teardown != 0;
        r.core_dumped = core != 0;
        snprintf(r.node, sizeof r.node, "%s", node);
        snprintf(r.message, sizeof r.message, "%s", msg ? msg : "");
        *f = r;
    }
    json_decref(o);
    return rc;
}

int ddprun_failure_exit_status(const ddprun_failure *f)
{
    if (!f)
        return 1;
    int code = f->exit_code >= 0 ? f->exit_code : 128 - f->exit_code;
    return code == 0 ? 1 : code;
}

int ddprun_failure_cmp(const void *x, const void *y)
{
    const ddprun_failure *a = x, *b = y;
    if (a->teardown != b->teardown)
        return a->teardown ? 1 : -1;
    return a->time < b->time ? -1 : a->time > b->time;
}

void ddprun_describe_exit(int code, bool core, char *buf, size_t n)
{
    if (code >= 0) {
        snprintf(buf, n, "exit %d", code);
        return;
    }
    const char *abbrev = sigabbrev_np(-code);
    snprintf(buf, n, "signal %d (%s)%s", -code, abbrev ? abbrev : "?", core ? ", core dumped" : "");
}

void ddprun_node_name(int node_rank, const char *host, char *buf, size_t n)
{
    bool known = host && host[0] && strcmp(host, "?") != 0;
    if (node_rank >= 0 && known)
        snprintf(buf, n, "node %d (%s)", node_rank, host);
    else if (node_rank >= 0)
        snprintf(buf, n, "node %d", node_rank);
    else
        snprintf(buf, n, "%s", known ? host : "a node");
}

void ddprun_tail_add(ddprun_tail *t, const char *p, size_t n)
{
    if (!t)
        return;
    const size_t cap = sizeof t->buf;
    if (n > cap) { /* only the last cap bytes can stay */
        t->total += n - cap;
        p += n - cap;
        n = cap;
    }
    size_t at = t->total % cap, first = n < cap - at ? n : cap - at;
    memcpy(t->buf + at, p, first);
    memcpy(t->buf, p + first, n - first);
    t->total += n;
}

size_t ddprun_tail_text(const ddprun_tail *t, int max_lines, char *out, size_t n)
{
    if (n == 0)
        return 0;
    out[0] = '\0';
    if (!t || max_lines <= 0)
        return 0;
    const size_t cap = sizeof t->buf;
    size_t len = t->total < cap ? t->total : cap, start = t->total < cap ? 0 : t->total % cap;
    char raw[DDPRUN_TAIL_BYTES];
    for (size_t i = 0; i < len; i++)
        raw[i] = t->buf[(start + i) % cap];
    size_t b = 0;
    if (t->total > cap) { /* the first line lost its start */
        while (b < len && raw[b] != '\n')
            b++;
        b += b < len;
    }
    /* Clean each line (from its last '\r'; no escapes or control bytes) into text. */
    char text[DDPRUN_TAIL_BYTES + 1]; /* + 1: a newline after the unfinished last line */
    size_t k = 0;
    while (b < len) {
        size_t e = b;
        while (e < len && raw[e] != '\n')
            e++;
        size_t from = b;
        for (size_t i = b; i < e; i++)
            if (raw[i] == '\r' && i + 1 < e)
                from = i + 1;
        for (size_t i = from; i < e; i++) {
            unsigned char c = (unsigned char)raw[i];
            if (c == 0x1b) { /* ESC [ params final, or ESC and one byte */
                if (i + 1 < e && raw[i + 1] == '[') {
                    i += 2;
                    while (i < e && ((unsigned char)raw[i] < 0x40 || (unsigned char)raw[i] > 0x7e))
                        i++;
                } else {
                    i++;
                }
                continue;
            }
            if (c >= 0x20 || c == '\t')
                text[k++] = (char)c;
        }
        text[k++] = '\n';
        b = e + 1;
    }
    /* Drop empty (or blank) trailing lines, then keep the last max_lines. */
    while (k > 0 && (text[k - 1] == '\n' || text[k - 1] == ' ' || text[k - 1] == '\t'))
        k--;
    size_t s = k;
    for (int lines = 0; s > 0; s--)
        if (text[s - 1] == '\n' && ++lines == max_lines)
            break;
    size_t m = k - s < n - 1 ? k - s : n - 1;
    memcpy(out, text + s, m);
    out[m] = '\0';
    return m;
}
