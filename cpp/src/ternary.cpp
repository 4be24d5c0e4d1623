// CPU kernels of TernGrad; see include/hvdext/ternary.h for the math and python/hvdext_reference/terngrad.py for
// the definition these match bit for bit. Built with -ffp-contract=off: a fused multiply-add would change bits.
#include "hvdext/ternary.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <limits>
#include <stdexcept>
#include <vector>

#include "hvdext/coding.h"
#include "hvdext/philox.h"
#include "hvdext/reduce.h"

namespace hvdext {
namespace {

// Elements per chunk: a multiple of 20 so that chunks start on a Philox block (4) and on a packed byte (4 or 5).
constexpr int64_t kChunk = 4000;

// "entropy": varint length (at most 5 bytes below 2^35), crc32, float32 scale, mode byte.
constexpr int64_t kEntropyOverhead = 5 + 4 + 4 + 1;
enum EntropyMode : uint8_t { kSparseCodes = 0, kBase3Codes = 1 };

int codes_per_byte(Packing packing) { return packing == Packing::kTwoBit ? 4 : 5; }

void check_packing(Packing packing) {
  if (packing != Packing::kTwoBit && packing != Packing::kBase3) {
    throw std::invalid_argument("packing must be 0 (\"2bit\") or 1 (\"base3\")");
  }
}

}  // namespace

// value of each code in a packed byte: two_bit[b][j] for "2bit", base3[b][j] for "base3".
struct DecodeTables {
  int8_t two_bit[256][4];
  int8_t base3[256][5];
  DecodeTables() {
    const int8_t value[4] = {0, 1, -1, 0};  // code 3 never occurs
    for (int b = 0; b < 256; ++b) {
      for (int j = 0; j < 4; ++j) two_bit[b][j] = value[(b >> (2 * j)) & 3];
      int rest = b < 243 ? b : 0;  // bytes above 242 never occur
      for (int j = 0; j < 5; ++j) {
        base3[b][j] = value[rest % 3];
        rest /= 3;
      }
    }
  }
};
const DecodeTables kTables;

const int8_t* ternary_byte_values(uint8_t byte, Packing packing) {
  return packing == Packing::kTwoBit ? kTables.two_bit[byte] : kTables.base3[byte];
}


namespace {

// Every block's lane sums of g and g^2 (lane j: elements i = j mod 8 of the block, in order), combined per block
// into sums[b] and squares[b]; returns max|g|. One multi-versioned function for all blocks: a call per block costs.
HVDEXT_VECTOR_CLONES float block_stats(const float* g, int64_t n, double* sums, double* squares) {
  float mx[kLanes] = {0};
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t m = std::min(kBlock, n - start);
    const float* x = g + start;
    double sum[kLanes] = {0}, sq[kLanes] = {0};
    const int64_t full = m / kLanes * kLanes;
    for (int64_t i = 0; i < full; i += kLanes) {
      for (int j = 0; j < kLanes; ++j) {
        const double v = x[i + j];
        sum[j] += v;
        sq[j] += v * v;
        mx[j] = std::max(mx[j], std::fabs(x[i + j]));
      }
    }
    for (int64_t i = full; i < m; ++i) {
      const int j = static_cast<int>(i - full);
      const double v = x[i];
      sum[j] += v;
      sq[j] += v * v;
      mx[j] = std::max(mx[j], std::fabs(x[i]));
    }
    sums[start / kBlock] = combine_lanes(sum);
    squares[start / kBlock] = combine_lanes(sq);
  }
  float m = 0.0f;
  for (int j = 0; j < kLanes; ++j) m = std::max(m, mx[j]);
  return m;
}

}  // namespace

GradientStats gradient_stats(const float* g, int64_t n) {
  const int64_t blocks = reduce_blocks(n);
  std::vector<double> sums(static_cast<size_t>(blocks)), squares(static_cast<size_t>(blocks));
  const float m = block_stats(g, n, sums.data(), squares.data());
  GradientStats st;
  st.sum = pairwise_tree(sums.data(), blocks);
  st.sumsq = pairwise_tree(squares.data(), blocks);
  st.finite = std::isfinite(st.sum) && std::isfinite(st.sumsq);
  st.maxabs = st.finite ? m : 0.0f;
  return st;
}

TernaryScale ternary_local_scale(const float* g, int64_t n, double clip) {
  const float inf = std::numeric_limits<float>::infinity();
  const GradientStats st = gradient_stats(g, n);
  if (!st.finite) return {inf, inf};
  float threshold = inf;
  if (clip > 0.0 && n > 0) {
    const double mean = st.sum / static_cast<double>(n);
    const double var = std::max(st.sumsq / static_cast<double>(n) - mean * mean, 0.0);
    const double sigma = std::sqrt(var);
    if (sigma > 0.0) threshold = static_cast<float>(clip * sigma);
  }
  return {threshold, std::min(st.maxabs, threshold)};
}

