"""The torch guard (`maskfit.backend.torch_guard`): kept bits reused, and read again when written.

The guard keeps a frozen entry's bits across steps and takes them again only
when something other than the update wrote the tensor (its version counter
moved). These tests write frozen entries of a variable and of an optimizer
slot between `fit` calls, with -0.0 and a NaN payload among the values, and
expect exactly those bits after more steps, also through the int16 and int64
views of float16 and float64 kernels; and a mask of all ones (not held
at all) to train bit for bit as stock Keras does.
"""

import keras
import numpy as np
import pytest

import maskfit

pytestmark = pytest.mark.backends("torch")

# -0.0, a quiet NaN with a payload, and two plain values: their bits must survive.
_ODD_BITS = np.array([0x80000000, 0x7FC00123, 0x40600000, 0xC0E80000], np.uint32)
_ODD = _ODD_BITS.view(np.float32)


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(16, 4)).astype("float32"), rng.normal(size=(16, 3))


def _model(model_class, mask=None):
    keras.utils.set_random_seed(0)
    model = model_class([keras.Input((4,)), keras.layers.Dense(3)])
    if mask is not None:
        maskfit.set_mask(model.layers[0], mask)
    model.compile(
        keras.optimizers.AdamW(0.05, weight_decay=0.1, use_ema=True), loss="mse"
    )
    return model


def _bits(variable):
    return np.asarray(keras.ops.convert_to_numpy(variable)).view(np.uint32)


def _fit(model, epochs):
    x, y = _data()
    model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0)


def test_frozen_entries_written_between_steps_hold_their_new_bits():
    model = _model(maskfit.MaskedSequential, maskfit.OutputMask([1, 0, 1]))
    _fit(model, 1)  # the guard has taken its bits
    kernel = model.layers[0].kernel
    value = keras.ops.convert_to_numpy(kernel).copy()
    value[:, 1] = _ODD
    kernel.assign(value)
    _fit(model, 2)
    np.testing.assert_array_equal(_bits(kernel)[:, 1], _ODD_BITS)


def test_frozen_slot_entries_written_between_steps_hold_their_new_bits():
    model = _model(maskfit.MaskedSequential, maskfit.OutputMask([1, 0, 1]))
    _fit(model, 1)
    kernel = model.layers[0].kernel
    slots = [
        v
        for v in model.optimizer.variables
        if tuple(v.shape) == tuple(kernel.shape) and "average" not in v.path
    ]
    assert len(slots) == 2  # AdamW's two moments
    for slot in slots:
        value = keras.ops.convert_to_numpy(slot).copy()
        value[:, 1] = _ODD
        slot.assign(value)
    _fit(model, 2)
    for slot in slots:
        np.testing.assert_array_equal(_bits(slot)[:, 1], _ODD_BITS)


def test_a_mask_of_all_ones_trains_as_stock_keras():
    stock = _model(keras.Sequential)
    masked = _model(maskfit.MaskedSequential, maskfit.OutputMask([1, 1, 1]))
    _fit(stock, 2)
    _fit(masked, 2)
    for ours, theirs in zip(masked.weights, stock.weights):
        np.testing.assert_array_equal(_bits(ours), _bits(theirs))


class _Recording(maskfit.MaskedSequential):
    """Keeps a copy of each gradient the masking stage returns."""

    def apply_grad_masks(self, gradients, variables):
        masked = super().apply_grad_masks(gradients, variables)
        self.seen = [
            None if g is None else keras.ops.convert_to_numpy(g) for g in masked
        ]
        return masked


