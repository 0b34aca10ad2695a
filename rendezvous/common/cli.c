/*
 * The programs' shared command-line helpers (see cli.h): value parsers whose errors name the
 * flag, lookups in an option table, getopt_long's tables and --help made from it.
 *
 * Pure: no I/O except the FILE the help printers and cli_report() are given, no exit, no
 * allocation. A failure
 * leaves one sentence in a per-thread buffer for cli_last_error(); the callers add their
 * program's name. What this file deliberately does not do: decide what a value means (choices,
 * endpoints, lists are the programs'), read the environment, or run a parse loop of its own
 * (ddprun parses as argparse does, ddp-rendezvous takes options on either side of its command
 * word, coll-bench and the other benchmarks use getopt_long; all share the table, the lookups and
 * the help).
 */
#include "cli.h"
#include "errbuf.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local errbuf last_error;

/* Every failure here is a bad value: -EINVAL with a sentence naming it. */
#define fail(...) errbuf_set(&last_error, -EINVAL, __VA_ARGS__)

const char *cli_last_error(void)
{
    return last_error.msg;
}

/* ------------------------------------------------------------------------------------------ */
/* Values                                                                                     */
/* ------------------------------------------------------------------------------------------ */

int cli_parse_long(const char *flag, const char *s, long min, long max, long *out)
{
    char *end;
    long v = 0;
    bool ok = s && *s;
    if (ok) {
        errno = 0;
        v = strtol(s, &end, 10);
        ok = errno == 0 && end != s && *end == '\0' && v >= min && v <= max;
    }
    if (!ok) {
        if (max >= INT_MAX)
            return fail("%s: expected an integer of at least %ld, got '%s'", flag, min, s ? s : "");
        return fail("%s: expected an integer from %ld to %ld, got '%s'", flag, min, max,
                    s ? s : "");
    }
    *out = v;
    return 0;
}

int cli_parse_int(const char *flag, const char *s, int min, int max, int *out)
{
    long v;
    int rc = cli_parse_long(flag, s, min, max, &v);
    if (rc == 0)
        *out = (int)v;
    return rc;
}

/* cli_parse_double() with the noun its error sentence uses ("number", "number of seconds"). */
static int parse_real(const char *flag, const char *s, double min, double max, int flags,
                      const char *noun, double *out)
{
    bool open = flags & CLI_OPEN_MIN;
    char *end;
    double v = 0;
    bool ok = s && *s;
    if (ok) {
        errno = 0;
        v = strtod(s, &end);
        ok = errno == 0 && end != s && *end == '\0' && isfinite(v) && v <= max &&
             (open ? v > min : v >= min);
    }
    if (ok) {
        *out = v;
        return 0;
    }
    if (!s)
        s = "";
    if (min == 0 && max == HUGE_VAL)
        return fail("%s: expected a %s %s, got '%s'", flag, open ? "positive" : "non-negative",
                    noun, s);
    if (max == HUGE_VAL)
        return fail("%s: expected a %s %s %.15g, got '%s'", flag, noun,
                    open ? "greater than" : "of at least", min, s);
    return fail("%s: expected a %s %s %.15g %s %.15g, got '%s'", flag, noun,
                open ? "greater than" : "from", min, open ? "and at most" : "to", max, s);
}

int cli_parse_double(const char *flag, const char *s, double min, double max, int flags,
                     double *out)
{
    return parse_real(flag, s, min, max, flags, "number", out);
}

int cli_parse_seconds(const char *flag, const char *s, double min, double max, int flags,
                      double *out)
{
    return parse_real(flag, s, min, max, flags, "number of seconds", out);
}

int cli_parse_choice(const char *flag, const char *s, const char *noun, const char *const *names,
                     int *index)
{
    char list[256] = "";
    size_t len = 0;
    for (int i = 0; names[i]; i++) {
        if (s && !strcmp(s, names[i])) {
            *index = i;
            return 0;
        }
        if (len < sizeof list)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "",
                                    names[i]);
    }
    return fail("%s: unknown %s '%s' (%s)", flag, noun, s ? s : "", list);
}

