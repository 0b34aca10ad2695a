/*
 * librendezvous: a key-value store that speaks PyTorch's c10d TCPStore wire protocol.
 *
 * Two halves share this header:
 *
 *  - the server (rdzv_server_*), a libuv TCP server that can run on the caller's uv_loop_t or
 *    on a thread of its own. It accepts PyTorch 1.x ("legacy") and PyTorch 2.2+ ("modern")
 *    clients on the same port, detecting the generation per connection.
 *  - the client (rdzv_client_*), a blocking client for C programs: the launcher, workers
 *    and job schedulers. It speaks the modern generation.
 *
 * Conventions: functions that can fail return an int, >= 0 on success and a negative errno
 * value on failure (-ETIMEDOUT, -ECONNRESET, -EPROTO, -EINVAL, -ENOMEM, ...);
 * rdzv_strerror() names any of them. Out-parameters are written only on success. Strings and
 * buffers passed in are borrowed for the duration of the call; the store copies what it keeps.
 * Yes-or-no values, in arguments, fields and out-arrays, are bool.
 *
 * Releasing: one function per kind of thing the library hands out, and each accepts NULL.
 * Objects that hold connections (a server, a client) are released with their _close()
 * function, rdzv_server_close() and rdzv_client_close(), which closes what they hold and frees
 * them; memory the library allocates for the caller (values, key arrays, JSON text) is released
 * with rdzv_free().
 *
 * The header compiles as C99 and C++.
 */
#ifndef RDZV_H
#define RDZV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Errors, logging, memory                                                                     */
/* ------------------------------------------------------------------------------------------ */

/*
 * Returns a static, human-readable description of a return code of this library (a negative
 * errno value). Never returns NULL. Thread-safe.
 */
const char *rdzv_strerror(int err);

/* Releases memory that a function of this library allocated for the caller. NULL is a no-op. */
void rdzv_free(void *p);

enum rdzv_log_level {
    RDZV_LOG_ERROR = 0,
    RDZV_LOG_WARN = 1,
    RDZV_LOG_INFO = 2,
    RDZV_LOG_DEBUG = 3
};

/*
 * Log hook. The library never prints; it calls this with one line of text (no trailing newline)
 * when one was set. `msg` is borrowed for the call. The server calls it from its loop thread,
 * except for the "listening on" line, which comes from the thread creating the server. For a
 * threaded server the hook runs with the server's lock held: it must not call rdzv_server_*.
 */
typedef void (*rdzv_log_fn)(void *arg, int level, const char *msg);

/* ------------------------------------------------------------------------------------------ */
/* Server                                                                                      */
/* ------------------------------------------------------------------------------------------ */

typedef struct rdzv_server rdzv_server;

/*
 * The ranges of rdzv_server_options fields that rdzv_server_start() checks (-EINVAL outside
 * them), for programs to check their own flags against (ddp-rendezvous(1) does) and name the
 * flag and the range.
 *
 * RDZV_KEY_BYTES_MAX: the highest max_key_bytes. A legacy SET whose key length had the
 * handshake's magic in its low 32 bits would be about 968 MiB long; keeping keys far below that
 * keeps the detection of the protocol generation exact.
 */
#define RDZV_KEY_BYTES_MAX ((size_t)16 << 20)    /* max_key_bytes: 1 to this */
#define RDZV_REQUEST_BYTES_MIN ((size_t)16)      /* max_request_bytes: from this */
#define RDZV_REQUEST_BYTES_MAX ((size_t)1 << 30) /* max_request_bytes: to this */
#define RDZV_KEEPALIVE_MAX_S 32767               /* keepalive_s: 0 to this (TCP_KEEPIDLE's) */
#define RDZV_ALLOW_MAX 4096                      /* nallow: 0 to this */

