/*
 * A blocking etcd v3 client for ddprun's agents, over etcd's JSON gateway (HTTP/1.1 POSTs to
 * /v3/kv/..., /v3/lease/... and /v3/watch on a member's client URL; etcd 3.4 and later). It holds
 * what a rendezvous needs from etcd and nothing more: single-key and prefix reads with the
 * store's revision, puts (optionally bound to a lease), deletes, one-shot transactions
 * (compare, then puts and deletes), leases (grant, one keepalive, revoke) and a bounded watch
 * that waits for the next change of a key or a prefix.
 *
 * Keys are NUL-terminated strings; values are byte strings (value, value_len) and come back
 * NUL-terminated as well, for text. A prefix covers every key that starts with it; the empty
 * prefix covers every key.
 *
 * Endpoints: a client is created from "host:port[,host:port...]" (any members of one cluster;
 * a port left out is etcd's 2379; an IPv6 address is bracketed: "[::1]:2379"). Every call goes
 * to the member that answered last and moves on to the next one, in the list's order, only when
 * a member cannot be reached at all (refused, unresolvable, no connection within the timeout).
 * A failure after the request reached a member is that call's result (for -ECONNRESET and
 * -ETIMEDOUT it is not known whether etcd applied it), and the next call starts at the next
 * member, so that a caller's retry goes elsewhere.
 *
 * Conventions: functions return 0 on success or a negative errno value; out-parameters are
 * written only on success; arguments are borrowed for the call and the client copies what it
 * keeps. Each client keeps a sentence about its last failure (ddprun_etcd_last_error()). The
 * client never prints and never exits. A client is not thread-safe: one thread at a time, and a
 * thread that needs etcd while another waits in a watch needs a client of its own. Return codes
 * every call may give besides its own:
 *   -EINVAL        a bad argument (NULL, an empty key, a negative count)
 *   -ENOMEM        out of memory
 *   -ECONNREFUSED  no member could be reached (the sentence names each endpoint tried, how long
 *                  each took and why it failed); -EHOSTUNREACH where none even resolved; where
 *                  ddprun_etcd_create() passed over members that were reached, the code of the
 *                  last such failure, -EACCES first
 *   -ETIMEDOUT     a member took longer than the client's timeout to answer
 *   -ECONNRESET    the connection broke during the request
 *   -EACCES        TLS refused (certificates) or etcd refused the credentials
 *   -EPROTO        an answer that is not etcd's JSON, or a TLS failure other than the above
 *   -EAGAIN        etcd answered "unavailable" (no leader, too many requests): retry later
 *
 * Internal to ddprun: not installed. The header compiles as C99 and C++.
 */
#ifndef DDPRUN_ETCD_H
#define DDPRUN_ETCD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DDPRUN_ETCD_DEFAULT_PORT 2379
#define DDPRUN_ETCD_MAX_ENDPOINTS 64 /* most members in one endpoint list */

typedef struct ddprun_etcd ddprun_etcd;

enum ddprun_etcd_protocol { DDPRUN_ETCD_HTTP = 0, DDPRUN_ETCD_HTTPS = 1 };

typedef struct ddprun_etcd_options {
    int timeout_ms;     /* bound on each request, connecting included (> 0); default 5000 */
    int protocol;       /* enum ddprun_etcd_protocol; default DDPRUN_ETCD_HTTP */
    const char *cacert; /* PEM file of the CA that signed the members' certificates (https);
                         * NULL: the system's CAs */
    const char *cert;   /* PEM client certificate (https, client authentication); NULL: none */
    const char *key;    /* PEM private key of `cert`; NULL: none */
} ddprun_etcd_options;

/* Fills *o with the defaults above. */
void ddprun_etcd_options_init(ddprun_etcd_options *o);

/*
 * Creates a client for the cluster reachable at `endpoints` ("host:port[,host:port...]") and
 * checks that a member answers as etcd, trying the endpoints in order and passing over any that
 * fails to answer (unreachable, silent for timeout_ms, a broken connection); the sentence of a
 * failure names each endpoint tried, why and for how long. `endpoints` and `o` (NULL:
 * the defaults) are borrowed; the paths in `o` are copied. On success *out holds the client, to be
 * released with ddprun_etcd_close().
 *
 * Returns 0; -EINVAL (an empty or malformed endpoint list, more than DDPRUN_ETCD_MAX_ENDPOINTS
 * members, timeout_ms <= 0, an unknown protocol, a key without a certificate); -ENOSYS (libcurl,
 * loaded at the first call rather than linked, cannot be loaded); or a code of the list above. The sentence of a failed creation is ddprun_etcd_last_error(NULL), per thread.
 */
