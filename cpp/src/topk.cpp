// CPU kernels of top-k with error feedback; see include/hvdext/topk.h.
#include "hvdext/topk.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <vector>

#include "hvdext/coding.h"
#include "hvdext/common.h"
#include "hvdext/reduce.h"

namespace hvdext {
namespace {

inline uint32_t magnitude_bits(const float* x, int64_t i) {
  uint32_t b;
  std::memcpy(&b, x + i, sizeof(b));
  return b & 0x7FFFFFFFu;
}

// Larger key = kept first: |x| bits above, the index's complement below (ties to the lower index).
inline uint64_t order_key(uint32_t bits, int64_t i) {
  return (static_cast<uint64_t>(bits) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(i));
}

inline int32_t index_of(uint64_t key) { return static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(key)); }

// The k-th largest key: every element whose key is at least this one is kept (keys are distinct).
uint64_t nth_largest(std::vector<uint64_t>& keys, int64_t k) {
  std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.end(), std::greater<uint64_t>());
  return keys[k - 1];
}

// kth[j] = the ks[j]-th largest of the keys (1 <= ks[j] <= keys.size()); the keys may be reordered. Many keys: a
// histogram of each key's top 16 bits (|x|'s exponent and 8 mantissa bits) finds the bin that holds the k-th, whose
// keys alone are then selected among (radix selection: two passes over the keys, where nth_element over them all
// costs several); few keys: nth_element.
void kth_largest(std::vector<uint64_t>& keys, const int64_t* ks, int count, uint64_t* kth) {
  constexpr int kShift = 47;  // keys are below 2^63 (|x| has 31 bits): key >> 47 is 16 bits
  constexpr int64_t kBins = int64_t{1} << 16;
  const int64_t m = static_cast<int64_t>(keys.size());
  if (m < kBins / 4) {
    for (int j = 0; j < count; ++j) kth[j] = nth_largest(keys, ks[j]);
    return;
  }
  std::vector<uint32_t> hist(kBins, 0);
  for (const uint64_t key : keys) ++hist[key >> kShift];
  std::vector<uint64_t> bin_keys;
  for (int j = 0; j < count; ++j) {
    int64_t above = 0, bin = kBins - 1;
    while (above + hist[bin] < ks[j]) above += hist[bin--];
    bin_keys.clear();
    for (const uint64_t key : keys) {
      if (static_cast<int64_t>(key >> kShift) == bin) bin_keys.push_back(key);
    }
    kth[j] = nth_largest(bin_keys, ks[j] - above);
  }
}

// Value j of a payload's fp16 or fp32 values.
float value_at(const uint8_t* values, int64_t j, ValueType type) {
  if (type == ValueType::kFp16) {
    uint16_t h;
    std::memcpy(&h, values + 2 * j, 2);
    return half_to_float(h);
  }
  float v;
  std::memcpy(&v, values + 4 * j, 4);
  return v;
}

void check_k(int64_t n, int64_t k) {
  if (n <= 0 || n >= (int64_t{1} << 31)) throw std::invalid_argument("top-k needs 1 <= n < 2^31 elements");
  if (k < 1 || k > n) throw std::invalid_argument("top-k needs 1 <= k <= n");
}

// A "delta" payload may be empty (k = 0, n >= 0): a region of sparse_reduce that holds none of a rank's indices.
void check_coded_k(int64_t n, int64_t k) {
  if (n < 0 || n >= (int64_t{1} << 31)) throw std::invalid_argument("top-k needs 0 <= n < 2^31 elements");
  if (k < 0 || k > n) throw std::invalid_argument("top-k needs 0 <= k <= n");
}

}  // namespace


