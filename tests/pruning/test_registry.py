"""The registry of prunable weights: all Keras 3 layers, custom layers, models."""

import inspect

import keras
import numpy as np
import pytest

from maskfit import pruning
from maskfit.pruning import registry


@pytest.fixture(autouse=True)
def _fresh_keras():
    """Overrides conftest's with a cheaper reset: fresh layer names without the
    gc.collect of clear_session(free_memory=True), ~0.3 s per test."""
    keras.backend.clear_session(free_memory=False)
    yield


def _public_layer_classes():
    classes = {
        value
        for name in dir(keras.layers)
        if inspect.isclass(value := getattr(keras.layers, name))
        and issubclass(value, keras.layers.Layer)
    }
    return sorted(classes - registry.BASE_CLASSES, key=lambda c: c.__name__)


def test_every_keras_layer_class_is_classified():
    # Fails when Keras adds a layer: decide what pruning it means, then add it.
    unclassified = [
        c.__name__
        for c in _public_layer_classes()
        if pruning.classify(c).kind == "custom"
    ]
    assert unclassified == []


def _built(layer, *shapes):
    layer.build(*shapes)
    return layer


# (layer, expected variable paths below the layer's own name).
_PRUNABLE_CASES = [
    (lambda: _built(keras.layers.Dense(3), (None, 4)), ["kernel"]),
    (lambda: _built(keras.layers.EinsumDense("ab,bc->ac", 3), (None, 4)), ["kernel"]),
    (lambda: _built(keras.layers.Embedding(10, 4), (None, 2)), ["embeddings"]),
    pytest.param(
        lambda: _built(
            keras.layers.ReversibleEmbedding(10, 4, tie_weights=False), (None, 2)
        ),
        ["embeddings", "reverse_embeddings"],
        marks=pytest.mark.skipif(
            not hasattr(keras.layers, "ReversibleEmbedding"),
            reason=f"Keras {keras.__version__} has no ReversibleEmbedding (3.12+)",
        ),
    ),
    (lambda: _built(keras.layers.Conv1D(3, 2), (None, 5, 2)), ["kernel"]),
    (lambda: _built(keras.layers.Conv2D(3, 2), (None, 5, 5, 2)), ["kernel"]),
    (lambda: _built(keras.layers.Conv3D(3, 2), (None, 4, 4, 4, 2)), ["kernel"]),
    (lambda: _built(keras.layers.Conv1DTranspose(3, 2), (None, 5, 2)), ["kernel"]),
    (lambda: _built(keras.layers.Conv2DTranspose(3, 2), (None, 5, 5, 2)), ["kernel"]),
    (
        lambda: _built(keras.layers.Conv3DTranspose(3, 2), (None, 4, 4, 4, 2)),
        ["kernel"],
    ),
    (
        lambda: _built(keras.layers.SeparableConv1D(3, 2), (None, 5, 2)),
        ["pointwise_kernel"],
    ),
    (
        lambda: _built(keras.layers.SeparableConv2D(3, 2), (None, 5, 5, 2)),
        ["pointwise_kernel"],
    ),
    (lambda: _built(keras.layers.DepthwiseConv2D(2), (None, 5, 5, 2)), []),
    (lambda: _built(keras.layers.BatchNormalization(), (None, 4)), []),
    (lambda: _built(keras.layers.GroupNormalization(2), (None, 4)), []),
    (lambda: _built(keras.layers.PReLU(), (None, 4)), []),
    (
        lambda: _built(
            keras.layers.Attention(use_scale=True), [(None, 2, 4), (None, 2, 4)]
        ),
        [],
    ),
    (
        lambda: _built(keras.layers.LSTM(3), (None, 2, 4)),
        ["lstm_cell/kernel", "lstm_cell/recurrent_kernel"],
    ),
    (
        lambda: _built(keras.layers.GRU(3), (None, 2, 4)),
        ["gru_cell/kernel", "gru_cell/recurrent_kernel"],
    ),
    (
        lambda: _built(keras.layers.SimpleRNN(3), (None, 2, 4)),
        ["simple_rnn_cell/kernel", "simple_rnn_cell/recurrent_kernel"],
    ),
    (
        lambda: _built(keras.layers.ConvLSTM1D(2, 3), (None, 2, 5, 1)),
        ["conv_lstm_cell/kernel", "conv_lstm_cell/recurrent_kernel"],
    ),
    (
        lambda: _built(
            keras.layers.RNN(
                keras.layers.StackedRNNCells(
                    [
                        keras.layers.LSTMCell(2, name="a"),
                        keras.layers.GRUCell(3, name="b"),
                    ]
                )
            ),
            (None, 2, 4),
        ),
        [
            "stacked_rnn_cells/a/kernel",
            "stacked_rnn_cells/a/recurrent_kernel",
            "stacked_rnn_cells/b/kernel",
            "stacked_rnn_cells/b/recurrent_kernel",
        ],
    ),
    (
        lambda: _built(keras.layers.Bidirectional(keras.layers.GRU(2)), (None, 3, 4)),
        [
            "forward_gru/gru_cell/kernel",
            "forward_gru/gru_cell/recurrent_kernel",
            "backward_gru/gru_cell/kernel",
            "backward_gru/gru_cell/recurrent_kernel",
        ],
    ),
    (
        lambda: _built(
            keras.layers.TimeDistributed(keras.layers.Dense(2)), (None, 3, 4)
        ),
        ["dense/kernel"],
    ),
    (
        lambda: _built(
            keras.layers.MultiHeadAttention(2, 4), (None, 3, 5), (None, 3, 5)
        ),
        ["query/kernel", "key/kernel", "value/kernel", "attention_output/kernel"],
    ),
    pytest.param(
        lambda: _built(
            keras.layers.GroupQueryAttention(4, 2, 1), (None, 3, 5), (None, 3, 5)
        ),
        ["query/kernel", "key/kernel", "value/kernel", "attention_output/kernel"],
        marks=pytest.mark.skipif(
            not hasattr(keras.layers, "GroupQueryAttention"),
            reason=f"Keras {keras.__version__} has no GroupQueryAttention",
        ),
    ),
]


