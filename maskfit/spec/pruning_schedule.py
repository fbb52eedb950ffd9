"""Pruning schedules: when to prune, and to which sparsity, with TF-MOT's semantics.

`PruningSchedule` and TF-MOT's two schedules, `ConstantSparsity` and
`PolynomialDecay`. Magnitude pruning (`maskfit.pruning`) and structured
pruning (`maskfit.structured`) both take them, so they live below both;
`maskfit.pruning` exports them under TF-MOT's names, with the host-side
tables of a schedule (`maskfit.pruning.schedules`).
"""

import abc

import keras
import numpy as np
import tensorflow as tf

from maskfit import checks
from maskfit.spec.config_value import ConfigValue

__all__ = ["ConstantSparsity", "PolynomialDecay", "PruningSchedule"]


class PruningSchedule(ConfigValue, abc.ABC):
    """Base class of pruning schedules: `schedule(step) -> (should_prune, sparsity)`.

    A schedule says, for a training step, whether the masks are recomputed in
    that step (a scalar bool tensor) and the fraction of entries to prune
    (a scalar float32 tensor). It is called inside the compiled training step
    (graph and `jit_compile`), so `__call__` must use TensorFlow ops only.

    This is `tfmot.sparsity.keras.PruningSchedule` for Keras 3: the helpers
    `_should_prune_in_step`, `_validate_step` and `_validate_sparsity` keep
    TF-MOT's names and meaning, so a custom TF-MOT schedule migrates by
    changing its import. Register a subclass with
    `keras.saving.register_keras_serializable()` so that it saves with a model;
    `get_config` returns the constructor's arguments (the Keras 3 convention).

    Example (prune to 50% once, at step 1000):

    >>> import keras, tensorflow as tf, maskfit.pruning as pruning
    >>> @keras.saving.register_keras_serializable(package="my_project")
    ... class OneShot(pruning.PruningSchedule):
    ...     def __init__(self, step, sparsity):
    ...         self._validate_step(step, step, 1, allow_negative_1=False)
    ...         self._validate_sparsity(sparsity, "sparsity")
    ...         self.step, self.sparsity = step, sparsity
    ...     def __call__(self, step):
    ...         should_prune = self._should_prune_in_step(step, self.step, self.step, 1)
    ...         return should_prune, tf.constant(self.sparsity, tf.float32)
    ...     def last_pruning_step(self):  # optional: no check in later steps
    ...         return self.step
    ...     def get_config(self):
    ...         return {"step": self.step, "sparsity": self.sparsity}
    >>> pruning.pruning_steps(OneShot(1000, 0.5), 0, 2000)
    [(1000, 0.5)]
    """

    def _should_prune_in_step(self, step, begin_step, end_step, frequency):
        """Whether `step` is in `[begin_step, end_step]`, `frequency` steps apart.

        `end_step < 0` means no end. Returns a scalar bool tensor.
        """
        is_in_pruning_range = tf.math.logical_and(
            tf.math.greater_equal(step, begin_step),
            # A negative end_step means: keep pruning for ever.
            tf.math.logical_or(
                tf.math.less_equal(step, end_step), tf.math.less(end_step, 0)
            ),
        )
        is_pruning_turn = tf.math.equal(
            tf.math.floormod(tf.math.subtract(step, begin_step), frequency), 0
        )
        return tf.math.logical_and(is_in_pruning_range, is_pruning_turn)

    def _validate_step(self, begin_step, end_step, frequency, allow_negative_1):
        """Raises a ValueError unless the steps make a pruning interval.

        Args:
          begin_step: the first step that may prune, an integer >= 0.
          end_step: the last step that may prune, >= `begin_step`; -1 means
            no end when `allow_negative_1`.
          frequency: prune every `frequency` steps from `begin_step`, > 0.
          allow_negative_1: whether `end_step=-1` is accepted.
        """
        name = type(self).__name__
        for arg, value in (
            ("begin_step", begin_step),
            ("end_step", end_step),
            ("frequency", frequency),
        ):
            if not checks.is_integer(value):
                raise TypeError(
                    f"{name} {arg} must be an integer (a training step count)."
                    f" Received: {arg}={value!r}"
                )
        if begin_step < 0:
            raise ValueError(
                f"{name} begin_step must be >= 0. Received: begin_step={begin_step}"
            )
        if end_step == -1 and not allow_negative_1:
            raise ValueError(
                f"{name} needs an end: end_step cannot be -1 (the sparsity decays"
                f" from begin_step to end_step). Received: end_step={end_step}"
            )
        if end_step != -1:
            if end_step < 0:
                raise ValueError(
                    f"{name} end_step must be -1 (no end) or >= 0."
                    f" Received: end_step={end_step}"
                )
            if end_step < begin_step:
                raise ValueError(
                    f"{name} begin_step must be <= end_step when end_step != -1."
                    f" Received: begin_step={begin_step}, end_step={end_step}"
                )
        if frequency <= 0:
            raise ValueError(
                f"{name} frequency must be > 0 (prune every `frequency` steps)."
                f" Received: frequency={frequency}"
            )

    def _validate_sparsity(self, sparsity, variable_name):
        """Raises unless `sparsity` is a number in [0, 1)."""
        if not checks.is_real(sparsity) or not 0.0 <= sparsity < 1.0:
            raise ValueError(
                f"{type(self).__name__} {variable_name} must be a number in [0, 1)"
                f" (the fraction of entries pruned). Received:"
                f" {variable_name}={sparsity!r}"
            )

    @abc.abstractmethod
    def __call__(self, step):
        """Returns `(should_prune, sparsity)` for training step `step`.

        Args:
          step: a scalar integer tensor, the training step (see `pruning_steps`).

        Returns:
          A scalar bool tensor, whether the masks are recomputed in this step,
          and a scalar float32 tensor, the sparsity they are recomputed to.
        """

    @abc.abstractmethod
    def get_config(self):
        """Returns the constructor's arguments as plain Python data."""

    def last_pruning_step(self):
        """The last step at which `__call__` can say prune, or None if unknown.

        Read on the host, not in the step: after it, the training step is
        traced without the schedule (see `MaskRule.last_update_step`). The
        default, None, keeps the schedule in every step; a subclass whose
        pruning ends may return its last step (a negative number if it never
        prunes). A wrong bound is a silent error: return None when unsure.
        """
        return None

    @classmethod
    def from_config(cls, config):
        """Makes a schedule from `get_config()`, or from TF-MOT's nested form.

        TF-MOT's `get_config` returns `{"class_name": ..., "config": {...}}`;
        that form is accepted too, so saved TF-MOT configs load.
        """
        if set(config) == {"class_name", "config"}:
            config = config["config"]
        return cls(**config)