/* Server settings. Fill with rdzv_server_options_init(), then change what you need. */
typedef struct rdzv_server_options {
    const char *host; /* bind address, IPv4 or IPv6 literal or name ("127.0.0.1"); "::"
                         listens on IPv6 and IPv4, or IPv4 alone where the host has no IPv6 */
    int port;         /* 0 picks a free port; read it back with rdzv_server_port() */
    int listen_fd;    /* >= 0: an already bound (and possibly listening) TCP socket to serve
                         on instead of binding host:port; the server owns it from the call
                         on, and closes it also when the call fails (-1) */
    int backlog;      /* listen(2) backlog (SOMAXCONN) */
    int keepalive_s;  /* TCP keepalive idle time for accepted connections, in seconds;
                         0 turns it off (60; at most RDZV_KEEPALIVE_MAX_S) */

    size_t max_key_bytes;        /* longest key (8 KiB; at most RDZV_KEY_BYTES_MAX) */
    size_t max_value_bytes;      /* longest value in one request (8 MiB) */
    size_t max_keys_per_request; /* keys in one CHECK/WAIT/MULTI_GET/MULTI_SET (128 Ki) */
    size_t max_request_bytes;    /* largest single request frame (64 MiB; RDZV_REQUEST_BYTES_MIN
                                    to RDZV_REQUEST_BYTES_MAX) */
    size_t max_total_bytes;      /* keys, values and queued items stored, with the memory each
                                    takes beyond its bytes (about 150 bytes a key), and pending
                                    WAIT and watch records; private keys have their own cap,
                                    max_private_bytes (1 GiB) */
    size_t max_connections;      /* simultaneous client connections; 0 derives it from the
                                    descriptor limit, see fd_reserve (0) */
    size_t max_pending_output;   /* unsent reply bytes per connection past which the server
                                    runs none of its requests and stops reading from it until
                                    the peer has taken half of them (64 MiB) */

    rdzv_log_fn log; /* optional log hook; NULL: silent */
    void *log_arg;

    /* Optional: called whenever a client connection closes (the peer went away, or the server
     * closed it), with the peer's numeric address (an IPv4-mapped IPv6 address in its IPv4
     * form; both borrowed for the call) and port as they were when the connection was
     * accepted. Runs on the server's thread (the caller's loop thread for an embedded server)
     * and must not call into the server. An embedding launcher uses it to learn at once that a
     * process whose connection it knows (rdzv_client_local_endpoint()) has gone. NULL: none. */
    void (*on_close)(void *arg, const char *host, int port);
    void *on_close_arg;
    /*
     * Access control (see rdzv-protocol(7), AUTHENTICATION). With a token, connections that
     * complete the handshake with it are authenticated; only they may name keys under
     * RDZV_PRIVATE_AGENT_ROOT or RDZV_PRIVATE_COLL_ROOT, and a connection from an address that
     * is not loopback, this host, an authenticated node's address or in `allow` may do nothing
     * but authenticate. Any other request on such a connection closes it, with one log line.
     */
    const char *token;        /* the job's secret (rdzv_token_check() rules); copied; NULL:
                                 no authentication, nothing private (NULL) */
    const char *const *allow; /* `nallow` networks ("10.0.0.0/8", "fd00::/8", an address)
                                 whose peers need not authenticate first; copied (NULL) */
    size_t nallow;            /* (0; at most RDZV_ALLOW_MAX); with no token but nallow > 0,
                                 peers outside them and not local are refused on connect */
    bool allow_other_users;   /* false: refuse connections from this host owned by a user
                                 other than the server's (and root), found with
                                 NETLINK_SOCK_DIAG (sockets bound to a device included, with no
                                 new descriptor needed), and those whose owner cannot be
                                 established (false) */
    size_t max_conn_output;    /* unsent reply bytes one connection may have queued; a reply or
                                  watch notification that would queue more closes it (256 MiB) */
    size_t max_buffered_bytes; /* unsent replies and partly received requests of all
                                  connections together; past it the connection holding the most
                                  is closed (1 GiB) */
    size_t fd_reserve;         /* with max_connections 0: descriptors kept free for the host
                                  program. The cap is then the soft RLIMIT_NOFILE, less the
                                  descriptors open when the server starts, less 16 for the
                                  server, less this (64) */
    int idle_timeout_s;        /* close a connection that has sent nothing for this long and has
                                  no WAIT or watch pending; 0: never (0) */
    int request_timeout_s;     /* close a connection whose request has stayed incomplete this
                                  long since its last progress past a whole request; 0: never
                                  (60) */
    size_t max_private_bytes;  /* like max_total_bytes, for keys under RDZV_PRIVATE_AGENT_ROOT
                                  and RDZV_PRIVATE_COLL_ROOT and the WAITs naming them: the job's
                                  control plane has this room of its own, which no request on
                                  other keys can take; max_total_bytes caps the other keys
                                  (128 MiB) */
    size_t max_list_keys;      /* LIST_KEYS on a store holding more keys is refused: its reply
                                  is built in one piece and would hold up every other client
                                  (about 20 ms per 128 Ki keys); the connection is closed with
                                  a log line, the protocol having no error reply (128 Ki) */
    /*
     * Connections on probation (with a token: from an address that is not loopback, this
     * host, a job node's or allowed; see above) are the only ones a stranger can open, and
     * these two bound them, as OpenSSH's LoginGraceTime and MaxStartups bound unauthenticated
     * logins. The job's own connections (authenticated, local, from a node's or an allowed
     * address) are never on probation and never subject to either.
     */
    int auth_timeout_s;   /* close a connection still on probation this long after its accept
                             (it did not complete the handshake); 0: never (10) */
    size_t max_probation; /* connections on probation at once; one more closes the oldest of
                             them. Whenever a connection would exceed max_connections, the
                             oldest on probation is closed for it too, so that strangers never
                             keep the job's connections out. 0: half of max_connections, at
                             least 1 (0); capped at max_connections */
    size_t max_probation_per_address; /* of those, from one IP address; one more is refused
                                         at once, so one host's flood leaves the other
                                         strangers (a node joining) their slots, like
                                         OpenSSH's PerSourceMaxStartups; 0: no cap (8) */
} rdzv_server_options;

