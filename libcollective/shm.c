/*
 * Per-host shared-memory segments and the waits on counters inside them (coll_internal.h,
 * "shm.c").
 *
 * A segment is a POSIX shared-memory object named "/coll.<euid>.<creator pid>.<16 hex>" (the
 * upper 8 hex digits hash the communicator's tag, the lower 8 are random). The host leader
 * creates it zeroed, the other local ranks open it by the name the leader published, and once
 * all of them have attached the leader unlinks the name: from then on the memory lives exactly
 * as long as the mappings, so no crash leaves anything behind in /dev/shm. The only window in
 * which a crash leaks a name is between create and the last attach; coll__shm_create() closes
 * it by sweeping names of this user whose creator pid no longer exists.
 *
 * Waiting: counters are monotonic 64-bit values written by one rank and read by others. A
 * waiter polls its counter (s->spin times with a pause; or, when s->spin < 0 because ranks
 * outnumber CPUs, -s->spin times with a sched_yield()), then sleeps on the header's `wake`
 * futex, which every post bumps; `nwaiters` lets a post skip the FUTEX_WAKE syscall when nobody
 * sleeps. The futex is the shared (not _PRIVATE) kind, since waiters live in different
 * processes. A wait whose counter is already satisfied returns without any syscall. While
 * sleeping, a waiter wakes at least every 10 ms to check the communicator's local abort flag,
 * the segment's abort flag, the deadline, and whether the rank it waits for is still alive
 * (through a pidfd, or kill(pid, 0) where pidfds are unavailable).
 *
 * Invariants: hdr->culprit is -1 until the first coll__shm_abort() sets it, and it is written
 * before hdr->abort. s->name[0] == 0 means this struct no longer names a linked segment (the
 * leader unlinked it, or nothing was created). s->pidfds hold open descriptors only while
 * s->base is mapped; create and open set them all to -1.
 *
 * Not done here: choosing the layout after the header, deciding who the leader is, publishing
 * the name (cpu_boot.c and layout.c do these), and reacting to a failure beyond reporting it
 * (the caller decides whether to coll__shm_abort()). The zombie of a dead rank counts as dead
 * only through its pidfd: the kill() fallback, for kernels without pidfd_open (< 5.3), sees it
 * once reaped.
 * The stale sweep trusts pids, so it assumes /dev/shm is not shared with processes of the same
 * uid in another pid namespace.
 */
#include "coll_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434 /* the same number on every architecture */
#endif

/* Longest sleep between checks of the abort flags, the deadline and the watched rank. */
#define SLEEP_SLICE_NS (10 * 1000000LL)
/*
 * Polls before sleeping (s->spin). When every local rank has a CPU of its own, a poll costs a
 * pause (~0.1 µs here, in a VM) and a futex wake-up tens of µs, so poll for a millisecond or
 * two: a ping-pong between two processes on two CPUs then takes 0.04 µs one way instead of
 * 3-30 µs. When ranks outnumber CPUs, a spinning waiter holds the CPU the rank it waits for
 * needs; a negative spin then means -spin polls each preceded by sched_yield(), which hands the
 * CPU over at once and still beats sleeping (4 processes on 2 CPUs: ~3-8 µs against 7-14 µs;
 * 8 on 2: ~15 against ~40). Measured with bench/shm-pingpong.c; see bench/README.md.
 */
#define SPIN_DEDICATED 20000
#define SPIN_SHARED (-10)
#define CREATE_TRIES 8

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static coll__shm_hdr *hdr_of(const coll__shm *s)
{
    return (coll__shm_hdr *)s->base;
}

/* FUTEX_WAIT on a shared word: returns early when *word != expected or on any wake. */
static void futex_wait(_Atomic uint32_t *word, uint32_t expected, int64_t timeout_ns)
{
    struct timespec ts = {.tv_sec = (time_t)(timeout_ns / 1000000000),
                          .tv_nsec = (long)(timeout_ns % 1000000000)};
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expected, &ts, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/*
 * Bumps `wake` and wakes sleepers if there are any. Paired with sleep_on(): a sleeper
 * increments nwaiters before the kernel compares `wake` with the value it read, and this
 * increments `wake` before reading nwaiters (both seq_cst), so either the sleeper's compare
 * fails or this sees it and wakes it.
 */
static void wake_sleepers(coll__shm_hdr *h)
{
    atomic_fetch_add_explicit(&h->wake, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&h->nwaiters, memory_order_seq_cst) > 0)
        futex_wake_all(&h->wake);
}

