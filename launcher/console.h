/*
 * The agent's console: ddprun's standard output and standard error as libuv streams that never
 * block the agent's loop. Bytes written are queued and go out as the console takes them; the
 * queue's length is the caller's signal to slow its producers (back-pressure): a write that
 * leaves more than `limit` bytes queued returns 1, and the drain callback runs once the queue
 * is back to half of it. Internal to the launcher.
 *
 * How the descriptor is used: a terminal, pipe or FIFO is reopened through /proc/self/fd/N, so
 * that the O_NONBLOCK libuv needs is set on a file description of ddprun's own, never on the one
 * the shell (and any worker that writes to the console directly) shares; fd N itself is left as
 * it was. A socket cannot be reopened so: its flags are changed in place and restored by
 * ddprun_console_close() (ddprun_console_shared() tells, and the agent then relays every worker
 * through a pipe). A regular file or a device such as /dev/null never blocks for long and is
 * written synchronously, as is any descriptor libuv cannot watch.
 *
 * On a terminal the console also keeps a block of live lines at its bottom (the unfinished
 * lines of workers that redraw them with carriage returns: progress bars), one per key: every
 * write goes out above the block, which is cleared and drawn again after it with the cursor-up
 * and erase sequences of ANSI terminals (ddprun_console_show()). Lines of the block are cut to
 * the terminal's width so that none wraps.
 */
#ifndef DDPRUN_CONSOLE_H
#define DDPRUN_CONSOLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct ddprun_console ddprun_console;

/* Called on the loop thread when the queue has drained to half its limit after being over it. */
typedef void (*ddprun_console_drain_fn)(void *arg);

/*
 * Opens descriptor `fd` (borrowed; 1 or 2) as a console on `loop`, queueing up to `limit` bytes
 * before writes report back-pressure. Returns 0 and sets *out, -EINVAL or -ENOMEM. Does not
 * fail for a descriptor libuv cannot watch (closed, a file): it is then written synchronously
 * (or not at all, if closed). Call on the loop thread.
 */
int ddprun_console_open(uv_loop_t *loop, int fd, size_t limit, ddprun_console **out);

/* Sets the drain callback (`arg` is borrowed until the console is closed). */
void ddprun_console_on_drain(ddprun_console *c, ddprun_console_drain_fn fn, void *arg);

/*
 * Queues `n` bytes (copied), which reach the console together, after everything queued before
 * them. Returns 1 when more than the limit is queued afterwards (slow down: the drain callback
 * will say when to go on), else 0; -ENOMEM drops the bytes. After a write error (the reader
 * went away: EPIPE) bytes are dropped silently, as a blocking write would lose them. Call on
 * the loop thread.
 */
int ddprun_console_write(ddprun_console *c, const void *p, size_t n);

/*
 * Queues `n` bytes from any thread: they are handed to ddprun_console_write() on the loop
 * thread soon after. For the agent's own log lines from other threads (the store's). At most
 * 64 KiB wait so; more is dropped.
 */
void ddprun_console_post(ddprun_console *c, const void *p, size_t n);

/* Bytes queued and not yet taken by the console. Loop thread. */
size_t ddprun_console_queued(const ddprun_console *c);

/* Bytes the console has taken so far (grows as it makes progress). Loop thread. */
uint64_t ddprun_console_written(const ddprun_console *c);

/* True when the queue is over its limit (producers should wait for the drain callback). */
bool ddprun_console_over(const ddprun_console *c);

/* True when the console's file description is shared with others and made non-blocking. */
bool ddprun_console_shared(const ddprun_console *c);

/*
 * Gives up what is still queued and restores the descriptor's flags where they were changed;
 * the console stays allocated (it may sit in libuv's queues) until the process exits. NULL is a
 * no-op. Call on the loop thread, at exit.
 */
void ddprun_console_close(ddprun_console *c);

/* True when the console is a terminal (the live lines of ddprun_console_show() work there). */
bool ddprun_console_is_tty(const ddprun_console *c);

/*
 * Makes console `c` write through console `with` when both are terminals and the same device
 * (ddprun's standard output and error on one terminal): then one block of live lines serves
 * both, and `with`'s queue and back-pressure (its drain calls `c`'s drain callback too). Returns
 * 1 when joined, 0 when not (different devices, not terminals). Call on the loop thread, before
 * anything is written to `c`.
 */
int ddprun_console_join(ddprun_console *c, ddprun_console *with);

/*
 * On a terminal console: writes `nlines` bytes of complete lines (`lines`, copied; each line
 * ends in '\n'; may be 0 bytes) above the block of live lines, and makes `live` (`nlive`
 * bytes, copied, no newline) the live line of `key` (borrowed as an identity only): a new key
 * goes to the bottom of the block, a known one is redrawn in place, and nlive 0 removes it.
 * The bytes go out in one write. Returns as ddprun_console_write() does.
 */
int ddprun_console_show(ddprun_console *c, const void *key, const char *lines, size_t nlines,
                        const char *live, size_t nlive);

/* Reads the terminal's width again (after SIGWINCH), for cutting live lines. Loop thread. */
void ddprun_console_resized(ddprun_console *c);

#endif /* DDPRUN_CONSOLE_H */
