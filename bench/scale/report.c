/*
 * report.c: what scale-bench tells: a table per mode (a row per metric, a column per node
 * count), how each metric grows with N (the exponent of a least-squares power-law fit, and the
 * best of the linear, n log n and quadratic models), the projection to SB_PROJECT_NODES nodes
 * on paper, the root's requests by operation per phase, and the optional JSON file.
 *
 * Not here: the measurements; nothing here changes a result.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "proto.h"
#include "scale-bench.h"

const char *const sb_model_names[3] = {"linear", "n log n", "quadratic"};

static double model_f(int model, double x)
{
    return model == 0 ? x : model == 1 ? x * log(x) : x * x;
}

int sb_fit(const double *x, const double *y, int n, struct sb_fit *f)
{
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!(y[i] > 0) || !(x[i] > 1))
            continue;
        double lx = log(x[i]), ly = log(y[i]);
        sx += lx, sy += ly, sxx += lx * lx, sxy += lx * ly;
        k++;
    }
    if (k < 2 || sxx * k - sx * sx <= 0)
        return -EINVAL;
    double b = (k * sxy - sx * sy) / (k * sxx - sx * sx);
    f->exponent = b;
    f->coef = exp((sy - b * sx) / k);
    /* y = c f(x): c by least squares, the model by the smallest relative residual. */
    double best = INFINITY;
    for (int m = 0; m < 3; m++) {
        double num = 0, den = 0;
        for (int i = 0; i < n; i++) {
            if (!(y[i] > 0) || !(x[i] > 1))
                continue;
            double fx = model_f(m, x[i]);
            num += y[i] * fx / (y[i] * y[i]);
            den += fx * fx / (y[i] * y[i]);
        }
        double c = num / den, res = 0;
        for (int i = 0; i < n; i++) {
            if (!(y[i] > 0) || !(x[i] > 1))
                continue;
            double r = (y[i] - c * model_f(m, x[i])) / y[i];
            res += r * r;
        }
        if (res < best) {
            best = res;
            f->model = m;
            f->model_c = c;
        }
    }
    return 0;
}

static void fmt_value(char *buf, size_t cap, double v, const char *unit)
{
    if (isnan(v))
        snprintf(buf, cap, "-");
    else if (strcmp(unit, "s") == 0)
        snprintf(buf, cap, v < 10 ? "%.3f" : v < 1000 ? "%.1f" : "%.0f", v);
    else if (strcmp(unit, "MB") == 0)
        snprintf(buf, cap, v < 10 ? "%.3f" : "%.1f", v);
    else if (strcmp(unit, "%") == 0)
        snprintf(buf, cap, "%.1f", v);
    else if (v >= 1e7)
        snprintf(buf, cap, "%.3g", v);
    else
        snprintf(buf, cap, "%.0f", v);
}

/* The fit of metric k over the successful points; -EINVAL when there is none. */
static int metric_fit(const struct sb_point *pts, int n, int k, struct sb_fit *f)
{
    double x[SB_MAX_POINTS], y[SB_MAX_POINTS];
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (!pts[i].ok || k >= pts[i].nmetrics)
            continue;
        x[m] = pts[i].nodes;
        y[m] = pts[i].m[k].v;
        m++;
    }
    return sb_fit(x, y, m, f);
}

/* The first successful point, whose metric list names the rows; NULL if none. */
static const struct sb_point *model_point(const struct sb_point *pts, int n)
{
    for (int i = 0; i < n; i++)
        if (pts[i].ok)
            return &pts[i];
    return NULL;
}

