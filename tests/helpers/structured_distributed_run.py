"""Taylor importance under MirroredStrategy, for test_pruning_units_training.py.

TensorFlow fixes its devices when it starts, so this runs in a subprocess:

    python tests/helpers/structured_distributed_run.py OUT_DIR

It prunes a model with `TaylorImportance` on two replicas (two logical
CPUs), with a learning rate of 0 so that the sums of |w * g| over the first
three batches can be computed on one device from the same weights, and
writes to `OUT_DIR/taylor.json` the initial weights, the sums before the
update, the units removed, and whether every removed entry is 0 on every
replica.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import maskfit  # noqa: E402
from maskfit import (
    distribute,  # noqa: E402
    mask_rules,  # noqa: E402
)
from maskfit import model as model_lib  # noqa: E402

L = keras.layers


def build():
    keras.utils.set_random_seed(3)
    x = keras.Input((5,))
    # No batch norm: its statistics are per replica, and so its gradients.
    stem = L.Dense(8, activation="relu", name="stem")(x)
    h = L.Add()([stem, L.Dense(8, name="block")(stem)])
    return keras.Model(x, L.Dense(3, name="head")(L.Dense(6, name="dense")(h)))


class SumsBeforeUpdate(keras.callbacks.Callback):
    """The Taylor sums after step 3, the last one before the update in step 4."""

    def on_train_batch_end(self, batch, logs=None):
        if batch == 2:
            rule = mask_rules.get_rule(self.model)
            state = rule.state_variables(self.model)
            self.sums = {k: v.numpy().tolist() for k, v in state.items()}


def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(24, 5)).astype("float32"), rng.normal(size=(24, 3)).astype(
        "float32"
    )


def train(strategy):
    x, y = data()
    with strategy.scope():
        schedule = maskfit.pruning.ConstantSparsity(
            0.5, begin_step=4, end_step=4, frequency=1
        )
        plain = build()
        weights = [w.tolist() for w in plain.get_weights()]
        model = maskfit.pruning.prune_units(plain, schedule, importance="taylor")
        model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    sums = SumsBeforeUpdate()
    model.fit(x, y, batch_size=4, shuffle=False, verbose=0, callbacks=[sums])
    variables = model_lib.all_trainable_variables(model)
    zero = True
    for index, keep in model_lib.keep_masks(model).items():
        for value in strategy.experimental_local_results(variables[index].value):
            zero &= bool(np.all(np.asarray(value)[~keep] == 0))
    removed = maskfit.pruning.unit_selection(model).removed()
    return {
        "replicas": strategy.num_replicas_in_sync,
        "weights": weights,
        "sums": sums.sums,
        "removed": removed,
        "zero": zero,
    }


def main(out_dir):
    result = train(distribute.make_strategy("mirrored", logical_devices=2))
    with open(os.path.join(out_dir, "taylor.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
