/*
 * Tests of libcollective's shared-memory segments and counter waits (libcollective/shm.c):
 * create/open/attach and the unlink after the last attach, the sweep of segments left by a
 * crashed creator, posts and waits across real processes (ping-pong, barriers), and each way a
 * wait fails: timeout naming the late rank, a watched rank killed, a remote abort, a local
 * abort.
 *
 * Every case runs in its own forked process (Check's fork mode) under a timeout; this process
 * is local rank 0 (the leader) and forks the other ranks, which report through their exit
 * status. Nothing waits on a sleep for synchronisation: ranks meet through counters in the
 * segment, pipes, and the header's sleeper count where one side must be asleep before the
 * other acts.
 */
#include <check.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll_internal.h"
#include "monoclock.h"
#include "check_main.h"

/* ------------------------------------------------------------------------------------------ */
/* Fixtures and helpers                                                                        */
/* ------------------------------------------------------------------------------------------ */

/* What the tests keep after the header: a bootstrap exchange of pids, and scratch slots. */
struct extra {
    coll__counter ready[COLL__MAX_LOCAL];
    _Atomic int pids[COLL__MAX_LOCAL];
    _Atomic uint64_t slots[COLL__MAX_LOCAL];
};

#define NB (sizeof(coll__shm_hdr) + sizeof(struct extra))
#define GRANK(i) (100 + (i)) /* global ranks, distinct from local ones */

static _Atomic int local_abort;

static coll__shm_hdr *hdr(coll__shm *s)
{
    return (coll__shm_hdr *)s->base;
}

static struct extra *extra(coll__shm *s)
{
    return (struct extra *)((char *)s->base + sizeof(coll__shm_hdr));
}

static bool shm_exists(const char *name)
{
    char path[128];
    snprintf(path, sizeof path, "/dev/shm%s", name);
    return access(path, F_OK) == 0;
}

/*
 * A rank's part after create/open: fills the fields the caller owns, attaches, exchanges pids
 * through the segment, and opens the pidfds.
 */
static int join(coll__shm *s, int nlocal, int rank)
{
    s->nlocal = nlocal;
    s->local_rank = rank;
    s->local_abort = &local_abort;
    for (int i = 0; i < nlocal; i++)
        s->granks[i] = GRANK(i);
    int64_t deadline = mono_deadline_ns(10000);
    int rc = coll__shm_attach_done(s, deadline);
    if (rc != 0)
        return rc;
    struct extra *x = extra(s);
    atomic_store(&x->pids[rank], (int)getpid());
    coll__shm_post(s, &x->ready[rank].v, 1);
    for (int i = 0; i < nlocal; i++) {
        rc = coll__shm_wait(s, &x->ready[i].v, 1, -1, deadline, NULL);
        if (rc != 0)
            return rc;
        s->pids[i] = atomic_load(&x->pids[i]);
    }
    return coll__shm_watch(s);
}

typedef int (*rank_fn)(coll__shm *s, void *arg);

/* Forks local rank `rank`: it opens `name`, joins, runs fn and exits with fn's result. */
static pid_t spawn(const char *name, int nlocal, int rank, rank_fn fn, void *arg)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid > 0)
        return pid;
    coll__shm s = {0};
    int rc = coll__shm_open(&s, name, NB);
    if (rc != 0)
        _exit(90);
    if (join(&s, nlocal, rank) != 0)
        _exit(91);
    rc = fn(&s, arg);
    coll__shm_close(&s);
    _exit(rc);
}

/* This process becomes local rank 0 of nlocal; kids[1..] are the others running fn. */
static void start_group(coll__shm *s, int nlocal, pid_t *kids, rank_fn fn, void *arg)
{
    memset(s, 0, sizeof *s);
    ck_assert_int_eq(coll__shm_create(s, "test_shm", NB), 0);
    for (int r = 1; r < nlocal; r++)
        kids[r] = spawn(s->name, nlocal, r, fn, arg);
    ck_assert_int_eq(join(s, nlocal, 0), 0);
}

static int reap(pid_t pid)
{
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    return st;
}

