"""Horovod's documented PyTorch idioms with horovod_ext.torch under horovodrun -np 2 (bounded by a timeout): the
resume pattern, hvd.join() with uneven data, sparse gradients; for every compressor
(tests/workers/idioms_worker.py records what each rank saw)."""
import pytest

from hvdrun import horovodrun

WORKER = "tests/workers/idioms_worker.py"
COMPRESSIONS = ["none", "fp16", "ternary", "ternary_two_phase", "topk", "adaptive_topk", "powersgd"]
RESIDUALS = {"topk", "adaptive_topk", "powersgd"}


@pytest.fixture(scope="module")
def results():
    res, _ = horovodrun(2, WORKER, timeout=420)
    return res


@pytest.mark.parametrize("name", COMPRESSIONS)
def test_fresh_broadcast_optimizer_state_advances_nothing(results, name):
    for r in results:
        fresh = r["resume"][name]["fresh_broadcast"]
        assert fresh["step"] == 0 and fresh["stats_steps"] == 0, fresh
        if fresh["controller"] is not None:
            assert fresh["controller"]["step"] == 0, fresh


@pytest.mark.parametrize("name", COMPRESSIONS)
def test_resume_pattern_leaves_every_rank_with_the_same_state(results, name):
    """After rank 0 loads and broadcasts: parameters, momentum, step counter, seed and controller as at the checkpoint,
    bit for bit, on every rank."""
    at = [r["resume"][name]["at_checkpoint"] for r in results]
    after = [r["resume"][name]["after_broadcast"] for r in results]
    for a in after:
        assert a["params"] == after[0]["params"] and a["momentum"] == after[0]["momentum"]
        assert (a["step"], a["seed"], a["controller"]) == (at[0]["step"], at[0]["seed"], at[0]["controller"])


@pytest.mark.parametrize("name", COMPRESSIONS)
def test_resume_pattern_continues_as_the_uninterrupted_run(results, name):
    """Rank 0 loads, broadcasts: the continuation equals the uninterrupted run bit for bit. With error feedback the
    other ranks' residuals are not in rank 0's checkpoint: they restart from zero, and the run equals the
    uninterrupted run with those residuals zeroed at the checkpoint (docs/horovod-idioms.md, "Checkpoints")."""
    for r in results:
        rec = r["resume"][name]
        assert rec["rank0_pattern"] == rec["rank0_reference"], r["rank"]
        assert rec["rank0_pattern"]["params"] == results[0]["resume"][name]["rank0_pattern"]["params"]
        if name not in RESIDUALS:
            assert rec["rank0_pattern"] == rec["uninterrupted"]
            assert rec["rank0_pattern_ours"] == rec["uninterrupted_ours"]


@pytest.mark.parametrize("name", COMPRESSIONS)
def test_every_rank_loads_its_own_checkpoint_continues_bit_for_bit(results, name):
    for r in results:
        rec = r["resume"][name]
        assert rec["every_rank_pattern"] == rec["uninterrupted"], r["rank"]
        assert rec["every_rank_ours"] == rec["uninterrupted_ours"], r["rank"]


def test_horovods_own_broadcast_optimizer_state_does_not_hang_and_state_is_agreed(results):
    """Horovod's own function knows nothing of horovod_ext's state: it is agreed at the first step. (Its
    state-creating step on zero gradients applies SGD's weight decay to the fresh rank's parameters, in Horovod as
    here; horovod_ext's broadcast_optimizer_state restores them.)"""
    a, b = (r["stock_broadcast"] for r in results)
    assert {k: a[k] for k in ("step", "seed", "controller")} == {k: b[k] for k in ("step", "seed", "controller")}
    assert a["step"] == results[0]["resume"]["adaptive_topk"]["at_checkpoint"]["step"] + 1
    assert a["params"] != b["params"]


def test_no_residual_warning_in_the_documented_patterns(results):
    assert results[0]["warnings"] == [] and results[1]["warnings"] == []


