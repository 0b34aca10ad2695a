/*
 * The etcd rendezvous backend (--rdzv-backend etcd, or etcd-v2, torchrun's other name): the
 * agents meet in an etcd cluster (etcd.h, the v3 API through its JSON gateway) instead of in the
 * workers' store, so the job outlives the loss of any node. The workers' store moves with the
 * rounds: the node given rank 0 in a round serves a fresh one and publishes where it is
 * (publish_store), the others read it (find_store).
 *
 * Liveness is a lease per agent (process): granted at the first join, kept alive by a thread of
 * this file with a client of its own every third of its TTL (the liveness timeout,
 * ddprun_liveness()), and bound to every key the node writes in a round, so a node that dies
 * vanishes from etcd when its lease expires. A lease that cannot be renewed for its TTL (etcd out
 * of reach, or the lease gone) ends this node's part in the job: heartbeat() then says so.
 *
 * Keys, under the run's prefix P ("/ddprun/<run_id>", ddprun_rdzv_run_prefix()):
 *   P/job                  "<min>:<max>": the --nnodes of the job using this run id
 *   P/round                the highest round opened, "%010d" (where a late node starts)
 *   P/ended                "ended at <time>, last node <id>": the job finished (set by the
 *                          node completing the exit barrier), on a lease of ENDED_TTL_S
 *   P/r/<n>/config         "<min>:<max>" the round was opened with (created once)
 *   P/r/<n>/node/<id>      "<nproc>", leased: the node joined; create_revision orders the joins
 *   P/r/<n>/closed         {"nodes":[[id,nproc],...]} in node-rank order, or {"aborted":count};
 *                          created once, by a transaction that fails once it exists
 *   P/r/<n>/waiting/<id>   leased: a node that came after the close and waits for round n+1
 *   P/r/<n>/store          {"host":..,"port":..}: the workers' store of the round (rank 0's)
 *   P/r/<n>/failed         the round's first failure report (created once)
 *   P/r/<n>/exit/<id>      the node passed the exit barrier; exit/done once all did
 * Waiting is watching (ddprun_etcd_watch()) a round's prefix from the revision last read, never
 * polling; every wait re-reads the round and decides again, so a lost or duplicated event costs
 * one read. Nothing here prints; failures are negative errno values with a sentence.
 */
#include "backend.h"
#include "etcd.h"
#include "fmt.h"
#include "monoclock.h"
#include "walltime.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ENDED_TTL_S 7200    /* how long a finished job's id stays refused (torchrun's 2 h) */
#define RETRY_MS 200        /* pause after a failed etcd call before the next try */
#define REQUEST_MAX_MS 5000 /* bound on one etcd request */
#define REQUEST_MIN_MS 1000

struct ddprun_rdzv_conn {
    ddprun_etcd *e;
    const ddprun_config *cfg;
    double dead_s;        /* the liveness timeout: the lease's TTL */
    char node_id[320];    /* this node's id, from join() */
    bool job_checked;     /* the run id's owner was checked (job_check()) */
    int watch_round;      /* the round wait_failure() follows; -1: none */
    int64_t watch_rev;    /* revision it has seen up to */
    bool dirty_dead;      /* a change since dead_nodes() last read the round */
    bool dirty_waiting;   /* ... since num_waiting() last did */
    int64_t waiting_seen; /* num_waiting()'s last count */
};

struct ddprun_rdzv_watch {
    char *prefix;
    int round, nnodes;
    char **ids; /* (nnodes) the participants, from the round's close record; NULL until read */
    int ndead;  /* dead_nodes()' last count */
    int dead[16];
    bool read;
};

/* ------------------------------------------------------------------------------------------ */
/* Small pieces                                                                                */
/* ------------------------------------------------------------------------------------------ */

/* "<prefix>/r/<round>/<what>" (round >= 0) or "<prefix>/<what>", malloc'd; NULL: no memory. */
static char *rkey(const char *prefix, int round, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static char *rkey(const char *prefix, int round, const char *fmt, ...)
{
    char tail[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tail, sizeof tail, fmt, ap);
    va_end(ap);
    size_t n = strlen(prefix) + strlen(tail) + 32;
    char *k = malloc(n);
    if (!k)
        return NULL;
    if (round >= 0)
        snprintf(k, n, "%s/r/%d/%s", prefix, round, tail);
    else
        snprintf(k, n, "%s/%s", prefix, tail);
    return k;
}

/* "create `key` = value unless it exists": the transaction every create-once key uses. */
static int put_once(ddprun_etcd *e, const char *key, const char *value, int64_t lease,
                    bool *created)
{
    ddprun_etcd_compare cmp = {
        .key = key, .target = DDPRUN_ETCD_VERSION, .result = DDPRUN_ETCD_EQUAL, .number = 0};
    ddprun_etcd_op put = {.kind = DDPRUN_ETCD_OP_PUT,
                          .key = key,
                          .value = value,
                          .value_len = strlen(value),
                          .lease = lease};
    return ddprun_etcd_txn(e, &cmp, 1, &put, 1, NULL, 0, created, NULL);
}

/* The value of `key` as a new string in *out; -ENOENT if there is none. */
static int get_str(ddprun_etcd *e, const char *key, char **out, int64_t *revision)
{
    ddprun_etcd_kv *kv = NULL;
    int rc = ddprun_etcd_get(e, key, &kv, revision);
    if (rc < 0)
        return rc;
    *out = strdup(kv->value);
    ddprun_etcd_kvs_free(kv, 1);
    return *out ? 0 : -ENOMEM;
}

/* ------------------------------------------------------------------------------------------ */
/* The node's lease                                                                            */
/* ------------------------------------------------------------------------------------------ */

/*
 * One lease per process (the agent is one node), shared by its connections: the agent's own
 * grants it in join(), the monitor's reads its state in heartbeat(). The keepalive thread has a
 * client of its own. Under `mu`: everything but `thread`, which only lease_get() writes, once.
 */
static struct {
    pthread_mutex_t mu;
    bool started;
    int64_t id;
    int64_t ttl_s;
    double last_ok_s; /* mono_now_s() of the last renewal */
    bool lost;
    bool left; /* leave() revoked it: the keepalive thread ends without a word */
    char why[768];
    ddprun_etcd *e; /* the keepalive thread's */
    pthread_t thread;
} lease = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void *keepalive_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&lease.mu);
    int64_t id = lease.id, ttl = lease.ttl_s;
    ddprun_etcd *e = lease.e;
    pthread_mutex_unlock(&lease.mu);
    int every_ms = (int)(ttl * 1000 / 3);
    for (;;) {
        int64_t renewed = 0;
        int rc = ddprun_etcd_lease_keepalive(e, id, &renewed);
        double now = mono_now_s();
        pthread_mutex_lock(&lease.mu);
        if (lease.left) {
            pthread_mutex_unlock(&lease.mu);
            return NULL;
        }
        if (rc == 0) {
            lease.last_ok_s = now;
        } else if (rc == -ENOENT) {
            lease.lost = true;
            snprintf(lease.why, sizeof lease.why, "etcd let this node's lease expire (%s)",
                     ddprun_etcd_last_error(e));
        } else if (now - lease.last_ok_s > (double)ttl) {
            lease.lost = true;
            snprintf(lease.why, sizeof lease.why,
                     "this node's lease could not be renewed for %" PRId64 " s (%s)", ttl,
                     ddprun_etcd_last_error(e));
        }
        bool lost = lease.lost;
        pthread_mutex_unlock(&lease.mu);
        if (lost)
            return NULL;
        mono_sleep_until(mono_deadline_ns(rc == 0 ? every_ms : RETRY_MS));
    }
}

