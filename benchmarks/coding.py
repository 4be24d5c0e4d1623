"""Wire-coding benchmark: bits per element of the entropy-coded payloads on real gradients, the native coders' speed
against today's fixed packings, and step time on a 100 Mbit/s link beside PyTorch DDP's PowerSGD (rank 4), all in
one run.

- bits: the gradients of three models while they train (the digits MLP of examples/pytorch_digits.py, a small CNN
  on the same digits, a small transformer language model on a random Markov chain), every tensor of >= 1024
  elements: ternary (2.5-sigma clip and none) packed in base 3 against entropy coded and against the empirical
  entropy of its codes; top-k 1% with int32 indices and fp16 values against delta-coded indices with fp16 or ternary
  values. Bits count whole payloads (headers included) over the compressed elements.
- speed: one thread, heavy-tailed gradients (Student t, 3 degrees of freedom): ternary encode (the op alone; the
  scale is a separate kernel shared by every packing) and decode of 2 ranks' payloads, GB/s of fp32 input
  (encode) or output (decode), base3 vs entropy; top-k's coding (extract + decode) against its selection, int32 vs
  delta, at 1% and 0.1%.
- link: link_worker.py's step time at 2 and 4 ranks on loopback shaped to 100 Mbit/s (benchmarks/shaped_link.py;
  root), for the 10.5M-parameter MLP: PowerSGD rank 4, ternary base3 and entropy, top-k 1% int32 and delta
  (fp16 and ternary values). Where no namespace can be made it says why and reports the rest.
"""
import argparse
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

from common import OUT_DIR, bar_plot, best_of, horovodrun_json, machine, markdown_table, write_outputs
from gravac_models import build, markov_data
from horovod_ext import _torch_ops as ops
from horovod_ext.compression import sizes
from shaped_link import NamespaceUnavailable, shaped_namespace

HERE = os.path.dirname(os.path.abspath(__file__))
BASE3, ENTROPY = 1, 2
FP16, TERNARY_VALUES = 0, 2


class TinyTransformer(torch.nn.Module):
    """A two-layer transformer encoder language model (causal mask) over 16 tokens: 51,408 parameters."""

    def __init__(self, vocab=16, width=64, heads=4, length=32):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Parameter(torch.zeros(length, width))
        layer = torch.nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.out = torch.nn.Linear(width, vocab)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(length))

    def forward(self, x):
        h = self.embed(x) + self.position[:x.shape[1]]
        return self.out(self.encoder(h, mask=self.mask[:x.shape[1], :x.shape[1]], is_causal=True))


def model_gradients(name, steps, every):
    """Gradients (tensors of >= 1024 elements) of `name` every `every` steps of SGD training, batch 32."""
    torch.manual_seed(0)
    if name == "transformer":
        model, (x, y, _, _), lr = TinyTransformer(), markov_data(), 0.05
    else:
        model, (x, y, _, _), _, _, lr = build(name)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    out = []
    for step in range(steps):
        batch = torch.randint(0, x.shape[0], (32,), generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        logits = model(x[batch])
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[batch].reshape(-1)).backward()
        if step % every == 0:
            out.append([p.grad.detach().reshape(-1).clone() for p in model.parameters() if p.numel() >= 1024])
        opt.step()
    return out, sum(p.numel() for p in model.parameters())


def entropy_bits(codes):
    counts = np.bincount(codes, minlength=3)[:3]
    p = counts[counts > 0] / codes.size
    return codes.size * float(-(p * np.log2(p)).sum())


def bits_rows(steps, every):
    rows = []
    for name in ("mlp", "cnn", "transformer"):
        grads, params = model_gradients(name, steps, every)
        row = {"model": name, "parameters": params, "snapshots": len(grads)}
        elements = sum(g.numel() for g in grads[0]) * len(grads)
        for clip in (2.5, None):
            tag = "clip" if clip else "noclip"
            base3 = coded = entropy = nonzero = 0
            for step, tensors in enumerate(grads):
                for t, g in enumerate(tensors):
                    threshold, scale = ops.ternary_local_scale(g, clip or 0.0, 0)
                    codes = torch.empty(g.numel(), dtype=torch.uint8)
                    ops.ternary_encode_codes(g, threshold, scale, 7, step, t, 0, codes)
                    base3 += 8 * sizes.ternary_payload_bytes(g.numel(), BASE3)
                    coded += 8 * ops.ternary_encode_entropy(g, threshold, scale, 7, step, t, 0).numel()
                    entropy += entropy_bits(codes.numpy())
                    nonzero += int((codes != 0).sum())
            row.update({f"ternary_{tag}_base3": base3 / elements, f"ternary_{tag}_entropy": coded / elements,
                        f"ternary_{tag}_H": entropy / elements, f"ternary_{tag}_density": nonzero / elements,
                        f"ternary_{tag}_over_H": coded / entropy - 1.0})
        int32 = delta16 = delta3 = 0
        for tensors in grads:
            for g in tensors:
                k = max(1, math.ceil(g.numel() / 100))
                idx = ops.topk_select(g, k, 0)
                int32 += 8 * ops.topk_extract(g.clone(), idx, FP16, 0).numel()
                delta16 += 8 * ops.topk_extract_coded(g.clone(), idx, FP16).numel()
                delta3 += 8 * ops.topk_extract_coded(g.clone(), idx, TERNARY_VALUES).numel()
        row.update({"topk_int32_fp16": int32 / elements, "topk_delta_fp16": delta16 / elements,
                    "topk_delta_ternary": delta3 / elements})
        rows.append(row)
    return rows


