"""Compressor specs and argument checks (framework-free), and the torch gradient checks."""
import pytest
import torch

from horovod_ext.compression import settings_mismatch_message
from horovod_ext.compression.wire import allgather_wire_bytes, allreduce_wire_bytes, tensor_key
from horovod_ext.compressors import Ternary
from horovod_ext.torch_common.kernels import check_gradient


def test_bare_and_configured():
    bare = Ternary()
    assert (bare.clip, bare.shared_scale, bare.packing, bare.min_size, bare.seed) == (2.5, None, "auto", 1024, None)
    configured = bare(clip=None, packing="2bit", seed=3)
    assert configured.clip is None and configured.packing == "2bit" and configured.seed == 3
    assert bare == Ternary() and hash(bare) == hash(Ternary()) and bare != configured
    assert "clip=None" in repr(configured)


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(clip=0), "clip must be > 0.0"), (dict(clip=-1), "clip must be > 0.0"),
    (dict(clip=float("nan")), "clip must be a finite number or None"), (dict(clip="2"), "clip"),
    (dict(packing="3bit"), "one of ('auto', 'entropy', 'base3', '2bit')"), (dict(min_size=-1), "min_size must be >= 0"),
    (dict(min_size=1.5), "min_size must be an integer"),
    (dict(shared_scale=1), "shared_scale must be True, False or None"),
    (dict(seed=-1), "seed must be in [0, 18446744073709551616)"), (dict(seed=2 ** 64), "seed"),
])
def test_invalid_arguments_name_the_argument(kwargs, fragment):
    with pytest.raises(ValueError) as err:
        Ternary(**kwargs)
    assert fragment in str(err.value)


def test_auto_packing_per_device():
    """packing="auto" (the default): entropy-coded packings for host gradients, the fixed packings that the CUDA
    kernels encode and decode for CUDA tensors; explicit packings and Horovod's compressors are left as they are."""
    from horovod_ext.compressors import gravac, topk
    from horovod_ext.compression.specs import resolved_for
    from horovod_ext.torch import Compression

    assert Ternary().for_device("cpu").packing == "entropy" and Ternary().for_device("cuda").packing == "base3"
    assert Ternary(packing="2bit").for_device("cpu").packing == "2bit"
    assert Ternary(clip=3.0).for_device("cuda") == Ternary(clip=3.0, packing="base3")
    assert topk.TopK().for_device("cpu").packing == "delta" and topk.TopK().for_device("cuda").packing == "int32"
    assert gravac.AdaptiveTopK().for_device("cuda").packing == "int32"
    # settings that need the coded indices keep them on a GPU too
    assert topk.TopK(value_dtype="ternary").for_device("cuda").packing == "delta"
    assert topk.TopK(transport="sparse_reduce").for_device("cuda").packing == "delta"
    assert resolved_for(Compression.none, "cuda") is Compression.none
    assert resolved_for(Compression.powersgd, "cuda") == Compression.powersgd
    with pytest.raises(ValueError, match="device must be one of .'cpu', 'cuda'., got 'tpu'"):
        resolved_for(Ternary(), "tpu")
    with pytest.raises(ValueError, match="value_dtype='ternary' needs packing='delta'"):
        topk.TopK(value_dtype="ternary", packing="int32")


def test_stock_horovod_wrappers_get_a_clear_error():
    with pytest.raises(TypeError, match="horovod_ext's DistributedOptimizer"):
        Ternary().compress(torch.zeros(3))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64])
def test_gradient_dtype_errors(dtype):
    with pytest.raises(TypeError, match="'w' has dtype .* allowed dtypes are float16, bfloat16, float32, float64"):
        check_gradient("w", torch.zeros(4, dtype=dtype))


def test_empty_and_huge_gradients():
    with pytest.raises(ValueError, match="'w' is empty"):
        check_gradient("w", torch.zeros(0, 3))
    with pytest.raises(ValueError, match="fewer than 17179869184 are supported"):
        check_gradient("w", torch.empty(2 ** 34, device="meta"))
    check_gradient("w", torch.zeros(3, dtype=torch.bfloat16))


