"""SET and RigL through `fit`: when masks move, by how much, and what moved entries hold.

A callback records the keep masks, the kernels and their optimizer state after
every step; the tests check the promises of maskfit.sparse against the record:
masks change only after update steps and by exactly the scheduled count per
layer, dropped weights are exactly 0 (AdamW with weight decay, SGD with
momentum and weight decay), grown ones start at 0 with fresh optimizer state,
RigL grows where a separately computed gradient is largest, and it composes
with set_mask, pruning, mixed precision, save-and-resume and replicas.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import maskfit
from maskfit import model as model_lib
from maskfit import pruning, sparse
from maskfit.optim import traits
from maskfit.spec import rules
from tests.helpers import checkout

DELTA_T = 3
STEPS = 12  # RigL updates after steps 3, 6, 9 and 12; SET at the start of 4, 7, 10
ALPHA = 0.5


def mlp():
    inputs = keras.Input((12,))
    body = keras.layers.Dense(24, activation="tanh", name="body")
    head = keras.layers.Dense(4, name="head")
    return maskfit.MaskedModel(inputs, head(body(inputs))), body, head


def data(count=8 * STEPS, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(count, 12)).astype("float32")
    return x, rng.normal(size=(count, 4)).astype("float32")


def optimizer(name):
    if name == "adamw":
        return keras.optimizers.AdamW(0.05, weight_decay=0.1)
    return keras.optimizers.SGD(0.05, momentum=0.9, weight_decay=0.1)


class Record(keras.callbacks.Callback):
    """After every step: `(iterations, [keep], [kernel], [{slot name: value}])`."""

    def __init__(self, layers):
        super().__init__()
        self.layers = layers
        self.steps = []

    def on_train_batch_end(self, batch, logs=None):
        model = self.model
        variables = model_lib.all_trainable_variables(model)
        keeps = model_lib.keep_masks(model)
        kernels = [layer.kernel for layer in self.layers]
        positions = [
            next(i for i, v in enumerate(variables) if v is k) for k in kernels
        ]
        state = [
            {_slot_name(s): s.numpy() for s in traits.state_of(model.optimizer, k)}
            for k in kernels
        ]
        self.steps.append(
            (
                int(model.optimizer.iterations.numpy()),
                [keeps[p].copy() for p in positions],
                [k.numpy() for k in kernels],
                state,
            )
        )


def _slot_name(slot):
    """ "momentum" (SGD's, Adam's first moment), "velocity" (Adam's second)."""
    return slot.path.rsplit("_", 1)[-1]


# SET moves body's connections, RigL head's: one compile checks both rules.
METHODS = ("set", "rigl")


def train(optimizer_name, mode):
    model, body, head = mlp()
    for layer, method in zip((body, head), METHODS):
        sparse.sparsify(
            layer,
            method,
            sparsity=0.75,
            t_end=100,
            delta_t=DELTA_T,
            alpha=ALPHA,
            drop_fraction_anneal="constant",
        )
    model.compile(optimizer=optimizer(optimizer_name), loss="mse", **mode)
    record = Record([body, head])
    x, y = data()
    model.fit(x, y, batch_size=8, shuffle=False, verbose=0, callbacks=[record])
    return model, record


def _moved_after(method):
    """The steps after which `method` has moved the masks (the record shows the
    state after each step: SET moves at the start of the next one)."""
    moved_after = list(range(DELTA_T, STEPS + 1, DELTA_T))
    if method == "set":
        moved_after = [t + 1 for t in moved_after if t < STEPS]
    return moved_after


def check_run(record, state_held=True):
    """The promises every run keeps, against its record (layers by `METHODS`).

    `state_held`: whether inactive entries' optimizer state is held bit for
    bit (not in a TensorFlow step under XLA, which zeroes the weights after
    each update and leaves their state to the optimizer)."""
    steps = [s for s, _, _, _ in record.steps]
    assert steps == list(range(1, STEPS + 1))
    initial = record.steps[0][1]
    sizes = [k.sum() for k in initial]
    previous, previous_state = initial, record.steps[0][3]
    for step, keeps, kernels, state in record.steps[1:]:
        layers = zip(METHODS, keeps, previous, kernels, state, previous_state, sizes)
        for method, keep, before, kernel, slots, old_slots, size in layers:
            assert keep.sum() == size  # constant sparsity
            np.testing.assert_array_equal(kernel[~keep], 0.0)  # exact, every step
            grown, dropped = keep & ~before, before & ~keep
            # Entries inactive before and after the step: their optimizer state
            # is held bit for bit (0 since their drop; on JAX as it was).
            for name, value in slots.items() if state_held else ():
                held = ~keep & ~before
                np.testing.assert_array_equal(value[held], old_slots[name][held])
            if step not in _moved_after(method):
                np.testing.assert_array_equal(keep, before)
                continue
            moved = int(np.float32(size) * np.float32(ALPHA))
            assert grown.sum() == dropped.sum() == moved > 0
            if method == "rigl":
                # After RigL's update step: grown entries 0, state fresh (0).
                np.testing.assert_array_equal(kernel[grown], 0.0)
                for value in slots.values():
                    np.testing.assert_array_equal(value[grown], 0.0)
            elif "momentum" in slots and "velocity" in slots:
                # SET moved them before this step's forward pass: one Adam
                # step from fresh moments has m**2 (1 - b2) == v (1 - b1)**2.
                # (Entries into a unit whose outputs are all dropped get a 0
                # gradient, and so 0 moments.)
                m, v = slots["momentum"][grown], slots["velocity"][grown]
                np.testing.assert_allclose(
                    m**2 * (1 - 0.999), v * 0.1**2, rtol=1e-3, atol=1e-14
                )
                assert np.count_nonzero(v) > 0
        previous, previous_state = keeps, state


@pytest.mark.backends("tensorflow", "jax")
def test_masks_move_only_after_update_steps_by_the_scheduled_count(mode):
    # AdamW with weight decay: dropped entries have moments and decay that
    # would move them, grown ones must start from fresh moments.
    _, record = train("adamw", mode)
    xla = keras.backend.backend() == "tensorflow" and mode.get("jit_compile")
    check_run(record, state_held=not xla)


def test_sgd_with_momentum_and_weight_decay_too():
    # (Graph mode only: under XLA dropped entries' state is left alone and the
    # entries zeroed after every update, for every optimizer, as AdamW's jit
    # run above checks.)
    _, record = train("sgd", {})
    check_run(record)


def _own_gradient(weights, x, y):
    """The gradient of the batch's MSE at `weights`, by this backend's own autodiff
    (a `tf.GradientTape`, or `jax.grad`)."""
    if keras.backend.backend() == "jax":
        import jax

        loss = lambda w: jax.numpy.mean(jax.numpy.square(x @ w - y))  # noqa: E731
        return np.asarray(jax.grad(loss)(weights))
    w = tf.Variable(weights)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(x @ w - y))
    return tape.gradient(loss, w).numpy()


