"""What XLA compiles one training step into, read from its optimized HLO.

The step benchmarks report, beside their times, what this machine's XLA makes
of a step: its `fusions` (fusion instructions), its `kernels` (every
instruction that runs: fusions, dots, convolutions, copies, custom calls,
not parameters, constants, tuples or bitcasts) and its `bytes_accessed`
(what those read and write), so that the cost of masking can be seen without
the accelerator it would run on. Loops are counted once, as written.

`jax_step` and `tf_step` count the step a compiled model's `fit` runs;
`row` gives a contender's counts and their ratios to stock's as a table row
(`COLUMNS`, written by `cells` under `HEADER`). `hlo_counts(text)` counts
an optimized HLO module's text. Its bytes are each kernel's operands and
results, as XLA's `HloCostAnalysis` counts a fusion (the whole of every
operand, once); under JAX `jax_step` takes XLA's own figure from
`compiled.cost_analysis()` instead, and reports the parsed one beside it
(`parsed_bytes`, within 1e-6 of it on the step benchmarks' models), as a
check of the parse. TensorFlow gives the optimized HLO
(`experimental_get_compiler_ir(...)(stage="optimized_hlo")`) but no cost
analysis, so `tf_step` reports the parsed bytes.
"""

import logging
import re

__all__ = [
    "COLUMNS",
    "HEADER",
    "Untimed",
    "cells",
    "hlo_counts",
    "jax_step",
    "log_row",
    "ratios",
    "row",
    "tf_step",
]

# The keys of a `row`, in its order (columns of the step benchmarks' CSVs).
COLUMNS = (
    "fusions",
    "kernels",
    "bytes_accessed",
    "fusions_ratio",
    "kernels_ratio",
    "bytes_ratio",
)
# The header of `cells`, for a fixed-width table.
HEADER = f"{'fusions':>7} {'kernels':>7} {'MB':>9} {'fus.r':>5} {'bytes.r':>7}"

# Instructions that move no data of their own (or are not kernels).
_NOT_KERNELS = frozenset(
    {
        "parameter",
        "constant",
        "tuple",
        "get-tuple-element",
        "bitcast",
        "after-all",
        "partition-id",
        "replica-id",
    }
)
_BYTES = {
    "pred": 1,
    "s4": 0.5,
    "u4": 0.5,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
_ARRAY = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")
_CALLED = re.compile(
    r"\b(?:body|condition|to_apply|true_computation|false_computation)=%?([\w.\-]+)"
)
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([a-z][\w\-]*)\((.*)$"
)


def _shape_bytes(shape):
    """Bytes of an HLO shape's text (an array, or a tuple of arrays)."""
    total = 0.0
    for dtype, dims in _ARRAY.findall(shape):
        count = 1
        for d in filter(None, dims.split(",")):
            count *= int(d)
        total += _BYTES.get(dtype, 0) * count
    return total


def _operands(rest):
    """The `%names` in an instruction's operand list (up to its closing paren)."""
    depth, end = 1, len(rest)
    for i, char in enumerate(rest):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            end = i
            break
    return re.findall(r"%([\w.\-]+)", rest[:end])


def _computations(text):
    """`{name: [lines]}` of the module's computations, and the entry's name."""
    found, entry, name = {}, None, None
    for line in text.splitlines():
        header = re.match(r"^(ENTRY\s+)?%?([\w.\-]+)\s+\(.*\{\s*$", line)
        if header:
            name = header.group(2)
            found[name] = []
            if header.group(1):
                entry = name
        elif name is not None and line.strip() == "}":
            name = None
        elif name is not None:
            found[name].append(line)
    return found, entry


def hlo_counts(text):
    """Counts an optimized HLO module's text: `{fusions, kernels, bytes_accessed}`.

    Counted over the entry computation and the computations its control flow
    calls (`while` bodies and conditions, conditional branches), not inside
    fusions.

    Example:

    >>> text = '''HloModule m
    ... ENTRY %main (p: f32[4]) -> f32[4] {
    ...   %p = f32[4]{0} parameter(0)
    ...   ROOT %f = f32[4]{0} fusion(f32[4]{0} %p), kind=kLoop, calls=%c
    ... }
    ... '''
    >>> hlo_counts(text)
    {'fusions': 1, 'kernels': 1, 'bytes_accessed': 32.0}
    """
    computations, entry = _computations(text)
    if entry is None:
        raise ValueError("The HLO text has no ENTRY computation.")
    fusions = kernels = 0
    total = 0.0
    pending, seen = [entry], set()
    while pending:
        name = pending.pop()
        if name in seen or name not in computations:
            continue
        seen.add(name)
        shapes = {}
        for line in computations[name]:
            match = _INSTRUCTION.match(line)
            if match is None:
                continue
            result, shape, opcode, rest = match.groups()
            shapes[result] = shape
            if opcode in ("while", "conditional", "call"):
                pending += _CALLED.findall(line)
                for names in re.findall(r"branch_computations=\{([^}]*)\}", line):
                    pending += re.findall(r"%?([\w.\-]+)", names)
                continue
            if opcode in _NOT_KERNELS:
                continue
            kernels += 1
            fusions += opcode == "fusion"
            total += _shape_bytes(shape)
            total += sum(_shape_bytes(shapes.get(o, "")) for o in _operands(rest))
    return {"fusions": fusions, "kernels": kernels, "bytes_accessed": total}


def _jax_state(model):
    """The `(trainable, non_trainable, optimizer, metrics)` state, as shapes."""
    import jax

    def spec(variable):
        return jax.ShapeDtypeStruct(tuple(variable.shape), variable.dtype)

    return (
        [spec(v) for v in model.trainable_variables],
        [spec(v) for v in model.non_trainable_variables],
        [spec(v) for v in model.optimizer.variables],
        [spec(v) for v in model.metrics_variables],
    )


def jax_step(model, x, y):
    """The counts of the step `fit` compiles for a compiled JAX `model` on `(x, y)`.

    Compiles the step (for the shapes of `x` and `y`, without running it):
    stock Keras's `jax.jit(model.train_step)`, or a `MaskedModel`'s step with
    its masks as an argument (`maskfit.backend.jax.lower_train_step`).
    `bytes_accessed` is XLA's cost analysis; `parsed_bytes` the parse of
    `hlo_counts`.
    """
    import jax

    from maskfit.backend import jax as jax_backend

    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    data = jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (x, y)
    )
    state = _jax_state(model)
    if hasattr(model, "apply_grad_masks"):
        lowered = jax_backend.lower_train_step(model, state, data)
    else:
        lowered = jax.jit(model.train_step, donate_argnums=0).lower(state, data)
    compiled = lowered.compile()
    counts = hlo_counts(compiled.as_text())
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    counts["parsed_bytes"] = counts["bytes_accessed"]
    counts["bytes_accessed"] = float(cost["bytes accessed"])
    return counts


