"""Compression.powersgd under horovodrun (tests/test_powersgd.py): per framework ("torch", "tf"), each rank's
averaged update against the NumPy reference (python/hvdext_reference/powersgd.py) for the same gradients, and every
rank's bits; with "torch" at 2 ranks also against PyTorch's own DDP hook (powerSGD_hook over torch.distributed
with gloo, in the same processes), with the hook's random Q replaced by ours (the seed handling made equal)."""
import gc
import os
import socket
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from hvdext_reference import philox  # noqa: E402
from hvdext_reference.powersgd import PowerSGD as Reference  # noqa: E402
from hvdrun import write_result  # noqa: E402
from horovod_ext.compressors.powersgd import matrix_layout  # noqa: E402
from horovod_ext.compression.wire import tensor_key  # noqa: E402

FRAMEWORK = sys.argv[1]
# matrices (two of one shape, for batch_tensors), a conv kernel (8 x 27), a bias and a matrix too small to compress
SHAPES = [(64, 40), (8, 3, 3, 3), (64,), (10, 64), (64, 40), (3, 5)]
NAMES = [f"w{i}" for i in range(len(SHAPES))]
STEPS, START = 5, 2
CONFIGS = {
    "default": dict(rank=2, start_iter=START, seed=11),
    "fp16_batched_qr": dict(rank=2, start_iter=START, seed=11, value_dtype="fp16", batch_tensors=True,
                            orthogonalization="qr"),
    "cold_no_feedback": dict(rank=3, start_iter=START, seed=11, warm_start=False, error_feedback=False),
}


def gradients(step, rank):
    rng = np.random.default_rng(1000 * step + rank)
    return [rng.standard_normal(s).astype(np.float32) * np.float32(0.1 * (i + 1)) for i, s in enumerate(SHAPES)]


def reference(config, nranks):
    ref = Reference(nranks, **{k: v for k, v in config.items() if k != "batch_tensors"})
    return [ref.step(step, [gradients(step, r) for r in range(nranks)], [tensor_key(n) for n in NAMES])
            for step in range(STEPS)]


def compare(got, want):
    """max |got - want| / max |want| per tensor and step."""
    return [[float(np.max(np.abs(g - w)) / max(float(np.max(np.abs(w))), 1e-30)) for g, w in zip(gs, ws)]
            for gs, ws in zip(got, want)]


def run_torch(config):
    import torch
    import horovod_ext.torch as hvd
    params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.0), named_parameters=list(zip(NAMES, params)),
                                   compression=hvd.Compression.powersgd(**config))
    out = []
    for step in range(STEPS):
        for p, g in zip(params, gradients(step, hvd.rank())):
            p.grad = torch.from_numpy(g.copy())
        opt.synchronize()
        out.append([p.grad.numpy().copy() for p in params])
        with opt.skip_synchronize():
            opt.step()
    return out, opt.compression_stats()


def run_tf(config, graph):
    import tensorflow as tf
    import horovod_ext.tensorflow as hvd
    variables = [tf.Variable(tf.zeros(s), name=n) for n, s in zip(NAMES, SHAPES)]
    compression = hvd.Compression.powersgd(**config)
    holder = {}

    def averaged(*grads):
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(v * g) for v, g in zip(variables, grads)])
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        holder["tape"] = tape
        return tape.gradient(loss, variables)

    fn = tf.function(averaged) if graph else averaged
    out = [[g.numpy() for g in fn(*gradients(step, hvd.rank()))] for step in range(STEPS)]
    return out, holder["tape"].aggregator.compression_stats()


def check(config_name, graph=False):
    # Horovod's tapes share one aggregator (its step and state) per compression: the graph run gets its own seed
    config = dict(CONFIGS[config_name], seed=CONFIGS[config_name]["seed"] + int(graph))
    # the same run with batch_tensors the other way: its bits (a batch multiplies what one matrix would)
    other = dict(config, batch_tensors=not config.get("batch_tensors", True))
    if FRAMEWORK == "torch":
        import horovod_ext.torch as hvd
        got, stats = run_torch(config)
        unbatched, _ = run_torch(other)
    else:
        import horovod_ext.tensorflow as hvd
        got, stats = run_tf(config, graph)
        unbatched, _ = run_tf(other, graph)
    gathered = [hvd.allgather_object([g.tobytes() for g in gs]) for gs in got]
    want = reference(config, hvd.size())
    return {"error": compare(got, want), "config": config,
            "batching_same_bits": all(np.array_equal(a, b) for gs, hs in zip(got, unbatched) for a, b in zip(gs, hs)),
            "identical": all(all(r == per_rank[0] for r in per_rank) for per_rank in gathered),
            "compressing": stats.get("compressing"), "last_step": stats["last_step"], "total": stats["total"]}


