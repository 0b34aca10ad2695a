/*
 * Node-level rendezvous protocols of ddprun's agents, run through the store: static (node ranks
 * given), dynamic (c10d-style elastic: ranks in join order, closed at max_nodes or after a last
 * call), heartbeats, the first-failure report of a round, the exit barrier and the clearing of
 * the workers' keys between attempts. The key layout (every key the agents write) is documented
 * in noderdzv.h; the failure report's JSON is failure.c's.
 *
 * Deliberately not here: sockets, threads, sleeps, spawning, printing. The only I/O is calls on
 * the caller's rdzv_client (and, for the clearing, on the agent's own rdzv_server), so every wait
 * is the store's WAIT (bounded by a timeout). Nothing polls but the exit barrier, which looks at
 * the failure key between slices of its WAIT; the last-call timer is a WAIT on the closing key
 * with the last-call timeout.
 *
 * Invariants: every key of a round sits under "<prefix>/round_<n>/", so rounds never mix. Values
 * that decide membership are written once and never changed (compare_set with an empty expected
 * value, or ADD counters whose results order the nodes), so every node that reads them derives
 * the same answer. Out-parameters are written only on success.
 */
#include "noderdzv.h"

#include "monoclock.h"
#include "fmt.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* A failed store call: the client's own account of it follows what we were doing. */
static int store_err(rdzv_client *c, char *err, size_t errlen, int rc, const char *what, int round)
{
    return fmt_err(err, errlen, rc, "rendezvous round %d: %s: %s (%s)", round, what,
                   rdzv_strerror(rc), rdzv_client_last_error(c));
}

/*
 * Returns "<prefix>/round_<round>/<rest>" with `rest` formatted from fmt, allocated (free()),
 * or NULL when out of memory.
 */
