"""Structured pruning's entry points: `prune_units` (in `fit`), `select_units` (one-shot)."""

from typing import NamedTuple

import keras
import numpy as np
import tensorflow as tf

from maskfit import model as model_lib
from maskfit import support
from maskfit.model import conversion
from maskfit.spec import pruning_schedule as schedules
from maskfit.spec import rules as rules_lib
from maskfit.structured import rule as unit_rule
from maskfit.structured.graph import dependency as unit_graph
from maskfit.structured.graph import keras_graph
from maskfit.structured.scoring import choice as unit_choice
from maskfit.structured.scoring import taylor

__all__ = ["UnitSelection", "prune_units", "select_units", "unit_selection"]


def prune_units(
    model,
    pruning_schedule=None,
    importance="l2",
    global_pruning=False,
    round_to=None,
    min_units=1,
    ignored_layers=(),
):
    """Removes whole units (neurons, filters, heads) of a model while it trains.

    The structured counterpart of `prune_low_magnitude`: the model's
    `DependencyGraph` groups the entries that go with each unit (its own
    weights, the input slices of every layer that reads it, normalization
    parameters, channels joined by residual adds), and a `UnitPruning` rule
    drops the least important units of each group inside the compiled
    training step, on `pruning_schedule` (its sparsity is the fraction of
    each group's units removed, as Torch-Pruning's `pruning_ratio`). Dropped
    entries are exactly 0 after every step under every optimizer; when
    training is done, `shrink` cuts them out into a smaller stock Keras model
    whose outputs equal the pruned model's.

    For one-shot pruning of a trained model followed by fine-tuning, use
    `ConstantSparsity(fraction, begin_step=1, end_step=1)`: the units go
    before the first step, chosen from the trained weights (or
    `select_units` and `shrink` to fine-tune the smaller model instead).

    Args:
      model: a functional or built Sequential `keras.Model` (a `MaskedModel`
        is pruned in place; a plain model gives a `MaskedModel` /
        `MaskedSequential` with the same layers).
      pruning_schedule: a `PruningSchedule`; by default
        `ConstantSparsity(0.5, begin_step=0)`.
      importance: see `UnitPruning`.
      global_pruning, round_to, min_units, ignored_layers: see `UnitPruning`.

    Returns:
      The model to compile and fit.

    Raises:
      ValueError: for a subclassed model (its call() cannot be read), an
        unbuilt one, or a layer with its own mask rule.

    Example:

    >>> import keras, maskfit.pruning as pruning
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8),
    ...                           keras.layers.Dense(2)])
    >>> pruned = pruning.prune_units(
    ...     model, pruning.PolynomialDecay(0.0, 0.5, 0, 100, frequency=10))
    >>> type(pruned).__name__
    'MaskedSequential'
    """
    if pruning_schedule is None:
        pruning_schedule = schedules.ConstantSparsity(0.5, begin_step=0)
    rule = unit_rule.UnitPruning(
        pruning_schedule,
        importance,
        global_pruning,
        round_to,
        min_units,
        ignored_layers,
    )
    support.require(rule.backend_feature, "prune_units")
    _check_model(model, "prune_units")
    masked = conversion.masked_model(model)
    rule.origin = origin_of(model)
    rule.plan(masked)
    rules_lib.set_rule(masked, rule)
    return masked


def _check_model(model, where):
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"{where} expects a functional or Sequential keras.Model. Received:"
            f" {model!r} of type {type(model).__name__}"
        )
    if not keras_graph.is_graph_model(model) or not model.built:
        raise ValueError(
            f"{where} cannot prune model '{model.name}' ({type(model).__name__}):"
            " structured pruning reads the model's layer graph, which only a"
            " functional model or a built Sequential model has (a subclassed"
            " model's call() is Python code, and an unbuilt Sequential has no"
            " graph yet). Build it with keras.Input and the functional API, or"
            " start the Sequential with keras.Input(shape)."
        )


def origin_of(model):
    """The model `model` was made from by `prune_units` (itself if none)."""
    rule = rules_lib.get_rule(model)
    return getattr(rule, "origin", None) or model


