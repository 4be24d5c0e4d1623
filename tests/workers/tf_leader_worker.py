"""Multi-process checks of LeaderOptimizer and ElasticAveragingOptimizer on Keras 3 optimizers (run by horovodrun).

The same properties as tests/workers/leader_worker.py, eagerly and inside tf.function; float64 variables and zero
gradients where a check compares with the NumPy reference."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import horovod_ext.tensorflow.keras as hvd  # noqa: E402
from hvdext_reference import lsgd as ref  # noqa: E402
from hvdrun import expect_error, write_result  # noqa: E402

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()


def model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="tanh", dtype="float64"),
                             keras.layers.Dense(3, dtype="float64")])


def flat(m):
    return np.concatenate([np.asarray(v).reshape(-1) for v in m.trainable_variables])


_tags = iter(range(10 ** 6))


def gathered(m):
    return hvd.allgather(tf.reshape(tf.constant(flat(m)), [1, -1]), name=f"check.{next(_tags)}").numpy()


def stepper(opt, m, graph):
    def step(loss):
        opt.report_loss(loss)
        opt.apply([tf.zeros_like(v) for v in m.trainable_variables], m.trainable_variables)
    return tf.function(step) if graph else step


def losses():
    return [10.0 - (r % 2) - 0.1 * r for r in range(SIZE)]


def check_pulls(groups, graph):
    m = model(100 + RANK)
    opt = hvd.LeaderOptimizer(keras.optimizers.SGD(0.1), pull=0.2, global_pull=0.1, period=1, global_period=1,
                              groups=groups)
    step = stepper(opt, m, graph)
    before = gathered(m)
    step(tf.constant(losses()[RANK], tf.float64))
    after = gathered(m)
    sync = opt.horovod_ext.sync
    close, exact = [], []
    everyone = list(range(SIZE))
    for r in range(SIZE):
        if groups is None:
            targets = [(0.2, before[ref.elect(losses(), [1] * SIZE, everyone)])]
        else:
            members = next(g for g in sync.groups if r in g)
            targets = [(0.2, before[ref.elect(losses(), [1] * SIZE, members)]),
                       (0.1, before[ref.elect(losses(), [1] * SIZE, everyone)])]
        close.append(bool(np.allclose(after[r], ref.leader_pull(before[r], targets), rtol=1e-13, atol=1e-15)))
        if all(np.array_equal(t, before[r]) for _, t in targets):
            exact.append(bool(np.array_equal(after[r], before[r])))
    with opt.evaluation_parameters():
        inside = gathered(m)
    best = int(opt.compression_stats()["best_rank"])
    return {"close": close, "exact": exact, "groups": sync.groups, "best": best,
            "evaluation_is_best": bool(all(np.array_equal(inside[r], after[best]) for r in range(SIZE))),
            "restored": bool(np.array_equal(flat(m), after[RANK]))}


def check_schedule(graph):
    m = model(RANK)
    opt = hvd.LeaderOptimizer(keras.optimizers.SGD(0.1), period=2, global_period=4, groups="node")
    step = stepper(opt, m, graph)
    per_step = []
    for _ in range(8):
        step(tf.constant(1.0 + RANK, tf.float64))
        per_step.append(opt.compression_stats()["last_step"]["payload_bytes"])
    return {"payload_per_step": per_step, "param_bytes": int(flat(m).size * 8),
            "group_sizes": [len(g) for g in opt.horovod_ext.sync.groups]}


def check_independent_when_no_pull():
    x = np.random.default_rng(RANK).normal(size=(8, 5))
    y = np.random.default_rng(RANK).integers(0, 3, size=8)
    runs = []
    for wrap in (True, False):
        m = model(RANK)
        opt = keras.optimizers.SGD(0.1, momentum=0.9)
        if wrap:
            opt = hvd.LeaderOptimizer(opt, pull=0.0, global_pull=0.0, period=2, global_period=4)

        @tf.function
        def train(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, m(x), from_logits=True))
            if wrap:
                opt.report_loss(loss)
            opt.apply(tape.gradient(loss, m.trainable_variables), m.trainable_variables)

        for _ in range(8):
            train(x, y)
        runs.append(flat(m))
    return bool(np.array_equal(runs[0], runs[1]))


def check_easgd(graph, rounds=4, beta=0.9):
    m = model(RANK)
    opt = hvd.ElasticAveragingOptimizer(keras.optimizers.SGD(0.1), beta=beta, period=1)
    step = stepper(opt, m, graph)
    workers = gathered(m)
    center = workers.mean(axis=0)
    spreads, center_errors, worker_errors = [], [], []
    for _ in range(rounds):
        step(tf.constant(1.0, tf.float64))
        new_workers, center = ref.easgd_round(list(workers), center, beta)
        workers = gathered(m)
        worker_errors.append(float(np.max(np.abs(workers - np.array(new_workers)))))
        with opt.evaluation_parameters():
            center_errors.append(float(np.max(np.abs(flat(m) - center))))
        spreads.append(float(np.linalg.norm(workers - workers.mean(axis=0))))
    return {"spreads": spreads, "center_errors": center_errors, "worker_errors": worker_errors,
            "alpha": beta / SIZE}


def check_checkpoint():
    m = model(RANK)
    opt = hvd.LeaderOptimizer(keras.optimizers.SGD(0.1), period=2, groups=None)
    step = stepper(opt, m, graph=False)
    for _ in range(3):
        step(tf.constant(2.0 - RANK, tf.float64))
    path = tf.train.Checkpoint(horovod_ext=opt.horovod_ext).write(f"/tmp/hvdext_tf_leader_ckpt_{RANK}")
    _ = model(RANK)  # built as a resumed run builds its model (the restored state is the optimizer's)
    opt2 = hvd.LeaderOptimizer(keras.optimizers.SGD(0.1), period=2, groups=None)
    tf.train.Checkpoint(horovod_ext=opt2.horovod_ext).read(path).assert_consumed()
    s = opt2.horovod_ext
    return {"step": int(s.step.numpy()), "count": float(s.loss_count.numpy()),
            "best": int(opt2.compression_stats()["best_rank"])}  # the restored sync state


def check_asynchronous_fallback(graph):
    """asynchronous=True in TensorFlow: a warning saying why, then exactly the synchronous optimizer; and the
    workers' average through evaluation_parameters(which="center")."""
    import warnings
    runs, messages = [], []
    for asynchronous in (False, True):
        m = model(200 + RANK)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt = hvd.LeaderOptimizer(keras.optimizers.SGD(0.1), pull=0.2, global_pull=0.1, period=2,
                                      global_period=4, groups="node", asynchronous=asynchronous)
        messages += [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        step = stepper(opt, m, graph)
        for k in range(8):
            step(tf.constant(10.0 - ((RANK + k // 2) % SIZE), tf.float64))
        runs.append(flat(m))
    everyone = gathered(m)
    with opt.evaluation_parameters(which="center"):
        center_error = float(np.max(np.abs(flat(m) - everyone.mean(axis=0))))
    return {"equal": bool(np.array_equal(runs[0], runs[1])), "warnings": messages, "center_error": center_error,
            "staleness": opt.horovod_ext.sync.staleness}


def bad_inputs():
    def leader(**kwargs):
        return hvd.LeaderOptimizer(keras.optimizers.SGD(0.1), **kwargs)

    def nan_run(graph):
        m = model(RANK)
        step = stepper(leader(period=2, groups=None), m, graph)
        for loss in (1.0, float("nan") if RANK == SIZE - 1 else 1.0):
            step(tf.constant(loss, tf.float64))

    cases = [
        expect_error("pull_range", lambda: leader(pull=1.5)),
        expect_error("pull_differs", lambda: leader(pull=0.1 if RANK == 0 else 0.2)),
        expect_error("groups_overlap", lambda: leader(groups=[[0, 1], [1]] if SIZE == 2 else [[0, 1], [1, 2, 3]])),
        expect_error("not_keras", lambda: hvd.LeaderOptimizer(object())),
        expect_error("nan_loss", lambda: nan_run(graph=False)),
        expect_error("nan_loss_graph", lambda: nan_run(graph=True)),
    ]
    alive = float(hvd.allreduce(tf.constant([1.0]), name="alive", op=hvd.Sum).numpy()[0])
    return {"cases": cases, "alive": alive}


result = {"rank": RANK}
for graph in (False, True):
    mode = "graph" if graph else "eager"
    result[f"pulls_single_{mode}"] = check_pulls(None, graph)
    result[f"pulls_node_{mode}"] = check_pulls("node", graph)
    result[f"schedule_{mode}"] = check_schedule(graph)
    result[f"easgd_{mode}"] = check_easgd(graph)
    result[f"asynchronous_{mode}"] = check_asynchronous_fallback(graph)
result["independent"] = check_independent_when_no_pull()
result["checkpoint"] = check_checkpoint()
result["bad_inputs"] = bad_inputs()
hvd.allreduce(tf.constant([0.0]), name="end")  # nobody leaves (and shuts Horovod down) before the others finish
write_result(RANK, result)
