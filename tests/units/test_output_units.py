"""OutputMask on every built-in Keras layer: correct by a ground truth, or refused.

The ground truth never uses maskfit's planning: per output unit, the entries
that the gradient of that unit's outputs reaches, over several random inputs
(for recurrent layers, over one cell step from random states). An entry
reached from one unit only belongs to it; from several, it is shared.
"""

import ast
import inspect
import textwrap
from typing import Callable, NamedTuple

import keras
import numpy as np
import pytest
import tensorflow as tf

import maskfit
from maskfit.internals import versions
from tests.helpers import keras_versions

BACKEND = keras.backend.backend()
_BOTH = pytest.mark.backends("tensorflow", "jax")
_ALL = pytest.mark.backends("tensorflow", "jax", "torch")

L = keras.layers
BATCH = 2


class Case(NamedTuple):
    id: str
    make: Callable  # () -> layer
    shapes: tuple  # input shapes, batch axis None
    units: int  # the layer's real number of output units
    verdict: str  # "CORRECT" or "REFUSED"
    axis: int = -1  # the unit axis of the (first) output
    truth: str = "call"  # "call", "cell" (one RNN cell step) or "bidi"
    ints: int = 0  # integer inputs below this (embeddings)
    as_list: bool = False  # call layer([a, b]) rather than layer(a, b)


def cf(layer_cls, *args, **kwargs):
    return lambda: layer_cls(*args, data_format="channels_first", **kwargs)


def mk(layer_cls, *args, **kwargs):
    return lambda: layer_cls(*args, **kwargs)


class Inner(L.Layer):
    """A custom layer whose inner width equals its units: the inner Dense is shared."""

    def __init__(self, units=3, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape):
        self.inner = L.Dense(self.units, activation="tanh")
        self.inner.build(input_shape)
        self.scale = self.add_weight(shape=(self.units,), name="scale")

    def call(self, x):
        h = self.inner(x)
        return h * self.scale + keras.ops.sum(h, axis=-1, keepdims=True)

    def maskfit_output_units(self):
        return maskfit.OutputUnits(
            self.units,
            [(self.scale, maskfit.units_along(0))]
            + [(v, maskfit.SHARED) for v in self.inner.trainable_weights],
        )


class Undeclared(Inner):
    """The same layer with no declaration."""

    maskfit_output_units = None


