"""A compressor defined only in a test file (tests/randomk.py: random-k with a shared seed, NumPy kernels) runs end to
end in both frameworks under horovodrun -np 2, without touching any file of the package: the averaged gradients
every rank applies equal a NumPy reference of the same algorithm (error feedback included) bit for bit."""
import numpy as np
import pytest

from hvdrun import horovodrun
from randomk import chosen, kept
from horovod_ext.compression.join import JOIN_CHECK_BYTES
from horovod_ext.compression.wire import tensor_key

SIZES = (5003, 37, 2048)
STEPS, NRANKS, RATIO, SEED = 4, 2, 0.05, 11


def gradients(step, rank):
    rng = np.random.default_rng(1000 * step + rank)
    return [rng.standard_normal(n).astype(np.float32) for n in SIZES]


def reference():
    """Per step, the averaged gradients: each rank sends g_ef = g + r at the shared indices and keeps the rest."""
    residuals = [[np.zeros(n, np.float32) for n in SIZES] for _ in range(NRANKS)]
    steps = []
    for step in range(STEPS):
        averaged = []
        for t, n in enumerate(SIZES):
            idx = chosen(n, kept(n, RATIO), SEED, step, tensor_key(f"w{t}"))
            out = np.zeros(n, np.float32)
            for rank in range(NRANKS):
                g_ef = gradients(step, rank)[t] + residuals[rank][t]
                out[idx] += g_ef[idx]
                g_ef[idx] = 0.0
                residuals[rank][t] = g_ef
            averaged.append(out / np.float32(NRANKS))
        steps.append(averaged)
    return steps


@pytest.mark.parametrize("framework", ["torch", "tf", "tf_graph"])
def test_randomk_defined_in_a_test_runs_end_to_end(framework):
    results, _ = horovodrun(2, "tests/workers/randomk_worker.py", framework, timeout=300)
    want = reference()
    join_check = framework != "tf_graph"
    # the three payloads share one bucket (compression/buckets.py), whose allgather carries their int32 sizes
    per_step = sum(4 * kept(n, RATIO) for n in SIZES) + 4 * len(SIZES) + (JOIN_CHECK_BYTES if join_check else 0)
    for r in results:
        assert r["steps"] == STEPS
        for step in range(STEPS):
            for t in range(len(SIZES)):
                np.testing.assert_array_equal(np.asarray(r["applied"][step][t], np.float32), want[step][t],
                                              err_msg=f"{framework} rank {r['rank']} step {step} tensor {t}")
        assert r["payload_bytes"] == STEPS * per_step
