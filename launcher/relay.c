/*
 * The output relay: each worker's standard output and error arrive on pipes (or pseudo-terminals,
 * --tty), are assembled into lines (up to LINE_MAX_BYTES; an unfinished line goes out after
 * PARTIAL_MS), prefixed as --log-line-prefix-template asks, and written to the worker's log file
 * and to ddprun's console. A console over its limit pauses reading for the workers that write to
 * it (back-pressure) until it drains; nothing else waits.
 *
 * On a terminal console (relay_renders()) a worker's unfinished line is a live line: what
 * follows its last carriage return is drawn in the console's block of live lines, rewritten
 * in place as the worker redraws it (a progress bar), and goes out above the block once its
 * newline comes. A pseudo-terminal's log file gets clean text: each line's final state (what
 * follows its last carriage return), without escape sequences. Elsewhere the bytes are relayed
 * as they come (relay()), and log files get them as written.
 *
 * Not done here: creating the pipes and log files (spawn.c's setup_stream()), the console's
 * descriptors and queues (console.c), deciding when a round is over (ddprun.c).
 */
#include "agent.h"

#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------- */
/* Output relay                                                                             */
/* ---------------------------------------------------------------------------------------- */

/*
 * Expands the prefix template for one worker as torchrun's string.Template.safe_substitute() does:
 * ${name} and $name for role_name, rank and local_rank, and (ddprun's own) hostname; "$$" is
 * "$"; anything else stays as written.
 */
void line_prefix(const agent *a, const worker *w, char *out, size_t n)
{
    const char *t =
        a->cfg->log_line_prefix_template ? a->cfg->log_line_prefix_template : "[${rank}]:";
    size_t o = 0;
    while (*t && o + 1 < n) {
        if (t[0] == '$' && t[1] == '$') {
            out[o++] = '$';
            t += 2;
            continue;
        }
        if (t[0] == '$') {
            bool braced = t[1] == '{';
            const char *name = t + 1 + braced;
            size_t len = 0;
            if (isalpha((unsigned char)name[0]) || name[0] == '_')
                while (isalnum((unsigned char)name[len]) || name[len] == '_')
                    len++;
            char val[64];
            const char *sub = NULL;
#define IS(key) (len == sizeof(key) - 1 && !strncmp(name, key, len))
            if (IS("rank"))
                snprintf(val, sizeof(val), "%d", w->rank), sub = val;
            else if (IS("local_rank"))
                snprintf(val, sizeof(val), "%d", w->local_rank), sub = val;
            else if (IS("role_name"))
                sub = a->cfg->role;
            else if (IS("hostname"))
                sub = a->hostname;
#undef IS
            if (sub && (!braced || name[len] == '}')) {
                o += (size_t)snprintf(out + o, n - o, "%s", sub);
                if (o >= n)
                    o = n - 1;
                t = name + len + braced;
                continue;
            }
        }
        out[o++] = *t++;
    }
    out[o] = '\0';
}

/* Writes all `n` bytes; returns 0, or -errno with *done set to the bytes written before. */
int write_all(int fd, const char *p, size_t n, size_t *done)
{
    size_t k0 = n;
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            if (done)
                *done = k0 - n;
            return -errno;
        }
        p += k;
        n -= (size_t)k;
    }
    if (done)
        *done = k0;
    return 0;
}

static void stream_bytes(stream *s, ssize_t nread);

/*
 * A pseudo-terminal's master is read here rather than through libuv's stream reading, which takes
 * a short read that comes with POLLHUP for the end of the stream (uv__stream_io()): the slave's
 * last close raises POLLHUP while its last bytes still wait in the terminal, and a master hands
 * out at most its line discipline's buffer (4 KiB) a read, so the rest was lost. Reads until
 * EAGAIN (at most 64 reads a call: the poll is level-triggered); the end is EIO (Linux) or 0.
 */
