// TensorFlow binding of the horovod-ext op library: registers ops that convert tensors and call the framework-free
// core in cpp/src (the same code as the PyTorch binding), nothing else. Static settings are attrs; what changes per
// step (the step counter, the seed, scales) are inputs, so the ops are graph-safe.
#include <cstring>
#include <limits>
#include <vector>

#include "hvdext/coding.h"
#include "hvdext/random.h"

#include "hvdext/ternary.h"
#include "hvdext/topk.h"
#include "hvdext/two_phase.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf = tensorflow;
using tf::shape_inference::InferenceContext;

namespace {

tf::Status ScalarPair(InferenceContext* c) {
  c->set_output(0, c->Scalar());
  c->set_output(1, c->Scalar());
  return tf::OkStatus();
}

// Output 0 is a vector of the "count" attr's length; any further output is a scalar (a flag).
tf::Status CountVector(InferenceContext* c) {
  tf::int64 count;
  TF_RETURN_IF_ERROR(c->GetAttr("count", &count));
  c->set_output(0, c->Vector(count));
  for (int i = 1; i < c->num_outputs(); ++i) c->set_output(i, c->Scalar());
  return tf::OkStatus();
}

// A payload of unknown size, and a residual shaped as input 0.
tf::Status PayloadAndResidual(InferenceContext* c) {
  c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
  c->set_output(1, c->input(0));
  return tf::OkStatus();
}

tf::Status UnknownVector(InferenceContext* c) {
  for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
  return tf::OkStatus();
}

constexpr tf::int64 kMaxInt = std::numeric_limits<tf::int64>::max();
constexpr tf::int64 kMaxRanks = std::numeric_limits<int>::max();

// The one attribute reader of every kernel: each call reads one attr and checks it, and the first failure fails
// the kernel's construction with an error naming the attr and its allowed values (later calls do nothing), e.g.
//   Attrs(c).Int("nranks", &nranks_, 1, kMaxRanks).Float("divisor", &divisor_).Packing(&packing_);
class Attrs {
 public:
  explicit Attrs(tf::OpKernelConstruction* c) : c_(c) {}

  // An integer attr in [lo, hi].
  template <class T>
  Attrs& Int(const char* name, T* out, tf::int64 lo = std::numeric_limits<tf::int64>::min(), tf::int64 hi = kMaxInt) {
    tf::int64 value = 0;
    if (Read(name, &value) && (value < lo || value > hi)) {
      Fail(tf::errors::InvalidArgument(name, " must be in [", lo, ", ", hi, "], got ", value));
    }
    *out = static_cast<T>(value);
    return *this;
  }

  Attrs& Float(const char* name, float* out) {
    Read(name, out);
    return *this;
  }

  Attrs& Packing(hvdext::Packing* out) { return Choice("packing", out, "0 (2bit) or 1 (base3)", 1); }
  Attrs& ValueType(hvdext::ValueType* out) { return Choice("value_type", out, "0 (fp16) or 1 (fp32)", 1); }
  Attrs& CodedValueType(hvdext::ValueType* out) {
    return Choice("value_type", out, "0 (fp16), 1 (fp32) or 2 (ternary)", 2);
  }

 private:
  template <class E>
  Attrs& Choice(const char* name, E* out, const char* allowed, tf::int64 largest) {
    tf::int64 value = 0;
    if (Read(name, &value) && (value < 0 || value > largest)) {
      Fail(tf::errors::InvalidArgument(name, " must be ", allowed, ", got ", value));
    }
    *out = static_cast<E>(value >= 0 && value <= largest ? value : 0);
    return *this;
  }

  template <class T>
  bool Read(const char* name, T* out) {
    if (!ok_) return false;
    const tf::Status status = c_->GetAttr(name, out);
    if (!status.ok()) Fail(status);
    return ok_;
  }

  void Fail(const tf::Status& status) {
    c_->CtxFailure(status);
    ok_ = false;
  }

  tf::OpKernelConstruction* c_;
  bool ok_ = true;
};

// Runs body; an exception of the core (a corrupted payload, a bad argument) fails the op with its message.
template <class Body>
void Guard(tf::OpKernelContext* c, Body body) {
  try {
    body();
  } catch (const std::exception& e) {
    c->CtxFailure(tf::errors::InvalidArgument(e.what()));
  }
}

tf::Status OutputBytes(tf::OpKernelContext* c, int index, const std::vector<uint8_t>& bytes) {
  tf::Tensor* out;
  TF_RETURN_IF_ERROR(c->allocate_output(index, tf::TensorShape({static_cast<tf::int64>(bytes.size())}), &out));
  if (!bytes.empty()) std::memcpy(out->flat<tf::uint8>().data(), bytes.data(), bytes.size());
  return tf::OkStatus();
}

float ScalarFloat(tf::OpKernelContext* c, int index) { return c->input(index).scalar<float>()(); }

hvdext::RandomKey KeyOf(tf::OpKernelContext* c, tf::int64 tensor_key, tf::int64 rank) {
  const tf::int64 seed = c->input(3).scalar<tf::int64>()();
  const tf::int64 step = c->input(4).scalar<tf::int64>()();
  return hvdext::RandomKey{static_cast<uint64_t>(seed), static_cast<uint32_t>(step),
                           static_cast<uint32_t>(tensor_key), static_cast<uint32_t>(rank)};
}

}  // namespace

REGISTER_OP("HvdextTernaryLocalScale")
    .Input("gradient: float")
    .Attr("clip: float")
    .Output("threshold: float")
    .Output("scale: float")
    .SetShapeFn(ScalarPair)
    .Doc("(threshold, scale) of one rank's gradient; clip <= 0 turns clipping off; scale = inf flags NaN/Inf.");

