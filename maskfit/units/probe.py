"""The self-check of output units: a layer's real gradients against its declaration.

For each bit `b` of the unit index, the probe takes the gradient of a random
positive-weighted sum of the output units whose index has bit `b` set, and of
those with it clear, on random inputs and random weights (the layer's own
weights are never touched: `keras.StatelessScope`). An entry that belongs to
one unit gets a gradient from exactly one side of every bit, which spells its
unit; an entry shared by several units gets one from both sides of some bit.
That is O(log units) backward passes, run once per layer at plan time.
"""

import contextlib
import inspect
import math
from typing import Callable, NamedTuple

import keras
import numpy as np
import tensorflow as tf

from maskfit.units import pullback

__all__ = [
    "BATCH",
    "Probe",
    "check",
    "dependencies",
    "is_probing",
    "is_shape",
    "probing",
    "runs_only_under_xla",
    "sample_inputs",
]

_DRAWS = 2
BATCH = 2
_probing = [0]


@contextlib.contextmanager
def probing():
    """While active, backprop gates pass gradients through unchanged."""
    _probing[0] += 1
    try:
        yield
    finally:
        _probing[0] -= 1


def is_probing():
    return _probing[0] > 0


class Probe(NamedTuple):
    """One call to check: `target(*args, **kwargs)` with `inputs(rng)`.

    Attributes:
      target: the layer (or recurrent cell) to call.
      inputs: `rng -> (args, kwargs)`, sample call arguments.
      outputs: per output tensor of the call, `(axis, first_unit, stop or
        None)` or None (carries no units).
    """

    target: keras.layers.Layer
    inputs: Callable
    outputs: tuple


def is_shape(value):
    """Whether `value` is one shape (ints and None), not a structure of shapes."""
    return isinstance(value, (tuple, list)) and all(
        d is None or isinstance(d, (int, np.integer)) for d in value
    )


def _fill(layer):
    """A size for unknown (None) dimensions that a kernel of the layer fits."""
    kernel = np.atleast_1d(getattr(layer, "kernel_size", None) or 1)
    dilation = np.atleast_1d(getattr(layer, "dilation_rate", None) or 1)
    return int(max(4, np.max((kernel - 1) * dilation + 1)))


def _random(shape, rng, dtype, fill, integers):
    if not is_shape(shape):
        return [_random(s, rng, dtype, fill, integers) for s in shape]
    shape = [
        BATCH if i == 0 and d is None else (fill if d is None else d)
        for i, d in enumerate(shape)
    ]
    if integers is not None:
        return tf.constant(rng.integers(0, integers, size=shape), tf.int32)
    return tf.constant(rng.normal(size=shape), dtype)


def sample_inputs(layer, integers=None):
    """Returns `rng -> (args, kwargs)`: random inputs of the shapes of `layer`'s build.

    The shapes are the ones Keras records when `build` runs
    (`layer.get_build_config()`); unknown dimensions become small sizes.

    Raises:
      ValueError: when Keras recorded no shape for the layer.
    """
    config = layer.get_build_config() or {}
    fill = _fill(layer)
    dtype = layer.compute_dtype if "float" in str(layer.compute_dtype) else "float32"
    if "input_shape" in config:
        shape = config["input_shape"]

        def make(rng):
            return (_random(shape, rng, dtype, fill, integers),), {}

        return make
    if "shapes_dict" in config:
        shapes = {
            name[: -len("_shape")] if name.endswith("_shape") else name: shape
            for name, shape in config["shapes_dict"].items()
            if shape is not None
        }

        def make_kwargs(rng):
            return (), {
                k: _random(s, rng, dtype, fill, integers) for k, s in shapes.items()
            }

        return make_kwargs
    raise ValueError(
        f"OutputMask checks layer '{layer.name}' ({type(layer).__name__}) by calling"
        " it on random inputs of the shapes it was built for, but Keras recorded no"
        " input shape for it (its build() never ran with a shape). Call the layer on"
        " data, or layer.build(input_shape), before the mask is planned; or return"
        " OutputUnits(..., probe_inputs=fn) from its declaration."
    )


def _random_value(variable, rng):
    shape = tuple(variable.shape)
    fan_in = math.prod(shape[:-1]) if len(shape) > 1 else 1
    value = rng.normal(size=shape) / math.sqrt(max(fan_in, 1))
    return tf.constant(value, dtype=variable.dtype)


def _selector(segment, output, bit, side):
    """A 0/1 tensor selecting the units of `output` whose `bit` equals `side`."""
    axis, start, stop = segment
    rank = getattr(output.shape, "rank", len(output.shape))
    size = output.shape[axis]
    units = np.arange(start, start + size)
    chosen = ((units >> bit) & 1) == side
    shape = [1] * rank
    shape[axis] = size
    return chosen.reshape(shape).astype(np.float32), bool(chosen.any())


