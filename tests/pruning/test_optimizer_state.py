"""Dropped entries stay +0.0 with or without the post-update zeroing.

For the optimizers of `maskfit.optim.traits` the step zeroes a dropped
entry's optimizer state once, when it is dropped, and nothing after each
update (outside XLA); for every other optimizer, and under XLA, it puts
dropped entries back to 0 after each update. Both must leave them exactly +0.0 after every step, with every
setting, and keep the masks TF-MOT's.
"""

import keras
import numpy as np
import pytest

from maskfit import model as model_lib
from maskfit import pruning
from maskfit.optim import traits

# Prunes in steps 1, 3, 5 and 7 (to 0.75 from step 7): the optimizer has
# history for entries dropped after step 1.
SCHEDULE = dict(initial_sparsity=0.25, final_sparsity=0.75, begin_step=1, end_step=7)

EVERY_SETTING = dict(
    clipnorm=1.0, use_ema=True, ema_momentum=0.5, ema_overwrite_frequency=4
)

# Every optimizer that keeps dropped entries at 0 by itself, each with the
# settings that carry history.
KEPT_AT_ZERO = {
    "sgd_nesterov": lambda: keras.optimizers.SGD(
        0.1, momentum=0.9, nesterov=True, weight_decay=0.1, **EVERY_SETTING
    ),
    "adam_amsgrad": lambda: keras.optimizers.Adam(
        0.05, amsgrad=True, gradient_accumulation_steps=2, **EVERY_SETTING
    ),
    "adamw": lambda: keras.optimizers.AdamW(0.05, weight_decay=0.2, **EVERY_SETTING),
    "adamax": lambda: keras.optimizers.Adamax(0.05, **EVERY_SETTING),
    "nadam": lambda: keras.optimizers.Nadam(0.05, **EVERY_SETTING),
    "rmsprop_centered": lambda: keras.optimizers.RMSprop(
        0.05, momentum=0.5, centered=True, global_clipnorm=1.0
    ),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1, **EVERY_SETTING),
    "lion": lambda: keras.optimizers.Lion(0.01, weight_decay=0.1, **EVERY_SETTING),
}


class MyAdam(keras.optimizers.Adam):
    """A subclass may change `update_step`: it is not trusted."""


# Optimizers (and a variable) the step does not trust: it zeroes after each update.
ZEROED_AFTER = {
    "adam_subclass": lambda: MyAdam(0.05, use_ema=True),
    "adafactor": lambda: keras.optimizers.Adafactor(0.05),
    "ftrl": lambda: keras.optimizers.Ftrl(0.05, l1_regularization_strength=0.01),
}


def pruned_mlp(constraint=None):
    inputs = keras.Input((5,))
    body = keras.layers.Dense(8, activation="tanh", kernel_constraint=constraint)
    head = keras.layers.Dense(4)
    model = keras.Model(inputs, head(body(inputs)))
    schedule = pruning.PolynomialDecay(frequency=2, **SCHEDULE)
    return pruning.prune_low_magnitude(model, pruning_schedule=schedule), schedule


class DroppedStayZero(keras.callbacks.Callback):
    """After every step: dropped weights +0.0, masks at the schedule's sparsity;
    with `state_zero`, their optimizer state 0 as well."""

    def __init__(self, schedule, state_zero):
        super().__init__()
        self.schedule, self.state_zero, self.checked = schedule, state_zero, 0

    def on_train_batch_begin(self, batch, logs=None):
        # This batch prunes as step `iterations + 1` (with gradient
        # accumulation, iterations count updates: two batches share a step).
        self.step = int(self.model.optimizer.iterations.numpy()) + 1

    def on_train_batch_end(self, batch, logs=None):
        step = self.step
        variables = model_lib.all_trainable_variables(self.model)
        for index, keep in model_lib.keep_masks(self.model).items():
            variable = variables[index]
            value = variable.numpy()[~keep]
            np.testing.assert_array_equal(value, 0.0)
            assert not np.signbit(value).any(), (variable.path, step)
            done = pruning.pruning_steps(self.schedule, 1, step + 1)
            kept = pruning.kept_count(keep.size, done[-1][1]) if done else keep.size
            assert np.count_nonzero(keep) == kept, (variable.path, step)
            if self.state_zero:
                for state in traits.state_of(self.model.optimizer, variable):
                    np.testing.assert_array_equal(
                        np.asarray(state.numpy())[~keep], 0.0, err_msg=state.path
                    )
            self.checked += 1


