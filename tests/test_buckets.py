"""Buckets (horovod_ext/compression/buckets.py): the plan's assignment, the argument's checks, and under horovodrun
(one launch per framework and rank count) every method's bits at bucket_cap_mb 0, 0.03 and 25, the collectives a
step asks of Horovod, checkpoints loaded under another cap, and bad input on every rank: PyTorch
(tests/workers/buckets_worker.py) and TensorFlow's tape eagerly and in tf.function and Keras's DistributedOptimizer
in tf.function (tests/workers/tf_buckets_worker.py)."""
import math
import types

import pytest

from horovod_ext.compression.buckets import MEGABYTE, BucketPlan, FusingBackend, check_bucket_cap_mb
from bucket_cases import horovod_path_runs
from hvdrun import horovodrun

F32 = ("torch.float32", "cpu")


def test_buckets_fill_in_reverse_parameter_order_up_to_the_cap():
    # tensors 0..4 of 300, 100, 500, 100, 300 bytes; a cap of 600 bytes
    plan = BucketPlan([(300, F32), (100, F32), (500, F32), (100, F32), (300, F32)], 600 / MEGABYTE)
    # reversed: 4 (300) + 3 (100) = 400; 2 (500) would make 900: a new bucket, 500; 1 (100): 600; 0 (300): new
    assert plan.members == [(3, 4), (1, 2), (0,)]
    assert [plan.bucket_of[i] for i in range(5)] == [2, 1, 1, 0, 0]
    assert plan.shared(0) is None and plan.shared(1) == 1 and plan.fuses


def test_a_tensor_larger_than_the_cap_is_a_bucket_of_its_own_and_dtypes_never_share_one():
    f16 = ("torch.float16", "cpu")
    plan = BucketPlan([(10, F32), (10, f16), (5000, F32), (10, F32), (10, f16)], 1000 / MEGABYTE)
    # reversed: 4 opens a float16 bucket that 1 joins; 3 a float32 one that 2 (alone) and then 0 cannot join
    assert plan.members == [(1, 4), (3,), (2,), (0,)]


def test_cap_zero_keeps_one_tensor_per_bucket():
    plan = BucketPlan([(4, F32)] * 3, 0)
    assert plan.members == [(2,), (1,), (0,)] and not plan.fuses
    assert all(plan.shared(i) is None for i in range(3))


def test_the_default_cap_holds_25_mebibytes():
    plan = BucketPlan([(MEGABYTE, F32)] * 60, 25)
    assert [len(m) for m in plan.members] == [25, 25, 10]


@pytest.mark.parametrize("bad", [-1, -0.5, "25", None, True, math.nan, math.inf, [25]])
def test_a_bad_cap_names_the_argument_and_what_it_takes(bad):
    with pytest.raises(ValueError, match=r"bucket_cap_mb must be a number >= 0 .*got"):
        check_bucket_cap_mb(bad)


@pytest.fixture(scope="module")
def launch2():
    return horovod_path_runs(2)


@pytest.fixture(scope="module")
def launch4():
    return horovod_path_runs(4)


@pytest.fixture(params=["launch2", "launch4"], ids=["np2", "np4"])
def launch(request):
    return request.getfixturevalue(request.param)


# every tensor by allgather (min_size=0, or top-k's, whose every tensor is compressed): pure data movement, the
# bits of bucket_cap_mb=0 at any rank count
ALLGATHER_ONLY = ("ternary-ef-2bit", "ternary-shared", "ternary-two_phase", "topk", "topk-int32", "topk-sparse_reduce",
                  "adaptive_topk")


def digests_of(r, method):
    return {cap: r["runs"][f"{method}@{cap}"]["digest"] for cap in ("0", "0.03", "25", "25.again")}


def test_every_method_gives_the_bits_of_cap_zero_at_two_ranks(launch2):
    """At two ranks a sum of two is the same in either order: every method, every cap."""
    launch = launch2
    for r in launch:
        methods = sorted({key.split("@")[0] for key in r["runs"]})
        assert len(methods) == 10
        for method in methods:
            if method == "auto":  # its choices follow measured times, whatever the cap: the ranks agree below
                continue
            digests = digests_of(r, method)
            assert len(set(digests.values())) == 1, (r["rank"], method, digests)
    for key in launch[0]["runs"]:  # the ranks agree, every method and cap, auto's included
        assert len({r["runs"][key]["digest"] for r in launch}) == 1, key


