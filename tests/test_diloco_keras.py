"""DiLoCoOptimizer for Keras 3 (horovod_ext/tensorflow/diloco.py) under horovodrun at 2 ranks and at 4 as two
"nodes" of 2, one launch each (tests/workers/diloco_keras_worker.py): eagerly, inside tf.function and with
model.fit, the outer step against the NumPy reference (python/hvdext_reference/diloco.py), replicas identical after
every round with every compressor, eager and tf.function to the same bits, a resumed run's bits, the bytes against
dense as in PyTorch (tests/test_diloco.py), evaluation_parameters(), and bad arguments raised on every rank."""
import numpy as np
import pytest

from diloco_checks import (H, LEADER_CASES, ROUNDS, STREAM_SAVE, STREAM_STEPS, check_compressed_outer_steps,
                           check_leader, check_outer_steps_against_reference, check_resumed, check_streaming,
                           check_streaming_argument_errors, check_uneven_then_join, check_worker_argument_errors,
                           flat, group_sgd)
from hvdext_reference import diloco as reference
from hvdrun import horovodrun

MODES = ("eager", "graph")
TORCH_KEYS = {"total", "last_step", "steps", "compression", "outer_rounds", "outer_update_norm", "inner_steps",
              "inner_steps_taken", "optimizer", "ranks", "workers", "leader"}


@pytest.fixture(scope="module", params=[2, 4], ids=["np2", "np4-two-nodes"])
def results(request):
    hosts = "localhost:2,127.0.0.1:2" if request.param == 4 else None  # two "nodes" of 2 ranks: groups="node"
    ranks, _ = horovodrun(request.param, "tests/workers/diloco_keras_worker.py", timeout=300, hosts=hosts)
    assert [r["rank"] for r in ranks] == list(range(request.param))
    return ranks


def runs_of(results, name, mode):
    return [r["fit"] if mode == "fit" else r["runs"][name][mode] for r in results]


@pytest.mark.parametrize("mode", MODES)
def test_every_rank_continues_from_the_same_outer_parameters_with_every_compressor(results, mode):
    for name in results[0]["runs"]:
        runs = runs_of(results, name, mode)
        assert len(runs[0]["outer"]) == ROUNDS + 1 and runs[0]["rounds"] == ROUNDS, name
        for run in runs[1:]:
            assert run["outer"] == runs[0]["outer"], name
    fit = runs_of(results, "none", "fit")
    assert fit[0]["rounds"] == ROUNDS and all(run["outer"] == fit[0]["outer"] for run in fit)


@pytest.mark.parametrize("mode", [*MODES, "fit"])
def test_the_outer_step_is_the_references_on_the_ranks_own_parameters(results, mode):
    """Dense pseudo-gradients: the reference's Nesterov step on the mean of what the ranks held after their inner
    steps; to the bit at 2 ranks, within a float32 rounding of the sum's order at 4 (Horovod's ring)."""
    runs = runs_of(results, "none", mode)
    check_outer_steps_against_reference(runs)


def same_bits(a, b, dense_at_4):
    """Equal to the bit, except a dense allreduce at 4 ranks: Horovod's ring adds each chunk of a buffer in its own
    order, and whether it fuses a step's tensors into one buffer depends on when they reach it (a tf.function
    hands them over together, an eager step one by one), so there the sums agree within a float32 rounding. The
    payload compressors decode every rank's payload in rank order: the same bits at any size."""
    if dense_at_4:
        assert len(a) == len(b)
        for params_a, params_b in zip(a, b):  # rounds
            np.testing.assert_allclose(flat(params_a), flat(params_b), rtol=1e-6, atol=1e-7)
    else:
        assert a == b


def test_eager_tf_function_and_model_fit_give_the_same_bits(results):
    dense_at_4 = len(results) > 2
    for r in results:
        for name, by_mode in r["runs"].items():
            for key in ("local", "outer"):
                same_bits(by_mode["eager"][key], by_mode["graph"][key], dense_at_4 and name == "none")
        for key in ("local", "outer"):
            same_bits(r["fit"][key], r["runs"]["none"]["graph"][key], dense_at_4)


