"""`MaskedModel` and `MaskedSequential`: Keras models whose `fit` honours layer masks."""

import os
import tempfile
import warnings

import keras
import numpy as np
import tensorflow as tf

from maskfit import declare
from maskfit import internals
from maskfit import mask_config
from maskfit import mask_rules
from maskfit import masker as masker_lib
from maskfit import optimizer_slots

__all__ = ["MaskedModel", "MaskedSequential", "all_trainable_variables", "keep_masks"]

_MASKER_ATTR = "_maskfit_masker"
_STALE_ATTR = "_maskfit_stale"
_RETRACE_ATTR = "_maskfit_retrace"
# Keep masks loaded before the masker that holds them was planned.
_PENDING_KEEPS_ATTR = "_maskfit_pending_keeps"
# The weights-file entry that lists the variables the optimizer has slots for.
_LAYOUT_KEY = "maskfit_optimizer_variables"
# Weights-file entries `maskfit_keep_<i>`: the keep mask of a rule (pruning)
# on trainable variable i, bit-packed.
_KEEP_PREFIX = "maskfit_keep_"


class _MaskedTraining:
    """The masked training step, shared by `MaskedModel` and `MaskedSequential`.

    It is Keras's own TensorFlow `train_step`, line for line, with one masking
    stage between the gradients and the update. The masks are planned once
    the model's variables exist: before the step is traced for a built model,
    and inside the first trace for a model that Keras builds there (a
    subclassed model called for the first time by `fit`).
    """

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        masker = self._ready_masker()
        if masker is not None and masker.scheduled:
            masker.begin_step(self.optimizer.iterations, self.optimizer)

        # Forward pass
        with tf.GradientTape() as tape:
            if internals.call_has_training_arg(self):
                y_pred = self(x, training=True)
            else:
                y_pred = self(x)
            loss = internals.compute_loss(
                self,
                x=x,
                y=y,
                y_pred=y_pred,
                sample_weight=sample_weight,
                training=True,
            )
            internals.loss_tracker(self).update_state(
                internals.unscale_loss_for_distribution(loss),
                sample_weight=tf.shape(
                    next(i for i in tf.nest.flatten(x) if i is not None)
                )[0],
            )
            if self.optimizer is not None:
                loss = self.optimizer.scale_loss(loss)

        # Compute gradients, mask them, and update the weights
        variables = self._all_trainable_weights()
        if variables:
            if masker is None:
                # Keras built the model in this trace: its variables exist now.
                masker = self._plan_masker(variables)
                if masker.scheduled:
                    masker.begin_step(self.optimizer.iterations, self.optimizer)
                if masker.has_rules:
                    # A rule changes weights before the forward pass: from
                    # the next call on, the step is traced in that order.
                    object.__setattr__(self, _RETRACE_ATTR, True)
            # Fully frozen variables get no gradient and no update at all.
            gradients = masker.spread(tape.gradient(loss, masker.active(variables)))
            fuse = self._fuses_update() and masker.fusing_pays(variables)
            untouched = self._masks_untouched()
            if not (fuse and untouched):
                gradients = self.apply_grad_masks(gradients, variables)
            masker.apply(
                self.optimizer,
                gradients,
                variables,
                masked=untouched,
                static=bool(self.jit_compile) and not self.run_eagerly,
                fuse=fuse,
                mask_first=fuse and untouched,
            )
        else:
            warnings.warn("The model does not have any trainable weights.")

        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def apply_grad_masks(self, gradients, variables):
        """The masking stage: returns the gradients that `optimizer.apply` gets.

        The default zeroes the gradient of every frozen entry (NaN and Inf
        included) and scales those of partially masked ones. Override it to
        transform gradients (add noise, clip per layer) and call
        `super().apply_grad_masks(...)` to keep the masks; whatever a subclass
        does here, entries whose mask is 0 are restored after the update.

        Args:
          gradients: one gradient (or None) per variable, as from the tape;
            None for a variable whose mask is all 0 (it is not updated at
            all, whatever this returns for it).
          variables: every trainable variable (fully frozen ones too), in
            the order of `gradients`.

        Returns:
          The list of gradients to apply, aligned with `variables`.
        """
        masker = self._ready_masker(variables)
        if masker is None:
            masker = self._plan_masker(variables)
        return masker.mask_gradients(gradients)

    def make_train_function(self, force=False):
        """Builds the step; retraces only when the masks' structure changed.

        The step is planned for the optimizer steps ahead (`masker.plan`):
        which variables are left out (mask all 0) and which are masked and
        restored. When a schedule reaches a step the plan does not cover, the
        optimizer is fitted to the new plan and the step traced again, before
        the call that runs that step.
        """
        retrace = getattr(self, _RETRACE_ATTR, False)
        object.__setattr__(self, _RETRACE_ATTR, False)
        if self.built:
            # Traced anew anyway (after compile, or forced): planned afresh.
            fresh = force or retrace or self.train_function is None
            with self.distribute_strategy.scope():
                retrace = self._sync_masker(fresh) or retrace
            object.__setattr__(self, _STALE_ATTR, False)
        super().make_train_function(force=force or retrace)
        keras_function = self.train_function
        wrapped = getattr(keras_function, "_maskfit_wrapped", False)
        masker = getattr(self, _MASKER_ATTR, None)
        if masker is not None:
            masker.expect_call(new_trace=not wrapped)
        if wrapped:
            return keras_function

        def train_function(iterator):
            # Per call, so no walk over the variables: `fit` and
            # `train_on_batch` made the masker match them just before.
            masker = getattr(self, _MASKER_ATTR, None)
            if masker is not None and (
                getattr(self, _STALE_ATTR, False)
                or getattr(self, _RETRACE_ATTR, False)
                or (
                    masker.plan.valid_until is not None
                    and not masker.holds_at(self._optimizer_step())
                )
            ):
                self.make_train_function()
                return self.train_function(iterator)
            if masker is not None and masker.prepare_due:
                # At the first call of each fit (or train_on_batch): after
                # the callbacks that run before it (a backup restored).
                with self.distribute_strategy.scope():
                    ready = masker.prepare(self._optimizer_step(), self.optimizer)
                if not ready:
                    object.__setattr__(self, _RETRACE_ATTR, True)
                    self.make_train_function()
                    return self.train_function(iterator)
            return keras_function(iterator)

        train_function._maskfit_wrapped = True
        self.train_function = train_function
        return train_function

    # Keras reads these to build the optimizer (fit under a strategy, loading,
    # BackupAndRestore) and to copy EMA averages in at the end of fit, so a
    # variable whose mask is all 0 is reported as trainable=False reports it.
    @property
    def trainable_weights(self):
        return self._without_frozen(super().trainable_weights)

    @property
    def trainable_variables(self):
        return self._without_frozen(super().trainable_variables)

    @property
    def non_trainable_weights(self):
        return self._with_frozen(super().non_trainable_weights, super().weights)

    @property
    def non_trainable_variables(self):
        return self._with_frozen(super().non_trainable_variables, super().variables)

    def _all_trainable_weights(self):
        """The trainable weights, fully frozen ones included: what masks cover."""
        return super().trainable_weights

    def _frozen_ids(self):
        masker = getattr(self, _MASKER_ATTR, None)
        if masker is None or masker.plan is None or not masker.plan.frozen:
            return frozenset()
        return frozenset(id(masker.variables[i]) for i in masker.plan.frozen)

    def _without_frozen(self, variables):
        frozen = self._frozen_ids()
        return [v for v in variables if id(v) not in frozen] if frozen else variables

    def _with_frozen(self, non_trainable, every):
        frozen = self._frozen_ids()
        if not frozen or not self.trainable:
            return non_trainable
        kept = frozen | {id(v) for v in non_trainable}
        return [v for v in every if id(v) in kept]

    def _fuses_update(self):
        """Whether the masked update may be compiled with XLA inside the step.

        In a graph-mode step without a distribution strategy; the masker
        then fuses it when its masked variables are large enough to pay
        (`GradientMasker.fusing_pays`).
        """
        return (
            not self.run_eagerly
            and not self.jit_compile
            and not tf.distribute.has_strategy()
        )

    def _masks_untouched(self):
        """Whether the gradients reaching `apply` are exactly the masked ones."""
        return type(self).apply_grad_masks is _MaskedTraining.apply_grad_masks

    def _ready_masker(self, variables=None):
        """The masker planned for `variables` (the trainable ones), or None."""
        masker = getattr(self, _MASKER_ATTR, None)
        if masker is None:
            return None
        variables = self._all_trainable_weights() if variables is None else variables
        return masker if masker.plans(variables) else None

    def _plan_masker(self, variables, prepares=False):
        """Plans the masks for `variables`; safe inside a traced step.

        `prepares`: whether `masker.prepare` will run before the step's
        first call (not for a masker planned inside the step's first trace).
        """
        with tf.init_scope():
            masker = masker_lib.GradientMasker(
                variables,
                lambda: declare.masked_layers(self),
                step=self._optimizer_step,
                span=self.steps_per_execution,
                layer_rules=lambda: mask_rules.layer_rules(self),
                prepares=prepares,
            )
        object.__setattr__(self, _MASKER_ATTR, masker)
        self._load_pending_keeps(masker)
        return masker

    def _load_pending_keeps(self, masker):
        pending = getattr(self, _PENDING_KEEPS_ATTR, None)
        if pending:
            with tf.init_scope():
                rest = masker.load_keeps(pending)
            object.__setattr__(self, _PENDING_KEEPS_ATTR, rest)

    def _sync_masker(self, fresh=False):
        """Makes the masker and optimizer match the masks and the step; True to retrace.

        `fresh`: the step will be traced anew whatever this returns.
        """
        variables = self._all_trainable_weights()
        masker = self._ready_masker(variables)
        step = self._optimizer_step()
        if masker is None:
            masker = self._plan_masker(variables, prepares=True)
            changed = True
        else:
            changed = masker.update()
            changed = (
                masker.replan(
                    step,
                    span=self.steps_per_execution,
                    prepares=True,
                    fresh=fresh or changed,
                )
                or changed
            )
            self._load_pending_keeps(masker)
        return self._fit_optimizer(masker, step) or changed

    def _fit_optimizer(self, masker, step):
        """Builds the optimizer for the planned variables; True if its variables changed.

        A variable that learns again after its mask was all 0 starts with fresh
        optimizer state, as with a new optimizer.
        """
        optimizer = getattr(self, "optimizer", None)
        if optimizer is None:
            return False
        variables = self._all_trainable_weights()
        active = masker.active(variables)
        if not optimizer.built:
            optimizer.build(active)
            return True
        masked = set(masker.masked_indices)
        learning = set(masker.learning_at(step - 1)) if step > 0 else set()
        fresh = [
            v for i, v in enumerate(variables) if i in masked and i not in learning
        ]
        return optimizer_slots.rebuild(optimizer, active, fresh=fresh)

    def _optimizer_step(self):
        optimizer = getattr(self, "optimizer", None)
        if optimizer is None or not optimizer.built:
            return 0
        return int(keras.ops.convert_to_numpy(optimizer.iterations))

    def save_own_variables(self, store):
        super().save_own_variables(store)
        # The keep masks of rules (pruning) are state that the weights do not
        # tell (ties, kept weights that are exactly 0): save them bit-packed.
        for index, keep in _keep_values(self).items():
            store[f"{_KEEP_PREFIX}{index}"] = np.packbits(keep.ravel())
        # Masks decide which variables the optimizer has slots for (none for a
        # variable whose mask is all 0), and a program that loads this may
        # plan another step first: record them, so that loading builds the
        # optimizer the same way before its variables are read.
        optimizer = getattr(self, "optimizer", None)
        masker = getattr(self, _MASKER_ATTR, None)
        if optimizer is None or not optimizer.built or masker is None:
            return
        if not masker.masked_indices:
            return
        position = {id(v): i for i, v in enumerate(self._all_trainable_weights())}
        built = [position.get(id(v)) for v in optimizer_slots.built_variables(optimizer)]
        if None not in built:
            store[_LAYOUT_KEY] = np.asarray(built, np.int64)

    def load_own_variables(self, store):
        keys = list(store.keys())
        keep_keys = [key for key in keys if key.startswith(_KEEP_PREFIX)]
        if keep_keys:
            self._load_keeps({key: store[key] for key in keep_keys})
            keys = [key for key in keys if key not in keep_keys]
            store = {key: store[key] for key in keys}
        if _LAYOUT_KEY in keys:
            layout = [int(i) for i in np.asarray(store[_LAYOUT_KEY])]
            store = {key: store[key] for key in keys if key != _LAYOUT_KEY}
            optimizer = getattr(self, "optimizer", None)
            if optimizer is not None:
                variables = self._all_trainable_weights()
                with self.distribute_strategy.scope():
                    optimizer_slots.rebuild(optimizer, [variables[i] for i in layout])
                # The next call plans the step for the loaded optimizer step.
                object.__setattr__(self, _STALE_ATTR, True)
        super().load_own_variables(store)

    def _load_keeps(self, entries):
        """Unpacks saved keep masks; the masker gets them now or when planned."""
        variables = self._all_trainable_weights()
        values = {}
        for key, packed in entries.items():
            index = int(key[len(_KEEP_PREFIX):])
            if index >= len(variables):
                raise ValueError(
                    f"The weights being loaded hold a pruning keep mask for"
                    f" trainable variable {index}, but model '{self.name}' has"
                    f" {len(variables)} trainable variables. Load weights saved"
                    " from a model of the same structure."
                )
            shape = tuple(variables[index].shape)
            bits = np.unpackbits(np.asarray(packed, np.uint8), count=int(np.prod(shape)))
            values[index] = bits.astype(bool).reshape(shape)
        pending = dict(getattr(self, _PENDING_KEEPS_ATTR, None) or {})
        pending.update(values)
        object.__setattr__(self, _PENDING_KEEPS_ATTR, pending)
        masker = self._ready_masker(variables)
        if masker is not None:
            self._load_pending_keeps(masker)

    def get_config(self):
        config = super().get_config()
        grad_masks = mask_config.masks_to_config(self)
        if grad_masks:
            config["grad_masks"] = grad_masks
        rules = mask_rules.rules_to_config(self, mask_config.layer_paths(self))
        if rules:
            config["mask_rules"] = rules
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        grad_masks = config.pop("grad_masks", None)
        rules = config.pop("mask_rules", None)
        model = super().from_config(config, custom_objects=custom_objects)
        if grad_masks:
            mask_config.masks_from_config(model, grad_masks)
        if rules:
            mask_rules.rules_from_config(model, rules, mask_config.layer_paths(model))
        return model

    def __reduce__(self):
        # Pickle and deepcopy go through a saved `.keras` file, as Keras's own
        # `__reduce__` does, but with a function pickle can find by name (the
        # functional variant classes below are made at run time).
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "model.keras")
            self.save(path)
            with open(path, "rb") as f:
                return (_unpickle, (f.read(),))


