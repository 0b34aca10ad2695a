/*
 * Who owns the other end of a TCP connection that came from this host, and whether an address
 * is this host's, asked of the kernel over two netlink sockets kept open for the server's life
 * (rdzv__peercred): NETLINK_SOCK_DIAG (inet_diag, the query ss(8) makes) and NETLINK_ROUTE
 * (the route lookup `ip route get` makes). The kernel answers with the socket's owner
 * (idiag_uid); TCP has no SO_PEERCRED, and this is the kernel's own record, which the peer
 * cannot forge. No privilege is needed.
 *
 * The lookup must not miss a local socket, since a miss would let its owner pass for a remote
 * peer. An exact-match query (SOCK_DIAG_BY_FAMILY without NLM_F_DUMP) finds a socket only when
 * its bound device matches the query's idiag_if, so a socket bound to a device
 * (SO_BINDTODEVICE, or a scoped IPv6 link-local address) is invisible to it. rdzv__peer_uid()
 * therefore falls back, when asked to search, to a dump of the TCP sockets filtered by the two
 * ports (in the kernel), matching the addresses here, in both families (an IPv6 socket may
 * carry an IPv4-mapped connection). A TIME_WAIT socket reports no owner (uid 0): it is treated
 * as unknown, never as root.
 *
 * The descriptors are opened once, so that a lookup never needs a new descriptor: a server out
 * of descriptors (EMFILE) still checks its peers. Replies are matched by sequence number, so a
 * late answer to an earlier query that timed out is skipped, never taken for the current one.
 * Each query is one blocking round trip (a dump: a few), bounded by a poll of PEERCRED_POLL_MS.
 */
#include "auth.h"

#include <errno.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define PEERCRED_POLL_MS 1000 /* the kernel answers at once; this bounds one that would not */

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

void rdzv__peercred_init(rdzv__peercred *p)
{
    p->diag_fd = p->route_fd = -1;
    p->seq = 0;
}

/* Opens whichever of the two sockets is not open. Returns 0 or the first socket()'s -errno. */
static int ensure_open(rdzv__peercred *p)
{
    if (p->diag_fd < 0)
        p->diag_fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (p->diag_fd < 0)
        return -errno;
    if (p->route_fd < 0)
        p->route_fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_ROUTE);
    return p->route_fd < 0 ? -errno : 0;
}

int rdzv__peercred_open(rdzv__peercred *p)
{
    return ensure_open(p);
}

void rdzv__peercred_close(rdzv__peercred *p)
{
    if (p->diag_fd >= 0)
        close(p->diag_fd);
    if (p->route_fd >= 0)
        close(p->route_fd);
    rdzv__peercred_init(p);
}

/*
 * One netlink exchange on `fd`: sends `req` (whose nlmsg_seq is set here), then hands every
 * reply message of that sequence to `each(h, arg)` until the answer ends: for a plain request
 * the first message, for a dump NLMSG_DONE. `each` returns 0 to go on, anything else to note
 * as the result (the reading goes on to the end of a dump, so that nothing of it is left for
 * the next query). An NLMSG_ERROR ends it with its error. Returns what `each` noted (the last
 * non-zero), the kernel's error, 0 when `each` noted nothing, or -ETIMEDOUT, -EPROTO, -errno.
 */
static int exchange(rdzv__peercred *p, int fd, struct nlmsghdr *req,
                    int (*each)(const struct nlmsghdr *h, void *arg), void *arg)
{
    bool dump = req->nlmsg_flags & NLM_F_DUMP;
    req->nlmsg_seq = ++p->seq;
    struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
    if (sendto(fd, req, req->nlmsg_len, 0, (struct sockaddr *)&kernel, sizeof kernel) < 0)
        return -errno;
    union {
        struct nlmsghdr nh;
        char bytes[32768];
    } buf;
    int noted = 0;
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, PEERCRED_POLL_MS) != 1)
            return -ETIMEDOUT;
        ssize_t n = recv(fd, &buf, sizeof buf, 0);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return -errno;
        }
        for (struct nlmsghdr *h = &buf.nh; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
            if (h->nlmsg_seq != req->nlmsg_seq)
                continue; /* the late answer to an earlier query */
            if (h->nlmsg_type == NLMSG_DONE)
                return noted;
            if (h->nlmsg_type == NLMSG_ERROR) {
                const struct nlmsgerr *e = NLMSG_DATA(h);
                return e->error < 0 ? e->error : noted;
            }
            int r = each(h, arg);
            if (r != 0)
                noted = r;
            if (!dump)
                return noted;
        }
    }
}