class ScaledDense(L.Layer):
    """The example of docs/output_mask.md, as written there."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape):
        self.kernel = self.add_weight(
            shape=(input_shape[-1], self.units), name="kernel"
        )
        self.bias = self.add_weight(shape=(self.units,), name="bias")
        self.scale = self.add_weight(shape=(self.units,), name="scale")
        self.offset = keras.layers.Dense(1)  # reaches every unit: shared
        self.offset.build(input_shape)

    def call(self, x):
        return (x @ self.kernel + self.bias) * self.scale + self.offset(x)

    def maskfit_output_units(self):
        return maskfit.OutputUnits(
            self.units,
            [
                (self.kernel, maskfit.units_along(-1)),  # column u -> unit u
                (self.bias, maskfit.units_along(0)),
                (self.scale, maskfit.units_along(0)),
                (self.offset.kernel, maskfit.SHARED),
                (self.offset.bias, maskfit.SHARED),
            ],
            output_axis=-1,
        )


class SubDense(L.Dense):
    """A subclass of a known layer: not assumed to keep its layout."""


R = "REFUSED"
C = "CORRECT"
SEQ = (None, 3, 2)
CASES = [
    Case("Dense", mk(L.Dense, 4), ((None, 3),), 4, C),
    Case("Dense-3d", mk(L.Dense, 4), ((None, 2, 3),), 4, C),
    Case("Dense-lora", mk(L.Dense, 4, lora_rank=4), ((None, 4),), 4, C),
    Case(
        "EinsumDense",
        mk(L.EinsumDense, "ab,bc->ac", 4, bias_axes="c"),
        ((None, 3),),
        4,
        C,
    ),
    Case(
        "EinsumDense-kernel-axis-0",
        mk(L.EinsumDense, "ab,cb->ac", 4, bias_axes="c"),
        ((None, 4),),
        4,
        C,
    ),
    Case(
        "EinsumDense-lora-axis-0",
        mk(L.EinsumDense, "ab,cb->ac", 4, bias_axes="c", lora_rank=2),
        ((None, 3),),
        4,
        C,
    ),
    Case(
        "EinsumDense-3d",
        mk(L.EinsumDense, "abc,cde->abde", (2, 3, 4), bias_axes="de"),
        ((None, 2, 3),),
        4,
        C,
    ),
    Case(
        "EinsumDense-elided-units",
        mk(L.EinsumDense, "ab...,bc->ac...", (4, None)),
        ((None, 3, 2),),
        2,
        R,
    ),
    Case("Embedding", mk(L.Embedding, 5, 4), ((None, 3),), 4, C, ints=5),
    Case(
        "Embedding-lora", mk(L.Embedding, 5, 4, lora_rank=4), ((None, 3),), 4, C, ints=5
    ),
    # ReversibleEmbedding came in Keras 3.12: no case in an older Keras.
    *(
        [
            Case(
                "ReversibleEmbedding",
                mk(L.ReversibleEmbedding, 5, 4),
                ((None, 3),),
                4,
                R,
                ints=5,
            )
        ]
        if hasattr(L, "ReversibleEmbedding")
        else []
    ),
    Case("Conv1D", mk(L.Conv1D, 4, 2), ((None, 5, 3),), 4, C),
    Case("Conv1D-cf", cf(L.Conv1D, 4, 2), ((None, 3, 6),), 4, C, axis=1),
    # Keras 3 adds a channels_first bias along the last axis when the output's
    # last dimension equals the number of channels (keras.ops.add picks
    # tf.nn.bias_add "NHWC"): the bias entries are shared there.
    Case(
        "Conv1D-cf-width-equals-filters",
        cf(L.Conv1D, 4, 2),
        ((None, 3, 5),),
        4,
        R,
        axis=1,
    ),
    Case("Conv1D-lora", mk(L.Conv1D, 4, 2, lora_rank=2), ((None, 5, 3),), 4, C),
    Case("Conv2D", mk(L.Conv2D, 3, 2), ((None, 4, 4, 3),), 3, C),
    Case("Conv2D-cf", cf(L.Conv2D, 3, 2), ((None, 2, 4, 3),), 3, C, axis=1),
    Case("Conv2D-groups", mk(L.Conv2D, 4, 2, groups=2), ((None, 4, 4, 2),), 4, C),
    Case("Conv3D", mk(L.Conv3D, 2, 2), ((None, 3, 3, 3, 2),), 2, C),
    Case("Conv3D-cf", cf(L.Conv3D, 2, 2), ((None, 2, 3, 3, 4),), 2, C, axis=1),
    Case("Conv1DTranspose", mk(L.Conv1DTranspose, 3, 2), ((None, 4, 3),), 3, C),
    Case(
        "Conv1DTranspose-cf", cf(L.Conv1DTranspose, 3, 2), ((None, 3, 4),), 3, C, axis=1
    ),
    Case("Conv2DTranspose", mk(L.Conv2DTranspose, 3, 2), ((None, 3, 3, 3),), 3, C),
    Case(
        "Conv2DTranspose-cf",
        cf(L.Conv2DTranspose, 3, 2),
        ((None, 3, 3, 3),),
        3,
        C,
        axis=1,
    ),
    Case("Conv3DTranspose", mk(L.Conv3DTranspose, 2, 2), ((None, 2, 2, 2, 2),), 2, C),
    Case(
        "Conv3DTranspose-cf",
        cf(L.Conv3DTranspose, 2, 2),
        ((None, 2, 2, 2, 2),),
        2,
        C,
        axis=1,
    ),
    Case(
        "DepthwiseConv1D",
        mk(L.DepthwiseConv1D, 2, depth_multiplier=2),
        ((None, 5, 3),),
        6,
        C,
    ),
    Case(
        "DepthwiseConv1D-cf",
        cf(L.DepthwiseConv1D, 2, depth_multiplier=2),
        ((None, 3, 5),),
        6,
        C,
        axis=1,
    ),
    Case(
        "DepthwiseConv2D",
        mk(L.DepthwiseConv2D, 2, depth_multiplier=2),
        ((None, 3, 3, 2),),
        4,
        C,
    ),
    Case(
        "DepthwiseConv2D-cf",
        cf(L.DepthwiseConv2D, 2, depth_multiplier=2),
        ((None, 2, 3, 3),),
        4,
        C,
        axis=1,
    ),
    Case("SeparableConv1D", mk(L.SeparableConv1D, 4, 2), ((None, 5, 3),), 4, C),
    Case(
        "SeparableConv1D-cf", cf(L.SeparableConv1D, 4, 2), ((None, 3, 6),), 4, C, axis=1
    ),
    Case("SeparableConv2D", mk(L.SeparableConv2D, 3, 2), ((None, 3, 3, 2),), 3, C),
    Case(
        "SeparableConv2D-cf",
        cf(L.SeparableConv2D, 3, 2),
        ((None, 2, 3, 3),),
        3,
        C,
        axis=1,
    ),
    Case("BatchNormalization", mk(L.BatchNormalization), ((None, 4),), 4, C),
    Case(
        "BatchNormalization-axis1",
        mk(L.BatchNormalization, axis=1),
        ((None, 3, 4, 4),),
        3,
        C,
        axis=1,
    ),
    Case(
        "BatchNormalization-axis1-last-equal",
        mk(L.BatchNormalization, axis=1),
        ((None, 3, 4, 3),),
        3,
        C,
        axis=1,
    ),
    Case("LayerNormalization", mk(L.LayerNormalization), ((None, 3, 4),), 4, C),
    Case(
        "LayerNormalization-axis1-last-equal",
        mk(L.LayerNormalization, axis=1),
        ((None, 3, 3),),
        3,
        C,
        axis=1,
    ),
    Case(
        "GroupNormalization-axis1-last-equal",
        mk(L.GroupNormalization, groups=2, axis=1),
        ((None, 4, 4),),
        4,
        C,
        axis=1,
    ),
    Case(
        "LayerNormalization-axis1",
        mk(L.LayerNormalization, axis=1),
        ((None, 3, 4),),
        3,
        C,
        axis=1,
    ),
    Case(
        "LayerNormalization-axes12",
        mk(L.LayerNormalization, axis=[1, 2]),
        ((None, 3, 4),),
        4,
        C,
    ),
    Case(
        "GroupNormalization", mk(L.GroupNormalization, groups=2), ((None, 3, 4),), 4, C
    ),
    Case(
        "GroupNormalization-axis1",
        mk(L.GroupNormalization, groups=2, axis=1),
        ((None, 4, 3),),
        4,
        C,
        axis=1,
    ),
    Case("RMSNormalization", mk(L.RMSNormalization), ((None, 3, 4),), 4, C),
    # (RMSNormalization with axis != -1 cannot run at all in Keras 3.15: its
    # call multiplies by the unreshaped scale.)
    Case("PReLU", mk(L.PReLU), ((None, 3, 4),), 4, C),
    Case("PReLU-shared-time", mk(L.PReLU, shared_axes=[1]), ((None, 3, 4),), 4, C),
    Case("PReLU-shared-units", mk(L.PReLU, shared_axes=[2]), ((None, 3, 4),), 4, R),
    Case(
        "MultiHeadAttention",
        mk(L.MultiHeadAttention, 2, 4),
        ((None, 3, 4), (None, 2, 4)),
        4,
        C,
    ),
    Case(
        "GroupQueryAttention",
        mk(L.GroupQueryAttention, 4, 2, 1),
        ((None, 3, 4), (None, 2, 4)),
        4,
        C,
    ),
    Case(
        "Attention",
        mk(L.Attention, use_scale=True),
        ((None, 3, 4), (None, 2, 4)),
        4,
        R,
        as_list=True,
    ),
    Case(
        "AdditiveAttention",
        mk(L.AdditiveAttention, use_scale=True),
        ((None, 3, 4), (None, 2, 4)),
        4,
        R,
        as_list=True,
    ),
    Case("SimpleRNN", mk(L.SimpleRNN, 4), (SEQ,), 4, C, truth="cell"),
    Case("LSTM", mk(L.LSTM, 4), (SEQ,), 4, C, truth="cell"),
    Case(
        "LSTM-states",
        mk(L.LSTM, 3, return_sequences=True, return_state=True),
        (SEQ,),
        3,
        C,
        truth="cell",
    ),
    Case("GRU-reset-after", mk(L.GRU, 4, reset_after=True), (SEQ,), 4, C, truth="cell"),
    Case(
        "GRU-reset-before", mk(L.GRU, 4, reset_after=False), (SEQ,), 4, C, truth="cell"
    ),
    Case("RNN-LSTMCell", lambda: L.RNN(L.LSTMCell(3)), (SEQ,), 3, C, truth="cell"),
    Case("RNN-GRUCell", lambda: L.RNN(L.GRUCell(3)), (SEQ,), 3, C, truth="cell"),
    Case(
        "RNN-SimpleRNNCell",
        lambda: L.RNN(L.SimpleRNNCell(3)),
        (SEQ,),
        3,
        C,
        truth="cell",
    ),
    Case(
        "RNN-StackedRNNCells",
        lambda: L.RNN(L.StackedRNNCells([L.SimpleRNNCell(2), L.GRUCell(3)])),
        (SEQ,),
        3,
        C,
        truth="cell",
    ),
    Case("ConvLSTM1D", mk(L.ConvLSTM1D, 2, 2), ((None, 2, 4, 2),), 2, C, truth="cell"),
    Case(
        "ConvLSTM1D-cf",
        cf(L.ConvLSTM1D, 2, 2),
        ((None, 2, 2, 4),),
        2,
        C,
        axis=-2,
        truth="cell",
    ),
    Case(
        "ConvLSTM2D", mk(L.ConvLSTM2D, 2, 2), ((None, 2, 3, 3, 1),), 2, C, truth="cell"
    ),
    Case(
        "ConvLSTM2D-cf",
        cf(L.ConvLSTM2D, 2, 2),
        ((None, 2, 1, 3, 3),),
        2,
        C,
        axis=-3,
        truth="cell",
    ),
    Case(
        "ConvLSTM3D",
        mk(L.ConvLSTM3D, 2, 2),
        ((None, 2, 2, 2, 2, 1),),
        2,
        C,
        truth="cell",
    ),
    # (ConvLSTM3D with channels_first is left out: on CPU Keras compiles its
    # 5-D channels_first convolutions with XLA, call by call, 25 s here; the
    # 1-D and 2-D ConvLSTMs cover channels_first.)
    *[
        Case(
            f"Bidirectional-{merge}",
            (lambda merge=merge: L.Bidirectional(L.LSTM(2), merge_mode=merge)),
            (SEQ,),
            4 if merge in ("concat", None) else 2,
            C,
            truth="bidi",
        )
        for merge in ("concat", "sum", "ave", "mul", None)
    ],
    Case(
        "Bidirectional-GRU-states",
        lambda: L.Bidirectional(L.GRU(2, return_state=True)),
        (SEQ,),
        4,
        C,
        truth="bidi",
    ),
    Case(
        "Bidirectional-ConvLSTM1D-cf",
        lambda: L.Bidirectional(L.ConvLSTM1D(2, 2, data_format="channels_first")),
        ((None, 2, 2, 4),),
        2,
        C,
        axis=-2,
        truth="bidi",
    ),
    Case(
        "TimeDistributed-Dense",
        lambda: L.TimeDistributed(L.Dense(3)),
        ((None, 2, 4),),
        3,
        C,
    ),
    Case(
        "TimeDistributed-Conv2D-cf",
        lambda: L.TimeDistributed(L.Conv2D(3, 2, data_format="channels_first")),
        ((None, 2, 2, 3, 3),),
        3,
        C,
        axis=2,
    ),
    Case(
        "SpectralNormalization",
        lambda: L.SpectralNormalization(L.Dense(3)),
        ((None, 4),),
        3,
        R,
    ),
    Case(
        "STFTSpectrogram",
        mk(L.STFTSpectrogram, frame_length=8, frame_step=4, fft_length=8, window=None),
        ((None, 16, 1),),
        10,
        R,
    ),
    Case("Pipeline", lambda: L.Pipeline([L.Dense(3)]), ((None, 4),), 3, R),
    Case("custom-undeclared", lambda: Undeclared(3), ((None, 3),), 3, R),
    Case("custom-declared", lambda: Inner(3), ((None, 3),), 3, C),
    Case("custom-docs-example", lambda: ScaledDense(4), ((None, 3),), 4, C),
    Case("Dense-subclass", lambda: SubDense(3), ((None, 2),), 3, R),
]

# keras.layers classes without trainable weights, or that cannot run here.
WEIGHTLESS = {
    "Normalization": "its weights (adapted mean and variance) are not trainable",
    "InputLayer": "no weights",
    **{
        name: "holds only preprocessing layers, none with trainable weights"
        for name in ("AugMix", "RandAugment", "RandomColorJitter", "TextVectorization")
    },
}
NOT_HERE = {
    "Layer": "the base class (custom layers are covered by the custom cases)",
    "Wrapper": "an abstract base class (its call() is not implemented)",
    "JaxLayer": "wraps JAX functions: needs the JAX backend",
    "FlaxLayer": "wraps Flax modules: needs the JAX backend",
    "TorchModuleWrapper": "wraps torch modules: needs the torch backend",
    "TFSMLayer": (
        "wraps an exported SavedModel (a test would export one): refused by the"
        " same no-layout rule as Pipeline"
    ),
}


def keras_layer_classes():
    found = {}
    for name in dir(L):
        obj = getattr(L, name)
        if inspect.isclass(obj) and issubclass(obj, L.Layer):
            found.setdefault(obj, name)
    return found


def _nested(layer):
    yield type(layer)
    for attr in ("layer", "cell", "forward_layer", "backward_layer"):
        if isinstance(getattr(layer, attr, None), L.Layer):
            yield from _nested(getattr(layer, attr))
    for cell in getattr(layer, "cells", None) or ():
        yield from _nested(cell)


def _defines_weights(cls):
    """Whether code between `cls` and Layer calls add_weight or makes a weighted layer.

    Docstrings do not count: only calls in the code (read with `ast`).
    """
    makers = {"add_weight", "add_variable"} | {
        name for name, obj in vars(L).items() if inspect.isclass(obj)
    } - {"Layer", "InputSpec"}
    for klass in cls.__mro__:
        if klass in (L.Layer, object) or not klass.__module__.startswith("keras"):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                name = (
                    func.attr
                    if isinstance(func, ast.Attribute)
                    else getattr(func, "id", "")
                )
                if name in makers:
                    return True
    return False


def test_every_keras_layer_class_is_swept_or_listed():
    covered = {cls for case in CASES for cls in _nested(case.make())}
    listed = set(WEIGHTLESS) | set(NOT_HERE)
    unknown = []
    for cls, name in keras_layer_classes().items():
        if cls in covered or name in listed:
            continue
        if _defines_weights(cls):
            unknown.append(name)
    # A new weighted Keras layer must join CASES (or the lists, with a reason).
    assert not unknown, f"keras.layers classes with weights not in the sweep: {unknown}"
    normalization = L.Normalization()
    normalization.build((None, 3))
    assert normalization.weights and not normalization.trainable_weights
    assert type(L.ConvLSTM2D(1, 1).cell) in covered  # not exported by keras.layers


def _random_weights(layer, rng):
    for v in layer.trainable_weights:
        shape = tuple(v.shape)
        fan_in = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        v.assign(rng.normal(size=shape).astype(v.dtype) / np.sqrt(max(fan_in, 1)))


def _inputs(case, rng, batch=BATCH):
    shapes = [
        (batch,) + tuple(3 if d is None else d for d in s[1:]) for s in case.shapes
    ]
    if case.ints:
        return [np.arange(int(np.prod(s))).reshape(s) % case.ints for s in shapes]
    return [rng.normal(size=s).astype("float32") for s in shapes]


def _call(case, layer, inputs):
    if case.as_list:
        return keras_versions.call_or_xla(lambda: layer(list(inputs)))
    return keras_versions.call_or_xla(lambda: layer(*inputs))


def _cell_step(rnn, x_shape, rng):
    cell = rnn.cell
    states = rnn.get_initial_state(BATCH)
    states = tf.nest.map_structure(
        lambda s: tf.constant(rng.normal(size=tuple(s.shape)), "float32"), states
    )
    x = tf.constant(rng.normal(size=(BATCH,) + tuple(x_shape[2:])), "float32")
    output, _ = keras_versions.call_or_xla(lambda: cell(x, states))
    return output


def _pieces(case, layer, rng):
    """`[(tensor, unit axis, first unit)]`: the outputs, computed without maskfit."""
    if case.truth == "call":
        out = tf.nest.flatten(
            _call(case, layer, [tf.constant(x) for x in _inputs(case, rng)])
        )
        return [(out[0], case.axis, 0)]
    shape = case.shapes[0]
    if case.truth == "cell":
        return [(_cell_step(layer, shape, rng), case.axis, 0)]
    forward = _cell_step(layer.forward_layer, shape, rng)
    backward = _cell_step(layer.backward_layer, shape, rng)
    side_by_side = layer.merge_mode not in ("concat", None) or case.axis != -1
    offset = 0 if side_by_side else case.units // 2
    return [(forward, case.axis, 0), (backward, case.axis, offset)]


def ground_truth(case, layer, draws=3, seed=1):
    """Per variable: the unit each entry belongs to, -2 where shared, -1 if none.

    From TensorFlow's tape, or under JAX and torch from a vjp: which entries' gradients
    each unit's outputs reach."""
    rng = np.random.default_rng(seed)
    variables = layer.trainable_weights
    reached = [[np.zeros(v.shape, bool) for v in variables] for _ in range(case.units)]
    reach = _reached_by_tape if BACKEND == "tensorflow" else _reached_by_vjp
    for _ in range(draws):
        reach(case, layer, variables, rng, reached)
    owners = {}
    for i, v in enumerate(variables):
        hits = np.stack([reached[u][i] for u in range(case.units)])
        count = hits.sum(axis=0)
        owner = np.where(count == 1, hits.argmax(axis=0), -1)
        owners[v.path] = np.where(count > 1, -2, owner)
    return owners


