"""A plain Horovod TensorFlow custom-loop script, as a user would have it: no horovod_ext anywhere. Its model is
made of tf.Variables, so it also runs under Horovod's own DistributedGradientTape. tests/test_launcher.py runs it
unmodified under `python -m horovod_ext.run`."""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf  # noqa: E402

import horovod.tensorflow as hvd  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
args = parser.parse_args()

hvd.init()
tf.random.set_seed(0)
sizes = [64, 512, 256, 10]
weights = [tf.Variable(tf.random.normal([a, b], stddev=a ** -0.5), name=f"w{i}") for i, (a, b) in
           enumerate(zip(sizes, sizes[1:]))]
biases = [tf.Variable(tf.zeros([b]), name=f"b{i}") for i, b in enumerate(sizes[1:])]
variables = weights + biases
optimizer = tf.keras.optimizers.SGD(0.01 * hvd.size(), momentum=0.9)


def forward(x):
    for i, (w, b) in enumerate(zip(weights, biases)):
        x = tf.matmul(x, w) + b
        x = tf.nn.relu(x) if i < len(weights) - 1 else x
    return x


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=forward(x)))
    tape = hvd.DistributedGradientTape(tape, compression=hvd.Compression.none)
    grads = tape.gradient(loss, variables)
    optimizer.apply_gradients(zip(grads, variables))
    return loss


hvd.broadcast_variables(variables, root_rank=0)
gen = tf.random.Generator.from_seed(hvd.rank())
for step in range(args.steps):
    x = gen.normal([32, 64])
    loss = train_step(x, tf.argmax(x[:, :10], axis=1, output_type=tf.int32))
if hvd.rank() == 0:
    print(f"plain_tf: final loss {float(loss):.4f}")