class TernaryLocalScaleOp : public tf::OpKernel {
 public:
  explicit TernaryLocalScaleOp(tf::OpKernelConstruction* c) : OpKernel(c) { Attrs(c).Float("clip", &clip_); }
  void Compute(tf::OpKernelContext* c) override {
    const tf::Tensor& g = c->input(0);
    const hvdext::TernaryScale s = hvdext::ternary_local_scale(g.flat<float>().data(), g.NumElements(), clip_);
    tf::Tensor *threshold, *scale;
    OP_REQUIRES_OK(c, c->allocate_output(0, tf::TensorShape({}), &threshold));
    OP_REQUIRES_OK(c, c->allocate_output(1, tf::TensorShape({}), &scale));
    threshold->scalar<float>()() = s.threshold;
    scale->scalar<float>()() = s.scale;
  }

 private:
  float clip_;
};
REGISTER_KERNEL_BUILDER(Name("HvdextTernaryLocalScale").Device(tf::DEVICE_CPU), TernaryLocalScaleOp);

REGISTER_OP("HvdextTernaryEncode")
    .Input("gradient: float")
    .Input("threshold: float")
    .Input("scale: float")
    .Input("seed: int64")
    .Input("step: int64")
    .Attr("tensor_key: int")
    .Attr("rank: int")
    .Attr("packing: int")
    .Output("payload: uint8")
    .SetShapeFn(UnknownVector)
    .Doc("clip + ternarize + pack one gradient into a payload: float32 scale, then packed codes.");

REGISTER_OP("HvdextTernaryEncodeCodes")
    .Input("gradient: float")
    .Input("threshold: float")
    .Input("scale: float")
    .Input("seed: int64")
    .Input("step: int64")
    .Attr("tensor_key: int")
    .Attr("rank: int")
    .Output("codes: uint8")
    .SetShapeFn(UnknownVector)
    .Doc("the unpacked codes {0, 1: +1, 2: -1} of one gradient, with the same draws as HvdextTernaryEncode.");

template <bool kPacked>
class TernaryEncodeOp : public tf::OpKernel {
 public:
  explicit TernaryEncodeOp(tf::OpKernelConstruction* c) : OpKernel(c) {
    Attrs attrs(c);
    attrs.Int("tensor_key", &tensor_key_, 0, 0xFFFFFFFF).Int("rank", &rank_, 0, kMaxRanks);
    if (kPacked) attrs.Packing(&packing_);
  }
  void Compute(tf::OpKernelContext* c) override {
    const tf::Tensor& g = c->input(0);
    const tf::int64 n = g.NumElements();
    const hvdext::RandomKey key = KeyOf(c, tensor_key_, rank_);
    tf::Tensor* out;
    const tf::int64 bytes = kPacked ? hvdext::ternary_payload_bytes(n, packing_) : n;
    OP_REQUIRES_OK(c, c->allocate_output(0, tf::TensorShape({bytes}), &out));
    if (kPacked) {
      hvdext::ternary_encode(g.flat<float>().data(), n, ScalarFloat(c, 1), ScalarFloat(c, 2), key, packing_,
                             out->flat<tf::uint8>().data());
    } else {
      hvdext::ternary_encode_codes(g.flat<float>().data(), n, ScalarFloat(c, 1), ScalarFloat(c, 2), key,
                                   out->flat<tf::uint8>().data());
    }
  }

 private:
  tf::int64 tensor_key_, rank_;
  hvdext::Packing packing_ = hvdext::Packing::kBase3;
};
REGISTER_KERNEL_BUILDER(Name("HvdextTernaryEncode").Device(tf::DEVICE_CPU), TernaryEncodeOp<true>);
REGISTER_KERNEL_BUILDER(Name("HvdextTernaryEncodeCodes").Device(tf::DEVICE_CPU), TernaryEncodeOp<false>);

REGISTER_OP("HvdextNormal")
    .Input("seed: int64")
    .Input("step: int64")
    .Attr("count: int")
    .Attr("tensor_key: int")
    .Output("values: float")
    .SetShapeFn(CountVector)
    .Doc("count standard normals of the counter-based generator under (seed, step, tensor_key) (hvdext/random.h).");

class NormalOp : public tf::OpKernel {
 public:
  explicit NormalOp(tf::OpKernelConstruction* c) : OpKernel(c) {
    Attrs(c).Int("count", &count_, 0).Int("tensor_key", &tensor_key_, 0, 0xFFFFFFFF);
  }
  void Compute(tf::OpKernelContext* c) override {
    const hvdext::RandomKey key{static_cast<uint64_t>(c->input(0).scalar<tf::int64>()()),
                                static_cast<uint32_t>(c->input(1).scalar<tf::int64>()()),
                                static_cast<uint32_t>(tensor_key_), 0};
    tf::Tensor* out;
    OP_REQUIRES_OK(c, c->allocate_output(0, tf::TensorShape({count_}), &out));
    hvdext::normal_fill(key, count_, out->flat<float>().data());
  }

 private:
  tf::int64 count_, tensor_key_;
};
REGISTER_KERNEL_BUILDER(Name("HvdextNormal").Device(tf::DEVICE_CPU), NormalOp);

REGISTER_OP("HvdextTernaryDecodeAverage")
    .Input("gathered: uint8")
    .Attr("nranks: int")
    .Attr("count: int")
    .Attr("packing: int")
    .Attr("divisor: float")
    .Output("average: float")
    .Output("bad_rank: int32")
    .SetShapeFn(CountVector)
    .Doc("decode N gathered payloads and average them; bad_rank is -1 or the first rank that sent NaN/Inf.");

