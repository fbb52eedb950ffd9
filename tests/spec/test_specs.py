"""Mask specs and set_mask: declaration, read-back and every bad input."""

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import maskfit
from maskfit.spec import declare
from maskfit.step import declared

pytestmark = pytest.mark.backends("tensorflow", "jax")


def built_dense(units, input_dim=3, **kwargs):
    layer = keras.layers.Dense(units, **kwargs)
    layer.build((None, input_dim))
    return layer


def test_set_mask_returns_layer_and_get_mask_reads_it_back():
    layer = keras.layers.Dense(2)
    spec = maskfit.OutputMask([1, 0])
    assert maskfit.set_mask(layer, spec) is layer
    assert maskfit.get_mask(layer) is spec
    assert maskfit.get_mask(keras.layers.Dense(2)) is None
    maskfit.set_mask(layer, None)
    assert maskfit.get_mask(layer) is None


def test_set_mask_chains_in_functional_code():
    inputs = keras.Input((4,))
    outputs = maskfit.set_mask(keras.layers.Dense(2), maskfit.OutputMask([0, 1]))(
        inputs
    )
    model = keras.Model(inputs, outputs)
    np.testing.assert_array_equal(maskfit.get_mask(model.layers[-1]).values, [0, 1])


def test_masks_are_found_in_sequential_subclassed_and_nested_models():
    inner = keras.Sequential([keras.layers.Dense(3), keras.layers.Dense(2)])
    maskfit.set_mask(inner.layers[1], maskfit.OutputMask([1, 0]))

    class Block(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.proj = maskfit.set_mask(
                keras.layers.Dense(2), maskfit.OutputMask([0, 1])
            )

        def call(self, x):
            return self.proj(x)

    inputs = keras.Input((4,))
    model = maskfit.MaskedModel(inputs, Block()(inner(inputs)))
    found = {layer.name for layer, _ in declare.masked_layers(model)}
    assert inner.layers[1].name in found
    assert len(found) == 2
    entries = declared.resolve_masks(
        declare.masked_layers(model), model.trainable_variables
    )
    assert len(entries) == 4  # kernel and bias of both masked Dense layers


def test_output_mask_resolves_to_every_variable_with_that_last_dim():
    layer = built_dense(4)
    paths = [v.path for v, _, kind in maskfit.OutputMask([1, 0, 1, 0]).resolve(layer)]
    assert paths == [layer.kernel.path, layer.bias.path]
    norm = keras.layers.BatchNormalization()
    norm.build((None, 4))
    resolved = maskfit.OutputMask([1, 0, 1, 1]).resolve(norm)
    assert {v.name for v, _, _ in resolved} == {"gamma", "beta"}


@pytest.mark.parametrize(
    "make, error, words",
    [
        (lambda: maskfit.OutputMask([1, -1]), ValueError, [">= 0", "[1]"]),
        (lambda: maskfit.OutputMask([1, np.nan]), ValueError, ["finite"]),
        (lambda: maskfit.OutputMask([1, np.inf]), ValueError, ["finite"]),
        (lambda: maskfit.OutputMask([]), ValueError, ["non-empty 1-D"]),
        (lambda: maskfit.OutputMask([[1, 0]]), ValueError, ["1-D", "(1, 2)"]),
        (lambda: maskfit.OutputMask(["a"]), TypeError, ["numbers", "'a'"]),
        (lambda: maskfit.OutputMask([1], backprop="yes"), TypeError, ["backprop"]),
        (lambda: maskfit.ElementMask([1, 0]), TypeError, ["dict", "[1, 0]"]),
        (lambda: maskfit.ElementMask({}), TypeError, ["non-empty dict"]),
        (lambda: maskfit.ElementMask({0: [1]}), TypeError, ["variable names", "0"]),
        (
            lambda: maskfit.ElementMask({"kernel": [-2.0]}),
            ValueError,
            ["kernel", ">= 0"],
        ),
    ],
)
def test_bad_specs_fail_at_construction(make, error, words):
    with pytest.raises(error) as info:
        make()
    for word in words:
        assert word in str(info.value)


def test_output_mask_length_must_match_units_even_before_build():
    with pytest.raises(ValueError, match=r"'head'.*3 values.*2 output units"):
        maskfit.set_mask(
            keras.layers.Dense(2, name="head"), maskfit.OutputMask([1, 0, 1])
        )


def test_output_mask_of_the_wrong_length_names_layer_and_both_counts():
    # Embedding(10, 4) has 4 output units (its output_dim), whatever its vocabulary.
    layer = keras.layers.Embedding(10, 4, name="embed")
    layer.build((None,))
    with pytest.raises(ValueError) as info:
        maskfit.set_mask(layer, maskfit.OutputMask([1, 0, 1]))
    message = str(info.value)
    assert "'embed'" in message and "Embedding" in message
    assert "3 values" in message and "4 output units" in message


def test_element_mask_unknown_variable_lists_the_layer_variables():
    with pytest.raises(ValueError) as info:
        maskfit.set_mask(
            built_dense(2, name="d"), maskfit.ElementMask({"kernal": [[1]]})
        )
    message = str(info.value)
    assert "'kernal'" in message and "'d'" in message
    assert "['kernel', 'bias']" in message


def test_element_mask_wrong_shape_names_variable_and_both_shapes():
    with pytest.raises(ValueError) as info:
        maskfit.set_mask(
            built_dense(2, name="d"), maskfit.ElementMask({"kernel": np.ones((2, 3))})
        )
    message = str(info.value)
    assert "d/kernel" in message and "(2, 3)" in message and "(3, 2)" in message


def test_element_mask_accepts_full_path_and_broadcastable_shapes():
    layer = built_dense(2, name="d")
    spec = maskfit.ElementMask({"d/kernel": np.ones((1, 2)), "bias": [1, 0]})
    resolved = spec.resolve(layer)
    assert [v.name for v, _, _ in resolved] == ["kernel", "bias"]


def test_not_a_spec_and_not_a_layer_are_type_errors():
    with pytest.raises(TypeError, match=r"mask spec.*\[1, 0\].*list"):
        maskfit.set_mask(keras.layers.Dense(2), [1, 0])
    with pytest.raises(TypeError, match="keras.layers.Layer"):
        maskfit.set_mask("dense", maskfit.OutputMask([1, 0]))


def test_mask_on_a_layer_without_trainable_variables():
    frozen = built_dense(2, name="frozen")
    frozen.trainable = False
    with pytest.raises(ValueError, match=r"'frozen' has no trainable variables"):
        maskfit.set_mask(frozen, maskfit.OutputMask([1, 0]))
    relu = keras.layers.ReLU(name="act")
    relu.build((None, 2))
    with pytest.raises(ValueError, match=r"'act' has no trainable variables"):
        maskfit.set_mask(relu, maskfit.OutputMask([1, 0]))


def test_failed_set_mask_keeps_the_previous_mask():
    layer = built_dense(2)
    good = maskfit.OutputMask([1, 0])
    maskfit.set_mask(layer, good)
    with pytest.raises(ValueError):
        maskfit.set_mask(layer, maskfit.OutputMask([1, 0, 0]))
    assert maskfit.get_mask(layer) is good


@pytest.mark.parametrize(
    "spec",
    [
        maskfit.OutputMask([1, 0.5, 0], backprop=True),
        maskfit.ElementMask({"kernel": np.eye(3), "bias": [0, 1, 1]}),
    ],
)
def test_specs_round_trip_through_keras_serialization(spec):
    config = keras.saving.serialize_keras_object(spec)
    assert config["registered_name"].startswith("maskfit>")
    restored = keras.saving.deserialize_keras_object(config)
    assert restored == spec and restored is not spec


@settings(max_examples=40, deadline=None)
@given(
    input_dim=st.integers(1, 6),
    values=st.lists(st.sampled_from([0.0, 0.25, 1.0]), min_size=1, max_size=8),
    extra=st.integers(1, 3),
)
def test_output_masks_fit_dense_layers_of_their_length_only(input_dim, values, extra):
    layer = built_dense(len(values), input_dim)
    resolved = maskfit.OutputMask(values).resolve(layer)
    assert [tuple(v.shape) for v, _, _ in resolved] == [
        (input_dim, len(values)),
        (len(values),),
    ]
    for variable, mask, _ in resolved:
        np.testing.assert_array_equal(
            np.broadcast_to(mask, variable.shape)[..., :],
            np.broadcast_to(np.float32(values), variable.shape),
        )
    with pytest.raises(ValueError, match="output units"):
        maskfit.OutputMask(values + [1.0] * extra).resolve(layer)


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
    seed=st.integers(0, 2**16),
)
def test_element_masks_accept_exactly_broadcastable_shapes(shape, seed):
    rng = np.random.default_rng(seed)
    variable_shape = shape
    layer = keras.layers.Layer(name="holder")
    layer.w = layer.add_weight(shape=variable_shape, name="w")
    layer.built = True
    good = (rng.random(variable_shape) > 0.5).astype("float32")
    [(variable, mask, kind)] = maskfit.ElementMask({"w": good}).resolve(layer)
    assert kind == "element" and variable is layer.w
    bad_shape = variable_shape[:-1] + (variable_shape[-1] + 1,)
    with pytest.raises(ValueError, match=r"has shape"):
        maskfit.ElementMask({"w": np.ones(bad_shape)}).resolve(layer)


