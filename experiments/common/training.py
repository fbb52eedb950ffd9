"""How the experiments train: optimizers by name, strategy and precision, checks.

Each experiment's `Config` checks its optimizer with `check_optimizer`, its
`strategy` and `precision` with `check_scale`, and its numbers with
`check_int`, `check_int_tuple`, `check_distinct_seeds` and `check_fraction`;
its `run` makes the optimizer with `make_optimizer` and trains inside
`experiment_run` (or `strategy_and_precision`), timing steps with `StepTimes`
where it reports them.
"""

import contextlib
import dataclasses
import inspect
import math
import numbers
import os
import time

import keras
import numpy as np

from experiments.common.report import write_json
from maskfit import distribute

__all__ = [
    "OPTIMIZERS",
    "StepTimes",
    "check_distinct_seeds",
    "check_fraction",
    "check_int",
    "check_int_tuple",
    "check_optimizer",
    "check_scale",
    "compiled_step",
    "experiment_run",
    "glorot_uniform",
    "make_optimizer",
    "strategy_and_precision",
]


def compiled_step(jit_compile):
    """`compile`'s `jit_compile` for an experiment's `--jit_compile` flag.

    On TensorFlow, False is a `tf.function` graph and True XLA. JAX has no
    compiled step without XLA: `jit_compile=False` there runs every step op
    by op (about 0.07 s a step for MNIST-1D's CNN on 2 cores, 30 times a
    jitted one), so under JAX the step is always jitted, flag or not.
    """
    return bool(jit_compile) or keras.backend.backend() == "jax"


def glorot_uniform(shape, entropy):
    """A Glorot-uniform kernel drawn by NumPy from `entropy` (ints), float32.

    Keras's fans (a convolution's receptive field counts); the same numbers
    under every backend, where `keras.initializers.GlorotUniform(seed)` draws
    other numbers per backend.
    """
    shape = tuple(int(d) for d in shape)
    receptive = int(np.prod(shape[:-2]))
    limit = np.sqrt(6.0 / ((shape[-2] + shape[-1]) * receptive))
    rng = np.random.default_rng(np.random.SeedSequence(list(entropy)))
    return rng.uniform(-limit, limit, shape).astype(np.float32)


