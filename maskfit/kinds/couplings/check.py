"""The self-check of a unit coupling: the layer's real gradients against what it says.

A coupling says which entries of a layer read input channel `c` (`reads`)
and whether channel `c` passes through to output channel `c` (`passes`).
`check` runs the layer on random inputs, with random weights (the layer's
own are never touched: `keras.StatelessScope`), and asks the gradients:

- with the entries said to read channel `c` set to 0, no output may depend
  on input channel `c`;
- for a passing layer, output channel `c` may depend on input channel `c`
  only.

A few channels are checked (all of them for a narrow layer). Custom layers'
`UnitCoupling`s are checked when the graph is built; the tests run it on
the built-in couplings.
"""

import inspect

import keras
import numpy as np
import tensorflow as tf

from maskfit.kinds.couplings import arguments as call_arguments
from maskfit.kinds.couplings import signature as check_signature
from maskfit.kinds.couplings.parts import named_variable
from maskfit.units import backprop, probe

__all__ = ["check", "depends_on_channel"]

_CHANNELS = 6


def _sample(shape, rng):
    return rng.normal(size=call_arguments.concrete(shape)).astype("float32")


def _call(layer, x, mapping):
    """`layer(x)` with the weights of `mapping`, under XLA where TensorFlow runs it only so.

    (A channels_first convolution, on CPUs without oneDNN's NCHW kernels:
    as `maskfit.units.probe` runs it.)
    """
    kwargs = {}
    if "training" in inspect.signature(layer.call).parameters:
        kwargs["training"] = False

    def run():
        with keras.StatelessScope(state_mapping=mapping):
            return layer(x, **kwargs)

    try:
        return run()
    except (tf.errors.UnimplementedError, tf.errors.InvalidArgumentError) as error:
        if not probe.runs_only_under_xla(error):
            raise
        return tf.function(run, jit_compile=True, autograph=False)()


def depends_on_channel(
    layer, shape, axis, channel, zeroed=(), out_channel=None, seed=0
):
    """Whether `layer`'s output depends on input channel `channel` along `axis`.

    Args:
      shape: the input shape (None dimensions get small sizes).
      zeroed: `[(variable, axis)]`: those variables' entries at position
        `channel` along `axis` are set to 0 first.
      out_channel: if given, only output channel `out_channel` (along
        `axis` of the output) counts; else every output.

    Returns:
      A bool array over input channels: which ones the counted outputs
      depend on (`channel`'s entry answers the question).
    """
    rng = np.random.default_rng(seed)
    x = _sample(shape, rng)
    mapping = []
    for variable in layer.weights:
        fan_in = variable.shape[0] if variable.shape else 1
        value = rng.normal(size=tuple(variable.shape)) / np.sqrt(max(fan_in, 1))
        for zero_variable, zero_axis in zeroed:
            if zero_variable is variable:
                index = [slice(None)] * value.ndim
                index[zero_axis] = channel
                value[tuple(index)] = 0.0
        mapping.append((variable, keras.ops.convert_to_tensor(value, variable.dtype)))

    def output(x):
        y = _call(layer, x, mapping)
        if out_channel is not None:
            y = keras.ops.take(y, [out_channel], axis=axis % len(y.shape))
        return y

    # Taken by the backend that runs the layer (`maskfit.units.backprop`).
    (gradient,) = backprop.projected_gradients(output, [x], rng)
    gradient = np.moveaxis(gradient, axis, -1)
    return np.any(gradient.reshape(-1, gradient.shape[-1]) != 0, axis=0)


def _channels(width, seed=0):
    if width <= _CHANNELS:
        return list(range(width))
    return sorted(
        np.random.default_rng(seed).choice(width, _CHANNELS, replace=False).tolist()
    )


def check(layer, call, coupling, memo=None):
    """Raises a ValueError when `coupling` (a `UnitCoupling`) disagrees with `layer`.

    Args:
      call: the `CallUnits` of a call of `layer` (its input shape is used).
      memo: a `signature.Memo` of the graph being built: a layer that
        computes as one already checked (`signature.signature`) gets its
        verdict without running again.
    """
    shape = call.input_shape(0)
    key = check_signature.signature(
        layer,
        shape,
        "unit coupling",
        tuple(sorted(coupling.reads.items())),
        coupling.passes,
        coupling.input_axis,
    )
    memo = memo if memo is not None else check_signature.Memo()
    problems = memo.outcome(key, lambda: _problems(layer, shape, coupling))
    if problems:
        raise ValueError(
            f"The unit coupling of layer '{layer.name}' ({type(layer).__name__})"
            f" disagrees with its gradients on random inputs: {'; '.join(problems[:3])}."
            " Fix its maskfit_unit_coupling (or register_coupling) declaration."
        )


def _problems(layer, shape, coupling):
    """What the gradients say against `coupling`, one clause each (empty if nothing)."""
    axis = coupling.input_axis
    width = shape[axis]
    reads = [(named_variable(layer, n), a) for n, a in coupling.reads.items()]
    problems = []
    for channel in _channels(width):
        if coupling.passes:
            depends = depends_on_channel(
                layer, shape, axis, channel, out_channel=channel
            )
            others = np.flatnonzero(depends & (np.arange(width) != channel))
            if others.size:
                problems.append(
                    f"output channel {channel} depends on input channels"
                    f" {others[:4].tolist()}"
                )
        if (
            reads
            and depends_on_channel(layer, shape, axis, channel, zeroed=reads)[channel]
        ):
            problems.append(
                f"with the entries said to read channel {channel} set to 0, the"
                " output still depends on it"
            )
    return tuple(problems)
