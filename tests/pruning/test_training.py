"""Pruning inside the training step: exact zeros, TF-MOT's steps, composition, retraces."""

import keras
import numpy as np
import pytest

import maskfit
from maskfit import model as model_lib
from maskfit import pruning
from maskfit.spec import rules as mask_rules
from tests.helpers import checkout

# Prunes in steps 2, 4 and 6 (the n-th batch is step n), to 0.8 from step 6.
SCHEDULE = dict(initial_sparsity=0.0, final_sparsity=0.8, begin_step=0, end_step=6)


def mlp(cls=keras.Model, hidden=6, outputs=3):
    inputs = keras.Input((5,))
    body = keras.layers.Dense(hidden, activation="tanh", name="body")
    head = keras.layers.Dense(outputs, name="head")
    return cls(inputs, head(body(inputs))), body, head


def data(n=32, outputs=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 5)).astype("float32")
    return x, rng.normal(size=(n, outputs)).astype("float32")


def expected_zeros(schedule, size, step):
    """Zeros the schedule asks for after training step `step` (1-based)."""
    done = pruning.pruning_steps(schedule, 1, step + 1)
    return 0 if not done else size - pruning.kept_count(size, done[-1][1])


class ZerosCheck(keras.callbacks.Callback):
    """After every call: pruned entries are +0.0, zeros follow the schedule."""

    def __init__(self, schedule, kernels):
        super().__init__()
        self.schedule, self.kernels, self.steps = schedule, kernels, []

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        variables = model_lib.all_trainable_variables(self.model)
        keeps = model_lib.keep_masks(self.model)
        for kernel in self.kernels:
            index = next(i for i, v in enumerate(variables) if v is kernel)
            keep, value = keeps[index], kernel.numpy()
            np.testing.assert_array_equal(value[~keep], 0.0)
            assert not np.signbit(value[~keep]).any(), "pruned entries must be +0.0"
            assert np.count_nonzero(~keep) == expected_zeros(
                self.schedule, keep.size, step
            ), (kernel.path, step)
        self.steps.append(step)


OPTIMIZERS = {
    "adamw_decay": lambda: keras.optimizers.AdamW(0.05, weight_decay=0.2),
    "sgd_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9, weight_decay=0.1),
    "adam_ema": lambda: keras.optimizers.Adam(
        0.05, use_ema=True, ema_momentum=0.5, ema_overwrite_frequency=3
    ),
}


# Also in graph mode with the masked update compiled by XLA (conftest).
@pytest.mark.fused_too
@pytest.mark.other_modes_slow  # .ci/run runs eager and jit with every optimizer
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_pruned_entries_are_exactly_zero_after_every_step(mode, optimizer):
    model, body, head = mlp()
    schedule = pruning.PolynomialDecay(frequency=2, **SCHEDULE)
    model = pruning.prune_low_magnitude(model, pruning_schedule=schedule)
    assert isinstance(model, maskfit.MaskedModel)
    model.compile(optimizer=OPTIMIZERS[optimizer](), loss="mse", **mode)
    check = ZerosCheck(schedule, [body.kernel, head.kernel])
    x, y = data()
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[check])
    assert check.steps == list(range(1, 9))
    # Biases are not pruned, and the kept weights learned.
    assert np.count_nonzero(body.bias.numpy()) == 6
    assert np.count_nonzero(body.kernel.numpy()) == 30 - 24
    # At the end of fit the EMA averages are copied in: pruned ones are 0 too.
    keeps = model_lib.keep_masks(model)
    variables = model_lib.all_trainable_variables(model)
    for index, keep in keeps.items():
        np.testing.assert_array_equal(variables[index].numpy()[~keep], 0.0)


def test_steps_per_execution_prunes_at_the_same_steps(mode):
    model, body, head = mlp()
    schedule = pruning.PolynomialDecay(frequency=2, **SCHEDULE)
    model = pruning.prune_low_magnitude(model, pruning_schedule=schedule)
    model.compile(optimizer="adamw", loss="mse", steps_per_execution=3, **mode)
    check = ZerosCheck(schedule, [body.kernel, head.kernel])
    x, y = data()
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[check])
    assert check.steps == [3, 6, 8]


class TraceCounter(maskfit.MaskedSequential):
    traces = 0

    def train_step(self, data):
        TraceCounter.traces += 1
        return super().train_step(data)


