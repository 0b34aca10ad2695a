/*
 * The store's authentication handshake (both sides) and its access rules: which keys are
 * private to a job's authenticated connections, and the network lists peers are checked
 * against. The wire format and the reasoning are in auth.h and rdzv-protocol(7).
 *
 * The cryptography is Nettle's: HMAC-SHA256 for the proofs, memeql_sec to compare proofs in
 * constant time; the random bytes (nonces, generated tokens) are the kernel's (getrandom(2)).
 * Nothing is hand-rolled here. Nettle rather than OpenSSL's libcrypto, because every ddprun and
 * every librendezvous client starts with a handshake: loading libcrypto and the first
 * RAND_bytes/HMAC cost about 2 ms of CPU per process (measured: 0.1 ms with Nettle), paid by
 * every worker of a job.
 *
 * No I/O besides the random bytes; no allocation except by the address set. The token is
 * never copied anywhere but into Nettle's HMAC context, and never logged.
 */
#include "auth.h"
#include "rdzv.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nettle/hmac.h>
#include <nettle/memops.h>
#include <sys/random.h>

/* The labels signed with each side's proof: NUL-terminated, the NUL included. */
static const char label_server[] = "rdzv-auth-v1 server";
static const char label_client[] = "rdzv-auth-v1 client";

/* Fills buf with n bytes from the kernel's random number generator (getrandom(2), which blocks
 * only until it is seeded at boot). Returns 0, or -errno. */
static int random_bytes(uint8_t *buf, size_t n)
{
    while (n > 0) {
        ssize_t r = getrandom(buf, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        buf += r;
        n -= (size_t)r;
    }
    return 0;
}

int rdzv_token_check(const char *token)
{
    if (!token)
        return -EINVAL;
    size_t n = strlen(token);
    if (n < RDZV_TOKEN_MIN_BYTES || n > RDZV_TOKEN_MAX_BYTES)
        return -EINVAL;
    for (size_t i = 0; i < n; i++)
        if (token[i] <= ' ' || token[i] > '~')
            return -EINVAL;
    return 0;
}

int rdzv_token_generate(char *buf, size_t cap)
{
    static const char hex[] = "0123456789abcdef";
    uint8_t raw[32];
    if (!buf || cap < 2 * sizeof raw + 1)
        return -ENOSPC;
    if (random_bytes(raw, sizeof raw) < 0)
        return -EIO;
    for (size_t i = 0; i < sizeof raw; i++) {
        buf[2 * i] = hex[raw[i] >> 4];
        buf[2 * i + 1] = hex[raw[i] & 15];
    }
    buf[2 * sizeof raw] = '\0';
    explicit_bzero(raw, sizeof raw);
    return 0;
}

#define TOKEN_FILE_MAX 4096

int rdzv_token_read_file(const char *path, char *buf, size_t cap)
{
    char text[TOKEN_FILE_MAX + 1];
    size_t n = 0;
    int rc = 0;
    if (!path || !buf || cap == 0)
        return -EINVAL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    for (;;) {
        ssize_t r = read(fd, text + n, sizeof text - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = -errno;
            break;
        }
        if (r == 0)
            break;
        n += (size_t)r;
        if (n == sizeof text) {
            rc = -EFBIG;
            break;
        }
    }
    close(fd);
    if (rc == 0) {
        while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == ' ' ||
                         text[n - 1] == '\t'))
            n--;
        text[n] = '\0';
        if (memchr(text, '\0', n) || rdzv_token_check(text) < 0)
            rc = -EINVAL;
        else if (n + 1 > cap)
            rc = -ENOSPC;
        else
            memcpy(buf, text, n + 1);
    }
    explicit_bzero(text, sizeof text);
    return rc;
}

int rdzv__auth_nonce(uint8_t nonce[RDZV_AUTH_NONCE_BYTES])
{
    return random_bytes(nonce, RDZV_AUTH_NONCE_BYTES) < 0 ? -EIO : 0;
}

