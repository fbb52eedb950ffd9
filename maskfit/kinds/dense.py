"""Dense, EinsumDense, Embedding and ReversibleEmbedding: layers that make units.

Their units are their kernel's (or embeddings') last-axis columns, and the
bias entries of those columns; magnitude pruning prunes the kernel or the
embeddings (TF-MOT: never biases); structured pruning removes a unit's
columns and the input rows that read a removed channel (`Producer`).
"""

import re

from maskfit.kinds import common
from maskfit.kinds.couplings.base import Refused
from maskfit.kinds.couplings.calls import TensorUnits
from maskfit.kinds.couplings.parts import (
    own_units,
    read_units,
    unsupported,
    variable,
)
from maskfit.kinds.couplings.producer import (
    Producer,
)
from maskfit.records import LayerKind, Prunable
from maskfit.units import probe as probe_lib
from maskfit.units.declaration import SHARED, OutputUnits, units_along
from maskfit.units.keras_layers import LAYERS as L

__all__ = ["EinsumDense", "KINDS"]


# The coupling of EinsumDense (Dense and Embedding make units as a `Producer`).


class EinsumDense(Producer):
    """EinsumDense with one contracted input letter and one own output letter."""

    def __init__(self):
        super().__init__({}, {}, "output_shape")

    def couple(self, call, graph):
        layer = call.layer
        problem = unsupported(layer)
        spec = re.match(
            r"^(\.\.\.)?(\w+)(\.\.\.)?,(\w+)->(\.\.\.)?(\w+)(\.\.\.)?$",
            layer.equation.replace(" ", ""),
        )
        if problem is None and (spec is None or spec.group(3) or spec.group(7)):
            problem = (
                f"has equation '{layer.equation}', with no last input and output letter"
            )
        if problem:
            return graph.refuse(layer, call.inputs, problem)
        source, weight, target = spec.group(2), spec.group(4), spec.group(6)
        kernel = variable(layer, "kernel")
        read, own = source[-1], target[-1]
        if own in source or own not in weight:
            return graph.refuse(
                layer, call.inputs, f"takes output letter '{own}' from its input"
            )
        if read in weight and read not in target:
            ids = read_units(call, graph, call.inputs[0], -1)
            if ids is not None:
                graph.slice(layer, kernel, weight.index(read), ids)
        else:
            graph.fix(
                call.inputs[0].ids,
                f"read by '{layer.name}' without a kernel axis of its own",
            )
        slices = {"kernel": (weight.index(own), 1)}
        bias_axes = layer.bias_axes or ""
        if own in bias_axes:
            first = min(target.find(c) for c in bias_axes)
            slices["bias"] = (target[first:].index(own), 1)
        space = own_units(graph, layer, kernel.shape[weight.index(own)], slices)
        return [TensorUnits(-1, space.ids)]

    def shrink_config(self, layer, config, shrunk):
        shape = config["output_shape"]
        count = shrunk.count(layer)
        config["output_shape"] = (
            count if isinstance(shape, int) else [*shape[:-1], count]
        )
        return config


def _dense(layer):
    common.no_quantization(layer)
    owned = {
        "kernel": units_along(-1),
        "bias": units_along(0),
        **common.lora(units_along(-1)),
    }
    return OutputUnits(layer.units, common.present(layer, owned), output_axis=-1)


def _embedding(layer):
    common.no_quantization(layer)
    owned = {
        "embeddings": units_along(-1),
        **common.lora(units_along(-1), ("lora_embeddings_a", "lora_embeddings_b")),
    }
    return OutputUnits(
        layer.output_dim,
        common.present(layer, owned),
        output_axis=-1,
        probe_inputs=_integer_inputs(layer, layer.input_dim),
    )


def _integer_inputs(layer, high):
    make = probe_lib.sample_inputs(layer, integers=high)
    return lambda rng: make(rng)[0]


def _einsum_dense(layer):
    common.no_quantization(layer)
    match = re.match(
        r"^(\.\.\.)?(\w+)(\.\.\.)?,(\w+)->(\.\.\.)?(\w+)(\.\.\.)?$",
        layer.equation.replace(" ", ""),
    )
    kernel = next(v for v in layer.weights if v.name == "kernel")
    weight_spec, output_spec, right_elided = (
        match.group(4),
        match.group(6),
        match.group(7),
    )
    letter = None if right_elided else output_spec[-1]
    owned = {}
    kernel_axis = weight_spec.find(letter) if letter else -1
    if kernel_axis >= 0:
        units = kernel.shape[kernel_axis]
        owned["kernel"] = units_along(kernel_axis)
        last = kernel_axis == len(weight_spec) - 1
        owned.update(
            common.lora(units_along(-1))
            if last
            else {"lora_kernel_a": units_along(kernel_axis), "lora_kernel_b": SHARED}
        )
    else:
        owned.update({"kernel": SHARED, **common.lora(SHARED)})
        units = None
    bias_axes = layer.bias_axes or ""
    if letter and letter in bias_axes:
        first = min(output_spec.find(c) for c in bias_axes)
        owned["bias"] = units_along(output_spec[first:].index(letter))
    else:
        owned["bias"] = SHARED
    if units is None:
        shape = layer.compute_output_shape(layer.get_build_config()["input_shape"])
        units = shape[-1]
    return OutputUnits(units, common.present(layer, owned), output_axis=-1)


def _dense_macs(layer, input_shapes, output_shapes):
    return common.outputs(output_shapes) * common.weight(layer, "kernel").shape[0]


def _einsum_macs(layer, input_shapes, output_shapes):
    kernel = common.weight(layer, "kernel")
    if kernel is None:
        return 0
    own = kernel.shape[-1]
    return common.outputs(output_shapes) * common.size(kernel) // max(own, 1)


KINDS = {
    L.Dense: LayerKind(
        units=_dense,
        prunable=Prunable(("kernel",)),
        coupling=Producer(
            {"kernel": (0, 1)}, {"kernel": (-1, 1), "bias": (0, 1)}, "units"
        ),
        config_units=lambda layer: layer.units,
        macs=_dense_macs,
    ),
    L.EinsumDense: LayerKind(
        units=_einsum_dense,
        # Keras 3: TF-MOT prunes these inside MultiHeadAttention.
        prunable=Prunable(("kernel",)),
        coupling=EinsumDense(),
        macs=_einsum_macs,
    ),
    L.Embedding: LayerKind(
        units=_embedding,
        prunable=Prunable(("embeddings",)),
        coupling=Producer({}, {"embeddings": (-1, 1)}, "output_dim"),
        config_units=lambda layer: layer.output_dim,
    ),
    L.ReversibleEmbedding: LayerKind(
        units=common.refused(
            "its output units depend on the call argument `reverse` (embedding"
            " dimensions forward, vocabulary entries in reverse), and the same"
            " weights serve both"
        ),
        # Its output matrix is pruned too when it is not tied to the embeddings.
        prunable=Prunable(("embeddings",), optional=("reverse_embeddings",)),
        coupling=Refused(
            "maps its units back to the vocabulary in reverse mode, with the same"
            " matrix when tied (tied input and output embeddings), so its units,"
            " the residual width, stay"
        ),
    ),
}
