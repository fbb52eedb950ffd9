"""`summary`: how many of a model's parameters can still learn once masks apply."""

import dataclasses
from typing import NamedTuple

import keras
import numpy as np

from maskfit.model import training as model_lib
from maskfit.spec import declare, rules
from maskfit.step import declared

__all__ = ["summary", "Summary", "SummaryRow"]


class SummaryRow(NamedTuple):
    """One trainable variable: its size, and how much of it can learn.

    `learnable + frozen == params`; `shared` counts the learnable entries of
    an `OutputMask` layer that affect several output units, which the mask
    never freezes; `pruned` counts the entries a rule dropped: pruning's
    (frozen at 0), or those sparse training (`maskfit.sparse`) holds at 0
    now and may grow back; both count in `frozen` too.

    Example:

    >>> import keras, maskfit
    >>> inputs = keras.Input((3,))
    >>> head = maskfit.set_mask(keras.layers.Dense(2, name="head"), maskfit.OutputMask([1, 0]))
    >>> model = keras.Model(inputs, head(inputs))
    >>> kernel = maskfit.summary(model, print_fn=None).rows[0]
    >>> kernel
    SummaryRow(path='head/kernel', shape=(3, 2), params=6, learnable=3, mask_kind='output', shared=0, pruned=0)
    >>> kernel.frozen, kernel.sparsity
    (3, 0.0)
    """

    path: str
    shape: tuple
    params: int
    learnable: int
    mask_kind: str  # "none", "output" or "element"; "+pruned" / "+sparse" for a rule's
    shared: int = 0
    pruned: int = 0

    @property
    def frozen(self):
        """Entries whose mask is 0: they do not change in the next step."""
        return self.params - self.learnable

    @property
    def sparsity(self):
        """The fraction of the variable a rule holds at 0 (`pruned / params`)."""
        return self.pruned / self.params if self.params else 0.0


@dataclasses.dataclass(frozen=True)
class Summary:
    """The rows of `maskfit.summary` and their totals.

    Attributes:
      rows: one `SummaryRow` per trainable variable, in the model's order.
      trainable_params: parameters in trainable variables.
      learnable_params: those whose mask value is > 0 (no mask: all), the
        effective trainable parameter count.
      non_trainable_params: parameters in non-trainable variables.
      shared_params: learnable parameters of `OutputMask` layers shared by
        several output units (never frozen by the mask).
      pruned_params: parameters a rule dropped (`maskfit.pruning`,
        `maskfit.sparse`), included in the frozen ones.

    Example:

    >>> import keras, maskfit
    >>> inputs = keras.Input((3,))
    >>> head = maskfit.set_mask(keras.layers.Dense(2, name="head"), maskfit.OutputMask([1, 0]))
    >>> model = keras.Model(inputs, head(inputs))
    >>> result = maskfit.summary(model, print_fn=None)
    >>> result.trainable_params, result.learnable_params, result.frozen_params
    (8, 4, 4)
    >>> [(row.path, row.learnable) for row in result.rows]
    [('head/kernel', 3), ('head/bias', 1)]
    """

    rows: tuple
    trainable_params: int
    learnable_params: int
    non_trainable_params: int
    shared_params: int = 0
    pruned_params: int = 0

    @property
    def frozen_params(self):
        """Trainable parameters whose mask is 0: they never change in training."""
        return self.trainable_params - self.learnable_params

    @property
    def total_params(self):
        """Parameters in all variables, trainable or not."""
        return self.trainable_params + self.non_trainable_params


def _counts(shape, entry, keep):
    """`(learnable, shared)` entries of a variable of `shape` under `entry` and `keep`."""
    learns = (
        np.ones(shape, bool)
        if entry is None
        else np.broadcast_to(entry.mask, shape) > 0
    )
    if keep is not None:
        learns = learns & keep
    shared = 0
    if entry is not None and entry.shared is not None:
        shared = np.broadcast_to(entry.shared, shape)
        shared = int((shared if keep is None else shared & keep).sum())
    return int(np.count_nonzero(learns)), shared