def all_trainable_variables(model):
    """A model's trainable variables, those whose mask is all 0 included.

    A `MaskedModel` reports a variable whose mask is all 0 as not trainable,
    as `trainable=False` would (its optimizer has no slots for it); masks
    and `maskfit.summary` still cover it.
    """
    if isinstance(model, _MaskedTraining):
        return model._all_trainable_weights()
    return list(model.trainable_variables)


def keep_masks(model):
    """Returns `{position: bool array}`: the keep masks of the rules (pruning) on `model`.

    Positions are in `all_trainable_variables(model)`. A variable that a rule
    covers but that has not been trained yet has none (nothing is dropped);
    one whose masks were loaded but not planned yet has the loaded ones.
    """
    if not isinstance(model, _MaskedTraining):
        return {}
    return _keep_values(model)


def _keep_values(model):
    masker = getattr(model, _MASKER_ATTR, None)
    values = dict(getattr(model, _PENDING_KEEPS_ATTR, None) or {})
    if masker is not None:
        values.update(
            {i: np.asarray(k.numpy()) for i, k in masker.keep_masks().items()}
        )
    return values


def _unpickle(data):
    """Rebuilds a model pickled by `_MaskedTraining.__reduce__`."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.keras")
        with open(path, "wb") as f:
            f.write(data)
        return keras.saving.load_model(path, safe_mode=False)


@keras.saving.register_keras_serializable(package="maskfit")
class MaskedModel(_MaskedTraining, keras.Model):
    """A `keras.Model` whose training step applies the masks set on its layers.

    Use it like `keras.Model`: as `MaskedModel(inputs, outputs)`, or as a base
    class (built in `build()`, or lazily by the first `fit`). Declare masks on
    layers with `maskfit.set_mask`; `compile()`, `fit()`, `train_on_batch()`,
    `evaluate()` and `predict()` then work as usual, and every entry whose
    mask is 0 stays bit-identical through training under any Keras optimizer
    and setting (weight decay, momentum, EMA, clipping, gradient
    accumulation, loss scaling). A model without masks trains exactly like
    `keras.Model`: the step is Keras's own, with the same hooks
    (`compute_loss` with or without `training`, `compute_metrics`, the loss
    metric, the warning for a model without trainable weights).

    The masks are traced once, as state: changing a mask's values with
    `set_mask` between two `fit` calls needs no `compile()` and no retrace.
    `apply_grad_masks` is the override point for subclasses that transform
    gradients. Saving, `load_model`, legacy `.h5`, `pickle` and
    `copy.deepcopy` keep the masks.

    Example:

    >>> import keras, maskfit, numpy as np
    >>> inputs = keras.Input((1,))
    >>> hidden = keras.layers.Dense(16, activation="relu")(inputs)
    >>> head = maskfit.set_mask(keras.layers.Dense(2), maskfit.OutputMask([1, 0]))
    >>> model = maskfit.MaskedModel(inputs, head(hidden))
    >>> model.compile(optimizer="adamw", loss="mse")
    >>> before = head.kernel.numpy()[:, 1].copy()
    >>> _ = model.fit(np.ones((8, 1)), np.ones((8, 2)), epochs=2, verbose=0)
    >>> bool((head.kernel.numpy()[:, 1] == before).all())
    True
    """

    def __new__(cls, *args, **kwargs):
        if _functional_arguments(args, kwargs):
            cls = _functional_variant(cls)
        return super().__new__(cls, *args, **kwargs)

    def __init__(self, *args, **kwargs):
        if _functional_arguments(args, kwargs):
            # keras.Model.__init__ would put Functional into the bases of this
            # class and of every class above it up to keras.Model, for the
            # rest of the process: MaskedModel itself would become functional.
            # The instance takes a functional variant of its class instead
            # (a subclass whose __init__ passes inputs and outputs up reaches
            # here as a plain instance).
            functional = internals.functional_class()
            if not isinstance(self, functional):
                object.__setattr__(self, "__class__", _functional_variant(type(self)))
            functional.__init__(self, *args, **kwargs)
        else:
            super().__init__(*args, **kwargs)


@keras.saving.register_keras_serializable(package="maskfit")
class MaskedSequential(_MaskedTraining, keras.Sequential):
    """A `keras.Sequential` whose training step applies the masks set on its layers.

    Everything `MaskedModel` promises holds for it; use it wherever you would
    use `keras.Sequential`.

    Example:

    >>> import keras, maskfit, numpy as np
    >>> head = maskfit.set_mask(keras.layers.Dense(2), maskfit.OutputMask([0, 1]))
    >>> model = maskfit.MaskedSequential([keras.Input((3,)), head])
    >>> model.compile(optimizer="adam", loss="mse")
    >>> before = head.kernel.numpy()[:, 0].copy()
    >>> _ = model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0)
    >>> bool((head.kernel.numpy()[:, 0] == before).all())
    True
    """


def _functional_arguments(args, kwargs):
    """Whether a model constructor call is the functional `(inputs, outputs)` form."""
    return (
        len(args) == 2
        or (len(args) == 1 and "outputs" in kwargs)
        or ("inputs" in kwargs and "outputs" in kwargs)
    )


_functional_variants = {}


def _functional_variant(cls):
    """Returns `cls` with Functional mixed in, made once per class.

    The variant serializes under `cls`'s registered name, and that name still
    deserializes to `cls`, whose constructor makes the variant again: no
    class is ever changed, and saved models need no `custom_objects`.
    """
    functional = internals.functional_class()
    if issubclass(cls, functional):
        return cls
    if cls not in _functional_variants:
        variant = type(
            cls.__name__,
            (cls, functional),
            {"__module__": cls.__module__, "__qualname__": cls.__qualname__},
        )
        package, _, name = keras.saving.get_registered_name(cls).rpartition(">")
        if package:
            keras.saving.register_keras_serializable(package, name)(variant)
            keras.saving.register_keras_serializable(package, name)(cls)
        _functional_variants[cls] = variant
    return _functional_variants[cls]


# Legacy `.h5` files name a model's class without its package ("MaskedModel"),
# so `keras.saving.load_model` finds it among the global custom objects.
for _cls in (MaskedModel, MaskedSequential):
    keras.saving.get_custom_objects().setdefault(_cls.__name__, _cls)
