"""horovod_ext.torch in one process (Horovod of size 1): dtypes, gradient accumulation, checkpoints, stats and
misuse errors. Multi-rank behaviour is in test_torch_multiprocess.py."""
import json
import time
import types
import warnings

import numpy as np
import pytest
import torch

import horovod.torch as horovod_torch
import horovod_ext.torch as hvd
from horovod_ext.compressors.auto.choice import HELD_WINDOWS
from horovod_ext.compressors.auto.method import MEASURE_SEED
from horovod_ext.compression.wire import tensor_key
from hvdext_reference import terngrad as ref


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvd.init()
    yield


def model(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(40, 30), torch.nn.Tanh(), torch.nn.Linear(30, 5)).to(dtype)


def loss_of(m, seed=0):
    gen = torch.Generator().manual_seed(seed)
    dtype = next(m.parameters()).dtype
    return m(torch.randn(8, 40, generator=gen).to(dtype)).square().mean()


def test_superset_of_horovod_torch():
    for name in ("rank", "size", "allreduce", "allgather", "broadcast_parameters", "ProcessSet", "Average"):
        assert getattr(hvd, name) is getattr(horovod_torch, name)
    assert hvd.Compression.none is horovod_torch.Compression.none
    assert hvd.Compression.ternary.name == "ternary"


def test_init_enables_dynamic_process_sets_unless_given_its_own():
    """horovod_ext's init is Horovod's with process_sets="dynamic" (LeaderOptimizer makes its groups after init)."""
    from horovod_ext.consensus.init import make_init

    calls = []
    init = make_init(lambda comm, process_sets: calls.append((comm, process_sets)))
    init()
    init(process_sets=["given"])
    init([0, 1])
    assert calls == [(None, "dynamic"), (None, ["given"]), ([0, 1], "dynamic")]


def test_init_with_tensorflow_imported_too_keeps_every_rank_in_the_global_process_set():
    """Horovod 0.28.1 resolves process sets through the framework imported last: torch initialized after importing
    horovod.tensorflow left global_process_set.ranks == [], and an optimizer that trusted included() skipped every
    step. horovod_ext's init repairs it (a fresh process: the import order is the point)."""
    import subprocess
    import sys

    code = ("import horovod_ext.torch as hvd, horovod.tensorflow, torch\n"
            "from horovod.common.process_sets import global_process_set as g\n"
            "hvd.init()\n"
            "assert g.ranks == [0] and g.included() is True, g.ranks\n"
            "p = torch.nn.Parameter(torch.zeros(3000))\n"
            "opt = hvd.DistributedOptimizer(torch.optim.SGD([p], lr=1.0), named_parameters=[('p', p)],\n"
            "                               compression=hvd.Compression.topk(ratio=0.1))\n"
            "p.grad = torch.ones(3000); opt.step()\n"
            "assert opt.compression_stats()['steps'] == 1 and float(p.abs().sum()) == 300.0\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(__import__("os").environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout[-2000:] + proc.stderr[-3000:]


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_non_float32_parameters(dtype):
    m = model(dtype)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters(),
                                   compression=hvd.Compression.ternary(min_size=0, seed=5))
    loss_of(m).backward()
    raw = {n: p.grad.detach().float().clone() for n, p in m.named_parameters()}
    opt.synchronize()
    for name, p in m.named_parameters():
        assert p.grad.dtype == dtype
        payload = ref.encode(raw[name].numpy().reshape(-1), seed=5, step=0, tensor=tensor_key(name), rank=0)
        want = ref.decode_average([payload], p.numel(), "base3", 1)
        np.testing.assert_array_equal(p.grad.float().reshape(-1).numpy(), torch.from_numpy(want).to(dtype).float())
    with opt.skip_synchronize():
        opt.step()


def test_backward_passes_per_step_accumulates_before_sending():
    m = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters(),
                                   compression=hvd.Compression.ternary(min_size=0, clip=None, seed=1),
                                   backward_passes_per_step=2)
    loss_of(m, 0).backward()
    assert opt._hx_pending == {}  # nothing sent after the first pass
    loss_of(m, 1).backward()
    assert len(opt._hx_pending) == 4
    opt.step()
    assert opt.compression_stats()["steps"] == 1


