"""GPU kernel benchmark (issue 8's targets), on a machine with a CUDA GPU and a CUDA build of horovod_ext:

- ternarize+pack (statistics pass + encode pass) and decode-average of 8 payloads (one shared scale, and one scale
  per rank), as effective bandwidth (bytes read and written / seconds) and as a fraction of the GPU's memory
  bandwidth, measured in the same run as a device-to-device copy (goal >= 50%);
- top-k at 0.1% of 64M elements against torch.topk(x.abs(), k, sorted=False) (goal >= 3x).

Timed with CUDA events, the median of 20 runs after 3 warm-ups. Elsewhere it says why it cannot run and exits 0.
"""
import argparse
import os
import statistics
import sys

import torch

from common import OUT_DIR, bar_plot, machine, markdown_table, write_outputs


def cuda_seconds(fn, repeat=20, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def copy_bandwidth(n):
    x, y = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
    return 2 * 4 * n / cuda_seconds(lambda: y.copy_(x))  # bytes read + written per second


def ternary_rows(ops, sizes, peak):
    rows = []
    stream = torch.cuda.current_stream().cuda_stream
    for n in sizes:
        g = torch.randn(n, device="cuda")
        threshold, scale = ops.ternary_local_scale(g, 2.5, stream)
        encode = cuda_seconds(lambda: ops.ternary_encode(g, threshold, scale, 1, 2, 3, 0, 1, stream))
        scale_s = cuda_seconds(lambda: ops.ternary_local_scale(g, 2.5, stream))  # includes one 8-byte readback
        payload = ops.ternary_encode(g, threshold, scale, 1, 2, 3, 0, 1, stream)
        gathered = payload.repeat(8)
        out = torch.empty(n, device="cuda")
        decode = cuda_seconds(lambda: ops.ternary_decode_average(gathered, 8, n, 1, 8.0, out, stream))
        mixed = torch.cat([ops.ternary_encode(g * (1 + r), *ops.ternary_local_scale(g * (1 + r), 2.5, stream),
                                              1, 2, 3, r, 1, stream) for r in range(8)])
        decode_mixed = cuda_seconds(lambda: ops.ternary_decode_average(mixed, 8, n, 1, 8.0, out, stream))
        encode_bytes = 4 * n + payload.numel()         # read g, write the payload
        scale_bytes = 4 * n                            # read g
        decode_bytes = gathered.numel() + 4 * n        # read 8 payloads, write the average
        rows.append({"elements": n, "encode_s": encode, "scale_s": scale_s, "decode_s": decode,
                     "encode_fraction": encode_bytes / encode / peak, "scale_fraction": scale_bytes / scale_s / peak,
                     "ternarize_pack_fraction": (scale_bytes + encode_bytes) / (scale_s + encode) / peak,
                     "decode_fraction": decode_bytes / decode / peak, "decode_mixed_s": decode_mixed,
                     "decode_mixed_fraction": decode_bytes / decode_mixed / peak})
    return rows


def topk_rows(ops, n, fractions):
    rows = []
    stream = torch.cuda.current_stream().cuda_stream
    x = torch.randn(n, device="cuda")
    for fraction in fractions:
        k = max(1, int(n * fraction))
        native = cuda_seconds(lambda: ops.topk_select(x, k, stream))
        baseline = cuda_seconds(lambda: torch.topk(x.abs(), k, sorted=False))
        rows.append({"elements": n, "fraction": fraction, "native_s": native, "torch_topk_s": baseline})
    return rows


def nested_rows(n, levels):
    """GraVAC's two levels (top n/cf1, then the top n/cf2 among them: TorchKernels.topk_select_nested, whose
    second level is the CUDA top-k over the candidates' values) against torch.topk twice."""
    from horovod_ext.torch_common.kernels import TorchKernels

    rows = []
    x = torch.randn(n, device="cuda")
    for cf1, cf2 in levels:
        k1, k2 = n // cf1, n // cf2

        def baseline():
            values, first = torch.topk(x.abs(), k1, sorted=False)
            return first[torch.topk(values, k2, sorted=False).indices]

        rows.append({"elements": n, "fraction": 1 / cf1, "second": 1 / cf2,
                     "native_s": cuda_seconds(lambda: TorchKernels.topk_select_nested(x, k1, k2), repeat=5),
                     "torch_topk_s": cuda_seconds(baseline, repeat=5)})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="16M elements")
    args = parser.parse_args()
    from horovod_ext import _torch_ops as ops

    if not torch.cuda.is_available():
        print("[gpu_kernels] skipped: no CUDA GPU here (torch.cuda.is_available() is False)")
        return 0
    if not ops.built_with_cuda():
        print("[gpu_kernels] skipped: horovod_ext was built without CUDA (reinstall where nvcc and a CUDA torch are)")
        return 0
    n_topk = 2 ** 24 if args.quick else 2 ** 26
    sizes = [2 ** 24] if args.quick else [2 ** 22, 2 ** 24, 2 ** 26]
    peak = copy_bandwidth(2 ** 26)
    trows = ternary_rows(ops, sizes, peak)
    krows = topk_rows(ops, n_topk, [0.001, 0.01])
    try:
        nrows = nested_rows(n_topk, [(10, 20), (100, 200)])
    except ImportError as exc:  # horovod_ext.torch needs Horovod
        print(f"[gpu_kernels] GraVAC's two levels skipped: {exc}")
        nrows = []
    device = torch.cuda.get_device_name()
    md = (f"{device}; memory bandwidth measured as a device-to-device copy in this run: {peak / 1e12:.2f} TB/s "
          f"(read + write). Fractions are effective bandwidth (bytes read and written / seconds) over that.\n\n"
          + markdown_table(["elements", "stats+scale ms", "encode ms", "ternarize+pack of bandwidth",
                            "decode 8 ranks ms", "decode of bandwidth", "decode, per-rank scales, ms",
                            "of bandwidth"],
                           [[f"{r['elements'] / 1e6:g}M", f"{r['scale_s'] * 1e3:.3f}", f"{r['encode_s'] * 1e3:.3f}",
                             f"{100 * r['ternarize_pack_fraction']:.0f}%", f"{r['decode_s'] * 1e3:.3f}",
                             f"{100 * r['decode_fraction']:.0f}%", f"{r['decode_mixed_s'] * 1e3:.3f}",
                             f"{100 * r['decode_mixed_fraction']:.0f}%"] for r in trows])
          + "\n\nTop-k (exact, indices ascending) vs torch.topk(x.abs(), k, sorted=False):\n\n"
          + markdown_table(["elements", "kept", "native ms", "torch.topk ms", "speed-up"],
                           [[f"{r['elements'] / 1e6:g}M", f"{100 * r['fraction']:g}%", f"{r['native_s'] * 1e3:.3f}",
                             f"{r['torch_topk_s'] * 1e3:.3f}", f"{r['torch_topk_s'] / r['native_s']:.1f}x"]
                            for r in krows])
          + "\n\nGraVAC's two levels (the top-k, then the top-k among the candidates' values) vs torch.topk twice:\n\n"
          + markdown_table(["elements", "levels", "native ms", "torch.topk x2 ms", "speed-up"],
                           [[f"{r['elements'] / 1e6:g}M", f"{100 * r['fraction']:g}% then {100 * r['second']:g}%",
                             f"{r['native_s'] * 1e3:.3f}", f"{r['torch_topk_s'] * 1e3:.3f}",
                             f"{r['torch_topk_s'] / r['native_s']:.1f}x"] for r in nrows])
          + "\n\n![GPU kernels](gpu_kernels.png)")
    bar_plot(os.path.join(OUT_DIR, "gpu_kernels.png"), f"GPU kernels on {device}",
             {f"{r['elements'] / 1e6:g}M": {"ternarize+pack % of bandwidth": 100 * r["ternarize_pack_fraction"],
                                           "decode % of bandwidth": 100 * r["decode_fraction"]} for r in trows},
             "% of measured memory bandwidth")
    path = write_outputs("gpu_kernels", {"machine": machine(), "device": device, "copy_bandwidth": peak,
                                         "ternary": trows, "topk": krows, "nested": nrows}, md)
    print(md)
    print(f"\nwritten: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
