/*
 * Unit tests of the programs' shared command-line helpers (rendezvous/common/cli.c): the value parsers
 * (ranges, the syntax every program accepted before they were shared, error sentences that name
 * the flag, out-parameters untouched on failure), lists of integers, the report of a failed parse,
 * the table lookups, getopt_long's tables built from a table (and getopt_long run on them), and
 * --help's layout.
 *
 * Everything here is pure; help output is captured with open_memstream.
 */
#include "cli.h"
#include "check_main.h"

#include <check.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Asserts that the last failure's sentence contains `frag`. */
#define ERR_HAS(frag)                                                                              \
    ck_assert_msg(strstr(cli_last_error(), frag), "'%s' not in '%s'", frag, cli_last_error())

START_TEST(integers)
{
    long v = 7;
    int i = 7;
    ck_assert_int_eq(cli_parse_long("--n", "42", 0, 100, &v), 0);
    ck_assert_int_eq(v, 42);
    ck_assert_int_eq(cli_parse_long("--n", "-5", -10, 10, &v), 0);
    ck_assert_int_eq(v, -5);
    ck_assert_int_eq(cli_parse_long("--n", "+3", 0, 10, &v), 0); /* strtol's syntax */
    ck_assert_int_eq(v, 3);
    ck_assert_int_eq(cli_parse_long("--n", " 4", 0, 10, &v), 0);
    ck_assert_int_eq(v, 4);
    ck_assert_int_eq(cli_parse_int("--n", "2147483647", 0, INT_MAX, &i), 0);
    ck_assert_int_eq(i, INT_MAX);

    v = 7;
    ck_assert_int_eq(cli_parse_long("--port", "abc", 0, 65535, &v), -EINVAL);
    ck_assert_str_eq(cli_last_error(), "--port: expected an integer from 0 to 65535, got 'abc'");
    ck_assert_int_eq(v, 7); /* written only on success */
    ck_assert_int_eq(cli_parse_long("--port", "65536", 0, 65535, &v), -EINVAL);
    ck_assert_int_eq(cli_parse_long("--port", "", 0, 65535, &v), -EINVAL);
    ck_assert_int_eq(cli_parse_long("--port", NULL, 0, 65535, &v), -EINVAL);
    ck_assert_int_eq(cli_parse_long("--port", "5x", 0, 65535, &v), -EINVAL);
    ck_assert_int_eq(cli_parse_long("--port", "5 ", 0, 65535, &v), -EINVAL);
    ck_assert_int_eq(cli_parse_long("--port", "0x10", 0, 65535, &v), -EINVAL);
    ck_assert_int_eq(cli_parse_long("-n", "99999999999999999999", 0, LONG_MAX, &v), -EINVAL);
    ck_assert_str_eq(cli_last_error(),
                     "-n: expected an integer of at least 0, got '99999999999999999999'");
    ck_assert_int_eq(v, 7);
    ck_assert_int_eq(cli_parse_int("--max-restarts", "-1", 0, INT_MAX, &i), -EINVAL);
    ck_assert_str_eq(cli_last_error(),
                     "--max-restarts: expected an integer of at least 0, got '-1'");
    ck_assert_int_eq(cli_parse_int("--x", "3000000000", 0, INT_MAX, &i), -EINVAL);
    ck_assert_int_eq(i, INT_MAX);
}
END_TEST

