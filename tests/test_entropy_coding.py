"""Entropy-coded payloads: the NumPy reference (python/hvdext_reference/coding.py and its users), the C++ kernels (the
PyTorch binding) and the TensorFlow ops give identical bytes, round-trip exactly, decode to the same bits as the fixed
packings, reject corrupted or truncated payloads, and code real gradients within 5% of their codes' entropy."""
import numpy as np
import pytest
import tensorflow as tf
import torch

from horovod_ext import _torch_ops as ops
from horovod_ext.tensorflow.kernels import lib
from hvdext_reference import coding, terngrad
from hvdext_reference import topk as rtopk
from hvdext_reference import two_phase as rtp

SIZES = [0, 1, 2, 3, 4, 5, 7, 999, 4000, 4001, 12345, (1 << 20) + 3]


def heavy_tailed(n, seed, density=1.0):
    rng = np.random.default_rng(seed)
    g = (rng.standard_t(3, n) * 1e-3).astype(np.float32)
    return g * (rng.random(n) < density)


def tf_bytes(t):
    return np.asarray(t.numpy(), dtype=np.uint8).tobytes()


def codes_payloads(codes, scale=1.0):
    """The payload of given codes from the reference, C++ and TensorFlow."""
    ref = terngrad.entropy_payload(codes, np.float32(scale)).tobytes()
    cpp = ops.ternary_codes_encode_entropy(torch.from_numpy(codes), scale).numpy().tobytes()
    tfo = tf_bytes(lib.hvdext_ternary_codes_encode_entropy(tf.constant(codes), tf.constant(scale, tf.float32)))
    return ref, cpp, tfo


# ----------------------------------------------------------------------------------------------- ternary
@pytest.mark.parametrize("n", SIZES)
def test_ternary_identical_bytes_and_exact_round_trip(n):
    g = heavy_tailed(n, n, density=0.7)
    t, s = terngrad.local_scale(g, 2.5)
    ref = terngrad.encode(g, 2.5, "entropy", seed=7, step=3, tensor=5, rank=1).tobytes()
    cpp = ops.ternary_encode_entropy(torch.from_numpy(g), float(t), float(s), 7, 3, 5, 1).numpy().tobytes()
    tfo = tf_bytes(lib.hvdext_ternary_encode_entropy(tf.constant(g), tf.constant(t), tf.constant(s),
                                                      tf.constant(7, tf.int64), tf.constant(3, tf.int64),
                                                      tensor_key=5, rank=1))
    assert ref == cpp == tfo
    codes = terngrad.ternarize_codes(g, t, s, 7, 3, 5, 1)
    body, _ = coding.unframe(ref, 0, "payload", 0)
    assert np.array_equal(terngrad.entropy_codes(body, n)[1], codes)


@pytest.mark.parametrize("shared", [True, False])
def test_ternary_decode_equals_fixed_packing(shared):
    """Three ranks' payloads: the average is the same to the bit as base3's, in C++, TensorFlow and the reference."""
    n = 30011
    grads = [heavy_tailed(n, 100 + r) for r in range(3)]
    scales = [terngrad.local_scale(g, 2.5) for g in grads]
    common = max(s for _, s in scales)
    coded, fixed = [], []
    for r, g in enumerate(grads):
        scale = common if shared else None
        coded.append(terngrad.encode(g, 2.5, "entropy", seed=1, step=2, tensor=3, rank=r, scale=scale))
        fixed.append(terngrad.encode(g, 2.5, "base3", seed=1, step=2, tensor=3, rank=r, scale=scale))
    want = terngrad.decode_average(fixed, n, "base3", 3.0)
    gathered = np.concatenate(coded)
    out = torch.empty(n)
    assert ops.ternary_decode_average_entropy(torch.from_numpy(gathered), 3, n, 3.0, out) == -1
    avg, bad = lib.hvdext_ternary_decode_average_entropy(tf.constant(gathered), nranks=3, count=n, divisor=3.0)
    ref = terngrad.decode_average_entropy(gathered, 3, n, 3.0)
    for got in (out.numpy(), avg.numpy(), ref):
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert int(bad) == -1


