"""Which `Coupling` a layer has: registered, declared, built-in, or a refusal.

The lookup order is maskfit's one (`maskfit.records.Lookup`), as for output
units: a coupling registered for the layer's exact class
(`register_coupling`), the layer's own `maskfit_unit_coupling(self)`, the
record of its exact built-in class (`maskfit.kinds`), the built-in
coupling of a `keras.ops` operation, the fallbacks other packages add
(`add_fallback`: keras_hub's blocks, `maskfit.structured.hub`), else a
refusal that says how to declare one.
"""

import keras

from maskfit import checks, records
from maskfit.kinds.couplings.base import Coupling, Refused

__all__ = [
    "add_fallback",
    "builtin_base",
    "builtin_table",
    "coupling_of",
    "register_coupling",
]

DECLARATION_METHOD = "maskfit_unit_coupling"

_LOOKUP = records.Lookup("coupling", DECLARATION_METHOD)

# Lookups asked, in order, about a layer with no coupling of its own, no
# registered one and no record (`couplings_hub` adds keras_hub's blocks).
_FALLBACKS = []


def add_fallback(find):
    """Adds `find(layer) -> Coupling or None` to the lookups `coupling_of` asks last."""
    if find not in _FALLBACKS:
        _FALLBACKS.append(find)


def register_coupling(layer_class, coupling):
    """Declares how units cross a layer class you cannot (or do not) edit.

    Args:
      layer_class: a `keras.layers.Layer` subclass (that exact class).
      coupling: a `Coupling` for its layers, or a function `layer ->
        Coupling`, or None to remove the registration.

    Example:

    >>> import keras, maskfit.pruning as pruning
    >>> class MyDense(keras.layers.Dense):
    ...     pass
    >>> pruning.register_coupling(MyDense, pruning.coupling_of(keras.layers.Dense(1)))
    """
    checks.check_layer_class(layer_class, "register_coupling")
    if coupling is None:
        _LOOKUP.register(layer_class, None)
    elif isinstance(coupling, Coupling) or callable(coupling):
        _LOOKUP.register(layer_class, coupling)
    else:
        raise TypeError(
            "register_coupling expects a maskfit.pruning.Coupling, a function"
            f" layer -> Coupling, or None. Received: {coupling!r}"
        )


def builtin_base(cls):
    """The nearest built-in base class of `cls` with a coupling (not a refusal), or None."""
    base = _LOOKUP.builtin_base(cls)
    if base is None or isinstance(_LOOKUP.builtin(base), Refused):
        return None
    return base


def builtin_table():
    """`{Keras layer class: Coupling}` of the built-in couplings (refusals too)."""
    return {
        cls: _LOOKUP.builtin(cls)
        for cls in records.builtin_classes()
        if _LOOKUP.builtin(cls) is not None
    }


def coupling_of(layer):
    """Returns the `Coupling` of `layer`: registered, declared, built-in, or a refusal.

    Example:

    >>> import keras, maskfit.pruning as pruning
    >>> isinstance(pruning.coupling_of(keras.layers.Dense(4)), pruning.Coupling)
    True
    >>> refused = pruning.coupling_of(keras.layers.Lambda(lambda x: x))
    >>> type(refused).__name__, "Lambda" in refused.reason
    ('Refused', True)
    """
    cls = type(layer)
    source, found = _LOOKUP.find(layer)
    if source == "method":
        found = found()
        if not isinstance(found, Coupling):
            raise TypeError(
                f"{cls.__name__}.{DECLARATION_METHOD}() returned {found!r};"
                " expected a maskfit.pruning.Coupling (e.g. UnitCoupling)."
            )
        return found
    if found is None and not isinstance(layer, keras.layers.Layer):
        found = records.builtin_op(cls)
        if found is None:
            return Refused(
                f"is a keras.ops call ({cls.__name__}) that maskfit has no"
                " coupling for, so which channels it mixes is unknown"
            )
    if found is None:
        for fallback in _FALLBACKS:
            found = fallback(layer)
            if found is not None:
                return found
        base = builtin_base(cls)
        if base is not None:
            return Refused(
                f"subclasses keras.layers.{base.__name__} and may compute"
                " differently (declare it: maskfit.pruning.register_coupling("
                f"{cls.__name__}, maskfit.pruning.coupling_of(keras.layers."
                f"{base.__name__}(...))) if it keeps {base.__name__}'s computation)"
            )
        return Refused(
            "declares no unit coupling (define maskfit_unit_coupling(self)"
            " returning maskfit.pruning.UnitCoupling, or call"
            " maskfit.pruning.register_coupling)"
        )
    if not isinstance(found, Coupling):
        found = found(layer)
    return found
