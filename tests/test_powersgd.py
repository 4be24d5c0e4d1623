"""Compression.powersgd (horovod_ext/compressors/powersgd.py): its arguments, its matrix layout against PyTorch's
hook, the normal draw, and for real under horovodrun (tests/workers/powersgd_worker.py): torch and TensorFlow
(eager and tf.function) at 2 and 4 ranks against the NumPy reference, every rank's bits, the bytes against the
performance model's plan, and the applied update against PyTorch's DDP powerSGD_hook."""
import functools

import numpy as np
import pytest

from horovod_ext.compressors.powersgd import PowerSGD, matrix_layout
from horovod_ext.compression.join import JOIN_CHECK_BYTES
from horovod_ext.perfmodel.plans import plan, wire_bytes_per_step
from hvdext_reference import philox
from hvdrun import horovodrun

SHAPES = [(64, 40), (8, 3, 3, 3), (64,), (10, 64), (64, 40), (3, 5)]  # the worker's
TOLERANCE = {"fp32": 1e-5, "fp16": 1e-2}  # max |ours - reference| / max |reference| (summation order; fp16 rounding)


@pytest.mark.parametrize("argument, value, fragment", [
    ("rank", 0, "powersgd rank must be >= 1"), ("start_iter", -1, "powersgd start_iter must be >= 0"),
    ("value_dtype", "int8", "powersgd value_dtype must be one of ('fp32', 'fp16')"),
    ("orthogonalization", "svd", "powersgd orthogonalization must be one of ('gram_schmidt', 'qr')"),
    ("warm_start", 1, "powersgd warm_start must be True or False"),
    ("min_compression_rate", float("nan"), "powersgd min_compression_rate must be a finite number")])
def test_bad_arguments_name_the_argument_and_the_allowed_values(argument, value, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        PowerSGD(**{argument: value})


@pytest.mark.parametrize("shape", [(64, 40), (8, 3, 3, 3), (64,), (10, 64), (3, 5), (512, 1), (1, 512), (7,),
                                   (256, 256, 1, 1), (4, 4)])
@pytest.mark.parametrize("rank, rate", [(1, 2), (4, 2), (2, 0.5), (32, 1)])
def test_layout_is_the_hooks(shape, rank, rate):
    """What the hook compresses (its _should_compress on tensor.view(shape[0], -1)), and at which rank."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress
    n = shape[0]
    m = int(np.prod(shape)) // n
    r = min(n, m, rank)
    layout = matrix_layout(shape, rank, rate)
    assert (layout is not None) == _should_compress(n, m, r, rate)[0]
    if layout is not None:
        assert layout == (n, m, r)


def test_normal_draw_is_standard_and_keyed():
    z = philox.normal(200000, seed=5, step=1, tensor=9)
    assert z.dtype == np.float32 and abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
    assert np.array_equal(z[:10], philox.normal(10, 5, 1, 9))
    assert not np.array_equal(z[:10], philox.normal(10, 5, 2, 9))


def expected_last_step(config, nranks, eager):
    """The plan's bytes of a compressing step (perfmodel), with the join check where it runs (eagerly)."""
    transfers = plan("powersgd", SHAPES, nranks, rank=config["rank"], value_dtype=config.get("value_dtype", "fp32"))
    payload = sum(t.payload for t in transfers) - (0 if eager else JOIN_CHECK_BYTES)
    wire = wire_bytes_per_step(transfers) - (0 if eager else transfers[-1].wire)
    return payload, wire


@functools.lru_cache(maxsize=None)
def launch(framework, nranks):
    results, _ = horovodrun(nranks, "tests/workers/powersgd_worker.py", framework, timeout=240)
    return framework, nranks, results


@pytest.fixture(scope="module", params=[("torch", 2), ("torch", 4), ("tf", 2), ("tf", 4)],
                ids=lambda p: f"{p[0]}-np{p[1]}")
def launched(request):
    return launch(*request.param)


def test_update_equals_the_reference_and_every_rank_applies_the_same_bits(launched):
    framework, nranks, results = launched
    for r in results:
        assert r["size"] == nranks
        for case, got in r["cases"].items():
            tolerance = TOLERANCE[got["config"].get("value_dtype", "fp32")]
            worst = max(max(step) for step in got["error"])
            assert worst <= tolerance, (framework, case, r["rank"], got["error"])
            assert got["identical"], (framework, case)
            # at 2 ranks each element's sum has two terms, so its bits do not depend on its place in the reduced
            # buffer; at 4 ranks a ring's order does: PyTorch's factors are reduced alone, at their place in the
            # step's order (PowerSGDMethod._allreduce_factors), but inside a tf.function Horovod fuses them with
            # whatever runs at the same time, which varies from run to run (one config run twice differs there):
            # there the reference bounds the values
            if nranks == 2 or framework == "torch":
                assert got["batching_same_bits"], (framework, case, "batch_tensors changed the bits")
            assert got["compressing"] is True, (framework, case)


def test_bytes_equal_the_plan(launched):
    framework, nranks, results = launched
    for r in results:
        for case, got in r["cases"].items():
            payload, wire = expected_last_step(got["config"], nranks, eager=not case.endswith("_graph"))
            assert got["last_step"]["payload_bytes"] == payload, (framework, case, got["last_step"])
            assert got["last_step"]["wire_bytes"] == pytest.approx(wire, rel=1e-12), (framework, case)
            assert got["total"]["dense_bytes"] == 5 * 4 * sum(int(np.prod(s)) for s in SHAPES)


def test_applied_update_agrees_with_pytorchs_hook():
    """Same model, data, rank and first Q: parameters after each of 5 steps (2 dense, then 3 compressed, warm
    start and error feedback) agree with DDP + powerSGD_hook (gloo, 2 processes) within float tolerance."""
    _, _, results = launch("torch", 2)
    for r in results:
        hook = r["hook"]
        assert hook["compressed"] == ["0.weight", "2.weight"] and hook["moved"] > 0.1
        for step, differences in enumerate(hook["differences"]):
            assert max(differences.values()) < 1e-5, (step, differences)


def test_a_tiny_gradient_is_projected_not_amplified():
    """A matrix of 1e-25 values (the gradient of a deep net's first layers): |v|^2 underflows float32, so the
    reference's Gram-Schmidt scales each column by a power of two first, and P has orthonormal columns and
    A = P Q^T = P P^T M is a projection of M (|A| <= |M|), where dividing by FLT_MIN gave entries near 1e13."""
    from hvdext_reference.powersgd import orthogonalize

    rng = np.random.default_rng(0)
    m = (rng.standard_normal((64, 32)) * 1e-25).astype(np.float32)
    q = orthogonalize(rng.standard_normal((32, 4)).astype(np.float32))
    p = orthogonalize(m @ q)
    a = p @ (m.T @ p).T
    assert np.allclose(p.T @ p, np.eye(4), atol=1e-5), p.T @ p
    assert np.linalg.norm(a) <= np.linalg.norm(m) * 1.0001, (np.linalg.norm(a), np.linalg.norm(m))
