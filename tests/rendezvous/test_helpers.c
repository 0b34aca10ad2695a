/*
 * Tests of librendezvous's store helpers (rendezvous/helpers.c: per-rank keys, set-once, the
 * bounded wait-and-get, the all-gather and its account of missing ranks) against the real server
 * in a child process, and of the torchrun-environment reader (rendezvous/env.c) on environments
 * the test sets itself, and of the worker's error record it writes (TORCHELASTIC_ERROR_FILE).
 * Every case runs in its own forked process, so changing the environment here touches no other
 * case. Ranks of an all-gather are threads with a client each; nothing waits on a sleep.
 */
#include <check.h>

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rdzv.h"
#include "server_proc.h"
#include "check_main.h"

/*
 * Connects to the test's server with call timeout timeout_ms and key prefix `prefix` (NULL:
 * none). No assertions: the rank threads use it too. Returns rdzv_client_connect()'s code.
 */
static int connect_client(int timeout_ms, const char *prefix, rdzv_client **c)
{
    rdzv_client_options o;
    rdzv_client_options_init(&o);
    o.timeout_ms = timeout_ms;
    o.connect_timeout_ms = 5000;
    o.prefix = prefix;
    return rdzv_client_connect("127.0.0.1", port, &o, c);
}

static rdzv_client *client(int timeout_ms)
{
    rdzv_client *c = NULL;
    int rc = connect_client(timeout_ms, NULL, &c);
    ck_assert_msg(rc == 0, "connect: %d %s", rc, rdzv_client_last_error(NULL));
    return c;
}

/* ------------------------------------------------------------------------------------------ */
/* rdzv_rank_keys                                                                              */
/* ------------------------------------------------------------------------------------------ */

