/*
 * cli: the programs' shared command-line helpers. One option-table type that feeds the parser
 * (through getopt_long or a program's own loop) and --help alike, so that --help and, through
 * tests/test_help_man.sh, the man page cannot drift from what the parser accepts; and one parser
 * each for integers, lists of integers, real numbers, seconds and byte sizes, whose error
 * sentences name the flag.
 *
 * Internal to the project's programs (ddprun, ddp-rendezvous, coll-bench, coll-check and the
 * other benchmarks): a static library, not part of librendezvous.so, and not installed.
 *
 * Conventions: the parsers are pure. They never print and never exit: they return 0, or a
 * negative errno (-EINVAL, -ENOSPC) and leave one sentence for cli_last_error(), which names the
 * flag as the caller spelled it ("--port: expected an integer from 0 to 65535, got 'abc'").
 * The program adds its own name (cli_report() prints the two together) and picks the exit code.
 * Out-parameters are written only on success. Strings passed in are borrowed for the call. Every
 * function is thread-safe; the error sentence is kept per thread. The functions that print write
 * only to the FILE given.
 */
#ifndef DDP_CLI_H
#define DDP_CLI_H

#include <getopt.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>

/*
 * One option of a program's table.
 *
 * id: the program's name for the option, what its parser switches on. With cli_getopt(), an
 * option that has a short spelling must have that character as its id (getopt_long returns the
 * character for both spellings), and long-only options need ids of 256 and above.
 *
 * names: the spellings as typed, dashes included: {"-b", "--minbytes"}, {"--nproc-per-node",
 * "--nproc_per_node"}; unused slots NULL. --help lists them in this order.
 */
typedef struct cli_option {
    int id;
    const char *names[3];
    const char *metavar; /* the value's name in --help ("BYTES"); NULL: a flag, no value */
    const char *def;     /* the default as --help shows it; NULL or "": none shown */
    int tag;             /* the program's own (ddprun: PET_<NAME> may set it; ddp-rendezvous:
                            the commands it applies to); cli never looks at it */
    const char *help;    /* full sentences */
} cli_option;

/* ------------------------------------------------------------------------------------------ */
/* Values                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/*
 * The sentence the calling thread's last failed cli_ call left: never NULL, "" before any
 * failure. Valid until the thread's next cli_ call that fails.
 */
const char *cli_last_error(void);

/*
 * Parses a decimal integer in [min, max] (strtol's syntax: optional leading white space and
 * sign, then digits, and nothing after them). `flag` names the option in the error sentence:
 * "FLAG: expected an integer from MIN to MAX, got 'S'" ("of at least MIN" when max is INT_MAX or
 * more). Returns 0 and sets *out, or -EINVAL.
 */
int cli_parse_long(const char *flag, const char *s, long min, long max, long *out);

/* cli_parse_long() for an int. */
int cli_parse_int(const char *flag, const char *s, int min, int max, int *out);

/* Flags of cli_parse_double() and cli_parse_seconds(). */
enum {
    CLI_OPEN_MIN = 1, /* the lower bound itself is out of range: (min, max] */
};

/*
 * Parses a finite real number in [min, max] (strtod's syntax, nothing after it); max may be
 * HUGE_VAL for "no upper bound". With CLI_OPEN_MIN, min itself is rejected. The error sentence
 * reads "FLAG: expected a non-negative number, got 'S'" (min 0, no upper bound; "a positive
 * number" with CLI_OPEN_MIN), else "expected a number from MIN to MAX" and the like. Returns 0
 * and sets *out, or -EINVAL.
 */
int cli_parse_double(const char *flag, const char *s, double min, double max, int flags,
                     double *out);

/*
 * The longest duration any program's option takes: INT_MAX milliseconds (about 24.8 days), so
 * that every timeout converts to an int of milliseconds (a libuv timer, a client's timeout_ms)
 * without overflow. The upper bound a program passes to cli_parse_seconds().
 */