def test_the_masking_stage_returns_zeros_at_frozen_entries_in_the_step():
    model = _model(_Recording, maskfit.OutputMask([1, 0, 1]))
    _fit(model, 1)
    kernel, bias = model.seen
    for gradient in (kernel, bias):
        np.testing.assert_array_equal(gradient[..., 1], 0.0)
        assert not np.signbit(gradient[..., 1]).any()  # +0.0, not -0.0
        assert np.all(gradient[..., 0] != 0)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_element_mask_holds_odd_bits_at_every_integer_width(dtype):
    # The restore runs on int16 / int32 / int64 views of the raw bits.
    keras.utils.set_random_seed(0)
    model = maskfit.MaskedSequential(
        [keras.Input((4,)), keras.layers.Dense(3, dtype=dtype)]
    )
    keep = np.ones((4, 3), bool)
    keep[:, 1] = False  # column 1 frozen: it gets the odd values
    keep[0, 0] = False
    maskfit.set_mask(model.layers[0], maskfit.ElementMask({"kernel": keep}))
    model.compile(
        keras.optimizers.AdamW(0.05, weight_decay=0.1, use_ema=True), loss="mse"
    )
    kernel = model.layers[0].kernel
    value = keras.ops.convert_to_numpy(kernel).copy()
    value[:, 1] = _ODD.astype(dtype)  # float16/64: -0.0 and a NaN, converted
    kernel.assign(value)
    before = keras.ops.convert_to_numpy(kernel).copy()
    _fit(model, 2)
    after = keras.ops.convert_to_numpy(kernel)
    width = {"float16": np.uint16, "float32": np.uint32, "float64": np.uint64}[dtype]
    np.testing.assert_array_equal(after.view(width)[~keep], before.view(width)[~keep])
    assert np.all(after[keep] != before[keep])  # the rest learned


class _MyAdam(keras.optimizers.Adam):
    """A subclass may change the update: its slots are never filled."""


@pytest.mark.parametrize(
    "make, filled",
    [
        (lambda: keras.optimizers.Adam(amsgrad=True), {"velocity", "velocity_hat"}),
        (lambda: keras.optimizers.AdamW(), {"velocity"}),
        (lambda: keras.optimizers.Nadam(), {"velocity"}),
        (
            lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()),
            {"velocity"},
        ),
        (lambda: keras.optimizers.Lamb(), set()),  # its trust ratio reads every entry
        (lambda: keras.optimizers.Lion(), set()),
        (lambda: keras.optimizers.RMSprop(), set()),  # adds epsilon before its sqrt
        (lambda: _MyAdam(), set()),
    ],
)
def test_only_elementwise_second_moments_are_filled(make, filled):
    from maskfit.backend import torch_guard

    optimizer = make()
    variable = keras.Variable(np.ones((2, 2), "float32"), name="w")
    optimizer.build([variable])
    ids = torch_guard.sqrt_slots(optimizer)
    found = {v.path.split("w_")[-1] for v in optimizer.variables if id(v) in ids}
    assert found == filled


@pytest.mark.parametrize("amsgrad", [False, True])
def test_the_update_takes_no_sqrt_of_a_zero_at_frozen_entries(monkeypatch, amsgrad):
    # torch's CPU sqrt is slow on zeros; the frozen second moments (0 here)
    # get 1.0 for the update, then their bits back, as the variable's.
    import torch

    zeros = []

    def sqrt(tensors):
        zeros.append(sum(int((t == 0).sum()) for t in tensors))
        return real(tensors)

    real = torch._foreach_sqrt
    monkeypatch.setattr(torch, "_foreach_sqrt", sqrt)
    keras.utils.set_random_seed(0)
    model = maskfit.MaskedSequential([keras.Input((4,)), keras.layers.Dense(3)])
    keep = np.random.default_rng(1).random((4, 3)) < 0.5
    maskfit.set_mask(model.layers[0], maskfit.ElementMask({"kernel": keep}))
    model.compile(keras.optimizers.Adam(0.05, amsgrad=amsgrad), loss="mse")
    kernel = model.layers[0].kernel
    before = _bits(kernel).copy()
    _fit(model, 2)
    assert zeros == [0] * 4  # 16 samples in batches of 8, two epochs
    np.testing.assert_array_equal(_bits(kernel)[~keep], before[~keep])
    assert np.all(_bits(kernel)[keep] != before[keep])
    for slot in model.optimizer.variables:
        if tuple(slot.shape) == (4, 3):  # each moment: +0.0 where frozen
            np.testing.assert_array_equal(_bits(slot)[~keep], 0)


def _count_passes(monkeypatch):
    """Records each pass of the guard over raw bits: `addcmul`, integer `mul_` / `add_`."""
    import torch

    calls = []
    real_addcmul = torch.addcmul
    real_mul, real_add = torch.Tensor.mul_, torch.Tensor.add_

    def addcmul(*args, **kwargs):
        calls.append("addcmul")
        return real_addcmul(*args, **kwargs)

    def counted(name, real):
        def method(self, *args, **kwargs):
            if not self.dtype.is_floating_point:
                calls.append(name)
            return real(self, *args, **kwargs)

        return method

    monkeypatch.setattr(torch, "addcmul", addcmul)
    monkeypatch.setattr(torch.Tensor, "mul_", counted("mul_", real_mul))
    monkeypatch.setattr(torch.Tensor, "add_", counted("add_", real_add))
    return calls