static void print_ops(const struct sb_point *p)
{
    for (int k = 0; k < p->nphases; k++) {
        const struct sb_phase *ph = &p->ph[k];
        if (!ph->d.have_status)
            continue;
        printf("    N=%-5d %-8s", p->nodes, ph->name);
        /* The operations by count, largest first, those above 0. */
        bool used[SB_MAX_OPS] = {false};
        for (;;) {
            int best = -1;
            for (int i = 0; i < RDZV_OP_COUNT && i < SB_MAX_OPS; i++)
                if (!used[i] && ph->d.ops[i] > 0 && (best < 0 || ph->d.ops[i] > ph->d.ops[best]))
                    best = i;
            if (best < 0)
                break;
            used[best] = true;
            printf(" %s %lld", rdzv__op_name((enum rdzv_op)best), (long long)ph->d.ops[best]);
        }
        printf("\n");
    }
}

void sb_report_mode(const struct sb_config *cfg, const struct sb_point *pts, int n)
{
    enum sb_mode mode = pts[0].mode;
    printf("\n%s%s", sb_mode_names[mode], mode == SB_LIGHT ? "" : " (real processes)");
    if (mode == SB_LIGHT)
        printf(", %d ranks per node, proxy %s, barrier %s", cfg->ranks, cfg->proxy ? "on" : "off",
               cfg->barrier_add ? "add+wait" : "rdzv_barrier");
    else if (mode != SB_TORCHRUN)
        printf(", 1 rank per node, proxy %s", cfg->proxy ? "on" : "off");
    else
        printf(", 1 rank per node");
    printf("\n");
    for (int i = 0; i < n; i++)
        if (!pts[i].ok)
            printf("  N=%d %s: %s\n", pts[i].nodes, pts[i].skipped ? "skipped" : "FAILED",
                   pts[i].err);
    const struct sb_point *mp = model_point(pts, n);
    if (!mp)
        return;
    char buf[32];
    printf("  %-30s", "metric");
    for (int i = 0; i < n; i++) {
        snprintf(buf, sizeof buf, "N=%d", pts[i].nodes);
        printf(" %10s", buf);
    }
    snprintf(buf, sizeof buf, "%dx%d", SB_PROJECT_NODES, mode == SB_LIGHT ? cfg->ranks : 1);
    printf("  %6s %-9s %10s\n", "exp", "best fit", buf);
    for (int k = 0; k < mp->nmetrics; k++) {
        const struct sb_metric *m = &mp->m[k];
        char label[64];
        snprintf(label, sizeof label, "%s%s%s%s", m->name, m->unit[0] ? " (" : "", m->unit,
                 m->unit[0] ? ")" : "");
        printf("  %-30s", label);
        for (int i = 0; i < n; i++) {
            fmt_value(buf, sizeof buf, pts[i].ok && k < pts[i].nmetrics ? pts[i].m[k].v : NAN,
                      m->unit);
            printf(" %10s", buf);
        }
        struct sb_fit f;
        if (metric_fit(pts, n, k, &f) == 0) {
            fmt_value(buf, sizeof buf, f.coef * pow(SB_PROJECT_NODES, f.exponent), m->unit);
            printf("  %6.2f %-9s %10s\n", f.exponent, sb_model_names[f.model], buf);
        } else {
            printf("  %6s %-9s %10s\n", "-", "-", "-");
        }
    }
    printf("  (exp: power-law exponent fitted over N; last column: a projection of that fit,"
           " on paper, not a measurement)\n");
    printf("  root requests by operation, per phase:\n");
    for (int i = 0; i < n; i++)
        if (pts[i].ok)
            print_ops(&pts[i]);
}

static json_t *num_or_null(double v)
{
    return isnan(v) ? json_null() : json_real(v);
}

