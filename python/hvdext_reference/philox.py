"""Philox4x32-10, the counter-based generator behind every random draw in horovod-ext.

Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3" (SC 2011). A bijection of a 128-bit
counter under a 64-bit key, ten rounds of

    (c0, c1, c2, c3) -> (hi(M1*c2) ^ c1 ^ k0, lo(M1*c2), hi(M0*c0) ^ c3 ^ k1, lo(M0*c0)),
    (k0, k1) += (W0, W1)  (between rounds),

with M0 = 0xD2511F53, M1 = 0xCD9E8D57, W0 = 0x9E3779B9, W1 = 0xBB67AE85.

horovod-ext's key layout (shared by the NumPy reference, the CPU kernels and the GPU kernels):
    key     = (seed & 0xffffffff, seed >> 32)
    counter = (element // 4, step, tensor, rank)
and element i takes word i % 4 of its block. A uniform draw is u = (word >> 8) * 2**-24, exact in float32.
"""
import numpy as np

M0 = np.uint64(0xD2511F53)
M1 = np.uint64(0xCD9E8D57)
W0 = 0x9E3779B9
W1 = 0xBB67AE85
MASK32 = np.uint64(0xFFFFFFFF)
ROUNDS = 10


def philox4x32(counters, key):
    """Philox4x32-10 of an array of counters.

    counters: uint32 array of shape (m, 4); key: (k0, k1) Python ints. Returns uint32 array (m, 4).
    """
    c = [counters[:, j].astype(np.uint64) for j in range(4)]
    k0, k1 = int(key[0]) & 0xFFFFFFFF, int(key[1]) & 0xFFFFFFFF
    for r in range(ROUNDS):
        p0 = M0 * c[0]
        p1 = M1 * c[2]
        c = [
            ((p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k0)) & MASK32,
            p1 & MASK32,
            ((p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k1)) & MASK32,
            p0 & MASK32,
        ]
        k0 = (k0 + W0) & 0xFFFFFFFF
        k1 = (k1 + W1) & 0xFFFFFFFF
    return np.stack(c, axis=1).astype(np.uint32)


def random_words(n, seed, step, tensor, rank):
    """The n uint32 words for elements 0..n-1 under the key (seed, step, tensor, rank)."""
    blocks = (n + 3) // 4
    counters = np.empty((blocks, 4), dtype=np.uint32)
    counters[:, 0] = np.arange(blocks, dtype=np.uint64).astype(np.uint32)
    counters[:, 1] = np.uint32(step & 0xFFFFFFFF)
    counters[:, 2] = np.uint32(tensor & 0xFFFFFFFF)
    counters[:, 3] = np.uint32(rank & 0xFFFFFFFF)
    key = (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF)
    return philox4x32(counters, key).reshape(-1)[:n]


def uniform01(n, seed, step, tensor, rank):
    """n float32 uniforms in [0, 1): u = (word >> 8) * 2**-24."""
    words = random_words(n, seed, step, tensor, rank)
    return (words >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)


def normal(n, seed, step, tensor, rank=0):
    """n float32 standard normals by Box-Muller on pairs of words: element i takes words 2i and 2i+1 under the key
    (seed, step, tensor, rank), u1 = ((w_2i >> 8) + 1) * 2**-24 in (0, 1], u2 = (w_2i+1 >> 8) * 2**-24, and
    z_i = sqrt(-2 ln u1) cos(2 pi u2), computed in float64 and rounded once to float32."""
    words = random_words(2 * n, seed, step, tensor, rank).astype(np.float64)
    u1 = (np.floor(words[0::2] / 256.0) + 1.0) * 2.0 ** -24
    u2 = np.floor(words[1::2] / 256.0) * 2.0 ** -24
    return (np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)).astype(np.float32)
