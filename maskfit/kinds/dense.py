"""Dense, EinsumDense, Embedding and ReversibleEmbedding: layers that make units.

Their units are their kernel's (or embeddings') last-axis columns, and the
bias entries of those columns; magnitude pruning prunes the kernel or the
embeddings (TF-MOT: never biases); structured pruning removes a unit's
columns and the input rows that read a removed channel (`Producer`).
"""

import re

from maskfit.kinds import common
from maskfit.kinds.record import LayerKind, Prunable
from maskfit.structured import couplings_keras as couplings
from maskfit.structured import sizes
from maskfit.structured.couplings import Refused
from maskfit.units import probe as probe_lib
from maskfit.units.declaration import SHARED, OutputUnits, units_along
from maskfit.units.keras_layers import LAYERS as L

__all__ = ["KINDS"]


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
    return sizes.outputs(output_shapes) * sizes.weight(layer, "kernel").shape[0]


def _einsum_macs(layer, input_shapes, output_shapes):
    kernel = sizes.weight(layer, "kernel")
    if kernel is None:
        return 0
    own = kernel.shape[-1]
    return sizes.outputs(output_shapes) * sizes.size(kernel) // max(own, 1)


KINDS = {
    L.Dense: LayerKind(
        units=_dense,
        prunable=Prunable(("kernel",)),
        coupling=couplings.Producer(
            {"kernel": (0, 1)}, {"kernel": (-1, 1), "bias": (0, 1)}, "units"
        ),
        config_units=lambda layer: layer.units,
        macs=_dense_macs,
    ),
    L.EinsumDense: LayerKind(
        units=_einsum_dense,
        # Keras 3: TF-MOT prunes these inside MultiHeadAttention.
        prunable=Prunable(("kernel",)),
        coupling=couplings.EinsumDense(),
        macs=_einsum_macs,
    ),
    L.Embedding: LayerKind(
        units=_embedding,
        prunable=Prunable(("embeddings",)),
        coupling=couplings.Producer({}, {"embeddings": (-1, 1)}, "output_dim"),
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
