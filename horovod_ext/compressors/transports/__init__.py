"""The transports of the payload compressors: aggregation schemes that a method picks per step (``transport=``), not
methods of their own, framework-free (their plans, byte counts and choice; the kernels are in cpp/).

- two_phase.py: ternary's two-phase transport (one alltoall of packed code chunks, one allgather of each rank's
  chunk sums re-encoded), used by ternary.py;
- sparse_reduce.py: Ok-Topk's sparse allreduce, shared by top-k's two methods (topk.py and gravac.py).

Both "auto" transports follow one rule (``clearly_fewer``), which perfmodel's plans use too (perfmodel/plans.py):
the transport whose bytes per rank do not grow with N (two_phase: about log2(2N+1) bits an element; sparse_reduce:
about 4K words) is taken where it plans under AUTO_SAVING of allgather's bytes per rank per step and at least
AUTO_MIN_SAVED_BYTES fewer: each adds collective rounds after backward (allgather's payloads leave during backward),
and below that saving the step is latency-bound and the rounds cost more than the bytes they save
(benchmarks/RESULTS.md, section "sparse_reduce").
"""

AUTO_SAVING = 0.9  # "auto" takes the scalable transport only under this fraction of allgather's bytes
AUTO_MIN_SAVED_BYTES = 256 * 1024  # ... and saves at least this much per rank per step


def clearly_fewer(planned, allgather):
    """Whether a transport planning `planned` bytes per rank per step is "auto"'s choice over allgather's
    `allgather`: under AUTO_SAVING of them, and at least AUTO_MIN_SAVED_BYTES fewer."""
    return planned < AUTO_SAVING * allgather and allgather - planned >= AUTO_MIN_SAVED_BYTES
