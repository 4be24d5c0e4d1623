"""The C++ ternary kernels against the NumPy reference (bit for bit) and the statistics of TernGrad."""
import math

import numpy as np
import pytest
import torch

from horovod_ext import _torch_ops as ops
from horovod_ext.compression.sizes import PACKING_IDS
from hvdext_reference import terngrad as ref

SIZES = [1, 2, 3, 4, 5, 6, 7, 8, 9, 19, 20, 21, 1000, 3999, 4000, 4001, 8021, 65537, 1000003]


def gradient(n, seed=0, dist="normal"):
    rng = np.random.default_rng(seed + n)
    if dist == "normal":
        g = rng.standard_normal(n)
    elif dist == "heavy":  # outliers, so that clipping matters
        g = rng.standard_t(df=2, size=n)
    else:
        g = rng.uniform(-1e-3, 1e-3, n)
    return g.astype(np.float32)


def native_encode(g, clip, packing, seed, step, tensor, rank, scale=None):
    t = torch.from_numpy(g)
    thr, s = ops.ternary_local_scale(t, 0.0 if clip is None else clip)
    if scale is not None and math.isfinite(s):
        s = scale
    return ops.ternary_encode(t, thr, s, seed, step, tensor, rank, PACKING_IDS[packing]).numpy()


@pytest.mark.parametrize("packing", ["2bit", "base3"])
@pytest.mark.parametrize("n", SIZES)
def test_encode_bit_identical_to_reference(n, packing):
    for dist, clip in (("normal", 2.5), ("heavy", 2.5), ("small", None)):
        g = gradient(n, dist=dist)
        key = dict(seed=(n * 2654435761) % 2 ** 64, step=n % 17, tensor=12345 + n, rank=n % 5)
        want = ref.encode(g, clip=clip, packing=packing, **key)
        got = native_encode(g, clip, packing, **key)
        assert got.dtype == np.uint8
        assert got.size == 4 + (math.ceil(n / 4) if packing == "2bit" else math.ceil(n / 5))
        np.testing.assert_array_equal(got, want)


def test_local_scale_bit_identical_to_reference():
    """The core's (threshold, scale) from its sums (threshold = float32(clip * sigma)) and max |g|, as the
    reference's, for every size and clip, and +inf for a NaN/Inf gradient."""
    for n in SIZES:
        for dist in ("heavy", "uniform"):
            g = gradient(n, dist=dist)
            for clip in (2.5, 1.0, 0.0):
                thr, s = ops.ternary_local_scale(torch.from_numpy(g), clip)
                want = ref.local_scale(g, clip if clip else None)
                assert (np.float32(thr), np.float32(s)) == (np.float32(want[0]), np.float32(want[1])), (n, dist, clip)
    g = gradient(1003, dist="heavy")
    g[500] = np.nan
    assert ops.ternary_local_scale(torch.from_numpy(g), 2.5)[1] == math.inf == ref.local_scale(g)[1]


def test_sum_of_squares_bit_identical_to_reference():
    """|g|^2 as the core sums it (block tree, in float64; ef_accumulate into r = 0) equals the reference's."""
    for n in SIZES:
        g = gradient(n, dist="heavy")
        assert ops.ef_accumulate(torch.from_numpy(g), torch.zeros(g.size)) == ref.gradient_stats(g)[1]


def test_reference_lane_sums_are_sequential():
    g = gradient(1003, dist="heavy")
    lanes = [0.0] * 8
    for i, x in enumerate(g.astype(np.float64)):
        lanes[i % 8] += x
    expected = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
    assert ref.gradient_stats(g)[0] == expected


@pytest.mark.parametrize("packing", ["2bit", "base3"])
@pytest.mark.parametrize("n", [1, 3, 4, 5, 1000003])
def test_pack_round_trip(n, packing):
    codes = np.random.default_rng(n).integers(0, 3, n).astype(np.uint8)
    packed = ref.pack(codes, packing)
    assert packed.size == (math.ceil(n / 4) if packing == "2bit" else math.ceil(n / 5))
    np.testing.assert_array_equal(ref.unpack(packed, n, packing), codes)


@pytest.mark.parametrize("packing", ["2bit", "base3"])
@pytest.mark.parametrize("n", [1, 5, 4001, 65537])
@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_decode_average_bit_identical(n, packing, nranks):
    for shared in (False, True):
        payloads = []
        for r in range(nranks):
            g = gradient(n, seed=r, dist="heavy")
            payloads.append(native_encode(g, 2.5, packing, 9, 1, 2, r, scale=3.0 if shared else None))
        gathered = torch.from_numpy(np.concatenate(payloads))
        for divisor in (float(nranks), 1.0):
            out = torch.empty(n, dtype=torch.float32)
            assert ops.ternary_decode_average(gathered, nranks, n, PACKING_IDS[packing], divisor, out) == -1
            np.testing.assert_array_equal(out.numpy(), ref.decode_average(payloads, n, packing, divisor))


def test_decode_reports_nonfinite_rank():
    n = 100
    good = native_encode(gradient(n), 2.5, "base3", 1, 0, 0, 0)
    g = gradient(n)
    g[7] = np.nan
    bad = native_encode(g, 2.5, "base3", 1, 0, 0, 1)
    assert np.isinf(bad[:4].view(np.float32)[0])
    out = torch.zeros(n)
    assert ops.ternary_decode_average(torch.from_numpy(np.concatenate([good, bad])), 2, n, 1, 2.0, out) == 1
    assert torch.count_nonzero(out) == 0