int rdzv__auth_mac(const char *token, enum rdzv_auth_dir dir, const uint8_t *cn, const uint8_t *sn,
                   uint8_t mac[RDZV_AUTH_MAC_BYTES])
{
    uint8_t msg[sizeof label_server + 2 * RDZV_AUTH_NONCE_BYTES];
    _Static_assert(sizeof label_server == sizeof label_client, "labels of one length");
    memcpy(msg, dir == RDZV_AUTH_SERVER ? label_server : label_client, sizeof label_server);
    memcpy(msg + sizeof label_server, cn, RDZV_AUTH_NONCE_BYTES);
    memcpy(msg + sizeof label_server + RDZV_AUTH_NONCE_BYTES, sn, RDZV_AUTH_NONCE_BYTES);
    _Static_assert(RDZV_AUTH_MAC_BYTES == SHA256_DIGEST_SIZE, "the proof is one SHA-256 digest");
    struct hmac_sha256_ctx ctx;
    hmac_sha256_set_key(&ctx, strlen(token), (const uint8_t *)token);
    hmac_sha256_update(&ctx, sizeof msg, msg);
    hmac_sha256_digest(&ctx, RDZV_AUTH_MAC_BYTES, mac);
    explicit_bzero(&ctx, sizeof ctx); /* it holds the keyed inner and outer states */
    return 0;
}

int rdzv__auth_server_hello(const char *token, rdzv__auth_conn *a, const uint8_t *cn, size_t cn_len,
                            uint8_t *reply, size_t *reply_len)
{
    if (cn_len != RDZV_AUTH_NONCE_BYTES || a->state != RDZV_AUTH_NONE)
        return -EPROTO;
    if (!token) {
        reply[0] = RDZV_AUTH_STATUS_NO_SECRET;
        *reply_len = 1;
        return 0;
    }
    memcpy(a->cn, cn, RDZV_AUTH_NONCE_BYTES);
    int rc = rdzv__auth_nonce(a->sn);
    if (rc == 0)
        rc = rdzv__auth_mac(token, RDZV_AUTH_SERVER, a->cn, a->sn,
                            reply + 1 + RDZV_AUTH_NONCE_BYTES);
    if (rc < 0)
        return rc;
    reply[0] = RDZV_AUTH_STATUS_OK;
    memcpy(reply + 1, a->sn, RDZV_AUTH_NONCE_BYTES);
    *reply_len = RDZV_AUTH_HELLO_REPLY_BYTES;
    a->state = RDZV_AUTH_CHALLENGED;
    return 0;
}

int rdzv__auth_server_proof(const char *token, rdzv__auth_conn *a, const uint8_t *mac,
                            size_t mac_len)
{
    uint8_t want[RDZV_AUTH_MAC_BYTES];
    if (!token || a->state != RDZV_AUTH_CHALLENGED)
        return -EPROTO;
    int rc = rdzv__auth_mac(token, RDZV_AUTH_CLIENT, a->cn, a->sn, want);
    if (rc < 0)
        return rc;
    /* One proof per challenge: a wrong one closes the connection, a right one ends it. */
    a->state = RDZV_AUTH_NONE;
    if (mac_len != RDZV_AUTH_MAC_BYTES || !memeql_sec(want, mac, RDZV_AUTH_MAC_BYTES))
        return -EACCES;
    a->state = RDZV_AUTH_DONE;
    return 0;
}

int rdzv__auth_client_check(const char *token, const uint8_t *cn, const uint8_t *reply,
                            size_t reply_len, uint8_t proof[RDZV_AUTH_MAC_BYTES])
{
    uint8_t want[RDZV_AUTH_MAC_BYTES];
    if (reply_len == 1 && reply[0] == RDZV_AUTH_STATUS_NO_SECRET)
        return -ENOKEY;
    if (reply_len != RDZV_AUTH_HELLO_REPLY_BYTES || reply[0] != RDZV_AUTH_STATUS_OK)
        return -EPROTO;
    const uint8_t *sn = reply + 1, *mac = reply + 1 + RDZV_AUTH_NONCE_BYTES;
    int rc = rdzv__auth_mac(token, RDZV_AUTH_SERVER, cn, sn, want);
    if (rc < 0)
        return rc;
    if (!memeql_sec(want, mac, RDZV_AUTH_MAC_BYTES))
        return -EKEYREJECTED;
    return rdzv__auth_mac(token, RDZV_AUTH_CLIENT, cn, sn, proof);
}

