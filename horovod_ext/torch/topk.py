"""PyTorch codec of Compression.topk and Compression.adaptive_topk: converts tensors and calls the native ops.
The math is in cpp/include/hvdext/topk.h and, as a definition, python/hvdext_reference/topk.py. CUDA tensors run the
GPU kernels of ef_accumulate, topk_select and topk_extract (cpp/cuda/) on torch's current stream."""
import torch  # noqa: F401  (loads libc10 before the extension below needs it)

from horovod_ext import _torch_ops as ops
from horovod_ext.compression.specs import VALUE_DTYPE_IDS
from .ternary import stream_of


class TopKCodec:
    def __init__(self, spec):
        self.value_type = VALUE_DTYPE_IDS[spec.value_dtype]
        self.error_feedback = spec.error_feedback

    def accumulate(self, flat, residual):
        """residual = g + residual (g alone without error feedback); returns |residual|^2."""
        if not self.error_feedback:
            residual.zero_()
        return ops.ef_accumulate(flat, residual, stream_of(flat))

    @staticmethod
    def select(residual, k, among=None):
        if among is None:
            return ops.topk_select(residual, k, stream_of(residual))
        return ops.topk_select_among(residual, among, k)

    @staticmethod
    def energy(residual, idx):
        return ops.sum_squares_at(residual, idx)

    def extract(self, residual, idx):
        return ops.topk_extract(residual, idx, self.value_type, stream_of(residual))

    def decode_average(self, gathered, nranks, k, numel, divisor, out):
        return ops.topk_decode_average(gathered, nranks, k, numel, self.value_type, float(divisor), out)