@pytest.mark.backends("tensorflow", "jax")
def test_rigl_grows_where_a_separately_computed_gradient_is_largest(mode):
    # A linear model, MSE, plain SGD: the step's gradient from the weights
    # recorded before it, on its batch, by the backend's own autodiff.
    inputs = keras.Input((12,))
    layer = keras.layers.Dense(6, use_bias=False, name="linear")
    model = maskfit.MaskedModel(inputs, layer(inputs))
    sparse.sparsify(
        model, "rigl", 0.5, t_end=100, delta_t=DELTA_T, drop_fraction_anneal="constant"
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", **mode)
    record = Record([layer])
    x, y = data(8 * DELTA_T, seed=3)
    y = y[:, :1] @ np.ones((1, 6), np.float32) + x[:, :6]
    model.fit(x, y, batch_size=8, shuffle=False, verbose=0, callbacks=[record])
    (_, (before,), (weights,), _), (_, (keep,), (after,), _) = record.steps[-2:]
    signed = _own_gradient(weights, x[-8:], y[-8:])
    by_hand = 2 / (8 * 6) * x[-8:].T @ (x[-8:] @ weights - y[-8:])
    np.testing.assert_allclose(signed, by_hand, rtol=1e-4, atol=1e-6)
    gradient = np.abs(signed)
    grown, dropped = keep & ~before, before & ~keep
    count = int(np.float32(before.sum()) * np.float32(0.3))
    assert grown.sum() == dropped.sum() == count > 0
    # Grown: the largest |gradient| among the entries inactive before;
    assert gradient[grown].min() > gradient[~before & ~grown].max()
    # dropped: the smallest |w| after the step's update, among the active.
    updated = weights - 0.1 * np.where(before, signed, 0)
    stayed = keep & before
    assert np.abs(updated[dropped]).max() <= np.abs(updated[stayed]).min() + 1e-6
    np.testing.assert_allclose(after[stayed], updated[stayed], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(after[grown], 0.0)


def test_sparse_training_composes_with_set_mask_pruning_and_summary():
    inputs = keras.Input((12,))
    first = keras.layers.Dense(16, activation="tanh", name="first")
    body = keras.layers.Dense(16, activation="tanh", name="body")
    head = keras.layers.Dense(4, name="head")
    model = maskfit.MaskedModel(inputs, head(body(first(inputs))))
    frozen = np.zeros((16, 16), bool)
    frozen[:, :2] = True  # body's units 0 and 1 never learn
    maskfit.set_mask(body, maskfit.ElementMask({"kernel": ~frozen}))
    schedule = pruning.PolynomialDecay(0.0, 0.5, 0, 6, frequency=2)
    pruning.prune_low_magnitude(head, pruning_schedule=schedule)
    sparse.sparsify(
        model, "rigl", 0.8, t_end=100, delta_t=DELTA_T, sparsity_distribution="uniform"
    )
    model.compile(optimizer=optimizer("adamw"), loss="mse")
    start = body.kernel.numpy()
    record = Record([first, body, head])
    x, y = data()
    model.fit(x, y, batch_size=8, shuffle=False, verbose=0, callbacks=[record])
    for _step, (keep_first, keep_body, keep_head), (
        k_first,
        k_body,
        k_head,
    ), _ in record.steps:
        # Frozen entries: kept, never moved, bit for bit.
        assert keep_body[frozen].all()
        np.testing.assert_array_equal(k_body[frozen], start[frozen])
        # The budget: 80% of first and body, frozen entries counted as kept.
        assert keep_first.sum() == 12 * 16 - int(0.8 * 12 * 16)
        assert keep_body.sum() == 16 * 16 - int(0.8 * 16 * 16)
        for keep, kernel in (
            (keep_first, k_first),
            (keep_body, k_body),
            (keep_head, k_head),
        ):
            np.testing.assert_array_equal(kernel[~keep], 0.0)
    assert record.steps[-1][1][2].sum() == 32  # pruning's 50% of head
    assert not np.array_equal(record.steps[0][1][1], record.steps[-1][1][1])
    lines = []
    report = maskfit.summary(model, print_fn=lines.append)
    rows = {r.path.split("/")[-2]: r for r in report.rows if r.path.endswith("kernel")}
    assert [rows[n].mask_kind for n in ("first", "body", "head")] == [
        "sparse",
        "element+sparse",
        "pruned",
    ]
    assert rows["first"].sparsity == pytest.approx(153 / 192)
    assert rows["head"].sparsity == 0.5
    assert "Sparsity" in lines[2] and any("may grow back" in line for line in lines)


def test_rigl_under_mixed_precision_skips_nothing_it_should_not():
    keras.config.set_dtype_policy("mixed_float16")
    _, record = train("adamw", {})
    check_run(record)


def test_save_mid_run_and_resume_bit_exact(tmp_path):
    def build():
        model, body, head = mlp()
        for layer, method in ((body, "set"), (head, "rigl")):
            sparse.sparsify(layer, method, 0.7, t_end=100, delta_t=DELTA_T, seed=4)
        model.compile(optimizer=optimizer("adamw"), loss="mse")
        return model

    x, y = data()
    half = 8 * 5  # 5 steps: SET's update after step 3 is done, after 6 not yet
    model = build()
    model.fit(x[:half], y[:half], batch_size=8, shuffle=False, verbose=0)
    path = str(tmp_path / "sparse.keras")
    model.save(path)
    model.fit(x[half:], y[half:], batch_size=8, shuffle=False, verbose=0)
    loaded = keras.saving.load_model(path)
    assert isinstance(rules.get_rule(loaded.get_layer("body")), sparse.SET)
    loaded.fit(x[half:], y[half:], batch_size=8, shuffle=False, verbose=0)
    for a, b in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    keeps, resumed = model_lib.keep_masks(model), model_lib.keep_masks(loaded)
    assert sorted(keeps) == sorted(resumed) and len(keeps) == 2
    for index, keep in keeps.items():
        np.testing.assert_array_equal(resumed[index], keep)


def test_sparsify_converts_plain_models_and_refuses_bad_input():
    plain = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(2)]
    )
    model = sparse.sparsify(plain, "set", 0.5, t_end=10)
    assert isinstance(model, maskfit.MaskedSequential)
    assert isinstance(rules.get_rule(model), sparse.SET)
    with pytest.raises(
        ValueError, match=r"method must be one of \['rigl', 'set'\].*'snip'"
    ):
        sparse.sparsify(plain, "snip", 0.5, t_end=10)
    with pytest.raises(
        ValueError, match=r"t_end must be a positive integer.*t_end=None"
    ):
        sparse.sparsify(plain, "rigl", 0.5)
    with pytest.raises(TypeError, match="takes a keras.Model or a keras.layers.Layer"):
        sparse.sparsify([plain.layers[0]], "rigl", 0.5, t_end=10)
    with pytest.raises(ValueError, match="names layer 'nope'"):
        sparse.sparsify(plain, "rigl", 0.5, t_end=10, custom_sparsity_map={"nope": 0.1})


def test_rigl_with_factored_optimizer_state_is_one_clear_error():
    model, _, _ = mlp()
    sparse.sparsify(model, "rigl", 0.5, t_end=10, delta_t=2)
    model.compile(optimizer=keras.optimizers.Adafactor(), loss="mse")
    x, y = data(16)
    with pytest.raises(ValueError, match="cannot start with fresh state"):
        model.fit(x, y, batch_size=8, verbose=0)


@pytest.mark.slow  # a worker process with 2 logical CPUs: ~12-30 s
def test_replicas_of_a_mirrored_strategy_agree():
    done = checkout.run(checkout.script("sparse_mirrored_run.py"))
    assert done.returncode == 0 and "ok" in done.stdout, (
        done.stdout[-2000:] + done.stderr[-3000:]
    )
