"""Each compressor spec's payload_bytes (its one byte formula) against an independent count: the length of the
NumPy reference's own payload (python/hvdext_reference), or the format's arithmetic as the papers and the
reference write it; and the bytes Compression.auto and horovod_ext.perfmodel use are the spec's. Single process,
no framework kernels."""
import math
import types

import numpy as np
import pytest

from horovod_ext.compression.plan import Item
from horovod_ext.compressors.auto import Auto
from horovod_ext.compressors.auto.measure import round_trip
from horovod_ext.compressors.auto.method import AutoMethod
from horovod_ext.compressors.gravac import AdaptiveTopK
from horovod_ext.compressors.powersgd import PowerSGD, PowerSGDMethod
from horovod_ext.compressors.ternary import Ternary, TernaryCodec
from horovod_ext.compressors.topk import TopK, TopKCodec
from horovod_ext.compression.buckets import header_bytes
from horovod_ext.perfmodel import plan
from hvdext_reference import powersgd as ref_powersgd
from hvdext_reference import terngrad as ref_ternary
from hvdext_reference import topk as ref_topk

SHAPES = [(), (1,), (7,), (1023,), (1024,), (1025,), (4099,), (10, 256), (512, 64), (256, 512), (64, 3, 7, 7),
          (2, 1000), (1000, 2), (3, 3), (16, 16), (30522, 768)]
SMALL = [s for s in SHAPES if math.prod(s) <= 70000]  # where the reference encodes a real payload quickly
CTX = types.SimpleNamespace(stats=types.SimpleNamespace(extra={}))


