"""A plain Horovod PyTorch training script, as a user would have it: no horovod_ext anywhere.
tests/test_launcher.py runs it unmodified under `python -m horovod_ext.run`."""
import argparse

import torch
import torch.nn.functional as F

import horovod.torch as hvd
from horovod.torch import DistributedOptimizer  # the other import form the launcher must catch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--uneven", action="store_true", help="rank r takes 2r more steps; then hvd.join()")
args = parser.parse_args()

hvd.init()
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256), torch.nn.ReLU(),
                            torch.nn.Linear(256, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
optimizer = DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                 compression=hvd.Compression.none)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
gen = torch.Generator().manual_seed(hvd.rank())
for step in range(args.steps + (2 * hvd.rank() if args.uneven else 0)):
    x = torch.randn(32, 64, generator=gen)
    y = (x[:, :10].argmax(1))
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
if args.uneven:
    print(f"plain_torch: rank {hvd.rank()} joined (join from {hvd.join.__module__}), the last to join was rank "
          f"{hvd.join()}")
if hvd.rank() == 0:
    print(f"plain_torch: final loss {loss.item():.4f}, horovod_ext optimizer {hasattr(optimizer, 'compression_stats')}")
