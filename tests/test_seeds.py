"""Issue 48: a seeded script repeats itself. With every compressor at its defaults (seed=None), the draws' key is
rank 0's script seed (torch.initial_seed(), TensorFlow's global seed; compression/consistency.seed_proposal), so two
runs of tests/workers/seed_worker.py with the same seed end on the same bits on every rank, and a different seed
gives different draws (dense, which draws nothing, stays the same). Two launches: seeds 11 then 12, and 11 again."""
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


def test_the_proposal_is_the_script_seed_and_varies_when_there_is_none():
    assert seed_proposal(7) == 7 and seed_proposal(2 ** 64 - 1) == 2 ** 63 - 1 and seed_proposal(-1) == 2 ** 63 - 1
    random.seed(0)  # the operating system's draw does not read Python's seeded generator
    drawn = {seed_proposal(None) for _ in range(4)}
    assert len(drawn) == 4 and all(0 <= s < 2 ** 63 for s in drawn)