/* Sleeps until `wake` moves away from w, or for at most min(left_ns, SLEEP_SLICE_NS). */
static void sleep_on(coll__shm_hdr *h, uint32_t w, int64_t left_ns)
{
    atomic_fetch_add_explicit(&h->nwaiters, 1, memory_order_seq_cst);
    futex_wait(&h->wake, w, left_ns < SLEEP_SLICE_NS ? left_ns : SLEEP_SLICE_NS);
    atomic_fetch_sub_explicit(&h->nwaiters, 1, memory_order_seq_cst);
}

/* ------------------------------------------------------------------------------------------ */
/* Names                                                                                       */
/* ------------------------------------------------------------------------------------------ */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return h;
}

static uint64_t random64(void)
{
    static _Atomic uint64_t seq;
    uint64_t r;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) == (ssize_t)sizeof r)
        return r;
    return mix64((uint64_t)mono_now_ns() ^ ((uint64_t)getpid() << 32) ^ atomic_fetch_add(&seq, 1));
}

/*
 * Parses "coll.<uid>.<pid>.<rest>" (no leading '/'): returns the pid when uid is ours and the
 * form is right, else -1.
 */
static long name_pid(const char *entry)
{
    char prefix[32];
    int n = snprintf(prefix, sizeof prefix, "coll.%u.", (unsigned)geteuid());
    if (strncmp(entry, prefix, (size_t)n) != 0)
        return -1;
    const char *p = entry + n;
    if (*p < '0' || *p > '9')
        return -1;
    char *end;
    errno = 0;
    long pid = strtol(p, &end, 10);
    if (errno != 0 || *end != '.' || pid <= 0 || pid > INT_MAX)
        return -1;
    return pid;
}

/* Unlinks this user's segments whose creator no longer exists. Best effort. */
static void sweep_stale(void)
{
    DIR *d = opendir("/dev/shm");
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long pid = name_pid(e->d_name);
        if (pid <= 0 || pid == (long)getpid())
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        char path[NAME_MAX + 2];
        snprintf(path, sizeof path, "/%s", e->d_name);
        shm_unlink(path);
    }
    closedir(d);
}

/* True when s->name is linked and was created by this process. */
static bool created_here(const coll__shm *s)
{
    return s->name[0] == '/' && name_pid(s->name + 1) == (long)getpid();
}

/* Clears what create/open fill, so that close is safe whatever happens next. */
static void reset(coll__shm *s)
{
    s->name[0] = '\0';
    s->base = NULL;
    s->nbytes = 0;
    for (int i = 0; i < COLL__MAX_LOCAL; i++)
        s->pidfds[i] = -1;
}

/* ------------------------------------------------------------------------------------------ */
/* Segments                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/*
 * The pages are reserved with fallocate() rather than left sparse: a /dev/shm too small for
 * the segment (64 MiB in a default Docker container) then fails here with -ENOSPC instead of
 * killing a rank with SIGBUS on first touch. No MAP_POPULATE: each rank touches mostly its own
 * parts of a large segment, and faults them in itself.
 */
int coll__shm_create(coll__shm *s, const char *tag, size_t nbytes)
{
    if (!s)
        return -EINVAL;
    reset(s);
    if (nbytes < sizeof(coll__shm_hdr) || nbytes > (size_t)INT64_MAX)
        return -EINVAL;

    sweep_stale();

    uint64_t tag_hash = mix64(fnv1a(tag ? tag : ""));
    char name[sizeof s->name];
    int fd = -1;
    for (int tries = 0;; tries++) {
        uint64_t id = (tag_hash & 0xffffffff00000000ULL) | (random64() & 0xffffffffULL);
        snprintf(name, sizeof name, "/coll.%u.%ld.%016" PRIx64, (unsigned)geteuid(), (long)getpid(),
                 id);
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0)
            break;
        if (errno != EEXIST || tries + 1 == CREATE_TRIES)
            return -errno;
    }

    int rc = 0;
    void *base = MAP_FAILED;
    if (ftruncate(fd, (off_t)nbytes) != 0) {
        rc = -errno;
        goto out;
    }
    if (fallocate(fd, 0, 0, (off_t)nbytes) != 0 && errno != EOPNOTSUPP && errno != ENOSYS) {
        rc = -errno;
        goto out;
    }
    base = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        rc = -errno;
        goto out;
    }
    atomic_store_explicit(&((coll__shm_hdr *)base)->culprit, -1, memory_order_relaxed);
    strcpy(s->name, name);
    s->base = base;
    s->nbytes = nbytes;
