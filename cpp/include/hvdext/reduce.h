// The order of every float64 statistic (TernGrad's sum and sum of squares, top-k's |g_ef|^2), CPU and GPU alike;
// the definition is python/hvdext_reference/reduce.py:
//   blocks of kBlock elements; in each, lane j adds elements i = j mod 8 in order; the lanes are combined as
//   ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)); the blocks pairwise, level by level (an odd last one carried up).
#pragma once
#include <cstdint>

#include "hvdext/common.h"

namespace hvdext {

constexpr int kLanes = 8;
constexpr int64_t kBlock = 4096;

inline int64_t reduce_blocks(int64_t n) { return (n + kBlock - 1) / kBlock; }

HVDEXT_HD double combine_lanes(const double* s) {
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// Combines p[0..count) pairwise, level by level, in place; 0.0 for count == 0.
inline double pairwise_tree(double* p, int64_t count) {
  if (count == 0) return 0.0;
  while (count > 1) {
    const int64_t half = count / 2;
    for (int64_t i = 0; i < half; ++i) p[i] = p[2 * i] + p[2 * i + 1];  // reads indices >= i: safe in place
    if (count & 1) p[half] = p[count - 1];
    count = half + (count & 1);
  }
  return p[0];
}

}  // namespace hvdext
