"""The seed's scale experiment as a library: `Config` and `run(config, workdir)`.

Learns y = scale * x with `maskfit.layers.Scale`. The data is `samples`
copies of x = 2 with target y = 5, so `scale` should go from 2.0 to 2.5 under
MSE and SGD. The run writes, under its workdir, `config.json`, `metrics.json`
and TensorBoard events with the loss and the scale per epoch.
"""

import dataclasses
import math
import os
import time

import keras
import tensorflow as tf
from absl import logging

import maskfit
from experiments import common

__all__ = ["Config", "run"]


@dataclasses.dataclass(frozen=True)
class Config:
    """One run of the experiment; the defaults reproduce the seed.

    `steps_per_execution` and `jit_compile` change only how the steps are
    run, not which: the batches, the SGD updates and their number are the
    seed's. 125 divides the 3125 steps of an epoch, and together with XLA it
    makes the default run about 7x faster than `fit`'s own defaults.

    `strategy` (a `maskfit.distribute.STRATEGIES` name) says where to train
    and `precision` (a `maskfit.distribute.PRECISIONS` name) in which dtype
    policy. Any strategy but 'default' needs `steps_per_execution=1` and
    `jit_compile=False`, which Keras needs under tf.distribute on CPUs.

    Attributes:
      samples: Number of (x, y) examples.
      x_value: Value of every input x.
      target: Value of every target y.
      batch_size: Examples per step.
      learning_rate: Learning rate.
      epochs: Passes over the data.
      initial_scale: Scale's start.
      optimizer: A keras.optimizers name, in any case (`common.OPTIMIZERS`).
      seed: Random seed.
      steps_per_execution: Steps per compiled call; 1 is fit's default. Same updates
        either way.
      jit_compile: Compile the step with XLA.
      strategy: Where to train: 'default' (one device), 'mirrored' (all devices of this
        machine) or 'multi_worker' (several machines, from TF_CONFIG).
      precision: Keras dtype policy to train in (`maskfit.distribute.PRECISIONS`).
    """

    samples: int = 100_000
    x_value: float = 2.0
    target: float = 5.0
    batch_size: int = 32
    learning_rate: float = 0.001
    epochs: int = 10
    initial_scale: float = 2.0
    optimizer: str = "sgd"
    seed: int = 0
    steps_per_execution: int = 125
    jit_compile: bool = True
    strategy: str = "default"
    precision: str = "float32"

    def __post_init__(self):
        for name in ("samples", "batch_size", "epochs", "steps_per_execution"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"Received an invalid value for `{name}`, expected a "
                    f"positive integer. Received: {name}={value!r}"
                )
        if not (
            isinstance(self.learning_rate, (int, float))
            and math.isfinite(self.learning_rate)
            and self.learning_rate > 0
        ):
            raise ValueError(
                "Received an invalid value for `learning_rate`, expected a "
                f"positive number. Received: learning_rate={self.learning_rate!r}"
            )
        for name in ("x_value", "target", "initial_scale"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value)):
                raise ValueError(
                    f"Received an invalid value for `{name}`, expected a "
                    f"finite number. Received: {name}={value!r}"
                )
        common.check_optimizer(self.optimizer)
        if (
            isinstance(self.seed, bool)
            or not isinstance(self.seed, int)
            or self.seed < 0
        ):
            raise ValueError(
                "Received an invalid value for `seed`, expected a non-negative "
                f"integer. Received: seed={self.seed!r}"
            )
        common.check_scale(
            self.strategy, self.precision, self.steps_per_execution, self.jit_compile
        )


class _EpochSummary(keras.callbacks.Callback):
    """Logs and writes to TensorBoard the loss and the scale after each epoch."""

    def __init__(self, scale, writer):
        super().__init__()
        self._scale = scale
        self._writer = writer
        self.scales = []

    def on_epoch_end(self, epoch, logs=None):
        loss = float(logs["loss"])
        scale = float(self._scale.numpy().reshape(-1)[0])
        self.scales.append(scale)
        logging.info("epoch %d loss %.6g scale %.6f", epoch + 1, loss, scale)
        common.write_scalars(self._writer, epoch + 1, {"loss": loss, "scale": scale})


def _dataset(config):
    """The seed's data: `samples` rows of x_value and target, in batches."""
    x = tf.fill((config.samples, 1), tf.constant(config.x_value, tf.float32))
    y = tf.fill((config.samples, 1), tf.constant(config.target, tf.float32))
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(config.batch_size)
    return dataset.prefetch(tf.data.AUTOTUNE)


def run(config, workdir):
    """Trains the seed's model under `config`, writing everything in `workdir`.

    Args:
      config: A `Config`.
      workdir: Directory for `config.json`, `metrics.json` and the
        TensorBoard events; created if missing. Under 'multi_worker' only the
        chief writes there.

    Returns:
      The metrics dict also written to `metrics.json`: the final `scale` and
      `loss`, the per-epoch `losses` and `scales`, the number of optimizer
      `steps`, and `wall_seconds`, the time `fit` took (tracing and XLA
      compilation included).
    """
    with common.experiment_run(config, workdir) as (strategy, chief):
        keras.utils.set_random_seed(config.seed)

        with strategy.scope():
            inputs = keras.Input((1,))
            layer = maskfit.layers.Scale(
                shape=(1,),
                initializer=keras.initializers.Constant(config.initial_scale),
            )
            model = maskfit.MaskedModel(inputs, layer(inputs))
            optimizer = common.make_optimizer(config.optimizer, config.learning_rate)
            model.compile(
                optimizer=optimizer,
                loss="mse",
                steps_per_execution=config.steps_per_execution,
                jit_compile=config.jit_compile,
            )

        if chief:
            writer = tf.summary.create_file_writer(workdir)
        else:
            writer = tf.summary.create_noop_writer()
        summary = _EpochSummary(layer.scale, writer)
        try:
            start = time.perf_counter()
            history = model.fit(
                _dataset(config),
                epochs=config.epochs,
                callbacks=[summary],
                shuffle=False,
                verbose=0,
            )
            wall_seconds = time.perf_counter() - start
        finally:
            writer.close()

    losses = [float(v) for v in history.history["loss"]]
    metrics = {
        "scale": summary.scales[-1],
        "loss": losses[-1],
        "losses": losses,
        "scales": summary.scales,
        "steps": int(optimizer.iterations.numpy()),
        "wall_seconds": wall_seconds,
    }
    if chief:
        common.write_json(os.path.join(workdir, "metrics.json"), metrics)
    logging.info(
        "scale %.6f loss %.6g after %d steps in %.2f s",
        metrics["scale"],
        metrics["loss"],
        metrics["steps"],
        wall_seconds,
    )
    return metrics
