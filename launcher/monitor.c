/*
 * The monitor thread: while workers run, it blocks on the rendezvous (a connection of its own,
 * through the backend's operations) for the round's failure report, sends this node's
 * heartbeats, watches the other nodes' heartbeats and, on the agent that serves the store, their
 * monitor connections closing, and for an elastic job nodes waiting to join. Whatever it learns
 * goes to the loop through uv_async_send() (ddprun.c's remote_cb()).
 *
 * Also here, the join watch: a thread that, while this node waits at a rendezvous, says which
 * address failed to authenticate to the job's store (a node with another token), at once and
 * then every JOINWATCH_REPEAT_S until the rendezvous ends.
 *
 * Not done here: acting on what it reports (ddprun.c). Besides what the loop never changes
 * once the job runs (configuration, run prefix, store endpoint, token), it reads the round and
 * the assignment and writes its report under the agent's mutex.
 */
#include "agent.h"
#include "fmt.h"
#include "monoclock.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------- */
/* Monitor thread                                                                           */
/* ---------------------------------------------------------------------------------------- */

/*
 * The store's on_close hook (the store's thread, when this agent hosts it): notes the closed
 * connection's far end for the monitor, which looks it up among the nodes' connection records.
 * A ring: if more connections close within one monitor slice than it holds, the oldest are
 * forgotten, and a node among them counts as dead only once its heartbeats time out.
 */
void store_conn_closed(void *arg, const char *host, int port)
{
    agent *a = arg;
    pthread_mutex_lock(&a->mu);
    closed_peer *p = &a->closed[a->nclosed++ % MAX_CLOSED];
    snprintf(p->host, sizeof(p->host), "%s", host);
    p->port = port;
    pthread_mutex_unlock(&a->mu);
}

/* On the hosting agent: the node rank whose monitor connection closed since the last look, or
 * -1. A connection of this node, or one that is no node's monitor (a worker's), is no news. */
static int closed_node(agent *a, ddprun_rdzv_conn *c, int round, int nnodes, int me)
{
    closed_peer seen[MAX_CLOSED];
    pthread_mutex_lock(&a->mu);
    uint64_t n = a->nclosed - a->closed_seen;
    if (n > MAX_CLOSED)
        n = MAX_CLOSED;
    for (uint64_t i = 0; i < n; i++)
        seen[i] = a->closed[(a->nclosed - n + i) % MAX_CLOSED];
    a->closed_seen = a->nclosed;
    pthread_mutex_unlock(&a->mu);
    for (uint64_t i = 0; i < n; i++) {
        int r = a->rdzv->conn_owner(c, a->prefix, round, nnodes, seen[i].host, seen[i].port);
        if (r >= 0 && r != me)
            return r;
    }
    return -1;
}

/*
 * Node `dead` found dead (`why`: what happened to it): unless the round already ended well
 * (every node passed the exit barrier, after which nodes leave), publish it as the round's
 * failure, a node's record (its rank and host name, no worker), so that every node stops at once
 * with the same root cause, and hand the record to the loop. Runs on the monitor's thread with
 * its own client, so a store that is slow to answer never blocks the loop.
 */
static void report_dead_node(agent *a, ddprun_rdzv_conn *c, int round, int dead, const char *why,
                             char *report, size_t n)
{
    if (a->rdzv->exit_done(c, a->prefix, round) == 1)
        return;
    char host[256] = "";
    if (a->rdzv->node_host)
        a->rdzv->node_host(c, a->prefix, round, dead, host, sizeof(host));
    ddprun_failure f;
    ddprun_failure_init(&f, host, -1, -1, 1, 0, why);
    f.node_rank = dead;
    char *js = ddprun_failure_to_json(&f);
    if (!js) {
        char who[300];
        ddprun_node_name(dead, host, who, sizeof(who));
        snprintf(report, n, "%s: %s", who, why);
        return;
    }
    a->rdzv->publish_failure(c, a->prefix, round, js);
    snprintf(report, n, "%s", js);
    free(js);
}

