"""Masks that a rule recomputes inside the training step (magnitude pruning).

A `MaskRule` declared on a layer with `set_rule` covers some of the layer's
variables (or, for a model or a block of layers, of its sublayers). For each
covered variable the step keeps a *keep* mask as state (bool, the variable's
shape, all True at first; `maskfit.step.rules.keeps`). In every training step,
before the forward pass, the rule says whether it updates its masks; when it
does, it computes new keep masks from the weights, the newly dropped entries
are set to +0.0, and from then on a dropped entry is 0 after every step: its
gradient is masked and its value put back to 0 after the update, under any
optimizer. Keep masks compose with the masks declared with `maskfit.set_mask`:
an entry learns only where both allow it, and an entry that `set_mask` freezes
is never dropped (it stays bit-identical).

The rule's Python code is traced into the step once: new keep masks need no
retrace, a new rule object does. A rule that says when its updates end
(`MaskRule.last_update_step`) is left out of steps traced after that, and
one whose only update left is the first step of a call is applied just
before the call, outside the compiled step. Rules go into the model's config
(`maskfit.spec.config`), so saving and loading a `MaskedModel` keeps them;
the keep masks go into its weights.

`maskfit.pruning` is built on this: `prune_low_magnitude` declares a
`MagnitudePruning` rule.
"""

import abc
import collections

import keras

from maskfit import checks, internals, support
from maskfit.spec import version
from maskfit.spec.config_value import ConfigValue

__all__ = [
    "MaskRule",
    "RuleGroup",
    "checked_last_step",
    "get_rule",
    "last_update_of",
    "layer_rules",
    "resolve_rules",
    "restore_rule",
    "set_rule",
]

_RULE_ATTR = "_maskfit_mask_rule"
_NO_KEEP = (
    "The mask rule {name} says no keep masks: override keep_mask(step, weights,"
    " protected), or keep_masks(step, variables, weights, protected, gradients)."
)


class MaskRule(ConfigValue, abc.ABC):
    """Recomputes keep masks of some variables inside the training step.

    Subclasses say which variables they cover, when they update, and what
    they keep (`keep_mask` per variable, or `keep_masks` for all of them at
    once); the step does the rest (state, zeroing, masking, restoring).
    Register subclasses with `keras.saving.register_keras_serializable` so
    that models save with them.

    Write `should_update` and `keep_mask(s)` with `keras.ops` (or NumPy-
    compatible code) and the rule runs on both backends:

    - TensorFlow: they are traced into the compiled step and given `tf`
      tensors (and `tf.Variable`s as `variables`); TensorFlow ops work too.
    - JAX: they run eagerly on the host, before the step of an update (after
      it, with the gradients, for `uses_gradients`), and are given NumPy
      arrays: `step` a NumPy int64 scalar, `weights`, `protected`, `keeps`
      and `gradients` arrays of the variables' shapes. `variables` are the
      Keras variables, for their shape, path and identity: read values from
      `weights` (during `fit` the JAX trainer holds them outside the
      variables). They may return any array (NumPy, JAX, TensorFlow).
      `should_update` is evaluated for 1024 steps at a time (one compiled
      TensorFlow call when it is written in TensorFlow ops), so it must
      depend on `step` alone. TensorFlow ops work there too (TensorFlow
      takes NumPy arrays); `observes_gradients` is TensorFlow-only
      (`maskfit.support.FEATURES`).

    State of the rule's own (`state_variables`) may be `keras.Variable`s or
    `tf.Variable`s; under JAX it is assigned on the host.
    A rule is its configuration: equal to another of its class with the same
    `get_config()`, printed as the call that makes it (`ConfigValue`).

    Three class attributes say what else a rule needs from the step (all off
    by default, so a rule that needs none costs nothing more):

    - `uses_gradients`: its updates read the step's gradients (RigL grows
      where they are largest): it updates after the step's update, and
      `keep_masks` gets them; an entry it grows starts at 0 in the next step.
    - `observes_gradients`: it sees its variables' gradients in every step
      (`observe_gradients`), e.g. to accumulate importance scores.
    - `regrows`: an update can keep entries it dropped before (dynamic
      sparse training): they start at 0, with their optimizer state as a
      fresh optimizer's (`maskfit.optim.traits.fresh_state`).
    """

    uses_gradients = False
    observes_gradients = False
    regrows = False
    # The row of `maskfit.support.FEATURES` that says on which Keras backends
    # the rule runs; `set_rule` (and so loading a model) refuses it elsewhere.
    backend_feature = "custom_rules"

    def initial_keep_masks(self, variables, frozen):
        """The keep masks the rule starts from, one per covered variable, or None.

        Read on the host when the step first makes the rule's keep masks
        (loaded ones replace them): sparse training starts sparse. Entries it
        drops are set to +0.0 before the first step; entries `set_mask`
        freezes are kept whatever it returns. None (the default) keeps every
        entry.

        Args:
          variables: the covered variables (Keras variables), in the step's
            order.
          frozen: per variable, a bool array of its shape, True where a
            declared mask freezes the entry (or None when none does).
        """
        return None

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

    def keep_mask(self, step, weights, protected):
        """Returns which entries of `weights` are kept (bool, or 0/1 of any dtype).

        Override this, or `keep_masks` for a rule that decides for all its
        variables together.

        Args:
          step: as for `should_update`.
          weights: the variable's value (a tensor of its shape); entries the
            rule dropped before are 0.
          protected: None, or a bool tensor of the weights' shape, True
            where `set_mask` freezes a kept entry: it is kept whatever this
            returns, and should count as kept.
        """
        raise TypeError(_NO_KEEP.format(name=type(self).__name__))

    def keep_masks(self, step, variables, weights, protected, keeps, gradients=None):
        """Returns one keep mask per variable, for a step that updates.

        The default calls `keep_mask` for each variable. A rule whose masks
        depend on several variables at once (structured pruning: a unit's
        entries lie in several layers) overrides this. Every variable's value
        is read before any keep mask is assigned, so no variable sees another
        one already pruned in this update.

        Args:
          step: as for `should_update`.
          variables: the covered variables the step updates (`tf.Variable`s:
            `keras_variable.value`), in the step's order; a variable whose
            declared mask freezes it whole is left out.
          weights: their values, one tensor each.
          protected: one entry per variable, as for `keep_mask`.
          keeps: the keep masks in force (bool tensors), one per variable: a
            kept entry may be exactly 0 (one that just grew back).
          gradients: for a rule that `uses_gradients`, the variables' dense
            gradients in this step (summed over replicas, of the loss as
            `optimizer.scale_loss` scaled it, not masked); else None. The
            weights are then those after the step's update.
        """
        return [self.keep_mask(step, w, p) for w, p in zip(weights, protected)]

    def observe_gradients(self, step, variables, gradients):  # noqa: B027 (optional hook)
        """In every training step: the covered variables' gradients, before masking.

        Called only for a rule whose `observes_gradients` is True, right
        after the gradients are computed (e.g. to accumulate first-order
        Taylor scores into the rule's own variables). Variables without a
        gradient in this step are left out.

        Args:
          step: the optimizer's `iterations` before this step's update.
          variables: the covered variables that have a gradient.
          gradients: their gradients, of the loss as `optimizer.scale_loss`
            scaled it, not masked (per replica under a strategy).
        """

    def state_variables(self, layer):
        """The rule's own state on built `layer`: `{name: tf.Variable}`, saved with the model.

        A rule that carries values from one step to the next in variables of
        its own (e.g. importance scores summed since its last update)
        returns them here, made when first asked. A masked model's weights
        file holds their values beside the keep masks (so `model.save`,
        `save_weights` and `BackupAndRestore` keep them), and loading assigns
        them: asked on the loading model, the rule makes its state there
        first. Names are plain strings, stable across processes (e.g. by
        variable key, `maskfit.paths.variable_keys`). None by default.

        Args:
          layer: the layer the rule is declared on.
        """
        return {}

    @abc.abstractmethod
    def get_config(self):
        """Returns the constructor's arguments as plain Python data."""