START_TEST(integer_lists)
{
    int v[4] = {7, 7, 7, 7};
    ck_assert_int_eq(cli_parse_int_list("-n", "2,4", 2, 64, 0, v, 4), 2);
    ck_assert_int_eq(v[0], 2);
    ck_assert_int_eq(v[1], 4);
    ck_assert_int_eq(v[2], 7); /* past the count: untouched */
    /* Empty items are skipped, as strtok() skips them; items take cli_parse_int()'s syntax. */
    ck_assert_int_eq(cli_parse_int_list("-n", ",3,, +5,", 2, 64, 0, v, 4), 2);
    ck_assert_int_eq(v[0], 3);
    ck_assert_int_eq(v[1], 5);
    ck_assert_int_eq(cli_parse_int_list("-s", "auto,0,-10", -100, 100, CLI_ALLOW_AUTO, v, 4), 3);
    ck_assert_int_eq(v[0], CLI_AUTO);
    ck_assert_int_eq(v[1], 0);
    ck_assert_int_eq(v[2], -10);

    /* Failures name the flag and the bad item, and leave out[] as it was. */
    int w[2] = {7, 7};
    ck_assert_int_eq(cli_parse_int_list("-n", "2,1", 2, 64, 0, w, 2), -EINVAL);
    ck_assert_str_eq(cli_last_error(), "-n: expected an integer from 2 to 64, got '1'");
    ck_assert_int_eq(w[0], 7);
    ck_assert_int_eq(cli_parse_int_list("-n", "auto", 2, 64, 0, w, 2), -EINVAL);
    ck_assert_str_eq(cli_last_error(), "-n: expected an integer from 2 to 64, got 'auto'");
    ck_assert_int_eq(cli_parse_int_list("--batch", "1,2,3", 1, 9, 0, w, 2), -EINVAL);
    ck_assert_str_eq(cli_last_error(), "--batch: at most 2 values, got '1,2,3'");
    ck_assert_int_eq(cli_parse_int_list("--batch", ",,", 1, 9, 0, w, 2), -EINVAL);
    ck_assert_str_eq(cli_last_error(),
                     "--batch: expected a comma-separated list of integers, got ',,'");
    ck_assert_int_eq(cli_parse_int_list("--batch", NULL, 1, 9, 0, w, 2), -EINVAL);
    char longer[100];
    memset(longer, '1', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    ck_assert_int_eq(cli_parse_int_list("-n", longer, 1, 9, 0, w, 2), -EINVAL);
    ERR_HAS("-n: expected an integer from 1 to 9, got '1111");
    ck_assert_int_eq(w[0], 7);
    ck_assert_int_eq(w[1], 7);
}
END_TEST

START_TEST(reals_and_seconds)
{
    double d = 9;
    ck_assert_int_eq(cli_parse_double("--f", "0.25", 0, HUGE_VAL, 0, &d), 0);
    ck_assert(d == 0.25);
    ck_assert_int_eq(cli_parse_double("--f", "0", 0, HUGE_VAL, 0, &d), 0);
    ck_assert(d == 0);
    ck_assert_int_eq(cli_parse_double("--f", "1e3", 0, 1000, 0, &d), 0);
    ck_assert(d == 1000);

    d = 9;
    ck_assert_int_eq(cli_parse_double("--f", "0", 0, HUGE_VAL, CLI_OPEN_MIN, &d), -EINVAL);
    ck_assert_str_eq(cli_last_error(), "--f: expected a positive number, got '0'");
    ck_assert_int_eq(cli_parse_seconds("--monitor-interval", "x", 0, HUGE_VAL, 0, &d), -EINVAL);
    ck_assert_str_eq(cli_last_error(),
                     "--monitor-interval: expected a non-negative number of seconds, got 'x'");
    ck_assert_int_eq(cli_parse_seconds("--timeout", "3000000", 0, 2147483, CLI_OPEN_MIN, &d),
                     -EINVAL);
    ck_assert_str_eq(cli_last_error(), "--timeout: expected a number of seconds greater than 0 "
                                       "and at most 2147483, got '3000000'");
    ck_assert_int_eq(cli_parse_double("--f", "-1", 0.5, HUGE_VAL, 0, &d), -EINVAL);
    ck_assert_str_eq(cli_last_error(), "--f: expected a number of at least 0.5, got '-1'");
    ck_assert_int_eq(cli_parse_double("--f", "2", 0, 1, 0, &d), -EINVAL);
    ck_assert_str_eq(cli_last_error(), "--f: expected a number from 0 to 1, got '2'");
    ck_assert_int_eq(cli_parse_double("--f", "inf", 0, HUGE_VAL, 0, &d), -EINVAL);
    ck_assert_int_eq(cli_parse_double("--f", "nan", 0, HUGE_VAL, 0, &d), -EINVAL);
    ck_assert_int_eq(cli_parse_double("--f", "1s", 0, HUGE_VAL, 0, &d), -EINVAL);
    ck_assert_int_eq(cli_parse_double("--f", "", 0, HUGE_VAL, 0, &d), -EINVAL);
    ck_assert(d == 9);
}
END_TEST

START_TEST(sizes)
{
    size_t z = 5;
    /* Every spelling ddp-rendezvous, coll-bench or membw accepted before. */
    static const struct {
        const char *s;
        size_t want;
    } ok[] = {
        {"0", 0},          {"8", 8},          {"1k", 1024},       {"1K", 1024},
        {"64M", 64 << 20}, {"64m", 64 << 20}, {"2G", 2ull << 30}, {"2g", 2ull << 30},
        {"+8", 8},         {" 8", 8},         {"008", 8},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        ck_assert_msg(cli_parse_size("-b", ok[i].s, 0, SIZE_MAX, &z) == 0, "'%s': %s", ok[i].s,
                      cli_last_error());
        ck_assert_uint_eq(z, ok[i].want);
    }
    static const char *const bad[] = {"",
                                      "-1",
                                      "- 1",
                                      "K",
                                      "1KB",
                                      "1T",
                                      "1.5M",
                                      "1 K",
                                      "1K ",
                                      "0x10",
                                      "x",
                                      "18446744073709551616",
                                      "17179869184G"};
    z = 5;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(cli_parse_size("-b/--minbytes", bad[i], 0, SIZE_MAX, &z) == -EINVAL,
                      "'%s' accepted", bad[i]);
        ERR_HAS("-b/--minbytes: expected a size in bytes (N, NK, NM or NG, powers of 1024)");
    }
    ck_assert_uint_eq(z, 5);
    ck_assert_int_eq(cli_parse_size("--f", NULL, 0, SIZE_MAX, &z), -EINVAL);

    /* Ranges: ddp-rendezvous's limits are at least 1. */
    ck_assert_int_eq(cli_parse_size("--max-key-bytes", "0", 1, SIZE_MAX, &z), -EINVAL);
    ck_assert_str_eq(cli_last_error(), "--max-key-bytes: expected a size in bytes (N, NK, NM or "
                                       "NG, powers of 1024) of at least 1, got '0'");
    ck_assert_int_eq(cli_parse_size("--s", "2K", 1, 1024, &z), -EINVAL);
    ERR_HAS("from 1 to 1024, got '2K'");
    ck_assert_int_eq(cli_parse_size("--s", "1K", 1, 1024, &z), 0);
    ck_assert_uint_eq(z, 1024);
}
END_TEST

