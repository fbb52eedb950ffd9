"""Every keras_hub backbone of `tests/helpers/hub_zoo.py` (54, tiny): sizes, pruning.

`size_report`'s parameters equal `count_params()` on each, and every block's
MACs are traced but those named in `UNTRACED` (with the words their note
holds).
"""

import pytest

import maskfit.pruning as pruning
from tests.helpers import hub_zoo

keras_hub = pytest.importorskip("keras_hub", reason="needs the hub extra")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        tuple(int(p) for p in keras_hub.__version__.split(".")[:2]) < (0, 32),
        reason=f"keras-hub {keras_hub.__version__}: the zoo is written for 0.32",
    ),
]

# Calls whose trace fails at one unknown size for every unknown dimension
# (TensorFlow, keras-hub 0.32): by backbone, the layers and what the note says.
UNTRACED = {
    # Relative attention slices a position table whose length is tied to
    # the sequence's by more than one unknown size.
    "XLNetBackbone": ({"xlnet_encoder_0", "xlnet_encoder_1"}, "Expected begin"),
    # The rotary table's symbolic shape is (None,): traced at (1,), its call
    # slices a second axis it does not have.
    "MoonshineBackbone": (
        {"encoder_block_0", "encoder_block_1", "decoder_block_0", "decoder_block_1"},
        "MoonshineMultiHeadAttention",
    ),
    "VideoPrismBackbone": (
        {"temporal_embedding", "factorized_decoding"},
        "Exception encountered when calling VideoPrism",
    ),
}


@pytest.mark.parametrize("name", hub_zoo.available())
def test_size_report_counts_parameters_as_count_params_and_traces_blocks(name):
    model, _ = hub_zoo.build(name)
    report = pruning.size_report(model, model)
    assert report.params_before == model.count_params()
    assert report.params_after == model.count_params()
    assert report.macs_before > 0 or name == "XLNetBackbone"  # its blocks: below
    names, words = UNTRACED.get(name, (set(), ""))
    assert {layer for layer, _ in report.notes} == names, report.notes
    assert all(words in note for _, note in report.notes), report.notes