def _reached_by_tape(case, layer, variables, rng, reached):
    with tf.GradientTape(persistent=True) as tape:
        pieces = _pieces(case, layer, rng)
        totals = []
        for unit in range(case.units):
            total = tf.zeros([])
            for out, axis, first in pieces:
                if 0 <= unit - first < out.shape[axis]:
                    piece = tf.gather(tf.cast(out, "float32"), unit - first, axis=axis)
                    weight = rng.uniform(0.5, 1.5, size=piece.shape)
                    total += tf.reduce_sum(piece * tf.constant(weight, "float32"))
            totals.append(total)
    for unit, total in enumerate(totals):
        # The tf.Variables: Keras variables' string dtype breaks "zero".
        sources = [v.value for v in variables]
        grads = tape.gradient(total, sources, unconnected_gradients="zero")
        for i, grad in enumerate(grads):
            reached[unit][i] |= tf.convert_to_tensor(grad).numpy() != 0


def _jax_cell_inputs(rnn, x_shape, rng):
    states = keras.tree.map_structure(
        lambda s: rng.normal(size=tuple(s.shape)).astype("float32"),
        rnn.get_initial_state(BATCH),
    )
    x = rng.normal(size=(BATCH,) + tuple(x_shape[2:])).astype("float32")
    return lambda: rnn.cell(x, states)[0]


