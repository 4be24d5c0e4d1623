"""What scripts/setup.sh does on this machine, decided from what the machine has.

The rules (docs/setup.md):

- **The environment.** An active one (``VIRTUAL_ENV`` or ``CONDA_PREFIX``) is used as it is: its frameworks are the
  user's, and set-up builds for them. Otherwise ``.venv/`` at the repo root: where the base interpreter (``python3``)
  already holds a supported torch or TensorFlow (a CUDA build, say), ``.venv`` is made with
  ``--system-site-packages`` so that it sees them and installs nothing over them; where it holds none, ``.venv`` is a
  fresh one and gets the pinned CPU builds (``requirements.txt``).
- **The frameworks.** In a fresh ``.venv``: the pinned ones. In the user's environment: exactly the ones present,
  each within SUPPORTED (a version outside it stops set-up with a message naming it and the range; a framework that
  is absent is not built for). Neither present stops set-up too: nothing would be left to build.
- **Horovod** is built for those frameworks, always with Gloo, with MPI where ``mpicxx`` is found (OpenMPI), and
  with NCCL for its GPU operations where torch is a CUDA build, NCCL's header and library are found (the
  ``nvidia-nccl`` wheel a CUDA torch depends on, ``HOROVOD_NCCL_HOME``/``NCCL_HOME``, or the system's) and nvcc is
  found. ``HVDEXT_HOROVOD_MPI=0`` / ``HVDEXT_HOROVOD_NCCL=0`` turn either off. The wheel cache is keyed by these
  choices (``cache_key``), and an installed Horovod is kept only if ``horovodrun --check-build`` shows every one.

``python scripts/setup_plan.py facts`` prints this interpreter's facts as JSON; ``environment`` prints how to make
``.venv`` (``fresh`` or ``system-site``) from the base interpreter's facts; ``plan`` prints the plan as shell
assignments for setup.sh (errors go to stderr with exit status 2); ``constraints`` prints pip constraints holding the
installed frameworks; ``check-build WANTS`` prints what a ``--check-build`` report on stdin (or, with ``installed``, the
installed Horovod) lacks of the plan. Only the standard library is used: this runs before anything is installed.
"""
import glob
import importlib
import importlib.metadata as metadata
import json
import os
import re
import shlex
import shutil
import sys

# Versions set-up accepts in a user's environment, [low, high) on (major, minor); TESTED are the ones CI runs.
SUPPORTED = {"torch": ((2, 1), (2, 15)), "tensorflow": ((2, 16), (2, 22))}
WHY_RANGE = {
    "torch": "Horovod 0.28.1 builds against torch >= 2.1 with its C++17 patch (scripts/build_horovod.sh); 2.14 is "
             "the newest release seen",
    "tensorflow": "horovod_ext.tensorflow is written for Keras 3 (TensorFlow >= 2.16); 2.21 is the newest release "
                  "seen",
}
PINNED = {"torch": "torch==2.13.0", "tensorflow": "tensorflow-cpu==2.21.0"}
TESTED = {"torch": "2.13.0 (CPU)", "tensorflow": "2.21.0 (tensorflow-cpu)"}
HOROVOD_VERSION = "0.28.1"
# The revision of scripts/build_horovod.sh's edits to Horovod's sources, part of the wheel cache's key: a wheel
# built with other edits is not reused.
SOURCE_EDITS = "edits5"
# in the installed horovod package: the cache key of the wheel build_horovod.sh built
BUILD_MARKER = "horovod_ext_build"
TENSORFLOW_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly", "tensorflow-intel")


class SetupError(Exception):
    """Set-up cannot go on; the message says why and what to do."""


