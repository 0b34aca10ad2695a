/*
 * Who owns the other end of a TCP connection that came from this host: one exact-match
 * SOCK_DIAG_BY_FAMILY request over NETLINK_SOCK_DIAG (inet_diag), the same query ss(8) makes,
 * for the socket whose source and destination are the accepted connection's peer and local
 * ends. The kernel answers with the socket's owner (idiag_uid), or ENOENT when no socket of
 * this network namespace matches (the peer is remote, or in another namespace, or gone).
 *
 * TCP has no SO_PEERCRED; this is the kernel's own record, which the peer cannot forge. The
 * query needs no privilege. One blocking netlink round trip on a fresh socket; nothing kept.
 */
#include "auth.h"

#include <errno.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Copies the IP and port of `sa` into an inet_diag address/port pair (network order). */
static void put_end(const struct sockaddr *sa, __be32 ip[4], __be16 *port)
{
    memset(ip, 0, 16);
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
        memcpy(ip, &s4->sin_addr, 4);
        *port = s4->sin_port;
    } else {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
        memcpy(ip, &s6->sin6_addr, 16);
        *port = s6->sin6_port;
    }
}

/* An IPv4-mapped IPv6 address as the AF_INET address it stands for (the peer's own family). */
static const struct sockaddr *unmap(const struct sockaddr *sa, struct sockaddr_in *tmp)
{
    if (sa->sa_family != AF_INET6)
        return sa;
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
    if (!IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr))
        return sa;
    memset(tmp, 0, sizeof *tmp);
    tmp->sin_family = AF_INET;
    tmp->sin_port = s6->sin6_port;
    memcpy(&tmp->sin_addr, s6->sin6_addr.s6_addr + 12, 4);
    return (const struct sockaddr *)tmp;
}

int rdzv__peer_uid(const struct sockaddr *peer, const struct sockaddr *local, uint32_t *uid)
{
    struct sockaddr_in pt, lt;
    peer = unmap(peer, &pt);
    local = unmap(local, &lt);
    if ((peer->sa_family != AF_INET && peer->sa_family != AF_INET6) ||
        peer->sa_family != local->sa_family)
        return -EAFNOSUPPORT;

    struct {
        struct nlmsghdr nh;
        struct inet_diag_req_v2 r;
    } req;
    memset(&req, 0, sizeof req);
    req.nh.nlmsg_len = sizeof req;
    req.nh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    req.nh.nlmsg_flags = NLM_F_REQUEST;
    req.nh.nlmsg_seq = 1;
    req.r.sdiag_family = (__u8)peer->sa_family;
    req.r.sdiag_protocol = IPPROTO_TCP;
    req.r.idiag_states = ~0u;
    /* The peer's socket: its source is the peer end, its destination our local end. */
    put_end(peer, req.r.id.idiag_src, &req.r.id.idiag_sport);
    put_end(local, req.r.id.idiag_dst, &req.r.id.idiag_dport);
    req.r.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
    req.r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;

    int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (fd < 0)
        return -errno;
    int rc = 0;
    struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
    if (sendto(fd, &req, sizeof req, 0, (struct sockaddr *)&kernel, sizeof kernel) < 0) {
        rc = -errno;
        goto out;
    }
    /* The kernel answers at once; the poll only bounds a kernel that would not. */
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (poll(&pfd, 1, 1000) != 1) {
        rc = -ETIMEDOUT;
        goto out;
    }
    union {
        struct nlmsghdr nh;
        char bytes[8192];
    } buf;
    ssize_t n = recv(fd, &buf, sizeof buf, 0);
    if (n < 0) {
        rc = -errno;
        goto out;
    }
    rc = -EPROTO;
    for (struct nlmsghdr *h = &buf.nh; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
        if (h->nlmsg_type == NLMSG_ERROR) {
            const struct nlmsgerr *e = NLMSG_DATA(h);
            rc = e->error < 0 ? e->error : -EPROTO;
            break;
        }
        if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY &&
            h->nlmsg_len >= NLMSG_LENGTH(sizeof(struct inet_diag_msg))) {
            const struct inet_diag_msg *m = NLMSG_DATA(h);
            *uid = m->idiag_uid;
            rc = 0;
            break;
        }
    }
out:
    close(fd);
    return rc;
}
