"""What a masked model saves beside Keras's state: keep masks, the optimizer's layout, config.

- Keep masks of rules (pruning) are state the weights do not tell (ties,
  kept weights that are exactly 0): saved bit-packed in the model's weights
  file, one entry per variable, keyed by the variable's path. A rule's own
  state (`MaskRule.state_variables`, e.g. importance sums) is saved beside
  them, keyed by the rule's layer path and the state's name.
- Masks decide which variables the optimizer has slots for (none for a
  variable whose mask is all 0), and a program that loads a file may plan
  another step first: the variables the optimizer was built for are
  recorded by path, and loading builds the optimizer that way before its
  variables are read.
- Mask specs and rules go into the model's config, by layer path
  (`maskfit.spec.config`).

Files saved by maskfit 0.1.0 keyed keep masks and the optimizer's variables
by position in the trainable list; they still load.
"""

import contextlib
import json
import os
import tempfile
import urllib.parse

import keras
import numpy as np

from maskfit import paths
from maskfit.model import training
from maskfit.optim import rebuild
from maskfit.spec import config as config_lib
from maskfit.spec import rules as rules_lib

__all__ = ["MaskedPersistence"]

# One entry per keep mask: the prefix, then the variable's key, percent-encoded.
_KEEP_PREFIX = "maskfit_keep:"
# The keys of the variables the optimizer has slots for, as JSON bytes.
_LAYOUT_KEY = "maskfit_optimizer_layout"
# One entry per rule state variable: the prefix, the rule's layer path ("" for
# the model's own rule) and the state's name, each percent-encoded.
_STATE_PREFIX = "maskfit_rule_state:"
# maskfit 0.1.0: `maskfit_keep_<position>` and positions under this key.
_LEGACY_KEEP_PREFIX = "maskfit_keep_"
_LEGACY_LAYOUT_KEY = "maskfit_optimizer_variables"


def _encode(key):
    return _KEEP_PREFIX + urllib.parse.quote(key, safe="")


def _decode(entry):
    return urllib.parse.unquote(entry[len(_KEEP_PREFIX) :])


def _encode_state(path, name):
    quote = urllib.parse.quote
    return f"{_STATE_PREFIX}{quote(path, safe='')}:{quote(name, safe='')}"


def _decode_state(entry):
    path, name = entry[len(_STATE_PREFIX) :].split(":")
    return urllib.parse.unquote(path), urllib.parse.unquote(name)


def _rule_layers(model):
    """`{layer path: (layer, rule)}` of the rules declared on `model` ("": its own)."""
    found = {}
    if rules_lib.get_rule(model) is not None:
        found[""] = (model, rules_lib.get_rule(model))
    for path, layer in paths.layer_paths(model).items():
        if rules_lib.get_rule(layer) is not None:
            found[path] = (layer, rules_lib.get_rule(layer))
    return found


def _extend_after_loading(optimizer, variables):
    """Once `optimizer`'s saved variables are read, builds it for all `variables`.

    A file saved on TensorFlow has no optimizer state for a variable whose
    mask is all 0, and the saved layout built the optimizer without it, so
    that Keras reads the saved state into the right slots. The JAX step
    updates every trainable variable (holding frozen entries), so the
    optimizer is then built for all of them, the missing ones with a fresh
    optimizer's state, as TensorFlow gives a variable that learns again.
    """
    load = optimizer.load_own_variables

    def load_then_extend(store):
        load(store)
        del optimizer.load_own_variables  # the class's method again
        rebuild.rebuild(optimizer, variables)

    optimizer.load_own_variables = load_then_extend


def _strategy_scope(model):
    """The scope of the model's `tf.distribute` strategy (none under JAX)."""
    strategy = getattr(model, "distribute_strategy", None)
    return contextlib.nullcontext() if strategy is None else strategy.scope()


def _as_json(value):
    return np.frombuffer(json.dumps(value).encode("utf-8"), np.uint8)


