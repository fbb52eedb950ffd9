"""The MirroredStrategy runs of test_learning_rates.py, in a process of their own.

TensorFlow fixes its devices when it first starts, so the CPU is split into
two logical devices here (as distributed_runs.py does):

    python tests/helpers/learning_rate_runs.py OUT_DIR

Each run trains variables under `scaled_learning_rates` on both replicas (each
replica gets half of every gradient; the optimizer sums them) and the same
variables on one device with separate optimizers at learning rate x m, and
saves to `OUT_DIR/<run>.npz` every replica's value (`replica<k>/<name>`) and
the reference (`reference/<name>`).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from maskfit import distribute  # noqa: E402
from maskfit.optim.rates import scaled_learning_rates  # noqa: E402

STEPS = 20
COLUMNS = [[0.1, 0.5, 3.0, 1.0]]
RNG = np.random.default_rng(0)
INIT = RNG.normal(size=(3, 4)).astype("float32")
# Per step and replica; the references get their sum.
GRADS = RNG.normal(size=(STEPS, 2, 3, 4)).astype("float32")


def schedule(m):
    return keras.optimizers.schedules.ExponentialDecay(0.05 * m, 4, 0.8)


def adamw(m=1.0):
    return keras.optimizers.AdamW(schedule(m), weight_decay=0.1)


def loss_scaled_sgd(m=1.0):
    sgd = keras.optimizers.SGD(
        schedule(m), momentum=0.9, nesterov=True, weight_decay=0.1
    )
    return keras.optimizers.LossScaleOptimizer(sgd)


# name: (optimizer factory, run eagerly, steps); eager replicas are slow (a
# thread switch per op), and only the hooks' thread handling differs there.
RUNS = {
    "adamw": (adamw, False, STEPS),
    "adamw_eager": (adamw, True, 5),
    "loss_scaled_sgd": (loss_scaled_sgd, False, STEPS),
}


def scaled_run(strategy, factory, eager, steps):
    """Trains `scaled` (m = 0.5), `columns` (m per column, read from a mirrored
    variable inside the update) and `free` (no multiplier) on every replica."""
    with strategy.scope():
        variables = {
            n: keras.Variable(INIT, name=n) for n in ("scaled", "columns", "free")
        }
        columns = tf.Variable(COLUMNS, trainable=False)
        optimizer = factory()
        optimizer.build(list(variables.values()))
    pairs = [(variables["scaled"], 0.5), (variables["columns"], lambda: columns)]

    def replica_step(grad):
        scale = getattr(optimizer, "dynamic_scale", 1.0)  # as scale_loss would
        with scaled_learning_rates(optimizer, pairs):
            optimizer.apply([grad * scale] * 3, list(variables.values()))

    def step(grad):
        strategy.run(replica_step, args=(grad,))

    if not eager:
        step = tf.function(step)
    for i in range(steps):
        step(
            strategy.experimental_distribute_values_from_function(
                lambda context, i=i: tf.constant(
                    GRADS[i, context.replica_id_in_sync_group]
                )
            )
        )
    return {
        f"replica{k}/{name}": value.numpy()
        for name, variable in variables.items()
        for k, value in enumerate(strategy.experimental_local_results(variable.value))
    }


def reference_run(factory, steps):
    """One device, one optimizer per multiplier."""
    found = {}
    for m in (0.1, 0.5, 3.0, 1.0):
        variable = keras.Variable(INIT)
        optimizer = factory(m)
        optimizer.build([variable])
        for i in range(steps):
            scale = getattr(optimizer, "dynamic_scale", 1.0)
            optimizer.apply([tf.constant(GRADS[i].sum(0)) * scale], [variable])
        found[m] = variable.numpy()
    columns = np.stack([found[m][:, j] for j, m in enumerate(COLUMNS[0])], axis=1)
    return {
        "reference/scaled": found[0.5],
        "reference/columns": columns,
        "reference/free": found[1.0],
    }


def main(out_dir):
    strategy = distribute.make_strategy("mirrored", logical_devices=2)
    assert strategy.num_replicas_in_sync == 2
    for name, (factory, eager, steps) in RUNS.items():
        result = scaled_run(strategy, factory, eager, steps)
        result.update(reference_run(factory, steps))
        np.savez(os.path.join(out_dir, f"{name}.npz"), **result)
        print(name, "done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