static void pty_readable(uv_poll_t *p, int status, int events)
{
    stream *s = p->data;
    (void)events;
    if (status < 0) {
        stream_bytes(s, status);
        return;
    }
    for (int k = 0; k < 64 && s->open && !s->paused; k++) {
        uv_buf_t buf;
        stream_alloc((uv_handle_t *)p, 0, &buf);
        if (buf.len == 0) {
            stream_bytes(s, UV_ENOBUFS);
            return;
        }
        ssize_t n = read(s->master, buf.base, buf.len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        stream_bytes(s, n > 0 ? n : n == 0 ? UV_EOF : -errno);
    }
}

/* Starts (or resumes) reading the worker's end of `s`. */
void stream_start(stream *s)
{
    if (s->pty)
        uv_poll_start(&s->poll, UV_READABLE | UV_DISCONNECT, pty_readable);
    else
        uv_read_start((uv_stream_t *)&s->pipe, stream_alloc, stream_read);
}

/* Stops reading a worker's pipe while its console is over its limit: the worker waits. */
static void stream_pause(stream *s)
{
    if (s->open && !s->paused) {
        if (s->pty)
            uv_poll_stop(&s->poll);
        else
            uv_read_stop((uv_stream_t *)&s->pipe);
        s->paused = true;
    }
}

/* A console drained: the workers whose `which` stream waited for it may go on. */
static void resume_streams(agent *a, int which)
{
    for (int i = 0; i < a->nworkers; i++) {
        stream *s = which == DDPRUN_STD_OUT ? &a->workers[i].out : &a->workers[i].err;
        if (s->open && s->paused) {
            s->paused = false;
            stream_start(s);
        }
    }
}

void stdout_drained(void *arg)
{
    resume_streams(arg, DDPRUN_STD_OUT);
}

void stderr_drained(void *arg)
{
    resume_streams(arg, DDPRUN_STD_ERR);
}

/*
 * Queues the first `n` bytes held for stream `s` for its console, in one write so that they
 * never interleave with another worker's, and drops them from the stream's buffer. Every line
 * starts with the worker's prefix, and so does every stretch after a carriage return (a
 * progress bar's redraw: "\r[0]: 40%|####"), except a "\n" that ends "\r\n"; the prefix goes
 * out with the line's first byte, so a line flushed in parts (a partial line, then the rest)
 * carries it once. When the console's last bytes are another worker's unfinished line, a
 * newline ends that line first (with a prefix on; that worker's next bytes then start a line of
 * their own). Over the console's limit, reading this worker's pipe stops until it drains.
 */
static void relay_live(stream *s, size_t n);

static void relay(stream *s, size_t n)
{
    if (n == 0)
        return;
    if (relay_renders(s->w->a, s->which)) {
        relay_live(s, n);
        return;
    }
    agent *a = s->w->a;
    int c = s->which == DDPRUN_STD_OUT ? 1 : 2;
    const char *prefix = a->cfg->prefix_output ? s->w->prefix : "";
    size_t pl = strlen(prefix), starts = 1;
    for (size_t i = 0; i < n; i++)
        starts += s->line[i] == '\n' || s->line[i] == '\r';
    size_t total = 1 + n + starts * pl;
    char stackbuf[8192];
    char *buf = total <= sizeof(stackbuf) ? stackbuf : malloc(total);
    if (!buf)
        die_oom();
    size_t o = 0;
    stream *other = a->partial[c];
    if (pl && other && other != s) {
        buf[o++] = '\n';
        other->col0 = true;
        other->after_cr = false;
    }
    for (size_t i = 0; i < n; i++) {
        char ch = s->line[i];
        if (s->col0 && ch != '\r' && !(ch == '\n' && s->after_cr)) {
            memcpy(buf + o, prefix, pl);
            o += pl;
            s->col0 = false;
        }
        buf[o++] = ch;
        s->col0 = ch == '\n' || ch == '\r';
        s->after_cr = ch == '\r';
    }
    a->partial[c] = buf[o - 1] == '\n' ? NULL : s;
    if (ddprun_console_write(a->con[c], buf, o) == 1)
        stream_pause(s);
    if (buf != stackbuf)
        free(buf);
    memmove(s->line, s->line + n, s->len - n);
    s->len -= n;
}

/* Makes room for `need` bytes in *p (capacity *cap). */
static void reserve(char **p, size_t *cap, size_t need)
{
    if (need <= *cap)
        return;
    size_t c = *cap ? *cap : 256;
    while (c < need)
        c *= 2;
    char *q = realloc(*p, c);
    if (!q)
        die_oom();
    *p = q;
    *cap = c;
}

static void append(char **p, size_t *len, size_t *cap, const char *b, size_t n)
{
    reserve(p, cap, *len + n);
    memcpy(*p + *len, b, n);
    *len += n;
}

/*
 * relay() on a terminal console: the first `n` bytes held for `s` update its live line (the
 * prefix and what follows the line's last carriage return); each newline sends the line, as it
 * stands, above the console's block of live lines. One console write for all of it.
 */
static void relay_live(stream *s, size_t n)
{
    agent *a = s->w->a;
    int c = s->which == DDPRUN_STD_OUT ? 1 : 2;
    const char *prefix = a->cfg->prefix_output ? s->w->prefix : "";
    if (s->cur_len == 0) {
        s->cur_pl = strlen(prefix);
        append(&s->cur, &s->cur_len, &s->cur_cap, prefix, s->cur_pl);
    }
    char *done = NULL;
    size_t nd = 0, dcap = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && s->line[j] != '\n' && s->line[j] != '\r')
            j++;
        if (j > i) {
            if (s->cur_cr)
                s->cur_len = s->cur_pl;
            s->cur_cr = false;
            if (s->cur_len - s->cur_pl + (j - i) > LINE_MAX_BYTES) { /* out in pieces */
                append(&done, &nd, &dcap, s->cur, s->cur_len);
                append(&done, &nd, &dcap, "\n", 1);
                s->cur_len = s->cur_pl;
            }
            append(&s->cur, &s->cur_len, &s->cur_cap, s->line + i, j - i);
        }
        if (j < n && s->line[j] == '\n') {
            append(&done, &nd, &dcap, s->cur, s->cur_len);
            append(&done, &nd, &dcap, "\n", 1);
            s->cur_len = s->cur_pl;
            s->cur_cr = false;
        } else if (j < n) {
            s->cur_cr = true;
        }
        i = j + 1;
    }
    size_t live = s->cur_len > s->cur_pl ? s->cur_len : 0;
    if (ddprun_console_show(a->con[c], s, done, nd, s->cur, live) == 1)
        stream_pause(s);
    free(done);
    memmove(s->line, s->line + n, s->len - n);
    s->len -= n;
}

