"""DiLoCoOptimizer's total counts every collective it makes, by wire.py's formulas: with groups="node" at 2 ranks
on one host (one worker of both ranks) a run of ROUNDS rounds of H inner steps makes the start's broadcast of the 36
float32 parameters from rank 0, every inner step's allreduce of the gradients inside the worker, each round's exchange
across the one leader (nothing on the wire) and the leader's broadcast of each round's average to the worker. PyTorch
and Keras count the same. The formulas' arithmetic on its own:
consensus/diloco_accounting.py's functions on fixed inputs."""
import types

import pytest

from horovod_ext.compression.wire import allreduce_wire_bytes, broadcast_wire_bytes
from horovod_ext.consensus import diloco_accounting as accounting
from horovod_ext.consensus.diloco import Schedule
from hvdrun import horovodrun

H, ROUNDS, NRANKS = 3, 2, 2
PARAM_BYTES = (8 * 4 + 4) * 4  # the Linear(8, 4)'s float32 parameters


def expected(rank):
    """(payload, wire) bytes of rank `rank`'s run, collective by collective."""
    start = (PARAM_BYTES if rank == 0 else 0, broadcast_wire_bytes(PARAM_BYTES, NRANKS))
    steps = ROUNDS * H  # the inner allreduces of the gradients over the worker's two ranks
    inner = (steps * PARAM_BYTES, steps * allreduce_wire_bytes(PARAM_BYTES, NRANKS))
    exchange = (ROUNDS * PARAM_BYTES, 0.0) if rank == 0 else (0, 0.0)  # one leader: nothing crosses the wire
    share = (ROUNDS * PARAM_BYTES if rank == 0 else 0, ROUNDS * broadcast_wire_bytes(PARAM_BYTES, NRANKS))
    return {"start": start, "inner": inner, "exchange": exchange, "share": share,
            "total": tuple(sum(part[i] for part in (start, inner, exchange, share)) for i in (0, 1))}


@pytest.fixture(scope="module", params=["torch", "keras"])
def results(request):
    got, _ = horovodrun(NRANKS, "tests/workers/diloco_wire_worker.py", request.param, timeout=300)
    return got


def test_the_total_counts_the_start_the_inner_average_and_the_leaders_broadcast(results):
    for r in results:
        want = expected(r["rank"])
        assert r["workers"] == [[0, 1]] and r["leader"] == (r["rank"] == 0)
        assert (r["start"]["payload_bytes"], r["start"]["wire_bytes"]) == pytest.approx(want["start"])
        assert (r["exchange"]["payload_bytes"], r["exchange"]["wire_bytes"]) == pytest.approx(want["exchange"])
        inner = tuple(a + b for a, b in zip(want["inner"], want["share"]))
        assert (r["inner"]["payload_bytes"], r["inner"]["wire_bytes"]) == pytest.approx(inner), r["rank"]
        assert (r["total"]["payload_bytes"], r["total"]["wire_bytes"]) == pytest.approx(want["total"]), r["rank"]
        # the reference: data-parallel SGD's allreduce of the gradients over every rank at every step
        assert r["total"]["dense_wire_bytes"] == pytest.approx(ROUNDS * H * allreduce_wire_bytes(PARAM_BYTES, 2))


def test_the_accounting_formulas_on_fixed_inputs():
    assert accounting.start_counts(1000, 4, 0) == {"payload_bytes": 1000, "wire_bytes": 750.0}
    assert accounting.start_counts(1000, 4, 3) == {"payload_bytes": 0, "wire_bytes": 750.0}
    assert accounting.start_counts(1000, 1, 0) == {"payload_bytes": 0, "wire_bytes": 0.0}
    assert accounting.election_counts(4) == {"payload_bytes": 96, "wire_bytes": 144.0}
    assert accounting.transfer_wire_per_byte("dense", 4) == 1.5 and accounting.transfer_wire_per_byte("codec", 4) == 3
    # H = 12, P = 4: an exchange every 3 steps, fragments in turn; 14 steps start 4 (fragments 0..3 once each)
    assert accounting.exchanges_started(Schedule(12, 4, 0), 14) == [1, 1, 1, 1]
    assert accounting.exchanges_started(Schedule(12, 4, 0), 21) == [2, 2, 2, 1]
    assert accounting.exchanges_started(Schedule(50, 1, 0), 149) == [2]
    leader = types.SimpleNamespace(group=[0, 1, 2, 3], is_leader=True)
    member = types.SimpleNamespace(group=[0, 1, 2, 3], is_leader=False)
    assert accounting.share_counts(leader, [100, 40], [2, 1]) == {"payload_bytes": 240, "wire_bytes": 180.0}
    assert accounting.share_counts(member, [100, 40], [2, 1]) == {"payload_bytes": 0, "wire_bytes": 180.0}
    alone = types.SimpleNamespace(group=[3], is_leader=True)
    assert accounting.share_counts(alone, [100], [5]) == {"payload_bytes": 0, "wire_bytes": 0.0}


def test_the_report_adds_every_part_to_the_total_and_keeps_the_dense_reference():
    def summary(payload, wire, dense, dense_wire):
        return {"payload_bytes": payload, "wire_bytes": wire, "dense_bytes": dense, "dense_wire_bytes": dense_wire,
                "elements": 10, "compressed_elements": 10, "compress_seconds": 0.0, "decompress_seconds": 0.0,
                "comm_seconds": 0.0, "bits_per_element": 0.0, "ratio": 0.0, "wire_ratio": 0.0}
    stats = {"total": summary(100, 50.0, 4000, 5000.0), "last_step": summary(0, 0.0, 40, 40.0)}  # some over L < N
    inner = {"total": summary(300, 150.0, 999, 999.0), "last_step": summary(30, 15.0, 999, 999.0)}
    got = accounting.report(stats, 4, accounting.counts(40, 30.0), inner, accounting.counts(20, 10.0))
    assert got["exchange"] == {"payload_bytes": 100, "wire_bytes": 50.0}
    assert (got["inner"]["total"]["payload_bytes"], got["inner"]["total"]["wire_bytes"]) == (320, 160.0)
    assert (got["total"]["payload_bytes"], got["total"]["wire_bytes"]) == (460, 240.0)
    assert (got["total"]["dense_bytes"], got["total"]["dense_wire_bytes"]) == (4000, 6000.0)  # 2 (4-1)/4 * 4000
    assert got["last_step"]["dense_wire_bytes"] == 60.0
    assert got["total"]["wire_ratio"] == 6000.0 / 240.0
    assert (got["last_step"]["payload_bytes"], got["last_step"]["wire_bytes"]) == (30, 15.0)
