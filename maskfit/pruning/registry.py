"""Which variables of a layer are pruned: TF-MOT's registry, for Keras 3 layers.

What each built-in class prunes is the `prunable` field of its record
(`maskfit.kinds`: TF-MOT's kernels and embeddings, never biases or
normalization parameters); a layer's own `get_prunable_weights()` comes
first, in maskfit's one lookup order (`maskfit.records.Lookup`).
"""

import abc
import collections

import keras

from maskfit import internals, records
from maskfit.units.keras_layers import LAYERS as L

__all__ = [
    "PrunableLayer",
    "RegistryEntry",
    "classify",
    "prunable_layers",
    "prunable_weights",
]

_LOOKUP = records.Lookup("prunable", "get_prunable_weights")


def _direct_sublayers(layer):
    """The layers tracked directly by `layer` (an RNN's cell, a wrapper's layer)."""
    return internals.sublayers(layer, recursive=False)


# Bases of custom layers: what their subclasses prune is the subclass's call.
BASE_CLASSES = frozenset({L.Layer, L.Wrapper})


class PrunableLayer(abc.ABC):
    """Mixin for custom layers that say which of their variables are pruned.

    `tfmot.sparsity.keras.PrunableLayer` for Keras 3. Any layer with a
    `get_prunable_weights()` method is asked, whether it mixes this in or not.

    Example:

    >>> import keras, maskfit.pruning as pruning
    >>> class Scaled(pruning.PrunableLayer, keras.layers.Layer):
    ...     def build(self, input_shape):
    ...         self.kernel = self.add_weight(shape=(input_shape[-1], 2), name="kernel")
    ...         self.scale = self.add_weight(shape=(2,), name="scale")
    ...     def call(self, x):
    ...         return x @ self.kernel * self.scale
    ...     def get_prunable_weights(self):
    ...         return [self.kernel]
    >>> layer = Scaled()
    >>> layer.build((None, 3))
    >>> [v.name for v in pruning.prunable_weights(layer)]
    ['kernel']
    """

    @abc.abstractmethod
    def get_prunable_weights(self):
        """Returns the list of this layer's variables to prune (may be empty)."""


class RegistryEntry(
    collections.namedtuple("RegistryEntry", ["kind", "weights", "reason"])
):
    """What the registry says about a layer class.

    Attributes:
      kind: "prunable" (the variables named in `weights`), "container" (through
        its sublayers), "none" (no prunable weights), "unsupported" (refused,
        see `reason`) or "custom" (not a built-in class: the layer declares
        its weights with `get_prunable_weights()`, or has none of its own).
      weights: the names of the pruned variables ("prunable" only); a name in
        brackets is pruned when the layer has it.
      reason: why an "unsupported" class is refused, else "".

    Example:

    >>> import keras, maskfit.pruning as pruning
    >>> entry = pruning.classify(keras.layers.Dense)
    >>> entry.kind, entry.weights
    ('prunable', ('kernel',))
    >>> pruning.classify(keras.layers.LSTM).kind  # pruned through its cell
    'container'
    """


def classify(layer_class):
    """Returns the `RegistryEntry` of a layer class (exact class, as TF-MOT).

    A subclass of a built-in layer is "custom": it may add variables, so it
    declares its prunable weights itself.

    Example:

    >>> import keras, maskfit.pruning as pruning
    >>> pruning.classify(keras.layers.Dense)
    RegistryEntry(kind='prunable', weights=('kernel',), reason='')
    >>> pruning.classify(keras.layers.DepthwiseConv2D).kind
    'none'
    """
    prunable = _LOOKUP.builtin(layer_class)
    if isinstance(prunable, records.Prunable):
        optional = tuple(f"[{n}]" for n in prunable.optional)
        return RegistryEntry("prunable", prunable.weights + optional, "")
    if prunable == records.CONTAINER:
        return RegistryEntry("container", (), "")
    if prunable == records.NO_WEIGHTS:
        return RegistryEntry("none", (), "")
    if isinstance(prunable, records.Unsupported):
        return RegistryEntry("unsupported", (), prunable.reason)
    return RegistryEntry("custom", (), "")


def prunable_weights(layer):
    """Returns the variables that pruning `layer` prunes, in a fixed order.

    Built-in layers follow TF-MOT's registry (kernels, embeddings, RNN kernels
    and recurrent kernels, attention projection kernels; never biases or
    normalization parameters; see `classify`). A layer with a
    `get_prunable_weights()` method (as `tfmot.sparsity.keras.PrunableLayer`)
    is asked. A model, or any other layer without variables of its own, is
    pruned through its sublayers.

    Args:
      layer: a built `keras.layers.Layer` or `keras.Model`.

    Returns:
      A list of variables, each once.

    Raises:
      ValueError: naming the layer, when it (or a sublayer) is not built, is
        refused by the registry, has LoRA enabled or is quantized, or is a
        custom layer with variables of its own and no `get_prunable_weights()`.

    Example:

    >>> import keras, maskfit.pruning as pruning
    >>> model = keras.Sequential([
    ...     keras.Input((3,)), keras.layers.Dense(4),
    ...     keras.layers.BatchNormalization(), keras.layers.Dense(2)])
    >>> [v.path for v in pruning.prunable_weights(model)]
    ['sequential/dense/kernel', 'sequential/dense_1/kernel']
    """
    return [v for _, variables in prunable_layers(layer) for v in variables]


