/*
 * Tests of a job's control plane (auth.h): the handshake's pure steps (a known answer that pins
 * the wire format, both sides with the right token, a wrong token detected on both sides, a
 * server impostor detected by the client, replayed and reflected proofs refused, steps out of
 * order), the private-key rule for every operation, networks and address sets, tokens from
 * files and the environment; then the same over real sockets: an authenticated client reaches
 * private keys, an unauthenticated one reaches the rest and is closed on a private key, a wrong
 * token fails at once on both sides, an impostor store is refused, and (as root) a connection
 * of another user is refused, logged and counted.
 */
#include "auth.h"
#include "proto.h"
#include "rdzv.h"
#include "check_main.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *const token = "0123456789abcdef-test-token";
static const char *const other = "fedcba9876543210-other-token";

/* ---- log capture ---- */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_text[8192];

static void capture_log(void *arg, int level, const char *msg)
{
    (void)arg;
    (void)level;
    pthread_mutex_lock(&log_mu);
    size_t n = strlen(log_text);
    snprintf(log_text + n, sizeof(log_text) - n, "%s\n", msg);
    pthread_mutex_unlock(&log_mu);
}

static bool log_has(const char *needle)
{
    pthread_mutex_lock(&log_mu);
    bool r = strstr(log_text, needle) != NULL;
    pthread_mutex_unlock(&log_mu);
    return r;
}

static void hex(const char *h, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sscanf(h + 2 * i, "%2hhx", &out[i]);
}

/* ---------------------------------------------------------------------------------------- */
/* The handshake's steps                                                                    */
/* ---------------------------------------------------------------------------------------- */

/* HMAC-SHA256(token, label || cn || sn), computed independently with Python's hmac module. */
START_TEST(known_answer)
{
    uint8_t cn[32], sn[32], mac[32], want[32];
    for (int i = 0; i < 32; i++) {
        cn[i] = (uint8_t)i;
        sn[i] = (uint8_t)(32 + i);
    }
    ck_assert_int_eq(rdzv__auth_mac(token, RDZV_AUTH_SERVER, cn, sn, mac), 0);
    hex("d37a485f324c91739baff2bfe96173bc72f9c73368fe2cf7f976b6853215157d", want, 32);
    ck_assert_mem_eq(mac, want, 32);
    ck_assert_int_eq(rdzv__auth_mac(token, RDZV_AUTH_CLIENT, cn, sn, mac), 0);
    hex("9804529825ca8b7cc239b6c683005a3973f856c5c327e9b23f1cbb48e77b939f", want, 32);
    ck_assert_mem_eq(mac, want, 32);
}
END_TEST

/* Runs HELLO on a fresh server state; returns the client nonce used. */
static void hello(const char *server_token, rdzv__auth_conn *a, uint8_t cn[32], uint8_t *reply,
                  size_t *n)
{
    memset(a, 0, sizeof(*a));
    ck_assert_int_eq(rdzv__auth_nonce(cn), 0);
    ck_assert_int_eq(rdzv__auth_server_hello(server_token, a, cn, 32, reply, n), 0);
}

START_TEST(right_token_both_ways)
{
    rdzv__auth_conn a;
    uint8_t cn[32], reply[RDZV_AUTH_HELLO_REPLY_BYTES], proof[32];
    size_t n;
    hello(token, &a, cn, reply, &n);
    ck_assert_uint_eq(n, RDZV_AUTH_HELLO_REPLY_BYTES);
    ck_assert_int_eq(reply[0], RDZV_AUTH_STATUS_OK);
    ck_assert_int_eq(a.state, RDZV_AUTH_CHALLENGED);
    /* The client accepts the server's proof, and the server the client's. */
    ck_assert_int_eq(rdzv__auth_client_check(token, cn, reply, n, proof), 0);
    ck_assert_int_eq(rdzv__auth_server_proof(token, &a, proof, 32), 0);
    ck_assert_int_eq(a.state, RDZV_AUTH_DONE);
    /* One handshake per connection. */
    ck_assert_int_eq(rdzv__auth_server_proof(token, &a, proof, 32), -EPROTO);
    ck_assert_int_eq(rdzv__auth_server_hello(token, &a, cn, 32, reply, &n), -EPROTO);
}
END_TEST

START_TEST(wrong_token_fails_on_both_sides)
{
    rdzv__auth_conn a;
    uint8_t cn[32], reply[RDZV_AUTH_HELLO_REPLY_BYTES], proof[32];
    size_t n;
    hello(token, &a, cn, reply, &n);
    /* The client holds another token: the server's proof does not check out. */
    ck_assert_int_eq(rdzv__auth_client_check(other, cn, reply, n, proof), -EKEYREJECTED);
    /* A client that sends a proof made with the wrong token anyway is refused. */
    ck_assert_int_eq(rdzv__auth_mac(other, RDZV_AUTH_CLIENT, cn, reply + 1, proof), 0);
    ck_assert_int_eq(rdzv__auth_server_proof(token, &a, proof, 32), -EACCES);
    ck_assert_int_ne(a.state, RDZV_AUTH_DONE);
    /* A wrong proof ends the challenge: the right one afterwards does not count either. */
    ck_assert_int_eq(rdzv__auth_mac(token, RDZV_AUTH_CLIENT, cn, reply + 1, proof), 0);
    ck_assert_int_eq(rdzv__auth_server_proof(token, &a, proof, 32), -EPROTO);
    /* A truncated proof is wrong too. */
    hello(token, &a, cn, reply, &n);
    ck_assert_int_eq(rdzv__auth_mac(token, RDZV_AUTH_CLIENT, cn, reply + 1, proof), 0);
    ck_assert_int_eq(rdzv__auth_server_proof(token, &a, proof, 31), -EACCES);
}
END_TEST

