/*
 * ddprun's console (console.h): standard output and standard error as non-blocking libuv streams
 * with a bounded queue, so that a console nobody reads (Ctrl-S, `| less`, a stalled pipe) slows
 * only the workers that write to it, and never the agent: its loop still reaps workers, handles
 * signals and tears the job down.
 *
 * Invariants: `queued` is the sum of the sizes of the write requests libuv holds for the stream;
 * `over` is set when a write leaves more than `limit` queued and cleared (with the drain
 * callback) once the queue is back to limit / 2. Everything but ddprun_console_post() runs on
 * the loop thread. Not done here: line assembly and prefixes (the agent's), flushing at exit
 * (the agent runs its loop for that, with a bound of its own).
 *
 * The live block (terminals only): `live` holds the block's lines, `ndrawn` how many are on the
 * screen. Between calls ndrawn == nlive, and the cursor is on the block's last line (in some
 * column: every drawing starts with a carriage return) or, with no block, at the start of an
 * empty line (every write above the block ends a line).
 * A joined console (`fwd`) holds nothing of its own: everything goes to the one it joined.
 */
#include "console.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#define POST_MAX (64 * 1024) /* bytes other threads may have waiting for the loop */

struct ddprun_console {
    uv_loop_t *loop;
    int fd;          /* the descriptor as the caller knows it (1 or 2) */
    bool stream;     /* written through `pipe`; else synchronously to fd */
    bool shared;     /* `pipe` writes to fd's own file description, whose flags we changed */
    int saved_flags; /* fd's status flags before that, restored at close */
    bool failed;     /* a write failed: drop from now on */
    bool closed;
    uv_pipe_t pipe;
    size_t limit, queued;
    bool over;
    uint64_t written;
    ddprun_console_drain_fn drain;
    void *drain_arg;

    pthread_mutex_t mu; /* guards posted, nposted */
    char *posted;
    size_t nposted;
    uv_async_t async;

    bool tty;               /* a terminal: the live block works here */
    int cols;               /* its width; 0: unknown (nothing is cut) */
    struct live_line *live; /* the live block, top to bottom */
    size_t nlive, livecap;
    size_t ndrawn;          /* lines of the block on the screen */
    ddprun_console *fwd;    /* joined: writes go there */
    ddprun_console *joined; /* the console that joined this one, for its drain callback */
};

typedef struct live_line {
    const void *key;
    char *text;
    size_t n;
} live_line;

typedef struct wreq {
    uv_write_t req;
    ddprun_console *c;
    size_t n;
    char data[];
} wreq;

static void write_sync(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        p += k;
        n -= (size_t)k;
    }
}

static void written_cb(uv_write_t *req, int status)
{
    wreq *r = req->data;
    ddprun_console *c = r->c;
    c->queued -= r->n;
    if (status == 0)
        c->written += r->n;
    else if (status != UV_ECANCELED)
        c->failed = true;
    free(r);
    if (c->over && c->queued <= c->limit / 2) {
        c->over = false;
        if (c->drain)
            c->drain(c->drain_arg);
        if (c->joined && c->joined->drain)
            c->joined->drain(c->joined->drain_arg);
    }
}

/* Queues `n` bytes for the console's descriptor (ddprun_console_write() without the block). */
static int enqueue(ddprun_console *c, const void *p, size_t n)
{
    if (!c || n == 0 || c->failed || c->closed)
        return c && c->over ? 1 : 0;
    if (!c->stream) {
        write_sync(c->fd, p, n);
        c->written += n;
        return 0;
    }
    const char *b = p;
    if (c->queued == 0) {
        /* Nothing queued: what the console takes now needs no copy. */
        uv_buf_t buf = uv_buf_init((char *)b, (unsigned)(n > 1u << 30 ? 1u << 30 : n));
        int k = uv_try_write((uv_stream_t *)&c->pipe, &buf, 1);
        if (k > 0) {
            b += k;
            n -= (size_t)k;
            c->written += (uint64_t)k;
        } else if (k < 0 && k != UV_EAGAIN) {
            c->failed = true;
            return 0;
        }
        if (n == 0)
            return 0;
    }
    wreq *r = malloc(sizeof(*r) + n);
    if (!r)
        return -ENOMEM;
    r->c = c;
    r->n = n;
    r->req.data = r;
    memcpy(r->data, b, n);
    uv_buf_t buf = uv_buf_init(r->data, (unsigned)n);
    if (uv_write(&r->req, (uv_stream_t *)&c->pipe, &buf, 1, written_cb) < 0) {
        free(r);
        c->failed = true;
        return 0;
    }
    c->queued += n;
    if (c->queued > c->limit)
        c->over = true;
    return c->over ? 1 : 0;
}