bool store_gone_with_node(agent *a, int rc, char *msg, size_t n)
{
    if (!a->rdzv->store_dies_with_node || a->store ||
        (rc != -ECONNRESET && rc != -ENOTCONN && rc != -EPIPE && rc != -ECONNREFUSED))
        return false;
    /* A store still there, or one out of reach (a link down, a host that went silent), is
     * some other failure: only a refusal says that nothing serves it any more (a store at its
     * connection limit accepts and closes, which connect() retries and reports otherwise). */
    rdzv_client_options co;
    rdzv_client_options_init(&co);
    co.connect_timeout_ms = 2000;
    co.timeout_ms = 2000;
    co.refused_timeout_ms = 0;
    co.token = a->token[0] ? a->token : NULL;
    ddprun_rdzv_conn *probe = NULL;
    int prc = a->rdzv->connect(a->cfg, a->connect_host, a->store_port, &co, &probe, NULL, 0);
    a->rdzv->close(probe);
    if (prc != -ECONNREFUSED)
        return false;
    char ep[300];
    fmt_endpoint(ep, sizeof(ep), a->store_host, a->store_port);
    snprintf(msg, n,
             "the rendezvous store at %s is gone with its node; the %s backend cannot outlive "
             "it, so no restart can happen -- see --rdzv-backend etcd in ddprun(1), RENDEZVOUS "
             "BACKENDS (start the job again)",
             ep, a->rdzv->name);
    rdzv_set_lost(a);
    return true;
}

void rdzv_set_lost(agent *a)
{
    pthread_mutex_lock(&a->mu);
    a->rdzv_lost = true;
    pthread_mutex_unlock(&a->mu);
}

bool rdzv_is_lost(agent *a)
{
    pthread_mutex_lock(&a->mu);
    bool gone = a->rdzv_lost;
    pthread_mutex_unlock(&a->mu);
    return gone;
}

/*
 * Blocks on the store for the current round's failure key, beats, and watches the other nodes:
 * either wakes the loop. It uses a connection of its own (whose local end it publishes, so that
 * the store's host knows it when it closes), and waits in short slices so that it notices a new
 * round or the end of the job. A node is dead when its heartbeats stop for the liveness timeout
 * (ddprun_liveness()), or, seen by the store's host, at once when its monitor's connection
 * closes. The client's timeout outlasts the liveness timeout, so an outage the other nodes ride
 * out does not break this node's connection either.
 */
