/*
 * The etcd v3 client of etcd.h, over etcd's JSON gateway: every call is one HTTP/1.1 POST of a
 * JSON body on the client's one libcurl easy handle (which keeps the connection between calls),
 * with keys and values base64-encoded (Nettle's base64 codec) and every JSON
 * byte built and read by jansson. The gateway writes 64-bit numbers as JSON strings and leaves out
 * fields that are zero, false or empty; jint() and the parsers below read both forms.
 *
 * The watch is the one streamed call: /v3/watch answers with one JSON message per line (the watch
 * created, then events) for as long as the connection stays; the write callback parses each line
 * as it arrives and stops the transfer at the first event, and curl's transfer timeout is the
 * deadline, so nothing polls.
 *
 * Invariants: e->cur is the member that answered last and every call starts there; a member is
 * passed over only when no connection to it could be made (exchange()); each failing call writes
 * e->err once, successful calls clear it. Nothing here prints, exits or keeps state between calls
 * but the connection and e->cur.
 */
#include "etcd.h"

/* libcurl is loaded when the first client is made (curl_load()), not linked: ddprun and its
 * helpers start without its dozens of libraries unless a job uses etcd. */
#define CURL_DISABLE_TYPECHECK
#include <curl/curl.h>
#include <dlfcn.h>
#include <jansson.h>
#include <nettle/base64.h>

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "monoclock.h"

#define MAX_REPLY_BYTES ((size_t)64 << 20) /* larger answers are refused (-EPROTO) */
#define ENDPOINT_BYTES 300                 /* "host:port" of one member, NUL included */

struct ddprun_etcd {
    CURL *curl;
    struct curl_slist *headers;
    int nendpoints;
    char (*endpoints)[ENDPOINT_BYTES];
    int cur;      /* member that answered last */
    bool probing; /* creating: any transport failure passes to the next member */
    int timeout_ms;
    int protocol;
    char *cacert, *cert, *key;
    char curl_err[CURL_ERROR_SIZE];
    char local_ip[64]; /* this end of the last answered request ("" before any) */
    errbuf err;
};

static _Thread_local errbuf create_error;

/* The libcurl functions used here, from dlopen("libcurl.so.4") (its soname since 7.16). */
static struct {
    CURLcode (*global_init)(long flags);
    CURL *(*easy_init)(void);
    void (*easy_cleanup)(CURL *c);
    void (*easy_reset)(CURL *c);
    CURLcode (*easy_setopt)(CURL *c, CURLoption option, ...);
    CURLcode (*easy_perform)(CURL *c);
    CURLcode (*easy_getinfo)(CURL *c, CURLINFO info, ...);
    const char *(*easy_strerror)(CURLcode code);
    struct curl_slist *(*slist_append)(struct curl_slist *list, const char *s);
    void (*slist_free_all)(struct curl_slist *list);
} lib;
#define curl_global_init lib.global_init
#define curl_easy_init lib.easy_init
#define curl_easy_cleanup lib.easy_cleanup
#define curl_easy_reset lib.easy_reset
#undef curl_easy_setopt /* curl.h may define both as macros */
#undef curl_easy_getinfo
#define curl_easy_setopt lib.easy_setopt
#define curl_easy_perform lib.easy_perform
#define curl_easy_getinfo lib.easy_getinfo
#define curl_easy_strerror lib.easy_strerror
#define curl_slist_append lib.slist_append
#define curl_slist_free_all lib.slist_free_all

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static char curl_load_error[256]; /* why libcurl could not be loaded; "" once it is */

/* Loads libcurl and initialises it, once per process (pthread_once). */
static void curl_load(void)
{
    void *h = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(curl_load_error, sizeof curl_load_error, "cannot load libcurl: %s", dlerror());
        return;
    }
    static const struct {
        const char *name;
        size_t offset;
    } syms[] = {
#define SYM(f, n) {n, offsetof(__typeof__(lib), f)}
        SYM(global_init, "curl_global_init"),   SYM(easy_init, "curl_easy_init"),
        SYM(easy_cleanup, "curl_easy_cleanup"), SYM(easy_reset, "curl_easy_reset"),
        SYM(easy_setopt, "curl_easy_setopt"),   SYM(easy_perform, "curl_easy_perform"),
        SYM(easy_getinfo, "curl_easy_getinfo"), SYM(easy_strerror, "curl_easy_strerror"),
        SYM(slist_append, "curl_slist_append"), SYM(slist_free_all, "curl_slist_free_all"),
#undef SYM
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        void *f = dlsym(h, syms[i].name);
        if (!f) {
            snprintf(curl_load_error, sizeof curl_load_error, "libcurl lacks %s", syms[i].name);
            return;
        }
        memcpy((char *)&lib + syms[i].offset, &f, sizeof f);
    }
    CURLcode rc = lib.global_init(CURL_GLOBAL_DEFAULT);
    if (rc != CURLE_OK)
        snprintf(curl_load_error, sizeof curl_load_error, "libcurl: %s", lib.easy_strerror(rc));
}

void ddprun_etcd_options_init(ddprun_etcd_options *o)
{
    memset(o, 0, sizeof *o);
    o->timeout_ms = 5000;
    o->protocol = DDPRUN_ETCD_HTTP;
}

const char *ddprun_etcd_last_error(const ddprun_etcd *e)
{
    return e ? e->err.msg : create_error.msg;
}

const char *ddprun_etcd_endpoint(const ddprun_etcd *e)
{
    return e ? e->endpoints[e->cur] : "";
}

const char *ddprun_etcd_local_address(const ddprun_etcd *e)
{
    return e ? e->local_ip : "";
}

