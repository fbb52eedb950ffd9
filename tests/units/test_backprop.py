"""`maskfit.units.backprop.projected_gradients`: dense gradients on every backend.

A gather's gradient under TensorFlow is `tf.IndexedSlices` (a relative
position table's, in keras_hub's ViTDet blocks); the gradient check reads
arrays of each weight's shape, so it is made dense.
"""

import numpy as np
import pytest
from keras import ops

from maskfit.units import backprop


@pytest.mark.backends("tensorflow", "jax")
def test_a_gathered_tables_gradient_is_a_dense_array_of_its_shape():
    table = np.arange(8, dtype="float32").reshape(4, 2)
    gradients = backprop.projected_gradients(
        lambda t: ops.take(t, np.array([0, 2, 2]), axis=0),
        [table],
        np.random.default_rng(0),
    )
    assert isinstance(gradients[0], np.ndarray) and gradients[0].shape == (4, 2)
    np.testing.assert_array_equal(gradients[0][[1, 3]], 0)
    assert np.all(gradients[0][[0, 2]] >= 0.5)
