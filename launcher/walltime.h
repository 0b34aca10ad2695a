/*
 * The time of ddprun's own messages and of its failure summary, shared by the agent and the
 * ddp-guard program: local wall-clock time to the millisecond, "2026-11-24 21:03:04.123", the
 * format of the summary's time column. For stamps only: every timeout and duration uses
 * monoclock.h. Header-only, so that ddp-guard links nothing of the agent's. Internal to ddprun.
 */
#ifndef DDPRUN_WALLTIME_H
#define DDPRUN_WALLTIME_H

#include <stddef.h>
#include <stdio.h>
#include <time.h>

/* Seconds since the epoch, CLOCK_REALTIME. */
static inline double wall_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Writes t (wall_now_s()) as "YYYY-MM-DD HH:MM:SS.mmm", local time, into buf[n]. */
static inline void format_time(double t, char *buf, size_t n)
{
    time_t sec = (time_t)t;
    struct tm tm;
    localtime_r(&sec, &tm);
    size_t k = strftime(buf, n, "%Y-%m-%d %H:%M:%S", &tm);
    int ms = (int)((t - (double)sec) * 1000);
    snprintf(buf + k, n - k, ".%03d", ms < 0 ? 0 : ms > 999 ? 999 : ms);
}

#endif /* DDPRUN_WALLTIME_H */
