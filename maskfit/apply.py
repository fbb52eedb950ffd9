"""`apply_gradients`: hand-made gradients, checked before any update, masks honoured."""

import difflib
import warnings

import keras
import numpy as np
import tensorflow as tf

from maskfit import gradients, internals, support
from maskfit.paths import handle as variable_handle
from maskfit.spec import declare
from maskfit.step import masker as masker_lib
from maskfit.step import pipeline, update

__all__ = ["apply_gradients"]

_TARGETS_ATTR = "_maskfit_apply_targets"


def apply_gradients(optimizer, grads, variables=None):
    """Applies gradients with `optimizer`, keeping masked entries exactly frozen.

    Like `optimizer.apply_gradients`, with three differences. The gradients can
    come in the form at hand: a list aligned with the variables, `(grad, var)`
    pairs, or a dict keyed by `variable.path` (e.g. `"dense_1/kernel"`) or by
    a variable reference (`variable.value.ref()`; Keras variables are not
    hashable). A variable left out of a dict, or given None, gets no update at
    all: no weight decay, no momentum, no EMA overwrite. The masks declared
    with `maskfit.set_mask` apply, with the same exactness as in
    `maskfit.MaskedModel`. And everything is checked before anything moves: a
    rejected call leaves the weights and `optimizer.iterations` as they were.

    The per-optimizer setup (path lookup, mask variables) is made on the first
    call and cached, so later calls, eager or inside a `tf.function`, only
    check the gradients. Inside a `tf.function` the masks are read when it is
    traced: after changing a mask, call `apply_gradients` once eagerly or retrace.

    Args:
      optimizer: a Keras optimizer.
      grads: a list of gradients (tensors, arrays or None) aligned with
        `variables`; an iterable of `(grad, variable)` pairs; or a dict from
        variable path (or `variable.value.ref()`) to gradient.
      variables: the variables the gradients are for. Defaults to the variables
        the optimizer was built with (`optimizer.build(variables)`); needed if
        the optimizer is not built yet. Not allowed with pairs.

    Raises:
      TypeError: if the arguments have the wrong type, or a gradient's dtype
        cannot be cast to its variable's.
      ValueError: on a wrong number of gradients, an unknown path or variable,
        a gradient of the wrong shape, or no gradient at all.

    Example:

    >>> import keras, maskfit, numpy as np
    >>> from maskfit.apply import apply_gradients
    >>> dense = maskfit.set_mask(keras.layers.Dense(2), maskfit.OutputMask([1, 0]))
    >>> dense.build((None, 3))
    >>> optimizer = keras.optimizers.AdamW(learning_rate=0.1)
    >>> optimizer.build(dense.trainable_variables)
    >>> apply_gradients(optimizer, {dense.kernel.path: np.ones((3, 2))})
    >>> optimizer.iterations.numpy().item()
    1
    """
    if support.backend() != "tensorflow":
        return support.step_backend().apply_gradients(optimizer, grads, variables)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "apply_gradients expects a Keras optimizer as its first argument, e.g."
            f" keras.optimizers.Adam(). Received: {optimizer!r}"
        )
    grads, variables = _pairs_to_variables(grads, variables)
    target = _target_for(optimizer, variables)
    aligned = target.align(grads)
    checked = [target.check(i, g) for i, g in enumerate(aligned)]
    if all(g is None for g in checked):
        raise ValueError(
            "apply_gradients received no gradient for any variable (all None or"
            " left out). Pass at least one gradient."
        )
    target.apply(optimizer, checked)


def _is_variable(value):
    return isinstance(value, (keras.Variable, tf.Variable))


