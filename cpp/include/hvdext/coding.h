// Entropy coding of sparse streams, shared by ternary ("entropy" packing), top-k ("delta" packing) and the two-phase
// transport's sums: one coder for "which positions are non-zero, and what is there".
//
//   the n positions are cut into blocks of B (the last one shorter; B = n for one block), each coded alone:
//     k (6 bits), then k2 (6 bits) where the stream has magnitudes;
//     the block's non-zero positions p_0 < ... < p_(m-1) (relative to the block) as gaps d_i = p_i - p_(i-1) - 1
//     (p_(-1) = -1), then the terminator d_m = B - p_(m-1) - 1, each Golomb-Rice coded with the block's k:
//       rice_k(d) = floor(d / 2^k) zero bits, a one bit, the k low bits of d        (Rice 1979; Golomb 1966)
//     after each position's gap (not the terminator's): its sign bit (1: negative) where the stream is signed,
//     and |v| - 1 Rice coded with k2 where it has magnitudes (the two-phase sums).
//   Bits are written least significant first, one stream for all blocks, padded with zeros to a byte. A block's k
//   (and k2) is the one of fewest bits among floor(log2(mean + 1)) - 1 .. + 2 (mean: the integer mean of its gaps,
//   terminator included): for geometric gaps the code is within about 2% of their entropy (Gallager & van Voorhis
//   1975), and a k per block follows a gradient whose density changes along the tensor. Ternary codes then take
//   n H_b(p) + m sign bits; top-k's indices (one block) about log2(n / k) + 1.5 bits each.
//
// Every coded payload is framed as  u32 L | crc32 (of the L - 4 bytes after it) | L - 4 bytes  (little-endian),
// so that a receiver walks an allgather's concatenation without sizes, and a corrupted or truncated payload is
// detected (every rank checks the same bytes, so every rank reports it). A payload is built in place: frame_begin,
// its body appended, frame_end. Definition: python/hvdext_reference/coding.py.
#pragma once
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "hvdext/common.h"

namespace hvdext {

constexpr int kMaxRiceParameter = 40;

uint32_t crc32(const uint8_t* data, int64_t n);  // zlib's CRC-32 (polynomial 0xEDB88320, reflected)

// A corrupted or truncated payload: what every decoder throws (the bindings turn it into the framework's error).
struct CorruptPayload : std::invalid_argument {
  explicit CorruptPayload(const std::string& what) : std::invalid_argument(what) {}
};

// Writes into a buffer with at least 8 bytes of slack past the last bit (sized from the bits it will hold); a
// 64-bit accumulator stored whole when full. flush() stores the rest.
class BitWriter {
 public:
  // Continues after the `fill` (< 8) bits already in out[0].
  explicit BitWriter(uint8_t* out, int fill = 0)
      : out_(out), acc_(fill ? out[0] & ((1u << fill) - 1) : 0), fill_(fill) {}
  // Appends the n (<= 56) low bits of v.
  void put(uint64_t v, int n) {
    acc_ |= v << fill_;
    if (fill_ + n >= 64) {
      std::memcpy(out_, &acc_, 8);
      out_ += 8;
      acc_ = fill_ ? v >> (64 - fill_) : 0;
      fill_ = fill_ + n - 64;
    } else {
      fill_ += n;
    }
  }
  void flush() { std::memcpy(out_, &acc_, 8); }
  void zeros(uint64_t n) {
    while (n > 48) {
      put(0, 48);
      n -= 48;
    }
    put(0, static_cast<int>(n));
  }
  // rice_k(d), then `extra_bits` (0 or 1) bits of `extra` (the sign).
  void rice(uint64_t d, int k, uint64_t extra, int extra_bits) {
    const uint64_t q = d >> k;
    if (q + k + 1 + extra_bits <= 56) {
      const uint64_t low = d & ((uint64_t{1} << k) - 1);
      put((1 | (low << 1) | (extra << (k + 1))) << q, static_cast<int>(q + k + 1 + extra_bits));
    } else {
      zeros(q);
      put(1, 1);
      if (k > 0) put(d & ((uint64_t{1} << k) - 1), k);
      if (extra_bits) put(extra, extra_bits);
    }
  }
  // The end of the written bytes (a partial last byte included), after flush().
  uint8_t* end() const { return out_ + (fill_ + 7) / 8; }

