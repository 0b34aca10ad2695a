/*
 * Check fixture for suites whose tests fork client processes: the store runs in a child
 * process, forked while the test process is still single-threaded. (Forking while a server
 * thread runs in the test process can leave the child stuck on an allocator lock that thread
 * held, which happens under ASan.) Test code only.
 *
 * Provides `port`, server_setup()/server_teardown() for tcase_add_checked_fixture(),
 * server_kill() to make the server vanish mid-test, and await_waiters().
 */
#ifndef TESTS_SERVER_PROC_H
#define TESTS_SERVER_PROC_H

#include "rdzv.h"

#include <check.h>
#include <jansson.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

static int port;
static pid_t server_pid = -1;
static int server_ctl = -1; /* closing it tells the server process to stop */

static inline void server_setup(void)
{
    int up[2], down[2];
    ck_assert_int_eq(pipe(up), 0);
    ck_assert_int_eq(pipe(down), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(up[0]);
        close(down[1]);
        rdzv_server_options o;
        rdzv_server_options_init(&o);
        rdzv_server *srv = NULL;
        int p = rdzv_server_start(&o, &srv) == 0 ? rdzv_server_port(srv) : -1;
        if (write(up[1], &p, sizeof p) != (ssize_t)sizeof p)
            _exit(1);
        char c;
        while (read(down[0], &c, 1) > 0)
            ;
        rdzv_server_close(srv);
        _exit(0);
    }
    close(up[1]);
    close(down[0]);
    ck_assert_int_eq(read(up[0], &port, sizeof port), (ssize_t)sizeof port);
    close(up[0]);
    ck_assert_int_gt(port, 0);
    server_pid = pid;
    server_ctl = down[1];
}

static inline void server_teardown(void)
{
    if (server_pid > 0) {
        close(server_ctl);
        waitpid(server_pid, NULL, 0);
    }
    server_pid = -1;
}

/* Stops the server abruptly (its connections are reset). */
static inline void server_kill(void)
{
    kill(server_pid, SIGKILL);
    waitpid(server_pid, NULL, 0);
    close(server_ctl);
    server_pid = -1;
}

/* Polls the server's status (STATUS request) until `n` waiters are parked on it. */
static inline void await_waiters(int64_t n)
{
    rdzv_client *c = NULL;
    ck_assert_int_eq(rdzv_client_connect("127.0.0.1", port, NULL, &c), 0);
    for (;;) {
        char *js = NULL;
        ck_assert_int_eq(rdzv_status(c, &js), 0);
        json_t *o = json_loads(js, 0, NULL);
        ck_assert_ptr_nonnull(o);
        json_int_t w = json_integer_value(json_object_get(o, "waiters"));
        json_decref(o);
        rdzv_free(js);
        if (w >= n)
            break;
        sched_yield();
    }
    rdzv_client_close(c);
}

#endif
