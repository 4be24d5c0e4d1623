"""A rank killed under torchrun (tests/test_ddp.py): the DDP model of tests/workers/ddp_worker.py with a hook trains
STEPS steps, each rank saving its own checkpoint (model, optimizer, hook state, step) every EVERY steps. With
argv[2] "kill", rank 1 kills itself (SIGKILL) at step KILL of the first attempt (torchrun's restart count); a
launch that finds checkpoints resumes from them. Each rank writes its parameters' digest and the step it resumed
from.

argv: checkpoint directory, "kill" or "run", compressor name (of tests/bucket_cases.py)."""
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import hide_horovod  # noqa: E402

hide_horovod.hide()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from bucket_cases import WIDTHS, specs  # noqa: E402
from ddp_worker import bits, hooked, model  # noqa: E402
from hvdrun import write_result  # noqa: E402

import horovod_ext.ddp as hx  # noqa: E402

STEPS, EVERY, KILL = 12, 4, 10


def batch(rank, step):
    rng = np.random.default_rng(1000 * rank + step)
    return (torch.from_numpy(rng.standard_normal((16, WIDTHS[0])).astype(np.float32)),
            torch.from_numpy(rng.integers(0, 10, 16)))


def main():
    directory, mode, method = sys.argv[1:4]
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, attempt = dist.get_rank(), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    m, state, opt = hooked(specs(hx.Compression)[method], model())
    path = os.path.join(directory, f"rank{rank}.pt")
    start = 0
    if os.path.exists(path):
        checkpoint = torch.load(path, weights_only=False)
        m.module.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["optimizer"])
        state.load_state_dict(checkpoint["hook"])
        start = checkpoint["step"]
    for step in range(start, STEPS):
        if mode == "kill" and attempt == 0 and rank == 1 and step == KILL:
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
        if (step + 1) % EVERY == 0:
            torch.save({"model": m.module.state_dict(), "optimizer": opt.state_dict(), "hook": state.state_dict(),
                        "step": step + 1}, path)
    write_result(rank, {"rank": rank, "attempt": attempt, "resumed_from": start, "digest": bits(m),
                        "steps": state.compression_stats()["steps"]})
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # Gloo can abort in the interpreter's teardown after a comm hook ran (examples/ddp_digits.py)


if __name__ == "__main__":
    main()
