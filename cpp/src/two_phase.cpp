// CPU kernels of the two-phase ternary transport; see include/hvdext/two_phase.h.
#include "hvdext/two_phase.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "hvdext/coding.h"

namespace hvdext {
namespace {

constexpr int64_t kBlock = 4000;  // a multiple of 4 and 5: blocks start on a packed byte

void check_bits(int nranks, int bits) {
  if (nranks < 1) throw std::invalid_argument("nranks must be >= 1");
  if (bits < two_phase_level_bits(nranks) || bits > 32) {
    throw std::invalid_argument("bits must hold the 2N+1 levels of N ranks and be at most 32");
  }
}

// Reads the levels of a little-endian bit stream of `bits`-bit levels, one after another, as sums k = level - N.
class LevelReader {
 public:
  LevelReader(const uint8_t* stream, int bits, int nranks) : p_(stream), bits_(bits), nranks_(nranks),
                                                               mask_((uint64_t{1} << bits) - 1) {}
  // Starts at element `first` instead of 0.
  void skip_to(int64_t first) {
    const int64_t bit = first * bits_;
    p_ += bit / 8;
    const int skip = static_cast<int>(bit % 8);
    if (skip) {
      acc_ = static_cast<uint64_t>(*p_++) >> skip;
      avail_ = 8 - skip;
    }
  }
  int64_t next() {
    while (avail_ < bits_) {
      acc_ |= static_cast<uint64_t>(*p_++) << avail_;
      avail_ += 8;
    }
    const int64_t k = static_cast<int64_t>(acc_ & mask_) - nranks_;
    acc_ >>= bits_;
    avail_ -= bits_;
    return k;
  }

 private:
  const uint8_t* p_;
  int bits_, nranks_;
  uint64_t mask_, acc_ = 0;
  int avail_ = 0;
};

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
  LevelReader levels(stream, bits, nranks);
  levels.skip_to(first);
  for (int64_t i = 0; i < count; ++i) out[i] = (static_cast<float>(levels.next()) * scale) / divisor;
}

std::vector<uint8_t> two_phase_levels_encode(const uint8_t* stream, int64_t count, int nranks, int bits,
                                             int bad_rank) {
  check_bits(nranks, bits);
  std::vector<uint8_t> payload = frame_begin(static_cast<size_t>(count / 2 + 64));
  payload.push_back(bad_rank >= 0 ? 1 : 0);
  put_varint(static_cast<uint64_t>(bad_rank >= 0 ? bad_rank : 0), &payload);
  if (bad_rank >= 0) {  // no stream: every rank fails the step on this flag
    frame_end(&payload);
    return payload;
  }
  SparseWriter writer(&payload, true, true);
  LevelReader levels(stream, bits, nranks);
  std::vector<uint32_t> pos(static_cast<size_t>(kStreamBlock)), extra(static_cast<size_t>(kStreamBlock));
  std::vector<uint8_t> signs(static_cast<size_t>(kStreamBlock));
  for (int64_t start = 0; start < count; start += kStreamBlock) {
    const int64_t size = std::min(kStreamBlock, count - start);
    int64_t m = 0;
    for (int64_t i = 0; i < size; ++i) {
      const int64_t k = levels.next();
      if (k != 0) {
        pos[static_cast<size_t>(m)] = static_cast<uint32_t>(i);
        signs[static_cast<size_t>(m)] = k < 0;
        extra[static_cast<size_t>(m)] = static_cast<uint32_t>((k < 0 ? -k : k) - 1);
        ++m;
      }
    }
    writer.block(size, pos.data(), m, signs.data(), extra.data());
  }
  writer.finish();
  frame_end(&payload);
  return payload;
}

void two_phase_levels_decode(const uint8_t* gathered, int64_t bytes, const int64_t* counts, int nranks, int bits,
                             uint8_t* streams) {
  check_bits(nranks, bits);
  int64_t offset = 0;
  uint8_t* o = streams;
  for (int j = 0; j < nranks; ++j) {
    const Frame f = unframe(gathered, bytes, offset, "two-phase level stream", j);
    const std::string where = "two-phase level stream from rank " + std::to_string(j) + " is malformed";
    if (f.size < 2 || f.data[0] > 1) BitReader::fail(where.c_str());
    int used = 0;
    const uint64_t bad = get_varint(f.data + 1, f.size - 1, &used, where.c_str());
    if (f.data[0] == 1) {
      throw CorruptPayload("two-phase chunk from rank " + std::to_string(bad) + " to rank " + std::to_string(j) +
                           " is corrupted (phase 1)");
    }
    const int64_t count = counts[j];
    std::vector<int32_t> levels(static_cast<size_t>(count), nranks);
    read_sparse_stream(f.data + 1 + used, f.size - 1 - used, count, kStreamBlock, true, true, where.c_str(),
                       [&](int64_t i, int sign, int64_t magnitude) {
                         if (magnitude > nranks) BitReader::fail(where.c_str());
                         levels[static_cast<size_t>(i)] += static_cast<int32_t>(sign ? -magnitude : magnitude);
                       });
    uint64_t acc = 0;
    int filled = 0;
    for (int64_t i = 0; i < count; ++i) {
      acc |= static_cast<uint64_t>(static_cast<uint32_t>(levels[static_cast<size_t>(i)])) << filled;
      filled += bits;
      while (filled >= 8) {
        *o++ = static_cast<uint8_t>(acc);
        acc >>= 8;
        filled -= 8;
      }
    }
    if (filled > 0) *o++ = static_cast<uint8_t>(acc);
    offset = f.next;
  }
  if (offset != bytes) throw CorruptPayload("two-phase level streams: trailing bytes (the sizes do not match)");
}

}  // namespace hvdext
