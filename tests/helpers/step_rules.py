"""Mask rules the step's tests declare."""

import numpy as np
import tensorflow as tf

from maskfit.spec import rules


class SwapAt(rules.MaskRule):
    """A tiny RigL: in step `at`, drops the weakest active entry of a layer's kernel
    and grows the inactive one with the largest gradient. Active: not 0 (`kept`
    says otherwise)."""

    uses_gradients = True
    regrows = True

    def __init__(self, at=0):
        self.at = at

    def variables(self, layer):
        return [layer.kernel]

    def should_update(self, step):
        return tf.equal(step, self.at)

    def last_update_step(self):
        return self.at

    def kept(self, weight, keep):
        return tf.not_equal(weight, 0)

    def keep_masks(self, step, variables, weights, protected, keeps, gradients=None):
        (w,), (keep,), (g,) = weights, keeps, gradients
        flat_w, flat_g = tf.reshape(tf.abs(w), [-1]), tf.reshape(tf.abs(g), [-1])
        active = tf.reshape(self.kept(w, keep), [-1])
        weakest = tf.argmin(tf.where(active, flat_w, np.inf))
        strongest = tf.argmax(tf.where(active, -1.0, flat_g))
        new = tf.tensor_scatter_nd_update(active, [[weakest]], [False])
        new = tf.tensor_scatter_nd_update(new, [[strongest]], [True])
        return [tf.reshape(new, tf.shape(w))]

    def get_config(self):
        return {"at": self.at}