#define CLI_SECONDS_MAX ((double)(INT_MAX / 1000))

/* cli_parse_double() whose error sentence says "number of seconds". */
int cli_parse_seconds(const char *flag, const char *s, double min, double max, int flags,
                      double *out);

/*
 * Parses a byte size in [min, max]: a decimal integer (strtoull's syntax without a sign of '-':
 * optional leading white space and '+') with an optional suffix K, M or G in either case for
 * 2^10, 2^20 or 2^30 bytes ("64M" is 67108864): the one syntax of every program's byte sizes.
 * Returns 0 and sets *out, or -EINVAL (also for a size that does not fit a size_t).
 */
int cli_parse_size(const char *flag, const char *s, size_t min, size_t max, size_t *out);

/*
 * Parses one of a set of words: `names` is NULL-terminated, and *index is set to the position of
 * the one s equals. `noun` names what they are in the error sentence: "FLAG: unknown NOUN 'S'
 * (A, B, C)". Returns 0, or -EINVAL.
 */
int cli_parse_choice(const char *flag, const char *s, const char *noun, const char *const *names,
                     int *index);

/*
 * Parses an endpoint "HOST:PORT" ("[ADDR]:PORT" for an IPv6 literal) with PORT from 1 to 65535.
 * The host, brackets removed, is copied into host[0..cap) with its NUL. The error sentence reads
 * "FLAG: expected HOST:PORT (an IPv6 address in brackets, PORT from 1 to 65535), got 'S'".
 * Returns 0 and sets host and *port, or -EINVAL (also for a host of cap bytes or more).
 */
int cli_parse_host_port(const char *flag, const char *s, char *host, size_t cap, int *port);

/* Flags of cli_parse_int_list(). */
enum {
    CLI_ALLOW_AUTO = 1, /* an item may be the word "auto", which stands for CLI_AUTO */
};

#define CLI_AUTO INT_MIN /* "auto" in a list parsed with CLI_ALLOW_AUTO */

/*
 * Parses a comma-separated list of decimal integers in [min, max] (min > INT_MIN), each as
 * cli_parse_int() takes it, into out[0..cap): "2,4,8". Empty items are skipped, as strtok()
 * skips them. With CLI_ALLOW_AUTO an item may be "auto", stored as CLI_AUTO. Returns the number
 * of items (at least 1) and fills out[], or -EINVAL with the sentence of cli_parse_int() for a bad
 * item, "FLAG: at most CAP values, got 'S'" or "FLAG: expected a comma-separated list of
 * integers, got 'S'" (no item at all).
 */
int cli_parse_int_list(const char *flag, const char *s, int min, int max, int flags, int *out,
                       size_t cap);

/*
 * Passes `rc`, what a cli_ parser returned, through; when it is negative, first writes
 * "PROG: <cli_last_error()>" and a newline to f. The step "parse, print the error naming the
 * flag, fail" of a program's option loop, for every parser:
 *
 *     if (cli_report(stderr, "membw", cli_parse_int(flag, optarg, 1, 64, &n)) < 0)
 *         return 2;
 */
int cli_report(FILE *f, const char *prog, int rc);

/*
 * Writes "PROG: <message>" and a newline to f in one locked write (threads do not interleave
 * within it), and in one write(2) up to 4 KiB (nor do processes sharing the file or pipe): the
 * form of every message a program prints. A program names itself once,
 *
 *     #define err(...) cli_msg(stderr, "ddp-train", __VA_ARGS__)
 */
void cli_msg(FILE *f, const char *prog, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), nonnull(1, 2, 3)));

/* ------------------------------------------------------------------------------------------ */
/* Option tables                                                                              */
/* ------------------------------------------------------------------------------------------ */

/* The option of table opts[0..n) whose id is `id`, or NULL. */
const cli_option *cli_by_id(const cli_option *opts, size_t n, int id);

/* The first long spelling ("--x...") of o, or its first spelling when it has none. */
const char *cli_long_name(const cli_option *o);

