"""Averages gradients across Horovod ranks with a compressor, for DistributedGradientTape and the Keras 3
DistributedOptimizer alike (horovod_ext.torch's transports, in TensorFlow ops).

Works eagerly and inside tf.function: the settings check runs once, eagerly (tf.init_scope), the first time the
gradients are traced or computed; the step counter and the seed live in tf.Variables (checkpointable with
tf.train.Checkpoint(aggregator=...)). A NaN/Inf gradient fails the step on every rank: FloatingPointError when
eager, tf.errors.InvalidArgumentError with the same message inside tf.function.
"""
import json
import re

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from horovod_ext import __version__
from horovod_ext.compression import CompressionStats, SettingsMismatchError, is_payload_compressor
from horovod_ext.compression.consistency import agree, optimizer_settings, split_blobs
from horovod_ext.compression.gravac import GravacController
from horovod_ext.compression.horovod_args import check_predivide
from horovod_ext.compression.specs import check_tensor, describe_compression, element_limit, k_of
from horovod_ext.compression.two_phase import TwoPhasePlan, choose_transport, scale_sharing_bytes
from horovod_ext.compression.join import JOIN_CHECK_BYTES, a_rank_joined, join_check_wire_bytes
from horovod_ext.compression.wire import allgather_wire_bytes, allreduce_wire_bytes, tensor_key
from .ops import TernaryCodec, TopKCodec, seed_tensor

OP_NAMES = {hvd.Average: "Average", hvd.Sum: "Sum", hvd.Adasum: "Adasum"}


def variable_names(variables):
    """Stable names for the tensors' keys and collectives: Keras 3 paths, else tf.Variable names, made unique."""
    names, seen = [], {}
    for v in variables:
        name = getattr(v, "path", None) or getattr(v, "name", None) or "tensor"
        name = name[:-2] if name.endswith(":0") else name
        count = seen.get(name, 0)
        seen[name] = count + 1
        names.append(name if count == 0 else f"{name}.{count}")
    return names


def collective_name(prefix, index, name):
    """Horovod's name for a tensor's collective. Inside tf.function Horovod takes names containing '/' apart, so
    'a/dense/bias' and 'a/dense_1/bias' collide ("a tensor with the same name ... is currently being processed");
    the index keeps normalized names unique. (The random key uses the real name.)"""
    return f"{prefix}.{index}." + re.sub(r"[^A-Za-z0-9_.]", "_", name)


def _fail(message, condition):
    """Raise on every rank: eagerly as FloatingPointError, in a graph through an assertion."""
    if tf.executing_eagerly():
        if not bool(condition):
            raise FloatingPointError(message)
        return []
    return [tf.debugging.Assert(condition, [message])]


