"""shrink: for every coupled layer kind and structure, the couplings agree with
the layers' gradients, and the smaller model computes what the pruned (masked)
model computes, trains on, and saves with stock Keras; every keras.layers class
is coupled or refused, and each one with weights is pruned in a model here or
refused with its reason."""

import inspect
import json
import zipfile
from typing import NamedTuple

import keras
import numpy as np
import pytest
import tensorflow as tf

import maskfit
from maskfit import internals
from maskfit.structured import (
    couplings,
    couplings_keras,
    couplings_passing,
    couplings_sequence,
)
from maskfit.structured.graph import dependency as unit_graph
from maskfit.structured.scoring import choice as unit_choice
from tests.helpers import coupling_checks
from tests.helpers import structured_models as models
from tests.helpers.keras_versions import call_or_xla

pruning = maskfit.pruning
L = keras.layers


class Pruned(NamedTuple):
    model: object
    x: object
    selection: object
    small: object


_PRUNED = {}


def pruned(name):
    """Model `name` of `structured_models`, half its units selected, and shrunk
    (made once per test session: several tests read it)."""
    if name not in _PRUNED:
        model, x = models.MODELS[name]()
        selection = pruning.select_units(model, 0.5)
        _PRUNED[name] = Pruned(model, x, selection, pruning.shrink(model, selection))
    return _PRUNED[name]


def train_once(model, x):
    """One SGD step on a squared-output loss; returns whether every weight got a gradient."""
    variables = model.trainable_variables

    def gradients():
        with tf.GradientTape() as tape:
            outputs = keras.tree.flatten(model(x, training=True))
            loss = sum(tf.reduce_mean(tf.square(o)) for o in outputs)
        return tape.gradient(loss, variables)

    grads = call_or_xla(gradients)
    keras.optimizers.SGD(0.01).apply(grads, variables)
    return all(g is not None for g in grads)


@pytest.mark.parametrize("name", list(models.MODELS))
def test_couplings_hold_and_shrink_computes_what_the_pruned_model_computes(name):
    model, x, selection, small = pruned(name)
    assert selection.removed(), "the test model must lose units"
    assert coupling_checks.check_graph(selection.graph)

    assert type(small) in (internals.functional_class(), keras.Sequential)
    assert not any(
        type(l).__module__.startswith("maskfit") for l in internals.sublayers(small)
    )
    assert [l.name for l in small.layers] == [l.name for l in model.layers]
    models.assert_same_outputs(model, small, selection, x)
    report = pruning.size_report(model, small)
    assert report.params_after < report.params_before
    assert report.macs_after < report.macs_before
    assert all(r.macs_after <= r.macs_before for r in report.rows)
    # The smaller model trains on: every weight gets a gradient, they move
    # and stay finite.
    before = [w.copy() for w in small.get_weights()]
    assert train_once(small, x)
    after = small.get_weights()
    assert any(not np.array_equal(a, b) for a, b in zip(before, after))
    assert all(np.all(np.isfinite(w)) for w in after)


@pytest.mark.backends("tensorflow", "torch")
def test_removing_a_unit_takes_what_is_joined_to_it():
    model, x, _, _ = pruned("residual_bn")
    selection = pruning.UnitSelection.removing(model, {"stem": [3, 5]})

    # The residual add joins stem, block_b (and their batch norms) channel by
    # channel; block_a's units stay.
    assert selection.removed() == {
        "stem": {"units": [3, 5]},
        "block_b": {"units": [3, 5]},
    }
    small = pruning.shrink(model, selection)
    assert small.get_layer("stem").filters == 6
    assert small.get_layer("block_a").filters == 8
    assert small.get_layer("bn_b").moving_mean.shape == (6,)
    np.testing.assert_array_equal(
        small.get_layer("stem_bn").moving_variance.numpy(),
        np.delete(model.get_layer("stem_bn").moving_variance.numpy(), [3, 5]),
    )
    models.assert_same_outputs(model, small, selection, x)


@pytest.mark.backends("tensorflow", "torch")
def test_attention_loses_whole_heads():
    model, x, _, _ = pruned("attention")
    selection = pruning.UnitSelection.removing(model, {"mha": {"heads": [1, 2]}})

    small = pruning.shrink(model, selection)

    mha = small.get_layer("mha")
    assert mha.num_heads == 2 and mha.key_dim == 3
    np.testing.assert_array_equal(
        mha.query_dense.kernel.numpy(),
        model.get_layer("mha").query_dense.kernel.numpy()[:, [0, 3]],
    )
    models.assert_same_outputs(model, small, selection, x)


