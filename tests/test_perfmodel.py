"""horovod_ext.perfmodel: the byte plans equal each transport's own plan (the code that sizes the real tensors and
counts compression_stats()), and the step-time model has the limits it must have."""
import math

import pytest

from horovod_ext.compression import CompressionStats
from horovod_ext.compression.join import join_check_wire_bytes
from horovod_ext.compressors.transports.sparse_reduce import planned_bytes
from horovod_ext.compressors.transports.two_phase import TwoPhasePlan, allgather_transport_bytes, scale_sharing_bytes
from horovod_ext.compression.wire import allreduce_wire_bytes
from horovod_ext.consensus import ElasticSync, LeaderSync
from horovod_ext.perfmodel import METHODS, Cluster, Link, plan, predict, seconds, wire_bytes_per_step
from horovod_ext.perfmodel.project import compute_seconds_of

SHAPES = [(512, 64), (512,), (256, 512), (256,), (10, 256), (10,)]
SIZES = [math.prod(s) for s in SHAPES]
BIG = [n for n in SIZES if n >= 1024]
SMALL = 4 * sum(n for n in SIZES if n < 1024)
# one 25 MB bucket: its allgather carries a 4-byte size per payload (compression/buckets.py)
HEADER_TERNARY, HEADER_TOPK = 4 * len(BIG), 4 * len(SIZES)


def wire(method, n, **kw):
    return wire_bytes_per_step(plan(method, SHAPES, n, **kw))


def optimizer_wire(sync, n, steps):
    stats = CompressionStats("plan")
    for step in range(1, steps + 1):
        if isinstance(sync, LeaderSync):
            sync.account(stats, sync.due(step), 4 * sum(SIZES), n)
        elif sync.due(step):
            sync.account(stats, 4 * sum(SIZES), n)
        stats.end_step()
    return stats.total["wire_bytes"] / steps