def test_stats_fields_and_ratios():
    m = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters(),
                                   compression=hvd.Compression.ternary(min_size=100, packing="base3"))
    for step in range(3):
        opt.zero_grad()
        loss_of(m, step).backward()
        opt.step()
    stats = opt.compression_stats()
    assert stats["steps"] == 3 and stats["compression"] == "ternary" and stats["ranks"] == 1
    last, total = stats["last_step"], stats["total"]
    for key in ("payload_bytes", "dense_bytes", "wire_bytes", "dense_wire_bytes", "bits_per_element",
                "compress_seconds", "decompress_seconds", "comm_seconds"):
        assert key in last and key in total
    dense = sum(p.numel() * 4 for p in m.parameters())
    assert last["dense_bytes"] == dense and total["dense_bytes"] == 3 * dense
    compressed = 40 * 30 + 30 * 5
    # packed payloads + scales, their bucket's two int32 sizes (compression/buckets.py), the dense biases, and the
    # 4-byte count of ranks still training (hvd.join check)
    payload = (4 + (40 * 30 + 4) // 5) + (4 + (30 * 5 + 4) // 5) + 2 * 4 + 4 * (30 + 5) + 4
    assert last["payload_bytes"] == payload and last["compressed_elements"] == compressed
    assert last["compress_seconds"] > 0


def train(steps, compression, resume_from=None, first_batch=0):
    m = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=m.named_parameters(), compression=compression)
    if resume_from is not None:
        m.load_state_dict(resume_from["model"])
        opt.load_state_dict(resume_from["opt"])
    for step in range(steps):
        opt.zero_grad()
        loss_of(m, first_batch + step).backward()
        opt.step()
    return m, opt


def flat(m):
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def test_resume_from_checkpoint_continues_bit_identically():
    compression = hvd.Compression.ternary(min_size=0, seed=11)
    m_full, _ = train(4, compression)
    m_half, opt_half = train(2, compression)
    checkpoint = {"model": {k: v.clone() for k, v in m_half.state_dict().items()}, "opt": opt_half.state_dict()}
    assert checkpoint["opt"]["horovod_ext"]["step"] == 2
    m_resumed, opt_resumed = train(2, compression, resume_from=checkpoint, first_batch=2)
    assert opt_resumed.compression_stats()["steps"] == 4
    assert not torch.equal(flat(m_full), flat(model()))
    assert torch.equal(flat(m_full), flat(m_resumed))


def test_resume_keeps_the_seed_rank_0_drew():
    m_half, opt_half = train(2, hvd.Compression.ternary(min_size=0))
    checkpoint = {"model": m_half.state_dict(), "opt": opt_half.state_dict()}
    assert checkpoint["opt"]["horovod_ext"]["seed"] == opt_half._hx_run.counters.seed == torch.initial_seed() == 0
    m = model()
    opt_resumed = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                           named_parameters=m.named_parameters(),
                                           compression=hvd.Compression.ternary(min_size=0))
    m.load_state_dict(checkpoint["model"])
    opt_resumed.load_state_dict(checkpoint["opt"])
    torch.manual_seed(5)  # a fresh agreement would propose 5: the checkpoint's key wins
    loss_of(m, 2).backward()
    opt_resumed.step()
    assert opt_resumed._hx_run.counters.seed == 0


def test_misuse_errors():
    m = model()
    with pytest.raises(ValueError, match="op=hvd.Adasum cannot be combined with Compression.ternary"):
        hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters(),
                                 compression=hvd.Compression.ternary, op=hvd.Adasum)
    with pytest.raises(TypeError, match="compression must be one of"):
        hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), compression="ternary")
    for grouping, named in (({"groups": 2}, "groups=2"), ({"num_groups": 3}, "num_groups=3"),
                            ({"groups": [list(m.parameters())]}, "groups=")):
        with pytest.raises(ValueError, match=f"{named}.*does not group allreduces explicitly.*leave groups=None"):
            hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), **grouping)
    with pytest.raises(ValueError, match="groups must be a positive integer"):
        hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), groups=0)
    with pytest.raises(ValueError, match="backward_passes_per_step must be an integer >= 1"):
        hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), backward_passes_per_step=0)
    with pytest.raises(ValueError, match="duplicate names"):
        hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                 named_parameters=[("w", p) for p in m.parameters()])
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters())
    m.zero_grad()
    loss_of(m).backward()
    with pytest.raises(AssertionError, match="before optimizer.step"):
        opt.zero_grad()
    opt.step()


