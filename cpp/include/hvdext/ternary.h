// TernGrad (Wen et al., NeurIPS 2017): stochastic, unbiased ternary gradients with a per-tensor scale.
//
//   statistics:  mean, sigma over float64 in the order of hvdext/reduce.h; maxabs = max|g|
//   clipping:    t = float32(c * sigma) (c = 0 or sigma = 0: t = +inf); g_c = clamp(g, -t, t)
//   scale:       s = min(maxabs, t)   (with a shared scale: the max of every rank's s)
//   ternarize:   b_k = [u_k < |g_c,k| / s] with u_k from Philox under (seed, step, tensor, rank, k);
//                g~_k = s * sign(g_k) * b_k, so E[g~] = g_c and Var[g~_k] = s|g_c,k| - g_c,k^2
//   payload:     float32 scale (little-endian) + codes {0: 0, 1: +1, 2: -1} packed 4 per byte ("2bit") or
//                5 per byte in base 3 ("base3", 1.6 bits per element); or, "entropy" (variable size, framed as in
//                hvdext/coding.h): crc32 | float32 scale | u8 mode | body, mode 0: the non-zero codes' positions
//                and signs as a sparse stream (n H(codes) + nnz bits, about 2% over the codes' entropy; coding.h),
//                mode 1: the codes packed in base 3, where that is smaller (codes mostly non-zero)
//   decode:      out_k = float32(sum_r v_r,k) * s / divisor when all ranks sent the same s, else the float32 sum
//                of s_r * v_r,k in rank order, divided by divisor
//
// The definition, to the bit, is python/hvdext_reference/terngrad.py. A gradient that holds NaN or Inf gets the
// scale +inf, which every decoder reports.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "hvdext/common.h"

namespace hvdext {

enum class Packing : int { kTwoBit = 0, kBase3 = 1, kEntropy = 2 };

constexpr int64_t kTernaryHeaderBytes = 4;  // the float32 scale

struct GradientStats {
  double sum = 0.0;
  double sumsq = 0.0;
  float maxabs = 0.0f;
  bool finite = true;
};

struct TernaryScale {
  float threshold;  // clip threshold t (+inf when clipping is off)
  float scale;      // s = min(maxabs, t); +inf flags a NaN/Inf gradient
};

GradientStats gradient_stats(const float* g, int64_t n);

// clip <= 0 turns clipping off.
TernaryScale ternary_local_scale(const float* g, int64_t n, double clip);

// "2bit" and "base3": the exact sizes; "entropy": the most it can take (a frame of the base-3 fallback).
int64_t ternary_packed_bytes(int64_t n, Packing packing);
int64_t ternary_payload_bytes(int64_t n, Packing packing);

// Writes ternary_payload_bytes(n, packing) bytes: the scale, then the packed codes, in one pass over g.
void ternary_encode(const float* g, int64_t n, float threshold, float scale, const RandomKey& key, Packing packing,
                    uint8_t* payload);

// The codes {0: 0, 1: +1, 2: -1} of g, one byte per element, unpacked (the two-phase transport packs them per
// chunk); the same draws as ternary_encode.
void ternary_encode_codes(const float* g, int64_t n, float threshold, float scale, const RandomKey& key,
                          uint8_t* codes);

// Packs m codes (with at least 8 readable bytes after them) into ternary_packed_bytes(m, packing) bytes.
void ternary_pack_codes(const uint8_t* codes, int64_t m, Packing packing, uint8_t* out);

// The values {-1, 0, +1} of the 4 ("2bit") or 5 ("base3") codes in one packed byte.
const int8_t* ternary_byte_values(uint8_t byte, Packing packing);

// gathered: nranks payloads of ternary_payload_bytes(n, packing) bytes each, back to back (an allgather's output).
// Writes the decoded average into out[0..n). Returns -1, or the first rank whose scale is not finite (then out is
// left untouched).
int ternary_decode_average(const uint8_t* gathered, int nranks, int64_t n, Packing packing, float divisor, float* out);

// "entropy" packing (std::vector: its size is known once coded). The same draws, scale and codes as
// ternary_encode; n < 2^31.
std::vector<uint8_t> ternary_encode_entropy(const float* g, int64_t n, float threshold, float scale,
                                            const RandomKey& key);
// The same payload for given codes (one byte each) and scale: the two-phase transport's phase-1 chunks.
std::vector<uint8_t> ternary_codes_encode_entropy(const uint8_t* codes, int64_t n, float scale);
// gathered: nranks "entropy" payloads back to back, `bytes` in all. The same average, to the bit, as
// ternary_decode_average of the same codes in a fixed packing. Returns -1 or the first rank whose scale is not
// finite; throws CorruptPayload (the same on every rank: they hold the same bytes) for a corrupted payload.
int ternary_decode_average_entropy(const uint8_t* gathered, int64_t bytes, int nranks, int64_t n, float divisor,
                                   float* out);
// received: nranks "entropy" chunks of `count` codes each (phase 1 of the two-phase transport); writes them packed
// (ternary_packed_bytes(count, packing) bytes each, back to back). Returns -1, or the first rank whose chunk is
// corrupted (only this rank holds it: the caller passes the flag on, so that every rank fails together).
int ternary_entropy_to_packed(const uint8_t* received, int64_t bytes, int nranks, int64_t count, Packing packing,
                              uint8_t* packed);

}  // namespace hvdext