void *monitor_main(void *arg)
{
    agent *a = arg;
    double beat_s, dead_s;
    ddprun_liveness(a->cfg, &beat_s, &dead_s);
    int slice_ms = ddprun_monitor_slice_ms(beat_s, dead_s, 1);
    rdzv_client_options co;
    rdzv_client_options_init(&co);
    co.connect_timeout_ms = 10000;
    double timeout_s = dead_s + 2 < 5 ? 5 : dead_s + 2;
    co.timeout_ms = timeout_s < INT_MAX / 1000 ? (int)(timeout_s * 1000) : -1;
    co.token = a->token[0] ? a->token : NULL;
    ddprun_rdzv_conn *c = NULL;
    if (a->rdzv->connect(a->cfg, a->store_host, a->store_port, &co, &c, NULL, 0) < 0)
        return NULL;
    ddprun_rdzv_watch *hb = NULL;
    int hb_round = -1;
    bool dynamic = a->rdzv->num_waiting != NULL;
    bool reported = false;
    double last_beat = 0;
    for (;;) {
        pthread_mutex_lock(&a->mu);
        int round = a->monitor_round;
        int nnodes = a->asg.nnodes, me = a->asg.node_rank;
        bool hosting = a->store != NULL;
        pthread_mutex_unlock(&a->mu);
        if (round < 0)
            break;
        if (round != hb_round) {
            a->rdzv->watch_close(hb);
            hb = NULL;
            /* The store's host watches every node, the others their ring peers: O(nnodes) keys
             * per slice at the store in all (noderdzv.h, Heartbeats). */
            if (a->rdzv->watch_open(a->prefix, round, nnodes, hosting ? -1 : me, dead_s, &hb) < 0)
                break;
            hb_round = round;
            slice_ms = ddprun_monitor_slice_ms(beat_s, dead_s, nnodes);
            reported = false;
            a->rdzv->publish_conn(c, a->prefix, round, me);
            if (a->rdzv->publish_host)
                a->rdzv->publish_host(c, a->prefix, round, me, a->hostname);
            last_beat = 0;
        }
        char report[sizeof(a->remote_failure)] = "";
        char *json = NULL;
        int rc = a->rdzv->wait_failure(c, a->prefix, round, slice_ms, &json);
        if (rc == 0) {
            snprintf(report, sizeof(report), "%s", json);
            rdzv_free(json);
        } else if (rc != -ETIMEDOUT && store_gone_with_node(a, rc, report, sizeof(report))) {
            /* report says it all */
        } else if (rc != -ETIMEDOUT) {
            char ep[300];
            fmt_endpoint(ep, sizeof(ep), a->store_host, a->store_port);
            snprintf(report, sizeof(report), "lost the rendezvous store at %s (%s)", ep,
                     rdzv_strerror(rc));
        } else {
            double now = mono_now_s();
            char why_lost[800] = "";
            if (now - last_beat >= beat_s) {
                if (a->rdzv->heartbeat(c, a->prefix, round, me, why_lost, sizeof why_lost) ==
                    -ENOLINK) {
                    /* This node is out of the rendezvous for good: a sentence of its own. */
                    snprintf(report, sizeof(report),
                             "lost the rendezvous (%s at %s): %s; no restart can follow",
                             a->rdzv->name, a->cfg->rdzv_endpoint, why_lost);
                    rdzv_set_lost(a);
                }
                last_beat = now;
            }
            int dead[16];
            int nd = report[0] ? 0 : a->rdzv->dead_nodes(c, hb, dead, 16);
            int gone = hosting && !report[0] ? closed_node(a, c, round, nnodes, me) : -1;
            int64_t waiting = 0;
            char why[160];
            if (report[0]) {
                /* said above */
            } else if (gone >= 0) {
                snprintf(why, sizeof(why),
                         "closed its connection to the store (its ddprun exited or was killed)");
                report_dead_node(a, c, round, gone, why, report, sizeof(report));
            } else if (nd > 0) {
                snprintf(why, sizeof(why), a->rdzv->gone_format, dead_s);
                report_dead_node(a, c, round, dead[0], why, report, sizeof(report));
            } else if (dynamic && a->rdzv->num_waiting(c, a->prefix, round, &waiting) == 0 &&
                       waiting > 0) {
                snprintf(report, sizeof(report), "%s", MEMBERSHIP_CHANGE);
            }
        }
        if (report[0] && !reported) {
            reported = true;
            pthread_mutex_lock(&a->mu);
            snprintf(a->remote_failure, sizeof(a->remote_failure), "%s", report);
            a->remote_round = round;
            pthread_mutex_unlock(&a->mu);
            uv_async_send(&a->remote);
        }
        if (reported) {
            /* Reported (or the store is gone): nothing more to watch this round. */
            pthread_mutex_lock(&a->mu);
            while (a->monitor_round == round)
                pthread_cond_wait(&a->cv, &a->mu);
            pthread_mutex_unlock(&a->mu);
        }
    }
    a->rdzv->watch_close(hb);
    a->rdzv->close(c);
    return NULL;
}

