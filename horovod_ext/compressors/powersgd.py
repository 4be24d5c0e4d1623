"""Compression.powersgd, declared once: PowerSGD (Vogels, Karimireddy, Jaggi, NeurIPS 2019) with PyTorch's DDP hook's
semantics (torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook), for Horovod in PyTorch and TensorFlow.

Its factors are linear, so they go by allreduce and the bytes per rank do not grow with the number of ranks. The math
is python/hvdext_reference/powersgd.py; the step over the backend contract is PowerSGDMethod below; the matrix
products, the orthogonalization and the normal draw are backend primitives (horovod_ext/compression/backend.py).
"""
import math

from horovod_ext.compression.feedback import fused as fused_states, with_feedback
from horovod_ext.compression.plan import Codec, DenseSplit, Method, Record, count_dense, send_dense
from horovod_ext.compression.specs import (CompressorSpec, check_bool, check_choice, check_int, check_real,
                                           shape_and_numel)
from horovod_ext.compression.wire import allreduce_wire_bytes, tensor_key

ORTHOGONALIZATIONS = ("gram_schmidt", "qr")
VALUE_DTYPES = {"fp32": ("float32", 4), "fp16": ("float16", 2)}
Q_SUFFIX = "#powersgd.q"  # a tensor's warm-start Q among the per-rank states of the checkpoint


def matrix_layout(shape, rank, min_compression_rate):
    """(n, m, r) of a tensor of `shape` viewed as the n x m matrix M (n = shape[0], m = numel / n; conv kernels
    (out, in, h, w) are out x in*h*w, as the hook views them), r = min(n, m, rank); or None where it goes dense:
    unless (n + m) r * min_compression_rate < n m (the hook's _should_compress), and for scalars."""
    if len(shape) == 0:
        return None
    n = int(shape[0])
    m = math.prod(int(d) for d in shape) // n if n else 0
    r = min(n, m, int(rank))
    if r == 0 or not (n + m) * r * min_compression_rate < n * m:
        return None
    return n, m, r


def q_elements(item):
    """The elements of a matrix's Q: m * r."""
    _, m, r = item.work.layout
    return m * r


class PowerSGDRecord(Record):
    """One tensor's step: M (g + e as flat float32: the residual's storage with error feedback) and its (n, m, r)."""

    __slots__ = ("flat", "layout")


