/*
 * Tests of the checkpoint manifest's reader (worker/libddp/ckpt_manifest.c): a good manifest parses
 * into what it says; each broken key, inconsistent layout, or file that is not JSON is refused
 * with -EPROTO and a sentence naming the file and the key; a missing manifest is -ENOENT. The
 * manifests are written by the test into a temporary directory; no shard files are needed.
 */
#include <check.h>

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "check_main.h"

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/test_ckpt_manifest.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void)
{
    char p[128];
    snprintf(p, sizeof p, "%s/%s", dir, DDP__CKPT_MANIFEST);
    unlink(p);
    rmdir(dir);
}

/*
 * A consistent manifest: world 2, stage 3, AdamW, one group per unit as stage 3 lays them out:
 * group 0 = fc1 (weight 3x5, bias 3) at [0, 18), group 1 = fc2 (weight 2x3, bias 1) at [18, 25)
 * padded to 26. Each shard file holds 3 arrays of 9 + 4 elements: 156 bytes, 3 chunks of 64.
 */
static json_t *good(void)
{
    json_error_t e;
    json_t *m = json_loads(
        "{\"format\": \"ddp-checkpoint\", \"version\": 1, \"step\": 7, \"attempted\": 8,"
        " \"world_size\": 2, \"zero_stage\": 3, \"dtype\": \"float32\","
        " \"optimizer\": {\"kind\": \"adamw\", \"momentum\": 0, \"nesterov\": false,"
        "   \"weight_decay\": 0.01, \"beta1\": 0.9, \"beta2\": 0.999, \"eps\": 1e-8,"
        "   \"clip_norm\": 1.0},"
        " \"state\": [\"param\", \"exp_avg\", \"exp_avg_sq\"],"
        " \"units\": [\"fc1\", \"fc2\"],"
        " \"params\": ["
        "   {\"name\": \"fc1.weight\", \"unit\": 0, \"shape\": [3, 5], \"dtype\": \"float32\","
        "    \"offset\": 0, \"count\": 15, \"group\": 0},"
        "   {\"name\": \"fc1.bias\", \"unit\": 0, \"shape\": [3], \"dtype\": \"float32\","
        "    \"offset\": 15, \"count\": 3, \"group\": 0},"
        "   {\"name\": \"fc2.weight\", \"unit\": 1, \"shape\": [2, 3], \"dtype\": \"float32\","
        "    \"offset\": 18, \"count\": 6, \"group\": 1},"
        "   {\"name\": \"fc2.bias\", \"unit\": 1, \"shape\": [1], \"dtype\": \"float32\","
        "    \"offset\": 24, \"count\": 1, \"group\": 1}],"
        " \"groups\": ["
        "   {\"offset\": 0, \"count\": 18, \"padded\": 18, \"shard\": 9, \"shard_offset\": 0,"
        "    \"first\": 0, \"last\": 1},"
        "   {\"offset\": 18, \"count\": 7, \"padded\": 8, \"shard\": 4, \"shard_offset\": 9,"
        "    \"first\": 2, \"last\": 3}],"
        " \"total\": 26, \"shard_total\": 13, \"chunk_bytes\": 64,"
        " \"shards\": ["
        "   {\"file\": \"shard-00000-of-00002.bin\", \"bytes\": 156, \"crc32c\": 1,"
        "    \"chunks\": [1, 2, 3]},"
        "   {\"file\": \"shard-00001-of-00002.bin\", \"bytes\": 156, \"crc32c\": 4294967295,"
        "    \"chunks\": [4, 5, 6]}],"
        " \"progress\": {\"epoch\": 2, \"position\": 11, \"seed\": -1},"
        " \"user\": {\"global_step\": 7, \"hidden\": [3]}}",
        0, &e);
    ck_assert_msg(m != NULL, "the test's manifest: %s", e.text);
    return m;
}

static void put(json_t *m)
{
    char p[128];
    snprintf(p, sizeof p, "%s/%s", dir, DDP__CKPT_MANIFEST);
    ck_assert_int_eq(json_dump_file(m, p, 0), 0);
    json_decref(m);
}

/* Reads the directory's manifest expecting rc, and an error that contains `needle`. */
static void expect(int rc, const char *needle)
{
    ddp__ckpt_manifest mf = {0};
    char err[512];
    int got = ddp__ckpt_manifest_read(dir, &mf, err, sizeof err);
    ck_assert_msg(got == rc, "rc %d (%s), expected %d", got, err, rc);
    ck_assert_msg(strstr(err, needle) != NULL, "'%s' does not say '%s'", err, needle);
    ck_assert_msg(strstr(err, DDP__CKPT_MANIFEST) != NULL, "'%s' does not name the file", err);
    ck_assert_ptr_null(mf.params); /* nothing written on failure */
}