int64_t ternary_payload_bytes(int64_t n, Packing packing) {
  if (packing == Packing::kEntropy) return kEntropyOverhead + ternary_packed_bytes(n, Packing::kBase3);
  return kTernaryHeaderBytes + ternary_packed_bytes(n, packing);
}

int64_t ternary_packed_bytes(int64_t n, Packing packing) {
  check_packing(packing);
  const int per = codes_per_byte(packing);
  return (n + per - 1) / per;
}

namespace {

// Uniforms of blocks [first, first + blocks) into u (4 per block). A loop without calls or branches, so that the
// compiler vectorizes Philox across blocks.
HVDEXT_VECTOR_CLONES void fill_uniforms(const RandomKey& key, uint32_t first, int64_t blocks, float* u) {
  const uint32_t k0 = static_cast<uint32_t>(key.seed), k1 = static_cast<uint32_t>(key.seed >> 32);
  for (int64_t b = 0; b < blocks; ++b) {
    const Philox4 r = philox4x32_10(first + static_cast<uint32_t>(b), key.step, key.tensor, key.rank, k0, k1);
    u[4 * b + 0] = philox_uniform(r.v[0]);
    u[4 * b + 1] = philox_uniform(r.v[1]);
    u[4 * b + 2] = philox_uniform(r.v[2]);
    u[4 * b + 3] = philox_uniform(r.v[3]);
  }
}

// Codes {0, 1 (+), 2 (-)} of m elements: keep = u < |clamp(x, -t, t)| / s; a kept element is never 0, so its
// code is 1 + (x < 0).
HVDEXT_VECTOR_CLONES void ternary_codes(const float* x, const float* u, int64_t m, float threshold, float scale,
                                        uint8_t* codes) {
  for (int64_t k = 0; k < m; ++k) {
    const float xc = std::min(std::max(x[k], -threshold), threshold);
    const float p = std::fabs(xc) / scale;
    const uint8_t keep = u[k] < p;
    const uint8_t negative = x[k] < 0.0f;
    codes[k] = static_cast<uint8_t>(keep + (keep & negative));
  }
}

}  // namespace

HVDEXT_VECTOR_CLONES void ternary_pack_codes(const uint8_t* codes, int64_t m, Packing packing, uint8_t* o) {
  if (packing == Packing::kTwoBit) {
    const int64_t bytes = (m + 3) / 4;
    for (int64_t i = 0; i < bytes; ++i) {
      const uint8_t* c = codes + 4 * i;
      o[i] = static_cast<uint8_t>(c[0] | (c[1] << 2) | (c[2] << 4) | (c[3] << 6));
    }
  } else {
    const int64_t bytes = (m + 4) / 5;
    for (int64_t i = 0; i < bytes; ++i) {
      const uint8_t* c = codes + 5 * i;
      o[i] = static_cast<uint8_t>(c[0] + 3 * c[1] + 9 * c[2] + 27 * c[3] + 81 * c[4]);
    }
  }
}

namespace {

// Runs `emit(start, m, codes)` for each chunk of codes of g; codes has 8 zero bytes of slack after m.
template <typename Emit>
void for_each_code_chunk(const float* g, int64_t n, float threshold, float scale, const RandomKey& key, Emit emit) {
  alignas(64) float u[kChunk];
  alignas(64) uint8_t codes[kChunk + 8];
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t m = std::min(kChunk, n - start);
    fill_uniforms(key, static_cast<uint32_t>(start / 4), (m + 3) / 4, u);
    ternary_codes(g + start, u, m, threshold, scale, codes);
    std::memset(codes + m, 0, 8);
    emit(start, m, codes);
  }
}

bool encodes_zeros(float scale) { return !(scale > 0.0f) || !std::isfinite(scale); }

}  // namespace

void ternary_encode(const float* g, int64_t n, float threshold, float scale, const RandomKey& key, Packing packing,
                    uint8_t* payload) {
  check_packing(packing);
  std::memcpy(payload, &scale, sizeof(float));  // little-endian hosts only (x86-64, aarch64)
  uint8_t* out = payload + kTernaryHeaderBytes;
  if (encodes_zeros(scale)) {
    std::memset(out, 0, static_cast<size_t>(ternary_packed_bytes(n, packing)));
    return;
  }
  const int per = codes_per_byte(packing);
  for_each_code_chunk(g, n, threshold, scale, key, [&](int64_t start, int64_t m, const uint8_t* codes) {
    ternary_pack_codes(codes, m, packing, out + start / per);
  });
}

