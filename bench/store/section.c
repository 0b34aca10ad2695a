/*
 * section.c: one protocol generation's table: its rows, the two servers it compares
 * (ddp-rendezvous and torch's) started and checked, and run_section(), which runs every row on
 * each selected server, alternating between them, and keeps the best run. Failures land in the
 * row's cell or, when they belong to none, in the notes (add_note()); both count in g_failures.
 *
 * Not here: the measurements themselves (roundtrip.c, barrier.c) and the output (report.c).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "store-bench.h"

/* ---------------------------------------------------------------------------------------- */
/* Results                                                                                  */
/* ---------------------------------------------------------------------------------------- */

int g_failures;
char *g_notes[32]; /* failures that belong to no table cell */
int g_nnotes;

__attribute__((format(printf, 1, 2))) static void add_note(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    g_failures++;
    if (g_nnotes < (int)(sizeof(g_notes) / sizeof(g_notes[0])))
        g_notes[g_nnotes++] = strdup(buf);
}

static void cell_fail(struct cell *c, const char *who, const struct section *sec, const char *row)
{
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s (%s) %s: %s", who, sec->g->name, row, g_err);
    c->state = CELL_FAIL;
    c->err = strdup(buf);
    g_failures++;
}

void section_init(struct section *sec, const struct gen *g, const struct config *cfg)
{
    static const char *const rt_names[] = {"set+get/s, 1 conn, 64 B",
                                           "set+get/s, 1 conn, 1 MiB",
                                           "set+get/s, 32 conn, 64 B",
                                           "set+get/s, 32 conn, 1 MiB",
                                           "us/set+get, 1 conn, 64 B",
                                           "us/set+get, 1 conn, 1 MiB",
                                           "srv CPU us/op, 1 conn, 64 B",
                                           "srv CPU us/op, 1 conn, 1 MiB",
                                           "srv CPU us/op, 32 conn, 64 B",
                                           "srv CPU us/op, 32 conn, 1 MiB",
                                           "set+get/s, 32 conn via proxy, 64 B",
                                           "root CPU us/op, 32 conn via proxy, 64 B",
                                           "proxy CPU us/op, 32 conn via proxy"};
    memset(sec, 0, sizeof(*sec));
    sec->g = g;
    for (int k = 0; k < 2; k++) {
        sec->srv[k].pid = -1;
        sec->srv[k].in_fd = sec->srv[k].out_fd = sec->srv[k].log_fd = -1;
    }
    for (unsigned i = 0; i < R_BARRIER0; i++) {
        snprintf(sec->rows[i].name, sizeof(sec->rows[i].name), "%s", rt_names[i]);
        sec->rows[i].unit = i < R_US1_S ? U_RATE : i < R_CPU1_S ? U_US : U_CPU_US;
    }
    sec->rows[R_RATE32_PX].unit = U_RATE;
    for (unsigned i = R_RATE32_PX; i <= R_PXCPU32_PX; i++)
        sec->rows[i].via_proxy = true;
    sec->rows[R_RATE32_S].target = TARGET_RATE_2X;
    sec->rows[R_CPU32_S].target = TARGET_CPU_HALF;
    sec->rows[R_CPU32_PX].target = TARGET_CPU_HALF;
    for (unsigned i = 0; i < cfg->nbarriers; i++) {
        struct row *r = &sec->rows[R_BARRIER0 + i];
        snprintf(r->name, sizeof(r->name), "barrier s, %u conn", cfg->barrier_n[i]);
        r->unit = U_SEC;
        r->target = cfg->barrier_n[i] == 10000 ? TARGET_BARRIER : TARGET_NONE;
    }
    sec->nrows = R_BARRIER0 + cfg->nbarriers;
}

