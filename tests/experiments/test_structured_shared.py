"""Tests of the pieces the structured-pruning experiment and benchmark share.

experiments.structured_models (one layer list, one set of initial weights),
experiments.model_cost (Torch-Pruning's counting rule, by hand here; against
Torch-Pruning itself in test_structured_benchmark.py), experiments.latency
and experiments.structured_train. None of them needs torch.
"""

import hypothesis
import keras
import numpy as np
import pytest
from hypothesis import strategies as st

from experiments.common import latency, model_cost
from experiments.common.structured import models as sm
from experiments.common.structured import train as structured_train
from experiments.common.structured import widths

# --- structured_models ---------------------------------------------------


def test_mlp_layers_are_named_and_sized_as_declared():
    model = sm.keras_model(sm.MLP(64, hidden=(32, 16)), seed=0)
    assert [layer.name for layer in model.layers] == [
        "input",
        "dense_1",
        "dense_2",
        "logits",
    ]
    assert [tuple(layer.kernel.shape) for layer in model.layers[1:]] == [
        (64, 32),
        (32, 16),
        (16, 10),
    ]
    assert model.get_layer("dense_1").activation is keras.activations.relu
    assert model.get_layer("logits").activation is keras.activations.linear


@pytest.mark.parametrize("dataset, blocks", [("digits", 1), ("mnist1d", 2)])
def test_resnet_has_a_stage_per_width_with_strided_shortcuts(dataset, blocks):
    arch = sm.for_data("resnet", dataset, widths=(8, 16, 32), blocks=blocks)
    model = sm.keras_model(arch, seed=0)
    names = {layer.name for layer in model.layers}
    # Stage 1 keeps its width and stride: an identity shortcut.
    assert "stage1_block1_shortcut_conv" not in names
    for stage in (2, 3):
        conv = model.get_layer(f"stage{stage}_block1_shortcut_conv")
        assert conv.strides == (2,) * arch.spatial_dims and conv.kernel_size[0] == 1
    assert f"stage3_block{blocks}_add" in names
    spatial = sm.INPUT_SHAPES[dataset][:-1]
    final = model.get_layer(f"stage3_block{blocks}_relu").output.shape
    assert tuple(final[1:-1]) == tuple(-(-s // 4) for s in spatial) and final[-1] == 32
    assert model.output.shape[-1] == 10
    conv_types = (keras.layers.Conv1D, keras.layers.Conv2D)
    convs = [layer for layer in model.layers if isinstance(layer, conv_types)]
    assert convs and not any(conv.use_bias for conv in convs)
    norm = model.get_layer("stem_bn")
    assert norm.momentum == pytest.approx(0.9) and norm.epsilon == pytest.approx(1e-5)


def test_initial_weights_are_glorot_uniform_and_depend_only_on_the_seed():
    arch = sm.ResNet((8, 8, 1), widths=(8, 16))
    first, again, other = (sm.initial_weights(arch, s) for s in (3, 3, 4))
    for name, arrays in first.items():
        for a, b in zip(arrays, again[name]):
            np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first["stem_conv"][0], other["stem_conv"][0])
    kernel = first["stage2_block1_1_conv"][0]  # 3x3, 8 -> 16 channels.
    limit = np.sqrt(6 / (9 * (8 + 16)))
    assert kernel.shape == (3, 3, 8, 16) and np.abs(kernel).max() <= limit
    assert np.abs(kernel).max() > 0.9 * limit
    gamma, beta, mean, variance = first["stem_bn"]
    np.testing.assert_array_equal(gamma, 1.0)
    np.testing.assert_array_equal(variance, 1.0)
    assert not beta.any() and not mean.any()
    model = sm.keras_model(arch, seed=3)
    stem = model.get_layer("stem_conv").kernel.numpy()
    np.testing.assert_array_equal(stem, first["stem_conv"][0])


@hypothesis.settings(max_examples=50, deadline=None)
@hypothesis.given(
    width=st.integers(1, 2048),
    fraction=st.floats(0.0, 0.99),
    round_to=st.sampled_from([1, 2, 4, 8, 16]),
)
def test_pruned_width_keeps_at_most_the_fraction_rounded_down(
    width, fraction, round_to
):
    kept = widths.pruned_width(width, fraction, round_to)
    assert kept % round_to == 0 and 0 <= kept <= width * (1 - fraction)
    assert kept > width * (1 - fraction) - round_to - 1


def test_shrunk_prunes_every_group_but_the_logits():
    mlp = widths.shrunk(sm.MLP(64, hidden=(1024, 1000)), 0.75, round_to=8)
    assert mlp.hidden == (256, 248) and mlp.classes == 10
    net = widths.shrunk(sm.ResNet((40, 1), widths=(32, 64), blocks=2), 0.5, round_to=8)
    assert net.widths == (16, 32) and net.inner_widths == (16, 16, 32, 32)
    model = sm.keras_model(net)
    assert model.get_layer("stage2_block2_1_conv").filters == 32
    assert model.get_layer("stage2_block2_2_conv").filters == 32
    with pytest.raises(ValueError, match=r"keeps none; use a smaller fraction"):
        widths.shrunk(sm.ResNet((8, 8, 1), widths=(16, 32)), 0.75, round_to=8)


def test_bad_architectures_are_refused_where_they_are_declared():
    with pytest.raises(ValueError, match=r"`hidden`.*Received: hidden=\(0,\)"):
        sm.MLP(64, hidden=(0,))
    with pytest.raises(ValueError, match=r"`inner_widths`.*one width per block"):
        sm.ResNet((8, 8, 1), widths=(8, 16), inner_widths=(8,))
    with pytest.raises(ValueError, match=r"Received: kind='vit'"):
        sm.for_data("vit", "digits")
    with pytest.raises(ValueError, match=r"Received: dataset='cifar'"):
        sm.for_data("mlp", "cifar")


# --- model_cost ----------------------------------------------------------


def test_mlp_cost_is_multiply_adds_plus_bias_plus_relu():
    model = sm.keras_model(sm.MLP(64, hidden=(1024, 1024)))
    params, macs = model_cost.count(model)
    assert params == 64 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10
    # Each Dense: in x out + out (bias); each ReLU: out.
    assert macs == params + 2 * 1024


def test_resnet_cost_counts_convs_batch_norm_relu_and_pooling():
    arch = sm.ResNet((8, 8, 1), widths=(4, 8), blocks=1)
    model = sm.keras_model(arch)
    costs = model_cost.layer_costs(model)
    assert costs["stem_conv"] == (9 * 1 * 4, 64 * 9 * 1 * 4)
    # Batch norm: scale and offset are parameters (not the moving statistics);
    # 2 ops per element.
    assert costs["stem_bn"] == (8, 2 * 64 * 4)
    assert costs["stem_relu"] == (0, 64 * 4)
    assert costs["stage2_block1_1_conv"] == (9 * 4 * 8, 16 * 9 * 4 * 8)
    assert costs["stage2_block1_shortcut_conv"] == (4 * 8, 16 * 4 * 8)
    assert costs["stage2_block1_add"] == (0, 0)
    assert costs["pool"] == (0, 16 * 8)
    assert costs["logits"] == (8 * 10 + 10, 8 * 10 + 10)
    params, _ = model_cost.count(model)
    moving = sum(
        2 * layer.gamma.shape[0]
        for layer in model.layers
        if isinstance(layer, keras.layers.BatchNormalization)
    )
    assert params == model.count_params() - moving


def test_a_layer_without_a_counting_rule_is_named():
    model = keras.Sequential(
        [keras.Input((4, 4, 1)), keras.layers.MaxPooling2D(name="pooling")]
    )
    with pytest.raises(
        ValueError, match=r"'pooling' of type MaxPooling2D has no counting"
    ):
        model_cost.count(model)
    tanh = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(2, activation="tanh", name="d")]
    )
    with pytest.raises(ValueError, match=r"'d' has activation 'tanh'"):
        model_cost.count(tanh)


