"""Declaring a layer's output units: which variable axes carry which output unit.

An entry belongs to output unit `u` when it affects unit `u` and no other unit
in one call of the layer (for recurrent layers, in one cell step); entries
that affect several units are *shared*. A layer says how its variables carry
its units with an `OutputUnits` declaration: the built-in Keras layers in the
records of `maskfit.kinds` (one per class), other layers through a
`maskfit_output_units(self)` method or `maskfit.register_output_units`
(`maskfit.units.lookup` finds the one that applies). A layer with no
declaration is refused, never guessed.
"""

from maskfit import checks
from maskfit.units import probe as probe_lib

__all__ = [
    "DECLARATION_METHOD",
    "SHARED",
    "OutputUnits",
    "UnitsAlong",
    "refusal",
    "units_along",
]

# The method a layer class defines to declare its own output units.
DECLARATION_METHOD = "maskfit_output_units"


class _Shared:
    """The marker for a variable whose every entry affects several units."""

    __slots__ = ()

    def __repr__(self):
        return "maskfit.SHARED"

    def __reduce__(self):
        return "SHARED"


SHARED = _Shared()
"""The ownership of a variable whose every entry affects several output units.

Give it in an `OutputUnits` declaration (`{"offset": maskfit.SHARED}`), e.g.
for a bias added to every unit: an `OutputMask` never freezes it, and
`maskfit.summary` counts its entries as shared (docs/output_mask.md).
"""


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
    axes = (axis,) if checks.is_integer(axis) else tuple(axis)
    numbers_ok = all(
        checks.is_integer(a) for a in axes + (blocks, offset) + tuple(shared_blocks)
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
        if not checks.is_integer(units) or units < 1:
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
                variable = checks.find_variable(
                    layer,
                    variable,
                    layer.weights,
                    f"The output-unit declaration of layer '{layer.name}'",
                )
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


def _segments(output_axis, units):
    """Canonical outputs: one `(axis, first_unit, stop or None)` or None per tensor."""
    if checks.is_integer(output_axis):
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
        elif checks.is_integer(entry):
            segments.append((int(entry), 0, units))
        elif (
            isinstance(entry, tuple)
            and len(entry) in (2, 3)
            and all(checks.is_integer(x) or x is None for x in entry)
        ):
            axis, first, *stop = entry
            segments.append((int(axis), int(first), stop[0] if stop else None))
        else:
            raise bad
    if all(s is None for s in segments):
        raise bad
    return tuple(segments)


def refusal(
    layer, reason, fix="Use maskfit.ElementMask to choose the entries that learn."
):
    """The one error for a layer that OutputMask cannot serve."""
    cls = type(layer)
    return ValueError(
        f"OutputMask cannot be used on layer '{layer.name}' ({cls.__module__}."
        f"{cls.__qualname__}): {reason}. {fix}"
    )