int ddprun_etcd_create(const char *endpoints, const ddprun_etcd_options *o, ddprun_etcd **out);

/* Closes the client's connections and frees it. NULL is a no-op. */
void ddprun_etcd_close(ddprun_etcd *e);

/*
 * The sentence about the client's last failure ("" after a success), valid until its next call;
 * with e NULL, the sentence of this thread's last failed ddprun_etcd_create(). Never NULL.
 */
const char *ddprun_etcd_last_error(const ddprun_etcd *e);

/* "host:port" of the member that answered last (borrowed from the client, valid until close). */
const char *ddprun_etcd_endpoint(const ddprun_etcd *e);

/*
 * The address of this end of the last request a member answered ("10.0.0.7", "::1"; "" before
 * any), as the member saw it: an address of this host by which the cluster reaches it (borrowed
 * from the client, valid until its next call).
 */
const char *ddprun_etcd_local_address(const ddprun_etcd *e);

/* A key with its value and metadata. Keys and values are owned by the array they are in. */
typedef struct ddprun_etcd_kv {
    char *key;   /* NUL-terminated */
    char *value; /* value_len bytes, then a NUL */
    size_t value_len;
    int64_t create_revision; /* revision of the put that created the key */
    int64_t mod_revision;    /* revision of its last put */
    int64_t version;         /* puts since it was created (1 after the first) */
    int64_t lease;           /* lease the key is bound to; 0: none */
} ddprun_etcd_kv;

/* Frees an array of `count` keys from ddprun_etcd_get() or ddprun_etcd_range(). NULL is a no-op. */
void ddprun_etcd_kvs_free(ddprun_etcd_kv *kvs, size_t count);

/*
 * Reads `key`. On success *out is one key (free with ddprun_etcd_kvs_free(*out, 1)) and, where
 * `revision` is not NULL, *revision the store's revision at the read. Returns 0, -ENOENT (no
 * such key; *revision is still written) or a common code.
 */
int ddprun_etcd_get(ddprun_etcd *e, const char *key, ddprun_etcd_kv **out, int64_t *revision);

/*
 * Reads every key starting with `prefix`, in key order. On success *out is an array of *count
 * keys (NULL when none; free with ddprun_etcd_kvs_free()) and *revision (may be NULL) the
 * store's revision at the read. Returns 0 or a common code.
 */
int ddprun_etcd_range(ddprun_etcd *e, const char *prefix, ddprun_etcd_kv **out, size_t *count,
                      int64_t *revision);

/*
 * Sets `key` to value_len bytes at `value` (NULL only with value_len 0), bound to `lease` (0:
 * none; the key is deleted when the lease ends). *revision (may be NULL) receives the revision of
 * the put. Returns 0, -ENOENT (no such lease) or a common code.
 */
int ddprun_etcd_put(ddprun_etcd *e, const char *key, const void *value, size_t value_len,
                    int64_t lease, int64_t *revision);

/*
 * Deletes `key`, or every key starting with it when `prefix` is true. *deleted (may be NULL)
 * receives how many keys went. Returns 0 (also when there was nothing to delete) or a common
 * code.
 */
int ddprun_etcd_delete(ddprun_etcd *e, const char *key, bool prefix, int64_t *deleted);

/* Transactions: what a comparison looks at, and how. */
enum ddprun_etcd_target {
    DDPRUN_ETCD_VERSION = 0, /* the key's version (0: the key does not exist) */
    DDPRUN_ETCD_CREATE = 1,  /* its create_revision (0: it does not exist) */
    DDPRUN_ETCD_MOD = 2,     /* its mod_revision (0: it does not exist) */
    DDPRUN_ETCD_VALUE = 3    /* its value (a missing key fails every value comparison) */
};

enum ddprun_etcd_result {
    DDPRUN_ETCD_EQUAL = 0,
    DDPRUN_ETCD_NOT_EQUAL = 1,
    DDPRUN_ETCD_GREATER = 2,
    DDPRUN_ETCD_LESS = 3
};

typedef struct ddprun_etcd_compare {
    const char *key;
    int target;        /* enum ddprun_etcd_target */
    int result;        /* enum ddprun_etcd_result: "<key's target> <result> <operand>" */
    int64_t number;    /* the operand for VERSION, CREATE and MOD */
    const void *value; /* the operand for VALUE: value_len bytes */
    size_t value_len;
} ddprun_etcd_compare;

