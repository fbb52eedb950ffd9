"""`prune_oneshot` on keras_hub causal LMs and plain models: exact sparsity, refusals, errors.

Every method at 50% and 2:4 on each tiny keras_hub causal LM (Llama,
Mistral, Gemma, Qwen, GPT-2, OPT; `hub_cases`): each pruned kernel has
exactly the entries its method compares pruned, its masked entries are 0 in
the kernel, its `ElementMask` holds them, and N:M holds group by group in
the kernel's `(in, out)` view. Llama runs in README's command, the others
are `slow`.
"""

import keras
import numpy as np
import pytest

import maskfit
from maskfit import internals
from maskfit.oneshot import views
from tests.helpers import hub_cases

keras_hub = pytest.importorskip("keras_hub", reason="needs the hub extra")
pytestmark = pytest.mark.backends("tensorflow", "jax")

CAUSAL_LMS = {
    "llama": "LlamaCausalLM",
    "mistral": "MistralCausalLM",
    "gemma": "GemmaCausalLM",
    "qwen": "QwenCausalLM",
    "gpt2": "GPT2CausalLM",
    "opt": "OPTCausalLM",
}
CASES = [
    pytest.param(
        name,
        method,
        marks=() if (name, method) == ("llama", "sparsegpt") else pytest.mark.slow,
    )
    for name in CAUSAL_LMS
    for method in maskfit.oneshot.METHODS
]


def causal_lm(name):
    keras.utils.set_random_seed(0)
    backbone = hub_cases.backbone(name)
    return getattr(keras_hub.models, CAUSAL_LMS[name])(
        backbone=backbone, preprocessor=None
    )


def calibration(batches=3, seed=0):
    rng = np.random.default_rng(seed)
    shape = (2, hub_cases.SEQUENCE)
    return [
        {
            "token_ids": rng.integers(0, 50, shape).astype("int32"),
            "padding_mask": np.ones(shape, "int32"),
        }
        for _ in range(batches)
    ]


def masked_kernels(model):
    """`[(layer, kernel value, keep mask)]` of every layer with an ElementMask."""
    found = []
    for layer in [model] + internals.sublayers(model):
        spec = maskfit.get_mask(layer)
        if spec is not None:
            kernel = [w for w in layer.weights if w.name == "kernel"][0]
            found.append(
                (layer, keras.ops.convert_to_numpy(kernel), spec.masks["kernel"])
            )
    return found


def check_pruned(model, report, pattern):
    found = masked_kernels(model)
    assert len(found) == len(report.layers) > 0
    rows = {row.kernel: row for row in report.layers}
    for layer, kernel, keep in found:
        row = rows.pop([w for w in layer.weights if w.name == "kernel"][0].path)
        np.testing.assert_array_equal(kernel[keep == 0], 0)
        assert int(np.sum(keep == 0)) == row.pruned == row.size // 2
        if pattern:
            n, m = (int(p) for p in pattern.split(":"))
            pruned = views.kernel_view(layer).matrix(keep == 0)
            groups = pruned.reshape(pruned.shape[0] // m, m, -1).sum(axis=1)
            np.testing.assert_array_equal(groups, n)


@pytest.mark.parametrize("name, method", CASES)
def test_every_method_prunes_each_causal_lm_to_exactly_half(name, method):
    lm = causal_lm(name)
    batches = calibration()
    for sparsity, pattern in ((0.5, None), (None, "2:4")):
        for layer, _, _ in masked_kernels(lm):
            maskfit.set_mask(layer, None)
        report = maskfit.prune_oneshot(lm, batches, method, sparsity, pattern)
        assert report.refused == {} and report.chained
        assert report.blocks == 2 and report.tokens == 3 * 2 * hub_cases.SEQUENCE
        check_pruned(lm, report, pattern)
        assert report.sparsity == 0.5


def _correlated_dense(seed=0):
    """A Dense layer whose inputs are correlated and of different scales."""
    rng = np.random.default_rng(seed)
    mixing = rng.normal(size=(32, 32)) * rng.uniform(0.1, 3.0, size=32)
    x = (rng.normal(size=(8, 64, 32)) @ mixing).astype("float32")
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(24)])
    model.layers[0].kernel.assign(rng.normal(size=(32, 24)).astype("float32"))
    return model, list(x)


@pytest.mark.parametrize("sparsity, pattern", [(0.5, None), (None, "2:4")])
def test_reconstruction_error_orders_sparsegpt_wanda_magnitude(sparsity, pattern):
    errors = {}
    for method in maskfit.oneshot.METHODS:
        model, x = _correlated_dense()
        report = maskfit.prune_oneshot(model, x, method, sparsity, pattern)
        errors[method] = report.layers[0].error
        # The report's error is the layer's output error on the calibration.
        dense = model.layers[0]
        fresh, _ = _correlated_dense()
        xs = np.concatenate(x)
        before = fresh(xs) - fresh.layers[0].bias
        after = keras.ops.convert_to_numpy(dense(xs) - dense.bias)
        measured = np.sum((before - after) ** 2) / np.sum(np.asarray(before) ** 2)
        np.testing.assert_allclose(errors[method], measured, rtol=1e-3)
    assert errors["sparsegpt"] < errors["wanda"] < errors["magnitude"], errors