/* Writes every spelling of o, joined by '/' ("-b/--minbytes"), into buf; returns buf. */
const char *cli_label(const cli_option *o, char *buf, size_t cap);

/* Flags of cli_find(). */
enum {
    CLI_FIND_PREFIX = 1, /* a long option may be abbreviated to a prefix of one option's
                            spellings, as Python's argparse and getopt_long allow */
};

/*
 * Finds the option that arg[0..len) names (len excludes any "=VALUE"): the one with exactly that
 * spelling, else, with CLI_FIND_PREFIX and an arg of the form "--x...", the one option some of
 * whose spellings start with it. Returns its index in opts, or -EINVAL with the sentence
 * "unknown option 'ARG'" or "ambiguous option 'ARG' could be --a or --b".
 */
int cli_find(const cli_option *opts, size_t n, const char *arg, size_t len, int flags);

/* Room that cli_getopt() needs for a table of n options. */
#define CLI_GETOPT_LONG_MAX(n) (3 * (n) + 1)
#define CLI_GETOPT_SHORT_MAX(n) (2 * (n) + 2)

/*
 * Builds getopt_long's tables from opts[0..n): longopts (room for `nlong` entries, at least
 * CLI_GETOPT_LONG_MAX(n)) gets every long spelling, returning the option's id, and a zeroed
 * terminator; shorts (room for `nshort` bytes, at least CLI_GETOPT_SHORT_MAX(n)) gets ':' (so a
 * missing value is reported as ':' rather than '?') then every short letter, followed by ':'
 * when the option takes a value. Returns 0, -ENOSPC when the room is short, or -EINVAL for a
 * short spelling whose letter is not the option's id, a long-only option with an id below 256,
 * or a spelling that is neither "-x" nor "--x...".
 */
int cli_getopt(const cli_option *opts, size_t n, struct option *longopts, size_t nlong,
               char *shorts, size_t nshort);

#define CLI_GETOPT_MAX 64 /* options in a table that cli_getopt_tables serves */

/* getopt_long's tables for a table of up to CLI_GETOPT_MAX options, on the program's stack. */
typedef struct cli_getopt_tables {
    struct option longopts[CLI_GETOPT_LONG_MAX(CLI_GETOPT_MAX)];
    char shorts[CLI_GETOPT_SHORT_MAX(CLI_GETOPT_MAX)];
} cli_getopt_tables;

/*
 * cli_getopt() into t, sized for the program: then getopt_long(argc, argv, t->shorts,
 * t->longopts, NULL) parses by opts[0..n). Returns 0, -ENOSPC (n > CLI_GETOPT_MAX) or -EINVAL as
 * cli_getopt() does.
 */
int cli_getopt_build(cli_getopt_tables *t, const cli_option *opts, size_t n);

/* ------------------------------------------------------------------------------------------ */
/* --help                                                                                     */
/* ------------------------------------------------------------------------------------------ */

#define CLI_HELP_WIDTH 80 /* columns --help is wrapped to */

/*
 * Writes text word-wrapped to CLI_HELP_WIDTH columns, every line indented by `indent` spaces,
 * and a newline.
 */
void cli_print_wrapped(FILE *f, const char *text, int indent);

/*
 * Writes o's entry of --help: "  -b, --minbytes BYTES", then `text` (NULL: o->help) word-wrapped
 * to `width` columns (CLI_HELP_WIDTH, or 0 for one line however long). help_col 0 puts the text
 * on the lines below, indented by 8; otherwise the text starts in column help_col of the same
 * line when the spellings leave room (on the next line when not), and wrapped lines are
 * indented to help_col.
 */
void cli_print_option(FILE *f, const cli_option *o, const char *text, int help_col, int width);

/*
 * cli_print_option() for each option of opts[0..n), with " (default: DEF)" after the help text
 * of the options that have a def.
 */
void cli_print_options(FILE *f, const cli_option *opts, size_t n, int help_col, int width);

#endif /* DDP_CLI_H */
