/*
 * data: ddp-train's input pipeline. Fashion-MNIST from IDX files (gzip-compressed or plain) or
 * byte windows of text files (data_load_text(), for text models), a distributed sampler whose
 * global batches do not depend on the world size, and a loader thread that gathers the next
 * micro-batch while the current one trains. The sampler and the loader treat both kinds alike:
 * a sample is an image or a window.
 *
 * Sampling. Every epoch e has a permutation of the training set drawn from (seed, e) alone. Step
 * s of the epoch trains on the global batch perm[s*G, (s+1)*G) (G = global_batch); rank r takes
 * the contiguous part [r*G/W, (r+1)*G/W) of it (W = world) and splits that into grad_accum
 * micro-batches of G/W/grad_accum rows, in order. So the set of samples of a step, and with it
 * the averaged gradient, is the same for every world size and accumulation count. The last
 * n mod G samples of each epoch's permutation are dropped (drop-last): every step has a full
 * global batch, and an epoch has n / G steps (60000 / 256 = 234 steps, 96 samples dropped; the
 * permutation differs every epoch, so no sample is dropped for good).
 *
 * Conventions: functions that can fail return 0 or a negative errno (-ENOENT, -EIO, -EPROTO for
 * a malformed file, -EINVAL, -ENOMEM) and leave a sentence for data_last_error() that names the
 * file and what is wrong with it. Out-parameters are written only on success.
 */
#ifndef DDP_TRAIN_DATA_H
#define DDP_TRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

/* Where Debian's dataset-fashion-mnist package puts the four .gz files. */
#define DATA_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"

/*
 * Pixels become x = (p / 255 - DATA_MEAN) / DATA_STD, computed in float in that order: the mean
 * and standard deviation of Fashion-MNIST's training pixels scaled to [0, 1] (torchvision's
 * customary Normalize((0.2860,), (0.3530,))), so that inputs are centred with unit variance.
 */
#define DATA_MEAN 0.2860f
#define DATA_STD 0.3530f

/* One pixel normalised: data_load() on the host and the CUDA path's gather (mlp_cuda.cu) on the
   device both call this, so that they agree to the bit. */
#ifdef __CUDACC__
#define DATA_HOST_DEVICE __host__ __device__
#else
#define DATA_HOST_DEVICE
#endif
static inline DATA_HOST_DEVICE float data_normalize(uint8_t p)
{
    return ((float)p / 255.0f - DATA_MEAN) / DATA_STD;
}

/* The calling thread's last failure sentence ("" if none). */
const char *data_last_error(void);

/*
 * Reads an IDX file of unsigned bytes (magic 0x0000 0x08 ndim, then ndim big-endian 32-bit
 * sizes, then the data) with exactly `ndim` (1 to 3) dimensions, gzip-compressed or not (zlib
 * reads both). Checks the magic, that no size is 0 and the total stays below 2^30 bytes, and
 * that the data is exactly as long as the header says. Returns 0, fills dims[0..ndim) and sets
 * *data (malloc'ed, the caller frees it); or -ENOENT/-EACCES/-EIO (cannot open or read),
 * -EINVAL (not a regular file: a FIFO, which would wait for a writer, a directory, a device;
 * "PATH: not a regular file (a FIFO)"), -EPROTO (bad magic, bad sizes, truncated, too long,
 * corrupt gzip) or -ENOMEM, with a sentence that starts with the path.
 */
int data_idx_read(const char *path, int ndim, int *dims, uint8_t **data);

/*
 * A data set in memory: labelled images (data_load()) or byte windows of text
 * (data_load_text()). For text, x and y are NULL, rows and cols 0 and dim = seq; sample i is
 * tok[i * (seq + 1) .. + seq]: the model's input is its first seq bytes, its targets the last
 * seq (the same bytes shifted by one).
 */
typedef struct data_set {
    int n;        /* samples */
    int rows;     /* image height (28) */
    int cols;     /* image width (28) */
    int dim;      /* rows * cols, the model's input width; text: seq */
    float *x;     /* (n, dim) normalised pixels */
    uint8_t *y;   /* (n) labels in [0, 10) */
    int seq;      /* text: the context length T; 0 for images */
    uint8_t *tok; /* text: (n, seq + 1) bytes */
} data_set;

/*
 * Loads split `split` ("train" or "t10k") from directory `dir` (NULL: DATA_DEFAULT_DIR): the
 * files <split>-images-idx3-ubyte and <split>-labels-idx1-ubyte, each taken with a .gz suffix
 * when that file exists, else without. Checks both files (data_idx_read()), that they hold the
 * same number of samples and that every label is below 10. Returns 0 and fills *out, or the
 * codes of data_idx_read().
 */
int data_load(const char *dir, const char *split, data_set *out);

/* Where Debian's fortunes package puts its text files (data_load_text()'s default corpus). */
#define DATA_TEXT_DEFAULT_DIR "/usr/share/games/fortunes"

