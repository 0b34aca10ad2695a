/*
 * Tests of the node-level rendezvous protocols (launcher/noderdzv.c) against the real store,
 * started in-process on 127.0.0.1 port 0 for every case. Nodes are forked processes with a client
 * each; they report their result (return code, assignment, error text, timings) through a pipe,
 * and the test process checks them together: prefix sums, agreement on the participant list,
 * closing at max_nodes or after the last call, late nodes, timeouts naming the missing nodes,
 * round isolation, heartbeat detection within its bound, and first-writer-wins failure reports;
 * then the rendezvous-backend table above them (launcher/backend.h): its rows by name, where
 * each says the store is served, and each row's operations through the store.
 *
 * Every case runs in its own forked process (Check's fork mode) under a timeout of a few seconds.
 * Nothing waits on a sleep for synchronisation: ordering between nodes comes from store keys.
 * The one paced loop is the heartbeat watcher, which checks every 50 ms as an agent would.
 */
#include <check.h>
#include <jansson.h>

#include <errno.h>
#include <sched.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "failure.h"
#include "monoclock.h"
#include "noderdzv.h"
#include "rdzv.h"

#define PREFIX "/ddprun/test"
#define MAXN 64

/* ------------------------------------------------------------------------------------------ */
/* Fixtures and helpers                                                                        */
/* ------------------------------------------------------------------------------------------ */

#include "server_proc.h"
#include "check_main.h"

static void pause_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* A client of the fixture's server; NULL on failure (children report rather than assert). */
static rdzv_client *client_or_null(void)
{
    rdzv_client_options o;
    rdzv_client_options_init(&o);
    o.timeout_ms = 10000;
    o.connect_timeout_ms = 5000;
    rdzv_client *c = NULL;
    return rdzv_client_connect("127.0.0.1", port, &o, &c) == 0 ? c : NULL;
}

static rdzv_client *client(void)
{
    rdzv_client *c = client_or_null();
    ck_assert_msg(c, "connect: %s", rdzv_client_last_error(NULL));
    return c;
}

/* What a forked node reports. */
typedef struct node_result {
    int rc;
    int nproc;           /* what the node published */
    ddprun_assignment a; /* valid when rc == 0 */
    double elapsed_s;    /* time the node spent in the call under test */
    int64_t extra;       /* case-specific */
    char err[512];
} node_result;

/* Runs in node `i` (a child process) with its own client; fills *r. */
typedef void (*node_fn)(int i, rdzv_client *c, void *arg, node_result *r);

typedef struct nodes {
    int n;
    pid_t pid[MAXN];
    int fd[MAXN];
} nodes;

/* Forks n nodes running fn; collect their results with nodes_join(). */
static void nodes_start(nodes *ns, int n, node_fn fn, void *arg)
{
    ck_assert_int_le(n, MAXN);
    ns->n = n;
    for (int i = 0; i < n; i++) {
        int p[2];
        ck_assert_int_eq(pipe(p), 0);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            close(p[0]);
            node_result r;
            memset(&r, 0, sizeof r);
            rdzv_client *c = client_or_null();
            if (!c) {
                r.rc = -ECONNREFUSED;
                snprintf(r.err, sizeof r.err, "connect: %s", rdzv_client_last_error(NULL));
            } else {
                fn(i, c, arg, &r);
                rdzv_client_close(c);
            }
            ssize_t w = write(p[1], &r, sizeof r);
            _exit(w == (ssize_t)sizeof r ? 0 : 1);
        }
        close(p[1]);
        ns->pid[i] = pid;
        ns->fd[i] = p[0];
    }
}

static void nodes_join(nodes *ns, node_result *res)
{
    for (int i = 0; i < ns->n; i++) {
        size_t got = 0;
        char *buf = (char *)&res[i];
        while (got < sizeof res[i]) {
            ssize_t r = read(ns->fd[i], buf + got, sizeof res[i] - got);
            ck_assert_msg(r > 0, "node %d exited without a result", i);
            got += (size_t)r;
        }
        close(ns->fd[i]);
        int status = 0;
        ck_assert_int_eq(waitpid(ns->pid[i], &status, 0), ns->pid[i]);
        ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
}

static void run_nodes(int n, node_fn fn, void *arg, node_result *res)
{
    nodes ns;
    nodes_start(&ns, n, fn, arg);
    nodes_join(&ns, res);
}

/*
 * Checks that the successful results form one consistent assignment of `nnodes` nodes: node
 * ranks 0..nnodes-1 each once, offsets the prefix sums of nproc in node-rank order, one world
 * size.
 */
static void check_consistent(const node_result *res, int n, int nnodes, int round)
{
    int by_rank[MAXN];
    for (int r = 0; r < MAXN; r++)
        by_rank[r] = -1;
    int ok = 0;
    for (int i = 0; i < n; i++) {
        if (res[i].rc != 0)
            continue;
        ok++;
        const ddprun_assignment *a = &res[i].a;
        ck_assert_int_eq(a->round, round);
        ck_assert_int_eq(a->nnodes, nnodes);
        ck_assert_int_ge(a->node_rank, 0);
        ck_assert_int_lt(a->node_rank, nnodes);
        ck_assert_msg(by_rank[a->node_rank] < 0, "node rank %d given twice", a->node_rank);
        by_rank[a->node_rank] = i;
    }
    ck_assert_int_eq(ok, nnodes);
    int sum = 0;
    for (int r = 0; r < nnodes; r++) {
        const node_result *x = &res[by_rank[r]];
        ck_assert_int_eq(x->a.rank_offset, sum);
        sum += x->nproc;
    }
    for (int r = 0; r < nnodes; r++)
        ck_assert_int_eq(res[by_rank[r]].a.world_size, sum);
}

/* ------------------------------------------------------------------------------------------ */
/* Static                                                                                      */
/* ------------------------------------------------------------------------------------------ */

typedef struct static_args {
    int round, nnodes;
    const int *ranks; /* node i's node rank */
    const int *nproc; /* node i's nproc */
    double timeout_s;
} static_args;

static void static_node(int i, rdzv_client *c, void *arg, node_result *r)
{
    const static_args *s = arg;
    r->nproc = s->nproc[i];
    double t0 = mono_now_s();
    r->rc = ddprun_rdzv_static(c, PREFIX, s->round, s->nnodes, s->ranks[i], s->nproc[i],
                               s->timeout_s, &r->a, r->err, sizeof r->err);
    r->elapsed_s = mono_now_s() - t0;
}

START_TEST(test_static_prefix_sums)
{
    /* Nodes start in an order unrelated to their ranks, with different nproc. */
    const int ranks[] = {2, 0, 3, 1};
    const int nproc[] = {4, 2, 3, 1};
    static_args s = {0, 4, ranks, nproc, 5.0};
    node_result res[4];
    run_nodes(4, static_node, &s, res);
    for (int i = 0; i < 4; i++) {
        ck_assert_msg(res[i].rc == 0, "node %d: %d %s", i, res[i].rc, res[i].err);
        ck_assert_int_eq(res[i].a.node_rank, ranks[i]);
        ck_assert_str_eq(res[i].err, "");
    }
    /* Ranks 0..3 have nproc 2, 1, 4, 3: offsets 0, 2, 3, 7; world 10. */
    const int offset_by_rank[] = {0, 2, 3, 7};
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(res[i].a.rank_offset, offset_by_rank[ranks[i]]);
        ck_assert_int_eq(res[i].a.world_size, 10);
    }
    check_consistent(res, 4, 4, 0);
}
END_TEST

START_TEST(test_static_single_node)
{
    rdzv_client *c = client();
    ddprun_assignment a;
    char err[256];
    ck_assert_int_eq(ddprun_rdzv_static(c, PREFIX, 0, 1, 0, 8, 1.0, &a, err, sizeof err), 0);
    ck_assert_int_eq(a.node_rank, 0);
    ck_assert_int_eq(a.nnodes, 1);
    ck_assert_int_eq(a.rank_offset, 0);
    ck_assert_int_eq(a.world_size, 8);
    rdzv_client_close(c);
}
END_TEST

START_TEST(test_static_timeout_names_missing)
{
    /* Four nodes expected, ranks 1 and 3 never come. */
    const int ranks[] = {0, 2};
    const int nproc[] = {1, 1};
    static_args s = {0, 4, ranks, nproc, 0.5};
    node_result res[2];
    run_nodes(2, static_node, &s, res);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(res[i].rc, -ETIMEDOUT);
        ck_assert_msg(strstr(res[i].err, "node ranks 1, 3 did not show up"), "%s", res[i].err);
        ck_assert_msg(strstr(res[i].err, "2 of 4 present"), "%s", res[i].err);
        ck_assert_double_ge(res[i].elapsed_s, 0.45);
        ck_assert_double_lt(res[i].elapsed_s, 3.0);
    }
}
END_TEST

START_TEST(test_static_timeout_many_missing)
{
    /* Node rank 0 of 20 alone: the first missing ranks are named, the rest counted. */
    rdzv_client *c = client();
    ddprun_assignment a;
    char err[512];
    double t0 = mono_now_s();
    ck_assert_int_eq(ddprun_rdzv_static(c, PREFIX, 0, 20, 0, 1, 0.2, &a, err, sizeof err),
                     -ETIMEDOUT);
    ck_assert_double_ge(mono_now_s() - t0, 0.18);
    ck_assert_msg(strstr(err, "static rendezvous round 0: node ranks 1, 2, 3, "), "%s", err);
    ck_assert_msg(strstr(err, " more did not show up within 0.2 s (1 of 20 present)"), "%s", err);
    ck_assert_msg(!strstr(err, "19 "), "%s", err); /* not every rank is listed */
    rdzv_client_close(c);
}
END_TEST

START_TEST(test_static_conflicts)
{
    rdzv_client *c = client();
    ddprun_assignment a;
    memset(&a, 0x5a, sizeof a);
    char err[256];
    /* Rank 0 of 2 publishes and times out waiting for rank 1. */
    ck_assert_int_eq(ddprun_rdzv_static(c, PREFIX, 0, 2, 0, 1, 0.1, &a, err, sizeof err),
                     -ETIMEDOUT);
    ck_assert_msg(strstr(err, "node rank 1 did not show up"), "%s", err);
    ck_assert_int_eq(a.world_size, 0x5a5a5a5a); /* untouched on failure */
    /* A second node claiming rank 0 is refused at once. */
    ck_assert_int_eq(ddprun_rdzv_static(c, PREFIX, 0, 2, 0, 1, 5.0, &a, err, sizeof err), -EEXIST);
    ck_assert_msg(strstr(err, "node rank 0 was claimed"), "%s", err);
    /* A node that disagrees on nnodes is refused at once. */
    ck_assert_int_eq(ddprun_rdzv_static(c, PREFIX, 0, 3, 1, 1, 5.0, &a, err, sizeof err), -EINVAL);
    ck_assert_msg(strstr(err, "nnodes=3") && strstr(err, "nnodes=2"), "%s", err);
    /* Rank 1 completes the round; the rank-0 record published earlier still counts. */
    ck_assert_int_eq(ddprun_rdzv_static(c, PREFIX, 0, 2, 1, 5, 5.0, &a, err, sizeof err), 0);
    ck_assert_int_eq(a.rank_offset, 1);
    ck_assert_int_eq(a.world_size, 6);
    rdzv_client_close(c);
}
END_TEST

