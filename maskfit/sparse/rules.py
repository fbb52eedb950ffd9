"""`SET` and `RigL`: dynamic sparse training as mask rules, with RigL's names.

A rule covers the prunable weights of the layer it is declared on (a model:
all of them, but those another rule covers), keeps each at the sparsity
`allocate` gives it, starts from `random_keep_mask`s, and after every
`delta_t`-th training step until `t_end` moves a fraction of each weight's
active entries (`UpdateSchedule`): the weakest (smallest |w|) are dropped
and as many are grown where the growth score is largest, a random draw for
SET (Mocanu et al., Nature Communications 2018), the magnitude of the dense
gradient for RigL (Evci et al., ICML 2020). The step (`maskfit.step`) does
the rest: dropped weights and their optimizer state are set to +0.0 and
stay there, grown ones start at +0.0 with a fresh optimizer's state.

When, exactly: the masks move once `t` updates are done, `t` on the
schedule's grid. RigL reads the gradients of training step `t`, so it runs
in that step, after its update (`uses_gradients`); SET needs none and runs
at the start of step `t + 1`, before its forward pass. Both leave the same
state behind: step `t` learned with the old mask, step `t + 1` learns with
the new one. RigL's own code updates after `apply_gradients` of step `t`,
for both methods.
"""

import abc
import numbers

import keras
import tensorflow as tf

from maskfit import paths
from maskfit.sparse import allocation, distributions, drop_and_grow, initial_masks
from maskfit.sparse import schedule as schedule_lib
from maskfit.spec import rules

__all__ = ["DynamicSparsity", "RigL", "SET"]


