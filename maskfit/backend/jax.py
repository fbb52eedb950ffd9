"""The JAX backend: Keras's stateless JAX `train_step`, its update masked.

`train_step(model, state, data)` is the JAX trainer's own step over the
`(trainable, non_trainable, optimizer, metrics)` values, with
`maskfit.step.stateless.stateless_apply` in place of
`optimizer.stateless_apply`. The masks are values too
(`maskfit.step.stateless.StatelessMasks`, a JAX pytree), read on the host
from the declarations when they change (`maskfit.spec.version`) and passed
to the compiled step as an argument: `set_mask` after `compile()` reaches
the next step without a retrace (a mask of a new shape or kind retraces,
as any new argument structure does), and a `PiecewiseMask` switches at the
exact optimizer step inside it. Under a `keras.distribution` each mask is
laid out like its variable (`maskfit.backend.sharding`).
"""

import jax
import keras

from maskfit import internals
from maskfit.apply import _align, _checked, _pairs_to_variables
from maskfit.backend import rule_calls, sharding
from maskfit.backend.sharding import place_masks
from maskfit.spec import declare, gate, version
from maskfit.step import stateless

__all__ = [
    "apply_grad_masks",
    "apply_gradients",
    "given_masks",
    "lower_train_step",
    "make_train_function",
    "mask_memory",
    "model_masks",
    "place_masks",
    "train_step",
]

_CACHE_ATTR = "_maskfit_jax_masks"  # (key, StatelessMasks) on the model
_IN_STEP_ATTR = "_maskfit_jax_in_step"  # (masks, selected) while a step traces
_CAPTURE_ATTR = "_maskfit_jax_capture"  # a list the step appends its gradients to
_GIVEN_ATTR = "_maskfit_jax_given"  # the masks the last compiled step was given


def _flatten(masks):
    gate_values = tuple((table, boundaries) for _, table, boundaries in masks.gates)
    gate_layers = tuple(layer for layer, _, _ in masks.gates)
    return (masks.tables, masks.boundaries, gate_values), (
        masks.positions,
        masks.scales,
        masks.count,
        gate_layers,
    )


def _unflatten(aux, children):
    positions, scales, count, gate_layers = aux
    gates = tuple((layer, *values) for layer, values in zip(gate_layers, children[2]))
    return stateless.StatelessMasks(
        positions, children[0], children[1], scales, count, gates
    )


jax.tree_util.register_pytree_node(stateless.StatelessMasks, _flatten, _unflatten)


def _refuse_tensorflow_only(model, layer_specs):
    """Raises for what the JAX step does not run: rules that observe every
    step's gradients (`maskfit.backend.rule_calls.refuse`)."""
    rule_calls.refuse(model)


def model_masks(model, variables=None, values=None):
    """The `StatelessMasks` of a model's variables, read again only after a change.

    Args:
      model: a Keras model (masks declared anywhere in it).
      variables: the variables, in order; `model.trainable_variables` by default.
      values: their values (the step's state), whose shardings the masks
        take; the variables' own by default.
    """
    variables = list(model.trainable_variables if variables is None else variables)
    key = (version.current(), tuple(id(v) for v in variables))
    cached = getattr(model, _CACHE_ATTR, None)
    if cached is not None and cached[0] == key:
        return cached[1]
    layer_specs = declare.masked_layers(model)
    _refuse_tensorflow_only(model, layer_specs)
    masks = stateless.masks_for(layer_specs, variables, host=True)
    values = [v.value for v in variables] if values is None else values
    masks = sharding.place(masks, values, [v.path for v in variables])
    internals.set_untracked(model, _CACHE_ATTR, (key, masks))
    return masks


def _step_masks(model):
    """`(masks, selected)` of the step being traced, or None outside one."""
    return getattr(model, _IN_STEP_ATTR, None)


