"""From a layer's output-unit declaration to checked per-variable layouts.

`layer_units(layer)` validates the layer's `OutputUnits` against its
variables, turns each variable's ownership into a `UnitLayout` (the unit of
each entry, as a small constant index), checks it against the layer's real
gradients once (`maskfit.probe`), and caches the result on the layer.

A stock Keras layer's gradient structure is a function of its class, config
and build shapes (the probe draws its own values and inputs), so a check that
passed is not run again for another layer of the same signature: the 27
identical blocks of a ConvNeXt stage are checked once.
"""

import collections
import json
import math

import numpy as np
import tensorflow as tf

from maskfit import internals
from maskfit.units import lookup
from maskfit.units import probe as probe_lib
from maskfit.units.declaration import SHARED, refusal

__all__ = ["LayerUnits", "UnitLayout", "layer_units", "output_segments"]

_CACHE_ATTR = "_maskfit_layer_units"
# Signatures of stock Keras layers whose self-check passed (bounded, LRU).
_PASSED = collections.OrderedDict()
_PASSED_LIMIT = 4096


class UnitLayout:
    """How the `(units,)` values of an `OutputMask` expand onto one variable.

    `index` (int32, of a shape that broadcasts to the variable's) holds, for
    each entry, the unit it belongs to, or `units` for a shared entry, which
    gets the value 1 (learns freely). `expand` runs in the compiled step on
    the one `(units,)` mask variable, so the memory stays O(units).
    """

    def __init__(self, index, units):
        self.index = np.asarray(index, np.int32)
        self.units = int(units)
        self.shape = self.index.shape
        self.has_shared = bool(np.any(self.index == units))
        flat = self.index.reshape(-1)
        self._reshape_only = not self.has_shared and np.array_equal(
            flat, np.arange(units)
        )
        self.signature = (self.shape, self.units, self.index.tobytes())

    def expand(self, values):
        """Returns the mask for the variable, a tensor of `self.shape`."""
        if self._reshape_only:
            return tf.reshape(values, self.shape)
        if self.has_shared:
            values = tf.concat([values, tf.ones([1], values.dtype)], axis=0)
        return tf.gather(values, tf.constant(self.index))

    def expand_numpy(self, values):
        """`expand` in NumPy, for reports."""
        values = np.asarray(values)
        if self.has_shared:
            values = np.concatenate([values, np.ones([1], values.dtype)])
        return values[self.index]

    @property
    def shared(self):
        """Boolean array of `self.shape`: which entries are shared."""
        return self.index == self.units


class LayerUnits:
    """A layer's checked output units: `units`, per-variable layouts, outputs.

    Attributes:
      units: the number of output units.
      layouts: `((variable, UnitLayout or None), ...)`, one per trainable
        variable of the layer, None for a variable whose every entry is shared.
      outputs: per output tensor, `(axis, first_unit, stop or None)` or None.
    """

    def __init__(self, units, layouts, outputs):
        self.units = units
        self.layouts = tuple(layouts)
        self.outputs = outputs


