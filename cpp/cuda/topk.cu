// GPU kernels of top-k with error feedback, bit-identical to the CPU kernels (cpp/src/topk.cpp) and to the
// definition (python/hvdext_reference/topk.py); see include/hvdext/topk.h for the math.
//
// Selection (exact k, ties to the lower index, keys = the bits of |x|, so NaN > Inf > every finite value):
//   1. keys of a strided sample of min(n, 16384) elements, sorted descending; the key at the sample position where
//      about 1.25 k n/S + 3 sqrt(.) + 8 elements are expected above it is the threshold;
//   2. one stable compaction (cub::DeviceSelect::If) keeps the indices of every element whose key reaches the
//      threshold, in index order; if fewer than k passed, the threshold is 0 and every index is a candidate;
//   3. the candidates' keys sorted descending give the k-th key K and how many candidates lie above it;
//   4. the output is, in index order, every candidate above K and the first (k - above) candidates equal to K
//      (an exclusive scan ranks the ties; cub::DeviceSelect::Flagged compacts), exactly k indices, ascending.
// Error feedback: r += g with |r|^2 in the order of hvdext/reduce.h; extract writes the payload and leaves
// r = g_ef - sent on the kept elements (float_to_half from hvdext/half.h, as the CPU).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cub/cub.cuh>
#include <stdexcept>
#include <thrust/iterator/counting_iterator.h>

#include "hvdext/cuda.h"
#include "reduce.cuh"

namespace hvdext {
namespace cuda {
namespace {

constexpr int64_t kSample = 16384;

__device__ __forceinline__ uint32_t key_of(float v) { return __float_as_uint(v) & 0x7FFFFFFFu; }

__global__ void ef_lanes_kernel(const float* g, float* r, int64_t n, int64_t blocks, double* squares) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t b = t / kLanes;
  const int j = static_cast<int>(t % kLanes);
  double q = 0.0;
  if (b < blocks) {
    const int64_t end = min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock + j; i < end; i += kLanes) {
      const float v = __fadd_rn(r[i], g[i]);
      r[i] = v;
      const double d = static_cast<double>(v);
      q = __dadd_rn(q, __dmul_rn(d, d));
    }
  }
  q = combine_lanes_in_warp(q);
  if (b < blocks && j == 0) squares[b] = q;
}

__global__ void tree_kernel(double* partials, double* scratch, int64_t count, double* out) {
  const double v = pairwise_tree_in_block(partials, scratch, count);
  if (threadIdx.x == 0) *out = v;
}

__global__ void sample_kernel(const float* x, int64_t n, int64_t samples, uint32_t* keys) {
  const int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s < samples) keys[s] = key_of(x[s * (n / samples)]);
}

__global__ void pick_threshold_kernel(const uint32_t* sorted_desc, int64_t position, uint32_t* threshold) {
  *threshold = sorted_desc[position];
}

struct ReachesThreshold {
  const float* x;
  const uint32_t* threshold;
  __device__ bool operator()(int32_t i) const { return key_of(x[i]) >= *threshold; }
};

__global__ void gather_keys_kernel(const float* x, const int32_t* candidates, int64_t m, uint32_t* keys) {
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p < m) keys[p] = key_of(x[candidates[p]]);
}

// K = the k-th largest candidate key; need = k - (candidates above K), the ties to keep.
__global__ void kth_kernel(const uint32_t* sorted_desc, int64_t k, uint32_t* kth, int32_t* need) {
  const uint32_t key = sorted_desc[k - 1];
  int64_t lo = 0, hi = k - 1;  // the first position holding K (keys above it come first)
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (sorted_desc[mid] > key) lo = mid + 1; else hi = mid;
  }
  *kth = key;
  *need = static_cast<int32_t>(k - lo);
}

__global__ void tie_flags_kernel(const uint32_t* keys, int64_t m, const uint32_t* kth, int32_t* ties) {
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p < m) ties[p] = keys[p] == *kth;
}

__global__ void keep_flags_kernel(const uint32_t* keys, const int32_t* tie_rank, int64_t m, const uint32_t* kth,
                                  const int32_t* need, char* keep) {
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p < m) keep[p] = keys[p] > *kth || (keys[p] == *kth && tie_rank[p] < *need);
}

__global__ void iota_kernel(int32_t* out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = static_cast<int32_t>(i);
}

