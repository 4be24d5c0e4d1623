"""Elastic training for real: `horovodrun --gloo -np 2 --min-np 1 --max-np 3 --host-discovery-script` on this machine,
every method of the torch test in one job. A worker is SIGKILLed while its step's collectives are in flight (N: 2 -> 1,
the survivor rolls back to the last commit), then two are added (N: 1 -> 3: the killed host after Horovod's blacklist
cooldown, and a third name of this machine). Every rank that ends must hold identical parameters, the expected steps and
commits, the statistics of exactly the steps trained (rolled-back steps redone, not counted twice), and bytes per step
of the plan for the final N (two-phase's chunks, sparse_reduce's regions rebuilt for 3 ranks)."""
import math
import os

import pytest

from hvdrun import failure_report, horovodrun_elastic, third_host

WORKER = os.path.join("tests", "workers", "elastic_worker.py")
KERAS_WORKER = os.path.join("tests", "workers", "elastic_keras_worker.py")
STEPS, KILL_AT, ADD_AT, COMMIT_EVERY = 60, 23, 35, 5
METHODS = ["ternary", "topk", "topk_sparse_reduce", "adaptive_topk", "async_lsgd", "diloco", "streaming_diloco",
           "auto"]
DILOCO_INNER_STEPS = 4  # tests/workers/elastic_worker.py's
# streaming_diloco (elastic_worker.STREAMING): a fragment exchange starts every 5 steps and lands 2 steps later;
# the one started at the last step is still in flight
STREAMING_ROUNDS = STEPS // 5 - 1


@pytest.fixture(scope="module")
def every_method():
    """One elastic job trains every method's model in lockstep (tests/workers/elastic_worker.py): one kill, one
    addition, every method through the same resets."""
    if third_host() is None:
        pytest.skip("this machine has no third local name for a host")
    return horovodrun_elastic(WORKER, ",".join(METHODS), STEPS, KILL_AT, ADD_AT, COMMIT_EVERY, timeout=480)