namespace {

// r += g; every block's lane sums of r^2 (lane j: elements i = j mod 8 of the block, in order), combined per block
// into squares[b]. One multi-versioned function for all blocks.
HVDEXT_VECTOR_CLONES void block_accumulate(const float* g, float* r, int64_t n, double* squares) {
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t m = std::min(kBlock, n - start);
    const float* x = g + start;
    float* y = r + start;
    double sq[kLanes] = {0};
    const int64_t full = m / kLanes * kLanes;
    for (int64_t i = 0; i < full; i += kLanes) {
      for (int j = 0; j < kLanes; ++j) {
        const float v = y[i + j] + x[i + j];
        y[i + j] = v;
        sq[j] += static_cast<double>(v) * static_cast<double>(v);
      }
    }
    for (int64_t i = full; i < m; ++i) {
      const float v = y[i] + x[i];
      y[i] = v;
      sq[i - full] += static_cast<double>(v) * static_cast<double>(v);
    }
    squares[start / kBlock] = combine_lanes(sq);
  }
}

}  // namespace

double ef_accumulate(const float* g, float* r, int64_t n) {
  std::vector<double> squares(static_cast<size_t>(reduce_blocks(n)));
  block_accumulate(g, r, n, squares.data());
  return pairwise_tree(squares.data(), reduce_blocks(n));
}

namespace {

// Keys of candidates that hold the top k of |x| (1 <= k < n): a sampled threshold keeps about 1.5 k + margin
// candidates in one pass; a sample that kept too many or too few falls back to every element.
void top_keys(const float* x, int64_t n, int64_t k, std::vector<uint64_t>& keys) {
  uint32_t threshold = 0;
  int64_t expected = n;  // candidates the threshold is expected to keep
  constexpr int64_t kSample = 16384;   // the sample of a large tensor
  constexpr int64_t kMinSampled = 4096;  // below this, every element is a candidate
  if (n >= kMinSampled && k < n / 4) {
    // Deterministic strided sample of min(kSample, n / 16) magnitudes; its rank-q magnitude keeps about
    // 1.5 k + margin candidates (a layer of 16K elements at 1%: about 770 of them instead of all 16K).
    const int64_t samples = std::min<int64_t>(kSample, n / 16);
    std::vector<uint32_t> sample(static_cast<size_t>(samples));
    const int64_t stride = n / samples;
    for (int64_t j = 0; j < samples; ++j) sample[j] = magnitude_bits(x, j * stride);
    const int64_t q = std::min<int64_t>(samples - 1, static_cast<int64_t>(1.5 * samples * k / n) + 32);
    std::nth_element(sample.begin(), sample.begin() + q, sample.end(), std::greater<uint32_t>());
    threshold = sample[q];
    expected = (q + 1) * stride;
  }
  // Candidates by compaction. Where few pass (< 2%), a branch is predicted well and cheapest; where many pass, a
  // branch would mispredict every few elements, so the store is branch-free (store always, advance when kept).
  const bool sparse = expected * 50 < n;
  int64_t count = 0;
  if (threshold > 0) {
    const int64_t capacity = std::min<int64_t>(n, 2 * expected + 4096) + 1;
    keys.resize(static_cast<size_t>(capacity));
    if (sparse) {
      for (int64_t i = 0; i < n && count < capacity - 1; ++i) {
        const uint32_t b = magnitude_bits(x, i);
        if (b >= threshold) keys[count++] = order_key(b, i);
      }
    } else {
      for (int64_t i = 0; i < n && count < capacity - 1; ++i) {
        const uint32_t b = magnitude_bits(x, i);
        keys[count] = order_key(b, i);
        count += b >= threshold;
      }
    }
    if (count >= capacity - 1 || count < k) count = 0;  // misjudged: take every element
  }
  if (count == 0) {
    keys.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) keys[i] = order_key(magnitude_bits(x, i), i);
    count = n;
  }
  keys.resize(static_cast<size_t>(count));
}

// Sorting k indices costs about k log2 k, a pass over x about n / 8 (measured on one core): below n / 64 the
// sort is cheaper.
inline bool sort_cheaper(int64_t n, int64_t k) { return k * 64 < n; }

// The indices of the k keys at least kth, ascending.
void sorted_indices(const std::vector<uint64_t>& keys, uint64_t kth, int64_t k, int32_t* out) {
  int64_t c = 0;
  for (const uint64_t key : keys) {
    if (key >= kth) out[c++] = index_of(key);
  }
  std::sort(out, out + k);
}

}  // namespace

