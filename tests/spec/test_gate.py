"""The `backprop=True` gate (maskfit/spec/gate.py), in `fit`, on both backends.

`tests/step/test_exactness.py` checks what the gate lets through against a
hand-made reference; here the gate's mask follows a schedule and changes after
`compile`, and what it blocks is checked bit for bit: an upstream layer that
gets no gradient under plain SGD keeps its weights exactly.
"""

import keras
import numpy as np
import pytest

import maskfit

pytestmark = [
    pytest.mark.backends("tensorflow", "jax"),
    pytest.mark.other_modes_slow,  # under TensorFlow graph mode stays fast
]

X = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
Y = np.random.default_rng(1).normal(size=(16, 2)).astype("float32")


def _build(spec, mode):
    keras.utils.set_random_seed(7)
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(4, activation="tanh", name="hidden")
    head = keras.layers.Dense(2, name="head")
    model = maskfit.MaskedModel(inputs, head(hidden(inputs)))
    maskfit.set_mask(head, spec)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", **mode)
    return model, hidden


class _Unchanged(keras.callbacks.Callback):
    """Records after each batch whether `layer`'s kernel is still `start`."""

    def __init__(self, layer):
        super().__init__()
        self.layer, self.start, self.seen = layer, layer.kernel.numpy().copy(), []

    def on_train_batch_end(self, batch, logs=None):
        self.model  # noqa: B018 - under JAX, reading it syncs the state
        self.seen.append(np.array_equal(self.layer.kernel.numpy(), self.start))


def test_the_gate_follows_its_schedule_at_the_exact_step(mode):
    blocked = maskfit.OutputMask([0, 0], backprop=True)
    schedule = maskfit.PiecewiseMask([2], [blocked, maskfit.OutputMask([1, 1], True)])
    model, hidden = _build(schedule, mode)
    watch = _Unchanged(hidden)
    model.fit(X, Y, batch_size=4, epochs=1, verbose=0, callbacks=[watch])
    # Steps 0 and 1: nothing reaches the hidden layer; from step 2 it learns.
    assert watch.seen == [True, True, False, False]


def test_a_new_gate_after_compile_reaches_the_next_step(mode):
    model, hidden = _build(maskfit.OutputMask([1, 1], backprop=True), mode)
    model.fit(X, Y, batch_size=4, epochs=1, verbose=0)
    head = model.get_layer("head")
    maskfit.set_mask(head, maskfit.OutputMask([0, 0], backprop=True))
    watch = _Unchanged(hidden)
    model.fit(X, Y, batch_size=4, epochs=1, verbose=0, callbacks=[watch])
    assert watch.seen == [True] * 4
    # Without the gate (backprop=False) the frozen units still send their
    # gradient upstream: the check above would see it.
    maskfit.set_mask(head, maskfit.OutputMask([0, 0]))
    watch = _Unchanged(hidden)
    model.fit(X, Y, batch_size=4, epochs=1, verbose=0, callbacks=[watch])
    assert watch.seen == [False] * 4
