"""The masking stage of a training step: mask gradients, apply, keep frozen entries exact."""

import keras
import numpy as np
import tensorflow as tf

from maskfit import declare

__all__ = ["GradientMasker", "resolve_masks"]


def resolve_masks(layer_specs, variables):
    """Maps positions in `variables` to `(layer, kind, mask)` from layers' specs.

    Args:
      layer_specs: `[(layer, spec)]`, e.g. from `declare.masked_layers(model)`.
      variables: the list of trainable variables the step updates.

    Returns:
      A dict `{index: (layer, kind, mask)}`; `mask` is a float32 array of shape
      `(units,)` for kind `"output"` and of the variable's shape for `"element"`.

    Raises:
      ValueError: when a spec does not fit its layer, a layer with a mask has
        no trainable variables, or two specs cover the same variable.
    """
    position = {id(v): i for i, v in enumerate(variables)}
    entries = {}
    for layer, spec in layer_specs:
        if not layer.trainable_weights:
            raise ValueError(
                f"Layer '{layer.name}' carries {spec!r} but has no trainable"
                " variables, so the mask would do nothing. Remove it with"
                f" set_mask(layer, None), or set layer.trainable = True."
            )
        for variable, mask, kind in spec.resolve(layer):
            index = position.get(id(variable))
            if index is None:
                continue
            if index in entries:
                raise ValueError(
                    f"Variable '{variable.path}' is covered by the mask of layer"
                    f" '{entries[index][0].name}' and by that of layer"
                    f" '{layer.name}'. Declare its mask on one layer only."
                )
            if kind == "element":
                mask = np.broadcast_to(mask, tuple(variable.shape))
            entries[index] = (layer, kind, np.asarray(mask, np.float32))
    return entries