def _jax_pieces(case, layer, rng):
    """`(outputs, [(unit axis, first unit)])`: a function of nothing, and its layout."""
    if case.truth == "call":
        inputs = _inputs(case, rng)
        if case.as_list:
            return lambda: keras.tree.flatten(layer(list(inputs)))[:1], [(case.axis, 0)]
        return lambda: keras.tree.flatten(layer(*inputs))[:1], [(case.axis, 0)]
    shape = case.shapes[0]
    if case.truth == "cell":
        step = _jax_cell_inputs(layer, shape, rng)
        return lambda: [step()], [(case.axis, 0)]
    forward = _jax_cell_inputs(layer.forward_layer, shape, rng)
    backward = _jax_cell_inputs(layer.backward_layer, shape, rng)
    side_by_side = layer.merge_mode not in ("concat", None) or case.axis != -1
    offset = 0 if side_by_side else case.units // 2
    return lambda: [forward(), backward()], [(case.axis, 0), (case.axis, offset)]


def _reached_by_vjp(case, layer, variables, rng, reached):
    """JAX's `jax.vjp`, or torch's autograd made into one (`maskfit.units.pullback`)."""
    from maskfit.units import pullback

    outputs, layout = _jax_pieces(case, layer, rng)

    def call(values):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return [keras.ops.cast(o, "float32") for o in outputs()]

    pieces, pull = pullback.vjp(call, [v.value for v in variables])
    for unit in range(case.units):
        cotangents = []
        for piece, (axis, first) in zip(pieces, layout):
            cotangent = np.zeros(piece.shape, np.float32)
            if 0 <= unit - first < piece.shape[axis]:
                index = [slice(None)] * len(piece.shape)
                index[axis] = unit - first
                size = cotangent[tuple(index)].shape
                cotangent[tuple(index)] = rng.uniform(0.5, 1.5, size=size)
            cotangents.append(cotangent)
        (grads,) = pull(cotangents)
        for i, grad in enumerate(grads):
            reached[unit][i] |= np.asarray(grad) != 0


