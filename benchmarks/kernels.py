"""Kernel benchmark: the native TernGrad ops against the same math in torch ops and in NumPy, one thread.

For each size: ternarize+pack (stats, 2.5-sigma clip, scale, Bernoulli draws, base-3 packing) and decode+average
of 2 ranks' payloads, as seconds, GB/s of fp32 input, and the native op's speed-up over each baseline.
The torch-ops baseline draws its uniforms from torch's generator (the math is the same, the stream is not);
the NumPy baseline is the reference (python/hvdext_reference), which also computes Philox.
"""
import argparse

import torch

import os

from common import OUT_DIR, bar_plot, best_of, machine, markdown_table, write_outputs
from horovod_ext import _torch_ops as ops
from hvdext_reference import terngrad as ref

BASE3 = 1
POW3 = torch.tensor([1, 3, 9, 27, 81], dtype=torch.int32)


def torch_encode(g, clip=2.5, gen=None):
    """TernGrad with base-3 packing in torch ops (what a user would write without the native op)."""
    g64 = g.double()
    sigma = g64.std(unbiased=False)
    threshold = float(clip * sigma)
    gc = g.clamp(-threshold, threshold)
    scale = gc.abs().max()
    keep = torch.rand(g.numel(), generator=gen) < gc.abs() / scale
    codes = (keep & (g > 0)).to(torch.int32) + 2 * (keep & (g < 0)).to(torch.int32)
    pad = (-codes.numel()) % 5
    codes = torch.nn.functional.pad(codes, (0, pad)).view(-1, 5)
    return scale.reshape(1), (codes * POW3).sum(1).to(torch.uint8)


TRITS = torch.tensor([[((b // 3 ** j) % 3) for j in range(5)] for b in range(256)], dtype=torch.int64)
VALUES = torch.tensor([0.0, 1.0, -1.0])


def torch_decode_average(payloads, n):
    acc = torch.zeros(n)
    for scale, packed in payloads:
        acc += scale * VALUES[TRITS[packed.long()].view(-1)[:n]]
    return acc / len(payloads)


def bench_size(n, with_numpy):
    g = torch.randn(n)
    gen = torch.Generator().manual_seed(0)
    row = {"elements": n}

    def native_encode():
        thr, s = ops.ternary_local_scale(g, 2.5)
        return ops.ternary_encode(g, thr, s, 1, 0, 0, 0, BASE3)

    payload = native_encode()
    gathered = torch.cat([payload, payload])
    out = torch.empty(n)
    row["native_encode_s"] = best_of(native_encode)
    row["native_decode_s"] = best_of(lambda: ops.ternary_decode_average(gathered, 2, n, BASE3, 2.0, out))
    tp = torch_encode(g, gen=gen)
    row["torch_encode_s"] = best_of(lambda: torch_encode(g, gen=gen))
    row["torch_decode_s"] = best_of(lambda: torch_decode_average([tp, tp], n))
    if with_numpy:
        gn = g.numpy()
        p = ref.encode(gn, seed=1)
        row["numpy_encode_s"] = best_of(lambda: ref.encode(gn, seed=1), repeat=1)
        row["numpy_decode_s"] = best_of(lambda: ref.decode_average([p, p], n, "base3", 2), repeat=1)
    return row


def bench_topk(sizes, fractions):
    """Exact top-k by magnitude: the native op (indices ascending) vs torch.topk(|x|, k) (what a user would call)."""
    rows = []
    for n in sizes:
        x = torch.randn(n)
        for fraction in fractions:
            k = max(1, int(n * fraction))
            native = best_of(lambda: ops.topk_select(x, k))
            baseline = best_of(lambda: torch.topk(x.abs(), k, sorted=False))
            rows.append({"elements": n, "fraction": fraction, "native_s": native, "torch_topk_s": baseline})
    table = [[f"{r['elements'] / 1e6:g}M", f"{100 * r['fraction']:g}%", f"{r['native_s'] * 1e3:.1f}",
              f"{r['torch_topk_s'] * 1e3:.1f}", f"{r['torch_topk_s'] / r['native_s']:.1f}x"] for r in rows]
    md = ("Top-k by magnitude, one thread: native (sampled threshold, corrected to exactly k, indices ascending) "
          "vs torch.topk(x.abs(), k, sorted=False).\n\n"
          + markdown_table(["elements", "kept", "native ms", "torch.topk ms", "speed-up"], table))
    return rows, md


def run(sizes, numpy_limit):
    torch.set_num_threads(1)
    rows = [bench_size(n, n <= numpy_limit) for n in sizes]
    table = []
    for r in rows:
        n, gb = r["elements"], r["elements"] * 4 / 1e9
        enc, dec = r["native_encode_s"], r["native_decode_s"]
        table.append([f"{n / 1e6:g}M", f"{gb / enc:.2f}", f"{r['torch_encode_s'] / enc:.1f}x",
                      f"{r['numpy_encode_s'] / enc:.0f}x" if "numpy_encode_s" in r else "-",
                      f"{gb / dec:.2f}", f"{r['torch_decode_s'] / dec:.1f}x",
                      f"{r['numpy_decode_s'] / dec:.0f}x" if "numpy_decode_s" in r else "-"])
    topk_rows, topk_md = bench_topk(sizes, [0.001, 0.01, 0.1])
    md = ("TernGrad kernels, one thread, base-3 packing, 2.5-sigma clipping; decode averages 2 ranks' payloads.\n"
          "GB/s counts fp32 input (encode) or fp32 output (decode); speed-ups are baseline seconds / native seconds "
          "measured in the same run.\n\n"
          + markdown_table(["elements", "encode GB/s", "vs torch ops", "vs NumPy ref", "decode GB/s",
                            "vs torch ops", "vs NumPy ref"], table)
          + "\n\n" + topk_md)
    groups = {f"{r['elements'] / 1e6:g}M": {"encode vs torch ops": r["torch_encode_s"] / r["native_encode_s"],
                                             "decode vs torch ops": r["torch_decode_s"] / r["native_decode_s"]}
              for r in rows}
    for r in topk_rows:
        groups.setdefault(f"{r['elements'] / 1e6:g}M", {})[f"top-k {100 * r['fraction']:g}% vs torch.topk"] = \
            r["torch_topk_s"] / r["native_s"]
    bar_plot(os.path.join(OUT_DIR, "kernels_speedup.png"), "native ops: speed-up over the same math in torch ops",
             groups, "baseline seconds / native seconds", log=True)
    md += "\n\n![speed-ups](kernels_speedup.png)"
    path = write_outputs("kernels", {"machine": machine(), "rows": rows, "topk": topk_rows}, md)
    return md, path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1M and 4M elements only")
    args = parser.parse_args()
    sizes = [2 ** 20, 2 ** 22] if args.quick else [2 ** 20, 2 ** 22, 2 ** 24, 2 ** 26]
    md, path = run(sizes, numpy_limit=2 ** 22)
    print(md)
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