START_TEST(impostor_server_detected)
{
    rdzv__auth_conn a;
    uint8_t cn[32], reply[RDZV_AUTH_HELLO_REPLY_BYTES], proof[32];
    size_t n;
    /* A store without a secret says so: the client refuses it. */
    hello(NULL, &a, cn, reply, &n);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(rdzv__auth_client_check(token, cn, reply, n, proof), -ENOKEY);
    /* An impostor that claims success with made-up bytes. */
    uint8_t fake[RDZV_AUTH_HELLO_REPLY_BYTES] = {RDZV_AUTH_STATUS_OK};
    ck_assert_int_eq(rdzv__auth_nonce(fake + 1), 0);
    ck_assert_int_eq(rdzv__auth_nonce(fake + 33), 0);
    ck_assert_int_eq(rdzv__auth_client_check(token, cn, fake, sizeof fake, proof), -EKEYREJECTED);
    /* Malformed replies. */
    ck_assert_int_eq(rdzv__auth_client_check(token, cn, fake, 64, proof), -EPROTO);
    fake[0] = 7;
    ck_assert_int_eq(rdzv__auth_client_check(token, cn, fake, sizeof fake, proof), -EPROTO);
}
END_TEST

START_TEST(replayed_and_reflected_proofs_fail)
{
    rdzv__auth_conn a1, a2;
    uint8_t cn1[32], cn2[32], r1[RDZV_AUTH_HELLO_REPLY_BYTES], r2[RDZV_AUTH_HELLO_REPLY_BYTES];
    uint8_t p1[32], p2[32];
    size_t n1, n2;
    /* A genuine exchange, recorded by an eavesdropper. */
    hello(token, &a1, cn1, r1, &n1);
    ck_assert_int_eq(rdzv__auth_client_check(token, cn1, r1, n1, p1), 0);
    ck_assert_int_eq(rdzv__auth_server_proof(token, &a1, p1, 32), 0);

    /* Replaying the client's proof on a new connection: the server's nonce is new. Even with
     * the recorded client nonce replayed too. */
    memset(&a2, 0, sizeof(a2));
    ck_assert_int_eq(rdzv__auth_server_hello(token, &a2, cn1, 32, r2, &n2), 0);
    ck_assert_mem_ne(r2 + 1, r1 + 1, 32);
    ck_assert_int_eq(rdzv__auth_server_proof(token, &a2, p1, 32), -EACCES);

    /* Replaying the server's recorded reply to a client with a new nonce (a fake store). */
    ck_assert_int_eq(rdzv__auth_nonce(cn2), 0);
    ck_assert_int_eq(rdzv__auth_client_check(token, cn2, r1, n1, p2), -EKEYREJECTED);

    /* Reflection: the server's own proof sent back as the client's. */
    hello(token, &a2, cn2, r2, &n2);
    ck_assert_int_eq(rdzv__auth_server_proof(token, &a2, r2 + 33, 32), -EACCES);
}
END_TEST

START_TEST(steps_out_of_order)
{
    rdzv__auth_conn a = {0};
    uint8_t cn[32] = {0}, reply[RDZV_AUTH_HELLO_REPLY_BYTES], proof[32] = {0};
    size_t n;
    ck_assert_int_eq(rdzv__auth_server_proof(token, &a, proof, 32), -EPROTO);
    ck_assert_int_eq(rdzv__auth_server_hello(token, &a, cn, 31, reply, &n), -EPROTO);
    ck_assert_int_eq(rdzv__auth_server_proof(NULL, &a, proof, 32), -EPROTO);
}
END_TEST

/* ---------------------------------------------------------------------------------------- */
/* Rules                                                                                    */
/* ---------------------------------------------------------------------------------------- */

static rdzv__request parsed(rdzv__wbuf *b)
{
    rdzv__parser p;
    rdzv__limits lim = {1 << 16, 1 << 20, 1024, 1 << 22};
    rdzv__request r;
    rdzv__parser_init(&p);
    p.gen = RDZV_GEN_MODERN;
    ck_assert_int_eq(rdzv__parse(&p, &lim, b->data, b->len, &r), (int)b->len);
    return r;
}

