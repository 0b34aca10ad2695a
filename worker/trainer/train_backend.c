/*
 * train_backend: the job's backend from every rank's GPU report (train_backend.h). The first
 * two ranks with the same GPU are found by comparing each rank with those before it: quadratic,
 * which a job's few thousand ranks at most make a few million comparisons of 16 bytes, once
 * per run.
 */
#include "train_backend.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* Sets *a < *b to the first pair of ranks with the same GPU (the lowest b); 0 if found, else -1. */
static int first_shared(const train_gpu_ident *ranks, int world, int *a, int *b)
{
    for (int j = 1; j < world; j++)
        for (int i = 0; i < j; i++)
            if (memcmp(ranks[i].uuid, ranks[j].uuid, sizeof ranks[i].uuid) == 0) {
                *a = i;
                *b = j;
                return 0;
            }
    return -1;
}

int train_backend_decide(coll_backend want, const train_gpu_ident *ranks, int world,
                         coll_backend *out, char *why, size_t cap)
{
    if (!ranks || world < 1 || !out ||
        (want != COLL_BACKEND_AUTO && want != COLL_BACKEND_CPU && want != COLL_BACKEND_NCCL))
        return -EINVAL;
    char sink[1];
    if (!why || cap == 0) {
        why = sink;
        cap = sizeof sink;
    }
    why[0] = '\0';
    if (want == COLL_BACKEND_CPU) {
        *out = COLL_BACKEND_CPU;
        return 0;
    }
    int r = 0, q = 0, a, b;
    while (r < world && ranks[r].has_gpu)
        r++;
    while (q < world && ranks[q].has_nccl)
        q++;
    if (r < world) {
        snprintf(why, cap, "rank %d has no GPU", r);
    } else if (q < world) {
        snprintf(why, cap, "rank %d's libcollective was built without NCCL", q);
    } else if (first_shared(ranks, world, &a, &b) == 0) {
        const uint8_t *u = ranks[a].uuid;
        snprintf(why, cap,
                 "ranks %d and %d use the same GPU, GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-"
                 "%02x%02x-%02x%02x%02x%02x%02x%02x, and NCCL allows one rank per GPU",
                 a, b, u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
                 u[12], u[13], u[14], u[15]);
    } else {
        *out = COLL_BACKEND_NCCL;
        return 0;
    }
    if (want == COLL_BACKEND_NCCL)
        return -ENOTSUP;
    *out = COLL_BACKEND_CPU;
    return 0;
}