@pytest.mark.parametrize("compression", [
    hvd.Compression.topk(ratio=0.05),
    hvd.Compression.topk(ratio=0.05, value_dtype="fp32"),
    # omega=0: no decision depends on step timings, so two runs take the same path
    hvd.Compression.adaptive_topk(min_cf=2, max_cf=50, epsilon=0.3, window=2, omega=0.0),
], ids=["topk-fp16", "topk-fp32", "adaptive"])
def test_topk_resume_from_checkpoint_is_bit_identical(compression):
    m_full, opt_full = train(6, compression)
    m_half, opt_half = train(3, compression)
    checkpoint = {"model": {k: v.clone() for k, v in m_half.state_dict().items()}, "opt": opt_half.state_dict()}
    assert checkpoint["opt"]["horovod_ext"]["residuals"]
    m_resumed, opt_resumed = train(3, compression, resume_from=checkpoint, first_batch=3)
    assert torch.equal(flat(m_full), flat(m_resumed))
    if compression.name == "adaptive_topk":
        def decisions(opt):  # the step times are wall-clock readings; every decision must repeat
            return [{k: v for k, v in e.items() if k != "step_seconds"} for e in opt.compression_stats()["log"]]
        assert decisions(opt_resumed) == decisions(opt_full)
        assert {e["path"] for e in opt_full.compression_stats()["log"]} != {"dense"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_backend_all_finite_sees_every_nan_and_inf(dtype):
    from horovod_ext.torch.backend import TorchBackend

    x = torch.randn(100_003).to(dtype)
    assert TorchBackend.all_finite(x) and TorchBackend.all_finite(torch.zeros(0, dtype=dtype))
    assert TorchBackend.all_finite(torch.arange(5)) and TorchBackend.all_finite(2.0)
    assert not TorchBackend.all_finite(float("nan"))
    for bad in (float("nan"), float("inf"), -float("inf")):
        for position in (0, 777, x.numel() - 1):
            y = x.clone()
            y[position] = bad
            assert not TorchBackend.all_finite(y), (bad, position)
            assert not TorchBackend.all_finite(y.view(-1, 1))


def test_gravac_checkpoint_size_does_not_grow_with_the_steps_taken():
    """GraVAC's controller keeps the last window of its log and running totals: a checkpoint after 2,000 steps is
    within 1 KB of one after 50 (the log itself is not checkpointed), and compression_stats() shows the last
    window with the totals of every step."""
    import pickle

    m = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.01), named_parameters=m.named_parameters(),
                                   compression=hvd.Compression.adaptive_topk(min_cf=2, max_cf=50, window=20))
    sizes = {}
    for step in range(1, 2001):
        opt.zero_grad()
        loss_of(m, step % 7).backward()
        opt.step()
        if step in (50, 2000):
            sizes[step] = len(pickle.dumps(opt.state_dict()))
    assert abs(sizes[2000] - sizes[50]) < 1024, sizes
    stats = opt.compression_stats()
    assert len(stats["log"]) == 20 and stats["log"][-1]["step"] == 1999
    assert sum(stats["totals"]["paths"].values()) == 2000 == sum(stats["totals"]["cf_steps"].values())


