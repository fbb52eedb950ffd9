"""Which output-unit declaration applies to a layer: registered, its own, or built in.

A layer class's declaration is, in maskfit's one lookup order
(`maskfit.records.Lookup`): one registered with `register_output_units`,
its own `maskfit_output_units(self)` method, or the `units` of the built-in
record of its exact class (`maskfit.kinds`). Declarations of wrappers and
attention layers read their inner layers' through `output_units_of`.
"""

import inspect

from maskfit import checks, records
from maskfit.units.declaration import DECLARATION_METHOD, OutputUnits, refusal

__all__ = [
    "declaring_function",
    "has_declaration",
    "output_units_of",
    "register_output_units",
    "units_before_build",
    "units_from_config",
]

_LOOKUP = records.Lookup("units", DECLARATION_METHOD)


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
    checks.check_layer_class(layer_class, "register_output_units")
    if declare is None:
        _LOOKUP.register(layer_class, None)
    elif inspect.isclass(declare):
        reused = declaring_function(declare)
        if reused is None:
            raise ValueError(
                f"register_output_units({layer_class.__name__}, {declare.__name__}):"
                f" {declare.__name__} has no output-unit declaration to reuse."
            )
        _LOOKUP.register(layer_class, reused)
    elif callable(declare):
        _LOOKUP.register(layer_class, declare)
    else:
        raise TypeError(
            "register_output_units expects a function layer -> maskfit.OutputUnits,"
            f" a layer class, or None. Received: {declare!r}"
        )


def declaring_function(cls):
    """The function `layer -> OutputUnits` that declares layers of class `cls`, or None.

    Layer caches compare it: a new registration for `cls` is a new function.
    """
    return _LOOKUP.find(cls)[1]


def has_declaration(layer):
    """Raises the refusal when nothing declares `layer`'s output units."""
    if declaring_function(type(layer)) is not None:
        return
    cls = type(layer)
    base = _LOOKUP.builtin_base(cls)
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
    return units_from_config(layer)


def units_from_config(layer):
    """The number of output units an unbuilt layer will have, if its config says.

    Read from the built-in record of its exact class (`config_units`); None
    for other classes.
    """
    kind = records.builtin(type(layer))
    if kind is None or kind.config_units is None:
        return None
    return kind.config_units(layer)
