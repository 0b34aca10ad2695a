/*
 * Tests of the store proxy (rdzv_proxy, proxy.c) and the root's multiplexed connections (mux.h)
 * over real sockets: a threaded root store, a threaded proxy in front of it, raw protocol
 * clients and librendezvous clients. What PyTorch's clients do through the proxy is checked by
 * tests/interop (the scenario's transcript through the proxy equals PyTorch's server's, both
 * generations); here: coalescing (N WAITs, one upstream, visible in the proxy's counters and
 * the root's STATUS), a CANCEL_WAIT of one coalesced waiter, private keys and authentication
 * end to end, read-your-writes with GETs coalesced, a legacy worker's watch, the root dying, a
 * proxy restarting, an upstream that does not multiplex, the root's own rules for MUX frames,
 * and embedded proxies sharing a loop. The rule for joining a GET and the pause of a proxy
 * whose root takes nothing are checked against a scripted root (fake_root()). Every wait is
 * bounded: sockets have a 10 s receive timeout, polls a deadline.
 */
#include "client.h"
#include "frames.h"
#include "rawconn.h"
#include "mux.h"
#include "proto.h"
#include "rdzv.h"
#include "check_main.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#define TOKEN "proxy-test-token-0123456789abcdef"

static uint8_t recv_u8(int fd)
{
    uint8_t b;
    recv_exact(fd, &b, 1);
    return b;
}

/* True if nothing arrives on fd within `ms` (used only to check that nothing more came). */
static bool quiet(int fd, int ms)
{
    struct pollfd p = {fd, POLLIN, 0};
    return poll(&p, 1, ms) == 0;
}

static void send_wait(int fd, int opcode, const char *key)
{
    frame f = {0};
    fr_u8(&f, (uint8_t)opcode);
    fr_u64(&f, 1);
    fr_str(&f, key);
    send_frame(fd, &f);
    fr_free(&f);
}

static void send_op(int fd, int opcode)
{
    frame f = {0};
    fr_u8(&f, (uint8_t)opcode);
    send_frame(fd, &f);
    fr_free(&f);
}

/* A PING and its echo: everything sent before it on fd has been answered. */
static void ping(int fd, uint32_t nonce)
{
    frame f = {0};
    fr_u8(&f, RDZV_M_PING);
    fr_u32(&f, nonce);
    send_frame(fd, &f);
    fr_free(&f);
    uint32_t got;
    recv_exact(fd, &got, 4);
    ck_assert_uint_eq(got, nonce);
}

/* ---- a root and a proxy ---- */

static rdzv_server *root;
static rdzv_proxy *proxy;
static int root_port, proxy_port;

static void start_root(const char *token)
{
    rdzv_server_options o;
    rdzv_server_options_init(&o);
    o.host = "127.0.0.1";
    o.port = 0;
    o.token = token;
    ck_assert_int_eq(rdzv_server_start(&o, &root), 0);
    root_port = rdzv_server_port(root);
}

static size_t proxy_max_pending; /* for the next proxy; 0: the default */

static int start_proxy_on(const char *token, int port, rdzv_proxy **out)
{
    rdzv_proxy_options o;
    rdzv_proxy_options_init(&o);
    if (proxy_max_pending)
        o.max_pending_output = proxy_max_pending;
    o.upstream_host = "127.0.0.1";
    o.upstream_port = root_port;
    o.port = port;
    o.token = token;
    o.connect_timeout_ms = 5000;
    return rdzv_proxy_start(&o, out);
}

static void start_both(const char *token)
{
    start_root(token);
    ck_assert_int_eq(start_proxy_on(token, 0, &proxy), 0);
    proxy_port = rdzv_proxy_port(proxy);
}

