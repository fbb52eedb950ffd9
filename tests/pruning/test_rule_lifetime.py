"""Rules leave the compiled step once their updates are over (2:4 costs nothing per step).

A rule's `last_update_step` bounds when it can update. The step is traced
without a rule that is past it; a rule whose last update is the first step
of a call (N:M sparsity, in step 1) is applied just before that call, outside
the step. These tests check that this changes nothing a user can see: the
same masks at the same steps, pruned entries +0.0 after every step (their
optimizer state 0), the rule back in the step when the optimizer goes back.
"""

import hypothesis
import hypothesis.strategies as st
import keras
import numpy as np
import pytest
import tensorflow as tf

import maskfit
from maskfit import model as model_lib
from maskfit import pruning
from maskfit.optim import traits
from tests.helpers import keras_versions


def data(n=32, inputs=8, outputs=4, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, inputs)).astype("float32")
    return x, rng.normal(size=(n, outputs)).astype("float32")


def mlp(cls=maskfit.MaskedModel):
    inputs = keras.Input((8,))
    body = keras.layers.Dense(8, activation="tanh", name="body")
    head = keras.layers.Dense(4, name="head")
    return cls(inputs, head(body(inputs))), body, head


class Recorded(pruning.MagnitudePruning):
    """`MagnitudePruning` that records, per `should_update` call, whether it was eager.

    A call in a trace is recorded once (the trace), an eager call each time.
    """

    calls = []

    def should_update(self, step):
        Recorded.calls.append(tf.executing_eagerly())
        return super().should_update(step)


class InStep(Recorded):
    """The same rule, kept in every step (no bound on its updates)."""

    def last_update_step(self):
        return None


class PrunedStayZero(keras.callbacks.Callback):
    """After every call: pruned entries are +0.0, and so is their optimizer state.

    `state=False` leaves the state out: under XLA, a rule in the step leaves
    it as it is (pruned entries are zeroed after each update instead).
    """

    def __init__(self, state=True):
        super().__init__()
        self.state = state
        self.steps = []

    def on_train_batch_end(self, batch, logs=None):
        variables = model_lib.all_trainable_variables(self.model)
        for index, keep in model_lib.keep_masks(self.model).items():
            variable = variables[index]
            value = variable.numpy()
            np.testing.assert_array_equal(value[~keep], 0.0)
            assert not np.signbit(value[~keep]).any(), variable.path
            if self.state and traits.keeps_dropped_entries_at_zero(
                self.model.optimizer, variable
            ):
                for slot in traits.state_of(self.model.optimizer, variable):
                    np.testing.assert_array_equal(slot.numpy()[~keep], 0.0)
        self.steps.append(int(self.model.optimizer.iterations.numpy()))


def declare(model, body, rule_class, **rule):
    pruning.prune_low_magnitude(model)  # the model's rule: the head's
    maskfit.spec.rules.set_rule(
        body,
        rule_class(rule.pop("schedule", pruning.ConstantSparsity(0.5, 0)), **rule),
    )


# --- the bounds ---------------------------------------------------------------


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(
    kind=st.sampled_from(["constant", "polynomial"]),
    begin=st.integers(0, 20),
    length=st.integers(1, 40),
    frequency=st.integers(1, 12),
)
def test_last_pruning_step_is_the_last_step_the_schedule_prunes(
    kind, begin, length, frequency
):
    end = begin + length
    if kind == "constant":
        schedule = pruning.ConstantSparsity(0.5, begin, end, frequency)
    else:
        schedule = pruning.PolynomialDecay(0.1, 0.8, begin, end, frequency=frequency)
    steps = [step for step, _ in pruning.pruning_steps(schedule, 0, end + 30)]
    assert schedule.last_pruning_step() == steps[-1]


def test_last_pruning_step_is_unknown_without_an_end_or_for_other_steps():
    assert pruning.ConstantSparsity(0.5, 0).last_pruning_step() is None

    class Later(pruning.ConstantSparsity):
        def __call__(self, step):
            return super().__call__(step - 7)

    class Often(pruning.PolynomialDecay):
        def _should_prune_in_step(self, step, begin_step, end_step, frequency):
            return tf.constant(True)

    assert Later(0.5, 0, 10).last_pruning_step() is None
    assert Often(0.0, 0.5, 0, 10).last_pruning_step() is None
    # A custom schedule that says nothing stays in every step.
    assert pruning.PruningSchedule.last_pruning_step(Later(0.5, 0, 10)) is None


def test_a_rules_last_update_is_in_optimizer_steps():
    polynomial = pruning.PolynomialDecay(0.0, 0.9, 0, 400, frequency=20)
    assert pruning.MagnitudePruning(polynomial).last_update_step() == 399
    assert (
        pruning.MagnitudePruning(pruning.ConstantSparsity(0.5, 0)).last_update_step()
        is None
    )
    two_of_four = pruning.MagnitudePruning(
        pruning.ConstantSparsity(0.5, 0), sparsity_m_by_n=(2, 4)
    )
    assert two_of_four.last_update_step() == 0