@pytest.mark.parametrize("method", METHODS)
def test_worker_killed_and_added(every_method, method):
    results, output = every_method
    where = f"{method}:\n{failure_report(output, 3000)}"
    assert [r["rank"] for r in results] == [0, 1, 2], where
    assert {r["started_on"] for r in results} == {"localhost", "127.0.0.1", third_host()}, where
    survivor = next(r for r in results if r["started_on"] == "localhost")
    # the failure rolled back to the commit before KILL_AT at N = 1; the added hosts reset at ADD_AT's commit, N = 3
    assert [(step, size) for step, size, _ in survivor["resets"]] == \
        [(KILL_AT // COMMIT_EVERY * COMMIT_EVERY, 1), (ADD_AT, 3)], where
    # a reset's names are new (a name left in Horovod's queue by the failure cannot collide); the added ranks use
    # the survivor's last generation
    periods = survivor["names"]
    assert sorted(periods) == ["0", "1", "2"], where
    assert all(not set(periods[a]) & set(periods[b]) for a, b in (("0", "1"), ("0", "2"), ("1", "2"))), where
    assert all(r["names"] == {"0": periods["2"]} for r in results if r is not survivor), where
    if method in ("topk", "topk_sparse_reduce", "adaptive_topk", "diloco", "streaming_diloco"):  # as committed
        kept = survivor["methods"][method]["residuals_kept"]
        assert kept and all(kept), where
    for r in results:
        assert (r["size"], r["step"], r["commits"]) == (3, STEPS, STEPS // COMMIT_EVERY), where
        got = r["methods"][method]
        assert got["stats_steps"] == STEPS, where
        assert got["params"] == results[0]["methods"][method]["params"], \
            f"rank {r['rank']} ended with other parameters; {where}"
        assert math.isfinite(sum(got["params"])) and got["accuracy"] > 0.5, where
    if method == "diloco":  # every inner_steps-th step an outer round, rolled-back rounds redone once
        assert all(r["methods"][method]["outer_rounds"] == STEPS // DILOCO_INNER_STEPS for r in results), where
    if method == "streaming_diloco":  # the rollback's commit (step 20) and the addition's (35) had one in flight
        assert all(r["methods"][method]["outer_rounds"] == STREAMING_ROUNDS for r in results), where
    if method == "ternary":  # two-phase's chunks and level codes for N = 3
        for r in results:
            got = r["methods"][method]
            assert got["transport"] == "two_phase" and got["last_wire_bytes"] == pytest.approx(
                got["planned_wire_bytes"]), where
    if method == "auto":  # the link measured again, and the choice taken again, for N = 3; the same on every rank
        assert all(r["methods"][method]["link_ranks"] == 3 for r in results), where
        assert all(r["methods"][method]["choice"] == results[0]["methods"][method]["choice"] for r in results), where
    if method == "topk_sparse_reduce":  # regions rebalanced for N = 3 (N + 1 bounds)
        assert all(r["methods"][method]["transport"] == "sparse_reduce"
                   and r["methods"][method]["region_bounds"] == 4 for r in results), where


@pytest.mark.skipif(third_host() is None, reason="this machine has no third local name for a host")
def test_launcher_runs_an_unmodified_elastic_script():
    """Horovod's elastic idiom in plain horovod.torch (hvd.elastic.TorchState, @hvd.elastic.run), compressed by
    `python -m horovod_ext.run --compression topk`: the same fault survived, the same ends."""
    results, output = horovodrun_elastic("-m", "horovod_ext.run", "--compression", "topk", "--compression-arg",
                                         "ratio=0.05", WORKER, "horovod", STEPS, KILL_AT, ADD_AT, COMMIT_EVERY,
                                         timeout=240)
    where = failure_report(output, 3000)
    assert [r["rank"] for r in results] == [0, 1, 2], where
    survivor = next(r for r in results if r["started_on"] == "localhost")
    kept = survivor["methods"]["horovod"]["residuals_kept"]
    assert kept and all(kept), where
    for r in results:
        got = r["methods"]["horovod"]
        assert (r["size"], r["step"], got["stats_steps"], got["transport"]) == (3, STEPS, STEPS, "allgather"), where
        assert got["params"] == results[0]["methods"]["horovod"]["params"], where

@pytest.mark.skipif(third_host() is None, reason="this machine has no third local name for a host")
@pytest.mark.parametrize("method", ["topk", "lsgd", "easgd", "diloco"])
def test_keras_fit_worker_killed_and_added(method):
    """Horovod's elastic Keras pattern (KerasState and its three callbacks) with top-k, multi-leader LSGD, EASGD
    and DiLoCo: the survivor rolls back to its last commit at N = 1, two ranks join at N = 3, and every rank ends
    the epochs with identical weights (LSGD: the elected leader's; EASGD: the center, which the added ranks
    received; DiLoCo: the outer parameters) and as many optimizer steps as iterations (no rolled-back step
    counted twice)."""
    epochs, per_epoch, kill_at, add_at = 6, 10, 23, 35
    results, output = horovodrun_elastic(KERAS_WORKER, epochs, per_epoch, kill_at, add_at, method, timeout=300)
    where = f"{method}:\n{failure_report(output, 3000)}"
    assert [r["rank"] for r in results] == [0, 1, 2], where
    survivor = next(r for r in results if r["started_on"] == "localhost")
    assert [size for _, _, size in survivor["resets"]] == [1, 3], where
    for r in results:
        assert (r["size"], r["epoch"]) == (3, epochs), where
        # Keras 3 fixes an epoch's steps when fit() starts, so the epoch a reset interrupts is trained again
        # from its start: at least epochs * per_epoch iterations, the same on every rank
        assert r["iterations"] == results[0]["iterations"] >= epochs * per_epoch, where
        assert r["aggregator_steps"] == r["iterations"], where
        assert r["params"] == results[0]["params"], f"rank {r['rank']} ended with other weights; {where}"
        assert r["accuracy"] > 0.5, where


def test_generation_is_the_largest_proposal_and_renames_from_the_first_reset(monkeypatch):
    from horovod_ext.compression import generation
    monkeypatch.setattr(generation, "_known", 0)
    assert generation.named("hvdext.topk.w", 0) == "hvdext.topk.w"  # without a reset the names are Horovod's
    generation.advance()
    assert generation.proposal() == 1
    assert generation.agreed([3, 1, 0]) == 3 and generation.proposal() == 3  # an added rank proposes 0
    assert generation.agreed([0, 0]) == 0 and generation.proposal() == 3  # never back to a name it may hold
    assert generation.named("hvdext.topk.w", 3) == "g3.hvdext.topk.w"


def test_a_stale_name_resets_under_elastic_mode_only(monkeypatch):
    from horovod.common.exceptions import HorovodInternalError
    from horovod_ext.compression import generation
    stale = ValueError("Requested to allreduce a tensor with the " + generation.DUPLICATE_NAME + ".")

    def enqueue(error):
        with generation.stale_names_reset():
            raise error

    monkeypatch.setattr(generation, "ELASTIC", True)
    with pytest.raises(HorovodInternalError, match="left in Horovod's queue"):
        enqueue(stale)
    with pytest.raises(ValueError, match="dtype"):
        enqueue(ValueError("wrong dtype"))
    monkeypatch.setattr(generation, "ELASTIC", False)
    with pytest.raises(ValueError, match="same name"):
        enqueue(stale)
