"""Entropy-coded payloads end to end, under horovodrun: argv[1] "torch" or "tf". For each pair of configs that differ
only in their packing, trains the same steps on the same gradients and records the decoded (averaged) gradients'
bits, which tests/test_coding_multiprocess.py compares; then corrupts one rank's payload (an allgathered one, and a
two-phase chunk that only one rank receives) and records the error every rank raised."""
import hashlib
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from hvdrun import write_result  # noqa: E402

FRAMEWORK = sys.argv[1]
SIZES = (6007, 37, 20000)
STEPS = 3
TERNARY = {"seed": 123, "min_size": 1024}
PAIRS = {  # name: (compressor, coded settings, fixed settings)
    "ternary": ("ternary", dict(TERNARY, packing="entropy"), dict(TERNARY, packing="base3")),
    "ternary_shared": ("ternary", dict(TERNARY, packing="entropy", shared_scale=True, transport="allgather"),
                       dict(TERNARY, packing="base3", shared_scale=True, transport="allgather")),
    "ternary_two_phase": ("ternary", dict(TERNARY, packing="entropy", shared_scale=True, transport="two_phase"),
                          dict(TERNARY, packing="base3", shared_scale=True, transport="two_phase")),
    "ternary_ef": ("ternary", dict(TERNARY, packing="entropy", error_feedback=True),
                   dict(TERNARY, packing="base3", error_feedback=True)),
    # the same transport for both packings ("auto" takes sparse_reduce for "delta" from 3 ranks on)
    "topk_fp16": ("topk", {"ratio": 0.02, "packing": "delta", "transport": "allgather"},
                  {"ratio": 0.02, "packing": "int32"}),
    "topk_fp32": ("topk", {"ratio": 0.02, "value_dtype": "fp32", "packing": "delta", "transport": "allgather"},
                  {"ratio": 0.02, "value_dtype": "fp32", "packing": "int32"}),
    "adaptive": ("adaptive_topk", {"min_cf": 2, "max_cf": 40, "epsilon": 0.3, "window": 2, "packing": "delta",
                                   "transport": "allgather"},
                 {"min_cf": 2, "max_cf": 40, "epsilon": 0.3, "window": 2, "packing": "int32"}),
}
if FRAMEWORK == "tf":  # TensorFlow runs each config eagerly and in a tf.function: a smaller set
    PAIRS = {k: PAIRS[k] for k in ("ternary", "ternary_two_phase", "topk_fp16", "adaptive")}


def gradients(step, rank):
    rng = np.random.default_rng(1000 * step + rank)
    return [(rng.standard_t(3, n) * 1e-2).astype(np.float32) for n in SIZES]


def digest(arrays):
    return [hashlib.sha256(np.ascontiguousarray(a, dtype=np.float32).tobytes()).hexdigest() for a in arrays]


def corrupt_one_byte(payload, torch_like):
    data = payload.numpy().copy() if torch_like else payload
    data[len(data) // 2] ^= 0x20
    return data


# --------------------------------------------------------------------------------------------------- torch
def torch_run(hvd, torch, name, kwargs, steps=STEPS):
    params = [torch.nn.Parameter(torch.zeros(n)) for n in SIZES]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1),
                                   named_parameters=[(f"w{i}", p) for i, p in enumerate(params)],
                                   compression=getattr(hvd.Compression, name)(**kwargs))
    seen = []
    for step in range(steps):
        opt.zero_grad()
        for p, g in zip(params, gradients(step, hvd.rank())):
            (p * torch.from_numpy(g)).sum().backward()
        opt.synchronize()
        seen.append(digest([p.grad.numpy() for p in params]))
        with opt.skip_synchronize():
            opt.step()
    return seen


CORRUPTIONS = {  # which: (kernels whose first output rank 1 corrupts, compressor, settings)
    "allgather": (("ternary_encode_entropy",), "ternary", PAIRS["ternary"][1]),
    "two_phase": (("ternary_codes_encode_entropy",), "ternary", PAIRS["ternary_two_phase"][1]),
    # a tensor alone in its bucket is encoded by the per-tensor kernel, a shared bucket's by the bucket's
    "topk_delta": (("topk_extract_coded", "topk_encode_bucket"), "topk", PAIRS["topk_fp16"][1]),
    "topk_int32": (("topk_extract", "topk_encode_bucket"), "topk", PAIRS["topk_fp16"][2]),
}


def corrupt_indices(payload):
    """An int32-packed top-k payload whose first index points past every tensor."""
    data = payload.numpy().copy()
    data.view(np.uint8)[:4] = 0x7F
    return data


def torch_corruption(hvd, torch, which):
    """Rank 1 corrupts one payload: an allgathered ternary one, its phase-1 chunk for rank 0 (two-phase), a
    delta-coded top-k one, or an int32 top-k one's indices."""
    from horovod_ext.torch_common import kernels
    names, compressor, kwargs = CORRUPTIONS[which]
    originals = {name: getattr(kernels.TorchKernels, name) for name in names}
    calls = []

    def corrupt(payload):
        calls.append(1)
        if hvd.rank() == 1 and len(calls) == 1:
            return torch.from_numpy(corrupt_indices(payload) if which == "topk_int32" else
                                    corrupt_one_byte(payload, True))
        return payload

    def corrupting(original):
        def kernel(*args, **kwargs):
            out = original(*args, **kwargs)
            if isinstance(out, list):  # a bucket's payloads
                return [corrupt(payload) for payload in out]
            if isinstance(out, tuple):
                return (corrupt(out[0]), *out[1:])
            return corrupt(out)
        return kernel

    for name, original in originals.items():
        setattr(kernels.TorchKernels, name, staticmethod(corrupting(original)))
    try:
        torch_run(hvd, torch, compressor, dict(kwargs), steps=1)
        return {"type": None, "message": ""}
    except Exception as exc:  # noqa: BLE001 - the test checks the type and the message
        return {"type": type(exc).__name__, "message": str(exc)}
    finally:
        for name, original in originals.items():
            setattr(kernels.TorchKernels, name, staticmethod(original))


def run_torch():
    import torch
    import horovod_ext.torch as hvd
    hvd.init()
    results = {}
    for pair, (name, coded, fixed) in PAIRS.items():
        results[pair] = {"coded": torch_run(hvd, torch, name, coded), "fixed": torch_run(hvd, torch, name, fixed)}
    errors = {which: torch_corruption(hvd, torch, which) for which in CORRUPTIONS}
    # after a corrupted step, the next one trains normally on every rank
    after = torch_run(hvd, torch, "ternary", PAIRS["ternary"][1], steps=1)
    return hvd, {"results": results, "errors": errors, "after": after}


# ------------------------------------------------------------------------------------------------------ tf
def tf_run(hvd, tf, name, kwargs, graph):
    from tf_train import train_tf
    seen, _ = train_tf(hvd, tf, getattr(hvd.Compression, name)(**kwargs), SIZES, gradients, STEPS, graph,
                       lambda grads: digest([g.numpy() for g in grads]))
    return seen


def run_tf():
    import tensorflow as tf
    import horovod_ext.tensorflow as hvd
    hvd.init()
    results = {}
    for graph in (False, True):
        for pair, (name, coded, fixed) in PAIRS.items():
            key = f"{'graph' if graph else 'eager'}/{pair}"
            results[key] = {"coded": tf_run(hvd, tf, name, coded, graph), "fixed": tf_run(hvd, tf, name, fixed, graph)}
    return hvd, {"results": results}


hvd, record = run_torch() if FRAMEWORK == "torch" else run_tf()
write_result(hvd.rank(), {"rank": hvd.rank(), "size": hvd.size(), **record})
