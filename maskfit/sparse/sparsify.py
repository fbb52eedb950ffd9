"""`sparsify`: a model trains sparse from its first step, by SET or RigL."""

import inspect

import keras

from maskfit import support
from maskfit.model import conversion
from maskfit.sparse import rules as sparse_rules
from maskfit.spec import rules

__all__ = ["METHODS", "sparsify"]

METHODS = {"set": sparse_rules.SET, "rigl": sparse_rules.RigL}
"""`sparsify`'s methods: `{name: the DynamicSparsity rule it declares}`."""


def sparsify(
    to_sparsify,
    method="rigl",
    sparsity=0.9,
    t_end=None,
    **rule_args,
):
    """Makes a model (or a layer) train sparse, moving its connections by SET or RigL.

    Declares a `maskfit.sparse.RigL` (or `SET`) rule with these arguments
    (RigL's names; see `DynamicSparsity`) on the model, which then keeps
    its prunable weights (kernels and embeddings, as
    `maskfit.pruning.prunable_weights` finds them) at `sparsity` for the
    whole run, spread over the layers by `sparsity_distribution`, starting
    from random masks drawn from `seed`. After every `delta_t`-th training
    step until `t_end` it drops the weakest active weights of each layer and
    grows as many new ones, at random (SET) or where the dense gradient is
    largest (RigL). Dropped weights are exactly 0, with optimizer state that
    cannot bring them back; grown ones start at exactly 0 with a fresh
    optimizer's state. It all happens inside the compiled step of `fit`; no
    callback is needed. Layers with a rule of their own (e.g.
    `maskfit.pruning.prune_low_magnitude`) keep it and stay out of the
    budget; masks set with `maskfit.set_mask` compose (entries they freeze
    are kept and never move). `maskfit.summary` shows each layer's sparsity;
    `maskfit.pruning.strip_pruning` gives the model without the rule.

    Args:
      to_sparsify: a model (functional, Sequential or subclassed, built or
        not) or a layer, as for `maskfit.pruning.prune_low_magnitude`: a
        `MaskedModel` / `MaskedSequential` gets the rule and is returned, a
        plain Sequential or functional model gives a `MaskedSequential` /
        `MaskedModel` with its layers and weights, a subclassed `keras.Model`
        a `maskfit.pruning.PrunedModel` that runs it; a layer gets the rule
        (build the model that uses it with `MaskedModel`).
      method: "rigl" or "set".
      sparsity: the target fraction of zeros over the covered weights, in
        (0, 1).
      t_end: the last training step after which connections move, required
        (the RigL paper stops at 75% of training).
      **rule_args: the rule's other arguments, by keyword, with their
        defaults and meaning in `maskfit.sparse.RigL` (`DynamicSparsity`):
        `delta_t`, `alpha`, `drop_fraction_anneal`, `begin_step`,
        `sparsity_distribution`, `dense_first_layer`, `custom_sparsity_map`,
        `erk_power_scale`, `seed`.

    Returns:
      The model or layer that trains sparse (see `to_sparsify`).

    Raises:
      NotImplementedError: under a Keras backend other than TensorFlow.
      TypeError: for a `to_sparsify` that is not a model or a layer, or an
        argument the rule does not take.
      ValueError: for an unknown method, a bad argument (the rule's
        constructor names it), or, for a built model, weights the
        allocation refuses (none to make sparse, a `custom_sparsity_map`
        entry naming no such layer).

    Example:

    >>> import keras, maskfit
    >>> model = keras.Sequential([keras.Input((40,)), keras.layers.Dense(100),
    ...                           keras.layers.Dense(10)])
    >>> model = maskfit.sparse.sparsify(model, "rigl", sparsity=0.9, t_end=750)
    >>> type(model).__name__
    'MaskedSequential'
    """
    support.require("sparse_training", "sparsify")
    if method not in METHODS:
        raise ValueError(
            f"sparsify: method must be one of {sorted(METHODS)}. Received:"
            f" method={method!r}"
        )
    # The rule's own signature holds the arguments and their defaults, once.
    rule_class = METHODS[method]
    taken = inspect.signature(rule_class).parameters
    unknown = sorted(set(rule_args) - set(taken))
    if unknown:
        raise TypeError(
            f"sparsify: {rule_class.__name__} takes no argument {unknown}; its"
            f" arguments are {list(taken)}. Received: {rule_args!r}"
        )
    rule = rule_class(sparsity, t_end, **rule_args)
    if isinstance(to_sparsify, keras.Model):
        target = conversion.masked_model(to_sparsify)
    elif isinstance(to_sparsify, keras.layers.Layer):
        target = to_sparsify
    else:
        raise TypeError(
            "sparsify takes a keras.Model or a keras.layers.Layer. Received:"
            f" {to_sparsify!r} of type {type(to_sparsify).__name__}"
        )
    if target.built:
        rule.variables(target)  # the allocation's errors, now
    return rules.set_rule(target, rule)