/* Fills `opts` with the defaults given in brackets above. */
void rdzv_server_options_init(rdzv_server_options *opts);

/*
 * Keys private to authenticated connections on a store with a token: ddprun's agents' keys
 * (launcher/noderdzv.h) and libcollective's bootstrap keys (NCCL unique ids, CPU-backend
 * addresses, failure records; coll_comm_init() puts them under the second root).
 */
#define RDZV_PRIVATE_AGENT_ROOT "/ddprun/"
#define RDZV_PRIVATE_COLL_ROOT "/ddprun-coll/"

/* A token is RDZV_TOKEN_MIN_BYTES to RDZV_TOKEN_MAX_BYTES of printable ASCII, no spaces. */
#define RDZV_TOKEN_MIN_BYTES 16
#define RDZV_TOKEN_MAX_BYTES 256
/* The environment variable through which a launcher hands the token to its workers. */
#define RDZV_TOKEN_ENV "DDPRUN_STORE_TOKEN"

/* Returns 0 when `token` is a valid token (see above), else -EINVAL. Thread-safe. */
int rdzv_token_check(const char *token);

/*
 * Writes a fresh random token (64 hex digits from getrandom(2), NUL-terminated) into
 * buf. Returns 0, -ENOSPC (cap < 65) or -EIO (no randomness). Thread-safe.
 */
int rdzv_token_generate(char *buf, size_t cap);

/*
 * Reads a token from the file at `path` into buf (cap bytes): the file's content without
 * trailing white space, which must then be a valid token. Never puts the token into an error
 * message. Returns 0, -EINVAL (not a valid token; also for an empty file), -ENOSPC (cap too
 * small for it), -EFBIG (file larger than 4 KiB) or the errno of open/read. Thread-safe.
 */
int rdzv_token_read_file(const char *path, char *buf, size_t cap);

/*
 * Creates a server on the caller's libuv loop (`loop` is a uv_loop_t *, typed void * so that
 * this header does not pull in uv.h). The server binds and listens before returning; it serves
 * while the caller runs the loop. `opts` is copied (its strings too).
 *
 * Returns 0 and sets *out, or -EINVAL (bad option), -EADDRINUSE, -EADDRNOTAVAIL, -EACCES,
 * -EEXIST (a listen_fd that `loop` already watches), -ENOMEM or another negative errno from
 * socket setup. A failure never runs `loop` and leaves nothing on it. Not thread-safe: call on
 * the loop thread.
 */
int rdzv_server_create(void *loop, const rdzv_server_options *opts, rdzv_server **out);


/*
 * Creates a server that runs on a loop and thread of its own. Binding happens before this
 * returns, so errors are reported here (same codes as rdzv_server_create(), plus errors from
 * thread creation).
 */
int rdzv_server_start(const rdzv_server_options *opts, rdzv_server **out);

/*
 * Closes and frees a server. One made by rdzv_server_create() starts closing: it stops
 * listening, closes every client connection and is freed once libuv has closed its handles
 * (run the loop until then); call on the loop thread, and at most once. One made by
 * rdzv_server_start() is stopped: every connection closed, its thread joined and everything
 * freed before the call returns; call from any thread but the server's own. NULL is a no-op.
 */
void rdzv_server_close(rdzv_server *srv);

/*
 * Deletes every key (value and queue) whose name does not start with `keep_prefix` (NULL or "":
 * all keys); pending WAITs stay pending and legacy watchers are not notified. A launcher calls
 * it between attempts of a job so that restarted workers never read the failed attempt's keys.
 * Every request after the call sees the keys deleted; their memory is freed afterwards on the
 * server's loop, a slice of 1 to 2 ms per turn (status member clear_pending: names left), and
 * counts against max_total_bytes and max_private_bytes until then (a request that needs that
 * room frees some first). The call itself takes O(1) when keep_prefix is NULL, "", a private
 * root (RDZV_PRIVATE_AGENT_ROOT, RDZV_PRIVATE_COLL_ROOT) or a prefix of one, and one pass of
 * comparisons over every name for any other prefix. Thread-safe for threaded servers; for
 * embedded servers call on the loop thread. Returns the number of keys deleted (names that held
 * a value or queued items), or -EINVAL.
 */
int rdzv_server_clear(rdzv_server *srv, const char *keep_prefix);

/* The port the server listens on (useful after port 0). Thread-safe. */
int rdzv_server_port(const rdzv_server *srv);

