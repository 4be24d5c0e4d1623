"""TensorFlow benchmark: the native TernGrad ops against the same math written in TF ops (one thread), and the
bytes per step of dense, fp16 and ternary for a Keras 3 model of about 10.5M parameters."""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from common import OUT_DIR, bar_plot, best_of, machine, markdown_table, write_outputs  # noqa: E402
from horovod_ext.tensorflow.kernels import lib, seed_tensor  # noqa: E402

POW3 = tf.constant([1, 3, 9, 27, 81], dtype=tf.int32)
TRITS = tf.constant([[((b // 3 ** j) % 3) for j in range(5)] for b in range(256)], dtype=tf.int32)
VALUES = tf.constant([0.0, 1.0, -1.0])


@tf.function
def tf_ops_encode(g):
    """TernGrad with base-3 packing in TF ops (what a user would write without the native op)."""
    g64 = tf.cast(g, tf.float64)
    sigma = tf.math.reduce_std(g64)
    threshold = tf.cast(2.5 * sigma, tf.float32)
    gc = tf.clip_by_value(g, -threshold, threshold)
    scale = tf.reduce_max(tf.abs(gc))
    keep = tf.random.uniform(tf.shape(g)) < tf.abs(gc) / scale
    codes = tf.cast(keep & (g > 0), tf.int32) + 2 * tf.cast(keep & (g < 0), tf.int32)
    pad = (-tf.size(codes)) % 5
    codes = tf.reshape(tf.pad(codes, [[0, pad]]), [-1, 5])
    return scale, tf.cast(tf.reduce_sum(codes * POW3, axis=1), tf.uint8)


@tf.function
def tf_ops_decode(scales, packed, n):
    acc = tf.zeros([n])
    for i in range(2):
        acc += scales[i] * tf.gather(VALUES, tf.reshape(tf.gather(TRITS, tf.cast(packed[i], tf.int32)), [-1])[:n])
    return acc / 2.0


@tf.function
def native_encode(g):
    threshold, scale = lib.hvdext_ternary_local_scale(g, clip=2.5)
    return lib.hvdext_ternary_encode(g, threshold, scale, seed_tensor(1), tf.constant(0, tf.int64), tensor_key=0,
                                     rank=0, packing=1)


def kernel_rows(sizes):
    rows = []
    for n in sizes:
        g = tf.constant(np.random.default_rng(0).standard_normal(n).astype(np.float32))
        payload = native_encode(g)
        gathered = tf.concat([payload, payload], 0)
        scale, packed = tf_ops_encode(g)
        row = {"elements": n,
               "native_encode_s": best_of(lambda: native_encode(g).numpy()),
               "tf_ops_encode_s": best_of(lambda: tf_ops_encode(g)[1].numpy()),
               "native_decode_s": best_of(lambda: lib.hvdext_ternary_decode_average(
                   gathered, nranks=2, count=n, packing=1, divisor=2.0)[0].numpy()),
               "tf_ops_decode_s": best_of(lambda: tf_ops_decode(tf.stack([scale, scale]), tf.stack([packed, packed]),
                                                                n).numpy())}
        rows.append(row)
    return rows


def bytes_rows(params_m):
    import horovod_ext.tensorflow as hvd

    hvd.init()
    width = round((params_m * 1e6 / 8.5) ** 0.5)
    model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(4 * width, activation="relu"),
                              keras.layers.Dense(width, activation="relu"),
                              keras.layers.Dense(width // 2, activation="relu"), keras.layers.Dense(10)])
    x = np.random.default_rng(0).standard_normal((8, width)).astype(np.float32)
    rows = []
    for name, comp in (("none", hvd.Compression.none), ("fp16", hvd.Compression.fp16),
                       ("ternary", hvd.Compression.ternary)):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x)))
        tape = hvd.DistributedGradientTape(tape, compression=comp)
        tape.gradient(loss, model.trainable_variables)
        last = tape.compression_stats()["last_step"]
        rows.append({"compression": name, "parameters": model.count_params(), "payload_bytes": last["payload_bytes"],
                     "dense_bytes": last["dense_bytes"], "bits_per_element": last["bits_per_element"]})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1M elements and a 1M-parameter model")
    args = parser.parse_args()
    sizes = [2 ** 20] if args.quick else [2 ** 20, 2 ** 22, 2 ** 24]
    krows = kernel_rows(sizes)
    brows = bytes_rows(1.0 if args.quick else 10.5)
    ktable = [[f"{r['elements'] / 1e6:g}M", f"{r['elements'] * 4e-9 / r['native_encode_s']:.2f}",
               f"{r['tf_ops_encode_s'] / r['native_encode_s']:.1f}x",
               f"{r['elements'] * 4e-9 / r['native_decode_s']:.2f}",
               f"{r['tf_ops_decode_s'] / r['native_decode_s']:.1f}x"] for r in krows]
    btable = [[r["compression"], f"{r['parameters'] / 1e6:.1f}M", f"{r['payload_bytes'] / 1e6:.2f}",
               f"{r['dense_bytes'] / r['payload_bytes']:.1f}x", f"{r['bits_per_element']:.2f}"] for r in brows]
    md = ("TensorFlow ternary ops (tf.function, one thread), base-3, 2.5-sigma clip; decode averages 2 payloads.\n\n"
          + markdown_table(["elements", "native encode GB/s", "vs TF ops", "native decode GB/s", "vs TF ops"], ktable)
          + "\n\nBytes per step, Keras 3 MLP (min_size 1024: smaller tensors dense):\n\n"
          + markdown_table(["compression", "parameters", "MB sent / step", "vs dense", "bits/element"], btable))
    bar_plot(os.path.join(OUT_DIR, "tf_kernels_speedup.png"), "TF native ops: speed-up over the same math in TF ops",
             {f"{r['elements'] / 1e6:g}M": {"encode": r["tf_ops_encode_s"] / r["native_encode_s"],
                                           "decode": r["tf_ops_decode_s"] / r["native_decode_s"]} for r in krows},
             "TF-ops seconds / native seconds")
    md += "\n\n![speed-ups](tf_kernels_speedup.png)"
    path = write_outputs("tf_kernels", {"machine": machine(), "kernels": krows, "bytes": brows}, md)
    print(md)
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
