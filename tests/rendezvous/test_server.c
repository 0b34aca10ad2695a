/*
 * Tests of the libuv server over real sockets, with raw protocol clients: both generations on
 * one port, byte-at-a-time frames, a half-sent frame that must not stall anyone, malformed and
 * over-limit input closing only its own connection, a reset connection logged with its peer's
 * address, the connection cap, running out of file descriptors, back-pressure, IPv6, a
 * handed-in listening fd, and the embedded mode.
 */
#include "frames.h"
#include "rawconn.h"
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
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

/* ---- log capture ---- */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_text[8192];

static void capture_log(void *arg, int level, const char *msg)
{
    (void)arg;
    (void)level;
    pthread_mutex_lock(&log_mu);
    size_t n = strlen(log_text);
    snprintf(log_text + n, sizeof(log_text) - n, "%s\n", msg);
    pthread_mutex_unlock(&log_mu);
}

static bool log_has(const char *needle)
{
    pthread_mutex_lock(&log_mu);
    bool r = strstr(log_text, needle) != NULL;
    pthread_mutex_unlock(&log_mu);
    return r;
}

/* ---- raw clients ---- */
/* Reads a length-prefixed value and checks it. */
static void expect_vec(int fd, const char *want)
{
    uint64_t n;
    recv_exact(fd, &n, 8);
    ck_assert_uint_eq(n, strlen(want));
    char buf[256];
    recv_exact(fd, buf, n);
    ck_assert_mem_eq(buf, want, n);
}

/* SET then GET round trip on a modern connection. */
static void roundtrip(int fd, const char *k, const char *v)
{
    frame f = {0};
    fr_u8(&f, RDZV_M_SET);
    fr_str(&f, k);
    fr_str(&f, v);
    fr_u8(&f, RDZV_M_GET);
    fr_str(&f, k);
    send_frame(fd, &f);
    expect_vec(fd, v);
    fr_free(&f);
}

static rdzv_server *start(rdzv_server_options *o)
{
    rdzv_server *srv = NULL;
    o->log = capture_log;
    ck_assert_int_eq(rdzv_server_start(o, &srv), 0);
    ck_assert_int_gt(rdzv_server_port(srv), 0);
    return srv;
}

static rdzv_server *start_default(void)
{
    rdzv_server_options o;
    rdzv_server_options_init(&o);
    return start(&o);
}

START_TEST(both_generations_one_port)
{
    rdzv_server *srv = start_default();
    int port = rdzv_server_port(srv);
    frame f = {0};

    /* A modern client: VALIDATE, SET, GET and PING pipelined in one segment. */
    int m = connect_to("127.0.0.1", port);
    fr_u8(&f, RDZV_M_VALIDATE);
    fr_u32(&f, RDZV_VALIDATE_MAGIC);
    fr_u8(&f, RDZV_M_SET);
    fr_str(&f, "/k");
    fr_str(&f, "modern");
    fr_u8(&f, RDZV_M_GET);
    fr_str(&f, "/k");
    fr_u8(&f, RDZV_M_PING);
    fr_u32(&f, 77);
    send_frame(m, &f);
    expect_vec(m, "modern");
    uint32_t nonce;
    recv_exact(m, &nonce, 4);
    ck_assert_uint_eq(nonce, 77);

    /* A legacy client and its silent second socket, on the same port. */
    int silent = connect_to("127.0.0.1", port);
    int l = connect_to("127.0.0.1", port);
    fr_u8(&f, RDZV_L_GET);
    fr_str(&f, "/k");
    fr_u8(&f, RDZV_L_ADD);
    fr_str(&f, "/n");
    fr_u64(&f, 3);
    send_frame(l, &f);
    expect_vec(l, "modern");
    int64_t v;
    recv_exact(l, &v, 8);
    ck_assert_int_eq(v, 3);

    char *json = NULL;
    ck_assert_int_eq(rdzv_server_status(srv, &json), 0);
    json_error_t err;
    json_t *o = json_loads(json, 0, &err);
    ck_assert_ptr_nonnull(o);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "connections")), 3);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "keys")), 2);
    json_t *proto = json_object_get(o, "protocol");
    ck_assert_int_eq(json_integer_value(json_object_get(proto, "legacy")), 1);
    ck_assert_int_eq(json_integer_value(json_object_get(proto, "modern")), 1);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(o, "ops"), "get")), 2);
    json_decref(o);
    rdzv_free(json);

    close(m);
    close(l);
    close(silent);
    fr_free(&f);
    rdzv_server_close(srv);
}
END_TEST