@pytest.mark.parametrize("make, expected", _PRUNABLE_CASES)
def test_built_in_layers_prune_what_tfmot_prunes(make, expected):
    layer = make()

    paths = [v.path for v in pruning.prunable_weights(layer)]

    assert paths == [f"{layer.name}/{suffix}" for suffix in expected]


def test_owners_are_the_layers_that_hold_the_variables():
    lstm = _built(keras.layers.LSTM(3), (None, 2, 4))
    ((owner, variables),) = pruning.prunable_layers(lstm)
    assert owner is lstm.cell
    assert [v.name for v in variables] == ["kernel", "recurrent_kernel"]


def test_models_of_every_kind_are_walked_and_shared_layers_counted_once():
    shared = keras.layers.Dense(4, name="shared")
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(2, name="head")(shared(shared(inputs)))
    inner = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3, name="inner")])
    functional = keras.Model(inputs, inner(keras.layers.BatchNormalization()(outputs)))

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.blocks = [
                keras.layers.Dense(3, name="b0"),
                keras.layers.Dense(3, name="b1"),
            ]
            self.norm = keras.layers.LayerNormalization()

        def call(self, x):
            return self.norm(self.blocks[1](self.blocks[0](x)))

    subclassed = Subclassed()
    subclassed(np.ones((1, 2), np.float32))

    assert [v.path for v in pruning.prunable_weights(functional)] == [
        "shared/kernel",
        "head/kernel",
        "sequential/inner/kernel",
    ]
    assert [v.name for v in pruning.prunable_weights(subclassed)] == [
        "kernel",
        "kernel",
    ]
    assert [o.name for o, _ in pruning.prunable_layers(subclassed)] == ["b0", "b1"]


