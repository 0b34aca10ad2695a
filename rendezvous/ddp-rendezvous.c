/*
 * ddp-rendezvous: the librendezvous store as a program. `serve` runs a TCPStore-compatible
 * server in the foreground; `proxy` runs a per-node store proxy (rdzv_proxy) in front of one;
 * the other commands (set, get, add, wait, barrier, del, keys, status) are one-shot clients for
 * job schedulers' shell scripts.
 *
 * One table, `options[]` (the programs' cli_option, cli.h), describes every option: its
 * spellings, argument, help text and the commands it applies to; `rules[]`, by the same ids, how
 * its value is checked and where it is stored. Parsing, applicability checks and --help are all
 * driven by them, and tests/rendezvous/test_cli.sh checks that every option --help prints is in
 * ddp-rendezvous(1), so the three cannot drift apart.
 *
 * Exit codes (documented in the man page; keep the two in step): 0 success, 1 operation failed,
 * 2 usage error (as ddprun's), 3 timed out.
 *
 * Not here: daemonising, pid files, log files (the scheduler or service manager owns those), and
 * environment variables (scripts pass --host "$MASTER_ADDR" --port "$MASTER_PORT" explicitly).
 * Arguments that start with '-' are options unless they are exactly "-" or look like a negative
 * number; "--" ends the options, so `set KEY -- -value` stores "-value".
 */
#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <uv.h>

#include "cli.h"
#include "monoclock.h"
#include "rdzv.h"
#include "version.h"

#define PROG "ddp-rendezvous"

enum exit_code { EXIT_OK = 0, EXIT_FAILED = 1, EXIT_USAGE = 2, EXIT_TIMEOUT = 3 };

#define DEFAULT_HOST "127.0.0.1"
#define DEFAULT_PORT 29500 /* torchrun's */
#define DEFAULT_TIMEOUT_S 300.0

/* ------------------------------------------------------------------------------------------ */
/* Commands                                                                                    */
/* ------------------------------------------------------------------------------------------ */

enum cmd {
    CMD_SERVE,
    CMD_SET,
    CMD_GET,
    CMD_ADD,
    CMD_WAIT,
    CMD_BARRIER,
    CMD_DEL,
    CMD_KEYS,
    CMD_STATUS,
    CMD_PROXY,
    CMD_COUNT
};

#define ON(c) (1u << (c))
#define ON_SERVE ON(CMD_SERVE)
#define ON_CLIENT                                                                                  \
    (ON(CMD_SET) | ON(CMD_GET) | ON(CMD_ADD) | ON(CMD_WAIT) | ON(CMD_BARRIER) | ON(CMD_DEL) |      \
     ON(CMD_KEYS) | ON(CMD_STATUS))
#define ON_PROXY ON(CMD_PROXY)
#define ON_ALL (ON_SERVE | ON_CLIENT | ON_PROXY)

struct command {
    const char *name;
    const char *args; /* positional arguments, for usage lines */
    int min_args;
    int max_args; /* -1: no upper bound */
    const char *help;
};

static const struct command commands[CMD_COUNT] = {
    [CMD_SERVE] = {"serve", "", 0, 0, "run a store server in the foreground"},
    [CMD_SET] = {"set", "KEY VALUE", 2, 2, "store VALUE under KEY ('-' reads it from stdin)"},
    [CMD_GET] = {"get", "KEY", 1, 1, "wait for KEY, write its value to stdout"},
    [CMD_ADD] = {"add", "KEY DELTA", 2, 2, "add DELTA to the integer under KEY, print the sum"},
    [CMD_WAIT] = {"wait", "KEY...", 1, -1, "wait until every KEY exists"},
    [CMD_BARRIER] = {"barrier", "NAME WORLD_SIZE", 2, 2,
                     "wait until WORLD_SIZE processes entered barrier NAME"},
    [CMD_DEL] = {"del", "KEY", 1, 1, "delete KEY, print 1 if it existed, 0 if not"},
    [CMD_KEYS] = {"keys", "", 0, 0, "print the keys (under --prefix), one a line, sorted"},
    [CMD_STATUS] = {"status", "", 0, 0, "print the server's status as JSON"},
    [CMD_PROXY] = {"proxy", "", 0, 0,
                   "run a store proxy in the foreground, one connection to --upstream"},
};

/* ------------------------------------------------------------------------------------------ */
/* Options                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* Everything the command line can set; options[] stores into it by offset. */
struct config {
    int cmd;                 /* enum cmd, or -1 before the command word is seen */
    rdzv_server_options srv; /* serve: bind address, limits (port is copied in later) */
    int port;                /* both: --port */
    const char *host;        /* clients */
    double timeout_s;        /* clients */
    double connect_timeout_s; /* clients: how long refused connections are retried */
    const char *prefix;      /* clients */
    const char *token_file;  /* both: --token-file */
    const char **allow;      /* serve: every --allow, in order (room for argc of them) */
    size_t nallow;
    int quiet, verbose, help, version;
    int allow_other_users; /* serve: --allow-other-users, given (> 0) or not */
    const char *upstream;  /* proxy: --upstream HOST:PORT */
    /* proxy: the HOST of --upstream, brackets removed, and its PORT */
    char upstream_host[256];
    int upstream_port;
};

enum opt_id {
    O_BIND,
    O_LISTEN_FD,
    O_BACKLOG,
    O_KEEPALIVE,
    O_MAX_KEY_BYTES,
    O_MAX_VALUE_BYTES,
    O_MAX_KEYS_PER_REQUEST,
    O_MAX_REQUEST_BYTES,
    O_MAX_TOTAL_BYTES,
    O_MAX_CONNECTIONS,
    O_MAX_PENDING_OUTPUT,
    O_ALLOW,
    O_ALLOW_OTHER_USERS,
    O_MAX_CONN_OUTPUT,
    O_MAX_BUFFERED,
    O_IDLE_TIMEOUT,
    O_REQUEST_TIMEOUT,
    O_MAX_PRIVATE_BYTES,
    O_MAX_LIST_KEYS,
    O_AUTH_TIMEOUT,
    O_MAX_PROBATION,
    O_MAX_PROBATION_PER_ADDRESS,
    O_QUIET,
    O_VERBOSE,
    O_HOST,
    O_TIMEOUT,
    O_CONNECT_TIMEOUT,
    O_PREFIX,
    O_PORT,
    O_TOKEN_FILE,
    O_HELP,
    O_VERSION,
    O_UPSTREAM,
    O_COUNT
};

/*
 * The option table (cli.h): spellings, argument, the ON() mask of the commands it applies to
 * (the tag column) and help. Keep ddp-rendezvous(1) in step: tests/rendezvous/test_cli.sh fails
 * when an option printed by --help is missing from the man page or vice versa. How each value is
 * checked and where it is stored is in `rules` below, by the same ids.
 */
