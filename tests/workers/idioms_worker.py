"""Horovod's documented PyTorch idioms against horovod_ext.torch, for every compressor (run by horovodrun -np 2).

- resume: Horovod's pattern (rank 0 loads the checkpoint, then broadcast_parameters and broadcast_optimizer_state)
  and the load-on-every-rank pattern, against an uninterrupted run of the same steps;
- join: uneven numbers of batches per rank, the ranks that run out call hvd.join();
- sparse: nn.Embedding(sparse=True) with SparseAdam, and with sparse_as_dense=True and Adam;
- process_set: every rank wraps with the even ranks' set; the odd ranks, outside it, step on their own gradients;
- adasum: op=hvd.Adasum against Horovod's own Adasum optimizer.
Each rank records what it saw; tests/test_torch_idioms.py asserts on every rank's record.
"""
import os
import sys
import tempfile
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import horovod.torch as horovod_torch  # noqa: E402
import horovod_ext.torch as hvd  # noqa: E402
from hvdrun import write_result  # noqa: E402
from horovod_ext.compressors.powersgd import Q_SUFFIX  # noqa: E402

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
torch.set_num_threads(1)
COMPRESSIONS = {
    "none": lambda: hvd.Compression.none,
    "fp16": lambda: hvd.Compression.fp16,
    "ternary": lambda: hvd.Compression.ternary,
    "ternary_two_phase": lambda: hvd.Compression.ternary(shared_scale=True, transport="two_phase"),
    "topk": lambda: hvd.Compression.topk(ratio=0.05),
    # omega=0: the controller's decisions depend on the gains alone, not on measured step times (reproducible)
    "adaptive_topk": lambda: hvd.Compression.adaptive_topk(window=2, epsilon=0.3, omega=0.0),
    "powersgd": lambda: hvd.Compression.powersgd(rank=2, start_iter=2),
}
CKPT_STEPS, MORE_STEPS = 5, 4


def mlp(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(40, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def batch(step, rank=RANK):
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 40, generator=gen), torch.randint(0, 10, (16,), generator=gen)


def make(name, seed):
    model = mlp(seed)
    base = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(), compression=COMPRESSIONS[name]())
    return model, opt