def prunable_layers(layer):
    """Returns `[(owner, variables)]`: each layer that owns prunable variables.

    The owner is the layer whose class (or `get_prunable_weights()`) claims
    the variables, e.g. the `LSTMCell` of an `LSTM`, the `EinsumDense`
    projections of a `MultiHeadAttention`. Shared layers appear once. Raises
    as `prunable_weights` does.

    Example:

    >>> import keras, maskfit.pruning as pruning
    >>> lstm = keras.layers.LSTM(4)
    >>> lstm.build((None, 5, 3))
    >>> [(owner.name, [v.name for v in variables])
    ...  for owner, variables in pruning.prunable_layers(lstm)]
    [('lstm_cell', ['kernel', 'recurrent_kernel'])]
    """
    if not isinstance(layer, keras.layers.Layer):
        raise TypeError(
            "prunable_layers expects a keras.layers.Layer or keras.Model."
            f" Received: {layer!r} of type {type(layer).__name__}"
        )
    found, seen = [], set()
    _walk(layer, found, seen)
    return found


def _walk(layer, found, seen):
    if id(layer) in seen:
        return
    seen.add(id(layer))
    if _LOOKUP.find(layer)[0] == "method":
        # A declaration wins over the registry, as in TF-MOT.
        _check_built(layer)
        found.append((layer, _declared(layer)))
        return
    entry = classify(type(layer))
    if entry.kind == "none":
        return
    if entry.kind == "unsupported":
        raise ValueError(
            f"Layer '{layer.name}' ({type(layer).__name__}) cannot be pruned:"
            f" {entry.reason}. Leave it out of pruning, or subclass it and define"
            " get_prunable_weights() returning the variables to prune."
        )
    _check_built(layer)
    if entry.kind == "prunable":
        found.append((layer, _named(layer, _LOOKUP.builtin(type(layer)))))
        return
    own = _own_float_variables(layer)
    if own:
        _raise_undeclared(layer, own)
    for sublayer in _direct_sublayers(layer):
        _walk(sublayer, found, seen)


def _check_built(layer):
    if not layer.built:
        raise ValueError(
            f"Layer '{layer.name}' ({type(layer).__name__}) is not built, so its"
            " variables do not exist yet. Build it first (call it on data, or"
            " build the model) and ask again."
        )


def _named(layer, prunable):
    names = prunable.weights
    _check_adapted(layer)
    by_name = {v.name: v for v in layer.weights}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise ValueError(
            f"Layer '{layer.name}' ({type(layer).__name__}) has no variable named"
            f" {missing}; its variables are {sorted(by_name)}. maskfit's registry"
            " expects them for this class: please report this with your Keras"
            " version."
        )
    optional = [n for n in prunable.optional if n in by_name]
    return [by_name[n] for n in tuple(names) + tuple(optional)]


def _declared(layer):
    declared = layer.get_prunable_weights()
    owned = {id(v) for v in layer.weights}
    items = list(declared) if isinstance(declared, (list, tuple)) else None
    bad = [
        item
        for item in items or ()
        if not isinstance(item, keras.Variable) or id(item) not in owned
    ]
    if items is None or bad:
        raise ValueError(
            f"Layer '{layer.name}' ({type(layer).__name__}).get_prunable_weights()"
            " must return a list of the layer's own variables, e.g."
            f" [self.kernel]. Received: {declared!r}"
            + (f", where {bad!r} is not one of them." if bad else ".")
        )
    unique = list({id(v): v for v in items}.values())
    for variable in unique:
        if not _is_float(variable):
            raise ValueError(
                f"Layer '{layer.name}' ({type(layer).__name__}) declares variable"
                f" '{variable.path}' of dtype {variable.dtype} as prunable; only"
                " floating-point variables can be pruned."
            )
    return unique


def _check_adapted(layer):
    if getattr(layer, "lora_enabled", False):
        raise ValueError(
            f"Layer '{layer.name}' ({type(layer).__name__}) has LoRA enabled: its"
            " kernel is frozen and the LoRA factors change it, so pruning the"
            " kernel would not make the layer sparse. Prune before enable_lora(),"
            " or merge the factors into the kernel first."
        )
    mode = getattr(layer, "quantization_mode", None)
    if mode is not None:
        raise ValueError(
            f"Layer '{layer.name}' ({type(layer).__name__}) is quantized"
            f" ({mode!r}); only floating-point kernels can be pruned. Prune"
            " before quantize()."
        )


def _own_float_variables(layer):
    inherited = {id(v) for sub in _direct_sublayers(layer) for v in sub.weights}
    return [v for v in layer.weights if id(v) not in inherited and _is_float(v)]


def _is_float(variable):
    return str(variable.dtype).startswith(("float", "bfloat"))


def _raise_undeclared(layer, own):
    cls = type(layer)
    builtin = next(
        (base for base in cls.__mro__[1:] if classify(base).kind != "custom"), None
    )
    subclass = (
        f" It subclasses keras.layers.{builtin.__name__}, but the registry matches"
        " exact classes only, since a subclass may add variables."
        if builtin is not None
        else ""
    )
    raise ValueError(
        f"Layer '{layer.name}' ({cls.__name__}) has variables"
        f" {[v.name for v in own]} and does not say which of them to prune.{subclass}"
        f" Define a method get_prunable_weights(self) on {cls.__name__} that"
        " returns the variables to prune, e.g. `return [self.kernel]` (or `[]`),"
        " as for tfmot.sparsity.keras.PrunableLayer."
    )
