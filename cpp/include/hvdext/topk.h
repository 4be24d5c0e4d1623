// Top-k sparsification with error feedback (Stich et al. 2018; Lin et al. 2018), the kernels of Compression.topk and
// Compression.adaptive_topk (GraVAC, Tyagi & Swany 2023):
//
//   g_ef = g + r;  I = top-k of |g_ef| (ties to the lower index, ordered by the float32 bits of |g_ef|);
//   sent = value_type(g_ef[I]);  r = g_ef - sent on I, g_ef elsewhere (sent + r == g_ef exactly)
//   payload = k int32 indices (ascending) then k values (fp16 or fp32); decode: out[I_r] += v_r in rank order, / N
//
// The definition, to the bit, is python/hvdext_reference/topk.py.
#pragma once
#include <cstdint>

#include "hvdext/half.h"

namespace hvdext {

enum class ValueType : int { kFp16 = 0, kFp32 = 1 };

inline int value_bytes(ValueType t) { return t == ValueType::kFp16 ? 2 : 4; }
inline int64_t topk_payload_bytes(int64_t k, ValueType t) { return k * (4 + value_bytes(t)); }

// float_to_half / half_to_float: hvdext/half.h (shared with the GPU kernels).

// r += g over n elements; returns sum(r^2) after the update (float64, in the order of hvdext/reduce.h).
double ef_accumulate(const float* g, float* r, int64_t n);

// The k (1 <= k <= n < 2^31) indices of the largest |x|, ascending. A sampled threshold picks candidates in one
// pass; an exact selection among them (or among all, if too few passed) makes the result exactly the top k.
void topk_select(const float* x, int64_t n, int64_t k, int32_t* out);

// The top k among `m` candidate indices (ascending) of x, ascending: the multi-level recompression.
void topk_select_among(const float* x, const int32_t* candidates, int64_t m, int64_t k, int32_t* out);

// sum(x[idx]^2) in float64.
double sum_squares_at(const float* x, const int32_t* idx, int64_t k);

// Writes the payload of the selected elements of r (= g_ef) and, with error feedback, leaves r = g_ef - sent on them
// (without error feedback the caller discards r).
void topk_extract(float* r, const int32_t* idx, int64_t k, ValueType type, uint8_t* payload);

// gathered: nranks payloads of k elements each, back to back. Writes out[0..n) = (sum of the ranks' values at their
// indices) / divisor. Returns -1, or the first rank whose payload holds an index outside [0, n).
int topk_decode_average(const uint8_t* gathered, int nranks, int64_t k, int64_t n, ValueType type, float divisor,
                        float* out);

}  // namespace hvdext
