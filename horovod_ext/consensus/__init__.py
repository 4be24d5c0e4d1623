"""Framework-free parts of the parameter-space optimizers (LSGD, multi-leader LSGD, EASGD) shared by the PyTorch
and TensorFlow adapters: argument checks, leader groups, the pull schedule, the election and byte accounting."""
from .elastic import ElasticSync
from .groups import check_groups, node_key, resolve_groups
from .leader import LeaderSync, Level
from .rounds import Rounds, check_staleness

__all__ = ["ElasticSync", "LeaderSync", "Level", "check_groups", "node_key", "resolve_groups", "Rounds",
           "check_staleness"]
