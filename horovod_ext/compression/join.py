"""hvd.join() with payload compressors (framework-free: what both adapters do, and why).

Measured with Horovod 0.28.1 (plain Horovod scripts, 2 ranks, Gloo): while a rank is joined, Horovod runs only
allreduce, the joined ranks contributing zeros and ``Average`` still dividing by the process set's full size (one of 2
joined: the average of 3 is 1.5). Its allgather and alltoall then fail ("not supported with Join"), and one whose name
is in Horovod's response cache crashes the joined rank's background loop ("unordered_map::at"). Payload compressors
travel by allgather/alltoall, so the ranks must know before a step's first payload collective whether some rank has
joined:

- one allreduce of JOIN_CHECK_BYTES per step (Sum of 1 per rank still training), started at the step's first
  launch; it is waited for there, or, for a method whose launch() starts nothing but allreduces
  (Method.join_decided_at_finish: PowerSGD), at finish(), so that it overlaps backward;
- a step in which fewer ranks train than the process set holds sends every gradient by allreduce (with error
  feedback g + r, after which r = 0), so the ranks still training apply exactly Horovod's own allreduce.

Horovod's linear compressors (none, fp16) travel by allreduce and need no check. In TensorFlow the check runs eagerly
only: inside tf.function Horovod 0.28.1's TensorFlow join fails by itself once any allgather has run in the process
(with and without its response cache), so there no check is paid for.
"""
from .wire import allreduce_wire_bytes

JOIN_CHECK_BYTES = 4


def join_check_wire_bytes(nranks):
    return allreduce_wire_bytes(JOIN_CHECK_BYTES, nranks)


def a_rank_joined(ranks_training, size):
    return ranks_training < size