/* ------------------------------------------------------------------------------------------ */
/* Base64 and JSON pieces                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* n bytes as a JSON string of their base64, or NULL (out of memory). */
static json_t *b64_json(const void *p, size_t n)
{
    if (n > (size_t)INT_MAX / 4 * 3 - 3)
        return NULL;
    char *s = malloc(BASE64_ENCODE_RAW_LENGTH(n) + 1);
    if (!s)
        return NULL;
    base64_encode_raw(s, n, p);
    s[BASE64_ENCODE_RAW_LENGTH(n)] = '\0';
    json_t *j = json_string(s);
    free(s);
    return j;
}

/*
 * Decodes base64 text s (NULL or "": empty) into a new NUL-terminated buffer; *n its length.
 * Returns 0, -EPROTO (not base64) or -ENOMEM.
 */
static int b64_decode(const char *s, char **out, size_t *n)
{
    size_t len = s ? strlen(s) : 0;
    if (len % 4 || len > INT_MAX)
        return -EPROTO;
    size_t got = BASE64_DECODE_LENGTH(len);
    uint8_t *d = malloc(got + 1);
    if (!d)
        return -ENOMEM;
    struct base64_decode_ctx ctx;
    base64_decode_init(&ctx);
    if (!base64_decode_update(&ctx, &got, d, len, s ? s : "") || !base64_decode_final(&ctx)) {
        free(d);
        return -EPROTO;
    }
    d[got] = '\0';
    *out = (char *)d;
    *n = got;
    return 0;
}

/* A 64-bit field that the gateway writes as a string or a number; 0 when absent or malformed. */
static int64_t jint(const json_t *o, const char *name)
{
    const json_t *v = json_object_get(o, name);
    if (json_is_integer(v))
        return (int64_t)json_integer_value(v);
    if (json_is_string(v)) {
        char *end;
        errno = 0;
        long long x = strtoll(json_string_value(v), &end, 10);
        if (!errno && *end == '\0')
            return (int64_t)x;
    }
    return 0;
}

/*
 * The end of the range of keys starting with prefix: prefix with its last byte below 0xff
 * increased and what follows dropped; "\0" (every key) for a prefix of 0xff bytes or "".
 */
static json_t *range_end_json(const char *prefix)
{
    size_t n = strlen(prefix);
    char *end = malloc(n + 1);
    if (!end)
        return NULL;
    memcpy(end, prefix, n);
    while (n && (unsigned char)end[n - 1] == 0xff)
        n--;
    json_t *j;
    if (n == 0) {
        j = b64_json("", 1);
    } else {
        end[n - 1] = (char)((unsigned char)end[n - 1] + 1);
        j = b64_json(end, n);
    }
    free(end);
    return j;
}

/* Sets o[name] to value, taking the reference; false when value is NULL (out of memory). */
static bool jset(json_t *o, const char *name, json_t *value)
{
    return value && json_object_set_new(o, name, value) == 0;
}

