"""What Keras computes differently from one release to another, found by running it.

Part of `maskfit.internals`: no private member is read here, but what these
probes find depends on the installed Keras, so, like the private members,
they are kept in one place that says which releases do what.
"""

import keras

__all__ = ["adds_channels_first_bias_on_last_axis"]

_bias_add = []


def adds_channels_first_bias_on_last_axis():
    """Whether `keras.ops.add(x, bias of shape (1, C, 1))` adds along x's last axis.

    Keras 3.15.1's TensorFlow backend does so when x's last dimension is C
    too (it takes the add for `tf.nn.bias_add` in NHWC), so the
    channels_first bias of a convolution whose output width equals its
    channels reaches every channel. Checked once per process, by running
    it, so whatever the installed release does is what maskfit assumes.
    """
    if not _bias_add:
        x = keras.ops.zeros((1, 2, 2))
        bias = keras.ops.reshape(keras.ops.convert_to_tensor([1.0, 2.0]), (1, 2, 1))
        added = keras.ops.convert_to_numpy(keras.ops.add(x, bias))
        _bias_add.append(bool(added[0, 0, 1] == 2.0))
    return _bias_add[0]
