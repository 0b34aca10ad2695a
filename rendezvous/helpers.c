/*
 * Store helpers: the exchanges every component of the project runs through the store, written
 * once on top of the client's public calls. Per-rank key arrays ("<prefix>/<rank>"), set-once
 * (first writer wins, through COMPARE_SET) and the all-gather (publish, wait for every rank, one
 * MULTI_GET, and on a timeout a message naming the ranks that are missing).
 *
 * Values exchanged here are never empty: MULTI_GET answers a missing key with an empty value
 * and COMPARE_SET treats a missing key as matching "", so an empty value could not be told from
 * a missing one. The helpers refuse nbytes == 0 instead of guessing.
 *
 * No state of its own, no printing; failures set the client's last error.
 */
#include "rdzv.h"
#include "rdzv_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SHOW_RANKS 16 /* ranks named in a list; the rest are counted */

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

int rdzv_rank_list(const unsigned char *flags, int n, char *buf, size_t cap)
{
    if (!flags || n < 0 || !buf || cap == 0)
        return -EINVAL;
    size_t used = 0;
    int count = 0;
    buf[0] = '\0';
    for (int r = 0; r < n; r++) {
        if (!flags[r])
            continue;
        if (count++ < SHOW_RANKS && used < cap) {
            int w = snprintf(buf + used, cap - used, "%s%d", count > 1 ? ", " : "", r);
            used = w < 0 ? cap : used + (size_t)w;
        }
    }
    if (count > SHOW_RANKS && used < cap)
        snprintf(buf + used, cap - used, " and %d more", count - SHOW_RANKS);
    return count;
}

/*
 * After a timed-out wait: one MULTI_GET tells which ranks are missing (their values are empty).
 * Sets the client's last error naming them and fills `missing` (if not NULL); returns
 * -ETIMEDOUT, or the MULTI_GET's error.
 */
static int name_missing(rdzv_client *c, const char *prefix, char **keys, int world, int timeout_ms,
                        unsigned char *missing)
{
    void **vals = calloc((size_t)world, sizeof *vals);
    size_t *lens = calloc((size_t)world, sizeof *lens);
    unsigned char *flags = missing ? missing : calloc((size_t)world, 1);
    int rc = -ENOMEM;
    if (!vals || !lens || !flags)
        goto out;
    rc = rdzv_multi_get(c, (const char *const *)keys, (size_t)world, vals, lens);
    if (rc < 0)
        goto out;
    for (int r = 0; r < world; r++) {
        rdzv_free(vals[r]);
        flags[r] = lens[r] == 0;
    }
    char list[SHOW_RANKS * 12 + 32];
    int nmissing = rdzv_rank_list(flags, world, list, sizeof list);
    if (nmissing == 0)
        /* Everyone arrived between the wait's end and the MULTI_GET: still a timeout. */
        rdzv__client_error(c, 0, "every rank published %s, but only after %d ms", prefix,
                           timeout_ms);
    else
        rdzv__client_error(c, 0, "rank%s %s did not publish %s within %d ms (%d of %d present)",
                           nmissing == 1 ? "" : "s", list, prefix, timeout_ms, world - nmissing,
                           world);
    rc = -ETIMEDOUT;
out:
    if (flags != missing)
        free(flags);
    free(vals);
    free(lens);
    return rc;
}

int rdzv_allgather(rdzv_client *c, const char *prefix, int rank, int world, const void *value,
                   size_t nbytes, int timeout_ms, void **values, size_t *nbytes_out,
                   unsigned char *missing)
{
    if (!c || !prefix || world < 1 || rank < 0 || rank >= world || !value || nbytes == 0 ||
        !values || !nbytes_out)
        return -EINVAL;
    char **keys = NULL;
    int rc = rdzv_rank_keys(prefix, world, &keys);
    if (rc < 0)
        return rc;
    rc = rdzv_set(c, keys[rank], value, nbytes);
    if (rc == 0)
        rc = rdzv_wait(c, (const char *const *)keys, (size_t)world, timeout_ms);
    if (rc == -ETIMEDOUT) {
        int ms = timeout_ms < 0 ? rdzv__client_timeout_ms(c) : timeout_ms;
        rc = name_missing(c, prefix, keys, world, ms, missing);
    } else if (rc == 0) {
        rc = rdzv_multi_get(c, (const char *const *)keys, (size_t)world, values, nbytes_out);
    }
    rdzv_free(keys);
    return rc;
}