bool relay_renders(const agent *a, int which)
{
    return a->cfg->tty != DDPRUN_TTY_OFF &&
           ddprun_console_is_tty(a->con[which == DDPRUN_STD_OUT ? 1 : 2]);
}

/*
 * Adds `n` bytes a worker wrote to its pseudo-terminal to the clean text of its log file (`fl`),
 * and writes the lines it completes. Escape sequences (CSI, OSC, and two-byte ones) are
 * dropped, and a carriage return starts the line again (at the next byte other than a newline).
 * Returns 0, or -errno from the file.
 */
static int file_clean(stream *s, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        switch (s->fl_esc) {
        case 1: /* after ESC */
            s->fl_esc = ch == '[' ? 2 : ch == ']' ? 3 : 0;
            continue;
        case 2: /* CSI: parameters up to a final byte */
            if (ch >= 0x40 && ch <= 0x7e)
                s->fl_esc = 0;
            continue;
        case 3: /* OSC: up to BEL or ESC \ */
            s->fl_esc = ch == '\a' ? 0 : ch == 0x1b ? 4 : 3;
            continue;
        case 4:
            s->fl_esc = 0;
            continue;
        }
        if (ch == 0x1b) {
            s->fl_esc = 1;
        } else if (ch == '\r') {
            s->fl_cr = true;
        } else {
            if (s->fl_cr && ch != '\n')
                s->fl_len = s->fl_start;
            s->fl_cr = false;
            if (s->fl_len - s->fl_start >= LINE_MAX_BYTES) /* out in pieces */
                s->fl_start = s->fl_len;
            reserve(&s->fl, &s->fl_cap, s->fl_len + 1);
            s->fl[s->fl_len++] = (char)ch;
            if (ch == '\n')
                s->fl_start = s->fl_len;
        }
    }
    int rc = write_all(s->file, s->fl, s->fl_start, NULL);
    memmove(s->fl, s->fl + s->fl_start, s->fl_len - s->fl_start);
    s->fl_len -= s->fl_start;
    s->fl_start = 0;
    return rc;
}

/*
 * The size of the terminal ddprun's stream `s` goes to, for the pseudo-terminal whose master is
 * `master`: a worker whose lines get a prefix on the console sees it narrower by the prefix and
 * one column (the live block's lines never take the last). Nothing when ddprun's streams are not
 * terminals.
 */
