"""transport="sparse_reduce" under horovodrun -np 2, 3 or 4 (torch). argv[1], a comma list of modes run in turn in one
launch (the result holds each mode's record under its name); "tf" runs alone:

"exact": top-k (fp16 and fp32 values) and GraVAC over sparse_reduce on seeded per-rank gradients: records each
step's averaged gradients and this rank's residuals (bytes, for the NumPy reference in the test), the bytes counted,
and a run checkpointed by every rank and resumed into a new optimizer (it must continue bit for bit).
"adversarial": every kept index in one region of one tensor (a stale rebalance: the selection moves to the other
end of the tensor), and the bytes counted each step.
"errors": a NaN on one rank, and settings that differ across ranks: the error every rank raises.
"tf": the same configs in TensorFlow, eagerly and in a tf.function (averaged gradients per step, for the reference).
"""
import base64
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from hvdrun import expect_error, write_result  # noqa: E402

MODES = sys.argv[1].split(",") if __name__ == "__main__" else ["exact"]  # imported (mpi_worker.py): torch
if MODES == ["tf"]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf  # noqa: E402
    import horovod_ext.tensorflow as hvd  # noqa: E402
else:
    import torch  # noqa: E402
    import horovod_ext.torch as hvd  # noqa: E402
SIZES = (6007, 37, 20000, 3001)
ADVERSARIAL = 200000
STEPS = 6
CONFIGS = {  # name: (compressor, settings)
    "topk_fp16": ("topk", {"ratio": 0.02, "transport": "sparse_reduce", "rebalance_every": 2}),
    "topk_fp32": ("topk", {"ratio": 0.02, "transport": "sparse_reduce", "rebalance_every": 3,
                           "value_dtype": "fp32"}),
    "adaptive": ("adaptive_topk", {"min_cf": 2, "max_cf": 40, "epsilon": 0.3, "window": 2,
                                   "transport": "sparse_reduce", "rebalance_every": 2}),
}


def gradients(step, rank, sizes=SIZES):
    rng = np.random.default_rng(1000 * step + rank)
    return [(rng.standard_t(3, n) * 1e-2).astype(np.float32) for n in sizes]


def encoded(array):
    return base64.b64encode(np.ascontiguousarray(array, dtype=np.float32).tobytes()).decode()


def make(name, settings, sizes):
    params = [torch.nn.Parameter(torch.zeros(n)) for n in sizes]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1),
                                   named_parameters=[(f"w{i}", p) for i, p in enumerate(params)],
                                   compression=getattr(hvd.Compression, name)(**settings))
    return params, opt


def run(params, opt, steps, grads=gradients, sizes=SIZES):
    seen = []
    for step in steps:
        opt.zero_grad()
        for p, g in zip(params, grads(step, hvd.rank(), sizes)):
            (p * torch.from_numpy(g)).sum().backward()
        opt.synchronize()
        residuals = opt.state_dict()["horovod_ext"]["residuals"]
        stats = opt.compression_stats()
        seen.append({"avg": [encoded(p.grad.numpy()) for p in params],
                     "residuals": [encoded(residuals[f"w{i}"].numpy()) for i in range(len(params))],
                     "wire_bytes": stats["last_step"]["wire_bytes"],
                     "payload_bytes": stats["last_step"]["payload_bytes"],
                     "path": stats.get("path"), "cf": stats.get("cf"), "theta_min": stats.get("theta_min")})
        with opt.skip_synchronize():
            opt.step()
    return seen


def exact():
    result = {}
    for label, (name, settings) in CONFIGS.items():
        params, opt = make(name, settings, SIZES)
        steps = run(params, opt, range(STEPS))
        result[label] = {"steps": steps, "transport": opt.compression_stats().get("transport")}
        # every rank checkpoints itself after 3 steps; a new optimizer loads it and continues
        params, opt = make(name, settings, SIZES)
        run(params, opt, range(3))
        state = opt.state_dict()
        params2, opt2 = make(name, settings, SIZES)
        with torch.no_grad():
            for p, q in zip(params2, params):
                p.copy_(q)
        opt2.load_state_dict(state)
        result[label]["resumed"] = [s["avg"] for s in run(params2, opt2, range(3, STEPS))]
    return result