static rdzv_proxy_counters counters(void)
{
    rdzv_proxy_counters st;
    ck_assert_int_eq(rdzv_proxy_stats(proxy, &st), 0);
    return st;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Polls the proxy's counters until `worker_requests` reaches n (10 s at most). */
static void await_worker_requests(uint64_t n)
{
    int64_t end = now_ms() + 10000;
    while (counters().worker_requests < n) {
        ck_assert_msg(now_ms() < end, "the proxy saw %llu requests of %llu",
                      (unsigned long long)counters().worker_requests, (unsigned long long)n);
        poll(NULL, 0, 2);
    }
}

/* A number from the root's status JSON: ops.NAME, or a top-level member when `op` is NULL. */
static long long root_status(const char *section, const char *name)
{
    char *js;
    ck_assert_int_eq(rdzv_server_status(root, &js), 0);
    json_t *o = json_loads(js, 0, NULL);
    rdzv_free(js);
    ck_assert_ptr_nonnull(o);
    json_t *v =
        section ? json_object_get(json_object_get(o, section), name) : json_object_get(o, name);
    long long r = json_integer_value(v);
    json_decref(o);
    return r;
}

static rdzv_client *client_to(int port, const char *token)
{
    rdzv_client_options co;
    rdzv_client_options_init(&co);
    co.connect_timeout_ms = 5000;
    co.timeout_ms = 10000;
    co.token = token;
    rdzv_client *c = NULL;
    ck_assert_int_eq(rdzv_client_connect("127.0.0.1", port, &co, &c), 0);
    return c;
}

static void stop_both(void)
{
    rdzv_proxy_close(proxy);
    rdzv_server_close(root);
    proxy = NULL;
    root = NULL;
}

/* ---- tests ---- */

/* N WAITs on one key from N workers: one WAIT reaches the root, all N are released. */
START_TEST(waits_coalesce)
{
    enum { N = 8 };
    start_both(NULL);
    int fd[N];
    for (int i = 0; i < N; i++) {
        fd[i] = modern_client(proxy_port);
        send_wait(fd[i], RDZV_M_WAIT, "barrier/k");
    }
    await_worker_requests(2 * N); /* VALIDATE + WAIT each */
    rdzv_proxy_counters st = counters();
    ck_assert_uint_eq(st.coalesced, N - 1);
    ck_assert_uint_eq(st.upstream_requests, 1);
    ck_assert_int_eq(root_status("ops", "wait"), 1);
    ck_assert_int_eq(root_status(NULL, "connections"), 1);
    ck_assert_int_eq(root_status(NULL, "multiplexed_connections"), 1);

    rdzv_client *c = client_to(root_port, NULL);
    ck_assert_int_eq(rdzv_set(c, "barrier/k", "1", 1), 0);
    for (int i = 0; i < N; i++) {
        ck_assert_uint_eq(recv_u8(fd[i]), RDZV_WAIT_STOP_WAITING);
        ping(fd[i], 100 + (uint32_t)i); /* nothing else came before the echo */
        close(fd[i]);
    }
    rdzv_client_close(c);
    stop_both();
}
END_TEST

/* One coalesced waiter's CANCEL_WAIT answers it alone; the others stay waiting. */
START_TEST(cancel_one_coalesced_waiter)
{
    start_both(NULL);
    int a = modern_client(proxy_port), b = modern_client(proxy_port), c = modern_client(proxy_port);
    send_wait(a, RDZV_M_WAIT, "k");
    send_wait(b, RDZV_M_WAIT, "k");
    send_wait(c, RDZV_M_WAIT, "k");
    await_worker_requests(6);
    ck_assert_uint_eq(counters().coalesced, 2);
    send_op(b, RDZV_M_CANCEL_WAIT);
    ck_assert_uint_eq(recv_u8(b), RDZV_WAIT_CANCELED);
    ck_assert_int_eq(root_status(NULL, "waiters"), 1); /* the shared WAIT is still there */

    rdzv_client *w = client_to(root_port, NULL);
    ck_assert_int_eq(rdzv_set(w, "k", "v", 1), 0);
    ck_assert_uint_eq(recv_u8(a), RDZV_WAIT_STOP_WAITING);
    ck_assert_uint_eq(recv_u8(c), RDZV_WAIT_STOP_WAITING);
    ping(b, 7); /* b got nothing after its CANCELED */
    ping(a, 8);

    /* All members cancel: the group is given up at the root. */
    send_wait(a, RDZV_M_WAIT, "k2");
    send_wait(c, RDZV_M_WAIT, "k2");
    await_worker_requests(11); /* 9 so far, and the two WAITs */
    send_op(a, RDZV_M_CANCEL_WAIT);
    ck_assert_uint_eq(recv_u8(a), RDZV_WAIT_CANCELED);
    send_op(c, RDZV_M_CANCEL_WAIT);
    ck_assert_uint_eq(recv_u8(c), RDZV_WAIT_CANCELED);
    int64_t end = now_ms() + 5000;
    while (root_status(NULL, "waiters") != 0) {
        ck_assert(now_ms() < end);
        poll(NULL, 0, 2);
    }
    ck_assert_int_eq(rdzv_set(w, "k2", "v", 1), 0);
    ck_assert(quiet(a, 100) && quiet(c, 100));
    rdzv_client_close(w);
    close(a);
    close(b);
    close(c);
    stop_both();
}
END_TEST

/* A worker with a request outstanding is not coalesced: its replies keep their order. */
START_TEST(busy_worker_goes_one_for_one)
{
    start_both(NULL);
    int a = modern_client(proxy_port);
    send_wait(a, RDZV_M_WAIT, "x"); /* coalesced (a group of one) */
    send_wait(a, RDZV_M_WAIT, "y"); /* a has one outstanding: its own vconn */
    await_worker_requests(3);
    ck_assert_uint_eq(counters().upstream_requests, 2);
    rdzv_client *w = client_to(root_port, NULL);
    ck_assert_int_eq(rdzv_set(w, "y", "1", 1), 0);
    ck_assert_uint_eq(recv_u8(a), RDZV_WAIT_STOP_WAITING);
    ck_assert_int_eq(rdzv_set(w, "x", "1", 1), 0);
    ck_assert_uint_eq(recv_u8(a), RDZV_WAIT_STOP_WAITING);
    ping(a, 9);
    rdzv_client_close(w);
    close(a);
    stop_both();
}
END_TEST

/* Many workers reading and writing through the proxy: each reads its own writes, also while
 * GETs of the same key are being coalesced. */
START_TEST(read_your_writes)
{
    enum { N = 6, ROUNDS = 200 };
    start_both(NULL);
    rdzv_client *c[N];
    for (int i = 0; i < N; i++)
        c[i] = client_to(proxy_port, NULL);
    for (int r = 0; r < ROUNDS; r++)
        for (int i = 0; i < N; i++) {
            char v[32];
            int n = snprintf(v, sizeof(v), "%d-%d", i, r);
            void *got;
            size_t len;
            if (i == r % N)
                ck_assert_int_eq(rdzv_set(c[i], "shared", v, (size_t)n), 0);
            ck_assert_int_eq(rdzv_get(c[i], "shared", &got, &len), 0);
            if (i == r % N) {
                ck_assert_uint_eq(len, (size_t)n);
                ck_assert_mem_eq(got, v, (size_t)n);
            }
            rdzv_free(got);
        }
    for (int i = 0; i < N; i++)
        rdzv_client_close(c[i]);
    stop_both();
}
END_TEST

/* With a token: a private key through the proxy needs an authenticated worker; the proxy
 * itself authenticated upstream. A proxy without the token is no multiplexer for that root. */
START_TEST(private_keys_end_to_end)
{
    start_both(TOKEN);
    rdzv_client *authed = client_to(proxy_port, TOKEN);
    ck_assert_int_eq(rdzv_set(authed, "/ddprun/secret", "s", 1), 0);
    void *got;
    size_t len;
    ck_assert_int_eq(rdzv_get(authed, "/ddprun/secret", &got, &len), 0);
    ck_assert_uint_eq(len, 1);
    rdzv_free(got);
    ck_assert_int_eq(rdzv_set(authed, "open", "o", 1), 0);

    rdzv_client *anon = client_to(proxy_port, NULL);
    ck_assert_int_eq(rdzv_get(anon, "open", &got, &len), 0); /* open keys: allowed */
    rdzv_free(got);
    ck_assert_int_lt(rdzv_get(anon, "/ddprun/secret", &got, &len), 0); /* closed on it */
    rdzv_client_close(anon);

    /* A WAIT on a private key of an unauthenticated raw worker: refused, connection closed. */
    int fd = modern_client(proxy_port);
    send_wait(fd, RDZV_M_WAIT, "/ddprun-coll/x");
    ck_assert(closed_by_peer(fd));
    close(fd);
    rdzv_client_close(authed);

    rdzv_proxy *p2 = NULL;
    ck_assert_int_eq(start_proxy_on(NULL, 0, &p2), -EPROTONOSUPPORT);
    stop_both();
}
END_TEST

/* A legacy (PyTorch 1.x) worker's WATCH_KEY works through the proxy. */
START_TEST(legacy_watch)
{
    start_both(NULL);
    int fd = connect_to("127.0.0.1", proxy_port);
    frame f = {0};
    fr_u8(&f, RDZV_L_WATCH_KEY);
    fr_str(&f, "w");
    send_frame(fd, &f);
    ck_assert_uint_eq(recv_u8(fd), RDZV_WATCH_CALLBACK_REGISTERED);
    rdzv_client *c = client_to(root_port, NULL);
    ck_assert_int_eq(rdzv_set(c, "w", "v", 1), 0);
    ck_assert_uint_eq(recv_u8(fd), RDZV_WATCH_KEY_CREATED);
    /* then the key, the old value (none) and the new one, as vectors */
    uint64_t n;
    char buf[8];
    recv_exact(fd, &n, 8);
    ck_assert_uint_eq(n, 1);
    recv_exact(fd, buf, 1);
    fr_free(&f);
    rdzv_client_close(c);
    close(fd);
    stop_both();
}
END_TEST

/* The root dies: every worker's connection through the proxy closes promptly. */
START_TEST(root_dies)
{
    start_both(NULL);
    int a = modern_client(proxy_port), b = modern_client(proxy_port);
    send_wait(a, RDZV_M_WAIT, "never");
    ping(b, 1);
    rdzv_server_close(root);
    root = NULL;
    int64_t t0 = now_ms();
    ck_assert(closed_by_peer(a));
    ck_assert(closed_by_peer(b));
    ck_assert_int_lt(now_ms() - t0, 2000);
    ck_assert(counters().upstream_lost);
    close(a);
    close(b);
    rdzv_proxy_close(proxy);
    proxy = NULL;
}
END_TEST

/* The proxy restarts (on the same port): its workers see the store gone, reconnect, and find
 * the root's keys as a restarted store's clients would find a store that kept them. */
START_TEST(proxy_restarts)
{
    start_both(NULL);
    rdzv_client *c = client_to(proxy_port, NULL);
    ck_assert_int_eq(rdzv_set(c, "kept", "1", 1), 0);
    int fd = modern_client(proxy_port);
    send_wait(fd, RDZV_M_WAIT, "pending");
    await_worker_requests(4);
    rdzv_proxy_close(proxy);
    ck_assert(closed_by_peer(fd));
    close(fd);
    int64_t end = now_ms() + 5000; /* the root lets go of the old vconns' WAITs */
    while (root_status(NULL, "waiters") != 0) {
        ck_assert(now_ms() < end);
        poll(NULL, 0, 2);
    }
    ck_assert_int_eq(start_proxy_on(NULL, proxy_port, &proxy), 0);
    rdzv_client_close(c);
    c = client_to(proxy_port, NULL);
    void *got;
    size_t len;
    ck_assert_int_eq(rdzv_get(c, "kept", &got, &len), 0);
    ck_assert_mem_eq(got, "1", 1);
    rdzv_free(got);
    rdzv_client_close(c);
    stop_both();
}
END_TEST

/* ---- a scripted root: it answers the proxy's connection and probe, then only what the test
 * answers by hand, so that requests stay unanswered for as long as a test needs ---- */

static int fake_listen_fd, fake_fd = -1;
static rdzv__parser fake_parser;
static rdzv__limits fake_limits = {1 << 20, 1 << 20, 1024, 1 << 22};
static uint8_t fake_buf[1 << 16];
static size_t fake_len, fake_used;

/* Reads the next frame from the proxy into *r (pointing into fake_buf, valid until the next
 * call). */
static void fake_next(rdzv__request *r)
{
    memmove(fake_buf, fake_buf + fake_used, fake_len - fake_used);
    fake_len -= fake_used;
    fake_used = 0;
    for (;;) {
        int n = rdzv__parse(&fake_parser, &fake_limits, fake_buf, fake_len, r);
        ck_assert_int_ge(n, 0);
        if (n > 0) {
            fake_used = (size_t)n;
            return;
        }
        ssize_t k = recv(fake_fd, fake_buf + fake_len, sizeof(fake_buf) - fake_len, 0);
        ck_assert_msg(k > 0, "the proxy went away: %zd", k);
        fake_len += (size_t)k;
    }
}

static void fake_reply(uint32_t id, const void *p, size_t n)
{
    uint32_t hdr[2] = {id, (uint32_t)n};
    ck_assert_int_eq(send(fake_fd, hdr, 8, MSG_NOSIGNAL), 8);
    ck_assert_int_eq(send(fake_fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* Accepts the proxy and answers until its MUX probe (a PING in a MUX frame) is answered. */
static void *fake_root(void *arg)
{
    (void)arg;
    fake_fd = accept(fake_listen_fd, NULL, NULL);
    struct timeval tv = {10, 0};
    setsockopt(fake_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    rdzv__parser_init(&fake_parser);
    for (;;) {
        rdzv__request r;
        fake_next(&r);
        if (r.op == RDZV_OP_PING) {
            send(fake_fd, &r.u32, 4, MSG_NOSIGNAL);
        } else if (r.op == RDZV_OP_MUX) {
            fake_reply(r.u32, r.key + 2, 4); /* the PING's nonce */
            return NULL;
        }
    }
}

/* The next MUX frame from the proxy: its vconn id and the operation it carries. */
static enum rdzv_op fake_next_mux(uint32_t *id)
{
    for (;;) {
        rdzv__request r;
        fake_next(&r);
        if (r.op == RDZV_OP_MUX_CLOSE)
            continue;
        ck_assert_int_eq(r.op, RDZV_OP_MUX);
        *id = r.u32;
        return r.key[1] == RDZV_M_GET   ? RDZV_OP_GET
               : r.key[1] == RDZV_M_SET ? RDZV_OP_SET
                                        : RDZV_OP_COUNT;
    }
}

static void send_get(int fd, const char *key)
{
    frame f = {0};
    fr_u8(&f, RDZV_M_GET);
    fr_str(&f, key);
    send_frame(fd, &f);
    fr_free(&f);
}

static void expect_value(int fd, const char *want)
{
    uint64_t n;
    char buf[64];
    recv_exact(fd, &n, 8);
    ck_assert_uint_eq(n, strlen(want));
    recv_exact(fd, buf, n);
    ck_assert_mem_eq(buf, want, n);
}

/* Starts a proxy in front of the scripted root. */
static void start_fake_and_proxy(void)
{
    fake_len = fake_used = 0;
    struct sockaddr_in a = {0};
    socklen_t al = sizeof(a);
    a.sin_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    fake_listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_eq(bind(fake_listen_fd, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(listen(fake_listen_fd, 4), 0);
    getsockname(fake_listen_fd, (struct sockaddr *)&a, &al);
    root_port = ntohs(a.sin_port);
    pthread_t t;
    pthread_create(&t, NULL, fake_root, NULL);
    ck_assert_int_eq(start_proxy_on(NULL, 0, &proxy), 0);
    pthread_join(t, NULL);
    proxy_port = rdzv_proxy_port(proxy);
}

/* GETs of one key join one that is unanswered, but not across a write sent after it. */
START_TEST(get_joins_only_before_a_write)
{
    start_fake_and_proxy();
    int w1 = modern_client(proxy_port), w2 = modern_client(proxy_port);
    int w3 = modern_client(proxy_port), w4 = modern_client(proxy_port);
    uint32_t g1, g2, s;
    send_get(w1, "k");
    ck_assert_int_eq(fake_next_mux(&g1), RDZV_OP_GET);
    send_get(w2, "k"); /* joins: nothing was written since */
    await_worker_requests(4);
    frame f = {0};
    fr_u8(&f, RDZV_M_SET);
    fr_str(&f, "k");
    fr_str(&f, "new");
    send_frame(w3, &f);
    fr_free(&f);
    ck_assert_int_eq(fake_next_mux(&s), RDZV_OP_SET);
    send_get(w4, "k"); /* after a write: a GET of its own */
    ck_assert_int_eq(fake_next_mux(&g2), RDZV_OP_GET);
    ck_assert_uint_ne(g1, g2);
    rdzv_proxy_counters st = counters();
    ck_assert_uint_eq(st.coalesced, 1);
    ck_assert_uint_eq(st.upstream_requests, 3);

    /* The answers, in the root's order, each to its own. */
    uint8_t old[8 + 3] = {3, 0, 0, 0, 0, 0, 0, 0, 'o', 'l', 'd'};
    uint8_t new[8 + 3] = {3, 0, 0, 0, 0, 0, 0, 0, 'n', 'e', 'w'};
    fake_reply(g1, old, 5); /* split: the rest in a second frame */
    fake_reply(g1, old + 5, sizeof(old) - 5);
    fake_reply(g2, new, sizeof(new));
    expect_value(w1, "old");
    expect_value(w2, "old");
    expect_value(w4, "new");
    close(w1);
    close(w2);
    close(w3);
    close(w4);
    rdzv_proxy_close(proxy);
    proxy = NULL;
    close(fake_fd);
    close(fake_listen_fd);
}
END_TEST

/* A root that takes no requests: past max_pending_output of backlog the proxy stops reading its
 * workers (their requests wait in their sockets), and reads them again once the root takes
 * them; nothing is lost. */
START_TEST(slow_root_pauses_workers)
{
    enum { VALUE = 16 << 10, MAX_FRAMES = 16384 }; /* 256 MiB at most */
    proxy_max_pending = 256 << 10;
    start_fake_and_proxy();
    int w = modern_client(proxy_port);
    fcntl(w, F_SETFL, fcntl(w, F_GETFL) | O_NONBLOCK);
    frame f = {0};
    static char value[VALUE];
    fr_u8(&f, RDZV_M_SET);
    fr_str(&f, "k");
    fr_u64(&f, VALUE);
    fr_raw(&f, value, VALUE);
    size_t sent = 0, frames = 0;
    for (;;) { /* send until the worker's socket stays full for a second */
        ssize_t k = send(w, f.data + sent, f.len - sent, MSG_NOSIGNAL);
        if (k > 0) {
            sent += (size_t)k;
            if (sent == f.len) {
                sent = 0;
                frames++;
                ck_assert_msg(frames < MAX_FRAMES, "the proxy never stopped reading");
            }
            continue;
        }
        ck_assert(errno == EAGAIN || errno == EWOULDBLOCK);
        struct pollfd p = {w, POLLOUT, 0};
        if (poll(&p, 1, 1000) == 0)
            break;
    }
    /* The proxy took no more than was sent whole. */
    ck_assert_uint_le(counters().worker_requests, frames + 1);
    /* The root takes every request now: the proxy reads again, and all of them arrive. */
    for (size_t seen = 0; seen < frames; seen++) {
        uint32_t id;
        ck_assert_int_eq(fake_next_mux(&id), RDZV_OP_SET);
    }
    if (sent > 0) { /* the frame left half sent goes too */
        fcntl(w, F_SETFL, fcntl(w, F_GETFL) & ~O_NONBLOCK);
        while (sent < f.len) {
            ssize_t k = send(w, f.data + sent, f.len - sent, MSG_NOSIGNAL);
            ck_assert_int_gt(k, 0);
            sent += (size_t)k;
        }
        uint32_t id;
        ck_assert_int_eq(fake_next_mux(&id), RDZV_OP_SET);
        frames++;
    }
    ck_assert_uint_eq(counters().worker_requests, frames + 1); /* and the VALIDATE */
    fr_free(&f);
    close(w);
    rdzv_proxy_close(proxy);
    proxy = NULL;
    proxy_max_pending = 0;
    close(fake_fd);
    close(fake_listen_fd);
}
END_TEST

/* Sends one MUX frame for vconn `id` carrying frame[0..n) (a modern request). */
static void send_mux(int fd, uint32_t id, uint8_t flags, const void *req, size_t n)
{
    frame f = {0};
    rdzv__mux_put(&f, id, flags, req, n);
    send_frame(fd, &f);
    fr_free(&f);
}

/* Reads one reply frame header of the root; returns its vconn id and sets *len. */
static uint32_t recv_mux(int fd, uint32_t *len)
{
    uint32_t hdr[2];
    recv_exact(fd, hdr, 8);
    *len = hdr[1];
    return hdr[0];
}

/* The root's own rules for multiplexed connections, with raw frames: a store with a secret
 * multiplexes only an authenticated connection; a private key needs the vconn's flag; what
 * would close a connection closes its vconn alone; MUX_CLOSE lets go of a vconn's WAIT. */
START_TEST(root_mux_rules)
{
    start_root(TOKEN);
    static const uint8_t get_priv[] = {RDZV_M_GET, 9,   0,   0,   0,   0,   0,   0,   0,
                                       '/',        'd', 'd', 'p', 'r', 'u', 'n', '/', 'x'};
    static const uint8_t wait_k[] = {RDZV_M_WAIT, 1, 0, 0, 0, 0, 0, 0, 0,
                                     1,           0, 0, 0, 0, 0, 0, 0, 'k'};
    static const uint8_t ping[] = {RDZV_M_PING, 1, 2, 3, 4};
    uint32_t len;

    /* Not authenticated: the MUX closes the connection. */
    int raw = modern_client(root_port);
    send_mux(raw, 1, RDZV_MUX_AUTH, ping, sizeof(ping));
    ck_assert(closed_by_peer(raw));
    close(raw);

    rdzv_client *c = client_to(root_port, TOKEN); /* authenticated; its socket used raw */
    int fd = c->fd;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    send_mux(fd, 1, 0, get_priv, sizeof(get_priv)); /* vconn 1, not flagged: closed */
    ck_assert_uint_eq(recv_mux(fd, &len), 1);
    ck_assert_uint_eq(len, RDZV_MUX_CLOSED);
    send_mux(fd, 2, RDZV_MUX_AUTH, get_priv, sizeof(get_priv)); /* flagged: an empty value */
    ck_assert_uint_eq(recv_mux(fd, &len), 2);
    ck_assert_uint_eq(len, 8);
    uint64_t n;
    recv_exact(fd, &n, 8);
    ck_assert_uint_eq(n, 0);

    /* A WAIT on vconn 3, let go of by MUX_CLOSE; then an ADD on a non-number closes vconn 4
     * alone, and vconn 5 still answers. */
    send_mux(fd, 3, 0, wait_k, sizeof(wait_k));
    int64_t end = now_ms() + 5000;
    while (root_status(NULL, "waiters") != 1) {
        ck_assert(now_ms() < end);
        poll(NULL, 0, 2);
    }
    ck_assert_int_eq(root_status(NULL, "virtual_connections"), 2);
    frame f = {0};
    rdzv__mux_put_close(&f, 3);
    send_frame(fd, &f);
    while (root_status(NULL, "waiters") != 0) {
        ck_assert(now_ms() < end);
        poll(NULL, 0, 2);
    }
    static const uint8_t set_k[] = {RDZV_M_SET, 1, 0, 0, 0, 0, 0, 0, 0,  'k',
                                    1,          0, 0, 0, 0, 0, 0, 0, 'x'};
    static const uint8_t add_k[] = {RDZV_M_ADD, 1, 0, 0, 0, 0, 0, 0, 0,
                                    'k',        1, 0, 0, 0, 0, 0, 0, 0};
    send_mux(fd, 4, 0, set_k, sizeof(set_k));
    send_mux(fd, 4, 0, add_k, sizeof(add_k));
    ck_assert_uint_eq(recv_mux(fd, &len), 4);
    ck_assert_uint_eq(len, RDZV_MUX_CLOSED);
    send_mux(fd, 5, 0, ping, sizeof(ping));
    ck_assert_uint_eq(recv_mux(fd, &len), 5);
    ck_assert_uint_eq(len, 4);
    uint32_t nonce;
    recv_exact(fd, &nonce, 4);
    ck_assert_uint_eq(nonce, 0x04030201u);

    /* A MUX whose request is cut short: the whole connection is out of step and closed. */
    send_mux(fd, 6, 0, ping, 3);
    ck_assert(closed_by_peer(fd));
    fr_free(&f);
    rdzv_client_close(c);
    rdzv_server_close(root);
    root = NULL;
}
END_TEST

/* ---- embedded proxies: several on one caller's loop, as a harness runs them ---- */

enum { EMBEDDED = 3 };
static rdzv_proxy *embedded[EMBEDDED];
static int embedded_port[EMBEDDED];
static uv_async_t embedded_done;
static int embedded_rc = -1;

/* Closes the proxies on their loop once the clients are done. */
static void embedded_close(uv_async_t *a)
{
    for (int i = 0; i < EMBEDDED; i++)
        rdzv_proxy_close(embedded[i]);
    uv_close((uv_handle_t *)a, NULL);
}

/* The clients, one per proxy: a WAIT through each that a SET through the next releases. */
static void *embedded_clients(void *arg)
{
    (void)arg;
    int rc = 0;
    rdzv_client *c[EMBEDDED];
    for (int i = 0; i < EMBEDDED; i++) {
        rdzv_client_options co;
        rdzv_client_options_init(&co);
        co.connect_timeout_ms = 5000;
        co.timeout_ms = 10000;
        if (rdzv_client_connect("127.0.0.1", embedded_port[i], &co, &c[i]) < 0)
            rc = -1;
    }
    for (int i = 0; i < EMBEDDED && rc == 0; i++) {
        char key[16];
        snprintf(key, sizeof(key), "e/%d", i);
        rc = rdzv_set(c[(i + 1) % EMBEDDED], key, "v", 1);
        const char *keys[] = {key};
        if (rc == 0)
            rc = rdzv_wait(c[i], keys, 1, 5000);
    }
    for (int i = 0; i < EMBEDDED; i++)
        rdzv_client_close(c[i]);
    embedded_rc = rc;
    uv_async_send(&embedded_done);
    return NULL;
}

START_TEST(embedded_proxies_share_a_loop)
{
    start_root(NULL);
    uv_loop_t loop;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    for (int i = 0; i < EMBEDDED; i++) {
        rdzv_proxy_options o;
        rdzv_proxy_options_init(&o);
        o.upstream_host = "127.0.0.1";
        o.upstream_port = root_port;
        ck_assert_int_eq(rdzv_proxy_create(&loop, &o, &embedded[i]), 0);
        embedded_port[i] = rdzv_proxy_port(embedded[i]);
    }
    ck_assert_int_eq(root_status(NULL, "multiplexed_connections"), EMBEDDED);
    uv_async_init(&loop, &embedded_done, embedded_close);
    pthread_t t;
    pthread_create(&t, NULL, embedded_clients, NULL);
    uv_run(&loop, UV_RUN_DEFAULT); /* ends once every proxy's handles are closed */
    pthread_join(t, NULL);
    ck_assert_int_eq(embedded_rc, 0);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    rdzv_server_close(root);
    root = NULL;
}
END_TEST

int main(void)
{
    Suite *s = suite_create("proxy");
    check_tcase(s, "proxy", 60, waits_coalesce, cancel_one_coalesced_waiter,
                busy_worker_goes_one_for_one, read_your_writes, private_keys_end_to_end,
                legacy_watch, root_dies, proxy_restarts, get_joins_only_before_a_write,
                root_mux_rules, slow_root_pauses_workers, embedded_proxies_share_a_loop);
    return check_run(s);
}
