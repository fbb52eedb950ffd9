"""`prune_low_magnitude` and `strip_pruning`: TF-MOT's entry points, for Keras 3."""

import copy

import keras

from maskfit import internals, support
from maskfit.model.conversion import PrunedModel, masked_model
from maskfit.pruning import registry
from maskfit.pruning import rule as rule_lib
from maskfit.spec import pruning_schedule as schedules
from maskfit.spec import rules as mask_rules

# `PrunedModel` and `masked_model` live in `maskfit.model.conversion`; their
# import path of 0.1.0 stays.

__all__ = ["PrunedModel", "masked_model", "prune_low_magnitude", "strip_pruning"]


def prune_low_magnitude(
    to_prune,
    pruning_schedule=None,
    block_size=(1, 1),
    block_pooling_type="AVG",
    pruning_policy=None,
    sparsity_m_by_n=None,
    **kwargs,
):
    """Prunes the kernels and embeddings of a model or layers by magnitude, in `fit`.

    `tfmot.sparsity.keras.prune_low_magnitude` for Keras 3, without wrapper
    layers: layer names, weights and weight paths stay as they are, and the
    pruning happens inside the compiled training step of a `MaskedModel`, at
    the steps `pruning_schedule` names (training step n is the n-th batch,
    counted from the optimizer's `iterations`, as TF-MOT counts it). No
    callback is needed. Pruned weights are exactly 0 after every step, under
    every optimizer and setting (weight decay, momentum, EMA): their gradient
    is masked and their value put back to 0 after each update, so their
    optimizer history cannot move them. Masks set with `maskfit.set_mask`
    compose: entries they freeze are never pruned.

    Which variables are pruned follows TF-MOT's registry (`prunable_weights`):
    kernels and embeddings, never biases or normalization parameters; custom
    layers say theirs with `get_prunable_weights()`.

    Args:
      to_prune: a model (functional, Sequential or subclassed, built or not),
        a layer, or a list of layers.
        - A `maskfit.MaskedModel` (or `MaskedSequential`, or a subclass) is
          pruned and returned.
        - A plain `keras.Sequential` or functional `keras.Model` gives a
          `MaskedSequential` / `MaskedModel` with the same layers and weights.
        - A subclassed `keras.Model` gives a `PrunedModel` that runs it.
        - A layer (or each layer of a list) gets the pruning declared on it
          and is returned; build the model that uses it with `MaskedModel` or
          `MaskedSequential` (a plain `keras.Model` ignores it), or pass the
          model here afterwards. A layer's own pruning takes precedence over
          its model's.
      pruning_schedule: a `PruningSchedule`; by default
        `ConstantSparsity(0.5, begin_step=0)`, as TF-MOT.
      block_size: `(height, width)`: prune blocks of a 2-D weight together.
      block_pooling_type: "AVG" or "MAX": how a block's magnitude is pooled.
      pruning_policy: not supported (must be None).
      sparsity_m_by_n: `(m, n)`, e.g. `(2, 4)`: in every n consecutive
        entries along the input-channel axis, prune the m smallest, once, in
        step 1 (the schedule is not used then, as in TF-MOT).
      **kwargs: not supported (TF-MOT passes them to its wrapper layers).

    Returns:
      The pruned model, layer, or list of layers (see `to_prune`).

    Raises:
      TypeError: for a `to_prune` that is not a model or layers, or a bad
        schedule.
      NotImplementedError: on a Keras backend that does not run it in `fit`
        (`maskfit.support.FEATURES`).
      ValueError: for bad `block_size`, `block_pooling_type` or
        `sparsity_m_by_n`, a `pruning_policy`, or a layer the registry
        refuses (the error names it and says how to fix it; layers that are
        not built yet are checked when training builds them).

    Example:

    >>> import keras, maskfit.pruning as pruning
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8),
    ...                           keras.layers.Dense(2)])
    >>> pruned = pruning.prune_low_magnitude(
    ...     model, pruning_schedule=pruning.PolynomialDecay(0.0, 0.5, 0, 100))
    >>> type(pruned).__name__
    'MaskedSequential'
    """
    support.require("magnitude_pruning", "prune_low_magnitude")
    if pruning_policy is not None:
        raise ValueError(
            "prune_low_magnitude does not support pruning_policy (TF-MOT's"
            " PruneForLatencyOnXNNPack). Prune the layers you want by passing"
            " them (or a list of them) instead of the model."
            f" Received: pruning_policy={pruning_policy!r}"
        )
    if kwargs:
        raise TypeError(
            f"prune_low_magnitude got unexpected arguments {sorted(kwargs)}. It"
            " adds no wrapper layers, so TF-MOT's wrapper arguments do not apply."
        )
    if pruning_schedule is None:
        pruning_schedule = schedules.ConstantSparsity(0.5, begin_step=0)
    rule = rule_lib.MagnitudePruning(
        pruning_schedule, block_size, block_pooling_type, sparsity_m_by_n
    )
    if isinstance(to_prune, (list, tuple)):
        layers = list(to_prune)
        bad = [x for x in layers if not isinstance(x, keras.layers.Layer)]
        if bad or not layers:
            raise TypeError(
                "prune_low_magnitude takes a model, a layer or a non-empty list of"
                f" layers. Received a list with {bad or 'nothing'}."
            )
        for layer in layers:
            _check(rule, layer)
        for layer in layers:
            mask_rules.set_rule(layer, rule)
        return layers
    if isinstance(to_prune, keras.Model):
        model = masked_model(to_prune)
        _check(rule, model)
        mask_rules.set_rule(model, rule)
        return model
    if isinstance(to_prune, keras.layers.Layer):
        _check(rule, to_prune)
        return mask_rules.set_rule(to_prune, rule)
    raise TypeError(
        "prune_low_magnitude takes a keras.Model, a keras.layers.Layer or a list"
        f" of layers. Received: {to_prune!r} of type {type(to_prune).__name__}"
    )