def test_a_layer_that_cannot_take_the_pattern_is_refused_by_name():
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, name="six_inputs")(inputs)
    outputs = keras.layers.Dense(3, name="eight_inputs")(hidden)
    model = keras.Model(inputs, outputs)
    x = [np.random.default_rng(0).normal(size=(16, 6)).astype("float32")]
    report = maskfit.prune_oneshot(model, x, "wanda", pattern="2:4")
    assert list(report.refused) == ["six_inputs"]
    assert "multiple of 4" in report.refused["six_inputs"]
    assert [row.layer for row in report.layers] == ["eight_inputs"]
    assert maskfit.get_mask(model.get_layer("six_inputs")) is None


def _dense_model():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    return model, [np.ones((4, 8), "float32")]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(sparsity=1.0), ValueError, "strictly between 0 and 1"),
        (dict(sparsity=0.0), ValueError, "strictly between 0 and 1"),
        (dict(sparsity=True), ValueError, "strictly between 0 and 1"),
        (dict(pattern="2-4"), ValueError, "'N:M' with 0 < N < M"),
        (dict(pattern="4:2"), ValueError, "'N:M' with 0 < N < M"),
        (dict(pattern="2:4", sparsity=0.5), ValueError, "not both"),
        (dict(), ValueError, "sparsity= .* or pattern="),
        (dict(sparsity=0.5, method="obs"), ValueError, "unknown method"),
        (dict(pattern="3:7"), ValueError, "divisible by 7"),
        (dict(sparsity=0.5, percdamp=-1), ValueError, "percdamp"),
        (dict(sparsity=0.5, calibration=[]), ValueError, "calibration has no batch"),
        (dict(sparsity=0.5, calibration=3), TypeError, "iterable of batches"),
    ],
)
def test_bad_input_raises_one_clear_error_and_changes_nothing(kwargs, error, match):
    model, x = _dense_model()
    before = keras.ops.convert_to_numpy(model.layers[0].kernel)
    kwargs = dict(kwargs)
    calibration_batches = kwargs.pop("calibration", x)
    with pytest.raises(error, match=match):
        maskfit.prune_oneshot(model, calibration_batches, **kwargs)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(model.layers[0].kernel), before
    )
    assert maskfit.get_mask(model.layers[0]) is None


def test_a_model_without_prunable_layers_is_refused_with_the_reasons():
    plain = keras.Sequential([keras.Input((4,)), keras.layers.LayerNormalization()])
    with pytest.raises(
        ValueError, match="no Dense or EinsumDense layer it can prune: it has none"
    ):
        maskfit.prune_oneshot(plain, [np.ones((2, 4))], sparsity=0.5)
    model, x = _dense_model()
    model.layers[0].enable_lora(2)
    with pytest.raises(
        ValueError, match="'sequential.*/dense.*': LoRA is enabled on it"
    ):
        maskfit.prune_oneshot(model, x, sparsity=0.5)


@pytest.mark.parametrize("batches", [1, 2])  # one pass of the model; the passes
def test_a_failure_midway_puts_every_pruned_kernel_back(batches, monkeypatch):
    """The second block fails once the first one is pruned: both are put back."""
    inputs = keras.Input((8,))
    model = keras.Model(inputs, keras.layers.Dense(8)(keras.layers.Dense(8)(inputs)))
    before = [keras.ops.convert_to_numpy(w) for w in model.weights]
    first, second = model.layers[1], model.layers[2]
    original = second.call

    def broken(*args, **kwargs):
        if np.any(keras.ops.convert_to_numpy(first.kernel) == 0):
            raise RuntimeError("calibration failed")
        return original(*args, **kwargs)

    monkeypatch.setattr(second, "call", broken, raising=False)
    x = [np.ones((4, 8), "float32")] * batches
    with pytest.raises(RuntimeError, match="calibration failed"):
        maskfit.prune_oneshot(model, x, sparsity=0.5)
    for value, weight in zip(before, model.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(weight), value)
    assert all(maskfit.get_mask(layer) is None for layer in model.layers)


def test_blocks_with_work_between_them_are_calibrated_on_the_pruned_outputs():
    """Dense, ReLU, Dense: the second block's input is not the first one's output,
    so the model runs up to each block; its Wanda norms are those of the ReLU of
    the pruned first layer's outputs, as computed here in NumPy."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    hidden = keras.layers.ReLU()(keras.layers.Dense(16, name="first")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(4, name="second")(hidden))
    x = np.random.default_rng(0).normal(size=(2, 32, 8)).astype("float32")
    first = model.get_layer("first")
    second = keras.ops.convert_to_numpy(model.get_layer("second").kernel)
    dense_first = keras.ops.convert_to_numpy(first.kernel)
    report = maskfit.prune_oneshot(model, list(x), "wanda", sparsity=0.5)
    assert not report.chained and report.blocks == 2
    bias = keras.ops.convert_to_numpy(first.bias)

    def wanda_choice(first_kernel):
        read = np.maximum(x.reshape(-1, 8).astype(np.float64) @ first_kernel + bias, 0)
        scores = np.abs(second) * np.sqrt((read**2).sum(0))[:, None]
        chosen = np.zeros(scores.shape, bool)
        order = np.argsort(scores, axis=0, kind="stable")[:8]
        np.put_along_axis(chosen, order, True, 0)
        return chosen

    expected = wanda_choice(keras.ops.convert_to_numpy(first.kernel))
    keep = maskfit.get_mask(model.get_layer("second")).masks["kernel"]
    np.testing.assert_array_equal(keep == 0, expected)
    # Calibrating on the dense first layer's outputs would have chosen otherwise.
    assert not np.array_equal(wanda_choice(dense_first), expected)