@pytest.mark.parametrize("n", [2, 3, 4, 64])
def test_bytes_equal_each_transports_plan(n):
    join = join_check_wire_bytes(n)
    assert wire("dense", n) == allreduce_wire_bytes(4 * sum(SIZES), n)
    assert wire("fp16", n) == allreduce_wire_bytes(2 * sum(SIZES), n)
    for packing in ("base3", "2bit"):
        assert wire("ternary", n, packing=packing, transport="allgather") == pytest.approx(
            allgather_transport_bytes(BIG, n, packing) + (n - 1) * HEADER_TERNARY + allreduce_wire_bytes(SMALL, n)
            + join, rel=1e-12)
        assert wire("ternary", n, packing=packing, bucket_cap_mb=0, transport="allgather") == pytest.approx(
            allgather_transport_bytes(BIG, n, packing) + allreduce_wire_bytes(SMALL, n) + join, rel=1e-12)
        assert wire("ternary_two_phase", n, packing=packing) == pytest.approx(
            TwoPhasePlan(BIG, n, packing).wire_bytes(0) + scale_sharing_bytes(len(BIG), n)
            + allreduce_wire_bytes(SMALL, n) + join, rel=1e-12)
    for ratio in (0.01, 0.001):
        planned = planned_bytes(SIZES, 1 / ratio, n)
        assert wire("topk", n, ratio=ratio, transport="allgather") == pytest.approx(
            planned["allgather"] + (n - 1) * HEADER_TOPK + join, rel=1e-12)
        assert wire("topk", n, ratio=ratio, bucket_cap_mb=0, transport="allgather") == pytest.approx(
            planned["allgather"] + join, rel=1e-12)
        assert wire("topk_sparse_reduce", n, ratio=ratio) == pytest.approx(planned["sparse_reduce"] + join,
                                                                           rel=1e-12)
    assert wire("adaptive_topk", n, cf=100, transport="allgather") == pytest.approx(
        planned_bytes(SIZES, 100, n)["allgather"] + (n - 1) * HEADER_TOPK + join + allreduce_wire_bytes(32, n),
        rel=1e-12)
    single = LeaderSync(groups=None, size=n)
    single.configure(["a"] * n, 0)
    assert wire("lsgd", n) == pytest.approx(optimizer_wire(single, n, 16), rel=1e-12)
    multi = LeaderSync(groups="node", size=n)
    multi.configure(["a"] * (n // 2) + ["b"] * (n - n // 2), 0)
    if n % 2 == 0:
        assert wire("multi_lsgd", n, ranks_per_node=n // 2) == pytest.approx(optimizer_wire(multi, n, 16), rel=1e-12)
    one_host = LeaderSync(groups="node", size=n)
    one_host.configure(["a"] * n, 0)
    assert wire("multi_lsgd", n) == pytest.approx(optimizer_wire(one_host, n, 16), rel=1e-12)
    assert wire("easgd", n) == pytest.approx(optimizer_wire(ElasticSync(size=n), n, 16), rel=1e-12)


def test_powersgd_bytes_equal_the_baselines_count():
    import sys
    import os
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    from baselines import powersgd_bytes

    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256),
                                torch.nn.Linear(256, 10))
    shapes = [tuple(p.shape) for p in model.parameters()]
    hook = allreduce_wire_bytes(powersgd_bytes(model, 4), 4)
    assert wire_bytes_per_step(plan("powersgd", shapes, 4, hook=True)) == hook
    # Compression.powersgd: the same factors in two buffers, the dense tensors in a third, and the join check
    ours = wire_bytes_per_step(plan("powersgd", shapes, 4))
    assert ours == pytest.approx(hook + allreduce_wire_bytes(4, 4), rel=1e-12)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_limits(method):
    ideal = Cluster(8, Link(math.inf), ranks_per_node=4)
    p = predict(method, SHAPES, 0.05, ideal, compression_seconds=0.01)
    assert p.step_seconds == pytest.approx(0.06) and p.communication_seconds == 0.0  # compute + compression
    p = predict(method, SHAPES, 0.05, ideal, compression_seconds=0.01, overhead_seconds=0.003)
    assert p.step_seconds == pytest.approx(0.063) and p.overhead_seconds == 0.003  # a measured overhead adds
    slow = Cluster(8, Link(0.1, 1e-4), ranks_per_node=4)
    p = predict(method, SHAPES, 0.0, slow, compression_seconds=0.0)
    assert p.step_seconds == pytest.approx(p.communication_seconds) and p.step_seconds > 0  # communication alone
    times = [predict(method, SHAPES, 0.02, Cluster(8, Link(g, 1e-5))).step_seconds for g in (0.1, 1, 10, 100)]
    assert times == sorted(times, reverse=True) and times[0] > times[-1]  # faster links, never slower steps
    if method != "multi_lsgd":  # its group size changes with the node layout
        by_ranks = [predict(method, SHAPES, 0.02, Cluster(n, Link(1, 1e-5))).step_seconds for n in (2, 4, 16, 256)]
        assert by_ranks == sorted(by_ranks)  # more ranks, never faster steps (fixed work per rank)


def test_collective_formulas_and_topologies():
    link = Link(8e-9 * 1e6, 0.0)  # 1 MB/s, no latency
    switched = Cluster(4, link)
    assert seconds("allreduce", 1e6, switched) == pytest.approx(1.5)  # 2 (N-1)/N b / beta
    assert seconds("allgather", 1e6, switched) == pytest.approx(3.0)  # (N-1) b / beta
    assert seconds("alltoall", 1e6, switched) == pytest.approx(0.75)
    assert seconds("broadcast", 1e6, switched) == pytest.approx(1.0)  # pipelined: each rank forwards one copy
    assert seconds("broadcast", 1e6, Cluster(4, link, broadcast="root")) == pytest.approx(3.0)  # gloo: 3 copies
    shared = Cluster(4, link, shared=True)
    assert seconds("allreduce", 1e6, shared) == pytest.approx(6.0)  # every rank's bytes on one medium
    latency = Cluster(4, Link(math.inf, 1e-3))
    assert seconds("allreduce", 1e6, latency) == pytest.approx(6e-3) and seconds("allgather", 1, latency) == \
        pytest.approx(3e-3)
    nodes = Cluster(8, Link(1, 0.0), intra=Link(100, 0.0), ranks_per_node=4, hierarchical=True)
    flat = Cluster(8, Link(1, 0.0), intra=Link(100, 0.0), ranks_per_node=4)
    assert seconds("allreduce", 1e8, nodes) < seconds("allreduce", 1e8, flat)
    assert seconds("broadcast", 1e6, flat, members=4) == seconds("broadcast", 1e6, Cluster(4, Link(100, 0.0)))
    # a broadcast among every rank on one medium: the N-1 copies cross it, whatever the algorithm
    assert seconds("broadcast", 1e6, shared) == seconds("broadcast", 1e6, Cluster(4, link, shared=True,
                                                                                   broadcast="root"))


@pytest.mark.parametrize("bad, fragment", [
    (lambda: Link(0), "gbit must be a bandwidth > 0"), (lambda: Link(1, -1), "latency must be seconds"),
    (lambda: Cluster(6, Link(1), ranks_per_node=4), "ranks_per_node must divide ranks"),
    (lambda: Cluster(0, Link(1)), "ranks must be an integer >= 1"),
    (lambda: Cluster(2, Link(1), broadcast="tree"), "broadcast must be one of"),
    (lambda: predict("zip", SHAPES, 0.1, Cluster(2, Link(1))), "method must be one of"),
    (lambda: predict("dense", SHAPES, -1, Cluster(2, Link(1))), "compute_seconds must be seconds >= 0"),
    (lambda: predict("dense", SHAPES, 0.1, Cluster(2, Link(1)), overlap=2), "overlap must be a fraction"),
    (lambda: predict("dense", SHAPES, 0.1, Cluster(2, Link(1)), overhead_seconds=-1), "overhead_seconds must be"),
    (lambda: seconds("reduce", 1, Cluster(2, Link(1))), "collective kind must be one of")])
def test_bad_arguments_name_the_argument(bad, fragment):
    with pytest.raises(ValueError, match=fragment):
        bad()


# ------------------------------------------------------------------------------------------- for real
@pytest.fixture(scope="module", params=[2, 4], ids=["np2", "np4-two-nodes"])
def counted(request):
    from hvdrun import horovodrun

    res, _ = horovodrun(request.param, "tests/workers/project_worker.py", timeout=300)
    return res


def test_counted_bytes_equal_the_plans(counted):
    for r in counted:
        for name, planned in r["planned"].items():
            assert r["counted"][name] == pytest.approx(planned, rel=1e-9), (r["rank"], name)


def test_project_from_a_running_job(counted):
    for r in counted:
        p = r["project"]
        assert p["methods"] == sorted(METHODS) and p["finite"] and p["dense_speedup"] == pytest.approx(1.0)
        assert 0 < p["compute"] <= p["step"]


def test_compute_seconds_are_each_steps_interval_less_what_it_spent(monkeypatch):
    """A step whose collective waited long counts its own wait, not the run's mean: the median of the differences,
    never more than a step, never below 0; unknown where seconds are not measured (TensorFlow)."""
    import horovod_ext.compression.stats as stats_module

    clock = iter([0.0, 0.1, 0.2, 1.3, 1.4, 1.5])  # step ends; the fourth step waited 1.0 s on its collective
    spent = [0.0, 0.05, 0.05, 1.0, 0.05, 0.05]
    monkeypatch.setattr(stats_module.time, "perf_counter", lambda: next(clock))
    timed, untimed = CompressionStats("x"), CompressionStats("x", timed=False)
    for step_seconds in spent:
        for stats in (timed, untimed):
            stats.add(comm_seconds=step_seconds * 0.6, compress_seconds=step_seconds * 0.3,
                      decompress_seconds=step_seconds * 0.1)
        timed.end_step()
        monkeypatch.setattr(stats_module.time, "perf_counter", lambda t=timed._ended_at: t)
        untimed.end_step()
        monkeypatch.setattr(stats_module.time, "perf_counter", lambda: next(clock))
    assert timed.step_seconds() == pytest.approx(0.1)
    assert timed.compute_seconds() == pytest.approx(0.05)  # the mean wait (0.25 s) would leave nothing
    assert timed.as_dict()["compute_seconds"] == pytest.approx(0.05) and untimed.compute_seconds() is None
    with pytest.raises(ValueError, match="pass compute_seconds"):
        compute_seconds_of(untimed.as_dict())
    assert compute_seconds_of(timed.as_dict()) == pytest.approx(0.05)


def test_tensorflow_project_takes_the_model_and_needs_compute_seconds():
    keras = pytest.importorskip("keras")
    from horovod_ext.tensorflow.project import project as tf_project

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(512), keras.layers.Dense(10)])

    class Stats:
        def compression_stats(self):
            return {"steps": 3, "total": {"comm_seconds": 0.0}}  # TensorFlow: no seconds

    with pytest.raises(ValueError, match="pass compute_seconds"):
        tf_project(Stats(), 8, 10, model=model)
    with pytest.raises(ValueError, match="pass model="):
        tf_project(Stats(), 8, 10, compute_seconds=0.1)
    predictions = tf_project(Stats(), 8, 10, model=model, compute_seconds=0.1)
    assert predictions["dense"].wire_bytes == pytest.approx(allreduce_wire_bytes(4 * (64 * 512 + 512 + 5120 + 10), 8))
    slower = tf_project(Stats(), 8, 10, model=model, compute_seconds=0.1, overhead_seconds=0.01)
    assert slower["dense"].step_seconds == pytest.approx(predictions["dense"].step_seconds + 0.01)
    assert slower["dense"].speedup_over_dense == pytest.approx(1.0)  # the baselines take the same overhead


