"""The transports of the payload compressors: aggregation schemes that a method picks per step (``transport=``), not
methods of their own, framework-free (their plans, byte counts and choice; the kernels are in cpp/).

- two_phase.py: ternary's two-phase transport (one alltoall of packed code chunks, one allgather of each rank's
  chunk sums re-encoded), used by ternary.py;
- sparse_reduce.py: Ok-Topk's sparse allreduce, shared by top-k's two methods (topk.py and gravac.py).
"""
