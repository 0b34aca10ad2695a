/*
 * libddp's checkpoint format (internal): the manifest, its parser, the shard files and CRC32C.
 * The library (ckpt.c: save, load) and ddp-ckpt (inspect, verify, export, import) both go
 * through this header, so the format is read in one place.
 *
 * A checkpoint is the directory ROOT/step-NNNNNNNNNNNN (DDP__CKPT_DIR_FMT) holding:
 *
 *   shard-RRRRR-of-WWWWW.bin   one per rank r of the saving world W (DDP__CKPT_SHARD_FMT): for
 *                              each state array s in the manifest's "state" order, shard_total
 *                              little-endian float32 elements: rank r's part of every group, in
 *                              group order, group g's part at element shard_offset[g] of the
 *                              array. Part r of group g is the arena elements
 *                              [offset + r * shard, offset + (r + 1) * shard). No header, no
 *                              padding between arrays: the file is exactly
 *                              nstate * shard_total * 4 bytes.
 *   manifest.json              written last, by rank 0, through manifest.json.tmp (fsync,
 *                              rename, fsync of the directory). Its presence marks the
 *                              checkpoint complete.
 *
 * The manifest (version 1), every key required unless marked optional:
 *
 *   {
 *     "format": "ddp-checkpoint", "version": 1,
 *     "step": 200,                optimizer steps taken (ddp_step_info.step)
 *     "attempted": 203,           ddp_step() calls, skipped steps included
 *     "world_size": 4, "zero_stage": 2, "dtype": "float32",
 *     "optimizer": {"kind": "adamw",   ddp_optimizer_name(): "sgd", "adamw", "lion"
 *                   "momentum": 0, "nesterov": false, "weight_decay": 0, "beta1": 0.9,
 *                   "beta2": 0.999, "eps": 1e-8, "clip_norm": 0},   all of ddp_options'
 *     "state": ["param", "exp_avg", "exp_avg_sq"]     "param", then the optimizer's state
 *                                                      arrays, named by its row of optimizer.c
 *                                                      (sgd with momentum: "momentum_buffer",
 *                                                      without: none; lion: "exp_avg"),
 *     "units": ["fc1", "fc2"],
 *     "params": [{"name": "fc1.weight", "unit": 0, "shape": [256, 784], "dtype": "float32",
 *                 "offset": 0, "count": 200704, "group": 1}, ...]     arena offset, elements
 *     "groups": [{"offset": 0, "count": 201000, "padded": 201000, "shard": 50250,
 *                 "shard_offset": 0, "first": 0, "last": 1}, ...]   the saving plan (plan.h)
 *     "total": 203530,            arena elements, padding included
 *     "shard_total": 50883,       elements of each state array in each shard file
 *     "chunk_bytes": 1048576,     the CRC chunk size
 *     "shards": [{"file": "shard-00000-of-00004.bin", "bytes": 610596, "crc32c": 12345,
 *                 "chunks": [crc of bytes [0, chunk_bytes), [chunk_bytes, 2 chunk_bytes), ...
 *                            the last one shorter]}, ...]   one per rank, in rank order
 *     "progress": {"epoch": 3, "position": 17, "seed": 42},
 *     "user": {...}               optional: the caller's JSON object
 *   }
 *
 * CRCs are CRC32C (Castagnoli, reflected, initial and final XOR 0xFFFFFFFF: crc32c("123456789")
 * is 0xE3069283), as unsigned JSON integers. Integers beyond 2^53 never occur (sizes are
 * bytes of files that fit in memory).
 */
#ifndef DDP_CKPT_H
#define DDP_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "ddp.h"
#include "optimizer.h"

#define DDP__CKPT_FORMAT "ddp-checkpoint"
#define DDP__CKPT_VERSION 1
#define DDP__CKPT_MANIFEST "manifest.json"
#define DDP__CKPT_MANIFEST_TMP "manifest.json.tmp"
#define DDP__CKPT_DIR_FMT "step-%012" PRId64 /* needs <inttypes.h> */
#define DDP__CKPT_SHARD_FMT "shard-%05d-of-%05d.bin"
#define DDP__CKPT_CHUNK_BYTES ((size_t)1 << 20)
#define DDP__CKPT_MAX_STATE (1 + DDP__OPT_MAX_STATE)
#define DDP__CKPT_MAX_DIMS 8

/* ------------------------------------------------------------------------------------------ */
/* CRC32C (crc32c.c)                                                                           */
/* ------------------------------------------------------------------------------------------ */

/*
 * Extends `crc` (0 to start) by n bytes at buf and returns the new value: crc32c of a whole
 * buffer is ddp__crc32c(0, buf, n), and ddp__crc32c(ddp__crc32c(0, a, na), b, nb) is the CRC of
 * a followed by b. Uses SSE4.2's crc32 instruction when the CPU has it (chosen at run time),
 * else a table. Thread-safe; never fails.
 */
uint32_t ddp__crc32c(uint32_t crc, const void *buf, size_t n);

/* mkdir -p `path` (ckpt.c; the summary writer's directory too). Returns 0, -ENAMETOOLONG or the
 * negative errno of the mkdir that failed. */
int ddp__make_dirs(const char *path);

/* ------------------------------------------------------------------------------------------ */
/* Loading's range arithmetic (ckpt.c)                                                         */
/* ------------------------------------------------------------------------------------------ */

