/*
 * Failure records of ddprun's agents: one failed worker (or a node that stopped, or the store
 * lost), as the summary prints it and as it travels between nodes: the JSON text that a node
 * publishes under its round's failure key (ddprun_rdzv_publish_failure(), noderdzv.h) and every
 * other node reads back. Every record ddprun makes, sends or reads goes through these functions,
 * so the fields and their encoding are defined once.
 *
 * The JSON is one compact object: {"time": 1700000000.25, "node": "host", "rank": 3,
 * "local_rank": 1, "exit_code": -9, "pid": 4242, "message": "...", "teardown": false};
 * "message" and "teardown" may be absent when read. Pure: no I/O, no store; the only clock read is
 * the wall clock, for the timestamp. Internal to the launcher.
 */
#ifndef DDPRUN_FAILURE_H
#define DDPRUN_FAILURE_H

#include <stdbool.h>

typedef struct ddprun_failure {
    double time;       /* wall-clock seconds since the epoch: a timestamp people read, and the
                          order across machines (the earliest failure is the root cause) */
    char node[256];    /* host name of the node the worker ran on; "?" when unknown */
    int rank;          /* global rank; -1 when no worker is concerned */
    int local_rank;    /* local rank; -1 likewise */
    int exit_code;     /* >= 0: the worker's exit code; < 0: minus the signal that ended it */
    int pid;           /* the worker's pid; 0 when it never started */
    char message[512]; /* the first line of the worker's error, or what went wrong */
    bool teardown;     /* the worker ended after ddprun had begun stopping it because of another
                          failure: killed by ddprun's signal, or failing on its way out */
} ddprun_failure;

/*
 * Fills *f with a record stamped with the wall clock now, not a teardown one. `node` and
 * `message` are borrowed and copied, cut to fit the fields (NULL node: "?"; NULL message: "").
 * Cannot fail.
 */
void ddprun_failure_init(ddprun_failure *f, const char *node, int rank, int local_rank,
                         int exit_code, int pid, const char *message);

/*
 * Returns the record as compact JSON text (NUL-terminated, allocated: free()), or NULL when out
 * of memory or `f` is NULL.
 */
char *ddprun_failure_to_json(const ddprun_failure *f);

/*
 * Parses a record from JSON text (as ddprun_failure_to_json() writes it; "message" and
 * "teardown" may be absent, extra members are ignored). Returns 0 and fills *f; -EINVAL (NULL
 * argument) or -EPROTO (not JSON, or a member missing or of the wrong type), and then *f is
 * unchanged.
 */
int ddprun_failure_from_json(const char *json, ddprun_failure *f);

/*
 * The exit status ddprun reports for a job that this failure ended: the worker's exit code, or
 * 128 plus the signal number; 1 when that would be 0 (a failed job never exits 0) or f is NULL.
 */
int ddprun_failure_exit_status(const ddprun_failure *f);

/*
 * qsort() order of a failure summary: failures of their own (the earliest, the root cause,
 * first) before teardown ones, each by time.
 */
int ddprun_failure_cmp(const void *x, const void *y);

#endif /* DDPRUN_FAILURE_H */
