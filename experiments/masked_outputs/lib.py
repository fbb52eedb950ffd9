"""The seed's two-output experiment as a library: `Config` and `run(config, workdir)`.

A model Input(1) -> Dense(16) -> relu -> Dense(2) -> linear, whose last Dense
carries an `OutputMask` that freezes some outputs. Two modes:

- `manual`: a constant gradient applied with `maskfit.apply_gradients` for
  `steps` steps, in one compiled loop; only the last Dense gets a gradient.
- `fit`: `MaskedModel.fit` towards `targets` for input 1, compiled as one
  execution of `steps` steps (or `steps_per_execution` at a time).

The prediction for input 1 is recorded after every step, inside the compiled
code. Everything is written under `workdir`.

`strategy` and `precision` name a `tf.distribute` strategy and a Keras dtype
policy (see `maskfit.distribute`). Under any strategy but 'default', `fit`
needs `steps_per_execution=1` and both modes need `jit_compile=False`; in
`manual` each step runs with `strategy.run` inside the compiled loop.
"""

import dataclasses
import os
import time
from typing import Optional

import keras
import numpy as np
import tensorflow as tf

import maskfit
from experiments import common
from maskfit.apply import apply_gradients

__all__ = ["Config", "run"]

MODES = ("manual", "fit")
OUTPUTS = 2


@dataclasses.dataclass(frozen=True)
class Config:
    """Settings of one run; `validate` says what is wrong with them.

    Attributes:
      mode: manual: constant gradient via apply_gradients; fit: MaskedModel.fit towards
        --targets.
      steps: Training steps.
      optimizer: A keras.optimizers name.
      learning_rate: Learning rate.
      constant_gradient: manual: the gradient of every learning entry.
      targets: fit: one target per output.
      masked_outputs: Indices of frozen outputs.
      backprop: Also block the frozen outputs' gradient upstream.
      seed: Random seed of the initial weights.
      jit_compile: Also compile with XLA (recompiles per loop length; slower on CPU).
      steps_per_execution: fit: steps per compiled call (default: all); must be 1 under
        a strategy.
      strategy: Where to train: 'default' (one device), 'mirrored' (all devices of this
        machine) or 'multi_worker' (several machines, from TF_CONFIG).
      precision: Keras dtype policy to train in (`maskfit.distribute.PRECISIONS`).
    """

    mode: str = "manual"
    steps: int = 100
    optimizer: str = "nadam"
    learning_rate: float = 0.005
    constant_gradient: float = -0.3
    targets: tuple = (4.0, 6.0)
    masked_outputs: tuple = (1,)
    backprop: bool = False
    seed: int = 0
    jit_compile: bool = False
    steps_per_execution: Optional[int] = (
        None  # fit: steps per compiled call; None: all.
    )
    strategy: str = "default"
    precision: str = "float32"

    def validate(self):
        """Raises ValueError naming the first invalid setting."""
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}. Received: {self.mode!r}")
        if not isinstance(self.steps, int) or self.steps <= 0:
            raise ValueError(
                f"steps must be a positive integer. Received: {self.steps}"
            )
        if not self.learning_rate > 0:
            raise ValueError(
                f"learning_rate must be positive. Received: {self.learning_rate}"
            )
        common.check_optimizer(self.optimizer)
        if len(self.targets) != OUTPUTS:
            raise ValueError(
                f"targets must have {OUTPUTS} values, one per output. Received:"
                f" {list(self.targets)}"
            )
        outputs = list(self.masked_outputs)
        if len(set(outputs)) != len(outputs) or not set(outputs) <= set(range(OUTPUTS)):
            raise ValueError(
                f"masked_outputs must be distinct output indices in"
                f" {list(range(OUTPUTS))}. Received: {outputs}"
            )
        per_call = self.steps_per_execution
        if per_call is not None and (
            isinstance(per_call, bool) or not isinstance(per_call, int) or per_call < 1
        ):
            raise ValueError(
                "steps_per_execution must be a positive integer or None."
                f" Received: {per_call!r}"
            )
        # The manual loop runs its steps with strategy.run in any strategy.
        if self.mode == "manual":
            per_call = 1
        common.check_scale(
            self.strategy, self.precision, per_call or self.steps, self.jit_compile
        )


def _make_model(config):
    keras.utils.set_random_seed(config.seed)
    values = [0 if k in config.masked_outputs else 1 for k in range(OUTPUTS)]
    head = keras.layers.Dense(OUTPUTS, name="head")
    maskfit.set_mask(head, maskfit.OutputMask(values, backprop=config.backprop))
    inputs = keras.Input((1,))
    x = keras.layers.Dense(16, name="hidden")(inputs)
    x = keras.layers.Activation("relu")(x)
    outputs = keras.layers.Activation("linear")(head(x))
    return maskfit.MaskedModel(inputs, outputs), head


def _timed_chunks(run_steps, steps):
    """Runs 1 step (paying tracing and compilation), then the rest; times both."""
    start = time.perf_counter()
    run_steps(0, 1)
    first = time.perf_counter()
    if steps > 1:
        run_steps(1, steps - 1)
    return {
        "first_step_seconds": first - start,
        "other_steps_seconds": time.perf_counter() - first,
    }


