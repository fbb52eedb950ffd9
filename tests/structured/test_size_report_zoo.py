"""`size_report` on every keras_hub backbone of `tests/helpers/hub_zoo.py`, layer by layer.

For each backbone pruned with `select_units(model, 0.5)` and shrunk (or, where
`shrink` is refused, the model against itself): parameters equal
`count_params()` before and after; every layer that holds a kernel counts at
least one multiply-accumulate per kernel entry (one token or pixel: each
entry multiplies something at least once) and no call is left in `notes`;
no layer's MACs grow, and a layer that lost parameters with MACs lost MACs too.
"""

import math

import pytest

import maskfit.pruning as pruning
from tests.helpers import hub_zoo
from tests.structured import test_hub_zoo
from tests.structured.test_hub_zoo import SHRINK_REFUSED

pytestmark = test_hub_zoo.pytestmark  # slow; keras-hub 0.32 or newer


def _kernel_entries(layer):
    """Entries of the kernels `layer` holds (each multiplies at least once a call)."""
    return sum(
        math.prod(v.shape)
        for v in layer.weights
        if "kernel" in v.path.split("/")[-1] and len(v.shape) >= 2
    )


@pytest.mark.parametrize("name", hub_zoo.available())
def test_size_report_counts_every_backbone_layer_by_layer(name):
    model, _ = hub_zoo.build(name)
    small = model
    if name not in SHRINK_REFUSED:
        small = pruning.shrink(model, pruning.select_units(model, 0.5))
    report = pruning.size_report(model, small)
    assert report.params_before == model.count_params()
    assert report.params_after == small.count_params()
    assert report.macs_before > 0
    assert report.notes == ()  # every call traced, at the shapes the model makes
    assert report.macs_after <= report.macs_before
    layers = {
        layer.name: layer
        for layer in model._flatten_layers(include_self=False, recursive=True)
    }
    for row in report.rows:
        kernels = _kernel_entries(layers[row.name.split("/")[-1]])
        assert row.macs_before >= kernels, (row, kernels)
        assert row.macs_after <= row.macs_before, row
        if row.params_after < row.params_before and row.macs_before:
            assert row.macs_after < row.macs_before, row