class GradientAggregator(tf.Module):
    """Horovod's arguments, with Horovod's meaning: ``sparse_as_dense`` (IndexedSlices gradients, from tf.gather or
    embeddings, are densified and compressed like any dense gradient; else they travel as Horovod sends them, an
    allgather of values and indices, and stay IndexedSlices), ``gradient_predivide_factor`` (linear compressors:
    the sum of g / f, times f / size), ``device_dense`` / ``device_sparse`` (where the collectives are placed),
    ``scale_local_gradients`` (gradients of variables registered with register_local_var are not communicated and,
    if True, are divided by the number of ranks)."""

    def __init__(self, compression, op, process_set, name="horovod_ext_aggregator", sparse_as_dense=False,
                 gradient_predivide_factor=1.0, device_dense="", device_sparse="", scale_local_gradients=True):
        super().__init__(name=name)
        if compression is None:
            compression = hvd.Compression.none
        if op is None:
            op = hvd.Average
        self.predivide = check_predivide(gradient_predivide_factor, op == hvd.Average)
        self.sparse_as_dense = bool(sparse_as_dense)
        self.device_dense, self.device_sparse = device_dense, device_sparse
        self.scale_local_gradients = bool(scale_local_gradients)
        self._local_refs = set()
        if not is_payload_compressor(compression) and not (hasattr(compression, "compress")
                                                            and hasattr(compression, "decompress")):
            raise TypeError(f"compression must be one of hvd.Compression.none, fp16, ternary (or a Horovod "
                            f"Compressor), got {compression!r}")
        if is_payload_compressor(compression) and op not in (hvd.Average, hvd.Sum):
            raise ValueError(f"op must be hvd.Average or hvd.Sum with Compression.{compression.name}, got {op!r}")
        self.compression = compression
        self.op = op
        self.process_set = process_set
        # Created eagerly even when the first wrap happens inside a tf.function: variables created while tracing
        # make tf.function trace and run the step twice (and Horovod rejects the second, same-named collectives).
        with tf.init_scope():
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
            self.seed = tf.Variable(0, dtype=tf.int64, trainable=False, name="seed")
            # GraVAC's controller state as JSON: the source of truth, so that restoring a checkpoint restores it
            self.controller_state = tf.Variable("", dtype=tf.string, trainable=False, name="controller_state")
        self.residuals = {}
        self.controller = GravacController(compression, process_set.size()) \
            if getattr(compression, "name", "") == "adaptive_topk" else None
        self._sizes = []
        self._agreed = None
        self._transport = None
        self._bytes_per_step = {}
        self.stats = CompressionStats(getattr(compression, "name", getattr(compression, "__name__", "custom")))

    # --------------------------------------------------------------------------------------------- agreement
    def _allgather_blobs(self, blob):
        data = tf.constant(np.frombuffer(blob, dtype=np.uint8))
        tag = f"horovod_ext.settings.{self.name}"
        sizes = hvd.allgather(tf.constant([len(blob)], dtype=tf.int64), name=tag + ".sizes",
                              ignore_name_scope=True, process_set=self.process_set).numpy().tolist()
        gathered = hvd.allgather(data, name=tag, ignore_name_scope=True, process_set=self.process_set)
        return split_blobs(gathered.numpy().tobytes(), sizes)

    def _agree(self, names, grads):
        if self._agreed == names:
            return
        if isinstance(self._agreed, Exception):
            raise self._agreed
        tensors = [(n, tuple(g.shape.as_list()), g.dtype.name) for n, g in zip(names, grads)]
        settings = optimizer_settings(describe_compression(self.compression), OP_NAMES.get(self.op, str(self.op)),
                                      tensors, self.process_set.size(), __version__)
        with tf.init_scope():  # eager, also while a tf.function is being traced
            try:
                proposal = agree(settings, self._allgather_blobs, "horovod_ext (TensorFlow)")
            except SettingsMismatchError as exc:
                self._agreed = exc
                raise
            if is_payload_compressor(self.compression) and self._agreed is None:
                given = getattr(self.compression, "seed", None)
                seed = given if given is not None else proposal["seed"]
                if int(self.step.numpy()) == 0:  # a run restored from a checkpoint keeps its seed
                    self.seed.assign(seed_tensor(seed))
        self._agreed = names

    # ------------------------------------------------------------------------------------------ aggregation
    def register_local_var(self, var):
        """Horovod's register_local_var / register_local_source: this variable's gradient stays local."""
        self._local_refs.add(id(var))

    def aggregate(self, grads, variables):
        """The averaged (or summed) gradients, in the order given; None gradients stay None. Gradients of local
        variables stay local; IndexedSlices travel by Horovod's sparse allreduce unless sparse_as_dense."""
        out = list(grads)
        local = [i for i, v in enumerate(variables) if id(v) in self._local_refs and grads[i] is not None]
        sparse = [i for i, g in enumerate(grads) if isinstance(g, tf.IndexedSlices) and not self.sparse_as_dense
                  and i not in local]
        dense = [i for i, g in enumerate(grads) if g is not None and i not in local and i not in sparse]
        with tf.device(self.device_dense):
            for i, g in zip(dense, self._aggregate_dense([grads[i] for i in dense], [variables[i] for i in dense])):
                out[i] = g
        with tf.device(self.device_sparse):
            for n, i in enumerate(sparse):
                out[i] = hvd.allreduce(grads[i], op=self.op,
                                       name=collective_name("hvdext.sparse", n, variables[i].name),
                                       ignore_name_scope=True, process_set=self.process_set)
        size = self.process_set.size()
        for i in local:
            g = grads[i]
            if self.scale_local_gradients:
                g = tf.IndexedSlices(g.values / size, g.indices, g.dense_shape) if isinstance(g, tf.IndexedSlices) \
                    else g / size
            out[i] = g
        return out

    def _aggregate_dense(self, grads, variables):
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
        names = variable_names([v for _, v in pairs])
        present = [g for g, _ in pairs]
        payload = is_payload_compressor(self.compression)
        if payload:
            what = f"Compression.{self.compression.name}"
            limit = element_limit(self.compression)
            for name, g in zip(names, present):
                check_tensor(what, name, g.dtype.name, g.shape.num_elements(), g.shape.as_list(), **limit)
        self._agree(names, present)
        if not payload:
            out = self._linear(names, present)
        else:
            compressed = self._ternary if self.compression.name == "ternary" else self._topk
            out = self._unless_a_rank_joined(names, present, compressed)
        result, it = [], iter(out)
        for g in grads:
            result.append(None if g is None else next(it))
        return result

    def _unless_a_rank_joined(self, names, grads, compressed):
        """The compressed path, unless some rank has called hvd.join(): then every gradient goes dense by allreduce.
        Checked eagerly only (see horovod_ext.compression.join)."""
        if not tf.executing_eagerly():
            return compressed(names, grads)
        size = self.process_set.size()
        training = hvd.allreduce(tf.constant([1], tf.int32), op=hvd.Sum, name="hvdext.training",
                                 ignore_name_scope=True, process_set=self.process_set)
        out = self._join_dense(names, grads) if a_rank_joined(int(training[0]), size) else compressed(names, grads)
        self._count(payload_bytes=JOIN_CHECK_BYTES, wire_bytes=join_check_wire_bytes(size))
        return out

    def _join_dense(self, names, grads):
        if self.controller is not None:  # this step is no decision: the next step's time is not the last CF's
            self.controller.forget_step_time()
        outs = []
        for i, (name, g) in enumerate(zip(names, grads)):
            send = g
            residual = self.residuals.get(name)
            if residual is not None and getattr(self.compression, "error_feedback", False):
                send = g + tf.cast(tf.reshape(residual, g.shape), g.dtype)
                residual.assign(tf.zeros_like(residual))
            outs.append(hvd.allreduce(send, op=self.op, name=collective_name("hvdext.join", i, name),
                                      ignore_name_scope=True, process_set=self.process_set))
        with tf.control_dependencies(outs):
            self.step.assign_add(1)
            return [tf.identity(o) for o in outs]

    def _count(self, **amounts):
        for key, value in amounts.items():
            self._bytes_per_step[key] = self._bytes_per_step.get(key, 0) + value

    def _linear(self, names, grads):
        nranks = self.process_set.size()
        self._bytes_per_step = {}
        out = []
        for index, (name, g) in enumerate(zip(names, grads)):
            scale = {} if self.predivide == 1.0 else {"prescale_factor": 1.0 / self.predivide,
                                                       "postscale_factor": self.predivide}
            out.append(hvd.allreduce(g, op=self.op, compression=self.compression,
                                     name=collective_name("hvdext", index, name),
                                     ignore_name_scope=True, process_set=self.process_set, **scale))
            dense = g.shape.num_elements() * g.dtype.size
            sent = dense // 2 if self.compression is hvd.Compression.fp16 and g.dtype.size == 4 else dense
            self._count(payload_bytes=sent, dense_bytes=dense, elements=g.shape.num_elements(),
                        wire_bytes=allreduce_wire_bytes(sent, nranks), dense_wire_bytes=allreduce_wire_bytes(dense, nranks))
        with tf.control_dependencies(out):
            self.step.assign_add(1)
        return out

    def _ternary(self, names, grads):
        spec, ps = self.compression, self.process_set
        nranks, rank = ps.size(), ps.rank()
        divisor = float(nranks) if self.op == hvd.Average else 1.0
        codec = TernaryCodec(spec, rank)
        sizes = [g.shape.num_elements() for g in grads]
        if self._transport is None:
            self._transport = choose_transport(spec.transport, spec.shared_scale,
                                               [n for n in sizes if n >= spec.min_size], nranks, spec.packing)
            self.stats.extra["transport"] = self._transport
        self._bytes_per_step = {}
        step, seed = self.step.read_value(), self.seed.read_value()
        out = [None] * len(grads)
        checks = []
        compressed = []
        for i, (name, g, n) in enumerate(zip(names, grads, sizes)):
            dense = n * g.dtype.size
            self._count(dense_bytes=dense, elements=n, dense_wire_bytes=allreduce_wire_bytes(dense, nranks))
            if n < spec.min_size:
                avg = hvd.allreduce(g, op=self.op, name=collective_name("hvdext", i, name), ignore_name_scope=True,
                                    process_set=ps)
                checks += _fail(f"NaN or Inf in the gradient of {name!r} (after averaging)",
                                tf.reduce_all(tf.math.is_finite(avg)))
                out[i] = avg
                self._count(payload_bytes=dense, wire_bytes=allreduce_wire_bytes(dense, nranks))
                continue
            flat = tf.reshape(tf.cast(g, tf.float32), [-1])
            threshold, scale = codec.local_scale(flat)
            compressed.append([i, name, flat, threshold, scale])
        if spec.shared_scale and compressed:
            local = tf.stack([c[4] for c in compressed])
            agreed = hvd.allreduce(local, op=hvd.Max, name="hvdext.shared_scales", ignore_name_scope=True,
                                   process_set=ps)
            self._count(payload_bytes=4 * len(compressed), wire_bytes=scale_sharing_bytes(len(compressed), nranks))
            for j, c in enumerate(compressed):
                checks += _fail(f"NaN or Inf in the gradient of {c[1]!r} (on at least one rank)",
                                agreed[j] < np.inf)
            with tf.control_dependencies(checks):
                for j, c in enumerate(compressed):
                    c[4] = tf.identity(agreed[j])
        if self._transport == "two_phase" and compressed:
            averaged = self._two_phase(codec, compressed, step, seed, nranks, rank, divisor)
        else:
            averaged = []
            for i, name, flat, threshold, scale in compressed:
                payload = codec.encode(flat, threshold, scale, seed, step, tensor_key(name))
                gathered = hvd.allgather(payload, name=collective_name("hvdext.ternary", i, name), ignore_name_scope=True,
                                         process_set=ps)
                avg, bad = codec.decode_average(gathered, nranks, flat.shape.num_elements(), divisor)
                if tf.executing_eagerly():
                    checks += _fail(f"NaN or Inf in the gradient of {name!r} (on rank {int(bad)})", bad == -1)
                else:
                    checks.append(tf.debugging.Assert(tf.equal(bad, -1), [
                        f"NaN or Inf in the gradient of {name!r} on rank", bad]))
                averaged.append(avg)
                nbytes = payload.shape.num_elements() if payload.shape.num_elements() is not None else \
                    4 + (flat.shape.num_elements() + 4) // 5
                self._count(payload_bytes=nbytes, wire_bytes=allgather_wire_bytes(nbytes, nranks),
                            compressed_elements=flat.shape.num_elements())
        for (i, *_), avg in zip(compressed, averaged):
            out[i] = tf.cast(tf.reshape(avg, grads[i].shape), grads[i].dtype)
        with tf.control_dependencies(checks + [o for o in out if o is not None]):
            out = [tf.identity(o) for o in out]
            self.step.assign_add(1)
        return out

    def _two_phase(self, codec, compressed, step, seed, nranks, rank, divisor):
        """Phase 1 alltoall of packed code chunks, exact sums re-encoded, phase 2 allgather, decode."""
        ps = self.process_set
        sizes = [c[2].shape.num_elements() for c in compressed]
        plan = TwoPhasePlan(sizes, nranks, self.compression.packing)
        codes = tf.concat([codec.encode_codes(flat, threshold, scale, seed, step, tensor_key(name))
                           for _, name, flat, threshold, scale in compressed], axis=0)
        send = tf.concat([codec.pack(codes[plan.bounds[j]:plan.bounds[j + 1]]) for j in range(nranks)], axis=0)
        received, _ = hvd.alltoall(send, splits=tf.constant(plan.send_splits, dtype=tf.int32),
                                   name="hvdext.two_phase.alltoall", ignore_name_scope=True, process_set=ps)
        stream = codec.sum_reencode(received, nranks, plan.counts[rank], plan.bits)
        gathered = hvd.allgather(stream, name="hvdext.two_phase.allgather", ignore_name_scope=True, process_set=ps)
        pieces = [[] for _ in compressed]
        position = 0
        for j, size in enumerate(plan.stream_sizes):
            chunk = gathered[position:position + size]
            position += size
            for t, first, count, _ in plan.pieces(j):
                pieces[t].append(codec.decode_levels(chunk, compressed[t][4], first, count, nranks, plan.bits,
                                                     divisor))
        self._count(payload_bytes=sum(plan.send_splits) + plan.stream_sizes[rank], wire_bytes=plan.wire_bytes(rank),
                    compressed_elements=plan.total)
        return [tf.concat(p, axis=0) if len(p) > 1 else p[0] for p in pieces]

    # ------------------------------------------------------------------------------------------------- top-k
    def _residual(self, name, numel):
        if name not in self.residuals:
            with tf.init_scope():
                self.residuals[name] = tf.Variable(tf.zeros([numel]), trainable=False,
                                                   name="residual_" + re.sub(r"[^A-Za-z0-9_]", "_", name))
        return self.residuals[name]

    def _topk(self, names, grads):
        spec, ps = self.compression, self.process_set
        nranks = ps.size()
        divisor = float(nranks) if self.op == hvd.Average else 1.0
        codec = TopKCodec(spec)
        sizes = [g.shape.num_elements() for g in grads]
        self._sizes = sizes
        self._bytes_per_step = {}
        checks, updates = [], []
        work = []  # (index, name, n, g_ef, residual variable)
        energy_ef = []
        for i, (name, g, n) in enumerate(zip(names, grads, sizes)):
            flat = tf.reshape(tf.cast(g, tf.float32), [-1])
            residual = self._residual(name, n)
            base = residual.read_value() if spec.error_feedback else tf.zeros([n])
            g_ef, sumsq = codec.accumulate(flat, base)
            work.append((i, name, n, g_ef, residual))
            energy_ef.append(sumsq)

        def gather(idx_of, tag):
            """Send the selected elements of every tensor; returns the averaged flats."""
            outs = []
            for (i, name, n, g_ef, residual), idx in zip(work, idx_of):
                payload, remainder = codec.extract(g_ef, idx)
                if spec.error_feedback:
                    residual.assign(remainder)
                gathered = hvd.allgather(payload, name=collective_name(f"hvdext.{tag}", i, name),
                                         ignore_name_scope=True, process_set=ps)
                avg, _ = codec.decode_average(gathered, tf.size(idx), nranks, n, divisor)
                outs.append(avg)
            return outs

        if self.controller is None:
            ks = [k_of(n, 1.0 / spec.ratio) for n in sizes]
            averaged = gather([codec.select(g_ef, k) for (_, _, _, g_ef, _), k in zip(work, ks)], "topk")
            self._count(payload_bytes=sum(k * (4 + (2 if spec.value_dtype == "fp16" else 4)) for k in ks),
                        dense_bytes=4 * sum(sizes), elements=sum(sizes), compressed_elements=sum(sizes),
                        wire_bytes=allgather_wire_bytes(sum(k * 6 for k in ks), nranks),
                        dense_wire_bytes=allreduce_wire_bytes(4 * sum(sizes), nranks))
        else:
            theta_min, theta_c = tf.py_function(self._cfs, [], [tf.float64, tf.float64])
            firsts, seconds, energy_min, energy_c = [], [], [], []
            for (_, _, n, g_ef, _) in work:
                k1 = tf.clip_by_value(tf.cast(tf.math.ceil(n / theta_min), tf.int32), 1, n)
                k2 = tf.clip_by_value(tf.cast(tf.math.ceil(n / theta_c), tf.int32), 1, k1)
                first = codec.select(g_ef, k1)
                second = codec.select(g_ef, k2, among=first)
                firsts.append(first)
                seconds.append(second)
                energy_min.append(codec.energy(g_ef, first))
                energy_c.append(codec.energy(g_ef, second))
            elapsed = tf.py_function(self._elapsed, [], tf.float64)
            norms = tf.stack([tf.add_n(energy_ef), tf.add_n(energy_min), tf.add_n(energy_c), elapsed])
            agreed = hvd.allreduce(norms, op=hvd.Average, name="hvdext.adaptive_topk.norms", ignore_name_scope=True,
                                   process_set=ps)
            finite = tf.reduce_all(tf.math.is_finite(agreed))
            message = "NaN or Inf in the gradients (their squared norms are not finite on some rank)"
            if tf.executing_eagerly():
                if not bool(finite):
                    self._reset_residuals()
                    raise FloatingPointError(message)
                guard = []
            else:
                guard = [tf.debugging.Assert(finite, [message])]
            with tf.control_dependencies(guard):
                path = tf.py_function(self._decide, [agreed], tf.int32)

            def dense():
                outs = []
                for (i, name, n, g_ef, residual) in work:
                    outs.append(hvd.allreduce(g_ef, op=self.op, name=collective_name("hvdext.topk.dense", i, name),
                                              ignore_name_scope=True, process_set=ps))
                    residual.assign(tf.zeros([n]))
                return outs

            averaged = tf.switch_case(path, [lambda: gather(seconds, "topk.candidate"),
                                             lambda: gather(firsts, "topk.min"), dense])
        out = [None] * len(grads)
        for (i, name, *_), avg in zip(work, averaged):
            if tf.executing_eagerly():
                checks += _fail(f"NaN or Inf in the gradient of {name!r} (on some rank, or beyond the fp16 range: "
                                f"try value_dtype='fp32')", tf.reduce_all(tf.math.is_finite(avg)))
            else:
                checks.append(tf.debugging.Assert(tf.reduce_all(tf.math.is_finite(avg)), [
                    f"NaN or Inf in the gradient of {name!r} (on some rank, or beyond the fp16 range)"]))
            out[i] = tf.cast(tf.reshape(avg, grads[i].shape), grads[i].dtype)
        with tf.control_dependencies(checks + updates + out):
            out = [tf.identity(o) for o in out]
            self.step.assign_add(1)
        return out

    def _reset_residuals(self):
        for residual in self.residuals.values():
            residual.assign(tf.zeros_like(residual))

    def _sync_controller(self):
        """Reload the controller if its variable was restored from a checkpoint (it holds another step)."""
        saved = self.controller_state.numpy().decode()
        if saved:
            state = json.loads(saved)
            if state["step"] != self.controller.step:
                log = self.controller.log[:state["step"]]
                self.controller.load_state({**state, "log": log})

    def _cfs(self):
        self._sync_controller()
        theta_min, theta_c = self.controller.cfs()
        return tf.constant(theta_min, tf.float64), tf.constant(theta_c, tf.float64)

    def _elapsed(self):
        return tf.constant(self.controller.seconds_since_decision(), tf.float64)

    def _decide(self, agreed):
        values = agreed.numpy().tolist()
        try:
            path, cf, gain_min, gain_c = self.controller.decide(*values)
        except FloatingPointError:
            self._reset_residuals()
            raise
        state = self.controller.state()
        state.pop("log")
        self.controller_state.assign(json.dumps(state))
        self.stats.extra.update(cf=cf, path=path, gain_min=gain_min, gain_c=gain_c)
        return tf.constant(("candidate", "min", "dense").index(path), tf.int32)

    # -------------------------------------------------------------------------------------------- statistics
    def compression_stats(self):
        """Bytes per step as counted when the step was built (the same every step) times the steps taken; for
        adaptive_topk summed step by step from the controller's log, which is also returned as "log". Seconds are
        not measured in TensorFlow (a tf.function runs as one graph) and read 0."""
        steps = int(self.step.numpy())
        per_step = {k: self._bytes_per_step.get(k, 0) for k in
                    ("payload_bytes", "dense_bytes", "wire_bytes", "dense_wire_bytes", "elements",
                     "compressed_elements")}
        totals = {k: v * steps for k, v in per_step.items()}
        if self.controller is not None and self.controller.log:
            # GraVAC's bytes change with its CF: sum them step by step from the log
            nranks, dense = self.process_set.size(), 4 * sum(self._sizes)
            sent = [dense if e["path"] == "dense" else 6 * sum(k_of(n, e["cf"]) for n in self._sizes)
                    for e in self.controller.log]
            wire = [allreduce_wire_bytes(b, nranks) if e["path"] == "dense" else allgather_wire_bytes(b, nranks)
                    for b, e in zip(sent, self.controller.log)]
            per_step.update(payload_bytes=sent[-1], wire_bytes=wire[-1], dense_bytes=dense,
                            dense_wire_bytes=allreduce_wire_bytes(dense, nranks), elements=sum(self._sizes),
                            compressed_elements=sum(self._sizes))
            totals = {k: v * len(sent) for k, v in per_step.items()}
            totals.update(payload_bytes=sum(sent), wire_bytes=sum(wire))
        stats = self.stats.as_dict()
        if self.controller is not None:
            stats.update(self.controller.observations())
        stats.update(steps=steps, ranks=self.process_set.size(), seed=int(self.seed.numpy()) % 2 ** 64,
                     last_step=CompressionStats._summary({**per_step, "compress_seconds": 0.0,
                                                          "decompress_seconds": 0.0, "comm_seconds": 0.0}),
                     total=CompressionStats._summary({**totals, "compress_seconds": 0.0,
                                                      "decompress_seconds": 0.0, "comm_seconds": 0.0}))
        return stats
