"""Declaring a layer's output units: which variable axes carry which output unit.

An entry belongs to output unit `u` when it affects unit `u` and no other unit
in one call of the layer (for recurrent layers, in one cell step); entries
that affect several units are *shared*. A layer says how its variables carry
its units with an `OutputUnits` declaration: the built-in Keras layers in
`maskfit.keras_units`, other layers through a `maskfit_output_units(self)`
method or `register_output_units`. A layer with no declaration is refused,
never guessed.
"""

import inspect
import numbers

import keras

from maskfit import probe as probe_lib

__all__ = [
    "SHARED",
    "OutputUnits",
    "UnitsAlong",
    "has_declaration",
    "output_units_of",
    "refusal",
    "register_output_units",
    "registry_version",
    "units_along",
    "units_before_build",
]

DECLARATION_METHOD = "maskfit_output_units"
_registry = {}
_registry_version = [0]


def registry_version():
    """A number that changes each time `register_output_units` is called."""
    return _registry_version[0]


class _Shared:
    """The marker for a variable whose every entry affects several units."""

    __slots__ = ()

    def __repr__(self):
        return "maskfit.SHARED"

    def __reduce__(self):
        return "SHARED"


SHARED = _Shared()


class UnitsAlong:
    """Positions along some axes of a variable belong to output units.

    Made by `units_along`; see there.
    """

    __slots__ = ("axes", "blocks", "offset", "shared_blocks")

    def __init__(self, axes, blocks, offset, shared_blocks):
        self.axes = axes
        self.blocks = blocks
        self.offset = offset
        self.shared_blocks = shared_blocks

    def shifted(self, by):
        """The same layout with every unit index moved up by `by`."""
        return UnitsAlong(self.axes, self.blocks, self.offset + by, self.shared_blocks)

    def __repr__(self):
        return (
            f"units_along({self.axes}, blocks={self.blocks}, offset={self.offset},"
            f" shared_blocks={self.shared_blocks})"
        )


def units_along(axis=-1, *, blocks=1, offset=0, shared_blocks=()):
    """Declares that the positions along `axis` of a variable are output units.

    Position `p` along `axis` (of length `blocks * n`) belongs to unit
    `offset + p % n`: one block of `n` units, or several blocks one after the
    other (the gates of a recurrent cell). `axis` may be a tuple of axes, read
    together in row-major order (a depthwise kernel `(..., in, multiplier)`
    whose output channel is `c * multiplier + m`), or `()` for a variable that
    belongs to unit `offset` as a whole.

    Args:
      axis: an axis of the variable, a tuple of axes, or `()`.
      blocks: how many blocks of units follow each other along `axis`.
      offset: the unit of the first position (e.g. the second half of a
        concatenated output).
      shared_blocks: blocks whose entries affect several units (e.g. the reset
        gate of a GRU with `reset_after=False`).

    Returns:
      A value for `OutputUnits(variables=...)`.

    Example:

    >>> import maskfit
    >>> maskfit.units_along(-1, blocks=4)  # an LSTM kernel (in, 4 * units)
    units_along((-1,), blocks=4, offset=0, shared_blocks=())
    """
    axes = (axis,) if isinstance(axis, numbers.Integral) else tuple(axis)
    numbers_ok = all(
        isinstance(a, numbers.Integral) and not isinstance(a, bool)
        for a in axes + (blocks, offset) + tuple(shared_blocks)
    )
    if not numbers_ok or blocks < 1 or offset < 0:
        raise ValueError(
            "units_along takes an axis (int, tuple of ints or ()), blocks >= 1,"
            f" offset >= 0 and shared block numbers. Received: axis={axis!r},"
            f" blocks={blocks!r}, offset={offset!r}, shared_blocks={shared_blocks!r}"
        )
    shared = tuple(sorted({int(b) for b in shared_blocks}))
    if any(b < 0 or b >= blocks for b in shared):
        raise ValueError(
            f"units_along shared_blocks must be block numbers in [0, {blocks})."
            f" Received: {shared_blocks!r}"
        )
    return UnitsAlong(tuple(int(a) for a in axes), int(blocks), int(offset), shared)