START_TEST(choices)
{
    static const char *const words[] = {"sgd", "adamw", NULL};
    int i = -1;
    ck_assert_int_eq(cli_parse_choice("--optimizer", "adamw", "optimizer", words, &i), 0);
    ck_assert_int_eq(i, 1);
    ck_assert_int_eq(cli_parse_choice("--optimizer", "sgd", "optimizer", words, &i), 0);
    ck_assert_int_eq(i, 0);
    ck_assert_int_eq(cli_parse_choice("--optimizer", "adam", "optimizer", words, &i), -EINVAL);
    ck_assert_int_eq(i, 0);
    ck_assert_str_eq(cli_last_error(), "--optimizer: unknown optimizer 'adam' (sgd, adamw)");
    ck_assert_int_eq(cli_parse_choice("--optimizer", NULL, "optimizer", words, &i), -EINVAL);
    ERR_HAS("unknown optimizer '' (sgd, adamw)");
}
END_TEST

START_TEST(host_ports)
{
    char host[16] = "unchanged";
    int port = -1;
    ck_assert_int_eq(cli_parse_host_port("--upstream", "node0:29500", host, sizeof host, &port), 0);
    ck_assert_str_eq(host, "node0");
    ck_assert_int_eq(port, 29500);
    ck_assert_int_eq(cli_parse_host_port("--upstream", "[::1]:1", host, sizeof host, &port), 0);
    ck_assert_str_eq(host, "::1");
    ck_assert_int_eq(port, 1);
    static const char *const bad[] = {"node0",
                                      "node0:",
                                      ":29500",
                                      "node0:0",
                                      "node0:65536",
                                      "node0:-1",
                                      "node0:+1",
                                      "::1:29500",
                                      "[::1]29500",
                                      "[]:29500",
                                      "a]:1",
                                      "node0: 1",
                                      "a-very-long-host-name:1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(cli_parse_host_port("--upstream", bad[i], host, sizeof host, &port) ==
                          -EINVAL,
                      "'%s' accepted", bad[i]);
        ERR_HAS("--upstream: expected HOST:PORT (an IPv6 address in brackets, PORT from 1 to "
                "65535), got '");
    }
    ck_assert_str_eq(host, "::1");
    ck_assert_int_eq(port, 1);
    ck_assert_int_eq(cli_parse_host_port("--upstream", NULL, host, sizeof host, &port), -EINVAL);
}
END_TEST

