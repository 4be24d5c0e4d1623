// Shared definitions of the horovod-ext op library (framework-free, C++17, CPU and CUDA).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define HVDEXT_HD __host__ __device__ __forceinline__
#else
#define HVDEXT_HD inline
#endif

// Hot CPU loops are compiled for several instruction sets and picked at load time (GCC function multi-versioning):
// one build uses AVX-512 (x86-64-v4: F, BW, DQ, VL) or AVX2 (x86-64-v3) where the CPU has them. The arithmetic is
// integer or IEEE without contraction (-ffp-contract=off), so every clone gives the same bits.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define HVDEXT_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define HVDEXT_VECTOR_CLONES
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
