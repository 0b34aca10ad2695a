/*
 * ddp__ckpt_verify_shard() (ckpt.h): checks one shard file of a parsed manifest whole, for
 * ddp-ckpt verify and for anyone who wants to know a checkpoint is intact before relying on it.
 * The file is read once, front to back, a chunk (the manifest's chunk_bytes) at a time: its size
 * is checked first (fstat), then each chunk's CRC32C against the manifest's list while the
 * whole-file CRC is extended, so that memory stays at one chunk whatever the file's size.
 *
 * Not here: the manifest's own checks (ckpt_manifest.c did them: chunk count and sizes are
 * consistent when this is called) and partial reads for loading (the library's load checks the
 * chunks it reads as it reads them).
 */
#include "ckpt.h"
#include "fmt.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Reads exactly n bytes at the file's position; 0, or -EIO (short: the file shrank), -errno. */
static int read_full(int fd, unsigned char *buf, size_t n)
{
    while (n > 0) {
        ssize_t k = read(fd, buf, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return -errno;
        if (k == 0)
            return -EIO;
        buf += k;
        n -= (size_t)k;
    }
    return 0;
}

int ddp__ckpt_verify_shard(const ddp__ckpt_manifest *mf, int rank, char *err, size_t cap)
{
    if (!mf || rank < 0 || rank >= mf->world || !mf->shards || mf->chunk_bytes == 0) {
        fmt_err(err, cap, 0, "ddp__ckpt_verify_shard: bad argument");
        return -EINVAL;
    }
    const ddp__ckpt_shard *sh = &mf->shards[rank];
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", mf->dir, sh->file) >= (int)sizeof path) {
        fmt_err(err, cap, 0, "%s/%s: path too long", mf->dir, sh->file);
        return -ENAMETOOLONG;
    }
    unsigned char *buf = NULL;
    int rc = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = -errno;
        if (rc == -ENOENT)
            fmt_err(err, cap, 0, "%s: missing (shard %d of %d)", path, rank, mf->world);
        else
            fmt_err(err, cap, 0, "%s: cannot open: %s", path, strerror(-rc));
        goto out;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        rc = -errno;
        fmt_err(err, cap, 0, "%s: cannot stat: %s", path, strerror(-rc));
        goto out;
    }
    if ((uint64_t)st.st_size != sh->bytes) {
        rc = -EPROTO;
        fmt_err(err, cap, 0, "%s: %" PRIu64 " bytes, the manifest says %" PRIu64 " (%s)", path,
                (uint64_t)st.st_size, sh->bytes,
                (uint64_t)st.st_size < sh->bytes ? "truncated" : "too long");
        goto out;
    }
    size_t chunk = mf->chunk_bytes;
    if (sh->bytes > 0 && !(buf = malloc(sh->bytes < chunk ? (size_t)sh->bytes : chunk))) {
        rc = -ENOMEM;
        fmt_err(err, cap, 0, "%s: out of memory for a %zu-byte chunk", path, chunk);
        goto out;
    }
    uint32_t whole = 0;
    uint64_t bad_lo = 0, bad_hi = 0;
    int bad = 0;
    for (size_t c = 0; c < sh->nchunks; c++) {
        uint64_t lo = (uint64_t)c * chunk;
        size_t n = sh->bytes - lo < chunk ? (size_t)(sh->bytes - lo) : chunk;
        if ((rc = read_full(fd, buf, n)) < 0) {
            fmt_err(err, cap, 0, "%s: read error in bytes [%" PRIu64 ", %" PRIu64 "): %s", path, lo,
                    lo + n, rc == -EIO ? "the file shrank while read" : strerror(-rc));
            rc = -EIO;
            goto out;
        }
        uint32_t crc = ddp__crc32c(0, buf, n);
        whole = ddp__crc32c(whole, buf, n);
        if (crc != sh->chunks[c] && !bad) {
            bad = 1;
            bad_lo = lo;
            bad_hi = lo + n;
        }
    }
    if (bad) {
        rc = -EBADMSG;
        fmt_err(err, cap, 0, "%s: CRC32C mismatch in bytes [%" PRIu64 ", %" PRIu64 ")", path,
                bad_lo, bad_hi);
    } else if (whole != sh->crc32c) {
        /* Every chunk matches but the whole does not: the manifest's list disagrees with its
           own file CRC (or the file changed between chunks). */
        rc = -EBADMSG;
        fmt_err(err, cap, 0,
                "%s: CRC32C of the whole file is %08" PRIx32 ", the manifest says %08" PRIx32, path,
                whole, sh->crc32c);
    }
out:
    free(buf);
    if (fd >= 0)
        close(fd);
    return rc;
}
