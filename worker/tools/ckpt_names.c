/*
 * ckpt_names.c: ddp-ckpt's tensor names (ckpt_names.h): renaming rules, the nn.Sequential
 * mapping and the check that tensors make ddp-train's MLP or GPT. Every change is built into a
 * new list first and swapped in only once it is complete, so that a failure leaves the names
 * as they were. No I/O.
 *
 * Not here: which model ddp-train builds (model_mlp.c, model_gpt.c): what the MLP row
 * registers (units "fc<l+1>", each a weight (out, in) and a bias (out)) is restated in
 * names_fit_mlp(), and tests/tools/ddp_ckpt_cli.sh checks the two agree on checkpoints
 * ddp-train writes; the GPT's (gpt.h) in names_fit_gpt(), checked likewise by
 * tests/trainer/gpt.sh.
 */
#include "ckpt_names.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(char *err, size_t cap, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t cap, int rc, const char *fmt, ...)
{
    if (err && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, cap, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* Frees fresh[0..n) and the array. */
static void drop(char **fresh, int n)
{
    for (int i = 0; fresh && i < n; i++)
        free(fresh[i]);
    free(fresh);
}

/* Replaces names[0..n) by fresh[0..n) (taking it) and returns 0. */
static int swap_in(char **names, char **fresh, int n)
{
    for (int i = 0; i < n; i++) {
        free(names[i]);
        names[i] = fresh[i];
    }
    free(fresh);
    return 0;
}

/* "PREFIX" + rest, malloc'ed; prefix is plen bytes. */
static char *join(const char *prefix, size_t plen, const char *rest)
{
    size_t rlen = strlen(rest);
    char *s = malloc(plen + rlen + 1);
    if (s) {
        memcpy(s, prefix, plen);
        memcpy(s + plen, rest, rlen + 1);
    }
    return s;
}

/* Does `name` start with the module path old[0..olen): equal to it, or it and a dot? Returns
 * the rest after it ("" or ".weight"), or NULL. */
static const char *under(const char *name, const char *old, size_t olen)
{
    if (strncmp(name, old, olen) != 0 || (name[olen] != '\0' && name[olen] != '.'))
        return NULL;
    return name + olen;
}

int names_rename_check(const char *spec, char *err, size_t cap)
{
    const char *p = spec;
    for (;;) {
        size_t len = strcspn(p, ",");
        const char *eq = memchr(p, '=', len);
        if (!eq || eq == p || memchr(eq + 1, '=', len - (size_t)(eq + 1 - p)))
            return fail(err, cap, -EINVAL,
                        "--rename: '%.*s' is not OLD=NEW (OLD a name or the module path it "
                        "begins with, NEW its replacement, maybe empty)",
                        (int)len, p);
        if (!p[len])
            return 0;
        p += len + 1;
    }
}

int names_rename(char **names, int n, const char *spec, char *err, size_t cap)
{
    int rc = names_rename_check(spec, err, cap);
    if (rc < 0)
        return rc;
    char **fresh = calloc((size_t)n + 1, sizeof *fresh);
    if (!fresh)
        return -ENOMEM;
    bool *done = calloc((size_t)n + 1, sizeof *done);
    if (!done) {
        free(fresh);
        return -ENOMEM;
    }
    for (const char *p = spec; rc == 0;) {
        size_t len = strcspn(p, ","), olen = (size_t)((const char *)memchr(p, '=', len) - p);
        const char *to = p + olen + 1;
        size_t tlen = len - olen - 1;
        int hits = 0;
        for (int i = 0; i < n && rc == 0; i++) {
            const char *rest = done[i] ? NULL : under(names[i], p, olen);
            if (!rest)
                continue;
            if (tlen == 0 && !*rest) {
                rc = fail(err, cap, -EEXIST, "--rename %.*s: '%s' would have no name left",
                          (int)len, p, names[i]);
                break;
            }
            if (tlen == 0)
                rest++; /* "module=": the dot goes with the prefix */
            if (!(fresh[i] = join(to, tlen, rest)))
                rc = -ENOMEM;
            done[i] = true;
            hits++;
        }
        if (rc == 0 && hits == 0)
            rc = fail(err, cap, -ENOENT, "--rename %.*s: no tensor is named '%.*s' or '%.*s.*'",
                      (int)len, p, (int)olen, p, (int)olen, p);
        if (!p[len])
            break;
        p += len + 1;
    }
    for (int i = 0; i < n && rc == 0; i++)
        if (!done[i] && !(fresh[i] = strdup(names[i])))
            rc = -ENOMEM;
    for (int i = 0; i < n && rc == 0; i++)
        for (int j = i + 1; j < n && rc == 0; j++)
            if (!strcmp(fresh[i], fresh[j]))
                rc = fail(err, cap, -EEXIST, "--rename: '%s' and '%s' would both be '%s'", names[i],
                          names[j], fresh[i]);
    free(done);
    if (rc < 0) {
        drop(fresh, n);
        return rc;
    }
    return swap_in(names, fresh, n);
}

/* Reads a decimal index at s (no sign, no leading zero but "0") ending at a '.': returns it and
 * sets *rest to the dot, or -1. */
static long index_at(const char *s, const char **rest)
{
    if (s[0] < '0' || s[0] > '9' || (s[0] == '0' && s[1] != '.'))
        return -1;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end != '.' || !end[1] || v < 0 || v > 1000000)
        return -1;
    *rest = end;
    return v;
}

int names_to_torch(char **names, int n, char *err, size_t cap)
{
    char **fresh = calloc((size_t)n + 1, sizeof *fresh);
    if (!fresh)
        return -ENOMEM;
    for (int i = 0; i < n; i++) {
        const char *rest;
        long k = strncmp(names[i], "fc", 2) ? -1 : index_at(names[i] + 2, &rest);
        if (k < 1) {
            drop(fresh, i);
            return fail(err, cap, -EINVAL,
                        "--names torch: tensor '%s' is not one of ddp-train's MLP layers "
                        "(fcK.weight, fcK.bias)",
                        names[i]);
        }
        char idx[24];
        int len = snprintf(idx, sizeof idx, "%ld", 2 * (k - 1));
        if (!(fresh[i] = join(idx, (size_t)len, rest))) {
            drop(fresh, i);
            return -ENOMEM;
        }
    }
    return swap_in(names, fresh, n);
}

static int by_value(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

int names_from_torch(char **names, int n, char *err, size_t cap)
{
    long *idx = calloc((size_t)n + 1, sizeof *idx), *sorted = calloc((size_t)n + 1, sizeof *idx);
    char **fresh = calloc((size_t)n + 1, sizeof *fresh);
    int rc = idx && sorted && fresh ? 0 : -ENOMEM;
    const char **rest = calloc((size_t)n + 1, sizeof *rest);
    if (!rest)
        rc = -ENOMEM;
    for (int i = 0; i < n && rc == 0; i++)
        if ((sorted[i] = idx[i] = index_at(names[i], &rest[i])) < 0)
            rc = fail(err, cap, -EINVAL,
                      "--names torch: tensor '%s' is not an nn.Sequential module's "
                      "(INDEX.weight, INDEX.bias)",
                      names[i]);
    int distinct = 0;
    if (rc == 0) {
        qsort(sorted, (size_t)n, sizeof *sorted, by_value);
        for (int i = 0; i < n; i++)
            if (i == 0 || sorted[i] != sorted[distinct - 1])
                sorted[distinct++] = sorted[i];
        for (int k = 1; k < distinct && rc == 0; k++)
            if (sorted[k] != sorted[k - 1] + 2)
                rc = fail(err, cap, -EINVAL,
                          "--names torch: modules %ld and %ld hold parameters; ddp-train's MLP "
                          "has one activation module between two Linear layers (0, 2, 4, ...)",
                          sorted[k - 1], sorted[k]);
    }
    for (int i = 0; i < n && rc == 0; i++) {
        long k = (long)((idx[i] - sorted[0]) / 2 + 1);
        char unit[24];
        int len = snprintf(unit, sizeof unit, "fc%ld", k);
        if (!(fresh[i] = join(unit, (size_t)len, rest[i])))
            rc = -ENOMEM;
    }
    free(idx);
    free(sorted);
    free(rest);
    if (rc < 0) {
        drop(fresh, n);
        return rc;
    }
    return swap_in(names, fresh, n);
}

/* Appends "'name'" to the list in err (at most a few, then a count); `count` is how many so far. */
static void list_name(char *err, size_t cap, int count, const char *name)
{
    size_t len = strlen(err);
    if (count < 6)
        snprintf(err + len, cap - len, "%s'%s'", count ? ", " : "", name);
}

int names_fit_mlp(const names_tensor *ts, int n, int max_linear, int classes, int *in_dim,
                  int *hidden, int *layers, char *err, size_t cap)
{
    char scratch[1];
    if (!err || !cap) {
        err = scratch;
        cap = sizeof scratch;
    }
    /* The names first: fcK.weight or fcK.bias, K from 1 to max_linear. */
    const names_tensor **w = calloc((size_t)max_linear + 1, sizeof *w);
    const names_tensor **b = calloc((size_t)max_linear + 1, sizeof *b);
    if (!w || !b) {
        free(w);
        free(b);
        return fail(err, cap, -ENOMEM, "out of memory");
    }
    int bad = 0, L = 0;
    err[0] = '\0';
    for (int i = 0; i < n; i++) {
        const char *rest = NULL;
        long k = strncmp(ts[i].name, "fc", 2) ? -1 : index_at(ts[i].name + 2, &rest);
        const names_tensor ***slot = NULL;
        if (k >= 1 && k <= max_linear)
            slot = !strcmp(rest, ".weight") ? &w : !strcmp(rest, ".bias") ? &b : NULL;
        if (!slot || (*slot)[k]) {
            list_name(err, cap, bad++, ts[i].name);
            continue;
        }
        (*slot)[k] = &ts[i];
        L = k > L ? (int)k : L;
    }
    int rc = -EINVAL;
    if (bad) {
        size_t len = strlen(err);
        snprintf(err + len, cap - len,
                 "%s: not ddp-train's names (its MLP's layers are fc1 ... fcL, each a weight "
                 "and a bias)",
                 bad > 6 ? " and more" : "");
        goto out;
    }
    for (int k = 1; k <= L; k++)
        if (!w[k] || !b[k]) {
            fail(err, cap, 0, "fc%d.%s is missing (fc1 ... fc%d each need a weight and a bias)", k,
                 w[k] ? "bias" : "weight", L);
            goto out;
        }
    if (L < 2) {
        fail(err, cap, 0, "%d linear layer%s: ddp-train's MLP has at least 2 (--layers 1)", L,
             L == 1 ? "" : "s");
        goto out;
    }
    int64_t in = -1, width = -1;
    for (int k = 1; k <= L; k++) {
        const names_tensor *W = w[k], *B = b[k];
        if (W->ndim != 2 || B->ndim != 1 || B->shape[0] != W->shape[0]) {
            fail(err, cap, 0, "fc%d: the weight must be (out, in) and the bias (out)", k);
            goto out;
        }
        if (k > 1 && W->shape[1] != in) {
            fail(err, cap, 0,
                 "fc%d.weight takes %" PRId64 " inputs, fc%d gives %" PRId64 " outputs", k,
                 W->shape[1], k - 1, in);
            goto out;
        }
        if (k < L && width >= 0 && W->shape[0] != width) {
            fail(err, cap, 0,
                 "fc%d has %" PRId64 " outputs, fc1 %" PRId64
                 ": ddp-train's hidden layers are all --hidden wide",
                 k, W->shape[0], width);
            goto out;
        }
        if (k == 1)
            width = W->shape[0];
        in = W->shape[0];
    }
    if (in != classes) {
        fail(err, cap, 0, "fc%d has %" PRId64 " outputs; ddp-train's MLP has %d (the classes)", L,
             in, classes);
        goto out;
    }
    *in_dim = (int)w[1]->shape[1];
    *hidden = (int)width;
    *layers = L - 1;
    rc = 0;
out:
    free(w);
    free(b);
    return rc;
}

/* A block's tensors (gpt.h), each (rows, cols) in units of C (cols 0: a vector). */
static const struct {
    const char *name;
    int rows, cols;
} gpt_block[] = {
    {"ln_1.weight", 1, 0},      {"ln_1.bias", 1, 0},          {"attn.c_attn.weight", 3, 1},
    {"attn.c_attn.bias", 3, 0}, {"attn.c_proj.weight", 1, 1}, {"attn.c_proj.bias", 1, 0},
    {"ln_2.weight", 1, 0},      {"ln_2.bias", 1, 0},          {"mlp.c_fc.weight", 4, 1},
    {"mlp.c_fc.bias", 4, 0},    {"mlp.c_proj.weight", 1, 4},  {"mlp.c_proj.bias", 1, 0},
};
#define GPT_BLOCK_N ((int)(sizeof gpt_block / sizeof gpt_block[0]))

/* The tensor named `name` among ts[0..n), or NULL. */
static const names_tensor *find_tensor(const names_tensor *ts, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(ts[i].name, name))
            return &ts[i];
    return NULL;
}

/* Is t (rows, cols) (cols 0: a vector of rows)? */
static bool shaped(const names_tensor *t, int64_t rows, int64_t cols)
{
    return cols ? t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols
                : t->ndim == 1 && t->shape[0] == rows;
}

int names_fit_gpt(const names_tensor *ts, int n, int vocab, int *layers, int *width, int *seq_len,
                  char *err, size_t cap)
{
    const names_tensor *wte = find_tensor(ts, n, "emb.wte"), *wpe = find_tensor(ts, n, "emb.wpe");
    if (!wte || !wpe)
        return fail(err, cap, -EINVAL,
                    "emb.%s is missing (ddp-train's GPT: emb.wte, emb.wpe, "
                    "h0.* ... h<L-1>.*, ln_f.weight, ln_f.bias)",
                    wte ? "wpe" : "wte");
    if (wte->ndim != 2 || wte->shape[0] != vocab || wpe->ndim != 2 ||
        wpe->shape[1] != wte->shape[1])
        return fail(err, cap, -EINVAL,
                    "emb.wte must be (%d, C) and emb.wpe (T, C): ddp-train's GPT is byte-level",
                    vocab);
    int64_t C = wte->shape[1];
    int L = 0, seen = 2;
    char name[64];
    for (;; L++) {
        snprintf(name, sizeof name, "h%d.%s", L, gpt_block[0].name);
        if (!find_tensor(ts, n, name))
            break;
        for (int k = 0; k < GPT_BLOCK_N; k++) {
            snprintf(name, sizeof name, "h%d.%s", L, gpt_block[k].name);
            const names_tensor *t = find_tensor(ts, n, name);
            if (!t)
                return fail(err, cap, -EINVAL, "%s is missing", name);
            if (!shaped(t, gpt_block[k].rows * C, gpt_block[k].cols * C))
                return fail(err, cap, -EINVAL,
                            "%s has the wrong shape for width %" PRId64 " (emb.wte's)", name, C);
        }
        seen += GPT_BLOCK_N;
    }
    const names_tensor *lw = find_tensor(ts, n, "ln_f.weight"),
                       *lb = find_tensor(ts, n, "ln_f.bias");
    if (L < 1 || !lw || !lb || !shaped(lw, C, 0) || !shaped(lb, C, 0))
        return fail(err, cap, -EINVAL,
                    L < 1 ? "no block h0: ddp-train's GPT has at least one (--layers 1)"
                          : "ln_f.weight and ln_f.bias (C) are missing or of the wrong shape");
    seen += 2;
    if (seen != n)
        return fail(err, cap, -EINVAL,
                    "%d tensor%s not ddp-train's GPT's (it has %d: emb.wte, emb.wpe, %d blocks "
                    "h0 ... h%d of %d, ln_f)",
                    n - seen, n - seen == 1 ? " is" : "s are", seen, L, L - 1, GPT_BLOCK_N);
    *layers = L;
    *width = (int)C;
    *seq_len = (int)wpe->shape[0];
    return 0;
}
