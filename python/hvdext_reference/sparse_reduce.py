"""sparse_reduce: top-k aggregation whose bytes per rank do not grow with the number of ranks (Ok-Topk's sparse
allreduce, Li & Hoefler, PPoPP 2022, in horovod_ext's form), the definition the plan matches bit for bit
(horovod_ext/compressors/transports/sparse_reduce.py).

The step's compressed tensors, in parameter order, form one index space [0, T); tensor t starts at o_t. Rank r has
g_ef_r (the concatenation of its tensors' g + r) and selects per tensor as top-k does (topk.py): its positions
I_r = union over t of (o_t + top-k_t(g_ef_r,t)), ascending, K = sum_t k_t entries, sent values
v_r = value_dtype(g_ef_r[I_r]) and remainder g_ef_r - v_r on I_r (exact), g_ef_r elsewhere.

Regions: bounds B_0 = 0 <= B_1 <= ... <= B_P = T; rank j owns [B_j, B_{j+1}). When refreshed (every `every`
sparse steps, and at the first), from that step's selections: rank r's quantiles q_{r,j} = I_r[floor(j K / P)],
j = 1..P-1, summed exactly over ranks (one allreduce of integers), B_j = floor(sum_r q_{r,j} / P). So each region
holds about K/P of every rank's entries when the ranks' selections are alike.

Phase 1 (one alltoall): rank r sends owner j its entries in region j, a "delta" payload over the region
(region-relative indices; possibly empty). Owner j sums them: S_j = 0, then S_j[i] += v in rank order (float32),
as top-k's decode with divisor 1.
Selection: q = ceil(K / P); owner j keeps the top min(q, |U_j|) of |S_j| among the positions U_j it received (top-k's
order and ties) and sends value_dtype(S_j) there, a "delta" payload over its region.
Phase 2 (one allgather): every rank decodes the P payloads at their regions' offsets: avg = values / divisor.
Residual: r_new = remainder where avg != 0, g_ef where avg == 0: an entry the global selection dropped (or whose
sum cancelled to zero) goes back to the rank that sent it, so sum_r (applied_r + r_new_r) == sum_r g_ef_r exactly,
where applied_r is v_r where avg != 0.

Bytes a rank sends: its phase-1 payloads to the other P-1 owners and (P-1) times its phase-2 payload: at most
2K + 2 ceil(K/P) (P-1) words (index + value) whatever the distribution, within Ok-Topk's 6K(P-1)/P for P >= 2.
"""
import numpy as np

from . import topk


def selection(g_ef_tensors, ks):
    """(I, g_ef) of one rank: ascending positions in the concatenation, and the concatenated g_ef."""
    offsets = np.cumsum([0] + [t.size for t in g_ef_tensors])
    parts = [topk.select(np.asarray(t, np.float32), k).astype(np.int64) + o
             for t, k, o in zip(g_ef_tensors, ks, offsets)]
    return np.concatenate(parts), np.concatenate([np.asarray(t, np.float32) for t in g_ef_tensors])


def quantiles(positions, nranks):
    k = positions.size
    return np.array([positions[(j * k) // nranks] for j in range(1, nranks)], dtype=np.int64)


def refresh_bounds(positions_per_rank, total):
    """B from every rank's selection (the allreduce of the quantiles is a sum of integers: exact)."""
    nranks = len(positions_per_rank)
    sums = np.sum([quantiles(p, nranks) for p in positions_per_rank], axis=0, dtype=np.int64)
    return [0] + [int(s) // nranks for s in np.atleast_1d(sums)][:nranks - 1] + [int(total)]


def step(g_ef_per_rank, ks, bounds, value_dtype="fp16", divisor=None):
    """One step over P ranks: (avg over [0, T), residual per rank, phase-1 payloads [rank][region], phase-2
    payloads [owner]). g_ef_per_rank[r] is rank r's list of tensors (g + old residual), float32."""
    nranks = len(g_ef_per_rank)
    divisor = float(nranks if divisor is None else divisor)
    vdt = topk.VALUE_DTYPES[value_dtype]
    chosen = [selection(tensors, ks) for tensors in g_ef_per_rank]
    total = chosen[0][1].size
    sums = [np.zeros(bounds[j + 1] - bounds[j], np.float32) for j in range(nranks)]
    phase1, remainders = [], []
    for positions, g_ef in chosen:
        values = g_ef[positions].astype(vdt)
        remainder = g_ef.copy()
        remainder[positions] = g_ef[positions] - values.astype(np.float32)
        remainders.append(remainder)
        payloads = []
        for j in range(nranks):
            lo, hi = bounds[j], bounds[j + 1]
            inside = (positions >= lo) & (positions < hi)
            payloads.append(topk.encode_delta(positions[inside] - lo, values[inside], hi - lo, value_dtype))
        phase1.append(payloads)
    received = []
    for j in range(nranks):  # owner j sums in rank order, and notes the positions it received
        n = bounds[j + 1] - bounds[j]
        seen = np.zeros(n, bool)
        for r in range(nranks):
            sums[j] += topk.decode_average_delta(phase1[r][j], 1, n, 1.0)
            lo = bounds[j]
            seen[chosen[r][0][(chosen[r][0] >= lo) & (chosen[r][0] < lo + n)] - lo] = True
        received.append(np.flatnonzero(seen))
    quota = -(-sum(ks) // nranks)
    avg = np.zeros(total, np.float32)
    phase2 = []
    for j in range(nranks):
        lo, n = bounds[j], bounds[j + 1] - bounds[j]
        keep = topk.select(sums[j], min(quota, received[j].size), candidates=received[j]) if received[j].size \
            else np.zeros(0, np.int32)
        values = sums[j][keep].astype(vdt)
        phase2.append(topk.encode_delta(keep, values, n, value_dtype))
        avg[lo + keep] += values.astype(np.float32)
    avg = avg / np.float32(divisor)
    residuals = [np.where(avg != 0, remainder, g_ef) for remainder, (_, g_ef) in zip(remainders, chosen)]
    return avg, residuals, phase1, phase2


def wire_bytes(phase1, phase2, rank):
    """What `rank` sends: its phase-1 payloads to the other owners, and (P-1) copies of its phase-2 payload."""
    nranks = len(phase2)
    return sum(p.size for j, p in enumerate(phase1[rank]) if j != rank) + (nranks - 1) * phase2[rank].size
