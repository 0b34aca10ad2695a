/*
 * Tests of the launcher's etcd v3 client (launcher/etcd.h) against a real etcd: main() starts a
 * 3-member cluster of Debian's etcd-server on loopback (ports found by binding port 0), waits for
 * every member's /health within a deadline, runs the cases, then kills the members and removes
 * their data, also when a case fails or the test is stopped by a signal (the members die with
 * the test process through PR_SET_PDEATHSIG in any case). Beside it runs a one-member cluster
 * with TLS on its client port and client certificates required, its CA and certificates made by
 * the openssl program (without it, the TLS case says so and checks nothing).
 *
 * The cases: puts, gets, ranges and deletes with revisions; a transaction's success and failure
 * branches; a lease's expiry deleting its key (seen by a watch, not a poll), keepalives keeping
 * a key alive, revocation; watches returning a change made by another process, -ESTALE after a
 * compaction, and -ETIMEDOUT when nothing changes; failover past a closed port and past a member
 * that accepts but never answers; the sentences for an unreachable cluster and a malformed
 * endpoint list; https with the right certificates, and refused with a foreign CA, without a
 * client certificate and over plain http; and, last, a member killed under a client that then
 * carries on with the others.
 *
 * Exit 77 where the etcd binary is missing or cannot be executed. Each case runs in its own
 * forked process under a timeout; the one paced loop is the keepalive loop, which renews as an
 * agent would and uses a 500 ms watch (which must time out) as its pace.
 */
#include <check.h>
#include <curl/curl.h>

#include <errno.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
#include <arpa/inet.h>

#include "check_main.h"
#include "etcd.h"
#include "monoclock.h"

#define MEMBERS 3
#define TLS MEMBERS /* the index of the TLS member, a cluster of its own */

static char data_dir[64];
static pid_t member_pid[MEMBERS + 1];
static int client_port[MEMBERS + 1], peer_port[MEMBERS + 1];
static char endpoints[256]; /* every member of the plain cluster, in order */
static char member_ep[MEMBERS + 1][32];
static bool have_tls; /* the TLS member runs (openssl made its certificates) */
static pid_t owner;   /* the process that started the cluster */

/* ------------------------------------------------------------------------------------------ */
/* The cluster                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* Binds n loopback sockets to port 0 at once (so the ports differ), reads the ports, closes. */
static int free_ports(int *ports, int n)
{
    int fds[2 * MEMBERS + 2];
    for (int i = 0; i < n; i++) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof a;
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        if (fds[i] < 0 || bind(fds[i], (struct sockaddr *)&a, sizeof a) < 0 ||
            getsockname(fds[i], (struct sockaddr *)&a, &len) < 0)
            return -1;
        ports[i] = ntohs(a.sin_port);
    }
    for (int i = 0; i < n; i++)
        close(fds[i]);
    return 0;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void cluster_stop(void)
{
    if (getpid() != owner)
        return; /* a forked case exiting */
    for (int i = 0; i <= MEMBERS; i++)
        if (member_pid[i] > 0) {
            kill(member_pid[i], SIGKILL);
            waitpid(member_pid[i], NULL, 0);
            member_pid[i] = 0;
        }
    if (data_dir[0]) {
        nftw(data_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        data_dir[0] = '\0';
    }
}

static void on_signal(int sig)
{
    cluster_stop();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Keeps the first 255 bytes of an answer in arg (a 256-byte buffer). */
static size_t keep_head(char *p, size_t size, size_t n, void *arg)
{
    char *body = arg;
    size_t have = strlen(body), take = size * n;
    if (take > 255 - have)
        take = 255 - have;
    memcpy(body + have, p, take);
    body[have + take] = '\0';
    return size * n;
}

/* A file of the TLS member's certificates, in data_dir. */
static const char *tls_file(const char *name)
{
    static char path[4][128];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, sizeof path[0], "%s/%s", data_dir, name);
    return p;
}

/* Whether member i says {"health":"true"}. */
static bool member_healthy(int i)
{
    char url[64], body[256] = "";
    snprintf(url, sizeof url, "%s://%s/health", i == TLS ? "https" : "http", member_ep[i]);
    CURL *c = curl_easy_init();
    if (!c)
        return false;
    if (i == TLS) {
        curl_easy_setopt(c, CURLOPT_CAINFO, tls_file("ca.pem"));
        curl_easy_setopt(c, CURLOPT_SSLCERT, tls_file("client.pem"));
        curl_easy_setopt(c, CURLOPT_SSLKEY, tls_file("client.key"));
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 1000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, keep_head);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, (void *)body);
    bool ok = curl_easy_perform(c) == CURLE_OK && strstr(body, "\"true\"");
    curl_easy_cleanup(c);
    return ok;
}

