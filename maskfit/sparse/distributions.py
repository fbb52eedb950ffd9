"""Per-layer sparsities at a global budget: uniform, Erdos-Renyi and ERK, as RigL.

`layer_sparsities` is RigL's `sparse_utils.get_sparsities` (Evci et al.,
ICML 2020; google-research/rigl) for named weight shapes: the same
sparsities, in float64, from the same formula and the same iteration.

- "uniform" (RigL's `mask_init_method="random"`): every layer at the target.
- "erdos_renyi": a layer's density is proportional to
  `(n_in + n_out) / (n_in * n_out)`, its last two dimensions.
- "erdos_renyi_kernel" (ERK): proportional to
  `(sum(shape) / prod(shape)) ** erk_power_scale`, so a convolution's kernel
  size counts too.

For the scaled distributions one factor `eps` is solved so that the layers
keep as many weights in all as the uniform distribution would:
`eps * sum_i(p_i * N_i) = sum_i(N_i - floor(sparsity * N_i))` over the layers
not in `custom_sparsity_map`. A layer whose density `eps * p_i` would exceed
1 becomes dense (all layers sharing the largest `p_i` at once), its weights
count against the budget, and `eps` is solved again for the others. Layers of
`custom_sparsity_map` take their own sparsity and stay out of the budget, as in
RigL (so a dense first layer adds its weights on top of the target).
"""

import math
import numbers

import numpy as np

__all__ = ["DISTRIBUTIONS", "active_count", "check_arguments", "layer_sparsities"]

DISTRIBUTIONS = ("uniform", "erdos_renyi", "erdos_renyi_kernel")
"""The names of the per-layer sparsity distributions, as the module describes them."""


def active_count(size, sparsity):
    """How many of `size` entries stay active at `sparsity`, as RigL rounds.

    RigL drops `floor(sparsity * size)` entries (`sparse_utils.get_n_zeros`,
    in float64) and keeps the rest.

    Example:

    >>> active_count(100, 0.8), active_count(10, 0.95)
    (20, 1)
    """
    return int(size) - int(np.floor(sparsity * size))


def layer_sparsities(
    shapes,
    sparsity,
    distribution="erdos_renyi_kernel",
    custom_sparsity_map=None,
    erk_power_scale=1.0,
):
    """Returns `{name: sparsity}` for named weight shapes, as RigL's `get_sparsities`.

    Args:
      shapes: a dict from a layer's or variable's name to its weight shape
        (a tuple of positive integers), in model order.
      sparsity: the target fraction of zeros, in [0, 1).
      distribution: one of `DISTRIBUTIONS`.
      custom_sparsity_map: None, or a dict from names of `shapes` to their own
        sparsity in [0, 1) (0 keeps that weight dense), left out of the budget.
      erk_power_scale: the power of ERK's ratio (below 1 flattens it), > 0.

    Returns:
      A dict with the keys of `shapes`, in their order, to float sparsities
      in [0, 1).

    Raises:
      ValueError: for a bad sparsity, distribution, shape, power or custom
        entry (naming it), or "erdos_renyi" on a weight of rank below 2.

    Example:

    >>> s = layer_sparsities({"a": (40, 100), "b": (100, 10)}, 0.9)
    >>> {k: round(v, 4) for k, v in s.items()}
    {'a': 0.93, 'b': 0.78}
    >>> layer_sparsities({"a": (40, 100), "b": (100, 10)}, 0.9, "uniform")
    {'a': 0.9, 'b': 0.9}
    """
    shapes = _check_shapes(shapes)
    custom = check_arguments(
        sparsity, distribution, custom_sparsity_map, erk_power_scale
    )
    unknown = sorted(set(custom) - set(shapes))
    if unknown:
        raise ValueError(
            f"custom_sparsity_map names {unknown}, which are not among the"
            f" weights {list(shapes)}. Use their names."
        )
    if distribution == "uniform":
        scaled = {}
    else:
        scaled = _scaled(shapes, sparsity, distribution, custom, erk_power_scale)
    result = {}
    for name in shapes:
        if name in custom:
            result[name] = float(custom[name])
        elif distribution == "uniform":
            result[name] = float(sparsity)
        else:
            result[name] = scaled[name]
    return result