/*
 * Plays node rank 1 of 2 by hand once node rank 0 (a forked node) has counted itself: claims the
 * rank, publishes `nproc` and completes static/arrived, which makes it the node that computes
 * the layout, and then stops without publishing it, as a node killed at that moment would.
 */
static void static_rank1_stops(const char *nproc)
{
    rdzv_client *c = client();
    const char *arrived = PREFIX "/round_0/static/arrived";
    ck_assert_int_eq(rdzv_wait(c, &arrived, 1, 5000), 0);
    int64_t v = 0;
    ck_assert_int_eq(rdzv_add(c, PREFIX "/round_0/static/claim/1", 1, &v), 0);
    ck_assert_int_eq(rdzv_set(c, PREFIX "/round_0/static/nproc/1", nproc, strlen(nproc)), 0);
    ck_assert_int_eq(rdzv_add(c, arrived, 1, &v), 0);
    ck_assert_int_eq(v, 2);
    rdzv_client_close(c);
}

START_TEST(test_static_computing_node_stops)
{
    /* Rank 0 waits for its layout key, which never comes: it computes its own once bounded. */
    const int ranks[] = {0};
    const int nproc[] = {2};
    static_args s = {0, 2, ranks, nproc, 0.5};
    nodes ns;
    node_result res[1];
    nodes_start(&ns, 1, static_node, &s);
    static_rank1_stops("3");
    nodes_join(&ns, res);
    ck_assert_msg(res[0].rc == 0, "%d %s", res[0].rc, res[0].err);
    ck_assert_int_eq(res[0].a.rank_offset, 0);
    ck_assert_int_eq(res[0].a.world_size, 5);
    ck_assert_double_ge(res[0].elapsed_s, 0.45);
    ck_assert_double_lt(res[0].elapsed_s, 3.0);
}
END_TEST

START_TEST(test_static_malformed_nproc)
{
    /* Found by the node that computes the layout and published to every node... */
    rdzv_client *c = client();
    int64_t v = 0;
    ck_assert_int_eq(rdzv_add(c, PREFIX "/round_0/static/claim/1", 1, &v), 0);
    ck_assert_int_eq(rdzv_set(c, PREFIX "/round_0/static/nproc/1", "x1", 2), 0);
    ck_assert_int_eq(rdzv_add(c, PREFIX "/round_0/static/arrived", 1, &v), 0);
    ddprun_assignment a;
    char err[256];
    ck_assert_int_eq(ddprun_rdzv_static(c, PREFIX, 0, 2, 0, 1, 2.0, &a, err, sizeof err), -EPROTO);
    ck_assert_msg(strstr(err, "round 0: node rank 1 published a malformed nproc"), "%s", err);
    void *rec = NULL;
    size_t len = 0;
    ck_assert_int_eq(rdzv_get(c, PREFIX "/round_0/static/layout/1", &rec, &len), 0);
    ck_assert_msg(len > 4 && memcmp(rec, "E71 ", 4) == 0, "%.*s", (int)len, (char *)rec);
    rdzv_free(rec);
    rdzv_client_close(c);

    /* ...and by a node whose computing peer stopped, when it looks at the records itself. */
    const int ranks[] = {0};
    const int nproc[] = {1};
    static_args s = {1, 2, ranks, nproc, 0.3};
    nodes ns;
    node_result res[1];
    nodes_start(&ns, 1, static_node, &s);
    c = client();
    const char *arrived = PREFIX "/round_1/static/arrived";
    ck_assert_int_eq(rdzv_wait(c, &arrived, 1, 5000), 0);
    ck_assert_int_eq(rdzv_set(c, PREFIX "/round_1/static/nproc/1", "0", 1), 0);
    ck_assert_int_eq(rdzv_add(c, arrived, 1, &v), 0);
    rdzv_client_close(c);
    nodes_join(&ns, res);
    ck_assert_int_eq(res[0].rc, -EPROTO);
    ck_assert_msg(strstr(res[0].err, "round 1: node rank 1 published a malformed nproc"), "%s",
                  res[0].err);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Dynamic                                                                                     */
/* ------------------------------------------------------------------------------------------ */

typedef struct dyn_args {
    int round, min_nodes, max_nodes;
    double join_s, last_call_s;
    int nproc_base; /* node i publishes nproc_base + i */
} dyn_args;

static int dyn_call(rdzv_client *c, const dyn_args *d, int i, node_result *r)
{
    char id[64];
    snprintf(id, sizeof id, "host%d:%d", i, (int)getpid());
    r->nproc = d->nproc_base + i;
    double t0 = mono_now_s();
    r->rc = ddprun_rdzv_dynamic(c, PREFIX, d->round, d->min_nodes, d->max_nodes, id, r->nproc,
                                d->join_s, d->last_call_s, &r->a, r->err, sizeof r->err);
    r->elapsed_s = mono_now_s() - t0;
    return r->rc;
}

static void dyn_node(int i, rdzv_client *c, void *arg, node_result *r)
{
    dyn_call(c, arg, i, r);
}

START_TEST(test_dynamic_closes_at_max)
{
    /* The last call is far longer than the case's timeout: only reaching max can close it. */
    dyn_args d = {0, 2, 3, 5.0, 60.0, 1};
    node_result res[3];
    double t0 = mono_now_s();
    run_nodes(3, dyn_node, &d, res);
    for (int i = 0; i < 3; i++)
        ck_assert_msg(res[i].rc == 0, "node %d: %d %s", i, res[i].rc, res[i].err);
    check_consistent(res, 3, 3, 0);
    ck_assert_int_eq(res[0].a.world_size, 1 + 2 + 3);
    ck_assert_double_lt(mono_now_s() - t0, 3.0);
}
END_TEST

START_TEST(test_dynamic_closes_after_last_call)
{
    dyn_args d = {0, 2, 4, 5.0, 0.5, 2};
    node_result res[2];
    run_nodes(2, dyn_node, &d, res);
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(res[i].rc == 0, "node %d: %d %s", i, res[i].rc, res[i].err);
        ck_assert_double_ge(res[i].elapsed_s, 0.45);
        ck_assert_double_lt(res[i].elapsed_s, 3.0);
    }
    check_consistent(res, 2, 2, 0);
    ck_assert_int_eq(res[0].a.world_size, 2 + 3);
}
END_TEST

START_TEST(test_dynamic_late_node)
{
    rdzv_client *c = client();
    node_result r;
    char err[512];
    int64_t waiting = -1;

    /* Round 0: min 2 max 2 closes at once when full; a third node is late. */
    dyn_args full = {0, 2, 2, 5.0, 60.0, 1};
    node_result res[2];
    run_nodes(2, dyn_node, &full, res);
    check_consistent(res, 2, 2, 0);
    memset(&r, 0, sizeof r);
    ck_assert_int_eq(dyn_call(c, &full, 2, &r), -EAGAIN);
    ck_assert_msg(strstr(r.err, "round 0") && strstr(r.err, "full") &&
                      strstr(r.err, "retry with round 1"),
                  "%s", r.err);
    ck_assert_int_eq(ddprun_rdzv_num_waiting(c, PREFIX, 0, &waiting), 0);
    ck_assert_int_eq(waiting, 1);

    /* Round 1: min 2 max 4 closes after the last call with 2; a third node (slot 2 < max) is
       late too, and learns it at once. */
    dyn_args open = {1, 2, 4, 5.0, 0.2, 1};
    run_nodes(2, dyn_node, &open, res);
    check_consistent(res, 2, 2, 1);
    memset(&r, 0, sizeof r);
    ck_assert_int_eq(dyn_call(c, &open, 2, &r), -EAGAIN);
    ck_assert_msg(strstr(r.err, "closed with 2 nodes before this node joined"), "%s", r.err);
    ck_assert_double_lt(r.elapsed_s, 1.0);
    ck_assert_int_eq(ddprun_rdzv_num_waiting(c, PREFIX, 1, &waiting), 0);
    ck_assert_int_eq(waiting, 1);

    /* A node asking for other bounds than the round's is refused. */
    ddprun_assignment a;
    ck_assert_int_eq(
        ddprun_rdzv_dynamic(c, PREFIX, 1, 1, 4, "x:1", 1, 1.0, 0.1, &a, err, sizeof err), -EINVAL);
    ck_assert_msg(strstr(err, "other bounds"), "%s", err);
    rdzv_client_close(c);
}
END_TEST

START_TEST(test_dynamic_join_timeout_aborts)
{
    /* min 3, only 2 come: both time out, and a node arriving after that is late. */
    dyn_args d = {0, 3, 4, 0.5, 0.1, 1};
    node_result res[2];
    run_nodes(2, dyn_node, &d, res);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(res[i].rc, -ETIMEDOUT);
        ck_assert_msg(strstr(res[i].err, "only 2 of min_nodes=3") && strstr(res[i].err, "aborted"),
                      "%s", res[i].err);
        ck_assert_double_lt(res[i].elapsed_s, 3.0);
    }
    rdzv_client *c = client();
    node_result r;
    memset(&r, 0, sizeof r);
    ck_assert_int_eq(dyn_call(c, &d, 2, &r), -EAGAIN);
    ck_assert_msg(strstr(r.err, "was aborted"), "%s", r.err);
    rdzv_client_close(c);
}
END_TEST