def train_step(model, state, data):
    """`MaskedModel.train_step` on JAX: Keras's stateless step, its update masked."""
    (
        trainable_values,
        non_trainable_values,
        optimizer_values,
        metrics_values,
    ) = state
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    in_step = _step_masks(model)
    masks = model_masks(model) if in_step is None else in_step[0]
    variables = model.trainable_variables
    # Backprop gates (`OutputMask(..., backprop=True)`) read the mask in force.
    step = stateless.optimizer_step(model.optimizer, optimizer_values)
    grad_fn = jax.value_and_grad(model.compute_loss_and_updates, has_aux=True)
    with gate.using(stateless.select_gates(masks, step)):
        (_, aux), gradients = grad_fn(
            trainable_values,
            non_trainable_values,
            metrics_values,
            x,
            y,
            sample_weight,
            training=True,
            optimizer_variables=optimizer_values,
        )
    (unscaled_loss, y_pred, non_trainable_values, metrics_values) = aux
    captured = getattr(model, _CAPTURE_ATTR, None)
    if captured is not None:  # the variant of the step a rule's update reads
        captured.append(gradients)

    def mask(gradients, selected):
        previous = _step_masks(model)
        internals.set_untracked(model, _IN_STEP_ATTR, (masks, selected))
        try:
            return model.apply_grad_masks(gradients, variables)
        finally:
            internals.set_untracked(model, _IN_STEP_ATTR, previous)

    trainable_values, optimizer_values = stateless.stateless_apply(
        model.optimizer,
        masks,
        optimizer_values,
        gradients,
        trainable_values,
        mask=mask,
    )
    logs, metrics_values = internals.jax_trainer.update_metrics_variables(
        model, metrics_values, unscaled_loss, x, y, y_pred, sample_weight
    )
    state = (trainable_values, non_trainable_values, optimizer_values, metrics_values)
    return logs, state


def apply_grad_masks(model, gradients, variables):
    """`MaskedModel.apply_grad_masks` on JAX: the step's masks, as selected in it.

    Outside a step, the masks in force at the optimizer's current step.
    """
    in_step = _step_masks(model)
    if in_step is not None and len(in_step) == 2 and in_step[1] is not None:
        masks, selected = in_step
    else:
        masks = model_masks(model, variables)
        selected = stateless.select(masks, _optimizer_step(model.optimizer))
    return stateless.mask_gradients(masks, selected, gradients)


def _optimizer_step(optimizer):
    if optimizer is None or not optimizer.built:
        return keras.ops.convert_to_tensor(0, "int32")
    return keras.ops.convert_to_tensor(optimizer.iterations)


def _step_with_masks(model, gradients=False, sums=None):
    """`model.train_step` as a function of `(state, data, masks)`: what is compiled.

    With `gradients`, the function returns `(logs, state, gradients)`: the
    step's dense gradients too (of the loss as `optimizer.scale_loss` scaled
    it, not masked), for a rule that `uses_gradients`. With `sums` (a
    `maskfit.backend.jax_taylor.GradientSums`), the state carries the Taylor
    sums after its four lists, and the step adds its own to them.
    """

    def step(state, data, masks):
        carried = None
        if sums is not None:
            state, carried = tuple(state[:4]), state[4]
        before = state
        captured = [] if gradients or sums is not None else None
        internals.set_untracked(model, _IN_STEP_ATTR, (masks, None))
        internals.set_untracked(model, _CAPTURE_ATTR, captured)
        try:
            logs, state = model.train_step(state, data)
        finally:
            internals.set_untracked(model, _IN_STEP_ATTR, None)
            internals.set_untracked(model, _CAPTURE_ATTR, None)
        if captured is None:
            return logs, state
        if len(captured) != 1:
            raise ValueError(
                f"Model '{model.name}' carries a mask rule that reads the step's"
                f" gradients (uses_gradients or observes_gradients), but its"
                f" train_step computed gradients {len(captured)} times (expected"
                " once, in maskfit's train_step). Call"
                " super().train_step(state, data) once, or remove the rule."
            )
        if sums is not None:
            added = sums.added(model, carried, before[0], captured[0], before[2])
            state = tuple(state) + (added,)
        if not gradients:
            return logs, state
        return logs, state, captured[0]

    return step


def lower_train_step(model, state, data):
    """The step `make_train_function` compiles, lowered for `state` and `data`.

    For reading what XLA makes of it (`.compile().as_text()`,
    `.cost_analysis()`) without running it: `jax.jit` of the masked step
    with the model's masks as an argument, as `fit` calls it.

    Args:
      model: a compiled `MaskedModel` whose optimizer is built.
      state: `(trainable, non_trainable, optimizer, metrics)` values (or
        `jax.ShapeDtypeStruct`s), as the train function takes them.
      data: one batch (or its shapes).

    Returns:
      A `jax.stages.Lowered`.
    """
    masks = model_masks(model, values=state[0])
    return jax.jit(_step_with_masks(model), donate_argnums=0).lower(state, data, masks)


