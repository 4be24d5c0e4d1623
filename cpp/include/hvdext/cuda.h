// GPU kernels of the op library (cpp/cuda/*.cu), framework-free: raw device pointers, device scratch memory sized
// by the *_workspace_bytes functions (a binding allocates it with its framework's caching allocator), and the CUDA
// stream to run on, passed as void* so that bindings need no CUDA header. Nothing here synchronizes with the host
// except topk_select (one 4-byte read of its candidate count); results stay on the device.
//
// The math, and the bits, are those of the CPU kernels (hvdext/ternary.h, hvdext/topk.h): the same counter-based
// random keys, the statistics in the order of hvdext/reduce.h, IEEE arithmetic without contraction (explicit
// __fmul_rn/__fadd_rn/__dmul_rn intrinsics, and nvcc --fmad=false).
#pragma once
#include <cstdint>

#include "hvdext/common.h"
#include "hvdext/ternary.h"
#include "hvdext/topk.h"

namespace hvdext {
namespace cuda {

// TernGrad statistics and scale of g on the device: writes {threshold, scale} (as ternary_local_scale) to
// threshold_scale[0..1]; clip <= 0 turns clipping off.
int64_t ternary_scale_workspace_bytes(int64_t n);
void ternary_local_scale(const float* g, int64_t n, double clip, float* threshold_scale, void* workspace,
                         void* stream);

// Writes ternary_payload_bytes(n, packing) bytes (the scale, then the packed codes), as the CPU ternary_encode.
void ternary_encode(const float* g, int64_t n, float threshold, float scale, const RandomKey& key, Packing packing,
                    uint8_t* payload, void* stream);

// Decodes and averages nranks payloads into out[0..n); flags[0] = -1 or the first rank whose scale is not finite
// (out untouched then), flags[1] = 1 when every rank sent the same scale. flags: 2 device int32.
void ternary_decode_average(const uint8_t* gathered, int nranks, int64_t n, Packing packing, float divisor,
                            float* out, int32_t* flags, void* stream);

// r += g; *sumsq = sum(r^2) (float64, the order of hvdext/reduce.h), on the device.
int64_t ef_accumulate_workspace_bytes(int64_t n);
void ef_accumulate(const float* g, float* r, int64_t n, double* sumsq, void* workspace, void* stream);

// The k (1 <= k <= n < 2^31) indices of the largest |x| (ties to the lower index, ordered by the bits of |x|),
// ascending, into out: a strided sample sets a threshold, one stable compaction collects the candidates in index
// order, and an exact selection among them (among all, if too few passed) corrects the result to exactly k.
// The workspace is about 21 bytes per element: the candidate buffers are sized for the fallback where every
// element is a candidate.
int64_t topk_workspace_bytes(int64_t n, int64_t k);
void topk_select(const float* x, int64_t n, int64_t k, int32_t* out, void* workspace, int64_t workspace_bytes,
                 void* stream);

// The payload of the selected elements of r (k int32 indices, then k values) and, with error feedback, r = g_ef -
// sent on them: the CPU topk_extract.
void topk_extract(float* r, const int32_t* idx, int64_t k, ValueType type, uint8_t* payload, void* stream);

// A bucket's "int32" payloads in one call, enqueued on `stream` with no host read: for each tensor j, r[j] += g[j]
// where g is given (ef_accumulate, its sum of squares left in sumsq[j] on the device), then topk_select into idx[j]
// (ks[j] int32) and topk_extract into payloads[j]: each tensor's own kernels, so their bits. The workspace is
// topk_bucket_workspace_bytes(numels, ks, m) bytes, shared by the tensors in turn (stream order).
int64_t topk_bucket_workspace_bytes(const int64_t* numels, const int64_t* ks, int m);
void topk_encode_bucket(const float* const* g, float* const* r, const int64_t* numels, const int64_t* ks, int m,
                        ValueType type, int32_t* const* idx, uint8_t* const* payloads, double* sumsq, void* workspace,
                        int64_t workspace_bytes, void* stream);

// Averages nranks int32-indexed payloads (topk_payload_bytes(k, type) bytes each, fp16 or fp32 values) into
// out[0..n), as the CPU topk_decode_average: out = 0, then rank 0's values added at their indices, then rank 1's,
// ..., then out /= divisor, so every element sees the CPU's additions in the CPU's order. *bad_rank (a device
// int32) becomes -1, or the first rank with an index outside [0, n) (out untouched then). Payloads need no
// alignment. One 4-byte read of *bad_rank synchronizes with the host.
int topk_decode_average(const uint8_t* gathered, int nranks, int64_t k, int64_t n, ValueType type, float divisor,
                        float* out, int32_t* bad_rank, void* stream);

// out[0..n) = the standard normals of `key` (hvdext/random.h), as the CPU normal_fill.
void normal_fill(const RandomKey& key, int64_t n, float* out, void* stream);

}  // namespace cuda
}  // namespace hvdext
