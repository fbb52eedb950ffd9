"""`UnitPruning`: the mask rule that removes whole units inside the training step."""

import numbers
from typing import NamedTuple

import keras
import tensorflow as tf

from maskfit import internals, paths
from maskfit.spec import pruning_schedule as schedules
from maskfit.spec import rules as rules_lib
from maskfit.structured.graph import dependency as unit_graph
from maskfit.structured.scoring import choice as unit_choice
from maskfit.structured.scoring import importance as importance_lib

__all__ = ["UnitPruning"]


def _check_options(round_to, min_units, ignored_layers, where):
    if round_to is not None and (
        not isinstance(round_to, numbers.Integral)
        or isinstance(round_to, bool)
        or round_to < 1
    ):
        raise ValueError(
            f"{where}: round_to must be None or a positive integer. Received: {round_to!r}"
        )
    if (
        not isinstance(min_units, numbers.Integral)
        or isinstance(min_units, bool)
        or min_units < 1
    ):
        raise ValueError(
            f"{where}: min_units must be an integer >= 1. Received: {min_units!r}"
        )
    names = []
    for item in ignored_layers or ():
        name = item.name if isinstance(item, keras.layers.Layer) else item
        if not isinstance(name, str):
            raise TypeError(
                f"{where}: ignored_layers takes layers or layer names. Received: {item!r}"
            )
        names.append(name)
    return None if round_to is None else int(round_to), int(min_units), tuple(names)