void ternary_encode_codes(const float* g, int64_t n, float threshold, float scale, const RandomKey& key,
                          uint8_t* codes) {
  if (encodes_zeros(scale)) {
    std::memset(codes, 0, static_cast<size_t>(n));
    return;
  }
  for_each_code_chunk(g, n, threshold, scale, key, [&](int64_t start, int64_t m, const uint8_t* c) {
    std::memcpy(codes + start, c, static_cast<size_t>(m));
  });
}

int ternary_decode_average(const uint8_t* gathered, int nranks, int64_t n, Packing packing, float divisor,
                           float* out) {
  check_packing(packing);
  if (nranks <= 0) throw std::invalid_argument("nranks must be >= 1");
  const int64_t stride = ternary_payload_bytes(n, packing);
  float first_scale;
  std::memcpy(&first_scale, gathered, sizeof(float));
  bool shared = true;
  for (int r = 0; r < nranks; ++r) {
    float s;
    std::memcpy(&s, gathered + r * stride, sizeof(float));
    if (!std::isfinite(s)) return r;
    shared = shared && (s == first_scale);
  }
  const int per = codes_per_byte(packing);
  alignas(64) float acc[kChunk + 8];
  alignas(64) int32_t count[kChunk + 8];
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t m = std::min(kChunk, n - start);
    const int64_t bytes = (m + per - 1) / per;
    if (shared) {
      std::fill(count, count + kChunk + 8, 0);
    } else {
      std::fill(acc, acc + kChunk + 8, 0.0f);
    }
    for (int r = 0; r < nranks; ++r) {
      const uint8_t* base = gathered + r * stride;
      const uint8_t* codes = base + kTernaryHeaderBytes + start / per;
      float s;
      std::memcpy(&s, base, sizeof(float));
      for (int64_t i = 0; i < bytes; ++i) {
        const int8_t* v = packing == Packing::kTwoBit ? kTables.two_bit[codes[i]] : kTables.base3[codes[i]];
        if (shared) {
          for (int j = 0; j < per; ++j) count[per * i + j] += v[j];
        } else {
          for (int j = 0; j < per; ++j) acc[per * i + j] += s * static_cast<float>(v[j]);
        }
      }
    }
    float* o = out + start;
    if (shared) {
      for (int64_t k = 0; k < m; ++k) o[k] = (static_cast<float>(count[k]) * first_scale) / divisor;
    } else {
      for (int64_t k = 0; k < m; ++k) o[k] = acc[k] / divisor;
    }
  }
  return -1;
}

// ------------------------------------------------------------------------------------------- "entropy" packing

