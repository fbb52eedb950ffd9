"""What a mask value of 0.1 does under each optimizer: `measure`, `format_table`.

`measure` trains the head of `__main__`'s description once per optimizer, in
a stock `keras.Model` and in a `MaskedModel` under each `scale`, from the
same weights, and returns the ratios of the 0.1 unit's moves.
"""

import keras
import numpy as np

import maskfit

OPTIMIZERS = {
    "SGD 0.05": lambda: keras.optimizers.SGD(0.05),
    "Adam 0.01": lambda: keras.optimizers.Adam(0.01),
    "AdamW 0.01, weight decay 0.5": lambda: keras.optimizers.AdamW(
        0.01, weight_decay=0.5
    ),
    "Lion 0.001": lambda: keras.optimizers.Lion(0.001),
    "RMSprop 0.01": lambda: keras.optimizers.RMSprop(0.01),
}
SLOW = 0.1


def _model(model_class, scale):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(16, activation="tanh")(inputs)
    head = keras.layers.Dense(2, name="head")
    if scale is not None:
        maskfit.set_mask(head, maskfit.OutputMask([1.0, SLOW], scale=scale))
    return model_class(inputs, head(hidden))


def _moved(model_class, scale, make_optimizer, x, y):
    """|change| of the slow unit's kernel column after one epoch."""
    model = _model(model_class, scale)
    start = model.get_layer("head").kernel.numpy()[:, 1].copy()
    model.compile(optimizer=make_optimizer(), loss="mse")
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    return np.abs(model.get_layer("head").kernel.numpy()[:, 1] - start)


def measure():
    """Rows (optimizer, gradient-scaling ratio, step-scaling ratio)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = rng.normal(size=(64, 2)).astype("float32")
    rows = []
    for name, make in OPTIMIZERS.items():
        stock = _moved(keras.Model, None, make, x, y).mean()
        ratios = [
            _moved(maskfit.MaskedModel, scale, make, x, y).mean() / stock
            for scale in ("gradient", "step")
        ]
        rows.append((name, *ratios))
    return rows


def format_table(rows):
    """`measure`'s rows as a Markdown table."""
    lines = [
        f"| optimizer | scale='gradient' | scale='step' (default) |  (target {SLOW})",
        "| --- | --- | --- |",
    ]
    lines += [
        f"| {name} | {gradient:.3f} | {step:.3f} |" for name, gradient, step in rows
    ]
    return "\n".join(lines)