static const cli_option options[] = {
    /* serve */
    {O_BIND,
     {"--bind"},
     "ADDR",
     NULL,
     ON_SERVE | ON_PROXY,
     "address to listen on (" DEFAULT_HOST "; 0.0.0.0 or :: for all)"},
    {O_LISTEN_FD,
     {"--listen-fd"},
     "FD",
     NULL,
     ON_SERVE,
     "serve on an inherited, bound TCP socket instead of --bind/--port"},
    {O_BACKLOG, {"--backlog"}, "N", NULL, ON_SERVE, "listen(2) backlog"},
    {O_KEEPALIVE,
     {"--keepalive"},
     "SECONDS",
     NULL,
     ON_SERVE,
     "TCP keepalive idle time for clients; 0 turns it off"},
    {O_MAX_KEY_BYTES, {"--max-key-bytes"}, "SIZE", NULL, ON_SERVE, "longest key"},
    {O_MAX_VALUE_BYTES,
     {"--max-value-bytes"},
     "SIZE",
     NULL,
     ON_SERVE | ON(CMD_SET),
     "longest value in one request; set: most read from stdin"},
    {O_MAX_KEYS_PER_REQUEST,
     {"--max-keys-per-request"},
     "N",
     NULL,
     ON_SERVE,
     "keys in one wait, check, multi-get or multi-set"},
    {O_MAX_REQUEST_BYTES, {"--max-request-bytes"}, "SIZE", NULL, ON_SERVE, "largest request"},
    {O_MAX_TOTAL_BYTES,
     {"--max-total-bytes"},
     "SIZE",
     NULL,
     ON_SERVE,
     "keys, values and their overhead stored, all together"},
    {O_MAX_CONNECTIONS,
     {"--max-connections"},
     "N",
     NULL,
     ON_SERVE,
     "simultaneous client connections; 0: from the descriptor limit"},
    {O_MAX_PENDING_OUTPUT,
     {"--max-pending-output"},
     "SIZE",
     NULL,
     ON_SERVE,
     "unsent reply bytes per client before reading pauses"},
    {O_ALLOW,
     {"--allow"},
     "CIDR",
     NULL,
     ON_SERVE,
     "serve unauthenticated peers of this network too (repeatable)"},
    {O_ALLOW_OTHER_USERS,
     {"--allow-other-users"},
     NULL,
     NULL,
     ON_SERVE | ON_PROXY,
     "serve other local users' connections too"},
    {O_MAX_CONN_OUTPUT,
     {"--max-conn-output"},
     "SIZE",
     NULL,
     ON_SERVE,
     "unsent reply bytes per client before it is disconnected"},
    {O_MAX_BUFFERED,
     {"--max-buffered"},
     "SIZE",
     NULL,
     ON_SERVE,
     "unsent replies and partial requests of all clients together"},
    {O_IDLE_TIMEOUT,
     {"--idle-timeout"},
     "SECONDS",
     NULL,
     ON_SERVE,
     "disconnect clients silent this long that wait for nothing; 0: never"},
    {O_REQUEST_TIMEOUT,
     {"--request-timeout"},
     "SECONDS",
     NULL,
     ON_SERVE,
     "disconnect clients whose request stays incomplete this long; 0: never"},
    {O_MAX_PRIVATE_BYTES,
     {"--max-private-bytes"},
     "SIZE",
     NULL,
     ON_SERVE,
     "the job's private keys and their overhead, apart from --max-total-bytes"},
    {O_MAX_LIST_KEYS,
     {"--max-list-keys"},
     "N",
     NULL,
     ON_SERVE,
     "refuse list-keys requests on a store holding more keys than this"},
    {O_AUTH_TIMEOUT,
     {"--auth-timeout"},
     "SECONDS",
     NULL,
     ON_SERVE,
     "with --token-file: disconnect strangers not authenticated this long; 0: never"},
    {O_MAX_PROBATION,
     {"--max-probation"},
     "N",
     NULL,
     ON_SERVE,
     "strangers not yet authenticated at once; 0: half of --max-connections"},
    {O_MAX_PROBATION_PER_ADDRESS,
     {"--max-probation-per-address"},
     "N",
     NULL,
     ON_SERVE,
     "of those, from one address; 0: no cap"},
    {O_QUIET, {"--quiet"}, NULL, NULL, ON_SERVE | ON_PROXY, "log warnings and errors only"},
    {O_VERBOSE, {"--verbose"}, NULL, NULL, ON_SERVE | ON_PROXY, "log debugging detail too"},
    /* clients */
    {O_HOST, {"--host"}, "HOST", NULL, ON_CLIENT, "server to talk to (" DEFAULT_HOST ")"},
    {O_TIMEOUT,
     {"--timeout"},
     "SECONDS",
     NULL,
     ON_CLIENT,
     "give up after this long, connecting included (300)"},
    {O_CONNECT_TIMEOUT,
     {"--connect-timeout"},
     "SECONDS",
     NULL,
     ON_CLIENT,
     "retry refused connections this long, for a store starting up (0)"},
    {O_PREFIX, {"--prefix"}, "P", NULL, ON_CLIENT, "prepend P to every key"},
    /* both */
    {O_PORT,
     {"--port"},
     "PORT",
     NULL,
     ON_ALL,
     "TCP port (29500); serve or proxy --port 0 picks a free one"},
    {O_TOKEN_FILE,
     {"--token-file"},
     "PATH",
     NULL,
     ON_ALL,
     "the job's secret: serve and proxy require it, clients authenticate"},
    {O_HELP, {"-h", "--help"}, NULL, NULL, ON_ALL, "print this help and exit"},
    {O_VERSION, {"--version"}, NULL, NULL, ON_ALL, "print the version and exit"},
    /* proxy */
    {O_UPSTREAM,
     {"--upstream"},
     "HOST:PORT",
     NULL,
     ON_PROXY,
     "the root store (a ddp-rendezvous serve) to carry every connection to"},
};

enum kind {
    KIND_FLAG,     /* no argument; increments an int */
    KIND_STRING,   /* stores the argument (borrowed from argv) */
    KIND_INT,      /* int within [min, max] */
    KIND_SIZE,     /* size_t within [min, max] (max 0: no bound), optional K/M/G suffix */
    KIND_SECONDS,  /* double in (0, max] */
    KIND_SECONDS0, /* double in [0, max] */
    KIND_LIST,     /* appends the argument (borrowed) to cfg->allow */
};

/*
 * How the value of each option is checked, and where in struct config it goes. The bounds of
 * the server's limits are the library's own (rdzv.h), so that what the flags accept is what
 * rdzv_server_create() takes, and a value out of range is a usage error naming the flag and
 * the range rather than the server's "Invalid argument". --help shows the bounded ones.
 */