/* {"key": b64(key)} plus "range_end" for a prefix; NULL when out of memory. */
static json_t *key_json(const char *key, bool prefix)
{
    json_t *o = json_object();
    if (!o || !jset(o, "key", b64_json(key, strlen(key))) ||
        (prefix && !jset(o, "range_end", range_end_json(key)))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Fills *kv from a gateway KeyValue object. Returns 0, -EPROTO or -ENOMEM. */
static int kv_from_json(const json_t *j, ddprun_etcd_kv *kv)
{
    memset(kv, 0, sizeof *kv);
    size_t klen;
    if (!json_is_object(j) || !json_is_string(json_object_get(j, "key")))
        return -EPROTO;
    int rc = b64_decode(json_string_value(json_object_get(j, "key")), &kv->key, &klen);
    if (rc == 0)
        rc = b64_decode(json_string_value(json_object_get(j, "value")), &kv->value, &kv->value_len);
    if (rc < 0) {
        free(kv->key);
        memset(kv, 0, sizeof *kv);
        return rc;
    }
    kv->create_revision = jint(j, "create_revision");
    kv->mod_revision = jint(j, "mod_revision");
    kv->version = jint(j, "version");
    kv->lease = jint(j, "lease");
    return 0;
}

void ddprun_etcd_kvs_free(ddprun_etcd_kv *kvs, size_t count)
{
    if (!kvs)
        return;
    for (size_t i = 0; i < count; i++) {
        free(kvs[i].key);
        free(kvs[i].value);
    }
    free(kvs);
}

void ddprun_etcd_event_clear(ddprun_etcd_event *ev)
{
    if (!ev)
        return;
    free(ev->kv.key);
    free(ev->kv.value);
    memset(ev, 0, sizeof *ev);
}

/* ------------------------------------------------------------------------------------------ */
/* Transport                                                                                   */
/* ------------------------------------------------------------------------------------------ */

static int fail(ddprun_etcd *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(ddprun_etcd *e, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    errbuf_vset(&e->err, code, fmt, ap);
    va_end(ap);
    return code;
}

/* An answer collected in memory. */
typedef struct reply_buf {
    char *data;
    size_t len, cap;
    bool too_big; /* past MAX_REPLY_BYTES, or out of memory (oom set too) */
    bool oom;
} reply_buf;

static size_t collect(char *p, size_t size, size_t nmemb, void *arg)
{
    reply_buf *b = arg;
    size_t n = size * nmemb;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *d = cap <= MAX_REPLY_BYTES ? realloc(b->data, cap) : NULL;
        if (!d) {
            b->too_big = true;
            b->oom = cap <= MAX_REPLY_BYTES;
            return 0;
        }
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return n;
}

/* The transport failure of a transfer that reached a member, as an errno value. */
static int curl_errno(CURLcode res)
{
    switch (res) {
    case CURLE_OUT_OF_MEMORY:
        return -ENOMEM;
    case CURLE_OPERATION_TIMEDOUT:
        return -ETIMEDOUT;
    case CURLE_COULDNT_CONNECT:
        return -ECONNREFUSED;
    case CURLE_COULDNT_RESOLVE_HOST:
        return -EHOSTUNREACH;
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
        return -ECONNRESET;
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
        return -EACCES;
    default:
        return -EPROTO;
    }
}

/*
 * Which of the failures met on several members a call reports: TLS refused above all, then (the
 * last of) those after a connection was made, then a refusal, then a name that did not resolve.
 */
static int told_rank(int code)
{
    return code == -EACCES ? 3 : code == -ECONNREFUSED ? 1 : code == -EHOSTUNREACH ? 0 : 2;
}

/*
 * Posts `len` bytes of `data` to `path` (timeout_ms for the whole transfer) and hands the answer
 * to cb(arg), starting at member e->cur and moving on, in list order, past members no connection
 * could be made to (past any member that did not answer, while the client is being created). On
 * an answer, e->cur is the member that gave it and *status its HTTP status;
 * after a reset, or a timeout of a unary call (timeout_ms the client's), e->cur is the next one.
 * A transfer that cb stopped (CURLE_WRITE_ERROR) counts as answered: cb's arg says why.
 * Returns 0 or a negative errno with e->err set.
 */
static int exchange(ddprun_etcd *e, const char *path, const char *data, size_t len, int timeout_ms,
                    curl_write_callback cb, void *arg, long *status)
{
    char tried[ERRBUF_BYTES] = "";
    size_t tlen = 0;
    int64_t t0 = mono_now_ns();
    int rc = -EHOSTUNREACH; /* the failure to tell, by told_rank() */

    for (int k = 0; k < e->nendpoints; k++) {
        int idx = (e->cur + k) % e->nendpoints;
        char url[ENDPOINT_BYTES + 64];
        snprintf(url, sizeof url, "%s://%s%s", e->protocol == DDPRUN_ETCD_HTTPS ? "https" : "http",
                 e->endpoints[idx], path);
        CURL *c = e->curl;
        curl_easy_reset(c);
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(c, CURLOPT_ERRORBUFFER, e->curl_err);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, e->headers);
        curl_easy_setopt(c, CURLOPT_POST, 1L);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, data);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
        curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(timeout_ms > 0 ? timeout_ms : 1));
        curl_easy_setopt(
            c, CURLOPT_CONNECTTIMEOUT_MS,
            (long)(timeout_ms < e->timeout_ms && timeout_ms > 0 ? timeout_ms : e->timeout_ms));
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, cb);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, arg);
        if (e->cacert)
            curl_easy_setopt(c, CURLOPT_CAINFO, e->cacert);
        if (e->cert)
            curl_easy_setopt(c, CURLOPT_SSLCERT, e->cert);
        if (e->key)
            curl_easy_setopt(c, CURLOPT_SSLKEY, e->key);
        e->curl_err[0] = '\0';

        int64_t t1 = mono_now_ns();
        CURLcode res = curl_easy_perform(c);
        double took_s = (double)(mono_now_ns() - t1) / 1e9;
        curl_off_t connect_us = 0;
        curl_easy_getinfo(c, CURLINFO_CONNECT_TIME_T, &connect_us);
        if (res == CURLE_OK || res == CURLE_WRITE_ERROR) {
            curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
            char *ip = NULL;
            if (curl_easy_getinfo(c, CURLINFO_LOCAL_IP, &ip) == CURLE_OK && ip)
                snprintf(e->local_ip, sizeof e->local_ip, "%s", ip);
            e->cur = idx;
            return 0;
        }
        const char *why = e->curl_err[0] ? e->curl_err : curl_easy_strerror(res);
        int code = curl_errno(res);
        char why_tls[CURL_ERROR_SIZE + 128];
        if (code == -ECONNRESET && e->protocol == DDPRUN_ETCD_HTTPS && !e->cert) {
            /* TLS 1.3 refuses a missing client certificate after the handshake, with no more
             * than a closed connection to show for it. */
            snprintf(why_tls, sizeof why_tls,
                     "%s; no client certificate was given, and the member may require one", why);
            why = why_tls;
            code = -EACCES;
        } else if (res == CURLE_GOT_NOTHING && e->protocol == DDPRUN_ETCD_HTTP) {
            snprintf(why_tls, sizeof why_tls, "%s; the member may expect https", why);
            why = why_tls;
        }
        /* A connection kept from an earlier call made no new one (NUM_CONNECTS 0) and has no
         * connect time: it was reached all the same. */
        long nconnects = 0;
        curl_easy_getinfo(c, CURLINFO_NUM_CONNECTS, &nconnects);
        bool unreachable = e->probing || res == CURLE_COULDNT_CONNECT ||
                           res == CURLE_COULDNT_RESOLVE_HOST ||
                           (res == CURLE_OPERATION_TIMEDOUT && connect_us == 0 && nconnects > 0);
        if (!unreachable) {
            /* The outcome is unknown; the member may be going away, so the next call starts at
             * the next one. A watch's own deadline is no fault of the member's. */
            rc = code;
            if (rc == -ECONNRESET || (rc == -ETIMEDOUT && timeout_ms == e->timeout_ms))
                e->cur = (idx + 1) % e->nendpoints;
            return fail(e, rc, "etcd at %s: %s", e->endpoints[idx], why);
        }
        if (told_rank(code) >= told_rank(rc))
            rc = code;
        if (tlen < sizeof tried) {
            int w = snprintf(tried + tlen, sizeof tried - tlen, "%s%s (%s, %.1f s)", k ? ", " : "",
                             e->endpoints[idx], why, took_s);
            tlen += w > 0 ? (size_t)w : 0;
        }
    }
    return fail(e, rc, "no etcd member answered in %.1f s: %s", (double)(mono_now_ns() - t0) / 1e9,
                tried);
}