 private:
  uint8_t* out_;
  uint64_t acc_ = 0;
  int fill_ = 0;
};

class BitReader {
 public:
  BitReader(const uint8_t* data, int64_t bytes) : data_(data), bytes_(bytes), bits_(bytes * 8) {}
  // Throws CorruptPayload (with `what`) when a read passes the end.
  uint64_t get(int n, const char* what) {
    if (n == 0) return 0;
    need(n, what);
    const uint64_t v = peek() & ((uint64_t{1} << n) - 1);
    pos_ += n;
    return v;
  }
  // rice_k(d) and, where extra_bits is 1 and it fits in one 8-byte load, the bit after it into *extra (read
  // ahead: the caller gives it back with unread(1) if the code had none); *extra = -1 when that bit was not read.
  uint64_t rice(int k, int extra_bits, int* extra, const char* what) {
    const uint64_t w = peek();
    if (w != 0) {
      const int z = __builtin_ctzll(w);
      const int total = z + 1 + k + extra_bits;
      if (total <= 56) {
        if (pos_ + total - extra_bits > bits_) fail(what);
        pos_ += total;
        const uint64_t v = (static_cast<uint64_t>(z) << k) | ((w >> (z + 1)) & ((uint64_t{1} << k) - 1));
        *extra = extra_bits ? static_cast<int>((w >> (z + 1 + k)) & 1) : 0;
        return v;
      }
    }
    *extra = extra_bits ? -1 : 0;
    return rice(k, what);
  }
  uint64_t rice(int k, const char* what) {
    uint64_t q = 0;
    for (;;) {
      if (pos_ >= bits_) fail(what);
      const uint64_t w = peek();
      if (w == 0) {
        q += 56;
        pos_ += 56;
        continue;
      }
      const int z = __builtin_ctzll(w);
      q += z;
      pos_ += z + 1;
      if (pos_ > bits_) fail(what);
      break;
    }
    if (q >> (63 - k)) fail(what);
    return (q << k) | get(k, what);
  }
  int64_t position() const { return pos_; }
  int64_t size() const { return bits_; }
  void unread(int n) { pos_ -= n; }
  // The bits after the last read are padding: all zero, and fewer than 8.
  void finish(const char* what) {
    if (bits_ - pos_ >= 8) fail(what);
    if (pos_ < bits_ && get(static_cast<int>(bits_ - pos_), what) != 0) fail(what);
  }
  [[noreturn]] static void fail(const char* what) { throw CorruptPayload(what); }