@pytest.mark.parametrize("name", COMPRESSIONS)
def test_join_with_uneven_batches(results, name):
    """Rank 1 has 2 more batches; rank 0 joins after 3. No hang, no shutdown; the ranks agree up to the join, and in
    the steps after it rank 1 applies Horovod's allreduce of what it sends: (g + r) / 2."""
    a, b = (r["join"][name] for r in results)
    assert a["last_joined"] == b["last_joined"] == 1
    assert a["final"] == b["at_common"]  # the joined rank stopped where both were
    assert len(b["errors"]) == 2
    tolerance = 2e-3 if name == "fp16" else 1e-6
    assert max(b["errors"]) <= tolerance, b["errors"]
    if name not in ("none", "fp16"):
        assert b["dense_steps"] == 2
        assert b["residual_left"] == 0.0  # sent dense: nothing left behind


@pytest.mark.parametrize("name", COMPRESSIONS)
@pytest.mark.parametrize("as_dense", [False, True], ids=["sparse", "sparse_as_dense"])
def test_sparse_embedding_gradients(results, name, as_dense):
    a, b = (r["sparse"][f"{name}.{as_dense}"] for r in results)
    assert a["weights"] == b["weights"]  # every rank applied the same update
    assert a["sparse_after"]  # as Horovod: with sparse_as_dense the average is made sparse again for the update
    if not as_dense or name in ("none",):
        assert a["max_error"] < 1e-6  # Horovod's sparse allgather (or dense allreduce): the exact average
    elif name == "fp16":
        assert a["max_error"] < 1e-2


def test_parameter_names_attribute(results):
    assert results[0]["parameter_names"] == ["0.bias", "0.weight", "2.bias", "2.weight"]


@pytest.mark.parametrize("kind", ["lsgd", "easgd"])
def test_resume_pattern_with_the_leader_optimizers(results, kind):
    """Rank 0 loads, broadcasts: no hang; every rank holds rank 0's parameters, momentum and schedule, and the ranks
    keep one schedule afterwards (the same leaders elected on every rank)."""
    a, b = (r["leader_resume"][kind] for r in results)
    for rec in (a, b):
        assert rec["fresh_step"] == 0  # the state-creating step is the wrapped optimizer's, not the schedule's
        assert rec["after"]["step"] == 5
    assert a["after"] == b["after"]
    assert a["sync"] == b["sync"]


JOIN_TWICE = ["adaptive_topk", "ternary_shared", "powersgd", "auto", "auto_linear"]


@pytest.fixture(scope="module")
def joined_twice():
    results, _ = horovodrun(2, "tests/workers/join_twice_worker.py", *JOIN_TWICE, timeout=240)
    return results


@pytest.mark.parametrize("name", JOIN_TWICE)
def test_join_every_epoch_does_not_hang(joined_twice, name):
    """After a first hvd.join() the ranks have taken different numbers of steps; the next epoch's step-level
    collectives (GraVAC's norms, the shared scales, Compression.auto's window ends) must still pair up across
    ranks, also where the join check is read only at finish() (PowerSGD; auto with linear candidates)."""
    a, b = (r[name] for r in joined_twice)
    assert [a["steps"], b["steps"]] == [6, 10]
    assert [a["join_dense_steps"], b["join_dense_steps"]] == [0, 4]
    assert a["step_name"] == b["step_name"]  # the steps every rank took: 6 on each
    assert a["choice"] == b["choice"]


@pytest.mark.parametrize("name", COMPRESSIONS)
def test_a_rank_outside_the_process_set_steps_on_its_own_gradients(results, name):
    """Horovod's optimizer on a rank outside its process_set registers no hooks: that rank trains alone (bit for bit
    plain SGD) and hangs nobody; the set's members average among themselves and agree bit for bit."""
    for r in results:
        rec = r["process_set"][name]
        assert rec["set_identical"], (r["rank"], rec)
        if r["rank"] % 2 == 1:
            assert rec["equals_local"], (r["rank"], rec)


@pytest.mark.parametrize("name", ["none", "fp16"])
def test_adasum_is_horovods_adasum_optimizer(results, name):
    """op=hvd.Adasum takes Horovod's Adasum path (a local step, then Adasum of the parameters' change), not a plain
    allreduce of the gradients with op=Adasum."""
    for r in results:
        rec = r["adasum"][name]
        assert rec["horovods_class"] and not rec["ours"], (r["rank"], rec)
