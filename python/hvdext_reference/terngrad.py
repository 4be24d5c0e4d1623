"""TernGrad: stochastic, unbiased ternary gradients (Wen et al., "TernGrad: Ternary Gradients to Reduce
Communication in Distributed Deep Learning", NeurIPS 2017). This module is the definition; cpp/ implements it.

Per tensor g (float32, n elements), on each rank:

1. Statistics, accumulated in float64 in the order of reduce.py (8 interleaved lanes per 4096-element block, the
   lanes combined as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), the blocks pairwise), so that every implementation,
   CPU or GPU, gets the same bits:
       mean = sum(g)/n,  sigma = sqrt(max(sum(g^2)/n - mean^2, 0)),  maxabs = max|g|.
   A rank whose gradient holds NaN or Inf is flagged (its scale becomes +inf, see below).
2. Clipping (paper, section 3.3): t = float32(c * sigma); g_c = clip(g, -t, t). c = 2.5 by default; clip=None, or
   sigma = 0 (a constant tensor has no outliers), disables it (t = +inf).
3. Scale: s = min(maxabs, t), the largest |g_c|. With a shared scale (paper, "scaler sharing") s is the max of
   every rank's s, so that the codes of all ranks sum exactly as integers.
4. Ternarize: p_k = |g_c,k| / s (float32), b_k = [u_k < p_k] with u_k the counter-based uniform of element k under
   the key (seed, step, tensor, rank) (see philox.py), and g~_k = s * sign(g_k) * b_k. Since P(b_k = 1) = p_k,
   E[g~_k] = g_c,k (unbiased) and Var[g~_k] = s|g_c,k| - g_c,k^2.
5. Pack the codes c_k in {0: zero, 1: +1, 2: -1}:
       "2bit":  4 codes per byte, element k at bits 2*(k mod 4) of byte k // 4  -> ceil(n/4) bytes;
       "base3": 5 codes per byte, byte = sum_j c_(5i+j) * 3^j (at most 242)      -> ceil(n/5) bytes, 1.6 bits/elem.
   The payload is the float32 scale (little-endian, 4 bytes) followed by the packed codes.
       "entropy": variable size, framed (coding.py): crc32 | float32 scale | mode | body; mode 0: the non-zero
       codes' positions and signs as a sparse stream (coding.py: n H_b(p) + nnz sign bits, about 2% over the
       codes' entropy), mode 1: the codes in base 3, where that is smaller (mostly non-zero codes).
6. Decode N payloads and average (divisor N for Average, 1 for Sum):
       if every rank sent the same scale s:  out_k = float32(sum_r v_r,k) * s / divisor  (exact integer sum);
       otherwise:                            out_k = (((s_0 v_0,k) + s_1 v_1,k) + ...) / divisor
                                             (float32, in rank order).
"""
import math

import numpy as np

from . import coding
from .philox import uniform01
from .reduce import LANES, block_tree_sum  # noqa: F401  (LANES: the lanes of the statistics)

PACKINGS = ("2bit", "base3", "entropy")
FIXED_PACKINGS = ("2bit", "base3")
MODE_SPARSE, MODE_BASE3 = 0, 1
HEADER_BYTES = 4  # the float32 scale
CODE_PLUS, CODE_MINUS = 1, 2


def gradient_stats(g):
    """(sum, sumsq, maxabs, finite) of a float32 vector, summed as the module docstring defines."""
    g = np.ascontiguousarray(g, dtype=np.float32).reshape(-1)
    n = g.size
    g64 = g.astype(np.float64)
    total, total_sq = block_tree_sum(g64), block_tree_sum(g64 * g64)
    finite = math.isfinite(total) and math.isfinite(total_sq)
    maxabs = np.float32(np.max(np.abs(g))) if (n and finite) else np.float32(0.0)
    return total, total_sq, maxabs, finite


def clip_threshold(total, total_sq, n, clip):
    """t = float32(clip * sigma); +inf when clipping is off or sigma is 0."""
    if clip is None or n == 0:
        return np.float32(np.inf)
    mean = total / n
    var = max(total_sq / n - mean * mean, 0.0)
    sigma = math.sqrt(var)
    if sigma == 0.0:
        return np.float32(np.inf)
    return np.float32(clip * sigma)


def local_scale(g, clip=2.5):
    """(threshold, scale) of one rank's tensor; scale = +inf flags a NaN/Inf gradient."""
    total, total_sq, maxabs, finite = gradient_stats(g)
    if not finite:
        return np.float32(np.inf), np.float32(np.inf)
    t = clip_threshold(total, total_sq, np.asarray(g).size, clip)
    return t, np.float32(min(maxabs, t))


def ternarize_codes(g, threshold, scale, seed, step, tensor, rank):
    """Codes in {0, 1 (+), 2 (-)} as uint8, one per element (steps 2 and 4)."""
    g = np.ascontiguousarray(g, dtype=np.float32).reshape(-1)
    n = g.size
    codes = np.zeros(n, dtype=np.uint8)
    if n == 0 or not (scale > 0) or not np.isfinite(scale):
        return codes
    gc = np.minimum(np.maximum(g, -threshold), threshold)
    p = np.abs(gc) / np.float32(scale)
    u = uniform01(n, seed, step, tensor, rank)
    keep = u < p
    codes[keep & (g > 0)] = CODE_PLUS
    codes[keep & (g < 0)] = CODE_MINUS
    return codes


def packed_bytes(n, packing):
    """Bytes of the packed codes of n elements (header excluded)."""
    check_packing(packing)
    return (n + 3) // 4 if packing == "2bit" else (n + 4) // 5


def check_packing(packing):
    if packing not in PACKINGS:
        raise ValueError(f"packing must be one of {PACKINGS}, got {packing!r}")


