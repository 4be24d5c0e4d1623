// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011).
// Ten rounds of (c0,c1,c2,c3) -> (hi(M1*c2)^c1^k0, lo(M1*c2), hi(M0*c0)^c3^k1, lo(M0*c0)), the key bumped by
// (W0, W1) between rounds. The definition lives in python/hvdext_reference/philox.py; this is bit-identical to it.
#pragma once
#include "hvdext/common.h"

namespace hvdext {

struct Philox4 {
  uint32_t v[4];
};

HVDEXT_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t p = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

HVDEXT_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
#if defined(__CUDACC__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(M0, c0, &hi0, &lo0);
    philox_mulhilo(M1, c2, &hi1, &lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += W0;
    k1 += W1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// The four words of block `block` (elements 4*block .. 4*block+3) under `key`.
HVDEXT_HD Philox4 philox_block(const RandomKey& key, uint32_t block) {
  return philox4x32_10(block, key.step, key.tensor, key.rank, static_cast<uint32_t>(key.seed),
                       static_cast<uint32_t>(key.seed >> 32));
}

// u = (word >> 8) * 2^-24: a float32 uniform in [0, 1), exact.
HVDEXT_HD float philox_uniform(uint32_t word) { return static_cast<float>(word >> 8) * 5.9604644775390625e-08f; }

}  // namespace hvdext