static void print_log(int i)
{
    char path[128], line[512];
    snprintf(path, sizeof path, "%s/member%d.log", data_dir, i);
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    fprintf(stderr, "--- %s (last lines) ---\n", path);
    long n = 0;
    while (fgets(line, sizeof line, f))
        n++;
    rewind(f);
    for (long k = 0; fgets(line, sizeof line, f); k++)
        if (k >= n - 15)
            fputs(line, stderr);
    fclose(f);
}

/*
 * A CA, a certificate for 127.0.0.1 signed by it and a client certificate, in data_dir, with the
 * openssl program. Returns whether they were made.
 */
static bool make_certificates(void)
{
    char script[2048];
    snprintf(script, sizeof script,
             "cd '%s' && k='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes' && "
             "openssl req -x509 $k -keyout ca.key -out ca.pem -days 2 -subj /CN=ddprun-test-ca && "
             "openssl req $k -keyout server.key -out server.csr -subj /CN=127.0.0.1 && "
             "printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' > "
             "server.ext && "
             "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
             "-out server.pem -days 2 -extfile server.ext && "
             "openssl req $k -keyout client.key -out client.csr -subj /CN=ddprun-client && "
             "printf 'extendedKeyUsage=clientAuth\n' > client.ext && "
             "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
             "-out client.pem -days 2 -extfile client.ext",
             data_dir);
    char cmd[2200];
    snprintf(cmd, sizeof cmd, "( %s ) >'%s/openssl.log' 2>&1", script, data_dir);
    return system(cmd) == 0;
}

/*
 * Starts member i of `cluster` (its name "m<i>"), with TLS on its client port for the TLS
 * member. Reports a failed exec through the pipe fail_fd.
 */
static pid_t start_member(const char *etcd, int i, const char *cluster, int fail_fd)
{
    char name[8], dir[128], log[128], curl_[64], purl[64];
    snprintf(name, sizeof name, "m%d", i);
    snprintf(dir, sizeof dir, "%s/m%d", data_dir, i);
    snprintf(log, sizeof log, "%s/member%d.log", data_dir, i);
    snprintf(curl_, sizeof curl_, "%s://%s", i == TLS ? "https" : "http", member_ep[i]);
    snprintf(purl, sizeof purl, "http://127.0.0.1:%d", peer_port[i]);
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
    }
    const char *argv[40] = {etcd,
                            "--name",
                            name,
                            "--data-dir",
                            dir,
                            "--listen-client-urls",
                            curl_,
                            "--advertise-client-urls",
                            curl_,
                            "--listen-peer-urls",
                            purl,
                            "--initial-advertise-peer-urls",
                            purl,
                            "--initial-cluster",
                            cluster,
                            "--initial-cluster-state",
                            "new",
                            "--initial-cluster-token",
                            i == TLS ? "tls" : "plain"};
    if (i == TLS) {
        const char *tls[] = {"--cert-file",          tls_file("server.pem"), "--key-file",
                             tls_file("server.key"), "--client-cert-auth",   "--trusted-ca-file",
                             tls_file("ca.pem")};
        memcpy(argv + 19, tls, sizeof tls);
    }
    execvp(etcd, (char *const *)argv);
    int err = errno;
    if (write(fail_fd, &err, sizeof err) < 0)
        _exit(127);
    _exit(127);
}

/*
 * Starts the plain cluster's members and, where openssl made certificates, the TLS member, and
 * waits (30 s at most) until each is healthy. Returns 0, 77 (etcd cannot run here) or 1.
 */
