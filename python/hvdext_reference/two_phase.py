"""Two-phase aggregation of ternary codes with a shared scale: bytes per rank that grow with log N, not N.

TernGrad's scaler sharing (Wen et al. 2017) gives every rank the same scale s_t per tensor, so the sum of all ranks'
decoded values is s_t * k with k = sum_r v_r an integer in [-N, N]. This module defines how the transport sums the
codes in the integer domain; the C++ kernels (cpp/include/hvdext/two_phase.h) match it bit for bit.

Layout: the step's compressed tensors, in parameter order, form one flat stream of T codes (terngrad.py's codes
{0, 1: +1, 2: -1}, drawn with each tensor's own key). Rank j owns the chunk [bounds[j], bounds[j+1]) with
bounds[j] = floor(j * T / N) (chunks differ by at most one element).

  phase 1  every rank packs its codes of chunk j ("2bit" or "base3", as terngrad.pack, per chunk) and sends it to
           rank j: one alltoall.
  sum      rank j adds the N code streams of its chunk: k in [-N, N], exact; it re-encodes level = k + N at
           b = ceil(log2(2N + 1)) bits (3 bits for N = 2 or 3, 4 up to N = 7, 8 up to N = 127), as a little-endian
           bit stream: bit t of element i is bit (i*b + t) % 8 of byte (i*b + t) // 8.
  phase 2  one allgather of the re-encoded chunks; every rank decodes the whole stream and writes
           out = float32(k) * s_t / divisor, the same formula as terngrad.decode_average with equal scales, so
           both transports give the same bits.

"entropy" packing: phase-1 chunks are terngrad's "entropy" payloads of the chunk's codes (scale 1.0), and the
re-encoded sums travel as a sparse stream (coding.py: positions of the non-zero sums, their signs, |k| - 1 Rice
coded), framed as crc32 | u8 flag | varint rank | stream; flag 1 (no stream) says that the chunk this rank
received from `rank` in phase 1 was corrupted, so that every rank fails the step together.

Bytes each rank sends (ring algorithms): alltoall (N-1)/N * T * packing_bits/8, allgather (N-1) * T/N * b/8; the
allgather transport sends (N-1) * T * packing_bits/8.
"""
import math

import numpy as np

from . import coding, terngrad


def chunk_bounds(total, nranks):
    return [(j * total) // nranks for j in range(nranks + 1)]


def level_bits(nranks):
    """Fewest bits that hold the 2N + 1 levels of a sum of N ternary codes."""
    return max(1, math.ceil(math.log2(2 * nranks + 1)))


CODES_PER_BYTE = {"2bit": 4, "base3": 5}


def formula_wire_bytes(total, nranks, packing):
    """Closed form of what a rank sends by two-phase for T elements: (N-1)/N * T/codes_per_byte (alltoall) plus
    (N-1) * T/N * b/8 (allgather). Counts differ from it only by the rounding of each chunk to whole bytes."""
    return (nranks - 1) / nranks * total / CODES_PER_BYTE[packing] \
        + (nranks - 1) * total / nranks * level_bits(nranks) / 8


def stream_bytes(count, bits):
    return (count * bits + 7) // 8


def reencode(k, nranks, bits=None):
    """Sums k in [-N, N] as a b-bit little-endian bit stream of levels k + N."""
    bits = bits or level_bits(nranks)
    levels = (np.asarray(k, dtype=np.int64) + nranks).astype(np.uint64)
    if levels.size and (levels.max() >= 2 ** bits):
        raise ValueError(f"levels do not fit in {bits} bits")
    planes = ((levels[:, None] >> np.arange(bits, dtype=np.uint64)) & np.uint64(1)).astype(np.uint8)
    return np.packbits(planes.reshape(-1), bitorder="little")


def decode_levels(stream, count, nranks, bits=None, first=0):
    """The sums k of elements [first, first + count) of a re-encoded stream."""
    bits = bits or level_bits(nranks)
    all_bits = np.unpackbits(np.asarray(stream, dtype=np.uint8), bitorder="little")
    planes = all_bits[first * bits:(first + count) * bits].reshape(count, bits).astype(np.int64)
    return (planes << np.arange(bits)).sum(axis=1) - nranks


def sum_codes(packed_streams, count, packing):
    """k = sum over ranks of the values of each rank's packed codes of one chunk."""
    k = np.zeros(count, dtype=np.int64)
    for packed in packed_streams:
        k += terngrad.codes_to_values(terngrad.unpack(packed, count, packing))
    return k


def two_phase_average(codes_per_rank, sizes, scales, packing, divisor):
    """The whole transport over N ranks' flat code streams; returns one float32 array per tensor.

    codes_per_rank: N uint8 arrays of T codes each; sizes: elements per tensor (sum T); scales: the shared scale of
    each tensor.
    """
    nranks = len(codes_per_rank)
    total = int(sum(sizes))
    bounds = chunk_bounds(total, nranks)
    bits = level_bits(nranks)
    gathered = []
    for j in range(nranks):  # what rank j receives in phase 1, sums and sends in phase 2
        lo, hi = bounds[j], bounds[j + 1]
        received = [terngrad.pack(codes[lo:hi], packing) for codes in codes_per_rank]
        gathered.append(reencode(sum_codes(received, hi - lo, packing), nranks, bits))
    k = np.concatenate([decode_levels(gathered[j], bounds[j + 1] - bounds[j], nranks, bits)
                        for j in range(nranks)])
    out, offset = [], 0
    for n, s in zip(sizes, scales):
        out.append((k[offset:offset + n].astype(np.float32) * np.float32(s)) / np.float32(divisor))
        offset += n
    return out


def encode_levels_entropy(k, bad_rank=-1):
    """The "entropy" phase-2 stream of one chunk's sums k (or the flag of a corrupted phase-1 chunk)."""
    k = np.asarray(k, dtype=np.int64)
    if bad_rank >= 0:
        return coding.frame(bytes([1]) + coding.put_varint(bad_rank))
    positions = np.flatnonzero(k)
    stream = coding.write_sparse_stream(positions, k.size, coding.STREAM_BLOCK, signs=k[positions] < 0,
                                        magnitudes=np.abs(k[positions]))
    return coding.frame(bytes([0]) + coding.put_varint(0) + stream)


def decode_levels_entropy(gathered, counts, nranks):
    """The sums k of every rank's chunk, from the concatenation of the N phase-2 streams."""
    out = []
    for j, body in enumerate(coding.unframe_all(bytes(gathered), len(counts), "two-phase level stream")):
        what = f"two-phase level stream from rank {j} is malformed"
        if len(body) < 2 or body[0] > 1:
            raise coding.CorruptPayload(what)
        bad, used = coding.get_varint(body, 1, what)
        if body[0] == 1:
            raise coding.CorruptPayload(f"two-phase chunk from rank {bad} to rank {j} is corrupted (phase 1)")
        positions, negative, magnitudes = coding.read_sparse_stream(body[1 + used:], counts[j], coding.STREAM_BLOCK,
                                                                    signed=True, magnitudes=True, what=what)
        if (magnitudes > nranks).any():
            raise coding.CorruptPayload(what)
        k = np.zeros(counts[j], dtype=np.int64)
        k[positions] = np.where(negative, -magnitudes, magnitudes)
        out.append(k)
    return out