/* ---------------------------------------------------------------------------------------- */
/* Private keys                                                                             */
/* ---------------------------------------------------------------------------------------- */

static bool has_prefix(const uint8_t *key, size_t n, const char *prefix)
{
    size_t p = strlen(prefix);
    return n >= p && memcmp(key, prefix, p) == 0;
}

bool rdzv__key_private(const uint8_t *key, size_t n)
{
    return has_prefix(key, n, RDZV_PRIVATE_AGENT_ROOT) ||
           has_prefix(key, n, RDZV_PRIVATE_COLL_ROOT);
}

bool rdzv__request_private(const rdzv__request *r)
{
    return rdzv__request_private_keys(r, NULL, NULL) > 0;
}

/* Counts one key of a request: *n private keys so far, the first at *first (*first_len). */
static void count_private(const uint8_t *k, size_t kl, size_t *n, const uint8_t **first,
                          size_t *first_len)
{
    if (!rdzv__key_private(k, kl))
        return;
    if ((*n)++ == 0) {
        *first = k;
        *first_len = kl;
    }
}

size_t rdzv__request_private_keys(const rdzv__request *r, const uint8_t **key, size_t *len)
{
    const uint8_t *cur = r->items, *k, *v, *first = NULL;
    size_t kl, vl, n = 0, first_len = 0;

    switch (r->op) {
    case RDZV_OP_CHECK:
    case RDZV_OP_WAIT:
    case RDZV_OP_MULTI_GET:
        for (uint64_t i = 0; i < r->count; i++) {
            rdzv__next_str(&cur, &k, &kl);
            count_private(k, kl, &n, &first, &first_len);
        }
        break;
    case RDZV_OP_MULTI_SET:
        for (uint64_t i = 0; i < r->count; i++) {
            rdzv__next_str(&cur, &k, &kl);
            rdzv__next_str(&cur, &v, &vl);
            count_private(k, kl, &n, &first, &first_len);
        }
        break;
    case RDZV_OP_SET:
    case RDZV_OP_COMPARE_SET:
    case RDZV_OP_GET:
    case RDZV_OP_ADD:
    case RDZV_OP_DELETE_KEY:
    case RDZV_OP_APPEND:
    case RDZV_OP_QUEUE_PUSH:
    case RDZV_OP_QUEUE_POP:
    case RDZV_OP_QUEUE_LEN:
    case RDZV_OP_BARRIER:
    case RDZV_OP_WATCH_KEY:
        count_private(r->key, r->key_len, &n, &first, &first_len);
        break;
    default:
        break;
    }
    if (n && key && len) {
        *key = first;
        *len = first_len;
    }
    return n;
}

void rdzv__private_refusal(const rdzv__request *r, char *buf, size_t cap)
{
    const uint8_t *k = NULL;
    size_t kl = 0, n = rdzv__request_private_keys(r, &k, &kl);
    char key[65], many[64] = "";
    if (!cap)
        return;
    if (!n) {
        snprintf(buf, cap, "%s refused: no private key", rdzv__op_name(r->op));
        return;
    }
    /* The peer's bytes going into our log: printable only, and bounded. */
    size_t m = kl < sizeof(key) - 1 ? kl : sizeof(key) - 1;
    for (size_t i = 0; i < m; i++)
        key[i] = k[i] >= ' ' && k[i] <= '~' ? (char)k[i] : '?';
    key[m] = '\0';
    bool multi = r->op == RDZV_OP_CHECK || r->op == RDZV_OP_WAIT || r->op == RDZV_OP_MULTI_GET ||
                 r->op == RDZV_OP_MULTI_SET;
    if (multi)
        snprintf(many, sizeof(many), " (%zu private key%s of %llu)", n, n > 1 ? "s" : "",
                 (unsigned long long)r->count);
    snprintf(buf, cap, "%s refused: '%s%s' is private to the job's authenticated connections%s",
             rdzv__op_name(r->op), key, kl > m ? "..." : "", many);
}

