"""The per-step communication plan, written once for PyTorch and TensorFlow.

What happens to a gradient between backward and the optimizer lives here and in each compressor's module
(horovod_ext/compressors/: ternary.py, topk.py, gravac.py, powersgd.py, auto/): the dense split (tensors below
min_size), scale sharing, encoding, the collectives, decoding, error feedback, GraVAC's decision, the NaN/Inf checks
and the byte accounting. A framework adapter supplies only a backend (horovod_ext/torch/backend.py,
horovod_ext/tensorflow/backend.py): its collectives, its kernel table, its way of holding state, and how it checks
and branches (eagerly in PyTorch; eagerly or as graph ops in TensorFlow).

A step has two stages, so that PyTorch keeps its overlap with backward:

- ``launch(item)``: one gradient is ready (PyTorch: its backward hook; TensorFlow: every gradient in turn). What
  needs this tensor alone is done and its collective started (``backend.allgather`` returns a future).
- ``finish(items)``: every gradient of the step is launched. What needs all of them (scale sharing, two-phase
  chunks, GraVAC's norms and decision) is done, every future waited for, and the averages written
  (``backend.write``). A gradient that held NaN/Inf, or a payload that does not decode, is recorded through
  the step context's ``require`` (context.py; identical on every rank: each is decided from collective results);
  the driver raises the step's records as one error, after which the method drops what error feedback kept
  (``on_error``).

A step in which some rank has called hvd.join() goes dense (``launch_dense`` / ``finish_dense``, see join.py).

The backend's contract is compression/backend.py (a typed interface both adapters implement, with a conformance
test); the step's counter, seed, requirements and byte counts are its context's (context.py), which a method and its
codec hold; the step driver (driver.py) makes the Items, calls the two stages and raises what the context recorded.

A method owns its per-step state: what it computes for one tensor between launch() and finish() lives in its
Record (``item.work``, a new one per tensor and step), and what every rank holds alike (GraVAC's controller,
sparse_reduce's regions) is its shared state (``shared_state()`` / ``load_shared_state()``), which the adapters
checkpoint and agree on without knowing what it holds.
"""
import math
import types

from .feedback import with_feedback
from .wire import allgather_wire_bytes, allreduce_wire_bytes


class Item:
    """One gradient of the step, what every method needs: its position and name, the framework's tensor, its size,
    how it travels (kind: "small", "linear", "payload", "sparse"), its collective in flight, and its output.
    ``work`` is the method's own Record of it. ``sparse``: the framework's sparse gradient (PyTorch's sparse COO
    tensor, TensorFlow's IndexedSlices): "gather" travels as Horovod sends it (SparseGather), "dense" is sent as a
    dense gradient (Horovod's sparse_as_dense) and handed back sparse where the framework's optimizers need it."""

    __slots__ = ("index", "name", "grad", "numel", "itemsize", "param", "kind", "future", "result", "work", "sparse")

    def __init__(self, index, name, grad, numel, itemsize, param=None, sparse=None):
        if sparse not in (None, "gather", "dense"):
            raise ValueError(f"sparse must be None, 'gather' or 'dense', got {sparse!r}")
        self.index, self.name, self.grad, self.numel, self.itemsize = index, name, grad, int(numel), int(itemsize)
        self.param, self.sparse = param, sparse
        self.kind = self.future = self.work = None
        self.result = None  # TensorFlow: the averaged gradient (PyTorch writes it into .grad)


class Record:
    """A method's per-step record of one tensor: the fields it computes in launch() and reads in finish(),
    declared as the __slots__ of a subclass (all None when made). A new one per tensor and step: nothing to clear."""

    __slots__ = ()

    def __init__(self):
        for cls in type(self).__mro__:
            for field in getattr(cls, "__slots__", ()):
                setattr(self, field, None)


class EncodeRecord(Record):
    """What a codec's method holds between launch() and finish(): g (or g + r) as flat float32."""

    __slots__ = ("flat",)


def send_dense(be, item, flat, codec, prefix):
    """Start the allreduce (Sum, or Average for op Average) of flat, what codec.prepare gave (g, or g + r with error
    feedback, after which r = 0: what is sent dense leaves nothing behind). Returns the future."""
    return be.allreduce(codec.sent_whole(be, item, flat), be.name(prefix, item),
                        "sum" if be.divisor == 1.0 else "average")


def count_dense(ctx, item):
    """What Horovod's dense allreduce of this gradient would have sent (the baseline of every ratio)."""
    dense = item.numel * item.itemsize
    ctx.count(dense_bytes=dense, elements=item.numel, dense_wire_bytes=allreduce_wire_bytes(dense, ctx.nranks))


