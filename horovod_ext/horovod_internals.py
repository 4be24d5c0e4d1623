"""The only module that touches Horovod's private API (names with a leading underscore), checked against the
Horovod version they were read from. A Horovod upgrade that moves them fails here, at first use, with a message that
names the versions, instead of somewhere inside a training step.

What is used, from Horovod 0.28.1's horovod/common/process_sets.py and horovod/{torch,tensorflow}/mpi_ops.py:
- the framework's ``mpi_ops._basics`` (the HorovodBasics whose process sets a process set object reads);
- ``process_sets._setup(basics)`` and ``process_sets._init_process_sets(sets)``: after init, resolve the ranks of
  the process sets through the framework just initialized (consensus/init.py says why);
- ``process_sets._basics._get_process_set_ids_and_ranks()`` and ``process_sets._temp_process_set_object(id)``: the
  process sets that exist, to reuse one for a leader group instead of adding a duplicate (consensus/agreement.py).
"""
from horovod.common import process_sets as _process_sets

KNOWN_VERSIONS = ("0.28.1",)


def check_version(version=None):
    """Raise RuntimeError unless the installed Horovod (or `version`) is one whose private API this module knows."""
    if version is None:
        import horovod
        version = getattr(horovod, "__version__", "unknown")
    if version not in KNOWN_VERSIONS:
        raise RuntimeError(f"horovod_ext uses private parts of Horovod {', '.join(KNOWN_VERSIONS)} (process sets, "
                           f"horovod_ext/horovod_internals.py), and Horovod {version} is installed; install "
                           f"horovod=={KNOWN_VERSIONS[-1]} (scripts/setup.sh builds it), or update that module")
    return version


def framework_basics(framework_module):
    """The HorovodBasics of horovod.torch or horovod.tensorflow (its mpi_ops._basics)."""
    check_version()
    return framework_module.mpi_ops._basics


def resolve_process_sets(basics, given):
    """Point Horovod's process-set bookkeeping at `basics` and resolve the ranks of the process sets again."""
    check_version()
    _process_sets._setup(basics)
    _process_sets._init_process_sets(given)


def existing_process_sets():
    """{process set id: member ranks} of every process set Horovod holds now."""
    check_version()
    return _process_sets._basics._get_process_set_ids_and_ranks()


def process_set_object(set_id, members):
    """A ProcessSet object for an existing process set id, with its ranks."""
    check_version()
    existing = _process_sets._temp_process_set_object(set_id)
    existing.ranks = list(members)
    return existing
