// Shared definitions of the horovod-ext op library (framework-free, C++17, CPU and CUDA).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define HVDEXT_HD __host__ __device__ __forceinline__
#else
#define HVDEXT_HD inline
#endif

namespace hvdext {

// Key of the counter-based generator: element k of tensor `tensor` on `rank` at `step` under `seed`
// draws word k % 4 of philox4x32_10(counter = (k / 4, step, tensor, rank), key = (seed lo, seed hi)).
struct RandomKey {
  uint64_t seed;
  uint32_t step;
  uint32_t tensor;
  uint32_t rank;
};

}  // namespace hvdext
