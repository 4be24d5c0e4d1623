// The sparse-stream coder and payload framing; see include/hvdext/coding.h.
#include "hvdext/coding.h"

#include <algorithm>

namespace hvdext {
namespace {

struct CrcTable {
  uint32_t t[8][256];
  CrcTable() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int j = 0; j < 8; ++j) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    }
  }
};
const CrcTable kCrc;

int bit_length(uint64_t v) { return v == 0 ? 0 : 64 - __builtin_clzll(v); }

// sum_i floor(d_i / 2^k) over d.
HVDEXT_VECTOR_CLONES uint64_t quotient_sum(const uint32_t* d, int64_t m, int k) {
  uint64_t total = 0;
  for (int64_t i = 0; i < m; ++i) total += d[i] >> k;
  return total;
}

// The Rice code of each d[i] (and sign bit s[i] after it, where signs is not null) as one word, and its length; a
// length above 56 marks a code the serial writer emits in pieces.
HVDEXT_VECTOR_CLONES void rice_words(const uint32_t* d, const uint8_t* signs, int64_t count, int k, uint64_t* words,
                                     uint8_t* lengths) {
  const uint64_t low_mask = (uint64_t{1} << k) - 1;
  const int sign_bits = signs ? 1 : 0;
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t q = d[i] >> k;
    const uint64_t sign = signs ? signs[i] : 0;
    const uint64_t length = q + k + 1 + sign_bits;
    words[i] = length <= 56 ? (1 | ((d[i] & low_mask) << 1) | (sign << (k + 1))) << q : 0;
    lengths[i] = static_cast<uint8_t>(length <= 56 ? length : 255);
  }
}

// d[i] = pos[i] - pos[i - 1] - 1 (pos[-1] = -1), d[m] = size - pos[m - 1] - 1: a loop without a carried value.
HVDEXT_VECTOR_CLONES void gaps_of(const uint32_t* pos, int64_t m, int64_t size, uint32_t* d) {
  if (m == 0) {
    d[0] = static_cast<uint32_t>(size);
    return;
  }
  d[0] = pos[0];
  for (int64_t i = 1; i < m; ++i) d[i] = pos[i] - pos[i - 1] - 1;
  d[m] = static_cast<uint32_t>(size - pos[m - 1] - 1);
}

}  // namespace