/* Fills argv for one side of a section, or for the proxy in front of ours (SRV_PROXY). */
static void server_setup(struct server *s, int kind, const struct section *sec,
                         const struct config *cfg)
{
    memset(s, 0, sizeof(*s));
    s->kind = kind;
    s->pid = -1;
    s->in_fd = s->out_fd = s->log_fd = -1;
    if (kind == SRV_PROXY) {
        snprintf(s->upstream, sizeof(s->upstream), "127.0.0.1:%d", sec->srv[SRV_OURS].port);
        s->label = "ddp-rendezvous proxy";
        s->argv[0] = (char *)cfg->ours;
        s->argv[1] = "proxy";
        s->argv[2] = "--upstream";
        s->argv[3] = s->upstream;
        s->argv[4] = "--bind";
        s->argv[5] = "127.0.0.1";
        s->argv[6] = "--port";
        s->argv[7] = "0";
    } else if (kind == SRV_OURS) {
        s->label = "ddp-rendezvous";
        s->argv[0] = (char *)cfg->ours;
        s->argv[1] = "serve";
        s->argv[2] = "--bind";
        s->argv[3] = "127.0.0.1";
        s->argv[4] = "--port";
        s->argv[5] = "0";
    } else {
        s->label = "torch";
        s->argv[0] = (char *)(sec->g == &gen_legacy ? cfg->py_legacy : cfg->py_modern);
        s->argv[1] = (char *)cfg->script;
        s->argv[2] = "--host";
        s->argv[3] = "127.0.0.1";
    }
}

/* "torch 2.15.0+cu132 libuv=1" -> major*100 + minor, or -1. */
static int torch_version_code(const char *line)
{
    int maj, min;
    if (sscanf(line, "torch %d.%d", &maj, &min) != 2)
        return -1;
    return maj * 100 + min;
}

/* Spawns the selected sides' servers without waiting for them (importing torch takes seconds). */
void spawn_pair(struct section *sec, const struct config *cfg)
{
    for (int k = 0; k < 2; k++) {
        if (!sec->run[k] || sec->skip[k])
            continue;
        server_setup(&sec->srv[k], k, sec, cfg);
        if (server_spawn(&sec->srv[k]) < 0) {
            sec->skip[k] = strdup(g_err);
            add_note("%s (%s): cannot start: %s", sec->srv[k].label, sec->g->name, g_err);
        }
    }
}

/*
 * Waits for the spawned servers to print their ports. A side that cannot start is marked
 * skipped (torch missing, or of the wrong generation) or failed. Returns the number of sides
 * running.
 */
int ready_pair(struct section *sec)
{
    struct server *srv = sec->srv;
    int running = 0;
    for (int k = 0; k < 2; k++) {
        int rc;
        if (!sec->run[k] || sec->skip[k])
            continue;
        rc = server_ready(&srv[k]);
        if (rc == -ENOENT) {
            sec->skip[k] = strdup(g_err);
            server_stop(&srv[k]);
            continue;
        }
        if (rc < 0) {
            char buf[700];
            snprintf(buf, sizeof(buf), "FAILED to start: %s", g_err);
            sec->skip[k] = strdup(buf);
            add_note("%s (%s): %s", srv[k].label, sec->g->name, buf);
            server_stop(&srv[k]);
            continue;
        }
        if (k == SRV_TORCH) {
            /* "torch 2.15.0 libuv=1": the version, then whether the libuv server runs. */
            char *lv = strstr(srv[k].version, " libuv=");
            bool uv = lv && lv[7] == '1';
            int code = torch_version_code(srv[k].version);
            bool legacy = code >= 0 && code < 202;
            if (lv)
                *lv = '\0';
            if (code < 0 || legacy != (sec->g == &gen_legacy)) {
                char buf[300];
                snprintf(buf, sizeof(buf), "%s has %s, which speaks the %s protocol",
                         srv[k].argv[0], srv[k].version, legacy ? "legacy" : "modern");
                sec->skip[k] = strdup(buf);
                server_stop(&srv[k]);
                continue;
            }
            snprintf(sec->torch_version, sizeof(sec->torch_version), "%.60s%s", srv[k].version,
                     uv ? " (libuv server)" : "");
        }
        running++;
    }
    return running;
}

