"""Magnitude pruning in `fit`, under every backend: TF-MOT's schedule, its masks
(same ranking, ties and sparsity; under JAX and torch the TensorFlow path's,
computed in a TensorFlow subprocess), pruned weights held bit for bit at 0, keep masks saved
and loaded, and `strip_pruning` afterwards. Under TensorFlow the eager and jit
cases run with the slow tests (test_training.py covers the modes there).
"""

import subprocess
import sys

import keras
import numpy as np
import pytest

import maskfit
import maskfit.pruning as pruning
from maskfit import sparse
from maskfit.model import training
from maskfit.pruning import magnitude
from tests.helpers.pruning_keeps_run import NAMES, keeps_by_name

pytestmark = [
    pytest.mark.backends("tensorflow", "jax", "torch"),
    pytest.mark.other_modes_slow,
]

BEGIN, END, FREQUENCY, FINAL = 2, 8, 2, 0.75


def _schedule():
    return pruning.PolynomialDecay(0.0, FINAL, BEGIN, END, frequency=FREQUENCY)


def _model():
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(16, activation="relu", name="hidden"),
            keras.layers.Dense(3, name="head"),
        ]
    )
    return pruning.prune_low_magnitude(model, _schedule())


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 6)).astype("float32")
    return x, rng.normal(size=(8, 3)).astype("float32")


def _kernels(model):
    return [np.array(model.get_layer(n).kernel.numpy()) for n in NAMES]


def _numpy_keep(weights, sparsity):
    """TF-MOT's ranking in numpy: the k largest magnitudes, ties kept."""
    flat = np.abs(weights).ravel()
    k = max(int(np.round(np.float32(flat.size) * np.float32(1 - sparsity))), 1)
    threshold = np.sort(flat)[::-1][k - 1]
    return np.abs(weights) >= threshold


def _train(model, steps, check):
    x, y = _data()
    for _ in range(steps):
        step = int(model.optimizer.iterations.numpy()) + 1  # TF-MOT's step
        before = _kernels(model)
        old = keeps_by_name(model)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
        check(step, before, old, model)


def _check_step(step, before, old, model):
    prune, sparsity = _schedule()(step)
    keeps = keeps_by_name(model)
    for name, weights, kernel in zip(NAMES, before, _kernels(model)):
        if bool(prune):
            expected = magnitude.magnitude_mask(np.abs(weights), sparsity).numpy()
            expected = expected != 0
            np.testing.assert_array_equal(keeps[name], expected)
            np.testing.assert_array_equal(
                keeps[name], _numpy_keep(weights, float(sparsity))
            )
            kept = magnitude.kept_count(weights.size, float(sparsity))
            assert int(keeps[name].sum()) == kept
        elif name in old:
            np.testing.assert_array_equal(keeps[name], old[name])
        if name in keeps:
            # Pruned entries are +0.0, bit for bit, after every step.
            dropped = kernel[~keeps[name]]
            np.testing.assert_array_equal(dropped, np.zeros_like(dropped))
            assert not np.signbit(dropped).any()
            assert np.all(kernel[keeps[name]] != 0)


def _compiled(model, mode):
    model.compile(
        optimizer=keras.optimizers.AdamW(0.05, weight_decay=0.1),
        loss="mse",
        **mode,
    )
    return model


def test_masks_follow_the_schedule_and_hold(mode):
    model = _compiled(_model(), mode)
    _train(model, END + 3, _check_step)
    sparsities = [1 - k.mean() for k in keeps_by_name(model).values()]
    np.testing.assert_allclose(sparsities, [FINAL, FINAL], atol=1e-6)