START_TEST(private_keys_in_every_field)
{
    static const enum rdzv_op one_key[] = {
        RDZV_OP_SET,        RDZV_OP_COMPARE_SET, RDZV_OP_GET,        RDZV_OP_ADD,
        RDZV_OP_DELETE_KEY, RDZV_OP_APPEND,      RDZV_OP_QUEUE_PUSH, RDZV_OP_QUEUE_POP,
        RDZV_OP_QUEUE_LEN,  RDZV_OP_BARRIER,
    };
    const char *keys[] = {"/ddprun/job/round_0/failed", "/ddprun-coll/x/nccl/id", "torch/key",
                          "/ddprunx", "ddprun/no-slash"};
    const bool priv[] = {true, true, false, false, false};
    for (size_t k = 0; k < 5; k++) {
        for (size_t i = 0; i < sizeof one_key / sizeof one_key[0]; i++) {
            rdzv__wbuf b = {0};
            enum rdzv_op op = one_key[i];
            rdzv__put_op(&b, RDZV_GEN_MODERN, op);
            rdzv__put_vec(&b, keys[k], strlen(keys[k]));
            if (op == RDZV_OP_ADD || op == RDZV_OP_BARRIER)
                rdzv__put_i64(&b, 1);
            else if (op == RDZV_OP_SET || op == RDZV_OP_APPEND || op == RDZV_OP_QUEUE_PUSH)
                rdzv__put_vec(&b, "v", 1);
            else if (op == RDZV_OP_COMPARE_SET) {
                rdzv__put_vec(&b, "", 0);
                rdzv__put_vec(&b, "v", 1);
            }
            rdzv__request r = parsed(&b);
            ck_assert_msg(rdzv__request_private(&r) == priv[k], "%s %s", rdzv__op_name(op),
                          keys[k]);
            rdzv__wbuf_free(&b);
        }
    }
    /* The repeated groups: a private key anywhere in CHECK/WAIT/MULTI_GET, or as any MULTI_SET
     * key (not as a value). */
    static const enum rdzv_op lists[] = {RDZV_OP_CHECK, RDZV_OP_WAIT, RDZV_OP_MULTI_GET};
    for (size_t i = 0; i < 3; i++) {
        rdzv__wbuf b = {0};
        rdzv__put_op(&b, RDZV_GEN_MODERN, lists[i]);
        rdzv__put_u64(&b, 3);
        rdzv__put_vec(&b, "a", 1);
        rdzv__put_vec(&b, "b", 1);
        rdzv__put_vec(&b, "/ddprun/j/hb/0", 14);
        rdzv__request r = parsed(&b);
        ck_assert(rdzv__request_private(&r));
        rdzv__wbuf_free(&b);
    }
    rdzv__wbuf b = {0};
    rdzv__put_op(&b, RDZV_GEN_MODERN, RDZV_OP_MULTI_SET);
    rdzv__put_u64(&b, 2);
    rdzv__put_vec(&b, "a", 1);
    rdzv__put_vec(&b, "/ddprun/as-a-value", 18);
    rdzv__put_vec(&b, "/ddprun-coll/c/cpu/1", 20);
    rdzv__put_vec(&b, "v", 1);
    rdzv__request r = parsed(&b);
    ck_assert(rdzv__request_private(&r));
    rdzv__wbuf_reset(&b);
    rdzv__put_op(&b, RDZV_GEN_MODERN, RDZV_OP_MULTI_SET);
    rdzv__put_u64(&b, 1);
    rdzv__put_vec(&b, "a", 1);
    rdzv__put_vec(&b, "/ddprun/as-a-value", 18);
    r = parsed(&b);
    ck_assert(!rdzv__request_private(&r));
    /* Requests without keys. */
    static const enum rdzv_op none[] = {RDZV_OP_GETNUMKEYS, RDZV_OP_LIST_KEYS, RDZV_OP_CANCEL_WAIT,
                                        RDZV_OP_STATUS};
    for (size_t i = 0; i < 4; i++) {
        rdzv__wbuf_reset(&b);
        rdzv__put_op(&b, RDZV_GEN_MODERN, none[i]);
        r = parsed(&b);
        ck_assert(!rdzv__request_private(&r));
    }
    rdzv__wbuf_free(&b);
}
END_TEST

/* The address `ip` as a socket address, in one of a few rotating slots (enough for one call). */
static const struct sockaddr *SA(const char *ip)
{
    static struct sockaddr_storage slots[4];
    static int next;
    struct sockaddr_storage *ss = &slots[next++ % 4];
    memset(ss, 0, sizeof(*ss));
    if (strchr(ip, ':')) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
        s6->sin6_family = AF_INET6;
        ck_assert_int_eq(inet_pton(AF_INET6, ip, &s6->sin6_addr), 1);
    } else {
        struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
        s4->sin_family = AF_INET;
        ck_assert_int_eq(inet_pton(AF_INET, ip, &s4->sin_addr), 1);
    }
    return (const struct sockaddr *)ss;
}

/*
 * The log sentence of a refusal names the private key that caused it, for the requests with
 * several keys too (the first private one, with how many there are), printable and bounded.
 */
