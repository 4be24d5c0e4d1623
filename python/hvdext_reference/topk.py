"""Top-k sparsification with error feedback (Stich et al. 2018; Lin et al., "Deep Gradient Compression", 2018), the
definition the C++ kernels match bit for bit.

Per tensor g (float32, n elements) with residual r (initially 0):
    g_ef = g + r                                  (float32)
    I    = the k indices of largest |g_ef|, k = k_of(n, cf) = max(1, ceil(n / cf)); ties go to the lower index,
           and the order is that of the float32 bit patterns of |g_ef| (NaN above Inf above every finite value);
           I is returned in ascending order
    sent = value_dtype(g_ef[I])                   (fp16 rounds to nearest even, as NumPy's astype)
    r    = g_ef - sent on I, g_ef elsewhere       (so sent + r == g_ef exactly: nothing is lost, only delayed)
Payload: k int32 indices (little-endian) then k values (fp16 or fp32). Decode N payloads: out = 0, then for each
rank in order out[I_r] += float32(values_r), then out / divisor.

"delta" payload (variable size, framed as in coding.py): crc32 | u8 value type (0 fp16, 1 fp32, 2 ternary) |
varint k | values | the indices as a sparse stream (Rice-coded gaps, about log2(n / k) + 1.5 bits each). Values: k
fp16 or fp32 as above, or "ternary" (Sattler et al. 2019, sparse ternary compression): one float32 magnitude
    mu = float32(sum_{i in I} |g_ef[i]| / k)      (float64, in index order)
and a sign bit per index in the stream (1: g_ef[i] < 0; -0.0 is positive); sent = +-mu, r = g_ef - sent on I.

Multi-level (GraVAC): the top-k2 of the top-k1 set is the top-k2 of the whole tensor when k2 <= k1, with the same
tie rule, so compressing at theta1 then recompressing by theta2 equals compressing once at theta1 * theta2.
"""
import math

import numpy as np

from . import coding

VALUE_DTYPES = {"fp16": np.float16, "fp32": np.float32}
VALUE_TYPE_IDS = {"fp16": 0, "fp32": 1, "ternary": 2}


def k_of(n, cf):
    return max(1, math.ceil(n / cf))


def order_keys(x):
    """uint64 keys: |x|'s float32 bits above, the complement of the index below (larger key = kept first)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = (x.view(np.uint32) & np.uint32(0x7FFFFFFF)).astype(np.uint64)
    idx = np.arange(x.size, dtype=np.uint64)
    return (bits << np.uint64(32)) | (np.uint64(0xFFFFFFFF) - idx)


def select(x, k, candidates=None):
    """The top-k indices (ascending) of x, or of x restricted to `candidates` (ascending indices)."""
    keys = order_keys(x)
    pool = np.arange(x.size) if candidates is None else np.asarray(candidates)
    if k >= pool.size:
        return np.sort(pool).astype(np.int32)
    top = pool[np.argpartition(keys[pool], pool.size - k)[pool.size - k:]]
    return np.sort(top).astype(np.int32)


def ef_step(g, r, k, value_dtype="fp16"):
    """(indices, sent values, new residual) of one error-feedback top-k step."""
    g_ef = np.asarray(g, dtype=np.float32) + np.asarray(r, dtype=np.float32)
    idx = select(g_ef, k)
    if value_dtype == "ternary":
        mu = ternary_magnitude(g_ef[idx])
        values = np.where(g_ef[idx] < 0, -mu, mu).astype(np.float32)
        r_new = g_ef.copy()
        r_new[idx] = g_ef[idx] - values
        return idx, values, r_new
    values = g_ef[idx].astype(VALUE_DTYPES[value_dtype])
    r_new = g_ef.copy()
    r_new[idx] = g_ef[idx] - values.astype(np.float32)
    return idx, values, r_new


def encode(idx, values):
    return np.concatenate([np.asarray(idx, dtype="<i4").view(np.uint8), np.asarray(values).view(np.uint8)])


def payload_bytes(k, value_dtype):
    return k * (4 + np.dtype(VALUE_DTYPES[value_dtype]).itemsize)


def decode_average(payloads, n, k, value_dtype, divisor):
    out = np.zeros(n, dtype=np.float32)
    vdt = np.dtype(VALUE_DTYPES[value_dtype]).newbyteorder("<")
    for p in payloads:
        p = np.asarray(p, dtype=np.uint8)
        idx = p[:4 * k].view("<i4")
        values = p[4 * k:].view(vdt).astype(np.float32)
        np.add.at(out, idx, values)  # indices are distinct within a payload
    return out / np.float32(divisor)


def ternary_magnitude(selected):
    """mu = float32(sum |v| / k), summed in float64 in index order."""
    total = np.cumsum(np.abs(np.asarray(selected, dtype=np.float32).astype(np.float64)))[-1]  # sequential
    return np.float32(total / len(selected))


def encode_delta(idx, values, n, value_dtype):
    """The "delta" payload of ascending indices and their sent values (ternary: +-mu, as ef_step returns)."""
    idx = np.asarray(idx, dtype=np.int64)
    head = bytes([VALUE_TYPE_IDS[value_dtype]]) + coding.put_varint(idx.size)
    if value_dtype == "ternary":
        values = np.asarray(values, dtype=np.float32)
        mu = np.abs(values[0]) if values.size else np.float32(0)
        head += np.array([mu], dtype="<f4").tobytes()
        stream = coding.write_sparse_stream(idx, n, 0, signs=values < 0)
    else:
        head += np.asarray(values, dtype=np.dtype(VALUE_DTYPES[value_dtype]).newbyteorder("<")).tobytes()
        stream = coding.write_sparse_stream(idx, n, 0)
    return np.frombuffer(coding.frame(head + stream), dtype=np.uint8)


def decode_average_delta(gathered, nranks, n, divisor):
    """out[I_r] += values_r in rank order, / divisor, over the concatenation of N "delta" payloads."""
    bodies = coding.unframe_all(bytes(gathered), nranks, "top-k payload")
    out = np.zeros(n, dtype=np.float32)
    for r, body in enumerate(bodies):
        what = f"top-k payload from rank {r} is malformed"
        if len(body) < 2 or body[0] > 2:
            raise coding.CorruptPayload(what)
        kind = body[0]
        k, used = coding.get_varint(body, 1, what)
        if not 0 <= k <= n:  # an empty payload: a region of sparse_reduce with none of its indices
            raise coding.CorruptPayload(what)
        at = 1 + used
        if kind == 2:
            area = 4
        else:
            area = k * (2 if kind == 0 else 4)
        if len(body) - at < area:
            raise coding.CorruptPayload(what)
        positions, negative, _ = coding.read_sparse_stream(body[at + area:], n, 0, signed=kind == 2, what=what)
        if positions.size != k:
            raise coding.CorruptPayload(what)
        if kind == 2:
            mu = np.frombuffer(body[at:at + 4], dtype="<f4")[0]
            values = np.where(negative, -mu, mu).astype(np.float32)
        else:
            values = np.frombuffer(body[at:at + area], dtype="<f2" if kind == 0 else "<f4").astype(np.float32)
        np.add.at(out, positions, values)
    return out / np.float32(divisor)
