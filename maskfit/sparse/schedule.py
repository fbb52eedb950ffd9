"""When dynamic sparse training moves connections, and how many: RigL's schedule.

Steps are counted as `maskfit.pruning` counts them (TF-MOT's and RigL's
TF2 `train.py` count): training step `t` is the t-th batch, 1-based, which
is the optimizer's `iterations` + 1 in that step (`iterations` is `t - 1`
before the step's update and `t` after it). The masks change after the
update of training step `t` when

    t >= max(begin_step, 1), (t - begin_step) % delta_t == 0, t <= t_end,
    and drop_fraction(t) > 0,

so with `delta_t=100` and `begin_step=0` after steps 100, 200, ... (RigL's
`is_update_iter(iterations)` after the step's `apply_gradients`). The
methods here take the optimizer step `t - 1` (`iterations` before that
update); `maskfit.sparse.SET`, which runs before the next step's forward
pass, shifts them by one. The
fraction of each layer's active weights that is dropped (and regrown) is

    cosine:   alpha / 2 * (1 + cos(pi * min(t, t_end) / t_end))
    constant: alpha

(the paper's f_decay; RigL's TF1 code runs the cosine over `t_end -
begin_step` steps instead of `t_end`, which only differs for a begin step
above 0). The cosine reaches 0 at `t_end`, so its last update is before it.
"""

import math
import numbers

import numpy as np
import tensorflow as tf

__all__ = ["ANNEALS", "UpdateSchedule"]


class _NumPy:
    """The few ops of the formula, in NumPy, named as in TensorFlow."""

    float32, float64, cos, minimum = np.float32, np.float64, np.cos, np.minimum
    constant = staticmethod(lambda value, dtype: dtype(value))
    cast = staticmethod(lambda value, dtype: dtype(value))


ANNEALS = ("cosine", "constant")
"""The values of `drop_fraction_anneal`: RigL's cosine decay to 0 at `t_end`, or none."""


class UpdateSchedule:
    """Which optimizer steps update the masks, and the drop fraction in each.

    Args:
      delta_t: training steps between updates (RigL's
        `maskupdate_frequency`), a positive integer.
      t_end: the last training step that may update (RigL's
        `maskupdate_end_step`; the paper uses 75% of training).
      alpha: the drop fraction of the first update (RigL's `drop_fraction`,
        the paper's alpha), in (0, 1].
      drop_fraction_anneal: "cosine" (decays to 0 at `t_end`) or "constant".
      begin_step: the first training step that may update (RigL's
        `maskupdate_begin_step`), in [0, t_end].

    Example:

    >>> schedule = UpdateSchedule(delta_t=100, t_end=300)
    >>> schedule.update_steps()  # optimizer steps (`iterations` before the update)
    [99, 199]
    >>> round(float(schedule.drop_fraction_at(100)), 4)
    0.225
    """

    def __init__(
        self,
        delta_t=100,
        t_end=None,
        alpha=0.3,
        drop_fraction_anneal="cosine",
        begin_step=0,
    ):
        _check_int("delta_t", delta_t, minimum=1)
        _check_int("t_end", t_end, minimum=1)
        _check_int("begin_step", begin_step, minimum=0)
        if begin_step > t_end:
            raise ValueError(
                "begin_step must not be after t_end: no step could update the"
                f" masks. Received: begin_step={begin_step}, t_end={t_end}"
            )
        if not (
            isinstance(alpha, numbers.Real)
            and not isinstance(alpha, bool)
            and 0.0 < alpha <= 1.0
        ):
            raise ValueError(
                "alpha (the initial drop fraction) must be a number in (0, 1]; RigL"
                f" uses 0.3. Received: alpha={alpha!r}"
            )
        if drop_fraction_anneal not in ANNEALS:
            raise ValueError(
                "drop_fraction_anneal must be 'cosine' or 'constant' (RigL's"
                " 'exponential_*' is not supported). Received:"
                f" drop_fraction_anneal={drop_fraction_anneal!r}"
            )
        self.delta_t = int(delta_t)
        self.t_end = int(t_end)
        self.alpha = float(alpha)
        self.drop_fraction_anneal = drop_fraction_anneal
        self.begin_step = int(begin_step)

    def training_step(self, step):
        """Training step `t` (int64 tensor) of optimizer step `step` (`iterations`)."""
        return tf.cast(step, tf.int64) + 1

    def drop_fraction(self, step):
        """The drop fraction (float32 tensor) in optimizer step `step`.

        It is 0 where `should_update(step)` is False.
        """
        t = self.training_step(step)
        fraction = self._fraction(tf.cast(t, tf.float64), tf)
        return tf.where(self.should_update(step), fraction, tf.constant(0, tf.float32))

    def should_update(self, step):
        """A scalar bool tensor: whether the masks change in optimizer step `step`."""
        t = self.training_step(step)
        on_grid = tf.logical_and(
            t >= max(self.begin_step, 1),  # never before the first step
            tf.math.floormod(t - self.begin_step, self.delta_t) == 0,
        )
        in_range = tf.logical_and(on_grid, t <= self.t_end)
        if self.drop_fraction_anneal == "cosine":
            # The cosine's last grid point may be t_end itself, where it is 0.
            in_range = tf.logical_and(in_range, t < self.t_end)
        return in_range

    def drop_fraction_at(self, t):
        """The drop fraction at training step `t`, in plain Python (a float32 value).

        The schedule's formula, whether or not `t` is an update step.
        """
        return self._fraction(np.float64(t), _NumPy).item()

    def update_steps(self):
        """Every optimizer step (`iterations` before the update) that updates.

        A list as long as the number of updates: for a bounded `t_end` only.
        """
        first, last = self._training_steps_range()
        return [t - 1 for t in range(first, last + 1, self.delta_t)]

    def last_update_step(self):
        """The last optimizer step that updates, or None when none does.

        For `MaskRule.last_update_step`: after it the step can leave the rule
        out. Computed, not listed, so that a `t_end` beyond the run (10**9,
        say) costs nothing when the step is traced.
        """
        first, last = self._training_steps_range()
        if last < first:
            return None
        return first + (last - first) // self.delta_t * self.delta_t - 1

    def _training_steps_range(self):
        """The first training step that updates and the last one that may."""
        first = max(self.begin_step, self.delta_t if self.begin_step == 0 else 0)
        last = self.t_end - 1 if self.drop_fraction_anneal == "cosine" else self.t_end
        return first, last

    def get_config(self):
        return {
            "delta_t": self.delta_t,
            "t_end": self.t_end,
            "alpha": self.alpha,
            "drop_fraction_anneal": self.drop_fraction_anneal,
            "begin_step": self.begin_step,
        }

    def _fraction(self, t, ops):
        """The formula at float64 step `t` with `ops` (tf or np), as float32."""
        if self.drop_fraction_anneal == "constant":
            fraction = self.alpha + 0.0 * t
        else:
            progress = ops.minimum(t, ops.constant(self.t_end, ops.float64))
            fraction = self.alpha / 2 * (1 + ops.cos(math.pi * progress / self.t_end))
        return ops.cast(fraction, ops.float32)

    def __repr__(self):
        return (
            f"UpdateSchedule(delta_t={self.delta_t}, t_end={self.t_end},"
            f" alpha={self.alpha}, drop_fraction_anneal="
            f"{self.drop_fraction_anneal!r}, begin_step={self.begin_step})"
        )


def _check_int(name, value, minimum):
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or value < minimum
    ):
        kind = "a positive" if minimum == 1 else "a non-negative"
        raise ValueError(
            f"{name} must be {kind} integer (training steps). Received:"
            f" {name}={value!r}"
        )
