"""`merge_lora`: LoRA factors merged into pruned kernels without filling their zeros.

keras_hub's `backbone.enable_lora(rank)` freezes every kernel and adds
factors `A`, `B` to the query and value projections; the layer multiplies by
`kernel + (alpha / rank) * A @ B`. That delta is dense. Keras merges it into
the kernel when it saves the layer (`Dense.save_own_variables` and
`EinsumDense`'s write `layer.kernel`, the merged value), so a model healed
with LoRA after `prune_oneshot` is saved with every pruned entry of those
kernels filled. `merge_lora` merges first, the delta multiplied by the
layer's keep mask (the `ElementMask` `prune_oneshot` declared), and sets the
factors to 0: the kernel keeps its zeros, and Keras's merge on saving then
adds exactly 0. The delta's pruned entries are dropped, so the outputs move
by what they carried; the report says how much.
"""

import dataclasses

import keras
import numpy as np

from maskfit import internals
from maskfit.spec import declare

__all__ = ["LoraMerge", "merge_lora"]


@dataclasses.dataclass(frozen=True)
class LoraMerge:
    """What `merge_lora` merged.

    Attributes:
      layers: the paths of the layers whose LoRA factors were merged.
      dropped: the share of the deltas' squared norm that fell on pruned
        entries and was left out (0: the merge kept the healed function).

    Example:

    >>> import keras, maskfit
    >>> dense = keras.layers.Dense(2)
    >>> dense.build((None, 2))
    >>> dense.enable_lora(1)
    >>> maskfit.oneshot.merge_lora(dense)  # B starts at 0: nothing to merge
    LoraMerge(layers=('dense',), dropped=0.0)
    """

    layers: tuple
    dropped: float


def merge_lora(model):
    """Merges every LoRA layer's factors into its kernel, keeping its masked zeros.

    For each layer of `model` with LoRA enabled (`layer.enable_lora`, or a
    keras_hub backbone's `enable_lora`): the kernel becomes `kernel +
    keep * (alpha / rank) * A @ B`, where `keep` is the kernel's entry of the
    layer's `ElementMask` (1 where no mask), and `A`, `B` are set to 0, so
    the layer computes with its merged kernel and saves it as is. Layers
    without LoRA are left alone.

    Args:
      model: a Keras model or layer.

    Returns:
      a `maskfit.oneshot.LoraMerge`.

    Raises:
      ValueError: if no layer of `model` has LoRA enabled.

    Example:

    >>> import keras, maskfit, numpy as np
    >>> dense = keras.layers.Dense(2)
    >>> dense.build((None, 2))
    >>> _ = dense.kernel.assign([[1.0, 0.0], [0.0, 1.0]])
    >>> _ = maskfit.set_mask(dense, maskfit.ElementMask({"kernel": [[1, 0], [0, 1]]}))
    >>> dense.enable_lora(1)
    >>> _ = dense.lora_kernel_a.assign([[1.0], [1.0]])
    >>> _ = dense.lora_kernel_b.assign([[0.5, 0.5]])
    >>> merged = maskfit.oneshot.merge_lora(dense)
    >>> keras.ops.convert_to_numpy(dense.kernel).tolist(), merged.dropped
    ([[1.5, 0.0], [0.0, 1.5]], 0.5)
    """
    found = [model] + internals.sublayers(model)
    merged, total, dropped = [], 0.0, 0.0
    for layer in found:
        if not getattr(layer, "lora_enabled", False):
            continue
        kernels = [w for w in layer.weights if w.name == "kernel"]
        if len(kernels) != 1 or getattr(layer, "quantization_mode", None):
            continue
        variable = kernels[0]
        base = np.asarray(keras.ops.convert_to_numpy(variable), np.float64)
        delta = np.asarray(keras.ops.convert_to_numpy(layer.kernel), np.float64) - base
        spec = declare.get_mask(layer)
        keep = np.ones_like(base)
        if spec is not None and "kernel" in getattr(spec, "masks", {}):
            keep = np.broadcast_to(spec.masks["kernel"] != 0, base.shape)
        total += float(np.sum(delta**2))
        dropped += float(np.sum(np.where(keep, 0.0, delta) ** 2))
        value = np.where(keep, base + delta, base)
        variable.assign(keras.ops.convert_to_tensor(value, dtype=variable.dtype))
        for factor in (layer.lora_kernel_a, layer.lora_kernel_b):
            factor.assign(keras.ops.zeros(factor.shape, factor.dtype))
        merged.append(getattr(layer, "path", None) or layer.name)
    if not merged:
        raise ValueError(
            f"merge_lora: no layer of '{model.name}' has LoRA enabled; call"
            " enable_lora (a keras_hub backbone's, or a layer's) before healing."
        )
    return LoraMerge(tuple(merged), dropped / total if total else 0.0)
