"""Averages gradients across Horovod ranks with a compressor, for DistributedGradientTape and the Keras 3
DistributedOptimizer alike (horovod_ext.torch's transports, in TensorFlow ops).

Works eagerly and inside tf.function: the settings check runs once, eagerly (tf.init_scope), the first time the
gradients are traced or computed; the step counter and the seed live in tf.Variables (checkpointable with
tf.train.Checkpoint(aggregator=...)). A NaN/Inf gradient fails the step on every rank: FloatingPointError when
eager, tf.errors.InvalidArgumentError with the same message inside tf.function.
"""
import re

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from horovod_ext import __version__
from horovod_ext.compression import CompressionStats, SettingsMismatchError, is_payload_compressor
from horovod_ext.compression.consistency import agree, optimizer_settings, split_blobs
from horovod_ext.compression.specs import check_tensor, describe_compression
from horovod_ext.compression.two_phase import TwoPhasePlan, choose_transport, scale_sharing_bytes
from horovod_ext.compression.wire import allgather_wire_bytes, allreduce_wire_bytes, tensor_key
from .ops import TernaryCodec, seed_tensor

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
    def __init__(self, compression, op, process_set, name="horovod_ext_aggregator"):
        super().__init__(name=name)
        if compression is None:
            compression = hvd.Compression.none
        if op is None:
            op = hvd.Average
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
                seed = self.compression.seed if self.compression.seed is not None else proposal["seed"]
                if int(self.step.numpy()) == 0:  # a run restored from a checkpoint keeps its seed
                    self.seed.assign(seed_tensor(seed))
        self._agreed = names

    # ------------------------------------------------------------------------------------------ aggregation
    def aggregate(self, grads, variables):
        """The averaged (or summed) gradients, in the order given; None gradients stay None."""
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
        names = variable_names([v for _, v in pairs])
        present = [g for g, _ in pairs]
        payload = is_payload_compressor(self.compression)
        if payload:
            what = f"Compression.{self.compression.name}"
            for name, g in zip(names, present):
                check_tensor(what, name, g.dtype.name, g.shape.num_elements(), g.shape.as_list())
        self._agree(names, present)
        out = self._ternary(names, present) if payload else self._linear(names, present)
        result, it = [], iter(out)
        for g in grads:
            result.append(None if g is None else next(it))
        return result

    def _count(self, **amounts):
        for key, value in amounts.items():
            self._bytes_per_step[key] = self._bytes_per_step.get(key, 0) + value

    def _linear(self, names, grads):
        nranks = self.process_set.size()
        self._bytes_per_step = {}
        out = []
        for index, (name, g) in enumerate(zip(names, grads)):
            out.append(hvd.allreduce(g, op=self.op, compression=self.compression,
                                     name=collective_name("hvdext", index, name),
                                     ignore_name_scope=True, process_set=self.process_set))
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

    # -------------------------------------------------------------------------------------------- statistics
    def compression_stats(self):
        """Bytes per step (counted when the step was built; the same every step) times the steps taken."""
        steps = int(self.step.numpy())
        per_step = {k: self._bytes_per_step.get(k, 0) for k in
                    ("payload_bytes", "dense_bytes", "wire_bytes", "dense_wire_bytes", "elements",
                     "compressed_elements")}
        stats = self.stats.as_dict()
        stats.update(steps=steps, ranks=self.process_set.size(), seed=int(self.seed.numpy()) % 2 ** 64,
                     last_step=CompressionStats._summary({**per_step, "compress_seconds": 0.0,
                                                          "decompress_seconds": 0.0, "comm_seconds": 0.0}),
                     total=CompressionStats._summary({**{k: v * steps for k, v in per_step.items()},
                                                      "compress_seconds": 0.0, "decompress_seconds": 0.0,
                                                      "comm_seconds": 0.0}))
        return stats