static int cluster_start(void)
{
    const char *etcd = getenv("ETCD") ? getenv("ETCD") : "etcd";
    int ports[2 * MEMBERS + 2];
    strcpy(data_dir, "/tmp/ddprun-etcd-XXXXXX");
    if (!mkdtemp(data_dir)) {
        data_dir[0] = '\0';
        perror("mkdtemp");
        return 1;
    }
    if (free_ports(ports, 2 * MEMBERS + 2) < 0) {
        perror("free ports");
        return 1;
    }
    char cluster[512] = "", tls_cluster[64];
    for (int i = 0; i <= MEMBERS; i++) {
        client_port[i] = ports[2 * i];
        peer_port[i] = ports[2 * i + 1];
        snprintf(member_ep[i], sizeof member_ep[i], "127.0.0.1:%d", client_port[i]);
        if (i == TLS)
            break;
        size_t l = strlen(cluster);
        snprintf(cluster + l, sizeof cluster - l, "%sm%d=http://127.0.0.1:%d", i ? "," : "", i,
                 peer_port[i]);
        l = strlen(endpoints);
        snprintf(endpoints + l, sizeof endpoints - l, "%s%s", i ? "," : "", member_ep[i]);
    }
    snprintf(tls_cluster, sizeof tls_cluster, "m%d=http://127.0.0.1:%d", TLS, peer_port[TLS]);
    have_tls = make_certificates();
    if (!have_tls)
        fprintf(stderr, "openssl could not make certificates (%s/openssl.log): no TLS member\n",
                data_dir);

    int exec_fail[2];
    if (pipe2(exec_fail, O_CLOEXEC) < 0)
        return 1;
    for (int i = 0; i < MEMBERS + have_tls; i++) {
        member_pid[i] = start_member(etcd, i, i == TLS ? tls_cluster : cluster, exec_fail[1]);
        if (member_pid[i] < 0)
            return 1;
    }
    close(exec_fail[1]);
    int err = 0;
    ssize_t got = read(exec_fail[0], &err, sizeof err); /* EOF once every member exec'd */
    close(exec_fail[0]);
    if (got == (ssize_t)sizeof err) {
        fprintf(stderr, "cannot run %s: %s: skipping\n", etcd, strerror(err));
        return 77;
    }
    int64_t deadline = mono_deadline_ns(30000);
    for (int i = 0; i < MEMBERS + have_tls; i++) {
        while (!member_healthy(i)) {
            int st;
            if (waitpid(member_pid[i], &st, WNOHANG) == member_pid[i]) {
                member_pid[i] = 0;
                fprintf(stderr, "etcd member %d exited before it was healthy\n", i);
                print_log(i);
                return 1;
            }
            if (mono_ms_left(deadline) == 0) {
                fprintf(stderr, "etcd member %d not healthy within 30 s\n", i);
                print_log(i);
                return 1;
            }
            struct timespec ts = {0, 50 * 1000 * 1000}; /* the readiness poll's pace */
            nanosleep(&ts, NULL);
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static ddprun_etcd *client_for(const char *eps)
{
    ddprun_etcd_options o;
    ddprun_etcd_options_init(&o);
    ddprun_etcd *e = NULL;
    int rc = ddprun_etcd_create(eps, &o, &e);
    ck_assert_msg(rc == 0, "create(%s): %d %s", eps, rc, ddprun_etcd_last_error(NULL));
    ck_assert_str_eq(ddprun_etcd_last_error(e), "");
    return e;
}

static ddprun_etcd *client(void)
{
    return client_for(endpoints);
}

#define OK(e, call)                                                                                \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        ck_assert_msg(rc_ == 0, "%s: %d (%s)", #call, rc_, ddprun_etcd_last_error(e));             \
    } while (0)

static void put_str(ddprun_etcd *e, const char *key, const char *value, int64_t lease, int64_t *rev)
{
    OK(e, ddprun_etcd_put(e, key, value, strlen(value), lease, rev));
}

/* The value of key, which must exist, compared with want. */
static void expect_value(ddprun_etcd *e, const char *key, const char *want)
{
    ddprun_etcd_kv *kv = NULL;
    OK(e, ddprun_etcd_get(e, key, &kv, NULL));
    ck_assert_str_eq(kv->key, key);
    ck_assert_str_eq(kv->value, want);
    ck_assert_uint_eq(kv->value_len, strlen(want));
    ddprun_etcd_kvs_free(kv, 1);
}

static void expect_absent(ddprun_etcd *e, const char *key)
{
    ddprun_etcd_kv *kv = NULL;
    int64_t rev = 0;
    int rc = ddprun_etcd_get(e, key, &kv, &rev);
    ck_assert_msg(rc == -ENOENT, "get %s: %d, expected -ENOENT", key, rc);
    ck_assert_ptr_null(kv);
    ck_assert_int_gt(rev, 0);
    ck_assert_ptr_nonnull(strstr(ddprun_etcd_last_error(e), "no such key"));
}

/* ------------------------------------------------------------------------------------------ */
/* Keys                                                                                        */
/* ------------------------------------------------------------------------------------------ */

START_TEST(test_put_get_range_delete)
{
    ddprun_etcd *e = client();
    int64_t r1 = 0, r2 = 0, r3 = 0, rev = 0;
    OK(e, ddprun_etcd_delete(e, "/t/kv/", true, NULL));
    put_str(e, "/t/kv/b", "two", 0, &r1);
    put_str(e, "/t/kv/a", "one", 0, &r2);
    put_str(e, "/t/kv/a", "uno", 0, &r3);
    ck_assert_int_gt(r2, r1);
    ck_assert_int_gt(r3, r2);
    put_str(e, "/t/kvx", "outside the prefix", 0, NULL);

    ddprun_etcd_kv *kv = NULL;
    OK(e, ddprun_etcd_get(e, "/t/kv/a", &kv, &rev));
    ck_assert_str_eq(kv->value, "uno");
    ck_assert_int_eq(kv->create_revision, r2);
    ck_assert_int_eq(kv->mod_revision, r3);
    ck_assert_int_eq(kv->version, 2);
    ck_assert_int_eq(kv->lease, 0);
    ck_assert_int_ge(rev, r3);
    ddprun_etcd_kvs_free(kv, 1);
    expect_absent(e, "/t/kv/none");

    /* Binary values, NULs included, and the empty value. */
    const char bin[] = {'x', 0, (char)0xff, '\n', 0};
    OK(e, ddprun_etcd_put(e, "/t/kv/bin", bin, sizeof bin, 0, NULL));
    OK(e, ddprun_etcd_get(e, "/t/kv/bin", &kv, NULL));
    ck_assert_uint_eq(kv->value_len, sizeof bin);
    ck_assert_mem_eq(kv->value, bin, sizeof bin);
    ddprun_etcd_kvs_free(kv, 1);
    OK(e, ddprun_etcd_put(e, "/t/kv/empty", NULL, 0, 0, NULL));
    expect_value(e, "/t/kv/empty", "");

    size_t n = 0;
    OK(e, ddprun_etcd_range(e, "/t/kv/", &kv, &n, &rev));
    ck_assert_uint_eq(n, 4);
    ck_assert_str_eq(kv[0].key, "/t/kv/a");
    ck_assert_str_eq(kv[1].key, "/t/kv/b");
    ck_assert_str_eq(kv[1].value, "two");
    ck_assert_str_eq(kv[2].key, "/t/kv/bin");
    ck_assert_str_eq(kv[3].key, "/t/kv/empty");
    ddprun_etcd_kvs_free(kv, n);

    int64_t deleted = -1;
    OK(e, ddprun_etcd_delete(e, "/t/kv/b", false, &deleted));
    ck_assert_int_eq(deleted, 1);
    OK(e, ddprun_etcd_delete(e, "/t/kv/b", false, &deleted));
    ck_assert_int_eq(deleted, 0);
    expect_absent(e, "/t/kv/b");
    OK(e, ddprun_etcd_delete(e, "/t/kv/", true, &deleted));
    ck_assert_int_eq(deleted, 3);
    OK(e, ddprun_etcd_range(e, "/t/kv/", &kv, &n, NULL));
    ck_assert_uint_eq(n, 0);
    ck_assert_ptr_null(kv);
    expect_value(e, "/t/kvx", "outside the prefix");

    /* Bad arguments, with a sentence. */
    ck_assert_int_eq(ddprun_etcd_put(e, "", "v", 1, 0, NULL), -EINVAL);
    ck_assert_ptr_nonnull(strstr(ddprun_etcd_last_error(e), "empty key"));
    ck_assert_int_eq(ddprun_etcd_get(e, NULL, &kv, NULL), -EINVAL);
    ck_assert_int_eq(ddprun_etcd_put(e, "/t/kv/x", "v", 1, 12345, NULL), -ENOENT);
    ck_assert_ptr_nonnull(strstr(ddprun_etcd_last_error(e), "lease not found"));
    ddprun_etcd_close(e);
}
END_TEST

START_TEST(test_txn)
{
    ddprun_etcd *e = client();
    OK(e, ddprun_etcd_delete(e, "/t/txn/", true, NULL));

    /* Create-if-absent: the first succeeds, the second runs the failure branch. */
    ddprun_etcd_compare absent = {.key = "/t/txn/state",
                                  .target = DDPRUN_ETCD_VERSION,
                                  .result = DDPRUN_ETCD_EQUAL,
                                  .number = 0};
    ddprun_etcd_op create = {
        .kind = DDPRUN_ETCD_OP_PUT, .key = "/t/txn/state", .value = "open", .value_len = 4};
    ddprun_etcd_op note = {
        .kind = DDPRUN_ETCD_OP_PUT, .key = "/t/txn/lost", .value = "1", .value_len = 1};
    bool ok = false;
    int64_t rev = 0;
    OK(e, ddprun_etcd_txn(e, &absent, 1, &create, 1, &note, 1, &ok, &rev));
    ck_assert(ok);
    expect_value(e, "/t/txn/state", "open");
    expect_absent(e, "/t/txn/lost");
    OK(e, ddprun_etcd_txn(e, &absent, 1, &create, 1, &note, 1, &ok, NULL));
    ck_assert(!ok);
    expect_value(e, "/t/txn/lost", "1");

    /* Compare the value and the mod revision, then put one key and delete another. */
    ddprun_etcd_kv *kv = NULL;
    OK(e, ddprun_etcd_get(e, "/t/txn/state", &kv, NULL));
    ddprun_etcd_compare both[] = {
        {.key = "/t/txn/state",
         .target = DDPRUN_ETCD_VALUE,
         .result = DDPRUN_ETCD_EQUAL,
         .value = "open",
         .value_len = 4},
        {.key = "/t/txn/state",
         .target = DDPRUN_ETCD_MOD,
         .result = DDPRUN_ETCD_EQUAL,
         .number = kv->mod_revision},
    };
    ck_assert_int_eq(kv->mod_revision, rev);
    ddprun_etcd_kvs_free(kv, 1);
    ddprun_etcd_op close_ops[] = {
        {.kind = DDPRUN_ETCD_OP_PUT, .key = "/t/txn/state", .value = "closed", .value_len = 6},
        {.kind = DDPRUN_ETCD_OP_DELETE, .key = "/t/txn/lost"},
    };
    OK(e, ddprun_etcd_txn(e, both, 2, close_ops, 2, NULL, 0, &ok, NULL));
    ck_assert(ok);
    expect_value(e, "/t/txn/state", "closed");
    expect_absent(e, "/t/txn/lost");
    /* The same comparisons fail now (value and revision moved on); nothing is applied. */
    OK(e, ddprun_etcd_txn(e, both, 2, close_ops, 2, NULL, 0, &ok, NULL));
    ck_assert(!ok);
    OK(e, ddprun_etcd_txn(e, &both[1], 1, close_ops, 1, NULL, 0, &ok, NULL));
    ck_assert(!ok);

    /* GREATER on the version, and a prefix delete in a branch. */
    ddprun_etcd_compare newer = {.key = "/t/txn/state",
                                 .target = DDPRUN_ETCD_VERSION,
                                 .result = DDPRUN_ETCD_GREATER,
                                 .number = 1};
    ddprun_etcd_op wipe = {.kind = DDPRUN_ETCD_OP_DELETE_PREFIX, .key = "/t/txn/"};
    OK(e, ddprun_etcd_txn(e, &newer, 1, &wipe, 1, NULL, 0, &ok, NULL));
    ck_assert(ok);
    expect_absent(e, "/t/txn/state");

    /* Refused arguments. */
    ddprun_etcd_compare bad = absent;
    bad.target = 9;
    ck_assert_int_eq(ddprun_etcd_txn(e, &bad, 1, NULL, 0, NULL, 0, &ok, NULL), -EINVAL);
    ck_assert_ptr_nonnull(strstr(ddprun_etcd_last_error(e), "comparison 0"));
    ddprun_etcd_op twice[] = {create, create};
    ck_assert_int_eq(ddprun_etcd_txn(e, NULL, 0, twice, 2, NULL, 0, &ok, NULL), -EINVAL);
    ck_assert_ptr_nonnull(strstr(ddprun_etcd_last_error(e), "duplicate key"));
    ddprun_etcd_close(e);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Leases and watches                                                                          */
/* ------------------------------------------------------------------------------------------ */

/* Grants a 2 s lease (*id, *ttl as granted) and puts key = "yes" bound to it at *rev. */
static void leased_key(ddprun_etcd *e, const char *key, int64_t *id, int64_t *ttl, int64_t *rev)
{
    OK(e, ddprun_etcd_lease_grant(e, 2, id, ttl));
    ck_assert_int_ne(*id, 0);
    ck_assert_int_ge(*ttl, 2);
    put_str(e, key, "yes", *id, rev);
    ddprun_etcd_kv *kv = NULL;
    OK(e, ddprun_etcd_get(e, key, &kv, NULL));
    ck_assert_int_eq(kv->lease, *id);
    ddprun_etcd_kvs_free(kv, 1);
}

START_TEST(test_lease_expiry)
{
    ddprun_etcd *e = client();
    int64_t id = 0, ttl = 0, rev = 0;
    leased_key(e, "/t/lease/alive", &id, &ttl, &rev);

    /* Without keepalives the lease ends within its TTL plus etcd's expiry check; a watch sees
     * the key go. */
    int64_t t0 = mono_now_ns();
    ddprun_etcd_event ev = {0};
    OK(e, ddprun_etcd_watch(e, "/t/lease/alive", false, rev, 15000, &ev));
    double waited = (double)(mono_now_ns() - t0) / 1e9;
    ck_assert_int_eq(ev.type, DDPRUN_ETCD_DELETE);
    ck_assert_str_eq(ev.kv.key, "/t/lease/alive");
    ck_assert_int_gt(ev.kv.mod_revision, rev);
    ck_assert_msg(waited > 0.5 && waited < 10, "the lease ended after %.2f s", waited);
    ddprun_etcd_event_clear(&ev);
    expect_absent(e, "/t/lease/alive");

    ck_assert_int_eq(ddprun_etcd_lease_keepalive(e, id, NULL), -ENOENT);
    ck_assert_ptr_nonnull(strstr(ddprun_etcd_last_error(e), "expired"));
    ck_assert_int_eq(ddprun_etcd_lease_revoke(e, id), -ENOENT);
    ck_assert_int_eq(ddprun_etcd_lease_grant(e, 0, &id, NULL), -EINVAL);
    ddprun_etcd_close(e);
}
END_TEST

START_TEST(test_lease_keepalive_revoke)
{
    ddprun_etcd *e = client();
    int64_t id = 0, rev = 0, granted = 0;
    leased_key(e, "/t/keep/alive", &id, &granted, &rev);
    /* Renew every 500 ms for 5 s, past twice the TTL; each pause is a watch that must not see
     * the key change. */
    int64_t until = mono_deadline_ns(5000);
    int renewals = 0;
    while (mono_ms_left(until) > 0) {
        ddprun_etcd_event ev = {0};
        int rc = ddprun_etcd_watch(e, "/t/keep/alive", false, rev, 500, &ev);
        ck_assert_msg(rc == -ETIMEDOUT, "watch during keepalives: %d (%s)", rc,
                      ddprun_etcd_last_error(e));
        ck_assert_ptr_nonnull(strstr(ddprun_etcd_last_error(e), "within 500 ms"));
        int64_t ttl = 0;
        OK(e, ddprun_etcd_lease_keepalive(e, id, &ttl));
        ck_assert_int_eq(ttl, granted);
        renewals++;
    }
    ck_assert_int_ge(renewals, 5);
    expect_value(e, "/t/keep/alive", "yes");
    OK(e, ddprun_etcd_lease_revoke(e, id));
    expect_absent(e, "/t/keep/alive");
    ddprun_etcd_close(e);
}
END_TEST

/* Compacts the store's history up to revision rev (the client has no call for it). */
static void compact(int64_t rev)
{
    char url[64], body[64], answer[256] = "";
    snprintf(url, sizeof url, "http://%s/v3/kv/compaction", member_ep[0]);
    snprintf(body, sizeof body, "{\"revision\": %lld, \"physical\": true}", (long long)rev);
    CURL *c = curl_easy_init();
    ck_assert_ptr_nonnull(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, keep_head);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, (void *)answer);
    long status = 0;
    ck_assert_int_eq(curl_easy_perform(c), CURLE_OK);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    ck_assert_msg(status == 200, "compaction: HTTP %ld: %s", status, answer);
}

START_TEST(test_watch)
{
    ddprun_etcd *e = client();
    int64_t rev = 0;
    OK(e, ddprun_etcd_delete(e, "/t/watch/", true, NULL));
    put_str(e, "/t/watch/start", "0", 0, &rev);

    /* Another process changes the key; whether that happens before or after the watch is set
     * up, a watch after `rev` returns it. */
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        ddprun_etcd *w = NULL;
        int rc = ddprun_etcd_create(endpoints, NULL, &w);
        if (rc == 0)
            rc = ddprun_etcd_put(w, "/t/watch/k", "from the child", 14, 0, NULL);
        ddprun_etcd_close(w);
        _exit(rc == 0 ? 0 : 1);
    }
    ddprun_etcd_event ev = {0};
    OK(e, ddprun_etcd_watch(e, "/t/watch/k", false, rev, 10000, &ev));
    ck_assert_int_eq(ev.type, DDPRUN_ETCD_PUT);
    ck_assert_str_eq(ev.kv.key, "/t/watch/k");
    ck_assert_str_eq(ev.kv.value, "from the child");
    ck_assert_int_gt(ev.kv.mod_revision, rev);
    int64_t put_rev = ev.kv.mod_revision;
    ddprun_etcd_event_clear(&ev);
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);

    /* Prefix watches, from history: the delete after the put. */
    int64_t deleted = 0;
    int rc;
    OK(e, ddprun_etcd_delete(e, "/t/watch/k", false, &deleted));
    OK(e, ddprun_etcd_watch(e, "/t/watch/", true, put_rev, 5000, &ev));
    ck_assert_int_eq(ev.type, DDPRUN_ETCD_DELETE);
    ck_assert_str_eq(ev.kv.key, "/t/watch/k");
    ddprun_etcd_event_clear(&ev);

    /* A watch after a compacted revision: -ESTALE. */
    put_str(e, "/t/watch/c", "1", 0, NULL);
    int64_t now = 0;
    put_str(e, "/t/watch/c", "2", 0, &now);
    compact(now);
    rc = ddprun_etcd_watch(e, "/t/watch/c", false, put_rev, 5000, &ev);
    ck_assert_msg(rc == -ESTALE, "watch after a compacted revision: %d (%s)", rc,
                  ddprun_etcd_last_error(e));
    ck_assert_ptr_nonnull(strstr(ddprun_etcd_last_error(e), "compacted"));

    /* Nothing changes: -ETIMEDOUT after about the timeout, with a sentence. */
    int64_t t0 = mono_now_ns();
    rc = ddprun_etcd_watch(e, "/t/watch/quiet", false, 0, 300, &ev);
    double took = (double)(mono_now_ns() - t0) / 1e9;
    ck_assert_int_eq(rc, -ETIMEDOUT);
    ck_assert_msg(took >= 0.25 && took < 3, "the watch timed out after %.2f s", took);
    ck_assert_ptr_nonnull(strstr(ddprun_etcd_last_error(e), "no change"));
    ck_assert_ptr_null(ev.kv.key);
    /* The client goes on after a stopped stream. */
    put_str(e, "/t/watch/after", "1", 0, NULL);
    expect_value(e, "/t/watch/after", "1");
    ck_assert_int_eq(ddprun_etcd_watch(e, "/t/watch/x", false, 0, -1, &ev), -EINVAL);
    ddprun_etcd_close(e);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Endpoints                                                                                   */
/* ------------------------------------------------------------------------------------------ */

/* A loopback port nothing listens on (bound, read back, closed). */
static int closed_port(void)
{
    int p = 0;
    ck_assert_int_eq(free_ports(&p, 1), 0);
    return p;
}

START_TEST(test_failover)
{
    char eps[128];
    snprintf(eps, sizeof eps, "127.0.0.1:%d, %s", closed_port(), member_ep[1]);
    ddprun_etcd *e = client_for(eps);
    ck_assert_str_eq(ddprun_etcd_endpoint(e), member_ep[1]);
    put_str(e, "/t/failover", "ok", 0, NULL);
    expect_value(e, "/t/failover", "ok");
    ddprun_etcd_close(e);
}
END_TEST

/*
 * A loopback listener that never accepts (the kernel completes connections into its backlog):
 * a member that is up but does not answer. Its port in *p; the socket is returned.
 */
static int silent_listener(int *p)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(fd, 16), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *p = ntohs(a.sin_port);
    return fd;
}

