"""One rank of the identity check (benchmarks/identity.py): trains a small model a few steps with every compressor
and both leader optimizers (sync and async), in PyTorch and in TensorFlow (eager and tf.function), on fixed seeds,
and writes the SHA-256 of this rank's parameters after each configuration. Two lifecycles are run besides a plain
run, for the compressors with state (LIFECYCLE): "resume", a checkpoint written after half the steps and loaded into
a new model and optimizer (Horovod's idiom: rank 0 loads, then broadcast_parameters and broadcast_optimizer_state);
"reset", Horovod's elastic reset after half the steps (commit, one step rolled back by restore, shutdown and init,
on_reset, sync), as horovod_ext's elastic run loop does it. argv[1]: the framework; argv[2]: the output prefix."""
import hashlib
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402

STEPS = 6
SIZES = [(32, 64), (64,), (64, 48), (48,), (48, 10), (10,)]


def compressors(hvd):
    C = hvd.Compression
    return {
        "none": C.none, "fp16": C.fp16,
        "ternary": C.ternary(seed=7),
        "ternary-2bit-clipoff": C.ternary(seed=7, packing="2bit", clip=None, min_size=0),
        "ternary-two_phase-ef": C.ternary(seed=7, shared_scale=True, transport="two_phase", error_feedback=True,
                                          min_size=0),
        "ternary-shared-allgather": C.ternary(seed=7, shared_scale=True, transport="allgather", min_size=0),
        "ternary-ef": C.ternary(seed=7, error_feedback=True, min_size=0),
        "ternary-shared-allgather-ef": C.ternary(seed=7, shared_scale=True, transport="allgather",
                                                error_feedback=True, min_size=0),
        "topk": C.topk(ratio=0.05),
        "topk-int32-fp32": C.topk(ratio=0.05, packing="int32", value_dtype="fp32"),
        "topk-ternary-values": C.topk(ratio=0.05, value_dtype="ternary"),
        "topk-sparse_reduce": C.topk(ratio=0.05, transport="sparse_reduce", rebalance_every=2),
        "topk-no-ef": C.topk(ratio=0.05, error_feedback=False),
        "topk-sparse_reduce-no-ef": C.topk(ratio=0.05, transport="sparse_reduce", error_feedback=False),
        "adaptive_topk": C.adaptive_topk(window=2, omega=0.0, epsilon=0.3),
        "adaptive_topk-sparse_reduce": C.adaptive_topk(window=2, omega=0.0, epsilon=0.3, transport="sparse_reduce",
                                                       rebalance_every=2),
        "adaptive_topk-dense": C.adaptive_topk(window=2, omega=0.0, epsilon=1.0),  # every decision: dense
        "powersgd": C.powersgd(rank=2, start_iter=2, seed=5),
        "powersgd-no-ef": C.powersgd(rank=2, start_iter=2, seed=5, error_feedback=False),
        "powersgd-fp16-batched-qr-cold": C.powersgd(rank=2, start_iter=2, seed=5, value_dtype="fp16",
                                                    batch_tensors=True, orthogonalization="qr", warm_start=False),
    }


LIFECYCLE = ("ternary", "ternary-two_phase-ef", "topk", "adaptive_topk-sparse_reduce", "powersgd")
# Buckets (compression/buckets.py) besides the default 25 MB, which holds this model in one bucket: 0 (one tensor
# per bucket, no fusion), 0.01 (three buckets: the last layer with its bias and the next bias, the middle weight
# alone, the first layer) and 1 (one bucket). Keyed "torch/bucket_cap_mb=C/..." (every PyTorch configuration) and
# "tf-eager/bucket_cap_mb=C/..." (DistributedGradientTape's, eagerly).
BUCKET_CAPS = (0, 0.01, 1)