void stream_set_winsize(stream *s, int master)
{
    struct winsize ws;
    int fd = s->which == DDPRUN_STD_OUT ? STDOUT_FILENO : STDERR_FILENO, other = 3 - fd;
    if (ioctl(fd, TIOCGWINSZ, &ws) != 0 && ioctl(other, TIOCGWINSZ, &ws) != 0)
        return; /* (--tty on: the other stream's terminal, if it has one) */
    agent *a = s->w->a;
    if (s->console && relay_renders(a, s->which) && ws.ws_col > 0) {
        size_t used = (a->cfg->prefix_output ? strlen(s->w->prefix) : 0) + 1;
        ws.ws_col = ws.ws_col > used + 1 ? (unsigned short)(ws.ws_col - used) : 1;
    }
    ioctl(master, TIOCSWINSZ, &ws);
}

/*
 * SIGWINCH: ddprun's terminal changed size. The consoles cut their live lines to the new width,
 * every worker's pseudo-terminal takes the new size, and each such worker gets SIGWINCH through
 * its guard (a worker's pseudo-terminal is not its controlling terminal, so the kernel sends
 * none).
 */
static void on_sigwinch(uv_signal_t *h, int signum)
{
    agent *a = h->data;
    (void)signum;
    ddprun_console_resized(a->con[1]);
    ddprun_console_resized(a->con[2]);
    for (int i = 0; i < a->nworkers; i++) {
        worker *w = &a->workers[i];
        bool any = false;
        stream *ss[2] = {&w->out, &w->err};
        for (int k = 0; k < 2; k++) {
            if (ss[k]->open && ss[k]->pty) {
                stream_set_winsize(ss[k], ss[k]->master);
                any = true;
            }
        }
        if (any && w->running)
            kill(w->pid, SIGWINCH);
    }
}

/*
 * Once the consoles are open: unless --tty off, standard error joins standard output when both
 * are one terminal (one block of live lines for both), and SIGWINCH is watched where ddprun has
 * a terminal.
 */
void relay_start(agent *a)
{
    if (a->cfg->tty == DDPRUN_TTY_OFF)
        return;
    ddprun_console_join(a->con[2], a->con[1]);
    if (!isatty(STDOUT_FILENO) && !isatty(STDERR_FILENO))
        return;
    uv_signal_init(a->loop, &a->sigwinch);
    a->sigwinch.data = a;
    uv_signal_start(&a->sigwinch, on_sigwinch, SIGWINCH);
    uv_unref((uv_handle_t *)&a->sigwinch); /* keeps no loop running */
    a->sigwinch_started = true;
}

/* A partial line waited PARTIAL_MS for its newline: out with it (a prompt, a progress bar). */
static void partial_timer_cb(uv_timer_t *t)
{
    stream *s = t->data;
    relay(s, s->len);
}

/*
 * Relays the complete lines held for `s`, and arms its timer for what is left: an unfinished
 * line goes out PARTIAL_MS after its first byte arrived unless its newline comes first.
 */
static void relay_lines(stream *s)
{
    size_t end = s->len;
    while (end > 0 && s->line[end - 1] != '\n')
        end--;
    relay(s, end);
    if (s->len == 0)
        uv_timer_stop(&s->partial_timer);
    else if (end > 0 || !uv_is_active((uv_handle_t *)&s->partial_timer))
        uv_timer_start(&s->partial_timer, partial_timer_cb, PARTIAL_MS, 0);
}

void stream_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    stream *s = h->data;
    (void)suggested;
    if (s->cap - s->len < 16384 && s->cap < LINE_MAX_BYTES) {
        size_t cap = s->cap ? s->cap * 2 : 65536;
        char *p = realloc(s->line, cap);
        if (!p) {
            *buf = uv_buf_init(NULL, 0);
            return;
        }
        s->line = p;
        s->cap = cap;
    }
    *buf = uv_buf_init(s->line + s->len, (unsigned)(s->cap - s->len));
}

static void stream_closed(uv_handle_t *h)
{
    stream *s = h->data;
    if (--s->closing > 0)
        return;
    free(s->line);
    s->line = NULL;
    s->len = s->cap = 0;
    free(s->cur);
    free(s->fl);
    s->cur = s->fl = NULL;
    s->cur_len = s->cur_cap = s->fl_len = s->fl_cap = s->fl_start = 0;
    s->w->a->nstreams--;
    maybe_round_over(s->w->a);
}

