/*
 * Unit tests of the project's error codes across its libraries. Failures errno cannot name get
 * project codes, one range per library, so that a number means one failure wherever it ends
 * up: libcollective's public COLL_E* codes (coll.h) in [COLL_ERROR_CODE_LOW,
 * COLL_ERROR_CODE_HIGH], librendezvous's internal parser results (proto.h) in
 * [RDZV_PARSE_CODE_LOW, RDZV_PARSE_CODE_HIGH]. Checked here: the ranges overlap neither each
 * other nor errno, every code lies in its library's range and is distinct, and each library's
 * strerror names its own codes and not the other library's.
 *
 * The codes are read from the macro lists that also generate the enums and the strerror
 * functions, so a code added to a list is checked without touching this file.
 */
#include <check.h>

#include <stdlib.h>
#include <string.h>

#include "coll_internal.h"
#include "proto.h"
#include "rdzv.h"
#include "check_main.h"

struct code {
    int value;
    const char *name;
    const char *text;
};

#define AS_CODE(name, value, text) {name, #name, text},
static const struct code coll_codes[] = {COLL_ERROR_MAP(AS_CODE)};
static const struct code parse_codes[] = {RDZV_PARSE_ERROR_MAP(AS_CODE)};
#undef AS_CODE

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* Every value in [low, high] is unknown to the C library as an errno number. */
static void expect_no_errno(int low, int high)
{
    for (int v = low; v <= high; v++)
        ck_assert_msg(strerrordesc_np(-v) == NULL, "errno %d falls in a project range", -v);
}

START_TEST(ranges_do_not_overlap)
{
    ck_assert_int_lt(COLL_ERROR_CODE_LOW, COLL_ERROR_CODE_HIGH);
    ck_assert_int_lt(RDZV_PARSE_CODE_LOW, RDZV_PARSE_CODE_HIGH);
    ck_assert_msg(COLL_ERROR_CODE_HIGH < RDZV_PARSE_CODE_LOW ||
                      RDZV_PARSE_CODE_HIGH < COLL_ERROR_CODE_LOW,
                  "libcollective's [%d, %d] overlaps librendezvous's [%d, %d]", COLL_ERROR_CODE_LOW,
                  COLL_ERROR_CODE_HIGH, RDZV_PARSE_CODE_LOW, RDZV_PARSE_CODE_HIGH);
    /* Both ranges lie below -999, past every errno value, and no errno number reaches them. */
    ck_assert_int_lt(COLL_ERROR_CODE_HIGH, -999);
    ck_assert_int_lt(RDZV_PARSE_CODE_HIGH, -999);
    expect_no_errno(COLL_ERROR_CODE_LOW, COLL_ERROR_CODE_HIGH);
    expect_no_errno(RDZV_PARSE_CODE_LOW, RDZV_PARSE_CODE_HIGH);
}
END_TEST

/* Each code of `codes` lies in [low, high], and no two are equal. */
static void expect_in_range(const struct code *codes, size_t n, int low, int high)
{
    ck_assert_uint_gt(n, 0);
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(codes[i].value >= low && codes[i].value <= high,
                      "%s = %d is outside [%d, %d]", codes[i].name, codes[i].value, low, high);
        for (size_t j = 0; j < i; j++)
            ck_assert_msg(codes[i].value != codes[j].value, "%s and %s are both %d", codes[i].name,
                          codes[j].name, codes[i].value);
    }
}

START_TEST(codes_lie_in_their_range)
{
    expect_in_range(coll_codes, NELEM(coll_codes), COLL_ERROR_CODE_LOW, COLL_ERROR_CODE_HIGH);
    expect_in_range(parse_codes, NELEM(parse_codes), RDZV_PARSE_CODE_LOW, RDZV_PARSE_CODE_HIGH);
}
END_TEST

/*
 * coll_strerror() names every COLL_E* code; rdzv__parse_strerror() (the text of the server's
 * "closing connection" log line) names every parser result. Neither names the other library's
 * codes, and rdzv_strerror(), whose public codes are errno values only, names none of them.
 */
START_TEST(strerror_names_own_codes_only)
{
    for (size_t i = 0; i < NELEM(coll_codes); i++) {
        ck_assert_str_eq(coll_strerror(coll_codes[i].value), coll_codes[i].text);
        ck_assert_str_eq(rdzv__parse_strerror(coll_codes[i].value), "malformed request");
        ck_assert_str_eq(rdzv_strerror(coll_codes[i].value), "unknown error");
    }
    for (size_t i = 0; i < NELEM(parse_codes); i++) {
        ck_assert_str_eq(rdzv__parse_strerror(parse_codes[i].value), parse_codes[i].text);
        ck_assert_str_ne(parse_codes[i].text, "malformed request");
        ck_assert_str_eq(coll_strerror(parse_codes[i].value), "unknown error");
        ck_assert_str_eq(rdzv_strerror(parse_codes[i].value), "unknown error");
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("errors");
    check_tcase(s, "ranges", 10, ranges_do_not_overlap, codes_lie_in_their_range,
                strerror_names_own_codes_only);

    return check_run(s);
}