class DynamicSparsity(rules.MaskRule):
    """What SET and RigL share: the configuration, the masks, the update.

    Args:
      sparsity: the target fraction of zeros over the covered weights, in
        (0, 1) (RigL's `end_sparsity`).
      t_end: the last training step after which connections may move
        (RigL's `maskupdate_end_step`; the paper stops at 75% of training).
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

    Subclasses implement `grow_scores` (and set `uses_gradients = True` to be
    given the step's dense gradient, as `RigL`).

    Example:

    >>> import tensorflow as tf, maskfit.sparse as sparse
    >>> class GrowFirst(sparse.DynamicSparsity):  # grows at the lowest free index
    ...     def grow_scores(self, step, variable, weights, gradient):
    ...         size = tf.size(weights)
    ...         return -tf.reshape(tf.cast(tf.range(size), tf.float32), weights.shape)
    >>> rule = GrowFirst(sparsity=0.5, t_end=1000, delta_t=100, alpha=0.5,
    ...                  drop_fraction_anneal="constant")
    >>> [bool(rule.should_update(step)) for step in (99, 100, 101)]
    [False, True, False]
    >>> moved = rule.update(100, None, tf.constant([0.0, 0.0, 0.4, -0.1]),
    ...                     tf.constant([False, False, True, True]))
    >>> moved.keep.numpy().tolist()  # -0.1 dropped, index 0 grown
    [True, False, True, False]
    """

    regrows = True
    backend_feature = "sparse_training"

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
        self._covered = {}  # id(Keras variable) -> LayerSparsity
        self._keys = {}  # id(its tf.Variable) -> (the tf.Variable, variable_key)

    # Host side: what the rule covers and where it starts.

    def allocation(self, layer):
        """The `LayerSparsity` of each prunable weight of built `layer` it covers.

        Weights that a rule declared on a layer inside `layer` covers (e.g.
        `prune_low_magnitude` on one layer) are left out, budget included.
        """
        claimed = [
            v
            for inner, rule in rules.layer_rules(layer)
            if inner is not layer
            for v in rule.variables(inner)
        ]
        return allocation.allocate(
            layer,
            self.sparsity,
            self.sparsity_distribution,
            self.dense_first_layer,
            self.custom_sparsity_map,
            self.erk_power_scale,
            exclude=claimed,
        )

    def variables(self, layer):
        """The weights the rule moves: those of `allocation` whose sparsity is above 0."""
        entries = [e for e in self.allocation(layer) if e.sparsity > 0]
        for entry in entries:
            self._covered[id(entry.variable)] = entry
            if keras.backend.backend() == "tensorflow":  # its step passes handles
                handle = paths.handle(entry.variable)
                self._keys[id(handle)] = (handle, drop_and_grow.variable_key(entry.key))
        return [e.variable for e in entries]

    def initial_keep_masks(self, variables, frozen):
        """The random masks training starts from (`random_keep_mask`), one per variable.

        Drawn from `seed` and each variable's key, at its allocated sparsity;
        entries `maskfit.set_mask` freezes (`frozen`) are kept and count as
        kept. The step sets the weights outside them to +0.0 before the first
        training step.
        """
        masks = []
        for variable, where in zip(variables, frozen):
            entry = self._entry(variable)
            masks.append(
                initial_masks.random_keep_mask(
                    tuple(variable.shape),
                    entry.sparsity,
                    self.seed,
                    drop_and_grow.variable_key(entry.key),
                    frozen=where,
                )
            )
        return masks

    def last_update_step(self):
        """The last optimizer step whose call moves connections (None: none does)."""
        last = self.schedule.last_update_step()
        return None if last is None else last + self._lag

    # In the step: TensorFlow only.

    # RigL runs after the update of step t (`iterations` is t - 1 then), SET
    # before the forward pass of step t + 1 (`iterations` is t): the schedule
    # counts in the first.
    @property
    def _lag(self):
        return 0 if self.uses_gradients else 1

    def should_update(self, step):
        """Whether the rule moves connections at optimizer step `step` (see the module)."""
        return self.schedule.should_update(tf.cast(step, tf.int64) - self._lag)

    def drop_fraction(self, step):
        """The fraction of active entries moved at optimizer step `step` (0: none)."""
        return self.schedule.drop_fraction(tf.cast(step, tf.int64) - self._lag)

    @abc.abstractmethod
    def grow_scores(self, step, variable, weights, gradient):
        """The growth score of every entry of `variable` (larger grows first)."""

    def update(self, step, variable, weights, keep, gradient=None, frozen=None):
        """Drops and grows the entries of one variable at optimizer step `step`.

        Args:
          step: as for `should_update`.
          variable: a covered variable (Keras or its `tf.Variable`).
          weights: its value (inactive entries 0); for RigL, after the step's
            update.
          keep: its keep mask in force (bool).
          gradient: RigL: its dense gradient in this step, all replicas
            summed, not masked.
          frozen: None or bool: entries that must not move (kept entries
            `maskfit.set_mask` freezes).

        Returns:
          A `drop_and_grow.DropGrow`; its `count` is 0 outside update steps.
        """
        scores = self.grow_scores(step, variable, weights, gradient)
        return drop_and_grow.drop_grow(
            weights, keep, scores, self.drop_fraction(step), frozen=frozen
        )

    def keep_masks(self, step, variables, weights, protected, keeps, gradients=None):
        """The new keep mask of each variable: `update` of each, with its gradient."""
        gradients = [None] * len(variables) if gradients is None else gradients
        return [
            self.update(step, v, w, k, g, p).keep
            for v, w, k, g, p in zip(variables, weights, keeps, gradients, protected)
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

    def _entry(self, variable):
        """The `LayerSparsity` of a variable `variables` returned."""
        entry = self._covered.get(id(variable))
        if entry is None or entry.variable is not variable:
            raise ValueError(
                f"{type(self).__name__} does not cover variable '{variable.path}':"
                " it covers the variables its variables(layer) returned."
            )
        return entry

    def _key(self, variable):
        """`variable_key` of a covered variable, from itself or its `tf.Variable`."""
        found = self._keys.get(id(variable))
        if found is not None and found[0] is variable:
            return found[1]
        if isinstance(variable, keras.Variable):  # what the JAX step passes
            return drop_and_grow.variable_key(self._entry(variable).key)
        raise ValueError(
            f"{type(self).__name__} does not cover variable {variable.name!r}:"
            " it covers the variables its variables(layer) returned."
        )

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

    Growth scores are `set_scores` of (seed, step, the variable's key):
    uniform, the same in every mode, on every replica and after a resume.
    The update runs before the forward pass of the step after an update
    step (see the module). See `DynamicSparsity` for the arguments.

    Example:

    >>> rule = SET(sparsity=0.9, t_end=3000)
    >>> rule.schedule.update_steps()[:3]  # RigL's: after training step 100, ...
    [99, 199, 299]
    >>> rule.last_update_step()  # SET's: at the start of step 2901
    2900
    """

    def grow_scores(self, step, variable, weights, gradient):
        del gradient
        return drop_and_grow.set_scores(
            weights.shape, self.seed, step, self._key(variable)
        )


@keras.saving.register_keras_serializable(package="maskfit")
class RigL(DynamicSparsity):
    """Rigging the Lottery: drop the weakest, grow where the dense gradient is largest.

    Growth scores are `|gradient|` of the dense (unmasked) gradient of the
    update step's batch, summed over replicas (scaled by the loss scale
    under mixed precision, which leaves its order alone). The update runs
    after the step's optimizer update, from the updated weights; a step whose
    gradients are not finite (a loss-scale overflow) moves nothing. See
    `DynamicSparsity` for the arguments.

    Example:

    >>> rule = RigL(sparsity=0.9, t_end=3000, drop_fraction_anneal="constant")
    >>> rule.uses_gradients, rule.last_update_step()
    (True, 2999)
    """

    uses_gradients = True

    def grow_scores(self, step, variable, weights, gradient):
        del step, weights
        if gradient is None:
            raise ValueError(
                "RigL grows where the dense gradient is largest, but variable"
                f" {getattr(variable, 'path', variable.name)!r} got no gradient in"
                " the step. Check that it takes part in the loss."
            )
        if isinstance(gradient, tf.IndexedSlices):
            gradient = tf.convert_to_tensor(gradient)
        return tf.math.abs(gradient)
