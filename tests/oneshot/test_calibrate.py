"""`calibrate.Stats`: layers that read one tensor share its `X^T X`, computed once."""

import keras
import numpy as np
import pytest

import maskfit
from maskfit.oneshot import calibrate, views

pytestmark = pytest.mark.backends("tensorflow", "jax")


def test_layers_reading_one_tensor_share_one_product():
    """Two kernels of one input and one of another: the sums are NumPy's X^T X of
    each layer's own input, and the shared input is flattened once per call."""
    rng = np.random.default_rng(0)
    first, second, other = (keras.layers.Dense(3) for _ in range(3))
    for layer, width in ((first, 4), (second, 4), (other, 5)):
        layer.build((None, width))
    flattened = []

    class Counted(views.KernelView):
        def inputs(self, x):
            flattened.append(id(x))
            return super().inputs(x)

    def view(layer):
        found = views.kernel_view(layer)
        return Counted(found.variable, found.shape, found.order, found.rows)

    shared = {}
    stats = [calibrate.Stats(view(layer), shared) for layer in (first, second, other)]
    xs = [rng.normal(size=(2, 6, 4)) for _ in range(2)]
    others = [rng.normal(size=(12, 5)) for _ in range(2)]
    for x, y in zip(xs, others):
        stats[0].add(x)
        stats[1].add(x)
        stats[2].add(y)
    rows = np.concatenate([x.reshape(-1, 4) for x in xs])
    np.testing.assert_array_equal(stats[0].sums, stats[1].sums)
    np.testing.assert_allclose(stats[0].sums, rows.T @ rows, rtol=1e-12)
    together = np.concatenate(others)
    np.testing.assert_allclose(stats[2].sums, together.T @ together, rtol=1e-12)
    assert [s.count for s in stats] == [24, 24, 24]
    assert len(flattened) == 4  # each x once, each y once
    # Not shared: each layer flattens its input itself.
    alone = calibrate.Stats(view(second))
    alone.add(xs[0])
    alone.add(xs[1])
    assert len(flattened) == 6


def test_sharing_prunes_as_before_on_a_keras_hub_llama(monkeypatch):
    """SparseGPT on a tiny Llama (query, key and value read one tensor; gate and
    up another): the same kernels as when every layer computes its own X^T X."""
    keras_hub = pytest.importorskip("keras_hub", reason="needs the hub extra")

    def pruned():
        keras.utils.set_random_seed(0)
        backbone = keras_hub.models.LlamaBackbone(
            vocabulary_size=50, num_layers=1, num_query_heads=2,
            num_key_value_heads=1, hidden_dim=8, intermediate_dim=16,
        )  # fmt: skip
        tokens = np.random.default_rng(0).integers(0, 50, (4, 1, 6)).astype("int32")
        batches = [{"token_ids": t, "padding_mask": np.ones_like(t)} for t in tokens]
        maskfit.prune_oneshot(backbone, batches, "sparsegpt", pattern="2:4")
        return [keras.ops.convert_to_numpy(w) for w in backbone.weights]

    shared = pruned()
    original = calibrate.Stats.__init__
    monkeypatch.setattr(
        calibrate.Stats,
        "__init__",
        lambda self, view, shared=None: original(self, view),
    )
    for a, b in zip(shared, pruned()):
        np.testing.assert_array_equal(a, b)