def test_a_bound_that_is_not_an_integer_is_one_clear_error_before_any_step():
    class HalfStep(pruning.ConstantSparsity):
        def last_pruning_step(self):
            return 2.5

    class TextBound(pruning.MagnitudePruning):
        def last_update_step(self):
            return "5"

    with pytest.raises(TypeError, match=r"HalfStep.last_pruning_step\(\) must return"):
        pruning.MagnitudePruning(HalfStep(0.5, 0, 10)).last_update_step()
    model, body, _ = mlp()
    declare(model, body, TextBound)
    model.compile(optimizer="adam", loss="mse")
    before = [v.numpy() for v in model.weights]
    x, y = data()
    with pytest.raises(
        TypeError, match=r"TextBound on layer 'body'.*Received: '5' of type str"
    ):
        model.fit(x, y, batch_size=4, verbose=0)
    for value, variable in zip(before, model.weights):
        np.testing.assert_array_equal(variable.numpy(), value)


# --- in training --------------------------------------------------------------


@pytest.mark.fused_too
def test_two_of_four_is_applied_before_the_first_call_and_not_traced(mode):
    runs = {}
    for rule_class in (Recorded, InStep):
        keras.utils.set_random_seed(7)
        model, body, head = mlp()
        declare(model, body, rule_class, sparsity_m_by_n=(2, 4))
        optimizer = keras.optimizers.AdamW(0.05, weight_decay=0.2)
        model.compile(optimizer=optimizer, loss="mse", **mode)
        check = PrunedStayZero()
        Recorded.calls = []
        x, y = data()
        model.fit(
            x, y, batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=[check]
        )
        assert check.steps == list(range(1, 17))
        runs[rule_class] = (Recorded.calls, body.kernel.numpy(), head.kernel.numpy())
    calls, kernel, head_kernel = runs[Recorded]
    # Once, eagerly, before the first call; never in the step.
    assert calls == [True]
    if not mode.get("run_eagerly"):
        # Traced into the step (under XLA also where the step picks its
        # variant with or without the rule's update: maskfit.step.split).
        assert runs[InStep][0] == [False] * (2 if mode.get("jit_compile") else 1)
    groups = kernel.T.reshape(8, 2, 4)
    assert np.all(np.count_nonzero(groups, axis=-1) == 2)
    # The same masks as when the rule runs in step 1, the same training.
    np.testing.assert_array_equal(kernel != 0, runs[InStep][1] != 0)
    np.testing.assert_allclose(kernel, runs[InStep][1], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(head_kernel, runs[InStep][2], rtol=1e-5, atol=1e-7)


def test_two_of_four_with_train_on_batch_and_steps_per_execution():
    model, body, _ = mlp()
    declare(model, body, Recorded, sparsity_m_by_n=(2, 4))
    model.compile(optimizer="adam", loss="mse", steps_per_execution=3)
    x, y = data()
    Recorded.calls = []
    before = body.kernel.numpy()
    for start in range(0, 12, 4):
        model.train_on_batch(x[start : start + 4], y[start : start + 4])
    assert Recorded.calls == [True]
    expected = pruning.magnitude_mask(before, 0.0, sparsity_m_by_n=(2, 4)).numpy() > 0
    np.testing.assert_array_equal(body.kernel.numpy() != 0, expected)
    model.fit(x, y, batch_size=4, verbose=0)
    np.testing.assert_array_equal(body.kernel.numpy() != 0, expected)


def test_a_finished_schedule_leaves_the_step_when_it_is_traced_anew(mode):
    # Prunes in steps 2, 4 and 6; from the second fit on, no more.
    schedule = pruning.PolynomialDecay(0.0, 0.75, 0, 6, frequency=2)
    model, body, _ = mlp()
    declare(model, body, Recorded, schedule=schedule)
    optimizer = keras.optimizers.Adam(0.05, use_ema=True, ema_overwrite_frequency=3)
    model.compile(optimizer=optimizer, loss="mse", **mode)
    x, y = data()
    check = PrunedStayZero(state=not mode.get("jit_compile"))
    Recorded.calls = []
    model.fit(x, y, batch_size=4, verbose=0, callbacks=[check])
    in_first = len(Recorded.calls)
    step = model.train_function
    assert np.count_nonzero(body.kernel.numpy() == 0) == 48
    # Past its last update the rule no longer fires; the step is not traced
    # again for that alone (a retrace costs more than the check it saves)...
    model.fit(x, y, batch_size=4, verbose=0, callbacks=[check])
    assert model.train_function is step
    in_second = len(Recorded.calls)
    assert in_second == in_first + (8 if mode.get("run_eagerly") else 0)
    # ... but a step traced anew leaves it out. Outside XLA the pruned
    # entries' state is 0 from then on; an XLA step relies on no state for
    # them and leaves it as it is (so a resumed run holds what an
    # uninterrupted one holds), zeroing the entries after each update.
    model.compile(optimizer=optimizer, loss="mse", **mode)
    settled = PrunedStayZero(state=not mode.get("jit_compile"))
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[settled])
    assert len(Recorded.calls) == in_second
    assert check.steps + settled.steps == list(range(1, 33))
    assert np.count_nonzero(body.kernel.numpy() == 0) == 48