void topk_select(const float* x, int64_t n, int64_t k, int32_t* out) {
  check_k(n, k);
  if (k == n) {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(i);
    return;
  }
  std::vector<uint64_t> keys;
  top_keys(x, n, k, keys);
  uint64_t kth;
  kth_largest(keys, &k, 1, &kth);
  if (sort_cheaper(n, k)) {
    sorted_indices(keys, kth, k, out);
    return;
  }
  // Many kept: one pass emits them already in ascending order; exactly k keys are >= the k-th largest, and the
  // buffer has one slot of slack for the branch-free store.
  std::vector<int32_t> kept(static_cast<size_t>(k) + 1);
  int64_t c = 0;
  if (k * 50 < n) {
    const uint32_t kth_bits = static_cast<uint32_t>(kth >> 32);
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t b = magnitude_bits(x, i);
      if (b >= kth_bits && order_key(b, i) >= kth) kept[c++] = static_cast<int32_t>(i);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      kept[c] = static_cast<int32_t>(i);
      c += order_key(magnitude_bits(x, i), i) >= kth;
    }
  }
  std::memcpy(out, kept.data(), static_cast<size_t>(k) * sizeof(int32_t));
}

void topk_select_nested(const float* x, int64_t n, int64_t k1, int64_t k2, int32_t* out1, int32_t* out2) {
  check_k(n, k1);
  if (k2 < 1 || k2 > k1) throw std::invalid_argument("nested top-k needs 1 <= k2 <= k1");
  if (k1 == n || k2 == k1) {
    topk_select(x, n, k1, out1);
    if (k2 == k1) std::memcpy(out2, out1, static_cast<size_t>(k1) * sizeof(int32_t));
    else topk_select(x, n, k2, out2);
    return;
  }
  std::vector<uint64_t> keys;
  top_keys(x, n, k1, keys);  // the candidates of the top k1 hold the top k2
  const int64_t ks[2] = {k1, k2};
  uint64_t kth[2];
  kth_largest(keys, ks, 2, kth);
  const uint64_t kth1 = kth[0], kth2 = kth[1];
  if (sort_cheaper(n, k1)) {
    sorted_indices(keys, kth1, k1, out1);
    sorted_indices(keys, kth2, k2, out2);
    return;
  }
  // One pass emits both, ascending; one slot of slack each for the branch-free stores.
  std::vector<int32_t> kept1(static_cast<size_t>(k1) + 1), kept2(static_cast<size_t>(k2) + 1);
  int64_t c1 = 0, c2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t key = order_key(magnitude_bits(x, i), i);
    kept1[c1] = static_cast<int32_t>(i);
    kept2[c2] = static_cast<int32_t>(i);
    c1 += key >= kth1;
    c2 += key >= kth2;
  }
  std::memcpy(out1, kept1.data(), static_cast<size_t>(k1) * sizeof(int32_t));
  std::memcpy(out2, kept2.data(), static_cast<size_t>(k2) * sizeof(int32_t));
}

void topk_select_among(const float* x, const int32_t* candidates, int64_t m, int64_t k, int32_t* out) {
  if (k < 1 || k > m) throw std::invalid_argument("top-k among candidates needs 1 <= k <= m");
  if (k == m) {  // every candidate is kept (GraVAC's candidate CF equals theta_min)
    std::memcpy(out, candidates, static_cast<size_t>(m) * sizeof(int32_t));
    return;
  }
  std::vector<uint64_t> keys(static_cast<size_t>(m));
  for (int64_t j = 0; j < m; ++j) keys[j] = order_key(magnitude_bits(x, candidates[j]), candidates[j]);
  uint64_t kth;
  kth_largest(keys, &k, 1, &kth);
  int64_t c = 0;
  for (int64_t j = 0; j < m; ++j) {  // candidates are ascending, so the output is too
    if (order_key(magnitude_bits(x, candidates[j]), candidates[j]) >= kth) out[c++] = candidates[j];
  }
}

double sum_squares_at(const float* x, const int32_t* idx, int64_t k) {
  double s = 0.0;
  for (int64_t j = 0; j < k; ++j) s += static_cast<double>(x[idx[j]]) * static_cast<double>(x[idx[j]]);
  return s;
}

