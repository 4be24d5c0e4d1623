"""The TensorFlow custom ops of horovod-ext (cpp/tensorflow/ops.cc over the framework-free core in cpp/src), loaded
from _tf_ops.so beside this module, and the TensorFlow backend's kernel table over them (TFKernels; the twin of
horovod_ext/torch_common/kernels.py)."""
import os

import tensorflow as tf

LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_tf_ops.so")
if not os.path.exists(LIBRARY):
    raise ImportError(f"{LIBRARY} is missing: build horovod-ext's native ops with `python setup.py build_ext "
                      f"--inplace` (scripts/setup.sh does it)")
lib = tf.load_op_library(LIBRARY)


def script_seed():
    """The global seed the script set (tf.random.set_seed, keras.utils.set_random_seed), or None: the eager
    context's, else the default graph's (a TF1-style graph script)."""
    from tensorflow.python.eager import context

    seed = context.global_seed()
    return seed if seed is not None else tf.compat.v1.get_default_graph().seed


def seed_tensor(seed):
    """A 64-bit seed as the int64 the ops take (same bits)."""
    return tf.constant(seed - 2 ** 64 if seed >= 2 ** 63 else seed, dtype=tf.int64)


class TFKernels:
    """The kernel table of the TensorFlow backend: each op under the uniform, functional signature the plan calls
    (horovod_ext/compression/plan.py); graph-safe, the same bits as the PyTorch table. ``into`` is PyTorch's
    write-in-place hint, unused here."""

    @staticmethod
    def normal(n, seed, step, key, like=None):
        """n float32 standard normals keyed on (seed, step, key) (cpp/include/hvdext/random.h)."""
        seed = seed if tf.is_tensor(seed) else seed_tensor(int(seed) % 2 ** 64)
        return lib.hvdext_normal(seed, tf.cast(step, tf.int64), count=int(n), tensor_key=int(key))

    @staticmethod
    def ternary_local_scale(flat, clip):
        return lib.hvdext_ternary_local_scale(flat, clip=clip)

    @staticmethod
    def ternary_encode(flat, threshold, scale, seed, step, key, rank, packing):
        return lib.hvdext_ternary_encode(flat, threshold, scale, seed, step, tensor_key=key, rank=rank,
                                         packing=packing)

    @staticmethod
    def ternary_encode_codes(flat, threshold, scale, seed, step, key, rank):
        return lib.hvdext_ternary_encode_codes(flat, threshold, scale, seed, step, tensor_key=key, rank=rank)

    @staticmethod
    def ternary_pack(codes, packing):
        return lib.hvdext_ternary_pack_codes(codes, packing=packing)

    @staticmethod
    def ternary_decode_average(gathered, nranks, numel, packing, divisor, into=None):
        return lib.hvdext_ternary_decode_average(gathered, nranks=nranks, count=numel, packing=packing,
                                                 divisor=divisor)

    @staticmethod
    def ternary_sum_reencode(received, nranks, count, packing, bits):
        return lib.hvdext_ternary_sum_reencode(received, nranks=nranks, count=count, packing=packing, bits=bits)

    @staticmethod
    def two_phase_decode(stream, scale, first, count, nranks, bits, divisor):
        return lib.hvdext_two_phase_decode(stream, scale, first=first, count=count, nranks=nranks, bits=bits,
                                           divisor=divisor)

    @staticmethod
    def ef_accumulate(flat, residual):
        return lib.hvdext_ef_accumulate(flat, residual)

    @staticmethod
    def topk_select(x, k):
        return lib.hvdext_topk_select(x, k)

    @staticmethod
    def topk_select_nested(x, k1, k2):
        return tuple(lib.hvdext_topk_select_nested(x, k1, k2))

    @staticmethod
    def sum_squares_at(x, idx):
        return lib.hvdext_sum_squares_at(x, idx)

    @staticmethod
    def topk_extract(x, idx, value_type):
        return lib.hvdext_topk_extract(x, idx, value_type=value_type)

    @staticmethod
    def topk_decode_average(gathered, k, nranks, numel, value_type, divisor, into=None):
        return lib.hvdext_topk_decode_average(gathered, k, nranks=nranks, count=numel, value_type=value_type,
                                              divisor=divisor)

    # ------------------------------------------------------------------------------- entropy-coded payloads
    @staticmethod
    def ternary_encode_entropy(flat, threshold, scale, seed, step, key, rank):
        return lib.hvdext_ternary_encode_entropy(flat, threshold, scale, seed, step, tensor_key=key, rank=rank)

    @staticmethod
    def ternary_codes_encode_entropy(codes, scale=1.0):
        return lib.hvdext_ternary_codes_encode_entropy(codes, tf.constant(scale, tf.float32))

    @staticmethod
    def ternary_decode_average_entropy(gathered, nranks, numel, divisor, into=None):
        return lib.hvdext_ternary_decode_average_entropy(gathered, nranks=nranks, count=numel, divisor=divisor)

    @staticmethod
    def ternary_entropy_to_packed(received, nranks, count, packing):
        return lib.hvdext_ternary_entropy_to_packed(received, nranks=nranks, count=count, packing=packing)

    @staticmethod
    def two_phase_levels_encode(stream, count, nranks, bits, bad):
        return lib.hvdext_two_phase_levels_encode(stream, bad, count=count, nranks=nranks, bits=bits)

    @staticmethod
    def two_phase_levels_decode(gathered, counts, bits):
        return lib.hvdext_two_phase_levels_decode(gathered, counts=[int(c) for c in counts], bits=bits)

    @staticmethod
    def topk_extract_coded(x, idx, value_type):
        return lib.hvdext_topk_extract_coded(x, idx, value_type=value_type)

    @staticmethod
    def topk_decode_average_coded(gathered, nranks, numel, divisor, into=None):
        return lib.hvdext_topk_decode_average_coded(gathered, nranks=nranks, count=numel, divisor=divisor)

    # ------------------------------------------------------------------------------------------ sparse_reduce
    @staticmethod
    def topk_encode_regions(flats, positions, bounds, value_type):
        payload, region_bytes = lib.hvdext_topk_encode_regions(list(flats), positions,
                                                               tf.cast(tf.stack(bounds), tf.int64),
                                                               value_type=value_type)
        return payload, tf.cast(region_bytes, tf.int32)

    @staticmethod
    def topk_decode_regions(gathered, bounds, divisor, sizes, into):
        return lib.hvdext_topk_decode_regions(gathered, tf.cast(tf.stack(bounds), tf.int64), divisor=divisor,
                                              sizes=[int(n) for n in sizes], N=len(sizes))

    @staticmethod
    def topk_keep_applied(flats, averages, positions, value_type):
        return lib.hvdext_topk_keep_applied(list(flats), list(averages), positions, value_type=value_type)

    @staticmethod
    def topk_reduce_region(received, nranks, numel, q, value_type):
        return lib.hvdext_topk_reduce_region(received, tf.cast(numel, tf.int64), tf.cast(q, tf.int64), nranks=nranks,
                                             value_type=value_type)