@keras.saving.register_keras_serializable(package="maskfit")
class UnitPruning(rules_lib.MaskRule):
    """Removes a fraction of the units of every group of a model, on a schedule.

    Declared on a functional or Sequential model (`prune_units` does it):
    in training step `n` (the n-th batch, 1-based, as TF-MOT counts) where
    `pruning_schedule(n)` says so, it scores every atom of the model's
    `DependencyGraph` with `importance`, keeps `kept_count` atoms of each
    group (the schedule's sparsity is the fraction of units removed, per
    group), and drops every entry of the others: the units' own weights,
    the input slices of the layers that read them, their normalization
    parameters. Dropped entries are exactly 0 after every step under every
    optimizer (their gradients are masked and their optimizer state
    zeroed), so `shrink` can cut them out.

    Args:
      pruning_schedule: a `PolynomialDecay`, `ConstantSparsity` or other
        `PruningSchedule`, its sparsity the fraction of units removed.
      importance: `MagnitudeImportance(p)` (default p=2), `TaylorImportance()`,
        "l1", "l2", "taylor", or a function `(variable, value) -> scores`.
      global_pruning: rank all groups together (scores divided by their
        group's mean) instead of each group alone.
      round_to: keep a multiple of this many channels per group (not heads).
      min_units: keep at least this many channels per group.
      ignored_layers: layers (or names) whose own units stay.

    Example:

    >>> import keras, numpy as np, maskfit, maskfit.pruning as pruning
    >>> from maskfit import mask_rules
    >>> model = maskfit.MaskedSequential([keras.Input((4,)), keras.layers.Dense(8),
    ...                                   keras.layers.Dense(2)])
    >>> rule = pruning.UnitPruning(pruning.ConstantSparsity(0.25, begin_step=1, end_step=1),
    ...                            importance="taylor", round_to=2)
    >>> rule.observes_gradients  # Taylor scores need the step's gradients
    True
    >>> _ = mask_rules.set_rule(model, rule)  # what prune_units(model, ...) does
    >>> model.compile(optimizer="adam", loss="mse")
    >>> _ = model.fit(np.random.rand(8, 4), np.random.rand(8, 2), batch_size=8, verbose=0)
    >>> maskfit.summary(model, print_fn=None).pruned_params  # 2 units: 2 * (4 + 1 + 2)
    14
    """

    def __init__(
        self,
        pruning_schedule,
        importance="l2",
        global_pruning=False,
        round_to=None,
        min_units=1,
        ignored_layers=(),
    ):
        if not isinstance(pruning_schedule, schedules.PruningSchedule):
            raise TypeError(
                "pruning_schedule must be a maskfit.pruning.PruningSchedule, e.g."
                " maskfit.pruning.PolynomialDecay(0.0, 0.5, 0, 1000, frequency=100)"
                " (its sparsity is the fraction of units removed). Received:"
                f" {pruning_schedule!r}"
            )
        self.pruning_schedule = pruning_schedule
        self.importance = importance_lib.get_importance(importance)
        self.global_pruning = bool(global_pruning)
        self.round_to, self.min_units, self.ignored_layers = _check_options(
            round_to, min_units, ignored_layers, "UnitPruning"
        )
        self._plans = {}  # id(model) -> _Planned

    @property
    def observes_gradients(self):
        return self.importance.needs_gradients

    @property
    def backend_feature(self):
        """`maskfit.support.FEATURES`' row (Taylor importances have their own)."""
        return "taylor_importance" if self.observes_gradients else "structured_rule"

    def plan(self, model):
        """The `UnitPlan` of `model` (its graph built once, while the model is unchanged)."""
        return self._planned(model).plan

    def _planned(self, model):
        signature = tuple((id(v), tuple(v.shape)) for v in model.weights)
        entry = self._plans.get(id(model))
        if entry is None or entry.signature != signature:
            for layer in internals.sublayers(model):
                if rules_lib.get_rule(layer) is not None:
                    raise ValueError(
                        f"Layer '{layer.name}' of model '{model.name}' has its own mask"
                        f" rule ({rules_lib.get_rule(layer)!r}), which would take its"
                        " variables from unit pruning and leave removed units"
                        " half cut. Remove it (maskfit.pruning.strip_pruning, or"
                        " maskfit.mask_rules.set_rule(layer, None)) before prune_units."
                    )
            plan = unit_choice.UnitPlan(
                unit_graph.DependencyGraph(model, self.ignored_layers)
            )
            covered = [each.variable for each in plan.variables]
            sums = (
                _taylor_sums(model, covered) if self.importance.needs_gradients else {}
            )
            sum_of = dict(zip([id(v) for v in covered], sums.values()))
            entry = _Planned(signature, plan, sums, sum_of)
            self._plans[id(model)] = entry
        return entry

    def _entry_for(self, variables):
        for entry in self._plans.values():
            if variables and id(variables[0]) in entry.plan.by_id:
                return entry
        raise ValueError(
            "UnitPruning was asked for keep masks of variables it never planned."
        )

    def variables(self, layer):
        return [each.variable for each in self.plan(layer).variables]

    def state_variables(self, layer):
        """The Taylor sums since the last update (none for other importances), by
        variable key: saved with the model, so a resumed run ranks as an
        uninterrupted one."""
        return dict(self._planned(layer).sums)

    def pruning_step(self, step):
        return tf.cast(step, tf.int64) + 1

    def should_update(self, step):
        return tf.cast(self.pruning_schedule(self.pruning_step(step))[0], tf.bool)

    def last_update_step(self):
        last = self.pruning_schedule.last_pruning_step()
        return None if last is None else int(last) - 1

    def keep_masks(self, step, variables, weights, protected, keeps, gradients=None):
        del gradients  # Taylor scores come from `observe_gradients`, summed.
        entry = self._entry_for(variables)
        fraction = self.pruning_schedule(self.pruning_step(step))[1]
        return self.masks_for(
            entry.plan, entry.sum_of, fraction, variables, weights, protected, keeps
        )

    def masks_for(
        self, plan, sums, fraction, variables, weights, protected, keeps=None
    ):
        """Keep masks of `variables` at `fraction`, from their values (also used eagerly).

        Args:
          plan: the model's `UnitPlan`.
          sums: `{id(Keras variable): tf.Variable}`, Taylor sums (restarted
            here), or empty.
          keeps: the keep masks in force, one per variable, or None: units
            none of whose entries are kept stay removed.
        """
        keep = self.kept_atoms(
            plan, sums, fraction, variables, weights, protected, keeps
        )
        variables = [plan.by_id[id(v)].variable for v in variables]
        masks = [unit_choice.keep_mask(plan, keep, v) for v in variables]
        if sums:
            with tf.control_dependencies(masks):
                resets = [s.assign(tf.zeros_like(s)) for s in sums.values()]
            with tf.control_dependencies(resets):
                masks = [tf.identity(m) for m in masks]
        return masks

    def kept_atoms(
        self, plan, sums, fraction, variables, weights, protected, keeps=None
    ):
        """Which atoms stay (a bool per atom), as `masks_for` chooses them.

        Each variable's scores are made and summed per atom in turn, so no
        more than one variable's scores are held at a time.
        """
        variables = [plan.by_id[id(v)].variable for v in variables]
        scores = _Scores(
            {
                id(v): (lambda v=v, w=w: self.importance(v, w, _read(sums.get(id(v)))))
                for v, w in zip(variables, weights)
            }
        )
        guarded = {
            id(v): tf.cast(p, tf.float32)
            for v, p in zip(variables, protected)
            if p is not None
        }
        present = {id(v) for v in variables}
        for each in plan.variables:
            if id(each.variable) not in present:
                # Frozen whole by set_mask: its units stay.
                guarded[id(each.variable)] = tf.ones(tuple(each.variable.shape))
        alive = None
        if keeps is not None:
            alive = unit_choice.alive_atoms(
                plan, {id(v): tf.cast(k, tf.float32) for v, k in zip(variables, keeps)}
            )
        keep = unit_choice.choose(
            plan,
            unit_choice.atom_totals(plan, scores),
            unit_choice.atom_totals(plan, guarded, scored_only=False) > 0,
            fraction,
            self.global_pruning,
            self.round_to,
            self.min_units,
            alive,
        )
        if alive is not None:
            keep = tf.logical_and(keep, alive)  # a removed unit never comes back
        return keep

    def observe_gradients(self, step, variables, gradients):
        """Adds `|w * g|` to the Taylor sums, until the schedule's last update.

        Under a distribution strategy, each replica's gradients are summed
        over the replicas first (the global batch's gradient, as on one
        device) and every replica adds the same values.
        """
        entry = self._entry_for(variables)
        totals = [
            entry.sum_of.get(id(entry.plan.by_id[id(v)].variable)) for v in variables
        ]
        pairs = [
            (v, g, t) for v, g, t in zip(variables, gradients, totals) if t is not None
        ]
        if not pairs:
            return
        last = self.last_update_step()
        added = [tf.convert_to_tensor(g) for _, g, _ in pairs]
        context = tf.distribute.get_replica_context()
        if context is not None and context.num_replicas_in_sync > 1:
            # The global batch's gradient (outside any cond: a sync point).
            added = context.all_reduce(tf.distribute.ReduceOp.SUM, added)

        # Past the last update the sums no longer count: nothing is added.
        # (A factor, not a cond: under a strategy, assigning is a sync point.)
        live = (
            1.0
            if last is None
            else tf.cast(tf.cast(step, tf.int64) <= last, tf.float32)
        )
        for (variable, _, total), gradient in zip(pairs, added):
            score = self.importance.accumulate(tf.convert_to_tensor(variable), gradient)
            total.assign_add(tf.cast(score, tf.float32) * live)

    def gradient_sums(self, variables):
        """The Taylor sums `observe_gradients` adds to, one per variable (None
        for one it does not sum), for a step that carries them as values (JAX)."""
        entry = self._entry_for(variables)
        return [
            entry.sum_of.get(id(entry.plan.by_id[id(v)].variable)) for v in variables
        ]

    def added_by_gradient(self, step, value, gradient):
        """What `observe_gradients` adds to one variable's sum at optimizer
        `step`, in `keras.ops` (no state): `|w * g|`, or 0 past the last update."""
        score = keras.ops.cast(self.importance.accumulate(value, gradient), "float32")
        last = self.last_update_step()
        if last is None:
            return score
        live = keras.ops.less_equal(step, last)
        return score * keras.ops.cast(live, "float32")

    def get_config(self):
        return {
            "pruning_schedule": keras.saving.serialize_keras_object(
                self.pruning_schedule
            ),
            "importance": importance_lib.serialize(self.importance),
            "global_pruning": self.global_pruning,
            "round_to": self.round_to,
            "min_units": self.min_units,
            "ignored_layers": list(self.ignored_layers),
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["pruning_schedule"] = keras.saving.deserialize_keras_object(
            config["pruning_schedule"]
        )
        config["importance"] = importance_lib.deserialize(config["importance"])
        return cls(**config)

    def __repr__(self):
        return f"UnitPruning({self.pruning_schedule!r}, importance={self.importance!r})"


class _Planned(NamedTuple):
    """A model's plan: the weights it was made for, the `UnitPlan`, the Taylor sums."""

    signature: tuple
    plan: object
    sums: dict  # {variable key: tf.Variable}, for TaylorImportance
    sum_of: dict  # the same sums by id() of the Keras variable


class _Scores:
    """`{id(variable): scores}` made when asked (`get`), one variable at a time."""

    def __init__(self, makers):
        self._makers = makers

    def get(self, key):
        maker = self._makers.get(key)
        return None if maker is None else maker()


def _read(variable):
    return None if variable is None else tf.convert_to_tensor(variable)


def _taylor_sums(model, variables):
    """One float32 sum per variable, by variable key, made in the model's strategy.

    Every replica adds the same (summed) values: the first replica's are
    kept (`ONLY_FIRST_REPLICA`).
    """
    keys = paths.variable_keys(model, variables)
    # Keras models have a strategy on TensorFlow only (JAX: the default one).
    strategy = (
        getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()
    )
    with tf.init_scope(), strategy.scope():
        return {
            key: tf.Variable(
                tf.zeros(tuple(v.shape), tf.float32),
                trainable=False,
                name="taylor_" + key.replace("/", "_"),
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )
            for key, v in zip(keys, variables)
        }
