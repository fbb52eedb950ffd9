"""How units cross a layer: one `Coupling` object per layer kind.

A coupling says, for one call of a layer in a model's graph, which entries
of the layer's variables belong to which unit nodes (the units it makes,
the input channels it reads, per-channel parameters), which units pass
through to its outputs, and what its config becomes once units are removed
(`shrink_config`). Built-in Keras layers have theirs in their records
(`maskfit.kinds`: each family module defines the coupling classes its
records name); a custom layer declares one with a
`maskfit_unit_coupling(self)` method returning a `Coupling` (usually a
`UnitCoupling`), or `register_coupling` (`maskfit.kinds.couplings.lookup`).
A layer with none is refused: every unit it reads stays.
"""

import numpy as np

from maskfit.kinds.couplings import check as declared_check
from maskfit.kinds.couplings import parts
from maskfit.kinds.couplings.calls import TensorUnits

__all__ = ["Coupling", "Refused", "UnitCoupling"]


class Coupling:
    """How one kind of layer couples units: what it makes, reads and passes on.

    Subclass it for a layer kind and return an instance from the layer's
    `maskfit_unit_coupling(self)` method (or `register_coupling`); most
    custom layers need only `UnitCoupling`. Both methods run on the host,
    once per call of the layer in the graph, not in the training step.

    Example:

    >>> import keras, maskfit.pruning as pruning
    >>> class Swish(keras.layers.Layer):  # element-wise: channel c stays channel c
    ...     def call(self, x):
    ...         return x * keras.ops.sigmoid(x)
    >>> class PassesChannels(pruning.Coupling):
    ...     def couple(self, call, graph):
    ...         return [call.inputs[0]]  # the output's units are the input's
    >>> pruning.register_coupling(Swish, PassesChannels())
    >>> inputs = keras.Input((4,))
    >>> hidden = keras.layers.Dense(8, name="hidden")(inputs)
    >>> model = keras.Model(inputs, keras.layers.Dense(2)(Swish()(hidden)))
    >>> [group.layers for group in pruning.DependencyGraph(model).groups]
    [('hidden',)]
    >>> pruning.register_coupling(Swish, None)
    >>> pruning.DependencyGraph(model).groups  # undeclared: the units it reads stay
    ()
    """

    def couple(self, call, graph):
        """Records the layer's couplings in `graph`; returns its outputs' `TensorUnits`.

        Args:
          call: a `CallUnits`: the layer, its arguments and their units.
          graph: the `DependencyGraph` being built: `new_space`, `slice`,
            `join`, `fix`, `refuse`, `note`.

        Returns:
          One `TensorUnits` per output tensor of the call.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement couple(call, graph): a"
            " Coupling subclass says how units cross its layer."
        )

    def shrink_config(self, layer, config, shrunk):
        """Returns `layer`'s config with fewer units (by default, unchanged).

        Args:
          layer: the layer of the pruned model.
          config: a copy of `layer.get_config()`.
          shrunk: tells what stays: `shrunk.count(layer, name)` (kept units
            of a space the layer made), `shrunk.kept(ids)` (which positions of
            a `TensorUnits.ids` stay), `shrunk.note(layer, key)`.
        """
        return config


class Refused(Coupling):
    """A layer whose couplings cannot be proven: every unit it reads stays.

    Args:
      reason: why, as a clause after the layer's name ("runs Python code...").
    """

    def __init__(self, reason):
        self.reason = reason

    def couple(self, call, graph):
        return graph.refuse(call.layer, call.inputs, self.reason, call.num_outputs)


def _is_int(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


class UnitCoupling(Coupling):
    """A custom layer's coupling, declared: what it reads, makes and passes on.

    Args:
      reads: `{variable name: axis}`: position `p` along that axis of the
        variable reads channel `p` of the layer's first input (along
        `input_axis`). Removing that input channel removes those entries.
      units_config: the config key that holds the number of units the layer
        makes (e.g. "units"); the units themselves, and which entries belong
        to each, come from the layer's output-unit declaration
        (`maskfit_output_units`, checked against its gradients). None if the
        layer makes no units.
      passes: True if channel `c` of the first input (along `input_axis`)
        becomes channel `c` of the output on the same axis, and nothing else
        (an element-wise layer with per-channel parameters).
      per_channel: `{variable name: axis}` of a passing layer: position `c`
        along that axis belongs to channel `c`.
      input_axis: the axis of the first input that carries channels.

    Example:

    >>> import keras, maskfit, maskfit.pruning as pruning
    >>> class Scale(keras.layers.Layer):  # a learned scale per channel
    ...     def build(self, shape):
    ...         self.scale = self.add_weight(shape=(shape[-1],), name="scale")
    ...     def call(self, x):
    ...         return x * self.scale
    ...     def maskfit_unit_coupling(self):
    ...         return pruning.UnitCoupling(passes=True, per_channel={"scale": 0})
    """

    def __init__(
        self,
        reads=None,
        units_config=None,
        passes=False,
        per_channel=None,
        input_axis=-1,
    ):
        for name, value in (("reads", reads), ("per_channel", per_channel)):
            if value is not None and not (
                isinstance(value, dict)
                and all(isinstance(k, str) and _is_int(v) for k, v in value.items())
            ):
                raise TypeError(
                    f"UnitCoupling {name} must be a dict from variable names to"
                    f" axes. Received: {name}={value!r}"
                )
        if units_config is not None and not isinstance(units_config, str):
            raise TypeError(
                "UnitCoupling units_config must be the name of a config key or"
                f" None. Received: {units_config!r}"
            )
        if passes and units_config is not None:
            raise ValueError(
                "UnitCoupling: a layer either passes its input's channels on"
                " (passes=True) or makes units of its own (units_config), not"
                f" both. Received: passes={passes!r}, units_config={units_config!r}"
            )
        if per_channel and not passes:
            raise ValueError(
                "UnitCoupling per_channel needs passes=True (the channels whose"
                f" parameters they are pass through). Received: {per_channel!r}"
            )
        if not _is_int(input_axis) or input_axis >= 0:
            raise ValueError(
                "UnitCoupling input_axis must be a negative axis (counted from the"
                f" end). Received: {input_axis!r}"
            )
        self.reads = dict(reads or {})
        self.units_config = units_config
        self.passes = bool(passes)
        self.per_channel = dict(per_channel or {})
        self.input_axis = int(input_axis)

    def couple(self, call, graph):
        layer = call.layer
        source = call.inputs[0] if call.inputs else None
        for units in call.inputs[1:]:
            graph.fix(
                units.ids,
                f"read by '{layer.name}' besides its first input (a UnitCoupling"
                " covers the first input only)",
            )
        ids = None
        if self.reads or self.passes:
            declared_check.check(layer, call, self, getattr(graph, "memo", None))
            ids = parts.read_units(call, graph, source, self.input_axis)
        elif source is not None:
            graph.fix(
                source.ids,
                f"read by '{layer.name}', whose UnitCoupling says neither which"
                " entries read its input channels nor that they pass through",
            )
        if ids is not None:
            for name, axis in self.reads.items():
                graph.slice(layer, parts.named_variable(layer, name), axis, ids)
        rest = [TensorUnits.none(f"output of '{layer.name}' after its first")] * (
            call.num_outputs - 1
        )
        if self.passes:
            if ids is None:
                return [source] + rest
            for name, axis in self.per_channel.items():
                graph.slice(layer, parts.named_variable(layer, name), axis, ids)
            return [TensorUnits(self.input_axis, ids, source.reason)] + rest
        if self.units_config is None:
            return [
                parts.no_units(layer, "makes no units of its own")
            ] * call.num_outputs
        return parts.declared_units(call, graph)

    def shrink_config(self, layer, config, shrunk):
        if self.units_config is not None:
            config[self.units_config] = shrunk.count(layer, "units")
        return config
