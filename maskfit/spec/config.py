"""Masks and rules in a model config, by layer path (`maskfit.paths`): written by
`get_config`, checked whole by `from_config`."""

import keras

from maskfit import paths as paths_lib
from maskfit.spec import declare, rules
from maskfit.spec import masks as specs

__all__ = [
    "masks_from_config",
    "masks_to_config",
    "rules_from_config",
    "rules_to_config",
]


def masks_to_config(model):
    """Returns `{layer path: serialized spec}` for the masked layers of `model`."""
    return {
        path: keras.saving.serialize_keras_object(declare.get_mask(layer))
        for path, layer in paths_lib.layer_paths(model).items()
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
    layers = paths_lib.layer_paths(model)
    checked = []
    for path, serialized in config.items():
        layer = paths_lib.layer_at(model, layers, path, "gradient masks")
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
        declare.restore_mask(layer, spec)


def rules_to_config(model):
    """Returns `{layer path: serialized rule}`; the model's own rule is under ""."""
    config = {}
    if rules.get_rule(model) is not None:
        config[""] = keras.saving.serialize_keras_object(rules.get_rule(model))
    for path, layer in paths_lib.layer_paths(model).items():
        if rules.get_rule(layer) is not None:
            config[path] = keras.saving.serialize_keras_object(rules.get_rule(layer))
    return config


def rules_from_config(model, config):
    """Sets the rules of `config` (from `rules_to_config`) on `model`, all or none.

    Raises:
      ValueError: naming the entry, when a path names no layer of the model
        or a rule cannot be deserialized.
    """
    paths = paths_lib.layer_paths(model)
    checked = []
    for path, serialized in config.items():
        layer = (
            model
            if path == ""
            else paths_lib.layer_at(model, paths, path, "mask rules")
        )
        rule = keras.saving.deserialize_keras_object(serialized)
        if not isinstance(rule, rules.MaskRule):
            raise ValueError(
                f"The saved mask rule of layer '{path or model.name}' is not a"
                f" MaskRule: {rule!r}. Register its class with"
                " keras.saving.register_keras_serializable."
            )
        checked.append((layer, rule))
    for layer, rule in checked:
        # Checked above; a rule this backend cannot train with still loads.
        rules.restore_rule(layer, rule)
