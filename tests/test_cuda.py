"""GPU kernels (cpp/cuda/): every .cu file compiles with nvcc on every machine that has nvcc (CI's kind does, without
a GPU), and the PyTorch binding's CUDA branch compiles; on a GPU with a CUDA build of horovod_ext the kernels give
the CPU kernels' bits (ternary encode/decode, statistics, error feedback, top-k), and error feedback conserves
g + r exactly."""
import glob
import math
import os
import shutil
import subprocess
import sysconfig

import numpy as np
import pytest
import torch

from hvdrun import ROOT
from horovod_ext import _torch_ops as ops

NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
CU_FILES = sorted(glob.glob(os.path.join(ROOT, "cpp", "cuda", "*.cu")))
GPU = torch.cuda.is_available() and ops.built_with_cuda()
NO_GPU = ("no GPU here: torch.cuda.is_available() is False" if not torch.cuda.is_available()
          else "horovod_ext was built without CUDA (a CPU build of torch or no nvcc at install)")


def test_there_are_cuda_sources():
    names = sorted(os.path.basename(f) for f in CU_FILES)
    assert names == ["random.cu", "ternary.cu", "topk.cu"]


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed on this machine")
@pytest.mark.parametrize("source", CU_FILES, ids=os.path.basename)
def test_cuda_source_compiles_with_nvcc(source, tmp_path):
    """The flags setup.py uses (--fmad=false keeps the arithmetic IEEE as written), for Hopper (sm_90)."""
    cmd = [NVCC, "-std=c++17", "-O3", "--fmad=false", "-arch=sm_90", "-I", os.path.join(ROOT, "cpp", "include"),
           "-c", source, "-o", str(tmp_path / "out.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "warning" not in proc.stderr.lower(), proc.stderr[-4000:]


def test_binding_cuda_branch_compiles(tmp_path):
    """The binding's CUDA branch needs no CUDA header: it compiles against this (CPU) torch's headers too."""
    from torch.utils.cpp_extension import include_paths

    cmd = ["g++", "-std=c++17", "-fsyntax-only", "-DHVDEXT_WITH_CUDA", "-DTORCH_EXTENSION_NAME=_torch_ops",
           "-I", os.path.join(ROOT, "cpp", "include"), "-I", sysconfig.get_paths()["include"],
           *[f"-I{p}" for p in include_paths()], os.path.join(ROOT, "cpp", "torch", "ops.cpp")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_cpu_build_rejects_cuda_tensors_clearly():
    if ops.built_with_cuda():
        pytest.skip("this build has the CUDA kernels")
    assert "built without CUDA" in open(os.path.join(ROOT, "cpp", "torch", "ops.cpp")).read()
    if not torch.cuda.is_available():
        pytest.skip("no CUDA tensor can be made here to pass to the op")
    with pytest.raises(RuntimeError, match="built without CUDA"):
        ops.topk_select(torch.randn(10, device="cuda"), 3)


# ------------------------------------------------------------------------------------------------ on a GPU
SIZES = [1, 5, 19, 20, 21, 4095, 4096, 4097, 65537, 1000003, 3 * 4096 * 64 + 11]


def gradient(n, seed=0, heavy=True):
    rng = np.random.default_rng(seed + n)
    g = rng.standard_t(df=2, size=n) if heavy else rng.standard_normal(n)
    return torch.from_numpy(g.astype(np.float32))


@pytest.mark.skipif(not GPU, reason=NO_GPU)
def test_gpu_normal_bit_identical_to_cpu():
    """PowerSGD's draw (hvdext/random.h) on the device: the CPU kernel's bits, over 2^20 + 3 elements."""
    n, stream = (1 << 20) + 3, torch.cuda.current_stream().cuda_stream
    cpu, gpu = torch.empty(n), torch.empty(n, device="cuda")
    for seed, step, tensor in ((0, 0, 0), (2 ** 64 - 1, 7, 12345), (987654321987654321, 2 ** 32 - 1, 99)):
        ops.normal_fill(cpu, seed, step, tensor, 0)
        ops.normal_fill(gpu, seed, step, tensor, stream)
        assert torch.equal(gpu.cpu(), cpu)


@pytest.mark.skipif(not GPU, reason=NO_GPU)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("packing", [0, 1], ids=["2bit", "base3"])
def test_gpu_ternary_bit_identical_to_cpu(n, packing):
    g = gradient(n)
    stream = torch.cuda.current_stream().cuda_stream
    for clip in (2.5, 0.0):
        cpu_scale = ops.ternary_local_scale(g, clip)
        gpu_scale = ops.ternary_local_scale(g.cuda(), clip, stream)
        assert gpu_scale == cpu_scale
        key = (n * 2654435761 % 2 ** 64, n % 17, 12345 + n, n % 5)
        cpu = ops.ternary_encode(g, *cpu_scale, *key, packing)
        gpu = ops.ternary_encode(g.cuda(), *gpu_scale, *key, packing, stream)
        assert torch.equal(gpu.cpu(), cpu)
        gathered = torch.cat([cpu, ops.ternary_encode(g * 0.5, *ops.ternary_local_scale(g * 0.5, clip),
                                                      *key, packing)])
        out_cpu, out_gpu = torch.empty(n), torch.empty(n, device="cuda")
        assert ops.ternary_decode_average(gathered, 2, n, packing, 2.0, out_cpu) == -1
        assert ops.ternary_decode_average(gathered.cuda(), 2, n, packing, 2.0, out_gpu, stream) == -1
        assert torch.equal(out_gpu.cpu(), out_cpu)
        # 3 ranks sharing one scale (shared_scale=True): the exact integer sums
        shared = torch.cat([cpu] + [ops.ternary_encode(g * f, *cpu_scale, *key[:3], key[3] + r, packing)
                                    for r, f in ((1, 0.5), (2, -1.0))])
        assert ops.ternary_decode_average(shared, 3, n, packing, 3.0, out_cpu) == -1
        assert ops.ternary_decode_average(shared.cuda(), 3, n, packing, 3.0, out_gpu, stream) == -1
        assert torch.equal(out_gpu.cpu(), out_cpu)


@pytest.mark.skipif(not GPU, reason=NO_GPU)
@pytest.mark.parametrize("scale", [1.0, 3e-7, 2.0 ** -62, 1e20])
@pytest.mark.parametrize("packing", [0, 1], ids=["2bit", "base3"])
def test_gpu_ternary_encode_at_the_keep_boundary_bit_identical_to_cpu(scale, packing):
    """Every |g| within 3 ulps of u * scale, u being its own Philox uniform: where the keep test u < fl(|g| / scale)
    is closest, at scales from the subnormal range of |g| to 1e20."""
    from hvdext_reference.philox import uniform01

    n, key = 100003, (99, 4, 7, 1)
    rng = np.random.default_rng(3)
    g = (uniform01(n, *key).astype(np.float64) * scale).astype(np.float32)
    for _ in range(3):
        step = rng.integers(-1, 2, n)
        up, down = np.nextafter(g, np.float32(np.inf)), np.nextafter(g, np.float32(0))
        g = np.where(step > 0, up, np.where(step < 0, down, g))
    g = torch.from_numpy((g * rng.choice([-1, 1], n)).astype(np.float32))
    cpu = ops.ternary_encode(g, math.inf, scale, *key, packing)
    gpu = ops.ternary_encode(g.cuda(), math.inf, scale, *key, packing, torch.cuda.current_stream().cuda_stream)
    assert torch.equal(gpu.cpu(), cpu)


@pytest.mark.skipif(not GPU, reason=NO_GPU)
@pytest.mark.parametrize("nranks,n", [(11, 4097), (11, 65537), (2050, 41)])
@pytest.mark.parametrize("packing", [0, 1], ids=["2bit", "base3"])
def test_gpu_ternary_decode_many_ranks_bit_identical_to_cpu(nranks, n, packing):
    """More ranks than one chunk of loads (8), more than one flush of the shared-scale counts (2047), and an output
    that is not 16-byte aligned: the GPU average equals the CPU's."""
    g = gradient(n)
    stream = torch.cuda.current_stream().cuda_stream
    scale = ops.ternary_local_scale(g, 2.5)
    per_rank = torch.cat([ops.ternary_encode(g * (1 + r % 3), *ops.ternary_local_scale(g * (1 + r % 3), 2.5),
                                             7, 1, 3, r, packing) for r in range(nranks)])
    shared = torch.cat([ops.ternary_encode(g * (1 - r % 2), *scale, 7, 1, 3, r, packing) for r in range(nranks)])
    for gathered in (per_rank, shared):
        out_cpu, out_gpu = torch.empty(n), torch.empty(n + 1, device="cuda")[1:]
        assert ops.ternary_decode_average(gathered, nranks, n, packing, float(nranks), out_cpu) == -1
        assert ops.ternary_decode_average(gathered.cuda(), nranks, n, packing, float(nranks), out_gpu, stream) == -1
        assert torch.equal(out_gpu.cpu(), out_cpu)


@pytest.mark.skipif(not GPU, reason=NO_GPU)
def test_gpu_ternary_flags_nan_and_shared_scales():
    n = 10000
    g = gradient(n)
    g[17] = float("nan")
    thr, scale = ops.ternary_local_scale(g.cuda(), 2.5, torch.cuda.current_stream().cuda_stream)
    assert math.isinf(scale)
    payload = ops.ternary_encode(g.cuda(), thr, scale, 1, 2, 3, 0, 1)
    good = ops.ternary_encode(gradient(n), *ops.ternary_local_scale(gradient(n), 2.5), 1, 2, 3, 1, 1).cuda()
    out = torch.zeros(n, device="cuda")
    assert ops.ternary_decode_average(torch.cat([good, payload]), 2, n, 1, 2.0, out) == 1
    assert torch.count_nonzero(out) == 0  # untouched


@pytest.mark.skipif(not GPU, reason=NO_GPU)
@pytest.mark.parametrize("n", SIZES)
def test_gpu_error_feedback_and_topk_bit_identical_to_cpu(n):
    stream = torch.cuda.current_stream().cuda_stream
    g, r0 = gradient(n, seed=1), gradient(n, seed=2) * 0.01
    r_cpu, r_gpu = r0.clone(), r0.cuda()
    assert ops.ef_accumulate(g.cuda(), r_gpu, stream) == ops.ef_accumulate(g, r_cpu)
    assert torch.equal(r_gpu.cpu(), r_cpu)
    for k in sorted({1, max(1, n // 1000), max(1, n // 100), max(1, n // 10), n}):
        idx_cpu = ops.topk_select(r_cpu, k)
        idx_gpu = ops.topk_select(r_gpu, k, stream)
        assert torch.equal(idx_gpu.cpu(), idx_cpu), k
        for value_type in (0, 1):
            rc, rg = r_cpu.clone(), r_gpu.clone()
            p_cpu = ops.topk_extract(rc, idx_cpu, value_type)
            p_gpu = ops.topk_extract(rg, idx_gpu, value_type, stream)
            assert torch.equal(p_gpu.cpu(), p_cpu) and torch.equal(rg.cpu(), rc)


@pytest.mark.skipif(not GPU, reason=NO_GPU)
@pytest.mark.parametrize("n", [1, 19, 4097, 1000003])
@pytest.mark.parametrize("value_type", [0, 1], ids=["fp16", "fp32"])
def test_gpu_topk_decode_bit_identical_to_cpu(n, value_type):
    """packing="int32" decoded on the device (no host round trip): 3 ranks' payloads, overlapping indices, odd k
    (unaligned payloads), the CPU's bits; an index out of range reports its rank and leaves out untouched."""
    stream = torch.cuda.current_stream().cuda_stream
    for k in sorted({1, max(1, n // 100) | 1, n}):
        payloads = []
        for rank in range(3):
            r = gradient(n, seed=10 + rank)
            payloads.append(ops.topk_extract(r, ops.topk_select(r, k), value_type))
        gathered = torch.cat(payloads)
        out_cpu = torch.empty(n)
        out_gpu = torch.full((n,), 7.0, device="cuda")
        assert ops.topk_decode_average(gathered, 3, k, n, value_type, 3.0, out_cpu) == -1
        assert ops.topk_decode_average(gathered.cuda(), 3, k, n, value_type, 3.0, out_gpu, stream) == -1
        assert torch.equal(out_gpu.cpu(), out_cpu), k
        bad = gathered.clone()
        stride = k * (6 if value_type == 0 else 8)
        bad[2 * stride:2 * stride + 4] = torch.tensor([255, 255, 255, 127], dtype=torch.uint8)
        untouched = torch.full((n,), 7.0, device="cuda")
        assert ops.topk_decode_average(bad.cuda(), 3, k, n, value_type, 3.0, untouched, stream) == 2
        assert bool((untouched == 7.0).all())


@pytest.mark.skipif(not GPU, reason=NO_GPU)
def test_gpu_topk_ties_nan_inf_and_conservation():
    stream = torch.cuda.current_stream().cuda_stream
    x = torch.ones(50000)
    x[::7] = 2.0
    x[123], x[456], x[789] = float("nan"), float("inf"), -float("inf")
    for k in (1, 3, 100, 7143, 7150, 49999):
        assert torch.equal(ops.topk_select(x.cuda(), k, stream).cpu(), ops.topk_select(x, k)), k
    g, r = gradient(300000, seed=5), torch.zeros(300000, device="cuda")
    ops.ef_accumulate(g.cuda(), r, stream)
    g_ef = r.clone()
    idx = ops.topk_select(r, 3000, stream)
    payload = ops.topk_extract(r, idx, 0, stream)
    sent = torch.from_numpy(payload.cpu().numpy()[4 * 3000:].view(np.float16).astype(np.float32)).cuda()
    rebuilt = r.clone()
    rebuilt[idx.long()] += sent
    assert torch.equal(rebuilt, g_ef)  # sent + r == g_ef exactly: error feedback loses nothing


@pytest.mark.skipif(not GPU, reason=NO_GPU)
@pytest.mark.parametrize("n", [19, 4097, 1000003])
def test_gpu_nested_topk_and_norms_bit_identical_to_cpu(n):
    """GraVAC's two levels on a CUDA tensor (top k1, then the top k2 among the candidates' values, both on the
    device; the norms through the candidates' values on the host) give the CPU kernel's indices and sums."""
    from horovod_ext.torch_common.kernels import TorchKernels

    x = gradient(n, seed=3)
    x[::5] = x[1::5][:len(x[::5])] if n > 5 else x[::5]  # ties
    for cf1, cf2 in ((10, 20), (20, 40), (40, 160), (2, 1000)):
        k1, k2 = max(1, n // cf1), max(1, n // cf2)
        k2 = min(k1, k2)
        first_cpu, second_cpu = ops.topk_select_nested(x, k1, k2)
        first_gpu, second_gpu = TorchKernels.topk_select_nested(x.cuda(), k1, k2)
        assert first_gpu.is_cuda and second_gpu.is_cuda
        assert torch.equal(first_gpu.cpu(), first_cpu) and torch.equal(second_gpu.cpu(), second_cpu), (cf1, cf2)
        for idx_cpu, idx_gpu in ((first_cpu, first_gpu), (second_cpu, second_gpu)):
            assert TorchKernels.sum_squares_at(x.cuda(), idx_gpu) == ops.sum_squares_at(x, idx_cpu)


def synchronizations_per_step(compression, layers, steps=3):
    """CUDA synchronizations per step (torch's sync debug mode, "warn": one warning per synchronizing call) of a
    step of horovod_ext.torch's DistributedOptimizer at Horovod size 1, on `layers` Linear(64, 64) layers on the
    GPU, in one bucket; the first step (which agrees on the settings) is not counted."""
    import warnings

    import horovod_ext.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(layers)]).cuda()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model.named_parameters(),
                                   compression=compression)
    x = torch.randn(32, 64, device="cuda")

    def step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    step()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchronizing" in str(w.message) for w in caught) / steps


@pytest.mark.skipif(not GPU, reason=NO_GPU)
@pytest.mark.parametrize("name", ["ternary", "topk"])
def test_gpu_step_synchronizes_a_bounded_number_of_times_whatever_the_tensor_count(name):
    """No host round trip per tensor inside a CUDA step (torch.cuda.set_sync_debug_mode): scales, finiteness flags
    and byte counts stay on the device until the step ends. A step may still wait for the device where it needs a
    value on the host (the bucket allgather's header, the step's flags read together: docs/internals.md, "What a
    step reads back to the host"), so the count is bounded and the same for 2 tensors as for 20."""
    import horovod_ext.torch as hvd

    make = {"ternary": lambda: hvd.Compression.ternary(min_size=0), "topk": lambda: hvd.Compression.topk()}[name]
    few, many = synchronizations_per_step(make(), 1), synchronizations_per_step(make(), 10)
    assert many == few and many <= 3, (few, many)


@pytest.mark.skipif(not GPU, reason=NO_GPU)
@pytest.mark.parametrize("feedback", [True, False])
@pytest.mark.parametrize("value_type", [0, 1], ids=["fp16", "fp32"])
def test_gpu_topk_bucket_encode_bit_identical_to_cpu_without_a_host_read(feedback, value_type):
    """A bucket's "int32" payloads on the device (ops.topk_encode_bucket: error feedback's add, the selection and
    the extraction of each tensor, enqueued on the stream) are the CPU's bytes, the remainders its bits, and the
    call never waits for the device (torch.cuda.set_sync_debug_mode("error"))."""
    sizes = [1, 19, 4097, 65537, 1000003]
    grads = [gradient(n, seed=j) for j, n in enumerate(sizes)]
    buffers = [gradient(n, seed=50 + j) if feedback else g.clone() for j, (n, g) in enumerate(zip(sizes, grads))]
    ks = [max(1, n // 100) for n in sizes]
    on_gpu = [b.cuda() for b in buffers]
    grads_gpu = [g.cuda() for g in grads] if feedback else []
    want = ops.topk_encode_bucket(grads if feedback else [], buffers, ks, value_type, False)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = ops.topk_encode_bucket(grads_gpu, on_gpu, ks, value_type, False, torch.cuda.current_stream().cuda_stream)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for j in range(len(sizes)):
        assert got[j].is_cuda and torch.equal(got[j].cpu(), want[j]), j
        assert torch.equal(on_gpu[j].cpu(), buffers[j]), j


class ElementwiseModel(torch.nn.Module):
    """Parameters whose gradients are exact on every device: the loss is sum(x * w * c) per parameter at batch 1,
    so dL/dw = x * c, one rounding per element, the same on the CPU and the GPU."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.zeros(4097))
        self.b = torch.nn.Parameter(torch.zeros(64, 33))
        self.c = torch.nn.Parameter(torch.zeros(19))

    def forward(self, xs, cs):
        return sum((x * w * c).sum() for x, w, c in zip(xs, (self.a, self.b, self.c), cs))


def ddp_hook_parameters(name, device, group, steps=4):
    """The parameters after `steps` SGD steps of ElementwiseModel on `device` in DDP over `group`, with
    horovod_ext.ddp's hook for Compression.`name`."""
    import horovod_ext.ddp as hx

    model = ElementwiseModel().to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.01)
    make = {"ternary": lambda: hx.Compression.ternary(min_size=0, packing="base3"),
            "ternary-shared": lambda: hx.Compression.ternary(min_size=0, packing="base3", shared_scale=True),
            "topk": lambda: hx.Compression.topk(ratio=0.05, packing="int32"),
            "powersgd": lambda: hx.Compression.powersgd(rank=2, start_iter=1)}[name]
    state = hx.CompressionState(make(), process_group=group, named_parameters=ddp.named_parameters())
    ddp.register_comm_hook(state, hx.comm_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(steps):
        xs = [gradient(p.numel(), seed=10 * step + j).reshape(p.shape).to(device)
              for j, p in enumerate(model.parameters())]
        cs = [gradient(p.numel(), seed=100 + j).reshape(p.shape).to(device) for j, p in enumerate(model.parameters())]
        opt.zero_grad()
        ddp(xs, cs).backward()
        opt.step()
    return [p.detach().cpu() for p in model.parameters()], state.compression_stats()


@pytest.fixture(scope="module")
def nccl_and_gloo(tmp_path_factory):
    """A one-rank NCCL default group and a Gloo group beside it."""
    import torch.distributed as dist

    torch.cuda.set_device(0)
    store = tmp_path_factory.mktemp("ddp") / "store"
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1)
    yield dist.group.WORLD, dist.new_group(backend="gloo")
    dist.destroy_process_group()


@pytest.mark.skipif(not GPU, reason=NO_GPU)
@pytest.mark.parametrize("name", ["ternary", "ternary-shared", "topk", "powersgd"])
def test_ddp_hook_over_nccl_gives_the_cpu_gloo_bits(name, nccl_and_gloo):
    """horovod_ext.ddp's hook on a CUDA model over NCCL trains to the bits of the same hook on the CPU over Gloo
    (ternary-shared allreduces its scales, made on the host: staged on the device for NCCL), with the same
    packing on both (packing="auto" picks a coded one on the CPU, a fixed one on the GPU); PowerSGD's matrix
    products and orthogonalization round differently on the GPU, so it is compared to 1e-5."""
    nccl, gloo = nccl_and_gloo
    on_gpu, gpu_stats = ddp_hook_parameters(name, "cuda", nccl)
    on_cpu, cpu_stats = ddp_hook_parameters(name, "cpu", gloo)
    assert gpu_stats["total"]["payload_bytes"] == cpu_stats["total"]["payload_bytes"] > 0
    for got, want in zip(on_gpu, on_cpu):
        if name == "powersgd":
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(got, want), name