out:
    close(fd);
    if (rc != 0)
        shm_unlink(name);
    return rc;
}

int coll__shm_open(coll__shm *s, const char *name, size_t nbytes)
{
    if (!s)
        return -EINVAL;
    reset(s);
    if (!name || name[0] != '/' || strchr(name + 1, '/') || strlen(name) >= sizeof s->name ||
        nbytes < sizeof(coll__shm_hdr) || nbytes > (size_t)INT64_MAX)
        return -EINVAL;

    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int rc = 0;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = -errno;
        goto out;
    }
    if (st.st_size < 0 || (uint64_t)st.st_size < (uint64_t)nbytes) {
        rc = -EPROTO;
        goto out;
    }
    void *base = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        rc = -errno;
        goto out;
    }
    strcpy(s->name, name);
    s->base = base;
    s->nbytes = nbytes;
out:
    close(fd);
    return rc;
}

/*
 * The leader unlinks on every way out, a timeout included: a rank that has not attached by
 * the deadline will not be waited for, and the name must not outlive the job.
 */
int coll__shm_attach_done(coll__shm *s, int64_t deadline_ns)
{
    if (!s || !s->base || s->nlocal < 1 || s->nlocal > COLL__MAX_LOCAL || s->local_rank < 0 ||
        s->local_rank >= s->nlocal)
        return -EINVAL;
    coll__shm_hdr *h = hdr_of(s);
    atomic_fetch_add_explicit(&h->attached, 1, memory_order_seq_cst);
    wake_sleepers(h);
    if (s->local_rank != 0)
        return 0;

    int rc = 0;
    for (;;) {
        uint32_t w = atomic_load_explicit(&h->wake, memory_order_acquire);
        if (atomic_load_explicit(&h->attached, memory_order_acquire) >= (uint32_t)s->nlocal)
            break;
        if (s->local_abort && atomic_load_explicit(s->local_abort, memory_order_relaxed)) {
            rc = -ECANCELED;
            break;
        }
        if (atomic_load_explicit(&h->abort, memory_order_acquire)) {
            rc = COLL_EREMOTE;
            break;
        }
        int64_t left = deadline_ns - mono_now_ns();
        if (left <= 0) {
            rc = -ETIMEDOUT;
            break;
        }
        sleep_on(h, w, left);
    }
    if (s->name[0] != '\0')
        shm_unlink(s->name);
    s->name[0] = '\0';
    return rc;
}

/*
 * "Created by this rank" is read from the name: the creator's pid is in it. So a struct of the
 * creating process that merely opened the name would unlink it too; only tests do that.
 */
void coll__shm_close(coll__shm *s)
{
    if (!s)
        return;
    if (s->base) {
        int n = s->nlocal < 0 ? 0 : s->nlocal > COLL__MAX_LOCAL ? COLL__MAX_LOCAL : s->nlocal;
        for (int i = 0; i < n; i++) {
            if (s->pidfds[i] >= 0)
                close(s->pidfds[i]);
            s->pidfds[i] = -1;
        }
        munmap(s->base, s->nbytes);
        s->base = NULL;
        s->nbytes = 0;
    }
    if (created_here(s))
        shm_unlink(s->name);
    s->name[0] = '\0';
}

