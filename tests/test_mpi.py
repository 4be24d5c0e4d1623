"""Under MPI as well as Gloo: the representative multi-process checks (ternary two-phase, top-k and GraVAC over
sparse_reduce with resume, multi-leader LSGD over its process sets; tests/workers/mpi_worker.py) at 4 ranks, launched
by `horovodrun --mpi` and by OpenMPI's plain `mpirun -np 4`, each launch bounded by a timeout. The test command
(scripts/test.sh) installs OpenMPI where it can; where neither OpenMPI nor an MPI build of Horovod is present these
skip, except in CI (CI=true), where they fail."""
import os
import shutil

import pytest

from hvdrun import horovodrun
from test_sparse_reduce import assert_exact_run


def require_mpi():
    """Skip where MPI cannot run here (fail in CI, which must run these)."""
    missing = mpi_missing()
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the MPI tests: {missing}")
        pytest.skip(missing)


def mpi_missing():
    """Why MPI cannot run here, or None."""
    if shutil.which("mpirun") is None:
        return "no mpirun (OpenMPI) on this machine"
    import horovod.torch

    if not horovod.torch.mpi_built():
        return "Horovod was built without MPI (scripts/setup.sh builds it with MPI where mpicxx is found)"
    return None


@pytest.fixture(scope="module", params=["mpi", "mpirun"], ids=["horovodrun-mpi", "mpirun"])
def results(request):
    require_mpi()
    res, _ = horovodrun(4, "tests/workers/mpi_worker.py", launcher=request.param, timeout=420,
                        hosts="localhost:4")
    return res


def test_the_ranks_ran_over_mpi(results):
    assert [r["rank"] for r in results] == [0, 1, 2, 3] and all(r["size"] == 4 for r in results)
    assert all(r["mpi_built"] and r["mpi_enabled"] and not r["gloo_enabled"] for r in results)


def test_two_phase_equals_allgather(results):
    assert all(r["two_phase"]["equal"] and r["two_phase"]["transport"] == "two_phase" for r in results)


def test_sparse_reduce_matches_reference_and_resumes(results):
    assert_exact_run([r["sparse_reduce"] for r in results], 4)


def test_multi_leader_pulls_over_process_sets(results):
    for r in results:
        for key in ("pulls_groups", "pulls_single"):
            check = r[key]
            assert all(check["close"]) and len(check["close"]) == 4, (r["rank"], key)
            assert check["evaluation_is_best"] and check["restored"], (r["rank"], key)
        assert r["pulls_groups"]["groups"] == [[0, 1], [2, 3]]
        assert r["pulls_single"]["bitwise"]
    assert [r["pulls_groups"]["leaders"]["group"] for r in results] == [1, 1, 3, 3]
    assert all(r["pulls_groups"]["best"] == 3 for r in results)


def test_launcher_runs_an_unmodified_script_under_plain_mpirun():
    """python -m horovod_ext.run needs no horovodrun: under OpenMPI's mpirun an unmodified Horovod script trains
    compressed, and rank 0 prints its summary."""
    require_mpi()
    _, output = horovodrun(2, "-m", "horovod_ext.run", "--compression", "ternary", "tests/scripts/plain_torch.py",
                           collect=False, launcher="mpirun", timeout=300)
    assert "horovod_ext optimizer True" in output
    assert "horovod_ext.run: compression=ternary sent" in output
