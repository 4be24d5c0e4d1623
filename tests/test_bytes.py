"""compression_stats() byte counts in both frameworks (eager and inside tf.function) equal the plan's, for every
compressor, packing and value dtype: payload sizes from the C++ core (horovod_ext.compression.sizes), the two-phase
chunk plan, and the ring formulas of wire.py. Run for real under horovodrun -np 2 (tests/workers/bytes_worker.py).
Entropy-coded payloads ("entropy", "delta") have sizes that depend on the values: their counts must lie within the
bounds of their coding (bits per index and per code), or ternary's equal the reference coder's for the worker's
seeded draws, and carry the allgather's wire bytes."""
import math

import numpy as np
import pytest
from hvdext_reference import terngrad

from horovod_ext.compression import sizes
from horovod_ext.compression.join import JOIN_CHECK_BYTES, join_check_wire_bytes
from horovod_ext.compression.plan import k_of
from horovod_ext.compressors.transports.two_phase import TwoPhasePlan, scale_sharing_bytes
from horovod_ext.compression.wire import allgather_wire_bytes, allreduce_wire_bytes, tensor_key
from hvdrun import horovodrun

SIZES = (5003, 37, 2048)
MIN_SIZE = 1024  # ternary's default
NRANKS = 2
PACKING = {"base3": 1, "2bit": 0}
VALUE = {"fp16": 0, "fp32": 1}


class Step:
    """Bytes one rank hands to Horovod in one step, and their ring wire bytes."""

    def __init__(self):
        self.payload = self.wire = 0

    def allreduce(self, nbytes):
        self.payload += nbytes
        self.wire += allreduce_wire_bytes(nbytes, NRANKS)

    def allgather(self, nbytes):
        self.payload += nbytes
        self.wire += allgather_wire_bytes(nbytes, NRANKS)


def ternary_step(rank, packing="base3", shared_scale=False, transport="allgather"):
    step = Step()
    big = [n for n in SIZES if n >= MIN_SIZE]
    for n in SIZES:
        if n < MIN_SIZE:
            step.allreduce(4 * n)
    if shared_scale:
        step.payload += 4 * len(big)
        step.wire += scale_sharing_bytes(len(big), NRANKS)
    if transport == "two_phase":
        plan = TwoPhasePlan(big, NRANKS, packing)
        step.payload += plan.payload_bytes(rank)
        step.wire += plan.wire_bytes(rank)
    else:
        for n in big:
            step.allgather(sizes.ternary_payload_bytes(n, PACKING[packing]))
    return step


def topk_step(ratio, value_dtype="fp16"):
    step = Step()
    for n in SIZES:
        step.allgather(sizes.topk_payload_bytes(k_of(n, 1.0 / ratio), VALUE[value_dtype]))
    return step


def adaptive_step(path, cf):
    step = Step()
    step.allreduce(32)  # the norms and the step time, float64
    if path == "dense":
        step.allreduce(4 * sum(SIZES))
    else:
        step.allgather(sum(sizes.topk_payload_bytes(k_of(n, cf), 0) for n in SIZES))
    return step


def linear_step(bytes_per_element):
    step = Step()
    for n in SIZES:
        step.allreduce(bytes_per_element * n)
    return step


def expected_steps(key, rank, log):
    """The plan's bytes of each of the three steps of config `key`."""
    fixed = {
        "none": lambda: linear_step(4), "fp16": lambda: linear_step(2),
        "ternary_base3": lambda: ternary_step(rank), "ternary_2bit": lambda: ternary_step(rank, "2bit"),
        "ternary_shared_2bit": lambda: ternary_step(rank, "2bit", True),
        "ternary_two_phase": lambda: ternary_step(rank, "base3", True, "two_phase"),
        "ternary_two_phase_2bit": lambda: ternary_step(rank, "2bit", True, "two_phase"),
        "topk_fp16": lambda: topk_step(0.05), "topk_fp32": lambda: topk_step(0.05, "fp32"),
        "topk_no_ef": lambda: topk_step(0.3),
    }
    if key == "adaptive":
        assert len(log) == 3
        return [adaptive_step(path, cf) for path, cf in log]
    return [fixed[key]() for _ in range(3)]


def gradients(step, rank):
    """The worker's gradients (tests/workers/bytes_worker.py)."""
    rng = np.random.default_rng(1000 * step + rank)
    return [rng.standard_normal(n).astype(np.float32) for n in SIZES]


