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
from maskfit.backend import jax_rules, sharding
from maskfit.spec import declare, rules, version
from maskfit.step import stateless

__all__ = [
    "apply_grad_masks",
    "apply_gradients",
    "given_masks",
    "lower_train_step",
    "make_train_function",
    "mask_memory",
    "model_masks",
    "train_step",
]

_CACHE_ATTR = "_maskfit_jax_masks"  # (key, StatelessMasks) on the model
_IN_STEP_ATTR = "_maskfit_jax_in_step"  # (masks, selected) while a step traces
_GIVEN_ATTR = "_maskfit_jax_given"  # the masks the last compiled step was given


def _flatten(masks):
    return (masks.tables, masks.boundaries), (
        masks.positions,
        masks.scales,
        masks.count,
    )


def _unflatten(aux, children):
    positions, scales, count = aux
    return stateless.StatelessMasks(positions, children[0], children[1], scales, count)


jax.tree_util.register_pytree_node(stateless.StatelessMasks, _flatten, _unflatten)


def _refuse_tensorflow_only(model, layer_specs):
    """Raises for what the JAX step does not run: rules other than magnitude
    pruning (`maskfit.backend.jax_rules`), `backprop=True`."""
    from maskfit.pruning.rule import MagnitudePruning  # imports maskfit.backend

    for layer, rule in rules.layer_rules(model):
        if type(rule) is MagnitudePruning:
            continue
        raise NotImplementedError(
            f"Layer '{layer.name}' carries the rule {type(rule).__name__}, which"
            " maskfit runs in the training step on the TensorFlow backend only;"
            " this process runs Keras on JAX. Train it with"
            " KERAS_BACKEND=tensorflow, or remove the rule with"
            " maskfit.spec.rules.set_rule(layer, None)."
        )
    for layer, spec in layer_specs:
        if spec.backprop:
            raise NotImplementedError(
                f"Layer '{layer.name}' carries {spec!r} with backprop=True, which"
                " maskfit runs on the TensorFlow backend only; this process runs"
                " Keras on JAX. Declare the mask with backprop=False, or train"
                " with KERAS_BACKEND=tensorflow."
            )


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
    grad_fn = jax.value_and_grad(model.compute_loss_and_updates, has_aux=True)
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

    in_step = _step_masks(model)
    masks = model_masks(model) if in_step is None else in_step[0]
    variables = model.trainable_variables

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


def _step_with_masks(model):
    """`model.train_step` as a function of `(state, data, masks)`: what is compiled."""

    def step(state, data, masks):
        internals.set_untracked(model, _IN_STEP_ATTR, (masks, None))
        try:
            return model.train_step(state, data)
        finally:
            internals.set_untracked(model, _IN_STEP_ATTR, None)

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

    step = _step_with_masks(model)
    compiled = not model.run_eagerly and model.jit_compile
    if compiled:
        out_shardings = None
        if keras.distribution.distribution() is not None:
            out_shardings = (None, internals.jax_trainer.state_shardings(model))
        step = jax.jit(step, donate_argnums=0, out_shardings=out_shardings)
    returned = [None]  # the state the last call returned
    host = [None, None]  # (declarations' version, HostRules or None)
    counter = [None]  # the optimizer step of the next call, on the host
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
        if host[0] != version.current():  # a rule set or removed since
            host[:] = [version.current(), _host_rules(model)]
            counter[0] = None
        if host[1] is not None:
            if fresh or counter[0] is None:
                counter[0] = _iterations(model.optimizer, state[2])
            state, masks = host[1].before_step(state, masks, counter[0])
            counter[0] += 1
        if masks is not given[0]:  # what `mask_memory` reports
            given[0] = masks
            internals.set_untracked(model, _GIVEN_ATTR, (version.current(), masks))
        logs, returned[0] = step(state, data, masks)
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


def _host_rules(model):
    """The model's `HostRules` (magnitude pruning), or None without rules."""
    if not rules.layer_rules(model):
        return None
    if model.steps_per_execution != 1:
        raise NotImplementedError(
            f"Model '{model.name}' prunes by magnitude (prune_low_magnitude) and"
            f" was compiled with steps_per_execution={model.steps_per_execution};"
            " on the JAX backend maskfit updates the keep masks between"
            " compiled steps, so it needs steps_per_execution=1. Compile with"
            " steps_per_execution=1, or train with KERAS_BACKEND=tensorflow."
        )
    return jax_rules.HostRules(model)


def _iterations(optimizer, optimizer_values):
    """The optimizer's `iterations` in a state's optimizer values, on the host."""
    for variable, value in zip(optimizer.variables, optimizer_values):
        if variable is optimizer.iterations:
            return int(value)
    return 0


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