def test_state_left_by_an_xla_step_is_settled_before_a_step_that_relies_on_it():
    # Under XLA, pruned entries are zeroed after each update and their
    # optimizer state is left as it is; a graph-mode step then relies on
    # that state being 0, which `prepare` sees to when the step is traced.
    model, body, _ = mlp()
    schedule = pruning.ConstantSparsity(0.5, 4, frequency=100)
    declare(model, body, pruning.MagnitudePruning, schedule=schedule)
    optimizer = keras.optimizers.Adam(0.05)
    model.compile(optimizer=optimizer, loss="mse", jit_compile=True)
    x, y = data()
    model.fit(x, y, batch_size=4, verbose=0)  # prunes in step 4, moments not 0
    keep = model_lib.keep_masks(model)[0]
    moments = traits.state_of(optimizer, body.kernel)
    assert any(np.any(m.numpy()[~keep] != 0) for m in moments)  # what XLA left
    model.compile(optimizer=optimizer, loss="mse", jit_compile=False)
    check = PrunedStayZero()
    model.fit(x, y, batch_size=4, verbose=0, callbacks=[check])
    assert check.steps == list(range(9, 17))


def test_the_rule_comes_back_when_the_optimizer_goes_back(mode):
    # As a backup restored in on_train_begin would: back to step 0, after
    # the step was traced anew without the rule.
    class Rewind(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.model.optimizer.iterations.assign(0)

    class Zeros(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.zeros = []

        def on_train_batch_end(self, batch, logs=None):
            keep = model_lib.keep_masks(self.model)[0]
            self.zeros.append(int(np.count_nonzero(~keep)))

    runs = {}
    for rule_class in (pruning.MagnitudePruning, InStep):
        keras.utils.set_random_seed(3)
        schedule = pruning.PolynomialDecay(0.0, 0.75, 0, 6, frequency=2)
        model, body, _ = mlp()
        declare(model, body, rule_class, schedule=schedule)
        model.compile(optimizer="adam", loss="mse", **mode)
        x, y = data()
        model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
        model.compile(optimizer=model.optimizer, loss="mse", **mode)
        zeros = Zeros()
        model.fit(
            x, y, batch_size=4, shuffle=False, verbose=0, callbacks=[Rewind(), zeros]
        )
        runs[rule_class] = zeros.zeros, body.kernel.numpy()
    # Pruned again at steps 2, 4 and 6, as by a rule that never left the
    # step (at step 2 to a lower sparsity: pruned entries tie at 0 with the
    # threshold and are kept, as in TF-MOT).
    assert (
        runs[pruning.MagnitudePruning][0]
        == runs[InStep][0]
        == [48, 0, 0, 46, 46, 48, 48, 48]
    )
    np.testing.assert_array_equal(
        runs[pruning.MagnitudePruning][1] != 0, runs[InStep][1] != 0
    )


class ConvNet(maskfit.MaskedModel):
    """A subclassed model as users write it: built by Keras inside the first fit."""

    def __init__(self):
        super().__init__()
        self.conv = keras.layers.Conv2D(
            8, 3, padding="same", data_format="channels_first", name="conv"
        )
        self.flat = keras.layers.Flatten()
        self.head = keras.layers.Dense(2, name="head")

    def call(self, x):
        return self.head(self.flat(self.conv(x)))


def test_two_of_four_on_a_subclassed_model_built_inside_fit(mode):
    if keras_versions.CHANNELS_FIRST_NEEDS_XLA and not mode.get("jit_compile"):
        pytest.skip(keras_versions.NEEDS_XLA_REASON)
    model = ConvNet()
    pruning.prune_low_magnitude(model, sparsity_m_by_n=(2, 4))
    optimizer = keras.optimizers.AdamW(0.05, weight_decay=0.2)
    model.compile(optimizer=optimizer, loss="mse", **mode)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 4, 4, 4)).astype("float32")  # channels first
    y = rng.normal(size=(16, 2)).astype("float32")
    check = PrunedStayZero(state=not mode.get("jit_compile"))
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[check])
    assert check.steps == list(range(1, 9))
    # Groups of 4 along the input axis (-2): 2 of each kept, in every kernel.
    for kernel in (model.conv.kernel.numpy(), model.head.kernel.numpy()):
        groups = np.moveaxis(kernel, -2, -1).reshape(-1, 4)
        assert np.all(np.count_nonzero(groups, axis=-1) == 2), kernel.shape
    # Traced anew without the rule, the next fit keeps all of it.
    model.compile(optimizer=model.optimizer, loss="mse", **mode)
    settled = PrunedStayZero()
    model.fit(x, y, batch_size=4, verbose=0, callbacks=[settled])
    assert settled.steps == list(range(9, 13))
