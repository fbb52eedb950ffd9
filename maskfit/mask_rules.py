"""Masks that a rule recomputes inside the training step (magnitude pruning).

A `MaskRule` declared on a layer with `set_rule` covers some of the layer's
variables (or, for a model or a block of layers, of its sublayers). For each
covered variable `GradientMasker` keeps a *keep* mask as state (bool, the
variable's shape, all True at first). In every training step, before the
forward pass, the rule says whether it updates its masks; when it does, it
computes new keep masks from the weights, the newly dropped entries are set
to +0.0, and from then on a dropped entry is 0 after every step: its gradient
is masked and its value put back to 0 after the update, under any optimizer.
Keep masks compose with the masks declared with `maskfit.set_mask`: an entry
learns only where both allow it, and an entry that `set_mask` freezes is
never dropped (it stays bit-identical).

The rule's Python code is traced into the step once: new keep masks need no
retrace, a new rule object does. A rule that says when its updates end
(`MaskRule.last_update_step`) is left out of steps traced after that, and
one whose only update left is the first step of a call is applied just
before the call, outside the compiled step (`GradientMasker.prepare`). Rules go into the model's config, so saving
and loading a `MaskedModel` keeps them; the keep masks go into its weights.

`maskfit.pruning` is built on this: `prune_low_magnitude` declares a
`MagnitudePruning` rule.
"""

import abc
import collections
import itertools

import keras
import numpy as np
import tensorflow as tf

from maskfit import internals
from maskfit import mask_config
from maskfit import slot_state

__all__ = [
    "MaskRule",
    "RuleGroup",
    "RuleState",
    "get_rule",
    "layer_rules",
    "resolve_rules",
    "rule_version",
    "rules_from_config",
    "rules_to_config",
    "set_rule",
]

_RULE_ATTR = "_maskfit_mask_rule"
_versions = itertools.count(1)
_current_version = [0]


class MaskRule(abc.ABC):
    """Recomputes keep masks of some variables inside the training step.

    Subclasses say which variables they cover, when they update, and what
    they keep; the step does the rest (state, zeroing, masking, restoring).
    `should_update` and `keep_mask` are traced into the compiled step: use
    TensorFlow ops only. Register subclasses with
    `keras.saving.register_keras_serializable` so that models save with them.
    """

    @abc.abstractmethod
    def variables(self, layer):
        """Returns the variables of built `layer` (and its sublayers) the rule covers.

        Raises a ValueError naming the layer when the rule cannot apply to it.
        """

    @abc.abstractmethod
    def should_update(self, step):
        """A scalar bool tensor: whether the keep masks are recomputed in this step.

        Args:
          step: a scalar int64 tensor, the optimizer's `iterations` before
            this step's update (0 in the first step).
        """

    def last_update_step(self):
        """The last optimizer step at which `should_update` can be True, or None.

        Read on the host when the step is planned. Once the optimizer is
        past it, the step is traced without the rule (its keep masks still
        apply); a rule whose only update left is in the first step of a call
        is applied just before that call, outside the compiled step, so a
        rule that updates once at the start (N:M sparsity) costs nothing per
        step. None (the default) keeps the rule in every step. A bound that
        is too early is a silent error: return None when unsure.
        """
        return None

    @abc.abstractmethod
    def keep_mask(self, step, weights, protected):
        """Returns which entries of `weights` are kept (bool, or 0/1 of any dtype).

        Args:
          step: as for `should_update`.
          weights: the variable's value (a tensor of its shape); entries the
            rule dropped before are 0.
          protected: None, or a bool tensor of the weights' shape, True
            where `set_mask` freezes a kept entry: it is kept whatever this
            returns, and should count as kept.
        """

    @abc.abstractmethod
    def get_config(self):
        """Returns the constructor's arguments as plain Python data."""

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __eq__(self, other):
        return type(self) is type(other) and self.get_config() == other.get_config()

    def __hash__(self):
        return hash(type(self).__name__)


def set_rule(layer, rule):
    """Declares `rule` on `layer` (None removes it) and returns `layer`.

    A layer carries at most one rule; a new one replaces the old. The keep
    masks of variables it still covers are kept.

    Raises:
      TypeError: if `layer` is not a Keras layer or `rule` not a `MaskRule`.
    """
    if not isinstance(layer, keras.layers.Layer):
        raise TypeError(
            "set_rule expects a keras.layers.Layer (or keras.Model)."
            f" Received: {layer!r} of type {type(layer).__name__}"
        )
    if rule is not None and not isinstance(rule, MaskRule):
        raise TypeError(
            f"set_rule on layer '{layer.name}' expects a MaskRule or None."
            f" Received: {rule!r} of type {type(rule).__name__}"
        )
    object.__setattr__(layer, _RULE_ATTR, rule)
    _current_version[0] = next(_versions)
    return layer