int cli_parse_host_port(const char *flag, const char *s, char *host, size_t cap, int *port)
{
    const char *colon = s ? strrchr(s, ':') : NULL;
    const char *h = s;
    size_t hlen = colon ? (size_t)(colon - s) : 0;
    long p;

    if (hlen >= 2 && h[0] == '[' && h[hlen - 1] == ']')
        h++, hlen -= 2;
    else if (hlen && memchr(h, ':', hlen))
        colon = NULL; /* an IPv6 address without brackets: its last group is no port */
    if (!colon || hlen == 0 || hlen >= cap || memchr(h, '[', hlen) || memchr(h, ']', hlen) ||
        !colon[1] || !isdigit((unsigned char)colon[1]) ||
        cli_parse_long(flag, colon + 1, 1, 65535, &p) < 0)
        return fail("%s: expected HOST:PORT (an IPv6 address in brackets, PORT from 1 to 65535), "
                    "got '%s'",
                    flag, s ? s : "");
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    *port = (int)p;
    return 0;
}

int cli_parse_size(const char *flag, const char *s, size_t min, size_t max, size_t *out)
{
    const char *p = s;
    char *end = NULL;
    unsigned long long v = 0, unit = 1;
    bool ok = s != NULL;

    if (ok) {
        while (isspace((unsigned char)*p))
            p++;
        ok = *p != '-'; /* strtoull would wrap "-1" round to a huge size */
    }
    if (ok) {
        errno = 0;
        v = strtoull(p, &end, 10);
        ok = errno == 0 && end != p;
    }
    if (ok) {
        switch (toupper((unsigned char)*end)) {
        case 'K':
            unit = 1ull << 10;
            break;
        case 'M':
            unit = 1ull << 20;
            break;
        case 'G':
            unit = 1ull << 30;
            break;
        }
        end += unit != 1;
        ok = *end == '\0' && v <= SIZE_MAX / unit && v * unit >= min && v * unit <= max;
    }
    if (ok) {
        *out = (size_t)(v * unit);
        return 0;
    }
    if (!s)
        s = "";
    if (min == 0 && max == SIZE_MAX)
        return fail("%s: expected a size in bytes (N, NK, NM or NG, powers of 1024), got '%s'",
                    flag, s);
    if (max == SIZE_MAX)
        return fail("%s: expected a size in bytes (N, NK, NM or NG, powers of 1024) of at "
                    "least %zu, got '%s'",
                    flag, min, s);
    return fail("%s: expected a size in bytes (N, NK, NM or NG, powers of 1024) from %zu to "
                "%zu, got '%s'",
                flag, min, max, s);
}

/*
 * Parses the items of s into out[] when `out` is not NULL, else only checks them: the first pass
 * checks, so that out[] is written only when the whole list is good. Returns the count or
 * -EINVAL.
 */
static int int_list(const char *flag, const char *s, int min, int max, int flags, int *out,
                    size_t cap)
{
    size_t count = 0;
    for (const char *p = s; *p;) {
        size_t len = strcspn(p, ",");
        char item[64];
        int v;
        if (len >= sizeof item)
            return fail("%s: expected an integer from %d to %d, got '%.*s...'", flag, min, max,
                        (int)sizeof item, p);
        memcpy(item, p, len);
        item[len] = '\0';
        p += len + (p[len] == ',');
        if (len == 0)
            continue;
        if (count == cap)
            return fail("%s: at most %zu values, got '%s'", flag, cap, s);
        if ((flags & CLI_ALLOW_AUTO) && strcmp(item, "auto") == 0)
            v = CLI_AUTO;
        else if (cli_parse_int(flag, item, min, max, &v) < 0)
            return -EINVAL;
        if (out)
            out[count] = v;
        count++;
    }
    if (count == 0)
        return fail("%s: expected a comma-separated list of integers, got '%s'", flag, s);
    return (int)count; /* items are at least 1 byte apart: no more than strlen(s) */
}