/* The status's "traffic" object of a server, parsed: requests, bytes_in, bytes_out. */
static void traffic(rdzv_server *srv, json_int_t out[3])
{
    char *json = NULL;
    ck_assert_int_eq(rdzv_server_status(srv, &json), 0);
    json_error_t err;
    json_t *o = json_loads(json, 0, &err);
    ck_assert_ptr_nonnull(o);
    json_t *t = json_object_get(o, "traffic");
    ck_assert_ptr_nonnull(t);
    const char *names[3] = {"requests", "bytes_in", "bytes_out"};
    for (int i = 0; i < 3; i++) {
        ck_assert(json_is_integer(json_object_get(t, names[i])));
        out[i] = json_integer_value(json_object_get(t, names[i]));
    }
    json_decref(o);
    rdzv_free(json);
}

/* The traffic counters start at 0 and count each request, and the bytes read and written. */
START_TEST(traffic_counters)
{
    rdzv_server *srv = start_default();
    json_int_t t[3];
    traffic(srv, t);
    ck_assert_int_eq(t[0], 0);
    ck_assert_int_eq(t[1], 0);
    ck_assert_int_eq(t[2], 0);

    int m = connect_to("127.0.0.1", rdzv_server_port(srv));
    frame f = {0};
    fr_u8(&f, RDZV_M_VALIDATE);
    fr_u32(&f, RDZV_VALIDATE_MAGIC);
    fr_u8(&f, RDZV_M_SET);
    fr_str(&f, "/k");
    fr_str(&f, "value");
    fr_u8(&f, RDZV_M_GET);
    fr_str(&f, "/k");
    fr_u8(&f, RDZV_M_PING);
    fr_u32(&f, 7);
    size_t sent = f.len;
    send_frame(m, &f);
    expect_vec(m, "value");
    uint32_t nonce;
    recv_exact(m, &nonce, 4);
    /* The replies were written (and counted) before the client could read them. */
    traffic(srv, t);
    ck_assert_int_eq(t[0], 4);
    ck_assert_int_eq(t[1], (json_int_t)sent);
    ck_assert_int_eq(t[2], 8 + 5 + 4);

    fr_u8(&f, RDZV_M_GET);
    fr_str(&f, "/k");
    sent += f.len;
    send_frame(m, &f);
    expect_vec(m, "value");
    traffic(srv, t);
    ck_assert_int_eq(t[0], 5);
    ck_assert_int_eq(t[1], (json_int_t)sent);
    ck_assert_int_eq(t[2], 2 * (8 + 5) + 4);

    close(m);
    fr_free(&f);
    rdzv_server_close(srv);
}
END_TEST

/* Frames after one larger than the read buffer (read straight into the connection's pending
 * bytes) are run, in order, from the same stream; the bytes are counted once. */
START_TEST(large_frame_then_pipelined)
{
    rdzv_server *srv = start_default();
    enum { BIG = 3 << 20 };
    uint8_t *val = malloc(BIG), *got = malloc(BIG);
    ck_assert(val && got);
    for (size_t i = 0; i < BIG; i++)
        val[i] = (uint8_t)(i * 131 + 7);
    int m = connect_to("127.0.0.1", rdzv_server_port(srv));
    frame f = {0};
    fr_u8(&f, RDZV_M_VALIDATE);
    fr_u32(&f, RDZV_VALIDATE_MAGIC);
    fr_u8(&f, RDZV_M_SET);
    fr_str(&f, "/big");
    fr_bytes(&f, val, BIG);
    fr_u8(&f, RDZV_M_GET);
    fr_str(&f, "/big");
    fr_u8(&f, RDZV_M_SET);
    fr_str(&f, "/small");
    fr_str(&f, "after");
    fr_u8(&f, RDZV_M_GET);
    fr_str(&f, "/small");
    fr_u8(&f, RDZV_M_PING);
    fr_u32(&f, 9);
    size_t sent = f.len;
    send_frame(m, &f);
    uint64_t n;
    recv_exact(m, &n, 8);
    ck_assert_uint_eq(n, BIG);
    recv_exact(m, got, BIG);
    ck_assert_int_eq(memcmp(got, val, BIG), 0);
    expect_vec(m, "after");
    uint32_t nonce;
    recv_exact(m, &nonce, 4);
    ck_assert_uint_eq(nonce, 9);
    json_int_t t[3];
    traffic(srv, t);
    ck_assert_int_eq(t[0], 6);
    ck_assert_int_eq(t[1], (json_int_t)sent);
    close(m);
    fr_free(&f);
    free(val);
    free(got);
    rdzv_server_close(srv);
}
END_TEST