@keras.saving.register_keras_serializable(package="maskfit")
class ConstantSparsity(PruningSchedule):
    """Prunes to `target_sparsity` every `frequency` steps in `[begin_step, end_step]`.

    `tfmot.sparsity.keras.ConstantSparsity`, step for step.

    Args:
      target_sparsity: the fraction of entries pruned, in [0, 1).
      begin_step: the first step that prunes, >= 0.
      end_step: the last step that may prune; -1 (default) means no end.
      frequency: prune every `frequency` steps from `begin_step`.

    Example:

    >>> import maskfit.pruning as pruning
    >>> pruning.pruning_steps(pruning.ConstantSparsity(0.5, 10, 30, 10), 0, 100)
    [(10, 0.5), (20, 0.5), (30, 0.5)]
    """

    def __init__(self, target_sparsity, begin_step, end_step=-1, frequency=100):
        self._validate_step(begin_step, end_step, frequency, True)
        self._validate_sparsity(target_sparsity, "target_sparsity")
        self.target_sparsity = float(target_sparsity)
        self.begin_step = int(begin_step)
        self.end_step = int(end_step)
        self.frequency = int(frequency)

    def __call__(self, step):
        step = _as_step(step)
        should_prune = self._should_prune_in_step(
            step, self.begin_step, self.end_step, self.frequency
        )
        return should_prune, tf.constant(self.target_sparsity, dtype=tf.float32)

    def last_pruning_step(self):
        return _last_turn(self, ConstantSparsity)

    def get_config(self):
        return {
            "target_sparsity": self.target_sparsity,
            "begin_step": self.begin_step,
            "end_step": self.end_step,
            "frequency": self.frequency,
        }


