"""The PyTorch backend: Keras's torch `train_step`, its update masked.

Keras's torch trainer runs the forward pass, `loss.backward()`, and
`optimizer.apply` under `torch.no_grad()`, on stateful variables (as on
TensorFlow). `train_step(model, data)` is that step, line for line, with
maskfit's masking stage between the gradients and the update, in the order of
the other backends (`maskfit.step.pipeline`): the masks in force at the
optimizer step are selected, the gradients masked (`apply_grad_masks`, the
override point), the update guarded, then the frozen entries restored.

The masking math is `maskfit.step.stateless`'s, in `keras.ops` (`select`,
`mask_gradients`, the masks as `StatelessMasks` read on the host when a
declaration changes: `set_mask` after `compile()` reaches the next step, and
a `PiecewiseMask` switches at the exact optimizer step). The update is
guarded: Keras's torch optimizers update all variables at once in place
(`torch._foreach_*`), so the frozen entries of each masked variable, of its
optimizer slots of its shape and of its EMA average are put back after
`optimizer.apply`, bit for bit, by `maskfit.backend.torch_guard`. An EMA average takes the variable's value there, so that
`finalize_variable_values` (the end of `fit`) cannot move a frozen entry.
Learning-rate multipliers (mask values other than 0 and 1) use
`maskfit.optim.stateless_rates`, with the optimizer's per-variable
`update_step` in place of its fused update while they are on.
"""

import contextlib
import warnings

import keras
import torch

from maskfit import internals
from maskfit.apply import _pairs_to_variables
from maskfit.backend import torch_guard, torch_rules
from maskfit.optim import stateless_rates
from maskfit.spec import declare, version
from maskfit.step import stateless

__all__ = [
    "apply_grad_masks",
    "apply_gradients",
    "make_train_function",
    "masked_apply",
    "model_masks",
    "train_step",
]

_CACHE_ATTR = "_maskfit_torch_masks"  # (key, StatelessMasks) on the model
_IN_STEP_ATTR = "_maskfit_torch_in_step"  # (masks, selected, guard) within a step
_GUARD_ATTR = "_maskfit_torch_guard"  # (key, masks, Guard, slots) on the optimizer


def _refuse(model, layer_specs):
    """Raises for what the torch step does not run: rules that read gradients
    or whose feature leaves torch out (`maskfit.backend.torch_rules.refuse`),
    `backprop=True`.

    Both are refused where they are declared (`maskfit.support.FEATURES`);
    this catches a model that got them another way (a file saved elsewhere).
    """
    torch_rules.refuse(model)
    for layer, spec in layer_specs:
        if spec.backprop:
            raise NotImplementedError(
                f"Layer '{layer.name}' carries {spec!r} with backprop=True, which"
                " maskfit runs on TensorFlow and JAX only; this process runs"
                " Keras on torch. Declare the mask with backprop=False, or train"
                " with KERAS_BACKEND=tensorflow or KERAS_BACKEND=jax."
            )


def model_masks(model, variables=None):
    """The `StatelessMasks` of a model's variables, read again only after a change.

    Args:
      model: a Keras model (masks declared anywhere in it).
      variables: the variables, in order; `model.trainable_variables` by default.
    """
    variables = list(model.trainable_variables if variables is None else variables)
    key = (version.current(), tuple(id(v) for v in variables))
    cached = getattr(model, _CACHE_ATTR, None)
    if cached is not None and cached[0] == key:
        return cached[1]
    layer_specs = declare.masked_layers(model)
    _refuse(model, layer_specs)
    masks = stateless.masks_for(layer_specs, variables)
    internals.set_untracked(model, _CACHE_ATTR, (key, masks))
    return masks


def _step(optimizer):
    """The optimizer step the next update runs, as a tensor (0 before it is built)."""
    if optimizer is None or not optimizer.built:
        return keras.ops.convert_to_tensor(0, "int32")
    return keras.ops.convert_to_tensor(optimizer.iterations)


@contextlib.contextmanager
def _multipliers(optimizer, masks, selected, variables):
    """Steps variables with mask values other than 0 and 1 at lr x the value."""
    scaled = {
        id(variables[position]): mask
        for position, mask, scale in zip(masks.positions, selected, masks.scales)
        if scale == "step" and keras.backend.standardize_dtype(mask.dtype) != "bool"
    }
    if not scaled:
        yield
        return
    ids = set(scaled)
    undo = [
        internals.torch_trainer.per_variable_update(leaf, ids)
        for leaf in internals.optimizers_within(optimizer)
        if internals.optimizers_within(leaf) == [leaf]
    ]
    try:
        with stateless_rates.scaled(optimizer, scaled):
            yield
    finally:
        for each in reversed(undo):
            each()