/* A request sent one byte per send() is answered like a whole one. */
START_TEST(byte_at_a_time)
{
    rdzv_server *srv = start_default();
    int fd = modern_client(rdzv_server_port(srv));
    frame f = {0};
    fr_u8(&f, RDZV_M_SET);
    fr_str(&f, "slow-key");
    fr_str(&f, "slow-value");
    fr_u8(&f, RDZV_M_GET);
    fr_str(&f, "slow-key");
    for (size_t i = 0; i < f.len; i++)
        send_all(fd, f.data + i, 1);
    expect_vec(fd, "slow-value");
    close(fd);
    fr_free(&f);
    rdzv_server_close(srv);
}
END_TEST

/* One client holding a half-sent frame stalls nobody. */
START_TEST(half_sent_frame)
{
    rdzv_server *srv = start_default();
    int port = rdzv_server_port(srv);
    int a = modern_client(port), b = modern_client(port);
    frame f = {0};
    fr_u8(&f, RDZV_M_SET);
    fr_str(&f, "a-key");
    fr_str(&f, "a-value-that-is-long");
    send_all(a, f.data, f.len - 5); /* hold back the last five bytes */
    for (int i = 0; i < 100; i++)
        roundtrip(b, "b-key", "b-value");
    send_all(a, f.data + f.len - 5, 5);
    fr_reset(&f);
    fr_u8(&f, RDZV_M_GET);
    fr_str(&f, "a-key");
    send_frame(a, &f);
    expect_vec(a, "a-value-that-is-long");
    close(a);
    close(b);
    fr_free(&f);
    rdzv_server_close(srv);
}
END_TEST

/* Malformed or over-limit input closes that connection, with a log line naming the peer. */
START_TEST(bad_input_closes_one_connection)
{
    rdzv_server_options o;
    rdzv_server_options_init(&o);
    o.max_key_bytes = 16;
    rdzv_server *srv = start(&o);
    int port = rdzv_server_port(srv);
    int good = modern_client(port);
    frame f = {0};

    int bad = modern_client(port);
    fr_u8(&f, 0x42); /* unknown opcode */
    send_frame(bad, &f);
    ck_assert(closed_by_peer(bad));
    close(bad);

    bad = modern_client(port);
    fr_u8(&f, RDZV_M_GET);
    fr_u64(&f, 17); /* key over the limit: refused from the length alone */
    send_frame(bad, &f);
    ck_assert(closed_by_peer(bad));
    close(bad);

    bad = modern_client(port);
    fr_u8(&f, RDZV_M_SET);
    fr_str(&f, "n");
    fr_str(&f, "not a number");
    fr_u8(&f, RDZV_M_ADD);
    fr_str(&f, "n");
    fr_u64(&f, 1);
    send_frame(bad, &f);
    ck_assert(closed_by_peer(bad));
    close(bad);

    /* Garbage as the very first bytes of a connection (a legacy opcode out of range). */
    bad = connect_to("127.0.0.1", port);
    send_all(bad, "GET / HTTP/1.1\r\n\r\n", 18);
    ck_assert(closed_by_peer(bad));
    close(bad);

    roundtrip(good, "still", "serving");
    ck_assert(log_has("unknown opcode"));
    ck_assert(log_has("key longer than the limit"));
    ck_assert(log_has("not a decimal integer"));
    ck_assert(log_has("127.0.0.1:"));
    close(good);
    fr_free(&f);
    rdzv_server_close(srv);
}
END_TEST

/*
 * A connection that the peer resets is logged with the peer's address, although the socket can
 * no longer tell it (getpeername() fails once the reset has arrived): the server notes it at
 * accept. It used to read "closing connection from ?:0: connection reset by peer".
 */