/* gRPC's status codes in the gateway's error answers, as errno values. */
static int grpc_errno(int64_t code)
{
    switch (code) {
    case 3: /* INVALID_ARGUMENT */
        return -EINVAL;
    case 4: /* DEADLINE_EXCEEDED */
        return -ETIMEDOUT;
    case 5: /* NOT_FOUND */
        return -ENOENT;
    case 7:  /* PERMISSION_DENIED */
    case 16: /* UNAUTHENTICATED */
        return -EACCES;
    case 8:  /* RESOURCE_EXHAUSTED */
    case 14: /* UNAVAILABLE */
        return -EAGAIN;
    case 11: /* OUT_OF_RANGE: a compacted revision */
        return -ESTALE;
    default:
        return -EPROTO;
    }
}

/* Fails with the error an answer carries: {"error": "...", "code": N, "message": "..."}. */
static int fail_answer(ddprun_etcd *e, const char *what, long status, const json_t *j,
                       const char *text)
{
    const json_t *err = json_object_get(j, "error");
    if (json_is_object(err)) /* streamed calls nest it */
        j = err;
    const char *msg = json_string_value(json_object_get(j, "message"));
    if (!msg)
        msg = json_string_value(json_object_get(j, "error"));
    if (msg)
        return fail(e, grpc_errno(jint(j, "code")), "etcd at %s: %s: %s", e->endpoints[e->cur],
                    what, msg);
    return fail(e, -EPROTO, "etcd at %s: %s: HTTP status %ld, not etcd's answer: '%.80s'",
                e->endpoints[e->cur], what, status, text ? text : "");
}

/*
 * One unary call: posts `body` (taken: released here; NULL means out of memory while building
 * it) to `path` and, on an HTTP 200 with a JSON object, gives it in *reply (the caller's
 * reference). `what` names the call in error sentences ("put '/a/b'"). Returns 0 or a negative
 * errno with e->err set.
 */
static int call(ddprun_etcd *e, const char *what, const char *path, json_t *body, json_t **reply)
{
    reply_buf b = {0};
    json_t *j = NULL;
    char *data = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!data)
        return fail(e, -ENOMEM, "%s: out of memory", what);
    long status = 0;
    int rc = exchange(e, path, data, strlen(data), e->timeout_ms, collect, &b, &status);
    free(data);
    if (rc < 0)
        goto out;
    if (b.too_big) {
        rc = b.oom ? fail(e, -ENOMEM, "%s: out of memory", what)
                   : fail(e, -EPROTO, "etcd at %s: %s: an answer over %zu bytes",
                          e->endpoints[e->cur], what, MAX_REPLY_BYTES);
        goto out;
    }
    json_error_t jerr;
    j = b.data ? json_loadb(b.data, b.len, 0, &jerr) : NULL;
    if (status != 200 || !json_is_object(j)) {
        rc = fail_answer(e, what, status, j, b.data);
        goto out;
    }
    *reply = j;
    j = NULL;
    errbuf_clear(&e->err);
out:
    json_decref(j);
    free(b.data);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Creation                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/*
 * Normalises one member of an endpoint list (s, n bytes, trimmed) into dst as "host:port":
 * a missing port becomes DDPRUN_ETCD_DEFAULT_PORT and a bare IPv6 address is bracketed.
 * Returns 0 or -EINVAL.
 */
static int endpoint_norm(const char *s, size_t n, char *dst)
{
    const char *port = NULL;
    size_t hlen = n;
    if (n == 0 || n >= ENDPOINT_BYTES - 16 || memchr(s, '/', n) || memchr(s, '@', n) ||
        memchr(s, ' ', n) || memchr(s, '\t', n))
        return -EINVAL;
    const char *last_colon = NULL;
    int colons = 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] == ':')
            last_colon = s + i, colons++;
    if (s[0] == '[') {
        const char *close = memchr(s, ']', n);
        if (!close || close == s + 1)
            return -EINVAL;
        hlen = (size_t)(close - s) + 1;
        if (hlen < n) {
            if (s[hlen] != ':')
                return -EINVAL;
            port = s + hlen + 1;
        }
    } else if (colons == 1) {
        hlen = (size_t)(last_colon - s);
        port = last_colon + 1;
    }
    if (hlen == 0)
        return -EINVAL;
    long p = DDPRUN_ETCD_DEFAULT_PORT;
    if (port) {
        size_t plen = n - (size_t)(port - s);
        char buf[8];
        if (plen < 1 || plen > 5 || strspn(port, "0123456789") < plen)
            return -EINVAL;
        memcpy(buf, port, plen);
        buf[plen] = '\0';
        p = strtol(buf, NULL, 10);
        if (p < 1 || p > 65535)
            return -EINVAL;
    }
    bool bare6 = s[0] != '[' && memchr(s, ':', hlen);
    snprintf(dst, ENDPOINT_BYTES, "%s%.*s%s:%ld", bare6 ? "[" : "", (int)hlen, s, bare6 ? "]" : "",
             p);
    return 0;
}

