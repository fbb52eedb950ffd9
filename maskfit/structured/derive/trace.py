"""A layer's stateless call as a jaxpr: the computation a coupling is derived from.

The layer runs under `keras.StatelessScope` with its weights passed in as
arguments, so every weight is an input variable of the jaxpr and each of
its uses is an equation. It is called as the model calls it
(`arguments.describe`): the first input is the jaxpr's first variable, its
other tensor arguments (masks, biases) constants, neither input nor weight.
Only under `KERAS_BACKEND=jax`: the jaxpr is the graph that `propagate` reads.
"""

from typing import NamedTuple

import keras
import numpy as np

from maskfit.kinds.couplings import arguments as call_arguments

__all__ = ["Traced", "trace"]


class Traced(NamedTuple):
    """A jaxpr and which of its variables are the weights, the input and the output."""

    jaxpr: object
    weights: list
    inputs: list
    outputs: list


def trace(layer, input_shape, described=None):
    """Traces `layer(x, ...)` for `x` of `input_shape` (float32) to a jaxpr.

    Args:
      layer: a built layer.
      input_shape: its first input's shape (None where unknown).
      described: the call's arguments (`arguments.describe`); None: `x` alone.

    Returns:
      A `Traced`.
    """
    import jax  # noqa: PLC0415 - only under the JAX backend

    variables = list(layer.weights)

    def run(x, *values):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return keras.tree.flatten(call_arguments.call(layer, described, x))[:1]

    x = np.zeros(call_arguments.concrete(input_shape), "float32")
    values = [v.value for v in variables]
    jaxpr = jax.make_jaxpr(run)(x, *values).jaxpr
    return Traced(jaxpr, jaxpr.invars[1:], jaxpr.invars[:1], jaxpr.outvars[:1])
