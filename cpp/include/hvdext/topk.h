// Top-k sparsification with error feedback (Stich et al. 2018; Lin et al. 2018), the kernels of Compression.topk and
// Compression.adaptive_topk (GraVAC, Tyagi & Swany 2023):
//
//   g_ef = g + r;  I = top-k of |g_ef| (ties to the lower index, ordered by the float32 bits of |g_ef|);
//   sent = value_type(g_ef[I]);  r = g_ef - sent on I, g_ef elsewhere (sent + r == g_ef exactly)
//   payload = k int32 indices (ascending) then k values (fp16 or fp32); decode: out[I_r] += v_r in rank order, / N
//   "delta" payload (variable size, framed as in hvdext/coding.h): crc32 | u8 value type | varint k | values |
//   the indices as a sparse stream (Rice-coded gaps, about log2(n/k) + 1.5 bits each). Values: k fp16 or fp32,
//   or "ternary" (Sattler et al. 2019, sparse ternary compression): one float32 magnitude
//   mu = float32(sum |g_ef[I]| / k) (float64, in index order) and a sign bit per index in the stream,
//   sent = mu * sign(g_ef[I]) (-0.0 and +0.0 are positive), r = g_ef - sent on I.
//
// The definition, to the bit, is python/hvdext_reference/topk.py.
#pragma once
#include <cstdint>
#include <vector>

#include "hvdext/half.h"

namespace hvdext {

enum class ValueType : int { kFp16 = 0, kFp32 = 1, kTernary = 2 };

inline int value_bytes(ValueType t) { return t == ValueType::kFp16 ? 2 : t == ValueType::kFp32 ? 4 : 0; }
inline int64_t topk_payload_bytes(int64_t k, ValueType t) { return k * (4 + value_bytes(t)); }

// float_to_half / half_to_float: hvdext/half.h (shared with the GPU kernels).

// r += g over n elements; returns sum(r^2) after the update (float64, in the order of hvdext/reduce.h).
double ef_accumulate(const float* g, float* r, int64_t n);

// The k (1 <= k <= n < 2^31) indices of the largest |x|, ascending. A sampled threshold picks candidates in one
// pass; an exact selection among them (or among all, if too few passed) makes the result exactly the top k.
void topk_select(const float* x, int64_t n, int64_t k, int32_t* out);

// The top k1 (1 <= k1 <= n) and the top k2 (1 <= k2 <= k1) of x, both ascending, from one selection: GraVAC's
// multi-level compression (the top k2 among the top k1 is the top k2 of x), as topk_select twice, bit for bit.
void topk_select_nested(const float* x, int64_t n, int64_t k1, int64_t k2, int32_t* out1, int32_t* out2);

// The top k among `m` candidate indices (ascending) of x, ascending: the multi-level recompression.
void topk_select_among(const float* x, const int32_t* candidates, int64_t m, int64_t k, int32_t* out);

// sum(x[idx]^2) in float64.
double sum_squares_at(const float* x, const int32_t* idx, int64_t k);

// Writes the payload of the selected elements of r (= g_ef) and, with error feedback, leaves r = g_ef - sent on them
// (without error feedback the caller discards r).
void topk_extract(float* r, const int32_t* idx, int64_t k, ValueType type, uint8_t* payload);
// Its values part alone (k fp16 or fp32 values of r at idx), with the same update of r.
void extract_values(float* r, const int32_t* idx, int64_t k, ValueType type, uint8_t* values);

// gathered: nranks payloads of k elements each, back to back. Writes out[0..n) = (sum of the ranks' values at their
// indices) / divisor. Returns -1, or the first rank whose payload holds an index outside [0, n).
int topk_decode_average(const uint8_t* gathered, int nranks, int64_t k, int64_t n, ValueType type, float divisor,
                        float* out);

// The "delta" payload of the selected elements of r (= g_ef), leaving r = g_ef - sent on them (as topk_extract);
// 0 <= k <= n (an empty payload is allowed).
std::vector<uint8_t> topk_extract_coded(float* r, const int32_t* idx, int64_t k, int64_t n, ValueType type);
// Upper bound of its size (index gaps at most 32 bits + 1 each).
int64_t topk_coded_max_bytes(int64_t k, int64_t n, ValueType type);
// gathered: nranks "delta" payloads back to back, `bytes` in all; the same average as topk_decode_average.
// Throws CorruptPayload for a corrupted payload (every rank holds the same bytes).
void topk_decode_average_coded(const uint8_t* gathered, int64_t bytes, int nranks, int64_t n, float divisor,
                               float* out);

// sparse_reduce (horovod_ext/compressors/transports/sparse_reduce.py). Its index space is the concatenation of
// segments (the step's tensors, in order), cut into regions [bounds[g], bounds[g+1]).
struct Segment {
  float* data;
  int64_t n;
};
// Phase 1: one "delta" payload per region (region-relative indices, possibly none; fp16/fp32 values of g_ef at the
// ascending global positions), back to back; sizes[g] = bytes of region g's. g_ef is only read.
std::vector<uint8_t> topk_encode_regions(const Segment* g_ef, int nsegs, const int32_t* positions, int64_t k,
                                         const int64_t* bounds, int nregions, ValueType type, int64_t* sizes);
// The owner of a region of n elements: the sums (float32, in rank order from 0) of the N ranks' payloads at the
// positions it received, and the "delta" payload of the top min(q, received) of them by |sum| (top-k's order: ties
// to the lower position). A corrupted payload gives the marker payload that fails every rank's phase-2 decode.
std::vector<uint8_t> topk_reduce_region(const uint8_t* received, int64_t bytes, int nranks, int64_t n, int64_t q,
                                        ValueType type);
// Phase 2: one payload per region, in region order, decoded at their offsets into `out` (zeros elsewhere):
// (0 + value) / divisor. Throws CorruptPayload as topk_decode_average_coded.
void topk_decode_regions_into(const uint8_t* gathered, int64_t bytes, int nregions, const int64_t* bounds,
                              float divisor, const Segment* out, int nsegs);
// Error feedback: g_ef becomes the residual, in place: g_ef - sent at this rank's positions whose average is
// non-zero (applied), g_ef elsewhere (never sent, or dropped by the global selection).
void topk_keep_applied(const Segment* g_ef, const Segment* average, int nsegs, const int32_t* positions, int64_t k,
                       ValueType type);

}  // namespace hvdext