namespace {

// Codes the non-zero codes of each block of kStreamBlock (= kChunk) codes, as they are drawn.
static_assert(kStreamBlock == kChunk, "a chunk of codes is a block of the stream");

// offsets[mask]: the set bits of an 8-bit mask, lowest first (the rest 0).
struct CompactionTable {
  uint8_t offsets[256][8];
  uint8_t count[256];
  CompactionTable() {
    for (int mask = 0; mask < 256; ++mask) {
      int n = 0;
      for (int j = 0; j < 8; ++j) offsets[mask][j] = 0;
      for (int j = 0; j < 8; ++j) {
        if (mask & (1 << j)) offsets[mask][n++] = static_cast<uint8_t>(j);
      }
      count[mask] = static_cast<uint8_t>(n);
    }
  }
};
const CompactionTable kCompaction;

// The offsets of the non-zero codes among m into pos (m + 8 entries);
// returns their count. Branch-free, 8 codes at a time.
int64_t compact_nonzero(const uint8_t* codes, int64_t m, uint32_t* pos) {
  int64_t count = 0;
  for (int64_t base = 0; base < m; base += 8) {
    uint64_t w = 0;
    if (base + 8 <= m) {
      std::memcpy(&w, codes + base, 8);
    } else {  // the last codes: no reading past them
      std::memcpy(&w, codes + base, static_cast<size_t>(m - base));
    }
    // bit j of `mask`: code j is non-zero (codes are 0, 1 or 2)
    const unsigned mask =
        static_cast<unsigned>((((w | (w >> 1)) & 0x0101010101010101ull) * 0x0102040810204080ull) >> 56);
    const uint8_t* offsets = kCompaction.offsets[mask];
    uint32_t* out = pos + count;
    for (int j = 0; j < 8; ++j) out[j] = static_cast<uint32_t>(base) + offsets[j];
    count += kCompaction.count[mask];
  }
  return count;
}

// A payload being coded: the frame header, the scale, the mode, then the non-zero codes of each block of
// kStreamBlock (= kChunk) codes as they are drawn.
class CodeStream {
 public:
  CodeStream(int64_t n, float scale) : n_(n), payload_(frame_begin(static_cast<size_t>(n / 6 + 64))) {
    payload_.resize(kFrameHeaderBytes + sizeof(float) + 1);
    std::memcpy(payload_.data() + kFrameHeaderBytes, &scale, sizeof(float));
    payload_.back() = kSparseCodes;
    writer_.emplace(&payload_, true, false);
  }
  // One block of m codes.
  void add(const uint8_t* codes, int64_t m) {
    alignas(64) uint32_t pos[kChunk + 8];
    alignas(64) uint8_t signs[kChunk + 8];
    const int64_t count = compact_nonzero(codes, m, pos);
    for (int64_t i = 0; i < count; ++i) signs[i] = codes[pos[i]] >> 1;
    writer_->block(m, pos, count, signs, nullptr);
  }
  // The framed payload: the stream, or the base-3 codes (codes_of writes them) where those are fewer bytes.
  std::vector<uint8_t> finish(const std::function<void(uint8_t*)>& codes_of) {
    const int64_t base3 = ternary_packed_bytes(n_, Packing::kBase3);
    if (static_cast<int64_t>(writer_->finish()) > base3) {  // mostly non-zero codes
      std::vector<uint8_t> codes(static_cast<size_t>(n_) + 8, 0);
      codes_of(codes.data());
      const size_t at = kFrameHeaderBytes + sizeof(float) + 1;
      payload_[at - 1] = kBase3Codes;
      payload_.resize(at + static_cast<size_t>(base3));
      ternary_pack_codes(codes.data(), n_, Packing::kBase3, payload_.data() + at);
    }
    frame_end(&payload_);
    return std::move(payload_);
  }

 private:
  int64_t n_;
  std::vector<uint8_t> payload_;
  std::optional<SparseWriter> writer_;
};

void check_entropy_size(int64_t n) {
  if (n < 0 || n >= (int64_t{1} << 31)) {
    throw std::invalid_argument("packing \"entropy\" takes tensors of fewer than 2^31 elements");
  }
}

struct EntropyPayload {
  float scale;
  uint8_t mode;
  const uint8_t* body;
  int64_t bytes;
};

EntropyPayload read_entropy_payload(const Frame& f, int64_t n, const char* what) {
  if (f.size < 5) BitReader::fail(what);
  EntropyPayload p;
  std::memcpy(&p.scale, f.data, sizeof(float));
  p.mode = f.data[4];
  p.body = f.data + 5;
  p.bytes = f.size - 5;
  if (p.mode == kBase3Codes) {
    if (p.bytes != ternary_packed_bytes(n, Packing::kBase3)) BitReader::fail(what);
    for (int64_t i = 0; i < p.bytes; ++i) {
      if (p.body[i] > 242) BitReader::fail(what);
    }
  } else if (p.mode != kSparseCodes) {
    BitReader::fail(what);
  }
  return p;
}

// visit(position, value) for each non-zero code (value +1 or -1), in position order.
template <typename Visit>
void for_each_nonzero(const EntropyPayload& p, int64_t n, const char* what, Visit visit) {
  if (p.mode == kSparseCodes) {
    read_sparse_stream(p.body, p.bytes, n, kStreamBlock, true, false, what,
                       [&](int64_t position, int sign, int64_t) { visit(position, 1 - 2 * sign); });
    return;
  }
  for (int64_t i = 0; i < p.bytes; ++i) {
    const int8_t* v = kTables.base3[p.body[i]];
    for (int j = 0; j < 5; ++j) {
      const int64_t position = 5 * i + j;
      if (v[j] != 0 && position < n) visit(position, v[j]);
    }
  }
}

// Frames of the nranks payloads, checked: they must fill `bytes` exactly.
std::vector<EntropyPayload> read_payloads(const uint8_t* gathered, int64_t bytes, int nranks, int64_t n,
                                          const char* what) {
  std::vector<EntropyPayload> payloads;
  int64_t offset = 0;
  for (int r = 0; r < nranks; ++r) {
    const Frame f = unframe(gathered, bytes, offset, what, r);
    const std::string where = std::string(what) + " from rank " + std::to_string(r) + " is malformed";
    payloads.push_back(read_entropy_payload(f, n, where.c_str()));
    offset = f.next;
  }
  if (offset != bytes) {
    throw CorruptPayload(std::string(what) + ": " + std::to_string(bytes - offset) +
                         " bytes follow the last rank's payload (the sizes do not match)");
  }
  return payloads;
}

}  // namespace

