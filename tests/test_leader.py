"""LeaderOptimizer (LSGD, multi-leader LSGD) and ElasticAveragingOptimizer (EASGD): the framework-free schedule,
groups and election against the NumPy reference, and PyTorch under horovodrun for real (2 ranks, and 4 ranks as
two "nodes" of 2), each launch bounded by a timeout. The worker is tests/workers/leader_worker.py."""
import math

import numpy as np
import pytest

from hvdext_reference import lsgd as ref
from horovod_ext.consensus import LeaderSync, ElasticSync, check_groups, resolve_groups
from digits import digits_at_four_ranks, digits_at_two_ranks
from hvdrun import assert_error_cases, horovodrun


# --------------------------------------------------------------------------------------- framework-free parts
def test_reference_pull_is_the_convex_combination():
    rng = np.random.default_rng(0)
    x, leader, best = rng.normal(size=(3, 50))
    out = ref.leader_pull(x, [(0.1, leader), (0.2, best)])
    np.testing.assert_allclose(out, 0.7 * x + 0.1 * leader + 0.2 * best, rtol=1e-14, atol=1e-15)
    one = ref.leader_pull(x, [(0.25, leader)])
    np.testing.assert_allclose(np.linalg.norm(one - leader) / np.linalg.norm(x - leader), 0.75, rtol=1e-14)
    assert np.array_equal(ref.leader_pull(leader, [(0.25, leader)]), leader)


def test_reference_easgd_spread_shrinks_by_one_minus_alpha():
    rng = np.random.default_rng(1)
    workers, center = list(rng.normal(size=(4, 30))), rng.normal(size=30)
    spread = np.linalg.norm(workers - np.mean(workers, axis=0))
    new, new_center = ref.easgd_round(workers, center, 0.8)
    np.testing.assert_allclose(np.linalg.norm(new - np.mean(new, axis=0)), (1 - 0.2) * spread, rtol=1e-12)
    np.testing.assert_allclose(new_center, 0.2 * center + 0.8 * np.mean(workers, axis=0), rtol=1e-12)


def test_schedule_fires_every_period_and_global_period():
    sync = LeaderSync(period=3, global_period=12, groups=[[0, 1], [2, 3]], size=4)
    sync.configure(["a"] * 4, rank=2)
    fired = {step: [level.name for level in sync.levels_in(sync.due(step))] for step in range(1, 25)}
    assert [s for s, names in fired.items() if "group" in names] == list(range(3, 25, 3))
    assert [s for s, names in fired.items() if "global" in names] == [12, 24]
    single = LeaderSync(period=5, groups=None, size=4)
    single.configure(["a"] * 4, rank=0)
    assert [s for s in range(1, 21) if single.due(s)] == [5, 10, 15, 20]
    assert [level.weight for level in single.levels] == [0.1]


def test_election_matches_reference_and_breaks_ties_by_lowest_rank():
    rng = np.random.default_rng(2)
    sync = LeaderSync(period=1, global_period=1, groups=[[0, 2], [1, 3], [4, 5]], size=6)
    sync.configure(["n"] * 6, rank=3)
    for trial in range(50):
        losses = list(rng.integers(0, 3, size=6).astype(float))  # many ties
        counts = list(rng.integers(1, 4, size=6))
        windows = [(loss * c, int(c)) for loss, c in zip(losses, counts)]
        leaders = sync.elect(windows, trial + 1)
        assert leaders["group"] == ref.elect(losses, counts, [1, 3])
        assert leaders["global"] == sync.best_rank == ref.elect(losses, counts, list(range(6)))


def test_election_errors_name_the_ranks():
    sync = LeaderSync(period=2, groups=None, size=3)
    sync.configure(["n"] * 3, rank=0)
    with pytest.raises(FloatingPointError, match=r"rank\(s\) \[1\] during steps 1..2"):
        sync.elect([(1.0, 1), (math.nan, 1), (2.0, 2)], 2)
    with pytest.raises(ValueError, match=r"no training loss reported on rank\(s\) \[2\].*report_loss"):
        sync.elect([(1.0, 1), (1.0, 1), (0.0, 0)], 2)