START_TEST(reset_connection_names_its_peer)
{
    rdzv_server *srv = start_default();
    int fd = modern_client(rdzv_server_port(srv));
    roundtrip(fd, "k", "v"); /* accepted and read from: the reset reaches a read */
    struct sockaddr_in me;
    socklen_t ml = sizeof(me);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&me, &ml), 0);
    char want[64];
    snprintf(want, sizeof(want), "closing connection from 127.0.0.1:%d: ", ntohs(me.sin_port));
    struct linger rst = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &rst, sizeof(rst));
    close(fd); /* RST */
    for (int tries = 0; tries < 5000 && !log_has("closing connection from"); tries++)
        usleep(1000);
    ck_assert_msg(log_has(want), "no '%s' in the log:\n%s", want, log_text);
    ck_assert(!log_has("?:0"));
    rdzv_server_close(srv);
}
END_TEST

START_TEST(connection_cap)
{
    rdzv_server_options o;
    rdzv_server_options_init(&o);
    o.max_connections = 3;
    rdzv_server *srv = start(&o);
    int port = rdzv_server_port(srv);
    int fds[3];
    for (int i = 0; i < 3; i++) {
        fds[i] = modern_client(port);
        roundtrip(fds[i], "k", "v"); /* make sure each was accepted in order */
    }
    int extra = modern_client(port);
    ck_assert(closed_by_peer(extra));
    close(extra);
    ck_assert(log_has("connection limit"));
    roundtrip(fds[0], "k", "v");
    close(fds[1]);
    /* The slot frees once the server has seen the close; retry until it has (bounded). */
    bool ok = false;
    for (int tries = 0; tries < 200 && !ok; tries++) {
        int fd = modern_client(port);
        frame f = {0};
        fr_u8(&f, RDZV_M_PING);
        fr_u32(&f, 5);
        send_frame(fd, &f);
        uint32_t n;
        ok = recv(fd, &n, 4, MSG_WAITALL) == 4;
        close(fd);
        fr_free(&f);
    }
    ck_assert(ok);
    close(fds[0]);
    close(fds[2]);
    rdzv_server_close(srv);
}
END_TEST

/*
 * Out of file descriptors: the server runs in a child whose fd limit is tiny; connections
 * beyond it are shed, and once they close the server serves new clients again.
 */
