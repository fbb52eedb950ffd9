"""What XLA makes of the masked step: stock's kernels, plus the masks' reads.

The masked step compiled with XLA (`jax.jit` on JAX, `jit_compile=True` on
TensorFlow) must be stock Keras's step with each mask applied inside the
update that reads it: the same fusions and kernels as stock (no separate
masking pass, no copy of a variable for the guard that holds frozen
entries), and no more bytes accessed than the update's few reads of each
mask (an `OutputMask` as its per-unit vector, an `ElementMask` as one byte
per entry). Read from the optimized HLO with `benchmarks.hlo`.
"""

import keras
import numpy as np
import pytest

import maskfit
from benchmarks import hlo

pytestmark = pytest.mark.backends("tensorflow", "jax")

_WIDTH, _BATCH = 64, 16
# The update reads a mask once in each fusion it shapes: the gradient, the
# optimizer's slots, the variable (AdamW: 3 on this machine's XLA); 4 leaves
# room for a release that fuses the gradient's masking apart.
_READS = 4


def _model(mask):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((_WIDTH,))
    hidden = keras.layers.Dense(_WIDTH, activation="relu")(inputs)
    hidden = keras.layers.Dense(_WIDTH, activation="relu")(hidden)
    outputs = keras.layers.Dense(4)(hidden)
    model = (keras.Model if mask is None else maskfit.MaskedModel)(inputs, outputs)
    rng = np.random.default_rng(1)
    mask_bytes = 0
    for layer in model.layers[1:]:
        if mask == "output":
            maskfit.set_mask(layer, maskfit.OutputMask(np.arange(layer.units) % 2))
            # Its per-unit vector, for the kernel and the bias: bool on JAX;
            # on TensorFlow the mask's state has the variable's dtype.
            per_unit = 1 if keras.backend.backend() == "jax" else 4
            mask_bytes += 2 * layer.units * per_unit
        elif mask == "element":
            keep = rng.random(tuple(layer.kernel.shape)) >= 0.9
            maskfit.set_mask(layer, maskfit.ElementMask({"kernel": keep}))
            mask_bytes += keep.size  # one byte per entry
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-3, weight_decay=0.004),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    return model, mask_bytes


def _counts(model):
    x = np.random.default_rng(0).standard_normal((_BATCH, _WIDTH)).astype("float32")
    y = np.zeros((_BATCH,), "int32")
    if keras.backend.backend() == "jax":
        return hlo.jax_step(model, x, y)
    return hlo.tf_step(model, x, y)


@pytest.fixture(scope="module")
def stock():
    return _counts(_model(None)[0])


@pytest.mark.parametrize("mask", ["output", "element"])
def test_masked_step_is_stock_plus_the_masks_reads(stock, mask):
    model, mask_bytes = _model(mask)
    masked = _counts(model)

    assert masked["fusions"] == stock["fusions"], (masked, stock)
    assert masked["kernels"] == stock["kernels"], (masked, stock)
    extra = masked["bytes_accessed"] - stock["bytes_accessed"]
    assert 0 < extra <= _READS * mask_bytes, (extra, mask_bytes, masked, stock)