void topk_extract(float* r, const int32_t* idx, int64_t k, ValueType type, uint8_t* payload) {
  std::memcpy(payload, idx, static_cast<size_t>(k) * 4);  // little-endian hosts
  extract_values(r, idx, k, type, payload + k * 4);
}

void extract_values(float* r, const int32_t* idx, int64_t k, ValueType type, uint8_t* values) {
  for (int64_t j = 0; j < k; ++j) {
    const float v = r[idx[j]];
    if (type == ValueType::kFp16) {
      const uint16_t h = float_to_half(v);
      std::memcpy(values + 2 * j, &h, 2);
      r[idx[j]] = v - half_to_float(h);
    } else {
      std::memcpy(values + 4 * j, &v, 4);
      r[idx[j]] = 0.0f;
    }
  }
}

int topk_decode_average(const uint8_t* gathered, int nranks, int64_t k, int64_t n, ValueType type, float divisor,
                        float* out) {
  const int64_t stride = topk_payload_bytes(k, type);
  for (int r = 0; r < nranks; ++r) {
    const uint8_t* p = gathered + r * stride;
    for (int64_t j = 0; j < k; ++j) {
      int32_t i;
      std::memcpy(&i, p + 4 * j, 4);
      if (i < 0 || i >= n) return r;
    }
  }
  std::fill(out, out + n, 0.0f);
  for (int r = 0; r < nranks; ++r) {
    const uint8_t* p = gathered + r * stride;
    const uint8_t* values = p + 4 * k;
    for (int64_t j = 0; j < k; ++j) {
      int32_t i;
      std::memcpy(&i, p + 4 * j, 4);
      out[i] += value_at(values, j, type);
    }
  }
  for (int64_t i = 0; i < n; ++i) out[i] /= divisor;
  return -1;
}

int64_t topk_coded_max_bytes(int64_t k, int64_t n, ValueType type) {
  (void)n;
  return 5 + 4 + 1 + 5 + 4 + k * value_bytes(type) + 2 + (k + 1) * 40 / 8 + 8;
}

namespace {

// The "delta" payload of k values at ascending positions (< n); sent[j] = what value j stands for once coded
// (fp16: rounded; fp32: itself; ternary: +-mu).
std::vector<uint8_t> delta_payload(const float* values, const uint32_t* positions, int64_t k, int64_t n,
                                   ValueType type, float* sent) {
  check_coded_k(n, k);
  const bool ternary = type == ValueType::kTernary;
  std::vector<uint8_t> payload = frame_begin(static_cast<size_t>(k * (value_bytes(type) + 2) + 32));
  payload.push_back(static_cast<uint8_t>(type));
  put_varint(static_cast<uint64_t>(k), &payload);
  std::vector<uint8_t> signs(ternary ? static_cast<size_t>(k) : 0);
  const size_t at = payload.size();
  if (ternary) {
    double total = 0.0;
    for (int64_t j = 0; j < k; ++j) total += std::fabs(static_cast<double>(values[j]));
    const float mu = k > 0 ? static_cast<float>(total / static_cast<double>(k)) : 0.0f;
    payload.resize(at + 4);
    std::memcpy(payload.data() + at, &mu, 4);
    for (int64_t j = 0; j < k; ++j) {
      const bool negative = values[j] < 0.0f;
      signs[static_cast<size_t>(j)] = negative;
      sent[j] = negative ? -mu : mu;
    }
  } else {
    payload.resize(at + static_cast<size_t>(k * value_bytes(type)));
    uint8_t* out = payload.data() + at;
    for (int64_t j = 0; j < k; ++j) {
      if (type == ValueType::kFp16) {
        const uint16_t h = float_to_half(values[j]);
        std::memcpy(out + 2 * j, &h, 2);
        sent[j] = half_to_float(h);
      } else {
        std::memcpy(out + 4 * j, &values[j], 4);
        sent[j] = values[j];
      }
    }
  }
  SparseWriter writer(&payload, ternary, false);
  if (n > 0) writer.block(n, positions, k, signs.data(), nullptr);  // one block: the whole tensor
  writer.finish();
  frame_end(&payload);
  return payload;
}

// r = g_ef - sent, exactly as top-k keeps it (fp32 values leave 0).
inline float remainder_of(float v, float sent, ValueType type) { return type == ValueType::kFp32 ? 0.0f : v - sent; }

// What an fp16/fp32 value stands for once sent (sparse_reduce's values; ternary is not allowed there).
inline float sent_value(float v, ValueType type) {
  return type == ValueType::kFp16 ? half_to_float(float_to_half(v)) : v;
}

// The elements of a sequence of segments, read at ascending global positions.
class SegmentCursor {
 public:
  SegmentCursor(const Segment* segs, int nsegs) : segs_(segs), nsegs_(nsegs) {}
  float& at(int64_t position) {
    while (s_ < nsegs_ && position >= start_ + segs_[s_].n) start_ += segs_[s_++].n;
    if (s_ == nsegs_ || position < start_) throw std::invalid_argument("position outside the segments");
    return segs_[s_].data[position - start_];
  }

