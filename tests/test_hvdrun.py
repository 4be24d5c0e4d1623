"""The launch helper's failure report (tests/hvdrun.py): every rank's first error survives a long output."""
from hvdrun import failure_report, first_errors


def test_every_ranks_first_error_and_the_tail_are_reported():
    output = "\n".join(["[1]<stderr>:Traceback (most recent call last):", "[1]<stderr>:ValueError: first on rank 1",
                        "[0]<stdout>:step 1"] + [f"[0]<stdout>:noise {i}" for i in range(2000)]
                       + ["[1,0]<stderr>:terminate called after throwing an instance of 'std::system_error'",
                          "RuntimeError: Horovod detected that one or more processes exited"])
    errors = first_errors(output)
    assert errors[1][:2] == ["[1]<stderr>:Traceback (most recent call last):",
                             "[1]<stderr>:ValueError: first on rank 1"]
    assert errors[0][0].endswith("terminate called after throwing an instance of 'std::system_error'")
    assert errors[None] == ["RuntimeError: Horovod detected that one or more processes exited"]
    report = failure_report(output, tail=200)
    assert "first on rank 1" in report and "noise 1999" in report and "noise 10\n" not in report
    assert report.index("first error of the launcher") < report.index("first error of rank 0") < report.index(
        "first error of rank 1")
    assert failure_report("all quiet", tail=5).endswith("quiet")
