#include "hvdext/bucket.h"

#include <cstring>
#include <stdexcept>

#include "hvdext/coding.h"
#include "hvdext/ternary.h"
#include "hvdext/topk.h"

namespace hvdext {

// No NaN or Inf among x's n floats: none has an all-ones exponent (integer compares, which vectorize).
HVDEXT_VECTOR_CLONES bool all_finite(const float* x, int64_t n) {
  uint32_t special = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof(bits));
    special |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return special == 0;
}

std::vector<SegmentDecoded> decode_bucket(const uint8_t* result, int64_t bytes, int nranks, int m, int64_t header_bytes,
                                          const std::function<int(int, const uint8_t*, int64_t)>& decode) {
  if (nranks < 1 || m < 0 || header_bytes < 4 * static_cast<int64_t>(m))
    throw std::invalid_argument("decode_bucket: nranks >= 1, m >= 0 and header_bytes >= 4 m");
  // offsets[r * m + j], sizes[r * m + j]: rank r's payload of tensor j within the result
  std::vector<int64_t> offsets(static_cast<size_t>(nranks) * m), sizes(offsets.size());
  int64_t position = 0;
  for (int r = 0; r < nranks; ++r) {
    if (position + header_bytes > bytes) throw CorruptPayload("bucket header passes the end of the allgather");
    std::vector<int32_t> header(static_cast<size_t>(m));
    if (m > 0) std::memcpy(header.data(), result + position, sizeof(int32_t) * static_cast<size_t>(m));
    position += header_bytes;
    for (int j = 0; j < m; ++j) {
      const int64_t size = header[static_cast<size_t>(j)];
      if (size < 0 || position + size > bytes) throw CorruptPayload("bucket header's sizes pass the end of the allgather");
      offsets[static_cast<size_t>(r) * m + j] = position;
      sizes[static_cast<size_t>(r) * m + j] = size;
      position += size;
    }
  }
  std::vector<SegmentDecoded> out(static_cast<size_t>(m));
  std::vector<uint8_t> parts;
  for (int j = 0; j < m; ++j) {
    parts.clear();
    for (int r = 0; r < nranks; ++r) {
      const size_t at = static_cast<size_t>(r) * m + j;
      parts.insert(parts.end(), result + offsets[at], result + offsets[at] + sizes[at]);
    }
    try {
      out[static_cast<size_t>(j)].flag = decode(j, parts.data(), static_cast<int64_t>(parts.size()));
    } catch (const CorruptPayload& e) {
      out[static_cast<size_t>(j)].error = e.what();
    }
  }
  return out;
}

namespace {

void check_bucket_k(int64_t n, int64_t k) {
  if (k < 1 || k > n) throw std::invalid_argument("a bucket's top-k needs 1 <= k <= n for every tensor");
}

}  // namespace

namespace {

// Each tensor j of a bucket: g_ef[j] += g[j] where g is given (ef_accumulate), then its ks[j] largest |g_ef[j]|
// (topk_select), which extract(j, idx) codes.
template <class Extract>
void encode_segments(const float* const* g, float* const* g_ef, const int64_t* numels, const int64_t* ks, int m,
                     Extract&& extract) {
  std::vector<int32_t> idx;
  for (int j = 0; j < m; ++j) {
    if (g != nullptr) ef_accumulate(g[j], g_ef[j], numels[j]);
    check_bucket_k(numels[j], ks[j]);
    idx.resize(static_cast<size_t>(ks[j]));
    topk_select(g_ef[j], numels[j], ks[j], idx.data());
    extract(j, idx.data());
  }
}

}  // namespace

std::vector<std::vector<uint8_t>> topk_encode_coded_bucket(const float* const* g, float* const* g_ef,
                                                           const int64_t* numels, const int64_t* ks, int m,
                                                           ValueType type) {
  std::vector<std::vector<uint8_t>> payloads(static_cast<size_t>(m));
  encode_segments(g, g_ef, numels, ks, m, [&](int j, const int32_t* idx) {
    payloads[static_cast<size_t>(j)] = topk_extract_coded(g_ef[j], idx, ks[j], numels[j], type);
  });
  return payloads;
}

void topk_encode_int32_bucket(const float* const* g, float* const* g_ef, const int64_t* numels, const int64_t* ks,
                              int m, ValueType type, uint8_t* const* payloads) {
  encode_segments(g, g_ef, numels, ks, m, [&](int j, const int32_t* idx) {
    topk_extract(g_ef[j], idx, ks[j], type, payloads[j]);
  });
}

std::vector<SegmentDecoded> topk_decode_average_coded_bucket(const uint8_t* result, int64_t bytes, int nranks, int m,
                                                             int64_t header_bytes, const int64_t* numels,
                                                             float divisor, float* const* outs) {
  std::vector<SegmentDecoded> out =
      decode_bucket(result, bytes, nranks, m, header_bytes, [&](int j, const uint8_t* parts, int64_t size) {
        topk_decode_average_coded(parts, size, nranks, numels[j], divisor, outs[j]);
        return -1;
      });
  for (int j = 0; j < m; ++j)
    if (out[static_cast<size_t>(j)].error.empty()) out[static_cast<size_t>(j)].finite = all_finite(outs[j], numels[j]);
  return out;
}

std::vector<SegmentDecoded> ternary_decode_average_bucket(const uint8_t* result, int64_t bytes, int nranks, int m,
                                                          int64_t header_bytes, const int64_t* numels, int packing,
                                                          float divisor, float* const* outs) {
  const Packing p = static_cast<Packing>(packing);
  return decode_bucket(result, bytes, nranks, m, header_bytes, [&](int j, const uint8_t* parts, int64_t size) {
    if (p == Packing::kEntropy) return ternary_decode_average_entropy(parts, size, nranks, numels[j], divisor, outs[j]);
    if (size != static_cast<int64_t>(nranks) * ternary_payload_bytes(numels[j], p))
      throw CorruptPayload("ternary payloads of the wrong size in a bucket");
    return ternary_decode_average(parts, nranks, numels[j], p, divisor, outs[j]);
  });
}

}  // namespace hvdext
