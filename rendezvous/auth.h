/*
 * A job's control plane: the store's authentication handshake and access rules. Internal to
 * librendezvous (and its tests); see rdzv-protocol(7), "AUTHENTICATION".
 *
 * The handshake is a mutual challenge-response over a shared secret (the job's token), never
 * the token itself on the wire. After VALIDATE, a client that knows the token sends
 *
 *     AUTH_HELLO  (opcode 0xE1)  vec: client nonce, 32 random bytes
 *
 * and the server answers with one byte vector: status 0, its own 32-byte nonce and the server
 * proof HMAC-SHA256(token, "rdzv-auth-v1 server" NUL || cn || sn) (65 bytes), or status 1 alone
 * when it has no secret. The client checks the server proof (a server without the token cannot
 * make it) and sends
 *
 *     AUTH_PROOF  (opcode 0xE2)  vec: HMAC-SHA256(token, "rdzv-auth-v1 client" NUL || cn || sn)
 *
 * which the server checks in constant time: a right proof is answered with the one-byte vector
 * "\0" and marks the connection authenticated; a wrong one closes the connection. Both nonces
 * are fresh per connection and the two directions have different labels, so neither proof can
 * be replayed on another connection or reflected to the other side.
 *
 * The access rules are pure functions: which keys are private to authenticated connections
 * (rdzv__request_private()), and the network lists the server checks peers against
 * (rdzv__cidr, rdzv__addrset). No I/O here except reading random bytes.
 */
#ifndef RDZV_AUTH_H
#define RDZV_AUTH_H

#include "proto.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define RDZV_AUTH_NONCE_BYTES 32
#define RDZV_AUTH_MAC_BYTES 32
#define RDZV_AUTH_HELLO_REPLY_BYTES (1 + RDZV_AUTH_NONCE_BYTES + RDZV_AUTH_MAC_BYTES)

/* Status byte that opens the AUTH_HELLO reply. */
enum { RDZV_AUTH_STATUS_OK = 0, RDZV_AUTH_STATUS_NO_SECRET = 1 };

/* Which side a proof comes from: part of what is signed, so a proof is never valid both ways. */
enum rdzv_auth_dir { RDZV_AUTH_SERVER = 0, RDZV_AUTH_CLIENT = 1 };

/* Fills `nonce` with RDZV_AUTH_NONCE_BYTES from the kernel (getrandom(2)). Returns 0 or -EIO. */
int rdzv__auth_nonce(uint8_t nonce[RDZV_AUTH_NONCE_BYTES]);

/*
 * The proof of side `dir`: HMAC-SHA256 keyed with `token` over that side's label, the client
 * nonce `cn` and the server nonce `sn`, into `mac` (Nettle's HMAC). Returns 0.
 */
int rdzv__auth_mac(const char *token, enum rdzv_auth_dir dir, const uint8_t *cn, const uint8_t *sn,
                   uint8_t mac[RDZV_AUTH_MAC_BYTES]);

/* Per-connection handshake state, on the server. Zero-initialised: nothing happened yet. */
typedef struct rdzv__auth_conn {
    int state; /* 0 none, 1 challenged (HELLO answered), 2 authenticated */
    uint8_t cn[RDZV_AUTH_NONCE_BYTES];
    uint8_t sn[RDZV_AUTH_NONCE_BYTES];
} rdzv__auth_conn;

enum { RDZV_AUTH_NONE = 0, RDZV_AUTH_CHALLENGED = 1, RDZV_AUTH_DONE = 2 };

/*
 * Server side of AUTH_HELLO: `token` is the server's (NULL: none), `cn` the client's nonce of
 * `cn_len` bytes. Writes the reply into `reply` (RDZV_AUTH_HELLO_REPLY_BYTES) and its length into
 * *reply_len, and remembers both nonces in `a`. Returns 0, -EPROTO (a nonce of the wrong size, or
 * a second HELLO on the connection) or -EIO.
 */
int rdzv__auth_server_hello(const char *token, rdzv__auth_conn *a, const uint8_t *cn, size_t cn_len,
                            uint8_t *reply, size_t *reply_len);

/*
 * Server side of AUTH_PROOF: checks the client's proof (`mac`, `mac_len` bytes) in constant time.
 * Returns 0 (the connection is authenticated now), -EACCES (wrong proof), -EPROTO (no challenge
 * was answered on this connection, or a second proof) or -EIO.
 */
int rdzv__auth_server_proof(const char *token, rdzv__auth_conn *a, const uint8_t *mac,
                            size_t mac_len);

/*
 * Client side: checks the server's AUTH_HELLO reply (`reply`, `reply_len` bytes) against the
 * client nonce `cn` it sent and, when the server proved that it knows `token`, writes the
 * client's proof into `proof`. Returns 0, -ENOKEY (the server has no secret), -EKEYREJECTED (the
 * server's proof is wrong: it does not know this token), -EPROTO (a malformed reply) or -EIO.
 */
int rdzv__auth_client_check(const char *token, const uint8_t *cn, const uint8_t *reply,
                            size_t reply_len, uint8_t proof[RDZV_AUTH_MAC_BYTES]);

/*
 * True when `key` (`n` bytes) is private to authenticated connections on a store with a secret:
 * it starts with RDZV_PRIVATE_AGENT_ROOT or RDZV_PRIVATE_COLL_ROOT (rdzv.h).
 */
bool rdzv__key_private(const uint8_t *key, size_t n);

/*
 * True when the validated request `req` names a private key anywhere (a repeated group
 * included). Requests without keys (PING, GETNUMKEYS, LIST_KEYS, CANCEL_WAIT, STATUS, the
 * handshake) are never private.
 */
bool rdzv__request_private(const rdzv__request *req);

