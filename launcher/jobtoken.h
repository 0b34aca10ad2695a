/*
 * The job's secret, as ddprun finds it: the token its agents authenticate to the store with and
 * hands its workers (DDPRUN_STORE_TOKEN). Internal to the launcher; see ddprun(1), SECURITY.
 * The header compiles as C99 and C++.
 */
#ifndef DDPRUN_JOBTOKEN_H
#define DDPRUN_JOBTOKEN_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Where the token came from. */
typedef enum ddprun_token_source {
    DDPRUN_TOKEN_NONE,      /* no token: the job's control plane is open */
    DDPRUN_TOKEN_FILE,      /* --token-file PATH */
    DDPRUN_TOKEN_ENV_FILE,  /* DDPRUN_TOKEN_FILE=PATH */
    DDPRUN_TOKEN_ENV,       /* DDPRUN_TOKEN=TOKEN */
    DDPRUN_TOKEN_GENERATED, /* random, for a job whose store only this agent's workers use */
} ddprun_token_source;

/*
 * Finds the job's token, first of: the file `token_file` (--token-file; borrowed, NULL if not
 * given), the file named by DDPRUN_TOKEN_FILE, the value of DDPRUN_TOKEN; failing those, a fresh
 * random one when `may_generate` (a one-node job hosting its own store), else none. Writes the
 * token (NUL-terminated; "" for none) into buf, of `cap` bytes (at least RDZV_TOKEN_MAX_BYTES +
 * 1), and its source into *source. A token file readable by group or others is used, but
 * *loose_mode is set so that the caller can warn. Returns 0, or -EINVAL / a negative errno
 * from reading the file, with a sentence in err that never contains the token.
 */
int ddprun_job_token(const char *token_file, bool may_generate, char *buf, size_t cap,
                     ddprun_token_source *source, bool *loose_mode, char *err, size_t errlen);

/* "--token-file", "DDPRUN_TOKEN_FILE", "DDPRUN_TOKEN", "a random token" or "none". */
const char *ddprun_token_source_name(ddprun_token_source source);

#ifdef __cplusplus
}
#endif

#endif /* DDPRUN_JOBTOKEN_H */
