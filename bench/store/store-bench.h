/*
 * store-bench.h: what store-bench's own files share: the protocol generations, the results
 * of a measurement, the server processes, the report's tables and the options, and each
 * file's entry points. Internal to the program; nothing here is a library's API.
 *
 *   store-bench.c   main(): the options and --help, the run in order, the exit status
 *   wire.c          small helpers (failure detail, clocks, allocation), the request frames
 *                   built with librendezvous's encoder, blocking sockets and the handshake
 *   roundtrip.c     SET+GET round trips on one blocking connection or on many through epoll
 *   barrier.c       N connections passing a barrier (connect, ADD, WAIT) through epoll
 *   server.c        the server processes: spawning, waiting for their port, stopping
 *   section.c       one protocol generation's table: its servers and the rows measured on them
 *   report.c        the tables on stdout, the JSON file, the machine's CPU accounting
 *
 * Functions that fail return a negative errno and leave a sentence in g_err (fail()); the
 * allocating helpers exit(2) instead, before any clock starts.
 */
#ifndef STORE_BENCH_H
#define STORE_BENCH_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "proto.h"

#define MIB (1024 * 1024)
#define IO_TIMEOUT_MS 10000      /* a reply that takes longer than this is a hang */
#define BARRIER_TIMEOUT_MS 60000 /* torch 1.13 needs ~8 s for 10k connections */
#define START_TIMEOUT_MS 60000   /* importing torch takes seconds */
#define MAX_BARRIERS 3

/* ---------------------------------------------------------------------------------------- */
/* wire.c                                                                                   */
/* ---------------------------------------------------------------------------------------- */

extern char g_err[512]; /* detail of the last failure, for the report */

/* Records a failure description in g_err and returns `rc` (a negative errno). */
__attribute__((format(printf, 2, 3))) int fail(int rc, const char *fmt, ...);
/* The project's monotonic clock (monoclock.h), unsigned for store-bench's arithmetic. */
uint64_t now_ns(void);
void sleep_ms(int ms);
/* malloc() that exits with status 2 on failure. */
void *xmalloc(size_t n);

struct gen {
    const char *name;   /* "legacy", "modern" */
    enum rdzv_gen wire; /* its opcode numbering, for rdzv__put_op() */
    bool validate;      /* opens with VALIDATE */
};

extern const struct gen gen_legacy, gen_modern;

/* Frame builders: each appends one request to `w`; check the buffer with built() afterwards. */
void frame_validate(rdzv__wbuf *w);
void frame_set(rdzv__wbuf *w, const struct gen *g, const char *key, const void *val, size_t vlen);
void frame_get(rdzv__wbuf *w, const struct gen *g, const char *key);
void frame_add(rdzv__wbuf *w, const struct gen *g, const char *key, int64_t delta);
void frame_wait1(rdzv__wbuf *w, const struct gen *g, const char *key);
/* Exits with status 2 if building frames into `w` failed. */
void built(const rdzv__wbuf *w);

/* Blocking I/O: 0 or a negative errno with g_err set (`what` names the reply awaited). */
int send_all(int fd, const uint8_t *buf, size_t len);
int recv_all(int fd, uint8_t *buf, size_t len, const char *what);
void set_nodelay(int fd);
/* 127.0.0.1:port */
struct sockaddr_in loopback(int port);
/* A blocking connection to 127.0.0.1:port with I/O timeouts, handshake done for the modern
   generation. Returns the fd or a negative errno with g_err set. */
int conn_open(int port, const struct gen *g);

/* ---------------------------------------------------------------------------------------- */
/* roundtrip.c                                                                              */
/* ---------------------------------------------------------------------------------------- */

extern unsigned g_round; /* makes key names unique per measurement */

struct rt_timing {
    uint64_t warm_ns, run_ns;
};