class PowerSGDMethod(Method):
    """PowerSGD's step (the hook's numbered steps, with the tensors of a whole step as its one bucket).
     launch(), per tensor as its gradient is ready: a tensor that does not compress (matrix_layout) starts its
     allreduce (DenseSplit); a matrix takes M = g + e (error feedback).
    finish(), for all tensors at once (one host decision, then one switch):
     - before start_iter: every matrix dense by allreduce (as the hook's vanilla allreduce);
     - else: Q, per matrix (m x r): the last step's (warm start), or drawn from the counter-based normal keyed on
       (seed, step, tensor), the same on every rank; orthogonalized. P = M Q; the P of every matrix in one buffer,
       allreduced (Sum); each P orthogonalized; Q = M^T P, in one buffer, allreduced (Average); the update A = P Q^T,
       the same bits on every rank; e = M - A; Q kept for the next step.
    Matrices of one shape are multiplied as one batch with batch_tensors=True (the hook's
    batch_tensors_with_same_shape): the same bits, fewer kernel launches; where the backend fuses states
    (backend.fused_states: PyTorch), a batch's residuals and kept Q live in one buffer each, so M is that buffer
    and e = M - P Q^T, Q's keeping and the finiteness check are one operation per batch.
    A step in which some rank has called hvd.join() sends every M dense (finish_dense); the join check is read
    only there, since launch() is the same either way (join.py). P, Q and Q's agreement go by stable names
    (backend.stable_name): a joined rank answers them with zeros whatever step the others are at.

    State: e per tensor and rank (error feedback, as every residual: resume.py), and Q per tensor, the same on every
    rank, kept as a per-rank state beside the residuals (a tensor in state_dict(), a tf.Variable). Whether Q holds
    the last step's factors ("warm") is the method's shared state. A checkpoint restores Q on the ranks that load it;
    the first compressed step after the method takes on a checkpoint's shared state first gives every rank rank
    0's Q (one allreduce in which the other ranks send zeros: exact), so Horovod's rank-0 resume pattern continues
    with the checkpoint's Q on every rank."""

    Record = PowerSGDRecord
    join_decided_at_finish = True  # launch(): DenseSplit's allreduce, or M = g + e locally

    def __init__(self, spec, ctx, sizes):
        super().__init__(spec, ctx, sizes)
        self.be = ctx.be
        self.codec = with_feedback(spec, Codec())  # M = g (+ e): what P Q^T approximates
        self.wire_dtype = VALUE_DTYPES[spec.value_dtype][0]
        self.q = {}  # tensor name -> its Q's state (m * r float32)
        self.warm = False  # shared: every Q holds the last compressed step's factors
        self.agree = False  # a checkpoint's state was taken on: rank 0's Q goes to every rank before it is used
        self.step_items = []  # the matrices of the step being finished: (numel, n, m, r)

    # ------------------------------------------------------------------------------------------------ launch
    def launch(self, be, item):
        layout = self.spec.layout(be.shape(item.grad))
        if layout is None:
            return DenseSplit.launch(be, self.ctx, item)
        item.kind, item.work.layout = "matrix", layout
        count_dense(self.ctx, item)
        self._q_state(be, item)  # made here, outside the step's branches (a tf.Variable is made once)
        with self.ctx.timed("compress_seconds"):
            item.work.flat = self.codec.prepare(be, item, be.flat32(item.grad))
        return item

    def _q_state(self, be, item):
        if item.name not in self.q:
            self.q[item.name] = be.residual(item.name + Q_SUFFIX, q_elements(item), item)
        return self.q[item.name]

    # ------------------------------------------------------------------------------------------------ finish
    def finish(self, be, items):
        DenseSplit.finish(be, self.ctx, [i for i in items if i.kind == "small"])
        matrices = [i for i in items if i.kind == "matrix"]
        if not matrices:
            return
        self.step_items = [(i.numel,) + tuple(i.work.layout) for i in matrices]
        compressed, q_source = be.host(self._decide, [self.ctx.step], ("int32", "int32"))
        outputs = be.switch(compressed, [lambda: self._dense(be, matrices),
                                         lambda: self._compressed(be, matrices, q_source)])
        for item, avg, finite in zip(matrices, outputs[:len(matrices)], outputs[len(matrices):]):
            be.write(item, avg)
            self.ctx.require(finite, f"{item.name!r} (NaN/Inf on some rank, or a factor beyond the fp16 range: "
                                     f"try value_dtype='fp32')")

    def _decide(self, step):
        """On the host, the same on every rank: (0, 0) before start_iter, else (1, where Q comes from: 0 drawn,
        1 the last step's, 2 rank 0's, once after a checkpoint's state was taken on)."""
        self.be.shared_state_read(self)  # TensorFlow: a checkpoint may have restored it
        if int(step) < self.spec.start_iter:
            self.ctx.stats.extra["compressing"] = False
            self.ctx.count_decided(**self.dense_bytes())
            return 0, 0
        warm = self.warm and self.spec.warm_start
        source = (2 if self.agree else 1) if warm else 0
        self.agree = False
        if self.spec.warm_start and not self.warm:
            self.warm = True
            self.be.shared_state_written(self)
        self.ctx.stats.extra["compressing"] = True
        self.ctx.count_decided(**self.compressed_bytes(agree=source == 2))
        return 1, source

    def dense_bytes(self):
        nbytes = 4 * sum(numel for numel, *_ in self.step_items)
        return {"payload_bytes": nbytes, "wire_bytes": allreduce_wire_bytes(nbytes, self.be.nranks)}

    def compressed_bytes(self, agree=False):
        """P and Q, one buffer each (PowerSGD.factor_bytes), and, once after a checkpoint, Q's agreement in
        float32 (q_elements, the state's)."""
        factors = [self.spec.factor_bytes(layout) for _, *layout in self.step_items]
        p = sum(f[0] for f in factors)
        q = sum(f[1] for f in factors)
        agreed = 4 * sum(m * r for _, n, m, r in self.step_items) if agree else 0
        nranks = self.be.nranks
        return {"payload_bytes": p + q + agreed, "compressed_elements": sum(s[0] for s in self.step_items),
                "wire_bytes": allreduce_wire_bytes(p, nranks) + allreduce_wire_bytes(q, nranks)
                + allreduce_wire_bytes(agreed, nranks)}

    def finish_dense(self, be, items):
        """A step in which some rank has called hvd.join(): every matrix's M by allreduce, after which e = 0, as
        Method.launch_dense sends g + r (the ranks still training apply Horovod's own average)."""
        DenseSplit.finish(be, self.ctx, [i for i in items if i.kind == "small"])
        matrices = [i for i in items if i.kind == "matrix"]
        for item in matrices:
            self.ctx.count(payload_bytes=4 * item.numel, wire_bytes=allreduce_wire_bytes(4 * item.numel, be.nranks))
        averages = self._dense(be, matrices)
        for item, avg, finite in zip(matrices, averages[:len(matrices)], averages[len(matrices):]):
            be.write(item, avg)
            self.ctx.require(finite, f"{item.name!r} (after averaging)")

    def _dense(self, be, items):
        """Every matrix's M by allreduce, after which e = 0 (before start_iter e is already 0); then whether each
        average is finite."""
        futures = [send_dense(be, item, item.work.flat, self.codec, "powersgd.dense") for item in items]
        averages = [be.wait(f) for f in futures]
        return averages + [be.all_finite(avg) for avg in averages]

    def _batches(self, items):
        """Groups of matrices multiplied as one batch: one shape each with batch_tensors, else one matrix each."""
        if not self.spec.batch_tensors:
            return [[item] for item in items]
        groups = {}
        for item in items:
            groups.setdefault(item.work.layout, []).append(item)
        return list(groups.values())

    def _compressed(self, be, items, q_source):
        batches = self._batches(items)
        shapes = [(len(b),) + tuple(b[0].work.layout) for b in batches]  # (B, n, m, r)
        qs = be.switch(q_source, [lambda: self._drawn_q(be, batches), lambda: self._kept_q(be, batches),
                                  lambda: self._agreed_q(be, batches)])
        ortho = self.spec.orthogonalization
        with self.ctx.timed("compress_seconds"):
            # M of a batch: its residuals' one buffer where the backend fuses them (e = M - P Q^T is then one
            # subtraction), else its matrices' M concatenated
            fused = [self.codec.fused(be, b) for b in batches]
            ms = [be.reshape(be.concat([i.work.flat for i in b]) if m is None else m, (s[0], s[1], s[2]))
                  for b, s, m in zip(batches, shapes, fused)]
            qs = [be.orthogonalize(be.reshape(q, (s[0], s[2], s[3])), ortho) for q, s in zip(qs, shapes)]
            ps = [be.matmul(mat, q) for mat, q in zip(ms, qs)]
        order = [item.index for item in items]
        ps = self._allreduce_factors(be, ps, batches, order, [(b, n, r) for b, n, m, r in shapes], "sum", "powersgd.p")
        with self.ctx.timed("compress_seconds"):
            ps = [be.orthogonalize(p, ortho) for p in ps]
            qs = [be.matmul(mat, p, transpose_a=True) for mat, p in zip(ms, ps)]
        qs = self._allreduce_factors(be, qs, batches, order, [(b, m, r) for b, n, m, r in shapes],
                                     "sum" if be.divisor == 1.0 else "average", "powersgd.q")
        averages, finite = {}, {}
        with self.ctx.timed("decompress_seconds"):
            for batch, s, p, q, m in zip(batches, shapes, ps, qs, fused):
                approx = be.reshape(be.matmul(p, q, transpose_b=True), (-1,))
                q_flat = be.reshape(q, (-1,))
                if m is not None:  # e = M - P Q^T for the batch, in its residuals' buffer
                    be.sub(m, approx, in_place=True)
                if self.spec.warm_start:
                    q_kept = self._fused_q(be, batch)
                    if q_kept is not None:
                        be.assign(q_kept, q_flat)
                approx = be.split(approx, [i.numel for i in batch])
                q_parts = be.split(q_flat, [s[2] * s[3]] * s[0])
                # A = P Q^T is finite where Q is (P: orthonormal columns, or NaN with Q, since Q = M^T P; |A| <=
                # r max|Q|): each matrix's Q, m x r, is checked instead of its A, n x m
                q_finite = be.all_finite_rows(be.reshape(q, (s[0], s[2] * s[3]))) if s[0] > 1 else [be.all_finite(q)]
                for item, a, q_item, q_ok in zip(batch, approx, q_parts, q_finite):
                    if m is None:  # with error feedback e = M - P Q^T, in M's storage (r's own where it can)
                        self.codec.keep_difference(be, item, item.work.flat, a)
                    if self.spec.warm_start and q_kept is None:
                        be.assign(self.q[item.name], q_item)
                    averages[item.index] = a
                    finite[item.index] = q_ok
        return [averages[item.index] for item in items] + [finite[item.index] for item in items]

    def _allreduce_factors(self, be, factors, batches, order, shapes, op, prefix):
        """The factors of every batch (of `shapes`) as one buffer in the wire dtype, allreduced; back as float32,
        each in its shape. The buffer holds them matrix by matrix in the step's order (`order`, the matrices'
        indices) whatever the batches, so each element is reduced at the place, and so in the order (a ring's at 3
        or more ranks), it would be unbatched: the same bits with batch_tensors either way."""
        batched = any(len(b) > 1 for b in batches)
        flats = [be.reshape(f, (-1,)) for f in factors]
        if batched:
            pieces, sizes = {}, {}
            for flat, batch, (count, rows, r) in zip(flats, batches, shapes):
                pieces.update(zip((i.index for i in batch), be.split(flat, [rows * r] * count)))
                sizes.update((i.index, rows * r) for i in batch)
            flats = [pieces[index] for index in order]
        reduced = be.cast(be.wait(be.allreduce(be.cast(be.concat(flats), self.wire_dtype), be.stable_name(prefix),
                                               op)), "float32")
        if batched:
            pieces = dict(zip(order, be.split(reduced, [sizes[index] for index in order])))
            parts = [be.concat([pieces[i.index] for i in batch]) for batch in batches]
        else:
            parts = be.split(reduced, [b * rows * r for b, rows, r in shapes])
        return [be.reshape(part, shape) for part, shape in zip(parts, shapes)]

    def _drawn_q(self, be, batches):
        normal, seed, step = be.kernels.normal, self.ctx.seed, self.ctx.step
        return [be.concat([normal(q_elements(i), seed, step, tensor_key(i.name), i.work.flat) for i in b])
                for b in batches]

    def _fused_q(self, be, batch):
        """One buffer holding the batch's kept Q (feedback.fused), or None."""
        return fused_states(be, self.q, [i.name for i in batch])

    def _kept_q(self, be, batches):
        kept = [self._fused_q(be, b) for b in batches]
        return [be.concat([be.read(self.q[i.name]) for i in b]) if q is None else be.read(q)
                for b, q in zip(batches, kept)]

    def _agreed_q(self, be, batches):
        """Rank 0's Q on every rank: an allreduce (Sum) in which every other rank sends zeros (x + 0 == x)."""
        kept = self._kept_q(be, batches)
        flat = be.concat(kept)
        if be.rank != 0:
            flat = be.scale(flat, 0.0)
        agreed = be.wait(be.allreduce(flat, be.stable_name("powersgd.agree_q"), "sum"))
        return be.split(agreed, [sum(q_elements(i) for i in b) for b in batches])

    # --------------------------------------------------------------------------------------------------- state
    def state(self, be):
        states = super().state(be)
        states.update({name + Q_SUFFIX: be.export(q) for name, q in self.q.items()})
        return states

    def load_state(self, be, states):
        super().load_state(be, {k: v for k, v in states.items() if not k.endswith(Q_SUFFIX)})
        for key, values in states.items():
            if key.endswith(Q_SUFFIX):
                name = key[:-len(Q_SUFFIX)]
                if name in self.q:
                    be.assign(self.q[name], be.imported(values))
                else:
                    self.q[name] = be.imported_residual(key, values)

    def shared_state(self):
        return {"warm": self.warm}

    def load_shared_state(self, state):
        if state is not None and "warm" in state:
            self.warm = bool(state["warm"])
            self.agree = self.warm

    def on_error(self, be):
        """A failed step may have left NaN in Q: the next compressed step draws Q afresh."""
        super().on_error(be)
        if self.warm:
            self.warm = False
            be.shared_state_written(self)


