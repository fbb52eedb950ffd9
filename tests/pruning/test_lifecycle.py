"""Pruned models saved, loaded, stripped and reported: the state lives where Keras saves."""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import maskfit
from maskfit import model as model_lib
from maskfit import pruning
from maskfit.spec import rules as mask_rules


def pruned_sequential(schedule=None):
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="relu", name="body"),
            keras.layers.BatchNormalization(name="norm"),
            keras.layers.Dense(3, name="head"),
        ],
        name="net",
    )
    schedule = schedule or pruning.PolynomialDecay(0.0, 0.75, 0, 6, frequency=2)
    return pruning.prune_low_magnitude(model, pruning_schedule=schedule)


def data(n=32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype("float32")
    return x, rng.normal(size=(n, 3)).astype("float32")


def trained(steps=8):
    model = pruned_sequential()
    model.compile(optimizer=keras.optimizers.AdamW(0.05, weight_decay=0.1), loss="mse")
    x, y = data()
    model.fit(x[: 4 * steps], y[: 4 * steps], batch_size=4, verbose=0)
    return model


def test_saving_an_unstripped_model_keeps_the_pruning_and_training_resumes(tmp_path):
    model = trained(steps=4)  # pruned in steps 2 and 4; more in step 6
    path = str(tmp_path / "pruned.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, maskfit.MaskedSequential)
    assert mask_rules.get_rule(loaded) == mask_rules.get_rule(model)
    assert repr(mask_rules.get_rule(loaded)).startswith(
        "MagnitudePruning(PolynomialDecay("
    )
    before = model_lib.keep_masks(model)
    loaded_keeps = model_lib.keep_masks(loaded)  # loaded, not yet planned
    assert sorted(loaded_keeps) == sorted(before)
    for index, keep in before.items():
        np.testing.assert_array_equal(loaded_keeps[index], keep)
    assert int(loaded.optimizer.iterations.numpy()) == 4
    report = maskfit.summary(loaded, print_fn=None)
    assert report.pruned_params == sum(int((~k).sum()) for k in before.values())

    x, y = data(seed=1)
    for each in (model, loaded):
        each.fit(x[:16], y[:16], batch_size=4, verbose=0)  # steps 5-8
    for a, b in zip(model.weights, loaded.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    for index, keep in model_lib.keep_masks(model).items():
        np.testing.assert_array_equal(model_lib.keep_masks(loaded)[index], keep)
        assert np.count_nonzero(~keep) == keep.size - pruning.kept_count(
            keep.size, 0.75
        )


def test_strip_gives_a_stock_model_that_loads_in_a_fresh_process_without_maskfit(
    tmp_path,
):
    model = trained()
    stripped = pruning.strip_pruning(model)
    assert type(stripped) is keras.Sequential
    assert [l.name for l in stripped.layers] == ["body", "norm", "head"]
    for a, b in zip(model.weights, stripped.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert mask_rules.get_rule(model) is not None  # the pruned model is unchanged
    x, _ = data(seed=2)
    path = tmp_path / "stripped.keras"
    stripped.save(path)
    np.save(tmp_path / "expected.npy", stripped.predict(x, verbose=0))
    np.save(tmp_path / "x.npy", x)
    zeros = [int(np.sum(w.numpy() == 0)) for w in stripped.weights]
    script = textwrap.dedent(
        f"""
        import os, sys
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
        import keras, numpy as np
        model = keras.saving.load_model({str(path)!r}, safe_mode=True)
        assert "maskfit" not in sys.modules, "maskfit was imported"
        assert type(model) is keras.Sequential, type(model)
        zeros = [int(np.sum(w.numpy() == 0)) for w in model.weights]
        assert zeros == {zeros!r}, zeros
        x = np.load({str(tmp_path / "x.npy")!r})
        expected = np.load({str(tmp_path / "expected.npy")!r})
        np.testing.assert_allclose(model.predict(x, verbose=0), expected, rtol=1e-5, atol=1e-6)
        print("loaded")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=str(tmp_path),  # not the repository: maskfit is not importable by path
    )
    assert done.returncode == 0 and "loaded" in done.stdout, done.stderr[-3000:]


def test_strip_of_functional_and_masked_subclass_models():
    inputs = keras.Input((6,))
    outputs = keras.layers.Dense(3)(keras.layers.Dense(8)(inputs))
    pruned = pruning.prune_low_magnitude(keras.Model(inputs, outputs))
    pruned.compile(optimizer="adam", loss="mse")
    x, y = data()
    pruned.fit(x, y, batch_size=8, verbose=0)
    stripped = pruning.strip_pruning(pruned)
    assert type(stripped) is keras.Model or type(stripped).__name__ == "Functional"
    assert not isinstance(stripped, maskfit.MaskedModel)
    assert not mask_rules.layer_rules(stripped)
    np.testing.assert_allclose(
        stripped.predict(x, verbose=0), pruned.predict(x, verbose=0)
    )
    with pytest.raises(TypeError, match="expects a keras.Model"):
        pruning.strip_pruning(pruned.layers[1])


def test_summary_shows_pruned_counts():
    model = pruned_sequential()
    model.compile(optimizer="adam", loss="mse")
    lines = []
    result = maskfit.summary(model, print_fn=lines.append)
    body = next(r for r in result.rows if r.path.endswith("body/kernel"))
    assert (body.mask_kind, body.pruned, body.learnable) == ("pruned", 0, 48)
    x, y = data()
    model.fit(x, y, batch_size=4, verbose=0)  # 8 steps: 0.75 from step 6
    lines = []
    result = maskfit.summary(model, print_fn=lines.append)
    rows = {r.path.split("/")[-2] + "/" + r.path.split("/")[-1]: r for r in result.rows}
    assert rows["body/kernel"].pruned == 36 and rows["body/kernel"].frozen == 36
    assert rows["head/kernel"].pruned == 18
    assert rows["body/bias"].mask_kind == "none" and rows["body/bias"].pruned == 0
    assert result.pruned_params == 54
    assert result.learnable_params == result.trainable_params - 54
    header = lines[2].split()
    assert "Pruned" in header
    assert any("Pruned params (frozen at 0): 54" in line for line in lines)


def read_scalars(folder):
    values = {}
    for root, _, files in os.walk(folder):
        for name in files:
            for record in tf.data.TFRecordDataset(os.path.join(root, name)):
                event = tf.compat.v1.Event.FromString(record.numpy())
                for value in event.summary.value:
                    number = float(tf.make_ndarray(value.tensor))
                    values.setdefault(value.tag, []).append((event.step, number))
                    assert value.metadata.plugin_data.plugin_name == "scalars"
    return values


def test_pruning_summaries_write_sparsity_and_update_pruning_step_is_a_no_op(tmp_path):
    model = pruned_sequential()
    model.compile(optimizer="adam", loss="mse")
    x, y = data()
    model.fit(
        x,
        y,
        batch_size=4,
        epochs=2,
        verbose=0,
        callbacks=[
            pruning.UpdatePruningStep(),
            pruning.PruningSummaries(log_dir=str(tmp_path)),
        ],
    )
    values = read_scalars(tmp_path / "metrics")
    body = next(tag for tag in values if tag.endswith("body/kernel/sparsity"))
    assert values[body] == [(8, 0.75), (16, 0.75)]
    assert [s for s, _ in values["net/schedule_sparsity"]] == [8, 16]
    assert values["net/schedule_sparsity"][0][1] == pytest.approx(0.75)
    assert not any("bias" in tag or "norm" in tag for tag in values)


def test_pruning_callbacks_refuse_a_plain_model_that_would_not_prune(tmp_path):
    layer = pruning.prune_low_magnitude(keras.layers.Dense(3))
    model = keras.Sequential([keras.Input((6,)), layer])
    model.compile(optimizer="adam", loss="mse")
    x, y = data()
    with pytest.raises(ValueError, match="MaskedModel or maskfit.MaskedSequential"):
        model.fit(x, y, verbose=0, callbacks=[pruning.UpdatePruningStep()])
    with pytest.raises(ValueError, match="update_freq"):
        pruning.PruningSummaries(str(tmp_path), update_freq=0)
    with pytest.raises(TypeError, match="keras.callbacks.TensorBoard"):
        pruning.PruningSummaries(str(tmp_path), histogram_freq=1)


def test_saved_rules_naming_a_missing_layer_fail_whole_with_the_closest_name():
    inputs = keras.Input((3,))
    body = keras.layers.Dense(4, name="body")
    model = maskfit.MaskedModel(inputs, keras.layers.Dense(2)(body(inputs)))
    pruning.prune_low_magnitude(
        body, pruning_schedule=pruning.ConstantSparsity(0.5, 0, frequency=2)
    )
    config = keras.saving.serialize_keras_object(model)
    rules = config["config"]["mask_rules"]
    assert list(rules) == ["body"]
    rules["bdy"] = rules.pop("body")
    with pytest.raises(
        ValueError, match=r"saved mask rules name layer 'bdy'.*Did you mean 'body'"
    ):
        keras.saving.deserialize_keras_object(config)