static int parse_endpoints(ddprun_etcd *e, const char *list)
{
    int n = 1;
    for (const char *p = list; *p; p++)
        n += *p == ',';
    if (n > DDPRUN_ETCD_MAX_ENDPOINTS)
        return fail(e, -EINVAL, "etcd endpoints '%.200s': more than %d members", list,
                    DDPRUN_ETCD_MAX_ENDPOINTS);
    e->endpoints = calloc((size_t)n, sizeof *e->endpoints);
    if (!e->endpoints)
        return fail(e, -ENOMEM, "etcd endpoints: out of memory");
    const char *p = list;
    for (int i = 0; i < n; i++) {
        size_t len = strcspn(p, ",");
        const char *s = p;
        size_t m = len;
        while (m && (*s == ' ' || *s == '\t'))
            s++, m--;
        while (m && (s[m - 1] == ' ' || s[m - 1] == '\t'))
            m--;
        if (endpoint_norm(s, m, e->endpoints[i]) < 0)
            return fail(e, -EINVAL,
                        "etcd endpoints '%.200s': member %d ('%.*s') is not HOST[:PORT] with a "
                        "port from 1 to 65535",
                        list, i + 1, (int)(m < 100 ? m : 100), s);
        p += len + 1;
    }
    e->nendpoints = n;
    return 0;
}

static int dup_path(ddprun_etcd *e, const char *src, char **dst)
{
    if (!src)
        return 0;
    *dst = strdup(src);
    return *dst ? 0 : fail(e, -ENOMEM, "etcd options: out of memory");
}

int ddprun_etcd_create(const char *endpoints, const ddprun_etcd_options *o, ddprun_etcd **out)
{
    ddprun_etcd_options defaults;
    if (!o) {
        ddprun_etcd_options_init(&defaults);
        o = &defaults;
    }
    if (!endpoints || !out)
        return errbuf_set(&create_error, -EINVAL, "etcd: no endpoint list");
    if (o->timeout_ms <= 0)
        return errbuf_set(&create_error, -EINVAL, "etcd timeout: %d ms is not above 0",
                          o->timeout_ms);
    if (o->protocol != DDPRUN_ETCD_HTTP && o->protocol != DDPRUN_ETCD_HTTPS)
        return errbuf_set(&create_error, -EINVAL, "etcd protocol: %d is neither http nor https",
                          o->protocol);
    if (o->key && !o->cert)
        return errbuf_set(&create_error, -EINVAL, "etcd key '%s' given without a certificate",
                          o->key);
    pthread_once(&curl_once, curl_load);
    if (curl_load_error[0])
        return errbuf_set(&create_error, -ENOSYS, "etcd: %s", curl_load_error);

    json_t *status = NULL;
    ddprun_etcd *e = calloc(1, sizeof *e);
    if (!e)
        return errbuf_set(&create_error, -ENOMEM, "etcd: out of memory");
    e->timeout_ms = o->timeout_ms;
    e->protocol = o->protocol;
    int rc = parse_endpoints(e, endpoints);
    if (rc == 0)
        rc = dup_path(e, o->cacert, &e->cacert);
    if (rc == 0)
        rc = dup_path(e, o->cert, &e->cert);
    if (rc == 0)
        rc = dup_path(e, o->key, &e->key);
    if (rc < 0)
        goto out;
    e->curl = curl_easy_init();
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    e->headers = h ? curl_slist_append(h, "Expect:") : NULL; /* no 100-continue round trip */
    if (!e->headers)
        curl_slist_free_all(h);
    if (!e->curl || !e->headers) {
        rc = fail(e, -ENOMEM, "etcd: out of memory");
        goto out;
    }
    /* A member that answers /v3/maintenance/status with a version is etcd's gateway. */
    e->probing = true;
    rc = call(e, "status", "/v3/maintenance/status", json_object(), &status);
    e->probing = false;
    if (rc == 0 && !json_is_string(json_object_get(status, "version")))
        rc = fail(e, -EPROTO, "etcd at %s: the status answer has no version: not etcd",
                  e->endpoints[e->cur]);
out:
    json_decref(status);
    if (rc < 0) {
        errbuf_set(&create_error, rc, "%s", e->err.msg);
        ddprun_etcd_close(e);
        return rc;
    }
    errbuf_clear(&e->err);
    *out = e;
    return 0;
}

void ddprun_etcd_close(ddprun_etcd *e)
{
    if (!e)
        return;
    if (e->curl)
        curl_easy_cleanup(e->curl);
    curl_slist_free_all(e->headers);
    free(e->endpoints);
    free(e->cacert);
    free(e->cert);
    free(e->key);
    free(e);
}

/* ------------------------------------------------------------------------------------------ */
/* Keys                                                                                        */
/* ------------------------------------------------------------------------------------------ */

static int check_key(ddprun_etcd *e, const char *key, const char *what)
{
    if (!e)
        return -EINVAL;
    if (!key || !*key)
        return fail(e, -EINVAL, "etcd %s: an empty key", what);
    return 0;
}

/* The revision in an answer's header. */
static int64_t header_revision(const json_t *reply)
{
    return jint(json_object_get(reply, "header"), "revision");
}

/* Reads a key or a prefix into a new array. */
static int range(ddprun_etcd *e, const char *key, bool prefix, ddprun_etcd_kv **out, size_t *count,
                 int64_t *revision)
{
    char what[160];
    snprintf(what, sizeof what, "%s '%.100s'", prefix ? "range" : "get", key);
    json_t *reply = NULL;
    int rc = call(e, what, "/v3/kv/range", key_json(key, prefix), &reply);
    if (rc < 0)
        return rc;
    ddprun_etcd_kv *kvs = NULL;
    const json_t *arr = json_object_get(reply, "kvs");
    size_t n = json_array_size(arr);
    if (n) {
        kvs = calloc(n, sizeof *kvs);
        if (!kvs) {
            rc = fail(e, -ENOMEM, "%s: out of memory", what);
            goto out;
        }
    }
    for (size_t i = 0; i < n; i++) {
        rc = kv_from_json(json_array_get(arr, i), &kvs[i]);
        if (rc < 0) {
            ddprun_etcd_kvs_free(kvs, i);
            kvs = NULL;
            fail(e, rc, "etcd at %s: %s: a malformed key in the answer", e->endpoints[e->cur],
                 what);
            goto out;
        }
    }
    *out = kvs;
    *count = n;
    if (revision)
        *revision = header_revision(reply);
out:
    json_decref(reply);
    return rc;
}

