"""The counter-based generator: Random123's known-answer vectors for Philox4x32-10, and the key layout."""
import numpy as np

from hvdext_reference import philox


def test_known_answers():
    cases = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
         (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    ]
    for counter, key, expected in cases:
        out = philox.philox4x32(np.array([counter], dtype=np.uint32), key)
        assert tuple(int(x) for x in out[0]) == expected


def test_words_follow_the_key_layout():
    words = philox.random_words(10, seed=(7 << 32) | 5, step=3, tensor=11, rank=2)
    block2 = philox.philox4x32(np.array([[2, 3, 11, 2]], dtype=np.uint32), (5, 7))[0]
    assert list(words[8:10]) == list(block2[:2])


def test_uniforms_in_unit_interval():
    u = philox.uniform01(100000, 1, 2, 3, 4)
    assert u.dtype == np.float32 and u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01


def test_native_normal_is_the_reference_draw():
    """PowerSGD's normal draw as the C++ core computes it (cpp/include/hvdext/random.h; the runtime's only draw of
    it) has the reference's bits, in PyTorch's binding and TensorFlow's op, odd lengths and 64-bit seeds included."""
    import torch
    from horovod_ext import _torch_ops as ops
    from horovod_ext.tensorflow.kernels import TFKernels

    for n, seed, step, tensor in ((1, 0, 0, 0), (100001, 5, 1, 9), (4099, 2 ** 64 - 1, 2 ** 32 - 1, 0xFFFFFFFF),
                                  (7, 987654321987654321, 12, 77)):
        want = philox.normal(n, seed, step, tensor)
        out = torch.empty(n)
        ops.normal_fill(out, seed, step, tensor, 0)
        assert np.array_equal(out.numpy(), want), (n, seed, step, tensor)
        assert np.array_equal(TFKernels.normal(n, seed, step, tensor).numpy(), want), (n, seed, step, tensor)
