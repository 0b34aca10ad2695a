/*
 * report.c: what store-bench tells: each section's table on stdout (figures, ratio, target),
 * the optional JSON file (--json), and the CPU time the machine and this process spent, from
 * which main() reports how much unrelated processes took from the shared cores.
 *
 * Not here: the measurements (section.c); nothing here changes a result.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "store-bench.h"

/* 1234567.8 -> "1,234,568" */
static void fmt_thousands(char *buf, size_t size, double v)
{
    char digits[32];
    size_t n, j = 0;
    snprintf(digits, sizeof(digits), "%.0f", v);
    n = strlen(digits);
    for (size_t i = 0; i < n && j + 2 < size; i++) {
        buf[j++] = digits[i];
        if (n - i - 1 > 0 && (n - i - 1) % 3 == 0)
            buf[j++] = ',';
    }
    buf[j] = '\0';
}

static void fmt_cell(char *buf, size_t size, const struct cell *c, enum unit u)
{
    switch (c->state) {
    case CELL_NONE:
        snprintf(buf, size, "-");
        return;
    case CELL_FAIL:
        snprintf(buf, size, "FAILED");
        return;
    case CELL_SKIP:
        snprintf(buf, size, "skipped");
        return;
    }
    if (u == U_RATE)
        fmt_thousands(buf, size, c->v);
    else if (u == U_US || u == U_CPU_US)
        snprintf(buf, size, "%.1f", c->v);
    else
        snprintf(buf, size, "%.3f", c->v);
}

/* ours/torch for rates, torch/ours for times; 0 when either is missing. */
static double row_ratio(const struct row *r)
{
    const struct cell *o = &r->c[SRV_OURS], *t = &r->c[SRV_TORCH];
    if (o->state != CELL_OK || t->state != CELL_OK || o->v <= 0 || t->v <= 0)
        return 0;
    return r->unit == U_RATE ? o->v / t->v : t->v / o->v;
}

/* The row's goal and, once both sides ran, whether ours met it. The ratio rows compare like
   with like (row_ratio() is above 1 when ours is better): 2x the round trips, half the CPU. */
static void fmt_target(char *buf, size_t size, const struct row *r)
{
    const struct cell *o = &r->c[SRV_OURS];
    double ratio = row_ratio(r);
    const char *goal = r->target == TARGET_RATE_2X ? ">= 2x"
                       : r->target == TARGET_CPU_HALF
                           ? (r->via_proxy ? "<= 0.5x torch direct" : "<= 0.5x torch")
                       : r->target == TARGET_BARRIER ? "<= 0.5 s"
                                                     : NULL;
    bool known = r->target == TARGET_BARRIER ? o->state == CELL_OK : ratio > 0;
    bool met = r->target == TARGET_BARRIER ? o->v <= 0.5 : ratio >= 2;
    buf[0] = '\0';
    if (goal)
        snprintf(buf, size, "%s%s", goal, !known ? "" : met ? ": met" : ": MISSED");
}

/*
 * The footnote of the via-proxy rows, when they ran: what their columns hold, and the CPU of
 * root and proxy together, so that moving work from the root to the proxy hides nothing.
 */
static void print_proxy_note(const struct section *sec)
{
    const struct cell *root = &sec->rows[R_CPU32_PX].c[SRV_OURS];
    const struct cell *px = &sec->rows[R_PXCPU32_PX].c[SRV_OURS];
    const struct cell *direct = &sec->rows[R_CPU32_S].c[SRV_OURS];
    const struct cell *torch = &sec->rows[R_CPU32_S].c[SRV_TORCH];

    if (sec->rows[R_RATE32_PX].c[SRV_OURS].state == CELL_NONE)
        return;
    printf("  * via proxy: the 32 connections go to one `ddp-rendezvous proxy`, which holds one\n"
           "    multiplexed connection to our server (the root); the torch column is torch's\n"
           "    direct figure from this run (torch has no proxy), so the ratio is root via proxy\n"
           "    vs torch direct.");
    if (root->state == CELL_OK && px->state == CELL_OK) {
        printf(" Root + proxy: %.1f us/op", root->v + px->v);
        if (direct->state == CELL_OK)
            printf(" (ours direct %.1f", direct->v);
        if (torch->state == CELL_OK)
            printf("%storch direct %.1f", direct->state == CELL_OK ? ", " : " (", torch->v);
        printf("%s", direct->state == CELL_OK || torch->state == CELL_OK ? ")" : "");
        printf(".");
    }
    printf("\n");
}