START_TEST(private_refusal_names_the_key)
{
    char why[200];
    rdzv__wbuf b = {0};
    rdzv__put_op(&b, RDZV_GEN_MODERN, RDZV_OP_MULTI_GET);
    rdzv__put_u64(&b, 3);
    rdzv__put_vec(&b, "a", 1);
    rdzv__put_vec(&b, "/ddprun/j/hb/0", 14);
    rdzv__put_vec(&b, "b", 1);
    rdzv__request r = parsed(&b);
    const uint8_t *k = NULL;
    size_t kl = 0;
    ck_assert_uint_eq(rdzv__request_private_keys(&r, &k, &kl), 1);
    ck_assert_uint_eq(kl, 14);
    ck_assert(memcmp(k, "/ddprun/j/hb/0", 14) == 0);
    rdzv__private_refusal(&r, why, sizeof why);
    ck_assert_str_eq(why, "multi_get refused: '/ddprun/j/hb/0' is private to the job's "
                          "authenticated connections (1 private key of 3)");
    rdzv__wbuf_reset(&b);
    rdzv__put_op(&b, RDZV_GEN_MODERN, RDZV_OP_MULTI_SET);
    rdzv__put_u64(&b, 3);
    rdzv__put_vec(&b, "a", 1);
    rdzv__put_vec(&b, "/ddprun/as-a-value", 18);
    rdzv__put_vec(&b, "/ddprun-coll/c/cpu/1", 20);
    rdzv__put_vec(&b, "v", 1);
    rdzv__put_vec(&b, "/ddprun/x", 9);
    rdzv__put_vec(&b, "v", 1);
    r = parsed(&b);
    rdzv__private_refusal(&r, why, sizeof why);
    ck_assert_str_eq(why, "multi_set refused: '/ddprun-coll/c/cpu/1' is private to the job's "
                          "authenticated connections (2 private keys of 3)");
    /* One key: no count. A long key with bytes that are not printable: '?', cut at 64. */
    char longkey[100];
    memset(longkey, 'k', sizeof longkey);
    memcpy(longkey, "/ddprun/\n\x01", 10);
    rdzv__wbuf_reset(&b);
    rdzv__put_op(&b, RDZV_GEN_MODERN, RDZV_OP_GET);
    rdzv__put_vec(&b, longkey, sizeof longkey);
    r = parsed(&b);
    rdzv__private_refusal(&r, why, sizeof why);
    ck_assert_msg(strncmp(why, "get refused: '/ddprun/??kkk", 27) == 0, "%s", why);
    ck_assert_msg(strstr(why, "kkk...' is private to the job's authenticated connections") &&
                      !strstr(why, "private key of"),
                  "%s", why);
    const char *tail = "...' is private to the job's authenticated connections";
    ck_assert_uint_eq(strlen(why), strlen("get refused: '") + 64 + strlen(tail));
    /* No private key: never a key it does not hold. */
    rdzv__wbuf_reset(&b);
    rdzv__put_op(&b, RDZV_GEN_MODERN, RDZV_OP_GET);
    rdzv__put_vec(&b, "open", 4);
    r = parsed(&b);
    ck_assert_uint_eq(rdzv__request_private_keys(&r, NULL, NULL), 0);
    rdzv__private_refusal(&r, why, sizeof why);
    ck_assert_str_eq(why, "get refused: no private key");
    rdzv__wbuf_free(&b);
}
END_TEST

START_TEST(networks_and_addresses)
{
    rdzv__cidr c;
    ck_assert_int_eq(rdzv__cidr_parse("10.0.0.0/8", &c), 0);
    ck_assert(rdzv__cidr_match(&c, SA("10.200.3.4")));
    ck_assert(rdzv__cidr_match(&c, SA("::ffff:10.1.2.3"))); /* IPv4-mapped counts as IPv4 */
    ck_assert(!rdzv__cidr_match(&c, SA("11.0.0.1")));
    ck_assert_int_eq(rdzv__cidr_parse("192.168.1.128/25", &c), 0);
    ck_assert(rdzv__cidr_match(&c, SA("192.168.1.200")));
    ck_assert(!rdzv__cidr_match(&c, SA("192.168.1.100")));
    ck_assert_int_eq(rdzv__cidr_parse("fd00::/8", &c), 0);
    ck_assert(rdzv__cidr_match(&c, SA("fd12::1")));
    ck_assert(!rdzv__cidr_match(&c, SA("fe80::1")));
    ck_assert(!rdzv__cidr_match(&c, SA("10.0.0.1")));
    ck_assert_int_eq(rdzv__cidr_parse("10.1.2.3", &c), 0);
    ck_assert_int_eq(c.bits, 32);
    ck_assert_int_eq(rdzv__cidr_parse("0.0.0.0/0", &c), 0);
    ck_assert(rdzv__cidr_match(&c, SA("8.8.8.8")));
    ck_assert_int_eq(rdzv__cidr_parse("10.0.0.0/33", &c), -EINVAL);
    ck_assert_int_eq(rdzv__cidr_parse("10.0.0.0/", &c), -EINVAL);
    ck_assert_int_eq(rdzv__cidr_parse("host.example", &c), -EINVAL);
    ck_assert_int_eq(rdzv__cidr_parse("::/129", &c), -EINVAL);

    ck_assert(rdzv__addr_loopback(SA("127.0.0.1")));
    ck_assert(rdzv__addr_loopback(SA("127.3.2.1")));
    ck_assert(rdzv__addr_loopback(SA("::1")));
    ck_assert(rdzv__addr_loopback(SA("::ffff:127.0.0.1")));
    ck_assert(!rdzv__addr_loopback(SA("10.0.0.1")));
    ck_assert(rdzv__addr_same(SA("10.0.0.1"), SA("::ffff:10.0.0.1")));
    ck_assert(!rdzv__addr_same(SA("10.0.0.1"), SA("10.0.0.2")));

    rdzv__addrset set = {0};
    ck_assert_int_eq(rdzv__addrset_add(&set, SA("10.0.0.2")), 1);
    ck_assert_int_eq(rdzv__addrset_add(&set, SA("::ffff:10.0.0.2")), 0);
    for (int i = 0; i < 20; i++) {
        char ip[32];
        snprintf(ip, sizeof ip, "10.1.0.%d", i);
        ck_assert_int_eq(rdzv__addrset_add(&set, SA(ip)), 1);
    }
    ck_assert(rdzv__addrset_has(&set, SA("10.0.0.2")));
    ck_assert(rdzv__addrset_has(&set, SA("10.1.0.19")));
    ck_assert(!rdzv__addrset_has(&set, SA("10.0.0.3")));
    ck_assert_uint_eq(set.n, 21);
    rdzv__addrset_free(&set);
}
END_TEST

