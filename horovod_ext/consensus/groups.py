"""Leader groups for multi-leader LSGD: which ranks share a local leader (framework-free).

A group is a Horovod process set. ``groups="node"`` puts the ranks of one host in a group: the host is the name
horovodrun gives each process (HOROVOD_HOSTNAME, so ``-H localhost:2,127.0.0.1:2`` is two "nodes" on one
machine), else the machine's host name. ``groups=[[0, 1], [2, 3]]`` names the groups explicitly; they must cover
every rank exactly once. ``groups=None`` is single-leader LSGD: one group of all ranks.
"""
import os
import socket

GROUPS_HELP = 'groups must be "node", None (one leader for all ranks) or a list of rank lists such as [[0, 1], [2, 3]]'


def node_key():
    """This process's host, as horovodrun named it."""
    return os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()


def describe_groups(groups):
    """The groups argument as the ranks compare it (a string, so that any value can be exchanged)."""
    if groups is None or isinstance(groups, str):
        return repr(groups)
    try:
        return repr([[int(r) for r in g] for g in groups])
    except (TypeError, ValueError):
        return repr(groups)


def check_groups(groups, size, help_=GROUPS_HELP):
    """Validate the groups argument; return None, "node" or a list of sorted rank lists. Raises ValueError (help_:
    what the argument may be, for the message)."""
    if groups is None or groups == "node":
        return groups
    if isinstance(groups, str):
        raise ValueError(f"{help_}; got {groups!r}")
    try:
        lists = [list(g) for g in groups]
    except TypeError:
        raise ValueError(f"{help_}; got {groups!r}") from None
    if not lists or any(not g for g in lists):
        raise ValueError(f"{help_}; got {groups!r} (a group is empty)")
    for g in lists:
        for r in g:
            if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < size:
                raise ValueError(f"groups: rank {r!r} is not a rank of this job (0..{size - 1}); got {groups!r}")
    seen, overlap = set(), set()
    for g in lists:
        overlap |= seen & set(g)
        seen |= set(g)
        if len(set(g)) != len(g):
            overlap |= {r for r in g if g.count(r) > 1}
    if overlap:
        raise ValueError(f"groups overlap: rank(s) {sorted(overlap)} are in more than one group; got {groups!r}")
    left_out = sorted(set(range(size)) - seen)
    if left_out:
        raise ValueError(f"groups leave rank(s) {left_out} out; every rank of the job (0..{size - 1}) must be in "
                         f"exactly one group; got {groups!r}")
    return sorted(sorted(g) for g in lists)


def resolve_groups(checked, node_keys):
    """The partition of ranks: node_keys[r] is rank r's host (used for "node")."""
    size = len(node_keys)
    if checked is None:
        return [list(range(size))]
    if checked == "node":
        by_node = {}
        for rank, key in enumerate(node_keys):
            by_node.setdefault(key, []).append(rank)
        return sorted(by_node.values())
    return checked


def group_of(groups, rank):
    return next(g for g in groups if rank in g)
