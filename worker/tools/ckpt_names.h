/*
 * ckpt_names: the tensor names of ddp-ckpt's export and import (ddp-ckpt(1), NAMES): renaming
 * by rules "OLD=NEW,...", the mapping between ddp-train's MLP names ("fc1.weight") and the
 * indices of PyTorch's nn.Sequential ("0.weight"), and the check that a set of tensors is a
 * model ddp-train builds (its MLP or its GPT).
 *
 * Pure logic: no I/O, no libddp. A name list is an array of n malloc'ed strings; a function that
 * changes it replaces every string only on success (on failure the list is as it was).
 * Conventions: 0 or a negative errno; one sentence for the user in err[cap] on failure (err may
 * be NULL). Thread-safe.
 */
#ifndef DDP_CKPT_NAMES_H
#define DDP_CKPT_NAMES_H

#include <stddef.h>
#include <stdint.h>

/*
 * Checks the syntax of a rename spec "OLD=NEW[,OLD=NEW...]": each OLD non-empty, each rule with
 * one '='. Returns 0 or -EINVAL (err names the rule).
 */
int names_rename_check(const char *spec, char *err, size_t cap);

/*
 * Renames names[0..n) by `spec` (names_rename_check()'s syntax). A rule OLD=NEW applies to a
 * name equal to OLD or beginning with "OLD." (a module path), replacing that part with NEW; an
 * empty NEW removes it with its dot ("module=" turns "module.0.weight" into "0.weight"). The
 * first rule that applies to a name wins; rules do not chain. Returns 0; -EINVAL (bad syntax),
 * -ENOENT (a rule applies to no name: err names it), -EEXIST (two names become one, or one
 * becomes empty: err names them) or -ENOMEM.
 */
int names_rename(char **names, int n, const char *spec, char *err, size_t cap);

/*
 * ddp-train's MLP names to nn.Sequential's: "fcK.REST" becomes "(2K-2).REST" (Linear layers at
 * 0, 2, 4, ... with an activation module between each two). Returns 0, -EINVAL (a name is not
 * "fcK.REST" with K >= 1: err names it) or -ENOMEM.
 */
int names_to_torch(char **names, int n, char *err, size_t cap);

/*
 * nn.Sequential's names to ddp-train's MLP names: "I.REST" with I a module index; the distinct
 * indices in increasing order become fc1, fc2, ... They must step by 2 (a Linear layer, then
 * its activation: 0, 2, 4, ..., or 1, 3, 5, ... after a leading nn.Flatten). Returns 0, -EINVAL
 * (a name is not "I.REST", or the indices do not step by 2: err says which) or -ENOMEM.
 */
int names_from_torch(char **names, int n, char *err, size_t cap);

/* One tensor as names_fit_mlp() sees it. */
typedef struct names_tensor {
    const char *name;
    int ndim;
    const int64_t *shape; /* (ndim) */
} names_tensor;

/*
 * Is ts[0..n) a model ddp-train builds: its MLP (--model mlp), "fc1" ... "fcL" (L from 2 to
 * `max_linear`), each exactly a "weight" (out, in) and a "bias" (out), fc1's in > 0, every
 * hidden width the same (--hidden), each layer's in its predecessor's out, the last out
 * `classes`? Returns 0 with *in_dim, *hidden and *layers (hidden layers) set when it is;
 * -EINVAL when not, with err naming the tensors whose names do not fit (at most a few, then a
 * count), or else the first shape that does not.
 */
int names_fit_mlp(const names_tensor *ts, int n, int max_linear, int classes, int *in_dim,
                  int *hidden, int *layers, char *err, size_t cap);

/*
 * Is ts[0..n) ddp-train's GPT (--model gpt, worker/trainer/gpt.h): "emb.wte" (vocab, C),
 * "emb.wpe" (T, C), blocks "h0" ... "h<L-1>" each with exactly gpt.h's twelve tensors at width
 * C, "ln_f.weight" and "ln_f.bias" (C), and nothing else? Returns 0 with *layers, *width and
 * *seq_len set when it is; -EINVAL when not, with err naming the first tensor missing or
 * misshapen, or how many are extra.
 */
int names_fit_gpt(const names_tensor *ts, int n, int vocab, int *layers, int *width, int *seq_len,
                  char *err, size_t cap);

#endif /* DDP_CKPT_NAMES_H */