uint32_t crc32(const uint8_t* p, int64_t n) {
  uint32_t c = 0xFFFFFFFFu;
  while (n >= 8) {  // slicing by 8
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = kCrc.t[7][lo & 0xFF] ^ kCrc.t[6][(lo >> 8) & 0xFF] ^ kCrc.t[5][(lo >> 16) & 0xFF] ^ kCrc.t[4][lo >> 24] ^
        kCrc.t[3][hi & 0xFF] ^ kCrc.t[2][(hi >> 8) & 0xFF] ^ kCrc.t[1][(hi >> 16) & 0xFF] ^ kCrc.t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = kCrc.t[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

void put_varint(uint64_t v, std::vector<uint8_t>* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<uint8_t>(v));
}

uint64_t get_varint(const uint8_t* p, int64_t avail, int* used, const char* what) {
  uint64_t v = 0;
  for (int i = 0; i < 9; ++i) {
    if (i >= avail) BitReader::fail(what);
    v |= static_cast<uint64_t>(p[i] & 0x7F) << (7 * i);
    if (!(p[i] & 0x80)) {
      *used = i + 1;
      return v;
    }
  }
  BitReader::fail(what);
}

std::vector<uint8_t> frame_begin(size_t reserve) {
  std::vector<uint8_t> payload(kFrameHeaderBytes);
  payload.reserve(kFrameHeaderBytes + reserve);
  return payload;
}

void frame_end(std::vector<uint8_t>* payload) {
  if (payload->size() - 4 > 0xFFFFFFFFu) throw std::invalid_argument("a coded payload must be below 4 GiB");
  const uint32_t length = static_cast<uint32_t>(payload->size() - 4);
  const uint32_t c = crc32(payload->data() + kFrameHeaderBytes, static_cast<int64_t>(payload->size() - 8));
  std::memcpy(payload->data(), &length, 4);  // little-endian hosts
  std::memcpy(payload->data() + 4, &c, 4);
}

Frame unframe(const uint8_t* buf, int64_t bytes, int64_t offset, const char* what, int rank) {
  const std::string where = std::string(what) + " from rank " + std::to_string(rank);
  if (offset >= bytes) throw CorruptPayload(where + " is missing (the gathered payloads are truncated)");
  if (bytes - offset < 8) throw CorruptPayload(where + " is truncated");
  uint32_t length, stored;
  std::memcpy(&length, buf + offset, 4);
  const int64_t start = offset + 4;
  if (length < 4 || length > static_cast<uint64_t>(bytes - start)) {
    throw CorruptPayload(where + " is truncated or has a bad length");
  }
  std::memcpy(&stored, buf + start, 4);
  if (crc32(buf + start + 4, static_cast<int64_t>(length) - 4) != stored) {
    throw CorruptPayload(where + " is corrupted (CRC-32 mismatch)");
  }
  return {buf + start + 4, static_cast<int64_t>(length) - 4, start + static_cast<int64_t>(length)};
}

int best_rice_parameter(const uint32_t* d, int64_t count) {
  if (count <= 0) return 0;
  uint64_t sum = 0;
  for (int64_t i = 0; i < count; ++i) sum += d[i];
  const uint64_t mean = sum / static_cast<uint64_t>(count);
  const int guess = bit_length(mean + 1) - 1;  // floor(log2(mean + 1))
  int best = 0;
  uint64_t best_bits = ~uint64_t{0};
  for (int k = std::max(0, guess - 1); k <= std::min(kMaxRiceParameter, guess + 2); ++k) {
    const uint64_t bits = quotient_sum(d, count, k) + static_cast<uint64_t>(count) * (k + 1);
    if (bits < best_bits) {
      best_bits = bits;
      best = k;
    }
  }
  return best;
}

void SparseWriter::block(int64_t size, const uint32_t* pos, int64_t m, const uint8_t* signs,
                         const uint32_t* extra) {
  gaps_.resize(static_cast<size_t>(m + 1));
  uint32_t* d = gaps_.data();
  gaps_of(pos, m, size, d);
  const int k = best_rice_parameter(d, m + 1);
  const int k2 = magnitudes_ ? best_rice_parameter(extra, m) : 0;
  uint64_t bits = 6 + quotient_sum(d, m + 1, k) + static_cast<uint64_t>(m + 1) * (k + 1);
  if (signed_) bits += m;
  if (magnitudes_) bits += 6 + quotient_sum(extra, m, k2) + static_cast<uint64_t>(m) * (k2 + 1);
  // whole bytes written so far, and the partial one
  const size_t done = start_ + static_cast<size_t>(bits_ / 8);
  out_->resize(done + static_cast<size_t>((bits_ % 8 + bits) / 8) + 9);
  BitWriter w(out_->data() + done, static_cast<int>(bits_ % 8));
  w.put(static_cast<uint64_t>(k), 6);
  if (magnitudes_) w.put(static_cast<uint64_t>(k2), 6);
  const int sign_bits = signed_ ? 1 : 0;
  if (magnitudes_) {
    for (int64_t i = 0; i < m; ++i) {
      w.rice(d[i], k, signed_ ? signs[i] : 0, sign_bits);
      w.rice(extra[i], k2, 0, 0);
    }
  } else {  // the codes as words first (vectorized), then a serial pass that only shifts and stores
    words_.resize(static_cast<size_t>(m));
    lengths_.resize(static_cast<size_t>(m));
    rice_words(d, signed_ ? signs : nullptr, m, k, words_.data(), lengths_.data());
    const auto one = [&](int64_t j) {  // a word, or a code too long for one, in pieces
      if (lengths_[j] != 255) {
        w.put(words_[j], lengths_[j]);
      } else {
        w.rice(d[j], k, signed_ ? signs[j] : 0, sign_bits);
      }
    };
    int64_t i = 0;
    for (; i + 1 < m; i += 2) {  // two codes per store where they fit in 56 bits together
      const int a = lengths_[i], b = lengths_[i + 1];
      if (a + b <= 56) {
        w.put(words_[i] | (words_[i + 1] << a), a + b);
      } else {
        one(i);
        one(i + 1);
      }
    }
    if (i < m) one(i);
  }
  w.rice(d[m], k, 0, 0);
  w.flush();
  bits_ += bits;
}

size_t SparseWriter::finish() {
  const size_t bytes = static_cast<size_t>((bits_ + 7) / 8);
  out_->resize(start_ + bytes);
  return bytes;
}

}  // namespace hvdext