class Method:
    """How one compressor moves a step's gradients; see the module docstring for the two stages. ``codec`` is what
    encodes a tensor, wrapped in error feedback where the compressor asks for it (feedback.with_feedback); the
    base's sends the gradient as it is. The default dense path (a join step) sends each gradient (with error
    feedback, g + r, after which r = 0) by allreduce."""

    needs_join_check = True  # payload compressors cannot run while a rank is joined (join.py)
    # launch() starts only allreduces and local work, so it serves a joined step too, which finish_dense() then
    # completes from what launch() made: the join check is read in finish() (driver.py)
    join_decided_at_finish = False
    Record = Record  # the per-step record of one tensor (item.work)

    def __init__(self, spec, ctx, sizes):
        self.spec, self.ctx, self.sizes = spec, ctx, [int(n) for n in sizes]
        self.codec = Codec()

    def launch_dense(self, be, item):
        if not self.codec.holds_residuals:
            return DenseSplit.launch(be, self.ctx, item)
        item.kind = "small"
        count_dense(self.ctx, item)
        g_ef = self.codec.prepare(be, item, be.flat32(item.grad))
        item.future = send_dense(be, item, g_ef, self.codec, "dense")
        self.ctx.count(payload_bytes=4 * item.numel, wire_bytes=allreduce_wire_bytes(4 * item.numel, be.nranks))
        return item

    def finish_dense(self, be, items):
        DenseSplit.finish(be, self.ctx, items)

    def state(self, be):
        return self.codec.state(be)

    def load_state(self, be, residuals):
        self.codec.load_state(be, residuals)

    def shared_state(self):
        """What of the method's state every rank holds alike and a checkpoint restores on all (resume.py): a dict
        of JSON-able values (GraVAC's controller, sparse_reduce's regions), or None."""
        return None

    def load_shared_state(self, state):
        """Take on shared_state() from a checkpoint (None: the checkpoint holds none; keep the current state)."""

    def observations(self):
        """What compression_stats() adds for this method (GraVAC: its controller's log and table)."""
        return {}

    def abandon_step(self):
        """Launched gradients were dropped before finish() (a checkpoint was loaded): forget the step's state."""

    def complete_in_flight(self):
        """Wait for and take in what the last step left in flight (GraVAC's readings), so that no collective of
        this method is pending when the rank calls hvd.join()."""

    def forget_in_flight(self):
        """Drop, without waiting, every collective this method started and has not taken in (an elastic reset:
        Horovod was shut down under them, so their handles will never complete)."""
        self.abandon_step()

    def on_error(self, be):
        """A step failed on every rank: what error feedback kept is dropped, so that no NaN survives in it."""
        self.codec.reset_all(be)


class Linear(Method):
    """Horovod's own linear compressors (Compression.none, fp16, or a user's Compressor): compress, allreduce with
    the user's op and predivide factor, decompress, as horovod.torch and horovod.tensorflow do."""

    needs_join_check = False

    def launch(self, be, item):
        item.kind = "linear"
        item.future, sent = be.allreduce_grad(item, be.name("hvdext", item), compression=self.spec)  # times compress()
        count_dense(self.ctx, item)
        self.ctx.count(payload_bytes=sent, wire_bytes=allreduce_wire_bytes(sent, be.nranks))
        return item

    def finish(self, be, items):
        for item in items:
            be.write(item, be.wait(item.future))

    launch_dense = launch

    def finish_dense(self, be, items):
        self.finish(be, items)


class DenseSplit:
    """Tensors below a compressor's min_size (biases, norms) travel dense by allreduce, with the user's op."""

    @staticmethod
    def launch(be, ctx, item):
        item.kind = "small"
        count_dense(ctx, item)
        item.future, sent = be.allreduce_grad(item, be.name("hvdext", item))
        ctx.count(payload_bytes=sent, wire_bytes=allreduce_wire_bytes(sent, be.nranks))
        return item

    @staticmethod
    def finish(be, ctx, items):
        for item in items:
            avg = be.wait(item.future)
            be.write(item, avg)
            ctx.require(be.all_finite(avg), f"{item.name!r} (after averaging)")


class SparseGather:
    """A sparse gradient as Horovod sends it, whatever the compressor: Horovod's sparse allreduce, an allgather of
    every rank's indices and values whose rows add where indices repeat, divided by N for op Average (exact; the
    framework's sparse tensor again). Bytes: the dense allreduce of the whole tensor as the baseline; this rank's
    indices and values, which vary with the batch, counted as the step runs, sent to the N - 1 others."""

    @staticmethod
    def launch(be, ctx, item):
        item.kind = "sparse"
        count_dense(ctx, item)
        item.future, sent = be.allreduce_sparse(item, be.name("sparse", item))
        ctx.count_runtime(payload_bytes=sent, wire_bytes=sent * (be.nranks - 1))
        return item

    @staticmethod
    def finish(be, ctx, items):
        for item in items:
            be.write(item, be.wait(item.future))