def _pairs_to_variables(grads, variables):
    """Splits `(grad, var)` pairs; returns `(grads, variables)`."""
    if isinstance(grads, dict):
        return grads, variables
    if isinstance(grads, (tf.Tensor, np.ndarray, tf.Variable, keras.Variable)):
        raise TypeError(
            "apply_gradients expects one gradient per variable (a list, (grad,"
            " var) pairs or a dict by variable path), not a single tensor."
            f" Received a tensor of shape {tuple(grads.shape)}. Wrap it in a list,"
            " or key it by its variable's path."
        )
    try:
        items = list(grads)
    except TypeError:
        raise TypeError(
            "apply_gradients expects a list of gradients, (grad, var) pairs or a"
            f" dict by variable path. Received: {grads!r}"
        ) from None
    is_pair = [
        isinstance(x, (tuple, list)) and len(x) == 2 and _is_variable(x[1])
        for x in items
    ]
    if not items or not any(is_pair):
        return items, variables
    if not all(is_pair):
        bad = is_pair.index(False)
        raise TypeError(
            "apply_gradients received (grad, var) pairs mixed with other items;"
            f" item {bad} is {items[bad]!r}. Pass only pairs, or a plain list."
        )
    if variables is not None:
        raise TypeError(
            "apply_gradients received (grad, var) pairs and `variables`. Pass"
            " either pairs, or a list of gradients with `variables`."
        )
    return [g for g, _ in items], [v for _, v in items]


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
            index = paths.index(key)
        else:
            variable = key.deref() if hasattr(key, "deref") else key
            if id(variable) not in by_id:
                raise ValueError(
                    f"apply_gradients received a gradient for variable {key!r},"
                    f" which is not among the variables it updates: {paths}."
                )
            index = by_id[id(variable)]
        aligned[index] = grad
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


def _target_for(optimizer, variables):
    """Returns the cached `_Target` for this optimizer and variable list."""
    built = internals.optimizer_built_variables(optimizer) if optimizer.built else None
    if variables is None:
        if built is None:
            raise ValueError(
                f"Optimizer '{optimizer.name}' is not built, so apply_gradients"
                " cannot tell which variables the gradients are for. Call"
                " optimizer.build(model.trainable_variables) first, or pass"
                " variables=..."
            )
        variables = built
    variables = list(variables)
    for i, v in enumerate(variables):
        if not _is_variable(v):
            raise TypeError(
                f"apply_gradients `variables` must be Keras or TF variables; item"
                f" {i} is {v!r} of type {type(v).__name__}."
            )
    targets = getattr(optimizer, _TARGETS_ATTR, None)
    if targets is None:
        targets = {}
        internals.set_untracked(optimizer, _TARGETS_ATTR, targets)
    key = tuple(id(v) for v in variables)
    target = targets.get(key)
    if target is None:
        target = _Target(variables, built)
        targets[key] = target
    return target


def _path(variable):
    return getattr(variable, "path", None) or variable.name


def _suggest(name, known):
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    return f" Did you mean '{close[0]}'?" if close else ""


def _sum_axes(grad_shape, var_shape):
    """Axes to sum a broadcast gradient over to fit the variable, or None."""
    if None in grad_shape:
        return None
    try:
        leading, stretched = gradients.reduction_axes(grad_shape, var_shape)
    except ValueError:
        return None
    return list(leading + stretched)