START_TEST(tokens)
{
    char buf[RDZV_TOKEN_MAX_BYTES + 1], path[] = "/tmp/test_auth_XXXXXX";
    ck_assert_int_eq(rdzv_token_check(token), 0);
    ck_assert_int_eq(rdzv_token_check("short"), -EINVAL);
    ck_assert_int_eq(rdzv_token_check("has a space in the middle"), -EINVAL);
    ck_assert_int_eq(rdzv_token_check(NULL), -EINVAL);
    ck_assert_int_eq(rdzv_token_generate(buf, 64), -ENOSPC);
    ck_assert_int_eq(rdzv_token_generate(buf, sizeof buf), 0);
    ck_assert_uint_eq(strlen(buf), 64);
    ck_assert_int_eq(rdzv_token_check(buf), 0);
    char again[65];
    ck_assert_int_eq(rdzv_token_generate(again, sizeof again), 0);
    ck_assert_str_ne(buf, again);

    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "0123456789abcdef-test-token \n\n", 30), 30);
    close(fd);
    ck_assert_int_eq(rdzv_token_read_file(path, buf, sizeof buf), 0);
    ck_assert_str_eq(buf, token);
    ck_assert_int_eq(rdzv_token_read_file(path, buf, 10), -ENOSPC);
    fd = open(path, O_WRONLY | O_TRUNC);
    ck_assert_int_eq(write(fd, "two words here, not one token\n", 30), 30);
    close(fd);
    ck_assert_int_eq(rdzv_token_read_file(path, buf, sizeof buf), -EINVAL);
    unlink(path);
    ck_assert_int_eq(rdzv_token_read_file(path, buf, sizeof buf), -ENOENT);

    /* The worker's side: DDPRUN_STORE_TOKEN, checked and never quoted. */
    rdzv_env e;
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "29500", 1);
    setenv(RDZV_TOKEN_ENV, token, 1);
    ck_assert_int_eq(rdzv_env_read(&e), 0);
    ck_assert_str_eq(e.token, token);
    setenv(RDZV_TOKEN_ENV, "a secret that is wrong", 1);
    ck_assert_int_eq(rdzv_env_read(&e), -EINVAL);
    ck_assert_ptr_nonnull(strstr(rdzv_client_last_error(NULL), RDZV_TOKEN_ENV));
    ck_assert_ptr_null(strstr(rdzv_client_last_error(NULL), "secret that"));
    unsetenv(RDZV_TOKEN_ENV);
    ck_assert_int_eq(rdzv_env_read(&e), 0);
    ck_assert_str_eq(e.token, "");
}
END_TEST

/* ---------------------------------------------------------------------------------------- */
/* Over sockets                                                                             */
/* ---------------------------------------------------------------------------------------- */

static rdzv_server *start(const char *tok)
{
    rdzv_server_options o;
    rdzv_server_options_init(&o);
    o.token = tok;
    o.log = capture_log;
    rdzv_server *srv;
    ck_assert_int_eq(rdzv_server_start(&o, &srv), 0);
    return srv;
}

static int connect_with(rdzv_server *srv, const char *tok, rdzv_client **c)
{
    rdzv_client_options co;
    rdzv_client_options_init(&co);
    co.token = tok;
    co.connect_timeout_ms = 5000;
    co.timeout_ms = 5000;
    return rdzv_client_connect("127.0.0.1", rdzv_server_port(srv), &co, c);
}

/* A number from the status JSON's "security" object. */
static long long security(rdzv_server *srv, const char *name)
{
    char *s;
    ck_assert_int_eq(rdzv_server_status(srv, &s), 0);
    json_t *o = json_loads(s, 0, NULL);
    rdzv_free(s);
    ck_assert_ptr_nonnull(o);
    json_t *v = json_object_get(json_object_get(o, "security"), name);
    long long n = json_is_true(v) ? 1 : json_is_integer(v) ? json_integer_value(v) : -1;
    json_decref(o);
    return n;
}

START_TEST(authenticated_client_reaches_private_keys)
{
    rdzv_server *srv = start(token);
    rdzv_client *c, *d;
    ck_assert_int_eq(connect_with(srv, token, &c), 0);
    ck_assert_int_eq(rdzv_set(c, "/ddprun/job/round_0/failed", "x", 1), 0);
    void *v;
    size_t n;
    ck_assert_int_eq(rdzv_get(c, "/ddprun/job/round_0/failed", &v, &n), 0);
    ck_assert_uint_eq(n, 1);
    rdzv_free(v);
    /* A second connection (libcollective's) authenticates the same way. */
    ck_assert_int_eq(rdzv_client_dup(c, &d), 0);
    ck_assert_int_eq(rdzv_get(d, "/ddprun/job/round_0/failed", &v, &n), 0);
    rdzv_free(v);
    ck_assert_int_eq(security(srv, "authenticated"), 2);
    ck_assert_int_eq(security(srv, "token"), 1);
    rdzv_client_close(d);
    rdzv_client_close(c);
    rdzv_server_close(srv);
}
END_TEST

