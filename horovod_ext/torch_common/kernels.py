"""The kernel table of the PyTorch backend: each native op of horovod_ext._torch_ops (cpp/torch/ops.cpp) under the
uniform, functional signature the plan calls (horovod_ext/compression/plan.py). Only tensor conversion happens here:
outputs are allocated, CUDA tensors run on torch's current stream, results that the plan writes into a gradient go
straight into it when it is contiguous float32 (``into``).

Entropy-coded payloads ("entropy", "delta") are coded on the CPU (the coding is serial): a CUDA tensor is copied
to the host for them, and the decoded average back to its device (packing="auto" picks the fixed packings for CUDA
tensors). GraVAC's norms read the n / theta_min candidates' values on the host (a float64 sum in index order);
its second selection runs on the device, among the candidates' values.

In-place contract: ``ef_accumulate(flat, r)`` adds flat into r and returns r; ``topk_extract(x, idx, ...)`` leaves the
remainder in x and returns x as the remainder. The plan passes them only tensors it owns (a residual, or a copy).
"""
import torch

from horovod_ext import _torch_ops as ops
from horovod_ext.compression import sizes
from horovod_ext.compression.specs import check_tensor


def stream_of(tensor):
    """The CUDA stream a native op on `tensor` must run on (torch's current one for its device); 0 on the CPU."""
    return torch.cuda.current_stream(tensor.device).cuda_stream if tensor.is_cuda else 0


def check_gradient(name, tensor, what="ternary compression", **limits):
    """A clear error for gradients a payload compressor cannot take (every rank raises it)."""
    check_tensor(what, name, str(tensor.dtype).replace("torch.", ""), tensor.numel(), tensor.shape, **limits)


def as_float32(tensor):
    """A flat, contiguous float32 view of a tensor (a copy only where its dtype or layout needs one)."""
    flat = tensor.detach().reshape(-1)
    if flat.dtype != torch.float32:
        flat = flat.float()
    return flat.contiguous()


def _out(into, numel, like):
    return into if into is not None else torch.empty(numel, dtype=torch.float32, device=like.device)


def _cpu(tensor):
    return tensor.cpu() if tensor.is_cuda else tensor


def _in_place_on_host(tensors, run):
    """run(the tensors on the host): a CUDA tensor is copied there, and back after run wrote into the copy."""
    hosts = [_cpu(t) for t in tensors]
    result = run(hosts)
    for t, host in zip(tensors, hosts):
        if t.is_cuda:
            t.copy_(host)
    return result


def _decoded_into(into, numel, like, decode):
    """Decode on the CPU into `into` (or a new tensor on like's device)."""
    host = into if into is not None and not into.is_cuda else torch.empty(numel, dtype=torch.float32)
    result = decode(host)
    if into is not None and into.is_cuda:
        into.copy_(host)
        return into, result
    return (host.to(like.device) if like.is_cuda else host), result


def _candidates_on_host(x, idx):
    """x[idx] on the host, and the positions 0..m-1 standing for idx (GraVAC's second selection and norms on a
    CUDA tensor: the m = n / theta_min candidates' values travel to the host, not the gradient)."""
    values = x.index_select(0, idx.long()).cpu()
    return values, torch.arange(values.numel(), dtype=torch.int32)


def select_among_candidates(x, among, k):
    """The top k of x among the candidates (topk_select_nested's second selection) as the top k of the candidates'
    values x[among], on x's device (the CUDA top-k on a CUDA tensor): among is ascending, so positions order ties
    as the indices do and the result has the same bits."""
    values = x.index_select(0, among.long())
    return among.index_select(0, ops.topk_select(values, k, stream_of(values)).long())


def sum_squares_of_candidates(x, idx):
    """ops.sum_squares_at(x, idx) through the candidates' values (the same additions in the same order)."""
    values, positions = _candidates_on_host(x, idx)
    return ops.sum_squares_at(values, positions)


def _key(step):
    return int(step) & 0xFFFFFFFF


