"""What tests/workers/buckets_worker.py (PyTorch) and tf_buckets_worker.py (TensorFlow) share: the model's widths,
the caps, the steps and their data, a digest of the parameters' bits, and a count of the Horovod collectives the
package asks for (every call of the named functions of Horovod's module, wrapped before horovod_ext is imported)."""
import hashlib

import numpy as np

STEPS = 4
CAPS = (0, 0.03, 25)  # one collective per tensor; three buckets; one bucket
WIDTHS = [32, 64, 64, 64, 48, 48, 16, 10]  # seven Linear layers: 14 tensors, the biases below ternary's min_size


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


def batches(rank):
    """STEPS batches of 16 (features, label), this rank's own."""
    rng = np.random.default_rng(500 + rank)
    return [(rng.standard_normal((16, WIDTHS[0])).astype(np.float32), rng.integers(0, 10, 16)) for _ in range(STEPS)]


def digest(arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]