int ddprun_console_write(ddprun_console *c, const void *p, size_t n)
{
    if (c && c->fwd)
        return ddprun_console_write(c->fwd, p, n);
    if (c && c->ndrawn)
        return ddprun_console_show(c, NULL, p, n, NULL, 0);
    return enqueue(c, p, n);
}

/* ---------------------------------------------------------------------------------------- */
/* The live block                                                                           */
/* ---------------------------------------------------------------------------------------- */

typedef struct obuf {
    char *p;
    size_t n, cap;
    bool oom;
} obuf;

static void put(obuf *o, const char *p, size_t n)
{
    if (o->oom || n == 0)
        return;
    if (o->n + n > o->cap) {
        size_t cap = o->cap ? o->cap : 256;
        while (cap < o->n + n)
            cap *= 2;
        char *q = realloc(o->p, cap);
        if (!q) {
            o->oom = true;
            return;
        }
        o->p = q;
        o->cap = cap;
    }
    memcpy(o->p + o->n, p, n);
    o->n += n;
}

#define PUTS(o, lit) put(o, lit, sizeof(lit) - 1)

/*
 * The length of the longest start of `p` (n bytes) that fills at most `cols` - 1 columns of a
 * terminal: escape sequences (CSI, OSC, two-byte ESC) take none, nor do UTF-8 continuation
 * bytes and other control characters; a tab moves to the next multiple of 8. Sets *cut when
 * bytes are left over. cols <= 1: no limit.
 */
static size_t fit_width(const char *p, size_t n, int cols, bool *cut)
{
    size_t col = 0, i = 0;
    *cut = false;
    if (cols <= 1)
        return n;
    while (i < n) {
        unsigned char ch = (unsigned char)p[i];
        if (ch == 0x1b) { /* skip the whole sequence */
            size_t j = i + 1;
            if (j < n && p[j] == '[') {
                for (j++; j < n && !((unsigned char)p[j] >= 0x40 && (unsigned char)p[j] <= 0x7e);)
                    j++;
                j++;
            } else if (j < n && p[j] == ']') {
                for (j++; j < n && p[j] != '\a' && p[j] != 0x1b;)
                    j++;
                j += j < n && p[j] == 0x1b ? 2 : 1;
            } else {
                j++;
            }
            i = j < n ? j : n;
            continue;
        }
        size_t w = ch == '\t' ? 8 - col % 8 : (ch < 0x20 || (ch & 0xc0) == 0x80) ? 0 : 1;
        if (col + w > (size_t)cols - 1) {
            *cut = true;
            return i;
        }
        col += w;
        i++;
    }
    return n;
}

/*
 * Line `k` of the block as it goes on the screen: cut to the width (ending any colour), and
 * without the escape sequences that would move the cursor off its row or erase the prefix (a
 * bar library's cursor-up, "erase line"): of the CSI sequences only colours (SGR, 'm') and
 * "erase to the end of the line" (EL 0, 'K') stay, and no two-byte ESC sequence; OSC (a
 * window title, a link) stays. The block's rows depend on it.
 */
static void put_live(obuf *o, const ddprun_console *c, size_t k)
{
    bool cut;
    const live_line *l = &c->live[k];
    size_t n = fit_width(l->text, l->n, c->cols, &cut), i = 0, from = 0;
    while (i < n) {
        if (l->text[i] != 0x1b || i + 1 >= n || l->text[i + 1] == ']') {
            i++;
            continue;
        }
        size_t j = i + 1;
        bool keep = false;
        if (l->text[j] == '[') {
            for (j++; j < n &&
                      !((unsigned char)l->text[j] >= 0x40 && (unsigned char)l->text[j] <= 0x7e);)
                j++;
            if (j < n) {
                size_t pn = j - i - 2; /* the parameters between "ESC [" and the final byte */
                keep = l->text[j] == 'm' ||
                       (l->text[j] == 'K' && (pn == 0 || (pn == 1 && l->text[i + 2] == '0')));
            }
        }
        j = j < n ? j + 1 : n;
        if (!keep) {
            put(o, l->text + from, i - from);
            from = j;
        }
        i = j;
    }
    put(o, l->text + from, n - from);
    if (cut && memchr(l->text, 0x1b, l->n))
        PUTS(o, "\033[m");
}

