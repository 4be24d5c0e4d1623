"""Launch a script under horovodrun for real, bounded by a timeout, and collect each rank's JSON result."""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOSTS = {2: "localhost:2", 4: "localhost:2,127.0.0.1:2"}  # 4 ranks as two "nodes" of 2


LAUNCHERS = ("gloo", "mpi", "mpirun")


def launch_command(launcher, np_, hosts):
    """The command before `python script args`: horovodrun with Gloo (`--gloo`) or MPI (`--mpi`), or OpenMPI's own
    mpirun without horovodrun (every rank on this host, oversubscribed: 4 ranks on 2 cores; not bound to a core)."""
    if launcher == "mpirun":
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        return ["mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", "none", *root]
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")
    return ["horovodrun", "-np", str(np_), "-H", hosts or HOSTS[np_], f"--{launcher}"]


def horovodrun(np_, script, *args, timeout=240, hosts=None, env=None, collect=True, launcher="gloo"):
    """Run `horovodrun -np N --gloo python script args` (or another launcher, launch_command), results in a temp dir
    passed as HVDEXT_TEST_OUT.

    Returns (list of per-rank result dicts, combined output); collect=False for scripts that write no results. A hang
    becomes a failure after `timeout` seconds: the whole process group (horovodrun and every rank) is killed.
    """
    out_dir = tempfile.mkdtemp(prefix="hvdext-test-")
    cmd = [*launch_command(launcher, np_, hosts), sys.executable, script, *map(str, args)]
    output = run_bounded(cmd, cmd[0], out_dir, timeout, env)
    results = []
    for rank in range(np_ if collect else 0):
        path = os.path.join(out_dir, f"rank{rank}.json")
        assert os.path.exists(path), f"rank {rank} wrote no result:\n{failure_report(output)}"
        with open(path) as f:
            results.append(json.load(f))
    return results, output


def torchrun(np_, script, *args, timeout=240, env=None, collect=True, launcher_args=()):
    """Run `torchrun --standalone --nproc_per_node N [launcher_args] script args` (torch.distributed's launcher: no
    Horovod), results as horovodrun's (each rank's write_result; collect=False for scripts that write none),
    bounded by `timeout` as horovodrun's."""
    out_dir = tempfile.mkdtemp(prefix="hvdext-test-")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(np_),
           "--tee", "3", *launcher_args, script, *map(str, args)]
    output = run_bounded(cmd, "torchrun", out_dir, timeout, env)
    results = []
    for rank in range(np_ if collect else 0):
        path = os.path.join(out_dir, f"rank{rank}.json")
        assert os.path.exists(path), f"rank {rank} wrote no result:\n{failure_report(output)}"
        with open(path) as f:
            results.append(json.load(f))
    return results, output


def run_bounded(cmd, label, out_dir, timeout, env=None):
    """Run cmd (a launcher) from the repository root with results in out_dir (HVDEXT_TEST_OUT); return its
    combined output. A hang becomes a failure after `timeout` seconds: the whole process group (the launcher and
    every rank) is killed."""
    run_env = dict(os.environ, HVDEXT_TEST_OUT=out_dir, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1",
                   OMP_NUM_THREADS="1", **(env or {}))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=run_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise AssertionError(f"{label} timed out after {timeout}s (a rank hung):\n{failure_report(output)}")
    if proc.returncode != 0:
        raise AssertionError(f"{label} exited {proc.returncode}:\n{failure_report(output)}")
    return output


RANK_LINE = re.compile(r"^\[(?:1,)?(\d+)\]<std(?:out|err)>:")  # horovodrun's "[r]<stderr>:", mpirun's "[1,r]<stderr>:"
ERROR_LINE = re.compile(r"Traceback \(most recent call last\)|Error|terminate called|Aborted|Segmentation fault|"
                        r"core dumped|Fatal Python error")


def first_errors(output, lines=40):
    """{rank: the first `lines` lines of that rank's output from its first error line on} (a traceback, an
    exception, an abort), for ranks whose lines carry the launcher's rank prefix; the launcher's own lines are
    under None."""
    by_rank = {}
    for line in output.splitlines():
        match = RANK_LINE.match(line)
        by_rank.setdefault(int(match.group(1)) if match else None, []).append(line)
    errors = {}
    for rank, rank_lines in by_rank.items():
        start = next((i for i, line in enumerate(rank_lines) if ERROR_LINE.search(line)), None)
        if start is not None:
            errors[rank] = rank_lines[start:start + lines]
    return errors


