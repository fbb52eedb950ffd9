"""Under JAX, `OutputMask` freezes exactly a unit's entries on every Keras layer, or refuses.

tests/test_output_units.py's sweep (its cases, models and verdicts), with the
ground truth taken by `jax.vjp` instead of TensorFlow's tape, and trained by
Keras's JAX trainer; plus its backend-independent checks of declarations.
"""

import jax
import keras
import numpy as np
import pytest

import maskfit
from maskfit.internals import versions
from tests.units.test_output_units import (
    BATCH,
    CASES,
    C,
    L,
    R,
    Transposed,
    _build,
    _inputs,
)

pytestmark = pytest.mark.backends("jax")


def _cell_inputs(rnn, x_shape, rng):
    states = keras.tree.map_structure(
        lambda s: rng.normal(size=tuple(s.shape)).astype("float32"),
        rnn.get_initial_state(BATCH),
    )
    x = rng.normal(size=(BATCH,) + tuple(x_shape[2:])).astype("float32")
    return lambda: rnn.cell(x, states)[0]


def _pieces(case, layer, rng):
    """`(outputs, [(unit axis, first unit)])`: a function of nothing, and its layout."""
    if case.truth == "call":
        inputs = _inputs(case, rng)
        if case.as_list:
            return lambda: keras.tree.flatten(layer(list(inputs)))[:1], [(case.axis, 0)]
        return lambda: keras.tree.flatten(layer(*inputs))[:1], [(case.axis, 0)]
    shape = case.shapes[0]
    if case.truth == "cell":
        step = _cell_inputs(layer, shape, rng)
        return lambda: [step()], [(case.axis, 0)]
    forward = _cell_inputs(layer.forward_layer, shape, rng)
    backward = _cell_inputs(layer.backward_layer, shape, rng)
    side_by_side = layer.merge_mode not in ("concat", None) or case.axis != -1
    offset = 0 if side_by_side else case.units // 2
    return lambda: [forward(), backward()], [(case.axis, 0), (case.axis, offset)]


def ground_truth(case, layer, draws=3, seed=1):
    """Per variable: the unit each entry belongs to, -2 where shared, -1 if none."""
    rng = np.random.default_rng(seed)
    variables = layer.trainable_weights
    reached = [[np.zeros(v.shape, bool) for v in variables] for _ in range(case.units)]
    for _ in range(draws):
        outputs, layout = _pieces(case, layer, rng)

        def call(values, outputs=outputs):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return [keras.ops.cast(o, "float32") for o in outputs()]

        pieces, pull = jax.vjp(call, [v.value for v in variables])
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
    owners = {}
    for i, v in enumerate(variables):
        hits = np.stack([reached[u][i] for u in range(case.units)])
        count = hits.sum(axis=0)
        owner = np.where(count == 1, hits.argmax(axis=0), -1)
        owners[v.path] = np.where(count > 1, -2, owner)
    return owners


# Every case, channels_first ones too: the TensorFlow suite runs those with its
# slow tests only because some CPUs' TensorFlow runs them only under XLA.
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_output_mask_is_correct_or_refused_on_every_keras_layer(case):
    layer, model = _build(case)
    frozen_units = np.arange(case.units) % 2 == 0
    spec = maskfit.OutputMask(np.where(frozen_units, 0.0, 1.0))
    verdict = case.verdict
    if case.id.endswith("-width-equals-filters"):
        # A Keras TensorFlow quirk (the bias added along the last axis) that
        # maskfit finds by running it; JAX adds it along the channels.
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
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse", jit_compile=True)
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


@pytest.mark.parametrize(
    "make",
    [
        lambda: L.LSTM(3, return_sequences=True),
        lambda: L.GRU(3, reset_after=True),
        lambda: L.GRU(3, reset_after=False),
    ],
    ids=["LSTM", "GRU-reset-after", "GRU-reset-before"],
)
def test_recurrent_gate_blocks_stay_frozen_in_both_modes(make, mode):
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


def test_new_values_on_a_recurrent_layer_need_no_retrace():
    traces = []

    class Counting(maskfit.MaskedModel):
        def train_step(self, state, data):
            traces.append(1)
            return super().train_step(state, data)

    inputs = keras.Input((3, 2))
    layer = L.GRU(4)
    model = Counting(inputs, layer(inputs))
    maskfit.set_mask(layer, maskfit.OutputMask([1, 0, 1, 0]))
    model.compile(optimizer="adam", loss="mse", jit_compile=True)
    x, y = np.ones((4, 3, 2)), np.ones((4, 4))
    model.fit(x, y, verbose=0)
    count = len(traces)
    maskfit.set_mask(layer, maskfit.OutputMask([0, 1, 0, 1]))
    kernel = np.array(layer.cell.kernel)
    model.fit(x, y, verbose=0)
    assert len(traces) == count
    np.testing.assert_array_equal(np.array(layer.cell.kernel)[:, 0::4], kernel[:, 0::4])