static char *round_key(const char *prefix, int round, const char *fmt, ...)
{
    char rest[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(rest, sizeof rest, fmt, ap);
    va_end(ap);
    assert(n >= 0 && (size_t)n < sizeof rest);
    (void)n;
    size_t len = strlen(prefix) + strlen(rest) + 32;
    char *k = malloc(len);
    if (k)
        snprintf(k, len, "%s/round_%d/%s", prefix, round, rest);
    return k;
}

/*
 * The n keys "<prefix>/round_<round>/<dir>/<i>" as one rdzv_rank_keys() allocation (free with
 * rdzv_free()), or NULL when out of memory.
 */
static char **key_array(const char *prefix, int round, const char *dir, int n)
{
    char *base = round_key(prefix, round, "%s", dir);
    char **keys = NULL;
    if (base && rdzv_rank_keys(base, n, &keys) < 0)
        keys = NULL;
    free(base);
    return keys;
}

static void free_values(void **values, int n)
{
    if (!values)
        return;
    for (int i = 0; i < n; i++)
        rdzv_free(values[i]);
    free(values);
}

/*
 * Parses a decimal integer in [min, max] from the start of a value of `nbytes` bytes; *end (may
 * be NULL) receives the number of bytes it took. Returns false on anything else (an empty value
 * included); a value with trailing bytes is accepted only when `end` is given.
 */
static bool parse_int(const void *value, size_t nbytes, int64_t min, int64_t max, int64_t *out,
                      size_t *end)
{
    char buf[32];
    size_t n = nbytes < sizeof buf - 1 ? nbytes : sizeof buf - 1;
    memcpy(buf, value, n);
    buf[n] = '\0';
    if (n == 0 || !((buf[0] >= '0' && buf[0] <= '9') || buf[0] == '-'))
        return false;
    char *e = NULL;
    errno = 0;
    long long v = strtoll(buf, &e, 10);
    if (errno || e == buf || v < min || v > max)
        return false;
    if (end)
        *end = (size_t)(e - buf);
    else if ((size_t)(e - buf) != nbytes)
        return false;
    *out = v;
    return true;
}

/* A timeout in seconds as rdzv_wait()'s milliseconds: < 0 stays -1 (the client's timeout). */
static int to_ms(double s)
{
    if (s < 0)
        return -1;
    double ms = s * 1000.0;
    return ms >= (double)INT_MAX ? INT_MAX : (int)(ms + 0.999);
}

static bool bad_prefix(const char *prefix)
{
    return !prefix || strlen(prefix) > DDPRUN_RDZV_MAX_PREFIX;
}

/* ------------------------------------------------------------------------------------------ */
/* Layout: every node's rank offset and the world size, computed once per round                */
/* ------------------------------------------------------------------------------------------ */

/*
 * Parses every node's nproc from its record (values[i], lens[i], node rank order): the whole
 * value for a static round, the leading "<nproc> " of "<nproc> <node_id>" for a dynamic one
 * (`records`). Fills offsets[0..n-1] with the prefix sums and *world with the total. Returns 0,
 * or -EPROTO with *bad the node rank of a malformed record, or -1 when the world size would pass
 * INT_MAX.
 */
static int layout_compute(void *const *values, const size_t *lens, int n, bool records,
                          int *offsets, int *world, int *bad)
{
    int64_t sum = 0;
    for (int i = 0; i < n; i++) {
        int64_t np = 0;
        size_t end = 0;
        const char *v = values[i];
        bool ok = v && (records ? parse_int(v, lens[i], 1, INT_MAX, &np, &end) && end < lens[i] &&
                                      v[end] == ' '
                                : parse_int(v, lens[i], 1, INT_MAX, &np, NULL));
        if (!ok) {
            *bad = i;
            return -EPROTO;
        }
        offsets[i] = (int)sum;
        sum += np;
        if (sum > INT_MAX) {
            *bad = -1;
            return -EPROTO;
        }
    }
    *world = (int)sum;
    return 0;
}

/* The sentence for layout_compute()'s -EPROTO. */
static int layout_error(char *err, size_t errlen, bool records, int round, int bad)
{
    const char *kind = records ? "dynamic" : "static";
    if (bad < 0)
        return fmt_err(err, errlen, -EPROTO, "%s rendezvous round %d: the world size exceeds %d",
                       kind, round, INT_MAX);
    if (records)
        return fmt_err(err, errlen, -EPROTO,
                       "dynamic rendezvous round %d: malformed record for node rank %d", round,
                       bad);
    return fmt_err(err, errlen, -EPROTO,
                   "static rendezvous round %d: node rank %d published a malformed nproc", round,
                   bad);
}

/*
 * Publishes the layout keys "<base>/<i>" of nodes 0..n-1 in one MULTI_SET: "<offset> <world>"
 * from offsets[] and world or, when `failure` is not NULL, "E<errno> <failure>" (code < 0, the
 * error every node then reports, with that sentence) for every node. Returns 0, -ENOMEM or a
 * negative errno from the store.
 */
static int layout_publish(rdzv_client *c, const char *base, int n, const int *offsets, int world,
                          int code, const char *failure)
{
    char **keys = NULL;
    int rc = rdzv_rank_keys(base, n, &keys);
    if (rc < 0)
        return rc;
    size_t flen = failure ? strlen(failure) + 16 : 0;
    char *text = malloc(failure ? flen : (size_t)n * 24);
    const void **vals = malloc((size_t)n * sizeof *vals);
    size_t *lens = malloc((size_t)n * sizeof *lens);
    rc = -ENOMEM;
    if (text && vals && lens) {
        char *p = text;
        int m = failure ? snprintf(text, flen, "E%d %s", -code, failure) : 0;
        for (int i = 0; i < n; i++) {
            if (!failure) {
                p += m + (i > 0);
                m = sprintf(p, "%d %d", offsets[i], world);
            }
            vals[i] = p;
            lens[i] = (size_t)m;
        }
        rc = rdzv_multi_set(c, (const char *const *)keys, vals, lens, (size_t)n);
    }
    rdzv_free(keys);
    free(text);
    free(vals);
    free(lens);
    return rc;
}

/*
 * Takes a node's layout value (v, len): fills *offset and *world from "<offset> <world>" and
 * returns 0, or returns the error an "E<errno> <sentence>" value carries, its sentence in err,
 * or -EPROTO for anything else.
 */
static int layout_take(const char *v, size_t len, bool records, int round, int *offset, int *world,
                       char *err, size_t errlen)
{
    int64_t a = 0, b = 0;
    size_t end = 0;
    if (len > 1 && v[0] == 'E') {
        if (parse_int(v + 1, len - 1, 1, 4095, &a, &end) && 1 + end < len && v[1 + end] == ' ')
            return fmt_err(err, errlen, -(int)a, "%.*s", (int)(len - 2 - end), v + 2 + end);
    } else if (parse_int(v, len, 0, INT_MAX, &a, &end) && end < len && v[end] == ' ' &&
               parse_int(v + end + 1, len - end - 1, 1, INT_MAX, &b, NULL) && a < b) {
        *offset = (int)a;
        *world = (int)b;
        return 0;
    }
    return fmt_err(err, errlen, -EPROTO, "%s rendezvous round %d: malformed layout record",
                   records ? "dynamic" : "static", round);
}

/* The sentence for a static round that timed out with nodes missing: their node ranks. */
static int static_timeout(const bool *missing, int nnodes, int round, double timeout_s, char *err,
                          size_t errlen)
{
    char what[64], msg[384];
    snprintf(what, sizeof what, "did not show up within %g s", timeout_s);
    if (fmt_missing_ranks(missing, nnodes, "node rank", what, msg, sizeof msg) == 0)
        /* Every node arrived between the wait's end and the checks: still a timeout. */
        snprintf(msg, sizeof msg, "every node showed up, but only after %g s", timeout_s);
    return fmt_err(err, errlen, -ETIMEDOUT, "static rendezvous round %d: %s", round, msg);
}

/*
 * The layout of node `me` of n for a node that does not compute it: waits up to timeout_s for its
 * key "<layout_base>/<me>" and takes it. When the key does not appear in time (a node never
 * published its record, or the node computing the layout stopped before publishing it), looks
 * at every node's record "<rec_base>/<i>" once: with all of them there it computes the layout
 * itself; otherwise it returns -ETIMEDOUT naming the absent nodes. Returns 0 or the error, its
 * sentence in err: -ETIMEDOUT, -EPROTO, the error published for the round, -ENOMEM, or a negative
 * errno from the store.
 */
static int layout_await(rdzv_client *c, const char *layout_base, const char *rec_base, int n,
                        int me, bool records, double timeout_s, int round, int *offset, int *world,
                        char *err, size_t errlen)
{
    char key[DDPRUN_RDZV_MAX_PREFIX + 128];
    snprintf(key, sizeof key, "%s/%d", layout_base, me);
    void *v = NULL;
    size_t len = 0;
    int rc = rdzv_wait_get(c, key, to_ms(timeout_s), &v, &len);
    if (rc == 0) {
        rc = layout_take(v, len, records, round, offset, world, err, errlen);
        rdzv_free(v);
        return rc;
    }
    if (rc != -ETIMEDOUT)
        return store_err(c, err, errlen, rc, "waiting for the layout", round);

    void **values = calloc((size_t)n, sizeof *values);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    int *offsets = calloc((size_t)n, sizeof *offsets);
    bool *missing = calloc((size_t)n, sizeof *missing);
    rc = -ENOMEM;
    if (values && lens && offsets && missing) {
        rc = rdzv_gather(c, rec_base, n, 1, values, lens, missing);
        bool all = rc == 0 || rc == -ETIMEDOUT;
        for (int i = 0; rc == -ETIMEDOUT && i < n; i++)
            all = all && !missing[i];
        if (all) {
            int bad = 0;
            rc = layout_compute(values, lens, n, records, offsets, world, &bad);
            if (rc == 0)
                *offset = offsets[me];
            else
                layout_error(err, errlen, records, round, bad);
        } else if (rc == -ETIMEDOUT && !records) {
            static_timeout(missing, n, round, timeout_s, err, errlen);
        } else {
            store_err(c, err, errlen, rc, "reading the members' records", round);
        }
    } else {
        fmt_err(err, errlen, rc, "%s rendezvous round %d: out of memory",
                records ? "dynamic" : "static", round);
    }
    free_values(values, n);
    free(lens);
    free(offsets);
    free(missing);
    return rc;
}

/*
 * The layout of every node, computed by the one node of the round that leads: reads the n
 * records under rec_base once (waiting up to timeout_s for them), computes every node's offset
 * and the world size and publishes them under layout_base (layout_publish()). A malformed record,
 * a world size past INT_MAX or a record that did not appear in time is published instead, so
 * that every node reports the same error. Fills *offset and *world for node `me`. Returns 0 or the
 * error, its sentence in err.
 */
static int layout_lead(rdzv_client *c, const char *rec_base, const char *layout_base, int n, int me,
                       bool records, double timeout_s, int round, int *offset, int *world,
                       char *err, size_t errlen)
{
    void **values = calloc((size_t)n, sizeof *values);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    int *offsets = calloc((size_t)n, sizeof *offsets);
    int rc = -ENOMEM, bad = 0;
    if (!values || !lens || !offsets) {
        fmt_err(err, errlen, rc, "%s rendezvous round %d: out of memory",
                records ? "dynamic" : "static", round);
        goto out;
    }
    rc = rdzv_gather(c, rec_base, n, to_ms(timeout_s), values, lens, NULL);
    if (rc < 0)
        store_err(c, err, errlen, rc,
                  records ? "reading the members' records" : "reading every node's nproc", round);
    else if ((rc = layout_compute(values, lens, n, records, offsets, world, &bad)) < 0)
        layout_error(err, errlen, records, round, bad);
    if (rc == 0 || rc == -ETIMEDOUT || rc == -EPROTO) {
        int prc = layout_publish(c, layout_base, n, offsets, *world, rc, rc < 0 ? err : NULL);
        if (prc < 0 && rc == 0)
            rc = store_err(c, err, errlen, prc, "publishing the layout", round);
    }
    if (rc == 0)
        *offset = offsets[me];
out:
    free_values(values, n);
    free(lens);
    free(offsets);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Static rendezvous                                                                           */
/* ------------------------------------------------------------------------------------------ */

int ddprun_rdzv_static(rdzv_client *c, const char *prefix, int round, int nnodes, int node_rank,
                       int nproc, double timeout_s, ddprun_assignment *out, char *err,
                       size_t errlen)
{
    if (err && errlen > 0)
        err[0] = '\0';
    if (!c || bad_prefix(prefix) || !out || round < 0 || nnodes < 1 ||
        nnodes > DDPRUN_RDZV_MAX_NODES || node_rank < 0 || node_rank >= nnodes || nproc < 1)
        return fmt_err(err, errlen, -EINVAL,
                       "static rendezvous: invalid argument (round %d, nnodes %d, node rank %d, "
                       "nproc %d)",
                       round, nnodes, node_rank, nproc);

    char *key = NULL, *nproc_base = NULL, *layout_base = NULL, *arrived_key = NULL;
    int64_t arrived = 0;
    char num[32];
    void *opened = NULL; /* the node count the round was opened with */
    size_t opened_len = 0;
    int64_t claims = 0;
    int rc = -ENOMEM;

    /* Every node must agree on the node count, or the prefix sums would differ. */
    key = round_key(prefix, round, "static/nnodes");
    if (!key)
        goto oom;
    snprintf(num, sizeof num, "%d", nnodes);
    rc = rdzv_set_once(c, key, num, strlen(num), &opened, &opened_len);
    if (rc < 0) {
        store_err(c, err, errlen, rc, "opening the round", round);
        goto out;
    }
    if (rc == 0) {
        rc = fmt_err(err, errlen, -EINVAL,
                     "static rendezvous round %d: this node (rank %d) says nnodes=%d but the "
                     "round was opened with nnodes=%.*s",
                     round, node_rank, nnodes, (int)(opened_len > 16 ? 16 : opened_len),
                     (const char *)opened);
        goto out;
    }

    /* Claim the node rank: two nodes with one --node-rank would silently corrupt the sums. */
    free(key);
    key = round_key(prefix, round, "static/claim/%d", node_rank);
    if (!key)
        goto oom;
    rc = rdzv_add(c, key, 1, &claims);
    if (rc < 0) {
        store_err(c, err, errlen, rc, "claiming the node rank", round);
        goto out;
    }
    if (claims != 1) {
        rc = fmt_err(err, errlen, -EEXIST,
                     "static rendezvous round %d: node rank %d was claimed by another node "
                     "(check --node-rank on every node)",
                     round, node_rank);
        goto out;
    }

    /*
     * Publish nproc under static/nproc/<node rank>, then count this node in static/arrived. The
     * node whose ADD completes the count reads every record once and publishes each node's
     * layout; the others wait for their own layout key only.
     */
    free(key);
    key = round_key(prefix, round, "static/nproc/%d", node_rank);
    nproc_base = round_key(prefix, round, "static/nproc");
    layout_base = round_key(prefix, round, "static/layout");
    arrived_key = round_key(prefix, round, "static/arrived");
    if (!key || !nproc_base || !layout_base || !arrived_key)
        goto oom;
    snprintf(num, sizeof num, "%d", nproc);
    rc = rdzv_set(c, key, num, strlen(num));
    if (rc == 0)
        rc = rdzv_add(c, arrived_key, 1, &arrived);
    if (rc < 0) {
        store_err(c, err, errlen, rc, "publishing nproc", round);
        goto out;
    }
    int offset = 0, world = 0;
    if (arrived == nnodes) {
        rc = layout_lead(c, nproc_base, layout_base, nnodes, node_rank, false, timeout_s, round,
                         &offset, &world, err, errlen);
    } else {
        rc = layout_await(c, layout_base, nproc_base, nnodes, node_rank, false, timeout_s, round,
                          &offset, &world, err, errlen);
    }
    if (rc < 0)
        goto out;
    out->round = round;
    out->node_rank = node_rank;
    out->nnodes = nnodes;
    out->rank_offset = offset;
    out->world_size = world;
    rc = 0;
    goto out;
oom:
    rc = fmt_err(err, errlen, -ENOMEM, "static rendezvous round %d: out of memory", round);
out:
    rdzv_free(opened);
    free(key);
    free(nproc_base);
    free(layout_base);
    free(arrived_key);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Dynamic rendezvous                                                                          */
/* ------------------------------------------------------------------------------------------ */

/* The keys of one dynamic round that are not per node. */
typedef struct dyn_keys {
    char *config, *count, *quorum, *closed, *waiting;
} dyn_keys;

static void dyn_keys_free(dyn_keys *k)
{
    free(k->config);
    free(k->count);
    free(k->quorum);
    free(k->closed);
    free(k->waiting);
}

/*
 * Closes the round unless it is closed: stores "<n>" (or "aborted <n>") in dyn/closed, n being
 * `joined`, or the join count now when `joined` < 0, capped at max_nodes. Whoever's compare_set
 * lands first decides; the others' calls change nothing. Returns 0 or a negative errno from the
 * store.
 */
static int dyn_close(rdzv_client *c, const dyn_keys *k, int max_nodes, int64_t joined, bool abort)
{
    if (joined < 0) {
        int rc = rdzv_add(c, k->count, 0, &joined);
        if (rc < 0)
            return rc;
    }
    if (joined > max_nodes)
        joined = max_nodes;
    char v[48];
    snprintf(v, sizeof v, "%s%" PRId64, abort ? "aborted " : "", joined);
    int rc = rdzv_set_once(c, k->closed, v, strlen(v), NULL, NULL);
    return rc < 0 ? rc : 0;
}

/* Reads dyn/closed (which exists): the participant count and whether the round was aborted. */
static int dyn_read_closed(rdzv_client *c, const dyn_keys *k, int max_nodes, int64_t *n,
                           bool *aborted)
{
    void *v = NULL;
    size_t len = 0;
    int rc = rdzv_get(c, k->closed, &v, &len);
    if (rc < 0)
        return rc;
    const char *s = v;
    static const char ab[] = "aborted ";
    *aborted = len > sizeof ab - 1 && memcmp(s, ab, sizeof ab - 1) == 0;
    size_t skip = *aborted ? sizeof ab - 1 : 0;
    if (!parse_int(s + skip, len - skip, 0, max_nodes, n, NULL))
        rc = -EPROTO;
    rdzv_free(v);
    return rc;
}

/* A node that came too late: counted in dyn/waiting so that the members can restart. */
static int dyn_late(rdzv_client *c, const dyn_keys *k, int round, const char *why, char *err,
                    size_t errlen)
{
    int64_t waiting = 0;
    int rc = rdzv_add(c, k->waiting, 1, &waiting);
    if (rc < 0)
        return store_err(c, err, errlen, rc, "registering as a waiting node", round);
    return fmt_err(err, errlen, -EAGAIN,
                   "dynamic rendezvous round %d: %s; this node is waiting (%" PRId64
                   " waiting): retry with round %d once the members restart",
                   round, why, waiting, round + 1);
}

/*
 * The assignment of slot `slot` among the n participants: the node in slot 0 reads the n records
 * ("<nproc> <node_id>", waiting up to join_timeout_s for them) once and publishes every slot's
 * layout under dyn/layout; the others wait for their own layout key (layout_await()).
 */
static int dyn_assign(rdzv_client *c, const char *prefix, int round, int n, int slot,
                      double join_timeout_s, ddprun_assignment *out, char *err, size_t errlen)
{
    char *rec_base = round_key(prefix, round, "dyn/node");
    char *layout_base = round_key(prefix, round, "dyn/layout");
    int offset = 0, world = 0;
    int rc = -ENOMEM;
    if (!rec_base || !layout_base)
        fmt_err(err, errlen, rc, "dynamic rendezvous round %d: out of memory", round);
    else if (slot == 0)
        rc = layout_lead(c, rec_base, layout_base, n, slot, true, join_timeout_s, round, &offset,
                         &world, err, errlen);
    else
        rc = layout_await(c, layout_base, rec_base, n, slot, true, join_timeout_s, round, &offset,
                          &world, err, errlen);
    if (rc == 0) {
        out->round = round;
        out->node_rank = slot;
        out->nnodes = n;
        out->rank_offset = offset;
        out->world_size = world;
    }
    free(rec_base);
    free(layout_base);
    return rc;
}

/*
 * The protocol, per node:
 *  1. compare_set dyn/config "<min>:<max>": every node must open the round alike.
 *  2. ADD dyn/count: the result r is the join order; slot = r - 1. A slot >= max_nodes is late.
 *  3. SET dyn/node/<slot>; the node that took slot min-1 sets dyn/quorum; the node that took
 *     slot max-1 closes the round at max_nodes.
 *  4. WAIT dyn/quorum (join timeout). On timeout, if the count is still below min_nodes, abort
 *     the round (close it as "aborted <count>") and wake the others through dyn/quorum.
 *  5. WAIT dyn/closed (last-call timeout). On timeout, close it with the count now (capped).
 *  6. Read dyn/closed: n. slot >= n: late. Aborted: timed out. Otherwise slot 0 waits for the
 *     records of slots 0..n-1 (join timeout), reads them once and MULTI_SETs dyn/layout/<i> for
 *     every slot (or the error every node reports); every other slot waits for its own layout
 *     key (join timeout) and, if it does not come, reads the records once itself
 *     (layout_await()).
 * The close always happens after the quorum key is set by whoever closes, and dyn/closed is
 * written once, so steps 5 and 6 cannot block past the round's close.
 */
int ddprun_rdzv_dynamic(rdzv_client *c, const char *prefix, int round, int min_nodes, int max_nodes,
                        const char *node_id, int nproc, double join_timeout_s,
                        double last_call_timeout_s, ddprun_assignment *out, char *err,
                        size_t errlen)
{
    if (err && errlen > 0)
        err[0] = '\0';
    if (!c || bad_prefix(prefix) || !out || !node_id || !node_id[0] || strlen(node_id) > 4096 ||
        round < 0 || min_nodes < 1 || max_nodes < min_nodes || max_nodes > DDPRUN_RDZV_MAX_NODES ||
        nproc < 1 || !(last_call_timeout_s >= 0))
        return fmt_err(err, errlen, -EINVAL,
                       "dynamic rendezvous: invalid argument (round %d, nnodes %d:%d, nproc %d)",
                       round, min_nodes, max_nodes, nproc);

    dyn_keys k = {0};
    char *node_key = NULL, *record = NULL;
    char num[48];
    int64_t joined = 0, n = 0;
    bool aborted = false;
    int join_ms = to_ms(join_timeout_s);
    int rc = -ENOMEM;

    k.config = round_key(prefix, round, "dyn/config");
    k.count = round_key(prefix, round, "dyn/count");
    k.quorum = round_key(prefix, round, "dyn/quorum");
    k.closed = round_key(prefix, round, "dyn/closed");
    k.waiting = round_key(prefix, round, "dyn/waiting");
    if (!k.config || !k.count || !k.quorum || !k.closed || !k.waiting)
        goto oom;

    snprintf(num, sizeof num, "%d:%d", min_nodes, max_nodes);
    rc = rdzv_set_once(c, k.config, num, strlen(num), NULL, NULL);
    if (rc < 0) {
        store_err(c, err, errlen, rc, "opening the round", round);
        goto out;
    }
    if (rc == 0) {
        rc = fmt_err(err, errlen, -EINVAL,
                     "dynamic rendezvous round %d: this node asks for nnodes %s but the round "
                     "was opened with other bounds",
                     round, num);
        goto out;
    }

    rc = rdzv_add(c, k.count, 1, &joined);
    if (rc < 0) {
        store_err(c, err, errlen, rc, "joining", round);
        goto out;
    }
    if (joined < 1) {
        rc = fmt_err(err, errlen, -EPROTO, "dynamic rendezvous round %d: bad join count", round);
        goto out;
    }
    int64_t slot = joined - 1;
    if (slot >= max_nodes) {
        char why[96];
        snprintf(why, sizeof why, "the round is full (max_nodes=%d)", max_nodes);
        rc = dyn_late(c, &k, round, why, err, errlen);
        goto out;
    }

    node_key = round_key(prefix, round, "dyn/node/%d", (int)slot);
    size_t rlen = strlen(node_id) + 16;
    record = malloc(rlen);
    if (!node_key || !record)
        goto oom;
    snprintf(record, rlen, "%d %s", nproc, node_id);
    rc = rdzv_set(c, node_key, record, strlen(record));
    if (rc == 0 && joined == min_nodes)
        rc = rdzv_set(c, k.quorum, "1", 1);
    if (rc == 0 && joined == max_nodes)
        rc = dyn_close(c, &k, max_nodes, -1, false);
    if (rc < 0) {
        store_err(c, err, errlen, rc, "publishing this node", round);
        goto out;
    }

    rc = rdzv_wait(c, (const char *const *)&k.quorum, 1, join_ms);
    if (rc == -ETIMEDOUT) {
        int64_t now_joined = 0;
        rc = rdzv_add(c, k.count, 0, &now_joined);
        if (rc == 0 && now_joined < min_nodes) {
            rc = dyn_close(c, &k, max_nodes, now_joined, true);
            if (rc == 0)
                rc = rdzv_set(c, k.quorum, "aborted", 7);
        }
    }
    if (rc < 0) {
        store_err(c, err, errlen, rc, "waiting for min_nodes", round);
        goto out;
    }

    /* The last call: whoever's timer fires first closes the round. */
    rc = rdzv_wait(c, (const char *const *)&k.closed, 1, to_ms(last_call_timeout_s));
    if (rc == -ETIMEDOUT)
        rc = dyn_close(c, &k, max_nodes, -1, false);
    if (rc == 0)
        rc = dyn_read_closed(c, &k, max_nodes, &n, &aborted);
    if (rc == -EPROTO) {
        fmt_err(err, errlen, rc, "dynamic rendezvous round %d: malformed close record", round);
        goto out;
    }
    if (rc < 0) {
        store_err(c, err, errlen, rc, "closing the round", round);
        goto out;
    }

    if (slot >= n) {
        char why[96];
        snprintf(why, sizeof why, "the round %s with %" PRId64 " node%s before this node joined",
                 aborted ? "was aborted" : "closed", n, n == 1 ? "" : "s");
        rc = dyn_late(c, &k, round, why, err, errlen);
        goto out;
    }
    if (aborted) {
        rc = fmt_err(err, errlen, -ETIMEDOUT,
                     "dynamic rendezvous round %d: only %" PRId64
                     " of min_nodes=%d nodes joined within %g s; round aborted",
                     round, n, min_nodes, join_timeout_s);
        goto out;
    }
    rc = dyn_assign(c, prefix, round, (int)n, (int)slot, join_timeout_s, out, err, errlen);
    goto out;
oom:
    rc = fmt_err(err, errlen, -ENOMEM, "dynamic rendezvous round %d: out of memory", round);
out:
    dyn_keys_free(&k);
    free(node_key);
    free(record);
    return rc;
}

int ddprun_rdzv_num_waiting(rdzv_client *c, const char *prefix, int round, int64_t *count)
{
    if (!c || bad_prefix(prefix) || round < 0 || !count)
        return -EINVAL;
    char *key = round_key(prefix, round, "dyn/waiting");
    if (!key)
        return -ENOMEM;
    int64_t v = 0;
    int rc = rdzv_add(c, key, 0, &v);
    free(key);
    if (rc == 0)
        *count = v;
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Heartbeats                                                                                  */
/* ------------------------------------------------------------------------------------------ */

/*
 * The heartbeat keys "<round prefix>/hb/<rank>" of ranks[0 .. n-1] as one allocation (free with
 * free()): n + 1 pointers, the last NULL, followed by the strings. NULL if out of memory.
 */
static char **hb_keys(const char *prefix, int round, const int *ranks, int n)
{
    char *base = round_key(prefix, round, "hb/");
    if (!base)
        return NULL;
    size_t blen = strlen(base), room = (size_t)(n + 1) * sizeof(char *);
    for (int i = 0; i < n; i++)
        room += blen + (size_t)snprintf(NULL, 0, "%d", ranks[i]) + 1;
    char **keys = malloc(room);
    if (keys) {
        char *p = (char *)(keys + n + 1);
        for (int i = 0; i < n; i++) {
            keys[i] = p;
            p += sprintf(p, "%s%d", base, ranks[i]) + 1;
        }
        keys[n] = NULL;
    }
    free(base);
    return keys;
}

/* Fills `st` to watch ranks first, first + 1, ... (modulo nnodes), `count` of them. */
static int hb_watch(ddprun_hb_state *st, const char *prefix, int round, int nnodes, int first,
                    int count, double dead_after_s)
{
    if (!st)
        return -EINVAL;
    memset(st, 0, sizeof *st);
    if (bad_prefix(prefix) || round < 0 || nnodes < 1 || nnodes > DDPRUN_RDZV_MAX_NODES ||
        !(dead_after_s > 0))
        return -EINVAL;
    ddprun_hb_state s = {round, nnodes, dead_after_s, NULL, NULL, NULL, count, NULL};
    size_t n = count > 0 ? (size_t)count : 1;
    s.ranks = malloc(n * sizeof *s.ranks);
    s.value = malloc(n * sizeof *s.value);
    s.changed_s = malloc(n * sizeof *s.changed_s);
    if (s.ranks)
        for (int i = 0; i < count; i++)
            s.ranks[i] = (first + i) % nnodes;
    if (s.ranks)
        s.keys = hb_keys(prefix, round, s.ranks, count);
    if (!s.keys || !s.value || !s.changed_s) {
        ddprun_hb_free(&s);
        return -ENOMEM;
    }
    double now = mono_now_s();
    for (int i = 0; i < count; i++) {
        s.value[i] = -1;
        s.changed_s[i] = now;
    }
    *st = s;
    return 0;
}

int ddprun_hb_init(ddprun_hb_state *st, const char *prefix, int round, int nnodes,
                   double dead_after_s)
{
    return hb_watch(st, prefix, round, nnodes, 0, nnodes, dead_after_s);
}

int ddprun_hb_init_peers(ddprun_hb_state *st, const char *prefix, int round, int nnodes,
                         int node_rank, int npeers, double dead_after_s)
{
    if (st && (node_rank < 0 || node_rank >= nnodes || npeers < 1)) {
        memset(st, 0, sizeof *st);
        return -EINVAL;
    }
    int count = npeers < nnodes - 1 ? npeers : nnodes - 1;
    return hb_watch(st, prefix, round, nnodes, node_rank + 1, count, dead_after_s);
}

void ddprun_hb_free(ddprun_hb_state *st)
{
    if (!st)
        return;
    free(st->keys);
    free(st->ranks);
    free(st->value);
    free(st->changed_s);
    memset(st, 0, sizeof *st);
}

int ddprun_heartbeat(rdzv_client *c, const char *prefix, int round, int node_rank)
{
    if (!c || bad_prefix(prefix) || round < 0 || node_rank < 0)
        return -EINVAL;
    char *key = round_key(prefix, round, "hb/%d", node_rank);
    if (!key)
        return -ENOMEM;
    int64_t v = 0;
    int rc = rdzv_add(c, key, 1, &v);
    free(key);
    return rc;
}

int ddprun_rdzv_publish_conn(rdzv_client *c, const char *prefix, int round, int node_rank)
{
    if (!c || bad_prefix(prefix) || round < 0 || node_rank < 0)
        return -EINVAL;
    char host[NI_MAXHOST + 16];
    int port = 0;
    int rc = rdzv_client_local_endpoint(c, host, NI_MAXHOST, &port);
    if (rc < 0)
        return rc;
    snprintf(host + strlen(host), 16, " %d", port);
    char *key = round_key(prefix, round, "conn/%d", node_rank);
    if (!key)
        return -ENOMEM;
    rc = rdzv_set(c, key, host, strlen(host));
    free(key);
    return rc;
}

int ddprun_rdzv_conn_owner(rdzv_client *c, const char *prefix, int round, int nnodes,
                           const char *host, int port)
{
    if (!c || bad_prefix(prefix) || round < 0 || nnodes < 1 || nnodes > DDPRUN_RDZV_MAX_NODES ||
        !host || port <= 0)
        return -EINVAL;
    char want[NI_MAXHOST + 16];
    if (snprintf(want, sizeof want, "%s %d", host, port) >= (int)sizeof want)
        return -ENOENT;
    char **keys = key_array(prefix, round, "conn", nnodes);
    void **values = calloc((size_t)nnodes, sizeof *values);
    size_t *lens = calloc((size_t)nnodes, sizeof *lens);
    int rc = -ENOMEM;
    if (!keys || !values || !lens)
        goto out;
    rc = rdzv_multi_get(c, (const char *const *)keys, (size_t)nnodes, values, lens);
    if (rc < 0)
        goto out;
    rc = -ENOENT;
    for (int i = 0; i < nnodes && rc == -ENOENT; i++)
        if (lens[i] == strlen(want) && memcmp(values[i], want, lens[i]) == 0)
            rc = i;
out:
    if (values)
        free_values(values, nnodes);
    free(lens);
    rdzv_free(keys);
    return rc;
}

int ddprun_rdzv_publish_host(rdzv_client *c, const char *prefix, int round, int node_rank,
                             const char *hostname)
{
    if (!c || bad_prefix(prefix) || round < 0 || node_rank < 0 || !hostname || !hostname[0])
        return -EINVAL;
    char *key = round_key(prefix, round, "host/%d", node_rank);
    if (!key)
        return -ENOMEM;
    int rc = rdzv_set(c, key, hostname, strlen(hostname));
    free(key);
    return rc;
}

int ddprun_rdzv_node_host(rdzv_client *c, const char *prefix, int round, int node_rank, char *buf,
                          size_t n)
{
    if (!c || bad_prefix(prefix) || round < 0 || node_rank < 0 || !buf || n == 0)
        return -EINVAL;
    char *key = round_key(prefix, round, "host/%d", node_rank);
    if (!key)
        return -ENOMEM;
    const char *keys[1] = {key};
    void *v = NULL;
    size_t len = 0;
    int rc = rdzv_check(c, keys, 1); /* one look: rdzv_get() would wait */
    if (rc == 1)
        rc = rdzv_get(c, key, &v, &len);
    else if (rc == 0)
        rc = -ENOENT;
    if (rc == 0)
        snprintf(buf, n, "%.*s", (int)len, (const char *)v);
    rdzv_free(v);
    free(key);
    return rc;
}

int ddprun_rdzv_publish_auth_failure(rdzv_client *c, const char *prefix, int64_t count,
                                     const char *peer)
{
    if (!c || bad_prefix(prefix) || count < 1 || !peer || !peer[0] || strchr(peer, ' '))
        return -EINVAL;
    char key[DDPRUN_RDZV_MAX_PREFIX + 32], v[128];
    snprintf(key, sizeof key, "%s/auth_failed", prefix);
    int n = snprintf(v, sizeof v, "%" PRId64 " %s", count, peer);
    if (n < 0 || (size_t)n >= sizeof v)
        return -EINVAL;
    return rdzv_set(c, key, v, (size_t)n);
}

int ddprun_rdzv_auth_failure(rdzv_client *c, const char *prefix, int timeout_ms, int64_t *count,
                             char *peer, size_t n)
{
    if (!c || bad_prefix(prefix) || !count || !peer || n == 0)
        return -EINVAL;
    char key[DDPRUN_RDZV_MAX_PREFIX + 32];
    snprintf(key, sizeof key, "%s/auth_failed", prefix);
    void *v = NULL;
    size_t len = 0;
    int rc = rdzv_wait_get(c, key, timeout_ms, &v, &len);
    if (rc < 0)
        return rc;
    const char *s = v, *sp = memchr(s, ' ', len);
    int64_t k = 0;
    if (!sp || !parse_int(s, (size_t)(sp - s), 1, INT64_MAX, &k, NULL) || sp + 1 == s + len)
        rc = -EPROTO;
    else {
        *count = k;
        snprintf(peer, n, "%.*s", (int)(s + len - sp - 1), sp + 1);
    }
    rdzv_free(v);
    return rc;
}

int ddprun_rdzv_exit_done(rdzv_client *c, const char *prefix, int round)
{
    if (!c || bad_prefix(prefix) || round < 0)
        return -EINVAL;
    char *key = round_key(prefix, round, "exit/done");
    if (!key)
        return -ENOMEM;
    const char *keys[1] = {key};
    int rc = rdzv_check(c, keys, 1);
    free(key);
    return rc;
}

int ddprun_dead_nodes(rdzv_client *c, ddprun_hb_state *st, int *dead, int dead_cap)
{
    if (!c || !st || !st->keys || dead_cap < 0 || (dead_cap > 0 && !dead))
        return -EINVAL;
    int nn = st->nwatched;
    if (nn == 0)
        return 0;
    void **values = calloc((size_t)nn, sizeof *values);
    size_t *lens = calloc((size_t)nn, sizeof *lens);
    int64_t *seen = calloc((size_t)nn, sizeof *seen);
    int rc = -ENOMEM;
    if (!values || !lens || !seen)
        goto out;
    rc = rdzv_multi_get(c, (const char *const *)st->keys, (size_t)nn, values, lens);
    if (rc < 0) {
        goto out;
    }
    /* Parse everything first, so that a bad value leaves the state as it was. */
    for (int i = 0; i < nn; i++) {
        seen[i] = -1;
        if (lens[i] > 0 && !parse_int(values[i], lens[i], 0, INT64_MAX, &seen[i], NULL)) {
            rc = -EPROTO;
            goto out;
        }
    }
    double now = mono_now_s();
    int ndead = 0;
    for (int i = 0; i < nn; i++) {
        if (seen[i] != st->value[i]) {
            st->value[i] = seen[i];
            st->changed_s[i] = now;
        } else if (now - st->changed_s[i] > st->dead_after_s) {
            if (ndead < dead_cap)
                dead[ndead] = st->ranks[i];
            ndead++;
        }
    }
    rc = ndead;
out:
    free_values(values, nn);
    free(lens);
    free(seen);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Failure reports                                                                             */
/* ------------------------------------------------------------------------------------------ */

int ddprun_rdzv_failure_key(const char *prefix, int round, char *buf, size_t buflen)
{
    if (!prefix || round < 0 || !buf)
        return -EINVAL;
    int n = snprintf(buf, buflen, "%s/round_%d/failed", prefix, round);
    if (n < 0 || (size_t)n >= buflen) {
        if (buflen > 0)
            buf[0] = '\0';
        return n < 0 ? -EINVAL : -ENAMETOOLONG;
    }
    return n;
}

int ddprun_rdzv_publish_failure(rdzv_client *c, const char *prefix, int round, const char *json)
{
    if (!c || bad_prefix(prefix) || round < 0 || !json || !json[0])
        return -EINVAL;
    char *key = round_key(prefix, round, "failed");
    if (!key)
        return -ENOMEM;
    int rc = rdzv_set_once(c, key, json, strlen(json), NULL, NULL);
    free(key);
    return rc;
}

int ddprun_rdzv_wait_failure(rdzv_client *c, const char *prefix, int round, int timeout_ms,
                             char **json)
{
    if (!c || bad_prefix(prefix) || round < 0 || !json)
        return -EINVAL;
    char *key = round_key(prefix, round, "failed");
    if (!key)
        return -ENOMEM;
    void *v = NULL;
    size_t n = 0;
    int rc = rdzv_wait_get(c, key, timeout_ms, &v, &n);
    free(key);
    if (rc == 0)
        *json = v;
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* The run's prefix, the exit barrier, clearing between attempts                               */
/* ------------------------------------------------------------------------------------------ */

int ddprun_rdzv_run_prefix(const char *run_id, char *buf, size_t buflen)
{
    if (!run_id || !run_id[0] || !buf)
        return -EINVAL;
    int n = snprintf(buf, buflen, "%s/%s", DDPRUN_RDZV_ROOT, run_id);
    if (n < 0 || (size_t)n >= buflen) {
        if (buflen > 0)
            buf[0] = '\0';
        return n < 0 ? -EINVAL : -ENAMETOOLONG;
    }
    return n;
}

int ddprun_rdzv_exit_barrier(rdzv_client *c, const char *prefix, int round, int nnodes,
                             double timeout_s, int poll_ms, char **failure)
{
    if (!c || bad_prefix(prefix) || round < 0 || nnodes < 1 || nnodes > DDPRUN_RDZV_MAX_NODES ||
        poll_ms < 1 || !failure)
        return -EINVAL;
    int64_t deadline = mono_deadline_ns(to_ms(timeout_s));
    char *count = round_key(prefix, round, "exit/count");
    char *done = round_key(prefix, round, "exit/done");
    char *failed = round_key(prefix, round, "failed");
    int64_t arrived = 0;
    int rc = -ENOMEM;
    if (!count || !done || !failed)
        goto out;
    rc = rdzv_add(c, count, 1, &arrived);
    if (rc == 0 && arrived >= nnodes)
        rc = rdzv_set(c, done, "1", 1);
    while (rc == 0) {
        int left = mono_ms_left(deadline);
        if (left == 0) {
            rc = -ETIMEDOUT;
            break;
        }
        rc = rdzv_wait(c, (const char *const *)&done, 1,
                       left < 0 || left > poll_ms ? poll_ms : left);
        if (rc != -ETIMEDOUT)
            break; /* 0: every node arrived; or the store failed */
        rc = rdzv_check(c, (const char *const *)&failed, 1);
        if (rc == 1) {
            void *v = NULL;
            size_t n = 0;
            rc = rdzv_get(c, failed, &v, &n);
            if (rc == 0) {
                *failure = v;
                rc = 1;
            }
        }
    }
out:
    free(count);
    free(done);
    free(failed);
    return rc;
}

/* "<prefix>/store_host" (ddprun_rdzv_mark_host()), allocated; NULL if out of memory. */
static char *host_marker_key(const char *prefix)
{
    size_t len = strlen(prefix) + sizeof "/store_host";
    char *k = malloc(len);
    if (k)
        snprintf(k, len, "%s/store_host", prefix);
    return k;
}

/*
 * The host's part of ddprun_rdzv_clear_worker_keys() through a client, for a store no agent
 * hosts: lists the keys on a connection of its own (a server without LIST_KEYS closes it) and
 * deletes those outside `root`. Returns the number deleted, 0 when the store cannot list its keys
 * (-ECONNRESET, -EPIPE, -ENOTCONN, -EPROTO from the listing), or a negative errno.
 */
static int clear_through_client(rdzv_client *c, const char *root)
{
    rdzv_client *d = NULL;
    int rc = rdzv_client_dup(c, &d);
    if (rc < 0)
        return rc;
    char **keys = NULL;
    size_t n = 0;
    rc = rdzv_list_keys(d, &keys, &n);
    if (rc == -ECONNRESET || rc == -EPIPE || rc == -ENOTCONN || rc == -EPROTO)
        rc = 0; /* no LIST_KEYS: nothing can be cleared */
    else if (rc == 0)
        for (size_t i = 0; i < n && rc >= 0; i++) {
            if (strncmp(keys[i], root, strlen(root)) == 0)
                continue;
            int del = rdzv_delete(d, keys[i]);
            rc = del < 0 ? del : rc + del;
        }
    rdzv_free(keys);
    rdzv_client_close(d);
    return rc;
}

int ddprun_rdzv_clear_worker_keys(rdzv_server *srv, rdzv_client *c, const char *prefix, int round,
                                  int nnodes, double timeout_s)
{
    static const char root[] = DDPRUN_RDZV_ROOT "/";
    if (!c || bad_prefix(prefix) || strncmp(prefix, root, sizeof root - 1) != 0 || round < 0 ||
        nnodes < 1)
        return -EINVAL;
    char *key = round_key(prefix, round, "cleared");
    if (!key)
        return -ENOMEM;
    char *host_key = host_marker_key(prefix);
    char *claim = round_key(prefix, round, "clearing");
    int rc = -ENOMEM;
    if (!host_key || !claim)
        goto out;
    bool clear = srv != NULL;
    if (!clear) {
        /* No agent hosts the store: the first node to claim the round's clearing does it. */
        const char *hk = host_key;
        int64_t n = 0;
        rc = rdzv_check(c, &hk, 1);
        if (rc == 0)
            rc = rdzv_add(c, claim, 1, &n);
        if (rc < 0)
            goto out;
        clear = n == 1;
    }
    if (clear) {
        rc = srv ? rdzv_server_clear(srv, root) : clear_through_client(c, root);
        if (rc >= 0 && nnodes > 1) {
            int set = rdzv_set(c, key, "1", 1);
            if (set < 0)
                rc = set;
        }
    } else {
        rc = rdzv_wait(c, (const char *const *)&key, 1, to_ms(timeout_s));
    }
out:
    free(host_key);
    free(claim);
    free(key);
    return rc;
}

int ddprun_rdzv_mark_host(rdzv_client *c, const char *prefix)
{
    static const char root[] = DDPRUN_RDZV_ROOT "/";
    if (!c || bad_prefix(prefix) || strncmp(prefix, root, sizeof root - 1) != 0)
        return -EINVAL;
    char *key = host_marker_key(prefix);
    if (!key)
        return -ENOMEM;
    int rc = rdzv_set(c, key, "1", 1);
    free(key);
    return rc;
}