enum ddprun_etcd_op_kind {
    DDPRUN_ETCD_OP_PUT = 0,
    DDPRUN_ETCD_OP_DELETE = 1,       /* the key */
    DDPRUN_ETCD_OP_DELETE_PREFIX = 2 /* every key starting with `key` */
};

typedef struct ddprun_etcd_op {
    int kind; /* enum ddprun_etcd_op_kind */
    const char *key;
    const void *value; /* PUT: value_len bytes */
    size_t value_len;
    int64_t lease; /* PUT: lease to bind the key to; 0: none */
} ddprun_etcd_op;

/*
 * One atomic transaction: if every comparison in cmp[0..ncmp) holds, the operations
 * on_success[0..nsuccess) are applied, else on_failure[0..nfailure), in order, at one revision.
 * (An empty comparison list holds.) *succeeded receives which branch ran and *revision (may be
 * NULL) the store's revision after the transaction; read what a failed comparison saw with
 * ddprun_etcd_get() or ddprun_etcd_range() afterwards (or at the revision given). The arrays and
 * what they point to are borrowed.
 *
 * Returns 0 whichever branch ran; -EINVAL (a bad target, result or kind; a key written twice in
 * one branch, which etcd refuses); -ENOENT (a put names a lease that does not exist); or a common
 * code, in which case nothing was applied or, for -ETIMEDOUT and -ECONNRESET, it is not known.
 */
int ddprun_etcd_txn(ddprun_etcd *e, const ddprun_etcd_compare *cmp, size_t ncmp,
                    const ddprun_etcd_op *on_success, size_t nsuccess,
                    const ddprun_etcd_op *on_failure, size_t nfailure, bool *succeeded,
                    int64_t *revision);

/*
 * Grants a lease of ttl_s seconds (1 to 9e10; etcd raises TTLs below its minimum, about 2 s with
 * its default election timing). *id receives the lease's id and *granted_s (may be NULL) the TTL
 * etcd gave. Returns 0 or a common code.
 */
int ddprun_etcd_lease_grant(ddprun_etcd *e, int64_t ttl_s, int64_t *id, int64_t *granted_s);

/*
 * Renews lease `id` once, to its full TTL; *ttl_s (may be NULL) receives it. Call more often than
 * the TTL. Returns 0, -ENOENT (the lease expired or was revoked: its keys are gone) or a common
 * code.
 */
int ddprun_etcd_lease_keepalive(ddprun_etcd *e, int64_t id, int64_t *ttl_s);

/* Ends lease `id` now, deleting its keys. Returns 0, -ENOENT (no such lease) or a common code. */
int ddprun_etcd_lease_revoke(ddprun_etcd *e, int64_t id);

enum ddprun_etcd_event_type {
    DDPRUN_ETCD_PUT = 0,
    DDPRUN_ETCD_DELETE = 1 /* a delete, or the key's lease ended: kv holds the key only */
};

/* A change of a key. */
typedef struct ddprun_etcd_event {
    int type;          /* enum ddprun_etcd_event_type */
    ddprun_etcd_kv kv; /* key (and for PUT value and metadata) owned by the event; mod_revision
                        * is the revision of the change for both types */
} ddprun_etcd_event;

/* Frees what *ev holds (not ev itself) and zeroes it. NULL is a no-op. */
void ddprun_etcd_event_clear(ddprun_etcd_event *ev);

/*
 * Waits for the first change of `key` (of any key starting with it when `prefix` is true) at a
 * revision after `after_revision` (0: after the store's revision when the watch starts), for at
 * most timeout_ms (>= 0) milliseconds. A change made after `after_revision` but before the call
 * is returned at once, so reading at revision R and then watching after R misses nothing. The
 * wait is one streamed request on etcd's /v3/watch, ended at the first event or the deadline; it
 * does not poll. Where several keys change at one revision, the first is returned: read the
 * others with ddprun_etcd_range().
 *
 * On success *ev holds the change (free with ddprun_etcd_event_clear()). Returns 0; -ETIMEDOUT
 * (no change within timeout_ms); -ESTALE (after_revision was compacted away: read again and
 * watch after the new revision); or a common code.
 */
int ddprun_etcd_watch(ddprun_etcd *e, const char *key, bool prefix, int64_t after_revision,
                      int timeout_ms, ddprun_etcd_event *ev);

#ifdef __cplusplus
}
#endif

#endif /* DDPRUN_ETCD_H */
