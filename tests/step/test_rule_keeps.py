"""Unit tests of `maskfit.step.rules` (`keeps`, `runner`, `update`) and `maskfit.step.update`."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import maskfit
from maskfit import paths
from maskfit.optim import traits
from maskfit.spec import rules
from maskfit.step import declared, mask_state, pipeline, update
from maskfit.step.rules import keeps as rule_keeps
from maskfit.step.rules import runner as rule_runner
from maskfit.step.rules import update as rule_update
from tests.helpers import step_rules


class KeepPositive(rules.MaskRule):
    """Keeps the positive entries, in steps `updates` (the last one is its bound)."""

    def __init__(self, updates=(0,)):
        self.updates = tuple(updates)

    def variables(self, layer):
        return [layer.kernel]

    def should_update(self, step):
        return tf.reduce_any(tf.equal(step, tf.constant(self.updates, tf.int64)))

    def last_update_step(self):
        return max(self.updates)

    def keep_mask(self, step, weights, protected):
        return weights > 0

    def get_config(self):
        return {"updates": list(self.updates)}


def _layer(name="d"):
    layer = keras.layers.Dense(3, name=name)
    layer.build((None, 2))
    layer.kernel.assign([[1.0, -1.0, 2.0], [-2.0, 3.0, -3.0]])
    return layer


def _state(layer, rule):
    state = rule_keeps.RuleKeeps()
    groups = rules.resolve_rules([(layer, rule)], layer.trainable_weights)
    return state, groups


def _view(step, optimizer, variables, masks=None):
    """A `StepView` with no variable left out and no declared mask by default."""
    mode = pipeline.UpdateMode(pipeline.PLAIN, custom_masking=False)
    return pipeline.StepView(
        step, optimizer, mode, tuple(variables), frozenset(), masks or {}
    )


def test_update_makes_keep_masks_and_says_when_to_retrace():
    layer = _layer()
    rule = KeepPositive()
    state, groups = _state(layer, rule)
    assert state.update(groups, layer.trainable_weights)
    keep = state.by_index[0]
    assert keep.dtype == tf.bool and bool(np.all(keep.numpy()))
    assert not state.update(groups, layer.trainable_weights)  # same rule object
    assert state.by_index[0] is keep
    other = rules.resolve_rules([(layer, KeepPositive())], layer.trainable_weights)
    assert state.update(other, layer.trainable_weights)  # another rule object


def test_which_rules_the_step_runs_and_which_prepare_applies():
    layer = _layer()
    state, groups = _state(layer, KeepPositive(updates=(0, 5)))
    state.update(groups, layer.trainable_weights)
    assert state.in_step_from(4, prepared=True) == {0}
    assert state.in_step_from(5, prepared=True) == frozenset()
    assert state.in_step_from(5, prepared=False) == {0}
    state.in_step = frozenset()
    assert state.left_out
    assert state.due_at(5) == {0} and state.due_at(6) == set()
    assert state.due_at(4) is None  # the optimizer went back: trace it in again


def test_prepare_applies_a_due_rule_and_zeroes_the_dropped_entries_and_their_state():
    layer = _layer()
    variables = layer.trainable_weights
    runner = rule_runner.RuleRunner(variables)
    state, groups = (
        runner.keeps,
        rules.resolve_rules([(layer, KeepPositive(updates=(0,)))], variables),
    )
    state.update(groups, variables)
    optimizer = keras.optimizers.Adam()
    optimizer.build(variables)
    moments = [s for s in optimizer.variables if "kernel" in s.path]
    for m in moments:
        m.assign(tf.ones_like(m))
    assert runner.prepare(_view(0, optimizer, variables), settle=False)
    expected = np.array([[True, False, True], [False, True, False]])
    np.testing.assert_array_equal(state.by_index[0].numpy(), expected)
    kernel = layer.kernel.numpy()
    assert np.all(kernel[~expected] == 0) and np.all(kernel[expected] != 0)
    for m in moments:  # Adam keeps a dropped entry at 0 once its state is 0
        np.testing.assert_array_equal(m.numpy() == 0, ~expected)


def test_settle_zeroes_dropped_entries_set_by_hand():
    layer = _layer()
    variables = layer.trainable_weights
    state, groups = _state(layer, KeepPositive())
    state.update(groups, variables)
    state.load({0: np.array([[True, True, False], [True, True, True]])})
    state.settle([paths.handle(v) for v in variables], frozenset(), {})
    assert layer.kernel.numpy()[0, 2] == 0 and layer.kernel.numpy()[0, 0] == 1


def test_load_returns_the_masks_it_has_no_rule_or_shape_for():
    layer = _layer()
    state, groups = _state(layer, KeepPositive())
    state.update(groups, layer.trainable_weights)
    rest = state.load({0: np.ones((2, 3), bool), 1: np.ones(3, bool), 0.5: 1})
    assert sorted(rest, key=str) == [0.5, 1]


def test_a_bound_that_is_not_an_integer_is_one_type_error():
    layer = _layer()
    state, groups = _state(layer, KeepPositive(updates=(0, 2.5)))
    state.update(groups, layer.trainable_weights)
    with pytest.raises(
        TypeError, match=r"KeepPositive on layer 'd': last_update_step\(\) must.*2.5"
    ):
        state.in_step_from(0, prepared=True)


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_guarded_update_restores_frozen_entries_and_their_average(dynamic):
    layer = _layer()
    variables = layer.trainable_weights
    spec = maskfit.ElementMask({"kernel": np.array([[1, 0, 1], [0, 1, 1]])})
    (mask,) = declared.resolve_declared([(layer, spec)], variables).values()
    state = mask_state.MaskState(mask, tf.bool)
    state.assign(mask, 0)
    entry = mask_state.VariableMasks(state, None, None, "step")
    expanded = entry.expand(state.current)
    of_step = pipeline.MaskOfStep(
        entry,
        expanded,
        masked="always",
        guarded="always",
        scaled="never",
    )
    optimizer = keras.optimizers.AdamW(0.5, weight_decay=0.5, use_ema=True)
    optimizer.build(variables)
    before = layer.kernel.numpy()
    taken = update.snapshot(layer.kernel, of_step.frozen, dynamic)
    optimizer.apply([tf.ones((2, 3)), tf.ones(3)], variables)
    update.restore(optimizer, [layer.kernel], [taken], [of_step])
    frozen = np.array([[0, 1, 0], [1, 0, 0]], bool)
    np.testing.assert_array_equal(layer.kernel.numpy()[frozen], before[frozen])
    assert np.all(layer.kernel.numpy()[~frozen] != before[~frozen])
    (average,) = traits.ema_averages(optimizer, [layer.kernel])
    np.testing.assert_array_equal(average.numpy()[frozen], before[frozen])


def test_pinned_variables_and_averages_do_not_move():
    layer = _layer()
    optimizer = keras.optimizers.AdamW(0.5, use_ema=True, ema_overwrite_frequency=1)
    optimizer.build(layer.trainable_weights)
    before = [v.numpy() for v in layer.trainable_weights]
    with update.pinned(optimizer, layer.trainable_weights):
        optimizer.apply([tf.ones((2, 3)), tf.ones(3)], layer.trainable_weights)
    for variable, value in zip(layer.trainable_weights, before):
        np.testing.assert_array_equal(variable.numpy(), value)


class SwapWithGradient(step_rules.SwapAt):
    """Drops the smallest kept entry and grows the inactive one with the largest
    gradient, in step `at`: a tiny RigL; records the gradients it saw."""

    def keep_masks(self, step, variables, weights, protected, keeps, gradients=None):
        self.seen = gradients
        return super().keep_masks(step, variables, weights, protected, keeps, gradients)


def test_a_rule_that_reads_gradients_regrows_an_entry_with_fresh_state():
    layer = _layer()
    variables = layer.trainable_weights
    state, groups = _state(layer, SwapWithGradient(at=3))
    state.update(groups, variables)
    state.load({0: np.array([[True, True, True], [True, True, False]])})
    layer.kernel.assign(layer.kernel.numpy() * state.by_index[0].numpy())
    optimizer = keras.optimizers.Adagrad(0.1)
    optimizer.build(variables)
    accumulator = traits.state_of(optimizer, layer.kernel)[0]
    accumulator.assign(tf.fill((2, 3), 5.0))
    gradients = [tf.constant([[0.1, 0.2, 0.3], [0.4, 0.5, 9.0]]), None]
    fresh = {0: traits.fresh_state(optimizer, layer.kernel)}
    rule_update.apply(
        state,
        _view(tf.constant(3, tf.int64), optimizer, variables),
        rule_update.RuleRun(
            only={0}, zeroed_state={}, fresh=fresh, gradients=gradients
        ),
    )
    keep = state.by_index[0].numpy()
    # |w| smallest kept was 1.0 at (0, 0); the largest gradient among inactive is (1, 2).
    np.testing.assert_array_equal(keep, [[False, True, True], [True, True, True]])
    assert layer.kernel.numpy()[0, 0] == 0 and layer.kernel.numpy()[1, 2] == 0
    np.testing.assert_array_equal(
        accumulator.numpy(), np.float32([[5.0, 5.0, 5.0], [5.0, 5.0, 0.1]])
    )
    # Not in another step:
    rule_update.apply(
        state,
        _view(tf.constant(4, tf.int64), optimizer, variables),
        rule_update.RuleRun(only={0}, zeroed_state={}, fresh={}, gradients=gradients),
    )
    np.testing.assert_array_equal(state.by_index[0].numpy(), keep)


def test_a_rule_that_reads_gradients_is_always_traced_into_the_step():
    layer = _layer()
    state, groups = _state(layer, SwapWithGradient(at=3))
    state.update(groups, layer.trainable_weights)
    assert state.in_step_from(3, prepared=True) == {0}
    state.in_step = state.in_step_from(3, prepared=True)
    assert state.in_step_where(True) == {0} and not state.in_step_where(False)


def test_a_rule_without_keep_masks_is_refused_when_declared():
    class Nothing(rules.MaskRule):
        def variables(self, layer):
            return [layer.kernel]

        def should_update(self, step):
            return tf.constant(True)

        def get_config(self):
            return {}

    with pytest.raises(TypeError, match="Nothing says no keep masks"):
        rules.set_rule(_layer(), Nothing())
