// PyTorch binding of the horovod-ext op library: converts tensors and calls the framework-free core, nothing else.
#include <torch/extension.h>

#include <tuple>

#include "hvdext/ternary.h"

namespace {

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

std::tuple<double, double> ternary_local_scale(const torch::Tensor& g, double clip) {
  const float* data = cpu_float_data(g, "gradient");
  hvdext::TernaryScale s;
  {
    pybind11::gil_scoped_release release;
    s = hvdext::ternary_local_scale(data, g.numel(), clip);
  }
  return {s.threshold, s.scale};
}

std::tuple<double, double, double, bool> gradient_stats(const torch::Tensor& g) {
  const float* data = cpu_float_data(g, "gradient");
  hvdext::GradientStats st;
  {
    pybind11::gil_scoped_release release;
    st = hvdext::gradient_stats(data, g.numel());
  }
  return {st.sum, st.sumsq, st.maxabs, st.finite};
}

int64_t ternary_payload_bytes(int64_t n, int64_t packing) { return hvdext::ternary_payload_bytes(n, to_packing(packing)); }

torch::Tensor ternary_encode(const torch::Tensor& g, double threshold, double scale, uint64_t seed, uint32_t step,
                             uint32_t tensor, uint32_t rank, int64_t packing) {
  const float* data = cpu_float_data(g, "gradient");
  const hvdext::Packing p = to_packing(packing);
  auto payload = torch::empty({hvdext::ternary_payload_bytes(g.numel(), p)}, torch::kUInt8);
  const hvdext::RandomKey key{seed, step, tensor, rank};
  {
    pybind11::gil_scoped_release release;
    hvdext::ternary_encode(data, g.numel(), static_cast<float>(threshold), static_cast<float>(scale), key, p,
                           payload.data_ptr<uint8_t>());
  }
  return payload;
}

int64_t ternary_decode_average(const torch::Tensor& gathered, int64_t nranks, int64_t n, int64_t packing,
                               double divisor, torch::Tensor& out) {
  const hvdext::Packing p = to_packing(packing);
  TORCH_CHECK(gathered.device().is_cpu() && gathered.scalar_type() == torch::kUInt8 && gathered.is_contiguous(),
              "gathered payloads must be a contiguous CPU uint8 tensor");
  TORCH_CHECK(gathered.numel() == nranks * hvdext::ternary_payload_bytes(n, p), "gathered payloads hold ",
              gathered.numel(), " bytes, expected ", nranks, " x ", hvdext::ternary_payload_bytes(n, p));
  float* o = const_cast<float*>(cpu_float_data(out, "out"));
  TORCH_CHECK(out.numel() == n, "out holds ", out.numel(), " elements, expected ", n);
  int bad;
  {
    pybind11::gil_scoped_release release;
    bad = hvdext::ternary_decode_average(gathered.data_ptr<uint8_t>(), static_cast<int>(nranks), n, p,
                                         static_cast<float>(divisor), o);
  }
  return bad;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "horovod-ext native ops (PyTorch binding of cpp/)";
  m.def("gradient_stats", &gradient_stats, "(sum, sumsq, maxabs, finite) of a float32 tensor");
  m.def("ternary_local_scale", &ternary_local_scale, "(threshold, scale) of one rank's gradient");
  m.def("ternary_payload_bytes", &ternary_payload_bytes);
  m.def("ternary_encode", &ternary_encode, "clip + ternarize + pack into a uint8 payload");
  m.def("ternary_decode_average", &ternary_decode_average,
        "decode N gathered payloads and average them into out; returns -1 or the first rank with a NaN/Inf gradient");
}