def _moments(model, shape, name="momentum"):
    return [
        slot
        for slot in model.optimizer.variables
        if tuple(slot.shape) == shape and name in slot.path
    ]


def test_first_moments_at_zero_where_frozen_are_not_written_back(monkeypatch):
    # Adam's m stays +0.0 under +0.0 gradients: the guard masks the gradient,
    # fills the second moment, writes back the kernel and the second moment,
    # not the first moment. Bits at +0.0 take a pass of two operands.
    calls = _count_passes(monkeypatch)
    keras.utils.set_random_seed(0)
    model = maskfit.MaskedSequential([keras.Input((4,)), keras.layers.Dense(3)])
    keep = np.random.default_rng(1).random((4, 3)) < 0.5
    maskfit.set_mask(model.layers[0], maskfit.ElementMask({"kernel": keep}))
    model.compile(keras.optimizers.Adam(0.05), loss="mse")
    _fit(model, 2)
    # Per step (4 steps): gradient and second moment `mul_`, fill `add_`, kernel.
    assert sorted(calls) == ["add_"] * 4 + ["addcmul"] * 4 + ["mul_"] * 8
    (moment,) = _moments(model, (4, 3))
    np.testing.assert_array_equal(_bits(moment)[~keep], 0)
    assert np.all(_bits(moment)[keep] != 0)


@pytest.mark.parametrize(
    "make",
    [
        lambda: keras.optimizers.Adam(0.05),
        lambda: keras.optimizers.AdamW(0.05, weight_decay=0.1),
        lambda: keras.optimizers.Nadam(0.05),
    ],
)
@pytest.mark.parametrize("slot", ["momentum", "velocity"])
def test_moments_that_learned_before_the_mask_keep_their_bits(make, slot):
    # A mask set after training freezes entries whose m and v are not 0:
    # those are written back every step from their kept bits (m * b1 would
    # move them; v is filled with 1.0 for the update).
    keras.utils.set_random_seed(0)
    model = maskfit.MaskedSequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(make(), loss="mse")
    _fit(model, 1)
    keep = np.random.default_rng(1).random((4, 3)) < 0.5
    maskfit.set_mask(model.layers[0], maskfit.ElementMask({"kernel": keep}))
    (moment,) = _moments(model, (4, 3), slot)
    before = _bits(moment).copy()
    assert np.all(before[~keep] != 0)
    _fit(model, 2)
    np.testing.assert_array_equal(_bits(moment)[~keep], before[~keep])
    assert np.all(_bits(moment)[keep] != before[keep])


class _RawGradients(maskfit.MaskedSequential):
    """Returns the gradients unmasked: the frozen entries see real values."""

    def apply_grad_masks(self, gradients, variables):
        return list(gradients)


class _OneAddedInPlace(maskfit.MaskedSequential):
    """Masks, then writes 1.0 into every entry of the same tensors."""

    def apply_grad_masks(self, gradients, variables):
        gradients = super().apply_grad_masks(gradients, variables)
        for gradient in gradients:
            gradient.add_(1.0)
        return gradients


@pytest.mark.parametrize(
    "model_class, masked", [(_RawGradients, 0), (_OneAddedInPlace, 1)]
)
def test_first_moments_are_written_back_when_the_users_masking_leaves_values(
    model_class, masked, monkeypatch
):
    calls = _count_passes(monkeypatch)
    keras.utils.set_random_seed(0)
    model = model_class([keras.Input((4,)), keras.layers.Dense(3)])
    keep = np.random.default_rng(1).random((4, 3)) < 0.5
    maskfit.set_mask(model.layers[0], maskfit.ElementMask({"kernel": keep}))
    model.compile(keras.optimizers.Adam(0.05), loss="mse")
    kernel = model.layers[0].kernel
    before = _bits(kernel).copy()
    _fit(model, 2)
    # Kernel, fill, second and first moment (and the guard's gradient mask).
    assert len(calls) == (4 + masked) * 4
    np.testing.assert_array_equal(_bits(kernel)[~keep], before[~keep])
    (moment,) = _moments(model, (4, 3))
    np.testing.assert_array_equal(_bits(moment)[~keep], 0)
