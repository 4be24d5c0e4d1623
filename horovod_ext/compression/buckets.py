"""Gradient buckets: a step's per-tensor collectives fused into one collective per bucket, written once for every
method and both frameworks.

A model of 160 small tensors asks Horovod for 160 collectives a step where the same elements in two tensors ask
for two: each costs an enqueue, a negotiation, a handle and a wait, whatever its size. As DDP's reducer does
(25 MB buckets, filled in the reverse order of the parameters, which is about the order backward makes gradients
ready), the plan here groups the tensors into buckets of at most ``bucket_cap_mb`` megabytes of gradient (2**20
bytes), per dtype and device (``BucketPlan``); a tensor larger than the cap is a bucket of its own; 0 keeps one
tensor per bucket (nothing is fused).

The methods keep their per-tensor semantics (each tensor has its own scale, k and residual: TernGrad's per-layer
scale and top-k's per-layer k are kept; a kernel that takes a bucket runs each tensor's segment by that tensor's
own rule). What is fused is their collectives
(``FusingBackend``, a backend that wraps the adapter's): a method's collective of one tensor, named by
``backend.name(prefix, item)``, is recorded in its bucket's group (one group per bucket, kind of collective,
prefix, dtype and op); the group is started as one collective when the bucket's last tensor has been launched
(the step driver says so: communication still overlaps backward), or at the first wait of one of its tensors,
whichever comes first. Step-level collectives (``step_name``, ``stable_name``) pass through unchanged. A method
may take a fused allgather's whole result instead (``allgathered_buckets``: top-k's and ternary's decoders run
over a bucket in one native call, each tensor by its own decoder), and may put a tensor's encode off until its
bucket's last tensor is launched (``defer``: top-k's "delta" payloads are encoded in one native call per bucket).

- an allgather group: every rank sends ``[h | x_1 | ... | x_m]``, its m payloads (in parameter order) behind a
  header h of their m sizes (int32, read as the payloads' dtype: payloads whose size depends on their content,
  entropy- or delta-coded, differ between ranks). Tensor i's result is rank 0's x_i, then rank 1's, ...: what
  its own allgather gives, to the bit. The header's 4 m bytes (rounded up to whole elements) are counted, in
  payload and wire bytes.
- an allreduce group (op sum, average or max; or the gradient's own op and predivide factor): one allreduce of
  the concatenated flats, split again. Each element's sum is over the same ranks; Horovod's own fusion buffer
  already packs concurrent allreduces the same way.

A group of one tensor runs that tensor's own collective, under its own name (what bucket_cap_mb=0 runs). Every
rank fuses the same tensors under the same names: the plan follows the agreed parameter list and cap, a group is
sorted by parameter position, and a flush happens at the same point of the same program on every rank.
"""
import math
import numbers

from .wire import allgather_wire_bytes

MEGABYTE = 2 ** 20  # DDP's bucket_cap_mb is in MiB
HEADER_DTYPE = "int32"
ITEMSIZE = {"uint8": 1, "float16": 2, "float32": 4, "int32": 4, "float64": 8, "int64": 8}


def check_bucket_cap_mb(value, where="DistributedOptimizer"):
    """bucket_cap_mb as a float: a finite number >= 0, else ValueError naming the argument (on every rank: every
    rank makes its optimizer with the same arguments)."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    if not ok:
        raise ValueError(f"{where}: bucket_cap_mb must be a number >= 0 (megabytes of gradient per bucket, as in "
                         f"DDP; 0 keeps one tensor per bucket), got {value!r}")
    return float(value)


class BucketPlan:
    """Which tensors share a bucket. ``tensors``: (bytes, key) per tensor in parameter order, key being what a
    bucket's tensors have alike (dtype and device). Buckets fill in reverse parameter order, as DDP's do; a tensor
    that would take its bucket past cap_mb starts a new one.

    ``bucket_of[i]``: tensor i's bucket; ``members[b]``: bucket b's tensors, in parameter order."""

    def __init__(self, tensors, cap_mb):
        self.cap_mb = check_bucket_cap_mb(cap_mb)
        cap = self.cap_mb * MEGABYTE
        self.bucket_of, self.members, filled, open_ = {}, [], [], {}
        for index in reversed(range(len(tensors))):
            nbytes, key = tensors[index]
            bucket = open_.get(key)
            if bucket is None or cap == 0 or filled[bucket] + nbytes > cap:
                bucket = open_[key] = len(self.members)
                self.members.append([])
                filled.append(0)
            self.members[bucket].append(index)
            filled[bucket] += nbytes
            self.bucket_of[index] = bucket
        self.members = [tuple(sorted(m)) for m in self.members]

    @property
    def fuses(self):
        """Whether any bucket holds more than one tensor (else the backend is used as it is)."""
        return any(len(m) > 1 for m in self.members)

    def shared(self, index):
        """Tensor `index`'s bucket where it shares one, else None."""
        bucket = self.bucket_of.get(index)
        return bucket if bucket is not None and len(self.members[bucket]) > 1 else None