def version_tuple(version):
    """(major, minor) of a version string such as '2.11.0+cu130', '2.21.0rc1' or '2.22.0.dev20260101'."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise SetupError(f"cannot read the version {version!r}")
    return int(match.group(1)), int(match.group(2))


def supported(framework, version):
    low, high = SUPPORTED[framework]
    return low <= version_tuple(version) < high


def range_text(framework):
    (a, b), (c, d) = SUPPORTED[framework]
    return f">= {a}.{b} and < {c}.{d}"


# ----------------------------------------------------------------------------------------------------- probing
def _torch_facts():
    try:
        metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None
    import torch  # a CUDA build is known only from the module (PyPI's default Linux wheel has no '+cu' tag)

    return {"version": torch.__version__, "cuda": torch.version.cuda}


def _tensorflow_facts():
    for name in TENSORFLOW_DISTRIBUTIONS:
        try:
            return {"version": metadata.version(name), "distribution": name}
        except metadata.PackageNotFoundError:
            continue
    return None


def _nccl_home():
    """A folder with include/nccl.h and a libnccl.so* under lib/ (or lib64/), or None."""
    candidates = [os.environ.get("HOROVOD_NCCL_HOME"), os.environ.get("NCCL_HOME")]
    try:
        import importlib.util

        spec = importlib.util.find_spec("nvidia.nccl")
        if spec is not None and spec.submodule_search_locations:
            candidates += list(spec.submodule_search_locations)
    except (ImportError, ValueError):
        pass
    candidates += ["/usr/local/nccl", "/usr"]
    for home in filter(None, candidates):
        if not os.path.exists(os.path.join(home, "include", "nccl.h")):
            continue
        libs = glob.glob(os.path.join(home, "lib*", "libnccl.so*")) + \
            glob.glob(os.path.join(home, "lib", "x86_64-linux-gnu", "libnccl.so*"))
        if libs:
            return {"home": home, "library": sorted(libs)[0]}
    return None


def _cuda_home():
    """The CUDA toolkit's folder (bin/nvcc and include/): CUDA_HOME, CUDA_PATH, /usr/local/cuda, or nvcc's."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        homes.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    for home in filter(None, homes):
        if os.path.exists(os.path.join(home, "bin", "nvcc")) and os.path.isdir(os.path.join(home, "include")):
            return os.path.realpath(home)
    return None


def facts():
    """What this interpreter's environment and the machine have (the inputs of every decision here)."""
    torch = _torch_facts()
    return {
        "python": sys.executable,
        "prefix": sys.prefix,
        "torch": torch,
        "tensorflow": _tensorflow_facts(),
        "nccl": _nccl_home() if torch and torch.get("cuda") else None,
        "cuda_home": _cuda_home(),
        "mpicxx": shutil.which("mpicxx"),
    }


def base_python():
    """The interpreter .venv is made from: this one, or, where this one is a virtual environment's (its bin on PATH
    while it is not active), the interpreter that environment was made from, whose frameworks
    --system-site-packages will see."""
    if sys.prefix == sys.base_prefix:
        return sys.executable
    return getattr(sys, "_base_executable", None) or os.path.join(sys.base_prefix, "bin", "python3")


# --------------------------------------------------------------------------------------------------- decisions
def choose_environment(base):
    """How to make .venv from the base interpreter's facts: 'system-site' where it holds a supported framework
    (so that .venv uses it), 'fresh' where it holds none. A framework outside SUPPORTED stops (it would otherwise be
    shadowed by a pinned CPU build without a word)."""
    present = {name: base[name]["version"] for name in SUPPORTED if base.get(name)}
    unsupported = {name: v for name, v in present.items() if not supported(name, v)}
    if unsupported:
        raise SetupError(_unsupported_message(unsupported, base["python"]) +
                         " Or set HVDEXT_FRESH_VENV=1 to set up .venv/ apart from it with the pinned CPU builds.")
    return "system-site" if present else "fresh"


def _unsupported_message(unsupported, where):
    lines = [f"{name} {version} in {where} is not supported: horovod-ext needs {name} {range_text(name)} "
             f"({WHY_RANGE[name]})." for name, version in sorted(unsupported.items())]
    return " ".join(lines) + " Set-up replaces no framework: install a supported version yourself."


