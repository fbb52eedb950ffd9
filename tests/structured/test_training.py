"""prune_units in training: removed units are exactly 0 after every step, in every
mode and under optimizers with history; frozen units stay; the schedule's counts;
resume (Taylor sums too); Taylor importance, on one device and on two replicas;
one-shot pruning; shrink after fit."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import maskfit
from maskfit import model as model_lib
from maskfit import paths
from maskfit.optim import traits
from maskfit.spec import rules as mask_rules
from maskfit.structured.scoring import choice as unit_choice
from tests.helpers import structured_models as models

pruning = maskfit.pruning
L = keras.layers
HERE = os.path.dirname(os.path.abspath(__file__))

# Prunes in training steps 2, 4 and 6, to half of each group's units.
SCHEDULE = dict(
    initial_sparsity=0.0, final_sparsity=0.5, begin_step=0, end_step=6, frequency=2
)

# Each with EMA, overwritten every 3 steps (the averages carry history too).
_EMA = dict(use_ema=True, ema_momentum=0.5, ema_overwrite_frequency=3)
OPTIMIZERS = {
    "adamw_ema": lambda: keras.optimizers.AdamW(0.05, weight_decay=0.2, **_EMA),
    "sgd_momentum_ema": lambda: keras.optimizers.SGD(
        0.05, momentum=0.9, weight_decay=0.05, **_EMA
    ),
}


def residual_net():
    """A residual block with batch norm (dense, so that XLA compiles it fast)."""
    x = keras.Input((5,))
    stem = L.ReLU()(L.BatchNormalization(name="bn")(L.Dense(8, name="stem")(x)))
    h = L.Dense(8, name="block")(stem)
    h = L.Add()([stem, h])
    h = L.Dense(6, activation="relu", name="dense")(h)
    return keras.Model(x, L.Dense(3, name="head")(h))


def data(count=32, seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(count, 5)).astype("float32"),
        rng.normal(size=(count, 3)).astype("float32"),
    )


class RemovedStayZero(keras.callbacks.Callback):
    """After every step: removed entries +0.0, groups at the schedule's count;
    with `state`, their optimizer state 0 too."""

    def __init__(self, schedule, state=False):
        super().__init__()
        self.schedule, self.state, self.checked = schedule, state, 0

    def on_train_batch_begin(self, batch, logs=None):
        self.step = int(self.model.optimizer.iterations.numpy()) + 1

    def on_train_batch_end(self, batch, logs=None):
        variables = model_lib.all_trainable_variables(self.model)
        for index, keep in model_lib.keep_masks(self.model).items():
            value = variables[index].numpy()[~keep]
            np.testing.assert_array_equal(value, 0.0)
            assert not np.signbit(value).any(), variables[index].path
            if self.state:
                for slot in traits.state_of(self.model.optimizer, variables[index]):
                    np.testing.assert_array_equal(np.asarray(slot.numpy())[~keep], 0.0)
        selection = pruning.unit_selection(self.model)
        done = pruning.pruning_steps(self.schedule, 1, self.step + 1)
        fraction = done[-1][1] if done else 0.0
        for group in selection.graph.groups:
            expected = int(
                unit_choice.kept_count(int(group.channels.sum()), 1, fraction)
            )
            assert int(selection.kept[group.atoms].sum()) == expected, (
                self.step,
                group,
            )
        self.checked += 1


# Every optimizer in graph and jit steps; eager runs the same masking code as a
# graph step, without tracing it: AdamW there.
RUNS = [
    ("eager", "adamw_ema"),
    ("graph", "adamw_ema"),
    ("graph", "sgd_momentum_ema"),
    ("jit", "adamw_ema"),
    ("jit", "sgd_momentum_ema"),
]


# Under JAX a compiled step is jitted either way ("graph" would repeat "jit"),
# and the rule runs on the host in both modes by the same code; an eager JAX
# step compiles each operation on first use (~40 s here): slow.
if keras.backend.backend() == "jax":
    RUNS = [
        pytest.param(*run, marks=pytest.mark.slow) if run[0] == "eager" else run
        for run in RUNS
        if run[0] != "graph"
    ]


@pytest.mark.backends("tensorflow", "jax")
@pytest.mark.parametrize("mode, name", RUNS, indirect=["mode"])
def test_removed_units_are_exactly_zero_after_every_step(name, mode):
    schedule = pruning.PolynomialDecay(**SCHEDULE)
    model = residual_net()
    # Units 0 and 5 of 'dense' have a frozen bias entry: they stay, untouched.
    frozen = np.array([0, 1, 1, 1, 1, 0], "float32")
    maskfit.set_mask(model.get_layer("dense"), maskfit.ElementMask({"bias": frozen}))
    bias = model.get_layer("dense").bias.numpy().copy()
    pruned = pruning.prune_units(model, schedule)
    pruned.compile(optimizer=OPTIMIZERS[name](), loss="mse", **mode)
    x, y = data()
    # Removed entries' optimizer state is 0 in a TensorFlow step outside XLA;
    # under XLA, and on JAX, it is held as it was (the entries are frozen).
    zeroed = keras.backend.backend() == "tensorflow" and not mode.get("jit_compile")
    check = RemovedStayZero(schedule, state=zeroed)

    pruned.fit(
        x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[check]
    )

    assert check.checked == 8
    removed = pruning.unit_selection(pruned).removed()
    assert set(removed) == {"stem", "block", "dense"}  # never the head
    assert len(removed["stem"]["units"]) == 4 and not {0, 5} & set(
        removed["dense"]["units"]
    )
    np.testing.assert_array_equal(
        model.get_layer("dense").bias.numpy()[[0, 5]], bias[[0, 5]]
    )
    # fit copies EMA averages in at its end: removed entries stay 0.
    variables = model_lib.all_trainable_variables(pruned)
    for index, keep in model_lib.keep_masks(pruned).items():
        np.testing.assert_array_equal(variables[index].numpy()[~keep], 0.0)
    # What was trained is what shrink keeps.
    small = pruning.shrink(pruned)
    np.testing.assert_allclose(
        np.asarray(small(x, training=False)),
        np.asarray(pruned(x, training=False)),
        rtol=1e-5,
        atol=1e-5,
    )
    assert small.get_layer("stem").units == 4 and small.get_layer("dense").units == 3


@pytest.mark.backends("tensorflow", "jax")
def test_resuming_mid_schedule_gives_the_weights_of_an_uninterrupted_run(tmp_path):
    # With Taylor importance: the sums since the last update are saved too.
    x, y = data(64)
    schedule = dict(SCHEDULE, end_step=12)  # prunes in steps 2, 4, ..., 12

    def start():
        keras.utils.set_random_seed(7)
        pruned = pruning.prune_units(
            residual_net(), pruning.PolynomialDecay(**schedule), importance="taylor"
        )
        pruned.compile(
            optimizer=keras.optimizers.AdamW(0.05, weight_decay=0.1), loss="mse"
        )
        return pruned

    whole = start()
    whole.fit(x, y, batch_size=4, shuffle=False, verbose=0)  # steps 1-16

    first = start()
    first.fit(x[:20], y[:20], batch_size=4, shuffle=False, verbose=0)  # steps 1-5
    sums = mask_rules.get_rule(first).state_variables(first)
    assert any(
        np.any(s.numpy() != 0) for s in sums.values()
    )  # step 5, after the update in 4
    path = str(tmp_path / "half.keras")
    first.save(path)
    resumed = keras.saving.load_model(path)
    resumed.fit(x[20:], y[20:], batch_size=4, shuffle=False, verbose=0)  # steps 6-16

    for a, b in zip(whole.get_weights(), resumed.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert (
        pruning.unit_selection(resumed).removed()
        == pruning.unit_selection(whole).removed()
    )


def test_counts_per_group_follow_torch_pruning_with_round_to():
    # Torch-Pruning: kept = int(C * (1 - ratio)), rounded down to round_to.
    for channels in (7, 16, 33, 64, 1024):
        for ratio in (0.1, 0.25, 0.3, 0.5, 0.7, 0.75, 0.9):
            for round_to in (None, 4, 8):
                kept = int(channels * (1 - ratio))
                if round_to and kept < channels:
                    kept -= kept % round_to
                kept = max(kept, round_to or 1) if kept < channels else kept
                got = int(unit_choice.kept_count(channels, 1, ratio, round_to))
                assert got == min(kept, channels), (channels, ratio, round_to)
    assert (
        int(unit_choice.kept_count(12, 1, 0.0, 8)) == 12
    )  # nothing removed, no rounding
    assert int(unit_choice.kept_count(64, 1, 0.99, None, min_units=3)) == 3


def test_round_to_min_units_and_global_pruning_in_select_units():
    x = keras.Input((5,))
    h = L.Dense(40, activation="relu", name="wide")(x)
    h = L.Dense(12, activation="relu", name="narrow")(h)
    model = models.functional(x, L.Dense(2, name="head")(h))

    local = pruning.select_units(model, 0.5, round_to=8)
    assert {k: len(v["units"]) for k, v in local.removed().items()} == {
        "wide": 24,
        "narrow": 4,
    }
    floor = pruning.select_units(model, 0.9, min_units=5)
    assert {k: len(v["units"]) for k, v in floor.removed().items()} == {
        "wide": 35,
        "narrow": 7,
    }

    # Globally, half of all 52 units go, the least important first (scores
    # divided by their group's mean), and each group keeps at least one.
    model.get_layer("narrow").kernel.assign(model.get_layer("narrow").kernel * 0.01)
    global_ = pruning.select_units(model, 0.5, global_pruning=True)
    removed = {k: len(v["units"]) for k, v in global_.removed().items()}
    assert sum(removed.values()) == 26


def test_one_shot_on_a_trained_model_then_fine_tuning():
    model = residual_net()
    x, y = data()
    model.compile(optimizer="adam", loss="mse")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    expected = pruning.select_units(model, 0.5).removed()

    # One update, before the first step, from the trained weights.
    once = pruning.ConstantSparsity(0.5, begin_step=1, end_step=1, frequency=1)
    pruned = pruning.prune_units(model, once)
    pruned.compile(optimizer=keras.optimizers.AdamW(0.01, weight_decay=0.1), loss="mse")
    check = RemovedStayZero(once)
    pruned.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[check])

    assert pruning.unit_selection(pruned).removed() == expected
    assert check.checked == 4


@pytest.mark.backends("tensorflow", "jax")
def test_taylor_importance_sums_weight_times_gradient_over_the_steps():
    # With a learning rate of 0 the weights do not move, so the gradual rule's
    # sum over steps 1-3 (the update in step 4 comes before its gradients)
    # equals select_units' sum over the same three batches.
    keras.utils.set_random_seed(5)
    model = residual_net()
    models.randomize(model, seed=2)
    x, y = data(16)
    expected = pruning.select_units(
        model, 0.5, importance="taylor", data=(x[:12], y[:12]), loss="mse", batch_size=4
    ).removed()
    schedule = pruning.ConstantSparsity(0.5, begin_step=4, end_step=4, frequency=1)
    pruned = pruning.prune_units(model, schedule, importance=pruning.TaylorImportance())
    pruned.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    pruned.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)

    assert pruning.unit_selection(pruned).removed() == expected


@pytest.mark.slow
def test_taylor_importance_on_two_replicas_sums_the_global_batch(tmp_path):
    from tests.helpers import checkout
    from tests.helpers import structured_distributed_run as run

    done = checkout.run(run.__file__, tmp_path, TF_CPP_MIN_LOG_LEVEL="2")
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "taylor.json") as f:
        result = json.load(f)
    assert result["replicas"] == 2 and result["zero"]
    # On one device, from the same weights: |w * g| of each whole batch,
    # summed over the first three (each replica's half batch would differ).
    model = run.build()
    model.set_weights([np.asarray(w, "float32") for w in result["weights"]])
    x, y = run.data()
    expected = pruning.select_units(
        model, 0.5, importance="taylor", data=(x[:12], y[:12]), loss="mse", batch_size=4
    )
    assert result["removed"] == expected.removed() and result["removed"]
    variables = model.trainable_variables
    keys = paths.variable_keys(model, variables)
    sums = {key: np.zeros(v.shape) for key, v in zip(keys, variables)}
    for start in (0, 4, 8):
        batch = slice(start, start + 4)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(
                keras.losses.mean_squared_error(y[batch], model(x[batch]))
            )
        for key, v, g in zip(keys, variables, tape.gradient(loss, variables)):
            sums[key] += np.abs(v.numpy() * g.numpy())
    for key, total in result["sums"].items():
        np.testing.assert_allclose(total, sums[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_a_sequential_model_prunes_in_fit_keeps_removed_units_out_and_shrinks():
    model = keras.Sequential(
        [
            keras.Input((5,)),
            L.Dense(8, activation="relu", name="a"),
            L.BatchNormalization(name="bn"),
            L.Dense(6, name="b"),
            L.Dense(3, name="head"),
        ]
    )

    def noise(variable, value):  # another ranking at every update
        return tf.random.uniform(tf.shape(value))

    every_step = pruning.ConstantSparsity(0.5, begin_step=0, frequency=1)
    pruned = pruning.prune_units(model, every_step, importance=noise)
    assert type(pruned) is maskfit.MaskedSequential
    pruned.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
    x, y = data(16)
    pruned.fit(x[:4], y[:4], batch_size=4, verbose=0)
    first = pruning.unit_selection(pruned).removed()
    pruned.fit(x, y, batch_size=4, verbose=0)

    # A removed unit never comes back, whatever the later rankings say.
    assert pruning.unit_selection(pruned).removed() == first
    small = pruning.shrink(pruned)
    assert type(small) is keras.Sequential
    assert [small.get_layer(n).units for n in ("a", "b", "head")] == [4, 3, 3]
    np.testing.assert_allclose(
        np.asarray(small(x)), np.asarray(pruned(x)), rtol=1e-5, atol=1e-6
    )