def test_node_groups_follow_the_hosts():
    assert resolve_groups("node", ["h1", "h1", "h2", "h2"]) == [[0, 1], [2, 3]]
    assert resolve_groups("node", ["b", "a", "b", "a"]) == [[0, 2], [1, 3]]
    assert resolve_groups(None, ["h"] * 3) == [[0, 1, 2]]
    assert check_groups([[3, 2], [1, 0]], 4) == [[0, 1], [2, 3]]


@pytest.mark.parametrize("kwargs, fragment", [
    ({"pull": 1.0}, "pull must be a number in [0, 1)"),
    ({"pull": True}, "pull must be a number"),
    ({"global_pull": -0.5}, "global_pull must be a number in [0, 1)"),
    ({"pull": 0.6, "global_pull": 0.5}, "pull + global_pull must be < 1"),
    ({"period": 0}, "period must be an integer >= 1"),
    ({"period": 4, "global_period": 10}, "global_period must be a multiple of period"),
    ({"groups": [[0, 1], [1, 2, 3]]}, "groups overlap: rank(s) [1]"),
    ({"groups": [[0, 1], [3]]}, "groups leave rank(s) [2] out"),
    ({"groups": [[0, 1], [2, 7]]}, "rank 7 is not a rank of this job (0..3)"),
    ({"groups": [[0, 1], []]}, "a group is empty"),
    ({"groups": "rack"}, 'groups must be "node", None'),
])
def test_leader_arguments_are_checked(kwargs, fragment):
    with pytest.raises(ValueError) as info:
        LeaderSync(size=4, **kwargs)
    assert fragment in str(info.value)


@pytest.mark.parametrize("kwargs, fragment", [({"beta": 0.0}, "beta must be a number in (0, 1)"),
                                              ({"beta": 1.2}, "beta"), ({"period": 2.5}, "period must be")])
def test_elastic_arguments_are_checked(kwargs, fragment):
    with pytest.raises(ValueError) as info:
        ElasticSync(size=4, **kwargs)
    assert fragment in str(info.value)


# ----------------------------------------------------------------------------------------- PyTorch, for real
EXPECTED_ERRORS = {
    "pull_range": ("ValueError", ["pull must be a number in [0, 1)", "1.5", "every rank raises this"]),
    "global_pull_negative": ("ValueError", ["global_pull", "-0.1"]),
    "pull_differs": ("SettingsMismatchError", ["pull: rank 0: 0.1; rank 1: 0.2"]),
    "bad_on_one_rank": ("SettingsMismatchError", ["period: rank 0: 4", ": 0"]),
    "global_period": ("ValueError", ["global_period must be a multiple of period", "global_period=6"]),
    "groups_overlap": ("ValueError", ["groups overlap: rank(s) [1]"]),
    "groups_left_out": ("ValueError", ["groups leave rank(s)", "out"]),
    "groups_differ": ("SettingsMismatchError", ["groups: rank 0:"]),
    "groups_type": ("ValueError", ['groups must be "node", None', "'rack'"]),
    "beta": ("ValueError", ["beta must be a number in (0, 1)"]),
    "nan_loss": ("FloatingPointError", ["NaN or Inf training loss reported on rank(s)", "steps 1..2"]),
    "no_loss": ("ValueError", ["no training loss reported", "report_loss"]),
}


@pytest.fixture(scope="module", params=[2, 4], ids=["np2", "np4-two-nodes"])
def torch_results(request):
    res, _ = horovodrun(request.param, "tests/workers/leader_worker.py", timeout=300)
    assert [r["rank"] for r in res] == list(range(request.param))
    return res


def test_one_pull_is_the_reference_update(torch_results):
    size = len(torch_results)
    for r in torch_results:
        for key in ("pulls_single", "pulls_node"):
            check = r[key]
            assert all(check["close"]) and len(check["close"]) == size, (r["rank"], key)
            assert check["exact"] and all(same for _, same in check["exact"]), (r["rank"], key)  # leader unmoved
            assert check["evaluation_is_best"] and check["restored"], (r["rank"], key)
        single = r["pulls_single"]
        assert single["bitwise"]  # every member received the leader's bits
        assert len(single["ratios"]) == size - 1
        np.testing.assert_allclose(single["ratios"], 0.8, rtol=1e-12)  # shrinks by exactly (1 - pull)


