"""A mask of zeros costs what trainable=False costs; exactness is unchanged (issue 13)."""

import warnings

import keras
import numpy as np
import pytest

import maskfit
from maskfit.optim import rebuild

# Graph-mode tests also run with the masked update compiled by XLA (conftest).
pytestmark = pytest.mark.fused_too


def mlp(model_cls=maskfit.MaskedModel, seed=3):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((4,))
    a = keras.layers.Dense(5, activation="tanh", name="a")
    b = keras.layers.Dense(5, activation="tanh", name="b")
    head = keras.layers.Dense(2, name="head")
    return model_cls(inputs, head(b(a(inputs)))), a, b, head


def data(n=24, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 4)).astype("float32"), rng.normal(size=(n, 2)).astype(
        "float32"
    )


def frozen_by(kind, layer):
    if kind == "output":
        return maskfit.OutputMask([0] * layer.units)
    return maskfit.ElementMask(
        {"kernel": np.zeros(layer.kernel.shape), "bias": np.zeros(layer.bias.shape)}
    )


def ids(variables):
    return {id(v) for v in variables}


@pytest.mark.parametrize("kind", ["output", "element"])
def test_a_layer_frozen_by_zeros_gets_no_gradient_no_slots_and_stays_exact(kind, mode):
    model, a, b, head = mlp()
    maskfit.set_mask(a, frozen_by(kind, a))
    model.compile(
        optimizer=keras.optimizers.AdamW(
            0.05, weight_decay=0.5, use_ema=True, ema_overwrite_frequency=2
        ),
        loss="mse",
        steps_per_execution=2,
        **mode,
    )
    before = [w.numpy() for w in a.weights]
    x, y = data()
    model.fit(x, y, batch_size=4, epochs=2, verbose=0)
    for weight, old in zip(a.weights, before):
        np.testing.assert_array_equal(weight.numpy(), old)
    # Keras sees what trainable=False would show it: no slots, not trainable.
    built = ids(rebuild.built_variables(model.optimizer))
    assert not built & ids(a.weights)
    assert built == ids(b.weights + head.weights)
    assert not ids(model.trainable_weights) & ids(a.weights)
    assert ids(a.weights) <= ids(model.non_trainable_weights)
    assert len(model.weights) == 6
    # maskfit.summary still lists them, all frozen.
    summary = maskfit.summary(model, print_fn=None)
    assert summary.trainable_params == 25 + 30 + 12
    assert summary.frozen_params == 25


def test_a_fully_frozen_model_still_counts_steps_for_its_schedules(mode):
    model, a, b, head = mlp()
    for layer in (a, b):
        maskfit.set_mask(layer, maskfit.OutputMask([0] * 5))
    maskfit.set_mask(
        head,
        maskfit.PiecewiseMask(
            [3], [maskfit.OutputMask([0, 0]), maskfit.OutputMask([1, 1])]
        ),
    )
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse", **mode)
    kernel = head.kernel.numpy()
    x, y = data(12)
    model.fit(x, y, batch_size=4, verbose=0)  # steps 0-2: everything frozen
    np.testing.assert_array_equal(head.kernel.numpy(), kernel)
    assert int(model.optimizer.iterations.numpy()) == 3
    model.fit(x, y, batch_size=4, verbose=0)  # steps 3-5: the head learns
    assert np.all(head.kernel.numpy() != kernel)


class TraceCounter(maskfit.MaskedModel):
    traces = 0

    def train_step(self, data):
        TraceCounter.traces += 1
        return super().train_step(data)


@pytest.mark.parametrize("steps_per_execution", [1, 4])
def test_gradual_unfreezing_retraces_once_at_its_boundary(steps_per_execution):
    model, a, b, head = mlp(TraceCounter)
    schedule = maskfit.PiecewiseMask(
        [6], [maskfit.OutputMask([0] * 5), maskfit.OutputMask([1] * 5)]
    )
    maskfit.set_mask(a, schedule)
    model.compile(
        optimizer=keras.optimizers.Adam(0.05),
        loss="mse",
        steps_per_execution=steps_per_execution,
    )
    x, y = data(40)
    TraceCounter.traces = 0
    kernel = a.kernel.numpy()
    model.fit(x[:24], y[:24], batch_size=4, verbose=0)  # steps 0-5
    np.testing.assert_array_equal(a.kernel.numpy(), kernel)
    if steps_per_execution == 1:
        assert not ids(rebuild.built_variables(model.optimizer)) & ids(a.weights)
    # (With 4 steps per call, the call from step 4 may reach step 6: the step is
    # planned for both intervals there, and `a` gets its slots then.)
    model.fit(x, y, batch_size=4, epochs=2, verbose=0)  # steps 6-25
    assert np.all(a.kernel.numpy() != kernel)
    assert ids(a.weights) <= ids(rebuild.built_variables(model.optimizer))
    assert TraceCounter.traces == 2  # the first trace, and one at the boundary


