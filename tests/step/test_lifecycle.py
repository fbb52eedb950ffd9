"""Unit tests of `maskfit.step.lifecycle`: the phases of a masked model's step."""

import keras
import numpy as np

import maskfit
from maskfit import model as model_lib
from maskfit import pruning
from maskfit.step import lifecycle


def _model(rule=False, schedule=False):
    inputs = keras.Input((3,))
    body = keras.layers.Dense(4, name="body")
    head = keras.layers.Dense(2, name="head")
    model = maskfit.MaskedModel(inputs, head(body(inputs)))
    spec = maskfit.OutputMask([1, 0])
    if schedule:
        spec = maskfit.PiecewiseMask([3], [maskfit.OutputMask([0, 0]), spec])
    maskfit.set_mask(head, spec)
    if rule:
        pruning.prune_low_magnitude(
            [body], pruning.ConstantSparsity(0.5, 0, frequency=2)
        )
    model.compile(optimizer=keras.optimizers.Adam(0.1), loss="mse")
    return model


def _data(n=8):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 3)).astype("float32"), rng.normal(size=(n, 2)).astype(
        "float32"
    )


def test_a_model_without_rules_is_ready_after_make():
    model = _model()
    model.make_train_function()
    state = model._maskfit_lifecycle()
    assert state.phase == lifecycle.READY
    assert model_lib.masker_of(model) is state.masker


def test_a_new_trace_with_rules_settles_before_its_first_call():
    model = _model(rule=True)
    model.make_train_function()
    state = model._maskfit_lifecycle()
    assert state.phase == lifecycle.SETTLE
    x, y = _data()
    model.train_on_batch(x[:4], y[:4])
    assert state.phase == lifecycle.READY


def test_the_train_function_is_one_wrapper_that_a_callback_may_wrap():
    model = _model(schedule=True)
    x, y = _data()
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    calls = []

    class Wrap(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            inner = self.model.train_function

            def wrapped(iterator):
                calls.append(1)
                return inner(iterator)

            self.model.train_function = wrapped

    # Step 3 is a boundary of the schedule (the head learns again): a retrace.
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[Wrap()])
    assert len(calls) == 4
    assert int(model.optimizer.iterations.numpy()) == 6


def test_loading_weights_marks_the_step_stale_and_the_next_call_plans_it():
    model = _model()
    x, y = _data()
    model.fit(x, y, batch_size=4, verbose=0)
    state = model._maskfit_lifecycle()
    state.mark_stale()
    assert state.phase == lifecycle.STALE
    model.train_on_batch(x[:4], y[:4])
    assert state.phase == lifecycle.READY


def test_a_subclassed_model_is_planned_inside_its_first_trace():
    class Net(maskfit.MaskedModel):
        def __init__(self):
            super().__init__()
            self.head = maskfit.set_mask(
                keras.layers.Dense(2), maskfit.OutputMask([1, 0])
            )

        def call(self, x):
            return self.head(x)

    model = Net()
    model.compile(optimizer="adam", loss="mse")
    state = model._maskfit_lifecycle()
    x, y = _data()
    model.fit(x, y, batch_size=4, verbose=0)
    assert state.masker is not None and state.phase == lifecycle.READY
