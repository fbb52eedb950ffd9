"""Which sparsity each prunable weight of a model gets, at a global target.

`allocate` lists a model's (or a layer's) prunable weights, as
`maskfit.pruning.prunable_weights` finds them (kernels and embeddings, never
biases or normalization parameters; trainable ones only), and gives each the
sparsity of a
distribution of `maskfit.sparse.distributions` (uniform, Erdos-Renyi, ERK),
with the first layer dense on request and per-layer overrides, as RigL's
`mask_init_method`, `first_layer_sparsity=0` and `custom_sparsity_map`.
"""

import collections

import numpy as np

from maskfit import paths, pruning
from maskfit.sparse import distributions

__all__ = ["LayerSparsity", "allocate", "overall_sparsity"]


class LayerSparsity(
    collections.namedtuple(
        "LayerSparsity", ["layer", "variable", "sparsity", "active", "key"]
    )
):
    """The sparsity of one prunable weight.

    Attributes:
      layer: the layer that owns the weight (e.g. a `Dense`, an `LSTMCell`).
      variable: the weight.
      sparsity: its fraction of zeros, a float in [0, 1).
      active: how many of its entries are active (`active_count`).
      key: the weight's name under the allocated layer, its layer path and
        name (`"dense_1/kernel"`), as maskfit keys saved state: the same in a
        model rebuilt from its config, so random draws keyed by it are too.

    Example:

    >>> import keras, maskfit.sparse as sparse
    >>> model = keras.Sequential([keras.Input((40,)), keras.layers.Dense(100, name="a"),
    ...                           keras.layers.Dense(10, name="b")])
    >>> first = sparse.allocate(model, 0.8)[0]
    >>> first.layer.name, first.key, round(first.sparsity, 2), first.active
    ('a', 'a/kernel', 0.86, 560)
    """


def allocate(
    layer,
    sparsity,
    distribution="erdos_renyi_kernel",
    dense_first_layer=False,
    custom_sparsity_map=None,
    erk_power_scale=1.0,
    exclude=(),
):
    """Returns a `LayerSparsity` per prunable weight of `layer`, in model order.

    The budget is RigL's: the weights not named by `custom_sparsity_map` or
    `dense_first_layer` keep as many entries in all as they would at
    `sparsity` each; the named ones take their own sparsity on top. As in
    RigL, a layer keeps `size - floor(sparsity * size)` entries in float64,
    so a scaled sparsity a rounding below its exact value (0.9299999999999999
    for 0.93) keeps one entry more.

    Args:
      layer: a built `keras.Model` or layer.
      sparsity: the target fraction of zeros, in [0, 1).
      distribution: "uniform", "erdos_renyi" or "erdos_renyi_kernel".
      dense_first_layer: keep the first layer that owns prunable weights
        dense (RigL's `first_layer_sparsity=0`).
      custom_sparsity_map: None, or `{layer name: sparsity}` for layers that
        own prunable weights (0 keeps a layer dense).
      erk_power_scale: as for `layer_sparsities`.
      exclude: weights to leave out of the allocation and its budget (those
        another rule covers, e.g. a layer pruned by `prune_low_magnitude`).
        Non-trainable weights are always left out.

    Returns:
      A list of `LayerSparsity`.

    Raises:
      ValueError: as `prunable_weights` does (unbuilt or unsupported layers),
        when `layer` has no prunable weights, for a custom entry that names no
        such layer or a name two of them share, and as `layer_sparsities` does.

    Example:

    >>> import keras
    >>> model = keras.Sequential([keras.Input((40,)), keras.layers.Dense(100),
    ...                           keras.layers.Dense(10)])
    >>> [(e.layer.name, round(e.sparsity, 2), e.active)
    ...  for e in allocate(model, 0.8)]
    [('dense', 0.86, 560), ('dense_1', 0.56, 440)]
    """
    left_out = {id(v) for v in exclude}
    owners = [
        (owner, [v for v in variables if v.trainable and id(v) not in left_out])
        for owner, variables in pruning.prunable_layers(layer)
    ]
    entries = [(owner, v) for owner, variables in owners for v in variables]
    if not entries:
        raise ValueError(
            f"Layer '{layer.name}' has no prunable weights (trainable kernels or"
            " embeddings that no other rule covers), so there is nothing to make"
            " sparse."
        )
    variables = [v for _, v in entries]
    keys = dict(zip(map(id, variables), paths.variable_keys(layer, variables)))
    custom = _custom_by_key(owners, keys, dense_first_layer, custom_sparsity_map)
    shapes = {keys[id(v)]: tuple(v.shape) for _, v in entries}
    sparsities = distributions.layer_sparsities(
        shapes, sparsity, distribution, custom, erk_power_scale
    )
    found = []
    for owner, v in entries:
        key = keys[id(v)]
        size = int(np.prod(v.shape))
        found.append(
            LayerSparsity(
                owner,
                v,
                sparsities[key],
                distributions.active_count(size, sparsities[key]),
                key,
            )
        )
    return found


def overall_sparsity(entries):
    """The fraction of zeros over all weights of `entries` (from `allocate`).

    Example:

    >>> import keras, maskfit.sparse as sparse
    >>> model = keras.Sequential([keras.Input((40,)), keras.layers.Dense(100, name="a"),
    ...                           keras.layers.Dense(10, name="b")])
    >>> round(sparse.overall_sparsity(sparse.allocate(model, 0.8)), 4)
    0.8
    >>> dense_a = sparse.allocate(model, 0.8, dense_first_layer=True)
    >>> round(sparse.overall_sparsity(dense_a), 4)  # b's 800 zeros of 5000 weights
    0.16
    """
    size = sum(int(np.prod(e.variable.shape)) for e in entries)
    return 1.0 - sum(e.active for e in entries) / size


def _custom_by_key(owners, keys, dense_first_layer, custom_sparsity_map):
    """`{variable key: sparsity}` from layer names, checked."""
    if not isinstance(dense_first_layer, bool):
        raise ValueError(
            f"dense_first_layer must be True or False. Received: {dense_first_layer!r}"
        )
    if custom_sparsity_map is None:
        custom_sparsity_map = {}
    if not isinstance(custom_sparsity_map, dict):
        raise ValueError(
            "custom_sparsity_map must be a dict from layer names to sparsities."
            f" Received: {custom_sparsity_map!r}"
        )
    by_name = collections.defaultdict(list)
    for owner, variables in owners:
        if variables:
            by_name[owner.name].append(variables)
    for name in custom_sparsity_map:
        if name not in by_name:
            raise ValueError(
                f"custom_sparsity_map names layer {name!r}, which owns no prunable"
                f" weight here; the layers that do are {list(by_name)}."
            )
        if len(by_name[name]) > 1:
            raise ValueError(
                f"custom_sparsity_map names layer {name!r}, but {len(by_name[name])}"
                " layers with prunable weights have that name. Give them unique"
                " names."
            )
    first = next(owner for owner, variables in owners if variables)
    if dense_first_layer and first.name in custom_sparsity_map:
        raise ValueError(
            f"dense_first_layer=True keeps layer '{first.name}' dense, but"
            f" custom_sparsity_map also gives it"
            f" {custom_sparsity_map[first.name]!r}. Pass one of them."
        )
    custom = {}
    for owner, variables in owners:
        if dense_first_layer and owner is first:
            value = 0.0
        elif owner.name in custom_sparsity_map:
            value = custom_sparsity_map[owner.name]
        else:
            continue
        custom.update({keys[id(v)]: value for v in variables})
    return custom