static void reap_ok(pid_t pid)
{
    int st = reap(pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank exited with status %#x", st);
}

/* Blocks until every write end of the pipe is closed: 0 then, else -1. */
static int await_eof(int fd)
{
    char c;
    ssize_t n;
    while ((n = read(fd, &c, 1)) < 0 && errno == EINTR)
        ;
    if (n != 0)
        fprintf(stderr, "await_eof: %zd %s\n", n, n < 0 ? strerror(errno) : "");
    return n == 0 ? 0 : -1;
}

/* Spins (yielding) until someone sleeps on the segment's futex. */
static void await_sleeper(coll__shm *s)
{
    while (atomic_load(&hdr(s)->nwaiters) == 0)
        sched_yield();
}

/* ------------------------------------------------------------------------------------------ */
/* Segments                                                                                    */
/* ------------------------------------------------------------------------------------------ */

static int child_post_rank(coll__shm *s, void *arg)
{
    (void)arg;
    coll__shm_post(s, &hdr(s)->arrive[s->local_rank].v, (uint64_t)s->local_rank + 10);
    return 0;
}

START_TEST(test_create_open_attach)
{
    coll__shm s = {0};
    ck_assert_int_eq(coll__shm_create(&s, "a tag of some length, longer than the name", NB), 0);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "/coll.%u.%d.", (unsigned)geteuid(), (int)getpid());
    ck_assert_msg(strncmp(s.name, prefix, strlen(prefix)) == 0, "name %s", s.name);
    ck_assert_uint_eq(strlen(s.name), strlen(prefix) + 16);
    ck_assert(shm_exists(s.name));
    ck_assert_uint_eq(s.nbytes, NB);

    /* Zeroed except for the culprit. */
    coll__shm_hdr *h = hdr(&s);
    ck_assert_uint_eq(atomic_load(&h->wake), 0);
    ck_assert_uint_eq(atomic_load(&h->attached), 0);
    ck_assert_uint_eq(atomic_load(&h->abort), 0);
    ck_assert_int_eq(atomic_load(&h->culprit), -1);
    for (int i = 0; i < COLL__MAX_LOCAL; i++)
        ck_assert_uint_eq(atomic_load(&h->arrive[i].v), 0);

    char name[64];
    strcpy(name, s.name);
    pid_t kids[3];
    for (int r = 1; r < 3; r++)
        kids[r] = spawn(name, 3, r, child_post_rank, NULL);
    ck_assert_int_eq(join(&s, 3, 0), 0);

    /* Every rank attached: the name is gone, the memory is still shared. */
    ck_assert(!shm_exists(name));
    ck_assert_uint_eq(s.name[0], 0);
    ck_assert_uint_eq(atomic_load(&h->attached), 3);
    int culprit = -1;
    ck_assert_int_eq(coll__shm_wait(&s, &h->arrive[1].v, 11, 1, mono_deadline_ns(10000), &culprit),
                     0);
    ck_assert_int_eq(coll__shm_wait(&s, &h->arrive[2].v, 12, 2, mono_deadline_ns(10000), &culprit),
                     0);
    for (int r = 1; r < 3; r++)
        reap_ok(kids[r]);

    coll__shm o = {0};
    ck_assert_int_eq(coll__shm_open(&o, name, NB), -ENOENT);
    coll__shm_close(&o);
    coll__shm_close(&s);
    ck_assert_ptr_null(s.base);
}
END_TEST

