"""DiLoCo's NumPy reference (python/hvdext_reference/diloco.py): its outer step against PyTorch's own SGD with
Nesterov momentum, its limits (model averaging, one worker), error feedback's conservation, and a small run."""
import numpy as np
import pytest
import torch

from hvdext_reference import diloco, topk


def test_the_outer_step_is_pytorchs_nesterov_sgd_on_the_pseudo_gradient():
    """theta and b after three rounds equal torch.optim.SGD(lr, momentum, nesterov=True) fed the same averaged
    pseudo-gradients as .grad (PyTorch may fuse a multiply-add: equal to float32 rounding, not bit for bit)."""
    rng = np.random.default_rng(0)
    theta = rng.standard_normal(1000).astype(np.float32)
    param = torch.nn.Parameter(torch.from_numpy(theta.copy()))
    sgd = torch.optim.SGD([param], lr=0.7, momentum=0.9, nesterov=True)
    b = None
    for _ in range(3):
        delta = rng.standard_normal(1000).astype(np.float32) * np.float32(0.01)
        theta, b = diloco.outer_step(theta, b, delta, lr=0.7, mu=0.9)
        param.grad = torch.from_numpy(delta.copy())
        sgd.step()
        np.testing.assert_allclose(theta, param.detach().numpy(), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(b, sgd.state[param]["momentum_buffer"].numpy(), rtol=1e-6, atol=1e-7)


def test_without_nesterov_the_step_is_the_momentum_buffer():
    theta, b = diloco.outer_step(np.ones(4), None, np.full(4, 0.5), lr=0.5, mu=0.9, nesterov=False)
    np.testing.assert_array_equal(b, np.full(4, 0.5, np.float32))
    np.testing.assert_array_equal(theta, np.full(4, 0.75, np.float32))
    theta, b = diloco.outer_step(theta, b, np.full(4, 0.5), lr=0.5, mu=0.9, nesterov=False)
    np.testing.assert_array_equal(b, np.float32(0.9) * np.full(4, 0.5, np.float32) + np.float32(0.5))


def test_outer_lr_one_without_momentum_is_model_averaging():
    rng = np.random.default_rng(1)
    theta = rng.standard_normal(257).astype(np.float32)
    locals_ = [theta + rng.standard_normal(257).astype(np.float32) for _ in range(4)]
    new, b, residuals = diloco.outer_round(theta, None, locals_, lr=1.0, mu=0.0)
    np.testing.assert_allclose(new, np.mean(locals_, axis=0), rtol=1e-5, atol=1e-6)
    assert all(not r.any() for r in residuals)  # uncompressed: nothing kept back


def test_the_pseudo_gradient_points_from_the_worker_to_the_outer_parameters():
    """One worker, one plain SGD inner step, eta = 1, mu = 0: the round is that SGD step (the sign is right)."""
    theta = np.array([1.0, -2.0, 3.0], dtype=np.float32)
    grad = np.array([0.5, 0.25, -1.0], dtype=np.float32)
    local = theta - np.float32(0.1) * grad
    np.testing.assert_array_equal(diloco.pseudo_gradient(theta, local), theta - local)
    new, _, _ = diloco.outer_round(theta, None, [local], lr=1.0, mu=0.0)
    np.testing.assert_allclose(new, local, rtol=0, atol=1e-7)


def top_1_percent(x, m):
    """What top-k at 1% sends (fp32 values: sent + residual == x exactly)."""
    idx = topk.select(x, topk.k_of(x.size, 100))
    sent = np.zeros_like(x)
    sent[idx] = x[idx]
    return sent


def test_error_feedback_delays_what_the_codec_drops_and_loses_nothing():
    """Over rounds, each worker's sent values plus its residual equal its pseudo-gradients' sum (top-k in fp32:
    exactly, per element); the averaged Delta is the mean of what was sent."""
    rng = np.random.default_rng(2)
    deltas = [[rng.standard_normal(1000).astype(np.float32) for _ in range(3)] for _ in range(5)]  # [round][worker]
    residuals = [np.zeros(1000, np.float32)] * 3
    sent_total = [np.zeros(1000, np.float64) for _ in range(3)]
    delta_total = [np.zeros(1000, np.float64) for _ in range(3)]
    for round_deltas in deltas:
        before = residuals
        mean, residuals = diloco.compressed_mean(round_deltas, residuals, top_1_percent)
        sent = [d + r - e for d, r, e in zip(round_deltas, before, residuals)]
        assert all(np.count_nonzero(s) == 10 for s in sent)
        np.testing.assert_array_equal(mean, diloco.mean_of_sent([top_1_percent(d + r, m) for m, (d, r)
                                                                  in enumerate(zip(round_deltas, before))]))
        for m in range(3):
            sent_total[m] += sent[m]
            delta_total[m] += round_deltas[m]
    for m in range(3):
        np.testing.assert_allclose(sent_total[m] + residuals[m], delta_total[m], rtol=1e-5, atol=1e-5)


def top_half(x, m):
    """What top-k at 50% sends (fp32 values)."""
    idx = topk.select(x, topk.k_of(x.size, 2))
    sent = np.zeros_like(x)
    sent[idx] = x[idx]
    return sent


@pytest.mark.parametrize("sent_of, mu, within", [(None, 0.9, 0.05), (top_half, 0.0, 0.15)],
                         ids=["fp32-nesterov", "topk-50%-no-momentum"])
def test_a_run_on_a_quadratic_approaches_the_workers_common_optimum(sent_of, mu, within):
    """Worker m minimizes 0.5 |x - c_m|^2 with plain SGD (lr 0.05) for H = 10 steps a round; after 30 rounds
    DiLoCo's theta is near the mean of the c_m (the optimum of the average loss). With compressed pseudo-gradients
    the workers' differing targets leave a floor: each worker's residual keeps growing between the rounds that send
    it, and with momentum 0.9 at 1% the run diverges on this problem (heterogeneous workers; SparseLoCo drops the
    outer momentum for that reason), so the compressed case is checked at 50% without momentum."""
    rng = np.random.default_rng(3)
    targets = [rng.standard_normal(200).astype(np.float32) for _ in range(4)]
    optimum = np.mean(targets, axis=0)
    theta0 = np.zeros(200, np.float32)

    def inner_update(x, m, step):
        return x - np.float32(0.05) * (x - targets[m])

    theta, b, residuals, history = diloco.train(theta0, inner_update, 4, rounds=30, inner_steps=10, sent_of=sent_of,
                                                mu=mu)
    assert np.linalg.norm(theta - optimum) < within * np.linalg.norm(theta0 - optimum)
    assert len(history) == 30 and all(len(h) == 4 for h in history)
    assert all(not r.any() for r in residuals) == (sent_of is None)


def quadratic(workers=4, n=200, seed=3):
    rng = np.random.default_rng(seed)
    targets = [rng.standard_normal(n).astype(np.float32) for _ in range(workers)]
    return targets, (lambda x, m, step: x - np.float32(0.05) * (x - targets[m]))


def test_one_fragment_without_overlap_is_diloco_to_the_bit():
    targets, inner_update = quadratic()
    theta, b, _, _ = diloco.train(np.zeros(200, np.float32), inner_update, 4, rounds=5, inner_steps=10)
    s_theta, s_b, _, history = diloco.train_streaming(np.zeros(200, np.float32), inner_update, 4, steps=50,
                                                      inner_steps=10, fragments=[np.arange(200)])
    assert np.array_equal(theta.view(np.uint32), s_theta.view(np.uint32))
    assert np.array_equal(b.view(np.uint32), s_b.view(np.uint32))
    assert [(step, f) for step, f, _ in history] == [(10 * k, 0) for k in range(1, 6)]


def test_the_schedule_syncs_each_fragment_every_h_steps_in_turn_and_applies_tau_steps_later():
    from horovod_ext.consensus.diloco import Schedule
    schedule = Schedule(inner_steps=12, fragments=4, overlap=2)
    starts = {t: schedule.starts(t) for t in range(1, 31) if schedule.starts(t) is not None}
    assert starts == {3: 0, 6: 1, 9: 2, 12: 3, 15: 0, 18: 1, 21: 2, 24: 3, 27: 0, 30: 1}
    assert starts == {t: diloco.fragment_starts(t, 12, 4) for t in starts}
    applies = {t: schedule.applies(t) for t in range(1, 31) if schedule.applies(t) is not None}
    assert applies == {t + 2: f for t, f in starts.items() if t + 2 <= 30}


def test_fragments_are_whole_layers_assigned_strided():
    from horovod_ext.consensus.diloco import fragments_of
    names = ["embed.weight", "blocks.0.w", "blocks.0.b", "blocks.1.w", "blocks.1.b", "blocks.2.w", "head.weight",
             "head.bias"]
    # layers: embed, blocks.0, blocks.1, blocks.2, head -> fragment j mod 2
    assert fragments_of(names, 2) == [[0, 3, 4, 6, 7], [1, 2, 5]]
    assert fragments_of(["dense/kernel", "dense/bias", "dense_1/kernel"], 2) == [[0, 1], [2]]
    assert fragments_of(["weight", "bias"], 1) == [[0, 1]]  # a bare module is one layer
    with pytest.raises(ValueError, match=r"fragments=3 is more than the model's 2 layer\(s\)"):
        fragments_of(["dense/kernel", "dense/bias", "dense_1/kernel"], 3)


def test_merge_alpha_one_leaves_the_workers_their_own_parameters():
    """alpha = 1: the outer parameters move, the workers keep theirs (local SGD beside an outer average);
    alpha = 0.5 lies between: the products are rounded to float32 before the add."""
    targets, inner_update = quadratic(workers=2)
    frags = [np.arange(0, 100), np.arange(100, 200)]
    theta, _, locals_, _ = diloco.train_streaming(np.zeros(200, np.float32), inner_update, 2, steps=40,
                                                  inner_steps=10, fragments=frags, overlap=2, merge_alpha=1.0)
    alone = [np.zeros(200, np.float32) for _ in range(2)]
    for step in range(1, 41):
        alone = [inner_update(x, m, step) for m, x in enumerate(alone)]
    assert all(np.array_equal(a, x) for a, x in zip(alone, locals_))
    assert theta.any()
    local, outer = np.float32([1.0, 3.0]), np.float32([3.0, 1.0])
    np.testing.assert_array_equal(diloco.merge(local, outer, 0.5), np.float32([2.0, 2.0]))
    assert diloco.merge(local, outer, 0.0) is not outer and np.array_equal(diloco.merge(local, outer, 0.0), outer)


def test_streaming_with_overlap_approaches_the_workers_common_optimum():
    """Four fragments, overlap 2 (a fragment's update lands two steps after its pseudo-gradient was taken): on the
    quadratic the run still approaches the optimum as whole-model DiLoCo does."""
    targets, inner_update = quadratic()
    optimum = np.mean(targets, axis=0)
    frags = [np.arange(f, 200, 4) for f in range(4)]
    theta, _, _, history = diloco.train_streaming(np.zeros(200, np.float32), inner_update, 4, steps=300,
                                                  inner_steps=12, fragments=frags, overlap=2)
    assert np.linalg.norm(theta - optimum) < 0.05 * np.linalg.norm(optimum)
    assert [f for _, f, _ in history[:5]] == [0, 1, 2, 3, 0]


def test_the_leader_sends_alone_and_only_its_residual_moves():
    """outer="leader": the worker with the lowest loss (ties to the lowest index) sends x_b = Delta_b + e_b
    through the codec; its residual keeps what was not sent, every other residual stays as it was."""
    rng = np.random.default_rng(4)
    deltas = [rng.standard_normal(1000).astype(np.float32) for _ in range(3)]
    residuals = [rng.standard_normal(1000).astype(np.float32) for _ in range(3)]
    delta, kept = diloco.leader_sent(deltas, residuals, [0.5, 0.25, 0.25], top_1_percent)
    assert diloco.leader_of([0.5, 0.25, 0.25]) == 1
    np.testing.assert_array_equal(delta, top_1_percent(deltas[1] + residuals[1], 1))
    np.testing.assert_array_equal(kept[1], deltas[1] + residuals[1] - delta)
    assert all(np.array_equal(kept[m], residuals[m]) for m in (0, 2))
    dense, _ = diloco.leader_sent(deltas, [np.zeros(1000, np.float32)] * 3, [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(dense, deltas[0])


def test_with_one_worker_the_leader_is_the_average_and_it_follows_the_best_worker():
    """One worker: leader and average are the same run, to the bit. Four workers on the quadratic whose loss is
    0.5 |x - c_m|^2: the outer parameters move toward the progress of the worker nearest its target."""
    targets, inner_update = quadratic(workers=1)
    frags = [np.arange(0, 100), np.arange(100, 200)]
    losses = lambda locals_, step: [float(np.sum((x - c) ** 2)) for x, c in zip(locals_, targets)]  # noqa: E731
    average = diloco.train_streaming(np.zeros(200, np.float32), inner_update, 1, 40, 10, frags, overlap=2)
    leader = diloco.train_streaming(np.zeros(200, np.float32), inner_update, 1, 40, 10, frags, overlap=2,
                                    losses_of=losses)
    assert np.array_equal(average[0], leader[0])
    targets, inner_update = quadratic(workers=4)
    losses = lambda locals_, step: [float(np.sum((x - c) ** 2)) for x, c in zip(locals_, targets)]  # noqa: E731
    theta, _, _, _ = diloco.train_streaming(np.zeros(200, np.float32), inner_update, 4, 120, 12,
                                            [np.arange(200)], losses_of=losses, lr=1.0, mu=0.0)
    assert min(np.linalg.norm(theta - c) for c in targets) < 0.2 * min(np.linalg.norm(c) for c in targets)
