"""Cross-rank settings check: every rank must run the same compressor with the same arguments, on the same
tensors, or the collectives of a step would not match (one rank allgathers what another allreduces, or decodes
payloads of another packing). Adapters allgather each rank's settings string once, before the first collective
of the first step, and raise this module's error on every rank if they differ."""
import itertools
import json
import random
import zlib

import numpy as np


class SettingsMismatchError(ValueError):
    """Raised on every rank when ranks were configured differently."""


def encode_settings(settings, proposal):
    """The bytes a rank sends: its settings (compared) and a proposal (e.g. a random seed; rank 0's is used)."""
    return json.dumps({"settings": settings, "proposal": proposal}, sort_keys=True).encode("utf-8")


def decode_all(blobs):
    return [json.loads(b.decode("utf-8")) for b in blobs]


def settings_mismatch_message(per_rank_settings, what="horovod_ext DistributedOptimizer"):
    """None when all ranks agree; else a message naming every setting that differs and each rank's value."""
    first = per_rank_settings[0]
    if all(s == first for s in per_rank_settings[1:]):
        return None
    keys = sorted(set().union(*[set(s) for s in per_rank_settings]))
    lines = []
    for key in keys:
        values = [s.get(key) for s in per_rank_settings]
        if any(v != values[0] for v in values):
            lines.append(f"  {key}: " + "; ".join(f"rank {r}: {v}" for r, v in enumerate(values)))
    return (f"{what}: settings differ across ranks; every rank must pass the same compression and arguments.\n"
            + "\n".join(lines))


def layout_digest(tensors):
    """A short summary of (name, shape, dtype name) triples that differs when any of them differs."""
    layout = ";".join(f"{name}:{tuple(shape)}:{dtype}" for name, shape, dtype in tensors)
    return f"{len(tensors)} tensors, crc32 {zlib.crc32(layout.encode()):08x}"


def optimizer_settings(compression_description, op_name, tensors, process_set_size, version, **extra):
    """The settings ranks must share: tensors is a list of (name, shape, dtype name), summarized by a crc32."""
    return {"compression": compression_description, "op": op_name, "parameters": layout_digest(tensors),
            "process_set_size": process_set_size, "horovod_ext": version, **extra}


def exchange(settings, local, allgather_blobs, what="horovod_ext DistributedOptimizer"):
    """Exchange settings (compared) and a per-rank `local` dict (not compared: a seed proposal, a host name, an
    argument error); raise SettingsMismatchError on every rank if the settings differ, else return every rank's
    `local`, in rank order. allgather_blobs(bytes) -> list of every rank's bytes, in rank order."""
    per_rank = decode_all(allgather_blobs(encode_settings(settings, local)))
    message = settings_mismatch_message([r["settings"] for r in per_rank], what)
    if message:
        raise SettingsMismatchError(message)
    return [r["proposal"] for r in per_rank]


def seed_proposal(script_seed):
    """A rank's proposal for the draws' key (ternary's stochastic rounding, PowerSGD's initial Q) when the compressor
    has no ``seed=``; rank 0's is used. ``script_seed`` is the seed the training script gave its framework
    (``torch.initial_seed()``, TensorFlow's global seed) or None: a seeded script gets the same key, hence the same
    draws and the same model, on every run; an unseeded one gets 63 bits from the operating system and varies, as
    the script's own draws do. The key is the script's seed reduced to 63 bits (the int64 that TensorFlow's seed
    variable holds)."""
    if script_seed is None:
        return random.SystemRandom().getrandbits(63)
    return int(script_seed) % 2 ** 63


def split_blobs(gathered, sizes):
    """Cut an allgather's concatenated bytes back into each rank's blob."""
    offsets = [0] + list(itertools.accumulate(sizes))
    return [gathered[a:b] for a, b in zip(offsets, offsets[1:])]


def allgather_blobs(blob, allgather, tag):
    """Every rank's bytes, in rank order: two allgathers, the sizes (int64) then the bytes (uint8).
    allgather(array, name) -> the ranks' arrays concatenated, the framework's (torch/backend.py, tensorflow/backend.py
    numpy_allgather)."""
    sizes = allgather(np.array([len(blob)], dtype=np.int64), tag + ".sizes").tolist()
    data = allgather(np.frombuffer(bytearray(blob), dtype=np.uint8), tag)
    return split_blobs(data.tobytes(), sizes)