class OutputUnits:
    """A layer's declaration of its output units, for `maskfit.OutputMask`.

    Return one from a `maskfit_output_units(self)` method on your layer class,
    or from a function given to `maskfit.register_output_units`. Every
    trainable variable of the layer must be listed, as owned along some axes
    (`maskfit.units_along`) or as `maskfit.SHARED`. maskfit checks the
    declaration against the layer's gradients on random inputs once, and
    refuses the mask when they disagree.

    Args:
      units: the number of output units (one `OutputMask` value per unit).
      variables: `[(variable, ownership)]` pairs, or a dict from a variable's
        name (or path) to its ownership; ownership is `units_along(...)` or
        `SHARED`.
      output_axis: the axis of the layer's output that carries the units. For
        a layer that returns several tensors, a sequence with one entry per
        tensor (in `tf.nest.flatten` order): an axis (units `0..`), `None` (no
        units there), or `(axis, first_unit)`.
      probe_inputs: optional `rng -> inputs` giving sample call arguments for
        the self-check (one array, or a tuple of positional arguments). By
        default they are random arrays of the shapes the layer was built for.
      probes: advanced, for layers that cannot be checked by calling them
        alone (recurrent layers are checked one cell step): `maskfit.probe.Probe`s
        that together call every trainable variable.

    Example:

    >>> import keras, maskfit
    >>> class Scaled(keras.layers.Layer):
    ...     def __init__(self, units):
    ...         super().__init__()
    ...         self.units = units
    ...     def build(self, input_shape):
    ...         self.inner = keras.layers.Dense(self.units)  # column u: unit u
    ...         self.inner.build(input_shape)
    ...         self.scale = self.add_weight(shape=(self.units,), name="scale")
    ...     def call(self, x):
    ...         return self.inner(x) * self.scale
    ...     def maskfit_output_units(self):
    ...         return maskfit.OutputUnits(
    ...             self.units,
    ...             {"scale": maskfit.units_along(0),
    ...              "kernel": maskfit.units_along(-1),
    ...              "bias": maskfit.units_along(0)})
    >>> layer = Scaled(3)
    >>> layer.build((None, 2))
    >>> _ = maskfit.set_mask(layer, maskfit.OutputMask([1, 0, 1]))
    """

    def __init__(
        self, units, variables, output_axis=-1, probe_inputs=None, probes=None
    ):
        if not _is_int(units) or units < 1:
            raise ValueError(
                f"OutputUnits units must be a positive integer. Received: {units!r}"
            )
        if probe_inputs is not None and not callable(probe_inputs):
            raise TypeError(
                "OutputUnits probe_inputs must be a function rng -> inputs."
                f" Received: {probe_inputs!r}"
            )
        self.units = int(units)
        self.variables = variables
        self.outputs = _segments(output_axis, self.units)
        self.probe_inputs = probe_inputs
        self.probes = None if probes is None else tuple(probes)

    def pairs(self, layer):
        """Returns `[(variable, ownership)]`, names resolved in `layer`."""
        items = (
            self.variables.items()
            if isinstance(self.variables, dict)
            else self.variables
        )
        pairs = []
        for item in items:
            if not (isinstance(item, (tuple, list)) and len(item) == 2):
                raise TypeError(
                    f"The output-unit declaration of layer '{layer.name}' lists"
                    f" {item!r}; expected (variable, maskfit.units_along(...) or"
                    " maskfit.SHARED) pairs, or a dict by variable name."
                )
            variable, ownership = item
            if isinstance(variable, str):
                variable = _find_variable(layer, variable)
            if not isinstance(ownership, (UnitsAlong, _Shared)):
                path = getattr(variable, "path", variable)
                raise TypeError(
                    f"The output-unit declaration of layer '{layer.name}' gives"
                    f" {ownership!r} for variable '{path}'; expected"
                    " maskfit.units_along(...) or maskfit.SHARED."
                )
            pairs.append((variable, ownership))
        return pairs

    def probes_for(self, layer):
        """The probes of the self-check; by default the layer on sample inputs."""
        if self.probes is not None:
            return self.probes
        inputs = self.probe_inputs
        if inputs is None:
            make = probe_lib.sample_inputs(layer)
        else:
            make = lambda rng: (_as_args(inputs(rng)), {})  # noqa: E731
        return (probe_lib.Probe(layer, make, self.outputs),)