/* What one owner query looks for and found. */
struct owner_query {
    struct sockaddr_storage peer, local; /* unmapped */
    uint32_t uid;
};

/* The IP of an inet_diag socket id's end in family `fam` equals that of `sa` (unmapped). */
static bool end_is(int fam, const __be32 ip[4], __be16 port, const struct sockaddr *sa)
{
    __be32 want[4];
    __be16 wport;
    put_end(sa, want, &wport);
    if (port != wport)
        return false;
    if (fam == sa->sa_family)
        return memcmp(ip, want, sa->sa_family == AF_INET ? 4 : 16) == 0;
    /* An IPv6 socket's end that is the IPv4-mapped form of an IPv4 address. */
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return fam == AF_INET6 && sa->sa_family == AF_INET && memcmp(ip, mapped, 12) == 0 &&
           memcmp((const uint8_t *)ip + 12, want, 4) == 0;
}

/*
 * Checks one SOCK_DIAG_BY_FAMILY message against the query: 1 (the peer's socket, owner
 * noted), 2 (it, in TIME_WAIT: no owner), 0 (another socket).
 */
static int owner_each(const struct nlmsghdr *h, void *arg)
{
    struct owner_query *q = arg;
    if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
        h->nlmsg_len < NLMSG_LENGTH(sizeof(struct inet_diag_msg)))
        return 0;
    const struct inet_diag_msg *m = NLMSG_DATA(h);
    if (!end_is(m->idiag_family, m->id.idiag_src, m->id.idiag_sport,
                (const struct sockaddr *)&q->peer) ||
        !end_is(m->idiag_family, m->id.idiag_dst, m->id.idiag_dport,
                (const struct sockaddr *)&q->local))
        return 0;
    if (m->idiag_state == TCP_TIME_WAIT)
        return 2;
    q->uid = m->idiag_uid;
    return 1;
}

/* One inet_diag query in family `fam`: exact (`dump` false) or a dump filtered by ports. */
static int owner_ask(rdzv__peercred *p, struct owner_query *q, int fam, bool dump)
{
    struct {
        struct nlmsghdr nh;
        struct inet_diag_req_v2 r;
    } req;
    memset(&req, 0, sizeof req);
    req.nh.nlmsg_len = sizeof req;
    req.nh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    req.nh.nlmsg_flags = NLM_F_REQUEST | (dump ? NLM_F_DUMP : 0);
    req.r.sdiag_family = (__u8)fam;
    req.r.sdiag_protocol = IPPROTO_TCP;
    req.r.idiag_states = ~0u;
    /* The peer's socket: its source is the peer end, its destination our local end. A dump
     * filters on the two ports only (in the kernel); owner_each() checks the addresses. */
    put_end((const struct sockaddr *)&q->peer, req.r.id.idiag_src, &req.r.id.idiag_sport);
    put_end((const struct sockaddr *)&q->local, req.r.id.idiag_dst, &req.r.id.idiag_dport);
    req.r.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
    req.r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
    int rc = exchange(p, p->diag_fd, &req.nh, owner_each, q);
    return rc == 1 ? 0 : rc == 2 ? -ESTALE : rc == 0 ? -ENOENT : rc;
}

