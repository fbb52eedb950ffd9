"""A rule's own state (`MaskRule.state_variables`) is saved with the model's weights."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import maskfit
from maskfit.spec import rules


@keras.saving.register_keras_serializable(package="maskfit_tests")
class SumGradients(rules.MaskRule):
    """Sums the kernel's gradients in state of its own; keeps every entry."""

    observes_gradients = True

    def __init__(self):
        self._sums = {}  # id(layer) -> tf.Variable

    def variables(self, layer):
        return [layer.kernel]

    def should_update(self, step):
        return tf.constant(False)

    def keep_mask(self, step, weights, protected):
        return tf.ones_like(weights, tf.bool)

    def state_variables(self, layer):
        if id(layer) not in self._sums:
            with tf.init_scope():
                self._sums[id(layer)] = tf.Variable(tf.zeros(tuple(layer.kernel.shape)))
        return {"gradient sum": self._sums[id(layer)]}

    def observe_gradients(self, step, variables, gradients):
        for _layer_id, total in self._sums.items():
            total.assign_add(tf.convert_to_tensor(gradients[0]))

    def get_config(self):
        return {}


def _model(rule=True):
    keras.utils.set_random_seed(2)
    inputs = keras.Input((3,))
    body = keras.layers.Dense(4, name="body")
    model = maskfit.MaskedModel(
        inputs, keras.layers.Dense(2, name="head")(body(inputs))
    )
    if rule:
        rule = SumGradients()
        rules.set_rule(body, rule)
        rule.state_variables(body)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(8, 3)).astype("float32"), rng.normal(size=(8, 2)).astype(
        "float32"
    )


def test_rule_state_is_saved_and_loaded_with_the_model(tmp_path):
    model = _model()
    x, y = _data()
    model.fit(x, y, batch_size=4, verbose=0)
    body = model.get_layer("body")
    saved = rules.get_rule(body).state_variables(body)["gradient sum"].numpy()
    assert np.any(saved != 0)
    model.save(tmp_path / "m.keras")

    loaded = keras.saving.load_model(tmp_path / "m.keras")

    body = loaded.get_layer("body")
    state = rules.get_rule(body).state_variables(body)
    np.testing.assert_array_equal(state["gradient sum"].numpy(), saved)
    # And into a model of the same structure, by save_weights.
    model.save_weights(tmp_path / "m.weights.h5")
    other = _model()
    other.load_weights(tmp_path / "m.weights.h5")
    body = other.get_layer("body")
    np.testing.assert_array_equal(
        rules.get_rule(body).state_variables(body)["gradient sum"].numpy(), saved
    )


def test_rule_state_without_its_rule_is_one_clear_error(tmp_path):
    model = _model()
    model.save_weights(tmp_path / "m.weights.h5")
    plain = _model(rule=False)
    with pytest.raises(
        ValueError, match="state 'gradient sum' of a mask rule on layer 'body'"
    ):
        plain.load_weights(tmp_path / "m.weights.h5")
