"""Masks in a model config: written by `get_config`, checked whole by `from_config`."""

import difflib

import keras

from maskfit import declare
from maskfit import internals
from maskfit import specs

__all__ = ["layer_at", "layer_paths", "masks_to_config", "masks_from_config"]


def layer_paths(model):
    """Returns `{path: layer}` for every layer nested in `model`.

    A path joins layer names from the model down, e.g. `"encoder/dense_1"`, so
    it names the same layer in a model rebuilt from its config.
    """
    paths = {}

    def walk(layer, prefix):
        for child in internals.sublayers(layer, recursive=False):
            path = prefix + child.name
            if path not in paths:
                paths[path] = child
                walk(child, path + "/")

    walk(model, "")
    return paths


def layer_at(model, layers, path, what):
    """Returns `layers[path]`, for `layers` from `layer_paths(model)`.

    Raises:
      ValueError: naming the path, the closest one and every layer's, when
        the saved `what` (e.g. "gradient masks") name a layer `model` lacks.
    """
    layer = layers.get(path)
    if layer is None:
        close = difflib.get_close_matches(path, list(layers), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ValueError(
            f"The saved {what} name layer '{path}', which model"
            f" '{model.name}' does not have.{hint} Its layers are"
            f" {sorted(layers)}."
        )
    return layer


def masks_to_config(model):
    """Returns `{layer path: serialized spec}` for the masked layers of `model`."""
    return {
        path: keras.saving.serialize_keras_object(declare.get_mask(layer))
        for path, layer in layer_paths(model).items()
        if declare.get_mask(layer) is not None
    }


def masks_from_config(model, config):
    """Sets the masks in `config` on `model`'s layers, all or none.

    Every entry is deserialized and checked against its layer first; only then
    are the masks set, so a bad entry leaves every mask of the model as it was.

    Raises:
      ValueError: naming the entry, when a path names no layer of the model or
        a spec does not fit its layer.
    """
    layers = layer_paths(model)
    checked = []
    for path, serialized in config.items():
        layer = layer_at(model, layers, path, "gradient masks")
        try:
            spec = keras.saving.deserialize_keras_object(serialized)
            spec = specs.as_grad_mask_spec(spec, f"The saved mask of layer '{path}'")
            spec.check_layer(layer)
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"The saved gradient mask of layer '{path}' does not fit it: {e}"
            ) from e
        checked.append((layer, spec))
    for layer, spec in checked:
        declare.set_mask(layer, spec)