START_TEST(test_rank_keys)
{
    char **k = NULL;
    ck_assert_int_eq(rdzv_rank_keys("/job/cpu", 12, &k), 0);
    ck_assert_str_eq(k[0], "/job/cpu/0");
    ck_assert_str_eq(k[11], "/job/cpu/11");
    ck_assert_ptr_null(k[12]);
    rdzv_free(k);

    ck_assert_int_eq(rdzv_rank_keys("", 0, &k), 0);
    ck_assert_ptr_null(k[0]);
    rdzv_free(k);

    k = (char **)0x1;
    ck_assert_int_eq(rdzv_rank_keys(NULL, 1, &k), -EINVAL);
    ck_assert_int_eq(rdzv_rank_keys("p", -1, &k), -EINVAL);
    ck_assert_int_eq(rdzv_rank_keys("p", 1, NULL), -EINVAL);
    ck_assert_ptr_eq(k, (char **)0x1); /* untouched on failure */
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* rdzv_set_once                                                                               */
/* ------------------------------------------------------------------------------------------ */

START_TEST(test_set_once)
{
    rdzv_client *a = client(5000), *b = client(5000);
    void *v = NULL;
    size_t n = 0;
    ck_assert_int_eq(rdzv_set_once(a, "once", "first", 5, NULL, NULL), 1);
    /* A later writer loses and learns the winner's value. */
    ck_assert_int_eq(rdzv_set_once(b, "once", "second", 6, &v, &n), 0);
    ck_assert_uint_eq(n, 5);
    ck_assert_mem_eq(v, "first", 5);
    rdzv_free(v);
    /* Writing the same bytes again reads as holding them. */
    ck_assert_int_eq(rdzv_set_once(b, "once", "first", 5, &v, &n), 1);
    rdzv_free(v);
    /* The store still holds the first value. */
    ck_assert_int_eq(rdzv_get(a, "once", &v, &n), 0);
    ck_assert_mem_eq(v, "first", 5);
    rdzv_free(v);

    ck_assert_int_eq(rdzv_set_once(a, "empty", "", 0, NULL, NULL), -EINVAL);
    ck_assert_int_eq(rdzv_set_once(a, NULL, "x", 1, NULL, NULL), -EINVAL);
    ck_assert_int_eq(rdzv_set_once(a, "k", "x", 1, &v, NULL), -EINVAL);
    rdzv_client_close(a);
    rdzv_client_close(b);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* rdzv_wait_get                                                                               */
/* ------------------------------------------------------------------------------------------ */

struct setter_arg {
    const char *key, *value;
    int rc;
};

/*
 * Publishes one key with a client of its own: what another process does while one waits. No
 * assertions on this thread; the test checks a->rc.
 */
static void *setter_main(void *p)
{
    struct setter_arg *a = p;
    rdzv_client *c = NULL;
    a->rc = connect_client(5000, NULL, &c);
    if (a->rc < 0)
        return NULL;
    a->rc = rdzv_set(c, a->key, a->value, strlen(a->value));
    if (a->rc == 0)
        a->rc = rdzv_ping(c); /* SET has no reply: make sure the server has it */
    rdzv_client_close(c);
    return NULL;
}

START_TEST(test_wait_get)
{
    rdzv_client *c = client(5000);
    void *v = NULL;
    size_t n = 0;
    /* A key that exists: every bound answers it, timeout 0 with one look. */
    ck_assert_int_eq(rdzv_set(c, "/w/there", "here", 4), 0);
    ck_assert_int_eq(rdzv_wait_get(c, "/w/there", 0, &v, &n), 0);
    ck_assert_uint_eq(n, 4);
    ck_assert_mem_eq(v, "here", 5); /* NUL-terminated */
    rdzv_free(v);
    ck_assert_int_eq(rdzv_wait_get(c, "/w/there", -1, &v, &n), 0);
    rdzv_free(v);

    /* A key another client publishes while this one waits (or just before: either way). */
    struct setter_arg a = {.key = "/w/later", .value = "leader:1234"};
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, setter_main, &a), 0);
    int rc = rdzv_wait_get(c, "/w/later", 10000, &v, &n);
    pthread_join(t, NULL);
    ck_assert_int_eq(a.rc, 0);
    ck_assert_msg(rc == 0, "%d %s", rc, rdzv_client_last_error(c));
    ck_assert_uint_eq(n, strlen("leader:1234"));
    ck_assert_mem_eq(v, "leader:1234", n);
    rdzv_free(v);
    rdzv_client_close(c);
}
END_TEST

START_TEST(test_wait_get_timeout)
{
    rdzv_client *c = NULL;
    ck_assert_int_eq(connect_client(5000, "job/", &c), 0);
    void *v = (void *)0x1;
    size_t n = 7;
    /* The message names the wait, the key (with the client's prefix) and the bound. */
    ck_assert_int_eq(rdzv_wait_get(c, "leader", 100, &v, &n), -ETIMEDOUT);
    ck_assert_msg(strstr(rdzv_client_last_error(c),
                         "wait 'job/leader': the key did not appear within 100 ms") != NULL,
                  "message: %s", rdzv_client_last_error(c));
    ck_assert_int_eq(rdzv_wait_get(c, "leader", 0, &v, &n), -ETIMEDOUT);
    ck_assert_msg(strstr(rdzv_client_last_error(c), "'job/leader': the key is not there") != NULL,
                  "message: %s", rdzv_client_last_error(c));
    ck_assert_ptr_eq(v, (void *)0x1); /* untouched on failure */
    ck_assert_uint_eq(n, 7);
    /* The client stays usable, and sees the key once it is there. */
    ck_assert_int_eq(rdzv_set(c, "leader", "x", 1), 0);
    ck_assert_int_eq(rdzv_wait_get(c, "leader", 100, &v, &n), 0);
    ck_assert_uint_eq(n, 1);
    rdzv_free(v);
    rdzv_client_close(c);
}
END_TEST

