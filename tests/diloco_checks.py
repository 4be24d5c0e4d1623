"""What tests/test_diloco.py (PyTorch) and tests/test_diloco_keras.py (Keras) check alike of DiLoCoOptimizer's
workers' results: the workers' linear regression stepped by SGD on the mean of a group's gradients, uneven data
then hvd.join(), and the bad worker arguments' errors."""
import numpy as np
from hvdext_reference import diloco as reference

H, ROUNDS, LR = 3, 4, 0.05  # tests/workers/diloco_worker.py's and diloco_keras_worker.py's


def flat(params):
    return np.concatenate([np.asarray(p, dtype=np.float32).ravel() for p in params])


def group_sgd(theta, data, kernel_in_out=False, lr=LR, steps=H):
    """SGD (float64) on the mean of the group's ranks' MSE losses of a Linear(8, 4) with flat parameters theta
    (its weight (4, 8) as torch holds it, or (8, 4) as Keras's kernel), from theta: what averaging the ranks'
    gradients steps."""
    w = theta[:32].reshape(8, 4).T if kernel_in_out else theta[:32].reshape(4, 8)
    w, b = w.astype(np.float64), theta[32:].astype(np.float64)
    for _ in range(steps):
        gw, gb = np.zeros_like(w), np.zeros_like(b)
        for x, y in data:
            x, y = np.asarray(x), np.asarray(y)
            err = 2 * (x @ w.T + b - y) / y.size
            gw += err.T @ x / len(data)
            gb += err.sum(0) / len(data)
        w, b = w - lr * gw, b - lr * gb
    return np.concatenate([(w.T if kernel_in_out else w).ravel(), b])


def check_outer_steps_against_reference(runs):
    """Dense pseudo-gradients, every rank a worker (runs: each rank's record): the reference's Nesterov step on
    the mean of what the ranks held after their inner steps, each round from the optimizer's own outer parameters;
    to the bit at 2 ranks (a + b, halved), within a float32 rounding of the sum's order at 4 (Horovod's ring)."""
    theta, momentum = flat(runs[0]["outer"][0]), None
    for k in range(ROUNDS):
        theta, momentum, _ = reference.outer_round(theta, momentum, [flat(run["local"][k]) for run in runs])
        got = flat(runs[0]["outer"][k + 1])
        if len(runs) == 2:
            assert np.array_equal(got.view(np.uint32), theta.view(np.uint32)), k
        else:
            np.testing.assert_allclose(got, theta, rtol=1e-6, atol=1e-6)
        theta = got


def check_uneven_then_join(results):
    """Rank r trained ROUNDS - r rounds, then every rank called hvd.join(): each returned the same last rank, the
    rounds every rank took agree, and the ranks that went on kept moving their outer parameters."""
    size = len(results)
    for name in ("none", "ternary-ef"):
        joins = [r["join"][name] for r in results]
        assert len({j["last_joined"] for j in joins}) == 1, name
        for rank, j in enumerate(joins):
            assert j["rounds"] == ROUNDS - rank, (name, rank)
            assert j["outer"] == joins[0]["outer"][:ROUNDS - rank], (name, rank)
        last = flat(joins[0]["outer"][-1])
        assert np.all(np.isfinite(last)) and not np.array_equal(last, flat(joins[0]["outer"][ROUNDS - size])), name


def check_worker_argument_errors(cases):
    assert "groups leave rank(s) [1] out" in cases["groups leave rank 1 out"]["message"]
    assert "with groups=None every rank is a worker" in cases["inner_compression without groups"]["message"]
    assert "SettingsMismatch" in cases["inner_compression on rank 0 only"]["type"]
    assert "inner_compression" in cases["inner_compression on rank 0 only"]["message"]
