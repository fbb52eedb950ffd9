"""`UnitPruning`: the mask rule that removes whole units inside the training step."""

import numbers

import keras
import tensorflow as tf

from maskfit import internals
from maskfit.spec import rules as rules_lib
from maskfit.pruning import importance as importance_lib
from maskfit.pruning import schedules
from maskfit.pruning import unit_choice
from maskfit.pruning import unit_graph

__all__ = ["UnitPruning"]


def _check_options(round_to, min_units, ignored_layers, where):
    if round_to is not None and (
        not isinstance(round_to, numbers.Integral) or isinstance(round_to, bool) or round_to < 1
    ):
        raise ValueError(f"{where}: round_to must be None or a positive integer. Received: {round_to!r}")
    if not isinstance(min_units, numbers.Integral) or isinstance(min_units, bool) or min_units < 1:
        raise ValueError(f"{where}: min_units must be an integer >= 1. Received: {min_units!r}")
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
        self._plans = {}  # id(model) -> (signature, plan, accumulators)

    @property
    def observes_gradients(self):
        return self.importance.needs_gradients

    def plan(self, model):
        """The `UnitPlan` of `model` (its graph built once, while the model is unchanged)."""
        signature = tuple((id(v), tuple(v.shape)) for v in model.weights)
        entry = self._plans.get(id(model))
        if entry is None or entry[0] != signature:
            for layer in internals.sublayers(model):
                if rules_lib.get_rule(layer) is not None:
                    raise ValueError(
                        f"Layer '{layer.name}' of model '{model.name}' has its own mask"
                        f" rule ({rules_lib.get_rule(layer)!r}), which would take its"
                        " variables from unit pruning and leave removed units"
                        " half cut. Remove it (maskfit.pruning.strip_pruning, or"
                        " maskfit.mask_rules.set_rule(layer, None)) before prune_units."
                    )
            graph = unit_graph.DependencyGraph(model, self.ignored_layers)
            plan = unit_choice.UnitPlan(graph)
            accumulators = {}
            if self.importance.needs_gradients and tf.distribute.has_strategy():
                raise ValueError(
                    f"prune_units on model '{model.name}': {self.importance!r} sums"
                    " gradients in state of its own, which is not replica-aware, so it"
                    " cannot run under a tf.distribute strategy. Use"
                    " MagnitudeImportance there."
                )
            if self.importance.needs_gradients:
                with tf.init_scope():
                    for each in plan.variables:
                        accumulators[id(each.variable)] = tf.Variable(
                            tf.zeros(tuple(each.variable.shape), tf.float32),
                            trainable=False,
                            name="taylor_" + each.variable.path.replace("/", "_"),
                        )
            entry = (signature, plan, accumulators)
            self._plans[id(model)] = entry
        return entry[1]

    def _entry_for(self, variables):
        for _, plan, accumulators in self._plans.values():
            if variables and id(variables[0]) in plan.by_id:
                return plan, accumulators
        raise ValueError("UnitPruning was asked for keep masks of variables it never planned.")

    def variables(self, layer):
        return [each.variable for each in self.plan(layer).variables]

    def pruning_step(self, step):
        return tf.cast(step, tf.int64) + 1

    def should_update(self, step):
        return tf.cast(self.pruning_schedule(self.pruning_step(step))[0], tf.bool)

    def last_update_step(self):
        last = self.pruning_schedule.last_pruning_step()
        return None if last is None else int(last) - 1

    def keep_masks(self, step, variables, weights, protected, keeps, gradients=None):
        del keeps, gradients  # a unit, once removed, stays removed: every update
        # ranks the units of the current weights, where removed ones are 0.
        plan, accumulators = self._entry_for(variables)
        fraction = self.pruning_schedule(self.pruning_step(step))[1]
        return self.masks_for(plan, accumulators, fraction, variables, weights, protected)

    def masks_for(self, plan, accumulators, fraction, variables, weights, protected):
        """Keep masks of `variables` at `fraction`, from their values (also used eagerly)."""
        variables = [plan.by_id[id(v)].variable for v in variables]
        scores = {
            id(v): self.importance(v, w, _read(accumulators.get(id(v))))
            for v, w in zip(variables, weights)
        }
        guarded = {
            id(v): tf.cast(p, tf.float32) for v, p in zip(variables, protected) if p is not None
        }
        present = {id(v) for v in variables}
        for each in plan.variables:
            if id(each.variable) not in present:
                # Frozen whole by set_mask: its units stay.
                guarded[id(each.variable)] = tf.ones(tuple(each.variable.shape))
        atom_scores = unit_choice.atom_totals(plan, scores)
        atom_guarded = unit_choice.atom_totals(plan, guarded, scored_only=False) > 0
        keep = unit_choice.choose(
            plan,
            atom_scores,
            atom_guarded,
            fraction,
            self.global_pruning,
            self.round_to,
            self.min_units,
        )
        masks = [unit_choice.keep_mask(plan, keep, v) for v in variables]
        if accumulators:
            with tf.control_dependencies(masks):
                resets = [a.assign(tf.zeros_like(a)) for a in accumulators.values()]
            with tf.control_dependencies(resets):
                masks = [tf.identity(m) for m in masks]
        return masks

    def observe_gradients(self, step, variables, gradients):
        plan, accumulators = self._entry_for(variables)
        last = self.last_update_step()
        for variable, gradient in zip(variables, gradients):
            accumulator = accumulators.get(id(plan.by_id[id(variable)].variable))
            if accumulator is None:
                continue

            def add(accumulator=accumulator, variable=variable, gradient=gradient):
                added = self.importance.accumulate(
                    tf.convert_to_tensor(variable), tf.convert_to_tensor(gradient)
                )
                with tf.control_dependencies(
                    [accumulator.assign_add(tf.cast(added, tf.float32))]
                ):
                    return tf.constant(True)

            if last is None:
                add()
            else:
                tf.cond(tf.cast(step, tf.int64) <= last, add, lambda: tf.constant(False))

    def get_config(self):
        return {
            "pruning_schedule": keras.saving.serialize_keras_object(self.pruning_schedule),
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


def _read(variable):
    return None if variable is None else tf.convert_to_tensor(variable)
