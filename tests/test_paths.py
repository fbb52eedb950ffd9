"""Unit tests of `maskfit.paths` and `maskfit.checks`."""

import keras
import numpy as np
import pytest

from maskfit import checks, paths


def test_variable_keys_follow_layer_names_not_name_scopes():
    inner_inputs = keras.Input((2,))
    inner = keras.Model(
        inner_inputs, keras.layers.Dense(2, name="dense")(inner_inputs), name="encoder"
    )
    inputs = keras.Input((2,))
    model = keras.Model(inputs, keras.layers.Dense(1, name="dense_out")(inner(inputs)))
    keys = paths.variable_keys(model, model.trainable_variables)
    assert keys == [
        "encoder/dense/kernel",
        "encoder/dense/bias",
        "dense_out/kernel",
        "dense_out/bias",
    ]


def test_variables_that_would_share_a_key_are_numbered():
    class Twice(keras.layers.Layer):
        def build(self, shape):
            self.a = self.add_weight(shape=(1,), name="w")
            self.b = self.add_weight(shape=(1,), name="w")

        def call(self, x):
            return x * self.a * self.b

    inputs = keras.Input((1,))
    layer = Twice(name="twice")
    model = keras.Model(inputs, layer(inputs))
    assert paths.variable_keys(model, [layer.a, layer.b]) == ["twice/w", "twice/w#2"]


def test_layer_at_suggests_the_closest_path():
    inputs = keras.Input((2,))
    model = keras.Model(inputs, keras.layers.Dense(1, name="body")(inputs))
    with pytest.raises(ValueError, match="'bdy'.*Did you mean 'body'"):
        paths.layer_at(model, paths.layer_paths(model), "bdy", "gradient masks")


def test_is_integer_and_is_real():
    assert checks.is_integer(np.int64(3)) and not checks.is_integer(True)
    assert checks.is_real(2.5) and checks.is_real(3) and not checks.is_real(False)


def test_find_variable_wants_exactly_one_match():
    layer = keras.layers.MultiHeadAttention(2, 2)
    layer(np.zeros((1, 3, 4), "float32"), np.zeros((1, 3, 4), "float32"))
    found = checks.find_variable(
        layer, "query/kernel", layer.trainable_weights, "ElementMask"
    )
    assert found is layer.query_dense.kernel
    with pytest.raises(ValueError, match="matches several"):
        checks.find_variable(layer, "kernel", layer.trainable_weights, "ElementMask")
    with pytest.raises(ValueError, match="is not among the variables"):
        checks.find_variable(layer, "gamma", layer.trainable_weights, "ElementMask")