def masked_apply(optimizer, masks, gradients, variables, mask=None):
    """`optimizer.apply(gradients, variables)` with the masks' frozen entries held.

    Runs under `torch.no_grad()`, on the variables' values in place. Eagerly,
    the frozen entries are held by a `maskfit.backend.torch_guard.Guard`
    (one integer pass on the raw bits in place, the kept bits reused across
    steps); under `torch.compile` by a copy of each held tensor, which it
    traces.

    Args:
      optimizer: a Keras optimizer (built for `variables`, or to be built).
      masks: the `StatelessMasks` of `variables`.
      gradients: one gradient (or None) per variable.
      variables: the variables, in the masks' order.
      mask: a function `(gradients, selected, guard) -> gradients` that masks
        the gradients instead of the guard's `mask_gradients`; frozen
        entries are held whatever it returns.
    """
    with torch.no_grad():
        if not optimizer.built:
            optimizer.build(variables)
        if torch.compiler.is_compiling():
            _traced_apply(optimizer, masks, gradients, variables, mask)
            return
        guard = _guard(optimizer, masks, gradients, variables)
        guard.masked = None
        if mask is None:
            gradients = guard.mask_gradients(
                gradients, masks, guard.selected, variables
            )
        else:
            gradients = list(mask(gradients, guard.selected, guard))
        zeroed = guard.zeroed(gradients)
        guard.take()
        with _multipliers(optimizer, masks, guard.selected, variables):
            optimizer.apply(gradients, variables)
        guard.restore(zeroed=zeroed)


def _guard(optimizer, masks, gradients, variables):
    """The `Guard` of this step's plan, built once per masks, interval and slots."""
    intervals = tuple(_interval(b, optimizer) for b in masks.boundaries)
    missing = frozenset(i for i, g in enumerate(gradients) if g is None)
    slots = stateless._slots(optimizer, variables)
    key = (id(masks), intervals, missing, id(slots))
    cache = getattr(optimizer, _GUARD_ATTR, None)
    if cache is not None and cache[0] == key and cache[1] is masks:
        return cache[2]
    selected = [t[i] for t, i in zip(masks.tables, intervals)]
    filled = torch_guard.sqrt_slots(optimizer)
    stay = torch_guard.zero_slots(optimizer)
    guard = torch_guard.Guard(masks, selected, missing, slots, variables, filled, stay)
    guard.selected = selected
    internals.set_untracked(optimizer, _GUARD_ATTR, (key, masks, guard, slots))
    return guard


def _interval(boundaries, optimizer):
    """Which interval of a schedule is in force at the optimizer's step (on the host)."""
    if boundaries.shape[0] == 0:
        return 0
    step = torch.as_tensor(int(optimizer.iterations.value), dtype=boundaries.dtype)
    return int(torch.searchsorted(boundaries, step, right=True))


def _traced_apply(optimizer, masks, gradients, variables, mask):
    """`masked_apply` under `torch.compile`: each held tensor copied, then put back."""
    selected = stateless.select(masks, _step(optimizer))
    if mask is None:
        gradients = stateless.mask_gradients(masks, selected, gradients)
    else:
        gradients = list(mask(gradients, selected, None))
    restore = torch_guard.copied(optimizer, masks, selected, gradients, variables)
    with _multipliers(optimizer, masks, selected, variables):
        optimizer.apply(gradients, variables)
    restore()


def _step_masks(model):
    """`(masks, selected, guard)` of the step running, or None outside one."""
    return getattr(model, _IN_STEP_ATTR, None)


def train_step(model, data):
    """`MaskedModel.train_step` on torch: Keras's own, line for line, masked."""
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)

    # Rules (magnitude pruning) update at their steps before the forward pass,
    # as TF-MOT and the TensorFlow and JAX steps: a step that drops entries
    # learns with them at 0. Their keep masks are joined to the step's masks.
    variables = model.trainable_weights[:]
    masks = _masks(model, variables) if variables else None

    # Compute predictions
    if internals.call_has_training_arg(model):
        y_pred = model(x, training=True)
    else:
        y_pred = model(x)

    # Clear the gradients the previous step left on the weights.
    model.zero_grad()

    loss = internals.compute_loss(
        model, x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
    )
    internals.loss_tracker(model).update_state(
        loss,
        sample_weight=next(i for i in keras.tree.flatten(x) if i is not None).shape[0],
    )
    if model.optimizer is not None:
        loss = model.optimizer.scale_loss(loss)

    built = model.trainable_weights[:]
    if [id(v) for v in built] != [id(v) for v in variables]:
        # Built by this forward pass: no weights to drop before it.
        variables = built
        masks = _masks(model, variables) if variables else None
    if variables:
        loss.backward()
        gradients = [v.value.grad for v in variables]

        def mask(gradients, selected, guard):
            previous = _step_masks(model)
            internals.set_untracked(model, _IN_STEP_ATTR, (masks, selected, guard))
            try:
                return model.apply_grad_masks(gradients, variables)
            finally:
                internals.set_untracked(model, _IN_STEP_ATTR, previous)

        masked_apply(model.optimizer, masks, gradients, variables, mask=mask)
    else:
        warnings.warn("The model does not have any trainable weights.", stacklevel=3)

    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def _masks(model, variables):
    """The step's masks: the declared ones with the rules' keep masks joined,
    after the rules due at this step updated the variables."""
    return torch_rules.joined(model, model_masks(model, variables), variables)


