"""What tests/test_diloco.py (PyTorch) and tests/test_diloco_keras.py (Keras) check alike of DiLoCoOptimizer's
workers' results: the workers' linear regression stepped by SGD on the mean of a group's gradients, uneven data
then hvd.join(), and the bad worker arguments' errors."""
import numpy as np
from diloco_cases import STREAM_ARGUMENTS, STREAM_SAVE, STREAM_STEPS  # noqa: F401 - the tests import them here
from hvdext_reference import diloco as reference

H, ROUNDS, LR = 3, 4, 0.05  # tests/workers/diloco_worker.py's and diloco_keras_worker.py's
SEED = 0  # the draws' seed: rank 0's proposal, the script's seed (torch.manual_seed(0), keras.utils.set_random_seed(0))
TERNARY_MIN_SIZE, TOPK_RATIO = 16, 0.1  # the workers' Compression.ternary(min_size=16) and topk(ratio=0.1)


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


def tensors(params):
    """The record's tensors as flat float32 arrays."""
    return [np.asarray(p, dtype=np.float32).ravel() for p in params]


def plan_mean(name, deltas, residuals, names, step):
    """(Delta per tensor, new residuals) of the workers' compressor `name` (tests/workers' COMPRESSIONS) at
    exchange `step`, from each worker's per-tensor pseudo-gradients and residuals (the reference's plan)."""
    if name == "none":
        return [reference.mean_of_sent([d[j] for d in deltas]) for j in range(len(names))], residuals
    if name == "ternary-ef":
        return reference.ternary_mean(deltas, residuals, names, SEED, step, min_size=TERNARY_MIN_SIZE)
    assert name == "topk-ef", name
    return reference.topk_mean(deltas, residuals, TOPK_RATIO)


def check_outer_step(got, expected, exact, what):
    if exact:
        assert np.array_equal(got.view(np.uint32), expected.view(np.uint32)), (what, np.abs(got - expected).max())
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6, err_msg=str(what))


def check_compressed_outer_steps(runs, name):
    """Compressed pseudo-gradients with error feedback (runs: each rank's record of case `name`, every rank a
    worker): round by round, from the optimizer's own outer parameters and the ranks' parameters after their inner
    steps, the reference's plan (ternary: each rank's draws keyed by (SEED, round, crc32(name), rank), tensors below
    min_size sent dense; top-k: the largest 10% of each tensor in fp16), each rank's residuals carried across
    rounds, and the reference's Nesterov step on the decoded average: to the bit at 2 ranks, within a float32
    rounding at 4 (the dense tensors' sum in Horovod's ring order)."""
    names = runs[0]["names"]
    residuals = [[np.zeros_like(t) for t in tensors(runs[0]["outer"][0])] for _ in runs]
    momentum = None
    for k in range(ROUNDS):
        theta = tensors(runs[0]["outer"][k])
        deltas = [[reference.pseudo_gradient(t, x) for t, x in zip(theta, tensors(run["local"][k]))] for run in runs]
        delta, residuals = plan_mean(name, deltas, residuals, names, k)
        expected, momentum = reference.outer_step(np.concatenate(theta), momentum, np.concatenate(delta))
        check_outer_step(flat(runs[0]["outer"][k + 1]), expected, len(runs) == 2, (name, k))


