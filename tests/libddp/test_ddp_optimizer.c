/*
 * Unit tests of libddp's optimizer table (worker/libddp/optimizer.c) and the public calls that
 * read it: ddp_optimizer_name(), ddp_optimizer_from_name(), ddp_options_set_optimizer(); and
 * that the checkpoint save and load flags are disjoint. The kernels themselves are
 * test_ddp_optim.c's; the rows' use in a model is ddp-check's and ddp-ckpt-check's.
 */
#include <check.h>

#include <errno.h>
#include <string.h>

#include "ddp.h"
#include "optimizer.h"
#include "check_main.h"

START_TEST(names)
{
    int count = 0;
    for (int i = 0; ddp_optimizer_name((ddp_optimizer)i); i++, count++) {
        const char *name = ddp_optimizer_name((ddp_optimizer)i);
        ck_assert_int_eq(ddp_optimizer_from_name(name), i);
        const ddp__optimizer_def *def = ddp__optimizer((ddp_optimizer)i);
        ck_assert_ptr_nonnull(def);
        ck_assert_int_eq(def->id, i); /* the rows are in enum order */
        ck_assert_ptr_nonnull(def->host);
        ck_assert_str_eq(def->name, name);
    }
    ck_assert_int_eq(count, 3);
    ck_assert_str_eq(ddp_optimizer_name(DDP_SGD), "sgd");
    ck_assert_str_eq(ddp_optimizer_name(DDP_ADAMW), "adamw");
    ck_assert_str_eq(ddp_optimizer_name(DDP_LION), "lion");
    ck_assert_ptr_null(ddp_optimizer_name((ddp_optimizer)-1));
    ck_assert_ptr_null(ddp_optimizer_name((ddp_optimizer)3));
    ck_assert_ptr_null(ddp__optimizer((ddp_optimizer)3));
    ck_assert_int_eq(ddp_optimizer_from_name(NULL), -EINVAL);
    ck_assert_int_eq(ddp_optimizer_from_name(""), -EINVAL);
    ck_assert_int_eq(ddp_optimizer_from_name("AdamW"), -EINVAL); /* names are exact */
    ck_assert_int_eq(ddp_optimizer_from_name("adam"), -EINVAL);
}
END_TEST

START_TEST(state_arrays)
{
    ddp_options o;
    ddp_options_init(&o);
    const ddp__optimizer_def *sgd = ddp__optimizer(DDP_SGD);
    ck_assert_int_eq(ddp__optimizer_nstate(sgd, &o), 0);
    o.momentum = 0.9f;
    ck_assert_int_eq(ddp__optimizer_nstate(sgd, &o), 1);
    ck_assert_str_eq(sgd->state[0], "momentum_buffer");
    const ddp__optimizer_def *adamw = ddp__optimizer(DDP_ADAMW);
    ck_assert_int_eq(ddp__optimizer_nstate(adamw, &o), 2);
    ck_assert_str_eq(adamw->state[0], "exp_avg");
    ck_assert_str_eq(adamw->state[1], "exp_avg_sq");
    const ddp__optimizer_def *lion = ddp__optimizer(DDP_LION);
    ck_assert_int_eq(ddp__optimizer_nstate(lion, &o), 1);
    ck_assert_str_eq(lion->state[0], "exp_avg");
    /* Only SGD checks its options: Nesterov needs momentum. */
    o.momentum = 0;
    o.nesterov = true;
    ck_assert_ptr_nonnull(sgd->check(&o));
    o.momentum = 0.5f;
    ck_assert_ptr_null(sgd->check(&o));
}
END_TEST

START_TEST(defaults)
{
    ddp_options o;
    ddp_options_init(&o);
    /* ddp_options_init(): SGD, with AdamW's betas and eps. */
    ck_assert_int_eq(o.optimizer, DDP_SGD);
    ck_assert_float_eq(o.beta1, 0.9f);
    ck_assert_float_eq(o.beta2, 0.999f);
    ck_assert_float_eq(o.eps, 1e-8f);
    ck_assert(!o.nesterov);

    o.weight_decay = 0.1f;
    o.clip_norm = 1.0f;
    o.eps = 0.5f;
    ck_assert_int_eq(ddp_options_set_optimizer(&o, DDP_LION), 0);
    ck_assert_int_eq(o.optimizer, DDP_LION);
    ck_assert_float_eq(o.beta1, 0.9f);
    ck_assert_float_eq(o.beta2, 0.99f);
    ck_assert_float_eq(o.eps, 0.5f); /* not Lion's: untouched */
    ck_assert_float_eq(o.weight_decay, 0.1f);
    ck_assert_float_eq(o.clip_norm, 1.0f);

    ck_assert_int_eq(ddp_options_set_optimizer(&o, DDP_ADAMW), 0);
    ck_assert_float_eq(o.beta2, 0.999f);
    ck_assert_float_eq(o.eps, 1e-8f);

    o.momentum = 0.9f;
    o.nesterov = true;
    ck_assert_int_eq(ddp_options_set_optimizer(&o, DDP_SGD), 0);
    ck_assert_float_eq(o.momentum, 0.0f);
    ck_assert(!o.nesterov);

    ddp_options before = o;
    ck_assert_int_eq(ddp_options_set_optimizer(&o, (ddp_optimizer)7), -EINVAL);
    ck_assert_mem_eq(&o, &before, sizeof o);
    ck_assert_int_eq(ddp_options_set_optimizer(NULL, DDP_SGD), -EINVAL);
}
END_TEST

START_TEST(checkpoint_flags)
{
    /* Disjoint, so that neither call can take the other's flag for its own. */
    ck_assert_uint_eq(DDP_CKPT_SYNC & DDP_CKPT_PARAMS_ONLY, 0);
    ck_assert_uint_ne(DDP_CKPT_SYNC, 0);
    ck_assert_uint_ne(DDP_CKPT_PARAMS_ONLY, 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ddp_optimizer");
    check_tcase(s, "table", 10, names, state_arrays, defaults, checkpoint_flags);
    return check_run(s);
}