START_TEST(test_rounds_do_not_mix)
{
    /* Static: round 0 with 2 nodes, round 1 with 3 nodes and other nproc. */
    const int ranks0[] = {0, 1}, nproc0[] = {1, 2};
    static_args s0 = {0, 2, ranks0, nproc0, 5.0};
    node_result res[3];
    run_nodes(2, static_node, &s0, res);
    check_consistent(res, 2, 2, 0);
    ck_assert_int_eq(res[0].a.world_size, 3);
    const int ranks1[] = {0, 1, 2}, nproc1[] = {3, 1, 1};
    static_args s1 = {1, 3, ranks1, nproc1, 5.0};
    run_nodes(3, static_node, &s1, res);
    check_consistent(res, 3, 3, 1);
    ck_assert_int_eq(res[0].a.world_size, 5);

    /* Dynamic: round 0 full at 3; round 1 with 2 nodes closes after its own last call, with
       join slots counted afresh. */
    dyn_args d0 = {0, 2, 3, 5.0, 60.0, 1};
    run_nodes(3, dyn_node, &d0, res);
    check_consistent(res, 3, 3, 0);
    dyn_args d1 = {1, 2, 3, 5.0, 0.3, 4};
    run_nodes(2, dyn_node, &d1, res);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(res[i].rc == 0, "node %d: %d %s", i, res[i].rc, res[i].err);
    check_consistent(res, 2, 2, 1);
    ck_assert_int_eq(res[0].a.world_size, 4 + 5);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Heartbeats                                                                                  */
/* ------------------------------------------------------------------------------------------ */

#define HB_INTERVAL_S 0.05
#define HB_DEAD_AFTER_S 0.3

/* Node 0 beats until the key "hbtest/stop" exists; node 1 beats 4 times, then says so. */
static void hb_node(int i, rdzv_client *c, void *arg, node_result *r)
{
    (void)arg;
    const char *stop = "hbtest/stop";
    for (int n = 0;; n++) {
        r->rc = ddprun_heartbeat(c, PREFIX, 0, i);
        if (r->rc < 0)
            return;
        if (i == 1 && n == 3) {
            r->rc = rdzv_set(c, "hbtest/node1_stopped", "1", 1);
            if (r->rc == 0)
                r->rc = rdzv_ping(c);
            return;
        }
        int stopped = rdzv_check(c, &stop, 1);
        if (stopped != 0) {
            r->rc = stopped < 0 ? stopped : 0;
            return;
        }
        pause_s(HB_INTERVAL_S);
    }
}

START_TEST(test_heartbeat_detects_silent_node)
{
    rdzv_client *c = client();
    ddprun_hb_state st;
    /* Three ranks: 0 beats throughout, 1 stops early, 2 never beats. */
    ck_assert_int_eq(ddprun_hb_init(&st, PREFIX, 0, 3, HB_DEAD_AFTER_S), 0);
    double t_init = mono_now_s();
    nodes ns;
    nodes_start(&ns, 2, hb_node, NULL);

    const char *stopped_key = "hbtest/node1_stopped";
    double t_stopped = -1, t_dead1 = -1, t_dead2 = -1;
    while (t_dead1 < 0) {
        ck_assert_msg(mono_now_s() - t_init < 5.0, "node 1 never reported dead");
        if (t_stopped < 0 && rdzv_check(c, &stopped_key, 1) == 1)
            t_stopped = mono_now_s();
        int dead[3] = {-1, -1, -1};
        int n = ddprun_dead_nodes(c, &st, dead, 3);
        ck_assert_int_ge(n, 0);
        ck_assert_int_le(n, 2);
        double t = mono_now_s();
        for (int k = 0; k < n; k++) {
            ck_assert_msg(dead[k] != 0, "node 0 reported dead while beating");
            if (dead[k] == 1 && t_dead1 < 0)
                t_dead1 = t;
            if (dead[k] == 2 && t_dead2 < 0)
                t_dead2 = t;
        }
        if (t_dead1 < 0)
            pause_s(HB_INTERVAL_S); /* the watcher's check interval, as an agent's */
    }
    /* Node 1 is reported only after it stopped, within dead_after + a check interval + slack. */
    ck_assert_msg(t_stopped >= 0, "node 1 reported dead before it stopped beating");
    ck_assert_double_ge(t_dead1 - t_stopped, HB_DEAD_AFTER_S - 2 * HB_INTERVAL_S);
    ck_assert_double_le(t_dead1 - t_stopped, HB_DEAD_AFTER_S + 4 * HB_INTERVAL_S + 0.3);
    /* Node 2, which never beat, counts from init. */
    ck_assert_double_ge(t_dead2 - t_init, HB_DEAD_AFTER_S);
    ck_assert_double_le(t_dead2 - t_init, HB_DEAD_AFTER_S + 2 * HB_INTERVAL_S + 0.3);
    ck_assert_int_eq(st.value[1], 4);

    rdzv_set(c, "hbtest/stop", "1", 1);
    node_result res[2];
    nodes_join(&ns, res);
    ck_assert_int_eq(res[0].rc, 0);
    ck_assert_int_eq(res[1].rc, 0);
    /* dead_cap smaller than the count: the count is still returned. */
    ck_assert_int_eq(ddprun_dead_nodes(c, &st, NULL, 0), 2);
    ddprun_hb_free(&st);
    ddprun_hb_free(&st); /* zeroed: harmless */
    rdzv_client_close(c);
}
END_TEST

/* The ring watch covers the next DDPRUN_HB_PEERS ranks, wrapping, never the watcher itself. */
START_TEST(test_heartbeat_peer_sets)
{
    ddprun_hb_state st;
    ck_assert_int_eq(ddprun_hb_init_peers(&st, PREFIX, 2, 5, 3, 2, 1.0), 0);
    ck_assert_int_eq(st.nnodes, 5);
    ck_assert_int_eq(st.nwatched, 2);
    ck_assert_int_eq(st.ranks[0], 4);
    ck_assert_int_eq(st.ranks[1], 0);
    ck_assert_str_eq(st.keys[0], PREFIX "/round_2/hb/4");
    ck_assert_str_eq(st.keys[1], PREFIX "/round_2/hb/0");
    ck_assert_ptr_null(st.keys[2]);
    ddprun_hb_free(&st);
    /* Two nodes: the other one only; one node: nothing to watch, and no store call. */
    ck_assert_int_eq(ddprun_hb_init_peers(&st, PREFIX, 0, 2, 1, DDPRUN_HB_PEERS, 1.0), 0);
    ck_assert_int_eq(st.nwatched, 1);
    ck_assert_int_eq(st.ranks[0], 0);
    ddprun_hb_free(&st);
    ck_assert_int_eq(ddprun_hb_init_peers(&st, PREFIX, 0, 1, 0, DDPRUN_HB_PEERS, 1.0), 0);
    ck_assert_int_eq(st.nwatched, 0);
    rdzv_client *c = client();
    ck_assert_int_eq(ddprun_dead_nodes(c, &st, NULL, 0), 0);
    ddprun_hb_free(&st);
    /* The full watch: every rank in order. */
    ck_assert_int_eq(ddprun_hb_init(&st, PREFIX, 0, 3, 1.0), 0);
    ck_assert_int_eq(st.nwatched, 3);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(st.ranks[i], i);
    ddprun_hb_free(&st);
    /* Bad arguments leave nothing to free. */
    ck_assert_int_eq(ddprun_hb_init_peers(&st, PREFIX, 0, 3, 3, 2, 1.0), -EINVAL);
    ck_assert_ptr_null(st.keys);
    ck_assert_int_eq(ddprun_hb_init_peers(&st, PREFIX, 0, 3, -1, 2, 1.0), -EINVAL);
    ck_assert_int_eq(ddprun_hb_init_peers(&st, PREFIX, 0, 3, 0, 0, 1.0), -EINVAL);
    ck_assert_int_eq(ddprun_hb_init_peers(&st, PREFIX, 0, 3, 0, 2, 0.0), -EINVAL);
    ck_assert_int_eq(ddprun_hb_init_peers(NULL, PREFIX, 0, 3, 0, 2, 1.0), -EINVAL);
    rdzv_client_close(c);
}
END_TEST

#define RING_N 6

/*
 * One scenario of the ring watch: RING_N nodes beat in round `round` (the test beats for them,
 * every HB_INTERVAL_S), each watching its ring peers, and a full watcher watches them all.
 * After a few beats the nodes in `dead_mask` stop. Until the bound (dead_after + check intervals
 * + slack) every live node's watcher reports only dead nodes (no false positive, before or after
 * the stop), the full watcher reports exactly the dead set, and, as long as a node lives, the
 * live watchers report some dead node: the live rank just before each run of dead ranks reports
 * its first rank.
 */
static void ring_scenario(rdzv_client *c, int round, unsigned dead_mask)
{
    ddprun_hb_state peer[RING_N], all;
    for (int i = 0; i < RING_N; i++)
        ck_assert_int_eq(ddprun_hb_init_peers(&peer[i], PREFIX, round, RING_N, i, DDPRUN_HB_PEERS,
                                              HB_DEAD_AFTER_S),
                         0);
    ck_assert_int_eq(ddprun_hb_init(&all, PREFIX, round, RING_N, HB_DEAD_AFTER_S), 0);
    unsigned reported_by_peers = 0, reported_all = 0; /* masks of ranks reported */
    unsigned first_of_run_reported = 0; /* ranks whose live predecessor reported them */
    double t0 = mono_now_s(), t_stop = -1, t_all = -1;
    for (int step = 0;; step++) {
        double now = mono_now_s();
        if (t_stop < 0 && step == 4)
            t_stop = now;
        unsigned alive = t_stop < 0 ? (1u << RING_N) - 1 : ~dead_mask & ((1u << RING_N) - 1);
        for (int i = 0; i < RING_N; i++)
            if (alive & (1u << i))
                ck_assert_int_eq(ddprun_heartbeat(c, PREFIX, round, i), 0);
        for (int i = 0; i < RING_N; i++) {
            if (!(alive & (1u << i)))
                continue; /* a dead node checks nothing */
            int dead[RING_N];
            int n = ddprun_dead_nodes(c, &peer[i], dead, RING_N);
            ck_assert_int_ge(n, 0);
            ck_assert_int_le(n, DDPRUN_HB_PEERS);
            for (int k = 0; k < n; k++) {
                ck_assert_msg(dead_mask & (1u << dead[k]) && t_stop >= 0,
                              "node %d reported live node %d", i, dead[k]);
                reported_by_peers |= 1u << dead[k];
                if (dead[k] == (i + 1) % RING_N)
                    first_of_run_reported |= 1u << dead[k];
            }
        }
        int dead[RING_N];
        int n = ddprun_dead_nodes(c, &all, dead, RING_N);
        ck_assert_int_ge(n, 0);
        unsigned mask = 0;
        for (int k = 0; k < n; k++)
            mask |= 1u << dead[k];
        ck_assert_msg((mask & ~dead_mask) == 0 && (mask == 0 || t_stop >= 0),
                      "full watcher reported live nodes (%#x)", mask);
        if (mask == dead_mask && t_all < 0)
            t_all = mono_now_s();
        reported_all |= mask;
        /* Every run of dead ranks after a live rank has its first rank reported. */
        unsigned want = 0;
        for (int i = 0; i < RING_N; i++)
            if ((alive & (1u << i)) && (dead_mask & (1u << (i + 1) % RING_N)))
                want |= 1u << (i + 1) % RING_N;
        if (t_stop >= 0 && t_all >= 0 && (first_of_run_reported & want) == want)
            break;
        ck_assert_msg(t_stop < 0 || now - t_stop < HB_DEAD_AFTER_S + 4 * HB_INTERVAL_S + 0.3,
                      "mask %#x: not reported in time (full %#x, first of runs %#x of %#x)",
                      dead_mask, reported_all, first_of_run_reported, want);
        ck_assert(now - t0 < 5.0);
        pause_s(HB_INTERVAL_S);
    }
    ck_assert_double_ge(t_all - t_stop, HB_DEAD_AFTER_S - 2 * HB_INTERVAL_S);
    ck_assert_int_eq(reported_all, dead_mask);
    ck_assert_int_ne(reported_by_peers, 0);
    for (int i = 0; i < RING_N; i++)
        ddprun_hb_free(&peer[i]);
    ddprun_hb_free(&all);
}

START_TEST(test_heartbeat_ring_detects)
{
    rdzv_client *c = client();
    /* One node; two apart; a run of three; a run wrapping past rank 0; all but one. */
    const unsigned masks[] = {1u << 4, 1u << 1 | 1u << 4, 0x0e, 1u << 5 | 1u << 0, 0x1f};
    for (int i = 0; i < (int)(sizeof masks / sizeof masks[0]); i++)
        ring_scenario(c, 10 + i, masks[i]);
    rdzv_client_close(c);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Failure reports                                                                             */
/* ------------------------------------------------------------------------------------------ */

static void fail_publisher(int i, rdzv_client *c, void *arg, node_result *r)
{
    (void)arg;
    snprintf(r->err, sizeof r->err, "{\"node_rank\": %d, \"exitcode\": 1}", i);
    r->rc = ddprun_rdzv_publish_failure(c, PREFIX, 0, r->err);
}

static void fail_monitor(int i, rdzv_client *c, void *arg, node_result *r)
{
    (void)i;
    (void)arg;
    char *json = NULL;
    r->rc = ddprun_rdzv_wait_failure(c, PREFIX, 0, 5000, &json);
    if (r->rc == 0) {
        snprintf(r->err, sizeof r->err, "%s", json);
        rdzv_free(json);
    }
}

START_TEST(test_failure_first_writer_wins)
{
    nodes mon, pubs;
    nodes_start(&mon, 1, fail_monitor, NULL);
    await_waiters(1); /* the monitor is parked on the failure key before anyone publishes */
    nodes_start(&pubs, 4, fail_publisher, NULL);
    node_result m, res[4];
    nodes_join(&pubs, res);
    nodes_join(&mon, &m);
    int winners = 0, winner = -1;
    for (int i = 0; i < 4; i++) {
        ck_assert_msg(res[i].rc == 0 || res[i].rc == 1, "node %d: %d", i, res[i].rc);
        if (res[i].rc == 1) {
            winners++;
            winner = i;
        }
    }
    ck_assert_int_eq(winners, 1);
    ck_assert_int_eq(m.rc, 0);
    ck_assert_str_eq(m.err, res[winner].err);

    /* The kept report is the winner's; a later one changes nothing. */
    rdzv_client *c = client();
    ck_assert_int_eq(ddprun_rdzv_publish_failure(c, PREFIX, 0, "{\"late\": true}"), 0);
    char *json = NULL;
    ck_assert_int_eq(ddprun_rdzv_wait_failure(c, PREFIX, 0, 1000, &json), 0);
    ck_assert_str_eq(json, res[winner].err);
    rdzv_free(json);
    /* Re-publishing the kept text counts as kept. */
    ck_assert_int_eq(ddprun_rdzv_publish_failure(c, PREFIX, 0, res[winner].err), 1);

    /* Round 1 has no failure: the wait times out and the client stays usable. */
    json = NULL;
    ck_assert_int_eq(ddprun_rdzv_wait_failure(c, PREFIX, 1, 100, &json), -ETIMEDOUT);
    ck_assert_ptr_null(json);
    ck_assert_int_eq(ddprun_rdzv_publish_failure(c, PREFIX, 1, "{}"), 1);

    /* The key a monitor waits on, as a string. */
    char key[64];
    ck_assert_int_eq(ddprun_rdzv_failure_key(PREFIX, 3, key, sizeof key),
                     (int)strlen(PREFIX "/round_3/failed"));
    ck_assert_str_eq(key, PREFIX "/round_3/failed");
    ck_assert_int_eq(ddprun_rdzv_failure_key(PREFIX, 3, key, 8), -ENAMETOOLONG);
    ck_assert_str_eq(key, "");
    rdzv_client_close(c);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Exit barrier                                                                                */
/* ------------------------------------------------------------------------------------------ */

typedef struct exit_args {
    int round, nnodes;
    double timeout_s;
} exit_args;

#define EXIT_POLL_MS 50

/* A node at the exit barrier; a failure report it gets comes back in r->err. */
static void exit_node(int i, rdzv_client *c, void *arg, node_result *r)
{
    (void)i;
    const exit_args *e = arg;
    char *json = NULL;
    double t0 = mono_now_s();
    r->rc =
        ddprun_rdzv_exit_barrier(c, PREFIX, e->round, e->nnodes, e->timeout_s, EXIT_POLL_MS, &json);
    r->elapsed_s = mono_now_s() - t0;
    if (json) {
        snprintf(r->err, sizeof r->err, "%s", json);
        rdzv_free(json);
    }
}

/* Connection records: each node's published end is found again by its host and port; an end
 * nobody published is no node's; exit/done reads as set only once it is. */
START_TEST(test_conn_records)
{
    rdzv_client *n0 = client(), *n1 = client(), *host = client();
    ck_assert_int_eq(ddprun_rdzv_publish_conn(n0, PREFIX, 4, 0), 0);
    ck_assert_int_eq(ddprun_rdzv_publish_conn(n1, PREFIX, 4, 1), 0);
    /* SET has no reply: a round trip on each publisher's connection makes its record visible. */
    ck_assert_int_eq(rdzv_ping(n0), 0);
    ck_assert_int_eq(rdzv_ping(n1), 0);
    char h[64];
    int p0 = 0, p1 = 0, ph = 0;
    ck_assert_int_eq(rdzv_client_local_endpoint(n0, h, sizeof h, &p0), 0);
    ck_assert_int_eq(rdzv_client_local_endpoint(n1, h, sizeof h, &p1), 0);
    ck_assert_int_eq(rdzv_client_local_endpoint(host, h, sizeof h, &ph), 0);
    ck_assert_int_eq(ddprun_rdzv_conn_owner(host, PREFIX, 4, 3, h, p1), 1);
    ck_assert_int_eq(ddprun_rdzv_conn_owner(host, PREFIX, 4, 3, h, p0), 0);
    ck_assert_int_eq(ddprun_rdzv_conn_owner(host, PREFIX, 4, 3, h, ph), -ENOENT);
    ck_assert_int_eq(ddprun_rdzv_conn_owner(host, PREFIX, 5, 3, h, p0), -ENOENT); /* round */
    ck_assert_int_eq(ddprun_rdzv_conn_owner(host, PREFIX, 4, 3, "10.9.9.9", p0), -ENOENT);
    ck_assert_int_eq(ddprun_rdzv_conn_owner(host, PREFIX, 4, 0, h, p0), -EINVAL);
    ck_assert_int_eq(ddprun_rdzv_publish_conn(NULL, PREFIX, 4, 0), -EINVAL);

    ck_assert_int_eq(ddprun_rdzv_exit_done(host, PREFIX, 4), 0);
    ck_assert_int_eq(rdzv_set(host, PREFIX "/round_4/exit/done", "1", 1), 0);
    ck_assert_int_eq(ddprun_rdzv_exit_done(host, PREFIX, 4), 1);
    rdzv_client_close(n0);
    rdzv_client_close(n1);
    rdzv_client_close(host);
}
END_TEST

START_TEST(test_exit_barrier_all_arrive)
{
    exit_args e = {0, 3, 5.0};
    node_result res[3];
    run_nodes(3, exit_node, &e, res);
    for (int i = 0; i < 3; i++) {
        ck_assert_msg(res[i].rc == 0, "node %d: %d", i, res[i].rc);
        ck_assert_str_eq(res[i].err, "");
        ck_assert_double_lt(res[i].elapsed_s, 3.0);
    }
    /* The keys keep their names: three arrivals counted, and the release set. */
    rdzv_client *c = client();
    int64_t n = -1;
    ck_assert_int_eq(rdzv_add(c, PREFIX "/round_0/exit/count", 0, &n), 0);
    ck_assert_int_eq(n, 3);
    const char *done = PREFIX "/round_0/exit/done";
    ck_assert_int_eq(rdzv_check(c, &done, 1), 1);
    /* A one-node barrier of another round passes at once. */
    char *json = NULL;
    ck_assert_int_eq(ddprun_rdzv_exit_barrier(c, PREFIX, 1, 1, 5.0, EXIT_POLL_MS, &json), 0);
    ck_assert_ptr_null(json);
    rdzv_client_close(c);
}
END_TEST

START_TEST(test_exit_barrier_failure_ends_wait)
{
    /* Two of three nodes finished; the third fails and publishes its record. */
    exit_args e = {0, 3, 10.0};
    nodes ns;
    nodes_start(&ns, 2, exit_node, &e);
    rdzv_client *c = client();
    ddprun_failure f;
    ddprun_failure_init(&f, "node-c", 4, 0, 3, 77, "boom");
    char *js = ddprun_failure_to_json(&f);
    ck_assert_ptr_nonnull(js);
    ck_assert_int_eq(ddprun_rdzv_publish_failure(c, PREFIX, 0, js), 1);
    node_result res[2];
    nodes_join(&ns, res);
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(res[i].rc == 1, "node %d: %d", i, res[i].rc);
        ck_assert_str_eq(res[i].err, js);
        ck_assert_double_lt(res[i].elapsed_s, 3.0);
    }
    free(js);
    /* A failure of round 0 does not hold up round 1's barrier, nor end it early. */
    char *json = NULL;
    ck_assert_int_eq(ddprun_rdzv_exit_barrier(c, PREFIX, 1, 2, 0.2, EXIT_POLL_MS, &json),
                     -ETIMEDOUT);
    ck_assert_ptr_null(json);
    rdzv_client_close(c);
}
END_TEST

START_TEST(test_exit_barrier_timeout)
{
    /* One node of two: the barrier gives up after its timeout, on the monotonic clock. */
    exit_args e = {0, 2, 0.3};
    node_result r;
    run_nodes(1, exit_node, &e, &r);
    ck_assert_int_eq(r.rc, -ETIMEDOUT);
    ck_assert_str_eq(r.err, "");
    ck_assert_double_ge(r.elapsed_s, 0.28);
    ck_assert_double_lt(r.elapsed_s, 2.0);

    rdzv_client *c = client();
    char *json = NULL;
    ck_assert_int_eq(ddprun_rdzv_exit_barrier(NULL, PREFIX, 0, 2, 1.0, 50, &json), -EINVAL);
    ck_assert_int_eq(ddprun_rdzv_exit_barrier(c, PREFIX, 0, 0, 1.0, 50, &json), -EINVAL);
    ck_assert_int_eq(ddprun_rdzv_exit_barrier(c, PREFIX, -1, 2, 1.0, 50, &json), -EINVAL);
    ck_assert_int_eq(ddprun_rdzv_exit_barrier(c, PREFIX, 0, 2, 1.0, 0, &json), -EINVAL);
    ck_assert_int_eq(ddprun_rdzv_exit_barrier(c, PREFIX, 0, 2, 1.0, 50, NULL), -EINVAL);
    rdzv_client_close(c);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Clearing the workers' keys between attempts                                                 */
/* ------------------------------------------------------------------------------------------ */

START_TEST(test_clear_worker_keys)
{
    /* The host's own server, in this process (nothing is forked after it starts). */
    rdzv_server_options so;
    rdzv_server_options_init(&so);
    so.host = "127.0.0.1";
    rdzv_server *srv = NULL;
    ck_assert_int_eq(rdzv_server_start(&so, &srv), 0);
    rdzv_client_options co;
    rdzv_client_options_init(&co);
    co.timeout_ms = 10000;
    rdzv_client *c = NULL;
    ck_assert_int_eq(rdzv_client_connect("127.0.0.1", rdzv_server_port(srv), &co, &c), 0);

    /* A failed attempt's worker keys, torch-style, beside ddprun's own (this run's, another's). */
    const char *workers[] = {"rank_0_addr", "/default_pg/0//cuda//0", "/ddprun-lookalike"};
    const char *ours[] = {PREFIX "/round_0/static/nnodes", DDPRUN_RDZV_ROOT "/other-run/x"};
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(rdzv_set(c, workers[i], "v", 1), 0);
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(rdzv_set(c, ours[i], "v", 1), 0);
    ck_assert_int_eq(rdzv_ping(c), 0); /* SET has no reply: the ping's says they landed */

    /* A node that does not host the store waits for the host's word, here in vain. */
    ck_assert_int_eq(ddprun_rdzv_mark_host(c, PREFIX), 0);
    double t0 = mono_now_s();
    ck_assert_int_eq(ddprun_rdzv_clear_worker_keys(NULL, c, PREFIX, 1, 2, 0.2), -ETIMEDOUT);
    ck_assert_double_ge(mono_now_s() - t0, 0.18);

    /* The host deletes the workers' keys, keeps ddprun's, and says so in the round's key. */
    ck_assert_int_eq(ddprun_rdzv_clear_worker_keys(srv, c, PREFIX, 1, 2, 5.0), 3);
    for (int i = 0; i < 3; i++)
        ck_assert_msg(rdzv_check(c, &workers[i], 1) == 0, "%s survived", workers[i]);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(rdzv_check(c, &ours[i], 1) == 1, "%s deleted", ours[i]);
    const char *cleared = PREFIX "/round_1/cleared";
    ck_assert_int_eq(rdzv_check(c, &cleared, 1), 1);
    /* Now the other nodes go on at once. */
    t0 = mono_now_s();
    ck_assert_int_eq(ddprun_rdzv_clear_worker_keys(NULL, c, PREFIX, 1, 2, 5.0), 0);
    ck_assert_double_lt(mono_now_s() - t0, 1.0);

    /* A one-node job has nobody to tell. */
    ck_assert_int_eq(rdzv_set(c, workers[0], "v", 1), 0);
    ck_assert_int_eq(rdzv_ping(c), 0); /* SET has no reply: the ping's says it landed */
    ck_assert_int_eq(ddprun_rdzv_clear_worker_keys(srv, c, PREFIX, 2, 1, 5.0), 1);
    cleared = PREFIX "/round_2/cleared";
    ck_assert_int_eq(rdzv_check(c, &cleared, 1), 0);

    /* A prefix outside ddprun's root would be cleared away with the workers' keys. */
    ck_assert_int_eq(ddprun_rdzv_clear_worker_keys(srv, c, "/elsewhere/run", 1, 2, 1.0), -EINVAL);
    ck_assert_int_eq(ddprun_rdzv_clear_worker_keys(srv, c, DDPRUN_RDZV_ROOT, 1, 2, 1.0), -EINVAL);
    ck_assert_int_eq(ddprun_rdzv_clear_worker_keys(srv, NULL, PREFIX, 1, 2, 1.0), -EINVAL);
    ck_assert_int_eq(ddprun_rdzv_clear_worker_keys(srv, c, PREFIX, -1, 2, 1.0), -EINVAL);
    rdzv_client_close(c);
    rdzv_server_close(srv);
}
END_TEST

/* No agent hosts the store (an external c10d endpoint): the first node of the round to claim the
 * clearing deletes the workers' keys through its client, the others wait for its word. */
START_TEST(test_clear_worker_keys_without_host)
{
    rdzv_client *c = client(), *c2 = client();
    const char *workers[] = {"rank_0_addr", "/default_pg/0//cuda//0"};
    const char *ours[] = {PREFIX "/round_0/static/nnodes", DDPRUN_RDZV_ROOT "/other-run/x"};
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(rdzv_set(c, workers[i], "v", 1), 0);
        ck_assert_int_eq(rdzv_set(c, ours[i], "v", 1), 0);
    }
    ck_assert_int_eq(rdzv_ping(c), 0);
    ck_assert_int_eq(ddprun_rdzv_clear_worker_keys(NULL, c, PREFIX, 1, 2, 5.0), 2);
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(rdzv_check(c, &workers[i], 1) == 0, "%s survived", workers[i]);
        ck_assert_msg(rdzv_check(c, &ours[i], 1) == 1, "%s deleted", ours[i]);
    }
    /* The second node goes on at once, deleting nothing. */
    ck_assert_int_eq(rdzv_set(c2, workers[0], "new attempt", 11), 0);
    double t0 = mono_now_s();
    ck_assert_int_eq(ddprun_rdzv_clear_worker_keys(NULL, c2, PREFIX, 1, 2, 5.0), 0);
    ck_assert_double_lt(mono_now_s() - t0, 1.0);
    ck_assert_int_eq(rdzv_check(c2, &workers[0], 1), 1);
    /* The next round has a clearing of its own. */
    ck_assert_int_eq(ddprun_rdzv_clear_worker_keys(NULL, c2, PREFIX, 2, 2, 5.0), 1);
    ck_assert_int_eq(ddprun_rdzv_clear_worker_keys(NULL, c, PREFIX, 2, 2, 5.0), 0);
    ck_assert_int_eq(ddprun_rdzv_mark_host(NULL, PREFIX), -EINVAL);
    ck_assert_int_eq(ddprun_rdzv_mark_host(c, "relative"), -EINVAL);
    rdzv_client_close(c);
    rdzv_client_close(c2);
}
END_TEST

START_TEST(test_run_prefix)
{
    char buf[64];
    ck_assert_int_eq(ddprun_rdzv_run_prefix("test", buf, sizeof buf), (int)strlen(PREFIX));
    ck_assert_str_eq(buf, PREFIX);
    ck_assert_int_eq(
        ddprun_rdzv_run_prefix("0f1e2d3c-4b5a-4697-8899-aabbccddeeff", buf, sizeof buf),
        (int)strlen("/ddprun/0f1e2d3c-4b5a-4697-8899-aabbccddeeff"));
    ck_assert_str_eq(buf, "/ddprun/0f1e2d3c-4b5a-4697-8899-aabbccddeeff");
    ck_assert_int_eq(ddprun_rdzv_run_prefix("test", buf, strlen(PREFIX)), -ENAMETOOLONG);
    ck_assert_str_eq(buf, "");
    ck_assert_int_eq(ddprun_rdzv_run_prefix("", buf, sizeof buf), -EINVAL);
    ck_assert_int_eq(ddprun_rdzv_run_prefix(NULL, buf, sizeof buf), -EINVAL);
    ck_assert_int_eq(ddprun_rdzv_run_prefix("test", NULL, 0), -EINVAL);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Failure records (failure.h)                                                                 */
/* ------------------------------------------------------------------------------------------ */

static double wall_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void check_same_failure(const ddprun_failure *x, const ddprun_failure *y)
{
    ck_assert_double_eq_tol(x->time, y->time, 1e-6);
    ck_assert_str_eq(x->node, y->node);
    ck_assert_int_eq(x->rank, y->rank);
    ck_assert_int_eq(x->local_rank, y->local_rank);
    ck_assert_int_eq(x->exit_code, y->exit_code);
    ck_assert_int_eq(x->pid, y->pid);
    ck_assert_str_eq(x->message, y->message);
    ck_assert_int_eq(x->teardown, y->teardown);
}

START_TEST(test_failure_record_init)
{
    ddprun_failure f;
    double before = wall_now_s();
    ddprun_failure_init(&f, "node-a", 5, 1, -9, 4242, "CUDA error: out of memory");
    double after = wall_now_s();
    /* Stamped with the wall clock (seconds since the epoch), not a monotonic one. */
    ck_assert_double_ge(f.time, before - 1e-3);
    ck_assert_double_le(f.time, after + 1e-3);
    ck_assert_str_eq(f.node, "node-a");
    ck_assert_int_eq(f.rank, 5);
    ck_assert_int_eq(f.local_rank, 1);
    ck_assert_int_eq(f.exit_code, -9);
    ck_assert_int_eq(f.pid, 4242);
    ck_assert_str_eq(f.message, "CUDA error: out of memory");
    ck_assert(!f.teardown);

    /* Unknown node and no message; overlong strings are cut to the fields. */
    ddprun_failure_init(&f, NULL, -1, -1, 1, 0, NULL);
    ck_assert_str_eq(f.node, "?");
    ck_assert_str_eq(f.message, "");
    char longer[2048];
    memset(longer, 'x', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    ddprun_failure_init(&f, longer, 0, 0, 1, 1, longer);
    ck_assert_uint_eq(strlen(f.node), sizeof f.node - 1);
    ck_assert_uint_eq(strlen(f.message), sizeof f.message - 1);
}
END_TEST

START_TEST(test_failure_record_json)
{
    ddprun_failure f, g;
    ddprun_failure_init(&f, "gpu-node-07", 13, 5, -11, 31337,
                        "RuntimeError: \"quoted\", tab\t, unicode \xc3\xa9");
    f.time = 1700000000.125;
    f.teardown = true;
    char *js = ddprun_failure_to_json(&f);
    ck_assert_ptr_nonnull(js);
    /* The members other nodes (and other builds of ddprun) read, one compact object. */
    json_error_t jerr;
    json_t *o = json_loads(js, 0, &jerr);
    ck_assert_msg(o != NULL, "%s: %s", js, jerr.text);
    ck_assert_int_eq(json_object_size(o), 8);
    ck_assert_double_eq_tol(json_real_value(json_object_get(o, "time")), 1700000000.125, 1e-6);
    ck_assert_str_eq(json_string_value(json_object_get(o, "node")), "gpu-node-07");
    ck_assert_int_eq(json_integer_value(json_object_get(o, "rank")), 13);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "local_rank")), 5);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "exit_code")), -11);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "pid")), 31337);
    ck_assert_str_eq(json_string_value(json_object_get(o, "message")), f.message);
    ck_assert(json_is_true(json_object_get(o, "teardown")));
    json_decref(o);
    ck_assert_ptr_null(strchr(js, '\n'));
    memset(&g, 0x5a, sizeof g);
    ck_assert_int_eq(ddprun_failure_from_json(js, &g), 0);
    check_same_failure(&f, &g);
    free(js);

    /* "message" and "teardown" may be absent (an integer time is accepted); extra members are
     * ignored. */
    ck_assert_int_eq(ddprun_failure_from_json("{\"time\": 5, \"node\": \"n\", \"rank\": 0, "
                                              "\"local_rank\": 0, \"exit_code\": 2, \"pid\": 7, "
                                              "\"extra\": [1]}",
                                              &g),
                     0);
    ck_assert_double_eq(g.time, 5.0);
    ck_assert_str_eq(g.message, "");
    ck_assert_int_eq(g.exit_code, 2);
    ck_assert(!g.teardown);

    /* Anything else is refused and leaves the record as it was. */
    static const char *bad[] = {
        "node 1 stopped sending heartbeats", /* a monitor's sentence, not a record */
        "",
        "[]",
        "{\"time\": 1, \"rank\": 0, \"local_rank\": 0, \"exit_code\": 1, \"pid\": 1}",
        "{\"time\": 1, \"node\": \"n\", \"rank\": \"0\", \"local_rank\": 0, \"exit_code\": 1, "
        "\"pid\": 1}",
        "{\"time\": \"now\", \"node\": \"n\", \"rank\": 0, \"local_rank\": 0, \"exit_code\": 1, "
        "\"pid\": 1}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&g, 0x5a, sizeof g);
        ck_assert_msg(ddprun_failure_from_json(bad[i], &g) == -EPROTO, "accepted: %s", bad[i]);
        ck_assert_int_eq(g.rank, 0x5a5a5a5a);
    }
    ck_assert_int_eq(ddprun_failure_from_json(NULL, &g), -EINVAL);
    ck_assert_int_eq(ddprun_failure_from_json("{}", NULL), -EINVAL);
    ck_assert_ptr_null(ddprun_failure_to_json(NULL));
}
END_TEST

