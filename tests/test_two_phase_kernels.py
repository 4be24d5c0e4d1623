"""Two-phase transport kernels (sum + re-encode, decode) against the NumPy reference, and its plan."""
import numpy as np
import pytest
import torch

from horovod_ext import _torch_ops as ops
from horovod_ext.compression import sizes
from horovod_ext.compression.sizes import PACKING_IDS
from horovod_ext.compressors.transports.two_phase import TwoPhasePlan, choose_transport, level_bits
from hvdext_reference import terngrad, two_phase as ref


def random_codes(nranks, count, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 3, count).astype(np.uint8) for _ in range(nranks)]


@pytest.mark.parametrize("packing", ["2bit", "base3"])
def test_sum_reencode_round_trips_for_every_n_from_2_to_127(packing):
    for nranks in range(2, 128):
        count = 37 + nranks % 11  # odd lengths: partial bytes in both the packing and the b-bit stream
        codes = random_codes(nranks, count, nranks)
        if nranks % 2:  # the extremes k = -N and k = +N must survive too
            codes = [np.full(count, 1 + (nranks % 4 == 1), dtype=np.uint8) for _ in range(nranks)]
        packed = [terngrad.pack(c, packing) for c in codes]
        bits = sizes.two_phase_level_bits(nranks)
        assert bits == ref.level_bits(nranks) == level_bits(nranks)
        got = ops.ternary_sum_reencode(torch.from_numpy(np.concatenate(packed)), nranks, count, PACKING_IDS[packing],
                                       bits).numpy()
        k = ref.sum_codes(packed, count, packing)
        np.testing.assert_array_equal(got, ref.reencode(k, nranks, bits))
        np.testing.assert_array_equal(ref.decode_levels(got, count, nranks, bits), k)


def test_level_bits_match_the_issue():
    assert [level_bits(n) for n in (1, 2, 3, 4, 7, 8, 127, 128)] == [2, 3, 3, 4, 4, 5, 8, 9]


@pytest.mark.parametrize("nranks", [2, 3, 4, 7, 8, 100])
def test_decode_at_any_offset(nranks):
    count = 1001
    k = np.random.default_rng(nranks).integers(-nranks, nranks + 1, count)
    bits = level_bits(nranks)
    stream = torch.from_numpy(ref.reencode(k, nranks, bits))
    for first, n in ((0, count), (1, 5), (7, 300), (count - 1, 1), (500, 0)):
        out = torch.empty(n)
        ops.two_phase_decode(stream, first, n, nranks, bits, 0.75, float(nranks), out)
        want = (k[first:first + n].astype(np.float32) * np.float32(0.75)) / np.float32(nranks)
        np.testing.assert_array_equal(out.numpy(), want)


@pytest.mark.parametrize("nranks", [2, 3, 4, 5])
def test_two_phase_equals_allgather_decode_with_shared_scale(nranks):
    """The reference identity behind the transport: both paths give the same bits (tensors smaller than N too)."""
    sizes = [1, 2, nranks - 1 or 1, 37, 1000]
    rng = np.random.default_rng(nranks)
    grads = [[rng.standard_normal(n).astype(np.float32) for n in sizes] for _ in range(nranks)]
    scales = [max(terngrad.local_scale(grads[r][t])[1] for r in range(nranks)) for t in range(len(sizes))]
    codes = []
    for r in range(nranks):
        per_tensor = []
        for t, g in enumerate(grads[r]):
            threshold, _ = terngrad.local_scale(g)
            per_tensor.append(terngrad.ternarize_codes(g, threshold, scales[t], 5, 0, t, r))
        codes.append(np.concatenate(per_tensor))
    two_phase = ref.two_phase_average(codes, sizes, scales, "base3", nranks)
    for t, n in enumerate(sizes):
        payloads = [terngrad.encode(grads[r][t], seed=5, step=0, tensor=t, rank=r, scale=scales[t])
                    for r in range(nranks)]
        np.testing.assert_array_equal(two_phase[t], terngrad.decode_average(payloads, n, "base3", nranks))


def test_plan_pieces_cover_every_element_once():
    plan = TwoPhasePlan([3, 1, 10, 2], 3, "base3")
    assert plan.bounds == [0, 5, 10, 16] and plan.counts == [5, 5, 6]
    covered = np.zeros(16, dtype=int)
    for j in range(3):
        for t, first, count, into in plan.pieces(j):
            covered[plan.offsets[t] + into:plan.offsets[t] + into + count] += 1
            assert plan.bounds[j] + first == plan.offsets[t] + into
    assert (covered == 1).all()


def test_auto_transport_by_bytes():
    sizes = [1_000_000, 500_000]
    assert choose_transport("auto", False, sizes, 8, "base3") == "allgather"  # no shared scale: no integer sums
    assert choose_transport("auto", True, sizes, 2, "base3") == "allgather"  # 431 KB against 300 KB
    assert choose_transport("auto", True, sizes, 4, "base3") == "allgather"  # 788 KB against 900 KB: under 256 KB
    for shared in (True, None):  # None: the scale is shared because two-phase is chosen
        assert choose_transport("auto", shared, sizes, 8, "base3") == "two_phase"  # 1.08 MB against 2.1 MB
    assert choose_transport("allgather", True, sizes, 16, "base3") == "allgather"
