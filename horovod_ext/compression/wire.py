"""Bytes on the wire, counted per rank as Horovod's ring collectives move them, and tensor keys.

For N ranks and a tensor of b bytes per rank:
    ring allreduce:  2 (N-1)/N * b   (reduce-scatter then allgather of the sum)
    ring allgather:  (N-1) * b       (every rank forwards every other rank's payload once)
    alltoall:        (N-1)/N * b     (the part of b that leaves the rank)
    broadcast:       (N-1)/N * b     (N-1 copies of the root's b cross the wire, averaged over the N ranks)
A payload compressor by allgather therefore saves less as N grows; dense_wire_bytes is what Horovod's dense
allreduce of the same gradients would have sent.
"""
import zlib


def allreduce_wire_bytes(nbytes, nranks):
    return 2.0 * (nranks - 1) / nranks * nbytes if nranks > 1 else 0.0


def allgather_wire_bytes(nbytes, nranks):
    return float((nranks - 1) * nbytes)


def alltoall_wire_bytes(nbytes, nranks):
    return (nranks - 1) / nranks * nbytes if nranks > 1 else 0.0


def broadcast_wire_bytes(nbytes, nranks):
    return (nranks - 1) / nranks * nbytes if nranks > 1 else 0.0


def tensor_key(name):
    """The 32-bit tensor id in the random key: crc32 of the tensor's name, the same in every framework."""
    return zlib.crc32(name.encode("utf-8")) & 0xFFFFFFFF

