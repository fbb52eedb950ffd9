"""`size_report`: parameters and multiply-accumulates per layer, before and after `shrink`."""

from typing import NamedTuple

import keras
import numpy as np

from maskfit import records
from maskfit.kinds.common import macs_of, size
from maskfit.kinds.couplings import signature
from maskfit.structured import tracing
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
    """The rows of `size_report`, their totals and notes; `str()` gives the table.

    `notes` holds `(layer, note)` for each call whose MACs may be short (one
    that could not be traced, a loop counted once), printed below the table.

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
    notes: tuple = ()

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
        lines += [f"{name}: MACs {note}" for name, note in self.notes]
        return "\n".join(lines)


def _known(shape, unknown_size):
    """`shape` with its unknown dimensions but the batch at `unknown_size`."""
    return tuple(
        unknown_size if d is None and axis else d for axis, d in enumerate(shape)
    )


def _macs(call, unknown_size, memo):
    """A call's MACs: its record's where the record knows them, else traced."""
    layer = call.layer
    kind = records.builtin(type(layer))
    if kind is not None and kind.macs is not None:
        shapes = [
            [_known(t.shape, unknown_size) for t in ts]
            for ts in (call.inputs, call.outputs)
        ]
        return tracing.Traced(macs_of(layer, *shapes))
    return memo.outcome(
        _signature(call, unknown_size),
        lambda: tracing.traced_macs(layer, call.args, call.kwargs, unknown_size),
    )


def _signature(call, unknown_size):
    """Calls that compute the same thing at the same shapes are traced once."""
    if not isinstance(call.layer, keras.layers.Layer):
        return None
    arguments = keras.tree.map_structure(
        lambda x: (
            (tuple(x.shape), str(x.dtype))
            if isinstance(x, keras.KerasTensor)
            else repr(x)
        ),
        (tuple(call.args), dict(call.kwargs)),
    )
    try:
        return signature.signature(call.layer, (), repr(arguments), unknown_size)
    except Exception:  # noqa: BLE001 - no signature: traced on its own
        return None


def _sizes(model, unknown_size, memo, prefix="", counted=None):
    """`{path: (kind, params, macs, notes)}` of every layer call in `model`'s graph.

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
            found.update(_sizes(layer, unknown_size, memo, path + "/", counted))
            continue
        new = [v for v in getattr(layer, "weights", ()) if id(v) not in counted]
        counted.update(id(v) for v in new)
        params = sum(size(v) for v in new)  # ops: none
        macs, note = _macs(call, unknown_size, memo)
        kind, old_params, old_macs, notes = found.get(
            path, (type(layer).__name__, 0, 0, ())
        )
        notes += (note,) if note and note not in notes else ()
        found[path] = (kind, old_params + params, old_macs + macs, notes)
    return found


def _owner(path, before):
    """The layer of `before` whose stock rewrite `path` is part of (its name's prefix)."""
    owners = [p for p in before if path.startswith(p + "_")]
    return max(owners, key=len) if owners else None


def size_report(model, shrunk, print_fn=None, unknown_size=1):
    """Compares `model` and its `shrink`-ed copy layer by layer.

    Parameters count each variable once (a tied embedding too), so they add
    up to `count_params()`. Multiply-accumulates per example come from the
    layer's record (`maskfit.kinds`: dense, convolutions, attention,
    recurrent layers) or, for every other layer (keras_hub blocks, reversible
    embeddings used as the output projection, your own layers, `keras.ops`
    calls), from the backend's trace of the call (`maskfit.structured.tracing`:
    its matrix products, einsums and convolutions, attention's scores and
    values included). A call whose count is short or that could not be
    traced is listed in `notes`, with why.

    Args:
      model: the model before (pruned or not).
      shrunk: the model `shrink` returned.
      print_fn: called with the table's text if given (e.g. `print`).
      unknown_size: the size taken for each dimension the model leaves
        unknown (None) other than the batch: a language model's sequence
        length, an image side. MACs grow with it (attention's scores with
        its square).

    Returns:
      A `SizeReport`: `rows` of `LayerSize` (layers with weights or MACs),
      totals, `notes` (`(layer, note)` for counts that may be short), and
      the table as `str(report)`.

    Raises:
      ValueError: if `unknown_size` is not a positive integer.

    Example:

    >>> import keras, maskfit.pruning as pruning
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="a"),
    ...                           keras.layers.Dense(2, name="b")])
    >>> small = pruning.shrink(model, pruning.select_units(model, 0.5))
    >>> pruning.size_report(model, small).params_after
    30
    """
    if (
        isinstance(unknown_size, bool)
        or not isinstance(unknown_size, (int, np.integer))
        or unknown_size < 1
    ):
        raise ValueError(
            "size_report's unknown_size (the size of each unknown dimension, such"
            " as a sequence length) must be a positive integer. Received:"
            f" {unknown_size!r}."
        )
    memo = signature.Memo()
    before = _sizes(model, int(unknown_size), memo)
    after = _sizes(shrunk, int(unknown_size), memo)
    # A keras_hub block written out as stock layers (`shrink`'s `StockBlock`)
    # has those layers, named after it, in its place: their sizes are its.
    merged = {path: [0, 0] for path in before}
    extra = {}
    for path, (kind, params, macs, _) in after.items():
        owner = path if path in before else _owner(path, before)
        if owner is None:
            extra[path] = (kind, 0, params, 0, macs)
        else:
            merged[owner][0] += params
            merged[owner][1] += macs
    rows, notes = [], []
    for path, (kind, params, macs, said) in before.items():
        params_after, macs_after = merged[path]
        if params or macs or params_after or macs_after:
            rows.append(LayerSize(path, kind, params, params_after, macs, macs_after))
        notes += [(path, note) for note in said]
    rows += [LayerSize(path, *sizes) for path, sizes in extra.items() if any(sizes[1:])]
    report = SizeReport(tuple(rows), tuple(notes))
    if print_fn is not None:
        print_fn(str(report))
    return report