@pytest.mark.parametrize("mode", MODES)
def test_a_workers_ranks_average_their_gradients_and_only_its_leader_sends(results, mode):
    """groups: [[0, 1]] at 2 ranks, the two hosts' ranks at 4: a worker's ranks hold the same bits after every
    inner step (SGD on the mean of their gradients), the outer step is the reference's on the workers' parameters
    (to the bit: a mean of at most two), only leaders send across workers, and the group's bytes (every step's
    gradients, the leader's broadcast of each round's average) are counted under "inner"."""
    runs = runs_of(results, "groups-none", mode)
    workers = runs[0]["workers"]
    assert workers == ([[0, 1]] if len(results) == 2 else [[0, 1], [2, 3]])
    theta, momentum = flat(runs[0]["outer"][0]), None
    for k in range(ROUNDS):
        for group in workers:
            for rank in group:
                assert runs[rank]["local"][k] == runs[group[0]]["local"][k], (k, rank)
            expected = group_sgd(theta, [results[r]["data"] for r in group], kernel_in_out=True)
            np.testing.assert_allclose(flat(runs[group[0]]["local"][k]), expected, rtol=1e-5, atol=1e-5)
        theta, momentum, _ = reference.outer_round(theta, momentum, [flat(runs[g[0]]["local"][k]) for g in workers])
        assert np.array_equal(flat(runs[0]["outer"][k + 1]).view(np.uint32), theta.view(np.uint32)), k
        assert all(run["outer"][k + 1] == runs[0]["outer"][k + 1] for run in runs)
    dense_step = (8 * 4 + 4) * 4
    for rank, run in enumerate(runs):
        leader = any(rank == g[0] for g in workers)
        assert run["leader"] == leader and run["rounds"] == ROUNDS
        start = dense_step if rank == 0 else 0  # the start's broadcast of rank 0's parameters
        # the total: the exchange across workers, the worker's inner averages and broadcasts, the start
        assert run["payload_bytes"] == (ROUNDS * dense_step if leader else 0) + run["inner"]["payload_bytes"] + start
        assert run["dense_bytes"] == ROUNDS * H * dense_step
        assert run["inner"]["payload_bytes"] == ROUNDS * H * dense_step + (ROUNDS * dense_step if leader else 0)
    compressed = runs_of(results, "groups-ternary-inner", mode)
    for k in range(ROUNDS):
        for group in workers:
            assert all(compressed[r]["local"][k] == compressed[group[0]]["local"][k] for r in group), k
    for rank, run in enumerate(compressed):
        assert run["inner"]["payload_bytes"] < runs[rank]["inner"]["payload_bytes"] / 2, rank


def test_uneven_data_then_hvd_join_returns_on_every_rank(results):
    """Eagerly: rank r trains ROUNDS - r rounds, then every rank calls hvd.join() (diloco_checks.py)."""
    check_uneven_then_join(results)


def test_the_inner_steps_are_each_ranks_own(results):
    runs = runs_of(results, "none", "eager")
    assert flat(runs[0]["local"][0]).tolist() != flat(runs[1]["local"][0]).tolist()


def test_a_resumed_run_continues_to_the_same_bits(results):
    """tf.function, from each rank's checkpoint of round 2 (Compression.none: rank 0's, broadcast)."""
    for r in results:
        for name, by_mode in r["runs"].items():
            run = by_mode["graph"]
            same_bits(run["resumed"], run["outer"][3:], len(results) > 2 and name == "none")
            assert run["resumed_rounds"] == ROUNDS


def test_compressed_pseudo_gradients_send_less_and_are_the_references(results):
    """Eagerly and in tf.function: ternary and top-k pseudo-gradients with error feedback send less than half of the
    dense exchange, and every round's outer step is the reference's plan and Nesterov step
    (diloco_checks.check_compressed_outer_steps, as for PyTorch)."""
    dense_step = (8 * 4 + 4) * 4  # the Dense(4)'s float32 gradients, every step
    for mode in MODES:
        runs = {name: by_mode[mode] for name, by_mode in results[0]["runs"].items()}
        assert runs["none"]["dense_bytes"] == ROUNDS * H * dense_step  # against the dense allreduce of every step
        # one dense exchange per round, and (rank 0) the start's broadcast of its parameters
        assert runs["none"]["payload_bytes"] == ROUNDS * dense_step + dense_step
        for name in ("ternary-ef", "topk-ef"):
            assert runs[name]["dense_bytes"] == ROUNDS * H * dense_step
            assert runs[name]["payload_bytes"] - dense_step < ROUNDS * dense_step / 2, (mode, name)
            check_compressed_outer_steps([r["runs"][name][mode] for r in results], name)
        for run in runs.values():
            assert TORCH_KEYS <= set(run["keys"]) and run["inner_steps_taken"] == ROUNDS * H
    assert results[0]["fit"]["dense_bytes"] == ROUNDS * H * dense_step


