"""Top-k kernels against the NumPy reference (bit for bit), error-feedback conservation and multi-level top-k."""
import numpy as np
import pytest
import torch

from hvdext_reference.reduce import block_tree_sum

from horovod_ext import _torch_ops as ops
from hvdext_reference import topk as ref

VALUE_TYPES = {"fp16": 0, "fp32": 1}


def values(n, seed, kind="normal"):
    rng = np.random.default_rng(seed)
    if kind == "ties":  # few distinct magnitudes: the tie rule decides
        return rng.choice(np.array([-2, -1, -0.5, 0, 0.5, 1, 2], dtype=np.float32), n)
    return (rng.standard_t(3, n) * 1e-2).astype(np.float32)


@pytest.mark.parametrize("n", [1, 2, 7, 1000, 4096, 16384, 40000, 65537, 200003, 1 << 20])  # sampled from 4096
@pytest.mark.parametrize("fraction", [0.001, 0.01, 0.1, 0.5, 1.0])
def test_select_equals_reference(n, fraction):
    for kind in ("normal", "ties"):
        x = values(n, n, kind)
        k = max(1, int(n * fraction))
        got = ops.topk_select(torch.from_numpy(x), k).numpy()
        np.testing.assert_array_equal(got, ref.select(x, k))


@pytest.mark.parametrize("n", [4096, 16384, 200003])
def test_select_is_exact_where_the_sample_misjudges(n):
    """The sampled threshold (every n/16-th magnitude) only prunes candidates: a tensor whose large values all sit
    between the sampled positions, or on them, still selects exactly the reference's top k."""
    k = max(1, n // 100)
    stride = n // min(16384, n // 16)
    for offset in (1, 0):  # between the sampled positions (the sample sees none of them), on them
        x = (np.random.default_rng(n).standard_normal(n) * 1e-3).astype(np.float32)
        x[offset::stride][:2 * k] = np.linspace(1.0, 2.0, 2 * k, dtype=np.float32)
        got = ops.topk_select(torch.from_numpy(x), k).numpy()
        np.testing.assert_array_equal(got, ref.select(x, k))


def test_select_handles_nan_and_inf_as_largest():
    x = np.zeros(100000, dtype=np.float32)
    x[[5, 70000]] = [np.inf, np.nan]
    x[99999] = -3.0
    assert list(ops.topk_select(torch.from_numpy(x), 3).numpy()) == [5, 70000, 99999]


def test_half_conversion_matches_numpy_everywhere():
    rng = np.random.default_rng(0)
    bits = np.concatenate([rng.integers(0, 2 ** 32, 200000, dtype=np.uint64).astype(np.uint32),
                           np.arange(0x33000000 - 64, 0x33000000 + 64, dtype=np.uint32),  # around 2^-25
                           np.arange(0x477FE000 - 64, 0x477FF000 + 64, dtype=np.uint32),  # around 65504
                           np.arange(0x38800000 - 64, 0x38800000 + 64, dtype=np.uint32)])  # around 2^-14
    x = bits.view(np.float32)
    x = np.concatenate([x, -x])
    # the fp16 values of a top-k payload that keeps every element (k int32 indices, then k binary16 values)
    payload = ops.topk_extract(torch.from_numpy(x.copy()), torch.arange(x.size, dtype=torch.int32), 0).numpy()
    got = payload[4 * x.size:].view(np.uint16)
    with np.errstate(over="ignore"):  # values beyond 65504 become inf, as they should
        want = x.astype(np.float16).view(np.uint16)
    finite = ~np.isnan(x)
    np.testing.assert_array_equal(got[finite], want[finite])
    assert np.all((got[~finite] & 0x7C00) == 0x7C00) and np.all(got[~finite] & 0x3FF)


@pytest.mark.parametrize("value_dtype", ["fp16", "fp32"])
def test_ef_step_and_decode_equal_reference(value_dtype):
    n, k, nranks = 50000, 500, 3
    payloads = []
    for rank in range(nranks):
        g, r = values(n, rank), values(n, 100 + rank)
        idx, sent, r_want = ref.ef_step(g, r, k, value_dtype)
        rt = torch.from_numpy(r.copy())
        sumsq = ops.ef_accumulate(torch.from_numpy(g), rt)
        g_ef = (g + r).astype(np.float64)  # float32 sum, then squared in float64
        assert sumsq == block_tree_sum(g_ef * g_ef)  # bit for bit, in the order of reduce.py
        sel = ops.topk_select(rt, k)
        np.testing.assert_array_equal(sel.numpy(), idx)
        payload = ops.topk_extract(rt, sel, VALUE_TYPES[value_dtype]).numpy()
        np.testing.assert_array_equal(payload, ref.encode(idx, sent))
        np.testing.assert_array_equal(rt.numpy(), r_want)
        payloads.append(payload)
    gathered = torch.from_numpy(np.concatenate(payloads))
    out = torch.empty(n)
    assert ops.topk_decode_average(gathered, nranks, k, n, VALUE_TYPES[value_dtype], float(nranks), out) == -1
    np.testing.assert_array_equal(out.numpy(), ref.decode_average(payloads, n, k, value_dtype, nranks))


def test_decode_rejects_out_of_range_indices():
    payload = ref.encode(np.array([3, 10], dtype=np.int32), np.array([1, 2], dtype=np.float16))
    out = torch.empty(5)
    assert ops.topk_decode_average(torch.from_numpy(payload), 1, 2, 5, 0, 1.0, out) == 0


@pytest.mark.parametrize("value_dtype", ["fp16", "fp32"])
def test_error_feedback_conserves_exactly(value_dtype):
    """sent + r_new == g + r_old element-wise, and over T steps sum(sent) + r_T == sum(g): with gradients on a
    dyadic grid every float32 sum below is exact, so equality is exact, not approximate."""
    n, k, steps = 4096, 41, 30
    rng = np.random.default_rng(1)
    r = torch.zeros(n)
    total_sent = np.zeros(n, dtype=np.float64)
    total_g = np.zeros(n, dtype=np.float64)
    for _ in range(steps):
        g = (rng.integers(-2 ** 10, 2 ** 10, n) / 2 ** 12).astype(np.float32)
        r_old = r.numpy().copy()
        ops.ef_accumulate(torch.from_numpy(g), r)
        idx = ops.topk_select(r, k)
        payload = ops.topk_extract(r, idx, VALUE_TYPES[value_dtype]).numpy()
        sent = ref.decode_average([payload], n, k, value_dtype, 1)
        np.testing.assert_array_equal(sent + r.numpy(), g + r_old)
        total_sent += sent
        total_g += g
    np.testing.assert_array_equal(total_sent + r.numpy(), total_g)


def test_multi_level_equals_single_shot():
    """Top k2 among the top k1 (topk_select_nested's second selection, and the reference's) is the top k2, bit for
    bit; the CFs cover nested's sorted and one-pass emissions, k2 == k1 and k1 == n."""
    for seed, kind in ((0, "normal"), (1, "ties"), (2, "normal")):
        x = values(100000, seed, kind)
        for theta1, theta2 in ((10, 2), (10, 16), (20, 50), (100, 2), (10, 1), (1, 10), (2, 500)):
            k1, k2 = ref.k_of(x.size, theta1), ref.k_of(x.size, theta1 * theta2)
            first = ops.topk_select(torch.from_numpy(x), k1)
            nested = ops.topk_select_nested(torch.from_numpy(x), k1, k2)
            second = nested[1].numpy()
            np.testing.assert_array_equal(second, ops.topk_select(torch.from_numpy(x), k2).numpy())
            np.testing.assert_array_equal(second, ref.select(x, k2, candidates=ref.select(x, k1)))
            np.testing.assert_array_equal(nested[0].numpy(), first.numpy())


def test_nested_selection_names_its_bounds():
    x = torch.ones(10)
    for k1, k2 in ((0, 1), (11, 1), (5, 6), (5, 0)):
        with pytest.raises((ValueError, RuntimeError), match="k2 <= k1"):
            ops.topk_select_nested(x, k1, k2)


def test_gravac_candidates_through_their_values_give_the_same_bits():
    """The CUDA path of GraVAC's second selection and norms (kernels.select_among_candidates: the top-k of the
    candidates' values; sum_squares_of_candidates: only the candidates' values go to the host) equals the direct
    kernels, ties included; run here on CPU tensors."""
    from horovod_ext.torch_common.kernels import select_among_candidates, sum_squares_of_candidates

    for seed, kind in ((0, "normal"), (1, "ties"), (3, "ties")):
        x = torch.from_numpy(values(50000, seed, kind))
        for theta1, theta2 in ((10, 2), (10, 16), (2, 500)):
            k1, k2 = ref.k_of(x.numel(), theta1), ref.k_of(x.numel(), theta1 * theta2)
            first = ops.topk_select(x, k1)
            want = ops.topk_select_nested(x, k1, k2)[1]
            got = select_among_candidates(x, first, k2)
            assert got.dtype == torch.int32 and torch.equal(got, want)
            assert sum_squares_of_candidates(x, first) == ops.sum_squares_at(x, first)
            assert sum_squares_of_candidates(x, want) == ops.sum_squares_at(x, want)


@pytest.mark.parametrize("value_dtype", ["fp16", "fp32"])
def test_decode_takes_unaligned_payloads_and_the_stream_argument(value_dtype):
    """topk_decode_average through its dispatch: odd k (a rank's payload then starts unaligned), 3 ranks, the same
    bits as the reference; the stream argument is accepted (0 on the host)."""
    n, k, nranks = 1001, 7, 3
    rng = np.random.default_rng(5)
    payloads = []
    for r in range(nranks):
        x = torch.from_numpy(rng.standard_normal(n).astype(np.float32))
        idx = ops.topk_select(x, k)
        payloads.append(ops.topk_extract(x.clone(), idx, VALUE_TYPES[value_dtype], 0))
    gathered = torch.cat(payloads)
    out = torch.empty(n, dtype=torch.float32)
    assert ops.topk_decode_average(gathered, nranks, k, n, VALUE_TYPES[value_dtype], 3.0, out, 0) == -1
    want = ref.decode_average([p.numpy() for p in payloads], n, k, value_dtype, 3.0)
    np.testing.assert_array_equal(out.numpy(), want)
    bad = gathered.clone()
    bad[(4 + (2 if value_dtype == "fp16" else 4)) * k:][:4] = torch.tensor([255, 255, 255, 127], dtype=torch.uint8)
    assert ops.topk_decode_average(bad, nranks, k, n, VALUE_TYPES[value_dtype], 3.0, out, 0) == 1
