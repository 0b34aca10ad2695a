/*
 * ddp-ckpt's tensor names (worker/tools/ckpt_names.c): --rename's rules (whole names and module
 * paths, an empty NEW, first rule wins, no chaining, a rule that matches nothing, two names made
 * one, bad syntax), the nn.Sequential mapping both ways (0, 2, 4, ...; 1, 3, 5, ... after a
 * Flatten; indices that do not step by 2 refused), and the check of ddp-train's MLP (its own
 * names and shapes fit; foreign names are listed; a missing bias, a broken chain, uneven
 * hidden widths and another class count are named). A failure leaves the names as they were.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "ckpt_names.h"

/* n malloc'ed copies of the NULL-ended list. */
static char **list(const char *const *names, int *n)
{
    for (*n = 0; names[*n]; (*n)++)
        ;
    char **out = calloc((size_t)*n + 1, sizeof *out);
    for (int i = 0; i < *n; i++)
        out[i] = strdup(names[i]);
    return out;
}

static void list_free(char **l, int n)
{
    for (int i = 0; i < n; i++)
        free(l[i]);
    free(l);
}

START_TEST(renames)
{
    const char *in[] = {"module.0.weight", "module.0.bias", "module.2.weight", "head", NULL};
    int n;
    char **l = list(in, &n), err[256];
    ck_assert_int_eq(names_rename(l, n, "module=,head=out.w", err, sizeof err), 0);
    ck_assert_str_eq(l[0], "0.weight");
    ck_assert_str_eq(l[2], "2.weight");
    ck_assert_str_eq(l[3], "out.w");
    ck_assert_int_eq(names_rename(l, n, "0=2", err, sizeof err), -EEXIST);
    ck_assert_ptr_nonnull(strstr(err, "would both be '2.weight'"));
    ck_assert_str_eq(l[0], "0.weight"); /* unchanged on failure */
    /* First rule wins, no chaining: 0 -> 2 does not go on to 2 -> 4. */
    ck_assert_int_eq(names_rename(l, n, "0=2,2=4", err, sizeof err), 0);
    ck_assert_str_eq(l[0], "2.weight");
    ck_assert_str_eq(l[1], "2.bias");
    ck_assert_str_eq(l[2], "4.weight");
    /* OLD matches whole names or up to a dot: "2.w" is not a part of "2.weight". */
    ck_assert_int_eq(names_rename(l, n, "2.w=q", err, sizeof err), -ENOENT);
    ck_assert_int_eq(names_rename(l, n, "out.w=x.w", err, sizeof err), 0);
    ck_assert_str_eq(l[3], "x.w");
    ck_assert_int_eq(names_rename(l, n, "nope=x", err, sizeof err), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err, "no tensor is named 'nope'"));
    ck_assert_int_eq(names_rename(l, n, "x.w=", err, sizeof err), -EEXIST);
    ck_assert_ptr_nonnull(strstr(err, "no name left"));
    const char *bad[] = {"x", "=y", "a=b,", "a=b=c", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(names_rename_check(bad[i], err, sizeof err), -EINVAL);
        ck_assert_ptr_nonnull(strstr(err, "is not OLD=NEW"));
    }
    ck_assert_int_eq(names_rename_check("a=b,c=", err, sizeof err), 0);
    list_free(l, n);
}
END_TEST