def pack(codes, packing):
    """Pack uint8 codes in {0, 1, 2} (step 5)."""
    check_packing(packing)
    codes = np.asarray(codes, dtype=np.uint8)
    n = codes.size
    per_byte, base = (4, 4) if packing == "2bit" else (5, 3)
    padded = np.zeros(packed_bytes(n, packing) * per_byte, dtype=np.uint32)
    padded[:n] = codes
    digits = padded.reshape(-1, per_byte)
    weights = np.array([base ** j for j in range(per_byte)], dtype=np.uint32)
    return (digits * weights).sum(axis=1).astype(np.uint8)


def unpack(packed, n, packing):
    """Inverse of pack: the n codes in {0, 1, 2}."""
    check_packing(packing)
    per_byte, base = (4, 4) if packing == "2bit" else (5, 3)
    b = np.asarray(packed, dtype=np.uint32).reshape(-1, 1)
    weights = np.array([base ** j for j in range(per_byte)], dtype=np.uint32)
    return ((b // weights) % base).astype(np.uint8).reshape(-1)[:n]


def codes_to_values(codes):
    """{0, 1, 2} -> {0, +1, -1} as int8."""
    return np.array([0, 1, -1], dtype=np.int8)[np.asarray(codes)]


def encode(g, clip=2.5, packing="base3", seed=0, step=0, tensor=0, rank=0, scale=None):
    """One rank's payload: float32 scale then packed codes. `scale` overrides the local scale (shared scale)."""
    g = np.ascontiguousarray(g, dtype=np.float32).reshape(-1)
    t, s = local_scale(g, clip)
    if scale is not None and np.isfinite(s):
        s = np.float32(scale)
    codes = ternarize_codes(g, t, s, seed, step, tensor, rank)
    if packing == "entropy":
        return entropy_payload(codes, s)
    return np.concatenate([np.array([s], dtype="<f4").view(np.uint8), pack(codes, packing)])


def entropy_payload(codes, scale):
    """The "entropy" payload of codes {0, 1, 2} under a scale (step 5)."""
    codes = np.asarray(codes, dtype=np.uint8)
    n = codes.size
    positions = np.flatnonzero(codes)
    stream = coding.write_sparse_stream(positions, n, coding.STREAM_BLOCK, signs=codes[positions] == CODE_MINUS)
    head = np.array([scale], dtype="<f4").tobytes()
    if len(stream) <= packed_bytes(n, "base3"):
        body = head + bytes([MODE_SPARSE]) + stream
    else:
        body = head + bytes([MODE_BASE3]) + pack(codes, "base3").tobytes()
    return np.frombuffer(coding.frame(body), dtype=np.uint8)


def entropy_codes(body, n, what="ternary payload"):
    """(scale, codes) of one unframed "entropy" payload."""
    if len(body) < 5 or body[4] not in (MODE_SPARSE, MODE_BASE3):
        raise coding.CorruptPayload(what)
    scale = np.frombuffer(body[:4], dtype="<f4")[0]
    rest = body[5:]
    if body[4] == MODE_BASE3:
        packed = np.frombuffer(rest, dtype=np.uint8)
        if packed.size != packed_bytes(n, "base3") or (packed > 242).any():
            raise coding.CorruptPayload(what)
        return scale, unpack(packed, n, "base3")
    positions, negative, _ = coding.read_sparse_stream(rest, n, coding.STREAM_BLOCK, signed=True, what=what)
    codes = np.zeros(n, dtype=np.uint8)
    codes[positions] = np.where(negative, CODE_MINUS, CODE_PLUS)
    return scale, codes


def split_payload(payload, n, packing):
    """(scale, values int8) of one payload."""
    if packing == "entropy":
        body, _ = coding.unframe(bytes(np.asarray(payload, dtype=np.uint8)), 0, "ternary payload", 0)
        scale, codes = entropy_codes(body, n)
        return scale, codes_to_values(codes)
    payload = np.asarray(payload, dtype=np.uint8)
    scale = payload[:HEADER_BYTES].view("<f4")[0]
    return scale, codes_to_values(unpack(payload[HEADER_BYTES:], n, packing))


def decode_average(payloads, n, packing, divisor):
    """Step 6 over a list of N payloads of the same tensor (or, "entropy", their concatenation: the framing walks
    it); returns float32 (n,)."""
    if packing == "entropy":
        return decode_average_entropy(b"".join(bytes(np.asarray(p, dtype=np.uint8)) for p in payloads),
                                      len(payloads), n, divisor)
    return average_values([split_payload(p, n, packing) for p in payloads], n, divisor)


def decode_average_entropy(gathered, nranks, n, divisor):
    """Step 6 over the concatenation of N "entropy" payloads (an allgather's output)."""
    parts = []
    for r, body in enumerate(coding.unframe_all(bytes(gathered), nranks, "ternary payload")):
        scale, codes = entropy_codes(body, n, f"ternary payload from rank {r} is malformed")
        parts.append((scale, codes_to_values(codes)))
    return average_values(parts, n, divisor)


def average_values(parts, n, divisor):
    """The average of N (scale, values) pairs, as step 6 defines it."""
    scales = [s for s, _ in parts]
    if not all(np.isfinite(s) for s in scales):
        bad = [r for r, s in enumerate(scales) if not np.isfinite(s)]
        raise FloatingPointError(f"ranks {bad} sent a NaN/Inf gradient")
    divisor = np.float32(divisor)
    if all(s == scales[0] for s in scales):
        k = np.zeros(n, dtype=np.int32)
        for _, v in parts:
            k += v
        return (k.astype(np.float32) * np.float32(scales[0])) / divisor
    acc = np.zeros(n, dtype=np.float32)
    for s, v in parts:
        acc += np.float32(s) * v.astype(np.float32)
    return acc / divisor
