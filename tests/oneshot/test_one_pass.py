"""One calibration batch: every block calibrated and pruned in one pass of the model.

The pass gives the masks and weights the separate passes give on the same
batch (calibration per block, then the pruned block's outputs), on a chained
keras_hub Llama and on blocks with work between them; where the blocks are
called out of their listed order, it falls back to those passes.
"""

import keras
import numpy as np
import pytest

import maskfit
from maskfit.oneshot import calibrate

pytestmark = pytest.mark.backends("tensorflow", "jax")


def _llama():
    keras_hub = pytest.importorskip("keras_hub", reason="needs the hub extra")
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=50, num_layers=3, num_query_heads=2,
        num_key_value_heads=1, hidden_dim=8, intermediate_dim=16,
    )  # fmt: skip
    tokens = np.random.default_rng(0).integers(0, 50, (4, 6)).astype("int32")
    return backbone, {"token_ids": tokens, "padding_mask": np.ones_like(tokens)}


def _relus():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    x = inputs
    for _ in range(3):
        x = keras.layers.ReLU()(keras.layers.Dense(8)(x))
    model = keras.Model(inputs, keras.layers.Dense(4)(x))
    return model, np.random.default_rng(0).normal(size=(32, 8)).astype("float32")


class _Swapped(keras.Model):
    """Blocks listed (transformer_layers) in the reverse of their call order."""

    def __init__(self):
        super().__init__()
        self.first, self.second = keras.layers.Dense(8), keras.layers.Dense(8)
        self.transformer_layers = [self.second, self.first]

    def call(self, x):
        return self.second(self.first(x))


def _swapped():
    keras.utils.set_random_seed(0)
    model = _Swapped()
    x = np.random.default_rng(0).normal(size=(32, 8)).astype("float32")
    model(x)
    return model, x


def _pruned(build, method, monkeypatch=None):
    model, x = build()
    if monkeypatch is not None:  # the passes, on the same one batch
        monkeypatch.setattr(calibrate, "in_one_pass", lambda *args: None)
    report = maskfit.prune_oneshot(model, [x], method, pattern="2:4")
    weights = [keras.ops.convert_to_numpy(w) for w in model.weights]
    masks = [
        maskfit.get_mask(layer).masks["kernel"]
        for layer in model._flatten_layers()
        if maskfit.get_mask(layer) is not None
    ]
    return report, weights, masks


@pytest.mark.parametrize(
    "build, chained", [(_llama, True), (_relus, False), (_swapped, False)]
)
@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_one_pass_prunes_as_the_separate_passes(build, chained, method, monkeypatch):
    one, weights, masks = _pruned(build, method)
    passes, weights_after, masks_after = _pruned(build, method, monkeypatch)
    assert one.chained == passes.chained == chained
    assert one.sparsity == passes.sparsity == 0.5
    assert len(masks) == len(masks_after) > 0
    for a, b in zip(weights + masks, weights_after + masks_after):
        np.testing.assert_array_equal(a, b)


class _Idle(keras.Model):
    """Lists a third block that its call never reaches."""

    def __init__(self):
        super().__init__()
        self.first, self.second = keras.layers.Dense(8), keras.layers.Dense(8)
        self.idle = keras.layers.Dense(8, name="idle")
        self.transformer_layers = [self.first, self.second, self.idle]

    def build(self, shape):
        for layer in self.transformer_layers:
            layer.build(shape)

    def call(self, x):
        return self.second(self.first(x))


def test_a_block_never_called_is_named():
    """One clear error naming the block the pass never reached; nothing pruned."""
    model = _Idle()
    x = np.random.default_rng(0).normal(size=(32, 8)).astype("float32")
    model(x)
    before = [keras.ops.convert_to_numpy(w) for w in model.weights]
    with pytest.raises(ValueError, match="block 'idle' was not called"):
        maskfit.prune_oneshot(model, [x], "wanda", sparsity=0.5)
    for value, weight in zip(before, model.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(weight), value)