/*
 * The private keys the validated request `req` names: returns how many (0: none, when
 * rdzv__request_private() is false), and, when there is one and key/len are not NULL, points
 * *key and *len at the first (borrowed from req's frame).
 */
size_t rdzv__request_private_keys(const rdzv__request *req, const uint8_t **key, size_t *len);

/*
 * The log sentence of refusing `req` for naming a private key: "OP refused: 'KEY' is private to
 * the job's authenticated connections", KEY the first private key, made printable (bytes
 * outside ' '..'~' as '?') and cut at 64 bytes ("..."); a request with several keys adds
 * " (N private keys of M)" or " (1 private key of M)". Written into buf[0..cap), always
 * NUL-terminated. A request that names no private key gets "OP refused: no private key" (a
 * caller's mistake; never logged with a key it does not hold).
 */
void rdzv__private_refusal(const rdzv__request *req, char *buf, size_t cap);

/* An IPv4 or IPv6 network, "10.0.0.0/8", "fd00::/8", or one address ("10.1.2.3"). */
typedef struct rdzv__cidr {
    int family; /* AF_INET or AF_INET6 */
    uint8_t addr[16];
    int bits; /* prefix length */
} rdzv__cidr;

/* Parses `s` into *out. Returns 0 or -EINVAL (bad address, or bits beyond the family's). */
int rdzv__cidr_parse(const char *s, rdzv__cidr *out);

/*
 * True when the address in `sa` (AF_INET or AF_INET6; an IPv4-mapped IPv6 address counts as its
 * IPv4 address) lies in `net`.
 */
bool rdzv__cidr_match(const rdzv__cidr *net, const struct sockaddr *sa);

/* True for 127.0.0.0/8, ::1 and IPv4-mapped loopback. */
bool rdzv__addr_loopback(const struct sockaddr *sa);

/* True when two socket addresses hold the same IP address (ports ignored; mapped = IPv4). */
bool rdzv__addr_same(const struct sockaddr *a, const struct sockaddr *b);

/* A set of IP addresses (the job's nodes), grown on demand. Zero-initialised: empty. */
typedef struct rdzv__addrset {
    rdzv__cidr *v; /* each a /32 or /128 */
    size_t n, cap;
} rdzv__addrset;

/* Adds the IP of `sa` unless present. Returns 1 (added), 0 (was there), -ENOSPC, -ENOMEM. */
int rdzv__addrset_add(rdzv__addrset *s, const struct sockaddr *sa);
bool rdzv__addrset_has(const rdzv__addrset *s, const struct sockaddr *sa);
void rdzv__addrset_free(rdzv__addrset *s);

/*
 * The kernel queries of peercred.c: two netlink sockets (NETLINK_SOCK_DIAG, NETLINK_ROUTE) kept
 * open, so that a query never needs a new descriptor. rdzv__peercred_init() marks both closed;
 * rdzv__peercred_open() opens them (0, or the -errno of socket(); a query retries what is not
 * open and fails with that error); rdzv__peercred_close() closes them (accepts a closed one).
 * Not thread-safe: one user at a time.
 */
typedef struct rdzv__peercred {
    int diag_fd, route_fd; /* -1: not open */
    uint32_t seq;          /* of the last query, to skip late answers to earlier ones */
} rdzv__peercred;

void rdzv__peercred_init(rdzv__peercred *p);
int rdzv__peercred_open(rdzv__peercred *p);
void rdzv__peercred_close(rdzv__peercred *p);

/*
 * Finds the owner of the local TCP socket at the other end of a connection the server
 * accepted: the socket whose source is `peer` and destination `local` (the accepted socket's
 * two ends), asked of the kernel with inet_diag. First an exact-match query; when it finds
 * nothing and `search` is true, a dump of the sockets with those two ports, in the peer's
 * family and (for IPv4) the IPv6 family, which also finds sockets bound to a device
 * (SO_BINDTODEVICE, scoped link-local addresses) that the exact query misses. Returns 0 and
 * sets *uid; -ENOENT when no such socket exists in this network namespace (the peer is on
 * another host, another namespace, or already gone); -ESTALE when the socket is in TIME_WAIT
 * (the kernel no longer records its owner); or another negative errno (-ETIMEDOUT, -EPROTO, a
 * socket()/sendto()/recv() error) when the kernel cannot be asked. *uid is written only on
 * success.
 */
int rdzv__peer_uid(rdzv__peercred *p, const struct sockaddr *peer, const struct sockaddr *local,
                   bool search, uint32_t *uid);

/*
 * Finds whether the peer `pa` of an accepted connection whose local end is `la` is on this
 * host and, if so, who owns its socket (the other-user rule of the server and the store
 * proxy). A peer is local when its address is loopback, the connection's own local address,
 * or an address the kernel routes to this host, or when the kernel finds its socket here. This
 * fails closed: a peer known (or not known not) to be local whose owner cannot be established
 * is an error. Returns 1 (local, *uid set), 0 (another host) or the negative errno of the
 * lookup (-ENOENT: its socket is gone; -ESTALE: in TIME_WAIT).
 */
int rdzv__local_owner(rdzv__peercred *cred, const struct sockaddr *pa, const struct sockaddr *la,
                      uint32_t *uid);

/*
 * Whether packets to the IP of `sa` (AF_INET or AF_INET6, IPv4-mapped counts as IPv4) are
 * delivered on this host: the kernel's route lookup for it (RTM_GETROUTE) answers with a route
 * of type local. Returns 1 (an address of this host's network namespace), 0 (routed elsewhere,
 * or no route) or a negative errno when the kernel cannot be asked.
 */
int rdzv__addr_local(rdzv__peercred *p, const struct sockaddr *sa);

#endif /* RDZV_AUTH_H */