def check_uneven_then_join(results):
    """Rank r trained ROUNDS - r rounds, then every rank called hvd.join(): each returned the same last rank, the
    rounds every rank took agree, and every round's outer parameters are the reference's replay from the start and
    the ranks' parameters after their inner steps: while every rank trains, the plan's average (Compression.none,
    or ternary with each rank's residuals); once a rank has joined, the exchange goes dense: the ranks still
    training send x = Delta_m + e_m (their residuals then 0), the joined ranks zeros, divided by the job's size
    (Horovod's join). To the bit at 2 ranks, within a float32 rounding at 4."""
    size = len(results)
    for name in ("none", "ternary-ef"):
        joins = [r["join"][name] for r in results]
        assert len({j["last_joined"] for j in joins}) == 1, name
        for rank, j in enumerate(joins):
            assert j["rounds"] == ROUNDS - rank, (name, rank)
            assert j["outer"] == joins[0]["outer"][:ROUNDS - rank], (name, rank)
            assert len(j["local"]) == ROUNDS - rank and j["start"] == joins[0]["start"], (name, rank)
        record = results[0]["runs"][name]
        names = record["names"] if "names" in record else record["eager"]["names"]  # Keras: by mode
        residuals = [[np.zeros_like(t) for t in tensors(joins[0]["start"])] for _ in joins]
        momentum = None
        for k in range(ROUNDS):
            theta = tensors(joins[0]["outer"][k - 1] if k else joins[0]["start"])
            training = [rank for rank in range(size) if k < ROUNDS - rank]
            deltas = [[reference.pseudo_gradient(t, x) for t, x in zip(theta, tensors(joins[rank]["local"][k]))]
                      for rank in training]
            if len(training) == size:
                delta, residuals = plan_mean(name, deltas, residuals, names, k)
            else:
                delta = [reference.joined_mean([d[j] + residuals[rank][j] for rank, d in zip(training, deltas)],
                                               size) for j in range(len(theta))]
                residuals = [[np.zeros_like(e) for e in r] for r in residuals]
            expected, momentum = reference.outer_step(np.concatenate(theta), momentum, np.concatenate(delta))
            check_outer_step(flat(joins[0]["outer"][k]), expected, size == 2, (name, k, training))


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


def fragment_tensors(run, f):
    """Fragment f's tensors: [(name, indices into the flat parameters)], from the worker's names and ranges."""
    return [(name, np.arange(o, o + n)) for name, (o, n) in zip(run["fragments"][f], run["ranges"][f])]


def check_streaming(runs, merge_alpha, dense, exact, losses=None, sent_of=None, ternary=False):
    """A streaming run's records (runs: the workers' leaders' records): per step, the parameters before the
    exchange (pre), after the step (post) and the outer parameters (outer). The outer parameters are the same on
    every rank; where a fragment's update is due, post is the reference's merge of pre with the new outer
    fragment (to the bit) and every other value is pre's; dense: the outer step is the reference's (Nesterov on
    the mean of the workers' pseudo-gradients taken tau steps before) to the bit (exact) or within a float32
    rounding of the sum's order. ternary (Compression.ternary with error feedback, TERNARY_MIN_SIZE): the
    pseudo-gradients go through the reference's ternary plan tensor by tensor, each fragment with its own exchange
    counter (the draws' step) and each worker's residuals, and the outer step is checked as dense's. losses
    (outer="leader"): per worker, its mean training loss at every step; each exchange then sends the
    pseudo-gradient of the worker with the lowest mean since the last exchange (the rank every rank reports as
    elected after that step), through sent_of (a compressor without error feedback, such as fp16's rounding) if
    given, or with ternary through the codec with the elected worker's residual, every tensor (the others'
    residuals unchanged). Returns the payload bytes each worker sent as the elected one (ternary: 8 per tensor,
    then each tensor's "entropy" payload) and the number of exchanges started."""
    f32 = np.float32
    last_election = 0
    frags = fragment_indices(runs[0])
    theta, b, started, pending = np.array(runs[0]["start"], f32), None, [False] * STREAM_P, {}
    b = np.zeros_like(theta)
    rounds_of = [0] * STREAM_P  # each fragment's exchange counter: the ternary draws' step
    residuals = [[np.zeros(len(idx), f32) for _, idx in fragment_tensors(runs[0], f)] for f in range(STREAM_P)]
    residuals = [[[r.copy() for r in fr] for fr in residuals] for _ in runs]  # [worker][fragment][tensor]
    sent_bytes, launched = [0] * len(runs), 0
    for t in range(1, STREAM_STEPS + 1):
        pre = [np.array(run["pre"][t - 1], f32) for run in runs]
        outer = np.array(runs[0]["outer"][t - 1], f32)
        for run in runs[1:]:
            assert run["outer"][t - 1] == runs[0]["outer"][t - 1], t
        f = reference.fragment_starts(t, STREAM_H, STREAM_P)
        if f is not None:
            launched += 1
            tensors = fragment_tensors(runs[0], f)
            deltas = [reference.pseudo_gradient(theta[frags[f]], x[frags[f]]) for x in pre]
            per_tensor = [[reference.pseudo_gradient(theta[idx], x[idx]) for _, idx in tensors] for x in pre]
            names = [name for name, _ in tensors]
            if losses is None and ternary:
                mean, kept = reference.ternary_mean(per_tensor, [r[f] for r in residuals], names, SEED, rounds_of[f],
                                                    min_size=TERNARY_MIN_SIZE)
                for m, k in enumerate(kept):
                    residuals[m][f] = k
                pending[t + STREAM_TAU] = (f, np.concatenate(mean))
            elif losses is None:
                pending[t + STREAM_TAU] = (f, reference.mean_of_sent(deltas))
            else:
                window = [np.mean(worker[last_election:t]) for worker in losses]
                best = reference.leader_of(window)
                assert best == int(np.argmin(window)), t
                for run in runs:  # every rank reports the same elected rank, the best worker's leader
                    assert run["elected_at"][t - 1] == runs[best]["rank"], (t, run["elected_at"][t - 1], best)
                if ternary:
                    sent = []
                    for j, name in enumerate(names):
                        x = per_tensor[best][j] + residuals[best][f][j]
                        values, nbytes = reference.ternary_sent(x, SEED, rounds_of[f], name, runs[best]["rank"])
                        residuals[best][f][j] = x - values
                        sent.append(values)
                        sent_bytes[best] += 8 + nbytes
                    pending[t + STREAM_TAU] = (f, np.concatenate(sent))
                else:
                    pending[t + STREAM_TAU] = (f, reference.leader_sent(
                        deltas, [np.zeros_like(d) for d in deltas], window, sent_of)[0])
                last_election = t
            rounds_of[f] += 1
        expected = [x.copy() for x in pre]
        if t in pending:
            f, delta = pending.pop(t)
            idx = frags[f]
            if dense or ternary:
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
    return sent_bytes, launched


