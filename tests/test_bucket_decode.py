"""A bucket in one native call (cpp/src/bucket.cpp). `decode_bucket`: a fused allgather holds, for every rank, a
header of the m payloads' int32 sizes, then the payloads (compression/buckets.py); each tensor's average is the
NumPy reference's over its N payloads, and the bits of the per-tensor kernel; a corrupted payload fails its tensor
alone, a corrupted header every tensor. `topk_encode_bucket`: each tensor's payload and remainder are the
reference's error-feedback step and the per-tensor kernels' bits."""
import numpy as np
import pytest
import torch

from horovod_ext import _torch_ops as ops
from horovod_ext.compression.buckets import header_elements
from hvdext_reference import terngrad
from hvdext_reference import topk as rtopk

SIZES = [4000, 17, 1, 12345]  # a bucket's tensors, in its order
NRANKS = 3
PACKING = {"2bit": 0, "base3": 1, "entropy": 2}


def grad(n, rank, j):
    return (np.random.default_rng(100 * rank + j).standard_t(3, n) * 1e-2).astype(np.float32)


def topk_payload(g, value_type=0):
    k = max(1, len(g) // 100)
    idx = ops.topk_select(torch.from_numpy(g), k)
    return ops.topk_extract_coded(torch.from_numpy(g.copy()), idx, value_type).numpy()


def ternary_payload(g, rank, j, packing):
    t = torch.from_numpy(g)
    threshold, scale = ops.ternary_local_scale(t, 2.5)
    if packing == "entropy":
        return ops.ternary_encode_entropy(t, threshold, scale, 7, 3, j, rank).numpy()
    return ops.ternary_encode(t, threshold, scale, 7, 3, j, rank, PACKING[packing]).numpy()


def bucket(payloads):
    """payloads[r][j] -> the allgather's result: rank by rank, [int32 sizes | payloads]; its header bytes."""
    m = len(payloads[0])
    elements, count = header_elements(m, 1)
    blocks = []
    for mine in payloads:
        sizes = np.zeros(count, dtype=np.int32)
        sizes[:m] = [len(p) for p in mine]
        blocks += [sizes.view(np.uint8)] + list(mine)
    return np.concatenate(blocks).astype(np.uint8), elements


def decode(codec, result, header, packing=0):
    outs = [torch.empty(n) for n in SIZES]
    flags, errors, finite = ops.decode_bucket(codec, torch.from_numpy(result), NRANKS, header, SIZES, packing,
                                              NRANKS * 1.0, outs)
    decode.finite = finite  # whether each average is finite (top-k's decoder checks; ternary's says True)
    return [o.numpy() for o in outs], flags, errors


def test_topk_bucket_equals_the_reference_and_the_per_tensor_kernel():
    payloads = [[topk_payload(grad(n, r, j)) for j, n in enumerate(SIZES)] for r in range(NRANKS)]
    outs, flags, errors = decode("topk_coded", *bucket(payloads))
    assert flags == [-1] * len(SIZES) and errors == [""] * len(SIZES) and decode.finite == [True] * len(SIZES)
    for j, n in enumerate(SIZES):
        gathered = np.concatenate([payloads[r][j] for r in range(NRANKS)])
        want = rtopk.decode_average_delta(gathered, NRANKS, n, np.float32(NRANKS))
        per_tensor = torch.empty(n)
        ops.topk_decode_average_coded(torch.from_numpy(gathered), NRANKS, n, float(NRANKS), per_tensor)
        np.testing.assert_array_equal(outs[j], want)
        np.testing.assert_array_equal(outs[j], per_tensor.numpy())


@pytest.mark.parametrize("packing,value_dtype", [("delta", "fp16"), ("delta", "fp32"), ("delta", "ternary"),
                                                 ("int32", "fp16"), ("int32", "fp32")])
@pytest.mark.parametrize("feedback", [True, False])
def test_topk_bucket_encode_equals_the_reference_and_the_per_tensor_kernels(packing, value_dtype, feedback):
    """With error feedback the gradients are added into the residuals, which keep the remainders; without, the
    given buffers (copies of the gradients) are encoded and keep them. "delta": the reference's coded payload and
    topk_extract_coded's bits; "int32": k int32 indices then k values (the reference's encode) and topk_extract's."""
    coded = packing == "delta"
    value_type = rtopk.VALUE_TYPE_IDS[value_dtype]
    grads = [grad(n, 0, j) for j, n in enumerate(SIZES)]
    residuals = [grad(n, 1, j) if feedback else np.zeros(n, dtype=np.float32) for j, n in enumerate(SIZES)]
    ks = [max(1, n // 100) for n in SIZES]
    buffers = [torch.from_numpy(r.copy() if feedback else g.copy()) for g, r in zip(grads, residuals)]
    payloads = ops.topk_encode_bucket([torch.from_numpy(g) for g in grads] if feedback else [], buffers, ks,
                                      value_type, coded)
    for j, n in enumerate(SIZES):
        idx, values, remainder = rtopk.ef_step(grads[j], residuals[j], ks[j], value_dtype)
        want = rtopk.encode_delta(idx, values, n, value_dtype) if coded else rtopk.encode(idx, values)
        np.testing.assert_array_equal(payloads[j].numpy(), want)
        np.testing.assert_array_equal(buffers[j].numpy(), remainder)
        g_ef = torch.from_numpy((residuals[j] if feedback else grads[j]).copy())
        if feedback:
            ops.ef_accumulate(torch.from_numpy(grads[j]), g_ef, 0)
        extract = ops.topk_extract_coded if coded else ops.topk_extract
        per_tensor = extract(g_ef, ops.topk_select(g_ef, ks[j]), value_type)
        assert torch.equal(per_tensor, payloads[j]) and torch.equal(g_ef, buffers[j])
    with pytest.raises(ValueError, match="one k"):
        ops.topk_encode_bucket([], buffers, ks[:-1], value_type, coded)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan, 3e38])
def test_topk_bucket_reports_each_average_that_is_not_finite(bad):
    """A NaN or Inf among one rank's values of tensor 1 (fp32 values), or two ranks' 3e38 summing past float32's
    range: that tensor's average is not finite, as the reference's, and the others' are."""
    grads = [[grad(n, r, j) for j, n in enumerate(SIZES)] for r in range(NRANKS)]
    for r in ([0, 2] if bad == 3e38 else [2]):
        grads[r][1][5] = np.float32(bad)
    payloads = [[topk_payload(g, value_type=1) for g in mine] for mine in grads]
    outs, flags, errors = decode("topk_coded", *bucket(payloads))
    assert errors == [""] * len(SIZES)
    want = [bool(np.isfinite(rtopk.decode_average_delta(np.concatenate([payloads[r][j] for r in range(NRANKS)]),
                                                         NRANKS, n, np.float32(NRANKS))).all())
            for j, n in enumerate(SIZES)]
    assert want == [True, False, True, True]
    assert decode.finite == want
    assert [bool(np.isfinite(o).all()) for o in outs] == want


@pytest.mark.parametrize("packing", ["entropy", "base3", "2bit"])
def test_ternary_bucket_equals_the_reference(packing):
    payloads = [[ternary_payload(grad(n, r, j), r, j, packing) for j, n in enumerate(SIZES)] for r in range(NRANKS)]
    outs, flags, errors = decode("ternary", *bucket(payloads), PACKING[packing])
    assert flags == [-1] * len(SIZES) and errors == [""] * len(SIZES)
    for j, n in enumerate(SIZES):
        want = terngrad.decode_average([payloads[r][j] for r in range(NRANKS)], n, packing, np.float32(NRANKS))
        np.testing.assert_array_equal(outs[j], want)


def test_a_corrupted_payload_fails_its_tensor_alone_and_a_corrupted_header_every_tensor():
    payloads = [[topk_payload(grad(n, r, j)) for j, n in enumerate(SIZES)] for r in range(NRANKS)]
    payloads[1][2] = payloads[1][2].copy()
    payloads[1][2][-1] ^= 0xFF  # rank 1's payload of tensor 2: its CRC no longer holds
    result, header = bucket(payloads)
    _, flags, errors = decode("topk_coded", result, header)
    assert [bool(e) for e in errors] == [False, False, True, False]
    assert "rank 1" in errors[2], errors[2]
    bad = result.copy()
    bad[:4] = np.frombuffer(np.int32(len(result)).tobytes(), dtype=np.uint8)  # rank 0's first size past the end
    with pytest.raises(ValueError, match="bucket header's sizes pass the end"):
        decode("topk_coded", bad, header)
    with pytest.raises(ValueError, match="codec must be 'topk_coded' or 'ternary'"):
        decode("zip", result, header)