enum { O_JSON = 256, O_VERSION, O_TWO };

static const cli_option table[] = {
    {'b', {"-b", "--minbytes"}, "BYTES", "8", 0, "Smallest size."},
    {'I', {"-I", "--inplace"}, NULL, NULL, 0, "Run in place."},
    {O_JSON, {"--json"}, "FILE", NULL, 0, "Write JSON."},
    {O_TWO, {"--nproc-per-node", "--nproc_per_node"}, "N", "1", 1, "Workers per node."},
    {O_VERSION, {"--version"}, NULL, NULL, 0, "Show the version."},
};
#define NTABLE (sizeof table / sizeof table[0])

START_TEST(lookups)
{
    char buf[64];
    ck_assert_ptr_eq(cli_by_id(table, NTABLE, O_JSON), &table[2]);
    ck_assert_ptr_null(cli_by_id(table, NTABLE, 'z'));
    ck_assert_str_eq(cli_long_name(&table[0]), "--minbytes");
    ck_assert_str_eq(cli_label(&table[0], buf, sizeof buf), "-b/--minbytes");
    ck_assert_str_eq(cli_label(&table[3], buf, sizeof buf), "--nproc-per-node/--nproc_per_node");
    ck_assert_str_eq(cli_label(&table[3], buf, 6), "--npr");

    ck_assert_int_eq(cli_find(table, NTABLE, "--json", 6, 0), 2);
    ck_assert_int_eq(cli_find(table, NTABLE, "-b", 2, 0), 0);
    ck_assert_int_eq(cli_find(table, NTABLE, "--nproc_per_node=4", 16, 0), 3);
    ck_assert_int_eq(cli_find(table, NTABLE, "--js", 4, 0), -EINVAL);
    ck_assert_str_eq(cli_last_error(), "unknown option '--js'");
    ck_assert_int_eq(cli_find(table, NTABLE, "--js", 4, CLI_FIND_PREFIX), 2);
    /* Both spellings of one option share the prefix: not ambiguous. */
    ck_assert_int_eq(cli_find(table, NTABLE, "--nproc", 7, CLI_FIND_PREFIX), 3);
    ck_assert_int_eq(cli_find(table, NTABLE, "--", 2, CLI_FIND_PREFIX), -EINVAL);
    ck_assert_int_eq(cli_find(table, NTABLE, "-x", 2, CLI_FIND_PREFIX), -EINVAL);
    ck_assert_str_eq(cli_last_error(), "unknown option '-x'");

    static const cli_option two[] = {
        {1, {"--max-restarts"}, "N", NULL, 0, ""},
        {2, {"--master-port"}, "N", NULL, 0, ""},
    };
    ck_assert_int_eq(cli_find(two, 2, "--ma", 4, CLI_FIND_PREFIX), -EINVAL);
    ck_assert_str_eq(cli_last_error(),
                     "ambiguous option '--ma' could be --max-restarts or --master-port");
    ck_assert_int_eq(cli_find(two, 2, "--mast", 6, CLI_FIND_PREFIX), 1);
}
END_TEST

