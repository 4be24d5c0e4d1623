"""The TensorFlow custom ops of horovod-ext (cpp/tensorflow/ops.cc over the framework-free core in cpp/src)."""
import os

import tensorflow as tf

LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_tf_ops.so")
if not os.path.exists(LIBRARY):
    raise ImportError(f"{LIBRARY} is missing: build horovod-ext's native ops with `python setup.py build_ext "
                      f"--inplace` (scripts/setup.sh does it)")
lib = tf.load_op_library(LIBRARY)


def seed_tensor(seed):
    """A 64-bit seed as the int64 the ops take (same bits)."""
    return tf.constant(seed - 2 ** 64 if seed >= 2 ** 63 else seed, dtype=tf.int64)


class TernaryCodec:
    """Graph-safe TF counterpart of horovod_ext.torch.ternary.TernaryCodec (the same ops, the same bits)."""

    def __init__(self, spec, rank):
        self.spec = spec
        self.rank = rank
        self.clip = 0.0 if spec.clip is None else float(spec.clip)
        self.packing = spec.packing_id

    def local_scale(self, flat):
        return lib.hvdext_ternary_local_scale(flat, clip=self.clip)

    def encode(self, flat, threshold, scale, seed, step, key):
        return lib.hvdext_ternary_encode(flat, threshold, scale, seed, step, tensor_key=key, rank=self.rank,
                                         packing=self.packing)

    def encode_codes(self, flat, threshold, scale, seed, step, key):
        return lib.hvdext_ternary_encode_codes(flat, threshold, scale, seed, step, tensor_key=key, rank=self.rank)

    def pack(self, codes):
        return lib.hvdext_ternary_pack_codes(codes, packing=self.packing)

    def decode_average(self, gathered, nranks, count, divisor):
        return lib.hvdext_ternary_decode_average(gathered, nranks=nranks, count=count, packing=self.packing,
                                                 divisor=divisor)

    def sum_reencode(self, received, nranks, count, bits):
        return lib.hvdext_ternary_sum_reencode(received, nranks=nranks, count=count, packing=self.packing, bits=bits)

    @staticmethod
    def decode_levels(stream, scale, first, count, nranks, bits, divisor):
        return lib.hvdext_two_phase_decode(stream, scale, first=first, count=count, nranks=nranks, bits=bits,
                                           divisor=divisor)


class TopKCodec:
    """Graph-safe TF counterpart of horovod_ext.torch.topk.TopKCodec (the same kernels, the same bits)."""

    def __init__(self, spec):
        from horovod_ext.compression.specs import VALUE_DTYPE_IDS

        self.value_type = VALUE_DTYPE_IDS[spec.value_dtype]

    @staticmethod
    def accumulate(flat, residual):
        return lib.hvdext_ef_accumulate(flat, residual)

    @staticmethod
    def select(g_ef, k, among=None):
        return lib.hvdext_topk_select(g_ef, k) if among is None else lib.hvdext_topk_select_among(g_ef, among, k)

    @staticmethod
    def energy(g_ef, idx):
        return lib.hvdext_sum_squares_at(g_ef, idx)

    def extract(self, g_ef, idx):
        return lib.hvdext_topk_extract(g_ef, idx, value_type=self.value_type)

    def decode_average(self, gathered, k, nranks, count, divisor):
        return lib.hvdext_topk_decode_average(gathered, k, nranks=nranks, count=count, value_type=self.value_type,
                                              divisor=divisor)