START_TEST(test_wait_get_bad_args)
{
    rdzv_client *c = client(5000);
    void *v = (void *)0x1;
    size_t n = 7;
    ck_assert_int_eq(rdzv_wait_get(NULL, "k", 10, &v, &n), -EINVAL);
    ck_assert_int_eq(rdzv_wait_get(c, NULL, 10, &v, &n), -EINVAL);
    ck_assert_ptr_nonnull(strstr(rdzv_client_last_error(c), "invalid argument"));
    ck_assert_int_eq(rdzv_wait_get(c, "k", 10, NULL, &n), -EINVAL);
    ck_assert_int_eq(rdzv_wait_get(c, "k", 10, &v, NULL), -EINVAL);
    ck_assert_ptr_eq(v, (void *)0x1);
    ck_assert_uint_eq(n, 7);
    ck_assert_int_eq(rdzv_ping(c), 0); /* nothing was sent */
    rdzv_client_close(c);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* rdzv_allgather                                                                              */
/* ------------------------------------------------------------------------------------------ */

#define WORLD 5

struct rank_arg {
    int rank, world, timeout_ms;
    const char *prefix;
    int rc;
    bool missing[WORLD];
    char err[512];
    void *values[WORLD];
    size_t nbytes[WORLD];
};

static void *rank_main(void *p)
{
    struct rank_arg *r = p;
    rdzv_client *c = NULL;
    r->rc = connect_client(10000, NULL, &c);
    if (r->rc < 0)
        return NULL;
    char val[32];
    snprintf(val, sizeof val, "value of rank %d", r->rank);
    memset(r->missing, 0xff, sizeof r->missing);
    r->rc = rdzv_allgather(c, r->prefix, r->rank, r->world, val, strlen(val), r->timeout_ms,
                           r->values, r->nbytes, r->missing);
    snprintf(r->err, sizeof r->err, "%s", rdzv_client_last_error(c));
    rdzv_client_close(c);
    return NULL;
}

START_TEST(test_allgather)
{
    struct rank_arg r[WORLD];
    pthread_t t[WORLD];
    /* Two rounds under two prefixes: a prefix serves one exchange. */
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < WORLD; i++) {
            r[i] = (struct rank_arg){.rank = i,
                                     .world = WORLD,
                                     .timeout_ms = 10000,
                                     .prefix = round ? "/job/round1" : "/job/round0"};
            ck_assert_int_eq(pthread_create(&t[i], NULL, rank_main, &r[i]), 0);
        }
        for (int i = 0; i < WORLD; i++)
            pthread_join(t[i], NULL);
        for (int i = 0; i < WORLD; i++) {
            ck_assert_msg(r[i].rc == 0, "rank %d: %d %s", i, r[i].rc, r[i].err);
            for (int j = 0; j < WORLD; j++) {
                char want[32];
                snprintf(want, sizeof want, "value of rank %d", j);
                ck_assert_uint_eq(r[i].nbytes[j], strlen(want));
                ck_assert_mem_eq(r[i].values[j], want, strlen(want));
                rdzv_free(r[i].values[j]);
            }
        }
    }
}
END_TEST

