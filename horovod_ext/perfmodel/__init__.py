"""A performance model of data-parallel and parameter-space training with horovod-ext (framework-free): predicts
the step time and speed-up of every compressor and optimizer for any number of ranks and any link, from a model's
tensor shapes, its compute time per step and each transport's byte plan (TernGrad's evaluation method, Wen et al.
2017, Section 5)."""
from .collectives import Cluster, Link, seconds
from .plans import METHODS, Transfer, plan, wire_bytes_per_step
from .predict import THROUGHPUT, Prediction, predict, step_of
from .project import DEFAULT_LATENCY, compute_seconds_of, project, shapes_of

__all__ = ["Cluster", "DEFAULT_LATENCY", "Link", "METHODS", "Prediction", "THROUGHPUT", "Transfer",
           "compute_seconds_of", "plan", "predict", "project", "seconds", "shapes_of", "step_of", "wire_bytes_per_step"]