START_TEST(getopt_tables)
{
    struct option lo[CLI_GETOPT_LONG_MAX(NTABLE)];
    char sh[CLI_GETOPT_SHORT_MAX(NTABLE)];
    ck_assert_int_eq(cli_getopt(table, NTABLE, lo, CLI_GETOPT_LONG_MAX(NTABLE), sh, sizeof sh), 0);
    ck_assert_str_eq(sh, ":b:I");
    ck_assert_str_eq(lo[0].name, "minbytes");
    ck_assert_int_eq(lo[0].has_arg, required_argument);
    ck_assert_int_eq(lo[0].val, 'b');
    ck_assert_str_eq(lo[1].name, "inplace");
    ck_assert_int_eq(lo[1].has_arg, no_argument);
    ck_assert_str_eq(lo[3].name, "nproc-per-node");
    ck_assert_str_eq(lo[4].name, "nproc_per_node");
    ck_assert_int_eq(lo[4].val, O_TWO);
    ck_assert_ptr_null(lo[6].name);

    /* getopt_long on them: both spellings, =VALUE, a missing value. */
    char *argv[] = {"prog", "-b", "64M", "--nproc_per_node=2", "--inplace", "--json", NULL};
    int argc = 6, c, seen = 0;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, sh, lo, NULL)) != -1) {
        if (c == 'b') {
            ck_assert_str_eq(optarg, "64M");
            seen |= 1;
        } else if (c == O_TWO) {
            ck_assert_str_eq(optarg, "2");
            seen |= 2;
        } else if (c == 'I') {
            seen |= 4;
        } else if (c == ':') {
            ck_assert_int_eq(optopt, O_JSON);
            seen |= 8;
        } else {
            ck_abort_msg("getopt_long returned %d", c);
        }
    }
    ck_assert_int_eq(seen, 15);

    /* Too little room; ids that getopt_long could not return. */
    ck_assert_int_eq(cli_getopt(table, NTABLE, lo, 3, sh, sizeof sh), -ENOSPC);
    ck_assert_int_eq(cli_getopt(table, NTABLE, lo, CLI_GETOPT_LONG_MAX(NTABLE), sh, 3), -ENOSPC);
    static const cli_option bad_id[] = {{'x', {"-b", "--b"}, NULL, NULL, 0, ""}};
    ck_assert_int_eq(cli_getopt(bad_id, 1, lo, 4, sh, 4), -EINVAL);
    static const cli_option low_id[] = {{3, {"--long"}, NULL, NULL, 0, ""}};
    ck_assert_int_eq(cli_getopt(low_id, 1, lo, 4, sh, 4), -EINVAL);
    static const cli_option bad_name[] = {{'b', {"-bb"}, NULL, NULL, 0, ""}};
    ck_assert_int_eq(cli_getopt(bad_name, 1, lo, 4, sh, 4), -EINVAL);
}
END_TEST

START_TEST(getopt_build)
{
    /* The same tables as cli_getopt() builds, in a struct sized for any program's table. */
    cli_getopt_tables g;
    struct option lo[CLI_GETOPT_LONG_MAX(NTABLE)];
    char sh[CLI_GETOPT_SHORT_MAX(NTABLE)];
    ck_assert_int_eq(cli_getopt_build(&g, table, NTABLE), 0);
    ck_assert_int_eq(cli_getopt(table, NTABLE, lo, CLI_GETOPT_LONG_MAX(NTABLE), sh, sizeof sh), 0);
    ck_assert_str_eq(g.shorts, sh);
    for (size_t i = 0; i < CLI_GETOPT_LONG_MAX(NTABLE) && lo[i].name; i++) {
        ck_assert_str_eq(g.longopts[i].name, lo[i].name);
        ck_assert_int_eq(g.longopts[i].val, lo[i].val);
    }
    static cli_option many[CLI_GETOPT_MAX + 1];
    for (int i = 0; i <= CLI_GETOPT_MAX; i++)
        many[i] = (cli_option){256 + i, {"--x"}, NULL, NULL, 0, ""};
    ck_assert_int_eq(cli_getopt_build(&g, many, CLI_GETOPT_MAX), 0);
    ck_assert_int_eq(cli_getopt_build(&g, many, CLI_GETOPT_MAX + 1), -ENOSPC);
    static const cli_option low_id[] = {{3, {"--long"}, NULL, NULL, 0, ""}};
    ck_assert_int_eq(cli_getopt_build(&g, low_id, 1), -EINVAL);
}
END_TEST

