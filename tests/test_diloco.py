"""DiLoCoOptimizer (horovod_ext/torch/diloco.py, consensus/diloco.py) under horovodrun at 2 ranks and at 4 as two
"nodes" of 2: the outer step against the NumPy reference (python/hvdext_reference/diloco.py), replicas identical
after every round with every compressor, a resumed run's bits, the bytes against dense, and bad arguments raised
on every rank (tests/workers/diloco_worker.py)."""
import numpy as np
import pytest

from diloco_checks import (H, LEADER_CASES, ROUNDS, STREAM_SAVE, STREAM_STEPS, check_compressed_outer_steps,
                           check_joined_streaming, check_leader, check_outer_steps_against_reference, check_resumed,
                           check_streaming, check_streaming_argument_errors, check_uneven_then_join,
                           check_worker_argument_errors, flat, group_sgd)
from hvdext_reference import diloco as reference
from hvdrun import horovodrun

from horovod_ext.consensus.diloco import check_arguments


@pytest.fixture(scope="module", params=[2, 4])
def results(request):
    hosts = "localhost:2,127.0.0.1:2" if request.param == 4 else None  # two "nodes" of 2 ranks: groups="node"
    ranks, _ = horovodrun(request.param, "tests/workers/diloco_worker.py", timeout=400, hosts=hosts)
    return ranks


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
    check_outer_steps_against_reference(runs)


def workers_of(results, name):
    workers = results[0]["runs"][name]["workers"]
    assert all(r["runs"][name]["workers"] == workers for r in results)
    return workers


def test_a_workers_ranks_average_their_gradients_and_only_its_leader_sends(results):
    """groups: [[0, 1]] at 2 ranks (one worker), the two hosts' ranks at 4 (two workers). A worker's ranks hold the
    same parameters after every inner step (SGD on the mean of their gradients); the outer step is the
    reference's on the workers' parameters (one per worker, to the bit: a mean of at most two); the leaders alone
    send across workers; a resumed run continues to the same bits."""
    workers = workers_of(results, "groups-none")
    assert workers == ([[0, 1]] if len(results) == 2 else [[0, 1], [2, 3]])
    runs = [r["runs"]["groups-none"] for r in results]
    theta, momentum = flat(runs[0]["outer"][0]), None
    for k in range(ROUNDS):
        for group in workers:
            for rank in group:
                assert runs[rank]["local"][k] == runs[group[0]]["local"][k], (k, rank)
            expected = group_sgd(theta, [results[r]["data"] for r in group])
            np.testing.assert_allclose(flat(runs[group[0]]["local"][k]), expected, rtol=1e-5, atol=1e-5)
        theta, momentum, _ = reference.outer_round(theta, momentum, [flat(runs[g[0]]["local"][k]) for g in workers])
        got = flat(runs[0]["outer"][k + 1])
        assert np.array_equal(got.view(np.uint32), theta.view(np.uint32)), k
        for run in runs:
            assert run["outer"][k + 1] == runs[0]["outer"][k + 1]
    dense_step = (8 * 4 + 4) * 4
    for r, run in zip(results, runs):
        leader = any(r["rank"] == g[0] for g in workers)
        assert run["leader"] == leader
        start = dense_step if r["rank"] == 0 else 0  # the start's broadcast of rank 0's parameters
        # the total: the exchange across workers, the worker's inner averages and broadcasts, the start
        assert run["payload_bytes"] == (ROUNDS * dense_step if leader else 0) + run["inner"]["payload_bytes"] + start
        assert run["dense_bytes"] == ROUNDS * H * dense_step
        # the inner allreduce of every step, and the leader's broadcast of each round's average
        assert run["inner"]["payload_bytes"] == ROUNDS * H * dense_step + (ROUNDS * dense_step if leader else 0)
        assert run["resumed"] == run["outer"][3:], r["rank"]


