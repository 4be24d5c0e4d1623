"""PyTorch codec of Compression.ternary: converts tensors and calls the native ops (cpp/, via _torch_ops).

The math is in cpp/include/hvdext/ternary.h and, as a definition, python/hvdext_reference/terngrad.py. CUDA tensors
run the GPU kernels (cpp/cuda/) on torch's current stream, with the same bits.
"""
import torch

from horovod_ext import _torch_ops as ops
from horovod_ext.compression.specs import check_tensor
from horovod_ext.compression.wire import tensor_key

def stream_of(tensor):
    """The CUDA stream a native op on `tensor` must run on (torch's current one for its device); 0 on the CPU."""
    return torch.cuda.current_stream(tensor.device).cuda_stream if tensor.is_cuda else 0


def check_gradient(name, tensor, what="ternary compression", **limits):
    """A clear error for gradients a payload compressor cannot take (every rank raises it)."""
    check_tensor(what, name, str(tensor.dtype).replace("torch.", ""), tensor.numel(), tensor.shape, **limits)


class TernaryCodec:
    """Stateless per step: encode(name, gradient, step) and decode(gathered). The seed is fixed at first use."""

    def __init__(self, spec, rank, seed):
        self.spec = spec
        self.rank = rank
        self.seed = seed
        self.clip = 0.0 if spec.clip is None else float(spec.clip)
        self.packing = spec.packing_id

    @staticmethod
    def as_float32(tensor):
        flat = tensor.detach().reshape(-1)
        if flat.dtype != torch.float32:
            flat = flat.float()
        return flat.contiguous()

    def payload_bytes(self, numel):
        return ops.ternary_payload_bytes(numel, self.packing)

    def local_scale(self, flat):
        """(threshold, scale) of this rank's gradient; scale = inf flags NaN/Inf."""
        return ops.ternary_local_scale(flat, self.clip, stream_of(flat))

    def encode(self, name, flat, step, threshold, scale):
        return ops.ternary_encode(flat, threshold, scale, self.seed, step & 0xFFFFFFFF, tensor_key(name),
                                  self.rank, self.packing, stream_of(flat))

    def encode_codes(self, name, flat, step, threshold, scale, codes):
        """The unpacked codes of one tensor into `codes` (a uint8 view), with the same draws as encode()."""
        ops.ternary_encode_codes(flat, threshold, scale, self.seed, step & 0xFFFFFFFF, tensor_key(name), self.rank,
                                 codes)

    def pack(self, codes, out):
        ops.ternary_pack_codes(codes, self.packing, out)

    def sum_reencode(self, received, nranks, count, bits):
        return ops.ternary_sum_reencode(received, nranks, count, self.packing, bits)

    def decode_levels(self, stream, first, count, nranks, bits, scale, divisor, out):
        """Elements [first, first + count) of a two-phase level stream, as float32(k) * scale / divisor."""
        ops.two_phase_decode(stream, first, count, nranks, bits, scale, divisor, out)

    def decode_average(self, gathered, nranks, numel, divisor, out):
        """Decode into out (float32, contiguous); returns -1 or the first rank that sent NaN/Inf."""
        return ops.ternary_decode_average(gathered, nranks, numel, self.packing, float(divisor), out,
                                          stream_of(gathered))