static void stop_pair(struct section *sec)
{
    struct server *srv = sec->srv;
    for (int k = 0; k < 2; k++) {
        if (!sec->run[k] || sec->skip[k] || srv[k].pid < 0)
            continue;
        server_stop(&srv[k]);
        if (srv[k].exit_note[0])
            add_note("%s (%s): on shutdown the server %s; log kept: %s", srv[k].label, sec->g->name,
                     srv[k].exit_note, srv[k].log_path);
    }
}

/* True when side k of the section takes part in the measurement about to run. */
static bool side_on(const struct section *sec, int k)
{
    return sec->run[k] && !sec->skip[k];
}

/*
 * After a measurement: if the server died, record it in the cell (overriding a success) and
 * restart it so the remaining rows still run.
 */
static void check_alive(struct section *sec, struct server *s, struct cell *c, const char *row,
                        const struct config *cfg)
{
    char buf[2048], tail[600];
    /* After a failed run, give a crashing server a moment to be reaped, so the crash is blamed
     * on the row that caused it. */
    for (int i = 0; c->state == CELL_FAIL && i < 50 && server_alive(s); i++)
        sleep_ms(10);
    if (server_alive(s))
        return;
    log_tail(s, tail, sizeof(tail));
    if (c->state == CELL_FAIL && c->err)
        snprintf(buf, sizeof(buf), "%s; then the server %s; log %s%s%s", c->err, s->exit_note,
                 s->log_path, tail[0] ? ": " : "", tail);
    else
        snprintf(buf, sizeof(buf), "%s (%s) %s: the server %s; log %s%s%s", s->label, sec->g->name,
                 row, s->exit_note, s->log_path, tail[0] ? ": " : "", tail);
    if (c->state != CELL_FAIL)
        g_failures++;
    free(c->err);
    c->err = strdup(buf);
    c->state = CELL_FAIL;
    server_stop(s);
    server_setup(s, s->kind, sec, cfg);
    if (server_spawn(s) < 0 || server_ready(s) < 0) {
        snprintf(buf, sizeof(buf), "could not restart after a crash: %s", g_err);
        sec->skip[s->kind] = strdup(buf);
    }
}

/* Marks the via-proxy rows' cells of ours failed with g_err (the first one counts). */
static void proxy_rows_fail(struct section *sec, const char *what)
{
    struct row *r = &sec->rows[R_RATE32_PX];
    if (r->c[SRV_OURS].state != CELL_FAIL)
        cell_fail(&r->c[SRV_OURS], what, sec, r->name);
    sec->rows[R_CPU32_PX].c[SRV_OURS].state = CELL_FAIL;
    sec->rows[R_PXCPU32_PX].c[SRV_OURS].state = CELL_FAIL;
}

/*
 * The via-proxy rows: the 32-connection, 64 B round trips of R_RATE32_S, but every connection
 * goes to a `ddp-rendezvous proxy` in front of our server, which the root sees as one
 * multiplexed connection. Ours: the best rate, the least root CPU and the least proxy CPU per
 * round trip over cfg->reps runs. The torch cells hold torch's direct figures of the same run
 * (torch has no proxy): the anchor of the ratio. A proxy of its own for the rows, stopped after.
 */
