/*
 * A store proxy as a test program: `proxy_serve HOST PORT [TOKEN_FILE]` starts rdzv_proxy in
 * front of the store at HOST:PORT, on 127.0.0.1 and a free port, prints that port on its first
 * line of stdout, and runs until its stdin reaches end of file or it gets SIGTERM/SIGINT; then
 * it prints its counters as one line ("worker_requests N upstream_requests N coalesced N ...")
 * and exits 0. Exit 1 when the proxy cannot start, 3 when its upstream is lost (the root died).
 * The interop and proxy shell tests put PyTorch's own clients behind it. PROXY_SERVE_PORT in the
 * environment (1 to 65535) makes it listen on that port instead of a free one: PyTorch's own store
 * tests (tests/interop/torch_store_suite.py) choose the port their master store serves on.
 */
#include "rdzv.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <unistd.h>

static volatile sig_atomic_t stop;
static int lost_pipe[2] = {-1, -1};

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static void on_lost(void *arg)
{
    (void)arg;
    if (write(lost_pipe[1], "x", 1) < 0) {
        /* nothing to do: the main loop also polls the counters */
    }
}

static void log_line(void *arg, int level, const char *msg)
{
    (void)arg;
    (void)level;
    fprintf(stderr, "store proxy: %s\n", msg);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s HOST PORT [TOKEN_FILE]\n", argv[0]);
        return 2;
    }
    char token[RDZV_TOKEN_MAX_BYTES + 1];
    rdzv_proxy_options o;
    rdzv_proxy_options_init(&o);
    o.upstream_host = argv[1];
    o.upstream_port = atoi(argv[2]);
    const char *listen_port = getenv("PROXY_SERVE_PORT");
    if (listen_port && *listen_port) {
        char *end;
        long v = strtol(listen_port, &end, 10);
        if (*end || v < 1 || v > 65535) {
            fprintf(stderr, "proxy_serve: PROXY_SERVE_PORT '%s' is not a port (1 to 65535)\n",
                    listen_port);
            return 2;
        }
        o.port = (int)v;
    }
    o.log = log_line;
    o.on_lost = on_lost;
    if (argc > 3) {
        int rc = rdzv_token_read_file(argv[3], token, sizeof(token));
        if (rc < 0) {
            fprintf(stderr, "proxy_serve: %s: %s\n", argv[3], rdzv_strerror(rc));
            return 1;
        }
        o.token = token;
    }
    if (pipe(lost_pipe) < 0)
        return 1;
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);
    rdzv_proxy *p;
    int rc = rdzv_proxy_start(&o, &p);
    if (rc < 0) {
        fprintf(stderr, "proxy_serve: %s\n", rdzv_strerror(rc));
        return 1;
    }
    printf("%d\n", rdzv_proxy_port(p));
    fflush(stdout);
    int status = 0;
    while (!stop) {
        struct pollfd fds[2] = {{0, POLLIN, 0}, {lost_pipe[0], POLLIN, 0}};
        int n = poll(fds, 2, 1000);
        if (n > 0 && fds[1].revents) {
            status = 3;
            break;
        }
        if (n > 0 && fds[0].revents) {
            char b[64];
            if (read(0, b, sizeof(b)) <= 0)
                break;
        }
    }
    rdzv_proxy_counters st;
    rdzv_proxy_stats(p, &st);
    printf("worker_requests %llu upstream_requests %llu coalesced %llu bytes_up %llu "
           "bytes_down %llu accepted %llu\n",
           (unsigned long long)st.worker_requests, (unsigned long long)st.upstream_requests,
           (unsigned long long)st.coalesced, (unsigned long long)st.bytes_up,
           (unsigned long long)st.bytes_down, (unsigned long long)st.accepted);
    fflush(stdout);
    rdzv_proxy_close(p);
    return status;
}
