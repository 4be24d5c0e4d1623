"""transport="sparse_reduce" (horovod_ext/compressors/transports/sparse_reduce.py) under horovodrun -np 2, 3
(unequal regions) and 4 (two "nodes"): bit for bit against the NumPy reference
(python/hvdext_reference/sparse_reduce.py), exact mass conservation, a checkpoint resumed bit for bit, the bytes bound
under adversarial index distributions, and errors raised on every rank."""
import base64
import functools
import importlib.util
import math
import os

import numpy as np
import pytest

from hvdext_reference import sparse_reduce as ref
from hvdext_reference.topk import k_of
from hvdrun import assert_error_cases, horovodrun

HERE = os.path.dirname(os.path.abspath(__file__))
HOSTS = {2: "localhost:2", 3: "localhost:3", 4: "localhost:2,127.0.0.1:2"}


def worker_module():
    spec = importlib.util.spec_from_file_location("sparse_reduce_worker",
                                                  os.path.join(HERE, "workers", "sparse_reduce_worker.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def decoded(text):
    return np.frombuffer(base64.b64decode(text), dtype=np.float32)


def split(flat, sizes):
    return np.split(flat, np.cumsum(sizes)[:-1])


def reference_run(worker, nranks, settings, records):
    """The reference over the recorded steps: (avg per step, residuals per step per rank, wire bytes per step per
    rank). GraVAC's k per step is taken from the step's recorded decision (its controller has its own tests)."""
    sizes = worker.SIZES
    residuals = [[np.zeros(n, np.float32) for n in sizes] for _ in range(nranks)]
    every = settings["rebalance_every"]
    vdt = settings.get("value_dtype", "fp16")
    bounds, age = None, 0
    out = []
    for step, record in enumerate(records):
        if "ratio" in settings:
            ks = [k_of(n, 1 / settings["ratio"]) for n in sizes]
        else:
            ks = [min(k_of(n, record["cf"]), k_of(n, record["theta_min"])) for n in sizes]
        g_ef = [[g + r for g, r in zip(worker.gradients(step, rank), residuals[rank])] for rank in range(nranks)]
        total = sum(sizes)
        rebalance = bounds is None or age >= every
        if rebalance:
            bounds, age = ref.refresh_bounds([ref.selection(t, ks)[0] for t in g_ef], total), 0
        age += 1
        avg, new_residuals, phase1, phase2 = ref.step(g_ef, ks, bounds, vdt)
        # exact conservation: per rank, applied + residual == g_ef bit for bit, hence summed over ranks exactly
        for rank in range(nranks):
            flat = np.concatenate(g_ef[rank])
            applied = np.where(avg != 0, flat - new_residuals[rank], 0).astype(np.float32)
            assert np.array_equal(applied + new_residuals[rank], flat)
            assert np.array_equal(flat - applied, new_residuals[rank])  # nothing rounded away
        sent = sum(np.where(avg != 0, np.concatenate(g_ef[r]) - new_residuals[r], 0).astype(np.float64)
                   for r in range(nranks))
        np.testing.assert_allclose(avg.astype(np.float64) * nranks, sent, rtol=2 ** -10, atol=1e-30)
        residuals = [split(r, sizes) for r in new_residuals]
        wire = [ref.wire_bytes(phase1, phase2, rank) for rank in range(nranks)]
        out.append((avg, new_residuals, wire, rebalance))
    return out


# the worker's modes each launch runs in turn: one launch per rank count (TensorFlow's runs alone)
MODES = {2: "exact,errors", 3: "exact,adversarial", 4: "exact,adversarial"}


@functools.lru_cache(maxsize=None)
def launched(np_):
    results, _ = horovodrun(np_, "tests/workers/sparse_reduce_worker.py", MODES[np_], hosts=HOSTS[np_], timeout=600)
    return results


def records(np_, mode):
    """Every rank's record of one mode of the launch at np_ ranks."""
    return [{**r[mode], "size": r["size"]} for r in launched(np_)]


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_sparse_reduce_matches_reference_bit_for_bit(np_):
    assert_exact_run(records(np_, "exact"), np_)


def assert_exact_run(results, np_):
    """Every rank's "exact" record (sparse_reduce_worker.exact) equals the NumPy reference bit for bit, counts the
    reference's bytes, and its resumed run continues the uninterrupted one."""
    worker = worker_module()
    for label, (_, settings) in worker.CONFIGS.items():
        records = results[0][label]["steps"]
        assert all(r[label]["transport"] == "sparse_reduce" for r in results)
        expected = reference_run(worker, np_, settings, records)
        compared = 0
        for step, (avg, residuals, wire, rebalance) in enumerate(expected):
            if records[step]["path"] == "dense":
                continue  # GraVAC's dense path is Horovod's allreduce, not this transport
            compared += 1
            for rank, result in enumerate(results):
                got = result[label]["steps"][step]
                assert np.array_equal(np.concatenate([decoded(a) for a in got["avg"]]), avg), (label, step, rank)
                assert np.array_equal(np.concatenate([decoded(r) for r in got["residuals"]]), residuals[rank]), \
                    (label, step, rank)
                extra = 2 * (np_ - 1) / np_ * 8 * (np_ - 1) if rebalance else 0.0  # the rebalance allreduce
                counted = got["wire_bytes"] - extra - small_tensor_bytes(worker, np_, label)
                assert abs(counted - wire[rank]) < 1e-6, (label, step, rank, got["wire_bytes"], wire[rank])
        assert compared >= 3, label
        if label == "adaptive":
            continue  # GraVAC's decisions read measured step times: its resume is tested in test_gravac.py
        for rank, result in enumerate(results):  # checkpointed after 3 steps, resumed in a new optimizer
            resumed = result[label]["resumed"]
            assert resumed == [s["avg"] for s in result[label]["steps"][3:]], (label, rank)


def small_tensor_bytes(worker, nranks, label):
    """Bytes a step counts beside the transport: the payload compressors' join check (an allreduce of one int32)
    and GraVAC's allreduce of norms."""
    from horovod_ext.compression.join import join_check_wire_bytes
    from horovod_ext.compressors.gravac import NORM_BYTES
    from horovod_ext.compression.wire import allreduce_wire_bytes
    extra = join_check_wire_bytes(nranks)
    if label == "adaptive":
        extra += allreduce_wire_bytes(NORM_BYTES, nranks)
    return extra


@pytest.mark.parametrize("np_", [3, 4])
def test_sparse_reduce_bytes_within_oktopk_bound_for_adversarial_indices(np_):
    """Every kept index in one region of one tensor (step 0 balanced on it; step 1 with stale regions: all in the
    last region): a rank sends at most 2K + 2 ceil(K/P) (P-1) words, within Ok-Topk's 6K(P-1)/P."""
    worker = worker_module()
    results = records(np_, "adversarial")
    from horovod_ext.compression.join import join_check_wire_bytes
    k = k_of(worker.ADVERSARIAL, 1 / 0.005)
    for result in results:
        for label, value_bytes in (("fp16", 2), ("fp32", 4)):
            for step, record in enumerate(result[label]):
                wire = record["wire_bytes"] - join_check_wire_bytes(np_)
                if step == 0:
                    wire -= 2 * (np_ - 1) / np_ * 8 * (np_ - 1)  # the rebalance
                bound_words = 6 * k * (np_ - 1) / np_
                assert wire <= 4 * bound_words, (label, step, wire, bound_words)
                # tighter: what the coded pairs can cost at most (32-bit gap codes + values, and frame headers)
                pairs = k + math.ceil(k / np_) * (np_ - 1)
                assert wire <= pairs * (4 + value_bytes) + 40 * np_, (label, step, wire)


def test_sparse_reduce_errors_raise_on_every_rank():
    results = records(2, "errors")
    for record in results:
        assert_error_cases(record, {
            "nan": ("FloatingPointError", ["'w2'"]),
            "transport_differs": ("SettingsMismatchError", ["transport='allgather'"]),
            "rebalance_differs": ("SettingsMismatchError", ["rebalance_every=3"]),
            "bad_transport": ("ValueError", ["topk transport", "sparse_reduce"]),
            "ternary_values": ("ValueError", ["sparse_reduce", "value_dtype"]),
            "corrupted_chunk": ("ValueError", ["rank 0 received a corrupted top-k payload",
                                               "sparse_reduce"]),
        })


def test_rebalanced_regions_hold_equal_shares_of_every_ranks_selection():
    """The quantile rule on skewed selections: every region holds about K/P of each rank's entries (exactly
    floor-spaced when the ranks' selections coincide), so the alltoall is balanced."""
    rng = np.random.default_rng(3)
    total, nranks, kept = 100000, 4, 1000
    hot = rng.choice(total // 10, size=3 * kept, replace=False)  # every rank's indices in the first tenth
    selections = [np.sort(rng.choice(hot, size=kept, replace=False)) for _ in range(nranks)]
    bounds = ref.refresh_bounds(selections, total)
    assert bounds[0] == 0 and bounds[-1] == total and bounds == sorted(bounds)
    for positions in selections:
        counts = np.histogram(positions, bins=bounds)[0]
        assert counts.min() >= 0.8 * kept / nranks and counts.max() <= 1.2 * kept / nranks, counts
    same = [selections[0]] * nranks
    counts = np.histogram(selections[0], bins=ref.refresh_bounds(same, total))[0]
    assert list(counts) == [kept // nranks] * nranks


def test_tensorflow_sparse_reduce_matches_reference_eager_and_in_a_graph():
    worker = worker_module()
    results = [{**r["tf"], "size": r["size"]} for r in horovodrun(3, "tests/workers/sparse_reduce_worker.py", "tf",
                                                                   hosts=HOSTS[3], timeout=420)[0]]
    for key, run in results[0].items():
        if key == "size":
            continue
        label = key.split("/")[1]
        expected = reference_run(worker, 3, worker.CONFIGS[label][1], run["steps"])
        for rank, result in enumerate(results):
            assert result[key]["transport"] == "sparse_reduce"
            for step, (avg, _, _, _) in enumerate(expected):
                got = np.concatenate([decoded(a) for a in result[key]["steps"][step]["avg"]])
                assert np.array_equal(got, avg), (key, step, rank)


@pytest.mark.parametrize("value_dtype", ["fp16", "fp32"])
def test_region_kernels_write_the_reference_bytes(value_dtype):
    """Phase 1's payloads over tensors read in place as one index space (one payload per region, an empty region
    and empty payloads included) are the reference's "delta" payloads byte for byte; phase 2's decode places each
    region at its offset across the tensors; the residual is g_ef - sent exactly where the entry was applied."""
    import torch
    from hvdext_reference import topk as ref_topk
    from horovod_ext.compressors.topk import VALUE_DTYPE_IDS
    from horovod_ext.torch_common.kernels import TorchKernels as K

    rng = np.random.default_rng(5)
    g = (rng.standard_t(3, 5000) * 1e-2).astype(np.float32)
    pieces = [1000, 2500, 1500]  # tensors; the regions cut across them
    idx = np.sort(rng.choice(np.arange(1200, 5000), size=300, replace=False)).astype(np.int32)  # none below 1200
    bounds = [0, 0, 1200, 3000, 5000]  # an empty region, and a region with no selected index
    flats = [torch.from_numpy(part.copy()) for part in split(g, pieces)]
    vtype = VALUE_DTYPE_IDS[value_dtype]
    payload, region_bytes = K.topk_encode_regions(flats, torch.from_numpy(idx), bounds, vtype)
    assert np.array_equal(torch.cat(flats).numpy(), g)  # only read
    vdt = ref_topk.VALUE_DTYPES[value_dtype]
    expected = []
    for lo, hi in zip(bounds, bounds[1:]):
        inside = idx[(idx >= lo) & (idx < hi)]
        expected.append(ref_topk.encode_delta(inside - lo, g[inside].astype(vdt), hi - lo, value_dtype))
    assert region_bytes == [p.size for p in expected]
    assert payload.numpy().tobytes() == b"".join(p.tobytes() for p in expected)
    sent = np.zeros_like(g)
    sent[idx] = g[idx].astype(vdt).astype(np.float32)
    into = [torch.full((n,), 7.0) for n in pieces[:2]] + [None]
    averages = K.topk_decode_regions(payload, bounds, 4.0, pieces, into)
    assert averages[0] is into[0] and averages[1] is into[1]
    assert np.array_equal(torch.cat(averages).numpy(), sent / np.float32(4.0))
    with pytest.raises(ValueError, match="rank 3 is truncated"):
        K.topk_decode_regions(payload[:-1], bounds, 1.0, pieces, [None] * 3)
    # keep: only the applied entries (here: every other one) keep their remainder
    applied = [a.clone() for a in averages]
    dropped = idx[::2]
    flat_applied = torch.cat(applied)
    flat_applied[torch.from_numpy(dropped.astype(np.int64))] = 0.0
    applied = list(torch.split(flat_applied, pieces))
    residuals = K.topk_keep_applied(flats, applied, torch.from_numpy(idx), vtype)
    expect = g.copy()
    kept = idx[1::2]
    expect[kept] = g[kept] - sent[kept] if value_dtype == "fp16" else 0.0
    assert residuals[0] is flats[0] and np.array_equal(torch.cat(residuals).numpy(), expect)


def test_auto_takes_sparse_reduce_where_it_plans_clearly_and_substantially_fewer_bytes():
    from horovod_ext.compressors.transports.sparse_reduce import choose_transport, planned_bytes

    big = [1 << 22, 1 << 22, 1 << 20, 4096, 64]  # about 9.5M parameters
    assert choose_transport("auto", big, 100, 2) == "allgather"  # about the same bytes, one collective fewer
    assert choose_transport("auto", big, 100, 3) == "allgather"  # it saves 190 KB per step: under 256 KB
    for nranks in (4, 64, 1024):
        assert choose_transport("auto", big, 100, nranks) == "sparse_reduce"
        plan = planned_bytes(big, 100, nranks)
        assert plan["sparse_reduce"] < plan["allgather"]
    small = [65536, 256, 2560, 10]  # the digits MLP's size: a few KB saved per step, not worth a second round
    assert choose_transport("auto", small, 10, 4) == "allgather"
    assert choose_transport("auto", small, 10, 64) == "sparse_reduce"  # there allgather's bytes have grown 60x
    assert choose_transport("allgather", big, 100, 64) == "allgather"
    assert choose_transport("sparse_reduce", big, 100, 2) == "sparse_reduce"
    # sparse_reduce's bytes per rank level off at about 2K pairs (from K at 2 ranks: 2 (P-1)/P), allgather's grow
    # linearly; beyond, P frame headers per step add up where K is small
    for nranks, most in ((64, 2.1), (1024, 3.0)):
        growth = planned_bytes(big, 100, nranks)["sparse_reduce"] / planned_bytes(big, 100, 2)["sparse_reduce"]
        assert growth < most, (nranks, growth)


def test_regions_rebalance_when_due_and_when_held_for_another_job():
    from horovod_ext.compressors.transports.sparse_reduce import Regions

    regions = Regions(every=2)
    assert regions.due(100, 4)  # none yet
    regions.store(1, 0, 10, 50, 70, 100)
    assert not regions.due(100, 4)
    regions.store(0, *regions.current())
    assert regions.due(100, 4)  # every 2 sparse steps
    regions.store(1, 0, 10, 50, 70, 100)
    assert regions.due(100, 2) and regions.due(120, 4)  # another number of ranks, another model
    restored = Regions(every=2)
    restored.load_state(regions.state())
    assert restored.current() == regions.current() and restored.age == regions.age
    restored.load_state(None)
    assert restored.due(100, 4)


@pytest.mark.parametrize("quota", [1, 40, 1000])
def test_owner_sums_in_rank_order_and_keeps_the_largest_received(quota):
    """topk_reduce_region: the N payloads summed at the positions received (cancellations included), the top
    min(q, received) sums coded as the reference's payload; a corrupted payload gives the marker payload."""
    import torch
    from hvdext_reference import topk as ref_topk
    from horovod_ext.torch_common.kernels import TorchKernels as K

    rng = np.random.default_rng(11)
    n, payloads, sums, seen = 3000, [], np.zeros(3000, np.float32), np.zeros(3000, bool)
    for rank in range(3):
        idx = np.sort(rng.choice(n // 2, size=200, replace=False))  # overlapping positions
        values = rng.standard_normal(200).astype(np.float16)
        if rank == 2:
            values[:5] = -sums[idx[:5]].astype(np.float16)  # some sums cancel, or nearly
        payloads.append(ref_topk.encode_delta(idx, values, n, "fp16"))
        sums += ref_topk.decode_average_delta(payloads[-1], 1, n, 1.0)
        seen[idx] = True
    received = np.flatnonzero(seen)
    keep = ref_topk.select(sums, min(quota, received.size), candidates=received)
    expected = ref_topk.encode_delta(keep, sums[keep].astype(np.float16), n, "fp16")
    got = K.topk_reduce_region(torch.from_numpy(np.concatenate(payloads)), 3, n, quota, 0)
    assert got.numpy().tobytes() == expected.tobytes()
    broken = np.concatenate(payloads)
    broken[len(broken) // 2] ^= 0x20
    marker = K.topk_reduce_region(torch.from_numpy(broken), 3, n, quota, 0)
    with pytest.raises(ValueError, match="rank 0 received a corrupted top-k payload"):
        K.topk_decode_regions(marker, [0, n], 1.0, [n], [None])
