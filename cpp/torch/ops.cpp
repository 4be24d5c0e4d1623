// PyTorch binding of the horovod-ext op library: converts tensors and calls the framework-free core, nothing else.
// Ops that have a GPU kernel dispatch on the tensor's device: CUDA tensors go to hvdext::cuda (cpp/cuda/*.cu) on
// the stream the caller passes (torch.cuda.current_stream().cuda_stream), with device scratch from torch's caching
// allocator; host results (a scale, a count) are read back with a torch copy on that stream. Built with
// HVDEXT_WITH_CUDA where torch has CUDA and nvcc is present (setup.py); the CUDA branch needs no CUDA header.
// torch/types.h (ATen's tensors and ops in namespace torch) and torch's pybind11 casters, not torch/extension.h:
// that one adds the whole C++ frontend (nn, optim, data), which a binding does not use, to every compile.
#include <torch/csrc/utils/pybind.h>
#include <torch/types.h>

#include <cstring>
#include <tuple>
#include <vector>
#include <type_traits>

#include "hvdext/bucket.h"
#include "hvdext/coding.h"
#include "hvdext/random.h"
#include "hvdext/ternary.h"
#include "hvdext/topk.h"
#include "hvdext/two_phase.h"
#ifdef HVDEXT_WITH_CUDA
#include "hvdext/cuda.h"
#endif

