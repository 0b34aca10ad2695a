/*
 * ddp-train's backend decision (worker/trainer/train_backend.c) over synthetic reports: distinct GPUs
 * with NCCL everywhere take nccl; two ranks on the same GPU (as on hosts with fewer GPUs than
 * ranks), a rank without a GPU or without NCCL take cpu under auto, naming the first ranks
 * concerned, and refuse --backend nccl alike; one GPU per rank seen through
 * CUDA_VISIBLE_DEVICES (each rank's GPU 0, distinct UUIDs) takes nccl; --backend cpu is cpu.
 */
#include <check.h>
#include <errno.h>
#include <string.h>

#include "train_backend.h"
#include "check_main.h"

#define MAXW 8

/* world ranks, each with a GPU of its own (UUID byte 0 and 15 = rank + 1) and NCCL. */
static void distinct(train_gpu_ident *r, int world)
{
    memset(r, 0, sizeof *r * (size_t)world);
    for (int i = 0; i < world; i++) {
        r[i].uuid[0] = r[i].uuid[15] = (uint8_t)(i + 1);
        r[i].has_gpu = r[i].has_nccl = 1;
    }
}

START_TEST(report_is_bytes)
{
    /* Allgathered as COLL_U8: the size must be the members' alone. */
    ck_assert_uint_eq(sizeof(train_gpu_ident), 18);
}
END_TEST

START_TEST(all_distinct_take_nccl)
{
    train_gpu_ident r[MAXW];
    distinct(r, MAXW);
    char why[128] = "stale";
    coll_backend b = COLL_BACKEND_CPU;
    ck_assert_int_eq(train_backend_decide(COLL_BACKEND_AUTO, r, MAXW, &b, why, sizeof why), 0);
    ck_assert_int_eq(b, COLL_BACKEND_NCCL);
    ck_assert_str_eq(why, "");
    b = COLL_BACKEND_CPU;
    ck_assert_int_eq(train_backend_decide(COLL_BACKEND_NCCL, r, MAXW, &b, why, sizeof why), 0);
    ck_assert_int_eq(b, COLL_BACKEND_NCCL);
    ck_assert_int_eq(train_backend_decide(COLL_BACKEND_CPU, r, MAXW, &b, why, sizeof why), 0);
    ck_assert_int_eq(b, COLL_BACKEND_CPU);
    ck_assert_str_eq(why, "");
}
END_TEST

START_TEST(shared_gpu_takes_cpu)
{
    train_gpu_ident r[MAXW];
    distinct(r, MAXW);
    r[5] = r[2]; /* ranks 2 and 5 on one GPU */
    r[7] = r[6]; /* and 6 and 7: the first pair is named */
    char why[128];
    coll_backend b = COLL_BACKEND_NCCL;
    ck_assert_int_eq(train_backend_decide(COLL_BACKEND_AUTO, r, MAXW, &b, why, sizeof why), 0);
    ck_assert_int_eq(b, COLL_BACKEND_CPU);
    ck_assert_str_eq(why,
                     "ranks 2 and 5 use the same GPU, GPU-03000000-0000-0000-0000-000000000003, "
                     "and NCCL allows one rank per GPU");
    b = COLL_BACKEND_AUTO;
    ck_assert_int_eq(train_backend_decide(COLL_BACKEND_NCCL, r, MAXW, &b, why, sizeof why),
                     -ENOTSUP);
    ck_assert_int_eq(b, COLL_BACKEND_AUTO); /* untouched */
    ck_assert_ptr_nonnull(strstr(why, "ranks 2 and 5 use the same GPU"));
}
END_TEST

START_TEST(rank_without_gpu_or_nccl)
{
    train_gpu_ident r[4];
    distinct(r, 4);
    memset(&r[3], 0, sizeof r[3]); /* the host: no GPU (and all-zero UUID, as rank 1's below) */
    r[1].has_nccl = 0;
    char why[128];
    coll_backend b;
    ck_assert_int_eq(train_backend_decide(COLL_BACKEND_AUTO, r, 4, &b, why, sizeof why), 0);
    ck_assert_int_eq(b, COLL_BACKEND_CPU);
    ck_assert_str_eq(why, "rank 3 has no GPU");
    ck_assert_int_eq(train_backend_decide(COLL_BACKEND_NCCL, r, 4, &b, why, sizeof why), -ENOTSUP);
    ck_assert_str_eq(why, "rank 3 has no GPU");
    r[3] = r[0];
    r[3].uuid[0] = 9;
    ck_assert_int_eq(train_backend_decide(COLL_BACKEND_NCCL, r, 4, &b, why, sizeof why), -ENOTSUP);
    ck_assert_str_eq(why, "rank 1's libcollective was built without NCCL");
    /* Without GPUs anywhere, auto is cpu. */
    memset(r, 0, sizeof r);
    ck_assert_int_eq(train_backend_decide(COLL_BACKEND_AUTO, r, 4, &b, NULL, 0), 0);
    ck_assert_int_eq(b, COLL_BACKEND_CPU);
}
END_TEST

START_TEST(one_gpu_per_rank_through_visible_devices)
{
    /* 8 ranks of a host, each shown one GPU (ordinal 0 for all) by CUDA_VISIBLE_DEVICES: the
       UUIDs differ, so nothing is shared, whatever LOCAL_WORLD_SIZE and the count say. */
    train_gpu_ident r[MAXW];
    distinct(r, MAXW);
    coll_backend b;
    ck_assert_int_eq(train_backend_decide(COLL_BACKEND_AUTO, r, MAXW, &b, NULL, 0), 0);
    ck_assert_int_eq(b, COLL_BACKEND_NCCL);
}
END_TEST

START_TEST(world_of_one)
{
    train_gpu_ident r[1];
    distinct(r, 1);
    coll_backend b;
    char why[64];
    ck_assert_int_eq(train_backend_decide(COLL_BACKEND_AUTO, r, 1, &b, why, sizeof why), 0);
    ck_assert_int_eq(b, COLL_BACKEND_NCCL);
    r[0].has_gpu = 0;
    ck_assert_int_eq(train_backend_decide(COLL_BACKEND_AUTO, r, 1, &b, why, sizeof why), 0);
    ck_assert_int_eq(b, COLL_BACKEND_CPU);
    ck_assert_str_eq(why, "rank 0 has no GPU");
}
END_TEST

START_TEST(bad_arguments)
{
    train_gpu_ident r[2];
    distinct(r, 2);
    coll_backend b;
    ck_assert_int_eq(train_backend_decide(COLL_BACKEND_AUTO, r, 0, &b, NULL, 0), -EINVAL);
    ck_assert_int_eq(train_backend_decide(COLL_BACKEND_AUTO, NULL, 2, &b, NULL, 0), -EINVAL);
    ck_assert_int_eq(train_backend_decide(COLL_BACKEND_AUTO, r, 2, NULL, NULL, 0), -EINVAL);
    ck_assert_int_eq(train_backend_decide((coll_backend)42, r, 2, &b, NULL, 0), -EINVAL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("train_backend");
    check_tcase(s, "decide", 30, report_is_bytes, all_distinct_take_nccl, shared_gpu_takes_cpu,
                rank_without_gpu_or_nccl, one_gpu_per_rank_through_visible_devices, world_of_one,
                bad_arguments);
    return check_run(s);
}