 private:
  const Segment* segs_;
  int nsegs_, s_ = 0;
  int64_t start_ = 0;
};

int64_t total_of(const Segment* segs, int nsegs) {
  int64_t total = 0;
  for (int i = 0; i < nsegs; ++i) total += segs[i].n;
  return total;
}

}  // namespace

std::vector<uint8_t> topk_extract_coded(float* r, const int32_t* idx, int64_t k, int64_t n, ValueType type) {
  check_coded_k(n, k);
  std::vector<uint32_t> positions(static_cast<size_t>(k));
  std::vector<float> values(static_cast<size_t>(k)), sent(static_cast<size_t>(k));
  int64_t last = -1;
  for (int64_t j = 0; j < k; ++j) {
    if (idx[j] <= last || idx[j] >= n) throw std::invalid_argument("top-k indices must be ascending, in [0, n)");
    positions[static_cast<size_t>(j)] = static_cast<uint32_t>(idx[j]);
    values[static_cast<size_t>(j)] = r[idx[j]];
    last = idx[j];
  }
  std::vector<uint8_t> payload = delta_payload(values.data(), positions.data(), k, n, type, sent.data());
  for (int64_t j = 0; j < k; ++j) {
    const size_t u = static_cast<size_t>(j);
    r[idx[j]] = remainder_of(values[u], sent[u], type);
  }
  return payload;
}

namespace {

constexpr uint8_t kUpstreamCorrupted = 0xFE;  // horovod_ext.compressors.transports.sparse_reduce.UPSTREAM_MARKER

// Every frame of `nframes` "delta" payloads back to back, their CRCs checked before anything is decoded.
std::vector<Frame> coded_frames(const uint8_t* gathered, int64_t bytes, int nframes) {
  if (nframes <= 0) throw std::invalid_argument("nranks must be >= 1");
  std::vector<Frame> frames;
  int64_t offset = 0;
  for (int r = 0; r < nframes; ++r) {
    frames.push_back(unframe(gathered, bytes, offset, "top-k payload", r));
    offset = frames.back().next;
  }
  if (offset != bytes) throw CorruptPayload("top-k payloads: trailing bytes (the sizes do not match)");
  return frames;
}

// visit(i, value) for every (i, value) of frame r, a payload over n elements.
template <typename Visit>
void visit_coded_frame(const Frame& f, int r, int64_t n, Visit visit) {
  const std::string where = "top-k payload from rank " + std::to_string(r) + " is malformed";
  const char* what = where.c_str();
  if (f.size == 1 && f.data[0] == kUpstreamCorrupted)
    throw CorruptPayload("rank " + std::to_string(r) + " received a corrupted top-k payload in sparse_reduce's "
                         "alltoall (its sender's bytes did not arrive intact)");
  if (f.size < 2 || f.data[0] > 2) BitReader::fail(what);
  const ValueType type = static_cast<ValueType>(f.data[0]);
  int used = 0;
  const uint64_t k = get_varint(f.data + 1, f.size - 1, &used, what);
  if (k > static_cast<uint64_t>(n)) BitReader::fail(what);
  const uint8_t* values = f.data + 1 + used;
  const int64_t value_area = type == ValueType::kTernary ? 4 : static_cast<int64_t>(k) * value_bytes(type);
  if (f.size - 1 - used < value_area) BitReader::fail(what);
  float mu = 0.0f;
  if (type == ValueType::kTernary) std::memcpy(&mu, values, 4);
  int64_t j = 0;
  const int64_t count = read_sparse_stream(
      values + value_area, f.size - 1 - used - value_area, n, 0, type == ValueType::kTernary, false, what,
      [&](int64_t i, int sign, int64_t) {
        if (j >= static_cast<int64_t>(k)) BitReader::fail(what);
        visit(i, type == ValueType::kTernary ? (sign ? -mu : mu) : value_at(values, j, type));
        ++j;
      });
  if (count != static_cast<int64_t>(k)) BitReader::fail(what);
}

// out[i] += value for every (i, value) of frame r.
void add_coded_frame(const Frame& f, int r, int64_t n, float* out) {
  visit_coded_frame(f, r, n, [&](int64_t i, float v) { out[i] += v; });
}

void check_bounds(const int64_t* bounds, int nregions) {
  if (nregions <= 0) throw std::invalid_argument("sparse_reduce needs at least one region");
  if (bounds[0] != 0 || bounds[nregions] >= (int64_t{1} << 31))
    throw std::invalid_argument("region bounds must start at 0 and end below 2^31");
  for (int g = 0; g < nregions; ++g)
    if (bounds[g] > bounds[g + 1]) throw std::invalid_argument("region bounds must be ascending");
}

}  // namespace