class _Undeclared(keras.layers.Layer):
    """A custom layer with variables of its own and no declaration."""

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], 2), name="kernel")
        self.scale = self.add_weight(shape=(2,), name="scale")

    def call(self, x):
        return x @ self.kernel * self.scale


class _Declared(_Undeclared):
    def get_prunable_weights(self):
        return [self.kernel]


class _Mixin(pruning.PrunableLayer, _Undeclared):
    """TF-MOT's way: mix in PrunableLayer."""

    def get_prunable_weights(self):
        return [self.scale]


class _Composite(keras.layers.Layer):
    """Only sublayers: pruned through them."""

    def __init__(self):
        super().__init__()
        self.first = keras.layers.Dense(3)
        self.second = _Declared()

    def build(self, input_shape):
        self.first.build(input_shape)
        self.second.build((None, 3))

    def call(self, x):
        return self.second(self.first(x))


def test_custom_layers_declare_their_prunable_weights():
    declared = _built(_Declared(), (None, 3))
    composite = _built(_Composite(), (None, 3))
    weightless = _built(keras.layers.Layer(), (None, 3))

    assert pruning.prunable_weights(declared) == [declared.kernel]
    assert pruning.prunable_weights(composite) == [
        composite.first.kernel,
        composite.second.kernel,
    ]
    assert pruning.prunable_weights(weightless) == []
    assert pruning.classify(_Declared).kind == "custom"
    mixin = _built(_Mixin(), (None, 3))
    assert pruning.prunable_weights(mixin) == [mixin.scale]
    with pytest.raises(TypeError):

        class Abstract(pruning.PrunableLayer, keras.layers.Layer):
            pass

        Abstract()


def test_an_undeclared_custom_layer_gets_an_error_naming_it_and_the_fix():
    layer = _built(_Undeclared(name="mystery"), (None, 3))
    with pytest.raises(
        ValueError,
        match=r"'mystery' \(_Undeclared\) has variables"
        r" \['kernel', 'scale'\].*get_prunable_weights\(self\)",
    ):
        pruning.prunable_weights(layer)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3), layer])
    with pytest.raises(ValueError, match="'mystery'"):
        pruning.prunable_weights(model)


def test_a_subclass_of_a_built_in_layer_must_declare():
    class MyDense(keras.layers.Dense):
        pass

    layer = _built(MyDense(2, name="mine"), (None, 3))
    with pytest.raises(
        ValueError, match="subclasses keras.layers.Dense.*exact classes"
    ):
        pruning.prunable_weights(layer)


def test_a_bad_declaration_is_refused():
    class Wrong(_Declared):
        def get_prunable_weights(self):
            return [self.kernel * 2.0]

    with pytest.raises(
        ValueError, match=r"get_prunable_weights\(\) must return a list"
    ):
        pruning.prunable_weights(_built(Wrong(), (None, 3)))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: keras.layers.Dense(3), "is not built"),
        (
            lambda: _built(
                keras.layers.SpectralNormalization(keras.layers.Dense(2)), (None, 3)
            ),
            "rewrites the wrapped layer's kernel",
        ),
        (lambda: _built(keras.layers.Dense(3, lora_rank=2), (None, 4)), "LoRA enabled"),
    ],
)
def test_layers_that_cannot_be_pruned_say_why(make, message):
    with pytest.raises(ValueError, match=message):
        pruning.prunable_weights(make())


def test_a_quantized_layer_is_refused():
    layer = _built(keras.layers.Dense(4), (None, 4))
    layer.quantize("int8")
    with pytest.raises(ValueError, match="quantized"):
        pruning.prunable_weights(layer)


def test_a_non_layer_is_a_type_error():
    with pytest.raises(TypeError, match="keras.layers.Layer or keras.Model"):
        pruning.prunable_layers([keras.layers.Dense(2)])