def moves_zero_gradient_entries(optimizer, variable):
    """Whether `optimizer` can move an entry of `variable` whose gradient is 0.

    Only plain SGD (no momentum, weight decay, clipping, EMA) on a variable
    without a constraint is known to leave such entries bit-identical; every
    other optimizer gets a snapshot and restore around its update.
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if type(inner) is not keras.optimizers.SGD:
        return True
    settings = (
        inner.momentum,
        inner.weight_decay,
        inner.use_ema,
        inner.clipnorm,
        inner.clipvalue,
        inner.global_clipnorm,
    )
    return any(settings) or variable.constraint is not None


def _where_masked(gradient, mask):
    # One kernel, not three (compare, multiply, select): `multiply_no_nan`
    # gives +0 wherever the mask is 0, even for a NaN or Inf gradient, and
    # `gradient * mask` elsewhere, exactly as the select did. In graph mode
    # this halves the masking cost per entry; XLA fused the three anyway.
    return tf.math.multiply_no_nan(gradient, tf.cast(mask, gradient.dtype))


def _mask_gradient(gradient, mask, kind):
    if isinstance(gradient, tf.IndexedSlices):
        rows = tf.gather(mask, gradient.indices) if kind == "element" else mask
        values = _where_masked(gradient.values, rows)
        return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)
    return _where_masked(gradient, mask)


def _variable_handle(variable):
    return variable.value if isinstance(variable, keras.Variable) else variable


class GradientMasker:
    """Holds one model's masks as state and applies them in its training step.

    The masks live in non-trainable `tf.Variable`s made once, outside the
    compiled step, so the step reads them instead of baking them in: new mask
    values (same structure) reach the next step without a retrace.

    In the step, `mask_gradients` zeroes (or scales) the gradient entries of
    masked units or entries with `multiply_no_nan`, so NaN or Inf there never spreads,
    and clipping sees only what may learn. `apply` then runs the optimizer and,
    for every optimizer that can move a zero-gradient entry (weight decay,
    momentum, Adam history, EMA, constraints...), restores each frozen entry
    from a snapshot taken just before, so it stays bit-identical.

    Args:
      variables: the trainable variables of the step, in its order.
      layer_specs: a callable returning `[(layer, spec)]`, the masks to read,
        e.g. `lambda: declare.masked_layers(model)`.
    """

    def __init__(self, variables, layer_specs):
        self._layer_specs = layer_specs
        self._variables = list(variables)
        self._entries = {}
        self._masks = {}
        self._gates = {}
        self._version = None
        self.update()

    @property
    def masked_indices(self):
        """Positions, in the step's variable list, of the variables with a mask."""
        return sorted(self._masks)

    def mask_value(self, index):
        """Returns the current mask of variable `index` as a numpy array."""
        return self._masks[index].numpy()

    def update(self):
        """Reads the specs again; returns True if the step must retrace.

        Values of existing masks are assigned in place. A variable that had a
        mask and lost it keeps an all-ones mask, so removal needs no retrace.
        """
        version = declare.mask_version()
        if version == self._version:
            return False
        layer_specs = self._layer_specs()
        entries = resolve_masks(layer_specs, self._variables)
        retrace = False
        for index, (layer, kind, mask) in entries.items():
            known = self._entries.get(index)
            if known is not None and known[1] == kind and known[2].shape == mask.shape:
                self._masks[index].assign(tf.cast(mask, self._masks[index].dtype))
            else:
                self._masks[index] = self._new_variable(index, mask)
                retrace = True
            self._entries[index] = (layer, kind, mask)
        for index, (layer, kind, mask) in list(self._entries.items()):
            if index not in entries:
                ones = np.ones_like(mask)
                self._masks[index].assign(tf.cast(ones, self._masks[index].dtype))
                self._entries[index] = (layer, kind, ones)
        retrace |= self._update_gates(layer_specs)
        self._version = version
        return retrace

    def _new_variable(self, index, mask):
        variable = self._variables[index]
        name = "grad_mask/" + variable.path.replace(":", "_")
        return tf.Variable(
            tf.constant(mask, dtype=variable.dtype),
            trainable=False,
            name=name.replace("/", "_"),
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )

    def _update_gates(self, layer_specs):
        retrace = False
        for layer, spec in layer_specs:
            if not getattr(spec, "backprop", False):
                continue
            gate = self._gates.get(id(layer))
            if gate is not None and gate.shape == spec.values.shape:
                gate.assign(spec.values)
                continue
            gate = tf.Variable(spec.values, trainable=False, name="grad_gate")
            self._gates[id(layer)] = gate
            declare.set_gate_values(layer, gate)
            retrace = True
        return retrace

    def mask_gradients(self, gradients):
        """Returns `gradients` with every mask applied (traced once)."""
        gradients = list(gradients)
        for index, mask in self._masks.items():
            if gradients[index] is not None:
                kind = self._entries[index][1]
                gradients[index] = _mask_gradient(gradients[index], mask, kind)
        return gradients

    def apply(self, optimizer, gradients, variables=None):
        """Runs `optimizer.apply` and keeps every frozen entry bit-identical."""
        variables = self._variables if variables is None else list(variables)
        guarded = [
            i
            for i in self._masks
            if moves_zero_gradient_entries(optimizer, variables[i])
        ]
        snapshots = [tf.identity(_variable_handle(variables[i])) for i in guarded]
        optimizer.apply(gradients, variables)
        if guarded:
            self._restore(
                optimizer,
                [variables[i] for i in guarded],
                snapshots,
                [self._masks[i] for i in guarded],
            )

    def _restore(self, optimizer, variables, snapshots, masks):
        averages = _ema_averages(optimizer, variables)
        targets = [_variable_handle(v) for v in variables]

        def restore(target, snapshot, mask):
            frozen = tf.equal(mask, tf.zeros([], mask.dtype))
            return target.assign(tf.where(frozen, snapshot, target))

        def restore_all(distribution, snapshots):
            for target, snapshot, mask, average in zip(
                targets, snapshots, masks, averages
            ):
                distribution.extended.update(
                    target, restore, args=(snapshot, mask), group=False
                )
                if average is not None:
                    distribution.extended.update(
                        _variable_handle(average),
                        restore,
                        args=(snapshot, mask),
                        group=False,
                    )

        tf.__internal__.distribute.interim.maybe_merge_call(
            restore_all, tf.distribute.get_strategy(), snapshots
        )


def _ema_averages(optimizer, variables):
    """Returns each variable's EMA average in `optimizer`, or None per variable.

    Keras keeps the averages privately; a frozen entry's average is pinned to
    its value so that `finalize_variable_values` at the end of `fit` (which
    copies the averages into the model) cannot move it.
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    averages = getattr(inner, "_model_variables_moving_average", None)
    if not inner.use_ema or not averages:
        return [None] * len(variables)
    index = {id(v): i for i, v in enumerate(inner._trainable_variables)}
    return [averages[index[id(v)]] if id(v) in index else None for v in variables]