# ------------------------------------------------------------------------------------------- models and command
def test_named_models_ship_their_published_parameter_counts():
    from horovod_ext.perfmodel import catalog

    counts = {name: catalog.load(name)["parameters"] for name in catalog.NAMES}
    assert counts == {"bert-base": 109_482_240, "resnet50": 25_557_032, "vgg16": 138_357_544}
    assert len(catalog.load("resnet50")["shapes"]) == 161  # torchvision's parameter tensors


def test_shapes_files_and_models(tmp_path):
    import torch

    from horovod_ext.perfmodel import catalog, shapes_of

    text = tmp_path / "shapes.txt"
    text.write_text("# my model\n512,64\n512\n10x512\n")
    assert catalog.load(str(text))["shapes"] == [(512, 64), (512,), (10, 512)]
    with pytest.raises(ValueError, match="model must be one of"):
        catalog.load("alexnet")
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    net[1].bias.requires_grad_(False)
    assert shapes_of(net) == [(3, 4), (3,), (2, 3)] and shapes_of([7, (2, 3)]) == [(7,), (2, 3)]
    with pytest.raises(ValueError, match="torch.nn.Module, a Keras model or a list"):
        shapes_of(3.5)


def test_auto_transports_follow_the_compressors_choice():
    """"ternary", "topk" and "adaptive_topk" are planned with the transport the compressor's transport="auto" takes
    at each rank count (the compressors' own choose_transport): two-phase and sparse_reduce where their bytes per
    rank, which do not grow with N as allgather's do, are clearly fewer; and the kernels' seconds follow."""
    from horovod_ext.compressors.transports.sparse_reduce import choose_transport as choose_topk
    from horovod_ext.compressors.transports.two_phase import choose_transport as choose_ternary
    from horovod_ext.perfmodel.catalog import load
    from horovod_ext.perfmodel.plans import transport_of

    shapes = load("resnet50")["shapes"]
    sizes = [math.prod(s) for s in shapes]
    big = [n for n in sizes if n >= 1024]
    cluster = Cluster(64, Link(10.0, 50e-6))
    for n, ternary, topk in ((2, "allgather", "allgather"), (8, "two_phase", "sparse_reduce"),
                             (64, "two_phase", "sparse_reduce")):
        assert choose_ternary("auto", None, big, n, "base3") == ternary and choose_topk("auto", sizes, 100, n) == topk
        assert transport_of("ternary", shapes, n) == (ternary, "ternary_two_phase" if n > 2 else "ternary")
        assert transport_of("topk", shapes, n)[0] == topk == transport_of("adaptive_topk", shapes, n, cf=100)[0]
        for method, scalable, transport in (("ternary", "ternary_two_phase", ternary),
                                            ("topk", "topk_sparse_reduce", topk)):
            same = scalable if transport != "allgather" else None
            if same is not None:
                assert plan(method, shapes, n) == plan(scalable, shapes, n)
            else:
                assert plan(method, shapes, n) == plan(method, shapes, n, transport="allgather")
    assert transport_of("ternary", shapes, 64, shared_scale=False) == ("allgather", "ternary")  # needs the shared scale
    assert transport_of("dense", shapes, 64) == (None, "dense")
    at_64 = predict("ternary", shapes, 0.035, cluster)
    assert at_64.transport == "two_phase" and at_64.wire_bytes == predict("ternary_two_phase", shapes, 0.035,
                                                                          cluster).wire_bytes
    assert at_64.compression_seconds == predict("ternary_two_phase", shapes, 0.035, cluster).compression_seconds
    assert predict("dense", shapes, 0.035, cluster).transport is None
    from horovod_ext.perfmodel.__main__ import label  # the command's rows name the transports across rank counts
    row = [predict("ternary", shapes, 0.035, Cluster(n, Link(10.0, 50e-6))) for n in (2, 4, 8, 64)]
    assert label("ternary", row) == "ternary (allgather from 2, two_phase from 4)"
    assert label("dense", [predict("dense", shapes, 0.035, cluster)]) == "dense"
    assert label("ternary", row[2:]) == "ternary (two_phase)"


