"""`StepLifecycle`: when a masked model's training step is planned, traced and prepared.

One object per `MaskedModel` holds its `GradientMasker` and where the step
stands, as one named phase:

- `UNPLANNED`: no masker for the model's variables yet (not built; Keras
  builds it inside the first traced step, which plans it there);
- `STALE`: planned, but loaded weights changed what the optimizer holds:
  synchronize before the next call;
- `TRACE`: the step must be traced again before the next call (a rule
  joined inside the first trace; a rule left out of the step may update
  again because the optimizer went back);
- `SETTLE`: traced anew: before its first call, set every dropped entry's
  weight and optimizer state to 0, and apply the rules due then;
- `PREPARE`: apply the rules left out of the step that are due now;
- `READY`: call the traced step.

`make` runs with every `fit` / `train_on_batch` (Keras's
`make_train_function`): it reads the declarations and the optimizer step,
fits the optimizer to the plan and says whether Keras must trace anew. The
model's `train_function` is one stable wrapper; before each call it brings the
phase to `READY` (`before_call`), re-tracing the function it wraps when a
schedule reaches a step the plan does not cover. Callbacks that wrap
`model.train_function` themselves keep working.
"""

import keras
import tensorflow as tf

from maskfit import paths
from maskfit.optim import rebuild
from maskfit.spec import declare, rules
from maskfit.step import masker as masker_lib
from maskfit.step import split as split_lib

__all__ = ["StepLifecycle"]

UNPLANNED, STALE, TRACE, SETTLE, PREPARE, READY = (
    "unplanned",
    "stale",
    "trace",
    "settle",
    "prepare",
    "ready",
)


