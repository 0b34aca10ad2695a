/*
 * Failure records of ddprun's agents: one failed worker (or a node that stopped, or the store
 * lost), as the summary prints it and as it travels between nodes: the JSON text that a node
 * publishes under its round's failure key (ddprun_rdzv_publish_failure(), noderdzv.h) and every
 * other node reads back. Every record ddprun makes, sends or reads goes through these functions,
 * so the fields and their encoding are defined once.
 *
 * The JSON is one compact object: {"time": 1700000000.25, "node": "host", "rank": 3,
 * "local_rank": 1, "exit_code": -9, "pid": 4242, "message": "...", "teardown": false}, and, only
 * when they say something, "node_rank": 2, "core_dumped": true, "error_file": "...", "logs":
 * "...", "stderr_tail": "..."; every member after "pid" may be absent when read. Pure: no I/O, no
 * store; the only clock read is the wall clock, for the timestamp. Internal to the launcher.
 *
 * Also here, as pure functions: the stderr tail a worker's relay keeps (ddprun_tail), and the
 * words the summary and ddprun's lines use for an exit and for a node.
 */
#ifndef DDPRUN_FAILURE_H
#define DDPRUN_FAILURE_H

#include <stdbool.h>
#include <stddef.h>

#define DDPRUN_TAIL_BYTES 2048 /* stderr bytes a worker's tail keeps, and the record carries */
#define DDPRUN_TAIL_LINES 10   /* lines of that tail the record carries */

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
    int node_rank;     /* the rank of the node concerned in the round; -1 when unknown */
    bool core_dumped;  /* exit_code < 0 and the kernel wrote a core of the worker */
    char error_file[4096]; /* the error file the worker wrote (@record); "": none */
    char logs[4096];       /* where its output went besides the console (log files); "" */
    char stderr_tail[DDPRUN_TAIL_BYTES]; /* the last lines of its standard error, when it wrote
                                            no error file; "": none */
} ddprun_failure;

/*
 * Fills *f with a record stamped with the wall clock now, not a teardown one, with node_rank -1
 * and the optional fields empty. `node` and `message` are borrowed and copied, cut to fit the
 * fields (NULL node: "?"; NULL message: ""). Cannot fail.
 */
void ddprun_failure_init(ddprun_failure *f, const char *node, int rank, int local_rank,
                         int exit_code, int pid, const char *message);

/*
 * Returns the record as compact JSON text (NUL-terminated, allocated: free()), or NULL when out
 * of memory or `f` is NULL. Bytes of the strings that are not valid UTF-8 (a worker's stderr, a
 * line cut mid-character) go out as '?'.
 */
char *ddprun_failure_to_json(const ddprun_failure *f);

/*
 * Parses a record from JSON text (as ddprun_failure_to_json() writes it; the members after "pid"
 * may be absent, extra members are ignored). Returns 0 and fills *f; -EINVAL (NULL
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

/*
 * Writes how a worker ended, as the summary and ddprun's lines say it: "exit 3", "signal 9
 * (KILL)", "signal 11 (SEGV), core dumped" (`code` as ddprun_failure.exit_code; `core` only
 * matters for a signal). Writes at most n bytes, NUL included.
 */
void ddprun_describe_exit(int code, bool core, char *buf, size_t n);

/*
 * Writes how ddprun names a node: "node 2 (node3)" with its rank and host name, "node 2" when
 * the host is unknown (NULL, "" or "?"), "node3" when the rank is (node_rank < 0), "a node"
 * when both are. `host` is borrowed. Writes at most n bytes, NUL included.
 */
void ddprun_node_name(int node_rank, const char *host, char *buf, size_t n);

/*
 * The end of a worker's standard error, as its relay saw the bytes go by: a ring of the last
 * DDPRUN_TAIL_BYTES bytes. Zero-initialised it is empty. Not thread-safe (the loop's).
 */
typedef struct ddprun_tail {
    char buf[DDPRUN_TAIL_BYTES];
    size_t total; /* bytes added so far; the ring holds the last min(total, sizeof buf) */
} ddprun_tail;

/* Adds `n` bytes at `p` (borrowed) to the tail. NULL t is a no-op. */
void ddprun_tail_add(ddprun_tail *t, const char *p, size_t n);

/*
 * Writes the last `max_lines` complete or unfinished lines of the tail into out[n] as text a
 * summary can print: lines separated by '\n', none at the end; a line cut by the ring's start is
 * dropped; within a line what a carriage return redrew (a progress bar) counts from the last
 * '\r'; terminal escape sequences and other control bytes but tabs are left out; empty trailing
 * lines go. Returns the length written (0: nothing to show; out is "" then, n > 0).
 */
size_t ddprun_tail_text(const ddprun_tail *t, int max_lines, char *out, size_t n);

#endif /* DDPRUN_FAILURE_H */