def get_rule(layer):
    """Returns the `MaskRule` declared on `layer`, or None."""
    return getattr(layer, _RULE_ATTR, None)


def rule_version():
    """Returns a number that changes each time any rule is set or removed."""
    return _current_version[0]


def layer_rules(model):
    """Returns `[(layer, rule)]` for `model` and every layer nested in it.

    Outer layers come before the layers they contain.
    """
    layers = [model] + internals.sublayers(model)
    return [(layer, get_rule(layer)) for layer in layers if get_rule(layer)]


class RuleGroup(collections.namedtuple("RuleGroup", ["layer", "rule", "indices"])):
    """The variables one declared rule covers in a step.

    Attributes:
      layer: the layer the rule is declared on.
      rule: the `MaskRule`.
      indices: positions of the covered variables in the step's list.
    """


def resolve_rules(rules, variables):
    """Resolves `[(layer, rule)]` against the step's `variables`.

    A variable covered by the rules of several layers takes the rule of the
    innermost one (e.g. a layer's own rule over its model's); variables not
    in `variables` (non-trainable ones) are left out.

    Returns:
      A list of `RuleGroup`s, one per declaring layer that covers any of
      `variables`, indices in increasing order.
    """
    position = {id(v): i for i, v in enumerate(variables)}
    owner = {}
    for number, (layer, rule) in enumerate(rules):
        for variable in rule.variables(layer):
            index = position.get(id(variable))
            if index is not None:
                owner[index] = number
    groups = []
    for number, (layer, rule) in enumerate(rules):
        indices = sorted(i for i, n in owner.items() if n == number)
        if indices:
            groups.append(RuleGroup(layer, rule, tuple(indices)))
    return groups


def rules_to_config(model, layer_paths):
    """Returns `{layer path: serialized rule}`; the model's own rule is under ""."""
    config = {}
    if get_rule(model) is not None:
        config[""] = keras.saving.serialize_keras_object(get_rule(model))
    for path, layer in layer_paths.items():
        if get_rule(layer) is not None:
            config[path] = keras.saving.serialize_keras_object(get_rule(layer))
    return config


def rules_from_config(model, config, layer_paths):
    """Sets the rules of `config` (from `rules_to_config`) on `model`, all or none.

    Raises:
      ValueError: naming the entry, when a path names no layer of the model
        or a rule cannot be deserialized.
    """
    checked = []
    for path, serialized in config.items():
        layer = (
            model
            if path == ""
            else mask_config.layer_at(model, layer_paths, path, "mask rules")
        )
        rule = keras.saving.deserialize_keras_object(serialized)
        if not isinstance(rule, MaskRule):
            raise ValueError(
                f"The saved mask rule of layer '{path or model.name}' is not a"
                f" MaskRule: {rule!r}. Register its class with"
                " keras.saving.register_keras_serializable."
            )
        checked.append((layer, rule))
    for layer, rule in checked:
        set_rule(layer, rule)


def _as_keep(mask):
    """`mask` (bool or 0/1 numbers) as a bool tensor."""
    mask = tf.convert_to_tensor(mask)
    return mask if mask.dtype == tf.bool else tf.not_equal(mask, 0)


