"""What tests/test_diloco.py (PyTorch) and tests/test_diloco_keras.py (Keras) check alike of DiLoCoOptimizer's
workers' results: the workers' linear regression stepped by SGD on the mean of a group's gradients, uneven data
then hvd.join(), and the bad worker arguments' errors."""
import numpy as np
from diloco_cases import STREAM_ARGUMENTS, STREAM_SAVE, STREAM_STEPS  # noqa: F401 - the tests import them here
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


def check_streaming_argument_errors(cases):
    """The bad streaming arguments' errors (fragments, overlap, merge_alpha), as both frameworks raise them."""
    assert "fragments=2 is more than the model's 1 layer(s)" in cases["fragments more than the layers"]["message"]
    assert "fragments must be an integer >= 1 that divides inner_steps (6)" in \
        cases["fragments not dividing inner_steps"]["message"]
    assert "overlap must be an integer in [0, inner_steps / fragments) = [0, 6)" in \
        cases["overlap not below H / P"]["message"]
    assert "merge_alpha must be a number in [0, 1], got 1.5" in cases["merge_alpha outside [0, 1]"]["message"]
    assert "SettingsMismatch" in cases["overlap on rank 1 only"]["type"]
    assert "outer must be one of 'average', 'leader'" in cases["an unknown outer"]["message"]
    assert "got 'median'" in cases["an unknown outer"]["message"]
    assert "compression must be none, fp16 (or a Horovod Compressor), ternary or topk" in \
        cases["leader with powersgd"]["message"]


def check_worker_argument_errors(cases):
    assert "groups leave rank(s) [1] out" in cases["groups leave rank 1 out"]["message"]
    assert "with groups=None every rank is a worker" in cases["inner_compression without groups"]["message"]
    assert "SettingsMismatch" in cases["inner_compression on rank 0 only"]["type"]
    assert "inner_compression" in cases["inner_compression on rank 0 only"]["message"]


STREAM_H, STREAM_P, STREAM_TAU = (STREAM_ARGUMENTS[k] for k in ("inner_steps", "fragments", "overlap"))


def fragment_indices(run):
    """Each fragment's indices into the flat parameters, from the worker's (offset, numel) ranges."""
    return [np.concatenate([np.arange(o, o + n) for o, n in ranges]) for ranges in run["ranges"]]


def check_streaming(runs, merge_alpha, dense, exact, losses=None, sent_of=None):
    """A streaming run's records (runs: the workers' leaders' records): per step, the parameters before the
    exchange (pre), after the step (post) and the outer parameters (outer). The outer parameters are the same on
    every rank; where a fragment's update is due, post is the reference's merge of pre with the new outer
    fragment (to the bit) and every other value is pre's; dense: the outer step is the reference's (Nesterov on
    the mean of the workers' pseudo-gradients taken tau steps before) to the bit (exact) or within a float32
    rounding of the sum's order. losses (outer="leader"): per worker, its mean training loss at every step; each
    exchange then sends the pseudo-gradient of the worker with the lowest mean since the last exchange, through
    sent_of (a compressor without error feedback, such as fp16's rounding) if given."""
    f32 = np.float32
    last_election = 0
    frags = fragment_indices(runs[0])
    theta, b, started, pending = np.array(runs[0]["start"], f32), None, [False] * STREAM_P, {}
    b = np.zeros_like(theta)
    for t in range(1, STREAM_STEPS + 1):
        pre = [np.array(run["pre"][t - 1], f32) for run in runs]
        outer = np.array(runs[0]["outer"][t - 1], f32)
        for run in runs[1:]:
            assert run["outer"][t - 1] == runs[0]["outer"][t - 1], t
        f = reference.fragment_starts(t, STREAM_H, STREAM_P)
        if f is not None:
            deltas = [reference.pseudo_gradient(theta[frags[f]], x[frags[f]]) for x in pre]
            if losses is None:
                pending[t + STREAM_TAU] = (f, reference.mean_of_sent(deltas))
            else:
                window = [np.mean(worker[last_election:t]) for worker in losses]
                best = reference.leader_of(window)
                pending[t + STREAM_TAU] = (f, reference.leader_sent(deltas, [np.zeros_like(d) for d in deltas],
                                                                    window, sent_of)[0])
                assert best == int(np.argmin(window)), t
                last_election = t
        expected = [x.copy() for x in pre]
        if t in pending:
            f, delta = pending.pop(t)
            idx = frags[f]
            if dense:
                new, b[idx] = reference.outer_step(theta[idx], b[idx] if started[f] else None, delta)
                if exact:
                    assert np.array_equal(new.view(np.uint32), outer[idx].view(np.uint32)), (t, f)
                else:
                    np.testing.assert_allclose(outer[idx], new, rtol=1e-6, atol=1e-6)
            started[f] = True
            theta[idx] = outer[idx]
            for e in expected:
                e[idx] = reference.merge(e[idx], outer[idx], merge_alpha)
        assert np.array_equal(theta.view(np.uint32), outer.view(np.uint32)), t  # only due fragments moved
        for run, e in zip(runs, expected):
            got = np.array(run["post"][t - 1], f32)
            assert np.array_equal(got.view(np.uint32), e.view(np.uint32)), t
    assert not pending or list(pending) == [STREAM_STEPS + STREAM_TAU]  # the last exchange is in flight


LEADER_CASES = ("leader-none", "leader-ternary", "leader-fp16-groups")  # the workers' outer="leader" cases


def check_leader(dense, ternary, grouped):
    """outer="leader" (each argument: every rank's record of one case): at each exchange the worker with the lowest
    mean loss since the last one sends its pseudo-gradient, alone, and every rank's outer step follows it. Dense:
    to the bit against the reference (the leader's values sent as they are); ternary (the leader encodes with its
    error feedback): every rank's outer parameters identical, one elected rank; fp16 with groups: a worker's ranks
    average, the worker with the lowest mean of its ranks' losses steers, its values rounded to fp16 (no error
    feedback), to the bit."""
    check_streaming(dense, 0.0, dense=True, exact=True, losses=[run["losses"] for run in dense])
    check_streaming(ternary, 0.0, dense=False, exact=True)
    assert len({run["elected"] for run in ternary}) == 1
    assert all(run["payload_bytes"] > 0 for run in ternary)  # the elections' 16 bytes at least
    workers = grouped[0]["workers"]
    leaders = [grouped[g[0]] for g in workers]
    means = [list(np.mean([grouped[r]["losses"] for r in g], axis=0)) for g in workers]
    fp16 = lambda x, m: x.astype(np.float16).astype(np.float32)  # noqa: E731
    check_streaming(leaders, 0.0, dense=True, exact=True, losses=means, sent_of=fp16)
    for k, group in enumerate(workers):
        assert all(grouped[rank]["post"] == leaders[k]["post"] for rank in group)
    assert grouped[0]["elected"] in [g[0] for g in workers]


def check_resumed(resumed, original, ring):
    """A resumed run's records against the original's: to the bit, except a dense average of more than two workers
    (ring), whose sum Horovod's ring adds in an order that depends on whether it fused the exchange's tensors into
    one buffer, which timing decides: there within float32 roundings."""
    if not ring:
        assert resumed == original
        return
    assert len(resumed) == len(original)
    for a, b in zip(resumed, original):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-5, atol=1e-6)