def test_settings_message_lists_each_rank():
    assert settings_mismatch_message([{"a": 1}, {"a": 1}]) is None
    msg = settings_mismatch_message([{"a": 1, "b": 2}, {"a": 1, "b": 3}])
    assert "b: rank 0: 2; rank 1: 3" in msg and "a:" not in msg


def test_wire_formulas():
    assert allreduce_wire_bytes(1000, 4) == 1500 and allreduce_wire_bytes(1000, 1) == 0
    assert allgather_wire_bytes(100, 4) == 300
    assert tensor_key("fc.weight") == tensor_key("fc.weight") != tensor_key("fc.bias")


def test_transport_argument():
    assert Ternary().transport == "auto"
    assert Ternary(shared_scale=True, transport="two_phase").transport == "two_phase"
    assert Ternary(transport="two_phase").shared_scale is None  # the default: as the transport needs
    with pytest.raises(ValueError, match=r"transport='two_phase' needs shared_scale=True \(or None"):
        Ternary(shared_scale=False, transport="two_phase")
    with pytest.raises(ValueError, match=r"transport must be one of \('auto', 'allgather', 'two_phase'\)"):
        Ternary(transport="ring")


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(ratio=0), "ratio must be > 0.0"), (dict(ratio=1.5), "ratio must be in (0, 1]"),
    (dict(value_dtype="bf16"), "value_dtype must be one of ('fp16', 'fp32', 'ternary')"),
    (dict(packing="bits"), "packing must be one of ('auto', 'delta', 'int32')"),
    (dict(value_dtype="ternary", packing="int32"), "value_dtype='ternary' needs packing='delta'"),
    (dict(error_feedback="yes"), "error_feedback must be True or False"),
    (dict(transport="ring"), "transport must be one of ('auto', 'allgather', 'sparse_reduce')"),
    (dict(transport="sparse_reduce", packing="int32"), "transport='sparse_reduce' needs packing='delta'"),
    (dict(transport="sparse_reduce", value_dtype="ternary"), "value_dtype 'fp16' or 'fp32'"),
    (dict(rebalance_every=0), "rebalance_every must be"),
])
def test_topk_invalid_arguments(kwargs, fragment):
    from horovod_ext.compressors.topk import TopK

    with pytest.raises(ValueError) as err:
        TopK(**kwargs)
    assert fragment in str(err.value)


def test_checkpoint_residuals_restore_only_on_their_own_rank_and_size():
    from horovod_ext.compression.resume import adopted_offer, residuals_for, split_checkpoint

    shared, per_rank = split_checkpoint({"step": 7, "seed": 3, "stats": None, "controller": {"step": 7},
                                         "rank": 1, "size": 4, "residuals": {"w": [1.0]}})
    # a checkpoint that held the controller at its top level: read into the method's shared state
    assert shared == {"step": 7, "seed": 3, "stats": None, "method": {"controller": {"step": 7}}}
    assert split_checkpoint({"step": 7, "method": {"regions": {"bounds": [0, 4], "age": 1}}})[0]["method"] == \
        {"regions": {"bounds": [0, 4], "age": 1}}
    assert residuals_for(per_rank, 1, 4) == {"w": [1.0]}
    assert residuals_for(per_rank, 0, 4) is None  # another rank's residuals are never taken
    assert residuals_for(per_rank, 1, 2) is None  # nor those of a job of another size
    # the older layout kept residuals and the controller under "transport"
    shared, per_rank = split_checkpoint({"step": 2, "seed": None, "stats": None,
                                         "transport": {"residuals": {"w": [2.0]}, "controller": None}})
    assert shared["step"] == 2 and residuals_for(per_rank, 0, 8) == {"w": [2.0]}
    assert adopted_offer([None, {"step": 5}, {"step": 9}]) == {"step": 5} and adopted_offer([None, None]) is None
