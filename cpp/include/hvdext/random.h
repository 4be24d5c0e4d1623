// Standard normal draws from the counter-based generator (hvdext/philox.h), the definition being
// python/hvdext_reference/philox.py's normal(): element i takes words 2i and 2i+1 under the key (Box-Muller),
//   u1 = ((w_2i >> 8) + 1) * 2^-24 in (0, 1],   u2 = (w_2i+1 >> 8) * 2^-24 in [0, 1),
//   z_i = sqrt(-2 ln u1) * cos(2 pi u2),
// computed in float64 without contraction and rounded once to float32. PowerSGD draws its initial Q with it.
#pragma once
#include <cmath>
#include <cstdint>

#include "hvdext/common.h"
#include "hvdext/philox.h"

namespace hvdext {

// z_i of the key: block i / 2 of the generator holds elements 2 (i / 2) and 2 (i / 2) + 1.
HVDEXT_HD float normal_at(const RandomKey& key, int64_t i) {
  const Philox4 block = philox_block(key, static_cast<uint32_t>(i >> 1));
  const int first = static_cast<int>(i & 1) * 2;
  const double u1 = static_cast<double>((block.v[first] >> 8) + 1u) * 5.9604644775390625e-08;
  const double u2 = static_cast<double>(block.v[first + 1] >> 8) * 5.9604644775390625e-08;
  const double two_pi = 2.0 * 3.141592653589793;
  return static_cast<float>(::sqrt(-2.0 * ::log(u1)) * ::cos(two_pi * u2));
}

// out[0..n) = z_0 .. z_{n-1} under `key` (its rank word is part of the key, as every draw's).
void normal_fill(const RandomKey& key, int64_t n, float* out);

}  // namespace hvdext