START_TEST(unauthenticated_client_kept_from_private_keys)
{
    rdzv_server *srv = start(token);
    rdzv_client *c;
    /* PyTorch's way: no handshake beyond VALIDATE. Open keys work. */
    ck_assert_int_eq(connect_with(srv, NULL, &c), 0);
    ck_assert_int_eq(rdzv_set(c, "default_pg/0//cuda//0", "id", 2), 0);
    ck_assert_int_eq(rdzv_ping(c), 0);
    /* A forged failure record: the SET has no reply, the next call finds the door shut. */
    ck_assert_int_eq(rdzv_set(c, "/ddprun/job/round_0/failed", "forged", 6), 0);
    ck_assert_int_eq(rdzv_ping(c), -ECONNRESET);
    rdzv_client_close(c);
    /* Reading a bootstrap key, and a private key hidden in a MULTI_GET. */
    ck_assert_int_eq(connect_with(srv, NULL, &c), 0);
    void *v = NULL;
    size_t n;
    ck_assert_int_eq(rdzv_get(c, "/ddprun-coll/job/nccl/id", &v, &n), -ECONNRESET);
    rdzv_client_close(c);
    ck_assert_int_eq(connect_with(srv, NULL, &c), 0);
    const char *keys[] = {"default_pg/0//cuda//0", "/ddprun-coll/job/cpu/0"};
    void *vals[2];
    size_t lens[2];
    ck_assert_int_eq(rdzv_multi_get(c, keys, 2, vals, lens), -ECONNRESET);
    rdzv_client_close(c);
    ck_assert_int_eq(security(srv, "refused_private"), 3);
    ck_assert(log_has("'/ddprun/job/round_0/failed' is private to the job's authenticated"));
    /* Nothing was written. */
    ck_assert_int_eq(connect_with(srv, token, &c), 0);
    ck_assert_int_eq(rdzv_check(c, (const char *[]){"/ddprun/job/round_0/failed"}, 1), 0);
    rdzv_client_close(c);
    rdzv_server_close(srv);
}
END_TEST

/* The server's log line for a refused MULTI_GET names its private key (not ''). */
START_TEST(refused_multi_get_logged_with_its_key)
{
    rdzv_server *srv = start(token);
    rdzv_client *c;
    ck_assert_int_eq(connect_with(srv, NULL, &c), 0);
    const char *keys[] = {"default_pg/0//cuda//0", "/ddprun-coll/job/cpu/0"};
    void *vals[2];
    size_t lens[2];
    ck_assert_int_eq(rdzv_multi_get(c, keys, 2, vals, lens), -ECONNRESET);
    rdzv_client_close(c);
    ck_assert_int_eq(security(srv, "refused_private"), 1);
    ck_assert_msg(log_has("multi_get refused: '/ddprun-coll/job/cpu/0' is private to the job's "
                          "authenticated connections (1 private key of 2)"),
                  "%s", log_text);
    ck_assert(!log_has("''"));
    rdzv_server_close(srv);
}
END_TEST

/*
 * The refusals a burst of them stands for, as the log accounts for them: the lines that closed a
 * connection for `why` (each one refusal) plus the N of each "refused N more connections"
 * summary line. *lines gets the number of lines.
 */
static long refusals_logged(const char *why, int *lines)
{
    long total = 0;
    *lines = 0;
    pthread_mutex_lock(&log_mu);
    for (const char *l = log_text; *l;) {
        const char *end = strchr(l, '\n');
        size_t len = end ? (size_t)(end - l) : strlen(l);
        char line[512];
        snprintf(line, sizeof(line), "%.*s", (int)len, l);
        long n;
        if (strstr(line, why) && strstr(line, "closing connection from")) {
            total++;
            ++*lines;
        } else if (strstr(line, why) &&
                   sscanf(line, "refused %ld more connections in the last second", &n) == 1) {
            total += n;
            ++*lines;
        }
        l += len + (end != NULL);
    }
    pthread_mutex_unlock(&log_mu);
    return total;
}

/*
 * A burst of security refusals is logged as one line and then a count a second, and every
 * refusal of it is accounted for once the burst is over (the same rate limit as refusals on
 * accept), rather than the count waiting for a refusal that may never come.
 */
START_TEST(refusal_burst_logged_once_and_counted)
{
    enum { K = 30 };
    rdzv_server *srv = start(token);
    for (int i = 0; i < K; i++) {
        rdzv_client *c;
        void *v = NULL;
        size_t n;
        ck_assert_int_eq(connect_with(srv, NULL, &c), 0);
        ck_assert_int_eq(rdzv_get(c, "/ddprun-coll/burst/key", &v, &n), -ECONNRESET);
        rdzv_client_close(c);
    }
    ck_assert_int_eq(security(srv, "refused_private"), K);
    /* The summary comes within a second or two of the last refusal: poll, bounded. */
    int lines = 0;
    long logged = 0;
    const char *why = "is private to the job";
    for (int i = 0; i < 500 && (logged = refusals_logged(why, &lines)) < K; i++)
        nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL); /* a poll interval */
    printf("refusal burst: %d refusals, %ld accounted for in %d log lines\n", K, logged, lines);
    ck_assert_msg(logged == K, "%ld of %d refusals in the log:\n%s", logged, K, log_text);
    ck_assert_int_le(lines, 6); /* one, then one a second: the burst takes well under 5 s */
    rdzv_server_close(srv);
}
END_TEST