def _build(case):
    keras.utils.set_random_seed(0)
    layer = case.make()
    dtype = "int32" if case.ints else "float32"
    inputs = [keras.Input(s[1:], dtype=dtype) for s in case.shapes]
    outputs = _call(case, layer, inputs)
    _random_weights(layer, np.random.default_rng(0))
    return layer, maskfit.MaskedModel(inputs, outputs)


# Recurrent convolutions in channels_first: on CPUs whose TensorFlow runs
# them only under XLA, tens of seconds each.
def _slow(case_id):
    """channels_first cases run with the slow tests (.ci/run runs them): on a CPU
    whose TensorFlow runs those convolutions only under XLA, each compiles. JAX
    runs them all in the default run."""
    return BACKEND == "tensorflow" and case_id.endswith("-cf")


def _marks(case_id):
    marks = [pytest.mark.slow] if _slow(case_id) else []
    if BACKEND == "torch" and case_id.startswith("LayerNormalization-axis1"):
        # Keras 3.15.1's torch LayerNormalization fails on any axis but the
        # last (torch.layer_norm normalizes trailing axes only), stock too.
        marks.append(pytest.mark.skip(reason="Keras's torch LayerNormalization"))
    return marks


@_ALL
@pytest.mark.parametrize(
    "case",
    [pytest.param(c, id=c.id, marks=_marks(c.id)) for c in CASES],
)
def test_output_mask_is_correct_or_refused_on_every_keras_layer(case):
    layer, model = _build(case)
    frozen_units = np.arange(case.units) % 2 == 0
    spec = maskfit.OutputMask(np.where(frozen_units, 0.0, 1.0))
    verdict = case.verdict
    if BACKEND != "tensorflow" and case.id.endswith("-width-equals-filters"):
        # The TensorFlow quirk above, which maskfit finds by running it; JAX
        # adds the bias along the channels.
        verdict = R if versions.adds_channels_first_bias_on_last_axis() else C
    if verdict == R:
        with pytest.raises(ValueError) as info:
            maskfit.set_mask(layer, spec)
        message = str(info.value)
        assert f"'{layer.name}'" in message and type(layer).__name__ in message
        assert "ElementMask" in message
        return
    owners = ground_truth(case, layer)
    maskfit.set_mask(layer, spec)
    before = {v.path: np.array(v) for v in layer.trainable_weights}
    # Eager, unless this CPU runs channels_first convolutions only under XLA;
    # compiled under JAX.
    mode = dict(run_eagerly=True)
    if keras_versions.CHANNELS_FIRST_NEEDS_XLA and case.id.endswith("-cf"):
        mode = dict(jit_compile=True)
    if BACKEND == "jax":
        mode = dict(jit_compile=True)
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse", **mode)
    rng = np.random.default_rng(2)
    x = _inputs(case, rng, batch=16)
    y = [
        rng.normal(size=(16,) + tuple(o.shape[1:]))
        for o in keras.tree.flatten(model.outputs)
    ]
    for _ in range(3):
        model.train_on_batch(x, y)
    frozen_checked = 0
    for v in layer.trainable_weights:
        owner, old, new = owners[v.path], before[v.path], np.array(v)
        frozen = (owner >= 0) & frozen_units[np.maximum(owner, 0)]
        learns = ((owner >= 0) & ~frozen) | (owner == -2)
        np.testing.assert_array_equal(new[frozen], old[frozen], err_msg=v.path)
        assert np.all(new[learns] != old[learns]), (
            f"{v.path}: owned or shared entries did not move"
        )
        frozen_checked += int(frozen.sum())
    assert frozen_checked > 0


