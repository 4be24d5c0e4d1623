"""python -m horovod_ext.run: unmodified Horovod scripts (tests/scripts/plain_*.py, which never import horovod_ext)
run under horovodrun -np 2 with each compressor; rank 0's summary line reports the ratio the compressor gives.
Also: bad flags fail on every rank before training, and Horovod's timeline names horovod_ext's collectives."""
import re
import subprocess
import sys

import pytest

from hvdrun import ROOT, horovodrun

LAUNCH = ["-m", "horovod_ext.run"]
# compression -> (extra launcher arguments, the least dense/sent ratio the summary must show)
CASES = {"none": ([], 1.0), "fp16": ([], 2.0), "ternary": ([], 16.0),
         "topk": (["--compression-arg", "ratio=0.01"], 50.0),
         "adaptive_topk": (["--compression-arg", "epsilon=0.3", "--compression-arg", "window=5"], 5.0),
         "powersgd": (["--compression-arg", "rank=2", "--compression-arg", "start_iter=2"], 6.0)}
SUMMARY = re.compile(r"horovod_ext\.run: compression=(\w+) sent ([\d.]+) MB, dense-equivalent ([\d.]+) MB, "
                     r"ratio ([\d.]+)x, communication (?:([\d.]+) s|not timed \(TensorFlow[^)]*\)) "
                     r"\((\d+) steps, rank 0\)")
PER_STEP = re.compile(r"\(\d+ steps, rank 0\); per step ([\d.]+) ms, compute ([\d.]+) ms, compression ([\d.]+) ms, "
                      r"communication ([\d.]+) ms")


def launch(script, compression, extra, steps=20, env=None, extra_args=()):
    _, output = horovodrun(2, "-m", "horovod_ext.run", "--compression", compression, *extra, script,
                           "--steps", steps, *extra_args, collect=False, timeout=300, env=env)
    return output


def summaries(output):
    return [m.groups() for m in SUMMARY.finditer(output)]


@pytest.mark.parametrize("compression", list(CASES))
@pytest.mark.parametrize("script", ["tests/scripts/plain_torch.py", "tests/scripts/plain_tf.py"])
def test_unmodified_script_runs_compressed(script, compression):
    extra, least_ratio = CASES[compression]
    output = launch(script, compression, extra)
    lines = summaries(output)
    assert len(lines) == 1, output[-3000:]  # rank 0 only
    name, sent, dense, ratio, comm, steps = lines[0]
    assert name == compression and int(steps) == 20  # broadcast_optimizer_state takes no step of ours
    assert float(ratio) >= least_ratio, (compression, ratio)
    if compression == "none":
        assert float(ratio) == pytest.approx(1.0)
    assert "final loss" in output
    if "torch" in script:
        assert "horovod_ext optimizer True" in output  # the script's optimizer is horovod_ext's
        assert float(comm) > 0
        (step, compute, kernels, waiting), = (tuple(map(float, m.groups())) for m in PER_STEP.finditer(output))
        assert 0 < compute <= step and waiting > 0 and (kernels == 0) == (compression == "none"), output[-3000:]
    else:
        assert comm is None and not PER_STEP.search(output)  # said to be untimed, not reported as 0


def test_ternary_ratio_matches_the_wire_format():
    """1.6 bits per element plus a 4-byte scale per tensor; biases (< min_size) dense: about 18x on this MLP."""
    output = launch("tests/scripts/plain_torch.py", "ternary", ["--compression-arg", "packing='2bit'"])
    (_, sent, dense, ratio, _, _), = summaries(output)
    assert 12.0 < float(ratio) < 16.0  # 2 bits: at most 16x, less with the dense biases


