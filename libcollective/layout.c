/*
 * The cpu backend's host layout, as a pure function of the host identities the ranks published:
 * which ranks share a host, each host's leader, each rank's index on its host, and the order of
 * the hosts. No I/O and no knowledge of what an identity means (cpu_boot.c makes them) or of the
 * limits the shared segment imposes (cpu_boot.c checks them); unit-tested in
 * tests/libcollective/test_layout.c.
 *
 * The rules: ranks with byte-equal identities form a host; a host's ranks are ordered by global
 * rank, so its leader (local rank 0) is its lowest rank; hosts are ordered by their leaders'
 * ranks, which is also the order of the leaders' TCP ring. Every rank computes the same layout
 * from the same identities, whatever order they are listed in on the way.
 *
 * Invariants of a built layout: host_ranks is a permutation of 0..world-1; host_first is
 * increasing with host_first[0] = 0 and host_first[nhosts] = world; for every rank r,
 * host_ranks[host_first[host_of[r]] + local_of[r]] == r; leaders[h] == host_ranks[host_first[h]]
 * and leaders is strictly increasing. Building costs O(world log world) (a sort, not a scan per
 * host), so a job of a rank per host does not pay world^2 string compares.
 */
#include "coll_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct entry {
    const char *id;
    int rank;
} entry;

/* By identity, then by rank: equal identities end up adjacent, lowest rank first. */
static int by_id_then_rank(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    return c ? c : (x->rank > y->rank) - (x->rank < y->rank);
}

static int by_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int coll__layout_build(coll__layout *l, const char *const *ids, int world)
{
    int rc = -ENOMEM;
    entry *e = NULL;
    if (!l)
        return -EINVAL;
    memset(l, 0, sizeof *l);
    if (!ids || world < 1)
        return -EINVAL;
    for (int r = 0; r < world; r++)
        if (!ids[r])
            return -EINVAL;
    l->world = world;
    e = malloc((size_t)world * sizeof *e);
    l->host_of = malloc((size_t)world * sizeof *l->host_of);
    l->local_of = malloc((size_t)world * sizeof *l->local_of);
    l->leaders = malloc((size_t)world * sizeof *l->leaders);
    l->host_first = malloc(((size_t)world + 1) * sizeof *l->host_first);
    l->host_ranks = malloc((size_t)world * sizeof *l->host_ranks);
    if (!e || !l->host_of || !l->local_of || !l->leaders || !l->host_first || !l->host_ranks)
        goto out;

    /* Group: after the sort each run of equal identities is one host, its leader first. */
    for (int r = 0; r < world; r++)
        e[r] = (entry){ids[r], r};
    qsort(e, (size_t)world, sizeof *e, by_id_then_rank);
    for (int i = 0; i < world; i++)
        if (i == 0 || strcmp(e[i - 1].id, e[i].id) != 0)
            l->leaders[l->nhosts++] = e[i].rank;

    /* Order the hosts by leader; a host's index is its leader's position in that order. */
    qsort(l->leaders, (size_t)l->nhosts, sizeof *l->leaders, by_int);
    for (int h = 0; h < l->nhosts; h++)
        l->host_of[l->leaders[h]] = h;
    int h = -1, local = 0;
    for (int i = 0; i < world; i++) {
        if (i == 0 || strcmp(e[i - 1].id, e[i].id) != 0) {
            h = l->host_of[e[i].rank]; /* e[i] is its host's leader */
            local = 0;
        }
        l->host_of[e[i].rank] = h;
        l->local_of[e[i].rank] = local++;
    }

    /* Lay the hosts out in order: counts, prefix sums, then every rank at its place. */
    memset(l->host_first, 0, ((size_t)l->nhosts + 1) * sizeof *l->host_first);
    for (int r = 0; r < world; r++)
        l->host_first[l->host_of[r] + 1]++;
    for (int k = 0; k < l->nhosts; k++)
        l->host_first[k + 1] += l->host_first[k];
    for (int r = 0; r < world; r++)
        l->host_ranks[l->host_first[l->host_of[r]] + l->local_of[r]] = r;
    rc = 0;
out:
    free(e);
    if (rc < 0)
        coll__layout_free(l);
    return rc;
}

void coll__layout_free(coll__layout *l)
{
    if (!l)
        return;
    free(l->host_of);
    free(l->local_of);
    free(l->leaders);
    free(l->host_first);
    free(l->host_ranks);
    memset(l, 0, sizeof *l);
}

int coll__layout_local_size(const coll__layout *l, int host)
{
    return l->host_first[host + 1] - l->host_first[host];
}
