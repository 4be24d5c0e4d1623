"""The representative multi-process checks under MPI (tests/test_mpi.py launches this with horovodrun --mpi and with
plain mpirun, 4 ranks): the same workers' checks that run under Gloo, so that each result is asserted as there.

- ternary two-phase against allgather, bit for bit (two_phase_worker.grads_after);
- top-k and GraVAC over sparse_reduce, with each rank's checkpoint resumed into a new optimizer (sparse_reduce_worker
  "exact": the test compares with the NumPy reference);
- multi-leader LSGD with two groups of two (Horovod process sets made by the optimizer) and single-leader LSGD
  (leader_worker.check_pulls: one round against the reference).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

import horovod_ext.torch as hvd  # noqa: E402
from hvdrun import write_result  # noqa: E402

hvd.init()
import leader_worker  # noqa: E402
import sparse_reduce_worker  # noqa: E402
import two_phase_worker  # noqa: E402

RANK, SIZE = hvd.rank(), hvd.size()

if __name__ == "__main__":
    a, _, _ = two_phase_worker.grads_after("allgather", 3, "base3")
    b, stats, _ = two_phase_worker.grads_after("two_phase", 3, "base3")
    result = {
        "rank": RANK, "size": SIZE,
        "mpi_built": hvd.mpi_built(), "mpi_enabled": hvd.mpi_enabled(), "gloo_enabled": hvd.gloo_enabled(),
        "two_phase": {"equal": all(torch.equal(x, y) for ga, gb in zip(a, b) for x, y in zip(ga, gb)),
                      "transport": stats["transport"]},
        "sparse_reduce": sparse_reduce_worker.exact(),
        "pulls_groups": leader_worker.check_pulls([[0, 1], [2, 3]]),
        "pulls_single": leader_worker.check_pulls(None),
    }
    hvd.allreduce(torch.tensor([0.0]), name="end")
    write_result(RANK, result)