struct rule {
    enum kind kind;
    size_t offset;
    long min, max;
};

#define AT(field) offsetof(struct config, field)

static const struct rule rules[O_COUNT] = {
    [O_BIND] = {KIND_STRING, AT(srv.host), 0, 0},
    [O_LISTEN_FD] = {KIND_INT, AT(srv.listen_fd), 0, INT_MAX},
    [O_BACKLOG] = {KIND_INT, AT(srv.backlog), 1, INT_MAX},
    [O_KEEPALIVE] = {KIND_INT, AT(srv.keepalive_s), 0, RDZV_KEEPALIVE_MAX_S},
    [O_MAX_KEY_BYTES] = {KIND_SIZE, AT(srv.max_key_bytes), 1, RDZV_KEY_BYTES_MAX},
    [O_MAX_VALUE_BYTES] = {KIND_SIZE, AT(srv.max_value_bytes), 1, 0},
    [O_MAX_KEYS_PER_REQUEST] = {KIND_SIZE, AT(srv.max_keys_per_request), 1, 0},
    [O_MAX_REQUEST_BYTES] = {KIND_SIZE, AT(srv.max_request_bytes), RDZV_REQUEST_BYTES_MIN,
                             RDZV_REQUEST_BYTES_MAX},
    [O_MAX_TOTAL_BYTES] = {KIND_SIZE, AT(srv.max_total_bytes), 1, 0},
    [O_MAX_CONNECTIONS] = {KIND_SIZE, AT(srv.max_connections), 0, 0},
    [O_MAX_PENDING_OUTPUT] = {KIND_SIZE, AT(srv.max_pending_output), 1, 0},
    [O_ALLOW] = {KIND_LIST, AT(allow), 0, 0},
    [O_ALLOW_OTHER_USERS] = {KIND_FLAG, AT(allow_other_users), 0, 0},
    [O_MAX_CONN_OUTPUT] = {KIND_SIZE, AT(srv.max_conn_output), 1, 0},
    [O_MAX_BUFFERED] = {KIND_SIZE, AT(srv.max_buffered_bytes), 1, 0},
    [O_IDLE_TIMEOUT] = {KIND_INT, AT(srv.idle_timeout_s), 0, (long)CLI_SECONDS_MAX},
    [O_REQUEST_TIMEOUT] = {KIND_INT, AT(srv.request_timeout_s), 0, (long)CLI_SECONDS_MAX},
    [O_MAX_PRIVATE_BYTES] = {KIND_SIZE, AT(srv.max_private_bytes), 1, 0},
    [O_MAX_LIST_KEYS] = {KIND_SIZE, AT(srv.max_list_keys), 1, 0},
    [O_AUTH_TIMEOUT] = {KIND_INT, AT(srv.auth_timeout_s), 0, (long)CLI_SECONDS_MAX},
    [O_MAX_PROBATION] = {KIND_SIZE, AT(srv.max_probation), 0, 0},
    [O_MAX_PROBATION_PER_ADDRESS] = {KIND_SIZE, AT(srv.max_probation_per_address), 0, 0},
    [O_QUIET] = {KIND_FLAG, AT(quiet), 0, 0},
    [O_VERBOSE] = {KIND_FLAG, AT(verbose), 0, 0},
    [O_HOST] = {KIND_STRING, AT(host), 0, 0},
    [O_TIMEOUT] = {KIND_SECONDS, AT(timeout_s), 0, (long)CLI_SECONDS_MAX},
    [O_CONNECT_TIMEOUT] = {KIND_SECONDS0, AT(connect_timeout_s), 0, (long)CLI_SECONDS_MAX},
    [O_PREFIX] = {KIND_STRING, AT(prefix), 0, 0},
    [O_PORT] = {KIND_INT, AT(port), 0, 65535},
    [O_TOKEN_FILE] = {KIND_STRING, AT(token_file), 0, 0},
    [O_HELP] = {KIND_FLAG, AT(help), 0, 0},
    [O_VERSION] = {KIND_FLAG, AT(version), 0, 0},
    [O_UPSTREAM] = {KIND_STRING, AT(upstream), 0, 0},
};

#define NOPTIONS (sizeof(options) / sizeof(options[0]))
_Static_assert(NOPTIONS == O_COUNT, "one row of options[] per enum opt_id");

