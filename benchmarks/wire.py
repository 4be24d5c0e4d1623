"""Wire benchmark: bytes each rank sends per step, for the link benchmark's 10.5M-parameter MLP: dense allreduce,
fp16, ternary by allgather and two-phase, top-k 1% by allgather and by sparse_reduce, adaptive top-k at its CF
bounds, and the parameter-space optimizers (LSGD, multi-leader LSGD with nodes of 8 ranks, EASGD, averaged over
their pull periods).

Counted from real horovodrun runs at N = 2 and 4 (unshaped loopback, compression_stats()["last_step"]), and by the
transport's plan (the same code that sizes the real tensors) and closed-form formula at N = 2 ... 1024; the counts at
2 and 4 check the plan. Ring algorithms: allreduce 2(N-1)/N * bytes, allgather (N-1) * payload, alltoall the
(N-1)/N that leaves the rank.
"""
import argparse
import os

from common import OUT_DIR, horovodrun_json, line_plot, machine, markdown_table, write_outputs
from horovod_ext.compression.buckets import header_bytes
from horovod_ext.compression.plan import k_of
from horovod_ext.compression.join import join_check_wire_bytes
from horovod_ext.compression.wire import allgather_wire_bytes
from horovod_ext.compressors.transports.two_phase import scale_sharing_bytes
from hvdext_reference.two_phase import formula_wire_bytes
from horovod_ext.compression.wire import allreduce_wire_bytes
from horovod_ext.perfmodel import plan, wire_bytes_per_step

HERE = os.path.dirname(os.path.abspath(__file__))
MIN_SIZE = 1024  # Compression.ternary's default: smaller tensors travel dense


def model_sizes(params_m):
    from link_worker import model_of

    model, _ = model_of(params_m)
    return [p.numel() for p in model.parameters()]


def planned(sizes, nranks, packing="base3"):
    """Ternary's transports and dense, by horovod_ext.perfmodel's plans (each transport's own plan)."""
    big = [n for n in sizes if n >= MIN_SIZE]
    small = 4 * sum(n for n in sizes if n < MIN_SIZE)
    join = join_check_wire_bytes(nranks)  # payload compressors' ranks-still-training check (hvd.join)
    return {"ranks": nranks, "dense": wire_of("dense", sizes, nranks),
            "allgather": wire_of("ternary", sizes, nranks, packing=packing, transport="allgather"),
            "two_phase": wire_of("ternary_two_phase", sizes, nranks, packing=packing),
            "two_phase_formula": formula_wire_bytes(sum(big), nranks, packing)
            + scale_sharing_bytes(len(big), nranks) + allreduce_wire_bytes(small, nranks) + join}


def wire_of(method, sizes, nranks, **arguments):
    return wire_bytes_per_step(plan(method, [(n,) for n in sizes], nranks, **arguments))


def others(sizes, nranks):
    """Every other compressor and optimizer: perfmodel's plans, and top-k with int32 indices (6 bytes a pair) and
    its buckets' headers (an int32 size a payload)."""
    join = join_check_wire_bytes(nranks)  # payload compressors' ranks-still-training check (hvd.join)
    header = header_bytes(sizes, [True] * len(sizes))
    per_node = 8 if nranks > 8 else nranks // 2 if nranks % 2 == 0 else nranks
    return {"fp16": wire_of("fp16", sizes, nranks),
            "topk": allgather_wire_bytes(6 * sum(k_of(n, 100) for n in sizes) + header, nranks) + join,
            "topk_sparse": wire_of("topk_sparse_reduce", sizes, nranks, ratio=0.01),
            "adaptive_cf10": allgather_wire_bytes(6 * sum(k_of(n, 10) for n in sizes) + header, nranks)
            + allreduce_wire_bytes(32, nranks) + join,
            "adaptive_cf1000": allgather_wire_bytes(6 * sum(k_of(n, 1000) for n in sizes) + header, nranks)
            + allreduce_wire_bytes(32, nranks) + join,
            "lsgd": wire_of("lsgd", sizes, nranks),
            "multi_lsgd": wire_of("multi_lsgd", sizes, nranks, ranks_per_node=per_node),
            "easgd": wire_of("easgd", sizes, nranks)}


