/*
 * rng: the small deterministic random number generator of ddp-train's model and data code.
 *
 * xoshiro256** (Blackman and Vigna, 2018) seeded through splitmix64. A generator is made from a
 * (seed, stream) pair, so that independent uses get independent sequences that depend on nothing
 * else: the initial values of parameter p come from stream p of --seed, the permutation of epoch
 * e from its own stream (see data.c), whatever order the calls come in. Floats take the top 24
 * bits of a draw: exactly representable, uniform on [0, 1) in steps of 2^-24.
 *
 * Deliberately not bit-compatible with torch's Mersenne Twister: tests that compare against
 * PyTorch take the initial weights ddp-train dumps (--dump-init) instead of re-drawing them.
 * Header-only (static inline) so that the sampler and the model share one copy; not
 * cryptographic, not thread-safe per generator (each user owns its own).
 */
#ifndef DDP_TRAIN_RNG_H
#define DDP_TRAIN_RNG_H

#include <stdint.h>

typedef struct rng {
    uint64_t s[4];
} rng;

static inline uint64_t rng_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A generator for (seed, stream): splitmix64 over seed, then the stream mixed in. */
static inline void rng_init(rng *r, uint64_t seed, uint64_t stream)
{
    uint64_t x = seed;
    uint64_t mix = rng_splitmix64(&x) ^ (stream * 0xd1342543de82ef95ull);
    for (int i = 0; i < 4; i++)
        r->s[i] = rng_splitmix64(&mix);
}

static inline uint64_t rng_rotl(uint64_t v, int k)
{
    return (v << k) | (v >> (64 - k));
}

/* The next 64 random bits (xoshiro256**). */
static inline uint64_t rng_next(rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = rng_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rng_rotl(s[3], 45);
    return out;
}

/* Uniform on [0, 1): the top 24 bits scaled by 2^-24. */
static inline float rng_float(rng *r)
{
    return (float)(rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

/* Uniform on [0, n) for 0 < n <= 2^32, without modulo bias (Lemire's multiply-and-reject). */
static inline uint32_t rng_below(rng *r, uint32_t n)
{
    uint64_t m = (rng_next(r) >> 32) * (uint64_t)n;
    uint32_t low = (uint32_t)m;
    if (low < n) {
        uint32_t threshold = (uint32_t)(-n) % n;
        while (low < threshold) {
            m = (rng_next(r) >> 32) * (uint64_t)n;
            low = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

#endif /* DDP_TRAIN_RNG_H */
