"""`size_report`: parameters and multiply-accumulates per layer, before and after `shrink`."""

from typing import NamedTuple

from maskfit.kinds.common import macs_of, size
from maskfit.structured.graph import keras_graph

__all__ = ["LayerSize", "SizeReport", "size_report"]


class LayerSize(NamedTuple):
    """One layer: parameters (all its weights) and MACs per example, before and after."""

    name: str
    kind: str
    params_before: int
    params_after: int
    macs_before: int
    macs_after: int


class SizeReport(NamedTuple):
    """The rows of `size_report` and their totals; `str()` gives the table.

    Example:

    >>> import keras, maskfit.pruning as pruning
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="a"),
    ...                           keras.layers.Dense(2, name="b")])
    >>> small = pruning.shrink(model, pruning.select_units(model, 0.5))
    >>> report = pruning.size_report(model, small)
    >>> report.params_before, report.params_after
    (58, 30)
    >>> print(report)
    Layer  Kind   Params  -> after  MACs  -> after
    ----------------------------------------------
    a      Dense      40        20    32        16
    b      Dense      18        10    16         8
    ----------------------------------------------
    Total             58        30    48        24
    """

    rows: tuple

    @property
    def params_before(self):
        """Parameters of the rows' layers before `shrink`."""
        return sum(r.params_before for r in self.rows)

    @property
    def params_after(self):
        """Parameters of the rows' layers after `shrink`."""
        return sum(r.params_after for r in self.rows)

    @property
    def macs_before(self):
        """Multiply-accumulates per example before `shrink`."""
        return sum(r.macs_before for r in self.rows)

    @property
    def macs_after(self):
        """Multiply-accumulates per example after `shrink`."""
        return sum(r.macs_after for r in self.rows)

    def __str__(self):
        header = ("Layer", "Kind", "Params", "-> after", "MACs", "-> after")
        cells = [header] + [
            (
                r.name,
                r.kind,
                f"{r.params_before:,}",
                f"{r.params_after:,}",
                f"{r.macs_before:,}",
                f"{r.macs_after:,}",
            )
            for r in self.rows
        ]
        cells.append(
            (
                "Total",
                "",
                f"{self.params_before:,}",
                f"{self.params_after:,}",
                f"{self.macs_before:,}",
                f"{self.macs_after:,}",
            )
        )
        widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
        lines = []
        for number, row in enumerate(cells):
            left = [c.ljust(w) for c, w in zip(row[:2], widths[:2])]
            right = [c.rjust(w) for c, w in zip(row[2:], widths[2:])]
            lines.append("  ".join(left + right).rstrip())
            if number in (0, len(cells) - 2):
                lines.append("-" * len(lines[0]))
        return "\n".join(lines)


def _sizes(model, prefix="", counted=None):
    """`{path: (kind, params, macs)}` of every layer call in `model`'s graph.

    Each variable counts once, where the graph first calls a layer that holds
    it: a tied embedding called again as the output projection (keras_hub's
    `ReversibleEmbedding` in a causal LM) adds its MACs, not its parameters
    again, so the parameters add up to `model.count_params()`.
    """
    counted = set() if counted is None else counted
    found = {}
    _, calls, _ = keras_graph.graph_of(model)
    for call in calls:
        layer = call.layer
        path = prefix + layer.name
        if keras_graph.is_graph_model(layer):
            found.update(_sizes(layer, path + "/", counted))
            continue
        new = [v for v in getattr(layer, "weights", ()) if id(v) not in counted]
        counted.update(id(v) for v in new)
        params = sum(size(v) for v in new)  # ops: none
        macs = macs_of(
            layer,
            [tuple(t.shape) for t in call.inputs],
            [tuple(t.shape) for t in call.outputs],
        )
        kind, old_params, old_macs = found.get(path, (type(layer).__name__, 0, 0))
        found[path] = (kind, old_params + params, old_macs + macs)
    return found


def size_report(model, shrunk, print_fn=None):
    """Compares `model` and its `shrink`-ed copy layer by layer.

    Args:
      model: the model before (pruned or not).
      shrunk: the model `shrink` returned.
      print_fn: called with the table's text if given (e.g. `print`).

    Returns:
      A `SizeReport`: `rows` of `LayerSize` (layers with weights or MACs),
      totals, and the table as `str(report)`.

    Example:

    >>> import keras, maskfit.pruning as pruning
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="a"),
    ...                           keras.layers.Dense(2, name="b")])
    >>> small = pruning.shrink(model, pruning.select_units(model, 0.5))
    >>> pruning.size_report(model, small).params_after
    30
    """
    before, after = _sizes(model), _sizes(shrunk)
    rows = []
    for path, (kind, params, macs) in before.items():
        _, params_after, macs_after = after.get(path, (kind, 0, 0))
        if params or macs:
            rows.append(LayerSize(path, kind, params, params_after, macs, macs_after))
    report = SizeReport(tuple(rows))
    if print_fn is not None:
        print_fn(str(report))
    return report
