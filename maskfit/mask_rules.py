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
before the call, outside the compiled step (`GradientMasker.prepare`).
Rules go into the model's config, so saving and loading a `MaskedModel`
keeps them; the keep masks go into its weights. `rule_state.RuleState`
holds the keep masks and runs the rules in the step.

`maskfit.pruning` is built on this: `prune_low_magnitude` declares a
`MagnitudePruning` rule.
"""

import abc
import collections
import itertools

import keras

from maskfit import internals
from maskfit import mask_config

__all__ = [
    "MaskRule",
    "RuleGroup",
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
