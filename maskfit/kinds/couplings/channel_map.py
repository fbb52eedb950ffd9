"""Where a layer that moves positions sends each channel, read by running it.

Pooling, padding, cropping, upsampling, Flatten, Reshape, Permute and
RepeatVector move values around without mixing channels. `propagate` runs
such a layer once on a tensor holding `c + 1` at every position of channel
`c` (0 for no channel): each output position then holds the channel it
came from (padding gives 0). The result must depend on one output axis
only; that axis carries the units downstream, with the channels in the
order the layer put them (a Flatten after a channels_last convolution
repeats them once per spatial position).
"""

import inspect

import keras
import numpy as np

from maskfit.kinds.couplings.calls import TensorUnits

__all__ = ["propagate"]

# A size for unknown (None) non-batch dimensions while the layer runs.
FILL = 8


def _run(layer, values):
    kwargs = {}
    if "training" in inspect.signature(layer.call).parameters:
        kwargs["training"] = False
    out = layer(keras.ops.convert_to_tensor(values, "float32"), **kwargs)
    return np.asarray(keras.ops.convert_to_numpy(out), np.float64)


def channel_positions(layer, shape, axis, width, run=None):
    """Runs `layer` on channel numbers; returns the channel of each output position.

    Args:
      layer: the layer (called on the numbers unless `run` is given).
      shape: the input shape (None dimensions are filled in).
      axis: the (negative) input axis of the channels.
      width: the number of channels.
      run: `values -> output`, to run something other than `layer(values)`
        (an operation called with its other arguments).

    Returns:
      An int array of the output's shape without the batch axis: `c + 1`
      where channel `c` landed, 0 where no channel did. Or None when the
      layer does not output channel numbers (it mixes them).
    """
    shape = [1] + [FILL if d is None else int(d) for d in shape[1:]]
    numbers = np.arange(1, width + 1, dtype=np.float64)
    view = [1] * len(shape)
    view[axis] = width
    values = np.broadcast_to(numbers.reshape(view), shape)
    if run is None:
        out = _run(layer, values)[0]
    else:
        out = np.asarray(keras.ops.convert_to_numpy(run(values)), np.float64)[0]
    rounded = np.rint(out)
    if (
        np.any(np.abs(out - rounded) > 1e-3)
        or rounded.min() < 0
        or rounded.max() > width
    ):
        return None
    return rounded.astype(np.int64)


def _along(positions, axis):
    """The channel per position of `axis`, if the map depends on that axis only."""
    other = tuple(a for a in range(positions.ndim) if a != axis)
    per_position = positions.max(axis=other) if other else positions
    shape = [1] * positions.ndim
    shape[axis] = -1
    expected = np.broadcast_to(per_position.reshape(shape), positions.shape)
    if np.all((positions == 0) | (positions == expected)):
        return per_position
    return None


def propagate(layer, call, source, run=None):
    """The units of `layer`'s output, given its input's (`source`).

    `run` is as for `channel_positions`.

    Returns:
      `(TensorUnits, None)`, or `(None, problem)` with what stops it (a
      clause for `explain`).
    """
    in_shape = call.input_shape(0)
    try:
        positions = channel_positions(
            layer, in_shape, source.axis, len(source.ids), run
        )
    except Exception as error:  # noqa: BLE001 - a layer that cannot run keeps the units
        return (
            None,
            f"could not be run on channel numbers ({type(error).__name__}: {error})",
        )
    if positions is None:
        return None, "does not keep channels apart when run on channel numbers"
    out_shape = call.output_shape(0)
    rank = len(out_shape)
    found = None
    for axis in reversed(range(positions.ndim)):
        per_position = _along(positions, axis)
        if per_position is not None and (
            len(set(per_position[per_position > 0].tolist())) > 1
            or len(source.ids) == 1
        ):
            found = (axis, per_position)
            break
    if found is None:
        return None, "spreads each channel over several axes"
    axis, per_position = found
    negative = axis + 1 - rank
    if out_shape[negative] is None:
        return None, "puts the channels on an axis of unknown size"
    if out_shape[negative] != len(per_position):
        return None, "changes the size of the channel axis with the input's size"
    ids = np.where(per_position > 0, source.ids[np.maximum(per_position - 1, 0)], -1)
    return TensorUnits(negative, ids.astype(np.int64), source.reason), None
