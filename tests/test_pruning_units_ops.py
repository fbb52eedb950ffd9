"""Structured pruning through `keras.ops` calls in a functional graph (op layers).

Element-wise operations pass units on and join the tensors they combine
(broadcast gates too), reductions pass them unless they reduce over them,
operations that move positions are read by running them, and an operation
without a coupling keeps what it reads, named in `explain`: the couplings
agree with the operations' gradients and `shrink` computes what the masked
model computes, never an AttributeError.
"""

import coupling_checks
import keras
import numpy as np
import pytest
import structured_models as models

import maskfit

pruning = maskfit.pruning
L = keras.layers
ops = keras.ops


def _elementwise():
    x = keras.Input((6, 6, 3))
    h = L.Conv2D(8, 3, name="c1")(x)
    h = ops.hard_sigmoid(h + 3.0) * 2.0 - h / 4.0
    h = ops.cast(ops.relu(h), "float32")
    h = L.Conv2D(8, 3, name="c2")(h)
    return models.functional(x, L.Dense(2, name="head")(L.Flatten()(h))), (
        models._x((2, 6, 6, 3))
    )


def _squeeze_excite():
    x = keras.Input((6, 6, 3))
    h = L.Conv2D(8, 1, name="expand")(x)
    gate = ops.mean(h, axis=(1, 2), keepdims=True)
    gate = L.Conv2D(4, 1, activation="relu", name="reduce")(gate)
    gate = L.Conv2D(8, 1, activation="sigmoid", name="excite")(gate)
    h = L.Multiply(name="scale")([h, gate])
    h = h * ops.sigmoid(
        L.Conv2D(8, 1, name="excite2")(L.GlobalAveragePooling2D(keepdims=True)(h))
    )
    h = L.Conv2D(6, 1, name="project")(h)
    return models.functional(x, L.Dense(2, name="head")(L.Flatten()(h))), (
        models._x((2, 6, 6, 3))
    )


def _moving():
    x = keras.Input((5, 4))
    h = L.Dense(8, name="d1")(x)
    first = h[:, 0]
    pooled = ops.sum(h, axis=1)
    flat = ops.reshape(ops.transpose(h, (0, 2, 1)), (-1, 40))
    both = ops.concatenate([first, pooled], axis=-1)
    h2 = L.Dense(6, name="d2")(ops.expand_dims(both, 1))
    h2 = ops.squeeze(h2, axis=1)
    return models.functional(
        x, L.Dense(2, name="head")(ops.concatenate([h2, flat], -1))
    ), (models._x((3, 5, 4)))


OP_MODELS = {
    "elementwise": _elementwise,
    "squeeze_excite": _squeeze_excite,
    "moving": _moving,
}


def _assert_same_outputs(model, small, selection, x):
    expected = models.masked_outputs(model, selection, x)
    got = models.run(small, x)
    for want, have in zip(keras.tree.flatten(expected), keras.tree.flatten(got)):
        assert want.shape == have.shape
        scale = float(np.max(np.abs(want))) or 1.0
        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("name", list(OP_MODELS))
def test_ops_couple_as_their_gradients_say_and_shrink_computes_the_same(name):
    model, x = OP_MODELS[name]()
    graph = pruning.DependencyGraph(model)
    assert coupling_checks.check_graph(graph) > 0
    selection = pruning.select_units(model, 0.5)
    assert selection.removed()
    small = pruning.shrink(model, selection)
    _assert_same_outputs(model, small, selection, x)
    report = pruning.size_report(model, small)
    assert report.params_after < report.params_before


def test_squeeze_excite_gate_channels_go_with_the_gated_channels():
    model, _ = _squeeze_excite()
    graph = pruning.DependencyGraph(model)
    groups = {g.layers for g in graph.groups}
    assert ("expand", "excite", "excite2") in groups, groups
    assert "removable" in graph.explain("excite")


def test_ops_that_pick_channels_by_position_keep_them_and_say_which_op():
    x = keras.Input((4,))
    h = L.Dense(8, name="hidden")(x)
    picked = h[:, :4]
    reduced = ops.max(L.Dense(8, name="reduced")(x), axis=-1, keepdims=True)
    unknown = ops.matmul(L.Dense(8, name="mixed")(x), ops.ones((8, 8)))
    out = ops.concatenate([picked, reduced, unknown], axis=-1)
    model = models.functional(x, L.Dense(2, name="head")(out))
    graph = pruning.DependencyGraph(model)
    text = graph.explain()
    assert "picks channels by position" in graph.explain("hidden")
    assert "reduces over the units' axis" in graph.explain("reduced")
    assert "Matmul" in graph.explain("mixed") and "no coupling" in text
    small = pruning.shrink(model, pruning.select_units(model, 0.5))
    assert small.get_layer("hidden").units == 8


def test_a_constant_per_channel_keeps_the_channels_and_a_scalar_does_not():
    x = keras.Input((4,))
    scaled = L.Dense(8, name="scaled")(x) * np.arange(8, dtype="float32")
    shifted = L.Dense(8, name="shifted")(x) + 1.5
    model = models.functional(
        x, L.Dense(2, name="head")(ops.concatenate([scaled, shifted], axis=-1))
    )
    graph = pruning.DependencyGraph(model)
    assert "a constant of shape (8,)" in graph.explain("scaled")
    assert "all removable" in graph.explain("shifted")
    selection = pruning.select_units(model, 0.5)
    small = pruning.shrink(model, selection)
    assert small.get_layer("shifted").units == 4
    _assert_same_outputs(model, small, selection, models._x((3, 4)))


def test_nothing_removed_shrinks_a_graph_of_ops_without_error(tmp_path):
    model, x = _elementwise()
    small = pruning.shrink(model)
    np.testing.assert_allclose(models.run(small, x), models.run(model, x), rtol=1e-6)
    small.save(tmp_path / "small.keras")
    loaded = keras.saving.load_model(tmp_path / "small.keras")
    np.testing.assert_allclose(models.run(loaded, x), models.run(model, x), rtol=1e-6)


def test_prune_units_trains_through_ops(mode):
    model, x = _squeeze_excite()
    pruned = pruning.prune_units(
        model, pruning.ConstantSparsity(0.5, begin_step=1, end_step=1, frequency=1)
    )
    pruned.compile(optimizer="adam", loss="mse", **mode)
    pruned.fit(x, np.zeros((len(x), 2)), epochs=2, batch_size=2, verbose=0)
    selection = pruning.unit_selection(pruned)
    small = pruning.shrink(pruned)
    assert small.get_layer("expand").filters == 4
    _assert_same_outputs(pruned, small, selection, x)
