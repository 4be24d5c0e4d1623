"""The backend contract: the primitives a method's step (plan.py, each compressor's module) runs on.

Both adapters implement it (horovod_ext/torch/backend.py over horovod_ext/torch_common/tensors.py,
horovod_ext/tensorflow/backend.py) as subclasses of
``Backend``: a primitive left out is a TypeError when the backend is made, in whichever framework, and
tests/test_backend_contract.py runs every primitive on PyTorch, TensorFlow eager and TensorFlow inside tf.function
against the same expectations.

Values are the framework's tensors. A "truth" is a Python bool (eager) or a boolean tensor (a graph); a "future"
is whatever ``wait`` turns into the collective's result. Where a framework has nothing to do for a primitive, its
backend still implements it, and its docstring says why (PyTorch checkpoints host state by reading the method at
``state_dict()`` time, so ``shared_state_read`` / ``shared_state_written`` do nothing there; PyTorch never builds a
graph, so ``after`` and ``scope`` do nothing there). The step's counter, seed, requirements and byte counts are the
step context's (context.py), which uses ``building_graph``, ``assertion``, ``after``, ``scope`` and
``kernel_errors`` for them.

Attributes every backend has: ``nranks``, ``rank`` (of the process set), ``divisor`` (N for op Average, 1 for Sum),
``kernels`` (the kernel table: uniform, functional signatures; see the codecs), ``kernel_errors`` (the exceptions
a kernel raises for a corrupted payload) and ``carries_futures`` (whether a collective may stay in flight from one
step into the next: PyTorch's eager handles may, a TensorFlow graph's tensors may not, so there a method waits in
the step that started it).
"""
import abc


