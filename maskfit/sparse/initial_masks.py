"""Random sparse masks at given sparsities, drawn from a seed: where training starts.

Dynamic sparse training starts from a random mask at each weight's sparsity
(RigL's `get_mask_random`: exactly `floor(sparsity * size)` zeros, at places
drawn uniformly); static sparse training keeps that mask throughout. The
draw depends only on the seed and the variable's key (`variable_key`, the
CRC-32 of its `LayerSparsity.key`), so the static and dynamic runs of one
seed start from the same mask, in any process and in a model rebuilt from
its config.
"""

import numpy as np

from maskfit.sparse import distributions, drop_and_grow

__all__ = ["random_keep_mask", "random_keep_masks"]


def random_keep_mask(shape, sparsity, seed, key=0, frozen=None):
    """Returns a bool mask with `active_count(size, sparsity)` Trues at random places.

    Args:
      shape: the weight's shape.
      sparsity: its fraction of zeros, in [0, 1).
      seed: a non-negative integer.
      key: a non-negative integer told apart per weight (`variable_key`).
      frozen: None, or a bool array of `shape`: entries that must stay as
        they are (frozen by `maskfit.set_mask`). They are always active and
        count as active; the others are drawn among the rest.

    Returns:
      A numpy bool array of `shape`.

    Raises:
      ValueError: for a bad sparsity or seed, or a `frozen` of another shape.

    Example:

    >>> mask = random_keep_mask((10, 10), 0.8, seed=0)
    >>> int(mask.sum())
    20
    >>> bool((mask == random_keep_mask((10, 10), 0.8, seed=0)).all())
    True
    """
    for name, value in (("seed", seed), ("key", key)):
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, np.integer))
            or value < 0
        ):
            raise ValueError(
                f"random_keep_mask: {name} must be a non-negative integer."
                f" Received: {name}={value!r}"
            )
    shape = tuple(int(d) for d in shape)
    size = int(np.prod(shape))
    distributions.layer_sparsities({"weight": shape}, sparsity, "uniform")  # checks
    active = distributions.active_count(size, sparsity)
    flat = np.zeros(size, bool)
    if frozen is not None:
        frozen = np.asarray(frozen, bool)
        if frozen.shape != shape:
            raise ValueError(
                f"random_keep_mask: frozen must have the weight's shape {shape}."
                f" Received shape {frozen.shape}"
            )
        flat |= frozen.ravel()
    free = np.flatnonzero(~flat)
    needed = max(active - int(flat.sum()), 0)
    rng = np.random.default_rng([int(seed), int(key)])
    flat[rng.choice(free, size=needed, replace=False)] = True
    return flat.reshape(shape)


def random_keep_masks(entries, seed, frozen=None):
    """Returns one `random_keep_mask` per `LayerSparsity` of `entries` (from `allocate`).

    Each is keyed by `variable_key(entry.key)`. `frozen` is None or one bool
    array (or None) per entry: the entries `maskfit.set_mask` freezes, which
    are kept (see `random_keep_mask`).

    Example:

    >>> import keras
    >>> from maskfit.sparse import allocation
    >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    >>> entries = allocation.allocate(model, 0.5, "uniform")
    >>> [int(m.sum()) for m in random_keep_masks(entries, seed=3)]
    [16]
    """
    entries = list(entries)
    frozen = [None] * len(entries) if frozen is None else list(frozen)
    if len(frozen) != len(entries):
        raise ValueError(
            f"random_keep_masks: frozen must have one entry per weight"
            f" ({len(entries)}). Received {len(frozen)}."
        )
    return [
        random_keep_mask(
            tuple(e.variable.shape),
            e.sparsity,
            seed,
            drop_and_grow.variable_key(e.key),
            frozen=f,
        )
        for e, f in zip(entries, frozen)
    ]