def check_joined_streaming(joins, layout, leader):
    """Streaming with uneven data then hvd.join() (joins: every rank's record; layout: a record of the same model
    with its fragments' names and ranges): rank r took len(pre) = STREAM_STEPS - 2 r steps, and its outer
    parameters after join are the reference's replay of every exchange it started (join applies the one in flight).
    While every rank trains, an exchange is the ternary plan's (average: ternary_mean with each rank's residuals;
    leader: the elected rank's payload with its residual, as check_streaming). Once a rank has joined it goes
    dense: the average sums the training ranks' x = Delta_m + e_m (their residuals then 0) with the joined ranks'
    zeros and divides by the job's size; the leader, elected among the ranks still training by the same rule (every
    rank reporting its rank), sends its pseudo-gradient as float32 values, summed with the others' zeros. To the bit
    at 2 ranks, within float32 roundings at 4 (Horovod's ring)."""
    f32, size = np.float32, len(joins)
    steps = [len(j["pre"]) for j in joins]
    assert steps == [STREAM_STEPS - 2 * rank for rank in range(size)], steps
    frags = fragment_indices(layout)
    theta, b = np.array(joins[0]["start"], f32), np.zeros(len(joins[0]["start"]), f32)
    started, pending, rounds_of, last_election = [False] * STREAM_P, {}, [0] * STREAM_P, 0
    residuals = [[[np.zeros(len(idx), f32) for _, idx in fragment_tensors(layout, f)] for f in range(STREAM_P)]
                 for _ in joins]

    def applied(theta, b, f, delta):
        idx, theta, b = frags[f], theta.copy(), b.copy()
        theta[idx], b[idx] = reference.outer_step(theta[idx], b[idx] if started[f] else None, delta)
        return theta, b

    for t in range(1, STREAM_STEPS + 1):
        training = [rank for rank in range(size) if t <= steps[rank]]
        f = reference.fragment_starts(t, STREAM_H, STREAM_P)
        if f is not None:
            tensors = fragment_tensors(layout, f)
            names = [name for name, _ in tensors]
            per_tensor = {rank: [reference.pseudo_gradient(theta[idx], np.array(joins[rank]["pre"][t - 1], f32)[idx])
                                 for _, idx in tensors] for rank in training}
            if leader:
                window = {rank: np.mean(joins[rank]["losses"][last_election:t]) for rank in training}
                best = min(training, key=lambda rank: (window[rank], rank))
                last_election = t
                for rank in training:
                    assert joins[rank]["elected_at"][t - 1] == best, (t, rank, joins[rank]["elected_at"][t - 1], best)
                if len(training) == size:
                    sent = []
                    for j, name in enumerate(names):
                        x = per_tensor[best][j] + residuals[best][f][j]
                        values, _ = reference.ternary_sent(x, SEED, rounds_of[f], name, best)
                        residuals[best][f][j] = x - values
                        sent.append(values)
                    delta = np.concatenate(sent)
                else:
                    delta = np.concatenate(per_tensor[best])
            elif len(training) == size:
                mean, kept = reference.ternary_mean([per_tensor[rank] for rank in training],
                                                    [residuals[rank][f] for rank in training], names, SEED,
                                                    rounds_of[f], min_size=TERNARY_MIN_SIZE)
                for rank, k in zip(training, kept):
                    residuals[rank][f] = k
                delta = np.concatenate(mean)
            else:
                delta = reference.joined_mean([np.concatenate([d + e for d, e in zip(per_tensor[rank],
                                                                                     residuals[rank][f])])
                                               for rank in training], size)
                for rank in training:
                    residuals[rank][f] = [np.zeros_like(e) for e in residuals[rank][f]]
            rounds_of[f] += 1
            pending[t + STREAM_TAU] = (f, delta)
        if t in pending:
            f, delta = pending.pop(t)
            theta, b = applied(theta, b, f, delta)
            started[f] = True
        for rank in range(size):
            if steps[rank] == t:  # join applies the exchange in flight
                expected = theta
                for f, delta in pending.values():
                    expected, _ = applied(theta, b, f, delta)
                got = np.array(joins[rank]["outer"], f32)
                check_outer_step(got, expected, size == 2, ("joined", rank, t))


