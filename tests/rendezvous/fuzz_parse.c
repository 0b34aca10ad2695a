/*
 * libFuzzer harness for the request parser and the store behind it. The input is a byte
 * stream from up to three interleaved connections: each chunk starts with a control byte whose
 * low bits pick the connection and whose high bits pick how many of the following bytes that
 * connection receives, so frames get split at arbitrary points and waits, cancels and watches
 * interact across connections. Every complete frame is executed as the server would; a parse
 * error or a refused request "closes" the connection (releases it) and opens a fresh one.
 * As on a server with a token, AUTH_HELLO and AUTH_PROOF run the handshake's server steps
 * (auth.h), and a request naming a private key on a connection that did not authenticate
 * closes it instead of running.
 * The buffer caps are small, so that connections are failed for their replies and partial
 * requests and the biggest holder is evicted; queued output is "sent" after every other chunk.
 * A control byte of 255 clears the store instead (the next byte picks the prefix kept), and
 * every chunk sweeps a little, so that requests meet names a clear left stale and the dead
 * WAITs and watches of closed connections.
 *
 * Build: meson setup build-fuzz -Dfuzz=true (with CC=clang); run build-fuzz/tests/fuzz_parse.
 */
#include "auth.h"
#include "proto.h"
#include "store.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define NCONN 3

typedef struct conn_state {
    rdzv__conn conn;
    rdzv__parser parser;
    rdzv__buf pend;
    rdzv__auth_conn auth;
} conn_state;

static const char token[] = "fuzz-token-0123456789";

/* What the server does with one request (server.c's gate() and auth_step()): < 0 closes. */
static int run(rdzv__store *st, conn_state *c, const rdzv__request *req)
{
    uint8_t reply[RDZV_AUTH_HELLO_REPLY_BYTES];
    size_t n;
    bool priv = rdzv__request_private(req);
    if (req->op == RDZV_OP_AUTH_HELLO)
        return rdzv__auth_server_hello(token, &c->auth, req->key, req->key_len, reply, &n);
    if (req->op == RDZV_OP_AUTH_PROOF)
        return rdzv__auth_server_proof(token, &c->auth, req->key, req->key_len);
    if (priv && c->auth.state != RDZV_AUTH_DONE)
        return -EACCES;
    return rdzv__store_exec(st, &c->conn, req);
}

static const rdzv__limits lim = {256, 4096, 64, 1 << 16};

static void reopen(rdzv__store *st, conn_state *c)
{
    rdzv__conn_release(st, &c->conn);
    rdzv__buf_free(&c->pend);
    rdzv__conn_init(&c->conn);
    rdzv__parser_init(&c->parser);
    memset(&c->auth, 0, sizeof(c->auth));
}

/* The per-pool counts add up to the store's. */
static void check_pools(const rdzv__store *st)
{
    size_t keys = 0, stale = 0, entries = 0;
    for (int p = 0; p < RDZV__POOLS; p++) {
        keys += st->pools[p].keys;
        stale += st->pools[p].stale;
        entries += st->pools[p].entries;
        if (st->pools[p].stale > st->pools[p].entries || st->pools[p].keys > st->pools[p].filled)
            abort();
    }
    if (keys != st->nkeys || stale != st->nstale || entries != st->nentries)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rdzv__store st;
    conn_state cs[NCONN];
    if (rdzv__store_init(&st, 1 << 16) < 0)
        return 0;
    st.max_conn_output = 3000;
    st.max_buffered = 6000;
    for (int i = 0; i < NCONN; i++) {
        memset(&cs[i], 0, sizeof(cs[i]));
        rdzv__conn_init(&cs[i].conn);
        rdzv__parser_init(&cs[i].parser);
    }
    size_t off = 0;
    static const char *const keeps[] = {"", "/ddprun/", "/ddprun", "/ddprun/a", "k"};
    while (off < size) {
        uint8_t ctl = data[off++];
        if (ctl == 255 && off < size) {
            const char *keep = keeps[data[off++] % (sizeof(keeps) / sizeof(keeps[0]))];
            rdzv__store_clear(&st, (const uint8_t *)keep, strlen(keep));
            continue;
        }
        rdzv__store_sweep(&st, 3);
        check_pools(&st);
        conn_state *c = &cs[ctl % NCONN];
        size_t n = (size_t)(ctl / NCONN) + 1;
        if (n > size - off)
            n = size - off;
        if (n == 0)
            break;
        if (rdzv__conn_hold_input(&st, &c->conn, c->pend.len + n) < 0) {
            reopen(&st, c);
            off += n;
            continue;
        }
        rdzv__buf_append(&c->pend, data + off, n);
        off += n;
        size_t used = 0;
        for (;;) {
            rdzv__request req;
            int rc = rdzv__parse(&c->parser, &lim, c->pend.data + used, c->pend.len - used, &req);
            if (rc == 0)
                break;
            if (rc < 0 || run(&st, c, &req) < 0) {
                reopen(&st, c);
                used = 0;
                break;
            }
            used += (size_t)rc;
        }
        if (used) {
            memmove(c->pend.data, c->pend.data + used, c->pend.len - used);
            c->pend.len -= used;
            rdzv__conn_hold_input(&st, &c->conn, c->pend.len);
        }
        /* Close the connections the store failed; "send" what the others have queued. */
        rdzv__conn *d;
        while ((d = rdzv__store_pop_dirty(&st))) {
            conn_state *dc = (conn_state *)((char *)d - offsetof(conn_state, conn));
            if (d->error)
                reopen(&st, dc);
            else if (off & 1) {
                rdzv__conn_sent(&st, d, d->out.len);
                d->out.len = 0;
            }
        }
    }
    for (int i = 0; i < NCONN; i++) {
        rdzv__conn_release(&st, &cs[i].conn);
        rdzv__buf_free(&cs[i].pend);
    }
    /* Invariants after every connection is gone: no waiters, no watches, and byte
     * accounting consistent with an empty store once every key is deleted. */
    if (st.nwaiters != 0 || st.nwatches != 0 || st.buffered != 0 || !queue_empty(&st.holders))
        abort();
    static const uint8_t none[300]; /* longer than any key: every key is cleared */
    rdzv__store_clear(&st, none, sizeof(none));
    while (rdzv__store_sweep(&st, 7))
        ;
    if (st.nentries != 0 || st.bytes != 0 || st.memory != 0 || st.private_memory != 0 ||
        st.nkeys != 0 || st.nstale != 0 || !queue_empty(&st.dead))
        abort();
    rdzv__store_destroy(&st);
    return 0;
}