class TernaryDecodeAverageOp : public tf::OpKernel {
 public:
  explicit TernaryDecodeAverageOp(tf::OpKernelConstruction* c) : OpKernel(c) {
    Attrs(c).Int("nranks", &nranks_, 1, kMaxRanks).Int("count", &count_, 0).Float("divisor", &divisor_).Packing(&packing_);
  }
  void Compute(tf::OpKernelContext* c) override {
    const tf::Tensor& gathered = c->input(0);
    const tf::int64 expected = nranks_ * hvdext::ternary_payload_bytes(count_, packing_);
    OP_REQUIRES(c, gathered.NumElements() == expected,
                tf::errors::InvalidArgument("gathered payloads hold ", gathered.NumElements(), " bytes, expected ",
                                            expected, ": did every rank compress this tensor with the same settings?"));
    tf::Tensor *out, *bad;
    OP_REQUIRES_OK(c, c->allocate_output(0, tf::TensorShape({count_}), &out));
    OP_REQUIRES_OK(c, c->allocate_output(1, tf::TensorShape({}), &bad));
    const int bad_rank = hvdext::ternary_decode_average(gathered.flat<tf::uint8>().data(), static_cast<int>(nranks_),
                                                        count_, packing_, divisor_, out->flat<float>().data());
    if (bad_rank >= 0) out->flat<float>().setConstant(std::numeric_limits<float>::quiet_NaN());
    bad->scalar<tf::int32>()() = bad_rank;
  }

 private:
  tf::int64 nranks_, count_;
  float divisor_;
  hvdext::Packing packing_ = hvdext::Packing::kBase3;
};
REGISTER_KERNEL_BUILDER(Name("HvdextTernaryDecodeAverage").Device(tf::DEVICE_CPU), TernaryDecodeAverageOp);

REGISTER_OP("HvdextTernaryPackCodes")
    .Input("codes: uint8")
    .Attr("packing: int")
    .Output("packed: uint8")
    .SetShapeFn(UnknownVector)
    .Doc("pack codes {0, 1, 2}, 4 ('2bit') or 5 ('base3') per byte.");

class TernaryPackCodesOp : public tf::OpKernel {
 public:
  explicit TernaryPackCodesOp(tf::OpKernelConstruction* c) : OpKernel(c) { Attrs(c).Packing(&packing_); }
  void Compute(tf::OpKernelContext* c) override {
    const tf::Tensor& codes = c->input(0);
    const tf::int64 n = codes.NumElements();
    tf::Tensor padded;  // the packer reads up to 8 bytes past the last code
    OP_REQUIRES_OK(c, c->allocate_temp(tf::DT_UINT8, tf::TensorShape({n + 8}), &padded));
    std::memcpy(padded.flat<tf::uint8>().data(), codes.flat<tf::uint8>().data(), static_cast<size_t>(n));
    std::memset(padded.flat<tf::uint8>().data() + n, 0, 8);
    tf::Tensor* out;
    OP_REQUIRES_OK(c, c->allocate_output(0, tf::TensorShape({hvdext::ternary_packed_bytes(n, packing_)}), &out));
    hvdext::ternary_pack_codes(padded.flat<tf::uint8>().data(), n, packing_, out->flat<tf::uint8>().data());
  }

 private:
  hvdext::Packing packing_ = hvdext::Packing::kBase3;
};
REGISTER_KERNEL_BUILDER(Name("HvdextTernaryPackCodes").Device(tf::DEVICE_CPU), TernaryPackCodesOp);

REGISTER_OP("HvdextTernarySumReencode")
    .Input("received: uint8")
    .Attr("nranks: int")
    .Attr("count: int")
    .Attr("packing: int")
    .Attr("bits: int")
    .Output("stream: uint8")
    .SetShapeFn(UnknownVector)
    .Doc("sum N packed code streams of one chunk exactly and re-encode the levels k + N at `bits` bits.");

class TernarySumReencodeOp : public tf::OpKernel {
 public:
  explicit TernarySumReencodeOp(tf::OpKernelConstruction* c) : OpKernel(c) {
    Attrs(c).Int("nranks", &nranks_, 1, kMaxRanks).Int("count", &count_, 0).Int("bits", &bits_, 1, 32).Packing(&packing_);
  }
  void Compute(tf::OpKernelContext* c) override {
    const tf::Tensor& received = c->input(0);
    OP_REQUIRES(c, received.NumElements() == nranks_ * hvdext::ternary_packed_bytes(count_, packing_),
                tf::errors::InvalidArgument("received ", received.NumElements(), " bytes, expected ",
                                            nranks_ * hvdext::ternary_packed_bytes(count_, packing_)));
    tf::Tensor* out;
    OP_REQUIRES_OK(c, c->allocate_output(0, tf::TensorShape({hvdext::two_phase_stream_bytes(count_, bits_)}), &out));
    hvdext::ternary_sum_reencode(received.flat<tf::uint8>().data(), static_cast<int>(nranks_), count_, packing_,
                                 static_cast<int>(bits_), out->flat<tf::uint8>().data());
  }

 private:
  tf::int64 nranks_, count_, bits_;
  hvdext::Packing packing_ = hvdext::Packing::kBase3;
};
REGISTER_KERNEL_BUILDER(Name("HvdextTernarySumReencode").Device(tf::DEVICE_CPU), TernarySumReencodeOp);

REGISTER_OP("HvdextTwoPhaseDecode")
    .Input("stream: uint8")
    .Input("scale: float")
    .Attr("first: int")
    .Attr("count: int")
    .Attr("nranks: int")
    .Attr("bits: int")
    .Attr("divisor: float")
    .Output("values: float")
    .SetShapeFn(CountVector)
    .Doc("elements [first, first + count) of a level stream as float32(k) * scale / divisor.");

class TwoPhaseDecodeOp : public tf::OpKernel {
 public:
  explicit TwoPhaseDecodeOp(tf::OpKernelConstruction* c) : OpKernel(c) {
    Attrs(c).Int("first", &first_, 0).Int("count", &count_, 0).Int("nranks", &nranks_, 1, kMaxRanks)
        .Int("bits", &bits_, 1, 32).Float("divisor", &divisor_);
  }
  void Compute(tf::OpKernelContext* c) override {
    const tf::Tensor& stream = c->input(0);
    OP_REQUIRES(c, stream.NumElements() >= hvdext::two_phase_stream_bytes(first_ + count_, bits_),
                tf::errors::InvalidArgument("stream holds too few bytes for elements up to ", first_ + count_));
    tf::Tensor* out;
    OP_REQUIRES_OK(c, c->allocate_output(0, tf::TensorShape({count_}), &out));
    hvdext::two_phase_decode(stream.flat<tf::uint8>().data(), first_, count_, static_cast<int>(nranks_),
                             static_cast<int>(bits_), ScalarFloat(c, 1), divisor_, out->flat<float>().data());
  }

