// GPU kernels of TernGrad (Wen et al., NeurIPS 2017), bit-identical to the CPU kernels (cpp/src/ternary.cpp) and
// to the definition (python/hvdext_reference/terngrad.py); see include/hvdext/ternary.h for the math.
//
//   statistics:  one thread per (4096-element block, lane), the float64 sums in the order of hvdext/reduce.h, max|g|
//                by an order-free atomic max; a one-block kernel combines the blocks and computes t and s.
//   encode:      a thread block stages 256 rows of 16 (two-bit) or 20 (base-3) floats in shared memory (coalesced
//                reads; rows 80 bytes apart, so that each thread's float4 reads of its row are free of bank
//                conflicts); each thread makes the codes of its row (4 or 5 Philox blocks) and writes its 4 packed
//                bytes as one 32-bit store.
//   decode:      one thread per 4 packed bytes, every rank's in rank order (codes from a shared table of all 256
//                bytes); exact integer sums when every rank sent the same scale, else the float32 sum of s_r * v_r
//                in rank order, as the CPU kernel.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "hvdext/cuda.h"
#include "hvdext/philox.h"
#include "reduce.cuh"

namespace hvdext {
namespace cuda {
namespace {

constexpr int kEncodeBytes = 4;  // packed bytes per encode thread: 16 two-bit or 20 base-3 codes
constexpr int kTileRow = 20;     // floats per thread's row of the encode tile (16 codes use 16 of them)
constexpr unsigned kMaxDecodeBlocks = 4096;  // decode's grid; its threads stride over the bytes beyond

__global__ void stats_lanes_kernel(const float* g, int64_t n, int64_t blocks, double* sums, double* squares,
                                   unsigned* maxbits) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t b = t / kLanes;
  const int j = static_cast<int>(t % kLanes);
  double s = 0.0, q = 0.0;
  float mx = 0.0f;
  if (b < blocks) {
    const int64_t end = min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock + j; i < end; i += kLanes) {
      const float x = g[i];
      const double d = static_cast<double>(x);
      s = __dadd_rn(s, d);
      q = __dadd_rn(q, __dmul_rn(d, d));
      mx = fmaxf(mx, fabsf(x));
    }
  }
  s = combine_lanes_in_warp(s);
  q = combine_lanes_in_warp(q);
  for (int offset = 16; offset > 0; offset >>= 1) mx = fmaxf(mx, __shfl_down_sync(0xFFFFFFFFu, mx, offset));
  if (b < blocks && j == 0) {
    sums[b] = s;
    squares[b] = q;
  }
  if ((threadIdx.x & 31u) == 0) atomicMax(maxbits, __float_as_uint(mx));  // non-negative floats order as integers
}

// t = float32(clip * sigma) (+inf when clipping is off or sigma = 0), s = min(max|g|, t); +inf for NaN/Inf input.
__global__ void scale_finish_kernel(double* sums, double* squares, double* scratch, int64_t blocks,
                                    const unsigned* maxbits, int64_t n, double clip, float* out) {
  const double sum = pairwise_tree_in_block(sums, scratch, blocks);
  const double sq = pairwise_tree_in_block(squares, scratch, blocks);
  if (threadIdx.x != 0) return;
  const float inf = __int_as_float(0x7F800000);
  if (!isfinite(sum) || !isfinite(sq)) {
    out[0] = inf;
    out[1] = inf;
    return;
  }
  float threshold = inf;
  if (clip > 0.0 && n > 0) {
    const double count = static_cast<double>(n);
    const double mean = __ddiv_rn(sum, count);
    const double var = fmax(__dsub_rn(__ddiv_rn(sq, count), __dmul_rn(mean, mean)), 0.0);
    const double sigma = __dsqrt_rn(var);
    if (sigma > 0.0) threshold = __double2float_rn(__dmul_rn(clip, sigma));
  }
  out[0] = threshold;
  out[1] = fminf(__uint_as_float(*maxbits), threshold);
}

template <int PER>
__global__ void encode_kernel(const float* g, int64_t n, float threshold, float scale, RandomKey key,
                              int64_t packed_bytes, bool zeros, uint8_t* payload) {
  constexpr int kCodes = kEncodeBytes * PER;
  __shared__ __align__(16) float tile[kThreads * kTileRow];
  if (blockIdx.x == 0 && threadIdx.x == 0) {  // the header: the float32 scale, little-endian
    const unsigned bits = __float_as_uint(scale);
    for (int i = 0; i < 4; ++i) payload[i] = static_cast<uint8_t>(bits >> (8 * i));
  }
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads * kCodes;
  for (int i = threadIdx.x; i < kThreads * kCodes; i += kThreads) {
    const int64_t k = first + i;
    tile[(i / kCodes) * kTileRow + i % kCodes] = k < n ? g[k] : 0.0f;
  }
  __syncthreads();
  const int64_t e0 = first + static_cast<int64_t>(threadIdx.x) * kCodes;
  if (e0 >= n) return;
  float x[kCodes];
  const float4* row = reinterpret_cast<const float4*>(tile + threadIdx.x * kTileRow);
#pragma unroll
  for (int v = 0; v < kCodes / 4; ++v) {
    const float4 f = row[v];
    x[4 * v] = f.x;
    x[4 * v + 1] = f.y;
    x[4 * v + 2] = f.z;
    x[4 * v + 3] = f.w;
  }
  uint8_t codes[kCodes];
#pragma unroll
  for (int b = 0; b < kCodes / 4; ++b) {
    const Philox4 r = philox_block(key, static_cast<uint32_t>(e0 / 4 + b));
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const int i = 4 * b + w;
      const float xc = fminf(fmaxf(x[i], -threshold), threshold);
      const float p = __fdiv_rn(fabsf(xc), scale);
      const uint8_t keep = !zeros && (e0 + i < n) && (philox_uniform(r.v[w]) < p);
      codes[i] = static_cast<uint8_t>(keep + (keep & (x[i] < 0.0f)));
    }
  }
  uint32_t word = 0;
#pragma unroll
  for (int q = 0; q < kEncodeBytes; ++q) {
    const uint8_t* c = codes + PER * q;
    uint32_t byte;
    if constexpr (PER == 4) {
      byte = c[0] | (c[1] << 2) | (c[2] << 4) | (c[3] << 6);
    } else {
      byte = c[0] + 3 * c[1] + 9 * c[2] + 27 * c[3] + 81 * c[4];
    }
    word |= byte << (8 * q);
  }
  uint8_t* out = payload + kTernaryHeaderBytes + e0 / PER;
  const int64_t left = packed_bytes - e0 / PER;
  if (left >= kEncodeBytes && (reinterpret_cast<uintptr_t>(out) & 3u) == 0) {
    *reinterpret_cast<uint32_t*>(out) = word;
  } else {
    for (int q = 0; q < kEncodeBytes && q < left; ++q) out[q] = static_cast<uint8_t>(word >> (8 * q));
  }
}