def speed_rows(sizes):
    torch.set_num_threads(1)
    rows = []
    for n in sizes:
        g = torch.from_numpy((np.random.default_rng(n).standard_t(3, n) * 1e-3).astype(np.float32))
        threshold, scale = ops.ternary_local_scale(g, 2.5, 0)
        base3 = ops.ternary_encode(g, threshold, scale, 1, 2, 3, 0, BASE3, 0)
        coded = ops.ternary_encode_entropy(g, threshold, scale, 1, 2, 3, 0)
        out = torch.empty(n)

        def encode_base3():
            return ops.ternary_encode(g, threshold, scale, 1, 2, 3, 0, BASE3, 0)

        def encode_entropy():
            return ops.ternary_encode_entropy(g, threshold, scale, 1, 2, 3, 0)

        row = {"elements": n, "entropy_bits": 8 * coded.numel() / n,
               "scale_s": best_of(lambda: ops.ternary_local_scale(g, 2.5, 0), repeat=5),
               "base3_encode_s": best_of(encode_base3, repeat=5), "entropy_encode_s": best_of(encode_entropy, repeat=5)}
        two3, two_e = torch.cat([base3, base3]), torch.cat([coded, coded])
        row["base3_decode_s"] = best_of(lambda: ops.ternary_decode_average(two3, 2, n, BASE3, 2.0, out, 0), repeat=5)
        row["entropy_decode_s"] = best_of(lambda: ops.ternary_decode_average_entropy(two_e, 2, n, 2.0, out), repeat=5)
        for ratio in (0.01, 0.001):
            k = max(1, int(n * ratio))
            idx = ops.topk_select(g, k, 0)
            fixed = torch.cat([ops.topk_extract(g.clone(), idx, FP16, 0)] * 2)
            delta = torch.cat([ops.topk_extract_coded(g.clone(), idx, FP16)] * 2)
            copy = best_of(lambda: g.clone(), repeat=5)
            tag = f"topk{ratio:g}"
            row[f"{tag}_select_s"] = best_of(lambda: ops.topk_select(g, k, 0), repeat=5)
            row[f"{tag}_int32_s"] = best_of(lambda: ops.topk_extract(g.clone(), idx, FP16, 0), repeat=5) - copy + \
                best_of(lambda: ops.topk_decode_average(fixed, 2, k, n, FP16, 2.0, out), repeat=5)
            row[f"{tag}_delta_s"] = best_of(lambda: ops.topk_extract_coded(g.clone(), idx, FP16), repeat=5) - copy + \
                best_of(lambda: ops.topk_decode_average_coded(delta, 2, n, 2.0, out), repeat=5)
        rows.append(row)
    return rows


LINK_CONFIGS = "powersgd,ternary-base3,ternary,topk-int32,topk,topk-ternary"


def link_rows(ranks, params_m, steps, timeout, configs=LINK_CONFIGS):
    rows = []
    with shaped_namespace(100) as prefix:
        for n in ranks:
            print(f"[coding] link: {n} ranks, 100 Mbit/s: {configs}", flush=True)
            rows += horovodrun_json(prefix, n, os.path.join(HERE, "link_worker.py"),
                                    ["--compression", configs, "--params-m", params_m, "--steps", steps], timeout)
    return rows


