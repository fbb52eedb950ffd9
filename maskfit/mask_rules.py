"""The import path of mask rules in maskfit 0.1.0; they live in `maskfit.spec.rules`.

Custom rules subclass `maskfit.mask_rules.MaskRule` (docs/pruning.md); that
path keeps working.
"""

from maskfit.spec.rules import (
    MaskRule,
    RuleGroup,
    get_rule,
    layer_rules,
    resolve_rules,
    set_rule,
)

__all__ = [
    "MaskRule",
    "RuleGroup",
    "get_rule",
    "layer_rules",
    "resolve_rules",
    "set_rule",
]
