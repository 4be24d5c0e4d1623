"""Uneven data with hvd.join() at the end of every epoch, twice, under horovodrun: argv[1] a compressor name.
After the first join the ranks' step counts differ; the second epoch must not hang (step-level collective names
advance only on steps every rank takes)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

import horovod_ext.torch as hvd  # noqa: E402
from hvdrun import write_result  # noqa: E402

hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
compression = {"ternary_shared": hvd.Compression.ternary(shared_scale=True, min_size=0)}.get(sys.argv[1]) \
    or getattr(hvd.Compression, sys.argv[1])
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), named_parameters=model.named_parameters(),
                               compression=compression)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
gen = torch.Generator().manual_seed(hvd.rank())
for epoch in range(2):
    for _ in range(3 + 2 * hvd.rank()):  # rank 1 has more batches
        x = torch.randn(8, 16, generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), x[:, :4].argmax(1)).backward()
        opt.step()
    hvd.join()
stats = opt.compression_stats()
write_result(hvd.rank(), {"steps": stats["steps"], "join_dense_steps": stats.get("join_dense_steps", 0)})