def _from_json(array):
    return json.loads(np.asarray(array, np.uint8).tobytes().decode("utf-8"))


_BACKEND_OPTIMIZERS = "keras.src.backend."


def _public_optimizers(config):
    """`config` with each backend's optimizer subclass named by its public class."""
    if isinstance(config, list):
        return [_public_optimizers(item) for item in config]
    if not isinstance(config, dict):
        return config
    config = {k: _public_optimizers(v) for k, v in config.items()}
    module = config.get("module")
    if (
        isinstance(module, str)
        and module.startswith(_BACKEND_OPTIMIZERS)
        and ".optimizers." in module
        and hasattr(keras.optimizers, str(config.get("class_name")))
    ):
        config["module"] = "keras.optimizers"
    return config


class MaskedPersistence:
    """Saving and loading of `MaskedModel` and `MaskedSequential`: weights, config, pickle."""

    def save_own_variables(self, store):
        super().save_own_variables(store)
        keys = paths.variable_keys(self, self._all_trainable_weights())
        for index, keep in training.keep_masks(self).items():
            store[_encode(keys[index])] = np.packbits(np.asarray(keep).ravel())
        for path, (layer, rule) in _rule_layers(self).items():
            for name, variable in rule.state_variables(layer).items():
                store[_encode_state(path, name)] = np.asarray(variable.numpy())
        optimizer = getattr(self, "optimizer", None)
        masker = training.masker_of(self)
        if optimizer is None or not optimizer.built or masker is None:
            return
        if not masker.masked_indices:
            return
        key_of = {id(v): k for v, k in zip(self._all_trainable_weights(), keys)}
        built = [key_of.get(id(v)) for v in rebuild.built_variables(optimizer)]
        if None not in built:
            store[_LAYOUT_KEY] = _as_json(built)

    def load_own_variables(self, store):
        variables = self._all_trainable_weights()
        keys = paths.variable_keys(self, variables)
        own = {}
        for entry in list(store.keys()):
            if entry.startswith(_KEEP_PREFIX):
                own[entry] = ("keep", _decode(entry))
            elif entry.startswith(_LEGACY_KEEP_PREFIX):
                own[entry] = ("keep", _legacy_key(self, keys, entry))
            elif entry in (_LAYOUT_KEY, _LEGACY_LAYOUT_KEY):
                own[entry] = ("layout", None)
            elif entry.startswith(_STATE_PREFIX):
                own[entry] = ("state", _decode_state(entry))
        keeps, layout, state = {}, None, {}
        for entry, (kind, key) in own.items():
            if kind == "keep":
                keeps[key] = np.asarray(store[entry])
            elif kind == "state":
                state[key] = np.asarray(store[entry])
            elif entry == _LAYOUT_KEY:
                layout = _from_json(store[entry])
            else:
                layout = [keys[int(i)] for i in np.asarray(store[entry])]
        if keeps:
            self._load_keeps(keeps, variables, keys)
        if state:
            self._load_rule_state(state)
        if layout is not None:
            optimizer = getattr(self, "optimizer", None)
            if optimizer is not None:
                by_key = dict(zip(keys, variables))
                missing = [k for k in layout if k not in by_key]
                if missing:
                    raise ValueError(
                        f"The weights being loaded record optimizer state for"
                        f" variables {missing}, which model '{self.name}' does not"
                        " have. Load weights saved from a model of the same structure."
                    )
                with _strategy_scope(self):
                    rebuild.rebuild(optimizer, [by_key[k] for k in layout])
                if keras.backend.backend() == "tensorflow":
                    # The next call plans the step for the loaded optimizer step.
                    self._maskfit_lifecycle().mark_stale()
                else:
                    _extend_after_loading(optimizer, variables)
        if own:
            store = {k: store[k] for k in store.keys() if k not in own}
        super().load_own_variables(store)

    def _load_keeps(self, packed, variables, keys):
        """Unpacks saved keep masks; the masker gets them now or when planned."""
        by_key = dict(zip(keys, variables))
        values = {}
        for key, bits in packed.items():
            variable = by_key.get(key)
            if variable is None:
                raise ValueError(
                    f"The weights being loaded hold a pruning keep mask for variable"
                    f" '{key}', which model '{self.name}' does not have as a"
                    f" trainable variable (it has {keys}). Load weights saved from a"
                    " model of the same structure."
                )
            shape = tuple(variable.shape)
            unpacked = np.unpackbits(
                np.asarray(bits, np.uint8), count=int(np.prod(shape))
            )
            values[key] = unpacked.astype(bool).reshape(shape)
        lifecycle = self._maskfit_lifecycle()
        lifecycle.pending_keeps = {**lifecycle.pending_keeps, **values}
        lifecycle.load_pending_keeps()

    def _load_rule_state(self, values):
        """Assigns saved rule state `{(layer path, name): array}` (all checked first)."""
        rules = _rule_layers(self)
        assignments = []
        for (path, name), value in values.items():
            layer, rule = rules.get(path, (None, None))
            where = f"layer '{path}'" if path else f"model '{self.name}'"
            if rule is None:
                raise ValueError(
                    f"The weights being loaded hold state '{name}' of a mask rule on"
                    f" {where}, which has no rule in model '{self.name}' (rules on"
                    f" {sorted(rules) or 'no layer'}). Declare the same rules before"
                    " loading, or load a model saved with them."
                )
            state = rule.state_variables(layer)
            variable = state.get(name)
            if variable is None or tuple(variable.shape) != value.shape:
                found = "none" if variable is None else f"shape {tuple(variable.shape)}"
                raise ValueError(
                    f"The weights being loaded hold state '{name}' of shape"
                    f" {value.shape} for the mask rule {type(rule).__name__} on"
                    f" {where}, which has {found} under that name (its state:"
                    f" {sorted(state)}). Load weights saved with the same rule."
                )
            assignments.append((variable, value))
        with _strategy_scope(self):
            for variable, value in assignments:
                variable.assign(value)

    def get_config(self):
        config = super().get_config()
        grad_masks = config_lib.masks_to_config(self)
        if grad_masks:
            config["grad_masks"] = grad_masks
        rules = config_lib.rules_to_config(self)
        if rules:
            config["mask_rules"] = rules
        return config

    def get_compile_config(self):
        # Keras's torch backend builds its own subclass of each optimizer
        # (`keras.src.backend.torch.optimizers.torch_adamw.AdamW`) and saves
        # that module: another backend would import torch to load the file.
        # Saved as the public class, the file loads under every backend.
        config = super().get_compile_config()
        return None if config is None else _public_optimizers(config)

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        grad_masks = config.pop("grad_masks", None)
        rules = config.pop("mask_rules", None)
        model = super().from_config(config, custom_objects=custom_objects)
        if grad_masks:
            config_lib.masks_from_config(model, grad_masks)
        if rules:
            config_lib.rules_from_config(model, rules)
        return model

    def __reduce__(self):
        # Pickle and deepcopy go through a saved `.keras` file, as Keras's own
        # `__reduce__` does, but with a function pickle can find by name (the
        # functional variant classes are made at run time).
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "model.keras")
            self.save(path)
            with open(path, "rb") as f:
                return (_unpickle, (f.read(),))


def _legacy_key(model, keys, entry):
    """The key of the variable a 0.1.0 entry `maskfit_keep_<position>` names."""
    index = int(entry[len(_LEGACY_KEEP_PREFIX) :])
    if index >= len(keys):
        raise ValueError(
            f"The weights being loaded hold a pruning keep mask for trainable"
            f" variable {index}, but model '{model.name}' has {len(keys)} trainable"
            " variables. Load weights saved from a model of the same structure."
        )
    return keys[index]


def _unpickle(data):
    """Rebuilds a model pickled by `MaskedPersistence.__reduce__`."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.keras")
        with open(path, "wb") as f:
            f.write(data)
        return keras.saving.load_model(path, safe_mode=False)