@pytest.mark.parametrize("compression", [hvd.Compression.none, hvd.Compression.topk(ratio=0.1)], ids=["none", "topk"])
def test_sparse_as_dense_feeds_an_optimizer_that_takes_only_sparse_gradients(compression):
    """Horovod's sparse_as_dense=True densifies a sparse gradient to send it and makes the average sparse again, so
    torch.optim.SparseAdam (sparse gradients only) steps as with Horovod's own DistributedOptimizer."""
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(50, 8, sparse=True)
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(embedding.parameters(), lr=0.1),
                                   named_parameters=embedding.named_parameters(), sparse_as_dense=True,
                                   compression=compression)
    before = embedding.weight.detach().clone()
    for _ in range(3):
        opt.zero_grad()
        embedding(torch.tensor([[1, 4, 9]])).sum().backward()
        opt.step()
        assert embedding.weight.grad.is_sparse
    moved = (embedding.weight.detach() != before).any(dim=1)
    assert moved[[1, 4, 9]].all()


@pytest.mark.parametrize("wrap", ["diloco", "leader"])
def test_a_scheduler_made_before_the_wrap_does_not_hide_the_wrappers_step(wrap):
    """torch's LRScheduler puts a counting step() on the optimizer instance; the wrapper copies the instance's
    attributes, and its own step() (the outer round, the consensus step) must still run, the schedule too, with
    no warning that the scheduler stepped before the optimizer."""
    m = model()
    inner = torch.optim.SGD(m.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(inner, lambda epoch: 0.5 ** epoch)
    opt = hvd.DiLoCoOptimizer(inner, m.named_parameters(), inner_steps=2) if wrap == "diloco" else \
        hvd.LeaderOptimizer(inner, m.named_parameters(), groups=None, period=2)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*lr_scheduler.step.*before.*optimizer.step")
        for step in range(4):
            opt.zero_grad()
            loss = loss_of(m, step)
            loss.backward()
            if wrap == "leader":
                opt.report_loss(loss)
            opt.step()
            schedule.step()
    stats = opt.compression_stats()
    assert stats["steps"] == 4
    if wrap == "diloco":
        assert stats["outer_rounds"] == 2
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 ** 4)


@pytest.mark.parametrize("make", ["DistributedOptimizer", "DiLoCoOptimizer"])
def test_a_step_hook_runs_once_per_step_also_after_load_state_dict(make):
    """torch's step hooks run around the wrapped optimizer's own step, once (Horovod's DistributedOptimizer runs
    them twice: its step is wrapped in them too), and still once after load_state_dict (which wraps a class's step
    unless it is marked)."""
    model = torch.nn.Linear(2, 1)
    opt = getattr(hvd, make)(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
    calls = []
    opt.register_step_post_hook(lambda *_: calls.append(1))
    for _ in range(2):
        opt.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        opt.load_state_dict(opt.state_dict())
    assert len(calls) == 2


def test_auto_measures_each_candidate_on_what_it_would_encode_once_chosen():
    """Compression.auto measures a candidate with error feedback (top-k) on g + r and one without (ternary: once
    chosen, r is carried once and its payloads carry g alone) on g: an embedding's g is sparse, top-k's residual of
    it is not, and an entropy-coded ternary payload of g + r would be many times larger than ternary's own."""
    from horovod_ext.compressors.auto.measure import Measures, round_trip
    from horovod_ext.compression.plan import Item
    torch.manual_seed(0)
    emb = torch.nn.Embedding(4096, 32)
    ternary, topk = hvd.Compression.ternary(min_size=0, packing="entropy"), hvd.Compression.topk(ratio=0.001)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1), emb.named_parameters(),
                                   compression=hvd.Compression.auto(candidates=["none", ternary, topk], window=1000))
    gen = torch.Generator().manual_seed(0)
    for step in range(8):
        opt.zero_grad()
        emb(torch.randint(0, 4096, (64,), generator=gen)).square().sum().backward()
        opt.step()
        method = opt._hx_run.driver.method
        method.assignment = [2]  # candidates: none, ternary, top-k; top-k's residual builds up over every row touched
    be, g = method.be, emb.weight.grad.reshape(-1)
    r = method.subs[2].codec.residuals["weight"]
    method.measures = Measures(1, 3)
    method._measure(be, 0, emb.weight.grad, [1, 2])
    measured_bytes = [method.measures.values[0][c][3] for c in (1, 2)]
    ctx = types.SimpleNamespace(seed=MEASURE_SEED, step=method.steps, stats=types.SimpleNamespace(extra={}), be=be)
    item = Item(0, "weight", emb.weight.grad, g.numel(), 4)
    on_g = round_trip(be, ctx, item, g.clone(), method.candidates[1], (4096, 32))[2]
    on_g_plus_r = round_trip(be, ctx, item, g + be.read(r), method.candidates[1], (4096, 32))[2]
    assert measured_bytes[0] == on_g and on_g_plus_r > 3 * on_g, (on_g, on_g_plus_r)
    assert measured_bytes[1] == round_trip(be, ctx, item, g + be.read(r), method.candidates[2], (4096, 32))[2]


