"""Every keras.layers class is coupled or refused; each one with weights is
pruned in a test model (test_pruning_units_shrink) or refused with its reason."""

import inspect

import keras
import pytest

from maskfit import internals
from maskfit.pruning import couplings
from maskfit.pruning import couplings_keras
from maskfit.pruning import couplings_passing
from maskfit.pruning import couplings_sequence
from maskfit.pruning import unit_graph

import structured_models as models

L = keras.layers


@pytest.fixture(autouse=True)
def _fresh_keras():
    keras.backend.clear_session(free_memory=False)
    keras.utils.set_random_seed(0)
    yield


def _public_layer_classes():
    return sorted(
        {
            value
            for name in dir(keras.layers)
            if inspect.isclass(value := getattr(keras.layers, name))
            and issubclass(value, keras.layers.Layer)
        },
        key=lambda c: c.__name__,
    )


# Kinds whose layers have weights (or read units through weights): each
# class with one of these couplings must be pruned in a test model.
_WEIGHTED = (
    couplings_keras.Producer,
    couplings_keras.Depthwise,
    couplings_keras.Normalization,
    couplings_keras.PReLU,
    couplings_passing.Statistics,
    couplings_sequence.Recurrent,
    couplings_sequence.Bidirectional,
    couplings_sequence.TimeDistributed,
    couplings_sequence.MultiHeadAttention,
    couplings_sequence.KerasAttention,
)

# Classes with weights that keep every unit they read, and a model showing it.
def _rms_norm_over_channels():
    x = keras.Input((3, 4))
    h = L.RMSNormalization(name="subject")(L.Dense(6, name="hidden")(x))
    return keras.Model(x, L.Dense(2)(h))


def _refused_layer(layer):
    def make():
        x = keras.Input((4, 4, 2))
        h = L.Dense(2, name="hidden")(x)
        return keras.Model(x, L.Flatten()(layer(h)))

    return make


_REFUSED_IN = {
    L.RMSNormalization: (_rms_norm_over_channels, "normalized together by 'subject'"),
    L.GroupQueryAttention: (None, "shares each key/value head"),
    L.ConvLSTM1D: (None, "convolutional LSTM"),
    L.SpectralNormalization: (
        _refused_layer(L.SpectralNormalization(L.Dense(3), name="subject")),
        "divides the wrapped kernel",
    ),
}


def test_every_keras_layer_class_is_coupled_or_refused():
    # Fails when Keras adds a layer: decide how units cross it, then add it.
    missing = [c.__name__ for c in _public_layer_classes() if c not in couplings.builtin_table()]
    assert missing == []


def test_every_keras_layer_class_with_weights_is_pruned_or_refused_with_its_reason():
    classes_in_models = set()
    for make in models.MODELS.values():
        model, _ = make()
        for layer in internals.sublayers(model):
            classes_in_models.add(type(layer))
    table = couplings.builtin_table()
    for cls, coupling in sorted(table.items(), key=lambda item: item[0].__name__):
        if isinstance(coupling, couplings.Refused):
            assert len(coupling.reason) > 10, cls
        elif isinstance(coupling, _WEIGHTED) and cls not in _REFUSED_IN:
            assert cls in classes_in_models, f"{cls.__name__} is pruned in no test model"
    for cls, (make, reason) in _REFUSED_IN.items():
        if make is None:
            assert reason in table[cls].reason
            continue
        text = unit_graph.DependencyGraph(make()).explain("hidden")
        assert "stay" in text and reason in text, text