/* Runs fn(f) on a memory stream and returns what it wrote (static storage). */
static const char *capture(void (*fn)(FILE *))
{
    static char *buf;
    size_t len;
    free(buf);
    buf = NULL;
    FILE *f = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(f);
    fn(f);
    fclose(f);
    return buf;
}

static void help_below(FILE *f)
{
    cli_print_options(f, table, 3, 0, CLI_HELP_WIDTH);
}

static void help_beside(FILE *f)
{
    cli_print_option(f, &table[2], NULL, 20, CLI_HELP_WIDTH);
    cli_print_option(f, &table[3], "Workers per node, a positive integer.", 20, 0);
    static const char *text = "one two three four five six seven eight nine ten eleven twelve "
                              "thirteen fourteen";
    cli_print_option(f, &table[1], text, 40, CLI_HELP_WIDTH);
    cli_print_option(f, &table[1], text, 20, 0); /* one line, however long */
}

static void wrapped(FILE *f)
{
    cli_print_wrapped(f, "usage: prog [OPTIONS]  with  spaces", 0);
    cli_print_wrapped(f, "", 4);
    cli_print_wrapped(f,
                      "aaaaaaaaa bbbbbbbbb ccccccccc ddddddddd eeeeeeeee fffffffff ggggggggg "
                      "hhhhhhhhh iiiiiiiii",
                      2);
}

START_TEST(help_layout)
{
    ck_assert_str_eq(capture(help_below), "  -b, --minbytes BYTES\n"
                                          "        Smallest size. (default: 8)\n"
                                          "  -I, --inplace\n"
                                          "        Run in place.\n"
                                          "  --json FILE\n"
                                          "        Write JSON.\n");
    ck_assert_str_eq(capture(help_beside),
                     "  --json FILE       Write JSON.\n"
                     "  --nproc-per-node, --nproc_per_node N\n"
                     "                    Workers per node, a positive integer.\n"
                     "  -I, --inplace                         one two three four five six seven "
                     "eight\n"
                     "                                        nine ten eleven twelve thirteen "
                     "fourteen\n"
                     "  -I, --inplace     one two three four five six seven eight nine ten eleven "
                     "twelve thirteen fourteen\n");
    ck_assert_str_eq(capture(wrapped), "usage: prog [OPTIONS] with spaces\n"
                                       "\n"
                                       "  aaaaaaaaa bbbbbbbbb ccccccccc ddddddddd eeeeeeeee "
                                       "fffffffff ggggggggg\n"
                                       "  hhhhhhhhh iiiiiiiii\n");
}
END_TEST

static void report_ok(FILE *f)
{
    ck_assert_int_eq(cli_report(f, "prog", 0), 0);
    ck_assert_int_eq(cli_report(f, "prog", 3), 3);
}

static void report_bad(FILE *f)
{
    int n = 0;
    ck_assert_int_eq(cli_report(f, "membw", cli_parse_int("-t", "x", 1, 64, &n)), -EINVAL);
}

static void msg_two(FILE *f)
{
    cli_msg(f, "ddp-train", "rank %d: %s", 3, "cannot reach the store");
    cli_msg(f, "ddp-ckpt", "%s", "");
}

START_TEST(report)
{
    /* Success passes through silently; a failure prints the program and the parser's sentence. */
    ck_assert_str_eq(capture(report_ok), "");
    ck_assert_str_eq(capture(report_bad), "membw: -t: expected an integer from 1 to 64, got 'x'\n");
    /* cli_msg: "PROG: message", one line each. */
    ck_assert_str_eq(capture(msg_two), "ddp-train: rank 3: cannot reach the store\nddp-ckpt: \n");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cli_helpers");
    check_tcase(s, "cli", 30, integers, integer_lists, report, reals_and_seconds, sizes, choices,
                host_ports, lookups, getopt_tables, getopt_build, help_layout);

    return check_run(s);
}
