"""Streaming DiLoCo's and the leader's cases, run alike by tests/workers/diloco_worker.py (PyTorch) and
diloco_keras_worker.py (Keras) on a 3-layer MLP: H = 6, P = 3 (a fragment every 2 steps), overlap 1, STREAM_STEPS
steps; after step STREAM_SAVE fragment 0's exchange is in flight (started at 8, due at 9), where each rank saves a
checkpoint that a new model and optimizer resume from."""

STREAM_STEPS, STREAM_SAVE = 14, 8
STREAM_ARGUMENTS = {"inner_steps": 6, "fragments": 3, "overlap": 1}


def streaming_cases(compression, ternary):
    """{case: DiLoCoOptimizer's arguments as functions of the job (compression made fresh per run)}; compression:
    the framework's hvd.Compression, ternary: a function making its ternary compressor with error feedback."""
    return {"stream-none": {"compression": lambda: compression.none, "merge_alpha": 0.0},
            "stream-ternary-merge": {"compression": ternary, "merge_alpha": 0.5},
            "stream-groups": {"compression": lambda: compression.none, "merge_alpha": 0.0, "groups": True},
            # outer="leader": the best worker's pseudo-gradient steers each fragment's outer step
            "leader-none": {"compression": lambda: compression.none, "merge_alpha": 0.0, "outer": "leader"},
            "leader-ternary": {"compression": ternary, "merge_alpha": 0.0, "outer": "leader"},
            "leader-fp16-groups": {"compression": lambda: compression.fp16, "merge_alpha": 0.0,
                                   "outer": "leader", "groups": True}}