def digest(arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def batches(rank, shape_in=32):
    rng = np.random.default_rng(1000 + rank)
    return [(rng.standard_normal((16, shape_in)).astype(np.float32), rng.integers(0, 10, 16)) for _ in range(STEPS)]


def run_torch(out):
    import torch
    import horovod_ext.torch as hvd
    hvd.init()
    rank = hvd.rank()
    torch.set_num_threads(1)

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 48),
                                   torch.nn.Tanh(), torch.nn.Linear(48, 10))

    def train(make_opt, report=False):
        m = model()
        opt = make_opt(m)
        for x, y in batches(rank):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(m(torch.from_numpy(x)), torch.from_numpy(y))
            loss.backward()
            if report:
                opt.report_loss(loss)
            opt.step()
        return digest(p.detach().numpy() for p in m.parameters())

    def step(m, opt, x, y):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        opt.step()

    def resumed(make_opt):
        """Half the steps, a checkpoint, then a new model and optimizer: rank 0 loads it and broadcasts."""
        data, half = batches(rank), STEPS // 2
        m = model()
        opt = make_opt(m)
        for x, y in data[:half]:
            step(m, opt, x, y)
        checkpoint = {"model": m.state_dict(), "optimizer": opt.state_dict()}
        m2 = model()
        with torch.no_grad():
            for p in m2.parameters():
                p.add_(1.0)  # differs from the checkpoint: the broadcast must bring it back
        opt2 = make_opt(m2)
        if rank == 0:
            m2.load_state_dict(checkpoint["model"])
            opt2.load_state_dict(checkpoint["optimizer"])
        hvd.broadcast_parameters(m2.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt2, root_rank=0)
        for x, y in data[half:]:
            step(m2, opt2, x, y)
        return digest(p.detach().numpy() for p in m2.parameters())

    def sparse_run(comp, sparse_as_dense, cap=25):
        """An embedding of sparse gradients (Horovod's sparse allreduce, or sent dense) beside a dense layer."""
        torch.manual_seed(0)
        embedding, head = torch.nn.Embedding(200, 8, sparse=True), torch.nn.Linear(8, 10)  # 1,600: compressed
        named = [("embedding.weight", embedding.weight)] + [(f"head.{n}", p) for n, p in head.named_parameters()]
        opt = hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in named], lr=0.1), named, compression=comp,
                                       sparse_as_dense=sparse_as_dense, bucket_cap_mb=cap)
        for x, y in batches(rank):
            opt.zero_grad()
            tokens = torch.from_numpy(np.abs(x[:, :4] * 100).astype(np.int64) % 200)
            torch.nn.functional.cross_entropy(head(embedding(tokens).mean(1)), torch.from_numpy(y)).backward()
            opt.step()
        return digest(p.detach().numpy() for _, p in named)

    def reset(make_opt):
        """Half the steps, a commit, one step rolled back (restore), Horovod's elastic reset, on_reset, sync."""
        from horovod_ext.torch import elastic
        data, half = batches(rank), STEPS // 2
        m = model()
        opt = make_opt(m)
        state = elastic.TorchState(model=m, optimizer=opt)
        for x, y in data[:half]:
            step(m, opt, x, y)
        state.save()
        step(m, opt, *data[half])
        state.restore()
        elastic._reset()
        state.on_reset()
        state.sync()
        for x, y in data[half:]:
            step(m, opt, x, y)
        return digest(p.detach().numpy() for p in m.parameters())

    for cap in (25,) + BUCKET_CAPS:
        key = "torch" if cap == 25 else f"torch/bucket_cap_mb={cap}"
        for name, comp in compressors(hvd).items():
            def make(m, comp=comp, cap=cap):
                return hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                                m.named_parameters(), compression=comp, bucket_cap_mb=cap)
            out[f"{key}/{name}"] = train(make)
            if name in LIFECYCLE:
                out[f"{key}/resume/{name}"] = resumed(make)
                out[f"{key}/reset/{name}"] = reset(make)
        for name, as_dense in (("sparse", False), ("sparse_as_dense", True)):  # nn.Embedding(sparse=True)
            for cname in ("none", "ternary"):
                out[f"{key}/{name}/{cname}"] = sparse_run(compressors(hvd)[cname], as_dense, cap)
    leaders = {
        "lsgd": dict(groups=None, period=2),
        "lsgd-node": dict(groups="node", period=2, global_period=4),
        "lsgd-async": dict(groups=None, period=2, asynchronous=True),
    }
    for name, kw in leaders.items():
        out[f"torch/{name}"] = train(lambda m: hvd.LeaderOptimizer(
            torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(), **kw), report=True)
    for name, kw in {"easgd": dict(period=2), "easgd-async": dict(period=2, asynchronous=True)}.items():
        out[f"torch/{name}"] = train(lambda m: hvd.ElasticAveragingOptimizer(
            torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(), **kw))
    return rank


