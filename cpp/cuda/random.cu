// GPU kernel of the normal draw (include/hvdext/random.h), bit-identical to the CPU kernel: the same Philox words,
// the float64 Box-Muller of normal_at with nvcc --fmad=false (no contraction), rounded once to float32.
#include <cuda_runtime.h>

#include <cstdint>

#include "hvdext/cuda.h"
#include "hvdext/random.h"
#include "reduce.cuh"

namespace hvdext {
namespace cuda {
namespace {

__global__ void normal_kernel(RandomKey key, int64_t n, float* out) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = normal_at(key, i);
  }
}

}  // namespace

void normal_fill(const RandomKey& key, int64_t n, float* out, void* stream) {
  if (n <= 0) return;
  const int64_t threads = n < (int64_t{1} << 24) ? n : (int64_t{1} << 24);
  normal_kernel<<<grid_for(threads), kThreads, 0, as_stream(stream)>>>(key, n, out);
  check(cudaGetLastError(), "normal_fill");
}

}  // namespace cuda
}  // namespace hvdext