START_TEST(test_failure_record_exit_status)
{
    ddprun_failure f;
    ddprun_failure_init(&f, "n", 0, 0, 3, 1, NULL);
    ck_assert_int_eq(ddprun_failure_exit_status(&f), 3);
    f.exit_code = -9; /* SIGKILL */
    ck_assert_int_eq(ddprun_failure_exit_status(&f), 137);
    f.exit_code = -15; /* SIGTERM */
    ck_assert_int_eq(ddprun_failure_exit_status(&f), 143);
    f.exit_code = 0; /* a failure never exits 0 */
    ck_assert_int_eq(ddprun_failure_exit_status(&f), 1);
    ck_assert_int_eq(ddprun_failure_exit_status(NULL), 1);
}
END_TEST

START_TEST(test_failure_summary_order)
{
    /* The summary's order: failures of their own by time (the root cause first), then the
     * teardown ones by time, however early those are stamped. */
    ddprun_failure v[4];
    ddprun_failure_init(&v[0], "n", 0, 0, -15, 1, NULL);
    v[0].time = 1.0, v[0].teardown = true;
    ddprun_failure_init(&v[1], "n", 1, 1, 3, 2, NULL);
    v[1].time = 3.0;
    ddprun_failure_init(&v[2], "n", 2, 2, 4, 3, NULL);
    v[2].time = 2.0;
    ddprun_failure_init(&v[3], "n", 3, 3, -9, 4, NULL);
    v[3].time = 0.5, v[3].teardown = true;
    qsort(v, 4, sizeof v[0], ddprun_failure_cmp);
    ck_assert_int_eq(v[0].rank, 2);
    ck_assert_int_eq(v[1].rank, 1);
    ck_assert_int_eq(v[2].rank, 3);
    ck_assert_int_eq(v[3].rank, 0);
}
END_TEST

