/*
 * The torchrun environment: the variables torchrun (and ddprun) give each worker, read in one
 * place for every program of the project, with an error that names the variable at fault. Also
 * the per-attempt key prefix, so that a restarted attempt never reads a failed one's keys, and
 * the job's store token (DDPRUN_STORE_TOKEN), so that workers authenticate without being told,
 * and the way back: a worker's error record (TORCHELASTIC_ERROR_FILE) for the launcher's summary.
 *
 * Reads the environment only; failures go to the calling thread's last error
 * (rdzv_client_last_error(NULL)), the same account a failed connect leaves, and so does the one
 * sentence for an environment without a job, so that no program words it again.
 */
#include "rdzv.h"
#include "rdzv_internal.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const required[] = {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
#define NREQUIRED (sizeof required / sizeof required[0])

/* Why an environment is standalone, for the programs that need a job and for connect. */
#define NO_JOB                                                                                     \
    "none of RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT is set (run under ddprun or torchrun)"

static const char *get(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* Reads decimal `name` into *out within [min, max]; unset leaves *out as it is. */
static int env_int(const char *name, long min, long max, int *out)
{
    const char *v = get(name);
    if (!v)
        return 0;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v)
        return rdzv__client_error(NULL, -EINVAL, "%s=%s is not an integer", name, v);
    if (x < min || x > max)
        return rdzv__client_error(NULL, -EINVAL, "%s=%s is out of range [%ld, %ld]", name, v, min,
                                  max);
    *out = (int)x;
    return 0;
}

int rdzv_env_read(rdzv_env *env)
{
    if (!env)
        return -EINVAL;
    rdzv_env e = {.world_size = 1, .local_world_size = -1};
    snprintf(e.run_id, sizeof e.run_id, "none");

    size_t set = 0;
    const char *first_set = NULL, *first_unset = NULL;
    for (size_t i = 0; i < NREQUIRED; i++) {
        if (get(required[i])) {
            set++;
            first_set = first_set ? first_set : required[i];
        } else {
            first_unset = first_unset ? first_unset : required[i];
        }
    }
    if (set == 0) {
        /* Not a failure, but a program that needs a job prints this account of it. */
        rdzv__client_error(NULL, 0, "%s", NO_JOB);
        e.standalone = true;
        e.local_world_size = 1;
        *env = e;
        return 0;
    }
    if (set < NREQUIRED)
        return rdzv__client_error(NULL, -EINVAL,
                                  "%s is set but %s is not (run under ddprun or torchrun)",
                                  first_set, first_unset);

    int rc;
    if ((rc = env_int("WORLD_SIZE", 1, INT_MAX, &e.world_size)) < 0 ||
        (rc = env_int("RANK", 0, e.world_size - 1, &e.rank)) < 0 ||
        (rc = env_int("MASTER_PORT", 1, 65535, &e.master_port)) < 0 ||
        (rc = env_int("LOCAL_WORLD_SIZE", 1, e.world_size, &e.local_world_size)) < 0 ||
        (rc = env_int("GROUP_RANK", 0, INT_MAX, &e.group_rank)) < 0 ||
        (rc = env_int("TORCHELASTIC_RESTART_COUNT", 0, INT_MAX, &e.restart_count)) < 0)
        return rc;
    if (e.local_world_size < 0)
        e.local_world_size = e.world_size;
    if ((rc = env_int("LOCAL_RANK", 0, e.local_world_size - 1, &e.local_rank)) < 0)
        return rc;

    const char *addr = get("MASTER_ADDR"), *run = get("TORCHELASTIC_RUN_ID");
    if (strlen(addr) >= sizeof e.master_addr)
        return rdzv__client_error(NULL, -EINVAL, "MASTER_ADDR is longer than %zu bytes",
                                  sizeof e.master_addr - 1);
    snprintf(e.master_addr, sizeof e.master_addr, "%s", addr);
    if (run) {
        if (strlen(run) >= sizeof e.run_id || strchr(run, '/'))
            return rdzv__client_error(NULL, -EINVAL,
                                      "TORCHELASTIC_RUN_ID=%s is longer than %zu bytes or holds "
                                      "a '/'",
                                      run, sizeof e.run_id - 1);
        snprintf(e.run_id, sizeof e.run_id, "%s", run);
    }
    /* The job's secret: checked, never echoed into a message. */
    const char *token = get(RDZV_TOKEN_ENV);
    if (token) {
        if (rdzv_token_check(token) < 0)
            return rdzv__client_error(NULL, -EINVAL,
                                      "%s is set but is not %d to %d printable characters "
                                      "without spaces",
                                      RDZV_TOKEN_ENV, RDZV_TOKEN_MIN_BYTES, RDZV_TOKEN_MAX_BYTES);
        snprintf(e.token, sizeof e.token, "%s", token);
    }
    *env = e;
    return 0;
}

int rdzv_env_prefix(const rdzv_env *env, const char *name, char *buf, size_t cap)
{
    if (!env || !name || !buf || cap == 0)
        return -EINVAL;
    int n = snprintf(buf, cap, "%s/%s/%d", name, env->run_id, env->restart_count);
    return n < 0 || (size_t)n >= cap ? -ENOSPC : 0;
}

int rdzv_env_connect(const rdzv_env *env, const rdzv_client_options *opts, rdzv_client **out)
{
    if (!env || !out)
        return -EINVAL;
    if (env->standalone)
        return rdzv__client_error(NULL, -EINVAL, "no store to connect to: %s", NO_JOB);
    if (env->token[0] && (!opts || !opts->token)) {
        rdzv_client_options with;
        if (opts)
            with = *opts;
        else
            rdzv_client_options_init(&with);
        with.token = env->token;
        return rdzv_client_connect(env->master_addr, env->master_port, &with, out);
    }
    return rdzv_client_connect(env->master_addr, env->master_port, opts, out);
}

int rdzv_env_record_error(const char *message)
{
    if (!message)
        return -EINVAL;
    const char *path = get("TORCHELASTIC_ERROR_FILE");
    if (!path)
        return 0;
    /* The wall clock on purpose: a timestamp people read, as PyTorch's @record writes it. */
    char stamp[32];
    snprintf(stamp, sizeof stamp, "%lld", (long long)time(NULL));
    json_t *text = json_string(message);
    if (!text)
        return -EINVAL; /* NUL-terminated but not UTF-8 (or out of memory) */
    json_t *rec = json_pack("{s:{s:o, s:{s:s, s:s}}}", "message", "message", text, "extraInfo",
                            "py_callstack", "", "timestamp", stamp);
    if (!rec)
        return -ENOMEM;
    int rc = 0;
    FILE *f = fopen(path, "we");
    if (!f) {
        rc = -errno;
    } else {
        errno = 0;
        if (json_dumpf(rec, f, JSON_COMPACT) < 0 || fputc('\n', f) == EOF)
            rc = errno ? -errno : -EIO;
        if (fclose(f) == EOF && rc == 0)
            rc = -errno;
    }
    json_decref(rec);
    return rc < 0 ? rc : 1;
}