def test_command_prints_speedups_and_plots(tmp_path, capsys):
    from horovod_ext.perfmodel.__main__ import main

    png = tmp_path / "plots" / "vgg.png"  # a folder that does not exist yet
    assert main(["--model", "vgg16", "--ranks", "8,64,1024", "--gbit", "1,10", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "1 Gbit/s" in out and "10 Gbit/s" in out and "| dense | 1.00 | 1.00 | 1.00 |" in out
    rows = [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ")]
    assert all(m in rows or any(r.startswith(f"{m} (") for r in rows) for m in METHODS) and png.stat().st_size > 5000
    assert "ternary (two_phase)" in rows and "topk (sparse_reduce)" in rows  # VGG-16 from 8 ranks on
    with pytest.raises(SystemExit):
        main(["--model", "vgg16", "--methods", "dense,zip"])


def test_command_takes_measured_compression_seconds(capsys):
    """--compression-seconds replaces the THROUGHPUT estimate: measured at 1 rank, an allgather method's seconds grow
    with the ranks as its encode and per-payload decode do; a method without THROUGHPUT keeps them as measured."""
    from horovod_ext.perfmodel.__main__ import main, scaled_compression
    from horovod_ext.perfmodel.predict import compression_seconds_of

    shapes = [(200, 1000)]
    elements = 200_000
    at_8 = scaled_compression("ternary", 0.01, shapes, 1, 8)  # 8 ranks: allgather (two-phase saves under 256 KB)
    assert at_8 == pytest.approx(0.01 * compression_seconds_of("ternary", elements, 8)
                                 / compression_seconds_of("ternary", elements, 1))
    assert at_8 > 0.01 and scaled_compression("powersgd", 0.02, shapes, 1, 64) == 0.02
    at_64 = scaled_compression("ternary", 0.01, shapes, 1, 64)  # two-phase: one stream decoded, whatever N
    assert at_64 == pytest.approx(0.01 * compression_seconds_of("ternary_two_phase", elements, 64)
                                  / compression_seconds_of("ternary", elements, 1)) == pytest.approx(0.01)

    def step_ms(seconds):
        main(["--model", "resnet50", "--compute-seconds", "0.05", "--ranks", "8", "--gbit", "10",
              "--methods", "dense,powersgd", "--compression-seconds", f"powersgd={seconds}"])
        row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| powersgd |")][0]
        return float(row.split("|")[-2])

    assert step_ms(0.1) - step_ms(0.0) == pytest.approx(100, abs=1)  # powersgd's 100 ms of kernels, added whole
    for bad in (["--compression-seconds", "zip=1"], ["--compression-seconds", "ternary=-1"],
                ["--measured-ranks", "0"]):
        with pytest.raises(SystemExit):
            main(["--model", "resnet50", "--compute-seconds", "0.05"] + bad)
    assert "unknown method 'zip'" in capsys.readouterr().err