/* The lease's TTL for a liveness timeout: whole seconds, rounded up. */
static int64_t ttl_of(double dead_s)
{
    int64_t t = (int64_t)dead_s;
    return t + (dead_s > (double)t);
}

static void etcd_options(const ddprun_config *cfg, double dead_s, ddprun_etcd_options *o)
{
    ddprun_etcd_options_init(o);
    /* A third of the liveness timeout, so that a member that hangs leaves time for another. */
    double ms = dead_s * 1000.0 / 3;
    o->timeout_ms = ms > REQUEST_MAX_MS   ? REQUEST_MAX_MS
                    : ms < REQUEST_MIN_MS ? REQUEST_MIN_MS
                                          : (int)ms;
    o->protocol = cfg->etcd_https ? DDPRUN_ETCD_HTTPS : DDPRUN_ETCD_HTTP;
    o->cacert = cfg->etcd_cacert;
    o->cert = cfg->etcd_cert;
    o->key = cfg->etcd_key;
}

/* The node's lease, granted (and its keepalive started) on the first call. */
static int lease_get(ddprun_rdzv_conn *c, int64_t *id, char *err, size_t errlen)
{
    pthread_mutex_lock(&lease.mu);
    bool started = lease.started;
    *id = lease.id;
    pthread_mutex_unlock(&lease.mu);
    if (started)
        return 0;
    int64_t lid = 0, ttl = 0;
    int rc = ddprun_etcd_lease_grant(c->e, ttl_of(c->dead_s), &lid, &ttl);
    if (rc < 0)
        return fmt_err(err, errlen, rc, "granting this node's lease: %s",
                       ddprun_etcd_last_error(c->e));
    ddprun_etcd_options o;
    etcd_options(c->cfg, c->dead_s, &o);
    ddprun_etcd *ke = NULL;
    rc = ddprun_etcd_create(c->cfg->rdzv_endpoint, &o, &ke);
    if (rc < 0)
        return fmt_err(err, errlen, rc, "%s", ddprun_etcd_last_error(NULL));
    pthread_mutex_lock(&lease.mu);
    lease.id = lid;
    lease.ttl_s = ttl > 0 ? ttl : ttl_of(c->dead_s);
    lease.last_ok_s = mono_now_s();
    lease.e = ke;
    lease.started = true;
    pthread_mutex_unlock(&lease.mu);
    if (pthread_create(&lease.thread, NULL, keepalive_main, NULL) != 0) {
        pthread_mutex_lock(&lease.mu);
        lease.lost = true;
        snprintf(lease.why, sizeof lease.why, "cannot start the lease's keepalive thread");
        pthread_mutex_unlock(&lease.mu);
        return fmt_err(err, errlen, -EAGAIN, "cannot start the lease's keepalive thread");
    }
    pthread_detach(lease.thread);
    *id = lid;
    return 0;
}

/* -ENOLINK with the reason in err when this node's lease is lost, else 0. */
static int lease_check(char *err, size_t errlen)
{
    pthread_mutex_lock(&lease.mu);
    int rc = lease.lost ? fmt_err(err, errlen, -ENOLINK, "%s", lease.why) : 0;
    pthread_mutex_unlock(&lease.mu);
    return rc;
}

/*
 * A wait's slice: the time left, but no more than the liveness timeout, so that a wait on a
 * member that went silent (no reset) ends, and the lease is looked at again.
 */
static int slice_ms(const ddprun_rdzv_conn *c, double left_ms)
{
    double cap = c->dead_s * 1000.0;
    double ms = left_ms < cap ? left_ms : cap;
    return ms < 1 ? 1 : ms > INT32_MAX ? INT32_MAX : (int)ms;
}

/*
 * After an etcd call failed with rc: true when etcd is out of reach or between leaders (rc
 * says so) and has been since *since for no longer than the liveness timeout, after a pause:
 * the caller tries again. *since is -1 while calls succeed.
 */
static bool retry_later(const ddprun_rdzv_conn *c, int rc, double *since)
{
    if (rc == -ENOMEM || rc == -EINVAL || rc == -EACCES || rc == -EPROTO || rc == -ENOLINK)
        return false;
    if (*since < 0)
        *since = mono_now_s();
    if (mono_now_s() - *since > c->dead_s || lease_check(NULL, 0) < 0)
        return false;
    mono_sleep_until(mono_deadline_ns(RETRY_MS));
    return true;
}

