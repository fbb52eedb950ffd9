"""Every model function in `keras.applications`, pruned to half its units.

The models are enumerated from the module (a new Keras application joins the
sweep by itself), built with `weights=None` at the smallest input each
accepts, and pruned one-shot (`select_units`) and gradually in `fit`
(`prune_units`, two steps, eagerly): about half of the prunable units go, and
`shrink`'s outputs equal the masked model's (rtol 1e-5 of the output's
scale). A model with no prunable unit would be listed in `REFUSED` with the
reason `explain` gives. A few small models run in the default suite; the
others are `slow` and `sweep` (about 13 minutes of CPU), which .ci/run runs
with `-n 2 --dist load -m sweep`.
"""

import keras
import numpy as np
import pytest

import maskfit
from maskfit import internals
from tests.helpers import coupling_checks
from tests.helpers import structured_models as models

pruning = maskfit.pruning

# Models whose units all stay, with the reason explain() gives: none today.
REFUSED = {}
# A fast subset, run in the default suite (the others are `slow`; EfficientNetV2B0,
# 14 s, went slow too, to keep README's suite under 10 minutes).
FAST = ("MobileNetV3Small",)


def application_names():
    """Every model function exported by keras.applications."""
    return sorted(
        name
        for name in dir(keras.applications)
        if name[:1].isupper() and callable(getattr(keras.applications, name))
    )


def _randomize(model, seed=0):
    """Random normalization statistics, scales and biases (kernels keep Keras's
    initialization, so activations stay finite through a hundred layers)."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        shape, name = tuple(variable.shape), variable.name
        if "float" not in str(variable.dtype) or name == "kernel" or len(shape) != 1:
            continue
        if name in ("gamma", "moving_variance") or "variance" in name:
            value = rng.uniform(0.5, 1.5, size=shape)
        else:
            value = rng.normal(size=shape) * 0.1
        variable.assign(value.astype(variable.dtype))
    return model


def _build(name):
    """The model at the smallest square input it accepts, and that size."""
    function = getattr(keras.applications, name)
    problem = None
    for size in (32, 71, 75):
        try:
            model = function(
                weights=None,
                input_shape=(size, size, 3),
                classes=10,
                classifier_activation=None,  # logits: a softmax would saturate
            )
        except ValueError as error:  # "should be no smaller than 75"
            problem = error
            continue
        return _randomize(model), size
    raise problem


def _params():
    return [
        name
        if name in FAST
        else pytest.param(name, marks=[pytest.mark.slow, pytest.mark.sweep])
        for name in application_names()
    ]


def _removed_fraction(selection):
    removable = sum(len(group.atoms) for group in selection.graph.groups)
    return 1.0 - np.sum(selection.kept) / removable


def test_the_sweep_enumerates_every_application():
    names = application_names()
    assert len(names) >= 40
    assert {"ConvNeXtTiny", "EfficientNetB0", "MobileNetV3Small", "ResNet50"} <= set(
        names
    )
    assert set(FAST) <= set(names) and set(REFUSED) <= set(names)


@pytest.mark.parametrize("name", _params())
def test_application_prunes_to_half_one_shot_and_in_fit(name):
    keras.backend.clear_session(free_memory=False)
    model, size = _build(name)
    x = np.random.default_rng(0).normal(size=(2, size, size, 3)).astype("float32")
    graph = pruning.DependencyGraph(model)
    if name in REFUSED:
        assert not graph.groups
        assert REFUSED[name] in graph.explain()
        return
    assert graph.groups, graph.explain()

    selection = pruning.select_units(model, 0.5)
    assert 0.4 <= _removed_fraction(selection) <= 0.6
    small = pruning.shrink(model, selection)
    models.assert_same_outputs(model, small, selection, x)
    assert small.count_params() < model.count_params()

    pruned = pruning.prune_units(
        model, pruning.PolynomialDecay(0.0, 0.5, begin_step=0, end_step=2, frequency=1)
    )
    # Random weights make huge logits: a loss whose gradients do not overflow.
    # Eager: tracing a hundred-layer step costs more than its two steps; the
    # compiled and XLA steps are covered on smaller graphs.
    pruned.compile(optimizer="sgd", loss="cosine_similarity", run_eagerly=True)
    y = np.random.default_rng(1).normal(size=(2, 10)).astype("float32")
    pruned.fit(x, y, batch_size=1, epochs=1, verbose=0)
    selection = pruning.unit_selection(pruned)
    assert 0.4 <= _removed_fraction(selection) <= 0.6
    models.assert_same_outputs(pruned, pruning.shrink(pruned), selection, x)


def test_the_layers_applications_define_for_themselves_are_coupled():
    classes = internals.application_layer_classes()
    assert set(classes) == {"CustomScaleLayer", "LayerScale"}
    x = keras.Input((5, 5, 3))
    a = keras.layers.Conv2D(8, 1, name="a")(x)
    b = keras.layers.Conv2D(8, 1, name="b")(x)
    h = classes["CustomScaleLayer"](0.2, name="residual")([a, b])
    h = classes["LayerScale"](1e-2, 8, name="scale")(h)
    model = models.functional(x, keras.layers.Dense(2, name="head")(h))
    graph = pruning.DependencyGraph(model)
    assert {g.layers for g in graph.groups} == {("a", "b")}
    coupling_checks.check_graph(graph)
    selection = pruning.select_units(model, 0.5)
    small = pruning.shrink(model, selection)
    assert small.get_layer("scale").projection_dim == 4
    models.assert_same_outputs(model, small, selection, models._x((2, 5, 5, 3)))