/*
 * Writes a JSON object describing the server into *json (NUL-terminated, free with
 * rdzv_free()): keys, bytes, connections, waiters, watchers, entries, output_queued_bytes, ops
 * (a count per operation), uptime_s, port, connections_total (accepted, rejected,
 * closed_bad_input), protocol (connections per generation), memory, private_memory,
 * clear_pending (see rdzv_server_clear()) and the limits in force. Thread-safe
 * for threaded servers; for embedded servers call on the loop thread. Returns 0, -EINVAL (NULL
 * argument) or -ENOMEM.
 */
int rdzv_server_status(rdzv_server *srv, char **json);

/* ------------------------------------------------------------------------------------------ */
/* Store proxy                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/*
 * A per-node store proxy: it listens on this node, serves unmodified PyTorch workers (both
 * protocol generations) and librendezvous clients as if it were the store, and carries all
 * their connections to the root store (an rdzv_server) over one multiplexed connection (see
 * rdzv-protocol(7), MULTIPLEXED CONNECTIONS). Every request runs at the root exactly as on a
 * connection of its own, with two exceptions that nothing observed through the store can tell
 * apart (see the man page for the precise rule): identical concurrent WAITs (the same keys)
 * of different workers share one upstream WAIT, and so do identical concurrent GETs of one key
 * while no request that could change a key passed through the proxy since the shared one was
 * sent. The proxy applies the root's admission rules to its own peers (the other-user rule; with
 * a token, the handshake, and a private key only for an authenticated worker). When its upstream
 * connection is lost every worker connection is closed, as the root's death would close them,
 * and the proxy stops listening.
 */
typedef struct rdzv_proxy rdzv_proxy;

typedef struct rdzv_proxy_options {
    const char *host;          /* bind address ("127.0.0.1"); copied */
    int port;                  /* 0 picks a free port; read it back with rdzv_proxy_port() (0) */
    const char *upstream_host; /* the root store; copied (required) */
    int upstream_port;         /* (required) */
    const char *token;         /* the job's secret: authenticates the proxy upstream, and its
                                  workers with the handshake; copied; NULL: none (NULL) */
    rdzv_log_fn log;           /* optional log hook, called on the proxy's loop thread */
    void *log_arg;
    int connect_timeout_ms;    /* connecting upstream and the handshake (10000) */
    bool allow_other_users;    /* as rdzv_server_options' (false) */
    size_t max_request_bytes;  /* largest request a worker may send (64 MiB; the root's own
                                  limits apply to what passes) */
    size_t max_pending_output; /* reply bytes queued for one worker past which it is closed
                                  (256 MiB, the root's max_conn_output); and the requests
                                  queued for the root past which no worker is read until the
                                  root has taken half of them */
    /* Optional: called once, on the proxy's loop thread, when the upstream connection is lost
     * (the root closed it or died); the proxy has closed its workers and stopped listening. */
    void (*on_lost)(void *arg);
    void *on_lost_arg;
} rdzv_proxy_options;

/* Fills `opts` with the defaults given in brackets above. */
void rdzv_proxy_options_init(rdzv_proxy_options *opts);

/* Counters of a proxy, for rdzv_proxy_stats(). */
typedef struct rdzv_proxy_counters {
    uint64_t worker_requests;   /* requests received from workers (VALIDATE and the handshake
                                   included) */
    uint64_t upstream_requests; /* requests sent to the root (MUX_CLOSE not counted) */
    uint64_t coalesced;         /* worker requests that joined one already sent */
    uint64_t bytes_up;          /* bytes sent to the root */
    uint64_t bytes_down;        /* bytes received from the root */
    uint64_t accepted;          /* worker connections accepted */
    uint64_t connections;       /* worker connections open */
    bool upstream_lost;         /* the upstream connection is gone */
} rdzv_proxy_counters;

/*
 * Creates a proxy on the caller's libuv loop (`loop` is a uv_loop_t *). Connects to the root,
 * authenticates and checks that it multiplexes before returning: this blocks up to
 * connect_timeout_ms, and the root must be served by another thread or process. `opts` is
 * copied. Returns 0 and sets *out, or -EINVAL (bad option), -EPROTONOSUPPORT (the upstream is
 * a store that does not multiplex: a PyTorch store, or an older librendezvous), the errors of
 * rdzv_client_connect() (-ECONNREFUSED, -ETIMEDOUT, -EKEYREJECTED, ...), or the errors of
 * binding (-EADDRINUSE, ...). Not thread-safe: call on the loop thread.
 */
int rdzv_proxy_create(void *loop, const rdzv_proxy_options *opts, rdzv_proxy **out);

/* Creates a proxy on a loop and thread of its own; same codes as rdzv_proxy_create(). */
int rdzv_proxy_start(const rdzv_proxy_options *opts, rdzv_proxy **out);

/* The port the proxy listens on, or -EINVAL. Thread-safe. */
int rdzv_proxy_port(const rdzv_proxy *p);

