// TensorFlow binding of the horovod-ext op library: registers ops that convert tensors and call the framework-free
// core in cpp/src (the same code as the PyTorch binding), nothing else. Static settings are attrs; what changes per
// step (the step counter, the seed, scales) are inputs, so the ops are graph-safe.
#include <cstring>
#include <limits>

#include "hvdext/ternary.h"
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

tf::Status UnknownVector(InferenceContext* c) {
  for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
  return tf::OkStatus();
}

// Reads the "packing" attr into *packing; a bad value fails the kernel's construction.
void PackingAttr(tf::OpKernelConstruction* c, hvdext::Packing* packing) {
  tf::int64 value = 0;
  OP_REQUIRES_OK(c, c->GetAttr("packing", &value));
  OP_REQUIRES(c, value == 0 || value == 1, tf::errors::InvalidArgument("packing must be 0 (2bit) or 1 (base3)"));
  *packing = static_cast<hvdext::Packing>(value);
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
  explicit TernaryLocalScaleOp(tf::OpKernelConstruction* c) : OpKernel(c) { OP_REQUIRES_OK(c, c->GetAttr("clip", &clip_)); }
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
    OP_REQUIRES_OK(c, c->GetAttr("tensor_key", &tensor_key_));
    OP_REQUIRES_OK(c, c->GetAttr("rank", &rank_));
    if (kPacked) PackingAttr(c, &packing_);
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

REGISTER_OP("HvdextTernaryDecodeAverage")
    .Input("gathered: uint8")
    .Attr("nranks: int")
    .Attr("count: int")
    .Attr("packing: int")
    .Attr("divisor: float")
    .Output("average: float")
    .Output("bad_rank: int32")
    .SetShapeFn([](InferenceContext* c) {
      tf::int64 count;
      TF_RETURN_IF_ERROR(c->GetAttr("count", &count));
      c->set_output(0, c->Vector(count));
      c->set_output(1, c->Scalar());
      return tf::OkStatus();
    })
    .Doc("decode N gathered payloads and average them; bad_rank is -1 or the first rank that sent NaN/Inf.");

class TernaryDecodeAverageOp : public tf::OpKernel {
 public:
  explicit TernaryDecodeAverageOp(tf::OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("nranks", &nranks_));
    OP_REQUIRES_OK(c, c->GetAttr("count", &count_));
    OP_REQUIRES_OK(c, c->GetAttr("divisor", &divisor_));
    PackingAttr(c, &packing_);
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
  explicit TernaryPackCodesOp(tf::OpKernelConstruction* c) : OpKernel(c) { PackingAttr(c, &packing_); }
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
    OP_REQUIRES_OK(c, c->GetAttr("nranks", &nranks_));
    OP_REQUIRES_OK(c, c->GetAttr("count", &count_));
    OP_REQUIRES_OK(c, c->GetAttr("bits", &bits_));
    PackingAttr(c, &packing_);
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
    .SetShapeFn([](InferenceContext* c) {
      tf::int64 count;
      TF_RETURN_IF_ERROR(c->GetAttr("count", &count));
      c->set_output(0, c->Vector(count));
      return tf::OkStatus();
    })
    .Doc("elements [first, first + count) of a level stream as float32(k) * scale / divisor.");

class TwoPhaseDecodeOp : public tf::OpKernel {
 public:
  explicit TwoPhaseDecodeOp(tf::OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("first", &first_));
    OP_REQUIRES_OK(c, c->GetAttr("count", &count_));
    OP_REQUIRES_OK(c, c->GetAttr("nranks", &nranks_));
    OP_REQUIRES_OK(c, c->GetAttr("bits", &bits_));
    OP_REQUIRES_OK(c, c->GetAttr("divisor", &divisor_));
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