def test_all_ranks_agree_on_groups_and_leaders(torch_results):
    size = len(torch_results)
    want_groups = [[0, 1], [2, 3]] if size == 4 else [[0, 1]]
    for r in torch_results:
        assert r["pulls_node"]["groups"] == want_groups
        assert r["pulls_single"]["best"] == size - 1  # lowest loss: 10 - (r % 2) - 0.1 r
        assert r["tie_break"] == 0  # equal losses: the lowest rank leads
    if size == 4:
        assert [r["pulls_node"]["leaders"]["group"] for r in torch_results] == [1, 1, 3, 3]
        assert {r["pulls_node"]["leaders"]["global"] for r in torch_results} == {3}


def expected_schedule_bytes(s):
    """period 2, global period 4, groups="node": a 16-byte election every 2 steps, the group leader's broadcast
    where a group has more than one member, and at every 4th step the global leader's, unless the group is every
    rank (one host): then the group's broadcast already delivered the global leader's parameters."""
    group_bytes = s["param_bytes"] if max(s["group_sizes"]) > 1 else 0
    global_bytes = s["param_bytes"] if len(s["group_sizes"]) > 1 else 0
    return [0, 16 + group_bytes, 0, 16 + group_bytes + global_bytes] * 2


def test_pulls_fire_exactly_on_schedule(torch_results):
    for r in torch_results:
        s = r["schedule"]
        assert s["payload_per_step"] == expected_schedule_bytes(s)


def test_zero_pull_is_independent_sgd(torch_results):
    assert all(r["independent"] for r in torch_results)


def test_state_dict_restores_leader_bookkeeping(torch_results):
    for r in torch_results:
        s = r["state_dict"]
        assert s["step"] == 3 and s["loss"][1] == 1 and s["same"]
        assert s["best"] == len(torch_results) - 1


def test_easgd_center_is_exact_and_spread_shrinks_geometrically(torch_results):
    for r in torch_results:
        e = r["easgd"]
        assert max(e["center_errors"]) < 1e-15 and max(e["worker_errors"]) < 1e-15
        ratios = np.array(e["spreads"][1:]) / np.array(e["spreads"][:-1])
        np.testing.assert_allclose(ratios, 1 - e["alpha"], rtol=1e-9)
        assert e["center_in_state"]


def test_bad_inputs_raise_on_every_rank_without_hang(torch_results):
    for r in torch_results:
        assert_error_cases(r["bad_inputs"], EXPECTED_ERRORS)
        assert r["bad_inputs"]["alive"] == len(torch_results)


# ------------------------------------------------------------------------------------ TensorFlow / Keras 3, for real
@pytest.fixture(scope="module", params=[2, 4], ids=["np2", "np4-two-nodes"])
def tf_results(request):
    res, _ = horovodrun(request.param, "tests/workers/tf_leader_worker.py", timeout=400)
    assert [r["rank"] for r in res] == list(range(request.param))
    return res


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_tf_pulls_match_the_reference(tf_results, mode):
    size = len(tf_results)
    for r in tf_results:
        for key in (f"pulls_single_{mode}", f"pulls_node_{mode}"):
            check = r[key]
            assert check["close"] == [True] * size, (r["rank"], key)
            assert check["exact"] and all(check["exact"]), (r["rank"], key)
            assert check["best"] == size - 1 and check["evaluation_is_best"] and check["restored"]
        assert r[f"pulls_node_{mode}"]["groups"] == ([[0, 1], [2, 3]] if size == 4 else [[0, 1]])


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_tf_schedule_and_easgd(tf_results, mode):
    for r in tf_results:
        s = r[f"schedule_{mode}"]
        assert s["payload_per_step"] == expected_schedule_bytes(s)
        e = r[f"easgd_{mode}"]
        assert max(e["center_errors"]) < 1e-15 and max(e["worker_errors"]) < 1e-15
        ratios = np.array(e["spreads"][1:]) / np.array(e["spreads"][:-1])
        np.testing.assert_allclose(ratios, 1 - e["alpha"], rtol=1e-9)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_tf_asynchronous_runs_synchronously_with_a_warning(tf_results, mode):
    for r in tf_results:
        a = r[f"asynchronous_{mode}"]
        assert a["equal"] and a["staleness"] == 0
        assert len(a["warnings"]) == 1 and "runs synchronously" in a["warnings"][0] and "no handle" in a["warnings"][0]
        assert a["center_error"] < 1e-15