def test_auto_parks_a_residual_during_a_trial_and_carries_it_once_the_trials_are_over(monkeypatch):
    """Top-k 1% for a window, a trial of "none", top-k again, then "none" after the trials: during the trial top-k's
    residual waits untouched (no dense send of it) and is used again on the return; after the trials the move
    sends it once (the carry), after which it is 0."""
    from horovod_ext.compressors.auto import method as auto_method
    plan = {0: 1, 4: 0, 8: 1, 12: 0}

    def decide(self, current):
        if self.steps == 12:
            self.timed_windows = auto_method.TRIALS + 1  # the trials are over
        return [float(plan.get(self.steps, current[0]))] * len(self.sizes)

    monkeypatch.setattr(auto_method.AutoMethod, "_decide", decide)
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 32)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model.named_parameters(),
                                   compression=hvd.Compression.auto(candidates=[hvd.Compression.topk(ratio=0.01)],
                                                                    window=4))
    gen = torch.Generator().manual_seed(0)
    seen = {}
    for step in range(14):
        opt.zero_grad()
        model(torch.randn(8, 64, generator=gen)).square().mean().backward()
        opt.step()
        method = opt._hx_run.driver.method
        seen[step] = (method.assignment[0], sorted(method.parked), sorted(method.carry),
                      float(method.subs[1].codec.residuals["weight"].norm()))
    assert seen[3][:3] == (0, ["bias", "weight"], [])  # the trial: parked
    assert seen[3][3] == seen[7][3] > 0  # untouched through the trial
    assert seen[8][0] == 1 and seen[8][3] != seen[7][3]  # back on top-k: in use again
    assert seen[11][:3] == (0, [], ["bias", "weight"]) and seen[12][3] == 0.0  # after the trials: carried once


def test_auto_measures_powersgd_from_a_warm_q_near_the_best_rank_r_approximation():
    """The gain auto reads for PowerSGD is of its step from a warm Q (WARM_ITERATIONS untimed power iterations): on a
    matrix whose spectrum falls slowly it lies near the best rank-4 approximation's cosine and above a cold Q's. The
    step is one power iteration after WARM_ITERATIONS from x's first 256 x 4 elements; the seconds spent warming are
    some of the call's; a tensor that goes dense is sent as it is, with no warming."""
    from horovod_ext.compressors.auto.measure import WARM_ITERATIONS, powersgd_round_trip
    from horovod_ext.compression.plan import Item
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 8)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(layer.parameters(), lr=0.1), layer.named_parameters(),
                                   compression=hvd.Compression.auto)
    layer(torch.randn(4, 64)).sum().backward()
    opt.step()
    be, spec = opt._hx_run.driver.method.be, hvd.Compression.powersgd(rank=4, start_iter=0)
    u, _ = torch.linalg.qr(torch.randn(512, 256))
    v, _ = torch.linalg.qr(torch.randn(256, 256))
    m = u @ torch.diag(1.0 / torch.arange(1, 257, dtype=torch.float32).sqrt()) @ v.T
    x = m.reshape(-1).contiguous()
    item = Item(0, "w", m, x.numel(), 4)

    def cosine(a):
        return float((x * a).sum() / (x.norm() * a.norm()))
    s = torch.linalg.svdvals(m)
    best = float(s[:4].square().sum().sqrt() / s.square().sum().sqrt())  # the best rank-4 approximation's cosine
    called = time.perf_counter()
    warm, nbytes, warming = powersgd_round_trip(be, item, x, spec, (512, 256))
    called = time.perf_counter() - called
    q = m[:4].T.contiguous()
    p, _ = torch.linalg.qr(m @ torch.linalg.qr(q)[0])
    cold = p @ (m.T @ p).T
    assert nbytes == (512 + 256) * 4 * 4 and 0.0 < warming <= called
    q = x[:256 * 4].reshape(1, 256, 4)
    for _ in range(WARM_ITERATIONS + 1):
        p = be.orthogonalize(m.unsqueeze(0) @ be.orthogonalize(q, spec.orthogonalization), spec.orthogonalization)
        q = m.T.unsqueeze(0) @ p
    assert torch.allclose(warm, (p @ q.transpose(1, 2)).reshape(-1), rtol=1e-4, atol=1e-6)
    vector = torch.randn(1000)
    dense, dense_bytes, no_warming = powersgd_round_trip(be, Item(1, "b", vector, 1000, 4), vector, spec, (1000,))
    assert dense is vector and dense_bytes == 4000.0 and no_warming == 0.0
    assert cosine(cold.reshape(-1)) < cosine(warm) <= best + 1e-6
    assert cosine(warm) > best - 0.5 * (best - cosine(cold.reshape(-1)))


