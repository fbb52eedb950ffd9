"""Writes the files in this folder with maskfit 0.2.0 (main at 6e9d4d8).

Kept for the record: it documents what the files hold. 0.3.0 moved the
modules these files' rules and importances were defined in (`maskfit.moved`),
so the suite loads what this wrote with today's maskfit
(`tests/model/test_legacy_files.py`) rather than running it.

    git checkout 6e9d4d8 && python tests/data/maskfit_0_2_0/make_files.py
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import maskfit  # noqa: E402
from maskfit import pruning, sparse, structured  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _dense_stack(name):
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
    middle = keras.layers.Dense(8, activation="relu", name="middle")(hidden)
    outputs = keras.layers.Dense(3, name="head")(middle)
    return maskfit.MaskedModel(inputs, outputs, name=name)


def build_units():
    """Units pruned in `fit` (Taylor importance), a fractional multiplier on the head."""
    model = _dense_stack("units")
    maskfit.set_mask(model.get_layer("head"), maskfit.OutputMask([1.0, 0.5, 0.0]))
    return structured.prune_units(
        model,
        pruning.PolynomialDecay(0.0, 0.5, begin_step=0, end_step=4, frequency=2),
        importance=structured.TaylorImportance(),
    )


def build_sparse():
    """RigL at 50% sparsity, moving connections every 2 steps."""
    model = _dense_stack("sparse")
    sparse.sparsify(model, "rigl", sparsity=0.5, t_end=6, delta_t=2, seed=3)
    return model


def _save(model, name, x, y):
    model.compile(optimizer=keras.optimizers.AdamW(0.05, weight_decay=0.1), loss="mse")
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    model.save(os.path.join(HERE, f"{name}.keras"))
    expected = {"x": x, "y": y, "prediction": model.predict(x, verbose=0)}
    for variable in model.weights:
        expected[f"weight:{variable.path}"] = variable.numpy()
    for variable in model.optimizer.variables:
        expected[f"optimizer:{variable.path}"] = variable.numpy()
    np.savez(os.path.join(HERE, f"{name}.npz"), **expected)


def main():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(24, 6)).astype("float32")
    y = rng.normal(size=(24, 3)).astype("float32")
    for name, build in [("units", build_units), ("sparse", build_sparse)]:
        keras.utils.set_random_seed(7)
        _save(build(), name, x, y)


if __name__ == "__main__":
    main()
