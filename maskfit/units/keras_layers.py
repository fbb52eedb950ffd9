"""`keras.layers` as maskfit's layer tables read it, on every supported Keras.

The layer-kind records of `maskfit.kinds` are keyed by layer class.
A few of those classes came after the oldest Keras maskfit supports; in a
Keras without one, `LAYERS.<name>` is a placeholder class that no layer is an
instance of, so its table entry never matches. Only the names listed in
`ADDED_IN` fall back: any other missing name (a typo, a class Keras removed)
raises `AttributeError` as `keras.layers` would.
"""

import keras

__all__ = ["ADDED_IN", "LAYERS"]

# Layer classes newer than the oldest supported Keras, with the release that
# added each.
ADDED_IN = {
    "ReversibleEmbedding": "3.12",
    "AdaptiveAveragePooling1D": "3.13",
    "AdaptiveAveragePooling2D": "3.13",
    "AdaptiveAveragePooling3D": "3.13",
    "AdaptiveMaxPooling1D": "3.13",
    "AdaptiveMaxPooling2D": "3.13",
    "AdaptiveMaxPooling3D": "3.13",
    "ContrastLimitedAdaptiveHistogramEqualization": "3.14",
}


class _Layers:
    """`keras.layers`, with placeholders for the classes of `ADDED_IN` it lacks."""

    def __init__(self):
        self._absent = {}

    def __getattr__(self, name):
        value = getattr(keras.layers, name, None)
        if value is not None:
            return value
        if name not in ADDED_IN:
            raise AttributeError(f"keras.layers has no attribute {name!r}")
        if name not in self._absent:
            self._absent[name] = type(
                f"Absent{name}",
                (),
                {"__doc__": f"keras.layers.{name} (Keras {ADDED_IN[name]}+)."},
            )
        return self._absent[name]


LAYERS = _Layers()
