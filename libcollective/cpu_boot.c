/*
 * The cpu backend's bootstrap and teardown: everything it does through the store, once per
 * communicator, before any operation runs.
 *
 * Every rank reads its reduction algorithm from COLL_CPU_ALGO (cpu.c's table of reductions),
 * opens its TCP listener and publishes a record under "<prefix>/cpu/<rank>" (JSON: its host
 * identity, hostname, address, port, pid and algorithm), then waits for every rank's record and
 * reads them all; ranks that chose different algorithms fail here rather than in a collective. The
 * host identity is the kernel's boot id plus the identities of the mount, pid and network
 * namespaces: ranks that share these share /dev/shm and can see each other's pids. layout.c turns
 * the identities into hosts, leaders and local ranks. The leader of each host creates the host's
 * shared segment (cpu.h describes its layout) and publishes its name under
 * "<prefix>/cpu/shm/<host>"; the others wait for the name and map it. Finally the leaders connect
 * their TCP ring, so that a broken network shows at init rather than in the first collective.
 *
 * Not here: the algorithms (cpu.c), the grouping rules (layout.c), the segment's primitives
 * (shm.c) and sockets (tcp.c). Errors are returned with a sentence in the caller's buffer and,
 * on a timeout, the rank that did not arrive in *culprit; nothing is printed.
 */
#include "cpu.h"
#include "rdzv.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void read_line(const char *path, char *buf, size_t cap)
{
    buf[0] = 0;
    FILE *f = fopen(path, "re");
    if (!f)
        return;
    if (fgets(buf, (int)cap, f))
        buf[strcspn(buf, "\n")] = 0;
    fclose(f);
}

static void ns_id(const char *ns, char *buf, size_t cap)
{
    char path[64];
    struct stat st;
    snprintf(path, sizeof path, "/proc/self/ns/%s", ns);
    if (stat(path, &st) == 0)
        snprintf(buf, cap, "%" PRIu64 ":%" PRIu64, (uint64_t)st.st_dev, (uint64_t)st.st_ino);
    else
        snprintf(buf, cap, "?");
}

