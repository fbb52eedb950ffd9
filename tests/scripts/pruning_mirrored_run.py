"""Pruning under MirroredStrategy on 2 logical CPUs: python pruning_mirrored_run.py POLICY...

TensorFlow fixes its devices when it starts, so test_pruning_training.py runs
this in a subprocess. It asserts, on every replica, that pruned entries are
exactly 0 and follow the schedule (2:4 sparsity, applied before the first
call, on the body), that entries a mask freezes hold, and that a second fit,
traced without the finished rules, keeps all that; it prints "ok POLICY"
after each dtype policy.
"""

import os
import sys

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
from maskfit import pruning  # noqa: E402
from maskfit.optim import traits  # noqa: E402


def replicas(variable):
    """The value of `variable` on each replica."""
    value = variable.value
    return [np.asarray(v) for v in getattr(value, "values", [value])]


def main(policy):
    keras.config.set_dtype_policy(policy)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        inputs = keras.Input((8,))
        body = keras.layers.Dense(8, activation="tanh")
        head = keras.layers.Dense(3)
        model = maskfit.MaskedModel(inputs, head(body(inputs)))
        maskfit.set_mask(head, maskfit.OutputMask([1, 0, 1]))
        pruning.prune_low_magnitude(
            model,
            pruning_schedule=pruning.PolynomialDecay(0.0, 0.75, 0, 6, frequency=2),
        )
        pruning.prune_low_magnitude(body, sparsity_m_by_n=(2, 4))
        model.compile(
            optimizer=keras.optimizers.SGD(0.1, momentum=0.9, weight_decay=0.1),
            loss="mse",
        )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 8)).astype("float32")
    y = rng.normal(size=(32, 3)).astype("float32")
    frozen = head.kernel.numpy()[:, 1]
    for fit in range(2):
        # 8 steps: 0.75 from step 6; the second fit runs without the rules.
        model.fit(x, y, batch_size=4, verbose=0)
        keeps = model_lib.keep_masks(model)
        variables = model_lib.all_trainable_variables(model)
        pruned = {}
        for index, keep in keeps.items():
            for value in replicas(variables[index]):
                np.testing.assert_array_equal(value[~keep], 0.0)
                assert np.count_nonzero(value) == np.count_nonzero(keep)
            # Momentum (and the loss scaler's nothing): 0 where pruned.
            state = traits.state_of(model.optimizer, variables[index])
            assert state, variables[index].path
            for value in (v for slot in state for v in replicas(slot)):
                np.testing.assert_array_equal(value[~keep], 0.0)
            pruned[variables[index].path] = int(np.count_nonzero(~keep))
        # Body: 64 entries, 2 of each 4 pruned. Head: 24, of which output
        # 1's 8 are frozen by the mask and kept, so 16 pruned (the schedule
        # asks for 18).
        assert sorted(pruned.values()) == [16, 32], (fit, pruned)
        groups = body.kernel.numpy().T.reshape(8, 2, 4)
        assert np.all(np.count_nonzero(groups, axis=-1) == 2)
        for value in replicas(head.kernel):
            np.testing.assert_array_equal(value[:, 1], frozen)
    print("ok", policy)


if __name__ == "__main__":
    for each in sys.argv[1:]:
        main(each)
