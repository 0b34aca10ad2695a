/*
 * The end of every Check unit test's main(): add a test case to a suite in one call, run the
 * suite, and turn the result into the test's exit status.
 *
 * Each test keeps what is its own (its suites and case names, timeouts, fixtures, loop tests,
 * a skip with 77 before anything runs); this header holds only what was the same in all of
 * them. Verbosity comes from CK_VERBOSITY and, unless a test asks otherwise, fork mode from
 * CK_FORK (Check's defaults, spelled out).
 */
#ifndef DDPRUN_TESTS_CHECK_MAIN_H
#define DDPRUN_TESTS_CHECK_MAIN_H

#include <check.h>
#include <stddef.h>
#include <stdlib.h>

/*
 * Creates a test case `name` with `tests` (a NULL-terminated array, run in its order), sets its
 * timeout to `timeout_s` seconds (0 leaves Check's default: CK_DEFAULT_TIMEOUT, else 4 s) and
 * adds it to `s`. Returns the case, for fixtures; loop tests, and tests that must run among
 * loop tests, are added by hand. Use it through check_tcase().
 */
static inline TCase *check_tcase_(Suite *s, const char *name, int timeout_s,
                                  const TTest *const *tests)
{
    TCase *tc = tcase_create(name);
    if (timeout_s > 0)
        tcase_set_timeout(tc, timeout_s);
    for (; *tests; tests++)
        tcase_add_test(tc, *tests);
    suite_add_tcase(s, tc);
    return tc;
}

/* check_tcase(s, "name", timeout_s, test, test, ...): check_tcase_() with the tests listed. */
#define check_tcase(s, name, timeout_s, ...)                                                       \
    check_tcase_((s), (name), (timeout_s), (const TTest *const[]){__VA_ARGS__, NULL})

/*
 * Runs `s` with fork mode `mode` (CK_FORK_GETENV: as CK_FORK says; CK_NOFORK where a CUDA
 * context must survive), frees the runner (and with it the suite), and returns EXIT_SUCCESS
 * when every test passed, else EXIT_FAILURE.
 */
static inline int check_run_fork(Suite *s, enum fork_status mode)
{
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, mode);
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* check_run_fork() with the fork mode CK_FORK asks for (forked when it is unset). */
static inline int check_run(Suite *s)
{
    return check_run_fork(s, CK_FORK_GETENV);
}

#endif
