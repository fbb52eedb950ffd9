"""Under XLA, a step with rules compiled twice: with the rules' updates, and without.

A rule that updates every `delta_t` steps is a conditional in the step. XLA
passes whatever a conditional's branches read or write through it as
operands and results, in every step, so the optimizer's update can no longer
write the variables in place in one fused pass: with the rule's update in the
step, a RigL step compiled with XLA cost clearly more than a static-mask step,
whether it updated or not (docs/sparse_training.md, "Step time", has the
measurements).

So when `applies`, the lifecycle has Keras trace its train function without
XLA, and `MaskedTraining.train_step` there only dispatches (`SplitStep`): it
compiles the real step twice with `jit_compile=True`, `updating` (the rules
run as they always do) and `plain` (no rule's update is traced: the keep
masks stay as they are, everything else is the same step), and a `tf.cond`
outside XLA on "does a rule of the step update at the optimizer's step"
picks one per step. A `plain` step computes what `updating` computes when
no rule updates (there the rules' drops and regrowths select nothing), in
its own compilation: the entries the masks hold are exact in both.
The update steps pay the conditional; the others cost what a static mask
costs. `plain` is compiled at the first step, `updating` at the first update.
"""

import contextlib

import tensorflow as tf

__all__ = ["SplitStep", "applies", "traced_without_xla"]


def applies(model, masker, own_train_step):
    """Whether `model`'s next trace should be a `SplitStep`.

    Args:
      model: the masked model, compiled.
      masker: its `GradientMasker` (None before the model is built: the
        first trace then plans it, and the step is traced again).
      own_train_step: whether the model's `train_step` is maskfit's own (a
        subclass's override would run its own code once outside and once
        inside the step).

    Only with `jit_compile=True`, not eagerly, and without a distribution
    strategy (Keras compiles `strategy.run` itself into the XLA step, and a
    rule's update then synchronises the replicas inside it).
    """
    return bool(
        own_train_step
        and masker is not None
        and masker.has_rules
        and not model.run_eagerly
        and model.jit_compile
        and not tf.distribute.has_strategy()
        and model.distribute_strategy is tf.distribute.get_strategy()
    )


@contextlib.contextmanager
def traced_without_xla(model):
    """Keras makes its train function (around a `SplitStep`) without XLA in here.

    Keras reads `jit_compile` when it makes the function; the two compiled
    steps inside are `jit_compile=True` themselves.
    """
    model.jit_compile = False
    try:
        yield
    finally:
        model.jit_compile = True


class SplitStep:
    """The step as two XLA-compiled variants and a per-step choice (see the module).

    Args:
      step_function: the model's step, a function of one batch (its
        `train_step`, which runs the real step when traced for XLA).
      masker: a function returning the step's `GradientMasker`, read when
        the step is traced.
      iterations: a function returning the optimizer's `iterations`.
    """

    def __init__(self, step_function, masker, iterations):
        self._masker = masker
        self._iterations = iterations

        def plain(data):
            with masker().rule_updates_left_out():
                return step_function(data)

        compile_ = lambda f: tf.function(  # noqa: E731
            f, jit_compile=True, reduce_retracing=True, autograph=False
        )
        self._updating = compile_(step_function)
        self._plain = compile_(plain)

    def __call__(self, data):
        """The step on one batch: `updating` where a rule updates, else `plain`."""
        due = self._masker().rules_due(self._iterations())
        if due is None:  # No rule left in the step.
            return self._plain(data)
        return tf.cond(due, lambda: self._updating(data), lambda: self._plain(data))
