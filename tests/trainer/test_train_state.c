/*
 * ddp-train's checkpoint user state (worker/trainer/train_state.c): the JSON round trip (with and
 * without the metadata for ddp-ckpt export, which a parse accepts and skips), malformed or
 * foreign states refused with a sentence, and the resume decision: the same settings resume,
 * another world size, stage or accumulation resumes too, a changed schedule resumes with a
 * warning, and a changed model, data order or optimizer is refused naming the setting.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_state.h"
#include "check_main.h"

static train_state example(void)
{
    return (train_state){.step = 468,
                         .world = 2,
                         .zero = 1,
                         .grad_accum = 3,
                         .in_dim = 784,
                         .hidden = 512,
                         .layers = 2,
                         .classes = 10,
                         .global_batch = 384,
                         .train_samples = 60000,
                         .seed = 7,
                         .optimizer = 1,
                         .schedule = 1,
                         .lr = 1e-3,
                         .warmup = 100,
                         .total_steps = 3510};
}

START_TEST(round_trip)
{
    train_state st = example(), back;
    char *json;
    ck_assert_int_eq(train_state_json(&st, NULL, &json), 0);
    ck_assert_ptr_nonnull(strstr(json, "\"optimizer\":\"adamw\""));
    ck_assert_ptr_nonnull(strstr(json, "\"kind\":\"cosine\""));
    ck_assert_int_eq(train_state_parse(json, &back, NULL, 0), 0);
    ck_assert_int_eq(back.step, 468);
    ck_assert_int_eq(back.seed, 7);
    ck_assert(back.lr == 1e-3);
    ck_assert_int_eq(back.total_steps, 3510);
    char *again; /* every field: the same text again */
    ck_assert_int_eq(train_state_json(&back, NULL, &again), 0);
    ck_assert_str_eq(again, json);
    ck_assert_ptr_null(strstr(json, "heads")); /* a model without heads writes none */
    free(again);
    free(json);
    st.heads = 4; /* the GPT's */
    ck_assert_int_eq(train_state_json(&st, NULL, &json), 0);
    ck_assert_ptr_nonnull(strstr(json, "\"classes\":10,\"heads\":4}"));
    ck_assert_int_eq(train_state_parse(json, &back, NULL, 0), 0);
    ck_assert_int_eq(back.heads, 4);
    free(json);
}
END_TEST

START_TEST(metadata)
{
    train_state st = example(), back;
    const char *meta[] = {"model", "mlp", "layer_sizes", "784,512,512,10", NULL};
    char *json, *plain;
    ck_assert_int_eq(train_state_json(&st, meta, &json), 0);
    ck_assert_ptr_nonnull(
        strstr(json, "\"metadata\":{\"model\":\"mlp\",\"layer_sizes\":\"784,512,512,10\"}"));
    ck_assert_int_eq(train_state_parse(json, &back, NULL, 0), 0);
    ck_assert_int_eq(back.step, 468);
    ck_assert_int_eq(train_state_json(&back, NULL, &plain), 0);
    ck_assert_ptr_null(strstr(plain, "metadata")); /* none given: no key */
    char err[256];
    ck_assert_int_eq(train_state_parse(plain, &back, err, sizeof err), 0); /* optional */
    free(plain);
    free(json);
}
END_TEST

START_TEST(malformed)
{
    train_state st = example(), back = {.step = -5};
    char err[256];
    ck_assert_int_eq(train_state_parse("{", &back, err, sizeof err), -EPROTO);
    ck_assert_ptr_nonnull(strstr(err, "not JSON"));
    ck_assert_int_eq(train_state_parse("{\"trainer\": \"other\"}", &back, err, sizeof err),
                     -EPROTO);
    ck_assert_ptr_nonnull(strstr(err, "not ddp-train's"));
    ck_assert_int_eq(train_state_parse(NULL, &back, NULL, 0), -EPROTO);
    /* Another trainer's, another version, an unknown optimizer: each refused. */
    const char *swaps[][2] = {{"\"ddp-train\"", "\"nanogpt\""},
                              {"\"version\":1", "\"version\":2"},
                              {"\"adamw\"", "\"adafactor\""}};
    for (size_t i = 0; i < sizeof swaps / sizeof swaps[0]; i++) {
        char *json, buf[1024];
        ck_assert_int_eq(train_state_json(&st, NULL, &json), 0);
        char *at = strstr(json, swaps[i][0]);
        ck_assert_ptr_nonnull(at);
        snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - json), json, swaps[i][1],
                 at + strlen(swaps[i][0]));
        ck_assert_int_eq(train_state_parse(buf, &back, err, sizeof err), -EPROTO);
        ck_assert_int_gt((int)strlen(err), 10);
        free(json);
    }
    ck_assert_int_eq(back.step, -5); /* untouched on failure */
}
END_TEST

START_TEST(compare)
{
    train_state saved = example(), now = example();
    char err[512];
    ck_assert_int_eq(train_state_compare(&saved, &now, err, sizeof err), 0);
    /* Another world size, stage, accumulation or position: the same run, resharded. */
    now.world = 3;
    now.zero = 3;
    now.grad_accum = 2;
    now.step = 0;
    ck_assert_int_eq(train_state_compare(&saved, &now, err, sizeof err), 0);
    /* A constant schedule does not depend on the run's length; a cosine one does. */
    saved.schedule = now.schedule = 0;
    now.total_steps = 7020;
    ck_assert_int_eq(train_state_compare(&saved, &now, err, sizeof err), 0);
    saved.schedule = now.schedule = 1;
    ck_assert_int_eq(train_state_compare(&saved, &now, err, sizeof err), 1);
    ck_assert_ptr_nonnull(strstr(err, "schedule differs"));
    now = example();
    now.lr = 2e-3;
    ck_assert_int_eq(train_state_compare(&saved, &now, err, sizeof err), 1);

    /* The model, the data order, the optimizer: refused, naming the setting. */
    struct {
        train_state now;
        const char *says;
    } bad[] = {{example(), "--hidden 512, this run has 256"},
               {example(), "--layers 2, this run has 3"},
               {example(), "--global-batch 384, this run has 256"},
               {example(), "--seed 7, this run has 8"},
               {example(), "training samples 60000, this run has 1000"},
               {example(), "--optimizer adamw, this run has sgd"},
               {example(), "--heads 0, this run has 4"}};
    bad[0].now.hidden = 256;
    bad[1].now.layers = 3;
    bad[2].now.global_batch = 256;
    bad[3].now.seed = 8;
    bad[4].now.train_samples = 1000;
    bad[5].now.optimizer = 0;
    bad[6].now.heads = 4;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(train_state_compare(&saved, &bad[i].now, err, sizeof err), -EINVAL);
        ck_assert_msg(strstr(err, bad[i].says), "case %zu: %s", i, err);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("train_state");
    check_tcase(s, "state", 30, round_trip, metadata, malformed, compare);
    return check_run(s);
}