namespace {

bool built_with_cuda() {
#ifdef HVDEXT_WITH_CUDA
  return true;
#else
  return false;
#endif
}

// A CUDA tensor reached an op: fine in a CUDA build, a clear error otherwise.
bool on_gpu(const torch::Tensor& t, const char* op) {
  if (!t.is_cuda()) return false;
  TORCH_CHECK(built_with_cuda(), op, ": horovod_ext was built without CUDA (no nvcc, or a CPU build of torch, when "
              "it was installed); reinstall it where both are present, or pass CPU tensors");
  return true;
}

// The one CPU/GPU dispatch of the ops that have a GPU kernel: a CUDA tensor runs `gpu` (HVDEXT_GPU(body): a lambda
// in a CUDA build, nothing otherwise, where on_gpu raises a clear error), a CPU tensor runs `cpu` with the GIL
// released (the core touches no Python object; libtorch's checks and allocations need no GIL). An op with a GPU
// kernel is its checks, a CPU body and a GPU body.
#ifdef HVDEXT_WITH_CUDA
#define HVDEXT_GPU(...) [&]() __VA_ARGS__
#else
#define HVDEXT_GPU(...) nullptr
#endif

template <class Cpu, class Gpu>
auto dispatch(const torch::Tensor& t, const char* op, Cpu&& cpu, Gpu&& gpu) {
  if constexpr (!std::is_same_v<std::decay_t<Gpu>, std::nullptr_t>) {
    if (on_gpu(t, op)) return gpu();
  } else {
    on_gpu(t, op);  // raises for a CUDA tensor in a build without GPU kernels
  }
  pybind11::gil_scoped_release release;
  return cpu();
}

[[maybe_unused]] const float* cuda_float_data(const torch::Tensor& t, const char* what, const torch::Tensor& like) {
  TORCH_CHECK(t.is_cuda() && t.device() == like.device(), what, " must be on ", like.device(), ", got ", t.device());
  TORCH_CHECK(t.scalar_type() == torch::kFloat32, what, " must be float32, got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), what, " must be contiguous");
  return t.data_ptr<float>();
}

[[maybe_unused]] torch::Tensor device_bytes(int64_t bytes, const torch::Tensor& like) {
  return torch::empty({bytes}, like.options().dtype(torch::kUInt8));
}

[[maybe_unused]] void* as_stream(int64_t stream) { return reinterpret_cast<void*>(stream); }

const float* cpu_float_data(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu(), what, " must be a CPU tensor, got ", t.device());
  TORCH_CHECK(t.scalar_type() == torch::kFloat32, what, " must be float32, got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), what, " must be contiguous");
  return t.data_ptr<float>();
}

hvdext::Packing to_packing(int64_t packing) {
  TORCH_CHECK(packing == 0 || packing == 1, "packing must be 0 (2bit) or 1 (base3), got ", packing);
  return static_cast<hvdext::Packing>(packing);
}

// A coded payload of the core (`code` runs with the GIL released) as a uint8 tensor.
template <class Code>
torch::Tensor coded_payload(Code&& code) {
  std::vector<uint8_t> bytes;
  {
    pybind11::gil_scoped_release release;
    bytes = code();
  }
  auto out = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  if (!bytes.empty()) std::memcpy(out.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  return out;
}

std::tuple<double, double> ternary_local_scale(const torch::Tensor& g, double clip, int64_t stream) {
  return dispatch(g, "ternary_local_scale", [&]() -> std::tuple<double, double> {
    const hvdext::TernaryScale s = hvdext::ternary_local_scale(cpu_float_data(g, "gradient"), g.numel(), clip);
    return {s.threshold, s.scale};
  }, HVDEXT_GPU(-> std::tuple<double, double> {
    const float* data = cuda_float_data(g, "gradient", g);
    auto scratch = device_bytes(hvdext::cuda::ternary_scale_workspace_bytes(g.numel()), g);
    auto out = torch::empty({2}, g.options());
    hvdext::cuda::ternary_local_scale(data, g.numel(), clip, out.data_ptr<float>(), scratch.data_ptr(),
                                      as_stream(stream));
    const auto host = out.cpu();
    return {host[0].item<float>(), host[1].item<float>()};
  }));
}

torch::Tensor ternary_encode(const torch::Tensor& g, double threshold, double scale, uint64_t seed, uint32_t step,
                             uint32_t tensor, uint32_t rank, int64_t packing, int64_t stream) {
  const hvdext::Packing p = to_packing(packing);
  const hvdext::RandomKey key{seed, step, tensor, rank};
  return dispatch(g, "ternary_encode", [&] {
    const float* data = cpu_float_data(g, "gradient");
    auto payload = torch::empty({hvdext::ternary_payload_bytes(g.numel(), p)}, torch::kUInt8);
    hvdext::ternary_encode(data, g.numel(), static_cast<float>(threshold), static_cast<float>(scale), key, p,
                           payload.data_ptr<uint8_t>());
    return payload;
  }, HVDEXT_GPU({
    auto payload = device_bytes(hvdext::ternary_payload_bytes(g.numel(), p), g);
    hvdext::cuda::ternary_encode(cuda_float_data(g, "gradient", g), g.numel(), static_cast<float>(threshold),
                                 static_cast<float>(scale), key, p, payload.data_ptr<uint8_t>(), as_stream(stream));
    return payload;
  }));
}

int64_t ternary_decode_average(const torch::Tensor& gathered, int64_t nranks, int64_t n, int64_t packing,
                               double divisor, torch::Tensor& out, int64_t stream) {
  const hvdext::Packing p = to_packing(packing);
  TORCH_CHECK(gathered.scalar_type() == torch::kUInt8 && gathered.is_contiguous(),
              "gathered payloads must be a contiguous uint8 tensor");
  TORCH_CHECK(gathered.numel() == nranks * hvdext::ternary_payload_bytes(n, p), "gathered payloads hold ",
              gathered.numel(), " bytes, expected ", nranks, " x ", hvdext::ternary_payload_bytes(n, p));
  TORCH_CHECK(out.numel() == n, "out holds ", out.numel(), " elements, expected ", n);
  return dispatch(gathered, "ternary_decode_average", [&]() -> int64_t {
    float* o = const_cast<float*>(cpu_float_data(out, "out"));
    return hvdext::ternary_decode_average(gathered.data_ptr<uint8_t>(), static_cast<int>(nranks), n, p,
                                          static_cast<float>(divisor), o);
  }, HVDEXT_GPU(-> int64_t {
    auto flags = torch::empty({2}, gathered.options().dtype(torch::kInt32));
    hvdext::cuda::ternary_decode_average(gathered.data_ptr<uint8_t>(), static_cast<int>(nranks), n, p,
                                         static_cast<float>(divisor),
                                         const_cast<float*>(cuda_float_data(out, "out", gathered)),
                                         flags.data_ptr<int32_t>(), as_stream(stream));
    return flags.cpu()[0].item<int32_t>();
  }));
}

uint8_t* cpu_bytes(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kUInt8 && t.is_contiguous(), what,
              " must be a contiguous CPU uint8 tensor");
  return t.data_ptr<uint8_t>();
}

void ternary_encode_codes(const torch::Tensor& g, double threshold, double scale, uint64_t seed, uint32_t step,
                          uint32_t tensor, uint32_t rank, torch::Tensor& codes) {
  const float* data = cpu_float_data(g, "gradient");
  TORCH_CHECK(codes.numel() == g.numel(), "codes holds ", codes.numel(), " bytes, expected ", g.numel());
  uint8_t* out = cpu_bytes(codes, "codes");
  const hvdext::RandomKey key{seed, step, tensor, rank};
  pybind11::gil_scoped_release release;
  hvdext::ternary_encode_codes(data, g.numel(), static_cast<float>(threshold), static_cast<float>(scale), key, out);
}

void normal_fill(torch::Tensor& out, uint64_t seed, uint32_t step, uint32_t tensor, int64_t stream) {
  TORCH_CHECK(out.scalar_type() == torch::kFloat32 && out.is_contiguous(), "out must be a contiguous float32 tensor");
  const hvdext::RandomKey key{seed, step, tensor, 0};
  dispatch(out, "normal_fill", [&] { hvdext::normal_fill(key, out.numel(), out.data_ptr<float>()); },
           HVDEXT_GPU({ hvdext::cuda::normal_fill(key, out.numel(), out.data_ptr<float>(), as_stream(stream)); }));
}

void ternary_pack_codes(const torch::Tensor& codes, int64_t packing, torch::Tensor& out) {
  const hvdext::Packing p = to_packing(packing);
  TORCH_CHECK(out.numel() == hvdext::ternary_packed_bytes(codes.numel(), p), "out holds ", out.numel(), " bytes");
  // the packer reads up to 8 bytes past the codes' end: pad a copy where the codes are not followed by slack
  auto padded = torch::zeros({codes.numel() + 8}, torch::kUInt8);
  padded.narrow(0, 0, codes.numel()).copy_(codes);
  const uint8_t* in = padded.data_ptr<uint8_t>();
  uint8_t* o = cpu_bytes(out, "out");
  pybind11::gil_scoped_release release;
  hvdext::ternary_pack_codes(in, codes.numel(), p, o);
}

torch::Tensor ternary_sum_reencode(const torch::Tensor& received, int64_t nranks, int64_t count, int64_t packing,
                                   int64_t bits) {
  const hvdext::Packing p = to_packing(packing);
  TORCH_CHECK(received.numel() == nranks * hvdext::ternary_packed_bytes(count, p), "received holds ",
              received.numel(), " bytes, expected ", nranks, " x ", hvdext::ternary_packed_bytes(count, p));
  const uint8_t* in = cpu_bytes(received, "received");
  auto stream = torch::empty({hvdext::two_phase_stream_bytes(count, static_cast<int>(bits))}, torch::kUInt8);
  uint8_t* o = stream.data_ptr<uint8_t>();
  {
    pybind11::gil_scoped_release release;
    hvdext::ternary_sum_reencode(in, static_cast<int>(nranks), count, p, static_cast<int>(bits), o);
  }
  return stream;
}

void two_phase_decode(const torch::Tensor& stream, int64_t first, int64_t count, int64_t nranks, int64_t bits,
                      double scale, double divisor, torch::Tensor& out) {
  const uint8_t* in = cpu_bytes(stream, "stream");
  TORCH_CHECK(stream.numel() >= hvdext::two_phase_stream_bytes(first + count, static_cast<int>(bits)),
              "stream holds ", stream.numel(), " bytes, too few for elements up to ", first + count);
  TORCH_CHECK(out.numel() == count, "out holds ", out.numel(), " elements, expected ", count);
  float* o = const_cast<float*>(cpu_float_data(out, "out"));
  pybind11::gil_scoped_release release;
  hvdext::two_phase_decode(in, first, count, static_cast<int>(nranks), static_cast<int>(bits),
                           static_cast<float>(scale), static_cast<float>(divisor), o);
}

hvdext::ValueType to_value_type(int64_t value_type, bool ternary = false) {
  TORCH_CHECK(value_type == 0 || value_type == 1 || (ternary && value_type == 2),
              "value_type must be 0 (fp16) or 1 (fp32)", ternary ? " or 2 (ternary)" : "", ", got ", value_type);
  return static_cast<hvdext::ValueType>(value_type);
}

const int32_t* cpu_int32_data(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kInt32 && t.is_contiguous(), what,
              " must be a contiguous CPU int32 tensor");
  return t.data_ptr<int32_t>();
}

double ef_accumulate(const torch::Tensor& g, torch::Tensor& r, int64_t stream) {
  TORCH_CHECK(g.numel() == r.numel(), "residual holds ", r.numel(), " elements, the gradient ", g.numel());
  return dispatch(g, "ef_accumulate", [&] {
    return hvdext::ef_accumulate(cpu_float_data(g, "gradient"), const_cast<float*>(cpu_float_data(r, "residual")),
                                 g.numel());
  }, HVDEXT_GPU({
    auto scratch = device_bytes(hvdext::cuda::ef_accumulate_workspace_bytes(g.numel()), g);
    auto sumsq = torch::empty({1}, g.options().dtype(torch::kFloat64));
    hvdext::cuda::ef_accumulate(cuda_float_data(g, "gradient", g), const_cast<float*>(cuda_float_data(r, "residual", g)),
                                g.numel(), sumsq.data_ptr<double>(), scratch.data_ptr(), as_stream(stream));
    return sumsq.cpu().item<double>();
  }));
}

torch::Tensor topk_select(const torch::Tensor& x, int64_t k, int64_t stream) {
  return dispatch(x, "topk_select", [&] {
    const float* xd = cpu_float_data(x, "tensor");
    auto out = torch::empty({k}, torch::kInt32);
    hvdext::topk_select(xd, x.numel(), k, out.data_ptr<int32_t>());
    return out;
  }, HVDEXT_GPU({
    const int64_t bytes = hvdext::cuda::topk_workspace_bytes(x.numel(), k);
    auto scratch = device_bytes(bytes, x);
    auto out = torch::empty({k}, x.options().dtype(torch::kInt32));
    hvdext::cuda::topk_select(cuda_float_data(x, "tensor", x), x.numel(), k, out.data_ptr<int32_t>(),
                              scratch.data_ptr(), bytes, as_stream(stream));
    return out;
  }));
}

std::tuple<torch::Tensor, torch::Tensor> topk_select_nested(const torch::Tensor& x, int64_t k1, int64_t k2) {
  const float* xd = cpu_float_data(x, "tensor");
  if (k1 < 1 || k1 > x.numel() || k2 < 1 || k2 > k1) throw std::invalid_argument("nested top-k needs 1 <= k2 <= k1 <= n");
  auto out1 = torch::empty({k1}, torch::kInt32);
  auto out2 = torch::empty({k2}, torch::kInt32);
  {
    pybind11::gil_scoped_release release;
    hvdext::topk_select_nested(xd, x.numel(), k1, k2, out1.data_ptr<int32_t>(), out2.data_ptr<int32_t>());
  }
  return {out1, out2};
}

double sum_squares_at(const torch::Tensor& x, const torch::Tensor& idx) {
  return hvdext::sum_squares_at(cpu_float_data(x, "tensor"), cpu_int32_data(idx, "indices"), idx.numel());
}

torch::Tensor topk_extract(torch::Tensor& r, const torch::Tensor& idx, int64_t value_type, int64_t stream) {
  const hvdext::ValueType t = to_value_type(value_type);
  return dispatch(r, "topk_extract", [&] {
    float* rd = const_cast<float*>(cpu_float_data(r, "residual"));
    const int32_t* id = cpu_int32_data(idx, "indices");
    auto payload = torch::empty({hvdext::topk_payload_bytes(idx.numel(), t)}, torch::kUInt8);
    hvdext::topk_extract(rd, id, idx.numel(), t, payload.data_ptr<uint8_t>());
    return payload;
  }, HVDEXT_GPU({
    TORCH_CHECK(idx.device() == r.device() && idx.scalar_type() == torch::kInt32 && idx.is_contiguous(),
                "indices must be a contiguous int32 tensor on ", r.device());
    auto payload = device_bytes(hvdext::topk_payload_bytes(idx.numel(), t), r);
    hvdext::cuda::topk_extract(const_cast<float*>(cuda_float_data(r, "residual", r)), idx.data_ptr<int32_t>(),
                               idx.numel(), t, payload.data_ptr<uint8_t>(), as_stream(stream));
    return payload;
  }));
}

int64_t topk_decode_average(const torch::Tensor& gathered, int64_t nranks, int64_t k, int64_t n, int64_t value_type,
                            double divisor, torch::Tensor& out, int64_t stream) {
  const hvdext::ValueType t = to_value_type(value_type);
  TORCH_CHECK(gathered.scalar_type() == torch::kUInt8 && gathered.is_contiguous(),
              "gathered payloads must be a contiguous uint8 tensor");
  TORCH_CHECK(gathered.numel() == nranks * hvdext::topk_payload_bytes(k, t), "gathered payloads hold ",
              gathered.numel(), " bytes, expected ", nranks, " x ", hvdext::topk_payload_bytes(k, t));
  TORCH_CHECK(out.numel() == n, "out holds ", out.numel(), " elements, expected ", n);
  return dispatch(gathered, "topk_decode_average", [&]() -> int64_t {
    float* o = const_cast<float*>(cpu_float_data(out, "out"));
    return hvdext::topk_decode_average(gathered.data_ptr<uint8_t>(), static_cast<int>(nranks), k, n, t,
                                       static_cast<float>(divisor), o);
  }, HVDEXT_GPU(-> int64_t {
    TORCH_CHECK(t != hvdext::ValueType::kTernary, "topk_decode_average on CUDA takes fp16 or fp32 values");
    auto flag = torch::empty({1}, gathered.options().dtype(torch::kInt32));
    return hvdext::cuda::topk_decode_average(gathered.data_ptr<uint8_t>(), static_cast<int>(nranks), k, n, t,
                                             static_cast<float>(divisor),
                                             const_cast<float*>(cuda_float_data(out, "out", gathered)),
                                             flag.data_ptr<int32_t>(), as_stream(stream));
  }));
}

// ------------------------------------------------------------------ entropy-coded payloads (CPU: coding is serial)

torch::Tensor ternary_encode_entropy(const torch::Tensor& g, double threshold, double scale, uint64_t seed,
                                     uint32_t step, uint32_t tensor, uint32_t rank) {
  const float* data = cpu_float_data(g, "gradient");
  const hvdext::RandomKey key{seed, step, tensor, rank};
  return coded_payload([&] {
    return hvdext::ternary_encode_entropy(data, g.numel(), static_cast<float>(threshold), static_cast<float>(scale),
                                          key);
  });
}

torch::Tensor ternary_codes_encode_entropy(const torch::Tensor& codes, double scale) {
  const uint8_t* in = cpu_bytes(codes, "codes");
  return coded_payload(
      [&] { return hvdext::ternary_codes_encode_entropy(in, codes.numel(), static_cast<float>(scale)); });
}

// The CPU float32 output of n elements a decoder writes.
float* cpu_out(torch::Tensor& out, int64_t n) {
  TORCH_CHECK(out.numel() == n, "out holds ", out.numel(), " elements, expected ", n);
  return const_cast<float*>(cpu_float_data(out, "out"));
}

int64_t ternary_decode_average_entropy(const torch::Tensor& gathered, int64_t nranks, int64_t n, double divisor,
                                       torch::Tensor& out) {
  const uint8_t* in = cpu_bytes(gathered, "gathered payloads");
  float* o = cpu_out(out, n);
  pybind11::gil_scoped_release release;
  return hvdext::ternary_decode_average_entropy(in, gathered.numel(), static_cast<int>(nranks), n,
                                                static_cast<float>(divisor), o);
}

std::tuple<torch::Tensor, int64_t> ternary_entropy_to_packed(const torch::Tensor& received, int64_t nranks,
                                                             int64_t count, int64_t packing) {
  const hvdext::Packing p = to_packing(packing);
  const uint8_t* in = cpu_bytes(received, "received");
  auto out = torch::empty({nranks * hvdext::ternary_packed_bytes(count, p)}, torch::kUInt8);
  uint8_t* o = out.data_ptr<uint8_t>();
  int bad;
  {
    pybind11::gil_scoped_release release;
    bad = hvdext::ternary_entropy_to_packed(in, received.numel(), static_cast<int>(nranks), count, p, o);
  }
  return {out, bad};
}

torch::Tensor two_phase_levels_encode(const torch::Tensor& stream, int64_t count, int64_t nranks, int64_t bits,
                                      int64_t bad_rank) {
  const uint8_t* in = cpu_bytes(stream, "stream");
  TORCH_CHECK(stream.numel() == hvdext::two_phase_stream_bytes(count, static_cast<int>(bits)), "stream holds ",
              stream.numel(), " bytes, expected ", hvdext::two_phase_stream_bytes(count, static_cast<int>(bits)));
  return coded_payload([&] {
    return hvdext::two_phase_levels_encode(in, count, static_cast<int>(nranks), static_cast<int>(bits),
                                           static_cast<int>(bad_rank));
  });
}

torch::Tensor two_phase_levels_decode(const torch::Tensor& gathered, const std::vector<int64_t>& counts,
                                      int64_t bits) {
  const uint8_t* in = cpu_bytes(gathered, "gathered streams");
  int64_t total = 0;
  for (int64_t c : counts) total += hvdext::two_phase_stream_bytes(c, static_cast<int>(bits));
  auto out = torch::empty({total}, torch::kUInt8);
  uint8_t* o = out.data_ptr<uint8_t>();
  pybind11::gil_scoped_release release;
  hvdext::two_phase_levels_decode(in, gathered.numel(), counts.data(), static_cast<int>(counts.size()),
                                  static_cast<int>(bits), o);
  return out;
}

torch::Tensor topk_extract_coded(torch::Tensor& r, const torch::Tensor& idx, int64_t value_type) {
  const hvdext::ValueType t = to_value_type(value_type, true);
  float* rd = const_cast<float*>(cpu_float_data(r, "residual"));
  const int32_t* id = cpu_int32_data(idx, "indices");
  return coded_payload([&] { return hvdext::topk_extract_coded(rd, id, idx.numel(), r.numel(), t); });
}

void topk_decode_average_coded(const torch::Tensor& gathered, int64_t nranks, int64_t n, double divisor,
                               torch::Tensor& out) {
  const uint8_t* g = cpu_bytes(gathered, "gathered payloads");
  float* o = cpu_out(out, n);
  pybind11::gil_scoped_release release;
  hvdext::topk_decode_average_coded(g, gathered.numel(), static_cast<int>(nranks), n, static_cast<float>(divisor),
                                    o);
}

// A bucket's top-k payloads in one call (cpp/src/bucket.cpp, cuda.h topk_encode_bucket): g_ef, one float32 tensor
// per tensor (overwritten with its remainder); g, the gradients added into g_ef first (error feedback), or empty.
// coded: "delta" packing (on the CPU), else "int32" (on the CPU, or enqueued on `stream` for CUDA tensors).
std::vector<torch::Tensor> topk_encode_bucket(const std::vector<torch::Tensor>& g, const std::vector<torch::Tensor>& g_ef,
                                              const std::vector<int64_t>& ks, int64_t value_type, bool coded,
                                              int64_t stream) {
  const hvdext::ValueType t = to_value_type(value_type, coded);
  const size_t m = g_ef.size();
  if (ks.size() != m || (!g.empty() && g.size() != m))
    throw std::invalid_argument("topk_encode_bucket: one k (and one gradient, where given) per tensor");
  std::vector<int64_t> numels;
  for (size_t j = 0; j < m; ++j) {
    numels.push_back(g_ef[j].numel());
    if (!g.empty())
      TORCH_CHECK(g[j].numel() == g_ef[j].numel(), "residual holds ", g_ef[j].numel(), " elements, the gradient ",
                  g[j].numel());
  }
  std::vector<torch::Tensor> payloads;
  if (m == 0) return payloads;
  const int count = static_cast<int>(m);
  return dispatch(g_ef[0], "topk_encode_bucket", [&] {
    std::vector<const float*> g_data;
    std::vector<float*> ef_data;
    for (size_t j = 0; j < m; ++j) {
      ef_data.push_back(const_cast<float*>(cpu_float_data(g_ef[j], "g_ef")));
      if (!g.empty()) g_data.push_back(cpu_float_data(g[j], "gradient"));
    }
    const float* const* grads = g.empty() ? nullptr : g_data.data();
    if (coded) {
      for (auto& bytes : hvdext::topk_encode_coded_bucket(grads, ef_data.data(), numels.data(), ks.data(), count, t)) {
        auto payload = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
        if (!bytes.empty()) std::memcpy(payload.data_ptr<uint8_t>(), bytes.data(), bytes.size());
        payloads.push_back(payload);
      }
      return payloads;
    }
    std::vector<uint8_t*> out;
    for (size_t j = 0; j < m; ++j) {
      payloads.push_back(torch::empty({hvdext::topk_payload_bytes(ks[j], t)}, torch::kUInt8));
      out.push_back(payloads.back().data_ptr<uint8_t>());
    }
    hvdext::topk_encode_int32_bucket(grads, ef_data.data(), numels.data(), ks.data(), count, t, out.data());
    return payloads;
  }, HVDEXT_GPU({
    TORCH_CHECK(!coded, "topk_encode_bucket: \"delta\" payloads are coded on the host; pass CPU tensors");
    const torch::Tensor& like = g_ef[0];
    std::vector<const float*> g_data;
    std::vector<float*> ef_data;
    std::vector<int32_t*> idx_data;
    std::vector<uint8_t*> out;
    std::vector<torch::Tensor> indices;
    for (size_t j = 0; j < m; ++j) {
      ef_data.push_back(const_cast<float*>(cuda_float_data(g_ef[j], "g_ef", like)));
      if (!g.empty()) g_data.push_back(cuda_float_data(g[j], "gradient", like));
      indices.push_back(torch::empty({ks[j]}, like.options().dtype(torch::kInt32)));
      idx_data.push_back(indices.back().data_ptr<int32_t>());
      payloads.push_back(device_bytes(hvdext::topk_payload_bytes(ks[j], t), like));
      out.push_back(payloads.back().data_ptr<uint8_t>());
    }
    const int64_t bytes = hvdext::cuda::topk_bucket_workspace_bytes(numels.data(), ks.data(), count);
    auto scratch = device_bytes(bytes, like);
    auto sumsq = torch::empty({static_cast<int64_t>(m)}, like.options().dtype(torch::kFloat64));
    hvdext::cuda::topk_encode_bucket(g.empty() ? nullptr : g_data.data(), ef_data.data(), numels.data(), ks.data(),
                                     count, t, idx_data.data(), out.data(), sumsq.data_ptr<double>(),
                                     scratch.data_ptr(), bytes, as_stream(stream));
    return payloads;
  }));
}

// A bucket's allgather (compression/buckets.py) decoded in one call: codec "topk_coded" or "ternary" (packing);
// outs: one CPU float32 tensor per tensor of the bucket. Returns each tensor's decoder flag, error message, and
// whether its average is finite (checked for "topk_coded"; true for "ternary", whose flag covers NaN/Inf).
std::tuple<std::vector<int64_t>, std::vector<std::string>, std::vector<bool>> decode_bucket(
    const std::string& codec, const torch::Tensor& result, int64_t nranks, int64_t header_bytes,
    const std::vector<int64_t>& numels, int64_t packing, double divisor, std::vector<torch::Tensor> outs) {
  if (outs.size() != numels.size()) throw std::invalid_argument("decode_bucket: one output per tensor");
  const uint8_t* in = cpu_bytes(result, "bucket allgather");
  std::vector<float*> out_data;
  for (size_t j = 0; j < outs.size(); ++j) out_data.push_back(cpu_out(outs[j], numels[j]));
  std::vector<hvdext::SegmentDecoded> decoded;
  {
    pybind11::gil_scoped_release release;
    const int m = static_cast<int>(numels.size());
    if (codec == "topk_coded") {
      decoded = hvdext::topk_decode_average_coded_bucket(in, result.numel(), static_cast<int>(nranks), m,
                                                         header_bytes, numels.data(), static_cast<float>(divisor),
                                                         out_data.data());
    } else if (codec == "ternary") {
      if (packing < 0 || packing > 2) throw std::invalid_argument("decode_bucket: packing must be 0, 1 or 2");
      decoded = hvdext::ternary_decode_average_bucket(in, result.numel(), static_cast<int>(nranks), m, header_bytes,
                                                      numels.data(), static_cast<int>(packing),
                                                      static_cast<float>(divisor), out_data.data());
    } else {
      throw std::invalid_argument("decode_bucket: codec must be 'topk_coded' or 'ternary', got '" + codec + "'");
    }
  }
  std::vector<int64_t> flags;
  std::vector<std::string> errors;
  std::vector<bool> finite;
  for (const auto& d : decoded) {
    flags.push_back(d.flag);
    errors.push_back(d.error);
    finite.push_back(d.finite);
  }
  return {flags, errors, finite};
}

// sparse_reduce: the step's tensors (CPU, contiguous float32) as the segments of one index space.
std::vector<hvdext::Segment> segments_of(const std::vector<torch::Tensor>& tensors, const char* what) {
  std::vector<hvdext::Segment> segs;
  for (const torch::Tensor& t : tensors) segs.push_back({const_cast<float*>(cpu_float_data(t, what)), t.numel()});
  return segs;
}

std::tuple<torch::Tensor, std::vector<int64_t>> topk_encode_regions(const std::vector<torch::Tensor>& g_ef,
                                                                   const torch::Tensor& positions,
                                                                   const std::vector<int64_t>& bounds,
                                                                   int64_t value_type) {
  const hvdext::ValueType t = to_value_type(value_type, false);
  TORCH_CHECK(bounds.size() >= 2, "bounds needs at least one region");
  const std::vector<hvdext::Segment> segs = segments_of(g_ef, "g_ef");
  const int32_t* pos = cpu_int32_data(positions, "positions");
  std::vector<int64_t> sizes(bounds.size() - 1);
  torch::Tensor payload = coded_payload([&] {
    return hvdext::topk_encode_regions(segs.data(), static_cast<int>(segs.size()), pos, positions.numel(),
                                       bounds.data(), static_cast<int>(sizes.size()), t, sizes.data());
  });
  return {payload, sizes};
}

torch::Tensor topk_reduce_region(const torch::Tensor& received, int64_t nranks, int64_t n, int64_t q,
                                 int64_t value_type) {
  const hvdext::ValueType t = to_value_type(value_type, false);
  const uint8_t* in = cpu_bytes(received, "received");
  return coded_payload([&] {
    return hvdext::topk_reduce_region(in, received.numel(), static_cast<int>(nranks), n, q, t);
  });
}

void topk_decode_regions_into(const torch::Tensor& gathered, const std::vector<int64_t>& bounds, double divisor,
                              const std::vector<torch::Tensor>& out) {
  TORCH_CHECK(bounds.size() >= 2, "bounds needs at least one region");
  const uint8_t* g = cpu_bytes(gathered, "gathered payloads");
  const std::vector<hvdext::Segment> segs = segments_of(out, "out");
  pybind11::gil_scoped_release release;
  hvdext::topk_decode_regions_into(g, gathered.numel(), static_cast<int>(bounds.size() - 1), bounds.data(),
                                   static_cast<float>(divisor), segs.data(), static_cast<int>(segs.size()));
}

void topk_keep_applied(const std::vector<torch::Tensor>& g_ef, const std::vector<torch::Tensor>& average,
                       const torch::Tensor& positions, int64_t value_type) {
  const hvdext::ValueType t = to_value_type(value_type, false);
  const std::vector<hvdext::Segment> r = segments_of(g_ef, "g_ef"), avg = segments_of(average, "average");
  TORCH_CHECK(r.size() == avg.size(), "g_ef and average hold different numbers of tensors");
  const int32_t* pos = cpu_int32_data(positions, "positions");
  pybind11::gil_scoped_release release;
  hvdext::topk_keep_applied(r.data(), avg.data(), static_cast<int>(r.size()), pos, positions.numel(), t);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "horovod-ext native ops (PyTorch binding of cpp/)";
  m.def("built_with_cuda", &built_with_cuda, "whether the CUDA kernels were built");
  m.def("ternary_local_scale", &ternary_local_scale, "(threshold, scale) of one rank's gradient", py::arg("g"),
        py::arg("clip"), py::arg("stream") = 0);
  m.def("ternary_encode", &ternary_encode, "clip + ternarize + pack into a uint8 payload", py::arg("g"),
        py::arg("threshold"), py::arg("scale"), py::arg("seed"), py::arg("step"), py::arg("tensor"), py::arg("rank"),
        py::arg("packing"), py::arg("stream") = 0);
  m.def("ternary_decode_average", &ternary_decode_average, py::arg("gathered"), py::arg("nranks"), py::arg("n"),
        py::arg("packing"), py::arg("divisor"), py::arg("out"), py::arg("stream") = 0,
        "decode N gathered payloads and average them into out; returns -1 or the first rank with a NaN/Inf gradient");
  m.def("normal_fill", &normal_fill, "standard normals of the counter-based generator (hvdext/random.h), in place");
  m.def("ternary_encode_codes", &ternary_encode_codes, "the unpacked codes of a gradient (same draws as encode)");
  m.def("ternary_pack_codes", &ternary_pack_codes, "pack codes into out");
  m.def("ternary_sum_reencode", &ternary_sum_reencode, "sum N packed code streams exactly, re-encode at b bits");
  m.def("two_phase_decode", &two_phase_decode, "decode elements of a level stream, scaled, into out");
  m.def("ef_accumulate", &ef_accumulate, "r += g; returns sum(r^2)", py::arg("g"), py::arg("r"),
        py::arg("stream") = 0);
  m.def("topk_select", &topk_select, "indices (ascending) of the k largest |x|, ties to the lower index",
        py::arg("x"), py::arg("k"), py::arg("stream") = 0);
  m.def("topk_select_nested", &topk_select_nested, "(top k1, top k2) of |x|, both ascending (k2 <= k1)");
  m.def("sum_squares_at", &sum_squares_at, "sum of x[idx]^2 in float64");
  m.def("topk_extract", &topk_extract, "payload of the selected residual elements; leaves r = g_ef - sent there",
        py::arg("r"), py::arg("idx"), py::arg("value_type"), py::arg("stream") = 0);
  m.def("topk_decode_average", &topk_decode_average, "scatter-add N payloads / divisor; -1 or a rank with bad indices",
        py::arg("gathered"), py::arg("nranks"), py::arg("k"), py::arg("n"), py::arg("value_type"), py::arg("divisor"),
        py::arg("out"), py::arg("stream") = 0);
  m.def("ternary_encode_entropy", &ternary_encode_entropy, "clip + ternarize + entropy-code (variable size)");
  m.def("ternary_codes_encode_entropy", &ternary_codes_encode_entropy, "entropy-code given codes under a scale");
  m.def("ternary_decode_average_entropy", &ternary_decode_average_entropy,
        "average N entropy-coded payloads; -1 or the first rank whose scale is not finite");
  m.def("ternary_entropy_to_packed", &ternary_entropy_to_packed, "(packed codes, -1 or a corrupted chunk's rank)");
  m.def("two_phase_levels_encode", &two_phase_levels_encode, "entropy-code a level stream (or a corruption flag)");
  m.def("two_phase_levels_decode", &two_phase_levels_decode, "the fixed level streams of N coded ones");
  m.def("topk_extract_coded", &topk_extract_coded, "the delta payload; leaves r = g_ef - sent there");
  m.def("topk_decode_average_coded", &topk_decode_average_coded, "scatter-add N delta payloads / divisor");
  m.def("topk_encode_bucket", &topk_encode_bucket,
        "a bucket's top-k payloads in one call (g added into g_ef first where given); g_ef keeps the remainder",
        py::arg("g"), py::arg("g_ef"), py::arg("ks"), py::arg("value_type"), py::arg("coded"), py::arg("stream") = 0);
  m.def("decode_bucket", &decode_bucket, "a bucket's allgather decoded per tensor in one call: (flags, errors, finite)",
        py::arg("codec"), py::arg("result"), py::arg("nranks"), py::arg("header_bytes"), py::arg("numels"),
        py::arg("packing"), py::arg("divisor"), py::arg("outs"));
  m.def("topk_encode_regions", &topk_encode_regions, "sparse_reduce: one delta payload per region");
  m.def("topk_reduce_region", &topk_reduce_region, "sparse_reduce's owner: sum, keep the top q, code");
  m.def("topk_decode_regions_into", &topk_decode_regions_into, "sparse_reduce: region payloads at their offsets");
  m.def("topk_keep_applied", &topk_keep_applied, "sparse_reduce: g_ef - sent where applied, in place");
}
