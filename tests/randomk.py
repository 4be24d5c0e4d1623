"""A compressor defined outside the package: random-k with a shared seed, in NumPy (the proof that adding a
compressor is local: nothing under horovod_ext/ names it).

Every rank keeps the same k = ceil(ratio * n) indices of a tensor, drawn from (seed, step, tensor key), so a payload
is the k float32 values alone; the average is the scatter of the N ranks' values summed in rank order, divided by
the divisor. With error feedback the residual keeps every element not sent (exact: sent + remainder == g_ef)."""
import math

import numpy as np

from horovod_ext.compression.plan import Allgather, Codec
from horovod_ext.compression.specs import CompressorSpec, check_bool, check_int, check_real
from horovod_ext.compression.wire import tensor_key


def chosen(n, k, seed, step, key):
    """The k indices (ascending) every rank keeps of a tensor of n elements at this step."""
    rng = np.random.default_rng([seed, int(step), key])
    return np.sort(rng.choice(n, size=k, replace=False))


def kept(n, ratio):
    return max(1, min(n, math.ceil(ratio * n)))


class RandomKCodec(Codec):
    bad_flag = "(rank {} sent a payload of the wrong size)"
    bad_flag_error = "payload"
    nonfinite = "(NaN/Inf on some rank)"

    def __init__(self, spec, ctx):
        super().__init__(spec, ctx)
        self.ratio, self.seed = spec.ratio, spec.seed

    def payload_bytes(self, numel):
        return 4 * kept(numel, self.ratio)

    def encode(self, be, item, flat):
        n, k, key = item.numel, kept(item.numel, self.ratio), tensor_key(item.name)

        def encode_np(g, step):
            idx = chosen(n, k, self.seed, step, key)
            remainder = g.copy()
            remainder[idx] = 0.0
            return g[idx], remainder

        return be.numpy(encode_np, [flat, self.ctx.step], ("float32", "float32"))

    def decode(self, be, item, gathered, into):
        n, k, key, nranks, divisor = item.numel, kept(item.numel, self.ratio), tensor_key(item.name), be.nranks, \
            be.divisor

        def decode_np(values, step):
            if values.size != nranks * k:
                return np.zeros(n, np.float32), np.int32(0)
            idx = chosen(n, k, self.seed, step, key)
            out = np.zeros(n, np.float32)
            for r in range(nranks):
                out[idx] += values[r * k:(r + 1) * k]
            return out / np.float32(divisor), np.int32(-1)

        return be.numpy(decode_np, [gathered, self.ctx.step], ("float32", "int32"))


class RandomK(CompressorSpec):
    """random-k with a shared seed (every rank sends the same coordinates: Stich et al. 2018's rand-k)."""

    name = "randomk"
    method = Allgather
    codec = RandomKCodec

    def __init__(self, ratio=0.1, seed=7, error_feedback=True):
        super().__init__(ratio=check_real("randomk ratio", ratio, low=0.0),
                         seed=check_int("randomk seed", seed, low=0, high=2 ** 63),
                         error_feedback=check_bool("randomk error_feedback", error_feedback))
