"""What a coupling reads and returns for one call of a layer in a model's graph.

`Call` is the call (the layer, its arguments bound to its signature, its
tensors), `CallUnits` the call with the units of its inputs, and
`TensorUnits` the unit nodes one tensor carries along its unit axis: what a
`Coupling` returns for each output.
"""

from typing import NamedTuple

import keras
import numpy as np

__all__ = ["Call", "CallUnits", "TensorUnits"]


class Call(NamedTuple):
    """One call of a layer in a model's graph.

    Attributes:
      layer: the layer (or nested model) called.
      arguments: `{name: value}`, the call's arguments bound to the names of
        `layer.call`'s signature; tensors are KerasTensors.
      inputs: the KerasTensors among the arguments, in order.
      outputs: the KerasTensors it returned, flattened.
      args, kwargs: the call's arguments as given, to call another layer
        the same way.
    """

    layer: keras.layers.Layer
    arguments: dict
    inputs: list
    outputs: list
    args: tuple
    kwargs: dict


class CallUnits(NamedTuple):
    """One call of a layer, with the units of its input tensors (for `Coupling.couple`).

    Attributes:
      call: the `Call` (layer, arguments by name, tensors).
      units: `{id(KerasTensor): TensorUnits}` of the graph so far.
      inputs: the `TensorUnits` of `call.inputs`, in order.
    """

    call: object
    units: dict
    inputs: list

    @property
    def layer(self):
        return self.call.layer

    def argument(self, name):
        """The `TensorUnits` of the call argument `name` (one tensor), or None."""
        value = self.call.arguments.get(name)
        if isinstance(value, keras.KerasTensor):
            return self.units[id(value)]
        return None

    def tensor(self, name):
        value = self.call.arguments.get(name)
        return value if isinstance(value, keras.KerasTensor) else None

    def input_shape(self, i=0):
        return tuple(self.call.inputs[i].shape)

    def output_shape(self, i=0):
        return tuple(self.call.outputs[i].shape)

    @property
    def num_outputs(self):
        return len(self.call.outputs)


class TensorUnits(NamedTuple):
    """The units a tensor carries: `ids[p]` is the unit node at position `p` of `axis`.

    `axis` is negative (counted from the end, so it holds under wrappers
    that add leading axes); None when the tensor carries no unit. `ids` has
    -1 where a position is no unit; `reason` says why (a model input, the
    output of a layer maskfit cannot see into).
    """

    axis: object
    ids: object
    reason: str = ""

    @staticmethod
    def none(reason):
        return TensorUnits(None, None, reason)

    @property
    def width(self):
        return 0 if self.ids is None else len(self.ids)

    def has_units(self):
        return self.ids is not None and bool(np.any(self.ids >= 0))
