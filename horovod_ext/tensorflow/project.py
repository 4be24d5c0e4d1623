"""hvd.project for TensorFlow: a running job's step time predicted at other scales and links (horovod_ext.perfmodel);
this module only collects the job's tensor shapes and statistics. TensorFlow steps run as one graph, so the
statistics hold no seconds: pass compute_seconds (a step's forward and backward, timed by the caller)."""
from horovod_ext.perfmodel.project import DEFAULT_LATENCY, shapes_of
from horovod_ext.perfmodel.project import project as perfmodel_project


def project(optimizer, ranks, gbit, latency=DEFAULT_LATENCY, ranks_per_node=None, intra_gbit=None, methods=None,
            compute_seconds=None, overlap=0.0, hierarchical=False, overhead_seconds=0.0, model=None):
    """horovod_ext.torch.project's arguments and result. optimizer: anything with compression_stats() (the
    Keras DistributedOptimizer, DistributedGradientTape, LeaderOptimizer); model: its Keras model (default the
    variables a Keras optimizer trains)."""
    variables = getattr(optimizer, "_trainable_variables", None)
    if model is None and not variables:
        raise ValueError("project: pass model= (the Keras model whose tensors are sent); this optimizer does not "
                         "hold its variables")
    shapes = shapes_of(model) if model is not None else [tuple(int(d) for d in v.shape) for v in variables]
    return perfmodel_project(shapes, optimizer.compression_stats(), ranks, gbit, latency=latency,
                             ranks_per_node=ranks_per_node, intra_gbit=intra_gbit, methods=methods,
                             compute_seconds=compute_seconds, overlap=overlap, hierarchical=hierarchical,
                             overhead_seconds=overhead_seconds)
