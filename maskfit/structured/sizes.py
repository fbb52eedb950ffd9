"""`size_report`: parameters and multiply-accumulates per layer, before and after `shrink`."""

import math
from typing import NamedTuple

import numpy as np

from maskfit import internals
from maskfit.structured import keras_graph
from maskfit.units.keras_layers import LAYERS as L

__all__ = ["LayerSize", "SizeReport", "macs_of", "size_report"]


class LayerSize(NamedTuple):
    """One layer: parameters (all its weights) and MACs per example, before and after."""

    name: str
    kind: str
    params_before: int
    params_after: int
    macs_before: int
    macs_after: int


class SizeReport(NamedTuple):
    """The rows of `size_report` and their totals; `str()` gives the table."""

    rows: tuple

    @property
    def params_before(self):
        return sum(r.params_before for r in self.rows)

    @property
    def params_after(self):
        return sum(r.params_after for r in self.rows)

    @property
    def macs_before(self):
        return sum(r.macs_before for r in self.rows)

    @property
    def macs_after(self):
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


def _count(shape):
    return int(np.prod([1 if d is None else d for d in shape[1:]], dtype=np.int64))


def _weight(layer, name):
    return next((v for v in layer.weights if v.name == name), None)


def _size(variable):
    return 0 if variable is None else int(np.prod(variable.shape, dtype=np.int64))


def macs_of(layer, input_shapes, output_shapes):
    """Multiply-accumulates of one call of `layer`, per example (batch of 1).

    Counted for the layers with weight products (dense, einsum, convolutions
    and their transposes, depthwise and separable, recurrent, attention,
    wrappers); normalization, activations, pooling and merges count 0, as
    do embeddings (a lookup).
    """
    out = _count(output_shapes[0]) if output_shapes else 0
    cls = type(layer)
    if cls is L.Dense:
        return out * _weight(layer, "kernel").shape[0]
    if cls is L.EinsumDense:
        kernel = _weight(layer, "kernel")
        own = kernel.shape[-1] if kernel is not None else 1
        return out * _size(kernel) // max(own, 1) if kernel is not None else 0
    if cls in (L.Conv1D, L.Conv2D, L.Conv3D):
        kernel = _weight(layer, "kernel")
        return out * _size(kernel) // kernel.shape[-1]
    if cls in (L.Conv1DTranspose, L.Conv2DTranspose, L.Conv3DTranspose):
        kernel = _weight(layer, "kernel")
        return _count(input_shapes[0]) * _size(kernel) // kernel.shape[-1]
    if cls in (L.DepthwiseConv1D, L.DepthwiseConv2D):
        kernel = _weight(layer, "kernel")
        return out * math.prod(kernel.shape[:-2])
    if cls in (L.SeparableConv1D, L.SeparableConv2D):
        depthwise = _weight(layer, "depthwise_kernel")
        pointwise = _weight(layer, "pointwise_kernel")
        positions = out // pointwise.shape[-1]
        return positions * (_size(depthwise) + _size(pointwise))
    if cls in (L.SimpleRNN, L.LSTM, L.GRU, L.RNN):
        steps = input_shapes[0][1] or 1
        cell = layer.cell
        return steps * sum(
            _size(_weight(cell, n)) for n in ("kernel", "recurrent_kernel")
        )
    if cls is L.Bidirectional:
        return sum(
            macs_of(inner, input_shapes, output_shapes)
            for inner in (layer.forward_layer, layer.backward_layer)
        )
    if cls is L.TimeDistributed:
        steps = input_shapes[0][1] or 1
        inner_in = [tuple(s[:1]) + tuple(s[2:]) for s in input_shapes]
        inner_out = [tuple(s[:1]) + tuple(s[2:]) for s in output_shapes]
        return steps * macs_of(layer.layer, inner_in, inner_out)
    if cls is L.MultiHeadAttention:
        return _attention_macs(layer, input_shapes)
    return 0


def _attention_macs(layer, shapes):
    total = 0
    queries = _count(shapes[0][:-1] + (1,))
    keys = _count(shapes[-1][:-1] + (1,)) if len(shapes) > 1 else queries
    for sub in internals.sublayers(layer, recursive=False):
        kernel = _weight(sub, "kernel")
        if kernel is None:
            continue
        rows = queries if sub.name in ("query", "gate", "attention_output") else keys
        total += rows * _size(kernel)
    heads = layer.num_heads
    total += (
        heads * queries * keys * (layer.key_dim + (layer.value_dim or layer.key_dim))
    )
    return total


def _sizes(model, prefix=""):
    """`{path: (kind, params, macs)}` of every layer call in `model`'s graph."""
    found = {}
    _, calls, _ = keras_graph.graph_of(model)
    for call in calls:
        layer = call.layer
        path = prefix + layer.name
        if keras_graph.is_graph_model(layer):
            found.update(_sizes(layer, path + "/"))
            continue
        params = sum(_size(v) for v in layer.weights)
        macs = macs_of(
            layer,
            [tuple(t.shape) for t in call.inputs],
            [tuple(t.shape) for t in call.outputs],
        )
        kind, old_params, old_macs = found.get(path, (type(layer).__name__, 0, 0))
        found[path] = (kind, params if not old_params else old_params, old_macs + macs)
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