def test_auto_holds_an_error_feedback_candidates_gain_in_force_and_bounds_it_off_force_across_a_resize():
    torch.manual_seed(0)
    layer = torch.nn.Linear(256, 64)
    candidates = ["none", hvd.Compression.ternary, hvd.Compression.topk(ratio=0.01)]  # ternary keeps no residual
    opt = hvd.DistributedOptimizer(torch.optim.SGD(layer.parameters(), lr=0.1), layer.named_parameters(),
                                   compression=hvd.Compression.auto(candidates=candidates, window=1000))
    layer(torch.randn(8, 256)).square().sum().backward()
    opt.step()
    method = opt._hx_run.driver.method
    assert all(h is None for row in method.held for h in row)  # the deciding step ran nothing in force
    n, k = len(method.sizes), len(method.candidates)

    def window_end(gain_of):  # the agreed window: a gain per candidate, one sample each, no timed step
        averaged = [v for _ in range(n) for c in range(k) for v in (gain_of(c), 1.0, 1e-4, 100.0)]
        method._take_measures(averaged + [0.0] * 5, method.assignment)

    method.assignment = [2] * n
    window_end(lambda c: 0.3 if c == 2 else 1.0)  # top-k 1% in force keeps 0.3
    method.assignment = [1] * n
    window_end(lambda c: {0: 1.0, 1: 0.7, 2: 0.55}[c])  # ternary in force; top-k 1% reads 0.55 off force
    assert method.gain(0, 2) == 0.3 and method.gain(0, 1) == 0.7
    state = json.loads(json.dumps(method.shared_state()))
    state["nranks"] += 1  # an elastic reset to another number of ranks: the held gain keeps its age
    method.load_shared_state(state)
    assert method.windows == 0 and method.gain(0, 2) == 0.3
    method.windows = HELD_WINDOWS
    assert method.gain(0, 2) == 0.55  # measured afresh once the bound has aged out
    method.assignment = [2] * n
    window_end(lambda c: {0: 1.0, 1: 0.9, 2: 0.35}[c])
    assert method.gain(0, 1) == 0.9  # no residual, so nothing overstates it off force: not bounded by its 0.7


@pytest.mark.parametrize("compression", [lambda: hvd.Compression.topk(), lambda: hvd.Compression.ternary(min_size=0)])
def test_a_nan_in_every_tensor_names_six_and_counts_the_rest(compression):
    """A NaN reaches all 20 tensors of a 10-layer model: the error names the first six (parameter order within the
    bucket's decode) and says how many more, on a model whose every tensor fails at once."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(10)])
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), net.named_parameters(),
                                   compression=compression())
    opt.zero_grad()
    (net(torch.ones(4, 64)).sum() * float("nan")).backward()
    with pytest.raises(FloatingPointError) as caught:
        opt.step()
    message = str(caught.value)
    named = [name for name, _ in net.named_parameters() if f"'{name}'" in message]
    assert len(named) == 6, message
    assert "and 14 more tensors at step 0" in message, message