/* Copies the proxy's counters into *st. Returns 0 or -EINVAL. Thread-safe for a proxy made
 * by rdzv_proxy_start(); on the loop thread for an embedded one. */
int rdzv_proxy_stats(rdzv_proxy *p, rdzv_proxy_counters *st);

/*
 * Closes a proxy: every worker connection and the upstream one (the root releases all their
 * WAITs). An embedded proxy is freed once libuv has closed its handles (run the loop); a
 * threaded one is stopped and freed before the call returns (call from another thread). NULL
 * is a no-op.
 */
void rdzv_proxy_close(rdzv_proxy *p);

/* ------------------------------------------------------------------------------------------ */
/* Client                                                                                      */
/* ------------------------------------------------------------------------------------------ */

typedef struct rdzv_client rdzv_client;

/* Client settings. Fill with rdzv_client_options_init(), then change what you need. */
typedef struct rdzv_client_options {
    int connect_timeout_ms; /* give up connecting (with retries) after this long (60000) */
    int timeout_ms;         /* bound on every call, waits included (300000); < 0: no bound */
    int backoff_initial_ms; /* first retry delay after a refused connection (10) */
    int backoff_max_ms;     /* retry delays double with jitter up to this (1000) */
    const char *prefix;     /* prepended to every key (like PyTorch's PrefixStore); copied;
                               NULL or "" for none */
    const char *token;      /* the job's secret: authenticate with it (mutually: the server
                               must prove it knows it too) when connecting; copied; NULL:
                               do not authenticate (NULL) */
    int refused_timeout_ms; /* stop retrying once connections have been refused for this long
                               since the call began, and fail with -ECONNREFUSED; 0: at the
                               first refusal; < 0: retry until connect_timeout_ms (-1) */
    int handshake_timeout_ms; /* bound on answering the handshake, from the first connection the
                                 peer accepts (a refusal starts it afresh): a peer silent that
                                 long, or closing every connection unanswered, is not a store
                                 (-EPROTO, not retried); < 0: only connect_timeout_ms (5000) */
} rdzv_client_options;

/* Fills `opts` with the defaults given in brackets above. */
void rdzv_client_options_init(rdzv_client_options *opts);

/*
 * Connects to a store at host:port (IPv4, IPv6 or a name), retrying refused or unreachable
 * connections with exponential backoff and jitter until opts->connect_timeout_ms passes (< 0:
 * forever), then opens the modern protocol (VALIDATE, then a PING the peer must echo). `opts`
 * may be NULL for the defaults; its prefix is copied. Returns 0 and sets *out, or -ETIMEDOUT
 * (deadline passed), -EINVAL, -ENOMEM, -EPROTO (the peer is not a store: it answered something
 * else, stayed silent or closed every connection for opts->handshake_timeout_ms), -EACCES (with
 * opts->token: the store does not know that token, has none, or refused this client's proof;
 * not retried), -ECONNREFUSED (refused for opts->refused_timeout_ms), or a negative errno for an
 * error that retrying cannot fix (such as EAI_NONAME,
 * mapped to -EHOSTUNREACH). On failure rdzv_client_last_error(NULL) describes it, with the last
 * connection error and the number of attempts. Name resolution itself (getaddrinfo) is not bounded
 * by the deadline.
 *
 * A client is not thread-safe: use one per thread, or serialise calls.
 */
int rdzv_client_connect(const char *host, int port, const rdzv_client_options *opts,
                        rdzv_client **out);

/*
 * Opens a second connection to the same store with the same prefix and call timeout, for use
 * by another thread. Returns 0 and sets *out, or an error of rdzv_client_connect(), -ENOTCONN
 * (c is broken) or -EINVAL.
 */
int rdzv_client_dup(const rdzv_client *c, rdzv_client **out);

/*
 * Writes the numeric local address of the client's connection (the address this host uses to
 * reach the store, which peers on the store's network can usually reach too) into host.
 * Returns 0, -ENOTCONN, -ENOSPC (hostlen too small) or -EINVAL.
 */
int rdzv_client_local_addr(const rdzv_client *c, char *host, size_t hostlen);

/*
 * Like rdzv_client_local_addr(), and writes the connection's local port into *port as well,
 * with an IPv4-mapped IPv6 address in its IPv4 form: the pair the server's on_close hook
 * reports when this connection closes. Returns 0, -ENOTCONN, -ENOSPC or -EINVAL (NULL port).
 */
int rdzv_client_local_endpoint(const rdzv_client *c, char *host, size_t hostlen, int *port);

/* Closes the connection and frees the client. NULL is a no-op. */
void rdzv_client_close(rdzv_client *c);

/*
 * A human-readable account of the client's last failure, or "" if none. Owned by the client,
 * valid until its next call. With c == NULL: the calling thread's last rdzv_client_connect()
 * failure (thread-local storage, valid until that thread's next connect).
 */
