"""Entropy coding of sparse streams: the definition of cpp/include/hvdext/coding.h, to the byte.

A sparse stream says which of n positions are non-zero and what is there. The positions are cut into blocks of B
(the last one shorter; B = n: one block), each coded alone:

    k (6 bits), then k2 (6 bits) in a stream with magnitudes;
    the block's non-zero positions p_0 < ... < p_(m-1) (relative to the block) as gaps d_i = p_i - p_(i-1) - 1
    (p_(-1) = -1), then the terminator d_m = B - p_(m-1) - 1, each Golomb-Rice coded with the block's k
    (Golomb 1966; Rice 1979):
        rice_k(d) = floor(d / 2^k) zero bits, a one bit, the k low bits of d;
    after each position's gap (not the terminator's): a sign bit (1: negative) in a signed stream, and
    |v| - 1 Rice coded with k2 in a stream with magnitudes.

All blocks form one bit stream, least significant bit first, padded with zeros to a byte. A block's k is the one of
fewest bits, sum_i floor(d_i / 2^k) + (m + 1)(k + 1), among floor(log2(mean + 1)) - 1 .. + 2 (mean: the integer
mean of d_0..d_m; k2 likewise over |v| - 1): for geometric gaps (independent non-zeros) that costs within about 2%
of their entropy (Gallager & van Voorhis 1975), and a k per block follows a density that changes along the tensor.
Ternary codes (B = 4000) then take n H_b(p) + m sign bits, about 2% over the entropy of the codes; top-k's indices
(one block) log2(n / k) + 1.5 bits each.

A payload is framed as u32 L | crc32 of the next L - 4 bytes | those bytes (little-endian; zlib's CRC-32), so that
a concatenation is walked without sizes and corruption or truncation is detected.
"""
import zlib

import numpy as np

MAX_RICE_PARAMETER = 40


class CorruptPayload(ValueError):
    """A payload that fails its CRC, its framing or its stream's structure."""


