"""`maskfit.backend.sharding`: a mask table's sharding from its variable's (JAX, one device).

The layouts on 8 devices, end to end, are tests/backend/test_model_parallel.py's.
"""

import numpy as np
import pytest

pytestmark = pytest.mark.backends("jax")

jax = pytest.importorskip("jax")

from maskfit.backend import sharding  # noqa: E402
from maskfit.step import stateless  # noqa: E402

P = jax.sharding.PartitionSpec


def _named(*spec):
    mesh = jax.sharding.Mesh(
        np.array(jax.devices()[:1]).reshape(1, 1), ("batch", "model")
    )
    return jax.sharding.NamedSharding(mesh, P(*spec))


@pytest.mark.parametrize(
    "spec, shape, table, expected",
    [
        ((None, "model"), (4, 8), (1, 4, 8), (None, None, "model")),
        (("model", None), (4, 8), (3, 4, 8), (None, "model", None)),
        # A per-column mask: the split rows are broadcast, so not split.
        (("model", None), (4, 8), (1, 1, 8), (None, None, None)),
        (("batch", "model"), (4, 8), (1, 4, 1), (None, "batch", None)),
        # A spec shorter than the rank, and a 3-d kernel (EinsumDense).
        (("model",), (4, 2, 8), (1, 4, 2, 8), (None, "model", None, None)),
        ((None, "model", None), (4, 2, 8), (2, 1, 2, 1), (None, None, "model", None)),
    ],
)
def test_a_table_is_split_where_it_spans_its_variables_split_axes(
    spec, shape, table, expected
):
    found = sharding.table_sharding(_named(*spec), shape, table)
    assert tuple(found.spec) == expected
    assert found.mesh == _named().mesh


def test_a_replicated_variable_that_is_not_named_keeps_its_sharding():
    single = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    assert sharding.table_sharding(single, (4, 8), (1, 4, 8)) is single


class _Split:
    """A sharding of no named mesh that splits its array (as a GSPMDSharding may)."""

    is_fully_replicated = False
    device_set = {"a", "b"}


def test_a_split_variable_without_a_named_sharding_is_refused_by_path():
    with pytest.raises(ValueError) as caught:
        sharding.table_sharding(_Split(), (4, 8), (1, 4, 8), path="dense/kernel")
    message = str(caught.value)
    assert "'dense/kernel'" in message
    assert "split over 2 devices by a _Split" in message
    assert "NamedSharding" in message and "LayoutMap" in message


def test_on_one_device_the_masks_become_jax_arrays_in_place():
    masks = stateless.StatelessMasks(
        (1,), (np.ones((1, 4, 8), bool),), (np.zeros((0,), np.int32),), ("step",), 2
    )
    values = [jax.numpy.zeros(3), jax.numpy.zeros((4, 8))]
    placed = sharding.place(masks, values)
    assert all(isinstance(t, jax.Array) for t in placed.tables + placed.boundaries)
    np.testing.assert_array_equal(placed.tables[0], masks.tables[0])
    # Already JAX arrays, on one device: nothing moves, the same object returns.
    assert sharding.place(placed, values) is placed


def test_bytes_per_device_reads_the_shards():
    array = jax.numpy.zeros((4, 8), "float32")
    assert sharding.bytes_per_device([array, array[0]]) == {
        str(jax.devices()[0]): 4 * 8 * 4 + 8 * 4
    }