 private:
  tf::int64 first_, count_, nranks_, bits_;
  float divisor_;
};
REGISTER_KERNEL_BUILDER(Name("HvdextTwoPhaseDecode").Device(tf::DEVICE_CPU), TwoPhaseDecodeOp);

// ------------------------------------------------------------------------------------------------ top-k
REGISTER_OP("HvdextEfAccumulate")
    .Input("gradient: float")
    .Input("residual: float")
    .Output("g_ef: float")
    .Output("sumsq: double")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      c->set_output(1, c->Scalar());
      return tf::OkStatus();
    })
    .Doc("g_ef = residual + gradient and sum(g_ef^2) (functional: the caller assigns the residual).");

class EfAccumulateOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* c) override {
    const tf::Tensor& g = c->input(0);
    const tf::Tensor& r = c->input(1);
    OP_REQUIRES(c, g.NumElements() == r.NumElements(), tf::errors::InvalidArgument("residual size differs"));
    tf::Tensor *out, *sumsq;
    OP_REQUIRES_OK(c, c->allocate_output(0, g.shape(), &out));
    OP_REQUIRES_OK(c, c->allocate_output(1, tf::TensorShape({}), &sumsq));
    std::memcpy(out->flat<float>().data(), r.flat<float>().data(), sizeof(float) * r.NumElements());
    sumsq->scalar<double>()() = hvdext::ef_accumulate(g.flat<float>().data(), out->flat<float>().data(),
                                                      g.NumElements());
  }
};
REGISTER_KERNEL_BUILDER(Name("HvdextEfAccumulate").Device(tf::DEVICE_CPU), EfAccumulateOp);

REGISTER_OP("HvdextTopkSelect")
    .Input("x: float")
    .Input("k: int32")
    .Output("indices: int32")
    .SetShapeFn(UnknownVector)
    .Doc("indices (ascending) of the k largest |x|, ties to the lower index.");

class TopkSelectOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* c) override {
    const tf::Tensor& x = c->input(0);
    const tf::int64 k = c->input(1).scalar<tf::int32>()();
    OP_REQUIRES(c, k >= 1 && k <= x.NumElements(), tf::errors::InvalidArgument("top-k needs 1 <= k <= n"));
    tf::Tensor* out;
    OP_REQUIRES_OK(c, c->allocate_output(0, tf::TensorShape({k}), &out));
    hvdext::topk_select(x.flat<float>().data(), x.NumElements(), k, out->flat<tf::int32>().data());
  }
};
REGISTER_KERNEL_BUILDER(Name("HvdextTopkSelect").Device(tf::DEVICE_CPU).HostMemory("k"), TopkSelectOp);

REGISTER_OP("HvdextTopkSelectNested")
    .Input("x: float")
    .Input("k1: int32")
    .Input("k2: int32")
    .Output("first: int32")
    .Output("second: int32")
    .SetShapeFn(UnknownVector)
    .Doc("(top k1, top k2) of |x|, both ascending (k2 <= k1): the multi-level recompression.");

class TopkSelectNestedOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* c) override {
    const tf::Tensor& x = c->input(0);
    const tf::int64 k1 = c->input(1).scalar<tf::int32>()();
    const tf::int64 k2 = c->input(2).scalar<tf::int32>()();
    OP_REQUIRES(c, k1 >= 1 && k1 <= x.NumElements() && k2 >= 1 && k2 <= k1,
                tf::errors::InvalidArgument("nested top-k needs 1 <= k2 <= k1 <= n"));
    tf::Tensor *first, *second;
    OP_REQUIRES_OK(c, c->allocate_output(0, tf::TensorShape({k1}), &first));
    OP_REQUIRES_OK(c, c->allocate_output(1, tf::TensorShape({k2}), &second));
    hvdext::topk_select_nested(x.flat<float>().data(), x.NumElements(), k1, k2, first->flat<tf::int32>().data(),
                               second->flat<tf::int32>().data());
  }
};
REGISTER_KERNEL_BUILDER(Name("HvdextTopkSelectNested").Device(tf::DEVICE_CPU).HostMemory("k1").HostMemory("k2"),
                        TopkSelectNestedOp);

REGISTER_OP("HvdextSumSquaresAt")
    .Input("x: float")
    .Input("indices: int32")
    .Output("sumsq: double")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return tf::OkStatus();
    });

class SumSquaresAtOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* c) override {
    tf::Tensor* out;
    OP_REQUIRES_OK(c, c->allocate_output(0, tf::TensorShape({}), &out));
    out->scalar<double>()() = hvdext::sum_squares_at(c->input(0).flat<float>().data(),
                                                     c->input(1).flat<tf::int32>().data(), c->input(1).NumElements());
  }
};
REGISTER_KERNEL_BUILDER(Name("HvdextSumSquaresAt").Device(tf::DEVICE_CPU), SumSquaresAtOp);

REGISTER_OP("HvdextTopkExtract")
    .Input("g_ef: float")
    .Input("indices: int32")
    .Attr("value_type: int")
    .Output("payload: uint8")
    .Output("residual: float")
    .SetShapeFn(PayloadAndResidual)
    .Doc("payload (int32 indices, then fp16/fp32 values) of the selected elements, and g_ef - sent as residual.");