def _check_outputs(probe, flat, units, covered):
    segments = []
    for i, segment in enumerate(probe.outputs):
        if segment is None or i >= len(flat):
            continue
        axis, start, stop = segment
        output = flat[i]
        rank = getattr(output.shape, "rank", len(output.shape))
        if rank is None or not -rank <= axis < rank:
            raise ValueError(
                f"Output {i} of '{probe.target.name}' has shape {output.shape}, which"
                f" has no axis {axis} to carry its output units."
            )
        size = output.shape[axis]
        end = start + size if stop is None else stop
        if end - start != size or end > units:
            raise ValueError(
                f"Output {i} of '{probe.target.name}' has {size} entries along its"
                f" unit axis {axis}, but the declaration gives it units"
                f" {start}..{end - 1} of {units}."
            )
        covered[start:end] = True
        segments.append((output, (axis, start, end)))
    return segments


def dependencies(probe, units, covered, seed=0):
    """Which output units each entry of `probe.target`'s variables affects.

    Marks in `covered` (boolean, `(units,)`) the units the probe's outputs carry.

    Returns:
      `{id(variable): (variable, reached, multi, unit)}`: boolean arrays of the
      variable's shape (affects some unit; affects several units) and, where
      it affects exactly one, that unit.
    """
    if keras.backend.backend() in ("jax", "torch"):
        return _jax_dependencies(probe, units, covered, seed)
    target = probe.target
    variables = list(target.trainable_variables)
    bits = max(1, math.ceil(math.log2(units)))
    rng = np.random.default_rng(seed)
    call_kwargs = _call_kwargs(target)
    runs = []
    for _ in range(_DRAWS):
        values = [_random_value(v, rng) for v in variables]
        args, kwargs = probe.inputs(rng)
        tape = tf.GradientTape(persistent=True, watch_accessed_variables=False)
        with tape, probing():
            tape.watch(values)
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                outputs = _call(target, args, {**kwargs, **call_kwargs})
            segments = _check_outputs(probe, tf.nest.flatten(outputs), units, covered)
            targets = {}
            for output, segment in segments:
                output = tf.cast(output, tf.float32)
                weight = tf.constant(
                    rng.uniform(0.5, 1.5, size=output.shape), tf.float32
                )
                for bit in range(bits):
                    for side in (0, 1):
                        chosen, any_chosen = _selector(segment, output, bit, side)
                        if any_chosen:
                            term = tf.reduce_sum(output * weight * chosen)
                            key = (bit, side)
                            targets[key] = (
                                targets[key] + term if key in targets else term
                            )
        runs.append((tape, values, targets))
    shapes = [tuple(v.shape) for v in variables]
    reached = [np.zeros(s, bool) for s in shapes]
    multi = [np.zeros(s, bool) for s in shapes]
    unit = [np.zeros(s, np.int64) for s in shapes]
    for bit in range(bits):
        hit = {side: [np.zeros(s, bool) for s in shapes] for side in (0, 1)}
        for tape, values, targets in runs:
            for side in (0, 1):
                if (bit, side) not in targets:
                    continue
                grads = tape.gradient(
                    targets[(bit, side)],
                    values,
                    unconnected_gradients=tf.UnconnectedGradients.ZERO,
                )
                for i, grad in enumerate(grads):
                    # NaN counts as reached: never a silent pass.
                    hit[side][i] |= tf.convert_to_tensor(grad).numpy() != 0
        for i in range(len(variables)):
            multi[i] |= hit[0][i] & hit[1][i]
            reached[i] |= hit[0][i] | hit[1][i]
            unit[i] |= hit[1][i].astype(np.int64) << bit
    return {id(v): (v, reached[i], multi[i], unit[i]) for i, v in enumerate(variables)}


def _jax_dependencies(probe, units, covered, seed):
    """`dependencies` on JAX and torch: one `pullback.vjp` per draw, a pull per bit side."""
    _dtype = lambda x: keras.backend.standardize_dtype(x.dtype)  # noqa: E731
    target = probe.target
    variables = list(target.trainable_variables)
    bits = max(1, math.ceil(math.log2(units)))
    rng = np.random.default_rng(seed)
    call_kwargs = _call_kwargs(target)
    keys = [(b, s) for b in range(bits) for s in (0, 1)]
    hit = {key: [np.zeros(v.shape, bool) for v in variables] for key in keys}
    for _ in range(_DRAWS):
        values = [keras.ops.convert_to_tensor(_random_value(v, rng)) for v in variables]
        args, kwargs = tf.nest.map_structure(
            lambda x: x.numpy() if isinstance(x, tf.Tensor) else x, probe.inputs(rng)
        )

        def call(values, args=args, kwargs=kwargs):
            mapping = list(zip(variables, values))
            with probing(), keras.StatelessScope(state_mapping=mapping):
                outputs = target(*args, **{**kwargs, **call_kwargs})
            return tf.nest.flatten(outputs)

        flat, pull = pullback.vjp(call, values)
        segments = _check_outputs(probe, flat, units, covered)
        weights = [rng.uniform(0.5, 1.5, size=o.shape) for o, _ in segments]
        position = {id(o): i for i, o in enumerate(flat)}
        for bit, side in keys:
            cotangents = [np.zeros(o.shape, _dtype(o)) for o in flat]
            for (output, segment), weight in zip(segments, weights):
                chosen, _ = _selector(segment, output, bit, side)
                cotangent = (weight * chosen).astype(_dtype(output))
                cotangents[position[id(output)]] = cotangent
            (grads,) = pull(cotangents)
            for i, grad in enumerate(grads):
                # NaN counts as reached: never a silent pass.
                hit[(bit, side)][i] |= grad != 0
    found = {}
    for i, v in enumerate(variables):
        clear, set_ = ([hit[(b, s)][i] for b in range(bits)] for s in (0, 1))
        multi = np.any([c & t for c, t in zip(clear, set_)], axis=0)
        reached = np.any([c | t for c, t in zip(clear, set_)], axis=0)
        unit = sum(t.astype(np.int64) << b for b, t in enumerate(set_))
        found[id(v)] = (v, reached, multi, unit)
    return found


