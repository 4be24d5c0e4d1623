"""compression_stats() byte counts, under horovodrun: argv[1] "torch" or "tf". Trains three steps of a model with
tensors of 5003, 37 and 2048 elements for every compressor, packing and value dtype (TensorFlow: eagerly and inside
tf.function) and records what compression_stats() reports; tests/test_bytes.py compares them with the plan. Each
tensor's collective alone (bucket_cap_mb=0): the plan's bytes are per tensor; what a bucket adds (its allgather's
sizes) is tests/test_buckets.py's."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from hvdrun import write_result  # noqa: E402

FRAMEWORK = sys.argv[1]
SEED = 5  # the script's seed: the ternary draws' key (test_bytes.py recomputes the entropy-coded payloads from it)
SIZES = (5003, 37, 2048)
STEPS = 3
FIELDS = ("payload_bytes", "wire_bytes", "dense_bytes", "dense_wire_bytes", "elements", "compressed_elements")
CONFIGS = {
    "none": ("none", {}),
    "fp16": ("fp16", {}),
    "ternary_base3": ("ternary", {"packing": "base3"}),
    "ternary_2bit": ("ternary", {"packing": "2bit"}),
    "ternary_shared_2bit": ("ternary", {"packing": "2bit", "shared_scale": True, "transport": "allgather"}),
    "ternary_two_phase": ("ternary", {"packing": "base3", "shared_scale": True, "transport": "two_phase"}),
    "ternary_two_phase_2bit": ("ternary", {"packing": "2bit", "shared_scale": True, "transport": "two_phase"}),
    "topk_fp16": ("topk", {"ratio": 0.05, "packing": "int32"}),
    "topk_fp32": ("topk", {"ratio": 0.05, "value_dtype": "fp32", "packing": "int32"}),
    "topk_no_ef": ("topk", {"ratio": 0.3, "error_feedback": False, "packing": "int32"}),
    "adaptive": ("adaptive_topk", {"min_cf": 2, "max_cf": 40, "epsilon": 0.3, "window": 2, "omega": 0.0,
                                   "packing": "int32"}),
    # entropy-coded payloads (the defaults): sizes depend on the values; test_bytes.py bounds them
    "ternary_entropy": ("ternary", {}),
    "ternary_two_phase_entropy": ("ternary", {"shared_scale": True, "transport": "two_phase"}),
    "topk_delta_fp16": ("topk", {"ratio": 0.05}),
    "topk_delta_ternary": ("topk", {"ratio": 0.05, "value_dtype": "ternary"}),
    "adaptive_delta": ("adaptive_topk", {"min_cf": 2, "max_cf": 40, "epsilon": 0.3, "window": 2, "omega": 0.0}),
}


def gradients(step, rank):
    rng = np.random.default_rng(1000 * step + rank)
    return [rng.standard_normal(n).astype(np.float32) for n in SIZES]


def spec_of(hvd, name, kwargs):
    spec = getattr(hvd.Compression, name)
    return spec(**kwargs) if kwargs else spec


def record(stats, log):
    """The statistics after the run; log: (path, cf) of each step, read after it (the controller keeps the last
    window)."""
    out = {part: {f: stats[part][f] for f in FIELDS} for part in ("total", "last_step")}
    out["steps"] = stats["steps"]
    out["log"] = log
    out["seed"] = stats.get("seed")
    return out


def newest(stats, log):
    """Append the step just taken to log, for adaptive_topk."""
    if stats.get("log"):
        log.append((stats["log"][-1]["path"], stats["log"][-1]["cf"]))


def run_torch():
    import torch
    import horovod_ext.torch as hvd
    hvd.init()
    torch.manual_seed(SEED)
    results = {}
    for key, (name, kwargs) in CONFIGS.items():
        params = [torch.nn.Parameter(torch.zeros(n)) for n in SIZES]
        opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1),
                                       named_parameters=[(f"w{i}", p) for i, p in enumerate(params)],
                                       compression=spec_of(hvd, name, kwargs), bucket_cap_mb=0)
        log = []
        for step in range(STEPS):
            opt.zero_grad()
            for p, g in zip(params, gradients(step, hvd.rank())):
                (p * torch.from_numpy(g)).sum().backward()
            opt.step()
            newest(opt.compression_stats(), log)
        results[key] = record(opt.compression_stats(), log)
    return hvd, results


def make_step(tf, hvd, variables, tape_holder, compression):
    def step_fn(gs):
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(v * g) for v, g in zip(variables, gs)])
        tape = hvd.DistributedGradientTape(tape, compression=compression, bucket_cap_mb=0)
        tape_holder["tape"] = tape
        for v, g in zip(variables, tape.gradient(loss, variables)):
            v.assign_sub(0.1 * g)
    return step_fn


def run_tf():
    import tensorflow as tf
    import horovod_ext.tensorflow as hvd
    hvd.init()
    tf.random.set_seed(SEED)
    results = {}
    for mode in ("eager", "graph"):
        for key, (name, kwargs) in CONFIGS.items():
            variables = [tf.Variable(tf.zeros([n]), name=f"w{i}") for i, n in enumerate(SIZES)]
            tape_holder = {}
            step_fn = make_step(tf, hvd, variables, tape_holder, spec_of(hvd, name, kwargs))
            fn = tf.function(step_fn) if mode == "graph" else step_fn
            log = []
            for step in range(STEPS):
                fn([tf.constant(g) for g in gradients(step, hvd.rank())])
                newest(tape_holder["tape"].compression_stats(), log)
            results[f"{mode}/{key}"] = record(tape_holder["tape"].compression_stats(), log)
            # a fresh aggregator for the next config: DistributedGradientTape shares one per (compression, op, ...)
            from horovod_ext.tensorflow import gradient_tape
            gradient_tape._aggregators.clear()
    return hvd, results


hvd, results = run_torch() if FRAMEWORK == "torch" else run_tf()
write_result(hvd.rank(), {"rank": hvd.rank(), "size": hvd.size(), "results": results})