def test_allgathered_methods_give_the_bits_of_cap_zero_at_four_ranks(launch4):
    """At 4 ranks an allreduce's sum of an element depends on where the element sits in the buffer (Horovod's ring
    over its fusion buffer), and unbucketed, which allreduces Horovod fuses in a cycle depends on timing: cap 0's
    dense tensors are not reproducible from run to run there (benchmarks/RESULTS.md, "Buckets"). Payloads that
    travel by allgather are the same bits at every cap; a bucketed step is the same bits from run to run."""
    launch = launch4
    for r in launch:
        for method in ALLGATHER_ONLY:
            digests = digests_of(r, method)
            assert len(set(digests.values())) == 1, (r["rank"], method, digests)
        for method in ("ternary", "powersgd"):  # not auto: its choices follow measured times
            digests = digests_of(r, method)
            assert digests["25"] == digests["25.again"], (r["rank"], method, digests)
    for key in launch[0]["runs"]:
        assert len({r["runs"][key]["digest"] for r in launch}) == 1, key


def test_a_bucket_asks_horovod_for_one_collective_per_kind(launch):
    """14 tensors: at cap 0 a collective each plus the join check; at 25 MB one bucket: one allgather of the
    payloads, one allreduce of the dense tensors (ternary's biases, below min_size) and the join check, whatever the
    tensor count."""
    for r in launch:
        runs = r["runs"]
        for method, fused in (("ternary", 3), ("topk", 2), ("topk-int32", 2), ("ternary-ef-2bit", 2),
                              ("adaptive_topk", 3), ("ternary-shared", 3)):
            unfused = 16 if method in ("adaptive_topk", "ternary-shared") else 15  # + GraVAC's norms, the scales
            assert runs[f"{method}@0"]["collectives"] == unfused, (method, runs[f"{method}@0"])
            assert runs[f"{method}@25"]["collectives"] == fused, (method, runs[f"{method}@25"])
            assert runs[f"{method}@25"]["buckets"] == 1 and runs[f"{method}@0.03"]["buckets"] == 3
        # PowerSGD: the matrices' factors in one buffer a step already; its dense vectors are bucketed
        assert runs["powersgd@0"]["collectives"] == 10 and runs["powersgd@25"]["collectives"] == 4, runs["powersgd@25"]


def test_deferred_encodes_run_per_method_with_the_backend_each_deferred_through():
    """Two methods (Compression.auto's candidates) defer tensors of one bucket: when its last tensor is launched,
    each method's encode runs once, on its own tensors in parameter order, with the backend it deferred through
    (its candidate's names and residuals), in the order of each one's first tensor; a tensor outside a shared
    bucket is not deferred."""
    plan = BucketPlan([(4, F32)] * 4 + [(MEGABYTE, F32)], 1)  # tensors 0-3 share a bucket; 4 is alone
    fusing = FusingBackend(types.SimpleNamespace(), plan, None)
    calls = []

    def method(tag):
        return lambda caller, items: calls.append((tag, caller, [item.index for item in items]))

    first, second = method("a"), method("b")
    items = [types.SimpleNamespace(index=i) for i in range(5)]
    assert not fusing.defer(items[4], first, "be-a")
    for item, encode, caller in ((items[3], second, "be-b"), (items[1], first, "be-a"), (items[2], second, "be-b"),
                                 (items[0], first, "be-a")):
        assert fusing.defer(item, encode, caller)
    fusing._encode_deferred({plan.bucket_of[0]})
    assert calls == [("a", "be-a", [0, 1]), ("b", "be-b", [2, 3])]
    assert not fusing._deferred