/* At the end of a stream: what is held goes out, and a line it left unfinished is ended. */
void stream_close(stream *s)
{
    if (!s->open)
        return;
    if (s->console) {
        relay(s, s->len);
        agent *a = s->w->a;
        int c = s->which == DDPRUN_STD_OUT ? 1 : 2;
        if (s->cur_len > s->cur_pl) { /* a live line left unfinished stays on the console */
            append(&s->cur, &s->cur_len, &s->cur_cap, "\n", 1);
            ddprun_console_show(a->con[c], s, s->cur, s->cur_len, NULL, 0);
        }
        s->cur_len = 0;
        if (a->partial[c] == s) {
            ddprun_console_write(a->con[c], "\n", 1);
            a->partial[c] = NULL;
        }
    }
    s->len = 0;
    if (s->file >= 0 && s->fl_len > 0) /* the final state of an unfinished line */
        write_all(s->file, s->fl, s->fl_len, NULL);
    if (s->file >= 0)
        close(s->file);
    s->file = -1;
    s->open = false;
    s->closing = 2;
    uv_close((uv_handle_t *)&s->partial_timer, stream_closed);
    if (s->pty) {
        uv_close((uv_handle_t *)&s->poll, stream_closed); /* stops polling: the fd may go */
        close(s->master);
        s->master = -1;
    } else {
        uv_close((uv_handle_t *)&s->pipe, stream_closed);
    }
}

/* The log file of `s` cannot be written: say so, and send the rest to the console instead. */
static void log_write_failed(stream *s, int err)
{
    worker *w = s->w;
    agent *a = w->a;
    say("rank %d: cannot write %s/attempt_%d/%d/%s: %s; the rest of its output goes to the "
        "console",
        w->rank, a->logdir, a->restart_count, w->local_rank,
        s->which == DDPRUN_STD_OUT ? "stdout.log" : "stderr.log", strerror(-err));
    close(s->file);
    s->file = -1;
    s->console = true;
}

void stream_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    stream_bytes(st->data, nread);
}

/* `nread` bytes arrived at the end of s->line (stream_alloc()'s buffer), or the stream ended (a
 * negative libuv error: UV_EOF, ...). */
static void stream_bytes(stream *s, ssize_t nread)
{
    if (nread > 0) {
        size_t n = (size_t)nread;
        s->w->last_output_ms = uv_now(s->w->a->loop);
        if (s->which == DDPRUN_STD_ERR) /* kept for the failure summary */
            ddprun_tail_add(&s->w->err_tail, s->line + s->len, n);
        /* Bytes go to the log file as they arrive: no tail thread, no lag (a pseudo-terminal's
         * a line at a time, cleaned). */
        if (s->file >= 0 && s->pty) {
            int rc = file_clean(s, s->line + s->len, n);
            if (rc < 0)
                log_write_failed(s, rc); /* the console gets this chunk and the rest */
        } else if (s->file >= 0) {
            size_t done;
            bool console = s->console;
            int rc = write_all(s->file, s->line + s->len, n, &done);
            if (rc < 0) {
                log_write_failed(s, rc);
                if (!console) { /* what the file did not take goes to the console */
                    memmove(s->line + s->len, s->line + s->len + done, n - done);
                    n -= done;
                }
            }
        }
        s->len += n;
        if (!s->console) {
            s->len = 0;
            return;
        }
        if (s->len == s->cap) /* a line longer than the buffer: pass it on as it is */
            relay(s, s->len);
        relay_lines(s);
        return;
    }
    if (nread < 0)
        stream_close(s);
}

/*
 * Reads at once what the worker left in the pipe (or terminal) of `s`, as a read would have on the
 * next turn of the loop (on_worker_exit(): the worker's last words, before its failure is
 * recorded). Stops at an empty pipe, at 1 MiB, or when the console pauses the stream; the end of
 * the stream is left for libuv to see.
 */
void stream_drain(stream *s)
{
    uv_os_fd_t fd = s->master;
    if (!s->open || s->paused || (!s->pty && uv_fileno((uv_handle_t *)&s->pipe, &fd) < 0))
        return;
    for (size_t got = 0; got < (1u << 20) && s->open && !s->paused;) {
        uv_buf_t b;
        stream_alloc(s->pty ? (uv_handle_t *)&s->poll : (uv_handle_t *)&s->pipe, 65536, &b);
        ssize_t k = !b.len   ? -1
                    : s->pty ? read(fd, b.base, b.len)
                             : recv(fd, b.base, b.len, MSG_DONTWAIT);
        if (k <= 0)
            return;
        stream_bytes(s, k);
        got += (size_t)k;
    }
}
