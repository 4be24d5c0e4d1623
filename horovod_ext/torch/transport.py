"""How each gradient crosses the wire, for horovod_ext's DistributedOptimizer.

- AllreduceTransport: linear compressors (Horovod's Compression.none / fp16): compress, Horovod allreduce,
  decompress, exactly as horovod.torch does.
- TernaryTransport: packed ternary payloads (a sum of packed codes means nothing) go through Horovod's allgather;
  every rank decodes the N payloads and averages them in one native pass. Tensors below min_size travel dense.
  With shared_scale, one allreduce(Max) of all tensors' scales precedes the encoding, so the step's allgathers
  start only once every gradient is ready. With transport="two_phase" (shared scale), all compressed tensors go
  as one flat code stream: an alltoall of packed chunks, an exact integer sum per chunk re-encoded at
  ceil(log2(2N+1)) bits, and an allgather of those (horovod_ext/compression/two_phase.py has the plan).

Transports record payload, dense and wire bytes and seconds in a CompressionStats (horovod_ext.compression.stats).
"""
import time

import horovod.torch as hvd
import torch
from horovod.common.exceptions import HorovodInternalError

from horovod_ext.compression.gravac import GravacController
from horovod_ext.compression.two_phase import TwoPhasePlan, choose_transport, scale_sharing_bytes
from horovod_ext.compression.wire import allgather_wire_bytes, allreduce_wire_bytes
from .ternary import TernaryCodec
from horovod_ext.compression.specs import k_of
from .topk import TopKCodec


class Pending:
    """One tensor's communication in flight (or, with a shared scale, waiting for the scale allreduce)."""

    __slots__ = ("name", "param", "kind", "handle", "ctx", "flat", "threshold", "scale", "k", "candidates")

    def __init__(self, name, param, kind, handle=None, ctx=None):
        self.name, self.param, self.kind, self.handle, self.ctx = name, param, kind, handle, ctx
        self.flat = self.threshold = self.scale = self.k = self.candidates = None


class SparsePending:
    """A sparse gradient in flight as Horovod sends it: handle() waits for the allgathers of its indices and values
    and returns the aggregated sparse gradient (horovod.torch.sparse_allreduce_async)."""

    __slots__ = ("name", "param", "handle")

    def __init__(self, name, param, handle):
        self.name, self.param, self.handle = name, param, handle


def drain_handles(items):
    """Wait for (and discard) every collective still in flight, so that none is left in Horovod's handle map."""
    for item in items:
        handle = getattr(item, "handle", None)
        if handle is None:
            continue
        try:
            handle() if callable(handle) else hvd.synchronize(handle)
        except HorovodInternalError:
            pass


def nonfinite_after_average(pendings):
    """Names of averaged gradients holding NaN/Inf: every rank holds the same average, so every rank sees it."""
    return [f"{p.name!r} (after averaging)" for p in pendings if not torch.isfinite(p.param.grad).all()]


def wait(handle, stats):
    start = time.perf_counter()
    output = hvd.synchronize(handle)
    stats.add(comm_seconds=time.perf_counter() - start)
    return output


class AllreduceTransport:
    def __init__(self, compression, op, gradient_predivide_factor, process_set, stats):
        self.compression = compression
        self.process_set = process_set
        self.stats = stats
        self.nranks = process_set.size()
        if op == hvd.Average and gradient_predivide_factor != 1.0:
            # Same mean, summed at a smaller magnitude (Horovod's fp16 overflow guard).
            self.op, self.prescale, self.postscale = hvd.Sum, 1.0 / gradient_predivide_factor, \
                gradient_predivide_factor / self.nranks
        else:
            self.op, self.prescale, self.postscale = op, 1.0, 1.0

    def launch(self, name, param, step):
        grad = param.grad
        start = time.perf_counter()
        compressed, ctx = self.compression.compress(grad)
        self.stats.add(compress_seconds=time.perf_counter() - start)
        handle = hvd.allreduce_async_(compressed, name=name, op=self.op, prescale_factor=self.prescale,
                                      postscale_factor=self.postscale, process_set=self.process_set)
        nbytes = compressed.numel() * compressed.element_size()
        dense = grad.numel() * grad.element_size()
        self.stats.add(payload_bytes=nbytes, dense_bytes=dense, elements=grad.numel(),
                       wire_bytes=allreduce_wire_bytes(nbytes, self.nranks),
                       dense_wire_bytes=allreduce_wire_bytes(dense, self.nranks))
        return Pending(name, param, "allreduce", handle, ctx)

    def finish(self, pendings, step):
        for item in pendings:
            output = wait(item.handle, self.stats)
            start = time.perf_counter()
            item.param.grad.set_(self.compression.decompress(output, item.ctx))
            self.stats.add(decompress_seconds=time.perf_counter() - start)
        return []

    def launch_dense(self, name, param, step):
        return self.launch(name, param, step)

    def finish_dense(self, pendings, step):
        return self.finish(pendings, step)