START_TEST(test_failover_silent)
{
    int p;
    int fd = silent_listener(&p);
    char eps[128];
    snprintf(eps, sizeof eps, "127.0.0.1:%d,%s", p, member_ep[2]);
    ddprun_etcd_options o;
    ddprun_etcd_options_init(&o);
    o.timeout_ms = 500;
    ddprun_etcd *e = NULL;
    int64_t t0 = mono_now_ns();
    int rc = ddprun_etcd_create(eps, &o, &e);
    double took = (double)(mono_now_ns() - t0) / 1e9;
    ck_assert_msg(rc == 0, "create(%s): %d %s", eps, rc, ddprun_etcd_last_error(NULL));
    ck_assert_msg(took >= 0.45 && took < 3, "creation took %.2f s", took);
    ck_assert_str_eq(ddprun_etcd_endpoint(e), member_ep[2]);
    ddprun_etcd_close(e);

    /* Alone, the silent member fails creation within the timeout, with its name and the time. */
    snprintf(eps, sizeof eps, "127.0.0.1:%d", p);
    ck_assert_int_eq(ddprun_etcd_create(eps, &o, &e), -ETIMEDOUT);
    const char *msg = ddprun_etcd_last_error(NULL);
    ck_assert_msg(strstr(msg, eps) && strstr(msg, "0.5 s)"), "sentence: %s", msg);
    close(fd);
}
END_TEST