// The residual starts as a copy of g_ef; the payload is the int32 one, or the "delta" one (kCoded).
template <bool kCoded>
class TopkExtractOp : public tf::OpKernel {
 public:
  explicit TopkExtractOp(tf::OpKernelConstruction* c) : OpKernel(c) {
    if (kCoded) {
      Attrs(c).CodedValueType(&type_);
    } else {
      Attrs(c).ValueType(&type_);
    }
  }
  void Compute(tf::OpKernelContext* c) override {
    const tf::Tensor& g = c->input(0);
    const tf::Tensor& idx = c->input(1);
    tf::Tensor* residual;
    OP_REQUIRES_OK(c, c->allocate_output(1, g.shape(), &residual));
    float* r = residual->flat<float>().data();
    std::memcpy(r, g.flat<float>().data(), sizeof(float) * g.NumElements());
    const tf::int32* id = idx.flat<tf::int32>().data();
    if (kCoded) {
      Guard(c, [&] {
        OP_REQUIRES_OK(c, OutputBytes(c, 0, hvdext::topk_extract_coded(r, id, idx.NumElements(), g.NumElements(),
                                                                       type_)));
      });
      return;
    }
    tf::Tensor* payload;
    OP_REQUIRES_OK(c, c->allocate_output(0, tf::TensorShape({hvdext::topk_payload_bytes(idx.NumElements(), type_)}),
                                         &payload));
    hvdext::topk_extract(r, id, idx.NumElements(), type_, payload->flat<tf::uint8>().data());
  }

 private:
  hvdext::ValueType type_;
};
REGISTER_KERNEL_BUILDER(Name("HvdextTopkExtract").Device(tf::DEVICE_CPU), TopkExtractOp<false>);

REGISTER_OP("HvdextTopkDecodeAverage")
    .Input("gathered: uint8")
    .Input("k: int32")
    .Attr("nranks: int")
    .Attr("count: int")
    .Attr("value_type: int")
    .Attr("divisor: float")
    .Output("average: float")
    .Output("bad_rank: int32")
    .SetShapeFn(CountVector)
    .Doc("scatter-add N gathered top-k payloads / divisor; bad_rank is -1 or a rank with indices out of range.");

class TopkDecodeAverageOp : public tf::OpKernel {
 public:
  explicit TopkDecodeAverageOp(tf::OpKernelConstruction* c) : OpKernel(c) {
    Attrs(c).Int("nranks", &nranks_, 1, kMaxRanks).Int("count", &count_, 0).Float("divisor", &divisor_)
        .ValueType(&type_);
  }
  void Compute(tf::OpKernelContext* c) override {
    const tf::Tensor& gathered = c->input(0);
    const tf::int64 k = c->input(1).scalar<tf::int32>()();
    OP_REQUIRES(c, gathered.NumElements() == nranks_ * hvdext::topk_payload_bytes(k, type_),
                tf::errors::InvalidArgument("gathered payloads hold ", gathered.NumElements(), " bytes, expected ",
                                            nranks_ * hvdext::topk_payload_bytes(k, type_)));
    tf::Tensor *out, *bad;
    OP_REQUIRES_OK(c, c->allocate_output(0, tf::TensorShape({count_}), &out));
    OP_REQUIRES_OK(c, c->allocate_output(1, tf::TensorShape({}), &bad));
    bad->scalar<tf::int32>()() = hvdext::topk_decode_average(gathered.flat<tf::uint8>().data(),
                                                             static_cast<int>(nranks_), k, count_, type_, divisor_,
                                                             out->flat<float>().data());
  }

 private:
  tf::int64 nranks_, count_;
  float divisor_;
  hvdext::ValueType type_;
};
REGISTER_KERNEL_BUILDER(Name("HvdextTopkDecodeAverage").Device(tf::DEVICE_CPU).HostMemory("k"), TopkDecodeAverageOp);

// ------------------------------------------------------------------------------------- entropy-coded payloads

REGISTER_OP("HvdextTernaryEncodeEntropy")
    .Input("gradient: float")
    .Input("threshold: float")
    .Input("scale: float")
    .Input("seed: int64")
    .Input("step: int64")
    .Attr("tensor_key: int")
    .Attr("rank: int")
    .Output("payload: uint8")
    .SetShapeFn(UnknownVector)
    .Doc("clip + ternarize + entropy-code one gradient (packing \"entropy\", variable size).");

class TernaryEncodeEntropyOp : public tf::OpKernel {
 public:
  explicit TernaryEncodeEntropyOp(tf::OpKernelConstruction* c) : OpKernel(c) {
    Attrs(c).Int("tensor_key", &tensor_key_, 0, 0xFFFFFFFF).Int("rank", &rank_, 0, kMaxRanks);
  }
  void Compute(tf::OpKernelContext* c) override {
    const tf::Tensor& g = c->input(0);
    const hvdext::RandomKey key = KeyOf(c, tensor_key_, rank_);
    Guard(c, [&] {
      OP_REQUIRES_OK(c, OutputBytes(c, 0, hvdext::ternary_encode_entropy(g.flat<float>().data(), g.NumElements(),
                                                                         ScalarFloat(c, 1), ScalarFloat(c, 2), key)));
    });
  }

 private:
  tf::int64 tensor_key_, rank_;
};
REGISTER_KERNEL_BUILDER(Name("HvdextTernaryEncodeEntropy").Device(tf::DEVICE_CPU), TernaryEncodeEntropyOp);

REGISTER_OP("HvdextTernaryCodesEncodeEntropy")
    .Input("codes: uint8")
    .Input("scale: float")
    .Output("payload: uint8")
    .SetShapeFn(UnknownVector)
    .Doc("entropy-code given ternary codes under a scale (the two-phase transport's phase-1 chunks).");

class TernaryCodesEncodeEntropyOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* c) override {
    const tf::Tensor& codes = c->input(0);
    Guard(c, [&] {
      OP_REQUIRES_OK(c, OutputBytes(c, 0, hvdext::ternary_codes_encode_entropy(
                                              codes.flat<tf::uint8>().data(), codes.NumElements(), ScalarFloat(c, 1))));
    });
  }
};
REGISTER_KERNEL_BUILDER(Name("HvdextTernaryCodesEncodeEntropy").Device(tf::DEVICE_CPU), TernaryCodesEncodeEntropyOp);