static size_t live_find(const ddprun_console *c, const void *key)
{
    size_t i = 0;
    while (key && i < c->nlive && c->live[i].key != key)
        i++;
    return key ? i : c->nlive;
}

/* Sets or removes (n == 0) the live line of `key`. Returns 0 or -ENOMEM. */
static int live_set(ddprun_console *c, size_t i, const void *key, const char *text, size_t n)
{
    if (n == 0) {
        if (i < c->nlive) {
            free(c->live[i].text);
            memmove(c->live + i, c->live + i + 1, (c->nlive - i - 1) * sizeof(*c->live));
            c->nlive--;
        }
        return 0;
    }
    char *t = malloc(n);
    if (!t)
        return -ENOMEM;
    memcpy(t, text, n);
    if (i == c->nlive) {
        if (c->nlive == c->livecap) {
            size_t cap = c->livecap ? c->livecap * 2 : 8;
            live_line *v = realloc(c->live, cap * sizeof(*v));
            if (!v) {
                free(t);
                return -ENOMEM;
            }
            c->live = v;
            c->livecap = cap;
        }
        c->live[c->nlive++] = (live_line){.key = key};
    }
    free(c->live[i].text);
    c->live[i].text = t;
    c->live[i].n = n;
    return 0;
}

int ddprun_console_show(ddprun_console *c, const void *key, const char *lines, size_t nlines,
                        const char *live, size_t nlive)
{
    if (!c)
        return 0;
    if (c->fwd)
        return ddprun_console_show(c->fwd, key, lines, nlines, live, nlive);
    if (c->failed || c->closed)
        return c->over ? 1 : 0;
    size_t i = live_find(c, key), was = c->nlive;
    if (nlines == 0 && (!key || (nlive == 0 && i == was)))
        return c->over ? 1 : 0; /* nothing to draw */
    if (key && live_set(c, i, key, live, nlive) < 0)
        return -ENOMEM;
    obuf o = {0};
    char seq[32];
    if (nlines == 0 && key && nlive > 0 && i < was) {
        /* In place: up to line i, redraw it, and down again (no newline: nothing scrolls). */
        size_t up = c->ndrawn - 1 - i;
        put(&o, seq,
            (size_t)snprintf(seq, sizeof(seq), up ? "\r\033[%zuA\033[2K" : "\r\033[2K", up));
        put_live(&o, c, i);
        if (up)
            put(&o, seq, (size_t)snprintf(seq, sizeof(seq), "\r\033[%zuB", up));
    } else if (nlines == 0 && key && nlive > 0) {
        /* A new line at the bottom of the block. */
        if (c->ndrawn)
            PUTS(&o, "\r\n");
        put_live(&o, c, c->nlive - 1);
    } else if (c->ndrawn == 0 && c->nlive == 0) {
        return enqueue(c, lines, nlines); /* no block, before or after: the lines alone */
    } else {
        /* Lines above the block: clear it, write them, draw it again below. */
        if (c->ndrawn > 1)
            put(&o, seq, (size_t)snprintf(seq, sizeof(seq), "\r\033[%zuA\033[J", c->ndrawn - 1));
        else if (c->ndrawn)
            PUTS(&o, "\r\033[J");
        put(&o, lines, nlines);
        if (nlines && lines[nlines - 1] != '\n')
            PUTS(&o, "\r\n");
        for (size_t k = 0; k < c->nlive; k++) {
            if (k)
                PUTS(&o, "\r\n");
            put_live(&o, c, k);
        }
    }
    c->ndrawn = c->nlive;
    int rc = o.oom ? -ENOMEM : enqueue(c, o.p, o.n);
    free(o.p);
    return rc;
}

bool ddprun_console_is_tty(const ddprun_console *c)
{
    return c && c->tty;
}

