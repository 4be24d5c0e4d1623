"""A rank killed with SIGKILL mid-step ends the whole job with an error, for every compressor and both leader
optimizers, never a hang (each launch bounded by a timeout well under the test's): the killed rank dies by SIGKILL
and records nothing, the other rank's training ends at the killed rank's step (or the next) with Horovod's
HorovodInternalError saying Horovod has been shut down. So does a rank that leaves early once the ranks wait for
each other at exit (process sets in use)."""
import json
import os
import signal
import subprocess
import sys
import tempfile

import pytest

from hvdrun import ROOT, failure_report, horovodrun

WORKER = "tests/workers/fault_worker.py"
KILLED_AT = 3  # the step after whose backward the last rank kills itself (fault_worker.py)


@pytest.mark.parametrize("method", ["none", "fp16", "ternary", "topk", "adaptive_topk", "lsgd", "easgd"])
def test_killed_rank_ends_the_job_with_an_error(method):
    """Rank 1 exits by SIGKILL (status 137) and writes no outcome; rank 0 records HorovodInternalError ("Horovod
    has been shut down") raised at step 3, where rank 1's gradients stop coming, or at step 4 where its step-3
    collectives had completed before it died."""
    out = tempfile.mkdtemp(prefix="hvdext-fault-")
    env = dict(os.environ, HVDEXT_TEST_OUT=out, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3")
    cmd = ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, WORKER, method]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{method}: the job hung after a rank was killed:\n{failure_report(output, 3000)}")
    report = failure_report(output, 3000)
    assert proc.returncode != 0, report
    assert "Process 1 exit with status code 137." in output, report  # 128 + SIGKILL
    assert sorted(os.listdir(out)) == ["rank0.json"], (os.listdir(out), report)
    with open(os.path.join(out, "rank0.json")) as f:
        survivor = json.load(f)
    assert survivor["error"] == "HorovodInternalError", (survivor, report)
    assert "Horovod has been shut down" in survivor["message"], survivor
    assert survivor["step"] in (KILLED_AT, KILLED_AT + 1), survivor


@pytest.mark.parametrize("mode, wait", [("returns", 3), ("raises", 1000)])
def test_a_rank_that_leaves_early_ends_the_job_with_an_error(mode, wait):
    """With process sets in use every rank waits for the others at exit (horovod_ext/in_flight.py). A rank that
    ends the script while rank 0 still trains ("returns": uneven data without hvd.join()) waits out its bound and
    warns, then its shutdown fails rank 0's allreduce, as in plain Horovod; a rank that raises ("raises") does not
    wait at all: its bound of 1000 s would outlast the launch's timeout."""
    with pytest.raises(AssertionError) as info:
        horovodrun(2, "tests/workers/leave_together_worker.py", mode, wait, collect=False, timeout=120)
    text = str(info.value)
    assert "timed out" not in text and "rank 0 HorovodInternalError" in text and "shut down" in text, text
    assert ("not every rank reached the end of the script within 3 s" in text) == (mode == "returns"), text
    if mode == "raises":
        assert "the last rank fails" in text
