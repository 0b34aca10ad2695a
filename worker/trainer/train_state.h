/*
 * train_state: what ddp-train saves next to libddp's model state in a checkpoint's user section
 * (ddp_checkpoint_save()'s user_json), and the decision whether a checkpoint may resume this
 * run. libddp keeps the parameters, the optimizer state and the sampler's position (epoch,
 * step within it, seed); this adds the trainer's global step, which drives the learning-rate
 * schedule, and the settings a resumed run must share with the interrupted one.
 *
 * Pure logic: JSON text in and out (jansson), no files, no communication. The world size, ZeRO
 * stage and accumulation are recorded for the log but never compared: a checkpoint loads at any
 * of them (the global batches do not depend on them, data.h).
 *
 * Conventions: 0 or a negative errno; a sentence for the caller in err[cap] (may be NULL) on
 * failure or on a warning. Out-parameters are written only on success. Thread-safe.
 */
#ifndef DDP_TRAIN_STATE_H
#define DDP_TRAIN_STATE_H

#include <stddef.h>
#include <stdint.h>

typedef struct train_state {
    int64_t step;                        /* the next step to train, counted from epoch 0's step 0 */
    int world, zero, grad_accum;         /* of the saving run: informational */
    int in_dim, hidden, layers, classes; /* the model: must match */
    int global_batch, train_samples;     /* the data order: must match ... */
    uint64_t seed;                       /* ... */
    int optimizer;                       /* ddp_optimizer: must match */
    int schedule;                        /* ddp_schedule_kind: a warning if it differs */
    double lr;                           /* ... */
    int64_t warmup, total_steps;         /* ... */
    int heads; /* the model's attention heads (--model gpt; 0: none, not written): must match */
} train_state;

/*
 * Writes `st` as a JSON object (compact text, malloc'ed: the caller frees it) into *out:
 *   {"trainer": "ddp-train", "version": 1, "step": 468, "world": 2, "zero": 1, "grad_accum": 1,
 *    "model": {"in_dim": 784, "hidden": 512, "layers": 2, "classes": 10},  (+ "heads" if any)
 *    "data": {"global_batch": 256, "train_samples": 60000, "seed": 1},
 *    "optimizer": "adamw",
 *    "schedule": {"kind": "cosine", "lr": 0.001, "warmup": 100, "total_steps": 3510},
 *    "metadata": {"model": "mlp", "layer_sizes": "784,512,512,10", ...}}
 * "metadata" holds `meta` (string pairs, NULL-ended, borrowed; NULL or none: no "metadata"):
 * what describes the model and its inputs to another program, which ddp-ckpt export copies
 * into a safetensors file's __metadata__. Returns 0 or -ENOMEM.
 */
int train_state_json(const train_state *st, const char *const *meta, char **out);

/*
 * Parses what train_state_json() wrote ("metadata", optional, is not read). Returns 0 and fills
 * *out; -EPROTO (not JSON, not ddp-train's, another version, a key missing or of the wrong
 * type: err names it).
 */
int train_state_parse(const char *json, train_state *out, char *err, size_t cap);

/*
 * May a run with settings `now` resume from a checkpoint holding `saved`? Returns 0 (yes, the
 * same settings); 1 (yes, but the learning-rate schedule differs, so training from here on
 * differs from the interrupted run's: err says how); -EINVAL (no: the model, the data order or
 * the optimizer differs; err names the first setting and both values, as a sentence).
 * The steps, world sizes, stages and accumulations are not compared.
 */
int train_state_compare(const train_state *saved, const train_state *now, char *err, size_t cap);

#endif /* DDP_TRAIN_STATE_H */