REGISTER_OP("HvdextTernaryDecodeAverageEntropy")
    .Input("gathered: uint8")
    .Attr("nranks: int")
    .Attr("count: int")
    .Attr("divisor: float")
    .Output("average: float")
    .Output("bad_rank: int32")
    .SetShapeFn(CountVector)
    .Doc("average N entropy-coded payloads; bad_rank is -1 or the first rank that sent NaN/Inf; a corrupted "
         "payload fails the op.");

// Decodes the N coded payloads of an allgather (their framing gives their sizes) into their average; a corrupted
// payload fails the op (Guard). kDecode returns -1 or a rank that sent NaN/Inf (the average is then NaN).
using CodedDecode = int (*)(const uint8_t*, int64_t, int, int64_t, float, float*);

template <CodedDecode kDecode>
class CodedDecodeAverageOp : public tf::OpKernel {
 public:
  explicit CodedDecodeAverageOp(tf::OpKernelConstruction* c) : OpKernel(c) {
    Attrs(c).Int("nranks", &nranks_, 1, kMaxRanks).Int("count", &count_, 0).Float("divisor", &divisor_);
  }
  void Compute(tf::OpKernelContext* c) override {
    const tf::Tensor& gathered = c->input(0);
    tf::Tensor *out, *bad;
    OP_REQUIRES_OK(c, c->allocate_output(0, tf::TensorShape({count_}), &out));
    OP_REQUIRES_OK(c, c->allocate_output(1, tf::TensorShape({}), &bad));
    Guard(c, [&] {
      const int bad_rank = kDecode(gathered.flat<tf::uint8>().data(), gathered.NumElements(),
                                   static_cast<int>(nranks_), count_, divisor_, out->flat<float>().data());
      if (bad_rank >= 0) out->flat<float>().setConstant(std::numeric_limits<float>::quiet_NaN());
      bad->scalar<tf::int32>()() = bad_rank;
    });
  }

 private:
  tf::int64 nranks_, count_;
  float divisor_;
};

static int TopkDecodeCoded(const uint8_t* gathered, int64_t bytes, int nranks, int64_t n, float divisor, float* out) {
  hvdext::topk_decode_average_coded(gathered, bytes, nranks, n, divisor, out);
  return -1;  // indices are checked by the stream's structure: a bad one is a corrupted payload
}

REGISTER_KERNEL_BUILDER(Name("HvdextTernaryDecodeAverageEntropy").Device(tf::DEVICE_CPU),
                        CodedDecodeAverageOp<hvdext::ternary_decode_average_entropy>);

REGISTER_OP("HvdextTernaryEntropyToPacked")
    .Input("received: uint8")
    .Attr("nranks: int")
    .Attr("count: int")
    .Attr("packing: int")
    .Output("packed: uint8")
    .Output("bad_rank: int32")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, c->Scalar());
      return tf::OkStatus();
    })
    .Doc("the N received entropy-coded chunks of `count` codes, packed; bad_rank: -1 or a corrupted chunk's rank.");

class TernaryEntropyToPackedOp : public tf::OpKernel {
 public:
  explicit TernaryEntropyToPackedOp(tf::OpKernelConstruction* c) : OpKernel(c) {
    Attrs(c).Int("nranks", &nranks_, 1, kMaxRanks).Int("count", &count_, 0, (tf::int64{1} << 31) - 1)
        .Packing(&packing_);
  }
  void Compute(tf::OpKernelContext* c) override {
    const tf::Tensor& received = c->input(0);
    tf::Tensor *packed, *bad;
    OP_REQUIRES_OK(c, c->allocate_output(
                          0, tf::TensorShape({nranks_ * hvdext::ternary_packed_bytes(count_, packing_)}), &packed));
    OP_REQUIRES_OK(c, c->allocate_output(1, tf::TensorShape({}), &bad));
    bad->scalar<tf::int32>()() = hvdext::ternary_entropy_to_packed(
        received.flat<tf::uint8>().data(), received.NumElements(), static_cast<int>(nranks_), count_, packing_,
        packed->flat<tf::uint8>().data());
  }

 private:
  tf::int64 nranks_, count_;
  hvdext::Packing packing_ = hvdext::Packing::kBase3;
};
REGISTER_KERNEL_BUILDER(Name("HvdextTernaryEntropyToPacked").Device(tf::DEVICE_CPU), TernaryEntropyToPackedOp);

REGISTER_OP("HvdextTwoPhaseLevelsEncode")
    .Input("stream: uint8")
    .Input("bad_rank: int32")
    .Attr("count: int")
    .Attr("nranks: int")
    .Attr("bits: int")
    .Output("coded: uint8")
    .SetShapeFn(UnknownVector)
    .Doc("entropy-code a two-phase level stream, or flag the phase-1 chunk of bad_rank (>= 0) as corrupted.");

class TwoPhaseLevelsEncodeOp : public tf::OpKernel {
 public:
  explicit TwoPhaseLevelsEncodeOp(tf::OpKernelConstruction* c) : OpKernel(c) {
    Attrs(c).Int("count", &count_, 0).Int("nranks", &nranks_, 1, kMaxRanks).Int("bits", &bits_, 1, 32);
  }
  void Compute(tf::OpKernelContext* c) override {
    const tf::Tensor& stream = c->input(0);
    OP_REQUIRES(c, stream.NumElements() == hvdext::two_phase_stream_bytes(count_, static_cast<int>(bits_)),
                tf::errors::InvalidArgument("stream holds ", stream.NumElements(), " bytes, expected ",
                                            hvdext::two_phase_stream_bytes(count_, static_cast<int>(bits_))));
    const int bad = c->input(1).scalar<tf::int32>()();
    Guard(c, [&] {
      OP_REQUIRES_OK(c, OutputBytes(c, 0, hvdext::two_phase_levels_encode(stream.flat<tf::uint8>().data(), count_,
                                                                          static_cast<int>(nranks_),
                                                                          static_cast<int>(bits_), bad)));
    });
  }

 private:
  tf::int64 count_, nranks_, bits_;
};
REGISTER_KERNEL_BUILDER(Name("HvdextTwoPhaseLevelsEncode").Device(tf::DEVICE_CPU), TwoPhaseLevelsEncodeOp);

