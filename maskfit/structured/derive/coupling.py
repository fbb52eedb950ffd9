"""Couplings derived from a layer's computation: the last fallback of `coupling_of`.

A layer with weights that maskfit has no record, declaration, registration
or keras_hub spec for (a subclassed block, a user's layer, a keras_hub
class released after maskfit) is traced at the shape it is called with
(`trace`, under `KERAS_BACKEND=jax`), its weights' axes are followed through
the equations (`propagate`) and its unit spaces read off (`spaces`): heads
(with their key/value groups), FFN units, whatever joins weights'
positions as they do. Each space is then held to keras_hub's gradient
check (`maskfit.structured.hub.check`), which fixes a space whose removal
does not cut exactly its entries off. Blocks of one signature (class,
config, weight shapes, input shape) are derived once per process.
`shrink` searches a derived layer's config for the fields that hold its
counts (`resize`); what no config passing its checks can cut keeps its
size, its removed units' entries 0.

The layer is traced, checked and resized as the model calls it: with its
other tensor arguments (a mask, a bias, relative embeddings) as zeros
(`maskfit.kinds.couplings.arguments`); they carry no units.
Under TensorFlow the jaxpr is made in a JAX worker process (`worker`),
from the layer's class and config, and the gradient check runs on the
layer itself. Under torch nothing is derived
(`maskfit.support.FEATURES["derived_couplings"]`): such a layer is
refused with a reason that says so.
"""

import keras

from maskfit import support
from maskfit.kinds.couplings import arguments as call_arguments
from maskfit.kinds.couplings import lookup
from maskfit.kinds.couplings import signature as check_signature
from maskfit.kinds.couplings.base import Coupling, Refused
from maskfit.kinds.couplings.calls import TensorUnits
from maskfit.structured.derive import propagate as derive_propagate
from maskfit.structured.derive import resize as derive_resize
from maskfit.structured.derive import spaces as derive_spaces
from maskfit.structured.derive import trace as derive_trace
from maskfit.structured.derive import worker as derive_worker
from maskfit.structured.hub import check as hub_check
from maskfit.structured.hub import couplings as couplings_hub  # noqa: F401 - its fallback first

__all__ = ["Derived", "derive", "derived_coupling"]

_REFUSAL = "declares no unit coupling, and deriving one from its computation"

# `{block signature: (spaces, reasons, joins input to output)}`.
_MEMO = {}


def derive(layer, input_shape, described=None):
    """The unit spaces of `layer` called on `input_shape`, derived from its jaxpr.

    Args:
      layer: a built layer (under TensorFlow, its class importable and its
        config complete: it is rebuilt in a JAX worker process).
      input_shape: its first input's shape.
      described: the call's arguments (`arguments.describe`): its other
        tensors are passed as zeros; None: the first input alone.

    Returns:
      `(spaces, reasons, residual)`: `spaces.Space`s (weights by index into
      `layer.weights`), `{weight index: why it does not prune}`, and whether
      the output's last axis carries the input's (a residual stream).
    """
    key = check_signature.signature(
        layer, tuple(input_shape), "derived coupling", call_arguments.key(described)
    )
    if key is not None and key in _MEMO:
        return _MEMO[key]
    if keras.backend.backend() == "jax":
        found = _derive_here(layer, input_shape, described)
    else:
        found = derive_worker.derive_in_worker(layer, input_shape, described)
    if key is not None:
        _MEMO[key] = found
    return found


def _derive_here(layer, input_shape, described):
    """`derive` under the JAX backend: the layer's own jaxpr."""
    traced = derive_trace.trace(layer, input_shape, described)
    labels = derive_propagate.propagate(
        traced.jaxpr, traced.weights, traced.inputs, traced.outputs
    )
    shapes = [tuple(v.shape) for v in layer.weights]
    spaces, reasons = derive_spaces.unit_spaces(labels, shapes)
    last_in = ("input", 0, len(input_shape) - 1)
    out_rank = len(traced.outputs[0].aval.shape) if traced.outputs else 0
    residual = out_rank > 0 and labels.family(last_in) == labels.family(
        ("output", 0, out_rank - 1)
    )
    return spaces, reasons, residual


