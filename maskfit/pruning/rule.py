"""`MagnitudePruning`: the mask rule that `prune_low_magnitude` declares on a layer."""

import keras
import tensorflow as tf

from maskfit.pruning import magnitude, registry, schedules
from maskfit.spec import rules as mask_rules

__all__ = ["MagnitudePruning"]


@keras.saving.register_keras_serializable(package="maskfit")
class MagnitudePruning(mask_rules.MaskRule):
    """Prunes a layer's prunable weights by magnitude, on a TF-MOT schedule.

    Which weights: `prunable_weights(layer)` (TF-MOT's registry; a model or a
    block of layers covers its sublayers'). When: in training step `n` (the
    n-th batch, 1-based, as TF-MOT counts: the optimizer's `iterations` + 1)
    where `pruning_schedule(n)` says so; with `sparsity_m_by_n`, once, in
    step 1, as TF-MOT (just before the first call, outside the compiled
    step: `last_update_step` is 0). What: `magnitude_mask` of the weights at the
    schedule's sparsity, except that entries frozen by `maskfit.set_mask`
    score +inf (they are kept, and count as kept). Pruned weights are 0 and
    score 0, so they stay pruned unless the sparsity falls.

    Args:
      pruning_schedule: a `PruningSchedule`.
      block_size, block_pooling_type, sparsity_m_by_n: as for
        `magnitude_mask`.

    Example:

    >>> import maskfit.pruning as pruning
    >>> rule = pruning.MagnitudePruning(pruning.ConstantSparsity(0.5, 0))
    >>> rule.get_config()["block_size"]
    [1, 1]
    """

    backend_feature = "magnitude_pruning"

    def __init__(
        self,
        pruning_schedule,
        block_size=(1, 1),
        block_pooling_type="AVG",
        sparsity_m_by_n=None,
    ):
        if not isinstance(pruning_schedule, schedules.PruningSchedule):
            raise TypeError(
                "pruning_schedule must be a maskfit.pruning.PruningSchedule, e.g."
                " maskfit.pruning.PolynomialDecay(0.0, 0.9, 0, 1000) (a TF-MOT"
                " schedule migrates by importing it from maskfit.pruning)."
                f" Received: {pruning_schedule!r} of type"
                f" {type(pruning_schedule).__name__}"
            )
        where = "prune_low_magnitude"
        self.block_size = magnitude._check_block_size(block_size, where)
        self.sparsity_m_by_n = magnitude._check_m_by_n(sparsity_m_by_n, where)
        if block_pooling_type not in ("AVG", "MAX"):
            raise ValueError(
                f"{where}: block_pooling_type must be 'AVG' or 'MAX'. Received:"
                f" {block_pooling_type!r}"
            )
        if self.sparsity_m_by_n is not None and self.block_size != (1, 1):
            raise ValueError(
                f"{where}: block_size and sparsity_m_by_n exclude each other (TF-MOT"
                f" silently ignores block_size then). Received:"
                f" block_size={self.block_size},"
                f" sparsity_m_by_n={self.sparsity_m_by_n}. Pass one of them."
            )
        self.pruning_schedule = pruning_schedule
        self.block_pooling_type = block_pooling_type

    def variables(self, layer):
        """The prunable weights of `layer` (see `prunable_weights`), checked for shape."""
        found = registry.prunable_weights(layer)
        for variable in found:
            rank = len(variable.shape)
            if self.block_size != (1, 1) and rank != 2:
                raise ValueError(
                    f"prune_low_magnitude with block_size={self.block_size} on"
                    f" layer '{layer.name}': variable '{variable.path}' has rank"
                    f" {rank}, but block sparsity needs 2-dimensional weights (as"
                    " in TF-MOT). Prune this layer with block_size=(1, 1)."
                )
            if self.sparsity_m_by_n is not None and rank < 2:
                raise ValueError(
                    f"prune_low_magnitude with sparsity_m_by_n={self.sparsity_m_by_n}"
                    f" on layer '{layer.name}': variable '{variable.path}' has rank"
                    f" {rank}; N:M groups run along axis -2, so it needs rank >= 2."
                )
        return found

    def pruning_step(self, step):
        """TF-MOT's step for optimizer step `step`: the batch number, 1-based."""
        return tf.cast(step, tf.int64) + 1

    def should_update(self, step):
        step = self.pruning_step(step)
        if self.sparsity_m_by_n is not None:
            # TF-MOT computes N:M masks once, in step 1.
            return tf.equal(step, 1)
        return tf.cast(self.pruning_schedule(step)[0], tf.bool)

    def last_update_step(self):
        if self.sparsity_m_by_n is not None:
            return 0
        last = mask_rules.checked_last_step(
            self.pruning_schedule.last_pruning_step(),
            f"{type(self.pruning_schedule).__name__}.last_pruning_step()",
        )
        # TF-MOT's step n is optimizer step n - 1.
        return None if last is None else last - 1

    def keep_mask(self, step, weights, protected):
        scores = tf.math.abs(weights)
        if protected is not None:
            scores = tf.where(
                protected, tf.constant(float("inf"), scores.dtype), scores
            )
        if self.sparsity_m_by_n is not None:
            sparsity = 0.0
        else:
            sparsity = self.pruning_schedule(self.pruning_step(step))[1]
        return magnitude.magnitude_mask(
            scores,
            sparsity,
            self.block_size,
            self.sparsity_m_by_n,
            block_pooling_type=self.block_pooling_type,
        )

    def get_config(self):
        return {
            "pruning_schedule": keras.saving.serialize_keras_object(
                self.pruning_schedule
            ),
            "block_size": list(self.block_size),
            "block_pooling_type": self.block_pooling_type,
            "sparsity_m_by_n": (
                None if self.sparsity_m_by_n is None else list(self.sparsity_m_by_n)
            ),
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["pruning_schedule"] = keras.saving.deserialize_keras_object(
            config["pruning_schedule"]
        )
        return cls(**config)

    def __repr__(self):
        extra = ""
        if self.block_size != (1, 1):
            extra += f", block_size={self.block_size}"
        if self.sparsity_m_by_n is not None:
            extra += f", sparsity_m_by_n={self.sparsity_m_by_n}"
        return f"MagnitudePruning({self.pruning_schedule!r}{extra})"
