"""SET and RigL under MirroredStrategy on 2 logical CPUs: python sparse_mirrored_run.py

TensorFlow fixes its devices when it starts, so test_sparse_training.py runs
this in a subprocess. SET on the first layer, RigL on the model (the other
two); after every step it asserts that every replica holds the same weights,
keep masks and optimizer state, bit for bit, that dropped weights are exactly
0 there, that every layer keeps its count, and that both rules moved entries.
Prints "ok" at the end.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

_CPU = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _CPU, [tf.config.LogicalDeviceConfiguration()] * 2
)

import keras  # noqa: E402
import numpy as np  # noqa: E402

import maskfit  # noqa: E402
from maskfit import model as model_lib  # noqa: E402
from maskfit import sparse  # noqa: E402
from maskfit.optim import traits  # noqa: E402


def replicas(variable):
    """The value of `variable` on each replica."""
    value = variable.value if isinstance(variable, keras.Variable) else variable
    return [np.asarray(v) for v in getattr(value, "values", [value])]


class Check(keras.callbacks.Callback):
    def __init__(self, kernels):
        super().__init__()
        self.kernels = kernels
        self.counts = None
        self.first = None
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        masker = model_lib.masker_of(self.model)
        variables = masker.variables
        keeps = masker.keep_masks()
        counts = []
        for kernel in self.kernels:
            index = next(i for i, v in enumerate(variables) if v is kernel)
            keep, *others = replicas(keeps[index])
            for other in others:
                np.testing.assert_array_equal(other, keep)
            values = replicas(kernel)
            for value in values:
                np.testing.assert_array_equal(value, values[0])
                np.testing.assert_array_equal(value[~keep], 0.0)
            for slot in traits.state_of(self.model.optimizer, kernel):
                slots = replicas(slot)
                for value in slots:
                    np.testing.assert_array_equal(value, slots[0])
            counts.append(int(keep.sum()))
        if self.first is None:
            self.first = [replicas(keeps[i])[0] for i in sorted(keeps)]
        self.last = [replicas(keeps[i])[0] for i in sorted(keeps)]
        assert self.counts in (None, counts), (self.counts, counts)
        self.counts = counts


def main():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        inputs = keras.Input((12,))
        layers = [
            keras.layers.Dense(16, activation="tanh", name="first"),
            keras.layers.Dense(16, activation="tanh", name="body"),
            keras.layers.Dense(4, name="head"),
        ]
        outputs = inputs
        for layer in layers:
            outputs = layer(outputs)
        model = maskfit.MaskedModel(inputs, outputs)
        sparse.sparsify(layers[0], "set", 0.8, t_end=100, delta_t=3, seed=1)
        sparse.sparsify(model, "rigl", 0.8, t_end=100, delta_t=3)
        model.compile(
            optimizer=keras.optimizers.AdamW(0.05, weight_decay=0.1), loss="mse"
        )
    rng = np.random.default_rng(0)
    # Coarse values, so that weights and gradients tie: ties must break alike.
    x = np.round(rng.normal(size=(64, 12))).astype("float32")
    y = np.round(rng.normal(size=(64, 4))).astype("float32")
    check = Check([layer.kernel for layer in layers])
    model.fit(x, y, batch_size=8, shuffle=False, verbose=0, callbacks=[check])
    assert check.steps == 8
    for first, last in zip(check.first, check.last):
        assert not np.array_equal(first, last)  # every layer's mask moved
    print("ok")


if __name__ == "__main__":
    main()