def _derive_either(layer, shape, described):
    """`derive` with the call's arguments, else with its input alone.

    An extra tensor whose unknown dimensions the zeros cannot size (a
    position table of one row per patch, read as a batch of 2) makes the
    call fail where its default (None) would not: the input alone is tried
    then, and the error of the call with its arguments is raised if that
    fails too. Returns `derive`'s three values and the arguments used.
    """
    try:
        return (*derive(layer, shape, described), described)
    except Exception as error:
        if described is None or described == call_arguments.FIRST_ONLY:
            raise
        first = error
    try:
        return (*derive(layer, shape, None), None)
    except Exception:  # noqa: BLE001 - the first error says more
        raise first from None


def _other_tensors(call, index):
    """Words on the tensors besides the input that `call` was traced with, or ""."""
    first = call.inputs[index]
    shown = [
        f"{name} {tuple(value.shape)}"
        for name, value in call.arguments.items()
        if isinstance(value, keras.KerasTensor) and value is not first
    ]
    if not shown:
        return ""
    return (
        f" (it was run with its other tensors as zeros, at the shapes the"
        f" model's symbolic graph gives them: {', '.join(shown)}, each unknown"
        " dimension 5 and the first 2; where one of those is not the shape"
        " the layer gets when the model runs, such as a keras_hub layer whose"
        " output shape is computed wrongly, this call cannot be traced: its"
        " units stay)"
    )


class Derived(Coupling):
    """A layer's coupling derived from its jaxpr (`derive`), gradient-checked."""

    def couple(self, call, graph):
        layer = call.layer
        index = call_arguments.first_input(call.call)
        shape = call.input_shape(index)
        try:
            described = call_arguments.describe(
                call.call.args, call.call.kwargs, call.call.inputs[index]
            )
            spaces, reasons, residual, described = _derive_either(
                layer, shape, described
            )
        except Exception as error:  # noqa: BLE001 - any failure to trace refuses
            return graph.refuse(
                layer,
                call.inputs,
                f"{_REFUSAL} failed: {type(error).__name__}: {error}"
                + _other_tensors(call.call, index),
                call.num_outputs,
            )
        if not spaces:
            why = "; ".join(
                f"'{layer.weights[w].path}' {reason}" for w, reason in reasons.items()
            )
            return graph.refuse(
                layer,
                call.inputs,
                f"{_REFUSAL} found no unit that prunes" + (f" ({why})" if why else ""),
                call.num_outputs,
            )
        graph.note(layer, derive_resize.INPUT_SHAPE, shape)
        graph.note(layer, derive_resize.ARGUMENTS, described)
        source = call.inputs[index]
        graph.fix(source.ids, f"the input of '{layer.name}' ({type(layer).__name__})")
        for i, units in enumerate(call.inputs):
            if i != index:
                graph.fix(units.ids, f"read by '{layer.name}' besides its input")
        checked = []
        for space in spaces:
            made = graph.new_space(layer, space.name, space.size, kind=space.name[:5])
            sliced = []
            for entry in space.entries:
                variable = layer.weights[entry.weight]
                ids = made.first + entry.ids
                scored = len(variable.shape) >= 2
                graph.slice(layer, variable, entry.axis, ids, scored=scored)
                sliced.append((variable, entry.axis, ids, entry.closes))
            checked.append((made, sliced))
        hub_check.check(graph, call, checked, described=described, shape=shape)
        rest = TensorUnits.none(f"output of '{layer.name}' after its first")
        first = (
            source
            if residual
            else TensorUnits.none(
                f"output of '{layer.name}', derived without a residual stream"
            )
        )
        return [first] + [rest] * (call.num_outputs - 1)

    def shrink_config(self, layer, config, shrunk):
        """The same config: `shrink` resizes such a layer itself (`resize.resized`)."""
        return config


def derived_coupling(layer):
    """`coupling_of`'s last fallback for a layer with weights: `Derived()`.

    None for a layer with fewer than two weights of two or more axes (a
    norm, an embedding: no unit space can form), or one that subclasses a
    built-in class (its own refusal says how to declare it). Under a backend other
    than JAX, a `Refused` that says derivation needs JAX.
    """
    matrices = sum(len(v.shape) >= 2 for v in layer.weights)
    if matrices < 2 or lookup.builtin_base(type(layer)) is not None:
        return None  # a unit space needs a weight that makes it and one that reads it
    if not support.runs_on("derived_couplings"):
        row = support.FEATURES["derived_couplings"]
        return Refused(
            "declares no unit coupling, and maskfit derives one from a layer's"
            f" computation only under {' or '.join(row.backends)}"
            f" (KERAS_BACKEND={support.backend()} here). Instead: {row.instead}"
        )
    return Derived()


# `coupling_of` asks this last, after keras_hub's specs.
lookup.add_fallback(derived_coupling)
