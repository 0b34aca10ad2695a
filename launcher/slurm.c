/*
 * Slurm host-list expansion for ddprun's Slurm defaults (the master address is the first host
 * of the step's SLURM_STEP_NODELIST).
 *
 * The grammar is Slurm's: a list is comma-separated items; an item is literal text with bracket
 * groups in it; a group is comma-separated numbers and LO-HI ranges. A range prints its numbers
 * zero-padded to the width of LO, as Slurm does. An item with several groups expands to their
 * product. Deliberately not handled: Slurm's multi-dimensional (BlueGene-style) "[000x133]"
 * boxes and hostlist files. No I/O; the only side effect is allocation.
 */
#include "slurm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DIGITS 9 /* keeps every number below 10^9, far from overflow */

struct range {
    unsigned long lo, hi;
    int width; /* digits of LO as written: the zero padding */
};

/* One bracket group of an item: [first, first + count) in the item's range array. */
struct group {
    size_t first, count;
};

struct hostvec {
    char **v;
    size_t n, cap;
};

static int push(struct hostvec *hv, const char *s, size_t len)
{
    if (hv->n == hv->cap) {
        size_t cap = hv->cap ? 2 * hv->cap : 16;
        char **v = realloc(hv->v, cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        hv->v = v;
        hv->cap = cap;
    }
    char *copy = malloc(len + 1);
    if (!copy)
        return -ENOMEM;
    memcpy(copy, s, len);
    copy[len] = '\0';
    hv->v[hv->n++] = copy;
    return 0;
}

/* Parses a run of 1..MAX_DIGITS decimal digits at *p, advancing *p past them. */
static int parse_number(const char **p, const char *end, unsigned long *out, int *width)
{
    const char *s = *p;
    unsigned long v = 0;
    int w = 0;
    while (s < end && *s >= '0' && *s <= '9') {
        if (++w > MAX_DIGITS)
            return -EINVAL;
        v = v * 10 + (unsigned long)(*s - '0');
        s++;
    }
    if (w == 0)
        return -EINVAL;
    *p = s;
    *out = v;
    *width = w;
    return 0;
}

/*
 * Parses the inside of one bracket group, [s, end), appending its ranges to *ranges. Adds the
 * number of hosts the group stands for to *count.
 */
static int parse_group(const char *s, const char *end, struct range **ranges, size_t *nranges,
                       size_t *cap, unsigned long *count)
{
    if (s == end)
        return -EINVAL;
    for (;;) {
        struct range r;
        int w;
        if (parse_number(&s, end, &r.lo, &r.width) < 0)
            return -EINVAL;
        r.hi = r.lo;
        if (s < end && *s == '-') {
            s++;
            if (parse_number(&s, end, &r.hi, &w) < 0)
                return -EINVAL;
            if (r.hi < r.lo)
                return -EINVAL;
        }
        if (*nranges == *cap) {
            size_t ncap = *cap ? 2 * *cap : 8;
            struct range *nr = realloc(*ranges, ncap * sizeof *nr);
            if (!nr)
                return -ENOMEM;
            *ranges = nr;
            *cap = ncap;
        }
        (*ranges)[(*nranges)++] = r;
        *count += r.hi - r.lo + 1;
        if (*count > DDPRUN_SLURM_MAX_HOSTS)
            return -EINVAL;
        if (s == end)
            return 0;
        if (*s != ',')
            return -EINVAL;
        s++;
    }
}

/*
 * Expands one item, [s, end), which holds no top-level comma, onto hv. The odometer below walks
 * the product of the item's groups with the rightmost group varying fastest.
 */
static int expand_item(const char *s, const char *end, struct hostvec *hv)
{
    struct range *ranges = NULL;
    struct group *groups = NULL;
    size_t nranges = 0, rcap = 0, ngroups = 0, total = 1;
    size_t *ri = NULL;         /* per group: current range */
    unsigned long *val = NULL; /* per group: current number */
    char *buf = NULL;
    int rc = -EINVAL;

    if (s == end)
        goto out;
    /* At most one group per '[' in the item. */
    size_t maxgroups = 0;
    for (const char *p = s; p < end; p++)
        maxgroups += *p == '[';
    groups = calloc(maxgroups ? maxgroups : 1, sizeof *groups);
    ri = calloc(maxgroups ? maxgroups : 1, sizeof *ri);
    val = calloc(maxgroups ? maxgroups : 1, sizeof *val);
    buf = malloc((size_t)(end - s) + maxgroups * (MAX_DIGITS + 1) + 1);
    if (!groups || !ri || !val || !buf) {
        rc = -ENOMEM;
        goto out;
    }
    for (const char *p = s; p < end; p++) {
        if (*p == ']')
            goto out; /* unbalanced */
        if (*p != '[')
            continue;
        const char *close = memchr(p, ']', (size_t)(end - p));
        if (!close || memchr(p + 1, '[', (size_t)(close - p - 1)))
            goto out; /* unclosed or nested */
        unsigned long count = 0;
        groups[ngroups].first = nranges;
        rc = parse_group(p + 1, close, &ranges, &nranges, &rcap, &count);
        if (rc < 0)
            goto out;
        rc = -EINVAL;
        groups[ngroups].count = nranges - groups[ngroups].first;
        if (total > DDPRUN_SLURM_MAX_HOSTS / count)
            goto out;
        total *= count;
        ngroups++;
        p = close;
    }
    if (hv->n + total > DDPRUN_SLURM_MAX_HOSTS)
        goto out;

    for (size_t g = 0; g < ngroups; g++) {
        ri[g] = 0;
        val[g] = ranges[groups[g].first].lo;
    }
    for (;;) {
        size_t len = 0, g = 0;
        for (const char *p = s; p < end; p++) {
            if (*p != '[') {
                buf[len++] = *p;
                continue;
            }
            const struct range *r = &ranges[groups[g].first + ri[g]];
            len += (size_t)sprintf(buf + len, "%0*lu", r->width, val[g]);
            p = memchr(p, ']', (size_t)(end - p));
            g++;
        }
        rc = push(hv, buf, len);
        if (rc < 0)
            goto out;
        /* Advance the odometer: the rightmost group first. */
        size_t k = ngroups;
        while (k > 0) {
            struct group *gr = &groups[k - 1];
            if (val[k - 1] < ranges[gr->first + ri[k - 1]].hi) {
                val[k - 1]++;
                break;
            }
            if (ri[k - 1] + 1 < gr->count) {
                ri[k - 1]++;
                val[k - 1] = ranges[gr->first + ri[k - 1]].lo;
                break;
            }
            ri[k - 1] = 0;
            val[k - 1] = ranges[gr->first].lo;
            k--;
        }
        if (k == 0)
            break;
    }
    rc = 0;
out:
    free(ranges);
    free(groups);
    free(ri);
    free(val);
    free(buf);
    return rc;
}

int ddprun_slurm_expand(const char *list, char ***hosts, size_t *n)
{
    struct hostvec hv = {0};
    int rc = -EINVAL;

    if (!list || !hosts || !n || !*list)
        return -EINVAL;
    const char *item = list;
    int depth = 0;
    for (const char *p = list;; p++) {
        if (*p == '[')
            depth++;
        else if (*p == ']')
            depth--;
        if (depth < 0 || depth > 1)
            goto out;
        if (*p == '\0' || (*p == ',' && depth == 0)) {
            if (depth != 0)
                goto out;
            rc = expand_item(item, p, &hv);
            if (rc < 0)
                goto out;
            rc = -EINVAL;
            if (*p == '\0')
                break;
            item = p + 1;
        }
    }
    *hosts = hv.v;
    *n = hv.n;
    return 0;
out:
    ddprun_slurm_free(hv.v, hv.n);
    return rc;
}

void ddprun_slurm_free(char **hosts, size_t n)
{
    if (!hosts)
        return;
    for (size_t i = 0; i < n; i++)
        free(hosts[i]);
    free(hosts);
}
