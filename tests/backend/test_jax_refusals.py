"""Under JAX, every TensorFlow-only feature is refused where it enters, once, clearly.

Each case calls what a user calls and expects one NotImplementedError that
names the backend, the feature and what to use instead
(`maskfit.support.FEATURES`). A refused rule is also refused when a file
saved under TensorFlow brings it in (`tests/model/test_across_backends.py`).
"""

import keras
import numpy as np
import pytest

import maskfit
import maskfit.pruning as pruning
from maskfit import support
from maskfit.spec import rules

pytestmark = pytest.mark.backends("jax")


def _model():
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, name="hidden")(inputs)
    return keras.Model(inputs, keras.layers.Dense(2, name="head")(hidden))


def _refused(feature, call):
    row = support.FEATURES[feature]
    assert "jax" not in row.backends
    with pytest.raises(NotImplementedError) as caught:
        call()
    message = str(caught.value)
    assert row.name in message
    assert "'jax' (KERAS_BACKEND=jax)" in message
    assert row.instead in message
    return message


class _OwnRule(rules.MaskRule):
    def variables(self, layer):
        return [layer.kernel]

    def should_update(self, step):
        return step == 0

    def keep_mask(self, step, weights, protected):
        return weights != 0

    def get_config(self):
        return {}


@pytest.mark.parametrize(
    "feature, call",
    [
        (
            "sparse_training",
            lambda: maskfit.sparse.sparsify(_model(), "rigl", sparsity=0.5, t_end=10),
        ),
        (
            "sparse_training",
            lambda: rules.set_rule(_model(), maskfit.sparse.SET(0.5, t_end=10)),
        ),
        ("structured_rule", lambda: pruning.prune_units(_model())),
        (
            "structured_rule",
            lambda: pruning.select_units(
                _model(),
                0.5,
                importance="taylor",
                data=(np.ones((4, 4)), np.ones((4, 2))),
                loss="mse",
            ),
        ),
        (
            "custom_rules",
            lambda: rules.set_rule(keras.layers.Dense(2), _OwnRule()),
        ),
        ("strategies", lambda: maskfit.distribute.make_strategy("default")),
    ],
)
def test_a_tensorflow_only_feature_is_refused_at_the_call(feature, call):
    _refused(feature, call)


def test_refused_rule_names_the_layer():
    layer = keras.layers.Dense(2, name="own")
    message = _refused("custom_rules", lambda: rules.set_rule(layer, _OwnRule()))
    assert "a _OwnRule rule on layer 'own'" in message
    assert rules.get_rule(layer) is None


def test_a_subclass_of_magnitude_pruning_is_a_rule_of_your_own():
    from maskfit.pruning.rule import MagnitudePruning

    class Mine(MagnitudePruning):
        pass

    class Declared(MagnitudePruning):
        backend_feature = "magnitude_pruning"

    schedule = pruning.ConstantSparsity(0.5, 0)
    layer = keras.layers.Dense(2, name="mine")
    message = _refused("custom_rules", lambda: rules.set_rule(layer, Mine(schedule)))
    assert "a Mine rule on layer 'mine'" in message
    assert rules.get_rule(layer) is None
    rules.set_rule(layer, Declared(schedule))  # it says it runs on JAX
    rules.set_rule(layer, MagnitudePruning(schedule))


def test_what_runs_on_jax_is_not_refused():
    scale = maskfit.layers.Scale(shape=(), initializer=keras.initializers.Constant(2.0))
    np.testing.assert_array_equal(
        np.asarray(scale(np.ones((2, 3), "float32"))), np.full((2, 3), 2.0)
    )
    maskfit.distribute.set_precision("float32")