static int usable_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0)
            return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int coll__shm_watch(coll__shm *s)
{
    if (!s || !s->base || s->nlocal < 1 || s->nlocal > COLL__MAX_LOCAL || s->local_rank < 0 ||
        s->local_rank >= s->nlocal)
        return -EINVAL;
    for (int i = 0; i < s->nlocal; i++) {
        if (s->pidfds[i] >= 0)
            close(s->pidfds[i]);
        s->pidfds[i] = -1;
        if (i == s->local_rank || s->pids[i] <= 0)
            continue;
        /* On failure (ENOSYS, EMFILE, ESRCH: already gone) the kill() fallback decides. */
        long fd = syscall(SYS_pidfd_open, (pid_t)s->pids[i], 0);
        if (fd >= 0)
            s->pidfds[i] = (int)fd;
    }
    s->spin = s->nlocal <= usable_cpus() ? SPIN_DEDICATED : SPIN_SHARED;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Posting and waiting                                                                         */
/* ------------------------------------------------------------------------------------------ */

void coll__shm_post(coll__shm *s, _Atomic uint64_t *ctr, uint64_t value)
{
    atomic_store_explicit(ctr, value, memory_order_release);
    wake_sleepers(hdr_of(s));
}

/* True when local rank r has exited (a zombie counts as exited where a pidfd is open). */
static bool rank_dead(const coll__shm *s, int r)
{
    if (s->pidfds[r] >= 0) {
        struct pollfd p = {.fd = s->pidfds[r], .events = POLLIN};
        return poll(&p, 1, 0) > 0;
    }
    if (s->pids[r] <= 0)
        return false;
    return kill((pid_t)s->pids[r], 0) != 0 && errno == ESRCH;
}

static int set_culprit(int *culprit, int who, int rc)
{
    if (culprit)
        *culprit = who;
    return rc;
}

/*
 * The checks made before each sleep, in the order their answers are most useful: a local
 * abort is this process's own decision, a segment abort carries the first culprit, a dead
 * watched rank is more precise than a timeout.
 */
static int check_failures(const coll__shm *s, int watch, int64_t deadline_ns, int *culprit,
                          int64_t *left_ns)
{
    coll__shm_hdr *h = hdr_of(s);
    if (s->local_abort && atomic_load_explicit(s->local_abort, memory_order_relaxed))
        return -ECANCELED;
    if (atomic_load_explicit(&h->abort, memory_order_acquire))
        return set_culprit(culprit, atomic_load_explicit(&h->culprit, memory_order_relaxed),
                           COLL_EREMOTE);
    if (watch >= 0 && watch != s->local_rank && rank_dead(s, watch))
        return set_culprit(culprit, s->granks[watch], COLL_EREMOTE);
    *left_ns = deadline_ns - mono_now_ns();
    if (*left_ns <= 0)
        return set_culprit(culprit, watch >= 0 ? s->granks[watch] : -1, -ETIMEDOUT);
    return 0;
}

int coll__shm_wait(coll__shm *s, _Atomic uint64_t *ctr, uint64_t target, int watch,
                   int64_t deadline_ns, int *culprit)
{
    if (atomic_load_explicit(ctr, memory_order_acquire) >= target)
        return 0;
    for (int i = 0; i < s->spin; i++) {
        cpu_relax();
        if (atomic_load_explicit(ctr, memory_order_acquire) >= target)
            return 0;
    }
    for (int i = 0; i < -s->spin; i++) {
        sched_yield();
        if (atomic_load_explicit(ctr, memory_order_acquire) >= target)
            return 0;
    }
    if (watch >= s->nlocal)
        watch = -1;
    coll__shm_hdr *h = hdr_of(s);
    for (;;) {
        /* Read wake before the counter: a post after this read makes the futex wait fail. */
        uint32_t w = atomic_load_explicit(&h->wake, memory_order_acquire);
        if (atomic_load_explicit(ctr, memory_order_acquire) >= target)
            return 0;
        int64_t left;
        int rc = check_failures(s, watch, deadline_ns, culprit, &left);
        if (rc != 0)
            return rc;
        sleep_on(h, w, left);
    }
}

int coll__shm_wait_all(coll__shm *s, uint64_t target, int64_t deadline_ns, int *culprit)
{
    coll__shm_hdr *h = hdr_of(s);
    for (int i = 0; i < s->nlocal; i++) {
        int rc = coll__shm_wait(s, &h->arrive[i].v, target, i, deadline_ns, culprit);
        if (rc != 0)
            return rc;
    }
    return 0;
}

void coll__shm_abort(coll__shm *s, int culprit)
{
    if (!s || !s->base)
        return;
    coll__shm_hdr *h = hdr_of(s);
    int32_t unknown = -1;
    atomic_compare_exchange_strong(&h->culprit, &unknown, (int32_t)culprit);
    atomic_store_explicit(&h->abort, 1, memory_order_release);
    atomic_fetch_add_explicit(&h->wake, 1, memory_order_seq_cst);
    futex_wake_all(&h->wake);
}
