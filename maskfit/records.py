"""The record of a Keras layer class, and the one order in which maskfit looks one up.

A `LayerKind` says everything maskfit knows about a built-in layer class:
its output units (`maskfit.units`), which of its variables magnitude
pruning prunes (`maskfit.pruning`), how units cross it (its coupling, read by
`maskfit.structured`), how many units an unbuilt layer will have and what one
call costs. The records themselves are written in the family modules of
`maskfit.kinds` and installed here once, when maskfit is imported
(`maskfit.kinds.builtin`). This module sits below `maskfit.units` and imports
nothing of maskfit, so units, pruning and structured pruning read the records
without importing what the records import (the layer order in
`pyproject.toml`).

Each aspect is looked up in one order, by `Lookup`: what was registered for
the layer's exact class, then the layer's own method, then the built-in
record of its exact class; the caller refuses the rest (a subclass of a
built-in class may compute differently, so it is never assumed to be one).
"""

from typing import Callable, NamedTuple

__all__ = [
    "CONTAINER",
    "NO_WEIGHTS",
    "LayerKind",
    "Lookup",
    "Prunable",
    "Unsupported",
    "builtin",
    "builtin_classes",
    "builtin_op",
    "install",
    "install_ops",
]


class Prunable(NamedTuple):
    """The variables magnitude pruning prunes in a layer, by name.

    Attributes:
      weights: names the layer always has.
      optional: names pruned when the layer has them.
    """

    weights: tuple
    optional: tuple = ()


class Unsupported(NamedTuple):
    """A layer class magnitude pruning refuses, and why (a clause)."""

    reason: str


CONTAINER = "container"
"""`LayerKind.prunable` of a layer pruned through its sublayers (an RNN's cell)."""

NO_WEIGHTS = "none"
"""`LayerKind.prunable` of a layer without prunable weights (biases, scales, none)."""


class LayerKind(NamedTuple):
    """What maskfit knows about one built-in Keras layer class.

    Attributes:
      units: `layer -> maskfit.OutputUnits` for a built layer, or a function
        that raises the refusal with the reason; None if maskfit has no
        output-unit layout for the class.
      prunable: a `Prunable`, `CONTAINER`, `NO_WEIGHTS` or an `Unsupported`;
        None if the pruning registry does not know the class.
      coupling: the `maskfit.structured.Coupling` of its layers (a `Refused`
        one says why its units stay); None if none is known.
      config_units: `layer -> int or None`: the number of output units an
        unbuilt layer will have, from its config; None if unknown.
      macs: `(layer, input_shapes, output_shapes) -> int`: multiply-accumulates
        of one call, per example (`maskfit.structured.size_report`); None
        counts 0 (no weight products: normalization, activations, pooling).
    """

    units: Callable = None
    prunable: object = None
    coupling: object = None
    config_units: Callable = None
    macs: Callable = None


_BUILTIN = {}


def install(kinds):
    """Installs `{layer class: LayerKind}` as the built-in records (once).

    Installing the same records again (maskfit imported again) does nothing.

    Raises:
      ValueError: when other records are installed over them, or a class
        names a record that is not a `LayerKind`.
    """
    if _BUILTIN == kinds:
        return
    if _BUILTIN:
        raise ValueError(
            "maskfit's built-in layer kinds are installed once, when maskfit is"
            f" imported; they already hold {len(_BUILTIN)} classes."
        )
    bad = {cls: kind for cls, kind in kinds.items() if not isinstance(kind, LayerKind)}
    if bad:
        raise ValueError(f"Layer kinds must be LayerKind records. Received: {bad!r}")
    _BUILTIN.update(kinds)


_BUILTIN_OPS = {}


def install_ops(couplings):
    """Installs `{class name: Coupling}` of the `keras.ops` operations (once).

    A functional model records each `keras.ops` call on a KerasTensor (`x +
    3.0`, `x[:, 0]`, `keras.ops.mean(x, axis=1)`) as an operation, not a
    layer: it has no weights and no other record, only a coupling.
    """
    if _BUILTIN_OPS and _BUILTIN_OPS != couplings:
        raise ValueError(
            "maskfit's keras.ops couplings are installed once, when maskfit is"
            f" imported; they already hold {len(_BUILTIN_OPS)} operations."
        )
    _BUILTIN_OPS.update(couplings)


def builtin_op(cls):
    """The built-in coupling of a Keras operation class (by its name), or None."""
    if not getattr(cls, "__module__", "").startswith("keras."):
        return None
    return _BUILTIN_OPS.get(cls.__name__)


def builtin(cls):
    """The built-in `LayerKind` of exactly `cls`, or None."""
    return _BUILTIN.get(cls)


def builtin_classes():
    """Every layer class with a built-in record."""
    return list(_BUILTIN)


class Lookup:
    """One aspect of the layer kinds, looked up in maskfit's one order.

    Args:
      aspect: the `LayerKind` field this lookup reads ("units", "coupling",
        "prunable").
      method: the name of the method by which a layer declares the aspect
        itself (e.g. "maskfit_output_units").

    Example:

    >>> import keras
    >>> from maskfit import records
    >>> units = records.Lookup("units", "maskfit_output_units")
    >>> units.find(keras.layers.Dense)[0]
    'builtin'
    """

    def __init__(self, aspect, method):
        if aspect not in LayerKind._fields:
            raise ValueError(
                f"Lookup aspect must be one of {LayerKind._fields}. Received: {aspect!r}"
            )
        self.aspect = aspect
        self.method = method
        self._registered = {}

    def register(self, cls, value):
        """Registers `value` for exactly `cls`; None removes the registration."""
        if value is None:
            self._registered.pop(cls, None)
        else:
            self._registered[cls] = value

    def find(self, layer_or_class):
        """Returns `(source, value)`: where the aspect comes from, and what it is.

        `source` is "registered" (`value` as registered), "method" (`value`
        is the method, bound when a layer is given), "builtin" (`value` is
        the built-in record's field), or None (`value` None: the caller
        refuses).
        """
        cls = layer_or_class
        if not isinstance(layer_or_class, type):
            cls = type(layer_or_class)
        if cls in self._registered:
            return "registered", self._registered[cls]
        method = getattr(layer_or_class, self.method, None)
        if method is not None:
            return "method", method
        value = self.builtin(cls)
        if value is not None:
            return "builtin", value
        return None, None

    def builtin(self, cls):
        """The built-in record's field for exactly `cls`, or None."""
        kind = _BUILTIN.get(cls)
        return None if kind is None else getattr(kind, self.aspect)

    def builtin_base(self, cls, accept=lambda value: True):
        """The nearest base class of `cls` with a built-in value `accept` takes."""
        return next(
            (
                base
                for base in cls.__mro__[1:]
                if self.builtin(base) is not None and accept(self.builtin(base))
            ),
            None,
        )