/* The identity ranks compare to decide they share a host (see the file comment). */
static void host_identity(char *buf, size_t cap)
{
    char boot[64], mnt[48], pid[48], net[48];
    read_line("/proc/sys/kernel/random/boot_id", boot, sizeof boot);
    if (!boot[0])
        gethostname(boot, sizeof boot - 1);
    ns_id("mnt", mnt, sizeof mnt);
    ns_id("pid", pid, sizeof pid);
    ns_id("net", net, sizeof net);
    snprintf(buf, cap, "%s/mnt:%s/pid:%s/net:%s", boot, mnt, pid, net);
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/*
 * The store wait that ends at deadline: its milliseconds, rounded up, at least 1 once it has
 * passed (one last look rather than none), -1 (the client's timeout) for no deadline.
 */
static int wait_ms(int64_t deadline)
{
    int ms = mono_ms_left(deadline);
    return ms == 0 ? 1 : ms;
}

/* This rank's record, the JSON text published under "<prefix>/cpu/<rank>"; NULL: no memory. */
static char *own_record(const char *addr, int port, int algo)
{
    char id[160], name[64] = "";
    host_identity(id, sizeof id);
    gethostname(name, sizeof name - 1);
    json_t *o = json_pack("{s:s, s:s, s:s, s:i, s:i, s:s}", "host", id, "name", name, "addr", addr,
                          "port", port, "pid", (int)getpid(), "algo", coll__cpu_algo_name(algo));
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return text;
}

/* Reads rank r's record into c->ranks[r]. Returns 0 or -EPROTO (err filled). */
static int parse_record(coll__cpu *c, int r, const void *val, size_t len, char *err, size_t errlen)
{
    json_error_t jerr;
    json_t *o = json_loadb(val, len, 0, &jerr);
    const char *host, *name, *addr, *algo;
    int port, pid;
    if (!o || json_unpack(o, "{s:s, s:s, s:s, s:i, s:i, s:s}", "host", &host, "name", &name, "addr",
                          &addr, "port", &port, "pid", &pid, "algo", &algo) != 0) {
        json_decref(o);
        snprintf(err, errlen, "rank %d's record in the store is malformed", r);
        return -EPROTO;
    }
    coll__rank_info *ri = &c->ranks[r];
    snprintf(ri->host, sizeof ri->host, "%s", host);
    snprintf(ri->name, sizeof ri->name, "%s", name);
    snprintf(ri->addr, sizeof ri->addr, "%s", addr);
    ri->port = port;
    ri->pid = pid;
    snprintf(ri->algo, sizeof ri->algo, "%s", algo);
    json_decref(o);
    return 0;
}

/*
 * Publishes this rank's record and gathers every rank's (rdzv_allgather() under
 * "<prefix>/cpu"), until deadline. On a timeout err names the ranks still missing and
 * c->culprit is the lowest of them.
 */
static int exchange_records(coll__cpu *c, rdzv_client *store, const char *prefix, int64_t deadline,
                            const char *addr, int port, char *err, size_t errlen)
{
    char *own = own_record(addr, port, c->algo), where[512];
    void **vals = calloc((size_t)c->world, sizeof *vals);
    size_t *lens = calloc((size_t)c->world, sizeof *lens);
    bool *missing = calloc((size_t)c->world, sizeof *missing);
    int rc = -ENOMEM, ms = wait_ms(deadline);
    bool gathered = false;
    if (!own || !vals || !lens || !missing)
        goto out;
    snprintf(where, sizeof where, "%s/cpu", prefix);
    rc = rdzv_allgather(store, where, c->rank, c->world, own, strlen(own), ms, vals, lens, missing);
    gathered = rc == 0;
    if (rc == -ETIMEDOUT) {
        for (int r = 0; r < c->world && c->culprit < 0; r++)
            if (missing[r])
                c->culprit = r;
        /* The helper's account names the missing ranks, as everywhere in the project. */
        snprintf(err, errlen, "%s", rdzv_client_last_error(store));
        goto out;
    }
    if (rc < 0) {
        snprintf(err, errlen, "exchanging the ranks' records through the store: %s",
                 rdzv_client_last_error(store));
        goto out;
    }
    for (int r = 0; r < c->world && rc == 0; r++)
        rc = parse_record(c, r, vals[r], lens[r], err, errlen);
out:
    for (int r = 0; gathered && r < c->world; r++)
        rdzv_free(vals[r]);
    free(own);
    free(vals);
    free(lens);
    free(missing);
    return rc;
}

/*
 * Every rank must run the same reduction algorithm (cpu.c's steps would not meet otherwise):
 * -EINVAL, naming the first rank whose COLL_CPU_ALGO differs from this rank's.
 */
static int check_algo(const coll__cpu *c, char *err, size_t errlen)
{
    const char *mine = coll__cpu_algo_name(c->algo);
    for (int r = 0; r < c->world; r++) {
        if (strcmp(c->ranks[r].algo, mine) != 0) {
            snprintf(err, errlen,
                     "rank %d runs COLL_CPU_ALGO=%.15s, rank %d %s: every rank must choose the "
                     "same algorithm",
                     r, c->ranks[r].algo, c->rank, mine);
            return -EINVAL;
        }
    }
    return 0;
}

/*
 * Groups the ranks into hosts by the identities they published (layout.c), checks that no host
 * holds more ranks than a segment serves, and finds this rank's place.
 */
static int build_layout(coll__cpu *c, char *err, size_t errlen)
{
    const char **ids = malloc((size_t)c->world * sizeof *ids);
    if (!ids)
        return -ENOMEM;
    for (int r = 0; r < c->world; r++)
        ids[r] = c->ranks[r].host;
    int rc = coll__layout_build(&c->layout, ids, c->world);
    free(ids);
    if (rc < 0)
        return rc;
    const coll__layout *l = &c->layout;
    for (int h = 0; h < l->nhosts; h++) {
        if (coll__layout_local_size(l, h) > COLL__MAX_LOCAL) {
            snprintf(err, errlen, "%d ranks on host %s; at most %d are supported",
                     coll__layout_local_size(l, h), c->ranks[l->leaders[h]].name, COLL__MAX_LOCAL);
            return -EINVAL;
        }
    }
    c->nhosts = l->nhosts;
    c->host = l->host_of[c->rank];
    c->local = l->local_of[c->rank];
    c->nlocal = coll__layout_local_size(l, c->host);
    return 0;
}

static size_t segment_bytes(const coll__cpu *c, size_t *chan_off, size_t *set_off, size_t *set_len)
{
    size_t off = coll__round_up(sizeof(coll__shm_hdr), 4096);
    *chan_off = off;
    off += coll__round_up((size_t)c->nlocal * (size_t)c->nlocal * sizeof(coll__channel), 4096);
    *set_off = off;
    *set_len = (size_t)(c->nlocal + 1) * c->chunk;
    return off + 2 * *set_len;
}

/* The leader creates the host's segment and publishes its name; the others open it. */
static int setup_shm(coll__cpu *c, rdzv_client *store, const char *prefix, int64_t deadline,
                     const _Atomic int *abort, char *err, size_t errlen)
{
    size_t chan_off, set_off, set_len;
    size_t nbytes = segment_bytes(c, &chan_off, &set_off, &set_len);
    char key[512];
    int rc;
    snprintf(key, sizeof key, "%s/cpu/shm/%d", prefix, c->host);
    if (c->local == 0) {
        rc = coll__shm_create(&c->shm, prefix, nbytes);
        if (rc < 0) {
            snprintf(err, errlen, "creating a %zu-byte shared memory segment: %s", nbytes,
                     coll_strerror(rc));
            return rc;
        }
        rc = rdzv_set(store, key, c->shm.name, strlen(c->shm.name));
        if (rc < 0) {
            snprintf(err, errlen, "publishing the segment: %s", rdzv_client_last_error(store));
            return rc;
        }
    } else {
        void *val = NULL;
        size_t len = 0;
        rc = rdzv_wait_get(store, key, wait_ms(deadline), &val, &len);
        if (rc < 0) {
            snprintf(err, errlen, "waiting for rank %d's shared memory segment: %s",
                     c->layout.leaders[c->host],
                     rc == -ETIMEDOUT ? "timed out" : coll_strerror(rc));
            if (rc == -ETIMEDOUT)
                c->culprit = c->layout.leaders[c->host];
            return rc;
        }
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(len < 63 ? len : 63), (const char *)val);
        rdzv_free(val);
        rc = coll__shm_open(&c->shm, name, nbytes);
        if (rc < 0) {
            snprintf(err, errlen, "opening shared memory segment %s: %s", name, coll_strerror(rc));
            return rc;
        }
    }
    c->shm.nlocal = c->nlocal;
    c->shm.local_rank = c->local;
    c->shm.local_abort = abort;
    for (int i = 0; i < c->nlocal; i++) {
        int r = c->layout.host_ranks[c->layout.host_first[c->host] + i];
        c->shm.granks[i] = r;
        c->shm.pids[i] = c->ranks[r].pid;
    }
    rc = coll__shm_watch(&c->shm);
    if (rc == 0)
        rc = coll__shm_attach_done(&c->shm, deadline);
    if (rc < 0) {
        snprintf(err, errlen, "attaching the shared memory segment: %s", coll_strerror(rc));
        return rc;
    }
    unsigned char *base = c->shm.base;
    c->channels = (coll__channel *)(base + chan_off);
    c->sets[0] = base + set_off;
    c->sets[1] = base + set_off + set_len;
    return 0;
}

