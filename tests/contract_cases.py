"""The backend contract's conformance cases (horovod_ext/compression/backend.py): one case per primitive, and one
per method of the step context over it (CONTEXT_CASES, horovod_ext/compression/context.py), run by
tests/workers/contract_worker.py on the PyTorch backend, TensorFlow eagerly and TensorFlow inside tf.function,
against the same expectations. tests/test_backend_contract.py checks that every primitive and every method of the
context has a case.

A case is fn(ctx) -> value (tensors, numbers, lists of them, None), run inside a tf.function in the graph mode;
the expectation is fn(rank, nranks, value, ctx) -> None or a message saying what differs. ctx gives the framework:
ctx.be (a new backend per case), ctx.t(values, dtype) (a tensor), ctx.item(name, values) (a plan.Item),
ctx.framework ("torch", "ddp" or "tf"), ctx.graph (True inside tf.function), ctx.context (the adapter's StepContext over
ctx.be, begun at step 3 with seed 7, for CONTEXT_CASES), ctx.counted(field) (what the context has counted of a field
this step), ctx.written(item) (the item's result after write), ctx.set_method_state(text) (a checkpoint restoring
the TensorFlow variable; nothing elsewhere), ctx.sparse_item(name, indices, rows, shape, sparse) (a plan.Item whose
gradient is the framework's sparse tensor of those rows) and ctx.dense(x) (a sparse tensor's dense values).
"""
import numpy as np


