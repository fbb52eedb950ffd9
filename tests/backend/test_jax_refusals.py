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
        ("strategies", lambda: maskfit.distribute.make_strategy("default")),
    ],
)
def test_a_tensorflow_only_feature_is_refused_at_the_call(feature, call):
    _refused(feature, call)


def test_rules_of_your_own_and_sparse_training_are_not_refused():
    # They run on the host at their update steps (maskfit.backend.jax_rules).
    from maskfit.pruning.rule import MagnitudePruning

    class Mine(MagnitudePruning):
        pass

    layer = keras.layers.Dense(2, name="own")
    rules.set_rule(layer, _OwnRule())
    rules.set_rule(layer, Mine(pruning.ConstantSparsity(0.5, 0)))
    rules.set_rule(_model(), maskfit.sparse.SET(0.5, t_end=10))
    maskfit.sparse.sparsify(_model(), "rigl", sparsity=0.5, t_end=10)
    pruning.prune_units(_model(), importance="l1")


def test_a_taylor_unit_rule_is_not_refused():
    # Its sums travel through the compiled step (maskfit.backend.jax_taylor).
    model = _model()
    rule = pruning.UnitPruning(pruning.ConstantSparsity(0.5, 0), importance="taylor")
    rules.set_rule(model, rule)
    assert rules.get_rule(model) is rule
    pruning.prune_units(_model(), importance="taylor")


class _Observing(_OwnRule):
    observes_gradients = True


def test_a_rule_that_observes_every_steps_gradients_is_refused_when_fit_starts():
    inputs = keras.Input((4,))
    head = keras.layers.Dense(2, name="head")
    model = maskfit.MaskedModel(inputs, head(inputs))
    rules.set_rule(head, _Observing())
    model.compile(optimizer="sgd", loss="mse")
    x = np.ones((4, 4), "float32")
    before = [np.array(v) for v in model.get_weights()]
    with pytest.raises(
        NotImplementedError, match="'head' carries the rule .*observes the gradients"
    ):
        model.fit(x, np.zeros((4, 2), "float32"), verbose=0)
    for value, after in zip(before, model.get_weights()):
        np.testing.assert_array_equal(value, after)


def test_what_runs_on_jax_is_not_refused():
    scale = maskfit.layers.Scale(shape=(), initializer=keras.initializers.Constant(2.0))
    np.testing.assert_array_equal(
        np.asarray(scale(np.ones((2, 3), "float32"))), np.full((2, 3), 2.0)
    )
    maskfit.distribute.set_precision("float32")
