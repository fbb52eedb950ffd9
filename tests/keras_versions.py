"""Which Keras optimizers this install can run, for tests parametrized over them."""

import keras
import pytest

# Optimizers a Keras release ships but cannot run with TensorFlow, stock
# keras.Model included: Keras 3.10's Muon reads `.path` of the tf.Variable its
# update step is handed (AttributeError); fixed in 3.11.
BROKEN_BEFORE = {"Muon": (3, 11)}
KERAS = tuple(int(part) for part in keras.__version__.split(".")[:2])


def param_if_shipped(name, cls=None):
    """`name` as a test parameter, skipped in a Keras that lacks its optimizer.

    Also skipped where that Keras's own optimizer is broken. Lamb came in
    Keras 3.5, Muon in 3.10, ScheduleFreeAdamW in 3.14.

    Args:
      name: the parameter, e.g. "AdamW_ema".
      cls: the name of its `keras.optimizers` class; by default, `name` up to
        its first "_".
    """
    cls = cls or name.split("_")[0]
    if not hasattr(keras.optimizers, cls):
        reason = f"Keras {keras.__version__} has no keras.optimizers.{cls}"
    elif KERAS < BROKEN_BEFORE.get(cls, KERAS):
        reason = f"keras.optimizers.{cls} fails in Keras {keras.__version__} itself"
    else:
        return name
    return pytest.param(name, marks=pytest.mark.skip(reason=reason))
