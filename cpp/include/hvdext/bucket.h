// A bucket's allgather decoded in one call (horovod_ext/compression/buckets.py fuses a bucket's per-tensor
// allgathers into one): the result holds, for each of nranks ranks in order, a header of m int32 sizes (padded to
// header_bytes) and then that rank's m payloads back to back. Tensor j's payloads from every rank, gathered back
// to back, are exactly what its own allgather gives, so each is decoded by the tensor's own decoder: the averages
// are the bits of one call per tensor. Definition: buckets.FusingBackend._split, then the per-tensor decoders.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hvdext/common.h"
#include "hvdext/topk.h"

namespace hvdext {

// What became of one tensor: the decoder's flag (-1, or the first rank it reports), or, where its payloads were
// corrupted, the decoder's message (error non-empty; flag -1); finite: no NaN or Inf in its average (checked by the
// decoders that report it, below; true where unchecked or not decoded).
struct SegmentDecoded {
  int flag = -1;
  std::string error;
  bool finite = true;
};

// No NaN or Inf among x's n floats.
bool all_finite(const float* x, int64_t n);

// decode(j, parts, bytes): tensor j's nranks payloads back to back; returns its flag. A CorruptPayload thrown by
// it is caught and reported for that tensor alone. Throws CorruptPayload for all when a header's sizes pass the
// result's end (the header itself corrupted).
std::vector<SegmentDecoded> decode_bucket(const uint8_t* result, int64_t bytes, int nranks, int m, int64_t header_bytes,
                                          const std::function<int(int, const uint8_t*, int64_t)>& decode);

// A bucket's top-k "delta" encode in one call, each tensor j by its own kernels (the bits of one call each): where
// g is given, g_ef[j] = g[j] + g_ef[j] first (ef_accumulate: g_ef[j] is the residual's storage); then the ks[j]
// largest |g_ef[j]| (topk_select) are coded (topk_extract_coded), leaving g_ef[j] - sent in g_ef[j]. Returns the
// m payloads.
std::vector<std::vector<uint8_t>> topk_encode_coded_bucket(const float* const* g, float* const* g_ef,
                                                           const int64_t* numels, const int64_t* ks, int m,
                                                           ValueType type);

// The same with "int32" packing: payloads[j] receives topk_payload_bytes(ks[j], type) bytes (topk_extract's).
void topk_encode_int32_bucket(const float* const* g, float* const* g_ef, const int64_t* numels, const int64_t* ks,
                              int m, ValueType type, uint8_t* const* payloads);

// The per-tensor decoders over a bucket: outs[j] receives tensor j's average (numels[j] floats). Top-k's also
// reports whether each average is finite (its values are fp16/fp32 from any rank: a NaN or Inf among them, or an
// fp32 sum past the range, reaches the average), so that the step reads one flag per tensor from this call
// instead of reducing each average again.
std::vector<SegmentDecoded> topk_decode_average_coded_bucket(const uint8_t* result, int64_t bytes, int nranks, int m,
                                                             int64_t header_bytes, const int64_t* numels,
                                                             float divisor, float* const* outs);
std::vector<SegmentDecoded> ternary_decode_average_bucket(const uint8_t* result, int64_t bytes, int nranks, int m,
                                                          int64_t header_bytes, const int64_t* numels, int packing,
                                                          float divisor, float* const* outs);

}  // namespace hvdext
