"""MaskedModel is a drop-in for keras.Model in the forms users write (issue 11).

Keras's own test files, run against MaskedModel, are in tests/keras_suite/run.py;
each pattern that once failed there has its own test here.
"""

import copy
import pickle
import warnings

import keras
import numpy as np
import pytest

import maskfit

X = np.random.default_rng(0).normal(size=(32, 3)).astype("float32")
Y = np.random.default_rng(1).normal(size=(32, 2)).astype("float32")


class Net(maskfit.MaskedModel):
    """The issue's model: layers made in __init__, built by the first fit."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(16, activation="relu")
        self.head = maskfit.set_mask(keras.layers.Dense(2), maskfit.OutputMask([1, 0]))

    def call(self, x):
        return self.head(self.hidden(x))


def assert_output_1_frozen_and_output_0_learning(head, kernel, bias):
    np.testing.assert_array_equal(head.kernel.numpy()[:, 1], kernel[:, 1])
    np.testing.assert_array_equal(head.bias.numpy()[1], bias[1])
    assert np.all(head.kernel.numpy()[:, 0] != kernel[:, 0])


@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_unbuilt_subclass_is_planned_when_fit_builds_it(mode, steps_per_execution):
    model = Net()
    model.compile(
        optimizer=keras.optimizers.AdamW(0.05, weight_decay=0.5),
        loss="mse",
        steps_per_execution=steps_per_execution,
        **mode,
    )
    assert not model.built
    # The first fit builds the model inside its first step; train the frozen
    # output's entries a few steps later, after Adam history and decay built up.
    model.fit(X, Y, batch_size=8, epochs=1, verbose=0)
    kernel, bias = model.head.kernel.numpy(), model.head.bias.numpy()
    model.fit(X, Y, batch_size=8, epochs=2, verbose=0)
    assert_output_1_frozen_and_output_0_learning(model.head, kernel, bias)


def test_unbuilt_subclass_trains_on_batch_with_its_masks(mode):
    model = Net()
    model.compile(
        optimizer=keras.optimizers.AdamW(0.05, weight_decay=0.5), loss="mse", **mode
    )
    model.train_on_batch(X[:8], Y[:8])
    kernel, bias = model.head.kernel.numpy(), model.head.bias.numpy()
    for _ in range(3):
        model.train_on_batch(X[:8], Y[:8])
    assert_output_1_frozen_and_output_0_learning(model.head, kernel, bias)


class Outer(maskfit.MaskedModel):
    """A subclassed model around an unbuilt subclassed keras.Model."""

    def __init__(self):
        super().__init__()
        self.inner = InnerBlock()
        self.head = keras.layers.Dense(2)

    def call(self, x):
        return self.head(self.inner(x))


class InnerBlock(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = maskfit.set_mask(
            keras.layers.Dense(4), maskfit.OutputMask([0, 1, 1, 0])
        )

    def call(self, x):
        return self.dense(x)


def test_masks_nested_in_an_unbuilt_inner_model_hold(mode):
    model = Outer()
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse", **mode)
    model.fit(X, Y, batch_size=8, verbose=0)
    kernel = model.inner.dense.kernel.numpy()
    model.fit(X, Y, batch_size=8, epochs=2, verbose=0)
    after = model.inner.dense.kernel.numpy()
    np.testing.assert_array_equal(after[:, [0, 3]], kernel[:, [0, 3]])
    assert np.all(after[:, [1, 2]] != kernel[:, [1, 2]])


class FunctionalInside(maskfit.MaskedModel):
    """A subclass that builds a functional graph and passes it up."""

    def __init__(self, frozen_unit=1, **kwargs):
        inputs = keras.Input((3,))
        values = [0.0 if i == frozen_unit else 1.0 for i in range(2)]
        head = maskfit.set_mask(
            keras.layers.Dense(2, name="head"), maskfit.OutputMask(values)
        )
        super().__init__(inputs=inputs, outputs=head(inputs), **kwargs)


def test_a_subclass_passing_inputs_and_outputs_up_changes_no_class(mode):
    bases = (maskfit.MaskedModel.__bases__, Net.__bases__, FunctionalInside.__bases__)
    model = FunctionalInside()
    assert (
        maskfit.MaskedModel.__bases__,
        Net.__bases__,
        FunctionalInside.__bases__,
    ) == bases
    assert isinstance(model, FunctionalInside)
    assert isinstance(model, maskfit.MaskedModel)
    # A plain subclass still works afterwards in the same process.
    plain = Net()
    plain.compile(optimizer="adam", loss="mse", **mode)
    plain.fit(X, Y, verbose=0)
    # And the functional subclass trains with its mask.
    model.compile(optimizer=keras.optimizers.AdamW(0.05), loss="mse", **mode)
    head = model.get_layer("head")
    kernel, bias = head.kernel.numpy(), head.bias.numpy()
    model.fit(X, Y, batch_size=8, epochs=2, verbose=0)
    assert_output_1_frozen_and_output_0_learning(head, kernel, bias)


def functional_model(loss="mse"):
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(4, name="hidden")(inputs)
    head = maskfit.set_mask(
        keras.layers.Dense(2, name="head"), maskfit.OutputMask([1, 0])
    )
    model = maskfit.MaskedModel(inputs, head(hidden))
    model.compile(optimizer=keras.optimizers.AdamW(0.05), loss=loss)
    model.fit(X, Y, batch_size=8, verbose=0)
    return model


@pytest.mark.parametrize(
    "clone", [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))]
)
def test_pickle_and_deepcopy_keep_class_weights_masks_and_training(clone):
    model = functional_model()
    copied = clone(model)
    assert type(copied) is type(model)
    assert isinstance(copied, maskfit.MaskedModel)
    for a, b in zip(model.weights, copied.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    head = copied.get_layer("head")
    assert maskfit.get_mask(head) == maskfit.OutputMask([1, 0])
    kernel, bias = head.kernel.numpy(), head.bias.numpy()
    copied.fit(X, Y, batch_size=8, epochs=2, verbose=0)
    assert_output_1_frozen_and_output_0_learning(head, kernel, bias)


class LegacyLoss(maskfit.MaskedModel):
    """Overrides compute_loss without the `training` argument (Keras < 3.3 style)."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):
        self.calls = getattr(self, "calls", 0) + 1
        return keras.ops.mean(keras.ops.abs(y_pred - y)) * 0.0 + 7.0


