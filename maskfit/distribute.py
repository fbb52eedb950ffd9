"""Choosing where and in which precision to train: strategies, policies, flags.

Experiments take `--strategy` and `--precision` (`experiments.common` defines
the flags); this module turns those names into a `tf.distribute.Strategy` and
a global Keras dtype policy, so every entry point validates them the same way. `MaskedModel` itself needs nothing from
here: build and compile it under any strategy's `scope()` and its masks hold.
"""

import keras
import tensorflow as tf

from maskfit import support

__all__ = [
    "PRECISIONS",
    "STRATEGIES",
    "is_chief",
    "make_strategy",
    "set_precision",
]

STRATEGIES = ("default", "mirrored", "multi_worker")
"""The strategy names `make_strategy` (and the experiments' `--strategy`) take."""

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
"""The Keras dtype policies `set_precision` (and `--precision`) take."""


def _check_name(value, valid, what):
    if value not in valid:
        raise ValueError(
            f"Received an invalid value for `{what}`, expected one of"
            f" {', '.join(repr(v) for v in valid)}. Received: {what}={value!r}"
        )


def make_strategy(name, logical_devices=None):
    """Returns the `tf.distribute.Strategy` called `name`.

    - `"default"`: the default strategy (one device, no distribution).
    - `"mirrored"`: `tf.distribute.MirroredStrategy` over this machine's GPUs,
      or its CPU when it has none. Each replica gets `batch_size /
      num_replicas_in_sync` examples of the global batch.
    - `"multi_worker"`: `tf.distribute.MultiWorkerMirroredStrategy`, set up from
      the `TF_CONFIG` environment variable (see docs/distributed.md). Every
      worker runs the same program. Without `TF_CONFIG` it trains as a single
      worker. It must be made at program start, before other TensorFlow work.

    Args:
      name: one of `STRATEGIES`.
      logical_devices: for `"mirrored"` only, optionally split the first
        physical CPU into this many logical devices and mirror over them, e.g.
        to try data parallelism on a laptop. This must happen before
        TensorFlow initializes its devices.

    Returns:
      A `tf.distribute.Strategy`; build and compile models under its `scope()`.
      Each non-default strategy is made once per process and returned again
      by later calls with the same arguments.

    Raises:
      ValueError: for an unknown `name`, or `logical_devices` that is not a
        positive integer or is given for another strategy than `"mirrored"`.
      RuntimeError: when `logical_devices` is given after TensorFlow has
        initialized its devices.
      NotImplementedError: under a Keras backend other than TensorFlow.

    Example:

    >>> strategy = make_strategy("default")
    >>> strategy.num_replicas_in_sync
    1
    """
    support.require("strategies")
    _check_name(name, STRATEGIES, "strategy")
    if logical_devices is not None:
        if name != "mirrored":
            raise ValueError(
                "`logical_devices` splits the CPU for the 'mirrored' strategy"
                f" only. Received: strategy={name!r},"
                f" logical_devices={logical_devices!r}"
            )
        if (
            not isinstance(logical_devices, int)
            or isinstance(logical_devices, bool)
            or logical_devices < 1
        ):
            raise ValueError(
                "Received an invalid value for `logical_devices`, expected a"
                f" positive integer. Received: logical_devices={logical_devices!r}"
            )
    if name == "default":
        return tf.distribute.get_strategy()
    key = (name, logical_devices)
    if key not in _made:
        _made[key] = _new_strategy(name, logical_devices)
    return _made[key]


# Strategies made so far, reused: a second MultiWorkerMirroredStrategy cannot
# be made in one process, and a second MirroredStrategy over several devices
# reuses the first one's collective keys, so its all-reduces fail with "Shape
# mismatch in the collective instance".
_made = {}


def _new_strategy(name, logical_devices):
    if name == "multi_worker":
        return _MultiWorkerMirroredStrategy()
    if logical_devices is None:
        return tf.distribute.MirroredStrategy()
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * logical_devices
        )
    except RuntimeError as e:
        configured = tf.config.get_logical_device_configuration(cpu) or []
        if len(configured) != logical_devices:
            raise RuntimeError(
                f"Cannot split the CPU into {logical_devices} logical devices:"
                " TensorFlow has already initialized its devices. Call"
                " make_strategy('mirrored', logical_devices=...) at program"
                " start, before any other TensorFlow work."
            ) from e
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    return tf.distribute.MirroredStrategy(devices[:logical_devices])


def set_precision(name):
    """Sets Keras's global dtype policy to `name`; returns the previous one.

    Under `"mixed_float16"`, `compile()` wraps the optimizer in a
    `keras.optimizers.LossScaleOptimizer`; `MaskedModel` keeps frozen entries
    exact through it, and NaN or Inf in a frozen entry's gradient never makes
    it skip a step. Set the policy before building the model.

    Args:
      name: one of `PRECISIONS`.

    Returns:
      The name of the policy that was set before, to restore it later.

    Raises:
      ValueError: for an unknown `name`.

    Example:

    >>> previous = set_precision("mixed_bfloat16")
    >>> keras.config.dtype_policy().name
    'mixed_bfloat16'
    >>> _ = set_precision(previous)
    """
    _check_name(name, PRECISIONS, "precision")
    previous = keras.config.dtype_policy().name
    keras.config.set_dtype_policy(name)
    return previous


def is_chief(strategy=None):
    """Whether this process should write a run's outputs (logs, checkpoints).

    Under `"multi_worker"` every worker runs the whole program; only the chief
    (task `chief`, or `worker` 0 when the cluster has no chief) should write
    to the shared work directory. Elsewhere this is always True.

    Args:
      strategy: the strategy in use; by default the current one.

    Example:

    >>> import maskfit.distribute as distribute
    >>> distribute.is_chief()  # one process, no TF_CONFIG: it writes
    True
    >>> distribute.is_chief(distribute.make_strategy("default"))
    True
    """
    strategy = tf.distribute.get_strategy() if strategy is None else strategy
    resolver = getattr(strategy, "cluster_resolver", None)
    task_type = getattr(resolver, "task_type", None)
    if not task_type:
        return True
    if task_type == "chief":
        return True
    cluster = resolver.cluster_spec().as_dict()
    return task_type == "worker" and resolver.task_id == 0 and "chief" not in cluster


class _MultiWorkerMirroredStrategy(tf.distribute.MultiWorkerMirroredStrategy):
    """`MultiWorkerMirroredStrategy` with a `reduce` that Keras's `fit` can use.

    With more than one worker, TensorFlow 2.21's collective strategy breaks two
    calls that Keras 3.15's `fit` makes, for stock models as well:

    - before the first step, `strategy.reduce("MEAN", (x, y), axis=None)` on a
      whole input batch, to learn its shapes: the collective strategy does not
      map over nested structures (`MirroredStrategy` does) and fails with
      "Attempt to convert a value (PerReplica...)";
    - after each step, `strategy.reduce("MEAN", metric, axis=0)` on scalar
      metric values: "Invalid reduction dimension 0 for input with 0
      dimensions".

    This reduces leaf by leaf, in the same order on every worker, and reduces
    scalars across replicas only, which is what a mean over axis 0 means for
    one value per replica.
    """

    def reduce(self, reduce_op, value, axis):
        reduce = super().reduce

        def reduce_leaf(leaf):
            local = self.experimental_local_results(leaf)[0]
            # A scalar tensor, or (Keras 3.10, run eagerly) a Python number.
            scalar = tf.TensorShape(getattr(local, "shape", ())).rank == 0
            return reduce(reduce_op, leaf, None if scalar else axis)

        return tf.nest.map_structure(reduce_leaf, value)