def check_arguments(sparsity, distribution, custom_sparsity_map, erk_power_scale):
    """Raises ValueError for a bad argument of `layer_sparsities` but `shapes`.

    Returns:
      `custom_sparsity_map` as a (new) dict, `{}` for None.
    """
    _check_sparsity("sparsity", sparsity)
    if custom_sparsity_map is not None and not isinstance(custom_sparsity_map, dict):
        raise ValueError(
            "custom_sparsity_map must be None or a dict from names to sparsities."
            f" Received: {custom_sparsity_map!r}"
        )
    custom = dict(custom_sparsity_map or {})
    for name, value in custom.items():
        _check_sparsity(f"custom_sparsity_map[{name!r}]", value)
    if not (
        isinstance(erk_power_scale, numbers.Real)
        and not isinstance(erk_power_scale, bool)
        and math.isfinite(erk_power_scale)
        and erk_power_scale > 0
    ):
        raise ValueError(
            "erk_power_scale must be a positive number. Received:"
            f" erk_power_scale={erk_power_scale!r}"
        )
    if distribution == "random":
        raise ValueError(
            "distribution='random' is RigL's name for the uniform distribution;"
            " pass distribution='uniform'."
        )
    if distribution not in DISTRIBUTIONS:
        raise ValueError(
            f"distribution must be one of {', '.join(map(repr, DISTRIBUTIONS))}."
            f" Received: distribution={distribution!r}"
        )
    return custom


def _raw_probability(shape, distribution, power):
    if distribution == "erdos_renyi_kernel":
        return (np.sum(shape) / np.prod(shape)) ** power
    n_in, n_out = shape[-2:]
    return (n_in + n_out) / (n_in * n_out)


def _scaled(shapes, sparsity, distribution, custom, power):
    """RigL's `get_sparsities_erdos_renyi`: layers made dense until eps is valid."""
    if distribution == "erdos_renyi":
        low = [name for name, shape in shapes.items() if len(shape) < 2]
        if low:
            raise ValueError(
                f"distribution='erdos_renyi' scales by a weight's last two"
                f" dimensions, but {low} have rank 1. Use 'erdos_renyi_kernel' or"
                " 'uniform', or give them a custom_sparsity_map entry."
            )
    dense = set()
    while True:
        divisor, rhs, raw = 0.0, 0.0, {}
        for name, shape in shapes.items():
            size = int(np.prod(shape))
            zeros = size - active_count(size, sparsity)
            if name in dense:
                rhs -= zeros
            elif name not in custom:
                rhs += size - zeros
                raw[name] = _raw_probability(shape, distribution, power)
                divisor += raw[name] * size
        if not raw:
            # Every layer became dense (sparsity near 0): nothing left to scale.
            break
        eps = rhs / divisor
        largest = max(raw.values())
        if largest * eps > 1:
            dense.update(name for name, p in raw.items() if p == largest)
        else:
            break
    return {
        name: 0.0 if name in dense else float(1.0 - eps * raw[name])
        for name in shapes
        if name not in custom
    }


def _check_shapes(shapes):
    if not isinstance(shapes, dict) or not shapes:
        raise ValueError(
            "shapes must be a non-empty dict from weight names to shapes."
            f" Received: {shapes!r}"
        )
    checked = {}
    for name, shape in shapes.items():
        try:
            dims = tuple(shape)
        except TypeError:
            dims = ()
        if not dims or not all(
            isinstance(d, numbers.Integral) and not isinstance(d, bool) and d > 0
            for d in dims
        ):
            raise ValueError(
                f"The shape of weight {name!r} must be a non-empty tuple of"
                f" positive integers. Received: {shape!r}"
            )
        checked[name] = tuple(int(d) for d in dims)
    return checked


def _check_sparsity(what, value):
    if not (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and 0.0 <= value < 1.0
    ):
        raise ValueError(
            f"{what} must be a number in [0, 1), the fraction of weights that are"
            f" zero. Received: {value!r}"
        )