def test_compute_loss_override_without_training_argument(mode):
    inputs = keras.Input((3,))
    model = LegacyLoss(inputs, keras.layers.Dense(2)(inputs))
    model.compile(optimizer="sgd", **mode)
    history = model.fit(X, Y, batch_size=8, verbose=0)
    assert history.history["loss"] == [pytest.approx(7.0)]


def test_legacy_h5_round_trip_without_custom_objects(tmp_path):
    # A loss object: stock Keras 3.15 cannot reload "mse" given by name from .h5.
    model = functional_model(loss=keras.losses.MeanSquaredError())
    path = str(tmp_path / "model.h5")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, maskfit.MaskedModel)
    assert maskfit.get_mask(loaded.get_layer("head")) == maskfit.OutputMask([1, 0])
    for a, b in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_warns_like_keras_when_nothing_is_trainable():
    inputs = keras.Input((3,))
    dense = keras.layers.Dense(2)
    model = maskfit.MaskedModel(inputs, dense(inputs))
    dense.trainable = False
    model.compile(optimizer="sgd", loss="mse", run_eagerly=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(X, Y, batch_size=16, verbose=0)
    assert any("does not have any trainable weights" in str(w.message) for w in caught)


def test_masked_sequential_holds_masks_and_saves_them(mode, tmp_path):
    head = maskfit.set_mask(
        keras.layers.Dense(2, name="head"), maskfit.OutputMask([1, 0])
    )
    model = maskfit.MaskedSequential([keras.layers.Dense(4), head])
    model.compile(
        optimizer=keras.optimizers.AdamW(0.05, weight_decay=0.5), loss="mse", **mode
    )
    model.fit(X, Y, batch_size=8, verbose=0)  # built lazily, like Sequential
    kernel, bias = head.kernel.numpy(), head.bias.numpy()
    model.fit(X, Y, batch_size=8, epochs=2, verbose=0)
    assert_output_1_frozen_and_output_0_learning(head, kernel, bias)
    model.save(tmp_path / "seq.keras")
    loaded = keras.saving.load_model(tmp_path / "seq.keras")
    assert isinstance(loaded, maskfit.MaskedSequential)
    assert maskfit.get_mask(loaded.get_layer("head")) == maskfit.OutputMask([1, 0])
