"""What the experiments share: optimizers by name, scale settings, JSON and scalars.

Each experiment's `Config` checks its optimizer with `check_optimizer` and its
`strategy` and `precision` with `check_scale`; its `run` makes the optimizer
with `make_optimizer`, trains inside `strategy_and_precision`, and writes its
outputs with `write_json` and `write_scalars` (`maskfit.scalars`'s, which
the package's `PruningSummaries` uses too).
"""

import contextlib
import dataclasses
import inspect
import json
import os

import keras
from absl import app, flags

from maskfit import distribute
from maskfit.scalars import (
    SCALAR_METADATA,  # noqa: F401 (re-exported)
    write_scalars,  # noqa: F401 (re-exported)
)

__all__ = [
    "OPTIMIZERS",
    "SCALAR_METADATA",
    "check_optimizer",
    "check_scale",
    "define_scale_flags",
    "experiment_run",
    "define_config_flags",
    "flag_values",
    "make_optimizer",
    "strategy_and_precision",
    "write_json",
    "write_scalars",
]


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


def define_config_flags(config_class, helps, lists):
    """Defines one absl flag per field of the dataclass `config_class`.

    Each flag's default is the field's default; list fields (named in
    `lists`) become list flags, the others bool, integer, float or string
    flags by their default's type. Read them back with `flag_values`.

    Args:
      config_class: a dataclass whose fields all have defaults.
      helps: `{field name: help text}`, one per field.
      lists: `{field name: item type}` for the tuple fields.

    Returns:
      `{field name: FlagHolder}`.
    """
    defaults = config_class()
    holders = {}
    for field in dataclasses.fields(config_class):
        name, default, text = (
            field.name,
            getattr(defaults, field.name),
            helps[field.name],
        )
        if name in lists:
            holders[name] = flags.DEFINE_list(name, [str(v) for v in default], text)
        elif isinstance(default, bool):
            holders[name] = flags.DEFINE_bool(name, default, text)
        elif isinstance(default, int):
            holders[name] = flags.DEFINE_integer(name, default, text)
        elif isinstance(default, float):
            holders[name] = flags.DEFINE_float(name, default, text)
        else:
            holders[name] = flags.DEFINE_string(name, default, text)
    return holders


def flag_values(holders, lists):
    """The values of absl flags by name, list flags as tuples of their type.

    Args:
      holders: `{name: FlagHolder}`.
      lists: `{name: type}` for the list flags among them (`int`, `float`...).

    Returns:
      `{name: value}`, ready for a config's constructor.

    Raises:
      app.UsageError: if a list flag holds an item its type does not parse.
    """
    values = {}
    for name, flag in holders.items():
        if name not in lists:
            values[name] = flag.value
            continue
        try:
            values[name] = tuple(lists[name](v) for v in flag.value)
        except ValueError as e:
            raise app.UsageError(
                f"--{name} takes comma-separated {lists[name].__name__}s."
                f" Received: {','.join(flag.value)}"
            ) from e
    return values


def write_json(path, value):
    """Writes `value` to `path` as indented JSON with sorted keys."""
    with open(path, "w") as f:
        json.dump(value, f, indent=2, sort_keys=True)
        f.write("\n")


def define_scale_flags(flag_values=None):
    """Defines the absl flags `--strategy` and `--precision`.

    Call it once at module level in an experiment's `main.py`, next to its own
    flags; then pass `FLAGS.strategy` and `FLAGS.precision` into the run's
    config, and give them to `maskfit.distribute.make_strategy` and
    `set_precision` there.

    Args:
      flag_values: the `absl.flags.FlagValues` to define them in; by default
        `absl.flags.FLAGS`.

    Returns:
      A pair of `FlagHolder`s, `(strategy, precision)`.
    """
    flag_values = flags.FLAGS if flag_values is None else flag_values
    strategy = flags.DEFINE_enum(
        "strategy",
        "default",
        distribute.STRATEGIES,
        "Where to train: 'default' (one device), 'mirrored' (all devices of"
        " this machine) or 'multi_worker' (several machines, from TF_CONFIG).",
        flag_values=flag_values,
    )
    precision = flags.DEFINE_enum(
        "precision",
        "float32",
        distribute.PRECISIONS,
        "Keras dtype policy to train in.",
        flag_values=flag_values,
    )
    return strategy, precision
