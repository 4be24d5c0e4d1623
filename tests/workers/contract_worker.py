"""Runs the backend contract's conformance cases (tests/contract_cases.py): argv[1] "torch" (the PyTorch backend
over Horovod) or "tf" (TensorFlow eagerly, then inside tf.function) under horovodrun, or "ddp" (the PyTorch backend
over torch.distributed, under torchrun, with Horovod hidden: importing it fails). Writes {mode: {case: None or what
differs}} for tests/test_backend_contract.py."""
import json
import os
import sys
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from contract_cases import CASES, CONTEXT_CASES, GRAPH_FAILURES  # noqa: E402
import hide_horovod  # noqa: E402
from hvdrun import write_result  # noqa: E402

from horovod_ext.compression import CompressionStats  # noqa: E402
from horovod_ext.compression.context import StepContext  # noqa: E402
from horovod_ext.compression.plan import Item  # noqa: E402


def plain(value, to_numpy):
    """Tensors to nested lists of numbers (None, bools, numbers and strings as they are)."""
    if isinstance(value, (list, tuple)):
        return [plain(v, to_numpy) for v in value]
    if value is None or isinstance(value, (bool, int, float, str, dict)):
        return value
    value = to_numpy(value)
    return value.decode() if isinstance(value, bytes) else value  # a tf.function returns str as a string tensor


def begun(case):
    """A context case: the step context begins (inside the tf.function in the graph mode), then the case."""
    def run(c):
        c.context.begin(3, 7, False)
        return case(c)
    return run


def check(mode, rank, nranks, make_context, to_numpy, run=lambda fn: fn()):
    results = {}
    cases = dict(CASES)
    cases.update({f"context.{name}": (begun(case), expect) for name, (case, expect) in CONTEXT_CASES.items()})
    only = os.environ.get("HVDEXT_CONTRACT_CASES")  # a comma-separated subset, to run one case alone
    for name, (case, expect) in cases.items():
        if only and name not in only.split(","):
            continue
        print(f"[contract] {mode} {name}", flush=True)
        ctx = make_context()
        ctx.rank = rank
        try:
            value = run(lambda: case(ctx))
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            fragment = GRAPH_FAILURES.get(name.replace("context.", "")) if ctx.graph else None
            results[name] = None if fragment and fragment in str(exc) else f"{type(exc).__name__}: {exc}"[:500]
            continue
        value = plain(value, to_numpy)
        results[name] = expect(rank, nranks, value, ctx)
    return results


def torch_items(torch):
    """The context's PyTorch helpers, the same for both PyTorch backends: t, item, sparse_item, written, dense."""
    def t(values, dtype="float32"):
        return torch.tensor(values, dtype=getattr(torch, dtype))

    def item(name, values):
        grad = t(values)
        return Item(0 if name in ("a", "g", "w", "grad") else 1, name, grad, grad.numel(), grad.element_size())

    def sparse_item(name, indices, rows, shape, sparse):
        param = torch.nn.Parameter(torch.zeros(shape))
        param.grad = torch.sparse_coo_tensor(torch.tensor([indices]), t(rows), shape)
        return Item(0, name, param.grad, param.numel(), param.element_size(), param=param, sparse=sparse)

    def written(it):
        if it.result is not None:
            return it.result
        return it.param.grad if it.param is not None else it.grad

    return dict(t=t, item=item, sparse_item=sparse_item, written=written,
                dense=lambda x: x.to_dense() if x.is_sparse else x)


def torch_numpy(torch):
    return lambda x: np.asarray(x.detach().cpu().numpy() if torch.is_tensor(x) else x).tolist()


