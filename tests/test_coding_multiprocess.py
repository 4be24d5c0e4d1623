"""Entropy-coded payloads under horovodrun (-np 2, and -np 4 as two "nodes"; TensorFlow eagerly and in a
tf.function): the decoded gradients are the same bits as with the fixed packings, for ternary (own and shared scale,
two-phase, error feedback), top-k and adaptive top-k; a corrupted payload, or a phase-1 chunk only one rank
receives, fails the step on every rank with a clear error, and the next step trains normally."""
import re

import pytest

from hvdrun import horovodrun


def check_identical(results):
    for r in results:
        assert r["results"], r
        for pair, runs in r["results"].items():
            assert runs["coded"] == runs["fixed"], (r["rank"], pair)


@pytest.mark.parametrize("np_", [2, 4])
def test_torch_coded_equals_fixed_and_corruption_fails_every_rank(np_):
    results, _ = horovodrun(np_, "tests/workers/coding_worker.py", "torch", timeout=420)
    check_identical(results)
    for r in results:
        assert set(r["errors"]) == {"allgather", "two_phase", "topk_delta", "topk_int32"}
        for which, error in r["errors"].items():
            assert error["type"] == "ValueError", (r["rank"], which, error)
            assert "corrupted" in error["message"] and "rank 1" in error["message"], (r["rank"], which, error)
            # the tensor it belongs to (two-phase: the stream of the step's compressed tensors)
            assert re.search(r"'w[0-9]'", error["message"]), (r["rank"], which, error)
        assert len({e["message"] for e in r["errors"].values()}) == 4
    for which in results[0]["errors"]:  # the same error on every rank
        assert len({r["errors"][which]["message"] for r in results}) == 1, which
    assert len({tuple(map(tuple, r["after"])) for r in results}) == 1  # every rank decoded the same next step


def test_tf_coded_equals_fixed():
    results, _ = horovodrun(2, "tests/workers/coding_worker.py", "tf", timeout=420)
    check_identical(results)