def run_tf(out):
    import keras
    import tensorflow as tf
    import horovod_ext.tensorflow.keras as hvdk
    import horovod_ext.tensorflow as hvd
    hvd.init()
    rank = hvd.rank()

    def variables():
        rng = np.random.default_rng(0)
        return [tf.Variable(rng.standard_normal(s).astype(np.float32) * 0.2, name=f"w{i}")
                for i, s in enumerate(SIZES)]

    def forward(vs, x):
        h = tf.tanh(x @ vs[0] + vs[1])
        h = tf.tanh(h @ vs[2] + vs[3])
        return h @ vs[4] + vs[5]

    def loss_of(vs, x, y):
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, forward(vs, x)))

    def keras_lifecycle(comp, graph):
        """Keras 3 DistributedOptimizer: half the steps, a commit of every variable and of horovod_ext's state,
        one step rolled back, Horovod's elastic reset, elastic_reset and elastic_sync, then the rest."""
        from horovod_ext.tensorflow.keras import elastic
        vs, data, half = variables(), batches(rank), STEPS // 2
        opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), compression=comp)

        def make_step():
            def step(x, y):
                with tf.GradientTape() as tape:
                    loss = loss_of(vs, x, y)
                opt.apply(tape.gradient(loss, vs), vs)
            return tf.function(step) if graph else step

        fn = make_step()
        for x, y in data[:half]:
            fn(tf.constant(x), tf.constant(y))
        saved = [v.numpy() for v in vs + list(opt.variables)], opt.horovod_ext.elastic_commit()
        fn(*map(tf.constant, data[half]))
        for v, value in zip(vs + list(opt.variables), saved[0]):
            v.assign(value)
        opt.horovod_ext.elastic_restore(saved[1])
        elastic._reset()
        opt.horovod_ext.elastic_reset()
        opt.horovod_ext.elastic_sync()
        fn = make_step()
        for x, y in data[half:]:
            fn(tf.constant(x), tf.constant(y))
        return digest(v.numpy() for v in vs)

    for graph in (False, True):
        mode = "graph" if graph else "eager"
        for name in LIFECYCLE:
            out[f"tf-{mode}/reset/{name}"] = keras_lifecycle(compressors(hvd)[name], graph)
        # tf-graph's tapes continue the aggregators of tf-eager's (one per compressor and options), whose default-cap
        # one the sparse runs below also step: the bucketed twins run eagerly only (tests/test_buckets.py runs
        # tf.function and Keras at every cap from fresh aggregators)
        for cap in (25,) + (() if graph else BUCKET_CAPS):
            key = f"tf-{mode}" if cap == 25 else f"tf-{mode}/bucket_cap_mb={cap}"
            for name, comp in compressors(hvd).items():
                vs = variables()

                def step(x, y, comp=comp, vs=vs, cap=cap):
                    with tf.GradientTape() as tape:
                        loss = loss_of(vs, x, y)
                    tape = hvd.DistributedGradientTape(tape, compression=comp, bucket_cap_mb=cap)
                    for v, g in zip(vs, tape.gradient(loss, vs)):
                        v.assign_sub(0.1 * g)

                fn = tf.function(step) if graph else step
                for x, y in batches(rank):
                    fn(tf.constant(x), tf.constant(y))
                out[f"{key}/{name}"] = digest(v.numpy() for v in vs)
        for name, as_dense in (("sparse", False), ("sparse_as_dense", True)):  # tf.gather: IndexedSlices
            for cname in ("none", "ternary"):
                table, head = tf.Variable(variables()[0] * 1.0), tf.Variable(variables()[2][:, :10] * 1.0)  # 2,048, 640

                def step(x, y, comp=compressors(hvd)[cname], as_dense=as_dense, table=table, head=head):
                    tokens = tf.cast(tf.math.floormod(tf.abs(x[:, :4] * 10), 32.0), tf.int64)
                    with tf.GradientTape() as tape:
                        h = tf.reduce_mean(tf.gather(table, tokens), axis=1)
                        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, h @ head))
                    tape = hvd.DistributedGradientTape(tape, compression=comp, sparse_as_dense=as_dense)
                    for v, g in zip((table, head), tape.gradient(loss, [table, head])):
                        v.assign_sub(0.1 * tf.convert_to_tensor(g))

                fn = tf.function(step) if graph else step
                for x, y in batches(rank):
                    fn(tf.constant(x), tf.constant(y))
                out[f"tf-{mode}/{name}/{cname}"] = digest(v.numpy() for v in (table, head))
        for name, make in {
            "lsgd": lambda o: hvdk.LeaderOptimizer(o, groups=None, period=2),
            "lsgd-node": lambda o: hvdk.LeaderOptimizer(o, groups="node", period=2, global_period=4),
            "easgd": lambda o: hvdk.ElasticAveragingOptimizer(o, period=2),
        }.items():
            vs = variables()
            opt = make(keras.optimizers.SGD(0.1))

            def step(x, y, opt=opt, vs=vs):
                with tf.GradientTape() as tape:
                    loss = loss_of(vs, x, y)
                opt.report_loss(loss)
                opt.apply(tape.gradient(loss, vs), vs)

            fn = tf.function(step) if graph else step
            for x, y in batches(rank):
                fn(tf.constant(x), tf.constant(y))
            out[f"tf-{mode}/{name}"] = digest(v.numpy() for v in vs)
    return rank


if __name__ == "__main__":
    framework, prefix = sys.argv[1], sys.argv[2]
    result = {}
    rank = run_torch(result) if framework == "torch" else run_tf(result)
    with open(f"{prefix}.{framework}.rank{rank}.json", "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
