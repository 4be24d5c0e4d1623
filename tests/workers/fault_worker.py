"""A rank killed mid-step (SIGKILL): the other ranks must end with an error, never hang (run by horovodrun).

argv[1]: none, fp16, ternary, topk, adaptive_topk, lsgd, easgd. The last rank kills itself after the backward of
step 3, while its gradients' collectives are in flight, and writes nothing. Every other rank records what ended its
training: {"rank", "error" (the exception's type, None if it trained to the end), "message", "step"}. Those ranks
ignore SIGTERM, by which horovodrun ends the job once a rank has failed (it kills them 5 s later), so that their
record does not depend on which comes first: horovodrun's SIGTERM or Gloo's report of the closed connection."""
import os
import signal
import sys

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
if RANK != SIZE - 1:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
step = None
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
    error, message = None, ""
except Exception as exc:  # noqa: BLE001 (record whatever Horovod raised)
    error, message = type(exc).__name__, str(exc)[:300]
write_result(RANK, {"rank": RANK, "error": error, "message": message, "step": step})
sys.exit(1)