class TernaryTransport:
    def __init__(self, spec, op, process_set, stats, dense, seed, compressed_sizes):
        if op not in (hvd.Average, hvd.Sum):
            raise ValueError(f"op must be hvd.Average or hvd.Sum with Compression.{spec.name}, got {op!r}")
        self.spec = spec
        self.process_set = process_set
        self.stats = stats
        self.dense = dense
        self.nranks = process_set.size()
        self.divisor = float(self.nranks) if op == hvd.Average else 1.0
        self.rank = process_set.rank()
        self.codec = TernaryCodec(spec, self.rank, seed)
        self.round = 0
        self.transport = choose_transport(spec.transport, spec.shared_scale, compressed_sizes, self.nranks,
                                          spec.packing)
        stats.extra["transport"] = self.transport
        self.plan = None

    def is_compressed(self, param):
        return param.numel() >= self.spec.min_size

    def set_seed(self, seed):
        self.codec = TernaryCodec(self.spec, self.rank, seed)
        self.stats.extra["seed"] = seed

    def launch_dense(self, name, param, step):
        """This step goes dense (a rank called hvd.join()): the gradient as it is, by allreduce."""
        return self.dense.launch(name, param, step)

    def finish_dense(self, pendings, step):
        return self.dense.finish(pendings, step) + nonfinite_after_average(pendings)

    def launch(self, name, param, step):
        if not self.is_compressed(param):
            return self.dense.launch(name, param, step)
        item = Pending(name, param, "ternary")
        start = time.perf_counter()
        item.flat = self.codec.as_float32(param.grad)
        item.threshold, item.scale = self.codec.local_scale(item.flat)
        if not self.spec.shared_scale:
            self._encode_and_gather(item, step)
        self.stats.add(compress_seconds=time.perf_counter() - start)
        return item

    def _encode_and_gather(self, item, step):
        payload = self.codec.encode(item.name, item.flat, step, item.threshold, item.scale)
        item.flat = None
        item.handle = hvd.allgather_async(payload, name=f"ternary.{item.name}", process_set=self.process_set)
        numel, nbytes = item.param.numel(), payload.numel()
        dense = numel * item.param.grad.element_size()
        self.stats.add(payload_bytes=nbytes, dense_bytes=dense, elements=numel, compressed_elements=numel,
                       wire_bytes=allgather_wire_bytes(nbytes, self.nranks),
                       dense_wire_bytes=allreduce_wire_bytes(dense, self.nranks))

    def _share_scales(self, items):
        """TernGrad's scaler sharing: one allreduce(Max) of every compressed tensor's scale. Returns the names of
        tensors whose gradient held NaN/Inf on some rank (their agreed scale is +inf), else sets the scales."""
        local = torch.tensor([float(item.scale) for item in items], dtype=torch.float32)
        handle = hvd.allreduce_async(local, name=f"ternary.shared_scales.{self.round}", op=hvd.Max,
                                     process_set=self.process_set)
        agreed = wait(handle, self.stats).tolist()
        self.stats.add(payload_bytes=4 * len(items), wire_bytes=scale_sharing_bytes(len(items), self.nranks))
        bad = [item.name for item, s in zip(items, agreed) if s == float("inf")]
        if not bad:
            for item, s in zip(items, agreed):
                item.scale = s
        return bad

    def _output_of(self, grad):
        """Where to decode: the gradient itself when it is contiguous float32, else a float32 buffer."""
        if grad.dtype == torch.float32 and grad.is_contiguous():
            return grad.view(-1)
        return torch.empty(grad.numel(), dtype=torch.float32, device=grad.device)

    def _two_phase(self, items, step):
        """Phase 1 alltoall of packed code chunks, exact sums re-encoded, phase 2 allgather, decode."""
        sizes = [item.param.numel() for item in items]
        if self.plan is None or self.plan.sizes != sizes:
            self.plan = TwoPhasePlan(sizes, self.nranks, self.spec.packing)
        plan = self.plan
        start = time.perf_counter()
        codes = torch.empty(plan.total, dtype=torch.uint8)
        for item, offset, n in zip(items, plan.offsets, sizes):
            self.codec.encode_codes(item.name, item.flat, step, item.threshold, item.scale, codes[offset:offset + n])
            item.flat = None
        send = torch.empty(sum(plan.send_splits), dtype=torch.uint8)
        position = 0
        for j, split in enumerate(plan.send_splits):
            self.codec.pack(codes[plan.bounds[j]:plan.bounds[j + 1]], send[position:position + split])
            position += split
        self.stats.add(compress_seconds=time.perf_counter() - start)

        begin = time.perf_counter()
        received, _ = hvd.alltoall(send, splits=torch.tensor(plan.send_splits, dtype=torch.int32),
                                   name=f"ternary.two_phase.alltoall.{self.round}", process_set=self.process_set)
        self.stats.add(comm_seconds=time.perf_counter() - begin)
        start = time.perf_counter()
        own = plan.counts[self.rank]
        stream = self.codec.sum_reencode(received, self.nranks, own, plan.bits)
        self.stats.add(compress_seconds=time.perf_counter() - start)
        begin = time.perf_counter()
        gathered = hvd.allgather(stream, name=f"ternary.two_phase.allgather.{self.round}",
                                 process_set=self.process_set)
        self.stats.add(comm_seconds=time.perf_counter() - begin)

        start = time.perf_counter()
        outputs = [self._output_of(item.param.grad) for item in items]
        position = 0
        for j, size in enumerate(plan.stream_sizes):
            chunk = gathered[position:position + size]
            position += size
            for t, first, count, into in plan.pieces(j):
                self.codec.decode_levels(chunk, first, count, self.nranks, plan.bits, items[t].scale, self.divisor,
                                         outputs[t][into:into + count])
        for item, out in zip(items, outputs):
            if out.data_ptr() != item.param.grad.data_ptr():
                item.param.grad.copy_(out.view_as(item.param.grad))
        dense = sum(n * item.param.grad.element_size() for n, item in zip(sizes, items))
        sent_alltoall = send.numel() - plan.send_splits[self.rank]  # what leaves this rank in phase 1
        self.stats.add(decompress_seconds=time.perf_counter() - start, payload_bytes=send.numel() + stream.numel(),
                       wire_bytes=sent_alltoall + allgather_wire_bytes(stream.numel(), self.nranks),
                       dense_bytes=dense, elements=plan.total,
                       compressed_elements=plan.total, dense_wire_bytes=allreduce_wire_bytes(dense, self.nranks))

    def finish(self, pendings, step):
        """Wait for every tensor, write the averaged gradients, and return the names whose gradient held NaN/Inf."""
        self.round += 1
        compressed = [p for p in pendings if p.kind == "ternary"]
        errors = []
        if self.spec.shared_scale and compressed:
            bad = self._share_scales(compressed)
            if bad:
                errors += [f"{name!r} (on at least one rank)" for name in bad]
            elif self.transport == "two_phase":
                self._two_phase(compressed, step)
            else:
                start = time.perf_counter()
                for item in compressed:
                    self._encode_and_gather(item, step)
                self.stats.add(compress_seconds=time.perf_counter() - start)
            if bad or self.transport == "two_phase":
                compressed = []
        dense = [p for p in pendings if p.kind == "allreduce"]
        # Small tensors travel dense: their average is the same on every rank, so every rank sees a NaN/Inf in it.
        errors += self.dense.finish(dense, step) + nonfinite_after_average(dense)
        gathered = [(item, wait(item.handle, self.stats)) for item in compressed]
        for item, payloads in gathered:
            start = time.perf_counter()
            grad = item.param.grad
            out = self._output_of(grad)
            bad_rank = self.codec.decode_average(payloads, self.nranks, grad.numel(), self.divisor, out)
            if bad_rank >= 0:
                errors.append(f"{item.name!r} (on rank {bad_rank})")
            elif out.data_ptr() != grad.data_ptr():
                grad.copy_(out.view_as(grad))
            self.stats.add(decompress_seconds=time.perf_counter() - start)
        return errors


