"""Averages gradients across Horovod ranks with a compressor, for DistributedGradientTape and the Keras 3
DistributedOptimizer (keras/optimizer.py) alike: GradientAggregator, the twin of horovod_ext/torch/optimizer.py's
DistributedOptimizer (the same TrainingRun and step driver over the TensorFlow backend).

Works eagerly and inside tf.function: the settings check runs once, eagerly (tf.init_scope), the first time the
gradients are traced or computed; the step counter and the seed live in tf.Variables (checkpointable with
tf.train.Checkpoint(aggregator=...)). A NaN/Inf gradient fails the step on every rank: FloatingPointError when
eager, tf.errors.InvalidArgumentError with the same message inside tf.function.
"""
import horovod.tensorflow as hvd
import tensorflow as tf
from horovod.tensorflow.functions import broadcast_object

from horovod_ext import __version__
from horovod_ext.compression import CompressionStats, is_payload_compressor
from horovod_ext.compression.buckets import BucketPlan, check_bucket_cap_mb
from horovod_ext.compression.consistency import allgather_blobs, optimizer_settings
from horovod_ext.compression.context import StepContext
from horovod_ext.compression.horovod_args import check_predivide, outside_process_set
from horovod_ext.compression.lifecycle import TrainingRun
from horovod_ext.compression.specs import (check_tensor, compression_name, describe_compression, element_limit,
                                           resolved_for)
from .backend import TFBackend, numpy_allgather
from .elastic_state import assign_all, broadcast_variables, numpy_values
from .kernels import script_seed, seed_tensor

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


class VariableCounters:
    """The step counter and the seed in tf.Variables (what tf.train.Checkpoint restores and a graph reads), for
    TrainingRun (compression/lifecycle.py). The seed reads None until it is chosen: at step 0 before this process
    first agreed; a run restored from a checkpoint (step > 0) keeps the checkpoint's."""

    def __init__(self, step, seed):
        self.step_variable, self.seed_variable, self.chosen = step, seed, False

    @property
    def step(self):
        return int(self.step_variable.numpy())

    @step.setter
    def step(self, value):
        self.step_variable.assign(value)

    @property
    def seed(self):
        if not self.chosen and self.step == 0:
            return None
        return int(self.seed_variable.numpy())

    @seed.setter
    def seed(self, value):
        self.seed_variable.assign(seed_tensor(value))
        self.chosen = True