START_TEST(test_allgather_timeout_names_missing)
{
    /* Ranks 0, 2 and 4 of 5 take part; 1 and 3 never come. */
    struct rank_arg r[3];
    pthread_t t[3];
    for (int i = 0; i < 3; i++) {
        r[i] = (struct rank_arg){
            .rank = 2 * i, .world = WORLD, .timeout_ms = 300, .prefix = "/job/late"};
        ck_assert_int_eq(pthread_create(&t[i], NULL, rank_main, &r[i]), 0);
    }
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(r[i].rc, -ETIMEDOUT);
        const bool want[WORLD] = {false, true, false, true, false};
        ck_assert_mem_eq(r[i].missing, want, sizeof want);
        ck_assert_msg(strstr(r[i].err, "ranks 1, 3 did not publish /job/late within 300 ms (3 of "
                                       "5 present)") != NULL,
                      "message: %s", r[i].err);
    }

    rdzv_client *c = client(5000);
    void *v[2];
    size_t n[2];
    ck_assert_int_eq(rdzv_allgather(c, "p", 2, 2, "x", 1, 10, v, n, NULL), -EINVAL);
    ck_assert_int_eq(rdzv_allgather(c, "p", 0, 0, "x", 1, 10, v, n, NULL), -EINVAL);
    ck_assert_int_eq(rdzv_allgather(c, "p", 0, 2, "", 0, 10, v, n, NULL), -EINVAL);
    ck_assert_int_eq(rdzv_allgather(c, NULL, 0, 2, "x", 1, 10, v, n, NULL), -EINVAL);
    /* The client stays usable after a timed-out all-gather. */
    bool missing[2] = {true, false};
    ck_assert_int_eq(rdzv_allgather(c, "q", 0, 2, "x", 1, 50, v, n, missing), -ETIMEDOUT);
    ck_assert_int_eq(missing[0], 0);
    ck_assert_int_eq(missing[1], 1);
    ck_assert_int_eq(rdzv_ping(c), 0);
    rdzv_client_close(c);
}
END_TEST