def set_rule(layer, rule):
    """Declares `rule` on `layer` (None removes it) and returns `layer`.

    A layer carries at most one rule; a new one replaces the old. The keep
    masks of variables it still covers are kept.

    Raises:
      TypeError: if `layer` is not a Keras layer or `rule` not a `MaskRule`.
      NotImplementedError: if the rule does not run on this Keras backend
        (`maskfit.support.FEATURES`).
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
    cls = type(rule)
    if rule is not None and (
        cls.keep_mask is MaskRule.keep_mask and cls.keep_masks is MaskRule.keep_masks
    ):
        raise TypeError(_NO_KEEP.format(name=cls.__name__))
    if rule is not None:
        support.require(
            _backend_feature(rule), f"a {cls.__name__} rule on layer '{layer.name}'"
        )
    return restore_rule(layer, rule)


def _backend_feature(rule):
    """The `FEATURES` row of a rule (its `backend_feature`, which may depend on
    its configuration, e.g. a unit rule's importance).

    A user's subclass of one of maskfit's rules does not inherit its backends:
    it is a rule of its own unless it sets `backend_feature` itself.
    """
    cls = type(rule)
    if "backend_feature" in cls.__dict__ or cls.__module__.startswith("maskfit."):
        return rule.backend_feature
    return "custom_rules"


def restore_rule(layer, rule):
    """Puts a checked `rule` (or None) on `layer`, on any backend; returns `layer`.

    What loading a saved model does: a rule this backend cannot run still
    comes back with the model, which then evaluates, predicts and strips
    (`maskfit.pruning.strip_pruning`); training it is refused by `fit`.
    """
    internals.set_untracked(layer, _RULE_ATTR, rule)
    version.bump()
    return layer


def get_rule(layer):
    """Returns the `MaskRule` declared on `layer`, or None."""
    return getattr(layer, _RULE_ATTR, None)


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


def checked_last_step(value, where):
    """`value` (a rule's or schedule's last step) as None or an int, else a TypeError.

    Args:
      value: what was returned.
      where: what returned it, for the error, e.g. "PolynomialDecay.last_pruning_step()".
    """
    if value is None:
        return None
    if checks.is_integer(value):
        return int(value)
    raise TypeError(
        f"{where} must return None or an integer, the last optimizer step at"
        f" which it can update. Received: {value!r} of type {type(value).__name__}."
        " Return None when there is no known last step."
    )


def last_update_of(group):
    """The group's `rule.last_update_step()`: None or an int, else a TypeError."""
    return checked_last_step(
        group.rule.last_update_step(),
        f"The mask rule {type(group.rule).__name__} on layer '{group.layer.name}':"
        " last_update_step()",
    )