__global__ void extract_kernel(float* r, const int32_t* idx, int64_t k, bool fp16, uint8_t* payload) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= k) return;
  const int32_t i = idx[j];
  reinterpret_cast<int32_t*>(payload)[j] = i;  // little-endian, as the CPU's memcpy
  const float v = r[i];
  if (fp16) {
    const uint16_t h = float_to_half(v);
    reinterpret_cast<uint16_t*>(payload + 4 * k)[j] = h;
    r[i] = __fsub_rn(v, half_to_float(h));
  } else {
    reinterpret_cast<float*>(payload + 4 * k)[j] = v;
    r[i] = 0.0f;
  }
}

// Payload bytes read one at a time: a rank's payload starts at r * (4 + value bytes) * k, which is not 4-aligned.
__device__ __forceinline__ int32_t index_at(const uint8_t* p, int64_t j) {
  const uint8_t* b = p + 4 * j;
  return static_cast<int32_t>(static_cast<uint32_t>(b[0]) | (static_cast<uint32_t>(b[1]) << 8) |
                              (static_cast<uint32_t>(b[2]) << 16) | (static_cast<uint32_t>(b[3]) << 24));
}

__device__ __forceinline__ float value_at(const uint8_t* values, int64_t j, bool fp16) {
  if (fp16) {
    const uint8_t* b = values + 2 * j;
    return half_to_float(static_cast<uint16_t>(b[0] | (b[1] << 8)));
  }
  const uint8_t* b = values + 4 * j;
  return __uint_as_float(static_cast<uint32_t>(b[0]) | (static_cast<uint32_t>(b[1]) << 8) |
                         (static_cast<uint32_t>(b[2]) << 16) | (static_cast<uint32_t>(b[3]) << 24));
}

__global__ void first_bad_rank_kernel(const uint8_t* gathered, int nranks, int64_t k, int64_t n, int64_t stride,
                                      int32_t* bad_rank) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= static_cast<int64_t>(nranks) * k) return;
  const int r = static_cast<int>(t / k);
  const int32_t i = index_at(gathered + r * stride, t % k);
  if (i < 0 || i >= n) atomicMin(bad_rank, r);
}

// One rank's payload added into out: its k indices are distinct (a top-k selection), so no two threads meet.
__global__ void add_payload_kernel(const uint8_t* p, int64_t k, bool fp16, float* out) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= k) return;
  const int32_t i = index_at(p, j);
  out[i] = __fadd_rn(out[i], value_at(p + 4 * k, j, fp16));
}

__global__ void divide_kernel(float* out, int64_t n, float divisor) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __fdiv_rn(out[i], divisor);
}

// Scratch of topk_select, carved out of one workspace: every piece 256-byte aligned.
struct TopkScratch {
  uint32_t* sample_in;
  uint32_t* sample_out;
  uint32_t* threshold;
  uint32_t* kth;
  int32_t* need;
  int32_t* selected;  // [0]: candidates, [1]: output count
  int32_t* candidates;
  uint32_t* keys;
  uint32_t* sorted;   // then reused for the tie flags (int32)
  int32_t* tie_rank;
  char* keep;
  void* temp;
  size_t temp_bytes;
  int64_t total;

  TopkScratch(void* base, int64_t n) {
    char* p = static_cast<char*>(base);
    int64_t offset = 0;
    auto take = [&](int64_t bytes) {
      char* at = p ? p + offset : nullptr;
      offset += (bytes + 255) / 256 * 256;
      return at;
    };
    const int64_t samples = std::min(n, kSample);
    sample_in = reinterpret_cast<uint32_t*>(take(4 * samples));
    sample_out = reinterpret_cast<uint32_t*>(take(4 * samples));
    threshold = reinterpret_cast<uint32_t*>(take(4));
    kth = reinterpret_cast<uint32_t*>(take(4));
    need = reinterpret_cast<int32_t*>(take(4));
    selected = reinterpret_cast<int32_t*>(take(8));
    candidates = reinterpret_cast<int32_t*>(take(4 * n));
    keys = reinterpret_cast<uint32_t*>(take(4 * n));
    sorted = reinterpret_cast<uint32_t*>(take(4 * n));
    tie_rank = reinterpret_cast<int32_t*>(take(4 * n));
    keep = take(n);
    temp_bytes = cub_temp_bytes(n, samples);
    temp = take(static_cast<int64_t>(temp_bytes));
    total = offset;
  }