void topk_decode_average_coded(const uint8_t* gathered, int64_t bytes, int nranks, int64_t n, float divisor,
                               float* out) {
  const std::vector<Frame> frames = coded_frames(gathered, bytes, nranks);
  std::fill(out, out + n, 0.0f);
  for (int r = 0; r < nranks; ++r) add_coded_frame(frames[static_cast<size_t>(r)], r, n, out);
  for (int64_t i = 0; i < n; ++i) out[i] /= divisor;
}

std::vector<uint8_t> topk_encode_regions(const Segment* segs, int nsegs, const int32_t* positions, int64_t k,
                                         const int64_t* bounds, int nregions, ValueType type, int64_t* sizes) {
  check_bounds(bounds, nregions);
  if (type == ValueType::kTernary) throw std::invalid_argument("sparse_reduce takes fp16 or fp32 values");
  if (total_of(segs, nsegs) != bounds[nregions]) throw std::invalid_argument("bounds must end at the segments' size");
  SegmentCursor g_ef(segs, nsegs);
  std::vector<uint8_t> out;
  std::vector<uint32_t> local;
  std::vector<float> values, sent;
  int64_t first = 0, last_position = -1;
  for (int g = 0; g < nregions; ++g) {
    const int64_t lo = bounds[g], hi = bounds[g + 1];
    int64_t last = first;
    while (last < k && positions[last] < hi) ++last;
    const size_t m = static_cast<size_t>(last - first);
    local.resize(m);
    values.resize(m);
    sent.resize(m);
    for (int64_t j = first; j < last; ++j) {
      if (positions[j] <= last_position || positions[j] < lo)
        throw std::invalid_argument("top-k indices must be ascending, in [0, n)");
      last_position = positions[j];
      local[static_cast<size_t>(j - first)] = static_cast<uint32_t>(positions[j] - lo);
      values[static_cast<size_t>(j - first)] = g_ef.at(positions[j]);
    }
    const std::vector<uint8_t> part = delta_payload(values.data(), local.data(), last - first, hi - lo, type,
                                                    sent.data());
    sizes[g] = static_cast<int64_t>(part.size());
    out.insert(out.end(), part.begin(), part.end());
    first = last;
  }
  if (first != k) throw std::invalid_argument("top-k indices must be ascending, in [0, n)");
  return out;
}