START_TEST(test_failure_record_through_store)
{
    /* What one node publishes is what another reads back, field for field. */
    rdzv_client *c = client();
    ddprun_failure f, g;
    ddprun_failure_init(&f, "node-b", 3, 0, 4, 99, "worker failed");
    char *js = ddprun_failure_to_json(&f);
    ck_assert_ptr_nonnull(js);
    ck_assert_int_eq(ddprun_rdzv_publish_failure(c, PREFIX, 2, js), 1);
    free(js);
    char *got = NULL;
    ck_assert_int_eq(ddprun_rdzv_wait_failure(c, PREFIX, 2, 1000, &got), 0);
    ck_assert_int_eq(ddprun_failure_from_json(got, &g), 0);
    rdzv_free(got);
    check_same_failure(&f, &g);
    rdzv_client_close(c);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Arguments                                                                                   */
/* ------------------------------------------------------------------------------------------ */

START_TEST(test_invalid_arguments)
{
    rdzv_client *c = client();
    ddprun_assignment a;
    char err[256];
    ck_assert_int_eq(ddprun_rdzv_static(NULL, PREFIX, 0, 1, 0, 1, 1, &a, err, sizeof err), -EINVAL);
    ck_assert_int_eq(ddprun_rdzv_static(c, PREFIX, 0, 2, 2, 1, 1, &a, err, sizeof err), -EINVAL);
    ck_assert_msg(strstr(err, "invalid argument"), "%s", err);
    ck_assert_int_eq(ddprun_rdzv_static(c, PREFIX, 0, 1, 0, 0, 1, &a, NULL, 0), -EINVAL);
    ck_assert_int_eq(ddprun_rdzv_static(c, PREFIX, -1, 1, 0, 1, 1, &a, NULL, 0), -EINVAL);
    ck_assert_int_eq(ddprun_rdzv_dynamic(c, PREFIX, 0, 3, 2, "a", 1, 1, 1, &a, NULL, 0), -EINVAL);
    ck_assert_int_eq(ddprun_rdzv_dynamic(c, PREFIX, 0, 0, 2, "a", 1, 1, 1, &a, NULL, 0), -EINVAL);
    ck_assert_int_eq(ddprun_rdzv_dynamic(c, PREFIX, 0, 1, 2, "", 1, 1, 1, &a, NULL, 0), -EINVAL);
    ck_assert_int_eq(ddprun_rdzv_dynamic(c, PREFIX, 0, 1, 2, NULL, 1, 1, 1, &a, NULL, 0), -EINVAL);
    ck_assert_int_eq(ddprun_rdzv_dynamic(c, PREFIX, 0, 1, 2, "a", 1, 1, -1, &a, NULL, 0), -EINVAL);
    ddprun_hb_state st;
    ck_assert_int_eq(ddprun_hb_init(&st, PREFIX, 0, 0, 1.0), -EINVAL);
    ck_assert_int_eq(ddprun_hb_init(&st, PREFIX, 0, 2, 0.0), -EINVAL);
    ddprun_hb_free(&st);
    ddprun_hb_free(NULL);
    ck_assert_int_eq(ddprun_heartbeat(c, PREFIX, 0, -1), -EINVAL);
    ck_assert_int_eq(ddprun_rdzv_publish_failure(c, PREFIX, 0, ""), -EINVAL);
    ck_assert_int_eq(ddprun_rdzv_publish_failure(c, PREFIX, 0, NULL), -EINVAL);
    ck_assert_int_eq(ddprun_rdzv_failure_key(NULL, 0, err, sizeof err), -EINVAL);
    /* The single-node dynamic rendezvous closes at once (min = max = 1). */
    ck_assert_int_eq(
        ddprun_rdzv_dynamic(c, PREFIX, 0, 1, 1, "solo:1", 4, 1, 60, &a, err, sizeof err), 0);
    ck_assert_int_eq(a.node_rank, 0);
    ck_assert_int_eq(a.nnodes, 1);
    ck_assert_int_eq(a.world_size, 4);
    rdzv_client_close(c);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* The rendezvous-backend table (backend.h)                                                    */
/* ------------------------------------------------------------------------------------------ */

/* Every --rdzv-backend value names a row, each row has every operation but the optional ones:
 * num_waiting for the elastic rows, the moving store's three for etcd's. */
START_TEST(test_backend_table)
{
    const ddprun_backend_ops *st = ddprun_backend_find("static");
    const ddprun_backend_ops *cd = ddprun_backend_find("c10d");
    const ddprun_backend_ops *et = ddprun_backend_find("etcd");
    ck_assert_ptr_nonnull(st);
    ck_assert_ptr_nonnull(cd);
    ck_assert_str_eq(st->name, "static");
    ck_assert_str_eq(cd->name, "c10d");
#ifdef DDPRUN_HAVE_ETCD
    ck_assert_ptr_nonnull(et);
    ck_assert_ptr_eq(ddprun_backend_find(ddprun_backend_name(DDPRUN_BACKEND_ETCD)), et);
    ck_assert(et->num_waiting && et->local_address && et->publish_store && et->find_store);
    ck_assert(!et->store_dies_with_node);
#else
    ck_assert_ptr_null(et); /* built without libcurl */
#endif
    ck_assert_ptr_null(ddprun_backend_find("etcd-v2")); /* an alias options.c resolves */
    ck_assert_ptr_null(ddprun_backend_find(""));
    ck_assert_ptr_null(ddprun_backend_find(NULL));
    ck_assert_ptr_eq(ddprun_backend_find(ddprun_backend_name(DDPRUN_BACKEND_STATIC)), st);
    ck_assert_ptr_eq(ddprun_backend_find(ddprun_backend_name(DDPRUN_BACKEND_C10D)), cd);
    ck_assert_ptr_null(ddprun_backend_name((ddprun_backend)99));
    const ddprun_backend_ops *rows[] = {st, cd, et};
    for (int i = 0; i < 3 && rows[i]; i++) {
        const ddprun_backend_ops *b = rows[i];
        ck_assert(b->plan_store && b->connect && b->close && b->join && b->clear_worker_keys &&
                  b->publish_failure && b->wait_failure && b->exit_barrier && b->exit_done &&
                  b->publish_conn && b->conn_owner && b->heartbeat && b->watch_open &&
                  b->dead_nodes && b->watch_close);
        if (b != et)
            ck_assert(!b->local_address && !b->publish_store && !b->find_store);
    }
    ck_assert_ptr_null(st->num_waiting); /* static jobs never grow */
    ck_assert_ptr_nonnull(cd->num_waiting);
}
END_TEST

/* Where each row says the workers' store is, and whether this agent must serve it. */
START_TEST(test_backend_plan_store)
{
    ddprun_config cfg = {0};
    ddprun_store_plan plan;
    cfg.master_addr = "10.0.0.1";
    cfg.master_port = 29500;
    cfg.rdzv_host = "127.0.0.1";
    cfg.rdzv_port = 4321;
    ddprun_backend_find("static")->plan_store(&cfg, &plan);
    ck_assert_str_eq(plan.host, "10.0.0.1");
    ck_assert_int_eq(plan.port, 29500);
    ck_assert(plan.serve && plan.must_serve); /* node 0 */
    cfg.node_rank = 1;
    ddprun_backend_find("static")->plan_store(&cfg, &plan);
    ck_assert(!plan.serve);

    const ddprun_backend_ops *cd = ddprun_backend_find("c10d");
    cd->plan_store(&cfg, &plan); /* is_host not given: an address of this machine serves */
    ck_assert_str_eq(plan.host, "127.0.0.1");
    ck_assert_int_eq(plan.port, 4321);
    ck_assert(plan.serve && !plan.must_serve);
    cfg.is_host_given = 1;
    cfg.is_host = false;
    cd->plan_store(&cfg, &plan);
    ck_assert(!plan.serve && plan.must_serve);
    cfg.is_host = true;
    cd->plan_store(&cfg, &plan);
    ck_assert(plan.serve && plan.must_serve);
}
END_TEST

/* Each row's operations through the fixture's store, as one node of a one-node job uses them. */
START_TEST(test_backend_ops_through_store)
{
    const char *names[] = {"static", "c10d"};
    for (int i = 0; i < 2; i++) {
        const ddprun_backend_ops *b = ddprun_backend_find(names[i]);
        char prefix[64];
        snprintf(prefix, sizeof prefix, PREFIX "/%s", names[i]);
        ddprun_config cfg = {0};
        cfg.nnodes_min = cfg.nnodes_max = 1;
        cfg.nproc_per_node = 3;
        cfg.join_timeout_s = 5;
        cfg.last_call_timeout_s = 0;
        rdzv_client_options o;
        rdzv_client_options_init(&o);
        o.timeout_ms = 10000;
        char err[512] = "x";
        ddprun_rdzv_conn *c = NULL;
        ck_assert_int_eq(b->connect(&cfg, "127.0.0.1", port, &o, &c, err, sizeof err), 0);
        int round = 0;
        ddprun_assignment a;
        ck_assert_int_eq(b->join(c, prefix, &cfg, "host:1", &round, &a, err, sizeof err), 0);
        ck_assert_int_eq(round, 0);
        ck_assert_int_eq(a.nnodes, 1);
        ck_assert_int_eq(a.node_rank, 0);
        ck_assert_int_eq(a.world_size, 3);

        ddprun_rdzv_watch *w = NULL;
        ck_assert_int_eq(b->watch_open(prefix, 0, 1, -1, 60.0, &w), 0);
        ck_assert_int_eq(b->heartbeat(c, prefix, 0, 0, NULL, 0), 0);
        ck_assert_int_eq(b->dead_nodes(c, w, NULL, 0), 0);
        b->watch_close(w);
        /* A node rank watches its ring peers: none in a one-node round. */
        ck_assert_int_eq(b->watch_open(prefix, 0, 1, 0, 60.0, &w), 0);
        ck_assert_int_eq(b->dead_nodes(c, w, NULL, 0), 0);
        b->watch_close(w);
        ck_assert_ptr_nonnull(b->mark_host);
        ck_assert_int_eq(b->mark_host(c, prefix), 0);
        ck_assert_int_eq(b->publish_conn(c, prefix, 0, 0), 0);
        ck_assert_int_eq(b->exit_done(c, prefix, 0), 0);

        char *json = NULL;
        ck_assert_int_eq(b->wait_failure(c, prefix, 0, 0, &json), -ETIMEDOUT);
        ck_assert_int_eq(b->publish_failure(c, prefix, 0, "{\"x\":1}"), 1);
        ck_assert_int_eq(b->publish_failure(c, prefix, 0, "{\"x\":2}"), 0);
        ck_assert_int_eq(b->wait_failure(c, prefix, 0, 1000, &json), 0);
        ck_assert_str_eq(json, "{\"x\":1}");
        rdzv_free(json);
        if (b->num_waiting) {
            int64_t waiting = -1;
            ck_assert_int_eq(b->num_waiting(c, prefix, 0, &waiting), 0);
            ck_assert_int_eq(waiting, 0);
        }
        b->close(c);
    }
    /* Nothing listens on port 1: the connection fails with a negative errno and a reason. */
    rdzv_client_options o;
    rdzv_client_options_init(&o);
    o.connect_timeout_ms = 200;
    ddprun_config cfg = {0};
    ddprun_rdzv_conn *c = NULL;
    char err[512] = "";
    ck_assert_int_lt(
        ddprun_backend_find("static")->connect(&cfg, "127.0.0.1", 1, &o, &c, err, sizeof err), 0);
    ck_assert_ptr_null(c);
    ck_assert_msg(err[0], "no reason given");
    ddprun_backend_find("static")->close(NULL);
}
END_TEST

/*
 * The store's traffic (requests, bytes in + out) over one round of 64 nodes, read from its
 * STATUS before and after: one node computes the layout, the others read their own key, so the
 * root's load per node stays flat rather than growing with the node count (an all-gather of 64
 * nodes' records costs each node several KiB).
 */
static void traffic(rdzv_client *c, int64_t *requests, int64_t *bytes)
{
    char *js = NULL;
    ck_assert_int_eq(rdzv_status(c, &js), 0);
    json_error_t jerr;
    json_t *o = json_loads(js, 0, &jerr);
    ck_assert_ptr_nonnull(o);
    json_t *t = json_object_get(o, "traffic");
    *requests = json_integer_value(json_object_get(t, "requests"));
    *bytes = json_integer_value(json_object_get(t, "bytes_in")) +
             json_integer_value(json_object_get(t, "bytes_out"));
    json_decref(o);
    rdzv_free(js);
}

static void check_linear_round(node_fn fn, void *arg, int n)
{
    rdzv_client *c = client();
    int64_t req0 = 0, bytes0 = 0, req1 = 0, bytes1 = 0;
    traffic(c, &req0, &bytes0);
    node_result res[MAXN];
    run_nodes(n, fn, arg, res);
    traffic(c, &req1, &bytes1);
    for (int i = 0; i < n; i++)
        ck_assert_msg(res[i].rc == 0, "node %d: %d %s", i, res[i].rc, res[i].err);
    check_consistent(res, n, n, 0);
    /* Per node: a handful of requests and well under 1 KiB, whatever n is. */
    ck_assert_msg(req1 - req0 <= 16 * n, "%" PRId64 " requests for %d nodes", req1 - req0, n);
    ck_assert_msg(bytes1 - bytes0 <= 1024 * n, "%" PRId64 " bytes for %d nodes", bytes1 - bytes0,
                  n);
    rdzv_client_close(c);
}

START_TEST(test_static_root_load_linear)
{
    int ranks[MAXN], nproc[MAXN];
    for (int i = 0; i < MAXN; i++) {
        ranks[i] = MAXN - 1 - i;
        nproc[i] = 1 + i % 3;
    }
    static_args s = {0, MAXN, ranks, nproc, 10.0};
    check_linear_round(static_node, &s, MAXN);
}
END_TEST

START_TEST(test_dynamic_root_load_linear)
{
    dyn_args d = {0, MAXN, MAXN, 10.0, 60.0, 1};
    check_linear_round(dyn_node, &d, MAXN);
}
END_TEST

/* Host names: a node's published name is found by its rank, without waiting; a rank that
 * published none is -ENOENT. */
START_TEST(test_host_records)
{
    rdzv_client *n1 = client(), *other = client();
    char buf[64] = "unchanged";
    ck_assert_int_eq(ddprun_rdzv_node_host(other, PREFIX, 6, 1, buf, sizeof buf), -ENOENT);
    ck_assert_int_eq(ddprun_rdzv_publish_host(n1, PREFIX, 6, 1, "node3"), 0);
    ck_assert_int_eq(rdzv_ping(n1), 0);
    ck_assert_int_eq(ddprun_rdzv_node_host(other, PREFIX, 6, 1, buf, sizeof buf), 0);
    ck_assert_str_eq(buf, "node3");
    ck_assert_int_eq(ddprun_rdzv_node_host(other, PREFIX, 7, 1, buf, sizeof buf), -ENOENT);
    char small[4];
    ck_assert_int_eq(ddprun_rdzv_node_host(other, PREFIX, 6, 1, small, sizeof small), 0);
    ck_assert_str_eq(small, "nod");
    ck_assert_int_eq(ddprun_rdzv_publish_host(n1, PREFIX, 6, 1, ""), -EINVAL);
    ck_assert_int_eq(ddprun_rdzv_publish_host(n1, PREFIX, 6, -1, "x"), -EINVAL);
    ck_assert_int_eq(ddprun_rdzv_node_host(other, PREFIX, 6, 1, buf, 0), -EINVAL);
    rdzv_client_close(n1);
    rdzv_client_close(other);
}
END_TEST

/* The run's auth_failed record: absent (a look, a timed wait), then the count and peer as
 * published, a later count replacing it; bad records refused. */
START_TEST(test_auth_failure_record)
{
    rdzv_client *host = client(), *node = client();
    int64_t count = 0;
    char peer[64];
    ck_assert_int_eq(ddprun_rdzv_auth_failure(node, PREFIX, 0, &count, peer, sizeof peer),
                     -ETIMEDOUT);
    ck_assert_int_eq(ddprun_rdzv_auth_failure(node, PREFIX, 50, &count, peer, sizeof peer),
                     -ETIMEDOUT);
    ck_assert_int_eq(ddprun_rdzv_publish_auth_failure(host, PREFIX, 1, "10.0.0.3:41234"), 0);
    ck_assert_int_eq(ddprun_rdzv_auth_failure(node, PREFIX, 5000, &count, peer, sizeof peer), 0);
    ck_assert_int_eq(count, 1);
    ck_assert_str_eq(peer, "10.0.0.3:41234");
    ck_assert_int_eq(ddprun_rdzv_publish_auth_failure(host, PREFIX, 3, "[fd00::3]:5"), 0);
    ck_assert_int_eq(rdzv_ping(host), 0);
    ck_assert_int_eq(ddprun_rdzv_auth_failure(node, PREFIX, 0, &count, peer, sizeof peer), 0);
    ck_assert_int_eq(count, 3);
    ck_assert_str_eq(peer, "[fd00::3]:5");
    ck_assert_int_eq(ddprun_rdzv_publish_auth_failure(host, PREFIX, 0, "a:1"), -EINVAL);
    ck_assert_int_eq(ddprun_rdzv_publish_auth_failure(host, PREFIX, 1, "a b"), -EINVAL);
    ck_assert_int_eq(ddprun_rdzv_publish_auth_failure(host, PREFIX, 1, ""), -EINVAL);
    ck_assert_int_eq(rdzv_set(host, PREFIX "/auth_failed", "x y", 3), 0);
    ck_assert_int_eq(ddprun_rdzv_auth_failure(node, PREFIX, 0, &count, peer, sizeof peer), -EPROTO);
    ck_assert_int_eq(count, 3); /* unchanged */
    rdzv_client_close(host);
    rdzv_client_close(node);
}
END_TEST

/* The optional members travel only when they say something, and come back as they went. */
START_TEST(test_failure_record_details_json)
{
    ddprun_failure f, g;
    ddprun_failure_init(&f, "node3", 7, 1, -11, 99, "Segmentation fault");
    ck_assert_int_eq(f.node_rank, -1);
    f.node_rank = 2;
    f.core_dumped = true;
    snprintf(f.error_file, sizeof f.error_file, "/tmp/run/attempt_0/1/error.json");
    snprintf(f.logs, sizeof f.logs, "/tmp/run/attempt_0/1/{stdout,stderr}.log");
    snprintf(f.stderr_tail, sizeof f.stderr_tail, "line \"one\"\n\ttwo");
    char *js = ddprun_failure_to_json(&f);
    ck_assert_ptr_nonnull(js);
    json_t *o = json_loads(js, 0, NULL);
    ck_assert_int_eq(json_object_size(o), 13);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "node_rank")), 2);
    json_decref(o);
    ck_assert_int_eq(ddprun_failure_from_json(js, &g), 0);
    check_same_failure(&f, &g);
    ck_assert_int_eq(g.node_rank, 2);
    ck_assert(g.core_dumped);
    ck_assert_str_eq(g.error_file, f.error_file);
    ck_assert_str_eq(g.logs, f.logs);
    ck_assert_str_eq(g.stderr_tail, f.stderr_tail);
    free(js);
    /* Bytes that are not UTF-8 (binary stderr, a character cut by a field's end) become '?';
     * valid multibyte characters stay. */
    snprintf(f.stderr_tail, sizeof f.stderr_tail, "ok \xc3\xa9 \xff bad \xe2\x82");
    snprintf(f.message, sizeof f.message, "\xed\xa0\x80 surrogate, \xc0\xaf overlong");
    js = ddprun_failure_to_json(&f);
    ck_assert_ptr_nonnull(js);
    ck_assert_int_eq(ddprun_failure_from_json(js, &g), 0);
    ck_assert_str_eq(g.stderr_tail, "ok \xc3\xa9 ? bad ??");
    ck_assert_str_eq(g.message, "??? surrogate, ?? overlong");
    free(js);
    /* Absent: unknown node rank, no core, empty texts; of the wrong type: refused. */
    ck_assert_int_eq(ddprun_failure_from_json("{\"time\": 5, \"node\": \"n\", \"rank\": 0, "
                                              "\"local_rank\": 0, \"exit_code\": 2, \"pid\": 7}",
                                              &g),
                     0);
    ck_assert_int_eq(g.node_rank, -1);
    ck_assert(!g.core_dumped);
    ck_assert_str_eq(g.error_file, "");
    ck_assert_str_eq(g.stderr_tail, "");
    ck_assert_int_eq(ddprun_failure_from_json("{\"time\": 5, \"node\": \"n\", \"rank\": 0, "
                                              "\"local_rank\": 0, \"exit_code\": 2, \"pid\": 7, "
                                              "\"stderr_tail\": 3}",
                                              &g),
                     -EPROTO);
}
END_TEST

