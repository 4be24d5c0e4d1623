"""hvd.project for PyTorch: a running job's step time predicted at other scales and links (horovod_ext.perfmodel);
this module only collects the job's tensor shapes and statistics."""
from horovod_ext.perfmodel.project import DEFAULT_LATENCY, shapes_of
from horovod_ext.perfmodel.project import project as perfmodel_project


def project(optimizer, ranks, gbit, latency=DEFAULT_LATENCY, ranks_per_node=None, intra_gbit=None, methods=None,
            compute_seconds=None, overlap=0.0, hierarchical=False, overhead_seconds=0.0, model=None):
    """Predict this job's step time at ``ranks`` ranks on ``gbit`` Gbit/s links for every compressor and optimizer
    (horovod_ext.perfmodel), from one short run: the tensor shapes (the optimizer's parameters, or ``model``'s)
    and ``optimizer.compression_stats()`` (its step time, less its communication and compression: compute).
    Returns {method: Prediction} (step_seconds, speedup_over_dense, speedup_over_fp16, wire_bytes, transfers).

        predictions = hvd.project(opt, ranks=64, gbit=10)
        best = min(predictions.values(), key=lambda p: p.step_seconds)
    """
    shapes = shapes_of(model) if model is not None else \
        [tuple(p.shape) for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    return perfmodel_project(shapes, optimizer.compression_stats(), ranks, gbit, latency=latency,
                             ranks_per_node=ranks_per_node, intra_gbit=intra_gbit, methods=methods,
                             compute_seconds=compute_seconds, overlap=overlap, hierarchical=hierarchical,
                             overhead_seconds=overhead_seconds)
