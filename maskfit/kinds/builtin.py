"""Every family's layer kinds, each class once, installed as maskfit's built-in records.

`install()` runs once, when maskfit is imported (`maskfit/__init__.py`).
A new Keras layer kind is one `LayerKind` in the module of its family;
the test sweeps in `tests/test_output_units.py`, `tests/test_pruning_registry.py`
and `tests/test_pruning_units_shrink.py` check it against the layer's real
gradients and against every class `keras.layers` exports.
"""

from maskfit import records
from maskfit.kinds import (
    applications,
    attention,
    conv,
    dense,
    elementwise,
    normalization,
    ops,
    recurrent,
    refused,
    reshaping,
    wrappers,
)

__all__ = ["FAMILIES", "KINDS", "install"]

FAMILIES = (
    dense,
    conv,
    normalization,
    elementwise,
    reshaping,
    recurrent,
    wrappers,
    attention,
    refused,
    applications,
)


def _merged():
    kinds = {}
    for family in FAMILIES:
        twice = sorted(c.__name__ for c in set(kinds) & set(family.KINDS))
        if twice:
            raise ValueError(
                f"Layer classes {twice} have a record in {family.__name__} and in"
                " another family: each class has one record."
            )
        kinds.update(family.KINDS)
    return kinds


KINDS = _merged()


def install():
    """Installs `KINDS` (and the `keras.ops` couplings) as the built-in records."""
    records.install(KINDS)
    records.install_ops(ops.OPS)
