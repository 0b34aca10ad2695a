/*
 * --store-proxy on: this node's workers reach the store through a store proxy (rdzv_proxy,
 * rendezvous/proxy.c) that runs on a thread of ddprun's, listens on 127.0.0.1 and carries all
 * their connections to the round's store over one multiplexed connection. The workers get the
 * proxy's endpoint as MASTER_ADDR and MASTER_PORT (spawn.c); ddprun's own agent connection
 * stays direct.
 *
 * The proxy is started once the round's store is known (after the rendezvous, on the thread
 * pool: connecting may take a while), kept across rounds while the store stays where it is,
 * and replaced when the store moves (a backend that serves each round's store on its rank 0).
 * A store that does not multiplex (a PyTorch store as the c10d endpoint), or any failure to
 * start, leaves the workers on the store itself, with one line saying so. A proxy that loses
 * the store closes its workers' connections, as the store's own death would: the workers fail
 * and the node fails with them, and ddprun's monitor sees the store's loss as without a proxy.
 */
#include "agent.h"
#include "fmt.h"

#include <stdio.h>
#include <string.h>

static void proxy_log(void *arg, int level, const char *msg)
{
    (void)arg;
    if (level <= RDZV_LOG_WARN)
        say("store proxy: %s", msg);
}

/* Where this node reaches the round's store: the published endpoint of a store that moves with
 * the rounds, else the one the agent connected to. */
static void upstream_of(const agent *a, const store_job *j, const char **host, int *port)
{
    if (a->rdzv->publish_store) {
        *host = j->store_host;
        *port = j->store_port;
    } else {
        *host = a->connect_host;
        *port = a->store_port;
    }
}

/* On the thread pool, after a successful rendezvous: keeps the agent's proxy when it serves the
 * same store and still has it, or starts one for the round's store into j->proxy. */
void store_proxy_job(agent *a, store_job *j)
{
    const char *host;
    int port;
    upstream_of(a, j, &host, &port);
    if (a->proxy && a->proxy_up_port == port && strcmp(a->proxy_up_host, host) == 0) {
        rdzv_proxy_counters st;
        if (rdzv_proxy_stats(a->proxy, &st) == 0 && !st.upstream_lost) {
            j->keep_proxy = true;
            return;
        }
    }
    rdzv_proxy_options o;
    rdzv_proxy_options_init(&o);
    o.upstream_host = host;
    o.upstream_port = port;
    o.token = a->token[0] ? a->token : NULL;
    o.log = proxy_log;
    o.connect_timeout_ms = (int)(a->cfg->join_timeout_s * 1000);
    char ep[300];
    fmt_endpoint(ep, sizeof(ep), host, port);
    int rc = rdzv_proxy_start(&o, &j->proxy);
    if (rc == -EPROTONOSUPPORT)
        snprintf(j->proxy_note, sizeof(j->proxy_note),
                 "store proxy: the store at %s does not multiplex connections (not a ddprun "
                 "store): this node's workers reach it directly",
                 ep);
    else if (rc < 0)
        snprintf(j->proxy_note, sizeof(j->proxy_note),
                 "store proxy: cannot start one for the store at %s (%s): this node's workers "
                 "reach it directly",
                 ep, rdzv_strerror(rc));
}

/* On the loop, before the round's workers start: the round's proxy (or none) becomes the
 * agent's; one replaced is closed. */
void store_proxy_adopt(agent *a, store_job *j)
{
    if (j->proxy_note[0])
        say("%s", j->proxy_note);
    if (j->keep_proxy)
        return;
    rdzv_proxy *old = a->proxy;
    a->proxy = j->proxy;
    j->proxy = NULL;
    a->proxy_port = a->proxy ? rdzv_proxy_port(a->proxy) : 0;
    if (a->proxy) {
        const char *host;
        int port;
        upstream_of(a, j, &host, &port);
        snprintf(a->proxy_up_host, sizeof(a->proxy_up_host), "%s", host);
        a->proxy_up_port = port;
    }
    rdzv_proxy_close(old);
}