def test_a_variable_that_learns_again_starts_with_fresh_optimizer_state():
    model, a, b, head = mlp()
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    x, y = data()
    model.fit(x, y, batch_size=4, verbose=0)
    optimizer = model.optimizer

    def momentum(variable):
        return next(
            v.numpy()
            for v in optimizer.variables
            if v.path.endswith(variable.path.replace("/", "_") + "_momentum")
        )

    head_momentum = momentum(head.kernel)
    assert np.any(momentum(a.kernel) != 0)
    maskfit.set_mask(a, maskfit.OutputMask([0] * 5))
    model.fit(x[:4], y[:4], batch_size=4, verbose=0)
    assert not ids(rebuild.built_variables(optimizer)) & ids(a.weights)
    maskfit.set_mask(a, None)
    model.make_train_function()  # what the next fit does first
    np.testing.assert_array_equal(momentum(a.kernel), np.zeros(a.kernel.shape))
    # The others kept their history through both rebuilds (one more step of it).
    assert np.any(momentum(head.kernel) != head_momentum)
    model.fit(x, y, batch_size=4, verbose=0)


def test_values_only_changes_keep_the_step_and_frozen_changes_retrace_once():
    model, a, b, head = mlp(TraceCounter)
    maskfit.set_mask(a, maskfit.OutputMask([1, 0, 1, 0, 1]))
    model.compile(optimizer=keras.optimizers.AdamW(0.05), loss="mse")
    x, y = data(8)
    TraceCounter.traces = 0
    model.fit(x, y, batch_size=4, verbose=0)
    traces = TraceCounter.traces
    maskfit.set_mask(a, maskfit.OutputMask([0, 1, 0, 1, 0]))  # values only
    model.fit(x, y, batch_size=4, verbose=0)
    maskfit.set_mask(a, None)  # all ones: the traced step still covers it
    model.fit(x, y, batch_size=4, verbose=0)
    assert TraceCounter.traces == traces
    maskfit.set_mask(a, maskfit.OutputMask([0] * 5))  # fully frozen: once
    model.fit(x, y, batch_size=4, verbose=0)
    model.fit(x, y, batch_size=4, verbose=0)
    assert TraceCounter.traces == traces + 1


def _with_a_frozen():
    """`mlp()` with layer a frozen whole, compiled with Adam (not fit yet)."""
    model, a, _, _ = mlp()
    maskfit.set_mask(a, maskfit.OutputMask([0] * 5))
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    return model


def test_saved_and_loaded_models_keep_the_optimizer_state_of_the_learnable_variables(
    tmp_path,
):
    model = _with_a_frozen()
    x, y = data()
    model.fit(x, y, batch_size=4, verbose=0)
    model.save(tmp_path / "m.keras")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # "Skipping variable loading..."
        loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert ids(rebuild.built_variables(loaded.optimizer)) == ids(
        loaded.get_layer("b").weights + loaded.get_layer("head").weights
    )
    for mine, theirs in zip(model.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    # Both train on the same way.
    model.fit(x, y, batch_size=4, verbose=0)
    loaded.fit(x, y, batch_size=4, verbose=0)
    for mine, theirs in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())


def test_weights_only_checkpoints_rebuild_the_optimizer_they_were_saved_with(tmp_path):
    model = _with_a_frozen()
    x, y = data()
    model.fit(x, y, batch_size=4, verbose=0)
    model.save_weights(tmp_path / "w.weights.h5")
    fresh = _with_a_frozen()
    fresh.optimizer.build(fresh.trainable_variables)  # as BackupAndRestore does
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        fresh.load_weights(tmp_path / "w.weights.h5")
    for mine, theirs in zip(model.optimizer.variables, fresh.optimizer.variables):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
