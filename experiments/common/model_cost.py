"""Parameters and MACs of a Keras model, counted as Torch-Pruning counts a PyTorch one.

The reference is `torch_pruning.utils.count_ops_and_params(model, x)` (1.6),
called with one example; this module counts a Keras model by the same rule,
layer by layer, per example:

- parameters: every weight a PyTorch module would hold as a parameter:
  kernels, biases, batch norm's scale and offset. Batch norm's moving mean
  and variance are buffers in PyTorch and are not counted (Keras's
  `count_params()` counts them).
- MACs ("ops"; Torch-Pruning's op counter, from ptflops):
  - Dense: inputs x units multiply-adds, plus units for the bias.
  - Conv: output positions x kernel window x input channels / groups x
    filters, plus output positions x filters for the bias.
  - BatchNormalization: 2 per element (scale and offset; inference form).
  - ReLU (a layer, or a Dense/Conv's `activation="relu"`): 1 per element.
  - Global average pooling: 1 per input element.
  - Add, Reshape, Flatten, Input: 0 (Torch-Pruning counts functional
    ops such as `+` as nothing).

So the same network gets the same two numbers in both frameworks (the tests
check it against Torch-Pruning on the architectures of
`experiments.common.structured.models`, dense and shrunk); a layer kind outside
this list raises rather than being counted as free.
"""

import keras
import numpy as np

__all__ = ["count", "layer_costs"]

_FREE = (
    keras.layers.InputLayer,
    keras.layers.Add,
    keras.layers.Reshape,
    keras.layers.Flatten,
    keras.layers.Dropout,
)
_POOLS = (keras.layers.GlobalAveragePooling1D, keras.layers.GlobalAveragePooling2D)
_CONVS = (keras.layers.Conv1D, keras.layers.Conv2D)


def _size(shape):
    """Elements per example of a batched shape."""
    return int(np.prod([int(d) for d in shape[1:]]))


def _activation_ops(layer, output_shape):
    activation = getattr(layer, "activation", None)
    if activation is None or activation is keras.activations.linear:
        return 0
    if activation is keras.activations.relu:
        return _size(output_shape)
    raise ValueError(
        f"Layer {layer.name!r} has activation {activation.__name__!r}; only ReLU"
        " is counted (as 1 op per element, like Torch-Pruning's nn.ReLU)."
    )


def _params(layer):
    """Weights a PyTorch module would hold as parameters (no BN moving stats)."""
    if isinstance(layer, keras.layers.BatchNormalization):
        weights = [w for w in (layer.gamma, layer.beta) if w is not None]
    else:
        weights = layer.weights
    return sum(int(np.prod(w.shape)) for w in weights)


def _ops(layer, input_shape, output_shape):
    if isinstance(layer, keras.layers.Dense):
        units = int(output_shape[-1])
        ops = _size(input_shape) * units + (units if layer.use_bias else 0)
        return ops + _activation_ops(layer, output_shape)
    if isinstance(layer, _CONVS):
        if layer.data_format != "channels_last":
            raise ValueError(
                f"Layer {layer.name!r}: only channels_last convolutions are counted."
                f" Received: data_format={layer.data_format!r}"
            )
        positions = _size(output_shape) // layer.filters
        window = int(np.prod(layer.kernel_size))
        in_channels = int(input_shape[-1])
        ops = positions * window * (in_channels // layer.groups) * layer.filters
        if layer.use_bias:
            ops += positions * layer.filters
        return ops + _activation_ops(layer, output_shape)
    if isinstance(layer, keras.layers.BatchNormalization):
        affine = layer.scale or layer.center
        return _size(input_shape) * (2 if affine else 1)
    if isinstance(layer, keras.layers.ReLU):
        return _size(output_shape)
    if isinstance(layer, keras.layers.Activation):
        return _activation_ops(layer, output_shape)
    if isinstance(layer, _POOLS):
        return _size(input_shape)
    if isinstance(layer, _FREE):
        return 0
    raise ValueError(
        f"Layer {layer.name!r} of type {type(layer).__name__} has no counting"
        " rule; experiments.common.model_cost counts Dense, Conv1D/2D, BatchNormalization,"
        " ReLU, global average pooling, Add, Reshape, Flatten and Dropout."
    )


def layer_costs(model):
    """Returns `{layer name: (parameters, MACs per example)}` of a built model.

    Raises:
      ValueError: for a layer kind or activation without a counting rule.
    """
    costs = {}
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        inputs = layer.input
        input_shape = (inputs[0] if isinstance(inputs, (list, tuple)) else inputs).shape
        output_shape = layer.output.shape
        costs[layer.name] = (_params(layer), _ops(layer, input_shape, output_shape))
    return costs


def count(model):
    """Returns `(parameters, MACs per example)` of a built functional Keras model.

    Example:

    >>> model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
    >>> count(model)
    (650, 650)
    """
    costs = layer_costs(model).values()
    return sum(p for p, _ in costs), sum(m for _, m in costs)