class UnitSelection(NamedTuple):
    """Which units of a model stay: a bool per atom of its `DependencyGraph`.

    Made by `select_units` (one-shot), `unit_selection` (read from a pruned
    model's keep masks) or `UnitSelection.removing` (units named by hand);
    `shrink` cuts the others out.

    Example:

    >>> import keras, maskfit.pruning as pruning
    >>> inputs = keras.Input((4,))
    >>> hidden = keras.layers.Dense(8, name="hidden")(inputs)
    >>> model = keras.Model(inputs, keras.layers.Dense(2, name="head")(hidden))
    >>> selection = pruning.UnitSelection.removing(model, {"hidden": [0, 5]})
    >>> selection.removed()
    {'hidden': {'units': [0, 5]}}
    >>> small = pruning.shrink(model, selection)
    >>> small.get_layer("hidden").units, tuple(small.get_layer("head").kernel.shape)
    (6, (6, 2))
    """

    graph: object
    kept: np.ndarray

    @classmethod
    def removing(cls, model_or_graph, units):
        """The selection that removes `units`: `{layer name: [unit index, ...]}`.

        A unit index is a position in the layer's units (for
        MultiHeadAttention, `{"name": {"heads": [...], "units": [...]}}`).
        Everything joined to a removed unit goes too.

        Raises:
          ValueError: naming the unit and why, when it cannot be removed.
        """
        graph = _graph(model_or_graph)
        kept = np.ones(graph.num_atoms, bool)
        for name, chosen in units.items():
            named = chosen if isinstance(chosen, dict) else {"units": chosen}
            for space_name, indices in named.items():
                space = next(
                    (
                        s
                        for s in graph.spaces
                        if s.layer.name == name and s.name == space_name
                    ),
                    None,
                )
                if space is None:
                    known = any(l.name == name for l in graph._layers.values())
                    raise ValueError(
                        f"UnitSelection.removing: model '{graph.model.name}' has no"
                        f" {space_name} of a layer '{name}'."
                        + (f" What it has:\n{graph.explain(name)}" if known else "")
                    )
                for index in indices:
                    if not 0 <= int(index) < space.size:
                        raise ValueError(
                            f"UnitSelection.removing: layer '{name}' has {space.size}"
                            f" {space_name}, numbered from 0. Received: {index!r}"
                        )
                    atom = graph.atoms_of([space.first + int(index)])[0]
                    if atom < 0:
                        reasons = "; ".join(
                            graph.reasons_of([space.first + int(index)])
                        )
                        raise ValueError(
                            f"Unit {index} of layer '{name}' cannot be removed: {reasons}."
                        )
                    kept[atom] = False
        for group in graph.groups:
            if len(group.atoms) and not kept[group.atoms].any():
                raise ValueError(
                    f"UnitSelection.removing would remove every unit of layers"
                    f" {list(group.layers)}, which would leave them without units."
                    " Keep at least one."
                )
        problems = graph.avoided_counts(kept)
        if problems:
            raise ValueError(
                f"UnitSelection.removing: {problems[0]}. Remove one unit more or fewer."
            )
        return cls(graph, kept)

    def removed(self):
        """`{layer name: {space name: [unit index, ...]}}` of the removed units."""
        found = {}
        for space in self.graph.spaces:
            positions = ~self.graph.kept_positions(space.ids, self.kept)
            if positions.any():
                found.setdefault(space.layer.name, {})[space.name] = np.flatnonzero(
                    positions
                ).tolist()
        return found


def _graph(model_or_graph):
    if isinstance(model_or_graph, unit_graph.DependencyGraph):
        return model_or_graph
    _check_model(model_or_graph, "UnitSelection")
    return unit_graph.DependencyGraph(model_or_graph)


