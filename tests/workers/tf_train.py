"""The TensorFlow training loop the multi-process workers share: variables of the given sizes, a loss whose
gradients are the given arrays, horovod_ext's DistributedGradientTape, eagerly or in a tf.function."""


def train_tf(hvd, tf, compression, sizes, gradients, steps, graph, record):
    """record(grads) of each step's averaged gradients, and the compression_stats() of the tape's aggregator."""
    variables = [tf.Variable(tf.zeros([n]), name=f"w{i}") for i, n in enumerate(sizes)]

    def step_fn(gs):
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(v * g) for v, g in zip(variables, gs)])
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, variables)
        for v, g in zip(variables, grads):
            v.assign_sub(0.1 * g)
        return grads

    fn = tf.function(step_fn) if graph else step_fn
    seen = [record(fn([tf.constant(g) for g in gradients(step, hvd.rank())])) for step in range(steps)]
    from horovod_ext.tensorflow import gradient_tape
    stats = [a.compression_stats() for a in gradient_tape._aggregators.values()]
    gradient_tape._aggregators.clear()
    return seen, stats