def make_train_function(model, force=False):
    """`make_train_function` on JAX: the step compiled with the masks as an argument.

    As Keras's JAX trainer makes it (`jax.jit` with the state donated, under
    `jit_compile=True` and not `run_eagerly`), except that the compiled
    function takes the model's `StatelessMasks` too, read on the host before
    each call (a cached value unless a declaration changed).
    """
    # Read now: `fit` takes the variables' values out of the model for the
    # loop (a declaration resolved then needs only their shapes).
    model_masks(model)
    if model.train_function is not None and not force:
        return model.train_function

    compiled = not model.run_eagerly and model.jit_compile

    def compile_step(gradients, sums=None):
        step = _step_with_masks(model, gradients, sums)
        if not compiled:
            return step
        out_shardings = None
        if keras.distribution.distribution() is not None:
            shardings = internals.jax_trainer.state_shardings(model)
            if sums is not None:  # each sum laid out like its variable
                shardings = tuple(shardings) + (sums.shardings(shardings[0]),)
            out_shardings = (None, shardings, None) if gradients else (None, shardings)
        return jax.jit(step, donate_argnums=0, out_shardings=out_shardings)

    step = compile_step(False)
    calls = rule_calls.RuleCalls(model, compile_step)
    returned = [None]  # the state the last call returned
    given = [None]  # the masks the last call was given

    def train_step_with_masks(state, data):
        fresh = state is not returned[0]
        if compiled and fresh:
            state = _unshared(state)
        cached = getattr(model, _CACHE_ATTR)
        # The variables cannot change within `fit`: only a declaration can.
        if cached[0][0] == version.current():
            masks = cached[1]
        else:
            masks = model_masks(model, values=state[0])
        logs, returned[0] = calls(step, state, data, masks, fresh)
        if calls.given is not given[0]:  # what `mask_memory` reports
            given[0] = calls.given
            internals.set_untracked(model, _GIVEN_ATTR, (version.current(), given[0]))
        return logs, returned[0]

    model.train_function = internals.jax_trainer.step_function(
        model, train_step_with_masks
    )
    return model.train_function


def given_masks(model):
    """The `StatelessMasks` the compiled step was last given (keep masks joined),
    or, before the first step or after a declaration, `model_masks(model)`."""
    given = getattr(model, _GIVEN_ATTR, None)
    current = given is not None and given[0] == version.current()
    return given[1] if current else model_masks(model)


def mask_memory(model):
    """Per masked variable, the bytes of its masks and its own, per device.

    Returns:
      `[(path, {device: bytes}, {device: bytes})]`, in the model's order: the
      masks as the compiled step is given them (keep masks joined, laid out
      like their variables; before the first step, the declared masks), and
      the variable's value.
    """
    masks = given_masks(model)
    variables = model.trainable_variables
    return [
        (
            variables[p].path,
            sharding.bytes_per_device([table, boundaries]),
            sharding.bytes_per_device([variables[p].value]),
        )
        for p, table, boundaries in zip(masks.positions, masks.tables, masks.boundaries)
    ]


def _unshared(state):
    """`state` with no array in two places: the compiled step donates its state.

    Keras's `finalize_variable_values` (EMA, at the end of `fit`) assigns each
    average to its variable, so the next `fit`'s state holds one array twice,
    and donating it twice fails (stock Keras fails there too). Checked only
    for a state `fit` made anew, not one the step returned.
    """
    seen = set()

    def once(value):
        if id(value) in seen:
            return jax.numpy.array(value, copy=True)
        seen.add(id(value))
        return value

    return jax.tree_util.tree_map(once, state)


def apply_gradients(optimizer, grads, variables=None):
    """`maskfit.apply_gradients` on JAX: one `stateless_apply`, its values assigned."""
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
    aligned = _align(grads, variables)
    checked = [_checked(g, v) for g, v in zip(aligned, variables)]
    if all(g is None for g in checked):
        raise ValueError(
            "apply_gradients received no gradient for any variable (all None or"
            " left out). Pass at least one gradient."
        )
    by_id = {id(v): g for v, g in zip(variables, checked)}
    full = [by_id.get(id(v)) for v in built]
    ids = {id(v) for v in built}
    layer_specs = [
        (layer, spec)
        for layer, spec in declare.all_masked_layers()
        if any(id(v) in ids for v in layer.trainable_weights)
    ]
    masks = stateless.masks_for(layer_specs, built, host=True)
    masks = sharding.place(masks, [v.value for v in built], [v.path for v in built])
    new_trainable, new_optimizer = stateless.stateless_apply(
        optimizer,
        masks,
        [v.value for v in optimizer.variables],
        full,
        [v.value for v in built],
    )
    for variable, value in zip(built, new_trainable):
        variable.assign(value)
    for variable, value in zip(optimizer.variables, new_optimizer):
        variable.assign(value)