int coll__cpu_init(rdzv_client *store, const char *prefix, int rank, int world,
                   const coll_options *opts, const _Atomic int *abort, int64_t deadline,
                   coll__cpu **out, int *culprit, char *err, size_t errlen)
{
    char addr[64];
    int port = 0, rc;
    coll__cpu *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->rank = rank;
    c->world = world;
    c->culprit = -1;
    c->chunk =
        coll__round_up(opts->chunk_bytes ? opts->chunk_bytes : (size_t)1 << 20, COLL__CPU_ALIGN);
    c->small = opts->small_bytes ? opts->small_bytes : 16 * 1024;
    if (c->small > c->chunk)
        c->small = c->chunk;
    c->tcp.listen_fd = -1;
    const char *algo = getenv("COLL_CPU_ALGO");
    if (coll__cpu_algo_parse(algo, &c->algo) < 0) {
        char names[128];
        coll__cpu_algo_list(names, sizeof names);
        snprintf(err, errlen, "COLL_CPU_ALGO=%.32s is not an algorithm of the cpu backend (%s)",
                 algo, names);
        rc = -EINVAL;
        goto out;
    }
    c->ranks = calloc((size_t)world, sizeof *c->ranks);
    c->tmp = malloc(c->chunk);
    c->iov = calloc((size_t)world, sizeof *c->iov);
    if (!c->ranks || !c->tmp || !c->iov) {
        rc = -ENOMEM;
        goto out;
    }

    if (opts->bind_addr && opts->bind_addr[0])
        snprintf(addr, sizeof addr, "%s", opts->bind_addr);
    else if ((rc = rdzv_client_local_addr(store, addr, sizeof addr)) < 0) {
        snprintf(err, errlen, "finding the local address of the store connection: %s",
                 coll_strerror(rc));
        goto out;
    }
    rc = coll__tcp_init(&c->tcp, rank, world, fnv1a(prefix), addr, abort, &port);
    if (rc < 0) {
        snprintf(err, errlen, "listening on %s: %s", addr, coll_strerror(rc));
        goto out;
    }
    if ((rc = exchange_records(c, store, prefix, deadline, addr, port, err, errlen)) < 0 ||
        (rc = check_algo(c, err, errlen)) < 0 || (rc = build_layout(c, err, errlen)) < 0)
        goto out;
    for (int r = 0; r < world; r++) {
        if (r != rank &&
            (rc = coll__tcp_set_peer(&c->tcp, r, c->ranks[r].addr, c->ranks[r].port)) < 0) {
            snprintf(err, errlen, "rank %d published a bad address %s:%d", r, c->ranks[r].addr,
                     c->ranks[r].port);
            goto out;
        }
    }
    if ((rc = setup_shm(c, store, prefix, deadline, abort, err, errlen)) < 0)
        goto out;
    /* Leaders connect their ring now, so that a broken network shows at init. */
    if (c->local == 0 && c->nhosts > 1) {
        int next = c->layout.leaders[(c->host + 1) % c->nhosts];
        int prev = c->layout.leaders[(c->host + c->nhosts - 1) % c->nhosts];
        int peers[2] = {next, prev};
        for (int i = 0; i < 2; i++) {
            rc = coll__tcp_conn(&c->tcp, peers[i], deadline);
            if (rc < 0) {
                snprintf(err, errlen, "connecting to rank %d at %s:%d: %s", peers[i],
                         c->ranks[peers[i]].addr, c->ranks[peers[i]].port, coll_strerror(rc));
                c->culprit = peers[i];
                goto out;
            }
        }
    }
    *out = c;
    return 0;
out:
    if (culprit)
        *culprit = c->culprit;
    coll__cpu_destroy(c);
    return rc;
}

