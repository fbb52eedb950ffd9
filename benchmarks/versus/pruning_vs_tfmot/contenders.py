"""The two pruning contenders, trained an epoch at a time: TF-MOT and maskfit.

Each is a class `(config, scenario, seed, data)` with `epoch(index, batches)`
(one epoch of `fit`) and `finish() -> record`, so that the runner can
alternate their epochs and time them under the same load. TF-MOT runs
`prune_low_magnitude` on a tf_keras Sequential model with its
`UpdatePruningStep` callback; maskfit runs its `prune_low_magnitude` on a
Keras 3 Sequential model, with no callback. Both read the masks with a
callback after each pruning step, off the clock. `keras` and `tf_keras` are
references, not contenders: the same model trained without pruning on each
Keras, to tell what Keras 3's step costs next to tf_keras's, and what each
library's pruning adds to its own Keras's step.

Importing TF-MOT sets TF_USE_LEGACY_KERAS=1, which only changes what
`tf.keras` is; maskfit imports Keras 3 as `keras`, so both live side by side.
"""

from benchmarks.pruning_vs_tfmot import task
from maskfit import pruning

__all__ = ["CONTENDERS", "KerasRun", "MaskfitRun", "TfKerasRun", "TfmotRun"]


class _Run:
    """What both contenders share: the fit of one epoch, and the record."""

    prune = True

    def __init__(self, config, scenario, seed, data):
        self.config, self.scenario, self.data = config, scenario, data
        self.spe = task.steps_per_epoch(config, data)
        self.points = task.pruning_points(
            self.make_schedule(), scenario, self.spe * config.epochs
        )

    def epoch(self, index, batches):
        self.model.fit(
            batches,
            epochs=index + 1,
            initial_epoch=index,
            steps_per_epoch=self.spe,
            shuffle=False,
            verbose=0,
            callbacks=self.callbacks,
        )

    def finish(self):
        # Logits from one call, not predict(): a predict function per run
        # makes TensorFlow warn about retracing.
        kernels, logits = self.stripped_kernels_and_logits()
        result = task.record(
            self.config,
            self.scenario,
            self.data,
            self.points,
            self.recorder,
            kernels,
            logits,
        )
        result["pruning"] = self.prune
        return result


class TfmotRun(_Run):
    """TF-MOT's `prune_low_magnitude` on a tf_keras Sequential model."""

    def __init__(self, config, scenario, seed, data):
        import tensorflow_model_optimization as tfmot
        from tensorflow_model_optimization.python.core.keras.compat import (
            keras as tf_keras,
        )

        self.api = tfmot.sparsity.keras
        super().__init__(config, scenario, seed, data)
        model, layers = task.build_mlp(tf_keras, config, data, seed)
        if self.prune:
            self.model = self.api.prune_low_magnitude(
                model,
                pruning_schedule=self.make_schedule(),
                sparsity_m_by_n=scenario["sparsity_m_by_n"],
            )
            # The pruning wrappers (TF-MOT does not export their class): one
            # kernel each.
            wrappers = [l for l in self.model.layers if hasattr(l, "pruning_vars")]
            masks = [w.pruning_vars[0][1] for w in wrappers]
            kernels = [w.pruning_vars[0][0] for w in wrappers]
        else:
            self.model = model
            kernels = masks = [layer.kernel for layer in layers]
        self.model.compile(**task.compile_arguments(tf_keras, config))
        prune = self.prune

        class Recorder(task.Recorder, tf_keras.callbacks.Callback):
            def __init__(self, points):
                super().__init__(
                    points,
                    lambda: [m.numpy() if prune else m.numpy() != 0 for m in masks],
                    kernels,
                )
                # Logs stay tensors: no host sync per batch (a tf_keras attribute).
                self._supports_tf_logs = True

        self.recorder = Recorder(self.points)
        # UpdatePruningStep must come first: it zeroes the pruned weights at
        # the end of each epoch, before the recorder stops the clock.
        self.callbacks = [self.api.UpdatePruningStep()] if prune else []
        self.callbacks.append(self.recorder)

    def make_schedule(self):
        schedule = getattr(self.api, self.scenario["schedule"])
        return schedule(**self.scenario["arguments"])

    def stripped_kernels_and_logits(self):
        stripped = self.api.strip_pruning(self.model) if self.prune else self.model
        kernels = [l.kernel.numpy() for l in stripped.layers]
        return kernels, stripped(self.data.x_test, training=False).numpy()


class TfKerasRun(TfmotRun):
    """A reference: the same tf_keras model and training, without pruning."""

    prune = False


class MaskfitRun(_Run):
    """maskfit's `prune_low_magnitude` on a Keras 3 Sequential model."""

    prune = True

    def __init__(self, config, scenario, seed, data):
        import keras

        from maskfit import model as model_lib

        super().__init__(config, scenario, seed, data)
        model, layers = task.build_mlp(keras, config, data, seed)
        self.model = model
        if self.prune:
            self.model = pruning.prune_low_magnitude(
                model,
                pruning_schedule=self.make_schedule(),
                sparsity_m_by_n=scenario["sparsity_m_by_n"],
            )
        self.model.compile(**task.compile_arguments(keras, config))
        variables = model_lib.all_trainable_variables(self.model)
        positions = [
            next(i for i, v in enumerate(variables) if v is layer.kernel)
            for layer in layers
        ]

        def read_masks():
            if not self.prune:
                return [layer.kernel.numpy() != 0 for layer in layers]
            keeps = model_lib.keep_masks(self.model)
            return [keeps[i] for i in positions]

        class Recorder(task.Recorder, keras.callbacks.Callback):
            pass

        self.recorder = Recorder(self.points, read_masks, [l.kernel for l in layers])
        self.callbacks = [self.recorder]

    def make_schedule(self):
        schedule = getattr(pruning, self.scenario["schedule"])
        return schedule(**self.scenario["arguments"])

    def stripped_kernels_and_logits(self):
        import keras

        stripped = pruning.strip_pruning(self.model) if self.prune else self.model
        kernels = [l.kernel.numpy() for l in stripped.layers]
        return kernels, keras.ops.convert_to_numpy(stripped(self.data.x_test))


class KerasRun(MaskfitRun):
    """The reference: the same Keras 3 model and training, without pruning."""

    prune = False


CONTENDERS = {
    "tfmot": TfmotRun,
    "maskfit": MaskfitRun,
    "keras": KerasRun,
    "tf_keras": TfKerasRun,
}
