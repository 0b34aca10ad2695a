/*
 * coll_comm_init_env(): joining the job a worker was started in, in one call. It reads the
 * torchrun environment, makes the per-attempt key prefix, connects to the job's store (or, for a
 * job of one, starts a private one) and creates the communicator of every rank.
 *
 * What it does not do: pick a device or a backend from the local rank (the caller knows its GPUs
 * and its policy; it passes the result in the options, or creates further communicators on the
 * store it keeps), retry, or print: failures are codes with a sentence in coll_last_error(NULL),
 * and the one line of a successful join goes to the options' log hook.
 *
 * Invariant: *out is written only on success; on failure everything made so far is released in
 * reverse order through coll_env_free() on a local copy.
 */
#include "coll_internal.h"
#include "rdzv.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

void coll_env_options_init(coll_env_options *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->backend = COLL_BACKEND_CPU;
    opts->device = -1;
}

/* The store of a job of one: a private server on 127.0.0.1, port picked by the kernel. */
static int start_private_store(const coll_env_options *opts, coll_env *e)
{
    rdzv_server_options so;
    rdzv_server_options_init(&so);
    so.host = "127.0.0.1";
    so.port = 0;
    int rc = rdzv_server_start(&so, &e->server);
    if (rc < 0) {
        coll__set_init_error("cannot start a store for a job of one: %s", rdzv_strerror(rc));
        return rc;
    }
    rc = rdzv_client_connect("127.0.0.1", rdzv_server_port(e->server), opts->store, &e->store);
    if (rc < 0)
        coll__set_init_error("cannot reach the private store at 127.0.0.1:%d: %s",
                             rdzv_server_port(e->server), rdzv_client_last_error(NULL));
    return rc;
}

int coll_comm_init_env(const coll_env_options *opts, coll_env *out)
{
    coll_env e;
    int rc;

    memset(&e, 0, sizeof e);
    if (!opts || !out || !opts->name) {
        coll__set_init_error("coll_comm_init_env: invalid argument (%s is NULL)",
                             !opts  ? "opts"
                             : !out ? "out"
                                    : "opts->name");
        return -EINVAL;
    }
    if ((rc = rdzv_env_read(&e.env)) < 0) {
        /* librendezvous' sentence names the variable at fault and its value. */
        coll__set_init_error("%s", rdzv_client_last_error(NULL));
        return rc;
    }
    if (e.env.standalone && !opts->standalone) {
        coll__set_init_error("%s", rdzv_client_last_error(NULL));
        return -ENOENT;
    }
    rc = rdzv_env_prefix(&e.env, opts->name, e.prefix, sizeof e.prefix);
    if (rc == 0 && opts->suffix) {
        size_t len = strlen(e.prefix);
        if ((size_t)snprintf(e.prefix + len, sizeof e.prefix - len, "/%s", opts->suffix) >=
            sizeof e.prefix - len)
            rc = -ENOSPC;
    }
    if (rc < 0) {
        coll__set_init_error("the key prefix is longer than %zu bytes: %s/%s/%d%s%s",
                             sizeof e.prefix - 1, opts->name, e.env.run_id, e.env.restart_count,
                             opts->suffix ? "/" : "", opts->suffix ? opts->suffix : "");
        return rc;
    }
    if (e.env.standalone) {
        rc = start_private_store(opts, &e);
    } else if ((rc = rdzv_env_connect(&e.env, opts->store, &e.store)) < 0) {
        coll__set_init_error("cannot reach the store at %s:%d: %s", e.env.master_addr,
                             e.env.master_port, rdzv_client_last_error(NULL));
    }
    if (rc < 0)
        goto out;
    if (!opts->store_only) {
        /* On failure coll_comm_init() leaves its own account in coll_last_error(NULL). */
        rc = coll_comm_init(e.store, e.prefix, e.env.rank, e.env.world_size, opts->backend,
                            opts->device, opts->comm, &e.comm);
        if (rc < 0)
            goto out;
        if (!opts->keep_store) {
            rdzv_client_close(e.store);
            e.store = NULL;
        }
    }
    if (opts->comm && opts->comm->log) {
        char line[800];
        snprintf(line, sizeof line, "rank %d of %d joined %s under %s%s", e.env.rank,
                 e.env.world_size, e.env.standalone ? "a private store" : "the job's store",
                 e.prefix, e.comm ? "" : " (no communicator)");
        opts->comm->log(opts->comm->log_arg, COLL_LOG_INFO, line);
    }
    *out = e;
    return 0;
out:
    coll_env_free(&e);
    return rc;
}

void coll_env_free(coll_env *env)
{
    if (!env)
        return;
    coll_comm_close(env->comm);
    env->comm = NULL;
    rdzv_client_close(env->store);
    env->store = NULL;
    rdzv_server_close(env->server);
    env->server = NULL;
}
