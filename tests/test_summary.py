"""Tests of maskfit.summary.summary: exact counts, printing, errors."""

import keras
import numpy as np
import pytest

import maskfit
from maskfit.summary import summary

pytestmark = pytest.mark.backends("tensorflow", "jax", "torch")


def _model(hidden_mask=None, head_mask=None):
    """Input(3) -> Dense(4) -> BatchNorm -> Dense(2); 34 trainable, 8 not."""
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(4)
    head = keras.layers.Dense(2)
    if hidden_mask is not None:
        maskfit.set_mask(hidden, hidden_mask)
    if head_mask is not None:
        maskfit.set_mask(head, head_mask)
    x = keras.layers.BatchNormalization()(hidden(inputs))
    return keras.Model(inputs, head(x))


def test_counts_without_masks():
    model = _model()
    result = summary(model, print_fn=None)
    assert result.trainable_params == 34
    assert result.learnable_params == 34
    assert result.frozen_params == 0
    assert result.non_trainable_params == 8
    assert result.total_params == model.count_params()
    assert {row.mask_kind for row in result.rows} == {"none"}


def test_counts_with_output_and_element_masks():
    keep = np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0.5, 0]])
    model = _model(maskfit.ElementMask({"kernel": keep}), maskfit.OutputMask([1, 0]))
    result = summary(model, print_fn=None)
    kinds = [(r.params, r.learnable, r.mask_kind) for r in result.rows]
    assert kinds == [
        (12, 3, "element"),  # hidden kernel: 3 entries > 0 (0.5 counts).
        (4, 4, "none"),  # hidden bias
        (4, 4, "none"),  # gamma
        (4, 4, "none"),  # beta
        (8, 4, "output"),  # head kernel: one column of 4
        (2, 1, "output"),  # head bias
    ]
    assert result.trainable_params == 34
    assert result.learnable_params == 20
    assert result.frozen_params == 14
    assert result.rows[0].shape == (3, 4)
    assert [r.frozen for r in result.rows] == [9, 0, 0, 0, 4, 1]
    assert result.shared_params == 0  # a Dense has no shared entries


def test_shared_entries_of_an_output_mask_are_counted_and_learn():
    """MultiHeadAttention: only the output projection belongs to units."""
    query = keras.Input((3, 4))
    attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    model = keras.Model(query, attention(query, query))
    maskfit.set_mask(attention, maskfit.OutputMask([1, 0, 0, 1]))
    lines = []
    result = summary(model, print_fn=lines.append)
    rows = {r.path.split("/", 1)[1]: r for r in result.rows}
    for name in ("query/kernel", "key/kernel", "value/kernel", "query/bias"):
        row = rows[name]
        assert (row.learnable, row.frozen, row.shared) == (row.params, 0, row.params)
        assert row.mask_kind == "output"
    kernel = rows["attention_output/kernel"]  # (heads, key_dim, units)
    assert (kernel.params, kernel.learnable, kernel.frozen, kernel.shared) == (
        32,
        16,
        16,
        0,
    )
    assert result.shared_params == 3 * (32 + 8)
    assert result.frozen_params == 16 + 2
    assert "Frozen" in lines[2] and "Shared" in lines[2]
    assert any("Shared by several output units" in line for line in lines)


def test_output_mask_on_a_conv_counts_every_position():
    inputs = keras.Input((5, 5, 2))
    conv = maskfit.set_mask(keras.layers.Conv2D(3, 2), maskfit.OutputMask([0, 1, 1]))
    result = summary(keras.Model(inputs, conv(inputs)), print_fn=None)
    assert [(r.params, r.learnable) for r in result.rows] == [(24, 16), (3, 2)]


def test_prints_a_table_with_totals():
    lines = []
    summary(_model(head_mask=maskfit.OutputMask([1, 0])), print_fn=lines.append)
    text = "\n".join(lines)
    assert "Learnable" in lines[2] and "Mask" in lines[2]
    assert lines[2].split() == [
        "Variable",
        "(path)",
        "Shape",
        "Params",
        "Learnable",
        "Frozen",
        "Shared",
        "Mask",
    ]
    head_kernel = next(line for line in lines if "(4, 2)" in line)
    assert head_kernel.split()[-5:] == ["8", "4", "4", "0", "output"]
    assert "Trainable params: 34" in text
    assert "Learnable params (after masks): 29 (5 frozen)" in text


def test_unbuilt_model_is_rejected():
    model = keras.Sequential([keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="not built"):
        summary(model, print_fn=None)


def test_summary_reads_schedules_at_the_optimizer_step():
    inputs = keras.Input((3,))
    head = maskfit.set_mask(
        keras.layers.Dense(2),
        maskfit.PiecewiseMask(
            [2], [maskfit.OutputMask([0, 0]), maskfit.OutputMask([1, 0])]
        ),
    )
    model = maskfit.MaskedModel(inputs, head(inputs))
    assert maskfit.summary(model, print_fn=None).learnable_params == 0
    assert maskfit.summary(model, print_fn=None, step=2).learnable_params == 4
    model.compile(optimizer="sgd", loss="mse")
    model.fit(np.ones((2, 3)), np.ones((2, 2)), batch_size=1, verbose=0)
    assert maskfit.summary(model, print_fn=None).learnable_params == 4
