"""Unit tests of `maskfit.step.pipeline`: the stage's one order, its view and mode."""

import keras
import numpy as np
import pytest

import maskfit
from maskfit.spec import declare
from maskfit.step import mask_state, pipeline
from maskfit.step import masker as masker_lib


class Recorder:
    """A masker that records which of the stage's parts run, in order."""

    def __init__(self):
        self.calls = []

    def observe(self, view, gradients):
        self.calls.append("observe")

    def mask_gradients(self, gradients, view):
        self.calls.append("mask")
        return [2 * g for g in gradients]

    def apply(self, view, gradients):
        self.calls.append(("apply", list(gradients)))

    def after_update(self, view, gradients):
        self.calls.append(("after_update", list(gradients)))


def _view(compiled, custom_masking=False):
    mode = pipeline.UpdateMode(compiled, custom_masking)
    return pipeline.StepView(0, None, mode, ("a",), frozenset(), {})


def test_the_stage_runs_its_parts_in_order_and_rules_see_the_raw_gradients():
    recorder = Recorder()
    pipeline.run(recorder, _view(pipeline.PLAIN), [1])
    assert recorder.calls == ["observe", "mask", ("apply", [2]), ("after_update", [1])]


def test_a_custom_masking_replaces_the_masker_s_own():
    recorder = Recorder()
    pipeline.run(recorder, _view(pipeline.PLAIN, True), [1], mask=lambda g: [5])
    assert recorder.calls == ["observe", ("apply", [5]), ("after_update", [1])]


def test_the_fused_update_masks_the_gradients_itself():
    recorder = Recorder()
    pipeline.run(recorder, _view(pipeline.FUSED), [1], mask=lambda g: [5])
    assert recorder.calls == ["observe", ("apply", [1]), ("after_update", [1])]
    assert not _view(pipeline.FUSED, True).mode.masks_in_update


def _masker():
    inputs = keras.Input((2,))
    body = keras.layers.Dense(3, name="body")
    model = keras.Model(inputs, keras.layers.Dense(2)(body(inputs)))
    maskfit.set_mask(body, maskfit.OutputMask([1, 0, 1]))
    masker = masker_lib.GradientMasker(
        model.trainable_variables, lambda: declare.masked_layers(model)
    )
    masker.sync(0)
    return masker


def test_the_masker_decides_the_update_mode(monkeypatch):
    masker = _masker()
    assert masker.update_mode() == (pipeline.PLAIN, False)  # apply_gradients
    assert masker.update_mode(graph=True) == (pipeline.PLAIN, False)
    assert masker.update_mode(graph=True, xla=True).compiled == pipeline.STATIC
    assert masker.update_mode(xla=True).compiled == pipeline.PLAIN  # run eagerly
    custom = masker.update_mode(graph=True, custom_masking=True)
    assert custom.custom_masking and not custom.dynamic
    monkeypatch.setattr(masker_lib, "FUSE_MIN_ENTRIES", 0)
    assert masker.update_mode(graph=True).compiled == pipeline.FUSED
    assert masker.update_mode(graph=True, xla=True).compiled == pipeline.STATIC
    assert masker.update_mode().compiled == pipeline.PLAIN


def test_the_view_holds_each_mask_of_the_step_expanded():
    masker = _masker()
    optimizer = keras.optimizers.SGD()
    view = masker.view(0, optimizer)
    assert sorted(view.masks) == [0, 1]  # the body's kernel and bias
    kernel = view.masks[0]
    np.testing.assert_array_equal(np.shape(kernel.declared), (1, 3))
    np.testing.assert_array_equal(kernel.frozen.numpy(), [[False, True, False]])
    assert view.active(["k", "b", "k2", "b2"]) == ["k", "b", "k2", "b2"]


@pytest.mark.parametrize("run_eagerly", [True, False], ids=["eager", "graph"])
def test_a_step_expands_each_mask_once(monkeypatch, run_eagerly):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((2,))
    body = keras.layers.Dense(3, name="body")
    model = maskfit.MaskedModel(inputs, keras.layers.Dense(2)(body(inputs)))
    maskfit.set_mask(body, maskfit.OutputMask([1, 0, 1]))
    model.compile(
        optimizer=keras.optimizers.AdamW(0.1), loss="mse", run_eagerly=run_eagerly
    )
    model.train_on_batch(np.ones((4, 2)), np.ones((4, 2)))  # plans and traces
    calls = []
    expand = mask_state.VariableMasks.expand

    def counted(self, current):
        calls.append(self)
        return expand(self, current)

    monkeypatch.setattr(mask_state.VariableMasks, "expand", counted)
    model.make_train_function(force=True)  # a graph is traced anew: counted
    before = body.kernel.numpy()
    model.train_on_batch(np.ones((4, 2)), np.ones((4, 2)))
    # Once per masked variable (kernel, bias) in the step (AdamW: its
    # gradients masked, its frozen entries snapshotted and restored).
    assert len(calls) == 2
    np.testing.assert_array_equal(body.kernel.numpy()[:, 1], before[:, 1])


def test_apply_grad_masks_outside_a_step_reads_the_masks_afresh():
    inputs = keras.Input((2,))
    body = keras.layers.Dense(3, name="body")
    model = maskfit.MaskedModel(inputs, keras.layers.Dense(2)(body(inputs)))
    maskfit.set_mask(body, maskfit.OutputMask([1, 0, 1]))
    model.compile(optimizer="adam", loss="mse")  # a graph: its view is traced
    model.train_on_batch(np.ones((4, 2)), np.ones((4, 2)))
    variables = model._all_trainable_weights()
    ones = [np.ones(v.shape, np.float32) for v in variables]
    kernel = model.apply_grad_masks(ones, variables)[0].numpy()
    np.testing.assert_array_equal(kernel, [[1, 0, 1], [1, 0, 1]])
