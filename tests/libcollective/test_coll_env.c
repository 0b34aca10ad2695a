/*
 * Unit tests of coll_comm_init_env() (libcollective/env.c), the one way the project's workers
 * join a job: the environment it reads, the codes and sentences of a missing or malformed one,
 * a job of one on a private store, a job of one on a store this test runs (the path a rank under
 * ddprun takes), the store-only and keep-store variants, an unreachable store, and
 * coll_env_free() on what it returned. Multi-rank joins are covered by the programs that use it
 * under ddprun (the ddp, ckpt and coll suites).
 *
 * Every case sets the whole torchrun environment it needs first (set_env()), so that nothing
 * from the caller's environment, or an earlier case without fork mode, leaks in. Stores bind
 * port 0; the unreachable store is a socket bound to port 0 that never listens.
 */
#include <check.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "coll.h"
#include "rdzv.h"
#include "check_main.h"

static const char *const vars[] = {"RANK",
                                   "WORLD_SIZE",
                                   "LOCAL_RANK",
                                   "LOCAL_WORLD_SIZE",
                                   "GROUP_RANK",
                                   "MASTER_ADDR",
                                   "MASTER_PORT",
                                   "TORCHELASTIC_RUN_ID",
                                   "TORCHELASTIC_RESTART_COUNT",
                                   RDZV_TOKEN_ENV};

/* Clears every variable coll_comm_init_env() reads, then sets the NAME=VALUE strings given. */
static void set_env(const char *const *assign)
{
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
    for (; assign && *assign; assign++) {
        char name[64];
        const char *eq = strchr(*assign, '=');
        ck_assert_ptr_nonnull(eq);
        snprintf(name, sizeof name, "%.*s", (int)(eq - *assign), *assign);
        ck_assert_int_eq(setenv(name, eq + 1, 1), 0);
    }
}

/* A job of one rank on `port`: RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1, run id "t", attempt 2. */
static void set_job_env(int port)
{
    char p[32];
    snprintf(p, sizeof p, "MASTER_PORT=%d", port);
    set_env((const char *[]){"RANK=0", "WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1", p,
                             "TORCHELASTIC_RUN_ID=t", "TORCHELASTIC_RESTART_COUNT=2", NULL});
}

static rdzv_server *start_store(void)
{
    rdzv_server_options so;
    rdzv_server_options_init(&so);
    so.host = "127.0.0.1";
    so.port = 0;
    rdzv_server *srv = NULL;
    ck_assert_int_eq(rdzv_server_start(&so, &srv), 0);
    return srv;
}

/* Expects coll_comm_init_env(opts) to fail with `want`, naming `word`, and *out untouched. */
static void expect_fail(const coll_env_options *opts, int want, const char *word)
{
    coll_env out;
    memset(&out, 0xab, sizeof out);
    int rc = coll_comm_init_env(opts, &out);
    ck_assert_msg(rc == want, "coll_comm_init_env: %d (%s), expected %d (%s); \"%s\"", rc,
                  coll_strerror(rc), want, coll_strerror(want), coll_last_error(NULL));
    ck_assert_msg(strstr(coll_last_error(NULL), word), "\"%s\" does not name %s",
                  coll_last_error(NULL), word);
    for (size_t i = 0; i < sizeof out; i++)
        ck_assert_int_eq(((unsigned char *)&out)[i], 0xab);
}

static coll_env_options options(const char *name)
{
    coll_env_options o;
    coll_env_options_init(&o);
    o.name = name;
    return o;
}

START_TEST(test_defaults)
{
    coll_env_options o;
    memset(&o, 0x5a, sizeof o);
    coll_env_options_init(&o);
    ck_assert_ptr_null(o.name);
    ck_assert_ptr_null(o.suffix);
    ck_assert_int_eq(o.backend, COLL_BACKEND_CPU);
    ck_assert_int_eq(o.device, -1);
    ck_assert_ptr_null(o.comm);
    ck_assert_ptr_null(o.store);
    ck_assert(!o.store_only && !o.keep_store && !o.standalone);
    coll_env_free(NULL);
    coll_env empty = {0};
    coll_env_free(&empty);
}
END_TEST

START_TEST(test_bad_arguments)
{
    set_env(NULL);
    coll_env out;
    coll_env_options o = options(NULL);
    expect_fail(&o, -EINVAL, "opts->name");
    o = options("t");
    ck_assert_int_eq(coll_comm_init_env(&o, NULL), -EINVAL);
    ck_assert_int_eq(coll_comm_init_env(NULL, &out), -EINVAL);
}
END_TEST

/* No variable at all: -ENOENT and the sentence that says where to run; nothing is contacted. */
START_TEST(test_missing_environment)
{
    set_env(NULL);
    coll_env_options o = options("t");
    expect_fail(&o, -ENOENT, "run under ddprun or torchrun");
    o.store_only = true;
    expect_fail(&o, -ENOENT, "none of RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT");
}
END_TEST