def run_rank_local(args):
    """The launcher on its own (no horovodrun): argument errors come before anything is imported or trained."""
    return subprocess.run([sys.executable, "-m", "horovod_ext.run", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("args, fragments", [
    (["--compression", "zip", "x.py"], ["invalid choice: 'zip'", "'none', 'fp16', 'ternary', 'topk', 'adaptive_topk'"]),
    (["--compression", "ternary", "--compression-arg", "clip=-1", "tests/scripts/plain_torch.py"], ["clip", "> 0.0"]),
    (["--compression", "ternary", "--compression-arg", "ratio=0.1", "tests/scripts/plain_torch.py"],
     ["'ratio' is not an argument of ternary", "allowed: clip, shared_scale, packing"]),
    (["--compression", "fp16", "--compression-arg", "clip=1", "tests/scripts/plain_torch.py"], ["takes no"]),
    (["--compression", "topk", "--compression-arg", "ratio", "tests/scripts/plain_torch.py"], ["NAME=VALUE"]),
    (["--compression", "none", "missing.py"], ["does not exist"]),
    (["--optimizer", "diloco", "--optimizer-arg", "inner_steps=0", "tests/scripts/plain_torch.py"],
     ["inner_steps must be an integer >= 1, got 0"]),
    (["--optimizer", "diloco", "--optimizer-arg", "outer=leader", "tests/scripts/plain_torch.py"],
     ["outer='leader' elects the worker with the lowest training loss", "allowed here: outer='average'"]),
    (["--optimizer", "diloco", "--optimizer-arg", "warmup=3", "tests/scripts/plain_torch.py"],
     ["'warmup' is not an argument of diloco; allowed: inner_steps, outer_lr, outer_momentum, nesterov"]),
    (["--optimizer-arg", "inner_steps=2", "tests/scripts/plain_torch.py"], ["data_parallel takes no"]),
    (["--optimizer", "lsgd", "tests/scripts/plain_torch.py"], ["invalid choice: 'lsgd'", "'data_parallel', 'diloco'"]),
    (["--bucket-cap-mb", "-1", "tests/scripts/plain_torch.py"],
     ["--bucket-cap-mb: bucket_cap_mb must be a number >= 0", "got -1"]),
    (["--bucket-cap-mb", "big", "tests/scripts/plain_torch.py"], ["bucket_cap_mb must be a number >= 0", "'big'"]),
    (["--optimizer", "diloco", "--bucket-cap-mb", "5", "tests/scripts/plain_torch.py"],
     ["--bucket-cap-mb is an argument of DistributedOptimizer"]),
])
def test_bad_flags_fail_before_the_script(args, fragments):
    proc = run_rank_local(args)
    assert proc.returncode == 2
    for fragment in fragments:
        assert fragment in proc.stderr, (fragment, proc.stderr)


@pytest.mark.parametrize("script", ["tests/scripts/plain_torch.py", "tests/scripts/plain_tf.py"])
def test_bucket_cap_reaches_the_scripts_optimizer_and_keeps_its_bits(script):
    """The launcher's --bucket-cap-mb becomes DistributedOptimizer's (DistributedGradientTape's) bucket_cap_mb: 0
    (a collective per tensor) and the default (one bucket) train the unmodified script to the same loss, to the
    printed digit."""
    losses = [re.findall(r"final loss [-\d.e]+", launch(script, "ternary", extra))
              for extra in (["--bucket-cap-mb", "0"], [])]
    assert losses[0] and losses[0] == losses[1], losses


def test_unmodified_script_joins_with_uneven_data():
    """horovod.torch.join() in an unmodified script is horovod_ext.torch.join under the launcher (it first takes in
    what the optimizers left in flight), and rank 1's two more steps go dense."""
    output = launch("tests/scripts/plain_torch.py", "adaptive_topk", [], extra_args=["--uneven"])
    joined = re.findall(r"rank (\d) joined \(join from ([\w.]+)\), the last to join was rank (\d)", output)
    assert sorted(joined) == [("0", "horovod_ext.torch", "1"), ("1", "horovod_ext.torch", "1")], output[-3000:]
    assert "final loss" in output
    (_, _, _, _, _, steps), = summaries(output)
    assert int(steps) == 20  # rank 0's


def test_bad_flag_fails_on_every_rank_under_horovodrun():
    with pytest.raises(AssertionError) as info:
        horovodrun(2, "-m", "horovod_ext.run", "--compression", "zip", "tests/scripts/plain_torch.py",
                   collect=False, timeout=120)
    text = str(info.value)
    assert text.count("invalid choice: 'zip'") >= 1 and "final loss" not in text


DILOCO_SUMMARY = re.compile(r"compression=ternary \(pseudo-gradients of --optimizer diloco\) sent ([\d.]+) MB, "
                            r"dense-equivalent ([\d.]+) MB, ratio ([\d.]+)x, communication .*?\((\d+) steps")


def check_diloco_summary(output, steps=20, inner_steps=5):
    """Rank 0's summary of a 2-rank ternary DiLoCo run: the dense-equivalent is `steps` allreduces of the model's B
    bytes; what it sent is the start's broadcast of the model (B, rank 0 is its root) and one ternary exchange every
    `inner_steps` steps, each at least 14x fewer bytes than B (under 2.3 bits per element with its headers)."""
    (sent, dense, ratio, counted), = (m.groups() for m in DILOCO_SUMMARY.finditer(output))
    sent, dense, model = float(sent), float(dense), float(dense) / steps
    assert int(counted) == steps, output[-3000:]
    assert sent >= model - 0.001, (sent, model)  # the start's broadcast is counted
    assert 0 < (sent - model) * 14 <= (steps // inner_steps) * model, (sent, model)
    assert abs(float(ratio) - dense / sent) <= 0.05 + 0.01 * dense / sent, (ratio, dense, sent)


def test_unmodified_script_runs_as_diloco():
    """--optimizer diloco: the script's DistributedOptimizer becomes a DiLoCoOptimizer around its SGD, with
    ternary pseudo-gradients every 5 steps (check_diloco_summary)."""
    output = launch("tests/scripts/plain_torch.py", "ternary",
                    ["--compression-arg", "error_feedback=True", "--optimizer", "diloco",
                     "--optimizer-arg", "inner_steps=5"])
    check_diloco_summary(output)
    assert "horovod_ext optimizer True" in output and "final loss" in output


def test_unmodified_script_runs_as_streaming_diloco_with_workers_of_a_hosts_ranks():
    """--optimizer-arg groups=node at 4 ranks as two "nodes": the launcher turns Horovod's dynamic process sets on
    for the script's own hvd.init(), each host's two ranks are one worker, and its leader alone sends; streaming:
    the model's three layers in 3 fragments, one every 2 steps, applied a step after its exchange starts. Every
    collective is in rank 0's count, the in-group ones included, so it sends more than the dense allreduce would."""
    _, output = horovodrun(4, "-m", "horovod_ext.run", "--compression", "ternary", "--compression-arg",
                           "error_feedback=True", "--optimizer", "diloco", "--optimizer-arg", "inner_steps=6",
                           "--optimizer-arg", "fragments=3", "--optimizer-arg", "overlap=1",
                           "--optimizer-arg", "groups=node", "tests/scripts/plain_torch.py", "--steps", 20,
                           collect=False, timeout=300, hosts="localhost:2,127.0.0.1:2")
    (sent, dense, ratio, steps), = (m.groups() for m in DILOCO_SUMMARY.finditer(output))
    sent, dense, model = float(sent), float(dense), float(dense) / 20
    assert int(steps) == 20, output[-3000:]
    # rank 0, a leader, sends: every step's gradients within its worker (B each), the start's broadcast (B), its
    # broadcast of each exchange's fragment to its worker (10 exchanges started: layers 0,1,2,0,1,2,0,1,2,0 of
    # plain_torch.py's 133,120 + 525,312 + 10,280 bytes) and the ternary exchanges themselves (14x fewer at least)
    share = (4 * 133_120 + 3 * 525_312 + 3 * 10_280) / 1e6
    assert 0 < sent - (21 * model + share) <= share / 14 + 0.002, (sent, model, share)
    assert "horovod_ext optimizer True" in output and "final loss" in output


def test_unmodified_keras_script_runs_as_diloco():
    """A plain Keras script's DistributedOptimizer becomes Keras's DiLoCoOptimizer around its SGD (model.fit),
    ternary pseudo-gradients every 5 steps."""
    output = launch("tests/scripts/plain_keras.py", "ternary",
                    ["--compression-arg", "error_feedback=True", "--optimizer", "diloco",
                     "--optimizer-arg", "inner_steps=5"])
    check_diloco_summary(output)
    assert "plain_keras: final loss" in output


def test_diloco_refuses_a_tensorflow_tape_script_on_every_rank():
    with pytest.raises(AssertionError) as info:
        launch("tests/scripts/plain_tf.py", "none", ["--optimizer", "diloco"], steps=2)
    text = str(info.value)
    assert "has no optimizer to wrap" in text and "final loss" not in text


def test_timeline_shows_horovod_ext_collectives_by_bucket_and_by_tensor_name(tmp_path):
    """Horovod's timeline names a bucket's collectives after the bucket (one allgather of the payloads, one allreduce
    of the small tensors), and with --bucket-cap-mb 0 each tensor's after its parameter."""
    timeline = tmp_path / "timeline.json"
    launch("tests/scripts/plain_torch.py", "ternary", [], steps=3, env={"HOROVOD_TIMELINE": str(timeline)})
    text = timeline.read_text()
    assert "ternary.allgather.bucket0" in text and "hvdext.grad.bucket0" in text, text[:2000]
    assert "ternary.0.weight" not in text
    launch("tests/scripts/plain_torch.py", "ternary", ["--bucket-cap-mb", "0"], steps=3,
           env={"HOROVOD_TIMELINE": str(timeline)})
    text = timeline.read_text()
    assert "ternary.0.weight" in text and "ternary.2.weight" in text  # the compressed tensors, by parameter name
    assert "ALLGATHER" in text.upper()
    assert "0.bias" in text  # the small tensors, dense, by allreduce


def test_unmodified_keras_fit_script_runs_compressed():
    """Horovod's Keras DistributedOptimizer (Keras 2 API) resolves to horovod_ext's for Keras 3 model.fit."""
    output = launch("tests/scripts/plain_keras.py", "ternary", [])
    (name, _, _, ratio, comm, steps), = summaries(output)
    assert name == "ternary" and int(steps) == 20 and float(ratio) >= 16.0 and comm is None
    assert "plain_keras: final loss" in output