def _train_manual(model, head, optimizer, config, strategy):
    """Applies the constant gradient `steps` times; returns predictions per step."""
    with strategy.scope():
        optimizer.build(model.trainable_variables)
    grads = {
        v.path: tf.fill(v.shape, tf.constant(config.constant_gradient, v.dtype))
        for v in head.trainable_variables
    }
    x = tf.ones((1, 1))
    trace = tf.Variable(tf.zeros((config.steps, OUTPUTS)), trainable=False)

    def apply():
        apply_gradients(optimizer, grads)

    @tf.function(jit_compile=config.jit_compile)
    def loop(offset, count):
        for step in tf.range(offset, offset + count):
            strategy.run(apply)
            trace.scatter_nd_update([[step]], tf.cast(model(x)[:1], trace.dtype))

    times = _timed_chunks(
        lambda i, n: loop(tf.constant(i), tf.constant(n)), config.steps
    )
    return trace.numpy(), times


class _PredictionTrace(keras.metrics.Metric):
    """Records `y_pred[0]` at every step, inside the compiled training loop.

    It keeps its record across `fit` calls (`reset_state` does nothing), so one
    trace covers a run split into several calls.
    """

    def __init__(self, steps, name="prediction_trace"):
        super().__init__(name=name)
        # Every replica sees the same rows; read the first one's record
        # rather than the sum over replicas.
        self.trace = self.add_variable(
            (steps, OUTPUTS), "zeros", aggregation="only_first_replica", name="trace"
        )
        self.count = self.add_variable(
            (), "zeros", dtype="int32", aggregation="only_first_replica", name="count"
        )

    def update_state(self, y_true, y_pred, sample_weight=None):
        row = tf.cast(y_pred[:1], self.trace.dtype)
        index = tf.reshape(self.count, (1, 1))
        trace = tf.convert_to_tensor(self.trace)
        self.trace.assign(tf.tensor_scatter_nd_update(trace, index, row))
        self.count.assign_add(1)

    def reset_state(self):
        pass

    def result(self):
        return self.count


def _train_fit(model, head, optimizer, config, strategy):
    """Runs `MaskedModel.fit`, compiled; returns predictions after each step.

    Each step's batch holds one copy of the example per replica, so every
    replica gets one: the mean loss and its gradient are those of one example.
    """
    with strategy.scope():
        recorder = _PredictionTrace(config.steps)
        model.compile(
            optimizer=optimizer,
            loss="mse",
            metrics=[recorder],
            steps_per_execution=config.steps_per_execution or config.steps,
            jit_compile=config.jit_compile,
        )
    batch = strategy.num_replicas_in_sync
    x = np.ones((config.steps * batch, 1), np.float32)
    y = np.tile(np.asarray(config.targets, np.float32), (config.steps * batch, 1))

    def run_steps(offset, count):
        rows = slice(offset * batch, (offset + count) * batch)
        model.fit(x[rows], y[rows], batch_size=batch, shuffle=False, verbose=0)

    times = _timed_chunks(run_steps, config.steps)
    # The trace holds the prediction before each step; shift it to "after".
    final = model(np.ones((1, 1), np.float32)).numpy()
    return np.concatenate([recorder.trace.numpy()[1:], final], axis=0), times


def _masked_entries(head, config):
    kernel = head.kernel.numpy()[:, list(config.masked_outputs)]
    bias = head.bias.numpy()[list(config.masked_outputs)]
    return np.concatenate([kernel.ravel(), bias.ravel()])


def _write_events(workdir, trajectory):
    """Writes the prediction of each output after each step as TensorBoard scalars."""
    writer = tf.summary.create_file_writer(os.path.join(workdir, "tensorboard"))
    for step, row in enumerate(trajectory, start=1):
        scalars = {f"prediction/output_{k}": float(v) for k, v in enumerate(row)}
        common.write_scalars(writer, step, scalars)
    writer.close()


def run(config, workdir):
    """Runs the experiment; writes config, metrics and events under `workdir`.

    Args:
      config: a `Config`.
      workdir: the folder to write into (created if missing); under
        'multi_worker' only the chief writes.

    Returns:
      The metrics dict also written to `metrics.json`.

    Example:

    >>> import tempfile
    >>> metrics = run(Config(steps=3), tempfile.mkdtemp())
    >>> metrics["masked_max_abs_change"]
    0.0
    """
    config.validate()
    start = time.perf_counter()
    with common.experiment_run(config, workdir) as (strategy, chief):
        with strategy.scope():
            model, head = _make_model(config)
            optimizer = common.make_optimizer(config.optimizer, config.learning_rate)
        x = np.ones((1, 1), np.float32)
        initial = model(x).numpy()[0]
        masked_before = _masked_entries(head, config)
        train = _train_manual if config.mode == "manual" else _train_fit
        trajectory, times = train(model, head, optimizer, config, strategy)
        final = model(x).numpy()[0]
        change = np.abs(_masked_entries(head, config) - masked_before)

    metrics = {
        "mode": config.mode,
        "initial_prediction": initial.tolist(),
        "final_prediction": final.tolist(),
        "prediction_change": (final - initial).tolist(),
        "trajectory": trajectory.tolist(),
        "masked_max_abs_change": float(change.max()) if change.size else 0.0,
        "train_seconds": sum(times.values()),
        **times,
        "wall_seconds": time.perf_counter() - start,
    }
    if chief:
        common.write_json(os.path.join(workdir, "metrics.json"), metrics)
        _write_events(workdir, trajectory)
    return metrics