START_TEST(test_bad_arguments)
{
    coll__shm s = {0};
    ck_assert_int_eq(coll__shm_create(&s, "t", sizeof(coll__shm_hdr) - 1), -EINVAL);
    ck_assert_ptr_null(s.base);
    ck_assert_uint_eq(s.name[0], 0);
    ck_assert_int_eq(coll__shm_open(&s, "no-slash", NB), -EINVAL);
    ck_assert_int_eq(coll__shm_open(&s, "/a/b", NB), -EINVAL);
    ck_assert_int_eq(coll__shm_open(&s, NULL, NB), -EINVAL);
    ck_assert_int_eq(coll__shm_attach_done(&s, mono_deadline_ns(0)), -EINVAL);
    ck_assert_int_eq(coll__shm_watch(&s), -EINVAL);

    /* A segment smaller than the reader expects is a protocol mismatch. */
    ck_assert_int_eq(coll__shm_create(&s, NULL, NB), 0);
    coll__shm o = {0};
    ck_assert_int_eq(coll__shm_open(&o, s.name, NB + 4096), -EPROTO);
    ck_assert_ptr_null(o.base);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int rc = coll__shm_open(&o, s.name, NB);
        coll__shm_close(&o);
        _exit(rc == 0 ? 0 : 1);
    }
    reap_ok(pid);
    ck_assert(shm_exists(s.name)); /* an opener does not unlink */

    /* The creator's close unlinks a name that is still linked. */
    char name[64];
    strcpy(name, s.name);
    coll__shm_close(&s);
    ck_assert(!shm_exists(name));
    coll__shm_close(&s); /* twice */
}
END_TEST

START_TEST(test_close_zeroed)
{
    coll__shm s;
    memset(&s, 0, sizeof s);
    coll__shm_close(&s);
    coll__shm_close(&s);
    coll__shm_close(NULL);
    coll__shm_abort(&s, 3); /* no segment: nothing to do */

    /* Caller fields filled, no segment: close must not touch descriptors 0..n. */
    s.nlocal = 4;
    coll__shm_close(&s);
    ck_assert_int_ne(fcntl(0, F_GETFD), -1);
}
END_TEST

START_TEST(test_attach_timeout)
{
    coll__shm s = {0};
    ck_assert_int_eq(coll__shm_create(&s, "t", NB), 0);
    char name[64];
    strcpy(name, s.name);
    s.nlocal = 2;
    s.local_rank = 0;
    double t0 = mono_now_s();
    ck_assert_int_eq(coll__shm_attach_done(&s, mono_deadline_ns(200)), -ETIMEDOUT);
    double dt = mono_now_s() - t0;
    ck_assert_msg(dt > 0.19 && dt < 2.0, "took %.3f s", dt);
    ck_assert(!shm_exists(name)); /* unlinked on timeout too */
    coll__shm_close(&s);
}
END_TEST