def test_tf_zero_pull_checkpoint_and_errors(tf_results):
    size = len(tf_results)
    for r in tf_results:
        assert r["independent"]
        assert r["checkpoint"] == {"step": 3, "count": 1.0, "best": size - 1}
        cases = {c["case"]: c for c in r["bad_inputs"]["cases"]}
        assert cases["pull_range"]["type"] == "ValueError" and "pull must be a number in [0, 1)" in \
            cases["pull_range"]["message"]
        assert cases["pull_differs"]["type"] == "SettingsMismatchError"
        assert cases["groups_overlap"]["type"] == "ValueError"
        assert "groups overlap" in cases["groups_overlap"]["message"]
        assert cases["not_keras"]["type"] == "TypeError" and "Keras 3 optimizer" in cases["not_keras"]["message"]
        want = f"NaN or Inf training loss reported on rank(s) [{size - 1}] during steps 1..2"
        assert cases["nan_loss"]["type"] == "FloatingPointError" and want in cases["nan_loss"]["message"]
        assert cases["nan_loss_graph"]["type"] in ("UnknownError", "InvalidArgumentError")
        assert want in cases["nan_loss_graph"]["message"]
        assert r["bad_inputs"]["alive"] == size


# ------------------------------------------------------------------------------------------- accuracy on digits
@pytest.mark.parametrize("example", ["examples/pytorch_digits.py", "examples/keras_digits.py"])
@pytest.mark.parametrize("ranks, optimizers", [(2, ["lsgd", "async_lsgd", "easgd", "async_easgd"]),
                                               (4, ["multi_lsgd", "async_multi_lsgd"])],
                         ids=["np2-lsgd-easgd", "np4-two-nodes-multi-leader"])
def test_accuracy_within_two_points_of_data_parallel_sgd(example, ranks, optimizers):
    """Same model, initial weights, steps and epochs as data-parallel SGD; the leader's (LSGD) or the center's
    (EASGD) test accuracy may be at most 2 points below it."""
    # the launches that also train the compressors (tests/digits.py)
    results = digits_at_two_ranks(example) if ranks == 2 else digits_at_four_ranks(example)
    dense = results["none"]["test_accuracy"]
    assert dense > 0.93
    for name in optimizers:
        assert results[name]["test_accuracy"] >= dense - 0.02, (name, results[name]["test_accuracy"], dense)
        assert results[name]["dense_bytes_per_step"] / results[name]["bytes_per_step"] > 3  # period 4: ~4x fewer


def test_the_first_election_after_an_elastic_reset_skips_ranks_without_a_loss():
    """A rank an elastic reset added has reported nothing yet (Keras reports after the batch): it is not elected,
    and an empty window is an error again from the next election."""
    sync = LeaderSync(period=2, groups=None, size=3)
    sync.configure(["n"] * 3, rank=0)
    sync.generation = 1
    assert sync.elect([(3.0, 1), (0.0, 0), (2.0, 1)], 46) == {"leader": 2}
    with pytest.raises(ValueError, match=r"no training loss reported on rank\(s\) \[1\]"):
        sync.elect([(3.0, 1), (0.0, 0), (2.0, 1)], 48)
    nobody = LeaderSync(period=2, groups=None, size=3)
    nobody.configure(["n"] * 3, rank=0)
    nobody.generation = 2
    assert nobody.elect([(0.0, 0)] * 3, 46) == {"leader": 0} and nobody.best_rank == 0
