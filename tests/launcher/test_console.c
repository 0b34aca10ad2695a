/*
 * Unit tests of ddprun's console on a terminal (launcher/console.c): the block of live lines,
 * byte for byte as a pseudo-terminal's master reads them: a new live line at the bottom, one
 * redrawn in place (cursor up, erase the line, down again: no newline), lines written above the
 * block (cleared and drawn again below them), a live line cut to the terminal's width (colour
 * ended) and without the escape sequences that would move the cursor off its row, nothing
 * written for a call that changes nothing, and two consoles on one terminal joined into one
 * block.
 *
 * The console's terminal is the slave side of a pseudo-terminal in raw mode (so the bytes are
 * read back as written), 20 columns wide.
 */
#include "console.h"
#include "check_main.h"

#include <check.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>
#include <uv.h>

static uv_loop_t loop;
static int master = -1, slave = -1;

/* A pseudo-terminal in raw mode, `cols` wide: its master in `master`, its slave in `slave`. */
static void open_terminal(int cols)
{
    master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    ck_assert_int_ge(master, 0);
    ck_assert_int_eq(grantpt(master), 0);
    ck_assert_int_eq(unlockpt(master), 0);
    slave = open(ptsname(master), O_RDWR | O_NOCTTY | O_CLOEXEC);
    ck_assert_int_ge(slave, 0);
    struct termios t;
    ck_assert_int_eq(tcgetattr(slave, &t), 0);
    cfmakeraw(&t);
    ck_assert_int_eq(tcsetattr(slave, TCSANOW, &t), 0);
    struct winsize ws = {.ws_row = 10, .ws_col = (unsigned short)cols};
    ck_assert_int_eq(ioctl(master, TIOCSWINSZ, &ws), 0);
    fcntl(master, F_SETFL, fcntl(master, F_GETFL) | O_NONBLOCK);
    ck_assert_int_eq(uv_loop_init(&loop), 0);
}

/* Everything the console wrote since the last call, checked against `want`. */
static void expect(const char *want)
{
    char got[4096];
    size_t n = 0;
    uv_run(&loop, UV_RUN_NOWAIT);
    for (int idle = 0; idle < 20 && n < sizeof(got) - 1;) {
        ssize_t k = read(master, got + n, sizeof(got) - 1 - n);
        if (k > 0) {
            n += (size_t)k;
            idle = 0;
        } else {
            idle++;
            usleep(1000); /* raw-mode output reaches the master at once; a few reads suffice */
        }
    }
    got[n] = '\0';
    ck_assert_str_eq(got, want);
}

#define SHOW(c, key, lines, live)                                                                  \
    ddprun_console_show(c, key, lines, strlen(lines), live, strlen(live))

START_TEST(live_block)
{
    open_terminal(80);
    ddprun_console *c;
    int k0, k1;
    ck_assert_int_eq(ddprun_console_open(&loop, slave, 1 << 20, &c), 0);
    ck_assert(ddprun_console_is_tty(c));

    ck_assert_int_eq(ddprun_console_write(c, "first\n", 6), 0);
    expect("first\n"); /* no block: as written */
    SHOW(c, &k0, "", "[0]:bar 1");
    expect("[0]:bar 1");
    SHOW(c, &k1, "", "[1]:bar 1");
    expect("\r\n[1]:bar 1"); /* a second live line below the first */
    SHOW(c, &k0, "", "[0]:bar 2");
    expect("\r\033[1A\033[2K[0]:bar 2\r\033[1B"); /* up one, redraw, down: no newline */
    SHOW(c, &k1, "", "[1]:bar 2");
    expect("\r\033[2K[1]:bar 2");
    int k2;
    SHOW(c, &k2, "", "");
    expect(""); /* a key without a live line, and none asked for: nothing */
    ddprun_console_write(c, "msg\n", 4);
    expect("\r\033[1A\033[J"
           "msg\n"
           "[0]:bar 2\r\n[1]:bar 2"); /* above the block */
    SHOW(c, &k0, "[0]:bar done\n", "");
    expect("\r\033[1A\033[J"
           "[0]:bar done\n"
           "[1]:bar 2"); /* k0's line ends above */
    SHOW(c, &k0, "", "");
    expect(""); /* k0's line is gone already: nothing */
    SHOW(c, &k1, "[1]:bar done\n", "");
    expect("\r\033[J[1]:bar done\n");
    ddprun_console_write(c, "last\n", 5);
    expect("last\n"); /* no block left */
}
END_TEST

START_TEST(cut_to_width)
{
    open_terminal(12);
    ddprun_console *c;
    int k;
    ck_assert_int_eq(ddprun_console_open(&loop, slave, 1 << 20, &c), 0);
    SHOW(c, &k, "", "[0]:0123456789abcdef");
    expect("[0]:0123456"); /* 11 columns: never the last */
    SHOW(c, &k, "", "[0]:\033[32m0123456789\033[0m");
    expect("\r\033[2K[0]:\033[32m0123456\033[m"); /* escapes take no column; colour ended */
    SHOW(c, &k, "", "[0]:\t12345678");
    expect("\r\033[2K[0]:\t123"); /* a tab to column 8 */
    SHOW(c, &k, "", "[0]:\033[2K\033[1A\0337ab\033[K\033[0Kc\033[1K\033]0;t\a");
    expect("\r\033[2K[0]:ab\033[K\033[0Kc\033]0;t\a"); /* no cursor moves nor erased prefix */
    ddprun_console_resized(c);
    SHOW(c, &k, "[0]:0123456789abcdef\n", "");
    expect("\r\033[J[0]:0123456789abcdef\n"); /* complete lines are not cut */
}
END_TEST

START_TEST(joined_consoles)
{
    open_terminal(80);
    int other = dup(slave);
    ddprun_console *out, *err;
    int k0, k1;
    ck_assert_int_eq(ddprun_console_open(&loop, slave, 1 << 20, &out), 0);
    ck_assert_int_eq(ddprun_console_open(&loop, other, 1 << 20, &err), 0);
    ck_assert_int_eq(ddprun_console_join(err, out), 1);
    SHOW(out, &k0, "", "[0]:out");
    SHOW(err, &k1, "", "[0]:err");
    expect("[0]:out\r\n[0]:err"); /* one block */
    ddprun_console_write(err, "warning\n", 8);
    expect("\r\033[1A\033[J"
           "warning\n"
           "[0]:out\r\n[0]:err");
    ck_assert_uint_eq(ddprun_console_queued(err), 0);

    /* Another terminal is not joined; nor is a console that is no terminal. */
    int m2 = posix_openpt(O_RDWR | O_NOCTTY), fds[2];
    ck_assert_int_eq(unlockpt(m2), 0);
    int s2 = open(ptsname(m2), O_RDWR | O_NOCTTY);
    ddprun_console *third, *piped;
    ck_assert_int_eq(ddprun_console_open(&loop, s2, 1 << 20, &third), 0);
    ck_assert_int_eq(ddprun_console_join(third, out), 0);
    ck_assert_int_eq(pipe(fds), 0);
    ck_assert_int_eq(ddprun_console_open(&loop, fds[1], 1 << 20, &piped), 0);
    ck_assert(!ddprun_console_is_tty(piped));
    ck_assert_int_eq(ddprun_console_join(piped, out), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("console");
    check_tcase(s, "terminal", 10, live_block, cut_to_width, joined_consoles);
    return check_run(s);
}
