"""scripts/setup.sh's decisions (scripts/setup_plan.py) as unit tests, the refusal of an unsupported framework by
the real script, and one real set-up of an environment that holds torch only (no TensorFlow is installed, Horovod
is built for PyTorch alone, and a job runs in it)."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from hvdrun import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import setup_plan as sp  # noqa: E402

CPU_TORCH = {"version": "2.13.0+cpu", "cuda": None}
CUDA_TORCH = {"version": "2.11.0+cu130", "cuda": "13.0"}
TF = {"version": "2.21.0", "distribution": "tensorflow-cpu"}
NCCL = {"home": "/env/lib/python3.12/site-packages/nvidia/nccl", "library": "/env/.../nvidia/nccl/lib/libnccl.so.2"}


def env(torch=None, tensorflow=None, nccl=None, cuda_home=None, mpicxx=None):
    return {"python": "/env/bin/python", "prefix": "/env", "torch": torch, "tensorflow": tensorflow, "nccl": nccl,
            "cuda_home": cuda_home, "mpicxx": mpicxx}


def test_versions_and_ranges():
    assert sp.version_tuple("2.11.0+cu130") == (2, 11) and sp.version_tuple("2.21.0rc1") == (2, 21)
    assert sp.version_tuple("2.22.0.dev20260101") == (2, 22)
    assert sp.supported("torch", "2.1.0") and sp.supported("torch", "2.14.1") and sp.supported("torch", "2.13.0+cpu")
    assert not sp.supported("torch", "2.0.1") and not sp.supported("torch", "2.15.0")
    assert sp.supported("tensorflow", "2.16.1") and not sp.supported("tensorflow", "2.15.0")
    assert not sp.supported("tensorflow", "2.22.0")


def test_fresh_venv_gets_the_pinned_cpu_builds():
    plan = sp.plan(env(), "fresh")
    assert plan["install"] == ["torch==2.13.0", "tensorflow-cpu==2.21.0"]
    assert plan["frameworks"] == ["torch", "tensorflow"]
    assert plan["cache_key"] == "horovod-0.28.1-torch2.13.0_cpu-tf2.21.0-gloo-edits5"
    # once installed, nothing more; the key stays the same
    again = sp.plan(env(torch=CPU_TORCH, tensorflow=TF), "fresh")
    assert again["install"] == [] and again["cache_key"] == plan["cache_key"]


def test_another_supported_torch_is_kept():
    plan = sp.plan(env(torch=CUDA_TORCH), "active")
    assert plan["install"] == [] and plan["frameworks"] == ["torch"]
    assert any("2.11.0+cu130, CUDA 13.0: the environment's own, kept" in r for r in plan["reasons"])
    assert any("tensorflow: not installed, not built for" in r for r in plan["reasons"])


@pytest.mark.parametrize("version", ["2.0.1", "1.13.1+cu117", "2.15.0"])
def test_unsupported_torch_is_refused_with_the_range(version):
    with pytest.raises(sp.SetupError) as info:
        sp.plan(env(torch={"version": version, "cuda": None}, tensorflow=TF), "active")
    message = str(info.value)
    assert f"torch {version} in /env is not supported" in message
    assert ">= 2.1 and < 2.15" in message and "replaces no framework" in message


def test_unsupported_tensorflow_is_refused():
    with pytest.raises(sp.SetupError, match=r"tensorflow 2.15.1 in /env is not supported.*>= 2.16 and < 2.22"):
        sp.plan(env(torch=CPU_TORCH, tensorflow={"version": "2.15.1"}), "system-site")


def test_no_framework_in_the_users_environment_stops():
    with pytest.raises(sp.SetupError, match="neither torch nor TensorFlow is installed in /env"):
        sp.plan(env(mpicxx="/usr/bin/mpicxx"), "active")


def test_torch_only_and_tensorflow_only():
    torch_only = sp.plan(env(torch=CPU_TORCH), "active")
    assert torch_only["horovod"] == {"pytorch": True, "tensorflow": False, "gloo": True, "mpi": False, "nccl": False}
    assert torch_only["cache_key"] == "horovod-0.28.1-torch2.13.0_cpu-notf-gloo-edits5"
    variables = sp.build_environment(torch_only["horovod"], env(torch=CPU_TORCH))
    assert variables["HOROVOD_WITH_PYTORCH"] == "1" and variables["HOROVOD_WITHOUT_TENSORFLOW"] == "1"
    assert variables["HOROVOD_WITHOUT_MPI"] == "1" and variables["HOROVOD_CPU_OPERATIONS"] == "GLOO"
    tf_only = sp.plan(env(tensorflow=TF), "active")
    assert tf_only["horovod"]["pytorch"] is False and tf_only["horovod"]["tensorflow"] is True
    assert tf_only["cache_key"] == "horovod-0.28.1-notorch-tf2.21.0-gloo-edits5"
    assert "HOROVOD_WITHOUT_PYTORCH" in sp.build_environment(tf_only["horovod"], env(tensorflow=TF))


def test_cuda_torch_with_nccl_chooses_nccl():
    machine = env(torch=CUDA_TORCH, nccl=NCCL, cuda_home="/usr/local/cuda-13.0", mpicxx="/usr/bin/mpicxx")
    plan = sp.plan(machine, "system-site")
    assert plan["horovod"]["nccl"] and plan["horovod"]["mpi"]
    assert plan["cache_key"] == "horovod-0.28.1-torch2.11.0_cu130-notf-gloo-mpi-nccl-edits5"
    variables = sp.build_environment(plan["horovod"], machine)
    assert variables["HOROVOD_GPU_OPERATIONS"] == "NCCL" and variables["HOROVOD_WITH_MPI"] == "1"
    assert variables["HOROVOD_GPU"] == "CUDA" and variables["HOROVOD_BUILD_CUDA_CC_LIST"]
    assert sp.cuda_cc_list("8.0;9.0+PTX") == "80,90" and sp.cuda_cc_list("7.5 8.6") == "75,86"
    assert sp.cuda_cc_list("") == "80,90"
    assert variables["HVDEXT_NCCL_LIBRARY"] == NCCL["library"] and "HOROVOD_CPU_OPERATIONS" not in variables
    assert any("HOROVOD_GPU_OPERATIONS=NCCL" in r for r in plan["reasons"])


def test_nccl_needs_cuda_torch_nccl_and_nvcc():
    no_nccl = sp.plan(env(torch=CUDA_TORCH, cuda_home="/usr/local/cuda"), "active")
    assert not no_nccl["horovod"]["nccl"] and any("nccl.h and libnccl were not found" in r for r in no_nccl["reasons"])
    no_nvcc = sp.plan(env(torch=CUDA_TORCH, nccl=NCCL), "active")
    assert not no_nvcc["horovod"]["nccl"] and any("no nvcc" in r for r in no_nvcc["reasons"])
    cpu = sp.plan(env(torch=CPU_TORCH, nccl=NCCL, cuda_home="/usr/local/cuda"), "active")
    assert not cpu["horovod"]["nccl"]
    off = sp.plan(env(torch=CUDA_TORCH, nccl=NCCL, cuda_home="/c"), "active", {"nccl": "0"})
    assert not off["horovod"]["nccl"] and any("HVDEXT_HOROVOD_NCCL=0" in r for r in off["reasons"])


def test_mpi_where_mpicxx_is_found_unless_turned_off():
    assert sp.plan(env(torch=CPU_TORCH, mpicxx="/usr/bin/mpicxx"), "active")["horovod"]["mpi"]
    assert not sp.plan(env(torch=CPU_TORCH, mpicxx="/usr/bin/mpicxx"), "active", {"mpi": "0"})["horovod"]["mpi"]
    assert not sp.plan(env(torch=CPU_TORCH), "active")["horovod"]["mpi"]


def test_how_dotvenv_is_made_from_the_base_python():
    assert sp.choose_environment(env()) == "fresh"
    assert sp.choose_environment(env(torch=CUDA_TORCH)) == "system-site"
    with pytest.raises(sp.SetupError, match="torch 1.13.1 in /env/bin/python is not supported.*HVDEXT_FRESH_VENV"):
        sp.choose_environment(env(torch={"version": "1.13.1", "cuda": "11.7"}))


REPORT = """Horovod v0.28.1:

Available Frameworks:
    [X] TensorFlow
    [X] PyTorch
    [ ] MXNet

Available Controllers:
    [X] MPI
    [X] Gloo

Available Tensor Operations:
    [ ] NCCL
    [ ] DDL
    [ ] CCL
    [X] MPI
    [X] Gloo
"""


def test_an_installed_horovod_is_kept_only_with_every_planned_choice():
    wants = {"pytorch": True, "tensorflow": True, "gloo": True, "mpi": True, "nccl": False}
    assert sp.check_build_lacks(wants, REPORT) == []
    assert sp.check_build_lacks(dict(wants, nccl=True), REPORT) == ["[X] NCCL"]
    assert sp.check_build_lacks(wants, REPORT.replace("[X] MPI", "[ ] MPI")) == ["[X] MPI"]
    assert sp.check_build_lacks(wants, REPORT.replace("v0.28.1", "v0.28.0")) == ["Horovod v0.28.1"]
    assert sp.check_build_lacks(wants, "") == ["Horovod v0.28.1"]


def test_facts_of_this_environment():
    facts = json.loads(subprocess.check_output([sys.executable, os.path.join(ROOT, "scripts", "setup_plan.py"),
                                                "facts"], text=True))
    import torch

    assert facts["torch"]["version"] == torch.__version__ and facts["torch"]["cuda"] == torch.version.cuda
    assert facts["mpicxx"] == shutil.which("mpicxx")


def test_constraints_hold_the_installed_frameworks():
    import torch

    lines = sp.framework_constraints().splitlines()
    assert f"torch=={torch.__version__}" in lines and all("==" in line for line in lines)


def test_nccl_is_found_where_a_wheel_or_home_holds_it(tmp_path, monkeypatch):
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "nccl.h").write_text("")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libnccl.so.2").write_text("")
    monkeypatch.setenv("HOROVOD_NCCL_HOME", str(tmp_path))
    assert sp._nccl_home() == {"home": str(tmp_path), "library": str(tmp_path / "lib" / "libnccl.so.2")}


def make_venv(path):
    subprocess.check_call(["python3", "-m", "venv", str(path)])
    return path / "bin" / "python"


def environment_of(venv, **extra):
    """The variables of a shell in which `venv` is the active environment (and the suite's own is not on PATH)."""
    environment = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH")}
    own = os.path.dirname(sys.executable)
    path = [p for p in environment["PATH"].split(os.pathsep) if os.path.abspath(p) != own]
    environment.update(VIRTUAL_ENV=str(venv), PATH=os.pathsep.join([f"{venv}/bin", *path]), **extra)
    return environment


def run_setup(venv, repo=ROOT, timeout=120, **extra):
    environment = environment_of(venv, **extra)
    return subprocess.run(["bash", os.path.join(repo, "scripts", "setup.sh")], env=environment, capture_output=True,
                          text=True, timeout=timeout, cwd=repo)


def test_dotvenv_is_made_from_the_interpreter_a_virtual_environment_on_path_was_made_from(tmp_path):
    """python3 on PATH may be a virtual environment's that is not active (its bin on PATH, VIRTUAL_ENV unset): .venv
    is then made from the interpreter that environment was made from, whose frameworks --system-site-packages sees,
    and not judged by the environment's own packages."""
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    python = make_venv(tmp_path / "other")
    script = os.path.join(ROOT, "scripts", "setup_plan.py")
    said = subprocess.check_output([str(python), script, "base-python"], text=True).strip()
    assert os.path.realpath(said) == base, (said, base)
    said = subprocess.check_output([base, script, "base-python"], text=True).strip()
    assert os.path.realpath(said) == base, (said, base)


def test_setup_refuses_an_unsupported_torch_and_changes_nothing(tmp_path):
    """An active environment whose torch is 2.0.1: set-up stops with the version and the range, installs nothing."""
    python = make_venv(tmp_path / "env")
    site = subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   text=True).strip()
    os.makedirs(os.path.join(site, "torch"))
    with open(os.path.join(site, "torch", "__init__.py"), "w") as f:
        f.write("__version__ = '2.0.1'\nclass version:\n    cuda = None\n")
    os.makedirs(os.path.join(site, "torch-2.0.1.dist-info"))
    with open(os.path.join(site, "torch-2.0.1.dist-info", "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: torch\nVersion: 2.0.1\n")
    before = sorted(os.listdir(site))
    proc = run_setup(tmp_path / "env")
    assert proc.returncode == 2, proc.stderr
    assert "torch 2.0.1 in" in proc.stderr and ">= 2.1 and < 2.15" in proc.stderr
    assert sorted(os.listdir(site)) == before  # nothing installed, not even pip's upgrade


def copy_of_the_repo(dest):
    """The working tree's files (tracked and untracked, not ignored: no .venv, no build outputs), as a clone has."""
    files = subprocess.check_output(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, text=True).split()
    for name in files:
        if os.path.isfile(os.path.join(ROOT, name)):
            os.makedirs(os.path.dirname(os.path.join(dest, name)), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, name), os.path.join(dest, name))
    return dest


