"""How many units a pruned network keeps: Torch-Pruning's width rule, as architectures.

`pruned_width` is the rule for one group of coupled units; `shrunk` applies
it to every prunable group of an `experiments.common.structured.models` network and
returns the smaller architecture, which both frameworks build and which a
pruned-and-shrunk model must match, layer shape for layer shape.
"""

import dataclasses

import numpy as np

from experiments.common.structured.models import MLP

__all__ = ["pruned_width", "shrunk"]


def pruned_width(width, fraction, round_to=1):
    """Units a group of `width` keeps when `fraction` of them is pruned.

    Torch-Pruning's rule (1.6, local pruning): keep `int(width * (1 -
    fraction))` units, rounded down to a multiple of `round_to`.

    Example:

    >>> pruned_width(1024, 0.75, 8), pruned_width(20, 0.5, 8), pruned_width(16, 0.3)
    (256, 8, 11)
    """
    kept = int(width * (1 - fraction))
    return kept - kept % round_to


def shrunk(arch, fraction, round_to=1):
    """`arch` with `fraction` of every prunable unit group removed (`pruned_width`).

    The groups are each hidden layer of an MLP; of a ResNet, each stage's
    residual width (the stem or shortcut, every block's second convolution
    and what the additions join) and each block's first convolution. The
    logits are not pruned.

    Raises:
      ValueError: if a group would keep no unit.

    Example:

    >>> shrunk(MLP(64, hidden=(1024, 1024)), 0.5).hidden
    (512, 512)
    """

    def keep(width):
        kept = pruned_width(width, fraction, round_to)
        if kept < 1:
            raise ValueError(
                f"Pruning {fraction!r} of {width} units in multiples of"
                f" round_to={round_to} keeps none; use a smaller fraction or"
                " round_to, or a wider network."
            )
        return kept

    if isinstance(arch, MLP):
        return dataclasses.replace(arch, hidden=tuple(keep(w) for w in arch.hidden))
    inner = arch.inner_widths or tuple(np.repeat(arch.widths, arch.blocks).tolist())
    return dataclasses.replace(
        arch,
        widths=tuple(keep(w) for w in arch.widths),
        inner_widths=tuple(keep(w) for w in inner),
    )