def plan(env, mode, options=None):
    """The set-up plan for an environment's facts. mode: 'fresh' (our .venv, pinned frameworks), 'system-site'
    (our .venv over the base interpreter's frameworks) or 'active' (the user's environment). options: the
    HVDEXT_HOROVOD_MPI / HVDEXT_HOROVOD_NCCL switches ('0' turns one off). Returns a dict: frameworks, install
    (pip requirements for the frameworks, fresh only), horovod (its build choices), cache_key, reasons (what was
    decided and why, for the log); raises SetupError."""
    options = options or {}
    reasons = []
    if mode == "fresh":
        frameworks = ["torch", "tensorflow"]
        install = [PINNED[name] for name in frameworks
                   if not (env.get(name) and env[name]["version"].startswith(PINNED[name].split("==")[1]))]
        reasons.append("a fresh .venv: the pinned CPU builds " + ", ".join(PINNED.values()))
        torch_cuda = None
    else:
        present = {name: env[name]["version"] for name in SUPPORTED if env.get(name)}
        if not present:
            raise SetupError(
                f"neither torch nor TensorFlow is installed in {env['prefix']}: install torch {range_text('torch')} "
                f"and/or TensorFlow {range_text('tensorflow')} there, or deactivate it (set-up then makes .venv/ "
                f"with {' and '.join(PINNED.values())})")
        unsupported = {name: v for name, v in present.items() if not supported(name, v)}
        if unsupported:
            raise SetupError(_unsupported_message(unsupported, env["prefix"]))
        frameworks = sorted(present)
        install = []
        for name, version in sorted(present.items()):
            extra = f", CUDA {env['torch']['cuda']}" if name == "torch" and env["torch"].get("cuda") else ""
            reasons.append(f"{name} {version}{extra}: the environment's own, kept")
        for name in sorted(set(SUPPORTED) - set(present)):
            reasons.append(f"{name}: not installed, not built for")
        torch_cuda = env["torch"].get("cuda") if env.get("torch") else None

    mpi = bool(env.get("mpicxx")) and options.get("mpi", "auto") != "0"
    if options.get("mpi") == "0":
        reasons.append("MPI: off (HVDEXT_HOROVOD_MPI=0)")
    elif mpi:
        reasons.append(f"MPI: {env['mpicxx']} found, built with MPI")
    else:
        reasons.append("MPI: no mpicxx (OpenMPI) found, Gloo only (horovodrun --gloo)")

    nccl = False
    if options.get("nccl") == "0":
        reasons.append("NCCL: off (HVDEXT_HOROVOD_NCCL=0)")
    elif not torch_cuda:
        reasons.append("NCCL: torch is a CPU build (or absent), no GPU operations")
    elif not env.get("nccl"):
        reasons.append("NCCL: torch is a CUDA build but nccl.h and libnccl were not found (pip install "
                       "nvidia-nccl-cu12 or set HOROVOD_NCCL_HOME); GPU tensors go through Gloo on the host")
    elif not env.get("cuda_home"):
        reasons.append("NCCL: found, but no nvcc (CUDA_HOME) to build Horovod's GPU operations with")
    else:
        nccl = True
        reasons.append(f"NCCL: torch is a CUDA build and NCCL is in {env['nccl']['home']}: "
                       f"HOROVOD_GPU_OPERATIONS=NCCL")
    horovod = {"pytorch": "torch" in frameworks, "tensorflow": "tensorflow" in frameworks, "gloo": True, "mpi": mpi,
               "nccl": nccl}
    return {"frameworks": frameworks, "install": install, "horovod": horovod,
            "cache_key": cache_key(env, frameworks, horovod, install), "reasons": reasons}


def cache_key(env, frameworks, horovod, install):
    """The Horovod wheel cache's key: the framework versions it links, the build's choices and the revision of
    our edits to its sources."""
    versions = {name: env[name]["version"] if env.get(name) else None for name in SUPPORTED}
    for requirement in install:  # not installed yet: the pinned version is what it will be built against
        name = "torch" if requirement.startswith("torch") else "tensorflow"
        versions[name] = requirement.split("==")[1] + ("+cpu" if name == "torch" else "")
    parts = [f"torch{versions['torch']}" if "torch" in frameworks else "notorch",
             f"tf{versions['tensorflow']}" if "tensorflow" in frameworks else "notf",
             "gloo" + ("-mpi" if horovod["mpi"] else "") + ("-nccl" if horovod["nccl"] else "")]
    return f"horovod-{HOROVOD_VERSION}-" + "-".join(parts).replace("+", "_") + f"-{SOURCE_EDITS}"


def cuda_cc_list(arch_list=None):
    """Horovod's HOROVOD_BUILD_CUDA_CC_LIST from TORCH_CUDA_ARCH_LIST ("8.0;9.0+PTX" -> "80,90"), else "80,90" (the
    architectures horovod_ext's own kernels are built for; Horovod's default list starts below what CUDA 13 takes)."""
    arch_list = os.environ.get("TORCH_CUDA_ARCH_LIST", "8.0;9.0") if arch_list is None else arch_list
    archs = [a.strip().split("+")[0].replace(".", "") for a in re.split(r"[;, ]+", arch_list) if a.strip()]
    return ",".join(a for a in archs if a.isdigit()) or "80,90"


def build_environment(horovod, env):
    """The HOROVOD_* variables of the build (Horovod's setup.py reads them)."""
    variables = {
        "HOROVOD_WITH_PYTORCH" if horovod["pytorch"] else "HOROVOD_WITHOUT_PYTORCH": "1",
        "HOROVOD_WITH_TENSORFLOW" if horovod["tensorflow"] else "HOROVOD_WITHOUT_TENSORFLOW": "1",
        "HOROVOD_WITHOUT_MXNET": "1",
        "HOROVOD_WITH_GLOO": "1",
        "HOROVOD_WITH_MPI" if horovod["mpi"] else "HOROVOD_WITHOUT_MPI": "1",
    }
    if not horovod["mpi"]:
        variables["HOROVOD_CPU_OPERATIONS"] = "GLOO"
    if horovod["nccl"]:
        variables.update(HOROVOD_GPU="CUDA", HOROVOD_BUILD_CUDA_CC_LIST=cuda_cc_list(),
                         HOROVOD_GPU_OPERATIONS="NCCL", HOROVOD_NCCL_LINK="SHARED",
                         HOROVOD_CUDA_HOME=env["cuda_home"], HVDEXT_NCCL_LIBRARY=env["nccl"]["library"],
                         HVDEXT_NCCL_HOME=env["nccl"]["home"])
    return variables