void monitor_set_round(agent *a, int round)
{
    pthread_mutex_lock(&a->mu);
    a->monitor_round = round;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

/* ---------------------------------------------------------------------------------------- */
/* Join watch                                                                               */
/* ---------------------------------------------------------------------------------------- */

#define JOINWATCH_REPEAT_S 30.0 /* how often a failed authentication is said again */
#define JOINWATCH_WAIT_MS 5000  /* a waiting node's look for the record: one WAIT per slice */

/*
 * The agent serving the store in-process: the failed authentications its server counted
 * (security.auth_failed of the status JSON) and the last one's peer. Returns the count, 0 when
 * there were none or the status cannot be had.
 */
static int64_t served_auth_failures(agent *a, char *peer, size_t n)
{
    pthread_mutex_lock(&a->mu);
    char *js = NULL;
    int rc = a->store ? rdzv_server_status(a->store, &js) : -ENOENT;
    pthread_mutex_unlock(&a->mu);
    if (rc < 0)
        return 0;
    json_t *o = json_loads(js, 0, NULL), *sec = json_object_get(o, "security");
    rdzv_free(js);
    int64_t count = json_integer_value(json_object_get(sec, "auth_failed"));
    const char *p =
        json_string_value(json_object_get(json_object_get(sec, "last_auth_failure"), "peer"));
    snprintf(peer, n, "%s", p ? p : "");
    json_decref(o);
    return p ? count : 0;
}

/*
 * The join watch's thread (store-backed rendezvous with a token only): parks until a
 * rendezvous starts (joinwatch_set()), then, with a connection of its own, looks for the run's
 * auth_failed record (noderdzv.h) in WAITs of JOINWATCH_WAIT_MS; the agent serving the store
 * looks at its server's counters every second and publishes the record first. A record with a
 * higher count than said is said at once, the same one again after JOINWATCH_REPEAT_S, for as
 * long as the rendezvous lasts; between rendezvous it holds no connection. Never joined: exit()
 * ends it (ddprun.c's main()).
 */
void *joinwatch_main(void *arg)
{
    agent *a = arg;
    rdzv_client *c = NULL;
    int64_t said = 0, published = 0;
    double said_at = 0;
    for (;;) {
        pthread_mutex_lock(&a->mu);
        if (!a->joining && c) {
            /* Between rendezvous: no connection of its own beside the monitor's. */
            pthread_mutex_unlock(&a->mu);
            rdzv_client_close(c);
            c = NULL;
            pthread_mutex_lock(&a->mu);
        }
        while (!a->joining)
            pthread_cond_wait(&a->cv, &a->mu);
        bool hosting = a->store != NULL;
        pthread_mutex_unlock(&a->mu);
        if (!c) {
            rdzv_client_options co;
            rdzv_client_options_init(&co);
            co.connect_timeout_ms = 5000;
            co.timeout_ms = 2 * JOINWATCH_WAIT_MS;
            co.token = a->token;
            if (rdzv_client_connect(a->connect_host, a->store_port, &co, &c) < 0) {
                c = NULL;
                sleep(1);
                continue;
            }
        }
        char peer[80] = "";
        int64_t count = 0;
        if (hosting) {
            count = served_auth_failures(a, peer, sizeof peer);
            if (count > published &&
                ddprun_rdzv_publish_auth_failure(c, a->prefix, count, peer) == 0)
                published = count;
        }
        int rc = ddprun_rdzv_auth_failure(c, a->prefix, hosting ? 0 : JOINWATCH_WAIT_MS, &count,
                                          peer, sizeof peer);
        if (rc < 0 && rc != -ETIMEDOUT && rc != -EPROTO) {
            rdzv_client_close(c); /* a broken connection: a new one next time */
            c = NULL;
        }
        double now = mono_now_s();
        pthread_mutex_lock(&a->mu);
        bool joining = a->joining;
        pthread_mutex_unlock(&a->mu);
        if (rc == 0 && joining && (count > said || now - said_at >= JOINWATCH_REPEAT_S)) {
            char ep[300];
            fmt_endpoint(ep, sizeof(ep), a->store_host, a->store_port);
            say("waiting for the other nodes: %s failed to authenticate to the rendezvous store "
                "at %s (%lld failed authentication%s so far): that node does not have this "
                "job's token (--token-file, DDPRUN_TOKEN_FILE or DDPRUN_TOKEN); the join "
                "timeout is %g s",
                peer, ep, (long long)count, count == 1 ? "" : "s", a->cfg->join_timeout_s);
            said = count;
            said_at = now;
        }
        if (hosting || rc == 0)
            sleep(1); /* the record is there (or looked at once): pace the looks */
    }
    return NULL;
}

void joinwatch_set(agent *a, bool joining)
{
    pthread_mutex_lock(&a->mu);
    a->joining = joining;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}