@keras.saving.register_keras_serializable(package="maskfit")
class PolynomialDecay(PruningSchedule):
    """Sparsity rising fast from `initial_sparsity`, levelling off at `final_sparsity`.

    `tfmot.sparsity.keras.PolynomialDecay`, step for step and bit for bit (the
    same float32 ops):

        p = min(1, max(0, (step - begin_step) / (end_step - begin_step)))
        sparsity = final + (initial - final) * (1 - p) ** power

    The masks are recomputed every `frequency` steps in `[begin_step, end_step]`
    (Zhu & Gupta 2017, https://arxiv.org/abs/1710.01878).

    Args:
      initial_sparsity: the sparsity at `begin_step`, in [0, 1).
      final_sparsity: the sparsity from `end_step` on, in [0, 1).
      begin_step: the first step that prunes, >= 0.
      end_step: the last step that prunes, > `begin_step`.
      power: the exponent of the decay, a number > 0.
      frequency: prune every `frequency` steps from `begin_step`.

    Example:

    >>> import maskfit.pruning as pruning
    >>> schedule = pruning.PolynomialDecay(0.0, 0.9, begin_step=0, end_step=400,
    ...                                    frequency=100)
    >>> [(step, round(s, 4)) for step, s in pruning.pruning_steps(schedule, 0, 1000)]
    [(0, 0.0), (100, 0.5203), (200, 0.7875), (300, 0.8859), (400, 0.9)]
    """

    def __init__(
        self,
        initial_sparsity,
        final_sparsity,
        begin_step,
        end_step,
        power=3,
        frequency=100,
    ):
        self._validate_step(begin_step, end_step, frequency, False)
        if end_step == begin_step:
            # TF-MOT accepts this, then divides 0 by 0 at begin_step and
            # prunes to a NaN sparsity.
            raise ValueError(
                "PolynomialDecay end_step must be > begin_step (the sparsity decays"
                f" between them). Received: begin_step={begin_step},"
                f" end_step={end_step}. For one pruning step use"
                " ConstantSparsity(target_sparsity, begin_step, end_step=begin_step)."
            )
        self._validate_sparsity(initial_sparsity, "initial_sparsity")
        self._validate_sparsity(final_sparsity, "final_sparsity")
        if not checks.is_real(power) or not np.isfinite(power) or power <= 0:
            raise ValueError(
                f"PolynomialDecay power must be a finite number > 0. Received:"
                f" power={power!r}"
            )
        self.initial_sparsity = float(initial_sparsity)
        self.final_sparsity = float(final_sparsity)
        self.begin_step = int(begin_step)
        self.end_step = int(end_step)
        # An int stays an int: TF-MOT's default power is the int 3.
        self.power = power if checks.is_integer(power) else float(power)
        self.frequency = int(frequency)

    def __call__(self, step):
        step = _as_step(step)
        # The same ops in the same order as TF-MOT: the same bits in the same
        # execution mode (graph rewrites of pow and division included).
        with tf.name_scope("polynomial_decay_pruning_schedule"):
            p = tf.math.minimum(
                1.0,
                tf.math.maximum(
                    0.0,
                    tf.math.divide(
                        tf.dtypes.cast(step - self.begin_step, tf.float32),
                        self.end_step - self.begin_step,
                    ),
                ),
            )
            sparsity = tf.math.add(
                tf.math.multiply(
                    self.initial_sparsity - self.final_sparsity,
                    tf.math.pow(1 - p, self.power),
                ),
                self.final_sparsity,
                name="sparsity",
            )
        should_prune = self._should_prune_in_step(
            step, self.begin_step, self.end_step, self.frequency
        )
        return should_prune, sparsity

    def last_pruning_step(self):
        return _last_turn(self, PolynomialDecay)

    def get_config(self):
        return {
            "initial_sparsity": self.initial_sparsity,
            "final_sparsity": self.final_sparsity,
            "begin_step": self.begin_step,
            "end_step": self.end_step,
            "power": self.power,
            "frequency": self.frequency,
        }


def _last_turn(schedule, cls):
    """The last step of `_should_prune_in_step` over the schedule's interval.

    None without an end, and for a subclass of `cls` that overrides its
    `__call__` or `_should_prune_in_step` (its steps may be others).
    """
    kind = type(schedule)
    if (
        kind.__call__ is not cls.__call__
        or kind._should_prune_in_step is not PruningSchedule._should_prune_in_step
        or schedule.end_step < 0
    ):
        return None
    span = schedule.end_step - schedule.begin_step
    return schedule.begin_step + span // schedule.frequency * schedule.frequency


def _as_step(step):
    step = tf.convert_to_tensor(step)
    if not step.dtype.is_integer:
        raise TypeError(
            "A pruning schedule takes an integer training step. Received a tensor"
            f" of dtype {step.dtype.name}: {step!r}"
        )
    return tf.cast(step, tf.int64)
