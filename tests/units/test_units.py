"""Unit tests of `maskfit.units`: which declaration applies, layouts, and the probe."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import maskfit
from maskfit.units import layout, lookup, probe
from maskfit.units.declaration import OutputUnits, units_along


def _built(layer, shape=(None, 3)):
    layer.build(shape)
    return layer


class MyDense(keras.layers.Dense):
    pass


class Declares(keras.layers.Dense):
    def maskfit_output_units(self):
        return OutputUnits(
            self.units, {"kernel": units_along(-1), "bias": units_along(0)}
        )


def test_a_builtin_layer_uses_the_table_and_a_subclass_is_refused_with_the_fix():
    assert lookup.declaring_function(keras.layers.Dense) is not None
    assert lookup.declaring_function(MyDense) is None
    with pytest.raises(
        ValueError, match=r"register_output_units\(MyDense, keras.layers.Dense\)"
    ):
        lookup.has_declaration(_built(MyDense(2)))


def test_registration_comes_before_a_method_and_can_be_removed():
    layer = _built(Declares(2))
    assert lookup.declaring_function(Declares).__name__ == "maskfit_output_units"
    calls = []

    def declare(l):
        calls.append(l)
        return OutputUnits(l.units, {"kernel": units_along(-1), "bias": units_along(0)})

    lookup.register_output_units(Declares, declare)
    try:
        assert lookup.declaring_function(Declares) is declare
        lookup.output_units_of(layer)
        assert calls == [layer]
    finally:
        lookup.register_output_units(Declares, None)
    assert lookup.declaring_function(Declares).__name__ == "maskfit_output_units"


def test_registering_a_class_reuses_its_declaration():
    lookup.register_output_units(MyDense, keras.layers.Dense)
    try:
        units = layout.layer_units(_built(MyDense(2)))
        assert units.units == 2
    finally:
        lookup.register_output_units(MyDense, None)
    with pytest.raises(ValueError, match="no output-unit declaration to reuse"):
        lookup.register_output_units(MyDense, keras.layers.Layer)


def test_wrappers_read_their_inner_layers_declaration():
    wrapped = keras.layers.TimeDistributed(keras.layers.Dense(4))
    wrapped.build((None, 5, 3))
    units = lookup.output_units_of(wrapped)
    assert units.units == 4
    assert units.outputs == ((-1, 0, 4),)


def test_units_before_build_come_from_the_config():
    assert lookup.units_before_build(keras.layers.Conv2D(7, 3)) == 7
    assert lookup.units_before_build(keras.layers.BatchNormalization()) is None


def test_layer_units_are_cached_until_the_declaration_changes():
    layer = _built(keras.layers.Dense(3))
    first = layout.layer_units(layer)
    assert layout.layer_units(layer) is first

    def declare(l):
        return OutputUnits(l.units, {"kernel": units_along(-1), "bias": units_along(0)})

    lookup.register_output_units(keras.layers.Dense, declare)
    try:
        assert layout.layer_units(layer) is not first  # a new registration re-checks
    finally:
        lookup.register_output_units(keras.layers.Dense, None)


def test_a_layout_expands_unit_values_onto_its_variable():
    unit_layout = layout.UnitLayout(np.array([[0, 1, 2, 3]]), 3)  # entry 3 is shared
    assert unit_layout.has_shared
    np.testing.assert_array_equal(
        unit_layout.expand(np.array([0.0, 0.5, 1.0], np.float32)).numpy(),
        [[0, 0.5, 1, 1]],
    )
    np.testing.assert_array_equal(unit_layout.shared, [[False, False, False, True]])
    plain = layout.UnitLayout(np.arange(3).reshape(1, 3), 3)
    np.testing.assert_array_equal(
        plain.expand(np.array([1.0, 2.0, 3.0], np.float32)).numpy(), [[1, 2, 3]]
    )


def test_the_probe_finds_which_unit_each_entry_affects():
    dense = _built(keras.layers.Dense(5))
    make = probe.sample_inputs(dense)
    covered = np.zeros(5, bool)
    found = probe.dependencies(probe.Probe(dense, make, ((-1, 0, 5),)), 5, covered)
    _, reached, multi, unit = found[id(dense.kernel)]
    assert covered.all() and reached.all() and not multi.any()
    np.testing.assert_array_equal(unit, np.broadcast_to(np.arange(5), (3, 5)))


def test_the_probe_refuses_a_declaration_the_gradients_contradict():
    class Wrong(keras.layers.Dense):
        def maskfit_output_units(self):
            # Rows are not units: the kernel's column u feeds unit u.
            return OutputUnits(
                self.units, {"kernel": units_along(0), "bias": units_along(0)}
            )

    layer = _built(Wrong(3))
    with pytest.raises(ValueError, match="disagree with its gradients"):
        maskfit.set_mask(layer, maskfit.OutputMask([1, 0, 1]))


def test_the_probe_knows_which_errors_mean_a_kernel_runs_only_under_xla():
    # TensorFlow's CPU kernels without oneDNN's NCHW support: the 1-D and 2-D
    # convolutions name NHWC, the 3-D transposed ones NDHWC.
    for message in (
        "The Conv2D op currently only supports the NHWC tensor format on the CPU.",
        "Conv3DBackpropInputOpV2 only supports NDHWC on the CPU.",
    ):
        error = tf.errors.InvalidArgumentError(None, None, message)
        assert probe.runs_only_under_xla(error)
    assert not probe.runs_only_under_xla(
        tf.errors.InvalidArgumentError(None, None, "shape")
    )
    assert not probe.runs_only_under_xla(ValueError("NHWC"))