# --- latency -------------------------------------------------------------


@pytest.mark.parametrize("path", latency.KERAS_PATHS)
def test_every_keras_path_computes_the_model(path):
    model = sm.keras_model(sm.ResNet((8, 8, 1), widths=(4, 8)), seed=0)
    call = latency.keras_inference(model, batch=3, path=path, seed=5)
    x = np.random.default_rng(5).standard_normal((3, 64)).astype(np.float32)
    expected = model(x, training=False).numpy()
    np.testing.assert_allclose(np.asarray(call()), expected, rtol=1e-4, atol=1e-5)


def test_an_unknown_path_is_refused():
    model = sm.keras_model(sm.MLP(4, hidden=(2,)))
    with pytest.raises(ValueError, match=r"Received: path='onnx'"):
        latency.keras_inference(model, batch=1, path="onnx")


def test_interleaved_rotates_the_order_and_summarize_pairs_rounds():
    order = []
    contenders = {key: (lambda key=key: order.append(key)) for key in ("a", "b", "c")}
    wall, cpu = latency.interleaved(contenders, rounds=3, calls=2, warmup=1)
    assert {k: len(v) for k, v in wall.items()} == {"a": 3, "b": 3, "c": 3}
    assert set(cpu) == set(wall)
    starts = [order[i] for i in range(0, len(order), 6)]
    assert starts == ["a", "b", "c", "a"]
    summary = latency.summarize(
        {"dense": [2.0, 4.0, 2.0], "shrunk": [1.0, 1.0, 1.5]}, "dense"
    )
    assert summary["dense"]["ratio"]["median"] == 1.0
    assert summary["shrunk"]["ratio"]["median"] == 0.5
    assert summary["shrunk"]["ratio_of_minima"] == 0.5
    assert summary["shrunk"]["ms"]["median"] == 1000.0