def counted(nranks, params_m):
    """compression_stats() of real runs: the fixed packings (checked against the plan), and the entropy-coded
    defaults (variable sizes: counted only)."""
    rows = {r["compression"]: r for r in horovodrun_json(
        [], nranks, os.path.join(HERE, "link_worker.py"),
        ["--compression", "none,fp16,ternary-base3,ternary-2phase-base3,topk-int32,ternary,ternary-2phase,"
                          "topk-allgather,topk-sparse",
         "--params-m", params_m, "--steps", 1], 900)}
    return {"dense": rows["none"]["wire_bytes"], "allgather": rows["ternary-base3"]["wire_bytes"],
            "two_phase": rows["ternary-2phase-base3"]["wire_bytes"], "fp16": rows["fp16"]["wire_bytes"],
            "topk": rows["topk-int32"]["wire_bytes"], "allgather_entropy": rows["ternary"]["wire_bytes"],
            "two_phase_entropy": rows["ternary-2phase"]["wire_bytes"],
            "topk_delta": rows["topk-allgather"]["wire_bytes"], "topk_sparse": rows["topk-sparse"]["wire_bytes"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 1M-parameter model, counted at 2 ranks only")
    parser.add_argument("--params-m", type=float, default=10.5)
    args = parser.parse_args()
    params_m, count_at = (1.0, [2]) if args.quick else (args.params_m, [2, 4])
    sizes = model_sizes(params_m)
    rows = [{**planned(sizes, n), **others(sizes, n)} for n in (2, 3, 4, 8, 16, 32, 64, 128, 256, 512, 1024)]
    for n in count_at:
        measured = counted(n, params_m)
        row = next(r for r in rows if r["ranks"] == n)
        row["counted"] = measured
        for key in ("dense", "allgather", "two_phase", "fp16", "topk"):
            if abs(measured[key] - row[key]) > 1:
                raise AssertionError(f"counted {key} bytes at {n} ranks ({measured[key]}) differ from the plan "
                                     f"({row[key]})")
    table = [[r["ranks"], f"{r['dense'] / 1e6:.2f}", f"{r['allgather'] / 1e6:.2f}", f"{r['two_phase'] / 1e6:.2f}",
              f"{r['dense'] / r['allgather']:.1f}x", f"{r['dense'] / r['two_phase']:.1f}x",
              "counted = plan" if "counted" in r else "plan",
              f"{abs(r['two_phase'] - r['two_phase_formula']):.0f}"] for r in rows]
    md = (f"MB each rank sends per step, {sum(sizes) / 1e6:.1f}M parameters (fp32), ternary base3 with min_size "
          f"{MIN_SIZE} (smaller tensors dense), shared scale for two-phase.\n\n"
          + markdown_table(["ranks", "dense allreduce", "ternary allgather", "ternary two-phase",
                            "dense / allgather", "dense / two-phase", "source", "|plan - formula| bytes"], table))
    coded = [[r["ranks"]] + [f"{r['counted'][k] / 1e6:.3f} ({r['dense'] / r['counted'][k]:.0f}x)"
                             for k in ("allgather", "allgather_entropy", "two_phase", "two_phase_entropy", "topk",
                                       "topk_delta", "topk_sparse")] for r in rows if "counted" in r]
    md += ("\n\nCounted with the entropy-coded defaults (sizes depend on the gradients: this model's random "
           "initial gradients): MB per rank per step (dense / it), beside the fixed packings.\n\n"
           + markdown_table(["ranks", "ternary base3", "ternary entropy", "two-phase base3", "two-phase entropy",
                             "top-k 1% int32", "top-k 1% delta", "top-k 1% delta, sparse_reduce"], coded))
    keys = ["dense", "fp16", "allgather", "two_phase", "topk", "topk_sparse", "adaptive_cf10", "adaptive_cf1000",
            "lsgd", "multi_lsgd", "easgd"]
    labels = ["dense", "fp16", "ternary allgather", "ternary two-phase", "top-k 1%", "top-k 1% sparse_reduce",
              "adaptive CF 10", "adaptive CF 1000", "LSGD", "multi-leader LSGD", "EASGD"]
    every = [[r["ranks"]] + [f"{r[k] / 1e6:.3f} ({r['dense'] / r[k]:.0f}x)" for k in keys[1:]] for r in rows]
    md += ("\n\nEvery compressor and optimizer, planned with the fixed packings: MB per rank per step (dense / it). "
           "Top-k sends an int32 index and an fp16 value per kept element of every tensor by allgather; top-k "
           "sparse_reduce is planned with delta-coded indices (sparse_reduce.planned_bytes); adaptive top-k moves "
           "between its CF bounds (allgather, plus one "
           "32-byte allreduce of norms per step); LSGD, multi-leader LSGD (groups: nodes of 8 ranks, two nodes "
           "below 16 ranks, one node at 3) and EASGD at their defaults, averaged over 16 steps (all by "
           "horovod_ext.perfmodel's plans).\n\n"
           + markdown_table(["ranks"] + labels[1:], every) + "\n\n![bytes per rank](wire_bytes.png)")
    line_plot(os.path.join(OUT_DIR, "wire_bytes.png"), f"bytes per rank per step, {sum(sizes) / 1e6:.1f}M parameters",
              [r["ranks"] for r in rows], {label: [r[k] / 1e6 for r in rows] for k, label in zip(keys, labels)},
              "ranks", "MB per rank per step", logx=True, logy=True)
    path = write_outputs("wire", {"machine": machine(), "parameters": sum(sizes), "rows": rows}, md)
    print(md)
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