def adversarial():
    """Step 0: the gradient lives in the first 1% of the tensor (the regions are rebalanced on it); step 1: in the
    last 1% (regions stale: rebalance_every=100), so every rank's entries fall into the last region."""
    def grads(step, rank, sizes):
        g = np.zeros(ADVERSARIAL, np.float32)
        rng = np.random.default_rng(7 * step + rank)
        part = slice(0, ADVERSARIAL // 100) if step == 0 else slice(ADVERSARIAL - ADVERSARIAL // 100, ADVERSARIAL)
        g[part] = rng.standard_normal(ADVERSARIAL // 100).astype(np.float32) + 1.0
        return [g]

    out = {}
    for label, settings in {"fp16": {}, "fp32": {"value_dtype": "fp32"}}.items():
        params, opt = make("topk", dict(ratio=0.005, transport="sparse_reduce", rebalance_every=100, **settings),
                           (ADVERSARIAL,))
        steps = run(params, opt, range(2), grads, (ADVERSARIAL,))
        out[label] = [{"wire_bytes": s["wire_bytes"], "payload_bytes": s["payload_bytes"]} for s in steps]
    return out


def corrupted_chunk(settings):
    """The last rank flips a byte of the phase-1 payload it sends rank 0: only rank 0 sees it (by alltoall); its
    flagged phase-2 payload makes every rank fail the step."""
    from horovod_ext.torch_common import kernels
    original = kernels.TorchKernels.topk_encode_regions

    def corrupting(flats, positions, bounds, value_type):
        payload, region_bytes = original(flats, positions, bounds, value_type)
        if hvd.rank() == hvd.size() - 1:
            payload = payload.clone()
            payload[region_bytes[0] // 2] ^= 0x20
        return payload, region_bytes

    kernels.TorchKernels.topk_encode_regions = staticmethod(corrupting)
    try:
        run(*make("topk", settings, SIZES), range(1))
    finally:
        kernels.TorchKernels.topk_encode_regions = staticmethod(original)


def errors():
    def nan_grads(step, rank, sizes):
        grads = gradients(step, rank, sizes)
        if rank == hvd.size() - 1 and step == 1:
            grads[2][5] = np.nan
        return grads

    base = {"ratio": 0.02, "transport": "sparse_reduce"}
    cases = [expect_error("nan", lambda: run(*make("topk", base, SIZES), range(2), nan_grads)),
             expect_error("transport_differs", lambda: run(*make("topk", dict(
                 base, transport="sparse_reduce" if hvd.rank() == 0 else "allgather"), SIZES), range(1))),
             expect_error("rebalance_differs", lambda: run(*make("topk", dict(
                 base, rebalance_every=2 + hvd.rank()), SIZES), range(1))),
             expect_error("bad_transport", lambda: hvd.Compression.topk(transport="ring")),
             expect_error("ternary_values", lambda: hvd.Compression.topk(transport="sparse_reduce",
                                                                         value_dtype="ternary"))]
    cases.append(expect_error("corrupted_chunk", lambda: corrupted_chunk(base)))
    # after the failed steps, training goes on
    params, opt = make("topk", base, SIZES)
    run(params, opt, range(1))
    return {"cases": cases, "rank": hvd.rank()}


def tf_run(name, settings, graph):
    from tf_train import train_tf
    seen, stats = train_tf(hvd, tf, getattr(hvd.Compression, name)(**settings), SIZES,
                           lambda step, rank: gradients(step, rank), STEPS, graph,
                           lambda grads: {"avg": [encoded(g.numpy()) for g in grads]})
    return {"steps": seen, "transport": stats[0].get("transport")}


def tensorflow():
    return {f"{'graph' if graph else 'eager'}/{label}": tf_run(*CONFIGS[label], graph)
            for graph in (False, True) for label in ("topk_fp16", "topk_fp32")}


if __name__ == "__main__":
    hvd.init()
    run_mode = {"exact": exact, "adversarial": adversarial, "errors": errors, "tf": tensorflow}
    result = {mode: run_mode[mode]() for mode in MODES}
    result["size"] = hvd.size()
    write_result(hvd.rank(), result)