class PowerSGD(CompressorSpec):
    """PowerSGD (Vogels, Karimireddy, Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
    Optimization", NeurIPS 2019): each matrix-shaped gradient is sent as two rank-r factors P (n x r) and Q (m x r)
    by allreduce, so its bytes per rank, (n + m) r per matrix, do not grow with the number of ranks. The step is
    PowerSGDMethod's; the math python/hvdext_reference/powersgd.py.

    The arguments follow PyTorch's PowerSGDState, one by one:
        rank: the hook's matrix_approximation_rank, r (>= 1; capped at min(n, m) per matrix). Start at 1 and double
            until accuracy suffices; 1-4 is typical (the paper's NLP tasks used up to 32). Default 4 (the hook: 1),
            which keeps dense's accuracy on models it was not tuned for.
        start_iter: start_powerSGD_iter: steps 0 .. start_iter - 1 allreduce dense (the early steps are the most
            sensitive to compression); the hook suggests 10% of the steps. Default 10 (the hook: 1,000, which would
            leave a short job dense). The hook's requirement start_iter > 1 comes from DDP's bucket rebuild, which
            Horovod does not do: any start_iter >= 0 is valid.
        min_compression_rate: a matrix is compressed only if (n + m) r * min_compression_rate < n m; others (and
            1-D tensors) go dense by allreduce. Default 2, as the hook's.
        error_feedback: use_error_feedback: e = M - P Q^T is added to the next step's gradient. Default True. The
            hook also keeps an error for the tensors it sends dense (the difference between each rank's gradient
            and the mean, which sums to zero over the ranks and changes no average); here those keep none.
        warm_start: Q of the last step starts the power iteration (otherwise a new draw every step). Default True.
        orthogonalization: "gram_schmidt" (default: every rank, both frameworks and the NumPy reference run the
            same column-by-column steps) or "qr" (the framework's QR factorization; the hook uses it for r > 2 in
            float32). A zero column stays zero (its norm is clamped to FLT_MIN) where the hook's default epsilon 0
            gives NaN, so orthogonalization_epsilon has no counterpart; a column of tiny values (below about
            1e-19, whose squares underflow float32: a deep net's first layers) is scaled by a power of two before
            its norm is taken, so it is normalized as a larger one would be (the hook divides by a norm of 0).
        batch_tensors: batch_tensors_with_same_shape: matrices of one shape are multiplied as one batch (fewer
            kernel launches, the same bits: each matrix's factors are reduced at its own place in the buffer).
            Default True (the hook: False, since its batch is a copy of the matrices; here, where the backend can
            (PyTorch), a batch's residuals and kept Q share one buffer, so with error feedback the batch copies
            nothing and e = M - P Q^T is one subtraction per batch).
        value_dtype: "fp32" or "fp16": the dtype of P and Q on the wire (half the bytes; a factor beyond the fp16
            range fails the step on every rank). The products are computed in float32 either way (the hook:
            in the gradient's dtype).
        seed: the random key of the normal draw of Q (None: rank 0's, agreed at the first step). The hook seeds a
            NumPy RandomState; here the draw is counter-based on (seed, step, tensor), the same on every rank and
            in both frameworks.
    P and Q of all tensors travel as one buffer each per step (the hook: one per DDP bucket); the tensors that go
    dense travel by Horovod's allreduce with its tensor fusion.
    """

    encodes_alone = False  # see CompressorSpec

    name = "powersgd"
    payload = True
    method = PowerSGDMethod

    def __init__(self, rank=4, start_iter=10, min_compression_rate=2, error_feedback=True, warm_start=True,
                 orthogonalization="gram_schmidt", batch_tensors=True, value_dtype="fp32", seed=None):
        super().__init__(rank=check_int("powersgd rank", rank, low=1),
                         start_iter=check_int("powersgd start_iter", start_iter, low=0),
                         min_compression_rate=check_real("powersgd min_compression_rate", min_compression_rate,
                                                         low=0.0),
                         error_feedback=check_bool("powersgd error_feedback", error_feedback),
                         warm_start=check_bool("powersgd warm_start", warm_start),
                         orthogonalization=check_choice("powersgd orthogonalization", orthogonalization,
                                                        ORTHOGONALIZATIONS),
                         batch_tensors=check_bool("powersgd batch_tensors", batch_tensors),
                         value_dtype=check_choice("powersgd value_dtype", value_dtype, tuple(VALUE_DTYPES)),
                         seed=check_int("powersgd seed", seed, low=0, high=2 ** 64, allow_none=True))

    travels = "runs two allreduces per step (P, then Q from the reduced P); Horovod's own DistributedOptimizer " \
              "would allreduce one compressed tensor"

    def layout(self, shape):
        """(n, m, r) of a tensor of `shape` as its n x m matrix, or None where it goes dense (matrix_layout)."""
        return matrix_layout(shape, self.rank, self.min_compression_rate)

    def factor_bytes(self, layout):
        """(P's bytes, Q's bytes) of a matrix of `layout` (n, m, r) on the wire: n r and m r values of value_dtype
        ((n + m) r x 4 bytes in all with fp32, x 2 with fp16). They travel in two allreduces, each with the
        factors of every matrix."""
        n, m, r = layout
        itemsize = VALUE_DTYPES[self.value_dtype][1]
        return n * r * itemsize, m * r * itemsize

    def payload_bytes(self, shape):
        """Both factors of a tensor of `shape` (factor_bytes of its layout), or 4 * numel where it goes dense:
        scalars and 1-D tensors, and matrices unless (n + m) r * min_compression_rate < n m (matrix_layout)."""
        shape, numel = shape_and_numel(shape)
        layout = self.layout(shape)
        return 4 * numel if layout is None else sum(self.factor_bytes(layout))
