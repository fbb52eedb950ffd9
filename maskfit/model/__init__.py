"""The masked model classes: training step, persistence, and the classes themselves.

- `training`: `MaskedTraining`, Keras's `train_step` with the masking stage.
- `persistence`: keep masks and the optimizer's layout in weights files,
  masks and rules in the config, pickling.
- `classes`: `MaskedModel` and `MaskedSequential`.
"""

from maskfit.model.classes import MaskedModel, MaskedSequential
from maskfit.model.persistence import _unpickle  # noqa: F401 (pickles of 0.1.0 name it)
from maskfit.model.training import all_trainable_variables, keep_masks, masker_of

__all__ = [
    "MaskedModel",
    "MaskedSequential",
    "all_trainable_variables",
    "keep_masks",
    "masker_of",
]
