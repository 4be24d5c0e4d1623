"""What tests/workers/buckets_worker.py (PyTorch) and tf_buckets_worker.py (TensorFlow) share: the model's widths,
the caps, the steps and their data, a digest of the parameters' bits, and a count of the Horovod collectives the
package asks for (every call of the named functions of Horovod's module, wrapped before horovod_ext is imported)."""
import functools
import hashlib

import numpy as np

from hvdrun import horovodrun

STEPS = 4
CAPS = (0, 0.03, 25)  # one collective per tensor; three buckets; one bucket
WIDTHS = [32, 64, 64, 64, 48, 48, 16, 10]  # seven Linear layers: 14 tensors, the biases below ternary's min_size


def specs(C):
    """Every method the bucket tests run, from a framework's hvd.Compression (TensorFlow runs TF_METHODS)."""
    return {
        "ternary": C.ternary(seed=7),
        "ternary-ef-2bit": C.ternary(seed=7, error_feedback=True, packing="2bit", min_size=0),
        "ternary-shared": C.ternary(seed=7, shared_scale=True, transport="allgather", min_size=0),
        "ternary-two_phase": C.ternary(seed=7, shared_scale=True, transport="two_phase", min_size=0),
        "topk": C.topk(ratio=0.05),
        "topk-int32": C.topk(ratio=0.05, packing="int32", value_dtype="fp32"),
        "topk-sparse_reduce": C.topk(ratio=0.05, transport="sparse_reduce"),
        "adaptive_topk": C.adaptive_topk(window=2, omega=0.0, epsilon=0.3),
        "powersgd": C.powersgd(rank=2, start_iter=1, seed=5),
        "auto": C.auto(candidates=["ternary"]),  # ternary or dense per tensor, by measured times
    }


TF_METHODS = ("ternary", "ternary-ef-2bit", "ternary-shared", "topk", "adaptive_topk", "powersgd")


class CollectiveCount:
    """The calls of `names` in Horovod's `module` since it was made."""

    def __init__(self, module, names):
        self.calls = 0
        for name in names:
            setattr(module, name, self._counted(getattr(module, name)))

    def _counted(self, fn):
        def counted(*args, **kwargs):
            self.calls += 1
            return fn(*args, **kwargs)
        return counted


def torch_model():
    """The seven-layer Tanh MLP of WIDTHS, from seed 0 (PyTorch's workers: Horovod's and DDP's)."""
    import torch

    torch.manual_seed(0)
    layers = []
    for a, b in zip(WIDTHS, WIDTHS[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1])


def batches(rank):
    """STEPS batches of 16 (features, label), this rank's own."""
    rng = np.random.default_rng(500 + rank)
    return [(rng.standard_normal((16, WIDTHS[0])).astype(np.float32), rng.integers(0, 10, 16)) for _ in range(STEPS)]


def digest(arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def horovod_path_runs(nranks):
    """Each rank's result of tests/workers/buckets_worker.py under horovodrun (one launch per rank count, shared by
    tests/test_buckets.py and tests/test_ddp.py)."""
    hosts = "localhost:2,127.0.0.1:2" if nranks == 4 else None
    results, _ = horovodrun(nranks, "tests/workers/buckets_worker.py", timeout=600, hosts=hosts)
    return results