def test_keep_masks_save_load_and_continue(tmp_path, mode):
    model = _compiled(_model(), mode)
    _train(model, 5, _check_step)
    path = str(tmp_path / "pruned.keras")
    model.save(path)
    saved = keeps_by_name(model)
    loaded = keras.saving.load_model(path)
    for name, keep in keeps_by_name(loaded).items():
        np.testing.assert_array_equal(keep, saved[name])
    assert set(keeps_by_name(loaded)) == set(NAMES)
    loaded.compile(optimizer=loaded.optimizer, loss="mse", **mode)
    _train(loaded, END - 2, _check_step)
    assert int(loaded.optimizer.iterations.numpy()) == END + 3
    stripped = pruning.strip_pruning(loaded)
    assert type(stripped) is keras.Sequential
    for name, kernel in zip(NAMES, _kernels(loaded)):
        np.testing.assert_array_equal(stripped.get_layer(name).kernel.numpy(), kernel)


def _dense_model(rule_kwargs):
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(8, name="hidden")], name="m"
    )
    return pruning.prune_low_magnitude(model, **rule_kwargs)


@pytest.mark.parametrize(
    "rule_kwargs",
    [
        dict(
            pruning_schedule=pruning.ConstantSparsity(0.5, 0, frequency=1),
            block_size=(2, 2),
            block_pooling_type="MAX",
        ),
        dict(sparsity_m_by_n=(2, 4)),
    ],
    ids=["block", "m_by_n"],
)
def test_block_and_m_by_n_masks_are_the_tensorflow_function(rule_kwargs, mode):
    model = _dense_model(rule_kwargs)
    model.compile(optimizer="sgd", loss="mse", **mode)
    before = model.get_layer("hidden").kernel.numpy()
    x = np.random.default_rng(1).normal(size=(4, 8)).astype("float32")
    model.fit(x, x, batch_size=4, epochs=1, verbose=0)
    expected = magnitude.magnitude_mask(
        np.abs(before),
        0.5 if "block_size" in rule_kwargs else 0.0,
        rule_kwargs.get("block_size", (1, 1)),
        rule_kwargs.get("sparsity_m_by_n"),
        block_pooling_type=rule_kwargs.get("block_pooling_type", "AVG"),
    )
    keep = training.keep_masks(model)[0]
    np.testing.assert_array_equal(keep, expected.numpy() != 0)
    assert keep.mean() == 0.5
    kernel = model.get_layer("hidden").kernel.numpy()
    np.testing.assert_array_equal(kernel[~keep], np.zeros(int((~keep).sum())))
    model.fit(x, x, batch_size=4, epochs=2, verbose=0)
    kernel = model.get_layer("hidden").kernel.numpy()
    np.testing.assert_array_equal(training.keep_masks(model)[0], keep)
    np.testing.assert_array_equal(kernel[~keep], np.zeros(int((~keep).sum())))


def test_entries_a_declared_mask_freezes_are_never_pruned(mode):
    model = _dense_model(
        dict(pruning_schedule=pruning.ConstantSparsity(0.75, 0, frequency=1))
    )
    layer = model.get_layer("hidden")
    learn = np.ones((8, 8), "float32")
    learn[0] = 0.0  # row 0 is frozen
    maskfit.set_mask(layer, maskfit.ElementMask({"kernel": learn}))
    kernel = layer.kernel.numpy()
    kernel[1:] *= 1000.0  # the frozen row would be pruned first
    layer.kernel.assign(kernel)
    model.compile(optimizer="sgd", loss="mse", **mode)
    x = np.random.default_rng(2).normal(size=(4, 8)).astype("float32")
    model.fit(x, x, batch_size=4, epochs=1, verbose=0)
    keep = training.keep_masks(model)[0]
    assert keep[0].all()
    assert int(keep.sum()) == 16  # the frozen entries count as kept
    np.testing.assert_array_equal(layer.kernel.numpy()[0], kernel[0])


