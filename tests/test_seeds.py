"""Issue 48: a seeded script repeats itself. With every compressor at its defaults (seed=None), the draws' key is
rank 0's script seed (torch.initial_seed(), TensorFlow's global seed; compression/consistency.seed_proposal), so two
runs of tests/workers/seed_worker.py with the same seed end on the same bits on every rank, and a different seed
gives different draws (dense, which draws nothing, stays the same). Two launches: seeds 11 then 12, and 11 again;
and two at 4 ranks without tensor fusion, under two cycle times."""
import functools
import random

import pytest

from hvdrun import horovodrun
from horovod_ext.compression.consistency import seed_proposal

DRAWING = ("torch/ternary", "torch/powersgd", "keras/ternary", "keras/powersgd")


@functools.lru_cache(maxsize=None)
def launch(*seeds):
    """Every rank's records of one launch of the seeded script, by seed: [{method: {digest, seed}}] by rank."""
    results, _ = horovodrun(2, "tests/workers/seed_worker.py", *seeds, timeout=400)
    return [{int(k): v for k, v in r.items() if k != "rank"} for r in results]


def runs(launched, seed):
    return [per_rank[seed] for per_rank in launched]


@pytest.mark.parametrize("method", ("torch/none",) + DRAWING + ("keras/none",))
def test_two_runs_of_a_seeded_script_end_on_the_same_bits(method):
    first, second = runs(launch(11, 12), 11), runs(launch(11), 11)
    for rank in range(2):
        assert first[rank][method]["digest"] == second[rank][method]["digest"], (rank, method)
        assert first[rank][method]["digest"] == first[0][method]["digest"], (rank, method)  # ranks alike
    if method in DRAWING:
        assert first[0][method]["seed"] == 11  # the key is the script's seed


def test_another_seed_gives_other_draws_and_the_same_dense_run():
    one, other = runs(launch(11, 12), 11), runs(launch(11, 12), 12)
    for method in DRAWING:
        assert other[0][method]["seed"] == 12
        assert one[0][method]["digest"] != other[0][method]["digest"], method
    for method in ("torch/none", "keras/none"):
        assert one[0][method]["digest"] == other[0][method]["digest"], method


@pytest.mark.parametrize("method", ("none", "ternary", "powersgd"))
def test_four_ranks_repeat_under_other_timing_without_tensor_fusion(method):
    """At 3 or more ranks a float sum's order is the ring's: Horovod fuses the tensors that are ready in the same
    cycle into one buffer, and where a tensor falls in that buffer decides which rank starts its sum, so with
    fusion the bits follow the timing (README, "Same seed, same model"). Without fusion
    (HOROVOD_FUSION_THRESHOLD=0) every sum's order is fixed by its own tensor, and the same seeded script repeats
    itself bit for bit at 4 ranks (two nodes) under a 0.1 ms and a 20 ms cycle: horovod_ext's own collectives
    (dense tensors, ternary's payloads and scales, PowerSGD's P and Q) add nothing that reads time."""
    fast, slow = launch_four("0.1"), launch_four("20")
    name = f"torch/{method}"
    for rank in range(4):
        assert fast[rank][name]["digest"] == slow[rank][name]["digest"], (rank, name)
        assert fast[rank][name]["digest"] == fast[0][name]["digest"], (rank, name)


@functools.lru_cache(maxsize=None)
def launch_four(cycle_ms):
    results, _ = horovodrun(4, "tests/workers/seed_worker.py", 11, timeout=400,
                            env={"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CYCLE_TIME": cycle_ms,
                                 "SEED_WORKER_FRAMEWORKS": "torch"})
    return [r["11"] for r in results]


def test_the_proposal_is_the_script_seed_and_varies_when_there_is_none():
    assert seed_proposal(7) == 7 and seed_proposal(2 ** 64 - 1) == 2 ** 63 - 1 and seed_proposal(-1) == 2 ** 63 - 1
    random.seed(0)  # the operating system's draw does not read Python's seeded generator
    drawn = {seed_proposal(None) for _ in range(4)}
    assert len(drawn) == 4 and all(0 <= s < 2 ** 63 for s in drawn)