/* ------------------------------------------------------------------------------------------ */
/* Messages                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/* Prints "ddp-rendezvous: <message>" to stderr and returns `code`, for `return complain(...)`. */
static int complain(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int complain(int code, const char *fmt, ...)
{
    va_list ap;

    fputs(PROG ": ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return code;
}

static const char *level_name(int level)
{
    switch (level) {
    case RDZV_LOG_ERROR:
        return "error";
    case RDZV_LOG_WARN:
        return "warning";
    case RDZV_LOG_INFO:
        return "info";
    default:
        return "debug";
    }
}

/* The server's log hook; `arg` points at the highest level to print. */
static void log_line(void *arg, int level, const char *msg)
{
    if (level <= *(const int *)arg)
        fprintf(stderr, PROG ": %s: %s\n", level_name(level), msg);
}

/* ------------------------------------------------------------------------------------------ */
/* Help                                                                                        */
/* ------------------------------------------------------------------------------------------ */

/* Formats a size the way --max-*-bytes accepts it: "8K", "64M", "1G", or plain bytes. */
static void format_size(char *buf, size_t len, size_t n)
{
    static const char suffix[] = "GMK";
    for (int i = 0; i < 3; i++) {
        size_t unit = (size_t)1 << (10 * (3 - i));
        if (n >= unit && n % unit == 0) {
            snprintf(buf, len, "%zu%c", n / unit, suffix[i]);
            return;
        }
    }
    snprintf(buf, len, "%zu", n);
}

/* The default of a server option: its field in `defs`, a struct filled by options_init. */
static const void *server_default(const rdzv_server_options *defs, const cli_option *o)
{
    size_t offset = rules[o->id].offset;
    assert((o->tag & ON_SERVE) && offset >= offsetof(struct config, srv));
    return (const char *)defs + (offset - offsetof(struct config, srv));
}

/* One option of --help on one line, the text beside the spellings from column 33. */
static void print_option(FILE *f, const cli_option *o, const rdzv_server_options *defs)
{
    char text[256], def[112] = "";
    const struct rule *r = &rules[o->id];

    /* Server limits show the library's own defaults, so they cannot go stale here, and the
     * range where it is narrower than the type's. */
    if ((o->tag & ON_SERVE) && r->kind == KIND_SIZE) {
        char n[32], lo[32], hi[32];
        format_size(n, sizeof(n), *(const size_t *)server_default(defs, o));
        format_size(lo, sizeof(lo), (size_t)r->min);
        format_size(hi, sizeof(hi), (size_t)r->max);
        if (r->max)
            snprintf(def, sizeof(def), " (%s; %s to %s)", n, lo, hi);
        else
            snprintf(def, sizeof(def), " (%s)", n);
    } else if (o->tag == ON_SERVE && r->kind == KIND_INT && o->id != O_LISTEN_FD) {
        int n = *(const int *)server_default(defs, o);
        if (r->max < INT_MAX)
            snprintf(def, sizeof(def), " (%d; %ld to %ld)", n, r->min, r->max);
        else
            snprintf(def, sizeof(def), " (%d)", n);
    }
    snprintf(text, sizeof(text), "%s%s", o->help, def);
    cli_print_option(f, o, text, 33, 0);
}

/* The options of one group: those for `mask` exactly, and with ON_SERVE those of serve that
 * some client commands take too (listed with serve, their help saying which). */
static void print_options(FILE *f, unsigned mask, const rdzv_server_options *defs)
{
    for (size_t i = 0; i < NOPTIONS; i++) {
        unsigned tag = (unsigned)options[i].tag;
        if (tag == mask || (mask == ON_SERVE && (tag & ON_SERVE) && tag != ON_ALL))
            print_option(f, &options[i], defs);
    }
}

static void print_help(FILE *f, int cmd)
{
    rdzv_server_options defs;

    rdzv_server_options_init(&defs);
    if (cmd >= 0) {
        const struct command *c = &commands[cmd];
        fprintf(f, "Usage: " PROG " %s%s%s [OPTIONS]\n%c%s.\n\nOptions:\n", c->name,
                *c->args ? " " : "", c->args, toupper((unsigned char)c->help[0]), c->help + 1);
        for (size_t i = 0; i < NOPTIONS; i++)
            if ((unsigned)options[i].tag & ON(cmd))
                print_option(f, &options[i], &defs);
    } else {
        fputs("Usage: " PROG " COMMAND [OPTIONS] [ARGS]\n"
              "A key-value store compatible with PyTorch's TCPStore, and a client for scripts.\n"
              "\nCommands:\n",
              f);
        for (int i = 0; i < CMD_COUNT; i++) {
            char left[64];
            snprintf(left, sizeof(left), "%s%s%s", commands[i].name, *commands[i].args ? " " : "",
                     commands[i].args);
            fprintf(f, "  %-30s %s\n", left, commands[i].help);
        }
        fputs("\nServer options (serve):\n", f);
        print_options(f, ON_SERVE, &defs);
        fputs("\nProxy options (proxy; --bind, --allow-other-users, --quiet and --verbose too):\n",
              f);
        print_options(f, ON_PROXY, &defs);
        fputs("\nClient options (set, get, add, wait, barrier, del, keys, status):\n", f);
        print_options(f, ON_CLIENT, &defs);
        fputs("\nOptions for all commands:\n", f);
        print_options(f, ON_ALL, &defs);
        fputs("\nSIZE and N take a K, M or G suffix (powers of 1024). SECONDS of --timeout may\n"
              "be fractional. Options may come before or after the command; \"--\" ends them.\n",
              f);
    }
    fputs("\nExit status: 0 success, 1 operation failed, 2 usage error, 3 timed out.\n"
          "See ddp-rendezvous(1).\n",
          f);
}

/* ------------------------------------------------------------------------------------------ */
/* Parsing                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* Parses a whole decimal integer in [min, max]. Returns 0 and sets *out, or -1. */
static int parse_int(const char *s, long min, long max, long *out)
{
    return cli_parse_long("", s, min, max, out) < 0 ? -1 : 0;
}

/* Checks and stores the value of option `o`; prints the usage error and returns -1 if bad. */
static int set_option(struct config *cfg, const cli_option *o, const char *val)
{
    const struct rule *r = &rules[o->id];
    const char *flag = cli_long_name(o);
    void *field = (char *)cfg + r->offset;

    switch (r->kind) {
    case KIND_FLAG:
        (*(int *)field)++;
        return 0;
    case KIND_STRING:
        *(const char **)field = val;
        return 0;
    case KIND_INT: {
        long v;
        if (parse_int(val, r->min, r->max, &v) < 0) {
            /* This wording, not cli's, is the one ddp-rendezvous(1) quotes. */
            complain(EXIT_USAGE, "%s: expected an integer %ld..%ld, got '%s'", flag, r->min, r->max,
                     val);
            return -1;
        }
        *(int *)field = (int)v;
        return 0;
    }
    case KIND_SIZE:
        if (cli_parse_size(flag, val, (size_t)r->min, r->max ? (size_t)r->max : SIZE_MAX,
                           (size_t *)field) < 0) {
            complain(EXIT_USAGE, "%s", cli_last_error());
            return -1;
        }
        return 0;
    case KIND_LIST:
        if (cfg->nallow == RDZV_ALLOW_MAX) {
            complain(EXIT_USAGE, "%s: at most %d networks", flag, RDZV_ALLOW_MAX);
            return -1;
        }
        cfg->allow[cfg->nallow++] = val;
        return 0;
    case KIND_SECONDS:
    case KIND_SECONDS0:
        if (cli_parse_seconds(flag, val, 0, (double)r->max,
                              r->kind == KIND_SECONDS ? CLI_OPEN_MIN : 0, (double *)field) < 0) {
            complain(EXIT_USAGE, "%s", cli_last_error());
            return -1;
        }
        return 0;
    }
    return -1;
}

/* An argument is an option if it starts with '-', unless it is "-" or a negative number. */
static bool looks_like_option(const char *a)
{
    return a[0] == '-' && a[1] != '\0' && !(a[1] >= '0' && a[1] <= '9');
}

/*
 * Parses argv into *cfg and the positional arguments into pos[] (the command name excluded),
 * in place. Returns -1 for "exit now with EXIT_USAGE" (the message is printed), or the number
 * of positional arguments. cfg->cmd is -1 when no command was named.
 */
static int parse_args(int argc, char **argv, struct config *cfg, char **pos)
{
    bool seen[O_COUNT] = {0};
    int npos = 0, have_cmd = 0;
    bool options_done = false;

    cfg->cmd = -1;
    for (int i = 1; i < argc; i++) {
        char *a = argv[i];
        const cli_option *o;
        const char *val = NULL, *eq;

        if (options_done || !looks_like_option(a)) {
            if (!have_cmd) {
                int c;
                for (c = 0; c < CMD_COUNT; c++)
                    if (strcmp(a, commands[c].name) == 0)
                        break;
                if (c == CMD_COUNT) {
                    if (strcmp(a, "help") == 0) {
                        cfg->help++;
                        continue;
                    }
                    complain(EXIT_USAGE, "unknown command '%s' (try '" PROG " --help')", a);
                    return -1;
                }
                cfg->cmd = c;
                have_cmd = 1;
            } else {
                pos[npos++] = a;
            }
            continue;
        }
        if (strcmp(a, "--") == 0) {
            options_done = true;
            continue;
        }
        /* Long options may carry "=VALUE"; the one short option, -h, may not. */
        eq = a[1] == '-' ? strchr(a, '=') : NULL;
        int k = cli_find(options, NOPTIONS, a, eq ? (size_t)(eq - a) : strlen(a), 0);
        if (k < 0) {
            complain(EXIT_USAGE, "%s", cli_last_error());
            return -1;
        }
        o = &options[k];
        if (!o->metavar) {
            if (eq) {
                complain(EXIT_USAGE, "%s: takes no argument", cli_long_name(o));
                return -1;
            }
        } else if (eq) {
            val = eq + 1;
        } else if (i + 1 < argc) {
            val = argv[++i];
        } else {
            complain(EXIT_USAGE, "%s: missing argument %s", cli_long_name(o), o->metavar);
            return -1;
        }
        if (set_option(cfg, o, val) < 0)
            return -1;
        seen[o->id] = true;
    }

    if (cfg->help || cfg->version || !have_cmd)
        return npos;

    for (size_t k = 0; k < NOPTIONS; k++) {
        if (seen[options[k].id] && !((unsigned)options[k].tag & ON(cfg->cmd))) {
            complain(EXIT_USAGE, "%s: does not apply to '%s'", cli_long_name(&options[k]),
                     commands[cfg->cmd].name);
            return -1;
        }
    }
    {
        const struct command *c = &commands[cfg->cmd];
        if (npos < c->min_args || (c->max_args >= 0 && npos > c->max_args)) {
            complain(EXIT_USAGE, "%s: expected %s, got %d argument%s", c->name,
                     *c->args ? c->args : "no arguments", npos, npos == 1 ? "" : "s");
            fprintf(stderr, "Usage: " PROG " %s%s%s [OPTIONS]\n", c->name, *c->args ? " " : "",
                    c->args);
            return -1;
        }
    }
    if (cfg->cmd == CMD_SERVE) {
        if (seen[O_LISTEN_FD] && (seen[O_BIND] || seen[O_PORT])) {
            complain(EXIT_USAGE, "--listen-fd: cannot be combined with --bind or --port");
            return -1;
        }
    } else if (cfg->cmd == CMD_PROXY) {
        if (!cfg->upstream) {
            complain(EXIT_USAGE, "proxy: --upstream HOST:PORT is required (the root store)");
            return -1;
        }
        if (cli_parse_host_port("--upstream", cfg->upstream, cfg->upstream_host,
                                sizeof cfg->upstream_host, &cfg->upstream_port) < 0) {
            complain(EXIT_USAGE, "%s", cli_last_error());
            return -1;
        }
    } else if (cfg->port == 0) {
        complain(EXIT_USAGE, "--port: expected an integer 1..65535, got '0'");
        return -1;
    }
    return npos;
}

/*
 * Reads --token-file, when given, into buf. Returns 0, or -1 after printing why (never the
 * token).
 */
static int read_token(const struct config *cfg, char *buf, size_t cap)
{
    if (!cfg->token_file)
        return 0;
    int rc = rdzv_token_read_file(cfg->token_file, buf, cap);
    if (rc == -EINVAL)
        complain(EXIT_USAGE,
                 "--token-file %s: the file must hold one token of %d to %d printable "
                 "characters without spaces",
                 cfg->token_file, RDZV_TOKEN_MIN_BYTES, RDZV_TOKEN_MAX_BYTES);
    else if (rc < 0)
        complain(EXIT_USAGE, "--token-file %s: %s", cfg->token_file, rdzv_strerror(rc));
    return rc < 0 ? -1 : 0;
}

/* ------------------------------------------------------------------------------------------ */
/* serve                                                                                       */
/* ------------------------------------------------------------------------------------------ */

static const int stop_signals[] = {SIGINT, SIGTERM};
#define NSTOP_SIGNALS (sizeof(stop_signals) / sizeof(stop_signals[0]))

struct serve_state {
    rdzv_server *srv;
    uv_signal_t sig[NSTOP_SIGNALS]; /* watchers of stop_signals[] */
    size_t nsig;                    /* how many of them are initialised */
    int log_level;
    rdzv_proxy *proxy; /* proxy: the one served instead of srv */
    int code;          /* proxy: the exit status once the loop ends */
};

/* Logs the proxy's counters, so that an operator sees what it carried and coalesced. */
static void log_proxy_counters(struct serve_state *st)
{
    rdzv_proxy_counters c;
    char msg[256];

    if (rdzv_proxy_stats(st->proxy, &c) < 0)
        return;
    snprintf(msg, sizeof msg,
             "%llu worker connections, %llu worker requests, %llu sent upstream, %llu coalesced, "
             "%llu bytes up, %llu bytes down",
             (unsigned long long)c.accepted, (unsigned long long)c.worker_requests,
             (unsigned long long)c.upstream_requests, (unsigned long long)c.coalesced,
             (unsigned long long)c.bytes_up, (unsigned long long)c.bytes_down);
    log_line(&st->log_level, RDZV_LOG_INFO, msg);
}

/*
 * Closes the server (or the proxy, after logging its counters) and the signal watchers; the loop
 * then runs out of handles and uv_run() returns. The watchers live in `st`, which outlives the loop, so they need no close callback.
 * With them closed, a second signal has its default effect, so a stuck shutdown can still be
 * interrupted.
 */
static void stop_serving(struct serve_state *st)
{
    rdzv_server_close(st->srv);
    st->srv = NULL;
    if (st->proxy)
        log_proxy_counters(st);
    rdzv_proxy_close(st->proxy);
    st->proxy = NULL;
    for (size_t i = 0; i < st->nsig; i++)
        uv_close((uv_handle_t *)&st->sig[i], NULL);
    st->nsig = 0;
}

static void on_signal(uv_signal_t *h, int signum)
{
    struct serve_state *st = h->data;
    char msg[64];

    snprintf(msg, sizeof(msg), "received %s, shutting down",
             signum == SIGINT ? "SIGINT" : "SIGTERM");
    log_line(&st->log_level, RDZV_LOG_INFO, msg);
    stop_serving(st);
}

/* Starts watching stop_signals[] on `loop`. Returns 0, or a libuv error after printing it. */
static int watch_signals(uv_loop_t *loop, struct serve_state *st, const char *cmd)
{
    int rc = 0;

    for (size_t i = 0; i < NSTOP_SIGNALS; i++) {
        rc = uv_signal_init(loop, &st->sig[i]);
        if (rc < 0)
            break;
        st->nsig++;
        st->sig[i].data = st;
        rc = uv_signal_start(&st->sig[i], on_signal, stop_signals[i]);
        if (rc < 0)
            break;
    }
    if (rc < 0)
        complain(EXIT_FAILED, "%s: cannot watch signals: %s", cmd, uv_strerror(rc));
    return rc;
}

/* Runs `loop` until its handles are closed, then closes it. */
static void run_to_end(uv_loop_t *loop, struct serve_state *st)
{
    uv_run(loop, UV_RUN_DEFAULT);
    /* EBUSY would mean a handle the library forgot to close: say so rather than hide it. */
    if (uv_loop_close(loop) == UV_EBUSY)
        log_line(&st->log_level, RDZV_LOG_WARN, "event loop still has handles at exit");
}

static int cmd_serve(struct config *cfg)
{
    struct serve_state st = {0};
    uv_loop_t loop;
    int rc, code = EXIT_FAILED;

    st.log_level = RDZV_LOG_INFO - cfg->quiet + cfg->verbose;
    if (st.log_level < RDZV_LOG_ERROR)
        st.log_level = RDZV_LOG_ERROR;
    cfg->srv.port = cfg->port;
    cfg->srv.log = log_line;
    cfg->srv.log_arg = &st.log_level;
    cfg->srv.allow = cfg->allow;
    cfg->srv.nallow = cfg->nallow;
    cfg->srv.allow_other_users = cfg->allow_other_users > 0;
    char token[RDZV_TOKEN_MAX_BYTES + 1];
    if (read_token(cfg, token, sizeof(token)) < 0)
        return EXIT_USAGE;
    cfg->srv.token = cfg->token_file ? token : NULL;

    /* A client that vanishes must cost an EPIPE on write, not the whole server. */
    signal(SIGPIPE, SIG_IGN);
    rc = uv_loop_init(&loop);
    if (rc < 0)
        return complain(EXIT_FAILED, "serve: cannot create event loop: %s", uv_strerror(rc));
    rc = rdzv_server_create(&loop, &cfg->srv, &st.srv);
    explicit_bzero(token, sizeof(token)); /* the server keeps its own copy */
    if (rc < 0) {
        if (rc == -EINVAL && cfg->nallow > 0)
            complain(EXIT_FAILED, "serve: --allow: expected an address or a network ADDR/BITS");
        else if (cfg->srv.listen_fd >= 0)
            complain(EXIT_FAILED, "serve: cannot serve on fd %d: %s", cfg->srv.listen_fd,
                     rdzv_strerror(rc));
        else
            complain(EXIT_FAILED, "serve: cannot listen on %s%s%s:%d: %s",
                     strchr(cfg->srv.host, ':') ? "[" : "", cfg->srv.host,
                     strchr(cfg->srv.host, ':') ? "]" : "", cfg->port, rdzv_strerror(rc));
        goto out;
    }
    if (watch_signals(&loop, &st, "serve") < 0) {
        stop_serving(&st);
        goto out;
    }

    /*
     * The first line of stdout is the port and nothing else: scripts and tests read it. The
     * library has already logged "listening on HOST:PORT" through our hook while creating the
     * server, so a reader that has the port also finds that line in the log.
     */
    if (printf("%d\n", rdzv_server_port(st.srv)) < 0 || fflush(stdout) != 0)
        log_line(&st.log_level, RDZV_LOG_WARN, "cannot write the port to stdout");
    code = EXIT_OK;

out:
    run_to_end(&loop, &st);
    return code;
}

/* ------------------------------------------------------------------------------------------ */
/* proxy                                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* The proxy's on_lost: the root closed the upstream connection or died. */
static void on_upstream_lost(void *arg)
{
    struct serve_state *st = arg;

    log_line(&st->log_level, RDZV_LOG_ERROR, "the root store is gone; the proxy stops");
    st->code = EXIT_FAILED;
    stop_serving(st);
}

/*
 * Runs a store proxy in front of --upstream until SIGINT/SIGTERM (EXIT_OK) or the loss of the
 * root (EXIT_FAILED). Like serve, the first line of stdout is the port.
 */
static int cmd_proxy(struct config *cfg)
{
    struct serve_state st = {.code = EXIT_OK};
    rdzv_proxy_options o;
    uv_loop_t loop;
    int rc;

    st.log_level = RDZV_LOG_INFO - cfg->quiet + cfg->verbose;
    if (st.log_level < RDZV_LOG_ERROR)
        st.log_level = RDZV_LOG_ERROR;
    rdzv_proxy_options_init(&o);
    o.host = cfg->srv.host;
    o.port = cfg->port;
    o.upstream_host = cfg->upstream_host;
    o.upstream_port = cfg->upstream_port;
    o.allow_other_users = cfg->allow_other_users > 0;
    o.log = log_line;
    o.log_arg = &st.log_level;
    o.on_lost = on_upstream_lost;
    o.on_lost_arg = &st;
    char token[RDZV_TOKEN_MAX_BYTES + 1];
    if (read_token(cfg, token, sizeof(token)) < 0)
        return EXIT_USAGE;
    o.token = cfg->token_file ? token : NULL;

    signal(SIGPIPE, SIG_IGN);
    rc = uv_loop_init(&loop);
    if (rc < 0)
        return complain(EXIT_FAILED, "proxy: cannot create event loop: %s", uv_strerror(rc));
    rc = rdzv_proxy_create(&loop, &o, &st.proxy);
    explicit_bzero(token, sizeof(token)); /* the proxy keeps its own copy */
    if (rc < 0) {
        if (rc == -EPROTONOSUPPORT)
            complain(EXIT_FAILED,
                     "proxy: the store at %s does not multiplex (a PyTorch store or an older "
                     "ddp-rendezvous); the proxy needs a ddp-rendezvous serve upstream",
                     cfg->upstream);
        else
            complain(EXIT_FAILED, "proxy: cannot start in front of %s on %s%s%s:%d: %s",
                     cfg->upstream, strchr(o.host, ':') ? "[" : "", o.host,
                     strchr(o.host, ':') ? "]" : "", o.port, rdzv_strerror(rc));
        st.code = EXIT_FAILED;
        goto out;
    }
    if (watch_signals(&loop, &st, "proxy") < 0) {
        st.code = EXIT_FAILED;
        stop_serving(&st);
        goto out;
    }
    /* The first line of stdout is the port and nothing else, as with serve; the library has
     * logged "listening on ADDR:PORT for the store at HOST:PORT" through our hook. */
    if (printf("%d\n", rdzv_proxy_port(st.proxy)) < 0 || fflush(stdout) != 0)
        log_line(&st.log_level, RDZV_LOG_WARN, "cannot write the port to stdout");

out:
    run_to_end(&loop, &st);
    return st.code;
}

/* ------------------------------------------------------------------------------------------ */
/* Client commands                                                                             */
/* ------------------------------------------------------------------------------------------ */

/* Milliseconds left until `deadline` (mono_now_ns() nanoseconds), at least 1. */
static int ms_left(int64_t deadline)
{
    int left = mono_ms_left(deadline);
    return left < 1 ? 1 : left;
}

/*
 * Reports a failed call and maps it to an exit code: -ETIMEDOUT is EXIT_TIMEOUT, anything else
 * EXIT_FAILED. `c` may be NULL (connect failed).
 */
static int op_failed(const struct config *cfg, const rdzv_client *c, int rc, const char *what)
{
    /* With c == NULL this is the thread's last connect failure. */
    const char *detail = rdzv_client_last_error(c);

    if (rc == -ETIMEDOUT)
        return complain(EXIT_TIMEOUT, "%s: timed out after %g s%s%s%s", what, cfg->timeout_s,
                        detail && *detail ? " (" : "", detail ? detail : "",
                        detail && *detail ? ")" : "");
    if (rc == -ECONNREFUSED)
        return complain(EXIT_FAILED, "%s: %s%s", what, detail && *detail ? detail : "refused",
                        cfg->connect_timeout_s > 0 ? ""
                                                   : "; --connect-timeout SECONDS waits for a "
                                                     "store that is starting up");
    if (detail && *detail)
        return complain(EXIT_FAILED, "%s: %s (%s)", what, rdzv_strerror(rc), detail);
    return complain(EXIT_FAILED, "%s: %s", what, rdzv_strerror(rc));
}

/*
 * Reads all of stdin into *buf (malloc'd) and *len: at most `cap` bytes (the value limit), and
 * only until `deadline` (--timeout). Returns EXIT_OK, or the exit code after printing why.
 */
static int read_stdin(char **buf, size_t *len, size_t cap, int64_t deadline,
                      const struct config *cfg)
{
    size_t have = 0, n = 0;
    char *p = NULL;
    char cap_text[32];

    format_size(cap_text, sizeof cap_text, cap);
    for (;;) {
        if (n == have) {
            size_t more = have ? (have < cap / 2 ? have * 2 : cap + 1) : 65536;
            char *q = realloc(p, more);
            if (!q) {
                free(p);
                return complain(EXIT_FAILED, "set: value on stdin: out of memory");
            }
            p = q;
            have = more;
        }
        struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
        int rc = poll(&pfd, 1, mono_ms_left(deadline));
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc == 0) {
            free(p);
            return complain(EXIT_TIMEOUT,
                            "set: timed out after %g s reading the value from stdin "
                            "(%zu bytes so far)",
                            cfg->timeout_s, n);
        }
        ssize_t got = rc < 0 ? -1 : read(STDIN_FILENO, p + n, have - n);
        if (got < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (got < 0) {
            free(p);
            return complain(EXIT_FAILED, "set: cannot read the value from stdin: %s",
                            strerror(errno));
        }
        if (got == 0)
            break;
        n += (size_t)got;
        if (n > cap) {
            free(p);
            return complain(EXIT_FAILED,
                            "set: the value on stdin is longer than %s bytes, the "
                            "longest value a store takes by default (--max-value-bytes raises "
                            "this limit, for a store served with a higher one)",
                            cap_text);
        }
    }
    *buf = p;
    *len = n;
    return EXIT_OK;
}

/*
 * After an ADD the store closed the connection on: finds out why on a new connection, since the
 * protocol has no error reply. Prints the reason and returns EXIT_FAILED.
 */
static int explain_add(const struct config *cfg, const rdzv_client_options *copts, const char *key,
                       const rdzv_client *failed, int rc)
{
    rdzv_client *c = NULL;
    void *val = NULL;
    size_t len = 0;
    int found = -1;

    if (rdzv_client_connect(cfg->host, cfg->port, copts, &c) == 0) {
        found = rdzv_check(c, &key, 1);
        if (found == 1 && rdzv_get(c, key, &val, &len) < 0)
            found = -1;
    }
    rdzv_client_close(c);
    if (found == 1) {
        char shown[48];
        size_t k = 0;
        for (size_t i = 0; i < len && k + 5 < sizeof shown; i++) {
            unsigned char ch = ((unsigned char *)val)[i];
            k += (size_t)snprintf(shown + k, sizeof shown - k, isprint(ch) ? "%c" : "\\x%02x", ch);
        }
        rdzv_free(val);
        return complain(EXIT_FAILED,
                        "add: the store refused it and closed the connection: the value under "
                        "'%s' (%zu bytes: '%s%s') is not a decimal integer in the 64-bit range",
                        key, len, shown, k + 5 >= sizeof shown ? "..." : "");
    }
    return op_failed(cfg, failed, rc, "add");
}

/* Writes to stdout and flushes; a full disk or closed pipe is an operation failure. */
static int finish_stdout(void)
{
    if (fflush(stdout) != 0 || ferror(stdout))
        return complain(EXIT_FAILED, "cannot write to stdout: %s", strerror(errno));
    return EXIT_OK;
}

static int compare_strings(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmd_client(const struct config *cfg, int npos, char **pos)
{
    rdzv_client_options copts;
    rdzv_client *c = NULL;
    int64_t deadline = mono_now_ns() + (int64_t)(cfg->timeout_s * 1e9);
    char what[96];
    int rc, code = EXIT_OK;
    int64_t n;

    /* Arguments first: a bad DELTA or WORLD_SIZE is a usage error, found before connecting. */
    _Static_assert(sizeof(long) == sizeof(int64_t), "DELTA: a long holds any int64_t");
    long delta = 0, world = 0;
    if (cfg->cmd == CMD_ADD && parse_int(pos[1], LONG_MIN, LONG_MAX, &delta) < 0)
        return complain(EXIT_USAGE, "add: DELTA: expected an integer, got '%s'", pos[1]);
    if (cfg->cmd == CMD_BARRIER && parse_int(pos[1], 1, INT_MAX, &world) < 0)
        return complain(EXIT_USAGE, "barrier: WORLD_SIZE: expected an integer 1..%d, got '%s'",
                        INT_MAX, pos[1]);

    signal(SIGPIPE, SIG_IGN);
    rdzv_client_options_init(&copts);
    copts.connect_timeout_ms = ms_left(deadline);
    copts.timeout_ms = copts.connect_timeout_ms;
    copts.prefix = cfg->prefix;
    char token[RDZV_TOKEN_MAX_BYTES + 1];
    if (read_token(cfg, token, sizeof(token)) < 0)
        return EXIT_USAGE;
    copts.token = cfg->token_file ? token : NULL;
    /* A refused connection fails at once, unless --connect-timeout says to wait for a store
     * that is starting up: then say so, and retry within both bounds. */
    snprintf(what, sizeof(what),
             strchr(cfg->host, ':') ? "cannot connect to [%s]:%d" : "cannot connect to %s:%d",
             cfg->host, cfg->port);
    copts.refused_timeout_ms = 0;
    rc = rdzv_client_connect(cfg->host, cfg->port, &copts, &c);
    if (rc == -ECONNREFUSED && cfg->connect_timeout_s > 0) {
        double wait_s =
            cfg->connect_timeout_s < cfg->timeout_s ? cfg->connect_timeout_s : cfg->timeout_s;
        fprintf(stderr,
                PROG ": %s refused the connection; waiting up to %g s for a store to listen "
                     "there (--connect-timeout)\n",
                what + strlen("cannot connect to "), wait_s);
        copts.connect_timeout_ms = ms_left(deadline);
        copts.refused_timeout_ms = (int)(wait_s * 1000);
        rc = rdzv_client_connect(cfg->host, cfg->port, &copts, &c);
    }
    if (rc < 0) {
        explicit_bzero(token, sizeof(token));
        return op_failed(cfg, NULL, rc, what);
    }

    snprintf(what, sizeof(what), "%s", commands[cfg->cmd].name);
    switch (cfg->cmd) {
    case CMD_SET: {
        char *buf = NULL;
        size_t len = 0;
        if (strcmp(pos[1], "-") == 0) {
            code = read_stdin(&buf, &len, cfg->srv.max_value_bytes, deadline, cfg);
            if (code != EXIT_OK)
                break;
            rc = rdzv_set(c, pos[0], buf, len);
            free(buf);
        } else {
            rc = rdzv_set(c, pos[0], pos[1], strlen(pos[1]));
        }
        /* SET has no reply: a round trip tells whether the server took it or closed on it. */
        if (rc == 0)
            rc = rdzv_ping(c);
        if (rc < 0)
            code = op_failed(cfg, c, rc, what);
        break;
    }
    case CMD_GET: {
        const char *key = pos[0];
        void *val = NULL;
        size_t len = 0;
        /* Wait with the rest of the deadline, so that connect + get keep to --timeout. */
        rc = rdzv_wait_get(c, key, ms_left(deadline), &val, &len);
        if (rc < 0) {
            code = op_failed(cfg, c, rc, what);
            break;
        }
        if (len > 0 && fwrite(val, 1, len, stdout) != len)
            code = complain(EXIT_FAILED, "cannot write to stdout: %s", strerror(errno));
        rdzv_free(val);
        break;
    }
    case CMD_ADD:
        rc = rdzv_add(c, pos[0], (int64_t)delta, &n);
        if (rc == -ECONNRESET) {
            copts.connect_timeout_ms = ms_left(deadline);
            copts.timeout_ms = copts.connect_timeout_ms;
            code = explain_add(cfg, &copts, pos[0], c, rc);
        } else if (rc < 0)
            code = op_failed(cfg, c, rc, what);
        else
            printf("%" PRId64 "\n", n);
        break;
    case CMD_WAIT:
        rc = rdzv_wait(c, (const char *const *)pos, (size_t)npos, ms_left(deadline));
        if (rc < 0)
            code = op_failed(cfg, c, rc, what);
        break;
    case CMD_BARRIER:
        rc = rdzv_barrier(c, pos[0], (int)world, ms_left(deadline));
        if (rc < 0)
            code = op_failed(cfg, c, rc, what);
        break;
    case CMD_DEL:
        rc = rdzv_delete(c, pos[0]);
        if (rc < 0)
            code = op_failed(cfg, c, rc, what);
        else
            printf("%d\n", rc ? 1 : 0);
        break;
    case CMD_KEYS: {
        char **keys = NULL;
        size_t nkeys = 0;
        rc = rdzv_list_keys(c, &keys, &nkeys);
        if (rc < 0) {
            code = op_failed(cfg, c, rc, what);
            break;
        }
        qsort(keys, nkeys, sizeof(*keys), compare_strings);
        for (size_t i = 0; i < nkeys; i++)
            printf("%s\n", keys[i]);
        rdzv_free(keys);
        break;
    }
    case CMD_STATUS: {
        char *json = NULL;
        json_t *root;
        json_error_t err;
        rc = rdzv_status(c, &json);
        if (rc < 0) {
            code = op_failed(cfg, c, rc, what);
            break;
        }
        root = json_loads(json, 0, &err);
        if (!root) {
            code = complain(EXIT_FAILED, "status: the server sent malformed JSON: %s", err.text);
        } else {
            /* 15 digits: an uptime in milliseconds prints as 0.831, not 0.83099999999999996. */
            if (json_dumpf(root, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(15)) < 0)
                code = complain(EXIT_FAILED, "cannot write to stdout: %s", strerror(errno));
            else
                putchar('\n');
            json_decref(root);
        }
        rdzv_free(json);
        break;
    }
    case CMD_SERVE:
    case CMD_PROXY:
    case CMD_COUNT:
        break;
    }
    explicit_bzero(token, sizeof(token)); /* kept until here for explain_add()'s connection */
    rdzv_client_close(c);
    if (code == EXIT_OK)
        code = finish_stdout();
    return code;
}

/* ------------------------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    struct config cfg = {0};
    char **pos;
    int npos;

    rdzv_server_options_init(&cfg.srv);
    cfg.srv.host = DEFAULT_HOST;
    cfg.srv.listen_fd = -1;
    cfg.port = DEFAULT_PORT;
    cfg.host = DEFAULT_HOST;
    cfg.timeout_s = DEFAULT_TIMEOUT_S;
    cfg.prefix = NULL;

    pos = calloc((size_t)argc + 1, sizeof(*pos));
    cfg.allow = calloc((size_t)argc + 1, sizeof(*cfg.allow));
    if (!pos || !cfg.allow) {
        free(pos);
        free(cfg.allow);
        return complain(EXIT_FAILED, "out of memory");
    }
    npos = parse_args(argc, argv, &cfg, pos);
    if (npos < 0) {
        free(pos);
        free(cfg.allow);
        return EXIT_USAGE;
    }
    if (cfg.help) {
        print_help(stdout, cfg.cmd);
        free(pos);
        free(cfg.allow);
        return finish_stdout();
    }
    if (cfg.version) {
        printf(PROG " " DDPRUN_VERSION "\n");
        free(pos);
        free(cfg.allow);
        return finish_stdout();
    }
    if (cfg.cmd < 0) {
        free(pos);
        free(cfg.allow);
        return complain(EXIT_USAGE, "missing command (try '" PROG " --help')");
    }

    int code = cfg.cmd == CMD_SERVE   ? cmd_serve(&cfg)
               : cfg.cmd == CMD_PROXY ? cmd_proxy(&cfg)
                                      : cmd_client(&cfg, npos, pos);
    free(pos);
    free(cfg.allow);
    return code;
}