def run_torch():
    import torch
    import horovod_ext.torch as hvd
    from horovod.common.process_sets import global_process_set
    from horovod_ext.torch.backend import TorchBackend, timed_into
    hvd.init()
    torch_item = torch_items(torch)

    def make_context():
        stats = CompressionStats("contract")
        be = TorchBackend(global_process_set, hvd.Average, 1.0, stats)
        context = StepContext(stats, timer=timed_into)
        context.use(be)
        return types.SimpleNamespace(be=be, context=context, framework="torch", built_steps=False, graph=False,
                                     timed=True, counted=lambda field: stats.current[field],
                                     set_method_state=lambda text: False, **torch_item)

    return hvd, {"torch": check("torch", hvd.rank(), hvd.size(), make_context, torch_numpy(torch))}


def run_ddp():
    """horovod_ext.ddp's backend over torch.distributed (Gloo), in a process where Horovod cannot be imported."""
    hide_horovod.hide()
    import torch
    import torch.distributed as dist
    from horovod_ext.ddp.backend import DDPBackend
    from horovod_ext.torch_common.tensors import timed_into
    dist.init_process_group("gloo")
    torch_item = torch_items(torch)

    def make_context():
        stats = CompressionStats("contract")
        be = DDPBackend(None, stats)
        context = StepContext(stats, timer=timed_into)
        context.use(be)
        return types.SimpleNamespace(be=be, context=context, framework="ddp", built_steps=False, graph=False,
                                     timed=True, counted=lambda field: stats.current[field],
                                     set_method_state=lambda text: False, **torch_item)

    results = {"ddp": check("ddp", dist.get_rank(), dist.get_world_size(), make_context, torch_numpy(torch))}
    rank = dist.get_rank()
    dist.barrier()
    dist.destroy_process_group()
    return rank, results


def run_tf():
    import tensorflow as tf
    import horovod_ext.tensorflow as hvd
    from horovod.common.process_sets import global_process_set
    from horovod_ext.tensorflow.backend import TFBackend
    hvd.init()

    def t(values, dtype="float32"):
        return tf.constant(values, dtype=getattr(tf, dtype))

    def make_context(graph):
        stats = CompressionStats("contract", timed=False)
        module = tf.Module()
        with tf.init_scope():
            module.method_state = tf.Variable("", dtype=tf.string, trainable=False)
        module.residuals = {}
        be = TFBackend(module, global_process_set, hvd.Average, 1.0)
        context = StepContext(stats, built_steps=True)
        context.use(be)

        def counted(field):
            runtime = [v for key, v in context.runtime if key == field]
            fixed = context.per_step.get(field, 0) + context.decided_last.get(field, 0) \
                + context.runtime_last.get(field, 0)
            return fixed + tf.add_n([tf.cast(v, tf.float64) for v in runtime]) if runtime else fixed

        def set_method_state(text):
            module.method_state.assign(text)
            return True

        def item(name, values):
            grad = t(values)
            return Item(0, name, grad, int(np.prod(grad.shape)), grad.dtype.size)

        def sparse_item(name, indices, rows, shape, sparse):
            grad = tf.IndexedSlices(t(rows), tf.constant(indices, tf.int64), tf.constant(shape, tf.int64))
            return Item(0, name, grad, int(np.prod(shape)), grad.dtype.size, sparse=sparse)

        return types.SimpleNamespace(be=be, context=context, framework="tf", built_steps=True, t=t, item=item,
                                     sparse_item=sparse_item, graph=graph, timed=False,
                                     counted=counted, written=lambda it: it.result, dense=tf.convert_to_tensor,
                                     set_method_state=set_method_state)

    def to_numpy(x):
        return np.asarray(x.numpy() if hasattr(x, "numpy") else x).tolist()

    results = {"tf-eager": check("tf-eager", hvd.rank(), hvd.size(), lambda: make_context(False), to_numpy)}
    results["tf-graph"] = check("tf-graph", hvd.rank(), hvd.size(), lambda: make_context(True), to_numpy,
                                run=lambda fn: tf.function(fn)())
    return hvd, results


if __name__ == "__main__":
    if sys.argv[1] == "ddp":
        rank, results = run_ddp()
    else:
        hvd, results = run_torch() if sys.argv[1] == "torch" else run_tf()
        rank = hvd.rank()
    write_result(rank, {"rank": rank, "results": results})
    json.dumps(results)