def test_real_setup_of_a_torch_only_environment(tmp_path):
    """A user's environment with torch 2.13.0 and nothing else: set-up keeps it, installs no TensorFlow, builds
    Horovod for PyTorch alone (MPI off here: the MPI build is tested by the suite's own set-up) and horovod_ext's
    PyTorch ops, and an unmodified Horovod script then runs compressed under horovodrun."""
    repo = copy_of_the_repo(tmp_path / "repo")
    python = make_venv(tmp_path / "env")
    subprocess.check_call([str(python), "-m", "pip", "install", "-q", "torch==2.13.0"], timeout=900)
    proc = run_setup(tmp_path / "env", repo=str(repo), timeout=1800, HVDEXT_HOROVOD_MPI="0")
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "torch 2.13.0+cpu: the environment's own, kept" in proc.stderr
    assert "tensorflow: not installed, not built for" in proc.stderr
    env_vars = environment_of(tmp_path / "env")
    installed = subprocess.check_output([str(python), "-m", "pip", "list", "--format=freeze"], text=True, env=env_vars)
    assert "torch==2.13.0" in installed and "tensorflow" not in installed
    report = subprocess.check_output(["horovodrun", "--check-build"], text=True, env=env_vars)
    assert "[X] PyTorch" in report and "[ ] TensorFlow" in report and "[X] Gloo" in report, report
    job = subprocess.run(["timeout", "300", "horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", str(python),
                          "-m", "horovod_ext.run", "--compression", "ternary", "tests/scripts/plain_torch.py"],
                         cwd=repo, env=dict(env_vars, OMP_NUM_THREADS="1"), capture_output=True, text=True)
    assert job.returncode == 0, job.stdout[-4000:] + job.stderr[-4000:]
    assert "horovod_ext.run: compression=ternary sent" in job.stdout + job.stderr