def test_wrong_length_is_rejected_for_a_layer_without_units_or_filters():
    query = keras.Input((2, 3))
    attention = L.MultiHeadAttention(num_heads=2, key_dim=2, name="mha")
    attention(query, query)
    with pytest.raises(ValueError, match=r"'mha' has 2 values .* 3 output units"):
        maskfit.set_mask(attention, maskfit.OutputMask([1, 0]))


def test_wrong_length_on_an_unbuilt_layer_fails_before_any_step():
    inputs = keras.Input((4, 4, 2))
    layer = maskfit.set_mask(
        L.DepthwiseConv2D(2, name="dw"), maskfit.OutputMask([1, 0, 1])
    )
    model = maskfit.MaskedModel(inputs, layer(inputs))  # 2 channels, not 3
    model.compile(optimizer="adam", loss="mse")
    before = layer.kernel.numpy()
    with pytest.raises(ValueError, match=r"'dw' has 3 values .* 2 output units"):
        model.fit(np.ones((2, 4, 4, 2)), np.ones((2, 3, 3, 2)), verbose=0)
    np.testing.assert_array_equal(layer.kernel.numpy(), before)
    assert int(model.optimizer.iterations.numpy()) == 0


def test_undeclared_custom_layer_is_refused_at_set_mask_even_unbuilt():
    with pytest.raises(ValueError) as info:
        maskfit.set_mask(Undeclared(3, name="mine"), maskfit.OutputMask([1, 0, 1]))
    message = str(info.value)
    for word in (
        "'mine'",
        "Undeclared",
        "maskfit_output_units",
        "register_output_units",
    ):
        assert word in message
    with pytest.raises(
        ValueError, match=r"register_output_units\(SubDense, keras.layers.Dense\)"
    ):
        maskfit.set_mask(SubDense(3), maskfit.OutputMask([1, 0, 1]))


class Gain(L.Layer):
    """`x * gain`: each gain entry belongs to one unit; not declared by itself."""

    def build(self, input_shape):
        self.gain = self.add_weight(shape=(input_shape[-1],), name="gain")

    def call(self, x):
        return x * self.gain