class TorchKernels:
    """The native kernels, functional."""

    @staticmethod
    def normal(n, seed, step, key, like):
        """n float32 standard normals keyed on (seed, step, key) (cpp/include/hvdext/random.h), on like's device."""
        out = torch.empty(int(n), dtype=torch.float32, device=like.device)
        ops.normal_fill(out, int(seed) % 2 ** 64, _key(step), int(key), stream_of(out))
        return out

    @staticmethod
    def ternary_local_scale(flat, clip):
        return ops.ternary_local_scale(flat, clip, stream_of(flat))

    @staticmethod
    def ternary_encode(flat, threshold, scale, seed, step, key, rank, packing):
        return ops.ternary_encode(flat, threshold, scale, seed, _key(step), key, rank, packing, stream_of(flat))

    @staticmethod
    def ternary_encode_codes(flat, threshold, scale, seed, step, key, rank):
        codes = torch.empty(flat.numel(), dtype=torch.uint8)
        ops.ternary_encode_codes(flat, threshold, scale, seed, _key(step), key, rank, codes)
        return codes

    @staticmethod
    def ternary_pack(codes, packing):
        out = torch.empty(sizes.ternary_packed_bytes(codes.numel(), packing), dtype=torch.uint8)
        ops.ternary_pack_codes(codes, packing, out)
        return out

    @staticmethod
    def ternary_decode_average(gathered, nranks, numel, packing, divisor, into=None):
        out = _out(into, numel, gathered)
        bad = ops.ternary_decode_average(gathered, nranks, numel, packing, float(divisor), out, stream_of(gathered))
        return out, bad

    @staticmethod
    def ternary_sum_reencode(received, nranks, count, packing, bits):
        return ops.ternary_sum_reencode(received, nranks, count, packing, bits)

    @staticmethod
    def two_phase_decode(stream, scale, first, count, nranks, bits, divisor):
        out = torch.empty(count, dtype=torch.float32)
        ops.two_phase_decode(stream, first, count, nranks, bits, scale, divisor, out)
        return out

    @staticmethod
    def ef_accumulate(flat, residual):
        return residual, ops.ef_accumulate(flat, residual, stream_of(flat))

    @staticmethod
    def topk_select(x, k):
        return ops.topk_select(x, k, stream_of(x))

    @staticmethod
    def topk_select_nested(x, k1, k2):
        """(top k1, top k2) of |x|; the same tensor twice when k2 == k1 (the plan then reuses its norm)."""
        if x.is_cuda or k2 == k1:
            first = ops.topk_select(x, k1, stream_of(x))
            return first, first if k2 == k1 else select_among_candidates(x, first, k2)
        return ops.topk_select_nested(x, k1, k2)

    @staticmethod
    def sum_squares_at(x, idx):
        return sum_squares_of_candidates(x, idx) if x.is_cuda else ops.sum_squares_at(x, idx)

    @staticmethod
    def topk_extract(x, idx, value_type):
        return ops.topk_extract(x, idx, value_type, stream_of(x)), x

    @staticmethod
    def topk_decode_average(gathered, k, nranks, numel, value_type, divisor, into=None):
        out = _out(into, numel, gathered)
        bad = ops.topk_decode_average(gathered, nranks, k, numel, value_type, float(divisor), out, stream_of(gathered))
        return out, bad

    # ------------------------------------------------------------------------- entropy-coded payloads (CPU)
    @staticmethod
    def ternary_encode_entropy(flat, threshold, scale, seed, step, key, rank):
        return ops.ternary_encode_entropy(_cpu(flat), threshold, scale, seed, _key(step), key, rank)

    @staticmethod
    def ternary_codes_encode_entropy(codes, scale=1.0):
        return ops.ternary_codes_encode_entropy(codes.contiguous(), scale)

    @staticmethod
    def ternary_decode_average_entropy(gathered, nranks, numel, divisor, into=None):
        return _decoded_into(into, numel, gathered, lambda out: ops.ternary_decode_average_entropy(
            _cpu(gathered), nranks, numel, float(divisor), out))

    @staticmethod
    def ternary_entropy_to_packed(received, nranks, count, packing):
        return ops.ternary_entropy_to_packed(received.contiguous(), nranks, count, packing)

    @staticmethod
    def two_phase_levels_encode(stream, count, nranks, bits, bad):
        return ops.two_phase_levels_encode(stream, count, nranks, bits, int(bad))

    @staticmethod
    def two_phase_levels_decode(gathered, counts, bits):
        return ops.two_phase_levels_decode(gathered.contiguous(), [int(c) for c in counts], bits)

    @staticmethod
    def topk_extract_coded(x, idx, value_type):
        if x.is_cuda:  # the remainder is written on the host copy, then back into x
            host = x.cpu()
            payload = ops.topk_extract_coded(host, _cpu(idx), value_type)
            x.copy_(host)
            return payload, x
        return ops.topk_extract_coded(x, idx, value_type), x

    @staticmethod
    def topk_decode_average_coded(gathered, nranks, numel, divisor, into=None):
        out, _ = _decoded_into(into, numel, gathered, lambda out: ops.topk_decode_average_coded(
            _cpu(gathered), nranks, numel, float(divisor), out))
        return out, -1

    @staticmethod
    def topk_encode_bucket(grads, g_ef, ks, value_type, coded):
        """A bucket's top-k payloads in one call (cpp/src/bucket.cpp; CUDA: cuda.h's topk_encode_bucket): grads (or
        None) added into g_ef first, each g_ef left holding its remainder. "delta" (coded) payloads are coded on the
        host (a CUDA tensor's values are copied there and back, as topk_extract_coded does); "int32" ones where the
        tensors are, a CUDA bucket's kernels enqueued on its stream with no host read."""
        ks = [int(k) for k in ks]
        if not coded or not g_ef or not g_ef[0].is_cuda:
            return ops.topk_encode_bucket(grads if grads is not None else [], g_ef, ks, value_type, coded,
                                          stream_of(g_ef[0]) if g_ef else 0)
        grads = [_cpu(g) for g in grads] if grads is not None else []
        return _in_place_on_host(g_ef, lambda hosts: ops.topk_encode_bucket(grads, hosts, ks, value_type, True))

    @staticmethod
    def decode_bucket(codec, result, nranks, header_bytes, numels, packing, divisor, outs):
        """A fused bucket's allgather decoded in one call (compression/buckets.py's layout; codec "topk_coded" or
        "ternary"): [(average, flag, error message or "", whether the average is finite: None where unchecked)] per
        tensor, into outs where given (CPU float32); None on a GPU, where each tensor is decoded on its own."""
        if result.is_cuda or any(out is not None and out.is_cuda for out in outs):
            return None
        outs = [out if out is not None else torch.empty(n, dtype=torch.float32) for out, n in zip(outs, numels)]
        flags, errors, finite = ops.decode_bucket(codec, result.contiguous(), nranks, header_bytes, list(numels),
                                                  packing, float(divisor), outs)
        if codec != "topk_coded":  # only top-k's decoder checks its averages (ternary's flag covers NaN/Inf)
            finite = [None] * len(outs)
        return list(zip(outs, flags, errors, finite))

    # --------------------------------------------------------------------- sparse_reduce (CPU, in place)
    @staticmethod
    def topk_encode_regions(flats, positions, bounds, value_type):
        """(payloads back to back, bytes per region): phase 1 over the tensors' concatenation; flats are only
        read."""
        return ops.topk_encode_regions([_cpu(f) for f in flats], _cpu(positions), [int(b) for b in bounds],
                                       value_type)

    @staticmethod
    def topk_decode_regions(gathered, bounds, divisor, sizes, into):
        """The averages, one per tensor of `sizes` elements: decoded straight into `into` (a float32 buffer per
        tensor, or None for a new one)."""
        outs = [buffer if buffer is not None and not buffer.is_cuda else torch.empty(n, dtype=torch.float32)
                for buffer, n in zip(into, sizes)]
        ops.topk_decode_regions_into(_cpu(gathered), [int(b) for b in bounds], float(divisor), outs)
        for k, buffer in enumerate(into):
            if buffer is not None and buffer.is_cuda:
                outs[k] = buffer.copy_(outs[k])
        return outs

    @staticmethod
    def topk_keep_applied(flats, averages, positions, value_type):
        """Each flat (g_ef) becomes its residual in place: g_ef - sent where this rank's entry was applied."""
        _in_place_on_host(flats, lambda hosts: ops.topk_keep_applied(hosts, [_cpu(a) for a in averages],
                                                                     _cpu(positions), value_type))
        return flats

    @staticmethod
    def topk_reduce_region(received, nranks, numel, q, value_type):
        """sparse_reduce's owner: the N payloads over its region summed, the top q sums as its phase-2 payload."""
        return ops.topk_reduce_region(received.contiguous(), nranks, int(numel), int(q), value_type)