def test_the_installed_build_is_read_as_check_build_reports_it():
    """set-up's quick reading of the installed Horovod (one process) says what horovodrun --check-build says."""
    import horovod.torch as hvd_torch

    report = sp.installed_build_report()
    assert report.startswith("Horovod v0.28.1:") and "[X] PyTorch" in report and "[X] Gloo" in report
    assert ("[X] MPI" in report) == bool(hvd_torch.mpi_built())
    assert ("[X] NCCL" in report) == bool(hvd_torch.nccl_built())
    checked = subprocess.run(["horovodrun", "--check-build"], capture_output=True, text=True, timeout=300).stdout
    for line in report.splitlines()[1:]:
        if line.strip().startswith("built by horovod-ext:"):  # our marker (build_horovod.sh), not Horovod's
            continue
        assert line.strip() in checked, (line, checked)


def test_a_horovod_we_built_with_earlier_source_edits_is_built_again():
    wants = {"pytorch": True, "tensorflow": True, "gloo": True, "mpi": True, "nccl": False}
    ours = REPORT.replace("Available Frameworks:", "    built by horovod-ext: horovod-0.28.1-x-gloo-mpi-{}\n"
                                                   "Available Frameworks:")
    assert "built by horovod-ext" in ours
    assert sp.check_build_lacks(wants, ours.format(sp.SOURCE_EDITS)) == []
    assert sp.check_build_lacks(wants, ours.format("edits1")) == [f"horovod-ext's source edits {sp.SOURCE_EDITS}"]
    assert sp.check_build_lacks(wants, REPORT) == []  # no marker: the user's own Horovod, kept


def test_the_launchers_build_check_asks_pytorch_before_tensorflow():
    """horovodrun's build checks (gloo_built, mpi_built, ...) ask PyTorch's extension first (build_horovod.sh's
    util.py edit): its first verbose line names torch, and it answers as torch's own extension does."""
    import horovod.torch as hvd_torch

    probe = ("from horovod.common.util import gloo_built, mpi_built\n"
             "print('answers', gloo_built(verbose=True), bool(mpi_built(verbose=True)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")).stdout
    checks = [line for line in out.splitlines() if line.startswith("Checking whether extension")]
    assert checks and checks[0] == "Checking whether extension torch was built with Gloo.", out
    assert not any("tensorflow" in line for line in checks), out
    assert f"answers {hvd_torch.gloo_built()} {bool(hvd_torch.mpi_built())}" in out, out