def put_varint(value):
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def get_varint(buf, offset, what):
    """(value, bytes used) of the varint at buf[offset]."""
    value = 0
    for i in range(9):
        if offset + i >= len(buf):
            raise CorruptPayload(what)
        byte = buf[offset + i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value, i + 1
    raise CorruptPayload(what)


def frame(body):
    """u32 len | crc32 | body."""
    body = bytes(body)
    return (len(body) + 4).to_bytes(4, "little") + (zlib.crc32(body) & 0xFFFFFFFF).to_bytes(4, "little") + body


def unframe(buf, offset, what, rank):
    """(body, offset of the next payload) of the framed payload at buf[offset]."""
    where = f"{what} from rank {rank}"
    if offset >= len(buf):
        raise CorruptPayload(f"{where} is missing (the gathered payloads are truncated)")
    if len(buf) - offset < 8:
        raise CorruptPayload(f"{where} is truncated")
    length = int.from_bytes(bytes(buf[offset:offset + 4]), "little")
    start = offset + 4
    if length < 4 or length > len(buf) - start:
        raise CorruptPayload(f"{where} is truncated or has a bad length")
    body = bytes(buf[start + 4:start + length])
    if zlib.crc32(body) & 0xFFFFFFFF != int.from_bytes(bytes(buf[start:start + 4]), "little"):
        raise CorruptPayload(f"{where} is corrupted (CRC-32 mismatch)")
    return body, start + length


def unframe_all(buf, nranks, what):
    """The nranks bodies of a concatenation, which they must fill exactly."""
    bodies, offset = [], 0
    for r in range(nranks):
        body, offset = unframe(buf, offset, what, r)
        bodies.append(body)
    if offset != len(buf):
        raise CorruptPayload(f"{what}: {len(buf) - offset} bytes follow the last rank's payload")
    return bodies


STREAM_BLOCK = 4000  # positions per block of ternary codes and two-phase sums


def best_rice_parameter(values):
    """The k of fewest bits over values (terminator included by the caller), searched as the docstring says."""
    values = np.asarray(values, dtype=np.uint64)
    if values.size == 0:
        return 0
    mean = int(values.sum()) // values.size
    guess = (mean + 1).bit_length() - 1
    best, best_bits = 0, None
    for k in range(max(0, guess - 1), min(MAX_RICE_PARAMETER, guess + 2) + 1):
        bits = int((values >> np.uint64(k)).sum()) + values.size * (k + 1)
        if best_bits is None or bits < best_bits:
            best, best_bits = k, bits
    return best


def _put(bits, at, value, width):
    """Write `width` low bits of value (an int or an array, at positions `at`) into the bit array."""
    for b in range(width):
        bits[at + b] = (np.asarray(value, dtype=np.uint64) >> np.uint64(b)) & np.uint64(1)


def _block_bits(offsets, size, signs, magnitudes):
    """The bits (uint8 0/1 array) of one block."""
    m = offsets.size
    d = (np.diff(np.concatenate([[-1], offsets, [size]])) - 1).astype(np.uint64)
    k = best_rice_parameter(d)
    header = [(k, 6)]
    lengths = (d >> np.uint64(k)).astype(np.int64) + 1 + k
    ones = (d >> np.uint64(k)).astype(np.int64)
    if signs is not None:
        lengths[:m] += 1
    if magnitudes is not None:
        extra = np.asarray(magnitudes, dtype=np.uint64) - np.uint64(1)
        k2 = best_rice_parameter(extra)
        header.append((k2, 6))
        extra_ones = (extra >> np.uint64(k2)).astype(np.int64)
        lengths[:m] += extra_ones + 1 + k2
    head = sum(w for _, w in header)
    starts = head + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    bits = np.zeros(head + int(lengths.sum()), dtype=np.uint8)
    at = 0
    for value, width in header:
        _put(bits, at, value, width)
        at += width
    bits[starts + ones] = 1
    _put(bits, starts + ones + 1, d, k)
    after = (starts + ones + 1 + k)[:m]
    if signs is not None:
        bits[after] = np.asarray(signs, dtype=np.uint8)
        after = after + 1
    if magnitudes is not None:
        bits[after + extra_ones] = 1
        _put(bits, after + extra_ones + 1, extra, k2)
    return bits


def write_sparse_stream(positions, n, block=0, signs=None, magnitudes=None):
    """The stream of sorted positions in [0, n) in blocks of `block` (0: one block), with signs (True: negative)
    and magnitudes (>= 1)."""
    positions = np.asarray(positions, dtype=np.int64)
    block = n if block <= 0 or block > n else block
    parts = []
    for start in range(0, n, max(block, 1)):
        size = min(block, n - start)
        lo, hi = np.searchsorted(positions, [start, start + size])
        parts.append(_block_bits(positions[lo:hi] - start, size, None if signs is None else np.asarray(signs)[lo:hi],
                                 None if magnitudes is None else np.asarray(magnitudes)[lo:hi]))
    bits = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint8)
    return np.packbits(bits, bitorder="little").tobytes()


def read_sparse_stream(buf, n, block=0, signed=False, magnitudes=False, what="stream"):
    """(positions, signs, magnitudes) of a stream whose blocks must each end exactly at their size, and which must
    end at the end of buf."""
    bits = np.unpackbits(np.frombuffer(bytes(buf), dtype=np.uint8), bitorder="little").tobytes()
    total = len(bits)
    pos = 0

    def get(width):
        nonlocal pos
        if pos + width > total:
            raise CorruptPayload(what)
        value = 0
        for b in range(width):
            value |= bits[pos + b] << b
        pos += width
        return value

    def rice(k):
        nonlocal pos
        one = bits.find(b"\x01", pos)
        if one < 0:
            raise CorruptPayload(what)
        q = one - pos
        pos = one + 1
        return (q << k) | get(k)

    positions, signs, mags = [], [], []
    block = n if block <= 0 or block > n else block
    for start in range(0, n, max(block, 1)):
        size = min(block, n - start)
        k = get(6)
        k2 = get(6) if magnitudes else 0
        if k > MAX_RICE_PARAMETER or k2 > MAX_RICE_PARAMETER:
            raise CorruptPayload(what)
        position = -1
        while True:
            d = rice(k)
            if d > size - position - 1:
                raise CorruptPayload(what)
            position += d + 1
            if position == size:
                break
            if signed:
                signs.append(get(1))
            mags.append(rice(k2) + 1 if magnitudes else 1)
            positions.append(start + position)
    if total - pos >= 8 or any(bits[pos:]):
        raise CorruptPayload(what)
    return (np.array(positions, dtype=np.int64), np.array(signs, dtype=bool) if signed else None,
            np.array(mags, dtype=np.int64))