def train(model, opt, first, count):
    for step in range(first, first + count):
        x, y = batch(step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def snapshot(model, opt):
    """Parameters and momentum buffers as flat lists of floats (for bit-for-bit comparison across ranks and runs)."""
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    buffers = [opt.state[p]["momentum_buffer"].reshape(-1) for p in model.parameters() if p in opt.state]
    return {"params": params.tolist(), "momentum": torch.cat(buffers).tolist() if buffers else []}


def ours(opt):
    """horovod_ext's shared state as the optimizer's state_dict() holds it, less measured seconds."""
    state = opt.state_dict()["horovod_ext"]
    controller = (state["method"] or {}).get("controller")
    if controller is not None:
        controller = {k: v for k, v in controller.items() if k != "throughput"}
    return {"step": state["step"], "seed": state["seed"], "stats_steps": state["stats"]["steps"],
            "controller": controller}


def check_resume(name, folder):
    record = {}
    # Uninterrupted run; every rank writes its own checkpoint at CKPT_STEPS, rank 0 also the shared one.
    model, opt = make(name, seed=0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    record["fresh_broadcast"] = ours(opt)  # advances nothing of ours
    train(model, opt, 0, CKPT_STEPS)
    state = {"model": model.state_dict(), "opt": opt.state_dict()}
    torch.save(state, os.path.join(folder, f"{name}.rank{RANK}.pt"))
    hvd.barrier()
    record["at_checkpoint"] = ours(opt)
    reference_zeroed = None
    if name in ("topk", "adaptive_topk", "powersgd"):
        # What the rank-0 pattern can restore: rank 0's residuals; every other rank's start from zero.
        model_z, opt_z = make(name, seed=0)
        opt_z.load_state_dict(torch.load(os.path.join(folder, f"{name}.rank{RANK}.pt"))["opt"])
        model_z.load_state_dict(state["model"])
        if RANK != 0:
            opt_z._hx_run.residuals = None
        train(model_z, opt_z, CKPT_STEPS, MORE_STEPS)
        reference_zeroed = snapshot(model_z, opt_z)
    train(model, opt, CKPT_STEPS, MORE_STEPS)
    record["uninterrupted"] = snapshot(model, opt)
    record["uninterrupted_ours"] = ours(opt)

    # Horovod's resume pattern: fresh processes' state (other initial weights), rank 0 alone loads.
    model, opt = make(name, seed=100 + RANK)
    if RANK == 0:
        checkpoint = torch.load(os.path.join(folder, f"{name}.rank0.pt"))
        model.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["opt"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    record["after_broadcast"] = {**snapshot(model, opt), **ours(opt)}
    train(model, opt, CKPT_STEPS, MORE_STEPS)
    record["rank0_pattern"] = snapshot(model, opt)
    record["rank0_pattern_ours"] = ours(opt)
    record["rank0_reference"] = reference_zeroed or record["uninterrupted"]

    # Every rank loads its own checkpoint: everything, residuals included, is restored.
    model, opt = make(name, seed=200 + RANK)
    checkpoint = torch.load(os.path.join(folder, f"{name}.rank{RANK}.pt"))
    model.load_state_dict(checkpoint["model"])
    opt.load_state_dict(checkpoint["opt"])
    train(model, opt, CKPT_STEPS, MORE_STEPS)
    record["every_rank_pattern"] = snapshot(model, opt)
    record["every_rank_ours"] = ours(opt)
    return record


def make_leader(kind, seed):
    model = mlp(seed)
    base = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if kind == "lsgd":  # period 1: no running loss is pending at the checkpoint
        return model, hvd.LeaderOptimizer(base, model.named_parameters(), period=1, global_period=2, groups=None)
    return model, hvd.ElasticAveragingOptimizer(base, model.named_parameters(), period=1)


def train_leader(model, opt, first, count):
    for step in range(first, first + count):
        x, y = batch(step)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.report_loss(loss)
        opt.step()


def check_leader_resume(kind, folder):
    """The resume pattern with LeaderOptimizer / ElasticAveragingOptimizer: no hang, rank 0's schedule on every rank.
    Workers' parameters differ by design, so rank 0's checkpoint restarts every worker from rank 0's parameters."""
    model, opt = make_leader(kind, seed=0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    fresh_step = opt._hx_state.step
    train_leader(model, opt, 0, CKPT_STEPS)
    path = os.path.join(folder, f"{kind}.pt")
    if RANK == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)
    hvd.barrier()
    train_leader(model, opt, CKPT_STEPS, MORE_STEPS)
    uninterrupted = snapshot(model, opt)
    model, opt = make_leader(kind, seed=100 + RANK)
    if RANK == 0:
        checkpoint = torch.load(path)
        model.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["opt"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    after = {"step": opt._hx_state.step, **snapshot(model, opt)}
    train_leader(model, opt, CKPT_STEPS, MORE_STEPS)
    return {"fresh_step": fresh_step, "after": after, "uninterrupted": uninterrupted, "resumed": snapshot(model, opt),
            "sync": opt._hx_sync.state()}


def check_stock_broadcast(folder):
    """Horovod's own broadcast_optimizer_state (it knows nothing of horovod_ext's state): no hang, and the shared
    state is agreed at the first step."""
    model, opt = make("adaptive_topk", seed=300 + RANK)
    if RANK == 0:
        checkpoint = torch.load(os.path.join(folder, "adaptive_topk.rank0.pt"))
        model.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["opt"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    horovod_torch.broadcast_optimizer_state(opt, root_rank=0)
    train(model, opt, CKPT_STEPS, 1)
    return {**ours(opt), **snapshot(model, opt)}


def check_join(name):
    """Rank r has 3 + 2r batches; a rank out of data calls hvd.join(), the others keep training. In a step where a
    rank has joined, the gradient applied is Horovod's allreduce of what the training ranks send (the joined ranks
    contribute zeros, Average divides by the size): (g + r) / size, r the residual with error feedback, else 0."""
    model, opt = make(name, seed=0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    steps, common = 3 + 2 * RANK, 3
    train(model, opt, 0, common)
    at_common = snapshot(model, opt)["params"]
    errors = []
    for step in range(common, steps):
        x, y = batch(step)
        local = torch.autograd.grad(torch.nn.functional.cross_entropy(model(x), y), list(model.parameters()))
        residuals = opt.state_dict()["horovod_ext"]["residuals"]  # this rank's error-feedback residuals
        expected = [(g + residuals[n].view_as(g) if n in residuals else g) / SIZE
                    for (n, _), g in zip(model.named_parameters(), local)]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.synchronize()
        errors.append(max(float((p.grad - e).abs().max()) for p, e in zip(model.parameters(), expected)))
        with opt.skip_synchronize():
            opt.step()
    last = hvd.join()
    return {"last_joined": last, "steps": steps, "at_common": at_common, "final": snapshot(model, opt)["params"],
            "errors": errors, "dense_steps": opt.compression_stats().get("join_dense_steps", 0),
            "residual_left": max([float(r.abs().max())
                                  for key, r in opt.state_dict()["horovod_ext"]["residuals"].items()
                                  if not key.endswith(Q_SUFFIX)] or [0.0])}


def check_sparse(name, sparse_as_dense):
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(1000, 16, sparse=True)
    head = torch.nn.Linear(16, 4)
    model = torch.nn.Sequential(embedding, head)
    # Horovod's sparse_as_dense sends the gradient dense and hands the optimizer a sparse average again: an
    # optimizer of sparse gradients in both cases (with Horovod too, torch.optim.Adam rejects it)
    base = torch.optim.SparseAdam(list(embedding.parameters()), lr=0.01)
    opt = hvd.DistributedOptimizer(base, named_parameters=[(n, p) for n, p in model.named_parameters()
                                                            if any(p is q for g in base.param_groups
                                                                   for q in g["params"])],
                                   compression=COMPRESSIONS[name](), sparse_as_dense=sparse_as_dense)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    expected = []
    for step in range(3):
        gen = torch.Generator().manual_seed(step * 10 + RANK)
        ids = torch.randint(0, 1000, (8,), generator=gen)
        opt.zero_grad()
        head(embedding(ids)).sum().backward()
        local = embedding.weight.grad.coalesce().to_dense() if embedding.weight.grad.is_sparse \
            else embedding.weight.grad.clone()
        expected.append(hvd.allreduce(local, op=hvd.Average, name=f"check.{name}.{sparse_as_dense}.{step}"))
        opt.synchronize()
        grad = embedding.weight.grad
        applied = grad.to_dense() if grad.is_sparse else grad
        with opt.skip_synchronize():
            opt.step()
        expected[-1] = float((applied - expected[-1]).abs().max())
    return {"max_error": max(expected), "sparse_after": bool(embedding.weight.grad.is_sparse),
            "weights": embedding.weight.detach().reshape(-1)[:64].tolist()}


def check_process_set(name, even_set, odd_set):
    """Horovod's test_optimizer_process_sets: every rank wraps its optimizer with process_set=even_set. The even ranks
    average over their set; an odd rank (outside it) steps on its own gradients, as plain SGD does, and nobody
    waits. Records this rank's weights, those of the plain SGD run of the same batches, and its set's weights."""
    this_set = even_set if RANK % 2 == 0 else odd_set

    def run(distributed):
        model = mlp(seed=3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        if distributed:
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                           compression=COMPRESSIONS[name](), process_set=even_set)
        for step in range(3):
            gen = torch.Generator().manual_seed(100 * step + RANK)
            x, y = torch.randn(16, 40, generator=gen), torch.randint(0, 10, (16,), generator=gen)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return model[2].weight.detach().reshape(-1)

    weights, local = run(True), run(False)
    members = hvd.allgather(weights.reshape(1, -1), process_set=this_set, name=f"check.process_set.{name}")
    return {"equals_local": bool(torch.equal(weights, local)),
            "set_identical": all(bool(torch.equal(m, weights)) for m in members), "set_size": this_set.size()}


def check_adasum():
    """op=hvd.Adasum with a linear compressor returns Horovod's own Adasum optimizer, as horovod.torch's
    DistributedOptimizer does (its class's step: a local step, then Adasum of the parameters' change). Not stepped
    here: Horovod has no Adasum operation under Gloo's controller ("No Adasum operation enabled", in both)."""
    from horovod.torch.optimizer import _DistributedAdasumOptimizer

    out = {}
    for name in ("none", "fp16"):
        model = mlp(seed=4)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(),
                                       compression=getattr(hvd.Compression, name), op=hvd.Adasum)
        step = type(opt).step  # torch.optim wraps a class's step (profiling hooks): compare what it wraps
        out[name] = {"horovods_class": getattr(step, "__wrapped__", step) is _DistributedAdasumOptimizer.step,
                     "ours": hasattr(opt, "_hx_id")}
    return out


def main():
    result = {"rank": RANK, "parameter_names": None}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        folder = os.environ.get("HVDEXT_TEST_OUT") or tempfile.mkdtemp()
        result["resume"] = {name: check_resume(name, folder) for name in COMPRESSIONS}
        result["stock_broadcast"] = check_stock_broadcast(folder)
        result["leader_resume"] = {kind: check_leader_resume(kind, folder) for kind in ("lsgd", "easgd")}
    result["warnings"] = [str(w.message) for w in caught if "horovod_ext" in str(w.message)]
    result["join"] = {name: check_join(name) for name in COMPRESSIONS}
    result["sparse"] = {f"{name}.{dense}": check_sparse(name, dense) for name in COMPRESSIONS
                        for dense in (False, True)}
    even_set = hvd.add_process_set([r for r in range(SIZE) if r % 2 == 0])
    odd_set = hvd.add_process_set([r for r in range(SIZE) if r % 2 == 1])
    result["process_set"] = {name: check_process_set(name, even_set, odd_set) for name in COMPRESSIONS}
    hvd.barrier()  # the odd ranks communicate nothing: they must not remove the sets while an even rank uses them
    hvd.remove_process_set(odd_set)
    hvd.remove_process_set(even_set)
    result["adasum"] = check_adasum()
    model, opt = make("ternary", seed=0)
    result["parameter_names"] = sorted(opt._parameter_names.values())
    hvd.barrier()
    write_result(RANK, result)


if __name__ == "__main__":
    main()
