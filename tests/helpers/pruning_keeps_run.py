"""Pruning on given weights, under the backend it runs on: keep masks and a short run.

    KERAS_BACKEND=tensorflow python tests/helpers/pruning_keeps_run.py IN.npz OUT.npz

`tests/pruning/test_magnitude_in_fit.py` runs it under TensorFlow in one
subprocess and calls `keeps` and `adam_run` under JAX (or torch), on the same
weights (with ties in their magnitudes), and compares the results:

- `keeps`: one pruning step at learning rate 0, per block size (`BLOCK_SIZES`):
  the masks depend on the weights alone; compared bit for bit.
- `adam_run`: `RUN_STEPS` steps of Adam with a pruning schedule that drops
  entries at four steps, from weights without ties (`IN.npz`'s "run_hidden",
  "run_head": a tie broken by the last bit of a trained weight would depend
  on the backend's rounding): the keep masks after every step, compared bit
  for bit, and the kernels, equal to float rounding. Issue 44 asked whether
  the backends prune alike in training.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

NAMES = ("hidden", "head")
BLOCK_SIZES = ((1, 1), (2, 2))
RUN_STEPS = 9


def _model():
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, name="hidden"),
            keras.layers.Dense(4, name="head"),
        ]
    )


def _set(model, weights):
    for name in NAMES:
        model.get_layer(name).kernel.assign(weights[name])
        model.get_layer(name).bias.assign(np.zeros(model.get_layer(name).bias.shape))


def keeps(weights, block_size=(1, 1)):
    """`{layer name: keep mask}` after pruning step 1 at 60% sparsity of `weights`."""
    import maskfit.pruning as pruning

    model = pruning.prune_low_magnitude(
        _model(),
        pruning.ConstantSparsity(0.6, begin_step=0, frequency=1),
        block_size=block_size,
    )
    _set(model, weights)
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    x = np.ones((2, 6), "float32")
    model.fit(x, np.zeros((2, 4), "float32"), batch_size=2, epochs=1, verbose=0)
    return keeps_by_name(model)


def adam_run(weights, **compile_kwargs):
    """`[(keep masks by name, kernels by name)]` after each of `RUN_STEPS` steps.

    Adam at 0.05 on fixed data, pruning from 30% (step 1, on `weights`) to
    75% at steps 1, 3, 5, 7 (`PolynomialDecay`); one `fit` call per step.
    `compile_kwargs` go to `compile` (e.g. `run_eagerly=True`).
    """
    import maskfit.pruning as pruning

    model = pruning.prune_low_magnitude(
        _model(), pruning.PolynomialDecay(0.3, 0.75, 1, 7, frequency=2)
    )
    _set(model, weights)
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse", **compile_kwargs)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(8, 6)).astype("float32")
    y = rng.normal(size=(8, 4)).astype("float32")
    found = []
    for _ in range(RUN_STEPS):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
        kernels = {
            n: keras.ops.convert_to_numpy(model.get_layer(n).kernel) for n in NAMES
        }
        found.append((keeps_by_name(model), kernels))
    return found


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


def block_key(block_size):
    """The name of a block size in the output file: "1x1"."""
    return "x".join(map(str, block_size))


def main(argv):
    source, out = argv
    with np.load(source) as saved:
        tied = {name: saved[name] for name in NAMES}
        untied = {name: saved[f"run_{name}"] for name in NAMES}
    results = {}
    for block_size in BLOCK_SIZES:
        for name, keep in keeps(tied, block_size).items():
            results[f"keeps/{block_key(block_size)}/{name}"] = keep
    for step, (keep, kernels) in enumerate(adam_run(untied), start=1):
        for name, mask in keep.items():
            results[f"run/{step}/keep/{name}"] = mask
        for name, kernel in kernels.items():
            results[f"run/{step}/kernel/{name}"] = kernel
    np.savez(out, **results)
    print(f"keeps: ok under {keras.backend.backend()}")


if __name__ == "__main__":
    main(sys.argv[1:])