def test_compressed_inner_averages_keep_a_workers_ranks_identical(results):
    """Ternary gradients inside the worker (error feedback) and ternary pseudo-gradients across: the ranks of a
    worker still hold the same bits after every round's inner steps, every rank the same outer parameters; the
    worker's ranks send less than half of what they send with dense gradients."""
    workers = workers_of(results, "groups-ternary-inner")
    runs = [r["runs"]["groups-ternary-inner"] for r in results]
    for k in range(ROUNDS):
        for group in workers:
            for rank in group:
                assert runs[rank]["local"][k] == runs[group[0]]["local"][k], (k, rank)
        for run in runs:
            assert run["outer"][k + 1] == runs[0]["outer"][k + 1]
    for r, run in zip(results, runs):
        dense_inner = r["runs"]["groups-none"]["inner"]["payload_bytes"]
        assert run["inner"]["payload_bytes"] < dense_inner / 2, (r["rank"], run["inner"], dense_inner)
        assert run["resumed"] == run["outer"][3:], r["rank"]


def test_uneven_data_then_hvd_join_returns_on_every_rank(results):
    """Rank r trains ROUNDS - r rounds, then every rank calls hvd.join() (diloco_checks.py)."""
    check_uneven_then_join(results)


def test_the_inner_steps_are_each_ranks_own(results):
    """Between rounds nothing is averaged: the ranks' parameters after their inner steps differ (their data do)."""
    runs = [r["runs"]["none"] for r in results]
    assert flat(runs[0]["local"][0]).tolist() != flat(runs[1]["local"][0]).tolist()


def test_a_resumed_run_continues_to_the_same_bits(results):
    """To the bit, except dense pseudo-gradients averaged by Horovod's ring at 4 ranks: whether it fuses a round's
    tensors into one buffer depends on when they reach it, and the sum's order with it (within a float32
    rounding). The payload compressors decode in rank order, and two workers' mean is exact: the same bits."""
    for r in results:
        for name, run in r["runs"].items():
            if name == "none" and len(results) > 2:
                for resumed, outer in zip(run["resumed"], run["outer"][3:], strict=True):
                    np.testing.assert_allclose(flat(resumed), flat(outer), rtol=1e-6, atol=1e-7)
            else:
                assert run["resumed"] == run["outer"][3:], (r["rank"], name)


def test_compressed_pseudo_gradients_send_less_and_are_the_references(results):
    """Ternary and top-k pseudo-gradients with error feedback send less than half of the dense exchange, and every
    round's outer step is the reference's plan and Nesterov step (diloco_checks.check_compressed_outer_steps)."""
    runs = results[0]["runs"]
    dense_step = (8 * 4 + 4) * 4  # the Linear(8, 4)'s float32 gradients, every step
    assert runs["none"]["dense_bytes"] == ROUNDS * H * dense_step  # against the dense allreduce of every step
    # one dense exchange per round, and (rank 0) the start's broadcast of its parameters
    assert runs["none"]["payload_bytes"] == ROUNDS * dense_step + dense_step
    for name in ("ternary-ef", "topk-ef"):
        assert runs[name]["payload_bytes"] - dense_step < ROUNDS * dense_step / 2, name
        check_compressed_outer_steps([r["runs"][name] for r in results], name)


def test_a_slower_worker_ends_last_and_every_rank_exits_cleanly(results):
    """The worker's last run ends in an inner step that the worker of rank 0 starts 2 s after the others (at 4
    ranks, two workers): the launch exiting 0, which the fixture requires, is the check that Horovod did not shut
    down under that worker's last in-group allreduce (horovod_ext/in_flight.py)."""
    assert [r["slower_worker_steps"] for r in results] == [H + 1] * len(results)


def test_bad_arguments_raise_the_same_error_on_every_rank(results):
    cases = {e["case"]: e for e in results[0]["errors"]}
    assert "inner_steps must be an integer >= 1" in cases["inner_steps=0"]["message"]
    assert "outer_lr must be a number > 0" in cases["outer_lr=0"]["message"]
    assert "outer_momentum must be a number in [0, 1)" in cases["outer_momentum=1"]["message"]
    assert "SettingsMismatch" in cases["inner_steps differs"]["type"]
    # a bad value on one rank: the settings differ, and every rank says which rank passed what
    assert "outer_lr: rank 0: 0.7; rank 1: -1.0" in cases["outer_lr on rank 1"]["message"]
    check_worker_argument_errors(cases)
    check_streaming_argument_errors(cases)
    for r in results[1:]:
        assert [(e["case"], e["type"], e["message"]) for e in r["errors"]] == \
            [(e["case"], e["type"], e["message"]) for e in results[0]["errors"]]


