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


class _Shapes:
    """The concrete shape of each tensor of a model's graph, as its calls compute them.

    A tensor starts at its symbolic shape, the batch at 1 and every other
    unknown dimension at `unknown_size`; a traced call's outputs take the
    shapes the backend computed, so a call reading them is traced at the
    sizes the model really makes: a relative position table of twice the
    sequence's length, a rotary table its layer declares `(None,)`, frames
    folded into the batch. One size for every unknown dimension fits none
    of these.
    """

    def __init__(self, unknown_size):
        self.unknown_size = unknown_size
        self._found = {}

    def of(self, tensor):
        """`tensor`'s shape for one example."""
        if id(tensor) in self._found:
            return self._found[id(tensor)]
        return self._concrete(tensor.shape)

    def set(self, tensors, shapes):
        """Records the traced `shapes` of `tensors` (nothing if `shapes` is None).

        A dimension a shape leaves unknown (an output spec's batch, on older
        Keras) is taken as for a symbolic shape.
        """
        if shapes is not None and len(shapes) == len(tensors):
            self._found.update(
                (id(t), self._concrete(s)) for t, s in zip(tensors, shapes)
            )

    def _concrete(self, shape):
        shape = _known(tuple(shape), self.unknown_size)
        return (1 if shape[0] is None else shape[0], *shape[1:]) if shape else ()

    def arguments(self, call):
        """`(args, kwargs)` of `call`, each KerasTensor at its shape for one example."""
        return keras.tree.map_structure(
            lambda x: (
                keras.KerasTensor(self.of(x), x.dtype, sparse=x.sparse)
                if isinstance(x, keras.KerasTensor)
                else x
            ),
            (tuple(call.args), dict(call.kwargs)),
        )


def _macs(call, shapes, memo):
    """`(Traced, output shapes)` of a call: its record's MACs if known, else traced."""
    layer = call.layer
    kind = records.builtin(type(layer))
    if kind is not None and kind.macs is not None:
        known = [
            [(None, *shapes.of(t)[1:]) if t.shape else () for t in ts]
            for ts in (call.inputs, call.outputs)
        ]
        # Rows folded into the batch (a video's frames) multiply its work.
        rows = [shapes.of(t)[0] // (t.shape[0] or 1) for t in call.inputs if t.shape]
        macs = macs_of(layer, *known) * max(rows[:1] or [1])
        return tracing.Traced(macs), _output_shapes(call, shapes)
    tensors = [
        x
        for x in keras.tree.flatten((call.args, call.kwargs))
        if isinstance(x, keras.KerasTensor)
    ]
    at = [shapes.of(x) for x in tensors]
    return memo.outcome(
        _signature(layer, shapes.arguments(call), shapes.unknown_size),
        lambda: tracing.traced_call(
            layer, call.args, call.kwargs, shapes.unknown_size, at
        ),
    )


def _output_shapes(call, shapes):
    """A recorded layer's output shapes at its inputs' shapes (None if unknown)."""
    args, kwargs = shapes.arguments(call)
    try:
        outputs = keras.tree.flatten(call.layer.compute_output_spec(*args, **kwargs))
    except Exception:  # noqa: BLE001 - the outputs keep their symbolic shapes
        return None
    return [tuple(y.shape) for y in outputs]


def _signature(layer, arguments, unknown_size):
    """Calls that compute the same thing at the same shapes are traced once."""
    if not isinstance(layer, keras.layers.Layer):
        return None
    arguments = keras.tree.map_structure(
        lambda x: (
            (tuple(x.shape), str(x.dtype))
            if isinstance(x, keras.KerasTensor)
            else repr(x)
        ),
        arguments,
    )
    try:
        return signature.signature(layer, (), repr(arguments), unknown_size)
    except Exception:  # noqa: BLE001 - no signature: traced on its own
        return None


def _sizes(model, shapes, memo, prefix="", counted=None):
    """`{path: (kind, params, macs, notes)}` of every layer call in `model`'s graph.

    Each variable counts once, where the graph first calls a layer that holds
    it: a tied embedding called again as the output projection (keras_hub's
    `ReversibleEmbedding` in a causal LM) adds its MACs, not its parameters
    again, so the parameters add up to `model.count_params()`. Each call is
    traced at the shapes the calls before it computed (`_Shapes`).
    """
    counted = set() if counted is None else counted
    found = {}
    _, calls, _ = keras_graph.graph_of(model)
    for call in calls:
        layer = call.layer
        path = prefix + layer.name
        if keras_graph.is_graph_model(layer):
            inner, _, inner_outputs = keras_graph.graph_of(layer)
            shapes.set(inner, [shapes.of(t) for t in call.inputs])
            found.update(_sizes(layer, shapes, memo, path + "/", counted))
            shapes.set(call.outputs, [shapes.of(t) for t in inner_outputs])
            continue
        new = [v for v in getattr(layer, "weights", ()) if id(v) not in counted]
        counted.update(id(v) for v in new)
        params = sum(size(v) for v in new)  # ops: none
        (macs, note), traced = _macs(call, shapes, memo)
        shapes.set(call.outputs, traced)
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
    before = _sizes(model, _Shapes(int(unknown_size)), memo)
    after = _sizes(shrunk, _Shapes(int(unknown_size)), memo)
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
