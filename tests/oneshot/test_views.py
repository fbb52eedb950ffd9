"""Kernels as `(in, out)` matrices: the view's product is the layer's output."""

import keras
import numpy as np
import pytest

from maskfit.oneshot import views

pytestmark = pytest.mark.backends("tensorflow", "jax")

EINSUMS = [
    # keras_hub's attention query/key/value and output projections.
    ("btd,dnh->btnh", (2, 5, 6), (None, 3, 4)),
    ("btnh,nhd->btd", (2, 5, 3, 4), (None, 6)),
    # keras.layers.MultiHeadAttention's, and Gemma's FFN.
    ("abc,cde->abde", (2, 5, 6), (None, 3, 4)),
    ("...d,df->...f", (2, 6), (7,)),
    # The contracted axes in another order than the input's.
    ("bij,jik->bk", (2, 3, 4), (5,)),
]


@pytest.mark.parametrize("equation, shape, output_shape", EINSUMS)
def test_einsum_view_times_its_input_is_the_layer_output(equation, shape, output_shape):
    layer = keras.layers.EinsumDense(equation, output_shape)
    x = np.random.default_rng(0).normal(size=shape).astype("float32")
    y = np.asarray(keras.ops.convert_to_numpy(layer(x)), np.float64)
    kernel = keras.ops.convert_to_numpy(layer.kernel)
    view = views.kernel_view(layer)
    product = view.inputs(x) @ view.matrix(kernel)
    # The layer's output with its token axes first, then the kernel's output
    # axes in kernel order: the rows and columns of the view's product.
    left, output = equation.replace("...", "z").split("->")
    source, letters = left.split(",")
    kept = "".join(c for c in output if c in source)
    produced = "".join(c for c in letters if c in output)
    np.testing.assert_allclose(
        np.einsum(f"{output}->{kept}{produced}", y).reshape(product.shape),
        product,
        rtol=1e-5,
        atol=1e-5,
    )
    np.testing.assert_array_equal(view.kernel(view.matrix(kernel)), kernel)


def test_dense_view_is_the_kernel():
    dense = keras.layers.Dense(3)
    dense.build((None, 4))
    view = views.kernel_view(dense)
    assert view.rows == (4, 3)
    x = np.ones((2, 5, 4))
    assert view.inputs(x).shape == (10, 4)


@pytest.mark.parametrize(
    "equation, shape, output_shape, reason",
    [
        ("abc,bcd->abd", (2, 3, 4), (3, 5), "not a plain input-to-output map"),
        ("ab,bc->c", (2, 3), (4,), "not a matrix product"),
    ],
)
def test_kernels_that_are_not_a_matrix_product_are_refused(
    equation, shape, output_shape, reason
):
    layer = keras.layers.EinsumDense(equation, output_shape)
    layer.build(shape)
    found = views.kernel_view(layer)
    assert isinstance(found, str) and reason in found


def test_lora_and_quantized_layers_are_refused():
    dense = keras.layers.Dense(4)
    dense.build((None, 4))
    dense.enable_lora(2)
    assert "enable_lora" in views.kernel_view(dense)
    quantized = keras.layers.Dense(4)
    quantized.build((None, 4))
    quantized.quantize("int8")
    assert "quantized (int8)" in views.kernel_view(quantized)