const char *rdzv_client_last_error(const rdzv_client *c);

/*
 * Every call below is bounded by the client's timeout_ms (wait() by its own timeout) and returns
 * -ETIMEDOUT rather than blocking longer; a wait, get or barrier that times out then spends up to
 * timeout_ms more cancelling its wait on the server. A call that times out after sending its
 * request (other than a wait), or that sees a malformed reply (-EPROTO) or a closed connection
 * (-ECONNRESET), leaves the client unusable: later calls return -ENOTCONN. A wait that times out
 * is cancelled on the server and leaves the client usable.
 *
 * SET, APPEND and MULTI_SET have no reply: another client is sure to see the change once this
 * client has completed any later call that has one (rdzv_ping(), say).
 *
 * Keys are NUL-terminated strings; the client's prefix is prepended. Values are byte buffers.
 */

/* Stores `value` (`nbytes`, may be 0) under `key`. Returns 0 or a negative errno. */
int rdzv_set(rdzv_client *c, const char *key, const void *value, size_t nbytes);

/*
 * Waits (up to the client's timeout) until `key` exists, then returns its value in *value
 * (allocated, NUL-terminated for convenience, free with rdzv_free()) and its length in *nbytes.
 * Returns 0, -ETIMEDOUT if the key did not appear in time, or another negative errno.
 */
int rdzv_get(rdzv_client *c, const char *key, void **value, size_t *nbytes);

/*
 * Adds `delta` to the decimal integer stored under `key` (a missing key counts as 0) and
 * returns the new value in *result. Returns 0 or a negative errno; -ECONNRESET if the stored
 * value is not a decimal integer (the server drops the connection, as PyTorch's does).
 */
int rdzv_add(rdzv_client *c, const char *key, int64_t delta, int64_t *result);

/*
 * Atomically replaces the value of `key` with `desired` if it currently equals `expected`
 * (a missing key matches an empty `expected`). *value receives what the store answered, with
 * PyTorch's semantics: the new value on success, the current value on mismatch, and `expected`
 * itself when the key is missing and `expected` is not empty. Free *value with rdzv_free().
 */
int rdzv_compare_set(rdzv_client *c, const char *key, const void *expected, size_t expected_nbytes,
                     const void *desired, size_t desired_nbytes, void **value, size_t *nbytes);

/* Returns 1 if every one of the `nkeys` keys exists, 0 if not, or a negative errno. */
int rdzv_check(rdzv_client *c, const char *const *keys, size_t nkeys);

/*
 * Waits until every one of the `nkeys` keys exists. timeout_ms < 0 uses the client's timeout.
 * Returns 0, -ETIMEDOUT (the client stays usable), or another negative errno.
 */
int rdzv_wait(rdzv_client *c, const char *const *keys, size_t nkeys, int timeout_ms);

/* Deletes `key`. Returns 1 if it existed, 0 if not, or a negative errno. */
int rdzv_delete(rdzv_client *c, const char *key);

/* Sets *count to the number of keys in the store (all prefixes). Returns 0 or a negative errno. */
int rdzv_num_keys(rdzv_client *c, int64_t *count);

/*
 * Lists the keys that hold a value under the client's prefix, the prefix cut off (all keys
 * without a prefix), in no particular order (LIST_KEYS, a recent addition to PyTorch's protocol;
 * servers without it close the connection). *keys receives an array of *nkeys + 1 pointers (the
 * last NULL) followed by the strings, in one allocation: free it with one rdzv_free(). Keys holding
 * a NUL byte are left out. Returns 0 or a negative errno.
 */
int rdzv_list_keys(rdzv_client *c, char ***keys, size_t *nkeys);

/* Appends `value` to the value of `key` (creating it). Returns 0 or a negative errno. */
int rdzv_append(rdzv_client *c, const char *key, const void *value, size_t nbytes);

/*
 * Fetches `nkeys` keys in one round trip, without waiting; a missing key yields an empty value.
 * values[i] (allocated, free each with rdzv_free()) and nbytes[i] receive the answers; both arrays
 * are the caller's, with room for nkeys entries. Returns 0 or a negative errno (then nothing
 * is allocated).
 */
int rdzv_multi_get(rdzv_client *c, const char *const *keys, size_t nkeys, void **values,
                   size_t *nbytes);

/* Stores `nkeys` key/value pairs in one request. Returns 0 or a negative errno. */
int rdzv_multi_set(rdzv_client *c, const char *const *keys, const void *const *values,
                   const size_t *nbytes, size_t nkeys);

/* Round trip with the server (PING). Returns 0 or a negative errno. */
int rdzv_ping(rdzv_client *c);

/*
 * Fetches the server's status (see rdzv_server_status()) into *json (free with rdzv_free()).
 * This is a librendezvous extension; PyTorch's server does not answer it (-ECONNRESET or
 * -ETIMEDOUT). Returns 0 or a negative errno.
 */