def _rule_run(rule, steps_per_execution):
    """Kernels and keep masks after 8 steps of one example (shuffle off)."""
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(16, activation="relu", name="hidden"),
            keras.layers.Dense(3, name="head"),
        ]
    )
    for index, name in enumerate(NAMES):
        layer = model.get_layer(name)
        rng = np.random.default_rng(index)
        layer.kernel.assign(rng.normal(size=layer.kernel.shape).astype("float32"))
    if rule == "pruning":
        model = pruning.prune_low_magnitude(model, _schedule())
    else:  # RigL: the dense gradients of its update steps 2, 4, 6
        model = sparse.sparsify(model, "rigl", 0.5, t_end=8, delta_t=2, alpha=0.5)
    model.compile(optimizer="adam", loss="mse", steps_per_execution=steps_per_execution)
    x, y = _data()
    model.fit(x, y, batch_size=1, epochs=1, verbose=0, shuffle=False)
    assert int(model.optimizer.iterations.numpy()) == 8
    return _kernels(model), training.keep_masks(model)


# Not under torch: Keras's torch trainer refuses steps_per_execution > 1
# ("`steps_per_execution` must be 1 with the PyTorch backend").
def test_a_pruning_step_learns_with_the_dropped_weights_at_zero(mode):
    # TF-MOT drops before the step's forward pass, so the step's gradients are
    # those of the pruned model (under torch they were of the unpruned one:
    # the rules ran after the backward pass, found by issue 44's run test).
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, name="head")])
    model = pruning.prune_low_magnitude(
        model, pruning.ConstantSparsity(0.5, begin_step=1, frequency=100)
    )
    rng = np.random.default_rng(3)
    kernel = rng.normal(size=(6, 4)).astype("float32")
    model.get_layer("head").kernel.assign(kernel)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", **mode)
    x, y = _data()
    y = y[:, :1].repeat(4, axis=1)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    keep = magnitude.magnitude_mask(np.abs(kernel), 0.5).numpy() != 0
    pruned = np.where(keep, kernel, 0)
    gradient = x.T @ (2 * (x @ pruned - y) / y.size)  # mse, zero bias
    expected = np.where(keep, pruned - 0.1 * gradient, 0)
    np.testing.assert_allclose(
        model.get_layer("head").kernel.numpy(), expected, rtol=1e-5, atol=1e-6
    )


@pytest.mark.backends("tensorflow", "jax")
@pytest.mark.parametrize("rule", ["pruning", "rigl"])
def test_steps_per_execution_above_one_updates_at_the_same_steps(rule):
    # Under JAX Keras runs the steps of one execution one by one (the rules
    # update between them): 3 steps a call give the run of 1 a call, bit for bit.
    kernels, keeps = _rule_run(rule, 1)
    kernels_3, keeps_3 = _rule_run(rule, 3)
    assert sorted(keeps) == sorted(keeps_3) and keeps
    for index, keep in keeps.items():
        np.testing.assert_array_equal(keeps_3[index], keep)
    for kernel, kernel_3 in zip(kernels, kernels_3):
        np.testing.assert_array_equal(kernel_3, kernel)
        assert np.count_nonzero(kernel) < kernel.size  # the rule pruned


def test_optimizer_slots_of_pruned_entries_are_held(mode):
    if keras.backend.backend() == "tensorflow" and mode.get("jit_compile"):
        # By design: under XLA the TensorFlow step sets dropped weights to +0.0
        # after each update and leaves their optimizer state alone (no state
        # zeroed at the drop: RuleRunner.prepare, RuleKeeps.zeroed); the
        # weights' +0.0 is what _check_step holds in every mode.
        pytest.skip("TensorFlow's XLA step holds dropped weights, not their slots")
    model = _compiled(_model(), mode)
    # Step BEGIN prunes at sparsity 0 (nothing dropped); BEGIN + FREQUENCY drops.
    _train(model, BEGIN + FREQUENCY, _check_step)
    keeps = keeps_by_name(model)
    assert all(0 < keep.sum() < keep.size for keep in keeps.values())

    def slots():
        found = {}
        for name, kernel in zip(NAMES, _kernels(model)):
            found[name] = [
                np.array(v.numpy())
                for v in model.optimizer.variables
                if tuple(v.shape) == kernel.shape
            ]
            assert len(found[name]) == 2  # AdamW's moments
        return found

    before = slots()
    _train(model, FREQUENCY - 1, _check_step)  # no pruning step
    after = slots()
    for name, keep in keeps.items():
        np.testing.assert_array_equal(keeps_by_name(model)[name], keep)
        for old, new in zip(before[name], after[name]):
            np.testing.assert_array_equal(new[~keep], old[~keep])
            assert np.any(new[keep] != old[keep])