int ddprun_etcd_get(ddprun_etcd *e, const char *key, ddprun_etcd_kv **out, int64_t *revision)
{
    int rc = check_key(e, key, "get");
    if (rc < 0 || !out)
        return rc < 0 ? rc : -EINVAL;
    ddprun_etcd_kv *kvs = NULL;
    size_t n = 0;
    int64_t rev = 0;
    rc = range(e, key, false, &kvs, &n, &rev);
    if (rc < 0)
        return rc;
    if (revision)
        *revision = rev;
    if (n == 0)
        return fail(e, -ENOENT, "etcd get '%.200s': no such key", key);
    for (size_t i = 1; i < n; i++) { /* one key matches itself: never more than one */
        free(kvs[i].key);
        free(kvs[i].value);
    }
    *out = kvs;
    return 0;
}

int ddprun_etcd_range(ddprun_etcd *e, const char *prefix, ddprun_etcd_kv **out, size_t *count,
                      int64_t *revision)
{
    if (!e || !prefix || !out || !count)
        return e ? fail(e, -EINVAL, "etcd range: a NULL argument") : -EINVAL;
    return range(e, prefix, true, out, count, revision);
}

/* {"key", "value", "lease"} of a put, alone or inside a transaction; NULL when out of memory. */
static json_t *put_json(const char *key, const void *value, size_t value_len, int64_t lease)
{
    json_t *o = key_json(key, false);
    if (o && (!jset(o, "value", b64_json(value ? value : "", value_len)) ||
              (lease && !jset(o, "lease", json_integer(lease))))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

int ddprun_etcd_put(ddprun_etcd *e, const char *key, const void *value, size_t value_len,
                    int64_t lease, int64_t *revision)
{
    int rc = check_key(e, key, "put");
    if (rc < 0)
        return rc;
    if (!value && value_len)
        return fail(e, -EINVAL, "etcd put '%.200s': no value", key);
    char what[160];
    snprintf(what, sizeof what, "put '%.100s'", key);
    json_t *reply = NULL;
    rc = call(e, what, "/v3/kv/put", put_json(key, value, value_len, lease), &reply);
    if (rc == 0 && revision)
        *revision = header_revision(reply);
    json_decref(reply);
    return rc;
}

int ddprun_etcd_delete(ddprun_etcd *e, const char *key, bool prefix, int64_t *deleted)
{
    int rc = prefix ? (e && key ? 0 : -EINVAL) : check_key(e, key, "delete");
    if (rc < 0)
        return rc;
    char what[160];
    snprintf(what, sizeof what, "delete%s '%.100s'", prefix ? " prefix" : "", key);
    json_t *reply = NULL;
    rc = call(e, what, "/v3/kv/deleterange", key_json(key, prefix), &reply);
    if (rc == 0 && deleted)
        *deleted = jint(reply, "deleted");
    json_decref(reply);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Transactions                                                                                */
/* ------------------------------------------------------------------------------------------ */

static const char *const target_names[] = {"VERSION", "CREATE", "MOD", "VALUE"};
static const char *const target_fields[] = {"version", "create_revision", "mod_revision", "value"};
static const char *const result_names[] = {"EQUAL", "NOT_EQUAL", "GREATER", "LESS"};

/* One Compare object; NULL when out of memory (the arguments were checked). */
static json_t *compare_json(const ddprun_etcd_compare *c)
{
    json_t *o = key_json(c->key, false);
    json_t *operand = c->target == DDPRUN_ETCD_VALUE
                          ? b64_json(c->value ? c->value : "", c->value_len)
                          : json_integer(c->number);
    if (!o || !jset(o, "target", json_string(target_names[c->target])) ||
        !jset(o, "result", json_string(result_names[c->result])) ||
        !jset(o, target_fields[c->target], operand)) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* One RequestOp; NULL when out of memory (the arguments were checked). */
static json_t *op_json(const ddprun_etcd_op *op)
{
    json_t *req = op->kind == DDPRUN_ETCD_OP_PUT
                      ? put_json(op->key, op->value, op->value_len, op->lease)
                      : key_json(op->key, op->kind == DDPRUN_ETCD_OP_DELETE_PREFIX);
    json_t *o = json_object();
    if (!o ||
        !jset(o, op->kind == DDPRUN_ETCD_OP_PUT ? "request_put" : "request_delete_range", req)) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* ops[0..n) as a JSON array under body[name]; false when out of memory. */
static bool ops_json(json_t *body, const char *name, const ddprun_etcd_op *ops, size_t n)
{
    json_t *arr = json_array();
    if (!jset(body, name, arr))
        return false;
    for (size_t i = 0; i < n; i++)
        if (json_array_append_new(arr, op_json(&ops[i])) < 0)
            return false;
    return true;
}

static int check_ops(ddprun_etcd *e, const ddprun_etcd_op *ops, size_t n)
{
    if (n && !ops)
        return fail(e, -EINVAL, "etcd txn: a NULL operation list");
    for (size_t i = 0; i < n; i++) {
        if (ops[i].kind < DDPRUN_ETCD_OP_PUT || ops[i].kind > DDPRUN_ETCD_OP_DELETE_PREFIX)
            return fail(e, -EINVAL, "etcd txn: operation %zu: unknown kind %d", i, ops[i].kind);
        if (!ops[i].key || (!*ops[i].key && ops[i].kind != DDPRUN_ETCD_OP_DELETE_PREFIX))
            return fail(e, -EINVAL, "etcd txn: operation %zu: an empty key", i);
        if (ops[i].kind == DDPRUN_ETCD_OP_PUT && !ops[i].value && ops[i].value_len)
            return fail(e, -EINVAL, "etcd txn: operation %zu: no value", i);
    }
    return 0;
}

int ddprun_etcd_txn(ddprun_etcd *e, const ddprun_etcd_compare *cmp, size_t ncmp,
                    const ddprun_etcd_op *on_success, size_t nsuccess,
                    const ddprun_etcd_op *on_failure, size_t nfailure, bool *succeeded,
                    int64_t *revision)
{
    if (!e)
        return -EINVAL;
    if (!succeeded || (ncmp && !cmp))
        return fail(e, -EINVAL, "etcd txn: a NULL argument");
    for (size_t i = 0; i < ncmp; i++) {
        if (!cmp[i].key || !*cmp[i].key)
            return fail(e, -EINVAL, "etcd txn: comparison %zu: an empty key", i);
        if (cmp[i].target < DDPRUN_ETCD_VERSION || cmp[i].target > DDPRUN_ETCD_VALUE ||
            cmp[i].result < DDPRUN_ETCD_EQUAL || cmp[i].result > DDPRUN_ETCD_LESS)
            return fail(e, -EINVAL, "etcd txn: comparison %zu: unknown target %d or result %d", i,
                        cmp[i].target, cmp[i].result);
    }
    int rc = check_ops(e, on_success, nsuccess);
    if (rc == 0)
        rc = check_ops(e, on_failure, nfailure);
    if (rc < 0)
        return rc;

    json_t *body = json_object(), *arr = json_array();
    bool ok = jset(body, "compare", arr);
    for (size_t i = 0; ok && i < ncmp; i++)
        ok = json_array_append_new(arr, compare_json(&cmp[i])) == 0;
    ok = ok && ops_json(body, "success", on_success, nsuccess) &&
         ops_json(body, "failure", on_failure, nfailure);
    if (!ok) {
        json_decref(body);
        body = NULL;
    }
    char what[160];
    snprintf(what, sizeof what, "txn on '%.100s'",
             ncmp       ? cmp[0].key
             : nsuccess ? on_success[0].key
                        : "");
    json_t *reply = NULL;
    rc = call(e, what, "/v3/kv/txn", body, &reply);
    if (rc < 0)
        return rc;
    *succeeded = json_is_true(json_object_get(reply, "succeeded"));
    if (revision)
        *revision = header_revision(reply);
    json_decref(reply);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Leases                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* {"ID": id} (plus "TTL" when ttl > 0); NULL when out of memory. */
static json_t *lease_json(int64_t id, int64_t ttl)
{
    json_t *o = json_object();
    if (!o || !jset(o, "ID", json_integer(id)) || (ttl > 0 && !jset(o, "TTL", json_integer(ttl)))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

int ddprun_etcd_lease_grant(ddprun_etcd *e, int64_t ttl_s, int64_t *id, int64_t *granted_s)
{
    if (!e)
        return -EINVAL;
    if (!id || ttl_s < 1 || ttl_s > (int64_t)9e10)
        return fail(e, -EINVAL, "etcd lease grant: a TTL of %" PRId64 " s is not 1 to 9e10", ttl_s);
    json_t *reply = NULL;
    int rc = call(e, "lease grant", "/v3/lease/grant", lease_json(0, ttl_s), &reply);
    if (rc < 0)
        return rc;
    int64_t got = jint(reply, "ID");
    if (got == 0) {
        rc = fail(e, -EPROTO, "etcd at %s: lease grant: no lease id in the answer",
                  e->endpoints[e->cur]);
    } else {
        *id = got;
        if (granted_s)
            *granted_s = jint(reply, "TTL");
    }
    json_decref(reply);
    return rc;
}

/* A call about lease `id`; `what` (64 bytes) receives its name ("lease <verb> <id>"). */
static int lease_call(ddprun_etcd *e, const char *verb, const char *path, int64_t id, char *what,
                      json_t **reply)
{
    snprintf(what, 64, "lease %s %" PRId64, verb, id);
    return call(e, what, path, lease_json(id, 0), reply);
}

int ddprun_etcd_lease_keepalive(ddprun_etcd *e, int64_t id, int64_t *ttl_s)
{
    if (!e)
        return -EINVAL;
    char what[64];
    json_t *reply = NULL;
    /* A stream on the gateway: our one request, then its one answer, as {"result": {...}}. */
    int rc = lease_call(e, "keepalive", "/v3/lease/keepalive", id, what, &reply);
    if (rc < 0)
        return rc;
    const json_t *result = json_object_get(reply, "result");
    int64_t ttl = jint(result, "TTL");
    if (!json_is_object(result))
        rc = fail_answer(e, what, 200, reply, NULL);
    else if (ttl <= 0)
        rc = fail(e, -ENOENT, "etcd %s: the lease expired or was revoked", what);
    else if (ttl_s)
        *ttl_s = ttl;
    json_decref(reply);
    return rc;
}

int ddprun_etcd_lease_revoke(ddprun_etcd *e, int64_t id)
{
    if (!e)
        return -EINVAL;
    char what[64];
    json_t *reply = NULL;
    int rc = lease_call(e, "revoke", "/v3/lease/revoke", id, what, &reply);
    json_decref(reply);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Watch                                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* What the watch's write callback has seen. */
typedef struct watch_state {
    ddprun_etcd *e;
    reply_buf line; /* the bytes of the message being received */
    bool created;   /* etcd confirmed the watch */
    bool done;      /* the callback stopped the transfer; rc says why */
    int rc;
    ddprun_etcd_event *ev; /* filled when done with rc 0 */
    const char *what;
} watch_state;

/* Handles one streamed message. Returns true when the watch is over (w->rc set). */
static bool watch_message(watch_state *w, const char *text, size_t len)
{
    json_error_t jerr;
    json_t *j = json_loadb(text, len, 0, &jerr);
    const json_t *result = json_object_get(j, "result");
    const json_t *events = json_object_get(result, "events");
    bool over = true;
    if (!json_is_object(result)) {
        w->rc = fail_answer(w->e, w->what, 200, j, text);
    } else if (json_is_true(json_object_get(result, "canceled"))) {
        int64_t compact = jint(result, "compact_revision");
        w->rc = compact ? fail(w->e, -ESTALE,
                               "etcd %s: the revisions up to %" PRId64 " were compacted away",
                               w->what, compact)
                        : fail(w->e, -EPROTO, "etcd at %s: %s: the watch was canceled: %s",
                               w->e->endpoints[w->e->cur], w->what,
                               json_string_value(json_object_get(result, "cancel_reason"))
                                   ? json_string_value(json_object_get(result, "cancel_reason"))
                                   : "no reason given");
    } else if (json_array_size(events) > 0) {
        const json_t *ev = json_array_get(events, 0);
        const char *type = json_string_value(json_object_get(ev, "type"));
        int rc = kv_from_json(json_object_get(ev, "kv"), &w->ev->kv);
        w->ev->type = type && strcmp(type, "DELETE") == 0 ? DDPRUN_ETCD_DELETE : DDPRUN_ETCD_PUT;
        w->rc = rc < 0 ? fail(w->e, rc, "etcd at %s: %s: a malformed event",
                              w->e->endpoints[w->e->cur], w->what)
                       : 0;
    } else {
        w->created |= json_is_true(json_object_get(result, "created"));
        over = false;
    }
    json_decref(j);
    return over;
}

/* The stream's write callback: splits it into lines and stops at the first that ends the watch. */
static size_t watch_write(char *p, size_t size, size_t nmemb, void *arg)
{
    watch_state *w = arg;
    size_t n = size * nmemb;
    for (size_t i = 0; i < n;) {
        const char *nl = memchr(p + i, '\n', n - i);
        size_t take = nl ? (size_t)(nl - (p + i)) : n - i;
        if (collect(p + i, 1, take, &w->line) != take) {
            w->rc = fail(w->e, w->line.oom ? -ENOMEM : -EPROTO, "etcd %s: %s", w->what,
                         w->line.oom ? "out of memory" : "a message too large");
            w->done = true;
            return 0;
        }
        i += take;
        if (!nl)
            break;
        i++; /* the newline */
        if (w->line.len && watch_message(w, w->line.data, w->line.len)) {
            w->done = true;
            return 0;
        }
        w->line.len = 0;
    }
    return n;
}

int ddprun_etcd_watch(ddprun_etcd *e, const char *key, bool prefix, int64_t after_revision,
                      int timeout_ms, ddprun_etcd_event *ev)
{
    int rc = prefix ? (e && key ? 0 : -EINVAL) : check_key(e, key, "watch");
    if (rc < 0)
        return rc;
    if (!ev || timeout_ms < 0 || after_revision < 0)
        return fail(e, -EINVAL,
                    "etcd watch '%.200s': a NULL event, a negative timeout or "
                    "revision",
                    key);
    char what[160];
    snprintf(what, sizeof what, "watch%s '%.100s'", prefix ? " prefix" : "", key);

    json_t *req = key_json(key, prefix), *body = json_object();
    if (req && after_revision > 0 && !jset(req, "start_revision", json_integer(after_revision + 1)))
        req = NULL;
    char *data = NULL;
    if (jset(body, "create_request", req))
        data = json_dumps(body, JSON_COMPACT);
    else
        json_decref(req);
    json_decref(body);
    if (!data)
        return fail(e, -ENOMEM, "etcd %s: out of memory", what);

    ddprun_etcd_event got = {0};
    watch_state w = {.e = e, .ev = &got, .what = what};
    long status = 0;
    rc = exchange(e, "/v3/watch", data, strlen(data), timeout_ms, watch_write, &w, &status);
    if (rc == 0 && w.done) {
        rc = w.rc;
    } else if (rc == 0) {
        /* The stream ended without an event: an error answer, or a member going away. */
        json_error_t jerr;
        json_t *j = w.line.len ? json_loadb(w.line.data, w.line.len, 0, &jerr) : NULL;
        rc = w.line.len ? fail_answer(e, what, status, j, w.line.data)
                        : fail(e, -ECONNRESET, "etcd at %s: %s: the stream ended (HTTP %ld)",
                               e->endpoints[e->cur], what, status);
        json_decref(j);
    } else if (rc == -ETIMEDOUT && w.created) {
        rc = fail(e, -ETIMEDOUT, "etcd %s: no change%s within %d ms", what,
                  after_revision ? " after the revision given" : "", timeout_ms);
    }
    free(data);
    free(w.line.data);
    if (rc < 0) {
        ddprun_etcd_event_clear(&got);
        return rc;
    }
    errbuf_clear(&e->err);
    *ev = got;
    return 0;
}
