/*
 * Raw test clients for the Check tests that speak the wire protocol by hand (with frames.h):
 * connect, send whole frames, read exact byte counts, see a close. Test code only; every
 * failure fails the test (ck_assert), and every read is bounded by the socket's 10 s timeout.
 */
#ifndef TESTS_RAWCONN_H
#define TESTS_RAWCONN_H

#include "frames.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>

/* A blocking TCP connection to ip:port (IPv4 or IPv6), TCP_NODELAY, reads bounded by 10 s. */
static inline int connect_to(const char *ip, int port)
{
    struct sockaddr_storage ss = {0};
    socklen_t sl;
    int fam = strchr(ip, ':') ? AF_INET6 : AF_INET;
    if (fam == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        inet_pton(AF_INET6, ip, &a->sin6_addr);
        sl = sizeof(*a);
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)port);
        inet_pton(AF_INET, ip, &a->sin_addr);
        sl = sizeof(*a);
    }
    int fd = socket(fam, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&ss, sl), 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    struct timeval tv = {10, 0}; /* bound every read: a hang fails the test */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

static inline void send_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
        ck_assert_int_gt(k, 0);
        b += k;
        n -= (size_t)k;
    }
}

/* Sends what `f` holds and empties it for the next frame. */
static inline void send_frame(int fd, frame *f)
{
    send_all(fd, f->data, f->len);
    fr_reset(f);
}

static inline void recv_exact(int fd, void *p, size_t n)
{
    uint8_t *b = p;
    while (n) {
        ssize_t k = recv(fd, b, n, 0);
        ck_assert_msg(k > 0, "recv: %zd (%s)", k, strerror(errno));
        b += k;
        n -= (size_t)k;
    }
}

/* True if the peer closed fd (EOF or reset) within the socket's read timeout. */
static inline bool closed_by_peer(int fd)
{
    char c;
    ssize_t k = recv(fd, &c, 1, 0);
    return k == 0 || (k < 0 && errno == ECONNRESET);
}

/* A connection to 127.0.0.1:port that opened the modern protocol (VALIDATE sent). */
static inline int modern_client(int port)
{
    int fd = connect_to("127.0.0.1", port);
    frame f = {0};
    fr_u8(&f, RDZV_M_VALIDATE);
    fr_u32(&f, RDZV_VALIDATE_MAGIC);
    send_frame(fd, &f);
    fr_free(&f);
    return fd;
}

#endif /* TESTS_RAWCONN_H */