def _slow_on_torch(test):
    """A TensorFlow subprocess costs ~11 s: the torch fast suite leaves it out
    (the fast tests above compare torch's masks with `magnitude_mask`, the
    function the TensorFlow step runs)."""
    return pytest.mark.slow(test) if keras.backend.backend() == "torch" else test


@pytest.fixture(scope="module")
def on_tensorflow(tmp_path_factory):
    """`(weights, results)`: tests/helpers/pruning_keeps_run.py run under
    TensorFlow, once for the module (a subprocess: ~11 s), on these weights."""
    from tests.helpers import checkout, pruning_keeps_run

    rng = np.random.default_rng(5)
    # Magnitudes in steps of 1/8: many ties, some at the threshold.
    weights = {
        "hidden": (rng.integers(-8, 9, size=(6, 8)) / 8).astype("float32"),
        "head": (rng.integers(-8, 9, size=(8, 4)) / 8).astype("float32"),
        # No ties for the Adam run (see the helper).
        "run_hidden": rng.normal(size=(6, 8)).astype("float32"),
        "run_head": rng.normal(size=(8, 4)).astype("float32"),
    }
    folder = tmp_path_factory.mktemp("pruning_keeps")
    source, out = str(folder / "weights.npz"), str(folder / "results.npz")
    np.savez(source, **weights)
    env = checkout.env(KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, pruning_keeps_run.__file__, source, out],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "keeps: ok under tensorflow" in result.stdout, result.stderr[-4000:]
    with np.load(out) as saved:
        return weights, {k: saved[k] for k in saved.files}


@pytest.mark.backends("jax", "torch")
@_slow_on_torch
@pytest.mark.parametrize("block_size", [(1, 1), (2, 2)], ids=["entries", "blocks"])
def test_keep_masks_equal_the_tensorflow_steps_on_the_same_weights(
    on_tensorflow, block_size
):
    from tests.helpers import pruning_keeps_run

    weights, results = on_tensorflow
    here = pruning_keeps_run.keeps(weights, block_size)
    prefix = f"keeps/{pruning_keeps_run.block_key(block_size)}/"
    assert sorted(k for k in results if k.startswith(prefix)) == sorted(
        prefix + name for name in NAMES
    )
    for name in NAMES:
        np.testing.assert_array_equal(here[name], results[prefix + name])
        assert 0 < here[name].sum() < here[name].size


@pytest.mark.backends("jax", "torch")
@_slow_on_torch
@pytest.mark.parametrize(
    "mode",
    # JAX's eager steps cost ~7 s here; torch's jit (torch.compile) minutes.
    ["eager"]
    if keras.backend.backend() == "torch"
    else ["jit", pytest.param("eager", marks=pytest.mark.slow)],
    indirect=True,
)
def test_a_pruning_run_keeps_the_tensorflow_runs_masks_at_every_step(
    on_tensorflow, mode
):
    # Issue 44: from the same weights, Adam and a schedule that drops entries
    # at steps 1, 3, 5 and 7 give the same keep masks after every step as the
    # TensorFlow step (so they change at the same steps), and the same kernels
    # to float rounding; TensorFlow zeroes the Adam moments of dropped entries
    # and JAX holds them, which no later step reads.
    from tests.helpers import pruning_keeps_run

    weights, results = on_tensorflow
    untied = {name: weights[f"run_{name}"] for name in NAMES}
    run = pruning_keeps_run.adam_run(untied, **mode)
    changed = []
    for step, (keeps, kernels) in enumerate(run, start=1):
        expected = {n: results[f"run/{step}/keep/{n}"] for n in NAMES}
        assert sorted(keeps) == sorted(expected), f"keep masks after step {step}"
        for name in NAMES:
            np.testing.assert_array_equal(
                keeps[name], expected[name], err_msg=f"{name} after step {step}"
            )
            np.testing.assert_allclose(
                kernels[name],
                results[f"run/{step}/kernel/{name}"],
                rtol=1e-5,
                atol=1e-6,
                err_msg=f"{name} after step {step}",
            )
            dropped = kernels[name][~keeps[name]]
            np.testing.assert_array_equal(dropped, np.zeros_like(dropped))
        previous = run[step - 2][0] if step > 1 else {}
        if any(
            name not in previous or np.any(previous[name] != keeps[name])
            for name in NAMES
        ):
            changed.append(step)
    assert changed == [1, 3, 5, 7]


