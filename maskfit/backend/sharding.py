"""Masks laid out like their variables under a `keras.distribution` (JAX).

Under `keras.distribution.ModelParallel` a kernel is split over the devices
of a mesh by its `LayoutMap`; a mask left on one device would be copied
whole to every device by the compiled step (and, passed anew each step,
copied again each step), which spends on every device the memory the mask
was meant to save. `place` puts each mask table where its variable lives:
a dimension the mask shares with its variable is split over the same mesh
axes as the variable's, a broadcast dimension (size 1: an `OutputMask` per
column, a mask given per row) and the schedule's interval dimension are
replicated, as are the boundaries. Under `DataParallel` (variables
replicated) the masks are replicated once, not sent again each step. A
variable on one device (no distribution) leaves its mask as it is.

`bytes_per_device` reads what each device holds of a list of arrays, from
their shards: what `maskfit.mask_memory` reports.
"""

import collections

import jax
import numpy as np

__all__ = ["bytes_per_device", "place", "place_masks", "table_sharding"]


def _spans_devices(sharding):
    return sharding is not None and len(sharding.device_set) > 1


def table_sharding(sharding, shape, table_shape, path="variable"):
    """The sharding of a mask table `(intervals, *mask)` for a variable's `sharding`.

    Args:
      sharding: the variable's `jax.sharding.Sharding`.
      shape: the variable's shape.
      table_shape: the table's shape: intervals first, then a shape that
        broadcasts to `shape`.
      path: the variable's path, for the error.

    Returns:
      A `jax.sharding.NamedSharding` on the variable's mesh, or the
      variable's own sharding when it is fully replicated.

    Raises:
      ValueError: for a variable split by a sharding that is not a
        `NamedSharding` (Keras's distributions make only those).

    Example:

    >>> import jax
    >>> mesh = jax.sharding.Mesh(jax.devices()[:1], ("model",))
    >>> spec = jax.sharding.PartitionSpec(None, "model")
    >>> kernel = jax.sharding.NamedSharding(mesh, spec)
    >>> tuple(table_sharding(kernel, (4, 8), (1, 1, 8)).spec)
    (None, None, 'model')
    """
    if not isinstance(sharding, jax.sharding.NamedSharding):
        if sharding.is_fully_replicated:
            return sharding
        raise ValueError(
            f"Variable '{path}' is split over {len(sharding.device_set)} devices"
            f" by a {type(sharding).__name__}; maskfit lays a mask out like its"
            " variable from a jax.sharding.NamedSharding (what"
            " keras.distribution's layouts make). Shard the variable with a"
            " keras.distribution.LayoutMap."
        )
    spec = tuple(sharding.spec) + (None,) * (len(shape) - len(sharding.spec))
    mask = tuple(table_shape[1:])
    # The mask broadcasts to the variable: align their trailing dimensions.
    spec, shape = spec[len(spec) - len(mask) :], tuple(shape)[len(shape) - len(mask) :]
    axes = [axis if m == s else None for axis, m, s in zip(spec, mask, shape)]
    return jax.sharding.NamedSharding(
        sharding.mesh, jax.sharding.PartitionSpec(None, *axes)
    )


def place(masks, values, paths=None):
    """`masks` with each table (and its boundaries) laid out like its variable.

    Args:
      masks: `StatelessMasks` of the variables whose `values` are given; its
        leaves NumPy arrays (`masks_for(..., host=True)`: a table then goes
        from the host straight to the devices, each receiving its shard) or
        JAX arrays.
      values: one array per variable (the state's, or `variable.value`),
        read for its `.sharding`; an entry without one spanning several
        devices gets its mask as a JAX array on the default device.
      paths: the variables' paths, for errors.

    Returns:
      A `StatelessMasks` of the same structure (the same object when nothing
      moved).
    """
    tables, boundaries = list(masks.tables), list(masks.boundaries)
    moved = False
    for n, position in enumerate(masks.positions):
        value = values[position]
        sharding = getattr(value, "sharding", None)
        if not _spans_devices(sharding):
            for leaves in (tables, boundaries):
                if isinstance(leaves[n], np.ndarray):
                    leaves[n], moved = jax.numpy.asarray(leaves[n]), True
            continue
        path = "variable" if paths is None else paths[position]
        layout = table_sharding(sharding, value.shape, tables[n].shape, path)
        replicated = jax.sharding.NamedSharding(
            layout.mesh, jax.sharding.PartitionSpec()
        )
        for leaves, where in ((tables, layout), (boundaries, replicated)):
            if getattr(leaves[n], "sharding", None) != where:
                leaves[n], moved = jax.device_put(_host(leaves[n]), where), True
    if not moved:
        return masks
    return masks._replace(tables=tuple(tables), boundaries=tuple(boundaries))


def _host(array):
    """A NumPy array as is; a JAX array on one device read to the host first
    (`device_put` then sends each device only its shard)."""
    if isinstance(array, jax.Array) and len(array.sharding.device_set) == 1:
        return np.asarray(array)
    return array


def bytes_per_device(arrays):
    """`{device: bytes}` that `arrays` (JAX arrays) hold on each device."""
    found = collections.Counter()
    for array in arrays:
        for shard in array.addressable_shards:
            found[str(shard.device)] += shard.data.nbytes
    return dict(found)


def place_masks(masks, variables):
    """`masks` (of `variables`) laid out like the variables (`place`).

    Under a `keras.distribution` each table is split over the devices as its
    variable is; without one, or with variables on one device, the tables
    stay where they are. What `maskfit.stateless_masks` returns.

    Example:

    >>> import keras, maskfit
    >>> model = keras.Sequential([keras.Input((3,)), maskfit.set_mask(
    ...     keras.layers.Dense(2), maskfit.OutputMask([1, 0]))])
    >>> variables = model.trainable_variables
    >>> masks = maskfit.stateless_masks(model)
    >>> place_masks(masks, variables).positions
    (0, 1)
    """
    values = [v.value for v in variables]
    return place(masks, values, [v.path for v in variables])