LEADER_CASES = ("leader-none", "leader-ternary", "leader-fp16-groups")  # the workers' outer="leader" cases


def check_leader(dense, ternary, grouped, join_check=4):
    """outer="leader" (each argument: every rank's record of one case): at each exchange the worker with the lowest
    mean loss since the last one sends its pseudo-gradient, alone, and every rank's outer step follows it, every rank
    reporting that worker's rank as elected. Dense: to the bit against the reference (the leader's values sent as
    they are). Ternary: the elected rank encodes every tensor of the fragment with its own residual (the draws keyed
    by its rank and the fragment's exchange counter), and every rank's outer step is the reference's on what that
    payload stands for, to the bit; each rank counted, per exchange, the election's table (24 bytes a rank, one
    allreduce), the plan's join check (4 bytes), and where it was elected the buffer it sent (an 8-byte length per
    tensor, then the payloads; join_check: the join check's bytes counted per exchange), and rank 0 the start's
    broadcast of its parameters.
    fp16 with groups: a worker's ranks average, the worker with the lowest mean of its
    ranks' losses steers, its values rounded to fp16 (no error feedback), to the bit."""
    check_streaming(dense, 0.0, dense=True, exact=True, losses=[run["losses"] for run in dense])
    size = len(ternary)
    sent_bytes, launched = check_streaming(ternary, 0.0, dense=False, exact=True,
                                           losses=[run["losses"] for run in ternary], ternary=True)
    assert len({run["elected"] for run in ternary}) == 1
    assert launched == STREAM_STEPS // (STREAM_H // STREAM_P)
    start = 4 * sum(np.asarray(p).size for p in ternary[0]["start"])  # rank 0's parameters, broadcast at start
    for rank, run in enumerate(ternary):
        assert run["payload_bytes"] == launched * (24 * size + join_check) + sent_bytes[rank] + \
            (start if rank == 0 else 0), (rank, run["payload_bytes"])
    workers = grouped[0]["workers"]
    leaders = [grouped[g[0]] for g in workers]
    means = [list(np.mean([grouped[r]["losses"] for r in g], axis=0)) for g in workers]
    fp16 = lambda x, m: x.astype(np.float16).astype(np.float32)  # noqa: E731
    check_streaming(leaders, 0.0, dense=True, exact=True, losses=means, sent_of=fp16)
    for k, group in enumerate(workers):
        assert all(grouped[rank]["post"] == leaders[k]["post"] for rank in group)
        assert all(grouped[rank]["elected_at"] == leaders[0]["elected_at"] for rank in group)
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
