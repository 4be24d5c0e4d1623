"""What of a compressor's state is shared by all ranks and what belongs to one rank, for checkpoints and Horovod's
resume pattern (rank 0 loads the checkpoint, then ``broadcast_parameters`` and ``broadcast_optimizer_state``).

Shared (every rank holds the same value in an uninterrupted run, so one rank's checkpoint restores it everywhere):
the step counter (part of every ternary random key), the seed, the byte statistics, and the method's shared state
(plan.Method.shared_state: GraVAC's controller, whose decisions are taken from allreduced gains, so every rank's
controller is the same, and sparse_reduce's regions, rebalanced from an allreduce, so the same on every rank).

Per rank: error-feedback residuals r_i (top-k, adaptive top-k). They hold what rank i computed but has not sent yet
and exist only on rank i. A checkpoint written by rank 0 alone holds rank 0's residuals; they are restored only on
a rank with the same rank number in a job of the same size, and every other rank starts from r_i = 0: what those
ranks had not yet sent at the checkpoint is dropped (a one-time loss of at most one step's unsent gradient mass, the
same as one dense step of error feedback's reset). A checkpoint that each rank writes and loads itself restores
every residual, and the run continues bit for bit. With a different number of ranks no residual is restored.

Agreement: the rank(s) that loaded a checkpoint offer its shared part at the next settings exchange (one allgather
the optimizer already makes before its first collective); every rank adopts the offer of the lowest such rank. So
resuming works with Horovod's own ``broadcast_optimizer_state`` (which knows nothing of this state) as well as with
horovod_ext's, which broadcasts it at once.
"""
SHARED_KEYS = ("step", "seed", "stats", "method")


def split_checkpoint(ours):
    """(shared, per_rank) parts of horovod_ext's entry in an optimizer state_dict. "method" is the method's shared
    state (plan.Method.shared_state); older layouts held GraVAC's controller and sparse_reduce's regions at the top
    (or the controller and the residuals under "transport"), read into the same place."""
    transport = ours.get("transport") or {}
    method = ours.get("method")
    if method is None:
        older = {"controller": ours.get("controller", transport.get("controller")), "regions": ours.get("regions")}
        method = {key: value for key, value in older.items() if value is not None} or None
    shared = {"step": int(ours["step"]), "seed": ours.get("seed"), "stats": ours.get("stats"), "method": method}
    per_rank = {"rank": ours.get("rank", 0), "size": ours.get("size"),
                "residuals": ours.get("residuals", transport.get("residuals")) or {}}
    return shared, per_rank


def residuals_for(per_rank, rank, size):
    """The residuals a rank may restore from a checkpoint: only its own, from a job of the same size; else None."""
    if not per_rank["residuals"]:
        return None
    if per_rank["rank"] != rank or (per_rank["size"] is not None and per_rank["size"] != size):
        return None
    return per_rank["residuals"]


def adopted_offer(offers):
    """The shared state every rank adopts after an exchange: the offer of the lowest rank that made one, else None."""
    for offer in offers:
        if offer is not None:
            return offer
    return None