/* ---------------------------------------------------------------------------------------- */
/* Addresses                                                                                */
/* ---------------------------------------------------------------------------------------- */

/* The IP of `sa` as a family and 4 or 16 bytes; IPv4-mapped IPv6 becomes IPv4. */
static bool ip_of(const struct sockaddr *sa, int *family, uint8_t addr[16])
{
    if (sa->sa_family == AF_INET) {
        *family = AF_INET;
        memcpy(addr, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        return true;
    }
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a6 = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a6)) {
            *family = AF_INET;
            memcpy(addr, a6->s6_addr + 12, 4);
        } else {
            *family = AF_INET6;
            memcpy(addr, a6->s6_addr, 16);
        }
        return true;
    }
    return false;
}

int rdzv__cidr_parse(const char *s, rdzv__cidr *out)
{
    char text[INET6_ADDRSTRLEN + 8];
    rdzv__cidr c = {0};
    if (!s || strlen(s) >= sizeof text)
        return -EINVAL;
    snprintf(text, sizeof text, "%s", s);
    char *slash = strchr(text, '/');
    if (slash)
        *slash = '\0';
    if (inet_pton(AF_INET, text, c.addr) == 1)
        c.family = AF_INET;
    else if (inet_pton(AF_INET6, text, c.addr) == 1)
        c.family = AF_INET6;
    else
        return -EINVAL;
    int max = c.family == AF_INET ? 32 : 128;
    c.bits = max;
    if (slash) {
        char *end;
        long b = strtol(slash + 1, &end, 10);
        if (end == slash + 1 || *end || b < 0 || b > max)
            return -EINVAL;
        c.bits = (int)b;
    }
    *out = c;
    return 0;
}

bool rdzv__cidr_match(const rdzv__cidr *net, const struct sockaddr *sa)
{
    int family;
    uint8_t addr[16];
    if (!ip_of(sa, &family, addr) || family != net->family)
        return false;
    int full = net->bits / 8, rest = net->bits % 8;
    if (memcmp(addr, net->addr, (size_t)full) != 0)
        return false;
    if (rest == 0)
        return true;
    uint8_t mask = (uint8_t)(0xFF << (8 - rest));
    return (addr[full] & mask) == (net->addr[full] & mask);
}

bool rdzv__addr_loopback(const struct sockaddr *sa)
{
    int family;
    uint8_t addr[16];
    static const uint8_t v6_loopback[16] = {[15] = 1};
    if (!ip_of(sa, &family, addr))
        return false;
    return family == AF_INET ? addr[0] == 127 : memcmp(addr, v6_loopback, 16) == 0;
}

bool rdzv__addr_same(const struct sockaddr *a, const struct sockaddr *b)
{
    int fa, fb;
    uint8_t xa[16], xb[16];
    if (!ip_of(a, &fa, xa) || !ip_of(b, &fb, xb) || fa != fb)
        return false;
    return memcmp(xa, xb, fa == AF_INET ? 4 : 16) == 0;
}

/* At most this many node addresses are remembered: a job has at most 65536 nodes. */
#define ADDRSET_MAX 65536

int rdzv__addrset_add(rdzv__addrset *s, const struct sockaddr *sa)
{
    rdzv__cidr c = {0};
    if (!ip_of(sa, &c.family, c.addr))
        return -EINVAL;
    c.bits = c.family == AF_INET ? 32 : 128;
    if (rdzv__addrset_has(s, sa))
        return 0;
    if (s->n >= ADDRSET_MAX)
        return -ENOSPC;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        rdzv__cidr *v = realloc(s->v, cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = c;
    return 1;
}

bool rdzv__addrset_has(const rdzv__addrset *s, const struct sockaddr *sa)
{
    for (size_t i = 0; i < s->n; i++)
        if (rdzv__cidr_match(&s->v[i], sa))
            return true;
    return false;
}

void rdzv__addrset_free(rdzv__addrset *s)
{
    free(s->v);
    *s = (rdzv__addrset){0};
}
