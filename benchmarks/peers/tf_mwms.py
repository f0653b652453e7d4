#!/usr/bin/env python3
"""The TensorFlow peer of ringtrain's training benchmark: the same MLP (784-512-256-10) or
CNN in Keras, trained with tf.distribute.MultiWorkerMirroredStrategy (gRPC ring collectives)
on the CPU, one process per rank under mpirun, on the same Fashion-MNIST HDF5 file. Used by
benchmarks/peers/run.sh.

    mpirun -n 2 -x TF_PORTS=29600,29601 python benchmarks/peers/tf_mwms.py \
        --model cnn --batch-size 128 --steps 100 --threads 1 [--precision bf16] [--json FILE]

TF_PORTS lists one free local port per rank (the workers' gRPC servers); the rank comes from
Open MPI's environment. The dataset is normalised once ((v/255 - mean) / std, as ringtrain's
loader does) and kept in memory; each step takes this rank's slice of the global batch from
a per-epoch permutation, so the figure is the training step. The step (forward, loss,
backward, the gradients' all-reduce, SGD with momentum) is one tf.function. bf16 is Keras'
mixed_bfloat16 policy (bf16 compute, fp32 variables, the last layer's output in fp32).
Rank 0 prints samples/s (all ranks) as the median over windows of --window steps after
--warmup steps, and with --json writes it with every window's figure.
"""
import argparse
import json
import os
import statistics
import sys
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--data", default=os.path.join(os.path.dirname(__file__),
                                                  "../../build/demo/data/fashion-train.h5"))
    p.add_argument("--batch-size", type=int, default=128, help="samples per rank per step")
    p.add_argument("--steps", type=int, default=200, help="steps in all, warm-up included")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    p.add_argument("--window", type=int, default=20, help="steps per timing window")
    p.add_argument("--threads", type=int, default=1, help="compute threads per rank")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--json", help="write the result as one JSON object (rank 0)")
    a = p.parse_args()
    if a.steps - a.warmup < a.window:
        p.error(f"--steps {a.steps} leaves no full window of {a.window} after --warmup {a.warmup}")
    return a


args = parse()
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
ports = os.environ.get("TF_PORTS", "").split(",")
if len(ports) != world or not all(p.isdigit() for p in ports):
    sys.exit(f"TF_PORTS='{os.environ.get('TF_PORTS', '')}': need {world} comma-separated ports")
# Before TensorFlow loads: the cluster, the thread pools, quiet logs.
os.environ["TF_CONFIG"] = json.dumps({
    "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
    "task": {"type": "worker", "index": rank}})
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(args.threads)

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(args.threads)
tf.config.threading.set_inter_op_parallelism_threads(1)
import keras  # noqa: E402


def make_model(name):
    layers = keras.layers
    if name == "mlp":
        body = [layers.Input((28, 28, 1)), layers.Flatten(), layers.Dense(512, activation="relu"),
                layers.Dense(256, activation="relu")]
    else:
        body = [layers.Input((28, 28, 1)), layers.Conv2D(32, 3, activation="relu"),
                layers.Conv2D(64, 3, activation="relu"), layers.MaxPooling2D(2),
                layers.Dropout(0.25), layers.Flatten(), layers.Dense(128, activation="relu")]
    # The logits in fp32 under mixed_bfloat16, as ringtrain's last layer + loss.
    return keras.Sequential(body + [layers.Dense(10, dtype="float32")])


def load(path):
    with h5py.File(path, "r") as f:
        images, labels = f["images"][()], f["labels"][()]
        mean, std = float(f.attrs.get("mean", 0.0)), float(f.attrs.get("std", 1.0))
    x = ((images.astype(np.float32) / 255.0 - mean) / std).reshape(-1, 28, 28, 1)  # NHWC
    return x, labels.astype(np.int32)


def main():
    if args.precision == "bf16":
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING))
    keras.utils.set_random_seed(args.seed)
    x_all, y_all = load(args.data)
    n, b = x_all.shape[0], args.batch_size
    steps_per_epoch = n // (b * world)
    with strategy.scope():
        model = make_model(args.model)
        opt = keras.optimizers.SGD(learning_rate=args.lr, momentum=args.momentum)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def train_step(x, y):
        def step_fn(x, y):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = tf.nn.compute_average_loss(loss_fn(y, logits), global_batch_size=b * world)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        per_replica = strategy.run(step_fn, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    perm, epoch = None, -1
    times, losses = [], []
    for step in range(args.steps):
        if step % steps_per_epoch == 0:  # the same global permutation on every rank
            epoch += 1
            perm = np.random.default_rng(args.seed + epoch).permutation(n)
        k = step % steps_per_epoch
        idx = perm[(k * world + rank) * b:(k * world + rank + 1) * b]
        loss = train_step(tf.constant(x_all[idx]), tf.constant(y_all[idx]))
        if step + 1 >= args.warmup and (step + 1 - args.warmup) % args.window == 0:
            losses.append(float(loss))  # waits for the step, so the time is the step's
            times.append(time.perf_counter())

    rates = [args.window * b * world / (t1 - t0) for t0, t1 in zip(times, times[1:])]
    if rank == 0:
        result = dict(framework="tensorflow-mwms", tf_version=tf.__version__,
                      keras_version=keras.__version__, model=args.model, ranks=world,
                      batch_per_rank=b, threads=args.threads, precision=args.precision,
                      steps=args.steps, warmup=args.warmup, window=args.window,
                      samples_per_sec=statistics.median(rates), window_samples_per_sec=rates,
                      loss=losses[-1])
        print(f"tensorflow-mwms {args.model} {world} rank(s) {args.precision}: "
              f"{result['samples_per_sec']:.1f} samples/s (median of {len(rates)} windows of "
              f"{args.window} steps), loss {losses[-1]:.4f}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f)
                f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