def test_register_output_units_by_function_and_by_class():
    layer = Gain(name="gain")
    layer.build((None, 3))
    with pytest.raises(ValueError, match="Gain"):
        maskfit.set_mask(layer, maskfit.OutputMask([1, 0, 1]))
    maskfit.register_output_units(
        Gain,
        lambda g: maskfit.OutputUnits(
            g.gain.shape[0], {"gain": maskfit.units_along(0)}
        ),
    )
    maskfit.register_output_units(SubDense, L.Dense)
    try:
        maskfit.set_mask(layer, maskfit.OutputMask([1, 0, 1]))
        sub = SubDense(2)
        sub.build((None, 3))
        maskfit.set_mask(sub, maskfit.OutputMask([1, 0]))
        [(_, mask, _)] = maskfit.OutputMask([1, 0, 1]).resolve(layer)
        np.testing.assert_array_equal(mask, [1, 0, 1])
    finally:
        maskfit.register_output_units(Gain, None)
        maskfit.register_output_units(SubDense, None)
    with pytest.raises(ValueError, match="Gain"):
        maskfit.set_mask(Gain(), maskfit.OutputMask([1, 0, 1]))


class Transposed(L.Layer):
    """`x @ kernel.T`: the units sit on the kernel's axis 0."""

    def __init__(self, units, axis, **kwargs):
        super().__init__(**kwargs)
        self.units, self.axis = units, axis

    def build(self, input_shape):
        self.kernel = self.add_weight(
            shape=(self.units, input_shape[-1]), name="kernel"
        )

    def call(self, x):
        return x @ keras.ops.transpose(self.kernel)

    def maskfit_output_units(self):
        return maskfit.OutputUnits(
            self.units, {"kernel": maskfit.units_along(self.axis)}
        )


@_BOTH
def test_self_check_refuses_a_wrong_declaration():
    right = Transposed(3, axis=0, name="right")
    right.build((None, 3))  # square kernel: a last-axis guess would fit the shapes
    maskfit.set_mask(right, maskfit.OutputMask([1, 0, 1]))
    wrong = Transposed(3, axis=-1, name="wrong")
    wrong.build((None, 3))
    with pytest.raises(ValueError) as info:
        maskfit.set_mask(wrong, maskfit.OutputMask([1, 0, 1]))
    message = str(info.value)
    assert "'wrong'" in message and "disagree with its gradients" in message
    assert "'wrong/kernel' entry (0, 1) is declared to belong to unit 1" in message


def test_a_passed_self_check_is_reused_for_stock_layers_of_the_same_signature(
    monkeypatch,
):
    from maskfit.units import layout

    checked = []
    real = layout.probe_lib.check

    def check(layer, *args):
        checked.append(layer.name)
        return real(layer, *args)

    monkeypatch.setattr(layout.probe_lib, "check", check)
    monkeypatch.setattr(layout, "_PASSED", type(layout._PASSED)())

    def built(layer, shape):
        layer.build(shape)
        return layer

    layers = [
        built(L.Dense(3, name="a"), (None, 4)),
        built(L.Dense(3, name="b"), (None, 4)),  # a's signature: not checked
        built(L.Dense(3, name="c"), (None, 5)),  # another input width
        built(L.Dense(3, use_bias=False, name="d"), (None, 4)),  # another config
        built(L.Dense(3, dtype="mixed_float16", name="m"), (None, 4)),  # policy
        built(L.TimeDistributed(L.Dense(3), name="e"), (None, 2, 4)),
        built(L.TimeDistributed(L.Dense(3), name="f"), (None, 2, 4)),
        built(L.TimeDistributed(SubDense(3), name="g"), (None, 2, 4)),  # user's
        built(L.TimeDistributed(SubDense(3), name="h"), (None, 2, 4)),
        built(Transposed(3, axis=0, name="i"), (None, 3)),  # a user's layer
        built(Transposed(3, axis=0, name="j"), (None, 3)),
    ]
    maskfit.register_output_units(SubDense, L.Dense)
    try:
        for layer in layers:
            assert layout.layer_units(layer).units == 3
    finally:
        maskfit.register_output_units(SubDense, None)
    assert checked == ["a", "c", "d", "m", "e", "g", "h", "i", "j"]


