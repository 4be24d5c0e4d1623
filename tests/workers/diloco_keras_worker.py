"""DiLoCoOptimizer for Keras 3 under horovodrun (tests/test_diloco_keras.py): tests/workers/diloco_worker.py's
runs, eagerly, inside tf.function and with model.fit. Each rank fits its own linear-regression data with SGD inner
steps (H = 3, 4 rounds); the inner optimizer records the rank's parameters after each inner step that ends a round
(before the exchange), and the loop the outer parameters after each round. Per compressor and mode the ranks
report those, the statistics, and (tf.function) a resume from each rank's checkpoint after round 2 (Compression.none:
Horovod's idiom, rank 0 restores and broadcasts); then evaluation_parameters() and the bad arguments, each raised on
every rank. One launch holds every case (TensorFlow starts slowly)."""
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import horovod_ext.tensorflow.keras as hvd  # noqa: E402
from horovod.tensorflow import broadcast, join  # noqa: E402
from diloco_cases import STREAM_ARGUMENTS, STREAM_SAVE, STREAM_STEPS, streaming_cases  # noqa: E402
from hvdrun import expect_error, write_result  # noqa: E402

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
H, ROUNDS = 3, 4
COMPRESSIONS = {"none": lambda: hvd.Compression.none,
                "ternary-ef": lambda: hvd.Compression.ternary(error_feedback=True, min_size=16),
                "topk-ef": lambda: hvd.Compression.topk(ratio=0.1)}
TERNARY = lambda: hvd.Compression.ternary(error_feedback=True, min_size=16)  # noqa: E731


def groups():
    """Workers of two ranks: one worker at 2 ranks, the two "nodes" of -H localhost:2,127.0.0.1:2 at 4."""
    return [[0, 1]] if SIZE == 2 else "node"


# with groups: (outer compression, inner compression)
GROUPED = {"groups-none": (lambda: hvd.Compression.none, lambda: hvd.Compression.none),
           "groups-ternary-inner": (TERNARY, TERNARY)}
RECORDED = []  # the rank's parameters after each inner step that ends a round (before the exchange)


def record(*values):
    record.steps += 1
    if record.steps % H == 0:
        RECORDED.append([np.asarray(v).tolist() for v in values])


class RecordingSGD(keras.optimizers.SGD):
    """SGD that records the parameters after its step (the inner step: DiLoCoOptimizer's round comes after)."""

    def apply(self, grads, trainable_variables=None):
        super().apply(grads, trainable_variables)
        if tf.executing_eagerly():
            record(*[v.numpy() for v in trainable_variables])
        else:
            tf.py_function(record, [tf.convert_to_tensor(v) for v in trainable_variables], [])


def data(rank):
    rng = np.random.default_rng(100 + rank)
    x = rng.normal(size=(32, 8)).astype(np.float32)
    y = (x @ np.linspace(-1.0, 1.0, 32, dtype=np.float32).reshape(8, 4) * np.float32(1 + 0.1 * rank)
         + np.float32(0.5 * rank)).astype(np.float32)
    return x, y


def model(seed):
    keras.utils.set_random_seed(seed)  # also the script's seed, which the exchange's seed is proposed from
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, name="linear")], name="m")


def params(m):
    return [v.numpy().tolist() for v in m.trainable_variables]


def optimizer(name, **kwargs):
    if name in GROUPED:
        outer, inner = GROUPED[name]
        kwargs.update(compression=outer(), inner_compression=inner(), groups=groups())
    else:
        kwargs.update(compression=COMPRESSIONS[name]())
    return hvd.DiLoCoOptimizer(RecordingSGD(0.05), inner_steps=H, **kwargs)


def stepper(m, opt, graph):
    x, y = data(RANK)
    loss_fn = keras.losses.MeanSquaredError()

    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, m(x))
        opt.report_loss(loss)  # what outer="leader" elects by
        opt.apply_gradients(zip(tape.gradient(loss, m.trainable_variables), m.trainable_variables))
        return loss

    return tf.function(step) if graph else step


