"""Elastic training for real: `horovodrun --gloo -np 2 --min-np 1 --max-np 3 --host-discovery-script` on this
machine. A worker is SIGKILLed while its step's collectives are in flight (N: 2 -> 1, the survivor rolls back to
the last commit), then two are added (N: 1 -> 3: the killed host after Horovod's blacklist cooldown, and the
machine's own host name). Every rank that ends must hold identical parameters, the expected steps and commits, the
statistics of exactly the steps trained (rolled-back steps redone, not counted twice), and bytes per step of the
plan for the final N (two-phase's chunks, sparse_reduce's regions rebuilt for 3 ranks)."""
import math
import os
import socket

import pytest

from hvdrun import horovodrun_elastic

WORKER = os.path.join("tests", "workers", "elastic_worker.py")
STEPS, KILL_AT, ADD_AT, COMMIT_EVERY = 60, 23, 35, 5
METHODS = ["ternary", "topk", "topk_sparse_reduce", "adaptive_topk", "async_lsgd"]


def hostname_is_local():
    """The added third "host" is this machine's own name, which Horovod must resolve to a local address."""
    try:
        from horovod.runner.util.network import get_local_host_addresses
        return socket.gethostbyname(socket.gethostname()) in get_local_host_addresses()
    except OSError:
        return False


@pytest.mark.skipif(not hostname_is_local(), reason="this machine's host name does not resolve to a local address")
@pytest.mark.parametrize("method", METHODS)
def test_worker_killed_and_added(method):
    results, output = horovodrun_elastic(WORKER, method, STEPS, KILL_AT, ADD_AT, COMMIT_EVERY, timeout=240)
    where = f"{method}:\n{output[-3000:]}"
    assert [r["rank"] for r in results] == [0, 1, 2], where
    assert {r["started_on"] for r in results} == {"localhost", "127.0.0.1", socket.gethostname()}, where
    survivor = next(r for r in results if r["started_on"] == "localhost")
    # the failure rolled back to the commit before KILL_AT at N = 1; the added hosts reset at ADD_AT's commit, N = 3
    assert [(step, size) for step, size, _ in survivor["resets"]] == \
        [(KILL_AT // COMMIT_EVERY * COMMIT_EVERY, 1), (ADD_AT, 3)], where
    if method in ("topk", "topk_sparse_reduce", "adaptive_topk"):  # its own residuals, as committed
        assert survivor["residuals_kept"] and all(survivor["residuals_kept"]), where
    for r in results:
        assert (r["size"], r["step"], r["commits"], r["stats_steps"]) == \
            (3, STEPS, STEPS // COMMIT_EVERY, STEPS), where
        assert r["params"] == results[0]["params"], f"rank {r['rank']} ended with other parameters; {where}"
        assert math.isfinite(sum(r["params"])) and r["accuracy"] > 0.5, where
    if method == "ternary":  # two-phase's chunks and level codes for N = 3
        for r in results:
            assert r["transport"] == "two_phase" and r["last_wire_bytes"] == pytest.approx(r["planned_wire_bytes"]), \
                where
    if method == "topk_sparse_reduce":  # regions rebalanced for N = 3 (N + 1 bounds)
        assert all(r["transport"] == "sparse_reduce" and r["region_bounds"] == 4 for r in results), where