def gradient(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(math.prod(shape)).astype(np.float32)


# ------------------------------------------------------------------------------------------------------ ternary
@pytest.mark.parametrize("packing", ["2bit", "base3"])
@pytest.mark.parametrize("shape", SHAPES)
def test_ternary_is_the_scale_and_the_packed_codes(packing, shape):
    n = math.prod(shape)
    spec = Ternary(packing=packing, min_size=0)
    per_byte = 4 if packing == "2bit" else 5  # TernGrad's codes, 2 bits each or 5 to a byte (3^5 = 243)
    assert spec.payload_bytes(shape) == 4 + math.ceil(n / per_byte) == 4 + ref_ternary.packed_bytes(n, packing)
    if shape in SMALL:
        assert spec.payload_bytes(shape) == len(ref_ternary.encode(gradient(shape), packing=packing))
    assert TernaryCodec(spec, CTX).payload_bytes(n) == spec.payload_bytes(n)


@pytest.mark.parametrize("shape", SMALL)
def test_ternary_entropy_is_bounded_by_its_base3_mode(shape):
    """"entropy": the C++ table's largest size, 14 bytes of framing (varint length, CRC-32, scale, mode) and the
    base-3 codes; the reference's payloads, sparse or dense, never exceed it. The codec counts it as it runs."""
    n = math.prod(shape)
    spec = Ternary(packing="entropy", min_size=0)
    assert spec.payload_bytes(shape) == 14 + math.ceil(n / 5)
    for g in (gradient(shape), np.ones(n, dtype=np.float32)):  # the second: every code non-zero (base-3 mode)
        assert len(ref_ternary.encode(g, clip=None, packing="entropy")) <= spec.payload_bytes(shape)
    assert TernaryCodec(spec, CTX).payload_bytes(n) is None


def test_ternary_below_min_size_is_its_dense_allreduce_and_auto_packing_has_no_size():
    assert Ternary(packing="base3").payload_bytes(1023) == 4 * 1023
    assert Ternary(packing="base3").payload_bytes((32, 32)) == 4 + math.ceil(1024 / 5)
    with pytest.raises(ValueError, match="packing='auto'"):
        Ternary().payload_bytes(4096)
    assert Ternary().for_device("cuda").payload_bytes(4096) == 4 + math.ceil(4096 / 5)


# -------------------------------------------------------------------------------------------------------- top-k
@pytest.mark.parametrize("value_dtype, value_bytes", [("fp16", 2), ("fp32", 4)])
@pytest.mark.parametrize("ratio", [1.0, 0.3, 0.01, 0.001])
@pytest.mark.parametrize("shape", SHAPES)
def test_topk_int32_is_k_indices_and_k_values(value_dtype, value_bytes, ratio, shape):
    n = math.prod(shape)
    spec = TopK(ratio=ratio, packing="int32", value_dtype=value_dtype)
    k = ref_topk.k_of(n, 1.0 / ratio)  # Stich et al.'s k = ceil(ratio n), at least 1
    assert 1 <= k <= n
    assert spec.payload_bytes(shape) == k * (4 + value_bytes) == ref_topk.payload_bytes(k, value_dtype)
    if shape in SMALL:
        idx, values, _ = ref_topk.ef_step(gradient(shape), np.zeros(n, np.float32), k, value_dtype)
        assert spec.payload_bytes(shape) == len(ref_topk.encode(idx, values))
    assert TopKCodec(spec, CTX).payload_bytes(n) == spec.payload_bytes(n)


@pytest.mark.parametrize("cf", [1.0, 10.0, 160.0, 1000.0])
@pytest.mark.parametrize("shape", SHAPES)
def test_adaptive_topk_is_topks_at_its_compression_factor(cf, shape):
    n = math.prod(shape)
    spec = AdaptiveTopK(min_cf=10, max_cf=1000, packing="int32", value_dtype="fp32")
    assert spec.payload_bytes(shape, cf) == ref_topk.payload_bytes(ref_topk.k_of(n, cf), "fp32")
    assert spec.payload_bytes(shape) == spec.payload_bytes(shape, 10.0)  # min_cf, where a run starts


def test_delta_packing_has_no_size_before_it_runs():
    assert TopK(packing="delta").payload_bytes(10000) is None
    assert TopK(packing="delta", value_dtype="ternary").payload_bytes(10000) is None
    assert AdaptiveTopK(packing="delta").payload_bytes(10000) is None
    assert TopKCodec(TopK(packing="delta"), CTX).payload_bytes(10000) is None
    with pytest.raises(ValueError, match="packing='auto'"):
        TopK().payload_bytes(10000)
    assert TopK().for_device("cuda").payload_bytes(10000) == 100 * 6


# ------------------------------------------------------------------------------------------------------ PowerSGD
POWERSGD = [PowerSGD(rank=r, value_dtype=d, min_compression_rate=c)
            for r in (1, 4, 32) for d in ("fp32", "fp16") for c in (0.5, 2, 8.5)]


def reference_powersgd_bytes(spec, shape):
    """Vogels et al.'s P (n x r) and Q (m x r) in value_dtype, of the reference's layout; 4 * numel dense."""
    layout = ref_powersgd.layout(shape, spec.rank, spec.min_compression_rate)
    if layout is None:
        return 4 * math.prod(shape)
    n, m, r = layout
    return (n + m) * r * (2 if spec.value_dtype == "fp16" else 4)


@pytest.mark.parametrize("spec", POWERSGD, ids=lambda s: s.describe())
def test_powersgd_is_both_factors_or_dense(spec):
    for shape in SHAPES:
        assert spec.payload_bytes(shape) == reference_powersgd_bytes(spec, shape), shape
        layout = spec.layout(shape)
        assert (layout is None) == (ref_powersgd.layout(shape, spec.rank, spec.min_compression_rate) is None)
        if layout is not None:
            assert sum(spec.factor_bytes(layout)) == spec.payload_bytes(shape)
    assert PowerSGD(rank=4).payload_bytes((64, 3, 7, 7)) == (64 + 147) * 4 * 4  # out x in*h*w, as the hook views it
    assert PowerSGD(rank=4).payload_bytes((100,)) == 400 and PowerSGD(rank=4).payload_bytes(()) == 4


@pytest.mark.parametrize("spec", POWERSGD[::3], ids=lambda s: s.describe())
def test_powersgd_methods_count_is_the_specs(spec):
    method = PowerSGDMethod.__new__(PowerSGDMethod)
    method.spec, method.be = spec, types.SimpleNamespace(nranks=4)
    matrices = [s for s in SHAPES if spec.layout(s) is not None]
    method.step_items = [(math.prod(s),) + spec.layout(s) for s in matrices]
    q_float32 = 4 * sum(spec.layout(s)[1] * spec.layout(s)[2] for s in matrices)
    total = sum(spec.payload_bytes(s) for s in matrices)
    assert method.compressed_bytes()["payload_bytes"] == total
    assert method.compressed_bytes(agree=True)["payload_bytes"] == total + q_float32


# ------------------------------------------------------------------------------------------ auto and perfmodel
def test_auto_has_no_size_of_its_own():
    assert Auto().payload_bytes((512, 64)) is None


class NumpyBackend:
    """What measure.powersgd_round_trip calls of a backend, in NumPy (its bytes do not depend on the values)."""
    nranks = 1

    def reshape(self, x, shape):
        return np.reshape(x, shape)

    def split(self, x, parts):
        return np.split(x, np.cumsum(parts)[:-1])

    def orthogonalize(self, x, how):
        return np.linalg.qr(x)[0]

    def matmul(self, a, b, transpose_a=False, transpose_b=False):
        a = np.swapaxes(a, -1, -2) if transpose_a else a
        b = np.swapaxes(b, -1, -2) if transpose_b else b
        return a @ b

    def inner_products(self, x, y):
        return np.array([x @ y, x @ x, y @ y])

    def unstack(self, tensor, n):
        return list(tensor)


def test_autos_bytes_of_a_candidate_are_its_specs():
    candidates = [Ternary(packing="base3"), TopK(ratio=0.1, packing="int32")] + POWERSGD
    method = AutoMethod.__new__(AutoMethod)
    method.candidates = list(Auto(candidates=candidates).candidates)
    method.sizes = [math.prod(s) for s in SHAPES]
    method.names = [f"t{j}" for j in range(len(SHAPES))]
    method.shapes = dict(zip(method.names, SHAPES))
    for t, shape in enumerate(SHAPES):
        for c, cand in enumerate(method.candidates):
            kind, nbytes = method._kind_bytes(t, c)
            if isinstance(cand, PowerSGD):
                assert (kind, nbytes) == ("factors" if cand.layout(shape) else "allreduce", cand.payload_bytes(shape))
                if shape in SMALL and cand.layout(shape):
                    item = Item(0, "w", None, math.prod(shape), 4)
                    assert round_trip(NumpyBackend(), None, item, gradient(shape), cand, shape)[2] == nbytes
            elif cand == "none" or (not isinstance(cand, str) and math.prod(shape) < cand.settings.get("min_size", 0)):
                assert (kind, nbytes) == ("allreduce", 4 * math.prod(shape))


@pytest.mark.parametrize("packing", ["2bit", "base3", "entropy"])
@pytest.mark.parametrize("nranks", [2, 5])
def test_perfmodels_ternary_payload_is_the_specs(packing, nranks):
    spec = Ternary(packing=packing)
    payloads = sum(spec.payload_bytes(s) for s in SHAPES if math.prod(s) >= spec.min_size)
    allgather = plan("ternary", SHAPES, nranks, packing=packing, bucket_cap_mb=0, transport="allgather")[0]
    assert allgather.kind == "allgather" and allgather.payload == payloads
    # a bucket's allgather also carries an int32 size per payload (compression/buckets.py): the 30522 x 768
    # embedding (94 MB) is a bucket of its own, the 9 other compressed tensors share one 25 MB bucket
    big = [math.prod(s) >= spec.min_size for s in SHAPES]
    assert header_bytes([math.prod(s) for s in SHAPES], big) == 4 * 9
    assert plan("ternary", SHAPES, nranks, packing=packing, transport="allgather")[0].payload == payloads + 4 * 9
    # transport="auto" (the default) plans what the compressor takes: BERT's 94 MB embedding goes two-phase at 5
    assert plan("ternary", SHAPES, nranks, packing=packing)[0].kind == ("allgather" if nranks == 2 else "alltoall")


@pytest.mark.parametrize("spec", POWERSGD, ids=lambda s: s.describe())
def test_perfmodels_powersgd_factors_are_the_specs(spec):
    args = dict(rank=spec.rank, value_dtype=spec.value_dtype, min_compression_rate=spec.min_compression_rate)
    p, q, dense, _ = plan("powersgd", SHAPES, 4, **args)
    matrices = [s for s in SHAPES if spec.layout(s) is not None]
    assert p.payload == sum(spec.factor_bytes(spec.layout(s))[0] for s in matrices)
    assert q.payload == sum(spec.factor_bytes(spec.layout(s))[1] for s in matrices)
    assert dense.payload == sum(spec.payload_bytes(s) for s in SHAPES if s not in matrices)
    hook, = plan("powersgd", SHAPES, 4, hook=True, **args)
    assert hook.payload == sum(spec.payload_bytes(s) for s in SHAPES) == sum(reference_powersgd_bytes(spec, s)
                                                                             for s in SHAPES)
