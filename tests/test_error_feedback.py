"""Error feedback as a wrapper around any codec (horovod_ext.compression.plan.ErrorFeedback), in one process (Horovod
of size 1, where the applied gradient is exactly what this rank sent): ternary(error_feedback=True) and top-k keep
sent + new residual = gradient + old residual, and ternary's residual comes back from a checkpoint."""
import numpy as np
import pytest
import torch

import horovod_ext.torch as hvd
from hvdext_reference import terngrad as ref
from horovod_ext.compression.wire import tensor_key

SIZES = (5003, 2048)


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvd.init()
    yield


def gradients(step):
    rng = np.random.default_rng(step)
    return [(rng.standard_t(3, n) * 10.0 ** rng.integers(-4, 1, n)).astype(np.float32) for n in SIZES]


def run(compression, steps=4):
    """Per step: the gradient, the residual before, what was applied (= sent at size 1), the residual after."""
    params = [torch.nn.Parameter(torch.zeros(n)) for n in SIZES]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), compression=compression,
                                   named_parameters=[(f"w{i}", p) for i, p in enumerate(params)])
    records = []
    for step in range(steps):
        before = {k: v.numpy().copy() for k, v in opt.state_dict()["horovod_ext"]["residuals"].items()}
        opt.zero_grad()
        grads = gradients(step)
        for p, g in zip(params, grads):
            p.grad = torch.from_numpy(g.copy())
        opt.synchronize()
        sent = [p.grad.numpy().copy() for p in params]
        with opt.skip_synchronize():
            opt.step()
        after = {k: v.numpy().copy() for k, v in opt.state_dict()["horovod_ext"]["residuals"].items()}
        records.append((grads, before, sent, after))
    return opt, records


def exact_sum(a, b):
    """a + b in exact (float64 holds any sum of two float32 within 29 binades; these are) arithmetic."""
    return a.astype(np.float64) + b.astype(np.float64)


@pytest.mark.parametrize("shared", [False, True], ids=["own_scale", "shared_scale"])
def test_ternary_error_feedback_conserves_mass(shared):
    _, records = run(hvd.Compression.ternary(error_feedback=True, shared_scale=shared, min_size=0, seed=9))
    for step, (grads, before, sent, after) in enumerate(records):
        for t, g in enumerate(grads):
            name = f"w{t}"
            old = before.get(name, np.zeros_like(g))
            g_ef = g + old  # float32, as the ef_accumulate kernel adds
            r = after[name]
            # the residual is, bit for bit, g_ef minus what was sent
            np.testing.assert_array_equal(r, g_ef - sent[t], err_msg=f"step {step} {name}")
            # where nothing was sent, or g_ef and s * t are within a factor of two (Sterbenz), the float32
            # difference is exact: sent + new residual == gradient + old residual, exactly
            unsent = sent[t] == 0
            sterbenz = (sent[t] != 0) & (np.abs(g_ef) >= np.abs(sent[t]) / 2) & (np.abs(g_ef) <= 2 * np.abs(sent[t]))
            exact = unsent | sterbenz
            np.testing.assert_array_equal(exact_sum(sent[t], r)[exact], g_ef[exact].astype(np.float64))
            # elsewhere the one rounding of r to float32 is all that moves: within half a unit in its last place
            gap = np.abs(exact_sum(sent[t], r) - g_ef.astype(np.float64))[~exact]
            assert np.all(gap <= np.spacing(np.abs(r[~exact])).astype(np.float64) / 2), (step, name)
            assert unsent.mean() > 0.5  # ternary sends few elements: the exact case is the common one
            # and the payload is TernGrad's, of g_ef (the error-compensated gradient)
            if not shared:
                payload = ref.encode(g_ef, seed=9, step=step, tensor=tensor_key(name), rank=0)
                np.testing.assert_array_equal(sent[t], ref.decode_average([payload], g.size, "base3", 1))


def test_ternary_without_error_feedback_keeps_no_residual():
    _, records = run(hvd.Compression.ternary(min_size=0, seed=9), steps=2)
    assert all(after == {} for *_, after in records)


def test_topk_error_feedback_conserves_mass_exactly():
    """Top-k's remainder comes from its own kernel: sent + r == g_ef exactly, everywhere."""
    _, records = run(hvd.Compression.topk(ratio=0.01))
    for grads, before, sent, after in records:
        for t, g in enumerate(grads):
            g_ef = g + before.get(f"w{t}", np.zeros_like(g))
            np.testing.assert_array_equal(exact_sum(sent[t], after[f"w{t}"]), g_ef.astype(np.float64))


def test_ternary_residuals_resume_bit_identically():
    compression = hvd.Compression.ternary(error_feedback=True, min_size=0, seed=4)
    _, full = run(compression, steps=4)
    opt_half, _ = run(compression, steps=2)
    state = opt_half.state_dict()
    params = [torch.nn.Parameter(torch.zeros(n)) for n in SIZES]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), compression=compression,
                                   named_parameters=[(f"w{i}", p) for i, p in enumerate(params)])
    opt.load_state_dict(state)
    for step in (2, 3):
        opt.zero_grad()
        for p, g in zip(params, gradients(step)):
            p.grad = torch.from_numpy(g.copy())
        opt.synchronize()
        for t, p in enumerate(params):
            np.testing.assert_array_equal(p.grad.numpy(), full[step][2][t])
        with opt.skip_synchronize():
            opt.step()