std::vector<uint8_t> ternary_encode_entropy(const float* g, int64_t n, float threshold, float scale,
                                            const RandomKey& key) {
  check_entropy_size(n);
  CodeStream stream(n, scale);
  if (encodes_zeros(scale)) {
    alignas(64) static const uint8_t kZeros[kChunk + 8] = {0};
    for (int64_t start = 0; start < n; start += kChunk) stream.add(kZeros, std::min(kChunk, n - start));
  } else {
    for_each_code_chunk(g, n, threshold, scale, key,
                        [&](int64_t, int64_t m, const uint8_t* codes) { stream.add(codes, m); });
  }
  return stream.finish([&](uint8_t* codes) { ternary_encode_codes(g, n, threshold, scale, key, codes); });
}

std::vector<uint8_t> ternary_codes_encode_entropy(const uint8_t* codes, int64_t n, float scale) {
  check_entropy_size(n);
  CodeStream stream(n, scale);
  for (int64_t start = 0; start < n; start += kChunk) stream.add(codes + start, std::min(kChunk, n - start));
  return stream.finish([&](uint8_t* out) { std::memcpy(out, codes, static_cast<size_t>(n)); });
}

int ternary_decode_average_entropy(const uint8_t* gathered, int64_t bytes, int nranks, int64_t n, float divisor,
                                   float* out) {
  if (nranks <= 0) throw std::invalid_argument("nranks must be >= 1");
  check_entropy_size(n);
  const char* what = "ternary payload";
  const std::vector<EntropyPayload> payloads = read_payloads(gathered, bytes, nranks, n, what);
  bool shared = true;
  for (int r = 0; r < nranks; ++r) {
    if (!std::isfinite(payloads[r].scale)) return r;
    shared = shared && payloads[r].scale == payloads[0].scale;
  }
  // Shared scale: the exact integer sums (held in float32, |sum| <= N), times s, / divisor. Otherwise the float32
  // sum of s_r * v_r in rank order: zero codes add +0.0, which changes no sum (it is never -0.0), so only the
  // non-zero codes are visited; the bits are those of ternary_decode_average.
  std::fill(out, out + n, 0.0f);
  for (int r = 0; r < nranks; ++r) {
    const std::string where = std::string(what) + " from rank " + std::to_string(r) + " is malformed";
    const float s = payloads[r].scale;
    if (shared) {
      for_each_nonzero(payloads[r], n, where.c_str(), [&](int64_t k, int v) { out[k] += static_cast<float>(v); });
    } else {
      for_each_nonzero(payloads[r], n, where.c_str(),
                       [&](int64_t k, int v) { out[k] += s * static_cast<float>(v); });
    }
  }
  if (shared) {
    const float s = payloads[0].scale;
    for (int64_t k = 0; k < n; ++k) out[k] = (out[k] * s) / divisor;
  } else {
    for (int64_t k = 0; k < n; ++k) out[k] = out[k] / divisor;
  }
  return -1;
}

int ternary_entropy_to_packed(const uint8_t* received, int64_t bytes, int nranks, int64_t count, Packing packing,
                              uint8_t* packed) {
  check_packing(packing);
  check_entropy_size(count);
  const int64_t stride = ternary_packed_bytes(count, packing);
  std::memset(packed, 0, static_cast<size_t>(stride * nranks));
  std::vector<uint8_t> codes(static_cast<size_t>(count) + 8);
  int64_t offset = 0;
  for (int r = 0; r < nranks; ++r) {
    try {
      const Frame f = unframe(received, bytes, offset, "two-phase chunk", r);
      const EntropyPayload p = read_entropy_payload(f, count, "two-phase chunk");
      std::fill(codes.begin(), codes.end(), 0);
      for_each_nonzero(p, count, "two-phase chunk",
                       [&](int64_t k, int v) { codes[static_cast<size_t>(k)] = v > 0 ? 1 : 2; });
      ternary_pack_codes(codes.data(), count, packing, packed + r * stride);
      offset = f.next;
    } catch (const CorruptPayload&) {
      std::memset(packed, 0, static_cast<size_t>(stride * nranks));
      return r;
    }
  }
  if (offset != bytes) {
    std::memset(packed, 0, static_cast<size_t>(stride * nranks));
    return nranks - 1;
  }
  return -1;
}

}  // namespace hvdext