REGISTER_OP("HvdextTwoPhaseLevelsDecode")
    .Input("gathered: uint8")
    .Attr("counts: list(int)")
    .Attr("bits: int")
    .Output("streams: uint8")
    .SetShapeFn(UnknownVector)
    .Doc("the fixed level streams (back to back) of the N ranks' entropy-coded ones; a corrupted one fails the op.");

class TwoPhaseLevelsDecodeOp : public tf::OpKernel {
 public:
  explicit TwoPhaseLevelsDecodeOp(tf::OpKernelConstruction* c) : OpKernel(c) {
    std::vector<tf::int64> counts;
    OP_REQUIRES_OK(c, c->GetAttr("counts", &counts));
    counts_.assign(counts.begin(), counts.end());
    Attrs(c).Int("bits", &bits_, 1, 32);
  }
  void Compute(tf::OpKernelContext* c) override {
    const tf::Tensor& gathered = c->input(0);
    tf::int64 total = 0;
    for (int64_t n : counts_) total += hvdext::two_phase_stream_bytes(n, static_cast<int>(bits_));
    tf::Tensor* out;
    OP_REQUIRES_OK(c, c->allocate_output(0, tf::TensorShape({total}), &out));
    Guard(c, [&] {
      hvdext::two_phase_levels_decode(gathered.flat<tf::uint8>().data(), gathered.NumElements(), counts_.data(),
                                      static_cast<int>(counts_.size()), static_cast<int>(bits_),
                                      out->flat<tf::uint8>().data());
    });
  }

 private:
  std::vector<int64_t> counts_;
  tf::int64 bits_;
};
REGISTER_KERNEL_BUILDER(Name("HvdextTwoPhaseLevelsDecode").Device(tf::DEVICE_CPU), TwoPhaseLevelsDecodeOp);

REGISTER_OP("HvdextTopkExtractCoded")
    .Input("g_ef: float")
    .Input("indices: int32")
    .Attr("value_type: int")
    .Output("payload: uint8")
    .Output("residual: float")
    .SetShapeFn(PayloadAndResidual)
    .Doc("the \"delta\" payload (Rice-coded index gaps, fp16/fp32/ternary values) and g_ef - sent as residual.");

REGISTER_KERNEL_BUILDER(Name("HvdextTopkExtractCoded").Device(tf::DEVICE_CPU), TopkExtractOp<true>);

REGISTER_OP("HvdextTopkDecodeAverageCoded")
    .Input("gathered: uint8")
    .Attr("nranks: int")
    .Attr("count: int")
    .Attr("divisor: float")
    .Output("average: float")
    .Output("bad_rank: int32")
    .SetShapeFn(CountVector)
    .Doc("scatter-add N \"delta\" payloads / divisor (bad_rank: always -1); a corrupted payload fails the op.");

REGISTER_KERNEL_BUILDER(Name("HvdextTopkDecodeAverageCoded").Device(tf::DEVICE_CPU),
                        CodedDecodeAverageOp<TopkDecodeCoded>);

// ----------------------------------------------------------------------------------------- sparse_reduce
std::vector<int64_t> BoundsOf(const tf::Tensor& bounds) {
  const auto b = bounds.flat<tf::int64>();
  return std::vector<int64_t>(b.data(), b.data() + b.size());
}

// The tensors of an N-input list as segments (read-only ones are cast: the core only reads them).
std::vector<hvdext::Segment> SegmentsOf(const tf::OpInputList& list) {
  std::vector<hvdext::Segment> segs;
  for (int i = 0; i < list.size(); ++i)
    segs.push_back({const_cast<float*>(list[i].flat<float>().data()), list[i].NumElements()});
  return segs;
}

REGISTER_OP("HvdextTopkEncodeRegions")
    .Input("g_ef: N * float")
    .Input("positions: int32")
    .Input("bounds: int64")
    .Attr("N: int >= 1")
    .Attr("value_type: int")
    .Output("payload: uint8")
    .Output("region_bytes: int64")
    .SetShapeFn(UnknownVector)
    .Doc("sparse_reduce's phase 1: one \"delta\" payload per region [bounds[j], bounds[j+1]) of the tensors' "
         "concatenation, back to back, and their sizes.");

class TopkEncodeRegionsOp : public tf::OpKernel {
 public:
  explicit TopkEncodeRegionsOp(tf::OpKernelConstruction* c) : OpKernel(c) { Attrs(c).ValueType(&type_); }
  void Compute(tf::OpKernelContext* c) override {
    tf::OpInputList g_ef;
    OP_REQUIRES_OK(c, c->input_list("g_ef", &g_ef));
    const tf::Tensor& positions = c->input(g_ef.size());
    const std::vector<int64_t> bounds = BoundsOf(c->input(g_ef.size() + 1));
    OP_REQUIRES(c, bounds.size() >= 2, tf::errors::InvalidArgument("bounds needs at least one region"));
    const std::vector<hvdext::Segment> segs = SegmentsOf(g_ef);
    tf::Tensor* sizes;
    OP_REQUIRES_OK(c, c->allocate_output(1, tf::TensorShape({static_cast<tf::int64>(bounds.size() - 1)}), &sizes));
    Guard(c, [&] {
      std::vector<int64_t> region_bytes(bounds.size() - 1);
      OP_REQUIRES_OK(c, OutputBytes(c, 0, hvdext::topk_encode_regions(
                                               segs.data(), static_cast<int>(segs.size()),
                                               positions.flat<tf::int32>().data(), positions.NumElements(),
                                               bounds.data(), static_cast<int>(region_bytes.size()), type_,
                                               region_bytes.data())));
      std::copy(region_bytes.begin(), region_bytes.end(), sizes->flat<tf::int64>().data());
    });
  }

 private:
  hvdext::ValueType type_;
};
REGISTER_KERNEL_BUILDER(Name("HvdextTopkEncodeRegions").Device(tf::DEVICE_CPU).HostMemory("bounds"),
                        TopkEncodeRegionsOp);