  static size_t cub_temp_bytes(int64_t n, int64_t samples) {
    size_t most = 0, bytes = 0;
    const int items = static_cast<int>(n);
    cub::DeviceRadixSort::SortKeysDescending(nullptr, bytes, static_cast<uint32_t*>(nullptr),
                                             static_cast<uint32_t*>(nullptr), static_cast<int>(samples));
    most = std::max(most, bytes);
    cub::DeviceRadixSort::SortKeysDescending(nullptr, bytes, static_cast<uint32_t*>(nullptr),
                                             static_cast<uint32_t*>(nullptr), items);
    most = std::max(most, bytes);
    cub::DeviceSelect::If(nullptr, bytes, thrust::counting_iterator<int32_t>(0), static_cast<int32_t*>(nullptr),
                          static_cast<int32_t*>(nullptr), items, ReachesThreshold{nullptr, nullptr});
    most = std::max(most, bytes);
    cub::DeviceScan::ExclusiveSum(nullptr, bytes, static_cast<int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
                                  items);
    most = std::max(most, bytes);
    cub::DeviceSelect::Flagged(nullptr, bytes, static_cast<int32_t*>(nullptr), static_cast<char*>(nullptr),
                               static_cast<int32_t*>(nullptr), static_cast<int32_t*>(nullptr), items);
    return std::max(most, bytes);
  }
};

void check_k(int64_t n, int64_t k) {
  if (n < 1 || n >= (int64_t{1} << 31)) throw std::invalid_argument("top-k needs 1 <= n < 2^31 elements");
  if (k < 1 || k > n) throw std::invalid_argument("top-k needs 1 <= k <= n");
}

}  // namespace

int64_t ef_accumulate_workspace_bytes(int64_t n) {
  const int64_t blocks = reduce_blocks(n) > 0 ? reduce_blocks(n) : 1;
  return 2 * blocks * static_cast<int64_t>(sizeof(double));
}

void ef_accumulate(const float* g, float* r, int64_t n, double* sumsq, void* workspace, void* stream) {
  const cudaStream_t s = as_stream(stream);
  const int64_t blocks = reduce_blocks(n), room = blocks > 0 ? blocks : 1;
  double* squares = static_cast<double*>(workspace);
  if (blocks > 0) ef_lanes_kernel<<<grid_for(lane_threads(n)), kThreads, 0, s>>>(g, r, n, blocks, squares);
  tree_kernel<<<1, 1024, 0, s>>>(squares, squares + room, blocks, sumsq);
  check(cudaGetLastError(), "ef_accumulate");
}

int64_t topk_workspace_bytes(int64_t n, int64_t k) {
  check_k(n, k);
  return TopkScratch(nullptr, n).total;
}

void topk_select(const float* x, int64_t n, int64_t k, int32_t* out, void* workspace, int64_t workspace_bytes,
                 void* stream) {
  check_k(n, k);
  const cudaStream_t s = as_stream(stream);
  if (k == n) {
    iota_kernel<<<grid_for(n), kThreads, 0, s>>>(out, n);
    check(cudaGetLastError(), "topk_select");
    return;
  }
  TopkScratch w(workspace, n);
  if (workspace_bytes < w.total) throw std::invalid_argument("topk_select: workspace smaller than topk_workspace_bytes");
  const int items = static_cast<int>(n);
  size_t temp = w.temp_bytes;

  // 1. the threshold from a sorted strided sample
  const int64_t samples = std::min(n, kSample);
  sample_kernel<<<grid_for(samples), kThreads, 0, s>>>(x, n, samples, w.sample_in);
  check(cub::DeviceRadixSort::SortKeysDescending(w.temp, temp, w.sample_in, w.sample_out, static_cast<int>(samples),
                                                 0, 32, s), "topk_select (sample sort)");
  const double expected = static_cast<double>(k) * static_cast<double>(samples) / static_cast<double>(n);
  const int64_t position = std::min<int64_t>(samples - 1,
                                             static_cast<int64_t>(1.25 * expected + 3.0 * std::sqrt(expected) + 8.0));
  pick_threshold_kernel<<<1, 1, 0, s>>>(w.sample_out, position, w.threshold);

  // 2. stable compaction of the candidates (index order); all of them if too few passed
  int32_t m = 0;
  for (int attempt = 0; attempt < 2; ++attempt) {
    temp = w.temp_bytes;
    check(cub::DeviceSelect::If(w.temp, temp, thrust::counting_iterator<int32_t>(0), w.candidates, w.selected,
                                items, ReachesThreshold{x, w.threshold}, s), "topk_select (compaction)");
    check(cudaMemcpyAsync(&m, w.selected, sizeof(int32_t), cudaMemcpyDeviceToHost, s), "topk_select (count)");
    check(cudaStreamSynchronize(s), "topk_select (count)");
    if (m >= k) break;
    check(cudaMemsetAsync(w.threshold, 0, sizeof(uint32_t), s), "topk_select (threshold)");
  }

  // 3. the k-th key among the candidates
  gather_keys_kernel<<<grid_for(m), kThreads, 0, s>>>(x, w.candidates, m, w.keys);
  temp = w.temp_bytes;
  check(cub::DeviceRadixSort::SortKeysDescending(w.temp, temp, w.keys, w.sorted, m, 0, 32, s),
        "topk_select (candidate sort)");
  kth_kernel<<<1, 1, 0, s>>>(w.sorted, k, w.kth, w.need);

  // 4. every candidate above K and the first `need` ties, in index order
  int32_t* ties = reinterpret_cast<int32_t*>(w.sorted);  // the sorted keys are no longer needed
  tie_flags_kernel<<<grid_for(m), kThreads, 0, s>>>(w.keys, m, w.kth, ties);
  temp = w.temp_bytes;
  check(cub::DeviceScan::ExclusiveSum(w.temp, temp, ties, w.tie_rank, m, s), "topk_select (tie ranks)");
  keep_flags_kernel<<<grid_for(m), kThreads, 0, s>>>(w.keys, w.tie_rank, m, w.kth, w.need, w.keep);
  temp = w.temp_bytes;
  check(cub::DeviceSelect::Flagged(w.temp, temp, w.candidates, w.keep, out, w.selected + 1, m, s),
        "topk_select (output)");
  check(cudaGetLastError(), "topk_select");
}

