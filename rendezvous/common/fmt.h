/*
 * The sentences every component gives for the same things, written once: a set of ranks
 * ("1, 3, 5 and 2 more"), the ranks that did not arrive in time ("ranks 1, 3 did not publish
 * /job/x within 300 ms (3 of 5 present)"), a network endpoint ("[::1]:29500"), and the
 * sentence of a failure into a caller's error buffer (fmt_err()).
 *
 * Pure: no I/O, no allocation; thread-safe. Every function writes a NUL-terminated string into
 * the caller's buffer, cut to its size. Internal to the project: not installed.
 */
#ifndef DDP_FMT_H
#define DDP_FMT_H

#include <stdbool.h>
#include <stddef.h>

/* Ranks named in a list by fmt_rank_list(); the rest are counted. */
#define FMT_SHOW_RANKS 16

/*
 * Writes the ranks i with flags[i] set (i < n) into buf as "1, 3, 5", the first
 * FMT_SHOW_RANKS of them, then " and K more". Returns how many flags are set, or -EINVAL (NULL
 * argument, n < 0, cap == 0).
 */
int fmt_rank_list(const bool *flags, int n, char *buf, size_t cap);

/*
 * Writes the one sentence the project gives for ranks that did not arrive in time into buf:
 * "<noun>s <list> <what> (<k> of <n> present)", with the ranks i < n that have missing[i] set
 * listed as fmt_rank_list() does, the noun singular for one rank, and k the ranks present. For
 * example noun "rank" and what "did not publish /job/x within 300 ms" give "ranks 1, 3 did not
 * publish /job/x within 300 ms (3 of 5 present)"; noun "node rank" and what "did not show up
 * within 0.5 s" give "node rank 2 did not show up within 0.5 s (3 of 4 present)". With no rank
 * missing buf receives "". `noun` and `what` are borrowed. Returns how many ranks are missing,
 * or -EINVAL (NULL argument, n < 0, cap == 0).
 */
int fmt_missing_ranks(const bool *missing, int n, const char *noun, const char *what, char *buf,
                      size_t cap);

/*
 * Writes "host:port" into dst (cap bytes) for messages, bracketing an IPv6 literal:
 * "[::1]:29500".
 */
void fmt_endpoint(char *dst, size_t cap, const char *host, int port);

/*
 * Writes a formatted sentence into the caller's error buffer err (cap bytes; nothing when err is
 * NULL or cap is 0) and returns rc, so that a failure path of a function taking (err, errlen)
 * reads `return fmt_err(err, errlen, -EINVAL, "...", ...)`.
 */
int fmt_err(char *err, size_t cap, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif /* DDP_FMT_H */