/* A malformed or incomplete environment: -EINVAL naming the variable, standalone or not. */
START_TEST(test_malformed_environment)
{
    static const struct {
        const char *assign[6];
        const char *word;
    } cases[] = {
        {{"RANK=0", "WORLD_SIZE=abc", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500"},
         "WORLD_SIZE=abc"},
        {{"RANK=0", NULL}, "WORLD_SIZE"},
        {{"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1"}, "MASTER_PORT"},
        {{"RANK=2", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500"}, "RANK"},
        {{"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=70000"}, "MASTER_PORT"},
        {{"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500", "LOCAL_RANK=x"},
         "LOCAL_RANK"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        set_env(cases[i].assign);
        coll_env_options o = options("t");
        expect_fail(&o, -EINVAL, cases[i].word);
        o.standalone = true;
        expect_fail(&o, -EINVAL, cases[i].word);
    }
}
END_TEST

/* The key prefix must fit coll_env.prefix. */
START_TEST(test_prefix_too_long)
{
    set_job_env(29500);
    char name[600];
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = 0;
    coll_env_options o = options(name);
    expect_fail(&o, -ENOSPC, "longer than");
    o = options("t");
    o.suffix = name;
    expect_fail(&o, -ENOSPC, "longer than");
}
END_TEST

/* A refused store: rdzv_env_connect()'s code, with the store's address in the sentence. */
START_TEST(test_unreachable_store)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0); /* bound, never listening */
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    int port = ntohs(a.sin_port);
    set_job_env(port);
    rdzv_client_options co;
    rdzv_client_options_init(&co);
    co.refused_timeout_ms = 0;
    coll_env_options o = options("t");
    o.store = &co;
    char where[64];
    snprintf(where, sizeof where, "cannot reach the store at 127.0.0.1:%d", port);
    expect_fail(&o, -ECONNREFUSED, where);
    close(fd);
}
END_TEST

/* Sums one value over the communicator (of one rank). */
static void check_comm(coll_comm *comm)
{
    ck_assert_ptr_nonnull(comm);
    ck_assert_int_eq(coll_comm_size(comm), 1);
    ck_assert_int_eq(coll_comm_rank(comm), 0);
    float x = 3;
    ck_assert_int_eq(coll_allreduce(comm, &x, &x, 1, COLL_F32, COLL_SUM), 0);
    ck_assert(x == 3);
}

/* Joins a job of one rank: rank 0 of 1, local rank 0. */
static void join_one(const coll_env_options *o, coll_env *e)
{
    int rc = coll_comm_init_env(o, e);
    ck_assert_msg(rc == 0, "%s: %s", coll_strerror(rc), coll_last_error(NULL));
    ck_assert_int_eq(e->env.rank, 0);
    ck_assert_int_eq(e->env.world_size, 1);
    ck_assert_int_eq(e->env.local_rank, 0);
}

static int log_lines;
static char last_line[1024];

static void log_hook(void *arg, int level, const char *msg)
{
    ck_assert_ptr_eq(arg, &log_lines);
    ck_assert_int_eq(level, COLL_LOG_INFO);
    log_lines++;
    snprintf(last_line, sizeof last_line, "%s", msg);
}

/* The path of a rank under ddprun: the job's store, the prefix of the attempt, a communicator. */
START_TEST(test_job_store)
{
    rdzv_server *srv = start_store();
    set_job_env(rdzv_server_port(srv));
    coll_options co;
    coll_options_init(&co);
    co.timeout_ms = 20000;
    co.log = log_hook;
    co.log_arg = &log_lines;
    coll_env_options o = options("test");
    o.suffix = "scenario";
    o.comm = &co;
    coll_env e;
    join_one(&o, &e);
    ck_assert_int_eq(e.env.standalone, 0);
    ck_assert_str_eq(e.prefix, "test/t/2/scenario");
    check_comm(e.comm);
    ck_assert_ptr_null(e.store); /* closed: the communicator has its own */
    ck_assert_ptr_null(e.server);
    ck_assert_int_eq(log_lines, 1);
    ck_assert_msg(strstr(last_line, "rank 0 of 1") && strstr(last_line, "test/t/2/scenario"),
                  "log line \"%s\"", last_line);
    coll_env_free(&e);
    ck_assert_ptr_null(e.comm);

    /* keep_store: the same store, still connected. */
    o.keep_store = true;
    o.suffix = "kept";
    ck_assert_int_eq(coll_comm_init_env(&o, &e), 0);
    check_comm(e.comm);
    ck_assert_ptr_nonnull(e.store);
    ck_assert_int_eq(rdzv_set(e.store, "k", "v", 1), 0);
    coll_env_free(&e);
    ck_assert_ptr_null(e.store);

    /* store_only: no communicator, the store kept; the prefix without a suffix. */
    o = options("only");
    o.store_only = true;
    ck_assert_int_eq(coll_comm_init_env(&o, &e), 0);
    ck_assert_ptr_null(e.comm);
    ck_assert_ptr_nonnull(e.store);
    ck_assert_str_eq(e.prefix, "only/t/2");
    ck_assert_int_eq(rdzv_barrier(e.store, "b", 1, 10000), 0);
    coll_env_free(&e);
    rdzv_server_close(srv);
}
END_TEST

/* A job of one with no environment at all: a private store, which coll_env_free() stops. */
START_TEST(test_standalone)
{
    set_env(NULL);
    coll_env_options o = options("alone");
    o.standalone = true;
    o.keep_store = true;
    coll_env e;
    join_one(&o, &e);
    ck_assert_int_eq(e.env.standalone, 1);
    ck_assert_ptr_nonnull(e.server);
    ck_assert_ptr_nonnull(e.store);
    check_comm(e.comm);
    coll_env_free(&e);
    ck_assert_ptr_null(e.server);
}
END_TEST

static Suite *env_suite(void)
{
    Suite *s = suite_create("coll_env");
    check_tcase(s, "env", 60, test_defaults, test_bad_arguments, test_missing_environment,
                test_malformed_environment, test_prefix_too_long, test_unreachable_store,
                test_job_store, test_standalone);
    return s;
}

int main(void)
{
    return check_run(env_suite());
}