START_TEST(parses_a_good_manifest)
{
    put(good());
    ddp__ckpt_manifest mf;
    char err[256];
    ck_assert_int_eq(ddp__ckpt_manifest_read(dir, &mf, err, sizeof err), 0);
    ck_assert_int_eq(mf.step, 7);
    ck_assert_int_eq(mf.attempted, 8);
    ck_assert_int_eq(mf.world, 2);
    ck_assert_int_eq(mf.stage, 3);
    ck_assert_int_eq(mf.optimizer, DDP_ADAMW);
    ck_assert_float_eq(mf.weight_decay, 0.01f);
    ck_assert_float_eq(mf.beta2, 0.999f);
    ck_assert_int_eq(mf.nstate, 3);
    ck_assert_str_eq(mf.state[2], "exp_avg_sq");
    ck_assert_int_eq(mf.nunits, 2);
    ck_assert_str_eq(mf.units[1], "fc2");
    ck_assert_int_eq(mf.nparams, 4);
    ck_assert_str_eq(mf.params[2].name, "fc2.weight");
    ck_assert_int_eq(mf.params[2].ndim, 2);
    ck_assert_int_eq(mf.params[2].shape[1], 3);
    ck_assert_uint_eq(mf.params[3].offset, 24);
    ck_assert_int_eq(mf.params[3].group, 1);
    ck_assert_int_eq(mf.ngroups, 2);
    ck_assert_uint_eq(mf.groups[1].padded, 8);
    ck_assert_uint_eq(mf.shard_total, 13);
    ck_assert_str_eq(mf.shards[1].file, "shard-00001-of-00002.bin");
    ck_assert_uint_eq(mf.shards[1].crc32c, 4294967295u);
    ck_assert_uint_eq(mf.shards[1].nchunks, 3);
    ck_assert_uint_eq(mf.shards[1].chunks[2], 6);
    ck_assert_int_eq(mf.progress.epoch, 2);
    ck_assert_int_eq(mf.progress.position, 11);
    ck_assert_uint_eq(mf.progress.seed, UINT64_MAX);
    ck_assert_str_eq(mf.user_json, "{\"global_step\":7,\"hidden\":[3]}");
    ck_assert_str_eq(mf.dir, dir);
    ddp__ckpt_manifest_free(&mf);
    ck_assert_ptr_null(mf.params);
    ddp__ckpt_manifest_free(&mf); /* a zeroed manifest is a no-op */
    ddp__ckpt_manifest_free(NULL);
}
END_TEST

START_TEST(missing_manifest_is_enoent)
{
    expect(-ENOENT, "incomplete");
}
END_TEST

START_TEST(not_json)
{
    char p[128];
    snprintf(p, sizeof p, "%s/%s", dir, DDP__CKPT_MANIFEST);
    FILE *f = fopen(p, "w");
    fputs("{\"format\": \"ddp-checkpoint\", \"version\": 1,", f); /* torn mid-write */
    fclose(f);
    expect(-EPROTO, "not valid JSON");
}
END_TEST

/* Each mutation of the good manifest and what the error must say. */
typedef struct mutation {
    const char *path; /* "key" or "key.sub" or "key[i].sub" */
    const char *json; /* the new value; NULL deletes the key */
    const char *says;
} mutation;

static const mutation mutations[] = {
    {"format", "\"safetensors\"", "format"},
    {"version", "2", "version 2"},
    {"step", NULL, "step: missing"},
    {"step", "\"7\"", "step: not an integer"},
    {"attempted", "3", "attempted"},
    {"world_size", "0", "world_size"},
    {"zero_stage", "4", "zero_stage"},
    {"dtype", "\"bfloat16\"", "dtype"},
    {"optimizer.kind", "\"lamb\"", "optimizer.kind"},
    {"optimizer.beta1", NULL, "optimizer.beta1: missing"},
    {"optimizer.nesterov", "0", "optimizer.nesterov"},
    {"state", "[\"param\"]", "state"},
    {"units", "[]", "units"},
    {"params[1].name", "7", "params[1].name"},
    {"params[1].shape", "[4]", "the product is 4, count says 3"},
    {"params[1].offset", "14", "overlaps fc1.weight"},
    {"params[0].unit", "1", "params[1].unit: units must not decrease"},
    {"params[2].unit", "5", "params[2].unit"},
    {"params[3].group", "0", "not inside groups[0]"},
    {"params[0].dtype", "\"float16\"", "params[0].dtype"},
    {"groups[1].padded", "7", "do not split over 2 ranks"},
    {"groups[1].shard_offset", "8", "expected 18 and 9"},
    {"groups[0].last", "9", "groups[0].first, last"},
    {"shard_total", "12", "shard_total 12"},
    {"chunk_bytes", "6", "chunk_bytes"},
    {"shards[1].bytes", "155", "shards[1].bytes: 155, the layout needs 156"},
    {"shards[1].file", "\"../../etc/passwd\"", "expected 'shard-00001-of-00002.bin'"},
    {"shards[0].chunks", "[1, 2]", "shards[0].chunks"},
    {"shards[0].crc32c", "4294967296", "crc32c"},
    {"shards", "[]", "shards: 0 entries for a world of 2"},
    {"progress.seed", NULL, "progress.seed: missing"},
    {"user", "[1]", "user: not an object"},
};

