"""shrink: for every coupled layer kind and structure, the couplings agree with
the layers' gradients, and the smaller model computes what the pruned (masked)
model computes, trains on, and saves with stock Keras."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import maskfit
from maskfit import internals
from maskfit.pruning import unit_choice

import coupling_checks
import structured_models as models


@pytest.fixture(autouse=True)
def _fresh_keras():
    """Cheaper than conftest's reset; fresh names, fixed seeds."""
    keras.backend.clear_session(free_memory=False)
    keras.utils.set_random_seed(0)
    yield


def assert_same_outputs(model, small, selection, x):
    expected = models.masked_outputs(model, selection, x)
    got = keras.tree.map_structure(np.asarray, small(x, training=False))
    for want, have in zip(keras.tree.flatten(expected), keras.tree.flatten(got)):
        assert want.shape == have.shape
        scale = float(np.max(np.abs(want))) or 1.0
        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-5 * scale)


def assert_stock(small):
    assert type(small) in (internals.functional_class(), keras.Sequential)
    for layer in internals.sublayers(small):
        assert not type(layer).__module__.startswith("maskfit"), layer


@pytest.mark.parametrize("name", sorted(models.MODELS))
def test_couplings_hold_and_shrink_computes_what_the_pruned_model_computes(name):
    model, x = models.MODELS[name]()
    selection = maskfit.pruning.select_units(model, 0.5)
    assert selection.removed(), "the test model must lose units"
    assert coupling_checks.check_graph(selection.graph)

    small = maskfit.pruning.shrink(model, selection)

    assert_stock(small)
    assert_same_outputs(model, small, selection, x)
    assert [l.name for l in small.layers] == [l.name for l in model.layers]
    report = maskfit.pruning.size_report(model, small)
    assert report.params_after < report.params_before
    # The smaller model trains on: its weights move, its outputs stay finite.
    y = np.zeros((len(x),) + tuple(small.output_shape[1:]), "float32")
    small.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", run_eagerly=True)
    before = [w.copy() for w in small.get_weights()]
    small.train_on_batch(x, y)
    assert any(not np.array_equal(a, b) for a, b in zip(before, small.get_weights()))
    assert np.all(np.isfinite(np.asarray(small(x))))


def test_removing_a_unit_takes_what_is_joined_to_it():
    model, x = models.residual_bn()
    selection = maskfit.pruning.UnitSelection.removing(model, {"stem": [3, 5]})

    # The residual add joins stem, block_b (and their batch norms) channel by
    # channel; block_a's units stay.
    assert selection.removed() == {"stem": {"units": [3, 5]}, "block_b": {"units": [3, 5]}}
    small = maskfit.pruning.shrink(model, selection)
    assert small.get_layer("stem").filters == 6
    assert small.get_layer("block_a").filters == 8
    assert small.get_layer("bn_b").moving_mean.shape == (6,)
    np.testing.assert_array_equal(
        small.get_layer("stem_bn").moving_variance.numpy(),
        np.delete(model.get_layer("stem_bn").moving_variance.numpy(), [3, 5]),
    )
    assert_same_outputs(model, small, selection, x)


def test_attention_loses_whole_heads():
    model, x = models.attention()
    selection = maskfit.pruning.UnitSelection.removing(model, {"mha": {"heads": [1, 2]}})

    small = maskfit.pruning.shrink(model, selection)

    mha = small.get_layer("mha")
    assert mha.num_heads == 2 and mha.key_dim == 3
    np.testing.assert_array_equal(
        mha.query_dense.kernel.numpy(),
        model.get_layer("mha").query_dense.kernel.numpy()[:, [0, 3]],
    )
    assert_same_outputs(model, small, selection, x)


def test_group_normalization_loses_whole_groups():
    model, x = models.group_norm()
    graph = maskfit.pruning.DependencyGraph(model)
    (group,) = graph.groups
    assert len(group.atoms) == 4 and list(group.channels) == [2, 2, 2, 2]

    selection = maskfit.pruning.UnitSelection.removing(model, {"conv": [2]})

    assert selection.removed() == {"conv": {"units": [2, 3]}}
    small = maskfit.pruning.shrink(model, selection)
    assert small.get_layer("gn").groups == 3
    assert_same_outputs(model, small, selection, x)