def test_new_masks_at_pruning_steps_need_no_retrace():
    model = TraceCounter(
        [keras.Input((5,)), keras.layers.Dense(8), keras.layers.Dense(3)]
    )
    pruning.prune_low_magnitude(
        model, pruning_schedule=pruning.ConstantSparsity(0.5, 0, frequency=2)
    )
    model.compile(optimizer="adam", loss="mse")
    x, y = data()
    TraceCounter.traces = 0
    model.fit(x, y, batch_size=4, epochs=2, verbose=0)  # prunes 8 times
    model.fit(x, y, batch_size=4, verbose=0)
    assert TraceCounter.traces == 1
    assert np.count_nonzero(model.layers[0].kernel.numpy()) == 20


class _TwoDense:
    """The body of a subclassed model, as users write it; mixed into a Model class."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.body = keras.layers.Dense(6, activation="tanh")
        self.head = keras.layers.Dense(3)

    def call(self, x):
        return self.head(self.body(x))


class Subclassed(_TwoDense, maskfit.MaskedModel):
    pass


class PlainSubclassed(_TwoDense, keras.Model):
    pass


@pytest.mark.parametrize("cls", [Subclassed, PlainSubclassed])
@pytest.mark.parametrize("built", [True, False])
def test_subclassed_models_prune_built_or_not(cls, built):
    model = cls()
    x, y = data()
    if built:
        model(x[:1])
    schedule = pruning.ConstantSparsity(0.5, 0, frequency=3)
    pruned = pruning.prune_low_magnitude(model, pruning_schedule=schedule)
    assert (
        pruned is model
        if cls is Subclassed
        else isinstance(pruned, pruning.PrunedModel)
    )
    pruned.compile(optimizer="adamw", loss="mse")
    check = ZerosCheck(schedule, [])
    pruned.fit(x, y, batch_size=4, verbose=0, callbacks=[check])
    for kernel in (model.body.kernel, model.head.kernel):
        assert np.count_nonzero(kernel.numpy()) == kernel.numpy().size // 2
    assert np.count_nonzero(model.body.bias.numpy()) == 6
    if cls is PlainSubclassed:
        assert pruning.strip_pruning(pruned) is model


@pytest.mark.parametrize("order", ["mask_first", "prune_first", "scheduled"])
def test_masks_set_with_set_mask_compose_with_pruning(order):
    model, body, head = mlp(maskfit.MaskedModel, hidden=8)
    frozen_unit = maskfit.OutputMask([0] + [1] * 7)
    if order == "scheduled":
        # Unit 0 is frozen in both intervals; unit 1 learns from step 4 on.
        frozen_unit = maskfit.PiecewiseMask(
            [4], [maskfit.OutputMask([0] + [0.5] * 7), frozen_unit]
        )
    schedule = pruning.ConstantSparsity(0.75, 0, frequency=2)
    if order != "prune_first":
        maskfit.set_mask(body, frozen_unit)
    pruning.prune_low_magnitude(model, pruning_schedule=schedule)
    if order == "prune_first":
        maskfit.set_mask(body, frozen_unit)
    model.compile(optimizer=keras.optimizers.AdamW(0.05, weight_decay=0.2), loss="mse")
    before = body.kernel.numpy()
    x, y = data()
    model.fit(x, y, batch_size=4, verbose=0)
    kernel = body.kernel.numpy()
    # The frozen unit's column never moved and was never pruned.
    np.testing.assert_array_equal(kernel[:, 0], before[:, 0])
    assert np.all(kernel[:, 0] != 0)
    # 40 entries at 0.75: 10 kept, the 5 frozen ones among them.
    assert np.count_nonzero(kernel) == 10
    summary = maskfit.summary(model, print_fn=None)
    row = next(r for r in summary.rows if r.path == body.kernel.path)
    assert (row.mask_kind, row.pruned, row.learnable) == ("output+pruned", 30, 5)


def test_element_masks_compose_with_pruning_and_frozen_zeros_stay():
    model, body, _ = mlp(maskfit.MaskedModel)
    keep_learning = np.ones((5, 6), bool)
    keep_learning[0] = False  # row 0 frozen
    maskfit.set_mask(body, maskfit.ElementMask({"kernel": keep_learning}))
    body.kernel.assign(np.where(np.arange(6) == 0, 0.0, body.kernel.numpy()))
    pruning.prune_low_magnitude(
        body, pruning_schedule=pruning.ConstantSparsity(0.5, 0, frequency=2)
    )
    model.compile(optimizer="adamw", loss="mse")
    before = body.kernel.numpy()
    x, y = data()
    model.fit(x, y, batch_size=4, verbose=0)
    kernel = body.kernel.numpy()
    np.testing.assert_array_equal(kernel[0], before[0])
    # 30 entries at 0.5: 15 kept, row 0 (6, one of them an exact 0) among them.
    summary = maskfit.summary(model, print_fn=None)
    row = next(r for r in summary.rows if r.path == body.kernel.path)
    assert (row.mask_kind, row.pruned) == ("element+pruned", 15)
    assert np.count_nonzero(kernel) == 14


def test_two_of_four_prunes_once_in_step_one_and_blocks_prune_whole_blocks():
    model = maskfit.MaskedSequential(
        [keras.Input((8,)), keras.layers.Dense(6), keras.layers.Dense(4)]
    )
    pruning.prune_low_magnitude(model.layers[0], sparsity_m_by_n=(2, 4))
    pruning.prune_low_magnitude(
        model.layers[1],
        pruning_schedule=pruning.ConstantSparsity(0.5, 0, frequency=1),
        block_size=(2, 2),
    )
    model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(0).normal(size=(8, 8)).astype("float32")
    y = np.zeros((8, 4), "float32")
    before = model.layers[0].kernel.numpy()
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    kernel = model.layers[0].kernel.numpy()
    groups = kernel.T.reshape(6, 2, 4)  # output unit, group, 4 inputs
    assert np.all(np.count_nonzero(groups, axis=-1) == 2)
    np.testing.assert_array_equal(
        kernel != 0,
        pruning.magnitude_mask(before, 0.0, sparsity_m_by_n=(2, 4)).numpy() > 0,
    )
    blocks = model.layers[1].kernel.numpy().reshape(3, 2, 2, 2) != 0
    assert np.count_nonzero(blocks) == 12
    assert np.all(blocks.all(axis=(1, 3)) == blocks.any(axis=(1, 3)))


def test_bad_arguments_are_refused_where_they_enter():
    model, _, _ = mlp()
    with pytest.raises(ValueError, match="pruning_policy"):
        pruning.prune_low_magnitude(model, pruning_policy="latency")
    with pytest.raises(TypeError, match="PruningSchedule"):
        pruning.prune_low_magnitude(model, pruning_schedule=0.5)
    with pytest.raises(TypeError, match="unexpected arguments"):
        pruning.prune_low_magnitude(model, name="x")
    with pytest.raises(TypeError, match="list of layers"):
        pruning.prune_low_magnitude([model.layers[1], "dense"])
    conv = keras.layers.Conv2D(4, 3)
    conv.build((None, 8, 8, 2))
    with pytest.raises(ValueError, match="block sparsity needs 2-dimensional"):
        pruning.prune_low_magnitude(conv, block_size=(2, 2))
    with pytest.raises(ValueError, match="SpectralNormalization"):
        pruning.prune_low_magnitude(
            keras.layers.SpectralNormalization(keras.layers.Dense(2))
        )
    assert mask_rules.get_rule(conv) is None  # nothing half-applied


def test_pruning_holds_under_mixed_precision():
    keras.config.set_dtype_policy("mixed_float16")
    model, body, head = mlp(maskfit.MaskedModel)
    schedule = pruning.PolynomialDecay(frequency=2, **SCHEDULE)
    pruning.prune_low_magnitude(model, pruning_schedule=schedule)
    model.compile(optimizer=keras.optimizers.AdamW(0.05, weight_decay=0.2), loss="mse")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    check = ZerosCheck(schedule, [body.kernel, head.kernel])
    x, y = data()
    model.fit(x, y, batch_size=4, shuffle=False, verbose=0, callbacks=[check])
    assert check.steps == list(range(1, 9))


def test_pruning_holds_on_every_replica_under_mirrored_strategy():
    script = checkout.script("pruning_mirrored_run.py")
    done = checkout.run(script, "float32", "mixed_bfloat16")
    assert done.returncode == 0 and "ok float32\nok mixed_bfloat16" in done.stdout, (
        done.stdout[-2000:] + done.stderr[-3000:]
    )