START_TEST(torch)
{
    const char *in[] = {"fc1.weight", "fc1.bias", "fc2.weight",         "fc2.bias",
                        "fc3.weight", "fc3.bias", "fc1.weight.exp_avg", NULL};
    int n;
    char **l = list(in, &n), err[256];
    ck_assert_int_eq(names_to_torch(l, n, err, sizeof err), 0);
    ck_assert_str_eq(l[0], "0.weight");
    ck_assert_str_eq(l[3], "2.bias");
    ck_assert_str_eq(l[4], "4.weight");
    ck_assert_str_eq(l[6], "0.weight.exp_avg");
    ck_assert_int_eq(names_from_torch(l, n, err, sizeof err), 0);
    for (int i = 0; i < n; i++)
        ck_assert_str_eq(l[i], in[i]);
    list_free(l, n);

    const char *flat[] = {"1.weight", "1.bias", "3.weight", "3.bias", NULL};
    l = list(flat, &n);
    ck_assert_int_eq(names_from_torch(l, n, err, sizeof err), 0);
    ck_assert_str_eq(l[0], "fc1.weight");
    ck_assert_str_eq(l[3], "fc2.bias");
    list_free(l, n);

    const char *gap[] = {"0.weight", "4.weight", NULL};
    l = list(gap, &n);
    ck_assert_int_eq(names_from_torch(l, n, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "modules 0 and 4"));
    ck_assert_str_eq(l[0], "0.weight");
    list_free(l, n);

    const char *foreign[] = {"fc1.weight", "encoder.weight", "01.weight", NULL};
    l = list(foreign, &n);
    ck_assert_int_eq(names_from_torch(l, n, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "'fc1.weight' is not an nn.Sequential module's"));
    ck_assert_int_eq(names_to_torch(l, n, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "'encoder.weight' is not one of ddp-train's"));
    ck_assert_str_eq(l[0], "fc1.weight");
    list_free(l, n);
}
END_TEST

/* An MLP in -> h (x layers) -> out as ddp-train registers it, into ts[] (shapes in sh[]). */
static int mlp(names_tensor *ts, int64_t (*sh)[2], char (*nm)[32], int in, int h, int layers,
               int out)
{
    int n = 0;
    for (int k = 1; k <= layers + 1; k++) {
        int64_t o = k == layers + 1 ? out : h, i = k == 1 ? in : h;
        snprintf(nm[n], 32, "fc%d.weight", k);
        sh[n][0] = o;
        sh[n][1] = i;
        ts[n] = (names_tensor){nm[n], 2, sh[n]};
        n++;
        snprintf(nm[n], 32, "fc%d.bias", k);
        sh[n][0] = o;
        ts[n] = (names_tensor){nm[n], 1, sh[n]};
        n++;
    }
    return n;
}

START_TEST(fit)
{
    names_tensor ts[16];
    int64_t sh[16][2];
    char nm[16][32], err[512];
    int in, hidden, layers;
    int n = mlp(ts, sh, nm, 784, 99, 2, 10);
    ck_assert_int_eq(names_fit_mlp(ts, n, 65, 10, &in, &hidden, &layers, err, sizeof err), 0);
    ck_assert_int_eq(in, 784);
    ck_assert_int_eq(hidden, 99);
    ck_assert_int_eq(layers, 2);
    n = mlp(ts, sh, nm, 784, 16, 1, 10); /* --layers 1 */
    ck_assert_int_eq(names_fit_mlp(ts, n, 65, 10, &in, &hidden, &layers, err, sizeof err), 0);
    ck_assert_int_eq(layers, 1);

    ck_assert_int_eq(names_fit_mlp(ts, n, 65, 12, &in, &hidden, &layers, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "fc2 has 10 outputs; ddp-train's MLP has 12"));
    ck_assert_int_eq(names_fit_mlp(ts, n - 1, 65, 10, &in, &hidden, &layers, err, sizeof err),
                     -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "fc2.bias is missing"));
    ck_assert_int_eq(names_fit_mlp(ts, 2, 65, 10, &in, &hidden, &layers, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "1 linear layer: ddp-train's MLP has at least 2"));

    n = mlp(ts, sh, nm, 784, 32, 2, 10);
    sh[2][1] = 31; /* fc2.weight (32, 31) after fc1's 32 outputs */
    ck_assert_int_eq(names_fit_mlp(ts, n, 65, 10, &in, &hidden, &layers, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "fc2.weight takes 31 inputs, fc1 gives 32 outputs"));
    n = mlp(ts, sh, nm, 784, 32, 2, 10);
    sh[2][0] = sh[3][0] = sh[4][1] = 64; /* fc2 64 wide, fc1 32 */
    ck_assert_int_eq(names_fit_mlp(ts, n, 65, 10, &in, &hidden, &layers, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "fc2 has 64 outputs, fc1 32"));

    n = mlp(ts, sh, nm, 784, 32, 2, 10);
    ts[0].name = "0.weight";
    ts[1].name = "0.bias";
    ts[5].name = "fc3.scale";
    ck_assert_int_eq(names_fit_mlp(ts, n, 65, 10, &in, &hidden, &layers, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "'0.weight', '0.bias', 'fc3.scale': not ddp-train's"));
}
END_TEST