/* The words for an exit and for a node. */
START_TEST(test_failure_words)
{
    char b[64];
    ddprun_describe_exit(3, true, b, sizeof b);
    ck_assert_str_eq(b, "exit 3");
    ddprun_describe_exit(-9, false, b, sizeof b);
    ck_assert_str_eq(b, "signal 9 (KILL)");
    ddprun_describe_exit(-11, true, b, sizeof b);
    ck_assert_str_eq(b, "signal 11 (SEGV), core dumped");
    ddprun_node_name(2, "node3", b, sizeof b);
    ck_assert_str_eq(b, "node 2 (node3)");
    ddprun_node_name(2, "?", b, sizeof b);
    ck_assert_str_eq(b, "node 2");
    ddprun_node_name(2, NULL, b, sizeof b);
    ck_assert_str_eq(b, "node 2");
    ddprun_node_name(-1, "node3", b, sizeof b);
    ck_assert_str_eq(b, "node3");
    ddprun_node_name(-1, "", b, sizeof b);
    ck_assert_str_eq(b, "a node");
}
END_TEST

/* The stderr tail: the last lines, bounded; a line cut by the ring dropped; redraws and escape
 * sequences cleaned; pieces of any size. */
START_TEST(test_stderr_tail)
{
    ddprun_tail t;
    char out[DDPRUN_TAIL_BYTES];
    memset(&t, 0, sizeof t);
    ck_assert_uint_eq(ddprun_tail_text(&t, 10, out, sizeof out), 0);
    ck_assert_str_eq(out, "");
    ddprun_tail_add(&t, "one\ntwo\n", 8);
    ck_assert_uint_eq(ddprun_tail_text(&t, 10, out, sizeof out), 7);
    ck_assert_str_eq(out, "one\ntwo");
    ddprun_tail_text(&t, 1, out, sizeof out);
    ck_assert_str_eq(out, "two");
    /* An unfinished last line counts; blank trailing lines do not. */
    ddprun_tail_add(&t, "thr", 3);
    ddprun_tail_add(&t, "ee\n\n  \n", 7);
    ddprun_tail_text(&t, 2, out, sizeof out);
    ck_assert_str_eq(out, "two\nthree");
    /* A bar redrawn with '\r' shows its last state; colours and other control bytes go. */
    memset(&t, 0, sizeof t);
    const char *bar = "10%\r50%\r100%\r\n\x1b[31mred\x1b[0m\x07 text\t!\n";
    ddprun_tail_add(&t, bar, strlen(bar));
    ddprun_tail_text(&t, 10, out, sizeof out);
    ck_assert_str_eq(out, "100%\nred text\t!");
    /* 20 lines, 10 kept; 5000 bytes in pieces of 7: the ring keeps the end, the cut line goes. */
    memset(&t, 0, sizeof t);
    char line[32];
    for (int i = 1; i <= 20; i++) {
        int l = snprintf(line, sizeof line, "line %d\n", i);
        ddprun_tail_add(&t, line, (size_t)l);
    }
    ddprun_tail_text(&t, DDPRUN_TAIL_LINES, out, sizeof out);
    ck_assert_str_eq(out, "line 11\nline 12\nline 13\nline 14\nline 15\nline 16\nline 17\nline "
                          "18\nline 19\nline 20");
    memset(&t, 0, sizeof t);
    char big[5000];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = i % 100 == 99 ? '\n' : (char)('a' + i % 26);
    for (size_t i = 0; i < sizeof big; i += 7)
        ddprun_tail_add(&t, big + i, sizeof big - i < 7 ? sizeof big - i : 7);
    size_t n = ddprun_tail_text(&t, 1000, out, sizeof out);
    ck_assert_uint_le(n, DDPRUN_TAIL_BYTES - 1);
    ck_assert_uint_eq(n % 100, 99); /* whole lines of 99 bytes and their separators */
    ck_assert_int_eq(memcmp(out, big + 5000 - 100 * ((n + 1) / 100), 99), 0);
    /* One add larger than the ring: its end stays. */
    memset(&t, 0, sizeof t);
    ddprun_tail_add(&t, big, sizeof big);
    ddprun_tail_text(&t, 1, out, sizeof out);
    ck_assert_int_eq(memcmp(out, big + 4900, 99), 0);
    ck_assert_uint_eq(strlen(out), 99);
    /* A small output buffer cuts the text. */
    ck_assert_uint_eq(ddprun_tail_text(&t, 1, out, 5), 4);
    ddprun_tail_add(NULL, "x", 1);
    ck_assert_uint_eq(ddprun_tail_text(NULL, 1, out, sizeof out), 0);
}
END_TEST

