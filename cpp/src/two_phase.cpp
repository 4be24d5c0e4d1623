// CPU kernels of the two-phase ternary transport; see include/hvdext/two_phase.h.
#include "hvdext/two_phase.h"

#include <algorithm>
#include <stdexcept>

namespace hvdext {
namespace {

constexpr int64_t kBlock = 4000;  // a multiple of 4 and 5: blocks start on a packed byte

void check_bits(int nranks, int bits) {
  if (nranks < 1) throw std::invalid_argument("nranks must be >= 1");
  if (bits < two_phase_level_bits(nranks) || bits > 32) {
    throw std::invalid_argument("bits must hold the 2N+1 levels of N ranks and be at most 32");
  }
}

}  // namespace

int two_phase_level_bits(int nranks) {
  int bits = 1;
  while ((int64_t{1} << bits) < 2 * static_cast<int64_t>(nranks) + 1) ++bits;
  return bits;
}

void ternary_sum_reencode(const uint8_t* received, int nranks, int64_t count, Packing packing, int bits,
                          uint8_t* stream) {
  check_bits(nranks, bits);
  const int per = packing == Packing::kTwoBit ? 4 : 5;
  const int64_t stride = ternary_packed_bytes(count, packing);
  alignas(64) int32_t k[kBlock + 8];
  uint64_t acc = 0;
  int filled = 0;
  uint8_t* o = stream;
  for (int64_t start = 0; start < count; start += kBlock) {
    const int64_t m = std::min(kBlock, count - start);
    const int64_t bytes = (m + per - 1) / per;
    std::fill(k, k + kBlock + 8, nranks);  // level = k + N
    for (int r = 0; r < nranks; ++r) {
      const uint8_t* codes = received + r * stride + start / per;
      for (int64_t i = 0; i < bytes; ++i) {
        const int8_t* v = ternary_byte_values(codes[i], packing);
        for (int j = 0; j < per; ++j) k[per * i + j] += v[j];
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      acc |= static_cast<uint64_t>(static_cast<uint32_t>(k[i])) << filled;
      filled += bits;
      while (filled >= 8) {
        *o++ = static_cast<uint8_t>(acc);
        acc >>= 8;
        filled -= 8;
      }
    }
  }
  if (filled > 0) *o++ = static_cast<uint8_t>(acc);
}

void two_phase_decode(const uint8_t* stream, int64_t first, int64_t count, int nranks, int bits, float scale,
                      float divisor, float* out) {
  check_bits(nranks, bits);
  if (count <= 0) return;
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  int64_t bit = first * bits;
  const uint8_t* p = stream + bit / 8;
  const int skip = static_cast<int>(bit % 8);
  uint64_t acc = static_cast<uint64_t>(*p++) >> skip;  // the first byte, less the bits before `first`
  int avail = 8 - skip;
  for (int64_t i = 0; i < count; ++i) {
    while (avail < bits) {
      acc |= static_cast<uint64_t>(*p++) << avail;
      avail += 8;
    }
    const int64_t k = static_cast<int64_t>(acc & mask) - nranks;
    acc >>= bits;
    avail -= bits;
    out[i] = (static_cast<float>(k) * scale) / divisor;
  }
}

}  // namespace hvdext