int cli_parse_int_list(const char *flag, const char *s, int min, int max, int flags, int *out,
                       size_t cap)
{
    if (!s)
        s = "";
    int rc = int_list(flag, s, min, max, flags, NULL, cap);
    return rc < 0 ? rc : int_list(flag, s, min, max, flags, out, cap);
}

int cli_report(FILE *f, const char *prog, int rc)
{
    if (rc < 0)
        cli_msg(f, prog, "%s", cli_last_error());
    return rc;
}

void cli_msg(FILE *f, const char *prog, const char *fmt, ...)
{
    /* One write(2) for the whole line where it fits, so that the lines of processes sharing a
     * file or pipe (ranks under ddprun --no-prefix, on unbuffered stderr) do not interleave. */
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    int head = snprintf(line, sizeof line, "%s: ", prog);
    int n = head < 0 || (size_t)head >= sizeof line
                ? -1
                : vsnprintf(line + head, sizeof line - (size_t)head, fmt, ap);
    va_end(ap);
    flockfile(f);
    if (n >= 0 && (size_t)(head + n) < sizeof line - 1) {
        line[head + n] = '\n';
        fwrite(line, 1, (size_t)(head + n) + 1, f);
    } else { /* a longer line: written in pieces */
        va_start(ap, fmt);
        fprintf(f, "%s: ", prog);
        vfprintf(f, fmt, ap);
        fputc('\n', f);
        va_end(ap);
    }
    funlockfile(f);
}

/* ------------------------------------------------------------------------------------------ */
/* Option tables                                                                              */
/* ------------------------------------------------------------------------------------------ */

#define NNAMES (sizeof((cli_option *)0)->names / sizeof((cli_option *)0)->names[0])

const cli_option *cli_by_id(const cli_option *opts, size_t n, int id)
{
    for (size_t i = 0; i < n; i++)
        if (opts[i].id == id)
            return &opts[i];
    return NULL;
}

const char *cli_long_name(const cli_option *o)
{
    for (size_t k = 0; k < NNAMES && o->names[k]; k++)
        if (o->names[k][1] == '-')
            return o->names[k];
    return o->names[0];
}

const char *cli_label(const cli_option *o, char *buf, size_t cap)
{
    size_t k = 0;
    if (cap == 0)
        return buf;
    buf[0] = '\0';
    for (size_t i = 0; i < NNAMES && o->names[i] && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%s", i ? "/" : "", o->names[i]);
    return buf;
}

int cli_find(const cli_option *opts, size_t n, const char *arg, size_t len, int flags)
{
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < NNAMES && opts[i].names[k]; k++)
            if (strlen(opts[i].names[k]) == len && strncmp(opts[i].names[k], arg, len) == 0)
                return (int)i;
    if (!(flags & CLI_FIND_PREFIX) || len < 3 || arg[0] != '-' || arg[1] != '-')
        return fail("unknown option '%.*s'", (int)len, arg);
    int hit = -1;
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < NNAMES && opts[i].names[k]; k++) {
            if (strncmp(opts[i].names[k], arg, len) != 0)
                continue;
            if (hit >= 0 && hit != (int)i)
                return fail("ambiguous option '%.*s' could be %s or %s", (int)len, arg,
                            cli_long_name(&opts[hit]), cli_long_name(&opts[i]));
            hit = (int)i;
        }
    if (hit < 0)
        return fail("unknown option '%.*s'", (int)len, arg);
    return hit;
}