static void run_proxy_rows(struct section *sec, const struct config *cfg)
{
    struct server *root = &sec->srv[SRV_OURS], *px = &sec->proxy;
    struct row *rate = &sec->rows[R_RATE32_PX], *cpu = &sec->rows[R_CPU32_PX];
    struct row *pxcpu = &sec->rows[R_PXCPU32_PX];

    if (!side_on(sec, SRV_OURS))
        return;
    server_setup(px, SRV_PROXY, sec, cfg);
    if (server_spawn(px) < 0 || server_ready(px) < 0) {
        proxy_rows_fail(sec, px->label);
        server_stop(px);
        return;
    }
    for (unsigned rep = 0; rep < cfg->reps && rate->c[SRV_OURS].state != CELL_FAIL; rep++) {
        struct rt_result res = {0};
        int rc = rt_multi(px->port, root->pid, px->pid, sec->g, 32, 64, &cfg->t, &res);
        if (rc < 0) {
            proxy_rows_fail(sec, px->label);
        } else {
            if (rate->c[SRV_OURS].state != CELL_OK || res.rate > rate->c[SRV_OURS].v) {
                rate->c[SRV_OURS].state = CELL_OK;
                rate->c[SRV_OURS].v = res.rate;
            }
            if (res.srv_us >= 0 &&
                (cpu->c[SRV_OURS].state != CELL_OK || res.srv_us < cpu->c[SRV_OURS].v)) {
                cpu->c[SRV_OURS].state = CELL_OK;
                cpu->c[SRV_OURS].v = res.srv_us;
            }
            if (res.px_us >= 0 &&
                (pxcpu->c[SRV_OURS].state != CELL_OK || res.px_us < pxcpu->c[SRV_OURS].v)) {
                pxcpu->c[SRV_OURS].state = CELL_OK;
                pxcpu->c[SRV_OURS].v = res.px_us;
            }
        }
        if (!server_alive(px) && rate->c[SRV_OURS].state != CELL_FAIL) {
            snprintf(g_err, sizeof(g_err), "the proxy %s; log %s", px->exit_note, px->log_path);
            proxy_rows_fail(sec, px->label);
        }
        check_alive(sec, root, &rate->c[SRV_OURS], rate->name, cfg);
        if (cfg->verbose && rc == 0)
            fprintf(stderr,
                    "  %s %-14s %-26s run %u: %.0f/s, root CPU %.1f us, proxy CPU %.1f us, "
                    "client CPU %.1f us per round trip\n",
                    sec->g->name, px->label, rate->name, rep + 1, res.rate, res.srv_us, res.px_us,
                    res.cli_us);
        else if (cfg->verbose)
            fprintf(stderr, "  %s %-14s %-26s run %u: FAILED\n", sec->g->name, px->label,
                    rate->name, rep + 1);
    }
    server_stop(px);
    if (px->exit_note[0])
        add_note("%s: on shutdown the proxy %s; log kept: %s", px->label, px->exit_note,
                 px->log_path);
    /* The anchor: torch's direct figures, copied without their error text (reported once). */
    rate->c[SRV_TORCH].state = sec->rows[R_RATE32_S].c[SRV_TORCH].state;
    rate->c[SRV_TORCH].v = sec->rows[R_RATE32_S].c[SRV_TORCH].v;
    cpu->c[SRV_TORCH].state = sec->rows[R_CPU32_S].c[SRV_TORCH].state;
    cpu->c[SRV_TORCH].v = sec->rows[R_CPU32_S].c[SRV_TORCH].v;
}

/*
 * Runs one section's rows on its servers, which main() has started (ready_pair()). Stops them
 * at the end.
 */
