"""Wire benchmark: bytes each rank sends per step, dense allreduce vs ternary by allgather vs ternary two-phase,
for the link benchmark's 10.5M-parameter MLP.

Counted from real horovodrun runs at N = 2 and 4 (unshaped loopback, compression_stats()["last_step"]), and by the
transport's plan (the same code that sizes the real tensors) and closed-form formula at N = 2 ... 64; the counts at
2 and 4 check the plan. Ring algorithms: allreduce 2(N-1)/N * bytes, allgather (N-1) * payload, alltoall the
(N-1)/N that leaves the rank.
"""
import argparse
import os

from common import horovodrun_json, machine, markdown_table, write_outputs
from horovod_ext.compression.two_phase import (TwoPhasePlan, allgather_transport_bytes, formula_wire_bytes,
                                               scale_sharing_bytes)
from horovod_ext.compression.wire import allreduce_wire_bytes

HERE = os.path.dirname(os.path.abspath(__file__))
MIN_SIZE = 1024  # Compression.ternary's default: smaller tensors travel dense


def model_sizes(params_m):
    from link_worker import model_of

    model, _ = model_of(params_m)
    return [p.numel() for p in model.parameters()]


def planned(sizes, nranks, packing="base3"):
    big = [n for n in sizes if n >= MIN_SIZE]
    small = 4 * sum(n for n in sizes if n < MIN_SIZE)
    dense_small = allreduce_wire_bytes(small, nranks)
    plan = TwoPhasePlan(big, nranks, packing)
    return {"ranks": nranks, "dense": allreduce_wire_bytes(4 * sum(sizes), nranks),
            "allgather": allgather_transport_bytes(big, nranks, packing) + dense_small,
            "two_phase": plan.wire_bytes(0) + scale_sharing_bytes(len(big), nranks) + dense_small,
            "two_phase_formula": formula_wire_bytes(sum(big), nranks, packing)
            + scale_sharing_bytes(len(big), nranks) + dense_small}


def counted(nranks, params_m):
    rows = {r["compression"]: r for r in horovodrun_json(
        [], nranks, os.path.join(HERE, "link_worker.py"),
        ["--compression", "none,ternary,ternary-2phase", "--params-m", params_m, "--steps", 1], 900)}
    return {"dense": rows["none"]["wire_bytes"], "allgather": rows["ternary"]["wire_bytes"],
            "two_phase": rows["ternary-2phase"]["wire_bytes"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 1M-parameter model, counted at 2 ranks only")
    parser.add_argument("--params-m", type=float, default=10.5)
    args = parser.parse_args()
    params_m, count_at = (1.0, [2]) if args.quick else (args.params_m, [2, 4])
    sizes = model_sizes(params_m)
    rows = [planned(sizes, n) for n in (2, 3, 4, 8, 16, 32, 64)]
    for n in count_at:
        measured = counted(n, params_m)
        row = next(r for r in rows if r["ranks"] == n)
        row["counted"] = measured
        for key in ("dense", "allgather", "two_phase"):
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
    path = write_outputs("wire", {"machine": machine(), "parameters": sum(sizes), "rows": rows}, md)
    print(md)
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
