r"""Times the seeds' own code against the experiments that reproduce them, in one process.

- learnable_scale (seeds/000): the seed's layer and custom gradient (made to run on
  Keras 3) trained with stock `fit` defaults, against `experiments.learnable_scale`
  with its defaults: the same 31250 SGD steps on the same batches.
- masked_outputs (seeds/002): the seed applies a hand-made gradient eagerly and calls
  `model.predict` after every step (manual part), and trains with an eager
  `GradientTape` loop (fit part). Our runs do the same steps compiled, and are
  reported twice: end to end (tracing included) and per step once compiled (the
  steps after the first call). Each of ours runs `--repeats` times and the best is
  kept (the first run of a process also pays TF's start-up).

  python -m benchmarks.seed_scenarios [--scenarios=learnable_scale,masked_outputs]
"""

import tempfile
import time

from absl import app
from absl import flags
import keras
import numpy as np
import tensorflow as tf

from experiments import learnable_scale_lib
from experiments.masked_outputs_lib import Config
from experiments.masked_outputs_lib import run

_SCENARIOS = flags.DEFINE_list(
    "scenarios", ["learnable_scale", "masked_outputs"], "Which seeds to time."
)
_SAMPLES = flags.DEFINE_integer(
    "samples", 100_000, "learnable_scale: samples per epoch (the seed's 100000)."
)
_STEPS = flags.DEFINE_integer("steps", 100, "masked_outputs: steps of each loop.")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Runs of each of ours; best kept.")


@tf.custom_gradient
def _seed_scaler(x, s):
    """The seed's custom gradient, with its fix: dy/ds summed over the batch."""

    def grad(upstream):
        return s * upstream, tf.reduce_sum(x * upstream, axis=0)

    return x * s, grad


class _SeedLayer(keras.layers.Layer):
    """The seed's TestLayer; Keras 3 needs `name=` as a keyword."""

    def build(self, input_shape):
        self.scale = self.add_weight(
            name="scale", shape=[1], initializer=keras.initializers.Constant(2.0)
        )

    def call(self, inputs):
        return _seed_scaler(inputs, tf.convert_to_tensor(self.scale))


def seed_learnable_scale(samples=100_000):
    """The seed's program: stock `fit` defaults on `samples` samples, batch 32."""
    inputs = keras.Input((1,))
    layer = _SeedLayer()
    model = keras.Model(inputs, layer(inputs))
    model.compile(loss="mse", optimizer=keras.optimizers.SGD(learning_rate=0.001))
    x = tf.ones((samples, 1)) * 2
    y = tf.ones((samples, 1)) * 5
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    start = time.perf_counter()
    model.fit(dataset, epochs=10, verbose=0)
    return time.perf_counter() - start, float(layer.scale.numpy()[0])


def ours_learnable_scale(repeats, samples=100_000):
    """Best `fit` seconds of `experiments.learnable_scale` with its defaults."""
    config = learnable_scale_lib.Config(samples=samples)
    runs = [learnable_scale_lib.run(config, tempfile.mkdtemp()) for _ in range(repeats)]
    best = min(runs, key=lambda m: m["wall_seconds"])
    return best["wall_seconds"], best["scale"]


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
    scenarios = set(_SCENARIOS.value)
    unknown = scenarios - {"learnable_scale", "masked_outputs"}
    if unknown:
        raise app.UsageError(
            f"Unknown --scenarios {sorted(unknown)}; known: learnable_scale,"
            " masked_outputs."
        )
    steps, repeats = _STEPS.value, _REPEATS.value
    if "learnable_scale" in scenarios:
        mine, mine_scale = ours_learnable_scale(repeats, _SAMPLES.value)
        seed, seed_scale = seed_learnable_scale(_SAMPLES.value)
        print(
            f"learnable_scale  seed (stock fit defaults) {seed:6.2f}s scale"
            f" {seed_scale:.6f}  ours (defaults) {mine:6.2f}s scale"
            f" {mine_scale:.6f}  ({seed / mine:4.1f}x)"
        )
    if "masked_outputs" in scenarios:
        seed_manual(2), seed_tape(2)  # Warm up eager kernels for a fair baseline.
        rows = [
            ("manual", seed_manual(steps), *ours("manual", steps, repeats)),
            ("fit", seed_tape(steps), *ours("fit", steps, repeats)),
        ]
        print(
            f"masked_outputs, {steps} steps. 'ours' includes tracing; 'compiled'"
            " is per step after the first call (steady state)."
        )
        for mode, seed, mine, per_step in rows:
            print(
                f"{mode:7s} seed {seed:6.3f}s  ours {mine:6.3f}s"
                f" ({seed / mine:5.1f}x)  per step: seed"
                f" {seed / steps * 1e3:7.3f}ms compiled {per_step * 1e3:7.3f}ms"
                f" ({seed / steps / per_step:6.1f}x)"
            )


if __name__ == "__main__":
    app.run(main)