/* Applies m to the good manifest: walks "a[i].b" paths. */
static json_t *mutate(const mutation *m)
{
    json_t *root = good(), *obj = root;
    char path[64];
    snprintf(path, sizeof path, "%s", m->path);
    char *key = path, *dot;
    while ((dot = strchr(key, '.'))) {
        *dot = '\0';
        char *br = strchr(key, '[');
        if (br) {
            *br = '\0';
            obj = json_array_get(json_object_get(obj, key), (size_t)atoi(br + 1));
        } else {
            obj = json_object_get(obj, key);
        }
        ck_assert_ptr_nonnull(obj);
        key = dot + 1;
    }
    if (m->json) {
        json_t *v = json_loads(m->json, JSON_DECODE_ANY, NULL);
        ck_assert_ptr_nonnull(v);
        json_object_set_new(obj, key, v);
    } else {
        json_object_del(obj, key);
    }
    return root;
}

START_TEST(refuses_each_broken_key)
{
    const mutation *m = &mutations[_i];
    put(mutate(m));
    expect(-EPROTO, m->says);
}
END_TEST

START_TEST(rejects_duplicate_keys)
{
    char p[128];
    snprintf(p, sizeof p, "%s/%s", dir, DDP__CKPT_MANIFEST);
    FILE *f = fopen(p, "w");
    fputs("{\"format\": \"ddp-checkpoint\", \"format\": \"ddp-checkpoint\"}", f);
    fclose(f);
    expect(-EPROTO, "duplicate");
}
END_TEST

START_TEST(sgd_state_arrays)
{
    json_t *m = good();
    json_t *o = json_object_get(m, "optimizer");
    json_object_set_new(o, "kind", json_string("sgd"));
    json_object_set_new(o, "momentum", json_real(0.9));
    /* AdamW's arrays are wrong for SGD with momentum. */
    json_incref(m);
    put(m);
    expect(-EPROTO, "state: 3 arrays, the optimizer keeps 2");
    json_object_set_new(m, "state", json_loads("[\"param\", \"momentum_buffer\"]", 0, NULL));
    json_t *sh = json_object_get(m, "shards");
    for (size_t i = 0; i < 2; i++) {
        json_t *s = json_array_get(sh, i);
        json_object_set_new(s, "bytes", json_integer(2 * 13 * 4));
        json_object_set_new(s, "chunks", json_loads("[1, 2]", 0, NULL));
    }
    put(m);
    ddp__ckpt_manifest mf;
    char err[256];
    ck_assert_msg(ddp__ckpt_manifest_read(dir, &mf, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(mf.optimizer, DDP_SGD);
    ck_assert_int_eq(mf.nstate, 2);
    ck_assert_str_eq(mf.state[1], "momentum_buffer");
    ck_assert_ptr_nonnull(mf.user_json);
    ddp__ckpt_manifest_free(&mf);
}
END_TEST

START_TEST(crc32c_check_value)
{
    /* The standard check value, in one piece and extended in two. */
    ck_assert_uint_eq(ddp__crc32c(0, "123456789", 9), 0xE3069283u);
    ck_assert_uint_eq(ddp__crc32c(ddp__crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
    ck_assert_uint_eq(ddp__crc32c(0, NULL, 0), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ckpt_manifest");
    TCase *tc = tcase_create("read");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, parses_a_good_manifest);
    tcase_add_test(tc, missing_manifest_is_enoent);
    tcase_add_test(tc, not_json);
    tcase_add_loop_test(tc, refuses_each_broken_key, 0,
                        (int)(sizeof mutations / sizeof mutations[0]));
    tcase_add_test(tc, rejects_duplicate_keys);
    tcase_add_test(tc, sgd_state_arrays);
    tcase_add_test(tc, crc32c_check_value);
    suite_add_tcase(s, tc);
    return check_run(s);
}