/* A creator that dies before anyone attached (here: exits without cleaning up). */
START_TEST(test_stale_sweep)
{
    int p[2], hold[2];
    ck_assert_int_eq(pipe(p), 0);
    ck_assert_int_eq(pipe(hold), 0);
    char dead[64] = {0}, live[64] = {0};

    /* A creator still alive, blocked in a pipe: its segment must survive sweeps. */
    pid_t b = fork();
    ck_assert_int_ge(b, 0);
    if (b == 0) {
        close(hold[1]);
        coll__shm s = {0};
        if (coll__shm_create(&s, "alive", NB) != 0)
            _exit(1);
        if (write(p[1], s.name, sizeof s.name) != (ssize_t)sizeof s.name)
            _exit(2);
        if (await_eof(hold[0]) != 0)
            _exit(3);
        coll__shm_close(&s);
        _exit(0);
    }
    close(hold[0]);
    ck_assert_int_eq(read(p[0], live, sizeof live), sizeof live);
    pid_t a = fork();
    ck_assert_int_ge(a, 0);
    if (a == 0) {
        coll__shm s = {0};
        if (coll__shm_create(&s, "crashed", NB) != 0)
            _exit(1);
        _exit(write(p[1], s.name, sizeof s.name) == (ssize_t)sizeof s.name ? 0 : 2);
    }
    ck_assert_int_eq(read(p[0], dead, sizeof dead), sizeof dead);
    reap_ok(a);

    ck_assert(shm_exists(dead));
    ck_assert(shm_exists(live));

    coll__shm s = {0};
    ck_assert_int_eq(coll__shm_create(&s, "new", NB), 0);
    ck_assert(!shm_exists(dead));
    ck_assert(shm_exists(live));
    ck_assert(shm_exists(s.name)); /* our own, even though we sweep again: */
    coll__shm t = {0};
    ck_assert_int_eq(coll__shm_create(&t, "new", NB), 0);
    ck_assert(shm_exists(s.name));
    ck_assert_str_ne(s.name, t.name);

    close(hold[1]); /* b closes its segment, which unlinks it */
    reap_ok(b);
    ck_assert(!shm_exists(live));
    coll__shm_close(&s);
    coll__shm_close(&t);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Posting and waiting                                                                         */
/* ------------------------------------------------------------------------------------------ */

#define ROUNDS 10000

static int child_pong(coll__shm *s, void *arg)
{
    int spin = *(int *)arg;
    if (spin >= 0)
        s->spin = spin;
    coll__shm_hdr *h = hdr(s);
    int64_t deadline = mono_deadline_ns(60000);
    for (uint64_t i = 1; i <= ROUNDS; i++) {
        if (coll__shm_wait(s, &h->arrive[0].v, i, 0, deadline, NULL) != 0)
            return 1;
        if (atomic_load(&h->arrive[0].v) != i)
            return 2;
        coll__shm_post(s, &h->arrive[1].v, i);
    }
    return 0;
}

/*
 * 10000 round trips with the spin watch chose (_i == 0) and with no spinning at all (_i == 1),
 * where every hop goes through the futex: a lost wake-up would cost a 10 ms slice, so the
 * bound on the time catches those. (The spinning variant has no bound: on a host loaded by
 * others, a spinner may hold the CPU its partner needs for its whole spin.)
 */
START_TEST(test_pingpong)
{
    int spin = _i == 0 ? -1 : 0;
    coll__shm s;
    pid_t kids[2];
    start_group(&s, 2, kids, child_pong, &spin);
    if (spin >= 0)
        s.spin = spin;
    coll__shm_hdr *h = hdr(&s);
    int64_t deadline = mono_deadline_ns(60000);
    uint64_t i, seen = 0;
    int rc = 0, culprit = -1;
    double t0 = mono_now_s();
    for (i = 1; i <= ROUNDS; i++) { /* no ck_assert in the loop: each one writes to a pipe */
        coll__shm_post(&s, &h->arrive[0].v, i);
        rc = coll__shm_wait(&s, &h->arrive[1].v, i, 1, deadline, &culprit);
        seen = atomic_load(&h->arrive[1].v);
        if (rc != 0 || seen != i)
            break;
    }
    double dt = mono_now_s() - t0;
    ck_assert_msg(rc == 0 && seen == i - 1, "round %" PRIu64 ": rc %d, counter %" PRIu64, i, rc,
                  seen);
    reap_ok(kids[1]);
    ck_assert_uint_eq(atomic_load(&h->arrive[0].v), ROUNDS);
    ck_assert_uint_eq(atomic_load(&h->arrive[1].v), ROUNDS);
    fprintf(stderr, "pingpong spin=%d: %d round trips in %.3f s (%.2f us one way)\n", s.spin,
            ROUNDS, dt, dt / ROUNDS / 2 * 1e6);
    if (s.spin == 0)
        ck_assert_msg(dt < 20.0, "%d round trips took %.3f s", ROUNDS, dt);
    coll__shm_close(&s);
}
END_TEST

#define BARRIERS 300

/* A barrier per round: each rank writes its slot, arrives, waits for all, reads all slots. */
static int barrier_rounds(coll__shm *s)
{
    coll__shm_hdr *h = hdr(s);
    struct extra *x = extra(s);
    int64_t deadline = mono_deadline_ns(60000);
    for (uint64_t k = 1; k <= BARRIERS; k++) {
        atomic_store_explicit(&x->slots[s->local_rank], k, memory_order_relaxed);
        coll__shm_post(s, &h->arrive[s->local_rank].v, k);
        int culprit = -1;
        if (coll__shm_wait_all(s, k, deadline, &culprit) != 0)
            return 1;
        for (int i = 0; i < s->nlocal; i++)
            if (atomic_load_explicit(&x->slots[i], memory_order_relaxed) < k)
                return 2;
    }
    return 0;
}

static int child_barrier(coll__shm *s, void *arg)
{
    (void)arg;
    return barrier_rounds(s);
}

START_TEST(test_wait_all)
{
    coll__shm s;
    pid_t kids[4];
    start_group(&s, 4, kids, child_barrier, NULL);
    ck_assert_int_eq(barrier_rounds(&s), 0);
    for (int r = 1; r < 4; r++)
        reap_ok(kids[r]);
    coll__shm_close(&s);
}
END_TEST

static int late_fd = -1; /* read end of the pipe that holds the late rank */

static int child_late(coll__shm *s, void *arg)
{
    (void)arg;
    if (s->local_rank == 1) {
        coll__shm_post(s, &hdr(s)->arrive[1].v, 1);
        return 0;
    }
    return await_eof(late_fd) == 0 ? 0 : 1; /* until the parent closes the pipe */
}

START_TEST(test_timeout_names_late_rank)
{
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    late_fd = p[0];
    coll__shm s = {0};
    ck_assert_int_eq(coll__shm_create(&s, "late", NB), 0);
    pid_t kids[3];
    for (int r = 1; r < 3; r++) {
        kids[r] = fork();
        ck_assert_int_ge(kids[r], 0);
        if (kids[r] == 0) {
            close(p[1]);
            coll__shm c = {0};
            if (coll__shm_open(&c, s.name, NB) != 0 || join(&c, 3, r) != 0)
                _exit(90);
            int rc = child_late(&c, NULL);
            coll__shm_close(&c);
            _exit(rc);
        }
    }
    ck_assert_int_eq(join(&s, 3, 0), 0);
    coll__shm_post(&s, &hdr(&s)->arrive[0].v, 1);

    int culprit = -1;
    double t0 = mono_now_s();
    ck_assert_int_eq(coll__shm_wait_all(&s, 1, mono_deadline_ns(300), &culprit), -ETIMEDOUT);
    double dt = mono_now_s() - t0;
    ck_assert_int_eq(culprit, GRANK(2));
    ck_assert_msg(dt > 0.29 && dt < 3.0, "timed out after %.3f s", dt);

    close(p[1]);
    reap_ok(kids[1]);
    reap_ok(kids[2]);
    coll__shm_close(&s);
}
END_TEST

static int child_block(coll__shm *s, void *arg)
{
    (void)s;
    return await_eof(*(int *)arg) == 0 ? 0 : 1;
}

struct killer {
    coll__shm *s;
    pid_t victim;
    bool reap;
    int status;
};

static void *killer_main(void *arg)
{
    struct killer *k = arg;
    await_sleeper(k->s);
    kill(k->victim, SIGKILL);
    if (k->reap)
        waitpid(k->victim, &k->status, 0);
    return NULL;
}

/*
 * A rank killed while rank 0 sleeps on it: noticed through its pidfd (_i == 0, the rank is a
 * zombie since nobody reaps it meanwhile) or, without a pidfd, through kill(pid, 0) once it is
 * reaped (_i == 1).
 */
START_TEST(test_killed_rank)
{
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    coll__shm s;
    pid_t kids[2];
    start_group(&s, 2, kids, child_block, &p[0]);
    bool reap_first = _i == 1;
    if (s.pidfds[1] < 0) /* no pidfd_open (old kernel, valgrind): only the fallback is left */
        reap_first = true;
    if (_i == 1) {
        close(s.pidfds[1]);
        s.pidfds[1] = -1;
    }
    struct killer k = {.s = &s, .victim = kids[1], .reap = reap_first};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, killer_main, &k), 0);

    int culprit = -1;
    double t0 = mono_now_s();
    int rc = coll__shm_wait(&s, &hdr(&s)->arrive[1].v, 1, 1, mono_deadline_ns(10000), &culprit);
    double dt = mono_now_s() - t0;
    ck_assert_int_eq(rc, COLL_EREMOTE);
    ck_assert_int_eq(culprit, GRANK(1));
    ck_assert_msg(dt < 1.0, "noticed after %.3f s", dt);
    pthread_join(th, NULL);
    int st = reap_first ? k.status : reap(kids[1]);
    ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    coll__shm_close(&s);
}
END_TEST

