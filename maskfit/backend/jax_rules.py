"""Mask rules in the JAX step: keep masks computed on the host at update steps.

`HostRules` (`maskfit.backend.host_rules`, the part every backend shares)
over the JAX step's state: before the compiled step of an update step, the
due rules' keep masks are computed on the host from NumPy arrays, the
dropped weights set to +0.0 in the state, and the keep masks joined to the
step's `StatelessMasks`, each table laid out like its variable
(`maskfit.backend.sharding.place`). A rule that `uses_gradients` (RigL)
updates after its step's update from the dense gradients (of the loss as
`optimizer.scale_loss` scaled it, not masked), which a second compiled
variant of the step returns, run on its update steps only
(`maskfit.backend.rule_calls`).
"""

import jax

from maskfit.backend import host_rules, sharding

__all__ = ["HostRules", "with_keeps"]


class HostRules(host_rules.HostRules):
    """The mask rules of one model's JAX step, run on the host at their update steps.

    Args:
      model: a `MaskedModel` whose rules the JAX backend runs.

    Example:

    >>> import keras, maskfit.pruning as pruning
    >>> model = pruning.prune_low_magnitude(
    ...     keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
    >>> len(HostRules(model).groups)
    1
    """

    def _where(self, keep, value, other):
        """`where(keep, value, other)` as a JAX array on `value`'s devices."""
        other = jax.numpy.asarray(other, value.dtype)
        return jax.device_put(jax.numpy.where(keep, value, other), value.sharding)

    def _join(self, masks, keeps, values):
        return with_keeps(masks, keeps, values=values)


def with_keeps(masks, keeps, values=None):
    """`masks` with the keep masks `{position: bool array}` joined: dropped = frozen.

    With the variables' `values` (the step's state), each table goes from
    the host straight to the devices, laid out like its variable
    (`maskfit.backend.sharding.place`).

    Example:

    >>> import numpy as np
    >>> from maskfit.step import stateless
    >>> masks = stateless.StatelessMasks((), (), (), (), 1)
    >>> with_keeps(masks, {0: np.array([True, False])}).positions
    (0,)
    """
    if not keeps:
        return masks
    if values is None:
        return host_rules.join_keeps(masks, keeps, jax.numpy.asarray)
    return sharding.place(host_rules.join_keeps(masks, keeps, lambda a: a), values)
