"""Property tests of structured pruning over small random graphs.

Hypothesis draws convolutional graphs with residual adds, concatenations,
batch and group normalization, pooling and a dense head, then a fraction,
`round_to` and ranking: shrink's outputs equal the masked model's, and the
outputs keep their shapes.
"""

import keras
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import maskfit
from tests.helpers import structured_models as models

pruning = maskfit.pruning
L = keras.layers

_OPS = ("conv", "bn", "add", "concat", "relu", "gn", "depthwise", "pool")


@st.composite
def graphs(draw):
    """A list of ops, each with the positions of the tensors it reads."""
    ops = []
    count = 1
    for _ in range(draw(st.integers(2, 6))):
        op = draw(st.sampled_from(_OPS))
        a = draw(st.integers(0, count - 1))
        b = draw(st.integers(0, count - 1))
        width = draw(st.sampled_from([2, 4, 6]))
        ops.append((op, a, b, width))
        count += 1
    head = draw(st.sampled_from(["gap", "flatten"]))
    two_outputs = draw(st.booleans())
    return ops, head, two_outputs


def build(ops, head, two_outputs):
    x = keras.Input((4, 4, 2))
    tensors = [L.Conv2D(4, 3, padding="same", name="stem")(x)]
    for number, (op, a, b, width) in enumerate(ops):
        t, u = tensors[a], tensors[b]
        name = f"op{number}"
        if op == "conv":
            out = L.Conv2D(width, 3, padding="same", name=name)(t)
        elif op == "bn":
            out = L.BatchNormalization(name=name)(t)
        elif op == "add":
            if u.shape[-1] != t.shape[-1]:
                u = L.Conv2D(t.shape[-1], 1, name=name + "_match")(u)
            out = L.Add(name=name)([t, u])
        elif op == "concat":
            out = L.Concatenate(name=name)([t, u])
        elif op == "relu":
            out = L.ReLU(name=name)(t)
        elif op == "gn":
            channels = t.shape[-1]
            groups = 2 if channels % 2 == 0 else 1
            out = L.GroupNormalization(groups=groups, name=name)(t)
        elif op == "depthwise":
            out = L.DepthwiseConv2D(3, padding="same", depth_multiplier=2, name=name)(t)
        else:
            out = L.MaxPooling2D(2, padding="same", name=name)(t)
            out = L.UpSampling2D(2, name=name + "_up")(out)
            out = L.Cropping2D(((0, out.shape[1] - 4), (0, out.shape[2] - 4)))(out)
        tensors.append(out)
    last = tensors[-1]
    last = L.GlobalAveragePooling2D()(last) if head == "gap" else L.Flatten()(last)
    outputs = L.Dense(3, name="head")(
        L.Dense(5, activation="relu", name="hidden")(last)
    )
    if two_outputs:
        outputs = [outputs, L.Conv2D(2, 1, name="side")(tensors[len(tensors) // 2])]
    return models.functional(x, outputs, seed=len(ops))


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    graph=graphs(),
    fraction=st.sampled_from([0.25, 0.5, 0.75]),
    round_to=st.sampled_from([None, 2]),
    global_pruning=st.booleans(),
)
def test_shrink_equals_the_masked_model_on_random_graphs(
    graph, fraction, round_to, global_pruning
):
    keras.backend.clear_session(free_memory=False)
    model = build(*graph)
    x = np.random.default_rng(0).normal(size=(2, 4, 4, 2)).astype("float32")

    selection = pruning.select_units(
        model, fraction, round_to=round_to, global_pruning=global_pruning
    )
    small = pruning.shrink(model, selection)

    expected = keras.tree.flatten(models.masked_outputs(model, selection, x))
    got = keras.tree.flatten(small(x, training=False))
    assert [tuple(o.shape[1:]) for o in small.outputs] == [
        tuple(o.shape[1:]) for o in model.outputs
    ]
    for want, have in zip(expected, got):
        scale = float(np.max(np.abs(want))) or 1.0
        np.testing.assert_allclose(np.asarray(have), want, rtol=1e-5, atol=1e-5 * scale)
    # Every group keeps at least one unit, and rounds to round_to when it can.
    for group in selection.graph.groups:
        assert selection.kept[group.atoms].any()