/* One run's figures; CPU times are per round trip, -1 when the server's could not be read. */
struct rt_result {
    double rate;   /* round trips per second */
    double us;     /* mean wall time per round trip (meaningful for one connection) */
    double srv_us; /* server CPU time per round trip */
    double cli_us; /* client (this thread) CPU time per round trip */
    double px_us;  /* rt_multi() through a proxy: the proxy's CPU time per round trip (-1 none) */
};

/* SET+GET round trips on one blocking connection, or on nconn through one epoll loop: warm-up
   for t->warm_ns, then counted for t->run_ns. srv_pid is the server, for its CPU time; for
   rt_multi() through a proxy, `port` is the proxy's, srv_pid the root's and px_pid the proxy's
   (-1 when there is none). Fill *res and return 0, or return a negative errno with g_err set. */
int rt_single(int port, pid_t srv_pid, const struct gen *g, size_t vsize, const struct rt_timing *t,
              struct rt_result *res);
int rt_multi(int port, pid_t srv_pid, pid_t px_pid, const struct gen *g, unsigned nconn,
             size_t vsize, const struct rt_timing *t, struct rt_result *res);

/* ---------------------------------------------------------------------------------------- */
/* barrier.c                                                                                */
/* ---------------------------------------------------------------------------------------- */

struct barrier_result {
    double total_s, connected_s, added_s;
    double srv_cpu_s, cli_cpu_s; /* CPU time from first socket() to last release; -1 unknown */
    long long listen_drops;      /* kernel's count during the run, -1 unknown */
};

/* N connections pass a barrier. Fills *res and returns 0, or a negative errno with g_err set. */
int barrier_run(int port, pid_t srv_pid, const struct gen *g, unsigned n,
                struct barrier_result *res);

/* ---------------------------------------------------------------------------------------- */
/* server.c                                                                                 */
/* ---------------------------------------------------------------------------------------- */

/* The sides of a table ([SRV_OURS], [SRV_TORCH]), and the proxy in front of ours. */
enum { SRV_OURS, SRV_TORCH, SRV_PROXY };

struct server {
    int kind;
    const char *label; /* "ddp-rendezvous", "torch" */
    char *argv[12];
    pid_t pid;
    int in_fd, out_fd, log_fd;
    bool drain_started;
    pthread_t drain;
    char log_path[256];
    int port;
    char version[96]; /* torch's second stdout line */
    bool keep_log;    /* something went wrong: leave the log for the report */
    char exit_note[160];
    char upstream[32]; /* SRV_PROXY: "127.0.0.1:PORT" of --upstream */
};

extern int g_server_cpu; /* --pin: the CPU the servers run on */

/* Restricts the calling process to one CPU; a no-op for cpu < 0. */
void pin_to(int cpu);
/* Starts s->argv; does not wait for it to listen. 0 or a negative errno with g_err set. */
int server_spawn(struct server *s);
/* The last few lines of a server's log, for an error message. */
void log_tail(const struct server *s, char *buf, size_t size);
/* Waits for the server's port. 0; -ENOENT when torch is missing or the program cannot run;
   another negative errno on failure (g_err says which). */
int server_ready(struct server *s);
/* Is the server still running? If not, records how in exit_note and keeps its log. */
bool server_alive(struct server *s);
/* Stops a server (stdin closed, SIGTERM, SIGKILL after 5 s) and removes its log if all went
   well. */
void server_stop(struct server *s);

/* ---------------------------------------------------------------------------------------- */
/* section.c                                                                                */
/* ---------------------------------------------------------------------------------------- */

enum { CELL_NONE, CELL_OK, CELL_FAIL, CELL_SKIP };
enum unit { U_RATE, U_US, U_CPU_US, U_SEC };

struct cell {
    int state;
    double v;
    struct barrier_result br; /* barrier rows only */
    char *err;
};

/* The goals a row is checked against (issue 23), in its `target` column. */
enum {
    TARGET_NONE,
    TARGET_RATE_2X,  /* ours >= 2x torch's round trips per second */
    TARGET_CPU_HALF, /* ours <= 0.5x torch's server CPU per round trip */
    TARGET_BARRIER,  /* ours <= 0.5 s */
};