def _optimizer_classes():
    """Maps each keras optimizer that takes just a learning rate to its class."""
    classes = {}
    for name in dir(keras.optimizers):
        cls = getattr(keras.optimizers, name)
        if not (
            inspect.isclass(cls)
            and issubclass(cls, keras.optimizers.Optimizer)
            and cls is not keras.optimizers.Optimizer
        ):
            continue
        params = inspect.signature(cls).parameters
        required = [
            p
            for p in params.values()
            if p.default is inspect.Parameter.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        # Wrappers (LossScaleOptimizer, MultiOptimizer) need other optimizers.
        if "learning_rate" in params and not required:
            classes[name.lower()] = cls
    return classes


# Lower-case name -> class, for every optimizer `make_optimizer` can make.
OPTIMIZERS = _optimizer_classes()


def check_optimizer(name):
    """Raises ValueError unless `name` is in `OPTIMIZERS`, in any case."""
    if not isinstance(name, str) or name.lower() not in OPTIMIZERS:
        raise ValueError(
            "Received an unknown `optimizer`, expected one of the keras.optimizers"
            f" names (known ones are {', '.join(sorted(OPTIMIZERS))})."
            f" Received: optimizer={name!r}"
        )


def make_optimizer(name, learning_rate):
    """Returns a new `keras.optimizers` optimizer called `name` (any case).

    Raises:
      ValueError: if `name` is not in `OPTIMIZERS`; the message lists them.
    """
    check_optimizer(name)
    return OPTIMIZERS[name.lower()](learning_rate=learning_rate)


def check_scale(strategy, precision, steps_per_execution, jit_compile):
    """Raises ValueError for an unknown strategy or precision, or one Keras fails.

    Under `tf.distribute` on CPUs, Keras 3.15 fails with `steps_per_execution`
    above 1 and with `jit_compile=True` (docs/distributed.md), so any strategy
    but 'default' is refused with those, naming the flags that fix it.
    """
    for what, value, valid in (
        ("strategy", strategy, distribute.STRATEGIES),
        ("precision", precision, distribute.PRECISIONS),
    ):
        if value not in valid:
            raise ValueError(
                f"Received an invalid value for `{what}`, expected one of"
                f" {', '.join(repr(v) for v in valid)}. Received: {what}={value!r}"
            )
    if strategy == "default":
        return
    fixes = []
    if steps_per_execution != 1:
        fixes.append("--steps_per_execution=1")
    if jit_compile:
        fixes.append("--nojit_compile")
    if fixes:
        raise ValueError(
            f"strategy={strategy!r} needs steps_per_execution=1 and"
            " jit_compile=False: under tf.distribute on CPUs Keras fails with"
            " more steps per execution or with XLA. Received:"
            f" steps_per_execution={steps_per_execution!r},"
            f" jit_compile={jit_compile!r}. Pass {' '.join(fixes)}."
        )


@contextlib.contextmanager
def strategy_and_precision(strategy, precision):
    """Sets the dtype policy `precision` and yields the strategy `strategy`.

    The strategy is made first, as `MultiWorkerMirroredStrategy` must be made
    before other TensorFlow work (`make_strategy` makes each one once per
    process). Build and compile the model under the yielded strategy's
    `scope()`. The previous dtype policy comes back on exit.
    """
    made = distribute.make_strategy(strategy)
    previous = distribute.set_precision(precision)
    try:
        yield made
    finally:
        distribute.set_precision(previous)


@contextlib.contextmanager
def experiment_run(config, workdir):
    """Yields `(strategy, chief)` for a run of `config`, its config written first.

    Trains under `config.strategy` and `config.precision` (see
    `strategy_and_precision`); the chief makes `workdir` and writes
    `config.json` there before anything else.
    """
    with strategy_and_precision(config.strategy, config.precision) as strategy:
        chief = distribute.is_chief(strategy)
        if chief:
            os.makedirs(workdir, exist_ok=True)
            write_json(os.path.join(workdir, "config.json"), dataclasses.asdict(config))
        yield strategy, chief


def check_int(name, value, minimum, received=None):
    """Raises ValueError unless `value` is an integer of at least `minimum`.

    Args:
      name: the setting, as the message names it.
      value: what was received.
      minimum: 0 or 1 (the message says "non-negative" or "positive").
      received: the tuple `value` is an item of, if any (the message shows it).

    Example:
      >>> check_int("epochs", 0, minimum=1)
      Traceback (most recent call last):
      ...
      ValueError: Received an invalid value for `epochs`, expected a positive integer. Received: epochs=0
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or value < minimum
    ):
        kind = "positive" if minimum == 1 else "non-negative"
        expected = f"a {kind} integer" if received is None else f"{kind} integers"
        raise ValueError(
            f"Received an invalid value for `{name}`, expected {expected}."
            f" Received: {name}={value if received is None else received!r}"
        )


def check_int_tuple(name, value, minimum, check_item=check_int):
    """Raises ValueError unless `value` is a non-empty tuple of such integers.

    Args:
      name: the setting, as the message names it.
      value: what was received.
      minimum: the least item, checked by `check_item(name, item, minimum,
        received=value)` (`check_int` by default).
      check_item: the check of one item, for a config whose messages word it
        otherwise.

    Example:
      >>> check_int_tuple("hidden_units", (300, 100), minimum=1)  # passes
    """
    if not isinstance(value, tuple) or not value:
        raise ValueError(
            f"Received an invalid value for `{name}`, expected a non-empty"
            f" tuple of integers. Received: {name}={value!r}"
        )
    for item in value:
        check_item(name, item, minimum, received=value)


def check_distinct_seeds(seeds):
    """Raises ValueError if a seed stands twice in `seeds`.

    Example:
      >>> check_distinct_seeds((0, 1, 2))  # passes
    """
    if len(set(seeds)) != len(seeds):
        raise ValueError(
            "Received an invalid value for `seeds`, expected distinct seeds."
            f" Received: seeds={seeds!r}"
        )


def check_fraction(name, value, upper=1.0, closed=False, received=None):
    """Raises ValueError unless `value` is a finite number in (0, upper).

    Args:
      name: the setting, as the message names it.
      value: what was received.
      upper: the bound (`math.inf`: any positive number).
      closed: whether `upper` itself is allowed.
      received: the tuple `value` is an item of, if any.

    Example:
      >>> check_fraction("prune_rate", 0.2)  # passes
    """
    ok = (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 < value
        and (value <= upper if closed else value < upper)
    )
    if not ok:
        interval = "(0, 1]" if closed else "(0, 1)"
        expected = (
            "a positive number" if upper == math.inf else f"a number in {interval}"
        )
        if received is not None:
            expected = f"numbers in {interval}"
        raise ValueError(
            f"Received an invalid value for `{name}`, expected {expected}."
            f" Received: {name}={value if received is None else received!r}"
        )


class StepTimes(keras.callbacks.Callback):
    """Wall seconds of every training step of a `fit`, in `seconds`.

    Example:
      >>> timer = StepTimes()
      >>> model.fit(x, y, callbacks=[timer])
      >>> timer.seconds  # one per step
    """

    def __init__(self):
        super().__init__()
        self.seconds = []

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.seconds.append(time.perf_counter() - self._start)