def _as_args(inputs):
    return tuple(inputs) if isinstance(inputs, tuple) else (inputs,)


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _segments(output_axis, units):
    """Canonical outputs: one `(axis, first_unit, stop or None)` or None per tensor."""
    if _is_int(output_axis):
        return ((int(output_axis), 0, units),)
    bad = ValueError(
        "OutputUnits output_axis must be an axis (int), or one entry per output"
        " tensor: an axis, None, or (axis, first_unit); at least one must carry"
        f" the units. Received: {output_axis!r}"
    )
    if output_axis is None or isinstance(output_axis, str):
        raise bad
    segments = []
    for entry in output_axis:
        if entry is None:
            segments.append(None)
        elif _is_int(entry):
            segments.append((int(entry), 0, units))
        elif (
            isinstance(entry, tuple)
            and len(entry) in (2, 3)
            and all(_is_int(x) or x is None for x in entry)
        ):
            axis, first, *stop = entry
            segments.append((int(axis), int(first), stop[0] if stop else None))
        else:
            raise bad
    if all(s is None for s in segments):
        raise bad
    return tuple(segments)


def _find_variable(layer, name):
    found = [
        v
        for v in layer.weights
        if name in (v.name, v.path) or v.path.endswith("/" + name)
    ]
    if len(found) != 1:
        names = [v.path for v in layer.weights]
        what = "no" if not found else "several"
        raise ValueError(
            f"The output-unit declaration of layer '{layer.name}' names variable"
            f" '{name}', which matches {what} variable of the layer. Its variables"
            f" are {names}; pass the variable itself or its full path."
        )
    return found[0]


def refusal(
    layer, reason, fix="Use maskfit.ElementMask to choose the entries that learn."
):
    """The one error for a layer that OutputMask cannot serve."""
    cls = type(layer)
    return ValueError(
        f"OutputMask cannot be used on layer '{layer.name}' ({cls.__module__}."
        f"{cls.__qualname__}): {reason}. {fix}"
    )


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
        if _declaring_function(declare) is None:
            raise ValueError(
                f"register_output_units({layer_class.__name__}, {declare.__name__}):"
                f" {declare.__name__} has no output-unit declaration to reuse."
            )
        _registry[layer_class] = lambda layer: _declaring_function(declare)(layer)
    elif callable(declare):
        _registry[layer_class] = declare
    else:
        raise TypeError(
            "register_output_units expects a function layer -> maskfit.OutputUnits,"
            f" a layer class, or None. Received: {declare!r}"
        )
    _registry_version[0] += 1


_builtin = {}


def _builtin_table():
    """The built-in Keras layers' declarations, by exact class."""
    if not _builtin:
        # Imported here: those modules build on this one.
        from maskfit import keras_recurrent_units
        from maskfit import keras_units

        _builtin.update(keras_units.TABLE)
        _builtin.update(keras_recurrent_units.TABLE)
    return _builtin


def _declaring_function(cls):
    if cls in _registry:
        return _registry[cls]
    method = getattr(cls, DECLARATION_METHOD, None)
    if method is not None:
        return method
    return _builtin_table().get(cls)


def has_declaration(layer):
    """Raises the refusal when nothing declares `layer`'s output units."""
    if _declaring_function(type(layer)) is not None:
        return
    cls = type(layer)
    base = next((b for b in cls.__mro__[1:] if b in _builtin_table()), None)
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
    declared = _declaring_function(type(layer))(layer)
    if not isinstance(declared, OutputUnits):
        raise TypeError(
            f"The output-unit declaration of layer '{layer.name}' returned"
            f" {declared!r}; expected a maskfit.OutputUnits."
        )
    return declared


def units_before_build(layer):
    """The number of output units known from an unbuilt layer's config, or None."""
    from maskfit import keras_units

    has_declaration(layer)
    return keras_units.units_from_config(layer)