def test_streaming_fragments_are_the_references_to_the_bit(results):
    """fragments=3 (whole layers, strided), overlap=1, merge_alpha 0 and 0.5: every step's parameters and outer
    parameters against the reference's schedule, outer step and merge (diloco_checks.check_streaming), the
    ternary case's outer steps through the reference's ternary plan with each fragment's residuals (to the bit at
    2 ranks; at 4 its biases, below min_size, are summed dense by Horovod's ring)."""
    dense_exact = len(results) == 2  # at 4 ranks Horovod's ring sums four values in its own order
    check_streaming([r["streaming"]["stream-none"] for r in results], 0.0, dense=True, exact=dense_exact)
    check_streaming([r["streaming"]["stream-ternary-merge"] for r in results], 0.5, dense=False,
                    exact=dense_exact, ternary=True)  # at 4 ranks the biases (below min_size) go dense, by the ring
    run = results[0]["streaming"]["stream-none"]
    assert run["fragments"] == [["0.weight", "0.bias"], ["2.weight", "2.bias"], ["4.weight", "4.bias"]]
    assert run["rounds"] == STREAM_STEPS // 2 - 1  # a fragment every 2 steps; the last one is in flight


def test_streaming_with_groups_averages_the_workers_and_keeps_their_ranks_identical(results):
    workers = results[0]["streaming"]["stream-groups"]["workers"]
    leaders = [results[g[0]]["streaming"]["stream-groups"] for g in workers]
    check_streaming(leaders, 0.0, dense=True, exact=True)  # a mean of at most two workers is exact
    for group in workers:
        for rank in group:
            run = results[rank]["streaming"]["stream-groups"]
            assert run["post"] == leaders[workers.index(group)]["post"] and run["outer"] == leaders[0]["outer"]


def test_the_leader_steers_the_outer_step_with_its_own_pseudo_gradient(results):
    """outer="leader" (diloco_checks.check_leader)."""
    check_leader(*([r["streaming"][name] for r in results] for name in LEADER_CASES))


def test_a_sync_sends_one_fragment(results):
    """The peak bytes of one exchange: the largest fragment's (the first two layers' 8 x 8 + 8 floats), not the
    model.s; ternary sends less than a quarter of that (2 bits a value, plus its scale and header)."""
    for r in results:
        dense, ternary = r["streaming"]["stream-none"], r["streaming"]["stream-ternary-merge"]
        assert dense["peak"] == (8 * 8 + 8) * 4, r["rank"]
        assert 0 < ternary["peak"] < dense["peak"] / 4, (r["rank"], ternary["peak"])


def test_a_resumed_streaming_run_continues_to_the_same_bits_with_an_exchange_in_flight(results):
    for r in results:
        for name, run in r["streaming"].items():
            assert run["in_flight_at_save"] == 0, name  # fragment 0 started at step 8, due at 9
            for key in ("pre", "post", "outer"):
                check_resumed(run["resumed"][key], run[key][STREAM_SAVE:],
                              ring=len(results) > 2 and name == "stream-none")


def test_streaming_with_uneven_data_then_hvd_join_returns_on_every_rank(results):
    """hvd.join() applies the rank's exchange in flight first: rank r took STREAM_STEPS - 2 r steps, a fragment
    exchange every 2, and applied every one; with outer="leader" too (once a rank has joined, the elected leader's
    values go dense, summed with the others' zeros, since Horovod cannot allgather then). Every rank's outer
    parameters after join are the reference's replay (diloco_checks.check_joined_streaming)."""
    for name in ("stream-ternary-merge", "leader-ternary"):
        joins = [r["streaming_join"][name] for r in results]
        assert len({j["last_joined"] for j in joins}) == 1, name
        assert [j["rounds"] for j in joins] == [(STREAM_STEPS - 2 * rank) // 2 for rank in range(len(results))]
        check_joined_streaming(joins, results[0]["streaming"][name], leader=name.startswith("leader"))


@pytest.mark.parametrize("kwargs, fragment", [({"inner_steps": 1.5}, "inner_steps must be an integer >= 1"),
                                              ({"inner_steps": True}, "inner_steps must be an integer >= 1"),
                                              ({"outer_lr": float("nan")}, "outer_lr must be a number > 0"),
                                              ({"outer_momentum": -0.1}, "outer_momentum must be a number in"),
                                              ({"nesterov": 1}, "nesterov must be True or False")])
def test_the_arguments_are_checked(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment.replace("[", r"\[")):
        check_arguments(**kwargs)