def test_host_reads_per_step_do_not_grow_with_the_tensors(launch):
    """What a step reads back to the host, counted at torch.Tensor (on a GPU each is a wait for the device): the
    join check's answer, each rank's header of the bucket's allgather, the shared scales, GraVAC's controller, and
    the step's finiteness and decoding flags read together once (context.settled_errors), whether the model has
    14 tensors or 2. Before the flags were read together, each tensor's finiteness check read its min and max
    (2 reads a tensor)."""
    for r in launch:
        reads, n = r["host_reads"], r["size"]
        for method in ("ternary", "ternary-shared", "topk", "adaptive_topk", "powersgd"):
            # join check + a header per rank + the flags + (the shared scales) + (GraVAC: its readings, its decision,
            # its payloads' sizes, the readings' finiteness)
            bound = 1 + n + 1 + (method == "ternary-shared") + 4 * (method == "adaptive_topk")
            assert reads[f"{method}@14"] <= bound and reads[f"{method}@2"] <= bound, (method, reads)


def test_the_header_bytes_are_counted(launch):
    """A fused allgather carries its payloads' sizes (4 bytes a tensor a rank): 2-bit ternary's payload is fixed, so
    the difference is the header alone, 14 tensors (min_size=0) x 4 bytes x 4 steps."""
    for r in launch:
        runs = r["runs"]
        extra = runs["ternary-ef-2bit@25"]["payload_bytes"] - runs["ternary-ef-2bit@0"]["payload_bytes"]
        assert extra == 14 * 4 * 4, extra


def test_a_checkpoint_loads_under_another_cap_to_the_same_bits(launch):
    for r in launch:
        life = r["lifecycle"]
        for method in ("ternary-ef-2bit", "topk", "adaptive_topk"):
            digests = {key: value for key, value in life.items() if key.startswith(method + "@")}
            assert len(digests) == 4 and len(set(digests.values())) == 1, (r["rank"], digests)


def test_bad_caps_raise_on_every_rank_before_any_collective(launch):
    for r in launch:
        for value, said in r["bad_input"].items():
            assert said is not None and "bucket_cap_mb" in said and ">= 0" in said, (r["rank"], value, said)


# TensorFlow: at 4 ranks the methods whose every tensor travels by allgather (two processes a core: fewer runs)
TF_AT_FOUR = "ternary-ef-2bit,topk"


@pytest.fixture(scope="module", params=[2, 4], ids=["np2", "np4"])
def tf_launch(request):
    hosts = "localhost:2,127.0.0.1:2" if request.param == 4 else None
    args = [TF_AT_FOUR] if request.param == 4 else []
    results, _ = horovodrun(request.param, "tests/workers/tf_buckets_worker.py", *args, timeout=900, hosts=hosts)
    return results


def test_tensorflow_gives_the_same_bits_under_every_cap(tf_launch):
    """Eagerly, inside tf.function and through Keras: at 2 ranks every method, at 4 the allgathered ones."""
    for r in tf_launch:
        runs = r["runs"]
        configurations = sorted({key.split("@")[0] for key in runs})
        assert len(configurations) == (18 if r["size"] == 2 else 6), configurations
        for configuration in configurations:
            digests = {cap: runs[f"{configuration}@{cap}"]["digest"] for cap in ("0", "0.03", "25")}
            assert len(set(digests.values())) == 1, (r["rank"], configuration, digests)
            assert runs[f"{configuration}@25"]["buckets"] == 1 and runs[f"{configuration}@0.03"]["buckets"] == 3
    assert len({r["runs"]["eager/topk@25"]["digest"] for r in tf_launch}) == 1


def test_tensorflow_buckets_ask_horovod_for_one_collective_per_kind(tf_launch):
    for r in tf_launch:
        runs = r["runs"]
        for method, fused in (("ternary", 3), ("topk", 2), ("ternary-ef-2bit", 2), ("ternary-shared", 3)):
            if f"eager/{method}@0" not in runs:
                continue
            unfused = 16 if method == "ternary-shared" else 15
            assert runs[f"eager/{method}@0"]["collectives"] == unfused, (method, runs[f"eager/{method}@0"])
            assert runs[f"eager/{method}@25"]["collectives"] == fused, (method, runs[f"eager/{method}@25"])


def test_tensorflow_bad_caps_raise_on_every_rank(tf_launch):
    for r in tf_launch:
        assert len(r["bad_input"]) == 8
        for value, said in r["bad_input"].items():
            assert said is not None and "bucket_cap_mb must be a number >= 0" in said, (r["rank"], value, said)