def test_self_check_says_what_it_needs_when_no_input_shape_is_known():
    class Eager(L.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.w = self.add_weight(shape=(2,), name="w")

        def call(self, x):
            return x * self.w

        def maskfit_output_units(self):
            return maskfit.OutputUnits(
                2, {"w": maskfit.units_along(0)}, probe_inputs=self.probe
            )

        probe = None

    layer = Eager(name="eager")
    layer.built = True  # its weights exist, but build() never saw a shape
    with pytest.raises(
        ValueError, match=r"'eager'.*recorded no input shape.*probe_inputs"
    ):
        maskfit.set_mask(layer, maskfit.OutputMask([1, 0]))
    layer.probe = lambda rng: rng.normal(size=(2, 2)).astype("float32")
    maskfit.set_mask(layer, maskfit.OutputMask([1, 0]))


def test_spectral_normalization_around_a_masked_layer_is_refused_at_plan_time():
    inputs = keras.Input((4,))
    dense = maskfit.set_mask(L.Dense(2, name="inner"), maskfit.OutputMask([1, 0]))
    model = maskfit.MaskedModel(inputs, L.SpectralNormalization(dense)(inputs))
    model.compile(optimizer="adam", loss="mse")
    with pytest.raises(ValueError, match=r"'inner'.*SpectralNormalization.*rewrites"):
        model.fit(np.ones((2, 4)), np.ones((2, 2)), verbose=0)


@_BOTH
@pytest.mark.other_modes_slow  # .ci/run runs eager and jit
@pytest.mark.parametrize(
    "make",
    [
        lambda: L.LSTM(3, return_sequences=True),
        lambda: L.GRU(3, reset_after=True),
        lambda: L.GRU(3, reset_after=False),
    ],
    ids=["LSTM", "GRU-reset-after", "GRU-reset-before"],
)
def test_recurrent_gate_blocks_stay_frozen_in_every_mode(make, mode):
    keras.utils.set_random_seed(3)
    inputs = keras.Input((4, 2))
    layer = make()
    model = maskfit.MaskedModel(inputs, layer(inputs))
    cell = layer.cell
    maskfit.set_mask(layer, maskfit.OutputMask([0, 1, 1]))
    blocks = cell.kernel.shape[-1] // 3
    shared_r = not getattr(cell, "reset_after", True)
    frozen_columns = [b * 3 for b in range(blocks) if not (shared_r and b == 1)]
    before = {v.path: np.array(v) for v in layer.trainable_weights}
    model.compile(optimizer=keras.optimizers.AdamW(0.05), loss="mse", **mode)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 4, 2))
    y = rng.normal(size=(8,) + tuple(model.output.shape[1:]))
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    for v in layer.trainable_weights:
        old, new = before[v.path], np.array(v)
        np.testing.assert_array_equal(
            new[..., frozen_columns], old[..., frozen_columns]
        )
        assert np.all(new[..., 1::3] != old[..., 1::3])  # unit 1 in every block
        if shared_r:  # the reset gate's columns are shared: unit 0's too
            assert np.all(new[..., 3] != old[..., 3])


def test_backprop_gate_on_channels_first_blocks_the_channel_axis(mode):
    keras.utils.set_random_seed(4)
    inputs = keras.Input(
        (3, 4, 3)
    )  # channels == width == 3: no shape coincidence helps
    upstream = L.Conv2D(3, 1, data_format="channels_first", name="upstream")
    gated = L.Conv2D(3, 1, data_format="channels_first", use_bias=False, name="gated")
    model = maskfit.MaskedModel(inputs, gated(upstream(inputs)))
    gated.kernel.assign(np.eye(3).reshape(1, 1, 3, 3))
    maskfit.set_mask(gated, maskfit.OutputMask([1, 0, 1], backprop=True))
    x = tf.constant(np.random.default_rng(0).normal(size=(2, 3, 4, 3)), "float32")
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = keras_versions.call_or_xla(lambda: gated(x))
        weight = tf.reshape(tf.range(1.0, 1.0 + out.shape.num_elements()), out.shape)
        loss = tf.reduce_sum(out * weight)
    dx = tape.gradient(loss, x).numpy()
    assert np.all(dx[:, 1] == 0) and np.all(dx[:, [0, 2]] != 0)  # not dx[..., 1]
    # Trained: the upstream channel feeding only the frozen unit gets no gradient.
    if keras_versions.CHANNELS_FIRST_NEEDS_XLA and not mode.get("jit_compile"):
        pytest.skip(keras_versions.NEEDS_XLA_REASON)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", **mode)
    kernel = upstream.kernel.numpy().copy()
    rng = np.random.default_rng(1)
    model.fit(rng.normal(size=(4, 3, 4, 3)), rng.normal(size=(4, 3, 4, 3)), verbose=0)
    np.testing.assert_array_equal(upstream.kernel.numpy()[..., 1], kernel[..., 1])
    assert np.all(upstream.kernel.numpy()[..., [0, 2]] != kernel[..., [0, 2]])


@_BOTH
def test_new_values_on_a_recurrent_layer_need_no_retrace():
    traces = []

    class Counting(maskfit.MaskedModel):
        def train_step(self, *args):  # (data); JAX's (state, data)
            traces.append(1)
            return super().train_step(*args)

    inputs = keras.Input((3, 2))
    layer = L.GRU(4)
    model = Counting(inputs, layer(inputs))
    maskfit.set_mask(layer, maskfit.OutputMask([1, 0, 1, 0]))
    model.compile(optimizer="adam", loss="mse")
    x, y = np.ones((4, 3, 2)), np.ones((4, 4))
    model.fit(x, y, verbose=0)
    count = len(traces)
    maskfit.set_mask(layer, maskfit.OutputMask([0, 1, 0, 1]))
    kernel = np.array(layer.cell.kernel)
    model.fit(x, y, verbose=0)
    assert len(traces) == count
    np.testing.assert_array_equal(np.array(layer.cell.kernel)[:, 0::4], kernel[:, 0::4])


def test_quantized_layers_are_refused():
    dense = L.Dense(3, name="q")
    dense.build((None, 4))
    dense.quantize("int8")
    with pytest.raises(ValueError, match=r"'q'.*quantized \(int8\).*ElementMask"):
        maskfit.set_mask(dense, maskfit.OutputMask([1, 0, 1]))
