"""One pruning step on given weights, under the backend it runs on: its keep masks.

    KERAS_BACKEND=tensorflow python tests/helpers/pruning_keeps_run.py IN.npz OUT.npz

`tests/pruning/test_magnitude_in_fit.py` runs it under TensorFlow in a
subprocess and calls `keeps` under JAX, on the same weights (with ties in
their magnitudes), and compares the keep masks bit for bit. The step's
learning rate is 0, so the masks depend on the weights alone.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

NAMES = ("hidden", "head")


def keeps(weights, block_size=(1, 1)):
    """`{layer name: keep mask}` after pruning step 1 at 60% sparsity of `weights`."""
    import maskfit.pruning as pruning

    model = pruning.prune_low_magnitude(
        keras.Sequential(
            [
                keras.Input((6,)),
                keras.layers.Dense(8, name="hidden"),
                keras.layers.Dense(4, name="head"),
            ]
        ),
        pruning.ConstantSparsity(0.6, begin_step=0, frequency=1),
        block_size=block_size,
    )
    for name in NAMES:
        model.get_layer(name).kernel.assign(weights[name])
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    x = np.ones((2, 6), "float32")
    model.fit(x, np.zeros((2, 4), "float32"), batch_size=2, epochs=1, verbose=0)
    return keeps_by_name(model)


def keeps_by_name(model):
    """The model's keep masks by layer name (`{}` before the first pruning step)."""
    from maskfit.model import training

    variables = training.all_trainable_variables(model)
    found = training.keep_masks(model)
    return {
        name: found[i]
        for i, v in enumerate(variables)
        for name in NAMES
        if v is model.get_layer(name).kernel and i in found
    }


def main(argv):
    source, out, block = argv
    with np.load(source) as saved:
        weights = {k: saved[k] for k in saved.files}
    block_size = tuple(int(b) for b in block.split("x"))
    np.savez(out, **keeps(weights, block_size))
    print(f"keeps: ok under {keras.backend.backend()}")


if __name__ == "__main__":
    main(sys.argv[1:])