class Backend(abc.ABC):
    """The primitives, grouped as the plan uses them. Every method is abstract: see the module docstring."""

    nranks = rank = None
    divisor = 1.0
    kernels = None
    kernel_errors = (ValueError,)
    carries_futures = False

    # ------------------------------------------------------------------------------------------------ a step
    @abc.abstractmethod
    def end_step(self, dense):
        """A step ended (after its gradients are finished); dense: it went dense (a rank had joined), which
        step-level collective names may need to know. A step whose join check is read at finish() learns only then
        whether it was dense."""

    @abc.abstractmethod
    def ranks_training(self, name):
        """Starts asking how many ranks of the process set are still training (the others called hvd.join()): an
        allreduce of 1 (see join.py). A future whose wait() is that number as an int; None where it cannot be asked
        (a graph being built) or need not be (torch.distributed has no hvd.join(): every rank trains)."""

    # ------------------------------------------------------------------------------------------------ tensors
    @abc.abstractmethod
    def flat32(self, g):
        """g as a flat float32 tensor."""

    @abc.abstractmethod
    def copy(self, x):
        """A copy of x that later writes to x do not change."""

    @abc.abstractmethod
    def sub(self, a, b, in_place=False):
        """a - b, elementwise; in_place: into a's storage where the framework can (PyTorch; TensorFlow makes a new
        tensor), for a caller that no longer needs a."""

    @abc.abstractmethod
    def stack(self, values, dtype):
        """A 1-D tensor of `dtype` ("float32", "float64", "int32", "int64", "uint8") from scalars or 0-d tensors."""

    @abc.abstractmethod
    def unstack(self, t, n):
        """The n elements of a 1-D tensor, as a list (Python numbers eagerly in PyTorch)."""

    @abc.abstractmethod
    def inner_products(self, a, b):
        """The float64 1-D tensor [<a, b>, <a, a>, <b, b>] of two float32 tensors of one size (Compression.auto's
        gain: the cosine of what a candidate sends and what it was given)."""

    @abc.abstractmethod
    def linear_compressor(self, name):
        """The framework's Horovod compressor of that name ("none", "fp16"): what Compression.auto sends by
        allreduce."""

    @abc.abstractmethod
    def concat(self, parts):
        """The 1-D tensors of `parts` one after the other (the one part itself when there is one)."""

    @abc.abstractmethod
    def dtype_name(self, x):
        """x's dtype as a name: "float16", "float32", "float64", "int32", "int64" or "uint8"."""

    @abc.abstractmethod
    def bitcast(self, x, dtype):
        """The bytes of 1-D x read as a 1-D tensor of `dtype` (a name as in stack; the sizes divide): a bucket's
        int32 header travels among its payloads (buckets.py)."""

    @abc.abstractmethod
    def sum(self, values):
        """The sum of a list of scalars or 0-d tensors."""

    @abc.abstractmethod
    def all_finite(self, x):
        """A truth: no NaN or Inf in x (a Python float, or a tensor). Eagerly a tensor's truth stays where x is (no
        host read: the step context reads its truths together, all_true); bool() of it reads it alone."""

    @abc.abstractmethod
    def all_finite_rows(self, x):
        """A truth per row of the 2-D tensor x, in a list: no NaN or Inf in that row (all_finite of each row, in
        one operation: a batch of matrices checked at once, each named alone)."""

    @abc.abstractmethod
    def all_true(self, truths):
        """Eagerly: the truths (Python bools, all_finite's and equal's truths) as a list of Python bools, in one
        host read per device for all those still on a device."""

    @abc.abstractmethod
    def size(self, x):
        """The number of elements of x (an int eagerly in PyTorch, an int32 tensor in TensorFlow)."""

    @abc.abstractmethod
    def equal(self, x, value):
        """A truth: x == value, elementwise."""

    @abc.abstractmethod
    def no_flag(self):
        """The "no bad rank" flag a decoder returns: -1."""

    @abc.abstractmethod
    def nothing(self, dtype):
        """A collective that carries nothing, already complete: wait() gives an empty 1-D tensor of `dtype`. What a
        branch of switch() returns in place of a collective another branch starts."""

    @abc.abstractmethod
    def k_of(self, numel, cf, upper=None):
        """Top-k's k at compression factor cf (plan.k_of), at most `upper`; cf may be a tensor."""

    # ------------------------------------------------------------------------------------ matrices (PowerSGD)
    @abc.abstractmethod
    def shape(self, x):
        """x's shape as a tuple of Python ints (static: the gradient of a variable)."""

    @abc.abstractmethod
    def reshape(self, x, shape):
        """x in `shape` (a tuple of ints; -1 once for the rest), the same elements in row-major order."""

    @abc.abstractmethod
    def split(self, x, sizes):
        """The consecutive parts of a 1-D tensor of `sizes` (Python ints summing to its size), as a list."""

    @abc.abstractmethod
    def cast(self, x, dtype):
        """x as "float16" or "float32" (round to nearest)."""

    @abc.abstractmethod
    def scale(self, x, factor):
        """x * factor, elementwise (factor a Python float)."""

    @abc.abstractmethod
    def matmul(self, a, b, transpose_a=False, transpose_b=False):
        """The batched product of float32 (B, n, k) and (B, k, m) tensors (each transposed in its last two axes
        first where asked), float32 (B, n, m)."""

    @abc.abstractmethod
    def orthogonalize(self, x, method="gram_schmidt"):
        """The columns of each float32 matrix of a (B, n, r) batch, r <= n, made orthonormal (a new tensor).
        "gram_schmidt": for j = 1 .. r, v_j -= sum_{i<j} (q_i . v_j) q_i, updated one column at a time, then
        q_j = v_j / max(|v_j|, FLT_MIN) (a zero column stays zero; python/hvdext_reference/powersgd.py);
        "qr": the Q of the framework's reduced QR factorization."""

    # -------------------------------------------------------------------------------------------- collectives
    @abc.abstractmethod
    def allreduce(self, x, name, op):
        """Start an allreduce of x over the process set; op "sum", "average" or "max". Returns a future."""

    @abc.abstractmethod
    def allreduce_grad(self, item, name, compression=None):
        """Start the allreduce of item.grad with the user's op and gradient_predivide_factor, through a Horovod
        compressor's compress/decompress (None: Compression.none). Returns (future, the bytes compress() made of
        it)."""

    @abc.abstractmethod
    def allreduce_buffer(self, x, name):
        """Start the allreduce of a flat tensor with the user's op and gradient_predivide_factor (what
        allreduce_grad does to a gradient, on a bucket's gradients in one buffer). Returns a future."""

    @abc.abstractmethod
    def allreduce_sparse(self, item, name):
        """Start Horovod's sparse allreduce of item.grad (a sparse tensor: indices and values allgathered, rows added
        where indices repeat) with the user's op. Returns (a future of the framework's sparse result, the bytes of
        this rank's indices and values: a number, or a tensor in a graph)."""

    @abc.abstractmethod
    def densify(self, item):
        """item.grad, a sparse gradient, becomes the dense gradient it stands for (PyTorch: also the parameter's
        .grad, which write() then makes sparse again), and item.numel / item.itemsize describe it."""

    @abc.abstractmethod
    def allgather(self, x, name):
        """Start an allgather of x (ranks' tensors concatenated in rank order). Returns a future."""

    @abc.abstractmethod
    def alltoall(self, x, splits, name):
        """An alltoall: x cut by `splits` (one count per rank), the parts received concatenated in rank order.
        Returns a future."""

    @abc.abstractmethod
    def wait(self, future):
        """The result of a collective started by allreduce, allreduce_grad, allgather or alltoall."""

    @abc.abstractmethod
    def name(self, prefix, item):
        """A collective's name, unique per (prefix, tensor)."""

    @abc.abstractmethod
    def step_name(self, prefix):
        """A collective's name, unique per prefix within a step (a step-level collective)."""

    @abc.abstractmethod
    def stable_name(self, prefix):
        """A step-level allreduce's name that is the same at every step: a rank that has called hvd.join() answers
        it with zeros, whatever step the others are at, and Horovod's response cache serves it."""

    # ------------------------------------------------------------------------------------------ host, control
    @abc.abstractmethod
    def host(self, fn, args, dtypes):
        """fn run in Python on the host values of `args` (lists of numbers; a tf.py_function in a graph). Returns
        a tuple of values of `dtypes`."""

    @abc.abstractmethod
    def eager(self, fn, args, dtypes):
        """fn run eagerly on the framework's tensors `args` (inside a graph: when the step runs, as a host op),
        returning a tuple of tensors of `dtypes` (Compression.auto's measurements and first decision, which run
        collectives and kernels eagerly)."""

    @abc.abstractmethod
    def numpy(self, fn, args, dtypes):
        """fn run on the NumPy arrays of `args` (tf.numpy_function in a graph): how a codec outside the native
        library supplies kernels. Returns a tuple of tensors of `dtypes`."""

    @abc.abstractmethod
    def switch(self, index, branches):
        """branches[index]() (tf.switch_case in a graph: every branch returns the same structure)."""

    @abc.abstractmethod
    def building_graph(self):
        """Whether ops are being built into a graph (TensorFlow inside tf.function), not run as they come."""

    @abc.abstractmethod
    def assertion(self, truth, data):
        """An op that fails with the message `data` (strings and tensors, joined) unless `truth`: in a graph when
        it runs (returned, for ``after``), eagerly at once."""

    @abc.abstractmethod
    def after(self, ops, x):
        """x, once the graph ops `ops` have run (x itself eagerly)."""

    @abc.abstractmethod
    def scope(self, name):
        """A context in which a graph's ops are named after `name` (nothing eagerly)."""

    # --------------------------------------------------------------------------------------------- shared state
    @abc.abstractmethod
    def shared_state_read(self, method):
        """Called on the host before a method reads its shared state (Method.shared_state): where a checkpoint
        restores that state behind the method's back (a TensorFlow variable), the method takes it on here."""

    @abc.abstractmethod
    def shared_state_written(self, method):
        """Called on the host after a method changed its shared state: where a checkpoint holds it in a variable
        (TensorFlow), it is stored there."""

    # ------------------------------------------------------------------------------------------- per-rank state
    @abc.abstractmethod
    def residual(self, name, n, item=None):
        """A new per-rank state of n float32 zeros (error feedback's residual of tensor `name`)."""

    @abc.abstractmethod
    def read(self, state):
        """The current value of a state."""

    @abc.abstractmethod
    def assign(self, state, value):
        """state = value."""

    @abc.abstractmethod
    def reset(self, state):
        """state = 0."""

    @abc.abstractmethod
    def export(self, state):
        """The state's value for a checkpoint (a tensor in PyTorch, a NumPy array in TensorFlow)."""

    @abc.abstractmethod
    def imported_residual(self, name, values):
        """A new per-rank state holding a checkpoint's values."""

    @abc.abstractmethod
    def fused_states(self, states):
        """(buffer, pieces): one flat float32 buffer whose consecutive pieces are `states`' values, and those pieces
        in order, to hold from now on in place of `states` (the same objects where they already are consecutive
        pieces of one buffer: no copy; else a new buffer with their values, once). A method's step may then run
        one operation on the buffer for every state in it (PowerSGD's batch). None where the framework's states
        cannot share storage (TensorFlow's variables): the caller concatenates as before."""

    @abc.abstractmethod
    def imported(self, values):
        """A checkpoint's values as a flat float32 tensor, to assign to an existing state."""

    # ------------------------------------------------------------------------------------------------- output
    @abc.abstractmethod
    def output_buffer(self, item):
        """Where a decoder may write item's average in place (the gradient's own storage), or None."""

    @abc.abstractmethod
    def write(self, item, flat):
        """Make `flat` (the average, flat float32) item's result, in the gradient's shape and dtype; a sparse
        gradient (item.sparse) is handed back sparse where the framework's optimizers need it (PyTorch), and the
        result of allreduce_sparse is written as it is."""