def tf_step(model, x, y):
    """The counts of `model.train_step` compiled with XLA on TensorFlow, for `(x, y)`.

    The step as `fit` compiles it under `jit_compile=True` (Keras's
    `train_step`, or a `MaskedModel`'s after `make_train_function` planned
    its masks), taken from `experimental_get_compiler_ir`'s optimized HLO.
    """
    import tensorflow as tf

    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    model.make_train_function()

    @tf.function(jit_compile=True)
    def step(x, y):
        return model.train_step((x, y))

    x, y = tf.nest.map_structure(tf.convert_to_tensor, (x, y))
    text = step.experimental_get_compiler_ir(x, y)(stage="optimized_hlo")
    return hlo_counts(text)


def ratios(counts, stock):
    """`counts` over `stock`'s: `{fusions_ratio, kernels_ratio, bytes_ratio}`."""
    return {
        "fusions_ratio": counts["fusions"] / stock["fusions"],
        "kernels_ratio": counts["kernels"] / stock["kernels"],
        "bytes_ratio": counts["bytes_accessed"] / stock["bytes_accessed"],
    }


def row(counts, stock):
    """A contender's `counts` and their ratios to `stock`'s, under `COLUMNS`.

    All None when either is None (a step not compiled with XLA, or `hlo`
    off).

    Example:

    >>> row({"fusions": 4, "kernels": 5, "bytes_accessed": 102.0},
    ...     {"fusions": 4, "kernels": 5, "bytes_accessed": 100.0})["bytes_ratio"]
    1.02
    """
    if counts is None or stock is None:
        return dict.fromkeys(COLUMNS)
    found = {key: counts[key] for key in COLUMNS[:3]}
    found.update(ratios(counts, stock))
    return found


def cells(row):
    """A `row`'s values as fixed-width cells, under `HEADER` (dashes when None)."""
    if row["fusions"] is None:
        return f"{'-':>7} {'-':>7} {'-':>9} {'-':>5} {'-':>7}"
    return (
        f"{row['fusions']:7d} {row['kernels']:7d} {row['bytes_accessed'] / 1e6:9.1f}"
        f" {row['fusions_ratio']:5.3f} {row['bytes_ratio']:7.4f}"
    )


def log_row(label, row):
    """Logs a `row`'s counts and ratios, when it has them."""
    if row["fusions"] is not None:
        logging.info(
            "%s: %d fusions (%.3f of stock), %d kernels, %.1f MB accessed"
            " (%.4f of stock)",
            label,
            row["fusions"],
            row["fusions_ratio"],
            row["kernels"],
            row["bytes_accessed"] / 1e6,
            row["bytes_ratio"],
        )


class Untimed:
    """A contender built and compiled, but not timed (`timing=False`)."""

    def __init__(self, key, model):
        self.key = key
        self.model = model
