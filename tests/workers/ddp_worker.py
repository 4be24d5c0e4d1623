"""horovod_ext.ddp's communication hook under torchrun, with Horovod hidden (tests/test_ddp.py).

"bits": every method of tests/bucket_cases.py trains the seven-layer MLP of tests/workers/buckets_worker.py,
wrapped in DistributedDataParallel with hx.comm_hook, on the same data and seeds; each rank records the digest of
its parameters' bits (the Horovod path's digests are buckets_worker's), the collectives a step started and
compression_stats(). A model with a layer unused at odd steps trains in several DDP buckets
(find_unused_parameters). Then a checkpoint (each rank's own state_dict) resumes to the same bits, a NaN gradient fails
a step on every rank and the next step trains, and bad input raises on every rank."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import hide_horovod  # noqa: E402

hide_horovod.hide()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from bucket_cases import CollectiveCount, batches, digest, specs, torch_model  # noqa: E402
from hvdrun import expect_error, write_result  # noqa: E402

import horovod_ext.ddp as hx  # noqa: E402
from horovod_ext.ddp import backend  # noqa: E402


# torch.distributed's collectives, counted where the backend calls them (all_gather_single: the backend's own name)
COLLECTIVES = ("all_reduce", "all_gather_single", "all_gather_into_tensor", "all_to_all_single", "all_gather_object")
COUNT = CollectiveCount(dist, [name for name in COLLECTIVES if hasattr(dist, name)])
backend.all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def model():
    return torch_model()


def hooked(comp, m=None):
    """A DDP model of model() with horovod_ext's hook, its state and its optimizer (buckets_worker's)."""
    m = DDP(m or model())
    state = hx.CompressionState(comp, named_parameters=m.named_parameters())
    m.register_comm_hook(state, hx.comm_hook)
    return m, state, torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)


def step(m, opt, x, y):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(m(torch.from_numpy(x)), torch.from_numpy(y)).backward()
    opt.step()


def bits(m):
    return digest(p.detach().numpy() for p in m.module.parameters())


def train(comp):
    m, state, opt = hooked(comp)
    for x, y in batches(dist.get_rank()):
        before = COUNT.calls
        step(m, opt, x, y)
    stats = state.compression_stats()
    return {"digest": bits(m), "collectives": COUNT.calls - before,
            "payload_bytes": stats["total"]["payload_bytes"], "dense_bytes": stats["total"]["dense_bytes"]}


def resumed(comp):
    """Half the steps, each rank's own checkpoint (model, optimizer, hook state) loaded into a new DDP model, the
    other half: the digest an uninterrupted run gives."""
    steps = batches(dist.get_rank())
    half = len(steps) // 2
    m, state, opt = hooked(comp)
    for x, y in steps[:half]:
        step(m, opt, x, y)
    checkpoint = {"model": m.module.state_dict(), "optimizer": opt.state_dict(), "hook": state.state_dict()}
    fresh = model()
    fresh.load_state_dict(checkpoint["model"])
    m2, state2, opt2 = hooked(comp, fresh)
    opt2.load_state_dict(checkpoint["optimizer"])
    state2.load_state_dict(checkpoint["hook"])
    for x, y in steps[half:]:
        step(m2, opt2, x, y)
    return bits(m2)


def nan_step(comp):
    """Rank 1's input holds a NaN at the second step: every rank's backward raises; the third step trains."""
    m, state, opt = hooked(comp)
    said = []
    for i, (x, y) in enumerate(batches(dist.get_rank())[:3]):
        if i == 1 and dist.get_rank() == 1:
            x = x.copy()
            x[0, 0] = float("nan")
        try:
            step(m, opt, x, y)
            said.append(None)
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            said.append(f"{type(exc).__name__}: {exc}")
    return {"said": said, "finite": all(bool(torch.isfinite(p).all()) for p in m.parameters())}


class Branching(torch.nn.Module):
    """Three layers, the middle one used at even steps only (DDP's find_unused_parameters)."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(32, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 10)

    def forward(self, x, use_b):
        x = torch.tanh(self.a(x))
        return self.c(torch.tanh(self.b(x)) if use_b else x)


def unused_parameters(comp):
    """find_unused_parameters=True and small DDP buckets (several per step): the replicas stay identical."""
    torch.manual_seed(0)
    m = DDP(Branching(), find_unused_parameters=True, bucket_cap_mb=0.01)
    state = hx.CompressionState(comp, named_parameters=m.named_parameters())
    m.register_comm_hook(state, hx.comm_hook)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for i, (x, y) in enumerate(batches(dist.get_rank())):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(torch.from_numpy(x), i % 2 == 0), torch.from_numpy(y)).backward()
        opt.step()
    return {"digest": bits(m), "buckets": state.compression_stats()["buckets"]}


def bad_input():
    complex_weight = [("w", torch.nn.Parameter(torch.zeros(2000, dtype=torch.complex64)))]
    return [expect_error("unknown compressor", lambda: hx.CompressionState("ternary")),
            expect_error("no names", lambda: hx.CompressionState(hx.Compression.ternary)),
            expect_error("complex gradient", lambda: hx.CompressionState(hx.Compression.topk,
                                                                              named_parameters=complex_weight)),
            expect_error("not a state", lambda: hx.comm_hook(object(), None)),
            expect_error("not a bucket", lambda: hx.comm_hook(hx.CompressionState(), torch.zeros(3)))]


def main():
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    methods = specs(hx.Compression)
    runs = {name: train(comp) for name, comp in methods.items()}
    runs["none"] = train(hx.Compression.none)
    resumes = {name: resumed(methods[name]) for name in ("ternary-ef-2bit", "topk", "powersgd")}
    errors = {name: nan_step(methods[name]) for name in ("ternary", "topk")}
    unused = {name: unused_parameters(methods[name]) for name in ("ternary", "topk", "powersgd")}
    write_result(dist.get_rank(), {"rank": dist.get_rank(), "runs": runs, "resumed": resumes, "nan": errors,
                                   "unused": unused, "bad_input": bad_input()})
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # Gloo can abort in the interpreter's teardown after a comm hook ran (examples/ddp_digits.py)


if __name__ == "__main__":
    main()