 private:
  void need(int n, const char* what) {
    if (pos_ + n > bits_) fail(what);
  }
  // 56 valid bits from pos_ (zeros past the end).
  uint64_t peek() const {
    const int64_t byte = pos_ >> 3;
    uint64_t w = 0;
    if (byte + 8 <= bytes_) {
      std::memcpy(&w, data_ + byte, 8);
    } else {
      for (int64_t i = byte; i < bytes_; ++i) w |= static_cast<uint64_t>(data_[i]) << (8 * (i - byte));
    }
    return (w >> (pos_ & 7)) & ((uint64_t{1} << 56) - 1);
  }
  const uint8_t* data_;
  int64_t bytes_, bits_;
  int64_t pos_ = 0;
};

void put_varint(uint64_t v, std::vector<uint8_t>* out);
// Reads a varint at p (at most `avail` bytes); sets *used. Throws CorruptPayload.
uint64_t get_varint(const uint8_t* p, int64_t avail, int* used, const char* what);

constexpr size_t kFrameHeaderBytes = 8;  // u32 length, u32 CRC-32
// A payload's buffer: the frame header's place, with `reserve` bytes reserved for the body.
std::vector<uint8_t> frame_begin(size_t reserve);
// Fills in the header of a payload built on frame_begin.
void frame_end(std::vector<uint8_t>* payload);

// One framed payload inside a concatenation: [start, start + size) holds what follows the CRC.
struct Frame {
  const uint8_t* data;
  int64_t size;
  int64_t next;  // offset of the next payload
};
// The payload at `offset` of buf[0, bytes); throws CorruptPayload naming `what` and `rank`.
Frame unframe(const uint8_t* buf, int64_t bytes, int64_t offset, const char* what, int rank);

constexpr int64_t kStreamBlock = 4000;  // positions per block of ternary codes and two-phase sums

// The k among floor(log2(mean + 1)) - 1 .. + 2 of fewest bits sum_i floor(d_i / 2^k) + count * (k + 1).
int best_rice_parameter(const uint32_t* d, int64_t count);

// Writes a sparse stream block by block at the end of `out` (finish() trims its slack).
class SparseWriter {
 public:
  SparseWriter(std::vector<uint8_t>* out, bool is_signed, bool magnitudes)
      : out_(out), start_(out->size()), signed_(is_signed), magnitudes_(magnitudes) {}
  // One block of `size` positions (< 2^32) with m non-zeros at ascending offsets pos[0..m) in it, their signs
  // (0/1) where the stream is signed and |v| - 1 where it has magnitudes.
  void block(int64_t size, const uint32_t* pos, int64_t m, const uint8_t* signs, const uint32_t* extra);
  uint64_t bits() const { return bits_; }
  // Ends the stream on a byte (zero padding); returns its bytes.
  size_t finish();

 private:
  std::vector<uint8_t>* out_;
  size_t start_;
  bool signed_, magnitudes_;
  std::vector<uint32_t> gaps_;
  std::vector<uint64_t> words_;
  std::vector<uint8_t> lengths_;
  uint64_t bits_ = 0;
};

// Reads a stream of n positions in blocks of `block` (0: one block) written by SparseWriter: calls
// visit(position, sign, magnitude) for each non-zero; returns their count. Throws CorruptPayload unless every block
// ends exactly at its size and the stream at the data's end.
template <typename Visit>
int64_t read_sparse_stream(const uint8_t* p, int64_t bytes, int64_t n, int64_t block, bool is_signed,
                           bool magnitudes, const char* what, Visit visit) {
  if (block <= 0 || block > n) block = n;
  BitReader in(p, bytes);
  const int sign_bits = is_signed ? 1 : 0;
  int64_t count = 0;
  for (int64_t start = 0; start < n; start += block) {
    const int64_t size = std::min(block, n - start);
    const int k = static_cast<int>(in.get(6, what));
    const int k2 = magnitudes ? static_cast<int>(in.get(6, what)) : 0;
    if (k > kMaxRiceParameter || k2 > kMaxRiceParameter) BitReader::fail(what);
    int64_t position = -1;
    for (;;) {
      int sign = 0;
      const uint64_t d = in.rice(k, sign_bits, &sign, what);
      if (d > static_cast<uint64_t>(size - position - 1)) BitReader::fail(what);
      position += static_cast<int64_t>(d) + 1;
      if (position == size) {
        if (sign >= 0) in.unread(sign_bits);  // the terminator has no sign bit
        break;
      }
      if (sign < 0) sign = static_cast<int>(in.get(1, what));
      if (in.position() > in.size()) BitReader::fail(what);
      const uint64_t magnitude = magnitudes ? in.rice(k2, what) + 1 : 1;
      if (magnitude > (uint64_t{1} << 31)) BitReader::fail(what);
      visit(start + position, sign, static_cast<int64_t>(magnitude));
      ++count;
    }
  }
  in.finish(what);
  return count;
}

}  // namespace hvdext