__device__ __forceinline__ float load_float(const uint8_t* p) {  // payload scales are not 4-byte aligned
  return __uint_as_float(static_cast<unsigned>(p[0]) | (static_cast<unsigned>(p[1]) << 8) |
                         (static_cast<unsigned>(p[2]) << 16) | (static_cast<unsigned>(p[3]) << 24));
}

// {0: 0, 1: +1, 2: -1} of code j of a packed byte; base-3 bytes above 242 never occur and decode as zeros.
__device__ __forceinline__ int code_value(uint8_t byte, int j, int per) {
  int c;
  if (per == 4) {
    c = (byte >> (2 * j)) & 3;
  } else {
    int rest = byte < 243 ? byte : 0;
    for (int t = 0; t < j; ++t) rest /= 3;
    c = rest % 3;
  }
  return c == 1 ? 1 : (c == 2 ? -1 : 0);
}

__global__ void decode_flags_kernel(const uint8_t* gathered, int nranks, int64_t stride, int32_t* flags) {
  const float first = load_float(gathered);
  int bad = -1, shared = 1;
  for (int r = 0; r < nranks; ++r) {
    const float s = load_float(gathered + r * stride);
    if (!isfinite(s)) {
      bad = r;
      break;
    }
    shared = shared && (s == first);
  }
  flags[0] = bad;
  flags[1] = shared;
}