class _LazyHead(maskfit.MaskedModel):
    """`hidden` built at construction; `head` built there or by the first call."""

    def __init__(self, hidden, head, build_head):
        super().__init__(name="lazy_head")
        self.hidden = keras.layers.Dense(
            4, name="hidden", kernel_initializer=lambda *a, **k: hidden
        )
        self.hidden.build((None, 6))
        self.head = keras.layers.Dense(
            3, name="head", kernel_initializer=lambda *a, **k: head
        )
        if build_head:
            self.head.build((None, 4))

    def call(self, x):
        return self.head(self.hidden(x))


def _lazy_head_run(build_head, fit):
    rng = np.random.default_rng(5)
    hidden = rng.normal(size=(6, 4)).astype("float32")
    head = rng.normal(size=(4, 3)).astype("float32")
    model = _LazyHead(hidden, head, build_head)
    # Pruned from the first step on, at a sparsity that rises every step.
    pruning.prune_low_magnitude(
        model.hidden, pruning.PolynomialDecay(0.25, 0.75, 0, 3, power=1, frequency=1)
    )
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    x, y = _data()
    found = []
    for _ in range(4):
        if fit:
            model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
        else:  # `fit` builds every layer first (a symbolic call); this does not
            model.train_step(
                (keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(y))
            )
        found.append(
            (
                keeps_by_name(model),
                [np.array(keras.ops.convert_to_numpy(v)) for v in model.weights],
            )
        )
    return found


@pytest.mark.backends("torch")
def test_weights_built_by_the_first_forward_pass_change_no_pruning_step():
    # The torch step computes its masks before the forward pass and again
    # once that pass has built new weights (`head` here, when `train_step` is
    # called without `fit`): the rules must run once per step all the same.
    # The same steps with `head` built beforehand, and in `fit`, give the same bits.
    lazy, built = _lazy_head_run(False, False), _lazy_head_run(True, False)
    in_fit = _lazy_head_run(False, True)
    for (keeps, weights), (keeps_fit, weights_fit) in zip(lazy, in_fit):
        np.testing.assert_array_equal(keeps["hidden"], keeps_fit["hidden"])
        for value, value_fit in zip(weights, weights_fit):
            np.testing.assert_array_equal(value, value_fit)
    assert len(lazy) == len(built) == 4
    for (keeps, weights), (keeps_built, weights_built) in zip(lazy, built):
        assert sorted(keeps) == sorted(keeps_built) == ["hidden"]
        np.testing.assert_array_equal(keeps["hidden"], keeps_built["hidden"])
        assert len(weights) == len(weights_built) == 4
        for value, value_built in zip(weights, weights_built):
            np.testing.assert_array_equal(value, value_built)
    kept = [int(keeps["hidden"].sum()) for keeps, _ in lazy]
    assert kept == [14, 10, 6, 6]  # 42%, 58%, 75% of 24 (TF-MOT's steps 1-3), held
