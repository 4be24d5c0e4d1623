// Device side of hvdext/reduce.h: float64 block-tree sums with the CPU's bits, and CUDA error checks.
//
// Step 2 (lane sums) runs one thread per (block, lane): thread t adds elements start + j, start + j + 8, ... of
// block t / 8 in order; 8 consecutive threads of a warp are one block's lanes, so a warp reads 4 blocks' 32-byte
// segments per step. Step 3 is three shuffles (offsets 1, 2, 4), which is exactly ((l0+l1)+(l2+l3))+((l4+l5)+
// (l6+l7)). Step 4 runs in one thread block, one pass per level between two buffers.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "hvdext/reduce.h"

namespace hvdext {
namespace cuda {

constexpr int kThreads = 256;

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("horovod_ext CUDA ") + what + ": " + cudaGetErrorString(status));
  }
}

inline cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

inline unsigned grid_for(int64_t threads) { return static_cast<unsigned>((threads + kThreads - 1) / kThreads); }

// Threads for step 2: 8 per block, rounded up to whole warps (idle threads take part in the shuffles with 0).
inline int64_t lane_threads(int64_t n) { return (reduce_blocks(n) * kLanes + 31) / 32 * 32; }

// Step 3 for the lane sum s held by the calling thread (all 32 threads of the warp call it): the block's sum in
// the thread of lane 0 of the block.
__device__ __forceinline__ double combine_lanes_in_warp(double s) {
  const unsigned lane = threadIdx.x & 7u;
  const double s1 = __shfl_down_sync(0xFFFFFFFFu, s, 1);
  if ((lane & 1u) == 0) s = __dadd_rn(s, s1);
  const double s2 = __shfl_down_sync(0xFFFFFFFFu, s, 2);
  if ((lane & 3u) == 0) s = __dadd_rn(s, s2);
  const double s4 = __shfl_down_sync(0xFFFFFFFFu, s, 4);
  if (lane == 0) s = __dadd_rn(s, s4);
  return s;
}

// Step 4 inside one thread block: combines p[0..count) pairwise, level by level (scratch: count doubles); the
// result is returned to every thread.
__device__ inline double pairwise_tree_in_block(double* p, double* scratch, int64_t count) {
  __shared__ double result;
  double* src = p;
  double* dst = scratch;
  while (count > 1) {
    const int64_t half = count / 2;
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) dst[i] = __dadd_rn(src[2 * i], src[2 * i + 1]);
    if (threadIdx.x == 0 && (count & 1)) dst[half] = src[count - 1];
    __syncthreads();
    double* t = src;
    src = dst;
    dst = t;
    count = half + (count & 1);
  }
  if (threadIdx.x == 0) result = count ? src[0] : 0.0;
  __syncthreads();
  return result;
}

}  // namespace cuda
}  // namespace hvdext