def test_flatten_after_a_conv_drops_each_channel_at_every_position():
    model, x = models.flatten_after_conv()()
    selection = maskfit.pruning.UnitSelection.removing(model, {"conv": [1]})

    small = maskfit.pruning.shrink(model, selection)

    kernel = model.get_layer("dense").kernel.numpy()
    positions = np.arange(kernel.shape[0])
    np.testing.assert_array_equal(
        small.get_layer("dense").kernel.numpy(), kernel[positions % 5 != 1]
    )
    assert_same_outputs(model, small, selection, x)


def test_shrunk_models_save_and_load_with_stock_keras(tmp_path):
    for name in ("residual_bn", "attention_residual", "bidirectional_concat", "nested",
                 "sequential"):
        model, x = models.MODELS[name]()
        small = maskfit.pruning.shrink(model, maskfit.pruning.select_units(model, 0.5))
        path = str(tmp_path / f"{name}.keras")
        small.save(path)
        loaded = keras.saving.load_model(path, safe_mode=True)
        np.testing.assert_allclose(
            np.asarray(loaded(x)), np.asarray(small(x)), rtol=1e-6, atol=1e-6
        )


def test_a_shrunk_model_loads_in_a_process_without_maskfit(tmp_path):
    model, x = models.residual_bn()
    small = maskfit.pruning.shrink(model, maskfit.pruning.select_units(model, 0.5))
    path = str(tmp_path / "small.keras")
    small.save(path)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", np.asarray(small(x)))
    script = (
        "import sys, numpy as np, keras\n"
        "model = keras.saving.load_model(sys.argv[1], safe_mode=True)\n"
        "out = np.asarray(model(np.load(sys.argv[2])))\n"
        "np.testing.assert_allclose(out, np.load(sys.argv[3]), rtol=1e-6, atol=1e-6)\n"
        "assert 'maskfit' not in sys.modules\n"
        "print('ok')\n"
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, "-c", script, path, str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
        capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300,
    )
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


def test_dict_inputs_and_outputs_keep_their_names():
    a, b = keras.Input((4,), name="a"), keras.Input((3,), name="b")
    h = keras.layers.Concatenate()([keras.layers.Dense(6, name="da")(a),
                                    keras.layers.Dense(5, name="db")(b)])
    h = keras.layers.Dense(7, name="mid")(h)
    model = models.functional(
        {"a": a, "b": b},
        {"out": keras.layers.Dense(2, name="out")(h), "aux": keras.layers.Dense(1, name="aux")(h)},
    )
    selection = maskfit.pruning.select_units(model, 0.5)
    small = maskfit.pruning.shrink(model, selection)

    x = {"a": models._x((3, 4)), "b": models._x((3, 3), seed=2)}
    expected, got = models.masked_outputs(model, selection, x), small(x)
    assert sorted(got) == ["aux", "out"] and [t.name for t in small.inputs] == ["a", "b"]
    for key in expected:
        np.testing.assert_allclose(np.asarray(got[key]), expected[key], rtol=1e-5, atol=1e-6)


def test_an_importance_function_decides_which_units_stay():
    model, _ = models.mlp()
    # An entry scores by its position on the last axis: the last units lowest.
    def by_position(variable, value):
        import tensorflow as tf

        return tf.zeros_like(value) + tf.cast(
            tf.range(value.shape[-1], 0, -1), value.dtype
        )

    selection = maskfit.pruning.select_units(model, 0.5, importance=by_position)

    assert selection.removed()["hidden"]["units"] == [4, 5, 6, 7]


def test_masked_outputs_helper_zeroes_exactly_the_removed_entries():
    model, _ = models.mlp()
    selection = maskfit.pruning.UnitSelection.removing(model, {"hidden": [0]})
    plan = unit_choice.UnitPlan(selection.graph)
    keep = np.asarray(selection.kept)
    hidden_kernel = model.get_layer("hidden").kernel
    mask = unit_choice.keep_mask(plan, keep, hidden_kernel).numpy()
    assert not mask[:, 0].any() and mask[:, 1:].all()
    head = model.get_layer("hidden2").kernel
    mask = unit_choice.keep_mask(plan, keep, head).numpy()
    assert not mask[0].any() and mask[1:].all()