def report(bits, speed, link, link_note):
    gb = lambda n, s: 4 * n / s / 1e9  # noqa: E731
    md = ["### Bits per element on real gradients (tensors of >= 1024 elements; headers included)\n",
          markdown_table(
              ["model", "params", "ternary base3", "entropy, clip 2.5", "H(codes)", "over H", "density",
               "entropy, no clip", "H(codes)", "over H", "top-k 1% int32+fp16", "delta+fp16", "delta+ternary"],
              [[r["model"], r["parameters"], f"{r['ternary_clip_base3']:.3f}", f"{r['ternary_clip_entropy']:.3f}",
                f"{r['ternary_clip_H']:.3f}", f"{100 * r['ternary_clip_over_H']:+.1f}%",
                f"{r['ternary_clip_density']:.3f}", f"{r['ternary_noclip_entropy']:.3f}",
                f"{r['ternary_noclip_H']:.3f}", f"{100 * r['ternary_noclip_over_H']:+.1f}%",
                f"{r['topk_int32_fp16']:.3f}", f"{r['topk_delta_fp16']:.3f}", f"{r['topk_delta_ternary']:.3f}"]
               for r in bits]),
          "\n### Native coders, one thread (ratios from the same run)\n",
          markdown_table(
              ["elements", "bits", "base3 encode GB/s", "entropy encode GB/s", "entropy/base3", "+ scale GB/s",
               "base3 decode GB/s", "entropy decode GB/s", "entropy/base3"],
              [[r["elements"], f"{r['entropy_bits']:.3f}", f"{gb(r['elements'], r['base3_encode_s']):.2f}",
                f"{gb(r['elements'], r['entropy_encode_s']):.2f}",
                f"{r['base3_encode_s'] / r['entropy_encode_s']:.2f}",
                f"{gb(r['elements'], r['entropy_encode_s'] + r['scale_s']):.2f}",
                f"{gb(r['elements'], r['base3_decode_s']):.2f}", f"{gb(r['elements'], r['entropy_decode_s']):.2f}",
                f"{r['base3_decode_s'] / r['entropy_decode_s']:.2f}"] for r in speed]),
          "\nTop-k coding (extract + decode of 2 ranks) against its selection:\n",
          markdown_table(
              ["elements", "kept", "select ms", "int32 coding ms", "delta coding ms", "delta - int32, % of select"],
              [[r["elements"], tag, f"{1e3 * r[f'topk{tag}_select_s']:.2f}", f"{1e3 * r[f'topk{tag}_int32_s']:.2f}",
                f"{1e3 * r[f'topk{tag}_delta_s']:.2f}",
                f"{100 * (r[f'topk{tag}_delta_s'] - r[f'topk{tag}_int32_s']) / r[f'topk{tag}_select_s']:+.1f}%"]
               for r in speed for tag in ("0.01", "0.001")])]
    md.append("\n### Step time, 10.5M-parameter MLP, loopback shaped to 100 Mbit/s\n")
    if link:
        by_ranks = {}
        for r in link:
            by_ranks.setdefault(r["ranks"], {})[r["compression"]] = r
        rows = []
        for n, group in sorted(by_ranks.items()):
            psgd = group.get("powersgd")
            for name, r in group.items():
                rows.append([n, name, f"{r['payload_bytes'] / 1e6:.3f}",
                             f"{8 * r['payload_bytes'] / r['parameters']:.3f}", f"{r['step_seconds']:.3f}",
                             f"{psgd['step_seconds'] / r['step_seconds']:.2f}x" if psgd else "-"])
        md.append(markdown_table(["ranks", "compression", "payload MB/step", "bits/param", "step s",
                                  "PowerSGD step / this step"], rows))
        groups = {f"{n} ranks": {name: r["step_seconds"] for name, r in g.items()} for n, g in sorted(by_ranks.items())}
        bar_plot(os.path.join(OUT_DIR, "coding_link.png"), "step time on 100 Mbit/s (lower is better)", groups,
                 "seconds per step")
        md.append("\n![step time](coding_link.png)")
    else:
        md.append(link_note)
    groups = {r["model"]: {"base3": r["ternary_clip_base3"], "entropy": r["ternary_clip_entropy"],
                           "H(codes)": r["ternary_clip_H"], "top-k delta fp16": r["topk_delta_fp16"],
                           "top-k delta ternary": r["topk_delta_ternary"]} for r in bits}
    bar_plot(os.path.join(OUT_DIR, "coding_bits.png"), "bits per element (lower is better)", groups,
             "bits per element")
    md.append("\n![bits](coding_bits.png)")
    return "\n".join(md)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few steps, small sizes, a 2.6M model at 2 ranks")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--params-m", type=float, default=10.5)
    parser.add_argument("--link-steps", type=int, default=5)
    parser.add_argument("--timeout", type=int, default=1200)
    args = parser.parse_args()
    sizes = [1 << 20, 1 << 22, 1 << 24]
    if args.quick:
        args.steps, args.every, args.ranks, args.params_m, args.link_steps = 20, 10, "2", 2.6, 2
        sizes = [1 << 18]
    bits = bits_rows(args.steps, args.every)
    speed = speed_rows(sizes)
    link, note = [], ""
    try:
        link = link_rows([int(n) for n in args.ranks.split(",")], args.params_m, args.link_steps, args.timeout)
    except NamespaceUnavailable as exc:
        note = f"not run: {exc}"
        print(f"[coding] link not run: {exc}")
    md = report(bits, speed, link, note)
    path = write_outputs("coding", {"machine": machine(), "args": vars(args), "bits": bits, "speed": speed,
                                    "link": link}, md)
    print(md)
    print(f"\nwritten: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
