"""The control: PackNet with hand-written gradient masking instead of maskfit.

What one writes without maskfit: a `keras.Model` whose `train_step`
multiplies each gradient by a 0/1 mask before `optimizer.apply`. Nothing
else holds a frozen entry: whatever moves an entry whose gradient is 0 still
moves it. With a new optimizer for every training (as here) and plain Adam
that is nothing, since the moments of an entry that never had a gradient are
0; decoupled weight decay (AdamW), momentum or Adam state carried over from
earlier training moves them, and an earlier task's weights drift while later
tasks learn. Same network, same ownership, pruning and schedule as
`packnet.PackNet`; only the masks differ.
"""

import keras
import numpy as np
import tensorflow as tf

from experiments.continual_learning import packnet

__all__ = ["HandMaskedModel", "HandMaskedPackNet"]


class _Masks:
    """The gradient masks, out of Keras's tracking: {id(variable): tf.Variable}."""

    def __init__(self, variables):
        self.by_id = {
            id(v): tf.Variable(np.ones(v.shape, np.float32), trainable=False)
            for v in variables
        }


class HandMaskedModel(keras.Model):
    """A functional model whose step multiplies gradients by 0/1 masks, and no more."""

    def __init__(self, inputs, outputs, **kwargs):
        super().__init__(inputs, outputs, **kwargs)
        self._grad_masks = _Masks(self.trainable_variables)

    def set_grad_mask(self, variable, mask):
        """Sets the gradient mask of `variable` (broadcast to its shape)."""
        value = np.broadcast_to(np.asarray(mask, np.float32), variable.shape)
        self._grad_masks.by_id[id(variable)].assign(value)

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
            )
        variables = self.trainable_variables
        gradients = tape.gradient(loss, variables)
        gradients = [
            g * self._grad_masks.by_id[id(v)] for g, v in zip(gradients, variables)
        ]
        self.optimizer.apply(gradients, variables)
        return {"loss": loss}


class HandMaskedPackNet(packnet.PackNet):
    """PackNet on a `HandMaskedModel`: gradient masks instead of exact masks."""

    name = "packnet_gradmask"

    def _declare(self, layer, kernel, bias):
        self.network.model.set_grad_mask(layer.kernel, kernel)
        self.network.model.set_grad_mask(layer.bias, bias)