struct row {
    char name[48];
    enum unit unit;
    int target;       /* TARGET_*: issue 23's goal for the row */
    struct cell c[2]; /* [SRV_OURS], [SRV_TORCH] */
    bool via_proxy;   /* ours measured through a proxy; the torch cell is torch's direct figure */
};

enum {
    /* round trips per second: 1 or 32 connections, 64 B (S) or 1 MiB (L) values */
    R_RATE1_S,
    R_RATE1_L,
    R_RATE32_S,
    R_RATE32_L,
    /* wall microseconds per round trip on one connection */
    R_US1_S,
    R_US1_L,
    /* server CPU microseconds per round trip */
    R_CPU1_S,
    R_CPU1_L,
    R_CPU32_S,
    R_CPU32_L,
    /* 32 connections, 64 B, through a `ddp-rendezvous proxy` in front of ours (modern only):
       round trips per second, the root's CPU and the proxy's CPU per round trip */
    R_RATE32_PX,
    R_CPU32_PX,
    R_PXCPU32_PX,
    R_BARRIER0,
    R_COUNT = R_BARRIER0 + MAX_BARRIERS
};

struct section {
    const struct gen *g;
    bool run[2];         /* which sides are selected */
    const char *skip[2]; /* why a side was skipped, or NULL */
    char torch_version[96];
    struct server srv[2]; /* [SRV_OURS], [SRV_TORCH] */
    struct row rows[R_COUNT];
    unsigned nrows;
    struct server proxy; /* the proxy of the via-proxy rows, while they run */
};

struct config {
    const char *ours;
    const char *script;
    const char *py_legacy, *py_modern;
    bool quick, verbose, pin;
    bool only_ours, only_t113, only_t2;
    const char *json;
    unsigned barrier_n[MAX_BARRIERS];
    unsigned nbarriers;
    unsigned reps; /* runs per round-trip row and server; the best is kept */
    struct rt_timing t;
    unsigned rows; /* --rows: the ROW_* groups to run (ROW_ALL unless given) */
    bool gens[2];  /* --protocol: the sections to run, [0] legacy, [1] modern */
    /* --proxy-rows: the via-proxy rows (with rate32, in the modern section, ours measured) */
    bool proxy_rows;
};

/* --rows: the groups of rows a run measures. A round-trip group fills its rate, its wall time
   (one connection) and its server CPU rows. */
enum {
    ROW_RATE1 = 1 << 0,      /* 1 conn, 64 B */
    ROW_RATE1_MIB = 1 << 1,  /* 1 conn, 1 MiB */
    ROW_RATE32 = 1 << 2,     /* 32 conn, 64 B */
    ROW_RATE32_MIB = 1 << 3, /* 32 conn, 1 MiB */
    ROW_BARRIER = 1 << 4,    /* every barrier size */
    ROW_ALL = (1 << 5) - 1
};

extern int g_failures;
extern char *g_notes[32]; /* failures that belong to no table cell */
extern int g_nnotes;

void section_init(struct section *sec, const struct gen *g, const struct config *cfg);
/* Spawns the selected sides' servers without waiting for them. */
void spawn_pair(struct section *sec, const struct config *cfg);
/* Waits for the spawned servers; returns the number of sides running. */
int ready_pair(struct section *sec);
/* Runs one section's rows on its servers, then stops them. */
void run_section(struct section *sec, const struct config *cfg);

/* ---------------------------------------------------------------------------------------- */
/* report.c                                                                                 */
/* ---------------------------------------------------------------------------------------- */

void print_section(const struct section *sec, const struct config *cfg);
/* Writes the sections as JSON to path; 0 or a negative errno. */
int write_json(const char *path, const struct section *secs, int nsec, const struct config *cfg);
/* CPU seconds spent by the whole machine (-1 unknown) and by this process and its children. */
double machine_busy_s(void);
double own_cpu_s(void);

#endif /* STORE_BENCH_H */
