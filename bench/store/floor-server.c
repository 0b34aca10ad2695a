/*
 * store-floor: the floor under every store server on store-bench's round-trip rows. It answers
 * the modern handshake (VALIDATE then PING: the nonce echoed) and each SET+GET round trip with
 * one read and one write, the reply built from the request itself: no store, no parser, no
 * limits, no accounting. What it costs per round trip is what the kernel costs; a real server
 * can only add to it. Run it as `store-bench --server build/bench/store-floor --only ours
 * --protocol modern --rows rate32` (see bench/README.md, Profiling the server).
 *
 * Deliberately nothing else: it assumes every request arrives whole in one read and has room
 * in its buffer (store-bench's 64 B rows on loopback), closes a connection on anything it does
 * not expect, and ignores its arguments (those of `ddp-rendezvous serve`). Not a store.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto.h"

#define BUF_BYTES (64 * 1024)

static uint8_t in[BUF_BYTES], out[BUF_BYTES];

/* The reply to what one read brought, in out[]; its length, or 0 to close the connection. */
static size_t answer(const uint8_t *p, size_t n)
{
    uint64_t kl, vl;
    if (n == 10 && p[0] == RDZV_M_VALIDATE && p[5] == RDZV_M_PING) {
        memcpy(out, p + 6, 4);
        return 4;
    }
    /* SET key value, GET key */
    if (n < 17 || p[0] != RDZV_M_SET)
        return 0;
    kl = rdzv__ld64(p + 1);
    if (kl > n - 17)
        return 0;
    vl = rdzv__ld64(p + 9 + kl);
    if (vl > n - 17 - kl || vl > BUF_BYTES - 8)
        return 0;
    memcpy(out, &vl, 8);
    memcpy(out + 8, p + 17 + kl, vl);
    return 8 + vl;
}

int main(int argc, char **argv)
{
    if (argc > 1) { /* a usage error, exit 2 as in every program of the project */
        fprintf(stderr, "store-floor: unknown %s '%s' (it takes none)\n",
                argv[1][0] == '-' ? "option" : "argument", argv[1]);
        return 2;
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    struct epoll_event ev = {.events = EPOLLIN}, evs[64];
    int one = 1, ep, l = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

    if (l < 0 || setsockopt(l, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0 ||
        bind(l, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(l, 4096) < 0 ||
        getsockname(l, (struct sockaddr *)&sa, &sl) < 0 ||
        (ep = epoll_create1(EPOLL_CLOEXEC)) < 0) {
        perror("store-floor");
        return 1;
    }
    printf("%d\n", ntohs(sa.sin_port));
    fflush(stdout);
    ev.data.fd = l;
    epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev);
    for (;;) {
        int n = epoll_wait(ep, evs, 64, -1);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd, c;
            if (fd == l) {
                while ((c = accept4(l, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                    struct epoll_event e = {.events = EPOLLIN, .data.fd = c};
                    epoll_ctl(ep, EPOLL_CTL_ADD, c, &e);
                }
                continue;
            }
            ssize_t r = read(fd, in, sizeof(in));
            size_t m = r > 0 ? answer(in, (size_t)r) : 0;
            if (m == 0 || write(fd, out, m) != (ssize_t)m)
                close(fd);
        }
    }
}