def test_compare_gives_a_row_per_batch_with_ratios_to_the_baseline():
    models = {
        "dense": sm.keras_model(sm.MLP(64, hidden=(64,))),
        "0.5": sm.keras_model(sm.MLP(64, hidden=(32,))),
    }
    rows = latency.compare(
        models,
        lambda m, b: latency.keras_inference(m, b),
        (1, 4),
        rounds=2,
        round_seconds=0.001,
    )
    assert [row["batch"] for row in rows] == [1, 4]
    for row in rows:
        assert set(row["wall"]) == {"dense", "0.5"} and row["calls_per_round"] >= 1
        assert row["wall"]["dense"]["ratio"]["median"] == 1.0
        assert row["wall"]["0.5"]["ms"]["median"] > 0


# --- structured_train ----------------------------------------------------


def test_batches_are_one_fresh_permutation_per_epoch_and_the_same_every_time():
    budget = structured_train.Budget(batch_size=4)
    every = structured_train.batches(10, budget, seed=1, first_epoch=0, last_epoch=3)
    assert every.shape == (6, 4)
    for epoch in range(3):
        rows = every[2 * epoch : 2 * epoch + 2].ravel()
        assert len(set(rows)) == 8 and set(rows) <= set(range(10))
    later = structured_train.batches(10, budget, seed=1, first_epoch=1, last_epoch=3)
    np.testing.assert_array_equal(later, every[2:])
    other = structured_train.batches(10, budget, seed=2, first_epoch=0, last_epoch=3)
    assert not np.array_equal(other, every)
    with pytest.raises(ValueError, match=r"fewer than one batch of batch_size=4"):
        structured_train.batches(3, budget, seed=0, first_epoch=0, last_epoch=1)


def test_pruning_steps_spread_over_the_pruning_epochs():
    budget = structured_train.Budget(
        batch_size=10, epochs=2, prune_epochs=2, prune_steps=3
    )
    # 5 steps per epoch: pruning from step 10 over 10 steps.
    assert structured_train.pruning_steps(50, budget) == [10, 13, 16]
    assert budget.total_epochs == 2 + 2 + 10


def test_a_bad_budget_is_refused_with_the_value():
    with pytest.raises(ValueError, match=r"Received: optimizer='rmsprop'"):
        structured_train.Budget(optimizer="rmsprop")
    with pytest.raises(ValueError, match=r"Received: prune_steps=0"):
        structured_train.Budget(prune_steps=0)
    with pytest.raises(ValueError, match=r"Received: learning_rate=0"):
        structured_train.Budget(learning_rate=0)


def test_keras_fit_trains_on_the_batches_in_order():
    x = np.random.default_rng(0).standard_normal((12, 4)).astype(np.float32)
    y = (np.arange(12) % 3).astype(np.int32)
    data = type("Data", (), {"x_train": x, "y_train": y})
    budget = structured_train.Budget(optimizer="sgd", learning_rate=0.1, batch_size=4)
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(batch)

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    structured_train.compile_keras(model, budget)
    before = model.layers[0].kernel.numpy()
    structured_train.keras_fit(model, data, budget, 0, 0, 2, callbacks=[Record()])
    assert seen == list(range(6))  # 3 batches per epoch, 2 epochs, one fit.
    assert not np.array_equal(before, model.layers[0].kernel.numpy())
    # By hand: plain SGD (momentum 0.9 from zero velocity) over the same batches.
    order = structured_train.batches(12, budget, 0, 0, 2)
    kernel, bias = before.astype(np.float64), np.zeros(3)
    velocity = [np.zeros_like(kernel), np.zeros_like(bias)]
    for indices in order:
        xb, yb = x[indices], y[indices]
        logits = xb @ kernel + bias
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        p[np.arange(len(yb)), yb] -= 1
        grads = [xb.T @ p / len(yb), p.mean(0)]
        for i, g in enumerate(grads):
            velocity[i] = 0.9 * velocity[i] - 0.1 * g
        kernel, bias = kernel + velocity[0], bias + velocity[1]
    np.testing.assert_allclose(
        model.layers[0].kernel.numpy(), kernel, rtol=1e-4, atol=1e-5
    )