def apply_grad_masks(model, gradients, variables):
    """`MaskedModel.apply_grad_masks` on torch: the step's masks, as selected in it.

    Outside a step, the masks in force at the optimizer's current step.
    """
    in_step = _step_masks(model)
    if in_step is not None:
        masks, selected, guard = in_step
        if guard is not None:
            return guard.mask_gradients(gradients, masks, selected, variables)
    else:
        masks = model_masks(model, variables)
        selected = stateless.select(masks, _step(model.optimizer))
    return stateless.mask_gradients(masks, selected, gradients)


def make_train_function(model, force=False):
    """`make_train_function` on torch: Keras's own, the masks read first.

    The step reads the masks on the host (cached until a declaration
    changes), so `set_mask` after `compile()` reaches the next step.
    """
    if model.trainable_variables:
        model_masks(model)
    return internals.torch_trainer.make_train_function(model, force=force)


def _align(grads, variables):
    """One gradient (or None) per variable, from a list or a dict."""
    paths = [v.path for v in variables]
    if not isinstance(grads, dict):
        if len(grads) != len(variables):
            raise ValueError(
                f"apply_gradients received {len(grads)} gradients for"
                f" {len(variables)} variables. Expected one per variable, in this"
                f" order: {paths}. Pass None, or use a dict by path, to leave a"
                " variable out."
            )
        return list(grads)
    aligned = [None] * len(variables)
    by_id = {id(v): i for i, v in enumerate(variables)}
    for key, grad in grads.items():
        if isinstance(key, str):
            if paths.count(key) != 1:
                raise ValueError(
                    f"apply_gradients received a gradient for variable path"
                    f" '{key}', which names {paths.count(key)} of the variables it"
                    f" updates (expected 1). Known paths: {paths}."
                )
            aligned[paths.index(key)] = grad
        elif id(key) in by_id:
            aligned[by_id[id(key)]] = grad
        else:
            raise ValueError(
                f"apply_gradients received a gradient for variable {key!r},"
                f" which is not among the variables it updates: {paths}."
            )
    return aligned


def _checked(grad, variable):
    if grad is None:
        return None
    value = keras.ops.convert_to_tensor(grad)
    if tuple(value.shape) != tuple(variable.shape):
        raise ValueError(
            f"The gradient for variable '{variable.path}' has shape"
            f" {tuple(value.shape)}, but the variable has shape"
            f" {tuple(variable.shape)}. Pass a gradient of shape"
            f" {tuple(variable.shape)}."
        )
    return keras.ops.cast(value, variable.dtype)


def apply_gradients(optimizer, grads, variables=None):
    """`maskfit.apply_gradients` on torch: `optimizer.apply`, frozen entries held."""
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "apply_gradients expects a Keras optimizer as its first argument, e.g."
            f" keras.optimizers.Adam(). Received: {optimizer!r}"
        )
    grads, variables = _pairs_to_variables(grads, variables)
    if not optimizer.built:
        if variables is None:
            raise ValueError(
                f"Optimizer '{optimizer.name}' is not built, so apply_gradients"
                " cannot tell which variables the gradients are for. Call"
                " optimizer.build(model.trainable_variables) first, or pass"
                " variables=..."
            )
        optimizer.build(list(variables))
    built = list(internals.optimizer_built_variables(optimizer))
    variables = built if variables is None else list(variables)
    known = {id(v) for v in built}
    for v in variables:
        if id(v) not in known:
            raise ValueError(
                f"Variable '{v.path}' is not one the optimizer was built with; it"
                f" updates {[b.path for b in built]}. Pass those variables, or use"
                " a new optimizer."
            )
    checked = [_checked(g, v) for g, v in zip(_align(grads, variables), variables)]
    if all(g is None for g in checked):
        raise ValueError(
            "apply_gradients received no gradient for any variable (all None or"
            " left out). Pass at least one gradient."
        )
    ids = {id(v) for v in variables}
    layer_specs = [
        (layer, spec)
        for layer, spec in declare.all_masked_layers()
        if any(id(v) in ids for v in layer.trainable_weights)
    ]
    masks = stateless.masks_for(layer_specs, variables)
    masked_apply(optimizer, masks, checked, variables)