int cli_getopt(const cli_option *opts, size_t n, struct option *longopts, size_t nlong,
               char *shorts, size_t nshort)
{
    size_t nl = 0, ns = 0;
    if (nshort < 2 || nlong < 1)
        return -ENOSPC;
    shorts[ns++] = ':';
    for (size_t i = 0; i < n; i++) {
        const cli_option *o = &opts[i];
        bool has_short = false;
        for (size_t k = 0; k < NNAMES && o->names[k]; k++) {
            const char *name = o->names[k];
            if (name[0] != '-' || name[1] == '\0' || (name[1] != '-' && name[2] != '\0') ||
                (name[1] == '-' && name[2] == '\0'))
                return -EINVAL;
            if (name[1] != '-') {
                if (o->id != (unsigned char)name[1])
                    return -EINVAL;
                if (ns + 3 > nshort)
                    return -ENOSPC;
                shorts[ns++] = name[1];
                if (o->metavar)
                    shorts[ns++] = ':';
                has_short = true;
                continue;
            }
            if (nl + 2 > nlong)
                return -ENOSPC;
            longopts[nl++] = (struct option){name + 2, o->metavar ? required_argument : no_argument,
                                             NULL, o->id};
        }
        if (!has_short && o->id < 256)
            return -EINVAL;
    }
    longopts[nl] = (struct option){0};
    shorts[ns] = '\0';
    return 0;
}

int cli_getopt_build(cli_getopt_tables *t, const cli_option *opts, size_t n)
{
    if (n > CLI_GETOPT_MAX)
        return -ENOSPC;
    return cli_getopt(opts, n, t->longopts, sizeof t->longopts / sizeof t->longopts[0], t->shorts,
                      sizeof t->shorts);
}

/* ------------------------------------------------------------------------------------------ */
/* --help                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/*
 * Writes text word-wrapped to `width` columns (0: no wrapping), the cursor being in column `col`
 * (0: a new line) and continuation lines indented by `indent`; then a newline. A word longer
 * than a line gets a line of its own.
 */
static void wrap_from(FILE *f, const char *text, int indent, int col, int width)
{
    if (width <= 0)
        width = INT_MAX;
    const char *p = text;
    while (*p == ' ')
        p++;
    if (!*p) {
        fputc('\n', f);
        return;
    }
    if (col < indent) {
        fprintf(f, "%*s", indent - col, "");
        col = indent;
    }
    bool line_empty = true;
    while (*p) {
        int w = (int)strcspn(p, " ");
        if (!line_empty && col + 1 + w > width) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
            line_empty = true;
        }
        if (!line_empty) {
            fputc(' ', f);
            col++;
        }
        fwrite(p, 1, (size_t)w, f);
        col += w;
        line_empty = false;
        p += w;
        while (*p == ' ')
            p++;
    }
    fputc('\n', f);
}

void cli_print_wrapped(FILE *f, const char *text, int indent)
{
    wrap_from(f, text, indent, 0, CLI_HELP_WIDTH);
}

void cli_print_option(FILE *f, const cli_option *o, const char *text, int help_col, int width)
{
    char left[256];
    size_t k = 0;
    left[0] = '\0';
    for (size_t i = 0; i < NNAMES && o->names[i] && k < sizeof left; i++)
        k += (size_t)snprintf(left + k, sizeof left - k, "%s%s", i ? ", " : "", o->names[i]);
    if (o->metavar && k < sizeof left)
        snprintf(left + k, sizeof left - k, " %s", o->metavar);
    if (!text)
        text = o->help;
    int col = fprintf(f, "  %s", left);
    if (help_col <= 0) {
        fputc('\n', f);
        wrap_from(f, text, 8, 0, width);
    } else if (col < help_col) {
        wrap_from(f, text, help_col, col, width);
    } else {
        fputc('\n', f);
        wrap_from(f, text, help_col, 0, width);
    }
}

void cli_print_options(FILE *f, const cli_option *opts, size_t n, int help_col, int width)
{
    for (size_t i = 0; i < n; i++) {
        const cli_option *o = &opts[i];
        char text[1024];
        if (o->def && *o->def)
            snprintf(text, sizeof text, "%s (default: %s)", o->help, o->def);
        else
            snprintf(text, sizeof text, "%s", o->help);
        cli_print_option(f, o, text, help_col, width);
    }
}
