"""TF-MOT's pruning callbacks: `UpdatePruningStep` (not needed) and `PruningSummaries`."""

import os

import keras
import numpy as np
import tensorflow as tf

from maskfit import checks, scalars
from maskfit import model as model_lib
from maskfit.pruning import rule as rule_lib
from maskfit.spec import rules as mask_rules

__all__ = ["PruningSummaries", "UpdatePruningStep"]


def _check_masked(model, callback):
    """Raises if `model` carries pruning that its training step would ignore."""
    if isinstance(model, (model_lib.MaskedModel, model_lib.MaskedSequential)):
        return
    pruned = [layer.name for layer, _ in mask_rules.layer_rules(model)]
    if pruned:
        raise ValueError(
            f"{callback}: layers {pruned} of model '{model.name}' carry pruning,"
            f" but the model is a plain {type(model).__name__}, whose training"
            " step does not prune. Build it with maskfit.MaskedModel or"
            " maskfit.MaskedSequential, or pass the model to"
            " maskfit.pruning.prune_low_magnitude."
        )


class UpdatePruningStep(keras.callbacks.Callback):
    """Does nothing: kept so that code written for TF-MOT runs unchanged.

    TF-MOT needs this callback to advance its pruning step and to zero the
    pruned weights at the end of each epoch. maskfit prunes inside the
    training step, counting steps with the optimizer, and pruned weights
    are 0 after every step, so there is nothing for it to do. It checks
    one thing at the start of `fit`: that a model with pruned layers is a
    `MaskedModel` (a plain `keras.Model` would not prune).

    Example:

    >>> import maskfit.pruning as pruning
    >>> callbacks = [pruning.UpdatePruningStep()]
    """

    def on_train_begin(self, logs=None):
        _check_masked(self.model, "UpdatePruningStep")


class PruningSummaries(keras.callbacks.Callback):
    """Writes each pruned variable's sparsity to TensorBoard.

    Like `tfmot.sparsity.keras.PruningSummaries`, it writes under
    `log_dir/metrics`, at the optimizer's step: for each pruned variable,
    `<variable path>/sparsity`, the fraction of its entries pruned; for each
    pruning declaration with a schedule, `<layer name>/schedule_sparsity`,
    what the schedule asks for at that step. Unlike TF-MOT's, it is not a
    `keras.callbacks.TensorBoard` (add one for losses and histograms), and
    it needs no tensorboard package to write.

    Args:
      log_dir: the folder to write events under (a non-empty string).
      update_freq: "epoch" (default) to write at the end of each epoch, or
        an integer n to write every n batches ("batch" means 1).

    Example:

    >>> import tempfile, maskfit.pruning as pruning
    >>> summaries = pruning.PruningSummaries(log_dir=tempfile.mkdtemp())
    """

    def __init__(self, log_dir, update_freq="epoch", **kwargs):
        super().__init__()
        if not isinstance(log_dir, (str, os.PathLike)) or not str(log_dir):
            raise ValueError(
                f"PruningSummaries log_dir must be a non-empty path. Received:"
                f" log_dir={log_dir!r}"
            )
        if update_freq == "batch":
            update_freq = 1
        valid = update_freq == "epoch" or (
            checks.is_integer(update_freq) and update_freq > 0
        )
        if not valid:
            raise ValueError(
                "PruningSummaries update_freq must be 'epoch', 'batch' or a"
                f" positive integer. Received: update_freq={update_freq!r}"
            )
        if kwargs:
            raise TypeError(
                f"PruningSummaries does not take {sorted(kwargs)}: it writes the"
                " pruning scalars only, and is not a keras.callbacks.TensorBoard."
                " Pass those arguments to a keras.callbacks.TensorBoard of its own."
            )
        self.log_dir = os.fspath(log_dir)
        self.update_freq = update_freq
        self._writer = None
        self._batches = 0

    def on_train_begin(self, logs=None):
        _check_masked(self.model, "PruningSummaries")
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(
                os.path.join(self.log_dir, "metrics")
            )

    def on_train_batch_end(self, batch, logs=None):
        if self.update_freq == "epoch":
            return
        self._batches += 1
        if self._batches % self.update_freq == 0:
            self._write()

    def on_epoch_end(self, epoch, logs=None):
        if self.update_freq == "epoch":
            self._write()

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.flush()

    def _write(self):
        model = self.model
        step = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
        values = {}
        variables = model_lib.all_trainable_variables(model)
        keeps = model_lib.keep_masks(model)
        for group in mask_rules.resolve_rules(mask_rules.layer_rules(model), variables):
            for index in group.indices:
                keep = keeps.get(index)
                pruned = 0.0 if keep is None else 1.0 - float(np.mean(keep))
                values[f"{variables[index].path}/sparsity"] = pruned
            rule = group.rule
            if isinstance(rule, rule_lib.MagnitudePruning) and not rule.sparsity_m_by_n:
                _, sparsity = rule.pruning_schedule(tf.constant(step, tf.int64))
                values[f"{group.layer.name}/schedule_sparsity"] = float(sparsity)
        scalars.write_scalars(self._writer, step, values)