def stream_of(items):
    """What a step-level stream (two-phase's) is named by in errors: the tensors it carries."""
    return types.SimpleNamespace(name="the two-phase stream of " + ", ".join(repr(i.name) for i in items))


def require_decoded(be, ctx, codec, item, bad):
    """A decoder's flag: -1, else the first rank whose payload failed (codec.bad_flag says what that means)."""
    ctx.require(be.equal(bad, -1), f"{item.name!r} {codec.bad_flag}", bad, error=codec.bad_flag_error)


class Allgather(Method):
    """Any codec whose payloads cannot be summed, by allgather: encode (with error feedback if the compressor asks
    for it) and start the allgather as soon as the gradient is ready; decode the N payloads into the average.

    Bytes: the codec's payload_bytes(numel) per rank, (N-1) times on the ring (wire.py)."""

    def __init__(self, spec, ctx, sizes):
        super().__init__(spec, ctx, sizes)
        self.codec = with_feedback(spec, spec.codec(spec, ctx))
        self.Record = self.codec.Record

    def compressed(self, item):
        return item.numel >= getattr(self.spec, "min_size", 0)

    def launch(self, be, item):
        if not self.compressed(item):
            return DenseSplit.launch(be, self.ctx, item)
        item.kind = "payload"
        count_dense(self.ctx, item)
        if self.codec.encodes_buckets(be) and hasattr(be, "defer") and be.defer(item, self._encode_bucket, be):
            item.work.flat = be.flat32(item.grad)  # encoded with its bucket (_encode_bucket)
            return item
        with self.ctx.timed("compress_seconds"):
            payload, _ = self.codec.encode(be, item, self.codec.prepare(be, item, be.flat32(item.grad)))
        self._gather(be, item, payload)
        return item

    def _encode_bucket(self, be, items):
        """A bucket's tensors, put off by launch() (buckets.FusingBackend.defer) until its last one was launched:
        encoded in one call, then each payload gathered as launch() gathers one."""
        with self.ctx.timed("compress_seconds"):
            payloads = self.codec.encode_bucket(be, items, [item.work.flat for item in items])
        for item, payload in zip(items, payloads):
            item.work.flat = None
            self._gather(be, item, payload)

    def _gather(self, be, item, payload):
        item.future = be.allgather(payload, be.name(self.spec.name, item))
        count_payload(be, self.ctx, self.codec.payload_bytes(item.numel), payload)
        self.ctx.count(compressed_elements=item.numel)

    def finish(self, be, items):
        DenseSplit.finish(be, self.ctx, [i for i in items if i.kind == "small"])
        self.decode_all(be, [i for i in items if i.kind == "payload"])

    def decode_all(self, be, items):
        """Every payload item's average. A bucket whose allgather was fused (buckets.py) is decoded in one call
        where the codec and the kernels can (Codec.decode_bucket: the bits of one call per tensor); every other
        tensor by its own decode."""
        buckets = be.allgathered_buckets(items) if hasattr(be, "allgathered_buckets") else []
        decoded = set()
        with self.ctx.timed("decompress_seconds"):
            for result, header_bytes, members in buckets:
                try:
                    got = self.codec.decode_bucket(be, members, result, header_bytes,
                                                   [be.output_buffer(item) for item in members])
                except be.kernel_errors as exc:  # the bucket's header itself does not hold: every tensor fails
                    got = [(None, None, getattr(exc, "message", None) or exc, None)] * len(members)
                if got is None:
                    continue
                for item, (avg, bad, error, finite) in zip(members, got):
                    decoded.add(item.index)
                    if error:
                        self.ctx.reject(item, error)
                    else:
                        self._decoded(be, item, avg, bad, finite)
        gathered = [(item, be.wait(item.future)) for item in items if item.index not in decoded]
        with self.ctx.timed("decompress_seconds"):
            for item, payloads in gathered:
                with self.ctx.decoding(item):
                    avg, bad = self.codec.decode(be, item, payloads, be.output_buffer(item))
                    self._decoded(be, item, avg, bad)

    def _decoded(self, be, item, avg, bad, finite=None):
        """The decoder's flag required, the average written, and (where the codec's flag does not cover NaN/Inf)
        the average required finite: `finite` where the bucket's decoder reported it, else checked here."""
        require_decoded(be, self.ctx, self.codec, item, bad)
        be.write(item, avg)
        if self.codec.nonfinite:
            self.ctx.require(be.all_finite(avg) if finite is None else bool(finite),
                             f"{item.name!r} {self.codec.nonfinite}")