static int child_abort(coll__shm *s, void *arg)
{
    (void)arg;
    await_sleeper(s);
    coll__shm_abort(s, 7);
    coll__shm_abort(s, 9); /* the first culprit wins */
    return 0;
}

START_TEST(test_remote_abort)
{
    coll__shm s;
    pid_t kids[2];
    start_group(&s, 2, kids, child_abort, NULL);
    int culprit = -1;
    double t0 = mono_now_s();
    int rc = coll__shm_wait(&s, &hdr(&s)->arrive[1].v, 1, 1, mono_deadline_ns(10000), &culprit);
    double dt = mono_now_s() - t0;
    ck_assert_int_eq(rc, COLL_EREMOTE);
    ck_assert_int_eq(culprit, 7);
    ck_assert_msg(dt < 1.0, "woken after %.3f s", dt);
    reap_ok(kids[1]);

    /* Still aborted, still the same culprit, though the aborting rank has exited since. */
    culprit = -1;
    ck_assert_int_eq(coll__shm_wait_all(&s, 1, mono_deadline_ns(10000), &culprit), COLL_EREMOTE);
    ck_assert_int_eq(culprit, 7);
    ck_assert_int_eq(atomic_load(&hdr(&s)->culprit), 7);
    /* A counter already reached wins over the flag. */
    ck_assert_int_eq(coll__shm_wait(&s, &hdr(&s)->arrive[1].v, 0, 1, mono_deadline_ns(0), NULL),
                     0);
    coll__shm_close(&s);
}
END_TEST

