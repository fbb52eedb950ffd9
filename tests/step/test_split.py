"""Under XLA a step with rules is compiled twice (`maskfit.step.split`).

A `plain` variant without the rules' updates and an `updating` one, picked per
step outside XLA: the masks must still move at exactly the steps the rules
say, inside a call of several steps too, and the plain variant must hold no
conditional (what made every step of a rule's run cost more).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import maskfit
from maskfit import model as model_lib
from maskfit.spec import rules
from maskfit.step import split

EVERY = 3  # the rule updates at the steps s with s % EVERY == EVERY - 1
STEPS_PER_CALL = 4


def pattern(step, shape):
    """Every 4th entry of a kernel, shifted by `step` (a Python int or tensor)."""
    size = int(np.prod(shape))
    flat = tf.math.floormod(tf.range(size, dtype=tf.int64) + tf.cast(step, tf.int64), 4)
    return tf.reshape(tf.equal(flat, 0), shape)


@keras.saving.register_keras_serializable(package="maskfit_tests")
class Rotate(rules.MaskRule):
    """Keeps every 4th entry of the kernel, the pattern moved at each update
    (before the forward pass or, with `uses_gradients`, after the update)."""

    def __init__(self, after_update=False):
        self.after_update = after_update
        self.uses_gradients = after_update

    def variables(self, layer):
        return [layer.kernel]

    def initial_keep_masks(self, variables, frozen):
        return [pattern(0, tuple(variables[0].shape)).numpy()]

    def should_update(self, step):
        return tf.equal(tf.math.floormod(step, EVERY), EVERY - 1)

    def keep_masks(self, step, variables, weights, protected, keeps, gradients=None):
        return [pattern(step, tuple(variables[0].shape))]

    def get_config(self):
        return {"after_update": self.after_update}


def expected_keep(steps_done, shape):
    """The keep mask after `steps_done` steps: the pattern of the last update."""
    updates = [s for s in range(steps_done) if s % EVERY == EVERY - 1]
    return pattern(updates[-1] if updates else 0, shape).numpy()


class Record(keras.callbacks.Callback):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer
        self.calls = []

    def on_train_batch_end(self, batch, logs=None):
        model = self.model
        self.calls.append(
            (
                int(model.optimizer.iterations.numpy()),
                model_lib.keep_masks(model)[0].copy(),
                self.layer.kernel.numpy(),
            )
        )


def build(after_update=False, model_class=maskfit.MaskedModel):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    body = keras.layers.Dense(8, name="body")
    model = model_class(inputs, keras.layers.Dense(2)(body(inputs)))
    rules.set_rule(body, Rotate(after_update))
    return model, body


def fit(model, body, steps=5 * STEPS_PER_CALL, **compile_args):
    model.compile(
        optimizer=keras.optimizers.AdamW(0.1, weight_decay=0.1),
        loss="mse",
        steps_per_execution=STEPS_PER_CALL,
        **compile_args,
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4 * steps, 6)).astype("float32")
    y = rng.normal(size=(4 * steps, 2)).astype("float32")
    record = Record(body)
    model.fit(x, y, batch_size=4, shuffle=False, verbose=0, callbacks=[record])
    return record, (tf.constant(x[:4]), tf.constant(y[:4]))


def lifecycle(model):
    return model._maskfit_step_lifecycle


@pytest.mark.parametrize("after_update", [False, True], ids=["before", "after"])
def test_masks_move_at_their_steps_inside_calls_of_several_steps(after_update):
    model, body = build(after_update)
    record, _ = fit(model, body, jit_compile=True)
    assert isinstance(lifecycle(model).split, split.SplitStep)
    assert model.jit_compile  # as compiled, after Keras made the function without
    shape = tuple(body.kernel.shape)
    assert [steps for steps, _, _ in record.calls] == [4, 8, 12, 16, 20]
    learned = 0
    for steps, keep, kernel in record.calls:
        # Updates at steps 2, 5, 8, ...: inside calls, never at their start.
        np.testing.assert_array_equal(keep, expected_keep(steps, shape))
        np.testing.assert_array_equal(kernel[~keep], 0.0)
        learned += np.count_nonzero(kernel[keep])
    assert learned > 0


def test_the_plain_variant_holds_no_conditional_the_updating_one_does():
    model, body = build(after_update=True)
    _, batch = fit(model, body, steps=STEPS_PER_CALL, jit_compile=True)
    step = lifecycle(model).split
    plain = step._plain.experimental_get_compiler_ir(batch)(stage="hlo")
    updating = step._updating.experimental_get_compiler_ir(batch)(stage="hlo")
    assert "conditional" not in plain
    assert "conditional" in updating


@pytest.mark.parametrize(
    "compile_args", [{}, {"run_eagerly": True}], ids=["graph", "eager"]
)
def test_only_xla_steps_are_split(compile_args):
    model, body = build()
    record, _ = fit(model, body, **compile_args)
    assert lifecycle(model).split is None
    steps, keep, _ = record.calls[-1]
    np.testing.assert_array_equal(keep, expected_keep(steps, tuple(body.kernel.shape)))


class OwnStep(maskfit.MaskedModel):
    """A user's train_step around maskfit's: its own code must run once per step."""

    def train_step(self, data):
        return super().train_step(data)


def test_a_train_step_override_and_a_model_without_rules_are_not_split():
    model, body = build(model_class=OwnStep)
    record, _ = fit(model, body, jit_compile=True)
    assert lifecycle(model).split is None
    steps, keep, kernel = record.calls[-1]
    np.testing.assert_array_equal(keep, expected_keep(steps, tuple(body.kernel.shape)))
    np.testing.assert_array_equal(kernel[~keep], 0.0)

    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    plain = maskfit.MaskedModel(inputs, keras.layers.Dense(2)(inputs))
    plain.compile(optimizer="adam", loss="mse", jit_compile=True)
    plain.fit(np.ones((4, 6)), np.ones((4, 2)), verbose=0)
    assert lifecycle(plain).split is None