int rdzv_status(rdzv_client *c, char **json);

/*
 * A reusable barrier: returns 0 once `world_size` callers (all using the same `name` and
 * `world_size`) have entered the same round of it. A name serves any number of rounds, one after
 * another; callers that arrive once a round has completed join the next. After timeout_ms (< 0:
 * the client's timeout) the caller withdraws its arrival and gets -ETIMEDOUT, so a retry is a
 * new arrival and a lone caller never passes; a caller killed while waiting stays counted. A
 * round under way for another world size answers -EINVAL at once (client usable). An arrival
 * costs three requests (COMPARE_SET, ADD, WAIT) in two round trips, however many callers arrive
 * at once. Keys, under the client's prefix: "<name>/state", "<name>/count/<epoch>/<world>" and
 * "<name>/done/<round>" (see librendezvous(3), Barriers). Call on all participating ranks.
 * Returns 0, -ETIMEDOUT, -EINVAL, -EPROTO (a key of the barrier was changed by hand; the client
 * stays usable) or another negative errno.
 */
int rdzv_barrier(rdzv_client *c, const char *name, int world_size, int timeout_ms);

/* ------------------------------------------------------------------------------------------ */
/* Store helpers: the exchanges every component runs through the store                         */
/* ------------------------------------------------------------------------------------------ */

/*
 * Builds the `n` keys "<prefix>/0" ... "<prefix>/<n-1>" (per-rank key arrays) in one allocation:
 * *keys receives an array of n + 1 pointers (the last NULL) followed by the strings; free it
 * with one rdzv_free(). `prefix` is borrowed. Returns 0 and sets *keys, -EINVAL (NULL argument
 * or n < 0) or -ENOMEM. Thread-safe; does no I/O.
 */
int rdzv_rank_keys(const char *prefix, int n, char ***keys);

/*
 * Stores `value` (nbytes >= 1) under `key` unless the key exists already: the first writer
 * wins, later writers learn what it wrote. Built on COMPARE_SET, so it is atomic on the server.
 * If `stored` is not NULL it receives the value the store holds after the call (allocated, free
 * with rdzv_free()) and *stored_nbytes its length. Returns 1 if the store now holds `value`
 * (this caller won, or an earlier writer stored the same bytes), 0 if it holds another value,
 * -EINVAL (NULL argument, or nbytes == 0: an empty value cannot be told from a missing key), or
 * another negative errno from the store.
 */
int rdzv_set_once(rdzv_client *c, const char *key, const void *value, size_t nbytes, void **stored,
                  size_t *stored_nbytes);

/*
 * Waits up to timeout_ms for `key` to exist, then GETs it: the wait for one key that someone else
 * publishes (a leader's address, a failure record) under a bound of the caller's rather than the
 * client's timeout. timeout_ms < 0 waits the client's timeout; 0 does not wait but looks once
 * (a CHECK). On success *value receives the value (allocated, NUL-terminated for convenience,
 * free with rdzv_free()) and *nbytes its length. `key` is borrowed. Returns 0, -ETIMEDOUT (the
 * key did not appear in time; the client stays usable and rdzv_client_last_error(c) names the
 * wait, the key and the bound, as in "wait 'job/leader': the key did not appear within 2000
 * ms"), -EINVAL (NULL argument), or another negative errno from the store.
 */
int rdzv_wait_get(rdzv_client *c, const char *key, int timeout_ms, void **value, size_t *nbytes);

/*
 * All-gather over the store. Rank `rank` of `world` publishes `value` (nbytes >= 1) under
 * "<prefix>/<rank>", waits until every rank has published under the same prefix, and fetches
 * all of them in one MULTI_GET: values[i] (allocated, free each with rdzv_free()) and nbytes[i]
 * receive rank i's value; both arrays are the caller's, with room for `world` entries, and are
 * written only on success. Call on every rank with the same prefix and world; a prefix serves
 * one exchange (use a new one, such as a round number in it, for the next).
 *
 * timeout_ms bounds the wait for the other ranks (< 0: the client's timeout). On -ETIMEDOUT
 * rdzv_client_last_error(c) names the missing ranks ("ranks 3, 5 did not publish <prefix>
 * within 2000 ms (6 of 8 present)") and, if `missing` is not NULL
 * (an array of `world` entries), missing[i] is set to true for each rank that had not published
 * and to false for the others (the one exception to "out-parameters only on success"). Returns 0,
 * -EINVAL (NULL argument, world < 1, rank outside [0, world), nbytes == 0), -ENOMEM,
 * -ETIMEDOUT, or another negative errno from the store.
 */
int rdzv_allgather(rdzv_client *c, const char *prefix, int rank, int world, const void *value,
                   size_t nbytes, int timeout_ms, void **values, size_t *nbytes_out,
                   bool *missing);