class _Target:
    """What one optimizer needs to apply gradients to one variable list."""

    def __init__(self, variables, built):
        self.variables = variables
        if built is not None:
            known = {id(variable_handle(v)) for v in built}
            for v in variables:
                if id(variable_handle(v)) not in known:
                    raise ValueError(
                        f"Variable '{_path(v)}' is not one the optimizer was built"
                        f" with; it updates {[_path(b) for b in built]}. Pass"
                        " those variables, or use a new optimizer."
                    )
        # Variables the optimizer tracks but this call does not pass: EMA
        # would still move them.
        ids = {id(v) for v in variables}
        self.untouched = [v for v in (built or []) if id(v) not in ids]
        self.paths = [_path(v) for v in variables]
        self.by_path = {}
        for i, p in enumerate(self.paths):
            self.by_path[p] = None if p in self.by_path else i
        self.by_handle = {id(variable_handle(v)): i for i, v in enumerate(variables)}
        with tf.init_scope():
            self.masker = masker_lib.GradientMasker(
                variables, self._layer_specs, skip_frozen=False
            )

    def _layer_specs(self):
        ids = {id(v) for v in self.variables}
        return [
            (layer, spec)
            for layer, spec in declare.all_masked_layers()
            if any(id(v) in ids for v in layer.trainable_weights)
        ]

    def expected(self):
        return [(p, tuple(v.shape)) for p, v in zip(self.paths, self.variables)]

    def align(self, grads):
        """Returns one gradient (or None) per variable, from a list or dict."""
        if not isinstance(grads, dict):
            if len(grads) != len(self.variables):
                raise ValueError(
                    f"apply_gradients received {len(grads)} gradients for"
                    f" {len(self.variables)} variables. Expected one per variable,"
                    f" in this order (path, shape): {self.expected()}. Pass None,"
                    " or use a dict by path, to leave a variable out."
                )
            return list(grads)
        aligned = [None] * len(self.variables)
        for key, grad in grads.items():
            index = self._index_of(key)
            if aligned[index] is not None:
                raise ValueError(
                    f"apply_gradients received two gradients for variable"
                    f" '{self.paths[index]}'. Pass one per variable."
                )
            aligned[index] = grad
        return aligned

    def _index_of(self, key):
        if isinstance(key, str):
            if key not in self.by_path:
                raise ValueError(
                    f"apply_gradients received a gradient for unknown variable path"
                    f" '{key}'.{_suggest(key, self.paths)} Known paths:"
                    f" {self.paths}."
                )
            if self.by_path[key] is None:
                raise ValueError(
                    f"Several variables have path '{key}', so it cannot name one."
                    " Key the gradient by variable.value.ref(), or pass pairs."
                )
            return self.by_path[key]
        variable = key.deref() if hasattr(key, "deref") else key
        if not _is_variable(variable):
            raise TypeError(
                "apply_gradients dict keys must be variable paths (str) or"
                f" variable.value.ref(). Received key {key!r}."
            )
        index = self.by_handle.get(id(variable_handle(variable)))
        if index is None:
            name = _path(variable)
            raise ValueError(
                f"apply_gradients received a gradient for variable '{name}', which"
                f" is not among the variables it updates.{_suggest(name, self.paths)}"
                f" Known paths: {self.paths}."
            )
        return index

    def check(self, index, grad):
        """Returns `grad` as a tensor of its variable's dtype, or raises."""
        if grad is None:
            return None
        variable = self.variables[index]
        where = f"Gradient {index} (variable '{self.paths[index]}')"
        if isinstance(grad, tf.IndexedSlices):
            values = self._cast(where, variable, grad.values)
            if not values.shape[1:].is_compatible_with(variable.shape[1:]):
                raise ValueError(
                    f"{where} is a sparse update with rows of shape"
                    f" {values.shape[1:]}, but the variable's rows have shape"
                    f" {tuple(variable.shape[1:])}."
                )
            return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
        try:
            tensor = tf.convert_to_tensor(grad)
        except (TypeError, ValueError) as e:
            raise TypeError(
                f"{where} cannot be made a tensor: {e}. Received: {grad!r}"
            ) from None
        tensor = self._cast(where, variable, tensor)
        var_shape = tuple(variable.shape)
        if not tensor.shape.is_compatible_with(var_shape):
            message = (
                f"{where} has shape {tuple(tensor.shape)}, but the variable has"
                f" shape {var_shape}."
            )
            axes = _sum_axes(tuple(tensor.shape), var_shape)
            if axes is not None:
                fix = f"tf.reduce_sum(grad, axis={axes})"
                if len(axes) > len(tensor.shape) - len(var_shape):
                    fix = f"tf.reshape({fix}, {var_shape})"
                message += f" It could be summed to fit over axes {axes}: {fix}."
            else:
                message += f" Pass a gradient of shape {var_shape}."
            raise ValueError(message)
        return tensor

    def _cast(self, where, variable, tensor):
        target = tf.as_dtype(variable.dtype)
        dtype = tensor.dtype
        if dtype == target:
            return tensor
        if not (dtype.is_floating or dtype.is_integer) or dtype == tf.bool:
            raise TypeError(
                f"{where} has dtype {dtype.name}, which cannot be cast to the"
                f" variable's dtype {target.name}. Pass a real-valued gradient."
            )
        return tf.cast(tensor, target)

    def apply(self, optimizer, grads):
        """Masks `grads` and applies them; left-out variables do not move."""
        masker = self.masker
        with tf.init_scope():
            masker.sync(0, prepared=False)
        view = masker.begin_step(optimizer, masker.update_mode())
        idle = [v for v, g in zip(self.variables, grads) if g is None]
        idle += self.untouched
        if not any(each.use_ema for each in internals.optimizers_within(optimizer)):
            idle = []
        with update.pinned(optimizer, idle):
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Gradients do not exist")
                pipeline.run(masker, view, grads)
