"""Unit tests of `maskfit.kinds`: one record per layer class, looked up in one order."""

import doctest

import keras
import pytest

import maskfit
from maskfit import records as record
from maskfit.kinds import builtin
from maskfit.kinds.couplings import lookup as couplings
from maskfit.units import lookup

L = keras.layers


class MyDense(L.Dense):
    pass


class Declares(L.Dense):
    def maskfit_output_units(self):
        return "its own"


def test_the_lookup_order_is_registered_then_own_method_then_builtin():
    units = record.Lookup("units", "maskfit_output_units")

    assert units.find(L.Dense) == ("builtin", record.builtin(L.Dense).units)
    assert units.find(MyDense) == (None, None)
    assert units.find(Declares)[0] == "method"
    assert units.find(Declares(2))[1]() == "its own"  # bound on a layer

    units.register(Declares, "registered")
    units.register(L.Dense, "registered too")

    assert units.find(Declares) == ("registered", "registered")
    assert units.find(L.Dense) == ("registered", "registered too")
    units.register(L.Dense, None)
    assert units.find(L.Dense)[0] == "builtin"


def test_the_nearest_builtin_base_names_the_class_a_subclass_may_reuse():
    units = record.Lookup("units", "maskfit_output_units")
    prunable = record.Lookup("prunable", "get_prunable_weights")

    assert units.builtin_base(MyDense) is L.Dense
    assert units.builtin_base(L.Dense) is None  # Layer has no units record
    assert prunable.builtin_base(MyDense) is L.Dense


def test_units_pruning_and_couplings_read_the_same_record():
    kind = record.builtin(L.Conv2D)

    assert lookup.declaring_function(L.Conv2D) is kind.units
    assert couplings.coupling_of(L.Conv2D(2, 3)) is kind.coupling
    assert maskfit.pruning.classify(L.Conv2D).weights == kind.prunable.weights
    assert lookup.units_before_build(L.Conv2D(7, 3)) == 7


def test_each_class_has_one_record_and_the_records_are_installed_once():
    assert len(builtin.KINDS) == len(record.builtin_classes())
    assert all(isinstance(k, record.LayerKind) for k in builtin.KINDS.values())
    builtin.install()  # maskfit imported again: the same records, nothing new
    assert len(record.builtin_classes()) == len(builtin.KINDS)
    with pytest.raises(ValueError, match="installed once"):
        record.install({L.Dense: record.LayerKind()})
    with pytest.raises(ValueError, match="aspect must be one of"):
        record.Lookup("weights", "get_weights")


def test_the_docstring_examples_run():
    results = doctest.testmod(record)
    assert results.attempted and not results.failed