int ddprun_console_join(ddprun_console *c, ddprun_console *with)
{
    struct stat a, b;
    if (!c || !with || c == with || !c->tty || !with->tty || fstat(c->fd, &a) != 0 ||
        fstat(with->fd, &b) != 0 || a.st_rdev != b.st_rdev)
        return 0;
    c->fwd = with;
    with->joined = c;
    return 1;
}

void ddprun_console_resized(ddprun_console *c)
{
    struct winsize ws;
    if (c && c->tty && ioctl(c->fd, TIOCGWINSZ, &ws) == 0)
        c->cols = ws.ws_col;
}

static void posted_cb(uv_async_t *h)
{
    ddprun_console *c = h->data;
    pthread_mutex_lock(&c->mu);
    char *p = c->posted;
    size_t n = c->nposted;
    c->posted = NULL;
    c->nposted = 0;
    pthread_mutex_unlock(&c->mu);
    if (p)
        ddprun_console_write(c, p, n);
    free(p);
}

void ddprun_console_post(ddprun_console *c, const void *p, size_t n)
{
    if (!c || n == 0)
        return;
    pthread_mutex_lock(&c->mu);
    if (c->nposted + n <= POST_MAX) {
        char *q = realloc(c->posted, c->nposted + n);
        if (q) {
            memcpy(q + c->nposted, p, n);
            c->posted = q;
            c->nposted += n;
        }
    }
    pthread_mutex_unlock(&c->mu);
    uv_async_send(&c->async);
}

/*
 * A file description of our own for `fd`, where the kernel gives one: reopening
 * /proc/self/fd/N works for terminals, pipes and FIFOs (not for sockets).
 */
static int reopen_private(int fd)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    return open(path, O_WRONLY | O_CLOEXEC | O_NOCTTY);
}

int ddprun_console_open(uv_loop_t *loop, int fd, size_t limit, ddprun_console **out)
{
    if (!loop || fd < 0 || limit == 0 || !out)
        return -EINVAL;
    ddprun_console *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->loop = loop;
    c->fd = fd;
    c->limit = limit;
    pthread_mutex_init(&c->mu, NULL);
    uv_async_init(loop, &c->async, posted_cb);
    c->async.data = c;
    uv_unref((uv_handle_t *)&c->async); /* posts never keep the loop alive on their own */

    uv_handle_type type = uv_guess_handle(fd);
    c->tty = type == UV_TTY;
    ddprun_console_resized(c);
    if (type == UV_TTY || type == UV_NAMED_PIPE || type == UV_TCP || type == UV_UDP) {
        int wfd = reopen_private(fd);
        if (wfd < 0) {
            /* A socket: share its file description, and restore its flags at close. */
            c->saved_flags = fcntl(fd, F_GETFL);
            wfd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
            c->shared = wfd >= 0 && c->saved_flags >= 0;
            if (!c->shared && wfd >= 0) {
                close(wfd);
                wfd = -1;
            }
        }
        if (wfd >= 0) {
            uv_pipe_init(loop, &c->pipe, 0);
            if (uv_pipe_open(&c->pipe, wfd) == 0) {
                c->stream = true;
            } else {
                /* libuv refused it: back to synchronous writes on fd, as it was. */
                uv_close((uv_handle_t *)&c->pipe, NULL);
                close(wfd);
                if (c->shared)
                    fcntl(fd, F_SETFL, c->saved_flags);
                c->shared = false;
            }
        }
    }
    *out = c;
    return 0;
}

void ddprun_console_on_drain(ddprun_console *c, ddprun_console_drain_fn fn, void *arg)
{
    c->drain = fn;
    c->drain_arg = arg;
}

size_t ddprun_console_queued(const ddprun_console *c)
{
    return c && !c->fwd ? c->queued : 0; /* a joined console's bytes are counted where they wait */
}

uint64_t ddprun_console_written(const ddprun_console *c)
{
    return c ? (c->fwd ? c->fwd : c)->written : 0;
}

bool ddprun_console_over(const ddprun_console *c)
{
    return c && (c->fwd ? c->fwd : c)->over;
}

bool ddprun_console_shared(const ddprun_console *c)
{
    return c && c->shared;
}

void ddprun_console_close(ddprun_console *c)
{
    if (!c || c->closed)
        return;
    c->closed = true;
    if (c->shared)
        fcntl(c->fd, F_SETFL, c->saved_flags);
}