def fit_and_check(optimizer, mode, state_zero, constraint=None):
    model, schedule = pruned_mlp(constraint)
    model.compile(optimizer=optimizer, loss="mse", **mode)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 5)).astype("float32")
    y = rng.normal(size=(40, 4)).astype("float32")
    check = DroppedStayZero(schedule, state_zero)
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[check])
    assert check.checked == 10 * 2
    # fit copies the EMA averages in at its end: dropped entries stay 0.
    variables = model_lib.all_trainable_variables(model)
    for index, keep in model_lib.keep_masks(model).items():
        np.testing.assert_array_equal(variables[index].numpy()[~keep], 0.0)
    return model


@pytest.mark.parametrize("name", sorted(KEPT_AT_ZERO))
def test_state_of_dropped_entries_is_zeroed_and_they_stay_zero(name):
    optimizer = KEPT_AT_ZERO[name]()
    assert traits.keeps_dropped_entries_at_zero(optimizer, keras.Variable(1.0))
    fit_and_check(optimizer, {}, state_zero=True)


@pytest.mark.fused_too
def test_every_mode_keeps_dropped_entries_zero(mode):
    # Under XLA the dropped entries are zeroed after each update (it fuses
    # into the update) and their state is left as it is.
    jit = mode.get("jit_compile", False)
    fit_and_check(KEPT_AT_ZERO["adam_amsgrad"](), mode, state_zero=not jit)


@pytest.mark.parametrize("name", sorted(ZEROED_AFTER))
def test_untrusted_optimizers_get_dropped_entries_zeroed_after_each_update(name):
    optimizer = ZEROED_AFTER[name]()
    assert not traits.keeps_dropped_entries_at_zero(optimizer, keras.Variable(1.0))
    fit_and_check(optimizer, {}, state_zero=False)


class Shift(keras.constraints.Constraint):
    """A constraint could move a 0: this one adds to every entry."""

    def __call__(self, w):
        return w + 0.125


def test_a_constraint_gets_dropped_entries_zeroed_after_each_update():
    shift = Shift()
    layer = keras.layers.Dense(2, kernel_constraint=shift)
    layer.build((None, 3))
    assert not traits.keeps_dropped_entries_at_zero(
        keras.optimizers.Adam(), layer.kernel
    )
    fit_and_check(keras.optimizers.Adam(0.05), {}, state_zero=False, constraint=shift)


def test_mixed_precision_loss_scaling_keeps_dropped_entries_zero():
    keras.config.set_dtype_policy("mixed_float16")
    optimizer = keras.optimizers.LossScaleOptimizer(KEPT_AT_ZERO["adamw"]())
    assert traits.keeps_dropped_entries_at_zero(optimizer, keras.Variable(1.0))
    fit_and_check(optimizer, {}, state_zero=True)


@pytest.mark.parametrize(
    "optimizer",
    [
        keras.optimizers.Adam(epsilon=0.0),
        keras.optimizers.RMSprop(epsilon=0.0),
        keras.optimizers.LossScaleOptimizer(MyAdam()),
    ],
    ids=["adam_epsilon_0", "rmsprop_epsilon_0", "loss_scaled_subclass"],
)
def test_what_could_divide_by_zero_or_override_the_update_is_not_trusted(optimizer):
    assert not traits.keeps_dropped_entries_at_zero(optimizer, keras.Variable(1.0))