START_TEST(wrong_token_fails_at_once_on_both_sides)
{
    rdzv_server *srv = start(token);
    rdzv_client *c = NULL;
    /* The client finds that the store does not know its token: -EACCES after one attempt. */
    ck_assert_int_eq(connect_with(srv, other, &c), -EACCES);
    ck_assert_ptr_nonnull(strstr(rdzv_client_last_error(NULL), "could not prove"));
    ck_assert_ptr_nonnull(strstr(rdzv_client_last_error(NULL), "after 1 attempt"));
    ck_assert_ptr_null(strstr(rdzv_client_last_error(NULL), other));
    /* The server sees the client leave on its proof: a failed authentication, counted, logged
     * with the peer's address and named in the status JSON (within 5 s: the close is seen on
     * the server's loop thread). */
    for (int i = 0; i < 500 && security(srv, "auth_failed") < 1; i++)
        usleep(10000);
    ck_assert_int_eq(security(srv, "auth_failed"), 1);
    ck_assert(log_has("closing connection from 127.0.0.1:"));
    ck_assert(log_has("authentication failed: the peer closed the connection on the store's "
                      "proof"));
    char *st;
    ck_assert_int_eq(rdzv_server_status(srv, &st), 0);
    json_t *o = json_loads(st, 0, NULL);
    rdzv_free(st);
    json_t *last = json_object_get(json_object_get(o, "security"), "last_auth_failure");
    ck_assert_ptr_nonnull(strstr(json_string_value(json_object_get(last, "peer")), "127.0.0.1:"));
    ck_assert_double_ge(json_real_value(json_object_get(last, "age_s")), 0);
    ck_assert_double_lt(json_real_value(json_object_get(last, "age_s")), 60);
    json_decref(o);
    rdzv_server_close(srv);
}
END_TEST

/* A client that skips checking the server and sends a proof made with the wrong token: the
 * server closes the connection and counts it. Raw bytes, as an attacker would send them. */
START_TEST(server_refuses_wrong_proof)
{
    rdzv_server *srv = start(token);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(rdzv_server_port(srv))};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    uint8_t cn[32] = {1}, buf[128], proof[32];
    rdzv__wbuf w = rdzv__wbuf_fixed(buf, sizeof buf);
    rdzv__put_u8(&w, RDZV_M_VALIDATE);
    rdzv__put_u32(&w, RDZV_VALIDATE_MAGIC);
    rdzv__put_u8(&w, RDZV_M_AUTH_HELLO);
    rdzv__put_vec(&w, cn, 32);
    ck_assert_int_eq(send(fd, buf, w.len, 0), (ssize_t)w.len);
    size_t got = 0;
    while (got < 8 + RDZV_AUTH_HELLO_REPLY_BYTES) {
        ssize_t r = recv(fd, buf + got, sizeof buf - got, 0);
        ck_assert_int_gt(r, 0);
        got += (size_t)r;
    }
    ck_assert_int_eq(rdzv__auth_mac(other, RDZV_AUTH_CLIENT, cn, buf + 9, proof), 0);
    w = rdzv__wbuf_fixed(buf, sizeof buf);
    rdzv__put_u8(&w, RDZV_M_AUTH_PROOF);
    rdzv__put_vec(&w, proof, 32);
    ck_assert_int_eq(send(fd, buf, w.len, 0), (ssize_t)w.len);
    ck_assert_int_le(recv(fd, buf, sizeof buf, 0), 0); /* closed, nothing answered */
    close(fd);
    ck_assert_int_eq(security(srv, "auth_failed"), 1);
    ck_assert_int_eq(security(srv, "authenticated"), 0);
    ck_assert(log_has("authentication failed: wrong proof"));
    rdzv_server_close(srv);
}
END_TEST

START_TEST(impostor_store_refused)
{
    rdzv_client *c = NULL;
    /* A store without a secret (PyTorch-like, or an impostor on the port). */
    rdzv_server *srv = start(NULL);
    ck_assert_int_eq(connect_with(srv, token, &c), -EACCES);
    ck_assert_ptr_nonnull(strstr(rdzv_client_last_error(NULL), "has no secret"));
    rdzv_server_close(srv);
    /* A store with another job's secret. */
    srv = start(other);
    ck_assert_int_eq(connect_with(srv, token, &c), -EACCES);
    ck_assert_ptr_nonnull(strstr(rdzv_client_last_error(NULL), "could not prove"));
    rdzv_server_close(srv);
}
END_TEST

/*
 * A loopback connection made by this process, its accepted end in *s and the client in *c;
 * with `dev`, the client is bound to that device first (SO_BINDTODEVICE). Returns the listener.
 */
static int loopback_pair(const char *dev, int *c, int *s)
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    *c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t al = sizeof a;
    ck_assert_int_eq(bind(l, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(l, 1), 0);
    ck_assert_int_eq(getsockname(l, (struct sockaddr *)&a, &al), 0);
    if (dev)
        ck_assert_int_eq(setsockopt(*c, SOL_SOCKET, SO_BINDTODEVICE, dev, strlen(dev)), 0);
    ck_assert_int_eq(connect(*c, (struct sockaddr *)&a, sizeof a), 0);
    *s = accept(l, NULL, NULL);
    ck_assert_int_ge(*s, 0);
    return l;
}