void topk_extract(float* r, const int32_t* idx, int64_t k, ValueType type, uint8_t* payload, void* stream) {
  if (k <= 0) return;
  extract_kernel<<<grid_for(k), kThreads, 0, as_stream(stream)>>>(r, idx, k, type == ValueType::kFp16, payload);
  check(cudaGetLastError(), "topk_extract");
}

int topk_decode_average(const uint8_t* gathered, int nranks, int64_t k, int64_t n, ValueType type, float divisor,
                        float* out, int32_t* bad_rank, void* stream) {
  const cudaStream_t s = as_stream(stream);
  const bool fp16 = type == ValueType::kFp16;
  const int64_t stride = (4 + (fp16 ? 2 : 4)) * k;
  const int32_t none = nranks;
  check(cudaMemcpyAsync(bad_rank, &none, sizeof(none), cudaMemcpyHostToDevice, s), "topk_decode_average");
  if (k > 0) {
    first_bad_rank_kernel<<<grid_for(static_cast<int64_t>(nranks) * k), kThreads, 0, s>>>(gathered, nranks, k, n,
                                                                                          stride, bad_rank);
  }
  int32_t bad = none;
  check(cudaMemcpyAsync(&bad, bad_rank, sizeof(bad), cudaMemcpyDeviceToHost, s), "topk_decode_average");
  check(cudaStreamSynchronize(s), "topk_decode_average");
  if (bad < nranks) return bad;
  check(cudaMemsetAsync(out, 0, sizeof(float) * n, s), "topk_decode_average");
  for (int r = 0; r < nranks && k > 0; ++r) {
    add_payload_kernel<<<grid_for(k), kThreads, 0, s>>>(gathered + r * stride, k, fp16, out);
  }
  divide_kernel<<<grid_for(n), kThreads, 0, s>>>(out, n, divisor);
  check(cudaGetLastError(), "topk_decode_average");
  return -1;
}

int64_t topk_bucket_workspace_bytes(const int64_t* numels, const int64_t* ks, int m) {
  int64_t bytes = 0;
  for (int j = 0; j < m; ++j)
    bytes = std::max({bytes, ef_accumulate_workspace_bytes(numels[j]), topk_workspace_bytes(numels[j], ks[j])});
  return bytes;
}

void topk_encode_bucket(const float* const* g, float* const* r, const int64_t* numels, const int64_t* ks, int m,
                        ValueType type, int32_t* const* idx, uint8_t* const* payloads, double* sumsq, void* workspace,
                        int64_t workspace_bytes, void* stream) {
  for (int j = 0; j < m; ++j) {
    if (g != nullptr) ef_accumulate(g[j], r[j], numels[j], sumsq + j, workspace, stream);
    topk_select(r[j], numels[j], ks[j], idx[j], workspace, workspace_bytes, stream);
    topk_extract(r[j], idx[j], ks[j], type, payloads[j], stream);
  }
}

}  // namespace cuda
}  // namespace hvdext