def test_group_normalization_loses_whole_groups_and_flatten_each_position():
    model, x, _, _ = pruned("normalizations")
    group = next(g for g in pruning.DependencyGraph(model).groups if "conv" in g.layers)
    assert len(group.atoms) == 4 and list(group.channels) == [2, 2, 2, 2]
    selection = pruning.UnitSelection.removing(model, {"conv": [2]})
    assert selection.removed() == {"conv": {"units": [2, 3]}}
    small = pruning.shrink(model, selection)
    assert small.get_layer("gn").groups == 3
    models.assert_same_outputs(model, small, selection, x)

    # Flatten after a conv: a removed channel goes at every position.
    model, x, _, _ = pruned("flatten_after_conv")
    small = pruning.shrink(model, pruning.UnitSelection.removing(model, {"conv": [1]}))
    kernel = model.get_layer("dense").kernel.numpy()
    positions = np.arange(kernel.shape[0])
    np.testing.assert_array_equal(
        small.get_layer("dense").kernel.numpy(), kernel[positions % 5 != 1]
    )


def test_a_channels_first_conv_is_never_left_with_as_many_channels_as_its_width():
    # Keras adds a channels_first bias along the last axis when that axis is
    # as long as the channels: 'conv1d' (8 filters, output 4 long) keeps 5,
    # not 4, and removing 4 by hand is refused, as is shrinking to 4.
    model, _, selection, small = pruned("channels_first")
    if not any(g.avoid for g in selection.graph.groups):
        pytest.skip("this Keras adds channels_first biases on their own axis")
    assert small.get_layer("conv1d").filters == 5
    with pytest.raises(ValueError, match="'conv1d' would keep 4 channels"):
        pruning.UnitSelection.removing(model, {"conv1d": [0, 1, 2, 3]})
    kept = np.asarray(selection.kept).copy()
    space = selection.graph.own_space(model.get_layer("conv1d"))
    atoms = selection.graph.atoms_of(space.ids)
    kept[atoms] = np.arange(len(atoms)) < 4
    with pytest.raises(
        ValueError, match="shrink: layer 'conv1d' would keep 4 channels"
    ):
        pruning.shrink(model, pruning.UnitSelection(selection.graph, kept))


@pytest.mark.backends("tensorflow", "torch")
def test_shrunk_models_save_and_load_with_stock_keras_without_maskfit(tmp_path):
    for name in (
        "residual_bn",
        "attention_residual",
        "bidirectional",
        "nested",
        "sequential",
    ):
        model, x, _, small = pruned(name)
        path = str(tmp_path / f"{name}.keras")
        small.save(path)
        # Nothing in the file names maskfit: stock Keras, without it, reads it.
        with zipfile.ZipFile(path) as archive:
            config = archive.read("config.json").decode()
        assert "maskfit" not in config.lower(), name
        json.loads(config)
        loaded = keras.saving.load_model(path, safe_mode=True)
        assert type(loaded) is type(small)
        np.testing.assert_allclose(
            models.run(loaded, x), models.run(small, x), rtol=1e-6, atol=1e-6
        )


def test_dict_inputs_and_outputs_keep_their_names():
    a, b = keras.Input((4,), name="a"), keras.Input((3,), name="b")
    h = L.Concatenate()([L.Dense(6, name="da")(a), L.Dense(5, name="db")(b)])
    h = L.Dense(7, name="mid")(h)
    model = models.functional(
        {"a": a, "b": b},
        {"out": L.Dense(2, name="out")(h), "aux": L.Dense(1, name="aux")(h)},
    )
    selection = pruning.select_units(model, 0.5)
    small = pruning.shrink(model, selection)

    x = {"a": models._x((3, 4)), "b": models._x((3, 3), seed=2)}
    expected, got = models.masked_outputs(model, selection, x), small(x)
    assert sorted(got) == ["aux", "out"] and [t.name for t in small.inputs] == [
        "a",
        "b",
    ]
    for key in expected:
        np.testing.assert_allclose(
            np.asarray(got[key]), expected[key], rtol=1e-5, atol=1e-6
        )


