"""horovod-ext: communication-efficient training for Horovod (PyTorch and TensorFlow).

The native op library in cpp/ is framework-free; this file builds, where torch is installed, its PyTorch binding as the
extension ``horovod_ext._torch_ops`` and, where TensorFlow is installed, its TensorFlow binding as the custom-op library
``horovod_ext/tensorflow/_tf_ops.so`` (compiled with TensorFlow's own flags, rebuilt only when a source changed).

Where torch is a CUDA build and nvcc is found (CUDA_HOME), the PyTorch extension also holds the GPU kernels of
cpp/cuda/ (sm_80 and sm_90 by default, TORCH_CUDA_ARCH_LIST overrides) and dispatches CUDA tensors to them;
HVDEXT_WITH_CUDA=0 forces a CPU-only build, HVDEXT_WITH_CUDA=1 fails loudly where CUDA cannot be built.
"""
import glob
import os
import subprocess
import sys

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
CORE_SOURCES = sorted(glob.glob("cpp/src/*.cpp"))
CORE_HEADERS = sorted(glob.glob("cpp/include/hvdext/*.h"))
CUDA_SOURCES = sorted(glob.glob("cpp/cuda/*.cu"))
CUDA_HEADERS = sorted(glob.glob("cpp/cuda/*.cuh"))
# Bit-identity with the NumPy reference needs IEEE arithmetic as written: no fused multiply-add, no fast-math.
CXX_FLAGS = ["-O3", "-std=c++17", "-ffp-contract=off", "-fno-fast-math"]
NVCC_FLAGS = ["-O3", "-std=c++17", "--fmad=false", "-Xcompiler", "-ffp-contract=off"]


def cuda_wanted():
    """True where the CUDA kernels can and should be built (see the module docstring)."""
    choice = os.environ.get("HVDEXT_WITH_CUDA", "auto")
    if choice == "0":
        return False
    import torch
    from torch.utils.cpp_extension import CUDA_HOME

    available = torch.version.cuda is not None and CUDA_HOME is not None
    if choice == "1" and not available:
        raise RuntimeError("HVDEXT_WITH_CUDA=1, but torch is a CPU build or nvcc (CUDA_HOME) was not found")
    return available


def torch_extension():
    from torch.utils.cpp_extension import CppExtension, CUDAExtension

    common = dict(include_dirs=[os.path.join(ROOT, "cpp", "include")], depends=CORE_HEADERS + CUDA_HEADERS)
    if cuda_wanted():
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;9.0")
        return CUDAExtension("horovod_ext._torch_ops", sources=CORE_SOURCES + CUDA_SOURCES + ["cpp/torch/ops.cpp"],
                             define_macros=[("HVDEXT_WITH_CUDA", "1")],
                             extra_compile_args={"cxx": CXX_FLAGS, "nvcc": NVCC_FLAGS}, **common)
    return CppExtension("horovod_ext._torch_ops", sources=CORE_SOURCES + ["cpp/torch/ops.cpp"],
                        extra_compile_args=CXX_FLAGS, **common)


def sizes_extension():
    """horovod_ext._sizes: the core's payload-size functions for framework-free Python (no torch, no TF)."""
    from setuptools import Extension

    return Extension("horovod_ext._sizes", sources=CORE_SOURCES + ["cpp/python/sizes.cpp"],
                     include_dirs=[os.path.join(ROOT, "cpp", "include")], depends=CORE_HEADERS,
                     extra_compile_args=CXX_FLAGS, language="c++")


TF_OPS_SOURCES = CORE_SOURCES + ["cpp/tensorflow/ops.cc"]
TF_OPS_LIBRARY = os.path.join("horovod_ext", "tensorflow", "_tf_ops.so")


def build_tensorflow_ops():
    """g++ the TF binding and the core against the installed TensorFlow; a no-op when the library is newer than
    every source and header, or when TensorFlow is not installed."""
    probe = "import tensorflow as tf; print(' '.join(tf.sysconfig.get_compile_flags())); " \
            "print(' '.join(tf.sysconfig.get_link_flags()))"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        print("TensorFlow not installed: skipping the TensorFlow op library")
        return
    target = os.path.join(ROOT, TF_OPS_LIBRARY)
    inputs = [os.path.join(ROOT, f) for f in TF_OPS_SOURCES + CORE_HEADERS]
    if os.path.exists(target) and os.path.getmtime(target) >= max(os.path.getmtime(f) for f in inputs):
        return
    compile_flags, link_flags = result.stdout.strip().splitlines()[-2:]
    cmd = (["g++", "-shared", "-fPIC", *CXX_FLAGS, "-Wno-deprecated-declarations",
            "-I" + os.path.join(ROOT, "cpp", "include")]
           + [os.path.join(ROOT, f) for f in TF_OPS_SOURCES] + compile_flags.split() + link_flags.split()
           + ["-o", target])
    print("building the TensorFlow op library:", TF_OPS_LIBRARY)
    subprocess.check_call(cmd)


def torch_installed():
    """Whether torch is installed: without it (a TensorFlow-only environment) no PyTorch binding is built."""
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def build_ext_class():
    """torch's BuildExtension where torch is installed, else setuptools' build_ext; either also builds the
    TensorFlow op library where TensorFlow is installed."""
    if torch_installed():
        from torch.utils.cpp_extension import BuildExtension

        base = BuildExtension.with_options(use_ninja=False)
    else:
        from setuptools.command.build_ext import build_ext as base

    class BuildBindings(base):
        def run(self):
            super().run()
            build_tensorflow_ops()

    return BuildBindings


packages = find_packages(include=["horovod_ext", "horovod_ext.*"]) + ["hvdext_reference"]
setup(
    name="horovod-ext",
    version="0.1.0",
    description="Gradient compression (TernGrad, top-k, GraVAC) and leader-based optimizers (LSGD) for Horovod",
    packages=packages,
    package_dir={"hvdext_reference": "python/hvdext_reference"},
    python_requires=">=3.9",
    # torch and/or TensorFlow: whichever the environment has (scripts/setup.sh), so neither is required here
    install_requires=["numpy", "horovod"],
    ext_modules=([torch_extension()] if torch_installed() else []) + [sizes_extension()],
    cmdclass={"build_ext": build_ext_class()},
    package_data={"horovod_ext.tensorflow": ["_tf_ops.so"], "horovod_ext.perfmodel": ["models/*.json"]},
    zip_safe=False,
)