def _check(rule, layer):
    """Raises now what can be told now: fully for built layers."""
    if layer.built:
        rule.variables(layer)
        return
    entry = registry.classify(type(layer))
    if entry.kind == "unsupported":
        raise ValueError(
            f"Layer '{layer.name}' ({type(layer).__name__}) cannot be pruned:"
            f" {entry.reason}."
        )


def strip_pruning(model):
    """Returns a model without pruning, its pruned weights zeros, for export.

    - A functional or Sequential model gives a plain `keras.Model` /
      `keras.Sequential` with new layers of the same configs and the same
      weights: nothing of maskfit is in it, so it saves and loads with stock
      Keras (`safe_mode=True`, no maskfit import). Masks declared with
      `maskfit.set_mask` are not carried over either.
    - A `PrunedModel` gives the subclassed model it runs (the same object,
      sharing its weights).
    - A subclass of `MaskedModel` cannot become a plain `keras.Model` (its
      class derives from `MaskedModel`): it gives a copy without pruning,
      other masks kept.

    The pruned model is left as it is. Pruned weights are exactly +0.0
    already, at every step, so nothing is masked here.

    Args:
      model: a `keras.Model`, pruned by `prune_low_magnitude` or not.

    Returns:
      The model without pruning.

    Raises:
      TypeError: if `model` is not a `keras.Model`.

    Example:

    >>> import keras, maskfit.pruning as pruning
    >>> model = pruning.prune_low_magnitude(
    ...     keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))
    >>> type(pruning.strip_pruning(model)).__name__
    'Sequential'
    """
    support.require("structured_oneshot", "strip_pruning")
    if not isinstance(model, keras.Model):
        raise TypeError(
            "strip_pruning expects a keras.Model (the model prune_low_magnitude"
            f" returned). Received: {model!r} of type {type(model).__name__}"
        )
    if isinstance(model, PrunedModel):
        return model.model
    if isinstance(model, keras.Sequential) or isinstance(
        model, internals.functional_class()
    ):
        return _plain_copy(model)
    stripped = copy.deepcopy(model)
    for layer, _ in mask_rules.layer_rules(stripped):
        mask_rules.set_rule(layer, None)
    return stripped


def _plain_copy(model):
    """A stock Keras copy of a functional or Sequential model, weights included."""

    def clone(layer):
        if isinstance(layer, keras.Model) and (
            isinstance(layer, keras.Sequential)
            or isinstance(layer, internals.functional_class())
        ):
            return _plain_copy(layer)
        return layer.__class__.from_config(layer.get_config())

    cloned = keras.models.clone_model(model, clone_function=clone)
    if not isinstance(model, keras.Sequential):
        # clone_model keeps a functional subclass's class: make it plain.
        cloned = keras.Model(cloned.inputs, cloned.outputs, name=model.name)
    cloned.set_weights(model.get_weights())
    return cloned
