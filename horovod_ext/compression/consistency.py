"""Cross-rank settings check: every rank must run the same compressor with the same arguments, on the same
tensors, or the collectives of a step would not match (one rank allgathers what another allreduces, or decodes
payloads of another packing). Adapters allgather each rank's settings string once, before the first collective
of the first step, and raise this module's error on every rank if they differ."""
import json


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
