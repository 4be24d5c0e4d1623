"""A rank killed mid-step (SIGKILL): the other ranks must end with an error, never hang (run by horovodrun).

argv[1]: none, fp16, ternary, topk, adaptive_topk, lsgd, easgd. The last rank kills itself after the backward of
step 3, while its gradients' collectives are in flight; rank 0 records what it saw if it gets to see it (Gloo
reports the closed connection) before horovodrun ends the job."""
import os
import signal
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import horovod_ext.torch as hvd  # noqa: E402
from hvdrun import write_result  # noqa: E402

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
torch.set_num_threads(1)
method = sys.argv[1]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
base = torch.optim.SGD(model.parameters(), lr=0.05)
if method == "lsgd":
    opt = hvd.LeaderOptimizer(base, model.named_parameters(), period=1, groups=None)
elif method == "easgd":
    opt = hvd.ElasticAveragingOptimizer(base, model.named_parameters(), period=1)
else:
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(),
                                   compression=getattr(hvd.Compression, method))
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
start = time.time()
try:
    for step in range(1000):
        x = torch.randn(16, 32)
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        if step == 3 and RANK == SIZE - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        if hasattr(opt, "report_loss"):
            opt.report_loss(loss)
        opt.step()
    outcome = "finished"  # must not happen: the killed rank never sends its step-3 gradients
except Exception as exc:  # noqa: BLE001 (record whatever Horovod raised)
    outcome = f"{type(exc).__name__}: {str(exc)[:200]}"
write_result(RANK, {"rank": RANK, "outcome": outcome, "seconds": time.time() - start})
sys.exit(1)