START_TEST(out_of_fds)
{
    int up[2], down[2];
    ck_assert_int_eq(pipe(up), 0);
    ck_assert_int_eq(pipe(down), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        /* Room for stdio, the pipes, the loop's own descriptors and a few clients. */
        struct rlimit rl = {24, 24};
        setrlimit(RLIMIT_NOFILE, &rl);
        rdzv_server_options o;
        rdzv_server_options_init(&o);
        o.max_connections = 65536; /* not derived from the limit: run out of descriptors */
        rdzv_server *srv = NULL;
        int port = rdzv_server_start(&o, &srv) == 0 ? rdzv_server_port(srv) : -1;
        if (write(up[1], &port, sizeof(port)) != sizeof(port))
            _exit(2);
        char c;
        if (read(down[0], &c, 1) != 1) /* parent says: done */
            _exit(2);
        rdzv_server_close(srv);
        _exit(0);
    }
    int port;
    ck_assert_int_eq(read(up[0], &port, sizeof(port)), sizeof(port));
    ck_assert_int_gt(port, 0);
    int fds[40];
    for (int i = 0; i < 40; i++)
        fds[i] = connect_to("127.0.0.1", port); /* the kernel completes the handshake */
    int served = 0;
    for (int i = 0; i < 40; i++) {
        frame f = {0};
        fr_u8(&f, RDZV_M_VALIDATE);
        fr_u32(&f, RDZV_VALIDATE_MAGIC);
        fr_u8(&f, RDZV_M_PING);
        fr_u32(&f, 9);
        send(fds[i], f.data, f.len, MSG_NOSIGNAL);
        fr_free(&f);
        struct timeval tv = {0, 300000};
        setsockopt(fds[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        uint32_t n;
        served += recv(fds[i], &n, 4, MSG_WAITALL) == 4;
    }
    ck_assert_int_gt(served, 0);
    ck_assert_int_lt(served, 40);
    for (int i = 0; i < 40; i++)
        close(fds[i]);
    /* Still alive: a fresh client is served once the server has seen the closes. */
    bool ok = false;
    for (int tries = 0; tries < 300 && !ok; tries++) {
        int fd = modern_client(port);
        struct timeval tv = {0, 200000};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        frame f = {0};
        fr_u8(&f, RDZV_M_PING);
        fr_u32(&f, 10);
        send(fd, f.data, f.len, MSG_NOSIGNAL);
        fr_free(&f);
        uint32_t n;
        ok = recv(fd, &n, 4, MSG_WAITALL) == 4 && n == 10;
        close(fd);
    }
    ck_assert(ok);
    ck_assert_int_eq(write(down[1], "x", 1), 1);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}
END_TEST

/* WAIT across connections, and a waiter that disconnects. */
START_TEST(wait_across_connections)
{
    rdzv_server *srv = start_default();
    int port = rdzv_server_port(srv);
    int w = modern_client(port), gone = modern_client(port), s = modern_client(port);
    frame f = {0};
    fr_u8(&f, RDZV_M_WAIT);
    fr_u64(&f, 1);
    fr_str(&f, "late");
    send_all(w, f.data, f.len);
    send_frame(gone, &f);
    /* The waiter that leaves must not break the wake-up of the other. */
    fr_u8(&f, RDZV_M_PING);
    fr_u32(&f, 1);
    send_frame(gone, &f); /* ordered after its WAIT */
    uint32_t n;
    recv_exact(gone, &n, 4);
    close(gone);
    roundtrip(s, "late", "here");
    uint8_t r;
    recv_exact(w, &r, 1);
    ck_assert_int_eq(r, RDZV_WAIT_STOP_WAITING);
    close(w);
    close(s);
    fr_free(&f);
    rdzv_server_close(srv);
}
END_TEST

/* A client that sends requests but never reads is throttled; others are unaffected. */
START_TEST(back_pressure)
{
    rdzv_server_options o;
    rdzv_server_options_init(&o);
    o.max_pending_output = 4 << 20;
    rdzv_server *srv = start(&o);
    int port = rdzv_server_port(srv);
    int other = modern_client(port), hog = modern_client(port);
    static char big[1 << 20];
    memset(big, 'b', sizeof(big));
    frame f = {0};
    fr_u8(&f, RDZV_M_SET);
    fr_str(&f, "big");
    fr_bytes(&f, big, sizeof(big));
    send_frame(hog, &f);
    /* 64 GETs of 1 MiB without reading: the server must stop reading the hog, not buffer 64 MiB. */
    for (int i = 0; i < 64; i++) {
        fr_u8(&f, RDZV_M_GET);
        fr_str(&f, "big");
    }
    int fl = 1;
    setsockopt(hog, SOL_SOCKET, SO_SNDBUF, &fl, sizeof(fl));
    send_frame(hog, &f); /* small requests: fit in the socket buffers */
    roundtrip(other, "x", "y");
    /* Requests are held back once a reply backlog passes the limit, so what the server keeps
     * queued for the hog stays near max_pending_output (one 1 MiB reply of slack), instead of
     * the 64 MiB that answering all 64 pipelined GETs at once would queue. */
    /* The hog's GETs reach the server on their own schedule: poll (bounded) until its replies
     * back up, then check the bound while the hog still reads nothing. */
    json_int_t queued = 0;
    for (int tries = 0; tries < 5000 && queued == 0; tries++) {
        char *json = NULL;
        ck_assert_int_eq(rdzv_server_status(srv, &json), 0);
        json_t *st = json_loads(json, 0, NULL);
        queued = json_integer_value(json_object_get(st, "output_queued_bytes"));
        json_decref(st);
        rdzv_free(json);
        if (queued == 0)
            usleep(1000);
    }
    ck_assert_int_gt(queued, 0);
    ck_assert_int_le(queued, (json_int_t)o.max_pending_output + (2 << 20));
    /* Now read everything: all 64 replies arrive intact. */
    static char got[1 << 20];
    for (int i = 0; i < 64; i++) {
        uint64_t len;
        recv_exact(hog, &len, 8);
        ck_assert_uint_eq(len, sizeof(big));
        recv_exact(hog, got, len);
        ck_assert_int_eq(got[len - 1], 'b');
    }
    roundtrip(hog, "x", "z");
    close(hog);
    close(other);
    fr_free(&f);
    rdzv_server_close(srv);
}
END_TEST

/*
 * "::" listens on IPv6 and IPv4 at once: rdzv_client reaches it over ::1 and over 127.0.0.1,
 * and the log names the IPv4 peer as IPv4. "::1" serves rdzv_client over IPv6.
 */
START_TEST(dual_stack)
{
    rdzv_server_options o;
    rdzv_server_options_init(&o);
    o.host = "::";
    rdzv_server *srv = NULL;
    o.log = capture_log;
    int rc = rdzv_server_start(&o, &srv);
    ck_assert_int_eq(rc, 0); /* IPv4 alone where the host has no IPv6 */
    int port = rdzv_server_port(srv);
    const char *hosts[] = {"127.0.0.1", "::1", "localhost"};
    for (size_t i = 0; i < 3; i++) {
        rdzv_client *c = NULL;
        rdzv_client_options co;
        rdzv_client_options_init(&co);
        co.connect_timeout_ms = 5000;
        rc = rdzv_client_connect(hosts[i], port, &co, &c);
        if (rc < 0 && i > 0)
            continue; /* no IPv6 loopback here */
        ck_assert_int_eq(rc, 0);
        ck_assert_int_eq(rdzv_set(c, hosts[i], "v", 1), 0);
        void *v = NULL;
        size_t n = 0;
        ck_assert_int_eq(rdzv_get(c, hosts[i], &v, &n), 0);
        rdzv_free(v);
        rdzv_client_close(c);
    }
    /* A bad request from IPv4: the log line names the peer 127.0.0.1:PORT. */
    int fd = connect_to("127.0.0.1", port);
    uint8_t bad = 0xEE;
    send_all(fd, &bad, 1);
    ck_assert(closed_by_peer(fd));
    close(fd);
    ck_assert(log_has("closing connection from 127.0.0.1:"));
    rdzv_server_close(srv);

    rdzv_server_options_init(&o);
    o.host = "::1";
    if (rdzv_server_start(&o, &srv) == 0) {
        rdzv_client *c = NULL;
        ck_assert_int_eq(rdzv_client_connect("::1", rdzv_server_port(srv), NULL, &c), 0);
        ck_assert_int_eq(rdzv_set(c, "six", "6", 1), 0);
        char *js = NULL;
        ck_assert_int_eq(rdzv_status(c, &js), 0);
        rdzv_free(js);
        rdzv_client_close(c);
        rdzv_server_close(srv);
    }
}
END_TEST

START_TEST(ipv6_and_listen_fd)
{
    rdzv_server_options o;
    rdzv_server_options_init(&o);
    o.host = "::1";
    rdzv_server *srv = NULL;
    o.log = capture_log;
    if (rdzv_server_start(&o, &srv) == 0) {
        int fd = connect_to("::1", rdzv_server_port(srv));
        frame f = {0};
        fr_u8(&f, RDZV_M_VALIDATE);
        fr_u32(&f, RDZV_VALIDATE_MAGIC);
        send_frame(fd, &f);
        roundtrip(fd, "six", "v6");
        close(fd);
        fr_free(&f);
        rdzv_server_close(srv);
    } /* else: no IPv6 loopback here; the fd path below still runs */

    /* A socket bound by the caller (port 0), not yet listening: the server takes it over. */
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(bind(lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    socklen_t sl = sizeof(a);
    getsockname(lfd, (struct sockaddr *)&a, &sl);
    rdzv_server_options_init(&o);
    o.listen_fd = lfd;
    srv = start(&o);
    ck_assert_int_eq(rdzv_server_port(srv), ntohs(a.sin_port));
    /* The server sets TCP_NODELAY and keepalive on the listener; accepted sockets inherit
     * them. The fd is the server's now, but it is still this process's fd to look at. */
    int on = 0, idle = 0;
    socklen_t ol = sizeof(on);
    ck_assert_int_eq(getsockopt(lfd, IPPROTO_TCP, TCP_NODELAY, &on, &ol), 0);
    ck_assert_int_eq(on, 1);
    ck_assert_int_eq(getsockopt(lfd, SOL_SOCKET, SO_KEEPALIVE, &on, &ol), 0);
    ck_assert_int_eq(on, 1);
    ck_assert_int_eq(getsockopt(lfd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, &ol), 0);
    ck_assert_int_eq(idle, 60);
    int fd = modern_client(rdzv_server_port(srv));
    roundtrip(fd, "fd", "handed-in");
    close(fd);
    rdzv_server_close(srv);

    /* Bad options and a taken port are reported, not fatal. */
    rdzv_server_options_init(&o);
    o.port = 70000;
    ck_assert_int_eq(rdzv_server_start(&o, &srv), -EINVAL);
    rdzv_server_options_init(&o);
    o.max_key_bytes = (size_t)1 << 30; /* would make generation detection ambiguous */
    ck_assert_int_eq(rdzv_server_start(&o, &srv), -EINVAL);
    int busy = socket(AF_INET, SOCK_STREAM, 0);
    a.sin_port = 0;
    bind(busy, (struct sockaddr *)&a, sizeof(a));
    listen(busy, 1);
    sl = sizeof(a);
    getsockname(busy, (struct sockaddr *)&a, &sl);
    rdzv_server_options_init(&o);
    o.port = ntohs(a.sin_port);
    ck_assert_int_eq(rdzv_server_start(&o, &srv), -EADDRINUSE);
    close(busy);
    ck_assert_str_eq(rdzv_strerror(-EADDRINUSE), "Address already in use");
}
END_TEST

/* ---- embedded on the caller's loop ---- */
struct embed {
    int port;
    uv_async_t done;
    rdzv_server *srv;
    int ok;
};

static void *embed_client(void *arg)
{
    struct embed *e = arg;
    int fd = modern_client(e->port);
    roundtrip(fd, "emb", "edded");
    close(fd);
    e->ok = 1;
    uv_async_send(&e->done);
    return NULL;
}

static void embed_done(uv_async_t *a)
{
    struct embed *e = a->data;
    rdzv_server_close(e->srv);
    uv_close((uv_handle_t *)a, NULL);
}

START_TEST(embedded_on_callers_loop)
{
    uv_loop_t loop;
    struct embed e = {0};
    uv_loop_init(&loop);
    rdzv_server_options o;
    rdzv_server_options_init(&o);
    ck_assert_int_eq(rdzv_server_create(&loop, &o, &e.srv), 0);
    e.port = rdzv_server_port(e.srv);
    uv_async_init(&loop, &e.done, embed_done);
    e.done.data = &e;
    pthread_t t;
    pthread_create(&t, NULL, embed_client, &e);
    uv_run(&loop, UV_RUN_DEFAULT); /* returns once the server and the async are closed */
    pthread_join(t, NULL);
    ck_assert_int_eq(e.ok, 1);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
}
END_TEST

/* ---- a failing create leaves the caller's loop alone ---- */
struct pending {
    uv_idle_t idle;
    uv_timer_t timer;
    uv_async_t async;
    int idle_runs, timer_runs, async_runs;
};

static void pending_idle(uv_idle_t *h)
{
    struct pending *p = h->data;
    p->idle_runs++;
    uv_idle_stop(h);
}

static void pending_timer(uv_timer_t *h)
{
    struct pending *p = h->data;
    p->timer_runs++;
}

static void pending_async(uv_async_t *h)
{
    struct pending *p = h->data;
    p->async_runs++;
}

static void count_handle(uv_handle_t *h, void *arg)
{
    (void)h;
    (*(int *)arg)++;
}

/* Handles on the loop, closing ones included. */
static int loop_handles(uv_loop_t *loop)
{
    int n = 0;
    uv_walk(loop, count_handle, &n);
    return n;
}

/* A TCP socket bound to 127.0.0.1 on a free port; listening if `listening`. */
static int bound_socket(bool listening, int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(a);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sl), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &sl), 0);
    if (listening)
        ck_assert_int_eq(listen(fd, 1), 0);
    if (port)
        *port = ntohs(a.sin_port);
    return fd;
}

static bool fd_is_open(int fd)
{
    return fcntl(fd, F_GETFD) >= 0 || errno != EBADF;
}

static void never_called(uv_poll_t *h, int status, int events)
{
    (void)h;
    (void)status;
    (void)events;
    ck_abort_msg("poll callback ran");
}

/*
 * rdzv_server_create() that fails returns its error without running the caller's loop: an idle
 * callback, an expired timer and a sent async, all due on the loop's next turn, have not run,
 * and no handle of the server is left on the loop. Then a create on the same loop succeeds, and
 * the loop runs and closes cleanly.
 */
START_TEST(failed_create_does_not_run_loop)
{
    uv_loop_t loop;
    struct pending p = {0};
    rdzv_server_options o;
    rdzv_server *srv = NULL;
    int port;

    ck_assert_int_eq(uv_loop_init(&loop), 0);
    uv_idle_init(&loop, &p.idle);
    uv_timer_init(&loop, &p.timer);
    uv_async_init(&loop, &p.async, pending_async);
    p.idle.data = p.timer.data = p.async.data = &p;
    uv_idle_start(&p.idle, pending_idle);
    uv_timer_start(&p.timer, pending_timer, 0, 0);
    uv_async_send(&p.async);
    int base = loop_handles(&loop);

    /* A port taken by a listening socket. */
    int busy = bound_socket(true, &port);
    rdzv_server_options_init(&o);
    o.port = port;
    ck_assert_int_eq(rdzv_server_create(&loop, &o, &srv), -EADDRINUSE);
    close(busy);

    /* An address that is not this host's (TEST-NET-3). */
    rdzv_server_options_init(&o);
    o.host = "203.0.113.7";
    ck_assert_int_eq(rdzv_server_create(&loop, &o, &srv), -EADDRNOTAVAIL);

    /* A handed-in fd that cannot listen (UDP), and one with a bad option: both closed. */
    int udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(udp, 0);
    rdzv_server_options_init(&o);
    o.listen_fd = udp;
    ck_assert_int_lt(rdzv_server_create(&loop, &o, &srv), 0);
    ck_assert(!fd_is_open(udp));
    rdzv_server_options_init(&o);
    o.listen_fd = bound_socket(false, NULL);
    o.backlog = 0;
    ck_assert_int_eq(rdzv_server_create(&loop, &o, &srv), -EINVAL);
    ck_assert(!fd_is_open(o.listen_fd));

    ck_assert_ptr_null(srv);
    ck_assert_int_eq(loop_handles(&loop), base);
    ck_assert_int_eq(p.idle_runs + p.timer_runs + p.async_runs, 0);

    /* A listening fd this loop already watches: libuv refuses it (EEXIST) before the
     * listener handle exists, so nothing of the server is left on the loop either. */
    uv_poll_t watched;
    int wfd = bound_socket(false, NULL);
    uv_poll_init_socket(&loop, &watched, wfd);
    uv_poll_start(&watched, UV_READABLE, never_called);
    rdzv_server_options_init(&o);
    o.listen_fd = wfd;
    ck_assert_int_eq(rdzv_server_create(&loop, &o, &srv), -EEXIST);
    ck_assert_ptr_null(srv);
    ck_assert(!fd_is_open(wfd));
    ck_assert_int_eq(loop_handles(&loop), base + 1);
    ck_assert_int_eq(p.idle_runs + p.timer_runs + p.async_runs, 0);
    uv_close((uv_handle_t *)&watched, NULL);

    /* A create that succeeds on the same loop. */
    rdzv_server_options_init(&o);
    ck_assert_int_eq(rdzv_server_create(&loop, &o, &srv), 0);
    ck_assert_int_gt(rdzv_server_port(srv), 0);
    ck_assert_int_eq(p.idle_runs + p.timer_runs + p.async_runs, 0);
    rdzv_server_close(srv);

    /* The pending callbacks run on the loop's next turn, as they were due to. */
    ck_assert_int_eq(uv_run(&loop, UV_RUN_NOWAIT), 1);
    ck_assert_int_eq(p.idle_runs, 1);
    ck_assert_int_eq(p.timer_runs, 1);
    ck_assert_int_eq(p.async_runs, 1);
    uv_close((uv_handle_t *)&p.idle, NULL);
    uv_close((uv_handle_t *)&p.timer, NULL);
    uv_close((uv_handle_t *)&p.async, NULL);
    ck_assert_int_eq(uv_run(&loop, UV_RUN_DEFAULT), 0);
    ck_assert_int_eq(loop_handles(&loop), 0);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("server");
    check_tcase(s, "sockets", 60, both_generations_one_port, byte_at_a_time, half_sent_frame,
                bad_input_closes_one_connection, connection_cap, out_of_fds,
                wait_across_connections, back_pressure, ipv6_and_listen_fd, dual_stack,
                embedded_on_callers_loop, failed_create_does_not_run_loop,
                reset_connection_names_its_peer, traffic_counters, large_frame_then_pipelined);
    return check_run(s);
}
