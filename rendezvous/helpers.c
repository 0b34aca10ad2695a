/*
 * Store helpers: the exchanges every component of the project runs through the store, written
 * once on top of the client's public calls. Per-rank key arrays ("<prefix>/<rank>"), set-once
 * (first writer wins, through COMPARE_SET), the wait for one key with a bound of its own followed
 * by its GET, and the all-gather (publish, wait for every rank, one MULTI_GET, and on a timeout a
 * message naming the ranks that are missing).
 *
 * Values exchanged here are never empty: MULTI_GET answers a missing key with an empty value
 * and COMPARE_SET treats a missing key as matching "", so an empty value could not be told from
 * a missing one. The helpers refuse nbytes == 0 instead of guessing.
 *
 * No state of its own, no printing; failures set the client's last error.
 */
#include "rdzv.h"
#include "rdzv_internal.h"
#include "fmt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int rdzv_rank_keys(const char *prefix, int n, char ***keys)
{
    if (!prefix || n < 0 || !keys)
        return -EINVAL;
    /* Longest "/<int>" is 12 bytes with its NUL. */
    size_t plen = strlen(prefix), each = plen + 12;
    size_t ptrs = ((size_t)n + 1) * sizeof(char *);
    if ((size_t)n > (SIZE_MAX - ptrs) / each)
        return -ENOMEM;
    char **k = malloc(ptrs + (size_t)n * each);
    if (!k)
        return -ENOMEM;
    char *s = (char *)k + ptrs;
    for (int i = 0; i < n; i++) {
        k[i] = s;
        s += snprintf(s, each, "%s/%d", prefix, i) + 1;
    }
    k[n] = NULL;
    *keys = k;
    return 0;
}

int rdzv_set_once(rdzv_client *c, const char *key, const void *value, size_t nbytes, void **stored,
                  size_t *stored_nbytes)
{
    if (!c || !key || !value || nbytes == 0 || (stored && !stored_nbytes))
        return -EINVAL;
    void *v = NULL;
    size_t n = 0;
    int rc = rdzv_compare_set(c, key, "", 0, value, nbytes, &v, &n);
    if (rc < 0)
        return rc;
    int same = n == nbytes && memcmp(v, value, nbytes) == 0;
    if (stored) {
        *stored = v;
        *stored_nbytes = n;
    } else {
        rdzv_free(v);
    }
    return same;
}

/*
 * A WAIT of 0 ms cannot serve as a look: the wait times out before the server's answer has come
 * back, present key or not. So timeout 0 is a CHECK, and a missing key times out as a wait would.
 */
int rdzv_wait_get(rdzv_client *c, const char *key, int timeout_ms, void **value, size_t *nbytes)
{
    if (!c || !key || !value || !nbytes)
        return c ? rdzv__client_error(c, -EINVAL, "wait_get: invalid argument") : -EINVAL;
    const char *k = key;
    int rc;
    if (timeout_ms != 0)
        rc = rdzv_wait(c, &k, 1, timeout_ms);
    else if ((rc = rdzv_check(c, &k, 1)) >= 0)
        rc = rc == 1 ? 0
                     : rdzv__client_error(c, -ETIMEDOUT,
                                          "%s: the key is not there (timeout 0: one look, no wait)",
                                          rdzv__client_what(c));
    if (rc == 0)
        rc = rdzv_get(c, key, value, nbytes);
    return rc;
}

/*
 * Waits for the keys, then fetches them in one MULTI_GET. After a timeout, each key is checked
 * on its own (a store need not answer MULTI_GET for missing keys: PyTorch's does not), the
 * missing ones are named in the client's last error, and one MULTI_GET fetches the rest.
 */
static int gather(rdzv_client *c, const char *prefix, char **keys, int n, int timeout_ms,
                  void **values, size_t *nbytes, bool *missing)
{
    int rc = rdzv_wait(c, (const char *const *)keys, (size_t)n, timeout_ms);
    if (rc == 0)
        return rdzv_multi_get(c, (const char *const *)keys, (size_t)n, values, nbytes);
    if (rc != -ETIMEDOUT)
        return rc;

    bool *flags = missing ? missing : calloc((size_t)n, sizeof *flags);
    const char **present = calloc((size_t)n, sizeof *present);
    void **pvals = calloc((size_t)n, sizeof *pvals);
    size_t *plens = calloc((size_t)n, sizeof *plens);
    size_t np = 0;
    rc = -ENOMEM;
    if (!flags || !present || !pvals || !plens)
        goto out;
    for (int r = 0; r < n; r++) {
        const char *k = keys[r];
        if ((rc = rdzv_check(c, &k, 1)) < 0)
            goto out;
        flags[r] = rc == 0;
        if (rc == 1)
            present[np++] = k;
    }
    if (np > 0 && (rc = rdzv_multi_get(c, present, np, pvals, plens)) < 0)
        goto out;
    for (int r = 0, i = 0; r < n; r++) {
        values[r] = flags[r] ? NULL : pvals[i];
        nbytes[r] = flags[r] ? 0 : plens[i];
        i += !flags[r];
    }
    int ms = timeout_ms < 0 ? rdzv__client_timeout_ms(c) : timeout_ms;
    char what[400], msg[512];
    snprintf(what, sizeof what, "did not publish %s within %d ms", prefix, ms);
    if (fmt_missing_ranks(flags, n, "rank", what, msg, sizeof msg) == 0)
        /* Everyone arrived between the wait's end and the checks: still a timeout. */
        rdzv__client_error(c, 0, "every rank published %s, but only after %d ms", prefix, ms);
    else
        rdzv__client_error(c, 0, "%s", msg);
    rc = -ETIMEDOUT;
out:
    if (flags != missing)
        free(flags);
    free(present);
    free(pvals);
    free(plens);
    return rc;
}

int rdzv_gather(rdzv_client *c, const char *prefix, int n, int timeout_ms, void **values,
                size_t *nbytes, bool *missing)
{
    if (!c || !prefix || n < 1 || !values || !nbytes)
        return -EINVAL;
    char **keys = NULL;
    int rc = rdzv_rank_keys(prefix, n, &keys);
    if (rc == 0)
        rc = gather(c, prefix, keys, n, timeout_ms, values, nbytes, missing);
    rdzv_free(keys);
    return rc;
}

int rdzv_allgather(rdzv_client *c, const char *prefix, int rank, int world, const void *value,
                   size_t nbytes, int timeout_ms, void **values, size_t *nbytes_out,
                   bool *missing)
{
    if (!c || !prefix || world < 1 || rank < 0 || rank >= world || !value || nbytes == 0 ||
        !values || !nbytes_out)
        return -EINVAL;
    char **keys = NULL;
    int rc = rdzv_rank_keys(prefix, world, &keys);
    if (rc == 0)
        rc = rdzv_set(c, keys[rank], value, nbytes);
    if (rc == 0)
        rc = gather(c, prefix, keys, world, timeout_ms, values, nbytes_out, missing);
    if (rc == -ETIMEDOUT) {
        /* Values only on success: what the timed-out gather fetched is dropped. */
        for (int r = 0; r < world; r++) {
            rdzv_free(values[r]);
            values[r] = NULL;
        }
    }
    rdzv_free(keys);
    return rc;
}