void print_section(const struct section *sec, const struct config *cfg)
{
    const char *torch_name = sec->g == &gen_legacy ? "torch 1.13" : "torch 2.x";
    printf("\n%s protocol: ddp-rendezvous vs %s\n", sec->g->name,
           sec->torch_version[0] ? sec->torch_version : torch_name);
    for (int k = 0; k < 2; k++) {
        if (sec->run[k] && sec->skip[k])
            printf("  %s skipped: %s\n", k == SRV_OURS ? "ddp-rendezvous" : torch_name,
                   sec->skip[k]);
    }
    printf("  %-40s %15s %15s %13s  %s\n", "measurement", "ddp-rendezvous", "torch", "ratio",
           "target");
    for (unsigned i = 0; i < sec->nrows; i++) {
        const struct row *r = &sec->rows[i];
        char a[32], b[32], ratio[32] = "-", tgt[48];
        double x = row_ratio(r);
        if (r->c[SRV_OURS].state == CELL_NONE && r->c[SRV_TORCH].state == CELL_NONE)
            continue; /* not selected (--rows) */
        fmt_cell(a, sizeof(a), &r->c[SRV_OURS], r->unit);
        fmt_cell(b, sizeof(b), &r->c[SRV_TORCH], r->unit);
        if (x > 0)
            snprintf(ratio, sizeof(ratio),
                     r->unit == U_RATE     ? "%.2fx%s"
                     : r->unit == U_CPU_US ? "%.2fx less%s"
                                           : "%.2fx faster%s",
                     x, r->via_proxy ? "*" : "");
        if (r->via_proxy && r->c[SRV_TORCH].state == CELL_OK)
            strcat(b, "*"); /* torch's direct figure: the footnote says so */
        fmt_target(tgt, sizeof(tgt), r);
        printf("  %-40s %15s %15s %13s  %s\n", r->name, a, b, ratio, tgt);
    }
    print_proxy_note(sec);
    (void)cfg;
}

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

int write_json(const char *path, const struct section *secs, int nsec, const struct config *cfg)
{
    static const char *const units[] = {"round_trips_per_s", "us", "server_cpu_us_per_round_trip",
                                        "s"};
    FILE *f = fopen(path, "w");
    bool first = true;
    if (!f)
        return -errno;
    fprintf(f, "{\"quick\": %s, \"cpus\": %ld, \"results\": [\n", cfg->quick ? "true" : "false",
            sysconf(_SC_NPROCESSORS_ONLN));
    for (int s = 0; s < nsec; s++) {
        for (unsigned i = 0; i < secs[s].nrows; i++) {
            const struct row *r = &secs[s].rows[i];
            bool barrier = r->unit == U_SEC;
            double x = row_ratio(r);
            fprintf(f, "%s  {\"generation\": \"%s\", \"measurement\": ", first ? "" : ",\n",
                    secs[s].g->name);
            json_str(f, r->name);
            fprintf(f, ", \"unit\": \"%s\", \"via_proxy\": %s, \"torch_version\": ", units[r->unit],
                    r->via_proxy ? "true" : "false");
            json_str(f, secs[s].torch_version);
            fprintf(f, ", \"ddp_rendezvous\": ");
            if (r->c[SRV_OURS].state == CELL_OK)
                fprintf(f, "%.6g", r->c[SRV_OURS].v);
            else
                fprintf(f, "null");
            fprintf(f, ", \"torch\": ");
            if (r->c[SRV_TORCH].state == CELL_OK)
                fprintf(f, "%.6g", r->c[SRV_TORCH].v);
            else
                fprintf(f, "null");
            if (x > 0)
                fprintf(f, ", \"ratio\": %.4g", x);
            else
                fprintf(f, ", \"ratio\": null");
            if (barrier) {
                for (int k = 0; k < 2; k++) {
                    const struct cell *c = &r->c[k];
                    if (c->state != CELL_OK)
                        continue;
                    fprintf(f,
                            ", \"%s_phases\": {\"all_connected_s\": %.6g, \"all_added_s\": "
                            "%.6g, \"listen_drops\": %lld, \"server_cpu_s\": %.6g, "
                            "\"client_cpu_s\": %.6g}",
                            k == SRV_OURS ? "ddp_rendezvous" : "torch", c->br.connected_s,
                            c->br.added_s, c->br.listen_drops, c->br.srv_cpu_s, c->br.cli_cpu_s);
                }
            }
            for (int k = 0; k < 2; k++) {
                if (r->c[k].err) {
                    fprintf(f, ", \"%s_error\": ", k == SRV_OURS ? "ddp_rendezvous" : "torch");
                    json_str(f, r->c[k].err);
                }
            }
            fprintf(f, "}");
            first = false;
        }
    }
    fprintf(f, "\n], \"notes\": [");
    for (int i = 0; i < g_nnotes; i++) {
        fprintf(f, "%s", i ? ", " : "");
        json_str(f, g_notes[i]);
    }
    fprintf(f, "]}\n");
    return fclose(f) == 0 ? 0 : -errno;
}

/*
 * CPU time spent by the whole machine (all CPUs, busy states only) and by this process and its
 * reaped children, in seconds. Their difference over a run is what unrelated processes took
 * from the shared cores (approximately: softirq work done for our sockets lands there too).
 */
double machine_busy_s(void)
{
    unsigned long long v[8] = {0};
    FILE *f = fopen("/proc/stat", "r");
    int n;
    if (!f)
        return -1;
    n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4],
               &v[5], &v[6], &v[7]);
    fclose(f);
    if (n < 7)
        return -1;
    /* user, nice, system, irq, softirq; not idle, iowait or steal */
    return (double)(v[0] + v[1] + v[2] + v[5] + v[6]) / (double)sysconf(_SC_CLK_TCK);
}

double own_cpu_s(void)
{
    struct rusage self, kids;
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_CHILDREN, &kids);
    return (double)(self.ru_utime.tv_sec + self.ru_stime.tv_sec + kids.ru_utime.tv_sec +
                    kids.ru_stime.tv_sec) +
           (double)(self.ru_utime.tv_usec + self.ru_stime.tv_usec + kids.ru_utime.tv_usec +
                    kids.ru_stime.tv_usec) /
               1e6;
}