class GivenBuckets:
    """Buckets as a framework hands them, learned as they arrive (DDP's GradBucket: its reducer fills them and
    rebuilds them after the first iteration in the order gradients became ready): BucketPlan's protocol for
    FusingBackend. ``add(indices)`` before a bucket's tensors are launched; ``clear()`` once the step has ended."""

    fuses = True  # a given bucket may hold several tensors
    shared = BucketPlan.shared

    def __init__(self):
        self.members, self.bucket_of = [], {}

    def add(self, indices):
        """A new bucket of the tensors at `indices` (positions in the agreed parameter list); its number."""
        bucket = len(self.members)
        self.members.append(tuple(sorted(indices)))
        self.bucket_of.update((index, bucket) for index in indices)
        return bucket

    def clear(self):
        self.members, self.bucket_of = [], {}


def header_elements(count, itemsize):
    """(elements of the payloads' dtype, int32 sizes) of an allgather header of `count` sizes: padded to whole
    elements of a dtype wider than 4 bytes."""
    padded = count + (-count % max(1, itemsize // 4))
    return padded * 4 // itemsize, padded


def header_bytes(sizes, allgathered, cap_mb=25, itemsize=1):
    """What the buckets' allgathers add per rank per step to the payloads of tensors of `sizes` float32 elements
    (allgathered[i]: tensor i's payload goes by allgather; itemsize: the payloads' dtype's): 4 bytes a payload in
    every bucket that fuses two or more (perfmodel's plans)."""
    plan = BucketPlan([(4 * n, "float32") for n in sizes], cap_mb)
    total = 0
    for members in plan.members:
        count = sum(1 for i in members if allgathered[i])
        if count > 1:
            total += 4 * header_elements(count, itemsize)[1]
    return total


class BucketName(str):
    """A tensor's collective name that also carries the tensor's position and the prefix it was asked with (not the
    tensor: an Item holds its future, which holds this name, and a cycle would keep the gradient alive until the
    garbage collector runs)."""

    def __new__(cls, name, index, prefix):
        made = super().__new__(cls, name)
        made.index, made.prefix = index, prefix
        return made


class BucketLabel:
    """What the backend names a bucket's collective after (its `name` takes an index and a name, as an Item's)."""

    __slots__ = ("index", "name")

    def __init__(self, index, name):
        self.index, self.name = index, name


class Entry:
    """One tensor's part of a group: the future a method holds."""

    __slots__ = ("group", "x", "name", "position")

    def __init__(self, group, x, name):
        self.group, self.x, self.name, self.position = group, x, name, None


class Group:
    """A bucket's collectives of one kind, prefix, dtype and op in a step: recorded, then started as one. Once
    started it no longer holds its entries (each entry holds the group: no cycle outlives the step)."""

    __slots__ = ("bucket", "kind", "prefix", "dtype", "op", "entries", "alone", "future", "sizes", "header", "parts",
                 "result")

    def __init__(self, bucket, kind, prefix, dtype, op):
        self.bucket, self.kind, self.prefix, self.dtype, self.op = bucket, kind, prefix, dtype, op
        self.entries, self.alone, self.future, self.parts, self.result = [], False, None, None, None
        self.sizes = None  # this rank's size of each tensor's part
        self.header = (0, 0)  # an allgather's header: (its elements of the payloads' dtype, the int32 sizes it holds)


class FusingBackend:
    """The adapter's backend with a bucket's per-tensor collectives fused (see the module docstring). Every other
    primitive is the wrapped backend's."""

    def __init__(self, backend, plan, context):
        self._be, self._plan, self._ctx = backend, plan, context
        self._open = {}  # (bucket, kind, prefix, dtype, op) -> the group being recorded
        self._ready = {}  # bucket -> its tensors launched this step
        self._flushes = {}  # group key -> groups started under it this step (names them apart)
        self._direct = 0  # > 0 while a graph's branch is built: its collectives cannot leave the branch
        self._deferred = {}  # (bucket, encode) -> (the caller's backend, the tensors waiting for the bucket: defer())

    def __getattr__(self, name):
        """The wrapped backend's attribute; its methods and kernel table, which do not change, are kept on this
        object once read (a step reads them thousands of times)."""
        value = getattr(self._be, name)
        if callable(value) or name == "kernels":
            setattr(self, name, value)
        return value

    # ---------------------------------------------------------------------------------------------- recording
    def name(self, prefix, item):
        name = self._be.name(prefix, item)
        if self._plan.shared(item.index) is None:
            return name
        return BucketName(name, item.index, prefix)

    def _record(self, kind, x, name, op=None):
        bucket = self._plan.shared(name.index)
        key = (bucket, kind, name.prefix, self._be.dtype_name(x), op)
        group = self._open.get(key)
        if group is None:
            group = self._open[key] = Group(*key)
        entry = Entry(group, x, name)
        group.entries.append(entry)
        return entry

    def defer(self, item, encode, caller):
        """Put off `item`'s encode until its bucket's last tensor is launched: then ``encode(caller, items)`` runs
        once for the bucket's tensors deferred with this `encode` (a method's own; Compression.auto's candidates
        each defer their own, through the backend `caller` they see), in parameter order, and starts their
        collectives, before the bucket's groups start (a segmented kernel: one call for the bucket, as DDP's hooks
        get one flat bucket). False where the tensor shares no bucket, or a graph's branch is built: the method
        encodes it now."""
        bucket = self._plan.shared(item.index)
        if bucket is None or self._direct:
            return False
        self._deferred.setdefault((bucket, encode), (caller, []))[1].append(item)
        return True

    def _encode_deferred(self, buckets):
        """The deferred encodes of `buckets`, each bucket's in the order of its first tensor (every rank alike)."""
        keys = [key for key in self._deferred if key[0] in buckets]
        keys.sort(key=lambda key: (key[0], min(item.index for item in self._deferred[key][1])))
        for key in keys:
            caller, items = self._deferred.pop(key)
            key[1](caller, sorted(items, key=lambda item: item.index))

    def _start_all(self):
        """Encode what is deferred and start every recorded group (the same point of the program on every rank)."""
        self._encode_deferred({key[0] for key in self._deferred})
        self._start(list(self._open))

    def _fuses(self, name):
        return isinstance(name, BucketName) and not self._direct

    def allgather(self, x, name):
        if not self._fuses(name):
            return self._be.allgather(x, str(name))
        return self._record("allgather", x, name)

    def allreduce(self, x, name, op):
        if not self._fuses(name):
            return self._be.allreduce(x, str(name), op)
        return self._record("allreduce", x, name, op)

    def allreduce_grad(self, item, name, compression=None):
        """Fused unless a compressor is given that changes the tensor (Horovod's own compressors go to Horovod as
        they are, fused by its tensor fusion; a backend's compressor marked ``identity`` sends the tensor as it
        is, and is fused here: torch.distributed has no tensor fusion)."""
        if not self._fuses(name) or not (compression is None or getattr(compression, "identity", False)):
            return self._be.allreduce_grad(item, str(name), compression)
        return self._record("grad", self._be.reshape(item.grad, (-1,)), name), item.numel * item.itemsize

    def switch(self, index, branches):
        """A graph's branches (tf.switch_case) return their own collectives' results: what a branch starts is not
        fused (GraVAC's per-tensor path, Compression.auto's candidates in a traced step)."""
        if not self._be.building_graph():
            return self._be.switch(index, branches)
        self._direct += 1
        try:
            return self._be.switch(index, branches)
        finally:
            self._direct -= 1

    def allreduce_sparse(self, item, name):
        return self._be.allreduce_sparse(item, str(name))  # sparse gradients are not bucketed

    # ---------------------------------------------------------------------------------------------- starting
    def ready(self, item):
        """The step driver launched `item`: once its bucket's every tensor is launched, the bucket's groups start."""
        bucket = self._plan.shared(item.index)
        if bucket is None:
            return
        self._ready[bucket] = self._ready.get(bucket, 0) + 1
        if self._ready[bucket] == len(self._plan.members[bucket]):
            self._encode_deferred({bucket})
            self._start([key for key in self._open if key[0] == bucket])

    def _start(self, keys):
        for key in keys:
            group = self._open.pop(key)
            group.entries.sort(key=lambda e: e.name.index)
            for position, entry in enumerate(group.entries):
                entry.position = position
            group.alone = len(group.entries) == 1
            if group.alone:
                self._start_alone(group)
            else:
                self._start_fused(group, key)
            for entry in group.entries:
                entry.x = entry.name = None
            group.entries = None

    def _start_alone(self, group):
        entry = group.entries[0]
        if group.kind == "allgather":
            group.future = self._be.allgather(entry.x, str(entry.name))
        elif group.kind == "allreduce":
            group.future = self._be.allreduce(entry.x, str(entry.name), group.op)
        else:
            group.future = self._be.allreduce_buffer(entry.x, str(entry.name))

    def _start_fused(self, group, key):
        be = self._be
        seq = self._flushes[key] = self._flushes.get(key, 0) + 1
        op = f".{group.op}" if group.op else ""
        label = BucketLabel(group.bucket, f"bucket{group.bucket}.{seq}.{group.dtype}{op}")
        name = be.name(f"{group.prefix}.{group.kind}", label)
        parts = [entry.x for entry in group.entries]
        group.sizes = [be.size(x) for x in parts]
        buffer = be.concat(([self._header(group)] if group.kind == "allgather" else []) + parts)
        if group.kind == "allgather":
            group.future = be.allgather(buffer, name)
        elif group.kind == "allreduce":
            group.future = be.allreduce(buffer, name, group.op)
        else:
            group.future = be.allreduce_buffer(buffer, name)

    def _header(self, group):
        """The group's sizes as int32, padded to whole elements of the payloads' dtype, read as that dtype; its
        bytes are counted."""
        group.header = header_elements(len(group.sizes), ITEMSIZE[group.dtype])
        padded = list(group.sizes) + [0] * (group.header[1] - len(group.sizes))
        nbytes = 4 * len(padded)
        self._ctx.count(payload_bytes=nbytes, wire_bytes=allgather_wire_bytes(nbytes, self._be.nranks))
        return self._be.bitcast(self._be.stack(padded, HEADER_DTYPE), group.dtype)

    # ---------------------------------------------------------------------------------------------- results
    def wait(self, future):
        if not isinstance(future, Entry):
            return self._be.wait(future)
        group = future.group
        if group.future is None:  # still recorded: start every recorded group (the same point on every rank)
            self._start_all()
        if group.alone:
            return self._be.wait(group.future)
        if group.parts is None:
            group.parts = self._split(group, self._result(group))
        return group.parts[future.position]

    def _result(self, group):
        """A started group's collective result, waited for once."""
        if group.result is None:
            group.result = self._be.wait(group.future)
        return group.result

    def allgathered_buckets(self, items):
        """[(result, header bytes, the items in the bucket's order)]: each fused allgather all of whose tensors are
        among `items` (their futures its entries), waited for; a method decodes such a bucket in one call
        (plan.Allgather.decode_all). The others' futures are waited for one by one, as before."""
        if self._deferred:  # a bucket some of whose tensors were not launched: its deferred ones are encoded now
            self._start_all()
        groups = {}
        for item in items:
            entry = item.future
            if isinstance(entry, Entry) and entry.group.kind == "allgather":
                groups.setdefault(id(entry.group), (entry.group, []))[1].append(item)
        out = []
        for group, members in groups.values():
            if group.future is None:  # still recorded: start every recorded group (the same point on every rank)
                self._start_all()
            if group.alone or len(members) != len(group.sizes):
                continue
            members.sort(key=lambda item: item.future.position)
            out.append((self._result(group), group.header[0] * ITEMSIZE[group.dtype], members))
        return out

    def _split(self, group, result):
        """Each tensor's part of the group's result: an allreduce's by this rank's sizes; an allgather's by every
        rank's header (rank r's block is its header, then its m payloads)."""
        be, m = self._be, len(group.sizes)
        if group.kind != "allgather":
            return be.split(result, group.sizes)
        elements, count = group.header
        pieces, position = [[] for _ in range(m)], 0
        for _ in range(be.nranks):
            sizes = be.unstack(be.bitcast(result[position:position + elements], HEADER_DTYPE), count)[:m]
            position = position + elements
            for piece, size in zip(pieces, sizes):
                piece.append(result[position:position + size])
                position = position + size
        return [be.concat(piece) for piece in pieces]

    # ---------------------------------------------------------------------------------------------- a step
    def end_step(self, dense):
        """Start what is still recorded (a future carried into the next step), and begin counting anew (also where
        starting raised: nothing of this step is left for the next)."""
        try:
            if self._open or self._deferred:
                self._start_all()
        finally:
            self._open.clear()
            self._deferred.clear()
            self._ready.clear()
            self._flushes.clear()
            self._be.end_step(dense)

    def forget(self):
        """The step's launched gradients were dropped (a checkpoint was loaded, an elastic reset): nothing recorded
        is started."""
        self._open.clear()
        self._deferred.clear()
        self._ready.clear()
        self._flushes.clear()
