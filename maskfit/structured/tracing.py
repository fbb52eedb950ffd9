"""Multiply-accumulates of one layer call, counted from the backend's trace of it.

`size_report` takes a layer's MACs from its record (`maskfit.kinds`) where the
record knows them. Every other call (a keras_hub block, a reversible
embedding called as the output projection, a user's layer, a `keras.ops`
call in the graph) is traced at the call's shapes, each unknown dimension
but the batch at a given size, and its products are counted from the
operations the backend records:

- under JAX, the jaxpr (`jax.make_jaxpr`): `dot_general` and
  `conv_general_dilated`, inside nested calls, conditionals (the largest
  branch) and scans (times their length);
- under TensorFlow, the HLO XLA makes of the call (`tf.function(...,
  jit_compile=True).experimental_get_compiler_ir`): `dot` and
  `convolution`, inside calls and conditionals (the largest branch).

A product counts `output entries x contracted entries` (a matrix product
`(m, k) @ (k, n)`: `m n k`; attention's scores and values per head; a
convolution: output entries x kernel entries per output channel). A product
that contracts nothing (an outer product, such as a rotary embedding's
positions times frequencies) is element-wise work and counts 0, as
normalizations and activations do. A loop whose trip count the trace does
not state (a TensorFlow while loop) counts its body once, and the count says
so (`Traced.note`); a call that cannot be traced counts 0 with the reason.
"""

import math
import re
from typing import NamedTuple, Optional

import keras

__all__ = ["Traced", "hlo_macs", "traced_call", "traced_macs"]


class Traced(NamedTuple):
    """The MACs of one call per example, and why they may be short (None if exact)."""

    macs: int
    note: Optional[str] = None


def _concrete(tensor, unknown_size):
    shape = list(tensor.shape)
    for axis, dim in enumerate(shape):
        if dim is None:
            shape[axis] = 1 if axis == 0 else unknown_size
    return tuple(shape), keras.backend.standardize_dtype(tensor.dtype)


def traced_macs(operation, args, kwargs, unknown_size=1):
    """Multiply-accumulates of `operation(*args, **kwargs)` per example, traced.

    Args:
      operation: a built layer or a Keras operation.
      args, kwargs: the call's arguments as a model's graph recorded them
        (KerasTensors where tensors go).
      unknown_size: the size of every unknown (None) dimension but the
        batch (a sequence length, an image side).

    Returns:
      A `Traced`: the MACs (per example: the batch axis at 1, or divided by
      its static size) and a note where they are not exact.

    Example:

    >>> import keras
    >>> layer = keras.layers.Dense(3)
    >>> x = keras.Input((5,))
    >>> _ = layer(x)
    >>> traced_macs(layer, (x,), {})
    Traced(macs=15, note=None)
    """
    return traced_call(operation, args, kwargs, unknown_size)[0]