def check_build_lacks(horovod, report):
    """What `horovodrun --check-build`'s report lacks of the planned build (empty: the installed Horovod serves)."""
    if f"Horovod v{HOROVOD_VERSION}" not in report:
        return [f"Horovod v{HOROVOD_VERSION}"]
    ours = re.search(r"built by horovod-ext: (\S+)", report)
    if ours and not ours.group(1).endswith(f"-{SOURCE_EDITS}"):  # an earlier revision of our edits
        return [f"horovod-ext's source edits {SOURCE_EDITS}"]
    wanted = [("pytorch", "[X] PyTorch"), ("tensorflow", "[X] TensorFlow"), ("gloo", "[X] Gloo"),
              ("mpi", "[X] MPI"), ("nccl", "[X] NCCL")]
    return [line for key, line in wanted if horovod[key] and line not in report]


def installed_build_report():
    """What `horovodrun --check-build` reports of the installed Horovod, in its words, read in this process (the
    command checks each framework in a process of its own: about 20 s; this takes the imports' time)."""
    try:
        import horovod
    except ImportError:
        return ""
    lines = [f"Horovod v{horovod.__version__}:"]
    marker = os.path.join(os.path.dirname(horovod.__file__), BUILD_MARKER)
    if os.path.exists(marker):  # installed by scripts/build_horovod.sh (absent: a Horovod of the user's own)
        with open(marker) as f:
            lines.append(f"    built by horovod-ext: {f.read().strip()}")
    built = {"PyTorch": None, "TensorFlow": None}
    for framework, module in (("PyTorch", "horovod.torch"), ("TensorFlow", "horovod.tensorflow")):
        try:
            built[framework] = importlib.import_module(module)
        except Exception:  # noqa: BLE001 - absent, or built without it: either way not available
            pass
    modules = [m for m in built.values() if m is not None]
    for framework, module in built.items():
        lines.append(f"    [{'X' if module is not None else ' '}] {framework}")
    for name in ("MPI", "Gloo", "NCCL"):
        check = f"{name.lower()}_built"
        yes = any(bool(getattr(m, check)()) for m in modules)
        lines.append(f"    [{'X' if yes else ' '}] {name}")
    return "\n".join(lines)


def framework_constraints():
    """pip constraint lines holding every installed framework distribution at its version."""
    lines = []
    for name in ("torch",) + TENSORFLOW_DISTRIBUTIONS:
        try:
            lines.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return "\n".join(lines)


def main(argv):
    command = argv[1] if len(argv) > 1 else "plan"
    try:
        if command == "facts":
            print(json.dumps(facts(), indent=1))
        elif command == "constraints":
            print(framework_constraints())
        elif command == "environment":
            print(choose_environment(facts()))
        elif command == "base-python":
            print(base_python())
        elif command == "plan":
            mode = argv[2]
            env = facts()
            options = {"mpi": os.environ.get("HVDEXT_HOROVOD_MPI", "auto"),
                       "nccl": os.environ.get("HVDEXT_HOROVOD_NCCL", "auto")}
            result = plan(env, mode, options)
            for reason in result["reasons"]:
                print(f"[setup] {reason}", file=sys.stderr)
            assignments = {"HVDEXT_FRAMEWORKS": " ".join(result["frameworks"]),
                           "HVDEXT_INSTALL": " ".join(result["install"]),
                           "HVDEXT_HOROVOD_KEY": result["cache_key"],
                           "HVDEXT_HOROVOD_WANTS": json.dumps(result["horovod"]),
                           "HVDEXT_HOROVOD_ENV": " ".join(f"{k}={v}" for k, v in
                                                          sorted(build_environment(result["horovod"], env).items()))}
            for key, value in assignments.items():
                print(f"{key}={shlex.quote(value)}")
        elif command == "check-build":  # argv[2]: HVDEXT_HOROVOD_WANTS; the report on stdin, or "installed"
            report = installed_build_report() if argv[3:] == ["installed"] else sys.stdin.read()
            lacks = check_build_lacks(json.loads(argv[2]), report)
            print(", ".join(lacks))
            return 1 if lacks else 0
        else:
            raise SystemExit(f"usage: {argv[0]} facts|environment|base-python|constraints|"
                             f"plan fresh|system-site|active|"
                             f"check-build WANTS [installed]")
    except SetupError as exc:
        print(f"[setup] stopped: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