/* ------------------------------------------------------------------------------------------ */
/* Connection                                                                                  */
/* ------------------------------------------------------------------------------------------ */

static void etcd_plan_store(const ddprun_config *cfg, ddprun_store_plan *plan)
{
    (void)cfg;
    /* Each round's rank 0 serves the store (publish_store): nobody does before the first. */
    *plan = (ddprun_store_plan){.host = NULL, .port = 0, .serve = false, .must_serve = false};
}

static int etcd_connect(const ddprun_config *cfg, const char *host, int port,
                        const rdzv_client_options *co, ddprun_rdzv_conn **out, char *err,
                        size_t errlen)
{
    (void)host;
    (void)port;
    (void)co;
    if (errlen)
        err[0] = '\0';
    ddprun_rdzv_conn *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    double beat_s;
    ddprun_liveness(cfg, &beat_s, &c->dead_s);
    c->cfg = cfg;
    c->watch_round = -1;
    ddprun_etcd_options o;
    etcd_options(cfg, c->dead_s, &o);
    int rc = ddprun_etcd_create(cfg->rdzv_endpoint, &o, &c->e);
    if (rc < 0) {
        fmt_err(err, errlen, rc, "%s", ddprun_etcd_last_error(NULL));
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

static void etcd_close(ddprun_rdzv_conn *c)
{
    if (!c)
        return;
    ddprun_etcd_close(c->e);
    free(c);
}

/* ------------------------------------------------------------------------------------------ */
/* Join                                                                                        */
/* ------------------------------------------------------------------------------------------ */

/*
 * Whether the run id is this job's: refused when a job under it ended less than ENDED_TTL_S ago,
 * or when a job with other --nnodes still has live nodes; the keys of a job with no live node
 * left (every node died) are taken over. Raises *round to the highest round opened.
 */
static int job_check(ddprun_rdzv_conn *c, const char *prefix, int *round, char *err, size_t errlen)
{
    const ddprun_config *cfg = c->cfg;
    char want[64];
    snprintf(want, sizeof want, "%d:%d", cfg->nnodes_min, cfg->nnodes_max);
    char *kjob = rkey(prefix, -1, "job"), *kend = rkey(prefix, -1, "ended");
    char *kround = rkey(prefix, -1, "round"), *have = NULL, *ended = NULL, *cur = NULL;
    int rc = -ENOMEM;
    if (!kjob || !kend || !kround)
        goto out;
    for (int attempt = 0; attempt < 8; attempt++) {
        rc = get_str(c->e, kend, &ended, NULL);
        if (rc == 0) {
            rc = fmt_err(err, errlen, -EEXIST,
                         "the rendezvous id '%s' belongs to a job that already finished (%s); "
                         "give this job a new --rdzv-id, or delete the old one's keys: etcdctl "
                         "del --prefix '%s/' (they expire by themselves %d s after it ended)",
                         cfg->rdzv_id, ended, prefix, ENDED_TTL_S);
            goto out;
        }
        if (rc != -ENOENT)
            goto etcd_failed;
        bool created = false;
        rc = put_once(c->e, kjob, want, 0, &created);
        if (rc < 0)
            goto etcd_failed;
        if (created)
            break;
        int64_t rev = 0;
        ddprun_etcd_kv *kv = NULL;
        rc = ddprun_etcd_get(c->e, kjob, &kv, &rev);
        if (rc == -ENOENT)
            continue; /* taken over meanwhile: look again */
        if (rc < 0)
            goto etcd_failed;
        bool same = strcmp(kv->value, want) == 0;
        int64_t mod = kv->mod_revision;
        free(have);
        have = strdup(kv->value);
        ddprun_etcd_kvs_free(kv, 1);
        if (same)
            break;
        /* Another job's keys: live nodes (leased keys) anywhere under the run mean it runs. */
        ddprun_etcd_kv *kvs = NULL;
        size_t n = 0, live = 0;
        char *all = rkey(prefix, -1, "r/");
        rc = all ? ddprun_etcd_range(c->e, all, &kvs, &n, NULL) : -ENOMEM;
        free(all);
        if (rc < 0)
            goto etcd_failed;
        for (size_t i = 0; i < n; i++)
            live += kvs[i].lease != 0;
        ddprun_etcd_kvs_free(kvs, n);
        if (live > 0) {
            rc = fmt_err(err, errlen, -EEXIST,
                         "the rendezvous id '%s' is in use by another job, with --nnodes %s "
                         "(this one has %s); give this job a --rdzv-id of its own",
                         cfg->rdzv_id, have ? have : "?", want);
            goto out;
        }
        /* Every node of that job is gone: its keys go, unless it changed meanwhile. */
        ddprun_etcd_compare cmp = {
            .key = kjob, .target = DDPRUN_ETCD_MOD, .result = DDPRUN_ETCD_EQUAL, .number = mod};
        char *sub = rkey(prefix, -1, "%s", "");
        ddprun_etcd_op wipe = {.kind = DDPRUN_ETCD_OP_DELETE_PREFIX, .key = sub};
        bool done = false;
        rc = sub ? ddprun_etcd_txn(c->e, &cmp, 1, &wipe, 1, NULL, 0, &done, NULL) : -ENOMEM;
        free(sub);
        if (rc < 0)
            goto etcd_failed;
    }
    rc = get_str(c->e, kround, &cur, NULL);
    if (rc == 0) {
        int r = atoi(cur);
        if (r > *round)
            *round = r;
    } else if (rc != -ENOENT) {
        goto etcd_failed;
    }
    rc = 0;
    goto out;
etcd_failed:
    fmt_err(err, errlen, rc, "%s", ddprun_etcd_last_error(c->e));
out:
    free(kjob);
    free(kend);
    free(kround);
    free(have);
    free(ended);
    free(cur);
    return rc;
}

/* What one read of a round found. */
typedef struct round_view {
    ddprun_etcd_kv *kvs;
    size_t n;
    int64_t revision;
    const ddprun_etcd_kv *closed;
    const ddprun_etcd_kv **nodes; /* node/<id> keys, in join order (create_revision) */
    size_t nnodes;
    size_t blen; /* length of the round's key prefix "P/r/<n>/" */
} round_view;

static void view_free(round_view *v)
{
    ddprun_etcd_kvs_free(v->kvs, v->n);
    free(v->nodes);
    memset(v, 0, sizeof *v);
}

static int by_create(const void *a, const void *b)
{
    const ddprun_etcd_kv *x = *(const ddprun_etcd_kv *const *)a;
    const ddprun_etcd_kv *y = *(const ddprun_etcd_kv *const *)b;
    return (x->create_revision > y->create_revision) - (x->create_revision < y->create_revision);
}

/* Reads round `round` (every key under P/r/<round>/) into *v. */
static int view_read(ddprun_rdzv_conn *c, const char *prefix, int round, round_view *v)
{
    memset(v, 0, sizeof *v);
    char *base = rkey(prefix, round, "%s", "");
    if (!base)
        return -ENOMEM;
    size_t blen = strlen(base);
    v->blen = blen;
    int rc = ddprun_etcd_range(c->e, base, &v->kvs, &v->n, &v->revision);
    if (rc == 0 && v->n && !(v->nodes = calloc(v->n, sizeof *v->nodes)))
        rc = -ENOMEM;
    for (size_t i = 0; rc == 0 && i < v->n; i++) {
        const char *tail = v->kvs[i].key + blen;
        if (strcmp(tail, "closed") == 0)
            v->closed = &v->kvs[i];
        else if (strncmp(tail, "node/", 5) == 0)
            v->nodes[v->nnodes++] = &v->kvs[i];
    }
    if (rc == 0 && v->nnodes > 1)
        qsort(v->nodes, v->nnodes, sizeof *v->nodes, by_create);
    free(base);
    if (rc < 0)
        view_free(v);
    return rc;
}

/* Closes the round with the first `count` nodes of v (or as aborted), unless it is closed. */
static int round_close(ddprun_rdzv_conn *c, const char *prefix, int round, const round_view *v,
                       size_t count, bool aborted)
{
    json_t *rec = json_object();
    if (aborted) {
        json_object_set_new(rec, "aborted", json_integer((json_int_t)v->nnodes));
    } else {
        json_t *list = json_array();
        for (size_t i = 0; i < count && i < v->nnodes; i++)
            json_array_append_new(
                list, json_pack("[si]", v->nodes[i]->key + v->blen + 5, atoi(v->nodes[i]->value)));
        json_object_set_new(rec, "nodes", list);
    }
    char *text = json_dumps(rec, JSON_COMPACT);
    json_decref(rec);
    char *k = rkey(prefix, round, "closed");
    bool created = false;
    int rc = text && k ? put_once(c->e, k, text, 0, &created) : -ENOMEM;
    free(text);
    free(k);
    return rc;
}

/*
 * Reads the close record `closed`: the node count of an aborted round in *aborted (else -1), or
 * this node's place (-1: not among them) and the assignment.
 */
static int read_closed(const ddprun_etcd_kv *closed, const char *node_id, int round, int *aborted,
                       ddprun_assignment *out, bool *member)
{
    json_error_t jerr;
    json_t *rec = json_loadb(closed->value, closed->value_len, 0, &jerr);
    json_t *list = json_object_get(rec, "nodes"), *ab = json_object_get(rec, "aborted");
    int rc = -EPROTO;
    *aborted = -1;
    *member = false;
    if (json_is_integer(ab)) {
        *aborted = (int)json_integer_value(ab);
        rc = 0;
    } else if (json_is_array(list) && json_array_size(list) > 0) {
        int64_t offset = 0, world = 0;
        size_t me = 0, i;
        json_t *item;
        rc = 0;
        json_array_foreach(list, i, item)
        {
            const char *id = json_string_value(json_array_get(item, 0));
            json_int_t np = json_integer_value(json_array_get(item, 1));
            if (!id || np < 1 || np > INT32_MAX)
                rc = -EPROTO;
            else if (strcmp(id, node_id) == 0) {
                *member = true;
                me = i;
                offset = world;
            }
            world += np;
        }
        if (rc == 0 && world > INT32_MAX)
            rc = -EPROTO;
        if (rc == 0 && *member)
            *out = (ddprun_assignment){.round = round,
                                       .node_rank = (int)me,
                                       .nnodes = (int)json_array_size(list),
                                       .rank_offset = (int)offset,
                                       .world_size = (int)world};
    }
    json_decref(rec);
    return rc;
}

/* A node that came after the round closed: it waits, leased, for the members to restart. */
static int late(ddprun_rdzv_conn *c, const char *prefix, int round, int64_t lease_id,
                const char *why, char *err, size_t errlen)
{
    char *kw = rkey(prefix, round, "waiting/%s", c->node_id);
    char *kn = rkey(prefix, round, "node/%s", c->node_id);
    int rc = kw && kn ? ddprun_etcd_put(c->e, kw, "1", 1, lease_id, NULL) : -ENOMEM;
    if (rc == 0)
        rc = ddprun_etcd_delete(c->e, kn, false, NULL);
    free(kw);
    free(kn);
    if (rc < 0)
        return fmt_err(err, errlen, rc, "registering as a waiting node: %s",
                       ddprun_etcd_last_error(c->e));
    return fmt_err(err, errlen, -EAGAIN, "round %d %s; waiting for round %d", round, why,
                   round + 1);
}

/*
 * Opens round `round` (or checks its bounds), joins it and waits for its close: the node that
 * brings the count to --nnodes' maximum closes it at once, else any member once the last call
 * has run out after the quorum; a round short of the minimum for the join timeout is aborted.
 * Returns 0 and fills *out; -EAGAIN (the round closed without this node: try the next);
 * -ETIMEDOUT (aborted); -EINVAL (other bounds); or an etcd failure.
 */
static int join_round(ddprun_rdzv_conn *c, const char *prefix, int round, int64_t lease_id,
                      ddprun_assignment *out, char *err, size_t errlen)
{
    const ddprun_config *cfg = c->cfg;
    char want[64], np[24], rnum[16];
    snprintf(want, sizeof want, "%d:%d", cfg->nnodes_min, cfg->nnodes_max);
    snprintf(np, sizeof np, "%d", cfg->nproc_per_node);
    snprintf(rnum, sizeof rnum, "%010d", round);
    char *kconf = rkey(prefix, round, "config"), *kround = rkey(prefix, -1, "round");
    char *kclosed = rkey(prefix, round, "closed"),
         *knode = rkey(prefix, round, "node/%s", c->node_id);
    char *kwait = rkey(prefix, round, "waiting/%s", c->node_id),
         *base = rkey(prefix, round, "%s", "");
    char *have = NULL;
    round_view v = {0};
    int rc = -ENOMEM;
    if (!kconf || !kround || !kclosed || !knode || !kwait || !base)
        goto out;

    /* Open the round (the first node), or check that it was opened alike. */
    ddprun_etcd_compare opened = {
        .key = kconf, .target = DDPRUN_ETCD_VERSION, .result = DDPRUN_ETCD_EQUAL, .number = 0};
    ddprun_etcd_op open_ops[2] = {
        {.kind = DDPRUN_ETCD_OP_PUT, .key = kconf, .value = want, .value_len = strlen(want)},
        {.kind = DDPRUN_ETCD_OP_PUT, .key = kround, .value = rnum, .value_len = strlen(rnum)},
    };
    bool created = false;
    double failing_since = -1;
    while ((rc = ddprun_etcd_txn(c->e, &opened, 1, open_ops, 2, NULL, 0, &created, NULL)) < 0 &&
           retry_later(c, rc, &failing_since))
        ;
    if (rc == 0 && !created) {
        rc = get_str(c->e, kconf, &have, NULL);
        if (rc == 0 && strcmp(have, want) != 0) {
            rc = fmt_err(err, errlen, -EINVAL,
                         "round %d was opened with --nnodes %s, this node asks for %s", round, have,
                         want);
            goto out;
        }
    }
    if (rc < 0)
        goto etcd_failed;

    /* Join unless the round closed; a late node registers as waiting instead. */
    ddprun_etcd_compare open_still = {
        .key = kclosed, .target = DDPRUN_ETCD_VERSION, .result = DDPRUN_ETCD_EQUAL, .number = 0};
    ddprun_etcd_op join = {.kind = DDPRUN_ETCD_OP_PUT,
                           .key = knode,
                           .value = np,
                           .value_len = strlen(np),
                           .lease = lease_id};
    ddprun_etcd_op wait = {
        .kind = DDPRUN_ETCD_OP_PUT, .key = kwait, .value = "1", .value_len = 1, .lease = lease_id};
    bool joined = false;
    failing_since = -1;
    while ((rc = ddprun_etcd_txn(c->e, &open_still, 1, &join, 1, &wait, 1, &joined, NULL)) < 0 &&
           retry_later(c, rc, &failing_since))
        ;
    if (rc < 0)
        goto etcd_failed;
    if (!joined) {
        rc = fmt_err(err, errlen, -EAGAIN,
                     "round %d closed before this node came; waiting for round %d", round,
                     round + 1);
        goto out;
    }

    double t_join = mono_now_s(), quorum_since = -1;
    failing_since = -1;
    for (;;) {
        view_free(&v);
        rc = view_read(c, prefix, round, &v);
        if (rc < 0)
            goto transient;
        if (v.closed)
            break;
        double now = mono_now_s(), deadline;
        size_t n = v.nnodes;
        if (n >= (size_t)cfg->nnodes_max) {
            rc = round_close(c, prefix, round, &v, (size_t)cfg->nnodes_max, false);
            if (rc < 0)
                goto transient;
            continue;
        }
        if (n >= (size_t)cfg->nnodes_min) {
            if (quorum_since < 0)
                quorum_since = now;
            deadline = quorum_since + cfg->last_call_timeout_s;
        } else {
            quorum_since = -1;
            deadline = t_join + cfg->join_timeout_s;
        }
        if (now >= deadline) {
            rc = round_close(c, prefix, round, &v, n, n < (size_t)cfg->nnodes_min);
            if (rc < 0)
                goto transient;
            continue;
        }
        if ((rc = lease_check(err, errlen)) < 0)
            goto out;
        ddprun_etcd_event ev = {0};
        rc = ddprun_etcd_watch(c->e, base, true, v.revision,
                               slice_ms(c, (deadline - now) * 1000.0 + 1), &ev);
        ddprun_etcd_event_clear(&ev);
        if (rc == 0 || rc == -ETIMEDOUT || rc == -ESTALE) {
            failing_since = -1;
            continue;
        }
    transient:
        /* etcd out of reach or electing a leader: go on trying while the lease could live. */
        if (!retry_later(c, rc, &failing_since))
            goto etcd_failed;
    }

    int aborted = -1;
    bool member = false;
    rc = read_closed(v.closed, c->node_id, round, &aborted, out, &member);
    if (rc < 0) {
        fmt_err(err, errlen, rc, "round %d: malformed close record '%.200s'", round,
                v.closed->value);
    } else if (aborted >= 0) {
        rc = fmt_err(err, errlen, -ETIMEDOUT,
                     "only %d of the %d nodes needed (--nnodes %s) joined round %d within "
                     "join_timeout=%g s; round aborted",
                     aborted, cfg->nnodes_min, want, round, cfg->join_timeout_s);
    } else if (!member) {
        rc =
            late(c, prefix, round, lease_id, "closed without this node (it was full)", err, errlen);
    }
    goto out;
etcd_failed:
    fmt_err(err, errlen, rc, "round %d: %s", round, ddprun_etcd_last_error(c->e));
out:
    view_free(&v);
    free(kconf);
    free(kround);
    free(kclosed);
    free(knode);
    free(kwait);
    free(base);
    free(have);
    return rc;
}

static int etcd_join(ddprun_rdzv_conn *c, const char *prefix, const ddprun_config *cfg,
                     const char *node_id, int *round, ddprun_assignment *out, char *err,
                     size_t errlen)
{
    (void)cfg;
    if (errlen)
        err[0] = '\0';
    snprintf(c->node_id, sizeof c->node_id, "%s", node_id);
    int64_t lease_id = 0;
    int rc = lease_get(c, &lease_id, err, errlen);
    if (rc < 0)
        return rc;
    if (!c->job_checked) {
        rc = job_check(c, prefix, round, err, errlen);
        if (rc < 0)
            return rc;
        c->job_checked = true;
    }
    /* A round that closed before we came: wait in the next, which the members start when they
     * see us waiting. */
    while ((rc = join_round(c, prefix, *round, lease_id, out, err, errlen)) == -EAGAIN)
        (*round)++;
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* The workers' store                                                                          */
/* ------------------------------------------------------------------------------------------ */

static int etcd_local_address(ddprun_rdzv_conn *c, char *buf, size_t n)
{
    const char *ip = ddprun_etcd_local_address(c->e);
    if (!*ip)
        return -ENOENT;
    snprintf(buf, n, "%s", ip);
    return 0;
}

static int etcd_publish_store(ddprun_rdzv_conn *c, const char *prefix, int round, const char *host,
                              int port)
{
    int64_t lease_id = 0;
    int rc = lease_get(c, &lease_id, NULL, 0);
    if (rc < 0)
        return rc;
    json_t *rec = json_pack("{sssi}", "host", host, "port", port);
    char *text = rec ? json_dumps(rec, JSON_COMPACT) : NULL;
    json_decref(rec);
    char *k = rkey(prefix, round, "store");
    rc = text && k ? ddprun_etcd_put(c->e, k, text, strlen(text), lease_id, NULL) : -ENOMEM;
    free(text);
    free(k);
    return rc;
}

static int etcd_find_store(ddprun_rdzv_conn *c, const char *prefix, int round, double timeout_s,
                           char *host, size_t hostlen, int *port)
{
    char *k = rkey(prefix, round, "store");
    if (!k)
        return -ENOMEM;
    int64_t deadline =
        mono_deadline_ns(timeout_s * 1000 > INT32_MAX ? INT32_MAX : (int)(timeout_s * 1000));
    int rc;
    for (;;) {
        ddprun_etcd_kv *kv = NULL;
        int64_t rev = 0;
        rc = ddprun_etcd_get(c->e, k, &kv, &rev);
        if (rc == 0) {
            json_error_t jerr;
            json_t *rec = json_loadb(kv->value, kv->value_len, 0, &jerr);
            const char *h = json_string_value(json_object_get(rec, "host"));
            json_int_t p = json_integer_value(json_object_get(rec, "port"));
            rc = h && p > 0 && p < 65536 ? 0 : -EPROTO;
            if (rc == 0) {
                snprintf(host, hostlen, "%s", h);
                *port = (int)p;
            }
            json_decref(rec);
            ddprun_etcd_kvs_free(kv, 1);
            break;
        }
        int left = mono_ms_left(deadline);
        if (left <= 0) {
            rc = -ETIMEDOUT;
            break;
        }
        if (lease_check(NULL, 0) < 0) {
            rc = -ENOLINK;
            break;
        }
        ddprun_etcd_event ev = {0};
        if (rc == -ENOENT)
            rc = ddprun_etcd_watch(c->e, k, false, rev, slice_ms(c, left), &ev);
        ddprun_etcd_event_clear(&ev);
        if (rc < 0 && rc != -ETIMEDOUT && rc != -ESTALE)
            mono_sleep_until(mono_deadline_ns(RETRY_MS));
    }
    free(k);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Failures, the exit barrier, liveness                                                        */
/* ------------------------------------------------------------------------------------------ */

static int etcd_clear_worker_keys(rdzv_server *srv, ddprun_rdzv_conn *c, const char *prefix,
                                  int round, int nnodes, double timeout_s)
{
    /* Every round's store is a new one: there is nothing of an earlier attempt to clear. */
    (void)srv, (void)c, (void)prefix, (void)round, (void)nnodes, (void)timeout_s;
    return 0;
}

static int etcd_publish_failure(ddprun_rdzv_conn *c, const char *prefix, int round,
                                const char *json)
{
    if (!json || !*json)
        return -EINVAL;
    char *k = rkey(prefix, round, "failed"), *have = NULL;
    bool created = false;
    int rc = k ? put_once(c->e, k, json, 0, &created) : -ENOMEM;
    if (rc == 0 && !created && get_str(c->e, k, &have, NULL) == 0)
        created = strcmp(have, json) == 0;
    free(k);
    free(have);
    return rc < 0 ? rc : created ? 1 : 0;
}

/*
 * The monitor's wait: follows round `round`'s keys from the revision last seen, for up to
 * timeout_ms. Returns 0 with the failure report, or -ETIMEDOUT: nothing failed, though another
 * change (a node joined, waiting or gone) may have come, which dead_nodes() and num_waiting()
 * then read. etcd out of reach is no failure here: the lease decides (heartbeat()).
 */
static int etcd_wait_failure(ddprun_rdzv_conn *c, const char *prefix, int round, int timeout_ms,
                             char **json)
{
    int64_t deadline = mono_deadline_ns(timeout_ms < 0 ? 0 : timeout_ms);
    char *kf = rkey(prefix, round, "failed"), *base = rkey(prefix, round, "%s", "");
    int rc = -ENOMEM;
    if (!kf || !base)
        goto out;
    if (c->watch_round != round) {
        char *text = NULL;
        int64_t rev = 0;
        rc = get_str(c->e, kf, &text, &rev);
        if (rc == 0) {
            *json = text;
            goto out;
        }
        if (rc != -ENOENT)
            goto unreachable;
        c->watch_round = round;
        c->watch_rev = rev;
        c->dirty_dead = c->dirty_waiting = true;
    }
    for (;;) {
        int left = mono_ms_left(deadline);
        if (left <= 0) {
            rc = -ETIMEDOUT;
            goto out;
        }
        ddprun_etcd_event ev = {0};
        rc = ddprun_etcd_watch(c->e, base, true, c->watch_rev, left, &ev);
        if (rc == -ESTALE) {
            c->watch_round = -1; /* read again from the start */
            rc = -ETIMEDOUT;
            goto out;
        }
        if (rc < 0) {
            ddprun_etcd_event_clear(&ev);
            if (rc == -ETIMEDOUT)
                goto out;
            goto unreachable;
        }
        c->watch_rev = ev.kv.mod_revision;
        bool failed = ev.type == DDPRUN_ETCD_PUT && strcmp(ev.kv.key, kf) == 0;
        if (failed) {
            *json = strdup(ev.kv.value);
            rc = *json ? 0 : -ENOMEM;
        } else {
            c->dirty_dead = c->dirty_waiting = true;
            rc = -ETIMEDOUT;
        }
        ddprun_etcd_event_clear(&ev);
        goto out;
    }
unreachable:
    /* Out of reach: wait out the slice, then let the caller look at the lease. */
    {
        int left = mono_ms_left(deadline);
        if (left > 0)
            mono_sleep_until(mono_deadline_ns(left));
    }
    rc = -ETIMEDOUT;
out:
    free(kf);
    free(base);
    return rc;
}

static int etcd_exit_barrier(ddprun_rdzv_conn *c, const char *prefix, int round, int nnodes,
                             double timeout_s, int poll_ms, char **failure)
{
    (void)poll_ms; /* a watch: woken by the change itself */
    char *kme = rkey(prefix, round, "exit/%s", c->node_id),
         *kdone = rkey(prefix, round, "exit/done");
    char *kf = rkey(prefix, round, "failed"), *kend = rkey(prefix, -1, "ended");
    char *base = rkey(prefix, round, "%s", ""), *kexit = rkey(prefix, round, "exit/");
    int64_t deadline = timeout_s < 0 ? INT64_MAX : mono_now_ns() + (int64_t)(timeout_s * 1e9);
    double failing_since = -1;
    int rc = -ENOMEM;
    if (!kme || !kdone || !kf || !kend || !base || !kexit)
        goto out;
    bool passed_here = false; /* kme is written */
    for (;;) {
        round_view v = {0};
        rc = passed_here ? 0 : ddprun_etcd_put(c->e, kme, "1", 1, 0, NULL);
        passed_here = rc == 0;
        if (rc == 0)
            rc = view_read(c, prefix, round, &v);
        if (rc == 0) {
            int passed = 0;
            bool done = false;
            const char *failed = NULL;
            for (size_t i = 0; i < v.n; i++) {
                if (strcmp(v.kvs[i].key, kf) == 0)
                    failed = v.kvs[i].value;
                else if (strcmp(v.kvs[i].key, kdone) == 0)
                    done = true;
                else if (strncmp(v.kvs[i].key, kexit, strlen(kexit)) == 0)
                    passed++;
            }
            if (failed) {
                *failure = strdup(failed);
                rc = *failure ? 1 : -ENOMEM;
                view_free(&v);
                goto out;
            }
            if (!done && passed >= nnodes) {
                /* The last to pass says so, and marks the run id as used (job_check()). */
                bool created = false;
                rc = put_once(c->e, kdone, "1", 0, &created);
                int64_t lid = 0;
                if (rc == 0 && created &&
                    ddprun_etcd_lease_grant(c->e, ENDED_TTL_S, &lid, NULL) == 0) {
                    char when[32], note[512];
                    format_time(wall_now_s(), when, sizeof when);
                    snprintf(note, sizeof note, "ended at %s, last node %.300s", when, c->node_id);
                    put_once(c->e, kend, note, lid, &created);
                }
                done = rc == 0;
            }
            if (done) {
                view_free(&v);
                rc = 0;
                goto out;
            }
            int left = deadline == INT64_MAX ? INT32_MAX : mono_ms_left(deadline);
            if (left <= 0) {
                view_free(&v);
                rc = -ETIMEDOUT;
                goto out;
            }
            ddprun_etcd_event ev = {0};
            rc = lease_check(NULL, 0);
            if (rc == 0)
                rc = ddprun_etcd_watch(c->e, base, true, v.revision, slice_ms(c, left), &ev);
            ddprun_etcd_event_clear(&ev);
            view_free(&v);
            if (rc == -ENOLINK)
                goto out;
            if (rc == -ETIMEDOUT && mono_ms_left(deadline) <= 0)
                goto out;
            if (rc == 0 || rc == -ETIMEDOUT || rc == -ESTALE) {
                failing_since = -1;
                continue;
            }
        }
        if (!retry_later(c, rc, &failing_since))
            goto out;
    }
out:
    free(kme);
    free(kdone);
    free(kf);
    free(kend);
    free(base);
    free(kexit);
    return rc;
}

static int etcd_exit_done(ddprun_rdzv_conn *c, const char *prefix, int round)
{
    char *k = rkey(prefix, round, "exit/done");
    ddprun_etcd_kv *kv = NULL;
    int rc = k ? ddprun_etcd_get(c->e, k, &kv, NULL) : -ENOMEM;
    free(k);
    ddprun_etcd_kvs_free(kv, rc == 0 ? 1 : 0);
    return rc == 0 ? 1 : rc == -ENOENT ? 0 : rc;
}

static int etcd_publish_conn(ddprun_rdzv_conn *c, const char *prefix, int round, int node_rank)
{
    /* Liveness is the lease's: no connection records. */
    (void)c, (void)prefix, (void)round, (void)node_rank;
    return 0;
}

static int etcd_conn_owner(ddprun_rdzv_conn *c, const char *prefix, int round, int nnodes,
                           const char *host, int port)
{
    (void)c, (void)prefix, (void)round, (void)nnodes, (void)host, (void)port;
    return -ENOENT;
}

/* The keepalive thread beats; this says whether the lease still stands (-ENOLINK: lost). */
static int etcd_heartbeat(ddprun_rdzv_conn *c, const char *prefix, int round, int node_rank,
                          char *err, size_t errlen)
{
    (void)c, (void)prefix, (void)round, (void)node_rank;
    return lease_check(err, errlen);
}

static int etcd_watch_open(const char *prefix, int round, int nnodes, int node_rank,
                           double dead_after_s, ddprun_rdzv_watch **out)
{
    (void)node_rank;    /* etcd watches every lease itself */
    (void)dead_after_s; /* the lease's TTL is the liveness timeout */
    if (!prefix || nnodes < 1 || round < 0)
        return -EINVAL;
    ddprun_rdzv_watch *w = calloc(1, sizeof *w);
    if (!w || !(w->prefix = strdup(prefix))) {
        free(w);
        return -ENOMEM;
    }
    w->round = round;
    w->nnodes = nnodes;
    *out = w;
    return 0;
}

static void etcd_watch_close(ddprun_rdzv_watch *w)
{
    if (!w)
        return;
    for (int i = 0; w->ids && i < w->nnodes; i++)
        free(w->ids[i]);
    free(w->ids);
    free(w->prefix);
    free(w);
}

/* The round's participants from its close record, once. */
static int watch_load(ddprun_rdzv_conn *c, ddprun_rdzv_watch *w)
{
    char *k = rkey(w->prefix, w->round, "closed"), *text = NULL;
    int rc = k ? get_str(c->e, k, &text, NULL) : -ENOMEM;
    free(k);
    if (rc < 0)
        return rc;
    json_error_t jerr;
    json_t *rec = json_loads(text, 0, &jerr), *list = json_object_get(rec, "nodes");
    free(text);
    rc = json_is_array(list) && (int)json_array_size(list) == w->nnodes ? 0 : -EPROTO;
    if (rc == 0 && !(w->ids = calloc((size_t)w->nnodes, sizeof *w->ids)))
        rc = -ENOMEM;
    for (int i = 0; rc == 0 && i < w->nnodes; i++) {
        const char *id = json_string_value(json_array_get(json_array_get(list, (size_t)i), 0));
        if (!id || !(w->ids[i] = strdup(id)))
            rc = id ? -ENOMEM : -EPROTO;
    }
    json_decref(rec);
    return rc;
}

/*
 * The participants whose node key is gone (their lease expired: dead), read again only after
 * wait_failure() saw the round change.
 */
static int etcd_dead_nodes(ddprun_rdzv_conn *c, ddprun_rdzv_watch *w, int *dead, int dead_cap)
{
    if (w->read && c->watch_round == w->round && !c->dirty_dead)
        goto report;
    int rc = w->ids ? 0 : watch_load(c, w);
    char *k = rkey(w->prefix, w->round, "node/");
    ddprun_etcd_kv *kvs = NULL;
    size_t n = 0;
    if (rc == 0)
        rc = k ? ddprun_etcd_range(c->e, k, &kvs, &n, NULL) : -ENOMEM;
    if (rc < 0) {
        free(k);
        return rc;
    }
    size_t klen = strlen(k);
    w->ndead = 0;
    for (int i = 0; i < w->nnodes; i++) {
        bool alive = false;
        for (size_t j = 0; j < n && !alive; j++)
            alive = strcmp(kvs[j].key + klen, w->ids[i]) == 0;
        if (!alive && w->ndead < (int)(sizeof w->dead / sizeof w->dead[0]))
            w->dead[w->ndead] = i;
        w->ndead += !alive;
    }
    ddprun_etcd_kvs_free(kvs, n);
    free(k);
    w->read = true;
    c->dirty_dead = false;
report:
    for (int i = 0; i < w->ndead && i < dead_cap && i < 16; i++)
        dead[i] = w->dead[i];
    return w->ndead;
}

static int etcd_num_waiting(ddprun_rdzv_conn *c, const char *prefix, int round, int64_t *count)
{
    if (c->watch_round == round && !c->dirty_waiting) {
        *count = c->waiting_seen;
        return 0;
    }
    char *k = rkey(prefix, round, "waiting/");
    ddprun_etcd_kv *kvs = NULL;
    size_t n = 0;
    int rc = k ? ddprun_etcd_range(c->e, k, &kvs, &n, NULL) : -ENOMEM;
    free(k);
    if (rc < 0)
        return rc;
    ddprun_etcd_kvs_free(kvs, n);
    c->waiting_seen = (int64_t)n;
    c->dirty_waiting = false;
    *count = (int64_t)n;
    return 0;
}

/* Revokes the node's lease with a client of its own (the others may be busy), within a second:
 * its keys go, and the other nodes' watches see it gone at once. */
static void etcd_leave(const ddprun_config *cfg)
{
    pthread_mutex_lock(&lease.mu);
    bool started = lease.started && !lease.left && !lease.lost;
    int64_t id = lease.id;
    lease.left = true;
    pthread_mutex_unlock(&lease.mu);
    if (!started)
        return;
    ddprun_etcd_options o;
    etcd_options(cfg, 1, &o); /* REQUEST_MIN_MS */
    ddprun_etcd *e = NULL;
    if (ddprun_etcd_create(cfg->rdzv_endpoint, &o, &e) == 0)
        ddprun_etcd_lease_revoke(e, id);
    ddprun_etcd_close(e);
}

const ddprun_backend_ops ddprun_backend_etcd = {
    .name = "etcd",
    .plan_store = etcd_plan_store,
    .connect = etcd_connect,
    .close = etcd_close,
    .join = etcd_join,
    .clear_worker_keys = etcd_clear_worker_keys,
    .publish_failure = etcd_publish_failure,
    .wait_failure = etcd_wait_failure,
    .exit_barrier = etcd_exit_barrier,
    .exit_done = etcd_exit_done,
    .publish_conn = etcd_publish_conn,
    .conn_owner = etcd_conn_owner,
    .heartbeat = etcd_heartbeat,
    .watch_open = etcd_watch_open,
    .dead_nodes = etcd_dead_nodes,
    .watch_close = etcd_watch_close,
    .num_waiting = etcd_num_waiting,
    .local_address = etcd_local_address,
    .publish_store = etcd_publish_store,
    .find_store = etcd_find_store,
    .store_dies_with_node = false,
    .gone_format = "left the rendezvous, or its lease expired (no renewal for %g s)",
    .leave = etcd_leave,
};
