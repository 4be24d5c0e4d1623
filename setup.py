"""horovod-ext: communication-efficient training for Horovod (PyTorch and TensorFlow).

The native op library in cpp/ is framework-free; this file builds its PyTorch binding as the extension
``horovod_ext._torch_ops``. The TensorFlow binding is a custom-op library compiled against the installed
TensorFlow (its own build step, see scripts/).
"""
import glob
import os

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
CORE_SOURCES = sorted(glob.glob("cpp/src/*.cpp"))
CORE_HEADERS = sorted(glob.glob("cpp/include/hvdext/*.h"))
# Bit-identity with the NumPy reference needs IEEE arithmetic as written: no fused multiply-add, no fast-math.
CXX_FLAGS = ["-O3", "-std=c++17", "-ffp-contract=off", "-fno-fast-math"]


def torch_extension():
    from torch.utils.cpp_extension import CppExtension

    return CppExtension(
        "horovod_ext._torch_ops",
        sources=CORE_SOURCES + ["cpp/torch/ops.cpp"],
        include_dirs=[os.path.join(ROOT, "cpp", "include")],
        depends=CORE_HEADERS,
        extra_compile_args=CXX_FLAGS,
    )


def build_ext_class():
    from torch.utils.cpp_extension import BuildExtension

    return BuildExtension.with_options(use_ninja=False)


packages = find_packages(include=["horovod_ext", "horovod_ext.*"]) + ["hvdext_reference"]
setup(
    name="horovod-ext",
    version="0.1.0",
    description="Gradient compression (TernGrad, top-k, GraVAC) and leader-based optimizers (LSGD) for Horovod",
    packages=packages,
    package_dir={"hvdext_reference": "python/hvdext_reference"},
    python_requires=">=3.9",
    install_requires=["numpy", "torch", "horovod"],
    ext_modules=[torch_extension()],
    cmdclass={"build_ext": build_ext_class()},
    zip_safe=False,
)