def failure_report(output, tail=6000):
    """What a failed launch shows: every rank's first error (which the tail of a long output can lose: the first
    rank to fail is often not the last to print), then the last `tail` characters."""
    parts = [f"--- first error of {'the launcher' if rank is None else f'rank {rank}'} ---\n" + "\n".join(lines)
             for rank, lines in sorted(first_errors(output).items(), key=lambda kv: -1 if kv[0] is None else kv[0])]
    return "\n".join(parts + [f"--- the last {tail} characters ---", output[-tail:]])


def write_hosts(lines):
    """Called by an elastic worker: the hosts horovodrun_elastic's discovery script prints from now on."""
    path = os.path.join(os.environ["HVDEXT_TEST_OUT"], "hosts")
    with open(path + ".tmp", "w") as f:
        f.write("".join(f"{line}\n" for line in lines))
    os.replace(path + ".tmp", path)


def marker(what, step):
    """A file an elastic worker leaves once it did `what` (killed, added) at `step`, so that it is done once."""
    return os.path.join(os.environ["HVDEXT_TEST_OUT"], f"{what}.{step}")


def write_result(rank, result):
    """Called by a worker: store this rank's result for the launching test."""
    with open(os.path.join(os.environ["HVDEXT_TEST_OUT"], f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def expect_error(case, fn):
    """Called by a worker: run fn and record the error it raises, {case, type, message} (type None when it raised
    nothing). Tests check that every rank raised the same, and that no rank hung."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - recorded for the test to check
        return {"case": case, "type": type(exc).__name__, "message": str(exc)[:3000]}
    return {"case": case, "type": None, "message": ""}


def assert_error_cases(record, expected):
    """A worker's record of bad-input cases ([{case, type, message}]) holds exactly the expected cases, each with the
    expected exception type and message fragments: expected = {case: (type name, [fragments])}."""
    cases = {c["case"]: c for c in record["cases"]}
    assert set(cases) == set(expected)
    for case, (etype, fragments) in expected.items():
        assert cases[case]["type"] == etype, (record.get("rank"), case, cases[case])
        for fragment in fragments:
            assert fragment in cases[case]["message"], (record.get("rank"), case, fragment, cases[case]["message"])


def horovodrun_elastic(script, *args, np_=2, min_np=1, max_np=3, hosts=("localhost:1", "127.0.0.1:1"), timeout=240,
                       env=None):
    """Run `horovodrun --gloo -np np_ --min-np --max-np --host-discovery-script` on this machine, the discovery
    script printing `$HVDEXT_TEST_OUT/hosts` (written here from `hosts`, rewritten by the workers to remove or add
    a host). Each host name is one "node" of one slot: Horovod blacklists the host of a failed worker, so a second
    name keeps the survivor's host usable; a blacklisted host is usable again after 1-2 s of cooldown. The workers
    find a third name for this machine (third_host()) in HVDEXT_THIRD_HOST. Returns
    (the result of every rank that wrote one, by final rank; combined output); a hang fails after `timeout`."""
    out_dir = tempfile.mkdtemp(prefix="hvdext-elastic-")
    with open(os.path.join(out_dir, "hosts"), "w") as f:
        f.write("".join(f"{h}\n" for h in hosts))
    discover = os.path.join(out_dir, "discover.sh")
    with open(discover, "w") as f:
        f.write(f"#!/bin/sh\ncat {os.path.join(out_dir, 'hosts')}\n")
    os.chmod(discover, 0o755)
    cmd = ["horovodrun", "--gloo", "-np", str(np_), "--min-np", str(min_np), "--max-np", str(max_np),
           "--host-discovery-script", discover, "--network-interface", "lo", "--blacklist-cooldown-range", "1", "2",
           sys.executable, script, *map(str, args)]
    output = run_bounded(cmd, "horovodrun (elastic)", out_dir, timeout,
                         dict(env or {}, HVDEXT_THIRD_HOST=third_host() or ""))
    results = []
    for name in sorted(os.listdir(out_dir)):
        if name.startswith("rank") and name.endswith(".json"):
            with open(os.path.join(out_dir, name)) as f:
                results.append(json.load(f))
    return sorted(results, key=lambda r: r["rank"]), output



def third_host():
    """A third name for this machine that horovodrun treats as local (it resolves to one of its addresses): the
    host name, else an interface address other than loopback; None if there is none."""
    import socket
    from horovod.runner.util.network import get_local_host_addresses, resolve_host_address
    local = get_local_host_addresses()
    for name in [socket.gethostname()] + sorted(a for a in local if not a.startswith("127.")):
        if name not in ("localhost", "127.0.0.1") and resolve_host_address(name) in local:
            return name
    return None