constexpr int kMaxSharedScales = 1024;  // ranks whose scales a decode block keeps in shared memory
constexpr int kDecodeBytes = 4;         // packed bytes per decode thread (16 or 20 elements)
constexpr int kFieldBits = 12;          // a byte's codes, each plus 1, in 12-bit fields of one 64-bit word
constexpr int kRanksPerFlush = 2047;    // ranks whose fields add up without carrying: 2 * 2047 < 2^12

// Thread i decodes bytes 4i..4i+3 of every rank, in rank order: one load and one table lookup per byte and rank.
// With one shared scale the table's words add up (field j of the sum = sum of codes j + ranks), so the exact
// integer counts cost one 64-bit addition per byte; else each code is weighted by its rank's scale in float32, in
// rank order. The 16 or 20 results go out as float4 stores where out is 16-byte aligned.
template <int PER>
__global__ void decode_kernel(const uint8_t* gathered, int nranks, int64_t n, int64_t stride, float divisor,
                              const int32_t* flags, float* out) {
  constexpr int kOut = kDecodeBytes * PER;
  __shared__ unsigned long long table[256];
  __shared__ float scales[kMaxSharedScales];
  if (flags[0] != -1) return;  // the same for every thread: out stays untouched
  for (int b = threadIdx.x; b < 256; b += blockDim.x) {
    unsigned long long word = 0;
    for (int j = 0; j < PER; ++j) {
      word |= static_cast<unsigned long long>(code_value(static_cast<uint8_t>(b), j, PER) + 1) << (kFieldBits * j);
    }
    table[b] = word;
  }
  const int cached = min(nranks, kMaxSharedScales);
  for (int r = threadIdx.x; r < cached; r += blockDim.x) scales[r] = load_float(gathered + r * stride);
  __syncthreads();
  const bool shared = flags[1] != 0;
  const float first = load_float(gathered);
  const uint8_t* codes = gathered + kTernaryHeaderBytes;
  const int64_t bytes = (n + PER - 1) / PER;
  const bool aligned = (reinterpret_cast<uintptr_t>(out) & 15u) == 0;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x * kDecodeBytes;
  for (int64_t b0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kDecodeBytes; b0 < bytes;
       b0 += step) {
    const int nb = static_cast<int>(min(static_cast<int64_t>(kDecodeBytes), bytes - b0));
    float value[kOut];
    if (shared) {
      int count[kOut];
#pragma unroll
      for (int e = 0; e < kOut; ++e) count[e] = 0;
      unsigned long long sum[kDecodeBytes] = {0, 0, 0, 0};
      int pending = 0;
      for (int r = 0; r < nranks; ++r) {
        const uint8_t* row = codes + r * stride + b0;
#pragma unroll
        for (int q = 0; q < kDecodeBytes; ++q) {
          if (q < nb) sum[q] += table[row[q]];
        }
        if (++pending == kRanksPerFlush || r == nranks - 1) {
#pragma unroll
          for (int q = 0; q < kDecodeBytes; ++q) {
#pragma unroll
            for (int j = 0; j < PER; ++j) {
              count[q * PER + j] += static_cast<int>((sum[q] >> (kFieldBits * j)) & 0xFFFu) - pending;
            }
            sum[q] = 0;
          }
          pending = 0;
        }
      }
#pragma unroll
      for (int e = 0; e < kOut; ++e) value[e] = __fdiv_rn(__fmul_rn(static_cast<float>(count[e]), first), divisor);
    } else {
      float acc[kOut];
#pragma unroll
      for (int e = 0; e < kOut; ++e) acc[e] = 0.0f;
      for (int r = 0; r < nranks; ++r) {
        const uint8_t* row = codes + r * stride + b0;
        const float s = r < cached ? scales[r] : load_float(gathered + r * stride);
#pragma unroll
        for (int q = 0; q < kDecodeBytes; ++q) {
          const unsigned long long word = q < nb ? table[row[q]] : 0ull;
#pragma unroll
          for (int j = 0; j < PER; ++j) {
            const int v = static_cast<int>((word >> (kFieldBits * j)) & 0xFFFu) - 1;
            acc[q * PER + j] = __fadd_rn(acc[q * PER + j], __fmul_rn(s, static_cast<float>(v)));
          }
        }
      }
#pragma unroll
      for (int e = 0; e < kOut; ++e) value[e] = __fdiv_rn(acc[e], divisor);
    }
    const int64_t k0 = b0 * PER;  // a multiple of 16 or 20 elements: 16-byte aligned where out is
    if (aligned && k0 + kOut <= n) {
      float4* dst = reinterpret_cast<float4*>(out + k0);
#pragma unroll
      for (int v = 0; v < kOut / 4; ++v) {
        dst[v] = make_float4(value[4 * v], value[4 * v + 1], value[4 * v + 2], value[4 * v + 3]);
      }
    } else {
#pragma unroll
      for (int e = 0; e < kOut; ++e) {
        if (k0 + e < n) out[k0 + e] = value[e];
      }
    }
  }
}

