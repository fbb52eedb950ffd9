r"""Times the seed's eager loops against `experiments.masked_outputs`, in one process.

The seed (seeds/002) applies a hand-made gradient eagerly and calls
`model.predict` after every step (manual part), and trains with an eager
`GradientTape` loop (fit part). Our runs do the same steps compiled. The times
of our runs are reported twice: end to end (tracing included) and per step
once compiled (the steps after the first call). Each is run `--repeats` times
and the best is kept (the first run of a process also pays TF's start-up).

  python -m benchmarks.masked_outputs_vs_seed
"""

import tempfile
import time

from absl import app
from absl import flags
import keras
import numpy as np
import tensorflow as tf

from experiments.masked_outputs_lib import Config
from experiments.masked_outputs_lib import run

_STEPS = flags.DEFINE_integer("steps", 100, "Steps of each loop.")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Runs of each of ours; best kept.")


def _seed_model():
    inputs = keras.Input((1,))
    x = keras.layers.Dense(16)(inputs)
    x = keras.layers.Activation("relu")(x)
    x = keras.layers.Dense(2)(x)
    model = keras.Model(inputs, keras.layers.Activation("linear")(x))
    model.compile(optimizer=keras.optimizers.Nadam(learning_rate=0.005))
    return model


def seed_manual(steps):
    """The seed's first part: eager apply_gradients, then predict, per step."""
    model = _seed_model()
    variables = model.trainable_variables
    start = time.perf_counter()
    for _ in range(steps):
        grads = [
            tf.zeros_like(variables[0]),
            tf.zeros_like(variables[1]),
            tf.concat([tf.fill((16, 1), -0.3), tf.zeros((16, 1))], axis=-1),
            tf.constant([-0.3, 0.0]),
        ]
        model.optimizer.apply_gradients(zip(grads, variables))
        model.predict(np.array([1]), verbose=0)
    return time.perf_counter() - start


def seed_tape(steps):
    """The seed's second part: an eager GradientTape loop with masked grads."""
    model = _seed_model()
    variables = model.trainable_variables
    x, y = np.array([1.0]), np.array([[4.0, 6.0]])
    start = time.perf_counter()
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = keras.losses.MeanSquaredError()(y, model(x, training=True))
        grads = tape.gradient(loss, variables)
        grads[2] = tf.concat([grads[2][:, :1], tf.zeros_like(grads[2][:, 1:])], -1)
        grads[3] = tf.concat([grads[3][:1], tf.zeros_like(grads[3][1:])], -1)
        model.optimizer.apply_gradients(zip(grads, variables))
    return time.perf_counter() - start


def ours(mode, steps, repeats):
    """Best end-to-end seconds, and best seconds per step once compiled."""
    config = Config(mode=mode, steps=steps)
    runs = [run(config, tempfile.mkdtemp()) for _ in range(repeats)]
    per_step = min(m["other_steps_seconds"] for m in runs) / max(steps - 1, 1)
    return min(m["train_seconds"] for m in runs), per_step


def main(argv):
    del argv
    steps, repeats = _STEPS.value, _REPEATS.value
    seed_manual(2), seed_tape(2)  # Warm up eager kernels for a fair baseline.
    rows = [
        ("manual", seed_manual(steps), *ours("manual", steps, repeats)),
        ("fit", seed_tape(steps), *ours("fit", steps, repeats)),
    ]
    print(
        f"{steps} steps. 'ours' includes tracing; 'compiled' is per step after"
        " the first call (steady state)."
    )
    for mode, seed, mine, per_step in rows:
        print(
            f"{mode:7s} seed {seed:6.3f}s  ours {mine:6.3f}s ({seed / mine:5.1f}x)"
            f"  per step: seed {seed / steps * 1e3:7.3f}ms compiled"
            f" {per_step * 1e3:7.3f}ms ({seed / steps / per_step:6.1f}x)"
        )


if __name__ == "__main__":
    app.run(main)
