"""Which output-unit declaration applies to a layer: registered, its own, or built in.

A layer class's declaration is, in this order: one registered with
`register_output_units`, its own `maskfit_output_units(self)` method, or
the built-in table for Keras's layers (`keras_tables`, `keras_recurrent`),
matched by exact class. Declarations of wrappers and attention layers read
their inner layers' through `output_units_of`, which the tables get as an
argument (`NESTED`), so they need not import this module.
"""

import functools
import inspect

import keras

from maskfit.units import keras_recurrent, keras_tables
from maskfit.units.declaration import DECLARATION_METHOD, OutputUnits, refusal

__all__ = [
    "declaring_function",
    "has_declaration",
    "output_units_of",
    "register_output_units",
    "units_before_build",
]

_registry = {}


def register_output_units(layer_class, declare):
    """Declares the output units of a layer class you cannot (or do not) edit.

    Args:
      layer_class: a `keras.layers.Layer` subclass. The registration applies to
        that exact class, not to its subclasses.
      declare: a function `layer -> maskfit.OutputUnits` for a built layer;
        or a layer class whose declaration also fits `layer_class` (e.g. a
        subclass of `keras.layers.Dense` that keeps Dense's parameters); or
        None to remove the registration.

    Example:

    >>> import keras, maskfit
    >>> class MyDense(keras.layers.Dense):
    ...     pass
    >>> maskfit.register_output_units(MyDense, keras.layers.Dense)
    >>> layer = MyDense(2)
    >>> layer.build((None, 3))
    >>> _ = maskfit.set_mask(layer, maskfit.OutputMask([1, 0]))
    """
    if not (
        inspect.isclass(layer_class) and issubclass(layer_class, keras.layers.Layer)
    ):
        raise TypeError(
            "register_output_units expects a keras.layers.Layer subclass first."
            f" Received: {layer_class!r}"
        )
    if declare is None:
        _registry.pop(layer_class, None)
    elif inspect.isclass(declare):
        reused = declaring_function(declare)
        if reused is None:
            raise ValueError(
                f"register_output_units({layer_class.__name__}, {declare.__name__}):"
                f" {declare.__name__} has no output-unit declaration to reuse."
            )
        _registry[layer_class] = reused
    elif callable(declare):
        _registry[layer_class] = declare
    else:
        raise TypeError(
            "register_output_units expects a function layer -> maskfit.OutputUnits,"
            f" a layer class, or None. Received: {declare!r}"
        )


def declaring_function(cls):
    """The function `layer -> OutputUnits` that declares layers of class `cls`, or None.

    Layer caches compare it: a new registration for `cls` is a new function.
    """
    if cls in _registry:
        return _registry[cls]
    method = getattr(cls, DECLARATION_METHOD, None)
    if method is not None:
        return method
    return _BUILTIN.get(cls)


def has_declaration(layer):
    """Raises the refusal when nothing declares `layer`'s output units."""
    if declaring_function(type(layer)) is not None:
        return
    cls = type(layer)
    base = next((b for b in cls.__mro__[1:] if b in _BUILTIN), None)
    if base is not None:
        reason = (
            f"it subclasses keras.layers.{base.__name__}, whose layout is known, but a"
            " subclass may compute differently, so it is not assumed"
        )
        fix = (
            f"If it keeps {base.__name__}'s parameters and how they reach the outputs,"
            f" call maskfit.register_output_units({cls.__name__},"
            f" keras.layers.{base.__name__}); else declare it (docs/output_mask.md)"
            " or use maskfit.ElementMask."
        )
    elif cls.__module__.startswith("keras."):
        reason = "maskfit has no output-unit layout for this Keras layer"
        fix = (
            "Use maskfit.ElementMask, or declare it with"
            f" maskfit.register_output_units({cls.__name__}, fn) (docs/output_mask.md)."
        )
    else:
        reason = (
            "the class does not declare which parameters belong to which output unit"
        )
        fix = (
            f"Define `{DECLARATION_METHOD}(self)` returning maskfit.OutputUnits on the"
            f" class, or call maskfit.register_output_units({cls.__name__}, fn) (see"
            " docs/output_mask.md); or use maskfit.ElementMask."
        )
    raise refusal(layer, reason, fix)


def output_units_of(layer):
    """Returns the `OutputUnits` declared for built `layer`, or raises the refusal."""
    has_declaration(layer)
    declared = declaring_function(type(layer))(layer)
    if not isinstance(declared, OutputUnits):
        raise TypeError(
            f"The output-unit declaration of layer '{layer.name}' returned"
            f" {declared!r}; expected a maskfit.OutputUnits."
        )
    return declared


def units_before_build(layer):
    """The number of output units known from an unbuilt layer's config, or None."""
    has_declaration(layer)
    return keras_tables.units_from_config(layer)


def _builtin():
    """The built-in Keras layers' declarations, by exact class."""
    table = {**keras_tables.TABLE, **keras_recurrent.TABLE}
    for nested in (keras_tables.NESTED, keras_recurrent.NESTED):
        for cls, declare in nested.items():
            table[cls] = functools.partial(declare, units_of=output_units_of)
    return table


_BUILTIN = _builtin()