def test_an_importance_function_decides_and_masks_zero_exactly_the_removed_entries():
    model = pruned("mlp").model

    def by_position(variable, value):  # the last units score lowest
        return tf.zeros_like(value) + tf.cast(
            tf.range(value.shape[-1], 0, -1), value.dtype
        )

    selection = pruning.select_units(model, 0.5, importance=by_position)
    assert selection.removed()["hidden"]["units"] == [4, 5, 6, 7]

    selection = pruning.UnitSelection.removing(model, {"hidden": [0]})
    plan = unit_choice.UnitPlan(selection.graph)
    keep = np.asarray(selection.kept)
    mask = unit_choice.keep_mask(plan, keep, model.get_layer("hidden").kernel).numpy()
    assert not mask[:, 0].any() and mask[:, 1:].all()
    mask = unit_choice.keep_mask(plan, keep, model.get_layer("hidden2").kernel).numpy()
    assert not mask[0].any() and mask[1:].all()


# ------------------------------------------------------------- the sweep


def _public_layer_classes():
    return sorted(
        {
            value
            for name in dir(keras.layers)
            if inspect.isclass(value := getattr(keras.layers, name))
            and issubclass(value, keras.layers.Layer)
        },
        key=lambda c: c.__name__,
    )


# Kinds whose layers have weights (or read units through weights): each
# class with one of these couplings must lose units in a model above.
_WEIGHTED = (
    couplings_keras.Producer,
    couplings_keras.Depthwise,
    couplings_keras.Normalization,
    couplings_keras.PReLU,
    couplings_passing.Statistics,
    couplings_sequence.Recurrent,
    couplings_sequence.Bidirectional,
    couplings_sequence.TimeDistributed,
    couplings_sequence.MultiHeadAttention,
    couplings_sequence.KerasAttention,
)


def _rms_norm_over_channels():
    x = keras.Input((3, 4))
    h = L.RMSNormalization(name="subject")(L.Dense(6, name="hidden")(x))
    return keras.Model(x, L.Dense(2)(h))


def _spectral():
    x = keras.Input((4, 4, 2))
    h = L.Dense(2, name="hidden")(x)
    return keras.Model(x, L.Flatten()(L.SpectralNormalization(L.Dense(3), name="s")(h)))


# Classes with weights that keep every unit they read, and a model showing it.
_REFUSED_IN = {
    L.RMSNormalization: (_rms_norm_over_channels, "normalized together by 'subject'"),
    L.SpectralNormalization: (_spectral, "divides the wrapped kernel"),
    L.GroupQueryAttention: (None, "shares each key/value head"),
    L.ConvLSTM1D: (None, "convolutional LSTM"),
}


def test_every_keras_layer_class_is_coupled_or_refused():
    # Fails when Keras adds a layer: decide how units cross it, then add it.
    missing = [
        c.__name__
        for c in _public_layer_classes()
        if c not in couplings.builtin_table()
    ]
    assert missing == []


def test_every_keras_layer_class_with_weights_is_pruned_or_refused_with_its_reason():
    pruned_classes = set()
    for name in models.MODELS:
        selection = pruned(name).selection
        for layer_name in selection.removed():
            layer = next(
                s.layer for s in selection.graph.spaces if s.layer.name == layer_name
            )
            pruned_classes.add(type(layer))
        # Layers that pass removed units on (normalizations, depthwise, ...).
        graph = selection.graph
        for call, _, outputs in graph.calls:
            if any(
                u.ids is not None
                and not graph.kept_positions(u.ids, selection.kept).all()
                for u in outputs
            ):
                pruned_classes.add(type(call.layer))
    table = couplings.builtin_table()
    for cls, coupling in sorted(table.items(), key=lambda item: item[0].__name__):
        if isinstance(coupling, couplings.Refused):
            assert len(coupling.reason) > 10, cls
        elif isinstance(coupling, _WEIGHTED) and cls not in _REFUSED_IN:
            assert cls in pruned_classes, (
                f"{cls.__name__} loses no unit in any test model"
            )
    for cls, (make, reason) in _REFUSED_IN.items():
        if make is None:
            assert reason in table[cls].reason
            continue
        text = unit_graph.DependencyGraph(make()).explain("hidden")
        assert "stay" in text and reason in text, text