/* The kernel's record of who owns a local socket (inet_diag), for a connection we made. */
START_TEST(peer_owner_from_the_kernel)
{
    int c, s, l = loopback_pair(NULL, &c, &s);
    struct sockaddr_storage peer, local;
    socklen_t pl = sizeof peer, ll = sizeof local;
    getpeername(s, (struct sockaddr *)&peer, &pl);
    getsockname(s, (struct sockaddr *)&local, &ll);
    rdzv__peercred pc;
    rdzv__peercred_init(&pc);
    ck_assert_int_eq(rdzv__peercred_open(&pc), 0);
    uint32_t uid = 12345;
    ck_assert_int_eq(
        rdzv__peer_uid(&pc, (struct sockaddr *)&peer, (struct sockaddr *)&local, false, &uid), 0);
    ck_assert_uint_eq(uid, geteuid());
    ck_assert_int_eq(rdzv__addr_local(&pc, (struct sockaddr *)&peer), 1);
    /* No socket of this host has that source port: the peer is elsewhere (or gone). */
    ((struct sockaddr_in *)&peer)->sin_port = htons(1);
    ck_assert_int_eq(
        rdzv__peer_uid(&pc, (struct sockaddr *)&peer, (struct sockaddr *)&local, true, &uid),
        -ENOENT);
    /* An address routed away from this host (TEST-NET-3) is not local. */
    struct sockaddr_in far = {.sin_family = AF_INET};
    inet_pton(AF_INET, "203.0.113.7", &far.sin_addr);
    ck_assert_int_ge(rdzv__addr_local(&pc, (struct sockaddr *)&far), 0);
    ck_assert_int_ne(rdzv__addr_local(&pc, (struct sockaddr *)&far), 1);
    rdzv__peercred_close(&pc);
    rdzv__peercred_close(&pc); /* closing twice is harmless */
    close(s);
    close(c);
    close(l);
}
END_TEST

/*
 * A client bound to a device (SO_BINDTODEVICE, open to every user since Linux 5.7) is missed by
 * the exact-match query, and found by the search; once its socket is in TIME_WAIT its owner is
 * unknown (-ESTALE), never uid 0.
 */
START_TEST(peer_owner_of_a_socket_bound_to_a_device)
{
    int c, s, l = loopback_pair("lo", &c, &s);
    struct sockaddr_storage peer, local;
    socklen_t pl = sizeof peer, ll = sizeof local;
    getpeername(s, (struct sockaddr *)&peer, &pl);
    getsockname(s, (struct sockaddr *)&local, &ll);
    rdzv__peercred pc;
    rdzv__peercred_init(&pc); /* not opened: the first query opens the sockets */
    uint32_t uid = 12345;
    ck_assert_int_eq(
        rdzv__peer_uid(&pc, (struct sockaddr *)&peer, (struct sockaddr *)&local, false, &uid),
        -ENOENT);
    ck_assert_uint_eq(uid, 12345);
    ck_assert_int_eq(
        rdzv__peer_uid(&pc, (struct sockaddr *)&peer, (struct sockaddr *)&local, true, &uid), 0);
    ck_assert_uint_eq(uid, geteuid());
    /* The client closes first, then our end: its socket goes to TIME_WAIT. */
    close(c);
    char b;
    ck_assert_int_eq(read(s, &b, 1), 0);
    close(s);
    int rc = -ENOENT;
    for (int i = 0; i < 200 && rc != -ESTALE; i++) {
        rc = rdzv__peer_uid(&pc, (struct sockaddr *)&peer, (struct sockaddr *)&local, true, &uid);
        if (rc != -ESTALE)
            usleep(10000); /* polling the kernel's state change, bounded */
    }
    ck_assert_int_eq(rc, -ESTALE);
    rdzv__peercred_close(&pc);
    close(l);
}
END_TEST

/* As root: a client running as nobody is refused on loopback, logged and counted. */
START_TEST(other_user_refused)
{
    if (geteuid() != 0)
        return; /* needs root to become another user; test_security.sh covers it too */
    rdzv_server *srv = start(NULL);
    int port = rdzv_server_port(srv);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (setgid(65534) != 0 || setuid(65534) != 0)
            _exit(3);
        rdzv_client_options co;
        rdzv_client_options_init(&co);
        co.connect_timeout_ms = 300;
        rdzv_client *c;
        _exit(rdzv_client_connect("127.0.0.1", port, &co, &c) == 0 ? 0 : 1);
    }
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert(WIFEXITED(st));
    ck_assert_int_eq(WEXITSTATUS(st), 1);
    ck_assert_int_ge(security(srv, "refused_user"), 1);
    ck_assert(log_has("belongs to uid 65534"));
    /* The owner still gets in. */
    rdzv_client *c;
    ck_assert_int_eq(connect_with(srv, NULL, &c), 0);
    rdzv_client_close(c);
    rdzv_server_close(srv);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("auth");
    check_tcase(s, "handshake", 0, known_answer, right_token_both_ways,
                wrong_token_fails_on_both_sides, impostor_server_detected,
                replayed_and_reflected_proofs_fail, steps_out_of_order);
    check_tcase(s, "rules", 0, private_keys_in_every_field, private_refusal_names_the_key,
                networks_and_addresses, tokens);
    check_tcase(s, "sockets", 30, authenticated_client_reaches_private_keys,
                unauthenticated_client_kept_from_private_keys,
                refused_multi_get_logged_with_its_key, refusal_burst_logged_once_and_counted,
                wrong_token_fails_at_once_on_both_sides, server_refuses_wrong_proof,
                impostor_store_refused, peer_owner_from_the_kernel,
                peer_owner_of_a_socket_bound_to_a_device, other_user_refused);
    return s;
}

int main(void)
{
    return check_run(suite());
}