@pytest.mark.parametrize("case", ["all_zero", "all_plus", "all_minus", "alternating", "single_first", "single_last",
                                  "single_middle", "dense_random"])
@pytest.mark.parametrize("n", [1, 5, 4000, 4001, 100003])
def test_ternary_adversarial_codes(case, n):
    """Frequency tables with one symbol, every code non-zero (the base-3 fallback), single non-zeros at both ends."""
    codes = np.zeros(n, dtype=np.uint8)
    if case == "all_plus":
        codes[:] = 1
    elif case == "all_minus":
        codes[:] = 2
    elif case == "alternating":
        codes[::2] = 1
        codes[1::2] = 2
    elif case == "single_first":
        codes[0] = 2
    elif case == "single_last":
        codes[-1] = 1
    elif case == "single_middle":
        codes[n // 2] = 1
    elif case == "dense_random":
        codes[:] = np.random.default_rng(n).integers(0, 3, n)
    ref, cpp, tfo = codes_payloads(codes)
    assert ref == cpp == tfo
    body, _ = coding.unframe(ref, 0, "payload", 0)
    assert np.array_equal(terngrad.entropy_codes(body, n)[1], codes)
    # never larger than the base-3 packing plus the frame
    assert len(ref) <= 14 + terngrad.packed_bytes(n, "base3")
    out = torch.empty(n)
    ops.ternary_decode_average_entropy(torch.from_numpy(np.frombuffer(ref, np.uint8).copy()), 1, n, 1.0, out)
    assert np.array_equal(out.numpy(), terngrad.codes_to_values(codes).astype(np.float32))


def test_nonfinite_scale_is_reported_not_decoded():
    g = np.ones(5000, np.float32)
    g[3] = np.nan
    t, s = terngrad.local_scale(g, 2.5)
    payload = ops.ternary_encode_entropy(torch.from_numpy(g), float(t), float(s), 1, 1, 1, 0)
    good = ops.ternary_encode_entropy(torch.ones(5000), 1.0, 1.0, 1, 1, 1, 1)
    out = torch.zeros(5000)
    assert ops.ternary_decode_average_entropy(torch.cat([good, payload]), 2, 5000, 2.0, out) == 1


# ------------------------------------------------------------------------------------------------- top-k
@pytest.mark.parametrize("value_dtype", ["fp16", "fp32", "ternary"])
@pytest.mark.parametrize("n,k", [(1, 1), (2, 2), (5, 1), (5, 5), (4001, 40), ((1 << 20) + 3, 10486)])
def test_topk_identical_bytes_residuals_and_decode(value_dtype, n, k):
    ids = {"fp16": 0, "fp32": 1, "ternary": 2}
    g = heavy_tailed(n, k)
    g[0], g[-1] = 10.0, -10.0  # indices at both ends of the tensor
    idx, values, r_new = rtopk.ef_step(g, np.zeros(n, np.float32), k, value_dtype)
    ref = rtopk.encode_delta(idx, values, n, value_dtype).tobytes()
    x = torch.from_numpy(g.copy())
    cpp = ops.topk_extract_coded(x, torch.from_numpy(idx), ids[value_dtype]).numpy().tobytes()
    payload, residual = lib.hvdext_topk_extract_coded(tf.constant(g), tf.constant(idx), value_type=ids[value_dtype])
    assert ref == cpp == tf_bytes(payload)
    assert np.array_equal(x.numpy().view(np.uint32), r_new.view(np.uint32))
    assert np.array_equal(residual.numpy().view(np.uint32), r_new.view(np.uint32))
    gathered = np.frombuffer(ref + ref, np.uint8).copy()
    out = torch.empty(n)
    ops.topk_decode_average_coded(torch.from_numpy(gathered), 2, n, 2.0, out)
    avg, _ = lib.hvdext_topk_decode_average_coded(tf.constant(gathered), nranks=2, count=n, divisor=2.0)
    want = rtopk.decode_average_delta(gathered, 2, n, 2.0)
    if value_dtype != "ternary":  # the same bits as the int32 packing
        fixed = rtopk.encode(idx, values)
        assert np.array_equal(want, rtopk.decode_average([fixed, fixed], n, k, value_dtype, 2.0))
    assert np.array_equal(out.numpy(), want) and np.array_equal(avg.numpy(), want)


def test_topk_delta_bits_per_element():
    """At 1% of a 1M tensor: indices about log2(100) + 1.5 bits; fp16 values under 0.35 and ternary under 0.12
    bits per element (the issue's goals)."""
    n = 1 << 20
    g = heavy_tailed(n, 3)
    for value_dtype, goal in (("fp16", 0.35), ("ternary", 0.12)):
        idx, values, _ = rtopk.ef_step(g, np.zeros(n, np.float32), n // 100, value_dtype)
        x = torch.from_numpy(g.copy())
        payload = ops.topk_extract_coded(x, torch.from_numpy(idx), {"fp16": 0, "ternary": 2}[value_dtype])
        assert 8 * payload.numel() / n <= goal, (value_dtype, 8 * payload.numel() / n)


# --------------------------------------------------------------------------------------------- two-phase
@pytest.mark.parametrize("nranks", [2, 3, 8])
def test_two_phase_levels_identical_and_exact(nranks):
    counts = [0, 1, 4000, 4001, 9999][:nranks] + [777] * max(0, nranks - 5)
    bits = rtp.level_bits(nranks)
    rng = np.random.default_rng(nranks)
    sums, coded_ref, coded_cpp = [], [], []
    for count in counts:
        k = rng.binomial(nranks, 0.15, count) - rng.binomial(nranks, 0.15, count)
        sums.append(k)
        fixed = rtp.reencode(k, nranks, bits)
        coded_ref.append(rtp.encode_levels_entropy(k))
        coded_cpp.append(ops.two_phase_levels_encode(torch.from_numpy(fixed), len(k), nranks, bits, -1)
                         .numpy().tobytes())
        tfo = lib.hvdext_two_phase_levels_encode(tf.constant(fixed), tf.constant(-1), count=len(k), nranks=nranks,
                                                 bits=bits)
        assert coded_ref[-1] == coded_cpp[-1] == tf_bytes(tfo)
    gathered = b"".join(coded_ref)
    decoded = rtp.decode_levels_entropy(gathered, counts, nranks)
    assert all(np.array_equal(a, b) for a, b in zip(decoded, sums))
    streams = ops.two_phase_levels_decode(torch.from_numpy(np.frombuffer(gathered, np.uint8).copy()), counts, bits)
    assert streams.numpy().tobytes() == b"".join(rtp.reencode(k, nranks, bits).tobytes() for k in sums)


def test_two_phase_chunk_corruption_is_passed_on_to_every_rank():
    """A corrupted phase-1 chunk is seen by one rank only: it is flagged in that rank's stream, and every rank's
    decode of the gathered streams fails naming it."""
    codes = np.random.default_rng(0).integers(0, 3, 5000).astype(np.uint8)
    chunk = bytearray(ops.ternary_codes_encode_entropy(torch.from_numpy(codes), 1.0).numpy().tobytes())
    good = bytes(chunk)
    chunk[len(chunk) // 2] ^= 0x10
    received = torch.from_numpy(np.frombuffer(good + bytes(chunk), np.uint8).copy())
    packed, bad = ops.ternary_entropy_to_packed(received, 2, 5000, 1)
    assert bad == 1
    bits = rtp.level_bits(2)
    flagged = ops.two_phase_levels_encode(torch.zeros(rtp.stream_bytes(5000, bits), dtype=torch.uint8), 5000, 2,
                                          bits, bad)
    with pytest.raises(ValueError, match="two-phase chunk from rank 1 to rank 0 is corrupted"):
        ops.two_phase_levels_decode(flagged, [5000], bits)


# -------------------------------------------------------------------------------------------- corruption
def corruptions(payload):
    """Every single-byte change at a spread of positions, truncations and an extension."""
    out = []
    for pos in sorted(set(np.linspace(0, len(payload) - 1, 40).astype(int))):
        for flip in (0x01, 0x80):
            bad = bytearray(payload)
            bad[pos] ^= flip
            out.append(bytes(bad))
    out += [payload[:-1], payload[:len(payload) // 2], payload[:1], payload + b"\x00"]
    return out


# each payload kind's decoders: PyTorch's op, TensorFlow's op and the reference, all (gathered, nranks, n, divisor)
DECODERS = {
    "ternary": (ops.ternary_decode_average_entropy, lib.hvdext_ternary_decode_average_entropy,
                terngrad.decode_average_entropy),
    "topk": (ops.topk_decode_average_coded, lib.hvdext_topk_decode_average_coded, rtopk.decode_average_delta),
}


@pytest.mark.parametrize("kind", ["ternary", "topk"])
def test_corrupted_or_truncated_payloads_raise_everywhere(kind):
    n = 20000
    g = heavy_tailed(n, 5)
    if kind == "ternary":
        payload = terngrad.encode(g, 2.5, "entropy", seed=1, step=1, tensor=1, rank=0).tobytes()
    else:
        idx, values, _ = rtopk.ef_step(g, np.zeros(n, np.float32), 200, "fp16")
        payload = rtopk.encode_delta(idx, values, n, "fp16").tobytes()
    torch_op, tf_op, ref = DECODERS[kind]

    def torch_decode(b):
        torch_op(torch.from_numpy(np.frombuffer(b, np.uint8).copy()), 1, n, 1.0, torch.empty(n))

    def tf_decode(b):
        tf_op(tf.constant(np.frombuffer(b, np.uint8)), nranks=1, count=n, divisor=1.0)

    def ref_decode(b):
        ref(b, 1, n, 1.0)

    for bad in corruptions(payload):
        with pytest.raises(ValueError, match="payload"):
            torch_decode(bad)
        with pytest.raises(tf.errors.InvalidArgumentError, match="payload"):
            tf_decode(bad)
        with pytest.raises(coding.CorruptPayload):
            ref_decode(bad)


# ------------------------------------------------------------------------------------------- information
def digits_gradients(steps=30):
    """The real gradients of the digits MLP (examples/pytorch_digits.py's model) over a few steps of training."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                                torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    for step in range(steps):
        batch = slice(32 * step, 32 * step + 32)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
        grads.append([p.grad.detach().reshape(-1).clone() for p in model.parameters() if p.numel() >= 1024])
        opt.step()
    return grads


def empirical_entropy_bits(codes):
    counts = np.bincount(codes, minlength=3)[:3]
    p = counts[counts > 0] / codes.size
    return codes.size * float(-(p * np.log2(p)).sum())


@pytest.mark.parametrize("clip", [2.5, None])
def test_coded_size_within_5_percent_of_the_codes_entropy(clip):
    coded = entropy = 0.0
    for step, grads in enumerate(digits_gradients()):
        for tensor, g in enumerate(grads):
            t, s = ops.ternary_local_scale(g, 0.0 if clip is None else clip, 0)
            codes = torch.empty(g.numel(), dtype=torch.uint8)
            ops.ternary_encode_codes(g, t, s, 11, step, tensor, 0, codes)
            coded += 8 * ops.ternary_encode_entropy(g, t, s, 11, step, tensor, 0).numel()
            entropy += empirical_entropy_bits(codes.numpy())
    assert coded <= 1.05 * entropy, coded / entropy