def checkpoint(m, opt):
    return tf.train.Checkpoint(model=m, optimizer=opt, horovod_ext=opt.horovod_ext)


def run(name, mode, tmp):
    """4 rounds; returns the record, and (mode "graph") the path of this rank's checkpoint after round 2."""
    RECORDED.clear()
    record.steps = 0
    m = model(0)
    opt = optimizer(name)
    outer, saved = [params(m)], None
    if mode == "fit":
        class Outer(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if (batch + 1) % H == 0:
                    outer.append(params(m))

        m.compile(optimizer=opt, loss="mse")
        m.fit(tf.data.Dataset.from_tensors(data(RANK)).repeat(), epochs=1, steps_per_epoch=ROUNDS * H, shuffle=False,
              verbose=0, callbacks=[Outer()])
    else:
        step = stepper(m, opt, mode == "graph")
        for k in range(1, ROUNDS * H + 1):
            step()
            if k % H == 0:
                outer.append(params(m))
                if mode == "graph" and k == 2 * H:
                    saved = checkpoint(m, opt).write(os.path.join(tmp, f"{name}-rank{RANK}"))
    stats = opt.compression_stats()
    out = {"local": list(RECORDED), "outer": outer, "payload_bytes": stats["total"]["payload_bytes"],
           "dense_bytes": stats["total"]["dense_bytes"], "rounds": stats["outer_rounds"],
           "norm": stats["outer_update_norm"], "keys": sorted(stats),
           "inner_steps_taken": stats["inner_steps_taken"], "workers": stats["workers"], "leader": stats["leader"],
           "inner": stats.get("inner", {}).get("total"), "names": [v.path for v in m.trainable_variables]}
    return out, m, opt, saved


def resumed(name, path):
    """Rounds 3 and 4 from the checkpoint of round 2, in a fresh model and optimizer (tf.function). With error
    feedback every rank reads its own checkpoint (its residuals are its own), before the first step; with
    Compression.none Horovod's idiom: rank 0 reads it, then its variables and broadcast_state()."""
    m = model(1)  # not the first run's model: everything must come from the checkpoint
    opt = optimizer(name)
    if name in ("none", "groups-none"):
        opt.build(m.trainable_variables)
        if RANK == 0:
            checkpoint(m, opt).read(path).assert_consumed()
        for i, v in enumerate(m.variables + opt.variables):  # as BroadcastGlobalVariablesCallback does
            v.assign(broadcast(tf.convert_to_tensor(v), 0, name=f"resume.{name}.{i}", ignore_name_scope=True))
        opt.horovod_ext.broadcast_state(root_rank=0)
    else:
        checkpoint(m, opt).read(path)
    step = stepper(m, opt, graph=True)
    outer = []
    for k in range(2 * H + 1, ROUNDS * H + 1):
        step()
        if k % H == 0:
            outer.append(params(m))
    return outer, opt.compression_stats()["outer_rounds"]


def evaluation(m, opt):
    """One inner step after the last round: inside evaluation_parameters() the model holds the outer parameters,
    after it its own again."""
    own_before = params(m)
    stepper(m, opt, graph=False)()
    own = params(m)
    with opt.evaluation_parameters():
        inside = params(m)
    return {"inside": inside, "own": own, "after": params(m), "outer": own_before}


def uneven_then_join(name):
    """Eagerly, rank r trains ROUNDS - r rounds, then every rank calls hvd.join(): the rounds of the ranks still
    training average with the joined ranks' zeros (Horovod's join), and every rank returns. Recorded: the
    parameters at the start, after each round's inner steps (before the exchange) and after each round."""
    RECORDED.clear()
    record.steps = 0
    m = model(0)
    opt = optimizer(name)
    step = stepper(m, opt, graph=False)
    start, outer = params(m), []
    for k in range(1, (ROUNDS - RANK) * H + 1):
        step()
        if k % H == 0:
            outer.append(params(m))
    last = join()  # horovod.tensorflow's (Horovod's Keras API has none)
    return {"outer": outer, "last_joined": int(last), "rounds": opt.compression_stats()["outer_rounds"],
            "start": start, "local": list(RECORDED)}


def bad_arguments():
    def make(**kwargs):
        return hvd.DiLoCoOptimizer(keras.optimizers.SGD(0.1), **kwargs)

    bad = {"inner_steps=0": {"inner_steps": 0}, "outer_lr=0": {"outer_lr": 0.0},
           "outer_momentum=1": {"outer_momentum": 1.0}, "nesterov=1": {"nesterov": 1},
           "inner_steps differs": {"inner_steps": 5 + RANK},
           "outer_lr on rank 1": {"outer_lr": -1.0 if RANK == 1 else 0.7},
           "groups leave rank 1 out": {"groups": [[0]] if SIZE == 2 else [[0], [2, 3]]},
           "inner_compression without groups": {"inner_compression": hvd.Compression.fp16},
           "inner_compression on rank 0 only": {"groups": groups(),
                                                "inner_compression": TERNARY() if RANK == 0 else None}}
    bad.update({"fragments not dividing inner_steps": {"inner_steps": 6, "fragments": 4},
                "overlap not below H / P": {"inner_steps": 6, "fragments": 1, "overlap": 6},
                "merge_alpha outside [0, 1]": {"merge_alpha": 1.5},
                "overlap on rank 1 only": {"inner_steps": 6, "overlap": 1 if RANK == 1 else 0},
                "an unknown outer": {"outer": "median"},
                "leader with powersgd": {"outer": "leader", "compression": hvd.Compression.powersgd}})
    errors = [expect_error(case, lambda kwargs=kwargs: make(**kwargs)) for case, kwargs in bad.items()]
    linear = model(0)
    errors.append(expect_error("fragments more than the layers", lambda: make(inner_steps=6, fragments=2).build(
        linear.trainable_variables)))
    errors.append(expect_error("not keras", lambda: hvd.DiLoCoOptimizer(object())))
    return errors


STREAMING = streaming_cases(hvd.Compression, TERNARY)  # tests/diloco_cases.py
PRE = []  # the parameters after each inner step (before the exchange)
# resumed from a checkpoint inside tf.function (each resume traces a new step: the cases with residuals and groups)
RESUMED = ("stream-ternary-merge", "leader-ternary", "leader-fp16-groups")
EAGER_ONLY = ("stream-groups",)  # groups inside tf.function: leader-fp16-groups


def flat_of(values):
    return np.concatenate([np.asarray(v, np.float32).ravel() for v in values]).tolist()


class EveryStepSGD(keras.optimizers.SGD):
    """SGD that records the parameters after every step (before DiLoCoOptimizer's exchange and update)."""

    def apply(self, grads, trainable_variables=None):
        super().apply(grads, trainable_variables)
        keep = lambda *values: PRE.append(flat_of(values))  # noqa: E731
        if tf.executing_eagerly():
            keep(*[v.numpy() for v in trainable_variables])
        else:
            tf.py_function(keep, [tf.convert_to_tensor(v) for v in trainable_variables], [])


def stream_model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="tanh", name="l0"),
                             keras.layers.Dense(8, activation="tanh", name="l1"), keras.layers.Dense(4, name="l2")],
                            name="mlp")