def test_element_mask_of_0s_and_1s_is_held_as_one_byte_per_entry():
    # Issue 43: 0/1 masks as bool on the host, fractional ones as float32.
    keep = np.array([[True, False, True], [False, True, True]])
    spec = maskfit.ElementMask({"kernel": keep})
    assert spec.masks["kernel"] is keep  # a bool array is not copied
    as_numbers = maskfit.ElementMask({"kernel": keep.astype("float64").tolist()})
    assert as_numbers.masks["kernel"].dtype == np.bool_
    np.testing.assert_array_equal(as_numbers.masks["kernel"], keep)
    assert as_numbers == spec
    scaled = maskfit.ElementMask({"kernel": [[1.0, 0.5, 0.0]]})
    assert scaled.masks["kernel"].dtype == np.float32
    np.testing.assert_array_equal(scaled.masks["kernel"], [[1.0, 0.5, 0.0]])
    again = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(spec)
    )
    assert again.masks["kernel"].dtype == np.bool_
    np.testing.assert_array_equal(again.masks["kernel"], keep)
    dense = keras.layers.Dense(3)
    dense.build((None, 2))
    maskfit.set_mask(dense, spec)
    (mask,) = declared.resolve_declared(
        declare.masked_layers(dense), dense.trainable_weights
    ).values()
    assert mask.table.dtype == np.bool_ and mask.table.base is keep