static Suite *noderdzv_suite(void)
{
    Suite *s = suite_create("noderdzv");
    TCase *tc = check_tcase(
        s, "noderdzv", 15, test_static_prefix_sums, test_static_single_node,
        test_static_timeout_names_missing, test_static_timeout_many_missing, test_static_conflicts,
        test_dynamic_closes_at_max, test_dynamic_closes_after_last_call, test_dynamic_late_node,
        test_dynamic_join_timeout_aborts, test_rounds_do_not_mix,
        test_heartbeat_detects_silent_node, test_heartbeat_peer_sets, test_heartbeat_ring_detects,
        test_failure_first_writer_wins, test_failure_record_through_store, test_conn_records,
        test_host_records, test_auth_failure_record, test_exit_barrier_all_arrive,
        test_exit_barrier_failure_ends_wait, test_exit_barrier_timeout, test_clear_worker_keys,
        test_clear_worker_keys_without_host, test_invalid_arguments, test_backend_ops_through_store,
        test_static_root_load_linear, test_dynamic_root_load_linear,
        test_static_computing_node_stops, test_static_malformed_nproc);
    tcase_add_checked_fixture(tc, server_setup, server_teardown);

    /* Pure functions: no store. */
    check_tcase(s, "records", 5, test_run_prefix, test_failure_record_init,
                test_failure_record_json, test_failure_record_exit_status,
                test_failure_record_details_json, test_failure_words, test_stderr_tail,
                test_failure_summary_order, test_backend_table, test_backend_plan_store);
    return s;
}

int main(void)
{
    return check_run(noderdzv_suite());
}