def _call_kwargs(target):
    has = "training" in inspect.signature(target.call).parameters
    return {"training": False} if has else {}


def _call(target, args, kwargs):
    """`target(*args, **kwargs)`, compiled with XLA where TensorFlow runs it only so.

    Some layers run on some CPUs only under XLA: TensorFlow's CPU kernels for
    a `channels_first` convolution (and its transpose) exist only with
    oneDNN's NCHW support (Keras's own `fit` then needs `jit_compile=True`
    too). The gradients still reach the probe's values through the compiled
    call.
    """
    try:
        return target(*args, **kwargs)
    except (tf.errors.UnimplementedError, tf.errors.InvalidArgumentError) as e:
        if not runs_only_under_xla(e):
            raise
        return tf.function(lambda: target(*args, **kwargs), jit_compile=True)()


def runs_only_under_xla(error):
    """Whether `error` says TensorFlow's CPU kernel takes channels_last only.

    Those channels_first convolutions run under XLA. The kernels say
    "NHWC" (1-D and 2-D) or "NDHWC" (3-D transposed convolutions).
    """
    return isinstance(
        error, (tf.errors.UnimplementedError, tf.errors.InvalidArgumentError)
    ) and any(layout in str(error) for layout in ("NHWC", "NDHWC"))


def _describe(variable, position, message):
    return f"'{variable.path}' entry {tuple(int(p) for p in position)} {message}"


def check(layer, units, probes, owners):
    """Raises when `layer`'s gradients disagree with the declared `owners`.

    Args:
      layer: the layer whose declaration is checked.
      units: its number of output units.
      probes: the `Probe`s that, together, call every trainable variable.
      owners: `{id(variable): int array}` broadcastable to the variable: the
        declared unit of each entry, or `units` where it is shared.
    """
    found = {}
    covered = np.zeros(units, bool)
    for probe in probes:
        found.update(dependencies(probe, units, covered))
    if not covered.all():
        raise ValueError(
            f"The declaration of layer '{layer.name}' ({type(layer).__name__}) says"
            f" {units} output units, but its outputs carry only {int(covered.sum())}"
            f" of them (units {np.flatnonzero(~covered)[:5].tolist()} appear in no"
            " output). Pass one OutputMask value per output unit."
        )
    problems = []
    for variable in layer.trainable_weights:
        if id(variable) not in found:
            raise ValueError(
                f"The self-check of layer '{layer.name}' never calls variable"
                f" '{variable.path}'; its declaration's probes must cover every"
                " trainable variable."
            )
        _, reached, multi, unit = found[id(variable)]
        declared = np.broadcast_to(owners[id(variable)], reached.shape)
        owned = declared < units
        cases = [
            (
                owned & multi,
                lambda p, declared=declared: (
                    "affects several output units but is declared"
                    f" to belong to unit {declared[p]}"
                ),
            ),
            (
                owned & reached & ~multi & (unit != declared),
                lambda p, declared=declared, unit=unit: (
                    "is declared to"
                    f" belong to unit {declared[p]} but affects only unit {unit[p]}"
                ),
            ),
            (
                ~owned & reached & ~multi,
                lambda p, unit=unit: (
                    f"is declared shared but affects only unit {unit[p]}"
                ),
            ),
        ]
        for bad, say in cases:
            for position in np.argwhere(bad)[:2]:
                position = tuple(position)
                problems.append(_describe(variable, position, say(position)))
    if problems:
        count = len(problems)
        raise ValueError(
            f"OutputMask cannot be used on layer '{layer.name}'"
            f" ({type(layer).__module__}.{type(layer).__qualname__}): its declared"
            " output units disagree with its gradients on random inputs:"
            f" {'; '.join(problems[:4])}{' ...' if count > 4 else ''}. Fix its"
            " declaration (maskfit_output_units / maskfit.register_output_units,"
            " docs/output_mask.md), or use maskfit.ElementMask."
        )
