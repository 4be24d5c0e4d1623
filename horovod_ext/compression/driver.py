"""The step driver: one compressor step over a backend, written once for PyTorch and TensorFlow.

An adapter makes one StepDriver per optimizer (or aggregator) once the settings are agreed, and per step calls
``begin(step, seed)`` before the first gradient is launched, ``item(...)`` and ``launch(item)`` for each gradient
(PyTorch: in its backward hook; TensorFlow: each in turn), then ``finish(items)``. The driver asks whether a rank
has joined (join.py: the step goes dense), runs the method's two stages (plan.py), and raises what the step's
context (context.py) recorded, the same error on every rank (each is decided from collective results):

- a NaN/Inf gradient: FloatingPointError (TensorFlow inside tf.function: InvalidArgumentError, same text);
- a corrupted payload: ValueError naming the tensor and the rank that sent it (InvalidArgumentError in a graph).

After either, the method drops what error feedback kept (Method.on_error), and the next step trains normally.
"""
from .buckets import FusingBackend
from .generation import ELASTIC
from .join import JOIN_CHECK_BYTES, a_rank_joined, join_check_wire_bytes
from .plan import Item, SparseGather
from .registry import method_for
from .specs import compression_name

# Under horovodrun's elastic mode every method waits for the join check when the step begins, so that a rank learns
# of a failed peer (the wait raises HorovodInternalError) before backward's hooks enqueue more collectives. With
# Horovod 0.28.1 as released and torch >= 2.11, an enqueue can deadlock against Horovod's background thread when
# that thread is finalizing after the failure: it holds the process-set table's mutex while releasing queued
# tensors, which needs the GIL, and the enqueueing thread holds the GIL while it waits for that mutex (seen with
# PowerSGD, which otherwise reads the check at finish). scripts/build_horovod.sh's Horovod enqueues without the GIL;
# this narrows the window for a Horovod built without that edit.
NONFINITE_HELP = "gradients must be finite (lower the learning rate, or clip gradients)"
PAYLOAD_HELP = "payloads are checked on arrival; a corrupted one fails the step on every rank"


LISTED = 6  # tensors an error names; the rest are counted


def listed(details, separator):
    """The first LISTED details joined, and how many more there are (a model's every tensor can fail at once)."""
    shown = separator.join(details[:LISTED])
    rest = len(details) - LISTED
    return shown + (f"{separator}and {rest} more tensor{'s' if rest > 1 else ''}" if rest > 0 else "")


class StepDriver:
    """The compressor's method (registry.method_for) over one backend and one step context (context.py), and the
    step's join check and errors. ``buckets``: a buckets.BucketPlan of the tensors; where it fuses, the method runs
    over a FusingBackend, which the driver tells when each tensor is launched."""

    def __init__(self, compression, backend, context, sizes, tag, buckets=None):
        self.fusing = buckets is not None and buckets.fuses
        if self.fusing:
            backend = FusingBackend(backend, buckets, context)
            context.stats.extra["buckets"] = len(buckets.members)
        self.be, self.ctx = backend, context
        context.use(backend)
        self.method = method_for(compression)(compression, context, sizes)
        self.tag = tag  # makes the join check's collective name unique per optimizer
        self.dense = False  # this step goes dense: some rank has called hvd.join()
        self.check = None  # the join check in flight, for a method that decides at finish()
        self.name = compression_name(compression)

    def begin(self, step, seed):
        """A step begins (before its first launch): the join check, then the step context. Payload compressors
        cannot run while a rank is joined (join.py): one allreduce of 1 per step asks (eagerly). A method whose
        launch() is the same in a joined step (Method.join_decided_at_finish) reads the answer in finish(), so that
        the check overlaps backward instead of stopping it, except in Horovod's elastic mode (ELASTIC). The
        check is asked before the step context begins: the answer decides whether the step goes dense."""
        check = None
        if self.method.needs_join_check:
            check = self.be.ranks_training(f"horovod_ext.training.{self.tag}")
        deferred = self.method.join_decided_at_finish and not ELASTIC
        self.check = check if check is not None and deferred else None
        self.dense = bool(check is not None and self.check is None and self.joined(check))
        self.ctx.begin(step, seed, self.dense)
        if check is not None:
            self.ctx.count(payload_bytes=JOIN_CHECK_BYTES, wire_bytes=join_check_wire_bytes(self.be.nranks))

    def joined(self, check):
        """Whether some rank has joined, from the check's answer; a joined step is counted."""
        joined = a_rank_joined(self.be.wait(check), self.be.nranks)
        if joined:
            extra = self.ctx.stats.extra
            extra["join_dense_steps"] = extra.get("join_dense_steps", 0) + 1
        return joined

    def item(self, index, name, grad, numel, itemsize, param=None, sparse=None):
        """One gradient of the step, with the method's record of it (sparse: see plan.Item)."""
        item = Item(index, name, grad, numel, itemsize, param=param, sparse=sparse)
        item.work = self.method.Record()
        return item

    def launch(self, item):
        """Start one gradient's communication: a sparse gradient by SparseGather, unless it is sent dense
        (sparse_as_dense, or a step in which some rank has joined, where every gradient goes dense)."""
        if item.sparse == "gather" and not self.dense:
            SparseGather.launch(self.be, self.ctx, item)
        else:
            if item.sparse is not None:
                self.be.densify(item)
            if self.dense:
                self.method.launch_dense(self.be, item)
            else:
                self.method.launch(self.be, item)
        if self.fusing:
            self.be.ready(item)  # the last of its bucket starts the bucket's collectives
        return item

    def finish(self, items, step):
        """Finish every launched gradient; raise the step's recorded errors (see the module docstring)."""
        if self.check is not None:
            self.dense, self.check = self.joined(self.check), None
        SparseGather.finish(self.be, self.ctx, [item for item in items if item.kind == "sparse"])
        items = [item for item in items if item.kind != "sparse"]
        try:
            if self.dense:
                self.method.finish_dense(self.be, items)
            else:
                self.method.finish(self.be, items)
        finally:
            self.be.end_step(self.dense)  # after the deferred check: a dense step leaves step-level names as they are
        errors = self.ctx.settled_errors()  # the step's one host read of its flags
        if errors:
            self.method.on_error(self.be)
            raise self.error(errors, step)

    def error(self, errors, step):
        """The exception for the step's recorded (error, detail) pairs: a corrupted payload before a NaN/Inf."""
        payload = [detail for error, detail in errors if error == "payload"]
        if payload:
            return ValueError(f"Compression.{self.name}: corrupted payload of {listed(payload, '; ')} at step "
                              f"{step}; {PAYLOAD_HELP}")
        nonfinite = [detail for error, detail in errors if error != "payload"]
        return FloatingPointError(f"Compression.{self.name}: NaN or Inf in the gradient of "
                                  f"{listed(nonfinite, ', ')} at step {step}; {NONFINITE_HELP}")

    def abandon_step(self):
        """Launched gradients were dropped before finish() (a checkpoint was loaded)."""
        self.method.abandon_step()
        if self.fusing:
            self.be.forget()

    def forget_in_flight(self):
        """Drop, without waiting, every collective in flight or recorded (an elastic reset)."""
        self.method.forget_in_flight()
        if self.fusing:
            self.be.forget()