START_TEST(test_unreachable)
{
    int a = closed_port(), b = closed_port();
    char eps[128], ea[32], eb[32];
    snprintf(ea, sizeof ea, "127.0.0.1:%d", a);
    snprintf(eb, sizeof eb, "127.0.0.1:%d", b);
    snprintf(eps, sizeof eps, "%s,%s", ea, eb);
    ddprun_etcd *e = NULL;
    int64_t t0 = mono_now_ns();
    ck_assert_int_eq(ddprun_etcd_create(eps, NULL, &e), -ECONNREFUSED);
    ck_assert_msg((mono_now_ns() - t0) / 1000000 < 3000, "refusals took over 3 s");
    ck_assert_ptr_null(e);
    const char *msg = ddprun_etcd_last_error(NULL);
    ck_assert_msg(strstr(msg, "no etcd member answered") && strstr(msg, ea) && strstr(msg, eb) &&
                      strstr(msg, " s)"),
                  "sentence: %s", msg);

    /* Host names and bracketed IPv6 addresses, named as given. */
    snprintf(eps, sizeof eps, " localhost:%d ,[::1]:%d", a, b);
    ck_assert_int_lt(ddprun_etcd_create(eps, NULL, &e), 0);
    msg = ddprun_etcd_last_error(NULL);
    snprintf(ea, sizeof ea, "localhost:%d (", a);
    snprintf(eb, sizeof eb, "[::1]:%d (", b);
    ck_assert_msg(strstr(msg, ea) && strstr(msg, eb), "sentence: %s", msg);

    /* Malformed lists name the member at fault. */
    static const char *const bad[] = {"",     "127.0.0.1:99999",       "127.0.0.1:2379,",
                                      "[::1", "http://127.0.0.1:2379", "host:port"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(ddprun_etcd_create(bad[i], NULL, &e) == -EINVAL, "'%s' accepted", bad[i]);
        ck_assert_msg(strstr(ddprun_etcd_last_error(NULL), "HOST[:PORT]"), "'%s': %s", bad[i],
                      ddprun_etcd_last_error(NULL));
    }
    ddprun_etcd_options o;
    ddprun_etcd_options_init(&o);
    o.timeout_ms = 0;
    ck_assert_int_eq(ddprun_etcd_create(endpoints, &o, &e), -EINVAL);
    ck_assert_ptr_nonnull(strstr(ddprun_etcd_last_error(NULL), "timeout"));
}
END_TEST