KEPT = []  # objects whose destructor must run on the main thread (against_hook)


def against_hook():
    """The same model, data and initial weights trained 5 steps by Horovod with Compression.powersgd and by DDP with
    powerSGD_hook (rank 2, start 2, error feedback and warm start): the parameters after each step."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as hook
    import horovod_ext.torch as hvd

    rank, size = hvd.rank(), hvd.size()
    port = None
    if rank == 0:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    port = hvd.broadcast_object(port, root_rank=0, name="powersgd_worker.port")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    seed, r = 23, 2

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(40, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))

    ours, theirs = model(), model()
    names = {id(p): n for n, p in ours.named_parameters()}
    their_names = {id(p): n for n, p in theirs.named_parameters()}
    opt = hvd.DistributedOptimizer(torch.optim.SGD(ours.parameters(), lr=0.1), named_parameters=ours.named_parameters(),
                                   compression=hvd.Compression.powersgd(rank=r, start_iter=START, seed=seed))
    ddp = torch.nn.parallel.DistributedDataParallel(theirs, bucket_cap_mb=100)
    state = hook.PowerSGDState(process_group=None, matrix_approximation_rank=r, start_powerSGD_iter=START,
                               min_compression_rate=2, use_error_feedback=True, warm_start=True)

    def seeded_hook(state, bucket):
        """The hook with its first Q taken from our draw: fills its Q memory as the hook would (tensors to compress
        in bucket order, m x r each), so that the hook skips its own draw and orthogonalizes ours."""
        if state.iter >= state.start_powerSGD_iter and bucket.index() not in state.p_memory_dict:
            ps, qs = [], []
            for p in bucket.parameters():
                layout = matrix_layout(tuple(p.shape), r, 2)
                if layout is not None:
                    n, m, rr = layout
                    ps.append(torch.zeros(n * rr))
                    qs.append(torch.from_numpy(philox.normal(m * rr, seed, state.iter,
                                                             tensor_key(their_names[id(p)]))))
            state.p_memory_dict[bucket.index()] = torch.cat(ps)
            state.q_memory_dict[bucket.index()] = torch.cat(qs)
        return hook.powerSGD_hook(state, bucket)

    ddp.register_comm_hook(state, seeded_hook)
    their_opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    differences = []
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(32, 40, generator=gen), torch.randint(0, 10, (32,), generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ours(x), y).backward()
        opt.step()
        their_opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        their_opt.step()
        differences.append({names[id(a)]: float((a - b).detach().abs().max() / b.detach().abs().max())
                            for a, b in zip(ours.parameters(), theirs.parameters())})
    moved = float(sum((p - q).detach().abs().sum() for p, q in zip(ours.parameters(), model().parameters())))
    # The hook's future callbacks hold the process group; a gloo worker thread drops them after running them. Had
    # that been the group's last reference, its destructor would join the gloo threads from one of them ("Resource
    # deadlock avoided", an abort at exit). The main thread keeps a reference to the end of the process, so the
    # group is destroyed on the main thread, after every callback has been dropped.
    KEPT.append(dist.group.WORLD)
    dist.barrier()
    del ddp, their_opt, state, seeded_hook
    gc.collect()
    dist.destroy_process_group()
    return {"differences": differences, "moved": moved, "compressed": sorted(
        n for n, p in ours.named_parameters() if matrix_layout(tuple(p.shape), r, 2) is not None)}


if __name__ == "__main__":
    if FRAMEWORK == "torch":
        import horovod_ext.torch as hvd
        hvd.init()
        result = {"rank": hvd.rank(), "size": hvd.size(), "cases": {name: check(name) for name in CONFIGS}}
        if hvd.size() == 2:
            result["hook"] = against_hook()
    else:
        import horovod_ext.tensorflow as hvd
        hvd.init()
        result = {"rank": hvd.rank(), "size": hvd.size(),
                  "cases": {f"{name}_{mode}": check(name, graph=mode == "graph")
                            for name in CONFIGS for mode in ("eager", "graph")}}
    write_result(hvd.rank(), result)
