/*
 * The server's settings and its listening socket: rdzv_server_options' defaults and range
 * checks, address resolution, the socket set up in full (bind, the options accepted sockets
 * inherit, listen) before any libuv handle exists, and the descriptor budget that sets
 * max_connections when the caller leaves it 0. Plain system calls, no loop and no server state:
 * server.c builds the server around what these return.
 */
#include "listen.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <uv.h>

void rdzv_server_options_init(rdzv_server_options *o)
{
    memset(o, 0, sizeof(*o));
    o->host = "127.0.0.1";
    o->port = 0;
    o->listen_fd = -1;
    o->backlog = SOMAXCONN;
    o->keepalive_s = 60;
    o->max_key_bytes = 8 << 10;
    o->max_value_bytes = 8 << 20;
    o->max_keys_per_request = 128 << 10;
    o->max_request_bytes = 64 << 20;
    o->max_total_bytes = (size_t)1 << 30;
    o->max_connections = 0;
    o->max_pending_output = 64 << 20;
    o->max_conn_output = 256 << 20;
    o->max_buffered_bytes = (size_t)1 << 30;
    o->fd_reserve = 64;
    o->idle_timeout_s = 0;
    o->request_timeout_s = 60;
    o->max_private_bytes = 128 << 20;
    o->max_list_keys = 128 << 10;
    o->auth_timeout_s = 10;
    o->max_probation = 0;
    o->max_probation_per_address = 8;
}

int rdzv__server_check_options(const rdzv_server_options *o)
{
    if (!o || (!o->host && o->listen_fd < 0) || o->port < 0 || o->port > 65535 || o->backlog < 1 ||
        o->keepalive_s < 0 || o->keepalive_s > RDZV_KEEPALIVE_MAX_S || o->max_key_bytes < 1 ||
        o->max_key_bytes > RDZV_KEY_BYTES_MAX || o->max_value_bytes < 1 ||
        o->max_keys_per_request < 1 || o->max_pending_output < 1 ||
        o->max_request_bytes < RDZV_REQUEST_BYTES_MIN ||
        o->max_request_bytes > RDZV_REQUEST_BYTES_MAX ||
        o->max_conn_output < 1 || o->max_buffered_bytes < 1 || o->idle_timeout_s < 0 ||
        o->max_private_bytes < 1 || o->max_list_keys < 1 ||
        o->request_timeout_s < 0 || o->idle_timeout_s > INT_MAX / 1000 ||
        o->request_timeout_s > INT_MAX / 1000 || (o->token && rdzv_token_check(o->token) < 0) ||
        (o->nallow > 0 && !o->allow) || o->nallow > RDZV_ALLOW_MAX)
        return -EINVAL;
    if (o->auth_timeout_s < 0 || o->auth_timeout_s > INT_MAX / 1000)
        return -EINVAL;
    return 0;
}

/* Resolves host:port into *ss: numeric IPv4/IPv6 literals directly, names by getaddrinfo. */
static int resolve(const char *host, int port, struct sockaddr_storage *ss)
{
    memset(ss, 0, sizeof(*ss));
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)ss) == 0)
        return 0;
    if (uv_ip6_addr(host, port, (struct sockaddr_in6 *)ss) == 0)
        return 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE},
                    *res;
    if (getaddrinfo(host, NULL, &hints, &res) != 0)
        return -EADDRNOTAVAIL;
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    if (ss->ss_family == AF_INET6)
        ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
    freeaddrinfo(res);
    return 0;
}

static int set_int_opt(int fd, int level, int name, int value)
{
    return setsockopt(fd, level, name, &value, sizeof(value)) < 0 ? -errno : 0;
}

/*
 * Makes the listening socket with plain socket calls, before any libuv handle exists, so that
 * every way setting up the socket can fail (address in use, not local, not permitted, not a
 * socket) leaves the caller's loop untouched. *fd is opts->listen_fd (adopted) or -1 (bind
 * host:port); on return it holds the socket, which is the caller's to close on any failure.
 * The system calls are those uv_tcp_bind(), uv_tcp_nodelay(), uv_tcp_keepalive() (with its
 * probe interval of 1 s and count of 10) and uv_listen() make, in their order. TCP_NODELAY and
 * keepalive are set on the listener because Linux copies them to each accepted socket (see
 * admit() in server.c). Returns 0 and sets *port, or a negative errno.
 */
int rdzv__listen_socket(const rdzv_server_options *o, int *fd, int *port)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    int rc = 0;

    if (*fd < 0) {
        rc = resolve(o->host, o->port, &ss);
        if (rc < 0)
            return rc;
        *fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (*fd < 0 && errno == EAFNOSUPPORT && strcmp(o->host, "::") == 0) {
            /* The IPv6 wildcard on a host without IPv6: IPv4's wildcard is what is left. */
            resolve("0.0.0.0", o->port, &ss);
            *fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        }
        if (*fd < 0)
            return -errno;
        rc = set_int_opt(*fd, SOL_SOCKET, SO_REUSEADDR, 1);
        if (rc == 0 && ss.ss_family == AF_INET6)
            rc = set_int_opt(*fd, IPPROTO_IPV6, IPV6_V6ONLY, 0);
        sl = ss.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
        if (rc == 0 && bind(*fd, (const struct sockaddr *)&ss, sl) < 0)
            rc = -errno;
    }
    if (rc == 0)
        rc = set_int_opt(*fd, IPPROTO_TCP, TCP_NODELAY, 1);
    if (rc == 0)
        rc = set_int_opt(*fd, SOL_SOCKET, SO_KEEPALIVE, o->keepalive_s > 0);
    if (rc == 0 && o->keepalive_s > 0) {
        rc = set_int_opt(*fd, IPPROTO_TCP, TCP_KEEPIDLE, o->keepalive_s);
        if (rc == 0)
            rc = set_int_opt(*fd, IPPROTO_TCP, TCP_KEEPINTVL, 1);
        if (rc == 0)
            rc = set_int_opt(*fd, IPPROTO_TCP, TCP_KEEPCNT, 10);
    }
    if (rc == 0 && listen(*fd, o->backlog) < 0)
        rc = -errno;
    sl = sizeof(ss);
    if (rc == 0 && getsockname(*fd, (struct sockaddr *)&ss, &sl) < 0)
        rc = -errno;
    if (rc == 0)
        *port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    return rc;
}

/* Counts the descriptors this process has open now (/proc/self/fd); 0 if it cannot tell. */
static size_t open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    size_t n = 0;
    if (!d)
        return 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n > 0 ? n - 1 : 0; /* less opendir()'s own */
}

/*
 * max_connections 0: what the descriptor limit leaves once the descriptors open now, 16 for the
 * server itself (its loop, the listener, the spare, timers) and the host program's reserve are
 * set aside; at least 1. Each connection takes one descriptor.
 */
size_t rdzv__derive_max_connections(size_t reserve)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY ||
        rl.rlim_cur > (rlim_t)1 << 24)
        rl.rlim_cur = (rlim_t)1 << 24;
    size_t have = (size_t)rl.rlim_cur, taken = open_fds() + 16;
    if (reserve >= have || taken >= have - reserve)
        return 1;
    return have - reserve - taken;
}
