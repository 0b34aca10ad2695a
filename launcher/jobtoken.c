/*
 * Finding the job's secret (jobtoken.h): the order of the sources, the checks, and the
 * messages. Reading and validating a token file and generating a token are librendezvous's
 * (rdzv_token_read_file(), rdzv_token_generate()); this file only decides which source wins.
 *
 * Nothing here prints; no message ever contains the token.
 */
#include "jobtoken.h"
#include "rdzv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

const char *ddprun_token_source_name(ddprun_token_source source)
{
    switch (source) {
    case DDPRUN_TOKEN_FILE:
        return "--token-file";
    case DDPRUN_TOKEN_ENV_FILE:
        return "DDPRUN_TOKEN_FILE";
    case DDPRUN_TOKEN_ENV:
        return "DDPRUN_TOKEN";
    case DDPRUN_TOKEN_GENERATED:
        return "a random token";
    default:
        return "none";
    }
}

static int from_file(const char *what, const char *path, char *buf, size_t cap, bool *loose,
                     char *err, size_t errlen)
{
    struct stat st;
    int rc = rdzv_token_read_file(path, buf, cap);
    if (rc == -EINVAL)
        snprintf(err, errlen,
                 "%s %s: the file must hold one token of %d to %d printable characters "
                 "without spaces",
                 what, path, RDZV_TOKEN_MIN_BYTES, RDZV_TOKEN_MAX_BYTES);
    else if (rc < 0)
        snprintf(err, errlen, "%s %s: %s", what, path, rdzv_strerror(rc));
    else
        *loose = stat(path, &st) == 0 && (st.st_mode & 077) != 0;
    return rc;
}

int ddprun_job_token(const char *token_file, bool may_generate, char *buf, size_t cap,
                     ddprun_token_source *source, bool *loose_mode, char *err, size_t errlen)
{
    const char *env_file = getenv("DDPRUN_TOKEN_FILE"), *env = getenv("DDPRUN_TOKEN");
    bool loose = false;
    int rc = 0;

    if (!buf || cap < RDZV_TOKEN_MAX_BYTES + 1 || !source || !loose_mode)
        return -EINVAL;
    buf[0] = '\0';
    if (token_file) {
        *source = DDPRUN_TOKEN_FILE;
        rc = from_file("--token-file", token_file, buf, cap, &loose, err, errlen);
    } else if (env_file && *env_file) {
        *source = DDPRUN_TOKEN_ENV_FILE;
        rc = from_file("DDPRUN_TOKEN_FILE", env_file, buf, cap, &loose, err, errlen);
    } else if (env && *env) {
        *source = DDPRUN_TOKEN_ENV;
        if (rdzv_token_check(env) < 0) {
            snprintf(err, errlen,
                     "DDPRUN_TOKEN: must be %d to %d printable characters without spaces",
                     RDZV_TOKEN_MIN_BYTES, RDZV_TOKEN_MAX_BYTES);
            rc = -EINVAL;
        } else {
            snprintf(buf, cap, "%s", env);
        }
    } else if (may_generate) {
        *source = DDPRUN_TOKEN_GENERATED;
        rc = rdzv_token_generate(buf, cap);
        if (rc < 0)
            snprintf(err, errlen, "cannot generate the job's token: %s", rdzv_strerror(rc));
    } else {
        *source = DDPRUN_TOKEN_NONE;
    }
    if (rc < 0) {
        buf[0] = '\0';
        return rc;
    }
    *loose_mode = loose;
    return 0;
}