def coded_bounds(key, log, rank=0, seed=None):
    """(fixed bytes of the three steps, [(low, high) payload of the coded part per step], wire of the coded
    part as a multiple of its payload, or None where it is not one); rank and seed: the recording rank's and its
    draws' key, for ternary's entropy-coded payloads."""
    big = [n for n in SIZES if n >= MIN_SIZE]
    small = Step()
    for n in SIZES:
        if n < MIN_SIZE:
            small.allreduce(4 * n)

    def topk_bounds(k_per_tensor, value_bits):
        low = sum(k * value_bits / 8 + k / 8 for n, k in k_per_tensor)
        high = sum(k * value_bits / 8 + k * (math.log2(n / k) + 4) / 8 + 24 for n, k in k_per_tensor)
        return low, high

    if key == "ternary_entropy":  # the reference coder's payloads for the worker's gradients and key, exactly
        coded = [sum(len(terngrad.encode(g, 2.5, "entropy", seed=seed, step=step, tensor=tensor_key(f"w{i}"),
                                         rank=rank).tobytes())
                     for i, g in enumerate(gradients(step, rank)) if g.size >= MIN_SIZE) for step in range(3)]
        return [small] * 3, [(c, c) for c in coded], NRANKS - 1
    if key == "ternary_two_phase_entropy":
        small.payload += 4 * len(big)
        small.wire += scale_sharing_bytes(len(big), NRANKS)
        fixed = TwoPhasePlan(big, NRANKS, "base3")
        return [small] * 3, [(0.3 * fixed.payload_bytes(0), fixed.payload_bytes(0))] * 3, None
    if key.startswith("topk_delta"):
        bits = 1 if key.endswith("ternary") else 16
        k = [(n, k_of(n, 20)) for n in SIZES]
        return [Step()] * 3, [topk_bounds(k, bits)] * 3, NRANKS - 1
    if key == "adaptive_delta":
        fixed, coded = [], []
        for path, cf in log:
            step = Step()
            step.allreduce(32)
            if path == "dense":
                step.allreduce(4 * sum(SIZES))
                coded.append((0, 0))
            else:
                coded.append(topk_bounds([(n, k_of(n, cf)) for n in SIZES], 16))
            fixed.append(step)
        return fixed, coded, None
    return None


@pytest.fixture(scope="module", params=["torch", "tf"])
def reported(request):
    results, _ = horovodrun(2, "tests/workers/bytes_worker.py", request.param, timeout=400)
    return request.param, results


def test_compression_stats_bytes_equal_the_plan(reported):
    framework, results = reported
    for r in results:
        for key, got in r["results"].items():
            mode, _, config = key.rpartition("/")
            join_check = config not in ("none", "fp16") and mode != "graph"  # eager only (join.py)
            if coded_bounds(config, got["log"], r["rank"], got["seed"]) is not None:
                check_coded(framework, key, r, got, join_check)
                continue
            steps = expected_steps(config, r["rank"], [tuple(e) for e in got["log"]])
            payload = [s.payload + (JOIN_CHECK_BYTES if join_check else 0) for s in steps]
            wire = [s.wire + (join_check_wire_bytes(NRANKS) if join_check else 0) for s in steps]
            where = (framework, key, r["rank"])
            assert got["steps"] == 3, where
            assert got["total"]["payload_bytes"] == sum(payload), (where, got["total"], payload)
            assert got["last_step"]["payload_bytes"] == payload[-1], (where, got["last_step"], payload)
            assert got["total"]["wire_bytes"] == pytest.approx(sum(wire)), (where, got["total"], wire)
            assert got["last_step"]["wire_bytes"] == pytest.approx(wire[-1]), where
            dense = 4 * sum(SIZES)
            assert got["total"]["dense_bytes"] == 3 * dense and got["total"]["elements"] == 3 * sum(SIZES), where
            assert got["total"]["dense_wire_bytes"] == pytest.approx(3 * allreduce_wire_bytes(dense, NRANKS)), where


def check_coded(framework, key, r, got, join_check):
    """The coded configs: fixed parts exactly, the coded part within its coding's bounds (every step's, through
    the last step and the total), its wire bytes (N-1) times its payload where it goes by allgather alone."""
    config = key.rpartition("/")[2]
    fixed, coded, wire_factor = coded_bounds(config, [tuple(e) for e in got["log"]], r["rank"], got["seed"])
    join = (JOIN_CHECK_BYTES, join_check_wire_bytes(NRANKS)) if join_check else (0, 0)
    where = (framework, key, r["rank"])
    assert got["steps"] == 3, where
    for part, steps in (("last_step", [-1]), ("total", [0, 1, 2])):
        payload = got[part]["payload_bytes"] - sum(fixed[i].payload + join[0] for i in steps)
        low, high = sum(coded[i][0] for i in steps), sum(coded[i][1] for i in steps)
        assert low <= payload <= high, (where, part, payload, low, high)
        if wire_factor is not None:
            wire = got[part]["wire_bytes"] - sum(fixed[i].wire + join[1] for i in steps)
            assert wire == pytest.approx(wire_factor * payload), (where, part)


def test_adaptive_log_covers_compressed_and_dense_paths(reported):
    """The adaptive config moves (window 1): its bytes were checked above on more than one CF."""
    _, results = reported
    for r in results:
        for key, got in r["results"].items():
            if key.endswith("adaptive") or key.endswith("adaptive_delta"):
                assert len({cf for _, cf in got["log"]}) >= 2, got["log"]
