"""Per-layer sparsities (uniform, Erdos-Renyi, ERK): RigL's formula, budget, errors."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maskfit import sparse


@pytest.fixture(autouse=True)
def _fresh_keras():
    """Overrides conftest's: these tests make no Keras state."""
    yield


def _budget(shapes, sparsities, target, custom=()):
    """(kept by the sparsities, kept at the target uniformly) over non-custom weights."""
    kept = sum(
        np.prod(shape) * (1 - sparsities[name])
        for name, shape in shapes.items()
        if name not in custom
    )
    wanted = sum(
        sparse.active_count(int(np.prod(shape)), target)
        for name, shape in shapes.items()
        if name not in custom
    )
    return kept, wanted


def test_erk_worked_example_solves_eps_by_hand():
    # ERK probabilities 140/4000 and 110/1000; the budget keeps 400 + 100 entries:
    # eps * (0.035 * 4000 + 0.11 * 1000) = 500, so eps = 2.
    result = sparse.layer_sparsities({"a": (40, 100), "b": (100, 10)}, 0.9)
    assert result == pytest.approx({"a": 1 - 2 * 0.035, "b": 1 - 2 * 0.11}, abs=1e-12)


def test_erk_makes_a_layer_dense_when_its_density_would_pass_1_and_rescales():
    shapes = {"a": (40, 300), "b": (300, 100), "c": (100, 10)}
    result = sparse.layer_sparsities(shapes, 0.5)
    # First pass: eps = 21500 / 850, c's density 0.11 * eps > 1: c becomes dense,
    # its 500 zeros leave the budget: eps = (6000 + 15000 - 500) / (340 + 400).
    eps = 20500 / 740
    assert result["c"] == 0.0
    assert result["a"] == pytest.approx(1 - eps * 340 / 12000, abs=1e-12)
    assert result["b"] == pytest.approx(1 - eps * 400 / 30000, abs=1e-12)
    kept, wanted = _budget(shapes, result, 0.5)
    assert kept == pytest.approx(wanted)


def test_erdos_renyi_uses_the_last_two_dimensions_and_erk_the_kernel_too():
    shapes = {"conv": (3, 3, 16, 32), "dense": (32, 10)}
    er = sparse.layer_sparsities(shapes, 0.95, "erdos_renyi")
    erk = sparse.layer_sparsities(shapes, 0.95, "erdos_renyi_kernel")
    assert 0 < min([*er.values(), *erk.values()])  # No layer dense at 95%.
    ratio = lambda s, raw: (1 - s) / raw  # noqa: E731  eps, the same for every layer
    assert ratio(er["conv"], 48 / 512) == pytest.approx(ratio(er["dense"], 42 / 320))
    assert ratio(erk["conv"], 54 / 4608) == pytest.approx(ratio(erk["dense"], 42 / 320))
    assert er["conv"] != pytest.approx(erk["conv"])


def test_erk_power_scale_flattens_the_ratio():
    shapes = {"a": (40, 100), "b": (100, 10)}
    full = sparse.layer_sparsities(shapes, 0.9)
    soft = sparse.layer_sparsities(shapes, 0.9, erk_power_scale=0.5)
    raw = {"a": 140 / 4000, "b": 110 / 1000}
    assert (1 - soft["a"]) / (1 - soft["b"]) == pytest.approx(
        math.sqrt(raw["a"] / raw["b"])
    )
    assert abs(soft["a"] - soft["b"]) < abs(full["a"] - full["b"])


def test_uniform_and_custom_sparsities_stay_out_of_the_budget():
    shapes = {"first": (4, 64), "mid": (64, 64), "last": (64, 10)}
    uniform = sparse.layer_sparsities(shapes, 0.9, "uniform", {"first": 0.0})
    assert uniform == {"first": 0.0, "mid": 0.9, "last": 0.9}
    erk = sparse.layer_sparsities(shapes, 0.9, custom_sparsity_map={"first": 0.0})
    assert erk["first"] == 0.0
    kept, wanted = _budget(shapes, erk, 0.9, custom=("first",))
    assert kept == pytest.approx(wanted)
    # Keys keep the order of `shapes`.
    assert list(erk) == list(shapes)


def test_sparsity_zero_makes_every_layer_dense():
    shapes = {"a": (3, 5), "b": (5, 7), "c": (7,)}
    assert set(sparse.layer_sparsities(shapes, 0.0).values()) == {0.0}


def test_active_count_rounds_as_rigl():
    assert sparse.active_count(100, 0.8) == 20
    assert sparse.active_count(7, 0.5) == 4  # floor(3.5) zeros
    assert sparse.active_count(10, 0.95) == 1
    assert sparse.active_count(10, 0.0) == 10


_shape = st.lists(st.integers(1, 40), min_size=1, max_size=4).map(tuple)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(_shape, min_size=1, max_size=6),
    st.floats(0.0, 0.99),
    st.sampled_from(["erdos_renyi", "erdos_renyi_kernel"]),
)
def test_scaled_distributions_meet_the_budget(shapes, target, distribution):
    if distribution == "erdos_renyi":
        shapes = [s if len(s) >= 2 else s + (3,) for s in shapes]
    named = {f"w{i}": s for i, s in enumerate(shapes)}
    result = sparse.layer_sparsities(named, target, distribution)
    assert list(result) == list(named)
    assert all(0.0 <= s < 1.0 + 1e-12 for s in result.values())
    kept, wanted = _budget(named, result, target)
    assert kept == pytest.approx(wanted, rel=1e-9, abs=1e-6)
    # Density is eps * p for the scaled layers; dense ones have the largest p.
    raw = {
        name: (
            (np.sum(s) / np.prod(s))
            if distribution == "erdos_renyi_kernel"
            else (s[-2] + s[-1]) / (s[-2] * s[-1])
        )
        for name, s in named.items()
    }
    scaled = [n for n in named if result[n] > 0]
    if scaled:
        eps = {n: (1 - result[n]) / raw[n] for n in scaled}
        assert max(eps.values()) == pytest.approx(min(eps.values()), rel=1e-9)
        dense = [n for n in named if result[n] == 0]
        if dense:
            assert min(raw[n] for n in dense) >= max(raw[n] for n in scaled) * (
                1 - 1e-12
            )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(sparsity=1.0), r"sparsity must be a number in \[0, 1\).*Received: 1.0"),
        (dict(sparsity=-0.1), r"Received: -0.1"),
        (dict(sparsity=True), r"Received: True"),
        (dict(distribution="random"), r"RigL's name for the uniform"),
        (
            dict(distribution="erk"),
            r"distribution must be one of.*Received: distribution='erk'",
        ),
        (dict(custom_sparsity_map={"z": 0.5}), r"names \['z'\].*not among"),
        (
            dict(custom_sparsity_map={"a": 1.5}),
            r"custom_sparsity_map\['a'\].*Received: 1.5",
        ),
        (dict(custom_sparsity_map=[("a", 0.5)]), r"must be None or a dict"),
        (dict(erk_power_scale=0), r"erk_power_scale must be a positive.*Received"),
        (
            dict(shapes={"a": (3, 0)}),
            r"weight 'a' must be a non-empty tuple of positive",
        ),
        (dict(shapes={}), r"non-empty dict"),
        (
            dict(shapes={"a": (3,), "b": (3, 4)}, distribution="erdos_renyi"),
            r"\['a'\] have rank 1",
        ),
    ],
)
def test_bad_arguments_raise_one_clear_error(kwargs, message):
    arguments = dict(shapes={"a": (3, 4), "b": (4, 5)}, sparsity=0.5)
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        sparse.layer_sparsities(**arguments)