def test_evaluation_parameters_swap_the_outer_parameters_in(results):
    for r in results:
        e = r["evaluation"]
        assert e["inside"] == e["outer"] == results[0]["evaluation"]["outer"]
        assert e["after"] == e["own"] != e["outer"]


def test_bad_arguments_raise_the_same_error_on_every_rank(results):
    cases = {e["case"]: e for e in results[0]["errors"]}
    assert "inner_steps must be an integer >= 1" in cases["inner_steps=0"]["message"]
    assert "outer_lr must be a number > 0" in cases["outer_lr=0"]["message"]
    assert "outer_momentum must be a number in [0, 1)" in cases["outer_momentum=1"]["message"]
    assert "nesterov must be True or False" in cases["nesterov=1"]["message"]
    assert "SettingsMismatch" in cases["inner_steps differs"]["type"]
    assert "outer_lr: rank 0: 0.7; rank 1: -1.0" in cases["outer_lr on rank 1"]["message"]
    check_worker_argument_errors(cases)
    check_streaming_argument_errors(cases)
    assert cases["not keras"]["type"] == "TypeError"
    for r in results:
        assert r["alive"] == len(results)
    for r in results[1:]:
        assert [(e["case"], e["type"], e["message"]) for e in r["errors"]] == \
            [(e["case"], e["type"], e["message"]) for e in results[0]["errors"]]


@pytest.mark.parametrize("mode", MODES)
def test_streaming_fragments_are_the_references_to_the_bit(results, mode):
    """fragments=3 (whole layers, strided), overlap=1 (applied a step after the synchronous exchange), merge_alpha
    0 and 0.5, eagerly and in tf.function: diloco_checks.check_streaming, as for PyTorch, the ternary case through
    the reference's ternary plan (to the bit at 2 ranks; at 4 its biases, below min_size, are summed dense by
    Horovod's ring). (The two modes' inner steps differ in the last bits on this tanh MLP, where tf.function's
    graph optimizer fuses the layers' ops, so each is checked against the reference from its own parameters.)"""
    runs = lambda name: [r["streaming"][name][mode] for r in results]  # noqa: E731
    check_streaming(runs("stream-none"), 0.0, dense=True, exact=len(results) == 2)
    check_streaming(runs("stream-ternary-merge"), 0.5, dense=False, exact=len(results) == 2, ternary=True)
    if mode == "eager":  # groups inside tf.function: test_the_leader_steers_..., leader-fp16-groups
        workers = runs("stream-groups")[0]["workers"]
        leaders = [results[g[0]]["streaming"]["stream-groups"][mode] for g in workers]
        check_streaming(leaders, 0.0, dense=True, exact=True)
        for k, group in enumerate(workers):
            for rank in group:
                assert results[rank]["streaming"]["stream-groups"][mode]["post"] == leaders[k]["post"]
    run = runs("stream-none")[0]
    assert [[name.split("/")[-2] for name in f] for f in run["fragments"]] == [["l0", "l0"], ["l1", "l1"], ["l2", "l2"]]
    assert run["rounds"] == STREAM_STEPS // 2 - 1 and run["peak"] == (8 * 8 + 8) * 4


def test_a_resumed_streaming_run_continues_to_the_same_bits_with_an_update_pending(results):
    """Inside tf.function, the cases with residuals, the leader and groups (each resume traces a new step)."""
    for r in results:
        for name in ("stream-ternary-merge", "leader-ternary", "leader-fp16-groups"):
            run = r["streaming"][name]["graph"]
            assert run["in_flight_at_save"] == 0, name  # fragment 0 exchanged at step 8, due at 9
            for key in ("pre", "post", "outer"):
                check_resumed(run["resumed"][key], run[key][STREAM_SAVE:],
                              ring=len(results) > 2 and name == "stream-none")


@pytest.mark.parametrize("mode", MODES)
def test_the_leader_steers_the_outer_step_with_its_own_pseudo_gradient(results, mode):
    """outer="leader", eagerly and in tf.function (diloco_checks.check_leader, as for PyTorch). Inside tf.function
    the leader's exchange does not count the plan's 4-byte join check that PyTorch and eager Keras count per
    exchange: the graph's bytes are checked without it."""
    check_leader(*([r["streaming"][name][mode] for r in results] for name in LEADER_CASES),
                 join_check=4 if mode == "eager" else 0)