def stream_optimizer(name):
    case = STREAMING[name]
    return hvd.DiLoCoOptimizer(EveryStepSGD(0.05), **STREAM_ARGUMENTS, merge_alpha=case["merge_alpha"],
                               compression=case["compression"](), groups=groups() if case.get("groups") else None,
                               outer=case.get("outer", "average"))


def stream_steps(m, opt, step, first, last, leader=False):
    """Steps first..last; per step the parameters after it, the outer parameters, the loss, and (leader) the last
    elected rank."""
    post, outer, losses, elected = [], [], [], []
    for _ in range(first, last + 1):
        losses.append(float(step()))
        post.append(flat_of(m.trainable_variables))
        if leader:
            elected.append(opt.compression_stats()["elected"])
        with opt.evaluation_parameters():
            outer.append(flat_of(m.trainable_variables))
    return post, outer, losses, elected


def streaming(name, mode, tmp):
    """STREAM_STEPS steps; in a graph also this rank's checkpoint after STREAM_SAVE (an exchange in flight), read
    into a new model and optimizer that take the remaining steps."""
    PRE.clear()
    m = stream_model()
    opt = stream_optimizer(name)
    step = stepper(m, opt, mode == "graph")
    opt.build(m.trainable_variables)
    start = flat_of(m.trainable_variables)
    leader = STREAMING[name].get("outer") == "leader"
    post, outer, losses, elected = stream_steps(m, opt, step, 1, STREAM_SAVE, leader)
    in_flight = opt.compression_stats()["in_flight"]
    path = checkpoint(m, opt).write(os.path.join(tmp, f"{name}-stream-rank{RANK}")) \
        if mode == "graph" and name in RESUMED else None
    more = stream_steps(m, opt, step, STREAM_SAVE + 1, STREAM_STEPS, leader)
    stats = opt.compression_stats()
    names = [v.path for v in m.trainable_variables]
    offsets = {n: (int(sum(np.prod(v.shape) for v in m.trainable_variables[:i])), int(np.prod(v.shape)))
               for i, (n, v) in enumerate(zip(names, m.trainable_variables))}
    out = {"rank": RANK, "start": start, "pre": list(PRE), "post": post + more[0], "outer": outer + more[1],
           "losses": losses + more[2], "elected": stats["elected"], "elected_at": elected + more[3],
           "payload_bytes": stats["total"]["payload_bytes"],
           "in_flight_at_save": in_flight, "fragments": stats["fragments"], "rounds": stats["outer_rounds"],
           "workers": stats["workers"], "peak": stats["peak_exchange_payload_bytes"],
           "ranges": [[offsets[n] for n in names_f] for names_f in stats["fragments"]]}
    if path is not None:
        PRE.clear()
        again = stream_model(1)
        again_opt = stream_optimizer(name)
        again_opt.build(again.trainable_variables)
        checkpoint(again, again_opt).read(path)  # residuals are made at the first step: restored then
        post, outer, _, _ = stream_steps(again, again_opt, stepper(again, again_opt, True), STREAM_SAVE + 1,
                                      STREAM_STEPS)
        out["resumed"] = {"pre": list(PRE), "post": post, "outer": outer}
    return out