class GradientAggregator(tf.Module):
    """Horovod's arguments, with Horovod's meaning: ``sparse_as_dense`` (IndexedSlices gradients, from tf.gather or
    embeddings, are densified and compressed like any dense gradient; else they travel as Horovod sends them, an
    allgather of values and indices, and stay IndexedSlices), ``gradient_predivide_factor`` (linear compressors:
    the sum of g / f, times f / size), ``device_dense`` / ``device_sparse`` (where the collectives are placed),
    ``scale_local_gradients`` (gradients of variables registered with register_local_var are not communicated and,
    if True, are divided by the number of ranks); and horovod-ext's ``bucket_cap_mb`` (compression/buckets.py: a
    payload compressor's per-tensor collectives fused into one per bucket of at most that many MiB, the same
    bits; 0 keeps one per tensor)."""

    def __init__(self, compression, op, process_set, name="horovod_ext_aggregator", sparse_as_dense=False,
                 gradient_predivide_factor=1.0, device_dense="", device_sparse="", scale_local_gradients=True,
                 bucket_cap_mb=25):
        super().__init__(name=name)
        self.bucket_cap_mb = check_bucket_cap_mb(bucket_cap_mb)
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
        self.op = op
        self.process_set = process_set
        self.outside = outside_process_set(process_set)  # then the gradients stay local, as Horovod's tape leaves them
        # Created eagerly even when the first wrap happens inside a tf.function: variables created while tracing
        # make tf.function trace and run the step twice (and Horovod rejects the second, same-named collectives).
        with tf.init_scope():
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
            self.seed = tf.Variable(0, dtype=tf.int64, trainable=False, name="seed")
            # the method's shared state as JSON (GraVAC's controller, sparse_reduce's regions): the source of truth,
            # so that restoring a checkpoint restores it (TFBackend.shared_state_read / shared_state_written)
            self.method_state = tf.Variable("", dtype=tf.string, trainable=False, name="method_state")
        self.residuals = {}  # error feedback's tf.Variables, by tensor name (tracked for tf.train.Checkpoint)
        self.stats = CompressionStats(compression_name(compression), timed=False)
        self.backend = TFBackend(self, process_set, op, self.predivide)
        # agreement, seed, elastic resets and the method (made at the first step, once the settings are agreed)
        self.context = StepContext(self.stats, built_steps=True)  # a step is built once and run many times
        self.run = TrainingRun(compression, self.context, VariableCounters(self.step, self.seed), self.name,
                               script_seed, what="horovod_ext (TensorFlow)")
        self._agreed_names = None  # the tensors the settings were agreed for

    # --------------------------------------------------------------------------------------------- agreement
    def _agree(self, names, grads):
        """Exchange settings, eagerly (also while a tf.function is traced), before the first step and whenever the
        tensors change (compression/lifecycle.py): SettingsMismatchError on every rank if they differ."""
        run = self.run
        if self._agreed_names != names:
            run.agree_again()
        if run.agreed:
            return
        # packing="auto": the TensorFlow ops run on the host whatever the gradients' device
        run.compression = resolved_for(run.compression, "cpu")
        tensors = [(n, tuple(g.shape.as_list()), g.dtype.name) for n, g in zip(names, grads)]
        settings = optimizer_settings(describe_compression(run.compression), OP_NAMES.get(self.op, str(self.op)),
                                      tensors, self.process_set.size(), __version__,
                                      bucket_cap_mb=self.bucket_cap_mb)
        blobs = lambda blob: allgather_blobs(blob, numpy_allgather(self.process_set),  # noqa: E731
                                             f"horovod_ext.settings.{self.name}")
        buckets = None
        if is_payload_compressor(run.compression):  # the TensorFlow ops run on the host: buckets per dtype
            buckets = BucketPlan([(g.shape.num_elements() * g.dtype.size, g.dtype.name) for g in grads],
                                 self.bucket_cap_mb)
        with tf.init_scope():
            run.agree(settings, blobs, self.backend, [g.shape.num_elements() for g in grads], buckets)
        self._agreed_names = names

    # ------------------------------------------------------------------------------------------ aggregation
    def register_local_var(self, var):
        """Horovod's register_local_var / register_local_source: this variable's gradient stays local."""
        self._local_refs.add(id(var))

    @tf.autograph.experimental.do_not_convert  # Python that builds the step's ops: autograph must not rewrite it
    def aggregate(self, grads, variables):
        """The averaged (or summed) gradients, in the order given; None gradients stay None. Gradients of local
        variables stay local; IndexedSlices travel by Horovod's sparse allreduce unless sparse_as_dense."""
        out = list(grads)
        if self.outside:
            return out
        local = [i for i, v in enumerate(variables) if id(v) in self._local_refs and grads[i] is not None]
        shared = [i for i, g in enumerate(grads) if g is not None and i not in local]
        with tf.device(self.device_dense):  # sparse gradients' collectives on device_sparse (the backend's)
            for i, g in zip(shared, self._aggregate_shared([grads[i] for i in shared],
                                                           [variables[i] for i in shared])):
                out[i] = g
        size = self.process_set.size()
        for i in local:
            g = grads[i]
            if self.scale_local_gradients:
                g = tf.IndexedSlices(g.values / size, g.indices, g.dense_shape) if isinstance(g, tf.IndexedSlices) \
                    else g / size
            out[i] = g
        return out

    def _aggregate_shared(self, grads, variables):
        """The averaged gradients of the variables that are not local, IndexedSlices among them (see aggregate)."""
        pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
        names = variable_names([v for _, v in pairs])
        present = [g for g, _ in pairs]
        if is_payload_compressor(self.run.compression):
            what, limit = f"Compression.{self.run.compression.name}", element_limit(self.run.compression)
            for name, g in zip(names, present):
                if self._sparse_kind(g) != "gather":  # a sparse gradient that travels sparse is not compressed
                    check_tensor(what, name, g.dtype.name, g.shape.num_elements(), g.shape.as_list(), **limit)
        self._agree(names, present)
        out = self._communicate(names, present)
        result, it = [], iter(out)
        for g in grads:
            result.append(None if g is None else next(it))
        return result

    def _sparse_kind(self, g):
        """plan.Item's sparse for gradient g: IndexedSlices travel as Horovod sends them, or dense with
        sparse_as_dense."""
        if not isinstance(g, tf.IndexedSlices):
            return None
        return "dense" if self.sparse_as_dense else "gather"

    def _communicate(self, names, grads):
        """The step driver over every gradient (compression/driver.py): dense if some rank has called hvd.join()
        (asked eagerly only, see horovod_ext.compression.join); its errors raise on every rank when eager, and
        fail the step through assertions in a graph."""
        driver = self.run.driver
        step = self.step.read_value()
        driver.begin(step, self.seed.read_value())
        items = [driver.item(i, name, g, g.shape.num_elements(), g.dtype.size, sparse=self._sparse_kind(g))
                 for i, (name, g) in enumerate(zip(names, grads))]
        for item in items:
            driver.launch(item)
        driver.finish(items, int(step) if tf.executing_eagerly() else "(in the graph)")
        out = [item.result for item in items]
        with tf.control_dependencies(self.context.pending() + out):
            out = [tf.identity(o) for o in out]
            self.step.assign_add(1)
        return out

    # ------------------------------------------------------------------------------------- elastic training
    def elastic_reset(self):
        """After Horovod's elastic reset (shutdown and init, perhaps with another N; keras/elastic.py): the backend
        and the method are built again for the new membership when the step is next traced, after a settings
        exchange made as at start; the method takes on its shared state from ``method_state`` (GraVAC's EWMA weight
        set for the new N, sparse_reduce's regions rebalanced) and this rank's residuals, whatever its new rank.
        The step's function must be traced again (KerasState drops the model's)."""
        self.run.elastic_reset(keep_shared=False)  # the shared part is in variables, which elastic_sync() sets
        self.backend = TFBackend(self, self.process_set, self.op, self.predivide)

    def elastic_commit(self):
        """This rank's state at a commit: the step counter, the seed, the method's shared state and this rank's
        error-feedback residuals."""
        return {"shared": numpy_values([self.step, self.seed, self.method_state]),
                "residuals": {name: v.numpy() for name, v in self.residuals.items()}}

    def elastic_restore(self, saved):
        assign_all([self.step, self.seed, self.method_state], saved["shared"])
        for name, variable in self.residuals.items():  # a residual made after the commit starts from zero
            variable.assign(saved["residuals"][name] if name in saved["residuals"] else tf.zeros_like(variable))

    def elastic_sync(self):
        """Rank 0's step counter, seed and method state on every rank; the residuals stay each rank's own."""
        broadcast_variables([self.step, self.seed], "horovod_ext")
        self.method_state.assign(broadcast_object(self.method_state.numpy().decode(),
                                                  name="hvdext.elastic.method_state"))

    # -------------------------------------------------------------------------------------------- statistics
    def compression_stats(self):
        """Bytes per step as counted when the step was built (the same every step) times the steps taken, plus the
        bytes counted at each host decision (adaptive_topk's path and CF), as taken, plus the bytes of entropy-coded
        payloads, as sent. With adaptive_topk also the controller's observations ("log", "throughput", "theta_ideal",
        "planned") and "planned_cf". Seconds are not measured in TensorFlow (a tf.function runs as one graph) and
        read 0."""
        steps = int(self.step.numpy())
        fields = ("payload_bytes", "dense_bytes", "wire_bytes", "dense_wire_bytes", "elements", "compressed_elements")
        seconds = {"compress_seconds": 0.0, "decompress_seconds": 0.0, "comm_seconds": 0.0}
        last, total = self.context.totals(steps, fields)
        stats = self.stats.as_dict()
        stats.update(self.run.observations())
        stats.update(steps=steps, ranks=self.process_set.size(), seed=int(self.seed.numpy()) % 2 ** 64,
                     last_step=CompressionStats._summary({**last, **seconds}),
                     total=CompressionStats._summary({**total, **seconds}))
        return stats
