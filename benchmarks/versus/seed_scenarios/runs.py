"""The seeds' own programs and the experiments that reproduce them, timed.

Library of `benchmarks.seed_scenarios` (which only holds its flags and `main`).
"""

import tempfile
import time

import keras
import numpy as np
import tensorflow as tf

from experiments import learnable_scale
from experiments.masked_outputs import Config, run


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
    config = learnable_scale.Config(samples=samples)
    runs = [learnable_scale.run(config, tempfile.mkdtemp()) for _ in range(repeats)]
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
