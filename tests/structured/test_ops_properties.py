"""Property tests of structured pruning over random graphs with `keras.ops` calls.

Hypothesis draws convolutional graphs whose nodes include `keras.ops` calls
(add and multiply by a constant, add of two tensors, getitem, reshape,
concatenate, a squeeze-and-excite gate) and grouped convolutions, then a
fraction: pruning and shrinking either remove units, with shrink's outputs
equal to the masked model's, or keep them with a reason `explain` gives;
never another error.
"""

import keras
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import maskfit
from tests.helpers import structured_models as models

pruning = maskfit.pruning
L = keras.layers
ops = keras.ops

_NODES = (
    "conv",
    "grouped",
    "add_constant",
    "multiply_constant",
    "add",
    "getitem",
    "pick",
    "reshape",
    "concatenate",
    "gate",
)


@st.composite
def graphs(draw):
    """A list of nodes, each with the positions of the tensors it reads."""
    nodes = []
    for count in range(1, draw(st.integers(2, 7)) + 1):
        node = draw(st.sampled_from(_NODES))
        a = draw(st.integers(0, count - 1))
        b = draw(st.integers(0, count - 1))
        nodes.append((node, a, b, draw(st.sampled_from([2, 4, 6]))))
    return nodes, draw(st.sampled_from(["gap", "flatten"]))


def _node(node, t, u, width, name):
    channels = t.shape[-1]
    if node == "conv":
        return L.Conv2D(width, 3, padding="same", name=name)(t)
    if node == "grouped":
        groups = 2 if channels % 2 == 0 else 1
        return L.Conv2D(2 * width, 3, padding="same", groups=groups, name=name)(t)
    if node == "add_constant":
        return t + 0.5
    if node == "multiply_constant":
        return ops.relu(t) * 2.0
    if node == "add":
        if u.shape[-1] != channels:
            u = L.Conv2D(channels, 1, name=name + "_match")(u)
        return ops.add(t, u)
    if node == "getitem":
        return ops.pad(t[:, 1:, :-1, :], ((0, 0), (1, 0), (0, 1), (0, 0)))
    if node == "pick":
        return t[..., : max(1, channels // 2)]
    if node == "reshape":
        flat = ops.reshape(t, (-1, 16, channels))
        return ops.reshape(flat, (-1, 4, 4, channels))
    if node == "concatenate":
        return ops.concatenate([t, u], axis=-1)
    gate = ops.mean(t, axis=(1, 2), keepdims=True)
    gate = L.Conv2D(channels, 1, activation="sigmoid", name=name)(gate)
    return t * gate


def build(nodes, head):
    x = keras.Input((4, 4, 2))
    tensors = [L.Conv2D(4, 3, padding="same", name="stem")(x)]
    for number, (node, a, b, width) in enumerate(nodes):
        tensors.append(_node(node, tensors[a], tensors[b], width, f"n{number}"))
    last = tensors[-1]
    last = L.GlobalAveragePooling2D()(last) if head == "gap" else L.Flatten()(last)
    outputs = L.Dense(3, name="head")(
        L.Dense(5, activation="relu", name="hidden")(last)
    )
    return models.functional(x, outputs, seed=len(nodes))


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(graph=graphs(), fraction=st.sampled_from([0.25, 0.5, 0.75]))
def test_ops_and_grouped_convs_prune_or_say_why_on_random_graphs(graph, fraction):
    keras.backend.clear_session(free_memory=False)
    model = build(*graph)
    x = np.random.default_rng(0).normal(size=(2, 4, 4, 2)).astype("float32")

    selection = pruning.select_units(model, fraction)
    small = pruning.shrink(model, selection)

    expected = models.masked_outputs(model, selection, x)
    got = np.asarray(small(x, training=False))
    scale = float(np.max(np.abs(expected))) or 1.0
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * scale)
    graph_ = selection.graph
    for space in graph_.spaces:
        staying = int(np.sum(graph_.atoms_of(space.ids) < 0))
        if staying:
            text = graph_.explain(space.layer)
            assert f"{staying} stay" in text and "because" in text, text