def optimizer_step(model):
    """The model's optimizer's `iterations` on the host (0 before it is built)."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or not optimizer.built:
        return 0
    return int(keras.ops.convert_to_numpy(optimizer.iterations))


class StepLifecycle:
    """Where a masked model's training step stands, and its `GradientMasker`.

    Args:
      model: the `MaskedModel` (or `MaskedSequential`).
      keras_make_train_function: Keras's own `make_train_function` of the
        model (`force=True` sets `model.train_function` anew), which this wraps.
      own_train_step: whether the model's `train_step` is maskfit's own
        (not a subclass's override): only then may the step be split.
    """

    def __init__(self, model, keras_make_train_function, own_train_step=True):
        self._model = model
        self._keras_make = keras_make_train_function
        self._own_train_step = own_train_step
        # A `maskfit.step.split.SplitStep` when the traced step is split (XLA
        # with rules): `train_step` outside XLA only calls it.
        self.split = None
        self.masker = None
        self.phase = UNPLANNED
        self.pending_keeps = {}  # {variable key: bool array}, loaded before planning
        self._inner = None  # the traced function Keras made
        self._wrapper = None

    # ------------------------------------------------------- Keras's hooks

    def make(self, force=False):
        """Keras's `make_train_function`: plans the step, traces it if needed.

        Returns the model's train function (one stable wrapper).
        """
        model = self._model
        retrace = (
            force
            or self.phase == TRACE
            or self._inner is None
            or model.train_function is None  # `compile()` drops it
        )
        if model.built:
            retrace = self._sync(fresh=retrace) or retrace
        if retrace:
            self._trace()
        self._expect_call(new_trace=retrace)
        return model.train_function

    def _trace(self):
        """Has Keras trace the step anew, behind the stable wrapper.

        Whatever wraps the wrapper (a callback that replaced
        `model.train_function`) stays in place.
        """
        model = self._model
        outer = model.train_function
        self.split = None
        if split_lib.applies(model, self.masker, self._own_train_step):
            self.split = split_lib.SplitStep(
                model.train_step,
                lambda: self.masker,
                lambda: model.optimizer.iterations,
            )
            with split_lib.traced_without_xla(model):
                self._keras_make(force=True)
        else:
            self._keras_make(force=True)
        self._inner = model.train_function
        if self._wrapper is None:
            lifecycle = self

            def train_function(iterator):
                lifecycle.before_call()
                return lifecycle._inner(iterator)

            self._wrapper = train_function
        model.train_function = self._wrapper if outer is None else outer

    def _expect_call(self, new_trace):
        """Sets what runs before the next call: settle (a new trace), prepare, or nothing."""
        masker = self.masker
        if masker is None:
            self.phase = UNPLANNED
        elif not masker.has_rules:
            self.phase = READY
        elif new_trace or self.phase == SETTLE:
            self.phase = SETTLE
        else:
            self.phase = PREPARE if masker.rules_left_out else READY

    def before_call(self):
        """Before a call of the traced step: brings the phase to `READY`.

        Plans again when stale or when the plan ends within the call, traces
        anew when it must, and runs `prepare` outside the step (after the
        callbacks that run before the call, e.g. a restored backup). Reads
        the optimizer step on the host only when one of those may apply.
        """
        if self.masker is None:
            return  # Keras builds the model in the first trace, which plans it.
        model = self._model
        for _ in range(8):
            masker = self.masker
            if self.phase in (STALE, TRACE) or not (
                masker.plan.valid_until is None
                or masker.holds_at(optimizer_step(model), self._span())
            ):
                self.make()
                continue
            if self.phase not in (SETTLE, PREPARE):
                return
            with model.distribute_strategy.scope():
                ready = masker.prepare(
                    optimizer_step(model),
                    model.optimizer,
                    settle=self.phase == SETTLE,
                    xla=bool(model.jit_compile) and not model.run_eagerly,
                )
            if ready:
                self.phase = READY
                return
            self.phase = TRACE  # A rule left out of the step may update again.
        raise RuntimeError(
            f"maskfit could not bring the training step of model '{model.name}' to a"
            f" state it can call (stuck in phase '{self.phase}'). Please report this"
            " with the model and masks that caused it."
        )

    # ----------------------------------------------------------- planning

    def masker_for(self, variables):
        """The masker planned for `variables` (the trainable ones), or None."""
        masker = self.masker
        return masker if masker is not None and masker.covers(variables) else None

    def plan_in_trace(self, variables):
        """Plans the masks inside the step's first trace (Keras just built the model).

        Rules are traced into this step whatever their bounds (no `prepare`
        runs before its first call); a step with rules is traced again, in
        the usual order, before the next call.
        """
        with tf.init_scope():
            masker = self._new_masker(variables)
            masker.sync(
                optimizer_step(self._model), self._span(), fresh=True, prepared=False
            )
            self.load_pending_keeps()
        self.phase = TRACE if masker.has_rules else READY
        return masker

    def mark_stale(self):
        """Loaded weights changed the optimizer or keep masks: re-plan before the next call."""
        if self.masker is not None:
            self.phase = STALE

    def _new_masker(self, variables):
        model = self._model
        self.masker = masker_lib.GradientMasker(
            variables,
            lambda: declare.masked_layers(model),
            layer_rules=lambda: rules.layer_rules(model),
        )
        return self.masker

    def _span(self):
        return self._model.steps_per_execution

    def _sync(self, fresh):
        """Makes the masker and optimizer match the declarations; True to retrace."""
        model = self._model
        variables = model._all_trainable_weights()
        step = optimizer_step(model)
        with model.distribute_strategy.scope():
            masker = self.masker_for(variables)
            if masker is None:
                masker = self._new_masker(variables)
                fresh = True
            changed = masker.sync(step, self._span(), fresh=fresh, prepared=True)
            self.load_pending_keeps()
            changed = self._fit_optimizer(step) or changed
            optimizer = getattr(model, "optimizer", None)
            if optimizer is not None and masker.has_rules:
                masker.read_fresh_state(optimizer)
            return changed

    def load_pending_keeps(self):
        """Gives the masker the keep masks loaded before it was planned."""
        if not self.pending_keeps or self.masker is None:
            return
        keys = paths.variable_keys(self._model, self.masker.variables)
        position = {key: i for i, key in enumerate(keys)}
        pending = self.pending_keeps
        loaded = {position[k]: v for k, v in pending.items() if k in position}
        rest = self.masker.load_keeps(loaded)
        self.pending_keeps = {
            k: v for k, v in pending.items() if k not in position or position[k] in rest
        }

    def _fit_optimizer(self, step):
        """Builds the optimizer for the planned variables; True if its variables changed.

        A variable that learns again after its mask was all 0 starts with
        fresh optimizer state, as with a new optimizer (`optim.rebuild`).
        """
        optimizer = getattr(self._model, "optimizer", None)
        if optimizer is None:
            return False
        masker = self.masker
        variables = masker.variables
        active = masker.active(variables)
        if not optimizer.built:
            optimizer.build(active)
            return True
        masked = set(masker.masked_indices)
        learning = set(masker.learning_at(step - 1)) if step > 0 else set()
        fresh = [
            v for i, v in enumerate(variables) if i in masked and i not in learning
        ]
        return rebuild.rebuild(optimizer, active, fresh=fresh)
