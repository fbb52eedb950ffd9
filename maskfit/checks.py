"""Checks of user input that several modules share: integers, reals, variables by name."""

import inspect
import numbers

import keras

__all__ = ["check_layer_class", "find_variable", "is_integer", "is_real"]


def is_integer(value):
    """Whether `value` is an integer (a NumPy one too), and not a bool.

    Example:

    >>> is_integer(3), is_integer(True), is_integer(3.0)
    (True, False, False)
    """
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value):
    """Whether `value` is a real number (an integer too), and not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_layer_class(layer_class, where):
    """Raises a TypeError unless `layer_class` is a `keras.layers.Layer` subclass.

    For the registries keyed by layer class (`register_output_units`,
    `register_coupling`), whose first argument it is.

    Example:

    >>> check_layer_class(keras.layers.Dense, "register_output_units")
    >>> check_layer_class("Dense", "register_output_units")
    Traceback (most recent call last):
    ...
    TypeError: register_output_units expects a keras.layers.Layer subclass first. Received: 'Dense'
    """
    if not (
        inspect.isclass(layer_class) and issubclass(layer_class, keras.layers.Layer)
    ):
        raise TypeError(
            f"{where} expects a keras.layers.Layer subclass first."
            f" Received: {layer_class!r}"
        )


def find_variable(layer, name, variables, what, kind="variables"):
    """Returns the one variable of `variables` that `name` names, or raises.

    `name` matches a variable's `name` (`"kernel"`), its full `path`, or the
    end of its path after a `/` (`"query/kernel"` in an attention layer).

    Args:
      layer: the layer the variables belong to (named in errors).
      name: the name to look up.
      variables: the layer's variables to search (e.g. its trainable ones).
      what: who asks, for errors, e.g. "ElementMask".
      kind: what `variables` are, for errors, e.g. "trainable variables".

    Raises:
      ValueError: when no variable, or more than one, matches; the message
        lists the variables' paths.
    """
    found = [
        v for v in variables if name in (v.name, v.path) or v.path.endswith("/" + name)
    ]
    if len(found) == 1:
        return found[0]
    if not found:
        names = [v.name for v in variables]
        if len(set(names)) < len(names):
            names = [v.path for v in variables]
        raise ValueError(
            f"{what} names variable '{name}', which is not among the {kind} of"
            f" layer '{layer.name}': {names}."
        )
    raise ValueError(
        f"{what} names variable '{name}', which matches several {kind} of layer"
        f" '{layer.name}': {[v.path for v in found]}. Name one of them by the end"
        " of its path, e.g. 'query/kernel'."
    )