static void *set_local_abort(void *arg)
{
    await_sleeper(arg);
    atomic_store(&local_abort, 1);
    return NULL;
}

START_TEST(test_local_abort)
{
    coll__shm s;
    start_group(&s, 1, NULL, NULL, NULL);
    _Atomic uint64_t *ctr = &hdr(&s)->arrive[0].v;
    coll__shm_post(&s, ctr, 5);

    /* Satisfied: returns at once and leaves culprit alone, abort flag or not. */
    int culprit = 1234;
    ck_assert_int_eq(coll__shm_wait(&s, ctr, 5, -1, mono_deadline_ns(0), &culprit), 0);
    ck_assert_int_eq(culprit, 1234);

    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, set_local_abort, &s), 0);
    double t0 = mono_now_s();
    ck_assert_int_eq(coll__shm_wait(&s, ctr, 6, -1, mono_deadline_ns(10000), &culprit),
                     -ECANCELED);
    double dt = mono_now_s() - t0;
    ck_assert_msg(dt < 1.0, "noticed after %.3f s", dt);
    pthread_join(th, NULL);

    ck_assert_int_eq(coll__shm_wait(&s, ctr, 5, -1, mono_deadline_ns(0), &culprit), 0);
    ck_assert_int_eq(coll__shm_wait(&s, ctr, 6, 0, mono_deadline_ns(10000), &culprit), -ECANCELED);

    /* Deadline with no rank to blame: culprit -1. */
    atomic_store(&local_abort, 0);
    ck_assert_int_eq(coll__shm_wait(&s, ctr, 6, -1, mono_deadline_ns(20), &culprit), -ETIMEDOUT);
    ck_assert_int_eq(culprit, -1);
    coll__shm_close(&s);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */

static Suite *shm_suite(void)
{
    Suite *s = suite_create("shm");

    check_tcase(s, "segments", 30, test_create_open_attach, test_bad_arguments, test_close_zeroed,
                test_attach_timeout, test_stale_sweep);

    TCase *tc = tcase_create("waits");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_pingpong, 0, 2);
    tcase_add_test(tc, test_wait_all);
    tcase_add_test(tc, test_timeout_names_late_rank);
    tcase_add_loop_test(tc, test_killed_rank, 0, 2);
    tcase_add_test(tc, test_remote_abort);
    tcase_add_test(tc, test_local_abort);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return check_run(shm_suite());
}
