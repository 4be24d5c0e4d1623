"""Leaving at exit once process sets are in use (horovod_ext/in_flight.py: leave_together), when the last rank does
not come (run by horovodrun -np 2, tests/test_faults.py).

argv[1]: "returns" (the last rank ends the script after 2 steps while rank 0 trains on: uneven data without
hvd.join()) or "raises" (the last rank raises after 2 steps). Every rank registers the exit wait, as making a
process set does, with the wait bounded by argv[2] seconds. Rank 0 prints what its collectives raised."""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import horovod_ext.torch as hvd  # noqa: E402
from horovod_ext import in_flight  # noqa: E402
from horovod_ext.torch.backend import barrier_over_every_rank  # noqa: E402

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
torch.set_num_threads(1)
mode, in_flight.EXIT_WAIT_SECONDS = sys.argv[1], float(sys.argv[2])
in_flight.leave_together(barrier_over_every_rank)
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)


def train(steps):
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()


start = time.time()
if RANK == SIZE - 1:
    train(2)
    if mode == "raises":
        raise RuntimeError("leave_together_worker: the last rank fails")
else:
    try:
        train(10000)
        outcome = "finished"  # must not happen: the last rank left
    except Exception as exc:  # noqa: BLE001 (record whatever Horovod raised)
        outcome = f"{type(exc).__name__}: {str(exc)[:200]}"
    print(f"leave_together_worker: rank {RANK} {outcome}", flush=True)
    sys.exit(1)
