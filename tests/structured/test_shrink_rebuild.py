"""`shrink` rebuilds each layer from a complete config, or refuses naming it.

keras_hub 0.32's `Qwen3TransformerDecoder.get_config` drops `head_dim`, which
its `__init__` requires: shrink read the config and failed with a TypeError
inside `from_config`. A field `get_config` leaves out is now read from the
layer's attribute of that name; a layer that still cannot be rebuilt gives
one ValueError naming it, the operation and the cause, and the model is left
as it was.
"""

import keras
import numpy as np
import pytest

import maskfit.pruning as pruning
from maskfit.structured.hub import shrink as hub_shrink
from tests.helpers import hub_cases, hub_zoo

keras_hub = pytest.importorskip("keras_hub", reason="needs the hub extra")


@pytest.mark.skipif(
    not hasattr(keras_hub.models, "Qwen3Backbone"), reason="keras-hub without Qwen3"
)
def test_qwen3_keeps_its_head_dim_and_shrinks():
    model, inputs = hub_zoo.build("Qwen3Backbone")
    block = model.get_layer("transformer_layer_0")
    assert "head_dim" not in block.get_config()  # keras_hub's own: dropped
    config = hub_shrink.config_of(block)
    assert config["head_dim"] == 8
    again = type(block).from_config(config)
    assert hub_shrink.config_of(again) == config
    selection = pruning.select_units(model, 0.5)
    expected = hub_cases.masked_outputs(selection, inputs)
    small = pruning.shrink(model, selection)
    hub_cases.assert_close(hub_cases.outputs(small, inputs), expected)


class Lossy(keras.layers.Dense):
    """A layer whose config leaves out an argument its __init__ requires."""

    def get_config(self):
        config = super().get_config()
        del config["units"]
        return config


def test_a_layer_that_cannot_be_rebuilt_is_refused_by_name_and_nothing_changes():
    x = keras.Input((4,))
    hidden = keras.layers.Dense(8, name="hidden")(x)
    model = keras.Model(x, Lossy(2, name="lossy")(hidden))
    before = [w.copy() for w in model.get_weights()]
    selection = pruning.select_units(model, 0.5)
    with pytest.raises(
        ValueError,
        match=r"shrink: layer 'lossy' \(Lossy\) cannot be rebuilt with fewer units:"
        r" its from_config\(\) raised TypeError: .*units.*get_config\(\)",
    ):
        pruning.shrink(model, selection)
    for old, new in zip(before, model.get_weights()):
        np.testing.assert_array_equal(old, new)