START_TEST(test_gather)
{
    /* Ranks published earlier with plain SETs; gather only reads. */
    rdzv_client *c = client(5000);
    ck_assert_int_eq(rdzv_set(c, "/g/0", "a", 1), 0);
    ck_assert_int_eq(rdzv_set(c, "/g/2", "cc", 2), 0);
    void *v[3];
    size_t n[3];
    bool missing[3];
    ck_assert_int_eq(rdzv_gather(c, "/g", 3, 100, v, n, missing), -ETIMEDOUT);
    /* After a timeout the arrays hold what was there. */
    ck_assert_uint_eq(n[0], 1);
    ck_assert_mem_eq(v[0], "a", 1);
    ck_assert_uint_eq(n[1], 0);
    ck_assert_uint_eq(n[2], 2);
    const bool want[3] = {false, true, false};
    ck_assert_mem_eq(missing, want, sizeof want);
    ck_assert_ptr_nonnull(strstr(rdzv_client_last_error(c), "rank 1 did not publish /g within"));
    for (int i = 0; i < 3; i++)
        rdzv_free(v[i]);

    ck_assert_int_eq(rdzv_set(c, "/g/1", "bbb", 3), 0);
    ck_assert_int_eq(rdzv_gather(c, "/g", 3, 100, v, n, NULL), 0);
    ck_assert_uint_eq(n[1], 3);
    ck_assert_mem_eq(v[1], "bbb", 3);
    for (int i = 0; i < 3; i++)
        rdzv_free(v[i]);
    ck_assert_int_eq(rdzv_gather(c, "/g", 0, 100, v, n, NULL), -EINVAL);
    rdzv_client_close(c);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* The torchrun environment                                                                    */
/* ------------------------------------------------------------------------------------------ */

static const char *const vars[] = {"RANK",
                                   "LOCAL_RANK",
                                   "WORLD_SIZE",
                                   "LOCAL_WORLD_SIZE",
                                   "GROUP_RANK",
                                   "MASTER_ADDR",
                                   "MASTER_PORT",
                                   "TORCHELASTIC_RESTART_COUNT",
                                   "TORCHELASTIC_RUN_ID"};

static void clear_env(void)
{
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
}

static void torchrun_env(void)
{
    clear_env();
    setenv("RANK", "5", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("WORLD_SIZE", "8", 1);
    setenv("LOCAL_WORLD_SIZE", "4", 1);
    setenv("GROUP_RANK", "1", 1);
    setenv("MASTER_ADDR", "node0.example", 1);
    setenv("MASTER_PORT", "29500", 1);
    setenv("TORCHELASTIC_RESTART_COUNT", "2", 1);
    setenv("TORCHELASTIC_RUN_ID", "job42", 1);
}

START_TEST(test_env_full)
{
    torchrun_env();
    rdzv_env e;
    ck_assert_int_eq(rdzv_env_read(&e), 0);
    ck_assert_int_eq(e.standalone, 0);
    ck_assert_int_eq(e.rank, 5);
    ck_assert_int_eq(e.local_rank, 1);
    ck_assert_int_eq(e.world_size, 8);
    ck_assert_int_eq(e.local_world_size, 4);
    ck_assert_int_eq(e.group_rank, 1);
    ck_assert_int_eq(e.restart_count, 2);
    ck_assert_str_eq(e.master_addr, "node0.example");
    ck_assert_int_eq(e.master_port, 29500);
    ck_assert_str_eq(e.run_id, "job42");

    char buf[64];
    ck_assert_int_eq(rdzv_env_prefix(&e, "ddp-train", buf, sizeof buf), 0);
    ck_assert_str_eq(buf, "ddp-train/job42/2");
    ck_assert_int_eq(rdzv_env_prefix(&e, "ddp-train", buf, 10), -ENOSPC);

    /* The optional variables default from the required ones. */
    unsetenv("LOCAL_RANK");
    unsetenv("LOCAL_WORLD_SIZE");
    unsetenv("GROUP_RANK");
    unsetenv("TORCHELASTIC_RESTART_COUNT");
    unsetenv("TORCHELASTIC_RUN_ID");
    ck_assert_int_eq(rdzv_env_read(&e), 0);
    ck_assert_int_eq(e.local_rank, 0);
    ck_assert_int_eq(e.local_world_size, 8);
    ck_assert_int_eq(e.restart_count, 0);
    ck_assert_str_eq(e.run_id, "none");
}
END_TEST

START_TEST(test_env_standalone)
{
    clear_env();
    setenv("LOCAL_RANK", "0", 1); /* not one of the four that make a torchrun job */
    rdzv_env e;
    ck_assert_int_eq(rdzv_env_read(&e), 0);
    ck_assert_int_eq(e.standalone, 1);
    ck_assert_int_eq(e.rank, 0);
    ck_assert_int_eq(e.world_size, 1);
    ck_assert_int_eq(e.local_world_size, 1);
    /* The sentence a program that needs a job prints. */
    ck_assert_str_eq(rdzv_client_last_error(NULL), "none of RANK, WORLD_SIZE, MASTER_ADDR and "
                                                   "MASTER_PORT is set (run under ddprun or "
                                                   "torchrun)");
    rdzv_client *c = (rdzv_client *)0x1;
    ck_assert_int_eq(rdzv_env_connect(&e, NULL, &c), -EINVAL);
    ck_assert_ptr_eq(c, (rdzv_client *)0x1);
    ck_assert_ptr_nonnull(strstr(rdzv_client_last_error(NULL), "MASTER_ADDR"));
}
END_TEST

/* Each bad environment fails with -EINVAL and a message holding `names`. */
static void expect_bad(const char *var, const char *value, const char *names)
{
    torchrun_env();
    if (value)
        setenv(var, value, 1);
    else
        unsetenv(var);
    rdzv_env e = {.rank = -7};
    ck_assert_int_eq(rdzv_env_read(&e), -EINVAL);
    ck_assert_int_eq(e.rank, -7); /* untouched on failure */
    ck_assert_msg(strstr(rdzv_client_last_error(NULL), names) != NULL, "%s=%s: message '%s'", var,
                  value ? value : "(unset)", rdzv_client_last_error(NULL));
}

START_TEST(test_env_errors)
{
    expect_bad("WORLD_SIZE", "abc", "WORLD_SIZE=abc is not an integer");
    expect_bad("WORLD_SIZE", "0", "WORLD_SIZE=0 is out of range");
    expect_bad("RANK", "8", "RANK=8 is out of range [0, 7]");
    expect_bad("RANK", "-1", "RANK=-1 is out of range");
    expect_bad("RANK", "3x", "RANK=3x is not an integer");
    expect_bad("MASTER_PORT", "70000", "MASTER_PORT=70000 is out of range");
    expect_bad("MASTER_PORT", NULL, "is set but MASTER_PORT is not");
    expect_bad("RANK", NULL, "but RANK is not");
    expect_bad("LOCAL_RANK", "4", "LOCAL_RANK=4 is out of range [0, 3]");
    expect_bad("LOCAL_WORLD_SIZE", "9", "LOCAL_WORLD_SIZE=9 is out of range");
    expect_bad("TORCHELASTIC_RESTART_COUNT", "x", "TORCHELASTIC_RESTART_COUNT=x");
    expect_bad("TORCHELASTIC_RUN_ID", "a/b", "TORCHELASTIC_RUN_ID=a/b");
    ck_assert_int_eq(rdzv_env_read(NULL), -EINVAL);
}
END_TEST

/* The worker's error record, as torchrun's and ddprun's summaries read it. */
START_TEST(test_env_record_error)
{
    unsetenv("TORCHELASTIC_ERROR_FILE");
    ck_assert_int_eq(rdzv_env_record_error("nowhere to go"), 0);
    char dir[] = "/tmp/test_helpers_XXXXXX", path[64];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/error.json", dir);
    setenv("TORCHELASTIC_ERROR_FILE", path, 1);
    ck_assert_int_eq(rdzv_env_record_error(NULL), -EINVAL);
    ck_assert_int_eq(rdzv_env_record_error("an older one"), 1);
    ck_assert_int_eq(rdzv_env_record_error("rank 1: \"quoted\"\nsecond line"), 1);
    json_error_t je;
    json_t *rec = json_load_file(path, 0, &je);
    ck_assert_msg(rec != NULL, "%s: %s", path, je.text);
    const char *msg = NULL, *stamp = NULL, *stack = NULL;
    ck_assert_int_eq(json_unpack(rec, "{s:{s:s, s:{s:s, s:s}}}", "message", "message", &msg,
                                 "extraInfo", "py_callstack", &stack, "timestamp", &stamp),
                     0);
    ck_assert_str_eq(msg, "rank 1: \"quoted\"\nsecond line"); /* replaced, not appended */
    ck_assert_str_eq(stack, "");
    ck_assert_int_gt(strlen(stamp), 0);
    ck_assert_uint_eq(strspn(stamp, "0123456789"), strlen(stamp));
    json_decref(rec);
    unlink(path);
    snprintf(path, sizeof path, "%s/missing/error.json", dir);
    setenv("TORCHELASTIC_ERROR_FILE", path, 1);
    ck_assert_int_eq(rdzv_env_record_error("x"), -ENOENT);
    rmdir(dir);
}
END_TEST

START_TEST(test_env_connect)
{
    torchrun_env();
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    setenv("MASTER_PORT", p, 1);
    rdzv_env e;
    ck_assert_int_eq(rdzv_env_read(&e), 0);
    rdzv_client *c = NULL;
    ck_assert_int_eq(rdzv_env_connect(&e, NULL, &c), 0);
    ck_assert_int_eq(rdzv_ping(c), 0);
    rdzv_client_close(c);
}
END_TEST

static Suite *helpers_suite(void)
{
    Suite *s = suite_create("helpers");
    TCase *tc = check_tcase(s, "store", 30, test_rank_keys, test_set_once, test_wait_get,
                            test_wait_get_timeout, test_wait_get_bad_args, test_allgather,
                            test_allgather_timeout_names_missing, test_gather, test_env_connect);
    tcase_add_checked_fixture(tc, server_setup, server_teardown);

    check_tcase(s, "env", 0, test_env_full, test_env_standalone, test_env_errors,
                test_env_record_error);
    return s;
}

int main(void)
{
    return check_run(helpers_suite());
}