int codes_per_byte(Packing packing) { return packing == Packing::kTwoBit ? 4 : 5; }

}  // namespace

int64_t ternary_scale_workspace_bytes(int64_t n) {
  const int64_t blocks = reduce_blocks(n) > 0 ? reduce_blocks(n) : 1;
  return 3 * blocks * static_cast<int64_t>(sizeof(double)) + 16;
}

void ternary_local_scale(const float* g, int64_t n, double clip, float* threshold_scale, void* workspace,
                         void* stream) {
  const cudaStream_t s = as_stream(stream);
  const int64_t blocks = reduce_blocks(n), room = blocks > 0 ? blocks : 1;
  double* sums = static_cast<double*>(workspace);
  double* squares = sums + room;
  double* scratch = squares + room;
  unsigned* maxbits = reinterpret_cast<unsigned*>(scratch + room);
  check(cudaMemsetAsync(maxbits, 0, sizeof(unsigned), s), "ternary_local_scale (memset)");
  if (blocks > 0) {
    stats_lanes_kernel<<<grid_for(lane_threads(n)), kThreads, 0, s>>>(g, n, blocks, sums, squares, maxbits);
  }
  scale_finish_kernel<<<1, 1024, 0, s>>>(sums, squares, scratch, blocks, maxbits, n, clip > 0.0 ? clip : 0.0,
                                         threshold_scale);
  check(cudaGetLastError(), "ternary_local_scale");
}

void ternary_encode(const float* g, int64_t n, float threshold, float scale, const RandomKey& key, Packing packing,
                    uint8_t* payload, void* stream) {
  const int per = codes_per_byte(packing);
  const bool zeros = !(scale > 0.0f) || !std::isfinite(scale);
  const int64_t per_block = static_cast<int64_t>(kThreads) * kEncodeBytes * per;
  const unsigned grid = static_cast<unsigned>(n > 0 ? (n + per_block - 1) / per_block : 1);
  const int64_t packed = ternary_packed_bytes(n, packing);
  if (per == 4) {
    encode_kernel<4><<<grid, kThreads, 0, as_stream(stream)>>>(g, n, threshold, scale, key, packed, zeros, payload);
  } else {
    encode_kernel<5><<<grid, kThreads, 0, as_stream(stream)>>>(g, n, threshold, scale, key, packed, zeros, payload);
  }
  check(cudaGetLastError(), "ternary_encode");
}

void ternary_decode_average(const uint8_t* gathered, int nranks, int64_t n, Packing packing, float divisor,
                            float* out, int32_t* flags, void* stream) {
  if (nranks <= 0) throw std::invalid_argument("nranks must be >= 1");
  const cudaStream_t s = as_stream(stream);
  const int per = codes_per_byte(packing);
  const int64_t stride = ternary_payload_bytes(n, packing);
  decode_flags_kernel<<<1, 1, 0, s>>>(gathered, nranks, stride, flags);
  if (n > 0) {
    const unsigned grid = std::min<unsigned>(grid_for((ternary_packed_bytes(n, packing) + kDecodeBytes - 1) /
                                                      kDecodeBytes), kMaxDecodeBlocks);
    if (per == 4) {
      decode_kernel<4><<<grid, kThreads, 0, s>>>(gathered, nranks, n, stride, divisor, flags, out);
    } else {
      decode_kernel<5><<<grid, kThreads, 0, s>>>(gathered, nranks, n, stride, divisor, flags, out);
    }
  }
  check(cudaGetLastError(), "ternary_decode_average");
}

}  // namespace cuda
}  // namespace hvdext