/*
 * The gathering half of rdzv_allgather(), for ranks that published under "<prefix>/<rank>"
 * earlier (or that only read): waits up to timeout_ms (< 0: the client's timeout) until the `n`
 * keys "<prefix>/0" ... "<prefix>/<n-1>" exist and fetches them in one MULTI_GET into values[]
 * and nbytes[] (the caller's arrays of n entries; free each value with rdzv_free()). On
 * -ETIMEDOUT the arrays hold what had been published (values[i] NULL and nbytes[i] == 0 for a
 * missing rank; free the values as on success; the missing keys are found with one CHECK each,
 * since a store need not answer MULTI_GET for missing keys), `missing` (if not NULL, n entries)
 * flags the missing ranks and rdzv_client_last_error(c) names them as rdzv_allgather() does.
 * Returns 0, -EINVAL, -ENOMEM, -ETIMEDOUT, or another negative errno from the store (then nothing
 * is allocated).
 */
int rdzv_gather(rdzv_client *c, const char *prefix, int n, int timeout_ms, void **values,
                size_t *nbytes, bool *missing);

/* ------------------------------------------------------------------------------------------ */
/* The torchrun environment                                                                    */
/* ------------------------------------------------------------------------------------------ */

/*
 * What torchrun (and ddprun) tells a worker through its environment. Read by rdzv_env_read().
 */
typedef struct rdzv_env {
    int rank;              /* RANK */
    int local_rank;        /* LOCAL_RANK (0 when unset) */
    int world_size;        /* WORLD_SIZE */
    int local_world_size;  /* LOCAL_WORLD_SIZE (world_size when unset) */
    int group_rank;        /* GROUP_RANK, the node rank (0 when unset) */
    int restart_count;     /* TORCHELASTIC_RESTART_COUNT (0 when unset) */
    char master_addr[256]; /* MASTER_ADDR */
    int master_port;       /* MASTER_PORT */
    char run_id[128];      /* TORCHELASTIC_RUN_ID ("none" when unset) */
    bool standalone;       /* none of RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT was set and
                              the fields describe a job of one (rank 0 of 1, no store address) */
    char token[RDZV_TOKEN_MAX_BYTES + 1]; /* RDZV_TOKEN_ENV (DDPRUN_STORE_TOKEN): the job's
                              secret, which ddprun gives its workers; "" when unset */
} rdzv_env;

/*
 * Reads the torchrun environment into *env. RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are
 * required together; with none of them set the call succeeds with env->standalone true (a job
 * of one) and leaves in rdzv_client_last_error(NULL) the sentence a program that needs a job
 * prints as it is: "none of RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT is set (run under
 * ddprun or torchrun)". Integers must be decimal, in range (0 <= RANK < WORLD_SIZE,
 * 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE, 0 < MASTER_PORT < 65536). Returns 0 and fills *env, or
 * -EINVAL with rdzv_client_last_error(NULL) naming the missing or malformed variable and its
 * value (for example "WORLD_SIZE=abc is not an integer" or "RANK is set but MASTER_PORT is not
 * (run under ddprun or torchrun)"). RDZV_TOKEN_ENV, when set, must be a valid token
 * (rdzv_token_check()); the message about a bad one never quotes it. Thread-safe (reads the
 * environment only).
 */
int rdzv_env_read(rdzv_env *env);

/*
 * Writes the per-attempt key prefix "<name>/<run_id>/<restart_count>" into buf (cap bytes):
 * the keys of a restarted attempt never meet a failed attempt's. Returns 0, -EINVAL or -ENOSPC.
 */
int rdzv_env_prefix(const rdzv_env *env, const char *name, char *buf, size_t cap);

/*
 * Connects a client to the store at env->master_addr:env->master_port (rdzv_client_connect(),
 * same options, codes and errors), authenticating with env->token when it is set and opts
 * names no token of its own. -EINVAL for a standalone environment, which has no store.
 */
int rdzv_env_connect(const rdzv_env *env, const rdzv_client_options *opts, rdzv_client **out);

/*
 * A worker's account of its failure, where torchrun and ddprun read it: the file named by
 * TORCHELASTIC_ERROR_FILE gets PyTorch's @record format, {"message": {"message": MESSAGE,
 * "extraInfo": {"py_callstack": "", "timestamp": "<seconds since the epoch>"}}}, replacing
 * what was there, so that the launcher's failure summary shows MESSAGE's first line. For a
 * program about to exit with a failure. `message` is borrowed. Returns 1 (written), 0
 * (TORCHELASTIC_ERROR_FILE unset or empty: no launcher reads one), -EINVAL (message NULL or
 * not UTF-8), -ENOMEM, or the negative errno of creating or writing the file. Thread-safe,
 * but concurrent calls write the same file.
 */
int rdzv_env_record_error(const char *message);

#ifdef __cplusplus
}
#endif

#endif /* RDZV_H */