/*
 * Loads split `split` ("train" or "test", the validation text) of a byte-level text corpus as
 * windows of seq + 1 bytes (1 <= seq <= 65536). paths[0..npaths) (borrowed) name regular files
 * or directories (a directory stands for its regular files, sorted by name, without those
 * whose name starts with "." or ends in ".dat" or ".u8": the index and UTF-8 link files of
 * fortune's data directory); npaths 0 means DATA_TEXT_DEFAULT_DIR.
 *
 * The split rule, fixed: each file is cut once, at the start of the first fortune-style record
 * (a line after a line holding only "%") that begins at or after 95% of the file's bytes, or
 * exactly at 95% (rounded down) when no such record exists; the bytes before the cut are
 * training text, the bytes after it validation text. The training parts of all files, in
 * order, form one byte stream, the validation parts another. A split's stream of L bytes holds
 * n = (L - 1) / seq windows: window i is bytes [i * seq, i * seq + seq + 1), so consecutive
 * windows share one byte and every byte but the first is a target exactly once.
 *
 * Returns 0 and fills *out; -EINVAL (bad seq or split, a path that is no regular file or
 * directory, or a split too short for one window: the sentence says which), -ENOENT/-EACCES/
 * -EIO (cannot open or read a file), -EPROTO (more than 2^30 bytes in all) or -ENOMEM.
 */
int data_load_text(const char *const *paths, int npaths, int seq, const char *split, data_set *out);

/* Frees the set's arrays and zeroes it. NULL is a no-op. */
void data_set_free(data_set *ds);

/*
 * Writes the set's pixels, (n, dim) bytes, into `out`: the normalisation undone, exactly (the
 * CUDA path uploads the bytes and normalises on the device, as data_load() does).
 */
void data_pixels(const data_set *ds, uint8_t *out);

/* Copies rows idx[0..count) of an image set into x (count, dim) and y (count). */
void data_gather(const data_set *ds, const int32_t *idx, int count, float *x, uint8_t *y);
/* Copies windows idx[0..count) of a text set into tok (count, seq + 1). */
void data_gather_text(const data_set *ds, const int32_t *idx, int count, uint8_t *tok);

/* ------------------------------------------------------------------------------------------ */
/* The distributed sampler                                                                     */
/* ------------------------------------------------------------------------------------------ */

typedef struct data_sampler {
    int n;            /* samples in the data set */
    int global_batch; /* G: samples per optimizer step, over all ranks and micro-steps */
    int world;        /* W */
    int rank;         /* this rank, in [0, W) */
    int grad_accum;   /* micro-steps per optimizer step */
    int micro;        /* rows per micro-batch: G / W / grad_accum */
    uint64_t seed;
    int epoch;     /* the epoch perm belongs to; -1 before data_sampler_set_epoch() */
    int32_t *perm; /* (n) the epoch's permutation of [0, n) */
} data_sampler;

/*
 * Sets up a sampler. Returns 0, -EINVAL (W < 1, rank out of range, grad_accum < 1, G < 1 or
 * G > n, or G not a multiple of W * grad_accum: the sentence says which) or -ENOMEM.
 */
int data_sampler_init(data_sampler *s, int n, int global_batch, int world, int rank, int grad_accum,
                      uint64_t seed);

/* Frees the permutation. NULL is a no-op. */
void data_sampler_free(data_sampler *s);

/* Steps per epoch: n / G, the incomplete last global batch dropped. */
int data_sampler_steps(const data_sampler *s);

/* Draws epoch `epoch`'s permutation: a Fisher-Yates shuffle of [0, n) from (seed, epoch). */
void data_sampler_set_epoch(data_sampler *s, int epoch);

/* Step `step`'s whole global batch: G indices (the same on every rank). */
const int32_t *data_sampler_global(const data_sampler *s, int step);

/* This rank's micro-batch k (0 <= k < grad_accum) of step `step`: s->micro indices. */
const int32_t *data_sampler_micro(const data_sampler *s, int step, int k);

/* ------------------------------------------------------------------------------------------ */
/* The loader thread                                                                           */
/* ------------------------------------------------------------------------------------------ */

/* One micro-batch, gathered into contiguous rows. */
typedef struct data_batch {
    int epoch;
    int step;             /* within the epoch */
    int64_t global_step;  /* epoch * steps per epoch + step: counted from epoch 0's step 0 */
    int micro;            /* the micro-step k */
    int count;            /* rows */
    const int32_t *index; /* (count) the rows' indices in the data set */
    const float *x;       /* (count, dim); NULL for text */
    const uint8_t *y;     /* (count); NULL for text */
    const uint8_t *tok;   /* text: (count, seq + 1) byte windows; NULL for images */
} data_batch;

typedef struct data_loader data_loader;

/*
 * Starts a thread that walks this rank's micro-batches of `s` (its configuration is copied; the
 * loader draws its own permutations) from step `start_step` of epoch `start_epoch` to the end
 * of epoch `epochs` - 1, stopping early before global step max_steps (epoch * steps per epoch
 * + step, counted from epoch 0's step 0) when max_steps > 0, and gathers them from `ds`
 * (borrowed: it must outlive the loader) into two buffers: while the caller trains on one, the
 * thread fills the other. A resumed run passes the position its checkpoint saved: since the
 * global batches do not depend on the world size, it trains on the samples the interrupted run
 * would have trained on, at any world size. Returns 0 and sets *out, -EINVAL (a start before
 * epoch 0 or past the epoch's steps, ...), -ENOMEM or a pthread error (negated).
 */
int data_loader_create(const data_set *ds, const data_sampler *s, int start_epoch, int start_step,
                       int epochs, int64_t max_steps, data_loader **out);

/*
 * Waits for the next micro-batch and sets *out to it; the batch stays valid until the next
 * call (which hands its buffer back to the thread). Returns 0, or 1 when every batch has been
 * handed out (*out untouched). Not thread-safe: one consumer.
 */
int data_loader_next(data_loader *ld, const data_batch **out);

/* Stops the thread (even mid-epoch) and frees the loader. NULL is a no-op. */
void data_loader_free(data_loader *ld);

#endif /* DDP_TRAIN_DATA_H */
