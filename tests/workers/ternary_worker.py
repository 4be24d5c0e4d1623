"""Multi-process checks of Compression.ternary with horovod_ext.torch.DistributedOptimizer (run by horovodrun).

Each rank records, per check, what it observed; tests/test_torch_multiprocess.py asserts on every rank's record.
"""
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import horovod_ext.torch as hvd  # noqa: E402
from horovod_ext.compression.wire import tensor_key  # noqa: E402
from hvdext_reference import terngrad as ref  # noqa: E402
from hvdrun import expect_error, write_result  # noqa: E402

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
torch.set_num_threads(1)


def mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.ReLU(), torch.nn.Linear(48, 10))


def batch(step):
    gen = torch.Generator().manual_seed(1000 * step + RANK)
    return torch.randn(32, 64, generator=gen), torch.randint(0, 10, (32,), generator=gen)


def check_mean_of_decoded(compression, steps=3):
    """The gradient every rank applies is the mean of all ranks' decoded ternary payloads (NumPy reference)."""
    model = mlp()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(), compression=compression)
    mismatches = []
    for step in range(steps):
        x, y = batch(step)
        raw = torch.autograd.grad(torch.nn.functional.cross_entropy(model(x), y), list(model.parameters()))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.synchronize()
        seed = opt.compression_stats()["seed"]
        for (name, p), g in zip(model.named_parameters(), raw):
            gathered = hvd.allgather(g.reshape(1, -1), name=f"check.{name}.{step}").numpy()
            scale = None
            if compression.shared_scale:
                scale = max(ref.local_scale(gathered[r], compression.clip)[1] for r in range(SIZE))
            payloads = [ref.encode(gathered[r], clip=compression.clip, packing=compression.for_device("cpu").packing,
                                   seed=seed, step=step, tensor=tensor_key(name), rank=r, scale=scale)
                        for r in range(SIZE)]
            want = ref.decode_average(payloads, g.numel(), compression.for_device("cpu").packing, SIZE)
            if not np.array_equal(p.grad.reshape(-1).numpy(), want):
                mismatches.append(f"step {step} {name}")
        with opt.skip_synchronize():
            opt.step()
    stats = opt.compression_stats()
    return {"mismatches": mismatches, "bits_per_element": stats["total"]["bits_per_element"],
            "steps": stats["steps"]}


def check_identical_after_training(compression, steps=40):
    model = mlp(seed=RANK)  # different starts: broadcast makes them equal, as in any Horovod script
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters(), compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = hvd.allgather(flat.reshape(1, -1), name="check.identical")
    return {"identical": bool(all(torch.equal(everyone[0], everyone[r]) for r in range(SIZE))),
            "moved": float((flat - torch.cat([p.reshape(-1) for p in mlp(0).parameters()])).abs().max())}


def train_steps(model, compression, steps=2, poison=None):
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(), compression=compression)
    for step in range(steps):
        x, y = batch(step)
        if poison is not None and RANK == SIZE - 1:
            x[0, 0] = poison  # a NaN/Inf input makes this rank's gradients non-finite
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


class WithExtra(torch.nn.Module):
    def __init__(self, extra):
        super().__init__()
        self.body = mlp()
        self.extra = extra

    def forward(self, x):
        return self.body(x) + 0 * self.extra.real.sum() if self.extra.numel() else self.body(x)


def bad_inputs():
    ternary = hvd.Compression.ternary(min_size=0)
    cases = [
        expect_error("nan", lambda: train_steps(mlp(), ternary, poison=float("nan"))),
        expect_error("inf", lambda: train_steps(mlp(), ternary, poison=float("inf"))),
        expect_error("nan_shared", lambda: train_steps(mlp(), hvd.Compression.ternary(min_size=0, shared_scale=True),
                                                       poison=float("nan"))),
        expect_error("mismatch_clip",
                     lambda: train_steps(mlp(), hvd.Compression.ternary(min_size=0, clip=2.5 if RANK == 0 else 3.0))),
        expect_error("mismatch_compressor", lambda: train_steps(mlp(), ternary if RANK == 0 else hvd.Compression.fp16)),
        expect_error("mismatch_shared", lambda: train_steps(mlp(), hvd.Compression.ternary(shared_scale=RANK > 0))),
        expect_error("complex", lambda: train_steps(
            WithExtra(torch.nn.Parameter(torch.zeros(4, dtype=torch.complex64))), ternary)),
        expect_error("empty", lambda: train_steps(WithExtra(torch.nn.Parameter(torch.zeros(0))), ternary)),
        expect_error("topk_nan", lambda: train_steps(mlp(), hvd.Compression.topk(ratio=0.1), poison=float("nan"))),
        expect_error("adaptive_inf", lambda: train_steps(mlp(), hvd.Compression.adaptive_topk(window=2),
                                                         poison=float("inf"))),
        expect_error("topk_ratio", lambda: hvd.Compression.topk(ratio=2)),
        expect_error("clip", lambda: hvd.Compression.ternary(clip=0)),
        expect_error("packing", lambda: hvd.Compression.ternary(packing="3bit")),
        expect_error("min_size", lambda: hvd.Compression.ternary(min_size=-1)),
    ]
    # After all of that, the ranks still train together.
    after = check_identical_after_training(hvd.Compression.ternary, steps=3)
    return {"cases": cases, "after": after}


def check_synchronize_blocks(seconds=1.0):
    """Rank 0 waits in hvd.synchronize for an allreduce the other ranks join `seconds` later. Horovod's
    WaitAndClear blocks on a condition variable (scripts/build_horovod.sh's edit): the waiting thread takes no CPU
    time, where a loop of sched_yield took all of it. A handle already cleared raises as before."""
    from horovod.torch.mpi_ops import mpi_lib

    hvd.allreduce(torch.zeros(1), name="wait.start")  # the ranks start the check together
    if RANK != 0:
        time.sleep(seconds)
    handle = hvd.allreduce_async(torch.full((4,), float(RANK)), name="wait.late", op=hvd.Sum)
    wall, cpu = time.perf_counter(), time.thread_time()
    total = hvd.synchronize(handle)
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    cleared = expect_error("cleared", lambda: mpi_lib.horovod_torch_wait_and_clear(handle))
    return {"wall": wall, "cpu": cpu, "sum": total.tolist(), "cleared": cleared}


if __name__ == "__main__":
    result = {"rank": RANK, "size": SIZE}
    for shared in (False, True):
        for packing in ("base3", "2bit"):
            comp = hvd.Compression.ternary(min_size=0, shared_scale=shared, packing=packing, seed=None if shared else 7)
            result[f"mean_{packing}_{'shared' if shared else 'local'}"] = check_mean_of_decoded(comp)
    result["mean_clip_none"] = check_mean_of_decoded(hvd.Compression.ternary(min_size=0, clip=None))
    result["identical_ternary"] = check_identical_after_training(hvd.Compression.ternary(min_size=100))
    result["identical_shared"] = check_identical_after_training(hvd.Compression.ternary(shared_scale=True, min_size=0))
    result["identical_fp16"] = check_identical_after_training(hvd.Compression.fp16)
    result["bad_inputs"] = bad_inputs()
    result["synchronize"] = check_synchronize_blocks()
    write_result(RANK, result)
