"""How deep and how wide a gradient's way is: the Python frames from PyTorch's backward hook (and from
optimizer.step()) down to a compressor's kernel, and the files of horovod_ext (and Horovod) a step enters.

One process (hvd.init() with one rank), a 64x64 linear layer, three steps of a compressor's DistributedOptimizer;
for each step, the stack of horovod_ext frames at each kernel call and the set of files whose functions ran. The
binding and the C++ core below the kernel table add two frames that Python does not see.

    python benchmarks/step_frames.py [--compression ternary] [--kernels ternary_encode_entropy,...]
"""
import argparse
import os
import sys
import traceback

import torch

import horovod_ext.torch as hvd
from horovod_ext.torch_common import kernels

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(hvd.__file__)))  # the horovod_ext folder
KERNELS = {"ternary": "ternary_encode_entropy,ternary_decode_average_entropy,ternary_encode,ternary_decode_average,"
                      "decode_bucket",
           "topk": "topk_extract_coded,topk_encode_bucket,topk_decode_average_coded,topk_extract,"
                   "topk_decode_average,decode_bucket"}


def ours(path):
    return path.startswith(PACKAGE + os.sep)


def traced(name, calls):
    """The kernel table's `name`, recording the horovod_ext frames above each call."""
    kernel = getattr(kernels.TorchKernels, name)

    def call(*args, **kwargs):
        stack = [(frame.filename, frame.name) for frame in traceback.extract_stack()[:-1]]
        calls.setdefault(name, [os.path.relpath(f, PACKAGE) + ":" + fn for f, fn in stack if ours(f)])
        return kernel(*args, **kwargs)

    return staticmethod(call)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compression", default="ternary")
    parser.add_argument("--kernels", default=None, help="kernel-table functions to trace (default: the method's)")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    hvd.init()
    torch.manual_seed(0)
    calls, files = {}, set()
    for name in (args.kernels or KERNELS.get(args.compression, "")).split(","):
        if name and hasattr(kernels.TorchKernels, name):
            setattr(kernels.TorchKernels, name, traced(name, calls))
    model = torch.nn.Linear(64, 64)
    compression = getattr(hvd.Compression, args.compression)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=compression() if callable(compression) else compression)

    def profile(frame, event, arg):
        if event == "call":
            path = frame.f_code.co_filename
            if ours(path):
                files.add(os.path.relpath(path, PACKAGE))
            elif f"{os.sep}horovod{os.sep}" in path:
                files.add("horovod/" + path.split(f"{os.sep}horovod{os.sep}")[-1])

    for step in range(args.steps):
        calls.clear()
        files.clear()
        opt.zero_grad()
        sys.setprofile(profile)
        model(torch.randn(8, 64)).pow(2).mean().backward()
        opt.step()
        sys.setprofile(None)
        print(f"step {step}:")
        for name, stack in calls.items():
            print(f"  {name}: {len(stack) + 1} Python frames from the hook (+ binding + core): "
                  + " -> ".join(stack + [f"torch_common/kernels.py:{name}"]))
        mine = sorted(f for f in files if not f.startswith("horovod/"))
        print(f"  horovod_ext files entered: {len(mine)} ({', '.join(mine)}); Horovod's: {len(files) - len(mine)}")


if __name__ == "__main__":
    main()
