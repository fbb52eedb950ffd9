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


def _channels_first_needs_xla():
    import tensorflow as tf

    conv = keras.layers.Conv2D(1, 1, data_format="channels_first")
    try:
        conv(tf.zeros((1, 1, 2, 2)))
    except tf.errors.UnimplementedError:
        return True
    return False


# TensorFlow's CPU kernels for a channels_first convolution exist only with
# oneDNN's NCHW support, which some CPUs lack (seen on an AMD EPYC): there
# Keras runs such a layer only under XLA, in `fit` too.
CHANNELS_FIRST_NEEDS_XLA = _channels_first_needs_xla()
NEEDS_XLA_REASON = (
    "this CPU's TensorFlow runs channels_first convolutions only under XLA"
    " (Keras's own fit fails too without jit_compile=True)"
)


def call_or_xla(fn):
    """`fn()`, compiled with XLA where this CPU's TensorFlow cannot run it otherwise."""
    import tensorflow as tf

    from maskfit.units import probe

    try:
        return fn()
    except (tf.errors.UnimplementedError, tf.errors.InvalidArgumentError) as e:
        if not probe.runs_only_under_xla(e):
            raise
        return tf.function(fn, jit_compile=True)()