void run_section(struct section *sec, const struct config *cfg)
{
    struct server *srv = sec->srv;
    static const size_t sizes[2] = {64, MIB};

    if (!side_on(sec, 0) && !side_on(sec, 1))
        return;

    /*
     * Round trips: each row runs `reps` times, alternating the servers, and keeps each server's
     * best run, so a burst of unrelated load on the shared cores hits both alike and is
     * filtered out. A failed run ends that server's row.
     */
    for (int i = 0; i < 4; i++) {
        unsigned nconn = i < 2 ? 1 : 32;
        size_t vsize = sizes[i % 2];
        struct row *r = &sec->rows[i];
        struct row *u = nconn == 1 ? &sec->rows[R_US1_S + i] : NULL;
        struct row *cpu = &sec->rows[R_CPU1_S + i];
        if (!(cfg->rows & (ROW_RATE1 << i)))
            continue;
        for (unsigned rep = 0; rep < cfg->reps; rep++) {
            for (int k = 0; k < 2; k++) {
                struct rt_result res = {0};
                int rc;
                if (!side_on(sec, k) || r->c[k].state == CELL_FAIL)
                    continue;
                if (nconn == 1)
                    rc = rt_single(srv[k].port, srv[k].pid, sec->g, vsize, &cfg->t, &res);
                else
                    rc = rt_multi(srv[k].port, srv[k].pid, -1, sec->g, nconn, vsize, &cfg->t, &res);
                if (rc < 0) {
                    cell_fail(&r->c[k], srv[k].label, sec, r->name);
                    if (u)
                        u->c[k].state = CELL_FAIL;
                    cpu->c[k].state = CELL_FAIL;
                } else {
                    if (r->c[k].state != CELL_OK || res.rate > r->c[k].v) {
                        r->c[k].state = CELL_OK;
                        r->c[k].v = res.rate;
                        if (u) {
                            u->c[k].state = CELL_OK;
                            u->c[k].v = res.us;
                        }
                    }
                    /* CPU per round trip: least of the runs, independently of the rate. */
                    if (res.srv_us >= 0 &&
                        (cpu->c[k].state != CELL_OK || res.srv_us < cpu->c[k].v)) {
                        cpu->c[k].state = CELL_OK;
                        cpu->c[k].v = res.srv_us;
                    }
                }
                check_alive(sec, &srv[k], &r->c[k], r->name, cfg);
                if (cfg->verbose && rc == 0)
                    fprintf(stderr,
                            "  %s %-14s %-26s run %u: %.0f/s, server CPU %.1f us, "
                            "client CPU %.1f us per round trip\n",
                            sec->g->name, srv[k].label, r->name, rep + 1, res.rate, res.srv_us,
                            res.cli_us);
                else if (cfg->verbose)
                    fprintf(stderr, "  %s %-14s %-26s run %u: FAILED\n", sec->g->name, srv[k].label,
                            r->name, rep + 1);
            }
        }
    }

    if (sec->g == &gen_modern && cfg->proxy_rows && (cfg->rows & ROW_RATE32))
        run_proxy_rows(sec, cfg);

    /* Barriers: a fresh pair of servers per N, except in --quick (distinct keys suffice). */
    for (unsigned b = 0; b < cfg->nbarriers && (cfg->rows & ROW_BARRIER); b++) {
        struct row *r = &sec->rows[R_BARRIER0 + b];
        unsigned n = cfg->barrier_n[b];
        struct rlimit rl;
        if (!cfg->quick) {
            stop_pair(sec);
            spawn_pair(sec, cfg);
            if (ready_pair(sec) == 0)
                return;
        }
        getrlimit(RLIMIT_NOFILE, &rl);
        for (int k = 0; k < 2; k++) {
            int rc;
            if (!side_on(sec, k))
                continue;
            if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < (rlim_t)n + 64) {
                r->c[k].state = CELL_SKIP;
                continue;
            }
            rc = barrier_run(srv[k].port, srv[k].pid, sec->g, n, &r->c[k].br);
            if (rc == 0) {
                r->c[k].state = CELL_OK;
                r->c[k].v = r->c[k].br.total_s;
            } else {
                cell_fail(&r->c[k], srv[k].label, sec, r->name);
            }
            check_alive(sec, &srv[k], &r->c[k], r->name, cfg);
            if (cfg->verbose && rc == 0)
                fprintf(stderr,
                        "  %s %-14s barrier %5u: all connected %.3f s, all ADDs %.3f s, "
                        "released %.3f s, listen queue drops %lld; CPU: server %.3f s, "
                        "client %.3f s\n",
                        sec->g->name, srv[k].label, n, r->c[k].br.connected_s, r->c[k].br.added_s,
                        r->c[k].br.total_s, r->c[k].br.listen_drops, r->c[k].br.srv_cpu_s,
                        r->c[k].br.cli_cpu_s);
        }
    }
    stop_pair(sec);
}