def main():
    tmp = tempfile.mkdtemp(prefix=f"hvdext-diloco-keras-{RANK}-")
    out = {"rank": RANK, "size": SIZE, "runs": {}, "fit": None, "errors": []}
    x, y = data(RANK)
    out["data"] = [x.tolist(), y.tolist()]
    for name in [*COMPRESSIONS, *GROUPED]:
        out["runs"][name] = {}
        for mode in ("eager", "graph"):
            result, m, opt, saved = run(name, mode, tmp)
            if mode == "eager" and name == "none":
                out["evaluation"] = evaluation(m, opt)
            if saved is not None:
                result["resumed"], result["resumed_rounds"] = resumed(name, saved)
            out["runs"][name][mode] = result
    out["fit"], _, _, _ = run("none", "fit", tmp)
    out["streaming"] = {name: {mode: streaming(name, mode, tmp)
                               for mode in (("eager",) if name in EAGER_ONLY else ("eager", "graph"))}
                        for name in STREAMING}
    out["join"] = {name: uneven_then_join(name) for name in ("none", "ternary-ef")}
    out["errors"] = bad_arguments()
    out["alive"] = float(hvd.allreduce(tf.constant([1.0]), name="alive", op=hvd.Sum).numpy()[0])
    write_result(RANK, out)


if __name__ == "__main__":
    main()