def count_payload(be, ctx, nbytes, payload):
    """A payload's bytes and what its allgather sends: nbytes where the size is fixed (known when the step is
    built), else the payload's own size, counted as the step runs (an entropy-coded payload)."""
    if nbytes is not None:
        ctx.count(payload_bytes=nbytes, wire_bytes=allgather_wire_bytes(nbytes, be.nranks))
    else:
        size = be.size(payload)
        ctx.count_runtime(payload_bytes=size, wire_bytes=size * (be.nranks - 1))


def decode_bucket_by(be, codec_name, packing, items, result, header_bytes, outs):
    """The kernels' one-call decode of a bucket (kernels.decode_bucket), or None where the backend has none (the
    TensorFlow ops, CUDA tensors)."""
    kernel = getattr(be.kernels, "decode_bucket", None)
    if kernel is None:
        return None
    return kernel(codec_name, result, be.nranks, header_bytes, [item.numel for item in items], packing, be.divisor,
                  outs)


class Codec:
    """One tensor's payload: ``encode(be, item, g)`` -> (payload, g - what was sent, or None);
    ``decode(be, item, gathered, into)`` -> (average, -1 or the first rank whose payload is bad);
    ``payload_bytes(numel)`` from the C++ core's size functions (horovod_ext.compression.sizes), or None for a
    payload whose size depends on its content (entropy coding: counted as the step runs); and, for error
    feedback around a codec whose encode returns no remainder, ``sent(be, item, payload)``: the values this rank's
    own payload stands for. ``prepare(be, item, flat)`` gives what encode takes (the gradient itself; a codec whose
    encode writes into it makes a copy).

    The rest are error feedback's calls (feedback.ErrorFeedback), which a bare codec answers as "no residual": a
    method makes the same calls whichever it holds. ``Codec()`` alone is the identity encoding of a method that
    sends an approximation of its own (PowerSGD's factors), so that error feedback can wrap it too."""

    Record = EncodeRecord  # what the codec and its method keep of one tensor between launch() and finish()
    bad_flag = "(on rank {})"  # follows the tensor's name; {}: the rank the decoder reported
    bad_flag_error = "nonfinite"  # what that rank's flag means: "nonfinite" (NaN/Inf) or "payload" (corrupted)
    nonfinite = "(NaN or Inf after averaging)"
    holds_residuals = False

    def __init__(self, spec=None, ctx=None):
        self.spec, self.ctx = spec, ctx
        packing = spec.settings.get("packing") if spec is not None else None
        if packing is not None:  # compression_stats() says which packing ran ("auto" is resolved by then)
            if packing == "auto":
                raise ValueError(f"Compression.{spec.name}: packing='auto' reached the codec unresolved; the "
                                 f"adapter resolves it for the gradients' device (CompressorSpec.for_device)")
            ctx.stats.extra["packing"] = packing

    def sent(self, be, item, payload):
        raise NotImplementedError(f"{type(self).__name__} returns no remainder from encode() and has no sent(): "
                                  f"it cannot run with error feedback")

    def encodes_buckets(self, be):
        """Whether encode_bucket() encodes a bucket's tensors in one call over this backend (else per tensor)."""
        return False

    def encode_bucket(self, be, items, flats, residuals=None):
        """A bucket's payloads in one call (where encodes_buckets()): [payload] per item, what encode(be, item,
        prepare(be, item, flat)) gives each; `residuals` (error feedback's, one per item): flat + r is encoded in
        r's storage, which keeps the remainder."""
        raise NotImplementedError(f"{type(self).__name__} encodes one tensor at a time")

    def decode_bucket(self, be, items, result, header_bytes, outs):
        """A fused bucket's allgather (buckets.FusingBackend.allgathered_buckets) decoded in one call: [(average,
        flag, error message or "", whether the average is finite)] per tensor, the bits of decode() per tensor; or
        None where this codec or the backend's kernels decode per tensor only (then decode() runs for each)."""
        return None

    def prepare(self, be, item, flat):
        return flat

    def fused(self, be, items):
        """No residuals to hold in one buffer (ErrorFeedback.fused)."""
        return None

    def keep(self, be, item, remainder):
        pass

    def keep_difference(self, be, item, g, sent):
        pass

    def sent_whole(self, be, item, g):
        return g

    def reset_all(self, be):
        pass

    def state(self, be):
        return {}

    def load_state(self, be, residuals):
        pass


def k_of(numel, cf):
    """Elements top-k keeps of a tensor at compression factor cf (dense elements / kept): max(1, ceil(n / cf))."""
    return max(1, min(numel, math.ceil(numel / cf)))
