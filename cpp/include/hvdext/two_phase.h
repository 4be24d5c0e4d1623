// Two-phase aggregation of ternary codes under a shared scale (TernGrad's scaler sharing makes codes summable):
// phase 1 alltoall of packed code chunks, an exact integer sum per chunk re-encoded at b = ceil(log2(2N+1)) bits,
// phase 2 allgather of the re-encoded chunks, decoded as out = float32(k) * s / divisor.
// The definition, to the bit, is python/hvdext_reference/two_phase.py.
#pragma once
#include <cstdint>
#include <vector>

#include "hvdext/ternary.h"

namespace hvdext {

// Fewest bits that hold the 2N + 1 levels of a sum of N ternary codes.
int two_phase_level_bits(int nranks);

// Bytes of a stream of `count` levels at `bits` bits each.
inline int64_t two_phase_stream_bytes(int64_t count, int bits) { return (count * bits + 7) / 8; }

// Chunks (rank j owns flat elements [floor(j*T/N), floor((j+1)*T/N))) are planned in Python, by
// horovod_ext/compressors/transports/two_phase.py, and passed here as counts and offsets.

// received: nranks packed code streams of the same `count` elements (ternary_packed_bytes(count, packing) bytes
// each, back to back: what one rank receives in phase 1). Writes the levels k + N of their exact sums as a
// little-endian bit stream of two_phase_stream_bytes(count, bits) bytes.
void ternary_sum_reencode(const uint8_t* received, int nranks, int64_t count, Packing packing, int bits,
                          uint8_t* stream);

// Elements [first, first + count) of a level stream: out[i] = float32(level - nranks) * scale / divisor.
void two_phase_decode(const uint8_t* stream, int64_t first, int64_t count, int nranks, int bits, float scale,
                      float divisor, float* out);

// "entropy" packing of the level streams (phase 2): the sums k = level - N as a sparse stream (positions of the
// non-zero sums, their signs, |k| - 1 Rice coded; hvdext/coding.h), framed: crc32 | u8 flag | varint bad | stream.
// flag 1 says this rank received a corrupted chunk in phase 1 from rank `bad`: every rank then fails together.
std::vector<uint8_t> two_phase_levels_encode(const uint8_t* stream, int64_t count, int nranks, int bits,
                                             int bad_rank);
// gathered: the N ranks' coded level streams (rank j's holds counts[j] levels), `bytes` in all. Writes the fixed
// level streams back to back (two_phase_stream_bytes(counts[j], bits) bytes each), which two_phase_decode reads.
// Throws CorruptPayload for a corrupted stream, or naming the phase-1 chunk a rank reported.
void two_phase_levels_decode(const uint8_t* gathered, int64_t bytes, const int64_t* counts, int nranks, int bits,
                             uint8_t* streams);

}  // namespace hvdext