START_TEST(test_tls)
{
    if (!have_tls)
        return; /* said in main() */
    ddprun_etcd_options o;
    ddprun_etcd_options_init(&o);
    o.protocol = DDPRUN_ETCD_HTTPS;
    o.cacert = tls_file("ca.pem");
    o.cert = tls_file("client.pem");
    o.key = tls_file("client.key");
    ddprun_etcd *e = NULL;
    int rc = ddprun_etcd_create(member_ep[TLS], &o, &e);
    ck_assert_msg(rc == 0, "https: %d %s", rc, ddprun_etcd_last_error(NULL));
    put_str(e, "/t/tls", "private", 0, NULL);
    expect_value(e, "/t/tls", "private");
    ddprun_etcd_close(e);

    /* Refusals: a CA that did not sign the member's certificate (the system's), no client
     * certificate, plain HTTP to the TLS port. */
    struct {
        const char *cacert, *cert, *key;
        int protocol, rc;
        const char *says;
    } refused[] = {
        {NULL, o.cert, o.key, DDPRUN_ETCD_HTTPS, -EACCES, "certificate"},
        {o.cacert, NULL, NULL, DDPRUN_ETCD_HTTPS, -EACCES, "certificate"},
        {NULL, NULL, NULL, DDPRUN_ETCD_HTTP, -ECONNRESET, "expect https"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        o.cacert = refused[i].cacert;
        o.cert = refused[i].cert;
        o.key = refused[i].key;
        o.protocol = refused[i].protocol;
        rc = ddprun_etcd_create(member_ep[TLS], &o, &e);
        const char *msg = ddprun_etcd_last_error(NULL);
        ck_assert_msg(rc == refused[i].rc && strstr(msg, refused[i].says),
                      "case %zu: %d, expected %d: %s", i, rc, refused[i].rc, msg);
    }
    o.key = "k.pem";
    o.cert = NULL;
    ck_assert_int_eq(ddprun_etcd_create(member_ep[TLS], &o, &e), -EINVAL);
}
END_TEST

/* Last, as it changes the cluster: a member dies under a client, which carries on elsewhere. */
START_TEST(test_member_lost)
{
    ddprun_etcd *e = client();
    ck_assert_str_eq(ddprun_etcd_endpoint(e), member_ep[0]);
    put_str(e, "/t/lost/before", "1", 0, NULL);
    ck_assert_int_eq(kill(member_pid[0], SIGKILL), 0);
    /* The first call may go out on the connection the member's death resets (its outcome is
     * then unknown, and the next call goes to the next member), and the survivors may be electing
     * a leader: retry those failures for 20 s, as a caller would. */
    int64_t deadline = mono_deadline_ns(20000);
    int rc, tries = 0;
    do
        rc = ddprun_etcd_put(e, "/t/lost/after", "2", 1, 0, NULL), tries++;
    while ((rc == -EAGAIN || rc == -ETIMEDOUT || rc == -ECONNRESET) && mono_ms_left(deadline) > 0);
    ck_assert_msg(rc == 0, "put after the loss: %d (%s)", rc, ddprun_etcd_last_error(e));
    ck_assert_str_ne(ddprun_etcd_endpoint(e), member_ep[0]);
    ck_assert_msg(tries <= 3, "%d tries", tries);
    expect_value(e, "/t/lost/before", "1");
    expect_value(e, "/t/lost/after", "2");
    ddprun_etcd_close(e);
}
END_TEST

int main(void)
{
    owner = getpid();
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return 1;
    atexit(cluster_stop);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    int rc = cluster_start();
    if (rc != 0) {
        cluster_stop();
        return rc;
    }
    Suite *s = suite_create("etcd");
    check_tcase(s, "kv", 30, test_put_get_range_delete, test_txn);
    check_tcase(s, "lease", 40, test_lease_expiry, test_lease_keepalive_revoke);
    check_tcase(s, "watch", 30, test_watch);
    check_tcase(s, "tls", 30, test_tls);
    check_tcase(s, "endpoints", 40, test_failover, test_failover_silent, test_unreachable,
                test_member_lost);
    rc = check_run(s);
    cluster_stop();
    return rc;
}
