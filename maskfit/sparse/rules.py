"""`SET` and `RigL`: dynamic sparse training rules, configured with RigL's names.

A rule covers the prunable weights of the layer it is declared on (a model:
all of them), keeps each at the sparsity `allocate` gives it, starts from
`random_keep_mask`s, and every `delta_t` steps until `t_end` moves a
fraction of each weight's active entries (`UpdateSchedule`): the weakest
(smallest |w|) are dropped and as many are grown where the growth score is
largest, a random draw for SET (Mocanu et al., Nature Communications 2018),
the magnitude of the dense gradient for RigL (Evci et al., ICML 2020).

Host side (`variables`, `allocation`, `initial_keep_masks`,
`last_update_step`) runs when the step is planned; `should_update`,
`drop_fraction` and `update` are TensorFlow only, traced into the step.
"""

import abc
import numbers

import keras
import tensorflow as tf

from maskfit.sparse import allocation
from maskfit.sparse import distributions
from maskfit.sparse import drop_and_grow
from maskfit.sparse import initial_masks
from maskfit.sparse import schedule as schedule_lib

__all__ = ["DynamicSparsity", "RigL", "SET"]


class DynamicSparsity(abc.ABC):
    """What SET and RigL share: the configuration and the in-step update.

    Args:
      sparsity: the target fraction of zeros over the covered weights, in
        (0, 1) (RigL's `end_sparsity`).
      t_end: the last training step that may move connections (RigL's
        `maskupdate_end_step`; the paper stops at 75% of training).
      delta_t: training steps between updates (`maskupdate_frequency`).
      alpha: the drop fraction of the first update (`drop_fraction`), (0, 1].
      drop_fraction_anneal: "cosine" or "constant".
      begin_step: the first training step that may update
        (`maskupdate_begin_step`).
      sparsity_distribution: "uniform", "erdos_renyi" or
        "erdos_renyi_kernel" (RigL's `mask_init_method`; "uniform" is its
        "random").
      dense_first_layer: keep the first layer dense (RigL's
        `first_layer_sparsity=0`).
      custom_sparsity_map: None or `{layer name: sparsity}`, out of the budget.
      erk_power_scale: the power of ERK's ratio, > 0.
      seed: a non-negative integer: the initial masks (and SET's draws).
    """

    # Whether `update` needs the dense gradient of the weights (RigL) or not.
    needs_dense_gradients = False

    def __init__(
        self,
        sparsity,
        t_end,
        delta_t=100,
        alpha=0.3,
        drop_fraction_anneal="cosine",
        begin_step=0,
        sparsity_distribution="erdos_renyi_kernel",
        dense_first_layer=False,
        custom_sparsity_map=None,
        erk_power_scale=1.0,
        seed=0,
    ):
        name = type(self).__name__
        if not (
            isinstance(sparsity, numbers.Real)
            and not isinstance(sparsity, bool)
            and 0.0 < sparsity < 1.0
        ):
            raise ValueError(
                f"{name}: sparsity must be a number in (0, 1), the fraction of the"
                f" weights that are zero. Received: sparsity={sparsity!r}"
            )
        self.schedule = schedule_lib.UpdateSchedule(
            delta_t, t_end, alpha, drop_fraction_anneal, begin_step
        )
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise ValueError(
                f"{name}: seed must be a non-negative integer. Received: seed={seed!r}"
            )
        custom = distributions.check_arguments(
            sparsity, sparsity_distribution, custom_sparsity_map, erk_power_scale
        )
        if not all(isinstance(k, str) for k in custom):
            raise ValueError(
                f"{name}: custom_sparsity_map's keys must be layer names (str)."
                f" Received: {custom_sparsity_map!r}"
            )
        if not isinstance(dense_first_layer, bool):
            raise ValueError(
                f"{name}: dense_first_layer must be True or False. Received:"
                f" {dense_first_layer!r}"
            )
        self.sparsity = float(sparsity)
        self.sparsity_distribution = sparsity_distribution
        self.dense_first_layer = dense_first_layer
        self.custom_sparsity_map = custom or None
        self.erk_power_scale = float(erk_power_scale)
        self.seed = int(seed)

    # Host side: what the rule covers and where it starts.

    def allocation(self, layer):
        """The `LayerSparsity` of each prunable weight of built `layer`."""
        return allocation.allocate(
            layer,
            self.sparsity,
            self.sparsity_distribution,
            self.dense_first_layer,
            self.custom_sparsity_map,
            self.erk_power_scale,
        )

    def variables(self, layer):
        """The weights the rule moves: the prunable ones whose sparsity is above 0."""
        return [e.variable for e in self.allocation(layer) if e.sparsity > 0]

    def initial_keep_masks(self, layer, frozen=None):
        """`[(variable, bool mask)]`: the random masks training starts from.

        One per variable of `variables(layer)`, drawn by `random_keep_mask`
        from `seed` and the variable's key. The step sets the weights outside
        them to +0.0 before the first update.

        Args:
          layer: the built layer or model the rule is declared on.
          frozen: None or `{variable path: bool array}`: entries that
            `maskfit.set_mask` freezes; they are always kept (and count as
            kept), so that they stay bit-identical.
        """
        entries = [e for e in self.allocation(layer) if e.sparsity > 0]
        masks = initial_masks.random_keep_masks(entries, self.seed, frozen)
        return [(e.variable, m) for e, m in zip(entries, masks)]

    def last_update_step(self):
        """The last optimizer step that moves connections (see `UpdateSchedule`)."""
        return self.schedule.last_update_step()

    # In the step: TensorFlow only.

    def should_update(self, step):
        """Whether optimizer step `step` (`iterations` before it) moves connections."""
        return self.schedule.should_update(step)

    def drop_fraction(self, step):
        """The fraction of active entries moved in step `step` (0 when it does not)."""
        return self.schedule.drop_fraction(step)

    @abc.abstractmethod
    def grow_scores(self, step, variable, weights, gradient):
        """The growth score of every entry of `variable` (larger grows first)."""

    def update(self, step, variable, weights, keep, gradient=None, frozen=None):
        """Drops and grows the entries of one variable in step `step`.

        Args:
          step: the optimizer's `iterations` before this step's update.
          variable: the variable (for its path and shape, read at trace time).
          weights: its value before this step's update (inactive entries 0).
          keep: its keep mask in force (bool).
          gradient: its dense gradient in this step, all replicas summed
            (`needs_dense_gradients`); not masked.
          frozen: None or bool: entries `maskfit.set_mask` freezes.

        Returns:
          A `drop_and_grow.DropGrow`; its `count` is 0 outside update steps.
        """
        scores = self.grow_scores(step, variable, weights, gradient)
        return drop_and_grow.drop_grow(
            weights, keep, scores, self.drop_fraction(step), frozen=frozen
        )

    def update_all(self, step, variables, weights, keeps, gradients=None, frozen=None):
        """`update` for each of `variables` at once; returns a list of `DropGrow`."""
        count = len(variables)
        gradients = [None] * count if gradients is None else gradients
        frozen = [None] * count if frozen is None else frozen
        return [
            self.update(step, v, w, k, g, f)
            for v, w, k, g, f in zip(variables, weights, keeps, gradients, frozen)
        ]

    def get_config(self):
        return {
            "sparsity": self.sparsity,
            **self.schedule.get_config(),
            "sparsity_distribution": self.sparsity_distribution,
            "dense_first_layer": self.dense_first_layer,
            "custom_sparsity_map": self.custom_sparsity_map,
            "erk_power_scale": self.erk_power_scale,
            "seed": self.seed,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __eq__(self, other):
        return type(self) is type(other) and self.get_config() == other.get_config()

    def __hash__(self):
        return hash(type(self).__name__)

    def __repr__(self):
        defaults = type(self)(0.5, 1).get_config()
        shown = {
            k: v
            for k, v in self.get_config().items()
            if k in ("sparsity", "t_end") or v != defaults[k]
        }
        arguments = ", ".join(f"{k}={v!r}" for k, v in shown.items())
        return f"{type(self).__name__}({arguments})"


@keras.saving.register_keras_serializable(package="maskfit")
class SET(DynamicSparsity):
    """Sparse Evolutionary Training: drop the weakest, grow at random.

    Growth scores are `set_scores` of (seed, step, variable key): uniform,
    the same in every mode and on every replica. See `DynamicSparsity` for
    the arguments.

    Example:

    >>> rule = SET(sparsity=0.9, t_end=3000)
    >>> rule.schedule.update_steps()[:3]
    [99, 199, 299]
    """

    def grow_scores(self, step, variable, weights, gradient):
        del gradient
        return drop_and_grow.set_scores(
            weights.shape, self.seed, step, drop_and_grow.variable_key(variable)
        )


@keras.saving.register_keras_serializable(package="maskfit")
class RigL(DynamicSparsity):
    """Rigging the Lottery: drop the weakest, grow where the dense gradient is largest.

    Growth scores are `|gradient|` of the dense (unmasked) gradient of the
    step's batch, summed over replicas. See `DynamicSparsity` for the
    arguments.

    Example:

    >>> rule = RigL(sparsity=0.9, t_end=3000, drop_fraction_anneal="constant")
    >>> rule.needs_dense_gradients
    True
    """

    needs_dense_gradients = True

    def grow_scores(self, step, variable, weights, gradient):
        del step, weights
        if gradient is None:
            raise ValueError(
                f"RigL grows where the dense gradient is largest, but variable"
                f" '{variable.path}' got no gradient in the step. Check that it"
                " takes part in the loss."
            )
        if isinstance(gradient, tf.IndexedSlices):
            gradient = tf.convert_to_tensor(gradient)
        return tf.math.abs(gradient)