class TopKTransport:
    """Compression.topk (payload built in the backward hook) and Compression.adaptive_topk (GraVAC: the norms of
    every tensor are averaged over ranks at synchronize(), the controller picks candidate / min / dense, then the
    payloads go). Payloads travel by allgather and are decoded by one scatter-add; the dense path is an allreduce
    of g_ef after which the residuals are reset."""

    def __init__(self, spec, op, process_set, stats):
        if op not in (hvd.Average, hvd.Sum):
            raise ValueError(f"op must be hvd.Average or hvd.Sum with Compression.{spec.name}, got {op!r}")
        self.spec = spec
        self.process_set = process_set
        self.stats = stats
        self.nranks = process_set.size()
        self.op = op
        self.divisor = float(self.nranks) if op == hvd.Average else 1.0
        self.codec = TopKCodec(spec)
        self.adaptive = spec.name == "adaptive_topk"
        self.controller = GravacController(spec, self.nranks) if self.adaptive else None
        self.residuals = {}
        self.round = 0

    def _residual(self, name, numel, device="cpu"):
        if name not in self.residuals:
            self.residuals[name] = torch.zeros(numel, dtype=torch.float32, device=device)
        return self.residuals[name]

    def launch(self, name, param, step):
        item = Pending(name, param, "topk")
        start = time.perf_counter()
        item.flat = TernaryCodec.as_float32(param.grad)
        if not self.adaptive:
            residual = self._residual(name, item.flat.numel(), item.flat.device)
            self.codec.accumulate(item.flat, residual)
            self._send(item, self.codec.select(residual, k_of(item.flat.numel(), 1.0 / self.spec.ratio)))
        self.stats.add(compress_seconds=time.perf_counter() - start)
        return item

    def _send(self, item, idx):
        residual = self.residuals[item.name]
        payload = self.codec.extract(residual, idx)
        item.k, item.flat = idx.numel(), None
        item.handle = hvd.allgather_async(payload, name=f"topk.{item.name}", process_set=self.process_set)
        numel = residual.numel()
        dense = numel * item.param.grad.element_size()
        self.stats.add(payload_bytes=payload.numel(), dense_bytes=dense, elements=numel, compressed_elements=numel,
                       wire_bytes=allgather_wire_bytes(payload.numel(), self.nranks),
                       dense_wire_bytes=allreduce_wire_bytes(dense, self.nranks))

    def _send_dense(self, item):
        residual = self.residuals[item.name]
        item.kind, item.flat = "dense", residual.clone()
        residual.zero_()  # GraVAC: the dense path sends g_ef and resets the residual
        item.handle = hvd.allreduce_async_(item.flat, name=f"topk.dense.{item.name}", op=self.op,
                                           process_set=self.process_set)
        dense = item.flat.numel() * item.param.grad.element_size()
        self.stats.add(payload_bytes=4 * item.flat.numel(), dense_bytes=dense, elements=item.flat.numel(),
                       wire_bytes=allreduce_wire_bytes(4 * item.flat.numel(), self.nranks),
                       dense_wire_bytes=allreduce_wire_bytes(dense, self.nranks))

    def _adaptive(self, items):
        start = time.perf_counter()
        theta_min, theta_c = self.controller.cfs()
        norms = [0.0, 0.0, 0.0]
        for item in items:
            residual = self._residual(item.name, item.flat.numel(), item.flat.device)
            norms[0] += self.codec.accumulate(item.flat, residual)
            first = self.codec.select(residual, k_of(residual.numel(), theta_min))
            second = self.codec.select(residual, k_of(residual.numel(), theta_c), among=first)
            norms[1] += self.codec.energy(residual, first)
            norms[2] += self.codec.energy(residual, second)
            item.candidates = (first, second)
        self.stats.add(compress_seconds=time.perf_counter() - start)
        step_seconds = self.controller.seconds_since_decision()
        agreed = hvd.allreduce(torch.tensor(norms + [step_seconds], dtype=torch.float64), op=hvd.Average,
                               name=f"adaptive_topk.norms.{self.round}", process_set=self.process_set).tolist()
        self.stats.add(payload_bytes=32, wire_bytes=allreduce_wire_bytes(32, self.nranks))
        try:
            path, cf, gain_min, gain_c = self.controller.decide(*agreed)
        except FloatingPointError:
            self.reset_residuals()
            raise
        self.stats.extra.update(cf=cf, path=path, gain_min=gain_min, gain_c=gain_c, theta_min=theta_min,
                                candidate_cf=theta_c, settled=self.controller.settled)
        start = time.perf_counter()
        for item in items:
            if path == "dense":
                self._send_dense(item)
            else:
                self._send(item, item.candidates[0] if path == "min" else item.candidates[1])
            item.candidates = None
        self.stats.add(compress_seconds=time.perf_counter() - start)

    def reset_residuals(self):
        for residual in self.residuals.values():
            residual.zero_()

    def launch_dense(self, name, param, step):
        """This step goes dense (a rank called hvd.join()): g + r by allreduce, then r = 0, as GraVAC's dense path."""
        item = Pending(name, param, "topk")
        if self.controller is not None:  # this step is no decision: the next step's time is not the last CF's
            self.controller.forget_step_time()
        flat = TernaryCodec.as_float32(param.grad)
        self.codec.accumulate(flat, self._residual(name, flat.numel(), flat.device))
        self._send_dense(item)
        return item

    def finish_dense(self, pendings, step):
        for item in pendings:
            item.param.grad.copy_(wait(item.handle, self.stats).view_as(item.param.grad))
        return nonfinite_after_average(pendings)

    def residual_state(self):
        return {k: v.clone() for k, v in self.residuals.items()}

    def load_residuals(self, residuals):
        self.residuals = {k: v.clone().float() for k, v in residuals.items()}

    def finish(self, pendings, step):
        self.round += 1
        if self.adaptive:
            self._adaptive(pendings)
        outputs = [(item, wait(item.handle, self.stats)) for item in pendings]
        errors = []
        for item, result in outputs:
            start = time.perf_counter()
            grad = item.param.grad
            if item.kind == "dense":
                grad.copy_(result.view_as(grad))
            else:
                out = grad.view(-1) if (grad.dtype == torch.float32 and grad.is_contiguous()) else \
                    torch.empty(grad.numel(), dtype=torch.float32, device=grad.device)
                bad_rank = self.codec.decode_average(result, self.nranks, item.k, grad.numel(), self.divisor, out)
                if bad_rank >= 0:
                    errors.append(f"{item.name!r} (rank {bad_rank} sent indices outside the tensor)")
                    continue
                if out.data_ptr() != grad.data_ptr():
                    grad.copy_(out.view_as(grad))
            if not torch.isfinite(grad).all():  # every rank decodes the same sum, so every rank sees it
                errors.append(f"{item.name!r} (NaN/Inf on some rank, or beyond the fp16 range: try value_dtype='fp32')")
            self.stats.add(decompress_seconds=time.perf_counter() - start)
        if errors:
            self.reset_residuals()
        return errors