void coll__cpu_destroy(coll__cpu *c)
{
    if (!c)
        return;
    coll__shm_close(&c->shm);
    coll__tcp_close(&c->tcp);
    free(c->ranks);
    coll__layout_free(&c->layout);
    free(c->tmp);
    free(c->iov);
    free(c);
}

void coll__cpu_abort(coll__cpu *c, int culprit)
{
    if (c->shm.base)
        coll__shm_abort(&c->shm, culprit);
    coll__tcp_shutdown(&c->tcp);
}

int coll__cpu_nhosts(const coll__cpu *c)
{
    return c->nhosts;
}

int coll__cpu_local(const coll__cpu *c, int *nlocal)
{
    *nlocal = c->nlocal;
    return c->local;
}

bool coll__cpu_segment_aborted(const coll__cpu *c)
{
    return c->shm.base && atomic_load(&((coll__shm_hdr *)c->shm.base)->abort) != 0;
}

int coll__cpu_segment_culprit(const coll__cpu *c)
{
    return c->shm.base ? atomic_load(&((coll__shm_hdr *)c->shm.base)->culprit) : -1;
}

bool coll__cpu_same_host(const coll__cpu *c, int rank)
{
    return rank >= 0 && rank < c->world && c->layout.host_of[rank] == c->host;
}

const char *coll__cpu_hostname(const coll__cpu *c, int rank)
{
    return rank >= 0 && rank < c->world ? c->ranks[rank].name : "?";
}
