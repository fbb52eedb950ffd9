"""The fine-tuning recipes and layer-wise decay under JAX: each declares masks
that the JAX step holds exactly (AdamW: weight decay moves an unmasked entry)."""

import keras
import numpy as np
import pytest

import maskfit

pytestmark = pytest.mark.backends("jax")


def _model():
    return maskfit.MaskedSequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(6, activation="tanh", name="body"),
            keras.layers.Dense(2, name="head"),
        ]
    )


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(16, 4)).astype("float32"), rng.normal(size=(16, 2))


def _fit(model, steps, compile=True):
    x, y = _data()
    if compile:
        optimizer = keras.optimizers.AdamW(0.05, weight_decay=0.1)
        model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y, batch_size=4, epochs=steps // 4, shuffle=False, verbose=0)


def _values(model):
    # Keyed "layer/variable": a Sequential built in place prefixes its name.
    return {
        "/".join(v.path.split("/")[-2:]): np.array(v.numpy()) for v in model.weights
    }


def _moved(before, after):
    return {p for p in before if np.any(before[p] != after[p])}


def test_bitfit_trains_only_biases():
    model = _model()
    maskfit.bitfit(model)
    before = _values(model)
    _fit(model, 4)
    assert _moved(before, _values(model)) == {"body/bias", "head/bias"}


def test_train_only_trains_the_matching_variables():
    model = _model()
    maskfit.train_only(model, [r"head/"])
    before = _values(model)
    _fit(model, 4)
    assert _moved(before, _values(model)) == {"head/kernel", "head/bias"}


def test_probe_then_finetune_switches_inside_the_compiled_step():
    model = _model()
    maskfit.probe_then_finetune(model, model.get_layer("head"), switch_step=4)
    before = _values(model)
    _fit(model, 4)
    probed = _values(model)
    assert _moved(before, probed) == {"head/kernel", "head/bias"}
    _fit(model, 4, compile=False)  # optimizer steps 4..7: everything learns
    assert _moved(probed, _values(model)) == set(before)


def test_sparse_finetune_keeps_k_entries_learning():
    model = _model()
    model.compile(optimizer="adamw", loss="mse")
    x, y = _data()
    maskfit.sparse_finetune(model, x, y, k=5, steps=2, batch_size=4)
    assert maskfit.summary(model, print_fn=None).learnable_params == 5
    before = _values(model)
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    after = _values(model)
    changed = sum(int(np.sum(before[p] != after[p])) for p in before)
    assert changed == 5


def test_layerwise_decay_trains_every_layer():
    model = _model()
    maskfit.layerwise_decay(model, 0.5)
    before = _values(model)
    _fit(model, 4)
    assert _moved(before, _values(model)) == set(before)
