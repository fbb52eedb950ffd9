"""Grouped convolutions (`groups > 1`) in structured pruning.

With one input channel per group (ConvNeXt's depthwise Conv2D, groups ==
channels), a channel and its group's filters go together and `groups`
shrinks; otherwise filters and input channels go in equal numbers from
every group, at the same positions, and `groups` stays. The couplings agree
with the layers' gradients, `shrink` computes what the masked model
computes, and `ignored_layers` keeps a grouped layer's units.
"""

import keras
import numpy as np
import pytest

import maskfit
from tests.helpers import coupling_checks
from tests.helpers import structured_models as models

pruning = maskfit.pruning
L = keras.layers


def _grouped_2d():
    x = keras.Input((7, 7, 3))
    h = L.Conv2D(8, 1, name="stem")(x)
    h = L.Conv2D(8, 3, groups=2, padding="same", name="grouped")(h)
    d = L.Conv2D(8, 3, groups=8, padding="same", name="depthwise")(h)
    m = L.Conv2D(16, 3, groups=8, name="multiplier")(d)
    h = L.Conv2D(6, 1, name="project")(L.BatchNormalization(name="bn")(m))
    return models.functional(x, L.Dense(2, name="head")(L.Flatten()(h))), (
        models._x((2, 7, 7, 3))
    )


def _grouped_1d_3d():
    x1 = keras.Input((9, 2))
    a = L.Conv1D(6, 1, name="stem1")(x1)
    a = L.Conv1D(9, 3, groups=3, name="grouped1")(a)
    x3 = keras.Input((4, 4, 4, 2))
    b = L.Conv3D(4, 1, name="stem3")(x3)
    b = L.Conv3D(4, 2, groups=2, name="grouped3")(b)
    out = L.Concatenate()([L.Flatten()(a), L.Flatten()(b)])
    return models.functional([x1, x3], L.Dense(2, name="head")(out)), [
        models._x((2, 9, 2)),
        models._x((2, 4, 4, 4, 2)),
    ]


def _from_input():
    x = keras.Input((6, 6, 4))
    h = L.Conv2D(8, 3, groups=4, name="grouped_in")(x)
    return models.functional(x, L.Dense(2, name="head")(L.Flatten()(h))), (
        models._x((2, 6, 6, 4))
    )


GROUPED = {"2d": _grouped_2d, "1d_3d": _grouped_1d_3d, "from_input": _from_input}


@pytest.mark.parametrize("name", list(GROUPED))
def test_grouped_convolutions_couple_by_group_and_shrink_computes_the_same(name):
    model, x = GROUPED[name]()
    selection, small = coupling_checks.checked_half_shrink(model)
    expected = models.masked_outputs(model, selection, x)
    got = models.run(small, x)
    scale = float(np.max(np.abs(expected)))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * scale)
    for layer in model.layers:
        if getattr(layer, "groups", 1) > 1:
            shrunk = small.get_layer(layer.name)
            assert shrunk.filters % shrunk.groups == 0
            assert shrunk.filters < layer.filters, layer.name


def test_one_channel_per_group_shrinks_the_groups_and_more_keeps_them():
    model, _ = _grouped_2d()
    small = pruning.shrink(model, pruning.select_units(model, 0.5))
    assert small.get_layer("grouped").groups == 2
    assert small.get_layer("depthwise").groups == small.get_layer("depthwise").filters
    assert small.get_layer("depthwise").groups < 8
    assert (
        small.get_layer("multiplier").filters
        == 2 * small.get_layer("multiplier").groups
    )
    assert "equal numbers from every group" in pruning.DependencyGraph(model).explain(
        "grouped"
    )


@pytest.mark.parametrize("layer", ["grouped", "depthwise", "multiplier"])
def test_ignored_grouped_layers_keep_their_units(layer):
    model, x = _grouped_2d()
    selection = pruning.select_units(model, 0.5, ignored_layers=[layer])
    small = pruning.shrink(model, selection)
    assert small.get_layer(layer).filters == model.get_layer(layer).filters
    expected = models.masked_outputs(model, selection, x)
    scale = float(np.max(np.abs(expected)))
    np.testing.assert_allclose(
        models.run(small, x), expected, rtol=1e-5, atol=1e-5 * scale
    )
