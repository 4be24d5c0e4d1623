"""Buckets (horovod_ext/compression/buckets.py) under horovodrun (tests/test_buckets.py): every method trains a
seven-layer MLP at bucket_cap_mb 0 (one collective per tensor), 0.03 (several buckets) and 25 (one bucket), on
fixed seeds; each rank records the digest of its parameters' bits and the Horovod collectives each step enqueued
(counted where horovod.torch is called); each method runs again at 25 ("@25.again"): a fused step's bits do not
depend on timing. Then a checkpoint saved under one cap is loaded under another (rank 0 loads,
broadcast_parameters and broadcast_optimizer_state, as Horovod's examples do), and bad bucket_cap_mb values are
given to DistributedOptimizer on every rank. Last, the host reads a step makes (every tensor-to-Python conversion,
counted where torch.Tensor makes it) on the 14-tensor model and on one Linear layer, at the default cap."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import horovod.torch as hvd_module  # noqa: E402
import torch  # noqa: E402

from bucket_cases import CAPS, STEPS, WIDTHS, CollectiveCount, batches, digest, specs, torch_model  # noqa: E402
from hvdrun import write_result  # noqa: E402

COUNT = CollectiveCount(hvd_module, ("allreduce_async", "allreduce_async_", "allgather_async", "alltoall",
                                     "sparse_allreduce_async"))

import horovod_ext.torch as hvd  # noqa: E402  (after the count)


def methods():
    return specs(hvd.Compression)


def model():
    return torch_model()


def data(rank):
    return [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in batches(rank)]


def bits(m):
    return digest(p.detach().numpy() for p in m.parameters())


def optimizer(m, comp, cap):
    return hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), m.named_parameters(),
                                    compression=comp, bucket_cap_mb=cap)


def step(m, opt, x, y):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(m(x), y).backward()
    opt.step()


def train(comp, cap):
    """The parameters' digest after STEPS steps, the collectives of the last step, compression_stats()."""
    m = model()
    opt = optimizer(m, comp, cap)
    for x, y in data(hvd.rank()):
        before = COUNT.calls
        step(m, opt, x, y)
    stats = opt.compression_stats()
    return {"digest": bits(m), "collectives": COUNT.calls - before, "buckets": stats.get("buckets"),
            "payload_bytes": stats["total"]["payload_bytes"]}


def resumed(comp, saved_cap, loaded_cap):
    """Half the steps under saved_cap, a checkpoint, a new model and optimizer under loaded_cap: rank 0 loads it and
    broadcasts; the other half."""
    steps, half = data(hvd.rank()), STEPS // 2
    m = model()
    opt = optimizer(m, comp, saved_cap)
    for x, y in steps[:half]:
        step(m, opt, x, y)
    checkpoint = {"model": m.state_dict(), "optimizer": opt.state_dict()}
    m2 = model()
    opt2 = optimizer(m2, comp, loaded_cap)
    if hvd.rank() == 0:
        m2.load_state_dict(checkpoint["model"])
        opt2.load_state_dict(checkpoint["optimizer"])
    hvd.broadcast_parameters(m2.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt2, root_rank=0)
    for x, y in steps[half:]:
        step(m2, opt2, x, y)
    return bits(m2)


class HostReads:
    """The conversions of a tensor to Python values (item, tolist, bool, float, int, index, numpy), counted while
    ``on``: what waits for a device's results when the tensors are on a GPU (tensors Python never reads stay
    there)."""

    CONVERSIONS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy")

    def __init__(self):
        self.on, self.reads = False, 0
        for name in self.CONVERSIONS:
            setattr(torch.Tensor, name, self._counted(getattr(torch.Tensor, name)))

    def _counted(self, fn):
        def counted(tensor, *args, **kwargs):
            self.reads += self.on
            return fn(tensor, *args, **kwargs)
        return counted


def host_reads():
    """Host reads per step (the mean of the steps after the first, which agrees on the settings) of each method on
    the 14-tensor model and on one Linear layer (2 tensors), in one bucket."""
    reads = HostReads()
    out = {}
    for name in ("ternary", "ternary-shared", "topk", "adaptive_topk", "powersgd"):
        for label, make in (("14", model), ("2", lambda: torch.nn.Linear(WIDTHS[0], WIDTHS[-1]))):
            torch.manual_seed(0)
            m = make()
            opt = optimizer(m, methods()[name], 25)
            steps = data(hvd.rank())
            step(m, opt, *steps[0])
            reads.on, reads.reads = True, 0
            for x, y in steps[1:]:
                step(m, opt, x, y)
            reads.on = False
            out[f"{name}@{label}"] = reads.reads / (len(steps) - 1)
    return out


def bad_input():
    """What DistributedOptimizer says to each bad bucket_cap_mb (every rank, before any collective)."""
    said = {}
    for value in (-1, "25", float("nan"), True, None):
        try:
            optimizer(model(), hvd.Compression.ternary, value)
            said[repr(value)] = None
        except ValueError as exc:
            said[repr(value)] = str(exc)
    return said


def main():
    hvd.init()
    torch.set_num_threads(1)
    runs = {f"{name}@{cap}": train(comp, cap) for name, comp in methods().items() for cap in CAPS}
    runs.update({f"{name}@25.again": train(comp, 25) for name, comp in methods().items()})
    lifecycle = {}
    for name in ("ternary-ef-2bit", "topk", "adaptive_topk"):
        comp = methods()[name]
        for saved, loaded in ((0, 0), (25, 0), (0, 25), (0.03, 25)):
            lifecycle[f"{name}@{saved}->{loaded}"] = resumed(comp, saved, loaded)
    write_result(hvd.rank(), {"rank": hvd.rank(), "size": hvd.size(), "runs": runs, "lifecycle": lifecycle,
                              "bad_input": bad_input(), "host_reads": host_reads()})


if __name__ == "__main__":
    main()
