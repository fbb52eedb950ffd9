"""Writes the files in this folder with maskfit 0.1.0 (main at 9558f8c).

Kept for the record: it documents what the files hold. It needs the 0.1.0
code (masks kept by position in the trainable list), so it is not run by the
suite; `tests/model/test_legacy_files.py` loads what it wrote with today's maskfit.

    git checkout 9558f8c && python tests/data/maskfit_0_1_0/make_files.py
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import maskfit  # noqa: E402
from maskfit import model as model_lib  # noqa: E402
from maskfit import pruning  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def build():
    """Input(6) -> Dense(8) 'hidden' -> Dense(5) 'middle' -> Dense(3) 'head'."""
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="tanh", name="hidden")
    middle = keras.layers.Dense(5, activation="tanh", name="middle")
    head = keras.layers.Dense(3, name="head")
    model = maskfit.MaskedModel(inputs, head(middle(hidden(inputs))), name="legacy")
    # A fully frozen variable (no optimizer slots: the optimizer layout is saved),
    maskfit.set_mask(middle, maskfit.ElementMask({"kernel": np.zeros((8, 5))}))
    # an output mask that switches at step 4,
    maskfit.set_mask(
        head,
        maskfit.PiecewiseMask(
            [4], [maskfit.OutputMask([1, 0, 1]), maskfit.OutputMask([1, 1, 0.5])]
        ),
    )
    # and two pruned kernels (their keep masks are saved).
    pruning.prune_low_magnitude(
        [hidden, head],
        pruning_schedule=pruning.ConstantSparsity(0.5, begin_step=0, frequency=2),
    )
    return model


def main():
    keras.utils.set_random_seed(7)
    model = build()
    model.compile(optimizer=keras.optimizers.AdamW(0.05, weight_decay=0.1), loss="mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(24, 6)).astype("float32")
    y = rng.normal(size=(24, 3)).astype("float32")
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    model.save(os.path.join(HERE, "model.keras"))
    model.save_weights(os.path.join(HERE, "model.weights.h5"))
    expected = {"x": x, "y": y, "prediction": model.predict(x, verbose=0)}
    variables = model_lib.all_trainable_variables(model)
    for index, keep in model_lib.keep_masks(model).items():
        expected[f"keep:{variables[index].path}"] = keep
    for variable in model.weights:
        expected[f"weight:{variable.path}"] = variable.numpy()
    for variable in model.optimizer.variables:
        expected[f"optimizer:{variable.path}"] = variable.numpy()
    np.savez(os.path.join(HERE, "expected.npz"), **expected)


if __name__ == "__main__":
    main()
