"""Unit tests of `maskfit.step.masker.GradientMasker`: synchronizing and planning."""

import keras
import numpy as np

import maskfit
from maskfit.spec import declare
from maskfit.step import masker as masker_lib
from maskfit.step import plan as plan_lib


def _masker():
    inputs = keras.Input((2,))
    body = keras.layers.Dense(3, name="body")
    head = keras.layers.Dense(2, name="head")
    model = keras.Model(inputs, head(body(inputs)))
    variables = model.trainable_variables
    masker = masker_lib.GradientMasker(variables, lambda: declare.masked_layers(model))
    return masker, body, head


def test_new_mask_values_at_the_same_step_replan_the_step():
    masker, body, _ = _masker()
    maskfit.set_mask(body, maskfit.ElementMask({"kernel": np.ones((2, 3))}))
    assert masker.sync(0)
    assert masker.plan.guarded[0] == plan_lib.NEVER
    assert not masker.sync(0)  # nothing changed
    maskfit.set_mask(body, maskfit.ElementMask({"kernel": np.eye(2, 3)}))
    assert masker.sync(0)  # the same step: values with zeros need a restore now
    assert masker.plan.guarded[0] == plan_lib.ALWAYS


def test_a_variable_frozen_whole_is_left_out_and_counted_back_when_it_learns():
    masker, _, head = _masker()
    maskfit.set_mask(
        head,
        maskfit.PiecewiseMask(
            [4], [maskfit.OutputMask([0, 0]), maskfit.OutputMask([1, 1])]
        ),
    )
    masker.sync(0)
    assert masker.plan.left_out == {2, 3} and masker.plan.valid_until == 4
    assert masker.active(list("abcd")) == ["a", "b"]
    assert masker.spread(["a", "b"]) == ["a", "b", None, None]
    assert masker.holds_at(2, span=2) and not masker.holds_at(3, span=2)
    assert masker.learning_at(3) == [] and sorted(masker.learning_at(4)) == [2, 3]
    assert masker.sync(4)
    assert masker.plan.left_out == frozenset()


def test_state_bytes_count_masks_and_layouts():
    masker, body, head = _masker()
    maskfit.set_mask(head, maskfit.OutputMask([1, 0]))
    maskfit.set_mask(body, maskfit.ElementMask({"kernel": np.eye(2, 3)}))
    masker.sync(0)
    # head: 2 float32 values + int32 layouts (3x2 kernel index is a (1, 2) row,
    # the bias's (2,)); body: a 2x3 bool mask.
    assert masker.state_bytes() == 2 * 4 + (2 + 2) * 4 + 6