int rdzv__peer_uid(rdzv__peercred *p, const struct sockaddr *peer, const struct sockaddr *local,
                   bool search, uint32_t *uid)
{
    struct sockaddr_in pt, lt;
    peer = unmap(peer, &pt);
    local = unmap(local, &lt);
    if ((peer->sa_family != AF_INET && peer->sa_family != AF_INET6) ||
        peer->sa_family != local->sa_family)
        return -EAFNOSUPPORT;
    int rc = ensure_open(p);
    if (rc < 0)
        return rc;
    struct owner_query q = {.uid = 0};
    memcpy(&q.peer, peer, peer->sa_family == AF_INET ? sizeof pt : sizeof(struct sockaddr_in6));
    memcpy(&q.local, local, local->sa_family == AF_INET ? sizeof lt : sizeof(struct sockaddr_in6));

    rc = owner_ask(p, &q, peer->sa_family, false);
    if (rc == -ENOENT && search) {
        rc = owner_ask(p, &q, peer->sa_family, true);
        if (rc == -ENOENT && peer->sa_family == AF_INET)
            rc = owner_ask(p, &q, AF_INET6, true); /* an IPv6 socket, IPv4-mapped */
    }
    if (rc == 0)
        *uid = q.uid;
    return rc;
}

/* The route lookup's answer: 1 when the route is of type local. */
static int route_each(const struct nlmsghdr *h, void *arg)
{
    (void)arg;
    if (h->nlmsg_type != RTM_NEWROUTE || h->nlmsg_len < NLMSG_LENGTH(sizeof(struct rtmsg)))
        return 0;
    const struct rtmsg *r = NLMSG_DATA(h);
    return r->rtm_type == RTN_LOCAL ? 1 : -1;
}

int rdzv__addr_local(rdzv__peercred *p, const struct sockaddr *sa)
{
    struct sockaddr_in tmp;
    sa = unmap(sa, &tmp);
    if (sa->sa_family != AF_INET && sa->sa_family != AF_INET6)
        return -EAFNOSUPPORT;
    int rc = ensure_open(p);
    if (rc < 0)
        return rc;
    struct {
        struct nlmsghdr nh;
        struct rtmsg r;
        char attrs[RTA_SPACE(16)];
    } req;
    memset(&req, 0, sizeof req);
    size_t alen = sa->sa_family == AF_INET ? 4 : 16;
    req.nh.nlmsg_len = NLMSG_LENGTH(sizeof req.r) + RTA_SPACE(alen);
    req.nh.nlmsg_type = RTM_GETROUTE;
    req.nh.nlmsg_flags = NLM_F_REQUEST;
    req.r.rtm_family = (unsigned char)sa->sa_family;
    req.r.rtm_dst_len = (unsigned char)(alen * 8);
    struct rtattr *a = (struct rtattr *)req.attrs;
    a->rta_type = RTA_DST;
    a->rta_len = (unsigned short)RTA_LENGTH(alen);
    __be32 ip[4];
    __be16 port;
    put_end(sa, ip, &port);
    memcpy(RTA_DATA(a), ip, alen);
    rc = exchange(p, p->route_fd, &req.nh, route_each, NULL);
    if (rc == 1)
        return 1;
    /* Any route but a local one, or none at all: packets to it leave this host. */
    if (rc == -1 || rc == -ENETUNREACH || rc == -EHOSTUNREACH)
        return 0;
    return rc == 0 ? -EPROTO : rc;
}

/*
 * Finds whether the peer `pa` of a connection whose local end is `la` is on this host and, if
 * so, who owns its socket (the other-user rule). A peer is local when its address is loopback,
 * the connection's own local address, or an address the kernel routes to this host, or when
 * the kernel finds its socket here. The owner is then looked up so that it cannot be missed (a
 * dump finds sockets bound to a device, see peercred.c). This fails closed: a peer known (or
 * not known not) to be local whose owner cannot be established is an error, whatever the
 * reason: its socket is gone or in TIME_WAIT, the kernel cannot be asked, or it does not
 * answer. Returns 1 (local, *uid set), 0 (another host) or the negative errno of the lookup.
 */
int rdzv__local_owner(rdzv__peercred *cred, const struct sockaddr *pa, const struct sockaddr *la,
                      uint32_t *uid)
{
    bool local = rdzv__addr_loopback(pa) || rdzv__addr_same(pa, la);
    int where = local ? 1 : rdzv__addr_local(cred, pa);
    /* Search whenever the peer may be local: known to be, or not known (where < 0). */
    int rc = rdzv__peer_uid(cred, pa, la, where != 0, uid);
    if (rc == 0)
        return 1;
    /* Routed elsewhere, or (after a search, which sees every socket here) not found. */
    if (where == 0 || (where < 0 && rc == -ENOENT))
        return 0;
    return rc;
}
