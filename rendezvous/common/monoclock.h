/*
 * The project's one clock: monotonic nanoseconds, and deadlines on it (and, for the
 * benchmarks, CPU time used). Every timeout, deadline
 * and duration in the libraries, the launcher, the tests and the benchmarks is measured with
 * these, never with CLOCK_REALTIME (which jumps when the wall clock is set). Header-only so that
 * librendezvous, libcollective and the programs share one definition without exporting it.
 *
 * Internal to the project: not installed. Compiles as C99 and C++; as it uses POSIX clocks, a
 * strict -std=c99 build defines _POSIX_C_SOURCE >= 199309L (or _GNU_SOURCE, as the project
 * does) before its first system header.
 */
#ifndef DDP_MONOCLOCK_H
#define DDP_MONOCLOCK_H

#include <errno.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#ifndef CLOCK_MONOTONIC
#error "monoclock.h needs POSIX clocks: define _POSIX_C_SOURCE >= 199309L before any #include"
#endif

/* Nanoseconds on CLOCK_MONOTONIC (which cannot fail on Linux with a valid pointer). */
static inline int64_t mono_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Seconds on the same clock, for durations printed to people. */
static inline double mono_now_s(void)
{
    return (double)mono_now_ns() / 1e9;
}

/* The deadline timeout_ms from now; INT64_MAX (never) for timeout_ms < 0. */
static inline int64_t mono_deadline_ns(int timeout_ms)
{
    if (timeout_ms < 0)
        return INT64_MAX;
    return mono_now_ns() + (int64_t)timeout_ms * 1000000;
}

/*
 * Milliseconds left until `deadline` (from mono_deadline_ns()), rounded up so that a wait for
 * them does not end early: -1 for INT64_MAX (no deadline), 0 once it has passed.
 */
static inline int mono_ms_left(int64_t deadline)
{
    if (deadline == INT64_MAX)
        return -1;
    int64_t left = deadline - mono_now_ns();
    if (left <= 0)
        return 0;
    left = (left + 999999) / 1000000;
    return left > INT32_MAX ? INT32_MAX : (int)left;
}

/*
 * The point `ns` of this clock (from mono_now_ns() or mono_deadline_ns()) as an absolute
 * struct timespec: for pthread_cond_timedwait() on a condition variable whose clock is
 * CLOCK_MONOTONIC (pthread_condattr_setclock()), and for clock_nanosleep(CLOCK_MONOTONIC,
 * TIMER_ABSTIME, ...).
 */
static inline struct timespec mono_timespec_at(int64_t ns)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(ns / 1000000000);
    ts.tv_nsec = (long)(ns % 1000000000);
    return ts;
}

/* Sleeps until the point `ns` of this clock (mono_deadline_ns()); at once if it has passed. */
static inline void mono_sleep_until(int64_t ns)
{
    struct timespec ts = mono_timespec_at(ns);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

/*
 * CPU time used so far by process `pid` (all its threads; 0: the calling process), in
 * nanoseconds, or -1 when it cannot be read (pid < 0, or no such process). The benchmarks'
 * accounting of what a server, a proxy or they themselves cost.
 */
static inline int64_t cpu_used_ns(pid_t pid)
{
    clockid_t clk;
    struct timespec ts;
    if (pid < 0 || clock_getcpuclockid(pid, &clk) != 0 || clock_gettime(clk, &ts) != 0)
        return -1;
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* CPU time used so far by the calling thread alone, in nanoseconds. */
static inline int64_t thread_cpu_used_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#endif /* DDP_MONOCLOCK_H */