struct ddp__ckpt_manifest;
struct ddp__plan;

/*
 * One contiguous piece of a load: `count` elements that go to element `dst` of the range asked
 * for, held by shard file `shard` at element `src` of each state array (byte
 * 4 * (s * shard_total + src) of the file for array s).
 */
typedef struct ddp__ckpt_run {
    size_t dst;
    int shard;
    size_t src;
    size_t count;
} ddp__ckpt_run;

/*
 * Maps the elements [begin, end) of the arena of `plan` (the loading layout) to where the
 * checkpoint `mf` holds them, in increasing dst order, splitting where a parameter ends and where
 * the saving layout's parts end, merging what is contiguous on both sides. Elements that are
 * padding in the loading layout get no run (they stay zero). The two must have the same
 * parameters in the same order (same counts: the caller checks names and shapes). Writes the
 * first min(*n, cap) runs to runs[cap] and sets *n to the number there are (cap 0 counts them).
 * Returns 0, or -EINVAL (the range leaves the arena, or the parameters differ in number). Pure.
 */
int ddp__ckpt_map_range(const struct ddp__ckpt_manifest *mf, const struct ddp__plan *plan,
                        size_t begin, size_t end, ddp__ckpt_run *runs, size_t cap, size_t *n);

/* ------------------------------------------------------------------------------------------ */
/* The manifest (ckpt_manifest.c)                                                              */
/* ------------------------------------------------------------------------------------------ */

typedef struct ddp__ckpt_param {
    char *name;
    int unit;
    int ndim;
    int64_t shape[DDP__CKPT_MAX_DIMS];
    size_t offset; /* first element in the saving arena */
    size_t count;  /* elements (the product of shape) */
    int group;     /* the group holding it */
} ddp__ckpt_param;

typedef struct ddp__ckpt_group {
    size_t offset, count, padded, shard, shard_offset;
    int first, last; /* its parameters */
} ddp__ckpt_group;

typedef struct ddp__ckpt_shard {
    char *file;       /* the file name, relative to the checkpoint directory */
    uint64_t bytes;   /* its size: nstate * shard_total * 4 */
    uint32_t crc32c;  /* of the whole file */
    uint32_t *chunks; /* [nchunks] of each chunk_bytes piece, the last one shorter */
    size_t nchunks;   /* ceil(bytes / chunk_bytes) (0 for an empty file) */
} ddp__ckpt_shard;

/* A parsed manifest. Everything is owned by it; free with ddp__ckpt_manifest_free(). */
typedef struct ddp__ckpt_manifest {
    char *dir; /* the checkpoint directory it was read from */
    int version;
    int64_t step, attempted;
    int world, stage;
    ddp_optimizer optimizer;
    float momentum, weight_decay, beta1, beta2, eps, clip_norm;
    int nesterov;
    int nstate;
    char state[DDP__CKPT_MAX_STATE][16]; /* "param", then the optimizer's arrays */
    int nunits;
    char **units;
    int nparams;
    ddp__ckpt_param *params;
    int ngroups;
    ddp__ckpt_group *groups;
    size_t total, shard_total, chunk_bytes;
    ddp__ckpt_shard *shards; /* [world] */
    ddp_checkpoint_progress progress;
    char *user_json; /* the "user" object as compact JSON text, or NULL */
} ddp__ckpt_manifest;

/*
 * Reads and checks DIR/manifest.json: the JSON itself, every required key with its type, and
 * the layout's consistency (groups contiguous from 0 and padded to a multiple of the world,
 * shard = padded / world, shard_offset the running sum of shards, shard_total their sum, each
 * parameter inside its group and the product of its shape, parameters in order without
 * overlap, the state arrays those of the optimizer, one shard entry per rank with
 * bytes = nstate * shard_total * 4 and ceil(bytes / chunk_bytes) chunk CRCs). Fills *out
 * (written only on success). Returns 0; -ENOENT (no manifest: the checkpoint is incomplete);
 * -EPROTO (not JSON, or a key missing, of the wrong type or inconsistent); -EIO, -EACCES;
 * -ENOMEM. On failure err[cap] (may be NULL) gets a sentence naming the file and the problem,
 * e.g. "ckpt/step-000000000200/manifest.json: params[3].shape: the product is 2560, count says
 * 2561". Thread-safe.
 */
int ddp__ckpt_manifest_read(const char *dir, ddp__ckpt_manifest *out, char *err, size_t cap);

/* The manifest's optimizer as options: ddp_options_init()'s, with the optimizer and every
 * hyper-parameter the manifest holds. */
void ddp__ckpt_manifest_options(const ddp__ckpt_manifest *mf, ddp_options *o);

/* Frees what the manifest owns and zeroes it. NULL or a zeroed manifest is a no-op. */
void ddp__ckpt_manifest_free(ddp__ckpt_manifest *mf);

/*
 * Checks shard file `rank` of the manifest whole: it exists, its size is `bytes`, every chunk's
 * CRC32C and the whole file's match. Returns 0; -ENOENT (missing), -EPROTO (wrong size),
 * -EBADMSG (a CRC mismatch: err names the file and the first bad chunk's byte range), -EIO;
 * err[cap] as above. Reads the file once, sequentially. Thread-safe.
 */
int ddp__ckpt_verify_shard(const ddp__ckpt_manifest *mf, int rank, char *err, size_t cap);

#endif /* DDP_CKPT_H */