def decoded_samples(g, clip, draws, packing="2bit"):
    n = g.size
    out = np.empty((draws, n), dtype=np.float64)  # float64: a float32 mean of 3000 draws drifts
    for step in range(draws):
        payload = native_encode(g, clip, packing, 3, step, 77, 0)
        out[step] = ref.decode_average([payload], n, packing, 1.0)
    return out


def test_outputs_are_ternary_with_scale():
    g = gradient(5000, dist="heavy")
    payload = native_encode(g, 2.5, "base3", 1, 0, 0, 0)
    s, values = ref.split_payload(payload, g.size, "base3")
    decoded = ref.decode_average([payload], g.size, "base3", 1.0)
    assert set(np.unique(decoded)) <= {np.float32(-s), np.float32(0), np.float32(s)}
    assert set(np.unique(values)) == {-1, 0, 1}


def test_unbiased_and_variance_without_clipping():
    g = gradient(400, dist="normal")
    draws = 3000
    samples = decoded_samples(g, None, draws)
    s = np.abs(g).max()
    var = s * np.abs(g) - g.astype(np.float64) ** 2
    mean = samples.mean(axis=0)
    bound = 4 * np.sqrt(np.maximum(var, 1e-12) / draws)
    assert np.all(np.abs(mean - g) <= bound + 1e-6)
    # The sample variance tracks s|g| - g^2 within 5 standard errors, Var(S^2) ~ (mu4 - var^2)/M, where mu4 is the
    # 4th central moment of the two-point output (s*sign(g) with p = |g|/s, else 0).
    g64 = g.astype(np.float64)
    p = np.abs(g64) / s
    mu4 = p * (s * np.sign(g64) - g64) ** 4 + (1 - p) * g64 ** 4
    sample_var = samples.var(axis=0)
    # (plus the second-order term ~var/M, which dominates where p = 1/2 and the first-order one vanishes)
    var = np.maximum(var, 0)
    bound = 5 * np.sqrt(np.maximum(mu4 - var ** 2, 0) / draws) + 4 * var / draws + 1e-9
    assert np.all(np.abs(sample_var - var) <= bound)
    assert abs(sample_var.sum() / var.sum() - 1) < 0.02


def test_clipping_bounds_outputs_and_is_unbiased_for_the_clipped_gradient():
    g = gradient(2000, dist="heavy")
    sigma = g.astype(np.float64).std()
    threshold = np.float32(2.5 * sigma)
    assert np.abs(g).max() > threshold  # the test needs outliers
    samples = decoded_samples(g, 2.5, 2000)
    assert np.abs(samples).max() <= threshold * (1 + 1e-6)
    clipped = np.clip(g, -threshold, threshold)
    var = threshold * np.abs(clipped) - clipped.astype(np.float64) ** 2
    bound = 4 * np.sqrt(np.maximum(var, 1e-12) / 2000)
    assert np.all(np.abs(samples.mean(axis=0) - clipped) <= bound + 1e-6)


def test_different_keys_give_different_draws():
    g = gradient(1000)
    base = native_encode(g, 2.5, "2bit", 1, 0, 0, 0)
    for key in ((2, 0, 0, 0), (1, 1, 0, 0), (1, 0, 1, 0), (1, 0, 0, 1)):
        assert not np.array_equal(native_encode(g, 2.5, "2bit", *key), base)
    np.testing.assert_array_equal(native_encode(g, 2.5, "2bit", 1, 0, 0, 0), base)


def test_zero_and_constant_tensors():
    zeros = np.zeros(10, dtype=np.float32)
    payload = native_encode(zeros, 2.5, "base3", 1, 0, 0, 0)
    np.testing.assert_array_equal(payload, ref.encode(zeros))
    assert not payload.any()
    const = np.full(10, 0.5, dtype=np.float32)  # sigma = 0: clipping is off, every element keeps its value
    decoded = ref.decode_average([native_encode(const, 2.5, "base3", 1, 0, 0, 0)], 10, "base3", 1.0)
    np.testing.assert_array_equal(decoded, const)


@pytest.mark.parametrize("n", [4095, 4096, 4097, 3 * 4096 + 17, 5 * 4096])
def test_reference_block_tree_order(n):
    """reduce.py's order spelled out: sequential lanes per 4096-element block, lanes by a fixed tree, blocks
    pairwise level by level (odd counts carry their last block up)."""
    from hvdext_reference.reduce import block_tree_sum

    g = gradient(n, dist="heavy").astype(np.float64)
    partials = []
    for start in range(0, n, 4096):
        lanes = [0.0] * 8
        for i, x in enumerate(g[start:start + 4096]):
            lanes[i % 8] += x
        partials.append(((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
                        + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7])))
    while len(partials) > 1:
        partials = [partials[i] + partials[i + 1] for i in range(0, len(partials) - 1, 2)] + \
            ([partials[-1]] if len(partials) % 2 else [])
    assert block_tree_sum(g) == partials[0]
    squares = g.astype(np.float32).astype(np.float64) ** 2  # the core's float64 sum of squares, in the same order
    assert ops.ef_accumulate(torch.from_numpy(g.astype(np.float32)), torch.zeros(n)) == block_tree_sum(squares)
