"""Declaring gradient masks on layers: `set_mask`, `get_mask`, and finding them in a model."""

import weakref

import keras

from maskfit import internals, support
from maskfit.spec import gate, version
from maskfit.spec import masks as specs

__all__ = ["all_masked_layers", "get_mask", "masked_layers", "set_mask"]

_SPEC_ATTR = "_maskfit_grad_mask"
_masked = weakref.WeakSet()


def set_mask(layer, spec):
    """Declares which of `layer`'s parameters may learn, and returns `layer`.

    The spec is stored on the layer object, so it holds whether the layer sits
    in a functional, Sequential or subclassed model, or inside a nested model.
    `MaskedModel` (and `maskfit.apply_gradients`) read it when they build their
    training step. A layer that is not built yet is checked again at build time.

    Args:
      layer: a `keras.layers.Layer`.
      spec: a `maskfit.OutputMask` or `maskfit.ElementMask`, or None to remove
        the layer's mask.

    Returns:
      `layer`, so that `y = set_mask(keras.layers.Dense(2), spec)(x)` chains.

    Raises:
      TypeError: if `layer` is not a Keras layer or `spec` is not a mask spec.
      ValueError: if the spec does not fit the layer (see the spec classes).

    Example:

    >>> import keras, maskfit
    >>> dense = maskfit.set_mask(keras.layers.Dense(2), maskfit.OutputMask([1, 0]))
    >>> maskfit.get_mask(dense)
    OutputMask([1.0, 0.0], backprop=False)
    >>> _ = maskfit.set_mask(dense, None)
    >>> maskfit.get_mask(dense) is None
    True
    """
    if not isinstance(layer, keras.layers.Layer):
        raise TypeError(
            "set_mask expects a keras.layers.Layer as its first argument."
            f" Received: {layer!r} of type {type(layer).__name__}"
        )
    spec = specs.as_grad_mask_spec(spec, f"set_mask on layer '{layer.name}'")
    if getattr(spec, "backprop", False):
        support.require("backprop_gate", f"set_mask on layer '{layer.name}'")
    if spec is not None:
        spec.check_layer(layer)
    return restore_mask(layer, spec)


def restore_mask(layer, spec):
    """Stores a checked `spec` on `layer` (what `set_mask` and loading share).

    Loading does not ask the backend: a file saved with a `backprop=True`
    mask loads and trains under either backend (`maskfit.spec.gate`).
    """
    internals.set_untracked(layer, _SPEC_ATTR, spec)
    _masked.add(layer)
    if getattr(spec, "backprop", False):
        gate.install(layer, get_mask)
    version.bump()
    return layer


def get_mask(layer):
    """Returns the mask spec declared on `layer`, or None when it has none.

    Example:

    >>> import keras, maskfit
    >>> maskfit.get_mask(keras.layers.Dense(2)) is None
    True
    """
    return getattr(layer, _SPEC_ATTR, None)


def masked_layers(model):
    """Returns `[(layer, spec)]` for `model` and every layer nested in it.

    Raises:
      ValueError: when a masked layer sits inside a
        `keras.layers.SpectralNormalization`, which rewrites its kernel in
        `call()`, outside the optimizer, so no mask could hold.
    """
    layers = [model] + internals.sublayers(model)
    for layer in layers:
        if isinstance(layer, keras.layers.SpectralNormalization):
            inner = [layer.layer] + internals.sublayers(layer.layer)
            masked = [x.name for x in inner if get_mask(x) is not None]
            if masked:
                raise ValueError(
                    f"Layer '{masked[0]}' carries a gradient mask but is wrapped by"
                    f" SpectralNormalization '{layer.name}', which rewrites its"
                    " kernel inside call() on every training step, outside the"
                    " optimizer, so frozen entries would move. Remove the mask, or"
                    " the SpectralNormalization wrapper."
                )
    return [(layer, get_mask(layer)) for layer in layers if get_mask(layer)]


def all_masked_layers():
    """Returns `[(layer, spec)]` for every live layer that carries a mask."""
    return [(layer, get_mask(layer)) for layer in list(_masked) if get_mask(layer)]
