"""Structured pruning through `keras.ops` calls in a functional graph (op layers).

Element-wise operations pass units on and join the tensors they combine
(broadcast gates too), reductions pass them unless they reduce over them,
operations that move positions are read by running them, and an operation
without a coupling keeps what it reads, named in `explain`: the couplings
agree with the operations' gradients and `shrink` computes what the masked
model computes, never an AttributeError.
"""

import inspect

import keras
import numpy as np
import pytest

import maskfit
from tests.helpers import coupling_checks
from tests.helpers import structured_models as models

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


@pytest.mark.parametrize("name", list(OP_MODELS))
def test_ops_couple_as_their_gradients_say_and_shrink_computes_the_same(name):
    model, x = OP_MODELS[name]()
    selection, small = coupling_checks.checked_half_shrink(model)
    models.assert_same_outputs(model, small, selection, x)
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
    models.assert_same_outputs(model, small, selection, models._x((3, 4)))


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
    models.assert_same_outputs(pruned, small, selection, x)


# keras.ops calls on a (batch, 3, 8) tensor whose 8 channels are units: each
# passes them on (checked against its gradients, and shrink computes the same).
_OLD_KERAS = tuple(int(p) for p in keras.__version__.split(".")[:2]) < (3, 15)

_PASSING = {
    "abs": ops.abs,
    "negative": ops.negative,
    "square": ops.square,
    "relu": ops.relu,
    "gelu": ops.gelu,
    "silu": ops.silu,
    "tanh": ops.tanh,
    "cast": lambda h: ops.cast(h, "float32"),
    "clip": lambda h: ops.clip(h, -0.5, 0.5),
    "where": lambda h: ops.where(h > 0, h, 0.1 * h),
    "maximum": lambda h: ops.maximum(h, 0.0),
    "divide": lambda h: h / 3.0,
    "subtract": lambda h: 1.0 - h,
    "softmax_other_axis": lambda h: ops.softmax(h, axis=1),
    "mean": lambda h: ops.mean(h, axis=1),
    "sum_keepdims": lambda h: ops.sum(h, axis=1, keepdims=True),
    "max": lambda h: ops.max(h, axis=-2),
    "std": lambda h: ops.std(h, axis=1),
    "logsumexp": lambda h: ops.logsumexp(h, axis=1),
    "transpose": lambda h: ops.transpose(h, (0, 2, 1)),
    "expand_squeeze": lambda h: ops.squeeze(ops.expand_dims(h, 1), 1),
    "flip": lambda h: ops.flip(h, axis=1),
    "flip_units": lambda h: ops.flip(h, axis=-1),
    "tile": lambda h: ops.tile(h, (1, 2, 1)),
    "repeat": lambda h: ops.repeat(h, 2, axis=1),
    "pad": lambda h: ops.pad(h, ((0, 0), (1, 1), (0, 0))),
    "roll": lambda h: ops.roll(h, 1, axis=1),
    "swapaxes": lambda h: ops.swapaxes(h, 1, 2),
    "moveaxis": lambda h: ops.moveaxis(h, -1, 1),
    "reshape": lambda h: ops.reshape(h, (-1, 24)),
    "getitem": lambda h: h[:, 1:, :],
    "getitem_reversed": lambda h: h[:, :, ::-1],
    "concatenate": lambda h: ops.concatenate([h, h], axis=1),
}


@pytest.mark.parametrize("name", list(_PASSING))
def test_each_passing_op_agrees_with_its_gradients_and_shrinks(name):
    if name == "logsumexp" and _OLD_KERAS:
        pytest.skip("Keras 3.10's symbolic logsumexp(axis=int) raises a TypeError")
    x = keras.Input((3, 4))
    h = L.Dense(8, name="hidden")(x)
    out = L.Flatten()(_PASSING[name](h))
    model = models.functional(x, L.Dense(2, name="head")(out))
    graph = pruning.DependencyGraph(model)
    assert "all removable" in graph.explain("hidden"), graph.explain()
    coupling_checks.check_graph(graph)
    selection = pruning.select_units(model, 0.5)
    small = pruning.shrink(model, selection)
    assert small.get_layer("hidden").units == 4
    models.assert_same_outputs(model, small, selection, models._x((3, 3, 4)))


@pytest.mark.skipif(
    _OLD_KERAS, reason="the records name Keras 3.15's operations (3.10 lacks some)"
)
def test_every_op_record_names_a_keras_operation():
    from keras.src.ops import core, math, nn, numpy  # tests may read keras.src

    from maskfit.kinds import ops as couplings_ops
    from maskfit.kinds import ops as op_kinds

    classes = {}
    for module in (numpy, nn, math, core):
        for name, value in vars(module).items():
            if isinstance(value, type) and issubclass(value, keras.Operation):
                classes.setdefault(name, value)
    assert sorted(set(op_kinds.OPS) - set(classes)) == []
    for name, guarded in op_kinds.OPS.items():
        assert isinstance(guarded, couplings_ops.Guarded), name
        coupling = guarded.coupling
        parameters = inspect.signature(classes[name].__init__).parameters
        if isinstance(coupling, couplings_ops.Reduce):
            assert "axis" in parameters, name
        if isinstance(coupling, couplings_ops.Moves) and coupling.resizes:
            assert coupling.resizes in parameters, name


def _branches():
    x = keras.Input((4,))
    small_branch = L.Dense(2, name="small_branch")(x)
    big_branch = L.Dense(6, name="big_branch")(x)
    stream = L.Dense(8, name="stream")(x)
    joined = L.Add()([L.Concatenate()([small_branch, big_branch]), stream])
    model = models.functional(x, L.Dense(2, name="head")(joined))
    model.get_layer("small_branch").kernel.assign(np.zeros((4, 2)) + 1e-6)
    return model


def test_a_branch_joined_to_a_stream_keeps_a_unit_whatever_the_ranking():
    model = _branches()
    selection = pruning.select_units(model, 0.75)
    small = pruning.shrink(model, selection)
    assert small.get_layer("small_branch").units == 1
    models.assert_same_outputs(model, small, selection, models._x((3, 4)))


def test_a_branch_joined_to_a_stream_keeps_a_unit_in_fit(mode):
    model = _branches()
    pruned = pruning.prune_units(
        model, pruning.ConstantSparsity(0.75, begin_step=1, end_step=3, frequency=1)
    )
    pruned.compile(optimizer="sgd", loss="mse", **mode)
    x = models._x((4, 4))
    pruned.fit(x, np.zeros((4, 2)), batch_size=1, epochs=1, verbose=0)
    small = pruning.shrink(pruned)
    assert small.get_layer("small_branch").units == 1
    models.assert_same_outputs(pruned, small, pruning.unit_selection(pruned), x)


def test_an_op_whose_coupling_fails_keeps_its_units_and_says_why(monkeypatch):
    from maskfit import records
    from maskfit.kinds import ops as couplings_ops

    class Broken(pruning.Coupling):
        def couple(self, call, graph):
            raise IndexError("an argument it did not expect")

    monkeypatch.setitem(records._BUILTIN_OPS, "Add", couplings_ops.Guarded(Broken()))
    x = keras.Input((4,))
    h = L.Dense(8, name="hidden")(x) + 1.0
    model = models.functional(x, L.Dense(2, name="head")(L.Dense(6, name="d")(h)))
    text = pruning.DependencyGraph(model).explain("hidden")
    assert "8 stay" in text and "an argument it did not expect" in text, text
    small = pruning.shrink(model, pruning.select_units(model, 0.5))
    assert small.get_layer("hidden").units == 8 and small.get_layer("d").units == 3