def traced_call(operation, args, kwargs, unknown_size=1, shapes=None):
    """`(Traced, shapes)`: `traced_macs`, and the shapes the traced call returned.

    `shapes` lists the shape of each tensor `operation` returns (flattened,
    the batch at the size it was traced at), as the backend computed them:
    a caller passes them on to the calls that read these outputs, so that a
    length the call derives from its inputs (a relative position table of
    twice the sequence, a rotary table) has its real size there, not
    `unknown_size`. None where the call could not be traced.

    Example:

    >>> import keras
    >>> x = keras.Input((None, 5))
    >>> _ = keras.layers.Dense(3)(x)
    >>> double = keras.layers.Lambda(lambda t: keras.ops.concatenate([t, t], 1))
    >>> traced_call(double, (x,), {}, unknown_size=4)
    (Traced(macs=0, note=None), [(1, 8, 5)])
    """
    tensors = [
        x
        for x in keras.tree.flatten((args, kwargs))
        if isinstance(x, keras.KerasTensor)
    ]
    specs = [_concrete(x, unknown_size) for x in tensors]
    if shapes is not None:
        specs = [(tuple(shape), dtype) for shape, (_, dtype) in zip(shapes, specs)]
    batches = {x.shape[0] for x in tensors if len(x.shape) and x.shape[0] is not None}
    batch = max(batches) if len(batches) == 1 else 1

    def run(*values):
        pending = iter(values)
        a, k = keras.tree.map_structure(
            lambda x: next(pending) if isinstance(x, keras.KerasTensor) else x,
            (tuple(args), dict(kwargs)),
        )
        with keras.StatelessScope():
            outputs = operation(*a, **k)
        return [y for y in keras.tree.flatten(outputs) if hasattr(y, "shape")]

    try:
        if keras.backend.backend() == "jax":
            macs, loops, shapes = _jax(run, specs)
        elif keras.backend.backend() == "tensorflow":
            macs, loops, shapes = _tensorflow(run, specs)
        else:
            note = f"not traced on the {keras.backend.backend()} backend"
            return Traced(0, note), None
    except Exception as error:  # noqa: BLE001 - any failure to trace is reported
        return Traced(0, f"could not be traced ({_reason(error)})"), None
    note = None
    if loops:
        note = "a loop whose trip count the trace does not state counts its body once"
    return Traced(macs // batch, note), shapes


_ERROR_LINE = re.compile(r"^(\w+(Error|Exception)):? (.+)$")
_ESCAPES = re.compile(r"\x1b\[[0-9;]*m|\[[0-9;]*m")


def _reason(error):
    """The line of a (possibly long, nested) tracing error that says what went wrong."""
    lines = [_ESCAPES.sub("", line).strip() for line in str(error).splitlines()]
    lines = [line for line in lines if line and "in user code" not in line]
    found = [i for i, line in enumerate(lines) if _ERROR_LINE.match(line)]
    if not found:
        return f"{type(error).__name__}: {(lines or [''])[0][:200]}"
    name, _, text = _ERROR_LINE.match(lines[found[-1]]).groups()
    if text.startswith("Exception encountered") and found[-1] + 1 < len(lines):
        text = f"{text} {lines[found[-1] + 1]}"  # Keras's wrapper: the cause follows
    return f"{name}: {text[:300]}"


# JAX: the jaxpr.


def _jax(run, specs):
    import jax

    closed, outputs = jax.make_jaxpr(run, return_shape=True)(
        *[jax.ShapeDtypeStruct(s, d) for s, d in specs]
    )
    macs, loops = _jaxpr_macs(closed.jaxpr)
    return macs, loops, [tuple(y.shape) for y in outputs]


def _sub_jaxprs(value):
    """The jaxprs in an equation's parameter (a jaxpr, a closed one, or a tuple of them)."""
    if isinstance(value, (tuple, list)):
        return [j for item in value for j in _sub_jaxprs(item)]
    if hasattr(value, "eqns"):
        return [value]
    inner = getattr(value, "jaxpr", None)
    if inner is not None and hasattr(inner, "eqns"):
        return [inner]
    return []


def _jaxpr_macs(jaxpr):
    """`(macs, loops)`: the products of a jaxpr, and whether a loop counted once."""
    total, loops = 0, False
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            if contract:
                out = math.prod(eqn.outvars[0].aval.shape)
                total += out * math.prod(lhs[c] for c in contract)
            continue
        if name == "conv_general_dilated":
            rhs = eqn.invars[1].aval.shape
            out_feature = eqn.params["dimension_numbers"].rhs_spec[0]
            out = math.prod(eqn.outvars[0].aval.shape)
            total += out * math.prod(rhs) // max(rhs[out_feature], 1)
            continue
        counts = {}
        for key, value in eqn.params.items():
            counts[key] = [_jaxpr_macs(j) for j in _sub_jaxprs(value)]
        found = [c for values in counts.values() for c in values]
        loops = loops or any(inner for _, inner in found)
        if name == "scan":
            total += eqn.params["length"] * sum(m for m, _ in found)
        elif name == "cond":
            total += max((m for m, _ in counts.get("branches", [])), default=0)
        elif name == "while":
            total += sum(m for m, _ in counts.get("body_jaxpr", []))
            loops = True
        else:
            total += sum(m for m, _ in found)
    return total, loops


# TensorFlow: the HLO XLA makes of the call.


def _tensorflow(run, specs):
    import tensorflow as tf

    function = tf.function(run, jit_compile=True)
    signature = [tf.TensorSpec(s, d) for s, d in specs]
    text = function.experimental_get_compiler_ir(*signature)(stage="hlo")
    outputs = function.get_concrete_function(*signature).structured_outputs
    return (*hlo_macs(text), [tuple(y.shape.as_list()) for y in outputs])


_HEAD = re.compile(r"^\s*(ENTRY\s+)?%?([^\s(]+)\s*\(.*\{\s*$")
_SHAPE = r"\w+\[([\d,]*)\]"
_DOT = re.compile(rf"=\s*{_SHAPE}\S*\s+dot\(\s*{_SHAPE}")
_CONV = re.compile(rf"=\s*{_SHAPE}\S*\s+convolution\(\s*{_SHAPE}\S*\s+\S+,\s*{_SHAPE}")
_CONTRACT = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_LABELS = re.compile(r"dim_labels=\w+_(\w+)->")
_CALLED = re.compile(
    r"(to_apply|calls|body|true_computation|false_computation)=%?([^\s,}]+)"
)
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")


def _dims(text):
    return [int(d) for d in text.split(",") if d]


def _instruction_macs(line):
    dot = _DOT.search(line)
    if dot:
        contract = _CONTRACT.search(line)
        axes = _dims(contract.group(1)) if contract else []
        lhs = _dims(dot.group(2))
        if not axes:
            return 0
        return math.prod(_dims(dot.group(1))) * math.prod(lhs[a] for a in axes)
    conv = _CONV.search(line)
    if conv:
        rhs = _dims(conv.group(3))
        labels = _LABELS.search(line)
        out_feature = labels.group(1).index("o") if labels else len(rhs) - 1
        return math.prod(_dims(conv.group(1))) * math.prod(rhs) // rhs[out_feature]
    return 0


def hlo_macs(text):
    """`(macs, loops)`: the products of an HLO module's entry, as `_jaxpr_macs`.

    Example:

    >>> hlo = '''HloModule m
    ... ENTRY %main (a: f32[2,3], b: f32[3,4]) -> f32[2,4] {
    ...   %a = f32[2,3]{1,0} parameter(0)
    ...   %b = f32[3,4]{1,0} parameter(1)
    ...   ROOT %d = f32[2,4]{1,0} dot(f32[2,3]{1,0} %a, f32[3,4]{1,0} %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
    ... }'''
    >>> hlo_macs(hlo)
    (24, False)
    """
    bodies, entry, current = {}, None, None
    for line in text.splitlines():
        head = _HEAD.match(line)
        if head and "=" not in line.split("(")[0]:
            current = head.group(2)
            bodies[current] = []
            if head.group(1):
                entry = current
        elif line.strip() == "}":
            current = None
        elif current is not None:
            bodies[current].append(line)
    memo = {}

    def count(name):
        if name not in memo:
            memo[name] = (0, False)  # a recursive reference counts 0
            total, loops = 0, False
            for line in bodies.get(name, ()):
                total += _instruction_macs(line)
                called = dict(_CALLED.findall(line))
                branches = _BRANCHES.search(line)
                if " while(" in line:
                    loops = True
                    macs, inner = count(called.get("body", ""))
                    total, loops = total + macs, True
                    continue
                options = [called[k] for k in called if k.endswith("_computation")]
                if branches:
                    options += [
                        b.strip().lstrip("%") for b in branches.group(1).split(",")
                    ]
                if options:
                    results = [count(o) for o in options]
                    total += max(m for m, _ in results)
                    loops = loops or any(inner for _, inner in results)
                for key in ("to_apply", "calls"):
                    if key in called:
                        macs, inner = count(called[key])
                        total, loops = total + macs, loops or inner
            memo[name] = (total, loops)
        return memo[name]

    if entry is None:
        raise ValueError("The HLO text has no ENTRY computation.")
    return count(entry)