def summary(model, print_fn=print, step=None):
    """Prints, and returns, what each trainable variable of `model` can learn.

    For every trainable variable: its path, shape and parameter count, how
    many of its entries can still learn after the masks declared with
    `maskfit.set_mask` (an entry learns when its mask value is > 0) and how
    many are frozen, how many of the learnable ones an `OutputMask` leaves
    free because they are shared by several output units, how many a rule
    dropped and the variable's sparsity (pruning, `maskfit.pruning`, or
    sparse training, `maskfit.sparse`, whose dropped entries may grow back),
    and the kind of mask on it (`none`, `output` or `element`, with
    `+pruned` or `+sparse` for a variable a rule covers). The totals give the
    effective number of trainable parameters.

    Args:
      model: a built Keras model (or layer).
      print_fn: called with each line of the table; `None` prints nothing.
      step: the optimizer step at which to read scheduled masks
        (`maskfit.PiecewiseMask`); by default the model's optimizer's current
        `iterations`, or 0 before it is built.

    Returns:
      A `Summary` with `.rows` and the totals.

    Raises:
      ValueError: if the model is not built, or a mask does not fit its layer.

    Example:

    >>> import keras, maskfit
    >>> from maskfit.summary import summary
    >>> inputs = keras.Input((3,))
    >>> head = maskfit.set_mask(keras.layers.Dense(2), maskfit.OutputMask([1, 0]))
    >>> model = keras.Model(inputs, head(inputs))
    >>> result = summary(model, print_fn=None)
    >>> result.trainable_params, result.learnable_params
    (8, 4)
    """
    if not model.built:
        raise ValueError(
            f"maskfit.summary needs a built model, and '{model.name}' is not built."
            " Call it on data or call model.build(input_shape) first."
        )
    variables = model_lib.all_trainable_variables(model)
    if step is None:
        optimizer = getattr(model, "optimizer", None)
        built = optimizer is not None and optimizer.built
        step = int(keras.ops.convert_to_numpy(optimizer.iterations)) if built else 0
    entries = declared.resolve_masks(declare.masked_layers(model), variables, step=step)
    regrows = {
        index: bool(getattr(group.rule, "regrows", False))
        for group in rules.resolve_rules(rules.layer_rules(model), variables)
        for index in group.indices
    }
    pruned = set(regrows)
    keeps = model_lib.keep_masks(model)
    rows = []
    for index, variable in enumerate(variables):
        shape = tuple(variable.shape)
        params = int(np.prod(shape, dtype=int))
        entry = entries.get(index)
        keep = keeps.get(index) if index in pruned else None
        kind = "none" if entry is None else entry.kind
        learnable, shared = _counts(shape, entry, keep)
        dropped = 0
        if index in pruned:
            rule_kind = "sparse" if regrows[index] else "pruned"
            kind = rule_kind if entry is None else f"{kind}+{rule_kind}"
            dropped = 0 if keep is None else int(keep.size - np.count_nonzero(keep))
        rows.append(
            SummaryRow(variable.path, shape, params, learnable, kind, shared, dropped)
        )
    result = Summary(
        rows=tuple(rows),
        trainable_params=sum(r.params for r in rows),
        learnable_params=sum(r.learnable for r in rows),
        non_trainable_params=sum(
            int(np.prod(v.shape, dtype=int))
            for v in model.non_trainable_variables
            if not any(v is t for t in variables)
        ),
        shared_params=sum(r.shared for r in rows),
        pruned_params=sum(r.pruned for r in rows),
    )
    if print_fn is not None:
        for line in _table(model.name, result):
            print_fn(line)
    return result


def _ruled(row, kinds=("pruned", "sparse")):
    """Whether a rule of one of `kinds` covers the row's variable."""
    return row.mask_kind.endswith(kinds)


def _table(name, result):
    pruning = any(_ruled(r) for r in result.rows)
    header = (
        (
            "Variable (path)",
            "Shape",
            "Params",
            "Learnable",
            "Frozen",
            "Shared",
        )
        + (("Pruned", "Sparsity") if pruning else ())
        + ("Mask",)
    )
    cells = [header] + [
        (
            r.path,
            str(r.shape),
            f"{r.params:,}",
            f"{r.learnable:,}",
            f"{r.frozen:,}",
            f"{r.shared:,}" if r.mask_kind.startswith("output") else "-",
        )
        + (
            ((f"{r.pruned:,}", f"{100 * r.sparsity:.1f}%") if _ruled(r) else ("-", "-"))
            if pruning
            else ()
        )
        + (r.mask_kind,)
        for r in result.rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]

    def line(row):
        left = [c.ljust(w) for c, w in zip(row[:2], widths[:2])]
        right = [c.rjust(w) for c, w in zip(row[2:-1], widths[2:-1])]
        return "  ".join(left + right + [row[-1].ljust(widths[-1])]).rstrip()

    rule = "-" * len(line(header))
    yield f'Masked summary: "{name}"'
    yield rule.replace("-", "=")
    yield line(header)
    yield rule
    for row in cells[1:]:
        yield line(row)
    yield rule.replace("-", "=")
    yield f" Trainable params: {result.trainable_params:,}"
    yield (
        f" Learnable params (after masks): {result.learnable_params:,}"
        f" ({result.frozen_params:,} frozen)"
    )
    for kind, what in (
        ("pruned", "Pruned params (frozen at 0)"),
        ("sparse", "Sparse training, params at 0 (they may grow back)"),
    ):
        rows = [r for r in result.rows if _ruled(r, kind)]
        if rows:
            dropped = sum(r.pruned for r in rows)
            total = sum(r.params for r in rows)
            yield f" {what}: {dropped:,} of {total:,} ({100 * dropped / total:.1f}%)"
    if any(r.mask_kind.startswith("output") for r in result.rows):
        yield (
            f" Shared by several output units (OutputMask leaves them learning):"
            f" {result.shared_params:,}"
        )
    yield f" Non-trainable params: {result.non_trainable_params:,}"
