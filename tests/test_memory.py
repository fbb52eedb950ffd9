"""Tests of maskfit.mask_memory: the bytes of masks per device (one device here).

The layouts over 8 devices: tests/backend/test_model_parallel.py.
"""

import keras
import numpy as np
import pytest

import maskfit

pytestmark = pytest.mark.backends("tensorflow", "jax")


def test_mask_memory_reports_each_masks_bytes_beside_its_variables():
    keep = (np.arange(12).reshape(3, 4) % 3 != 0).astype("float32")
    multipliers = np.full((3, 4), 0.5, "float32")
    inputs = keras.Input((3,))
    hidden = maskfit.set_mask(
        keras.layers.Dense(4, name="hidden"), maskfit.ElementMask({"kernel": keep})
    )
    head = maskfit.set_mask(
        keras.layers.Dense(3, name="head"),
        maskfit.PiecewiseMask(
            [2], [maskfit.ElementMask({"kernel": m.T}) for m in (keep, multipliers)]
        ),
    )
    plain = keras.layers.Dense(2, name="plain")
    model = maskfit.MaskedModel(inputs, plain(head(hidden(inputs))))
    model.compile(optimizer="sgd", loss="mse")
    if keras.backend.backend() == "tensorflow":  # the state is made by the step
        assert maskfit.mask_memory(model, print_fn=None).rows == ()
    model.fit(np.ones((4, 3)), np.ones((4, 2)), batch_size=2, verbose=0)
    lines = []
    memory = maskfit.mask_memory(model, print_fn=lines.append)

    assert [row.path for row in memory.rows] == ["hidden/kernel", "head/kernel"]
    (device,) = memory.variables
    hidden_row, head_row = memory.rows
    assert hidden_row.masks == {device: 12}  # 0s and 1s kept as booleans
    assert hidden_row.variable == {device: 48}
    # Two float32 intervals and one boundary; TensorFlow keeps the mask in
    # force beside its table (and the boundary as int64).
    tables = 2 * 12 * 4
    expected = tables + 4 if keras.backend.backend() == "jax" else 12 * 4 + tables + 8
    assert head_row.masks == {device: expected}
    assert memory.masks == {device: 12 + expected}
    assert memory.variables == {device: 96}
    assert memory.ratio == (12 + expected) / 96
    assert lines[0] == 'Mask memory per device: "masked_model"'
    assert lines[1].startswith(f" {device}: masks {12 + expected:,} bytes")
