"""Horovod's documented TensorFlow/Keras idioms with horovod_ext under horovodrun -np 2 (bounded by a timeout):
gradient accumulation, sparse gradients, local variables (tests/workers/tf_idioms_worker.py)."""
import pytest

from hvdrun import horovodrun

WORKER = "tests/workers/tf_idioms_worker.py"


@pytest.fixture(scope="module")
def results():
    res, _ = horovodrun(2, WORKER, timeout=420)
    return res


@pytest.mark.parametrize("where", ["fit", "loop_graphFalse", "loop_graphTrue"])
def test_two_backward_passes_equal_one_step_on_the_concatenated_batch(results, where):
    """backward_passes_per_step=2 with average_aggregated_gradients over two halves of a batch applies the gradient
    of the whole batch (dense compression; equal up to float32 rounding of the two sums)."""
    for r in results:
        assert r["accumulation"][where] < 1e-6, (r["rank"], where, r["accumulation"][where])


def test_accumulation_counts_iterations_as_horovod_and_communicates_once_per_real_step(results):
    for r in results:
        acc = r["accumulation"]
        assert acc["fit_iterations"] == 4 and acc["fit_real_steps"] == 2
        assert acc["summed_moved_more"]  # without averaging the accumulated gradient is the sum


@pytest.mark.parametrize("name", ["none", "fp16", "ternary", "topk", "adaptive_topk"])
def test_accumulation_with_every_compressor(results, name):
    """A compressor sees the accumulated gradient once per real step; every rank applies the same update."""
    for r in results:
        rec = r["accumulation"][f"compressor_{name}"]
        assert rec == {"identical": True, "real_steps": 2, "stats_steps": 2}, (r["rank"], rec)


@pytest.mark.parametrize("name", ["none", "ternary", "topk"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf_function"])
def test_indexed_slices_travel_as_horovod_sends_them(results, name, graph):
    """sparse_as_dense=False: IndexedSlices stay IndexedSlices and are averaged exactly (Horovod's allgather of
    values and indices), whatever the compressor; with sparse_as_dense=True they are densified and compressed."""
    for r in results:
        sparse = r["sparse"][f"{name}.False.{graph}"]
        assert sparse == {"sparse": True, "error": 0.0, "identical": True}, (r["rank"], sparse)
        dense = r["sparse"][f"{name}.True.{graph}"]
        assert dense["sparse"] is False and dense["identical"]
        if name == "none":
            assert dense["error"] == 0.0


def test_local_sources_are_not_communicated(results):
    for r in results:
        rank = r["rank"]
        own = 2.0 * (1.0 + rank)  # d(v^2)/dv of this rank's own v
        assert r["local"]["True"] == [own / 2, 1.5]  # scale_local_gradients: divided by the size; w averaged
        assert r["local"]["False"] == [own, 1.5]


@pytest.mark.parametrize("name", ["none", "fp16", "ternary", "topk", "adaptive_topk"])
def test_join_with_uneven_batches_eagerly(results, name):
    """Rank 1 has 2 more batches; rank 0 joins after 3. In the steps after it rank 1 applies Horovod's allreduce of what
    it sends, (g + r) / 2, and its residuals are then empty."""
    a, b = (r["join"][name] for r in results)
    assert a["last_joined"] == b["last_joined"] == 1
    assert len(b["errors"]) == 2
    assert max(b["errors"]) <= (2e-3 if name == "fp16" else 1e-6), b["errors"]
    assert b["residual_left"] == 0.0


@pytest.mark.parametrize("name", ["none", "fp16", "ternary", "topk", "adaptive_topk", "powersgd"])
@pytest.mark.parametrize("kind", ["tape", "fit"])
def test_a_rank_outside_the_process_set_keeps_its_own_gradients(results, name, kind):
    """As Horovod's tape and Keras optimizer there: the rank trains alone (bit for bit the unwrapped run) and hangs
    nobody; the set's members agree bit for bit."""
    for r in results:
        rec = r["process_set"][name][kind]
        assert rec["set_identical"], (r["rank"], rec)
        if r["rank"] % 2 == 1:
            assert rec["equals_local"], (r["rank"], rec)