def close(value, want):
    got = np.asarray(value, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape or not np.allclose(got, want, equal_nan=True):
        return f"got {got.tolist()}, want {want.tolist()}"
    return None


def equal(value, want):
    return None if value == want else f"got {value!r}, want {want!r}"


class FakeMethod:
    """A method with shared state, to see what shared_state_read / shared_state_written do with it."""

    def __init__(self):
        self.loaded = None

    @staticmethod
    def shared_state():
        return {"theta": 10.0}

    def load_shared_state(self, state):
        self.loaded = state


def _end_step(c):
    """A step every rank took moves step-level names on where the framework needs it (PyTorch's eager names); a
    dense one (a rank had joined) does not; stable names stay."""
    be = c.be
    stable, step = be.stable_name("contract.end"), be.step_name("contract.end")
    be.end_step(True)
    same_after_dense = be.step_name("contract.end") == step
    be.end_step(False)
    return [stable == be.stable_name("contract.end"), same_after_dense, be.step_name("contract.end") != step]


def _ranks_training(c):
    future = c.be.ranks_training("contract.training")
    return None if future is None else c.be.wait(future)


def _flat32(c):
    flat = c.be.flat32(c.t([[1.0, 2.0], [3.0, 4.0]], "float64"))
    return [flat, "float32" in str(flat.dtype)]


def _copy(c):
    x = c.t([1.0, 2.0])
    return c.be.copy(x)


def _unstack(c):
    return list(c.be.unstack(c.t([1.0, 2.0, 3.0]), 3))


def _all_true(c):
    """Eagerly, truths of every kind read together: all_finite's, equal's, and Python bools."""
    if c.graph:
        return None
    be = c.be
    return be.all_true([be.all_finite(c.t([1.0, 2.0])), be.all_finite(c.t([float("nan")])), True,
                        be.equal(be.stack([2], "int32")[0], -1), be.equal(be.stack([-1], "int32")[0], -1)])


def _all_finite(c):
    be = c.be
    return [be.all_finite(c.t([1.0, 2.0])), be.all_finite(c.t([1.0, float("nan")])),
            be.all_finite(c.t([float("inf")])), be.all_finite(c.t([], "float32"))]


def _k_of(c):
    return [c.be.k_of(1000, 10.0), c.be.k_of(1000, 10.0, upper=50), c.be.k_of(5, 100.0)]


def _allreduce(c):
    be, x = c.be, c.t([float(c.rank + 1)])
    return [be.wait(be.allreduce(x, f"contract.allreduce.{op}", op)) for op in ("sum", "average", "max")]


def _allreduce_grad(c):
    item = c.item("grad", [float(c.rank + 1)] * 3)
    future, sent = c.be.allreduce_grad(item, "contract.allreduce_grad")
    return [c.be.wait(future), sent]


def _allreduce_buffer(c):
    be = c.be
    return be.wait(be.allreduce_buffer(c.t([float(c.rank + 1)] * 3), "contract.allreduce_buffer"))


def _bitcast(c):
    """int32 read as bytes (little-endian), bytes at an offset that is not a whole int32 read back, and float32's
    bits."""
    be = c.be
    as_bytes = be.bitcast(c.t([1, 258], "int32"), "uint8")
    shifted = c.t([9, 1, 0, 0, 0, 2, 1, 0, 0], "uint8")[1:]
    return [as_bytes, be.bitcast(shifted, "int32"), be.bitcast(c.t([1.0, -2.0]), "int32"),
            be.bitcast(c.t([1, 0, 2, 0], "int32"), "int64")]


def _allgather(c):
    """The same size on every rank, then rank r's r + 1 elements (a payload whose size differs between ranks). The
    two inputs differ on every rank: TensorFlow's graph optimizer merges two allgathers of one constant into one (a
    Horovod op is not stateful), and a rank whose graph has one collective fewer hangs the others."""
    return [c.be.wait(c.be.allgather(c.t([float(c.rank)] * 2), "contract.allgather")),
            c.be.wait(c.be.allgather(c.t([10.0 + c.rank] * (c.rank + 1)), "contract.allgather_uneven"))]


def _alltoall(c):
    """One element to each rank, then j + 1 elements to rank j (parts of different sizes)."""
    n = c.be.nranks
    x = c.t([float(10 * c.rank + j) for j in range(n)])
    uneven = c.t([float(10 * c.rank + j) for j in range(n) for _ in range(j + 1)])
    return [c.be.wait(c.be.alltoall(x, [1] * n, "contract.alltoall")),
            c.be.wait(c.be.alltoall(uneven, [j + 1 for j in range(n)], "contract.alltoall_uneven"))]


def _wait(c):
    return c.be.wait(c.be.allreduce(c.t([1.0]), "contract.wait", "sum"))


def _name(c):
    a, b = c.item("a", [1.0]), c.item("b", [1.0])
    names = [c.be.name("p", a), c.be.name("p", b), c.be.name("q", a)]
    return len(set(names)) == 3 and all(isinstance(n, str) for n in names)


def _step_name(c):
    return c.be.step_name("a") != c.be.step_name("b")


def _stable_name(c):
    """The same name after another step has begun, and usable by an allreduce in both steps."""
    be, x = c.be, c.t([float(c.rank + 1)])
    names, sums = [], []
    for _ in (3, 4):
        be.end_step(False)
        names.append(be.stable_name("contract.stable"))
        sums.append(be.wait(be.allreduce(x, names[-1], "sum")))
    return [names[0] == names[1] != be.stable_name("contract.other")] + sums


def _host(c):
    return list(c.be.host(lambda a, b: (a + b, a * b), [c.t(2.0, "float64"), c.t(3.0, "float64")],
                          ("float64", "float64")))


def _numpy(c):
    return c.be.numpy(lambda a: (a * 2).astype(np.float32), [c.t([1.0, 2.0])], ("float32",))[0]


def _switch(c):
    index = c.be.unstack(c.be.stack([1], "int32"), 1)[0]
    return c.be.switch(index, [lambda: c.t([10.0]), lambda: c.t([20.0])])


def _assertion(c):
    """In a graph an op that fails the step when it runs (GRAPH_FAILURES); eagerly it raises at once."""
    be = c.be
    passing = be.assertion(be.all_finite(c.t([1.0])), ["fine"])
    if c.graph:
        failing = be.assertion(be.all_finite(c.t([float("nan")])), ["NaN or Inf in the gradient of 'w' (rank ",
                                                                      be.stack([1], "int32")[0], ")"])
        return be.after([passing, failing], c.t([1.0]))
    try:
        be.assertion(be.all_finite(c.t([float("nan")])), ["NaN or Inf in the gradient of 'w' (rank ", 1, ")"])
    except Exception as exc:  # noqa: BLE001 - the framework's own assertion error
        return str(exc)
    return "nothing raised"


def _after(c):
    be = c.be
    if c.graph:
        return be.after([be.assertion(be.all_finite(c.t([1.0])), ["fine"])], c.t([3.0]))
    return be.after([], c.t([3.0]))


def _scope(c):
    """Ops inside the scope compute as they would outside it (in a graph, named after it; the op after it is not),
    and an exception raised inside it reaches the caller."""
    be = c.be
    with be.scope("decode.dense/kernel"):
        inside = be.copy(c.t([1.0, 2.0]))
    outside = be.copy(c.t([3.0]))
    raised = "nothing raised"
    try:
        with be.scope("decode.other"):
            raise ValueError("rank 1 sent a corrupted payload")
    except ValueError as exc:
        raised = str(exc)
    return [inside, outside, raised, [inside.name, outside.name] if c.graph else []]


def _expect_scope(rank, n, value, c):
    inside, outside, raised, names = value
    differs = close(inside, [1, 2]) or close(outside, [3]) or equal(raised, "rank 1 sent a corrupted payload")
    if differs or not c.graph:
        return differs or equal(names, [])
    if "decode.dense_kernel" not in names[0] or "decode" in names[1]:
        return f"ops {names!r}: the first is not named after the scope, or the second is"
    return None


def _shared_state_written(c):
    """Host primitives: called from be.host, as the methods call them."""
    m = FakeMethod()

    def on_host():
        c.be.shared_state_written(m)
        c.be.shared_state_read(m)  # nothing was restored since: nothing to take on
        return float(m.loaded is None)

    return c.be.host(on_host, [], ("float64",))[0]


def _shared_state_read(c):
    m = FakeMethod()

    def on_host():
        c.be.shared_state_written(m)
        restored = c.set_method_state('{"theta": 40.0}')  # a checkpoint restores it behind the method's back
        c.be.shared_state_read(m)
        return float(restored), float(m.loaded == {"theta": 40.0}), float(m.loaded is None)

    return list(c.be.host(on_host, [], ("float64",) * 3))


def _per_rank_state(c):
    be = c.be
    if not hasattr(c, "state"):  # made once and reused (a tf.function may trace twice), as ErrorFeedback does
        c.state = be.residual("w", 3, c.item("w", [0.0, 0.0, 0.0]))
    r = c.state
    first = be.copy(be.read(r))
    be.assign(r, c.t([1.0, 2.0, 3.0]))
    assigned = be.copy(be.read(r))
    exported = np.asarray(be.export(r)).tolist() if not c.graph else None
    be.reset(r)
    reset = be.copy(be.read(r))
    return [first, assigned, reset, exported]


def _fused_states(c):
    """Three states in one buffer: [their values as the buffer's, a write to a piece seen in the buffer, a second
    call on the pieces giving the same buffer without a copy]; None where the backend cannot fuse (TensorFlow)."""
    be = c.be
    sizes = (2, 1, 3)
    if not hasattr(c, "fused"):  # made once (a tf.function may trace twice)
        c.fused = [be.residual(f"f{i}", n, c.item(f"f{i}", [0.0] * n)) for i, n in enumerate(sizes)]
    states = c.fused
    for i, (state, n) in enumerate(zip(states, sizes)):
        be.assign(state, c.t([float(10 * i + j) for j in range(n)]))
    fused = be.fused_states(states)
    if fused is None:
        return None
    buffer, pieces = fused
    values = be.copy(buffer)
    be.assign(pieces[1], c.t([-1.0]))
    again, same = be.fused_states(pieces)
    return [values, be.copy(buffer), all(a is b for a, b in zip(same, pieces))
            and again.data_ptr() == buffer.data_ptr()]


def _expect_fused(rank, n, value, c):
    if c.framework == "tf":
        return equal(value, None)
    return close(value[0], [0, 1, 10, 20, 21, 22]) or close(value[1], [0, 1, -1, 20, 21, 22]) or equal(value[2], True)


def _imported(c):
    """A checkpoint holds what export() gave (inside a graph nothing is exported: TensorFlow's are NumPy arrays)."""
    be = c.be
    if c.graph:
        values = np.asarray([4.0, 5.0], np.float32)
    else:
        saved = be.residual("u", 2, c.item("u", [0.0, 0.0]))
        be.assign(saved, c.t([4.0, 5.0]))
        values = be.export(saved)
    if not hasattr(c, "state"):  # made once and reused (a tf.function may trace twice)
        c.state = be.imported_residual("v", values)
    return [be.read(c.state), be.imported(values)]


def _allreduce_sparse(c):
    """Rank r sends row 0 (ones) and row r % 3 + 1 (r + 1): rows add where ranks' indices repeat."""
    r = c.rank
    item = c.sparse_item("emb", [0, r % 3 + 1], [[1.0, 1.0], [r + 1.0, r + 1.0]], [4, 2], "gather")
    future, sent = c.be.allreduce_sparse(item, c.be.name("sparse", item))
    c.be.write(item, c.be.wait(future))
    return [c.dense(c.written(item)), sent]


def _expect_sparse_average(rank, n, value, c):
    want = np.zeros((4, 2))
    for r in range(n):
        want[0] += 1.0
        want[r % 3 + 1] += r + 1.0
    return close(value[0], want / n) or close(value[1], 32)  # 2 rows of 2 float32 values, 2 int64 indices


def _densify(c):
    """The dense gradient a sparse one stands for; written back (twice its values here) it is the result."""
    item = c.sparse_item("emb", [2, 0], [[1.0, 2.0], [3.0, 4.0]], [3, 2], "dense")
    c.be.densify(item)
    dense = c.be.copy(item.grad)
    c.be.write(item, c.be.scale(c.be.flat32(item.grad), 2.0))
    return [dense, c.dense(c.written(item)), item.numel, item.itemsize]


def _output_buffer(c):
    """A float32 gradient's buffer, written in place (minus ones), and whether a float64 gradient has none."""
    be = c.be
    item = c.item("g", [[1.0, 2.0], [3.0, 4.0]])
    buffer = be.output_buffer(item)
    wide = c.item("h", [1.0, 2.0])
    wide.grad = c.t([1.0, 2.0], "float64")
    none_for_float64 = be.output_buffer(wide) is None
    if buffer is None:
        return [None, none_for_float64]
    be.sub(buffer, c.t([1.0, 1.0, 1.0, 1.0]), True)
    return [[buffer, item.grad], none_for_float64]


def _expect_output_buffer(rank, n, value, c):
    """TensorFlow's tensors cannot be written in place (its steps are the built ones): no buffer. PyTorch's float32
    gradient gives its own storage, flat: a write into the buffer is the gradient's; a float64 one gives none."""
    if c.built_steps:
        return equal(value, [None, True])
    if value[0] is None:
        return "no buffer for a contiguous float32 gradient"
    buffer, grad = value[0]
    return close(buffer, [0, 1, 2, 3]) or close(grad, [[0, 1], [2, 3]]) or equal(value[1], True)


def _linear_compressor(c):
    """Each of Horovod's compressors on x: what it sends, whether that is float16, and what it gives back."""
    x = c.t([1.0 / 3.0, 70000.0, -2.0])
    out = []
    for name in ("none", "fp16"):
        compressor = c.be.linear_compressor(name)
        sent, state = compressor.compress(x)
        back = compressor.decompress(sent, state)
        out.append([sent, "float16" in str(sent.dtype), back, "float32" in str(back.dtype)])
    return out


def _expect_linear(rank, n, value, c):
    x, half = [1.0 / 3.0, 70000.0, -2.0], [np.float16(1.0 / 3.0), np.inf, -2.0]
    (none_sent, none_half, none_back, none_f32), (fp16_sent, fp16_half, fp16_back, fp16_f32) = value
    return (close(none_sent, np.float32(x)) or equal([none_half, none_f32], [False, True])
            or close(none_back, np.float32(x)) or close(fp16_sent, half)
            or equal([fp16_half, fp16_f32], [True, True]) or close(fp16_back, half))


def _write(c):
    item = c.item("g", [[1.0, 2.0], [3.0, 4.0]])
    c.be.write(item, c.t([5.0, 6.0, 7.0, 8.0]))
    return c.written(item)


def _matrices(c):
    be = c.be
    x = be.reshape(c.t([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), (1, 2, 3))
    return [be.matmul(x, x, transpose_b=True), be.matmul(x, x, transpose_a=True)]


def _orthogonalize(c):
    """Gram-Schmidt as the NumPy reference runs it (a zero column stays zero), and QR up to its columns' signs."""
    be = c.be
    x = be.reshape(c.t([3.0, 1.0, 0.0, 4.0, 2.0, 0.0]), (1, 3, 2))
    zero = be.reshape(c.t([0.0, 1.0, 0.0, 1.0]), (1, 2, 2))  # a zero first column
    tiny = be.reshape(c.t([3e-25, 1e-30, 0.0, 4e-30, 2e-25, 0.0]), (1, 3, 2))  # |v|^2 underflows float32
    return [be.orthogonalize(x), be.orthogonalize(zero), be.orthogonalize(x, "qr"), be.orthogonalize(tiny)]


def _expect_orthogonal(rank, n, value, c):
    from hvdext_reference.powersgd import orthogonalize
    x = np.array([[3.0, 1.0], [0.0, 4.0], [2.0, 0.0]], np.float32)
    gram, zero, qr, tiny = (np.asarray(v, np.float64) for v in value)
    want = orthogonalize(x)
    s = np.sqrt(0.5)
    # tiny: columns of 1e-25 and 1e-30 are orthonormalized as x's are (their norms underflow unless scaled first)
    tiny_want = orthogonalize(np.array([[3e-25, 1e-30], [0.0, 4e-30], [2e-25, 0.0]], np.float32))
    return (close(gram[0], want) or close(zero[0], [[0, s], [0, s]]) or close(np.abs(qr[0]), np.abs(want))
            or close(tiny[0], want) or close(tiny[0], tiny_want))


def _expect_shared_read(rank, n, value, c):
    restored, took_it, nothing = value
    if restored:  # the backend holds the state in a variable a checkpoint restores (TensorFlow)
        return None if took_it else "the method did not take on the restored state"
    # PyTorch: a checkpoint reaches the method through load_state_dict() alone
    return None if nothing else "the method took on state nobody restored"


CASES = {
    # step-level names move in PyTorch's eager steps; TensorFlow's steps are built once, their names stay
    "end_step": (_end_step, lambda r, n, v, c: equal(v, [True, True, not c.built_steps])),
    "ranks_training": (_ranks_training, lambda r, n, v, c: equal(v, None if c.graph or c.framework == "ddp" else n)),
    "flat32": (_flat32, lambda r, n, v, c: close(v[0], [1, 2, 3, 4]) or equal(v[1], True)),
    "copy": (_copy, lambda r, n, v, c: close(v, [1, 2])),
    "sub": (lambda c: [c.be.sub(c.t([5.0, 7.0]), c.t([1.0, 2.0])), c.be.sub(c.t([5.0, 7.0]), c.t([1.0, 3.0]), True)],
            lambda r, n, v, c: close(v[0], [4, 5]) or close(v[1], [4, 4])),
    "stack": (lambda c: c.be.stack([1, 2.5], "float64"), lambda r, n, v, c: close(v, [1, 2.5])),
    "unstack": (_unstack, lambda r, n, v, c: close(v, [1, 2, 3])),
    "concat": (lambda c: [c.be.concat([c.t([1.0]), c.t([2.0, 3.0])]), c.be.concat([c.t([4.0])])],
               lambda r, n, v, c: close(v[0], [1, 2, 3]) or close(v[1], [4])),
    "inner_products": (lambda c: c.be.inner_products(c.t([1.0, 2.0]), c.t([3.0, -1.0])),
                       lambda r, n, v, c: close(v, [1, 5, 10])),
    "linear_compressor": (_linear_compressor, _expect_linear),
    "eager": (lambda c: c.be.eager(lambda x: c.be.scale(x, 2.0), [c.t([1.0, -3.0])], ("float32",))[0],
              lambda r, n, v, c: close(v, [2, -6])),
    "sum": (lambda c: c.be.sum([c.t(1.0, "float64"), c.t(2.5, "float64")]), lambda r, n, v, c: close(v, 3.5)),
    "all_finite": (_all_finite, lambda r, n, v, c: equal([bool(x) for x in v], [True, False, False, True])),
    "all_finite_rows": (lambda c: c.be.all_finite_rows(c.t([[1.0, 2.0], [float("nan"), 0.0], [3.0, float("inf")],
                                                             [0.0, -1.0]])),
                        lambda r, n, v, c: equal([bool(x) for x in v], [True, False, False, True])),
    "all_true": (_all_true, lambda r, n, v, c: equal(v, None if c.graph else [True, False, True, False, True])),
    "size": (lambda c: c.be.size(c.t([1.0, 2.0, 3.0])), lambda r, n, v, c: close(v, 3)),
    "equal": (lambda c: c.be.equal(c.t([1.0, -1.0]), -1), lambda r, n, v, c: equal([bool(x) for x in v],
                                                                                     [False, True])),
    "no_flag": (lambda c: c.be.no_flag(), lambda r, n, v, c: close(v, -1)),
    "nothing": (lambda c: [c.be.size(c.be.wait(c.be.nothing(d))) for d in ("float32", "uint8")],
                lambda r, n, v, c: close(v, [0, 0])),
    "k_of": (_k_of, lambda r, n, v, c: close(v, [100, 50, 1])),
    "shape": (lambda c: list(c.be.shape(c.t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))),
              lambda r, n, v, c: equal(list(v), [2, 3])),
    "reshape": (lambda c: c.be.reshape(c.t([1.0, 2.0, 3.0, 4.0]), (2, -1)),
                lambda r, n, v, c: close(v, [[1, 2], [3, 4]])),
    "dtype_name": (lambda c: [c.be.dtype_name(c.t([1], d)) for d in ("float32", "uint8", "int64", "float16")],
                   lambda r, n, v, c: equal(list(v), ["float32", "uint8", "int64", "float16"])),
    "bitcast": (_bitcast, lambda r, n, v, c: close(v[0], [1, 0, 0, 0, 2, 1, 0, 0]) or close(v[1], [1, 258])
                or close(v[2], [1065353216, -1073741824]) or close(v[3], [1, 2])),
    "split": (lambda c: c.be.split(c.t([1.0, 2.0, 3.0]), [1, 2]),
              lambda r, n, v, c: close(v[0], [1]) or close(v[1], [2, 3])),
    "cast": (lambda c: c.be.cast(c.be.cast(c.t([1.0 / 3.0, 70000.0]), "float16"), "float32"),
             lambda r, n, v, c: close(v, [np.float16(1.0 / 3.0), np.inf])),
    "scale": (lambda c: c.be.scale(c.t([1.0, -2.0]), 0.5), lambda r, n, v, c: close(v, [0.5, -1])),
    "matmul": (_matrices, lambda r, n, v, c: close(v[0], [[[14, 32], [32, 77]]])
               or close(v[1], [[[17, 22, 27], [22, 29, 36], [27, 36, 45]]])),
    "orthogonalize": (_orthogonalize, _expect_orthogonal),
    "allreduce": (_allreduce, lambda r, n, v, c: close(v, [[n * (n + 1) / 2], [(n + 1) / 2], [n]])),
    "allreduce_grad": (_allreduce_grad, lambda r, n, v, c: close(v[0], [(n + 1) / 2] * 3) or close(v[1], 12)),
    "allreduce_buffer": (_allreduce_buffer, lambda r, n, v, c: close(v, [(n + 1) / 2] * 3)),
    "allreduce_sparse": (_allreduce_sparse, _expect_sparse_average),
    "densify": (_densify, lambda r, n, v, c: close(v[0], [[3, 4], [0, 0], [1, 2]])
                or close(v[1], [[6, 8], [0, 0], [2, 4]]) or close(v[2:], [6, 4])),
    "allgather": (_allgather, lambda r, n, v, c: close(v[0], [float(j) for j in range(n) for _ in range(2)])
                  or close(v[1], [10.0 + j for j in range(n) for _ in range(j + 1)])),
    "alltoall": (_alltoall, lambda r, n, v, c: close(v[0], [10.0 * j + r for j in range(n)])
                 or close(v[1], [10.0 * j + r for j in range(n) for _ in range(r + 1)])),
    "wait": (_wait, lambda r, n, v, c: close(v, [n])),
    "name": (_name, lambda r, n, v, c: equal(v, True)),
    "step_name": (_step_name, lambda r, n, v, c: equal(v, True)),
    "stable_name": (_stable_name, lambda r, n, v, c: equal(v[0], True) or close(v[1:], [[n * (n + 1) / 2]] * 2)),
    "host": (_host, lambda r, n, v, c: close(v, [5, 6])),
    "numpy": (_numpy, lambda r, n, v, c: close(v, [2, 4])),
    "switch": (_switch, lambda r, n, v, c: close(v, [20])),
    "building_graph": (lambda c: c.be.building_graph(), lambda r, n, v, c: equal(bool(v), c.graph)),
    "assertion": (_assertion, lambda r, n, v, c: None if "NaN or Inf in the gradient of 'w' (rank " in str(v)
                  and "1" in str(v) else f"the assertion said {v!r}"),
    "after": (_after, lambda r, n, v, c: close(v, [3])),
    "scope": (_scope, _expect_scope),
    "shared_state_written": (_shared_state_written, lambda r, n, v, c: close(v, 1)),
    "shared_state_read": (_shared_state_read, _expect_shared_read),
    "residual": (_per_rank_state, lambda r, n, v, c: close(v[0], [0, 0, 0]) or close(v[1], [1, 2, 3])
                 or close(v[2], [0, 0, 0]) or (None if c.graph else close(v[3], [1, 2, 3]))),
    "read": (_per_rank_state, lambda r, n, v, c: close(v[1], [1, 2, 3])),
    "assign": (_per_rank_state, lambda r, n, v, c: close(v[1], [1, 2, 3])),
    "reset": (_per_rank_state, lambda r, n, v, c: close(v[2], [0, 0, 0])),
    "export": (_per_rank_state, lambda r, n, v, c: None if c.graph else close(v[3], [1, 2, 3])),
    "fused_states": (_fused_states, _expect_fused),
    "imported_residual": (_imported, lambda r, n, v, c: close(v[0], [4, 5])),
    "imported": (_imported, lambda r, n, v, c: close(v[1], [4, 5])),
    "output_buffer": (_output_buffer, _expect_output_buffer),
    "write": (_write, lambda r, n, v, c: close(v, [[5, 6], [7, 8]])),
}

# Cases that must fail the tf.function they run in (their failed assertion), with this text in the error.
GRAPH_FAILURES = {"assertion": "(rank ] [1] [)]",
                  "require": "assertion failed: [NaN or Inf in the gradient of"}


# The step context (horovod_ext/compression/context.py) over each backend: c.context is a StepContext using c.be,
# begun at step 3 with seed 7.
def _begin(c):
    return [c.context.step, c.context.seed, c.context.dense, c.context.failed()]


def _require(c):
    ctx, be = c.context, c.be
    ctx.require(be.all_finite(c.t([1.0])), "fine")
    ctx.require(be.all_finite(c.t([float("nan")])), "'w' (on rank {})", be.stack([1], "int32")[0])
    ctx.require(be.equal(be.stack([-1], "int32")[0], -1), "'v' {}", be.stack([2], "int32")[0], error="payload")
    if c.graph:  # assertions: the failed one fails the step when it runs
        return ctx.guarded(c.t([1.0]))
    return [list(e) for e in ctx.settled_errors()]  # eagerly the truths are read here, together


def _expect_require(rank, n, value, c):
    if c.graph:
        return "the failed requirement did not fail the graph"  # the worker expects the run to raise
    return equal(value, [["nonfinite", "'w' (on rank 1)"]])


def _decoding(c):
    ctx, item = c.context, c.item("dense/kernel", [1.0])
    if c.graph:
        with ctx.decoding(item):
            op = c.be.copy(c.t([1.0]))
        return op.name
    with ctx.decoding(item):
        raise ValueError("rank 1 sent a corrupted payload")
    return [list(e) for e in ctx.errors]


def _reject(c):
    """A decoder of several tensors at once reports one tensor's payloads as decoding() does (eagerly)."""
    ctx, item = c.context, c.item("dense/kernel", [1.0])
    if c.graph:
        return None
    ctx.reject(item, "rank 1 sent a corrupted payload")
    return [[list(e) for e in ctx.errors], ctx.failed()]


def _failed(c):
    ctx = c.context
    before = ctx.failed()
    if not c.graph:
        ctx.require(False, "x")
    return [before, ctx.failed()]


A_FAILED = ["nonfinite", "'a' 1"]


def _settled_errors(c):
    """Eagerly a tensor truth waits on the device until the errors are asked for, then is read with the others."""
    ctx, be = c.context, c.be
    if c.graph:
        return None
    ctx.require(be.all_finite(c.t([float("inf")])), "'a' {}", be.stack([1], "int32")[0])
    ctx.require(be.all_finite(c.t([2.0])), "'b'")
    waiting = [list(e) for e in ctx.errors]  # nothing read yet
    return [waiting, [list(e) for e in ctx.settled_errors()], [list(e) for e in ctx.settled_errors()]]


def _pending(c):
    """What a graph's outputs wait for: the assertions and the runtime count; nothing eagerly."""
    ctx = c.context
    ctx.require(c.be.all_finite(c.t([1.0])), "fine")
    ctx.count_runtime(payload_bytes=c.t(5.0, "float64"))
    pending = ctx.pending()
    return [len(pending), c.be.after(pending, c.t([3.0]))]


def _timed(c):
    with c.context.timed("compress_seconds"):
        sum(range(20000))
    return c.counted("compress_seconds")


def _counting(method):
    def case(c):
        getattr(c.context, method)(payload_bytes=5,
                                   wire_bytes=c.t(7.0, "float64") if method == "count_runtime" else 7)
        return [c.counted("payload_bytes"), c.counted("wire_bytes")]
    return case


def _totals(c):
    """Counts of a step made once and run `steps` times (TensorFlow); PyTorch's add to the statistics as they come."""
    ctx = c.context
    ctx.count(payload_bytes=5)
    ctx.count_decided(payload_bytes=2)
    if not ctx.built_steps:
        return None
    last, total = ctx.totals(10, ("payload_bytes",))
    return [last["payload_bytes"], total["payload_bytes"]]


CONTEXT_CASES = {
    "begin": (_begin, lambda r, n, v, c: close(v[:2], [3, 7]) or equal(v[2:], [False, False])),
    "require": (_require, _expect_require),
    "decoding": (_decoding, lambda r, n, v, c: (None if "decode.dense_kernel" in v else f"op {v!r} is not named "
                                                "after the tensor") if c.graph else
                 equal(v, [["payload", "'dense/kernel': rank 1 sent a corrupted payload"]])),
    "failed": (_failed, lambda r, n, v, c: equal(v, [False, False] if c.graph else [False, True])),
    "reject": (_reject, lambda r, n, v, c: equal(v, None if c.graph else [
        [["payload", "'dense/kernel': rank 1 sent a corrupted payload"]], True])),
    "settled_errors": (_settled_errors, lambda r, n, v, c: equal(v, None if c.graph else [[], [A_FAILED], [A_FAILED]])),
    "guarded": (lambda c: c.context.guarded(c.t([3.0])), lambda r, n, v, c: close(v, [3])),
    "pending": (_pending, lambda r, n, v, c: equal(v[0], 2 if c.graph else 0) or close(v[1], [3])),
    "timed": (_timed, lambda r, n, v, c: None if (v > 0) == c.timed else f"timed={c.timed} but {v} s counted"),
    "count": (_counting("count"), lambda r, n, v, c: close(v, [5, 7])),
    "count_decided": (_counting("count_decided"), lambda r, n, v, c: close(v, [5, 7])),
    "count_runtime": (_counting("count_runtime"), lambda r, n, v, c: close(v, [5, 7])),
    "totals": (_totals, lambda r, n, v, c: close(v, [7, 52]) if c.built_steps else equal(v, None)),
}
