"""Building a parameter-space optimizer on every rank at once (framework-free).

Construction is collective: every rank builds the optimizer, the ranks exchange their arguments, parameter layout,
host and any argument error in one allgather, and then every rank raises the same error, or none. A rank whose
arguments are invalid therefore never leaves the others waiting in a collective. Groups become Horovod process
sets, created on every rank in the same order.
"""
from horovod_ext import __version__
from horovod_ext.in_flight import leave_together
from horovod_ext.compression import generation
from horovod_ext.compression.consistency import exchange, layout_digest
from .groups import node_key

DYNAMIC_HELP = ("leader groups are Horovod process sets created after init: initialize with "
                "horovod_ext.torch.init() / horovod_ext.tensorflow.init() (they enable Horovod's dynamic process "
                "sets), or set HOROVOD_DYNAMIC_PROCESS_SETS=1 before hvd.init()")


def build_on_every_rank(make_sync, arguments, tensors, allgather_blobs, rank, size, what):
    """make_sync() -> a LeaderSync/ElasticSync (may raise ValueError). Returns it, configured with every rank's
    host and holding the agreed reset generation of its collectives' names (``sync.generation``,
    compression/generation.py); raises SettingsMismatchError or the first rank's ValueError on every rank."""
    try:
        sync, error = make_sync(), None
    except ValueError as exc:
        sync, error = None, str(exc)
    settings = {"optimizer": what, **{k: repr(v) for k, v in arguments.items()},
                "parameters": layout_digest(tensors), "size": size, "horovod_ext": __version__}
    local = exchange(settings, {"error": error, "node": node_key(), "generation": generation.proposal()},
                     allgather_blobs, what)
    errors = [(r, entry["error"]) for r, entry in enumerate(local) if entry["error"]]
    if errors:
        first_rank, message = errors[0]
        raise ValueError(f"{what}: {message} (rank {first_rank}; every rank raises this)")
    if hasattr(sync, "configure"):
        sync.configure([entry["node"] for entry in local], rank)
    sync.generation = generation.agreed([entry["generation"] for entry in local])
    return sync


def process_set_for(ranks, size, add_process_set, barrier):
    """The Horovod process set of `ranks`: the global one, one that exists, or a new one (every rank must call
    this for the same rank lists in the same order, as Horovod's add_process_set is collective). With a set other
    than the global one, the ranks leave together at exit (in_flight.leave_together; ``barrier``: a collective over
    every rank)."""
    from horovod.common.process_sets import global_process_set  # Horovod's: the rest of this module is not
    from horovod_ext.horovod_internals import existing_process_sets, process_set_object
    ranks = sorted(ranks)
    if ranks == list(range(size)):
        return global_process_set
    leave_together(barrier)
    for set_id, members in existing_process_sets().items():
        if sorted(members) == ranks:
            return process_set_object(set_id, members)
    try:
        return add_process_set(ranks)
    except Exception as exc:  # Horovod raises different types for "dynamic process sets are off"
        raise RuntimeError(f"cannot create the Horovod process set {ranks}: {exc}; {DYNAMIC_HELP}") from exc


def level_process_sets(sync, size, add_process_set, barrier):
    """{level name: process set} of a configured LeaderSync's levels with more than one member. Every rank adds
    every group, in the same order (Horovod's add_process_set is collective), not only its own."""
    for group in sync.groups:
        if len(group) > 1:
            process_set_for(group, size, add_process_set, barrier)
    return {level.name: process_set_for(level.members, size, add_process_set, barrier)
            for level in sync.levels if len(level.members) > 1}