static json_t *stats_json(const struct sb_stats *s)
{
    json_t *o = json_object();
    json_t *ops = json_object();
    for (int i = 0; i < RDZV_OP_COUNT && i < SB_MAX_OPS; i++)
        if (s->ops[i])
            json_object_set_new(ops, rdzv__op_name((enum rdzv_op)i), json_integer(s->ops[i]));
    json_object_set_new(o, "connections", s->conns < 0 ? json_null() : json_integer(s->conns));
    json_object_set_new(o, "accepted", s->accepted < 0 ? json_null() : json_integer(s->accepted));
    json_object_set_new(o, "requests", s->requests < 0 ? json_null() : json_integer(s->requests));
    json_object_set_new(o, "bytes_in", s->bytes_in < 0 ? json_null() : json_integer(s->bytes_in));
    json_object_set_new(o, "bytes_out",
                        s->bytes_out < 0 ? json_null() : json_integer(s->bytes_out));
    json_object_set_new(o, "cpu_s", s->cpu_ns < 0 ? json_null() : json_real(s->cpu_ns / 1e9));
    json_object_set_new(o, "ops", ops);
    return o;
}

int sb_report_json(const struct sb_config *cfg, struct sb_point pts[SB_NMODES][SB_MAX_POINTS],
                   const char *path)
{
    json_t *root = json_object();
    json_object_set_new(root, "ranks_per_node", json_integer(cfg->ranks));
    json_object_set_new(root, "proxy", json_boolean(cfg->proxy));
    json_object_set_new(root, "barrier", json_string(cfg->barrier_add ? "add" : "rdzv_barrier"));
    json_object_set_new(root, "heartbeat_timeout_s", json_real(cfg->dead_after_s));
    json_object_set_new(root, "last_call_timeout_s", json_real(cfg->last_call_s));
    json_t *modes = json_array();
    for (int md = 0; md < SB_NMODES; md++) {
        int n = cfg->npoints[md];
        if (!n)
            continue;
        json_t *jm = json_object();
        json_object_set_new(jm, "mode", json_string(sb_mode_names[md]));
        json_t *jpts = json_array();
        for (int i = 0; i < n; i++) {
            const struct sb_point *p = &pts[md][i];
            json_t *jp = json_object();
            json_object_set_new(jp, "nodes", json_integer(p->nodes));
            json_object_set_new(jp, "ranks", json_integer(p->ranks));
            json_object_set_new(jp, "ok", json_boolean(p->ok));
            if (!p->ok)
                json_object_set_new(jp, p->skipped ? "skipped" : "error", json_string(p->err));
            json_t *jmet = json_object();
            for (int k = 0; k < p->nmetrics; k++)
                json_object_set_new(jmet, p->m[k].name, num_or_null(p->m[k].v));
            json_object_set_new(jp, "metrics", jmet);
            json_t *jph = json_array();
            for (int k = 0; k < p->nphases; k++) {
                json_t *o = json_object();
                json_object_set_new(o, "name", json_string(p->ph[k].name));
                json_object_set_new(o, "wall_s", json_real(p->ph[k].wall_s));
                json_object_set_new(o, "root", stats_json(&p->ph[k].d));
                json_array_append_new(jph, o);
            }
            json_object_set_new(jp, "phases", jph);
            json_array_append_new(jpts, jp);
        }
        json_object_set_new(jm, "points", jpts);
        json_t *jfits = json_object();
        const struct sb_point *mp = model_point(pts[md], n);
        for (int k = 0; mp && k < mp->nmetrics; k++) {
            struct sb_fit f;
            if (metric_fit(pts[md], n, k, &f) < 0)
                continue;
            json_object_set_new(jfits, mp->m[k].name,
                                json_pack("{s:f, s:s, s:f}", "exponent", f.exponent, "best_model",
                                          sb_model_names[f.model], "projection",
                                          f.coef * pow(SB_PROJECT_NODES, f.exponent)));
        }
        json_object_set_new(jm, "fits", jfits);
        json_object_set_new(jm, "projection_nodes", json_integer(SB_PROJECT_NODES));
        json_array_append_new(modes, jm);
    }
    json_object_set_new(root, "modes", modes);
    int rc = json_dump_file(root, path, JSON_INDENT(2)) == 0 ? 0 : -EIO;
    json_decref(root);
    return rc;
}