def select_units(
    model,
    pruning_ratio,
    importance="l2",
    global_pruning=False,
    round_to=None,
    min_units=1,
    ignored_layers=(),
    data=None,
    loss=None,
    batch_size=32,
):
    """One-shot: chooses the units to remove from a model's current weights.

    Counts, ranks and rounds as `prune_units` does in a step; nothing is
    changed. `shrink(model, selection)` then makes the smaller model to
    fine-tune.

    Args:
      model: a functional or built Sequential model.
      pruning_ratio: the fraction of each group's units to remove, in [0, 1).
      importance: as for `prune_units`; `TaylorImportance` needs `data`.
      data: `(x, y)` arrays, for `TaylorImportance`: its scores are summed
        over these batches, with the gradients training takes
        (`training=True`; the model's moving statistics are put back after).
      loss: a Keras loss (name or object) for `TaylorImportance`.
      batch_size: the batch size over `data`.
      global_pruning, round_to, min_units, ignored_layers: as for `prune_units`.

    Returns:
      A `UnitSelection`.

    Example:

    >>> import keras, maskfit.pruning as pruning
    >>> inputs = keras.Input((4,))
    >>> hidden = keras.layers.Dense(8, name="hidden")(inputs)
    >>> model = keras.Model(inputs, keras.layers.Dense(2)(hidden))
    >>> selection = pruning.select_units(model, 0.5)
    >>> len(selection.removed()["hidden"]["units"])
    4
    """
    support.require("structured_oneshot", "select_units")
    _check_model(model, "select_units")
    if not isinstance(pruning_ratio, (int, float)) or not 0 <= pruning_ratio < 1:
        raise ValueError(
            f"select_units pruning_ratio must be a number in [0, 1). Received: {pruning_ratio!r}"
        )
    rule = unit_rule.UnitPruning(
        schedules.ConstantSparsity(pruning_ratio, 0),
        importance,
        global_pruning,
        round_to,
        min_units,
        ignored_layers,
    )
    plan = unit_choice.UnitPlan(unit_graph.DependencyGraph(model, rule.ignored_layers))
    variables = [each.variable for each in plan.variables]
    accumulated = {}
    if rule.importance.needs_gradients:
        support.require("taylor_importance", "select_units")
        accumulated = taylor.one_shot_sums(
            model, variables, rule.importance, data, loss, batch_size
        )
    weights = [tf.convert_to_tensor(v) for v in variables]
    keep = rule.kept_atoms(
        plan,
        accumulated,
        float(pruning_ratio),
        variables,
        weights,
        [None] * len(variables),
    )
    # Read back from each variable's keep mask in turn (never all at once).
    return UnitSelection(
        plan.graph, unit_choice.kept_atoms_from(plan, _Masks(plan, keep))
    )


class _Masks:
    """`{id(variable): keep mask}` of the kept atoms `keep`, made when asked."""

    def __init__(self, plan, keep):
        self._plan, self._keep = plan, keep

    def get(self, key):
        each = self._plan.by_id.get(key)
        if each is None:
            return None
        return unit_choice.keep_mask(self._plan, self._keep, each.variable).numpy()


def unit_selection(model):
    """The units a model pruned with `prune_units` has removed so far.

    Read from its keep masks: a unit is removed when every entry that goes
    with it is dropped. A model that has not trained yet removed none.

    Raises:
      ValueError: if `model` carries no `UnitPruning` rule.

    Example:

    >>> import keras, numpy as np, maskfit.pruning as pruning
    >>> inputs = keras.Input((4,))
    >>> hidden = keras.layers.Dense(8, name="hidden")(inputs)
    >>> model = pruning.prune_units(keras.Model(inputs, keras.layers.Dense(2)(hidden)),
    ...                             pruning.ConstantSparsity(0.5, begin_step=1, end_step=1))
    >>> pruning.unit_selection(model).removed()  # before training: none yet
    {}
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> _ = model.fit(np.ones((8, 4)), np.ones((8, 2)), batch_size=8, verbose=0)
    >>> len(pruning.unit_selection(model).removed()["hidden"]["units"])
    4
    >>> pruning.shrink(model, pruning.unit_selection(model)).get_layer("hidden").units
    4
    """
    rule = rules_lib.get_rule(model)
    if not isinstance(rule, unit_rule.UnitPruning):
        raise ValueError(
            f"Model '{model.name}' is not pruned with prune_units (its rule is"
            f" {rule!r}). Pass a UnitSelection (select_units) to shrink it."
        )
    plan = rule.plan(model)
    trainable = model_lib.all_trainable_variables(model)
    keeps = {id(trainable[i]): keep for i, keep in model_lib.keep_masks(model).items()}
    return UnitSelection(plan.graph, unit_choice.kept_atoms_from(plan, keeps))
