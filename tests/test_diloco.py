"""DiLoCoOptimizer (horovod_ext/torch/diloco.py, consensus/diloco.py) under horovodrun at 2 ranks and at 4 as two
"nodes" of 2: the outer step against the NumPy reference (python/hvdext_reference/diloco.py), replicas identical
after every round with every compressor, a resumed run's bits, the bytes against dense, and bad arguments raised
on every rank (tests/workers/diloco_worker.py)."""
import numpy as np
import pytest

from hvdext_reference import diloco as reference
from hvdrun import horovodrun

from horovod_ext.consensus.diloco import check_arguments

H, ROUNDS = 3, 4


@pytest.fixture(scope="module", params=[2, 4])
def results(request):
    ranks, _ = horovodrun(request.param, "tests/workers/diloco_worker.py", timeout=400)
    return ranks


def flat(params):
    return np.concatenate([np.asarray(p, dtype=np.float32).ravel() for p in params])


def test_every_rank_continues_from_the_same_outer_parameters_with_every_compressor(results):
    for name in results[0]["runs"]:
        for r in results[1:]:
            assert r["runs"][name]["outer"] == results[0]["runs"][name]["outer"], name
        assert results[0]["runs"][name]["rounds"] == ROUNDS


def test_the_outer_step_is_the_references_on_the_ranks_own_parameters(results):
    """Dense pseudo-gradients (Compression.none, Horovod's Average): the reference's Nesterov step on the mean of
    what the ranks held after their inner steps; to the bit at 2 ranks (a + b, halved), within a float32
    rounding of the sum's order at 4 (Horovod's ring adds in its own order)."""
    runs = [r["runs"]["none"] for r in results]
    theta, momentum = flat(runs[0]["outer"][0]), None
    for k in range(ROUNDS):
        locals_ = [flat(run["local"][k]) for run in runs]
        theta, momentum, _ = reference.outer_round(theta, momentum, locals_)
        got = flat(runs[0]["outer"][k + 1])
        if len(results) == 2:
            assert np.array_equal(got.view(np.uint32), theta.view(np.uint32)), k
        else:
            np.testing.assert_allclose(got, theta, rtol=1e-6, atol=1e-6)
        theta = got  # the next round from the optimizer's own outer parameters


def test_the_inner_steps_are_each_ranks_own(results):
    """Between rounds nothing is averaged: the ranks' parameters after their inner steps differ (their data do)."""
    runs = [r["runs"]["none"] for r in results]
    assert flat(runs[0]["local"][0]).tolist() != flat(runs[1]["local"][0]).tolist()


def test_a_resumed_run_continues_to_the_same_bits(results):
    for r in results:
        for name, run in r["runs"].items():
            assert run["resumed"] == run["outer"][3:], (r["rank"], name)


def test_compressed_pseudo_gradients_send_less_and_still_train(results):
    runs = results[0]["runs"]
    dense_step = (8 * 4 + 4) * 4  # the Linear(8, 4)'s float32 gradients, every step
    assert runs["none"]["dense_bytes"] == ROUNDS * H * dense_step  # against the dense allreduce of every step
    assert runs["none"]["payload_bytes"] == ROUNDS * dense_step  # one dense exchange per round
    for name in ("ternary-ef", "topk-ef"):
        assert runs[name]["payload_bytes"] < runs["none"]["payload_bytes"] / 2, name
        start, end = flat(runs[name]["outer"][0]), flat(runs[name]["outer"][-1])
        dense_end = flat(runs["none"]["outer"][-1])
        # the compressed runs move the outer parameters the dense run's way
        assert np.dot(end - start, dense_end - start) > 0.5 * np.dot(dense_end - start, dense_end - start), name
        assert runs[name]["norm"] > 0


def test_bad_arguments_raise_the_same_error_on_every_rank(results):
    cases = {e["case"]: e for e in results[0]["errors"]}
    assert "inner_steps must be an integer >= 1" in cases["inner_steps=0"]["message"]
    assert "outer_lr must be a number > 0" in cases["outer_lr=0"]["message"]
    assert "outer_momentum must be a number in [0, 1)" in cases["outer_momentum=1"]["message"]
    assert "SettingsMismatch" in cases["inner_steps differs"]["type"]
    # a bad value on one rank: the settings differ, and every rank says which rank passed what
    assert "outer_lr: rank 0: 0.7; rank 1: -1.0" in cases["outer_lr on rank 1"]["message"]
    for r in results[1:]:
        assert [(e["case"], e["type"], e["message"]) for e in r["errors"]] == \
            [(e["case"], e["type"], e["message"]) for e in results[0]["errors"]]


@pytest.mark.parametrize("kwargs, fragment", [({"inner_steps": 1.5}, "inner_steps must be an integer >= 1"),
                                              ({"inner_steps": True}, "inner_steps must be an integer >= 1"),
                                              ({"outer_lr": float("nan")}, "outer_lr must be a number > 0"),
                                              ({"outer_momentum": -0.1}, "outer_momentum must be a number in"),
                                              ({"nesterov": 1}, "nesterov must be True or False")])
def test_the_arguments_are_checked(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment.replace("[", r"\[")):
        check_arguments(**kwargs)