REGISTER_OP("HvdextTopkDecodeRegions")
    .Input("gathered: uint8")
    .Input("bounds: int64")
    .Attr("divisor: float")
    .Attr("sizes: list(int)")
    .Output("average: N * float")
    .Attr("N: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      std::vector<tf::int64> sizes;
      TF_RETURN_IF_ERROR(c->GetAttr("sizes", &sizes));
      for (size_t i = 0; i < sizes.size(); ++i) c->set_output(static_cast<int>(i), c->Vector(sizes[i]));
      return tf::OkStatus();
    })
    .Doc("sparse_reduce's phase 2: the regions' payloads decoded at their offsets, / divisor, split into tensors "
         "of `sizes` elements; a corrupted payload fails the op.");

class TopkDecodeRegionsOp : public tf::OpKernel {
 public:
  explicit TopkDecodeRegionsOp(tf::OpKernelConstruction* c) : OpKernel(c) {
    Attrs(c).Float("divisor", &divisor_);
    OP_REQUIRES_OK(c, c->GetAttr("sizes", &sizes_));
  }
  void Compute(tf::OpKernelContext* c) override {
    const std::vector<int64_t> bounds = BoundsOf(c->input(1));
    OP_REQUIRES(c, bounds.size() >= 2, tf::errors::InvalidArgument("bounds needs at least one region"));
    std::vector<hvdext::Segment> segs;
    for (size_t i = 0; i < sizes_.size(); ++i) {
      tf::Tensor* out;
      OP_REQUIRES_OK(c, c->allocate_output(static_cast<int>(i), tf::TensorShape({sizes_[i]}), &out));
      segs.push_back({out->flat<float>().data(), sizes_[i]});
    }
    Guard(c, [&] {
      hvdext::topk_decode_regions_into(c->input(0).flat<tf::uint8>().data(), c->input(0).NumElements(),
                                       static_cast<int>(bounds.size() - 1), bounds.data(), divisor_, segs.data(),
                                       static_cast<int>(segs.size()));
    });
  }

 private:
  float divisor_;
  std::vector<tf::int64> sizes_;
};
REGISTER_KERNEL_BUILDER(Name("HvdextTopkDecodeRegions").Device(tf::DEVICE_CPU).HostMemory("bounds"),
                        TopkDecodeRegionsOp);

REGISTER_OP("HvdextTopkKeepApplied")
    .Input("g_ef: N * float")
    .Input("average: N * float")
    .Input("positions: int32")
    .Attr("N: int >= 1")
    .Attr("value_type: int")
    .Output("residual: N * float")
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->input(i));
      return tf::OkStatus();
    })
    .Doc("sparse_reduce's error feedback: g_ef - sent at this rank's positions whose average is non-zero, g_ef "
         "elsewhere.");

class TopkKeepAppliedOp : public tf::OpKernel {
 public:
  explicit TopkKeepAppliedOp(tf::OpKernelConstruction* c) : OpKernel(c) { Attrs(c).ValueType(&type_); }
  void Compute(tf::OpKernelContext* c) override {
    tf::OpInputList g_ef, average;
    OP_REQUIRES_OK(c, c->input_list("g_ef", &g_ef));
    OP_REQUIRES_OK(c, c->input_list("average", &average));
    const tf::Tensor& positions = c->input(2 * g_ef.size());
    std::vector<hvdext::Segment> residual;
    for (int i = 0; i < g_ef.size(); ++i) {
      tf::Tensor* out;
      OP_REQUIRES_OK(c, c->allocate_output(i, g_ef[i].shape(), &out));
      std::memcpy(out->flat<float>().data(), g_ef[i].flat<float>().data(), sizeof(float) * g_ef[i].NumElements());
      residual.push_back({out->flat<float>().data(), g_ef[i].NumElements()});
    }
    const std::vector<hvdext::Segment> avg = SegmentsOf(average);
    Guard(c, [&] {
      hvdext::topk_keep_applied(residual.data(), avg.data(), static_cast<int>(residual.size()),
                                positions.flat<tf::int32>().data(), positions.NumElements(), type_);
    });
  }

 private:
  hvdext::ValueType type_;
};
REGISTER_KERNEL_BUILDER(Name("HvdextTopkKeepApplied").Device(tf::DEVICE_CPU), TopkKeepAppliedOp);

REGISTER_OP("HvdextTopkReduceRegion")
    .Input("received: uint8")
    .Input("count: int64")
    .Input("q: int64")
    .Attr("nranks: int")
    .Attr("value_type: int")
    .Output("payload: uint8")
    .SetShapeFn(UnknownVector)
    .Doc("sparse_reduce's owner: the N payloads over a region of `count` elements summed, the top q sums coded; a "
         "corrupted payload gives the marker payload that fails every rank's phase 2.");

class TopkReduceRegionOp : public tf::OpKernel {
 public:
  explicit TopkReduceRegionOp(tf::OpKernelConstruction* c) : OpKernel(c) {
    Attrs(c).Int("nranks", &nranks_, 1, kMaxRanks).ValueType(&type_);
  }
  void Compute(tf::OpKernelContext* c) override {
    const tf::Tensor& received = c->input(0);
    const tf::int64 count = c->input(1).scalar<tf::int64>()();
    const tf::int64 q = c->input(2).scalar<tf::int64>()();
    Guard(c, [&] {
      OP_REQUIRES_OK(c, OutputBytes(c, 0, hvdext::topk_reduce_region(received.flat<tf::uint8>().data(),
                                                                     received.NumElements(),
                                                                     static_cast<int>(nranks_), count, q, type_)));
    });
  }

 private:
  tf::int64 nranks_;
  hvdext::ValueType type_;
};
REGISTER_KERNEL_BUILDER(Name("HvdextTopkReduceRegion").Device(tf::DEVICE_CPU).HostMemory("count").HostMemory("q"),
                        TopkReduceRegionOp);