std::vector<uint8_t> topk_reduce_region(const uint8_t* received, int64_t bytes, int nranks, int64_t n, int64_t q,
                                        ValueType type) {
  if (type == ValueType::kTernary) throw std::invalid_argument("sparse_reduce takes fp16 or fp32 values");
  if (q < 0) throw std::invalid_argument("q must be >= 0");
  struct Entry {
    uint32_t position;
    float value;
  };
  std::vector<Entry> entries;
  try {
    const std::vector<Frame> frames = coded_frames(received, bytes, nranks);
    for (int r = 0; r < nranks; ++r)
      visit_coded_frame(frames[static_cast<size_t>(r)], r, n,
                        [&](int64_t i, float v) { entries.push_back({static_cast<uint32_t>(i), v}); });
  } catch (const CorruptPayload&) {  // still take part in phase 2: a payload that fails every rank's decode
    std::vector<uint8_t> marker = frame_begin(1);
    marker.push_back(kUpstreamCorrupted);
    frame_end(&marker);
    return marker;
  }
  // the sums, in rank order from 0 (as a scatter-add of the N payloads into zeros), at the positions received
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& a, const Entry& b) { return a.position < b.position; });
  std::vector<uint32_t> positions;
  std::vector<float> sums;
  for (size_t j = 0; j < entries.size();) {
    float sum = 0.0f;
    const uint32_t at = entries[j].position;
    for (; j < entries.size() && entries[j].position == at; ++j) sum += entries[j].value;
    positions.push_back(at);
    sums.push_back(sum);
  }
  // the top min(q, m) of the m sums by |sum| (top-k's order: float bits, ties to the lower position), ascending
  const int64_t m = static_cast<int64_t>(sums.size()), kept = std::min(q, m);
  std::vector<uint64_t> keys(static_cast<size_t>(m));
  for (int64_t j = 0; j < m; ++j)
    keys[static_cast<size_t>(j)] = order_key(magnitude_bits(sums.data(), j), positions[static_cast<size_t>(j)]);
  std::vector<uint32_t> order(static_cast<size_t>(m));
  for (int64_t j = 0; j < m; ++j) order[static_cast<size_t>(j)] = static_cast<uint32_t>(j);
  if (kept < m)
    std::nth_element(order.begin(), order.begin() + kept, order.end(),
                     [&](uint32_t a, uint32_t b) { return keys[a] > keys[b]; });
  order.resize(static_cast<size_t>(kept));
  std::sort(order.begin(), order.end());  // entry order is position order
  std::vector<uint32_t> chosen(order.size());
  std::vector<float> values(order.size()), sent(order.size());
  for (size_t j = 0; j < order.size(); ++j) {
    chosen[j] = positions[order[j]];
    values[j] = sums[order[j]];
  }
  return delta_payload(values.data(), chosen.data(), kept, n, type, sent.data());
}

void topk_decode_regions_into(const uint8_t* gathered, int64_t bytes, int nregions, const int64_t* bounds,
                              float divisor, const Segment* out, int nsegs) {
  check_bounds(bounds, nregions);
  if (total_of(out, nsegs) != bounds[nregions]) throw std::invalid_argument("bounds must end at the outputs' size");
  const std::vector<Frame> frames = coded_frames(gathered, bytes, nregions);
  for (int i = 0; i < nsegs; ++i) std::fill(out[i].data, out[i].data + out[i].n, 0.0f);
  SegmentCursor average(out, nsegs);
  for (int g = 0; g < nregions; ++g) {
    const int64_t base = bounds[g];
    // each position comes once (the regions are disjoint): (0 + v) / divisor, a scatter-add into zeros then a divide
    visit_coded_frame(frames[static_cast<size_t>(g)], g, bounds[g + 1] - base,
                      [&](int64_t i, float v) { average.at(base + i) = (0.0f + v) / divisor; });
  }
}

void topk_keep_applied(const Segment* g_ef, const Segment* average, int nsegs, const int32_t* positions, int64_t k,
                       ValueType type) {
  if (total_of(g_ef, nsegs) != total_of(average, nsegs)) throw std::invalid_argument("segments differ in size");
  SegmentCursor r(g_ef, nsegs), avg(average, nsegs);
  int64_t last = -1;
  for (int64_t j = 0; j < k; ++j) {
    if (positions[j] <= last) throw std::invalid_argument("top-k indices must be ascending, in [0, n)");
    last = positions[j];
    if (avg.at(positions[j]) != 0.0f) {
      float& v = r.at(positions[j]);
      v = remainder_of(v, sent_value(v, type), type);
    }
  }
}

}  // namespace hvdext