def _layout(variable, ownership, units):
    shape = tuple(variable.shape)
    rank = len(shape)
    where = f"variable '{variable.path}' (shape {shape})"
    if units == 1:
        return UnitLayout(np.zeros((1,) * rank, np.int32), 1)
    if ownership is SHARED:
        return None
    axes = []
    for axis in ownership.axes:
        if not -rank <= axis < rank:
            raise ValueError(f"units_along axis {axis} is out of range for {where}.")
        axes.append(axis % rank)
    if len(set(axes)) != len(axes):
        raise ValueError(
            f"units_along axes {ownership.axes} repeat an axis of {where}."
        )
    axes = sorted(axes)
    length = math.prod(shape[a] for a in axes)
    if length % ownership.blocks:
        raise ValueError(
            f"units_along(blocks={ownership.blocks}) does not divide the"
            f" {length} positions along axes {tuple(axes)} of {where}."
        )
    per_block = length // ownership.blocks
    position = np.arange(length)
    unit = ownership.offset + position % per_block
    if ownership.offset + per_block > units:
        raise ValueError(
            f"The declaration maps {where} to units {ownership.offset}.."
            f"{ownership.offset + per_block - 1}, but the layer has {units} units."
        )
    unit[np.isin(position // per_block, ownership.shared_blocks)] = units
    if np.all(unit == units):
        return None
    broadcast = [shape[a] if a in axes else 1 for a in range(rank)]
    return UnitLayout(unit.reshape(broadcast), units)


def _resolve(layer, declared):
    """Validates the `OutputUnits` `declared` against `layer`; returns `LayerUnits`."""
    trainable = list(layer.trainable_weights)
    all_ids = {id(v) for v in layer.weights}
    given = {}
    for variable, ownership in declared.pairs(layer):
        if id(variable) not in all_ids:
            raise ValueError(
                f"The output-unit declaration of layer '{layer.name}' lists variable"
                f" '{getattr(variable, 'path', variable)}', which is not a variable"
                " of that layer."
            )
        if id(variable) in given:
            raise ValueError(
                f"The output-unit declaration of layer '{layer.name}' lists variable"
                f" '{variable.path}' twice."
            )
        given[id(variable)] = ownership
    missing = [v.path for v in trainable if id(v) not in given]
    if missing:
        raise ValueError(
            f"The output-unit declaration of layer '{layer.name}'"
            f" ({type(layer).__name__}) does not say how trainable variables"
            f" {missing} reach the outputs. List each one with"
            " maskfit.units_along(...) or maskfit.SHARED."
        )
    units = declared.units
    layouts = [(v, _layout(v, given[id(v)], units)) for v in trainable]
    if all(layout is None for _, layout in layouts):
        raise refusal(
            layer,
            f"every trainable entry affects several of its {units} output units"
            " (none belongs to one unit), so an OutputMask would freeze nothing",
        )
    return LayerUnits(units, layouts, declared.outputs)


def _cache_key(layer):
    # A new registration for the layer's class is a new declaring function.
    weights = tuple((id(v), tuple(v.shape)) for v in layer.trainable_weights)
    return (lookup.declaring_function(type(layer)), weights)


def _cached(layer):
    entry = getattr(layer, _CACHE_ATTR, None)
    if entry is not None and entry[0] == _cache_key(layer):
        return entry
    return None


def _signature(layer):
    """What a stock Keras layer's self-check depends on, or None.

    The class (and the declaring functions of it and its sublayers), the
    config without layer names, the build shapes, the dtype policy and the
    trainable variables' names, shapes and dtypes. Only for layers made of classes Keras defines, whose configs
    are complete; a user's layer or cell (even inside a Keras wrapper) may
    hold state its config does not say, and a `Lambda` runs any function, so
    those are always checked.
    """
    cls = type(layer)
    inner = [layer] + internals.sublayers(layer)
    if any(
        not type(sub).__module__.startswith("keras.") or type(sub).__name__ == "Lambda"
        for sub in inner
    ):
        return None  # a user's layer (or wrapped cell), or a Python function
    try:
        text = json.dumps(_nameless(layer.get_config()), sort_keys=True)
    except (TypeError, ValueError, NotImplementedError):
        return None
    shapes = layer.get_build_config()  # the probe's inputs have these shapes
    weights = tuple(
        (v.name, tuple(v.shape), str(v.dtype)) for v in layer.trainable_weights
    )
    policy = getattr(getattr(layer, "dtype_policy", None), "name", None)
    # A wrapper's check reads its inner layers' declarations too.
    declared = tuple(lookup.declaring_function(type(sub)) for sub in inner)
    return (declared, cls, text, repr(shapes), weights, policy)


def _nameless(config):
    """`config` without layer names (a wrapper's config holds its layer's).

    A layer's config is the dict with "trainable" beside "name"; a dtype
    policy's "name" ("mixed_float16") stays.
    """
    if isinstance(config, dict):
        layer = "trainable" in config
        return {
            k: _nameless(v) for k, v in config.items() if not (layer and k == "name")
        }
    if isinstance(config, (list, tuple)):
        return [_nameless(v) for v in config]
    return config


def output_segments(layer):
    """The unit axis of each of `layer`'s outputs (for the backprop gate)."""
    entry = _cached(layer)
    if entry is not None:
        return entry[1].outputs
    return lookup.output_units_of(layer).outputs


def layer_units(layer):
    """Returns `layer`'s checked `LayerUnits`, made once per layer and cached.

    Raises:
      ValueError: when the layer has no declaration, the declaration does not
        fit its variables, or the self-check finds that the layer's gradients
        disagree with it.
    """
    entry = _cached(layer)
    if entry is not None:
        return entry[1]
    declared = lookup.output_units_of(layer)
    resolved = _resolve(layer, declared)
    owners = {
        id(v): (
            (np.zeros((1,) * len(v.shape), np.int32) + resolved.units)
            if layout is None
            else layout.index
        )
        for v, layout in resolved.layouts
    }
    signature = _signature(layer)
    if signature is None or signature not in _PASSED:
        probe_lib.check(layer, resolved.units, declared.probes_for(layer), owners)
    if signature is not None:
        _PASSED[signature] = True
        _PASSED.move_to_end(signature)
        while len(_PASSED) > _PASSED_LIMIT:
            _PASSED.popitem(last=False)
    internals.set_untracked(layer, _CACHE_ATTR, (_cache_key(layer), resolved))
    return resolved