class RuleState:
    """The rules of one training step: their keep masks, and their update in the step.

    Attributes:
      keeps: `{variable position: keep mask}`, bool `tf.Variable`s of the
        variables' shapes, made outside the step and kept while a rule covers
        the variable.
      groups: the `RuleGroup`s the step applies.
    """

    def __init__(self):
        self.keeps = {}
        self.groups = ()

    def update(self, groups, variables):
        """Makes a keep mask per covered variable, keeping existing ones; True to retrace.

        The step traces each rule's code, so a rule object that changes (or a
        variable that gains or loses one) needs a retrace; new keep values do
        not.
        """
        keeps = {}
        for index in sorted(i for group in groups for i in group.indices):
            keep = self.keeps.get(index)
            if keep is None:
                variable = variables[index]
                keep = tf.Variable(
                    tf.ones(variable.shape, tf.bool),
                    trainable=False,
                    name="keep_" + variable.path.replace("/", "_"),
                    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
                )
            keeps[index] = keep

        def signature(gs):
            return [(id(g.rule), g.indices) for g in gs]

        retrace = set(keeps) != set(self.keeps) or signature(groups) != signature(
            self.groups
        )
        self.keeps, self.groups = keeps, tuple(groups)
        return retrace

    def in_step_from(self, step, prepared):
        """Positions in `groups` of the rules a step traced at optimizer `step` runs.

        Those that may update after `step`, or at it unless `prepared` (the
        caller applies those due at the first step of a call before it, with
        `due_at`). A rule without a bound (`last_update_step()` None) always.
        """
        found = set()
        for number, group in enumerate(self.groups):
            last = group.rule.last_update_step()
            if last is None or last > step or (last == step and not prepared):
                found.add(number)
        return frozenset(found)

    def due_at(self, step, in_step):
        """The rules outside the step (not in `in_step`) that update at `step`.

        Returns their positions in `groups`, or None when one of them may
        update after `step` (the optimizer went back): the step must then be
        traced with it.
        """
        due = set()
        for number, group in enumerate(self.groups):
            if number in in_step:
                continue
            last = group.rule.last_update_step()
            if last is None or last > step:
                return None
            if last == step:
                due.add(number)
        return due

    def indices_of(self, numbers):
        """Positions of the variables the rules at `numbers` (in `groups`) cover."""
        return {i for number in numbers for i in self.groups[number].indices}

    def load(self, values):
        """Assigns keep masks `{position: bool array}`; returns those it has none for."""
        rest = {}
        for index, value in values.items():
            keep = self.keeps.get(index)
            if keep is None or tuple(keep.shape) != np.shape(value):
                rest[index] = value
            else:
                keep.assign(np.asarray(value, bool))
        return rest

    def apply(self, step, variables, frozen, declared, state=None, only=None):
        """In the step: runs each rule that updates at optimizer `step` (traced once).

        A rule that updates gets new keep masks for its variables, and the
        weights it drops are set to +0.0, with the optimizer state listed for
        them in `state`. Under a distribution strategy this runs in
        cross-replica context, and each replica computes the same mask.

        Args:
          step: the optimizer's `iterations` (a variable or tensor).
          variables: the step's `tf.Variable`s, in its order.
          frozen: positions left out of the step (their masks are not updated).
          declared: `{position: (current, frozen_where)}` for variables with a
            declared mask: its state variable, and a function of its value
            that says where it freezes an entry (those are never dropped).
          state: `{position: [variables of its shape]}`, the optimizer state
            whose dropped entries are set to 0 with the weights
            (`maskfit.dropped_entries`); none by default.
          only: positions in `groups` of the rules to run; all by default.
            Called eagerly (outside the step) this runs them at once.
        """
        state = state or {}
        groups = [
            (group.rule, [i for i in group.indices if i not in frozen])
            for number, group in enumerate(self.groups)
            if only is None or number in only
        ]
        groups = [(rule, indices) for rule, indices in groups if indices]
        if not groups:
            return

        def apply_all(distribution):
            value = step.value if isinstance(step, keras.Variable) else step
            current_step = tf.cast(tf.convert_to_tensor(value), tf.int64)
            for rule, indices in groups:

                def update(rule=rule, indices=indices):
                    ops = [
                        self._update_one(
                            distribution,
                            rule,
                            current_step,
                            variables[i],
                            i,
                            declared.get(i),
                            state.get(i, ()),
                        )
                        for i in indices
                    ]
                    with tf.control_dependencies(ops):
                        return tf.constant(True)

                tf.cond(
                    rule.should_update(current_step), update, lambda: tf.constant(False)
                )

        internals.merge_call(apply_all, tf.distribute.get_strategy())

    def settle(self, variables, frozen, state):
        """Sets every dropped entry to +0.0, in the weights and in `state` (eagerly).

        Outside the step, before the first call of a newly traced one: a
        step that relies on the optimizer keeping dropped entries at 0
        (`maskfit.dropped_entries`) needs their state 0, whatever ran before
        (a step under XLA, which zeroes after each update instead, or weights
        set by hand).

        Args:
          variables: the step's `tf.Variable`s, in its order.
          frozen: positions left out of the step.
          state: `{position: [variables of its shape]}`, as for `apply`.
        """
        for index, keep in self.keeps.items():
            if index in frozen:
                continue
            for target in (variables[index],) + tuple(state.get(index, ())):
                target.assign(slot_state.where_masked(target, keep))

    def _update_one(self, distribution, rule, step, variable, index, declared, state):
        """New keep mask for one variable; the weights it drops (and `state`) set to +0.0."""
        keep_variable = self.keeps[index]
        current = () if declared is None else (declared[0],)

        def new_keep(keep, weights, *values):
            weights = tf.convert_to_tensor(weights)
            protected = None
            if values:
                # Entries the declared mask freezes (and that are kept) stay.
                frozen = declared[1](values[0])
                protected = tf.logical_and(
                    tf.broadcast_to(frozen, tf.shape(weights)), keep
                )
            kept = _as_keep(rule.keep_mask(step, weights, protected))
            if protected is not None:
                kept = tf.logical_or(kept, protected)
            return keep.assign(kept)

        def drop(weights, keep):
            return weights.assign(slot_state.where_masked(weights, keep))

        assigned = distribution.extended.update(
            keep_variable, new_keep, args=(variable,) + current, group=False
        )
        dropped = []
        with tf.control_dependencies(tf.nest.flatten(assigned)):
            for target in (variable,) + tuple(state):
                dropped.append(
                    distribution.extended.update(
                        target, drop, args=(keep_variable,), group=False
                    )
                )
        return tf.group(tf.nest.flatten(dropped))