/* ddp-train's GPT's tensors (gpt.h) at vocab 256, width C, context T, L blocks into ts. */
static int gpt(names_tensor *ts, int64_t (*sh)[2], char (*nm)[32], int C, int T, int L)
{
    static const char *const block[] = {
        "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
        "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
        "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
    static const int rows[] = {1, 1, 3, 3, 1, 1, 1, 1, 4, 4, 1, 1};
    static const int cols[] = {0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4, 0};
    int n = 0;
    for (int k = 0; k < 2; k++, n++) {
        snprintf(nm[n], 32, "emb.%s", k ? "wpe" : "wte");
        sh[n][0] = k ? T : 256;
        sh[n][1] = C;
        ts[n] = (names_tensor){nm[n], 2, sh[n]};
    }
    for (int l = 0; l < L; l++)
        for (int k = 0; k < 12; k++, n++) {
            snprintf(nm[n], 32, "h%d.%s", l, block[k]);
            sh[n][0] = (int64_t)rows[k] * C;
            sh[n][1] = (int64_t)cols[k] * C;
            ts[n] = (names_tensor){nm[n], cols[k] ? 2 : 1, sh[n]};
        }
    for (int k = 0; k < 2; k++, n++) {
        snprintf(nm[n], 32, "ln_f.%s", k ? "bias" : "weight");
        sh[n][0] = C;
        ts[n] = (names_tensor){nm[n], 1, sh[n]};
    }
    return n;
}

START_TEST(fit_gpt)
{
    names_tensor ts[64];
    int64_t sh[64][2];
    char nm[64][32], err[512];
    int layers, width, seq;
    int n = gpt(ts, sh, nm, 64, 32, 3);
    ck_assert_int_eq(n, 2 + 36 + 2);
    ck_assert_int_eq(names_fit_gpt(ts, n, 256, &layers, &width, &seq, err, sizeof err), 0);
    ck_assert_int_eq(layers, 3);
    ck_assert_int_eq(width, 64);
    ck_assert_int_eq(seq, 32);
    sh[2 + 12 + 8][0] = 255; /* h1.mlp.c_fc.weight (255, 64) */
    ck_assert_int_eq(names_fit_gpt(ts, n, 256, &layers, &width, &seq, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "h1.mlp.c_fc.weight has the wrong shape for width 64"));
    n = gpt(ts, sh, nm, 64, 32, 3);
    ts[2 + 24 + 5].name = "h2.attn.c_proj.b";
    ck_assert_int_eq(names_fit_gpt(ts, n, 256, &layers, &width, &seq, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "h2.attn.c_proj.bias is missing"));
    n = gpt(ts, sh, nm, 64, 32, 3);
    ck_assert_int_eq(names_fit_gpt(ts, n - 1, 256, &layers, &width, &seq, err, sizeof err),
                     -EINVAL);
    ck_assert_int_eq(names_fit_gpt(ts, n, 128, &layers, &width, &seq, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "emb.wte must be (128, C)"));
    ts[n] = ts[0];
    ts[n].name = "extra";
    ck_assert_int_eq(names_fit_gpt(ts, n + 1, 256, &layers, &width, &seq, err, sizeof err),
                     -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "1 tensor is not ddp-train's GPT's"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ckpt_names");
    check_tcase(s, "names", 30, renames, torch, fit, fit_gpt);
    return check_run(s);
}
