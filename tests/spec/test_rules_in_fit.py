"""A mask rule of your own in `fit`, on both backends: written with `keras.ops`
(or TensorFlow ops), with initial keep masks, state of its own and a declared
mask beside it.

Under TensorFlow the rule is traced into the step; under JAX it is called on the
host at its update steps with NumPy arrays (`maskfit.backend.jax_rules`). Either
way: the keep masks are the rule's function of the weights at the start of the
update step, dropped entries are +0.0 after every step, entries `set_mask`
freezes stay bit for bit and are never dropped, the rule's state counts its
updates, and keep masks and state save and load with the model. Under TensorFlow
the eager and jit cases run with the slow tests (tests/step covers the modes).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import maskfit
from maskfit import model as model_lib
from maskfit.spec import rules

pytestmark = [pytest.mark.backends("tensorflow", "jax"), pytest.mark.other_modes_slow]

UPDATES = (1, 3)  # optimizer steps (before the step's update) at which it updates


@keras.saving.register_keras_serializable(package="maskfit_tests")
class AboveMean(rules.MaskRule):
    """Written with keras.ops: at `UPDATES`, keeps the active kernel entries whose
    magnitude is at least the active entries' mean; starts without the kernel's
    first input row; counts its updates in a variable of its own."""

    def __init__(self):
        self._counts = {}

    def variables(self, layer):
        return [layer.kernel]

    def should_update(self, step):
        return keras.ops.logical_or(
            keras.ops.equal(step, UPDATES[0]), keras.ops.equal(step, UPDATES[1])
        )

    def last_update_step(self):
        return UPDATES[-1]

    def initial_keep_masks(self, variables, frozen):
        mask = np.ones(tuple(variables[0].shape), bool)
        mask[0] = False
        return [mask]

    def keep_masks(self, step, variables, weights, protected, keeps, gradients=None):
        (w,), (keep,) = weights, keeps
        for count in self._counts.values():
            count.assign(count + 1.0)
        magnitude = keras.ops.abs(w) * keras.ops.cast(keep, w.dtype)
        mean = keras.ops.sum(magnitude) / keras.ops.sum(keras.ops.cast(keep, w.dtype))
        return [keras.ops.logical_and(keep, magnitude >= mean)]

    def state_variables(self, layer):
        if id(layer) not in self._counts:
            self._counts[id(layer)] = keras.Variable(0.0, trainable=False)
        return {"updates": self._counts[id(layer)]}

    def get_config(self):
        return {}


@keras.saving.register_keras_serializable(package="maskfit_tests")
class AboveMeanTF(AboveMean):
    """The same rule in TensorFlow ops (and a TensorFlow variable)."""

    def should_update(self, step):
        return tf.reduce_any(tf.equal(tf.cast(step, tf.int64), UPDATES))

    def keep_masks(self, step, variables, weights, protected, keeps, gradients=None):
        (w,), (keep,) = weights, keeps
        for count in self._counts.values():
            count.assign_add(1.0)
        w, keep = tf.convert_to_tensor(w), tf.convert_to_tensor(keep)
        magnitude = tf.abs(w) * tf.cast(keep, w.dtype)
        mean = tf.reduce_sum(magnitude) / tf.reduce_sum(tf.cast(keep, w.dtype))
        return [tf.logical_and(keep, magnitude >= mean)]

    def state_variables(self, layer):
        if id(layer) not in self._counts:
            with tf.init_scope():
                self._counts[id(layer)] = tf.Variable(0.0, trainable=False)
        return {"updates": self._counts[id(layer)]}


FROZEN = np.zeros((6, 5), bool)
FROZEN[:, 0] = True  # the first output's column: frozen by set_mask


def _model(rule_class):
    keras.utils.set_random_seed(3)
    inputs = keras.Input((6,))
    body = keras.layers.Dense(5, activation="tanh", name="body")
    model = maskfit.MaskedModel(
        inputs, keras.layers.Dense(2, name="head")(body(inputs))
    )
    maskfit.set_mask(body, maskfit.ElementMask({"kernel": ~FROZEN}))
    rule = rule_class()
    rules.set_rule(body, rule)
    rule.state_variables(body)
    return model, body


def _data():
    rng = np.random.default_rng(0)
    return (
        rng.normal(size=(24, 6)).astype("float32"),
        rng.normal(size=(24, 2)).astype("float32"),
    )


class Record(keras.callbacks.Callback):
    """The body's kernel and keep mask after every step (and before the first)."""

    def __init__(self, body):
        super().__init__()
        self.body, self.kernels, self.keeps = body, [], []

    def on_train_begin(self, logs=None):
        self.model  # noqa: B018 (syncs the JAX state)
        self.kernels.append(np.array(self.body.kernel.numpy()))

    def on_train_batch_end(self, batch, logs=None):
        keeps = model_lib.keep_masks(self.model)
        variables = model_lib.all_trainable_variables(self.model)
        position = next(i for i, v in enumerate(variables) if v is self.body.kernel)
        self.kernels.append(np.array(self.body.kernel.numpy()))
        self.keeps.append(keeps[position].copy())


def _check(record, first_step=0):
    """Every step's keep mask against the rule's function of the weights at the
    start of its step; dropped entries +0.0; frozen ones as they started."""
    start = record.kernels[0]
    initial = np.ones(FROZEN.shape, bool)
    initial[0] = False
    keep = initial | FROZEN if first_step == 0 else record.keeps[0]
    for n, (before, kernel, got) in enumerate(
        zip(record.kernels, record.kernels[1:], record.keeps)
    ):
        step = first_step + n
        if step in UPDATES:
            magnitude = np.abs(before) * keep
            new = keep & (magnitude >= magnitude.sum() / keep.sum())
            keep = new | (FROZEN & keep)
        np.testing.assert_array_equal(got, keep, err_msg=f"step {step}")
        dropped = kernel[~keep]
        np.testing.assert_array_equal(dropped, np.zeros_like(dropped))
        assert not np.signbit(dropped).any()
        np.testing.assert_array_equal(kernel[FROZEN], start[FROZEN])
    return keep


@pytest.mark.parametrize("rule_class", [AboveMean, AboveMeanTF])
def test_a_rule_of_your_own_runs_in_fit_saves_and_loads(rule_class, mode, tmp_path):
    model, body = _model(rule_class)
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse", **mode)
    x, y = _data()
    record = Record(body)
    model.fit(
        x[:16], y[:16], batch_size=4, verbose=0, shuffle=False, callbacks=[record]
    )
    keep = _check(record)
    assert (keep & ~FROZEN).sum() < (~FROZEN).sum() // 2  # two updates dropped
    count = rules.get_rule(body).state_variables(body)["updates"]
    assert float(np.asarray(count.numpy())) == len(UPDATES)

    path = str(tmp_path / "own_rule.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    body = loaded.get_layer("body")
    np.testing.assert_array_equal(model_lib.keep_masks(loaded)[0], keep)
    count = rules.get_rule(body).state_variables(body)["updates"]
    assert float(np.asarray(count.numpy())) == len(UPDATES)
    # Past its last update the loaded model trains on with the same masks.
    loaded.compile(optimizer=loaded.optimizer, loss="mse", **mode)
    record = Record(body)
    loaded.fit(
        x[16:], y[16:], batch_size=4, verbose=0, shuffle=False, callbacks=[record]
    )
    record.keeps.insert(0, keep)
    np.testing.assert_array_equal(_check(record, first_step=4), keep)
