"""Which calls of layers compute the same thing: one gradient check per signature.

A coupling's gradient check (`check` here, keras_hub's blocks in
`maskfit.structured.hub.check`) runs a layer on random inputs with random
weights drawn from a fixed seed, so its outcome depends only on what the
layer computes and on the shapes it is checked at: the layer's class, its
config (its name aside), the shape and dtype of each of its weights, the
input shape, and what the coupling says. Two calls that agree on all of
these get the same random values, take the same gradients and reach the
same verdict, so a model of 22 identical decoder blocks is checked once;
`Memo` keeps one small outcome per signature for one graph build.

The config read is the layer's own and every sublayer's (a block's
computation is its sublayers'), each class with it. Where a layer's
`get_config` raises (keras_hub 0.32's `LlamaTransformerDecoder` reads an
attribute it never sets), its `__init__` arguments stored as attributes
stand in, with the names of those it does not store. A layer or sublayer
whose config cannot be written as JSON (it holds a lambda, a closure, an
object without a config) has no signature and is checked on each call, as before.
"""

import inspect
import json

import keras

from maskfit import internals

__all__ = ["Memo", "signature"]


class _NoSignature(Exception):
    pass


def _unnamed(value):
    """Whether `value` is a lambda or a closure (what it computes is not its name)."""
    return inspect.isfunction(value) and (
        value.__name__ == "<lambda>" or value.__closure__ is not None
    )


def _closes_over(layer):
    """Whether an attribute of `layer` (not a method Keras wraps) is a lambda or closure."""
    return any(
        _unnamed(value)
        for name, value in vars(layer).items()
        if not hasattr(type(layer), name)
    )


def _plain(value):
    """A JSON stand-in for what a config holds besides plain values."""
    if isinstance(value, keras.initializers.Initializer) or (
        inspect.isfunction(value) and not _unnamed(value)
    ):
        # Initializers (the check draws its own weights) and named
        # module-level functions (activations): said by their serialization.
        return keras.saving.serialize_keras_object(value)
    raise _NoSignature(type(value).__name__)


def signature(layer, input_shape, *extra):
    """A hashable key of what a check of `layer` depends on, or None.

    Args:
      layer: the layer checked.
      input_shape: the input shape it is checked at.
      *extra: hashable descriptions of what is checked (the coupling's
        claims, relative to the layer's own weights and unit positions).

    Returns:
      A tuple, or None where the layer's config cannot say what it computes.

    Example:

    >>> import keras
    >>> a, b = keras.layers.Dense(4, name="a"), keras.layers.Dense(4, name="b")
    >>> a.build((None, 3)); b.build((None, 3))
    >>> signature(a, (None, 3)) == signature(b, (None, 3))
    True
    >>> c = keras.layers.Dense(4, activation="relu"); c.build((None, 3))
    >>> signature(a, (None, 3)) == signature(c, (None, 3))
    False
    """
    layers = [layer, *internals.sublayers(layer)]
    if any(_closes_over(each) for each in layers):
        return None  # a config writes a lambda's code, not the values it closes over
    try:
        text = json.dumps(
            [_config(each) for each in layers],
            sort_keys=True,
            default=_plain,
        )
    except _NoSignature:
        return None
    weights = tuple(
        (tuple(int(d) for d in variable.shape), str(variable.dtype))
        for variable in layer.weights
    )
    return (
        type(layer),
        text,
        weights,
        tuple(input_shape),
        str(getattr(layer, "compute_dtype", None)),
        extra,
    )


def _config(layer):
    """`[class, config without the name]` of one layer (raises `_NoSignature`)."""
    cls = type(layer)
    try:
        config = dict(layer.get_config())
    except Exception:  # noqa: BLE001 - a broken get_config: its arguments stand in
        config = {}
        for name in inspect.signature(cls.__init__).parameters:
            if name not in ("self", "args", "kwargs"):
                config[name] = getattr(layer, name, "<not stored>")
    config.pop("name", None)
    return [f"{cls.__module__}.{cls.__qualname__}", config]


class Memo:
    """The outcomes of checks already run during one graph build, by signature.

    Attributes:
      runs: how many checks actually ran (the rest were read back).

    Example:

    >>> memo = Memo()
    >>> memo.outcome(("key",), lambda: "verdict"), memo.outcome(("key",), lambda: 0)
    ('verdict', 'verdict')
    >>> memo.runs
    1
    """

    def __init__(self):
        self._outcomes = {}
        self.runs = 0

    def outcome(self, key, run):
        """`run()`'s result, computed once per `key` (every time for a None key)."""
        if key is None:
            self.runs += 1
            return run()
        if key not in self._outcomes:
            self.runs += 1
            self._outcomes[key] = run()
        return self._outcomes[key]
